// The lowered plan: how one schedule of a program runs, as plain data (Halide's lowered IR) that
// every executor and emitter walks: the plan runner (exec/plan_runner), the C++ emitter for the
// CPU JIT and the CUDA + NCCL emitter. It holds no execution state and nothing of one backend.
//
// How to walk a plan.
// - `program` is the scheduled program (after split, reorder, as_slice and dead-stage removal):
//   every step names stages of it by id, and the stage gives the op, attributes and type
//   (dtype, global shape, layout, group). `values[id]` says how each rank stores stage id.
// - `steps` run in order. A rank runs the steps of its own group and those of every group
//   (Step::group == dsl::kAllGroups); groups are those of ir.h (consecutive equal rank ranges).
//   Collectives run over the ranks of the step's group; Send/Recv pair rank i of one group with
//   rank i of another.
// - Sources are not steps: inputs are bound by the caller (Storage::Full, or Slice for a Sliced
//   input), scalars are bound at run time (one f32 each), constants (Storage::None) are inlined
//   from Stage::attrs.value.
// - A Loop computes its `stages` once per element of its domain, in order, with exactly the
//   formulas of dsl/elementwise.h (f32 arithmetic, rounded to the stage's dtype when stored);
//   values listed in `stores` are written to their buffers, the others stay in registers.
//   Operands are read at the element's position: a rank-0 operand is one value; an operand
//   whose shape is a proper suffix of the loop's shape is broadcast (flat index modulo its
//   element count); a Full operand of the loop's shape is read at the element's global index; a
//   Slice operand at the element's index within this rank's part. A register holds the stage's
//   value rounded to its dtype (as a stored value would be), so fusing never changes a result.
//   Stores happen at the stage's place in evaluation order; an Update stage writes its value
//   into its input's buffer (values[update].alias is that input). Norm and Reduce-over-all
//   stages in `accumulates` fold each element's operand into their accumulator at their place
//   in evaluation order (stage id order among `stages`); a Finish step completes them. A Norm or
//   Reduce Sum accumulates in 8 double lanes (dsl/elementwise.h's SumLanes): element g goes to
//   lane g % 8 by its global flat index (norm: += double(x) * double(x)), each lane in element
//   order, so the lanes hold the same values however the domain is cut into chunks or blocks.
//   Prod, Max and Min fold into one f32 value, elements in order, from the op's identity.
//   Inside a hook, the collective's own value at an element is read before anything is stored
//   there.
// - Domains. Full: every element of `shape`, flat index 0..numel. Slice: this rank's part along
//   `dim` (ir.h's part_count/part_offset over the group's p ranks). Chunk: the loop is the
//   per-chunk hook of the Collective that owns it; it runs on each fully reduced chunk of this
//   rank's part as the collective hands it over (ascending, at most the backend's chunk size),
//   and the chunk's elements have the global flat indices [offset, offset + n) of the
//   collective's whole buffer (dropout keys on these).
// - A Collective reduces, scatters or gathers `operand` into `stage` (see Collective below for
//   its partition, its fused hook, and the value it carries). A Pipeline runs its body once per
//   row block (overlap): each block of every listed value is handed to the next step while the
//   following block is produced.
// - Arithmetic outside loops follows the reference interpreter (exec/reference.h), so that a
//   schedule that keeps the order of operations is bitwise equal to it: reducing collectives
//   (and a Finish's cross-rank step) combine f32 copies whatever the dtype and round once to the
//   value's dtype (inside a hook the reduced chunk is f32, and the collective's value is that
//   chunk rounded to its dtype); a Matmul multiplies f32 copies (blas::sgemm) and rounds once;
//   AllGather, Broadcast, Shift, Send and Recv move the value's own bytes.
// - Buffers: a value with alias >= 0 has no buffer of its own; `alias` is always the root that
//   owns one (never a chain). A Slice value in a Full root occupies this rank's part of it
//   (contiguous when sliced along dim 0, the only dim split and reorder produce).
// - Dependencies are exactly the order of `steps`; an emitter that runs steps concurrently must
//   keep each step after the steps producing its operands.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/core/shape.h"
#include "tandem/dsl/ir.h"

namespace tandem::schedule {

// ----------------------------------------------------------------------------------- storage

// How each rank of the value's group holds one value.
enum class Storage : uint8_t {
  None,   // never materialised: a constant (inlined), a send, or a register inside one loop
  Full,   // the value's whole global shape (Local, Replicated and Partial values, scalars)
  Slice,  // this rank's part along the Sliced layout's dim: 1/p of the value
  Block,  // inside a Pipeline only: this rank's part of each row block (Sliced values made and
          // used inside the pipeline; one block's scratch may be reused once its sends are done)
};
std::string_view storage_name(Storage s);  // "none", "full", "slice", "block"

struct Value {
  int stage = -1;  // == its index in Plan::values
  Storage storage = Storage::None;
  // >= 0: the value lives in that value's buffer instead of its own: the same elements when
  // both have the same storage (an update writes into its input; an in-place collective), or
  // this rank's part of the other when this one is a Slice and the other Full (a result
  // computed on the part, then gathered in place).
  int alias = -1;
  bool output = false;  // read by the caller after the run (a program output)
  bool state = false;   // an input updated in place (the caller's buffer changes)
};

// ------------------------------------------------------------------------------------- steps

enum class StepKind : uint8_t {
  Loop,        // a fused elementwise loop
  Reduce,      // a reduction over one dim (Reduce stages with a dim), with its cross-rank part
  Finish,      // completes an accumulated Norm / Reduce(all): cross-rank combine, then finalise
  Matmul,      // one matmul stage, on each rank's stored pieces
  Collective,  // AllReduce, ReduceScatter, AllGather, Broadcast or Shift, maybe with a fused hook
  Send,        // hand a value to the same-index rank of another group
  Recv,        // the matching receive
  Pipeline,    // overlap: a body of steps run block by block
};
std::string_view step_kind_name(StepKind k);

enum class Domain : uint8_t {
  Full,   // every element of the loop's global shape
  Slice,  // this rank's part along `dim`
  Chunk,  // the chunks of a collective's hook (only in Collective::fused)
};
std::string_view domain_name(Domain d);

struct Loop {
  Domain domain = Domain::Full;
  int dim = -1;                  // Domain::Slice: the sliced dim
  dsl::SymShape shape;           // the global shape ranged over ([] for scalar code)
  std::vector<int> stages;       // computed per element, in evaluation order
  std::vector<int> stores;       // the subset of `stages` written to memory
  std::vector<int> accumulates;  // Norm / Reduce(all dims) stages folded over the elements
};

// A Reduce stage over one dim: each rank reduces its stored piece of the operand (elements in
// order, from the identity). When the reduced dim is the operand's sliced dim, the rank results
// are then combined across the group (an all-reduce with the same op): `across_ranks`.
// A SegmentNorm stage (ir.h) is a Reduce step too: each rank folds the squares of its stored
// piece per segment (dsl::segment_sums_of_squares), then, `across_ranks` for a Sliced operand,
// one f32 all-reduce (Sum) of the S partials, then the f32 sqrt of each.
struct Reduce {
  int stage = -1;
  bool across_ranks = false;
};

// Completes an accumulator filled by the Loops (or hooks) listing it: a sum's lanes are added in
// order 0..7 and rounded to f32 once (Prod, Max, Min: the f32 value); when the loop ran on a part
// (Domain::Slice or Chunk), the ranks' f32 values are then combined across the group (an
// all-reduce of one f32 with the reduction's op; Sum for a norm: the one step whose order may
// differ between schedules); then a norm takes the f32 square root, and the result is rounded to
// the stage's dtype and stored.
struct Finish {
  int stage = -1;
  bool across_ranks = false;
};

// C = A x B for one matmul stage, on each rank's stored pieces of A and B (their layouts say
// which: a sliced contraction dim gives this rank's Partial summand). Inside a Pipeline, A's
// and C's rows (dim -2) are blocked; B is read whole.
struct Matmul {
  int stage = -1;
};

// How a collective divides its buffer among the group's p ranks.
enum class Partition : uint8_t {
  Flat,  // part r is flat elements [Partition::offset(numel, p, r), +count) (comm/'s split)
  Dim,   // part r is ir.h's Sliced(dim) part: the shape as [outer, rows = shape[dim], inner],
         // rank r owning its rows of every outer block (comm/'s PartitionDesc, which every
         // collective takes)
};
std::string_view partition_name(Partition p);

struct Collective {
  dsl::Op op = dsl::Op::AllReduce;  // AllReduce, ReduceScatter, AllGather, Broadcast, Shift
  // (a Shift is never in place and never fused: its operand leaves while its value arrives)
  int stage = -1;  // the value it produces (for a completing gather: the value it completes)
  // The value it reads. -1 for a completing gather: a Replicated value that a fused hook
  // computed on this rank's part only, gathered in place in its own Full buffer.
  int operand = -1;
  dsl::ReduceOp reduce = dsl::ReduceOp::Sum;  // AllReduce, ReduceScatter
  Partition partition = Partition::Flat;
  int dim = -1;           // Partition::Dim: the dim
  int root = 0;           // Broadcast
  bool in_place = false;  // the result is written over `operand`'s buffer (values[stage].alias)
  // AllReduce / ReduceScatter: computation run on each fully reduced chunk of this rank's part,
  // before the chunk is gathered (AllReduce) or while it is still in cache (ReduceScatter).
  // Domain::Chunk; shape = the collective's shape. Stores of Replicated stages write the
  // chunk's elements of their Full buffers (a completing gather follows); stores of Sliced
  // stages write their Slice buffers.
  std::optional<Loop> fused;
  // AllReduce with `fused`: the hook's value written over each reduced chunk, so that the gather
  // phase distributes it instead of the sum (same dtype and shape as the collective's value).
  // The collective's buffer then holds `carry` (values[carry].alias == stage); the reduced
  // value itself is only seen chunk by chunk inside the hook.
  int carry = -1;
};

// Send: rank i of `group` hands its stored piece of `value` to rank i of `peer_group`.
// Recv: rank i of `group` receives it into its buffer for `value` (the Recv stage).
struct Transfer {
  int stage = -1;  // the Send or Recv stage
  int value = -1;  // Send: the value sent. Recv: the Recv stage (the value received).
  int peer_group = -1;
};

struct Step;

// Overlap: `body` runs once per row block b < blocks, the blocks of dim 0 of every value in
// `values` being part_count/part_offset(rows, blocks, b) (ir.h's split). While block b's
// result moves on (is reduced, gathered, sent), block b + 1 is produced: a backend with
// asynchronous collectives or streams runs step k of block b + 1 alongside step k + 1 of block
// b; an executor without them may run the blocks one after the other (same result). Inside the
// body, collectives partition each block separately (so a Sliced value inside the pipeline is
// stored Block and never leaves it), loops range over the block's rows, and element indices
// stay global (a block's flat offset is added).
struct Pipeline {
  int blocks = 1;
  std::vector<int> values;  // the values processed block by block; the rest are read whole
  std::vector<Step> body;
};

struct Step {
  StepKind kind = StepKind::Loop;
  int group = dsl::kAllGroups;  // the group whose ranks run it; kAllGroups: every rank
  std::string label;            // the fused stage it lowers, for printing ("fused(rs+4)")
  Loop loop;                    // Loop
  Reduce reduce;                // Reduce
  Finish finish;                // Finish
  Matmul matmul;                // Matmul
  Collective collective;        // Collective
  Transfer transfer;            // Send, Recv
  Pipeline pipeline;            // Pipeline
};

// ------------------------------------------------------------------------------------ plans

struct Plan {
  std::string name;           // the schedule's name, e.g. "fused(RS-C-AG)+slice(m,v)"
  dsl::Program program{""};   // the scheduled program the ids refer to
  std::vector<Value> values;  // one per stage of `program`, by stage id
  std::vector<Step> steps;    // in execution order

  // Readable: the steps as an indented list (loops with their stages, collectives with their
  // fused computation, pipelines with their body), then what each rank stores.
  std::string str() const;
  std::string step_str(const Step& step, int indent = 0) const;
};

// The shape rank r of p holds for value `id` under its storage (Full: the global shape;
// Slice: the part along its layout's dim; None: empty). Block storage depends on the block:
// use block_rows for dim 0 and then this for the slice of the block.
Shape stored_shape(const Plan& plan, int id, const std::vector<Shape>& global_shapes, int p, int r);

// The value whose buffer a runner's bind(name) replaces with the caller's memory: input `name`,
// or the buffer output `name` is computed in (the root of its aliases, which every value of that
// buffer follows). A UserError when the program has neither, or when the output is computed in
// an input's buffer (bind that input), or in blocks.
int bind_target(const Plan& plan, std::string_view name);

}  // namespace tandem::schedule
