// Byte counts: printing and parsing.
#include "tandem/core/bytes.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>
#include <string>

#include "tandem/core/error.h"

namespace tandem {
namespace {

// The whole of `text` as a number ("1.5"), or nothing.
std::optional<double> parse_number(const std::string& text) {
  try {
    size_t used = 0;
    const double v = std::stod(text, &used);
    if (used == text.size()) return v;
  } catch (const std::exception&) {
  }
  return std::nullopt;
}

}  // namespace

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  if (u == 0) return fmt::format("{} B", bytes);
  return fmt::format("{:.{}f} {}", v, v < 10 ? 2 : 1, units[u]);
}

uint64_t parse_bytes(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  const std::string number(text.substr(0, i));
  std::string unit(text.substr(i));
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  const std::optional<double> value = parse_number(number);
  if (!value)
    user_error(
        "'{}' is not a size: write a number of bytes or one with a unit, e.g. 600MiB, "
        "1.5GiB, 2G",
        text);
  double scale = 0;
  const std::string_view units[] = {"", "B", "K", "KIB", "M", "MIB", "G", "GIB", "T", "TIB"};
  const double binary[] = {1, 1, 0x1p10, 0x1p10, 0x1p20, 0x1p20, 0x1p30, 0x1p30, 0x1p40, 0x1p40};
  for (size_t u = 0; u < std::size(units); ++u)
    if (unit == units[u]) scale = binary[u];
  if (unit == "KB") scale = 1e3;
  if (unit == "MB") scale = 1e6;
  if (unit == "GB") scale = 1e9;
  if (unit == "TB") scale = 1e12;
  if (scale == 0)
    user_error(
        "'{}' has an unknown unit '{}': use B, KiB, MiB, GiB, TiB (or K, M, G, T), or "
        "KB, MB, GB, TB for powers of 1000",
        text, text.substr(i));
  const double bytes = std::floor(*value * scale);
  if (!(bytes >= 1) || bytes > 0x1p62) user_error("'{}' is not a usable size", text);
  return static_cast<uint64_t>(bytes);
}

uint64_t parse_budget(std::string_view text, uint64_t whole) {
  if (text.empty() || text.back() != '%') return parse_bytes(text);
  const std::optional<double> pct = parse_number(std::string(text.substr(0, text.size() - 1)));
  if (!pct) user_error("'{}' is not a share: write a percentage such as 25%", text);
  if (!(*pct > 0) || *pct > 1000)
    user_error("'{}' is not a usable share: it must be above 0% and at most 1000%", text);
  return std::max<uint64_t>(
      1, static_cast<uint64_t>(std::floor(static_cast<double>(whole) * *pct / 100.0)));
}

}  // namespace tandem
