// Byte counts as users write and read them: "--memory-budget 600MiB" (or "25%"), "needs 1.25 GiB".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tandem {

// "1.25 GiB", "600.0 MiB", "4.0 KiB", "12 B".
std::string human_bytes(uint64_t bytes);
// "600MiB", "1.5GiB", "2G", "512M", "4096" (plain bytes); KiB/MiB/GiB/TiB and K/M/G/T are powers
// of 1024, KB/MB/GB/TB powers of 1000. UserError naming the text otherwise.
uint64_t parse_bytes(std::string_view text);
// A budget: a size as parse_bytes reads it, or a share of `whole` ("25%": a quarter of it, the
// trainer's `whole` being the in-core need). UserError naming the text otherwise.
uint64_t parse_budget(std::string_view text, uint64_t whole);
// `bytes` rounded up to a multiple of `multiple` (an alignment).
inline uint64_t round_up(uint64_t bytes, uint64_t multiple) {
  return (bytes + multiple - 1) / multiple * multiple;
}

}  // namespace tandem
