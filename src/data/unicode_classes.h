// The Unicode character classes GPT-2's pre-tokenization pattern uses (\p{L}, \p{N}, \s), for
// code points, a UTF-8 decoder that steps through text by code point, and the replacement of
// invalid UTF-8 by U+FFFD. Internal to data/.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace tandem::data::detail {

// General category L* (letters): Lu, Ll, Lt, Lm, Lo (Unicode 14.0).
bool is_letter(char32_t c);
// General category N* (numbers): Nd, Nl, No (Unicode 14.0).
bool is_number(char32_t c);
// The White_Space property, as \s matches it.
bool is_space(char32_t c);

// The code point at `text[at]` and its length in bytes. A byte that does not start a valid UTF-8
// sequence is taken alone, as a code point of no class (U+FFFD), so every input is stepped through.
struct CodePoint {
  char32_t c;
  size_t bytes;
};
CodePoint code_point_at(std::string_view text, size_t at);

// `bytes` with each ill-formed part (a maximal prefix of a valid sequence, else one byte) replaced
// by U+FFFD, as Rust's String::from_utf8_lossy does.
std::string lossy_utf8(std::string_view bytes);

}  // namespace tandem::data::detail
