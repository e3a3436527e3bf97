// The one GEMM entry point: row-major C = alpha * op(A) * op(B) + beta * C, op(X) = X or X^T,
// A and B both f32 or both bf16, C f32 (products accumulate in f32). Every call fills a GemmCall
// and goes through gemm(const GemmCall&), which checks it and picks the library:
// - f32: OpenBLAS (blas::sgemm). oneDNN's f32 matmul measured no faster at the model's shapes
//   (docs/benchmarks.md, "GEMM: OpenBLAS and oneDNN, fp32 and bf16").
// - bf16 where the CPU has AVX512_BF16 (core/bf16.h): oneDNN's matmul, one primitive per call
//   shape, created on first use and kept, running on blas::num_threads() threads (on the calling
//   thread alone for a product under 2^24 multiply-adds, and inside a parallel region).
// - bf16 elsewhere (no AVX512_BF16, TANDEM_BF16=emulate, oneDNN not installed, or a sanitizer
//   build, which checks tandem's code and not oneDNN's): A and B are widened to f32 (exactly)
//   and OpenBLAS multiplies them. oneDNN 2.6 refuses bf16 on AVX2-only CPUs and emulates it on
//   AVX-512 ones at well under SGEMM's speed, so it is not used there.
// Either way a bf16 product of two bf16 values is exact in f32: the paths differ only in the
// order of the f32 additions.
#pragma once

#include <cstdint>
#include <string>

#include "tandem/core/dtype.h"

namespace tandem {

// Which library multiplies; Auto is the rule above, the others are for benchmarks and tests.
// OpenBlas with bf16 inputs widens them first; OneDnn where oneDNN cannot run the call (not
// installed, or no kernel for the type on this CPU) is a UserError saying why.
enum class GemmLibrary : uint8_t { Auto, OpenBlas, OneDnn };

struct GemmCall {
  DType type = DType::F32;  // of A and B: F32 or BF16 (C is always f32)
  bool trans_a = false, trans_b = false;
  int m = 0, n = 0, k = 0;          // op(A) is m x k, op(B) is k x n, C is m x n
  float alpha = 1.0f, beta = 0.0f;  // beta == 0: C is not read (NaN in C does not leak)
  const void* a = nullptr;
  int lda = 0;  // leading dimensions of the stored row-major arrays (before op)
  const void* b = nullptr;
  int ldb = 0;
  float* c = nullptr;
  int ldc = 0;
  GemmLibrary library = GemmLibrary::Auto;
};

// The entry point. A malformed call (a leading dimension shorter than its row, a null operand
// with a non-empty shape, an element type other than f32 or bf16) is an InternalError.
void gemm(const GemmCall& call);

// The same, typed.
void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
          const float* b, int ldb, float beta, float* c, int ldc);
void gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const bf16* a, int lda,
          const bf16* b, int ldb, float beta, float* c, int ldc);

// The kernels a call runs on, e.g. "OpenBLAS SkylakeX" or "oneDNN brg:avx512_core_bf16".
std::string gemm_implementation(const GemmCall& call);
// The library Auto gives a call of this element type, e.g. "OpenBLAS" or "oneDNN".
std::string gemm_library(DType type);
// Lines for a start-up message or a benchmark header: what each element type runs on and why,
// with oneDNN's version and threading (or why it is not used).
std::string gemm_describe();

}  // namespace tandem
