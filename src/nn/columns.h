// Internal: column-split parallelism for reductions over rows (parameter gradients summed over
// tokens), so that they run on several threads without partial buffers and without changing a bit.
#pragma once

#include <algorithm>
#include <cstdint>

#include "tandem/core/parallel.h"

namespace tandem::nn::detail {

// Columns per block: ranges start at a multiple of this, so two threads never write one cache
// line of a 64-byte-aligned gradient, and the vector loop gets whole registers. (Bits do not
// depend on it: each column is its own chain of adds, and -ffp-contract=off fuses nothing.)
inline constexpr int kColumnBlock = 16;
// Elements (rows x columns) per thread at least, as in the elementwise passes.
inline constexpr int64_t kParallelGrain = int64_t{1} << 15;

// Runs body(c0, c1) over [0, C) in ranges of whole column blocks, in parallel (core/parallel.h).
// A body sums each of its columns over all rows in row order, so every column's result is the
// serial loop's whatever the split: deterministic at any width, and no scratch.
template <class Body>
void for_column_blocks(int64_t C, int64_t rows, const Body& body) {
  const int64_t blocks = (C + kColumnBlock - 1) / kColumnBlock;
  const int64_t grain =
      std::max<int64_t>(1, kParallelGrain / std::max<int64_t>(1, rows * kColumnBlock));
  parallel_for(blocks, grain, [&](int64_t b0, int64_t b1) {
    body(b0 * kColumnBlock, std::min(C, b1 * kColumnBlock));
  });
}

}  // namespace tandem::nn::detail
