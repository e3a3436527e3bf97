// The GEMM entry point: checks a call and sends it to OpenBLAS or oneDNN (the rule is in gemm.h).
#include "tandem/core/gemm.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "onednn.h"
#include "tandem/core/bf16.h"
#include "tandem/core/blas.h"
#include "tandem/core/error.h"
#include "tandem/core/parallel.h"

namespace tandem {
namespace {

void check_call(const GemmCall& g) {
  TANDEM_CHECK(g.type == DType::F32 || g.type == DType::BF16, "GEMM of {} inputs",
               dtype_name(g.type));
  TANDEM_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0, "GEMM of {} x {} x {}", g.m, g.n, g.k);
  // Stored row-major: A is m x k (k x m transposed), B is k x n (n x k transposed).
  const int a_row = g.trans_a ? g.m : g.k, b_row = g.trans_b ? g.k : g.n;
  TANDEM_CHECK(
      g.lda >= std::max(1, a_row) && g.ldb >= std::max(1, b_row) && g.ldc >= std::max(1, g.n),
      "GEMM leading dimensions {}, {}, {} shorter than rows of {}, {}, {}", g.lda, g.ldb, g.ldc,
      a_row, b_row, g.n);
  const bool empty = g.m == 0 || g.n == 0;
  TANDEM_CHECK(empty || (g.c != nullptr && (g.k == 0 || (g.a != nullptr && g.b != nullptr))),
               "GEMM with a null operand");
}

// Products under 2^24 multiply-adds run on the calling thread alone: waking a sleeping OpenMP
// helper costs more than it saves there. Measured on 2 idle Zen 4 cores, bf16, one thread against
// two: 128 x 128 x 64 190 against 58-75 GFLOP/s, 256 x 256 x 128 214 against 154-181; from
// 512 x 512 x 64 two threads win (248-273 against 210).
constexpr int64_t kSerialBelow = int64_t{1} << 24;

// Sanitizer builds check tandem's code, not oneDNN's: their bf16 GEMMs take the widening path
// unless oneDNN is named, and oneDNN runs on the calling thread alone. (libgomp is not
// instrumented, so ThreadSanitizer would read its team's synchronisation as races; GCC 12's
// LeakSanitizer crashes at exit walking the dynamic TLS oneDNN leaves on OpenMP threads.)
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// oneDNN runs on as many threads as OpenBLAS, or on one: for a small product, inside a parallel
// region (whose parts already use every core), and in a sanitizer build.
int onednn_threads(const GemmCall& g) {
  if (kSanitized || in_parallel_region() || int64_t{g.m} * g.n * g.k < kSerialBelow) return 1;
  return std::max(1, blas::num_threads());
}

// A stored rows x cols bf16 matrix (leading dimension ld) as a dense f32 one; exact.
const float* widen(const void* src, int rows, int cols, int ld, std::vector<float>& dst) {
  dst.resize(static_cast<size_t>(rows) * cols);
  const bf16* s = static_cast<const bf16*>(src);
  for (int r = 0; r < rows; ++r)
    to_f32(s + static_cast<size_t>(r) * ld, dst.data() + static_cast<size_t>(r) * cols,
           static_cast<size_t>(cols));
  return dst.data();
}

void openblas(const GemmCall& g) {
  if (g.type == DType::F32) {
    blas::sgemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, static_cast<const float*>(g.a), g.lda,
                static_cast<const float*>(g.b), g.ldb, g.beta, g.c, g.ldc);
    return;
  }
  // Each thread's buffers, kept between calls so that a training step allocates once.
  thread_local std::vector<float> wide_a, wide_b;
  const int a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const int b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  const float* a = widen(g.a, a_rows, a_cols, g.lda, wide_a);
  const float* b = widen(g.b, b_rows, b_cols, g.ldb, wide_b);
  blas::sgemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.alpha, a, a_cols, b, b_cols, g.beta, g.c,
              g.ldc);
}

// C = beta * C, for k == 0: the same for every library, none of them asked.
void scale_c(const GemmCall& g) {
  for (int i = 0; i < g.m; ++i) {
    float* row = g.c + static_cast<size_t>(i) * g.ldc;
    for (int j = 0; j < g.n; ++j) row[j] = g.beta == 0.0f ? 0.0f : g.beta * row[j];
  }
}

bool onednn_by_default(DType type) {
  return !kSanitized && type == DType::BF16 && bf16_native() && onednn::available();
}

}  // namespace

void gemm(const GemmCall& g) {
  check_call(g);
  if (g.m == 0 || g.n == 0) return;
  if (g.k == 0) return scale_c(g);
  switch (g.library) {
    case GemmLibrary::Auto:
      // A shape oneDNN has no kernel for goes to OpenBLAS like the rest.
      if (onednn_by_default(g.type) && onednn::matmul(g, onednn_threads(g))) return;
      return openblas(g);
    case GemmLibrary::OpenBlas:
      return openblas(g);
    case GemmLibrary::OneDnn:
      if (!onednn::available()) user_error("GEMM through oneDNN: {}", onednn::unavailable_reason());
      if (!onednn::matmul(g, onednn_threads(g)))
        user_error("oneDNN has no {} matmul on this CPU (it needs AVX-512 for bf16)",
                   dtype_name(g.type));
      return;
  }
}

void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc) {
  gemm(GemmCall{DType::F32, trans_a, trans_b, m, n, k, alpha, beta, a, lda, b, ldb, c, ldc});
}

void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const bf16* a, int lda,
          const bf16* b, int ldb, float beta, float* c, int ldc) {
  gemm(GemmCall{DType::BF16, trans_a, trans_b, m, n, k, alpha, beta, a, lda, b, ldb, c, ldc});
}

std::string gemm_implementation(const GemmCall& g) {
  check_call(g);
  const std::string openblas_name =
      fmt::format("OpenBLAS {}{}", blas::kernel_name(), g.type == DType::BF16 ? " (widened)" : "");
  const bool onednn = g.library == GemmLibrary::OneDnn ||
                      (g.library == GemmLibrary::Auto && onednn_by_default(g.type));
  if (!onednn || g.m == 0 || g.n == 0 || g.k == 0) return openblas_name;
  const std::string impl = onednn::implementation(g, onednn_threads(g));
  if (!impl.empty()) return "oneDNN " + impl;
  return g.library == GemmLibrary::OneDnn ? "none" : openblas_name;
}

std::string gemm_library(DType type) {
  if (onednn_by_default(type)) return "oneDNN";
  return type == DType::BF16 ? "OpenBLAS (bf16 widened to f32)" : "OpenBLAS";
}

std::string gemm_describe() {
  std::string bf16_line;
  if (onednn_by_default(DType::BF16))
    bf16_line = fmt::format("oneDNN matmul, {} threads (one below 2^24 multiply-adds): {}",
                            std::max(1, blas::num_threads()), onednn::describe());
  else if (!bf16_native())
    bf16_line = fmt::format("widened to f32 for OpenBLAS ({})", bf16_describe());
  else if (kSanitized)
    bf16_line = "widened to f32 for OpenBLAS (a sanitizer build)";
  else
    bf16_line = fmt::format("widened to f32 for OpenBLAS ({})", onednn::unavailable_reason());
  return fmt::format("GEMM f32: OpenBLAS {} kernels, {} threads\nGEMM bf16: {}",
                     blas::kernel_name(), blas::num_threads(), bf16_line);
}

}  // namespace tandem
