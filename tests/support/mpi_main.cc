// The main of every mpi-labelled suite: MPI is initialised once around all tests, and only
// rank 0 prints GoogleTest's report so that mpirun's output stays readable.
#include <gtest/gtest.h>
#include <mpi.h>

#include "tandem/comm/mpi.h"

int main(int argc, char** argv) {
  // As tandem's own mpi_world(): MPI_THREAD_MULTIPLE (a communication thread may call MPI beside
  // the main thread), or what TANDEM_MPI_THREADS asks for.
  int provided = 0;
  MPI_Init_thread(&argc, &argv,
                  tandem::comm::mpi_thread_constant(tandem::comm::mpi_threads_from_env()),
                  &provided);
  ::testing::InitGoogleTest(&argc, argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  int failed = RUN_ALL_TESTS();
  // Every rank must agree on the verdict, or mpirun would report only rank 0's.
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed ? 1 : 0;
}
