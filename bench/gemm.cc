// GEMM throughput through tandem's BLAS door at 1024-4096. The peak is the best of the sizes;
// run with OPENBLAS_CORETYPE=Prescott to see the generic kernels the library picks by itself.
//   build/release/bench/bench_gemm [--threads N]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tandem/core/blas.h"
#include "tandem/core/tensor.h"

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tandem;
  int threads = 0;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--threads") == 0) threads = std::atoi(argv[i + 1]);
  if (threads > 0) blas::set_num_threads(threads);
  fmt::print("BLAS {} kernels={} threads={}\n", blas::library_path(), blas::kernel_name(),
             blas::num_threads());
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
    const int reps = n <= 2048 ? 9 : 5;
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      blas::sgemm(false, false, n, n, n, 1.0f, pa, n, pb, n, 0.0f, pc, n);
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    const double med = median(ms);
    const auto [lo, hi] = std::minmax_element(ms.begin(), ms.end());
    fmt::print("{:>6} {:>10.2f} {:>10.1f} {:>10.1f}\n", n, med, 2.0 * n * n * double(n) / med / 1e6,
               (*hi - *lo) / med * 100);
  }
  return 0;
}
