// The performance model of out-of-core training: one step simulated as three concurrent streams
// (compute, swap-out, swap-in) following a MemorySchedule's dependencies. A backward waits for its
// unit's reads, an operation whose memory is being reused waits for the writes out of it,
// issuing a read waits for the write of the same data, and a recomputed segment's forwards run
// before the backward of its last unit. Transfers take bytes / bandwidth, one at a time per
// stream, in the order they are issued. The peak is the schedule's arena extent, exact.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/ooc/memory_schedule.h"
#include "tandem/ooc/profile.h"

namespace tandem::ooc {

struct TimelineSpan {
  std::string stream;  // "compute", "swap-out", "swap-in"
  std::string name;
  double begin_s, end_s;
};

struct Prediction {
  double step_s = 0;     // from the first operation's start to the last transfer's end
  double compute_s = 0;  // busy time of the compute stream, recomputation included
  double recompute_s = 0;
  double stall_s = 0;  // compute waiting for transfers
  uint64_t peak_bytes = 0;
  uint64_t swapped_bytes = 0;          // written to the slow tier per step
  std::vector<TimelineSpan> timeline;  // when asked for
};

Prediction simulate(const MemorySchedule& schedule, const Profile& profile, bool timeline = false);

// The predicted timeline as a Chrome trace (io/trace.h's format), rank 0, one row per stream.
std::string chrome_trace(const Prediction& p);

}  // namespace tandem::ooc
