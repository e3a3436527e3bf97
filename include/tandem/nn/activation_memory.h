// The seam between a model that runs a chain of blocks and whoever decides where the buffers
// those blocks save for their backward live: all of them resident (in-core training), or an
// out-of-core runtime that swaps some to a slow tier and drops others for recomputation.
//
// The chain of one pipeline stage is a sequence of units, each of which the memory places,
// swaps or recomputes as a whole: the halves of the stage's blocks (nn::BlockHalf), so unit u is
// the attention (u even) or MLP (u odd) half of the stage's block u / 2. A half, not a whole
// block, because a half's backward reads only its own buffers: the smallest budget a step can
// run in is one half's buffers (about half a block's) plus the workspace.
//
// For each micro-batch k of a step (k counts the micro-batches in the order the step runs their
// forwards): unit u (0 <= u < units) reads its input x_u and writes its saved buffers and its
// output, which is x_{u+1}. x_0 is the embedding's output (first stage) or the activations
// received from the previous stage; x_n is the head's input (last stage) or what is handed to
// the next stage. unit(k, u) binds the unit's saved buffers, its output slot (x_{u+1}) and, when
// its kind names one, its input slot (x_u: the MLP's Resid1).
//
// The model calls, in the order its step runs:
//   forward of unit u:   begin_forward(k, u); write input(k, 0) first when u == 0; run the unit
//                          from input(k, u) into unit(k, u); when u == units - 1 run the head
//                          on input(k, units) into head(k); end_forward(k, u).
//   backward of unit u:  for each i in begin_backward(k, u) (ascending): run unit i's forward
//                          again from input(k, i) into unit(k, i), then end_recompute(k, i);
//                          then the head's backward when u == units - 1, the unit's backward
//                          from input(k, u) and unit(k, u); end_backward(k, u).
// Evaluation (forwards without backwards) runs between begin_evaluation() and end_evaluation():
// any k, in any order, nothing kept for a backward.
// Views are valid from the begin_* call until the matching end_* call (input(k, u) and
// unit(k, u) for the unit being run and, during a recomputation, those of the units recomputed
// so far); the workspace is valid for the whole step.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tandem/core/dtype.h"
#include "tandem/core/shape.h"
#include "tandem/nn/gpt.h"

namespace tandem::nn {

// What one stage's step saves, in shapes and element types, for a memory manager to place.
struct ChainLayout {
  // One buffer: its shape and element type (nn::act_dtype), which make its bytes.
  struct Buffer {
    Shape shape;
    DType dtype = DType::F32;
    uint64_t bytes() const { return static_cast<uint64_t>(shape.numel()) * dtype_size(dtype); }
    bool operator==(const Buffer&) const = default;
  };
  struct UnitKind {
    std::string name;               // "attn", "mlp"
    std::vector<BlockAct> saves;    // what its forward writes for its backward (nn::half_saves)
    std::vector<Buffer> buffers;    // theirs (a tensor-parallel rank's shards), in that order
    BlockAct output;                // the slot of x_{u+1}, f32
    std::optional<BlockAct> input;  // the slot x_u is also bound to, if any
  };
  std::vector<UnitKind> kinds;   // unit u is of kind u % kinds.size()
  Shape input;                   // (B, T, C): every x_u, f32
  std::vector<Buffer> head;      // the kNumActs<FinalAct> buffers (empty without a head)
  std::vector<Shape> workspace;  // Workspace::specs' shapes, in order, f32
  int units = 0;                 // of this stage, per micro-batch
  int first_layer = 0;           // the model's index of the stage's first block, for names
  // The forwards and backwards of the step in the order they run: (true, k) is micro-batch k's
  // forward through every unit of the stage, (false, k) its backward.
  struct Pass {
    bool forward;
    int micro;
    bool operator==(const Pass&) const = default;
  };
  std::vector<Pass> order;

  const UnitKind& kind(int u) const { return kinds[static_cast<size_t>(u) % kinds.size()]; }
  std::string unit_name(int u) const;  // "h3.attn"
};

class ActivationMemory {
 public:
  virtual ~ActivationMemory() = default;

  virtual void begin_forward(int k, int u) = 0;
  virtual void end_forward(int k, int u) = 0;
  // The units whose forward must run again before unit u's backward, ascending (empty when its
  // buffers are at hand).
  virtual std::vector<int> begin_backward(int k, int u) = 0;
  virtual void end_recompute(int k, int i) = 0;
  virtual void end_backward(int k, int u) = 0;
  virtual void begin_evaluation() = 0;
  virtual void end_evaluation() = 0;

  virtual float* input(int k, int u) = 0;  // x_u, (B, T, C)
  // Unit u's saves, output and input slots (the others unbound).
  virtual BlockActivations unit(int k, int u) = 0;
  virtual FinalActivations head(int k) = 0;
  virtual Workspace& workspace() = 0;
};

}  // namespace tandem::nn

namespace tandem::nn {

// The chain of the GPT blocks first_layer .. first_layer + blocks - 1 (2 * blocks units) on
// (B, T) batches, with the head when `head` is true, running `order`. block_shapes: the shapes
// of a block's kNumActs<BlockAct> buffers (a tensor-parallel rank's shards); empty: nn's.
ChainLayout gpt_chain_layout(const GPTConfig& c, int B, int T, int first_layer, int blocks,
                             bool head, std::vector<ChainLayout::Pass> order,
                             const std::vector<Shape>& block_shapes = {});

}  // namespace tandem::nn
