// The baseline optimizer loops and the bf16 MPI_Op (see optimizers.h): plain C++ loops that the
// project's flags (-O3 -march=native -fno-math-errno) vectorise, sqrt included.
#include "optimizers.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tandem/core/dtype.h"

namespace tandem::bench {
namespace {

// bf16 -> f32 and back without tandem's NaN branch, as a user's kernel would write them: both
// vectorise.
inline float widen(uint16_t h) {
  uint32_t x = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}
inline uint16_t narrow(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

struct Coefficients {
  float scale, b1, one_minus_b1, b2, one_minus_b2, inv_bc1, inv_bc2, eps, wd, lr;
};

Coefficients coefficients(const AdamHyper& h) {
  return {h.grad_scale,
          h.beta1,
          1.0f - h.beta1,
          h.beta2,
          1.0f - h.beta2,
          1.0f / (1.0f - std::pow(h.beta1, h.step)),
          1.0f / (1.0f - std::pow(h.beta2, h.step)),
          h.eps,
          h.weight_decay,
          h.lr};
}

template <typename G, typename Load>
void adamw(const G* __restrict g, float* __restrict w, float* __restrict m, float* __restrict v,
           int64_t n, const AdamHyper& h, Load load) {
  const Coefficients c = coefficients(h);
  for (int64_t i = 0; i < n; ++i) {
    const float g1 = c.scale * load(g[i]);
    const float m1 = c.b1 * m[i] + c.one_minus_b1 * g1;
    const float v1 = c.b2 * v[i] + c.one_minus_b2 * g1 * g1;
    m[i] = m1;
    v[i] = v1;
    const float r = (m1 * c.inv_bc1) / (std::sqrt(v1 * c.inv_bc2) + c.eps) + c.wd * w[i];
    w[i] = w[i] - c.lr * r;
  }
}

// The norms are summed as a careful GPU kernel sums them: 16 independent f32 lanes within a block
// of kBlock elements (so the loop vectorises without -ffast-math), each block's lanes then added
// into double accumulators. An f32 lane then never sums more than kBlock / 16 elements, so the
// norms stay accurate (about 1e-7 relative) however long the tensor; 16 f32 lanes over a whole
// 64Mi tensor are off by about 1e-4.
constexpr int kLanes = 16;
constexpr int64_t kBlock = 4096;

template <typename G, typename Load>
void lamb(const G* __restrict g, float* __restrict w, float* __restrict m, float* __restrict v,
          float* __restrict r, int64_t n, const AdamHyper& h, Load load) {
  const Coefficients c = coefficients(h);
  double w_acc[kLanes] = {}, r_acc[kLanes] = {};
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    float w_sq[kLanes] = {}, r_sq[kLanes] = {};
    int64_t i = b;
    for (; i + kLanes <= e; i += kLanes)
      for (int k = 0; k < kLanes; ++k) {
        const int64_t j = i + k;
        const float g1 = c.scale * load(g[j]);
        const float m1 = c.b1 * m[j] + c.one_minus_b1 * g1;
        const float v1 = c.b2 * v[j] + c.one_minus_b2 * g1 * g1;
        m[j] = m1;
        v[j] = v1;
        const float rj = (m1 * c.inv_bc1) / (std::sqrt(v1 * c.inv_bc2) + c.eps) + c.wd * w[j];
        r[j] = rj;
        w_sq[k] += w[j] * w[j];
        r_sq[k] += rj * rj;
      }
    for (; i < e; ++i) {
      const float g1 = c.scale * load(g[i]);
      const float m1 = c.b1 * m[i] + c.one_minus_b1 * g1;
      const float v1 = c.b2 * v[i] + c.one_minus_b2 * g1 * g1;
      m[i] = m1;
      v[i] = v1;
      const float ri = (m1 * c.inv_bc1) / (std::sqrt(v1 * c.inv_bc2) + c.eps) + c.wd * w[i];
      r[i] = ri;
      w_sq[0] += w[i] * w[i];
      r_sq[0] += ri * ri;
    }
    for (int k = 0; k < kLanes; ++k) {
      w_acc[k] += w_sq[k];
      r_acc[k] += r_sq[k];
    }
  }
  double ws = 0, rs = 0;
  for (int k = 0; k < kLanes; ++k) {
    ws += w_acc[k];
    rs += r_acc[k];
  }
  const float w_norm = static_cast<float>(std::sqrt(ws)),
              r_norm = static_cast<float>(std::sqrt(rs));
  const float trust = w_norm > 0 && r_norm > 0 ? w_norm / r_norm : 1.0f;
  const float step = c.lr * trust;
  for (int64_t j = 0; j < n; ++j) w[j] = w[j] - step * r[j];
}

void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = narrow(widen(a[i]) + widen(b[i]));
}

}  // namespace

void adamw_f32(const float* g, float* w, float* m, float* v, int64_t n, const AdamHyper& h) {
  adamw(g, w, m, v, n, h, [](float x) { return x; });
}

void adamw_bf16(const uint16_t* g, float* w, float* m, float* v, int64_t n, const AdamHyper& h) {
  adamw(g, w, m, v, n, h, widen);
}

void lamb_f32(const float* g, float* w, float* m, float* v, float* r, int64_t n,
              const AdamHyper& h) {
  lamb(g, w, m, v, r, n, h, [](float x) { return x; });
}

void lamb_bf16(const uint16_t* g, float* w, float* m, float* v, float* r, int64_t n,
               const AdamHyper& h) {
  lamb(g, w, m, v, r, n, h, widen);
}

MPI_Op bf16_sum_op() {
  static MPI_Op op = [] {
    MPI_Op o;
    MPI_Op_create(&bf16_sum, /*commute=*/1, &o);
    return o;
  }();
  return op;
}

}  // namespace tandem::bench
