// The training loop: each rank's set-up (grid, data, model, optimizer, checkpoint restore), its
// steps with their validation, checkpoints, metrics, trace and progress, and train() starting the
// ranks.
#include "tandem/train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>

#include "config_agreement.h"
#include "corpus_cache.h"
#include "out_of_core.h"
#include "output_paths.h"
#include "precision.h"
#include "rank_batches.h"
#include "run_checkpoint.h"
#include "schedule_choice.h"
#include "stop_signal.h"
#include "tandem/comm/mpi.h"
#include "tandem/comm/thread.h"
#include "tandem/core/blas.h"
#include "tandem/core/clock.h"
#include "tandem/core/error.h"
#include "tandem/data/data.h"
#include "tandem/io/atomic_file.h"
#include "tandem/io/checkpoint_series.h"
#include "tandem/io/console.h"
#include "tandem/io/metrics.h"
#include "tandem/ooc/bytes.h"
#include "tandem/ooc/transfer_engine.h"
#include "tandem/parallel/model.h"
#include "tandem/parallel/state_streamer.h"
#include "tandem/train/grid_plan.h"
#include "tandem/train/memory_estimate.h"
#include "tandem/train/progress.h"
#include "trace_gather.h"
#include "validation.h"

namespace tandem::train {
namespace {

// Whether the optimizer's communication thread may use the data-parallel group while the
// backward runs: always on in-process ranks; under MPI it needs MPI_THREAD_SERIALIZED (the
// thread calls MPI while the main thread does not), or MPI_THREAD_MULTIPLE when the backward
// communicates too (tp or pp > 1).
bool exchange_may_overlap(const TrainConfig& c) {
  if (c.backend != comm::Backend::Mpi) return true;
  const auto level = comm::mpi_thread_level();
  const auto needed =
      c.grid.tp == 1 && c.grid.pp == 1 ? comm::MpiThreads::Serialized : comm::MpiThreads::Multiple;
  return level && *level >= needed;
}

int local_ranks_for_blas(const TrainConfig& c) {
  if (c.backend == comm::Backend::Thread) return c.grid.size();
  return comm::launched_local_ranks();
}

// Under mpirun, --backend thread runs the whole grid inside every process: N processes train N
// copies of the model side by side, each writing the same outputs.
void warn_thread_backend_under_mpirun(const TrainConfig& c) {
  const auto job = comm::launched_mpi_job();
  if (!job) return;
  (c.out != nullptr ? *c.out : std::cout) << fmt::format(
      "tandem train: warning: this process is rank {} of {} started by an MPI "
      "launcher, but --backend thread runs all {} ranks inside each process: the {} "
      "processes train {} separate copies; give --backend mpi to train one model "
      "across them\n",
      job->rank, job->size, c.grid.size(), job->size, job->size);
}

// ----------------------------------------------------------------------------- one rank's run

// One rank's part of the training: set up on construction (its grid, data, schedules, model and
// optimizer), then run(): the weights initialised or restored, and the steps, each followed by
// the validation and checkpoint that fall due and the step's report.
class RankRun {
 public:
  RankRun(comm::Communicator& world, const TrainConfig& cfg, io::TraceRecorder* trace,
          std::shared_ptr<const ResumeState> resume)
      : cfg_(cfg),
        trace_(trace),
        resume_(std::move(resume)),
        grid_(world, cfg.grid),
        lead_(world.rank() == 0),
        corpus_(detail::corpus_for(cfg)),
        batches_(cfg, grid_),
        sampler_(corpus_->train, cfg.batch, cfg.model.seq_len, cfg.seed),
        schedules_(cfg, grid_, cfg.executor),
        optimizer_(schedules_.optimizer()),
        ooc_(cfg.memory_budget.empty()
                 ? nullptr
                 : std::make_unique<detail::OutOfCore>(cfg, grid_, batches_.micro_rows(),
                                                       batches_.micro_batch_count(), engines_)),
        state_(parallel::ShardLayout(cfg.model, grid_.shape(), grid_.coord().tp, grid_.coord().pp),
               {cfg.model_state, cfg.optimizer.state_tier, batches_.micro_batch_count(),
                cfg.optimizer.sharding == parallel::Sharding::Weights,
                schedules_.gather_schedules(), cfg.gather_ahead_blocks()},
               &grid_.dp().allocator(), &engines_),
        model_(cfg.model, grid_, batches_.micro_rows(), cfg.model.seq_len,
               batches_.micro_batch_count(), schedules_.model_programs(batches_.micro_rows()),
               ooc_ ? ooc_->memory() : nullptr, &state_),
        opt_(optimizer_.config, state_, grid_.dp(), optimizer_.schedules, cfg.executor,
             exchange_may_overlap(cfg), &grid_.world()),
        out_(cfg.out != nullptr ? *cfg.out : std::cout) {
    if (store() != nullptr) {
      if (cfg.resident_blocks > 0)
        store()->set_resident(std::min(cfg.resident_blocks, store()->blocks()));
      // --memory-budget covers the model state in memory too.
      if (ooc_)
        ooc_->reserve(model_state_memory(store()->resident()), store_held(store()->resident()));
      // Only when tracing: the store names every transfer it reports.
      if (trace_ != nullptr && trace_->enabled())
        store()->set_transfer_sink(
            [this](const std::string& name, Clock::time_point b, Clock::time_point e) {
              if (!profiling_) trace_->record(grid_.world().rank(), io::kStateStream, name, b, e);
            });
    }
    if (resumed()) last_checkpoint_ = {resume_->meta.step, resume_->folder};
    if (cfg.eval_every > 0) val_sampler_.emplace(detail::validation_sampler(*corpus_, cfg));
    model_.set_event_sink([this](std::string_view stream, std::string_view name,
                                 Clock::time_point b, Clock::time_point e,
                                 double self_s) { on_event(stream, name, b, e, self_s); });
    // The data-parallel exchange of a block's gradients starts as soon as the backward is done
    // with it (docs/training.md says why that is safe).
    model_.set_gradients_ready([this](int layer) { opt_.layer_ready(layer); });
    opt_.set_segment_sink([this](std::string_view name, Clock::time_point b, Clock::time_point e) {
      if (!profiling_ && trace_ != nullptr && trace_->enabled())
        trace_->record(grid_.world().rank(), io::kExchangeStream,
                       fmt::format("dp exchange {}", name), b, e);
    });
    // --shard weights: the blocks' gathers share the exchange's thread and row.
    if (trace_ != nullptr && trace_->enabled())
      state_.set_gather_sink(
          [this](const std::string& name, Clock::time_point b, Clock::time_point e) {
            if (!profiling_) trace_->record(grid_.world().rank(), io::kExchangeStream, name, b, e);
          });
  }

  TrainResult run();

 private:
  // Set-up: the weights (and moments), the out-of-core plan, then what the lead rank prints and
  // writes.
  int64_t initialise();
  void plan_out_of_core(int64_t first_step);
  int64_t restore();
  void open_reports(int64_t first_step);
  void print_header(int64_t first_step);
  std::string memory_lines();
  std::string model_state_line() const;
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
  // With --model-state and --memory-budget: a step's forward and backward as the performance model
  // predicts it. The store's transfers run beside compute (prefetching ahead, writing behind), so
  // a step takes about the longer of the two.
  double streamed_step_s() const { return std::max(ooc_->predicted_step_s(), state_io_s()); }
  // The model state's I/O a step, at the tier's measured bandwidth; when the activations swap to
  // the same tier, their transfers share its one disk and transfer engine, so theirs count too.
  double state_io_s() const {
    double s = store()->predicted_step_io_s();
    if (swaps_share_the_state_tier()) {
      const ooc::TierBandwidth& bw = store()->bandwidth();
      const double swapped = static_cast<double>(ooc_->predicted_swapped_bytes());
      s += swapped / bw.write_bytes_per_s + swapped / bw.read_bytes_per_s;
    }
    return s;
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
  std::string report_step(int64_t step, double loss, std::optional<double> val, double lr,
                          double step_s);
  // An output that failed after `step` (a full disk under --metrics): every rank saves the
  // checkpoint (when --save is given and it was not just saved) and stops with `failed`.
  [[noreturn]] void stop_after_failed_output(int64_t step, const std::string& failed);
  // The stop signal every rank has seen by now (the largest: SIGTERM over SIGINT), or 0: a
  // collective, so that all stop after the same step.
  int agreed_stop_signal();
  // The end of the run.
  void finish(TrainResult& result);
  void print_summary(const TrainResult& result, int64_t steps_run);
  // Phases and trace spans.
  void on_event(std::string_view stream, std::string_view name, Clock::time_point b,
                Clock::time_point e, double self_s);
  void trace_span(std::string_view stream, std::string_view name, Clock::time_point begin);
  double tokens_per_step() const { return static_cast<double>(cfg_.batch) * cfg_.model.seq_len; }

  // Constructed in this order (the constructor's initialisers rely on it): the model needs
  // batches_ and schedules_, the optimizer the model.
  const TrainConfig& cfg_;
  io::TraceRecorder* trace_;
  // The checkpoint resumed, or the Hugging Face folder a run starts from (--init-from).
  std::shared_ptr<const ResumeState> resume_;
  bool resumed() const { return resume_ && !resume_->init_weights; }
  parallel::Grid grid_;
  bool lead_;
  std::shared_ptr<const data::Corpus> corpus_;
  detail::RankBatches batches_;
  data::BatchSampler sampler_;
  std::optional<data::BatchSampler> val_sampler_;
  detail::ScheduleChoice schedules_;
  detail::OptimizerChoice optimizer_;  // the optimizer's configuration as it runs, its schedules
  // One transfer engine per tier (--slow-tier, --model-state, --optimizer-state), shared by the
  // activations, the store and the optimizer: declared before them so that it outlives them.
  ooc::TransferEngines engines_;
  std::unique_ptr<detail::OutOfCore> ooc_;  // --memory-budget: where the model's activations live
  // This rank's weights, gradients and moments, wherever they live (declared before the model and
  // the optimizer, so that it outlives both).
  parallel::ModelState state_;
  parallel::ParallelGPT model_;
  parallel::DataParallelOptimizer opt_;
  parallel::BlockStore::Traffic steps_traffic_;  // what the store moved over the steps
  std::ostream& out_;
  io::PhaseTimer phases_;                       // this step's, on the lead rank
  std::atomic<bool> profiling_{false};          // the out-of-core profile's steps are not reported
  std::unique_ptr<io::MetricsWriter> metrics_;  // lead rank only
  std::unique_ptr<Progress> progress_;          // lead rank only
  // For the message of a divergence: the last step with a finite loss, and the newest good
  // checkpoint (the one resumed from, or this run's last save).
  int64_t last_finite_step_ = -1;
  double last_finite_loss_ = 0;
  struct Kept {
    int64_t step = -1;
    std::string folder;
  } last_checkpoint_;
};

TrainResult RankRun::run() {
  TrainResult result;
  result.first_step = resume_ ? restore() : initialise();
  if (cfg_.plan_only) {  // tandem plan
    plan_out_of_core(result.first_step);
    if (lead_) {
      out_ << ooc_->plan_line() << "\n" << ooc_->report() << model_state_line();
      if (store())
        out_ << fmt::format(
            "predicted forward+backward with the model state streamed: {:.3f} s, the longer of "
            "compute with the activation plan ({:.3f} s) and the tier's I/O ({:.3f} s){}\n",
            streamed_step_s(), ooc_->predicted_step_s(), state_io_s(),
            swaps_share_the_state_tier()
                ? " (the model state's and the activations' swaps: one disk)"
                : "");
      out_ << largest_model_line(cfg_);
      if (!cfg_.trace_path.empty()) {
        io::write_file_atomic(cfg_.trace_path, ooc_->predicted_trace());
        out_ << fmt::format("predicted timeline written to {}\n", cfg_.trace_path);
      }
      out_.flush();
    }
    result.ooc_plan = ooc_->plan().str();
    result.ooc_predicted_s = ooc_->predicted_step_s();
    result.ooc_predicted_peak = ooc_->predicted_peak();
    result.ooc_profile_cached = ooc_->profile_from_cache();
    if (store()) result.resident_blocks = store()->resident();
    return result;
  }
  if (ooc_ && result.first_step < cfg_.steps) plan_out_of_core(result.first_step);
  result.optimizer_schedule = opt_.schedule_name();
  result.optimizer_chunk_bytes = opt_.chunk_bytes();
  result.grad_dtype = opt_.config().grad_dtype;
  result.tp_dtype = model_.tp_dtype();
  result.epilogue_schedule = model_.epilogue_schedule();
  result.pipeline_schedule = model_.pipeline_schedule();
  result.executor = opt_.executor_name();
  open_reports(result.first_step);

  const auto run_begin = Clock::now();
  if (store()) store()->reset_traffic();  // the steps' transfers, not the set-up's
  for (int64_t step = result.first_step; step < cfg_.steps; ++step) {
    comm::set_comm_activity(fmt::format("step {}", step + 1));
    const auto step_begin = Clock::now();
    const double lr = learning_rate(cfg_, step);
    const double loss = train_step(step, lr);
    const double step_s = seconds_since(step_begin);
    if (!std::isfinite(loss)) {
      // Every rank holds the same (all-reduced) loss, so all stop here together.
      report_step(step, loss, std::nullopt, lr, step_s);
      diverged(fmt::format("the loss at step {} is {}", step + 1,
                           std::isnan(loss) ? "NaN"
                           : loss > 0       ? "+infinity"
                                            : "-infinity"));
    }
    if (ooc_) ooc_->after_step(trace_, grid_.world().rank());
    std::optional<double> val;
    if (validation_due(step)) {
      comm::set_comm_activity(fmt::format("the validation after step {}", step + 1));
      val = validate();
      result.val_losses.emplace_back(step + 1, *val);
    }
    if (checkpoint_due(step)) {
      comm::set_comm_activity(fmt::format("the checkpoint after step {}", step + 1));
      save(step + 1);
    }
    result.losses.push_back(loss);
    if (const std::optional<double> norm = opt_.grad_norm()) result.grad_norms.push_back(*norm);
    last_finite_step_ = step + 1;
    last_finite_loss_ = loss;
    const std::string failed = report_step(step, loss, val, lr, step_s);
    // The lead rank alone writes the metrics: every rank learns whether that failed (a full
    // disk), so that all save and stop together.
    if (!cfg_.metrics_path.empty()) {
      const std::string any = comm::broadcast_string(grid_.world(), failed);
      if (!any.empty()) stop_after_failed_output(step, any);
    }
    // SIGTERM or SIGINT: every rank stops after this same step, with a checkpoint.
    if (const int sig = agreed_stop_signal()) {
      if (!cfg_.save_dir.empty() && !checkpoint_due(step)) {
        comm::set_comm_activity(fmt::format("the checkpoint after step {}", step + 1));
        save(step + 1);
      }
      result.stopped_by_signal = sig;
      break;
    }
  }
  // --steps 0 (or a run with nothing to do) still saves the model it starts from, once.
  if (!cfg_.save_dir.empty() && !resumed() && result.first_step >= cfg_.steps) {
    comm::set_comm_activity("the checkpoint of the initial model");
    save(result.first_step);
  }
  comm::set_comm_activity("the end of the run");
  result.seconds = seconds_since(run_begin);
  finish(result);
  return result;
}

// ------------------------------------------------------------------------------------ set-up

// GPT-2's initialisation (keyed by element index) of this rank's part. Returns the first step, 0.
int64_t RankRun::initialise() {
  parallel::init_weights(model_, cfg_.seed);
  return 0;
}

// The out-of-core plan from this machine's profile: cached, or measured by running the first
// step's forward and backward (its gradients are discarded: train_step zeroes them).
void RankRun::plan_out_of_core(int64_t first_step) {
  const data::Batch b = batches_.draw(sampler_, first_step);
  profiling_ = true;
  ooc_->prepare(
      [&] {
        model_.zero_gradients();
        model_.forward_backward(batches_.micro_batches(b), cfg_.seed,
                                static_cast<uint64_t>(first_step));
      },
      grid_.tp(), lead_ && cfg_.progress ? &out_ : nullptr);
  profiling_ = false;
  if (store() && cfg_.resident_blocks < 0) choose_resident_blocks();
}

// The predicted step with r resident blocks is the longer of the activations' compute under what
// the budget has left (nondecreasing in r) and the model state's I/O (nonincreasing): the
// shortest is where they cross. Of counts predicting the same step, the most resident (less
// traffic on a disk the activations' swaps may share). The tensor-parallel group takes the
// fewest any rank chose, so that their activation plans, and the collectives of what they
// recompute, stay the same.
void RankRun::choose_resident_blocks() {
  const int n = store()->blocks();
  std::vector<double> compute(static_cast<size_t>(n) + 1, -1.0);
  auto compute_s = [&](int r) {
    double& c = compute[static_cast<size_t>(r)];
    if (c < 0) c = ooc_->predicted_step_s_reserving(model_state_memory(r));
    return c;
  };
  auto io_s = [&](int r) { return store()->predicted_step_io_s(r); };
  auto step_s = [&](int r) { return std::max(compute_s(r), io_s(r)); };
  // The most that fit (none fitting at all was refused at set-up).
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (std::isfinite(compute_s(mid)))
      lo = mid;
    else
      hi = mid - 1;
  }
  const int fits = lo;
  lo = 0;
  hi = fits;
  while (lo < hi) {  // the first count where compute covers the I/O
    const int mid = (lo + hi) / 2;
    if (compute_s(mid) >= io_s(mid))
      hi = mid;
    else
      lo = mid + 1;
  }
  int best = lo > 0 && step_s(lo - 1) < step_s(lo) ? lo - 1 : lo;
  lo = best;
  hi = fits;
  while (lo < hi) {  // past it the step only grows: the last count still as short
    const int mid = (lo + hi + 1) / 2;
    if (step_s(mid) <= step_s(best))
      lo = mid;
    else
      hi = mid - 1;
  }
  best = lo;
  if (grid_.tp().size() > 1) {
    float r = static_cast<float>(best);
    Tensor t = Tensor::view_of(&r, DType::F32, Shape{1});
    grid_.tp().all_reduce(t, comm::ReduceOp::Min);
    best = static_cast<int>(r);
  }
  if (best == store()->resident()) return;
  // The activations give up their part of the budget (their arena's pages released) before the
  // resident blocks take it, so that the two are never in memory together.
  ooc_->reserve(model_state_memory(best), store_held(best));
  store()->set_resident(best);
}

std::string RankRun::store_held(int r) {
  return fmt::format(
      "the model state in memory (slots, embeddings and ln_f{})",
      r == 0 ? std::string() : fmt::format(", {} resident block{}", r, r == 1 ? "" : "s"));
}

// This rank's part of the checkpoint's weights and moments. Returns the step it was saved at.
int64_t RankRun::restore() {
  detail::restore_state(*resume_, model_, opt_);
  return resume_->meta.step;
}

void RankRun::open_reports(int64_t first) {
  const std::string memory = memory_lines();  // a collective: every rank's figures
  if (lead_) {
    if (resume_)
      for (const std::string& w : resume_->warnings) out_ << "tandem train: warning: " << w << "\n";
    print_header(first);
    out_ << memory;
    out_.flush();
    if (!cfg_.metrics_path.empty())
      metrics_ = std::make_unique<io::MetricsWriter>(cfg_.metrics_path, first > 0);
    if (cfg_.progress) {
      ProgressOptions po;
      po.terminal = cfg_.out == nullptr && io::is_terminal(stdout);
      progress_ = std::make_unique<Progress>(out_, cfg_.steps, po, first);
    }
  }
  if (resumed() && first >= cfg_.steps && lead_)
    out_ << fmt::format(
        "tandem train: the checkpoint is at step {}, --steps is {}: nothing to do\n", first,
        cfg_.steps);
}

// What each rank holds for training (parameters, gradients, optimizer state, the exchange's
// buffers), and how the data-parallel exchange runs: for the lead rank to print. A collective over
// the world.
std::string RankRun::memory_lines() {
  constexpr int kFields = 4;
  const float mib = 1.0f / (1 << 20);
  std::vector<float> mine = {static_cast<float>(state_.resident_bytes()) * mib,
                             static_cast<float>(state_.resident_bytes()) * mib,
                             static_cast<float>(state_.moment_bytes()) * mib,
                             static_cast<float>(opt_.buffer_bytes()) * mib};
  const int n = grid_.world().size();
  std::vector<float> all(static_cast<size_t>(kFields * n));
  grid_.world().all_gather(Tensor::view_of(mine.data(), DType::F32, Shape{kFields}),
                           Tensor::view_of(all.data(), DType::F32, Shape{kFields * n}));
  auto line = [&](int r) {
    const float* f = all.data() + static_cast<ptrdiff_t>(kFields * r);
    const std::string share = opt_.state_sliced() && cfg_.grid.dp > 1
                                  ? fmt::format(", 1/{} of the model's", cfg_.grid.dp)
                                  : "";
    const std::string state =
        state_.moment_tier_description().empty()
            ? fmt::format("optimizer state {:.2f} MiB{}", f[2], share)
            : fmt::format(
                  "optimizer state in the slow tier ({}) {:.2f} MiB{}, staged through {:.2f} MiB",
                  state_.moment_tier_description(),
                  static_cast<double>(state_.moment_tier_bytes()) / (1 << 20), share, f[2]);
    return fmt::format(
        "parameters {:.2f} MiB, gradients {:.2f} MiB, {}, exchange buffers {:.2f} MiB", f[0], f[1],
        state, f[3]);
  };
  bool same = true;
  for (int r = 1; r < n; ++r)
    same = same && std::equal(all.begin(), all.begin() + kFields, all.begin() + kFields * r);
  std::string out;
  if (same) {
    out = fmt::format("  memory on {}: {}\n", n == 1 ? "the rank" : "every rank", line(0));
  } else {
    for (int r = 0; r < n; ++r) out += fmt::format("  memory on rank {}: {}\n", r, line(r));
  }
  out += model_state_line();
  std::string exchange = fmt::format("{} bucket{} of blocks + the embeddings and ln_f",
                                     opt_.buckets(), opt_.buckets() == 1 ? "" : "s");
  if (cfg_.optimizer.kind == parallel::OptimizerKind::Lamb)
    exchange += fmt::format(" ({} tensors, a trust ratio each)", opt_.tensors());
  out += fmt::format("  data-parallel exchange: {}, {}\n", exchange,
                     opt_.overlapping() ? "overlapped with the backward"
                     : cfg_.optimizer.exchange == parallel::GradExchange::Overlap
                         ? "after the backward (this MPI's thread level cannot overlap it)"
                         : "after the backward");
  return out;
}

// With --model-state: where the blocks' state lives and what a step moves (else "").
std::string RankRun::model_state_line() const {
  std::string sharded;
  if (state_.weights_sharded()) {
    const parallel::ShardLayout& l = state_.layout();
    sharded = fmt::format(
        "  model state sharded over the {} data-parallel ranks (--shard weights): blocks "
        "h.{}..h.{} keep 1/{} of their weights and optimizer state on each rank, each block's "
        "weights gathered into {} slots before its forward and backward (gather_weights{}), {}; "
        "its gradients {} until its update: {} a rank; the embeddings and ln_f whole ({})",
        cfg_.grid.dp, l.first_layer(), l.end_layer() - 1, cfg_.grid.dp,
        parallel::ModelState::gather_slots(state_.options().gather_ahead),
        state_.gather_chunk_bytes() != 0
            ? fmt::format(" at {}-byte chunks", state_.gather_chunk_bytes())
            : std::string(),
        cfg_.gather_ahead_choice.empty()
            ? fmt::format("gathers {} block{} ahead", state_.options().gather_ahead,
                          state_.options().gather_ahead == 1 ? "" : "s")
            : cfg_.gather_ahead_choice,
        batches_.micro_batch_count() > 1 ? "summed over the micro-batches in memory" : "in 2 slots",
        ooc::human_bytes(state_.sharded_bytes() + state_.moment_bytes()),
        ooc::human_bytes(2 * state_.resident_bytes()));
    if (!store()) return sharded + "\n";
    sharded += "; each rank's slices streamed from its tier:\n";
  }
  if (!store()) return "";
  const parallel::BlockStore::Traffic p = store()->predicted_step_traffic();
  const ooc::TierBandwidth& bw = store()->bandwidth();
  const int r = store()->resident();
  const std::string resident_note =
      r == 0
          ? std::string()
          : fmt::format(" and h.{}..h.{} resident in {} of memory ({})", store()->end_layer() - r,
                        store()->end_layer() - 1, ooc::human_bytes(store()->resident_bytes(r)),
                        cfg_.resident_blocks < 0 ? "the planner's choice" : "--resident-blocks");
  return sharded +
         fmt::format(
             "  model state: blocks h.{}..h.{} (weights, gradients, optimizer state) in {}, {} a "
             "rank, "
             "streamed through {} of slots{}, about {} read and {} written a step: {:.2f} s of I/O "
             "at "
             "the tier's measured {:.2f} GB/s read, {:.2f} GB/s write; the embeddings and ln_f in "
             "memory ({}{})\n",
             store()->first_layer(), store()->end_layer() - 1, store()->describe(),
             ooc::human_bytes(store()->tier_bytes()), ooc::human_bytes(store()->staging_bytes()),
             resident_note, ooc::human_bytes(p.read_bytes), ooc::human_bytes(p.written_bytes),
             store()->predicted_step_io_s(), bw.read_bytes_per_s / 1e9, bw.write_bytes_per_s / 1e9,
             ooc::human_bytes(2 * state_.resident_bytes() + state_.moment_bytes()),
             ooc_ ? " of --memory-budget" : "");
}

void RankRun::print_header(int64_t first_step) {
  const nn::GPTConfig& c = cfg_.model;
  out_ << fmt::format(
      "tandem train: {} {} layers x d_model {} ({} heads{}, {:.2f}M parameters) on {}, "
      "{} x {} tokens a step, {} ranks ({}, {} backend){}\n",
      c.llama() ? "Llama" : "GPT", c.n_layers, c.d_model, c.n_heads,
      c.llama() ? fmt::format(", {} key/value heads, MLP {}", c.n_kv_heads(), c.mlp_width()) : "",
      static_cast<double>(nn::gpt_num_parameters(c)) / 1e6,
      corpus_->source == "synthetic" ? "the synthetic corpus" : corpus_->source, cfg_.batch,
      c.seq_len, cfg_.grid.size(), cfg_.grid.str(), comm::backend_name(cfg_.backend),
      resumed() ? fmt::format(", resuming at step {} from {}", first_step, resume_->folder)
      : resume_ ? fmt::format(", starting from the Hugging Face folder {}", resume_->folder)
                : "");
  if (!cfg_.grid_choice.empty()) out_ << "  " << cfg_.grid_choice << "\n";
  out_ << "  " << grid_.mapping() << "\n";
  if (const std::string w = grid_.warning(); !w.empty()) out_ << "tandem train: " << w << "\n";
  out_ << detail::precision_line(c.matmul);
  const std::string_view optimizer = parallel::optimizer_name(cfg_.optimizer.kind);
  std::string programs =
      cfg_.optimizer.clip_grad_norm
          ? fmt::format(
                "  optimizer {} with the gradient's norm clipped at {}: programs {}, grad_norm "
                "({})",
                optimizer, *cfg_.optimizer.clip_grad_norm, opt_.schedule_name(),
                opt_.executor_name())
          : fmt::format(
                "  optimizer {}: program {} schedule {}{} ({})", optimizer,
                cfg_.optimizer.kind == parallel::OptimizerKind::Lamb ? "lamb_bucket" : "adam",
                opt_.schedule_name(),
                opt_.chunk_bytes() != 0 ? fmt::format(" at {}-byte chunks", opt_.chunk_bytes())
                                        : "",
                opt_.executor_name());
  if (!model_.epilogue_schedule().empty())
    programs += fmt::format("; megatron_layer schedule {}", model_.epilogue_schedule());
  if (!model_.tp_sum_schedule().empty())
    programs += fmt::format("; sum_in_place schedule {}", model_.tp_sum_schedule());
  if (!model_.pipeline_schedule().empty())
    programs += fmt::format("; pipeline_stage schedule {}, gradients back by grad_handoff",
                            model_.pipeline_schedule());
  if (!model_.executor().empty() && model_.executor() != opt_.executor_name())
    programs += fmt::format(" ({})", model_.executor());
  const int M = batches_.micro_batch_count();
  if (M > 1)
    programs += fmt::format("; {} micro-batches of {} rows, 1F1B", M, batches_.micro_rows());
  programs += schedules_.from_autotuner()
                  ? (cfg_.tune ? "; schedules autotuned" : "; schedules from the autotuner's cache")
                  : "; schedules by preference (no autotuner record: --tune makes one)";
  out_ << programs << "\n";
  if (optimizer_.config.grad_dtype != DType::F32 || !optimizer_.grad_dtype_reason.empty())
    out_ << fmt::format("  gradients exchanged in {}{}\n", dtype_name(optimizer_.config.grad_dtype),
                        optimizer_.grad_dtype_reason.empty()
                            ? ""
                            : fmt::format(" ({})", optimizer_.grad_dtype_reason));
  if (cfg_.grid.tp > 1 &&
      (model_.tp_dtype() != DType::F32 || !schedules_.tp_dtype_reason().empty()))
    out_ << fmt::format("  tensor-parallel exchanges in {}{}\n", dtype_name(model_.tp_dtype()),
                        schedules_.tp_dtype_reason().empty()
                            ? ""
                            : fmt::format(" ({})", schedules_.tp_dtype_reason()));
  out_ << memory_line(cfg_);
  if (ooc_) out_ << ooc_->plan_line();
  out_.flush();
}

// ------------------------------------------------------------------------------------ a step

// This rank's rows of the step's global batch forward and backward, the tied embedding's
// gradients summed, the optimizer applied. Returns the global batch's mean loss. Drawing the rows
// (windows copied out of the corpus: mapped shards or bytes) is on the step's critical path: the
// trace's "data" row and the "data" phase show what it costs.
double RankRun::train_step(int64_t step, double lr) {
  phases_.clear();
  const auto data_begin = Clock::now();
  const data::Batch b = batches_.draw(sampler_, step);
  if (lead_) phases_.add("data", seconds_since(data_begin));
  trace_span(io::kDataStream, fmt::format("batch {}", step + 1), data_begin);
  model_.zero_gradients();
  opt_.begin_step(lr, step + 1);  // from here, finished blocks' gradients are exchanged at once
  const double loss_sum =
      model_.forward_backward(batches_.micro_batches(b), cfg_.seed, static_cast<uint64_t>(step));
  model_.reduce_tied_gradients();
  finish_optimizer_step();
  return batches_.mean_loss(loss_sum);
}

// The exchange of what is left (the embeddings, ln_f, and every segment when not overlapping),
// and the wait for the communication thread.
void RankRun::finish_optimizer_step() {
  const auto begin = Clock::now();
  opt_.finish_step();
  if (lead_) {
    phases_.add("optimizer wait", seconds_since(begin));
    phases_.add("dp exchange", opt_.exchange_seconds());
  }
  trace_span(io::kCommStream, "optimizer " + opt_.schedule_name() + " (finish)", begin);
}

// Every eval_every steps and after the last.
bool RankRun::validation_due(int64_t step) const {
  return val_sampler_ && ((step + 1) % cfg_.eval_every == 0 || step + 1 == cfg_.steps);
}

double RankRun::validate() {
  const auto begin = Clock::now();
  const double loss = detail::validation_loss(model_, batches_, *val_sampler_, cfg_.eval_batches);
  if (lead_) phases_.add("eval", seconds_since(begin));
  trace_span(io::kComputeStream, "validation", begin);
  return loss;
}

// Every save_every steps and after the last.
bool RankRun::checkpoint_due(int64_t step) const {
  return !cfg_.save_dir.empty() &&
         (step + 1 == cfg_.steps || (cfg_.save_every > 0 && (step + 1) % cfg_.save_every == 0));
}

void RankRun::save(int64_t step) {
  const auto begin = Clock::now();
  const detail::SaveResult saved = detail::save_state(cfg_, *corpus_, step, model_, opt_);
  // A finite loss does not make a finite model: this step's update may have overflowed. Every
  // rank sees the same gathered tensors, so all refuse it together, and the last good checkpoint
  // stays.
  if (!saved.not_finite.empty())
    diverged(fmt::format("the model after step {} is not finite ({})", step, saved.not_finite));
  if (lead_) phases_.add("checkpoint", seconds_since(begin));
  last_checkpoint_ = {step, saved.folder};
  // Nobody runs ahead of a checkpoint being written (a failed save aborts the group).
  grid_.world().barrier();
}

void RankRun::diverged(const std::string& what) const {
  const std::string before = last_finite_step_ > 0
                                 ? fmt::format(" (the last finite loss was {:.4f}, at step {})",
                                               last_finite_loss_, last_finite_step_)
                                 : "";
  std::string kept;
  if (last_checkpoint_.step >= 0)
    kept = fmt::format(
        "; the last checkpoint, at step {} in '{}', is kept: resume from it with a "
        "lower --lr or a longer --warmup",
        last_checkpoint_.step, last_checkpoint_.folder);
  else if (!cfg_.save_dir.empty())
    kept = "; no checkpoint was saved before it (--save-every N saves one every N steps)";
  // Every rank holds the same loss and the same whole model: they all stop here, together.
  throw comm::CollectiveError(
      fmt::format("{}{}: training diverged and stopped without saving{}", what, before, kept));
}

void RankRun::stop_after_failed_output(int64_t step, const std::string& failed) {
  std::string kept;
  if (!cfg_.save_dir.empty()) {
    if (!checkpoint_due(step)) save(step + 1);
    kept = fmt::format(
        "; the checkpoint at step {} is saved in '{}': resume from it once the "
        "output can be written",
        step + 1, last_checkpoint_.folder);
  } else {
    kept = " (without --save, the model is lost)";
  }
  throw comm::CollectiveError(
      fmt::format("{}; training stopped after step {}{}", failed, step + 1, kept));
}

std::string RankRun::report_step(int64_t step, double loss, std::optional<double> val, double lr,
                                 double step_s) {
  if (!lead_) return {};
  const double tps = tokens_per_step() / step_s;
  if (metrics_) {
    io::StepMetrics sm;
    sm.step = step + 1;
    sm.loss = loss;
    sm.val_loss = val;
    sm.tokens_per_s = tps;
    sm.phase_s = phases_.phases();
    sm.extra = {{"lr", lr}, {"step_s", step_s}};
    if (const std::optional<double> norm = opt_.grad_norm())
      sm.extra.emplace_back("grad_norm", *norm);
    try {
      metrics_->write(sm);
    } catch (const UserError& e) {
      return e.what();
    }
  }
  if (progress_) progress_->update(step + 1, loss, val, tps);
  return {};
}

// --------------------------------------------------------------------------------- the end

int RankRun::agreed_stop_signal() {
  float sig = static_cast<float>(detail::StopSignals::received());
  grid_.world().all_reduce(Tensor::view_of(&sig, DType::F32, Shape{1}), comm::ReduceOp::Max);
  return static_cast<int>(sig);
}

void RankRun::finish(TrainResult& result) {
  const int64_t first = result.first_step;
  const int64_t ran = static_cast<int64_t>(result.losses.size());
  result.end_step = first + ran;
  result.tokens_per_s = ran > 0 && result.seconds > 0
                            ? tokens_per_step() * static_cast<double>(ran) / result.seconds
                            : 0.0;
  if (store()) {  // before the weights are gathered through it
    const parallel::BlockStore::Traffic t = steps_traffic_ = store()->traffic(),
                                        p = store()->predicted_step_traffic();
    result.resident_blocks = store()->resident();
    result.state_read_bytes = t.read_bytes;
    result.state_written_bytes = t.written_bytes;
    result.state_predicted_read = p.read_bytes;
    result.state_predicted_written = p.written_bytes;
    result.state_memory_bytes = model_state_memory(store()->resident());
  }
  if (state_.weights_sharded() && !store())
    result.state_memory_bytes =
        state_.sharded_bytes() + 2 * state_.resident_bytes() + state_.moment_bytes();
  if (cfg_.keep_weights) {
    std::vector<float> w = parallel::gather_weights(model_);
    if (lead_) result.weights = std::move(w);
  }
  if (ooc_) {
    result.ooc_plan = ooc_->plan().str();
    result.ooc_high_water = ooc_->high_water();
    result.ooc_predicted_peak = ooc_->predicted_peak();
    result.ooc_profile_cached = ooc_->profile_from_cache();
    result.ooc_predicted_s = ooc_->predicted_step_s();
    result.ooc_measured_s = ooc_->measured_step_s();
  }
  if (lead_) print_summary(result, ran);
}

void RankRun::print_summary(const TrainResult& result, int64_t ran) {
  if (progress_) progress_->finish();
  if (ran > 0) {
    std::string val;
    if (!result.val_losses.empty())
      val = fmt::format(" (validation {:.4f})", result.val_losses.back().second);
    out_ << fmt::format(
        "tandem train: {} steps in {:.1f} s ({:.3f} s/step, {:.0f} tokens/s); loss {:.4f} -> "
        "{:.4f}{}\n",
        ran, result.seconds, result.seconds / static_cast<double>(ran), result.tokens_per_s,
        result.losses.front(), result.losses.back(), val);
  }
  if (ooc_ && ran > 0) out_ << ooc_->summary_line();
  if (store() && ran > 0) {
    const parallel::BlockStore::Traffic t = steps_traffic_, p = store()->predicted_step_traffic();
    const double steps = static_cast<double>(ran);
    auto per_step = [&](uint64_t b) {
      return ooc::human_bytes(static_cast<uint64_t>(static_cast<double>(b) / steps));
    };
    out_ << fmt::format(
        "tandem train: model state (rank 0): {} read and {} written a step (predicted {} and {}), "
        "the tier busy {:.2f} s of each {:.2f} s step ({:.2f} GB/s while busy)\n",
        per_step(t.read_bytes), per_step(t.written_bytes), ooc::human_bytes(p.read_bytes),
        ooc::human_bytes(p.written_bytes), t.busy_s / steps, result.seconds / steps,
        t.busy_s > 0 ? static_cast<double>(t.read_bytes + t.written_bytes) / t.busy_s / 1e9 : 0.0);
    if (ooc_) {
      const double measured = ooc_->measured_step_s(), predicted = streamed_step_s();
      out_ << fmt::format(
          "tandem train: forward+backward with the model state streamed {:.3f} s median measured "
          "vs {:.3f} s predicted ({:+.1f}%)\n",
          measured, predicted, measured > 0 ? (predicted / measured - 1) * 100 : 0.0);
    }
  }
  if (result.stopped_by_signal != 0)
    out_ << fmt::format(
        "tandem train: stopped by {} after step {} of {}{}\n",
        result.stopped_by_signal == SIGINT ? "SIGINT" : "SIGTERM", result.end_step, cfg_.steps,
        cfg_.save_dir.empty() ? " (without --save, the model is lost)"
                              : fmt::format("; --resume {} continues it", cfg_.save_dir));
  if (!cfg_.save_dir.empty() && (ran > 0 || (!resumed() && last_checkpoint_.step >= 0)))
    out_ << fmt::format("tandem train: checkpoint at step {} in {}\n", last_checkpoint_.step,
                        last_checkpoint_.folder);
  out_.flush();
}

// ------------------------------------------------------------------------ phases and trace

void RankRun::on_event(std::string_view stream, std::string_view name, Clock::time_point b,
                       Clock::time_point e, double s) {
  if (profiling_) return;
  if (trace_ != nullptr && trace_->enabled())
    trace_->record(grid_.world().rank(), stream, name, b, e);
  if (!lead_) return;
  if (stream == io::kCommStream)
    phases_.add("comm", s);
  else if (name.substr(0, 7) == "forward")
    phases_.add("forward", s);
  else
    phases_.add("backward", s);
}

// A span from `begin` to now on this rank's row of the trace, when there is one.
void RankRun::trace_span(std::string_view stream, std::string_view name, Clock::time_point begin) {
  if (trace_ != nullptr && trace_->enabled())
    trace_->record(grid_.world().rank(), stream, name, begin, Clock::now());
}

// --shard weights: the prefetch distance given, or (auto) chosen from the performance model's
// compute and link rates, measured here (not the tiers').
TrainConfig with_gather_ahead(const TrainConfig& asked) {
  TrainConfig c = asked;
  if (c.optimizer.sharding != parallel::Sharding::Weights) return c;
  choose_gather_ahead(
      c, c.gather_ahead > 0 ? Rates{} : measure_rates(c, c.grid.size(), std::nullopt, false));
  return c;
}

}  // namespace

// --------------------------------------------------------------------------------- running

TrainResult train_rank(comm::Communicator& world, const TrainConfig& config,
                       io::TraceRecorder* trace, std::shared_ptr<const ResumeState> resume) {
  config.validate();
  if (!resume) resume = prepare_resume(config);
  // What this rank is doing, for the message of a collective that times out.
  struct Activity {
    Activity() { comm::set_comm_activity("the set-up"); }
    ~Activity() { comm::set_comm_activity(""); }
  } activity;
  RankRun run(world, config, trace, std::move(resume));
  return run.run();
}

TrainResult train(const TrainConfig& asked) {
  asked.validate();
  TrainConfig config = with_gather_ahead(asked);
  // SIGTERM and SIGINT stop the run after a step, with a checkpoint, rather than at once.
  const detail::StopSignals signals;
  // Before anything large is allocated: a run that cannot fit is refused, not killed.
  check_memory(config);
  // The run's own collective timeout, for its duration only.
  struct Timeout {
    explicit Timeout(const std::optional<double>& s) : set(s.has_value()) {
      if (set) comm::set_comm_timeout_s(*s);
    }
    ~Timeout() {
      if (set) comm::set_comm_timeout_s(-1);
    }
    bool set;
  } timeout(config.comm_timeout_s);
  const int ranks = config.grid.size();
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  blas::set_num_threads(config.blas_threads > 0 ? config.blas_threads
                                                : std::max(1, hw / local_ranks_for_blas(config)));
  io::TraceRecorder trace(!config.trace_path.empty() &&
                          !config.plan_only);  // tandem plan writes its own
  // Read the data and the checkpoint once, before any rank starts: their errors are the user's,
  // not one rank's (a split too short for a sequence is refused here too).
  const std::shared_ptr<const data::Corpus> corpus = detail::corpus_for(config);
  data::BatchSampler(corpus->train, config.batch, config.model.seq_len, config.seed);
  if (config.eval_every > 0)
    data::BatchSampler(corpus->validation, config.batch, config.model.seq_len, config.seed);
  const std::shared_ptr<const ResumeState> resume = prepare_resume(config);
  TrainResult result;
  if (config.backend == comm::Backend::Mpi) {
    std::unique_ptr<comm::Communicator> world = comm::mpi_world();
    // Each process measured its own rates for --gather-ahead auto; the ranks' gathers must agree,
    // so all take rank 0's choice (every process broadcasts, whatever its flags).
    const std::string chosen = comm::broadcast_string(
        *world, fmt::format("{} {}", config.gather_ahead, config.gather_ahead_choice));
    if (asked.gather_ahead == 0 && config.gather_ahead > 0) {
      const size_t space = chosen.find(' ');
      const int d = std::stoi(chosen.substr(0, space));
      config.gather_ahead_choice = chosen.substr(space + 1);
      if (d != config.gather_ahead) {
        config.gather_ahead = d;
        check_memory(config);
      }
    }
    detail::check_ranks_agree(*world, config, *corpus);  // before any collective that could hang
    // Every process sees the same sizes, so all refuse together and rank 0 alone says why.
    if (world->size() != ranks)
      throw comm::CollectiveError(fmt::format(
          "--backend mpi: the grid {} needs {} processes, but there {} {} (start it with mpirun "
          "-np {})",
          config.grid.str(), ranks, world->size() == 1 ? "is" : "are", world->size(), ranks));
    // Only rank 0 writes the outputs, on its own filesystem: it alone checks them (and, should
    // one be bad, fails alone; the tandem command then ends the job).
    std::optional<detail::SaveFolderLock> lock;
    if (world->rank() == 0) {
      detail::check_outputs(config);
      if (!config.save_dir.empty()) lock.emplace(config.save_dir);
    }
    result = train_rank(*world, config, &trace, resume);
    if (trace.enabled()) {
      // Each process recorded its own rank: rank 0 gathers them into one file.
      detail::gather_trace(*world, trace);
      if (world->rank() == 0) trace.write(config.trace_path);
    }
    return result;
  }
  detail::check_outputs(config);
  std::optional<detail::SaveFolderLock> lock;
  if (!config.save_dir.empty()) lock.emplace(config.save_dir);
  warn_thread_backend_under_mpirun(config);
  std::mutex mu;
  comm::run_ranks(ranks, [&](comm::Communicator& world) {
    TrainResult r = train_rank(world, config, &trace, resume);
    if (world.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      result = std::move(r);
    }
  });
  if (trace.enabled()) trace.write(config.trace_path);
  return result;
}

}  // namespace tandem::train
