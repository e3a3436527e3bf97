// CBLAS through one door. tandem loads OpenBLAS itself, on first use, so that it can choose the
// library's kernels before the library initialises: Debian's OpenBLAS 0.3.21 does not recognise
// recent AVX-512 CPUs (AMD Zen 4 among them) and falls back to generic SSE3 kernels, 4-6x slower.
// Unless the user set OPENBLAS_CORETYPE, tandem sets it before loading: SkylakeX on a CPU with
// AVX-512 (F, BW, DQ, VL), Haswell on one with AVX2 and FMA (the kernels OpenBLAS's Zen and
// Haswell targets share); on older CPUs the library's own choice stands.
#pragma once

#include <string>
#include <string_view>

namespace tandem::blas {

// Row-major C = alpha * op(A) * op(B) + beta * C, with op(X) = X or X^T; A is M x K after op,
// B is K x N after op, C is M x N. Leading dimensions are those of the stored (row-major) arrays.
void sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
           const float* b, int ldb, float beta, float* c, int ldc);

// The kernel family the library chose, e.g. "SkylakeX", "Haswell", "Prescott".
std::string kernel_name();
// Whether the library is running generic SSE kernels on a CPU that has AVX2 or AVX-512 ones.
bool using_generic_kernels_on_capable_cpu();
// Whether `name` (any case) is one of OpenBLAS's generic SSE kernel families ("Prescott", ...).
bool is_generic_kernel(std::string_view name);
// The OPENBLAS_CORETYPE the user set before tandem chose, or "" when tandem chose (or nobody did).
std::string user_kernels();
// The OPENBLAS_CORETYPE tandem asks for on this CPU, or null to keep the library's choice.
const char* preferred_kernels();
// The library file that was loaded.
std::string library_path();

// The threads each call may use (the count last set, or the library's own).
int num_threads();
void set_num_threads(int n);

// While one of these lives, in any thread, every call runs on its calling thread alone. For work
// split over our own threads whose parts each call BLAS (per-head attention): OpenBLAS 0.3's
// thread count is process-wide and its pool is shared, so parts calling it at once queue and spin
// for its threads (measured on 2 Zen 4 cores, GPT-2 XL's attention: 3.2 s a forward against
// 0.6 s with this). The results are the same: OpenBLAS splits a GEMM's rows and columns over its
// threads, never the sums. Calls made meanwhile from elsewhere in the process (another
// in-process rank) run on one thread too.
class OnCallingThread {
 public:
  OnCallingThread();
  ~OnCallingThread();
  OnCallingThread(const OnCallingThread&) = delete;
  OnCallingThread& operator=(const OnCallingThread&) = delete;
};

// Whether this CPU has the AVX-512 subsets OpenBLAS's SkylakeX kernels need.
bool cpu_has_avx512();
bool cpu_has_avx2_fma();

}  // namespace tandem::blas
