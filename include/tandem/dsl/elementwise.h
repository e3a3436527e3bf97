// The exact f32 formula of every elementwise op, in one place: each op names a function of
// core/formulas.h, which the reference interpreter calls through apply_* below and the code
// emitters print by name (formula_name), pasting formulas.h's own text into what they emit. So a
// schedule that keeps the order of operations rounds exactly as the interpreter does.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "tandem/core/formulas.h"
#include "tandem/core/rng.h"
#include "tandem/dsl/ir.h"

namespace tandem::dsl {

// X(Op, formulas.h function) for every elementwise op of one and of two operands: the one list
// that both the interpreter's switch and the emitters' names are expanded from.
// clang-format off
#define TANDEM_UNARY_FORMULAS(X)                                                     \
  X(Neg, neg) X(Abs, abs) X(Sqrt, sqrt) X(Rsqrt, rsqrt) X(Exp, exp) X(Log, log)      \
  X(Tanh, tanh) X(Gelu, gelu) X(Relu, relu) X(Cast, cast)
#define TANDEM_BINARY_FORMULAS(X)                                                    \
  X(Add, add) X(Sub, sub) X(Mul, mul) X(Div, div) X(Pow, pow) X(Max, max) X(Min, min) \
  X(Lt, lt) X(Le, le) X(Gt, gt) X(Ge, ge) X(Eq, eq) X(Ne, ne)
// clang-format on

// The formulas.h function of an elementwise op ("gelu" for Gelu; "select" for Select, "dropout"
// for Dropout); empty for an op that is not elementwise. An emitter prints `fx::<name>(...)`.
inline std::string_view formula_name(Op op) {
  switch (op) {
#define TANDEM_FORMULA_CASE(op, fn) \
  case Op::op:                      \
    return #fn;
    TANDEM_UNARY_FORMULAS(TANDEM_FORMULA_CASE)
    TANDEM_BINARY_FORMULAS(TANDEM_FORMULA_CASE)
#undef TANDEM_FORMULA_CASE
    case Op::Select:
      return "select";
    case Op::Dropout:
      return "dropout";
    default:
      return {};
  }
}

// Cast computes nothing: the rounding happens at the store, in the target dtype.
inline float apply_unary(Op op, float x) {
  switch (op) {
#define TANDEM_FORMULA_CASE(op, fn) \
  case Op::op:                      \
    return fx::fn(x);
    TANDEM_UNARY_FORMULAS(TANDEM_FORMULA_CASE)
#undef TANDEM_FORMULA_CASE
    default:
      return NAN;
  }
}

inline float apply_binary(Op op, float a, float b) {
  switch (op) {
#define TANDEM_FORMULA_CASE(op, fn) \
  case Op::op:                      \
    return fx::fn(a, b);
    TANDEM_BINARY_FORMULAS(TANDEM_FORMULA_CASE)
#undef TANDEM_FORMULA_CASE
    default:
      return NAN;
  }
}

inline float apply_select(float cond, float a, float b) { return fx::select(cond, a, b); }

// Dropout of element `global_index` (its flat index in the whole, unsliced tensor, so every
// slicing and chunking draws the same mask).
inline float dropout_scale(double p) { return fx::dropout_scale(p); }
inline float apply_dropout(float x, uint64_t seed, uint64_t global_index, double p) {
  return fx::dropout(x, seed, global_index, static_cast<float>(p), dropout_scale(p));
}

// Reductions over one dim, and Prod, Max and Min over every dim, accumulate in f32, in element
// order, from the identity (Max and Min are exact in any order).
inline float reduce_identity(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return 0.0f;
    case ReduceOp::Prod:
      return 1.0f;
    case ReduceOp::Max:
      return -INFINITY;
    case ReduceOp::Min:
      return INFINITY;
  }
  return 0.0f;
}

inline float reduce_combine(ReduceOp op, float acc, float x) {
  switch (op) {
    case ReduceOp::Sum:
      return fx::sum(acc, x);
    case ReduceOp::Prod:
      return fx::prod(acc, x);
    case ReduceOp::Max:
      return fx::max(acc, x);
    case ReduceOp::Min:
      return fx::min(acc, x);
  }
  return acc;
}

// Whole-tensor sums (Reduce Sum over every dim, and the sum of squares under a Norm) are not
// folded in f32 but in 8 interleaved double lanes keyed by each element's global flat index g
// (its index in the whole, unsliced tensor): element g is added to lane g % 8 (a norm adds
// double(x) * double(x), which is exact), each lane in element order from 0.0; at the end the
// lanes are added in order 0..7 and the sum is rounded to f32 once. Keyed by the global index,
// the result does not depend on how a loop is cut into chunks, tiles or row blocks, and the lane
// loop vectorises without reassociating anything. When the tensor is Sliced, each rank does
// this over its part (keys still global) and the ranks' f32 partial sums are then combined by
// an f32 all-reduce: that cross-rank combination, whose order depends on the schedule, is the
// only place two schedules may differ. A norm is then the f32 sqrt of the f32 sum.
inline constexpr int kSumLanes = 8;
struct SumLanes {
  double lane[kSumLanes] = {};
  void add(uint64_t global_index, float x) {
    lane[global_index % kSumLanes] += static_cast<double>(x);
  }
  void add_square(uint64_t global_index, float x) {
    const double d = x;
    lane[global_index % kSumLanes] += d * d;
  }
  // The lanes added in order, rounded to f32 once.
  float total() const {
    double s = 0.0;
    for (double l : lane) s += l;
    return static_cast<float>(s);
  }
};

// The per-segment sums of squares of a piece of a segmented f32 tensor (ir.h, segment_norm): x
// holds elements [begin, begin + n) of the whole; segment s's elements are folded in SumLanes keyed
// by their index within the segment and rounded to f32 into part[s] (0 for a segment the piece
// misses). Every executor calls this, so a segment norm's per-rank partials are the same in each.
inline void segment_sums_of_squares(const float* x, int64_t begin, int64_t n,
                                    const Segments& bounds, float* part) {
  const int64_t segments = static_cast<int64_t>(bounds.size()) - 1;
  for (int64_t s = 0; s < segments; ++s) part[s] = 0.0f;
  for (int64_t i = 0; i < n;) {
    const int64_t g = begin + i, s = segment_of(bounds, g);
    const int64_t end = std::min(begin + n, bounds[static_cast<size_t>(s) + 1]);
    SumLanes lanes;
    for (; begin + i < end; ++i)
      lanes.add_square(static_cast<uint64_t>(begin + i - bounds[static_cast<size_t>(s)]), x[i]);
    part[s] = lanes.total();
  }
}

}  // namespace tandem::dsl
