// A slow tier's sustained bandwidth, the one probe of it: what the performance model, the
// out-of-core profile and the block store's predictions read a tier's rate from.
#pragma once

#include <cstddef>
#include <cstdint>

#include "tandem/ooc/slow_tier.h"

namespace tandem::perf {

// Bytes a probe moves each way: enough to pass the disk's and the page cache's first bursts,
// little enough to take well under a second on a host tier.
inline constexpr uint64_t kTierProbeBytes = 64ull << 20;

// Sustained (steady-state) bandwidth of `tier`: after an untimed warm-up that writes the range
// once, writes then reads its first `bytes` (a multiple of ooc::kIoAlignment, at most the
// capacity) in transfers of `chunk` bytes (a multiple of ooc::kIoAlignment) from an aligned
// buffer. Overwrites what the tier held there.
ooc::TierBandwidth measure_tier(ooc::SlowTier& tier, uint64_t bytes, size_t chunk = 8 << 20);

// The bandwidth of a tier of `spec`: a probe tier of `bytes` opened for it (a file tier's in its
// folder), measured as above and closed. `holds` names the probe in a full disk's message.
ooc::TierBandwidth measure_tier(const ooc::TierSpec& spec, uint64_t bytes = kTierProbeBytes,
                                const char* holds = "the performance model's bandwidth probe");

}  // namespace tandem::perf
