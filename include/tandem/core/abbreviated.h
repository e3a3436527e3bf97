// Long names in messages shown short, so that every error stays one readable line.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tandem {

// `text` (a name, a path, a value from a file) as a message shows it: at most `max` characters,
// a longer one cut in the middle ("head...tail (N characters)"), control characters (a newline,
// a tab) as '?'.
std::string abbreviated(std::string_view text, size_t max = 80);

}  // namespace tandem
