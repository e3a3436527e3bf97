// The Llama-family layers (RMSNorm, RoPE, SwiGLU) against naive references in double and the
// references' backward against finite differences; RoPE's invariants (pair norms, position
// offsets, inverse) and Llama 3.1 frequency scaling against the formula in long double; and
// grouped-query attention against multi-head attention on repeated key/value heads.
//
// Tolerances are those of layers_test.cc: forward rtol 1e-5 and backward 2e-5 of the largest
// expected element (f32 rounding over sums of a few dozen terms, exp_approx's 2 ulp), reference
// backward vs central differences rtol 1e-6.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numbers>
#include <string>
#include <vector>

#include "nn/nn_test_util.h"
#include "tandem/core/bf16.h"
#include "tandem/core/error.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {
namespace {

using namespace tandem::nn::testing;
using ::testing::HasSubstr;
using Vecs = std::vector<std::vector<double>>;
using Vecs32 = std::vector<std::vector<float>>;

// ---------------------------------------------------------------------------------------------
// Naive references in double, written from the definitions.

void ref_rmsnorm_forward(double* out, double* rstd, const double* x, const double* w, int N, int C,
                         double eps) {
  for (int n = 0; n < N; ++n) {
    double ss = 0.0;
    for (int i = 0; i < C; ++i) ss += x[n * C + i] * x[n * C + i];
    rstd[n] = 1.0 / std::sqrt(ss / C + eps);
    for (int i = 0; i < C; ++i) out[n * C + i] = x[n * C + i] * rstd[n] * w[i];
  }
}

// d rstd / d x_i = -rstd^3 x_i / C, so dx_i = rstd w_i g_i - x_i rstd^3 / C sum_j w_j g_j x_j.
void ref_rmsnorm_backward(double* dx, double* dw, const double* g, const double* x, const double* w,
                          const double* rstd, int N, int C) {
  for (int n = 0; n < N; ++n) {
    const double r = rstd[n];
    double wgx = 0.0;
    for (int j = 0; j < C; ++j) wgx += w[j] * g[n * C + j] * x[n * C + j];
    for (int i = 0; i < C; ++i) {
      dx[n * C + i] += r * w[i] * g[n * C + i] - x[n * C + i] * r * r * r / C * wgx;
      dw[i] += x[n * C + i] * r * g[n * C + i];
    }
  }
}

double ref_sigmoid(double v) { return 1.0 / (1.0 + std::exp(-v)); }

void ref_swiglu_forward(double* out, const double* g, const double* u, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = g[i] * ref_sigmoid(g[i]) * u[i];
}

void ref_swiglu_backward(double* dg, double* du, const double* d, const double* g, const double* u,
                         size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const double s = ref_sigmoid(g[i]);
    dg[i] += d[i] * u[i] * (s + g[i] * s * (1.0 - s));
    du[i] += d[i] * g[i] * s;
  }
}

// inv_freq[i] = theta^(-2i / HS), in double.
std::vector<double> ref_inv_freq(int HS, double theta) {
  std::vector<double> f(HS / 2);
  for (int i = 0; i < HS / 2; ++i) f[i] = std::pow(theta, -2.0 * i / HS);
  return f;
}

// Rotates (or, with inverse, rotates back) the pairs (i, i + HS/2) of each head of the strided
// rows in place, the angle (pos0 + t) * inv_freq[i] in double.
void ref_rope(double* x, const std::vector<double>& inv_freq, int B, int T, int NH, int HS,
              int64_t stride, int pos0, bool inverse) {
  const int half = HS / 2;
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int h = 0; h < NH; ++h) {
        double* head = x + (static_cast<int64_t>(b) * T + t) * stride + h * HS;
        for (int i = 0; i < half; ++i) {
          const double angle = (pos0 + t) * inv_freq[i];
          const double c = std::cos(angle), s = inverse ? -std::sin(angle) : std::sin(angle);
          const double x1 = head[i], x2 = head[i + half];
          head[i] = x1 * c - x2 * s;
          head[i + half] = x2 * c + x1 * s;
        }
      }
}

// ---------------------------------------------------------------------------------------------
// One layer's checks, as in layers_test.cc: forward vs reference, reference backward vs finite
// differences, f32 backward vs reference, and (when the backward accumulates) twice = double.
struct LlamaLayerCase {
  std::string name;
  Vecs inputs;
  std::function<std::vector<double>(const Vecs&)> ref_forward;
  std::function<std::vector<float>(const Vecs32&)> fast_forward;
  std::function<Vecs(const Vecs&, const std::vector<double>&)> ref_backward;
  // Gradients from the f32 kernel called `repeats` times on zeroed buffers.
  std::function<Vecs32(const Vecs32&, const std::vector<float>&, int repeats)> fast_backward;
  bool accumulates = true;
  double fwd_rtol = 1e-5;
  double bwd_rtol = 2e-5;
};

void check_llama_layer(const LlamaLayerCase& c) {
  SCOPED_TRACE(c.name);
  Vecs32 in32;
  for (const auto& v : c.inputs) in32.push_back(to_f32(v));
  const std::vector<double> out_ref = c.ref_forward(c.inputs);
  EXPECT_TRUE(all_close(c.name + " forward", c.fast_forward(in32), out_ref, c.fwd_rtol));

  const std::vector<double> g = uniform(out_ref.size(), 99);  // d(loss)/d(out)
  const Vecs dref = c.ref_backward(c.inputs, g);
  const Vecs32 d32 = c.fast_backward(in32, to_f32(g), 1);
  ASSERT_EQ(dref.size(), c.inputs.size());
  ASSERT_EQ(d32.size(), c.inputs.size());
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    const std::string what = c.name + " d(input " + std::to_string(i) + ")";
    const std::vector<size_t> idx = spread(c.inputs[i].size(), 160);
    const auto loss = [&](const std::vector<double>& x) {
      Vecs in = c.inputs;
      in[i] = x;
      return dot(c.ref_forward(in), g);
    };
    const std::vector<double> fd = finite_difference(loss, c.inputs[i], idx);
    EXPECT_TRUE(
        all_close(what + " reference vs finite differences", pick(dref[i], idx), fd, 1e-6, 1e-9));
    EXPECT_TRUE(all_close(what + " f32 vs reference", d32[i], dref[i], c.bwd_rtol, 1e-7));
    if (!c.accumulates) continue;
    const Vecs32 d32x2 = c.fast_backward(in32, to_f32(g), 2);
    std::vector<double> twice(d32[i].size());
    for (size_t k = 0; k < twice.size(); ++k) twice[k] = 2.0 * d32[i][k];
    EXPECT_TRUE(all_close(what + " accumulates", d32x2[i], twice, 1e-6, 1e-9));
  }
}

bool same_bits(const std::vector<bf16>& a, const std::vector<bf16>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(bf16)) == 0;
}

std::vector<bf16> rounded(const std::vector<float>& v) {
  std::vector<bf16> r(v.size());
  to_bf16(v.data(), r.data(), v.size());
  return r;
}

// ---------------------------------------------------------------------------------------------
// RMSNorm

constexpr float kEps = 1e-5f;

// C = 37: two full lanes of 16 plus a tail. Row 2 is large (rstd small), row 4 tiny (eps matters).
TEST(RmsNorm, MatchesReferenceAndFiniteDifferences) {
  const int N = 7, C = 37;
  std::vector<double> x = uniform(N * C, 31, -2.0, 2.0);
  for (int i = 0; i < C; ++i) {
    x[2 * C + i] *= 40.0;
    x[4 * C + i] *= 1e-3;
  }
  LlamaLayerCase c;
  c.name = "rmsnorm";
  c.inputs = {x, uniform(C, 32, 0.5, 1.5)};
  c.ref_forward = [&](const Vecs& in) {
    std::vector<double> out(N * C), rstd(N);
    ref_rmsnorm_forward(out.data(), rstd.data(), in[0].data(), in[1].data(), N, C, kEps);
    return out;
  };
  c.fast_forward = [&](const Vecs32& in) {
    std::vector<float> out(N * C), rstd(N);
    rmsnorm_forward(out.data(), rstd.data(), in[0].data(), in[1].data(), N, C, kEps);
    return out;
  };
  c.ref_backward = [&](const Vecs& in, const std::vector<double>& g) {
    std::vector<double> out(N * C), rstd(N);
    ref_rmsnorm_forward(out.data(), rstd.data(), in[0].data(), in[1].data(), N, C, kEps);
    Vecs d = {std::vector<double>(N * C), std::vector<double>(C)};
    ref_rmsnorm_backward(d[0].data(), d[1].data(), g.data(), in[0].data(), in[1].data(),
                         rstd.data(), N, C);
    return d;
  };
  c.fast_backward = [&](const Vecs32& in, const std::vector<float>& g, int repeats) {
    std::vector<float> out(N * C), rstd(N);
    rmsnorm_forward(out.data(), rstd.data(), in[0].data(), in[1].data(), N, C, kEps);
    Vecs32 d = {std::vector<float>(N * C), std::vector<float>(C)};
    for (int r = 0; r < repeats; ++r)
      rmsnorm_backward(d[0].data(), d[1].data(), g.data(), in[0].data(), in[1].data(), rstd.data(),
                       N, C);
    return d;
  };
  check_llama_layer(c);
}

TEST(RmsNorm, SavesRstd) {
  const int N = 5, C = 19;
  const std::vector<double> x = uniform(N * C, 33, -3.0, 3.0), w = uniform(C, 34);
  std::vector<double> out(N * C), rstd(N);
  ref_rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, kEps);
  std::vector<float> out32(N * C), rstd32(N);
  rmsnorm_forward(out32.data(), rstd32.data(), to_f32(x).data(), to_f32(w).data(), N, C, kEps);
  EXPECT_TRUE(all_close("rmsnorm rstd", rstd32, rstd, 1e-6));
}

TEST(RmsNorm, Bf16OutputIsRoundedF32) {
  const int N = 9, C = 1100;  // a row longer than write_output's 1024-float tile
  const std::vector<float> x = to_f32(uniform(N * C, 35, -2.0, 2.0)), w = to_f32(uniform(C, 36));
  std::vector<float> out(N * C), rstd(N), rstd_b(N);
  std::vector<bf16> out_b(N * C);
  rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, C, kEps);
  rmsnorm_forward(out_b.data(), rstd_b.data(), x.data(), w.data(), N, C, kEps);
  EXPECT_TRUE(same_bits(out_b, rounded(out)));
  EXPECT_EQ(rstd_b, rstd);
}

// ---------------------------------------------------------------------------------------------
// RoPE

// A fused qkv buffer of rows [q (NH*HS) | k (NH*HS) | v (NH*HS)]; q and k rotated, v untouched
// (so the identity must hold there too). HS = 10: a head half of 5, no full vector. theta = 100 so
// that a few positions already turn the low frequencies by visible angles.
TEST(Rope, MatchesReferenceAndFiniteDifferencesOnFusedQkv) {
  const int B = 2, T = 5, NH = 3, HS = 10, pos0 = 3;
  const double theta = 100.0;
  const int64_t stride = 3 * NH * HS;
  const RopeTable table = rope_table(rope_inv_freq(HS, theta), 16);
  const std::vector<double> inv = ref_inv_freq(HS, theta);
  const auto ref = [&](std::vector<double> x, bool inverse) {
    for (int part = 0; part < 2; ++part)
      ref_rope(x.data() + part * NH * HS, inv, B, T, NH, HS, stride, pos0, inverse);
    return x;
  };
  const auto fast = [&](std::vector<float> x, bool inverse) {
    for (int part = 0; part < 2; ++part) {
      float* p = x.data() + part * NH * HS;
      if (inverse)
        rope_backward(p, table, B, T, NH, HS, stride, pos0);
      else
        rope_forward(p, table, B, T, NH, HS, stride, pos0);
    }
    return x;
  };
  LlamaLayerCase c;
  c.name = "rope";
  c.inputs = {uniform(B * T * stride, 41)};
  c.ref_forward = [&](const Vecs& in) { return ref(in[0], false); };
  c.fast_forward = [&](const Vecs32& in) { return fast(in[0], false); };
  // The rotation is linear and orthogonal: its gradient is the inverse rotation of g.
  c.ref_backward = [&](const Vecs&, const std::vector<double>& g) { return Vecs{ref(g, true)}; };
  c.fast_backward = [&](const Vecs32&, const std::vector<float>& g, int) {
    return Vecs32{fast(g, true)};
  };
  c.accumulates = false;  // in place
  check_llama_layer(c);

  // The v part (and nothing else) is left exactly as it was.
  const std::vector<float> x = to_f32(c.inputs[0]);
  const std::vector<float> y = fast(x, false);
  for (int64_t r = 0; r < B * T; ++r)
    for (int j = 2 * NH * HS; j < stride; ++j)
      ASSERT_EQ(y[r * stride + j], x[r * stride + j]) << "row " << r << " element " << j;
}

// Each pair is rotated, not scaled: its length is kept (to f32 rounding) at long positions too.
TEST(Rope, PreservesPairNorms) {
  const int B = 2, T = 7, NH = 4, HS = 64, pos0 = 8000;
  const RopeTable table = rope_table(rope_inv_freq(HS, 500000.0), pos0 + T);
  const std::vector<float> x = to_f32(uniform(B * T * NH * HS, 42, -3.0, 3.0));
  std::vector<float> y = x;
  rope_forward(y.data(), table, B, T, NH, HS, NH * HS, pos0);
  int moved = 0;
  for (int64_t head = 0; head < B * T * NH; ++head)
    for (int i = 0; i < HS / 2; ++i) {
      const int64_t a = head * HS + i, b = a + HS / 2;
      const double before = std::hypot(double{x[a]}, double{x[b]});
      const double after = std::hypot(double{y[a]}, double{y[b]});
      EXPECT_NEAR(after, before, 1e-6 * before + 1e-7) << "head " << head << " pair " << i;
      moved += y[a] != x[a] ? 1 : 0;
    }
  EXPECT_GT(moved, B * T * NH * HS / 4);  // it did rotate
}

// Rotating the rows of a sequence slice at their offset equals the same rows of the rotation of
// the whole sequence, bit for bit (a sequence split changes nothing).
TEST(Rope, OffsetRowsMatchLongerRotation) {
  const int B = 2, T_full = 12, NH = 2, HS = 16, p = 5, T = 4;
  const int64_t stride = NH * HS;
  const RopeTable table = rope_table(rope_inv_freq(HS, 10000.0), T_full);
  const std::vector<float> full_in = to_f32(uniform(B * T_full * stride, 43));
  std::vector<float> full = full_in;
  rope_forward(full.data(), table, B, T_full, NH, HS, stride, 0);
  std::vector<float> part(B * T * stride), want(B * T * stride);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int64_t j = 0; j < stride; ++j) {
        const int64_t src = (static_cast<int64_t>(b) * T_full + p + t) * stride + j;
        const int64_t dst = (static_cast<int64_t>(b) * T + t) * stride + j;
        part[dst] = full_in[src];
        want[dst] = full[src];
      }
  rope_forward(part.data(), table, B, T, NH, HS, stride, p);
  EXPECT_EQ(part, want);
}

// rope_backward is the inverse rotation: applied after rope_forward it gives the input back.
TEST(Rope, BackwardUndoesForward) {
  const int B = 3, T = 6, NH = 2, HS = 32, pos0 = 100;
  const int64_t stride = 3 * NH * HS;  // the k part of a fused qkv buffer
  const RopeTable table = rope_table(rope_inv_freq(HS, 10000.0), pos0 + T);
  const std::vector<float> x = to_f32(uniform(B * T * stride, 44));
  std::vector<float> y = x;
  rope_forward(y.data() + NH * HS, table, B, T, NH, HS, stride, pos0);
  EXPECT_FALSE(all_close("rotated", y, x, 0.0, 1e-3));
  rope_backward(y.data() + NH * HS, table, B, T, NH, HS, stride, pos0);
  EXPECT_TRUE(all_close("rope backward of forward", y, x, 0.0, 1e-6));
}

TEST(Rope, DefaultInvFreq) {
  const std::vector<float> f = rope_inv_freq(128, 10000.0);
  ASSERT_EQ(f.size(), 64u);
  const std::vector<double> want = ref_inv_freq(128, 10000.0);
  for (size_t i = 0; i < f.size(); ++i) EXPECT_NEAR(f[i], want[i], 1e-7 * want[i]) << i;
  EXPECT_EQ(f[0], 1.0f);
}

// Llama 3.2's scaling (factor 32, low 1, high 4, original 8192, theta 500000, HS 64) against the
// formula evaluated here in long double.
TEST(Rope, Llama3ScalingMatchesFormula) {
  const int HS = 64;
  const long double theta = 500000.0L, factor = 32.0L, low = 1.0L, high = 4.0L, orig = 8192.0L;
  RopeScaling s;
  s.type = RopeType::Llama3;
  s.factor = 32.0;
  s.low_freq_factor = 1.0;
  s.high_freq_factor = 4.0;
  s.original_max_position_embeddings = 8192;
  const std::vector<float> got = rope_inv_freq(HS, 500000.0, s);
  ASSERT_EQ(got.size(), static_cast<size_t>(HS / 2));
  const long double pi = std::numbers::pi_v<long double>;
  int kept = 0, divided = 0, smoothed = 0;
  for (int i = 0; i < HS / 2; ++i) {
    const long double f = std::pow(theta, -2.0L * i / HS);
    const long double wavelen = 2.0L * pi / f;
    long double want;
    if (wavelen < orig / high) {  // high frequency: kept
      want = f;
      ++kept;
    } else if (wavelen > orig / low) {  // low frequency: slowed by factor
      want = f / factor;
      ++divided;
    } else {
      const long double smooth = (orig / wavelen - low) / (high - low);
      want = (1.0L - smooth) * f / factor + smooth * f;
      EXPECT_GT(want, f / factor);
      EXPECT_LT(want, f);
      ++smoothed;
    }
    // f32 rounding of theta^(-2i/HS) and of the scaled value: a few ulp.
    EXPECT_NEAR(got[i], static_cast<double>(want), 4e-7 * static_cast<double>(want)) << "i " << i;
  }
  // wavelen = 2 pi 500000^(i/32) crosses 2048 after i = 14 and 8192 after i = 17.
  EXPECT_EQ(kept, 15);
  EXPECT_EQ(smoothed, 3);
  EXPECT_EQ(divided, 14);
  // The kept ones are the unscaled frequencies exactly.
  const std::vector<float> plain = rope_inv_freq(HS, 500000.0);
  for (int i = 0; i < kept; ++i) EXPECT_EQ(got[i], plain[i]) << "i " << i;
}

std::string user_error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const UserError& e) {
    return e.what();
  }
  return "(no UserError)";
}

TEST(RopeErrors, BadConfigIsUserError) {
  EXPECT_THAT(user_error_of([] { rope_inv_freq(63, 10000.0); }), HasSubstr("head size is 63"));
  EXPECT_THAT(user_error_of([] { rope_inv_freq(64, 0.0); }), HasSubstr("theta is 0"));
  RopeScaling s;
  s.type = RopeType::Llama3;
  s.factor = 0.5;
  EXPECT_THAT(user_error_of([&] { rope_inv_freq(64, 10000.0, s); }), HasSubstr("factor is 0.5"));
  s.factor = 8.0;
  s.high_freq_factor = 1.0;
  EXPECT_THAT(user_error_of([&] { rope_inv_freq(64, 10000.0, s); }),
              HasSubstr("high_freq_factor (1) must be greater than low_freq_factor (1)"));
  s.high_freq_factor = 4.0;
  s.original_max_position_embeddings = 0;
  EXPECT_THAT(user_error_of([&] { rope_inv_freq(64, 10000.0, s); }),
              HasSubstr("original_max_position_embeddings is 0"));
}

// A call past the table or with another head size is a caller's bug: an InternalError.
TEST(RopeErrors, CallOutsideTableIsInternalError) {
  const RopeTable table = rope_table(rope_inv_freq(8, 10000.0), 10);
  std::vector<float> x(2 * 4 * 8);
  EXPECT_THROW(rope_forward(x.data(), table, 2, 4, 1, 8, 8, 7), InternalError);
  EXPECT_THROW(rope_backward(x.data(), table, 2, 4, 1, 16, 16, 0), InternalError);
  EXPECT_THROW(rope_forward(x.data(), table, 2, 4, 2, 8, 8, 0), InternalError);  // stride < NH*HS
  EXPECT_NO_THROW(rope_forward(x.data(), table, 2, 4, 1, 8, 8, 6));
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

TEST(SwiGlu, MatchesReferenceAndFiniteDifferences) {
  const size_t n = 7 * 37;
  LlamaLayerCase c;
  c.name = "swiglu";
  c.inputs = {uniform(n, 51, -6.0, 6.0), uniform(n, 52, -2.0, 2.0)};
  c.ref_forward = [&](const Vecs& in) {
    std::vector<double> out(n);
    ref_swiglu_forward(out.data(), in[0].data(), in[1].data(), n);
    return out;
  };
  c.fast_forward = [&](const Vecs32& in) {
    std::vector<float> out(n);
    swiglu_forward(out.data(), in[0].data(), in[1].data(), static_cast<int64_t>(n));
    return out;
  };
  c.ref_backward = [&](const Vecs& in, const std::vector<double>& g) {
    Vecs d = {std::vector<double>(n), std::vector<double>(n)};
    ref_swiglu_backward(d[0].data(), d[1].data(), g.data(), in[0].data(), in[1].data(), n);
    return d;
  };
  c.fast_backward = [&](const Vecs32& in, const std::vector<float>& g, int repeats) {
    Vecs32 d = {std::vector<float>(n), std::vector<float>(n)};
    for (int r = 0; r < repeats; ++r)
      swiglu_backward(d[0].data(), d[1].data(), g.data(), in[0].data(), in[1].data(),
                      static_cast<int64_t>(n));
    return d;
  };
  check_llama_layer(c);
}

// Gates far out on either side: silu(g) -> g and -> 0, finite, with finite gradients.
TEST(SwiGlu, LargeGatesStayFinite) {
  const std::vector<double> g = {-1000.0, -100.0, -88.5, -30.0, 30.0, 88.5, 100.0, 1000.0};
  const std::vector<double> u(g.size(), 1.5), d(g.size(), 1.0);
  std::vector<double> out(g.size()), dg(g.size()), du(g.size());
  ref_swiglu_forward(out.data(), g.data(), u.data(), g.size());
  ref_swiglu_backward(dg.data(), du.data(), d.data(), g.data(), u.data(), g.size());
  const int64_t n = static_cast<int64_t>(g.size());
  std::vector<float> out32(g.size()), dg32(g.size()), du32(g.size());
  swiglu_forward(out32.data(), to_f32(g).data(), to_f32(u).data(), n);
  swiglu_backward(dg32.data(), du32.data(), to_f32(d).data(), to_f32(g).data(), to_f32(u).data(),
                  n);
  // Per element (the largest gate would set all_close's scale): relative, or tiny near zero.
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_NEAR(out32[i], out[i], 1e-6 * std::fabs(out[i]) + 1e-30) << "gate " << g[i];
    EXPECT_NEAR(dg32[i], dg[i], 1e-6 * std::fabs(dg[i]) + 1e-30) << "gate " << g[i];
    EXPECT_NEAR(du32[i], du[i], 1e-6 * std::fabs(du[i]) + 1e-30) << "gate " << g[i];
  }
}

TEST(SwiGlu, Bf16OutputIsRoundedF32) {
  const int64_t n = 5000;  // several 1024-float tiles of write_output, and a partial one
  const std::vector<float> g = to_f32(uniform(n, 53, -5.0, 5.0)), u = to_f32(uniform(n, 54));
  std::vector<float> out(n);
  std::vector<bf16> out_b(n);
  swiglu_forward(out.data(), g.data(), u.data(), n);
  swiglu_forward(out_b.data(), g.data(), u.data(), n);
  EXPECT_TRUE(same_bits(out_b, rounded(out)));
}

// ---------------------------------------------------------------------------------------------
// Grouped-query attention

// qkv (N, (NH + 2 KVH) HS) rewritten with each key and value head repeated for the NH / KVH
// consecutive query heads that share it: (N, 3 NH HS), multi-head attention's input computing the
// same attention.
std::vector<float> gqa_repeat_kv(const std::vector<float>& qkv, int N, int NH, int KVH, int HS) {
  const int group = NH / KVH, in_w = (NH + 2 * KVH) * HS, out_w = 3 * NH * HS;
  std::vector<float> out(static_cast<size_t>(N) * out_w);
  for (int r = 0; r < N; ++r) {
    const float* in = qkv.data() + static_cast<int64_t>(r) * in_w;
    float* o = out.data() + static_cast<int64_t>(r) * out_w;
    std::copy(in, in + NH * HS, o);  // q
    for (int h = 0; h < NH; ++h) {
      const int g = h / group;
      std::copy(in + (NH + g) * HS, in + (NH + g + 1) * HS, o + (NH + h) * HS);  // k
      std::copy(in + (NH + KVH + g) * HS, in + (NH + KVH + g + 1) * HS,
                o + (2 * NH + h) * HS);  // v
    }
  }
  return out;
}

// The gradient of gqa_repeat_kv: d (N, 3 NH HS) of the repeated layout back to (N, (NH + 2 KVH)
// HS), the repeated key and value heads' gradients summed over each group (in double).
std::vector<double> gqa_sum_groups(const std::vector<float>& d, int N, int NH, int KVH, int HS) {
  const int group = NH / KVH, in_w = 3 * NH * HS, out_w = (NH + 2 * KVH) * HS;
  std::vector<double> out(static_cast<size_t>(N) * out_w, 0.0);
  for (int r = 0; r < N; ++r) {
    const float* g = d.data() + static_cast<int64_t>(r) * in_w;
    double* o = out.data() + static_cast<int64_t>(r) * out_w;
    for (int j = 0; j < NH * HS; ++j) o[j] = g[j];  // dq
    for (int h = 0; h < NH; ++h)
      for (int e = 0; e < HS; ++e) {
        o[(NH + h / group) * HS + e] += g[(NH + h) * HS + e];            // dk
        o[(NH + KVH + h / group) * HS + e] += g[(2 * NH + h) * HS + e];  // dv
      }
  }
  return out;
}

// attention_forward/backward with KVH key/value heads equal multi-head attention (KVH = NH) on a
// qkv whose key/value heads are repeated for each group: the same output and softmax, and dq, dk,
// dv the multi-head ones with each group's dk and dv summed. With dropout too: masks are drawn by
// query head. T = 37: two causal chunks of rows, the second partial. KVH = NH is the identity.
TEST(GroupedQueryAttention, EqualsMultiHeadAttentionOnRepeatedKeyValueHeads) {
  const int B = 2, T = 37, NH = 6, HS = 8, N = B * T;
  for (float p : {0.0f, 0.15f})
    for (int KVH : {1, 2, 3, 6}) {
      SCOPED_TRACE("KVH " + std::to_string(KVH) + " dropout " + std::to_string(p));
      AttentionDropout drop;
      drop.p = p;
      drop.key = 4321;
      const int W = (NH + 2 * KVH) * HS;
      const std::vector<float> qkv = to_f32(uniform(static_cast<size_t>(N) * W, 61, -2.0, 2.0));
      const std::vector<float> rep = gqa_repeat_kv(qkv, N, NH, KVH, HS);
      std::vector<float> scratch(static_cast<size_t>(attention_scratch_floats(T)));
      std::vector<float> out(static_cast<size_t>(N) * NH * HS),
          att(static_cast<size_t>(B) * NH * T * T);
      std::vector<float> out_mh(out.size()), att_mh(att.size());
      attention_forward(out.data(), att.data(), scratch.data(), qkv.data(), B, T, NH, KVH, HS,
                        drop);
      attention_forward(out_mh.data(), att_mh.data(), scratch.data(), rep.data(), B, T, NH, NH, HS,
                        drop);
      EXPECT_TRUE(all_close("softmax", att, att_mh, 1e-6));
      EXPECT_TRUE(all_close("out", out, out_mh, 1e-6));

      const std::vector<float> g = to_f32(uniform(out.size(), 62));
      std::vector<float> dqkv(qkv.size()), drep(rep.size());
      attention_backward(dqkv.data(), scratch.data(), g.data(), qkv.data(), att.data(), B, T, NH,
                         KVH, HS, drop);
      attention_backward(drep.data(), scratch.data(), g.data(), rep.data(), att_mh.data(), B, T, NH,
                         NH, HS, drop);
      // Per part, each against its own scale (dk and dv are larger than dq by the group size).
      const std::vector<double> want = gqa_sum_groups(drep, N, NH, KVH, HS);
      const auto part = [&](const auto& v, int first, int width) {
        std::vector<double> r;
        for (int n = 0; n < N; ++n)
          for (int j = first; j < first + width; ++j)
            r.push_back(v[static_cast<size_t>(n) * W + j]);
        return r;
      };
      EXPECT_TRUE(all_close("dq", part(dqkv, 0, NH * HS), part(want, 0, NH * HS), 1e-5));
      EXPECT_TRUE(
          all_close("dk", part(dqkv, NH * HS, KVH * HS), part(want, NH * HS, KVH * HS), 1e-5));
      EXPECT_TRUE(all_close("dv", part(dqkv, (NH + KVH) * HS, KVH * HS),
                            part(want, (NH + KVH) * HS, KVH * HS), 1e-5));
    }
}

// A query-head count the key/value heads do not divide is a caller's bug.
TEST(GroupedQueryAttention, KvHeadsMustDivideQueryHeads) {
  const int B = 1, T = 3, NH = 4, KVH = 3, HS = 2;
  std::vector<float> qkv(static_cast<size_t>(B) * T * (NH + 2 * KVH) * HS), out(B * T * NH * HS),
      att(B * NH * T * T), scratch(static_cast<size_t>(attention_scratch_floats(T)));
  EXPECT_THROW(
      attention_forward(out.data(), att.data(), scratch.data(), qkv.data(), B, T, NH, KVH, HS, {}),
      InternalError);
  EXPECT_THROW(attention_backward(qkv.data(), scratch.data(), out.data(), qkv.data(), att.data(), B,
                                  T, NH, KVH, HS, {}),
               InternalError);
}

}  // namespace
}  // namespace tandem::nn
