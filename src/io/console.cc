// Terminal detection and the short duration and rate texts of progress displays.
#include "tandem/io/console.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>

namespace tandem::io {

bool is_terminal(std::FILE* f) { return f != nullptr && ::isatty(::fileno(f)) == 1; }

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(std::llround(seconds));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

std::string format_rate(double tokens_per_s) {
  if (!std::isfinite(tokens_per_s) || tokens_per_s < 0) return "? tok/s";
  if (tokens_per_s < 1e3) return fmt::format("{:.0f} tok/s", tokens_per_s);
  if (tokens_per_s < 1e6) return fmt::format("{:.1f}k tok/s", tokens_per_s / 1e3);
  return fmt::format("{:.2f}M tok/s", tokens_per_s / 1e6);
}

}  // namespace tandem::io
