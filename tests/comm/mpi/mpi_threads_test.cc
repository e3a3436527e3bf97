// The one check for a communication thread beside its caller (communication_thread_allowed)
// under the level MPI was initialised with: MPI_THREAD_MULTIPLE (mpi_main's default) allows one
// beside a caller that communicates too; MPI_THREAD_SERIALIZED (TANDEM_MPI_THREADS=serialized,
// the comm.mpi.np2.serialized test) only beside a caller that does not. In-process ranks always.
#include <gtest/gtest.h>

#include "tandem/comm/mpi.h"
#include "tandem/comm/thread.h"

namespace tandem::comm::testing {
namespace {

TEST(MpiThreads, ACommunicationThreadFollowsTheLevel) {
  const MpiThreads asked = mpi_threads_from_env();
  EXPECT_EQ(mpi_thread_level(), asked);  // OpenMPI gives what it is asked for
  auto c = mpi_world();
  EXPECT_TRUE(communication_thread_allowed(*c, /*others_communicate=*/false));
  EXPECT_EQ(communication_thread_allowed(*c, /*others_communicate=*/true),
            asked == MpiThreads::Multiple);
  run_ranks(2, [](Communicator& threads) {
    EXPECT_TRUE(communication_thread_allowed(threads, false));
    EXPECT_TRUE(communication_thread_allowed(threads, true));
  });
}

}  // namespace
}  // namespace tandem::comm::testing
