// Enumerating the legal schedules of a program: every combination of split, reorder, as_slice,
// fuse and overlap that the program's structure allows, each built by the transformations
// themselves (so each is checked by them) and named after the shape it takes.
#include "tandem/schedule/enumerate.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <optional>
#include <set>

#include "candidates.h"
#include "rewrite.h"
#include "tandem/core/error.h"
#include "tandem/schedule/as_slice.h"
#include "tandem/schedule/fuse.h"
#include "tandem/schedule/lower.h"
#include "tandem/schedule/overlap.h"
#include "tandem/schedule/reorder.h"
#include "tandem/schedule/split.h"
#include "units.h"

namespace tandem::schedule {

using dsl::Op;
using dsl::Program;
using dsl::Stage;

namespace {

enum class Move { None, Split, Reorder, ReorderTransfers };
enum class Fusion { None, Loops, Collective };

struct Choice {
  Move move = Move::None;
  bool slice = false;
  Fusion fusion = Fusion::None;
  bool overlap_matmul = false;
  bool overlap_send = false;
};

std::optional<int> first(const Program& p, const std::function<bool(const Stage&)>& pred,
                         const std::set<int>& skip = {}) {
  for (const Stage& s : p.stages())
    if (!skip.count(s.id) && pred(s)) return s.id;
  return std::nullopt;
}

bool has_op(const Program& p, Op op) {
  return std::any_of(p.stages().begin(), p.stages().end(), [&](const Stage& s) { return s.op == op; });
}

// The inputs enumeration may store sliced.
std::vector<std::string> state_inputs(const Program& p, const EnumerateOptions& o) {
  if (o.state) return *o.state;
  std::vector<std::string> out;
  const auto users = detail::all_users(p);
  for (int id : p.inputs()) {
    const int u = p.updater(id);
    if (u >= 0 && !users[static_cast<size_t>(u)].empty()) out.push_back(p.display_name(id));
  }
  return out;
}

// The units on the way from collective `c` to the stages `to`, one representative stage each,
// in order.
std::vector<StageRef> chain_to(const Schedule& s, int c, const std::vector<int>& to) {
  const Program& p = s.program();
  const detail::UnitGraph g = detail::build_units(p, s.fused(), s.overlaps());
  const auto below = detail::descendants(p, c);
  const auto above = detail::ancestors(p, to);
  std::vector<int> seen_units;
  std::vector<StageRef> out;
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

// Builds the schedule a choice describes, or nullopt when the program does not allow it (or it
// would repeat a simpler choice).
std::optional<NamedSchedule> build(const Program& program, const Choice& ch, const EnumerateOptions& opt) {
  Schedule s(program);
  const bool has_allreduce = has_op(program, Op::AllReduce);
  if (ch.move != Move::None && !has_allreduce) return std::nullopt;
  if (ch.move == Move::ReorderTransfers && !has_op(program, Op::Send)) return std::nullopt;
  if (ch.slice && ch.move != Move::Reorder && ch.move != Move::ReorderTransfers) return std::nullopt;

  // Split every AllReduce of at least one dim.
  if (ch.move != Move::None) {
    std::set<int> scalars;
    while (auto ar = first(s.program(), [](const Stage& st) { return st.op == Op::AllReduce && st.type.shape.rank() > 0; }))
      split(s, *ar);
    if (has_op(s.program(), Op::AllReduce) && !has_op(s.program(), Op::ReduceScatter)) return std::nullopt;
  }
  // Move each AllGather of a ReduceScatter past every consumer that can run on the slice.
  if (ch.move == Move::Reorder || ch.move == Move::ReorderTransfers) {
    const bool transfers = ch.move == Move::ReorderTransfers;
    std::set<int> done;  // ReduceScatters whose gathers were handled (ids survive: only later ids move)
    bool moved_any = false, moved_transfer = false;
    while (true) {
      const Program& p = s.program();
      auto ag = first(p, [&](const Stage& st) {
        return st.op == Op::AllGather && p.stage(st.args[0]).op == Op::ReduceScatter && !done.count(st.args[0]);
      });
      if (!ag) break;
      done.insert(p.stage(*ag).args[0]);
      const std::vector<int> movable = detail::movable_consumers(p, *ag, transfers);
      if (movable.empty()) continue;
      for (int m : movable) moved_transfer |= dsl::op_kind(p.stage(m).op) == dsl::OpKind::Transfer;
      std::vector<StageRef> refs(movable.begin(), movable.end());
      reorder(s, *ag, refs);
      moved_any = true;
    }
    if (!moved_any || (transfers && !moved_transfer)) return std::nullopt;
  }
  // Store the program's state sliced, where it is only used through its slice.
  std::vector<std::string> sliced;
  if (ch.slice) {
    for (const std::string& name : state_inputs(program, opt)) {
      try {
        as_slice(s, name);
        sliced.push_back(name);
      } catch (const UserError&) {
        // Not usable through its slice in this schedule: it stays whole.
      }
    }
    if (sliced.empty()) return std::nullopt;
  }
  // Fuse: computations into their collective, then the rest into loops.
  if (ch.fusion == Fusion::Collective) {
    bool any = false;
    std::set<int> tried;
    while (auto c = first(s.program(), [&](const Stage& st) {
             return (st.op == Op::AllReduce || st.op == Op::ReduceScatter) && s.fused_index(st.id) < 0;
           }, tried)) {
      tried.insert(*c);
      const std::vector<int> f = detail::fusable_into(s, *c);
      // A ReduceScatter with only its AllGather fused is an AllReduce again: not a new schedule.
      const bool computes = std::any_of(f.begin(), f.end(), [&](int x) {
        return x != *c && s.program().stage(x).op != Op::AllGather;
      });
      if (!computes) continue;
      fuse(s, std::vector<StageRef>(f.begin(), f.end()));
      any = true;
    }
    if (!any) return std::nullopt;
  }
  if (ch.fusion != Fusion::None) {
    const auto loops = detail::fusable_loops(s);
    if (ch.fusion == Fusion::Loops && loops.empty()) return std::nullopt;
    for (const auto& l : loops) fuse(s, std::vector<StageRef>(l.begin(), l.end()));
  }
  // Overlap: each matmul with the collective reducing it, and each collective with the send
  // its result reaches.
  if (ch.overlap_matmul || ch.overlap_send) {
    bool any = false;
    try {
      const Program& p = s.program();
      for (const Stage& c : p.stages()) {
        if (c.op != Op::AllReduce && c.op != Op::ReduceScatter) continue;
        std::vector<StageRef> chain;
        const bool mm = p.stage(c.args[0]).op == Op::Matmul;
        if (ch.overlap_matmul) {
          if (!mm) continue;
          chain.emplace_back(c.args[0]);
        }
        if (ch.overlap_send) {
          const auto below = detail::descendants(p, c.id);
          auto x = first(p, [&](const Stage& st) { return st.op == Op::Send && below[static_cast<size_t>(st.id)]; });
          if (!x) continue;
          const auto rest = chain_to(s, c.id, {*x});
          chain.insert(chain.end(), rest.begin(), rest.end());
        } else if (c.type.layout.is_sliced()) {
          // The slices computed from a ReduceScatter are gathered inside the overlap: the chain
          // runs to the last computation before each AllGather (the gathers join by themselves).
          const auto below = detail::descendants(p, c.id);
          std::vector<int> gathered;
          for (const Stage& st : p.stages())
            if (st.op == Op::AllGather && (st.args[0] == c.id || below[static_cast<size_t>(st.args[0])]))
              gathered.push_back(st.args[0]);
          const auto rest = chain_to(s, c.id, gathered);
          chain.insert(chain.end(), rest.begin(), rest.end());
        } else {
          chain.emplace_back(c.id);
        }
        overlap(s, chain, opt.blocks);
        any = true;
        break;
      }
    } catch (const UserError&) {
      return std::nullopt;
    }
    if (!any) return std::nullopt;
  }

  // The name: CoCoNeT's notation.
  std::string c = ch.fusion == Fusion::Loops ? "fused(C)" : "C";
  std::string name;
  if (!has_allreduce) {
    name = ch.fusion == Fusion::None ? "C" : "fused(C)";
    if (ch.fusion == Fusion::Collective) return std::nullopt;
  } else {
    const bool coll = ch.fusion == Fusion::Collective;
    switch (ch.move) {
      case Move::None: name = coll ? "fused(AR-C)" : "AR-" + c; break;
      case Move::Split: name = coll ? "fused(RS-AG)-C" : "RS-AG-" + c; break;
      case Move::Reorder: name = coll ? "fused(RS-C-AG)" : "RS-" + c + "-AG"; break;
      case Move::ReorderTransfers: name = coll ? "fused(RS-C)-P2P-AG" : "RS-" + c + "-P2P-AG"; break;
    }
  }
  const std::string mm = ch.overlap_matmul ? "MM," : "";
  if (ch.move == Move::ReorderTransfers && ch.overlap_send) {
    // The send is inside the name already: the overlap closes around it, before the gather.
    name = fmt::format("ol({}{})-AG", mm, name.substr(0, name.size() - 3));
  } else if (ch.overlap_send) {
    name = fmt::format("ol({}{},P2P)", mm, name);
  } else if (ch.overlap_matmul) {
    name = fmt::format("ol(MM,{})", name);
  }
  if (!sliced.empty()) name += fmt::format("+slice({})", fmt::join(sliced, ","));
  s.set_name(name);
  return NamedSchedule{name, std::move(s)};
}

}  // namespace

std::vector<NamedSchedule> enumerate_schedules(const Program& program, const EnumerateOptions& options) {
  program.validate();
  std::vector<NamedSchedule> out;
  std::set<std::string> plans;  // lowered plans already listed (without their names)
  for (Move move : {Move::None, Move::Split, Move::Reorder, Move::ReorderTransfers})
    for (bool slice : {false, true})
      for (Fusion fusion : {Fusion::None, Fusion::Loops, Fusion::Collective})
        for (int ol = 0; ol < 4; ++ol) {
          const Choice ch{move, slice, fusion, (ol & 1) != 0, (ol & 2) != 0};
          std::optional<NamedSchedule> ns = build(program, ch, options);
          if (!ns) continue;
          std::string text = ns->schedule.lower().str();
          text.erase(0, text.find('\n'));  // the first line carries the name
          if (!plans.insert(text).second) continue;
          out.push_back(std::move(*ns));
        }
  return out;
}

}  // namespace tandem::schedule
