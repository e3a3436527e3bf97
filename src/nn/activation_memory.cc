// The chain layout of GPT blocks: the shapes an activation memory places.
#include "tandem/nn/activation_memory.h"

namespace tandem::nn {

ChainLayout gpt_chain_layout(const GPTConfig& c, int B, int T, int blocks, bool head,
                             std::vector<ChainLayout::Pass> order) {
  ChainLayout l;
  for (int i = 0; i < kNumActs<BlockAct>; ++i) l.block.push_back(act_shape(c, static_cast<BlockAct>(i), B, T));
  l.input = Shape{B, T, c.d_model};
  if (head)
    for (int i = 0; i < kNumActs<FinalAct>; ++i) l.head.push_back(act_shape(c, static_cast<FinalAct>(i), B, T));
  for (const ActivationSpec& s : Workspace::specs(c, B, T)) l.workspace.push_back(s.shape);
  l.blocks = blocks;
  l.order = std::move(order);
  return l;
}

}  // namespace tandem::nn
