// The tuner's search: the collectives one at a time, then the leader's overlap block counts.
#include "search.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tandem/schedule/enumerate.h"

namespace tandem::tune::detail {

using schedule::CollectiveRecipe;
using schedule::NamedSchedule;
using schedule::Recipe;

namespace {

NamedSchedule named(const dsl::Program& program, const Recipe& recipe) {
  const Recipe r = recipe.compacted();
  return NamedSchedule{r.str(), r, r.apply(program)};
}

// The leader's overlaps at each other block count, one collective at a time (each keeps the
// count that was fastest before the next is tried).
void search_blocks(const dsl::Program& program, const TuneOptions& o, const TimeFn& time,
                   const LeaderFn& leader) {
  const size_t K = schedule::recipe_collectives(program).size();
  for (size_t k = 0; k < K; ++k) {
    const Recipe best = leader().recipe;
    std::vector<CollectiveRecipe> parts = best.parts(program);
    if (!parts[k].overlapped()) continue;
    for (int b : o.blocks) {
      if (b == parts[k].blocks) continue;
      Recipe r = best;
      r.collectives = parts;
      r.collectives[k].blocks = b;
      try {
        time(named(program, r));
      } catch (const UserError&) {
        // The program does not allow this many blocks (rows too few): not a candidate.
      }
    }
  }
}

}  // namespace

void search(const dsl::Program& program, const TuneOptions& o, const TimeFn& time,
            const LeaderFn& leader) {
  const Recipe baseline = Recipe::unscheduled(program);
  if (!o.only.empty()) {
    time(named(program, baseline));
    for (const std::string& name : o.only) time(schedule::schedule_by_name(program, name));
  } else {
    const size_t K = schedule::recipe_collectives(program).size();
    if (K == 0)
      for (NamedSchedule& ns : schedule::enumerate_schedules(program, o.enumerate))
        time(std::move(ns));
    std::vector<CollectiveRecipe> parts(K);
    for (size_t k = 0; k < K; ++k) {
      for (NamedSchedule& ns : schedule::enumerate_collective(program, parts, k, o.enumerate))
        time(std::move(ns));
      parts = leader().recipe.parts(program);
    }
  }
  search_blocks(program, o, time, leader);
}

std::string search_description(const dsl::Program& program, const TuneOptions& o) {
  std::string out = fmt::format(
      "per-collective search; blocks={}; tried blocks={}; chunks={}; budget_s={}",
      o.enumerate.blocks, fmt::join(o.blocks, ","), fmt::join(o.chunk_bytes, ","), o.budget_s);
  if (o.enumerate.state) out += fmt::format("; state={}", fmt::join(*o.enumerate.state, ","));
  if (!o.only.empty()) {
    for (const std::string& name : o.only)
      out += fmt::format("\n{}", schedule::schedule_by_name(program, name).name);
    return out;
  }
  // The first round's schedules: a change to the enumeration makes a new key.
  const size_t K = schedule::recipe_collectives(program).size();
  const auto first = K == 0 ? schedule::enumerate_schedules(program, o.enumerate)
                            : schedule::enumerate_collective(
                                  program, std::vector<CollectiveRecipe>(K), 0, o.enumerate);
  for (const NamedSchedule& ns : first) out += "\n" + ns.name;
  return out;
}

}  // namespace tandem::tune::detail
