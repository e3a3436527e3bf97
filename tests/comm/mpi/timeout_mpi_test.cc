// The collective timeout on the MPI backend under real mpirun (-np 2 and 3): the last rank sleeps
// past a short timeout; the ranks waiting for it fail, naming the collective, what they were
// doing and the rank that did not arrive.
//
// A timed-out communicator is broken (messages of the abandoned call may still arrive on it), so
// it is deliberately never freed here: a freed one's context id could be reused by the next
// test's communicator and receive those stale messages.
#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <string>
#include <thread>

#include "tandem/comm/mpi.h"
#include "tandem/core/error.h"

namespace tandem::comm {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

TEST(MpiTimeout, TheRanksWaitingNameTheOneThatDidNotArrive) {
  Communicator* c = mpi_world().release();  // never freed: see the top of the file
  const int r = c->rank(), p = c->size();
  set_comm_timeout_s(0.3);
  set_comm_activity("step 4");
  if (r == p - 1) std::this_thread::sleep_for(std::chrono::seconds(1));
  const std::string m =
      error_of([&] { c->all_reduce(Tensor::zeros(DType::F32, {64}), ReduceOp::Sum); });
  set_comm_activity("");
  set_comm_timeout_s(-1);
  if (r != p - 1) {
    EXPECT_EQ(m, fmt::format("all_reduce on rank {} of {} timed out after 0.3 s at step 4: rank {} "
                             "did not arrive; a rank that does not arrive is stuck, stopped or "
                             "lost (the limit is --comm-timeout or TANDEM_COMM_TIMEOUT)",
                             r, p, p - 1));
  } else {
    // The late rank heard the others arrive, then waits in vain for the ring's first message.
    EXPECT_NE(m.find(fmt::format("all_reduce on rank {} of {} timed out after 0.3 s", r, p)),
              std::string::npos)
        << m;
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

// A barrier is an arrival too: in a group split from the world, the late rank is named by its
// rank in the group and in the world.
TEST(MpiTimeout, BarrierInASplitGroup) {
  std::unique_ptr<Communicator> world = mpi_world();
  const int r = world->rank(), p = world->size();
  Communicator* g = world->split(r == 0 ? -1 : 0, r).release();  // ranks 1.. ; never freed
  set_comm_timeout_s(0.3);
  std::string m = "not in the group";
  if (g != nullptr) {
    if (r == p - 1) std::this_thread::sleep_for(std::chrono::seconds(1));
    m = error_of([&] { g->barrier(); });
  }
  set_comm_timeout_s(-1);
  if (g != nullptr && r != p - 1 && p > 2) {
    EXPECT_EQ(m, fmt::format("barrier on rank {} of {} timed out after 0.3 s: rank {} (world rank "
                             "{}) did not arrive; a rank that does not arrive is stuck, stopped "
                             "or lost (the limit is --comm-timeout or TANDEM_COMM_TIMEOUT)",
                             r - 1, p - 1, p - 2, p - 1));
  }
  if (p == 2) {  // rank 1 alone is a group of one
    EXPECT_TRUE(m == "not in the group" || m == "no error") << m;
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace
}  // namespace tandem::comm
