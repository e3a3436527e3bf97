// Builds the message of an internal error (where it happened and what to do about it), and the
// short form of long names in messages.
#include "tandem/core/error.h"

#include "tandem/core/abbreviated.h"

namespace tandem {

std::string abbreviated(std::string_view text, size_t max) {
  const std::string suffix = fmt::format(" ({} characters)", text.size());
  std::string out;
  if (text.size() <= max || max < suffix.size() + 8) {
    out = text.size() <= max ? std::string(text) : std::string(text.substr(0, max));
  } else {
    // The end of a name often tells it apart (a file in a folder, a schedule's last part).
    const size_t keep = max - suffix.size() - 3;
    size_t head = keep - keep / 3, tail = text.size() - keep / 3;
    auto continuation = [&](size_t i) {
      return (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80;
    };
    while (head > 0 && continuation(head)) --head;  // cut between characters, not in one
    while (tail < text.size() && continuation(tail)) ++tail;
    out = fmt::format("{}...{}{}", text.substr(0, head), text.substr(tail), suffix);
  }
  for (char& ch : out)
    if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) ch = '?';
  return out;
}

std::string readable_message(const std::string& what) {
  constexpr size_t kLongestRun = 300;
  if (what.size() <= kLongestRun) return what;  // the common case: nothing to look at
  std::string out;
  size_t i = 0;
  while (i < what.size()) {
    const size_t space = what.find(' ', i);
    const size_t end = space == std::string::npos ? what.size() : space;
    const std::string_view run = std::string_view(what).substr(i, end - i);
    if (run.size() > kLongestRun) {
      out += abbreviated(run, 120);
    } else {
      out += run;
    }
    if (end < what.size()) out += ' ';
    i = end + 1;
  }
  return out;
}

void internal_error(const std::string& what, std::source_location where) {
  throw InternalError(
      fmt::format("tandem internal error at {}:{}: {} (this is a bug in tandem; "
                  "please report it with the command that triggered it)",
                  where.file_name(), where.line(), what));
}

}  // namespace tandem
