// grad_handoff (update(d_prev, Recv(Send(d, 0)))): on every executor, group 1 hands each rank's
// gradient to the same rank of group 0, where it lands in the bound buffer d_prev. The senders
// run every micro-batch's hand-off, leaving their sends in flight, before any receiver runs one:
// a sender that waited for its receiver would stall here, as a 1F1B pipeline stage would.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>
#include <vector>

#include "tandem/comm/thread.h"
#include "tandem/dsl/workloads.h"
#include "tandem/exec/runner.h"
#include "tandem/schedule/recipe.h"

namespace tandem::exec {
namespace {

float handoff_value_at(int micro, int index, int64_t i) {
  return static_cast<float>(std::sin(0.1 * static_cast<double>(i) + 3 * micro + index));
}

TEST(GradHandoff, SendsLeftInFlightLandInTheBoundBuffers) {
  const int64_t n = 1001;
  const int micros = 3;
  const dsl::Program program = dsl::workloads::grad_handoff();
  const schedule::Schedule s = schedule::Recipe::unscheduled(program).apply(program);
  const schedule::Plan plan = s.lower();
  for (RunnerKind kind : {RunnerKind::Compiled, RunnerKind::Plan, RunnerKind::Reference})
    for (int ranks : {2, 4, 6}) {
      std::atomic<int> sent{0};  // hand-offs the senders have run
      comm::run_ranks(ranks, [&](comm::Communicator& c) {
        const std::string what = fmt::format("{} at {} ranks", runner_kind_name(kind), ranks);
        const int group_size = ranks / 2, group = c.rank() / group_size,
                  index = c.rank() % group_size;
        RunnerOptions o;
        o.bound = {group == 1 ? "d" : "d_prev"};
        std::unique_ptr<Runner> r = make_runner(kind, plan, c, {{"N", n}}, o);
        // The message lands in d_prev: nothing of its size is allocated (the plan runner, an
        // interpreter, keeps f32 scratch).
        if (kind != RunnerKind::Plan) {
          EXPECT_LT(r->allocated_bytes(), 1024u) << what;
        }
        std::vector<std::vector<float>> bufs(micros, std::vector<float>(n, 0.0f));
        for (int k = 0; k < micros; ++k) {
          if (group == 1) {
            for (int64_t i = 0; i < n; ++i)
              bufs[k][static_cast<size_t>(i)] = handoff_value_at(k, index, i);
            r->bind("d", Tensor::view_of(bufs[k].data(), DType::F32, Shape{n}));
            r->run_leaving_sends();
            ++sent;
          }
        }
        if (group == 0) {
          // Every sender is done before any receiver starts (a sender waiting for its receiver
          // never gets here: after 10 s the receivers go on, so that the test ends).
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          while (sent.load() < micros * group_size && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
          EXPECT_EQ(sent.load(), micros * group_size)
              << what << ": a sender waited for its receiver";
          for (int k = 0; k < micros; ++k) {
            r->bind("d_prev", Tensor::view_of(bufs[k].data(), DType::F32, Shape{n}));
            r->run();
            for (int64_t i = 0; i < n; ++i)
              ASSERT_EQ(bufs[k][static_cast<size_t>(i)], handoff_value_at(k, index, i))
                  << what << " micro " << k << " at " << i;
          }
        }
        r->wait_sends();
      });
    }
}

}  // namespace
}  // namespace tandem::exec
