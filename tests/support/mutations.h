// Seeded random damage to a valid file's bytes, for the loaders' mutation tests: a byte flipped,
// the text cut short, random bytes appended or inserted, a number made negative or huge.
#pragma once

#include <cstdint>
#include <random>
#include <string>

namespace tandem::testing {

// The `seed`th mutation of `valid` (the same seed gives the same bytes on every machine).
inline std::string mutate(const std::string& valid, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto below = [&](size_t n) { return n == 0 ? size_t{0} : static_cast<size_t>(rng() % n); };
  std::string s = valid;
  const int edits = 1 + static_cast<int>(below(3));
  for (int e = 0; e < edits; ++e) {
    switch (below(6)) {
      case 0:  // flip the bits of one byte
        if (!s.empty()) s[below(s.size())] ^= static_cast<char>(1 + below(255));
        break;
      case 1:  // cut short
        s.resize(below(s.size() + 1));
        break;
      case 2: {  // random bytes appended
        const size_t n = 1 + below(16);
        for (size_t i = 0; i < n; ++i) s += static_cast<char>(rng());
        break;
      }
      case 3:  // random bytes inserted
        s.insert(below(s.size() + 1), std::string(1 + below(4), static_cast<char>(rng())));
        break;
      case 4: {  // a digit made a minus sign (a negative count)
        const size_t at = s.find_first_of("0123456789", below(s.size() + 1));
        if (at != std::string::npos) s.insert(at, "-");
        break;
      }
      default: {  // a number made huge
        const size_t at = s.find_first_of("0123456789", below(s.size() + 1));
        if (at != std::string::npos) s.insert(at, below(2) ? "99999999999999999999" : "1e300");
        break;
      }
    }
  }
  return s;
}

}  // namespace tandem::testing
