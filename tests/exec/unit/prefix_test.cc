// core/formulas.h as the emitted prefix carries it, compiled as the JIT compiles it (vectorised,
// -march=native), against naive references written here the obvious way: bf16/f16 loads and
// stores bit for bit (every 16-bit pattern, the f32 boundaries and a million random f32
// patterns), the formulas written as bit blends so that they vectorise (max/min, relu, select,
// comparisons, dropout) on special values, and the tile-at-a-time Philox words.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tandem/codegen/cpp.h"
#include "tandem/core/dtype.h"
#include "tandem/core/rng.h"
#include "tandem/dsl/elementwise.h"
#include "tandem/exec/jit.h"

namespace tandem::codegen {
namespace {

constexpr const char* kKernels = R"(
extern "C" void t_store(int64_t n, const float* in, uint16_t* bf, uint16_t* hf) {
  for (int64_t i = 0; i < n; ++i) { bf[i] = fx::st_bf16(in[i]); hf[i] = fx::st_f16(in[i]); }
}
extern "C" void t_load(int64_t n, const uint16_t* in, float* bf, float* hf) {
  for (int64_t i = 0; i < n; ++i) { bf[i] = fx::ld_bf16(in[i]); hf[i] = fx::ld_f16(in[i]); }
}
extern "C" void t_binary(int64_t n, const float* a, const float* b, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    out[8 * i + 0] = fx::max(a[i], b[i]);
    out[8 * i + 1] = fx::min(a[i], b[i]);
    out[8 * i + 2] = fx::relu(a[i]);
    out[8 * i + 3] = fx::select(a[i], b[i], 7.0f);
    out[8 * i + 4] = fx::lt(a[i], b[i]);
    out[8 * i + 5] = fx::ne(a[i], b[i]);
    out[8 * i + 6] = fx::gelu(a[i]);
    out[8 * i + 7] = fx::dropout(a[i], 12345u, static_cast<uint64_t>(i) * 977u, 0.3f, 1.4285715f);
  }
}
extern "C" void t_words(uint64_t key, uint64_t first, int64_t n, uint32_t* out) {
  tdm_words w;
  const uint32_t* r = tdm_random_words(&w, key, first, n);
  for (int64_t k = 0; k < n; ++k) out[k] = r[k];
}
// Dropout as the emitter writes it over tiles of 256 elements.
extern "C" void t_dropout_tiles(int64_t n, uint64_t g0, const float* in, float* out) {
  for (int64_t t0 = 0; t0 < n; t0 += 256) {
    const int64_t tn = tdm_min(n - t0, 256);
    tdm_words w;
    const uint32_t* rw = tdm_random_words(&w, 12345u, g0 + static_cast<uint64_t>(t0), tn);
    for (int64_t t = t0; t < t0 + tn; ++t) out[t] = fx::dropout_word(in[t], rw[t - t0], 0.3f, 1.4285715f);
  }
}
)";

struct Kernels {
  std::shared_ptr<exec::JitModule> module;
  void (*store)(int64_t, const float*, uint16_t*, uint16_t*);
  void (*load)(int64_t, const uint16_t*, float*, float*);
  void (*binary)(int64_t, const float*, const float*, float*);
  void (*words)(uint64_t, uint64_t, int64_t, uint32_t*);
  void (*dropout_tiles)(int64_t, uint64_t, const float*, float*);
};

const Kernels& kernels() {
  static const Kernels k = [] {
    Kernels k;
    k.module = exec::jit_compile(cpp_prefix() + kKernels);
    k.store = reinterpret_cast<decltype(k.store)>(k.module->symbol("t_store"));
    k.load = reinterpret_cast<decltype(k.load)>(k.module->symbol("t_load"));
    k.binary = reinterpret_cast<decltype(k.binary)>(k.module->symbol("t_binary"));
    k.words = reinterpret_cast<decltype(k.words)>(k.module->symbol("t_words"));
    k.dropout_tiles =
        reinterpret_cast<decltype(k.dropout_tiles)>(k.module->symbol("t_dropout_tiles"));
    return k;
  }();
  return k;
}

// ---- naive references: the obvious, branching way to write each formula

uint16_t naive_f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((x >> 16) | 0x0040u);  // quiet NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

uint16_t naive_f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));  // NaN
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);     // to infinity
  if (ax < 0x38800000u) {
    // Subnormal (or zero): shift the 24-bit significand into place, round to even.
    if (ax < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t e = ax >> 23;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = ax - 0x38000000u;
  r += 0x0fffu + ((r >> 13) & 1u);
  return static_cast<uint16_t>(sign | (r >> 13));
}

float naive_bf16_to_f32(uint16_t h) {
  const uint32_t x = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

float naive_f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  uint32_t x;
  if (e == 0x1f) {
    x = sign | 0x7f800000u | (m << 13);
  } else if (e != 0) {
    x = sign | ((e + 112) << 23) | (m << 13);
  } else if (m == 0) {
    x = sign;
  } else {
    float f = static_cast<float>(m) * 0x1p-24f;
    std::memcpy(&x, &f, 4);
    x |= sign;
  }
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// Philox4x32-10 (Salmon et al.) written from the paper, one round at a time.
uint32_t naive_random_bits(uint64_t key, uint64_t index) {
  const uint64_t block = index >> 2;
  uint32_t c[4] = {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), 0, 0};
  uint32_t k[2] = {static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32)};
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c[0], p1 = uint64_t{0xCD9E8D57u} * c[2];
    const uint32_t n[4] = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
                           static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1],
                           static_cast<uint32_t>(p0)};
    for (int j = 0; j < 4; ++j) c[j] = n[j];
    k[0] += 0x9E3779B9u;
    k[1] += 0xBB67AE85u;
  }
  return c[index & 3];
}

float naive_dropout(float x, uint64_t seed, uint64_t index, double p) {
  const float u = static_cast<float>(naive_random_bits(seed, index) >> 8) * 0x1p-24f;
  return u >= static_cast<float>(p) ? x * static_cast<float>(1.0 / (1.0 - p)) : 0.0f;
}

float bits_to_float(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

TEST(Prefix, LoadsEvery16BitPatternExactly) {
  std::vector<uint16_t> in(65536);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint16_t>(i);
  std::vector<float> bf(in.size()), hf(in.size());
  kernels().load(static_cast<int64_t>(in.size()), in.data(), bf.data(), hf.data());
  int bad = 0;
  for (size_t i = 0; i < in.size() && bad < 5; ++i) {
    const float wb = naive_bf16_to_f32(in[i]), wh = naive_f16_to_f32(in[i]);
    if (std::memcmp(&wb, &bf[i], 4) != 0 || std::memcmp(&wh, &hf[i], 4) != 0) {
      ++bad;
      ADD_FAILURE() << "pattern 0x" << std::hex << i << ": bf16 " << bf[i] << " want " << wb
                    << ", f16 " << hf[i] << " want " << wh;
    }
  }
}

TEST(Prefix, StoresRoundToNearestEven) {
  std::vector<float> in;
  // Boundaries: zeros, infinities, NaNs with payloads, f32 subnormals, the f16 normal and
  // subnormal edges and overflow threshold, and halfway cases of both formats.
  for (uint32_t x :
       {0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u, 0x7f800001u,
        0x7fa00000u, 0x00000001u, 0x807fffffu, 0x38800000u, 0x387fffffu, 0x33000000u, 0x33000001u,
        0x32ffffffu, 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477fffffu, 0x47800000u, 0x3f808000u,
        0x3f818000u, 0x3f800fffu, 0x3f801000u, 0x3f803000u, 0x7f7fffffu, 0x7f7f8000u})
    for (uint32_t sign : {0u, 0x80000000u}) in.push_back(bits_to_float(x ^ sign));
  std::mt19937 rng(7);
  for (int i = 0; i < (1 << 20); ++i) in.push_back(bits_to_float(rng()));
  // Every f32 around the f16 range, densely: exponents 102 to 143 with random mantissas.
  for (int i = 0; i < (1 << 18); ++i)
    in.push_back(bits_to_float(((102u + rng() % 42u) << 23) | (rng() & 0x807fffffu)));
  std::vector<uint16_t> bf(in.size()), hf(in.size());
  kernels().store(static_cast<int64_t>(in.size()), in.data(), bf.data(), hf.data());
  int bad = 0;
  for (size_t i = 0; i < in.size() && bad < 5; ++i) {
    if (bf[i] != naive_f32_to_bf16(in[i]) || hf[i] != naive_f32_to_f16(in[i])) {
      ++bad;
      uint32_t x;
      std::memcpy(&x, &in[i], 4);
      ADD_FAILURE() << "f32 0x" << std::hex << x << ": bf16 0x" << bf[i] << " want 0x"
                    << naive_f32_to_bf16(in[i]) << ", f16 0x" << hf[i] << " want 0x"
                    << naive_f32_to_f16(in[i]);
    }
  }
}

TEST(Prefix, FormulasMatchTheirNaiveForms) {
  const std::vector<float> specials = {0.0f,     -0.0f,     1.0f, -1.0f,  2.5f, -3.0f,
                                       INFINITY, -INFINITY, NAN,  1e-40f, 0.3f};
  std::vector<float> a, b;
  for (float x : specials)
    for (float y : specials) {
      a.push_back(x);
      b.push_back(y);
    }
  std::vector<float> out(8 * a.size());
  kernels().binary(static_cast<int64_t>(a.size()), a.data(), b.data(), out.data());
  auto same = [](float got, float want) {
    return (std::isnan(got) && std::isnan(want)) || std::memcmp(&got, &want, 4) == 0;
  };
  for (size_t i = 0; i < a.size(); ++i) {
    const float x = a[i], y = b[i];
    const float naive_gelu =
        0.5f * x * (1.0f + std::tanh(0.7978845608f * (x + 0.044715f * x * x * x)));
    // IEEE fmax / fmin leave the sign of a (+0, -0) tie open, and std::fmax's answer depends on
    // whether the compiler inlines it: tandem's are glibc's (the first operand).
    const float naive_max = std::isnan(y) ? x : (std::isnan(x) ? y : (x >= y ? x : y));
    const float naive_min = std::isnan(y) ? x : (std::isnan(x) ? y : (x <= y ? x : y));
    const float want[8] = {
        naive_max,           naive_min,
        x > 0.0f ? x : 0.0f, x != 0.0f ? y : 7.0f,
        x < y ? 1.0f : 0.0f, x != y ? 1.0f : 0.0f,
        naive_gelu,          naive_dropout(x, 12345u, static_cast<uint64_t>(i) * 977u, 0.3)};
    const char* names[8] = {"max", "min", "relu", "select", "lt", "ne", "gelu", "dropout"};
    for (int k = 0; k < 8; ++k)
      EXPECT_TRUE(same(out[8 * i + static_cast<size_t>(k)], want[k]))
          << names[k] << "(" << a[i] << ", " << b[i]
          << ") = " << out[8 * i + static_cast<size_t>(k)] << ", want " << want[k];
  }
}

// The tile-at-a-time words (one Philox block per 4 elements) are core's random_bits bit for bit:
// every offset within a block, partial and full tiles, and block counters whose low word wraps.
TEST(Prefix, RandomWordsArePhilox) {
  std::vector<uint32_t> got(256);
  for (uint64_t key : {uint64_t{0}, uint64_t{1234}, uint64_t{0xfedcba9876543210ull}})
    for (uint64_t first : {uint64_t{0}, uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{977},
                           (uint64_t{1} << 34) - 37, (uint64_t{1} << 62) + 5})
      for (int64_t n : {0, 1, 3, 4, 5, 31, 32, 33, 61, 255, 256}) {
        kernels().words(key, first, n, got.data());
        for (int64_t k = 0; k < n; ++k)
          ASSERT_EQ(got[static_cast<size_t>(k)],
                    naive_random_bits(key, first + static_cast<uint64_t>(k)))
              << "key " << key << " first " << first << " n " << n << " k " << k;
      }
}

TEST(Prefix, DropoutOverTilesMatchesNaiveDropout) {
  const int64_t n = 1000;  // three full tiles and a partial one
  std::vector<float> in(static_cast<size_t>(n)), out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    in[static_cast<size_t>(i)] = 0.25f * static_cast<float>(i % 17) - 2.0f;
  for (uint64_t g0 : {uint64_t{0}, uint64_t{3}, uint64_t{1021}}) {
    kernels().dropout_tiles(n, g0, in.data(), out.data());
    for (int64_t i = 0; i < n; ++i) {
      const float want =
          naive_dropout(in[static_cast<size_t>(i)], 12345u, g0 + static_cast<uint64_t>(i), 0.3);
      ASSERT_EQ(std::memcmp(&out[static_cast<size_t>(i)], &want, 4), 0)
          << "g0 " << g0 << " i " << i << ": " << out[static_cast<size_t>(i)] << ", want " << want;
    }
  }
}

}  // namespace
}  // namespace tandem::codegen
