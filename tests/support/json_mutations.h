// Hostile edits of a valid JSON document, for the readers' mutation tests: the document and each
// value in it replaced by one nested thousands deep, an oversized one (a long string, a long
// array, integers past 64 bits, a number past a double), or one of every other JSON type; and the
// check that a reader given each either reads it or refuses it with one short UserError naming
// the file, never a crash, another exception or the JSON library's own text. The byte-level
// damage of mutations.h tests the parser; these test what a reader does with what it parsed.
#pragma once

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/core/error.h"

namespace tandem::testing {

struct JsonMutant {
  std::string where;  // the value replaced, as a JSON pointer ("" for the document)
  std::string key;    // the nearest object key on the way to it ("" for none)
  std::string text;   // the mutated document
};

namespace json_mutations_detail {

using Json = nlohmann::ordered_json;

// The replacements, as JSON text: nested 3000 deep (arrays, objects), oversized, every type.
inline const std::vector<std::string>& replacements() {
  static const std::vector<std::string> all = [] {
    std::string deep_object;
    for (int i = 0; i < 3000; ++i) deep_object += "{\"a\":";
    deep_object += "1" + std::string(3000, '}');
    std::string long_array = "[0";
    for (int i = 0; i < 20000; ++i) long_array += ",0";
    long_array += "]";
    return std::vector<std::string>{std::string(3000, '[') + std::string(3000, ']'),
                                    deep_object,
                                    '"' + std::string(size_t{1} << 16, 'a') + '"',
                                    long_array,
                                    "\"\"",
                                    "\"x\"",
                                    "-1",
                                    "0",
                                    "1.5",
                                    "9223372036854775808",
                                    "18446744073709551616",
                                    "-9223372036854775809",
                                    "1e308",
                                    "1e999",
                                    "true",
                                    "null",
                                    "[]",
                                    "{}",
                                    "[1,\"x\",null]"};
  }();
  return all;
}

// The paths worth replacing: every member of an object of up to 32 members (a record's fields);
// the first 3 of a larger object (a map: a vocabulary) and of an array (one entry stands for all).
inline void collect(const Json& v, const Json::json_pointer& at, const std::string& key,
                    std::vector<std::pair<Json::json_pointer, std::string>>& out) {
  out.emplace_back(at, key);
  if (v.is_object()) {
    size_t n = 0;
    for (const auto& [k, child] : v.items()) {
      if (v.size() > 32 && n++ == 3) break;
      collect(child, at / k, k, out);
    }
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size() && i < 3; ++i) collect(v[i], at / i, key, out);
  }
}

}  // namespace json_mutations_detail

// Every mutant of `valid` (a JSON document), in a fixed order.
inline std::vector<JsonMutant> json_mutants(const std::string& valid) {
  using namespace json_mutations_detail;
  const Json doc = Json::parse(valid);
  std::vector<std::pair<Json::json_pointer, std::string>> paths;
  collect(doc, Json::json_pointer(), "", paths);
  // A string no document holds, replaced in the dump by the raw replacement text.
  const std::string marker = "\x01tandem-mutant\x01";
  const std::string quoted = Json(marker).dump();
  std::vector<JsonMutant> out;
  for (const auto& [at, key] : paths) {
    Json m = doc;
    m[at] = marker;
    const std::string text = m.dump();
    const size_t pos = text.find(quoted);
    for (const std::string& r : replacements())
      out.push_back(
          {at.to_string(), key, text.substr(0, pos) + r + text.substr(pos + quoted.size())});
  }
  return out;
}

// What a reader made of the mutants.
struct JsonMutationCounts {
  int read = 0;
  int refused = 0;
};

// Gives each mutant to `read` (which writes it where the reader looks and reads it); each must
// be read, or refused with a UserError that names `file`, is one line of at most 600 characters
// and carries no "[json.exception" text. Anything else is a test failure naming the mutant (the
// first ten are shown whole, cut to a few hundred characters).
template <typename Read>
JsonMutationCounts check_json_mutants(const std::vector<JsonMutant>& mutants,
                                      const std::string& file, Read&& read) {
  auto cut = [](std::string_view s) {
    return s.size() > 300 ? std::string(s.substr(0, 300)) + "..." : std::string(s);
  };
  JsonMutationCounts c;
  int failures = 0;
  auto fail = [&](const std::string& why, std::string_view msg, const JsonMutant& m) {
    if (++failures <= 10)
      ADD_FAILURE() << why << ": " << cut(msg) << "\n  mutant at '" << m.where
                    << "': " << cut(m.text);
  };
  for (const JsonMutant& m : mutants) {
    try {
      read(m.text);
      ++c.read;
    } catch (const UserError& e) {
      ++c.refused;
      const std::string_view msg = e.what();
      if (msg.find(file) == std::string_view::npos) fail("does not name " + file, msg, m);
      if (msg.find("json.exception") != std::string_view::npos) fail("library text", msg, m);
      if (msg.find('\n') != std::string_view::npos) fail("more than one line", msg, m);
      if (msg.size() > 600) fail(std::to_string(msg.size()) + " characters", msg, m);
    } catch (const std::exception& e) {
      fail("not a UserError", e.what(), m);
    }
  }
  EXPECT_EQ(failures, 0) << "of " << mutants.size() << " mutants";
  return c;
}

}  // namespace tandem::testing
