// The memory a training run will need on this machine, estimated from its config before anything
// is allocated, and the memory the machine has for it; a run that cannot fit is refused with both
// and what to change, instead of being killed by the kernel without a word.
//
// Per rank (its shard of the model at its grid coordinates):
//   parameters        the rank's flat weights (f32)
//   gradients         as many
//   optimizer state   Adam's or LAMB's two moments, sliced over the dp x cp replicas (the
//                     default schedules keep them sliced; a schedule that keeps them whole needs
//                     dp times this); nothing with --optimizer-state file:DIR (its moments
//                     live in the file)
//   exchange buffers  the optimizer programs' own buffers (the data-parallel exchange's): segments
//                     of one size share their programs, so per distinct segment size its 1/dp
//                     reduce-scatter result with the compiled executor, two whole segments more
//                     with the plan runner or the reference interpreter (as measured); with
//                     --clip-grad-norm also the rank's 1/dp of the reduced gradient
//   activations       what a step saves for its backward plus the workspace: the out-of-core
//                     planner's in-core need (ooc::MemorySchedule with every unit kept), or, with
//                     --memory-budget, the budget (the fast tier holds no more) less the
//                     model-state slots, which the budget holds too; with --cp, of seq_len / cp
//                     tokens a row, and context-parallel attention's key/value buffers
//                     (parallel::ContextParallelAttention::buffer_bytes)
//   with --model-state: parameters, gradients and optimizer state count the embeddings and ln_f
//   only (the blocks live in the tier), and the model-state slots the store's staging (four
//   blocks' weights, two blocks' gradients or three with several micro-batches, two blocks'
//   moment pieces); the tier itself (every block's weights and moment piece, and gradients with
//   several micro-batches) counts as memory in the host tier, and as disk in a file tier
//   with --shard weights (and the blocks in memory): parameters, gradients and optimizer state
//   count the embeddings and ln_f only, and the sharded blocks what the sharded model state
//   keeps of the blocks (parallel::ShardedBlocks::state_bytes: every block's 1/dp slices of
//   weights and moments, the gathered blocks' weights, the blocks' gradients)
//   checkpoint buffers with --save or --resume: one whole tensor (the largest) and one optimizer
//                     segment's two moments, through which checkpoints pass tensor by tensor
// On this machine: every rank with --backend thread (they share the process); with --backend mpi,
// this process's ranks on the node (comm::launched_local_ranks()) times
// the largest rank's need. No rank ever holds a whole-model copy.
// Not counted: the data, BLAS's buffers, the other DSL programs' small buffers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "tandem/core/available_memory.h"
#include "tandem/train/train_config.h"

namespace tandem::train {

struct MemoryEstimate {
  int ranks = 1;  // on this machine
  // checkpoint: the buffers a checkpoint moves the state through (one tensor, one optimizer
  // segment), with --save or --resume.
  uint64_t parameters = 0, gradients = 0, optimizer = 0, exchange = 0, activations = 0,
           model_state_slots = 0, sharded_blocks = 0, checkpoint = 0;
  // The model state's tier (--model-state): in host memory (counted), or on disk (not).
  uint64_t model_state_host = 0, model_state_disk = 0;
  bool activations_budgeted = false;  // activations is --memory-budget's, per rank
  uint64_t activations_in_core = 0;   // what they would need in-core, on this machine

  uint64_t total() const {
    return parameters + gradients + optimizer + exchange + activations + model_state_slots +
           sharded_blocks + model_state_host + checkpoint;
  }
  // "2.4 GiB on this machine (4 ranks: parameters 120.0 MiB, gradients ..., ...)".
  std::string str() const;
};

MemoryEstimate estimate_memory(const TrainConfig& cfg);

// One rank's memory, the rank at tensor-parallel rank `tp_rank` of pipeline stage `stage` (its
// data-parallel peers need the same), for a limit per rank: `fixed` is everything but the
// activations (the model-state tier too when it is host memory), `activations` what they need
// in-core, `budget_holds` what a --memory-budget holds beside them (the model-state slots, and
// with --model-state the embeddings' and ln_f's state), so that under a budget of B bytes the
// activations get B - budget_holds.
struct RankMemory {
  uint64_t fixed = 0, activations = 0, budget_holds = 0;
  uint64_t in_core() const { return fixed + activations; }
  uint64_t with_budget(uint64_t budget) const {
    return fixed + (budget > budget_holds ? budget - budget_holds : 0);
  }
};
RankMemory rank_memory(const TrainConfig& cfg, int tp_rank, int stage);

// The BLAS thread count of a process of the run: --threads, else the cores shared by the ranks
// the process runs.
int blas_threads_for(const TrainConfig& cfg);

// Refuses a run whose estimate is more than the available memory: one UserError with the
// estimate, the memory available and where that figure comes from, and what to change.
void check_memory(const TrainConfig& cfg);

// The same refusal for `tandem eval`: the model's weights and the activations of a forward over
// `rows` windows of `seq_len` tokens, against the memory available.
void check_eval_memory(const nn::GPTConfig& model, int rows, int seq_len);

// The start-up line: "  memory estimate: 2.4 GiB on this machine (...); 21.9 GiB available (...)".
std::string memory_line(const TrainConfig& cfg);

// `tandem plan`: the most layers of this model's shape (everything else as configured) whose
// estimate fits the memory available and, with --model-state file:DIR, whose tier fits the free
// space of DIR's filesystem, and which of the two bounds it. "" when the memory available is
// unknown or not even one layer a stage fits.
std::string largest_model_line(const TrainConfig& cfg);

}  // namespace tandem::train
