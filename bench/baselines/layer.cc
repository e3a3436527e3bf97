// The baseline epilogue loop (see layer.h), its own translation unit with the project's flags.
#include "layer.h"

#include <cstddef>

#include "tandem/core/rng.h"

namespace tandem::bench {

// One Philox block gives the random words of four consecutive elements (as curand_uniform4 does
// in PyTorch's fused dropout), so the generator runs once per four elements, not once per element.
void bias_dropout_residual(const float* __restrict z, const float* __restrict bias,
                           const float* __restrict residual, float* __restrict out, int64_t rows,
                           int64_t cols, uint64_t seed, double p) {
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  const float pf = static_cast<float>(p);
  const int64_t n = rows * cols;
  int64_t j = 0;  // the column of element i
  for (int64_t block = 0; block * 4 < n; ++block) {
    const auto words = philox4x32(
        seed, {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0u, 0u});
    for (int k = 0; k < 4; ++k) {
      const int64_t i = block * 4 + k;
      if (i >= n) break;
      const float u =
          static_cast<float>(words[static_cast<size_t>(k)] >> 8) * 0x1p-24f;  // random_uniform
      const float a = z[i] + bias[j];
      out[i] = (u >= pf ? a * scale : 0.0f) + residual[i];
      if (++j == cols) j = 0;
    }
  }
}

}  // namespace tandem::bench
