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

#include "corpus_cache.h"
#include "out_of_core.h"
#include "output_paths.h"
#include "rank_batches.h"
#include "rank_run.h"
#include "run_checkpoint.h"
#include "schedule_choice.h"
#include "settings.h"
#include "tandem/comm/agree.h"
#include "tandem/comm/mpi.h"
#include "tandem/comm/thread.h"
#include "tandem/core/blas.h"
#include "tandem/core/bytes.h"
#include "tandem/core/clock.h"
#include "tandem/core/error.h"
#include "tandem/core/stop_signal.h"
#include "tandem/data/data.h"
#include "tandem/io/atomic_file.h"
#include "tandem/io/checkpoint_series.h"
#include "tandem/io/console.h"
#include "tandem/io/metrics.h"
#include "tandem/io/progress.h"
#include "tandem/ooc/transfer_engine.h"
#include "tandem/parallel/model.h"
#include "tandem/parallel/state_streamer.h"
#include "tandem/perf/tier_bandwidth.h"
#include "tandem/train/grid_plan.h"
#include "tandem/train/memory_estimate.h"

namespace tandem::train {
namespace {

// Whether the optimizer's communication thread may use the data-parallel group while the
// backward runs (comm::communication_thread_allowed): the backward communicates too where tp, pp
// or cp > 1, so under MPI that needs MPI_THREAD_MULTIPLE, else MPI_THREAD_SERIALIZED.
bool exchange_may_overlap(const comm::Communicator& world, const TrainConfig& c) {
  return comm::communication_thread_allowed(world, c.grid.tp > 1 || c.grid.pp > 1 || c.grid.cp > 1);
}

// --model-state's tier's bandwidth, for the store's predictions: measured by the performance
// model's probe before the store opens the tier (the probe would overwrite what it stores); a
// failure (a full disk) names the flag as the store's own would.
ooc::TierBandwidth model_state_bandwidth(const TrainConfig& c) {
  if (!c.model_state) return {};
  try {
    return perf::measure_tier(*c.model_state, perf::kTierProbeBytes,
                              "the model state's bandwidth probe (--model-state)");
  } catch (const UserError& e) {
    user_error("--model-state {}: {}", c.model_state->str(), e.what());
  }
}

}  // namespace

namespace detail {

// ----------------------------------------------------------------------------- one rank's run

// One rank's part of the training: set up on construction (its grid, data, schedules, model and
// optimizer), then run(): the weights initialised or restored, and the steps, each followed by
// the validation and checkpoint that fall due and the step's report.
RankRun::RankRun(comm::Communicator& world, const TrainConfig& cfg, io::TraceRecorder* trace,
                 std::shared_ptr<const ResumeState> resume)
    : cfg_(cfg),
      trace_(trace),
      resume_(std::move(resume)),
      grid_(world, cfg.grid),
      lead_(world.rank() == 0),
      corpus_(detail::corpus_for(cfg)),
      batches_(cfg, grid_),
      sampler_(corpus_->train, cfg.batch, cfg.model.seq_len, cfg.seed),
      schedules_(cfg_, grid_, cfg.executor),
      optimizer_(schedules_.optimizer()),
      ooc_(cfg.memory_budget.empty()
               ? nullptr
               : std::make_unique<detail::OutOfCore>(cfg, grid_, batches_.micro_rows(),
                                                     batches_.micro_batch_count(), engines_)),
      state_(parallel::ShardLayout(cfg.model, grid_.shape(), grid_.coord().tp, grid_.coord().pp),
             {cfg.model_state, cfg.optimizer.state_tier, batches_.micro_batch_count(),
              cfg.optimizer.sharding == parallel::Sharding::Weights, schedules_.gather_schedules(),
              cfg.gather_ahead_blocks(), model_state_bandwidth(cfg)},
             &grid_.dp().allocator(), &engines_),
      model_(cfg.model, grid_, batches_.micro_rows(), batches_.tokens(),
             batches_.micro_batch_count(), schedules_.model_programs(batches_.micro_rows()),
             ooc_ ? ooc_->memory() : nullptr, &state_),
      opt_(optimizer_.config, state_, grid_.dp(), optimizer_.schedules, cfg.executor,
           exchange_may_overlap(grid_.world(), cfg), &grid_.world()),
      out_(cfg.out != nullptr ? *cfg.out : std::cout) {
  if (store() != nullptr) {
    if (const int r = cfg.resident_blocks.value_or(0); r > 0)
      store()->set_resident(std::min(r, store()->blocks()));
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
  model_.set_event_sink([this](parallel::Phase phase, std::string_view name, Clock::time_point b,
                               Clock::time_point e,
                               double self_s) { on_event(phase, name, b, e, self_s); });
  // The data-parallel exchange of a block's gradients starts as soon as the backward is done
  // with it (docs/training.md says why that is safe).
  model_.set_gradients_ready([this](int layer) { opt_.layer_ready(layer); });
  opt_.set_segment_sink([this](std::string_view name, Clock::time_point b, Clock::time_point e) {
    if (!profiling_ && trace_ != nullptr && trace_->enabled())
      trace_->record(grid_.world().rank(), io::kExchangeStream, fmt::format("dp exchange {}", name),
                     b, e);
  });
  // --shard weights: the blocks' gathers share the exchange's thread and row.
  if (trace_ != nullptr && trace_->enabled())
    state_.set_gather_sink(
        [this](const std::string& name, Clock::time_point b, Clock::time_point e) {
          if (!profiling_) trace_->record(grid_.world().rank(), io::kExchangeStream, name, b, e);
        });
}

TrainResult RankRun::run() {
  TrainResult result;
  result.first_step = resume_ ? restore() : initialise();
  if (cfg_.plan_only) {  // tandem plan
    plan_out_of_core(result.first_step);
    if (lead_) print_plan();
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
    step_in_progress_ = step;
    comm::set_comm_activity(fmt::format("step {}", step + 1));
    const auto step_begin = Clock::now();
    const double lr = learning_rate(cfg_, step);
    const double loss = train_step(step, lr);
    const double step_s = seconds_since(step_begin);
    // A peer is at most about a step behind (every step ends in collectives that all ranks
    // join): after a stop signal, a wait gives up only past twice the slowest step seen.
    comm::raise_stop_grace_s(2 * step_s);
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
      const auto val_begin = Clock::now();
      val = validate();
      comm::raise_stop_grace_s(2 * seconds_since(val_begin));
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
    // SIGTERM or SIGINT, or the caller's on_step: every rank stops after this same step, with a
    // checkpoint.
    if (const int why = agreed_stop()) {
      if (!cfg_.save_dir.empty() && !checkpoint_due(step)) {
        comm::set_comm_activity(fmt::format("the checkpoint after step {}", step + 1));
        save(step + 1);
      }
      if (why == kStopAsked)
        result.stopped_by_caller = true;
      else
        result.stopped_by_signal = why;
      break;
    }
  }
  step_in_progress_ = kAfterTheSteps;
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
      grid_.world(), grid_.tp(), lead_ && cfg_.progress ? &out_ : nullptr);
  profiling_ = false;
  if (store() && cfg_.resident_blocks.is_auto() && !cfg_.resident_blocks.known())
    choose_resident_blocks();
}

// --resident-blocks auto: the count with the shortest predicted step
// (perf::fastest_resident_blocks). The one auto not decided by train::resolve before the ranks
// start: the prediction needs the out-of-core profile, measured by running the first step on this
// rank's own model in its own memory. The tensor-parallel group takes the fewest any rank chose
// (comm::all_min), so that their activation plans, and the collectives of what they recompute,
// stay the same.
void RankRun::choose_resident_blocks() {
  int best = perf::fastest_resident_blocks(
      store()->blocks(),
      [&](int r) { return ooc_->predicted_step_s_reserving(model_state_memory(r)); },
      [&](int r) { return store_io_s(r); });
  best = comm::all_min(grid_.tp(), best);
  cfg_.resident_blocks.decide(best, "the planner's choice");
  if (best == store()->resident()) return;
  // The activations give up their part of the budget (their arena's pages released) before the
  // resident blocks take it, so that the two are never in memory together.
  ooc_->reserve(model_state_memory(best), store_held(best));
  store()->set_resident(best);
}

// This rank's part of the checkpoint's weights and moments. Returns the step it was saved at.
int64_t RankRun::restore() {
  detail::restore_state(*resume_, model_, opt_);
  return resume_->meta.step;
}

// ------------------------------------------------------------------------------------ a step

// This rank's rows of the step's global batch forward and backward, the tied embedding's
// gradients summed, the optimizer applied. Returns the global batch's mean loss. Drawing the rows
// (windows copied out of the corpus: mapped shards or bytes) is on the step's critical path: the
// trace's "data" row and the "data" phase show what it costs.
double RankRun::train_step(int64_t step, double lr) {
  phases_.clear();
  const auto data_begin = Clock::now();
  // A shard that changed under the run fails its rank's draw: every rank learns of it before the
  // step's collectives, so that all save the model as it is and stop together.
  std::optional<data::Batch> drawn;
  std::string failed;
  try {
    drawn = batches_.draw(sampler_, step);
  } catch (const UserError& e) {
    failed = e.what();
  }
  if (!comm::all_true(grid_.world(), failed.empty())) stop_after_failed_input(step, failed);
  const data::Batch& b = *drawn;
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
  validating_ = true;
  const double loss = detail::validation_loss(model_, batches_, *val_sampler_, cfg_.eval_batches);
  validating_ = false;
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
  // Its ranks are alive and writing (rank 0 may write one tensor for long while the others wait):
  // a stop signal does not cut it short.
  const comm::ScopedStopGraceOff saving;
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

// --------------------------------------------------------------------------------- the end

int RankRun::agreed_stop() {
  return comm::all_max(grid_.world(), stop_asked_ ? kStopAsked : StopSignals::received());
}

void RankRun::stopped_waiting(const comm::StopWaitError& e) const {
  if (step_in_progress_ == kInSetUp) stopped_in_set_up(e);
  std::string last;
  if (last_checkpoint_.step >= 0)
    last = fmt::format("the last checkpoint is step {} in '{}'", last_checkpoint_.step,
                       last_checkpoint_.folder);
  else
    last = cfg_.save_dir.empty() ? "there is none (no --save)" : "there is none yet";
  const std::string what =
      step_in_progress_ == kAfterTheSteps
          ? std::string("the run stopped after its steps")
          : fmt::format("no checkpoint was written for step {}, the step in progress",
                        step_in_progress_ + 1);
  throw comm::StopWaitError(e.signal(), fmt::format("{}; {}; {}", e.what(), what, last));
}

[[noreturn]] void stopped_in_set_up(const comm::StopWaitError& e) {
  throw comm::StopWaitError(
      e.signal(), fmt::format("{}; the run stopped in its set-up, before its first step: no "
                              "training was lost",
                              e.what()));
}

void RankRun::finish(TrainResult& result) {
  const int64_t first = result.first_step;
  const int64_t ran = static_cast<int64_t>(result.losses.size());
  result.end_step = first + ran;
  result.tokens_per_s = ran > 0 && result.seconds > 0
                            ? tokens_per_step() * static_cast<double>(ran) / result.seconds
                            : 0.0;
  if (store()) {       // before the weights are gathered through it
    store()->flush();  // the last step's writes behind, counted when they complete
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

// ------------------------------------------------------------------------ phases and trace

void RankRun::on_event(parallel::Phase phase, std::string_view name, Clock::time_point b,
                       Clock::time_point e, double s) {
  using parallel::Phase;
  if (profiling_) return;
  if (trace_ != nullptr && trace_->enabled())
    trace_->record(grid_.world().rank(),
                   phase == Phase::Comm ? io::kCommStream : io::kComputeStream, name, b, e);
  if (!lead_ || validating_) return;
  phases_.add(phase == Phase::Embedding ? "embedding"
              : phase == Phase::Comm    ? "comm"
              : phase == Phase::Forward ? "forward"
                                        : "backward",
              s);
}

// A span from `begin` to now on this rank's row of the trace, when there is one.
void RankRun::trace_span(std::string_view stream, std::string_view name, Clock::time_point begin) {
  if (trace_ != nullptr && trace_->enabled())
    trace_->record(grid_.world().rank(), stream, name, begin, Clock::now());
}

}  // namespace detail

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
  std::optional<detail::RankRun> run;
  try {
    run.emplace(world, config, trace, std::move(resume));
  } catch (const comm::StopWaitError& e) {
    detail::stopped_in_set_up(e);
  }
  try {
    return run->run();
  } catch (const comm::StopWaitError& e) {
    run->stopped_waiting(e);
  }
}

TrainResult train(const TrainConfig& asked) {
  if (!asked.grid_auto) asked.validate();  // --grid auto: once the plan has chosen (resolve)
  // SIGTERM and SIGINT stop the run after a step, with a checkpoint, rather than at once.
  const StopSignals signals("tandem train", "this step");
  const comm::ScopedCommTimeout timeout(asked.comm_timeout_s);
  // After the first signal, a wait for a peer that never comes gives up (communicator.h).
  const comm::ScopedStopGrace stop_grace;
  std::unique_ptr<comm::Communicator> world;
  if (asked.backend == comm::Backend::Mpi) world = comm::mpi_world();
  // Validated, every auto but --resident-blocks decided.
  const TrainConfig config = resolve(asked, world.get());
  // Before anything large is allocated, and before the BLAS is loaded: a run that cannot fit is
  // refused, not killed (under an address-space limit, the BLAS and its threads counted too).
  check_memory(config);
  const int ranks = config.grid.size();
  blas::set_num_threads(blas_threads_for(config));
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
  detail::warn_thread_backend_under_mpirun(config);
  std::mutex mu;
  comm::run_ranks(ranks, [&](comm::Communicator& rank_world) {
    TrainResult r = train_rank(rank_world, config, &trace, resume);
    if (rank_world.rank() == 0) {
      std::lock_guard<std::mutex> lock(mu);
      result = std::move(r);
    }
  });
  if (trace.enabled()) trace.write(config.trace_path);
  return result;
}

}  // namespace tandem::train
