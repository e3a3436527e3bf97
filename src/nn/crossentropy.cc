// Softmax cross-entropy fused over logits: probabilities and per-token losses, and the backward.
#include <algorithm>
#include <cmath>

#include "columns.h"
#include "tandem/nn/layers.h"
#include "vec.h"

namespace tandem::nn {

// losses (N), probs (N, V) = softmax(logits (N, V)); probs may equal logits.
void crossentropy_forward(float* losses, float* probs, const float* logits, const int32_t* targets,
                          int N, int V) {
  // Rows are independent: split over threads.
  const int64_t grain = std::max<int64_t>(1, detail::kParallelGrain / std::max(V, 1));
  parallel_for(N, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const float* l = logits + static_cast<int64_t>(n) * V;
      float* p = probs + static_cast<int64_t>(n) * V;
      const float m = detail::lane_max(l, V);
      // Read the target's logit before the row may be overwritten in place.
      const float target_logit = targets != nullptr ? l[targets[n]] : 0.0f;
      for (int v = 0; v < V; ++v) p[v] = detail::exp_approx(l[v] - m);
      const float sum = detail::lane_sum(p, V);
      const float inv = 1.0f / sum;
      for (int v = 0; v < V; ++v) p[v] *= inv;
      // -log softmax[target] = logsumexp - logit[target]; exact log, once per row.
      if (targets != nullptr) losses[n] = (m + std::log(sum)) - target_logit;
    }
  });
}

// dlogits (N, V) += (probs - onehot(targets)) * dloss
void crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss,
                           int N, int V) {
  const int64_t grain = std::max<int64_t>(1, detail::kParallelGrain / std::max(V, 1));
  parallel_for(N, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      float* __restrict d = dlogits + static_cast<int64_t>(n) * V;
      const float* __restrict p = probs + static_cast<int64_t>(n) * V;
      for (int v = 0; v < V; ++v) d[v] += p[v] * dloss;
      d[targets[n]] -= dloss;
    }
  });
}

}  // namespace tandem::nn
