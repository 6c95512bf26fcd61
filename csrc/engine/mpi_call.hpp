// Every MPI call goes through TNT_MPI so that a failure becomes a typed
// exception carrying MPI's own error text (communicators are set to
// MPI_ERRORS_RETURN by the engine, so MPI returns instead of aborting).
#pragma once

#include <mpi.h>

#include <string>

namespace tnt {

// MPI's own text for an error code (or "MPI error <code>" where MPI has none).
std::string mpi_error_text(int code);
// Throws MpiError naming the call, MPI's text and where it was made.
[[noreturn]] void raise_mpi_error(int code, const char* call, const char* file, int line);

}  // namespace tnt

#define TNT_MPI(call)                                                          \
  do {                                                                         \
    int tnt_mpi_rc_ = (call);                                                  \
    if (tnt_mpi_rc_ != MPI_SUCCESS) ::tnt::raise_mpi_error(tnt_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)
