// The schedules a training rank's programs run: the autotuner's cached (or freshly tuned) choice,
// else the preference lists.
#include "schedule_choice.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "rank_batches.h"
#include "tandem/comm/agree.h"
#include "tandem/comm/communicator.h"
#include "tandem/core/error.h"
#include "tandem/dsl/workloads.h"
#include "tandem/exec/jit.h"
#include "tandem/parallel/optimizer.h"
#include "tandem/parallel/shard.h"
#include "tandem/parallel/tensor_parallel.h"
#include "tandem/schedule/enumerate.h"
#include "tandem/tune/cache.h"
#include "tandem/tune/executor.h"
#include "tandem/tune/tune.h"

namespace tandem::train::detail {
namespace {

// The autotuner's choice for `program` on `comm` at `sizes`, its winner and chunk size: tuned now
// when `tune_now` (every candidate, or those in `only`, timed on this communicator and the choice
// cached), else read from the tuning cache (rank 0 reads, every rank gets its record; no name when
// there is none). A collective over `comm`.
struct Tuned {
  std::string schedule;    // "" when the autotuner has no choice
  size_t chunk_bytes = 0;  // 0: the process's comm::chunk_bytes()
  double seconds = 0;      // the winner's median time (its first pass, as every candidate's)
};

// The winner's median in `r`.
double winner_seconds(const tune::TuneRecord& r) {
  for (const tune::CandidateTiming& c : r.candidates)
    if (c.name == r.winner) return c.median();
  return 0;
}

Tuned tuned_schedule(const dsl::Program& program, comm::Communicator& comm,
                     const dsl::SymbolMap& sizes, bool tune_now, exec::RunnerKind executor,
                     const std::vector<std::string>& only = {}) {
  tune::TuneOptions o;
  o.sizes = sizes;
  o.only = only;
  o.executor = tune::executor_of(executor);
  if (tune_now) {
    const tune::TuneRecord r = tune::tune(program, comm, o).record;
    return {r.winner, r.chunk_bytes, winner_seconds(r)};
  }
  std::string text;
  if (comm.rank() == 0) {
    const tune::TuneKey key = tune::tune_key(program, comm, o);
    std::string stale;
    if (auto record = tune::load_record(key, exec::jit_cache_dir(), &stale))
      text = tune::record_to_json(*record, -1);
    if (!stale.empty())
      fmt::print(stderr, "train: {}; `tandem train --tune` or `tandem tune {}` makes a new one\n",
                 stale, program.name());
  }
  text = comm::broadcast_string(comm, text);
  if (text.empty()) return {};
  const tune::TuneRecord r = tune::record_from_json(text);
  // A winner the program has no schedule of would be passed over for the preference lists: say
  // so, and do not count it as the autotuner's choice.
  const std::vector<schedule::NamedSchedule> all = schedule::enumerate_schedules(program);
  if (std::none_of(all.begin(), all.end(), [&](const auto& s) { return s.name == r.winner; })) {
    if (comm.rank() == 0)
      fmt::print(stderr,
                 "train: the tuning record {} names schedule '{}', which program '{}' does not "
                 "have; it is not used (`tandem train --tune` or `tandem tune {}` makes a new "
                 "one)\n",
                 tune::record_path(r.key, exec::jit_cache_dir()), r.winner, program.name(),
                 program.name());
    return {};
  }
  return {r.winner, r.chunk_bytes, winner_seconds(r)};
}

// `rest`, with the autotuner's winner (when it has one) ahead of it, at its chunk size.
parallel::SchedulePreferences prefer(const Tuned& tuned, parallel::SchedulePreferences rest) {
  if (tuned.schedule.empty()) return rest;
  rest.names.insert(rest.names.begin(), tuned.schedule);
  rest.chunk_bytes = tuned.chunk_bytes;
  return rest;
}

// The sizes and programs whose records the choices below read, written once for the decision of
// the dtypes' autos (resolve's step) and for the schedules (the rank's set-up), so that both ask
// the tuning cache the same keys.

// A micro-batch's tokens on a rank: `rows` rows of seq_len / cp (with context parallelism, a
// rank's part of each sequence).
int64_t rank_tokens(const TrainConfig& c, int rows) {
  return static_cast<int64_t>(rows) * (c.model.seq_len / c.grid.cp);
}

// The Megatron epilogue's and the pipeline link's sizes: micro-batches of `rows` rows.
dsl::SymbolMap block_sizes(const TrainConfig& c, int rows) {
  const int64_t N = rank_tokens(c, rows);
  return {{"B", N}, {"K", c.model.mlp_width()}, {"H", c.model.d_model}};
}

// The epilogue's record, (rows x seq_len, d_model) with the tensor-parallel exchanges in `wire`.
Tuned tuned_epilogue(const TrainConfig& c, comm::Communicator& tp, int rows, DType wire) {
  return tuned_schedule(dsl::workloads::megatron_layer(DType::F32, c.model.dropout, wire,
                                                       parallel::epilogue_bias(c.model)),
                        tp, block_sizes(c, rows), c.tune, c.executor);
}

// The backward's sum of input gradients over the tensor-parallel group, in `wire`.
Tuned tuned_tp_sum(const TrainConfig& c, comm::Communicator& tp, int rows, DType wire) {
  const int64_t n = rank_tokens(c, rows) * c.model.d_model;
  return tuned_schedule(dsl::workloads::sum_in_place(wire), tp, {{"N", n}}, c.tune, c.executor);
}

// The optimizer program's record with `grad_dtype` gradients over the data-parallel group, for
// the rank's shard `layout`; with dp > 1 among the schedules that keep the state sliced.
Tuned tuned_optimizer(const TrainConfig& c, comm::Communicator& dp,
                      const parallel::ShardLayout& layout, DType grad_dtype) {
  parallel::OptimizerConfig o = c.optimizer;
  o.grad_dtype = grad_dtype;
  const dsl::Program program = parallel::optimizer_program(o);
  std::vector<std::string> only;
  if (c.grid.replicas() > 1)  // the dp x cp replicas exchange
    for (const schedule::NamedSchedule& s : schedule::enumerate_schedules(program))
      if (!s.recipe.slice.empty()) only.push_back(s.name);
  return tuned_schedule(program, dp, {{"N", layout.size()}}, c.tune, c.executor, only);
}

parallel::ShardLayout rank_layout(const TrainConfig& c, const parallel::Grid& grid) {
  return parallel::ShardLayout(c.model, c.grid, grid.coord().tp, grid.coord().pp);
}

// --tp-dtype auto: bf16 only where every tensor-parallel group's records time the epilogue and
// the input-gradient sum together faster with it (the groups of other pipeline stages run the
// same sizes, but time on their own ranks); f32 without all four records, and in fp32.
void decide_tp_dtype(TrainConfig& c, const parallel::Grid& grid, int rows) {
  Auto<DType>& wire = c.tp_dtype;
  if (c.model.matmul != DType::BF16) {
    wire.decide(DType::F32, "--tp-dtype auto: fp32 precision has no bf16 products to carry");
    return;
  }
  const Tuned e32 = tuned_epilogue(c, grid.tp(), rows, DType::F32);
  const Tuned s32 = tuned_tp_sum(c, grid.tp(), rows, DType::F32);
  const Tuned e16 = tuned_epilogue(c, grid.tp(), rows, DType::BF16);
  const Tuned s16 = tuned_tp_sum(c, grid.tp(), rows, DType::BF16);
  const bool all = !e32.schedule.empty() && !s32.schedule.empty() && !e16.schedule.empty() &&
                   !s16.schedule.empty();
  const double f32_s = e32.seconds + s32.seconds, bf16_s = e16.seconds + s16.seconds;
  const bool use_bf16 = comm::all_true(grid.world(), all && bf16_s < f32_s);
  wire.decide(
      use_bf16 ? DType::BF16 : DType::F32,
      !all ? "--tp-dtype auto without the autotuner's records of the epilogue and the "
             "input-gradient sum with both (--tune makes them)"
           : fmt::format(
                 "--tp-dtype auto: megatron_layer and sum_in_place {:.3f} ms "
                 "with bf16, {:.3f} ms with f32{}",
                 bf16_s * 1e3, f32_s * 1e3,
                 use_bf16 || bf16_s >= f32_s ? "" : ", but not on every tensor-parallel group"));
}

// --grad-dtype auto: bf16 only where every data-parallel group's records prefer it (the groups
// of other tp and pp positions hold other sizes); f32 without both records, and for LAMB.
void decide_grad_dtype(TrainConfig& c, const parallel::Grid& grid) {
  Auto<DType>& grad = c.grad_dtype;
  if (c.optimizer.kind != parallel::OptimizerKind::AdamW) {
    grad.decide(DType::F32, "--grad-dtype auto: the autotuner does not time lamb_bucket");
    return;
  }
  const parallel::ShardLayout layout = rank_layout(c, grid);
  const Tuned f32 = tuned_optimizer(c, grid.dp(), layout, DType::F32);
  const Tuned bf16 = tuned_optimizer(c, grid.dp(), layout, DType::BF16);
  const bool both = !f32.schedule.empty() && !bf16.schedule.empty();
  const bool use_bf16 = comm::all_true(grid.world(), both && bf16.seconds < f32.seconds);
  grad.decide(use_bf16 ? DType::BF16 : DType::F32,
              !both ? "--grad-dtype auto without the autotuner's records of both (--tune makes "
                      "them)"
                    : fmt::format("--grad-dtype auto: the optimizer program {:.3f} ms with bf16 "
                                  "gradients, {:.3f} ms with f32{}",
                                  bf16.seconds * 1e3, f32.seconds * 1e3,
                                  use_bf16 || bf16.seconds >= f32.seconds
                                      ? ""
                                      : ", but not on every data-parallel group"));
}

// A dtype the set-up reads: given, or decided by resolve (decide_dtypes).
DType decided(const Auto<DType>& d, std::string_view flag) {
  TANDEM_CHECK(d.known(), "{} auto reached a rank's set-up undecided: train::resolve decides it",
               flag);
  return d.value();
}

}  // namespace

bool dtypes_to_decide(const TrainConfig& c) {
  const bool tp = c.grid.tp > 1 && c.tp_dtype.is_auto() && !c.tp_dtype.known();
  return tp || (c.grad_dtype.is_auto() && !c.grad_dtype.known());
}

void decide_dtypes(comm::Communicator& world, TrainConfig& c) {
  if (!dtypes_to_decide(c)) return;
  const parallel::Grid grid(world, c.grid);
  // The order every rank keeps: the tensor-parallel wire, then the gradients.
  if (c.grid.tp > 1 && c.tp_dtype.is_auto() && !c.tp_dtype.known())
    decide_tp_dtype(c, grid, RankBatches(c, grid).micro_rows());
  if (c.grad_dtype.is_auto() && !c.grad_dtype.known()) decide_grad_dtype(c, grid);
}

parallel::ProgramOptions ScheduleChoice::model_programs(int rows) {
  parallel::ProgramOptions o;
  o.executor = executor_;
  const double p = cfg_.model.dropout;
  const dsl::workloads::Bias bias = parallel::epilogue_bias(cfg_.model);
  const bool tp = cfg_.grid.tp > 1;
  // As ParallelGPT runs the epilogue program: tensor-parallel, a stage boundary, or cp.
  bool shard = tp || (cfg_.grid.pp > 1 && !grid_.last_stage()) || cfg_.grid.cp > 1;
  if (tp) o.tp_dtype = decided(cfg_.tp_dtype, "--tp-dtype");
  if (shard) {
    const Tuned w = tuned_epilogue(cfg_, grid_.tp(), rows, o.tp_dtype);
    from_autotuner_ |= !w.schedule.empty();
    o.epilogue_schedules = prefer(w, o.epilogue_schedules);
  }
  if (tp) {
    const Tuned w = tuned_tp_sum(cfg_, grid_.tp(), rows, o.tp_dtype);
    from_autotuner_ |= !w.schedule.empty();
    o.tp_sum_schedules = prefer(w, o.tp_sum_schedules);
  }
  // The pipeline program runs on each link, chosen on the link so that both ends agree: the
  // link from the previous stage first, as ParallelGPT sets them up.
  const dsl::SymbolMap sizes = block_sizes(cfg_, rows);
  if (grid_.from_prev() != nullptr) {
    const Tuned w = tuned_schedule(dsl::workloads::pipeline_stage(DType::F32, p, o.tp_dtype, bias),
                                   *grid_.from_prev(), sizes, cfg_.tune, executor_);
    from_autotuner_ |= !w.schedule.empty();
    o.pipeline_recv_schedules = prefer(w, o.pipeline_recv_schedules);
  }
  if (grid_.to_next() != nullptr) {
    const Tuned w = tuned_schedule(dsl::workloads::pipeline_stage(DType::F32, p, o.tp_dtype, bias),
                                   *grid_.to_next(), sizes, cfg_.tune, executor_);
    from_autotuner_ |= !w.schedule.empty();
    o.pipeline_schedules = prefer(w, o.pipeline_schedules);
  }
  if (grid_.tied() != nullptr && cfg_.model.tie_embeddings) {  // first and last stage, after links
    const parallel::ShardLayout layout = rank_layout(cfg_, grid_);
    const int64_t wte =
        (grid_.first_stage() ? layout.tensors().front() : layout.tensors().back()).numel();
    const Tuned w = tuned_schedule(dsl::workloads::sum_in_place(), *grid_.tied(), {{"N", wte}},
                                   cfg_.tune, executor_);
    from_autotuner_ |= !w.schedule.empty();
    o.tied_sum_schedules = prefer(w, o.tied_sum_schedules);
  }
  if (cfg_.grid.cp > 1) {  // context parallelism's two exchanges, on the cp group
    o.context_group = &grid_.cp();
    // Each is over the whole sequence's keys and values of this rank's key/value heads.
    const dsl::SymbolMap kv = {{"N", static_cast<int64_t>(rows) * cfg_.model.seq_len * 2 *
                                         (cfg_.model.n_kv_heads() / cfg_.grid.tp) *
                                         cfg_.model.head_size()}};
    if (o.context_schedules.order == parallel::ContextOrder::Ring) {
      // The ring's shifts move one rank's piece: 1/cp of the sequence's.
      const dsl::SymbolMap piece = {{"N", kv.at("N") / cfg_.grid.cp}};
      const Tuned k =
          tuned_schedule(dsl::workloads::kv_ring(), grid_.cp(), piece, cfg_.tune, executor_);
      from_autotuner_ |= !k.schedule.empty();
      o.context_schedules.ring = prefer(k, o.context_schedules.ring);
    } else {
      const Tuned g =
          tuned_schedule(dsl::workloads::kv_gather(), grid_.cp(), kv, cfg_.tune, executor_);
      const Tuned r =
          tuned_schedule(dsl::workloads::kv_grad_reduce(), grid_.cp(), kv, cfg_.tune, executor_);
      from_autotuner_ |= !g.schedule.empty() || !r.schedule.empty();
      o.context_schedules.gather = prefer(g, o.context_schedules.gather);
      o.context_schedules.reduce = prefer(r, o.context_schedules.reduce);
    }
  }
  return o;
}

parallel::SchedulePreferences ScheduleChoice::gather_schedules() {
  if (cfg_.optimizer.sharding != parallel::Sharding::Weights) return {};
  const parallel::ShardLayout layout = rank_layout(cfg_, grid_);
  const Tuned w = tuned_schedule(dsl::workloads::gather_weights(), grid_.dp(),
                                 {{"N", layout.block_floats()}}, cfg_.tune, executor_);
  from_autotuner_ |= !w.schedule.empty();
  return prefer(w, {{"C"}});
}

OptimizerChoice ScheduleChoice::optimizer() {
  OptimizerChoice choice{cfg_.optimizer, {parallel::optimizer_schedule_preferences()}};
  choice.config.grad_dtype = decided(cfg_.grad_dtype, "--grad-dtype");
  if (cfg_.optimizer.kind != parallel::OptimizerKind::AdamW) return choice;
  const Tuned w =
      tuned_optimizer(cfg_, grid_.dp(), rank_layout(cfg_, grid_), choice.config.grad_dtype);
  from_autotuner_ |= !w.schedule.empty();
  choice.schedules = prefer(w, choice.schedules);
  return choice;
}

}  // namespace tandem::train::detail
