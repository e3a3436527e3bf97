// Memory: with as_slice, each rank's stored optimizer state (Adam's and LAMB's moments) is 1/p of
// the unsliced state, measured from the plan runner's allocations through a CountingAllocator,
// not computed from a formula; and the sliced schedule still updates the state correctly.
#include <gtest/gtest.h>

#include <mutex>

#include "exec/schedule_checks.h"
#include "tandem/comm/thread.h"

namespace tandem::schedule::testing {
namespace {

const NamedSchedule& named(const std::vector<NamedSchedule>& all, const std::string& name) {
  for (const NamedSchedule& ns : all)
    if (ns.name == name) return ns;
  ADD_FAILURE() << "no schedule named " << name;
  return all.front();
}

struct Measured {
  size_t live = 0;     // the counting allocator's live bytes after setup
  size_t state = 0;    // bytes the runner allocated for m and v
  size_t weights = 0;  // bytes for w
};

Measured measure(const Plan& plan, comm::Communicator& comm, int64_t n) {
  CountingAllocator counting;
  Measured m;
  {
    exec::PlanRunner runner(plan, comm, {{"N", n}}, counting);
    m.live = counting.live_bytes();
    m.state = runner.allocated_bytes("m") + runner.allocated_bytes("v");
    m.weights = runner.allocated_bytes("w");
    EXPECT_EQ(runner.allocated_bytes(), m.live)
        << "every byte the runner holds came from its allocator";
  }
  EXPECT_EQ(counting.live_bytes(), 0u) << "the runner gives back everything it allocated";
  return m;
}

void check_sliced_state(const dsl::Program& program, const std::string& base, int64_t n) {
  const auto all = enumerate_schedules(program);
  const std::string sliced_name = base + "+slice(m,v)";
  const Plan whole = named(all, base).schedule.lower();
  const Plan sliced = named(all, sliced_name).schedule.lower();
  for (int p = 1; p <= 4; ++p) {
    std::mutex mu;
    std::vector<size_t> state_bytes(static_cast<size_t>(p));
    comm::run_ranks(p, [&](comm::Communicator& comm) {
      const Measured w = measure(whole, comm, n);
      const Measured s = measure(sliced, comm, n);
      const int64_t part = dsl::part_count(n, p, comm.rank());
      std::lock_guard<std::mutex> lock(mu);
      state_bytes[static_cast<size_t>(comm.rank())] = s.state;
      // Unsliced: m and v whole on every rank. Sliced: this rank's part of each, nothing else
      // changes (the weights stay whole), and the difference shows in the allocator's count.
      EXPECT_EQ(w.state, 2 * 4 * static_cast<size_t>(n)) << base << " on " << p << " ranks";
      EXPECT_EQ(s.state, 2 * 4 * static_cast<size_t>(part))
          << sliced_name << " on rank " << comm.rank() << " of " << p;
      EXPECT_EQ(s.weights, w.weights);
      EXPECT_EQ(w.live - s.live, w.state - s.state) << "only the state shrinks";
    });
    // 1/p each: the ranks' parts add up to the whole state, and none holds more than its share
    // (rounded up).
    size_t sum = 0;
    for (size_t b : state_bytes) {
      sum += b;
      EXPECT_LE(b, 2 * 4 * static_cast<size_t>((n + p - 1) / p));
    }
    EXPECT_EQ(sum, 2 * 4 * static_cast<size_t>(n)) << p << " ranks";
  }
}

TEST(SlicedState, AdamMomentsAreOnePthPerRank) {
  check_sliced_state(dsl::workloads::adam(DType::BF16), "fused(RS-C-AG)", 4099);
  check_sliced_state(dsl::workloads::adam(DType::F32), "RS-C-AG", 1001);
}

TEST(SlicedState, LambMomentsAreOnePthPerRank) {
  check_sliced_state(dsl::workloads::lamb(DType::BF16), "fused(RS-C-AG)", 2053);
}

// The sliced state carries over from step to step: three steps of the sliced schedule give the
// reference's three steps (each rank comparing its part of m and v).
TEST(SlicedState, StateCarriesAcrossSteps) {
  comm::set_chunk_bytes(128);
  const dsl::Program program = dsl::workloads::adam(DType::BF16);
  const Plan plan =
      named(enumerate_schedules(program), "fused(RS-C-AG)+slice(m,v)").schedule.lower();
  const int64_t n = 777;
  std::mutex mu;
  std::string failures;
  comm::run_ranks(3, [&](comm::Communicator& comm) {
    const Case c = adam_case(DType::BF16, n);
    exec::RunArgs ref{c.symbols, c.scalars, make_inputs(program, c.symbols, comm)};
    exec::PlanRunner runner(plan, comm, c.symbols);
    for (const auto& [name, value] : c.scalars) runner.set_scalar(name, value);
    for (const auto& [name, t] : ref.inputs) runner.load(name, t);
    for (int step = 1; step <= 3; ++step) {
      ref.scalars["step"] = step;
      runner.set_scalar("step", step);
      exec::run_reference(program, comm, ref);
      runner.run();
    }
    std::string f;
    for (const char* name : {"m", "v"}) {
      const exec::PlanRunner::Piece pc = runner.piece(name);
      f +=
          compare(fmt::format("{} after 3 steps on rank {}", name, comm.rank()), runner.input(name),
                  exec::slice_rows(ref.inputs.at(name), 0, pc.offset, pc.count), true);
    }
    f += compare(fmt::format("w after 3 steps on rank {}", comm.rank()), runner.input("w"),
                 ref.inputs.at("w"), true);
    std::lock_guard<std::mutex> lock(mu);
    failures += f;
  });
  comm::set_chunk_bytes(0);
  EXPECT_EQ(failures, "");
}

}  // namespace
}  // namespace tandem::schedule::testing
