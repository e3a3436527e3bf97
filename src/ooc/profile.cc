// Profiles: their total compute time, their JSON form and their cache files.
#include "tandem/ooc/profile.h"

#include <filesystem>
#include <numeric>

#include "tandem/core/error.h"
#include "tandem/core/private_cache.h"
#include "tandem/io/json_file.h"

namespace tandem::ooc {

double Profile::compute_s() const {
  return std::accumulate(forward_s.begin(), forward_s.end(), 0.0) +
         std::accumulate(backward_s.begin(), backward_s.end(), 0.0);
}

nlohmann::json Profile::to_json() const {
  return {{"forward_s", forward_s},
          {"backward_s", backward_s},
          {"recompute_s", recompute_s},
          {"write_bytes_per_s", write_bytes_per_s},
          {"read_bytes_per_s", read_bytes_per_s}};
}

Profile Profile::from_json(const nlohmann::json& j) {
  Profile p;
  try {
    p.forward_s = j.at("forward_s").get<std::vector<double>>();
    p.backward_s = j.at("backward_s").get<std::vector<double>>();
    p.recompute_s = j.at("recompute_s").get<std::vector<double>>();
    p.write_bytes_per_s = j.at("write_bytes_per_s").get<double>();
    p.read_bytes_per_s = j.at("read_bytes_per_s").get<double>();
  } catch (const nlohmann::json::exception& e) {
    user_error("out-of-core profile is incomplete: {}", e.what());
  }
  if (p.forward_s.size() != p.backward_s.size() || p.forward_s.empty() ||
      (!p.recompute_s.empty() && p.recompute_s.size() != p.forward_s.size()))
    user_error("out-of-core profile has {} forward, {} backward and {} recompute times",
               p.forward_s.size(), p.backward_s.size(), p.recompute_s.size());
  if (!(p.write_bytes_per_s > 0) || !(p.read_bytes_per_s > 0))
    user_error("out-of-core profile has a non-positive slow-tier bandwidth");
  for (const std::vector<double>* times : {&p.forward_s, &p.backward_s, &p.recompute_s})
    for (double t : *times)
      if (!(t >= 0)) user_error("out-of-core profile has a negative time ({} s)", t);
  return p;
}

Profile uniform_profile(int units, double forward_s, double backward_s, double write_bytes_per_s,
                        double read_bytes_per_s) {
  Profile p;
  p.forward_s.assign(static_cast<size_t>(units), forward_s);
  p.backward_s.assign(static_cast<size_t>(units), backward_s);
  p.write_bytes_per_s = write_bytes_per_s;
  p.read_bytes_per_s = read_bytes_per_s;
  return p;
}

std::optional<Profile> load_cached_profile(const std::string& cache_dir, const std::string& name,
                                           const std::string& key) {
  // Outside the try below: a folder or file another user owns or can write is refused, not
  // remeasured.
  if (!private_dir_exists(cache_dir, "ooc")) return std::nullopt;
  const std::optional<std::string> text =
      read_private_file((std::filesystem::path(cache_dir) / "ooc" / name).string());
  if (!text) return std::nullopt;
  try {
    // Nesting past io::kMaxJsonDepth is refused (and the profile measured again) before anything
    // recursive, as the comparison below, walks it.
    const auto j = io::parse_json(*text, fmt::format("profile '{}'", name));
    if (j.at("key") != nlohmann::json::parse(key)) return std::nullopt;
    return Profile::from_json(j.at("profile"));
  } catch (const std::exception&) {
    return std::nullopt;  // unreadable: measured again, and rewritten
  }
}

void store_cached_profile(const std::string& cache_dir, const std::string& name,
                          const std::string& key, const Profile& profile) {
  const std::filesystem::path dir = make_private_dir(cache_dir, "ooc");
  write_private_file(
      (dir / name).string(),
      nlohmann::json{{"key", nlohmann::json::parse(key)}, {"profile", profile.to_json()}}.dump(1));
}

}  // namespace tandem::ooc
