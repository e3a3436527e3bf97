// reorder: move an AllGather past the computations that consume it, which then run on the slice.
#include "tandem/schedule/reorder.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>
#include <optional>

#include "candidates.h"
#include "checked.h"
#include "rewrite.h"
#include "tandem/core/error.h"

namespace tandem::schedule {

using dsl::Op;
using dsl::OpKind;
using dsl::Program;
using dsl::Stage;

namespace {

// Why stage x cannot run on the slice of AllGather `ag` (with `moved` the stages that do, and
// `ag` itself treated as sliced), or nullopt when it can.
std::optional<std::string> cannot_move(const Program& p, int ag, const std::vector<char>& moved,
                                       int x) {
  const Stage& st = p.stage(x);
  const Stage& g = p.stage(ag);
  const int dim = p.stage(g.args[0]).type.layout.dim;
  const std::string xs = p.display_name(x);
  const OpKind k = dsl::op_kind(st.op);
  if (k == OpKind::Matmul)
    return fmt::format(
        "{} is a matmul; only element-wise stages, norms and reductions, and send/recv run on a "
        "slice",
        xs);
  if (k == OpKind::Collective)
    return fmt::format(
        "{} is a collective ({}); an AllGather moves past computations, not past other "
        "communication within the group",
        xs, dsl::op_name(st.op));
  if (k == OpKind::Scatter)
    return fmt::format("{} is a scatter, which takes a Replicated value, not a slice", xs);
  if (k == OpKind::Update)
    return fmt::format(
        "{} is an update of input '{}', which stays whole: the AllGather is placed just before it",
        xs, p.display_name(st.args[0]));
  if (k == OpKind::Elementwise && !(st.type.shape == g.type.shape))
    return fmt::format(
        "{} has shape {}, but {} has shape {}; the stages moved past it run on its slice and must "
        "have its shape",
        xs, st.type.shape.str(), p.display_name(ag), g.type.shape.str());
  const size_t nvalues = st.op == Op::Dropout ? 1 : st.args.size();
  for (size_t i = 0; i < nvalues; ++i) {
    const int a = st.args[i];
    if (a == ag || moved[static_cast<size_t>(a)]) continue;
    const Stage& as = p.stage(a);
    if (as.op == Op::Update && (as.args[1] == ag || moved[static_cast<size_t>(as.args[1])]))
      continue;
    const dsl::Layout l = as.type.layout;
    if (l.is_local() || l.is_partial())
      return fmt::format(
          "{} reads {}, which is {} (each rank holds {}); it has no slice, so {} cannot run on the "
          "slice of {}",
          xs, p.display_name(a), l.str(), l.is_local() ? "its own whole value" : "a summand", xs,
          p.display_name(ag));
    if (l.is_sliced() && l.dim != dim)
      return fmt::format("{} reads {}, which is Sliced({}), but {}'s slice is along dim {}", xs,
                         p.display_name(a), l.dim, p.display_name(ag), dim);
  }
  return std::nullopt;
}

// Arithmetic that stays whole where it is: scalar code, and element-wise stages of another shape
// than the gathered value with no operand of its shape (they follow a reduction of it: the
// per-segment norms' [S] arithmetic). A stage that broadcasts the value to a larger shape moves,
// and cannot_move says why it may not.
bool stays_whole(const Program& p, const Stage& st, const Stage& g) {
  if (detail::is_scalar_code(st)) return true;
  if (dsl::op_kind(st.op) != OpKind::Elementwise || st.type.shape == g.type.shape) return false;
  return std::none_of(st.args.begin(), st.args.end(),
                      [&](int a) { return p.stage(a).type.shape == g.type.shape; });
}

}  // namespace

namespace detail {

std::vector<int> movable_consumers(const Program& p, int ag, bool through_transfers) {
  const std::vector<char> desc = descendants(p, ag);
  std::vector<char> moved(p.stages().size(), 0);
  // Grow the set in program order: a stage can move when its operands allow it given the stages
  // already moved.
  std::vector<int> out;
  for (const Stage& st : p.stages()) {
    if (!desc[static_cast<size_t>(st.id)] || stays_whole(p, st, p.stage(ag))) continue;
    const OpKind k = dsl::op_kind(st.op);
    if (k == OpKind::Transfer && !through_transfers) continue;
    if (k == OpKind::Transfer && st.op == Op::Recv && !moved[static_cast<size_t>(st.args[0])])
      continue;
    // A stage only reachable through stages that stay whole reads them whole; moving it would
    // scatter them again, which is legal but gains nothing: require a moved (or the gathered)
    // operand.
    bool reads_slice = false;
    for (int a : st.args) {
      const Stage& as = p.stage(a);
      reads_slice |=
          a == ag || moved[static_cast<size_t>(a)] ||
          (as.op == Op::Update && (as.args[1] == ag || moved[static_cast<size_t>(as.args[1])]));
    }
    if (!reads_slice || cannot_move(p, ag, moved, st.id)) continue;
    moved[static_cast<size_t>(st.id)] = 1;
    out.push_back(st.id);
  }
  return out;
}

Rejection try_reorder(Schedule& s, int ag, const std::vector<int>& listed,
                      std::vector<int>* gathers) {
  const auto start = std::chrono::steady_clock::now();
  const Program& p = s.program();
  const Stage& g = p.stage(ag);
  const std::string who =
      fmt::format("reorder({}, {{{}}})", p.display_name(ag), detail::name_list(p, listed));
  if (g.op != Op::AllGather)
    return fmt::format(
        "{}: {} is {}(...), not an AllGather; reorder moves an AllGather past its consumers (split "
        "an "
        "AllReduce first to get one)",
        who, p.display_name(ag), dsl::op_name(g.op));
  if (listed.empty())
    return fmt::format("{}: name at least one stage that consumes {}", who, p.display_name(ag));
  const int dim = p.stage(g.args[0]).type.layout.dim;
  const std::vector<char> desc = detail::descendants(p, ag);
  const auto users = detail::all_users(p);

  // The targets: the listed stages; an update stands for the computation of its value.
  std::vector<int> targets;
  for (int t : listed) {
    if (!desc[static_cast<size_t>(t)])
      return fmt::format(
          "{}: {} does not use {} (directly or through other stages); reorder moves an AllGather "
          "past the "
          "stages that consume it",
          who, p.display_name(t), p.display_name(ag));
    const Stage& ts = p.stage(t);
    if (ts.op == Op::Update) {
      if (ts.args[1] != ag) targets.push_back(ts.args[1]);
      continue;
    }
    if (detail::is_scalar_code(ts))
      return fmt::format(
          "{}: {} is scalar arithmetic (shape []), which has no slice; name the tensor stages that "
          "use it",
          who, p.display_name(t));
    targets.push_back(t);
    if (ts.op == Op::Send)
      for (int u : users[static_cast<size_t>(t)]) targets.push_back(u);  // its Recv
  }
  if (targets.empty())
    return fmt::format(
        "{}: the listed updates write {} itself; there is no computation to move past it", who,
        p.display_name(ag));

  // The stages moved: on a path from the AllGather to a target (scalar arithmetic and updates
  // stay where they are), then the side computations that only they use.
  const std::vector<char> anc = detail::ancestors(p, targets);
  std::vector<char> moved(p.stages().size(), 0);
  for (const Stage& st : p.stages())
    if (desc[static_cast<size_t>(st.id)] && anc[static_cast<size_t>(st.id)] &&
        !stays_whole(p, st, g) && st.op != Op::Update)
      moved[static_cast<size_t>(st.id)] = 1;
  std::vector<char> is_output(p.stages().size(), 0);
  for (const dsl::Output& o : p.outputs()) is_output[static_cast<size_t>(o.stage)] = 1;
  for (bool grew = true; grew;) {
    grew = false;
    for (const Stage& st : p.stages()) {
      const auto& us = users[static_cast<size_t>(st.id)];
      if (moved[static_cast<size_t>(st.id)] || st.id == ag || !detail::is_elementwise_tensor(st) ||
          st.op == Op::Update || !st.type.layout.is_replicated() ||
          !(st.type.shape == g.type.shape) || us.empty() || is_output[static_cast<size_t>(st.id)])
        continue;
      if (std::all_of(us.begin(), us.end(),
                      [&](int u) { return moved[static_cast<size_t>(u)] != 0; })) {
        moved[static_cast<size_t>(st.id)] = 1;
        grew = true;
      }
    }
  }
  for (const Stage& st : p.stages()) {
    if (!moved[static_cast<size_t>(st.id)]) continue;
    if (auto why = cannot_move(p, ag, moved, st.id)) return fmt::format("{}: {}", who, *why);
    if (s.fused_index(st.id) >= 0 || s.overlap_index(st.id) >= 0)
      return fmt::format(
          "{}: {} is already {}; reorder rewrites the program, so apply it before fuse and overlap",
          who, p.display_name(st.id), s.fused_index(st.id) >= 0 ? "fused" : "overlapped");
  }
  if (s.fused_index(ag) >= 0 || s.overlap_index(ag) >= 0)
    return fmt::format("{}: {} is already fused or overlapped; reorder before fuse and overlap",
                       who, p.display_name(ag));

  // Rewrite: moved stages on the slice, each gathered where something outside needs it whole.
  detail::Rewriter rw(p);
  std::map<int, int> slice_of;   // old id -> new id of its sliced version
  std::map<int, int> scattered;  // old id -> new id of scatter(it)
  std::vector<int> made;         // the AllGathers added (new ids)
  for (const Stage& st : p.stages()) {
    if (!moved[static_cast<size_t>(st.id)]) {
      rw.set(st.id, rw.copy(st));
      continue;
    }
    std::vector<int> args;
    for (size_t i = 0; i < st.args.size(); ++i) {
      const int a = st.args[i];
      const Stage& as = p.stage(a);
      if (a == ag) {
        args.push_back(rw.get(g.args[0]));
      } else if (moved[static_cast<size_t>(a)]) {
        args.push_back(slice_of.at(a));
      } else if (as.op == Op::Update && as.args[1] == ag) {
        args.push_back(rw.get(g.args[0]));  // the new value of the input, read at the slice
      } else if (as.op == Op::Update && moved[static_cast<size_t>(as.args[1])]) {
        args.push_back(slice_of.at(as.args[1]));
      } else if (as.type.layout.is_replicated() && as.type.shape.rank() > 0 &&
                 as.type.shape == g.type.shape && dsl::op_kind(st.op) == OpKind::Elementwise &&
                 !(st.op == Op::Dropout && i == 1)) {
        auto it = scattered.find(a);
        if (it == scattered.end()) {
          dsl::Attrs at;
          at.dim = dim;
          const int sc =
              rw.add(Op::Scatter, {rw.get(a)}, at, as.name.empty() ? "" : as.name + ".slice");
          it = scattered.emplace(a, sc).first;
        }
        args.push_back(it->second);
      } else {
        args.push_back(rw.get(a));
      }
    }
    const int sliced = rw.copy_with(st, std::move(args));
    slice_of[st.id] = sliced;
    bool needed_whole = is_output[static_cast<size_t>(st.id)] != 0;
    for (int u : users[static_cast<size_t>(st.id)]) needed_whole |= !moved[static_cast<size_t>(u)];
    if (rw.out().stage(sliced).type.layout.is_sliced() && needed_whole) {
      // Name the gather after the stage, or after the update it feeds.
      std::string base = st.name;
      for (int u : users[static_cast<size_t>(st.id)])
        if (base.empty() && p.stage(u).op == Op::Update && !p.stage(u).name.empty())
          base = p.stage(u).name;
      const int gathered = rw.add(Op::AllGather, {sliced}, {}, base.empty() ? "" : base + ".ag");
      made.push_back(gathered);
      rw.set(st.id, gathered);
    } else {
      rw.set(st.id, sliced);
    }
  }
  auto [program, map] = rw.finish();
  auto [clean, map2] = detail::remove_dead(program);
  for (int& m : map)
    if (m >= 0) m = map2[static_cast<size_t>(m)];
  for (int& m : made) m = map2[static_cast<size_t>(m)];
  made.erase(std::remove(made.begin(), made.end(), -1), made.end());
  s.rewrite(std::move(clean), map);
  s.record(who, start);
  if (gathers != nullptr) *gathers = std::move(made);
  return std::nullopt;
}

}  // namespace detail

std::vector<int> reorder(Schedule& s, const StageRef& allgather,
                         const std::vector<StageRef>& stages) {
  const int ag = s.resolve(allgather, "reorder");
  std::vector<int> listed;
  for (const StageRef& r : stages) listed.push_back(s.resolve(r, "reorder"));
  std::vector<int> made;
  if (auto why = detail::try_reorder(s, ag, listed, &made)) user_error("{}", *why);
  return made;
}

}  // namespace tandem::schedule
