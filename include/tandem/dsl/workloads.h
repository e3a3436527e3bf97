// The paper's four workloads as DSL programs, in one library-visible place so that the examples,
// the tests, the autotuner and the `tandem` command all build the same programs.
//
// The names a caller binds:
//   adam, lamb  symbol N; inputs g (the gradient, grad_dtype [N] Local: each rank its own),
//               w, m, v (f32 [N] Replicated: weights and first and second moments, updated in
//               place); scalars lr, beta1, beta2, eps, weight_decay, step (1 for the first step)
//               and grad_scale (1/ranks averages the summed gradient; also undoes loss scaling).
//   grad_reduce symbol N; input g (grad_dtype [N] Local); output g_sum (grad_dtype [N] Sliced(0):
//               this rank's part of the sum over the ranks).
//   adam_update, lamb_update  symbol N; inputs g_sum (grad_dtype [N] Sliced(0): grad_reduce's
//               output), w (f32 [N] Replicated), m, v (f32 [N] Sliced(0): this rank's part of the
//               moments), updated in place; scalars lr, beta1, beta2, eps, weight_decay, step,
//               grad_scale (as adam's) and clip (the gradient's clipping factor, 1 to leave it).
//   lamb_bucket, lamb_bucket_update  as lamb and lamb_update, with symbol S too: the number of
//               segments (tensors) the runner's Segments cut N into (ir.h).
//   megatron_layer  symbols B (tokens), K (input features), H (output features); inputs
//               x (wire [B, K] Sliced(1): this rank's columns), w (wire [K, H] Sliced(0): the
//               matching rows), bias (dtype [H] Replicated), residual (dtype [B, H] Replicated);
//               scalar seed (dropout's key); output out (dtype [B, H] Replicated). wire is dtype
//               unless given.
//   megatron_layer_no_bias  megatron_layer without the bias input (Llama's row-parallel
//               projections have none): out = dropout(AllReduce(x @ w)) + residual.
//   pipeline_stage  2 groups: group 0 runs megatron_layer on its ranks (same names) and sends
//               `out` to group 1, whose rank i receives it from rank i of group 0 as output h.
//   gather_weights  symbol N; input w (f32 [N] Sliced(0)), output w_all (f32 [N] Replicated).
//   kv_gather   symbol N; input kv (f32 [N] Sliced(0)), output kv_all (f32 [N] Replicated).
//   kv_grad_reduce  symbol N; input dkv (f32 [N] Local), output dkv_mine (f32 [N] Sliced(0)).
//   kv_ring     symbol N; input kv (f32 [N] Local), output kv_next (f32 [N] Local): Shift(kv).
//   grad_handoff  2 groups, symbol N: input d (f32 [N] Replicated, group 1) is sent to group 0
//               and received into input d_prev (f32 [N] Replicated, group 0), in place.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "tandem/dsl/ir.h"

namespace tandem::dsl::workloads {

// AdamW (Loshchilov & Hutter), data parallel:
//   g1 = grad_scale * f32(AllReduce(Sum, g))
//   m1 = beta1 m + (1 - beta1) g1,   v1 = beta2 v + (1 - beta2) g1^2
//   w1 = w - lr (m1 / (1 - beta1^step) / (sqrt(v1 / (1 - beta2^step)) + eps) + weight_decay w)
Program adam(DType grad_dtype = DType::BF16);

// LAMB (You et al.): Adam's direction r = mhat / (sqrt(vhat) + eps) + weight_decay w, scaled per
// tensor by the trust ratio ||w|| / ||r|| (1 where either norm is 0): w1 = w - lr * trust * r.
// ||w|| is taken over each rank's slice of w (scatter(w, 0)) and summed across the ranks, so no
// rank reads the whole w for it; on one rank count every schedule gives it bitwise.
Program lamb(DType grad_dtype = DType::BF16);
// LAMB over a bucket of tensors (CoCoNeT's scattered-tensor fusion): the same step with the
// trust ratio per segment of N (ir.h: segment_norm, segment_scale), so one program, with one
// all-reduce for every segment's ||w|| and one for every segment's ||r||, updates many tensors.
// Both norms differ from the per-tensor program's only in how the ranks' partial sums are cut
// and added (bitwise on one rank).
Program lamb_bucket(DType grad_dtype = DType::BF16);

// The data-parallel step in two halves, for global gradient-norm clipping: the norm of the
// whole model's gradient is needed before any update, so the reduction (grad_reduce:
// g_sum = ReduceScatter(Sum, g), this rank's slice, an output) runs for every part of the model
// first, then the update (adam_update, lamb_update: g1 = grad_scale * f32(g_sum), the formulas
// above on g_clipped = clip * g1 over this rank's slice, then w1 = AllGather of the new slices).
// With clip = 1 they compute bitwise what adam / lamb under "fused(RS-C-AG)+slice(m,v)" compute.
Program grad_reduce(DType grad_dtype = DType::BF16);
Program adam_update(DType grad_dtype = DType::BF16);
Program lamb_update(DType grad_dtype = DType::BF16);
Program lamb_bucket_update(DType grad_dtype = DType::BF16);  // lamb_update per segment
// The sum of the ranks' sums of squares: input squares (f32 [1] Local), output total (f32 [1]
// Replicated). Clipping's norm is sqrt(total).
Program grad_norm();

// The ranks' g summed into every rank's g, in place: update(g, AllReduce(Sum, g)), g f32 [N]
// Local. The trainer's gradient reductions outside the optimizer: the tensor-parallel backward's
// input gradient, the tied embedding's gradient between the first and the last stage.
// With a 16-bit `wire` the sum moves half the bytes: each rank's g is rounded to it, summed in it
// and widened back, update(g, cast(AllReduce(Sum, cast(g, wire)), f32)) (the tensor-parallel
// exchange in bf16 training, `tandem train --tp-dtype bf16`).
Program sum_in_place(DType wire = DType::F32);

// ZeRO-3's gather of a block's weights before its forward and backward (--shard weights): each
// rank's slice w (f32 [N] Sliced(0)) gathered into every rank's w_all (f32 [N] Replicated, an
// output): w_all = AllGather(w).
Program gather_weights();

// Context parallelism's two exchanges (--cp, parallel/context_parallel.h). Each rank of a
// context-parallel group holds some of a sequence's tokens; attention needs the keys and values
// of all of them. kv_gather: each rank's keys and values (its tokens' k and v, f32 [N]
// Sliced(0): rank r's piece the r-th) gathered into every rank's kv_all (f32 [N] Replicated, an
// output): kv_all = AllGather(kv). kv_grad_reduce: every rank's gradient of the whole sequence's
// keys and values (its own queries' share, dkv f32 [N] Local) summed, and each rank's piece kept
// by it: dkv_mine = ReduceScatter(Sum, dkv) (f32 [N] Sliced(0), an output). Neither has an
// AllReduce for a recipe to split or fuse: their schedules differ in loop fusion and the chunk
// size the autotuner times.
Program kv_gather();
Program kv_grad_reduce();
// Ring attention's exchange: each rank's block of keys and values (kv, f32 [N] Local) handed to
// the next rank of the group while the previous rank's arrives: kv_next = Shift(kv) (f32 [N]
// Local, an output). Run p - 1 times, every block visits every rank. Like the two above it has no
// AllReduce: its schedules differ in the chunk size the autotuner times.
Program kv_ring();

// The pipeline's backward hand-off: rank i of group 1 (a stage) sends the gradient of its input,
// d, to rank i of group 0 (the previous stage), where it lands in d_prev in place:
// update(d_prev, Recv(Send(d, 0))).
Program grad_handoff();

// Megatron's row-parallel layer: out = dropout(AllReduce(Sum, x @ w) + bias, p) + residual.
// x @ w is Partial: each rank multiplies its K-slice, and the AllReduce sums the parts.
// `wire` (dtype unless given) is the type of x, w, their product (accumulated in f32, stored in
// wire) and its AllReduce; where it differs from dtype the sum is cast to dtype before the bias,
// dropout and residual, which stay in dtype. Mixed precision's layer is megatron_layer(f32, p,
// bf16): bf16 operands as autocast's linear takes them, a bf16 product as it returns, summed in
// bf16 (half the bytes of f32 on the wire), the rest in f32 like autocast's residual stream.
// Bias::Without leaves the bias out (megatron_layer_no_bias, pipeline_stage_no_bias).
enum class Bias { With, Without };
Program megatron_layer(DType dtype = DType::F32, double dropout_p = 0.1,
                       std::optional<DType> wire = std::nullopt, Bias bias = Bias::With);

// Programs that exercise the code emitters' folds, not workloads (not in names(), which the
// tuner's and the tests' loops over the workloads take): folds, every fold over a contiguous f32
// vector (norm, Sum, Max, Min, Prod; by_name("folds") reaches it, for bench/cuda's check);
// strided_sums, whole-tensor sums of a matrix sliced by columns, so each rank's loop walks a box
// with a strided part.
Program folds();
Program strided_sums();

// The layer above on group 0, its output (dtype) handed to group 1 (pipeline parallelism).
Program pipeline_stage(DType dtype = DType::F32, double dropout_p = 0.1,
                       std::optional<DType> wire = std::nullopt, Bias bias = Bias::With);

// The workloads by name, for the command line and the autotuner.
std::vector<std::string_view> names();
// The named workload with its default dtypes (also the layers without their bias, and folds);
// an unknown name is a UserError listing names().
Program by_name(std::string_view name);

}  // namespace tandem::dsl::workloads
