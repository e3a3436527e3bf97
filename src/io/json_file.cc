// JSON files read with a nesting limit and typed fields (json_file.h).
#include "tandem/io/json_file.h"

#include <cmath>
#include <filesystem>

#include "tandem/core/error.h"
#include "tandem/io/atomic_file.h"

namespace tandem::io {
namespace {

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string library_text(const std::exception& e) {
  std::string m = e.what();
  const size_t close = m.find("] ");
  if (!m.empty() && m[0] == '[' && close != std::string::npos) m = m.substr(close + 2);
  if (m.size() > 200) m = m.substr(0, 200) + "...";
  return m;
}

// Thrown by the parser's callback past the depth limit; caught below, never escapes.
struct TooDeep {};

template <class Json>
Json parse_with_limit(std::string_view text, const std::string& file) {
  // The callback sees every array and object open at its depth: past the limit it stops the parse
  // before anything deeper is built, so nothing recursive ever walks a deep value.
  typename Json::parser_callback_t limit = [](int depth, typename Json::parse_event_t event,
                                              Json&) {
    if ((event == Json::parse_event_t::array_start || event == Json::parse_event_t::object_start) &&
        depth >= kMaxJsonDepth)
      throw TooDeep{};
    return true;
  };
  try {
    return Json::parse(text.begin(), text.end(), limit);
  } catch (const TooDeep&) {
    user_error("{} nests arrays and objects more than {} deep: it is not a file tandem reads", file,
               kMaxJsonDepth);
  } catch (const nlohmann::json::exception& e) {
    user_error("{} is not valid JSON: {}", file, library_text(e));
  }
}

[[noreturn]] void wrong_type(const nlohmann::json& v, const std::string& file,
                             std::string_view field, std::string_view want) {
  user_error("{}: '{}' must be {} (it is {})", file, field, want, json_excerpt(v));
}

}  // namespace

nlohmann::json parse_json(std::string_view text, const std::string& file) {
  return parse_with_limit<nlohmann::json>(text, file);
}

nlohmann::ordered_json parse_ordered_json(std::string_view text, const std::string& file) {
  return parse_with_limit<nlohmann::ordered_json>(text, file);
}

nlohmann::json read_json_file(const std::string& path, std::string_view what) {
  return parse_json(read_file(path, what), fmt::format("{} '{}'", what, path));
}

std::string json_excerpt(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::array:
      return fmt::format("an array of {}", v.size());
    case nlohmann::json::value_t::object:
      return fmt::format("an object of {} member{}", v.size(), v.size() == 1 ? "" : "s");
    case nlohmann::json::value_t::null:
      return "null";
    case nlohmann::json::value_t::discarded:
      return "nothing";
    default: {
      // A scalar: dump() cannot recurse. Strings cut to 200 bytes (a cut UTF-8 character shown
      // as U+FFFD), quoted as JSON writes them.
      if (!v.is_string()) return v.dump();
      const std::string& text = v.get_ref<const std::string&>();
      const bool cut = text.size() > 200;
      return nlohmann::json(cut ? text.substr(0, 200) : text)
                 .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) +
             (cut ? "..." : "");
    }
  }
}

const nlohmann::json& json_member(const nlohmann::json& object, std::string_view key,
                                  const std::string& file, std::string_view field) {
  if (!object.is_object()) {
    const size_t dot = field.rfind('.');
    const std::string_view parent = dot == std::string_view::npos ? "" : field.substr(0, dot);
    if (parent.empty())
      user_error("{}: the top level must be a JSON object (it is {})", file, json_excerpt(object));
    wrong_type(object, file, parent, "a JSON object");
  }
  const auto it = object.find(key);
  if (it == object.end()) user_error("{} has no '{}'", file, field);
  return *it;
}

const nlohmann::json& json_object(const nlohmann::json& v, const std::string& file,
                                  std::string_view field) {
  if (!v.is_object()) wrong_type(v, file, field, "a JSON object");
  return v;
}

const nlohmann::json& json_array(const nlohmann::json& v, const std::string& file,
                                 std::string_view field) {
  if (!v.is_array()) wrong_type(v, file, field, "an array");
  return v;
}

std::string json_string(const nlohmann::json& v, const std::string& file, std::string_view field) {
  if (!v.is_string()) wrong_type(v, file, field, "a string");
  return v.get<std::string>();
}

bool json_bool(const nlohmann::json& v, const std::string& file, std::string_view field) {
  if (!v.is_boolean()) wrong_type(v, file, field, "true or false");
  return v.get<bool>();
}

int64_t json_int(const nlohmann::json& v, const std::string& file, std::string_view field,
                 int64_t lo, int64_t hi) {
  const std::string want =
      lo == std::numeric_limits<int64_t>::min() && hi == std::numeric_limits<int64_t>::max()
          ? std::string("an integer")
      : hi == std::numeric_limits<int64_t>::max() ? fmt::format("an integer of at least {}", lo)
                                                  : fmt::format("an integer from {} to {}", lo, hi);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(hi)) wrong_type(v, file, field, want);
    return static_cast<int64_t>(u);
  }
  if (!v.is_number_integer()) wrong_type(v, file, field, want);
  const int64_t i = v.get<int64_t>();
  if (i < lo || i > hi) wrong_type(v, file, field, want);
  return i;
}

uint64_t json_u64(const nlohmann::json& v, const std::string& file, std::string_view field) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (!v.is_number_integer() || v.get<int64_t>() < 0)
    wrong_type(v, file, field, "a non-negative integer");
  return static_cast<uint64_t>(v.get<int64_t>());
}

double json_number(const nlohmann::json& v, const std::string& file, std::string_view field) {
  if (!v.is_number() || !std::isfinite(v.get<double>())) wrong_type(v, file, field, "a number");
  return v.get<double>();
}

std::string file_in_folder(const std::string& dir, const std::string& name, const std::string& file,
                           std::string_view field) {
  if (name.empty() || name == "." || name == ".." || name.find('/') != std::string::npos ||
      name.find('\0') != std::string::npos) {
    const std::string shown = name.size() > 80 ? name.substr(0, 80) + "..." : name;
    user_error(
        "{}: '{}' names '{}', which is not a file in its folder (an entry is a plain file name, "
        "without '/' or '..': it may not reach outside the folder)",
        file, field, shown);
  }
  return (std::filesystem::path(dir) / name).string();
}

}  // namespace tandem::io
