// Enumerating the legal schedules of a program: every recipe in the space (enumerate.h), each
// carried out by Recipe::apply (so each is checked by the transformations) and kept when the
// program allows it and its plan is new.
#include "tandem/schedule/enumerate.h"

#include <algorithm>
#include <set>

#include "recipe_steps.h"
#include "rewrite.h"
#include "tandem/core/error.h"
#include "tandem/schedule/as_slice.h"

namespace tandem::schedule {

using dsl::Program;

namespace {

// The inputs enumeration may store sliced.
std::vector<std::string> state_inputs(const Program& p, const EnumerateOptions& o) {
  if (o.state) return *o.state;
  std::vector<std::string> out;
  const auto users = detail::all_users(p);
  for (int id : p.inputs()) {
    const int u = p.updater(id);
    if (u >= 0 && !users[static_cast<size_t>(u)].empty()) out.push_back(p.display_name(id));
  }
  return out;
}

// The state inputs a schedule with these moves can store sliced, trying each in turn on the
// schedule the ones before it left; empty when the moves themselves are illegal.
std::vector<std::string> sliceable(const Program& program,
                                   const std::vector<CollectiveRecipe>& parts,
                                   const std::vector<std::string>& state) {
  Schedule s(program);
  if (detail::apply_moves(s, parts)) return {};
  std::vector<std::string> out;
  for (const std::string& name : state) {
    // One not usable through its slice in this schedule stays whole.
    const std::optional<int> x = s.program().find(name);
    if (x && !detail::try_as_slice(s, *x)) out.push_back(name);
  }
  return out;
}

// Every recipe varying the parts marked in `vary` (and the program-wide choices), the others as
// in `base`, carried out; the legal ones with new plans, in the space's order: moves, slicing,
// fusion, overlaps, the first collective's choice the most significant.
std::vector<NamedSchedule> generate(const Program& program,
                                    const std::vector<CollectiveRecipe>& base,
                                    const std::vector<bool>& vary, const EnumerateOptions& o) {
  program.validate();
  const size_t K = base.size();
  std::vector<size_t> v;  // the varying collectives
  for (size_t k = 0; k < K; ++k)
    if (vary[k]) v.push_back(k);
  bool fixed_fuse = false;  // a collective that does not vary fuses: loop fusion is implied
  for (size_t k = 0; k < K; ++k) fixed_fuse |= base[k].fuse && !vary[k];
  const std::vector<std::string> state = state_inputs(program, o);
  const size_t digits4 = size_t{1} << (2 * v.size());  // 4^|v|
  const size_t masks = size_t{1} << v.size();

  std::vector<NamedSchedule> out;
  std::set<std::string> plans;  // lowered plans already listed (without their names)
  auto consider = [&](Recipe r) {
    r = r.compacted();
    Applied a = r.try_apply(program);
    if (!a.schedule) return;  // the program does not allow this recipe
    std::string text = a.schedule->lower().str();
    text.erase(0, text.find('\n'));  // the first line carries the name
    if (!plans.insert(text).second) return;
    out.push_back(NamedSchedule{r.str(), r, std::move(*a.schedule)});
  };
  for (size_t mv = 0; mv < digits4; ++mv) {
    std::vector<CollectiveRecipe> moved = base;
    for (size_t i = 0; i < v.size(); ++i) {
      moved[v[i]] = CollectiveRecipe{};
      moved[v[i]].move = kMoves[(mv >> (2 * (v.size() - 1 - i))) & 3];
    }
    for (bool slice : {false, true}) {
      Recipe r;
      if (slice) {
        r.slice = sliceable(program, moved, state);
        if (r.slice.empty()) continue;
      }
      for (bool loops : {false, true})
        for (size_t mask = 0; mask < masks; ++mask) {
          if (!loops && (mask != 0 || fixed_fuse)) continue;
          for (size_t ol = 0; ol < digits4; ++ol) {
            r.collectives = moved;
            r.loops = loops;
            for (size_t i = 0; i < v.size(); ++i) {
              CollectiveRecipe& c = r.collectives[v[i]];
              const size_t bits = (ol >> (2 * (v.size() - 1 - i))) & 3;
              c.fuse = ((mask >> (v.size() - 1 - i)) & 1) != 0;
              c.overlap_matmul = (bits & 1) != 0;
              c.overlap_send = (bits & 2) != 0;
              c.blocks = o.blocks;
            }
            consider(r);
          }
        }
    }
  }
  return out;
}

}  // namespace

int64_t recipe_space_size(const Program& program) {
  const size_t K = recipe_collectives(program).size();
  if (K == 0) return 2;
  if (K > 14) return -1;
  int64_t n = 2 * ((int64_t{1} << K) + 1);
  for (size_t k = 0; k < K; ++k) n *= 16;
  return n;
}

std::vector<NamedSchedule> enumerate_schedules(const Program& program,
                                               const EnumerateOptions& options) {
  const size_t K = recipe_collectives(program).size();
  return generate(program, std::vector<CollectiveRecipe>(K), std::vector<bool>(K, true), options);
}

std::vector<NamedSchedule> enumerate_collective(const Program& program,
                                                const std::vector<CollectiveRecipe>& base, size_t k,
                                                const EnumerateOptions& options) {
  const size_t K = recipe_collectives(program).size();
  if (base.size() != K || k >= K)
    user_error(
        "enumerate_collective: program '{}' has {} collective(s); got {} part(s) and collective "
        "index {}",
        program.name(), K, base.size(), k);
  std::vector<bool> vary(K, false);
  vary[k] = true;
  return generate(program, base, vary, options);
}

}  // namespace tandem::schedule
