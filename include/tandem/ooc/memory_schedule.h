// A plan made concrete for one stage's step: every buffer the step holds in the fast tier gets an
// arena offset and a lifetime in unit operations, and every operation gets the transfers it
// starts and waits for and the units it recomputes. The runtime carries this out and the
// performance model simulates it, so what is predicted is what runs: the predicted peak is the
// arena's high-water mark.
//
// Operations are one unit's forward or backward for one micro-batch, in the step's order
// (nn::ChainLayout::order expanded: a forward pass is units 0..n-1, a backward n-1..0). Units
// are half blocks (nn/activation_memory.h) of two kinds with their own buffer sizes. A
// region is live from the start of its first operation to the end of its last; regions live at
// the same time never overlap in the arena (greedy placement, largest first). Transfers:
//   - a swapped unit's input and buffers are written out when its forward ends; their regions
//     stay live for `release` more operations, and the operation after that waits for the
//     writes before it starts (its memory may be reused);
//   - they are read back into one region at the start of the operation `prefetch` places before
//     the unit's backward (never before their writes are complete), and that backward waits
//     for the reads.
// A recomputed segment's units are re-run at the start of the backward of its last unit, into
// regions live until each unit's own backward.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/nn/activation_memory.h"
#include "tandem/ooc/plan.h"

namespace tandem::ooc {

inline constexpr uint64_t kRegionAlignment = 4096;  // O_DIRECT transfers go straight to the arena

struct UnitOp {
  bool forward;
  int micro;
  int unit;
  bool operator==(const UnitOp&) const = default;
};
std::vector<UnitOp> expand(const nn::ChainLayout& chain);

struct Region {
  std::string name;  // "m0.h3.mlp.buffers", "m0.h3.mlp.input", "workspace", ...
  uint64_t bytes = 0;
  uint64_t offset = 0;  // in the arena
  int first_op = 0, last_op = 0;
};

struct Transfer {
  bool write;                  // to the slow tier (else from it)
  int region;                  // the fast-tier region
  uint64_t region_offset = 0;  // where in the region
  uint64_t bytes = 0;
  uint64_t tier_offset = 0;
  int micro, unit;
  int after_write = -1;  // a read: the write of the same data, which must be complete first
};

struct OpActions {
  std::vector<int> finish_writes;  // complete before the operation starts: their memory is reused
  std::vector<int> issue_reads;    // started at the operation's start, after finish_writes
  std::vector<int> finish_reads;   // complete before the operation computes
  std::vector<int> recompute;      // units whose forward runs again first (a backward), ascending
  std::vector<int> issue_writes;   // started when the operation's compute ends
};

// Where one unit's data is during each phase of a micro-batch (region ids; -1 where none).
struct UnitRegions {
  int input_fwd = -1, buffers_fwd = -1;  // written in the forward
  int back = -1;                         // Swap: input then buffers, read back
  int input_re = -1, buffers_re = -1;    // Recompute/Continue: recomputed
  int out_scratch = -1;                  // the last unit of a segment: its output, rewritten
};

class MemorySchedule {
 public:
  MemorySchedule(const nn::ChainLayout& chain, const Plan& plan);

  const nn::ChainLayout& chain() const { return chain_; }
  const Plan& plan() const { return plan_; }
  const std::vector<UnitOp>& ops() const { return ops_; }
  const std::vector<Region>& regions() const { return regions_; }
  const std::vector<Transfer>& transfers() const { return transfers_; }
  const std::vector<OpActions>& actions() const { return actions_; }
  const UnitRegions& unit_regions(int micro, int unit) const;
  int head_input(int micro) const;  // x_n
  int head(int micro) const;        // the head's buffers (-1 without a head)
  int workspace() const { return workspace_; }
  int op_index(const UnitOp& op) const;  // -1 if the step has no such operation

  uint64_t peak_bytes() const { return peak_; }        // the arena extent this step needs
  uint64_t tier_bytes() const { return tier_bytes_; }  // the slow tier's extent
  uint64_t swapped_bytes() const;                      // written per step
  // Byte offset of each saved buffer of unit u (its kind's saves, in order) inside a buffers
  // region, and the region's size.
  const std::vector<uint64_t>& buffer_offsets(int u) const { return buffer_offsets_[kind(u)]; }
  uint64_t buffers_bytes(int u) const { return buffers_bytes_[kind(u)]; }
  uint64_t input_bytes() const { return input_bytes_; }
  const std::vector<uint64_t>& head_offsets() const { return head_offsets_; }
  const std::vector<uint64_t>& workspace_offsets() const { return workspace_offsets_; }

 private:
  int add_region(std::string name, uint64_t bytes, int first, int last);
  int add_transfer(Transfer t);
  size_t kind(int u) const { return static_cast<size_t>(u) % chain_.kinds.size(); }

  nn::ChainLayout chain_;
  Plan plan_;
  std::vector<UnitOp> ops_;
  std::vector<Region> regions_;
  std::vector<Transfer> transfers_;
  std::vector<OpActions> actions_;
  std::vector<std::vector<UnitRegions>> units_;  // [micro][unit]
  std::vector<int> head_input_, head_;
  int workspace_ = -1;
  uint64_t peak_ = 0, tier_bytes_ = 0;
  std::vector<std::vector<uint64_t>> buffer_offsets_;  // per unit kind
  std::vector<uint64_t> buffers_bytes_;                // per unit kind
  std::vector<uint64_t> head_offsets_, workspace_offsets_;
  uint64_t input_bytes_ = 0;
};

// Places intervals of [first, last] x bytes at offsets so that intervals live at the same time do
// not overlap, largest first, each at the lowest offset that fits; returns the extent.
struct Interval {
  uint64_t bytes;
  int first, last;
  uint64_t offset = 0;
};
uint64_t place(std::vector<Interval>& intervals);

}  // namespace tandem::ooc
