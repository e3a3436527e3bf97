// The Megatron layer's baseline epilogue, as a user writes it after the GEMM and MPI_Allreduce:
// one loop over the layer's output adding the bias, applying dropout (the same counter-based mask
// tandem draws, keyed by each element's flat index) and adding the residual.
#pragma once

#include <cstdint>

namespace tandem::bench {

// out[b, j] = dropout(z[b, j] + bias[j]) + residual[b, j] over rows x cols, dropping with
// probability p and scaling kept elements by 1 / (1 - p).
void bias_dropout_residual(const float* z, const float* bias, const float* residual, float* out,
                           int64_t rows, int64_t cols, uint64_t seed, double p);

}  // namespace tandem::bench
