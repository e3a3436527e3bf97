// The element-wise kernels collective algorithms are built from: reduce k inputs into one
// output, and copy. Internal to comm/.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/comm/communicator.h"
#include "tandem/core/dtype.h"

namespace tandem::comm::detail {

// dst[i] = srcs[0][i] op srcs[1][i] op ... op srcs[k-1][i] for i < n, combined left to right.
// bf16 and f16 are combined in f32 and rounded once, when stored. dst may be one of srcs (the
// kernel works in tiles: a tile of every input is read before the tile of dst is written).
// k >= 1; with k == 1 this is a copy (a conversion round trip for bf16/f16 is exact).
void reduce_into(DType t, ReduceOp op, void* dst, const void* const* srcs, int k, int64_t n);

// dst = a op b: one ring step.
inline void reduce2(DType t, ReduceOp op, void* dst, const void* a, const void* b, int64_t n) {
  const void* srcs[2] = {a, b};
  reduce_into(t, op, dst, srcs, 2, n);
}

// Copies `bytes` from src to dst (no overlap). With `streaming`, stores bypass the cache
// (non-temporal): for large copies into memory nobody reads soon, it saves the read for ownership
// of every destination line and keeps the cache for the data that is read again. Streaming stores
// are fenced before returning, so a release store that follows publishes them.
void copy_bytes(void* dst, const void* src, size_t bytes, bool streaming);

}  // namespace tandem::comm::detail
