// The linear layers and the LM head with bf16 matmuls (MatmulPrecision) against the exact
// products in double, elementwise, and the f32 path against OpenBLAS's SGEMM bit for bit.
//
// The tolerance of a bf16 product, per output element (a sum of K products a * b, possibly onto
// a bias or an accumulated gradient c):
//   - bf16 keeps 8 significant bits, so each operand rounds (to nearest) with relative error at
//     most u = 2^-8 and a product a~ b~ is off by at most (2u + u^2) |a b|;
//   - the products are exact in f32 and summed in f32: at most (K + 1) 2^-24 of the magnitude
//     m = sum |a b| + |c| (the standard bound for a sum of K + 1 terms).
// So |got - exact| <= (2^-7 + 2^-16 + (K + 1) 2^-24) m. And the result must be the product of
// the rounded operands within the f32 term alone, (K + 1) 2^-24 m: that catches an operand left
// in f32 or rounded the wrong way, which the first bound would let through.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "nn/nn_test_util.h"
#include "support/bf16_emulate.h"
#include "tandem/core/blas.h"
#include "tandem/core/error.h"
#include "tandem/core/formulas.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {
namespace {

using testing::Bf16Scratch;
using testing::to_f32;
using testing::uniform;

using Matrix = std::function<double(int, int)>;  // element (row, column)

// C (m x n) = A (m x k) B (k x n) + c0 in double, and its magnitude sum |a b| + |c0|.
struct Product {
  std::vector<double> value, magnitude;
};

Product product(int m, int n, int k, const Matrix& a, const Matrix& b, const Matrix& c0) {
  Product p{std::vector<double>(static_cast<size_t>(m) * n),
            std::vector<double>(static_cast<size_t>(m) * n)};
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = c0(i, j), mag = std::fabs(c0(i, j));
      for (int l = 0; l < k; ++l) {
        s += a(i, l) * b(l, j);
        mag += std::fabs(a(i, l) * b(l, j));
      }
      p.value[static_cast<size_t>(i) * n + j] = s;
      p.magnitude[static_cast<size_t>(i) * n + j] = mag;
    }
  return p;
}

// Element (r, c) of a row-major rows x cols array, optionally rounded to bf16 first.
Matrix at(const std::vector<float>& v, int cols, bool rounded) {
  return [&v, cols, rounded](int r, int c) {
    const float x = v[static_cast<size_t>(r) * cols + c];
    return static_cast<double>(rounded ? fx::rt_bf16(x) : x);
  };
}
Matrix transposed(const Matrix& m) {
  return [m](int r, int c) { return m(c, r); };
}
Matrix zero() {
  return [](int, int) { return 0.0; };
}
Matrix row_vector(const std::vector<float>& bias) {
  return [&bias](int, int c) { return static_cast<double>(bias[static_cast<size_t>(c)]); };
}

// got against the exact product of the f32 operands and that of their bf16 roundings, k terms.
void expect_bf16_product(const std::string& label, const std::vector<float>& got,
                         const Product& exact, const Product& of_rounded, int k) {
  ASSERT_EQ(got.size(), exact.value.size()) << label;
  const double accumulate = (k + 1) * std::ldexp(1.0, -24);
  const double total = std::ldexp(1.0, -7) + std::ldexp(1.0, -16) + accumulate;
  size_t bad_exact = 0, bad_rounded = 0, rounded = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double m = exact.magnitude[i], g = got[i];
    const double d = std::fabs(g - exact.value[i]);
    bad_exact += !(d <= total * m);
    bad_rounded += !(std::fabs(g - of_rounded.value[i]) <= accumulate * of_rounded.magnitude[i]);
    rounded += d > accumulate * m;  // visibly not an f32 product
    worst = std::max(worst, m > 0 ? d / m : 0.0);
  }
  EXPECT_EQ(bad_exact, 0u) << label << ": beyond the bf16 bound; worst |diff| / magnitude " << worst
                           << ", bound " << total;
  EXPECT_EQ(bad_rounded, 0u) << label << ": not the product of the bf16-rounded operands";
  EXPECT_GT(rounded, 0u) << label << ": every element is as close as an f32 product";
}

void bf16_linear_case(int N, int IC, int OC) {
  SCOPED_TRACE(::testing::Message() << N << " x " << IC << " x " << OC);
  const std::vector<float> x = to_f32(uniform(N * IC, 31)), w = to_f32(uniform(IC * OC, 32)),
                           bias = to_f32(uniform(OC, 33)), dout = to_f32(uniform(N * OC, 34)),
                           dinp0 = to_f32(uniform(N * IC, 35)), dw0 = to_f32(uniform(IC * OC, 36));
  Bf16Scratch s(static_cast<int64_t>(N) * std::max(IC, OC),
                std::max(static_cast<int64_t>(IC) * OC, static_cast<int64_t>(N) * IC));
  // out = x w + bias
  std::vector<float> out(static_cast<size_t>(N) * OC);
  linear_forward(out.data(), x.data(), w.data(), bias.data(), N, IC, OC, s.bf16s());
  auto forward = [&](bool r) {
    return product(N, OC, IC, at(x, IC, r), at(w, OC, r), row_vector(bias));
  };
  expect_bf16_product("linear forward", out, forward(false), forward(true), IC);
  // dinp += dout w^T; dweight += x^T dout (onto values already there: gradients accumulate)
  std::vector<float> dinp = dinp0, dw = dw0, db(static_cast<size_t>(OC), 0.0f);
  linear_backward(dinp.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(), N, IC, OC,
                  s.bf16s());
  auto input_grad = [&](bool r) {
    return product(N, IC, OC, at(dout, OC, r), transposed(at(w, OC, r)), at(dinp0, IC, false));
  };
  auto weight_grad = [&](bool r) {
    return product(IC, OC, N, transposed(at(x, IC, r)), at(dout, OC, r), at(dw0, OC, false));
  };
  expect_bf16_product("linear dinp", dinp, input_grad(false), input_grad(true), OC);
  expect_bf16_product("linear dweight", dw, weight_grad(false), weight_grad(true), N);
  // The bias gradient is f32 whatever the matmuls: exactly the f32 path's.
  std::vector<float> dinp32 = dinp0, dw32 = dw0, db32(static_cast<size_t>(OC), 0.0f);
  linear_backward(dinp32.data(), dw32.data(), db32.data(), dout.data(), x.data(), w.data(), N, IC,
                  OC);
  EXPECT_EQ(db, db32);
}

TEST(Bf16Layers, Linear) {
  bf16_linear_case(37, 48, 29);
  bf16_linear_case(128, 192, 160);
}

TEST(Bf16Layers, LmHead) {
  const int N = 23, C = 40, V = 67;
  const std::vector<float> x = to_f32(uniform(N * C, 41)), wte = to_f32(uniform(V * C, 42)),
                           dlogits = to_f32(uniform(N * V, 43)), dinp0 = to_f32(uniform(N * C, 44)),
                           dwte0 = to_f32(uniform(V * C, 45));
  Bf16Scratch s(static_cast<int64_t>(N) * V, static_cast<int64_t>(std::max(N, V)) * C);
  std::vector<float> logits(static_cast<size_t>(N) * V);
  lm_head_forward(logits.data(), x.data(), wte.data(), N, C, V, s.bf16s());
  auto forward = [&](bool r) {
    return product(N, V, C, at(x, C, r), transposed(at(wte, C, r)), zero());
  };
  expect_bf16_product("lm_head forward", logits, forward(false), forward(true), C);
  std::vector<float> dinp = dinp0, dwte = dwte0;
  lm_head_backward(dinp.data(), dwte.data(), dlogits.data(), x.data(), wte.data(), N, C, V,
                   s.bf16s());
  auto input_grad = [&](bool r) {
    return product(N, C, V, at(dlogits, V, r), at(wte, C, r), at(dinp0, C, false));
  };
  auto table_grad = [&](bool r) {
    return product(V, C, N, transposed(at(dlogits, V, r)), at(x, C, r), at(dwte0, C, false));
  };
  expect_bf16_product("lm_head dinp", dinp, input_grad(false), input_grad(true), V);
  expect_bf16_product("lm_head dwte", dwte, table_grad(false), table_grad(true), N);
}

// Too little scratch is a bug of the caller's, caught before anything is written past it.
TEST(Bf16Layers, ScratchTooSmallIsAnInternalError) {
  const int N = 4, IC = 8, OC = 8;
  std::vector<float> x(N * IC, 1.0f), w(IC * OC, 1.0f), out(N * OC);
  Bf16Scratch s(N * IC - 1, IC * OC);
  EXPECT_THROW(linear_forward(out.data(), x.data(), w.data(), nullptr, N, IC, OC, s.bf16s()),
               InternalError);
}

// The f32 path is OpenBLAS's SGEMM, the very call the layers made before core/gemm.h.
TEST(Bf16Layers, F32PathIsSgemmBitForBit) {
  const int N = 19, IC = 33, OC = 21;
  const std::vector<float> x = to_f32(uniform(N * IC, 51)), w = to_f32(uniform(IC * OC, 52)),
                           dout = to_f32(uniform(N * OC, 53));
  std::vector<float> out(static_cast<size_t>(N) * OC), want(out.size(), 0.0f);
  linear_forward(out.data(), x.data(), w.data(), nullptr, N, IC, OC);
  blas::sgemm(false, false, N, OC, IC, 1.0f, x.data(), IC, w.data(), OC, 1.0f, want.data(), OC);
  EXPECT_EQ(out, want);
  std::vector<float> dinp(static_cast<size_t>(N) * IC, 0.0f),
      dw(static_cast<size_t>(IC) * OC, 0.0f);
  std::vector<float> want_dinp = dinp, want_dw = dw;
  linear_backward(dinp.data(), dw.data(), nullptr, dout.data(), x.data(), w.data(), N, IC, OC);
  blas::sgemm(false, true, N, IC, OC, 1.0f, dout.data(), OC, w.data(), OC, 1.0f, want_dinp.data(),
              IC);
  blas::sgemm(true, false, IC, OC, N, 1.0f, x.data(), IC, dout.data(), OC, 1.0f, want_dw.data(),
              OC);
  EXPECT_EQ(dinp, want_dinp);
  EXPECT_EQ(dw, want_dw);
}

}  // namespace
}  // namespace tandem::nn
