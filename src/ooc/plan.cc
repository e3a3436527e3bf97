// Plans as values: their names, validation, and the single-strategy baselines.
#include "tandem/ooc/plan.h"

#include <fmt/format.h>

#include <cmath>

#include "tandem/core/error.h"

namespace tandem::ooc {

std::string Plan::str() const {
  std::string s;
  for (Decision d : units) s += static_cast<char>(d);
  return fmt::format("{}/p{}", s, prefetch);  // every decision is one letter
}

Plan Plan::parse(std::string_view text) {
  const size_t slash = text.find("/p");
  if (slash == std::string_view::npos)
    user_error(
        "out-of-core plan '{}' is not of the form <one of K S s R C per unit (two per "
        "block)>/p<prefetch>, "
        "e.g. 'KKSR/p1'",
        text);
  Plan p;
  for (char c : text.substr(0, slash)) {
    if (c != 'K' && c != 'S' && c != 's' && c != 'R' && c != 'C')
      user_error(
          "out-of-core plan '{}': '{}' is not a decision (K keep, S swap, s swap with the "
          "write waited for, R recompute, C continue a recomputed segment)",
          text, c);
    p.units.push_back(static_cast<Decision>(c));
  }
  const std::string_view num = text.substr(slash + 2);
  int v = 0;
  if (num.empty() || num.size() > 3)
    user_error("out-of-core plan '{}': bad prefetch '{}'", text, num);
  for (char c : num) {
    if (c < '0' || c > '9') user_error("out-of-core plan '{}': bad prefetch '{}'", text, num);
    v = v * 10 + (c - '0');
  }
  p.prefetch = v;
  p.validate();
  return p;
}

void Plan::validate() const {
  if (units.empty()) user_error("out-of-core plan '{}' has no units", str());
  if (prefetch < 0) user_error("out-of-core plan '{}': prefetch must be >= 0", str());
  for (size_t j = 0; j < units.size(); ++j)
    if (units[j] == Decision::Continue &&
        (j == 0 || (units[j - 1] != Decision::Recompute && units[j - 1] != Decision::Continue)))
      user_error(
          "out-of-core plan '{}': unit {} continues a recomputed segment, but unit {} "
          "is not recomputed",
          str(), j, static_cast<int>(j) - 1);
}

int Plan::count(Decision d) const {
  int n = 0;
  for (Decision b : units) n += b == d;
  return n;
}

std::string_view strategy_name(Strategy s) {
  switch (s) {
    case Strategy::InCore:
      return "in-core (keep all)";
    case Strategy::SwapAll:
      return "swap all (vDNN)";
    case Strategy::RecomputeAll:
      return "recompute all (checkpoint every block)";
    case Strategy::Chen:
      return "sqrt(n) segments (Chen)";
    case Strategy::Karma:
      return "swap early, recompute late (KARMA)";
    case Strategy::Planner:
      return "planner";
  }
  return "?";
}

Plan keep_all(int n) {
  return Plan{std::vector<Decision>(static_cast<size_t>(n), Decision::Keep), 1};
}

Plan swap_all(int n, int prefetch) {
  return Plan{std::vector<Decision>(static_cast<size_t>(n), Decision::Swap), prefetch};
}

namespace {

// Segments of `seg` units, each recomputed from its first unit's input.
Plan segments(int n, int seg) {
  Plan p{{}, 1};
  for (int j = 0; j < n; ++j)
    p.units.push_back(j % seg == 0 ? Decision::Recompute : Decision::Continue);
  return p;
}

}  // namespace

Plan recompute_all(int n, int per_block) { return segments(n, std::max(1, per_block)); }

Plan chen_sqrt(int n, int per_block) {
  per_block = std::max(1, per_block);
  const int blocks = std::max(1, n / per_block);
  const int seg = std::max(1, static_cast<int>(std::ceil(std::sqrt(static_cast<double>(blocks)))));
  return segments(n, seg * per_block);
}

Plan karma(int n, int swapped, int prefetch) {
  Plan p{{}, swapped > 0 ? prefetch : 1};
  for (int j = 0; j < n; ++j) p.units.push_back(j < swapped ? Decision::Swap : Decision::Recompute);
  return p;
}

}  // namespace tandem::ooc
