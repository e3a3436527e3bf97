// Recipe: a schedule as a value. Per collective of the program (each AllReduce of at least one
// dim, in program order) it says whether the collective is split, whether the computations on
// its result move past the gather (reorder), whether they run inside it (fuse), and whether it
// overlaps with the matmul producing its input and/or the send its result reaches, in how many
// row blocks; for the whole program, whether the remaining element-wise computations share
// loops and which state inputs are stored sliced. str() prints CoCoNeT's names (the names the
// tune cache, the docs and the flags use), parse() reads them back, apply() builds the schedule
// with the transformations themselves (so every precondition is checked by them).
//
// The name grammar, one part per collective:
//   part   = core | "ol" [ "[" BLOCKS "]" ] "(" [ "MM," ] core [ ",P2P" ] ")"
//          | "ol" [ "[" BLOCKS "]" ] "(" [ "MM," ] p2pcore ")-AG"
//   core   = "AR-" C | "fused(AR-C)"           (no move)
//          | "RS-AG-" C | "fused(RS-AG)-C"     (split)
//          | "RS-" C "-AG" | "fused(RS-C-AG)"  (split and reorder)
//          | p2pcore "-AG"                     (split and reorder past the sends too)
//   p2pcore = "RS-" C "-P2P" | "fused(RS-C)-P2P"
//   C      = "C" | "fused(C)"                  (loop fusion: program-wide, so every part agrees;
//                                               a part fused into its collective implies it)
//   name   = part { "|" part } [ "+slice(" INPUT { "," INPUT } ")" ]
//          | ( "C" | "fused(C)" ) [ "+slice(...)" ]   (a program without collectives)
// BLOCKS is omitted when it is kDefaultBlocks (4). One part applies to every collective; n parts
// apply to the program's n collectives in order: "fused(RS-C-AG)|ol[8](MM,AR-fused(C))+slice(m)".
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/dsl/ir.h"
#include "tandem/schedule/schedule.h"

namespace tandem::schedule {

inline constexpr int kDefaultBlocks = 4;

// Where a collective's consumers run relative to it.
enum class Move : uint8_t {
  None,              // AR-C: the AllReduce, then the computations on the whole value
  Split,             // RS-AG-C: ReduceScatter + AllGather, then the computations
  Reorder,           // RS-C-AG: the computations on this rank's slice, their results gathered
  ReorderTransfers,  // RS-C-P2P-AG: the same, the sends and receives moved onto the slice too
};
std::string_view move_name(Move m);  // "none", "split", "reorder", "reorder+p2p"
inline constexpr Move kMoves[] = {Move::None, Move::Split, Move::Reorder, Move::ReorderTransfers};

// The choices for one collective.
struct CollectiveRecipe {
  Move move = Move::None;
  bool fuse = false;            // its consumers run in its per-chunk hook
  bool overlap_matmul = false;  // overlapped with the matmul producing its input
  bool overlap_send = false;    // overlapped with the send its result reaches
  int blocks = kDefaultBlocks;  // row blocks of the overlap (ignored without one)

  bool overlapped() const { return overlap_matmul || overlap_send; }
  bool operator==(const CollectiveRecipe& o) const;  // blocks count only when overlapped
};

// What Recipe::try_apply gives: the schedule, or why there is none.
struct Applied {
  std::optional<Schedule> schedule;
  std::string why;  // set when there is no schedule
};

struct Recipe {
  // One entry per collective in program order, or one entry for every collective; empty for a
  // program without collectives.
  std::vector<CollectiveRecipe> collectives;
  bool loops = false;              // fuse the remaining element-wise computations into loops
  std::vector<std::string> slice;  // state inputs stored sliced (as_slice), in this order

  // Loop fusion as applied: asked for, or implied by a collective with its consumers fused.
  bool fused_loops() const;
  bool operator==(const Recipe& o) const;  // by meaning: loops as fused_loops()

  // One part per collective of `program` (a single part repeated for each); a part count that is
  // neither 1 nor the program's is a UserError listing the collectives.
  std::vector<CollectiveRecipe> parts(const dsl::Program& program) const;
  // The same recipe written with one part when every collective makes the same choice.
  Recipe compacted() const;

  // The program as written: AR-C (one part, no choice made) when it has collectives, else C.
  static Recipe unscheduled(const dsl::Program& program);

  // The name (grammar above). A recipe of no collectives prints "C" or "fused(C)".
  std::string str() const;
  // Reads a name; anything else is one UserError saying what is wrong and what a name looks like.
  static Recipe parse(std::string_view name);
  // The schedule the recipe describes, named str(), or why the program does not allow the recipe
  // (its part count against the program's collectives, a move, fusion or overlap whose
  // precondition fails, or one that changes nothing, such as a reorder with nothing to move): a
  // message naming the collective and the rule.
  Applied try_apply(const dsl::Program& program) const;
  // The same, a recipe the program does not allow being a UserError with that message.
  Schedule apply(const dsl::Program& program) const;
};

// A schedule with its recipe and name (recipe.str()).
struct NamedSchedule {
  std::string name;
  Recipe recipe;
  Schedule schedule;
};

// The schedule a name describes: Recipe::parse(name).apply(program). A name that does not parse
// or that the program does not allow is one UserError that names the program and says why.
// Nothing is enumerated: this is how every caller picks a schedule by name.
NamedSchedule schedule_by_name(const dsl::Program& program, std::string_view name);

// The collectives a recipe's parts address: every AllReduce of at least one dim, in program
// order.
std::vector<int> recipe_collectives(const dsl::Program& program);

}  // namespace tandem::schedule
