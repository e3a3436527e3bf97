// The seam between a model that runs a chain of blocks and whoever decides where the buffers
// those blocks save for their backward live: all of them resident (in-core training), or an
// out-of-core runtime that swaps some to a slow tier and drops others for recomputation.
//
// The chain of one pipeline stage, for each micro-batch k of a step (k counts the micro-batches
// in the order the step runs their forwards): block j (0 <= j < blocks, the stage's own blocks)
// reads its input x_j and writes its saved buffers and its output, which is x_{j+1}. x_0 is the
// embedding's output (first stage) or the activations received from the previous stage; x_n is
// the head's input (last stage) or what is handed to the next stage. A block's Out buffer is its
// output, so block(k, j)[Out] and input(k, j + 1) are the same memory.
//
// The model calls, in the order its step runs:
//   forward of block j:   begin_forward(k, j); write input(k, 0) first when j == 0; run the block
//                          from input(k, j) into block(k, j); when j == blocks - 1 run the head
//                          on input(k, blocks) into head(k); end_forward(k, j).
//   backward of block j:  for each i in begin_backward(k, j) (ascending): run block i's forward
//                          again from input(k, i) into block(k, i), then end_recompute(k, i);
//                          then the head's backward when j == blocks - 1, the block's backward
//                          from input(k, j) and block(k, j); end_backward(k, j).
// Evaluation (forwards without backwards) runs between begin_evaluation() and end_evaluation():
// any k, in any order, nothing kept for a backward.
// Views are valid from the begin_* call until the matching end_* call (input(k, j) and
// block(k, j) for the block being run and, during a recomputation, those of the blocks
// recomputed so far); the workspace is valid for the whole step.
#pragma once

#include <vector>

#include "tandem/core/shape.h"
#include "tandem/nn/gpt.h"

namespace tandem::nn {

// What one stage's step saves, in shapes, for a memory manager to place.
struct ChainLayout {
  std::vector<Shape> block;      // the kNumActs<BlockAct> buffers of one block, in BlockAct order
  Shape input;                   // (B, T, C): x_j
  std::vector<Shape> head;       // the kNumActs<FinalAct> buffers (empty without a head)
  std::vector<Shape> workspace;  // Workspace::specs' shapes, in order
  int blocks = 0;                // of this stage, per micro-batch
  // The forwards and backwards of the step in the order they run: (true, k) is micro-batch k's
  // forward through every block of the stage, (false, k) its backward.
  struct Pass {
    bool forward;
    int micro;
    bool operator==(const Pass&) const = default;
  };
  std::vector<Pass> order;
};

class ActivationMemory {
 public:
  virtual ~ActivationMemory() = default;

  virtual void begin_forward(int k, int j) = 0;
  virtual void end_forward(int k, int j) = 0;
  // The blocks whose forward must run again before block j's backward, ascending (empty when
  // its buffers are at hand).
  virtual std::vector<int> begin_backward(int k, int j) = 0;
  virtual void end_recompute(int k, int i) = 0;
  virtual void end_backward(int k, int j) = 0;
  virtual void begin_evaluation() = 0;
  virtual void end_evaluation() = 0;

  virtual float* input(int k, int j) = 0;  // x_j, (B, T, C)
  virtual BlockActivations block(int k, int j) = 0;
  virtual FinalActivations head(int k) = 0;
  virtual Workspace& workspace() = 0;
};

}  // namespace tandem::nn

namespace tandem::nn {

// The chain of `blocks` whole GPT blocks on (B, T) batches, with the head when `head` is true,
// running `order`; a tensor-parallel caller replaces `block` with its shards' shapes.
ChainLayout gpt_chain_layout(const GPTConfig& c, int B, int T, int blocks, bool head,
                             std::vector<ChainLayout::Pass> order);

}  // namespace tandem::nn
