// as_slice: a Replicated input used only through its slice is stored Sliced.
#include "tandem/schedule/as_slice.h"

#include <fmt/format.h>

#include "checked.h"
#include "rewrite.h"
#include "tandem/core/error.h"

namespace tandem::schedule {

using dsl::Op;
using dsl::Program;
using dsl::Stage;

namespace detail {

Rejection try_as_slice(Schedule& s, int x) {
  const auto start = std::chrono::steady_clock::now();
  const Program& p = s.program();
  const Stage& st = p.stage(x);
  const std::string who = fmt::format("as_slice({})", p.display_name(x));
  if (st.op != Op::Input)
    return fmt::format("{}: {} is {}(...), not an input; as_slice changes how an input is stored",
                       who, p.display_name(x), dsl::op_name(st.op));
  if (!st.type.layout.is_replicated())
    return fmt::format(
        "{}: input '{}' is {}; only a Replicated input (every rank holding all of it) can be "
        "stored "
        "sliced",
        who, p.display_name(x), st.type.layout.str());
  if (st.type.shape.rank() == 0)
    return fmt::format("{}: input '{}' has shape [], which has no slice", who, p.display_name(x));

  // Every reader takes the slice along one dim; the update writes a gathered slice.
  int dim = -1;
  int update = -1;
  const auto users = detail::all_users(p);
  auto agree = [&](int d, int where) -> Rejection {
    if (dim >= 0 && d != dim)
      return fmt::format(
          "{}: {} uses the slice along dim {}, another use along dim {}; an input is stored sliced "
          "along one dim",
          who, p.display_name(where), d, dim);
    dim = d;
    return std::nullopt;
  };
  for (int u : users[static_cast<size_t>(x)]) {
    const Stage& us = p.stage(u);
    if (us.op == Op::Scatter) {
      if (auto why = agree(us.attrs.dim, u)) return why;
    } else if (us.op == Op::Update && us.args[0] == x) {
      update = u;
      const Stage& v = p.stage(us.args[1]);
      if (v.op != Op::AllGather)
        return fmt::format(
            "{}: its update {} writes {} = {}(...), a value computed whole; an input is stored "
            "sliced "
            "only when its update writes a gathered slice (reorder the AllGather past the "
            "computation "
            "first)",
            who, p.display_name(u), p.display_name(v.id), dsl::op_name(v.op));
      if (auto why = agree(p.stage(v.args[0]).type.layout.dim, u)) return why;
    } else {
      return fmt::format(
          "{}: {} = {}(...) reads '{}' whole; an input is stored sliced only when every use reads "
          "its "
          "slice (reorder the AllGather past {} first)",
          who, p.display_name(u), dsl::op_name(us.op), p.display_name(x), p.display_name(u));
    }
  }
  if (update >= 0) {
    if (!users[static_cast<size_t>(update)].empty())
      return fmt::format(
          "{}: {} = {}(...) reads the updated '{}' whole; an input is stored sliced only when "
          "every "
          "use reads its slice",
          who, p.display_name(users[static_cast<size_t>(update)][0]),
          dsl::op_name(p.stage(users[static_cast<size_t>(update)][0]).op), p.display_name(x));
    for (const dsl::Output& o : p.outputs())
      if (o.stage == update)
        return fmt::format(
            "{}: the updated '{}' is output '{}', which the caller reads whole; an input is stored "
            "sliced only when nothing reads it whole",
            who, p.display_name(x), o.name);
  }
  if (dim < 0)
    return fmt::format(
        "{}: nothing reads input '{}'; there is no slice to keep (eliminate_dead_stages leaves "
        "inputs "
        "as they are)",
        who, p.display_name(x));

  detail::Rewriter rw(p);
  for (const Stage& t : p.stages()) {
    if (t.id == x) {
      dsl::Attrs a = t.attrs;
      a.layout = dsl::Layout::sliced(dim);
      rw.set(t.id, rw.add(Op::Input, {}, a, t.name));
    } else if (t.op == Op::Scatter && t.args[0] == x) {
      rw.set(t.id, rw.get(x));
    } else if (t.id == update) {
      rw.set(t.id, rw.copy_with(t, {rw.get(x), rw.get(p.stage(t.args[1]).args[0])}));
    } else {
      rw.set(t.id, rw.copy(t));
    }
  }
  auto [program, map] = rw.finish();
  auto [clean, map2] = detail::remove_dead(program);
  for (int& m : map)
    if (m >= 0) m = map2[static_cast<size_t>(m)];
  s.rewrite(std::move(clean), map);
  s.record(who, start);
  return std::nullopt;
}

}  // namespace detail

void as_slice(Schedule& s, const StageRef& input) {
  if (auto why = detail::try_as_slice(s, s.resolve(input, "as_slice"))) user_error("{}", *why);
}

}  // namespace tandem::schedule
