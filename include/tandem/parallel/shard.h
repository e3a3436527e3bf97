// Which part of the GPT-2 model one rank holds (its pipeline stage's tensors, tensor-parallel
// shards of them), laid out in one flat local buffer, and the map between that buffer and the
// whole model's flat buffer (nn::gpt_parameter_specs order), so that checkpoints, initialisation
// and tests speak in whole GPT-2 tensors whatever the grid.
//
// Megatron-LM's sharding over tp ranks (rank r of tp, C = d_model, c = C / tp, heads per rank
// NH / tp):
//   attn.c_attn  (C, 3C)  column-parallel by heads: the q, k and v columns of rank r's heads,
//                         kept in [q | k | v] order: (C, 3c), bias (3c)
//   attn.c_proj  (C, C)   row-parallel: rows [r c, (r+1) c): (c, C); bias (C) whole
//   mlp.c_fc     (C, 4C)  column-parallel: columns [r 4c, (r+1) 4c): (C, 4c), bias (4c)
//   mlp.c_proj   (4C, C)  row-parallel: rows [r 4c, (r+1) 4c): (4c, C); bias (C) whole
//   everything else (embeddings, LayerNorms, row-parallel biases) whole on every tp rank.
// Pipeline: stage s holds blocks [first_layer, end_layer) (stage_first_layer), stage 0
// also wte and wpe, the last stage ln_f and, when it is not stage 0, its own copy of wte for the
// tied LM head (appended last). Local order is GPT-2's order.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tandem/core/shape.h"
#include "tandem/nn/gpt.h"
#include "tandem/parallel/grid.h"

namespace tandem::parallel {

enum class ShardKind { Whole, HeadColumns, Columns, Rows };

// A contiguous run of floats: local[local .. local + count) is global[global .. global + count).
struct FlatRun {
  int64_t local = 0;
  int64_t global = 0;
  int64_t count = 0;
};

struct LocalTensor {
  std::string name;    // GPT-2's name ("h.3.attn.c_attn.weight")
  Shape global_shape;  // in the whole model
  Shape local_shape;   // on this rank
  int64_t local_offset = 0;
  int64_t global_offset = 0;
  ShardKind kind = ShardKind::Whole;
  // Whether this rank's copy is the one written when the model is assembled: a tensor held
  // whole by every tp rank (or by two stages, wte) is written by one of them only.
  bool writer = true;
  std::vector<FlatRun> runs;  // absolute offsets into the local and the global flat buffers
  int64_t numel() const { return local_shape.numel(); }
};

// Blocks [first, end) of stage s of grid.pp over n_layers: grid.stage_layers' counts where given,
// else split as evenly as they go (the first n_layers % pp stages one more). Every reader of a
// stage's layers (the layout below, so the model, the memory estimate, the out-of-core plan and
// the step model) comes here.
int stage_first_layer(int n_layers, const GridShape& grid, int stage);
int stage_end_layer(int n_layers, const GridShape& grid, int stage);
// What is wrong with grid.stage_layers for a model of n_layers ("" when nothing: empty, or pp
// counts of at least 1 summing to n_layers), in the flags' words.
std::string stage_layers_problem(int n_layers, const GridShape& grid);

class ShardLayout {
 public:
  // UserError when the grid does not fit the model (tp must divide n_heads, pp at most
  // n_layers, stage_layers as stage_layers_problem says).
  ShardLayout(const nn::GPTConfig& config, const GridShape& grid, int tp_rank, int stage);

  const nn::GPTConfig& config() const { return config_; }
  int tp() const { return tp_; }
  int tp_rank() const { return tp_rank_; }
  int stage() const { return stage_; }
  int first_layer() const { return first_layer_; }
  int end_layer() const { return end_layer_; }
  bool has_embedding() const { return has_embedding_; }
  bool has_final() const { return has_final_; }
  int local_heads() const { return config_.n_heads / tp_; }

  int64_t size() const { return size_; }  // floats in the local buffer
  const std::vector<LocalTensor>& tensors() const { return tensors_; }
  const LocalTensor& tensor(const std::string& name) const;  // InternalError if absent

  // Pointers into a local flat buffer `base` (parameters or gradients).
  nn::EmbeddingParams embedding(float* base) const;
  nn::BlockParams block(float* base, int layer) const;
  // The same for a buffer holding block `layer`'s elements alone (block_range(layer), from its
  // first).
  nn::BlockParams block_at(float* block_start, int layer) const;
  nn::FinalParams final_stage(float* base) const;

  // The local elements [first, second) of block `layer`'s tensors (contiguous, GPT-2 order), and
  // the indices into tensors() of its first and one past its last tensor.
  std::pair<int64_t, int64_t> block_range(int layer) const;
  std::pair<size_t, size_t> block_tensors(int layer) const;
  // Local elements of one block: every block of the stage has as many (checked once, here), so
  // the placements of the blocks' state size their slots and slices by it.
  int64_t block_floats() const { return block_floats_; }
  // The local elements [first, second) of all the stage's blocks (contiguous), and the block whose
  // elements hold local element `local` (-1: outside the blocks).
  std::pair<int64_t, int64_t> blocks_range() const { return blocks_range_; }
  int block_of(int64_t local) const;

  // Copies this rank's part of a whole-model flat buffer into its local buffer.
  void extract(const float* global, float* local) const;
  // Writes the local elements [begin, end) into a whole-model buffer, for the tensors this rank
  // is the writer of (all of them with `writers_only` false).
  void deposit(const float* local_range, int64_t begin, int64_t end, float* global,
               bool writers_only = true) const;
  // Visits the runs of local elements [begin, end) (clipped), writers only or all.
  void for_each_run(int64_t begin, int64_t end, bool writers_only,
                    const std::function<void(const LocalTensor&, const FlatRun&)>& fn) const;

 private:
  void add(const nn::ParamSpec& spec, ShardKind kind, bool writer);
  nn::BlockParams block_from(float* p, int64_t first, int layer) const;

  nn::GPTConfig config_;
  int tp_, tp_rank_, stage_, pp_;
  int first_layer_, end_layer_;
  bool has_embedding_, has_final_;
  int64_t size_ = 0;
  std::vector<LocalTensor> tensors_;
  int wte_ = -1, wpe_ = -1, final_wte_ = -1, ln_f_ = -1;
  std::vector<int> block_first_;  // index of each local block's first tensor
  int64_t block_floats_ = 0;
  std::pair<int64_t, int64_t> blocks_range_{0, 0};
};

}  // namespace tandem::parallel
