// Proof of meaning on the thread backend: every schedule enumerate_schedules yields for each of
// the four workloads, run by the plan runner on 1 to 4 ranks with sizes that do not divide by the
// rank count, equals the reference interpreter on the unscheduled program (bitwise where the
// order of floating-point operations is kept; see exec/schedule_checks.h for the tolerance
// otherwise).
#include <gtest/gtest.h>

#include <mutex>

#include "exec/schedule_checks.h"
#include "tandem/comm/thread.h"

namespace tandem::schedule::testing {
namespace {

using dsl::workloads::Bias;

// A small chunk size, so that every fused hook runs over several chunks of these small tensors.
class SmallChunks : public ::testing::Test {
 protected:
  void SetUp() override { comm::set_chunk_bytes(64); }
  void TearDown() override { comm::set_chunk_bytes(0); }
};

struct Tally {
  int schedules = 0, bitwise = 0;
};

Tally run_case(const Case& c, int ranks) {
  std::mutex mu;
  std::string failures;
  Tally t;
  const std::vector<Plan> plans = all_plans(c);
  comm::run_ranks(ranks, [&](comm::Communicator& comm) {
    const Outcome o = check_all_schedules(c, plans, comm);
    std::lock_guard<std::mutex> lock(mu);
    failures += o.failures;
    if (comm.rank() == 0) t = {o.schedules, o.bitwise};
  });
  EXPECT_EQ(failures, "") << c.label << " on " << ranks << " ranks";
  return t;
}

using Equivalence = SmallChunks;

TEST_F(Equivalence, AdamEverySchedule) {
  for (int ranks = 1; ranks <= 4; ++ranks) {
    const Tally t = run_case(adam_case(DType::BF16, 1013), ranks);
    EXPECT_GE(t.schedules, 11);
    EXPECT_EQ(t.bitwise, t.schedules)
        << "every Adam schedule keeps the reference's order of operations";
    run_case(adam_case(DType::F32, 3), ranks);  // fewer elements than ranks: some parts are empty
    run_case(adam_case(DType::F16, 0), ranks);
  }
}

TEST_F(Equivalence, LambEverySchedule) {
  for (int ranks = 1; ranks <= 4; ++ranks) {
    const Tally t = run_case(lamb_case(DType::BF16, 1013), ranks);
    EXPECT_GE(t.schedules, 11);
    run_case(lamb_case(DType::F32, 5), ranks);
  }
}

TEST_F(Equivalence, MegatronEverySchedule) {
  for (int ranks = 1; ranks <= 4; ++ranks) {
    const Tally t = run_case(megatron_case(DType::F32, 7, 10, 6), ranks);
    EXPECT_GE(t.schedules, 16);
    run_case(megatron_case(DType::BF16, 5, 3, 9), ranks);
    // Mixed precision's layer: bf16 operands, product and sum, cast to f32 for the rest.
    run_case(megatron_case(DType::F32, 5, 3, 9, DType::BF16), ranks);
    run_case(megatron_case(DType::F32, 2, 7, 5, DType::BF16), ranks);  // fewer rows than ranks
    // Llama's layer, without the bias: every schedule of its own program.
    const Tally n =
        run_case(megatron_case(DType::F32, 7, 10, 6, std::nullopt, Bias::Without), ranks);
    EXPECT_GE(n.schedules, 16);
    run_case(megatron_case(DType::F32, 5, 3, 9, DType::BF16, Bias::Without), ranks);
  }
}

TEST_F(Equivalence, SumInPlaceEverySchedule) {
  for (int ranks = 1; ranks <= 4; ++ranks) {
    const Tally f32 = run_case(sum_in_place_case(DType::F32, 1013), ranks);
    EXPECT_GE(f32.schedules, 2);
    // The bf16 wire: cast before the collective, cast back after it, into g in place.
    const Tally bf16 = run_case(sum_in_place_case(DType::BF16, 1013), ranks);
    EXPECT_GE(bf16.schedules, 2);
    run_case(sum_in_place_case(DType::BF16, 3), ranks);  // fewer elements than ranks
  }
}

// A Shift alone (kv_ring), and one between computations and an AllReduce whose recipes vary;
// every element moves as it is, so each schedule is bitwise the reference.
TEST_F(Equivalence, RingEverySchedule) {
  for (int ranks = 1; ranks <= 4; ++ranks) {
    for (int64_t n : {0, 1, 1013}) {
      const Tally t = run_case(kv_ring_case(n), ranks);
      EXPECT_GE(t.schedules, 1);
      EXPECT_EQ(t.bitwise, t.schedules);
    }
    const Tally t = run_case(ring_step_case(DType::BF16, 7, 13), ranks);
    EXPECT_GE(t.schedules, 8);
    EXPECT_EQ(t.bitwise, t.schedules);
    run_case(ring_step_case(DType::F32, 1, 3), ranks);
  }
}

TEST_F(Equivalence, PipelineEverySchedule) {
  for (int ranks : {2, 4}) {
    const Tally t = run_case(pipeline_case(DType::F32, 7, 10, 6), ranks);
    EXPECT_GE(t.schedules, 30);
    run_case(pipeline_case(DType::BF16, 3, 5, 4), ranks);
    run_case(pipeline_case(DType::F32, 3, 5, 4, DType::BF16), ranks);
    run_case(pipeline_case(DType::F32, 7, 10, 6, std::nullopt, Bias::Without), ranks);
  }
}

}  // namespace
}  // namespace tandem::schedule::testing
