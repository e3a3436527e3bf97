// The four workload programs, written with the builder exactly as a user would.
#include "tandem/dsl/workloads.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <utility>

#include "tandem/core/error.h"
#include "tandem/dsl/builder.h"

namespace tandem::dsl::workloads {
namespace {

Expr named_stage(Program& p, std::string_view name) { return Expr(&p, *p.find(name)); }

// The Adam direction from the averaged gradient g1, shared by every optimizer program below:
// leaves m and v updated and returns r = mhat / (sqrt(vhat) + eps) + weight_decay * w.
Expr adam_direction(Program& p, const Expr& g1, const Expr& w, const Expr& m, const Expr& v) {
  const Expr beta1 = named_stage(p, "beta1"), beta2 = named_stage(p, "beta2"),
             eps = named_stage(p, "eps");
  const Expr weight_decay = named_stage(p, "weight_decay"), step = named_stage(p, "step");
  // C++ does not order the evaluation of an operator's two operands, so each line below has at
  // most one compound operand: the stages then come out in the same order on every compiler.
  const Expr m_decayed = beta1 * m;
  const Expr m1 = update(m, m_decayed + (1 - beta1) * g1).named("m1");  // beta1 m + (1 - beta1) g1
  const Expr v_decayed = beta2 * v;
  const Expr v1 =
      update(v, v_decayed + (1 - beta2) * g1 * g1).named("v1");  // beta2 v + (1 - beta2) g1^2
  // Bias correction: scalars, computed once per step on every rank.
  const Expr bc1 = (1 - pow(beta1, step)).named("bc1");
  const Expr bc2 = (1 - pow(beta2, step)).named("bc2");
  const Expr mhat = (m1 / bc1).named("mhat");
  const Expr vhat = (v1 / bc2).named("vhat");
  const Expr decay = weight_decay * w;  // decoupled weight decay (AdamW), from the old weights
  return (mhat / (sqrt(vhat) + eps) + decay).named("r");
}

// The hyper-parameters of Adam's direction, declared in one order.
void adam_scalars(Program& p) {
  for (const char* name : {"beta1", "beta2", "eps", "weight_decay", "step"}) p.scalar(name);
}

// The gradient summed over the ranks in its own dtype (half the bytes on the wire for
// bf16/f16), then widened to f32 and scaled (1/ranks averages it), as mixed-precision training
// does. `summed` is the collective's result.
Expr averaged(const Expr& grad_scale, const Expr& summed, DType grad_dtype) {
  const Expr wide = grad_dtype == F32 ? summed : cast(summed, F32);
  return (grad_scale * wide).named("g1");
}

// Adam's direction for the whole-step programs (adam, lamb): g Local, w, m, v Replicated.
Expr adam_step_direction(Program& p, DType grad_dtype) {
  adam_scalars(p);
  const Expr grad_scale = p.scalar("grad_scale");
  const Expr g = p.input(grad_dtype, {"N"}, Local, "g");  // each rank's own gradient
  const Expr w = p.input(F32, {"N"}, Replicated, "w");    // the same on every rank
  const Expr m = p.input(F32, {"N"}, Replicated, "m");
  const Expr v = p.input(F32, {"N"}, Replicated, "v");
  const Expr g1 = averaged(grad_scale, AllReduce(Sum, g).named("g_sum"), grad_dtype);
  return adam_direction(p, g1, w, m, v);
}

// The second half of a clipped step (adam_update, lamb_update): g_sum grad_dtype Sliced(0)
// (grad_reduce's output), w Replicated, m, v Sliced(0), the clipping factor `clip`. Averages and
// clips the gradient as the one-program step averages it, and returns this rank's slice of w
// (read in place, no copy) and the direction on it.
std::pair<Expr, Expr> clipped_direction(Program& p, DType grad_dtype) {
  adam_scalars(p);
  const Expr grad_scale = p.scalar("grad_scale");
  const Expr clip = p.scalar("clip");
  const Expr g_sum = p.input(grad_dtype, {"N"}, Sliced(0), "g_sum");  // this rank's part of the sum
  const Expr w = p.input(F32, {"N"}, Replicated, "w");
  const Expr m = p.input(F32, {"N"}, Sliced(0), "m");
  const Expr v = p.input(F32, {"N"}, Sliced(0), "v");
  // Everything below reads w only at this rank's slice: the decay too, which would otherwise be
  // a Replicated value computed over all of w.
  const Expr w_mine = scatter(w, 0).named("w_mine");
  const Expr g1 = averaged(grad_scale, g_sum, grad_dtype);
  return {w_mine, adam_direction(p, (clip * g1).named("g_clipped"), w_mine, m, v)};
}

// LAMB's step from the direction: w1 = w - lr * trust * r, trust = ||w|| / ||r|| (1 where either
// norm is 0). Returns w - lr * trust * r, on `w_part` (w, or this rank's slice of it). ||w|| is
// taken over this rank's slice `w_mine` (scatter(w, 0)), as ||r|| is under a sliced r: a local
// sum of squares of N/p elements and a cross-rank sum, so no rank reads the whole w for it. Every
// schedule of one program computes ||w|| as the reference interpreter does, bitwise, on the same
// rank count; from one rank count to another the cross-rank sum of f32 partials changes its low
// bits, as it changes ||r||'s.
// `segmented`: per segment of w (a bucket of tensors, ir.h): the norms are segment norms (one
// all-reduce of the S partials for each), trust is f32[S], and each element is scaled by its
// segment's lr * trust (the same f32 operations per element as one tensor's step).
Expr lamb_step(const Expr& lr, const Expr& w_mine, const Expr& w_part, const Expr& r,
               bool segmented) {
  const Expr w_norm = (segmented ? segment_norm(w_mine) : norm(w_mine)).named("w_norm");
  const Expr r_norm = (segmented ? segment_norm(r) : norm(r)).named("r_norm");
  const Expr ratio = w_norm / r_norm;
  const Expr r_positive = r_norm > 0;
  const Expr w_positive = w_norm > 0;
  const Expr trust = select(w_positive, select(r_positive, ratio, 1.0), 1.0).named("trust");
  const Expr factor = lr * trust;
  return w_part - (segmented ? segment_scale(factor, r) : factor * r);
}

// The row-parallel layer on `group`; returns its output. x, w, their product and its sum are
// `wire`; bias, residual and everything after the sum are `dtype` (the sum cast to it where the
// two differ). The product is computed in f32 and rounded to wire when stored (ir.h, Types).
Expr megatron_body(Program& p, DType dtype, double dropout_p, int group, DType wire, Bias bias) {
  const Expr x = p.input(wire, {"B", "K"}, Sliced(1), "x", group);  // this rank's columns of x
  const Expr w = p.input(wire, {"K", "H"}, Sliced(0), "w", group);  // the matching rows of w
  const std::optional<Expr> b =
      bias == Bias::With ? std::optional(p.input(dtype, {"H"}, Replicated, "bias", group))
                         : std::nullopt;
  const Expr residual = p.input(dtype, {"B", "H"}, Replicated, "residual", group);
  const Expr seed = p.scalar("seed");

  const Expr y = matmul(x, w).named("y");       // Partial: each rank's product of its K-slice
  const Expr z = AllReduce(Sum, y).named("z");  // the full product, on every rank
  const Expr sum = wire == dtype ? z : cast(z, dtype).named("z_cast");
  const Expr a = b ? (sum + *b).named("a") : sum;  // bias [H] broadcasts over the B rows
  const Expr d = dropout(a, dropout_p, seed).named("d");
  return (d + residual).named("out");
}

}  // namespace

Program adam(DType grad_dtype) {
  Program p("adam");
  const Expr lr = p.scalar("lr");
  const Expr r = adam_step_direction(p, grad_dtype);
  const Expr w = named_stage(p, "w");
  update(w, w - lr * r).named("w1");
  return p;
}

namespace {

// lamb, or lamb_bucket: the one-program step, per tensor or per segment.
Program lamb_program(const char* name, DType grad_dtype, bool segmented) {
  Program p(name);
  const Expr lr = p.scalar("lr");
  const Expr r = adam_step_direction(p, grad_dtype);
  const Expr w = named_stage(p, "w");
  const Expr w_mine = scatter(w, 0).named("w_mine");  // ||w|| from this rank's slice only
  update(w, lamb_step(lr, w_mine, w, r, segmented)).named("w1");
  return p;
}

}  // namespace

Program lamb(DType grad_dtype) { return lamb_program("lamb", grad_dtype, false); }

Program lamb_bucket(DType grad_dtype) { return lamb_program("lamb_bucket", grad_dtype, true); }

Program grad_reduce(DType grad_dtype) {
  Program p("grad_reduce");
  const Expr g = p.input(grad_dtype, {"N"}, Local, "g");
  p.output(ReduceScatter(Sum, g).named("g_sum"), "g_sum");
  return p;
}

namespace {

// adam_update or lamb_update: the clipped direction on this rank's slice, the slice's new
// weights (Adam's step, or LAMB's with its trust ratio, per segment when `segmented`), gathered
// into w in place.
Program clipped_update(const char* name, DType grad_dtype, bool lamb, bool segmented = false) {
  Program p(name);
  const Expr lr = p.scalar("lr");
  const auto [w_mine, r] = clipped_direction(p, grad_dtype);
  const Expr w = named_stage(p, "w");
  const Expr w_slice =
      (lamb ? lamb_step(lr, w_mine, w_mine, r, segmented) : w_mine - lr * r).named("w_slice");
  update(w, AllGather(w_slice).named("w_all")).named("w1");
  return p;
}

}  // namespace

Program adam_update(DType grad_dtype) { return clipped_update("adam_update", grad_dtype, false); }

Program lamb_update(DType grad_dtype) { return clipped_update("lamb_update", grad_dtype, true); }

Program lamb_bucket_update(DType grad_dtype) {
  return clipped_update("lamb_bucket_update", grad_dtype, true, true);
}

Program grad_norm() {
  Program p("grad_norm");
  p.output(AllReduce(Sum, p.input(F32, {1}, Local, "squares")).named("total"), "total");
  return p;
}

Program sum_in_place(DType wire) {
  Program p("sum_in_place");
  const Expr g = p.input(F32, {"N"}, Local, "g");
  if (wire == F32) {
    update(g, AllReduce(Sum, g).named("g_sum")).named("g1");
    return p;
  }
  // Each rank's g rounded to the wire's type, summed in it, widened back into g.
  const Expr narrow = cast(g, wire).named("g_wire");
  const Expr sum = AllReduce(Sum, narrow).named("g_sum");
  update(g, cast(sum, F32).named("g_wide")).named("g1");
  return p;
}

Program grad_handoff() {
  Program p("grad_handoff", 2);
  const Expr d = p.input(F32, {"N"}, Replicated, "d", 1);
  const Expr d_prev = p.input(F32, {"N"}, Replicated, "d_prev", 0);
  update(d_prev, Recv(Send(d, 0).named("d_to_prev")).named("d_received")).named("d_prev1");
  return p;
}

Program megatron_layer(DType dtype, double dropout_p, std::optional<DType> wire, Bias bias) {
  Program p(bias == Bias::With ? "megatron_layer" : "megatron_layer_no_bias");
  p.output(megatron_body(p, dtype, dropout_p, 0, wire.value_or(dtype), bias), "out");
  return p;
}

Program pipeline_stage(DType dtype, double dropout_p, std::optional<DType> wire, Bias bias) {
  Program p(bias == Bias::With ? "pipeline_stage" : "pipeline_stage_no_bias", 2);
  const Expr out = megatron_body(p, dtype, dropout_p, 0, wire.value_or(dtype), bias);
  p.output(out, "out");
  // Rank i of group 0 hands its copy of the activations to rank i of group 1.
  const Expr sent = Send(out, 1).named("out_to_next");
  p.output(Recv(sent).named("h"), "h");
  return p;
}

Program gather_weights() {
  Program p("gather_weights");
  const Expr w = p.input(F32, {"N"}, Sliced(0), "w");
  p.output(AllGather(w).named("w_all"), "w_all");
  return p;
}

Program kv_gather() {
  Program p("kv_gather");
  const Expr kv = p.input(F32, {"N"}, Sliced(0), "kv");
  p.output(AllGather(kv).named("kv_all"), "kv_all");
  return p;
}

Program kv_grad_reduce() {
  Program p("kv_grad_reduce");
  const Expr dkv = p.input(F32, {"N"}, Local, "dkv");
  p.output(ReduceScatter(Sum, dkv).named("dkv_mine"), "dkv_mine");
  return p;
}

Program kv_ring() {
  Program p("kv_ring");
  const Expr kv = p.input(F32, {"N"}, Local, "kv");
  p.output(Shift(kv).named("kv_next"), "kv_next");
  return p;
}

Program folds() {
  Program p("folds");
  const Expr x = p.input(F32, {"N"}, Sliced(0), "x");
  p.output(norm(x).named("n"), "n");
  p.output(reduce(ReduceOp::Sum, x).named("t"), "t");
  p.output(reduce(ReduceOp::Max, x).named("m"), "m");
  p.output(reduce(ReduceOp::Min, x).named("l"), "l");
  p.output(reduce(ReduceOp::Prod, x).named("q"), "q");
  return p;
}

Program strided_sums() {
  Program p("strided_sums");
  const Expr x = p.input(F32, {"M", "N"}, Sliced(1), "x");
  p.output(norm(x).named("n"), "n");
  p.output(reduce(ReduceOp::Sum, x).named("t"), "t");
  p.output(reduce(ReduceOp::Max, x).named("m"), "m");
  return p;
}

std::vector<std::string_view> names() {
  return {"adam",           "lamb",      "megatron_layer", "pipeline_stage",
          "gather_weights", "kv_gather", "kv_grad_reduce", "kv_ring"};
}

Program by_name(std::string_view name) {
  if (name == "adam") return adam();
  if (name == "lamb") return lamb();
  if (name == "megatron_layer") return megatron_layer();
  if (name == "pipeline_stage") return pipeline_stage();
  if (name == "megatron_layer_no_bias")
    return megatron_layer(DType::F32, 0.1, std::nullopt, Bias::Without);
  if (name == "pipeline_stage_no_bias")
    return pipeline_stage(DType::F32, 0.1, std::nullopt, Bias::Without);
  if (name == "gather_weights") return gather_weights();
  if (name == "kv_gather") return kv_gather();
  if (name == "kv_grad_reduce") return kv_grad_reduce();
  if (name == "kv_ring") return kv_ring();
  if (name == "folds") return folds();
  user_error("unknown workload '{}'; the workloads are: {}", name, fmt::join(names(), ", "));
}

}  // namespace tandem::dsl::workloads
