// tandem's out-of-core training step (forward + backward of one rank) under fast-memory budgets,
// against in-core training of the same model on the same weights and batch: for each budget (a
// percentage of the in-core need, the keep-all plan's peak) the planner's plan and every single
// strategy that fits (in-core keep-all, swap-all (vDNN), recompute-all, Chen's sqrt(n) segments,
// KARMA), each checked bitwise against in-core gradients once, then timed interleaved with the
// in-core model. Reports medians and spread, the ratio to in-core from the same run, the
// performance model's prediction and error, the arena's measured high-water mark against the
// predicted peak, the stall time, and the goal checks. bench/run_ooc.sh runs it on both
// slow tiers and measures the resident memory of `tandem train`; docs/benchmarks.md reports it.
//
// usage: bench_ooc_step [--layers 8] [--d-model 512] [--heads 8] [--seq-len 256] [--batch 16]
//                       [--reps 5] [--tier host|file:DIR] [--budgets 100,50,25,15] [--threads 2]
//                       [--dropout 0.0] [--seed 1]
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tandem/comm/thread.h"
#include "tandem/core/blas.h"
#include "tandem/core/bytes.h"
#include "tandem/core/error.h"
#include "tandem/core/rng.h"
#include "tandem/nn/gpt.h"
#include "tandem/ooc/memory_schedule.h"
#include "tandem/ooc/model.h"
#include "tandem/ooc/plan.h"
#include "tandem/ooc/planner.h"
#include "tandem/ooc/profile.h"
#include "tandem/ooc/runtime.h"
#include "tandem/ooc/slow_tier.h"
#include "tandem/ooc/transfer_engine.h"
#include "tandem/parallel/grid.h"
#include "tandem/parallel/model.h"
#include "tandem/perf/tier_bandwidth.h"

namespace tandem::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kBandwidthProbeBytes = 128ull << 20;

struct Options {
  int layers = 8, d_model = 512, heads = 8, seq_len = 256, batch = 16;
  int reps = 5, threads = 2;
  std::string tier = "host";
  std::vector<double> budgets = {100, 50, 25, 15};
  float dropout = 0.0f;
  uint64_t seed = 1;
};

// A short name for scripts: "in-core", "swap-all", "recompute-all", "chen", "karma", "planner".
const char* slug(ooc::Strategy s) {
  switch (s) {
    case ooc::Strategy::InCore:
      return "in-core";
    case ooc::Strategy::SwapAll:
      return "swap-all";
    case ooc::Strategy::RecomputeAll:
      return "recompute-all";
    case ooc::Strategy::Chen:
      return "chen";
    case ooc::Strategy::Karma:
      return "karma";
    case ooc::Strategy::Planner:
      return "planner";
  }
  return "?";
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One plan as it runs: its schedule's sizes, its prediction and what each timed step measured.
struct Run {
  ooc::Plan plan;
  ooc::Prediction predicted;
  uint64_t peak = 0, tier_bytes = 0;
  std::vector<double> wall_s, step_s, stall_s, compute_s;  // per timed rep
  std::vector<uint64_t> high_water;
};

// One row of the table: a budget and a strategy, pointing at the run of its plan (rows with the
// same plan share one run, so a plan is timed once per repetition whichever rows name it).
struct Row {
  double pct_asked;  // the budget asked for, percent of the in-core need
  bool infeasible;   // no plan fits what was asked: the row is at the smallest budget instead
  uint64_t budget;   // what the row was planned under
  ooc::Strategy strategy;
  size_t run;
  bool optimal = true;       // the planner's search finished
  std::vector<double> also;  // other budgets asked for that no plan fits either (same row)

  bool asks(double pct) const {
    return pct_asked == pct || std::find(also.begin(), also.end(), pct) != also.end();
  }
  // "50%", or "25,15%->12.3%" where none fits and the row is at the smallest budget.
  std::string label(uint64_t need) const {
    std::string s = fmt::format("{:g}", pct_asked);
    for (double a : also) s += fmt::format(",{:g}", a);
    s += "%";
    if (infeasible)
      s +=
          fmt::format("->{:.1f}%", 100.0 * static_cast<double>(budget) / static_cast<double>(need));
    return s;
  }
};

std::string pct_label(double pct) { return fmt::format("{:g}%", pct); }

int bench(const Options& o, comm::Communicator& world) {
  nn::GPTConfig cfg;
  cfg.n_layers = o.layers;
  cfg.n_heads = o.heads;
  cfg.d_model = o.d_model;
  cfg.seq_len = cfg.max_positions = o.seq_len;
  cfg.dropout = o.dropout;
  cfg.validate();
  const int B = o.batch, T = o.seq_len, M = 1;  // one rank, one micro-batch of the whole batch
  parallel::Grid grid(world, parallel::GridShape{1, 1, 1});
  const nn::ChainLayout chain = parallel::ParallelGPT::chain_layout(cfg, grid, B, T, M);
  const int n = chain.units;
  const uint64_t need = ooc::MemorySchedule(chain, ooc::keep_all(n)).peak_bytes();
  const ooc::TierSpec tier_spec = ooc::TierSpec::parse(o.tier);

  // The slow tier, its engine and the swaps' client outlive the runtime (its destructor waits for
  // transfers), which outlives the model built on it.
  ooc::TransferEngine engine;
  std::unique_ptr<ooc::SlowTier> tier;
  ooc::TransferEngine::Client transfers(engine);
  // The two models, on the same grid and weights. The runtime's arena is the largest budget any
  // plan here needs (the in-core need); it gets a schedule before the model is built on it.
  ooc::Runtime runtime(cfg, B, T, need);
  runtime.set_schedule(ooc::MemorySchedule(chain, ooc::keep_all(n)), nullptr, nullptr);
  parallel::ParallelGPT in_core(cfg, grid, B, T, M);
  parallel::ParallelGPT out_of_core(cfg, grid, B, T, M, {}, &runtime);
  nn::ParameterSet whole(cfg);
  nn::gpt_init(whole, o.seed);
  in_core.layout().extract(whole.flat().data_as<float>(), in_core.params().data_as<float>());
  out_of_core.layout().extract(whole.flat().data_as<float>(),
                               out_of_core.params().data_as<float>());

  std::vector<int32_t> tokens(static_cast<size_t>(B) * T), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(random_bits(o.seed + 100, i) % 256u);
    targets[i] = static_cast<int32_t>(random_bits(o.seed + 200, i) % 256u);
  }
  const std::vector<parallel::MicroBatch> micro = {{tokens.data(), targets.data(), B, T, 0}};
  const uint64_t step = 1;

  std::printf(
      "bench_ooc_step: GPT %d layers, d_model %d, %d heads, seq %d, batch %d (%lld parameters, "
      "%.1fM), dropout %.2f; 1 rank, %d micro-batch; BLAS %s x%d; slow tier %s\n",
      o.layers, o.d_model, o.heads, o.seq_len, o.batch, static_cast<long long>(whole.size()),
      whole.size() / 1e6, o.dropout, M, blas::kernel_name().c_str(), blas::num_threads(),
      o.tier.c_str());
  {
    const ooc::MemorySchedule keep(chain, ooc::keep_all(n));
    std::printf(
        "in-core fast-tier need (keep-all peak): %s (%llu bytes); per unit: input %s, buffers %s "
        "(attention) and %s (MLP); workspace %s\n",
        human_bytes(need).c_str(), static_cast<unsigned long long>(need),
        human_bytes(keep.input_bytes()).c_str(), human_bytes(keep.buffers_bytes(0)).c_str(),
        human_bytes(keep.buffers_bytes(1)).c_str(),
        human_bytes(keep.regions()[static_cast<size_t>(keep.workspace())].bytes).c_str());
  }

  // The slow tier, sized for the plans that swap the most (every unit), at least the probe.
  uint64_t tier_need = kBandwidthProbeBytes;
  for (int p = 0; p <= ooc::kMaxPrefetch; ++p)
    tier_need = std::max(tier_need, ooc::MemorySchedule(chain, ooc::swap_all(n, p)).tier_bytes());
  tier = ooc::open_slow_tier(tier_spec, tier_need);
  const ooc::TierBandwidth bw = perf::measure_tier(*tier, kBandwidthProbeBytes);
  std::printf(
      "slow tier: %s, capacity %s; bandwidth (128 MiB, 8 MiB transfers): write %.2f GB/s, read "
      "%.2f GB/s\n",
      tier->describe().c_str(), human_bytes(tier->capacity()).c_str(), bw.write_bytes_per_s / 1e9,
      bw.read_bytes_per_s / 1e9);

  // The profile, as the trainer measures it: every unit recomputed from its own input (so each
  // unit's forward, backward and recompute are timed), one step to warm up, then each time the
  // median of three steps.
  runtime.set_schedule(ooc::MemorySchedule(chain, ooc::recompute_all(n, 1)), &transfers,
                       tier.get());
  std::vector<ooc::StepMeasure> measured;
  for (int i = 0; i < 4; ++i) {
    out_of_core.grads().fill(0.0f);
    out_of_core.forward_backward(micro, o.seed, step);
    if (i > 0) measured.push_back(runtime.last_step());
  }
  const ooc::Profile profile =
      ooc::StepMeasure::median_profile(measured, bw.write_bytes_per_s, bw.read_bytes_per_s);
  const double profile_step_s = measured[1].step_s;
  std::string fwd, bwd, rec;
  for (int j = 0; j < n; ++j) {
    fwd += fmt::format(" {:.3f}", profile.forward_s[static_cast<size_t>(j)]);
    bwd += fmt::format(" {:.3f}", profile.backward_s[static_cast<size_t>(j)]);
    rec += fmt::format(" {:.3f}", profile.recompute(j));
  }
  std::printf(
      "profile (every unit recomputed, medians of steps 2-4), s per unit (attention, MLP, ...):\n  "
      "forward  %s\n  backward %s\n  "
      "recompute%s\n  compute (forward + backward) %.3f s; the middle profiled step took %.3f s\n",
      fwd.c_str(), bwd.c_str(), rec.c_str(), profile.compute_s(), profile_step_s);
  const ooc::SmallestBudget smallest = ooc::smallest_budget(chain, profile);
  std::printf(
      "smallest budget any plan fits: %s (%llu bytes, %.1f%% of the in-core need), plan %s%s\n\n",
      human_bytes(smallest.bytes).c_str(), static_cast<unsigned long long>(smallest.bytes),
      100.0 * static_cast<double>(smallest.bytes) / static_cast<double>(need),
      smallest.plan.str().c_str(),
      smallest.proven ? "" : " (search cut short: not proven smallest)");

  // Plans: per budget the planner's and every single strategy that fits.
  std::vector<Run> runs;
  std::vector<Row> rows;
  auto run_of = [&](const ooc::Plan& p) {
    for (size_t i = 0; i < runs.size(); ++i)
      if (runs[i].plan == p) return i;
    const ooc::MemorySchedule s(chain, p);
    runs.push_back(Run{
        p, ooc::predict(chain, p, profile), s.peak_bytes(), s.tier_bytes(), {}, {}, {}, {}, {}});
    return runs.size() - 1;
  };
  for (double pct : o.budgets) {
    uint64_t budget = static_cast<uint64_t>(std::floor(static_cast<double>(need) * pct / 100.0));
    bool infeasible = false;
    ooc::PlannerResult r;
    try {
      r = ooc::plan_step(chain, profile, budget);
    } catch (const UserError& e) {
      infeasible = true;
      std::printf(
          "budget %s (%s): no plan fits, smallest %s (%llu bytes, %.1f%%): measured there "
          "instead\n  [%s]\n",
          pct_label(pct).c_str(), human_bytes(budget).c_str(), human_bytes(smallest.bytes).c_str(),
          static_cast<unsigned long long>(smallest.bytes),
          100.0 * static_cast<double>(smallest.bytes) / static_cast<double>(need), e.what());
      budget = smallest.bytes;
      bool seen = false;  // an earlier budget already fell back to the smallest
      for (Row& row : rows)
        if (row.infeasible) {
          row.also.push_back(pct);
          seen = true;
        }
      if (seen) continue;
      r = ooc::plan_step(chain, profile, budget);
    }
    rows.push_back(
        Row{pct, infeasible, budget, ooc::Strategy::Planner, run_of(r.best.plan), r.optimal, {}});
    for (const ooc::Evaluated& b : r.baselines)
      if (b.fits)
        rows.push_back(Row{pct, infeasible, budget, b.strategy, run_of(b.plan), true, {}});
    std::string none;
    for (const ooc::Evaluated& b : r.baselines)
      if (!b.fits)
        none += fmt::format(" {} ({} needs {});", slug(b.strategy), b.plan.str(),
                            human_bytes(b.prediction.peak_bytes));
    if (!none.empty())
      std::printf("budget %s: do not fit:%s\n", pct_label(pct).c_str(), none.c_str());
  }
  uint64_t tier_max = 0;
  for (const Run& r : runs) tier_max = std::max(tier_max, r.tier_bytes);
  if (tier_max > tier->capacity()) {  // not expected: swap-all swaps the most
    transfers.wait_all();
    tier = ooc::open_slow_tier(tier_spec, tier_max);
  }
  std::printf("distinct plans: %zu; slow tier used up to %s of %s\n", runs.size(),
              human_bytes(tier_max).c_str(), human_bytes(tier->capacity()).c_str());

  // The check before timing: gradients of every plan bitwise those of in-core training.
  in_core.grads().fill(0.0f);
  const double loss_ref = in_core.forward_backward(micro, o.seed, step);
  const Tensor g_ref = in_core.grads();
  if (!std::isfinite(loss_ref) || std::fabs(loss_ref - std::log(256.0)) > 0.2) {
    std::printf(
        "bench_ooc_step: CHECK FAILED: in-core loss %.4f (want about ln 256 = 5.545 at init)\n",
        loss_ref);
    return 1;
  }
  for (const Run& r : runs) {
    runtime.set_schedule(ooc::MemorySchedule(chain, r.plan), &transfers, tier.get());
    out_of_core.grads().fill(0.0f);
    const double loss = out_of_core.forward_backward(micro, o.seed, step);
    if (loss != loss_ref || std::memcmp(out_of_core.grads().data_as<float>(),
                                        g_ref.data_as<float>(), g_ref.nbytes()) != 0) {
      const float* a = out_of_core.grads().data_as<float>();
      const float* b = g_ref.data_as<float>();
      int64_t differ = 0, first = -1;
      for (int64_t i = 0; i < g_ref.numel(); ++i)
        if (std::memcmp(a + i, b + i, sizeof(float)) != 0) {
          if (first < 0) first = i;
          ++differ;
        }
      std::printf(
          "bench_ooc_step: CHECK FAILED: plan %s: loss %.9g vs in-core %.9g; %lld of %lld "
          "gradients differ "
          "bitwise (first [%lld]: %.9g vs %.9g)\n",
          r.plan.str().c_str(), loss, loss_ref, static_cast<long long>(differ),
          static_cast<long long>(g_ref.numel()), static_cast<long long>(first),
          first >= 0 ? a[first] : 0.0f, first >= 0 ? b[first] : 0.0f);
      return 1;
    }
  }
  std::printf("check: gradients of all %zu plans bitwise equal to in-core (loss %.6f)\n\n",
              runs.size(), loss_ref);

  // Timing, interleaved: each repetition runs every plan once and the in-core model once, starting
  // one further along each time (so that no contender always follows the same one); rep 0 warms
  // up and is discarded.
  std::vector<double> in_core_s;
  const size_t contenders = runs.size() + 1;  // the last: the in-core model
  for (int rep = 0; rep <= o.reps; ++rep) {
    for (size_t i = 0; i < contenders; ++i) {
      const size_t c = (i + static_cast<size_t>(rep)) % contenders;
      if (c == runs.size()) {
        in_core.grads().fill(0.0f);
        const auto t0 = Clock::now();
        in_core.forward_backward(micro, o.seed, step);
        const double s = std::chrono::duration<double>(Clock::now() - t0).count();
        if (rep > 0) in_core_s.push_back(s);
        continue;
      }
      Run& r = runs[c];
      runtime.set_schedule(ooc::MemorySchedule(chain, r.plan), &transfers, tier.get());
      out_of_core.grads().fill(0.0f);
      const auto t0 = Clock::now();
      out_of_core.forward_backward(micro, o.seed, step);
      const double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (rep == 0) continue;
      const ooc::StepMeasure& m = runtime.last_step();
      r.wall_s.push_back(s);
      r.step_s.push_back(m.step_s);
      r.stall_s.push_back(m.stall_s);
      double busy = 0;  // the compute stream's: every operation's forward, backward, recompute
      for (size_t j = 0; j < m.forward_s.size(); ++j)
        busy += m.forward_s[j] + m.backward_s[j] + m.recompute_s[j];
      r.compute_s.push_back(busy);
      r.high_water.push_back(m.high_water);
    }
    std::fprintf(stderr, "bench_ooc_step: rep %d of %d done%s\n", rep, o.reps,
                 rep == 0 ? " (warm-up)" : "");
  }
  const double in_core_med = median(in_core_s);
  const auto [ic_lo, ic_hi] = std::minmax_element(in_core_s.begin(), in_core_s.end());

  // The table.
  std::printf(
      "slow tier %s; %d timed repetitions after 1 warm-up, interleaved; times in s; "
      "spread = (max - min) / median\n",
      o.tier.c_str(), o.reps);
  std::printf(
      "in-core model (no ActivationMemory): median %.3f s (min %.3f, max %.3f, spread %.1f%%)\n\n",
      in_core_med, *ic_lo, *ic_hi, 100.0 * (*ic_hi - *ic_lo) / in_core_med);
  std::printf("%-14s %-10s %-14s %-14s %8s %17s %9s %8s %9s %8s %8s %8s %11s %11s %4s %7s\n",
              "budget", "bytes", "strategy", "plan", "median", "(min-max)", "vs core", "rt step",
              "predict", "model", "compute", "pred.", "high-water", "pred. peak", "", "stall");
  std::map<std::string, double> worst_err;  // |error| per plan kind
  std::map<std::string, std::string> worst_at;
  bool peaks_equal = true;
  for (const Row& row : rows) {
    const Run& r = runs[row.run];
    const double med = median(r.wall_s);
    const auto [lo, hi] = std::minmax_element(r.wall_s.begin(), r.wall_s.end());
    const uint64_t hw = *std::max_element(r.high_water.begin(), r.high_water.end());
    const uint64_t hw_min = *std::min_element(r.high_water.begin(), r.high_water.end());
    const bool eq = hw == r.peak && hw_min == r.peak;
    peaks_equal &= eq;
    const double err = r.predicted.step_s / med - 1;
    const std::string label = row.label(need);
    std::printf(
        "%-14s %-10s %-14s %-14s %8.3f %17s %8.3fx %8.3f %9.3f %+7.1f%% %8.3f %8.3f %11llu %11llu "
        "%4s %7.3f\n",
        label.c_str(), human_bytes(row.budget).c_str(), slug(row.strategy),
        (r.plan.str() + (row.optimal ? "" : "*")).c_str(), med,
        fmt::format("({:.3f}-{:.3f})", *lo, *hi).c_str(), med / in_core_med, median(r.step_s),
        r.predicted.step_s, 100.0 * err, median(r.compute_s), r.predicted.compute_s,
        static_cast<unsigned long long>(hw), static_cast<unsigned long long>(r.peak),
        eq ? "==" : "!=", median(r.stall_s));
    const std::string kind = slug(row.strategy);
    if (!worst_err.count(kind) || std::fabs(err) > worst_err[kind]) {
      worst_err[kind] = std::fabs(err);
      worst_at[kind] = fmt::format("{} at {}", r.plan.str(), label);
    }
  }
  std::printf(
      "(median: steady_clock around forward_backward; rt step: the runtime's own step time; "
      "predict: the "
      "model's step; model: predict / median - 1;\n compute: the runtime's measured compute "
      "(forwards, "
      "backwards, recomputes), median, and pred.: the model's; high-water: the arena's, max over "
      "the timed "
      "steps; pred. peak: the schedule's;\n stall: compute waiting for transfers, median; plan*: "
      "the planner's "
      "search was cut short, not proven optimal; rows with the same plan share its samples)\n");
  if (!peaks_equal)
    std::printf(
        "WARNING: a measured high-water mark differs from its predicted peak (rows marked !=)\n");
  std::printf("\n");

  // Lines for scripts.
  std::printf("in_core_s %.4f\n", in_core_med);
  for (const Row& row : rows)
    std::printf("ratio %s %s %.3f\n", row.label(need).c_str(), slug(row.strategy),
                median(runs[row.run].wall_s) / in_core_med);
  for (const Row& row : rows) {
    const Run& r = runs[row.run];
    std::printf("model %s %s %+.3f\n", row.label(need).c_str(), slug(row.strategy),
                r.predicted.step_s / median(r.wall_s) - 1);
  }
  std::printf("\n");

  // The goals.
  auto planner_row = [&](double pct) -> const Row* {
    for (const Row& row : rows)
      if (row.asks(pct) && row.strategy == ooc::Strategy::Planner) return &row;
    return nullptr;
  };
  auto verdict = [](bool met) { return met ? "met" : "MISSED"; };
  std::printf("goals (tier %s):\n", o.tier.c_str());
  auto ratio_goal = [&](double pct, double limit) {
    const Row* row = planner_row(pct);
    if (row == nullptr) {
      std::printf("  planner at %s within %.2fx of in-core: not measured (add %g to --budgets)\n",
                  pct_label(pct).c_str(), limit, pct);
      return;
    }
    const double x = median(runs[row->run].wall_s) / in_core_med;
    if (row->infeasible)
      std::printf(
          "  planner at %s within %.2fx of in-core: MISSED: no plan fits %s (smallest %.1f%%); at "
          "the smallest "
          "budget the planner's %s is %.3fx\n",
          pct_label(pct).c_str(), limit, pct_label(pct).c_str(), 100.0 * row->budget / need,
          runs[row->run].plan.str().c_str(), x);
    else
      std::printf("  planner at %s within %.2fx of in-core: %s: %.3fx (plan %s)\n",
                  pct_label(pct).c_str(), limit, verdict(x <= limit), x,
                  runs[row->run].plan.str().c_str());
  };
  ratio_goal(50, 1.05);
  ratio_goal(15, 1.15);
  {
    const Row* row = planner_row(15);
    if (row == nullptr) {
      std::printf(
          "  planner 1.3x faster than the best single strategy at 15%%: not measured (add 15 to "
          "--budgets)\n");
    } else if (row->infeasible) {
      std::printf(
          "  planner 1.3x faster than the best single strategy at 15%%: MISSED: 15%% is infeasible "
          "for every "
          "plan (smallest %.1f%%), so the planner cannot be compared there",
          100.0 * row->budget / need);
      std::optional<double> best;
      for (const Row& b : rows)
        if (b.asks(15) && b.strategy != ooc::Strategy::Planner) {
          const double t = median(runs[b.run].wall_s);
          if (!best || t < *best) best = t;
        }
      if (best)
        std::printf(
            "; at the smallest budget the planner is %.3fx faster than the best single strategy "
            "there",
            *best / median(runs[row->run].wall_s));
      std::printf("\n");
    } else {
      const double planner = median(runs[row->run].wall_s);
      std::optional<double> best;
      std::string best_name;
      for (const Row& b : rows)
        if (b.asks(15) && b.strategy != ooc::Strategy::Planner) {
          const double t = median(runs[b.run].wall_s);
          if (!best || t < *best) {
            best = t;
            best_name = fmt::format("{} {}", slug(b.strategy), runs[b.run].plan.str());
          }
        }
      if (!best)
        std::printf(
            "  planner 1.3x faster than the best single strategy at 15%%: not comparable: no "
            "single strategy "
            "fits 15%% at all (only the planner trains there, at %.3fx in-core)\n",
            planner / in_core_med);
      else
        std::printf(
            "  planner 1.3x faster than the best single strategy at 15%%: %s: %.3fx (best baseline "
            "%s, %.3f s, vs "
            "planner %.3f s)\n",
            verdict(*best / planner >= 1.3), *best / planner, best_name.c_str(), *best, planner);
    }
  }
  double worst = 0;
  std::string per_kind;
  for (const auto& [k, e] : worst_err) {
    worst = std::max(worst, e);
    per_kind += fmt::format(" {} {:.1f}% ({});", k, 100 * e, worst_at[k]);
  }
  std::printf(
      "  performance model within 15%% of measured for every plan kind: %s: worst "
      "|predicted/measured - 1| "
      "%.1f%%; per kind:%s\n",
      verdict(worst <= 0.15), 100 * worst, per_kind.c_str());
  std::printf("  measured high-water equal to the predicted peak for every plan: %s\n",
              peaks_equal ? "yes" : "NO");
  return 0;
}

}  // namespace
}  // namespace tandem::bench

int main(int argc, char** argv) {
  CLI::App app{"tandem's out-of-core training step under fast-memory budgets, against in-core"};
  tandem::bench::Options o;
  app.add_option("--layers", o.layers, "GPT layers")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--d-model", o.d_model, "Model width")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--heads", o.heads, "Attention heads")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--seq-len", o.seq_len, "Sequence length")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--batch", o.batch, "Batch (one micro-batch on one rank)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--reps", o.reps, "Timed repetitions (after one warm-up repetition)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--tier", o.tier, "Slow tier: host or file:DIR")->capture_default_str();
  app.add_option("--budgets", o.budgets,
                 "Fast-tier budgets, percent of the in-core need (the keep-all peak)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1000.0));
  app.add_option("--threads", o.threads, "BLAS threads (and tandem's, which follow them)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--dropout", o.dropout, "Dropout probability")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.9));
  app.add_option("--seed", o.seed, "Seed of the weights, the batch and dropout")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // the table and the progress on stderr, in order
  tandem::blas::set_num_threads(o.threads);
  int rc = 1;
  try {
    tandem::comm::run_ranks(
        1, [&](tandem::comm::Communicator& world) { rc = tandem::bench::bench(o, world); });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_ooc_step: %s\n", e.what());
    return 1;
  }
  return rc;
}
