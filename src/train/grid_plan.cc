// The plan across grids: the configurations of N ranks that fit a memory per rank, each step
// predicted by the performance model (perf/step_model.h) from measured rates, the fastest first;
// the settings it decides resolved (--grid auto, --gather-ahead auto, --tp-dtype and --grad-dtype
// auto); and a run's configuration in the performance model's terms (its step's shape, the rates
// it asks for).
#include "tandem/train/grid_plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>
#include <tuple>
#include <vector>

#include "schedule_choice.h"
#include "settings.h"
#include "tandem/comm/agree.h"
#include "tandem/comm/communicator.h"
#include "tandem/comm/mpi.h"
#include "tandem/comm/thread.h"
#include "tandem/core/blas.h"
#include "tandem/core/bytes.h"
#include "tandem/core/error.h"
#include "tandem/core/formulas.h"
#include "tandem/exec/jit.h"
#include "tandem/nn/gpt.h"
#include "tandem/ooc/memory_schedule.h"
#include "tandem/ooc/plan.h"
#include "tandem/ooc/planner.h"
#include "tandem/perf/step_model.h"
#include "tandem/train/memory_estimate.h"

namespace tandem::train {
namespace {

// The out-of-core searches per stage: enough for the benchmark models, short across many grids.
constexpr int64_t kPlanEvaluations = 20'000;

// TrainConfig::validate's refusal of `cfg`, or "".
std::string refusal_of(const TrainConfig& cfg) {
  try {
    cfg.validate();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

// Grid divisors of `n` (at most kMaxPlanRanks, checked by the callers), ascending.
std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// At most this many refusals are listed in a message, then how many more there are: a plan of
// many ranks refuses hundreds of grids, and a message is one readable line.
constexpr size_t kListedRefusals = 3;

// A configuration's run: `base` on grid `g` with nothing the plan chooses set yet.
TrainConfig on_grid(const TrainConfig& base, const parallel::GridShape& g) {
  TrainConfig c = base;
  c.grid = g;
  c.plan_only = false;
  c.memory_budget.clear();
  c.ooc_plan.clear();
  c.model_state.reset();
  c.resident_blocks = Auto<int>();
  c.optimizer.sharding = parallel::Sharding::Moments;
  return c;
}

// One pipeline stage of a configuration: its memory, and its times as the step model has them.
struct Stage {
  RankMemory memory;
  perf::StageTimes times;
};

// A size as a flag reads it back exactly: "9MiB", "3234KiB", "1000".
std::string size_flag(uint64_t bytes) {
  for (auto [unit, scale] :
       {std::pair{"GiB", 1ull << 30}, {"MiB", 1ull << 20}, {"KiB", 1ull << 10}})
    if (bytes % scale == 0) return fmt::format("{}{}", bytes / scale, unit);
  return fmt::format("{}", bytes);
}

// What the plan chooses, as the flags that ask for it (the settings table's).
std::string flags_of(const TrainConfig& c) {
  static constexpr std::string_view kChosen[] = {"grid",         "micro_batches", "sharding",
                                                 "gather_ahead", "model_state",   "memory_budget"};
  return fmt::format("{}", fmt::join(detail::flags_for(c, kChosen), " "));
}

std::string listed(const std::vector<Refusal>& refused) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < refused.size() && i < kListedRefusals; ++i)
    parts.push_back(refused[i].what + ": " + refused[i].why);
  if (refused.size() > kListedRefusals)
    parts.push_back(fmt::format("and {} more", refused.size() - kListedRefusals));
  return fmt::format("{}", fmt::join(parts, "; "));
}

std::string describe_config(const TrainConfig& c) {
  return fmt::format("{}{}, --shard {}, blocks {}", c.grid.str(),
                     c.micro_batches > 0 ? fmt::format(", {} micro-batches", c.micro_batches) : "",
                     parallel::sharding_name(c.optimizer.sharding),
                     c.model_state ? "streamed from " + c.model_state->str() : "in memory");
}

// Plans one configuration against the limit: the option when it fits, else the least memory
// per rank it would need.
struct Evaluation {
  std::optional<GridOption> option;
  uint64_t least_bytes = 0;
  bool least_out_of_core = false;  // the least needs the activations out-of-core
};

Evaluation evaluate(const TrainConfig& cfg, uint64_t limit, const Rates& rates) {
  const parallel::GridShape& g = cfg.grid;
  const perf::StepShape shape = step_shape(cfg);
  std::vector<Stage> stages;
  std::vector<perf::StageTimes> times;
  for (int s = 0; s < g.pp; ++s) {
    times.push_back(perf::stage_times(shape, s, rates));
    stages.push_back({rank_memory(cfg, 0, s), times.back()});
  }
  uint64_t in_core = 0, fixed_less_held = 0;
  for (const Stage& st : stages) {
    in_core = std::max(in_core, st.memory.in_core());
    fixed_less_held = std::max(fixed_less_held, st.memory.fixed - st.memory.budget_holds);
  }
  Evaluation ev;
  GridOption o;
  o.cfg = cfg;
  std::vector<ooc::Prediction> predictions;
  if (in_core <= limit) {
    o.memory_per_rank = in_core;
    o.activations = "in-core";
    for (const Stage& st : stages)
      predictions.push_back(
          ooc::predict(st.times.chain, ooc::keep_all(st.times.chain.units), st.times.profile));
  } else if (g.cp > 1) {
    // Context parallelism runs in-core only (--memory-budget is refused with --cp).
    ev.least_bytes = in_core;
    return ev;
  } else {
    // Out-of-core: one --memory-budget B for every rank; stage s's activations get
    // B - budget_holds, and a rank needs fixed - budget_holds + B.
    uint64_t least_budget = 0;
    for (const Stage& st : stages) {
      const ooc::Profile sizes = ooc::uniform_profile(st.times.chain.units, 1.0, 2.0, 1e9, 1e9);
      const uint64_t smallest = ooc::smallest_budget(st.times.chain, sizes).bytes;
      least_budget = std::max(least_budget, st.memory.budget_holds + smallest);
    }
    ev.least_bytes = std::min(in_core, fixed_less_held + least_budget);
    ev.least_out_of_core = ev.least_bytes < in_core;
    if (fixed_less_held + least_budget > limit) return ev;
    // Whole KiB, so that the flag reads back the same.
    const uint64_t budget = (limit - fixed_less_held) / 1024 * 1024;
    if (budget < least_budget) return ev;
    std::vector<std::string> plans;
    try {
      for (const Stage& st : stages) {
        const ooc::PlannerResult p = ooc::plan_step(
            st.times.chain, st.times.profile, budget - st.memory.budget_holds, kPlanEvaluations);
        predictions.push_back(p.best.prediction);
        plans.push_back(p.best.plan.str());
      }
    } catch (const UserError&) {
      return ev;  // the search, cut short, found no plan that fits
    }
    o.cfg.memory_budget = size_flag(budget);
    o.memory_per_rank = fixed_less_held + budget;
    o.activations = fmt::format("out-of-core, plan{} {}", plans.size() == 1 ? "" : "s by stage",
                                fmt::join(plans, " "));
  }
  ev.least_bytes = o.memory_per_rank;
  o.breakdown = perf::compose(shape, times, predictions, rates);
  o.step_s = o.breakdown.total();
  o.tokens_per_s = static_cast<double>(cfg.batch) * cfg.model.seq_len / o.step_s;
  ev.option = std::move(o);
  return ev;
}

// The least memory per rank any configuration tried needs, and which.
using Least = std::optional<std::pair<uint64_t, std::string>>;

// One configuration tried: its option when it fits; else why not (refused by the checks, or
// needing more than the limit), as the table's "left out" lists it.
struct Tried {
  std::optional<GridOption> option;
  std::string described, refusal;
  uint64_t least_bytes = UINT64_MAX;  // what it needs at the least (refused: unknown)
};

Tried try_config(TrainConfig cfg, uint64_t limit, const Rates& rates, Least& least) {
  if (cfg.optimizer.sharding == parallel::Sharding::Weights)
    choose_gather_ahead(cfg, rates);
  else
    cfg.gather_ahead = Auto<int>();  // --grid auto --gather-ahead N: for the sharded ones
  Tried t;
  t.described = describe_config(cfg);
  if (t.refusal = refusal_of(cfg); !t.refusal.empty()) return t;
  Evaluation ev = evaluate(cfg, limit, rates);
  t.least_bytes = ev.least_bytes;
  if (!least || ev.least_bytes < least->first)
    least = {ev.least_bytes,
             t.described + (ev.least_out_of_core ? ", activations out-of-core" : "")};
  if (ev.option)
    t.option = std::move(ev.option);
  else
    t.refusal = fmt::format("needs at least {} a rank", human_bytes(ev.least_bytes));
  return t;
}

// The pipeline's search stops moving layers after this many a direction, and counts at most
// this many micro-batches (or the automatic count, when more): bounds on the plan's time.
constexpr int kMostMovedLayers = 16;
constexpr int kMostMicroBatches = 8;

// The split of `layers` over `pp` stages with `k` layers moved off stage `from` (the first or the
// last) from the even split, each to the other stage holding the fewest (the earliest of equals):
// empty when `from` would keep none.
std::vector<int> moved_split(int layers, int pp, int from, int k) {
  std::vector<int> split;
  for (int s = 0; s < pp; ++s) split.push_back(static_cast<int>(fx::part_count(layers, pp, s)));
  if (split[static_cast<size_t>(from)] - k < 1) return {};
  split[static_cast<size_t>(from)] -= k;
  for (int i = 0; i < k; ++i) {
    size_t to = from == 0 ? 1 : 0;
    for (size_t s = 0; s < split.size(); ++s)
      if (static_cast<int>(s) != from && split[s] < split[to]) to = s;
    ++split[to];
  }
  return split;
}

// With a pipeline, the split and the micro-batch count the performance model predicts fastest
// of a bounded set, and its option when it beats `to_beat` (0: the configuration as given did
// not fit, so anything that fits does); nothing otherwise. The layers move off the last stage (the
// final norm and the LM head there set the pace with a large vocabulary) or off the first (the
// embeddings' memory) one at a time while the prediction improves; then the micro-batch counts
// that divide a pipeline's rows, up to kMostMicroBatches, on the split found (unless given with
// --micro-batches). Each is checked as any configuration is (TrainConfig::validate, the memory
// per rank).
std::optional<GridOption> search_pipeline(const TrainConfig& cfg, double to_beat, uint64_t limit,
                                          const Rates& rates, Least& least) {
  const int pp = cfg.grid.pp, layers = cfg.model.n_layers;
  if (pp < 2 || pp > parallel::StageLayers::kMostStages) return std::nullopt;
  std::optional<GridOption> best;
  auto better = [&](const Tried& t) {
    const double bar = best ? best->step_s : to_beat;
    return t.option && (bar == 0 || t.option->step_s < bar);
  };
  parallel::StageLayers split;  // the best found: empty is the even one
  for (const int from : {pp - 1, 0}) {
    // Past the best of a direction, or where what does not fit needs more with each layer
    // moved, the search turns.
    uint64_t need = UINT64_MAX;
    for (int k = 1; k <= kMostMovedLayers; ++k) {
      TrainConfig c = cfg;
      c.grid.stage_layers = moved_split(layers, pp, from, k);
      if (c.grid.stage_layers.empty()) break;
      Tried t = try_config(c, limit, rates, least);
      if (better(t)) {
        best = std::move(t.option);
        split = c.grid.stage_layers;
      } else if (t.option || t.least_bytes >= need) {
        break;
      }
      need = t.least_bytes;
    }
  }
  if (cfg.micro_batches == 0) {
    const int64_t rows = cfg.batch / std::max(1, cfg.grid.dp);
    const int automatic = cfg.micro_batch_count();
    for (int m = 1; m <= std::max(kMostMicroBatches, automatic) && m <= rows; ++m) {
      if (rows % m != 0 || m == automatic) continue;
      TrainConfig c = cfg;
      c.grid.stage_layers = split;
      c.micro_batches = m;
      if (Tried t = try_config(c, limit, rates, least); better(t)) best = std::move(t.option);
    }
  }
  return best;
}

}  // namespace

perf::StepBreakdown predict_step(const TrainConfig& cfg, const Rates& rates) {
  const perf::StepShape shape = step_shape(cfg);
  std::vector<perf::StageTimes> times;
  std::vector<ooc::Prediction> timelines;
  for (int s = 0; s < cfg.grid.pp; ++s) {
    const perf::StageTimes& st = times.emplace_back(perf::stage_times(shape, s, rates));
    if (cfg.memory_budget.empty()) {
      timelines.push_back(ooc::predict(st.chain, ooc::keep_all(st.chain.units), st.profile));
      continue;
    }
    const uint64_t budget = parse_bytes(cfg.memory_budget),
                   held = rank_memory(cfg, 0, s).budget_holds;
    if (held >= budget)
      user_error("--memory-budget {} leaves stage {}'s activations nothing", cfg.memory_budget, s);
    timelines.push_back(
        ooc::plan_step(st.chain, st.profile, budget - held, kPlanEvaluations).best.prediction);
  }
  return perf::compose(shape, times, timelines, rates);
}

GatherTiming gather_timing(const TrainConfig& cfg, const Rates& rates) {
  return perf::gather_timing(step_shape(cfg), rates);
}

void choose_gather_ahead(TrainConfig& cfg, const Rates& rates) {
  if (cfg.optimizer.sharding != parallel::Sharding::Weights) return;
  if (cfg.gather_ahead.known()) return;  // given, or decided before (by --grid auto's plan)
  const int fewest = cfg.fewest_stage_blocks();
  const GatherTiming t = gather_timing(cfg, rates);
  const int d = perf::gather_ahead_for(t.gather_s, t.block_forward_s, fewest);
  const bool capped = d * t.block_forward_s < t.gather_s;
  cfg.gather_ahead.decide(
      d, fmt::format("--gather-ahead auto: a gather {:.2f} ms, a block's forward {:.2f} ms{}",
                     t.gather_s * 1e3, t.block_forward_s * 1e3,
                     capped ? fmt::format("; at most {} with {} block{} a stage", d, fewest,
                                          fewest == 1 ? "" : "s")
                            : ""));
}

namespace {

// An Auto<int> as rank 0 hands it to the others: {"given": N}, {"value": N, "reason": "..."}
// once decided, or null while undecided.
nlohmann::json auto_json(const Auto<int>& a) {
  if (!a.is_auto()) return {{"given", a.value()}};
  if (!a.known()) return nullptr;
  return {{"value", a.value()}, {"reason", a.reason()}};
}
Auto<int> auto_from_json(const nlohmann::json& j) {
  if (j.is_null()) return {};
  if (j.contains("given")) return j.at("given").get<int>();
  Auto<int> a;
  a.decide(j.at("value").get<int>(), j.at("reason").get<std::string>());
  return a;
}

// What --grid auto takes from the plan's recommendation, as rank 0 hands it to the others.
nlohmann::json plan_choice_json(const TrainConfig& c) {
  return {{"dp", c.grid.dp},
          {"tp", c.grid.tp},
          {"pp", c.grid.pp},
          {"cp", c.grid.cp},
          {"stage_layers", c.grid.stage_layers.counts()},
          {"micro_batches", c.micro_batches},
          {"sharding", c.optimizer.sharding == parallel::Sharding::Weights},
          {"model_state", c.model_state ? c.model_state->str() : ""},
          {"resident_blocks", auto_json(c.resident_blocks)},
          {"memory_budget", c.memory_budget},
          {"gather_ahead", auto_json(c.gather_ahead)},
          {"grid_choice", c.grid_choice}};
}

void take_plan_choice(const nlohmann::json& j, TrainConfig& c) {
  c.grid = {j.at("dp").get<int>(), j.at("tp").get<int>(), j.at("pp").get<int>(),
            j.at("cp").get<int>(), j.at("stage_layers").get<std::vector<int>>()};
  c.micro_batches = j.at("micro_batches").get<int>();
  c.optimizer.sharding =
      j.at("sharding").get<bool>() ? parallel::Sharding::Weights : parallel::Sharding::Moments;
  const std::string tier = j.at("model_state").get<std::string>();
  c.model_state.reset();
  if (!tier.empty()) c.model_state = ooc::TierSpec::parse(tier);
  c.resident_blocks = auto_from_json(j.at("resident_blocks"));
  c.memory_budget = j.at("memory_budget").get<std::string>();
  c.gather_ahead = auto_from_json(j.at("gather_ahead"));
  c.grid_choice = j.at("grid_choice").get<std::string>();
}

// Rank 0's `decide`, on every process of `world` (or here, without one).
std::string on_root(comm::Communicator* world, const std::function<std::string()>& decide) {
  return world == nullptr ? decide() : comm::decide_on_root(*world, decide);
}

}  // namespace

uint64_t plan_memory_per_rank(const TrainConfig::GridAuto& request, comm::Backend backend) {
  if (request.memory_per_rank) return *request.memory_per_rank;
  const auto avail = available_memory();
  if (!avail)
    user_error(
        "--ranks {}: the memory available here is unknown; give the memory each rank may use "
        "with --memory-per-rank (e.g. 4GiB)",
        request.ranks);
  const int local = backend == comm::Backend::Thread ? request.ranks : comm::launched_local_ranks();
  return avail->bytes / static_cast<uint64_t>(std::max(1, local));
}

// --grid auto: the processes would each plan on their own measurements (and by default their
// own machine's memory) and could choose differently, so rank 0 plans; should it find nothing,
// all stop and rank 0 says why. --gather-ahead auto likewise. The rates measured for it are
// compute's and the link's, not the tiers'.
TrainConfig resolve(const TrainConfig& asked, comm::Communicator* world) {
  // Whether rank 0 plans, and whether and how the dtypes are decided, decides which collectives
  // follow: ranks started with different flags there stop here, naming them, rather than wait in
  // unmatched broadcasts.
  if (world != nullptr)
    detail::check_ranks_agree_on(*world, asked,
                                 {"model", "batch", "optimizer", "grad_dtype", "tp_dtype", "grid",
                                  "grid_auto", "micro_batches", "executor", "tune"});
  TrainConfig c = asked;
  if (c.grid_auto) {
    const TrainConfig::GridAuto& g = *c.grid_auto;
    auto plan = [&] {
      const GridPlan p = plan_grids(c, g.ranks, plan_memory_per_rank(g, c.backend),
                                    measure_rates(c, g.ranks, g.link_gbps));
      TrainConfig best = p.best().cfg;
      best.grid_choice = grid_choice_line(p);
      return plan_choice_json(best).dump();
    };
    take_plan_choice(nlohmann::json::parse(on_root(world, plan)), c);
  }
  c.validate();
  const std::string chosen = on_root(world, [&c] {
    TrainConfig d = c;
    if (d.optimizer.sharding == parallel::Sharding::Weights && !d.gather_ahead.known())
      choose_gather_ahead(d, measure_rates(d, d.grid.size(), std::nullopt, false));
    return auto_json(d.gather_ahead).dump();
  });
  // Rank 0's decision, where this process asked for auto too.
  const Auto<int> root = auto_from_json(nlohmann::json::parse(chosen));
  if (c.optimizer.sharding == parallel::Sharding::Weights && c.gather_ahead.is_auto() &&
      !c.gather_ahead.known() && root.is_auto() && root.known())
    c.gather_ahead = root;
  // --tp-dtype auto, --grad-dtype auto: decided from the autotuner's records of the programs
  // they change, read (or, with --tune, timed) on the groups those run on, so each group's own
  // record counts (schedule_choice.h's decide_dtypes); the ranks' Grid is built for it here, on
  // the MPI world or on the in-process ranks of the thread backend, and the world agrees through
  // comm::all_true. An MPI world of the wrong size leaves them to train(), which refuses it.
  if (detail::dtypes_to_decide(c)) {
    // The BLAS threads a rank will have: the records count them in their keys. (train() sets
    // them for every run after its memory check, which must come before the BLAS is loaded.)
    blas::set_num_threads(rank_threads(c, c.grid.size()));
    if (world != nullptr) {
      if (world->size() == c.grid.size()) detail::decide_dtypes(*world, c);
    } else {
      TANDEM_CHECK(c.backend == comm::Backend::Thread,
                   "resolve: an MPI run's autos are decided on its world");
      TrainConfig decided;
      comm::run_ranks(c.grid.size(), [&](comm::Communicator& ranks) {
        TrainConfig mine = c;
        detail::decide_dtypes(ranks, mine);
        if (ranks.rank() == 0) decided = std::move(mine);  // the same on every rank
      });
      c = std::move(decided);
    }
  }
  return c;
}

std::string GridOption::describe() const {
  return fmt::format("{}, {}", describe_config(cfg), activations);
}

void check_plan_ranks(int64_t ranks) {
  if (ranks < 1) user_error("--ranks {} must be at least 1", ranks);
  if (ranks > kMaxPlanRanks)
    user_error(
        "--ranks {}: the plan across grids takes at most {} ranks; plan a run of that size or "
        "fewer, or give --dp, --tp and --pp",
        ranks, kMaxPlanRanks);
}

GridCandidates candidate_grids(const TrainConfig& base, int ranks) {
  check_plan_ranks(ranks);
  GridCandidates c;
  for (int cp : divisors(ranks)) {
    // Context parallelism where the model and the flags allow it (the sequence cuts into 2 cp
    // chunks, no dropout, the fused attention): asked once per cp, on a grid of cp ranks alone,
    // so that a setting that rules every cp grid out is one line, not one per grid.
    if (cp > 1) {
      if (std::string why = refusal_of(on_grid(base, {1, 1, 1, cp})); !why.empty()) {
        c.refused.push_back({fmt::format("grids with cp={}", cp), std::move(why)});
        continue;
      }
    }
    for (int dp : divisors(ranks / cp))
      for (int tp : divisors(ranks / cp / dp)) {
        const parallel::GridShape g{dp, tp, ranks / cp / dp / tp, cp};
        if (std::string why = refusal_of(on_grid(base, g)); !why.empty())
          c.refused.push_back({g.str(), std::move(why)});
        else
          c.allowed.push_back(g);
      }
  }
  return c;
}

GridPlan plan_grids(const TrainConfig& base, int ranks, uint64_t memory_per_rank,
                    const Rates& rates) {
  GridPlan plan;
  plan.ranks = ranks;
  plan.memory_per_rank = memory_per_rank;
  plan.rates = rates;
  const GridCandidates grids = candidate_grids(base, ranks);
  plan.refused = grids.refused;
  if (grids.allowed.empty())
    user_error("no grid of {} ranks suits this model and batch: {}", ranks, listed(grids.refused));
  Least least;  // over every configuration
  for (const parallel::GridShape& g : grids.allowed) {
    std::vector<TrainConfig> configs;
    TrainConfig c = on_grid(base, g);
    configs.push_back(c);
    if (g.dp >= 2) {
      TrainConfig w = c;
      w.optimizer.sharding = parallel::Sharding::Weights;
      configs.push_back(w);
    }
    if (base.model_state) {
      TrainConfig st = c;
      st.model_state = base.model_state;
      st.resident_blocks = base.resident_blocks;
      configs.push_back(st);
      if (g.dp >= 2) {  // each rank's slices streamed from its tier
        st.optimizer.sharding = parallel::Sharding::Weights;
        configs.push_back(st);
      }
    }
    for (const TrainConfig& cfg : configs) {
      // The configuration as the flags make it (the even split, the micro-batches given), listed
      // with its refusal when it has one; then, with a pipeline, the best other split and
      // micro-batch count the search finds, listed when it fits.
      Tried base = try_config(cfg, memory_per_rank, rates, least);
      if (!base.refusal.empty()) plan.refused.push_back({base.described, base.refusal});
      const double to_beat = base.option ? base.option->step_s : 0;
      if (base.option) plan.options.push_back(std::move(*base.option));
      if (std::optional<GridOption> v =
              search_pipeline(cfg, to_beat, memory_per_rank, rates, least))
        plan.options.push_back(std::move(*v));
    }
  }
  if (plan.options.empty()) {
    if (!least)
      user_error("no configuration of {} ranks suits these flags: {}", ranks, listed(plan.refused));
    const uint64_t kib = (least->first + 1023) / 1024;
    user_error(
        "no grid of {} ranks fits {} a rank: the smallest memory per rank that works is {} "
        "(--memory-per-rank {}), with {}",
        ranks, human_bytes(memory_per_rank), human_bytes(least->first), size_flag(kib * 1024),
        least->second);
  }
  // Fastest first; equal predictions in the tie rule's order, so that the table reads the same
  // whatever order the search found them in.
  std::sort(plan.options.begin(), plan.options.end(), [](const GridOption& a, const GridOption& b) {
    if (a.step_s != b.step_s) return a.step_s < b.step_s;
    return preferred_in_tie(a, b);
  });
  plan.recommended = recommended_of(plan.options);
  return plan;
}

size_t tied_with_fastest(const std::vector<GridOption>& options) {
  if (options.empty()) return 0;
  double fastest = options.front().step_s;
  for (const GridOption& o : options) fastest = std::min(fastest, o.step_s);
  const double limit = fastest * (1 + kPlanTieFraction);
  return static_cast<size_t>(std::count_if(options.begin(), options.end(),
                                           [&](const GridOption& o) { return o.step_s <= limit; }));
}

size_t recommended_of(const std::vector<GridOption>& options) {
  if (options.empty()) return 0;
  double fastest = options.front().step_s;
  for (const GridOption& o : options) fastest = std::min(fastest, o.step_s);
  const double limit = fastest * (1 + kPlanTieFraction);
  size_t best = options.size();
  for (size_t i = 0; i < options.size(); ++i)
    if (options[i].step_s <= limit &&
        (best == options.size() || preferred_in_tie(options[i], options[best])))
      best = i;
  return best;
}

size_t GridPlan::ties() const { return tied_with_fastest(options); }

bool simpler_than(const GridOption& a, const GridOption& b) {
  auto parts = [](const GridOption& o) {
    return std::make_tuple(
        o.cfg.model_state.has_value(), o.cfg.optimizer.sharding == parallel::Sharding::Weights,
        !o.cfg.memory_budget.empty(), o.cfg.grid.cp, o.cfg.grid.pp, o.cfg.grid.tp);
  };
  return parts(a) < parts(b);
}

bool preferred_in_tie(const GridOption& a, const GridOption& b) {
  // What the pipeline's search changed from the flags (a split of the layers, a micro-batch
  // count) first: none of it is taken without a predicted gain beyond the stated error.
  auto searched = [](const GridOption& o) {
    return std::make_tuple(!o.cfg.grid.stage_layers.empty(), o.cfg.micro_batches != 0);
  };
  if (searched(a) != searched(b)) return searched(a) < searched(b);
  if (a.breakdown.link_bytes != b.breakdown.link_bytes)
    return a.breakdown.link_bytes < b.breakdown.link_bytes;
  if (simpler_than(a, b)) return true;
  if (simpler_than(b, a)) return false;
  auto grid = [](const GridOption& o) {
    const parallel::GridShape& g = o.cfg.grid;
    return std::make_tuple(g.dp, g.tp, g.pp, g.cp, g.stage_layers, o.cfg.micro_batches);
  };
  return grid(a) < grid(b);
}

std::string grid_plan_report(const GridPlan& plan) {
  const TrainConfig& c = plan.best().cfg;
  const Rates& r = plan.rates;
  std::string out = fmt::format(
      "tandem plan: {} {} layers x d_model {} ({} heads{}), {} x {} tokens a step, on {} ranks "
      "with {} a rank\n",
      c.model.llama() ? "Llama" : "GPT", c.model.n_layers, c.model.d_model, c.model.n_heads,
      c.model.llama()
          ? fmt::format(", {} key/value heads, MLP {}", c.model.n_kv_heads(), c.model.mlp_width())
          : "",
      c.batch, c.model.seq_len, plan.ranks, human_bytes(plan.memory_per_rank));
  std::vector<std::string> gemms;
  // The rate the model charges (a core's when the ranks outnumber the cores).
  for (const auto& [tp, f] : r.gemm_flops_per_s)
    gemms.push_back(fmt::format("tp{} {:.1f}", tp, perf::charged_gemm_rate(r, tp) / 1e9));
  out += fmt::format("  compute: GFLOP/s {} ({})\n", fmt::join(gemms, ", "), r.compute_source);
  out += fmt::format("  link: {:.2f} GB/s, {:.1f} us a message ({})\n", r.link_bytes_per_s / 1e9,
                     r.link_latency_s * 1e6, r.link_source);
  out += fmt::format("  slow tier {}: write {:.2f} GB/s, read {:.2f} GB/s\n", c.slow_tier.str(),
                     r.swap_tier.write_bytes_per_s / 1e9, r.swap_tier.read_bytes_per_s / 1e9);
  if (r.state_tier.read_bytes_per_s > 0)
    out += fmt::format("  model-state tier: write {:.2f} GB/s, read {:.2f} GB/s\n",
                       r.state_tier.write_bytes_per_s / 1e9, r.state_tier.read_bytes_per_s / 1e9);
  out += fmt::format("  update: {} ({})\n",
                     r.update_params_per_s > 0
                         ? fmt::format("{:.0f} M parameters/s", r.update_params_per_s / 1e6)
                         : "0 s",
                     r.update_source.empty() ? "not measured" : r.update_source);
  out += fmt::format(
      "  other work: {} ({})\n",
      r.embedding_token_s > 0 || r.zero_floats_per_s > 0
          ? fmt::format("the embedding {:.3f} us a token, gradients zeroed at "
                        "{:.2f} GB/s",
                        r.embedding_token_s * 1e6, r.zero_floats_per_s * sizeof(float) / 1e9)
          : "0 s",
      r.other_source.empty() ? "not measured" : r.other_source);
  // Rows: '*' the recommendation, '=' tied with the fastest (within the model's stated error).
  const double tie_limit = plan.options.front().step_s * (1 + kPlanTieFraction);
  out +=
      fmt::format("\n  {:<22}{:<10}{:<14}{:<34}{:>12}{:>12}{:>10}{:>12}  {}\n", "grid", "sharding",
                  "model state", "activations", "memory/rank", "link/step", "step", "tokens/s",
                  "compute + exchange + io + bubble + cores + update + other (s)  [flags]");
  for (size_t i = 0; i < plan.options.size(); ++i) {
    const GridOption& o = plan.options[i];
    const std::string acts =
        o.cfg.memory_budget.empty()
            ? "in-core"
            : fmt::format("out-of-core in {}", human_bytes(parse_bytes(o.cfg.memory_budget)));
    const char mark = i == plan.recommended ? '*' : o.step_s <= tie_limit ? '=' : ' ';
    out += fmt::format(
        "{} {:<21} {:<10}{:<14}{:<34}{:>12}{:>12}{:>9.4f}s{:>12.0f}  {:.4f} + {:.4f} + {:.4f} + "
        "{:.4f} + {:.4f} + {:.4f} + {:.4f}  [{}]\n",
        mark, o.cfg.grid.str(), parallel::sharding_name(o.cfg.optimizer.sharding),
        o.cfg.model_state ? "streamed" : "memory", acts, human_bytes(o.memory_per_rank),
        human_bytes(static_cast<uint64_t>(o.breakdown.link_bytes)), o.step_s, o.tokens_per_s,
        o.breakdown.compute, o.breakdown.exposed_exchange, o.breakdown.exposed_io,
        o.breakdown.bubble, o.breakdown.cores, o.breakdown.update, o.breakdown.other,
        flags_of(o.cfg));
  }
  if (!plan.refused.empty()) {
    out += "\nleft out:\n";
    for (const Refusal& f : plan.refused) out += fmt::format("  {}: {}\n", f.what, f.why);
  }
  const GridOption& b = plan.best();
  out += fmt::format(
      "\nrecommended: {} ({}): predicted {:.4f} s a step, {:.0f} tokens/s; `tandem train --grid "
      "auto --ranks {} --memory-per-rank {}` takes it\n",
      flags_of(b.cfg), b.activations, b.step_s, b.tokens_per_s, plan.ranks,
      size_flag(plan.memory_per_rank));
  if (plan.ties() > 1)
    out += fmt::format(
        "  {} configurations (marked = and *) are predicted within {:g}% of the fastest, the "
        "model's stated error: a tie, broken by a fixed rule: the even split of the layers and "
        "the micro-batches as given first, then the fewest bytes over the link a step, then the "
        "simplest (model state in memory, weights whole, activations in core, fewer cp, pp, tp "
        "ranks), then the grid's dp, tp, pp, cp, smallest first\n",
        plan.ties(), kPlanTieFraction * 100);
  return out;
}

std::string grid_choice_line(const GridPlan& plan) {
  const GridOption& b = plan.best();
  const bool tie = plan.ties() > 1;
  const std::string tie_note =
      tie ? fmt::format(
                "; {} of them predicted within {:g}% of the fastest, the model's stated error: a "
                "tie, broken by the rule `tandem plan` prints (the even split and the "
                "micro-batches as given first, then the fewest bytes over the link)",
                plan.ties(), kPlanTieFraction * 100)
          : "";
  return fmt::format(
      "--grid auto: {} ({}), {} of {} configuration{} of {} ranks that fit {} a rank, predicted "
      "{:.4f} s a step{}",
      flags_of(b.cfg), b.activations, tie ? "chosen" : "the fastest", plan.options.size(),
      plan.options.size() == 1 ? "" : "s", plan.ranks, human_bytes(plan.memory_per_rank), b.step_s,
      tie_note);
}

// ---------------------------------------------- a run's configuration in the performance model's
// terms

perf::StepShape step_shape(const TrainConfig& cfg) {
  perf::StepShape s;
  s.model = cfg.model;
  s.grid = cfg.grid;
  s.batch = cfg.batch;
  s.micro_batches = cfg.micro_batch_count();
  s.shard_weights = cfg.optimizer.sharding == parallel::Sharding::Weights;
  s.overlap_exchange = cfg.optimizer.exchange == parallel::GradExchange::Overlap;
  // An undecided auto is counted as f32: the plan runs before the dtypes are decided.
  s.tp_dtype = cfg.tp_dtype.value_or(DType::F32);
  s.grad_dtype = cfg.grad_dtype.value_or(DType::F32);
  s.state_streamed = cfg.model_state.has_value();
  return s;
}

int local_ranks(const TrainConfig& cfg, int ranks) {
  return std::max(1, cfg.backend == comm::Backend::Thread ? ranks : comm::launched_local_ranks());
}

int rank_threads(const TrainConfig& cfg, int ranks) {
  if (cfg.blas_threads > 0) return cfg.blas_threads;
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, hw / local_ranks(cfg, ranks));
}

perf::RateRequest rate_request(const TrainConfig& base, int ranks, std::optional<double> link_gbps,
                               bool tiers) {
  check_plan_ranks(ranks);
  perf::RateRequest q;
  q.model = base.model;
  q.rank_rows = std::max<int64_t>(1, base.batch / ranks);
  q.ranks = ranks;
  q.local_ranks = local_ranks(base, ranks);
  q.threads = rank_threads(base, ranks);
  q.link_gbps = link_gbps;
  q.tiers = tiers;
  q.swap_tier = base.slow_tier;
  q.state_tier = base.model_state;
  return q;
}

Rates measure_rates(const TrainConfig& base, int ranks, std::optional<double> link_gbps,
                    bool tiers) {
  bool cached = false;
  Rates r = perf::cached_rates(rate_request(base, ranks, link_gbps, tiers), exec::jit_cache_dir(),
                               &cached);
  // The report says where they came from: a plan that reads them agrees with the one that
  // measured them.
  if (cached) r.compute_source += "; read from the cache (TANDEM_PERF_REMEASURE=1 measures anew)";
  return r;
}

}  // namespace tandem::train
