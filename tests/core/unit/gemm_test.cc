// The GEMM entry point against a naive product in double: every transpose, uneven sizes, padded
// leading dimensions, alpha and beta, f32 and bf16 inputs, through each library.
//
// Tolerance: every library accumulates in f32, in its own order. Summing k terms in any order in
// f32 errs by at most about k * 2^-24 times the sum of their magnitudes, and scaling by alpha and
// adding beta * C adds two more roundings; the check allows twice that, (k + 2) * 2^-23 *
// (|alpha| sum |a b| + |beta c|). bf16 inputs are compared with the product of the bf16-rounded
// values (a product of two bf16 values is exact in f32), so the same bound holds: what is left is
// only the order of the f32 additions. A wrong element (a transpose, a stride, a missed beta) is
// off by far more.
#include "tandem/core/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tandem/core/bf16.h"
#include "tandem/core/error.h"
#include "tandem/core/parallel.h"

namespace tandem {
namespace {

struct Shape3 {
  int m, n, k;
};

constexpr Shape3 kShapes[] = {{1, 1, 1},    {7, 1, 33},   {1, 130, 7},  {33, 7, 130},
                              {130, 33, 7}, {64, 64, 64}, {7, 130, 33}, {130, 130, 130}};
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// A stored rows x cols matrix with leading dimension ld; the padding holds NaN, which a library
// reading past a row would carry into the result.
struct Stored {
  int rows, cols, ld;
  std::vector<float> values;  // f32, already bf16-rounded for a bf16 operand
  std::vector<bf16> halves;
  float at(int r, int c) const { return values[static_cast<size_t>(r) * ld + c]; }
};

Stored random_matrix(int rows, int cols, int pad, DType type, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Stored s{rows, cols, cols + pad, {}, {}};
  s.values.assign(static_cast<size_t>(rows) * s.ld, kNaN);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) s.values[static_cast<size_t>(r) * s.ld + c] = dist(rng);
  if (type == DType::BF16) {
    s.halves.resize(s.values.size());
    to_bf16(s.values.data(), s.halves.data(), s.values.size());
    to_f32(s.halves.data(), s.values.data(), s.values.size());
  }
  return s;
}

struct Case {
  DType type;
  bool trans_a, trans_b;
  Shape3 shape;
  int pad;  // extra elements at the end of every stored row, of A, B and C
  float alpha, beta;
  GemmLibrary library;
};

std::string name(const Case& c) {
  static constexpr const char* kLibraries[] = {"auto", "openblas", "onednn"};
  return fmt::format("{} {}{} m={} n={} k={} pad={} alpha={} beta={} library={}",
                     dtype_name(c.type), c.trans_a ? 'T' : 'N', c.trans_b ? 'T' : 'N', c.shape.m,
                     c.shape.n, c.shape.k, c.pad, c.alpha, c.beta,
                     kLibraries[static_cast<int>(c.library)]);
}

// Runs one case and returns "" or what went wrong (the worst element and the count off).
std::string run_case(const Case& c, std::mt19937& rng) {
  const auto [m, n, k] = c.shape;
  const Stored a =
      c.trans_a ? random_matrix(k, m, c.pad, c.type, rng) : random_matrix(m, k, c.pad, c.type, rng);
  const Stored b =
      c.trans_b ? random_matrix(n, k, c.pad, c.type, rng) : random_matrix(k, n, c.pad, c.type, rng);
  Stored out = random_matrix(m, n, c.pad, DType::F32, rng);
  // beta == 0: C's old values must not be read, so they are NaN.
  if (c.beta == 0.0f)
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) out.values[static_cast<size_t>(i) * out.ld + j] = kNaN;
  const Stored before = out;
  const bool half = c.type == DType::BF16;
  const void* pa = half ? static_cast<const void*>(a.halves.data()) : a.values.data();
  const void* pb = half ? static_cast<const void*>(b.halves.data()) : b.values.data();
  GemmCall call{c.type, c.trans_a, c.trans_b, m, n, k, c.alpha, c.beta};
  call.a = pa, call.lda = a.ld, call.b = pb, call.ldb = b.ld;
  call.c = out.values.data(), call.ldc = out.ld, call.library = c.library;
  gemm(call);
  int wrong = 0;
  std::string worst;
  double worst_ratio = 0;
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      double dot = 0, magnitude = 0;
      for (int p = 0; p < k; ++p) {
        const double x = c.trans_a ? a.at(p, i) : a.at(i, p);
        const double y = c.trans_b ? b.at(j, p) : b.at(p, j);
        dot += x * y;
        magnitude += std::abs(x * y);
      }
      const double old = c.beta == 0.0f ? 0.0 : before.at(i, j);
      const double want = c.alpha * dot + c.beta * old;
      const double tol =
          (k + 2) * std::ldexp(1.0, -23) * (std::abs(c.alpha) * magnitude + std::abs(c.beta * old));
      const double got = out.at(i, j);
      const double ratio = std::isfinite(got) ? std::abs(got - want) / tol : 1e300;
      if (ratio > 1) ++wrong;
      if (ratio > worst_ratio) {
        worst_ratio = ratio;
        worst = fmt::format("C[{},{}] = {} against {} (tolerance {:.3g})", i, j, got, want, tol);
      }
    }
    // The padding of C's rows is left alone.
    for (int j = n; j < out.ld; ++j)
      if (std::isnan(out.at(i, j)) != std::isnan(before.at(i, j)) ||
          (!std::isnan(out.at(i, j)) && out.at(i, j) != before.at(i, j)))
        return fmt::format("{}: C[{},{}] in the padding was written", name(c), i, j);
  }
  if (wrong == 0) return "";
  return fmt::format("{}: {} of {} elements off; worst {}", name(c), wrong, m * n, worst);
}

// Every combination for one element type and library.
void check_all(DType type, GemmLibrary library) {
  std::mt19937 rng(
      static_cast<unsigned>(26 + static_cast<int>(type) * 3 + static_cast<int>(library)));
  int cases = 0;
  for (const Shape3& shape : kShapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (int pad : {0, 3})
          for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{-0.75f, 1.5f}}) {
            const Case c{type, ta, tb, shape, pad, alpha, beta, library};
            const std::string failure = run_case(c, rng);
            ASSERT_EQ(failure, "");
            ++cases;
          }
  EXPECT_EQ(cases, 8 * 4 * 2 * 2);
}

// oneDNN named outright: a machine without it (or without its bf16 kernels) says why and skips.
bool onednn_runs(DType type, std::string& why) {
  float c = 0;
  const bf16 one_bf16{0x3f80};
  const float one = 1.0f;
  const void* x = type == DType::BF16 ? static_cast<const void*>(&one_bf16) : &one;
  try {
    gemm(GemmCall{type, false, false, 1, 1, 1, 1.0f, 0.0f, x, 1, x, 1, &c, 1, GemmLibrary::OneDnn});
  } catch (const UserError& e) {
    why = e.what();
    return false;
  }
  return c == 1.0f;
}

// Above 2^24 multiply-adds oneDNN runs on every thread: fewer combinations, the reference being
// slow at this size.
TEST(Gemm, LargeProductsOnEveryThread) {
  std::mt19937 rng(2026);
  for (DType type : {DType::F32, DType::BF16})
    for (GemmLibrary library : {GemmLibrary::Auto, GemmLibrary::OneDnn})
      for (bool ta : {false, true})
        for (bool tb : {false, true}) {
          const Case c{type, ta, tb, {513, 131, 257}, 3, -0.75f, 1.5f, library};
          std::string why;
          if (library == GemmLibrary::OneDnn && !onednn_runs(type, why)) continue;
          ASSERT_EQ(run_case(c, rng), "");
        }
}

// Inside a parallel region every part runs its own GEMMs at once (one thread each): the same
// cached primitive from several threads, each with its own stream and scratch memory.
TEST(Gemm, PartsOfAParallelRegionMultiplyAtOnce) {
  // Above 2^24 multiply-adds: on every thread outside the region, on one inside.
  const int m = 513, n = 131, k = 257, parts = 4;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> a(m * k), b(k * n);
  for (float& x : a) x = dist(rng);
  for (float& x : b) x = dist(rng);
  std::vector<bf16> a16(a.size()), b16(b.size());
  to_bf16(a.data(), a16.data(), a.size());
  to_bf16(b.data(), b16.data(), b.size());
  std::vector<float> want(m * n);
  gemm(false, false, m, n, k, 1.0f, a16.data(), k, b16.data(), n, 0.0f, want.data(), n);
  std::vector<std::vector<float>> got(parts, std::vector<float>(m * n));
  parallel_parts(parts, [&](int part) {
    for (int rep = 0; rep < 2; ++rep)
      gemm(false, false, m, n, k, 1.0f, a16.data(), k, b16.data(), n, 0.0f, got[part].data(), n);
  });
  // One thread or two may split the sums differently: close, not necessarily bitwise.
  for (int part = 0; part < parts; ++part)
    for (int i = 0; i < m * n; ++i)
      ASSERT_NEAR(got[part][i], want[i], 1e-4f * (1.0f + std::abs(want[i])))
          << "part " << part << " element " << i;
}

TEST(Gemm, F32Auto) { check_all(DType::F32, GemmLibrary::Auto); }
TEST(Gemm, F32OpenBlas) { check_all(DType::F32, GemmLibrary::OpenBlas); }
TEST(Gemm, F32OneDnn) {
  std::string why;
  if (!onednn_runs(DType::F32, why)) GTEST_SKIP() << why;
  check_all(DType::F32, GemmLibrary::OneDnn);
}

// Auto is oneDNN where bf16 is native, the widening path elsewhere (and under TANDEM_BF16=emulate).
TEST(Gemm, Bf16Auto) { check_all(DType::BF16, GemmLibrary::Auto); }
// The path of every CPU without native bf16, run on every CPU.
TEST(Gemm, Bf16WidenedForOpenBlas) { check_all(DType::BF16, GemmLibrary::OpenBlas); }
TEST(Gemm, Bf16OneDnn) {
  std::string why;
  if (!onednn_runs(DType::BF16, why)) GTEST_SKIP() << why;
  check_all(DType::BF16, GemmLibrary::OneDnn);
}

TEST(Gemm, EmptyProductScalesC) {
  for (GemmLibrary library : {GemmLibrary::Auto, GemmLibrary::OpenBlas, GemmLibrary::OneDnn}) {
    std::vector<float> c = {1.0f, 2.0f, kNaN, 4.0f};
    gemm(GemmCall{DType::F32, false, false, 2, 2, 0, 1.0f, 0.5f, nullptr, 1, nullptr, 2, c.data(),
                  2, library});
    EXPECT_EQ(c[0], 0.5f);
    EXPECT_EQ(c[1], 1.0f);
    EXPECT_TRUE(std::isnan(c[2]));
    gemm(GemmCall{DType::F32, false, false, 2, 2, 0, 1.0f, 0.0f, nullptr, 1, nullptr, 2, c.data(),
                  2, library});
    EXPECT_EQ(c, std::vector<float>(4, 0.0f));
  }
}

TEST(Gemm, MalformedCallIsAnInternalError) {
  std::vector<float> x(16, 1.0f);
  // lda 3 is shorter than A's row of k = 4.
  EXPECT_THROW(gemm(false, false, 2, 2, 4, 1.0f, x.data(), 3, x.data(), 2, 0.0f, x.data(), 2),
               InternalError);
  EXPECT_THROW(gemm(GemmCall{DType::F16, false, false, 1, 1, 1, 1.0f, 0.0f, x.data(), 1, x.data(),
                             1, x.data(), 1}),
               InternalError);
}

TEST(Gemm, DescribesWhatRunsWhere) {
  const std::string line = gemm_describe();
  EXPECT_NE(line.find("GEMM f32: OpenBLAS"), std::string::npos) << line;
  const bool onednn = gemm_library(DType::BF16) == "oneDNN";
  EXPECT_NE(line.find(onednn ? "GEMM bf16: oneDNN" : "GEMM bf16: widened to f32"),
            std::string::npos)
      << line;
  if (onednn) {
    EXPECT_TRUE(bf16_native());
  }
}

// oneDNN's OpenMP threads sleep as soon as they are idle (OMP_WAIT_POLICY=PASSIVE, set before the
// runtime starts), unless the user chose a policy: they must not spin on the cores OpenBLAS and
// tandem's helpers use next.
TEST(Gemm, OpenMpThreadsDoNotSpin) {
  const std::string line = gemm_describe();
  if (line.find("OpenMP runtime") == std::string::npos)
    GTEST_SKIP() << "bf16 GEMMs do not run on oneDNN's OpenMP runtime here: " << line;
  if (line.find("libgomp was loaded before") != std::string::npos)
    GTEST_SKIP() << "the program loaded OpenMP itself: " << line;
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  ASSERT_NE(policy, nullptr) << line;
  if (line.find("(set by tandem)") != std::string::npos) {
    EXPECT_STREQ(policy, "PASSIVE");
  } else {
    EXPECT_NE(line.find(fmt::format("OMP_WAIT_POLICY={} (the user's)", policy)), std::string::npos)
        << line;
  }
}

}  // namespace
}  // namespace tandem
