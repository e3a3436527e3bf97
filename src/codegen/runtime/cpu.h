// CPU helpers every emitted C++ translation unit carries (after the ABI and core/formulas.h):
// Philox words a tile at a time, the vectorised folds of whole-tensor sums, index and segment
// arithmetic. The build embeds this text (cmake/embed_text.cmake drops the quoted include, which
// the emitted unit pastes before it); host_check.cc compiles it with the host compiler.
#pragma once

#include <cstdint>

#include "tandem/core/formulas.h"

namespace fx = tandem::fx;

namespace {

// The random words of a tile, as fx::random_bits draws them: one Philox block serves four
// consecutive elements, and fx::philox_blocks runs eight blocks per AVX2 register.
// tdm_random_words(w, key, first, n), n <= 256, fills w and returns r with
// r[k] = fx::random_bits(key, first + k) for k < n.
struct tdm_words {
  alignas(32) uint32_t w[288];
};  // 256 + 3 words, rounded up to 8 blocks
inline const uint32_t* tdm_random_words(tdm_words* __restrict buf, uint64_t key, uint64_t first,
                                        int64_t n) {
  fx::philox_blocks(buf->w, key, first >> 2,
                    static_cast<int64_t>(((first & 3) + static_cast<uint64_t>(n) + 3) >> 2), 0);
  return buf->w + (first & 3);
}

// ---- reductions ----
// Whole-tensor sums (dsl/elementwise.h's SumLanes): x[k], of global flat index g0 + k, is added
// in double to lane (g0 + k) % 8 (sumsq: its exact square), each lane in element order. Peeled
// to a multiple of 8 of the global index, the middle is groups of 8 whose lanes are independent
// accumulators: the group loop vectorises (2 x 4 doubles on AVX2) without reassociating any
// lane's additions.
inline void tdm_fold_sum8(double* __restrict lanes, const float* __restrict x, int64_t n,
                          int64_t g0) {
  int64_t k = 0;
  for (; k < n && ((g0 + k) & 7) != 0; ++k) lanes[(g0 + k) & 7] += static_cast<double>(x[k]);
  double l[8];
  for (int j = 0; j < 8; ++j) l[j] = lanes[j];
  const int64_t groups = (n - k) / 8;
  const float* p = x + k;
  for (int64_t q = 0; q < groups; ++q, p += 8) {
    double d[8];
    for (int j = 0; j < 8; ++j) d[j] = static_cast<double>(p[j]);
    for (int j = 0; j < 8; ++j) l[j] += d[j];
  }
  k += groups * 8;
  for (int j = 0; j < 8; ++j) lanes[j] = l[j];
  for (; k < n; ++k) lanes[(g0 + k) & 7] += static_cast<double>(x[k]);
}
inline void tdm_fold_sumsq8(double* __restrict lanes, const float* __restrict x, int64_t n,
                            int64_t g0) {
  int64_t k = 0;
  for (; k < n && ((g0 + k) & 7) != 0; ++k) {
    const double d = x[k];
    lanes[(g0 + k) & 7] += d * d;
  }
  double l[8];
  for (int j = 0; j < 8; ++j) l[j] = lanes[j];
  const int64_t groups = (n - k) / 8;
  const float* p = x + k;
  for (int64_t q = 0; q < groups; ++q, p += 8) {
    double d[8];
    for (int j = 0; j < 8; ++j) d[j] = static_cast<double>(p[j]);
    for (int j = 0; j < 8; ++j) l[j] += d[j] * d[j];
  }
  k += groups * 8;
  for (int j = 0; j < 8; ++j) lanes[j] = l[j];
  for (; k < n; ++k) {
    const double d = x[k];
    lanes[(g0 + k) & 7] += d * d;
  }
}
// The lanes added in order 0..7, rounded to f32 once.
inline float tdm_sum_lanes(const double* lanes) {
  double s = 0.0;
  for (int j = 0; j < 8; ++j) s += lanes[j];
  return static_cast<float>(s);
}

// ---- index arithmetic (parts: fx::part_count, part_offset, part_index) ----
inline int64_t tdm_min(int64_t a, int64_t b) { return a < b ? a : b; }

// ---- segments (dsl/ir.h): bounds b[0] = 0 < ... < b[nseg] ----
// The segment holding global index g.
inline int64_t tdm_segment_of(const int64_t* b, int64_t nseg, int64_t g) {
  int64_t lo = 0, hi = nseg;  // b[lo] <= g < b[hi]
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (b[mid] <= g)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}
// dsl::segment_sums_of_squares: x holds elements [begin, begin + n); per segment, the squares in
// 8 lanes keyed by the index within the segment, rounded to f32 once (0 for a segment missed).
inline void tdm_segment_sumsq(const float* x, int64_t begin, int64_t n, const int64_t* b,
                              int64_t nseg, float* part) {
  for (int64_t s = 0; s < nseg; ++s) part[s] = 0.0f;
  for (int64_t i = 0; i < n;) {
    const int64_t g = begin + i, s = tdm_segment_of(b, nseg, g);
    const int64_t len = tdm_min(n - i, b[s + 1] - g);
    double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    tdm_fold_sumsq8(lanes, x + i, len, g - b[s]);
    part[s] = tdm_sum_lanes(lanes);
    i += len;
  }
}

}  // namespace
