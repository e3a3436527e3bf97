// The tuning cache: keys, the machine's identity, and JSON records written atomically.
#include "tandem/tune/cache.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "tandem/comm/communicator.h"
#include "tandem/core/error.h"
#include "tandem/core/private_cache.h"
#include "tandem/io/json_file.h"

namespace tandem::tune {
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

uint64_t fnv1a(const std::string& s, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

std::string sizes_str(const dsl::SymbolMap& sizes) {
  std::vector<std::string> parts;
  for (const auto& [k, v] : sizes) parts.push_back(fmt::format("{}={}", k, v));
  return fmt::format("{}", fmt::join(parts, ","));
}

json key_json(const TuneKey& k) {
  json sizes = json::object();
  for (const auto& [s, v] : k.sizes) sizes[s] = v;
  return {{"program", k.program},
          {"program_hash", k.program_hash},
          {"sizes", sizes},
          {"ranks", k.ranks},
          {"nodes", k.nodes},
          {"backend", k.backend},
          {"executor", k.executor},
          {"machine", k.machine},
          {"candidates", k.candidates}};
}

// A whole number in [lo, hi] at `j`, else a UserError naming `what`: nlohmann's get<> would wrap
// a value past the target type, or truncate a real.
int64_t whole(const json& j, const std::string& what, int64_t lo,
              int64_t hi = std::numeric_limits<int64_t>::max()) {
  const bool fits = j.is_number_unsigned() ? j.get<uint64_t>() <= static_cast<uint64_t>(hi)
                                           : j.is_number_integer();
  const int64_t v = fits ? j.get<int64_t>() : 0;
  if (!fits || v < lo || v > hi)
    user_error("'{}' is {}; expected a whole number from {} to {}", what, io::json_excerpt(j), lo,
               hi);
  return v;
}

constexpr int64_t kMaxInt = std::numeric_limits<int>::max();

TuneKey key_from(const json& j) {
  TuneKey k;
  k.program = j.at("program").get<std::string>();
  k.program_hash = j.at("program_hash").get<std::string>();
  for (const auto& [s, v] : j.at("sizes").items()) k.sizes[s] = whole(v, "sizes." + s, 0);
  k.ranks = static_cast<int>(whole(j.at("ranks"), "ranks", 1, kMaxInt));
  // Records written before the key had it: one node.
  k.nodes = j.contains("nodes") ? static_cast<int>(whole(j.at("nodes"), "nodes", 1, kMaxInt)) : 1;
  k.backend = j.at("backend").get<std::string>();
  k.executor = j.at("executor").get<std::string>();
  k.machine = j.at("machine").get<std::string>();
  k.candidates = j.at("candidates").get<std::string>();
  return k;
}

std::vector<double> sorted(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v;
}

}  // namespace

std::string hash_hex(const std::string& text) { return fmt::format("{:016x}", fnv1a(text)); }

std::string TuneKey::str() const {
  return fmt::format("{} [{}] {} on {} ranks{} ({}, {} executor)", program, program_hash,
                     sizes_str(sizes), ranks, nodes > 1 ? fmt::format(" of {} nodes", nodes) : "",
                     backend, executor);
}

std::string TuneKey::digest() const {
  const std::string text = key_json(*this).dump();
  return fmt::format("{:016x}{:016x}", fnv1a(text), fnv1a(text, 0x84222325cbf29ce4ull));
}

std::string machine_id() {
  static const std::string id = [] {
    std::ifstream f("/proc/cpuinfo");
    std::string line, model = "unknown CPU", flags;
    while (std::getline(f, line)) {
      auto value = [&] { return line.substr(std::min(line.size(), line.find(':') + 2)); };
      if (model == "unknown CPU" && line.rfind("model name", 0) == 0) model = value();
      if (flags.empty() && line.rfind("flags", 0) == 0) flags = fmt::format(" {} ", value());
    }
    std::vector<std::string> isa;
    for (const char* x : {"sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512dq",
                          "avx512vl", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"})
      if (flags.find(fmt::format(" {} ", x)) != std::string::npos) isa.push_back(x);
    return fmt::format("{} [{}] {} threads", model, fmt::join(isa, " "),
                       std::thread::hardware_concurrency());
  }();
  return id;
}

std::string build_id() {
  static const std::string id = [] {
    std::error_code ec;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
    if (ec) return std::string("unknown build");
    const auto size = std::filesystem::file_size(exe, ec);
    if (ec) return std::string("unknown build");
    const auto time = std::filesystem::last_write_time(exe, ec);
    if (ec) return std::string("unknown build");
    return fmt::format("{} bytes, modified {}", size, time.time_since_epoch().count());
  }();
  return id;
}

double CandidateTiming::median() const {
  if (times.empty()) return std::numeric_limits<double>::infinity();
  const auto s = sorted(times);
  const size_t n = s.size();
  return n % 2 == 1 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
}

double ChunkTiming::median() const {
  CandidateTiming c;
  c.times = times;
  return c.median();
}

double CandidateTiming::final_median() const {
  CandidateTiming f;
  f.times = final_times;
  return f.median();
}

double CandidateTiming::min() const {
  return times.empty() ? std::numeric_limits<double>::infinity()
                       : *std::min_element(times.begin(), times.end());
}

double CandidateTiming::max() const {
  return times.empty() ? std::numeric_limits<double>::infinity()
                       : *std::max_element(times.begin(), times.end());
}

std::string record_to_json(const TuneRecord& r, int indent) {
  json cands = json::array();
  for (const CandidateTiming& c : r.candidates) {
    json j = {{"name", c.name}, {"ok", c.ok}, {"max_error", c.max_error}, {"times_s", c.times}};
    if (!c.ok) j["error"] = c.error;
    if (!c.times.empty()) j["median_s"] = c.median();
    if (c.retimed()) {
      j["final_times_s"] = c.final_times;
      j["final_median_s"] = c.final_median();
    }
    cands.push_back(std::move(j));
  }
  json checked = json::object();
  for (const auto& [s, v] : r.check_sizes) checked[s] = v;
  json doc = {
      {"format", kRecordFormat},
      {"key", key_json(r.key)},
      {"winner", r.winner},
      {"warmup", r.warmup},
      {"reps", r.reps},
      {"final", {{"margin", r.final_margin}, {"max", r.final_max}, {"reps", r.final_reps}}},
      {"checked_at", checked},
      {"created", r.created},
      {"search", {{"space", r.space}, {"budget_s", r.budget_s}, {"left_untimed", r.left_untimed}}},
      {"candidates", cands}};
  if (!r.chunks.empty()) {
    json chunks = json::array();
    for (const ChunkTiming& c : r.chunks)
      chunks.push_back({{"bytes", c.bytes}, {"times_s", c.times}});
    doc["chunks"] = {{"chosen", r.chunk_bytes}, {"timings", chunks}};
  }
  return doc.dump(indent);
}

TuneRecord record_from_json(const std::string& text, const std::string& source) {
  // Nesting past io::kMaxJsonDepth is refused before anything recursive walks it.
  const json doc = io::parse_json(text, source);
  try {
    // Format 1 (no final round) still reads: its candidates have no final times.
    const std::string format = doc.at("format").get<std::string>();
    if (format != kRecordFormat && format != "tandem-tune-1")
      user_error("not a tandem tuning record (format '{}')", format);
    TuneRecord r;
    r.key = key_from(doc.at("key"));
    r.winner = doc.at("winner").get<std::string>();
    r.warmup = static_cast<int>(whole(doc.at("warmup"), "warmup", 0, kMaxInt));
    r.reps = static_cast<int>(whole(doc.at("reps"), "reps", 0, kMaxInt));
    r.created = doc.at("created").get<std::string>();
    if (doc.contains("final")) {
      const json& f = doc.at("final");
      r.final_margin = f.at("margin").get<double>();
      r.final_max = static_cast<int>(whole(f.at("max"), "final.max", 0, kMaxInt));
      r.final_reps = static_cast<int>(whole(f.at("reps"), "final.reps", 0, kMaxInt));
    }
    for (const auto& [s, v] : doc.at("checked_at").items())
      r.check_sizes[s] = whole(v, "checked_at." + s, 0);
    if (doc.contains("search")) {
      const json& f = doc.at("search");
      r.space = whole(f.at("space"), "search.space", 0);
      r.budget_s = f.at("budget_s").get<double>();
      r.left_untimed = whole(f.at("left_untimed"), "search.left_untimed", 0);
    }
    if (doc.contains("chunks")) {
      // 0: the process's chunk size.
      r.chunk_bytes = static_cast<size_t>(
          whole(doc.at("chunks").at("chosen"), "chunks.chosen", 0, comm::kMaxChunkBytes));
      for (const json& j : doc.at("chunks").at("timings"))
        r.chunks.push_back({static_cast<size_t>(whole(j.at("bytes"), "chunks.timings.bytes", 1,
                                                      comm::kMaxChunkBytes)),
                            j.at("times_s").get<std::vector<double>>()});
    }
    for (const json& j : doc.at("candidates")) {
      CandidateTiming c;
      c.name = j.at("name").get<std::string>();
      c.ok = j.at("ok").get<bool>();
      c.max_error = j.at("max_error").get<double>();
      c.times = j.at("times_s").get<std::vector<double>>();
      if (j.contains("final_times_s"))
        c.final_times = j.at("final_times_s").get<std::vector<double>>();
      if (j.contains("error")) c.error = j.at("error").get<std::string>();
      r.candidates.push_back(std::move(c));
    }
    const bool winner_listed =
        std::any_of(r.candidates.begin(), r.candidates.end(),
                    [&](const CandidateTiming& c) { return c.ok && c.name == r.winner; });
    if (!winner_listed)
      user_error("it names winner '{}', which is not among its passing candidates", r.winner);
    return r;
  } catch (const UserError& e) {
    // The checks above say what is wrong; the record is named once, here.
    user_error("{}: {}", source, e.what());
  } catch (const json::exception& e) {
    // nlohmann's text without its "[json.exception...] " prefix; the record named.
    std::string why = e.what();
    if (const size_t at = why.find("] "); at != std::string::npos) why.erase(0, at + 2);
    user_error("{} is malformed: {}", source, why);
  }
}

std::string record_path(const TuneKey& key, const std::string& cache_dir) {
  return (fs::path(cache_dir) / "tune" / (key.digest() + ".json")).string();
}

std::optional<TuneRecord> load_record(const TuneKey& key, const std::string& cache_dir,
                                      std::string* stale) {
  const std::string path = record_path(key, cache_dir);
  // Outside the try below: a folder or file another user owns or can write is refused, not retuned.
  if (!private_dir_exists(cache_dir, "tune")) return std::nullopt;
  const std::optional<std::string> text = read_private_file(path);
  if (!text) return std::nullopt;
  try {
    TuneRecord r = record_from_json(*text, fmt::format("tuning record '{}'", path));
    if (!(r.key == key)) return std::nullopt;
    if (io::parse_json(*text, path).at("format").get<std::string>() != kRecordFormat) {
      if (stale != nullptr)
        *stale = fmt::format(
            "the tuning record {} is of an older format (tandem-tune-1: chosen without the "
            "interleaved final round) and is not used",
            path);
      return std::nullopt;
    }
    return r;
  } catch (const UserError&) {
    return std::nullopt;  // a damaged record is retuned and replaced
  }
}

std::optional<TuneRecord> latest_record(const dsl::Program& program, const std::string& cache_dir) {
  if (!private_dir_exists(cache_dir, "tune")) return std::nullopt;
  const fs::path dir = fs::path(cache_dir) / "tune";
  std::error_code ec;
  const std::string hash = hash_hex(program.str());
  std::optional<TuneRecord> best;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    if (e.path().extension() != ".json") continue;
    const std::optional<std::string> text = read_private_file(e.path().string());
    if (!text) continue;  // removed since the listing
    try {
      const std::string source = fmt::format("tuning record '{}'", e.path().string());
      const json doc = io::parse_json(*text, source);
      if (!doc.is_object() || !doc.contains("format") || doc["format"] != kRecordFormat) continue;
      TuneRecord r = record_from_json(*text, source);
      if (r.key.program_hash == hash && (!best || r.created > best->created)) best = std::move(r);
    } catch (const std::exception&) {
      // Unreadable: not a choice to offer.
    }
  }
  return best;
}

std::string store_record(const TuneRecord& record, const std::string& cache_dir) {
  make_private_dir(cache_dir, "tune");
  // Written under a random temporary name made exclusively and renamed over the record: readers see
  // the old record or the new one, never half of one.
  const std::string path = record_path(record.key, cache_dir);
  write_private_file(path, record_to_json(record) + "\n");
  return path;
}

}  // namespace tandem::tune
