// GEMM throughput through tandem's GEMM entry point. First SGEMM through the BLAS door at
// 1024-4096 (run with OPENBLAS_CORETYPE=Prescott to see the generic kernels the library picks by
// itself); then, at 2048^3 and at a GPT layer's shapes (1024 tokens, d_model 1024), each library
// side by side: OpenBLAS f32, oneDNN f32, oneDNN bf16 and bf16 widened to f32 for OpenBLAS (the
// path of CPUs without AVX512_BF16), as GFLOP/s and as a ratio to OpenBLAS f32.
//   build/release/bench/bench_gemm [--threads N] [--skip-sweep]
#include "tandem/core/gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tandem/core/bf16.h"
#include "tandem/core/blas.h"
#include "tandem/core/error.h"
#include "tandem/core/tensor.h"

namespace {

using namespace tandem;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs fn `reps` times after one warm-up; returns the median and the spread in milliseconds.
template <typename Fn>
std::pair<double, double> time_ms(int reps, Fn&& fn) {
  fn();
  std::vector<double> ms;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  const auto [lo, hi] = std::minmax_element(ms.begin(), ms.end());
  return {median(ms), *hi - *lo};
}

// The CPU's model name and its bf16-related flags, from /proc/cpuinfo.
std::string cpu_line() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "unknown CPU", flags;
  while (std::getline(in, line)) {
    if (model == "unknown CPU" && line.rfind("model name", 0) == 0)
      model = line.substr(line.find(':') + 2);
    if (flags.empty() && line.rfind("flags", 0) == 0) {
      for (const char* f : {"avx2", "avx512f", "avx512_bf16", "amx_bf16"})
        if ((line + " ").find(std::string(" ") + f + " ") != std::string::npos)
          flags += std::string(flags.empty() ? "" : " ") + f;
    }
  }
  return fmt::format("CPU: {} (flags: {})", model,
                     flags.empty() ? "no avx2, avx512f, avx512_bf16, amx_bf16" : flags);
}

// SGEMM through the BLAS door at square sizes: the figures earlier records compare with.
int sweep() {
  fmt::print("{:>6} {:>10} {:>10} {:>10}\n", "n", "median ms", "GFLOP/s", "spread %");
  for (int n : {1024, 2048, 3072, 4096}) {
    Tensor a = Tensor::empty(DType::F32, {n, n}), b = Tensor::empty(DType::F32, {n, n}),
           c = Tensor::zeros(DType::F32, {n, n});
    float* pa = a.data_as<float>();
    float* pb = b.data_as<float>();
    float* pc = c.data_as<float>();
    for (int64_t i = 0; i < a.numel(); ++i) {
      pa[i] = static_cast<float>(i % 7) * 0.25f;
      pb[i] = static_cast<float>(i % 5) * 0.5f;
    }
    // Check once before timing: row 0 of C against a dot product in double.
    blas::sgemm(false, false, n, n, n, 1.0f, pa, n, pb, n, 0.0f, pc, n);
    for (int j = 0; j < n; j += 97) {
      double want = 0;
      for (int p = 0; p < n; ++p) want += double(pa[p]) * pb[int64_t{p} * n + j];
      if (std::abs(want - pc[j]) > 1e-4 * std::abs(want) + 1e-3) {
        fmt::print(stderr, "GEMM check failed at n={} j={}: {} vs {}\n", n, j, pc[j], want);
        return 1;
      }
    }
    const auto [med, spread] = time_ms(n <= 2048 ? 9 : 5, [&] {
      blas::sgemm(false, false, n, n, n, 1.0f, pa, n, pb, n, 0.0f, pc, n);
    });
    fmt::print("{:>6} {:>10.2f} {:>10.1f} {:>10.1f}\n", n, med, 2.0 * n * n * double(n) / med / 1e6,
               spread / med * 100);
  }
  return 0;
}

struct Shape {
  const char* name;
  bool trans_a, trans_b;
  int m, n, k;
};

struct Variant {
  const char* name;
  DType type;
  GemmLibrary library;
};

// Every element of a few rows against a double dot product of the very inputs the call read.
bool check(const GemmCall& g, const std::vector<float>& a, const std::vector<float>& b,
           const std::vector<float>& c) {
  for (int i : {0, g.m / 2, g.m - 1})
    for (int j = 0; j < g.n; j += 13) {
      double dot = 0, magnitude = 0;
      for (int p = 0; p < g.k; ++p) {
        const double x = g.trans_a ? a[size_t(p) * g.lda + i] : a[size_t(i) * g.lda + p];
        const double y = g.trans_b ? b[size_t(j) * g.ldb + p] : b[size_t(p) * g.ldb + j];
        dot += x * y;
        magnitude += std::abs(x * y);
      }
      const double got = c[size_t(i) * g.ldc + j];
      if (!(std::abs(got - dot) <= (g.k + 2) * std::ldexp(1.0, -23) * magnitude)) {
        fmt::print(stderr, "GEMM check failed at C[{},{}]: {} vs {}\n", i, j, got, dot);
        return false;
      }
    }
  return true;
}

int libraries() {
  // A GPT layer's products at 1024 tokens, d_model 1024, as nn/linear calls them (beta 1: the
  // bias or the accumulated gradient is in C already). A timed sample repeats a small call until
  // it does about 0.2 GFLOP.
  const Shape shapes[] = {
      {"square 2048^3", false, false, 2048, 2048, 2048},
      {"fwd qkv  x W", false, false, 1024, 3072, 1024},
      {"fwd fc   x W", false, false, 1024, 4096, 1024},
      {"fwd proj x W", false, false, 1024, 1024, 4096},
      {"bwd dx = dy W^T", false, true, 1024, 1024, 4096},
      {"bwd dW = x^T dy", true, false, 1024, 4096, 1024},
      // One head of attention at seq 128, head size 64 (the race models): per-call costs show.
      {"attn q k^T", false, true, 128, 128, 64},
      {"attn p v", false, false, 128, 64, 128},
  };
  const Variant variants[] = {{"OpenBLAS f32", DType::F32, GemmLibrary::OpenBlas},
                              {"oneDNN f32", DType::F32, GemmLibrary::OneDnn},
                              {"oneDNN bf16", DType::BF16, GemmLibrary::OneDnn},
                              {"widened bf16", DType::BF16, GemmLibrary::OpenBlas}};
  fmt::print("\n{:<16} {:>5} {:>5} {:>5}", "shape", "m", "n", "k");
  for (const Variant& v : variants) fmt::print(" {:>14}", v.name);
  fmt::print("   (GFLOP/s, x OpenBLAS f32; spread %)\n");
  std::mt19937 rng(26);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (const Shape& s : shapes) {
    const int lda = s.trans_a ? s.m : s.k, ldb = s.trans_b ? s.k : s.n;
    std::vector<float> a(size_t(s.m) * s.k), b(size_t(s.k) * s.n), c(size_t(s.m) * s.n);
    for (float& x : a) x = dist(rng);
    for (float& x : b) x = dist(rng);
    std::vector<bf16> a16(a.size()), b16(b.size());
    to_bf16(a.data(), a16.data(), a.size());
    to_bf16(b.data(), b16.data(), b.size());
    std::vector<float> a_rounded(a.size()), b_rounded(b.size());
    to_f32(a16.data(), a_rounded.data(), a.size());
    to_f32(b16.data(), b_rounded.data(), b.size());
    fmt::print("{:<16} {:>5} {:>5} {:>5}", s.name, s.m, s.n, s.k);
    double baseline = 0;
    std::string kernels;
    for (const Variant& v : variants) {
      const bool half = v.type == DType::BF16;
      const void* pa = half ? static_cast<const void*>(a16.data()) : a.data();
      const void* pb = half ? static_cast<const void*>(b16.data()) : b.data();
      GemmCall g{v.type, s.trans_a, s.trans_b, s.m, s.n, s.k};
      g.a = pa, g.lda = lda, g.b = pb, g.ldb = ldb, g.c = c.data(), g.ldc = s.n;
      g.library = v.library;
      try {
        std::fill(c.begin(), c.end(), 0.0f);
        gemm(g);
      } catch (const UserError& e) {
        fmt::print(" {:>14}", "n/a");
        kernels += fmt::format(" | {}: {}", v.name, e.what());
        continue;
      }
      if (!check(g, half ? a_rounded : a, half ? b_rounded : b, c)) return 1;
      g.beta = 1.0f;
      const double flop = 2.0 * s.m * double(s.n) * s.k;
      const int calls = std::max(1, static_cast<int>(2e8 / flop));
      const auto [med, spread] = time_ms(7, [&] {
        for (int i = 0; i < calls; ++i) gemm(g);
      });
      const double gflops = flop * calls / med / 1e6;
      if (baseline == 0) baseline = gflops;
      fmt::print(" {:>6.0f} {:>4.2f}x{:>2.0f}", gflops, gflops / baseline, spread / med * 100);
      kernels += fmt::format(" | {}", gemm_implementation(g));
    }
    fmt::print("\n");
    if (!kernels.empty()) fmt::print("  kernels:{}\n", kernels);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  bool skip_sweep = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--threads") == 0 && i + 1 < argc) threads = std::atoi(argv[++i]);
    if (std::strcmp(argv[i], "--skip-sweep") == 0) skip_sweep = true;
  }
  if (threads > 0) blas::set_num_threads(threads);
  fmt::print("{}\n{}\n", cpu_line(), bf16_describe());
  fmt::print("BLAS {} kernels={} threads={}\n", blas::library_path(), blas::kernel_name(),
             blas::num_threads());
  fmt::print("{}\n", gemm_describe());
  if (!skip_sweep && sweep() != 0) return 1;
  return libraries();
}
