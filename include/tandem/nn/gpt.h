// The GPT-2 model: its configuration, its parameters in one flat f32 buffer with GPT-2's names,
// its saved activations as named buffers the caller allocates, and the forward and backward
// passes run stage by stage (embedding, block 0 .. L-1, final) with a hook between stages.
//
// Memory model (designed for the out-of-core planner):
// - Parameters and gradients are two ParameterSets with the same layout: one flat buffer, each
//   tensor a named view, each block's 12 tensors contiguous (so a pipeline stage or a swapped
//   block is one slice).
// - Every activation a backward pass reads is a named buffer ("h.3.ln_1.out", "h.3.attn.lse",
//   ...) held in a Buffers<Kind> value: an array of Tensor views indexed by an enum. Who
//   allocates them and where they live is the caller's choice (GPTActivations allocates all of
//   them through one Allocator; a planner may bind each to an arena offset, swap it out, or drop
//   it and recompute the whole block). No layer owns memory. A buffer is f32, or bf16 where
//   act_dtype says (the matmuls' inputs, in bf16 training), and its bytes follow its type.
// - Scratch that lives only inside one stage (projection outputs, intermediate gradients,
//   attention scratch) is a Workspace, allocated once and shared by every stage. Forward and
//   backward allocate nothing.
// - The forward pass of a block, run again on the same input, parameters and StepRng, writes
//   bitwise the same buffers (dropout masks come from the counter-based RNG, never from state),
//   so recomputing a dropped block is exact.
//
// Dropout (GPT-2's embd, attn and resid pdrop, all config.dropout): each site draws its mask with
// key dropout_key(seed, step, layer, site) at the element's index in the global batch (see
// layers.h), so data-, tensor- and pipeline-parallel runs draw the masks a single rank would.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tandem/core/allocator.h"
#include "tandem/core/dtype.h"
#include "tandem/core/shape.h"
#include "tandem/core/tensor.h"
#include "tandem/nn/layers.h"

namespace tandem::nn {

// ---------------------------------------------------------------------------------------------
// Configuration.
// The largest sizes a config may name: far past any model a CPU trains, and small enough that
// no count of parameters or activations overflows on the way to a refusal (the memory check).
inline constexpr int kMaxLayers = 1 << 16;
inline constexpr int kMaxWidth = 1 << 20;      // d_model (and so n_heads)
inline constexpr int kMaxPositions = 1 << 24;  // seq_len, max_positions
inline constexpr int kMaxVocab = 1 << 24;
inline constexpr int64_t kMaxParameters = int64_t{1} << 40;

// The two families one block description builds (the fields below say which ones each reads):
// GPT-2: LayerNorm, learned positions (wpe), GELU MLP of 4 x d_model, biases, tied head.
// Llama: RMSNorm (norm_eps), rotary positions (rope_theta, rope_scaling), SwiGLU MLP of `ffn`,
// grouped-query attention (kv_heads), no biases but optional q/k/v ones (Qwen2), the head tied
// or not.
enum class Arch : uint8_t { Gpt2, Llama };
std::string_view arch_name(Arch a);  // "gpt2", "llama"

// Which attention kernel the blocks run (layers.h). Fused: flash_attention_*, saving each row's
// log-sum-exp, B x NH x T floats a layer ("attn.lse"). Unfused: attention_*, saving the softmax,
// B x NH x T x T ("attn.softmax"): the reference the tests compare the fused one against. The
// choice changes what a block saves, so the sizes everything counts follow it (act_shape,
// Workspace::specs: the out-of-core planner, the memory estimate, `tandem plan`).
enum class AttentionKernel : uint8_t { Fused, Unfused };
std::string_view attention_kernel_name(AttentionKernel k);  // "fused", "unfused"

struct GPTConfig {
  int vocab_size = 256;  // byte-level by default
  int n_layers = 4;
  int n_heads = 4;
  int d_model = 256;
  int seq_len = 128;        // the context length the model is trained at
  int max_positions = 128;  // no batch may be longer (GPT-2: wpe's rows, n_positions)
  float dropout = 0.0f;     // GPT-2's embd_pdrop = attn_pdrop = resid_pdrop
  // How the linear layers and the LM head multiply (layers.h, MatmulPrecision): F32, or BF16
  // operands with f32 accumulation. Part of the config, beside the sizes, because it is needed
  // wherever they are: by every stage and by the Workspace's size (Workspace::specs, which the
  // out-of-core planner and the memory estimate count). Not a property of the weights: they are
  // f32 either way and checkpoints do not record it, so a run may resume in the other precision.
  DType matmul = DType::F32;
  // The block's family (after the sizes, so that GPT-2 configs written as braced lists of sizes
  // still read the same), then the fields only Llama reads (their defaults elsewhere).
  Arch arch = Arch::Gpt2;
  int kv_heads = 0;               // key/value heads, dividing n_heads; 0: n_heads
  int ffn = 0;                    // the SwiGLU MLP's width (intermediate_size); 0: 4 * d_model
  float norm_eps = 1e-5f;         // RMSNorm's epsilon (rms_norm_eps)
  double rope_theta = 10000.0;    // rotary base
  RopeScaling rope_scaling = {};  // Llama 3.1's "llama3" frequency scaling, or none
  bool qkv_bias = false;          // q/k/v projections with a bias (Qwen2)
  bool tie_embeddings = true;     // the head is wte; else its own lm_head.weight (V, C)
  AttentionKernel attention = AttentionKernel::Fused;

  int head_size() const { return d_model / n_heads; }
  bool llama() const { return arch == Arch::Llama; }
  int n_kv_heads() const { return kv_heads > 0 ? kv_heads : n_heads; }
  // Columns of attn.c_attn's output: [q (C) | k | v], k and v kv_heads heads each.
  int64_t qkv_width() const { return d_model + int64_t{2} * n_kv_heads() * head_size(); }
  // The MLP's hidden width (c_proj's input), and mlp.c_fc's output: Llama's is [gate | up].
  int64_t mlp_width() const { return ffn > 0 ? ffn : int64_t{4} * d_model; }
  int64_t fc_width() const { return llama() ? 2 * mlp_width() : mlp_width(); }
  // Throws UserError naming the first bad field and what it must be.
  void validate() const;
  bool operator==(const GPTConfig&) const = default;
};

// ---------------------------------------------------------------------------------------------
// Parameters. Names and shapes are GPT-2's (HF transformers' GPT2Model state dict, where the
// embeddings are "wte.weight" and "wpe.weight"): wte (V, C), wpe (P, C), then per block
// h.{i}.ln_1.weight (C), .bias (C), h.{i}.attn.c_attn.weight (C, 3C), .bias (3C),
// h.{i}.attn.c_proj.weight (C, C), .bias (C), h.{i}.ln_2.weight, .bias, h.{i}.mlp.c_fc.weight
// (C, 4C), .bias (4C), h.{i}.mlp.c_proj.weight (4C, C), .bias (C), then ln_f.weight, ln_f.bias.
// Linear weights are (in, out) as HF's Conv1D stores them: they load into PyTorch unchanged.
// A Llama model has the same twelve tensors a block, in the same order, so that every module
// that slices a block (pipeline stages, shards, streamed state) treats both families alike: the
// ones Llama lacks are empty (0 elements: the biases, but q/k/v's with qkv_bias, and wpe);
// ln_1/ln_2/ln_f are RMSNorm's weights; attn.c_attn.weight is (C, qkv_width) = [q | k | v];
// mlp.c_fc.weight is (C, 2F) = [gate | up] and mlp.c_proj.weight (F, C); an untied head adds
// lm_head.weight (V, C) last.
struct ParamSpec {
  std::string name;
  Shape shape;
  int64_t offset = 0;  // in floats, into the flat buffer
  int64_t numel() const { return shape.numel(); }
};

// Every tensor in GPT-2's order, which is also the flat buffer's order.
std::vector<ParamSpec> gpt_parameter_specs(const GPTConfig& config);
int64_t gpt_num_parameters(const GPTConfig& config);

// Raw views of the tensors each stage uses (weights, or their gradients).
struct EmbeddingParams {
  float* wte;  // (V, C)
  float* wpe;  // (P, C)
};
// A tensor with no elements (a bias Llama lacks) is a null pointer here.
struct BlockParams {
  float* ln_1_w;       // (C)
  float* ln_1_b;       // (C)
  float* c_attn_w;     // (C, 3C); Llama (C, qkv_width)
  float* c_attn_b;     // (3C); Llama (qkv_width) with qkv_bias
  float* attn_proj_w;  // (C, C)
  float* attn_proj_b;  // (C)
  float* ln_2_w;       // (C)
  float* ln_2_b;       // (C)
  float* c_fc_w;       // (C, 4C); Llama (C, 2F)
  float* c_fc_b;       // (4C)
  float* mlp_proj_w;   // (4C, C); Llama (F, C)
  float* mlp_proj_b;   // (C)
};
struct FinalParams {
  float* ln_f_w;  // (C)
  float* ln_f_b;  // (C); null for Llama
  float* wte;     // (V, C), the LM head: wte when tied, else lm_head.weight
};

// One flat f32 buffer with a named view per tensor; used for weights and for gradients alike.
// Copies share the buffer, as Tensor copies do.
class ParameterSet {
 public:
  // Zero-filled, from `alloc`.
  explicit ParameterSet(const GPTConfig& config, Allocator& alloc = host_allocator());

  const GPTConfig& config() const { return config_; }
  Tensor flat() const { return flat_; }  // (N)
  int64_t size() const { return flat_.numel(); }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  // The tensor called `name`, in its GPT-2 shape; UserError if there is none.
  Tensor operator[](std::string_view name) const;
  // (name, view) for every tensor, in order.
  std::vector<std::pair<std::string, Tensor>> named() const;

  EmbeddingParams embedding() const;
  BlockParams block(int layer) const;
  FinalParams final_stage() const;
  // Block `layer`'s 12 tensors as one contiguous 1-D view.
  Tensor block_flat(int layer) const;

  void zero() const;

 private:
  float* at(size_t spec_index) const;

  GPTConfig config_;
  Tensor flat_;
  std::vector<ParamSpec> specs_;
};

// GPT-2's initialisation: weights N(0, 0.02), the two residual projections (attn.c_proj.weight,
// mlp.c_proj.weight) N(0, 0.02 / sqrt(2 * n_layers)), biases 0, LayerNorm weights 1. Element i
// of the flat buffer draws random_normal(seed, i), so every rank initialises identically and a
// tensor-parallel shard takes the values of the full tensor's elements.
void gpt_init(const ParameterSet& params, uint64_t seed);
// The same values for `count` elements of tensor `name` starting at element `first` of the flat
// buffer (first - the tensor's offset: the index inside the tensor), written to `out`: a rank
// initialises its shard, or a streamed tensor, without the whole model.
void gpt_init_values(const GPTConfig& config, std::string_view name, int64_t first, int64_t count,
                     float* out, uint64_t seed);

// ---------------------------------------------------------------------------------------------
// Saved activations. Each stage's buffers are named by an enum; Buffers<Kind> holds one Tensor
// view per enumerator. The full name of a buffer is its stage prefix ("embed.", "h.{i}.", none
// for the final stage) and its suffix.

enum class EmbeddingAct : int { Out, kCount };
enum class BlockAct : int {
  Ln1Out,    // (B, T, C)      ln_1.out
  Ln1Mean,   // (B, T)         ln_1.mean
  Ln1Rstd,   // (B, T)         ln_1.rstd
  Qkv,       // (B, T, 3C)     attn.c_attn.out
  AttSaved,  // (B, NH, T)     attn.lse: each query row's log-sum-exp (the fused kernel), or
             // (B, NH, T, T)  attn.softmax: the probabilities before dropout
             // (AttentionKernel::Unfused)
  AttY,      // (B, T, C)      attn.y: heads merged, the input of attn.c_proj
  Resid1,    // (B, T, C)      resid_1: x + attention branch
  Ln2Out,    // (B, T, C)      ln_2.out
  Ln2Mean,   // (B, T)         ln_2.mean
  Ln2Rstd,   // (B, T)         ln_2.rstd
  FcOut,     // (B, T, 4C)     mlp.c_fc.out
  GeluOut,   // (B, T, 4C)     mlp.gelu.out
  Out,       // (B, T, C)      out: resid_1 + MLP branch; the next stage's input
  kCount
};
// The head saves no logits or probabilities: it is chunked over the tokens (layers.h,
// lm_head_loss_forward), and its backward computes each chunk's logits again.
enum class FinalAct : int {
  LnfOut,   // (B, T, C)  ln_f.out
  LnfMean,  // (B, T)     ln_f.mean
  LnfRstd,  // (B, T)     ln_f.rstd
  Losses,   // (B, T)     lm_head.losses: per-token cross-entropy
  kCount
};

std::string_view act_suffix(EmbeddingAct k);
std::string_view act_suffix(BlockAct k);  // AttSaved: "attn.lse", the default kernel's
std::string_view act_suffix(FinalAct k);
// The same, AttSaved named for the config's attention kernel ("attn.softmax" when unfused).
std::string_view act_suffix(const GPTConfig& c, EmbeddingAct k);
std::string_view act_suffix(const GPTConfig& c, BlockAct k);
std::string_view act_suffix(const GPTConfig& c, FinalAct k);
Shape act_shape(const GPTConfig& c, EmbeddingAct k, int B, int T);
Shape act_shape(const GPTConfig& c, BlockAct k, int B, int T);
Shape act_shape(const GPTConfig& c, FinalAct k, int B, int T);

// The element type a buffer is saved in. f32, except with bf16 matmuls (config.matmul) the
// buffers that are only ever read as a matmul's input: ln_1.out (attn.c_attn's), attn.y
// (attn.c_proj's), ln_2.out (mlp.c_fc's), mlp.gelu.out (mlp.c_proj's) and ln_f.out (the LM
// head's) are saved rounded to bf16, half the bytes. Nothing is lost: every reader of them, the
// forward's product and the backward's dweight = x^T dout (and the head's recomputed logits and
// dwte), rounds them to bf16 first (layers.h, MatmulPrecision; the tensor-parallel epilogue's
// projection too), and LayerNorm's and GELU's backwards read their inputs and statistics, not
// these outputs. So a step's results are bitwise those of saving them in f32. The rest stays f32:
// what autocast keeps in f32 (the residual stream resid_1 and out, LayerNorm's statistics, the
// softmax, the losses) and the inputs of the f32 attention and GELU (attn.c_attn.out,
// mlp.c_fc.out), which rounding would change.
// With the fused attention kernel attn.y stays f32 too: its backward reads the output (the
// softmax backward's row term is dout . y), which rounding would change; that is B x T x C x 2
// bytes more a layer, against the B x NH x T x T x 4 the unfused kernel's softmax takes.
DType act_dtype(const GPTConfig& c, EmbeddingAct k);
DType act_dtype(const GPTConfig& c, BlockAct k);
DType act_dtype(const GPTConfig& c, FinalAct k);

template <typename Kind>
inline constexpr int kNumActs = static_cast<int>(Kind::kCount);

// One stage's saved buffers (views; copies share storage). A stage accepts any tensor of the
// buffer's act_dtype with the right element count in each slot, so a planner may bind 1-D slices
// of an arena; a bf16 slot may also be bound to an f32 tensor, which then keeps the unrounded
// values (the same results, as act_dtype says, for twice the bytes).
template <typename Kind>
struct Buffers {
  std::array<Tensor, static_cast<size_t>(Kind::kCount)> buf;

  Tensor& operator[](Kind k) { return buf[static_cast<size_t>(k)]; }
  const Tensor& operator[](Kind k) const { return buf[static_cast<size_t>(k)]; }
  // An f32 buffer's data.
  float* ptr(Kind k) const { return buf[static_cast<size_t>(k)].template data_as<float>(); }
  // f(float*) or f(bf16*), by the buffer's element type: for the buffers act_dtype may save in
  // bf16, whose kernels (layers.h) take either.
  template <typename F>
  decltype(auto) visit(Kind k, F&& f) const {
    const Tensor& t = buf[static_cast<size_t>(k)];
    if (t.dtype() == DType::BF16) return f(t.template data_as<bf16>());
    return f(t.template data_as<float>());
  }
};
using EmbeddingActivations = Buffers<EmbeddingAct>;
using BlockActivations = Buffers<BlockAct>;
using FinalActivations = Buffers<FinalAct>;

struct ActivationSpec {
  std::string name;
  Shape shape;
  DType dtype = DType::F32;
  size_t bytes() const { return static_cast<size_t>(shape.numel()) * dtype_size(dtype); }
};

// The buffers a block saves for its backward pass, in the order its forward writes them.
std::vector<ActivationSpec> block_activation_specs(const GPTConfig& c, int layer, int B, int T);
// Every saved buffer of the model: embedding, blocks, final.
std::vector<ActivationSpec> gpt_activation_specs(const GPTConfig& c, int B, int T);

// Allocates one stage's buffers from `alloc`.
EmbeddingActivations allocate_embedding_activations(const GPTConfig& c, int B, int T,
                                                    Allocator& alloc = host_allocator());
BlockActivations allocate_block_activations(const GPTConfig& c, int B, int T,
                                            Allocator& alloc = host_allocator());
FinalActivations allocate_final_activations(const GPTConfig& c, int B, int T,
                                            Allocator& alloc = host_allocator());

// All of a model's saved buffers, resident, for one (B, T): the in-core case.
class GPTActivations {
 public:
  GPTActivations(const GPTConfig& config, int B, int T, Allocator& alloc = host_allocator());

  const GPTConfig& config() const { return config_; }
  int batch() const { return B_; }
  int seq() const { return T_; }
  // The input of block `layer`: the embedding's output for block 0, else block layer-1's Out.
  // The final stage's input is block_input(n_layers).
  const float* block_input(int layer) const;
  // (full name, view) of every buffer, in forward order.
  std::vector<std::pair<std::string, Tensor>> named() const;

  EmbeddingActivations embedding;
  std::vector<BlockActivations> blocks;
  FinalActivations head;

 private:
  GPTConfig config_;
  int B_, T_;
};

// ---------------------------------------------------------------------------------------------
// Scratch shared by every stage; nothing in it survives from one stage to the next except the
// residual gradient that gpt_backward threads through the blocks. A workspace for (B, T) serves
// any batch of at most B sequences of at most T tokens.
// With config.matmul == BF16 it also holds the bf16 copies of the matmuls' operands (two buffers,
// see MatmulPrecision), sized for the largest layer of the model, the LM head included. Every
// buffer is an f32 tensor (the bf16 ones hold two values a float), so that whoever places the
// workspace counts its bytes as it counts the rest.
class Workspace {
 public:
  Workspace(const GPTConfig& config, int B, int T, Allocator& alloc = host_allocator());
  static std::vector<ActivationSpec> specs(const GPTConfig& config, int B, int T);
  // UserError unless this workspace fits a (B, T) batch of a model with config c (its matmul
  // type included).
  void check_fits(const GPTConfig& c, int B, int T) const;
  // How the layers multiply, with this workspace's bf16 scratch.
  MatmulPrecision matmul() const;
  // f32 scratch for rounding a row-parallel projection's weight to bf16 values (the tensor-
  // parallel epilogue, parallel/tensor_parallel.h): 4 * d_model * d_model floats; null in f32.
  float* rounded_weight() const;

  // (B, T, C), i in {0, 1}; in a forward btc(1) stages attention's output for a bf16 attn.y.
  float* btc(int i) const;
  // (B, T, 4C): d(qkv) in an attention half's backward, d(gelu.out) then (in place) d(c_fc.out)
  // in an MLP half's. One buffer serves both halves, so the workspace is small next to a half's
  // saved buffers (what bounds the smallest out-of-core budget).
  float* wide() const;
  // The attention kernel's scratch: flash_attention_scratch_floats(T, head size), or
  // attention_scratch_floats(T) for the unfused kernel.
  float* attention() const;
  // (lm_head_chunk_rows(B * T, V), V): one chunk of the head's logits, then in place their
  // gradient. The head's only buffer of V columns: it does not grow with the batch past a chunk.
  float* logits() const;
  float* dresidual() const;  // (B, T, C): d(loss)/d(residual stream) during gpt_backward
  // Llama: the rotary cos/sin of positions [0, T), made once here (empty for GPT-2).
  const RopeTable& rope() const { return rope_; }
  int batch() const { return B_; }
  int seq() const { return T_; }

 private:
  std::vector<Tensor> bufs_;
  RopeTable rope_;
  GPTConfig config_;
  int B_, T_;
};

// ---------------------------------------------------------------------------------------------
// Randomness of one step. Dropout is applied when training and config.dropout > 0.
struct StepRng {
  uint64_t seed = 0;
  uint64_t step = 0;
  // Index of this batch's first sequence in the global batch (data parallelism, micro-batches):
  // dropout masks are drawn by global index, so shards draw what one rank would.
  int64_t sample_offset = 0;
  bool training = true;
};

enum class DropoutSite : uint32_t {
  Embedding = 0,
  Attention = 1,
  AttnResidual = 2,
  MlpResidual = 3
};

// The RNG key of one dropout site at one step: Philox of (step, layer + 1, site) under `seed`.
// layer is -1 for the embedding.
uint64_t dropout_key(uint64_t seed, uint64_t step, int layer, DropoutSite site);
// The Dropout of a (B, T, C) site (embedding, residual): index offset sample_offset * T * C.
Dropout site_dropout(const GPTConfig& c, const StepRng& rng, int layer, DropoutSite site, int T);
// The AttentionDropout of block `layer` (all heads of the model).
AttentionDropout attention_dropout(const GPTConfig& c, const StepRng& rng, int layer);

// ---------------------------------------------------------------------------------------------
// Stages. Each runs one part of the model on explicit buffers; gpt_forward and gpt_backward are
// these in order. Gradients (dw, dx) are accumulated. B and T are the batch's; the Workspace must
// be for the same (B, T).

// embed.out (B, T, C) = dropout(wte[tokens] + wpe[t]); tokens (B, T) must be in [0, V).
void embedding_forward(const GPTConfig& c, const EmbeddingParams& w, const EmbeddingActivations& a,
                       const int32_t* tokens, int B, int T, const StepRng& rng);
// dw += backward for dout (B, T, C), the gradient of embed.out.
void embedding_backward(const GPTConfig& c, const EmbeddingParams& dw, const float* dout,
                        const int32_t* tokens, Workspace& ws, int B, int T, const StepRng& rng);

// Block `layer` on input x (B, T, C): writes every buffer of `a`, Out last.
void block_forward(const GPTConfig& c, int layer, const BlockParams& w, const BlockActivations& a,
                   const float* x, Workspace& ws, int B, int T, const StepRng& rng);
// dres (B, T, C): on entry d(loss)/d(a.Out), on return d(loss)/d(x). dw += the block's
// parameter gradients. Reads x and a's buffers; writes neither.
void block_backward(const GPTConfig& c, int layer, const BlockParams& w, const BlockParams& dw,
                    const BlockActivations& a, const float* x, float* dres, Workspace& ws, int B,
                    int T, const StepRng& rng);

// A block is two halves, each of which an out-of-core memory may place, swap or recompute on
// its own (block_forward is the attention half then the MLP half; block_backward the reverse):
//   attention: x -> resid_1 = x + dropout(attn.c_proj(attention(attn.c_attn(ln_1(x)))))
//   MLP:       resid_1 -> out = resid_1 + dropout(mlp.c_proj(gelu(mlp.c_fc(ln_2(resid_1)))))
// A half reads and writes only its own buffers (half_saves), its input (x, or a[Resid1]) and its
// output (half_output); the other slots of `a` may be unbound.
enum class BlockHalf : int { Attention = 0, Mlp = 1 };
inline constexpr int kBlockHalves = 2;
std::string_view half_name(BlockHalf h);  // "attn", "mlp"
// The buffers a half's forward writes for its backward, besides its output.
std::vector<BlockAct> half_saves(BlockHalf h);
BlockAct half_output(BlockHalf h);  // Resid1, Out
void block_attention_forward(const GPTConfig& c, int layer, const BlockParams& w,
                             const BlockActivations& a, const float* x, Workspace& ws, int B, int T,
                             const StepRng& rng);
// Reads a[Resid1], writes the MLP's buffers and a[Out].
void block_mlp_forward(const GPTConfig& c, int layer, const BlockParams& w,
                       const BlockActivations& a, Workspace& ws, int B, int T, const StepRng& rng);
// dres: d(loss)/d(out) on entry, d(loss)/d(resid_1) on return.
void block_mlp_backward(const GPTConfig& c, int layer, const BlockParams& w, const BlockParams& dw,
                        const BlockActivations& a, float* dres, Workspace& ws, int B, int T,
                        const StepRng& rng);
// The attention between the projections, by c.attention's kernel, for a block or a tensor-
// parallel shard of it (NH, KVH its heads): out (B, T, NH*HS) (f32: a bf16 attn.y is staged) and
// a[AttSaved] from a[Qkv] (with scratch ws.attention()); and the backward, dqkv += ..., reading
// a[AttSaved] and, for the fused kernel, a[AttY].
void attention_core_forward(const GPTConfig& c, float* out, float* scratch,
                            const BlockActivations& a, int B, int T, int NH, int KVH, int HS,
                            const AttentionDropout& drop);
void attention_core_backward(const GPTConfig& c, float* dqkv, float* scratch, const float* dout,
                             const BlockActivations& a, int B, int T, int NH, int KVH, int HS,
                             const AttentionDropout& drop);
// dres: d(loss)/d(resid_1) on entry, d(loss)/d(x) on return.
void block_attention_backward(const GPTConfig& c, int layer, const BlockParams& w,
                              const BlockParams& dw, const BlockActivations& a, const float* x,
                              float* dres, Workspace& ws, int B, int T, const StepRng& rng);

// ln_f, the tied LM head and the loss on x (B, T, C), the head chunked over the tokens (layers.h,
// lm_head_loss_forward). Returns the mean loss over the B * T tokens, or NaN when targets is
// null (then only ln_f runs: final_probabilities gives the distributions of the rows wanted).
float final_forward(const GPTConfig& c, const FinalParams& w, const FinalActivations& a,
                    const float* x, const int32_t* targets, Workspace& ws, int B, int T);
// dw += and dx (B, T, C) += the gradients of dloss * (mean loss), each chunk's logits computed
// again from the saved ln_f output.
void final_backward(const GPTConfig& c, const FinalParams& w, const FinalParams& dw,
                    const FinalActivations& a, const float* x, const int32_t* targets, float dloss,
                    float* dx, Workspace& ws, int B, int T);
// After final_forward: probs (rows, V) = the next-token distributions (softmax of the head's
// logits) of the batch's rows first .. first + rows - 1 (row b * T + t), from the saved ln_f
// output, e.g. the last position's for sampling. The caller holds just the rows it asks for.
void final_probabilities(const GPTConfig& c, const FinalParams& w, const FinalActivations& a,
                         Workspace& ws, int B, int T, int first, int rows, float* probs);
// The same rows' logits (rows, V), before the softmax: what sampling at a temperature divides.
void final_logits(const GPTConfig& c, const FinalParams& w, const FinalActivations& a,
                  Workspace& ws, int B, int T, int first, int rows, float* logits);

// ---------------------------------------------------------------------------------------------
// The whole model.
struct Batch {
  const int32_t* tokens = nullptr;   // (B, T)
  const int32_t* targets = nullptr;  // (B, T); may be null for forward without a loss
  int B = 0;
  int T = 0;
};

enum class Pass { Forward, Backward };
enum class Stage { Embedding, Block, Final };
// Passed to the hook before (after == false) and after each stage. layer is the block's index
// (-1 for the embedding, n_layers for the final stage). The hook may rebind the buffers of the
// stage about to run (GPTActivations' members): they are read after the "before" call.
struct LayerEvent {
  Pass pass;
  Stage stage;
  int layer;
  bool after;
};
using LayerHook = std::function<void(const LayerEvent&)>;

// Checks the batch (sizes, tokens and targets in [0, V)), runs every stage, returns the mean loss
// (NaN without targets).
float gpt_forward(const ParameterSet& params, GPTActivations& acts, Workspace& ws,
                  const Batch& batch, const StepRng& rng, const LayerHook& hook = {});
// grads += d(dloss * mean loss)/d(params), from the buffers gpt_forward saved. dloss scales the
// loss, e.g. 1 / (number of micro-batches) under gradient accumulation.
void gpt_backward(const ParameterSet& params, const ParameterSet& grads, GPTActivations& acts,
                  Workspace& ws, const Batch& batch, const StepRng& rng, float dloss = 1.0f,
                  const LayerHook& hook = {});

}  // namespace tandem::nn
