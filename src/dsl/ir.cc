// The IR's plain parts: printing, names, lookups, whole-program validation, shape resolution, and
// the visitor and mutator bases. Stage construction and type inference live in infer.cc.
#include "tandem/dsl/ir.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <functional>
#include <ostream>
#include <set>

#include "tandem/core/error.h"

namespace tandem::dsl {

// ------------------------------------------------------------------------- dims, layouts, types

std::string Dim::str() const { return is_symbol() ? symbol : fmt::format("{}", value); }

bool SymShape::has_suffix(const SymShape& s) const {
  if (s.rank() > rank()) return false;
  return std::equal(s.dims.begin(), s.dims.end(), dims.end() - s.rank());
}

std::optional<Shape> SymShape::resolve(const SymbolMap& symbols) const {
  std::vector<int64_t> out;
  out.reserve(dims.size());
  for (const Dim& d : dims) {
    if (!d.is_symbol()) {
      out.push_back(d.value);
      continue;
    }
    auto it = symbols.find(d.symbol);
    if (it == symbols.end()) return std::nullopt;
    out.push_back(it->second);
  }
  return Shape(std::move(out));
}

std::optional<std::string> SymShape::first_unbound(const SymbolMap& symbols) const {
  for (const Dim& d : dims)
    if (d.is_symbol() && symbols.find(d.symbol) == symbols.end()) return d.symbol;
  return std::nullopt;
}

std::string SymShape::str() const {
  std::vector<std::string> parts;
  for (const Dim& d : dims) parts.push_back(d.str());
  return fmt::format("[{}]", fmt::join(parts, ", "));
}

std::string Layout::str() const {
  switch (kind) {
    case LayoutKind::Local:
      return "Local";
    case LayoutKind::Replicated:
      return "Replicated";
    case LayoutKind::Sliced:
      return fmt::format("Sliced({})", dim);
    case LayoutKind::Partial:
      return "Partial";
  }
  return "?";
}

Shape local_shape(const Shape& global, const Layout& layout, int p, int r) {
  if (!layout.is_sliced()) return global;
  std::vector<int64_t> dims = global.dims();
  const auto d = static_cast<size_t>(layout.dim);
  TANDEM_CHECK(d < dims.size(), "Sliced({}) of shape {}", layout.dim, global.str());
  dims[d] = part_count(dims[d], p, r);
  return Shape(std::move(dims));
}

std::string Type::str() const {
  return fmt::format("{}{} {}", dtype_name(dtype), shape.str(), layout.str());
}

std::ostream& operator<<(std::ostream& os, const Dim& d) { return os << d.str(); }
std::ostream& operator<<(std::ostream& os, const SymShape& s) { return os << s.str(); }
std::ostream& operator<<(std::ostream& os, const Layout& l) { return os << l.str(); }
std::ostream& operator<<(std::ostream& os, const Type& t) { return os << t.str(); }

// ------------------------------------------------------------------------------------------ ops

std::string_view op_name(Op op) {
  switch (op) {
    case Op::Input:
      return "input";
    case Op::Scalar:
      return "scalar";
    case Op::Const:
      return "const";
    case Op::Neg:
      return "neg";
    case Op::Abs:
      return "abs";
    case Op::Sqrt:
      return "sqrt";
    case Op::Rsqrt:
      return "rsqrt";
    case Op::Exp:
      return "exp";
    case Op::Log:
      return "log";
    case Op::Tanh:
      return "tanh";
    case Op::Gelu:
      return "gelu";
    case Op::Relu:
      return "relu";
    case Op::Cast:
      return "cast";
    case Op::Add:
      return "add";
    case Op::Sub:
      return "sub";
    case Op::Mul:
      return "mul";
    case Op::Div:
      return "div";
    case Op::Pow:
      return "pow";
    case Op::Max:
      return "max";
    case Op::Min:
      return "min";
    case Op::Lt:
      return "lt";
    case Op::Le:
      return "le";
    case Op::Gt:
      return "gt";
    case Op::Ge:
      return "ge";
    case Op::Eq:
      return "eq";
    case Op::Ne:
      return "ne";
    case Op::Select:
      return "select";
    case Op::Dropout:
      return "dropout";
    case Op::SegmentScale:
      return "segment_scale";
    case Op::Norm:
      return "norm";
    case Op::Reduce:
      return "reduce";
    case Op::SegmentNorm:
      return "segment_norm";
    case Op::Matmul:
      return "matmul";
    case Op::Scatter:
      return "scatter";
    case Op::Update:
      return "update";
    case Op::AllReduce:
      return "allreduce";
    case Op::ReduceScatter:
      return "reduce_scatter";
    case Op::AllGather:
      return "allgather";
    case Op::Broadcast:
      return "broadcast";
    case Op::Shift:
      return "shift";
    case Op::Send:
      return "send";
    case Op::Recv:
      return "recv";
  }
  return "?";
}

bool is_unary(Op op) { return op >= Op::Neg && op <= Op::Cast; }
bool is_binary(Op op) { return op >= Op::Add && op <= Op::Ne; }
bool is_comparison(Op op) { return op >= Op::Lt && op <= Op::Ne; }

OpKind op_kind(Op op) {
  if (op <= Op::Const) return OpKind::Source;
  if (op <= Op::SegmentScale) return OpKind::Elementwise;
  switch (op) {
    case Op::Norm:
    case Op::Reduce:
    case Op::SegmentNorm:
      return OpKind::Reduction;
    case Op::Matmul:
      return OpKind::Matmul;
    case Op::Scatter:
      return OpKind::Scatter;
    case Op::Update:
      return OpKind::Update;
    case Op::Send:
    case Op::Recv:
      return OpKind::Transfer;
    default:
      return OpKind::Collective;
  }
}

// ---------------------------------------------------------------------------------------- Expr

const Stage& Expr::stage() const {
  if (program_ == nullptr)
    user_error("use of an undefined Expr (default-constructed, never assigned a stage)");
  return program_->stage(id_);
}

Expr Expr::named(std::string name) const {
  if (program_ == nullptr) user_error("cannot name an undefined Expr '{}'", name);
  program_->set_name(id_, std::move(name));
  return *this;
}

// ------------------------------------------------------------------------------------- Program

Program::Program(std::string name, int groups) : name_(std::move(name)), groups_(groups) {
  if (groups < 1)
    user_error("program '{}': {} groups; a program runs on at least 1 group of ranks", name_,
               groups);
}

const Stage& Program::stage(int id) const {
  if (id < 0 || id >= static_cast<int>(stages_.size()))
    user_error("program '{}' has no stage %{} (it has {} stages)", name_, id, stages_.size());
  return stages_[static_cast<size_t>(id)];
}

namespace {
bool is_identifier(std::string_view name) {
  return !name.empty() && (std::isalpha(static_cast<unsigned char>(name[0])) || name[0] == '_') &&
         std::all_of(name.begin(), name.end(), [](char c) {
           return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.';
         });
}
}  // namespace

void Program::check_name(std::string_view name, int id) const {
  if (!is_identifier(name))
    user_error(
        "program '{}': '{}' is not a valid stage name (letters, digits, '_' and '.', not starting "
        "with a digit)",
        name_, name);
  for (const Stage& s : stages_)
    if (s.id != id && s.name == name)
      user_error("program '{}': the name '{}' is taken by stage {}; names must be unique", name_,
                 name, stage_str(s.id));
}

void Program::set_name(int id, std::string name) {
  stage(id);  // existence
  check_name(name, id);
  stages_[static_cast<size_t>(id)].name = std::move(name);
}

void Program::add_output(int id, std::string name) {
  if (id < 0 || id >= static_cast<int>(stages_.size()))
    user_error(
        "program '{}': output '{}' is not produced by any stage (it refers to %{}, and the program "
        "has {} "
        "stages)",
        name_, name, id, stages_.size());
  const Stage& s = stage(id);
  // Output names live apart from stage names (output "w1" may name the stage "w1").
  if (!is_identifier(name))
    user_error(
        "program '{}': '{}' is not a valid output name (letters, digits, '_' and '.', not starting "
        "with a digit)",
        name_, name);
  for (const Output& o : outputs_)
    if (o.name == name) user_error("program '{}': output '{}' is declared twice", name_, name);
  if (s.op == Op::Send)
    user_error(
        "program '{}': output '{}' names {}, a send, which holds no value in any group; output the "
        "matching recv instead",
        name_, name, stage_str(id));
  if (s.op == Op::Input && updater(id) >= 0)
    user_error(
        "program '{}': output '{}' reads input '{}', which {} overwrites in place; output the "
        "update's "
        "result for the new value",
        name_, name, display_name(id), display_name(updater(id)));
  outputs_.push_back({std::move(name), id});
}

Expr Program::input(DType dtype, SymShape shape, Layout layout, std::string name, int group) {
  Attrs a;
  a.dtype = dtype;
  a.shape = std::move(shape);
  a.layout = layout;
  a.group = group;
  return Expr(this, add(Op::Input, {}, std::move(a), std::move(name)));
}

Expr Program::scalar(std::string name) { return scalar(DType::F32, std::move(name)); }

Expr Program::scalar(DType dtype, std::string name) {
  Attrs a;
  a.dtype = dtype;
  return Expr(this, add(Op::Scalar, {}, std::move(a), std::move(name)));
}

Expr Program::constant(double value) {
  Attrs a;
  a.value = value;
  return Expr(this, add(Op::Const, {}, std::move(a)));
}

void Program::output(const Expr& e, std::string name) {
  if (!e.defined()) user_error("program '{}': output '{}' is an undefined Expr", name_, name);
  if (e.program() != this)
    user_error("program '{}': output '{}' is stage {} of another program, '{}'", name_, name,
               e.program()->display_name(e.id()), e.program()->name());
  add_output(e.id(), std::move(name));
}

std::optional<int> Program::find(std::string_view name) const {
  for (const Stage& s : stages_)
    if (s.name == name) return s.id;
  return std::nullopt;
}

std::string Program::display_name(int id) const {
  if (id >= 0 && id < static_cast<int>(stages_.size()) &&
      !stages_[static_cast<size_t>(id)].name.empty())
    return stages_[static_cast<size_t>(id)].name;
  return fmt::format("%{}", id);
}

std::vector<int> Program::inputs() const {
  std::vector<int> out;
  for (const Stage& s : stages_)
    if (s.op == Op::Input) out.push_back(s.id);
  return out;
}

std::vector<int> Program::scalars() const {
  std::vector<int> out;
  for (const Stage& s : stages_)
    if (s.op == Op::Scalar) out.push_back(s.id);
  return out;
}

std::vector<std::string> Program::symbols() const {
  std::set<std::string> names;
  for (const Stage& s : stages_)
    for (const Dim& d : s.type.shape.dims)
      if (d.is_symbol()) names.insert(d.symbol);
  return {names.begin(), names.end()};
}

int Program::updater(int input_id) const {
  for (const Stage& s : stages_)
    if (s.op == Op::Update && !s.args.empty() && s.args[0] == input_id) return s.id;
  return -1;
}

std::vector<int> Program::users(int id) const {
  std::vector<int> out;
  for (const Stage& s : stages_)
    if (std::find(s.args.begin(), s.args.end(), id) != s.args.end()) out.push_back(s.id);
  return out;
}

std::string Program::stage_str(int id) const {
  const Stage& s = stage(id);
  std::vector<std::string> args;
  for (int a : s.args) args.push_back(display_name(a));
  std::string op(op_name(s.op));
  std::string attrs;
  switch (s.op) {
    case Op::Input:
    case Op::Scalar:
      break;
    case Op::Const:
      attrs = fmt::format(" {}", s.attrs.value);
      break;
    case Op::Dropout:
      attrs = fmt::format(" p={}", s.attrs.value);
      break;
    case Op::SegmentNorm:
      attrs = fmt::format(" segments={}", s.attrs.shape[0].str());
      break;
    case Op::Reduce:
      op += fmt::format(".{}", reduce_op_name(s.attrs.reduce));
      if (s.attrs.dim != kAllDims) attrs = fmt::format(" dim={}", s.attrs.dim);
      break;
    case Op::AllReduce:
      op += fmt::format(".{}", reduce_op_name(s.attrs.reduce));
      break;
    case Op::ReduceScatter:
      op += fmt::format(".{}", reduce_op_name(s.attrs.reduce));
      attrs = fmt::format(" dim={}", s.attrs.dim);
      break;
    case Op::Scatter:
      attrs = fmt::format(" dim={}", s.attrs.dim);
      break;
    case Op::Broadcast:
      attrs = fmt::format(" root={}", s.attrs.root);
      break;
    case Op::Send:
      attrs = fmt::format(" to=@{}", s.attrs.group);
      break;
    default:
      break;
  }
  const std::string call = args.empty() ? op : fmt::format("{}({})", op, fmt::join(args, ", "));
  std::string where;
  if (groups_ > 1 && s.type.group != kAllGroups) where = fmt::format(" @{}", s.type.group);
  return fmt::format("{} = {}{} : {}{}", display_name(id), call, attrs, s.type.str(), where);
}

std::string Program::str() const {
  std::string out = groups_ > 1 ? fmt::format("program {} ({} groups)\n", name_, groups_)
                                : fmt::format("program {}\n", name_);
  for (const Stage& s : stages_) out += fmt::format("  {}\n", stage_str(s.id));
  for (const Output& o : outputs_)
    out += fmt::format("  output {} = {}\n", o.name, display_name(o.stage));
  return out;
}

std::vector<Shape> Program::resolve_shapes(const SymbolMap& symbols) const {
  std::vector<Shape> out;
  out.reserve(stages_.size());
  for (const Stage& s : stages_) {
    if (auto missing = s.type.shape.first_unbound(symbols)) {
      // Name the input that introduced the symbol: that is where the user wrote it.
      std::string where = display_name(s.id);
      for (const Stage& i : stages_)
        if (i.op == Op::Input && i.type.shape.first_unbound(symbols) == missing) {
          where = fmt::format("input '{}' {}", display_name(i.id), i.type.shape.str());
          break;
        }
      user_error(
          "program '{}': symbol '{}' (in the shape of {}) is not bound; bind it to an extent, e.g. "
          "symbols[\"{}\"] = 1024",
          name_, *missing, where, *missing);
    }
    Shape shape = *s.type.shape.resolve(symbols);
    for (int64_t d : shape.dims())
      if (d < 0)
        user_error(
            "program '{}': stage {} has shape {} under the bound symbols; extents must be >= 0",
            name_, display_name(s.id), shape.str());
    out.push_back(std::move(shape));
  }
  return out;
}

int64_t segment_of(const Segments& bounds, int64_t i) {
  return static_cast<int64_t>(std::upper_bound(bounds.begin(), bounds.end(), i) - bounds.begin()) -
         1;
}

std::vector<int> Program::segment_stages() const {
  std::vector<int> out;
  for (const Stage& s : stages_)
    if (s.op == Op::SegmentNorm || s.op == Op::SegmentScale) out.push_back(s.id);
  return out;
}

void Program::check_segments(const SymbolMap& symbols, const Segments& bounds) const {
  const std::vector<int> ops = segment_stages();
  if (ops.empty()) {
    if (!bounds.empty())
      user_error(
          "program '{}' has no segment op (segment_norm, segment_scale), so it takes no segments "
          "({} given)",
          name_, bounds.size() - 1);
    return;
  }
  const std::vector<Shape> shapes = resolve_shapes(symbols);
  if (bounds.size() < 2)
    user_error(
        "program '{}' cuts its tensors into segments ({}): give their bounds (0, ..., the extent), "
        "at least "
        "one segment",
        name_, display_name(ops.front()));
  if (bounds.front() != 0)
    user_error("program '{}': the segments' first bound is {}, not 0", name_, bounds.front());
  for (size_t i = 1; i < bounds.size(); ++i)
    if (bounds[i] <= bounds[i - 1])
      user_error(
          "program '{}': segment bounds must ascend strictly (every segment holds an element), but "
          "bound {} "
          "is {} after {}",
          name_, i, bounds[i], bounds[i - 1]);
  const int64_t count = static_cast<int64_t>(bounds.size()) - 1;
  for (int id : ops) {
    const Stage& s = stages_[static_cast<size_t>(id)];
    // segment_norm(x): x segmented, [S] its value; segment_scale(t, x): x segmented, t [S].
    const int x = s.op == Op::SegmentNorm ? s.args[0] : s.args[1];
    const int counted = s.op == Op::SegmentNorm ? id : s.args[0];
    const int64_t extent = shapes[static_cast<size_t>(x)][0],
                  segs = shapes[static_cast<size_t>(counted)][0];
    if (extent != bounds.back())
      user_error(
          "program '{}': stage {} cuts {} (extent {}) into segments, but the segments end at {}",
          name_, display_name(id), display_name(x), extent, bounds.back());
    if (segs != count)
      user_error("program '{}': stage {} has {} segments ({} is {}), but {} segments are given",
                 name_, display_name(id), segs, display_name(counted),
                 shapes[static_cast<size_t>(counted)].str(), count);
  }
}

void Program::check_order() const {
  const int n = static_cast<int>(stages_.size());
  // Dependency order; when it is broken, say whether it is a cycle (a real error in the program)
  // or merely an out-of-order stage (an error of whatever assembled it).
  for (const Stage& s : stages_) {
    if (s.id != static_cast<int>(&s - stages_.data()))
      user_error("program '{}': stage '{}' has id {} at position {}", name_, display_name(s.id),
                 s.id, &s - stages_.data());
    for (int a : s.args) {
      if (a < 0 || a >= n)
        user_error(
            "program '{}': stage {} uses %{}, which does not exist (the program has {} stages)",
            name_, display_name(s.id), a, n);
      if (a < s.id) continue;
      // Look for a path from `a` back to `s` through operands.
      std::vector<int> path{s.id, a};
      std::vector<char> seen(static_cast<size_t>(n), 0);
      std::function<bool(int)> reaches = [&](int from) -> bool {
        if (from == s.id) return true;
        if (seen[static_cast<size_t>(from)]) return false;
        seen[static_cast<size_t>(from)] = 1;
        for (int b : stages_[static_cast<size_t>(from)].args) {
          if (b < 0 || b >= n) continue;
          path.push_back(b);
          if (reaches(b)) return true;
          path.pop_back();
        }
        return false;
      };
      if (reaches(a)) {
        std::vector<std::string> names;
        for (int id : path) names.push_back(display_name(id));
        user_error(
            "program '{}': cycle {} (each stage uses the next); a program is a DAG: every stage's "
            "operands must be computed before it",
            name_, fmt::join(names, " -> "));
      }
      user_error(
          "program '{}': stage {} uses {}, which comes after it; stages must be in dependency "
          "order",
          name_, display_name(s.id), display_name(a));
    }
  }
}

Program Program::assemble(std::string name, int groups, std::vector<Stage> stages,
                          std::vector<Output> outputs) {
  Program raw(name, groups);
  for (size_t i = 0; i < stages.size(); ++i) stages[i].id = static_cast<int>(i);
  raw.stages_ = stages;
  raw.check_order();
  // In order now: make every stage again, so that each is checked and its type inferred.
  Program p(std::move(name), groups);
  for (Stage& s : stages) p.add(s.op, std::move(s.args), std::move(s.attrs), std::move(s.name));
  for (Output& o : outputs) p.add_output(o.stage, std::move(o.name));
  p.validate();
  return p;
}

void Program::validate() const {
  const int n = static_cast<int>(stages_.size());
  check_order();
  for (const Stage& s : stages_) {
    if (s.type.group < kAllGroups || s.type.group >= groups_)
      user_error("program '{}': stage {} is in group {}, but the program has {} groups", name_,
                 display_name(s.id), s.type.group, groups_);
  }
  // Outputs.
  if (outputs_.empty() && std::none_of(stages_.begin(), stages_.end(),
                                       [](const Stage& s) { return s.op == Op::Update; }))
    user_error(
        "program '{}' produces nothing: declare a result with output(expr, name) or write an input "
        "with update(input, expr)",
        name_);
  std::set<std::string> out_names;
  for (const Output& o : outputs_) {
    if (o.stage < 0 || o.stage >= n)
      user_error(
          "program '{}': output '{}' is not produced by any stage (it refers to %{}, and the "
          "program "
          "has {} stages)",
          name_, o.name, o.stage, n);
    if (!out_names.insert(o.name).second)
      user_error("program '{}': output '{}' is declared twice", name_, o.name);
    const Stage& s = stages_[static_cast<size_t>(o.stage)];
    if (s.op == Op::Send)
      user_error(
          "program '{}': output '{}' names {}, a send, which holds no value in any group; output "
          "the "
          "matching recv instead",
          name_, o.name, stage_str(o.stage));
    if (s.op == Op::Input && updater(o.stage) >= 0)
      user_error(
          "program '{}': output '{}' reads input '{}', which {} overwrites in place; output the "
          "update's result for the new value",
          name_, o.name, display_name(o.stage), display_name(updater(o.stage)));
  }
  // Sends and recvs pair one to one; updates write each input once, after all its readers.
  for (const Stage& s : stages_) {
    if (s.op == Op::Send) {
      int recvs = 0;
      for (int u : users(s.id)) recvs += stages_[static_cast<size_t>(u)].op == Op::Recv ? 1 : 0;
      if (recvs != 1)
        user_error(
            "program '{}': {} is received {} times; each send pairs with exactly one recv in group "
            "{} "
            "(add Recv(...) of it there)",
            name_, stage_str(s.id), recvs, s.attrs.group);
    }
    if (s.op == Op::Input) {
      std::vector<int> writers;
      for (int u : users(s.id))
        if (stages_[static_cast<size_t>(u)].op == Op::Update &&
            stages_[static_cast<size_t>(u)].args[0] == s.id)
          writers.push_back(u);
      if (writers.size() > 1)
        user_error(
            "program '{}': input '{}' is updated twice ({} and {}); update an input at most once",
            name_, display_name(s.id), display_name(writers[0]), display_name(writers[1]));
      if (writers.size() == 1)
        for (int u : users(s.id))
          if (u > writers[0])
            user_error(
                "program '{}': stage {} reads input '{}' after {} overwrote it in place; use the "
                "update's result for the new value, or read the input before the update",
                name_, display_name(u), display_name(s.id), display_name(writers[0]));
    }
  }
}

// ------------------------------------------------------------------------------ visitor, mutator

void Visitor::visit(const Program& p) {
  for (const Stage& s : p.stages()) visit_stage(p, s);
}

void Visitor::visit_stage(const Program& p, const Stage& s) {
  switch (op_kind(s.op)) {
    case OpKind::Source:
      return visit_source(p, s);
    case OpKind::Elementwise:
      return visit_elementwise(p, s);
    case OpKind::Reduction:
      return visit_reduction(p, s);
    case OpKind::Matmul:
      return visit_matmul(p, s);
    case OpKind::Scatter:
      return visit_scatter(p, s);
    case OpKind::Update:
      return visit_update(p, s);
    case OpKind::Collective:
      return visit_collective(p, s);
    case OpKind::Transfer:
      return visit_transfer(p, s);
  }
}

Program Mutator::mutate(const Program& in) {
  Program out(in.name(), in.groups());
  in_ = &in;
  out_ = &out;
  map_.assign(in.stages().size(), -1);
  for (const Stage& s : in.stages()) {
    const int id = mutate_stage(s);
    TANDEM_CHECK(id >= 0 && id < static_cast<int>(out.stages().size()),
                 "mutator returned %{} for stage {}", id, in.display_name(s.id));
    map_[static_cast<size_t>(s.id)] = id;
  }
  for (const Output& o : in.outputs()) out.add_output(mapped(o.stage), o.name);
  in_ = nullptr;
  out_ = nullptr;
  return out;
}

int Mutator::mutate_stage(const Stage& s) {
  switch (op_kind(s.op)) {
    case OpKind::Source:
      return mutate_source(s);
    case OpKind::Elementwise:
      return mutate_elementwise(s);
    case OpKind::Reduction:
      return mutate_reduction(s);
    case OpKind::Matmul:
      return mutate_matmul(s);
    case OpKind::Scatter:
      return mutate_scatter(s);
    case OpKind::Update:
      return mutate_update(s);
    case OpKind::Collective:
      return mutate_collective(s);
    case OpKind::Transfer:
      return mutate_transfer(s);
  }
  return -1;
}

int Mutator::copy(const Stage& s) { return copy(s, s.attrs); }

int Mutator::copy(const Stage& s, const Attrs& attrs) {
  std::vector<int> args;
  for (int a : s.args) args.push_back(mapped(a));
  return out().add(s.op, std::move(args), attrs, s.name);
}

int Mutator::mapped(int old_id) const {
  TANDEM_CHECK(old_id >= 0 && old_id < static_cast<int>(map_.size()) &&
                   map_[static_cast<size_t>(old_id)] >= 0,
               "stage %{} has not been mutated yet", old_id);
  return map_[static_cast<size_t>(old_id)];
}

}  // namespace tandem::dsl
