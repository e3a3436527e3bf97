// Printing a lowered plan, and the small shape helpers every walker of a plan needs.
#include "tandem/schedule/plan.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "tandem/core/error.h"

namespace tandem::schedule {

std::string_view storage_name(Storage s) {
  switch (s) {
    case Storage::None:
      return "none";
    case Storage::Full:
      return "full";
    case Storage::Slice:
      return "slice";
    case Storage::Block:
      return "block";
  }
  return "?";
}

std::string_view step_kind_name(StepKind k) {
  switch (k) {
    case StepKind::Loop:
      return "loop";
    case StepKind::Reduce:
      return "reduce";
    case StepKind::Finish:
      return "finish";
    case StepKind::Matmul:
      return "matmul";
    case StepKind::Collective:
      return "collective";
    case StepKind::Send:
      return "send";
    case StepKind::Recv:
      return "recv";
    case StepKind::Pipeline:
      return "pipeline";
  }
  return "?";
}

std::string_view domain_name(Domain d) {
  switch (d) {
    case Domain::Full:
      return "full";
    case Domain::Slice:
      return "slice";
    case Domain::Chunk:
      return "chunk";
  }
  return "?";
}

std::string_view partition_name(Partition p) {
  switch (p) {
    case Partition::Flat:
      return "flat";
    case Partition::Dim:
      return "dim";
  }
  return "?";
}

int bind_target(const Plan& plan, std::string_view name) {
  const dsl::Program& p = plan.program;
  for (const dsl::Stage& s : p.stages())
    if (s.op == dsl::Op::Input && s.name == name) return s.id;
  for (const dsl::Output& o : p.outputs()) {
    if (o.name != name) continue;
    int root = o.stage;
    for (size_t hops = 0; plan.values[static_cast<size_t>(root)].alias >= 0; ++hops) {
      TANDEM_CHECK(hops <= plan.values.size(), "alias cycle at stage {}", o.stage);
      root = plan.values[static_cast<size_t>(root)].alias;
    }
    const dsl::Stage& rs = p.stage(root);
    if (rs.op == dsl::Op::Input)
      user_error("plan '{}': output '{}' is computed in input '{}''s buffer; bind that input",
                 plan.name, name, rs.name);
    const Storage st = plan.values[static_cast<size_t>(root)].storage;
    if (st != Storage::Full && st != Storage::Slice)
      user_error(
          "plan '{}': output '{}' is stored block by block under this schedule and cannot be bound",
          plan.name, name);
    return root;
  }
  std::vector<std::string> names;
  for (int id : p.inputs()) names.push_back(p.stage(id).name);
  for (const dsl::Output& o : p.outputs()) names.push_back(o.name);
  user_error("plan '{}': program '{}' has no input or output named '{}' (these can be bound: {})",
             plan.name, p.name(), name, fmt::join(names, ", "));
}

Shape stored_shape(const Plan& plan, int id, const std::vector<Shape>& global_shapes, int p,
                   int r) {
  const Value& v = plan.values.at(static_cast<size_t>(id));
  const Shape& g = global_shapes.at(static_cast<size_t>(id));
  switch (v.storage) {
    case Storage::None:
      return Shape{0};
    case Storage::Full:
      return g;
    case Storage::Slice:
    case Storage::Block:
      return dsl::local_shape(g, plan.program.stage(id).type.layout, p, r);
  }
  return g;
}

namespace {

std::string names(const dsl::Program& p, const std::vector<int>& ids) {
  std::vector<std::string> out;
  out.reserve(ids.size());
  for (int id : ids) out.push_back(p.display_name(id));
  return fmt::format("{}", fmt::join(out, ", "));
}

std::string loop_str(const Plan& plan, const Loop& l, const std::string& pad) {
  const dsl::Program& p = plan.program;
  std::string where;
  switch (l.domain) {
    case Domain::Full:
      where = fmt::format("over {}", l.shape.str());
      break;
    case Domain::Slice:
      where = fmt::format("over this rank's slice of {} along dim {}", l.shape.str(), l.dim);
      break;
    case Domain::Chunk:
      where = fmt::format("on each reduced chunk of {}", l.shape.str());
      break;
  }
  std::string out = fmt::format("{}\n", where);
  for (int id : l.stages) {
    const bool stored = std::find(l.stores.begin(), l.stores.end(), id) != l.stores.end();
    out += fmt::format("{}  {}{}\n", pad, p.stage_str(id), stored ? "" : "   (register)");
  }
  for (int id : l.accumulates) out += fmt::format("{}  accumulate {}\n", pad, p.stage_str(id));
  return out;
}

}  // namespace

std::string Plan::step_str(const Step& s, int indent) const {
  const std::string pad(static_cast<size_t>(indent), ' ');
  const dsl::Program& p = program;
  std::string head = pad;
  if (program.groups() > 1)
    head += s.group == dsl::kAllGroups ? "[every group] " : fmt::format("[group {}] ", s.group);
  if (!s.label.empty()) head += fmt::format("<{}> ", s.label);
  switch (s.kind) {
    case StepKind::Loop:
      return fmt::format("{}loop {}", head, loop_str(*this, s.loop, pad));
    case StepKind::Reduce:
      return fmt::format("{}reduce {}{}\n", head, p.stage_str(s.reduce.stage),
                         s.reduce.across_ranks ? ", then across ranks" : "");
    case StepKind::Finish:
      return fmt::format("{}finish {}{}\n", head, p.display_name(s.finish.stage),
                         s.finish.across_ranks ? " (combine across ranks)" : "");
    case StepKind::Matmul:
      return fmt::format("{}matmul {}\n", head, p.stage_str(s.matmul.stage));
    case StepKind::Collective: {
      const Collective& c = s.collective;
      std::string what;
      if (c.operand < 0) {
        what = fmt::format(
            "allgather {} in place (completes the parts its hook computed; {} partition)",
            p.display_name(c.stage), partition_name(c.partition));
      } else {
        std::string op(dsl::op_name(c.op));
        if (c.op == dsl::Op::AllReduce || c.op == dsl::Op::ReduceScatter)
          op += fmt::format(".{}", dsl::reduce_op_name(c.reduce));
        what = fmt::format("{} {} -> {}", op, p.display_name(c.operand), p.display_name(c.stage));
        if (c.partition == Partition::Dim) what += fmt::format(" (dim {} partition)", c.dim);
        if (c.op == dsl::Op::Broadcast) what += fmt::format(" root {}", c.root);
        if (c.in_place) what += " in place";
      }
      std::string out = fmt::format("{}{}\n", head, what);
      if (c.fused) {
        out += fmt::format("{}  fused: {}", pad, loop_str(*this, *c.fused, pad + "  "));
        if (c.carry >= 0)
          out +=
              fmt::format("{}  carries {}: the hook's result replaces each chunk and is gathered\n",
                          pad, p.display_name(c.carry));
      }
      return out;
    }
    case StepKind::Send:
      return fmt::format("{}send {} to group {}\n", head, p.display_name(s.transfer.value),
                         s.transfer.peer_group);
    case StepKind::Recv:
      return fmt::format("{}recv {} from group {}\n", head, p.display_name(s.transfer.value),
                         s.transfer.peer_group);
    case StepKind::Pipeline: {
      std::string out = fmt::format("{}overlap in {} row blocks of {}:\n", head, s.pipeline.blocks,
                                    names(p, s.pipeline.values));
      for (const Step& b : s.pipeline.body) out += step_str(b, indent + 4);
      return out;
    }
  }
  return head + "?\n";
}

std::string Plan::str() const {
  std::string out = fmt::format("plan {} of program {}\n", name, program.name());
  out += "steps:\n";
  for (size_t i = 0; i < steps.size(); ++i) {
    std::string s = step_str(steps[i], 6);
    // Number the top-level steps in the indentation.
    const std::string num = fmt::format("  {:>2}. ", i);
    s.replace(0, num.size(), num);
    out += s;
  }
  out += "stored per rank:\n";
  for (const Value& v : values) {
    if (v.storage == Storage::None) continue;
    const dsl::Stage& st = program.stage(v.stage);
    if (st.op == dsl::Op::Const) continue;
    std::string note;
    if (st.op == dsl::Op::Input) note = v.state ? "input, updated in place" : "input";
    if (st.op == dsl::Op::Scalar) note = "scalar";
    if (v.alias >= 0)
      note +=
          fmt::format("{}in {}'s buffer", note.empty() ? "" : ", ", program.display_name(v.alias));
    if (v.output) note += fmt::format("{}output", note.empty() ? "" : ", ");
    std::string amount(storage_name(v.storage));
    if (v.storage == Storage::Slice) amount = "slice (1/p)";
    out += fmt::format("  {:<14} {:<26} {:<12}{}\n", program.display_name(v.stage), st.type.str(),
                       amount, note.empty() ? "" : fmt::format(" ({})", note));
  }
  return out;
}

}  // namespace tandem::schedule
