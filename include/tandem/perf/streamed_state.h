// The performance model's arithmetic for model state streamed from a tier beside the
// activations (--model-state): what a step's I/O takes, what the step takes, and how many blocks
// to keep resident in what the budget leaves.
#pragma once

#include <cstdint>
#include <functional>

#include "tandem/ooc/slow_tier.h"
#include "tandem/parallel/block_store.h"

namespace tandem::perf {

// The store's traffic a step (BlockStore::predicted_step_traffic) at the tier's bandwidth.
double store_io_s(const parallel::BlockStore::Traffic& traffic, const ooc::TierBandwidth& bw);

// A step's model-state I/O: the store's own (`store_io_s`), and, when the activations swap to the
// same tier (one disk, one transfer engine), their `swapped_bytes` written and read back at the
// tier's measured bandwidth.
double state_io_s(double store_io_s, uint64_t swapped_bytes, const ooc::TierBandwidth& bw,
                  bool swaps_share_the_tier);

// A step with its model state streamed: the store's transfers run beside compute (prefetching
// ahead, writing behind), so a step takes about the longer of the two.
inline double streamed_step_s(double compute_s, double state_io_s) {
  return compute_s > state_io_s ? compute_s : state_io_s;
}

// The count r in [0, n] of resident blocks with the shortest predicted step max(compute_s(r),
// io_s(r)), where compute_s (the activations under what the budget has left: nondecreasing in r,
// infinite where the blocks do not fit) and io_s (nonincreasing) are the model's predictions. The
// shortest is where they cross; of counts predicting the same step, the most resident (less
// traffic on a disk the activations' swaps may share). Asks O(log n) values of each; 0 when even
// r = 0 does not fit.
int fastest_resident_blocks(int n, const std::function<double(int)>& compute_s,
                            const std::function<double(int)>& io_s);

}  // namespace tandem::perf
