// The trainer runs the autotuner's cached choice for its optimizer as the record gives it: the
// winner, at the winner's chunk size, reported in the start-up line; the same weights as at the
// process's chunk size (chunking does not change results); and a record without a chunk round
// runs at the process's size.
#include <gtest/gtest.h>

#include <sstream>

#include "tandem/comm/thread.h"
#include "tandem/core/blas.h"
#include "tandem/dsl/workloads.h"
#include "tandem/parallel/optimizer.h"
#include "tandem/parallel/shard.h"
#include "tandem/schedule/enumerate.h"
#include "tandem/train/grid_plan.h"
#include "tandem/train/trainer.h"
#include "tandem/tune/cache.h"
#include "tandem/tune/executor.h"
#include "tandem/tune/tune.h"
#include "train/test_util.h"
#include "tune/tune_testing.h"

namespace tandem::train {
namespace {

// Two data-parallel ranks on the plan runner, weights kept.
TrainConfig two_ranks() {
  TrainConfig c = testing::tiny_run(2);
  c.grid = {2, 1, 1};
  c.keep_weights = true;
  return c;
}

// Stores the record the trainer looks up for `program` at `sizes` (`only`: the schedules it asks
// the tuner to search) on `c`'s grid: `winner` at `chunk_bytes` (0: no chunk round).
void store_record(const TrainConfig& c, const std::string& cache, const dsl::Program& program,
                  const dsl::SymbolMap& sizes, const std::vector<std::string>& only,
                  const std::string& winner, size_t chunk_bytes, double seconds = 0.001) {
  tune::TuneOptions o;
  o.sizes = sizes;
  o.only = only;
  o.executor = tune::executor_of(exec::RunnerKind::Plan);
  blas::set_num_threads(c.blas_threads);  // part of the key's machine, as train() sets it
  tune::TuneRecord r;
  comm::run_ranks(c.grid.size(), [&](comm::Communicator& comm) {
    if (comm.rank() == 0) r.key = tune::tune_key(program, comm, o);
  });
  r.winner = winner;
  r.candidates = {{winner, true, "", 0.0, {seconds}, {}}};
  r.chunk_bytes = chunk_bytes;
  if (chunk_bytes != 0) r.chunks = {{chunk_bytes, {0.001}}};
  r.created = "2026-01-01T00:00:00Z";
  tune::store_record(r, cache);
}

// The record for `c`'s optimizer, keyed as the trainer keys it (the sliced schedules of adam).
void store_optimizer_record(const TrainConfig& c, const std::string& cache,
                            const std::string& winner, size_t chunk_bytes, double seconds = 0.001) {
  parallel::OptimizerConfig o = c.optimizer;
  o.grad_dtype = c.grad_dtype.value_or(DType::F32);
  const dsl::Program program = parallel::optimizer_program(o);
  std::vector<std::string> only;
  for (const schedule::NamedSchedule& s : schedule::enumerate_schedules(program))
    if (!s.recipe.slice.empty()) only.push_back(s.name);
  store_record(c, cache, program, {{"N", parallel::ShardLayout(c.model, c.grid, 0, 0).size()}},
               only, winner, chunk_bytes, seconds);
}

TEST(TrainerTunedSchedule, TheOptimizerRunsAtTheRecordsChunkSize) {
  const std::string winner = "RS-C-AG+slice(m,v)";  // not the first preference: the record decides
  TrainResult at_record, at_process;
  std::ostringstream lines;
  {
    tandem::testing::TempCacheDir dir("train-chunk");
    TrainConfig c = two_ranks();
    store_optimizer_record(c, dir.str(), winner, 96);
    c.out = &lines;
    at_record = train(c);
  }
  EXPECT_EQ(at_record.optimizer_schedule, winner);
  EXPECT_EQ(at_record.optimizer_chunk_bytes, 96u);
  EXPECT_NE(lines.str().find("schedule RS-C-AG+slice(m,v) at 96-byte chunks"), std::string::npos)
      << lines.str();
  {
    tandem::testing::TempCacheDir dir("train-no-chunk");
    const TrainConfig c = two_ranks();
    store_optimizer_record(c, dir.str(), winner, 0);
    at_process = train(c);
  }
  EXPECT_EQ(at_process.optimizer_schedule, winner);
  EXPECT_EQ(at_process.optimizer_chunk_bytes, 0u) << "a record without a chunk round";
  testing::expect_bitwise(at_record, at_process, "the tuned chunk size against the process's");
}

// --shard weights: the blocks' gathers run at the chunk size of gather_weights' record (a block's
// elements on the data-parallel group), and the weights are the same as at the process's.
TEST(TrainerTunedSchedule, TheGathersRunAtTheRecordsChunkSize) {
  TrainConfig c = two_ranks();
  c.optimizer.sharding = parallel::Sharding::Weights;
  const parallel::ShardLayout layout(c.model, c.grid, 0, 0);
  TrainResult at_record;
  std::ostringstream lines;
  {
    tandem::testing::TempCacheDir dir("train-gather-chunk");
    store_record(c, dir.str(), dsl::workloads::gather_weights(), {{"N", layout.block_floats()}}, {},
                 "C", 64);
    c.out = &lines;
    at_record = train(c);
  }
  EXPECT_NE(lines.str().find("(gather_weights at 64-byte chunks)"), std::string::npos)
      << lines.str();
  tandem::testing::TempCacheDir dir("train-gather-no-record");
  testing::expect_bitwise(at_record, train(c), "the gathers at the record's chunk size");
}

// --grad-dtype auto runs the dtype whose record times the optimizer program faster, with that
// record's winner, and gives the weights of a run that names the dtype; without both records it
// runs f32 and says why.
TEST(TrainerGradDtypeAuto, TakesTheFasterOfTheTwoRecords) {
  for (const DType faster : {DType::BF16, DType::F32}) {
    tandem::testing::TempCacheDir dir("train-grad-dtype-auto");
    TrainConfig c = two_ranks();
    for (const DType d : {DType::F32, DType::BF16}) {
      c.grad_dtype = d;
      store_optimizer_record(c, dir.str(),
                             d == DType::BF16 ? "RS-C-AG+slice(m,v)" : "fused(RS-C-AG)+slice(m,v)",
                             0, d == faster ? 0.001 : 0.002);
    }
    c.grad_dtype = Auto<DType>();
    std::ostringstream lines;
    c.out = &lines;
    const TrainResult chosen = train(c);
    EXPECT_EQ(chosen.grad_dtype, faster) << dtype_name(faster);
    EXPECT_EQ(chosen.optimizer_schedule,
              faster == DType::BF16 ? "RS-C-AG+slice(m,v)" : "fused(RS-C-AG)+slice(m,v)");
    const std::string line = fmt::format(
        "--grad-dtype {} (--grad-dtype auto: the optimizer program {} ms with bf16 "
        "gradients, {} ms with f32)",
        dtype_name(faster), faster == DType::BF16 ? "1.000" : "2.000",
        faster == DType::BF16 ? "2.000" : "1.000");
    EXPECT_NE(lines.str().find(line), std::string::npos) << lines.str();
    TrainConfig named = two_ranks();
    named.grad_dtype = faster;
    testing::expect_bitwise(chosen, train(named), "auto against the dtype it chose, named");
  }
}

TEST(TrainerGradDtypeAuto, WithoutBothRecordsRunsF32AndSaysWhy) {
  tandem::testing::TempCacheDir dir("train-grad-dtype-one-record");
  TrainConfig c = two_ranks();
  c.grad_dtype = DType::BF16;
  store_optimizer_record(c, dir.str(), "RS-C-AG+slice(m,v)", 0, 0.001);  // bf16's only
  c.grad_dtype = Auto<DType>();
  std::ostringstream lines;
  c.out = &lines;
  const TrainResult r = train(c);
  EXPECT_EQ(r.grad_dtype, DType::F32);
  EXPECT_NE(lines.str().find("--grad-dtype f32 (--grad-dtype auto without the "
                             "autotuner's records of both (--tune makes them))"),
            std::string::npos)
      << lines.str();
  TrainConfig f32 = two_ranks();
  testing::expect_bitwise(r, train(f32), "auto without records against f32");
}

// Two tensor-parallel ranks in bf16 on the plan runner, weights kept.
TrainConfig two_tp_ranks() {
  TrainConfig c = testing::tiny_run(2);
  c.grid = {1, 2, 1};
  c.model.matmul = DType::BF16;
  c.keep_weights = true;
  return c;
}

// --tp-dtype auto runs the wire whose records time the epilogue and the backward's input-gradient
// sum together faster, with those records' winners, and gives the weights of a run that names
// the wire; without the records it runs f32 and says why.
TEST(TrainerTpDtypeAuto, TakesTheFasterWire) {
  for (const DType faster : {DType::BF16, DType::F32}) {
    tandem::testing::TempCacheDir dir("train-tp-dtype-auto");
    TrainConfig c = two_tp_ranks();
    const int64_t N = c.batch * c.model.seq_len, C = c.model.d_model;
    for (const DType wire : {DType::F32, DType::BF16}) {
      const double s = wire == faster ? 0.001 : 0.002;
      store_record(c, dir.str(), dsl::workloads::megatron_layer(DType::F32, c.model.dropout, wire),
                   {{"B", N}, {"K", 4 * C}, {"H", C}}, {}, "AR-C", 0, s);
      store_record(c, dir.str(), dsl::workloads::sum_in_place(wire), {{"N", N * C}}, {}, "AR-C", 0,
                   s);
    }
    c.tp_dtype = Auto<DType>();
    std::ostringstream lines;
    c.out = &lines;
    const TrainResult chosen = train(c);
    EXPECT_EQ(chosen.tp_dtype, faster) << dtype_name(faster);
    EXPECT_EQ(chosen.epilogue_schedule, "AR-C");
    const std::string line = fmt::format(
        "--tp-dtype {} (--tp-dtype auto: megatron_layer and sum_in_place {} ms "
        "with bf16, {} ms with f32)",
        dtype_name(faster), faster == DType::BF16 ? "2.000" : "4.000",
        faster == DType::BF16 ? "4.000" : "2.000");
    EXPECT_NE(lines.str().find(line), std::string::npos) << lines.str();
    TrainConfig named = two_tp_ranks();
    named.tp_dtype = faster;
    testing::expect_bitwise(chosen, train(named), "auto against the wire it chose, named");
  }
}

TEST(TrainerTpDtypeAuto, WithoutTheRecordsRunsF32AndSaysWhy) {
  tandem::testing::TempCacheDir dir("train-tp-dtype-no-record");
  TrainConfig c = two_tp_ranks();
  c.tp_dtype = Auto<DType>();
  std::ostringstream lines;
  c.out = &lines;
  const TrainResult r = train(c);
  EXPECT_EQ(r.tp_dtype, DType::F32);
  EXPECT_NE(lines.str().find("--tp-dtype f32 (--tp-dtype auto without the "
                             "autotuner's records of the epilogue and the input-gradient sum with "
                             "both (--tune makes them))"),
            std::string::npos)
      << lines.str();
  testing::expect_bitwise(r, train(two_tp_ranks()), "auto without records against f32");
}

// Both dtype autos are decided by the one resolve step, before any rank starts, from the records
// the ranks would read, with their reasons (the ranks' set-up only reads them); --tp-dtype auto
// with one tensor-parallel rank does not apply and stays undecided.
TEST(ResolveDtypes, TheDtypeAutosAreDecidedBeforeTheRanksStart) {
  {
    tandem::testing::TempCacheDir dir("resolve-grad-dtype");
    TrainConfig c = two_ranks();
    for (const DType d : {DType::F32, DType::BF16}) {
      c.grad_dtype = d;
      store_optimizer_record(c, dir.str(), "RS-C-AG+slice(m,v)", 0,
                             d == DType::BF16 ? 0.001 : 0.002);
    }
    c.grad_dtype = Auto<DType>();
    c.tp_dtype = Auto<DType>();
    const TrainConfig r = resolve(c, nullptr);
    ASSERT_TRUE(r.grad_dtype.known());
    EXPECT_EQ(r.grad_dtype.value(), DType::BF16);
    EXPECT_EQ(r.grad_dtype.reason(),
              "--grad-dtype auto: the optimizer program 1.000 ms with bf16 gradients, 2.000 ms "
              "with f32");
    EXPECT_FALSE(r.tp_dtype.known()) << "tp 1: nothing carries it";
  }
  tandem::testing::TempCacheDir dir("resolve-tp-dtype");
  TrainConfig c = two_tp_ranks();
  const int64_t N = c.batch * c.model.seq_len, C = c.model.d_model;
  for (const DType wire : {DType::F32, DType::BF16}) {
    const double s = wire == DType::BF16 ? 0.001 : 0.002;
    store_record(c, dir.str(), dsl::workloads::megatron_layer(DType::F32, c.model.dropout, wire),
                 {{"B", N}, {"K", 4 * C}, {"H", C}}, {}, "AR-C", 0, s);
    store_record(c, dir.str(), dsl::workloads::sum_in_place(wire), {{"N", N * C}}, {}, "AR-C", 0,
                 s);
  }
  c.tp_dtype = Auto<DType>();
  const TrainConfig r = resolve(c, nullptr);
  ASSERT_TRUE(r.tp_dtype.known());
  EXPECT_EQ(r.tp_dtype.value(), DType::BF16);
  EXPECT_EQ(r.tp_dtype.reason(),
            "--tp-dtype auto: megatron_layer and sum_in_place 2.000 ms with bf16, 4.000 ms with "
            "f32");
  // fp32 precision: decided without reading a record.
  c.model.matmul = DType::F32;
  const TrainConfig f = resolve(c, nullptr);
  ASSERT_TRUE(f.tp_dtype.known());
  EXPECT_EQ(f.tp_dtype.value(), DType::F32);
  EXPECT_EQ(f.tp_dtype.reason(), "--tp-dtype auto: fp32 precision has no bf16 products to carry");
}

}  // namespace
}  // namespace tandem::train
