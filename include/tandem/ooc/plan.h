// An out-of-core plan: per unit of a stage's chain (half a block: its attention or its MLP, see
// nn/activation_memory.h), whether the buffers it saves for its backward stay in the fast tier,
// go to the slow tier and come back, or are dropped and recomputed; plus how early swapped units
// are fetched back. A plan is a plain value: it prints to a name ("KKSsRCRK/p2", a letter per
// unit) and parses back.
//
// Granularity: one decision per half block (its input x_u and the buffers its forward writes),
// because a half is the smallest part of the model nn can recompute exactly (run again, it
// writes bitwise the same buffers) and whose backward reads only its own buffers; its buffers
// are one contiguous region, so a swap is one large transfer. Whole blocks would double the
// smallest budget that runs (a block's backward reads both halves' buffers); single buffers
// would multiply the search space for little: most of a half's bytes are in two or three
// buffers its own backward reads together.
//
//   Keep       x_u and the buffers stay resident from the unit's forward to its backward.
//   Swap       both are written to the slow tier after the forward, the write overlapping the
//              next unit's forward, and read back `prefetch` operations before the backward
//              needs them.
//   swap (s)   the same, but the next operation waits for the write: the memory is free one
//              operation sooner, for the write's time (cheap when the tier is fast).
//   Recompute  x_u stays resident; the buffers are dropped after the forward and the unit's
//              forward runs again just before its backward (activation checkpointing).
//   Continue   like Recompute, but x_u is dropped too: it is recomputed from the unit before,
//              which must be Recompute or Continue. A run R C C is one segment recomputed from
//              its first unit's input ("RC" per block is checkpointing every block, as PyTorch
//              users do; Chen et al.'s sqrt(n) checkpointing uses longer segments).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::ooc {

enum class Decision : char {
  Keep = 'K',
  Swap = 'S',
  SwapSync = 's',
  Recompute = 'R',
  Continue = 'C'
};
inline bool swaps(Decision d) { return d == Decision::Swap || d == Decision::SwapSync; }
inline bool recomputes(Decision d) { return d == Decision::Recompute || d == Decision::Continue; }

struct Plan {
  std::vector<Decision> units;
  int prefetch = 1;  // a swapped unit is read back when the operation `prefetch` places before
                     // its backward begins (0: at its backward); 1 by convention when none swaps

  // "KKSSRCRK/p2".
  std::string str() const;
  // Inverse of str(); UserError naming the text and what is wrong.
  static Plan parse(std::string_view text);
  // UserError unless every Continue follows a Recompute or Continue and prefetch >= 0.
  void validate() const;
  int count(Decision d) const;
  int swapped() const { return count(Decision::Swap) + count(Decision::SwapSync); }
  bool operator==(const Plan&) const = default;
};

// The single strategies the planner is compared with, each a plan of n units, `per_block` of
// them to a block.
enum class Strategy { InCore, SwapAll, RecomputeAll, Chen, Karma, Planner };
std::string_view strategy_name(Strategy s);  // "in-core", "swap-all (vDNN)", ...
Plan keep_all(int n);
Plan swap_all(int n, int prefetch = 1);
Plan recompute_all(int n, int per_block);  // every block checkpointed at its input: "RCRC..."
// Segments of ceil(sqrt(blocks)) blocks, each recomputed from its input.
Plan chen_sqrt(int n, int per_block);
// KARMA's capacity-based strategy: the first `swapped` units swapped, the rest recomputed.
Plan karma(int n, int swapped, int prefetch = 1);

}  // namespace tandem::ooc
