// Making a stage: operand and attribute checks, and dtype, shape, layout and group inference
// under the rules stated in ir.h. Every violation is a UserError that names the program, the
// stage, its operands with their types, and what would be legal.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "tandem/core/error.h"
#include "tandem/dsl/ir.h"

namespace tandem::dsl {
namespace {

// Infers the type of one stage not yet in its program.
class Inference {
 public:
  Inference(const Program& p, const Stage& s) : p_(p), s_(s) {}

  Type run() {
    check_operands();
    switch (op_kind(s_.op)) {
      case OpKind::Source:
        return source();
      case OpKind::Elementwise:
        return elementwise();
      case OpKind::Reduction:
        return reduction();
      case OpKind::Matmul:
        return matmul();
      case OpKind::Scatter:
        return scatter();
      case OpKind::Update:
        return update();
      case OpKind::Collective:
        return collective();
      case OpKind::Transfer:
        return transfer();
    }
    internal_error("unknown op kind");
  }

 private:
  // ------------------------------------------------------------------------------ messages

  std::string name_of(int id) const {
    return id == s_.id && !s_.name.empty() ? s_.name : p_.display_name(id);
  }

  std::string header() const {
    std::vector<std::string> args;
    for (int a : s_.args)
      args.push_back(a >= 0 && a < s_.id ? p_.display_name(a) : fmt::format("%{}", a));
    return fmt::format("program '{}', stage {} = {}({})", p_.name(), name_of(s_.id), op_name(s_.op),
                       fmt::join(args, ", "));
  }

  // "g: bf16[N] Local" (with "@1" when the program has groups).
  std::string describe(int id) const {
    const Type& t = p_.stage(id).type;
    std::string where;
    if (p_.groups() > 1)
      where = t.group == kAllGroups ? " (every group)" : fmt::format(" @{}", t.group);
    return fmt::format("{}: {}{}", p_.display_name(id), t.str(), where);
  }

  std::string describe_all() const {
    std::vector<std::string> parts;
    for (int a : s_.args) parts.push_back(describe(a));
    return fmt::format("{}", fmt::join(parts, "; "));
  }

  template <typename... Args>
  [[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) const {
    throw UserError(fmt::format("{}: {}", header(), fmt::format(f, std::forward<Args>(args)...)));
  }

  const Type& type(int i) const { return p_.stage(s_.args[static_cast<size_t>(i)]).type; }
  const Stage& arg(int i) const { return p_.stage(s_.args[static_cast<size_t>(i)]); }
  int nargs() const { return static_cast<int>(s_.args.size()); }

  // ---------------------------------------------------------------------------- common checks

  void check_operands() const {
    const int want = expected_arity();
    if (nargs() != want) fail("{} takes {} operand(s), given {}", op_name(s_.op), want, nargs());
    for (int a : s_.args)
      if (a < 0 || a >= s_.id)
        fail(
            "operand %{} does not exist yet (stages so far: {}); operands must be made before "
            "their users",
            a, s_.id);
    for (int i = 0; i < nargs(); ++i) {
      const Stage& o = arg(i);
      if (o.op == Op::Send && s_.op != Op::Recv)
        fail("operand {} is a send, which holds no value; use the Recv(...) of it in group {}",
             p_.display_name(o.id), o.attrs.group);
      // Reading an input that an update has already overwritten would read the new value where
      // the program means the old one.
      if (o.op == Op::Input && !(s_.op == Op::Update && i == 0)) {
        const int w = p_.updater(o.id);
        if (w >= 0)
          fail(
              "reads input '{}' after {} overwrote it in place; use the update's result for the "
              "new value, "
              "or read the input before the update",
              p_.display_name(o.id), p_.display_name(w));
      }
    }
  }

  int expected_arity() const {
    if (op_kind(s_.op) == OpKind::Source) return 0;
    if (is_unary(s_.op)) return 1;
    if (is_binary(s_.op)) return 2;
    switch (s_.op) {
      case Op::Select:
        return 3;
      case Op::Dropout:
      case Op::SegmentScale:
      case Op::Matmul:
      case Op::Update:
        return 2;
      default:
        return 1;
    }
  }

  // The group of a stage: that of its group-bound operands, which must agree.
  int common_group() const {
    int g = kAllGroups;
    int first = -1;
    for (int i = 0; i < nargs(); ++i) {
      const int og = type(i).group;
      if (og == kAllGroups) continue;
      if (g == kAllGroups) {
        g = og;
        first = i;
      } else if (og != g) {
        fail(
            "operands live in different groups: {} is computed by group {}, {} by group {} ({}). A "
            "stage runs "
            "in one group; hand a value to another group with Send(x, group) and Recv there",
            p_.display_name(s_.args[static_cast<size_t>(first)]), g,
            p_.display_name(s_.args[static_cast<size_t>(i)]), og, describe_all());
      }
    }
    return g;
  }

  void no_partial(int i, std::string_view what) const {
    if (type(i).layout.is_partial())
      fail(
          "operand {} is Partial (each rank holds a summand, not the value), and {} needs the "
          "value. Only "
          "AllReduce(Sum, x) and ReduceScatter(Sum, x) take a Partial operand; reduce it first",
          describe(s_.args[static_cast<size_t>(i)]), what);
  }

  // -------------------------------------------------------------------------------- sources

  Type source() const {
    const Attrs& a = s_.attrs;
    switch (s_.op) {
      case Op::Input: {
        if (s_.name.empty()) fail("an input needs a name, by which run() is given its tensor");
        for (const Dim& d : a.shape.dims)
          if (!d.is_symbol() && d.value < 0)
            fail("input shape {} has a negative extent", a.shape.str());
        if (a.layout.is_partial())
          fail(
              "an input is Local, Replicated or Sliced(dim), not Partial; declare a per-rank "
              "summand as Local "
              "and AllReduce it");
        if (a.layout.is_sliced() && (a.layout.dim < 0 || a.layout.dim >= a.shape.rank()))
          fail("layout Sliced({}) of an input of shape {}: the sliced dim must be in [0, {})",
               a.layout.dim, a.shape.str(), a.shape.rank());
        if (a.group < 0 || a.group >= p_.groups())
          fail("input in group {}, but the program has {} group(s), numbered 0 to {}", a.group,
               p_.groups(), p_.groups() - 1);
        return Type{a.dtype, a.shape, a.layout, a.group};
      }
      case Op::Scalar:
        if (s_.name.empty()) fail("a scalar needs a name, by which run() binds its value");
        return Type{a.dtype, {}, Layout::replicated(), kAllGroups};
      default:
        return Type{DType::F32, {}, Layout::replicated(), kAllGroups};
    }
  }

  // ---------------------------------------------------------------------------- elementwise

  Type elementwise() const {
    // The operands that carry values (a dropout's seed is a key, not a value).
    std::vector<int> vals;
    if (s_.op == Op::Dropout) {
      vals = {0};
      check_dropout();
    } else {
      for (int i = 0; i < nargs(); ++i) vals.push_back(i);
    }
    for (int i : vals) no_partial(i, "an elementwise stage");
    const int group = common_group();
    if (s_.op == Op::SegmentScale) return segment_scale(group);

    // Shape: the longest operand shape; every other one is a suffix of it.
    SymShape shape;
    for (int i : vals)
      if (type(i).shape.rank() > shape.rank()) shape = type(i).shape;
    for (int i : vals)
      if (!shape.has_suffix(type(i).shape))
        fail(
            "shapes {} do not broadcast: each operand's shape must be a suffix of the result's {} "
            "(as a bias "
            "[H] over [B, H]) or a scalar []",
            describe_all(), shape.str());

    // Dtype: operands that are not rank 0 agree (rank-0 operands adapt); a select's condition
    // is only compared with zero, so any dtype will do.
    std::vector<int> typed;
    for (int i : vals)
      if (!(s_.op == Op::Select && i == 0)) typed.push_back(i);
    bool any_tensor = false;
    for (int i : typed) any_tensor |= type(i).shape.rank() > 0;
    std::optional<DType> dtype;
    for (int i : typed) {
      if (any_tensor && type(i).shape.rank() == 0) continue;
      if (!dtype) {
        dtype = type(i).dtype;
      } else if (type(i).dtype != *dtype) {
        fail("operands mix dtypes: {}. Convert one with cast(x, {}) so that they agree",
             describe_all(), dtype_name(*dtype));
      }
    }
    if (s_.op == Op::Cast) dtype = s_.attrs.dtype;

    // Layout: scalars go with anything; of the rest, one layout, or Sliced(d) with Replicated.
    std::optional<Layout> layout;
    bool replicated_seen = false;
    for (int i : vals) {
      const Type& t = type(i);
      if (t.is_scalar()) continue;
      if (t.layout.is_replicated()) {
        replicated_seen = true;
        continue;
      }
      if (!layout) {
        layout = t.layout;
      } else if (*layout != t.layout) {
        fail(
            "operands mix layouts {} and {} ({}). An elementwise stage takes operands of one "
            "layout, or "
            "Sliced(d) operands with Replicated ones (read at this rank's slice); scalars go with "
            "any layout. "
            "{}",
            layout->str(), t.layout.str(), describe_all(), mix_hint(*layout, t.layout));
      }
    }
    Layout result = Layout::replicated();
    if (layout) {
      if (replicated_seen && !layout->is_sliced())
        fail(
            "operands mix layouts {} and Replicated ({}). An elementwise stage takes operands of "
            "one layout, "
            "or Sliced(d) operands with Replicated ones (read at this rank's slice); scalars go "
            "with any "
            "layout. {}",
            layout->str(), describe_all(), mix_hint(*layout, Layout::replicated()));
      result = *layout;
    }
    if (result.is_sliced())
      for (int i : vals)
        if (type(i).layout.is_sliced() && !(type(i).shape == shape))
          fail(
              "Sliced operand {} has shape {}, but the result has shape {}; a Sliced operand must "
              "have the "
              "result's full shape (only Replicated operands and scalars broadcast)",
              p_.display_name(s_.args[static_cast<size_t>(i)]), type(i).shape.str(), shape.str());
    return Type{*dtype, shape, result, group};
  }

  static std::string mix_hint(const Layout& a, const Layout& b) {
    auto has = [&](LayoutKind k) { return a.kind == k || b.kind == k; };
    if (has(LayoutKind::Local) && has(LayoutKind::Replicated))
      return "To combine a Local value with a Replicated one, AllReduce the Local one first (it "
             "becomes "
             "Replicated).";
    if (has(LayoutKind::Local) && has(LayoutKind::Sliced))
      return "To combine a Local value with a Sliced one, ReduceScatter the Local one along the "
             "same dim.";
    if (a.is_sliced() && b.is_sliced())
      return "Slice both along the same dim: AllGather one and scatter(x, dim) it again.";
    return "";
  }

  void check_dropout() const {
    const double p = s_.attrs.value;
    if (!(p >= 0.0 && p < 1.0)) fail("dropout probability {} is outside [0, 1)", p);
    const Stage& seed = arg(1);
    if (seed.op != Op::Scalar && seed.op != Op::Const)
      fail(
          "the seed {} is computed; a dropout seed is a scalar bound at run time "
          "(p.scalar(\"seed\")) or a "
          "constant integer, so that every schedule keys the same mask",
          describe(seed.id));
    if (seed.op == Op::Const) {
      const double v = seed.attrs.value;
      if (!(v >= 0.0 && v < 9007199254740992.0 && std::floor(v) == v))
        fail("the seed {} is not an integer in [0, 2^53)", v);
    }
  }

  // ------------------------------------------------------------------------------- segments

  // The segmented operand of a segment op: an f32 tensor of one dim.
  void check_segmented(int i) const {
    const Type& x = type(i);
    if (x.dtype != DType::F32 || x.shape.rank() != 1)
      fail(
          "{} cuts an f32 tensor of one dim into segments; {} is not one (cast it, or flatten it "
          "to [N])",
          op_name(s_.op), describe(s_.args[static_cast<size_t>(i)]));
  }

  // segment_scale(t, x): x's type; t is the f32[S] Replicated vector of per-segment factors.
  Type segment_scale(int group) const {
    check_segmented(1);
    const Type& t = type(0);
    if (t.dtype != DType::F32 || t.shape.rank() != 1 || !t.shape[0].is_symbol() ||
        !t.layout.is_replicated())
      fail(
          "the factors {} must be f32[S] Replicated, one per segment, S a symbol (a segment_norm's "
          "shape)",
          describe(s_.args[0]));
    const Type& x = type(1);
    return Type{x.dtype, x.shape, x.layout, group};
  }

  // segment_norm(x): f32[S], Local for a Local x, else Replicated.
  Type segment_norm(int group) const {
    check_segmented(0);
    const SymShape& count = s_.attrs.shape;
    if (count.rank() != 1 || !count[0].is_symbol())
      fail("the number of segments must be a symbol (segment_norm(x, \"S\")), given {}",
           count.str());
    const Type& x = type(0);
    return Type{DType::F32, count, x.layout.is_local() ? Layout::local() : Layout::replicated(),
                group};
  }

  // ----------------------------------------------------------------------------- reductions

  Type reduction() const {
    no_partial(0, fmt::format("{}", op_name(s_.op)));
    const Type& x = type(0);
    const int group = common_group();
    if (s_.op == Op::SegmentNorm) return segment_norm(group);
    const bool cross = x.layout.is_sliced();
    if (s_.op == Op::Norm) {
      Layout l = x.layout.is_local() ? Layout::local() : Layout::replicated();
      return Type{DType::F32, {}, l, group};
    }
    const int dim = s_.attrs.dim;
    if (dim == kAllDims)
      return Type{x.dtype, {}, x.layout.is_local() ? Layout::local() : Layout::replicated(), group};
    if (dim < 0 || dim >= x.shape.rank())
      fail("reduce over dim {} of {}: the dim must be in [0, {}), or kAllDims for every dim", dim,
           describe(s_.args[0]), x.shape.rank());
    std::vector<Dim> dims = x.shape.dims;
    dims.erase(dims.begin() + dim);
    Layout l = x.layout;
    if (cross) {
      // Over the sliced dim, the ranks' parts combine into one replicated value; over another
      // dim each rank reduces its own part and the slicing moves down if it came after.
      if (dim == x.layout.dim)
        l = Layout::replicated();
      else if (dim < x.layout.dim)
        l = Layout::sliced(x.layout.dim - 1);
    }
    return Type{x.dtype, SymShape(std::move(dims)), l, group};
  }

  // --------------------------------------------------------------------------------- matmul

  // The role of dim `d` of a matmul operand: 'M', 'K', 'N', or 'b' for a batch dim.
  static char role(bool is_a, int rank, int d) {
    if (d == rank - 1) return is_a ? 'K' : 'N';
    if (d == rank - 2) return is_a ? 'M' : 'K';
    return 'b';
  }

  Type matmul() const {
    no_partial(0, "matmul");
    no_partial(1, "matmul");
    const int group = common_group();
    const Type& a = type(0);
    const Type& b = type(1);
    const int ra = a.shape.rank(), rb = b.shape.rank();
    if (ra < 2 || rb < 2)
      fail("matmul needs operands of rank 2 or more ([..., M, K] x [..., K, N]): {}",
           describe_all());
    if (a.dtype != b.dtype)
      fail("operands mix dtypes: {}. Convert one with cast(x, {}) so that they agree",
           describe_all(), dtype_name(a.dtype));
    if (!(a.shape[ra - 1] == b.shape[rb - 2]))
      fail("contraction dims differ: A's last dim is {} and B's second-to-last is {} ({})",
           a.shape[ra - 1].str(), b.shape[rb - 2].str(), describe_all());
    if (ra > 2 && rb > 2 &&
        !(ra == rb &&
          std::equal(a.shape.dims.begin(), a.shape.dims.end() - 2, b.shape.dims.begin())))
      fail(
          "batch dims differ ({}); batched operands have the same batch dims, or one of them is "
          "2-D and "
          "broadcasts",
          describe_all());
    const int r = std::max(ra, rb);
    std::vector<Dim> dims(ra >= rb ? a.shape.dims.begin() : b.shape.dims.begin(),
                          ra >= rb ? a.shape.dims.end() - 2 : b.shape.dims.end() - 2);
    dims.push_back(a.shape[ra - 2]);
    dims.push_back(b.shape[rb - 1]);

    const Layout la = a.layout, lb = b.layout;
    auto illegal = [&]() {
      fail(
          "operand layouts {} x {} ({}) have no matmul rule. Legal: Replicated x Replicated -> "
          "Replicated; "
          "Local x Local -> Local; a sliced contraction dim (A's last, B's second-to-last, on one "
          "side with "
          "the other Replicated, or on both) -> Partial; A Sliced on its rows or B on its columns, "
          "with the "
          "other Replicated -> Sliced; both Sliced on the same batch dim -> Sliced",
          la.str(), lb.str(), describe_all());
    };
    Layout out;
    if (la.is_replicated() && lb.is_replicated()) {
      out = Layout::replicated();
    } else if (la.is_local() && lb.is_local()) {
      out = Layout::local();
    } else if (la.is_sliced() && (lb.is_replicated() || lb.is_sliced())) {
      const char ra_role = role(true, ra, la.dim);
      if (lb.is_sliced()) {
        const char rb_role = role(false, rb, lb.dim);
        if (ra_role == 'K' && rb_role == 'K')
          out = Layout::partial();
        else if (ra_role == 'b' && rb_role == 'b' && la.dim + (r - ra) == lb.dim + (r - rb))
          out = Layout::sliced(la.dim + (r - ra));
        else
          illegal();
      } else if (ra_role == 'K') {
        out = Layout::partial();
      } else {
        out = Layout::sliced(ra_role == 'M' ? r - 2 : la.dim + (r - ra));
      }
    } else if (la.is_replicated() && lb.is_sliced()) {
      const char rb_role = role(false, rb, lb.dim);
      if (rb_role == 'K')
        out = Layout::partial();
      else
        out = Layout::sliced(rb_role == 'N' ? r - 1 : lb.dim + (r - rb));
    } else {
      illegal();
    }
    return Type{a.dtype, SymShape(std::move(dims)), out, group};
  }

  // -------------------------------------------------------------------------------- scatter

  Type scatter() const {
    const Type& x = type(0);
    if (!x.layout.is_replicated())
      fail("scatter takes a Replicated tensor (each rank keeps its part), not {}: {}",
           x.layout.str(), describe(s_.args[0]));
    const int dim = s_.attrs.dim;
    if (dim < 0 || dim >= x.shape.rank())
      fail("scatter along dim {} of {}: the dim must be in [0, {})", dim, describe(s_.args[0]),
           x.shape.rank());
    return Type{x.dtype, x.shape, Layout::sliced(dim), common_group()};
  }

  // --------------------------------------------------------------------------------- update

  Type update() const {
    const Stage& t = arg(0);
    if (t.op != Op::Input)
      fail(
          "the target {} is not an input; update(t, value) writes into an input's buffer. Output a "
          "computed "
          "value with output(expr, name) instead",
          describe(t.id));
    const int w = p_.updater(t.id);
    if (w >= 0)
      fail(
          "input '{}' is already updated by {}; an input is updated at most once (update it with "
          "the final "
          "value)",
          p_.display_name(t.id), p_.display_name(w));
    for (const Output& o : p_.outputs())
      if (o.stage == t.id)
        fail(
            "input '{}' is declared output '{}', which would read its old value after this update "
            "overwrites "
            "it; output the update's result instead",
            p_.display_name(t.id), o.name);
    const Type& v = type(1);
    no_partial(1, "update");
    if (v.dtype != t.type.dtype)
      fail("the value has dtype {}, the input {}: {}. Convert it with cast(value, {})",
           dtype_name(v.dtype), dtype_name(t.type.dtype), describe_all(), dtype_name(t.type.dtype));
    if (!(v.shape == t.type.shape))
      fail("the value's shape {} differs from the input's {} ({})", v.shape.str(),
           t.type.shape.str(), describe_all());
    // A Replicated value is a Local one whose pieces agree: each rank writes its copy (a Local
    // gradient summed in place).
    const bool replicated_into_local = v.layout.is_replicated() && t.type.layout.is_local();
    if (!(v.layout == t.type.layout) && !(v.is_scalar() && t.type.shape.rank() == 0) &&
        !replicated_into_local)
      fail(
          "the value's layout {} differs from the input's {} ({}); each rank writes its own piece, "
          "so they "
          "must agree{}",
          v.layout.str(), t.type.layout.str(), describe_all(),
          t.type.layout.is_replicated() && v.layout.is_sliced() ? " (AllGather the value first)"
                                                                : "");
    common_group();
    return t.type;
  }

  // ---------------------------------------------------------------------------- collectives

  Type collective() const {
    const Type& x = type(0);
    const int group = common_group();
    const std::string xs = describe(s_.args[0]);
    switch (s_.op) {
      case Op::AllReduce:
      case Op::ReduceScatter: {
        const char* name = s_.op == Op::AllReduce ? "AllReduce" : "ReduceScatter";
        if (x.layout.is_partial() && s_.attrs.reduce != ReduceOp::Sum)
          fail("{}({}) of a Partial operand {}: its ranks hold summands, so only Sum reduces them",
               name, reduce_op_name(s_.attrs.reduce), xs);
        if (!x.layout.is_local() && !x.layout.is_partial())
          fail("{} takes a Local (or Partial) operand, not {}: {}. {}", name, x.layout.str(), xs,
               x.layout.is_replicated()
                   ? "Every rank already holds the same value"
                   : "A Sliced value is already reduced; AllGather makes it Replicated");
        if (s_.op == Op::AllReduce) return Type{x.dtype, x.shape, Layout::replicated(), group};
        const int dim = s_.attrs.dim;
        if (dim < 0 || dim >= x.shape.rank())
          fail("ReduceScatter along dim {} of {}: the dim must be in [0, {})", dim, xs,
               x.shape.rank());
        return Type{x.dtype, x.shape, Layout::sliced(dim), group};
      }
      case Op::AllGather:
        if (!x.layout.is_sliced())
          fail("AllGather takes a Sliced operand, not {}: {}. {}", x.layout.str(), xs,
               x.layout.is_local() || x.layout.is_partial()
                   ? "To combine per-rank values use AllReduce"
                   : "A Replicated value is already whole");
        return Type{x.dtype, x.shape, Layout::replicated(), group};
      case Op::Shift:
        if (!x.layout.is_local())
          fail(
              "Shift takes a Local operand (each rank passes its own piece to the next rank), not "
              "{}: {}. {}",
              x.layout.str(), xs,
              x.layout.is_partial()
                  ? "Reduce the summands first (AllReduce or ReduceScatter)"
                  : "Shifting a Replicated or Sliced value would break its layout; hand each rank "
                    "its piece as a Local input");
        return Type{x.dtype, x.shape, Layout::local(), group};
      default:  // Broadcast
        if (!x.layout.is_local())
          fail("Broadcast takes a Local operand (the root's value goes to every rank), not {}: {}",
               x.layout.str(), xs);
        if (s_.attrs.root < 0)
          fail("Broadcast root {} is negative; the root is a rank index within the group",
               s_.attrs.root);
        return Type{x.dtype, x.shape, Layout::replicated(), group};
    }
  }

  // ------------------------------------------------------------------------------- transfer

  Type transfer() const {
    const Stage& x = arg(0);
    if (s_.op == Op::Send) {
      const int to = s_.attrs.group;
      if (p_.groups() < 2)
        fail("Send needs a program of 2 or more groups (Program(name, groups)); '{}' has 1",
             p_.name());
      if (x.type.group == kAllGroups)
        fail("{} exists on every rank (a scalar or constant); there is nothing to send",
             describe(x.id));
      if (to < 0 || to >= p_.groups())
        fail("Send to group {}, but the program has groups 0 to {}", to, p_.groups() - 1);
      if (to == x.type.group)
        fail("Send from group {} to itself; Send hands a value to another group", to);
      return x.type;
    }
    if (x.op != Op::Send) fail("Recv takes the Send(...) it pairs with, not {}", describe(x.id));
    for (int u : p_.users(x.id))
      if (p_.stage(u).op == Op::Recv)
        fail("{} is already received by {}; each send pairs with exactly one recv",
             p_.display_name(x.id), p_.display_name(u));
    Type t = x.type;
    t.group = x.attrs.group;
    return t;
  }

  const Program& p_;
  const Stage& s_;
};

}  // namespace

int Program::add(Op op, std::vector<int> args, Attrs attrs, std::string name) {
  Stage s;
  s.id = static_cast<int>(stages_.size());
  s.op = op;
  s.args = std::move(args);
  s.attrs = std::move(attrs);
  if (!name.empty()) check_name(name, s.id);
  s.name = std::move(name);
  s.type = Inference(*this, s).run();
  stages_.push_back(std::move(s));
  return stages_.back().id;
}

}  // namespace tandem::dsl
