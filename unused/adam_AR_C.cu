// Emitted by tandem codegen/cuda: one schedule of one program as a standalone CUDA + NCCL program.
// Build: make (see the Makefile). Run: mpirun -np N ./<name> [SYMBOL=EXTENT ...] [--iters K]
#include <stdint.h>

extern "C" {
typedef struct tandem_block {
  int64_t row0;
  int64_t rows;
  int64_t part_row0;
  int32_t index;
  int32_t count;
} tandem_block;
typedef struct tandem_args tandem_args;
typedef int (*tandem_hook_fn)(const tandem_args* a, void* chunk, int64_t n, int64_t g0,
                              const tandem_block* blk);
typedef struct tandem_collective {
  int32_t step;
  int32_t kind;
  int32_t op;
  int32_t dtype;
  int32_t root;
  int32_t async;
  int32_t carry;
  int32_t recv_whole;
  void* send;
  void* recv;
  int64_t outer, rows, inner;
  int64_t index_base;
  tandem_hook_fn hook;
  tandem_block block;
} tandem_collective;
typedef struct tandem_transfer {
  int32_t step;
  int32_t recv;
  int32_t peer_group;
  int32_t tag;
  int32_t async;
  int32_t block;
  void* data;
  int64_t bytes;
} tandem_transfer;
typedef void (*tandem_sgemm_fn)(int trans_a, int trans_b, int m, int n, int k, float alpha,
                                const float* a, int lda, const float* b, int ldb, float beta,
                                float* c, int ldc);
struct tandem_args {
  void* const* buf;
  double* acc;
  float* scratch;
  const int64_t* sym;
  const uint64_t* seed;
  int32_t p, r, group;
  int32_t pad;
  void* host;
  int (*collective)(void* host, const tandem_collective* c);
  int (*transfer)(void* host, const tandem_transfer* t);
  int (*sync)(void* host, int32_t block);
  tandem_sgemm_fn sgemm;
  const int64_t* seg;
  int64_t nseg;
};
}

// ---- core/formulas.h
// tandem's exact element formulas, written once: the 16-bit conversions, every elementwise op,
// dropout's counter-based Philox, and the arithmetic of parts (which rank holds which rows). The
// host library includes this header (core/dtype.h, core/rng.h, dsl/elementwise.h, so the reference
// interpreter computes with it), and the build embeds its text into the code emitters
// (codegen/formulas_text.h), which paste it at the top of every emitted C++ and CUDA translation
// unit and print calls to these functions. A formula changed here changes everywhere, bit for bit.
//
// Rules for this file, because it is compiled as C++ by the host compiler, by the JIT, and as
// CUDA (host and device) by nvcc:
// - self-contained: standard headers only, nothing of tandem, no exceptions, no std::array;
// - every function is TANDEM_FX (inline, and __host__ __device__ under nvcc);
// - selects are written as bit blends, never branches, so loops over them vectorise on the CPU
//   and do not diverge on the GPU;
// - exact arithmetic only where exactness is promised: + - * / sqrt are correctly rounded on
//   both sides (the CPU builds use -ffp-contract=off, the CUDA build -fmad=false); exp, log,
//   tanh and pow come from each side's math library, so a GPU result of those may differ from
//   the CPU's in the last bits.

#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define TANDEM_FX __host__ __device__ inline
#else
#define TANDEM_FX inline
#endif

#if defined(__AVX2__) && !defined(__CUDACC__)
#include <immintrin.h>
#endif

namespace tandem::fx {

// ------------------------------------------------------------------------------ bits, blends

TANDEM_FX uint32_t bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
#endif
}
TANDEM_FX float from_bits(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(x);
#else
  float f;
  std::memcpy(&f, &x, 4);
  return f;
#endif
}
TANDEM_FX uint32_t mask(bool c) { return 0u - static_cast<uint32_t>(c); }
TANDEM_FX uint32_t usel(bool c, uint32_t a, uint32_t b) {
  const uint32_t m = mask(c);
  return (a & m) | (b & ~m);
}
TANDEM_FX float fsel(bool c, float a, float b) { return from_bits(usel(c, bits(a), bits(b))); }

// ------------------------------------------------- bf16 and f16: round to nearest even, NaN kept

// bfloat16 is the upper half of an f32; a NaN stays a (quiet) NaN with its payload's top bits.
TANDEM_FX float ld_bf16(uint16_t h) { return from_bits(static_cast<uint32_t>(h) << 16); }
TANDEM_FX uint16_t st_bf16(float f) {
  const uint32_t x = bits(f);
  const uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (x >> 16) | 0x0040u;
  return static_cast<uint16_t>(usel((x & 0x7fffffffu) > 0x7f800000u, quiet_nan, rounded));
}
// IEEE half: subnormals exact both ways, infinities and NaN payloads kept.
TANDEM_FX float ld_f16(uint16_t h) {
  const uint32_t o = static_cast<uint32_t>(h & 0x7fffu) << 13;
  const uint32_t e = o & 0x0f800000u;
  const uint32_t x = o + 0x38000000u + (0x38000000u & mask(e == 0x0f800000u));  // inf, NaN
  const float sub = from_bits(x + 0x00800000u) - from_bits(0x38800000u);        // subnormal
  return from_bits(usel(e == 0, bits(sub), x) | (static_cast<uint32_t>(h & 0x8000u) << 16));
}
TANDEM_FX uint16_t st_f16(float f) {
  const uint32_t x = bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  const uint32_t big = usel(ax > 0x7f800000u, 0x7e00u | ((ax >> 13) & 0x3ffu), 0x7c00u);
  // Below 2^-14 the result is subnormal: adding 0.5 lines the bits up and rounds to even.
  const uint32_t sub = bits(from_bits(ax) + 0.5f) - 0x3f000000u;
  const uint32_t normal = (ax - 0x38000000u + 0x0fffu + ((ax >> 13) & 1u)) >> 13;
  return static_cast<uint16_t>(sign |
                               usel(ax >= 0x47800000u, big, usel(ax < 0x38800000u, sub, normal)));
}
// Loads and stores by dtype name (emitters print ld_<dtype> / st_<dtype> / rt_<dtype>).
TANDEM_FX float ld_f32(float x) { return x; }
TANDEM_FX float st_f32(float x) { return x; }
// A value kept in a register is rounded to its stage's dtype, as if it had been stored.
TANDEM_FX float rt_f32(float x) { return x; }
TANDEM_FX float rt_bf16(float x) { return ld_bf16(st_bf16(x)); }
TANDEM_FX float rt_f16(float x) { return ld_f16(st_f16(x)); }

// ------------------------------------------------------------------------- elementwise ops
// Every op computes in f32; the rounding to the stage's dtype happens at the store (or rt_*).

TANDEM_FX float neg(float x) { return -x; }
TANDEM_FX float abs(float x) { return from_bits(bits(x) & 0x7fffffffu); }
TANDEM_FX float sqrt(float x) { return std::sqrt(x); }
TANDEM_FX float rsqrt(float x) { return 1.0f / std::sqrt(x); }
TANDEM_FX float exp(float x) { return std::exp(x); }
TANDEM_FX float log(float x) { return std::log(x); }
TANDEM_FX float tanh(float x) { return std::tanh(x); }
// GELU, tanh approximation (as in GPT-2): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
TANDEM_FX float gelu(float x) {
  const float inner = 0.7978845608f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(inner));
}
TANDEM_FX float relu(float x) { return fsel(x > 0.0f, x, 0.0f); }
TANDEM_FX float cast(float x) { return x; }

TANDEM_FX float add(float a, float b) { return a + b; }
TANDEM_FX float sub(float a, float b) { return a - b; }
TANDEM_FX float mul(float a, float b) { return a * b; }
TANDEM_FX float div(float a, float b) { return a / b; }
TANDEM_FX float pow(float a, float b) { return std::pow(a, b); }
// IEEE fmax / fmin as glibc computes them: a NaN operand loses; ties (+0, -0) give the first.
TANDEM_FX float max(float a, float b) { return fsel(a >= b || b != b, a, b); }
TANDEM_FX float min(float a, float b) { return fsel(a <= b || b != b, a, b); }
// Comparisons give 1 or 0.
TANDEM_FX float cmp(bool c) { return from_bits(0x3f800000u & mask(c)); }
TANDEM_FX float lt(float a, float b) { return cmp(a < b); }
TANDEM_FX float le(float a, float b) { return cmp(a <= b); }
TANDEM_FX float gt(float a, float b) { return cmp(a > b); }
TANDEM_FX float ge(float a, float b) { return cmp(a >= b); }
TANDEM_FX float eq(float a, float b) { return cmp(a == b); }
TANDEM_FX float ne(float a, float b) { return cmp(a != b); }
TANDEM_FX float select(float c, float a, float b) { return fsel(c != 0.0f, a, b); }

// Reductions over one dim (and Prod, Max, Min over every dim) fold in f32, in element order,
// from the identity: Sum 0, Prod 1, Max -inf, Min +inf.
TANDEM_FX float sum(float acc, float x) { return acc + x; }
TANDEM_FX float prod(float acc, float x) { return acc * x; }

// ------------------------------------------------------------------------ index arithmetic

// The part of an extent n that index r of p holds (a Sliced dim, a collective's partition, a
// pipeline's row blocks): the first n % p parts hold one element more.
TANDEM_FX int64_t part_count(int64_t n, int64_t p, int64_t r) {
  return n / p + (r < n % p ? 1 : 0);
}
TANDEM_FX int64_t part_offset(int64_t n, int64_t p, int64_t r) {
  return r * (n / p) + (r < n % p ? r : n % p);
}
// The index, in a buffer holding rows [off, off + cnt) of one dim (span = that dim's extent
// times `inner`, the elements after it), of global flat index g.
TANDEM_FX int64_t part_index(int64_t g, int64_t span, int64_t inner, int64_t off, int64_t cnt) {
  const int64_t o = g / span;
  return o * cnt * inner + (g - o * span) - off * inner;
}

// ------------------------------------------------------------------- Philox4x32-10 and dropout
// Counter-based random numbers (Salmon et al., SC'11): the word for element i depends only on
// (key, stream, i), never on loop order, chunking or which rank (or GPU thread) computes it.
// Element i takes word (i & 3) of block (i >> 2) under counter {block, block >> 32, stream, 0}.

struct Philox {
  uint32_t c0, c1, c2, c3;
};
// One Philox4x32-10 block under a 64-bit key.
TANDEM_FX Philox philox4x32(uint64_t key, Philox c) {
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = uint64_t{0xD2511F53u} * c.c0;
    const uint64_t p1 = uint64_t{0xCD9E8D57u} * c.c2;
    c = {static_cast<uint32_t>(p1 >> 32) ^ c.c1 ^ k0, static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c.c3 ^ k1, static_cast<uint32_t>(p0)};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}
TANDEM_FX Philox philox_block(uint64_t key, uint64_t block, uint32_t stream) {
  return philox4x32(key,
                    {static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32), stream, 0u});
}
// The 32 random bits of element `index` in stream `stream` under `key`.
TANDEM_FX uint32_t random_bits(uint64_t key, uint64_t index, uint32_t stream = 0) {
  const Philox r = philox_block(key, index >> 2, stream);
  const uint32_t j = static_cast<uint32_t>(index & 3);
  return usel(j == 0, r.c0, usel(j == 1, r.c1, usel(j == 2, r.c2, r.c3)));
}
// Uniform in [0, 1) with 24 bits of resolution (exactly representable in f32).
TANDEM_FX float uniform_of(uint32_t word) {
  return static_cast<float>(static_cast<int32_t>(word >> 8)) * 0x1p-24f;
}

// Dropout: element x is kept when its uniform is >= p, and then scaled by 1 / (1 - p) (`scale`,
// computed in double and rounded to f32 once, by dropout_scale). `word` is the element's
// random_bits(seed, global flat index), so every slicing and chunking draws the same mask.
TANDEM_FX float dropout_scale(double p) { return static_cast<float>(1.0 / (1.0 - p)); }
TANDEM_FX bool dropout_keep_word(uint32_t word, float p) { return uniform_of(word) >= p; }
TANDEM_FX float dropout_word(float x, uint32_t word, float p, float scale) {
  return from_bits(bits(x * scale) & mask(dropout_keep_word(word, p)));
}
TANDEM_FX float dropout(float x, uint64_t seed, uint64_t index, float p, float scale) {
  return dropout_word(x, random_bits(seed, index), p, scale);
}

#if !defined(__CUDACC__)
// Philox blocks block0 .. block0 + count - 1 (stream `stream`) into words, four per block:
// words[4 * b + w] is word w of block block0 + b. Whole groups of 8 blocks are written, so
// `words` must have room for count rounded up to 8 blocks. On AVX2 eight blocks run in the
// 32-bit lanes of one register (vpmuludq on the even and odd lanes, high and low halves blended
// back); elsewhere a loop over philox_block. For dropout masks and other long runs of
// consecutive indices: one block serves four elements.
inline void philox_blocks(uint32_t* __restrict words, uint64_t key, uint64_t block0, int64_t count,
                          uint32_t stream) {
#if defined(__AVX2__)
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53u), m1 = _mm256_set1_epi64x(0xCD9E8D57u);
  for (int64_t b = 0; b < count; b += 8) {
    alignas(32) uint32_t lo[8], hi[8];
    for (int j = 0; j < 8; ++j) {
      const uint64_t block = block0 + static_cast<uint64_t>(b + j);
      lo[j] = static_cast<uint32_t>(block);
      hi[j] = static_cast<uint32_t>(block >> 32);
    }
    __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo));
    __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi));
    __m256i c2 = _mm256_set1_epi32(static_cast<int>(stream)), c3 = _mm256_setzero_si256();
    uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
#pragma GCC unroll 10
    for (int round = 0; round < 10; ++round) {
      // 32 x 32 -> 64-bit products of the even lanes, then of the odd lanes shifted down.
      const __m256i e0 = _mm256_mul_epu32(c0, m0),
                    o0 = _mm256_mul_epu32(_mm256_srli_epi64(c0, 32), m0);
      const __m256i e1 = _mm256_mul_epu32(c2, m1),
                    o1 = _mm256_mul_epu32(_mm256_srli_epi64(c2, 32), m1);
      const __m256i hi0 = _mm256_blend_epi32(_mm256_srli_epi64(e0, 32), o0, 0xAA);
      const __m256i lo0 = _mm256_blend_epi32(e0, _mm256_slli_epi64(o0, 32), 0xAA);
      const __m256i hi1 = _mm256_blend_epi32(_mm256_srli_epi64(e1, 32), o1, 0xAA);
      const __m256i lo1 = _mm256_blend_epi32(e1, _mm256_slli_epi64(o1, 32), 0xAA);
      // philox4x32's round, lane-wise.
      c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
      c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
      c1 = lo1;
      c3 = lo0;
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    // Words by lane (c0..c3 of blocks b..b+7) to words by element (block-major).
    const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
    const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
    const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    __m256i* o = reinterpret_cast<__m256i*>(words + 4 * b);
    _mm256_storeu_si256(o + 0, _mm256_permute2x128_si256(u0, u1, 0x20));
    _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(u2, u3, 0x20));
    _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(u0, u1, 0x31));
    _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(u2, u3, 0x31));
  }
#else
  for (int64_t b = 0; b < count; ++b) {
    const Philox r = philox_block(key, block0 + static_cast<uint64_t>(b), stream);
    words[4 * b + 0] = r.c0;
    words[4 * b + 1] = r.c1;
    words[4 * b + 2] = r.c2;
    words[4 * b + 3] = r.c3;
  }
#endif
}
#endif

}  // namespace tandem::fx

// ---- the program's constants
#define TANDEM_ACC_SLOTS 8
#define TDM_NSYMS 1

// ---- codegen/runtime/cuda_prefix.cuh
// The prefix of every emitted CUDA program, after the ABI and core/formulas.h: host state, launch
// helpers and the device helpers the step functions call, and the declarations of what the
// emitted plan defines (its tables, tandem_run). The emitted program defines TDM_NSYMS (the
// program's symbol count) before this text; cmake/embed_text.cmake drops the quoted includes,
// whose text the program pastes before it.

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#ifndef TDM_NSYMS
#define TDM_NSYMS 1  // compiled on its own, without a plan
#endif

namespace fx = tandem::fx;

#define TDM_THREADS 256
#define TDM_MAX_RANK 8
#define TDM_MAX_BLOCKS 4096

// The symbols' extents, as kernels receive them (by value).
static const int tdm_nsyms_used = TDM_NSYMS;
struct tdm_syms {
  int64_t v[TDM_NSYMS < 1 ? 1 : TDM_NSYMS];
};

// ---- host state: one per rank
struct tdm_host {
  const tandem_args* args = nullptr;
  ncclComm_t world = nullptr;  // every rank: transfers between groups
  ncclComm_t comm = nullptr;   // this rank's group: collectives
  int world_rank = 0, world_size = 1, group = 0, group_size = 1, group_rank = 0;
  cudaStream_t compute = nullptr;  // kernels and GEMMs
  cudaStream_t wire = nullptr;     // NCCL
  cublasHandle_t blas = nullptr;
  std::vector<cudaEvent_t>
      events;  // a ring, made at set-up (cudaStreamWaitEvent takes the state at the call)
  size_t next_event = 0;
  std::vector<cudaEvent_t> block_done;  // per pipeline block: its last asynchronous communication
  void* staging = nullptr;              // a collective's whole buffer, for Dim partitions
  size_t staging_bytes = 0;
  int chunks = 4;  // chunks per fused collective (TANDEM_CUDA_CHUNKS)
  bool failed = false;
  char error[1024] = {0};
};

[[maybe_unused]] static tdm_host* tdm_host_of(const tandem_args* a) {
  return static_cast<tdm_host*>(a->host);
}
[[maybe_unused]] static cudaStream_t tdm_stream(const tandem_args* a) {
  return tdm_host_of(a)->compute;
}

[[maybe_unused]] static int tdm_fail(tdm_host* h, const std::string& what) {
  if (!h->failed) std::snprintf(h->error, sizeof h->error, "%s", what.c_str());
  h->failed = true;
  return 1;
}
#define TDM_CUDA(a, call)                                                                  \
  do {                                                                                     \
    const cudaError_t e_ = (call);                                                         \
    if (e_ != cudaSuccess)                                                                 \
      return tdm_fail(tdm_host_of(a), std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)
[[maybe_unused]] static int tdm_launched(const tandem_args* a, const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    return tdm_fail(tdm_host_of(a),
                    std::string("launching ") + what + ": " + cudaGetErrorString(e));
  return 0;
}

// Blocks for n items, grid-stride beyond TDM_MAX_BLOCKS.
[[maybe_unused]] static unsigned tdm_blocks(int64_t n) {
  const int64_t b = (n + TDM_THREADS - 1) / TDM_THREADS;
  return static_cast<unsigned>(b < 1 ? 1 : (b > TDM_MAX_BLOCKS ? TDM_MAX_BLOCKS : b));
}
[[maybe_unused]] static bool tdm_aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}
[[maybe_unused]] static tdm_syms tdm_syms_of(const tandem_args* a) {
  tdm_syms s{};
  for (int i = 0; i < static_cast<int>(sizeof s.v / sizeof s.v[0]); ++i)
    s.v[i] = i < tdm_nsyms_used ? a->sym[i] : 0;
  return s;
}
// A row-sliced block value's rows on this rank: its part of each block's rows, summed.
[[maybe_unused]] static int64_t tdm_block_rows(int64_t rows, int64_t blocks, int64_t p, int64_t r) {
  int64_t mine = 0;
  for (int64_t b = 0; b < blocks; ++b)
    mine += fx::part_count(fx::part_count(rows, blocks, b), p, r);
  return mine;
}

// A loop's domain: per dim, the first index, the count and the dim's extent.
struct tdm_box {
  int64_t lo[TDM_MAX_RANK], cnt[TDM_MAX_RANK], ext[TDM_MAX_RANK];
  int rank;
};
// The global flat index of flat element t of the box (unrolled: no local memory for the box).
__device__ __forceinline__ int64_t tdm_box_index(const tdm_box& b, int64_t t) {
  int64_t g = 0, mul = 1;
#pragma unroll
  for (int i = TDM_MAX_RANK - 1; i >= 0; --i)
    if (i < b.rank) {
      g += (b.lo[i] + t % b.cnt[i]) * mul;
      t /= b.cnt[i];
      mul *= b.ext[i];
    }
  return g;
}

// 16-byte vector loads and stores of V consecutive elements (p 16-byte aligned).
template <int V>
__device__ __forceinline__ void tdm_vload(const float* p, float (&x)[V]) {
#pragma unroll
  for (int j = 0; j < V; j += 4) {
    const float4 w = *reinterpret_cast<const float4*>(p + j);
    x[j] = w.x;
    x[j + 1] = w.y;
    x[j + 2] = w.z;
    x[j + 3] = w.w;
  }
}
template <int V>
__device__ __forceinline__ void tdm_vstore(float* p, const float (&x)[V]) {
#pragma unroll
  for (int j = 0; j < V; j += 4)
    *reinterpret_cast<float4*>(p + j) = make_float4(x[j], x[j + 1], x[j + 2], x[j + 3]);
}
template <int V>
__device__ __forceinline__ void tdm_vload(const uint16_t* p, uint16_t (&x)[V]) {
#pragma unroll
  for (int j = 0; j < V; j += 8) {
    const uint4 w = *reinterpret_cast<const uint4*>(p + j);
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      x[j + 2 * q] = static_cast<uint16_t>(u[q]);
      x[j + 2 * q + 1] = static_cast<uint16_t>(u[q] >> 16);
    }
  }
}
template <int V>
__device__ __forceinline__ void tdm_vstore(uint16_t* p, const uint16_t (&x)[V]) {
#pragma unroll
  for (int j = 0; j < V; j += 8) {
    uint32_t u[4];
#pragma unroll
    for (int q = 0; q < 4; ++q)
      u[q] = static_cast<uint32_t>(x[j + 2 * q]) | (static_cast<uint32_t>(x[j + 2 * q + 1]) << 16);
    *reinterpret_cast<uint4*>(p + j) = make_uint4(u[0], u[1], u[2], u[3]);
  }
}

// Element i of a buffer of dtype code dt (0 f32, 1 bf16, 2 f16), as f32, and back.
__device__ __forceinline__ float tdm_ld(const void* p, int dt, int64_t i) {
  if (dt == 0) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return dt == 1 ? fx::ld_bf16(h) : fx::ld_f16(h);
}
__device__ __forceinline__ void tdm_st(void* p, int dt, int64_t i, float v) {
  if (dt == 0)
    static_cast<float*>(p)[i] = v;
  else
    static_cast<uint16_t*>(p)[i] = dt == 1 ? fx::st_bf16(v) : fx::st_f16(v);
}

// Prod, Max, Min accumulators keep one f32 value in their first double: combined atomically.
__device__ void tdm_atomic_combine(double* slot, float v, int op) {
  unsigned long long* p = reinterpret_cast<unsigned long long*>(slot);
  unsigned long long old = *p, assumed;
  do {
    assumed = old;
    const float cur = static_cast<float>(__longlong_as_double(static_cast<long long>(assumed)));
    const float next = op == 1 ? fx::prod(cur, v) : (op == 2 ? fx::max(cur, v) : fx::min(cur, v));
    old =
        atomicCAS(p, assumed,
                  static_cast<unsigned long long>(__double_as_longlong(static_cast<double>(next))));
  } while (assumed != old);
}
// An accumulator's start: every lane 0 (a sum), or the op's identity in the first.
__global__ void tdm_acc_init(double* acc, float identity) {
  if (threadIdx.x < TANDEM_ACC_SLOTS)
    acc[threadIdx.x] = threadIdx.x == 0 ? static_cast<double>(identity) : 0.0;
}
// A sum's lanes added in order 0..7 and rounded once (else the f32 value), into the slot's first
// float.
__global__ void tdm_finish_lanes(double* acc, int sum) {
  double s = 0.0;
  if (sum) {
    for (int j = 0; j < TANDEM_ACC_SLOTS; ++j) s += acc[j];
  } else {
    s = acc[0];
  }
  *reinterpret_cast<float*>(acc) = static_cast<float>(s);
}
// out[i] = in[i] (or its square root) rounded to out's dtype.
__global__ void tdm_store_f32(void* out, int dt, const float* in, int64_t n, int take_sqrt) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    tdm_st(out, dt, i, take_sqrt ? fx::sqrt(in[i]) : in[i]);
}
// A rows x cols matrix (leading dimension ld on the 16-bit side) widened to packed f32, and back.
__global__ void tdm_widen2d(float* dst, const void* src, int dt, int64_t rows, int64_t cols,
                            int64_t ld) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < rows * cols;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[e] = tdm_ld(src, dt, (e / cols) * ld + e % cols);
}
__global__ void tdm_narrow2d(void* dst, int dt, const float* src, int64_t rows, int64_t cols,
                             int64_t ld) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < rows * cols;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    tdm_st(dst, dt, (e / cols) * ld + e % cols, src[e]);
}
__global__ void tdm_fill2d(float* p, int64_t rows, int64_t cols, int64_t ld, float v) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < rows * cols;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[(e / cols) * ld + e % cols] = v;
}

// What main() checks: this rank's stored piece of a stage (an input to load, or a result to
// compare).
struct tdm_item {
  int stage;
  int want;  // 0: an input, loaded before the run; 1: compared after it
  int dtype;
  void* ptr;
  int64_t elems;
};
[[maybe_unused]] static bool tdm_mine(const tandem_args* a, int stage);

// ---- what the emitted plan defines after its steps, for the runtime and main()
extern "C" int tandem_run(const tandem_args* a);
extern "C" int64_t tandem_scratch_elems(const tandem_args* a);
extern const int tdm_nstages, tdm_groups, tdm_nsyms;
extern const char* const tdm_sym_names[];
extern const char* const tdm_plan_name;
extern const char* const tdm_program_name;
// Per stage: the buffer's owner (-1: none), the group (-1: every group), the dtype code, the kind
// (1 input, 2 scalar, 0 other) and the name.
extern const int tdm_owner[], tdm_group_of[], tdm_dtype_of[], tdm_kind_of[];
extern const char* const tdm_stage_name[];
// Elements of buffer `id` on this rank (-1: not an owned buffer).
int64_t tdm_buffer_elems(const tandem_args* a, int id);
// This rank's inputs to load and results to compare.
void tdm_check_items(const tandem_args* a, std::vector<tdm_item>& items);

// Plan 'AR-C' of program 'adam', as lowered:
//   plan AR-C of program adam
//   steps:
//      0. allreduce.sum g -> g_sum
//      1. loop over [N]
//           %12 = cast(g_sum) : f32[N] Replicated
//      2. loop over [N]
//           g1 = mul(grad_scale, %12) : f32[N] Replicated
//      3. loop over [N]
//           %14 = mul(beta1, m) : f32[N] Replicated
//      4. loop over []
//           %16 = sub(%15, beta1) : f32[] Replicated
//      5. loop over [N]
//           %17 = mul(%16, g1) : f32[N] Replicated
//      6. loop over [N]
//           %18 = add(%14, %17) : f32[N] Replicated
//      7. loop over [N]
//           %20 = mul(beta2, v) : f32[N] Replicated
//      8. loop over []
//           %22 = sub(%21, beta2) : f32[] Replicated
//      9. loop over [N]
//           %23 = mul(%22, g1) : f32[N] Replicated
//     10. loop over [N]
//           %24 = mul(%23, g1) : f32[N] Replicated
//     11. loop over [N]
//           %25 = add(%20, %24) : f32[N] Replicated
//     12. loop over []
//           %27 = pow(beta1, step) : f32[] Replicated
//           bc1 = sub(%28, %27) : f32[] Replicated
//           %30 = pow(beta2, step) : f32[] Replicated
//           bc2 = sub(%31, %30) : f32[] Replicated
//     13. loop over [N]
//           mhat = div(m1, bc1) : f32[N] Replicated
//     14. loop over [N]
//           vhat = div(v1, bc2) : f32[N] Replicated
//     15. loop over [N]
//           %35 = mul(weight_decay, w) : f32[N] Replicated
//     16. loop over [N]
//           %36 = sqrt(vhat) : f32[N] Replicated
//     17. loop over [N]
//           %37 = add(%36, eps) : f32[N] Replicated
//     18. loop over [N]
//           %38 = div(mhat, %37) : f32[N] Replicated
//     19. loop over [N]
//           r = add(%38, %35) : f32[N] Replicated
//     20. loop over [N]
//           %40 = mul(lr, r) : f32[N] Replicated
//     21. loop over [N]
//           %41 = sub(w, %40) : f32[N] Replicated
//   stored per rank:
//     lr             f32[] Replicated           full         (scalar)
//     beta1          f32[] Replicated           full         (scalar)
//     beta2          f32[] Replicated           full         (scalar)
//     eps            f32[] Replicated           full         (scalar)
//     weight_decay   f32[] Replicated           full         (scalar)
//     step           f32[] Replicated           full         (scalar)
//     grad_scale     f32[] Replicated           full         (scalar)
//     g              bf16[N] Local              full         (input)
//     w              f32[N] Replicated          full         (input, updated in place)
//     m              f32[N] Replicated          full         (input, updated in place)
//     v              f32[N] Replicated          full         (input, updated in place)
//     g_sum          bf16[N] Replicated         full
//     %12            f32[N] Replicated          full
//     g1             f32[N] Replicated          full
//     %14            f32[N] Replicated          full
//     %16            f32[] Replicated           full
//     %17            f32[N] Replicated          full
//     %18            f32[N] Replicated          full         (in m's buffer)
//     m1             f32[N] Replicated          full         (in m's buffer)
//     %20            f32[N] Replicated          full
//     %22            f32[] Replicated           full
//     %23            f32[N] Replicated          full
//     %24            f32[N] Replicated          full
//     %25            f32[N] Replicated          full         (in v's buffer)
//     v1             f32[N] Replicated          full         (in v's buffer)
//     %27            f32[] Replicated           full
//     bc1            f32[] Replicated           full
//     %30            f32[] Replicated           full
//     bc2            f32[] Replicated           full
//     mhat           f32[N] Replicated          full
//     vhat           f32[N] Replicated          full
//     %35            f32[N] Replicated          full
//     %36            f32[N] Replicated          full
//     %37            f32[N] Replicated          full
//     %38            f32[N] Replicated          full
//     r              f32[N] Replicated          full
//     %40            f32[N] Replicated          full
//     %41            f32[N] Replicated          full         (in w's buffer)
//     w1             f32[N] Replicated          full         (in w's buffer)

static int coll0(const tandem_args* a, [[maybe_unused]] const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tandem_collective c;
  std::memset(&c, 0, sizeof c);
  if (S0 > 0 && (void*)(static_cast<uint16_t*>(a->buf[11]) + (int64_t{0})) !=
                    (void*)(static_cast<uint16_t*>(a->buf[7]) + (int64_t{0})))
    TDM_CUDA(a,
             cudaMemcpyAsync((static_cast<uint16_t*>(a->buf[11]) + (int64_t{0})),
                             (static_cast<uint16_t*>(a->buf[7]) + (int64_t{0})),
                             static_cast<size_t>(S0) * 2, cudaMemcpyDeviceToDevice, tdm_stream(a)));
  c.send = (static_cast<uint16_t*>(a->buf[11]) + (int64_t{0}));
  c.step = 0;
  c.kind = 0;
  c.op = 0;
  c.dtype = 1;
  c.root = 0;
  c.async = 0;
  c.carry = 0;
  c.outer = int64_t{1};
  c.rows = S0;
  c.inner = int64_t{1};
  c.index_base = int64_t{0};
  c.hook = nullptr;
  c.block.index = -1;
  return a->collective(a->host, &c);
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop1_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK, tdm_syms sy,
            int vec, const uint16_t* __restrict__ q0, float* __restrict__ q1) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 8 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 8;
    uint16_t x0[8];
    tdm_vload<8>(q0 + (g0 + t0), x0);
    float x1[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_bf16(x0[j]);
      const float v12 = fx::cast(m0);  // %12
      x1[j] = fx::st_f32(v12);
    }
    tdm_vstore<8>(q1 + (g0 + t0), x1);
  }
  for (int64_t t = nv * 8 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_bf16(q0[(g)]);
    const float v12 = fx::cast(m0);  // %12
    q1[(g)] = fx::st_f32(v12);
  }
}

static int loop1(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<uint16_t*>(a->buf[11]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[12]) + (g0));
  loop1_k<<<tdm_blocks((n + 8 - 1) / 8), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<uint16_t*>(a->buf[11]), static_cast<float*>(a->buf[12]));
  return tdm_launched(a, "loop1");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop2_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK, tdm_syms sy,
            int vec, const float* __restrict__ q0, float* __restrict__ q1,
            const float* __restrict__ sp6) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const float s6 = fx::ld_f32(sp6[0]);          // grad_scale
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 4;
    float x0[4];
    tdm_vload<4>(q0 + (g0 + t0), x0);
    float x1[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_f32(x0[j]);
      const float v13 = fx::mul(s6, m0);  // g1
      x1[j] = fx::st_f32(v13);
    }
    tdm_vstore<4>(q1 + (g0 + t0), x1);
  }
  for (int64_t t = nv * 4 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_f32(q0[(g)]);
    const float v13 = fx::mul(s6, m0);  // g1
    q1[(g)] = fx::st_f32(v13);
  }
}

static int loop2(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<float*>(a->buf[12]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[13]) + (g0));
  loop2_k<<<tdm_blocks((n + 4 - 1) / 4), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[12]), static_cast<float*>(a->buf[13]),
      static_cast<const float*>(a->buf[6]));
  return tdm_launched(a, "loop2");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop3_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK, tdm_syms sy,
            int vec, const float* __restrict__ q0, float* __restrict__ q1,
            const float* __restrict__ sp1) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const float s1 = fx::ld_f32(sp1[0]);          // beta1
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 4;
    float x0[4];
    tdm_vload<4>(q0 + (g0 + t0), x0);
    float x1[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_f32(x0[j]);
      const float v14 = fx::mul(s1, m0);  // %14
      x1[j] = fx::st_f32(v14);
    }
    tdm_vstore<4>(q1 + (g0 + t0), x1);
  }
  for (int64_t t = nv * 4 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_f32(q0[(g)]);
    const float v14 = fx::mul(s1, m0);  // %14
    q1[(g)] = fx::st_f32(v14);
  }
}

static int loop3(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<float*>(a->buf[9]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[14]) + (g0));
  loop3_k<<<tdm_blocks((n + 4 - 1) / 4), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[9]), static_cast<float*>(a->buf[14]),
      static_cast<const float*>(a->buf[1]));
  return tdm_launched(a, "loop3");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop4_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK, tdm_syms sy,
            int vec, float* __restrict__ q0, const float* __restrict__ sp1) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const float s1 = fx::ld_f32(sp1[0]);          // beta1
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (first == 0) {
    const int64_t t = 0, g = 0;
    (void)t;
    (void)g;
    const float v16 = fx::sub(0x1p+0f, s1);  // %16
    q0[(g)] = fx::st_f32(v16);
  }
}

static int loop4(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  const int64_t n = 1, g0 = 0;
  const int vec = 1;
  loop4_k<<<1, 1, 0, tdm_stream(a)>>>(n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK,
                                      tdm_syms_of(a), vec, static_cast<float*>(a->buf[16]),
                                      static_cast<const float*>(a->buf[1]));
  return tdm_launched(a, "loop4");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop5_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK, tdm_syms sy,
            int vec, const float* __restrict__ q0, float* __restrict__ q1,
            const float* __restrict__ sp16) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const float s16 = fx::ld_f32(sp16[0]);        // %16
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 4;
    float x0[4];
    tdm_vload<4>(q0 + (g0 + t0), x0);
    float x1[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_f32(x0[j]);
      const float v17 = fx::mul(s16, m0);  // %17
      x1[j] = fx::st_f32(v17);
    }
    tdm_vstore<4>(q1 + (g0 + t0), x1);
  }
  for (int64_t t = nv * 4 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_f32(q0[(g)]);
    const float v17 = fx::mul(s16, m0);  // %17
    q1[(g)] = fx::st_f32(v17);
  }
}

static int loop5(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<float*>(a->buf[13]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[17]) + (g0));
  loop5_k<<<tdm_blocks((n + 4 - 1) / 4), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[13]), static_cast<float*>(a->buf[17]),
      static_cast<const float*>(a->buf[16]));
  return tdm_launched(a, "loop5");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop6_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK, tdm_syms sy,
            int vec, const float* __restrict__ q0, const float* __restrict__ q1,
            float* __restrict__ q2) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 4;
    float x0[4];
    tdm_vload<4>(q0 + (g0 + t0), x0);
    float x1[4];
    tdm_vload<4>(q1 + (g0 + t0), x1);
    float x2[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_f32(x0[j]);
      const float m1 = fx::ld_f32(x1[j]);
      const float v18 = fx::add(m0, m1);  // %18
      x2[j] = fx::st_f32(v18);
    }
    tdm_vstore<4>(q2 + (g0 + t0), x2);
  }
  for (int64_t t = nv * 4 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_f32(q0[(g)]);
    const float m1 = fx::ld_f32(q1[(g)]);
    const float v18 = fx::add(m0, m1);  // %18
    q2[(g)] = fx::st_f32(v18);
  }
}

static int loop6(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<float*>(a->buf[14]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[17]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[9]) + (g0));
  loop6_k<<<tdm_blocks((n + 4 - 1) / 4), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[14]), static_cast<float*>(a->buf[17]),
      static_cast<float*>(a->buf[9]));
  return tdm_launched(a, "loop6");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop7_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK, tdm_syms sy,
            int vec, const float* __restrict__ q0, float* __restrict__ q1,
            const float* __restrict__ sp2) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const float s2 = fx::ld_f32(sp2[0]);          // beta2
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 4;
    float x0[4];
    tdm_vload<4>(q0 + (g0 + t0), x0);
    float x1[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_f32(x0[j]);
      const float v20 = fx::mul(s2, m0);  // %20
      x1[j] = fx::st_f32(v20);
    }
    tdm_vstore<4>(q1 + (g0 + t0), x1);
  }
  for (int64_t t = nv * 4 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_f32(q0[(g)]);
    const float v20 = fx::mul(s2, m0);  // %20
    q1[(g)] = fx::st_f32(v20);
  }
}

static int loop7(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<float*>(a->buf[10]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[20]) + (g0));
  loop7_k<<<tdm_blocks((n + 4 - 1) / 4), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[10]), static_cast<float*>(a->buf[20]),
      static_cast<const float*>(a->buf[2]));
  return tdm_launched(a, "loop7");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop8_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK, tdm_syms sy,
            int vec, float* __restrict__ q0, const float* __restrict__ sp2) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const float s2 = fx::ld_f32(sp2[0]);          // beta2
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (first == 0) {
    const int64_t t = 0, g = 0;
    (void)t;
    (void)g;
    const float v22 = fx::sub(0x1p+0f, s2);  // %22
    q0[(g)] = fx::st_f32(v22);
  }
}

static int loop8(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  const int64_t n = 1, g0 = 0;
  const int vec = 1;
  loop8_k<<<1, 1, 0, tdm_stream(a)>>>(n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK,
                                      tdm_syms_of(a), vec, static_cast<float*>(a->buf[22]),
                                      static_cast<const float*>(a->buf[2]));
  return tdm_launched(a, "loop8");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop9_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK, tdm_syms sy,
            int vec, const float* __restrict__ q0, float* __restrict__ q1,
            const float* __restrict__ sp22) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const float s22 = fx::ld_f32(sp22[0]);        // %22
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 4;
    float x0[4];
    tdm_vload<4>(q0 + (g0 + t0), x0);
    float x1[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_f32(x0[j]);
      const float v23 = fx::mul(s22, m0);  // %23
      x1[j] = fx::st_f32(v23);
    }
    tdm_vstore<4>(q1 + (g0 + t0), x1);
  }
  for (int64_t t = nv * 4 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_f32(q0[(g)]);
    const float v23 = fx::mul(s22, m0);  // %23
    q1[(g)] = fx::st_f32(v23);
  }
}

static int loop9(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<float*>(a->buf[13]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[23]) + (g0));
  loop9_k<<<tdm_blocks((n + 4 - 1) / 4), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[13]), static_cast<float*>(a->buf[23]),
      static_cast<const float*>(a->buf[22]));
  return tdm_launched(a, "loop9");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop10_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK,
             tdm_syms sy, int vec, const float* __restrict__ q0, const float* __restrict__ q1,
             float* __restrict__ q2) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 4;
    float x0[4];
    tdm_vload<4>(q0 + (g0 + t0), x0);
    float x1[4];
    tdm_vload<4>(q1 + (g0 + t0), x1);
    float x2[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_f32(x0[j]);
      const float m1 = fx::ld_f32(x1[j]);
      const float v24 = fx::mul(m0, m1);  // %24
      x2[j] = fx::st_f32(v24);
    }
    tdm_vstore<4>(q2 + (g0 + t0), x2);
  }
  for (int64_t t = nv * 4 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_f32(q0[(g)]);
    const float m1 = fx::ld_f32(q1[(g)]);
    const float v24 = fx::mul(m0, m1);  // %24
    q2[(g)] = fx::st_f32(v24);
  }
}

static int loop10(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<float*>(a->buf[23]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[13]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[24]) + (g0));
  loop10_k<<<tdm_blocks((n + 4 - 1) / 4), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[23]), static_cast<float*>(a->buf[13]),
      static_cast<float*>(a->buf[24]));
  return tdm_launched(a, "loop10");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop11_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK,
             tdm_syms sy, int vec, const float* __restrict__ q0, const float* __restrict__ q1,
             float* __restrict__ q2) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 4;
    float x0[4];
    tdm_vload<4>(q0 + (g0 + t0), x0);
    float x1[4];
    tdm_vload<4>(q1 + (g0 + t0), x1);
    float x2[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_f32(x0[j]);
      const float m1 = fx::ld_f32(x1[j]);
      const float v25 = fx::add(m0, m1);  // %25
      x2[j] = fx::st_f32(v25);
    }
    tdm_vstore<4>(q2 + (g0 + t0), x2);
  }
  for (int64_t t = nv * 4 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_f32(q0[(g)]);
    const float m1 = fx::ld_f32(q1[(g)]);
    const float v25 = fx::add(m0, m1);  // %25
    q2[(g)] = fx::st_f32(v25);
  }
}

static int loop11(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<float*>(a->buf[20]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[24]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[10]) + (g0));
  loop11_k<<<tdm_blocks((n + 4 - 1) / 4), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[20]), static_cast<float*>(a->buf[24]),
      static_cast<float*>(a->buf[10]));
  return tdm_launched(a, "loop11");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop12_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK,
             tdm_syms sy, int vec, float* __restrict__ q0, float* __restrict__ q1,
             float* __restrict__ q2, float* __restrict__ q3, const float* __restrict__ sp1,
             const float* __restrict__ sp5, const float* __restrict__ sp2) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const float s1 = fx::ld_f32(sp1[0]);          // beta1
  const float s5 = fx::ld_f32(sp5[0]);          // step
  const float s2 = fx::ld_f32(sp2[0]);          // beta2
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (first == 0) {
    const int64_t t = 0, g = 0;
    (void)t;
    (void)g;
    const float v27 = fx::pow(s1, s5);        // %27
    const float v29 = fx::sub(0x1p+0f, v27);  // bc1
    const float v30 = fx::pow(s2, s5);        // %30
    const float v32 = fx::sub(0x1p+0f, v30);  // bc2
    q0[(g)] = fx::st_f32(v27);
    q1[(g)] = fx::st_f32(v29);
    q2[(g)] = fx::st_f32(v30);
    q3[(g)] = fx::st_f32(v32);
  }
}

static int loop12(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  const int64_t n = 1, g0 = 0;
  const int vec = 1;
  loop12_k<<<1, 1, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[27]), static_cast<float*>(a->buf[29]),
      static_cast<float*>(a->buf[30]), static_cast<float*>(a->buf[32]),
      static_cast<const float*>(a->buf[1]), static_cast<const float*>(a->buf[5]),
      static_cast<const float*>(a->buf[2]));
  return tdm_launched(a, "loop12");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop13_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK,
             tdm_syms sy, int vec, const float* __restrict__ q0, float* __restrict__ q1,
             const float* __restrict__ sp29) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const float s29 = fx::ld_f32(sp29[0]);        // bc1
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 4;
    float x0[4];
    tdm_vload<4>(q0 + (g0 + t0), x0);
    float x1[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_f32(x0[j]);
      const float v33 = fx::div(m0, s29);  // mhat
      x1[j] = fx::st_f32(v33);
    }
    tdm_vstore<4>(q1 + (g0 + t0), x1);
  }
  for (int64_t t = nv * 4 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_f32(q0[(g)]);
    const float v33 = fx::div(m0, s29);  // mhat
    q1[(g)] = fx::st_f32(v33);
  }
}

static int loop13(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<float*>(a->buf[9]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[33]) + (g0));
  loop13_k<<<tdm_blocks((n + 4 - 1) / 4), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[9]), static_cast<float*>(a->buf[33]),
      static_cast<const float*>(a->buf[29]));
  return tdm_launched(a, "loop13");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop14_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK,
             tdm_syms sy, int vec, const float* __restrict__ q0, float* __restrict__ q1,
             const float* __restrict__ sp32) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const float s32 = fx::ld_f32(sp32[0]);        // bc2
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 4;
    float x0[4];
    tdm_vload<4>(q0 + (g0 + t0), x0);
    float x1[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_f32(x0[j]);
      const float v34 = fx::div(m0, s32);  // vhat
      x1[j] = fx::st_f32(v34);
    }
    tdm_vstore<4>(q1 + (g0 + t0), x1);
  }
  for (int64_t t = nv * 4 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_f32(q0[(g)]);
    const float v34 = fx::div(m0, s32);  // vhat
    q1[(g)] = fx::st_f32(v34);
  }
}

static int loop14(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<float*>(a->buf[10]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[34]) + (g0));
  loop14_k<<<tdm_blocks((n + 4 - 1) / 4), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[10]), static_cast<float*>(a->buf[34]),
      static_cast<const float*>(a->buf[32]));
  return tdm_launched(a, "loop14");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop15_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK,
             tdm_syms sy, int vec, const float* __restrict__ q0, float* __restrict__ q1,
             const float* __restrict__ sp4) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const float s4 = fx::ld_f32(sp4[0]);          // weight_decay
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 4;
    float x0[4];
    tdm_vload<4>(q0 + (g0 + t0), x0);
    float x1[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_f32(x0[j]);
      const float v35 = fx::mul(s4, m0);  // %35
      x1[j] = fx::st_f32(v35);
    }
    tdm_vstore<4>(q1 + (g0 + t0), x1);
  }
  for (int64_t t = nv * 4 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_f32(q0[(g)]);
    const float v35 = fx::mul(s4, m0);  // %35
    q1[(g)] = fx::st_f32(v35);
  }
}

static int loop15(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<float*>(a->buf[8]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[35]) + (g0));
  loop15_k<<<tdm_blocks((n + 4 - 1) / 4), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[8]), static_cast<float*>(a->buf[35]),
      static_cast<const float*>(a->buf[4]));
  return tdm_launched(a, "loop15");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop16_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK,
             tdm_syms sy, int vec, const float* __restrict__ q0, float* __restrict__ q1) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 4;
    float x0[4];
    tdm_vload<4>(q0 + (g0 + t0), x0);
    float x1[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_f32(x0[j]);
      const float v36 = fx::sqrt(m0);  // %36
      x1[j] = fx::st_f32(v36);
    }
    tdm_vstore<4>(q1 + (g0 + t0), x1);
  }
  for (int64_t t = nv * 4 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_f32(q0[(g)]);
    const float v36 = fx::sqrt(m0);  // %36
    q1[(g)] = fx::st_f32(v36);
  }
}

static int loop16(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<float*>(a->buf[34]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[36]) + (g0));
  loop16_k<<<tdm_blocks((n + 4 - 1) / 4), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[34]), static_cast<float*>(a->buf[36]));
  return tdm_launched(a, "loop16");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop17_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK,
             tdm_syms sy, int vec, const float* __restrict__ q0, float* __restrict__ q1,
             const float* __restrict__ sp3) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const float s3 = fx::ld_f32(sp3[0]);          // eps
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 4;
    float x0[4];
    tdm_vload<4>(q0 + (g0 + t0), x0);
    float x1[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_f32(x0[j]);
      const float v37 = fx::add(m0, s3);  // %37
      x1[j] = fx::st_f32(v37);
    }
    tdm_vstore<4>(q1 + (g0 + t0), x1);
  }
  for (int64_t t = nv * 4 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_f32(q0[(g)]);
    const float v37 = fx::add(m0, s3);  // %37
    q1[(g)] = fx::st_f32(v37);
  }
}

static int loop17(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<float*>(a->buf[36]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[37]) + (g0));
  loop17_k<<<tdm_blocks((n + 4 - 1) / 4), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[36]), static_cast<float*>(a->buf[37]),
      static_cast<const float*>(a->buf[3]));
  return tdm_launched(a, "loop17");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop18_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK,
             tdm_syms sy, int vec, const float* __restrict__ q0, const float* __restrict__ q1,
             float* __restrict__ q2) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 4;
    float x0[4];
    tdm_vload<4>(q0 + (g0 + t0), x0);
    float x1[4];
    tdm_vload<4>(q1 + (g0 + t0), x1);
    float x2[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_f32(x0[j]);
      const float m1 = fx::ld_f32(x1[j]);
      const float v38 = fx::div(m0, m1);  // %38
      x2[j] = fx::st_f32(v38);
    }
    tdm_vstore<4>(q2 + (g0 + t0), x2);
  }
  for (int64_t t = nv * 4 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_f32(q0[(g)]);
    const float m1 = fx::ld_f32(q1[(g)]);
    const float v38 = fx::div(m0, m1);  // %38
    q2[(g)] = fx::st_f32(v38);
  }
}

static int loop18(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<float*>(a->buf[33]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[37]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[38]) + (g0));
  loop18_k<<<tdm_blocks((n + 4 - 1) / 4), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[33]), static_cast<float*>(a->buf[37]),
      static_cast<float*>(a->buf[38]));
  return tdm_launched(a, "loop18");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop19_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK,
             tdm_syms sy, int vec, const float* __restrict__ q0, const float* __restrict__ q1,
             float* __restrict__ q2) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 4;
    float x0[4];
    tdm_vload<4>(q0 + (g0 + t0), x0);
    float x1[4];
    tdm_vload<4>(q1 + (g0 + t0), x1);
    float x2[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_f32(x0[j]);
      const float m1 = fx::ld_f32(x1[j]);
      const float v39 = fx::add(m0, m1);  // r
      x2[j] = fx::st_f32(v39);
    }
    tdm_vstore<4>(q2 + (g0 + t0), x2);
  }
  for (int64_t t = nv * 4 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_f32(q0[(g)]);
    const float m1 = fx::ld_f32(q1[(g)]);
    const float v39 = fx::add(m0, m1);  // r
    q2[(g)] = fx::st_f32(v39);
  }
}

static int loop19(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<float*>(a->buf[38]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[35]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[39]) + (g0));
  loop19_k<<<tdm_blocks((n + 4 - 1) / 4), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[38]), static_cast<float*>(a->buf[35]),
      static_cast<float*>(a->buf[39]));
  return tdm_launched(a, "loop19");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop20_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK,
             tdm_syms sy, int vec, const float* __restrict__ q0, float* __restrict__ q1,
             const float* __restrict__ sp0) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const float s0 = fx::ld_f32(sp0[0]);          // lr
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 4;
    float x0[4];
    tdm_vload<4>(q0 + (g0 + t0), x0);
    float x1[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_f32(x0[j]);
      const float v40 = fx::mul(s0, m0);  // %40
      x1[j] = fx::st_f32(v40);
    }
    tdm_vstore<4>(q1 + (g0 + t0), x1);
  }
  for (int64_t t = nv * 4 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_f32(q0[(g)]);
    const float v40 = fx::mul(s0, m0);  // %40
    q1[(g)] = fx::st_f32(v40);
  }
}

static int loop20(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<float*>(a->buf[39]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[40]) + (g0));
  loop20_k<<<tdm_blocks((n + 4 - 1) / 4), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[39]), static_cast<float*>(a->buf[40]),
      static_cast<const float*>(a->buf[0]));
  return tdm_launched(a, "loop20");
}

__global__ void __launch_bounds__(TDM_THREADS)
    loop21_k(int64_t n, int64_t g0, tdm_box box, tandem_block bk, int64_t P, int64_t RK,
             tdm_syms sy, int vec, float* __restrict__ q0, const float* __restrict__ q1) {
  [[maybe_unused]] const tandem_block* blk = &bk;
  [[maybe_unused]] const int64_t S0 = sy.v[0];  // N
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  (void)stride;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t nv = vec ? n / 4 : 0;
  for (int64_t w = first; w < nv; w += stride) {
    const int64_t t0 = w * 4;
    float x0[4];
    tdm_vload<4>(q0 + (g0 + t0), x0);
    float x1[4];
    tdm_vload<4>(q1 + (g0 + t0), x1);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int64_t t = t0 + j, g = g0 + t;
      (void)g;
      const float m0 = fx::ld_f32(x0[j]);
      const float m1 = fx::ld_f32(x1[j]);
      const float v41 = fx::sub(m0, m1);  // %41
      x0[j] = fx::st_f32(v41);
    }
    tdm_vstore<4>(q0 + (g0 + t0), x0);
  }
  for (int64_t t = nv * 4 + first; t < n; t += stride) {
    const int64_t g = g0 + t;
    (void)g;
    const float m0 = fx::ld_f32(q0[(g)]);
    const float m1 = fx::ld_f32(q1[(g)]);
    const float v41 = fx::sub(m0, m1);  // %41
    q0[(g)] = fx::st_f32(v41);
  }
}

static int loop21(const tandem_args* a, const tandem_block* blk) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  tdm_box box{};
  box.lo[0] = int64_t{0};
  box.cnt[0] = S0;
  box.ext[0] = S0;
  box.rank = 1;
  int64_t n = 1;
  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];
  if (n <= 0) return 0;
  const int64_t g0 = (int64_t{0} * box.ext[0] + box.lo[0]);
  const int vec = 1 && tdm_aligned16(static_cast<float*>(a->buf[8]) + (g0)) &&
                  tdm_aligned16(static_cast<float*>(a->buf[40]) + (g0));
  loop21_k<<<tdm_blocks((n + 4 - 1) / 4), TDM_THREADS, 0, tdm_stream(a)>>>(
      n, g0, box, blk != nullptr ? *blk : tandem_block{}, P, RK, tdm_syms_of(a), vec,
      static_cast<float*>(a->buf[8]), static_cast<float*>(a->buf[40]));
  return tdm_launched(a, "loop21");
}

// step 0: collective
extern "C" int tandem_step_0(const tandem_args* a) {
  if (a->group != 0) return 0;
  return coll0(a, nullptr);
}

// step 1: loop
extern "C" int tandem_step_1(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop1(a, nullptr);
}

// step 2: loop
extern "C" int tandem_step_2(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop2(a, nullptr);
}

// step 3: loop
extern "C" int tandem_step_3(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop3(a, nullptr);
}

// step 4: loop
extern "C" int tandem_step_4(const tandem_args* a) { return loop4(a, nullptr); }

// step 5: loop
extern "C" int tandem_step_5(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop5(a, nullptr);
}

// step 6: loop
extern "C" int tandem_step_6(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop6(a, nullptr);
}

// step 7: loop
extern "C" int tandem_step_7(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop7(a, nullptr);
}

// step 8: loop
extern "C" int tandem_step_8(const tandem_args* a) { return loop8(a, nullptr); }

// step 9: loop
extern "C" int tandem_step_9(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop9(a, nullptr);
}

// step 10: loop
extern "C" int tandem_step_10(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop10(a, nullptr);
}

// step 11: loop
extern "C" int tandem_step_11(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop11(a, nullptr);
}

// step 12: loop
extern "C" int tandem_step_12(const tandem_args* a) { return loop12(a, nullptr); }

// step 13: loop
extern "C" int tandem_step_13(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop13(a, nullptr);
}

// step 14: loop
extern "C" int tandem_step_14(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop14(a, nullptr);
}

// step 15: loop
extern "C" int tandem_step_15(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop15(a, nullptr);
}

// step 16: loop
extern "C" int tandem_step_16(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop16(a, nullptr);
}

// step 17: loop
extern "C" int tandem_step_17(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop17(a, nullptr);
}

// step 18: loop
extern "C" int tandem_step_18(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop18(a, nullptr);
}

// step 19: loop
extern "C" int tandem_step_19(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop19(a, nullptr);
}

// step 20: loop
extern "C" int tandem_step_20(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop20(a, nullptr);
}

// step 21: loop
extern "C" int tandem_step_21(const tandem_args* a) {
  if (a->group != 0) return 0;
  return loop21(a, nullptr);
}

extern "C" int tandem_run(const tandem_args* a) {
  int rc = 0;
  if ((rc = tandem_step_0(a)) != 0) return rc;
  if ((rc = tandem_step_1(a)) != 0) return rc;
  if ((rc = tandem_step_2(a)) != 0) return rc;
  if ((rc = tandem_step_3(a)) != 0) return rc;
  if ((rc = tandem_step_4(a)) != 0) return rc;
  if ((rc = tandem_step_5(a)) != 0) return rc;
  if ((rc = tandem_step_6(a)) != 0) return rc;
  if ((rc = tandem_step_7(a)) != 0) return rc;
  if ((rc = tandem_step_8(a)) != 0) return rc;
  if ((rc = tandem_step_9(a)) != 0) return rc;
  if ((rc = tandem_step_10(a)) != 0) return rc;
  if ((rc = tandem_step_11(a)) != 0) return rc;
  if ((rc = tandem_step_12(a)) != 0) return rc;
  if ((rc = tandem_step_13(a)) != 0) return rc;
  if ((rc = tandem_step_14(a)) != 0) return rc;
  if ((rc = tandem_step_15(a)) != 0) return rc;
  if ((rc = tandem_step_16(a)) != 0) return rc;
  if ((rc = tandem_step_17(a)) != 0) return rc;
  if ((rc = tandem_step_18(a)) != 0) return rc;
  if ((rc = tandem_step_19(a)) != 0) return rc;
  if ((rc = tandem_step_20(a)) != 0) return rc;
  if ((rc = tandem_step_21(a)) != 0) return rc;
  return 0;
}

extern "C" int64_t tandem_scratch_elems(const tandem_args* a) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  int64_t need = 0;
  return need;
}

extern "C" int tandem_abi_version() { return 3; }

// ---- the plan's tables, for main()
const int tdm_nstages = 43;
const int tdm_groups = 1;
const int tdm_nsyms = 1;
const char* const tdm_sym_names[] = {"N", nullptr};
const char* const tdm_plan_name = "AR-C";
const char* const tdm_program_name = "adam";
const int tdm_owner[] = {0,  1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14,
                         -1, 16, 17, 9,  9,  20, -1, 22, 23, 24, 10, 10, 27, -1, 29,
                         30, -1, 32, 33, 34, 35, 36, 37, 38, 39, 40, 8,  8};
const int tdm_group_of[] = {-1, -1, -1, -1, -1, -1, -1, 0,  0, 0, 0, 0, 0,  0,  0,
                            -1, -1, 0,  0,  0,  0,  -1, -1, 0, 0, 0, 0, -1, -1, -1,
                            -1, -1, -1, 0,  0,  0,  0,  0,  0, 0, 0, 0, 0};
const int tdm_dtype_of[] = {0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                            0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
const int tdm_kind_of[] = {
    2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};  // 1 input, 2 scalar
const char* const tdm_stage_name[] = {
    "lr",  "beta1", "beta2", "eps", "weight_decay", "step", "grad_scale", "g",    "w",
    "m",   "v",     "g_sum", "%12", "g1",           "%14",  "%15",        "%16",  "%17",
    "%18", "m1",    "%20",   "%21", "%22",          "%23",  "%24",        "%25",  "v1",
    "%27", "%28",   "bc1",   "%30", "%31",          "bc2",  "mhat",       "vhat", "%35",
    "%36", "%37",   "%38",   "r",   "%40",          "%41",  "w1"};
int64_t tdm_buffer_elems(const tandem_args* a, int id) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  switch (id) {
    case 0:
      return int64_t{1};  // lr (full)
    case 1:
      return int64_t{1};  // beta1 (full)
    case 2:
      return int64_t{1};  // beta2 (full)
    case 3:
      return int64_t{1};  // eps (full)
    case 4:
      return int64_t{1};  // weight_decay (full)
    case 5:
      return int64_t{1};  // step (full)
    case 6:
      return int64_t{1};  // grad_scale (full)
    case 7:
      return S0;  // g (full)
    case 8:
      return S0;  // w (full)
    case 9:
      return S0;  // m (full)
    case 10:
      return S0;  // v (full)
    case 11:
      return S0;  // g_sum (full)
    case 12:
      return S0;  // %12 (full)
    case 13:
      return S0;  // g1 (full)
    case 14:
      return S0;  // %14 (full)
    case 16:
      return int64_t{1};  // %16 (full)
    case 17:
      return S0;  // %17 (full)
    case 20:
      return S0;  // %20 (full)
    case 22:
      return int64_t{1};  // %22 (full)
    case 23:
      return S0;  // %23 (full)
    case 24:
      return S0;  // %24 (full)
    case 27:
      return int64_t{1};  // %27 (full)
    case 29:
      return int64_t{1};  // bc1 (full)
    case 30:
      return int64_t{1};  // %30 (full)
    case 32:
      return int64_t{1};  // bc2 (full)
    case 33:
      return S0;  // mhat (full)
    case 34:
      return S0;  // vhat (full)
    case 35:
      return S0;  // %35 (full)
    case 36:
      return S0;  // %36 (full)
    case 37:
      return S0;  // %37 (full)
    case 38:
      return S0;  // %38 (full)
    case 39:
      return S0;  // r (full)
    case 40:
      return S0;  // %40 (full)
    default:
      return -1;
  }
}
void tdm_check_items(const tandem_args* a, std::vector<tdm_item>& items) {
  [[maybe_unused]] const int64_t P = a->p, RK = a->r;
  [[maybe_unused]] const int64_t S0 = a->sym[0];  // N
  if (tdm_mine(a, 7))
    items.push_back(
        tdm_item{7, 0, 1, (void*)(static_cast<uint16_t*>(a->buf[7]) + (int64_t{0})), S0});  // g
  if (tdm_mine(a, 8))
    items.push_back(
        tdm_item{8, 0, 0, (void*)(static_cast<float*>(a->buf[8]) + (int64_t{0})), S0});  // w
  if (tdm_mine(a, 9))
    items.push_back(
        tdm_item{9, 0, 0, (void*)(static_cast<float*>(a->buf[9]) + (int64_t{0})), S0});  // m
  if (tdm_mine(a, 10))
    items.push_back(
        tdm_item{10, 0, 0, (void*)(static_cast<float*>(a->buf[10]) + (int64_t{0})), S0});  // v
  if (tdm_mine(a, 8))
    items.push_back(
        tdm_item{8, 1, 0, (void*)(static_cast<float*>(a->buf[8]) + (int64_t{0})), S0});  // w
  if (tdm_mine(a, 9))
    items.push_back(
        tdm_item{9, 1, 0, (void*)(static_cast<float*>(a->buf[9]) + (int64_t{0})), S0});  // m
  if (tdm_mine(a, 10))
    items.push_back(
        tdm_item{10, 1, 0, (void*)(static_cast<float*>(a->buf[10]) + (int64_t{0})), S0});  // v
}

// ---- codegen/runtime/cuda_runtime.cuh
// The runtime of every emitted CUDA program, after the plan's steps and tables: the ABI's
// callbacks (collectives and transfers over NCCL on a communication stream, ordered against the
// compute stream by events; SGEMM by cuBLAS).

#include <string>
#include <vector>

// ---------------------------------------------------------------- runtime: the ABI's callbacks

static bool tdm_mine(const tandem_args* a, int stage) {
  const int g = tdm_group_of[stage];
  return g < 0 || g == a->group;
}

#define TDM_NCCL(h, call)                                                                          \
  do {                                                                                             \
    const ncclResult_t e_ = (call);                                                                \
    if (e_ != ncclSuccess) return tdm_fail(h, std::string(#call) + ": " + ncclGetErrorString(e_)); \
  } while (0)
#define TDM_CUDA_H(h, call)                                                                        \
  do {                                                                                             \
    const cudaError_t e_ = (call);                                                                 \
    if (e_ != cudaSuccess) return tdm_fail(h, std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)

static cudaEvent_t tdm_event(tdm_host* h) { return h->events[h->next_event++ % h->events.size()]; }
// `after` runs what is issued to it next only once what was issued to `before` so far is done.
static int tdm_order(tdm_host* h, cudaStream_t before, cudaStream_t after) {
  const cudaEvent_t e = tdm_event(h);
  TDM_CUDA_H(h, cudaEventRecord(e, before));
  TDM_CUDA_H(h, cudaStreamWaitEvent(after, e, 0));
  return 0;
}
static int tdm_record(tdm_host* h, cudaStream_t s, cudaEvent_t* out) {
  *out = tdm_event(h);
  TDM_CUDA_H(h, cudaEventRecord(*out, s));
  return 0;
}

static ncclDataType_t tdm_nccl_type(int32_t dt) {
  return dt == 0 ? ncclFloat32 : (dt == 1 ? ncclBfloat16 : ncclFloat16);
}
static ncclRedOp_t tdm_nccl_op(int32_t op) {
  return op == 0 ? ncclSum : (op == 1 ? ncclProd : (op == 2 ? ncclMax : ncclMin));
}
static char* tdm_at(void* p, int64_t i, size_t es) {
  return static_cast<char*>(p) + static_cast<size_t>(i) * es;
}

// Chunk [k0, k0 + kn) of every rank's flat part of `send` (n elements) reduced into the part's
// owner: one ncclReduce per owner, grouped into one launch; this rank's goes to `mine`.
static int tdm_reduce_parts(tdm_host* h, const tandem_collective* c, void* send, void* mine,
                            int64_t n, int64_t k0, int64_t kn, size_t es) {
  const int p = h->group_size;
  TDM_NCCL(h, ncclGroupStart());
  for (int q = 0; q < p; ++q) {
    const int64_t off = fx::part_offset(n, p, q), cnt = fx::part_count(n, p, q);
    const int64_t lo = k0 < cnt ? k0 : cnt, m = (cnt - lo) < kn ? (cnt - lo) : kn;
    if (m <= 0) continue;
    char* src = tdm_at(send, off + lo, es);
    char* dst = q == h->group_rank ? tdm_at(mine, lo, es) : src;
    TDM_NCCL(h, ncclReduce(src, dst, static_cast<size_t>(m), tdm_nccl_type(c->dtype),
                           tdm_nccl_op(c->op), q, h->comm, h->wire));
  }
  TDM_NCCL(h, ncclGroupEnd());
  return 0;
}
// Chunk [k0, k0 + kn) of every rank's flat part of `buf` broadcast from its owner, in place.
static int tdm_gather_parts(tdm_host* h, const tandem_collective* c, void* buf, int64_t n,
                            int64_t k0, int64_t kn, size_t es) {
  const int p = h->group_size;
  TDM_NCCL(h, ncclGroupStart());
  for (int q = 0; q < p; ++q) {
    const int64_t off = fx::part_offset(n, p, q), cnt = fx::part_count(n, p, q);
    const int64_t lo = k0 < cnt ? k0 : cnt, m = (cnt - lo) < kn ? (cnt - lo) : kn;
    if (m <= 0) continue;
    char* at = tdm_at(buf, off + lo, es);
    TDM_NCCL(h, ncclBroadcast(at, at, static_cast<size_t>(m), tdm_nccl_type(c->dtype), q, h->comm,
                              h->wire));
  }
  TDM_NCCL(h, ncclGroupEnd());
  return 0;
}
// The segments of every rank's Dim part ([outer][rows][inner] split by rows) of `whole`, each
// broadcast from its owner in place.
static int tdm_gather_dim(tdm_host* h, const tandem_collective* c, void* whole, size_t es) {
  const int p = h->group_size;
  TDM_NCCL(h, ncclGroupStart());
  for (int q = 0; q < p; ++q) {
    const int64_t off = fx::part_offset(c->rows, p, q), cnt = fx::part_count(c->rows, p, q);
    if (cnt * c->inner <= 0) continue;
    for (int64_t o = 0; o < c->outer; ++o) {
      char* at = tdm_at(whole, (o * c->rows + off) * c->inner, es);
      TDM_NCCL(h, ncclBroadcast(at, at, static_cast<size_t>(cnt * c->inner),
                                tdm_nccl_type(c->dtype), q, h->comm, h->wire));
    }
  }
  TDM_NCCL(h, ncclGroupEnd());
  return 0;
}
// This rank's Dim part between a whole-shaped buffer and a packed one ([outer][cnt * inner]).
static int tdm_pack_dim(tdm_host* h, const tandem_collective* c, void* whole, void* packed,
                        size_t es, bool unpack) {
  const int64_t off = fx::part_offset(c->rows, h->group_size, h->group_rank);
  const int64_t cnt = fx::part_count(c->rows, h->group_size, h->group_rank);
  const size_t seg = static_cast<size_t>(cnt * c->inner) * es,
               pitch = static_cast<size_t>(c->rows * c->inner) * es;
  if (seg == 0 || c->outer == 0) return 0;
  char* w = tdm_at(whole, off * c->inner, es);
  if (unpack)
    TDM_CUDA_H(h, cudaMemcpy2DAsync(w, pitch, packed, seg, seg, static_cast<size_t>(c->outer),
                                    cudaMemcpyDeviceToDevice, h->wire));
  else
    TDM_CUDA_H(h, cudaMemcpy2DAsync(packed, seg, w, pitch, seg, static_cast<size_t>(c->outer),
                                    cudaMemcpyDeviceToDevice, h->wire));
  return 0;
}

static int tdm_call_hook(tdm_host* h, const tandem_collective* c, void* chunk, int64_t n,
                         int64_t g) {
  if (n <= 0) return 0;
  return c->hook(h->args, chunk, n, c->index_base + g, c->block.index >= 0 ? &c->block : nullptr);
}
// The hook over this rank's Dim part, segment by segment, on the compute stream (after the
// reduction). `packed` holds the part packed, or is null when it lies in place in `whole`.
static int tdm_hook_dim(tdm_host* h, const tandem_collective* c, void* whole, void* packed,
                        size_t es) {
  const int64_t off = fx::part_offset(c->rows, h->group_size, h->group_rank);
  const int64_t seg = fx::part_count(c->rows, h->group_size, h->group_rank) * c->inner;
  for (int64_t o = 0; o < c->outer; ++o) {
    const int64_t g0 = (o * c->rows + off) * c->inner;
    void* at = packed != nullptr ? tdm_at(packed, o * seg, es) : tdm_at(whole, g0, es);
    if (int rc = tdm_call_hook(h, c, at, seg, g0)) return rc;
  }
  return 0;
}

// A fused collective over a flat partition, chunk by chunk: the reduction of chunk k + 1 is
// issued before chunk k's gather, so that chunk k's hook (on the compute stream) overlaps it:
//   wire:    RS0, RS1, [hook 0 done] AG0, RS2, [hook 1 done] AG1, ...
//   compute: [RS0 done] hook 0, [RS1 done] hook 1, ...
// `mine` is where this rank's reduced part goes; `gather` is false for a reduce-scatter.
static int tdm_fused_flat(tdm_host* h, const tandem_collective* c, void* send, void* mine,
                          int64_t n, size_t es, bool gather) {
  const int p = h->group_size, r = h->group_rank;
  const int64_t most = fx::part_count(n, p, 0), my_off = fx::part_offset(n, p, r),
                my_cnt = fx::part_count(n, p, r);
  const int64_t chunk = most <= 0 ? 1 : (most + h->chunks - 1) / h->chunks;
  cudaEvent_t reduced = nullptr, hooked = nullptr;
  if (int rc = tdm_reduce_parts(h, c, send, mine, n, 0, chunk, es)) return rc;
  if (int rc = tdm_record(h, h->wire, &reduced)) return rc;
  for (int64_t k0 = 0; k0 < most; k0 += chunk) {
    TDM_CUDA_H(h, cudaStreamWaitEvent(h->compute, reduced, 0));
    const int64_t lo = k0 < my_cnt ? k0 : my_cnt, m = (my_cnt - lo) < chunk ? (my_cnt - lo) : chunk;
    if (int rc = tdm_call_hook(h, c, tdm_at(mine, lo, es), m, my_off + lo)) return rc;
    if (int rc = tdm_record(h, h->compute, &hooked)) return rc;
    if (k0 + chunk < most) {
      if (int rc = tdm_reduce_parts(h, c, send, mine, n, k0 + chunk, chunk, es)) return rc;
      if (int rc = tdm_record(h, h->wire, &reduced)) return rc;
    }
    TDM_CUDA_H(h, cudaStreamWaitEvent(h->wire, hooked, 0));
    if (gather)
      if (int rc = tdm_gather_parts(h, c, send, n, k0, chunk, es)) return rc;
  }
  return 0;
}

static int tdm_run_collective(tdm_host* h, const tandem_collective* c) {
  const size_t es = c->dtype == 0 ? 4 : 2;
  const int64_t n = c->outer * c->rows * c->inner;
  const int p = h->group_size, r = h->group_rank;
  const ncclDataType_t type = tdm_nccl_type(c->dtype);
  const ncclRedOp_t op = tdm_nccl_op(c->op);
  // NCCL splits flat buffers; a Dim partition is that split when rows are outermost and each part
  // is whole rows of equal count, or single elements (the CPU runtime's rule).
  const bool flat = p == 1 || (c->outer == 1 && (c->inner == 1 || c->rows % p == 0));
  const bool even = n % p == 0;
  const int64_t my_off = fx::part_offset(n, p, r), my_cnt = fx::part_count(n, p, r);
  if (n <= 0) return 0;
  switch (c->kind) {
    case 0:  // all-reduce
      if (c->hook == nullptr) {
        TDM_NCCL(
            h, ncclAllReduce(c->send, c->send, static_cast<size_t>(n), type, op, h->comm, h->wire));
      } else if (flat) {
        return tdm_fused_flat(h, c, c->send, tdm_at(c->send, my_off, es), n, es, true);
      } else {
        TDM_NCCL(
            h, ncclAllReduce(c->send, c->send, static_cast<size_t>(n), type, op, h->comm, h->wire));
        if (int rc = tdm_order(h, h->wire, h->compute)) return rc;
        if (int rc = tdm_hook_dim(h, c, c->send, nullptr, es)) return rc;
        if (c->carry) {
          if (int rc = tdm_order(h, h->compute, h->wire)) return rc;
          return tdm_gather_dim(h, c, c->send, es);
        }
      }
      return 0;
    case 1: {  // reduce-scatter: this rank's part into recv (packed), or in place in a whole-shaped
               // buffer
      void* whole = c->recv == nullptr ? c->send : (c->recv_whole ? c->recv : nullptr);
      if (flat) {
        void* mine = whole != nullptr ? tdm_at(whole, my_off, es) : c->recv;
        if (c->hook != nullptr) return tdm_fused_flat(h, c, c->send, mine, n, es, false);
        if (even) {
          TDM_NCCL(h, ncclReduceScatter(c->send, mine, static_cast<size_t>(n / p), type, op,
                                        h->comm, h->wire));
          return 0;
        }
        return tdm_reduce_parts(h, c, c->send, mine, n, 0, fx::part_count(n, p, 0), es);
      }
      // A Dim partition NCCL cannot split: all-reduce a staged copy, keep this rank's rows.
      if (static_cast<size_t>(n) * es > h->staging_bytes)
        return tdm_fail(h, "staging buffer too small for a reduce-scatter");
      TDM_CUDA_H(h, cudaMemcpyAsync(h->staging, c->send, static_cast<size_t>(n) * es,
                                    cudaMemcpyDeviceToDevice, h->wire));
      TDM_NCCL(h, ncclAllReduce(h->staging, h->staging, static_cast<size_t>(n), type, op, h->comm,
                                h->wire));
      if (whole != nullptr) {
        const int64_t off = fx::part_offset(c->rows, p, r), cnt = fx::part_count(c->rows, p, r);
        const size_t seg = static_cast<size_t>(cnt * c->inner) * es,
                     pitch = static_cast<size_t>(c->rows * c->inner) * es;
        if (seg > 0)
          TDM_CUDA_H(h, cudaMemcpy2DAsync(tdm_at(whole, off * c->inner, es), pitch,
                                          tdm_at(h->staging, off * c->inner, es), pitch, seg,
                                          static_cast<size_t>(c->outer), cudaMemcpyDeviceToDevice,
                                          h->wire));
      } else if (int rc = tdm_pack_dim(h, c, h->staging, c->recv, es, false)) {
        return rc;
      }
      if (c->hook != nullptr) {
        if (int rc = tdm_order(h, h->wire, h->compute)) return rc;
        return tdm_hook_dim(h, c, whole, whole == nullptr ? c->recv : nullptr, es);
      }
      return 0;
    }
    case 2: {  // all-gather: the parts into recv (this rank's from send, or already in place)
      if (flat) {
        void* mine = c->send != nullptr ? c->send : tdm_at(c->recv, my_off, es);
        if (even) {
          TDM_NCCL(
              h, ncclAllGather(mine, c->recv, static_cast<size_t>(n / p), type, h->comm, h->wire));
          return 0;
        }
        if (c->send != nullptr && my_cnt > 0)
          TDM_CUDA_H(h, cudaMemcpyAsync(tdm_at(c->recv, my_off, es), c->send,
                                        static_cast<size_t>(my_cnt) * es, cudaMemcpyDeviceToDevice,
                                        h->wire));
        return tdm_gather_parts(h, c, c->recv, n, 0, fx::part_count(n, p, 0), es);
      }
      if (c->send != nullptr)
        if (int rc = tdm_pack_dim(h, c, c->recv, c->send, es, true)) return rc;
      return tdm_gather_dim(h, c, c->recv, es);
    }
    case 3:  // broadcast
      if (c->root < 0 || c->root >= p)
        return tdm_fail(h, "step " + std::to_string(c->step) + ": Broadcast root " +
                               std::to_string(c->root) + " is outside the group of " +
                               std::to_string(p) + " ranks");
      TDM_NCCL(h, ncclBroadcast(c->send, c->send, static_cast<size_t>(n), type, c->root, h->comm,
                                h->wire));
      return 0;
    default:
      return tdm_fail(h, "collective kind " + std::to_string(c->kind) + " from step " +
                             std::to_string(c->step));
  }
}

// After the wire's work: the compute stream waits for it (a synchronous step), or, inside a
// pipeline, the block remembers it for sync().
static int tdm_after_wire(tdm_host* h, int32_t async, int32_t block) {
  if (!async || block < 0) return tdm_order(h, h->wire, h->compute);
  if (static_cast<size_t>(block) >= h->block_done.size())
    return tdm_fail(h, "pipeline block " + std::to_string(block) + " beyond the set-up");
  return tdm_record(h, h->wire, &h->block_done[static_cast<size_t>(block)]);
}

static int tdm_on_collective(void* host, const tandem_collective* c) {
  tdm_host* h = static_cast<tdm_host*>(host);
  if (int rc = tdm_order(h, h->compute, h->wire)) return rc;  // the operands are ready
  if (int rc = tdm_run_collective(h, c)) return rc;
  return tdm_after_wire(h, c->async, c->block.index);
}

static int tdm_on_transfer(void* host, const tandem_transfer* t) {
  tdm_host* h = static_cast<tdm_host*>(host);
  const int peer = t->peer_group * h->group_size + h->group_rank;
  if (int rc = tdm_order(h, h->compute, h->wire)) return rc;
  if (t->recv)
    TDM_NCCL(h,
             ncclRecv(t->data, static_cast<size_t>(t->bytes), ncclInt8, peer, h->world, h->wire));
  else
    TDM_NCCL(h,
             ncclSend(t->data, static_cast<size_t>(t->bytes), ncclInt8, peer, h->world, h->wire));
  return tdm_after_wire(h, t->async, t->block);
}

// Blocks <= b of the pipeline have communicated (b < 0: everything): the compute stream waits.
static int tdm_on_sync(void* host, int32_t block) {
  tdm_host* h = static_cast<tdm_host*>(host);
  if (block < 0 || static_cast<size_t>(block) >= h->block_done.size())
    return tdm_order(h, h->wire, h->compute);
  const cudaEvent_t e = h->block_done[static_cast<size_t>(block)];
  if (e != nullptr) TDM_CUDA_H(h, cudaStreamWaitEvent(h->compute, e, 0));
  return 0;
}

// Row-major C = op(A) op(B) through column-major cuBLAS: C^T = op(B)^T op(A)^T.
static tdm_host* tdm_gemm_host = nullptr;
static void tdm_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a,
                      int lda, const float* b, int ldb, float beta, float* c, int ldc) {
  tdm_host* h = tdm_gemm_host;
  const cublasStatus_t s =
      cublasSgemm(h->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                  n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc);
  if (s != CUBLAS_STATUS_SUCCESS)
    tdm_fail(h, "cublasSgemm failed with status " + std::to_string(static_cast<int>(s)));
}

// ---- codegen/runtime/cuda_main.cu
// The end of every emitted CUDA program: main() (MPI and NCCL set-up, device buffers from the
// plan's tables, the check against the reference interpreter's results, the timing loop).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

// ---------------------------------------------------------------- main: set up, check, time

static void tdm_die(const std::string& what) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::fprintf(stderr, "rank %d: %s\n", rank, what.c_str());
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::exit(1);
}
#define TDM_MUST_CUDA(call)                                                             \
  do {                                                                                  \
    const cudaError_t e_ = (call);                                                      \
    if (e_ != cudaSuccess) tdm_die(std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)
#define TDM_MUST_NCCL(call)                                                             \
  do {                                                                                  \
    const ncclResult_t e_ = (call);                                                     \
    if (e_ != ncclSuccess) tdm_die(std::string(#call) + ": " + ncclGetErrorString(e_)); \
  } while (0)

static size_t tdm_size_of(int dt) { return dt == 0 ? 4 : 2; }

// The reference's run, as `tandem emit` wrote it: check/np<N>/meta.txt holds the symbols
// ("sym NAME EXTENT"), the scalars ("scalar ID VALUE") and dropout seeds ("seed ID VALUE");
// r<R>.in<ID>.bin and r<R>.want<ID>.bin hold rank R's piece of each input and expected result.
struct tdm_case {
  std::vector<int64_t> sym;
  std::vector<double> scalar;  // by stage id
  std::vector<uint64_t> seed;  // by stage id
  std::string dir;             // where the reference's files are; empty: no check
};

static bool tdm_read_case(const std::string& dir, tdm_case& c) {
  std::ifstream in(dir + "/meta.txt");
  if (!in) return false;
  c.dir = dir;
  std::string kind, key;
  while (in >> kind >> key) {
    if (kind == "sym") {
      int64_t v = 0;
      in >> v;
      for (int i = 0; i < tdm_nsyms; ++i)
        if (key == tdm_sym_names[i]) c.sym[static_cast<size_t>(i)] = v;
    } else if (kind == "scalar") {
      double v = 0;
      in >> v;
      c.scalar[static_cast<size_t>(std::stoi(key))] = v;
    } else if (kind == "seed") {
      uint64_t v = 0;
      in >> v;
      c.seed[static_cast<size_t>(std::stoi(key))] = v;
    } else {
      tdm_die("unreadable " + dir + "/meta.txt: '" + kind + "'");
    }
  }
  return true;
}

static std::vector<char> tdm_read_file(const std::string& path, size_t bytes) {
  std::ifstream in(path, std::ios::binary);
  if (!in) tdm_die("cannot open " + path);
  std::vector<char> data(bytes);
  in.read(data.data(), static_cast<std::streamsize>(bytes));
  if (static_cast<size_t>(in.gcount()) != bytes || in.peek() != EOF)
    tdm_die(path + " does not hold " + std::to_string(bytes) +
            " bytes (sizes or rank count differ from the emit)");
  return data;
}

static float tdm_host_ld(const char* p, int dt, size_t i) {
  if (dt == 0) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p + 2 * i, 2);
  return dt == 1 ? fx::ld_bf16(h) : fx::ld_f16(h);
}

// Inputs for timing without a reference: positive values of one magnitude, as tune's inputs are.
__global__ void tdm_fill_input(void* p, int dt, int64_t n, uint64_t salt) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    tdm_st(p, dt, i, 0.25f + fx::uniform_of(fx::random_bits(salt, static_cast<uint64_t>(i))));
}

struct tdm_run_state {
  tandem_args a{};
  std::vector<void*> buf;
  std::vector<void*> owned;
  std::vector<int64_t> sym;
  std::vector<uint64_t> seed;
  double* acc = nullptr;
  float* scratch = nullptr;
};

// Allocates what the plan stores on this rank for the case's sizes, binds scalars and seeds.
static void tdm_setup(tdm_host& h, tdm_run_state& s, const tdm_case& c) {
  s.sym = c.sym;
  s.seed = c.seed;
  s.buf.assign(static_cast<size_t>(tdm_nstages), nullptr);
  tandem_args& a = s.a;
  a.buf = s.buf.data();
  a.sym = s.sym.data();
  a.seed = s.seed.data();
  a.p = h.group_size;
  a.r = h.group_rank;
  a.group = h.group;
  a.host = &h;
  a.collective = tdm_on_collective;
  a.transfer = tdm_on_transfer;
  a.sync = tdm_on_sync;
  a.sgemm = tdm_sgemm;
  size_t most = 0;
  for (int id = 0; id < tdm_nstages; ++id) {
    if (tdm_owner[id] != id || !tdm_mine(&a, id)) continue;
    const int64_t elems = tdm_buffer_elems(&a, id);
    const size_t bytes = static_cast<size_t>(elems > 0 ? elems : 1) * tdm_size_of(tdm_dtype_of[id]);
    void* p = nullptr;
    TDM_MUST_CUDA(cudaMalloc(&p, bytes));
    TDM_MUST_CUDA(cudaMemset(p, 0, bytes));
    s.buf[static_cast<size_t>(id)] = p;
    s.owned.push_back(p);
    most = std::max(most, bytes);
  }
  for (int id = 0; id < tdm_nstages; ++id)
    if (tdm_owner[id] >= 0 && tdm_owner[id] != id)
      s.buf[static_cast<size_t>(id)] = s.buf[static_cast<size_t>(tdm_owner[id])];
  TDM_MUST_CUDA(
      cudaMalloc(&s.acc, sizeof(double) * TANDEM_ACC_SLOTS * static_cast<size_t>(tdm_nstages)));
  a.acc = s.acc;
  const int64_t scratch = std::max<int64_t>(1, tandem_scratch_elems(&a));
  TDM_MUST_CUDA(cudaMalloc(&s.scratch, sizeof(float) * static_cast<size_t>(scratch)));
  a.scratch = s.scratch;
  if (most > h.staging_bytes) {
    if (h.staging != nullptr) TDM_MUST_CUDA(cudaFree(h.staging));
    TDM_MUST_CUDA(cudaMalloc(&h.staging, most));
    h.staging_bytes = most;
  }
  // Scalars live in one-element buffers, in their dtype.
  for (int id = 0; id < tdm_nstages; ++id) {
    if (tdm_kind_of[id] != 2 || s.buf[static_cast<size_t>(id)] == nullptr) continue;
    const float v = static_cast<float>(c.scalar[static_cast<size_t>(id)]);
    const int dt = tdm_dtype_of[id];
    uint16_t h16 = dt == 1 ? fx::st_bf16(v) : fx::st_f16(v);
    TDM_MUST_CUDA(cudaMemcpy(s.buf[static_cast<size_t>(id)],
                             dt == 0 ? static_cast<const void*>(&v) : &h16, tdm_size_of(dt),
                             cudaMemcpyHostToDevice));
  }
}

static void tdm_teardown(tdm_run_state& s) {
  for (void* p : s.owned) TDM_MUST_CUDA(cudaFree(p));
  TDM_MUST_CUDA(cudaFree(s.acc));
  TDM_MUST_CUDA(cudaFree(s.scratch));
  s.owned.clear();
}

static void tdm_run(tdm_host& h, tdm_run_state& s) {
  h.args = &s.a;
  tdm_gemm_host = &h;
  const int rc = tandem_run(&s.a);
  if (rc != 0 || h.failed)
    tdm_die(std::string("the run failed: ") + (h.failed ? h.error : "a step returned non-zero"));
}

static void tdm_wait(tdm_host& h) {
  TDM_MUST_CUDA(cudaStreamSynchronize(h.compute));
  TDM_MUST_CUDA(cudaStreamSynchronize(h.wire));
  if (h.failed) tdm_die(h.error);
}

// Loads the reference's inputs, runs once, compares each result with the reference's within
// tune's tolerances (|got - want| <= tol * (|want| + max |want|); f32 2e-4, bf16 2^-7, f16 2^-9).
static int tdm_check(tdm_host& h, tdm_run_state& s, const tdm_case& c, int world_rank) {
  std::vector<tdm_item> items;
  tdm_check_items(&s.a, items);
  const std::string prefix = c.dir + "/r" + std::to_string(world_rank);
  for (const tdm_item& it : items) {
    if (it.want) continue;
    const size_t bytes = static_cast<size_t>(it.elems) * tdm_size_of(it.dtype);
    const std::vector<char> data =
        tdm_read_file(prefix + ".in" + std::to_string(it.stage) + ".bin", bytes);
    if (bytes > 0) TDM_MUST_CUDA(cudaMemcpy(it.ptr, data.data(), bytes, cudaMemcpyHostToDevice));
  }
  tdm_run(h, s);
  tdm_wait(h);
  int bad_values = 0;
  for (const tdm_item& it : items) {
    if (!it.want) continue;
    const size_t bytes = static_cast<size_t>(it.elems) * tdm_size_of(it.dtype);
    const std::vector<char> want =
        tdm_read_file(prefix + ".want" + std::to_string(it.stage) + ".bin", bytes);
    std::vector<char> got(bytes);
    if (bytes > 0) TDM_MUST_CUDA(cudaMemcpy(got.data(), it.ptr, bytes, cudaMemcpyDeviceToHost));
    double scale = 0, worst = 0;
    for (int64_t i = 0; i < it.elems; ++i)
      scale = std::max(scale, std::fabs(static_cast<double>(
                                  tdm_host_ld(want.data(), it.dtype, static_cast<size_t>(i)))));
    const double tol = it.dtype == 0 ? 2e-4 : (it.dtype == 1 ? 0x1p-7 : 0x1p-9);
    int64_t bad = 0;
    std::string first;
    for (int64_t i = 0; i < it.elems; ++i) {
      const double g = tdm_host_ld(got.data(), it.dtype, static_cast<size_t>(i));
      const double w = tdm_host_ld(want.data(), it.dtype, static_cast<size_t>(i));
      const double bound = std::fabs(w) + scale, diff = std::fabs(g - w);
      if (!std::isnan(diff) && bound > 0) worst = std::max(worst, diff / bound);
      if (std::isnan(g) != std::isnan(w) || diff > tol * bound) {
        if (bad < 3)
          first += " [" + std::to_string(i) + "] got " + std::to_string(g) + " want " +
                   std::to_string(w) + ";";
        ++bad;
      }
    }
    std::printf("rank %d: %-12s %s: %lld elements, max relative error %.3g%s%s\n", world_rank,
                tdm_stage_name[it.stage], bad == 0 ? "ok" : "DIFFERS",
                static_cast<long long>(it.elems), worst, bad == 0 ? "" : ":", first.c_str());
    bad_values += bad > 0;
  }
  return bad_values;
}

// Median and spread of `iters` timed runs (after two warm-ups), on the compute stream, which the
// last step of every run waits for.
static void tdm_time(tdm_host& h, tdm_run_state& s, int iters, int world_rank, int world_size) {
  cudaEvent_t start, stop;
  TDM_MUST_CUDA(cudaEventCreate(&start));
  TDM_MUST_CUDA(cudaEventCreate(&stop));
  for (int w = 0; w < 2; ++w) tdm_run(h, s);
  tdm_wait(h);
  std::vector<float> ms;
  for (int i = 0; i < iters; ++i) {
    MPI_Barrier(MPI_COMM_WORLD);
    TDM_MUST_CUDA(cudaEventRecord(start, h.compute));
    tdm_run(h, s);
    if (tdm_order(&h, h.wire, h.compute) != 0) tdm_die(h.error);
    TDM_MUST_CUDA(cudaEventRecord(stop, h.compute));
    TDM_MUST_CUDA(cudaEventSynchronize(stop));
    tdm_wait(h);
    float t = 0;
    TDM_MUST_CUDA(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  float med = ms.empty() ? 0.0f : ms[ms.size() / 2], slowest = 0;
  MPI_Reduce(&med, &slowest, 1, MPI_FLOAT, MPI_MAX, 0, MPI_COMM_WORLD);
  if (world_rank == 0 && !ms.empty())
    std::printf(
        "%s / %s on %d ranks: median %.4f ms (slowest rank), this rank min %.4f max %.4f over %d "
        "runs\n",
        tdm_program_name, tdm_plan_name, world_size, slowest, ms.front(), ms.back(), iters);
  TDM_MUST_CUDA(cudaEventDestroy(start));
  TDM_MUST_CUDA(cudaEventDestroy(stop));
}

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int world_rank = 0, world_size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  if (world_size % tdm_groups != 0)
    tdm_die("program '" + std::string(tdm_program_name) + "' has " + std::to_string(tdm_groups) +
            " groups: run it on a multiple of that many ranks");

  tdm_host h;
  h.world_rank = world_rank;
  h.world_size = world_size;
  h.group_size = world_size / tdm_groups;
  h.group = world_rank / h.group_size;
  h.group_rank = world_rank % h.group_size;
  if (const char* env = std::getenv("TANDEM_CUDA_CHUNKS")) h.chunks = std::max(1, std::atoi(env));

  // One GPU per rank of a node.
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank, MPI_INFO_NULL, &node);
  int local = 0, devices = 0;
  MPI_Comm_rank(node, &local);
  TDM_MUST_CUDA(cudaGetDeviceCount(&devices));
  if (devices < 1) tdm_die("no CUDA device");
  TDM_MUST_CUDA(cudaSetDevice(local % devices));

  // NCCL: the world communicator from an id rank 0 broadcasts over MPI, split into the groups.
  ncclUniqueId id;
  if (world_rank == 0) TDM_MUST_NCCL(ncclGetUniqueId(&id));
  MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD);
  TDM_MUST_NCCL(ncclCommInitRank(&h.world, world_size, id, world_rank));
  TDM_MUST_NCCL(ncclCommSplit(h.world, h.group, h.group_rank, &h.comm, nullptr));
  TDM_MUST_CUDA(cudaStreamCreateWithFlags(&h.compute, cudaStreamNonBlocking));
  TDM_MUST_CUDA(cudaStreamCreateWithFlags(&h.wire, cudaStreamNonBlocking));
  if (cublasCreate(&h.blas) != CUBLAS_STATUS_SUCCESS) tdm_die("cublasCreate failed");
  if (cublasSetStream(h.blas, h.compute) != CUBLAS_STATUS_SUCCESS)
    tdm_die("cublasSetStream failed");
  h.events.resize(256);
  for (cudaEvent_t& e : h.events)
    TDM_MUST_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  h.block_done.assign(4096, nullptr);

  // Arguments: SYMBOL=EXTENT (time at these sizes), --iters K, --check DIR, --no-check.
  tdm_case base;
  base.sym.assign(static_cast<size_t>(std::max(tdm_nsyms, 1)), -1);
  base.scalar.assign(static_cast<size_t>(tdm_nstages), 0.5);
  base.seed.assign(static_cast<size_t>(tdm_nstages), 1234);
  std::vector<std::pair<int, int64_t>> sizes;
  int iters = 20;
  std::string check_root = "check";
  bool check = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg == "--iters" && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (arg == "--check" && i + 1 < argc) {
      check_root = argv[++i];
    } else if (arg == "--no-check") {
      check = false;
    } else if (eq != std::string::npos) {
      int which = -1;
      for (int s = 0; s < tdm_nsyms; ++s)
        if (arg.compare(0, eq, tdm_sym_names[s]) == 0 && std::strlen(tdm_sym_names[s]) == eq)
          which = s;
      if (which < 0)
        tdm_die("'" + arg + "': not a symbol of program '" + std::string(tdm_program_name) + "'");
      sizes.push_back({which, std::atoll(arg.c_str() + eq + 1)});
    } else {
      tdm_die("unknown argument '" + arg +
              "': expected SYMBOL=EXTENT, --iters K, --check DIR or --no-check");
    }
  }

  int failures = 0;
  tdm_case ref = base;
  const bool have_ref =
      check && tdm_read_case(check_root + "/np" + std::to_string(world_size), ref);
  if (have_ref) {
    tdm_run_state s;
    tdm_setup(h, s, ref);
    failures = tdm_check(h, s, ref, world_rank);
    tdm_teardown(s);
    int all = 0;
    MPI_Allreduce(&failures, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    failures = all;
    if (world_rank == 0)
      std::printf("check against the reference interpreter: %s\n",
                  failures == 0 ? "PASSED" : "FAILED");
  } else if (world_rank == 0) {
    std::printf(
        "no reference results in %s/np%d: correctness not checked (emit with --ranks %d to "
        "check)\n",
        check_root.c_str(), world_size, world_size);
  }

  // Timing: at the reference's sizes unless given; inputs made on the device when not checked.
  tdm_case timed = have_ref ? ref : base;
  timed.dir.clear();
  for (const auto& [which, extent] : sizes) timed.sym[static_cast<size_t>(which)] = extent;
  for (int i = 0; i < tdm_nsyms; ++i)
    if (timed.sym[static_cast<size_t>(i)] < 0)
      tdm_die(std::string("give the extent of ") + tdm_sym_names[i] + " as " + tdm_sym_names[i] +
              "=EXTENT");
  {
    tdm_run_state s;
    tdm_setup(h, s, timed);
    std::vector<tdm_item> items;
    tdm_check_items(&s.a, items);
    for (const tdm_item& it : items)
      if (!it.want && it.elems > 0)
        tdm_fill_input<<<tdm_blocks(it.elems), TDM_THREADS, 0, h.compute>>>(
            it.ptr, it.dtype, it.elems,
            static_cast<uint64_t>(it.stage) * 7919u + static_cast<uint64_t>(world_rank));
    TDM_MUST_CUDA(cudaGetLastError());
    tdm_wait(h);
    tdm_time(h, s, iters, world_rank, world_size);
    tdm_teardown(s);
  }

  ncclCommDestroy(h.comm);
  ncclCommDestroy(h.world);
  cublasDestroy(h.blas);
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
