// The schedules a training rank's programs run: the autotuner's cached (or freshly tuned) choice,
// else the preference lists.
#include "schedule_choice.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <memory>

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

}  // namespace

parallel::ProgramOptions ScheduleChoice::model_programs(int rows) {
  parallel::ProgramOptions o;
  o.executor = executor_;
  // A micro-batch's tokens on this rank (with context parallelism, its part of each sequence).
  const int64_t N = static_cast<int64_t>(rows) * (cfg_.model.seq_len / cfg_.grid.cp),
                C = cfg_.model.d_model;
  const dsl::SymbolMap sizes = {{"B", N}, {"K", cfg_.model.mlp_width()}, {"H", C}};
  const double p = cfg_.model.dropout;
  const dsl::workloads::Bias bias = parallel::epilogue_bias(cfg_.model);
  const bool tp = cfg_.grid.tp > 1;
  bool shard = tp || (cfg_.grid.pp > 1 && !grid_.last_stage());
  // The epilogue and the backward's sum of input gradients, (rows x seq_len, d_model), with the
  // tensor-parallel exchanges in `wire`.
  auto epilogue = [&](DType wire) {
    return tuned_schedule(dsl::workloads::megatron_layer(DType::F32, p, wire, bias), grid_.tp(),
                          sizes, cfg_.tune, executor_);
  };
  auto tp_sum = [&](DType wire) {
    return tuned_schedule(dsl::workloads::sum_in_place(wire), grid_.tp(), {{"N", N * C}}, cfg_.tune,
                          executor_);
  };
  Tuned epilogue_w, sum_w;  // the chosen wire's
  Auto<DType>& wire = cfg_.tp_dtype;
  if (tp && wire.is_auto() && !wire.known() && cfg_.model.matmul == DType::BF16) {
    // Both wires' records, then one choice for the whole run: bf16 only where every
    // tensor-parallel group's records time the epilogue and the sum together faster with it (the
    // groups of other pipeline stages run the same sizes, but time on their own ranks).
    const Tuned e32 = epilogue(DType::F32), s32 = tp_sum(DType::F32);
    const Tuned e16 = epilogue(DType::BF16), s16 = tp_sum(DType::BF16);
    const bool all = !e32.schedule.empty() && !s32.schedule.empty() && !e16.schedule.empty() &&
                     !s16.schedule.empty();
    const double f32_s = e32.seconds + s32.seconds, bf16_s = e16.seconds + s16.seconds;
    const bool use_bf16 = comm::all_true(grid_.world(), all && bf16_s < f32_s);
    wire.decide(
        use_bf16 ? DType::BF16 : DType::F32,
        !all ? "--tp-dtype auto without the autotuner's records of the epilogue and the "
               "input-gradient sum with both (--tune makes them)"
             : fmt::format(
                   "--tp-dtype auto: megatron_layer and sum_in_place {:.3f} ms "
                   "with bf16, {:.3f} ms with f32{}",
                   bf16_s * 1e3, f32_s * 1e3,
                   use_bf16 || bf16_s >= f32_s ? "" : ", but not on every tensor-parallel group"));
    o.tp_dtype = wire.value();
    epilogue_w = use_bf16 ? e16 : e32;
    sum_w = use_bf16 ? s16 : s32;
  } else {
    if (tp && wire.is_auto() && !wire.known())
      wire.decide(DType::F32, "--tp-dtype auto: fp32 precision has no bf16 products to carry");
    if (tp) o.tp_dtype = wire.value();
    if (shard) epilogue_w = epilogue(o.tp_dtype);
    if (tp) sum_w = tp_sum(o.tp_dtype);
  }
  if (shard) {
    from_autotuner_ |= !epilogue_w.schedule.empty();
    o.epilogue_schedules = prefer(epilogue_w, o.epilogue_schedules);
  }
  if (tp) {
    from_autotuner_ |= !sum_w.schedule.empty();
    o.tp_sum_schedules = prefer(sum_w, o.tp_sum_schedules);
  }
  // The pipeline program runs on each link, chosen on the link so that both ends agree: the
  // link from the previous stage first, as ParallelGPT sets them up.
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
    const parallel::ShardLayout layout(cfg_.model, cfg_.grid, grid_.coord().tp, grid_.coord().pp);
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
    const Tuned g =
        tuned_schedule(dsl::workloads::kv_gather(), grid_.cp(), kv, cfg_.tune, executor_);
    const Tuned r =
        tuned_schedule(dsl::workloads::kv_grad_reduce(), grid_.cp(), kv, cfg_.tune, executor_);
    from_autotuner_ |= !g.schedule.empty() || !r.schedule.empty();
    o.context_schedules.gather = prefer(g, o.context_schedules.gather);
    o.context_schedules.reduce = prefer(r, o.context_schedules.reduce);
  }
  return o;
}

parallel::SchedulePreferences ScheduleChoice::gather_schedules() {
  if (cfg_.optimizer.sharding != parallel::Sharding::Weights) return {};
  const parallel::ShardLayout layout(cfg_.model, cfg_.grid, grid_.coord().tp, grid_.coord().pp);
  const Tuned w = tuned_schedule(dsl::workloads::gather_weights(), grid_.dp(),
                                 {{"N", layout.block_floats()}}, cfg_.tune, executor_);
  from_autotuner_ |= !w.schedule.empty();
  return prefer(w, {{"C"}});
}

OptimizerChoice ScheduleChoice::optimizer() {
  OptimizerChoice choice{cfg_.optimizer, {parallel::optimizer_schedule_preferences()}};
  Auto<DType>& grad = cfg_.grad_dtype;
  const bool decide = grad.is_auto() && !grad.known();
  if (cfg_.optimizer.kind != parallel::OptimizerKind::AdamW) {
    if (decide)
      grad.decide(DType::F32, "--grad-dtype auto: the autotuner does not time lamb_bucket");
    choice.config.grad_dtype = grad.value();
    return choice;
  }
  const parallel::ShardLayout layout(cfg_.model, cfg_.grid, grid_.coord().tp, grid_.coord().pp);
  auto tuned = [&](DType grad_dtype) {
    parallel::OptimizerConfig o = cfg_.optimizer;
    o.grad_dtype = grad_dtype;
    const dsl::Program program = parallel::optimizer_program(o);
    std::vector<std::string> only;
    if (cfg_.grid.replicas() > 1)  // dp x cp replicas exchange
      for (const schedule::NamedSchedule& s : schedule::enumerate_schedules(program))
        if (!s.recipe.slice.empty()) only.push_back(s.name);
    return tuned_schedule(program, grid_.dp(), {{"N", layout.size()}}, cfg_.tune, executor_, only);
  };
  if (!decide) {
    choice.config.grad_dtype = grad.value();
    const Tuned w = tuned(grad.value());
    from_autotuner_ |= !w.schedule.empty();
    choice.schedules = prefer(w, choice.schedules);
    return choice;
  }
  // Both dtypes' records, then one choice for the whole run: bf16 only where every data-parallel
  // group's records prefer it (the groups of other tp and pp positions hold other sizes).
  const Tuned f32 = tuned(DType::F32), bf16 = tuned(DType::BF16);
  const bool both = !f32.schedule.empty() && !bf16.schedule.empty();
  const bool use_bf16 = comm::all_true(grid_.world(), both && bf16.seconds < f32.seconds);
  grad.decide(use_bf16 ? DType::BF16 : DType::F32,
              !both ? "--grad-dtype auto without the autotuner's records of both (--tune makes "
                      "them)"
                    : fmt::format("--grad-dtype auto: the optimizer program {:.3f} ms with bf16 "
                                  "gradients, {:.3f} ms with f32{}",
                                  bf16.seconds * 1e3, f32.seconds * 1e3,
                                  use_bf16 || bf16.seconds >= f32.seconds
                                      ? ""
                                      : ", but not on every data-parallel group"));
  choice.config.grad_dtype = grad.value();
  const Tuned& w = use_bf16 ? bf16 : f32;
  from_autotuner_ |= !w.schedule.empty();
  choice.schedules = prefer(w, choice.schedules);
  return choice;
}

}  // namespace tandem::train::detail
