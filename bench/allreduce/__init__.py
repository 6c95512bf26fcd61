"""`tnt-bench allreduce`: the engine's allreduce algorithms against MPI_Allreduce (mpi4py)."""
