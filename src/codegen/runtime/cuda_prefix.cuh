// The prefix of every emitted CUDA program, after the ABI and core/formulas.h: host state, launch
// helpers and the device helpers the step functions call, and the declarations of what the
// emitted plan defines (its tables, tandem_run). The emitted program defines TDM_NSYMS (the
// program's symbol count) before this text; cmake/embed_text.cmake drops the quoted includes,
// whose text the program pastes before it.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tandem/codegen/abi.h"
#include "tandem/core/formulas.h"

#ifndef TDM_NSYMS
#define TDM_NSYMS 1  // compiled on its own, without a plan
#endif

namespace fx = tandem::fx;

#define TDM_THREADS 256
// Whole warps (a block's sums reduce by warp shuffles) and a multiple of 8 (every grid's stride
// is, so a thread's element indices keep their lane g % 8).
static_assert(TDM_THREADS % 32 == 0, "the kernels' blocks are whole warps");
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

// A vector loop's sum lanes: v[j] holds the thread's terms of elements g0 + t with t = first * V +
// j (mod 8): every vector the thread handles starts at w * V with w = first + k * stride and
// stride * V a multiple of 8, so element j's lane is fixed, (g0 + off + j) % 8 with off =
// (threadIdx.x * V) % 8 (blockIdx.x * TDM_THREADS * V is a multiple of 8). Returns, for thread T of
// each group of 8 consecutive threads, the group's sum of lane (g0 + T) % 8, the lane the thread's
// scalar register holds: the group's 8 relative lanes transposed across it in three steps (4, 2,
// then 1 lanes exchanged), in a fixed order. Every thread of the warp calls it.
// off is a multiple of W (V = W * 2^i for V >= 8 gives 0, V = 4 gives 0 or 4): relative lane k
// is v[k % W] where k - k % W is off, else 0 (selects on constant indices: an index computed
// from off would put e in local memory).
template <int W>
__device__ __forceinline__ double tdm_vec_lanes(const double (&v)[W], int off) {
  static_assert(W >= 1 && W <= 8 && 8 % W == 0, "W divides 8");
  double e[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) e[k] = (k - k % W) == off ? v[k % W] : 0.0;
  const int m = static_cast<int>(threadIdx.x & 7);
#pragma unroll
  for (int h = 4; h >= 1; h >>= 1) {
    const bool hi = (m & h) != 0;
#pragma unroll
    for (int k = 0; k < h; ++k) {
      const double keep = hi ? e[k + h] : e[k];
      const double send = hi ? e[k] : e[k + h];
      e[k] = keep + __shfl_xor_sync(0xffffffffu, send, h);
    }
  }
  return e[0];
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
