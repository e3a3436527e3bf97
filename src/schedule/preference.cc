// first_allowed: each name parsed as a recipe (all of them, so a misspelt name is found wherever it
// stands), then tried on the program in order.
#include "tandem/schedule/preference.h"

#include "tandem/core/error.h"

namespace tandem::schedule {

std::optional<Preferred> first_allowed(const dsl::Program& program,
                                       const std::vector<std::string>& names,
                                       std::string_view source) {
  std::vector<Recipe> recipes;
  for (const std::string& name : names) {
    try {
      recipes.push_back(Recipe::parse(name));
    } catch (const UserError& e) {
      user_error("{}: {}", source, e.what());
    }
  }
  for (size_t i = 0; i < recipes.size(); ++i) {
    Applied a = recipes[i].try_apply(program);
    if (a.schedule)
      return Preferred{NamedSchedule{recipes[i].str(), recipes[i], std::move(*a.schedule)}, i};
  }
  return std::nullopt;
}

}  // namespace tandem::schedule
