#include "mpi_call.hpp"

#include <string>

#include "errors.hpp"

namespace tnt {

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, length);
}

void raise_mpi_error(int code, const char* call, const char* file, int line) {
  throw MpiError(std::string(call) + " failed: " + mpi_error_text(code) + " (at " + file + ":" +
                 std::to_string(line) + ")");
}

}  // namespace tnt
