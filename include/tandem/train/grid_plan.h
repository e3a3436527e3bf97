// The plan across grids (`tandem plan --ranks N --memory-per-rank M`, `tandem train --grid auto`):
// every grid dp x tp x pp of N ranks that the model allows, with each sharding (--shard moments,
// and weights when dp >= 2), the blocks' state in memory or streamed (when --model-state names a
// tier), and the activations in-core or out-of-core within what the limit leaves; for each
// configuration that fits M bytes a rank (memory_estimate.h's rank_memory), the step the
// performance model predicts from measured compute, link and tier rates; the fastest first.
//
// The performance model, per step (docs/training.md, "Choosing a grid", says where it is off):
//   compute    each unit's (half block's) matmul FLOPs over the measured GEMM rate at the shard's
//              shapes; backward twice the forward; the LM head on the last stage, whole on every
//              tp rank; each scaled by its UnitFactor (one block and the head run for real at
//              tp 1); the GEMM rate shared when the machine's ranks ask for more threads than it
//              has cores; the out-of-core planner's prediction with these unit times (its
//              recomputation and swap stalls included)
//   tp         per block 2 all-reduces in the forward, 2 in the backward, of micro_rows x T x C
//              floats each: latency + 2 (tp-1)/tp bytes / link
//   pipeline   1F1B: the slowest stage's M micro-batches stretched by (M + pp - 1) / M (the
//              bubble), and per micro-batch a hand-off of micro_rows x T x C floats each way
//   dp         the rank's gradients reduce-scattered and its weights all-gathered, (dp-1)/dp of
//              the bytes each over the link; the blocks' exchange overlaps the last micro-batch's
//              backward (only the excess counts), the embeddings' and ln_f's does not
//   ZeRO-3     with --shard weights each block's weights all-gathered before its forward and its
//              backward, each micro-batch, overlapping the previous block's compute (only the
//              excess counts: the gathers run one at a time, so starting them further ahead
//              does not hide more of them in a step's steady state); the blocks' update
//              all-gathers nothing; memory for --gather-ahead D + 1 gathered blocks
//   state I/O  with --model-state, the block store's traffic a step (BlockStore's formula) at the
//              tier's measured rates; a stage takes the longer of its compute and that I/O
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/ooc/slow_tier.h"
#include "tandem/train/train_config.h"

namespace tandem::train {

// A unit's measured time over what its matmuls take at the GEMM rate: what the rest of its
// operations (softmax, LayerNorm, GELU, the loss, copies) and the matmuls' smaller shapes add.
struct UnitFactor {
  double forward = 1, backward = 1;
};

// What the performance model works from.
struct Rates {
  std::map<int, double> gemm_flops_per_s;   // per tensor-parallel degree (the shards' width)
  UnitFactor attention, mlp, head;          // per half block and for ln_f + the LM head + loss
  double link_bytes_per_s = 0;              // a ring collective's bus bandwidth; a send's rate
  double link_latency_s = 0;                // per collective or hand-off
  ooc::TierBandwidth swap_tier;             // --slow-tier's: swapped activations
  ooc::TierBandwidth state_tier;            // --model-state's, when it names one
  std::string compute_source, link_source;  // how each was found, for the report
};

// The most ranks the plan across grids takes (--ranks): enough for any run tandem makes, and few
// enough that the plan answers in well under a second (4096 = 2^12 has 91 grids; the rank
// counts below it with the most divisors have a few hundred).
inline constexpr int kMaxPlanRanks = 4096;

// A UserError for --ranks outside [1, kMaxPlanRanks], naming the limit.
void check_plan_ranks(int64_t ranks);

// Measures the rates on this machine in a few seconds: a GEMM of each tp degree's MLP shape at
// the BLAS threads a rank of `ranks` will have (times cores / (ranks here x threads) when that
// is below 1), one block's halves and the head forward and backward at tp 1 for the UnitFactors,
// an in-process all-reduce over min(ranks, 8) threads (unless `link_gbps` states the link: a
// multi-host run's), and (with `tiers`) the tiers' bandwidth.
Rates measure_rates(const TrainConfig& base, int ranks, std::optional<double> link_gbps,
                    bool tiers = true);

// --shard weights: one block's weights all-gathered over the data-parallel group (latency +
// (dp-1)/dp of its bytes over the link), and one block's forward and backward (its halves'
// matmuls at the GEMM rate, times their UnitFactors), as the performance model predicts them at
// `rates` for one micro-batch of `cfg`. The plan's ZeRO-3 term and --gather-ahead auto use it.
struct GatherTiming {
  double gather_s = 0, block_forward_s = 0, block_backward_s = 0;
};
GatherTiming gather_timing(const TrainConfig& cfg, const Rates& rates);
// --gather-ahead auto's rule: the smallest D >= 1 whose D blocks' compute (`block_s` each)
// covers one gather (`gather_s`), at most `blocks` - 1 (a stage's fewest blocks: D + 1 slots
// hold no more than them), and at least 1.
int gather_ahead_for(double gather_s, double block_s, int blocks);
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
  TrainConfig cfg;               // the run: grid, sharding, model state, --memory-budget
  uint64_t memory_per_rank = 0;  // the estimate of the rank that needs the most
  std::string activations;       // "in-core", or the out-of-core plan and its budget
  double compute_s = 0;          // the slowest stage's matmuls (recomputation included)
  double comm_s = 0;             // its tp all-reduces, hand-offs and exposed ZeRO-3 gathers
  double stall_s = 0;            // its waits for swapped activations
  double io_s = 0;               // the model state's I/O beyond the stage's compute
  double bubble_s = 0;           // the pipeline's idle share
  double dp_s = 0;               // the data-parallel exchange not hidden by the backward
  double step_s = 0;
  double tokens_per_s = 0;
  std::string describe() const;  // "dp=2 tp=1 pp=2, --shard weights, blocks in memory, in-core"
};

// A grid or configuration left out, and why.
struct Refusal {
  std::string what;
  std::string why;
};

// The grids dp x tp x pp with dp tp pp = ranks (dp fastest-varying last), those the model and the
// batch allow and those they refuse, with TrainConfig::validate's reason.
struct GridCandidates {
  std::vector<parallel::GridShape> allowed;
  std::vector<Refusal> refused;
};
GridCandidates candidate_grids(const TrainConfig& base, int ranks);

// Predictions this close to the fastest (a fraction of its step) are ties: the rates behind them
// are measured anew each run and move by about this much, so the order among them would too.
inline constexpr double kPlanTieFraction = 0.03;

struct GridPlan {
  int ranks = 0;
  uint64_t memory_per_rank = 0;
  Rates rates;
  std::vector<GridOption> options;  // every configuration that fits, fastest first
  std::vector<Refusal> refused;     // grids the model refuses, configurations that do not fit
  // The recommendation: of the options tied with the fastest (within kPlanTieFraction of its
  // step), the simplest (simpler_than), so that runs whose measurements differ a little still
  // recommend the same one; ties() counts them, the recommendation included.
  size_t recommended = 0;
  const GridOption& best() const { return options.at(recommended); }
  size_t ties() const;
};

// Whether `a` has fewer moving parts than `b`: its model state in memory rather than streamed,
// its weights whole rather than sharded, its activations in core, then fewer pipeline stages,
// then fewer tensor-parallel ranks. Equal configurations are neither.
bool simpler_than(const GridOption& a, const GridOption& b);

// Every configuration of `ranks` ranks on `base`'s model, batch and flags that fits
// `memory_per_rank`, predicted at `rates`. When none fits: one UserError naming the smallest
// memory per rank that works and the configuration that needs it.
GridPlan plan_grids(const TrainConfig& base, int ranks, uint64_t memory_per_rank,
                    const Rates& rates);

// `tandem plan`'s table: the rates, every configuration fastest first, the refusals, the
// recommendation.
std::string grid_plan_report(const GridPlan& plan);
// The start-up line of `tandem train --grid auto`: the choice and why.
std::string grid_choice_line(const GridPlan& plan);

}  // namespace tandem::train
