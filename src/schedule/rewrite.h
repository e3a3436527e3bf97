// Helpers the program-rewriting passes share (internal to schedule/): a rewriter that copies a
// program stage by stage into a new one while recording where every old stage went, graph
// queries over a program, and dead-stage removal.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tandem/dsl/ir.h"

namespace tandem::schedule::detail {

// Builds `out` from `in`: every stage is added through Program::add, so every rewrite is checked
// and re-inferred by the DSL. `map` sends old ids to new ids (-1 until mapped or when gone).
class Rewriter {
 public:
  explicit Rewriter(const dsl::Program& in);

  const dsl::Program& in() const { return in_; }
  dsl::Program& out() { return out_; }

  // Adds a stage with new-program operands; a name already taken gets a ".2", ".3" suffix.
  int add(dsl::Op op, std::vector<int> args, dsl::Attrs attrs, std::string name = {});
  // Adds old stage `s` again with its operands mapped.
  int copy(const dsl::Stage& s);
  // Adds old stage `s` again with these (new-program) operands.
  int copy_with(const dsl::Stage& s, std::vector<int> args);

  void set(int old_id, int new_id) { map_[static_cast<size_t>(old_id)] = new_id; }
  int get(int old_id) const;  // InternalError when unmapped
  bool has(int old_id) const { return map_[static_cast<size_t>(old_id)] >= 0; }

  // Declares the outputs (each follows its stage, or `redirect(old stage)` when it returns >= 0)
  // and validates. Returns the program and the old-to-new map.
  std::pair<dsl::Program, std::vector<int>> finish();
  std::pair<dsl::Program, std::vector<int>> finish(const std::vector<int>& output_stage_override);

 private:
  std::string fresh(std::string name) const;

  const dsl::Program& in_;
  dsl::Program out_;
  std::vector<int> map_;
};

// Descendants of `from` (excluding it), as a membership vector over stage ids.
std::vector<char> descendants(const dsl::Program& p, int from);
// Ancestors of every stage in `of` (including them).
std::vector<char> ancestors(const dsl::Program& p, const std::vector<int>& of);
// Users of every stage, by id.
std::vector<std::vector<int>> all_users(const dsl::Program& p);

// The stages a program must keep: outputs, updates, sends and receives, inputs and scalars (the
// program's interface), and everything they read.
std::vector<char> live_stages(const dsl::Program& p);
// The program without its dead stages.
std::pair<dsl::Program, std::vector<int>> remove_dead(const dsl::Program& p);

// Whether a stage is a computation on tensors that a loop can run element by element.
bool is_elementwise_tensor(const dsl::Stage& s);
// A rank-0 computation (scalar arithmetic).
bool is_scalar_code(const dsl::Stage& s);
// A Norm, or a Reduce over every dim: folds into an accumulator.
bool is_accumulator(const dsl::Stage& s);

// "a, b and c" lists of display names.
std::string name_list(const dsl::Program& p, const std::vector<int>& ids);

}  // namespace tandem::schedule::detail
