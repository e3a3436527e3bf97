// GPT-2's layers as pairs of free functions, x_forward / x_backward, over raw f32 pointers with
// explicit sizes (llm.c's style), so that a tensor-parallel shard is only other sizes and pointers.
//
// Conventions every kernel here keeps:
// - Row-major, contiguous, shapes in the comment beside each argument: (B, T, C) and so on.
// - Every gradient output is ACCUMULATED: d<name> += ..., for parameters and inputs alike, so
//   gradients add up across micro-batches and across the two uses of a tied or residual tensor.
//   Callers zero what must start at zero.
// - Outputs never alias inputs unless the comment says that they may.
// - Linear weights are in GPT-2's Conv1D layout (in, out): out = inp @ weight + bias, so a
//   checkpoint's c_attn.weight of shape (C, 3C) is used as is, without a transpose.
// - Deterministic: the same call on the same inputs gives bitwise the same result, whatever the
//   addresses of the buffers, so a recomputed forward equals the first one.
// - Thread-count independent: the longer loops split over core/parallel.h's threads by rows,
//   elements or heads, each part writing its own outputs; sums over rows (dweight, dbias, dwte)
//   split by column blocks, each column still summed over rows in order. No bit depends on the
//   width, and no kernel needs scratch for partial sums.
// - Matmuls go through core/gemm.h, in the element type a MatmulPrecision names (f32 unless
//   given): the f32 path is exactly OpenBLAS's SGEMM; a bf16 product is oneDNN's (or OpenBLAS's
//   on widened operands), deterministic at a given thread count, whose kernels may order the
//   sums differently at another.
// - A matmul's input activation (the linear layers', the LM head's) may be given in bf16: the
//   values the forward saved rounded (gpt.h, act_dtype), which the bf16 matmul uses as they are
//   where it would otherwise round an f32 input to them (to_bf16, core/bf16.h): the same bits in,
//   the same result out. LayerNorm and GELU can write their output so rounded.
// Naive reference kernels for each of these, templated on the scalar type, are in reference.h.
#pragma once

#include <cstdint>
#include <vector>

#include "tandem/core/dtype.h"

namespace tandem::nn {

inline constexpr float kLayerNormEps = 1e-5f;

// ---------------------------------------------------------------------------------------------
// How the linear layers and the LM head multiply, as autocast does: f32, or bf16 operands with
// f32 accumulation and f32 output. Weights stay f32 (the master copy): their bf16 copy is scratch,
// made at each call, as is the bf16 copy of the activation or gradient operand. Everything else
// (bias, LayerNorm, softmax, GELU, the loss) is f32 either way.
// The scratch: `rows` holds the (N, .) operand (an f32 input, an output gradient, the logits'
// gradient), `other` the weight, then in a backward an f32 input for the weight's gradient (a
// bf16 input needs no copy). A call needs at most N * max(IC, OC) of rows and max(IC * OC,
// N * IC) of other (elements); too little is an InternalError. gpt.h's Workspace holds enough for
// every layer of its model, whichever type its buffers are bound in.
struct MatmulPrecision {
  DType type = DType::F32;  // F32 or BF16
  bf16* rows = nullptr;
  int64_t rows_size = 0;
  bf16* other = nullptr;
  int64_t other_size = 0;
};

// ---------------------------------------------------------------------------------------------
// Dropout. The keep decision for an element is dropout_keep(key, index, p) from core/rng.h, where
// `index` is the element's position in the full, unsharded tensor of the whole global batch; no
// mask is stored, the backward pass (and a recomputed forward) draws the same one again. Kept
// elements are multiplied by scale() = 1 / (1 - p) (a multiply, not a divide, so that every
// implementation rounds alike).
struct Dropout {
  float p = 0.0f;            // probability of dropping; 0 makes dropout the identity
  uint64_t key = 0;          // per step and site, see dropout_key in gpt.h
  int64_t index_offset = 0;  // global index of this buffer's element 0 (sample offset * T * C)

  bool active() const { return p > 0.0f; }
  float scale() const { return 1.0f / (1.0f - p); }
};

// out (n) = inp (n) * mask * scale. out may equal inp.
void dropout_forward(float* out, const float* inp, int64_t n, const Dropout& d);
// dinp (n) += dout (n) * mask * scale.
void dropout_backward(float* dinp, const float* dout, int64_t n, const Dropout& d);
// mask (n) = keep ? scale : 0 for elements index_offset .. index_offset + n - 1 (bitwise the same
// as calling dropout_keep per element; vectorised over Philox blocks).
void dropout_mask(float* mask, int64_t n, const Dropout& d);

// ---------------------------------------------------------------------------------------------
// Encoder: token plus learned position embedding.
// out (B, T, C) = wte[inp[b, t]] (V, C) + wpe[t] (maxT, C). Tokens must be in [0, V): the model
// checks them once, the kernel does not. A null wpe (and dwpe) adds no positions (Llama).
void encoder_forward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                     int T, int C);
// dwte (V, C) += scatter of dout by token; dwpe (maxT, C) += dout summed over the batch.
void encoder_backward(float* dwte, float* dwpe, const float* dout, const int32_t* inp, int B, int T,
                      int C);

// ---------------------------------------------------------------------------------------------
// LayerNorm over the last dimension, eps kLayerNormEps; mean and rstd are saved for backward.
// out (N, C), mean (N), rstd (N) from inp (N, C), weight (C), bias (C).
void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
// The same with out rounded to bf16: bitwise to_bf16 of the f32 kernel's out (mean and rstd f32).
void layernorm_forward(bf16* out, float* mean, float* rstd, const float* inp, const float* weight,
                       const float* bias, int N, int C);
// dinp (N, C), dweight (C), dbias (C) += ...
void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, const float* mean, const float* rstd,
                        int N, int C);

// ---------------------------------------------------------------------------------------------
// Linear with optional bias, through core/gemm.h. For Megatron-style tensor parallelism a
// column-parallel shard is (IC, OC / tp) with its (OC / tp) bias; a row-parallel shard is
// (IC / tp, OC) fed with the (N, IC / tp) input shard and called with bias == nullptr, the bias
// being added once after the AllReduce.
// out (N, OC) = inp (N, IC) @ weight (IC, OC) + bias (OC); bias may be null.
void linear_forward(float* out, const float* inp, const float* weight, const float* bias, int N,
                    int IC, int OC, const MatmulPrecision& mm = {});
// dinp (N, IC) += dout @ weight^T; dweight (IC, OC) += inp^T @ dout; dbias (OC) += sum of dout
// rows. dinp and dbias may be null (not wanted).
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                     const float* weight, int N, int IC, int OC, const MatmulPrecision& mm = {});
// The same two with inp in bf16 (mm must be bf16): bitwise the f32-input calls on the f32 values
// inp was rounded from, with no conversion of inp (and no `other` scratch for it).
void linear_forward(float* out, const bf16* inp, const float* weight, const float* bias, int N,
                    int IC, int OC, const MatmulPrecision& mm);
void linear_backward(float* dinp, float* dweight, float* dbias, const float* dout, const bf16* inp,
                     const float* weight, int N, int IC, int OC, const MatmulPrecision& mm);

// ---------------------------------------------------------------------------------------------
// Causal self-attention over NH heads of size HS (C_local = NH * HS), the input being the fused
// QKV projection laid out as GPT-2's c_attn writes it: qkv[b, t] = [q (NH*HS) | k | v]. Under
// tensor parallelism NH is the rank's own heads and qkv its column shard in the same layout.
// Per head: att = softmax(q k^T / sqrt(HS), causal), att is saved, y = dropout(att) @ v.
struct AttentionDropout {
  float p = 0.0f;
  uint64_t key = 0;
  // Global position of this call's (b = 0, h = 0) among all samples and heads: element
  // (b, h, i, j) draws index ((sample_offset + b) * n_heads_total + head_offset + h) * T * T +
  // i * T + j, so a head shard and a batch shard draw the mask the whole model would.
  int64_t sample_offset = 0;
  int head_offset = 0;
  int n_heads_total = 0;  // 0: NH (no head sharding)

  bool active() const { return p > 0.0f; }
  // The index of element (b, h, 0, 0) of a call over NH heads of T tokens.
  int64_t head_base(int b, int h, int NH, int T) const {
    const int64_t heads = n_heads_total > 0 ? n_heads_total : NH;
    return ((sample_offset + b) * heads + head_offset + h) * static_cast<int64_t>(T) * T;
  }
};

// Heads run in parallel (core/parallel.h), each thread with its own scratch: at most this many
// threads (the machine's hardware threads, capped at 8).
int attention_max_threads();
// Floats of scratch attention_forward and attention_backward need: 2 * T * T per thread.
int64_t attention_scratch_floats(int T);

// Grouped-query attention (Llama): KVH key/value heads, each shared by NH / KVH consecutive query
// heads (KVH = NH: GPT-2's multi-head attention; KVH = 1: multi-query), the row being
// [q (NH*HS) | k (KVH*HS) | v (KVH*HS)].
// out (B, T, NH*HS), att (B, NH, T, T) (softmax; zero above the diagonal), from qkv
// (B, T, (NH + 2*KVH)*HS). scratch: attention_scratch_floats(T).
void attention_forward(float* out, float* att, float* scratch, const float* qkv, int B, int T,
                       int NH, int KVH, int HS, const AttentionDropout& drop);
// dqkv (B, T, (NH + 2*KVH)*HS) += ... from dout (B, T, NH*HS), qkv and the saved att.
void attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                        const float* att, int B, int T, int NH, int KVH, int HS,
                        const AttentionDropout& drop);

// The same attention fused and blocked ("flash" style), saving B x NH x T floats instead of
// B x NH x T x T: each block of `rows` queries meets the key/value blocks of `cols` keys up to
// its diagonal (those above it are skipped) with an online softmax (a running maximum and sum
// per row), writes its output rows once and saves each row's log-sum-exp; the backward
// recomputes the probabilities block by block from q, k and that lse. Dropout draws the mask
// above at the same indices, so both kernels drop the same elements; the results agree with
// attention_forward/backward to f32 rounding (the sums run in another order), not bitwise.
// Threads: the forward's tasks are (sample, head, query block), the backward's (sample,
// key/value head), handed to the free thread; every task writes its own memory, so the result
// is bitwise the same at any thread count. The block products go through core/gemm.h.
// The block sizes: 128 x 128, measured on the benchmark machine (docs/benchmarks.md,
// "Attention": 64 to 256 a side within noise at T = 1024, the larger ones ahead at 2048; a
// thread's three 128 x 128 tiles, 192 KiB, stay in a 1 MiB L2); smaller ones are for the tests,
// which run the multi-block paths on small T.
struct FlashBlocks {
  int rows = 128;  // queries a block
  int cols = 128;  // keys a block
};
// The block products' operands (`products`): F32, or BF16 as autocast runs attention's matmuls:
// q, k, v, dout, the probabilities and the scores' gradients rounded to bf16 block by block
// (per-tile scratch), each product accumulated in f32 through core/gemm.h (oneDNN where the CPU
// has AVX512_BF16, else widened for OpenBLAS); the online softmax, its statistics (the running
// maximum and sum, the saved log-sum-exp), the backward's row term dout . out, dropout and every
// sum across blocks stay f32. Against F32 the results differ by bf16's rounding of the operands;
// at a given path and thread count they are as deterministic. The model runs F32 (GPTConfig's
// matmul covers the linear layers only; docs/training.md#precision says why).
// Floats of scratch flash_attention_forward and _backward need: about T + 3 * rows * cols per
// thread (the blocks clipped to T a side), with bf16 products (rows + cols) * HS + rows * cols
// more (their bf16 tiles), attention_max_threads() threads.
int64_t flash_attention_scratch_floats(int T, int HS, const FlashBlocks& blocks = {},
                                       DType products = DType::F32);
// out (B, T, NH*HS), lse (B, NH, T) (log sum_j exp(score_ij), the softmax's normaliser) from qkv
// (B, T, (NH + 2*KVH)*HS), laid out as attention_forward's.
void flash_attention_forward(float* out, float* lse, float* scratch, const float* qkv, int B, int T,
                             int NH, int KVH, int HS, const AttentionDropout& drop,
                             const FlashBlocks& blocks = {}, DType products = DType::F32);
// dqkv (B, T, (NH + 2*KVH)*HS) += ... from dout (B, T, NH*HS), qkv, and the forward's out and lse
// (out in f32: the backward's row term is dout . out).
void flash_attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                              const float* out, const float* lse, int B, int T, int NH, int KVH,
                              int HS, const AttentionDropout& drop, const FlashBlocks& blocks = {},
                              DType products = DType::F32);

// The same kernel for some of a sequence's query rows against all of its keys (context
// parallelism: a rank's own tokens against the keys and values gathered from every rank). Query
// row r sits at position pos[r] of the Tk-token sequence and sees keys 0 .. pos[r]; key blocks
// past a query block's last position are skipped. Dropout draws the element (b, h, pos[r], j) of
// the whole sequence's mask, so a split sequence drops what the whole one does; with pos[r] = r
// and Tq = Tk the calls compute what the calls above do, bit for bit.
// A call may read a range of the keys only (key_first, key_count: context parallelism computes
// against the keys a rank holds while the others' are still on their way): it is then attention
// over those keys alone, each output row normalised over the keys of the range it sees and its lse
// theirs (a row that sees none: out 0, lse -inf). Forward calls over disjoint ranges that cover
// the keys, merged by flash_attention_merge, give the whole call's out and lse (to f32 rounding);
// backward calls over them, each given the whole out and lse, add up to the whole call's gradient.
struct AttentionRows {
  int Tq = 0;                // query rows a sample
  int Tk = 0;                // keys a sample: the whole sequence
  const int* pos = nullptr;  // (Tq) each query row's position, strictly ascending, below Tk
  int key_first = 0;         // the first key the call reads
  int key_count = -1;        // how many (-1: to Tk)
  // Where kv (and dkv) hold their rows: kv_rows a sample, row 0 at position kv_first, which must
  // cover the keys read (context parallelism's ring: one rank's chunk inside its piece of the
  // sequence, B x its rows). -1: the whole sequence, Tk rows a sample from position 0.
  int kv_rows = -1;
  int kv_first = 0;
};
// Floats of scratch the two calls below need (as above, with Tq and Tk in place of T).
int64_t flash_attention_scratch_floats(const AttentionRows& rows, int HS,
                                       const FlashBlocks& blocks = {}, DType products = DType::F32);
// out (B, Tq, NH*HS), lse (B, NH, Tq) from the queries of qkv (B, Tq, (NH + 2*KVH)*HS) (its k
// and v columns are not read) and kv (B, Tk, 2*KVH*HS), each row [k (KVH*HS) | v (KVH*HS)].
void flash_attention_forward(float* out, float* lse, float* scratch, const float* qkv,
                             const float* kv, const AttentionRows& rows, int B, int NH, int KVH,
                             int HS, const AttentionDropout& drop, const FlashBlocks& blocks = {},
                             DType products = DType::F32);
// The queries' gradient into dqkv's q columns (B, Tq, (NH + 2*KVH)*HS) += (its k and v columns
// untouched), the keys' and values' into dkv (B, Tk, 2*KVH*HS) +=.
void flash_attention_backward(float* dqkv, float* dkv, float* scratch, const float* dout,
                              const float* qkv, const float* kv, const float* out, const float* lse,
                              const AttentionRows& rows, int B, int NH, int KVH, int HS,
                              const AttentionDropout& drop, const FlashBlocks& blocks = {},
                              DType products = DType::F32);
// out (B, Tq, NH*HS), lse (B, NH, Tq) <- the attention over two disjoint sets of keys from each
// set's (out, lse) and (out2, lse2): lse = log(e^lse + e^lse2), out = out e^(lse_old - lse) +
// out2 e^(lse2 - lse) (the online softmax's rescaling, once a row); an lse of -inf contributes
// nothing.
void flash_attention_merge(float* out, float* lse, const float* out2, const float* lse2, int B,
                           int Tq, int NH, int HS);

// ---------------------------------------------------------------------------------------------
// GELU, GPT-2's tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// out (n) = gelu(inp (n)).
void gelu_forward(float* out, const float* inp, int64_t n);
// The same with out rounded to bf16: bitwise to_bf16 of the f32 kernel's out.
void gelu_forward(bf16* out, const float* inp, int64_t n);
// dinp (n) += gelu'(inp) * dout.
void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n);
// d (n) = gelu'(inp) * d: the backward in place, so a block's MLP needs one (B, T, 4C) gradient
// buffer, not two. Equal to zeroing a separate dinp and calling gelu_backward, but for the sign
// of zero products (-0 here, +0 there).
void gelu_backward_inplace(float* d, const float* inp, int64_t n);

// A kernel with only an f32 output (attention) writing a buffer saved in f32 or bf16 (a matmul's
// input, gpt.h's act_dtype): it writes to staged_output(out, staging), out itself or, for a bf16
// out, the f32 staging; then store_staged(out, staging, n) rounds the n staged values into a bf16
// out (to_bf16, split over threads) and does nothing for an f32 one.
inline float* staged_output(float* out, float*) { return out; }
inline float* staged_output(bf16*, float* staging) { return staging; }
inline void store_staged(float*, const float*, int64_t) {}
void store_staged(bf16* out, const float* staging, int64_t n);

// ---------------------------------------------------------------------------------------------
// Residual add. out (n) = inp1 (n) + inp2 (n); out may equal inp1 or inp2.
void residual_forward(float* out, const float* inp1, const float* inp2, int64_t n);
// dinp1 (n) += dout; dinp2 (n) += dout.
void residual_backward(float* dinp1, float* dinp2, const float* dout, int64_t n);

// ---------------------------------------------------------------------------------------------
// LM head tied to the token embedding: logits (N, V) = inp (N, C) @ wte^T, wte (V, C).
// Scratch (MatmulPrecision): rows N * C, other V * C forward; rows N * V, other max(V, N) * C
// backward.
void lm_head_forward(float* logits, const float* inp, const float* wte, int N, int C, int V,
                     const MatmulPrecision& mm = {});
// dinp (N, C) += dlogits @ wte; dwte (V, C) += dlogits^T @ inp.
void lm_head_backward(float* dinp, float* dwte, const float* dlogits, const float* inp,
                      const float* wte, int N, int C, int V, const MatmulPrecision& mm = {});
// The forward with inp in bf16 (mm must be bf16): bitwise the f32-input call on the values inp
// was rounded from.
void lm_head_forward(float* logits, const bf16* inp, const float* wte, int N, int C, int V,
                     const MatmulPrecision& mm);

// Softmax cross-entropy, fused: probs (N, V) = softmax(logits (N, V)) per row, losses (N) =
// -log probs[target]. probs may equal logits (in place). targets may be null: probs only.
void crossentropy_forward(float* losses, float* probs, const float* logits, const int32_t* targets,
                          int N, int V);
// dlogits (N, V) += (probs - onehot(target)) * dloss, dloss being d(total loss)/d(losses[n]),
// 1 / N for a mean over N tokens.
void crossentropy_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss,
                           int N, int V);
// The same two in place on logits (N, V), which are scratch: losses (N) as crossentropy_forward
// writes them (bit for bit; the logits are left overwritten), and logits := dlogits =
// (softmax - onehot(target)) * dloss, the softmax crossentropy_forward's bit for bit.
void crossentropy_loss_inplace(float* losses, float* logits, const int32_t* targets, int N, int V);
void crossentropy_backward_inplace(float* logits, const int32_t* targets, float dloss, int N,
                                   int V);

// ---------------------------------------------------------------------------------------------
// The LM head and the loss fused over chunks of rows (tokens), so that no more than one chunk's
// logits exist at once: at 50 257 words and 8 x 1024 tokens the whole (N, V) logits would be
// 1.6 GB, and their gradient as much again. The forward keeps only the per-token losses; the
// backward computes each chunk's logits again (one more head matmul a step, 2 N V C flops: a
// third more than the head's 6 N V C) and turns them into dlogits in place.
// A chunk holds as many rows as keep its logits within kLmHeadChunkBytes (166 rows at
// V = 50 257), at least 1, at most N: products of that many rows still run at GEMM speed. Per
// row, a chunk computes what the unchunked head does (one chunk of all N rows is it bit for
// bit); dwte adds the chunks up one after another.
inline constexpr int64_t kLmHeadChunkBytes = int64_t{32} << 20;
int lm_head_chunk_rows(int N, int V);
// losses (N) = -log softmax(inp (N, C) @ wte^T)[target], chunk rows at a time; logits is
// (chunk, V) scratch. In bf16 the scratch is rows chunk * (C + V), other V * C (wte's copy,
// made once a call).
void lm_head_loss_forward(float* losses, float* logits, const float* inp, const float* wte,
                          const int32_t* targets, int N, int C, int V, int chunk,
                          const MatmulPrecision& mm = {});
// The gradients of sum over n of dloss * losses[n]: dinp (N, C) += and dwte (V, C) +=. dinp may
// be null. Same scratch as the forward.
void lm_head_loss_backward(float* dinp, float* dwte, float* logits, const float* inp,
                           const float* wte, const int32_t* targets, float dloss, int N, int C,
                           int V, int chunk, const MatmulPrecision& mm = {});
// The same two with inp in bf16 (mm must be bf16): bitwise the f32-input calls on the values inp
// was rounded from; the chunks' rows are used where they are, not converted.
void lm_head_loss_forward(float* losses, float* logits, const bf16* inp, const float* wte,
                          const int32_t* targets, int N, int C, int V, int chunk,
                          const MatmulPrecision& mm);
void lm_head_loss_backward(float* dinp, float* dwte, float* logits, const bf16* inp,
                           const float* wte, const int32_t* targets, float dloss, int N, int C,
                           int V, int chunk, const MatmulPrecision& mm);

// =============================================================================================
// Llama-family layers: RMSNorm, rotary position embeddings (RoPE) and SwiGLU, with the same
// conventions as above (f32, accumulated gradients but for RoPE's in-place backward,
// deterministic at any thread count). Their naive references are in
// tests/nn/unit/llama_layers_test.cc.

// ---------------------------------------------------------------------------------------------
// RMSNorm over the last dimension: out = inp * rstd * weight, rstd = 1 / sqrt(mean(inp^2) + eps)
// per row, in f32 whatever the output type; rstd is saved for backward. eps is the model's
// rms_norm_eps (1e-5 in Llama 2 and 3).
// out (N, C), rstd (N) from inp (N, C), weight (C).
void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps);
// The same with out rounded to bf16: bitwise to_bf16 of the f32 kernel's out (rstd f32).
void rmsnorm_forward(bf16* out, float* rstd, const float* inp, const float* weight, int N, int C,
                     float eps);
// dinp (N, C), dweight (C) += ... from dout (N, C) and the saved rstd (N).
void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                      const float* weight, const float* rstd, int N, int C);

// ---------------------------------------------------------------------------------------------
// Rotary position embeddings in Hugging Face's rotate_half layout: a head of HS values is two
// halves, and for i < HS / 2 the pair (x[i], x[i + HS/2]) at position p is rotated by the angle
// p * inv_freq[i]:  x[i] := x[i] cos - x[i + HS/2] sin,  x[i + HS/2] := x[i + HS/2] cos + x[i] sin.
// inv_freq[i] = theta^(-2i / HS), optionally rescaled (RopeScaling). The angle is the f32 product
// of the position and inv_freq, as Hugging Face's and Meta's code compute it, so that rotations at
// long positions match theirs; its cos and sin are tabulated once (RopeTable).
enum class RopeType { Default, Llama3 };

// rope_scaling of a Hugging Face config; the fields below are read for Llama3 only (Llama 3.1's
// "llama3" rope_type, named as in that config).
struct RopeScaling {
  RopeType type = RopeType::Default;
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  bool operator==(const RopeScaling&) const = default;
};

// inv_freq (HS / 2) = theta^(-2i / HS), and for Llama3 with wavelen = 2 pi / inv_freq,
// low = original / low_freq_factor and high = original / high_freq_factor (wavelengths):
// inv_freq / factor where wavelen > low, unchanged where wavelen < high, and in between
// (1 - s) inv_freq / factor + s inv_freq with s = (original / wavelen - low_freq_factor) /
// (high_freq_factor - low_freq_factor). A UserError for an odd HS, theta <= 0 or bad scaling.
std::vector<float> rope_inv_freq(int HS, double theta, const RopeScaling& scaling = {});

// cos and sin of the angle p * inv_freq[i] for positions p in [0, positions): made once (at set-up)
// and read by every rope_forward / rope_backward call.
struct RopeTable {
  int head_size = 0;            // HS = 2 * inv_freq's size
  int positions = 0;            // rows of the tables
  std::vector<float> cos, sin;  // (positions, HS / 2)
};
RopeTable rope_table(const std::vector<float>& inv_freq, int positions);

// x: B * T rows of NH heads of HS values, row (b, t) at x + (b * T + t) * stride (stride >= NH *
// HS, so that x may be the q or the k part of a fused qkv buffer), at position pos0 + t (pos0: the
// first position of this slice of the sequence). Rotated in place; pos0 + T <= rope.positions.
// x (B, T, NH, HS) strided.
void rope_forward(float* x, const RopeTable& rope, int B, int T, int NH, int HS, int64_t stride,
                  int pos0);
// dx := the inverse rotation of dx, in place (the same layout as rope_forward's x): the gradient
// of the rotated values becomes that of the values before rotation. Not accumulated, as the
// forward overwrites its input.
void rope_backward(float* dx, const RopeTable& rope, int B, int T, int NH, int HS, int64_t stride,
                   int pos0);

// ---------------------------------------------------------------------------------------------
// SwiGLU, the gated MLP activation: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)).
// out (n) from gate (n) and up (n) (n = N * F, the two projections' outputs).
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
// The same with out rounded to bf16: bitwise to_bf16 of the f32 kernel's out.
void swiglu_forward(bf16* out, const float* gate, const float* up, int64_t n);
// dgate (n) += dout * up * silu'(gate); dup (n) += dout * silu(gate).
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n);
// The same on the rows of a fused gate|up projection, fc (N, 2F) = [gate (F) | up (F)] a row (the
// Llama MLP's c_fc output): out (N, F) = silu(gate) * up, in f32 or rounded to bf16.
void swiglu_rows_forward(float* out, const float* fc, int64_t N, int F);
void swiglu_rows_forward(bf16* out, const float* fc, int64_t N, int F);
// dfc (N, 2F) += d(gate) | d(up) from dout (N, F).
void swiglu_rows_backward(float* dfc, const float* dout, const float* fc, int64_t N, int F);

}  // namespace tandem::nn
