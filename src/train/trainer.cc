// The training loop: set-up (grid, data, model, optimizer, checkpoint restore), the steps, the
// validation, checkpoints, metrics, trace and progress, on every rank of the grid.
#include "tandem/train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "tandem/comm/mpi.h"
#include "tandem/comm/thread.h"
#include "tandem/core/blas.h"
#include "tandem/core/error.h"
#include "tandem/dsl/workloads.h"
#include "tandem/exec/jit.h"
#include "tandem/parallel/model.h"
#include "tandem/schedule/enumerate.h"
#include "tandem/tune/cache.h"
#include "tandem/tune/executor.h"
#include "tandem/tune/tune.h"
#include "tandem/train/data.h"
#include "tandem/train/metrics.h"
#include "tandem/train/progress.h"

namespace tandem::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The validation batches are drawn under their own seed, so that they never coincide with the
// training batches' offsets by construction.
constexpr uint64_t kValidationSeedTag = 0x76616c69646174ull;  // "validat"

// The corpus, built once per process and shared by the in-process ranks (the synthetic corpus
// takes a moment to generate; a file is read once).
std::shared_ptr<const Corpus> corpus_for(const TrainConfig& c) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<const Corpus>> cache;
  const size_t bytes = c.synthetic_bytes > 0 ? c.synthetic_bytes : kSyntheticBytes;
  const std::string key = fmt::format("{}|{}|{}", c.data, bytes, c.validation_fraction);
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  auto corpus = std::make_shared<const Corpus>(
      c.data.empty() ? synthetic_corpus(bytes, kSyntheticSeed, c.validation_fraction)
                     : load_text_corpus(c.data, c.validation_fraction));
  if (cache.size() > 8) cache.clear();
  cache[key] = corpus;
  return corpus;
}

Tensor f32_view(float* p, Shape s) { return Tensor::view_of(p, DType::F32, std::move(s)); }

// ------------------------------------------------------------------------- whole-model views

// The whole model's weights assembled from every rank's shard: each tensor written by one rank
// (dp rank 0, its writer among tp ranks and stages) into a zeroed buffer, then summed over the
// world (adding zeros is exact). A collective over the world.
std::vector<float> gather_weights(const parallel::ParallelGPT& model, int64_t global_size) {
  std::vector<float> whole(static_cast<size_t>(global_size), 0.0f);
  const parallel::Grid& grid = model.grid();
  if (grid.coord().dp == 0)
    model.layout().deposit(model.params().data_as<float>(), 0, model.layout().size(), whole.data());
  grid.world().all_reduce(f32_view(whole.data(), Shape{global_size}), comm::ReduceOp::Sum);
  return whole;
}

// The optimizer's moments likewise: each dp rank deposits the pieces it keeps (all of them when
// the state is sliced; dp rank 0's whole copy otherwise).
std::pair<std::vector<float>, std::vector<float>> gather_moments(
    const parallel::ParallelGPT& model, const DataParallelOptimizer& opt, int64_t global_size) {
  std::vector<float> m(static_cast<size_t>(global_size), 0.0f), v(m.size(), 0.0f);
  const parallel::Grid& grid = model.grid();
  if (opt.state_sliced() || grid.coord().dp == 0) {
    for (const DataParallelOptimizer::Piece& pc : opt.pieces()) {
      model.layout().deposit(pc.m.data_as<float>(), pc.begin, pc.end, m.data());
      model.layout().deposit(pc.v.data_as<float>(), pc.begin, pc.end, v.data());
    }
  }
  grid.world().all_reduce(f32_view(m.data(), Shape{global_size}), comm::ReduceOp::Sum);
  grid.world().all_reduce(f32_view(v.data(), Shape{global_size}), comm::ReduceOp::Sum);
  return {std::move(m), std::move(v)};
}

// Copies this rank's pieces of whole-model moments into the optimizer's state.
void scatter_moments(const parallel::ParallelGPT& model, const DataParallelOptimizer& opt,
                     const std::vector<float>& m, const std::vector<float>& v) {
  for (const DataParallelOptimizer::Piece& pc : opt.pieces()) {
    model.layout().for_each_run(pc.begin, pc.end, false,
                                [&](const parallel::LocalTensor&, const parallel::FlatRun& r) {
      const int64_t at = r.local - pc.begin;
      std::memcpy(pc.m.data_as<float>() + at, m.data() + r.global,
                  static_cast<size_t>(r.count) * sizeof(float));
      std::memcpy(pc.v.data_as<float>() + at, v.data() + r.global,
                  static_cast<size_t>(r.count) * sizeof(float));
    });
  }
}

// Whole-model tensors from a checkpoint file's list, each checked for presence and shape.
std::vector<float> whole_from(const std::vector<NamedTensor>& tensors, const nn::GPTConfig& c,
                              const std::string& prefix, const std::string& file) {
  std::map<std::string, const Tensor*, std::less<>> by_name;
  for (const NamedTensor& t : tensors) by_name[t.name] = &t.tensor;
  std::vector<float> whole(static_cast<size_t>(nn::gpt_num_parameters(c)));
  for (const nn::ParamSpec& s : nn::gpt_parameter_specs(c)) {
    const std::string name = prefix + s.name;
    auto it = by_name.find(name);
    if (it == by_name.end())
      user_error("checkpoint file '{}' has no tensor '{}', which this model needs", file, name);
    const Tensor& t = *it->second;
    if (!(t.shape() == s.shape))
      user_error("tensor '{}' in '{}' has shape {}; this model needs {}", name, file,
                 t.shape().str(), s.shape.str());
    if (t.dtype() == DType::F32) {
      std::memcpy(whole.data() + s.offset, t.data(), static_cast<size_t>(s.numel()) * sizeof(float));
    } else {
      for (int64_t i = 0; i < s.numel(); ++i) whole[static_cast<size_t>(s.offset + i)] = t.get(i);
    }
  }
  return whole;
}

std::vector<NamedTensor> named_views(std::vector<float>& whole, const nn::GPTConfig& c,
                                     const std::string& prefix) {
  std::vector<NamedTensor> out;
  for (const nn::ParamSpec& s : nn::gpt_parameter_specs(c))
    out.push_back({prefix + s.name, f32_view(whole.data() + s.offset, s.shape)});
  return out;
}

int local_ranks_for_blas(const TrainConfig& c) {
  if (c.backend == "thread") return c.grid.size();
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  if (local == nullptr) local = std::getenv("MPI_LOCALNRANKS");
  return local != nullptr ? std::max(1, std::atoi(local)) : 1;
}

// Seconds per named phase of one step, in the order phases first ran.
class Phases {
 public:
  void add(std::string_view phase, double seconds) {
    for (auto& [name, s] : phases_)
      if (name == phase) {
        s += seconds;
        return;
      }
    phases_.emplace_back(std::string(phase), seconds);
  }
  void clear() { phases_.clear(); }
  const std::vector<std::pair<std::string, double>>& phases() const { return phases_; }

 private:
  std::vector<std::pair<std::string, double>> phases_;
};

}  // namespace

// What a resumed run starts from, read and checked once per process (so that every rank does
// not read the files, and a refusal is one message rather than one per rank).
struct ResumeState {
  RunMeta meta;
  std::vector<float> weights, m, v;  // whole-model layout
  std::vector<std::string> warnings;
};

std::shared_ptr<const ResumeState> prepare_resume(const TrainConfig& cfg) {
  if (cfg.resume_dir.empty()) return nullptr;
  const std::string& dir = cfg.resume_dir;
  const Checkpoint ck = load_checkpoint(dir, true);
  const RunMeta& meta = ck.meta;
  check_config_compatible(dir, meta.model_config, model_config_to_json(cfg.model),
                          model_compat_keys());
  if (meta.optimizer != cfg.optimizer.name)
    user_error("checkpoint '{}' was trained with optimizer {}, this run asks for {}", dir,
               meta.optimizer, cfg.optimizer.name);
  auto r = std::make_shared<ResumeState>();
  r->meta = meta;
  const std::string weights_file = dir + "/" + std::string(kWeightsFile);
  const std::string opt_file = dir + "/" + std::string(kOptimizerFile);
  r->weights = whole_from(ck.weights, cfg.model, "", weights_file);
  r->m = whole_from(ck.optimizer, cfg.model, "m.", opt_file);
  r->v = whole_from(ck.optimizer, cfg.model, "v.", opt_file);

  const std::shared_ptr<const Corpus> corpus = corpus_for(cfg);
  if (meta.data_fingerprint != corpus->fingerprint_hex())
    r->warnings.push_back(fmt::format(
        "checkpoint '{}' was trained on {} (fingerprint {}); this run reads {} (fingerprint {}), "
        "so its batches differ from the original run's",
        dir, meta.data_source, meta.data_fingerprint, corpus->source, corpus->fingerprint_hex()));
  const nlohmann::json& x = meta.extra;
  if (x.contains("batch") && x["batch"] != cfg.batch)
    r->warnings.push_back(fmt::format("checkpoint '{}' was trained with batch {}, this run uses {}",
                                      dir, x["batch"].dump(), cfg.batch));
  if (meta.rng_seed != cfg.seed)
    r->warnings.push_back(fmt::format("checkpoint '{}' was trained with seed {}, this run uses {}",
                                      dir, meta.rng_seed, cfg.seed));
  return r;
}

namespace {

// ---------------------------------------------------------------------------- MPI traces

// Gathers every MPI rank's trace events into rank 0's recorder: each rank sends its trace JSON
// and its clock origin; rank 0 re-records the complete events shifted onto its own origin (one
// monotonic clock on one machine; across machines the shift is only as good as their clocks).
// Messages carry bytes in a 16-bit tensor with a 16-byte header: the length and the origin.
void gather_trace(comm::Communicator& world, TraceRecorder& trace) {
  constexpr int kTraceTag = 30001;
  const double origin_ns = static_cast<double>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(trace.origin().time_since_epoch()).count());
  if (world.rank() != 0) {
    const std::string text = trace.json();
    Tensor header = Tensor::zeros(DType::BF16, Shape{8});
    const uint64_t n = text.size();
    std::memcpy(header.data(), &n, 8);
    std::memcpy(static_cast<char*>(header.data()) + 8, &origin_ns, 8);
    world.send(header, 0, kTraceTag);
    Tensor body = Tensor::zeros(DType::BF16, Shape{static_cast<int64_t>((n + 1) / 2)});
    std::memcpy(body.data(), text.data(), n);
    world.send(body, 0, kTraceTag);
    return;
  }
  for (int r = 1; r < world.size(); ++r) {
    Tensor header = Tensor::zeros(DType::BF16, Shape{8});
    world.recv(header, r, kTraceTag);
    uint64_t n = 0;
    double their_origin_ns = 0;
    std::memcpy(&n, header.data(), 8);
    std::memcpy(&their_origin_ns, static_cast<const char*>(header.data()) + 8, 8);
    Tensor body = Tensor::zeros(DType::BF16, Shape{static_cast<int64_t>((n + 1) / 2)});
    world.recv(body, r, kTraceTag);
    const auto j = nlohmann::json::parse(std::string(static_cast<const char*>(body.data()), n));
    const double shift_us = (their_origin_ns - origin_ns) / 1e3;
    for (const auto& e : j.at("traceEvents"))
      if (e.value("ph", "") == "X")
        trace.record_us(e.at("pid").get<int>(), e.value("cat", "compute"), e.at("name").get<std::string>(),
                        e.at("ts").get<double>() + shift_us, e.at("dur").get<double>());
  }
}

// ------------------------------------------------------------------------- schedule choice

std::shared_ptr<tune::Executor> tune_executor(parallel::ExecutorKind kind) {
  switch (kind) {
    case parallel::ExecutorKind::Compiled: return tune::compiled_executor();
    case parallel::ExecutorKind::Plan: return tune::plan_executor();
    case parallel::ExecutorKind::Reference: return tune::interpreter_executor();
  }
  internal_error("bad ExecutorKind");
}

// The autotuner's schedule for `program` on `comm` at `sizes`: tuned now when `tune_now` (every
// candidate, or those in `only`, timed on this communicator and the choice cached), else read
// from the tuning cache (rank 0 reads, every rank gets its answer; "" when there is no record).
// A collective over `comm`.
std::string tuned_schedule(const dsl::Program& program, comm::Communicator& comm,
                           const dsl::SymbolMap& sizes, bool tune_now, parallel::ExecutorKind executor,
                           const std::vector<std::string>& only = {}) {
  tune::TuneOptions o;
  o.sizes = sizes;
  o.only = only;
  o.executor = tune_executor(executor);
  if (tune_now) return tune::tune(program, comm, o).record.winner;
  std::string winner;
  if (comm.rank() == 0) {
    const tune::TuneKey key = tune::tune_key(program, comm.size(), comm.backend(), o);
    std::string stale;
    if (auto record = tune::load_record(key, exec::jit_cache_dir(), &stale)) winner = record->winner;
    if (!stale.empty())
      fmt::print(stderr, "train: {}; `tandem train --tune` or `tandem tune {}` makes a new one\n", stale,
                 program.name());
  }
  return comm::broadcast_string(comm, winner);
}

// Puts `first` (when set) ahead of `rest`.
std::vector<std::string> prefer(const std::string& first, std::vector<std::string> rest) {
  if (!first.empty()) rest.insert(rest.begin(), first);
  return rest;
}

// ----------------------------------------------------------------------------- one rank's run

class RankRun {
 public:
  RankRun(comm::Communicator& world, const TrainConfig& cfg, TraceRecorder* trace,
          std::shared_ptr<const ResumeState> resume)
      : cfg_(cfg),
        trace_(trace),
        resume_(std::move(resume)),
        grid_(world, cfg.grid),
        lead_(world.rank() == 0),
        corpus_(corpus_for(cfg)),
        M_(cfg.micro_batch_count()),
        rows_(static_cast<int>(cfg.batch / cfg.grid.dp / M_)),
        T_(cfg.model.seq_len),
        sampler_(corpus_->train, cfg.batch, T_, cfg.seed),
        executor_(parallel::executor_from_name(cfg.executor, "--executor")),
        model_(cfg.model, grid_, rows_, T_, M_, model_programs()),
        opt_(cfg.optimizer, model_.layout(), grid_.dp(), optimizer_schedules(), executor_),
        out_(cfg.out != nullptr ? *cfg.out : std::cout) {
    if (cfg.eval_every > 0)
      val_sampler_.emplace(corpus_->validation, cfg.batch, T_, cfg.seed ^ kValidationSeedTag);
    model_.set_event_sink([this](std::string_view stream, std::string_view name, Clock::time_point b,
                                 Clock::time_point e, double self_s) { on_event(stream, name, b, e, self_s); });
  }

  TrainResult run();

 private:
  void on_event(std::string_view stream, std::string_view name, Clock::time_point b,
                Clock::time_point e, double self_s);
  parallel::ProgramOptions model_programs();
  std::vector<std::string> optimizer_schedules();
  std::vector<parallel::MicroBatch> micro_batches(const Batch& b) const;
  double global_mean(double contribution);
  double validation_loss();
  void initialise();
  int64_t restore();
  void save(int64_t step);
  void print_header(int64_t first_step);
  std::string message_prefix() const { return "tandem train: "; }

  const TrainConfig& cfg_;
  TraceRecorder* trace_;
  std::shared_ptr<const ResumeState> resume_;
  parallel::Grid grid_;
  bool lead_;
  std::shared_ptr<const Corpus> corpus_;
  int M_, rows_, T_;
  BatchSampler sampler_;
  std::optional<BatchSampler> val_sampler_;
  parallel::ExecutorKind executor_;
  bool tuned_ = false;  // some schedule came from the autotuner
  parallel::ParallelGPT model_;
  DataParallelOptimizer opt_;
  std::ostream& out_;
  Phases phases_;
};

// The Megatron and pipeline programs' schedules: the autotuner's for this micro-batch size when
// it has (or, with --tune, now makes) a record, else the preference lists. Each choice is made
// on the communicator the program runs on, so all its ranks agree.
parallel::ProgramOptions RankRun::model_programs() {
  parallel::ProgramOptions o;
  o.executor = executor_;
  const int64_t N = static_cast<int64_t>(rows_) * T_, C = cfg_.model.d_model;
  const dsl::SymbolMap sizes = {{"B", N}, {"K", 4 * C}, {"H", C}};
  const double p = cfg_.model.dropout;
  bool shard = cfg_.grid.tp > 1 || (cfg_.grid.pp > 1 && !grid_.last_stage());
  if (shard) {
    const std::string w = tuned_schedule(dsl::workloads::megatron_layer(DType::F32, p), grid_.tp(),
                                         sizes, cfg_.tune, executor_);
    tuned_ |= !w.empty();
    o.epilogue_schedules = prefer(w, o.epilogue_schedules);
  }
  // The pipeline program runs on each link, chosen on the link so that both ends agree: the
  // link from the previous stage first, as ParallelGPT sets them up.
  if (grid_.from_prev() != nullptr) {
    const std::string w = tuned_schedule(dsl::workloads::pipeline_stage(DType::F32, p),
                                         *grid_.from_prev(), sizes, cfg_.tune, executor_);
    tuned_ |= !w.empty();
    o.pipeline_recv_schedules = prefer(w, o.pipeline_recv_schedules);
  }
  if (grid_.to_next() != nullptr) {
    const std::string w = tuned_schedule(dsl::workloads::pipeline_stage(DType::F32, p),
                                         *grid_.to_next(), sizes, cfg_.tune, executor_);
    tuned_ |= !w.empty();
    o.pipeline_schedules = prefer(w, o.pipeline_schedules);
  }
  return o;
}

// The optimizer's schedule likewise, on the data-parallel group; with dp > 1 among the schedules
// that keep the optimizer state sliced (ZeRO-1). LAMB runs one program per tensor at many sizes
// and keeps the preference list.
std::vector<std::string> RankRun::optimizer_schedules() {
  if (cfg_.optimizer.name != "adamw") return optimizer_schedule_preferences();
  const dsl::Program program = optimizer_program(cfg_.optimizer);
  std::vector<std::string> only;
  if (cfg_.grid.dp > 1)
    for (const schedule::NamedSchedule& s : schedule::enumerate_schedules(program))
      if (s.name.find("+slice(") != std::string::npos) only.push_back(s.name);
  const parallel::ShardLayout layout(cfg_.model, cfg_.grid, grid_.coord().tp, grid_.coord().pp);
  const std::string w = tuned_schedule(program, grid_.dp(), {{"N", layout.size()}}, cfg_.tune,
                                       executor_, only);
  tuned_ |= !w.empty();
  return prefer(w, optimizer_schedule_preferences());
}

void RankRun::on_event(std::string_view stream, std::string_view name, Clock::time_point b,
                       Clock::time_point e, double s) {
  if (trace_ != nullptr && trace_->enabled()) trace_->record(grid_.world().rank(), stream, name, b, e);
  if (!lead_) return;
  if (stream == "comm") phases_.add("comm", s);
  else if (name.substr(0, 7) == "forward") phases_.add("forward", s);
  else phases_.add("backward", s);
}

std::vector<parallel::MicroBatch> RankRun::micro_batches(const Batch& b) const {
  std::vector<parallel::MicroBatch> out;
  const int64_t first_row = static_cast<int64_t>(grid_.coord().dp) * (cfg_.batch / cfg_.grid.dp);
  for (int k = 0; k < M_; ++k) {
    const size_t at = static_cast<size_t>(k) * static_cast<size_t>(rows_) * static_cast<size_t>(T_);
    out.push_back({b.inputs.data() + at, b.targets.data() + at, rows_, T_,
                   first_row + static_cast<int64_t>(k) * rows_});
  }
  return out;
}

// Each last-stage rank of tp rank 0 contributes its share; the sum over the world is the mean.
double RankRun::global_mean(double contribution) {
  const bool counts = grid_.last_stage() && grid_.coord().tp == 0;
  float v = counts ? static_cast<float>(contribution) : 0.0f;
  grid_.world().all_reduce(f32_view(&v, Shape{1}), comm::ReduceOp::Sum);
  return v;
}

double RankRun::validation_loss() {
  const auto begin = Clock::now();
  double sum = 0.0;
  for (int64_t i = 0; i < cfg_.eval_batches; ++i) {
    const Batch b = val_sampler_->rank_share(i, grid_.coord().dp, cfg_.grid.dp);
    sum += model_.forward(micro_batches(b));
  }
  const double loss = global_mean(sum / (static_cast<double>(M_) * cfg_.grid.dp * cfg_.eval_batches));
  if (lead_) phases_.add("eval", seconds_since(begin));
  if (trace_ != nullptr && trace_->enabled())
    trace_->record(grid_.world().rank(), kComputeStream, "validation", begin, Clock::now());
  return loss;
}

void RankRun::initialise() {
  // GPT-2's initialisation of the whole model (keyed by element index), then this rank's part.
  nn::ParameterSet whole(cfg_.model);
  nn::gpt_init(whole, cfg_.seed);
  model_.layout().extract(whole.flat().data_as<float>(), model_.params().data_as<float>());
}

int64_t RankRun::restore() {
  model_.layout().extract(resume_->weights.data(), model_.params().data_as<float>());
  scatter_moments(model_, opt_, resume_->m, resume_->v);
  return resume_->meta.step;
}

void RankRun::save(int64_t step) {
  const auto begin = Clock::now();
  const int64_t n = nn::gpt_num_parameters(cfg_.model);
  std::vector<float> w = gather_weights(model_, n);
  auto [m, v] = gather_moments(model_, opt_, n);
  if (lead_) {
    Checkpoint ck;
    ck.meta.model_config = model_config_to_json(cfg_.model);
    ck.meta.step = step;
    ck.meta.data_source = corpus_->source;
    ck.meta.data_fingerprint = corpus_->fingerprint_hex();
    ck.meta.data_position = step;  // the sampler is counter-based: the next step to draw
    ck.meta.rng_seed = cfg_.seed;
    ck.meta.rng_counter = step;    // dropout keys are (seed, step)
    ck.meta.optimizer = cfg_.optimizer.name;
    nlohmann::json h = cfg_.optimizer.to_json();
    h["lr"] = cfg_.lr;
    h["warmup"] = cfg_.warmup;
    h["min_lr_ratio"] = cfg_.min_lr_ratio;
    ck.meta.optimizer_hparams = h;
    ck.meta.extra = {{"batch", cfg_.batch},
                     {"steps", cfg_.steps},
                     {"micro_batches", M_},
                     {"grid", {{"dp", cfg_.grid.dp}, {"tp", cfg_.grid.tp}, {"pp", cfg_.grid.pp}}},
                     {"validation_fraction", cfg_.validation_fraction}};
    ck.weights = named_views(w, cfg_.model, "");
    ck.optimizer = named_views(m, cfg_.model, "m.");
    for (NamedTensor& t : named_views(v, cfg_.model, "v.")) ck.optimizer.push_back(std::move(t));
    save_checkpoint(cfg_.save_dir, ck);
    phases_.add("checkpoint", seconds_since(begin));
  }
  // Nobody runs ahead of a checkpoint being written (a failed save aborts the group).
  grid_.world().barrier();
}

void RankRun::print_header(int64_t first_step) {
  const nn::GPTConfig& c = cfg_.model;
  out_ << fmt::format(
      "tandem train: GPT {} layers x d_model {} ({} heads, {:.2f}M parameters) on {}, "
      "{} x {} tokens a step, {} ranks ({}, {} backend){}\n",
      c.n_layers, c.d_model, c.n_heads, static_cast<double>(nn::gpt_num_parameters(c)) / 1e6,
      corpus_->source == "synthetic" ? "the synthetic corpus" : corpus_->source, cfg_.batch, T_,
      cfg_.grid.size(), cfg_.grid.str(), cfg_.backend,
      first_step > 0 ? fmt::format(", resuming at step {}", first_step) : "");
  std::string programs = fmt::format("  optimizer {}: program {} schedule {} ({})",
                                     cfg_.optimizer.name, cfg_.optimizer.name == "lamb" ? "lamb" : "adam",
                                     opt_.schedule_name(), opt_.executor_name());
  if (!model_.epilogue_schedule().empty())
    programs += fmt::format("; megatron_layer schedule {}", model_.epilogue_schedule());
  if (!model_.pipeline_schedule().empty())
    programs += fmt::format("; pipeline_stage schedule {}", model_.pipeline_schedule());
  if (!model_.executor().empty() && model_.executor() != opt_.executor_name())
    programs += fmt::format(" ({})", model_.executor());
  if (M_ > 1) programs += fmt::format("; {} micro-batches of {} rows, 1F1B", M_, rows_);
  programs += tuned_ ? (cfg_.tune ? "; schedules autotuned" : "; schedules from the autotuner's cache")
                     : "; schedules by preference (no autotuner record: --tune makes one)";
  out_ << programs << "\n";
  out_.flush();
}

TrainResult RankRun::run() {
  TrainResult result;
  int64_t first = 0;
  if (resume_) first = restore();
  else initialise();
  result.first_step = first;
  result.optimizer_schedule = opt_.schedule_name();
  result.epilogue_schedule = model_.epilogue_schedule();
  result.pipeline_schedule = model_.pipeline_schedule();
  result.executor = opt_.executor_name();

  std::unique_ptr<MetricsWriter> metrics;
  std::unique_ptr<Progress> progress;
  if (lead_) {
    if (resume_)
      for (const std::string& w : resume_->warnings) out_ << "tandem train: warning: " << w << "\n";
    print_header(first);
    if (!cfg_.metrics_path.empty())
      metrics = std::make_unique<MetricsWriter>(cfg_.metrics_path, first > 0);
    if (cfg_.progress) {
      ProgressOptions po;
      po.terminal = cfg_.out == nullptr && is_terminal(stdout);
      progress = std::make_unique<Progress>(out_, cfg_.steps, po, first);
    }
  }
  if (first >= cfg_.steps && lead_)
    out_ << fmt::format("tandem train: the checkpoint is at step {}, --steps is {}: nothing to do\n",
                        first, cfg_.steps);

  const double tokens_per_step = static_cast<double>(cfg_.batch) * T_;
  const auto run_begin = Clock::now();
  double first_loss = 0.0, last_loss = 0.0;
  for (int64_t step = first; step < cfg_.steps; ++step) {
    const auto step_begin = Clock::now();
    phases_.clear();
    const Batch b = sampler_.rank_share(step, grid_.coord().dp, cfg_.grid.dp);
    model_.grads().fill(0.0f);
    const double loss_sum = model_.forward_backward(micro_batches(b), cfg_.seed, static_cast<uint64_t>(step));
    model_.reduce_tied_gradients();
    const double lr = learning_rate(cfg_, step);
    {
      const auto begin = Clock::now();
      opt_.step(model_.params(), model_.grads(), lr, step + 1);
      if (lead_) phases_.add("optimizer", seconds_since(begin));
      if (trace_ != nullptr && trace_->enabled())
        trace_->record(grid_.world().rank(), kCommStream, "optimizer " + opt_.schedule_name(), begin,
                       Clock::now());
    }
    const double loss = global_mean(loss_sum / (static_cast<double>(M_) * cfg_.grid.dp));
    const double step_s = seconds_since(step_begin);
    std::optional<double> val;
    const bool last = step + 1 == cfg_.steps;
    if (val_sampler_ && ((step + 1) % cfg_.eval_every == 0 || last)) {
      val = validation_loss();
      result.val_losses.emplace_back(step + 1, *val);
    }
    if (!cfg_.save_dir.empty() && (last || (cfg_.save_every > 0 && (step + 1) % cfg_.save_every == 0)))
      save(step + 1);
    result.losses.push_back(loss);
    if (step == first) first_loss = loss;
    last_loss = loss;
    if (lead_) {
      const double tps = tokens_per_step / step_s;
      if (metrics) {
        StepMetrics sm;
        sm.step = step + 1;
        sm.loss = loss;
        sm.val_loss = val;
        sm.tokens_per_s = tps;
        sm.phase_s = phases_.phases();
        sm.extra = {{"lr", lr}, {"step_s", step_s}};
        metrics->write(sm);
      }
      if (progress) progress->update(step + 1, loss, val, tps);
    }
  }
  result.end_step = std::max(first, cfg_.steps);
  result.seconds = seconds_since(run_begin);
  const int64_t ran = cfg_.steps - first;
  result.tokens_per_s = ran > 0 && result.seconds > 0 ? tokens_per_step * static_cast<double>(ran) / result.seconds : 0.0;
  if (cfg_.keep_weights) {
    std::vector<float> w = gather_weights(model_, nn::gpt_num_parameters(cfg_.model));
    if (lead_) result.weights = std::move(w);
  }
  if (lead_) {
    if (progress) progress->finish();
    if (ran > 0) {
      std::string val;
      if (!result.val_losses.empty()) val = fmt::format(" (validation {:.4f})", result.val_losses.back().second);
      out_ << fmt::format("tandem train: {} steps in {:.1f} s ({:.3f} s/step, {:.0f} tokens/s); loss {:.4f} -> {:.4f}{}\n",
                          ran, result.seconds, result.seconds / static_cast<double>(ran),
                          result.tokens_per_s, first_loss, last_loss, val);
    }
    if (!cfg_.save_dir.empty() && ran > 0)
      out_ << fmt::format("tandem train: checkpoint at step {} in {}\n", cfg_.steps, cfg_.save_dir);
    out_.flush();
  }
  return result;
}

}  // namespace

// ---------------------------------------------------------------------------------- config

int TrainConfig::micro_batch_count() const {
  if (micro_batches > 0) return micro_batches;
  return grid.pp > 1 ? 2 * grid.pp : 1;
}

void TrainConfig::validate() const {
  model.validate();
  if (model.vocab_size != kByteVocab)
    user_error("the model's vocabulary is {}; tandem trains on bytes (256 tokens)", model.vocab_size);
  if (batch < 1) user_error("--batch {} must be at least 1", batch);
  if (steps < 0) user_error("--steps {} must be 0 or more", steps);
  if (!(lr > 0) || !std::isfinite(lr)) user_error("--lr {} must be positive", lr);
  if (warmup < 0) user_error("--warmup {} must be 0 or more", warmup);
  if (!(min_lr_ratio >= 0 && min_lr_ratio <= 1))
    user_error("the minimum learning-rate ratio {} must be in [0, 1]", min_lr_ratio);
  optimizer.validate();
  if (grid.dp < 1 || grid.tp < 1 || grid.pp < 1)
    user_error("--dp {}, --tp {}, --pp {}: each must be at least 1", grid.dp, grid.tp, grid.pp);
  if (backend != "thread" && backend != "mpi")
    user_error("--backend {}: the backends are thread and mpi", backend);
  parallel::executor_from_name(executor, "--executor");
  if (micro_batches < 0) user_error("--micro-batches {} must be 0 (automatic) or more", micro_batches);
  if (model.n_heads % grid.tp != 0)
    user_error("--tp {} must divide the number of heads ({})", grid.tp, model.n_heads);
  if (grid.pp > model.n_layers)
    user_error("--pp {} needs at least {} layers; the model has {}", grid.pp, grid.pp, model.n_layers);
  if (batch % grid.dp != 0)
    user_error("--batch {} does not split evenly over --dp {} data-parallel ranks", batch, grid.dp);
  const int M = micro_batch_count();
  if ((batch / grid.dp) % M != 0)
    user_error("each data-parallel rank's {} rows do not split evenly into {} micro-batches "
               "(--batch {}, --dp {}, --micro-batches {})",
               batch / grid.dp, M, batch, grid.dp, M);
  if (!(validation_fraction >= 0 && validation_fraction < 1))
    user_error("the validation fraction {} must be in [0, 1)", validation_fraction);
  if (eval_every < 0) user_error("--eval-every {} must be 0 (never) or more", eval_every);
  if (eval_every > 0 && eval_batches < 1)
    user_error("--eval-batches {} must be at least 1", eval_batches);
  if (eval_every > 0 && validation_fraction <= 0)
    user_error("validation every {} steps needs a validation split (fraction > 0)", eval_every);
  if (save_every < 0) user_error("--save-every {} must be 0 or more", save_every);
  if (save_every > 0 && save_dir.empty()) user_error("--save-every needs --save DIR");
  if (blas_threads < 0) user_error("--threads {} must be 0 (automatic) or more", blas_threads);
}

double learning_rate(const TrainConfig& c, int64_t step) {
  if (c.warmup > 0 && step < c.warmup)
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup);
  const double min_lr = c.lr * c.min_lr_ratio;
  const int64_t span = c.steps - c.warmup;
  if (span <= 1) return c.lr;
  const double t = std::min(1.0, static_cast<double>(step - c.warmup) / static_cast<double>(span - 1));
  return min_lr + 0.5 * (c.lr - min_lr) * (1.0 + std::cos(M_PI * t));
}

// --------------------------------------------------------------------------------- running

TrainResult train_rank(comm::Communicator& world, const TrainConfig& config, TraceRecorder* trace,
                       std::shared_ptr<const ResumeState> resume) {
  config.validate();
  if (!resume) resume = prepare_resume(config);
  RankRun run(world, config, trace, std::move(resume));
  return run.run();
}

TrainResult train(const TrainConfig& config) {
  config.validate();
  const int ranks = config.grid.size();
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  blas::set_num_threads(config.blas_threads > 0 ? config.blas_threads
                                                : std::max(1, hw / local_ranks_for_blas(config)));
  TraceRecorder trace(!config.trace_path.empty());
  // Read the data and the checkpoint once, before any rank starts: their errors are the user's,
  // not one rank's (a split too short for a sequence is refused here too).
  const std::shared_ptr<const Corpus> corpus = corpus_for(config);
  BatchSampler(corpus->train, config.batch, config.model.seq_len, config.seed);
  if (config.eval_every > 0)
    BatchSampler(corpus->validation, config.batch, config.model.seq_len, config.seed);
  const std::shared_ptr<const ResumeState> resume = prepare_resume(config);
  TrainResult result;
  if (config.backend == "mpi") {
    std::unique_ptr<comm::Communicator> world = comm::mpi_world();
    if (world->size() != ranks)
      user_error("--backend mpi: the grid {} needs {} processes, but there {} {} (start it with "
                 "mpirun -np {})",
                 config.grid.str(), ranks, world->size() == 1 ? "is" : "are", world->size(), ranks);
    result = train_rank(*world, config, &trace, resume);
    if (trace.enabled()) {
      // Each process recorded its own rank: rank 0 gathers them into one file.
      gather_trace(*world, trace);
      if (world->rank() == 0) trace.write(config.trace_path);
    }
    return result;
  }
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

// ------------------------------------------------------------------------- eval and sample

nlohmann::json model_config_to_json(const nn::GPTConfig& c) {
  return {{"vocab_size", c.vocab_size}, {"n_layers", c.n_layers},         {"n_heads", c.n_heads},
          {"d_model", c.d_model},       {"seq_len", c.seq_len},           {"max_positions", c.max_positions},
          {"dropout", c.dropout}};
}

std::vector<std::string> model_compat_keys() {
  return {"vocab_size", "n_layers", "n_heads", "d_model", "max_positions"};
}

nn::GPTConfig model_config_from_json(const nlohmann::json& j, const std::string& source) {
  auto get_int = [&](const char* key) -> int {
    if (!j.contains(key) || !j[key].is_number_integer())
      user_error("{}: the model config has no integer '{}'", source, key);
    return j[key].get<int>();
  };
  nn::GPTConfig c;
  c.vocab_size = get_int("vocab_size");
  c.n_layers = get_int("n_layers");
  c.n_heads = get_int("n_heads");
  c.d_model = get_int("d_model");
  c.seq_len = get_int("seq_len");
  c.max_positions = get_int("max_positions");
  if (j.contains("dropout")) {
    if (!j["dropout"].is_number()) user_error("{}: the model config's 'dropout' is not a number", source);
    c.dropout = j["dropout"].get<float>();
  }
  try {
    c.validate();
  } catch (const UserError& e) {
    user_error("{}: {}", source, e.what());
  }
  return c;
}

LoadedModel load_model(const std::string& dir) {
  Checkpoint ck = load_checkpoint(dir, false);
  const nn::GPTConfig config =
      model_config_from_json(ck.meta.model_config, "checkpoint '" + dir + "'");
  LoadedModel out{config, nn::ParameterSet(config), ck.meta};
  const std::vector<float> w =
      whole_from(ck.weights, config, "", dir + "/" + std::string(kWeightsFile));
  std::memcpy(out.params.flat().data(), w.data(), w.size() * sizeof(float));
  return out;
}

std::pair<double, int64_t> evaluate_windows(const nn::ParameterSet& params,
                                            const std::vector<uint8_t>& tokens, int seq_len,
                                            int batch, int64_t max_windows) {
  const nn::GPTConfig& c = params.config();
  if (seq_len < 1 || seq_len > c.max_positions)
    user_error("--seq-len {} must be in [1, {}] for this model", seq_len, c.max_positions);
  if (batch < 1) user_error("--batch {} must be at least 1", batch);
  TokenSplit split{"the data", "all of it", std::make_shared<const std::vector<uint8_t>>(tokens)};
  int64_t windows = window_count(split, seq_len);
  if (windows == 0)
    user_error("the data has {} bytes; evaluation needs at least seq_len + 1 = {}", tokens.size(),
               seq_len + 1);
  if (max_windows > 0) windows = std::min(windows, max_windows);
  double sum = 0.0;
  std::unique_ptr<nn::GPTActivations> acts;
  std::unique_ptr<nn::Workspace> ws;
  for (int64_t w = 0; w < windows; w += batch) {
    const int rows = static_cast<int>(std::min<int64_t>(batch, windows - w));
    if (!acts || acts->batch() != rows) {
      acts = std::make_unique<nn::GPTActivations>(c, rows, seq_len);
      ws = std::make_unique<nn::Workspace>(c, rows, seq_len);
    }
    const Batch b = window_batch(split, seq_len, w, rows);
    const nn::Batch nb{b.inputs.data(), b.targets.data(), rows, seq_len};
    const float loss = nn::gpt_forward(params, *acts, *ws, nb, nn::StepRng{0, 0, 0, false});
    sum += static_cast<double>(loss) * rows;  // the mean over equal-length windows
  }
  return {sum / static_cast<double>(windows), windows * seq_len};
}

}  // namespace tandem::train
