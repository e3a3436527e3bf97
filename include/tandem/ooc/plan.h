// An out-of-core plan: per block of a stage's chain, whether the buffers it saves for its
// backward stay in the fast tier, go to the slow tier and come back, or are dropped and
// recomputed; plus how early swapped blocks are fetched back. A plan is a plain value: it prints
// to a name ("KKSsRCRK/p2") and parses back.
//
// Granularity: one decision per block (its input x_j and the 12 buffers its forward writes),
// because a block is the unit nn can recompute exactly (a block's forward run again writes
// bitwise the same buffers) and one block's buffers are one contiguous region, so a swap is one
// large transfer. A finer split would not lower the floor: a block's backward reads all of them.
//
//   Keep       x_j and the buffers stay resident from the block's forward to its backward.
//   Swap       both are written to the slow tier after the forward, the write overlapping the
//              next block's forward, and read back `prefetch` operations before the backward
//              needs them.
//   swap (s)   the same, but the next operation waits for the write: the memory is free one
//              operation sooner, for the write's time (cheap when the tier is fast).
//   Recompute  x_j stays resident; the buffers are dropped after the forward and the block's
//              forward runs again just before its backward (activation checkpointing).
//   Continue   like Recompute, but x_j is dropped too: it is recomputed from the block before,
//              which must be Recompute or Continue. A run R C C is one segment recomputed from
//              its first block's input (Chen et al.'s sqrt(n) checkpointing uses such segments).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::ooc {

enum class Decision : char { Keep = 'K', Swap = 'S', SwapSync = 's', Recompute = 'R', Continue = 'C' };
inline bool swaps(Decision d) { return d == Decision::Swap || d == Decision::SwapSync; }
inline bool recomputes(Decision d) { return d == Decision::Recompute || d == Decision::Continue; }

struct Plan {
  std::vector<Decision> blocks;
  int prefetch = 1;  // a swapped block is read back when the operation `prefetch` places before
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

// The single strategies the planner is compared with, each a plan of n blocks.
enum class Strategy { InCore, SwapAll, RecomputeAll, Chen, Karma, Planner };
std::string_view strategy_name(Strategy s);  // "in-core", "swap-all (vDNN)", ...
Plan keep_all(int n);
Plan swap_all(int n, int prefetch = 1);
Plan recompute_all(int n);  // every block checkpointed at its input
Plan chen_sqrt(int n);      // segments of ceil(sqrt(n)) blocks, each recomputed from its input
// KARMA's capacity-based strategy: the first `swapped` blocks swapped, the rest recomputed.
Plan karma(int n, int swapped, int prefetch = 1);

}  // namespace tandem::ooc
