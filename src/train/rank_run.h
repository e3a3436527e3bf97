// One rank's run of `tandem train`: its set-up, its state while it trains, and the steps. The
// loop is in trainer.cc; what it prints and writes about itself (the start-up lines, each step's
// report, the end's summary, the messages of a run that stops) in report.cc. Internal to train/.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "out_of_core.h"
#include "rank_batches.h"
#include "run_checkpoint.h"
#include "schedule_choice.h"
#include "tandem/comm/communicator.h"
#include "tandem/core/clock.h"
#include "tandem/data/data.h"
#include "tandem/io/metrics.h"
#include "tandem/io/progress.h"
#include "tandem/io/trace.h"
#include "tandem/ooc/transfer_engine.h"
#include "tandem/parallel/model.h"
#include "tandem/parallel/model_state.h"
#include "tandem/parallel/optimizer.h"
#include "tandem/perf/streamed_state.h"
#include "tandem/train/trainer.h"

namespace tandem::train::detail {

class RankRun {
 public:
  RankRun(comm::Communicator& world, const TrainConfig& cfg, io::TraceRecorder* trace,
          std::shared_ptr<const ResumeState> resume);

  TrainResult run();
  // A wait for a peer given up after a stop signal's grace (comm's StopWaitError) in run():
  // rethrown with the step in progress, which no checkpoint holds, and the last checkpoint there
  // is (or, in the set-up, that no training was lost).
  [[noreturn]] void stopped_waiting(const comm::StopWaitError& e) const;

 private:
  // Set-up: the weights (and moments), the out-of-core plan, then what the lead rank prints and
  // writes.
  int64_t initialise();
  void plan_out_of_core(int64_t first_step);
  int64_t restore();
  void open_reports(int64_t first_step);
  void print_header(int64_t first_step);
  void print_plan();  // tandem plan
  std::string memory_lines();
  std::string model_state_line() const;
  std::string gather_ahead_text() const;
  // With --model-state, the model state a step holds in memory with r resident blocks: the
  // store's slots and resident blocks, and the embeddings and ln_f (weights, gradients and
  // moments). --memory-budget holds it beside the activations. (The optimizer programs' exchange
  // buffers are not counted: the executors allocate them on first use, so their size is known
  // only after a step.)
  uint64_t model_state_memory(int r) const {
    return store()->staging_bytes() + store()->resident_bytes(r) + 2 * state_.resident_bytes() +
           state_.moment_bytes() + state_.sharded_bytes();
  }
  // What that is, for messages: "the model state in memory (slots, embeddings and ln_f[, r
  // resident blocks])".
  static std::string store_held(int r);
  // With --model-state and --memory-budget, unless --resident-blocks says: how many blocks stay
  // resident (the count with the shortest predicted step), then the activations planned again.
  void choose_resident_blocks();
  // With --model-state and --memory-budget: a step's forward and backward, and the model state's
  // I/O a step (the activations' swaps included where they share its tier), as the performance
  // model (perf/streamed_state.h) predicts them; the store's own I/O with r resident blocks.
  double streamed_step_s() const {
    return perf::streamed_step_s(ooc_->predicted_step_s(), state_io_s());
  }
  double state_io_s() const {
    return perf::state_io_s(store_io_s(store()->resident()), ooc_->predicted_swapped_bytes(),
                            store()->bandwidth(), swaps_share_the_state_tier());
  }
  double store_io_s(int r) const {
    return perf::store_io_s(store()->predicted_step_traffic(r), store()->bandwidth());
  }
  // --model-state: the blocks' store (opened when the optimizer placed the moments), else null.
  parallel::BlockStore* store() const { return state_.store(); }
  // Whether the activations swap to the model state's tier (one disk, one transfer engine).
  bool swaps_share_the_state_tier() const {
    return cfg_.model_state && cfg_.slow_tier.str() == cfg_.model_state->str();
  }
  // A step and what follows it.
  double train_step(int64_t step, double lr);
  void finish_optimizer_step();
  bool validation_due(int64_t step) const;
  double validate();
  bool checkpoint_due(int64_t step) const;
  void save(int64_t step);
  // A non-finite loss or model: stop with the step, the last finite loss and the checkpoint kept.
  [[noreturn]] void diverged(const std::string& what) const;
  // The lead rank's report of a step; returns the error of a metrics write that failed (else "").
  // Under MPI, config.on_step runs on every rank (each process its own caller).
  std::string report_step(int64_t step, double loss, std::optional<double> val, double lr,
                          double step_s);
  // An output that failed after `step` (a full disk under --metrics): every rank saves the
  // checkpoint (when --save is given and it was not just saved) and stops with `failed`.
  [[noreturn]] void stop_after_failed_output(int64_t step, const std::string& failed);
  // A batch that could not be read for `step` on some rank (`failed`: this rank's message, or
  // ""): a collective; every rank saves the model it has (when --save is given) and stops with
  // the first failing rank's message.
  [[noreturn]] void stop_after_failed_input(int64_t step, const std::string& failed);
  // Why every rank stops after this step, or 0: kStopAsked when config.on_step asked on some
  // rank (the lead's, or under MPI any), else the stop signal every rank has seen by now (the
  // largest: SIGTERM over SIGINT). A collective, so that all stop after the same step.
  static constexpr int kStopAsked = 1 << 16;  // above every signal's number
  int agreed_stop();

  // The end of the run.
  void finish(TrainResult& result);
  void print_summary(const TrainResult& result, int64_t steps_run);
  // The end's lines of the step's breakdown: measured (this rank's phases, the mean over the
  // steps after the first) beside predicted (perf's model at the rates cached for this run's
  // shape, when `tandem plan` or --grid auto measured them; nothing is measured here).
  std::string breakdown_lines() const;
  // Phases and trace spans.
  void on_event(parallel::Phase phase, std::string_view name, Clock::time_point b,
                Clock::time_point e, double self_s);
  void trace_span(std::string_view stream, std::string_view name, Clock::time_point begin);
  double tokens_per_step() const { return static_cast<double>(cfg_.batch) * cfg_.model.seq_len; }

  // Constructed in this order (the constructor's initialisers rely on it): the model needs
  // batches_ and schedules_, the optimizer the model. The rank's own config: its set-up decides
  // into it the autos that need its communicators or its profile (the dtypes, the resident
  // blocks), which the start-up lines then print with their reasons.
  TrainConfig cfg_;
  io::TraceRecorder* trace_;
  // The checkpoint resumed, or the Hugging Face folder a run starts from (--init-from).
  std::shared_ptr<const ResumeState> resume_;
  bool resumed() const { return resume_ && !resume_->init_weights; }
  parallel::Grid grid_;
  bool lead_;
  std::shared_ptr<const data::Corpus> corpus_;
  RankBatches batches_;
  data::BatchSampler sampler_;
  std::optional<data::BatchSampler> val_sampler_;
  ScheduleChoice schedules_;
  OptimizerChoice optimizer_;  // the optimizer's configuration as it runs, its schedules
  // One transfer engine per tier (--slow-tier, --model-state, --optimizer-state), shared by the
  // activations, the store and the optimizer: declared before them so that it outlives them.
  ooc::TransferEngines engines_;
  std::unique_ptr<OutOfCore> ooc_;  // --memory-budget: where the model's activations live
  // This rank's weights, gradients and moments, wherever they live (declared before the model and
  // the optimizer, so that it outlives both).
  parallel::ModelState state_;
  parallel::ParallelGPT model_;
  parallel::DataParallelOptimizer opt_;
  parallel::BlockStore::Traffic steps_traffic_;  // what the store moved over the steps
  std::ostream& out_;
  io::PhaseTimer phases_;  // this step's, on the lead rank
  // The phases summed over the steps reported after the first (the first pays for warm-ups), and
  // those steps' seconds: the measured side of the end's breakdown.
  std::map<std::string, double> phase_totals_;
  double measured_steps_s_ = 0;
  int64_t steps_reported_ = 0, steps_measured_ = 0;
  std::atomic<bool> profiling_{false};  // the out-of-core profile's steps are not reported
  // The validation's forwards: traced, and counted as "eval", not as the step's compute.
  std::atomic<bool> validating_{false};
  std::unique_ptr<io::MetricsWriter> metrics_;  // lead rank only
  bool stop_asked_ = false;                     // config.on_step returned false
  std::unique_ptr<io::Progress> progress_;      // lead rank only
  // For the message of a divergence: the last step with a finite loss, and the newest good
  // checkpoint (the one resumed from, or this run's last save).
  int64_t last_finite_step_ = -1;
  double last_finite_loss_ = 0;
  struct Kept {
    int64_t step = -1;
    std::string folder;
  } last_checkpoint_;
  static constexpr int64_t kInSetUp = -1, kAfterTheSteps = -2;
  int64_t step_in_progress_ = kInSetUp;  // the loop's step, or where the run is outside it
};

// A wait for a peer given up after a stop signal's grace during a rank's set-up: rethrown saying
// that no training was lost.
[[noreturn]] void stopped_in_set_up(const comm::StopWaitError& e);

// The lines `tandem train` prints about the whole run, not one rank's: the start-up line of the
// matmuls' precision (--precision) and why.
std::string precision_line(DType matmul);
// The start-up line of the step's work: the model's matmul FLOPs a token and a step, forward and
// backward (perf/flops.h, the performance model's; what benchmarks divide a rate by):
// "  work: 2.0123e+06 FLOP a token, 1.2880e+08 a step (the matmuls, forward and backward)".
std::string work_line(const TrainConfig& cfg);

// Under mpirun, --backend thread runs the whole grid inside every process: a warning that the N
// processes train N copies.
void warn_thread_backend_under_mpirun(const TrainConfig& c);

// Every MPI process's trace events gathered into rank 0's recorder, so that one file shows them
// all. Every rank of `world` calls it together.
void gather_trace(comm::Communicator& world, io::TraceRecorder& trace);

}  // namespace tandem::train::detail
