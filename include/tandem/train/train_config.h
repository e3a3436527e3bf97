// What a `tandem train` run is asked to do (model, batch, schedule of the learning rate, optimizer,
// grid, data, checkpoints, outputs), and the checks that refuse a config before any rank starts.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <optional>
#include <string>

#include "tandem/comm/backend.h"
#include "tandem/exec/runner.h"
#include "tandem/io/metrics.h"
#include "tandem/nn/gpt.h"
#include "tandem/ooc/slow_tier.h"
#include "tandem/parallel/grid.h"
#include "tandem/parallel/optimizer.h"
#include "tandem/train/auto.h"

namespace tandem::train {

struct TrainConfig {
  nn::GPTConfig model;  // vocab_size: the data's (256, or data_vocab_size(data)); max_positions =
                        // seq_len unless set larger
  int64_t batch = 16;   // rows of the global batch
  int64_t steps = 300;  // train until this many optimizer steps have been taken
  double lr = 3e-3;     // peak learning rate
  int64_t warmup = 30;  // linear warm-up steps, then cosine decay ...
  double min_lr_ratio = 0.1;  // ... to lr * min_lr_ratio at the last step
  uint64_t seed = 1;          // initialisation, batches, dropout
  // The optimizer's settings but the gradients' dtype, which is grad_dtype (optimizer.grad_dtype
  // stays f32: the rank's set-up gives the optimizer the resolved one).
  parallel::OptimizerConfig optimizer;
  // --grad-dtype: the gradients' dtype in the optimizer program, f32 or bf16. auto: the
  // autotuner's records of the program with f32 and with bf16 gradients decide, when the run is
  // resolved (grid_plan.h's resolve); f32 without both records.
  Auto<DType> grad_dtype = DType::F32;
  // --tp-dtype: what the tensor-parallel exchanges carry with --tp 2 or more (the Megatron
  // epilogue's operands, product and all-reduce, the backward's input-gradient sum:
  // parallel::ProgramOptions::tp_dtype): f32, or bf16 with bf16 matmuls. auto: the autotuner's
  // records of those two programs with each decide, when the run is resolved; f32 without all
  // four records, and in fp32; left undecided with one tensor-parallel rank (nothing carries it).
  Auto<DType> tp_dtype = DType::F32;
  parallel::GridShape grid;  // dp x tp x pp x cp: given, or the plan's under grid_auto (cp 1)
  // `tandem train --grid auto`: the plan across grids of `ranks` ranks (grid_plan.h) chooses the
  // grid, the sharding, where the model state lives, the budget and the prefetch distance when
  // the run is resolved (grid_plan.h's resolve), and says why in grid_choice.
  struct GridAuto {
    int ranks = 0;
    std::optional<uint64_t> memory_per_rank;  // unset: the memory available here over the ranks
    std::optional<double> link_gbps;          // unset: measured in-process
  };
  std::optional<GridAuto> grid_auto;
  int micro_batches = 0;  // per data-parallel rank and step; 0: 1, or 2 * pp when pp > 1
  comm::Backend backend = comm::Backend::Thread;  // ranks are threads, or this process is one rank
  exec::RunnerKind executor = exec::RunnerKind::Compiled;  // how the DSL programs run
  // Autotune every program's schedule for this run's sizes now (slow the first time: every
  // candidate is compiled and timed; the choice is cached). Without it the cache's choice is
  // used where there is one, else the preference lists.
  bool tune = false;

  std::string data;            // a text file, a folder of token shards; empty: the synthetic corpus
  size_t synthetic_bytes = 0;  // 0: the default size
  double validation_fraction = 0.1;
  int64_t eval_every = 50;   // validation loss every N steps and at the end (0: never)
  int64_t eval_batches = 4;  // global batches of the validation split per evaluation

  // Checkpoints go to save_dir/step-<N>/ at the end (and every save_every steps), the newest
  // keep_checkpoints of them kept, save_dir/latest naming the newest (checkpoint_series.h).
  std::string save_dir;
  int64_t save_every = 0;
  int keep_checkpoints = 2;
  std::string resume_dir;  // continue from this checkpoint, or a series' latest
  // Start from the weights of this Hugging Face folder (train/hf_folder.h): step 0, a fresh
  // optimizer; the model must be the folder's config.json's.
  std::string init_from;

  std::string metrics_path;  // JSON lines, one per step
  std::string trace_path;    // Chrome trace
  int blas_threads = 0;      // 0: the hardware threads shared among in-process ranks
  // Seconds a rank waits for its peers in one communication call before the run fails naming
  // the call, the step and the ranks that did not arrive (comm_timeout_s); unset: the
  // TANDEM_COMM_TIMEOUT environment variable, else 600. 0: wait forever.
  std::optional<double> comm_timeout_s;
  std::ostream* out = nullptr;  // progress and summary (null: stdout); world rank 0 only
  bool progress = true;         // the progress display (else only the summary)
  bool keep_weights = false;    // return the final whole-model weights (tests)
  // Called on world rank 0 after each step with what the step's metrics line holds (whether or
  // not metrics_path is set): the Python module's per-step callback. Under MPI (backend Mpi),
  // where each process is a caller of its own, on every rank, with the same all-reduced loss and
  // the rank's own times. Returning false (on any rank) asks every
  // rank to stop after this step as a SIGTERM does (with a checkpoint under --save); the result
  // says so (TrainResult::stopped_by_caller). It must not throw.
  std::function<bool(const io::StepMetrics&)> on_step;

  // Out-of-core training (docs/out-of-core.md): the fast-tier budget for what a step saves for
  // its backward plus the workspace ("600MiB", "2GiB"; empty: in-core), where swapped blocks
  // go, and a plan to use instead of the planner's ("KKSR/p1").
  std::string memory_budget;
  ooc::TierSpec slow_tier;
  std::string ooc_plan;
  // Where the blocks' weights, gradients and moments live (docs/out-of-core.md, "Models larger
  // than memory"): in memory (unset), or in this slow tier, streamed through a few block slots.
  std::optional<ooc::TierSpec> model_state;
  // How many of each stage's blocks stay resident in memory instead of streaming (at most all of
  // them); auto: the planner's choice under --memory-budget (none without a budget), made in the
  // rank's set-up after the first step's profile: the one auto resolve cannot decide, since the
  // prediction needs the rank's own model measured.
  Auto<int> resident_blocks;
  // --shard weights: how many blocks ahead of the one computing each block's weights are gathered
  // (the prefetch distance D; D + 1 gathered blocks in memory); auto: chosen from the performance
  // model's rates (grid_plan.h's choose_gather_ahead) when the run is resolved.
  Auto<int> gather_ahead;
  // The prefetch distance the memory is counted for: gather_ahead, or 1 while auto is undecided.
  int gather_ahead_blocks() const { return gather_ahead.value_or(1); }
  // The fewest blocks a pipeline stage holds (the stages split the layers as evenly as they go),
  // and so the most a gather can be ahead of the one computing (at least 1).
  int fewest_stage_blocks() const;
  int most_gather_ahead() const { return std::max(1, fewest_stage_blocks() - 1); }
  // --grid auto: the plan's choice of grid and why (grid_plan.h), printed among the start-up
  // lines ("" otherwise). (The plan decides several settings at once: no one Auto holds it.)
  std::string grid_choice;
  // Where lr came from when --lr was not given ("--model gpt2's", "the default for d_model
  // 256"), printed among the start-up lines ("" otherwise).
  std::string lr_choice;
  // `tandem plan`: profile and plan, print the plan's report (and write its predicted timeline to
  // trace_path), train nothing.
  bool plan_only = false;

  // Throws a UserError naming the flag at fault (sizes, grid against model and batch, ...).
  void validate() const;
  // The micro-batch count a step uses.
  int micro_batch_count() const;
};

// The default peak learning rate of a model `d_model` wide: 3e-3 up to 128, then falling as
// 1 / width (0.384 / d_model), as the learning rates published for GPT-3's sizes do (6e-4 at 768,
// 2e-4 at 2048, where this gives 5e-4 and 1.9e-4): wide models diverge at a narrow one's rate.
inline double width_learning_rate(int d_model) {
  return std::min(3e-3, 0.384 / static_cast<double>(std::max(d_model, 1)));
}

// The learning rate of step `step` (0-based): linear warm-up to the peak, then cosine decay to
// lr * min_lr_ratio at the last step; a function of the step alone, so a resumed run follows it.
double learning_rate(const TrainConfig& config, int64_t step);

}  // namespace tandem::train
