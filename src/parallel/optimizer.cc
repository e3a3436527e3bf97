// The data-parallel AdamW / LAMB step: the optimizer program run on the data-parallel group with
// its schedule, over this rank's shard of the parameters.
#include "tandem/parallel/optimizer.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <utility>

#include "tandem/core/dtype.h"
#include "tandem/core/error.h"
#include "tandem/core/formulas.h"
#include "tandem/dsl/workloads.h"
#include "tandem/ooc/slow_tier.h"
#include "tiered_state.h"

namespace tandem::parallel {

std::string_view optimizer_name(OptimizerKind kind) {
  return kind == OptimizerKind::Lamb ? "lamb" : "adamw";
}

std::string_view grad_exchange_name(GradExchange exchange) {
  return exchange == GradExchange::After ? "after" : "overlap";
}

void OptimizerConfig::validate() const {
  if (grad_dtype != DType::F32 && grad_dtype != DType::BF16)
    user_error("--grad-dtype {}: the gradient dtypes are f32 and bf16", dtype_name(grad_dtype));
  if (!(beta1 >= 0 && beta1 < 1)) user_error("--beta1 {} must be in [0, 1)", beta1);
  if (!(beta2 >= 0 && beta2 < 1)) user_error("--beta2 {} must be in [0, 1)", beta2);
  if (!(eps > 0)) user_error("--eps {} must be positive", eps);
  if (!(weight_decay >= 0)) user_error("--weight-decay {} must be 0 or more", weight_decay);
  if (bucket_mb && !(*bucket_mb > 0 && std::isfinite(*bucket_mb)))
    user_error("--bucket-mb {} must be a positive number of MiB", *bucket_mb);
  if (clip_grad_norm && !(*clip_grad_norm > 0 && std::isfinite(*clip_grad_norm)))
    user_error("--clip-grad-norm {} must be a positive number (the largest norm of the gradient)",
               *clip_grad_norm);
}

nlohmann::json OptimizerConfig::to_json() const {
  nlohmann::json j = {{"beta1", beta1},
                      {"beta2", beta2},
                      {"eps", eps},
                      {"weight_decay", weight_decay},
                      {"grad_dtype", dtype_name(grad_dtype)}};
  if (clip_grad_norm) j["clip_grad_norm"] = *clip_grad_norm;
  return j;
}

dsl::Program optimizer_program(const OptimizerConfig& config) {
  const DType g = config.grad_dtype;
  return config.kind == OptimizerKind::Lamb ? dsl::workloads::lamb_bucket(g)
                                            : dsl::workloads::adam(g);
}

std::vector<std::string> optimizer_schedule_preferences() {
  // ZeRO-1 as one program: the update runs inside the ReduceScatter's per-chunk hook on this
  // rank's 1/dp of the elements, the new weights are AllGathered, and the moments are stored
  // sliced.
  return {"fused(RS-C-AG)+slice(m,v)", "RS-C-AG+slice(m,v)", "AR-C"};
}

DataParallelOptimizer::DataParallelOptimizer(const OptimizerConfig& config,
                                             const ShardLayout& layout, Tensor params, Tensor grads,
                                             comm::Communicator& dp,
                                             const SchedulePreferences& schedules,
                                             exec::RunnerKind executor, bool overlap_allowed,
                                             comm::Communicator* world)
    : config_(config), params_(std::move(params)), grads_(std::move(grads)), dp_(dp) {
  config.validate();
  TANDEM_CHECK(params_.dtype() == DType::F32 && grads_.dtype() == DType::F32 &&
                   params_.numel() == layout.size() && grads_.numel() == layout.size(),
               "params {} and grads {} for a layout of {}", params_.str(), grads_.str(),
               layout.size());
  if (config.clip_grad_norm) {
    // Clipping needs the whole gradient's norm before any update, so the step runs in two halves:
    // the reduction as written (during the backward), then, once the norm is known, the update
    // with its slice computed inside the AllGather, the moments sliced as the program declares.
    runner_ = std::make_unique<ProgramRunner>(dsl::workloads::grad_reduce(config.grad_dtype),
                                              std::vector<std::string>{"C"}, executor);
    update_runner_ = std::make_unique<ProgramRunner>(
        config.kind == OptimizerKind::Lamb ? dsl::workloads::lamb_bucket_update(config.grad_dtype)
                                           : dsl::workloads::adam_update(config.grad_dtype),
        std::vector<std::string>{"fused(C)", "C"}, executor);
    norm_runner_ = std::make_unique<ProgramRunner>(dsl::workloads::grad_norm(),
                                                   std::vector<std::string>{"C"}, executor);
    norm_ = norm_runner_->prepare(world != nullptr ? *world : dp, {});
    sliced_ = true;
  } else {
    const bool given = !schedules.names.empty();
    runner_ = std::make_unique<ProgramRunner>(
        optimizer_program(config), given ? schedules.names : optimizer_schedule_preferences(),
        executor, given ? schedules.chunk_bytes : 0);
    const dsl::Program& p = runner_->program();
    const std::optional<int> m_id = p.find("m");
    TANDEM_CHECK(m_id.has_value(), "optimizer program '{}' has no input m", p.name());
    sliced_ = p.stage(*m_id).type.layout.is_sliced();
  }

  // Segments in launch order: the blocks in backward order, then the rest (ln_f and the head's
  // wte after the blocks; wte and wpe before them).
  const int first = layout.first_layer(), end = layout.end_layer();
  const int64_t blocks_begin = layout.block_range(first).first,
                blocks_end = layout.block_range(end - 1).second;
  // Buckets of whole blocks for both optimizers; LAMB's program takes a bucket's tensors as its
  // segments (each with its own trust ratio).
  const double bucket_bytes = config.bucket_mb.value_or(kDefaultBucketMiB) * (1 << 20);
  // Whole blocks, from the last: a bucket closes once it holds bucket_bytes.
  int64_t top = blocks_end;
  int top_layer = end - 1;
  for (int l = end - 1; l >= first; --l) {
    const int64_t bottom = layout.block_range(l).first;
    if (static_cast<double>(top - bottom) * sizeof(float) >= bucket_bytes || l == first) {
      add_segment(layout,
                  l == top_layer ? fmt::format("h.{}", l) : fmt::format("h.{}..h.{}", top_layer, l),
                  bottom, top, l);
      ++buckets_;
      top = bottom;
      top_layer = l - 1;
    }
  }
  // The rest, named by their first and last tensors.
  auto named = [&](int64_t b, int64_t e) {
    std::string first_name, last_name;
    for (const LocalTensor& lt : layout.tensors())
      if (lt.local_offset >= b && lt.local_offset < e) {
        if (first_name.empty()) first_name = lt.name;
        last_name = lt.name;
      }
    return first_name == last_name ? first_name : first_name + ".." + last_name;
  };
  if (blocks_end < layout.size())
    add_segment(layout, named(blocks_end, layout.size()), blocks_end, layout.size(),
                kAfterBackward);
  if (blocks_begin > 0)
    add_segment(layout, named(0, blocks_begin), 0, blocks_begin, kAfterBackward);
  if (config.state_tier) {
    std::vector<int64_t> lengths;
    for (const Piece& pc : pieces_) lengths.push_back(pc.end - pc.begin);
    try {
      tier_ = std::make_unique<detail::TieredState>(*config.state_tier, lengths);
    } catch (const UserError& e) {
      user_error("--optimizer-state {}: {}", config.state_tier->str(), e.what());
    }
  }
  if (config.exchange == GradExchange::Overlap && overlap_allowed)
    worker_ = std::make_unique<SerialWorker>();
}

// The communication thread first: its jobs use the tier.
DataParallelOptimizer::~DataParallelOptimizer() { worker_.reset(); }

// Sets up the program (or with clipping, both halves) for local elements [begin, end) on the
// data-parallel group, bound to the model's buffers.
void DataParallelOptimizer::add_segment(const ShardLayout& layout, std::string name, int64_t begin,
                                        int64_t end, int ready_layer) {
  const int64_t n = end - begin;
  const bool bind_grads =
      runner_->program().stage(*runner_->program().find("g")).type.dtype == DType::F32;
  const bool in_memory = !config_.state_tier;
  const bool clipped = update_runner_ != nullptr;
  std::vector<std::string> bound = {"w"};                 // the one step's or the update's
  if (!in_memory) bound.insert(bound.end(), {"m", "v"});  // the tier's staging, bound at each run
  Segment seg{segments_.size(), std::move(name), begin, end, ready_layer, false, nullptr,
              nullptr,          bind_grads,      {},    0};
  const std::vector<std::string> grads_bound =
      bind_grads ? std::vector<std::string>{"g"} : std::vector<std::string>{};
  // LAMB: the segment's tensors, each with its trust ratio (dsl/ir.h's segments).
  dsl::SymbolMap symbols{{"N", n}};
  dsl::Segments tensors;
  if (config_.kind == OptimizerKind::Lamb) {
    tensors = {0};
    for (const LocalTensor& lt : layout.tensors())
      if (lt.local_offset >= begin && lt.local_offset < end) {
        TANDEM_CHECK(
            lt.local_offset == begin + tensors.back() && lt.local_offset + lt.numel() <= end,
            "tensor {} at [{}, {}) cuts segment {} [{}, {})", lt.name, lt.local_offset,
            lt.local_offset + lt.numel(), seg.name, begin, end);
        tensors.push_back(lt.local_offset + lt.numel() - begin);
      }
    TANDEM_CHECK(tensors.back() == n, "the tensors of segment {} cover {} of its {} elements",
                 seg.name, tensors.back(), n);
    symbols["S"] = static_cast<int64_t>(tensors.size()) - 1;
    tensors_ += static_cast<int>(tensors.size()) - 1;
  }
  if (clipped) {
    seg.runner = runner_->prepare(dp_, {{"N", n}}, grads_bound);
    bound.push_back("g_sum");
    seg.update = update_runner_->prepare(dp_, symbols, bound, tensors);
    seg.update->bind("g_sum", seg.runner->output("g_sum"));
  } else {
    if (bind_grads) bound.push_back("g");
    seg.runner = runner_->prepare(dp_, symbols, bound, tensors);
  }
  exec::Runner& updater = clipped ? *seg.update : *seg.runner;
  updater.bind("w", params_.flat_slice(begin, n));
  if (bind_grads) seg.runner->bind("g", grads_.flat_slice(begin, n));
  const int P = dp_.size(), r = dp_.rank();
  Piece piece;
  piece.begin = sliced_ ? begin + fx::part_offset(n, P, r) : begin;
  piece.end = sliced_ ? piece.begin + fx::part_count(n, P, r) : end;
  if (clipped)  // the elements of this rank's slice that it writes: each model element once
    layout.for_each_run(
        piece.begin, piece.end, /*writers_only=*/true, [&](const LocalTensor&, const FlatRun& run) {
          seg.norm_runs.emplace_back(run.local - piece.begin, run.local - piece.begin + run.count);
        });
  if (in_memory) {
    const Tensor m = updater.input("m"), v = updater.input("v");
    TANDEM_CHECK(m.numel() == piece.end - piece.begin && v.numel() == m.numel(),
                 "optimizer state m {} for elements [{}, {})", m.str(), piece.begin, piece.end);
    m.fill(0.0f);  // Adam's moments start at zero
    v.fill(0.0f);
    m_.push_back(m);
    v_.push_back(v);
  }
  segments_.push_back(std::move(seg));
  pieces_.push_back(piece);
}

std::string DataParallelOptimizer::schedule_name() const {
  if (update_runner_ == nullptr) return runner_->schedule_name();
  return fmt::format("{} {}, {} {}", runner_->program().name(), runner_->schedule_name(),
                     update_runner_->program().name(), update_runner_->schedule_name());
}

void DataParallelOptimizer::read_state(size_t i, float* m, float* v) const {
  const size_t n = static_cast<size_t>(pieces_[i].end - pieces_[i].begin);
  if (tier_) return tier_->read(i, m, v);
  std::memcpy(m, m_[i].data(), n * sizeof(float));
  std::memcpy(v, v_[i].data(), n * sizeof(float));
}

void DataParallelOptimizer::write_state(size_t i, const float* m, const float* v) {
  const size_t n = static_cast<size_t>(pieces_[i].end - pieces_[i].begin);
  if (tier_) return tier_->write(i, m, v);
  std::memcpy(m_[i].data(), m, n * sizeof(float));
  std::memcpy(v_[i].data(), v, n * sizeof(float));
}

size_t DataParallelOptimizer::state_tier_bytes() const { return tier_ ? tier_->tier_bytes() : 0; }
std::string DataParallelOptimizer::state_tier_description() const {
  return tier_ ? tier_->describe() : "";
}

size_t DataParallelOptimizer::state_bytes() const {
  if (tier_) return tier_->staging_bytes();
  size_t b = 0;
  for (size_t i = 0; i < m_.size(); ++i) b += m_[i].nbytes() + v_[i].nbytes();
  return b;
}

size_t DataParallelOptimizer::buffer_bytes() const {
  size_t b = 0;
  for (const Segment& s : segments_)
    b += s.runner->allocated_bytes() + (s.update != nullptr ? s.update->allocated_bytes() : 0);
  return tier_ ? b : b - state_bytes();  // a tier's staging is the caller's, not the runners'
}

void DataParallelOptimizer::begin_step(double lr, int64_t step) {
  lr_ = lr;
  step_ = step;
  exchange_ns_ = 0;
  in_step_ = true;
  for (Segment& s : segments_) s.launched = false;
  if (tier_) tier_->begin();
}

void DataParallelOptimizer::layer_ready(int layer) {
  // "after": everything runs in finish_step; outside a step (an out-of-core profile's backward):
  // nothing runs.
  if (worker_ == nullptr || !in_step_) return;
  for (Segment& s : segments_)
    if (!s.launched && s.ready_layer == layer) launch(s);
}

void DataParallelOptimizer::finish_step() {
  TANDEM_CHECK(in_step_, "finish_step without begin_step");
  in_step_ = false;
  for (Segment& s : segments_)
    if (!s.launched) launch(s);
  if (worker_ != nullptr) worker_->wait();
  if (update_runner_ != nullptr) {
    const double clip = clip_factor();
    for (Segment& s : segments_) {
      const auto begin = std::chrono::steady_clock::now();
      comm::set_comm_activity(fmt::format("the update of step {} ({})", step_, s.name));
      set_hyper_parameters(*s.update);
      s.update->set_scalar("clip", clip);
      run_update(s);
      const auto end = std::chrono::steady_clock::now();
      exchange_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(end - begin).count();
      if (sink_) sink_(fmt::format("{} update", s.name), begin, end);
    }
  }
  if (tier_) tier_->finish();
}

double DataParallelOptimizer::clip_factor() {
  double squares = 0;  // in segment order, whichever thread reduced them
  for (const Segment& s : segments_) squares += s.squares;
  comm::set_comm_activity(fmt::format("the gradient norm of step {}", step_));
  norm_->input("squares").set(0, static_cast<float>(squares));
  norm_->run();
  grad_norm_ = std::sqrt(static_cast<double>(norm_->output("total").get(0)));
  const double factor = *config_.clip_grad_norm / (*grad_norm_ + 1e-6);
  // A non-finite norm gives 1: the gradient's own NaN or Inf reaches the weights, and the
  // trainer's divergence check stops the run.
  return std::min(1.0, factor);
}

void DataParallelOptimizer::step(double lr, int64_t step) {
  begin_step(lr, step);
  finish_step();
}

// Every dp rank launches the same segments in the same order (the backward's order is the same
// on all of them), so their collectives match.
void DataParallelOptimizer::launch(Segment& s) {
  s.launched = true;
  if (worker_ == nullptr) return run_segment(s);
  worker_->submit([this, &s] { run_segment(s); });
}

void DataParallelOptimizer::run_segment(Segment& s) {
  const auto begin = std::chrono::steady_clock::now();
  comm::set_comm_activity(fmt::format("the gradient exchange of step {} ({})", step_, s.name));
  exec::Runner& run = *s.runner;
  if (!s.grads_bound) {  // mixed precision: round each gradient to the program's dtype
    const Tensor gin = run.input("g");
    const float* g = grads_.data_as<float>();
    void* dst = gin.data();
    for (int64_t i = 0; i < s.end - s.begin; ++i)
      store_from_f32(dst, gin.dtype(), static_cast<size_t>(i), g[s.begin + i]);
  }
  if (s.update != nullptr) {  // clipping: the reduction only, and its squares
    run.run();
    // The averaged gradient exactly as the update will compute it: the f32 product of the f32
    // scale and the widened sum.
    const Tensor g_sum = run.output("g_sum");
    const float scale = grad_scale();
    double squares = 0;
    for (const auto& [first, last] : s.norm_runs)
      for (int64_t i = first; i < last; ++i) {
        const float g1 = scale * load_as_f32(g_sum.data(), g_sum.dtype(), static_cast<size_t>(i));
        squares += static_cast<double>(g1) * g1;
      }
    s.squares = squares;
  } else {
    set_hyper_parameters(run);
    run_update(s);
  }
  const auto end = std::chrono::steady_clock::now();
  exchange_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(end - begin).count();
  if (sink_) sink_(s.name, begin, end);
}

void DataParallelOptimizer::set_hyper_parameters(exec::Runner& run) const {
  run.set_scalar("lr", lr_);
  run.set_scalar("beta1", config_.beta1);
  run.set_scalar("beta2", config_.beta2);
  run.set_scalar("eps", config_.eps);
  run.set_scalar("weight_decay", config_.weight_decay);
  run.set_scalar("step", static_cast<double>(step_));
  run.set_scalar("grad_scale", grad_scale());
}

// Runs the program that updates the weights (the one step, or with clipping the update), with
// the segment's moments in memory or streamed from the tier.
void DataParallelOptimizer::run_update(Segment& s) {
  exec::Runner& run = s.update != nullptr ? *s.update : *s.runner;
  const int64_t n = pieces_[s.index].end - pieces_[s.index].begin;
  if (tier_) {  // this segment's moments, read into its staging slot ahead of time
    tier_->await(s.index);
    run.bind("m", Tensor::view_of(tier_->m(s.index), DType::F32, Shape{n}));
    run.bind("v", Tensor::view_of(tier_->v(s.index), DType::F32, Shape{n}));
  }
  run.run();  // w updated in the model's buffer; m and v in the runner's storage or the slot
  if (tier_) tier_->done(s.index);
}

}  // namespace tandem::parallel
