#include "mpi_call.hpp"

#include <string>

#include "errors.hpp"

namespace tnt {

void raise_mpi_error(int code, const char* call, const char* file, int line) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) length = 0;
  throw MpiError(std::string(call) + " failed: " + std::string(text, length) + " (at " + file + ":" +
                 std::to_string(line) + ")");
}

}  // namespace tnt
