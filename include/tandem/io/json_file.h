// JSON files tandem reads (checkpoint metadata, shards.json, tokenizer.json, config.json, the
// cache's records): parsed with a limit on nesting, and their fields read with the type expected,
// so that a hostile or damaged file gives one UserError naming the file and the field, never a
// signal (a value nested 100 000 deep overflows the stack of every recursive walk over it: a copy,
// a comparison, dump()) nor nlohmann's own "[json.exception...]" text.
#pragma once

#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace tandem::io {

// The deepest nesting of arrays and objects a file tandem reads may have; none it writes goes past
// 6.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text`, the contents of `file` (as messages name it, e.g. "checkpoint metadata
// 'ck/meta.json'"); not JSON, or nested deeper than kMaxJsonDepth, is a UserError naming it.
nlohmann::json parse_json(std::string_view text, const std::string& file);
nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& file);

// read_file (atomic_file.h) and parse_json: "<what> '<path>'" is how messages name it.
nlohmann::json read_json_file(const std::string& path, std::string_view what = "file");

// A value as a message may quote it: scalars as they are (strings cut to 200 bytes), arrays and
// objects by their kind and size ("an array of 3"), never dumped whole.
std::string json_excerpt(const nlohmann::json& v);

// Typed fields. `file` names the file as parse_json's messages do; `field` names the value's place
// ("model.n_layers", "train.shards[2].file"). Each refusal reads
// "<file>: '<field>' must be <what> (it is <excerpt>)", or "<file> has no '<field>'".
const nlohmann::json& json_member(const nlohmann::json& object, std::string_view key,
                                  const std::string& file, std::string_view field);
const nlohmann::json& json_object(const nlohmann::json& v, const std::string& file,
                                  std::string_view field);
const nlohmann::json& json_array(const nlohmann::json& v, const std::string& file,
                                 std::string_view field);
std::string json_string(const nlohmann::json& v, const std::string& file, std::string_view field);
bool json_bool(const nlohmann::json& v, const std::string& file, std::string_view field);
// An integer in [lo, hi] (a float with no fraction is not one).
int64_t json_int(const nlohmann::json& v, const std::string& file, std::string_view field,
                 int64_t lo = std::numeric_limits<int64_t>::min(),
                 int64_t hi = std::numeric_limits<int64_t>::max());
uint64_t json_u64(const nlohmann::json& v, const std::string& file, std::string_view field);
// A finite number.
double json_number(const nlohmann::json& v, const std::string& file, std::string_view field);

// The member `key` of `object` (which must be one) read as above: "<parent>.<key>" in messages.
inline std::string json_field(std::string_view parent, std::string_view key) {
  return parent.empty() ? std::string(key) : std::string(parent) + "." + std::string(key);
}

// A file name an entry of `file` gives (a shard of shards.json, its tokenizer) joined to `dir`,
// the folder `file` is in: a plain name, no folder part, no "..", not absolute, so that no entry
// reaches outside the folder. A UserError naming the entry and the file otherwise.
std::string file_in_folder(const std::string& dir, const std::string& name, const std::string& file,
                           std::string_view field);

}  // namespace tandem::io
