// oneDNN's matmul behind core/gemm.h (internal to core). tandem loads oneDNN itself, on first use,
// so that it can set the OpenMP runtime's wait policy before the runtime starts: Debian's oneDNN
// runs on GNU OpenMP (libgomp), whose idle threads spin for a while after every parallel region
// by default and would take a core from OpenBLAS's threads and tandem's own helpers (see
// core/parallel.h). Unless the user set OMP_WAIT_POLICY, tandem sets it to PASSIVE (idle threads
// sleep at once). Each call runs on blas::num_threads() OpenMP threads (omp_set_num_threads on
// the calling thread), so both libraries use the same width, one after the other.
#pragma once

#include <string>

#include "tandem/core/gemm.h"

namespace tandem::onednn {

// Whether the library is loaded and usable; otherwise unavailable_reason() says why.
bool available();
std::string unavailable_reason();
// e.g. "oneDNN 2.6.3 (libdnnl.so.2), OpenMP runtime, OMP_WAIT_POLICY=PASSIVE (set by tandem)".
std::string describe();

// Runs the call (already checked, k > 0) through a matmul primitive made once for its shape,
// transposes, leading dimensions, alpha, beta and thread count, and kept. Returns false, having
// done nothing, when oneDNN has no kernel for it on this CPU (bf16 on an AVX2-only CPU).
bool matmul(const GemmCall& call, int threads);

// The implementation oneDNN picks for the call ("brg:avx512_core_bf16"), or "" when none.
std::string implementation(const GemmCall& call, int threads);

}  // namespace tandem::onednn
