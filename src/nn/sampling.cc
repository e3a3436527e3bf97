// Sampling a token from logits in log space: weights relative to the largest logit.
#include "tandem/nn/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "tandem/core/error.h"

namespace tandem::nn {

int sample_token(const float* logits, int V, double temperature, int top_k, double u) {
  if (V < 1) user_error("cannot sample from {} logits", V);
  if (!(temperature >= 0) || !std::isfinite(temperature))
    user_error("sampling temperature {} must be a finite number, 0 or more", temperature);
  for (int i = 0; i < V; ++i)
    if (std::isnan(logits[i]))
      user_error("the model's logit for token {} is NaN: its weights are not finite", i);
  std::vector<int> order(static_cast<size_t>(V));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  const size_t keep = static_cast<size_t>(top_k > 0 ? std::min(top_k, V) : V);
  const double top = logits[order[0]];
  if (temperature == 0 || std::isinf(top)) return order[0];  // greedy (or a certain token)
  // (logit - top) <= 0, so every weight lies in [0, 1] and the first is exactly 1.
  std::vector<double> w(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    w[i] = std::exp((static_cast<double>(logits[order[i]]) - top) / temperature);
    total += w[i];
  }
  double target = std::clamp(u, 0.0, 1.0) * total;
  size_t last = 0;  // the last token with a weight: where rounding may leave the target
  for (size_t i = 0; i < keep; ++i) {
    if (w[i] <= 0) continue;
    last = i;
    target -= w[i];
    if (target < 0) return order[i];
  }
  return order[last];
}

}  // namespace tandem::nn
