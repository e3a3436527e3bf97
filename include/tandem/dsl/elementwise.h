// The exact f32 formula of every elementwise op, in one place: the reference interpreter and the
// code emitters all use these, so a schedule that keeps the order of operations rounds exactly
// as the interpreter does. Header-only and free of tandem types beyond Op, so that emitted code
// can mirror it line for line.
#pragma once

#include <cmath>
#include <cstdint>

#include "tandem/core/rng.h"
#include "tandem/dsl/ir.h"

namespace tandem::dsl {

// GELU, tanh approximation (as in GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline float gelu_f32(float x) {
  const float inner = 0.7978845608f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}

inline float apply_unary(Op op, float x) {
  switch (op) {
    case Op::Neg: return -x;
    case Op::Abs: return std::fabs(x);
    case Op::Sqrt: return std::sqrt(x);
    case Op::Rsqrt: return 1.0f / std::sqrt(x);
    case Op::Exp: return std::exp(x);
    case Op::Log: return std::log(x);
    case Op::Tanh: return std::tanh(x);
    case Op::Gelu: return gelu_f32(x);
    case Op::Relu: return x > 0.0f ? x : 0.0f;
    case Op::Cast: return x;  // the rounding happens at the store, in the target dtype
    default: return NAN;
  }
}

// Comparisons give 1 or 0; max and min follow IEEE fmax/fmin (a NaN operand loses).
inline float apply_binary(Op op, float a, float b) {
  switch (op) {
    case Op::Add: return a + b;
    case Op::Sub: return a - b;
    case Op::Mul: return a * b;
    case Op::Div: return a / b;
    case Op::Pow: return std::pow(a, b);
    case Op::Max: return std::fmax(a, b);
    case Op::Min: return std::fmin(a, b);
    case Op::Lt: return a < b ? 1.0f : 0.0f;
    case Op::Le: return a <= b ? 1.0f : 0.0f;
    case Op::Gt: return a > b ? 1.0f : 0.0f;
    case Op::Ge: return a >= b ? 1.0f : 0.0f;
    case Op::Eq: return a == b ? 1.0f : 0.0f;
    case Op::Ne: return a != b ? 1.0f : 0.0f;
    default: return NAN;
  }
}

inline float apply_select(float cond, float a, float b) { return cond != 0.0f ? a : b; }

// Dropout of element `global_index` (its flat index in the whole, unsliced tensor, so every
// slicing and chunking draws the same mask): kept elements are scaled by 1 / (1 - p), computed
// in double and rounded to f32 once.
inline float dropout_scale(double p) { return static_cast<float>(1.0 / (1.0 - p)); }
inline float apply_dropout(float x, uint64_t seed, uint64_t global_index, double p) {
  return dropout_keep(seed, global_index, static_cast<float>(p)) ? x * dropout_scale(p) : 0.0f;
}

// Reductions over one dim, and Prod, Max and Min over every dim, accumulate in f32, in element
// order, from the identity (Max and Min are exact in any order).
inline float reduce_identity(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return 0.0f;
    case ReduceOp::Prod: return 1.0f;
    case ReduceOp::Max: return -INFINITY;
    case ReduceOp::Min: return INFINITY;
  }
  return 0.0f;
}

inline float reduce_combine(ReduceOp op, float acc, float x) {
  switch (op) {
    case ReduceOp::Sum: return acc + x;
    case ReduceOp::Prod: return acc * x;
    case ReduceOp::Max: return std::fmax(acc, x);
    case ReduceOp::Min: return std::fmin(acc, x);
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
  void add(uint64_t global_index, float x) { lane[global_index % kSumLanes] += static_cast<double>(x); }
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

}  // namespace tandem::dsl
