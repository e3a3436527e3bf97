// The bf16 path (native or portable) and the buffer conversions; the native one is compiled for
// AVX512_BF16 through target attributes and chosen at run time, so the build runs on any x86-64.
#include "tandem/core/bf16.h"

#include <immintrin.h>

#include "tandem/core/env.h"
#include "tandem/core/error.h"
#include "tandem/core/formulas.h"
#include "tandem/core/parallel.h"

namespace tandem {
namespace {

// The portable conversion: the formula itself, over a loop the compiler vectorises.
void to_bf16_portable(const float* src, bf16* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i].bits = fx::st_bf16(src[i]);
}

#define TANDEM_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

// Converts 16 floats (the first `lanes` of them). vcvtneps2bf16 flushes subnormal inputs to zero
// where the formula rounds them, so those lanes (exponent zero, mantissa not) are redone with the
// formula; they are rare, so that is a branch not taken.
TANDEM_BF16_TARGET inline void convert16(const float* src, bf16* dst, __mmask16 lanes) {
  const __m512 v = _mm512_maskz_loadu_ps(lanes, src);
  const __m512i x = _mm512_castps_si512(v);
  _mm256_mask_storeu_epi16(dst, lanes, (__m256i)_mm512_cvtneps_pbh(v));
  unsigned sub = _mm512_testn_epi32_mask(x, _mm512_set1_epi32(0x7f800000)) &
                 _mm512_test_epi32_mask(x, _mm512_set1_epi32(0x007fffff));
  for (; sub != 0; sub &= sub - 1) {
    const int i = __builtin_ctz(sub);
    dst[i].bits = fx::st_bf16(src[i]);
  }
}

TANDEM_BF16_TARGET void to_bf16_native(const float* src, bf16* dst, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) convert16(src + i, dst + i, 0xffff);
  if (i < n) convert16(src + i, dst + i, static_cast<__mmask16>((1u << (n - i)) - 1));
}

Bf16Path choose_path() {
  const std::string want = env_str("TANDEM_BF16", "");
  if (want != "" && want != "emulate")
    user_error("TANDEM_BF16={}: expected 'emulate' (or unset to use what the CPU has)", want);
  return want == "emulate" || !cpu_has_avx512_bf16() ? Bf16Path::Portable : Bf16Path::Native;
}

}  // namespace

bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16");
}

Bf16Path bf16_path() {
  static const Bf16Path path = choose_path();
  return path;
}

std::string bf16_describe() {
  if (bf16_native()) return "bf16: native (AVX512_BF16)";
  if (cpu_has_avx512_bf16())
    return "bf16: emulated (TANDEM_BF16=emulate): bf16 values, f32 arithmetic";
  return "bf16: emulated (this CPU has no AVX512_BF16): bf16 values, f32 arithmetic";
}

void to_bf16(const float* src, bf16* dst, size_t n) { to_bf16(src, dst, n, bf16_path()); }

void to_bf16(const float* src, bf16* dst, size_t n, Bf16Path path) {
  if (path == Bf16Path::Native) {
    TANDEM_CHECK(cpu_has_avx512_bf16(), "the native bf16 path on a CPU without AVX512_BF16");
    to_bf16_native(src, dst, n);
  } else {
    to_bf16_portable(src, dst, n);
  }
}

void to_f32(const bf16* src, float* dst, size_t n) {
  // A shift on every path (vectorised by the compiler): there is nothing to round.
  for (size_t i = 0; i < n; ++i) dst[i] = fx::ld_bf16(src[i].bits);
}

void to_bf16_parallel(const float* src, bf16* dst, int64_t n) {
  parallel_for(n, int64_t{1} << 16, [&](int64_t b, int64_t e) {
    to_bf16(src + b, dst + b, static_cast<size_t>(e - b));
  });
}

void to_f32_parallel(const bf16* src, float* dst, int64_t n) {
  parallel_for(n, int64_t{1} << 16,
               [&](int64_t b, int64_t e) { to_f32(src + b, dst + b, static_cast<size_t>(e - b)); });
}

}  // namespace tandem
