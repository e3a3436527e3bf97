// The plan across grids (`tandem plan --ranks N --memory-per-rank M`, `tandem train --grid auto`):
// every grid dp x tp x pp x cp of N ranks that the model allows (cp > 1 where the sequence cuts
// into 2 cp chunks and neither dropout nor the unfused attention is set), with each sharding
// (--shard moments, and weights when dp >= 2), the blocks' state in memory or streamed (when
// --model-state names a tier), and the activations in-core or out-of-core (not with cp) within
// what the limit leaves; with a pipeline also the best of a bounded search over the split of the
// layers between its stages (--stage-layers) and the micro-batch count (--micro-batches, unless
// given); for each configuration that fits M bytes a rank (memory_estimate.h's rank_memory), the
// step the performance model predicts from measured compute, link and tier rates; the fastest
// first, ties within the model's stated error broken by a fixed rule.
//
// The performance model is perf/'s (perf/step_model.h says what it counts and docs/training.md,
// "Choosing a grid", where it is off); this file searches the configurations and reports them.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/ooc/slow_tier.h"
#include "tandem/perf/rates.h"
#include "tandem/perf/step_model.h"
#include "tandem/train/train_config.h"

namespace tandem::train {

// The performance model's terms, as the plan and the trainer name them.
using UnitFactor = perf::UnitFactor;
using Rates = perf::Rates;
using GatherTiming = perf::GatherTiming;
using perf::gather_ahead_for;

// The most ranks the plan across grids takes (--ranks): enough for any run tandem makes, and few
// enough that the plan answers in well under a second (4096 = 2^12 has 91 grids; the rank
// counts below it with the most divisors have a few hundred).
inline constexpr int kMaxPlanRanks = 4096;

// A UserError for --ranks outside [1, kMaxPlanRanks], naming the limit.
void check_plan_ranks(int64_t ranks);

// A configuration in the performance model's terms.
perf::StepShape step_shape(const TrainConfig& cfg);
// Ranks of a run of `ranks` computing at once on this machine (every one with the thread
// backend, else the launcher's on this host), and the BLAS threads each has: --threads, else the
// hardware threads shared by them.
int local_ranks(const TrainConfig& cfg, int ranks);
int rank_threads(const TrainConfig& cfg, int ranks);
// What the rates of a run of `ranks` depend on (perf::RateRequest): the model, a rank's rows,
// the ranks here and their threads, the link (`link_gbps`: stated, a multi-host run's), and with
// `tiers` --slow-tier's and --model-state's tiers.
perf::RateRequest rate_request(const TrainConfig& base, int ranks, std::optional<double> link_gbps,
                               bool tiers = true);
// The rates of that request: cached per machine under the JIT cache folder (perf::cached_rates),
// measured in a few seconds when not there, so that plans on the same shape agree.
Rates measure_rates(const TrainConfig& base, int ranks, std::optional<double> link_gbps,
                    bool tiers = true);

// The step of `cfg` as it is configured, at `rates`: each stage's activation timeline in-core, or
// under --memory-budget the planner's plan of what the budget leaves the stage (a UserError when
// none fits).
perf::StepBreakdown predict_step(const TrainConfig& cfg, const Rates& rates);

// perf::gather_timing for one micro-batch of `cfg`.
GatherTiming gather_timing(const TrainConfig& cfg, const Rates& rates);
// Under --shard weights, an undecided --gather-ahead auto decided by that rule from `rates`, its
// reason saying why ("--gather-ahead auto: a gather 3.10 ms, a block's forward 1.80 ms").
// Otherwise nothing.
void choose_gather_ahead(TrainConfig& cfg, const Rates& rates);

// The configuration the user gave turned into the one the ranks start with: the one step that
// decides every auto (Auto<T>, auto.h) with its reason, but --resident-blocks auto, which needs
// the first step's profile of the rank's own model (rank_run.h's choose_resident_blocks). In
// order: --grid auto: the plan across grids of grid_auto's ranks chooses the grid, the sharding,
// where the model state lives, the budget, the resident blocks and the prefetch distance, and
// grid_choice says why; the config validated; --gather-ahead auto (choose_gather_ahead, the rates
// measured); the process's BLAS threads set to a rank's (--threads, else the cores shared by the
// process's ranks: the tuning records' keys count them); --tp-dtype auto and --grad-dtype auto
// from the autotuner's records (tuned now with --tune) on the groups those programs run on
// (schedule_choice.h's decide_dtypes: the ranks' Grid built on `world`, or with the thread
// backend on in-process ranks). Under MPI (`world` given) the settings these collectives depend
// on are compared first (ranks that differ stop, naming them); rank 0 plans and measures and
// every process takes its decision (comm::decide_on_root); the dtypes are agreed through
// comm::all_true.
TrainConfig resolve(const TrainConfig& asked, comm::Communicator* world);

// --grid auto and `tandem plan --ranks`: the memory a rank may use, --memory-per-rank's, else the
// memory available here shared by the ranks on this machine (a UserError when unknown).
uint64_t plan_memory_per_rank(const TrainConfig::GridAuto& request, comm::Backend backend);

// A configuration that fits, and its prediction. Times in seconds a step.
struct GridOption {
  // The run: grid (with the stages' layers), micro-batches, sharding, model state,
  // --memory-budget.
  TrainConfig cfg;
  uint64_t memory_per_rank = 0;   // the estimate of the rank that needs the most
  std::string activations;        // "in-core", or the out-of-core plan and its budget
  perf::StepBreakdown breakdown;  // the step by what it waits for
  double step_s = 0;              // breakdown.total()
  double tokens_per_s = 0;
  std::string describe() const;  // "dp=2 tp=1 pp=2, --shard weights, blocks in memory, in-core"
};

// A grid or configuration left out, and why.
struct Refusal {
  std::string what;
  std::string why;
};

// The grids dp x tp x pp x cp with dp tp pp cp = ranks (by cp, then dp, then tp), those the model
// and the batch allow and those they refuse, with TrainConfig::validate's reason; a cp the model
// or the flags rule out for every grid (the sequence's split, dropout, the unfused attention) is
// one refusal, "grids with cp=N".
struct GridCandidates {
  std::vector<parallel::GridShape> allowed;
  std::vector<Refusal> refused;
};
GridCandidates candidate_grids(const TrainConfig& base, int ranks);

// Predictions this close to the fastest (a fraction of its step) are ties: the model's stated
// error (perf::kStatedError), within which it cannot order two configurations.
inline constexpr double kPlanTieFraction = perf::kStatedError;

struct GridPlan {
  int ranks = 0;
  uint64_t memory_per_rank = 0;
  Rates rates;
  std::vector<GridOption> options;  // every configuration that fits, fastest first
  std::vector<Refusal> refused;     // grids the model refuses, configurations that do not fit
  // The recommendation: of the options tied with the fastest (within kPlanTieFraction of its
  // step), the first by preferred_in_tie, a rule that reads no measured rate, so that runs whose
  // measurements differ a little still recommend the same one; ties() counts them, the
  // recommendation included.
  size_t recommended = 0;
  const GridOption& best() const { return options.at(recommended); }
  size_t ties() const;
};

// Whether `a` has fewer moving parts than `b`: its model state in memory rather than streamed,
// its weights whole rather than sharded, its activations in core, then fewer context-parallel
// ranks, fewer pipeline stages, fewer tensor-parallel ranks. Equal configurations are neither.
bool simpler_than(const GridOption& a, const GridOption& b);

// The tie rule, a strict total order on distinct configurations: the even split of the layers
// and the micro-batches as the flags give them before what the pipeline's search changed (a split
// first), so that nothing the flags did not ask for is taken without a predicted gain; then fewer
// bytes over the link a step (breakdown.link_bytes: from the shapes alone, so the same every
// run), then simpler_than, then the grid's (dp, tp, pp, cp, split, micro-batches) in
// lexicographic order.
bool preferred_in_tie(const GridOption& a, const GridOption& b);
// Of `options` (in any order), how many are within kPlanTieFraction of the fastest, and the index
// of the one preferred_in_tie puts first among them (0 when empty).
size_t tied_with_fastest(const std::vector<GridOption>& options);
size_t recommended_of(const std::vector<GridOption>& options);

// Every configuration of `ranks` ranks on `base`'s model, batch and flags that fits
// `memory_per_rank`, predicted at `rates`; of a pipeline's other splits and micro-batch counts,
// the one predicted fastest, when faster than the flags' own. When none fits: one UserError naming
// the smallest memory per rank that works and the configuration that needs it.
GridPlan plan_grids(const TrainConfig& base, int ranks, uint64_t memory_per_rank,
                    const Rates& rates);

// `tandem plan`'s table: the rates, every configuration fastest first, the refusals, the
// recommendation.
std::string grid_plan_report(const GridPlan& plan);
// The start-up line of `tandem train --grid auto`: the choice and why.
std::string grid_choice_line(const GridPlan& plan);

}  // namespace tandem::train
