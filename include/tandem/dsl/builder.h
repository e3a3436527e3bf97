// The friendly way to write a program: operators and functions on Expr that add stages to the
// Expr's program, so that an optimizer reads like its formula (`b1 * m + (1 - b1) * g`).
// Every function goes through Program::add, which checks and infers (see ir.h for the rules).
// C++ leaves unspecified which operand of `a + b` is evaluated first, so the stage ids of one
// expression with two compound operands may differ between compilers (the meaning never does);
// where ids must be stable (golden text, cache keys), give each compound operand its own line.
#pragma once

#include <cstdint>
#include <string>

#include "tandem/dsl/ir.h"

namespace tandem::dsl {

// Short names for writing programs: p.input(F16, {"N"}, Local, "g"), AllReduce(Sum, g).
inline constexpr DType F32 = DType::F32;
inline constexpr DType BF16 = DType::BF16;
inline constexpr DType F16 = DType::F16;
inline constexpr Layout Local = Layout::local();
inline constexpr Layout Replicated = Layout::replicated();
inline constexpr Layout Partial = Layout::partial();
constexpr Layout Sliced(int dim) { return Layout::sliced(dim); }
inline constexpr ReduceOp Sum = ReduceOp::Sum;
inline constexpr ReduceOp Prod = ReduceOp::Prod;
inline constexpr ReduceOp Max = ReduceOp::Max;
inline constexpr ReduceOp Min = ReduceOp::Min;

// Arithmetic; a double becomes a constant of the other operand's program.
Expr operator+(const Expr& a, const Expr& b);
Expr operator-(const Expr& a, const Expr& b);
Expr operator*(const Expr& a, const Expr& b);
Expr operator/(const Expr& a, const Expr& b);
Expr operator+(const Expr& a, double b);
Expr operator-(const Expr& a, double b);
Expr operator*(const Expr& a, double b);
Expr operator/(const Expr& a, double b);
Expr operator+(double a, const Expr& b);
Expr operator-(double a, const Expr& b);
Expr operator*(double a, const Expr& b);
Expr operator/(double a, const Expr& b);
Expr operator-(const Expr& a);

// Comparisons give 1 where true and 0 where false, in the operands' dtype.
Expr operator<(const Expr& a, const Expr& b);
Expr operator<=(const Expr& a, const Expr& b);
Expr operator>(const Expr& a, const Expr& b);
Expr operator>=(const Expr& a, const Expr& b);
Expr operator<(const Expr& a, double b);
Expr operator<=(const Expr& a, double b);
Expr operator>(const Expr& a, double b);
Expr operator>=(const Expr& a, double b);
Expr eq(const Expr& a, const Expr& b);
Expr ne(const Expr& a, const Expr& b);

// Elementwise functions.
Expr neg(const Expr& x);
Expr abs(const Expr& x);
Expr sqrt(const Expr& x);
Expr rsqrt(const Expr& x);
Expr exp(const Expr& x);
Expr log(const Expr& x);
Expr tanh(const Expr& x);
Expr gelu(const Expr& x);
Expr relu(const Expr& x);
Expr pow(const Expr& x, const Expr& y);
Expr pow(const Expr& x, double y);
Expr pow(double x, const Expr& y);
Expr max(const Expr& a, const Expr& b);
Expr min(const Expr& a, const Expr& b);
Expr max(const Expr& a, double b);
Expr min(const Expr& a, double b);
Expr select(const Expr& cond, const Expr& a, const Expr& b);
Expr select(const Expr& cond, const Expr& a, double b);
Expr select(const Expr& cond, double a, const Expr& b);
Expr cast(const Expr& x, DType dtype);
// Drops each element with probability p and scales the kept ones by 1/(1-p); the mask depends
// only on (seed, the element's index in the whole tensor). `seed` is a scalar bound at run time
// to a non-negative integer, or the constant overload's value.
Expr dropout(const Expr& x, double p, const Expr& seed);
Expr dropout(const Expr& x, double p, uint64_t seed);

// Reductions: the L2 norm (an f32 scalar), and sum/prod/max/min over every dim or one.
Expr norm(const Expr& x);
// Segments (ir.h): per segment of f32 [N] x, its L2 norm (f32[count], count the symbol of the
// number of segments); and x scaled by its segment's entry of f32[count] t.
Expr segment_norm(const Expr& x, std::string count = "S");
Expr segment_scale(const Expr& t, const Expr& x);
Expr reduce(ReduceOp op, const Expr& x, int dim = kAllDims);

// Matrix product over the last two dims: [..., M, K] x [..., K, N] -> [..., M, N]; a 2-D
// operand broadcasts over the other's batch dims.
Expr matmul(const Expr& a, const Expr& b);
// This rank's part of a Replicated tensor along `dim` (Sliced(dim)), without communication.
Expr scatter(const Expr& x, int dim);
// Writes `value` into input `target` in place; the result is the new value.
Expr update(const Expr& target, const Expr& value);

// Collectives over the stage's group.
Expr AllReduce(ReduceOp op, const Expr& x);
Expr ReduceScatter(ReduceOp op, const Expr& x, int dim = 0);
Expr AllGather(const Expr& x);
Expr Broadcast(const Expr& x, int root);
// One step of a ring: rank i of the group receives rank (i - 1) mod p's Local x (ir.h's Shift).
Expr Shift(const Expr& x);
// Pipeline hand-off: rank i of x's group sends its piece to rank i of `to_group`; Recv makes
// the value exist in that group.
Expr Send(const Expr& x, int to_group);
Expr Recv(const Expr& sent);

}  // namespace tandem::dsl
