// A GPT-2 block on one tensor-parallel rank (Megatron-LM): QKV and MLP-in column-parallel,
// attention over the rank's own heads, attention-out and MLP-out row-parallel, each row-parallel
// projection finished by an epilogue that the caller supplies: the model-parallel DSL program
// out = dropout(AllReduce(x @ w) + bias) + residual (dsl::workloads::megatron_layer; Llama's
// without the bias), or at a
// pipeline boundary the pipeline program that also hands `out` to the next stage.
//
// The backward pass needs one collective per half-block, Megatron's "f" operator: the input
// gradient of a column-parallel projection is a partial sum over the tp ranks, AllReduced on the
// tp communicator before the LayerNorm's backward (a plain Communicator call: the DSL states the
// forward epilogue; its backward is this one AllReduce).
//
// In bf16 (config.matmul) every projection multiplies bf16 values with f32 accumulation: nn's
// linear layers convert their operands. The epilogue's product, with an f32 tensor-parallel wire
// (ShardBlock::wire), is handed x and w rounded to bf16 values in the workspace's f32 scratch
// (exact products in the program's f32 matmul); with a bf16 wire, x as saved (bf16, act_dtype)
// and a bf16 copy of w, for a program whose product and all-reduce are bf16
// (megatron_layer(f32, p, bf16)).
//
// Every tp rank holds the whole residual stream, the LayerNorms and the row-parallel biases, and
// computes bitwise the same values and gradients for them (the AllReduce result is identical on
// every rank), so replicated parameters stay identical without further communication.
//
// Dropout: the attention dropout is nn's (keyed by global sample and head, so tp ranks draw the
// single-rank mask). The two residual dropouts are the DSL program's: its mask is keyed by the
// element's flat index in the (tokens, d_model) tensor of this micro-batch under a 53-bit seed
// (epilogue_seed) that mixes nn's key for the site with the micro-batch's sample offset. These
// masks are as random as nn's but not the same ones, so with dropout > 0 a tensor- or
// pipeline-parallel run follows a different (equally valid) random path than a single rank.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/core/allocator.h"
#include "tandem/dsl/workloads.h"
#include "tandem/nn/gpt.h"
#include "tandem/parallel/context_parallel.h"

namespace tandem::parallel {

// One row-parallel projection and its epilogue: out (N, H) = dropout(sum over tp ranks of
// x (N, K/tp) @ w (K/tp, H) + bias (H)) + residual (N, H).
struct EpilogueArgs {
  // x (N, K/tp) and w (K/tp, H), of type `operands`: f32, or bf16 with a bf16 wire.
  const void* x = nullptr;
  const void* w = nullptr;
  DType operands = DType::F32;
  const float* bias = nullptr;
  const float* residual = nullptr;
  float* out = nullptr;
  int64_t N = 0;      // tokens (B * T)
  int64_t K = 0;      // input features of the whole layer
  int64_t H = 0;      // output features
  uint64_t seed = 0;  // dropout's key (epilogue_seed)
  int layer = 0;
  bool mlp = false;  // the MLP's projection (else attention's)
};
using Epilogue = std::function<void(const EpilogueArgs&)>;

// Whether the row-parallel projections' epilogue adds a bias: GPT-2's do, Llama's have none (its
// program is then megatron_layer_no_bias, or pipeline_stage_no_bias at a stage's end).
dsl::workloads::Bias epilogue_bias(const nn::GPTConfig& config);

// The dropout key of a residual epilogue, an integer in [0, 2^53) as DSL dropout seeds must be:
// nn::dropout_key(seed, step, layer, site) mixed with the micro-batch's first sample index.
uint64_t epilogue_seed(const nn::StepRng& rng, int layer, nn::DropoutSite site);

// The saved buffers of a block on a tp rank: nn's BlockAct buffers, the head-sharded ones
// (Qkv (B, T, 3c), AttSaved (B, NH/tp, T) or, unfused, (B, NH/tp, T, T), AttY (B, T, c), FcOut,
// GeluOut (B, T, 4c)) at their local size, each of its nn::act_dtype.
std::vector<Shape> shard_block_shapes(const nn::GPTConfig& c, int tp, int B, int T);
nn::BlockActivations allocate_shard_block_activations(const nn::GPTConfig& c, int tp, int B, int T,
                                                      Allocator& alloc = host_allocator());

struct ShardBlock {
  const nn::GPTConfig& config;
  int tp = 1;
  int tp_rank = 0;
  // Sums the backward's input gradient g (n floats) over the tp group in place: the caller runs
  // dsl::workloads::sum_in_place (may be empty when tp == 1).
  std::function<void(float* g, int64_t n)> sum_over_tp;
  // The type of the epilogue program's x and w (its wire, dsl::workloads::megatron_layer): f32,
  // or bf16 with bf16 matmuls.
  DType wire = DType::F32;
  // Context parallelism (parallel/context_parallel.h): B rows of this rank's T tokens of longer
  // sequences, attention run by `context` against every rank's keys and values, rotary positions
  // (Llama) from `context_rope`, a table of the whole sequence's. Null: the rows are whole.
  ContextParallelAttention* context = nullptr;
  const nn::RopeTable* context_rope = nullptr;
};

// Block `layer` on input x (B, T, C): writes every buffer of `a`, Out last (through
// mlp_epilogue). ws is a Workspace for the whole model's (B, T) (its buffers are larger than
// the shard needs).
void shard_block_forward(const ShardBlock& sb, int layer, const nn::BlockParams& w,
                         const nn::BlockActivations& a, const float* x, nn::Workspace& ws, int B,
                         int T, const nn::StepRng& rng, const Epilogue& attn_epilogue,
                         const Epilogue& mlp_epilogue);

// dres (B, T, C): d(loss)/d(Out) on entry, d(loss)/d(x) on return; dw += this rank's gradients.
void shard_block_backward(const ShardBlock& sb, int layer, const nn::BlockParams& w,
                          const nn::BlockParams& dw, const nn::BlockActivations& a, const float* x,
                          float* dres, nn::Workspace& ws, int B, int T, const nn::StepRng& rng);

// One half of the block (nn::BlockHalf; the two functions above are both halves in order), so an
// out-of-core memory can place, swap or recompute each half on its own. x is the half's input:
// the block's input for attention, a[Resid1] for the MLP. The forward finishes with `epilogue`.
void shard_half_forward(const ShardBlock& sb, int layer, nn::BlockHalf half,
                        const nn::BlockParams& w, const nn::BlockActivations& a, const float* x,
                        nn::Workspace& ws, int B, int T, const nn::StepRng& rng,
                        const Epilogue& epilogue);
// dres: d(loss)/d(the half's output) on entry, d(loss)/d(x) on return.
void shard_half_backward(const ShardBlock& sb, int layer, nn::BlockHalf half,
                         const nn::BlockParams& w, const nn::BlockParams& dw,
                         const nn::BlockActivations& a, const float* x, float* dres,
                         nn::Workspace& ws, int B, int T, const nn::StepRng& rng);

}  // namespace tandem::parallel
