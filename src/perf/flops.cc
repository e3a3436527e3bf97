// The matmul FLOP formulas of perf/flops.h.
#include "tandem/perf/flops.h"

namespace tandem::perf {

double attention_flops_per_token(const nn::GPTConfig& m, double T) {
  const double C = m.d_model;
  return 2 * C * (static_cast<double>(m.qkv_width()) + C) + 4 * T * C;
}

double mlp_flops_per_token(const nn::GPTConfig& m) {
  return 2.0 * m.d_model * static_cast<double>(m.fc_width() + m.mlp_width());
}

double head_flops_per_token(const nn::GPTConfig& m) {
  return 2.0 * m.d_model * static_cast<double>(m.vocab_size);
}

double step_flops_per_token(const nn::GPTConfig& m, double T) {
  const double forward = m.n_layers * (attention_flops_per_token(m, T) + mlp_flops_per_token(m)) +
                         head_flops_per_token(m);
  return 3 * forward;
}

}  // namespace tandem::perf
