// Lowering a Schedule into a Plan: four passes in a line (units, order, storage, steps).
#include "tandem/schedule/lower.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "rewrite.h"
#include "tandem/core/error.h"
#include "units.h"

namespace tandem::schedule {

using dsl::Op;
using dsl::OpKind;
using dsl::Program;
using dsl::Stage;

namespace {

class Lowering {
 public:
  Lowering(const Schedule& s, Plan& plan) : s_(s), plan_(plan), p_(plan.program) {}

  void units() { g_ = detail::build_units(p_, s_.fused(), s_.overlaps()); }

  void order() {
    const detail::UnitOrder o = detail::order_units(p_, g_);
    TANDEM_CHECK(!o.order.empty(), "schedule '{}' has a cycle: {}", s_.name(),
                 detail::describe_cycle(p_, o.cycle));
    order_ = o.order;
    pos_.assign(g_.units.size(), -1);
    for (size_t i = 0; i < order_.size(); ++i)
      pos_[static_cast<size_t>(order_[i])] = static_cast<int>(i);
  }

  void storage();
  void steps();

  std::string units_str() const {
    std::string out;
    for (size_t u = 0; u < g_.units.size(); ++u) {
      std::vector<std::string> names;
      for (int x : g_.units[u].stages) names.push_back(p_.display_name(x));
      std::vector<int> preds = g_.preds[u];
      out += fmt::format("  unit {}: {{{}}} after {}\n", u, fmt::join(names, ", "),
                         fmt::join(preds, ","));
    }
    return out;
  }
  std::string order_str() const { return fmt::format("  {}\n", fmt::join(order_, " ")); }
  std::string storage_str() const {
    std::string out;
    for (const Value& v : plan_.values)
      out += fmt::format("  {} {}{}\n", p_.display_name(v.stage), storage_name(v.storage),
                         v.alias >= 0 ? fmt::format(" in {}", p_.display_name(v.alias)) : "");
    return out;
  }

 private:
  Value& val(int id) { return plan_.values[static_cast<size_t>(id)]; }
  int unit(int id) const { return g_.unit_of[static_cast<size_t>(id)]; }
  int root(int id) const {
    while (plan_.values[static_cast<size_t>(id)].alias >= 0)
      id = plan_.values[static_cast<size_t>(id)].alias;
    return id;
  }
  // A stage computed element by element inside a loop or a hook.
  bool loop_stage(int id) const {
    const Stage& st = p_.stage(id);
    return unit(id) >= 0 && (dsl::op_kind(st.op) == OpKind::Elementwise || st.op == Op::Update);
  }
  bool in_overlap(int id) const { return s_.overlap_index(id) >= 0; }
  bool noop_update(int id) const {
    const Stage& st = p_.stage(id);
    return st.op == Op::Update && root(st.args[1]) == root(st.args[0]) &&
           plan_.values[static_cast<size_t>(st.args[1])].storage != Storage::None;
  }
  Storage by_layout(int id) const {
    const Stage& st = p_.stage(id);
    if (!st.type.layout.is_sliced()) return Storage::Full;
    return in_overlap(id) ? Storage::Block : Storage::Slice;
  }
  std::vector<Step> unit_steps(int u);
  // Whether every reader of input t's old value (directly or through a scatter) has read it by
  // the time stage `w` writes: in an earlier unit, or earlier in w's own loop.
  bool readers_done(int t, int w) const {
    std::vector<int> frontier{t};
    while (!frontier.empty()) {
      const int x = frontier.back();
      frontier.pop_back();
      for (int r : users_[static_cast<size_t>(x)]) {
        const Stage& rs = p_.stage(r);
        if (rs.op == Op::Scatter) {
          frontier.push_back(r);
          continue;
        }
        if (rs.op == Op::Update && rs.args[0] == t) continue;
        const int ur = unit(r), uw = unit(w);
        if (ur == uw ? !(r <= w && loop_stage(w))
                     : pos_[static_cast<size_t>(ur)] > pos_[static_cast<size_t>(uw)])
          return false;
      }
    }
    return true;
  }
  Loop make_loop(const std::vector<int>& stages, Domain domain, const Stage& rep);

  const Schedule& s_;
  Plan& plan_;
  const Program& p_;
  detail::UnitGraph g_;
  std::vector<int> order_;
  std::vector<int> pos_;
  std::vector<std::vector<int>> users_;
  std::map<int, int> carry_;  // fused AllReduce -> the value it carries
};

void Lowering::storage() {
  const size_t n = p_.stages().size();
  users_ = detail::all_users(p_);
  plan_.values.assign(n, Value{});
  std::vector<char> is_output(n, 0);
  for (const dsl::Output& o : p_.outputs()) is_output[static_cast<size_t>(o.stage)] = 1;

  for (const Stage& st : p_.stages()) {
    Value& v = val(st.id);
    v.stage = st.id;
    v.output = is_output[static_cast<size_t>(st.id)] != 0;
    switch (dsl::op_kind(st.op)) {
      case OpKind::Source:
        if (st.op == Op::Const) break;
        v.storage = st.op == Op::Scalar ? Storage::Full : by_layout(st.id);
        v.state = st.op == Op::Input && p_.updater(st.id) >= 0;
        break;
      case OpKind::Scatter:
        v.storage = Storage::Slice;
        v.alias = st.args[0];
        break;
      case OpKind::Transfer:
        if (st.op == Op::Recv) v.storage = by_layout(st.id);
        break;
      case OpKind::Update:
        v.storage = val(st.args[0]).storage;
        v.alias = st.args[0];
        break;
      case OpKind::Elementwise: {
        // Stored when something outside its own loop reads it.
        bool stored = v.output || detail::is_scalar_code(st);
        for (int u : users_[static_cast<size_t>(st.id)]) {
          const bool same_loop = unit(u) == unit(st.id) && loop_stage(u);
          const bool folded = unit(u) == unit(st.id) && detail::is_accumulator(p_.stage(u));
          stored |= !(same_loop || folded);
        }
        if (stored) v.storage = by_layout(st.id);
        break;
      }
      default:
        v.storage = by_layout(st.id);
        break;
    }
  }

  // In place, where nothing can tell the difference.
  // (1) An AllReduce works in its operand's buffer when the operand is a temporary only it reads.
  for (const Stage& st : p_.stages()) {
    if (st.op != Op::AllReduce) continue;
    const int a = st.args[0];
    const Stage& as = p_.stage(a);
    if (dsl::op_kind(as.op) == OpKind::Source || as.op == Op::Recv || val(a).output ||
        val(a).alias >= 0 || users_[static_cast<size_t>(a)].size() != 1 ||
        val(a).storage != Storage::Full)
      continue;
    val(st.id).alias = a;
  }
  // (2) A fused AllReduce carries the one value its hook computes in the reduced value's place,
  // when nothing outside reads the reduced value itself.
  for (const detail::Unit& u : g_.units) {
    if (u.fused < 0 || u.collective < 0 || p_.stage(u.collective).op != Op::AllReduce) continue;
    const Stage& c = p_.stage(u.collective);
    bool reduced_needed = val(c.id).output;
    for (int x : users_[static_cast<size_t>(c.id)])
      reduced_needed |= unit(x) != unit(c.id) || !loop_stage(x);
    if (reduced_needed) continue;
    for (int x : u.stages) {
      const Stage& xs = p_.stage(x);
      if (x == c.id || !loop_stage(x) || xs.op == Op::Update || val(x).storage != Storage::Full ||
          val(x).alias >= 0 || xs.type.dtype != c.type.dtype || !(xs.type.shape == c.type.shape))
        continue;
      carry_[u.collective] = x;
      val(x).alias = c.id;
      break;
    }
  }
  // (3) A value whose only use is to be written into an input in place is computed straight into
  // the input's buffer, when every reader of the input's old value has run by then.
  for (const Stage& st : p_.stages()) {
    if (st.op != Op::Update) continue;
    const int t = st.args[0], w = st.args[1];
    const Stage& ws = p_.stage(w);
    if (ws.op == Op::Recv && !val(w).output && users_[static_cast<size_t>(w)].size() == 1 &&
        users_[static_cast<size_t>(t)].size() == 1 && val(w).storage == val(t).storage) {
      // update(t, Recv(x)), t read by nothing else: the message lands in t's buffer.
      val(w).alias = t;
      continue;
    }
    if (dsl::op_kind(ws.op) == OpKind::Source || ws.op == Op::Scatter || ws.op == Op::Recv ||
        val(w).output || val(w).alias >= 0 || users_[static_cast<size_t>(w)].size() != 1 ||
        val(w).storage != val(t).storage || val(w).storage == Storage::None || in_overlap(w) ||
        unit(w) < 0)
      continue;
    if (ws.op == Op::AllReduce && ws.args[0] == t && users_[static_cast<size_t>(t)].size() == 2) {
      // update(t, AllReduce(t)), t read by nothing else: the collective's own in-place form.
      val(w).alias = t;
      continue;
    }
    if (ws.op == Op::AllReduce || ws.op == Op::ReduceScatter || ws.op == Op::Broadcast ||
        ws.op == Op::Shift) {
      // These read their operand whole while they write: only an AllGather (which reads a slice
      // nobody else holds) may write into the input. A Shift never works in place: its input
      // leaves while its output arrives.
      continue;
    }
    bool safe = true;
    std::vector<int> frontier{t};
    while (!frontier.empty() && safe) {
      const int x = frontier.back();
      frontier.pop_back();
      for (int r : users_[static_cast<size_t>(x)]) {
        if (r == st.id) continue;
        if (p_.stage(r).op == Op::Scatter) {
          frontier.push_back(r);
          continue;
        }
        const int ur = unit(r);
        safe &= ur == unit(w) || pos_[static_cast<size_t>(ur)] < pos_[static_cast<size_t>(unit(w))];
        // Inside the writing unit: an AllGather writes after the unit's hook has read everything;
        // in a loop, a read of the same element earlier in evaluation order (or by the writing
        // stage itself, which reads its operands before it stores) comes first.
        if (ur == unit(w) && ws.op != Op::AllGather &&
            !((loop_stage(r) || detail::is_accumulator(p_.stage(r))) && loop_stage(w) && r <= w))
          safe = false;
      }
    }
    if (safe) val(w).alias = t;
  }
  // (4) An AllGather works in place when the slice it gathers is a temporary that only it reads
  // from memory (its loop may read it in registers): the slice is computed straight into this
  // rank's part of the result. When that result is an input's buffer (3), every reader of the
  // input's old value must be done by the time the slice is written.
  for (const Stage& st : p_.stages()) {
    if (st.op != Op::AllGather) continue;
    const int a = st.args[0];
    const Stage& as = p_.stage(a);
    if (dsl::op_kind(as.op) == OpKind::Source || as.op == Op::Scatter || as.op == Op::Recv ||
        val(a).output || val(a).alias >= 0 || val(a).storage != Storage::Slice ||
        val(st.id).storage != Storage::Full || unit(a) < 0)
      continue;
    bool only_registers = true;
    for (int u : users_[static_cast<size_t>(a)])
      only_registers &= u == st.id || (unit(u) == unit(a) && loop_stage(a) &&
                                       (loop_stage(u) || detail::is_accumulator(p_.stage(u))));
    if (!only_registers) continue;
    const int t = root(st.id);
    if (t != st.id && !readers_done(t, a)) continue;
    val(a).alias = st.id;
  }
  for (Value& v : plan_.values)
    if (v.alias >= 0) v.alias = root(v.alias);
}

Loop Lowering::make_loop(const std::vector<int>& stages, Domain domain, const Stage& rep) {
  Loop l;
  l.domain = domain;
  l.shape = rep.type.shape;
  if (domain == Domain::Slice) l.dim = rep.type.layout.dim;
  for (int x : stages) {
    const Stage& st = p_.stage(x);
    if (detail::is_accumulator(st)) {
      l.accumulates.push_back(x);
      continue;
    }
    if (!loop_stage(x) || noop_update(x)) continue;
    l.stages.push_back(x);
    if (val(x).storage != Storage::None) l.stores.push_back(x);
  }
  return l;
}

std::vector<Step> Lowering::unit_steps(int ui) {
  const detail::Unit& u = g_.units[static_cast<size_t>(ui)];
  std::vector<Step> out;
  auto step = [&](StepKind k) {
    Step s;
    s.kind = k;
    s.group = u.group;
    if (u.fused >= 0) s.label = fmt::format("fused stage {}", u.fused);
    return s;
  };
  auto finishes = [&](const Loop& l) {
    for (int a : l.accumulates) {
      Step f = step(StepKind::Finish);
      f.finish.stage = a;
      f.finish.across_ranks = l.domain != Domain::Full;
      out.push_back(f);
    }
  };
  auto partition_of = [&](const Stage& c, Collective& col) {
    if (c.op == Op::ReduceScatter) {
      col.partition = Partition::Dim;
      col.dim = c.attrs.dim;
    } else if (c.op == Op::AllGather) {
      col.partition = Partition::Dim;
      col.dim = p_.stage(c.args[0]).type.layout.dim;
    } else {
      col.partition = Partition::Flat;
    }
  };
  switch (u.kind) {
    case detail::UnitKind::Scalar:
    case detail::UnitKind::Loop:
    case detail::UnitKind::Accumulate: {
      // The representative value fixes the domain: the first loop stage, else the operand of the
      // first accumulator.
      const Stage* rep = nullptr;
      for (int x : u.stages)
        if (loop_stage(x)) {
          rep = &p_.stage(x);
          break;
        }
      if (rep == nullptr) rep = &p_.stage(p_.stage(u.stages.front()).args[0]);
      const Domain d = rep->type.layout.is_sliced() ? Domain::Slice : Domain::Full;
      Step s = step(StepKind::Loop);
      s.loop = make_loop(u.stages, d, *rep);
      if (!s.loop.stages.empty() || !s.loop.accumulates.empty()) out.push_back(s);
      finishes(s.loop);
      break;
    }
    case detail::UnitKind::Reduce: {
      Step s = step(StepKind::Reduce);
      const Stage& st = p_.stage(u.stages.front());
      const dsl::Layout l = p_.stage(st.args[0]).type.layout;
      s.reduce.stage = st.id;
      // A segment norm of a Sliced tensor combines every segment's partial sum in one all-reduce.
      s.reduce.across_ranks = l.is_sliced() && (st.op == Op::SegmentNorm || st.attrs.dim == l.dim);
      out.push_back(s);
      break;
    }
    case detail::UnitKind::Matmul: {
      Step s = step(StepKind::Matmul);
      s.matmul.stage = u.stages.front();
      out.push_back(s);
      break;
    }
    case detail::UnitKind::Send:
    case detail::UnitKind::Recv: {
      const Stage& st = p_.stage(u.stages.front());
      Step s = step(st.op == Op::Send ? StepKind::Send : StepKind::Recv);
      s.transfer.stage = st.id;
      if (st.op == Op::Send) {
        s.transfer.value = st.args[0];
        s.transfer.peer_group = st.attrs.group;
      } else {
        s.transfer.value = st.id;
        s.transfer.peer_group = p_.stage(p_.stage(st.args[0]).args[0]).type.group;
      }
      out.push_back(s);
      break;
    }
    case detail::UnitKind::Collective: {
      const Stage& c = p_.stage(u.collective);
      Step s = step(StepKind::Collective);
      Collective& col = s.collective;
      col.op = c.op;
      col.stage = c.id;
      col.operand = c.args[0];
      col.reduce = c.attrs.reduce;
      col.root = c.attrs.root;
      partition_of(c, col);
      col.in_place = root(c.id) == root(c.args[0]) && val(c.id).storage != Storage::None;
      if (c.op == Op::AllGather) col.in_place = root(c.args[0]) == root(c.id);
      std::vector<int> gathers;
      if (u.fused >= 0) {
        std::vector<int> loop_part;
        for (int x : u.stages) {
          const Stage& xs = p_.stage(x);
          if (xs.op == Op::AllGather)
            gathers.push_back(x);
          else if (x != c.id)
            loop_part.push_back(x);
        }
        Loop hook = make_loop(loop_part, Domain::Chunk, c);
        hook.shape = c.type.shape;
        col.fused = hook;
        auto it = carry_.find(c.id);
        if (it != carry_.end()) col.carry = it->second;
      }
      out.push_back(s);
      if (col.fused && c.op == Op::AllReduce) {
        // Values the hook computed on this rank's part and that are needed whole: gathered.
        for (int x : col.fused->stores) {
          if (x == col.carry || val(x).storage != Storage::Full) continue;
          Step ag = step(StepKind::Collective);
          ag.collective.op = Op::AllGather;
          ag.collective.stage = x;
          ag.collective.operand = -1;
          ag.collective.partition = Partition::Flat;
          ag.collective.in_place = true;
          out.push_back(ag);
        }
      }
      for (int x : gathers) {
        const Stage& xs = p_.stage(x);
        Step ag = step(StepKind::Collective);
        ag.collective.op = Op::AllGather;
        ag.collective.stage = x;
        ag.collective.operand = xs.args[0];
        partition_of(xs, ag.collective);
        ag.collective.in_place = root(xs.args[0]) == root(x);
        out.push_back(ag);
      }
      if (col.fused) finishes(*col.fused);
      break;
    }
  }
  return out;
}

void Lowering::steps() {
  std::vector<Step>& steps = plan_.steps;
  for (size_t i = 0; i < order_.size();) {
    const detail::Unit& u = g_.units[static_cast<size_t>(order_[i])];
    if (u.overlap < 0) {
      for (Step& s : unit_steps(order_[i])) {
        // Consecutive scalar code of one group shares one loop.
        const bool scalar =
            s.kind == StepKind::Loop && s.loop.shape.rank() == 0 && s.loop.accumulates.empty();
        if (scalar && !steps.empty() && steps.back().kind == StepKind::Loop &&
            steps.back().loop.shape.rank() == 0 && steps.back().loop.accumulates.empty() &&
            steps.back().group == s.group && steps.back().label == s.label) {
          Loop& prev = steps.back().loop;
          prev.stages.insert(prev.stages.end(), s.loop.stages.begin(), s.loop.stages.end());
          prev.stores.insert(prev.stores.end(), s.loop.stores.begin(), s.loop.stores.end());
          continue;
        }
        steps.push_back(std::move(s));
      }
      ++i;
      continue;
    }
    // An overlap cluster: its units (contiguous in the order) become one pipeline.
    Step pipe;
    pipe.kind = StepKind::Pipeline;
    pipe.group = u.group;
    pipe.label = fmt::format("overlap {}", u.overlap);
    pipe.pipeline.blocks = s_.overlaps()[static_cast<size_t>(u.overlap)].blocks;
    std::vector<int> blocked;
    size_t j = i;
    for (; j < order_.size(); ++j) {
      const detail::Unit& v = g_.units[static_cast<size_t>(order_[j])];
      if (v.overlap != u.overlap || v.group != u.group) break;
      for (Step& s : unit_steps(order_[j])) pipe.pipeline.body.push_back(std::move(s));
      for (int x : v.stages) {
        const Stage& xs = p_.stage(x);
        if (xs.op == Op::Matmul) blocked.push_back(xs.args[0]);
        if (xs.op != Op::Send && xs.type.shape.rank() > 0) blocked.push_back(x);
      }
    }
    std::sort(blocked.begin(), blocked.end());
    blocked.erase(std::unique(blocked.begin(), blocked.end()), blocked.end());
    pipe.pipeline.values = std::move(blocked);
    steps.push_back(std::move(pipe));
    i = j;
  }
}

}  // namespace

Plan lower(const Schedule& s) {
  Plan plan;
  plan.name = s.name();
  plan.program = s.program();
  Lowering l(s, plan);
  run_pass(
      "lower: units", [&] { l.units(); }, [&] { return l.units_str(); });
  run_pass(
      "lower: order", [&] { l.order(); }, [&] { return l.order_str(); });
  run_pass(
      "lower: storage", [&] { l.storage(); }, [&] { return l.storage_str(); });
  run_pass(
      "lower: steps", [&] { l.steps(); }, [&] { return plan.str(); });
  return plan;
}

}  // namespace tandem::schedule
