// Reduction and copy kernels for the collective algorithms: templated on the element type and the
// operator so that the compiler vectorises each loop; bf16/f16 combine in f32.
#include "reduce.h"

#include <cstring>

#if defined(__AVX__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "tandem/core/error.h"

namespace tandem::comm::detail {
namespace {

// The operators. max and min propagate NaN: a NaN in either input gives NaN, whatever the order.
struct OpSum {
  static float apply(float a, float b) { return a + b; }
};
struct OpProd {
  static float apply(float a, float b) { return a * b; }
};
struct OpMax {
  static float apply(float a, float b) { return (a > b || a != a) ? a : b; }
};
struct OpMin {
  static float apply(float a, float b) { return (a < b || a != a) ? a : b; }
};

// Element types: how a tile is loaded into f32 and stored back.
struct F32 {
  using T = float;
  static void load(float* out, const float* in, int64_t n) { std::memcpy(out, in, n * 4); }
  static void store(float* out, const float* in, int64_t n) { std::memcpy(out, in, n * 4); }
};

struct BF16 {
  using T = uint16_t;
  static void load(float* out, const uint16_t* in, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t x = static_cast<uint32_t>(in[i]) << 16;
      std::memcpy(&out[i], &x, 4);
    }
  }
  // Round to nearest even; NaN stays a (quiet) NaN. Branch-free, so that it vectorises; the same
  // arithmetic as tandem::f32_to_bf16.
  static void store(uint16_t* out, const float* in, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      uint32_t x;
      std::memcpy(&x, &in[i], 4);
      const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
      const uint32_t nan = (x >> 16) | 0x40u;
      out[i] = static_cast<uint16_t>((x & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
    }
  }
};

struct F16 {
  using T = uint16_t;
  static void load(float* out, const uint16_t* in, int64_t n) {
    int64_t i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8)
      _mm256_storeu_ps(out + i,
                       _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
#endif
    for (; i < n; ++i) out[i] = f16_to_f32(in[i]);
  }
  // The hardware conversion rounds to nearest even and keeps NaN quiet with its payload's top
  // bits, exactly as tandem::f32_to_f16 does.
  static void store(uint16_t* out, const float* in, int64_t n) {
    int64_t i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                       _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; ++i) out[i] = f32_to_f16(in[i]);
  }
};

// Elements per tile: the f32 accumulator (8 KiB) and a tile of each input stay in L1.
constexpr int64_t kTile = 2048;

// Two f32 inputs, the common case (every ring step; the direct algorithm on two ranks): one
// pass, no accumulator. dst may equal a or b; the three cases are separate loops with __restrict
// so that the compiler vectorises each without runtime overlap checks (which would send the
// in-place case, dst == a, down the scalar path).
template <typename Op>
void reduce2_f32(float* dst, const float* a, const float* b, int64_t n) {
  if (dst == a) {
    float* __restrict d = dst;
    const float* __restrict y = b;
    for (int64_t i = 0; i < n; ++i) d[i] = Op::apply(d[i], y[i]);
  } else if (dst == b) {
    float* __restrict d = dst;
    const float* __restrict x = a;
    for (int64_t i = 0; i < n; ++i) d[i] = Op::apply(x[i], d[i]);
  } else {
    float* __restrict d = dst;
    const float* __restrict x = a;
    const float* __restrict y = b;
    for (int64_t i = 0; i < n; ++i) d[i] = Op::apply(x[i], y[i]);
  }
}

template <typename E, typename Op>
void reduce_tiled(void* dst_v, const void* const* srcs_v, int k, int64_t n) {
  using T = typename E::T;
  T* dst = static_cast<T*>(dst_v);
  alignas(64) float acc[kTile];
  alignas(64) float in[kTile];
  for (int64_t base = 0; base < n; base += kTile) {
    const int64_t m = n - base < kTile ? n - base : kTile;
    E::load(acc, static_cast<const T*>(srcs_v[0]) + base, m);
    for (int q = 1; q < k; ++q) {
      E::load(in, static_cast<const T*>(srcs_v[q]) + base, m);
      for (int64_t i = 0; i < m; ++i) acc[i] = Op::apply(acc[i], in[i]);
    }
    E::store(dst + base, acc, m);
  }
}

template <typename Op>
void reduce_f32(void* dst, const void* const* srcs, int k, int64_t n) {
  if (k == 2) {
    reduce2_f32<Op>(static_cast<float*>(dst), static_cast<const float*>(srcs[0]),
                    static_cast<const float*>(srcs[1]), n);
    return;
  }
  reduce_tiled<F32, Op>(dst, srcs, k, n);
}

template <typename Op>
void reduce_typed(DType t, void* dst, const void* const* srcs, int k, int64_t n) {
  switch (t) {
    case DType::F32:
      return reduce_f32<Op>(dst, srcs, k, n);
    case DType::BF16:
      return reduce_tiled<BF16, Op>(dst, srcs, k, n);
    case DType::F16:
      return reduce_tiled<F16, Op>(dst, srcs, k, n);
  }
  TANDEM_CHECK(false, "unknown dtype {}", static_cast<int>(t));
}

}  // namespace

void reduce_into(DType t, ReduceOp op, void* dst, const void* const* srcs, int k, int64_t n) {
  TANDEM_CHECK(k >= 1 && n >= 0, "reduce_into(k={}, n={})", k, n);
  if (n == 0) return;
  if (k == 1) {
    if (dst != srcs[0]) std::memcpy(dst, srcs[0], static_cast<size_t>(n) * dtype_size(t));
    return;
  }
  switch (op) {
    case ReduceOp::Sum:
      return reduce_typed<OpSum>(t, dst, srcs, k, n);
    case ReduceOp::Prod:
      return reduce_typed<OpProd>(t, dst, srcs, k, n);
    case ReduceOp::Max:
      return reduce_typed<OpMax>(t, dst, srcs, k, n);
    case ReduceOp::Min:
      return reduce_typed<OpMin>(t, dst, srcs, k, n);
  }
  TANDEM_CHECK(false, "unknown reduce op {}", static_cast<int>(op));
}

void copy_bytes(void* dst, const void* src, size_t bytes, bool streaming) {
  if (bytes == 0) return;
#ifdef __AVX__
  if (streaming && bytes >= 4096) {
    auto* d = static_cast<char*>(dst);
    const auto* s = static_cast<const char*>(src);
    // Head: plain copy up to the first 32-byte boundary of dst (streaming stores need it).
    const size_t head = (32 - (reinterpret_cast<uintptr_t>(d) & 31)) & 31;
    std::memcpy(d, s, head);
    d += head;
    s += head;
    size_t left = bytes - head;
    for (; left >= 128; left -= 128, d += 128, s += 128) {
      const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
      const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
      const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 64));
      const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 96));
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d), a);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), b);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 64), c);
      _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 96), e);
    }
    std::memcpy(d, s, left);
    // Streaming stores are weakly ordered: fence them before anyone is told the data is there.
    _mm_sfence();
    return;
  }
#endif
  (void)streaming;
  std::memcpy(dst, src, bytes);
}

}  // namespace tandem::comm::detail
