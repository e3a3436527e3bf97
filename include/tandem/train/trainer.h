// The training loop of `tandem train`: a GPT-2 or Llama model trained on a corpus over a dp x tp x
// pp grid of ranks (threads of this process, or MPI processes), with AdamW or LAMB applied by the
// data-parallel optimizer program, periodic validation, checkpoints that resume exactly, JSON-line
// metrics, a Chrome trace and a progress display. Including this header also brings the run's
// config and its learning-rate schedule (train_config.h) and the pieces `tandem eval` and `tandem
// sample` share with it: model configs as JSON (model_config.h) and a checkpoint's whole model and
// its loss over a text (evaluate.h).
//
// A step: every data-parallel rank draws its rows of the global batch from the counter-based
// sampler (rows [d B/dp, (d+1) B/dp) of step s), splits them into micro-batches, runs them
// forward and backward in 1F1B order (parallel::ParallelGPT), sums the tied embedding's two
// copies' gradients across the pipeline, and runs the optimizer program on its data-parallel
// group. The reported loss is the mean over the global batch's tokens.
//
// Exact resumption: a step depends only on the weights, the optimizer state, the step number
// (the sampler and dropout are counter-based, keyed by (seed, step)) and the learning-rate
// schedule (a function of the step), all of which a checkpoint holds; a run resumed from step k
// computes bitwise the losses and weights of the run that did not stop.
//
// Failure: the outputs (--save, --metrics, --trace) are checked before the first step; a loss
// that is not finite, or a model that is not finite when a checkpoint falls due, stops the run on
// every rank together (comm::CollectiveError) without saving, so the newest checkpoint in the
// --save folder (checkpoint_series.h) is the last good one. A metrics line that cannot be written
// (a full disk) stops the run on every rank together after the step's checkpoint is saved. Every
// wait for other ranks is bounded by the collective timeout (config.comm_timeout_s). The --save
// folder is locked for the run (a second run writing it is refused); --steps 0 saves the initial
// model.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/io/trace.h"
#include "tandem/train/evaluate.h"
#include "tandem/train/model_config.h"
#include "tandem/train/train_config.h"

namespace tandem::train {

struct TrainResult {
  int64_t first_step = 0;                              // 0, or the step a resumed run started at
  int64_t end_step = 0;                                // steps taken when the run ended
  std::vector<double> losses;                          // mean training loss of each step run
  std::vector<std::pair<int64_t, double>> val_losses;  // (step, validation loss)
  std::vector<double> grad_norms;  // --clip-grad-norm: each step's gradient norm, before clipping
  std::vector<float> weights;      // whole-model flat weights (keep_weights only)
  double seconds = 0.0;            // wall time of the steps
  double tokens_per_s = 0.0;
  std::string optimizer_schedule, epilogue_schedule, pipeline_schedule, executor;
  size_t optimizer_chunk_bytes = 0;  // the optimizer's collectives' chunk size (0: the process's)
  DType grad_dtype = DType::F32;     // the gradients' in the optimizer program (--grad-dtype auto)
  DType tp_dtype = DType::F32;       // what the tensor-parallel exchanges carried (--tp-dtype auto)
  // Out-of-core runs (world rank 0's stage): the plan, the arena's high-water mark over the
  // steps, and the forward+backward time the model predicted and the median measured.
  std::string ooc_plan;
  uint64_t ooc_high_water = 0, ooc_predicted_peak = 0;
  double ooc_predicted_s = 0, ooc_measured_s = 0;
  bool ooc_profile_cached = false;  // the planner's profile came from the on-disk cache
  // --model-state (world rank 0's stage): the blocks kept resident, the bytes the store moved
  // over the steps, and what it predicts a step moves.
  int resident_blocks = 0;
  uint64_t state_read_bytes = 0, state_written_bytes = 0;
  uint64_t state_predicted_read = 0, state_predicted_written = 0;
  // ... and the model state it holds in memory, inside --memory-budget: the slots, resident
  // blocks, the embeddings and ln_f (weights, gradients, moments). --shard weights: the same for
  // world rank 0's slices and slots (the flat gradients of several micro-batches not counted).
  uint64_t state_memory_bytes = 0;
  // SIGTERM or SIGINT when the run stopped on one after end_step (with a checkpoint under
  // --save); 0 when it ran to --steps.
  int stopped_by_signal = 0;
  // The run stopped after end_step because config.on_step asked it to (with a checkpoint under
  // --save).
  bool stopped_by_caller = false;
};

// Runs the whole training. Thread backend: starts grid.size() ranks in this process. MPI
// backend: this process is one rank of MPI_COMM_WORLD, whose size must be grid.size(); every
// process returns its result (losses are the same everywhere, weights only on rank 0).
TrainResult train(const TrainConfig& config);

// The checkpoint a run resumes from (config.resume_dir), read and checked against the config:
// null when there is none to resume. A corrupt or mismatched checkpoint is a UserError.
// (Defined with the rest of the run's checkpoint handling, in src/train/run_checkpoint.cc.)
struct ResumeState;
std::shared_ptr<const ResumeState> prepare_resume(const TrainConfig& config);

// One rank of the training: every rank of `world` calls it together. `trace` may be shared by
// the ranks of one process (it is thread-safe) or null; `resume` may be shared likewise (null:
// prepared here when config.resume_dir is set).
TrainResult train_rank(comm::Communicator& world, const TrainConfig& config,
                       io::TraceRecorder* trace,
                       std::shared_ptr<const ResumeState> resume = nullptr);

}  // namespace tandem::train
