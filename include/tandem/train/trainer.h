// The training loop of `tandem train`: a GPT-2 model trained on a byte corpus over a dp x tp x pp
// grid of ranks (threads of this process, or MPI processes), with AdamW or LAMB applied by the
// data-parallel optimizer program, periodic validation, checkpoints that resume exactly, JSON-line
// metrics, a Chrome trace and a progress display. Also the pieces `tandem eval` and
// `tandem sample` share with it: model configs as JSON and whole-model weights from a checkpoint.
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
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem/comm/communicator.h"
#include "tandem/nn/gpt.h"
#include "tandem/parallel/grid.h"
#include "tandem/train/checkpoint.h"
#include "tandem/train/optimizer.h"
#include "tandem/train/trace.h"

namespace tandem::train {

struct TrainConfig {
  nn::GPTConfig model;       // vocab_size 256 (bytes); max_positions = seq_len unless set larger
  int64_t batch = 16;        // rows of the global batch
  int64_t steps = 200;       // train until this many optimizer steps have been taken
  double lr = 3e-3;          // peak learning rate
  int64_t warmup = 20;       // linear warm-up steps, then cosine decay ...
  double min_lr_ratio = 0.1; // ... to lr * min_lr_ratio at the last step
  uint64_t seed = 1;         // initialisation, batches, dropout
  OptimizerConfig optimizer;
  parallel::GridShape grid;  // dp x tp x pp
  int micro_batches = 0;     // per data-parallel rank and step; 0: 1, or 2 * pp when pp > 1
  std::string backend = "thread";  // "thread": ranks are threads; "mpi": this process is one rank
  std::string executor = "compiled";  // how the DSL programs run: compiled, plan or reference
  // Autotune every program's schedule for this run's sizes now (slow the first time: every
  // candidate is compiled and timed; the choice is cached). Without it the cache's choice is
  // used where there is one, else the preference lists.
  bool tune = false;

  std::string data;                // a text file; empty: the built-in synthetic corpus
  size_t synthetic_bytes = 0;      // 0: the default size
  double validation_fraction = 0.1;
  int64_t eval_every = 50;         // validation loss every N steps and at the end (0: never)
  int64_t eval_batches = 4;        // global batches of the validation split per evaluation

  std::string save_dir;            // checkpoint here at the end (and every save_every steps)
  int64_t save_every = 0;
  std::string resume_dir;          // continue from this checkpoint

  std::string metrics_path;        // JSON lines, one per step
  std::string trace_path;          // Chrome trace
  int blas_threads = 0;            // 0: the hardware threads shared among in-process ranks
  std::ostream* out = nullptr;     // progress and summary (null: stdout); world rank 0 only
  bool progress = true;            // the progress display (else only the summary)
  bool keep_weights = false;       // return the final whole-model weights (tests)

  // Throws a UserError naming the flag at fault (sizes, grid against model and batch, ...).
  void validate() const;
  // The micro-batch count a step uses.
  int micro_batch_count() const;
};

struct TrainResult {
  int64_t first_step = 0;               // 0, or the step a resumed run started at
  int64_t end_step = 0;                 // steps taken when the run ended
  std::vector<double> losses;           // mean training loss of each step run
  std::vector<std::pair<int64_t, double>> val_losses;  // (step, validation loss)
  std::vector<float> weights;           // whole-model flat weights (keep_weights only)
  double seconds = 0.0;                 // wall time of the steps
  double tokens_per_s = 0.0;
  std::string optimizer_schedule, epilogue_schedule, pipeline_schedule, executor;
};

// Runs the whole training. Thread backend: starts grid.size() ranks in this process. MPI
// backend: this process is one rank of MPI_COMM_WORLD, whose size must be grid.size(); every
// process returns its result (losses are the same everywhere, weights only on rank 0).
TrainResult train(const TrainConfig& config);

// The checkpoint a run resumes from (config.resume_dir), read and checked against the config:
// null when there is none to resume. A corrupt or mismatched checkpoint is a UserError.
struct ResumeState;
std::shared_ptr<const ResumeState> prepare_resume(const TrainConfig& config);

// One rank of the training: every rank of `world` calls it together. `trace` may be shared by
// the ranks of one process (it is thread-safe) or null; `resume` may be shared likewise (null:
// prepared here when config.resume_dir is set).
TrainResult train_rank(comm::Communicator& world, const TrainConfig& config, TraceRecorder* trace,
                       std::shared_ptr<const ResumeState> resume = nullptr);

// ---------------------------------------------------------------------------------------------
// Shared with eval and sample.

// The learning rate of step `step` (0-based) under the warm-up + cosine schedule.
double learning_rate(const TrainConfig& config, int64_t step);

nlohmann::json model_config_to_json(const nn::GPTConfig& c);
// UserError naming `source` and the field when a field is missing or ill-typed.
nn::GPTConfig model_config_from_json(const nlohmann::json& j, const std::string& source);
// The model keys a checkpoint must match to be resumed.
std::vector<std::string> model_compat_keys();

// The model a checkpoint holds, its weights checked tensor by tensor against its own config
// ("tensor 'h.0.ln_1.weight' is missing", "... has shape [64]; the model needs [128]").
struct LoadedModel {
  nn::GPTConfig config;
  nn::ParameterSet params;
  RunMeta meta;
};
LoadedModel load_model(const std::string& checkpoint_dir);

// The mean loss of `params` over every full window of seq_len tokens of `tokens` (consecutive,
// non-overlapping), at most `max_windows` of them (0: all), `batch` windows at a time. Returns
// (mean loss, tokens scored).
std::pair<double, int64_t> evaluate_windows(const nn::ParameterSet& params,
                                            const std::vector<uint8_t>& tokens, int seq_len,
                                            int batch, int64_t max_windows);

}  // namespace tandem::train
