// The runtime of every emitted CUDA program, after the plan's steps and tables: the ABI's
// callbacks (collectives and transfers over NCCL on a communication stream, ordered against the
// compute stream by events; SGEMM by cuBLAS).
#pragma once

#include <string>
#include <vector>

#include "cuda_prefix.cuh"

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
    case 4:  // shift: to the next rank while the previous one's arrives, one group so neither waits
      if (p == 1) {
        TDM_CUDA_H(h, cudaMemcpyAsync(c->recv, c->send, static_cast<size_t>(n) * es,
                                      cudaMemcpyDeviceToDevice, h->wire));
        return 0;
      }
      TDM_NCCL(h, ncclGroupStart());
      TDM_NCCL(h, ncclSend(c->send, static_cast<size_t>(n), type, (r + 1) % p, h->comm, h->wire));
      TDM_NCCL(h,
               ncclRecv(c->recv, static_cast<size_t>(n), type, (r + p - 1) % p, h->comm, h->wire));
      TDM_NCCL(h, ncclGroupEnd());
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
