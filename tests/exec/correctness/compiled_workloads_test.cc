// Every schedule enumerate_schedules yields for each of the four workloads, emitted as C++,
// compiled, and run by exec/compiled on 1 to 4 in-process ranks with sizes that do not divide by
// the rank count, equals the reference interpreter on the unscheduled program (bitwise where the
// order of floating-point operations is kept; exec/compiled_checks.h says when it is not).
// Each plan is compiled once per process and serves every size and rank count.
#include <gtest/gtest.h>

#include <algorithm>
#include <mutex>
#include <string>

#include "exec/compiled_checks.h"
#include "tandem/comm/thread.h"

namespace tandem::codegen::testing {
namespace {

using schedule::testing::adam_case;
using schedule::testing::kv_ring_case;
using schedule::testing::lamb_case;
using schedule::testing::megatron_case;
using schedule::testing::pipeline_case;
using schedule::testing::ring_step_case;
using schedule::testing::sum_in_place_case;

// A small chunk size, so that every fused hook runs over several chunks of these small tensors.
class Compiled : public ::testing::Test {
 protected:
  void SetUp() override { comm::set_chunk_bytes(64); }
  void TearDown() override { comm::set_chunk_bytes(0); }
};

Outcome run_case(const Case& c, const Schedules& all, int ranks,
                 exec::CompiledOptions options = {}) {
  std::mutex mu;
  Outcome total;
  comm::run_ranks(ranks, [&](comm::Communicator& comm) {
    const Outcome o = check_compiled(c, all, comm, options);
    std::lock_guard<std::mutex> lock(mu);
    total.failures += o.failures;
    if (comm.rank() == 0) {
      total.schedules = o.schedules;
      total.bitwise = o.bitwise;
    }
  });
  EXPECT_EQ(total.failures, "") << c.label << " on " << ranks << " ranks";
  return total;
}

// The Shift emitted as C++: alone, and between computations and an AllReduce.
TEST_F(Compiled, RingEverySchedule) {
  const Schedules kv = compile_all(dsl::workloads::kv_ring());
  const Schedules step = compile_all(schedule::testing::ring_step(DType::BF16));
  for (int ranks = 1; ranks <= 4; ++ranks) {
    for (int64_t n : {0, 1, 1013}) {
      const Outcome o = run_case(kv_ring_case(n), kv, ranks);
      EXPECT_EQ(o.schedules, static_cast<int>(kv.plans.size()));
      EXPECT_EQ(o.bitwise, o.schedules);
    }
    const Outcome o = run_case(ring_step_case(DType::BF16, 7, 13), step, ranks);
    EXPECT_EQ(o.schedules, static_cast<int>(step.plans.size()));
    EXPECT_EQ(o.bitwise, o.schedules);
  }
}

TEST_F(Compiled, AdamEverySchedule) {
  const Schedules bf16 = compile_all(dsl::workloads::adam(DType::BF16));
  const Schedules f32 = compile_all(dsl::workloads::adam(DType::F32));  // f32 sums carry the update
  EXPECT_GE(bf16.plans.size(), 11u);
  for (int ranks = 1; ranks <= 4; ++ranks) {
    const Outcome o = run_case(adam_case(DType::BF16, 1013), bf16, ranks);
    EXPECT_EQ(o.schedules, static_cast<int>(bf16.plans.size()));
    EXPECT_EQ(o.bitwise, o.schedules)
        << "every Adam schedule keeps the reference's order on the thread backend";
    run_case(adam_case(DType::BF16, 0), bf16, ranks);
    run_case(adam_case(DType::F32, 3), f32,
             ranks);  // fewer elements than ranks: some parts are empty
    run_case(adam_case(DType::F32, 517), f32, ranks);
  }
}

TEST_F(Compiled, LambEverySchedule) {
  const Schedules all = compile_all(dsl::workloads::lamb(DType::BF16));
  EXPECT_GE(all.plans.size(), 11u);
  for (int ranks = 1; ranks <= 4; ++ranks) {
    const Outcome o = run_case(lamb_case(DType::BF16, 1013), all, ranks);
    EXPECT_EQ(o.schedules, static_cast<int>(all.plans.size()));
    run_case(lamb_case(DType::BF16, 5), all, ranks);
  }
}

TEST_F(Compiled, MegatronEverySchedule) {
  const Schedules f32 = compile_all(dsl::workloads::megatron_layer(DType::F32, 0.1));
  const Schedules bf16 = compile_all(dsl::workloads::megatron_layer(DType::BF16, 0.1));
  const Schedules wire = compile_all(dsl::workloads::megatron_layer(DType::F32, 0.1, DType::BF16));
  EXPECT_GE(f32.plans.size(), 16u);
  EXPECT_EQ(wire.plans.size(), f32.plans.size()) << "the casts cost no schedule";
  for (int ranks = 1; ranks <= 4; ++ranks) {
    const Outcome o = run_case(megatron_case(DType::F32, 7, 10, 6), f32, ranks);
    EXPECT_EQ(o.schedules, static_cast<int>(f32.plans.size()));
    run_case(megatron_case(DType::F32, 2, 3, 5), f32, ranks);  // fewer rows than blocks and ranks
    run_case(megatron_case(DType::BF16, 5, 3, 9), bf16, ranks);
    const Outcome w = run_case(megatron_case(DType::F32, 5, 3, 9, DType::BF16), wire, ranks);
    EXPECT_EQ(w.schedules, static_cast<int>(wire.plans.size()));
    run_case(megatron_case(DType::F32, 2, 7, 5, DType::BF16), wire, ranks);
  }
}

TEST_F(Compiled, MegatronOverlappedBlocksOneAfterTheOther) {
  // The same plans without the communication thread: the blocks run in order, same results.
  const Schedules f32 = compile_all(dsl::workloads::megatron_layer(DType::F32, 0.1));
  for (int ranks : {2, 3})
    run_case(megatron_case(DType::F32, 9, 4, 5), f32, ranks, {.overlap = false});
}

TEST_F(Compiled, SixteenBitSumsReducedInF32) {
  // The reduce_in_f32 path: f32 copies reduced, hooks fed the rounded chunk, carried values
  // widened back, Dim partitions through staging; bitwise like the narrow path on this backend.
  const exec::CompiledOptions wide{.reduce_in_f32 = true};
  const Schedules adam = compile_all(dsl::workloads::adam(DType::BF16));
  const Schedules layer = compile_all(dsl::workloads::megatron_layer(DType::BF16, 0.1));
  for (int ranks : {1, 3}) {
    const Outcome a = run_case(adam_case(DType::BF16, 1013), adam, ranks, wide);
    EXPECT_EQ(a.bitwise, a.schedules);
    const Outcome m = run_case(megatron_case(DType::BF16, 5, 3, 9), layer, ranks, wide);
    // All but the schedules that compute the matmul in row blocks (ol(MM,...)): BLAS need not
    // round a block's rows as it rounds the whole product's (exec/schedule_checks.h, keeps_order).
    const auto overlapped =
        std::count_if(layer.names.begin(), layer.names.end(),
                      [](const std::string& n) { return n.find("ol(MM") != std::string::npos; });
    EXPECT_GT(overlapped, 0);
    EXPECT_EQ(m.bitwise, m.schedules - static_cast<int>(overlapped));
  }
}

TEST_F(Compiled, PipelineEverySchedule) {
  const Schedules f32 = compile_all(dsl::workloads::pipeline_stage(DType::F32, 0.1));
  const Schedules bf16 = compile_all(dsl::workloads::pipeline_stage(DType::BF16, 0.1));
  const Schedules wire = compile_all(dsl::workloads::pipeline_stage(DType::F32, 0.1, DType::BF16));
  EXPECT_GE(f32.plans.size(), 30u);
  for (int ranks : {2, 4}) {
    const Outcome o = run_case(pipeline_case(DType::F32, 7, 10, 6), f32, ranks);
    EXPECT_EQ(o.schedules, static_cast<int>(f32.plans.size()));
    run_case(pipeline_case(DType::BF16, 3, 5, 4), bf16, ranks);
    const Outcome w = run_case(pipeline_case(DType::F32, 3, 5, 4, DType::BF16), wire, ranks);
    EXPECT_EQ(w.schedules, static_cast<int>(wire.plans.size()));
  }
}

TEST_F(Compiled, SumInPlaceEverySchedule) {
  for (const DType t : {DType::F32, DType::BF16}) {
    const Schedules all = compile_all(dsl::workloads::sum_in_place(t));
    EXPECT_GE(all.plans.size(), 2u);
    for (int ranks = 1; ranks <= 4; ++ranks) {
      const Outcome o = run_case(sum_in_place_case(t, 1013), all, ranks);
      EXPECT_EQ(o.schedules, static_cast<int>(all.plans.size()));
      run_case(sum_in_place_case(t, 3), all, ranks);
    }
  }
}

}  // namespace
}  // namespace tandem::codegen::testing
