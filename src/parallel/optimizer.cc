// The data-parallel AdamW / LAMB step: the optimizer program run on the data-parallel group with
// its schedule, over this rank's shard of the parameters.
#include "tandem/parallel/optimizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>

#include "tandem/core/dtype.h"
#include "tandem/core/error.h"
#include "tandem/core/formulas.h"
#include "tandem/dsl/workloads.h"
#include "tandem/schedule/recipe.h"

namespace tandem::parallel {

std::string_view optimizer_name(OptimizerKind kind) {
  return kind == OptimizerKind::Lamb ? "lamb" : "adamw";
}

std::string_view grad_exchange_name(GradExchange exchange) {
  return exchange == GradExchange::After ? "after" : "overlap";
}

std::string_view sharding_name(Sharding sharding) {
  return sharding == Sharding::Weights ? "weights" : "moments";
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

namespace {

// The schedules of `names`, then of the built-in preferences, with `inputs` stored sliced
// (slice(w,m,v): ZeRO-3's blocks; slice(m,v): ZeRO-1). A name whose collectives do not reorder
// the update onto the slice (AR-C, an autotuner's choice for small buckets) cannot, and is passed
// over when tried, so a built-in one serves.
std::vector<std::string> with_sliced(std::vector<std::string> names,
                                     const std::vector<std::string>& inputs) {
  const std::vector<std::string> builtin = optimizer_schedule_preferences();
  names.insert(names.end(), builtin.begin(), builtin.end());
  std::vector<std::string> out;
  for (const std::string& name : names) {
    schedule::Recipe r = schedule::Recipe::parse(name);
    r.slice = inputs;
    out.push_back(r.str());
  }
  return out;
}

}  // namespace

std::vector<SegmentBounds> optimizer_segments(const ShardLayout& layout,
                                              const OptimizerConfig& config,
                                              bool block_per_segment) {
  std::vector<SegmentBounds> out;
  const int first = layout.first_layer(), end = layout.end_layer();
  const auto [blocks_begin, blocks_end] = layout.blocks_range();
  // Buckets of whole blocks for both optimizers; LAMB's program takes a bucket's tensors as its
  // segments (each with its own trust ratio).
  const double bucket_bytes = config.bucket_mb.value_or(kDefaultBucketMiB) * (1 << 20);
  // Whole blocks, from the last: a bucket closes once it holds bucket_bytes.
  int64_t top = blocks_end;
  int top_layer = end - 1;
  for (int l = end - 1; l >= first; --l) {
    const int64_t bottom = layout.block_range(l).first;
    if (block_per_segment || static_cast<double>(top - bottom) * sizeof(float) >= bucket_bytes ||
        l == first) {
      out.push_back(
          {l == top_layer ? fmt::format("h.{}", l) : fmt::format("h.{}..h.{}", top_layer, l),
           bottom, top, l});
      top = bottom;
      top_layer = l - 1;
    }
  }
  // The rest, named by their first and last tensors, after the backward.
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
    out.push_back({named(blocks_end, layout.size()), blocks_end, layout.size(), -1});
  if (blocks_begin > 0) out.push_back({named(0, blocks_begin), 0, blocks_begin, -1});
  return out;
}

DataParallelOptimizer::DataParallelOptimizer(const OptimizerConfig& config, ModelState& state,
                                             comm::Communicator& dp,
                                             const SchedulePreferences& schedules,
                                             exec::RunnerKind executor, bool overlap_allowed,
                                             comm::Communicator* world)
    : config_(config), state_(state), dp_(dp) {
  config.validate();
  const bool per_block = state.blocks_elsewhere();
  TANDEM_CHECK(!per_block || !config.clip_grad_norm, "blocks in a store or sharded with clipping");
  TANDEM_CHECK(state.weights_sharded() == (config.sharding == Sharding::Weights),
               "the model state's sharding is not the optimizer's");
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
    const bool sharded = state.weights_sharded();
    const std::vector<std::string> names =
        given ? schedules.names : optimizer_schedule_preferences();
    runner_ = std::make_unique<ProgramRunner>(optimizer_program(config),
                                              sharded ? with_sliced(names, {"m", "v"}) : names,
                                              executor, given ? schedules.chunk_bytes : 0);
    auto sliced = [](const ProgramRunner& run, const char* input) {
      const dsl::Program& p = run.program();
      const std::optional<int> id = p.find(input);
      TANDEM_CHECK(id.has_value(), "optimizer program '{}' has no input {}", p.name(), input);
      return p.stage(*id).type.layout.is_sliced();
    };
    sliced_ = sliced(*runner_, "m");
    if (sharded) {
      // The blocks' segments update the slices of their weights (ZeRO-3); the embeddings' and
      // ln_f's stay whole, with the moments sliced (ZeRO-1), as every rank keeps them whole.
      sharded_runner_ = std::make_unique<ProgramRunner>(
          optimizer_program(config), with_sliced(names, {"w", "m", "v"}), executor,
          given ? schedules.chunk_bytes : 0);
      if (!sliced_ || !sliced(*sharded_runner_, "w"))
        user_error(
            "--shard weights needs an optimizer schedule that updates each rank's slice of the "
            "weights (such as fused(RS-C-AG)+slice(w,m,v)) and slices the moments; the "
            "schedules chosen are {} and {}",
            sharded_runner_->schedule_name(), runner_->schedule_name());
    }
  }

  grads_f32_ = runner_->program().stage(*runner_->program().find("g")).type.dtype == DType::F32;

  const ShardLayout& layout = state.layout();
  std::vector<ModelState::Piece> pieces;
  for (const SegmentBounds& sb : optimizer_segments(layout, config, per_block)) {
    pieces.push_back(add_segment(layout, sb.name, sb.begin, sb.end, sb.ready_layer));
    if (per_block) pieces.back().block = sb.ready_layer;
    buckets_ += sb.ready_layer >= 0 ? 1 : 0;
  }
  if (config.exchange == GradExchange::Overlap && overlap_allowed)
    worker_ = std::make_unique<SerialWorker>("tandem-dp-comm");
  // A sharded state gathers on this communication thread, between the updates.
  const ModelState::Group group{&dp, worker_.get(), executor};
  state.place_moments(std::move(pieces), &group);
}

// The communication thread first: its jobs use the tier; a sharded state gathers without it from
// now on.
DataParallelOptimizer::~DataParallelOptimizer() {
  state_.detach_thread();
  worker_.reset();
}

// The runners for segments of `n` elements (with LAMB, of these tensor bounds), set up on first
// use: segments of one shape share them (every block's segment has the same shape), so the
// programs' own buffers (the reduce-scatter's result, scratch) are one segment's, not the model's.
// Each run binds its segment's weights, gradients and moments.
DataParallelOptimizer::Runners& DataParallelOptimizer::runners_for(int64_t n,
                                                                   const dsl::Segments& tensors,
                                                                   bool sharded) {
  for (const std::unique_ptr<Runners>& r : runners_)
    if (r->n == n && r->tensors == tensors && r->sharded == sharded) return *r;
  auto r = std::make_unique<Runners>();
  r->n = n;
  r->tensors = tensors;
  r->sharded = sharded;
  const bool clipped = update_runner_ != nullptr;
  std::vector<std::string> bound = {"w", "m", "v"};  // the one step's or the update's
  const std::vector<std::string> grads_bound =
      grads_f32_ ? std::vector<std::string>{"g"} : std::vector<std::string>{};
  dsl::SymbolMap symbols{{"N", n}};
  if (config_.kind == OptimizerKind::Lamb) symbols["S"] = static_cast<int64_t>(tensors.size()) - 1;
  if (clipped) {
    std::vector<std::string> reduce_bound = grads_bound;
    reduce_bound.push_back("g_sum");  // each segment's own, kept until the update
    r->runner = runner_->prepare(dp_, {{"N", n}}, reduce_bound);
    bound.push_back("g_sum");
    r->update = update_runner_->prepare(dp_, symbols, bound, tensors);
  } else {
    bound.insert(bound.end(), grads_bound.begin(), grads_bound.end());
    r->runner = (sharded ? *sharded_runner_ : *runner_).prepare(dp_, symbols, bound, tensors);
  }
  runners_.push_back(std::move(r));
  return *runners_.back();
}

// Segment `name`: local elements [begin, end), launched once block `ready_layer`'s gradients are
// final; its piece of the moments is this rank's slice when sliced.
ModelState::Piece DataParallelOptimizer::add_segment(const ShardLayout& layout, std::string name,
                                                     int64_t begin, int64_t end, int ready_layer) {
  const int64_t n = end - begin;
  const bool clipped = update_runner_ != nullptr;
  // LAMB: the segment's tensors, each with its trust ratio (dsl/ir.h's segments).
  dsl::Segments tensors;
  if (config_.kind == OptimizerKind::Lamb) {
    tensors = {0};
    for (const LocalTensor& lt : layout.tensors())
      if (lt.local_offset >= begin && lt.local_offset < end) {
        TANDEM_CHECK(
            lt.local_offset == begin + tensors.back() && lt.local_offset + lt.numel() <= end,
            "tensor {} at [{}, {}) cuts segment {} [{}, {})", lt.name, lt.local_offset,
            lt.local_offset + lt.numel(), name, begin, end);
        tensors.push_back(lt.local_offset + lt.numel() - begin);
      }
    TANDEM_CHECK(tensors.back() == n, "the tensors of segment {} cover {} of its {} elements", name,
                 tensors.back(), n);
    tensors_ += static_cast<int>(tensors.size()) - 1;
  }
  Segment seg;
  seg.index = segments_.size();
  seg.name = std::move(name);
  seg.begin = begin;
  seg.end = end;
  seg.ready_layer = ready_layer;
  // With --shard weights every block is a segment whose weights are sliced.
  seg.runners = &runners_for(n, tensors, state_.weights_sharded() && ready_layer >= 0);
  const int P = dp_.size(), r = dp_.rank();
  ModelState::Piece piece;
  piece.segment_begin = begin;
  piece.segment_end = end;
  piece.begin = sliced_ ? begin + fx::part_offset(n, P, r) : begin;
  piece.end = sliced_ ? piece.begin + fx::part_count(n, P, r) : end;
  if (clipped) {
    // The elements of this rank's slice that it writes: each model element once.
    layout.for_each_run(
        piece.begin, piece.end, /*writers_only=*/true, [&](const LocalTensor&, const FlatRun& run) {
          seg.norm_runs.emplace_back(run.local - piece.begin, run.local - piece.begin + run.count);
        });
    seg.g_sum = Tensor::zeros(config_.grad_dtype, Shape{piece.end - piece.begin});
  }
  segments_.push_back(std::move(seg));
  return piece;
}

std::string DataParallelOptimizer::schedule_name() const {
  if (sharded_runner_ != nullptr)
    return fmt::format("{} (blocks), {} (embeddings, ln_f)", sharded_runner_->schedule_name(),
                       runner_->schedule_name());
  if (update_runner_ == nullptr) return runner_->schedule_name();
  return fmt::format("{} {}, {} {}", runner_->program().name(), runner_->schedule_name(),
                     update_runner_->program().name(), update_runner_->schedule_name());
}

size_t DataParallelOptimizer::buffer_bytes() const {
  size_t b = 0;
  for (const std::unique_ptr<Runners>& r : runners_)
    b += r->runner->allocated_bytes() + (r->update != nullptr ? r->update->allocated_bytes() : 0);
  for (const Segment& s : segments_) b += clipped() ? s.g_sum.nbytes() : 0;
  return b;
}

void DataParallelOptimizer::begin_step(double lr, int64_t step) {
  lr_ = lr;
  step_ = step;
  exchange_ns_ = 0;
  in_step_ = true;
  for (Segment& s : segments_) s.launched = false;
  state_.begin_step();
}

void DataParallelOptimizer::layer_ready(int layer) {
  if (state_.blocks_elsewhere()) {
    // The store or the sharded state keeps a few blocks' gradients: a block's update runs now
    // (its last backward of the step), on the communication thread or here; outside a step (an
    // out-of-core profile's backward) its gradients go.
    if (!in_step_) return state_.drop_gradients();
    for (Segment& s : segments_)
      if (!s.launched && s.ready_layer == layer) launch(s);
    return;
  }
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
      set_hyper_parameters(*s.runners->update);
      s.runners->update->set_scalar("clip", clip);
      run_update(s, state_.begin_update(s.index));
      const auto end = std::chrono::steady_clock::now();
      exchange_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(end - begin).count();
      if (sink_) sink_(fmt::format("{} update", s.name), begin, end);
    }
  }
  state_.finish_step();
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
  exec::Runner& run = *s.runners->runner;
  const int64_t n = s.end - s.begin;
  // The update holds the segment's state from here (the weights and moments of a block in the
  // store, read ahead), or, clipped, only the reduction runs now on its gradients.
  std::optional<ModelState::Update> u;
  if (!clipped()) u = state_.begin_update(s.index);
  const Tensor grads =
      Tensor::view_of(u ? u->g : state_.segment_gradients(s.index), DType::F32, Shape{n});
  if (grads_f32_) {
    run.bind("g", grads);
  } else {  // mixed precision: round each gradient to the program's dtype
    const Tensor gin = run.input("g");
    const float* g = grads.data_as<float>();
    void* dst = gin.data();
    for (int64_t i = 0; i < n; ++i) store_from_f32(dst, gin.dtype(), static_cast<size_t>(i), g[i]);
  }
  if (clipped()) {  // clipping: the reduction only, and its squares
    run.bind("g_sum", s.g_sum);
    run.run();
    // The averaged gradient exactly as the update will compute it: the f32 product of the f32
    // scale and the widened sum.
    const float scale = grad_scale();
    double squares = 0;
    for (const auto& [first, last] : s.norm_runs)
      for (int64_t i = first; i < last; ++i) {
        const float g1 =
            scale * load_as_f32(s.g_sum.data(), s.g_sum.dtype(), static_cast<size_t>(i));
        squares += static_cast<double>(g1) * g1;
      }
    s.squares = squares;
  } else {
    set_hyper_parameters(run);
    run_update(s, *u);
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

// Runs the program that updates the weights (the one step, or with clipping the update) on the
// segment's weights and moments where the model state keeps them (`u`, from begin_update), then
// lets the model state write them back.
void DataParallelOptimizer::run_update(Segment& s, const ModelState::Update& u) {
  exec::Runner& run = clipped() ? *s.runners->update : *s.runners->runner;
  const ModelState::Piece& p = state_.pieces()[s.index];
  auto f32 = [](float* ptr, int64_t count) {
    return Tensor::view_of(ptr, DType::F32, Shape{count});
  };
  // A sharded block's weights are its slice, as its moments are.
  run.bind("w", f32(u.w, s.runners->sharded ? p.end - p.begin : s.end - s.begin));
  if (clipped()) run.bind("g_sum", s.g_sum);
  run.bind("m", f32(u.m, p.end - p.begin));
  run.bind("v", f32(u.v, p.end - p.begin));
  run.run();  // w, m and v updated in place
  state_.end_update(s.index);
}

}  // namespace tandem::parallel
