// The fixed parts of every emitted CUDA program before main(): the prefix the step functions
// are written against, and the runtime behind the ABI's callbacks (collectives and transfers over
// NCCL on a communication stream, ordered against the compute stream by events; SGEMM by cuBLAS).
#include <fmt/format.h>

#include "cuda_text.h"
#include "tandem/codegen/abi.h"
#include "tandem/codegen/formulas_text.h"

namespace tandem::codegen {

namespace {

// Host state, launch helpers and device helpers the step functions call.
constexpr const char* kPrefixTail = R"tdm(
namespace fx = tandem::fx;

#define TDM_THREADS 256
#define TDM_MAX_RANK 8
#define TDM_MAX_BLOCKS 4096

// ---- host state: one per rank
struct tdm_host {
  const tandem_args* args = nullptr;
  ncclComm_t world = nullptr;  // every rank: transfers between groups
  ncclComm_t comm = nullptr;   // this rank's group: collectives
  int world_rank = 0, world_size = 1, group = 0, group_size = 1, group_rank = 0;
  cudaStream_t compute = nullptr;  // kernels and GEMMs
  cudaStream_t wire = nullptr;     // NCCL
  cublasHandle_t blas = nullptr;
  std::vector<cudaEvent_t> events;  // a ring, made at set-up (cudaStreamWaitEvent takes the state at the call)
  size_t next_event = 0;
  std::vector<cudaEvent_t> block_done;  // per pipeline block: its last asynchronous communication
  void* staging = nullptr;              // a collective's whole buffer, for Dim partitions
  size_t staging_bytes = 0;
  int chunks = 4;                        // chunks per fused collective (TANDEM_CUDA_CHUNKS)
  bool failed = false;
  char error[1024] = {0};
};

[[maybe_unused]] static tdm_host* tdm_host_of(const tandem_args* a) { return static_cast<tdm_host*>(a->host); }
[[maybe_unused]] static cudaStream_t tdm_stream(const tandem_args* a) { return tdm_host_of(a)->compute; }

[[maybe_unused]] static int tdm_fail(tdm_host* h, const std::string& what) {
  if (!h->failed) std::snprintf(h->error, sizeof h->error, "%s", what.c_str());
  h->failed = true;
  return 1;
}
#define TDM_CUDA(a, call)                                                                              \
  do {                                                                                                 \
    const cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) return tdm_fail(tdm_host_of(a), std::string(#call) + ": " + cudaGetErrorString(e_)); \
  } while (0)
[[maybe_unused]] static int tdm_launched(const tandem_args* a, const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return tdm_fail(tdm_host_of(a), std::string("launching ") + what + ": " + cudaGetErrorString(e));
  return 0;
}

// Blocks for n items, grid-stride beyond TDM_MAX_BLOCKS.
[[maybe_unused]] static unsigned tdm_blocks(int64_t n) {
  const int64_t b = (n + TDM_THREADS - 1) / TDM_THREADS;
  return static_cast<unsigned>(b < 1 ? 1 : (b > TDM_MAX_BLOCKS ? TDM_MAX_BLOCKS : b));
}
[[maybe_unused]] static bool tdm_aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
[[maybe_unused]] static tdm_syms tdm_syms_of(const tandem_args* a) {
  tdm_syms s{};
  for (int i = 0; i < static_cast<int>(sizeof s.v / sizeof s.v[0]); ++i) s.v[i] = i < tdm_nsyms_used ? a->sym[i] : 0;
  return s;
}
// A row-sliced block value's rows on this rank: its part of each block's rows, summed.
[[maybe_unused]] static int64_t tdm_block_rows(int64_t rows, int64_t blocks, int64_t p, int64_t r) {
  int64_t mine = 0;
  for (int64_t b = 0; b < blocks; ++b) mine += fx::part_count(fx::part_count(rows, blocks, b), p, r);
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
    x[j] = w.x; x[j + 1] = w.y; x[j + 2] = w.z; x[j + 3] = w.w;
  }
}
template <int V>
__device__ __forceinline__ void tdm_vstore(float* p, const float (&x)[V]) {
#pragma unroll
  for (int j = 0; j < V; j += 4) *reinterpret_cast<float4*>(p + j) = make_float4(x[j], x[j + 1], x[j + 2], x[j + 3]);
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
    for (int q = 0; q < 4; ++q) u[q] = static_cast<uint32_t>(x[j + 2 * q]) | (static_cast<uint32_t>(x[j + 2 * q + 1]) << 16);
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
  if (dt == 0) static_cast<float*>(p)[i] = v;
  else static_cast<uint16_t*>(p)[i] = dt == 1 ? fx::st_bf16(v) : fx::st_f16(v);
}

// Prod, Max, Min accumulators keep one f32 value in their first double: combined atomically.
__device__ void tdm_atomic_combine(double* slot, float v, int op) {
  unsigned long long* p = reinterpret_cast<unsigned long long*>(slot);
  unsigned long long old = *p, assumed;
  do {
    assumed = old;
    const float cur = static_cast<float>(__longlong_as_double(static_cast<long long>(assumed)));
    const float next = op == 1 ? fx::prod(cur, v) : (op == 2 ? fx::max(cur, v) : fx::min(cur, v));
    old = atomicCAS(p, assumed, static_cast<unsigned long long>(__double_as_longlong(static_cast<double>(next))));
  } while (assumed != old);
}
// An accumulator's start: every lane 0 (a sum), or the op's identity in the first.
__global__ void tdm_acc_init(double* acc, float identity) {
  if (threadIdx.x < TANDEM_ACC_SLOTS) acc[threadIdx.x] = threadIdx.x == 0 ? static_cast<double>(identity) : 0.0;
}
// A sum's lanes added in order 0..7 and rounded once (else the f32 value), into the slot's first float.
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
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    tdm_st(out, dt, i, take_sqrt ? fx::sqrt(in[i]) : in[i]);
}
// A rows x cols matrix (leading dimension ld on the 16-bit side) widened to packed f32, and back.
__global__ void tdm_widen2d(float* dst, const void* src, int dt, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < rows * cols; e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[e] = tdm_ld(src, dt, (e / cols) * ld + e % cols);
}
__global__ void tdm_narrow2d(void* dst, int dt, const float* src, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < rows * cols; e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    tdm_st(dst, dt, (e / cols) * ld + e % cols, src[e]);
}
__global__ void tdm_fill2d(float* p, int64_t rows, int64_t cols, int64_t ld, float v) {
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < rows * cols; e += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[(e / cols) * ld + e % cols] = v;
}

// What main() checks: this rank's stored piece of a stage (an input to load, or a result to compare).
struct tdm_item {
  int stage;
  int want;  // 0: an input, loaded before the run; 1: compared after it
  int dtype;
  void* ptr;
  int64_t elems;
};
[[maybe_unused]] static bool tdm_mine(const tandem_args* a, int stage);
)tdm";

constexpr const char* kRuntime = R"tdm(
// ---------------------------------------------------------------- runtime: the ABI's callbacks

static bool tdm_mine(const tandem_args* a, int stage) {
  const int g = tdm_group_of[stage];
  return g < 0 || g == a->group;
}

#define TDM_NCCL(h, call)                                                                              \
  do {                                                                                                 \
    const ncclResult_t e_ = (call);                                                                    \
    if (e_ != ncclSuccess) return tdm_fail(h, std::string(#call) + ": " + ncclGetErrorString(e_));     \
  } while (0)
#define TDM_CUDA_H(h, call)                                                                            \
  do {                                                                                                 \
    const cudaError_t e_ = (call);                                                                     \
    if (e_ != cudaSuccess) return tdm_fail(h, std::string(#call) + ": " + cudaGetErrorString(e_));     \
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

static ncclDataType_t tdm_nccl_type(int32_t dt) { return dt == 0 ? ncclFloat32 : (dt == 1 ? ncclBfloat16 : ncclFloat16); }
static ncclRedOp_t tdm_nccl_op(int32_t op) { return op == 0 ? ncclSum : (op == 1 ? ncclProd : (op == 2 ? ncclMax : ncclMin)); }
static char* tdm_at(void* p, int64_t i, size_t es) { return static_cast<char*>(p) + static_cast<size_t>(i) * es; }

// Chunk [k0, k0 + kn) of every rank's flat part of `send` (n elements) reduced into the part's
// owner: one ncclReduce per owner, grouped into one launch; this rank's goes to `mine`.
static int tdm_reduce_parts(tdm_host* h, const tandem_collective* c, void* send, void* mine, int64_t n, int64_t k0,
                            int64_t kn, size_t es) {
  const int p = h->group_size;
  TDM_NCCL(h, ncclGroupStart());
  for (int q = 0; q < p; ++q) {
    const int64_t off = fx::part_offset(n, p, q), cnt = fx::part_count(n, p, q);
    const int64_t lo = k0 < cnt ? k0 : cnt, m = (cnt - lo) < kn ? (cnt - lo) : kn;
    if (m <= 0) continue;
    char* src = tdm_at(send, off + lo, es);
    char* dst = q == h->group_rank ? tdm_at(mine, lo, es) : src;
    TDM_NCCL(h, ncclReduce(src, dst, static_cast<size_t>(m), tdm_nccl_type(c->dtype), tdm_nccl_op(c->op), q, h->comm, h->wire));
  }
  TDM_NCCL(h, ncclGroupEnd());
  return 0;
}
// Chunk [k0, k0 + kn) of every rank's flat part of `buf` broadcast from its owner, in place.
static int tdm_gather_parts(tdm_host* h, const tandem_collective* c, void* buf, int64_t n, int64_t k0, int64_t kn, size_t es) {
  const int p = h->group_size;
  TDM_NCCL(h, ncclGroupStart());
  for (int q = 0; q < p; ++q) {
    const int64_t off = fx::part_offset(n, p, q), cnt = fx::part_count(n, p, q);
    const int64_t lo = k0 < cnt ? k0 : cnt, m = (cnt - lo) < kn ? (cnt - lo) : kn;
    if (m <= 0) continue;
    char* at = tdm_at(buf, off + lo, es);
    TDM_NCCL(h, ncclBroadcast(at, at, static_cast<size_t>(m), tdm_nccl_type(c->dtype), q, h->comm, h->wire));
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
      TDM_NCCL(h, ncclBroadcast(at, at, static_cast<size_t>(cnt * c->inner), tdm_nccl_type(c->dtype), q, h->comm, h->wire));
    }
  }
  TDM_NCCL(h, ncclGroupEnd());
  return 0;
}
// This rank's Dim part between a whole-shaped buffer and a packed one ([outer][cnt * inner]).
static int tdm_pack_dim(tdm_host* h, const tandem_collective* c, void* whole, void* packed, size_t es, bool unpack) {
  const int64_t off = fx::part_offset(c->rows, h->group_size, h->group_rank);
  const int64_t cnt = fx::part_count(c->rows, h->group_size, h->group_rank);
  const size_t seg = static_cast<size_t>(cnt * c->inner) * es, pitch = static_cast<size_t>(c->rows * c->inner) * es;
  if (seg == 0 || c->outer == 0) return 0;
  char* w = tdm_at(whole, off * c->inner, es);
  if (unpack) TDM_CUDA_H(h, cudaMemcpy2DAsync(w, pitch, packed, seg, seg, static_cast<size_t>(c->outer), cudaMemcpyDeviceToDevice, h->wire));
  else TDM_CUDA_H(h, cudaMemcpy2DAsync(packed, seg, w, pitch, seg, static_cast<size_t>(c->outer), cudaMemcpyDeviceToDevice, h->wire));
  return 0;
}

static int tdm_call_hook(tdm_host* h, const tandem_collective* c, void* chunk, int64_t n, int64_t g) {
  if (n <= 0) return 0;
  return c->hook(h->args, chunk, n, c->index_base + g, c->block.index >= 0 ? &c->block : nullptr);
}
// The hook over this rank's Dim part, segment by segment, on the compute stream (after the
// reduction). `packed` holds the part packed, or is null when it lies in place in `whole`.
static int tdm_hook_dim(tdm_host* h, const tandem_collective* c, void* whole, void* packed, size_t es) {
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
static int tdm_fused_flat(tdm_host* h, const tandem_collective* c, void* send, void* mine, int64_t n, size_t es, bool gather) {
  const int p = h->group_size, r = h->group_rank;
  const int64_t most = fx::part_count(n, p, 0), my_off = fx::part_offset(n, p, r), my_cnt = fx::part_count(n, p, r);
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
        TDM_NCCL(h, ncclAllReduce(c->send, c->send, static_cast<size_t>(n), type, op, h->comm, h->wire));
      } else if (flat) {
        return tdm_fused_flat(h, c, c->send, tdm_at(c->send, my_off, es), n, es, true);
      } else {
        TDM_NCCL(h, ncclAllReduce(c->send, c->send, static_cast<size_t>(n), type, op, h->comm, h->wire));
        if (int rc = tdm_order(h, h->wire, h->compute)) return rc;
        if (int rc = tdm_hook_dim(h, c, c->send, nullptr, es)) return rc;
        if (c->carry) {
          if (int rc = tdm_order(h, h->compute, h->wire)) return rc;
          return tdm_gather_dim(h, c, c->send, es);
        }
      }
      return 0;
    case 1: {  // reduce-scatter: this rank's part into recv (packed), or in place in a whole-shaped buffer
      void* whole = c->recv == nullptr ? c->send : (c->recv_whole ? c->recv : nullptr);
      if (flat) {
        void* mine = whole != nullptr ? tdm_at(whole, my_off, es) : c->recv;
        if (c->hook != nullptr) return tdm_fused_flat(h, c, c->send, mine, n, es, false);
        if (even) {
          TDM_NCCL(h, ncclReduceScatter(c->send, mine, static_cast<size_t>(n / p), type, op, h->comm, h->wire));
          return 0;
        }
        return tdm_reduce_parts(h, c, c->send, mine, n, 0, fx::part_count(n, p, 0), es);
      }
      // A Dim partition NCCL cannot split: all-reduce a staged copy, keep this rank's rows.
      if (static_cast<size_t>(n) * es > h->staging_bytes) return tdm_fail(h, "staging buffer too small for a reduce-scatter");
      TDM_CUDA_H(h, cudaMemcpyAsync(h->staging, c->send, static_cast<size_t>(n) * es, cudaMemcpyDeviceToDevice, h->wire));
      TDM_NCCL(h, ncclAllReduce(h->staging, h->staging, static_cast<size_t>(n), type, op, h->comm, h->wire));
      if (whole != nullptr) {
        const int64_t off = fx::part_offset(c->rows, p, r), cnt = fx::part_count(c->rows, p, r);
        const size_t seg = static_cast<size_t>(cnt * c->inner) * es, pitch = static_cast<size_t>(c->rows * c->inner) * es;
        if (seg > 0)
          TDM_CUDA_H(h, cudaMemcpy2DAsync(tdm_at(whole, off * c->inner, es), pitch, tdm_at(h->staging, off * c->inner, es), pitch,
                                          seg, static_cast<size_t>(c->outer), cudaMemcpyDeviceToDevice, h->wire));
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
          TDM_NCCL(h, ncclAllGather(mine, c->recv, static_cast<size_t>(n / p), type, h->comm, h->wire));
          return 0;
        }
        if (c->send != nullptr && my_cnt > 0)
          TDM_CUDA_H(h, cudaMemcpyAsync(tdm_at(c->recv, my_off, es), c->send, static_cast<size_t>(my_cnt) * es,
                                        cudaMemcpyDeviceToDevice, h->wire));
        return tdm_gather_parts(h, c, c->recv, n, 0, fx::part_count(n, p, 0), es);
      }
      if (c->send != nullptr)
        if (int rc = tdm_pack_dim(h, c, c->recv, c->send, es, true)) return rc;
      return tdm_gather_dim(h, c, c->recv, es);
    }
    case 3:  // broadcast
      if (c->root < 0 || c->root >= p)
        return tdm_fail(h, "step " + std::to_string(c->step) + ": Broadcast root " + std::to_string(c->root) +
                               " is outside the group of " + std::to_string(p) + " ranks");
      TDM_NCCL(h, ncclBroadcast(c->send, c->send, static_cast<size_t>(n), type, c->root, h->comm, h->wire));
      return 0;
    default: return tdm_fail(h, "collective kind " + std::to_string(c->kind) + " from step " + std::to_string(c->step));
  }
}

// After the wire's work: the compute stream waits for it (a synchronous step), or, inside a
// pipeline, the block remembers it for sync().
static int tdm_after_wire(tdm_host* h, int32_t async, int32_t block) {
  if (!async || block < 0) return tdm_order(h, h->wire, h->compute);
  if (static_cast<size_t>(block) >= h->block_done.size()) return tdm_fail(h, "pipeline block " + std::to_string(block) + " beyond the set-up");
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
  if (t->recv) TDM_NCCL(h, ncclRecv(t->data, static_cast<size_t>(t->bytes), ncclInt8, peer, h->world, h->wire));
  else TDM_NCCL(h, ncclSend(t->data, static_cast<size_t>(t->bytes), ncclInt8, peer, h->world, h->wire));
  return tdm_after_wire(h, t->async, t->block);
}

// Blocks <= b of the pipeline have communicated (b < 0: everything): the compute stream waits.
static int tdm_on_sync(void* host, int32_t block) {
  tdm_host* h = static_cast<tdm_host*>(host);
  if (block < 0 || static_cast<size_t>(block) >= h->block_done.size()) return tdm_order(h, h->wire, h->compute);
  const cudaEvent_t e = h->block_done[static_cast<size_t>(block)];
  if (e != nullptr) TDM_CUDA_H(h, cudaStreamWaitEvent(h->compute, e, 0));
  return 0;
}

// Row-major C = op(A) op(B) through column-major cuBLAS: C^T = op(B)^T op(A)^T.
static tdm_host* tdm_gemm_host = nullptr;
static void tdm_sgemm(int trans_a, int trans_b, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                      int ldb, float beta, float* c, int ldc) {
  tdm_host* h = tdm_gemm_host;
  const cublasStatus_t s = cublasSgemm(h->blas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, n, m, k,
                                       &alpha, b, ldb, a, lda, &beta, c, ldc);
  if (s != CUBLAS_STATUS_SUCCESS) tdm_fail(h, "cublasSgemm failed with status " + std::to_string(static_cast<int>(s)));
}
)tdm";

}  // namespace

std::string cuda_prefix(int symbols) {
  return std::string(
             "// Emitted by tandem codegen/cuda: one schedule of one program as a standalone CUDA + NCCL program.\n"
             "// Build: make (see the Makefile). Run: mpirun -np N ./<name> [SYMBOL=EXTENT ...] [--iters K]\n"
             "#include <cublas_v2.h>\n#include <cuda_runtime.h>\n#include <mpi.h>\n#include <nccl.h>\n\n"
             "#include <algorithm>\n#include <chrono>\n#include <cmath>\n#include <cstdint>\n#include <cstdio>\n"
             "#include <cstdlib>\n#include <cstring>\n#include <fstream>\n#include <string>\n#include <vector>\n\n"
             "extern \"C\" {\n") +
         abi_declarations() + "}\n\n// ---- core/formulas.h\n" + std::string(formulas_text()) +
         fmt::format("\n// ---- the CUDA prefix\n#define TANDEM_ACC_SLOTS {}\nstatic const int tdm_nsyms_used = {};\n"
                     "struct tdm_syms {{ int64_t v[{}]; }};\n",
                     TANDEM_ACC_SLOTS, symbols, symbols < 1 ? 1 : symbols) +
         kPrefixTail;
}

const std::string& cuda_runtime() {
  static const std::string text = kRuntime;
  return text;
}

}  // namespace tandem::codegen
