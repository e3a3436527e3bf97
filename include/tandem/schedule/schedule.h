// Schedule: how a program runs (Halide's separation of algorithm from schedule). It holds the
// program as written, the program as rewritten by split, reorder and as_slice (each rewrite is
// checked by the DSL, so every intermediate program is well typed and means the same), and the
// fused stages and overlaps that fuse and overlap record. lower() turns it into a Plan.
//
// The transformations are free functions, one file pair each (split.h, reorder.h, fuse.h,
// overlap.h, as_slice.h, dead_stages.h); the member functions below are conveniences that call
// them. Each checks its own preconditions and reports a broken one as a UserError that names the
// transformation, the stage and the rule. Rewrites (split, reorder, as_slice) come before the
// fusions and overlaps of the stages they touch.
//
// TANDEM_DEBUG_IR=1 prints the program after every transformation and lowering pass, with the
// time each took, to stderr.
#pragma once

#include <chrono>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/dsl/ir.h"
#include "tandem/schedule/plan.h"

namespace tandem::schedule {

// A stage of the schedule's current program, by name or by id.
struct StageRef {
  StageRef(int id) : id(id) {}  // NOLINT: implicit, so that {rs, "m1", 7} reads naturally
  StageRef(const char* name) : name(name) {}
  StageRef(std::string name) : name(std::move(name)) {}
  StageRef(const dsl::Expr& e) : id(e.id()) {}
  int id = -1;
  std::string name;
  std::string str() const;
};

// Stages that run as one unit: one loop over their common domain, or one collective whose hook
// runs the computation on each reduced chunk (with the AllGathers of what it computed).
struct FusedStage {
  std::vector<int> stages;  // ids in the current program, ascending
  int collective = -1;      // the AllReduce or ReduceScatter it is built around, or -1 (a loop)
};

// Stages run block by block, producer and consumer concurrently (see Pipeline in plan.h).
struct Overlap {
  std::vector<int> stages;  // every stage of the overlapped units, ascending
  int blocks = 4;
};

class Schedule {
 public:
  explicit Schedule(dsl::Program program);

  const dsl::Program& program() const { return program_; }    // as rewritten so far
  const dsl::Program& original() const { return original_; }  // as written
  const std::vector<FusedStage>& fused() const { return fused_; }
  const std::vector<Overlap>& overlaps() const { return overlaps_; }
  const std::vector<std::string>& history() const { return history_; }  // "split(g_sum)", ...

  // A short readable name ("fused(RS-C-AG)"); by default the history joined by "; ".
  std::string name() const;
  void set_name(std::string name) { name_ = std::move(name); }

  // The id a reference names in the current program; an unknown name or id is a UserError that
  // says which transformation asked (`who`).
  int resolve(const StageRef& ref, std::string_view who) const;
  // The same without the error: the id, or nullopt with `why` set to the message.
  std::optional<int> lookup(const StageRef& ref, std::string_view who, std::string* why) const;
  // The fused stage holding `id`, or -1.
  int fused_index(int id) const;
  // The overlap holding `id`, or -1.
  int overlap_index(int id) const;

  // Lowers the schedule; Plan::str() is how a schedule is read.
  Plan lower() const;
  std::string str() const;

  // Conveniences for the free functions of the same names.
  struct SplitResult {
    int reduce_scatter;
    int all_gather;
  };
  SplitResult split(const StageRef& allreduce);
  std::vector<int> reorder(const StageRef& allgather, const std::vector<StageRef>& stages);
  int fuse(const std::vector<StageRef>& stages);
  int overlap(const std::vector<StageRef>& stages, int blocks = 4);
  void as_slice(const StageRef& input);
  void eliminate_dead_stages();

  // --- for the transformations ---------------------------------------------------------------
  // Replaces the program by a rewrite of it; old_to_new maps each old id to its new id, or -1
  // for a stage that is gone (fused stages and overlaps follow their stages; a gone stage
  // leaves them).
  void rewrite(dsl::Program program, const std::vector<int>& old_to_new);
  int add_fused(FusedStage f);
  int add_overlap(Overlap o);
  // Stages a caller follows across rewrites (Recipe::apply: its collectives): every rewrite maps
  // each to its new id (-1 once gone).
  std::vector<int>& tracked() { return tracked_; }
  const std::vector<int>& tracked() const { return tracked_; }
  // Records a transformation: its description in the history, and, with TANDEM_DEBUG_IR=1, the
  // program after it and how long it took since `start`.
  void record(std::string what, std::chrono::steady_clock::time_point start);

 private:
  dsl::Program original_;
  dsl::Program program_;
  std::vector<FusedStage> fused_;
  std::vector<Overlap> overlaps_;
  std::vector<std::string> history_;
  std::string name_;
  std::vector<int> tracked_;
};

// Whether TANDEM_DEBUG_IR is set (read once), unless set_debug_ir overrides it: 1 on, 0 off, -1
// back to the environment (for tests).
bool debug_ir();
void set_debug_ir(int on);
// Runs one named pass, timing it, and with TANDEM_DEBUG_IR=1 prints `show()` after it.
void run_pass(std::string_view name, const std::function<void()>& pass,
              const std::function<std::string()>& show);

}  // namespace tandem::schedule
