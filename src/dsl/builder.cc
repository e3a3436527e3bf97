// The builder's operators and functions: each checks that its Exprs are defined and of one
// program, then adds one stage (and a constant for each double operand).
#include "tandem/dsl/builder.h"

#include <fmt/format.h>

#include <initializer_list>

#include "tandem/core/error.h"

namespace tandem::dsl {
namespace {

// The program every operand belongs to; an undefined operand or a mix of programs is a UserError.
Program& program_of(std::string_view what, std::initializer_list<const Expr*> operands) {
  Program* p = nullptr;
  for (const Expr* e : operands) {
    if (!e->defined())
      user_error(
          "{}: an operand is an undefined Expr (default-constructed, never assigned a stage)",
          what);
    if (p == nullptr) {
      p = e->program();
    } else if (e->program() != p) {
      user_error(
          "{}: operands come from different programs, '{}' ({}) and '{}' ({}); a stage's operands "
          "must "
          "be stages of its own program",
          what, p->name(), operands.begin()[0]->program()->display_name(operands.begin()[0]->id()),
          e->program()->name(), e->program()->display_name(e->id()));
    }
  }
  return *p;
}

Expr make(Op op, std::initializer_list<const Expr*> operands, Attrs attrs = {}) {
  Program& p = program_of(op_name(op), operands);
  std::vector<int> args;
  for (const Expr* e : operands) args.push_back(e->id());
  return Expr(&p, p.add(op, std::move(args), std::move(attrs)));
}

Expr binary(Op op, const Expr& a, const Expr& b) { return make(op, {&a, &b}); }

Expr constant_like(const Expr& e, double v, Op op) {
  if (!e.defined())
    user_error("{}: an operand is an undefined Expr (default-constructed, never assigned a stage)",
               op_name(op));
  return e.program()->constant(v);
}

Expr binary(Op op, const Expr& a, double b) { return binary(op, a, constant_like(a, b, op)); }
Expr binary(Op op, double a, const Expr& b) { return binary(op, constant_like(b, a, op), b); }

Attrs with_reduce(ReduceOp op, int dim) {
  Attrs a;
  a.reduce = op;
  a.dim = dim;
  return a;
}

}  // namespace

Expr operator+(const Expr& a, const Expr& b) { return binary(Op::Add, a, b); }
Expr operator-(const Expr& a, const Expr& b) { return binary(Op::Sub, a, b); }
Expr operator*(const Expr& a, const Expr& b) { return binary(Op::Mul, a, b); }
Expr operator/(const Expr& a, const Expr& b) { return binary(Op::Div, a, b); }
Expr operator+(const Expr& a, double b) { return binary(Op::Add, a, b); }
Expr operator-(const Expr& a, double b) { return binary(Op::Sub, a, b); }
Expr operator*(const Expr& a, double b) { return binary(Op::Mul, a, b); }
Expr operator/(const Expr& a, double b) { return binary(Op::Div, a, b); }
Expr operator+(double a, const Expr& b) { return binary(Op::Add, a, b); }
Expr operator-(double a, const Expr& b) { return binary(Op::Sub, a, b); }
Expr operator*(double a, const Expr& b) { return binary(Op::Mul, a, b); }
Expr operator/(double a, const Expr& b) { return binary(Op::Div, a, b); }
Expr operator-(const Expr& a) { return make(Op::Neg, {&a}); }

Expr operator<(const Expr& a, const Expr& b) { return binary(Op::Lt, a, b); }
Expr operator<=(const Expr& a, const Expr& b) { return binary(Op::Le, a, b); }
Expr operator>(const Expr& a, const Expr& b) { return binary(Op::Gt, a, b); }
Expr operator>=(const Expr& a, const Expr& b) { return binary(Op::Ge, a, b); }
Expr operator<(const Expr& a, double b) { return binary(Op::Lt, a, b); }
Expr operator<=(const Expr& a, double b) { return binary(Op::Le, a, b); }
Expr operator>(const Expr& a, double b) { return binary(Op::Gt, a, b); }
Expr operator>=(const Expr& a, double b) { return binary(Op::Ge, a, b); }
Expr eq(const Expr& a, const Expr& b) { return binary(Op::Eq, a, b); }
Expr ne(const Expr& a, const Expr& b) { return binary(Op::Ne, a, b); }

Expr neg(const Expr& x) { return make(Op::Neg, {&x}); }
Expr abs(const Expr& x) { return make(Op::Abs, {&x}); }
Expr sqrt(const Expr& x) { return make(Op::Sqrt, {&x}); }
Expr rsqrt(const Expr& x) { return make(Op::Rsqrt, {&x}); }
Expr exp(const Expr& x) { return make(Op::Exp, {&x}); }
Expr log(const Expr& x) { return make(Op::Log, {&x}); }
Expr tanh(const Expr& x) { return make(Op::Tanh, {&x}); }
Expr gelu(const Expr& x) { return make(Op::Gelu, {&x}); }
Expr relu(const Expr& x) { return make(Op::Relu, {&x}); }
Expr pow(const Expr& x, const Expr& y) { return binary(Op::Pow, x, y); }
Expr pow(const Expr& x, double y) { return binary(Op::Pow, x, y); }
Expr pow(double x, const Expr& y) { return binary(Op::Pow, x, y); }
Expr max(const Expr& a, const Expr& b) { return binary(Op::Max, a, b); }
Expr min(const Expr& a, const Expr& b) { return binary(Op::Min, a, b); }
Expr max(const Expr& a, double b) { return binary(Op::Max, a, b); }
Expr min(const Expr& a, double b) { return binary(Op::Min, a, b); }

Expr select(const Expr& cond, const Expr& a, const Expr& b) {
  return make(Op::Select, {&cond, &a, &b});
}
Expr select(const Expr& cond, const Expr& a, double b) {
  const Expr c = constant_like(cond, b, Op::Select);
  return select(cond, a, c);
}
Expr select(const Expr& cond, double a, const Expr& b) {
  const Expr c = constant_like(cond, a, Op::Select);
  return select(cond, c, b);
}

Expr cast(const Expr& x, DType dtype) {
  Attrs a;
  a.dtype = dtype;
  return make(Op::Cast, {&x}, a);
}

Expr dropout(const Expr& x, double p, const Expr& seed) {
  Attrs a;
  a.value = p;
  return make(Op::Dropout, {&x, &seed}, a);
}

Expr dropout(const Expr& x, double p, uint64_t seed) {
  const Expr s = constant_like(x, static_cast<double>(seed), Op::Dropout);
  return dropout(x, p, s);
}

Expr norm(const Expr& x) { return make(Op::Norm, {&x}); }

Expr segment_norm(const Expr& x, std::string count) {
  Attrs a;
  a.shape = SymShape{Dim(std::move(count))};
  return make(Op::SegmentNorm, {&x}, a);
}

Expr segment_scale(const Expr& t, const Expr& x) { return make(Op::SegmentScale, {&t, &x}); }
Expr reduce(ReduceOp op, const Expr& x, int dim) {
  return make(Op::Reduce, {&x}, with_reduce(op, dim));
}
Expr matmul(const Expr& a, const Expr& b) { return make(Op::Matmul, {&a, &b}); }

Expr scatter(const Expr& x, int dim) {
  Attrs a;
  a.dim = dim;
  return make(Op::Scatter, {&x}, a);
}

Expr update(const Expr& target, const Expr& value) { return make(Op::Update, {&target, &value}); }

Expr AllReduce(ReduceOp op, const Expr& x) {
  return make(Op::AllReduce, {&x}, with_reduce(op, -1));
}
Expr ReduceScatter(ReduceOp op, const Expr& x, int dim) {
  return make(Op::ReduceScatter, {&x}, with_reduce(op, dim));
}
Expr AllGather(const Expr& x) { return make(Op::AllGather, {&x}); }

Expr Broadcast(const Expr& x, int root) {
  Attrs a;
  a.root = root;
  return make(Op::Broadcast, {&x}, a);
}

Expr Shift(const Expr& x) { return make(Op::Shift, {&x}); }

Expr Send(const Expr& x, int to_group) {
  Attrs a;
  a.group = to_group;
  return make(Op::Send, {&x}, a);
}

Expr Recv(const Expr& sent) { return make(Op::Recv, {&sent}); }

}  // namespace tandem::dsl
