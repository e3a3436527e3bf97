// Normal variates from the counter-based generator, for weight initialisation.
#include "tandem/core/rng.h"

#include <cmath>

namespace tandem {

float random_normal(uint64_t seed, uint64_t index, uint32_t stream) {
  // u1 in (0, 1] so that log is finite.
  const float u1 = 1.0f - random_uniform(seed, index, 2 * stream);
  const float u2 = random_uniform(seed, index, 2 * stream + 1);
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.2831853071795864f * u2);
}

}  // namespace tandem
