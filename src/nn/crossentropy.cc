// Softmax cross-entropy fused over logits: probabilities and per-token losses, and the backward;
// also in place on a chunk of logits, for the chunked LM head.
#include <algorithm>
#include <cmath>

#include "columns.h"
#include "tandem/core/parallel.h"
#include "tandem/nn/layers.h"
#include "vec.h"

namespace tandem::nn {
namespace {

// p (V) = exp(l - max l), p may equal l; returns max l and the sum of p. Every softmax here is
// this one, so the in-place variants give bitwise crossentropy_forward's probabilities.
struct RowExp {
  float max, sum;
};
RowExp exp_row(float* p, const float* l, int V) {
  const float m = detail::lane_max(l, V);
  for (int v = 0; v < V; ++v) p[v] = detail::exp_approx(l[v] - m);
  return {m, detail::lane_sum(p, V)};
}

// -log softmax[target] = logsumexp - logit[target]; exact log, once per row.
float row_loss(const RowExp& e, float target_logit) {
  return (e.max + std::log(e.sum)) - target_logit;
}

// Rows are independent: split over threads.
template <class Body>
void for_rows(int N, int V, const Body& body) {
  const int64_t grain = std::max<int64_t>(1, detail::kParallelGrain / std::max(V, 1));
  parallel_for(N, grain, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) body(n);
  });
}

}  // namespace

// losses (N), probs (N, V) = softmax(logits (N, V)); probs may equal logits.
void crossentropy_forward(float* losses, float* probs, const float* logits, const int32_t* targets,
                          int N, int V) {
  for_rows(N, V, [&](int64_t n) {
    const float* l = logits + n * V;
    float* p = probs + n * V;
    // Read the target's logit before the row may be overwritten in place.
    const float target_logit = targets != nullptr ? l[targets[n]] : 0.0f;
    const RowExp e = exp_row(p, l, V);
    const float inv = 1.0f / e.sum;
    for (int v = 0; v < V; ++v) p[v] *= inv;
    if (targets != nullptr) losses[n] = row_loss(e, target_logit);
  });
}

// dlogits (N, V) += (probs - onehot(targets)) * dloss
void crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss,
                           int N, int V) {
  for_rows(N, V, [&](int64_t n) {
    float* __restrict d = dlogits + n * V;
    const float* __restrict p = probs + n * V;
    for (int v = 0; v < V; ++v) d[v] += p[v] * dloss;
    d[targets[n]] -= dloss;
  });
}

void crossentropy_loss_inplace(float* losses, float* logits, const int32_t* targets, int N, int V) {
  for_rows(N, V, [&](int64_t n) {
    float* l = logits + n * V;
    const float target_logit = l[targets[n]];
    losses[n] = row_loss(exp_row(l, l, V), target_logit);
  });
}

void crossentropy_backward_inplace(float* logits, const int32_t* targets, float dloss, int N,
                                   int V) {
  for_rows(N, V, [&](int64_t n) {
    float* d = logits + n * V;
    const RowExp e = exp_row(d, d, V);
    const float inv = 1.0f / e.sum;
    // (p * inv) rounds to the forward's probability before the product, as there.
    for (int v = 0; v < V; ++v) d[v] = (d[v] * inv) * dloss;
    d[targets[n]] -= dloss;
  });
}

}  // namespace tandem::nn
