// The C calling convention between a compiled plan (code emitted by codegen/cpp) and the host
// that runs it (exec/compiled): plain C structs of pointers, sizes and callbacks, written once in
// a macro so that the host compiles it and the emitter pastes the very same text into every
// generated translation unit. The emitted code never sees a tandem type, a Communicator or a
// BLAS header: everything it needs from the outside comes through these callbacks.
//
// Contract.
// - Every entry point has the signature `int fn(const tandem_args*)` and returns 0, or the
//   non-zero code a host callback returned (the host keeps the exception that code stands for).
//   Symbols: tandem_run (every step in order), tandem_step_<k> (top-level step k alone),
//   tandem_scratch_elems (the f32 scratch the steps need, from sym/p/r), tandem_abi_version.
// - buf[id] is the base of the buffer stage id's value lives in, aliases already resolved to the
//   owning value (an update's buffer is its input's; a Slice computed in a Full buffer points at
//   the Full buffer). A Block value (a slice inside a Pipeline) holds this rank's part of every
//   block, one after the other: block b's part starts at row part_row0 of the buffer (row-sliced
//   values) or at the block's first row (values sliced along another dim). Nothing is reused
//   between blocks, so block b + 1 is produced while block b is still being reduced or sent.
// - Collectives and transfers are handed to the host as descriptors. A collective's hook is an
//   emitted function the host installs as the communicator's ChunkHook; the host passes each
//   chunk with its global flat index (index_base + the communicator's offset).
// - Inside a Pipeline, descriptors marked `async` may be run by the host on a communication
//   thread, in issue order; sync(host, b) returns once the async work of blocks <= b is done
//   (b = -1: all of it).
#pragma once

#include <stdint.h>

#define TANDEM_ABI_VERSION 3

// Doubles per stage in tandem_args::acc: a Norm / Reduce Sum over every dim accumulates in 8
// lanes keyed by the global flat index (dsl/elementwise.h, SumLanes); Prod, Max and Min keep
// their f32 value in the first.
#define TANDEM_ACC_SLOTS 8

// The ABI's declarations, as one macro: the host expands it, the emitter stringifies it.
#define TANDEM_KERNEL_ABI                                                                         \
  typedef struct tandem_block {                                                                   \
    int64_t row0;      /* the block's first row (dim 0 of the pipelined values) */                \
    int64_t rows;      /* its row count */                                                        \
    int64_t part_row0; /* this rank's rows of row-sliced Block values in the blocks before */     \
    int32_t index;     /* b */                                                                    \
    int32_t count;     /* the number of blocks */                                                 \
  } tandem_block;                                                                                 \
  typedef struct tandem_args tandem_args;                                                         \
  typedef int (*tandem_hook_fn)(const tandem_args* a, void* chunk, int64_t n, int64_t g0,         \
                                const tandem_block* blk);                                         \
  typedef struct tandem_collective {                                                              \
    int32_t step;  /* the plan's top-level step, for messages */                                  \
    int32_t kind;  /* 0 all_reduce, 1 reduce_scatter, 2 all_gather, 3 broadcast, 4 shift */       \
    int32_t op;    /* 0 sum, 1 prod, 2 max, 3 min: core/reduce_op.h's reduce_op_code */           \
    int32_t dtype; /* 0 f32, 1 bf16, 2 f16 */                                                     \
    int32_t root;                                                                                 \
    int32_t async; /* may run on the host's communication thread */                               \
    int32_t carry; /* all_reduce: the hook overwrites each chunk, and that is what is gathered */ \
    int32_t recv_whole; /* RS: recv is shaped as the whole; this rank's part goes in its place */ \
    void* send;         /* AR, BC: the buffer. RS: the whole input. AG: this part, 0 = in recv */ \
    void* recv;         /* RS: this rank's part, 0 = in place in send. AG: the whole output */    \
    /* shift: send goes to the next rank of the group, recv gets the previous rank's */           \
    int64_t outer, rows, inner; /* the whole buffer as [outer, rows, inner], split by rows */     \
    int64_t index_base;         /* the global flat index of the buffer's first element */         \
    tandem_hook_fn hook;                                                                          \
    tandem_block block; /* index -1 outside a pipeline */                                         \
  } tandem_collective;                                                                            \
  typedef struct tandem_transfer {                                                                \
    int32_t step;                                                                                 \
    int32_t recv;       /* 0 send, 1 receive */                                                   \
    int32_t peer_group; /* the same-index rank of this group is the peer */                       \
    int32_t tag;                                                                                  \
    int32_t async;                                                                                \
    int32_t block;                                                                                \
    void* data;                                                                                   \
    int64_t bytes;                                                                                \
  } tandem_transfer;                                                                              \
  typedef void (*tandem_sgemm_fn)(int trans_a, int trans_b, int m, int n, int k, float alpha,     \
                                  const float* a, int lda, const float* b, int ldb, float beta,   \
                                  float* c, int ldc);                                             \
  struct tandem_args {                                                                            \
    void* const* buf;     /* per stage id: the base of its value's buffer */                      \
    double* acc;          /* stage id's TANDEM_ACC_SLOTS accumulator lanes (Norm, Reduce all) */  \
    float* scratch;       /* f32 scratch, tandem_scratch_elems() long */                          \
    const int64_t* sym;   /* the symbols' extents, in Program::symbols() order */                 \
    const uint64_t* seed; /* per stage id: a Scalar stage's value as a dropout seed */            \
    int32_t p, r, group;  /* the group's size, this rank's index in it, this rank's group */      \
    int32_t pad;                                                                                  \
    void* host;                                                                                   \
    int (*collective)(void* host, const tandem_collective* c);                                    \
    int (*transfer)(void* host, const tandem_transfer* t);                                        \
    int (*sync)(void* host, int32_t block);                                                       \
    tandem_sgemm_fn sgemm;                                                                        \
    const int64_t* seg; /* segment bounds, nseg + 1 of them (programs with segment ops) */        \
    int64_t nseg;                                                                                 \
  };

#define TANDEM_ABI_STRINGIFY2(...) #__VA_ARGS__
#define TANDEM_ABI_STRINGIFY(...) TANDEM_ABI_STRINGIFY2(__VA_ARGS__)
// The declarations as text, for the emitter (one line; codegen reflows it).
#define TANDEM_KERNEL_ABI_TEXT TANDEM_ABI_STRINGIFY(TANDEM_KERNEL_ABI)

#ifdef __cplusplus
extern "C" {
#endif
TANDEM_KERNEL_ABI
typedef int (*tandem_entry_fn)(const tandem_args*);
typedef int64_t (*tandem_scratch_fn)(const tandem_args*);
#ifdef __cplusplus
}
#endif
