// mpi_world() in a process that nobody launched with mpirun and that never called MPI_Init:
// tandem initialises MPI itself (a world of one rank) and finalises it at exit.
#include <gtest/gtest.h>

#include "comm/collective_checks.h"
#include "tandem/comm/mpi.h"

namespace tandem::comm::testing {
namespace {

TEST(MpiSelfInit, WorldOfOneWithoutMpirun) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizers report OpenMPI's own start-up (leaks, races); the release run "
                  "covers this";
#endif
  if (launched_by_mpirun()) GTEST_SKIP() << "launched by mpirun";
  int init = 0;
  MPI_Initialized(&init);
  if (init) GTEST_SKIP() << "another test in this process initialised MPI";
  auto c = mpi_world();
  MPI_Initialized(&init);
  EXPECT_EQ(init, 1);
  EXPECT_EQ(c->size(), 1);
  EXPECT_EQ(c->rank(), 0);
  EXPECT_EQ(all_reduce_case(*c, CollectiveAlgo::Auto, DType::F16, 100, ReduceOp::Sum, true), "");
  EXPECT_EQ(
      reduce_scatter_case(*c, CollectiveAlgo::Ring, DType::F32, 10, ReduceOp::Max, true, false),
      "");
  // A second world reuses the running MPI.
  auto again = mpi_world();
  EXPECT_EQ(again->size(), 1);
  again->barrier();
}

}  // namespace
}  // namespace tandem::comm::testing
