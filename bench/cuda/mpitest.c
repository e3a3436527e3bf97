/* Pre-flight for run.sh: the MPI calls the emitted programs make, without CUDA. */
#include <mpi.h>
#include <stdio.h>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = -1, size = -1, local = -1, v = 7, sum = 0;
  float f = 1.5f, g = 0;
  char id[128] = "x";
  MPI_Comm node;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
  MPI_Comm_rank(node, &local);
  MPI_Bcast(id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Allreduce(&v, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  MPI_Reduce(&f, &g, 1, MPI_FLOAT, MPI_MAX, 0, MPI_COMM_WORLD);
  printf("mpitest: rank %d of %d, local %d, sum %d, max %.1f: %s\n", rank, size, local, sum, g,
         (sum == 7 * size && g == 1.5f) ? "MPI OK" : "MPI WRONG");
  MPI_Finalize();
  return 0;
}
