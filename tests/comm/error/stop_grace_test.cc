// A first SIGTERM while ranks wait for peers that never come (here: calls that do not match, a
// collective against a receive): within a ScopedStopGrace each wait gives up the grace after the
// signal with a StopWaitError naming the call, the step and the ranks it waited for, long before
// the communication timeout; a slow peer that arrives within the grace is waited for; outside a
// scope, or while a ScopedStopGraceOff lives (a checkpoint being written), the signal changes no
// wait.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <string>
#include <thread>

#include "tandem/comm/communicator.h"
#include "tandem/comm/thread.h"
#include "tandem/core/clock.h"
#include "tandem/core/error.h"
#include "tandem/core/stop_signal.h"

namespace tandem::comm {
namespace {

void sleep_s(double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }

// Rank 0 in an all-reduce, rank 1 in a receive from rank 0: neither call can ever complete.
void mismatched(Communicator& c) {
  set_comm_activity("step 3");
  if (c.rank() == 0) c.all_reduce(Tensor::zeros(DType::F32, {16}), ReduceOp::Sum);
  if (c.rank() == 1) c.recv(Tensor::zeros(DType::F32, {4}), 0, 9);
}

// Runs `fn` on two ranks while a thread sends this process SIGTERM after `after_s`; returns the
// error's message ("" when none) and its kind.
struct Outcome {
  std::string message;
  bool stop_wait = false;
  int signal = 0;
  double seconds = 0;
};
Outcome run_with_sigterm(const std::function<void(Communicator&)>& fn, double after_s) {
  const StopSignals signals("stop grace test", "the test");
  std::thread sender([after_s] {
    sleep_s(after_s);
    std::raise(SIGTERM);
  });
  Outcome o;
  const auto begin = Clock::now();
  try {
    run_ranks(2, fn);
  } catch (const StopWaitError& e) {
    o.message = e.what();
    o.stop_wait = true;
    o.signal = e.signal();
  } catch (const UserError& e) {
    o.message = e.what();
  }
  o.seconds = seconds_since(begin);
  sender.join();
  return o;
}

TEST(StopGrace, WaitsForPeersThatNeverComeGiveUpTheGraceAfterTheSignal) {
  const ScopedCommTimeout timeout(60);
  const ScopedStopGrace grace(0.3);
  const Outcome o = run_with_sigterm(mismatched, 0.2);
  EXPECT_TRUE(o.stop_wait) << o.message;
  EXPECT_EQ(o.signal, SIGTERM);
  EXPECT_THAT(o.message,
              ::testing::MatchesRegex(
                  "(all_reduce on rank 0 of 2 at step 3: given up 0.3 s after SIGTERM: rank 1 did "
                  "not arrive|recv on rank 1 of 2 at step 3: given up 0.3 s after SIGTERM: rank 0 "
                  "never sent the message with tag 9); a rank that does not arrive is stuck, "
                  "stopped, lost or started with other settings"));
  EXPECT_LT(o.seconds, 5.0) << "the timeout is 60 s";
  EXPECT_GT(o.seconds, 0.45) << "not before the grace";
}

TEST(StopGrace, APeerThatArrivesWithinTheGraceIsWaitedFor) {
  const ScopedCommTimeout timeout(60);
  const ScopedStopGrace grace(2.0);
  const Outcome o = run_with_sigterm(
      [](Communicator& c) {
        if (c.rank() == 1) sleep_s(0.6);  // a slow step: the signal comes while rank 0 waits
        Tensor t = Tensor::zeros(DType::F32, {8});
        t.fill(1.0f);
        c.all_reduce(t, ReduceOp::Sum);
        EXPECT_EQ(t.get(0), 2.0f);
      },
      0.1);
  EXPECT_EQ(o.message, "");
}

TEST(StopGrace, TheGraceOnlyGrows) {
  const ScopedStopGrace grace(0.5);
  EXPECT_EQ(stop_grace_s(), 0.5);
  raise_stop_grace_s(0.2);
  EXPECT_EQ(stop_grace_s(), 0.5);
  raise_stop_grace_s(3);
  EXPECT_EQ(stop_grace_s(), 3.0);
}

TEST(StopGrace, OutsideAScopeOrWhileTurnedOffTheSignalChangesNoWait) {
  const ScopedCommTimeout timeout(0.8);
  EXPECT_LT(stop_grace_s(), 0);
  const Outcome outside = run_with_sigterm(mismatched, 0.1);
  EXPECT_FALSE(outside.stop_wait) << outside.message;
  EXPECT_THAT(outside.message, ::testing::HasSubstr("timed out after 0.8 s at step 3"));
  raise_stop_grace_s(0.1);  // no scope: nothing to raise
  EXPECT_LT(stop_grace_s(), 0);

  const ScopedStopGrace grace(0.1);
  const ScopedStopGraceOff saving;
  const Outcome off = run_with_sigterm(mismatched, 0.1);
  EXPECT_FALSE(off.stop_wait) << off.message;
  EXPECT_THAT(off.message, ::testing::HasSubstr("timed out after 0.8 s at step 3"));
}

}  // namespace
}  // namespace tandem::comm
