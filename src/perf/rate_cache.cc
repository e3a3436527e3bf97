// The rates' cache: <cache>/perf/<hash of the key>.json, {"key": what was measured, "rates": the
// rates}, private like the rest of tandem's cache (core/private_cache.h), as the out-of-core
// profiles and the autotuner's records are; so that two runs on one machine predict alike.
#include <fmt/format.h>

#include <exception>
#include <filesystem>

#include "tandem/core/env.h"
#include "tandem/core/error.h"
#include "tandem/core/private_cache.h"
#include "tandem/core/sha256.h"
#include "tandem/io/json_file.h"
#include "tandem/perf/rates.h"

namespace tandem::perf {
namespace {

constexpr const char* kFolder = "perf";

std::string file_name(const std::string& key) { return sha256_hex(key).substr(0, 32) + ".json"; }

}  // namespace

std::optional<Rates> load_cached_rates(const std::string& cache_dir, const std::string& key) {
  // Outside the try below: a folder or file another user owns or can write is refused, not
  // measured again.
  if (!private_dir_exists(cache_dir, kFolder)) return std::nullopt;
  const std::optional<std::string> text =
      read_private_file((std::filesystem::path(cache_dir) / kFolder / file_name(key)).string());
  if (!text) return std::nullopt;
  try {
    const auto j = io::parse_json(*text, "the performance model's rates");
    if (j.at("key") != nlohmann::json::parse(key)) return std::nullopt;
    return Rates::from_json(j.at("rates"));
  } catch (const std::exception&) {
    return std::nullopt;  // damaged: measured again, and rewritten
  }
}

void store_cached_rates(const std::string& cache_dir, const std::string& key, const Rates& rates) {
  const std::filesystem::path dir = make_private_dir(cache_dir, kFolder);
  write_private_file(
      (dir / file_name(key)).string(),
      nlohmann::json{{"key", nlohmann::json::parse(key)}, {"rates", rates.to_json()}}.dump(1));
}

Rates cached_rates(const RateRequest& request, const std::string& cache_dir, bool* from_cache,
                   const MeasureRates& measure) {
  // TANDEM_PERF_REMEASURE=1: the rates measured anew (and the cache's replaced), e.g. after the
  // machine changed in a way the key does not see (its load, its clock).
  const bool remeasure = env_int("TANDEM_PERF_REMEASURE", 0) != 0;
  const std::string key = request.key();
  if (!remeasure)
    if (std::optional<Rates> cached = load_cached_rates(cache_dir, key)) {
      if (from_cache) *from_cache = true;
      return *cached;
    }
  if (from_cache) *from_cache = false;
  Rates r = measure(request);
  try {
    store_cached_rates(cache_dir, key, r);
  } catch (const UserError& e) {
    fmt::print(stderr, "tandem: warning: the performance model's rates were not cached: {}\n",
               e.what());
  }
  return r;
}

}  // namespace tandem::perf
