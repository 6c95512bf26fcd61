// Every MPI call goes through TNT_MPI so that a failure becomes a typed
// exception carrying MPI's own error text (communicators are set to
// MPI_ERRORS_RETURN by the engine, so MPI returns instead of aborting).
#pragma once

#include <mpi.h>

namespace tnt {

void raise_mpi_error(int code, const char* call, const char* file, int line);

}  // namespace tnt

#define TNT_MPI(call)                                                          \
  do {                                                                         \
    int tnt_mpi_rc_ = (call);                                                  \
    if (tnt_mpi_rc_ != MPI_SUCCESS) ::tnt::raise_mpi_error(tnt_mpi_rc_, #call, __FILE__, __LINE__); \
  } while (0)
