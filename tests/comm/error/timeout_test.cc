// The collective timeout on the thread backend: a rank that does not arrive makes its waiting
// peers fail after the timeout, naming the call, what the caller was doing and the ranks that did
// not arrive; run_ranks reports it even when the late rank never returns.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "comm/testing.h"
#include "support/scratch.h"
#include "tandem/comm/thread.h"
#include "tandem/core/error.h"

namespace tandem::comm::testing {
namespace {

using tandem::testing::user_error_of;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

// A short timeout for one test; the environment's (or the default) again afterwards.
struct ScopedTimeout {
  explicit ScopedTimeout(double s) { set_comm_timeout_s(s); }
  ~ScopedTimeout() { set_comm_timeout_s(-1); }
};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

TEST(CommTimeout, AllReduceNamesTheRankThatDidNotArriveAndTheStep) {
  ScopedTimeout timeout(0.3);
  const auto begin = Clock::now();
  const std::string m = user_error_of([] {
    run_ranks(3, [](Communicator& c) {
      set_comm_activity("step 7");
      if (c.rank() == 2) sleep_s(1.0);  // past the timeout, then arrives to find the group aborted
      c.all_reduce(Tensor::zeros(DType::F32, {16}), ReduceOp::Sum);
    });
  });
  EXPECT_THAT(m,
              ::testing::MatchesRegex(
                  "all_reduce on rank [01] of 3 timed out after 0.3 s at step 7: rank 2 did not "
                  "arrive; a rank that does not arrive is stuck, stopped or lost \\(the limit is "
                  "--comm-timeout or TANDEM_COMM_TIMEOUT\\)"));
  EXPECT_LT(seconds_since(begin), 5.0);
}

TEST(CommTimeout, EveryLateRankIsNamed) {
  ScopedTimeout timeout(0.2);
  const std::string m = user_error_of([] {
    run_ranks(4, [](Communicator& c) {
      if (c.rank() >= 2) sleep_s(0.8);
      c.barrier();
    });
  });
  EXPECT_THAT(m, HasSubstr("barrier on rank "));
  EXPECT_THAT(m, HasSubstr("ranks 2 and 3 did not arrive"));
}

// A rank stuck outside any communication call (here: until the test lets it go) is left behind
// after min(timeout, 10 s), so that the failure is reported at all.
TEST(CommTimeout, ARankThatNeverReturnsDoesNotHideTheFailure) {
  ScopedTimeout timeout(0.2);
  auto release = std::make_shared<std::atomic<bool>>(false);
  const auto begin = Clock::now();
  const std::string m = user_error_of([&] {
    run_ranks(2, [release](Communicator& c) {
      if (c.rank() == 1)
        while (!release->load()) sleep_s(0.01);
      c.barrier();
    });
  });
  EXPECT_LT(seconds_since(begin), 3.0);
  release->store(true);  // the detached rank now finds its group aborted and returns
  EXPECT_EQ(m,
            "barrier on rank 0 of 2 timed out after 0.2 s: rank 1 did not arrive; a rank that "
            "does not arrive is stuck, stopped or lost (the limit is --comm-timeout or "
            "TANDEM_COMM_TIMEOUT)");
}

TEST(CommTimeout, ReceiveFromASilentPeer) {
  ScopedTimeout timeout(0.2);
  const std::string m = user_error_of([] {
    run_ranks(2, [](Communicator& c) {
      if (c.rank() == 0) c.recv(Tensor::zeros(DType::F32, {4}), 1, 5);
      if (c.rank() == 1) sleep_s(0.8);
    });
  });
  EXPECT_THAT(m, HasSubstr("recv on rank 0 of 2 timed out after 0.2 s: rank 1 never sent the "
                           "message with tag 5"));
  // Callers can tell a timeout from other failures by its type.
  EXPECT_THROW(run_ranks(2,
                         [](Communicator& c) {
                           if (c.rank() == 1) c.recv(Tensor::zeros(DType::F32, {4}), 0, 5);
                           if (c.rank() == 0) sleep_s(0.8);
                         }),
               TimeoutError);
}

// In a group split from the world, the late rank is named by both of its ranks.
TEST(CommTimeout, SplitGroupsNameWorldRanks) {
  ScopedTimeout timeout(0.3);
  const std::string m = user_error_of([] {
    run_ranks(4, [](Communicator& c) {
      std::unique_ptr<Communicator> g = c.split(c.rank() % 2, c.rank());
      if (c.rank() == 3) sleep_s(1.0);
      if (c.rank() % 2 == 1) g->all_reduce(Tensor::zeros(DType::F32, {4}), ReduceOp::Sum);
    });
  });
  EXPECT_THAT(m, HasSubstr("all_reduce on rank 0 of 2 timed out"));
  EXPECT_THAT(m, HasSubstr("rank 1 (world rank 3) did not arrive"));
}

TEST(CommTimeout, PeersThatArriveInTimeAreWaitedFor) {
  ScopedTimeout timeout(2.0);
  run_ranks(3, [](Communicator& c) {
    if (c.rank() == 1) sleep_s(0.3);
    Tensor t = Tensor::zeros(DType::F32, {8});
    t.fill(1.0f);
    c.all_reduce(t, ReduceOp::Sum);
    EXPECT_EQ(t.get(7), 3.0f);
  });
}

TEST(CommTimeout, ZeroWaitsForever) {
  ScopedTimeout timeout(0);
  EXPECT_EQ(comm_timeout_s(), 0.0);
  run_ranks(2, [](Communicator& c) {
    if (c.rank() == 1) sleep_s(0.3);
    c.barrier();
  });
}

TEST(CommTimeout, BadSettingsAreRefused) {
  for (const char* bad : {"abc", "-1", "nan", "inf", "", "5s"})
    EXPECT_EQ(user_error_of([&] { parse_comm_timeout(bad, "--comm-timeout"); }),
              fmt::format("--comm-timeout={} is not a timeout: expected a number of seconds, 0 or "
                          "more (0: wait forever; default 600)",
                          bad));
  EXPECT_EQ(user_error_of([&] { parse_comm_timeout("1e10", "TANDEM_COMM_TIMEOUT"); }),
            "TANDEM_COMM_TIMEOUT=1e10 is too long a timeout: at most 1e+09 seconds (0: wait "
            "forever)");
  EXPECT_EQ(parse_comm_timeout("1e9", "x"), 1e9);
  EXPECT_EQ(parse_comm_timeout("0.25", "x"), 0.25);
  EXPECT_EQ(parse_comm_timeout("0", "x"), 0.0);
}

}  // namespace
}  // namespace tandem::comm::testing
