// The DSL's intermediate representation: a Program of Stages (plain data, Halide style) that
// states both the computation and the communication of one distributed step.
//
// Meaning.
// - A Program is an SSA DAG of Stages kept in dependency order: a stage's operands are stages
//   with smaller ids, and the program is evaluated in id order. Every stage defines exactly one
//   value, computed once; no stage has a side effect except `update` and `send` (below).
// - Ranks and groups. The program runs on every rank of a communicator of n ranks, split into
//   G = Program::groups() equal groups of consecutive ranks: group g holds ranks
//   [g*n/G, (g+1)*n/G), and a rank's index inside its group is rank % (n/G). Each stage belongs
//   to one group (inferred from its operands; inputs name theirs) or to none (kAllGroups:
//   scalars, constants and scalar arithmetic, evaluated on every rank). A rank evaluates only
//   the stages of its own group and the group-less ones. Collectives run over the ranks of the
//   stage's group, and layouts below are relative to that group (its size p, index r).
// - Layouts say how a value of global shape S is held by the p ranks of its group:
//     Local       each rank holds its own value of shape S (a gradient before its AllReduce).
//     Replicated  every rank holds the same value of shape S.
//     Sliced(d)   rank r holds part r of S along dimension d: extent part_count(S[d], p, r),
//                 starting at part_offset(S[d], p, r) (the first S[d] % p ranks one more).
//     Partial     each rank holds a summand of shape S; the value is the sum over the group's
//                 ranks (a matmul whose contraction dimension is sliced). Only AllReduce(Sum)
//                 and ReduceScatter(Sum) accept it.
// - Layout rules (checked when a stage is made; anything else is a UserError naming the stage):
//     elementwise   operands of one layout give that layout; Sliced(d) with Replicated gives
//                   Sliced(d) (the Replicated operand is read at this rank's slice). Rank-0
//                   Replicated operands (scalars, constants, norms of non-Local tensors) go with
//                   any layout. Shapes broadcast by suffix: every operand's shape is a suffix of
//                   the result's (a bias [H] over [B, H]) or rank 0; a Sliced operand has the
//                   result's full shape.
//     AllReduce     Local or Partial (Sum only) -> Replicated.
//     ReduceScatter Local or Partial (Sum only) -> Sliced(dim).
//     AllGather     Sliced(d) -> Replicated.       Broadcast  Local -> Replicated (root's value).
//     Shift         Local -> Local: rank i of the group holds what rank (i - 1) mod p held (one
//                   step of a ring: every rank sends its piece to the next and receives the
//                   previous one's); on one rank the value itself.
//     norm, reduce  keep Local and Replicated; over a Sliced tensor they include the cross-rank
//                   reduction: a norm, a reduction over all dims or over the sliced dim gives
//                   Replicated; a reduction over another dim stays Sliced.
//     matmul        R x R -> R; L x L -> L; a sliced contraction dim (on either side or both)
//                   -> Partial; sliced rows of A -> Sliced rows; sliced columns of B -> Sliced
//                   columns; a sliced batch dim -> Sliced batch. The Replicated partner of a
//                   Sliced operand is read at this rank's slice.
//     scatter       Replicated -> Sliced(dim): this rank's part, no communication.
// - Types. dtypes combine only with a `cast`; rank-0 operands adapt to the dtype of the others.
//   Values are computed in f32 and rounded to the stage's dtype when stored (see elementwise.h
//   for each operation's exact formula, which every backend follows). The exception is a
//   whole-tensor sum (a norm's sum of squares, a Reduce Sum over every dim): it accumulates in
//   8 double lanes keyed by the element's global flat index and is rounded to f32 once
//   (elementwise.h, SumLanes), so that chunking never changes it.
// - `update(t, e)` writes e into input t in place: the caller's buffer holds e after the run.
//   The Update stage's value is the new value. Reads of the input stage denote its old value, so
//   every direct reader of t must come before the update (checked), which makes writing in place
//   at the update's position exact. An input is updated at most once. e has t's layout, or is
//   Replicated when t is Local (every rank writes its copy: update(g, AllReduce(Sum, g)) sums
//   the ranks' g into each rank's g, in place).
// - `send(x, h)` hands x from its group g to group h != g: rank i of group g sends its piece of
//   x to rank i of group h (the groups have the same size, so every layout carries over). Its
//   value is used only by the one `recv` that pairs with it, which belongs to group h.
// - Scalars and symbols are bound at run time: symbols are the extents of symbolic dims,
//   scalars are f32 values (or, for a dropout seed, integers) the same on every rank.
// - Segments (scattered tensors in one buffer, CoCoNeT's scattered-tensor fusion: a bucket of a
//   model's tensors, each with its own norm). A program may cut the one dim of its rank-1
//   tensors into S contiguous segments, fixed when a runner is set up (like a symbol: one
//   program serves every bucket), as Segments: bounds b[0] = 0 < b[1] < ... < b[S] = the extent,
//   S bound to the count symbol of the program's segment ops. Element i lies in segment s when
//   b[s] <= i < b[s+1]. Two ops use them, both on f32 rank-1 tensors:
//     segment_norm(x)      f32[S]: per segment, sqrt of the sum of squares of its elements, the
//                          sum in SumLanes (elementwise.h) keyed by the element's index within its
//                          segment (i - b[s]), so segment s's norm is bitwise the norm of a
//                          tensor holding just its elements. Local x gives Local, Replicated gives
//                          Replicated, Sliced gives Replicated: each rank sums the segments' parts
//                          it holds (f32 per segment, 0 for none), then ONE f32 all-reduce of the S
//                          partials combines them (the only step whose order differs from a
//                          per-tensor norm), then the f32 sqrt.
//     segment_scale(t, x)  x's type: fx::mul(t[s(i)], x[i]), t f32[S] Replicated (read whole).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/core/dtype.h"
#include "tandem/core/formulas.h"
#include "tandem/core/reduce_op.h"
#include "tandem/core/shape.h"

namespace tandem::dsl {

// ---------------------------------------------------------------------------------- dimensions

// A dimension's extent: a constant, or a symbol bound at run time.
struct Dim {
  int64_t value = 0;   // the extent, when `symbol` is empty
  std::string symbol;  // the symbol's name, else empty

  Dim() = default;
  Dim(int v) : value(v) {}  // NOLINT: implicit, so that {B, 1024} reads naturally
  Dim(long v) : value(v) {}
  Dim(long long v) : value(v) {}
  Dim(const char* s) : symbol(s) {}
  Dim(std::string s) : symbol(std::move(s)) {}

  bool is_symbol() const { return !symbol.empty(); }
  std::string str() const;
  bool operator==(const Dim&) const = default;
};

using SymbolMap = std::map<std::string, int64_t, std::less<>>;

// A segmentation (see the header comment): S + 1 ascending bounds from 0 to the extent; empty for
// a program without segment ops.
using Segments = std::vector<int64_t>;
// The segment holding flat index i (b[s] <= i < b[s+1]); i must lie in [0, b[S]).
int64_t segment_of(const Segments& bounds, int64_t i);

// A shape whose dimensions may be symbolic.
struct SymShape {
  std::vector<Dim> dims;

  SymShape() = default;
  SymShape(std::initializer_list<Dim> d) : dims(d) {}
  explicit SymShape(std::vector<Dim> d) : dims(std::move(d)) {}

  int rank() const { return static_cast<int>(dims.size()); }
  const Dim& operator[](int i) const { return dims.at(static_cast<size_t>(i)); }
  // Whether `s` equals this shape's last s.rank() dims.
  bool has_suffix(const SymShape& s) const;
  // The concrete shape; nullopt if a symbol is unbound (see first_unbound).
  std::optional<Shape> resolve(const SymbolMap& symbols) const;
  std::optional<std::string> first_unbound(const SymbolMap& symbols) const;
  std::string str() const;  // "[N, 1024]", "[]"
  bool operator==(const SymShape&) const = default;
};

// The part of an extent n that index r of p holds along a Sliced dimension: the first n % p
// parts hold one element more (core/formulas.h's split, the one every collective partitions by).
using fx::part_count;
using fx::part_offset;

// ------------------------------------------------------------------------------------- layouts

enum class LayoutKind : uint8_t { Local, Replicated, Sliced, Partial };

struct Layout {
  LayoutKind kind = LayoutKind::Replicated;
  int dim = -1;  // the sliced dimension, for Sliced only

  static constexpr Layout local() { return {LayoutKind::Local, -1}; }
  static constexpr Layout replicated() { return {LayoutKind::Replicated, -1}; }
  static constexpr Layout sliced(int d) { return {LayoutKind::Sliced, d}; }
  static constexpr Layout partial() { return {LayoutKind::Partial, -1}; }

  bool is_local() const { return kind == LayoutKind::Local; }
  bool is_replicated() const { return kind == LayoutKind::Replicated; }
  bool is_sliced() const { return kind == LayoutKind::Sliced; }
  bool is_partial() const { return kind == LayoutKind::Partial; }
  std::string str() const;  // "Local", "Replicated", "Sliced(0)", "Partial"
  bool operator==(const Layout&) const = default;
};

// This rank's shape of a value of global shape `global` under `layout`, for index r of p.
Shape local_shape(const Shape& global, const Layout& layout, int p, int r);

// --------------------------------------------------------------------------------------- types

inline constexpr int kAllGroups = -1;  // a stage every rank evaluates (scalars, constants)

struct Type {
  DType dtype = DType::F32;
  SymShape shape;
  Layout layout;
  int group = kAllGroups;  // the group holding the value, or kAllGroups

  bool is_scalar() const { return shape.rank() == 0 && layout.is_replicated(); }
  std::string str() const;  // "f32[N] Replicated"
  bool operator==(const Type&) const = default;
};

// Streams the str() forms, so that test frameworks print these values readably.
std::ostream& operator<<(std::ostream& os, const Dim& d);
std::ostream& operator<<(std::ostream& os, const SymShape& s);
std::ostream& operator<<(std::ostream& os, const Layout& l);
std::ostream& operator<<(std::ostream& os, const Type& t);

// ----------------------------------------------------------------------------------------- ops

using tandem::reduce_op_name;
using tandem::ReduceOp;  // core/reduce_op.h

enum class Op : uint8_t {
  // sources
  Input,
  Scalar,
  Const,
  // elementwise, one operand
  Neg,
  Abs,
  Sqrt,
  Rsqrt,
  Exp,
  Log,
  Tanh,
  Gelu,
  Relu,
  Cast,
  // elementwise, two operands
  Add,
  Sub,
  Mul,
  Div,
  Pow,
  Max,
  Min,
  Lt,
  Le,
  Gt,
  Ge,
  Eq,
  Ne,
  // elementwise, other
  Select,        // (cond, a, b): cond != 0 ? a : b
  Dropout,       // (x, seed)
  SegmentScale,  // (t, x): t[segment of element i] * x[i] (segments below)
  // reductions
  Norm,
  Reduce,
  SegmentNorm,  // (x): per segment, the L2 norm of x's elements in it (segments below)
  // the rest of the computation
  Matmul,
  Scatter,
  Update,
  // communication within a group
  AllReduce,
  ReduceScatter,
  AllGather,
  Broadcast,
  Shift,  // (x): rank i's piece goes to rank (i + 1) mod p of the group, one step of a ring
  // communication between groups
  Send,
  Recv,
};

std::string_view op_name(Op op);  // "add", "allreduce", ...

// The families visitors dispatch on.
enum class OpKind : uint8_t {
  Source,
  Elementwise,
  Reduction,
  Matmul,
  Scatter,
  Update,
  Collective,
  Transfer
};
OpKind op_kind(Op op);
bool is_unary(Op op);   // Neg .. Cast
bool is_binary(Op op);  // Add .. Ne
bool is_comparison(Op op);

// Attributes; each op reads only the fields its comment names.
struct Attrs {
  double value = 0;                 // Const: the value. Dropout: the probability of dropping.
  ReduceOp reduce = ReduceOp::Sum;  // Reduce, AllReduce, ReduceScatter
  int dim = -1;                     // Reduce (kAllDims: every dim), Scatter, ReduceScatter
  int root = 0;                     // Broadcast: the root's index within the group
  int group = 0;                    // Input: the group holding it. Send: the destination group.
  DType dtype = DType::F32;         // Input, Scalar: the declared dtype. Cast: the target.
  SymShape shape;  // Input: the declared global shape. SegmentNorm: [S], the symbol
                   // naming the number of segments
  Layout layout;   // Input: the declared layout
  bool operator==(const Attrs&) const = default;
};

inline constexpr int kAllDims = -1;

// One node. Built only through Program::add (make), which checks operands and attributes and
// infers `type`.
struct Stage {
  int id = -1;  // index in Program::stages()
  Op op = Op::Const;
  std::string name;       // unique in the program; empty for an unnamed stage (shown as %id)
  std::vector<int> args;  // operand ids, each smaller than id
  Attrs attrs;
  Type type;  // inferred
};

// A named result of the program.
struct Output {
  std::string name;
  int stage = -1;
};

class Program;

// A handle on a stage while a program is built; the operators and functions of builder.h take
// and return Exprs. Valid while its Program lives and is not moved.
class Expr {
 public:
  Expr() = default;
  Expr(Program* program, int id) : program_(program), id_(id) {}

  bool defined() const { return program_ != nullptr; }
  Program* program() const { return program_; }
  int id() const { return id_; }
  const Stage& stage() const;
  const Type& type() const { return stage().type; }
  // Names the stage (for printing, errors and outputs); returns *this.
  Expr named(std::string name) const;

 private:
  Program* program_ = nullptr;
  int id_ = -1;
};

// ------------------------------------------------------------------------------------ programs

class Program {
 public:
  explicit Program(std::string name, int groups = 1);

  const std::string& name() const { return name_; }
  int groups() const { return groups_; }
  const std::vector<Stage>& stages() const { return stages_; }
  const Stage& stage(int id) const;
  const std::vector<Output>& outputs() const { return outputs_; }

  // The one way a stage is made: checks that the operands exist and come first, that the
  // attributes fit the op, infers the type under the layout rules above, and appends the stage.
  // Any violation is a UserError naming the stage, its operands with their types, and what
  // would be legal. Returns the new stage's id.
  int add(Op op, std::vector<int> args, Attrs attrs = {}, std::string name = {});
  // Gives stage `id` a name (unique, an identifier: letters, digits, '_' and '.').
  void set_name(int id, std::string name);
  // Declares stage `id` a result of the program under `name`.
  void add_output(int id, std::string name);

  // Builder conveniences (builder.h has the rest).
  Expr input(DType dtype, SymShape shape, Layout layout, std::string name, int group = 0);
  Expr scalar(std::string name);
  Expr scalar(DType dtype, std::string name);
  Expr constant(double value);
  void output(const Expr& e, std::string name);

  // Whole-program checks that single stages cannot make: dependency order (no cycles), every
  // output produced by a stage that has a value, every send received, something produced, reads
  // of updated inputs before their update. A UserError says which rule and where.
  void validate() const;

  // A program from stages given whole (for passes and tests that build IR directly): checks the
  // dependency order (a cycle is a UserError that lists it), then makes every stage again through
  // add(), and validates.
  static Program assemble(std::string name, int groups, std::vector<Stage> stages,
                          std::vector<Output> outputs);

  // Lookups.
  std::optional<int> find(std::string_view name) const;
  std::string display_name(int id) const;    // the name, or "%id"
  std::vector<int> inputs() const;           // Input stage ids, in order
  std::vector<int> scalars() const;          // Scalar stage ids, in order
  std::vector<std::string> symbols() const;  // every symbol in an input's shape, sorted
  int updater(int input_id) const;           // the Update stage writing input_id, or -1
  std::vector<int> users(int id) const;      // stages with `id` among their operands, in order

  // One stage a line: "name = op(operands) attributes : dtype[shape] layout [@group]".
  std::string str() const;
  std::string stage_str(int id) const;

  // Global concrete shapes of every stage under `symbols`; an unbound symbol is a UserError
  // naming it and the stage whose shape uses it.
  std::vector<Shape> resolve_shapes(const SymbolMap& symbols) const;

  // The segment ops (SegmentNorm, SegmentScale) in id order; none for most programs.
  std::vector<int> segment_stages() const;
  // Checks `bounds` against the program under `symbols` (a UserError naming the stage and the
  // rule otherwise): none without segment ops; with them, ascending from 0, ending at the extent
  // of every segment op's segmented operand, and as many segments as each op's count symbol.
  void check_segments(const SymbolMap& symbols, const Segments& bounds) const;

 private:
  friend class Expr;
  void check_name(std::string_view name, int id) const;
  void check_order() const;

  std::string name_;
  int groups_ = 1;
  std::vector<Stage> stages_;
  std::vector<Output> outputs_;
};

// ---------------------------------------------------------------------------- visitor, mutator

// Walks a program in evaluation order, calling one hook per op family.
class Visitor {
 public:
  virtual ~Visitor() = default;
  void visit(const Program& p);

 protected:
  // Dispatches on op_kind(s.op); override to see every stage.
  virtual void visit_stage(const Program& p, const Stage& s);
  virtual void visit_source(const Program& p, const Stage& s) {}
  virtual void visit_elementwise(const Program& p, const Stage& s) {}
  virtual void visit_reduction(const Program& p, const Stage& s) {}
  virtual void visit_matmul(const Program& p, const Stage& s) {}
  virtual void visit_scatter(const Program& p, const Stage& s) {}
  virtual void visit_update(const Program& p, const Stage& s) {}
  virtual void visit_collective(const Program& p, const Stage& s) {}
  virtual void visit_transfer(const Program& p, const Stage& s) {}
};

// Rewrites a program into a new one, stage by stage in order. Each hook emits the replacement of
// a stage into out() (through Program::add, so everything is re-checked and re-inferred) and
// returns the id, in the new program, of the stage that now holds the old stage's value. The
// default copies the stage with its operands remapped. Outputs follow their stages.
class Mutator {
 public:
  virtual ~Mutator() = default;
  Program mutate(const Program& in);

 protected:
  virtual int mutate_stage(const Stage& s);  // dispatches on op_kind(s.op)
  virtual int mutate_source(const Stage& s) { return copy(s); }
  virtual int mutate_elementwise(const Stage& s) { return copy(s); }
  virtual int mutate_reduction(const Stage& s) { return copy(s); }
  virtual int mutate_matmul(const Stage& s) { return copy(s); }
  virtual int mutate_scatter(const Stage& s) { return copy(s); }
  virtual int mutate_update(const Stage& s) { return copy(s); }
  virtual int mutate_collective(const Stage& s) { return copy(s); }
  virtual int mutate_transfer(const Stage& s) { return copy(s); }

  // Adds `s` to out() with its operands remapped (and, when given, other attributes).
  int copy(const Stage& s);
  int copy(const Stage& s, const Attrs& attrs);
  // The new id of an old stage already mutated.
  int mapped(int old_id) const;
  const Program& in() const { return *in_; }
  Program& out() { return *out_; }

 private:
  const Program* in_ = nullptr;
  Program* out_ = nullptr;
  std::vector<int> map_;
};

}  // namespace tandem::dsl
