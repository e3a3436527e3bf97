// Shared by the thread and MPI suites: each workload run on one rank of any communicator with
// inputs in closed form of (rank, index), checked against an independent straightforward
// implementation in double precision written here (not the interpreter's code).
#pragma once

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/core/rng.h"
#include "tandem/dsl/dsl.h"
#include "tandem/exec/reference.h"

namespace tandem::testing {

// A labelled comparison: passes when |got - want| <= atol + rtol |want| everywhere; otherwise
// says how many elements differ, the largest difference, and the first few that differ.
inline ::testing::AssertionResult close(const std::string& label, const Tensor& got,
                                        const std::vector<double>& want, double rtol, double atol) {
  if (got.numel() != static_cast<int64_t>(want.size()))
    return ::testing::AssertionFailure()
           << label << ": " << got.numel() << " elements, expected " << want.size();
  int64_t bad = 0;
  double max_diff = 0;
  std::string first;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double g = got.get(i), w = want[static_cast<size_t>(i)];
    const double diff = std::fabs(g - w);
    if (std::isnan(g) != std::isnan(w) || diff > atol + rtol * std::fabs(w)) {
      if (bad < 5) first += fmt::format(" [{}] got {} want {};", i, g, w);
      ++bad;
    }
    if (!std::isnan(diff)) max_diff = std::max(max_diff, diff);
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << label << ": " << bad << " of " << got.numel() << " elements differ (rtol " << rtol
         << ", atol " << atol << "), max |diff| " << max_diff << ";" << first;
}

inline double rounded(double v, DType t) {
  Tensor x = Tensor::empty(t, Shape{1});
  x.set(0, static_cast<float>(v));
  return x.get(0);
}

inline double to_f32(double v) { return static_cast<float>(v); }

// ------------------------------------------------------------------------------- Adam, LAMB

// Gradients are multiples of 1/8 below 1 in magnitude: exact in bf16 and f16, and their sums over
// four ranks are exact in f32 in any order, so the AllReduce leaves no rounding to argue about.
inline double grad_at(int rank, int64_t i) {
  return static_cast<double>((i * 7 + rank * 3) % 11 - 5) / 8.0;
}
inline double weight_at(int64_t i) {
  return to_f32(0.25 + static_cast<double>((i * 13) % 17) / 17.0);
}
inline double m_at(int64_t i) { return to_f32(static_cast<double>((i * 5) % 9 - 4) / 90.0); }
inline double v_at(int64_t i) { return to_f32(static_cast<double>((i * 3) % 7) / 700.0); }

struct OptimizerCase {
  bool lamb = false;
  DType grad_dtype = DType::BF16;
  int64_t n = 0;
  bool zero_weights = false;  // LAMB's ||w|| = 0 branch
};

// The hyper-parameters as the program sees them: f32 scalars.
struct Hyper {
  double lr = to_f32(1e-2), beta1 = to_f32(0.9), beta2 = to_f32(0.999), eps = to_f32(1e-8),
         weight_decay = to_f32(0.01), step = 10;
};

// Runs the case on this rank of `comm` and checks w, m and v against the formula in double.
inline void check_optimizer(comm::Communicator& comm, const OptimizerCase& c) {
  const int p = comm.size(), rank = comm.rank();
  const dsl::Program program =
      c.lamb ? dsl::workloads::lamb(c.grad_dtype) : dsl::workloads::adam(c.grad_dtype);
  const Hyper h;
  const int64_t n = c.n;
  Tensor g = Tensor::empty(c.grad_dtype, Shape{n});
  Tensor w = Tensor::empty(DType::F32, Shape{n}), m = Tensor::empty(DType::F32, Shape{n}),
         v = Tensor::empty(DType::F32, Shape{n});
  for (int64_t i = 0; i < n; ++i) {
    g.set(i, static_cast<float>(grad_at(rank, i)));
    w.set(i, c.zero_weights ? 0.0f : static_cast<float>(weight_at(i)));
    m.set(i, static_cast<float>(m_at(i)));
    v.set(i, static_cast<float>(v_at(i)));
  }
  exec::RunArgs args;
  args.symbols = {{"N", n}};
  args.scalars = {{"lr", h.lr},           {"beta1", h.beta1}, {"beta2", h.beta2},
                  {"eps", h.eps},         {"step", h.step},   {"weight_decay", h.weight_decay},
                  {"grad_scale", 1.0 / p}};
  args.inputs = {{"g", g}, {"w", w}, {"m", m}, {"v", v}};
  const exec::TensorMap out = exec::run_reference(program, comm, args);
  EXPECT_TRUE(out.empty());  // everything is written in place

  // The formula, in double.
  const double scale = to_f32(1.0 / p);
  std::vector<double> w1(static_cast<size_t>(n)), m1(w1.size()), v1(w1.size()), r(w1.size());
  double w_sq = 0, r_sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    double sum = 0;
    for (int q = 0; q < p; ++q) sum += grad_at(q, i);
    const double gi = scale * rounded(sum, c.grad_dtype);
    const double wi = c.zero_weights ? 0.0 : weight_at(i);
    const size_t k = static_cast<size_t>(i);
    m1[k] = h.beta1 * m_at(i) + (1 - h.beta1) * gi;
    v1[k] = h.beta2 * v_at(i) + (1 - h.beta2) * gi * gi;
    const double mhat = m1[k] / (1 - std::pow(h.beta1, h.step));
    const double vhat = v1[k] / (1 - std::pow(h.beta2, h.step));
    r[k] = mhat / (std::sqrt(vhat) + h.eps) + h.weight_decay * wi;
    w_sq += wi * wi;
    r_sq += r[k] * r[k];
    w1[k] = wi;
  }
  double trust = 1;
  if (c.lamb && w_sq > 0 && r_sq > 0) trust = std::sqrt(w_sq) / std::sqrt(r_sq);
  for (size_t k = 0; k < w1.size(); ++k) w1[k] -= h.lr * trust * r[k];

  // Tolerances: the interpreter rounds every stage to f32 (about a dozen roundings of 2^-24 on
  // the way to w1), and 1 - beta^step in f32 loses digits to cancellation (condition number
  // 1/(1 - 0.999^10), about 100): 1e-5 relative covers both with margin. The absolute term
  // covers m1 near zero, where beta1 m and (1 - beta1) g cancel.
  const std::string where = fmt::format("rank {} of {}, N={}", rank, p, n);
  EXPECT_TRUE(close("m1 " + where, m, m1, 1e-5, 1e-7));
  EXPECT_TRUE(close("v1 " + where, v, v1, 1e-5, 1e-9));
  EXPECT_TRUE(close("w1 " + where, w, w1, 1e-5, 1e-7));
}

// --------------------------------------------------------------------- Megatron and pipeline

inline double x_at(int64_t b, int64_t k) {
  return static_cast<double>((b * 5 + k * 3) % 13 - 6) / 8.0;
}
inline double w_at(int64_t k, int64_t j) {
  return static_cast<double>((k * 7 + j * 2) % 9 - 4) / 16.0;
}
inline double bias_at(int64_t j) { return static_cast<double>(j % 5) / 4.0 - 0.5; }
inline double residual_at(int64_t b, int64_t j) {
  return static_cast<double>((b + 2 * j) % 7) / 7.0;
}

struct LayerCase {
  DType dtype = DType::F32;
  int64_t b = 1, k = 1, h = 1;
  double dropout = 0.1;
  uint64_t seed = 1234;
};

// The layer's output in double from the whole inputs (as rounded to the dtype), with the dropout
// mask drawn from the counter-based generator by flat index in the whole [B, H] tensor.
inline std::vector<double> layer_oracle(const LayerCase& c) {
  std::vector<double> out(static_cast<size_t>(c.b * c.h));
  const double scale = to_f32(1.0 / (1.0 - c.dropout));
  for (int64_t b = 0; b < c.b; ++b)
    for (int64_t j = 0; j < c.h; ++j) {
      double z = 0;
      for (int64_t k = 0; k < c.k; ++k)
        z += rounded(x_at(b, k), c.dtype) * rounded(w_at(k, j), c.dtype);
      const double a = z + rounded(bias_at(j), c.dtype);
      const int64_t idx = b * c.h + j;
      const double d =
          dropout_keep(c.seed, static_cast<uint64_t>(idx), static_cast<float>(c.dropout))
              ? a * scale
              : 0;
      out[static_cast<size_t>(idx)] = d + rounded(residual_at(b, j), c.dtype);
    }
  return out;
}

inline Tensor whole_of(DType dtype, int64_t rows, int64_t cols, double (*at)(int64_t, int64_t)) {
  Tensor t = Tensor::empty(dtype, Shape{rows, cols});
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t.set(r * cols + c, static_cast<float>(at(r, c)));
  return t;
}

// This rank's inputs of the layer: its columns of x and rows of w, the whole bias and residual.
inline exec::RunArgs layer_args(const LayerCase& c, int p, int index) {
  exec::RunArgs args;
  args.symbols = {{"B", c.b}, {"K", c.k}, {"H", c.h}};
  args.scalars = {{"seed", static_cast<double>(c.seed)}};
  Tensor bias = Tensor::empty(c.dtype, Shape{c.h});
  for (int64_t j = 0; j < c.h; ++j) bias.set(j, static_cast<float>(bias_at(j)));
  args.inputs = {
      {"x", exec::piece_of(whole_of(c.dtype, c.b, c.k, x_at), dsl::Sliced(1), p, index)},
      {"w", exec::piece_of(whole_of(c.dtype, c.k, c.h, w_at), dsl::Sliced(0), p, index)},
      {"bias", bias},
      {"residual", whole_of(c.dtype, c.b, c.h, residual_at)},
  };
  return args;
}

// Tolerance of the layer: the product sums K terms of magnitude below 1 in f32 (each addition
// rounds by at most 2^-24 of a running sum below K, plus one rounding per rank in the AllReduce);
// in bf16 or f16 each of the four stored stages (z, a, d, out) rounds by up to half an ulp.
inline double layer_atol(const LayerCase& c, int p) {
  const double f32 = std::pow(static_cast<double>(c.k + p), 2) * 0x1p-24 + 1e-6;
  if (c.dtype == DType::F32) return f32;
  const double ulp = c.dtype == DType::BF16 ? 0x1p-8 : 0x1p-11;
  return f32 + 4 * ulp * (static_cast<double>(c.k) / 8.0 + 4.0);  // |values| stay below K/8 + 4
}

inline void check_layer(comm::Communicator& comm, const LayerCase& c) {
  const int p = comm.size();
  const exec::TensorMap out = exec::run_reference(
      dsl::workloads::megatron_layer(c.dtype, c.dropout), comm, layer_args(c, p, comm.rank()));
  ASSERT_EQ(out.count("out"), 1u);
  EXPECT_TRUE(close(fmt::format("out rank {} of {}, B={} K={} H={} {}", comm.rank(), p, c.b, c.k,
                                c.h, dtype_name(c.dtype)),
                    out.at("out"), layer_oracle(c), 0, layer_atol(c, p)));
}

// Pipeline: ranks [0, p/2) run the layer on their K-slices and hand the output to rank i + p/2.
inline void check_pipeline(comm::Communicator& comm, const LayerCase& c) {
  const int p = comm.size(), half = p / 2, rank = comm.rank();
  const exec::RunArgs args = rank < half ? layer_args(c, half, rank) : [&] {
    exec::RunArgs a = layer_args(c, half, 0);
    a.inputs.clear();  // group 1 holds no inputs
    return a;
  }();
  const exec::TensorMap out =
      exec::run_reference(dsl::workloads::pipeline_stage(c.dtype, c.dropout), comm, args);
  const std::string name = rank < half ? "out" : "h";
  ASSERT_EQ(out.size(), 1u) << "rank " << rank;
  ASSERT_EQ(out.count(name), 1u) << "rank " << rank;
  EXPECT_TRUE(close(fmt::format("{} rank {} of {}, B={} K={} H={}", name, rank, p, c.b, c.k, c.h),
                    out.at(name), layer_oracle(c), 0, layer_atol(c, half)));
}

}  // namespace tandem::testing
