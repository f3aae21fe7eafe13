/* Handles rsmpi's C shim does not export: in Open MPI they are addresses of library globals and in
 * MPICH integer macros, so Rust cannot name them portably. Each is returned by a tiny function. */
#include <mpi.h>

MPI_Op asap_mpi_op_replace(void) { return MPI_REPLACE; }
MPI_Op asap_mpi_op_no_op(void) { return MPI_NO_OP; }
