// One rank's shard of the model's parameters (GPT-2 or Llama) and its map to the whole model's flat
// buffer.
#include "tandem/parallel/shard.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "tandem/core/error.h"
#include "tandem/core/formulas.h"

namespace tandem::parallel {
namespace {

constexpr int kBlockTensors = 12;

// A tensor with no elements (a bias Llama lacks) is a null pointer in the stage views.
float* at_or_null(float* p, const LocalTensor& t) { return t.numel() == 0 ? nullptr : p; }

// Appends a run, merging it into the previous one when both continue it (a tp = 1 "shard").
void push_run(std::vector<FlatRun>& runs, FlatRun r) {
  if (r.count <= 0) return;
  if (!runs.empty()) {
    FlatRun& b = runs.back();
    if (b.local + b.count == r.local && b.global + b.count == r.global) {
      b.count += r.count;
      return;
    }
  }
  runs.push_back(r);
}

}  // namespace

int stage_first_layer(int n_layers, const GridShape& grid, int stage) {
  if (grid.stage_layers.empty()) return static_cast<int>(fx::part_offset(n_layers, grid.pp, stage));
  TANDEM_CHECK(stage >= 0 && stage <= grid.stage_layers.size(), "stage {} of a split into {}",
               stage, grid.stage_layers.size());
  int first = 0;
  for (int s = 0; s < stage; ++s) first += grid.stage_layers[s];
  return first;
}
int stage_end_layer(int n_layers, const GridShape& grid, int stage) {
  return stage_first_layer(n_layers, grid, stage + 1);
}

std::string stage_layers_problem(int n_layers, const GridShape& grid) {
  const StageLayers& split = grid.stage_layers;
  if (split.empty()) return "";
  const std::string given = "--stage-layers " + split.str();
  if (grid.pp < 2)
    return fmt::format(
        "{} splits a pipeline's layers over its stages: it needs --pp 2 or more (got --pp {})",
        given, grid.pp);
  if (split.size() != grid.pp)
    return fmt::format("{} gives {} count{}, one a stage, but --pp is {}", given, split.size(),
                       split.size() == 1 ? "" : "s", grid.pp);
  int64_t sum = 0;
  for (int s = 0; s < split.size(); ++s) {
    if (split[s] < 1)
      return fmt::format("{}: stage {} gets {} layers; each stage needs at least 1", given, s,
                         split[s]);
    sum += split[s];
  }
  if (sum != n_layers)
    return fmt::format("{} sums to {} layers; the model has {} (--layers)", given, sum, n_layers);
  return "";
}

ShardLayout::ShardLayout(const nn::GPTConfig& config, const GridShape& grid, int tp_rank, int stage)
    : config_(config), tp_(grid.tp), tp_rank_(tp_rank), stage_(stage), pp_(grid.pp) {
  config.validate();
  if (config.n_heads % tp_ != 0)
    user_error("tensor parallelism over {} ranks needs the head count ({}) to be a multiple of {}",
               tp_, config.n_heads, tp_);
  if (config.n_kv_heads() % tp_ != 0)
    user_error(
        "tensor parallelism over {} ranks needs the key/value head count ({}) to be a multiple of "
        "{}: each rank keeps whole key/value heads",
        tp_, config.n_kv_heads(), tp_);
  if (config.mlp_width() % tp_ != 0)
    user_error("tensor parallelism over {} ranks needs the MLP's width ({}) to be a multiple of {}",
               tp_, config.mlp_width(), tp_);
  if (pp_ > std::max(config.n_layers, 1))
    user_error("pipeline parallelism over {} stages needs at least {} layers; the model has {}",
               pp_, pp_, config.n_layers);
  TANDEM_CHECK(tp_rank >= 0 && tp_rank < tp_ && stage >= 0 && stage < pp_, "shard ({}, {}) of {}",
               tp_rank, stage, grid.str());
  if (std::string why = stage_layers_problem(config.n_layers, grid); !why.empty())
    user_error("{}", why);
  first_layer_ = stage_first_layer(config.n_layers, grid, stage);
  end_layer_ = stage_end_layer(config.n_layers, grid, stage);
  has_embedding_ = stage == 0;
  has_final_ = stage == pp_ - 1;

  const std::vector<nn::ParamSpec> specs = nn::gpt_parameter_specs(config);
  auto spec = [&](const std::string& name) -> const nn::ParamSpec& {
    for (const nn::ParamSpec& s : specs)
      if (s.name == name) return s;
    internal_error("no GPT parameter '" + name + "'");
  };
  const bool whole_writer = tp_rank == 0;  // tensors every tp rank holds whole
  if (has_embedding_) {
    wte_ = static_cast<int>(tensors_.size());
    add(spec("wte.weight"), ShardKind::Whole, whole_writer);
    wpe_ = static_cast<int>(tensors_.size());
    add(spec("wpe.weight"), ShardKind::Whole, whole_writer);
  }
  for (int l = first_layer_; l < end_layer_; ++l) {
    block_first_.push_back(static_cast<int>(tensors_.size()));
    const std::string h = "h." + std::to_string(l) + ".";
    add(spec(h + "ln_1.weight"), ShardKind::Whole, whole_writer);
    add(spec(h + "ln_1.bias"), ShardKind::Whole, whole_writer);
    add(spec(h + "attn.c_attn.weight"), ShardKind::HeadColumns, true);
    add(spec(h + "attn.c_attn.bias"), ShardKind::HeadColumns, true);
    add(spec(h + "attn.c_proj.weight"), ShardKind::Rows, true);
    add(spec(h + "attn.c_proj.bias"), ShardKind::Whole, whole_writer);
    add(spec(h + "ln_2.weight"), ShardKind::Whole, whole_writer);
    add(spec(h + "ln_2.bias"), ShardKind::Whole, whole_writer);
    add(spec(h + "mlp.c_fc.weight"), ShardKind::Columns, true);
    add(spec(h + "mlp.c_fc.bias"), ShardKind::Columns, true);
    add(spec(h + "mlp.c_proj.weight"), ShardKind::Rows, true);
    add(spec(h + "mlp.c_proj.bias"), ShardKind::Whole, whole_writer);
  }
  if (has_final_) {
    ln_f_ = static_cast<int>(tensors_.size());
    add(spec("ln_f.weight"), ShardKind::Whole, whole_writer);
    add(spec("ln_f.bias"), ShardKind::Whole, whole_writer);
    // A tied LM head is wte: a last stage that is not also the first keeps its own copy,
    // kept equal to stage 0's by summing the two copies' gradients (see Grid::tied). Stage 0
    // writes it. An untied head is the last stage's own lm_head.weight.
    if (!config.tie_embeddings) {
      final_wte_ = static_cast<int>(tensors_.size());
      add(spec("lm_head.weight"), ShardKind::Whole, whole_writer);
    } else if (!has_embedding_) {
      final_wte_ = static_cast<int>(tensors_.size());
      add(spec("wte.weight"), ShardKind::Whole, false);
    } else {
      final_wte_ = wte_;
    }
  }
  if (end_layer_ > first_layer_) {
    blocks_range_ = {block_range(first_layer_).first, block_range(end_layer_ - 1).second};
    block_floats_ = block_range(first_layer_).second - block_range(first_layer_).first;
    for (int l = first_layer_; l < end_layer_; ++l) {
      const auto [b, e] = block_range(l);
      TANDEM_CHECK(e - b == block_floats_, "block {} has {} local elements, block {} has {}", l,
                   e - b, first_layer_, block_floats_);
    }
  }
}

void ShardLayout::add(const nn::ParamSpec& s, ShardKind kind, bool writer) {
  LocalTensor t;
  t.name = s.name;
  t.global_shape = s.shape;
  t.local_offset = size_;
  t.global_offset = s.offset;
  t.kind = kind;
  t.writer = writer;
  const int tp = tp_, r = tp_rank_;
  const bool matrix = s.shape.rank() == 2;
  const int64_t rows = matrix ? s.shape[0] : 1;
  const int64_t cols = matrix ? s.shape[1] : s.shape[0];
  switch (kind) {
    case ShardKind::Whole:
      t.local_shape = s.shape;
      push_run(t.runs, {t.local_offset, t.global_offset, s.numel()});
      break;
    case ShardKind::HeadColumns:  // (rows, C + 2 KV) -> [q | k | v] of rank r's heads
    case ShardKind::Columns: {    // (rows, H) -> (rows, H / tp); Llama's [gate | up] each
      // The column parts, each split over the tp ranks: q, k and v (k and v kv_heads wide);
      // the MLP's one part, or Llama's gate and up.
      const nn::GPTConfig& c = config_;
      const int64_t kv = static_cast<int64_t>(c.n_kv_heads()) * c.head_size();
      std::vector<int64_t> parts = kind == ShardKind::HeadColumns
                                       ? std::vector<int64_t>{c.d_model, kv, kv}
                                   : c.llama() ? std::vector<int64_t>{c.mlp_width(), c.mlp_width()}
                                               : std::vector<int64_t>{cols};
      if (cols == 0) parts.assign(1, 0);  // a bias Llama lacks
      int64_t local_cols = 0;
      for (int64_t p : parts) local_cols += p / tp;
      t.local_shape = matrix ? Shape{rows, local_cols} : Shape{local_cols};
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t done = 0, global_col = 0; int64_t p : parts) {
          push_run(t.runs, {t.local_offset + i * local_cols + done,
                            t.global_offset + i * cols + global_col + r * (p / tp), p / tp});
          done += p / tp;
          global_col += p;
        }
      break;
    }
    case ShardKind::Rows: {  // (K, H) -> (K / tp, H)
      TANDEM_CHECK(matrix, "row shard of a vector {}", s.name);
      const int64_t k = rows / tp;
      t.local_shape = Shape{k, cols};
      push_run(t.runs, {t.local_offset, t.global_offset + r * k * cols, k * cols});
      break;
    }
  }
  size_ += t.local_shape.numel();
  tensors_.push_back(std::move(t));
}

const LocalTensor& ShardLayout::tensor(const std::string& name) const {
  for (const LocalTensor& t : tensors_)
    if (t.name == name) return t;
  internal_error("stage " + std::to_string(stage_) + " holds no tensor '" + name + "'");
}

nn::EmbeddingParams ShardLayout::embedding(float* base) const {
  TANDEM_CHECK(has_embedding_, "stage {} has no embedding", stage_);
  const LocalTensor& wpe = tensors_[static_cast<size_t>(wpe_)];
  return {base + tensors_[static_cast<size_t>(wte_)].local_offset,
          at_or_null(base + wpe.local_offset, wpe)};
}

std::pair<size_t, size_t> ShardLayout::block_tensors(int layer) const {
  TANDEM_CHECK(layer >= first_layer_ && layer < end_layer_,
               "stage {} holds layers [{}, {}), not {}", stage_, first_layer_, end_layer_, layer);
  const size_t i0 = static_cast<size_t>(block_first_[static_cast<size_t>(layer - first_layer_)]);
  return {i0, i0 + kBlockTensors};
}

std::pair<int64_t, int64_t> ShardLayout::block_range(int layer) const {
  const auto [first, end] = block_tensors(layer);
  const LocalTensor& last = tensors_[end - 1];
  return {tensors_[first].local_offset, last.local_offset + last.numel()};
}

int ShardLayout::block_of(int64_t local) const {
  if (local < blocks_range_.first || local >= blocks_range_.second) return -1;
  return first_layer_ + static_cast<int>((local - blocks_range_.first) / block_floats_);
}

nn::BlockParams ShardLayout::block(float* base, int layer) const {
  return block_from(base, 0, layer);
}

nn::BlockParams ShardLayout::block_at(float* block_start, int layer) const {
  return block_from(block_start, block_range(layer).first, layer);
}

// Each tensor of block `layer` at p + (its local offset - first).
nn::BlockParams ShardLayout::block_from(float* p, int64_t first, int layer) const {
  TANDEM_CHECK(layer >= first_layer_ && layer < end_layer_,
               "stage {} holds layers [{}, {}), not {}", stage_, first_layer_, end_layer_, layer);
  const size_t i0 = static_cast<size_t>(block_first_[static_cast<size_t>(layer - first_layer_)]);
  float* t[kBlockTensors];
  for (size_t i = 0; i < kBlockTensors; ++i) {
    const LocalTensor& tensor = tensors_[i0 + i];
    t[i] = at_or_null(p + (tensor.local_offset - first), tensor);
  }
  return {t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8], t[9], t[10], t[11]};
}

nn::FinalParams ShardLayout::final_stage(float* base) const {
  TANDEM_CHECK(has_final_, "stage {} has no final stage", stage_);
  const LocalTensor& ln = tensors_[static_cast<size_t>(ln_f_)];
  const LocalTensor& bias = tensors_[static_cast<size_t>(ln_f_) + 1];
  return {base + ln.local_offset, at_or_null(base + bias.local_offset, bias),
          base + tensors_[static_cast<size_t>(final_wte_)].local_offset};
}

void ShardLayout::extract(const float* global, float* local) const {
  for (const LocalTensor& t : tensors_)
    for (const FlatRun& r : t.runs)
      std::memcpy(local + r.local, global + r.global, static_cast<size_t>(r.count) * sizeof(float));
}

void ShardLayout::for_each_run(
    int64_t begin, int64_t end, bool writers_only,
    const std::function<void(const LocalTensor&, const FlatRun&)>& fn) const {
  for (const LocalTensor& t : tensors_) {
    if (writers_only && !t.writer) continue;
    if (t.local_offset >= end || t.local_offset + t.numel() <= begin) continue;
    for (const FlatRun& r : t.runs) {
      const int64_t b = std::max(begin, r.local), e = std::min(end, r.local + r.count);
      if (b < e) fn(t, {b, r.global + (b - r.local), e - b});
    }
  }
}

void ShardLayout::deposit(const float* local_range, int64_t begin, int64_t end, float* global,
                          bool writers_only) const {
  for_each_run(begin, end, writers_only, [&](const LocalTensor&, const FlatRun& r) {
    std::memcpy(global + r.global, local_range + (r.local - begin),
                static_cast<size_t>(r.count) * sizeof(float));
  });
}

}  // namespace tandem::parallel
