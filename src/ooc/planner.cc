// The planner's search (branch and bound over per-unit decisions), exhaustive enumeration for
// tests, and the single-strategy baselines.
#include "tandem/ooc/planner.h"

#include <algorithm>
#include <array>
#include <limits>

#include "tandem/core/bytes.h"
#include "tandem/core/error.h"

namespace tandem::ooc {
namespace {

// Micro-batches that run one after another repeat the same pattern: F0 B0 F1 B1 ...
int repeats(const nn::ChainLayout& chain) {
  const auto& o = chain.order;
  if (o.size() < 2 || o.size() % 2 != 0) return 0;
  for (size_t i = 0; i < o.size(); ++i)
    if (o[i].forward != (i % 2 == 0) || o[i].micro != static_cast<int>(i / 2)) return 0;
  return static_cast<int>(o.size() / 2);
}

nn::ChainLayout first_micro(const nn::ChainLayout& chain) {
  nn::ChainLayout c = chain;
  c.order = {{true, 0}, {false, 0}};
  return c;
}

struct Search {
  const nn::ChainLayout& chain;
  const Profile& profile;
  uint64_t budget;
  bool minimise_peak;  // else: time under the budget
  int64_t limit;
  int n;
  bool has_head;
  uint64_t input_bytes;
  std::vector<uint64_t> buffers_bytes;  // per unit
  uint64_t fixed_bytes;                 // the workspace

  Plan plan;
  std::optional<Evaluated> best;
  int64_t evaluated = 0;
  bool stopped = false;

  double value(const Evaluated& e) const {
    return minimise_peak ? static_cast<double>(e.prediction.peak_bytes) : e.prediction.step_s;
  }

  void leaf() {
    const bool any_swap = plan.swapped() > 0;
    for (int p = any_swap ? 0 : 1; p <= (any_swap ? kMaxPrefetch : 1); ++p) {
      if (++evaluated > limit) {
        stopped = true;
        return;
      }
      plan.prefetch = p;
      MemorySchedule s(chain, plan);
      Evaluated e{Strategy::Planner, plan, simulate(s, profile), false};
      e.fits = e.prediction.peak_bytes <= budget;
      if (!minimise_peak && !e.fits) continue;
      if (!best || value(e) < value(*best)) best = e;
    }
  }

  // Lower bounds that hold whatever the remaining decisions are:
  //   time_lb: the compute, the forwards of the units recomputed so far, and for each unit
  //     swapped with its write waited for ('s') the write itself (the next operation cannot
  //     start before it ends);
  //   kept: the bytes that earlier units hold until their backwards (Keep: input and buffers;
  //     Recompute: the input). The peak is at least what is live during unit j's forward: the
  //     workspace, unit j's input, buffers and output, the kept bytes and, when unit j - 1 was
  //     swapped without waiting ('S'), its input and buffers, still being written; and at least
  //     the kept bytes plus the last unit's buffers during the last forward.
  uint64_t forward_live(int j, uint64_t kept) const {
    uint64_t live = fixed_bytes + kept + 2 * input_bytes + buffers_bytes[static_cast<size_t>(j)];
    if (j > 0 && plan.units[static_cast<size_t>(j - 1)] == Decision::Swap)
      live += input_bytes + buffers_bytes[static_cast<size_t>(j - 1)];
    return live;
  }

  void dfs(int j, double time_lb, uint64_t kept) {
    if (stopped) return;
    const uint64_t mem_lb =
        j < n ? forward_live(j, kept) : fixed_bytes + kept + buffers_bytes.back();
    if (best) {
      if (minimise_peak ? static_cast<double>(mem_lb) >= value(*best) : time_lb >= value(*best))
        return;
    }
    if (!minimise_peak && mem_lb > budget) return;
    if (j == n) {
      leaf();
      return;
    }
    const bool last = j == n - 1;
    const uint64_t unit = input_bytes + buffers_bytes[static_cast<size_t>(j)];
    for (Decision d : {Decision::Keep, Decision::Recompute, Decision::Swap, Decision::SwapSync,
                       Decision::Continue}) {
      if (d == Decision::Continue &&
          (j == 0 || !recomputes(plan.units[static_cast<size_t>(j - 1)])))
        continue;
      if (last && !has_head && recomputes(d)) continue;
      plan.units[static_cast<size_t>(j)] = d;
      double t = time_lb;
      uint64_t k = kept;
      if (recomputes(d)) t += profile.recompute(j);
      if (d == Decision::SwapSync) t += static_cast<double>(unit) / profile.write_bytes_per_s;
      if (!last && d == Decision::Keep) k += unit;
      if (!last && d == Decision::Recompute) k += input_bytes;
      dfs(j + 1, t, k);
      if (stopped) return;
    }
  }
};

// The leanest plans, which a search cut short may not reach: every unit swapped with its write
// waited for and fetched at its backward, the last kept, swapped or recomputed (never
// recomputed where the stage hands its output on).
std::vector<Plan> lean_plans(const nn::ChainLayout& chain) {
  std::vector<Plan> out;
  for (const Decision last : {Decision::SwapSync, Decision::Keep, Decision::Recompute}) {
    if (chain.head.empty() && recomputes(last)) continue;
    Plan p{std::vector<Decision>(static_cast<size_t>(chain.units), Decision::SwapSync), 0};
    p.units.back() = last;
    out.push_back(p);
  }
  return out;
}

Search make_search(const nn::ChainLayout& chain, const Profile& profile, uint64_t budget,
                   bool minimise_peak, int64_t limit) {
  const MemorySchedule sizes(chain, keep_all(chain.units));
  const uint64_t ws = sizes.regions()[static_cast<size_t>(sizes.workspace())].bytes;
  std::vector<uint64_t> buffers;
  for (int u = 0; u < chain.units; ++u) buffers.push_back(sizes.buffers_bytes(u));
  Search s{chain,
           profile,
           budget,
           minimise_peak,
           limit,
           chain.units,
           !chain.head.empty(),
           sizes.input_bytes(),
           buffers,
           ws,
           keep_all(chain.units),
           std::nullopt,
           0,
           false};
  return s;
}

Evaluated scale(Evaluated e, int m) {
  if (m > 1) {
    e.prediction.step_s *= m;
    e.prediction.compute_s *= m;
    e.prediction.recompute_s *= m;
    e.prediction.stall_s *= m;
    e.prediction.swapped_bytes *= static_cast<uint64_t>(m);
  }
  return e;
}

}  // namespace

Prediction predict(const nn::ChainLayout& chain, const Plan& plan, const Profile& profile,
                   bool timeline) {
  const int m = repeats(chain);
  if (m > 1 && !timeline) {
    Evaluated e{Strategy::Planner, plan,
                simulate(MemorySchedule(first_micro(chain), plan), profile), true};
    return scale(e, m).prediction;
  }
  return simulate(MemorySchedule(chain, plan), profile, timeline);
}

std::vector<Evaluated> evaluate_baselines(const nn::ChainLayout& chain, const Profile& profile,
                                          uint64_t budget) {
  const int n = chain.units;
  const int per_block = static_cast<int>(chain.kinds.size());
  const bool has_head = !chain.head.empty();
  auto eval = [&](Strategy s, const Plan& p) {
    Evaluated e{s, p, predict(chain, p, profile), false};
    e.fits = e.prediction.peak_bytes <= budget;
    return e;
  };
  // Of several variants: the fastest that fits, else the smallest.
  auto pick = [](std::vector<Evaluated> v) {
    std::optional<Evaluated> best;
    for (auto& e : v) {
      if (!best)
        best = e;
      else if (e.fits && (!best->fits || e.prediction.step_s < best->prediction.step_s))
        best = e;
      else if (!e.fits && !best->fits && e.prediction.peak_bytes < best->prediction.peak_bytes)
        best = e;
    }
    return *best;
  };
  std::vector<Evaluated> out;
  out.push_back(eval(Strategy::InCore, keep_all(n)));
  std::vector<Evaluated> v;
  for (int p = 0; p <= kMaxPrefetch; ++p) v.push_back(eval(Strategy::SwapAll, swap_all(n, p)));
  out.push_back(pick(v));
  // A stage that hands its output on keeps its last unit's buffers in the checkpointing plans.
  auto last_kept = [&](Plan p) {
    if (!has_head) {
      p.units.back() = Decision::Keep;
      if (n >= 2 && p.units[static_cast<size_t>(n) - 2] == Decision::Continue)
        p.units[static_cast<size_t>(n) - 2] = Decision::Recompute;  // no longer continued
    }
    return p;
  };
  out.push_back(eval(Strategy::RecomputeAll, last_kept(recompute_all(n, per_block))));
  out.push_back(eval(Strategy::Chen, last_kept(chen_sqrt(n, per_block))));
  v.clear();
  for (int s = 0; s <= n; ++s)
    for (int p = s > 0 ? 0 : 1; p <= (s > 0 ? kMaxPrefetch : 1); ++p) {
      Plan k = karma(n, s, p);
      if (!has_head && s < n) k.units.back() = Decision::Swap;
      v.push_back(eval(Strategy::Karma, k));
    }
  out.push_back(pick(v));
  return out;
}

PlannerResult plan_step(const nn::ChainLayout& chain, const Profile& profile, uint64_t budget,
                        int64_t max_evaluations) {
  if (profile.units() != chain.units)
    user_error("out-of-core profile has {} units; this stage runs {}", profile.units(),
               chain.units);
  const int m = std::max(1, repeats(chain));
  const nn::ChainLayout planned = repeats(chain) > 1 ? first_micro(chain) : chain;
  PlannerResult r;
  r.baselines = evaluate_baselines(chain, profile, budget);

  Search s = make_search(planned, profile, budget, false, max_evaluations);
  // Seeds: the best single strategy that fits, and the lean plans (which fit whenever anything
  // does, so a search cut short still finds a plan).
  std::vector<Evaluated> seeds = r.baselines;
  for (const Plan& p : lean_plans(chain)) {
    Evaluated e{Strategy::Planner, p, predict(chain, p, profile), false};
    e.fits = e.prediction.peak_bytes <= budget;
    seeds.push_back(e);
  }
  for (const Evaluated& b : seeds)
    if (b.fits && (!s.best || b.prediction.step_s / m < s.best->prediction.step_s)) {
      s.best = b;
      s.best->prediction = simulate(MemorySchedule(planned, b.plan), profile);  // per micro-batch
    }
  s.dfs(0, profile.compute_s(), 0);
  r.evaluated = s.evaluated;
  r.optimal = !s.stopped;
  if (!s.best) {
    const SmallestBudget low = smallest_budget(chain, profile);
    user_error(
        "no out-of-core plan fits a memory budget of {} ({} bytes) for this stage: the "
        "smallest budget {}is {} ({} bytes), with plan {}",
        human_bytes(budget), budget, low.proven ? "that works " : "found that works ",
        human_bytes(low.bytes), low.bytes, low.plan.str());
  }
  r.best = scale(*s.best, m);
  r.best.strategy = Strategy::Planner;
  return r;
}

SmallestBudget smallest_budget(const nn::ChainLayout& chain, const Profile& profile,
                               int64_t max_evaluations) {
  const nn::ChainLayout planned = repeats(chain) > 1 ? first_micro(chain) : chain;
  Search low = make_search(planned, profile, 0, true, max_evaluations);
  std::vector<Evaluated> seeds = evaluate_baselines(chain, profile, 0);
  for (const Plan& p : lean_plans(chain))
    seeds.push_back(Evaluated{Strategy::Planner, p, predict(chain, p, profile), true});
  for (const Evaluated& b : seeds)
    if (!low.best || b.prediction.peak_bytes < low.best->prediction.peak_bytes) low.best = b;
  low.dfs(0, 0, 0);
  return SmallestBudget{low.best->prediction.peak_bytes, low.best->plan, !low.stopped};
}

std::optional<Evaluated> plan_exhaustive(const nn::ChainLayout& chain, const Profile& profile,
                                         uint64_t budget) {
  const int n = chain.units;
  std::optional<Evaluated> best;
  constexpr std::array kinds{Decision::Keep, Decision::Swap, Decision::SwapSync,
                             Decision::Recompute, Decision::Continue};
  int64_t combos = 1;
  for (int j = 0; j < n; ++j) combos *= static_cast<int64_t>(kinds.size());
  for (int64_t code = 0; code < combos; ++code) {
    Plan p{{}, 1};
    int64_t c = code;
    for (int j = 0; j < n; ++j, c /= static_cast<int64_t>(kinds.size()))
      p.units.push_back(kinds[static_cast<size_t>(c % static_cast<int64_t>(kinds.size()))]);
    try {
      p.validate();
      for (int pf = 0; pf <= kMaxPrefetch; ++pf) {
        p.prefetch = pf;
        Evaluated e{Strategy::Planner, p, predict(chain, p, profile), false};
        e.fits = e.prediction.peak_bytes <= budget;
        if (e.fits && (!best || e.prediction.step_s < best->prediction.step_s)) best = e;
      }
    } catch (const UserError&) {
      // not a valid plan (a Continue without a segment, a recomputed hand-off)
    }
  }
  return best;
}

}  // namespace tandem::ooc
