// Out-of-core training on one rank: set-up, profile (cache or measurement), plan, reports.
#include "out_of_core.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <ostream>

#include "tandem/comm/agree.h"
#include "tandem/core/blas.h"
#include "tandem/core/bytes.h"
#include "tandem/core/error.h"
#include "tandem/exec/jit.h"
#include "tandem/parallel/model.h"
#include "tandem/perf/activation_profile.h"
#include "tandem/train/model_config.h"
#include "tandem/tune/cache.h"

namespace tandem::train::detail {
namespace {

// The first plan only has to fit (its times are placeholders): a short search is enough.
constexpr int64_t kFirstPlanEvaluations = 10'000;

std::string brief(const ooc::Plan& p) {
  std::vector<std::string> parts;
  const std::pair<ooc::Decision, const char*> kinds[] = {
      {ooc::Decision::Keep, "kept"},
      {ooc::Decision::Swap, "swapped"},
      {ooc::Decision::SwapSync, "swapped (write waited for)"},
      {ooc::Decision::Recompute, "checkpointed"},
      {ooc::Decision::Continue, "in segments"}};
  for (const auto& [d, name] : kinds)
    if (p.count(d) > 0) parts.push_back(fmt::format("{} {}", p.count(d), name));
  return fmt::format("{} ({})", p.str(), fmt::join(parts, ", "));
}

}  // namespace

OutOfCore::OutOfCore(const TrainConfig& cfg, const parallel::Grid& grid, int micro_rows,
                     int micro_batches, ooc::TransferEngines& engines)
    : cfg_(cfg),
      chain_(parallel::ParallelGPT::chain_layout(cfg.model, grid, micro_rows, cfg.model.seq_len,
                                                 micro_batches)),
      budget_(parse_budget(cfg.memory_budget,
                           ooc::MemorySchedule(chain_, ooc::keep_all(chain_.units)).peak_bytes())),
      tier_spec_(cfg.slow_tier),
      engines_(engines),
      runtime_(std::make_unique<ooc::Runtime>(cfg.model, micro_rows, cfg.model.seq_len, budget_)) {
  nlohmann::json key = {{"format", "tandem-ooc-profile-2"},  // 2: a unit is half a block
                        {"model", model_config_to_json(cfg.model)},
                        {"precision", std::string(dtype_name(cfg.model.matmul))},
                        {"micro_rows", micro_rows},
                        {"seq_len", cfg.model.seq_len},
                        {"micro_batches", micro_batches},
                        {"grid", cfg.grid.str()},
                        {"stage", grid.coord().pp},
                        {"backend", comm::backend_name(cfg.backend)},
                        {"tier", tier_spec_.kind == ooc::TierSpec::Kind::Host ? "host" : "file"},
                        // A unit streaming its block's weights may wait for them.
                        {"model_state", cfg.model_state ? cfg.model_state->str() : "memory"},
                        {"blas_threads", blas::num_threads()},
                        {"machine", tune::machine_id()},
                        // Profiles measured by another build timed other kernels.
                        {"build", tune::build_id()}};
  key_ = key.dump();
  writer_ = grid.replica() == 0 && grid.coord().tp == 0;
  // Sizes alone decide whether anything fits; times only rank the plans that do.
  profile_ = ooc::uniform_profile(chain_.units, 1.0, 2.0, 1e9, 1e9);
  if (!cfg.ooc_plan.empty()) {
    forced_ = true;
    use(ooc::Plan::parse(cfg.ooc_plan));
  } else {
    planned_ = ooc::plan_step(chain_, profile_, budget_, kFirstPlanEvaluations);
    use(planned_.best.plan);
  }
}

const ooc::SmallestBudget& OutOfCore::smallest() {
  if (!smallest_) smallest_ = ooc::smallest_budget(chain_, profile_);
  return *smallest_;
}

void OutOfCore::reserve(uint64_t bytes, const std::string& what) {
  TANDEM_CHECK(bytes >= reserved_, "the budget's reserved part shrinks from {} to {}", reserved_,
               bytes);
  const uint64_t total = budget_ + reserved_;
  const ooc::SmallestBudget& low = smallest();
  if (bytes >= total || total - bytes < low.bytes)
    user_error(
        "--memory-budget {} holds {} ({}) and the activations, which need at least {} (plan {}): "
        "give at least {} ({} bytes)",
        human_bytes(total), what, human_bytes(bytes), human_bytes(low.bytes), low.plan.str(),
        human_bytes(bytes + low.bytes), bytes + low.bytes);
  if (least_reserved_for_.empty()) {
    least_reserved_ = bytes;
    least_reserved_for_ = what;
  }
  reserved_ = bytes;
  reserved_for_ = what;
  budget_ = total - bytes;
  runtime_->shrink_budget(budget_);
  if (forced_) {
    const ooc::Plan forced = plan();
    return use(forced);  // refused now if it does not fit what is left
  }
  planned_ = prepared_ ? ooc::plan_step(chain_, profile_, budget_)
                       : ooc::plan_step(chain_, profile_, budget_, kFirstPlanEvaluations);
  use(planned_.best.plan);
}

double OutOfCore::predicted_step_s_reserving(uint64_t bytes) {
  const uint64_t total = budget_ + reserved_;
  if (bytes >= total || total - bytes < smallest().bytes)
    return std::numeric_limits<double>::infinity();
  const uint64_t rest = total - bytes;
  if (forced_)
    return ooc::MemorySchedule(chain_, plan()).peak_bytes() <= rest
               ? predicted_.step_s
               : std::numeric_limits<double>::infinity();
  return ooc::plan_step(chain_, profile_, rest, kFirstPlanEvaluations).best.prediction.step_s;
}

OutOfCore::~OutOfCore() {
  runtime_.reset();  // it waits for transfers still in flight, which need the tier
  transfers_.reset();
  tier_.reset();
}

void OutOfCore::use(const ooc::Plan& plan) {
  const ooc::MemorySchedule s(chain_, plan);
  if (s.tier_bytes() > 0 && (tier_ == nullptr || tier_->capacity() < s.tier_bytes())) {
    if (transfers_ == nullptr)
      transfers_ = std::make_unique<ooc::TransferEngine::Client>(engines_.of(tier_spec_),
                                                                 /*keep_spans=*/true);
    transfers_->wait_all();  // nothing in flight may use the tier replaced
    tier_.reset();
    tier_ = ooc::open_slow_tier(tier_spec_, s.tier_bytes());
  }
  predicted_ = ooc::predict(chain_, plan, profile_);
  runtime_->set_schedule(s, transfers_.get(), tier_.get());
}

void OutOfCore::prepare(const std::function<void()>& step, comm::Communicator& world,
                        comm::Communicator& tp, std::ostream* log) {
  const std::string cache_dir = exec::jit_cache_dir(), cache_name = tune::hash_hex(key_) + ".json";
  if (auto cached = ooc::load_cached_profile(cache_dir, cache_name, key_)) {
    profile_ = *cached;
    from_cache_ = profile_.units() == chain_.units;  // else measured again below, and rewritten
  }
  // Each stage caches its own profile, but `step` runs collectives across the grid (the
  // pipeline's sends, the tensor-parallel exchanges): where any rank lacks its profile (a run
  // stopped between two ranks' writes, another run writing now), every rank measures.
  from_cache_ = comm::all_true(world, from_cache_);
  if (!from_cache_) {
    // One count of passes for all ranks, for the same reason.
    profile_ = perf::measure_activation_profile(
        step, [&] { return runtime_->last_step(); }, tier_spec_,
        [&](int wanted) { return comm::all_min(world, wanted); }, log);
  }
  // The tp group plans from the slowest rank's figures, so every rank recomputes the same units.
  if (tp.size() > 1) {
    std::vector<float> v;
    for (const auto* xs : {&profile_.forward_s, &profile_.backward_s, &profile_.recompute_s})
      for (double x : *xs) v.push_back(static_cast<float>(x));
    v.push_back(static_cast<float>(-profile_.write_bytes_per_s));
    v.push_back(static_cast<float>(-profile_.read_bytes_per_s));
    Tensor t = Tensor::view_of(v.data(), DType::F32, Shape{static_cast<int64_t>(v.size())});
    tp.all_reduce(t, comm::ReduceOp::Max);
    size_t i = 0;
    for (auto* xs : {&profile_.forward_s, &profile_.backward_s, &profile_.recompute_s})
      for (double& x : *xs) x = v[i++];
    profile_.write_bytes_per_s = -v[i++];
    profile_.read_bytes_per_s = -v[i++];
  }
  if (!from_cache_ && writer_) {
    try {
      ooc::store_cached_profile(cache_dir, cache_name, key_, profile_);
    } catch (const std::exception& e) {
      fmt::print(stderr, "tandem train: warning: the out-of-core profile was not cached: {}\n",
                 e.what());
    }
  }
  prepared_ = true;
  if (transfers_ != nullptr) transfers_->take_spans();  // the profile's transfers are not the run's
  if (forced_) {
    planned_.baselines = ooc::evaluate_baselines(chain_, profile_, budget_);
    const ooc::Plan forced = plan();  // a copy: use() replaces the schedule that holds it
    use(forced);
  } else {
    planned_ = ooc::plan_step(chain_, profile_, budget_);
    use(planned_.best.plan);
  }
}

void OutOfCore::after_step(io::TraceRecorder* trace, int rank) {
  const ooc::StepMeasure& m = runtime_->last_step();
  high_water_ = std::max(high_water_, m.high_water);
  step_s_.push_back(m.step_s);
  if (transfers_ == nullptr) return;
  for (const auto& s : transfers_->take_spans())
    if (trace != nullptr && trace->enabled())
      trace->record(rank, s.write ? "swap-out" : "swap-in", s.label, s.begin, s.end);
}

double OutOfCore::measured_step_s() const {
  if (step_s_.empty()) return 0;
  std::vector<double> v = step_s_;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

std::string OutOfCore::plan_line() const {
  const ooc::Prediction& p = predicted_;
  std::string how =
      forced_ ? "forced by --ooc-plan"
      : planned_.optimal
          ? fmt::format("planner, optimal over {} plans", planned_.evaluated)
          : fmt::format("planner, best of {} plans: search cut short, not proven optimal",
                        planned_.evaluated);
  std::string line = fmt::format(
      "  out-of-core: budget {}{}, slow tier {}; plan {}: predicted {:.3f} s forward+backward, "
      "peak {} [{}; profile {}]\n  baselines:",
      human_bytes(budget_), budget_note(), tier_ != nullptr ? tier_->describe() : tier_spec_.str(),
      brief(plan()), p.step_s, human_bytes(p.peak_bytes), how,
      from_cache_ ? "from the cache" : "measured");
  for (const ooc::Evaluated& b : planned_.baselines)
    line +=
        fmt::format(" {} {:.3f} s at {}{};", ooc::strategy_name(b.strategy), b.prediction.step_s,
                    human_bytes(b.prediction.peak_bytes), b.fits ? "" : " (does not fit)");
  line.back() = '\n';
  return line;
}

std::string OutOfCore::budget_note() const {
  if (reserved_ == 0) return "";
  return fmt::format(" for the activations (--memory-budget {} less {} for {})",
                     human_bytes(budget_ + reserved_), human_bytes(reserved_), reserved_for_);
}

std::string OutOfCore::summary_line() const {
  const double m = measured_step_s(), p = predicted_.step_s;
  return fmt::format(
      "tandem train: out-of-core high-water {} of a {} budget{} (predicted peak {}); "
      "forward+backward {:.3f} s median measured vs {:.3f} s predicted ({:+.1f}%)\n",
      human_bytes(high_water_), human_bytes(budget_), budget_note(),
      human_bytes(predicted_.peak_bytes), m, p, m > 0 ? (p / m - 1) * 100 : 0.0);
}

std::string OutOfCore::report() const {
  const ooc::MemorySchedule s(chain_, plan());
  std::string r = fmt::format("{:<11}{:<13}{:>12}{:>12}{:>11}{:>11}{:>11}\n", "unit", "decision",
                              "input", "buffers", "forward", "backward", "recompute");
  const char* names[] = {"keep", "swap", "swap (sync)", "checkpoint", "segment"};
  for (int j = 0; j < chain_.units; ++j) {
    const ooc::Decision d = plan().units[static_cast<size_t>(j)];
    const int di = d == ooc::Decision::Keep        ? 0
                   : d == ooc::Decision::Swap      ? 1
                   : d == ooc::Decision::SwapSync  ? 2
                   : d == ooc::Decision::Recompute ? 3
                                                   : 4;
    r += fmt::format("{:<11}{:<13}{:>12}{:>12}{:>10.3f}s{:>10.3f}s{:>10.3f}s\n",
                     chain_.unit_name(j), names[di], human_bytes(s.input_bytes()),
                     human_bytes(s.buffers_bytes(j)), profile_.forward_s[static_cast<size_t>(j)],
                     profile_.backward_s[static_cast<size_t>(j)], profile_.recompute(j));
  }
  r += fmt::format("workspace {}; slow tier {}: write {:.2f} GB/s, read {:.2f} GB/s\n\n",
                   human_bytes(s.regions()[static_cast<size_t>(s.workspace())].bytes),
                   tier_spec_.str(), profile_.write_bytes_per_s / 1e9,
                   profile_.read_bytes_per_s / 1e9);
  r += fmt::format("{:<42}{:>10}{:>12}{:>12}  {:<14}{}\n", "strategy", "step", "peak", "vs in-core",
                   "", "plan");
  const double in_core =
      planned_.baselines.empty() ? 0 : planned_.baselines.front().prediction.step_s;
  auto row = [&](std::string_view name, const ooc::Plan& p, const ooc::Prediction& pr, bool fits) {
    r += fmt::format("{:<42}{:>9.3f}s{:>12}{:>11.2f}x  {:<14}{}\n", name, pr.step_s,
                     human_bytes(pr.peak_bytes), in_core > 0 ? pr.step_s / in_core : 0.0,
                     fits ? "" : "does not fit", p.str());
  };
  row(forced_ ? "forced (--ooc-plan)" : "planner", plan(), predicted_,
      predicted_.peak_bytes <= budget_);
  for (const ooc::Evaluated& b : planned_.baselines)
    row(ooc::strategy_name(b.strategy), b.plan, b.prediction, b.fits);
  const ooc::SmallestBudget low = ooc::smallest_budget(chain_, profile_);
  r += fmt::format(
      "\nsmallest budget any plan fits: {} ({} bytes){}, plan {}{}\n",
      human_bytes(low.bytes + least_reserved_), low.bytes + least_reserved_,
      least_reserved_ == 0
          ? std::string()
          : fmt::format(" ({} of it for {})", human_bytes(least_reserved_), least_reserved_for_),
      low.plan.str(), low.proven ? "" : " (search cut short: the smallest found)");
  return r;
}

std::string OutOfCore::predicted_trace() const {
  return ooc::chrome_trace(ooc::predict(chain_, plan(), profile_, true));
}

}  // namespace tandem::train::detail
