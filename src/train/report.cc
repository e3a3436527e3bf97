// What `tandem train` prints and writes about a run: the start-up lines (the model, the grid,
// the precision, the programs and their schedules, the other settings and the autos' decisions
// as the settings table gives them, memory, the model state's placement), each
// step's report (metrics and progress), the end's summary, the messages of a run that stops, and
// tandem plan's report; and the MPI processes' traces gathered into one.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <iostream>
#include <string>

#include "rank_run.h"
#include "settings.h"
#include "tandem/comm/agree.h"
#include "tandem/comm/mpi.h"
#include "tandem/core/bf16.h"
#include "tandem/core/bytes.h"
#include "tandem/core/gemm.h"
#include "tandem/exec/jit.h"
#include "tandem/io/atomic_file.h"
#include "tandem/io/console.h"
#include "tandem/parallel/sharded_blocks.h"
#include "tandem/perf/flops.h"
#include "tandem/train/grid_plan.h"
#include "tandem/train/memory_estimate.h"

namespace tandem::train::detail {

// ------------------------------------------------------------------------------- start-up

std::string RankRun::store_held(int r) {
  return fmt::format(
      "the model state in memory (slots, embeddings and ln_f{})",
      r == 0 ? std::string() : fmt::format(", {} resident block{}", r, r == 1 ? "" : "s"));
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
      io::ProgressOptions po;
      po.terminal = cfg_.out == nullptr && io::is_terminal(stdout);
      progress_ = std::make_unique<io::Progress>(out_, cfg_.steps, po, first);
    }
  }
  if (resumed() && first >= cfg_.steps && lead_)
    out_ << fmt::format(
        "tandem train: the checkpoint is at step {}, --steps is {}: nothing to do\n", first,
        cfg_.steps);
}

void RankRun::print_header(int64_t first_step) {
  const nn::GPTConfig& c = cfg_.model;
  out_ << fmt::format(
      "tandem train: {} {} layers x d_model {} ({} heads{}{}, {:.2f}M parameters) on {}, "
      "{} x {} tokens a step{}, {} ranks ({}, {} backend){}\n",
      c.llama() ? "Llama" : "GPT", c.n_layers, c.d_model, c.n_heads,
      c.llama() ? fmt::format(", {} key/value heads, MLP {}", c.n_kv_heads(), c.mlp_width()) : "",
      c.attention == nn::AttentionKernel::Unfused ? ", unfused attention" : "",
      static_cast<double>(nn::gpt_num_parameters(c)) / 1e6,
      corpus_->source == "synthetic" ? "the synthetic corpus" : corpus_->source, cfg_.batch,
      c.seq_len,
      c.max_positions > c.seq_len ? fmt::format(" (the model's positions {})", c.max_positions)
                                  : "",
      cfg_.grid.size(), cfg_.grid.str(), comm::backend_name(cfg_.backend),
      resumed() ? fmt::format(", resuming at step {} from {}", first_step, resume_->folder)
      : resume_ ? fmt::format(", starting from the Hugging Face folder {}", resume_->folder)
                : "");
  if (!cfg_.grid_choice.empty()) out_ << "  " << cfg_.grid_choice << "\n";
  out_ << "  " << grid_.mapping() << "\n";
  if (const std::string w = grid_.warning(); !w.empty()) out_ << "tandem train: " << w << "\n";
  out_ << detail::precision_line(c.matmul);
  out_ << detail::work_line(cfg_);
  out_ << fmt::format("  learning rate {:g}{}, warm-up {} step{}, cosine decay to {:g}\n", cfg_.lr,
                      cfg_.lr_choice.empty() ? "" : fmt::format(" ({})", cfg_.lr_choice),
                      cfg_.warmup, cfg_.warmup == 1 ? "" : "s", cfg_.lr * cfg_.min_lr_ratio);
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
    programs +=
        fmt::format("; {} schedule {}", model_.epilogue_program(), model_.epilogue_schedule());
  if (!model_.tp_sum_schedule().empty())
    programs += fmt::format("; sum_in_place schedule {}", model_.tp_sum_schedule());
  if (!model_.pipeline_schedule().empty())
    programs += fmt::format("; {} schedule {}, gradients back by grad_handoff",
                            model_.pipeline_program(), model_.pipeline_schedule());
  if (!model_.executor().empty() && model_.executor() != opt_.executor_name())
    programs += fmt::format(" ({})", model_.executor());
  const int M = batches_.micro_batch_count();
  if (M > 1)
    programs += fmt::format("; {} micro-batches of {} rows, 1F1B", M, batches_.micro_rows());
  programs += schedules_.from_autotuner()
                  ? (cfg_.tune ? "; schedules autotuned" : "; schedules from the autotuner's cache")
                  : "; schedules by preference (no autotuner record: --tune makes one)";
  out_ << programs << "\n";
  // The rest of the settings, from the settings table: those the user changed, and each auto's
  // decision with its reason (settings.h's startup_lines).
  out_ << startup_lines(cfg_, *corpus_);
  out_ << memory_line(cfg_);
  if (ooc_) out_ << ooc_->plan_line();
  out_.flush();
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
    const std::string share = opt_.state_sliced() && cfg_.grid.replicas() > 1
                                  ? fmt::format(", 1/{} of the model's", cfg_.grid.replicas())
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

// --shard weights: how far ahead the blocks' weights are gathered, and why.
std::string RankRun::gather_ahead_text() const {
  const Auto<int>& d = cfg_.gather_ahead;
  const int n = state_.options().gather_ahead;
  return fmt::format("gathers {} block{} ahead{}", n, n == 1 ? "" : "s",
                     !d.is_auto() ? fmt::format(" (--gather-ahead {})", n)
                     : d.known()  ? fmt::format(" ({})", d.reason())
                                  : "");
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
        cfg_.grid.replicas(), l.first_layer(), l.end_layer() - 1, cfg_.grid.replicas(),
        parallel::ShardedBlocks::gather_slots(state_.options().gather_ahead),
        state_.gather_chunk_bytes() != 0
            ? fmt::format(" at {}-byte chunks", state_.gather_chunk_bytes())
            : std::string(),
        gather_ahead_text(),
        batches_.micro_batch_count() > 1
            ? "summed over the micro-batches in memory"
            : fmt::format("in {} slots", parallel::ShardedBlocks::kGradientSlots),
        human_bytes(state_.sharded_bytes() + state_.moment_bytes()),
        human_bytes(2 * state_.resident_bytes()));
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
                        store()->end_layer() - 1, human_bytes(store()->resident_bytes(r)),
                        cfg_.resident_blocks.is_auto() ? cfg_.resident_blocks.reason()
                                                       : "--resident-blocks");
  return sharded +
         fmt::format(
             "  model state: blocks h.{}..h.{} (weights, gradients, optimizer state) in {}, {} a "
             "rank, "
             "streamed through {} of slots{}, about {} read and {} written a step: {:.2f} s of I/O "
             "at "
             "the tier's measured {:.2f} GB/s read, {:.2f} GB/s write; the embeddings and ln_f in "
             "memory ({}{})\n",
             store()->first_layer(), store()->end_layer() - 1, store()->describe(),
             human_bytes(store()->tier_bytes()), human_bytes(store()->staging_bytes()),
             resident_note, human_bytes(p.read_bytes), human_bytes(p.written_bytes),
             store_io_s(store()->resident()), bw.read_bytes_per_s / 1e9, bw.write_bytes_per_s / 1e9,
             human_bytes(2 * state_.resident_bytes() + state_.moment_bytes()),
             ooc_ ? " of --memory-budget" : "");
}

// ---------------------------------------------------------------------------- each step

// The lead rank's metrics line and progress; returns a failed metrics write's error (else "").
// Under MPI every process has a caller of its own (a Python script a process): config.on_step
// runs on every rank there, with the same all-reduced loss and this rank's times.
std::string RankRun::report_step(int64_t step, double loss, std::optional<double> val, double lr,
                                 double step_s) {
  const double tps = tokens_per_step() / step_s;
  const auto metrics = [&] {
    io::StepMetrics sm;
    sm.step = step + 1;
    sm.loss = loss;
    sm.val_loss = val;
    sm.tokens_per_s = tps;
    sm.phase_s = phases_.phases();
    sm.extra = {{"lr", lr}, {"step_s", step_s}};
    if (const std::optional<double> norm = opt_.grad_norm())
      sm.extra.emplace_back("grad_norm", *norm);
    return sm;
  };
  if (!lead_) {
    if (cfg_.on_step && cfg_.backend == comm::Backend::Mpi && !cfg_.on_step(metrics()))
      stop_asked_ = true;
    return {};
  }
  if (steps_reported_++ > 0 && std::isfinite(loss)) {
    for (const auto& [phase, s] : phases_.phases()) phase_totals_[phase] += s;
    measured_steps_s_ += step_s;
    ++steps_measured_;
  }
  if (metrics_ || cfg_.on_step) {
    const io::StepMetrics sm = metrics();
    std::string failed;
    if (metrics_) {
      try {
        metrics_->write(sm);
      } catch (const UserError& e) {
        failed = e.what();
      }
    }
    // After the line is written, so that a caller reading the file finds it there.
    if (cfg_.on_step && !cfg_.on_step(sm)) stop_asked_ = true;
    if (!failed.empty()) return failed;
  }
  if (progress_) progress_->update(step + 1, loss, val, tps);
  return {};
}

// ----------------------------------------------------------------------------- the end

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

void RankRun::stop_after_failed_input(int64_t step, const std::string& failed) {
  // The first failing rank's message, on every rank (the others' is "").
  std::string why;
  for (const std::string& m : comm::all_gather_strings(grid_.world(), failed))
    if (why.empty() && !m.empty()) why = m;
  std::string kept;
  if (!cfg_.save_dir.empty()) {
    if (last_checkpoint_.step != step) save(step);  // the model after step `step`, this one unrun
    kept = fmt::format(
        "; the checkpoint at step {} is saved in '{}': resume from it once the data is whole", step,
        last_checkpoint_.folder);
  } else {
    kept = " (without --save, the model is lost)";
  }
  throw comm::CollectiveError(
      fmt::format("{}; training stopped before step {}{}", why, step + 1, kept));
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
  if (ran > 0) out_ << breakdown_lines();
  if (const parallel::ContextParallelAttention* cp = model_.context(); cp != nullptr && ran > 0) {
    // How much of the attention's exchanges the products hid (the lead rank's, every step).
    const parallel::ContextOverlapTimes& t = cp->overlap_times();
    out_ << fmt::format(
        "tandem train: context parallelism ({} order{}): the kv exchanges ran {:.3f} s, {:.3f} s "
        "of it waited for ({:.0f}% hidden)\n",
        parallel::context_order_name(cp->order()),
        cp->overlapping() || cp->order() == parallel::ContextOrder::Sequential
            ? ""
            : ", the exchanges on the calling thread",
        t.exchanged_s, t.waited_s,
        t.exchanged_s > 0 ? 100.0 * std::max(0.0, 1.0 - t.waited_s / t.exchanged_s) : 0.0);
  }
  if (ooc_ && ran > 0) out_ << ooc_->summary_line();
  if (store() && ran > 0) {
    const parallel::BlockStore::Traffic t = steps_traffic_, p = store()->predicted_step_traffic();
    const double steps = static_cast<double>(ran);
    auto per_step = [&](uint64_t b) {
      return human_bytes(static_cast<uint64_t>(static_cast<double>(b) / steps));
    };
    out_ << fmt::format(
        "tandem train: model state (rank 0): {} read and {} written a step (predicted {} and {}), "
        "the tier busy {:.2f} s of each {:.2f} s step ({:.2f} GB/s while busy)\n",
        per_step(t.read_bytes), per_step(t.written_bytes), human_bytes(p.read_bytes),
        human_bytes(p.written_bytes), t.busy_s / steps, result.seconds / steps,
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
  if (result.stopped_by_caller)
    out_ << fmt::format(
        "tandem train: stopped by the caller after step {} of {}{}\n", result.end_step, cfg_.steps,
        cfg_.save_dir.empty() ? " (without --save, the model is lost)"
                              : fmt::format("; --resume {} continues it", cfg_.save_dir));
  if (!cfg_.save_dir.empty() && (ran > 0 || (!resumed() && last_checkpoint_.step >= 0)))
    out_ << fmt::format("tandem train: checkpoint at step {} in {}\n", last_checkpoint_.step,
                        last_checkpoint_.folder);
  out_.flush();
}

std::string RankRun::breakdown_lines() const {
  if (!lead_ || steps_measured_ == 0) return "";
  const double n = static_cast<double>(steps_measured_);
  auto mean = [&](const char* phase) {
    const auto it = phase_totals_.find(phase);
    return it == phase_totals_.end() ? 0.0 : it->second / n;
  };
  // What the phases can tell apart: compute (the model's forward and backward spans, swap stalls
  // inside them), the model's communication programs (tp epilogues, hand-offs and the waits for
  // them: a pipeline's bubble is among them), the wait for the data-parallel exchange and update
  // after the backward, and the rest of the step (the batch drawn, the embedding, the loss, the
  // rest).
  const double step = measured_steps_s_ / n, compute = mean("forward") + mean("backward");
  const double comm = mean("comm"), wait = mean("optimizer wait");
  std::string out = fmt::format(
      "tandem train: step breakdown measured (rank 0, mean of {} step{} after the first): "
      "compute {:.4f} + exchange {:.4f} (tp, hand-offs, gathers; pipeline waits and bubble "
      "included) + exchange and update after the backward {:.4f} + other {:.4f} = {:.4f} s; "
      "swap stalls not told apart from compute\n",
      steps_measured_, steps_measured_ == 1 ? "" : "s", compute, comm, wait,
      step - compute - comm - wait, step);
  const std::optional<double> link =
      cfg_.grid_auto ? cfg_.grid_auto->link_gbps : std::optional<double>();
  const perf::RateRequest q = rate_request(cfg_, cfg_.grid.size(), link);
  std::optional<perf::Rates> rates;
  try {  // a cache folder that is not there or not private: no prediction, said below
    rates = perf::load_cached_rates(exec::jit_cache_dir(), q.key());
  } catch (const UserError&) {
  }
  if (!rates)
    return out + fmt::format(
                     "tandem train: step breakdown predicted: no rates cached for this shape "
                     "(`tandem plan --ranks {}` with the same flags measures them)\n",
                     cfg_.grid.size());
  try {
    const perf::StepBreakdown b = predict_step(cfg_, *rates);
    out += fmt::format(
        "tandem train: step breakdown predicted: compute {:.4f} + exchange {:.4f} + io {:.4f} + "
        "bubble {:.4f} + cores {:.4f} + update {:.4f} + other {:.4f} = {:.4f} s ({:+.1f}% of the "
        "measured step)\n",
        b.compute, b.exposed_exchange, b.exposed_io, b.bubble, b.cores, b.update, b.other,
        b.total(), step > 0 ? (b.total() / step - 1) * 100 : 0.0);
  } catch (const UserError& e) {
    out += fmt::format("tandem train: step breakdown predicted: none ({})\n", e.what());
  }
  return out;
}

// tandem plan: the activations' plan, the model state's, and the largest model that fits.
void RankRun::print_plan() {
  out_ << ooc_->plan_line() << "\n" << ooc_->report() << model_state_line();
  if (store())
    out_ << fmt::format(
        "predicted forward+backward with the model state streamed: {:.3f} s, the longer of "
        "compute with the activation plan ({:.3f} s) and the tier's I/O ({:.3f} s){}\n",
        streamed_step_s(), ooc_->predicted_step_s(), state_io_s(),
        swaps_share_the_state_tier() ? " (the model state's and the activations' swaps: one disk)"
                                     : "");
  out_ << largest_model_line(cfg_);
  if (!cfg_.trace_path.empty()) {
    io::write_file_atomic(cfg_.trace_path, ooc_->predicted_trace());
    out_ << fmt::format("predicted timeline written to {}\n", cfg_.trace_path);
  }
  out_.flush();
}

// ------------------------------------------------------------------------- the whole run

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

std::string work_line(const TrainConfig& cfg) {
  const double token = perf::step_flops_per_token(cfg.model, cfg.model.seq_len);
  return fmt::format(
      "  work: {:.4e} FLOP a token, {:.4e} a step (the matmuls, forward and backward, no "
      "recomputation)\n",
      token, token * static_cast<double>(cfg.batch) * cfg.model.seq_len);
}

std::string precision_line(DType matmul) {
  if (matmul == DType::BF16)
    return fmt::format(
        "  precision bf16: the linear layers' and the LM head's matmuls on bf16 operands with f32 "
        "accumulation, through {}; attention, LayerNorm, softmax, GELU, the loss, the optimizer "
        "and the master weights in f32 ({})\n",
        gemm_library(DType::BF16), bf16_describe());
  return fmt::format("  precision fp32: every matmul in f32, through {} ({}{})\n",
                     gemm_library(DType::F32), bf16_describe(),
                     bf16_native() ? "; --precision bf16 or auto would use it" : "");
}

// Each process sends its trace's JSON after its clock origin; rank 0 merges them.
void gather_trace(comm::Communicator& world, io::TraceRecorder& trace) {
  const std::vector<std::string> texts =
      comm::gather_strings(world, fmt::format("{}\n{}", trace.origin_ns(), trace.json()));
  for (size_t r = 1; r < texts.size(); ++r) {
    const size_t line = texts[r].find('\n');
    trace.merge(texts[r].substr(line + 1), std::stoll(texts[r].substr(0, line)));
  }
}

}  // namespace tandem::train::detail
