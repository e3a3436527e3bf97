// The slow memory tier that swapped-out activations live in: host memory, or a swap file on a fast
// disk read and written with O_DIRECT.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace tandem::ooc {

// O_DIRECT transfers need buffer addresses, file offsets and sizes that are multiples of this.
inline constexpr size_t kIoAlignment = 4096;

// Where the slow tier lives, as a user writes it on the command line.
struct TierSpec {
  enum class Kind { Host, File };
  Kind kind = Kind::Host;
  std::string dir;  // File only: the folder the swap file goes in

  // "host" or "file:DIR"; a UserError naming the text and the two accepted forms otherwise.
  static TierSpec parse(std::string_view text);
  // The text parse() reads back into the same spec.
  std::string str() const;
};

// A store of `capacity()` bytes addressed by byte offset. Transfers are blocking; one writer and
// one reader may run at once on different ranges (a transfer engine's two streams).
class SlowTier {
 public:
  virtual ~SlowTier() = default;

  // Copies `bytes` between memory and the tier at byte `offset`; offset + bytes <= capacity(). For
  // the file tier the memory address, the offset and the size are multiples of kIoAlignment. A
  // failed transfer throws a UserError naming the path, the bytes, the offset and the reason.
  virtual void write(uint64_t offset, const void* src, size_t bytes) = 0;
  virtual void read(uint64_t offset, void* dst, size_t bytes) = 0;

  virtual uint64_t capacity() const = 0;
  // For logs: "host memory", or "file /tmp/x/tandem-swap-123-ab12cd (O_DIRECT)".
  virtual std::string describe() const = 0;
};

// Opens a tier able to hold `bytes` (its capacity is `bytes` rounded up to kIoAlignment). The file
// tier reserves its disk space now, so that a full disk is reported before training starts, and
// its file is already unlinked, so it disappears however the process ends. `holds` says what the
// tier is for, in a full disk's message ("cannot reserve 2 GiB ... for <holds>").
std::unique_ptr<SlowTier> open_slow_tier(const TierSpec& spec, uint64_t bytes,
                                         std::string_view holds = "swapped activations");

// A tier's sustained rates each way (measured by perf/tier_bandwidth.h).
struct TierBandwidth {
  double write_bytes_per_s = 0;
  double read_bytes_per_s = 0;
};

}  // namespace tandem::ooc
