// Recipe::apply: the recipe's choices carried out by the transformations, in the order they
// allow (split and reorder rewrite the program, then as_slice, then fuse, then overlap), each
// collective as its part says. The schedule tracks the collectives across rewrites
// (Schedule::tracked), a split AllReduce by its ReduceScatter.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <optional>

#include "candidates.h"
#include "checked.h"
#include "recipe_steps.h"
#include "rewrite.h"
#include "tandem/core/error.h"
#include "tandem/schedule/as_slice.h"
#include "tandem/schedule/fuse.h"
#include "tandem/schedule/overlap.h"
#include "tandem/schedule/recipe.h"
#include "tandem/schedule/reorder.h"
#include "tandem/schedule/split.h"
#include "units.h"

namespace tandem::schedule {

using dsl::Op;
using dsl::Program;
using dsl::Stage;

namespace {

// The collectives of the schedule's current program, in the order of the recipe's parts: the
// ids the schedule tracks (Recipe::apply starts tracking the program's collectives; a split one
// is followed by its ReduceScatter).
std::vector<int> current(const Schedule& s, size_t want) {
  const std::vector<int>& out = s.tracked();
  TANDEM_CHECK(out.size() == want, "schedule '{}' tracks {} collectives, not {}", s.name(),
               out.size(), want);
  for (int c : out)
    TANDEM_CHECK(c >= 0 && (s.program().stage(c).op == Op::AllReduce ||
                            s.program().stage(c).op == Op::ReduceScatter),
                 "schedule '{}' lost track of a collective", s.name());
  return out;
}

// "schedule 'RS-C-AG', collective 1 (g_sum)": who a recipe's error is about, by the collective's
// name in the program as written.
std::string who(const Schedule& s, size_t k) {
  const int c = recipe_collectives(s.original()).at(k);
  return fmt::format("schedule '{}', collective {} ({})", s.name(), k + 1,
                     s.original().display_name(c));
}

std::optional<int> first(const Program& p, const std::function<bool(const Stage&)>& pred) {
  for (const Stage& st : p.stages())
    if (pred(st)) return st.id;
  return std::nullopt;
}

// The units on the way from collective `c` to the stages `to`, one representative stage each,
// in order.
std::vector<int> chain_to(const Schedule& s, int c, const std::vector<int>& to) {
  const Program& p = s.program();
  const detail::UnitGraph g = detail::build_units(p, s.fused(), s.overlaps());
  const auto below = detail::descendants(p, c);
  const auto above = detail::ancestors(p, to);
  std::vector<int> seen_units;
  std::vector<int> out;
  for (const Stage& st : p.stages()) {
    if (!(st.id == c || (below[static_cast<size_t>(st.id)] && above[static_cast<size_t>(st.id)])))
      continue;
    const int u = g.unit_of[static_cast<size_t>(st.id)];
    if (u < 0 || std::find(seen_units.begin(), seen_units.end(), u) != seen_units.end()) continue;
    seen_units.push_back(u);
    out.emplace_back(st.id);
  }
  return out;
}

}  // namespace

std::vector<int> recipe_collectives(const Program& program) {
  std::vector<int> out;
  for (const Stage& st : program.stages())
    if (st.op == Op::AllReduce && st.type.shape.rank() > 0) out.push_back(st.id);
  return out;
}

namespace {

// Recipe::parts, or why the program cannot take the recipe's parts.
detail::Rejection parts_of(const Recipe& r, const Program& program,
                           std::vector<CollectiveRecipe>& out) {
  const std::vector<int> colls = recipe_collectives(program);
  if (colls.empty()) {
    if (!r.collectives.empty())
      return fmt::format(
          "schedule '{}': program '{}' has no AllReduce of at least one dim, so it takes no "
          "per-collective part; its schedules are C and fused(C)",
          r.str(), program.name());
    out.clear();
    return std::nullopt;
  }
  if (r.collectives.empty())
    return fmt::format(
        "schedule '{}': program '{}' has {} collective(s) ({}); name a part for them (AR-C, ...)",
        r.str(), program.name(), colls.size(), detail::name_list(program, colls));
  if (r.collectives.size() != 1 && r.collectives.size() != colls.size())
    return fmt::format(
        "schedule '{}' has {} parts, but program '{}' has {} collective(s) ({}); give one part for "
        "all "
        "of them or one per collective, in program order, joined by '|'",
        r.str(), r.collectives.size(), program.name(), colls.size(),
        detail::name_list(program, colls));
  out = r.collectives.size() == 1
            ? std::vector<CollectiveRecipe>(colls.size(), r.collectives.front())
            : r.collectives;
  return std::nullopt;
}

}  // namespace

std::vector<CollectiveRecipe> Recipe::parts(const Program& program) const {
  std::vector<CollectiveRecipe> out;
  if (auto why = parts_of(*this, program, out)) user_error("{}", *why);
  return out;
}

Recipe Recipe::compacted() const {
  Recipe r = *this;
  if (r.collectives.size() > 1 &&
      std::all_of(r.collectives.begin(), r.collectives.end(),
                  [&](const CollectiveRecipe& c) { return c == r.collectives.front(); }))
    r.collectives.resize(1);
  return r;
}

namespace detail {

Rejection apply_moves(Schedule& s, const std::vector<CollectiveRecipe>& parts) {
  if (s.tracked().empty()) s.tracked() = recipe_collectives(s.program());
  for (size_t k = 0; k < parts.size(); ++k) {
    if (parts[k].move == Move::None) continue;
    Schedule::SplitResult made{};
    if (auto why = try_split(s, current(s, parts.size())[k], &made)) return why;
    s.tracked()[k] = made.reduce_scatter;
  }
  for (size_t k = 0; k < parts.size(); ++k) {
    const Move m = parts[k].move;
    if (m != Move::Reorder && m != Move::ReorderTransfers) continue;
    const Program& p = s.program();
    const int rs = current(s, parts.size())[k];
    const auto ag =
        first(p, [&](const Stage& st) { return st.op == Op::AllGather && st.args[0] == rs; });
    TANDEM_CHECK(ag.has_value(), "the ReduceScatter {} split made has no AllGather",
                 p.display_name(rs));
    const bool transfers = m == Move::ReorderTransfers;
    const std::vector<int> movable = detail::movable_consumers(p, *ag, transfers);
    if (movable.empty())
      return fmt::format(
          "{}: nothing that consumes its result can run on this rank's slice, so reorder would "
          "change "
          "nothing; split it without reordering (RS-AG-C)",
          who(s, k));
    const bool moves_transfer = std::any_of(movable.begin(), movable.end(), [&](int x) {
      return dsl::op_kind(p.stage(x).op) == dsl::OpKind::Transfer;
    });
    if (transfers && !moves_transfer)
      return fmt::format(
          "{}: no send or receive consumes its result where it could carry the slice, so "
          "RS-C-P2P-AG "
          "would be RS-C-AG; write that",
          who(s, k));
    if (auto why = try_reorder(s, *ag, movable)) return why;
  }
  return std::nullopt;
}

Rejection apply_slices(Schedule& s, const std::vector<std::string>& inputs) {
  for (const std::string& name : inputs) {
    std::string why;
    const std::optional<int> x = s.lookup(name, "as_slice", &why);
    if (!x) return why;
    if (auto rejected = try_as_slice(s, *x)) return rejected;
  }
  return std::nullopt;
}

Rejection apply_fusion(Schedule& s, const std::vector<CollectiveRecipe>& parts, bool loops) {
  for (size_t k = 0; k < parts.size(); ++k) {
    if (!parts[k].fuse) continue;
    const int c = current(s, parts.size())[k];
    const std::vector<int> f = detail::fusable_into(s, c);
    // A ReduceScatter with only its AllGather fused is an AllReduce again: no computation inside.
    const bool computes = std::any_of(f.begin(), f.end(), [&](int x) {
      return x != c && s.program().stage(x).op != Op::AllGather;
    });
    if (!computes)
      return fmt::format(
          "{}: no computation on its result can run inside it (on each reduced chunk), so there is "
          "nothing to fuse into it",
          who(s, k));
    if (auto why = try_fuse(s, f)) return why;
  }
  if (!loops) return std::nullopt;
  const auto groups = detail::fusable_loops(s);
  const bool any_collective =
      std::any_of(parts.begin(), parts.end(), [](const CollectiveRecipe& p) { return p.fuse; });
  if (groups.empty() && !any_collective)
    return fmt::format(
        "schedule '{}': no two element-wise computations of program '{}' can share a loop, so "
        "fused(C) is C",
        s.name(), s.program().name());
  for (const auto& g : groups)
    if (auto why = try_fuse(s, g)) return why;
  return std::nullopt;
}

Rejection apply_overlaps(Schedule& s, const std::vector<CollectiveRecipe>& parts) {
  for (size_t k = 0; k < parts.size(); ++k) {
    const CollectiveRecipe& part = parts[k];
    if (!part.overlapped()) continue;
    const Program& p = s.program();
    const int c = current(s, parts.size())[k];
    const Stage& cs = p.stage(c);
    std::vector<int> chain;
    if (part.overlap_matmul) {
      if (p.stage(cs.args[0]).op != Op::Matmul)
        return fmt::format(
            "{}: ol(MM,...) overlaps a collective with the matmul producing its input, but its "
            "input "
            "{} is computed by {}",
            who(s, k), p.display_name(cs.args[0]), dsl::op_name(p.stage(cs.args[0]).op));
      chain.emplace_back(cs.args[0]);
    }
    const auto below = detail::descendants(p, c);
    if (part.overlap_send) {
      auto x = first(p, [&](const Stage& st) {
        return st.op == Op::Send && below[static_cast<size_t>(st.id)];
      });
      if (!x)
        return fmt::format(
            "{}: ol(...,P2P) overlaps a collective with the send its result reaches, but no send "
            "follows it",
            who(s, k));
      const auto rest = chain_to(s, c, {*x});
      chain.insert(chain.end(), rest.begin(), rest.end());
    } else if (cs.type.layout.is_sliced()) {
      // The slices computed from a ReduceScatter are gathered inside the overlap: the chain runs
      // to the last computation before each AllGather (the gathers join by themselves).
      std::vector<int> gathered;
      for (const Stage& st : p.stages())
        if (st.op == Op::AllGather && (st.args[0] == c || below[static_cast<size_t>(st.args[0])]))
          gathered.push_back(st.args[0]);
      const auto rest = chain_to(s, c, gathered);
      chain.insert(chain.end(), rest.begin(), rest.end());
    } else {
      chain.emplace_back(c);
    }
    if (auto why = try_overlap(s, chain, part.blocks)) return why;
  }
  return std::nullopt;
}

}  // namespace detail

Recipe Recipe::unscheduled(const Program& program) {
  Recipe r;
  if (!recipe_collectives(program).empty()) r.collectives.resize(1);
  return r;
}

Applied Recipe::try_apply(const Program& program) const {
  std::vector<CollectiveRecipe> parts;
  if (auto why = parts_of(*this, program, parts)) return {std::nullopt, std::move(*why)};
  Schedule s(program);
  s.set_name(str());
  detail::Rejection why = detail::apply_moves(s, parts);
  if (!why) why = detail::apply_slices(s, slice);
  if (!why) why = detail::apply_fusion(s, parts, fused_loops());
  if (!why) why = detail::apply_overlaps(s, parts);
  if (why) return {std::nullopt, std::move(*why)};
  return {std::move(s), ""};
}

Schedule Recipe::apply(const Program& program) const {
  Applied a = try_apply(program);
  if (!a.schedule) user_error("{}", a.why);
  return std::move(*a.schedule);
}

NamedSchedule schedule_by_name(const Program& program, std::string_view name) {
  Recipe r;
  try {
    r = Recipe::parse(name);
  } catch (const UserError& e) {
    user_error("program '{}': {}", program.name(), e.what());
  }
  Applied a = r.try_apply(program);
  if (!a.schedule) user_error("program '{}': {}", program.name(), a.why);
  return NamedSchedule{r.str(), std::move(r), std::move(*a.schedule)};
}

}  // namespace tandem::schedule
