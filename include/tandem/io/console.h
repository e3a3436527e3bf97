// Console output helpers shared by the commands' progress displays: whether a stream is a
// terminal, and durations and token rates as short human-readable text.
#pragma once

#include <cstdio>
#include <string>

namespace tandem::io {

// Whether `f` is a terminal (isatty).
bool is_terminal(std::FILE* f);

// "1m05s", "2h03m", "42s"; "?" when not yet known.
std::string format_duration(double seconds);
// "950 tok/s", "12.3k tok/s", "4.56M tok/s".
std::string format_rate(double tokens_per_s);

}  // namespace tandem::io
