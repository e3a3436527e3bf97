// What the planner knows about one stage's step on this machine: each unit's (half block's)
// forward, backward and recompute time, and the slow tier's bandwidth. Measured by running the step
// (runtime.h); the trainer caches it on disk like the autotuner's choices, in <cache>/ooc/.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tandem::ooc {

struct Profile {
  // Per unit of the stage, as its operations run: the forward and backward operation (for the
  // first and last unit they include the embedding, the head or the pipeline hand-offs that run
  // in the same operation) and the unit's forward alone when it is recomputed (empty: assume
  // the forward operation's time).
  std::vector<double> forward_s;
  std::vector<double> backward_s;
  std::vector<double> recompute_s;
  double write_bytes_per_s = 1e9;
  double read_bytes_per_s = 1e9;

  double recompute(int j) const {
    return recompute_s.empty() ? forward_s[static_cast<size_t>(j)]
                               : recompute_s[static_cast<size_t>(j)];
  }
  int units() const { return static_cast<int>(forward_s.size()); }
  // Forward plus backward of every unit: a step with nothing to wait for or recompute.
  double compute_s() const;
  nlohmann::json to_json() const;
  static Profile from_json(const nlohmann::json& j);  // UserError naming what is missing
};

// A profile with every unit alike, for planning before anything is measured.
Profile uniform_profile(int units, double forward_s, double backward_s, double write_bytes_per_s,
                        double read_bytes_per_s);

// The profile cache: <cache_dir>/ooc/<name>, a JSON document {"key": what was profiled,
// "profile": the profile}, private like the rest of tandem's cache (core/private_cache.h).
// The profile cached for `key` (a JSON document's text); nullopt when there is none, or the file
// is damaged or holds another key (it is measured again and replaced). A folder or file another
// user owns or can write is a UserError naming it.
std::optional<Profile> load_cached_profile(const std::string& cache_dir, const std::string& name,
                                           const std::string& key);
// Writes it (0600, in a 0700 folder) under a temporary name and renames it into place.
void store_cached_profile(const std::string& cache_dir, const std::string& name,
                          const std::string& key, const Profile& profile);

}  // namespace tandem::ooc
