// The chain layout of GPT blocks: the shapes an activation memory places.
#include "tandem/nn/activation_memory.h"

#include <fmt/format.h>

#include "tandem/core/error.h"

namespace tandem::nn {

std::string ChainLayout::unit_name(int u) const {
  const int per_block = static_cast<int>(kinds.size());
  return fmt::format("h{}.{}", first_layer + u / per_block, kind(u).name);
}

ChainLayout gpt_chain_layout(const GPTConfig& c, int B, int T, int first_layer, int blocks,
                             bool head, std::vector<ChainLayout::Pass> order,
                             const std::vector<Shape>& block_shapes) {
  std::vector<Shape> shapes = block_shapes;
  if (shapes.empty())
    for (int i = 0; i < kNumActs<BlockAct>; ++i)
      shapes.push_back(act_shape(c, static_cast<BlockAct>(i), B, T));
  TANDEM_CHECK(static_cast<int>(shapes.size()) == kNumActs<BlockAct>, "{} block buffer shapes",
               shapes.size());
  ChainLayout l;
  for (int h = 0; h < kBlockHalves; ++h) {
    const auto half = static_cast<BlockHalf>(h);
    ChainLayout::UnitKind k{
        std::string(half_name(half)), half_saves(half), {}, half_output(half), std::nullopt};
    for (BlockAct a : k.saves)
      k.buffers.push_back({shapes[static_cast<size_t>(a)], act_dtype(c, a)});
    if (half == BlockHalf::Mlp) k.input = BlockAct::Resid1;
    l.kinds.push_back(std::move(k));
  }
  l.input = Shape{B, T, c.d_model};
  if (head)
    for (int i = 0; i < kNumActs<FinalAct>; ++i) {
      const auto a = static_cast<FinalAct>(i);
      l.head.push_back({act_shape(c, a, B, T), act_dtype(c, a)});
    }
  for (const ActivationSpec& s : Workspace::specs(c, B, T)) l.workspace.push_back(s.shape);
  l.units = kBlockHalves * blocks;
  l.first_layer = first_layer;
  l.order = std::move(order);
  return l;
}

}  // namespace tandem::nn
