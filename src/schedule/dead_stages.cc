// Dead-stage elimination.
#include "tandem/schedule/dead_stages.h"

#include "rewrite.h"

namespace tandem::schedule {

void eliminate_dead_stages(Schedule& s) {
  const auto start = std::chrono::steady_clock::now();
  auto [program, map] = detail::remove_dead(s.program());
  s.rewrite(std::move(program), map);
  s.record("eliminate_dead_stages", start);
}

}  // namespace tandem::schedule
