// The one step-time model: a configuration's step composed from what runs concurrently, at the
// measured rates (perf/rates.h). Per step:
//   compute    each unit's (half block's) matmul FLOPs over the GEMM rate at the shard's shapes
//              (charged_gemm_rate: with the host's ranks computing at once; a core's rate while
//              the host is busy when they outnumber its cores); backward twice the forward; the
//              LM head on the last stage, whole on every tp rank; each scaled by its UnitFactor;
//              the activation timeline (ooc/model.h's simulator, with these unit times:
//              recomputation and swap stalls included) per stage
//   tp         per block 2 all-reduces in the forward, 2 in the backward, of micro_rows x T/cp x C
//              elements each in --tp-dtype: latency + 2 (tp-1)/tp bytes / link
//   pipeline   1F1B: the slowest stage's M micro-batches stretched by (M + pp - 1) / M (the
//              bubble), and per micro-batch a hand-off of micro_rows x T/cp x C floats each way
//   cp         a rank computes seq_len / cp tokens of each row (the projections and the MLP on
//              them; its queries against the whole sequence, 1/cp of the causal scores, the
//              split being balanced); per block and micro-batch a key/value all-gather in the
//              forward, another and the gradients' reduce-scatter in the backward, (cp-1)/cp of
//              the sequence's keys and values each: latency + bytes / link, all exposed
//   dp         over the dp x cp replicas (R of them): the rank's gradients reduce-scattered (in
//              --grad-dtype) and its weights all-gathered, (R-1)/R of the bytes each over the
//              link; the blocks' exchange overlaps the last micro-batch's backward (only the
//              excess counts), the embeddings' and ln_f's does not
//   ZeRO-3     with --shard weights each block's weights all-gathered before its forward and its
//              backward, each micro-batch, overlapping the previous block's compute (only the
//              excess counts: the gathers run one at a time); the blocks' update gathers nothing
//   state I/O  with --model-state, the block store's traffic a step at the tier's rates; a stage
//              takes the longer of its compute and that I/O
//   cores      ranks that outnumber their host's cores (rates.h: host_ranks > host_slots) do
//              not all compute at once: a stage's bubble and a rank's exchanges leave its core to
//              the others. So the step above is the critical path at a core's rate, and the host's
//              cores must also run every one of its ranks' work (host_ranks times the stages'
//              mean), host_slots at once: the forward and backward (recomputation included) at a
//              core's rate, and the rest the cores do: every byte the rank moves over the link
//              (the in-process and shared-memory transports copy and sum with the CPU; not a
//              stated link's) and its update, at the cores' share of their seconds (rates.h), and
//              its other work (the collectives' waits sleep: not counted); the cores idle only
//              while a pipeline fills and drains (while its first micro-batch's forward reaches
//              stage k - 1, and its last backward leaves it, the cores beyond k stages' ranks
//              have nothing to run: a micro-batch's forward and backward each): the step takes
//              the longer of the two, the excess counted here (0 when each rank has cores of its
//              own)
//   update     the rank's parameters (its slice of them over dp x cp) at the measured update rate;
//              the blocks' part runs behind the backward with their exchange (what the two take
//              beyond the backward counts), the rest's after it
//   other      per rank, the step's work outside its units, exchanges and update (stage_other_s):
//              the embedding's forward and backward on the first stage, the gradients' zeroing;
//              the busiest stage's counts, after the rest
#pragma once

#include <string>
#include <vector>

#include "tandem/core/dtype.h"
#include "tandem/nn/activation_memory.h"
#include "tandem/nn/gpt.h"
#include "tandem/ooc/model.h"
#include "tandem/ooc/profile.h"
#include "tandem/parallel/grid.h"
#include "tandem/perf/rates.h"

namespace tandem::perf {

// The error the model states for a prediction: the bound each predicted step is checked against
// (bench/run_karma.sh; docs/benchmarks.md records where it holds). Two predictions closer than
// this are not ordered by the model: the plan across grids calls them a tie.
inline constexpr double kStatedError = 0.10;

// A configuration as the model reads it (train's TrainConfig, in the terms below it).
struct StepShape {
  nn::GPTConfig model;
  parallel::GridShape grid;
  int64_t batch = 1;              // sequences a step, all ranks
  int micro_batches = 1;          // per pipeline
  bool shard_weights = false;     // --shard weights (ZeRO-3)
  bool overlap_exchange = true;   // the dp exchange runs during the backward
  DType tp_dtype = DType::F32;    // the tensor-parallel exchanges' elements
  DType grad_dtype = DType::F32;  // the data-parallel reduction's
  bool state_streamed = false;    // --model-state: the blocks' state through the store

  int micro_rows() const { return static_cast<int>(batch / grid.dp / micro_batches); }
  // Tokens a rank computes a micro-batch: its rows' seq_len / cp tokens each.
  double rank_tokens() const { return static_cast<double>(micro_rows()) * model.seq_len / grid.cp; }
};

// A step's time by what it waits for, in seconds; total() is the step.
struct StepBreakdown {
  double compute = 0;           // the slowest stage's forward and backward, recomputation included
  double exposed_exchange = 0;  // tp all-reduces, pipeline hand-offs, ZeRO-3 gathers and the dp
                                // exchange, the parts not hidden behind compute
  double exposed_io = 0;        // swapped activations' stalls, model-state I/O beyond compute
  double bubble = 0;            // the pipeline's idle share
  double cores = 0;   // with more ranks than their host's cores: the host's work (every rank's
                      // compute at a core's rate, exchanges' copies, update and other work, over
                      // its cores) beyond the rest of the step
  double update = 0;  // the optimizer's update not hidden behind the backward
  double other = 0;   // the step's other work
  // Not a time: the bytes the busiest stage's rank sends over the link a step (every exchange,
  // hidden or not). Configurations predicted alike are told apart by it (the plan's ties).
  double link_bytes = 0;
  double total() const {
    return compute + exposed_exchange + exposed_io + bubble + cores + update + other;
  }
  // "compute 0.1200 + exchange 0.0100 + io 0.0000 + bubble 0.0300 + cores 0.0000 + update 0.0040 +
  // other 0.0000 = 0.1640 s"
  std::string str() const;
};

// One pipeline stage of a configuration: what it saves, its unit times, its exchanges.
struct StageTimes {
  nn::ChainLayout chain;
  ooc::Profile profile;         // the unit times the model predicts (communication included)
  double comm_per_micro_s = 0;  // of which communication, per micro-batch
  double backward_micro_s = 0;  // one micro-batch's backward, the data-parallel exchange's cover
  double dp_blocks_s = 0, dp_rest_s = 0;          // the data-parallel exchange: blocks', the rest's
  double update_blocks_s = 0, update_rest_s = 0;  // the update: blocks', the rest's
  double state_io_s = 0;  // the model state's I/O a step (with --model-state)
  double other_s = 0;     // the step's other work (stage_other_s)
  double link_bytes = 0;  // bytes the rank moves over the link a step (StepBreakdown's)
};

// Whether the host's ranks outnumber the ranks its cores run at once (rates.h's host_ranks over
// host_slots): then a rank computes at a core's rate and the step waits for the host's cores.
bool ranks_share_cores(const Rates& rates);

// The GEMM rate the model charges a rank's matmuls at, for tp degree `tp`: with the host's ranks
// computing at once (each on cores of its own), or, when they outnumber its cores, a core's rate
// while all are busy (no faster than a rank alone).
double charged_gemm_rate(const Rates& rates, int tp);

// Stage `s` of `shape` at `rates`.
StageTimes stage_times(const StepShape& shape, int s, const Rates& rates);

// The step's other work on a rank of stage `s`: what its units' forward and backward (the head
// is the last unit's), its exchanges and its update leave out and takes more than microseconds.
// That is the embedding's forward and backward over the rank's tokens a step (its rows' seq_len /
// cp tokens, every micro-batch: the first stage's ranks), and zeroing the rank's gradients before
// the step (ModelState::zero_gradients: the whole flat buffer, or with the blocks in a store or
// sharded the embeddings' and ln_f's alone, their sums starting elsewhere, but for sharded
// weights over several micro-batches, whose sums live in the flat buffer). Left out as
// microseconds: drawing the batch (copying its rows' tokens), checking its tokens, and the
// step's one-number collectives (the draw's and the stop's agreements, the loss's mean). 0 where
// the rates measured none.
double stage_other_s(const StepShape& shape, int s, const Rates& rates);

// The step from its stages and each one's activation timeline (ooc::predict or the planner's
// prediction on the stage's chain and profile): the slowest stage sets the pace, the pipeline
// stretches it by (M + pp - 1) / M, the exchange and the update add what the backward does not
// hide; with more ranks than their host's cores, at least the host's compute over its cores; then
// the busiest stage's other work (the ranks run it outside the pipeline's schedule: before the
// step, and the embedding's at its ends).
StepBreakdown compose(const StepShape& shape, const std::vector<StageTimes>& stages,
                      const std::vector<ooc::Prediction>& timelines, const Rates& rates);

// --shard weights: one block's weights all-gathered over the data-parallel group (latency +
// (dp-1)/dp of its bytes over the link), and one block's forward and backward (its halves'
// matmuls at the GEMM rate, times their UnitFactors), for one micro-batch. The ZeRO-3 term and
// --gather-ahead auto use it.
struct GatherTiming {
  double gather_s = 0, block_forward_s = 0, block_backward_s = 0;
};
GatherTiming gather_timing(const StepShape& shape, const Rates& rates);

// --cp: one attention's key/value exchange for one micro-batch, the bytes a rank moves over the
// link ((cp-1)/cp of the whole sequence's keys and values of its key/value heads, f32) and the
// time (latency + bytes / link). The forward takes one (the gather), the backward two (the gather
// again and the gradient's reduce-scatter). Zero without cp.
struct KvExchange {
  double bytes = 0, seconds = 0;
};
KvExchange kv_exchange(const StepShape& shape, const Rates& rates);

// --gather-ahead auto's rule: the smallest D >= 1 whose D blocks' compute (`block_s` each)
// covers one gather (`gather_s`), at most `blocks` - 1 (a stage's fewest blocks: D + 1 slots
// hold no more than them), and at least 1.
int gather_ahead_for(double gather_s, double block_s, int blocks);

}  // namespace tandem::perf
