// The reference interpreter: runs a dsl::Program stage by stage on any Communicator with plain
// loops. It is the oracle every schedule, the CPU compiler and the CUDA emitter are checked
// against, so it is written to be obviously right rather than fast.
//
// How it computes.
// - Every rank of the communicator calls run_reference together. The ranks split into the
//   program's G groups of n/G consecutive ranks (ir.h); a rank evaluates, in program order, the
//   stages of its group and the group-less ones (scalars, constants). Collectives run on a
//   communicator of the group's ranks, split off once at the start.
// - Each stage's value is held as this rank's piece: the whole tensor for Local, Replicated and
//   Partial, and part_count(S[d], p, r) rows of dim d for Sliced(d) (core/formulas.h's split, the one comm/ collectives partition by).
// - Elementwise stages, reductions and norms load their operands as f32, compute in f32 with the
//   formulas of dsl/elementwise.h (reductions accumulate in element order; whole-tensor sums and
//   norms in 8 double lanes keyed by the global flat index, rounded to f32 once), and round to the
//   stage's dtype once, when the result is stored. matmul converts its operands to f32, multiplies
//   with blas::sgemm and rounds the product once.
// - Reducing collectives (AllReduce, ReduceScatter, and the cross-rank step of a norm or reduce of
//   a Sliced tensor) reduce f32 copies of their operands, whatever the dtype, and round once;
//   AllGather, Broadcast, Send and Recv move the stage's own bytes. ReduceScatter and AllGather
//   use the communicator's reduce_scatter/all_gather when the layout's split coincides with its
//   flat split (1-D tensors, or dim 0 with rows dividing evenly); otherwise an all_reduce and a
//   slice, or one broadcast per rank.
// - Dropout keys the mask by each element's flat index in the whole tensor (dropout_keep), so
//   every rank count and slicing draws the same mask; its seed is the bound scalar's value.
// - update(t, e) writes e into the caller's tensor for input t at the update's position (the IR
//   guarantees that no later stage reads the old value). Sends are posted without waiting and
//   completed before run_reference returns; a Recv waits for its data.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/core/tensor.h"
#include "tandem/dsl/ir.h"

namespace tandem::exec {

using TensorMap = std::map<std::string, Tensor, std::less<>>;
using ScalarMap = std::map<std::string, double, std::less<>>;

struct RunArgs {
  dsl::SymbolMap symbols;  // the extent of every symbolic dim
  ScalarMap scalars;       // every scalar's value (a dropout seed: a non-negative integer)
  // This rank's piece of each input of its group (inputs of other groups are ignored). Inputs the
  // program updates are written in place, so pass tensors you own and keep.
  TensorMap inputs;
  dsl::Segments segments = {};  // the segments' bounds, for a program with segment ops (ir.h)
};

// Where a rank sits among the program's groups.
struct Placement {
  int groups = 1;      // G
  int group_size = 1;  // n / G
  int group = 0;       // this rank's group: rank / group_size
  int index = 0;       // this rank's index in its group: rank % group_size
  int world_rank(int g, int i) const { return g * group_size + i; }
};

// A communicator of n ranks must split evenly into the program's groups: n % G != 0 is a
// UserError.
Placement placement(const dsl::Program& program, const comm::Communicator& comm);

// Runs `program` on this rank; every rank of `comm` calls it with its own pieces. Returns this
// rank's piece of every output held by its group (an output may share storage with an input).
// Bad arguments (a missing, misshapen or unknown input, an unbound symbol or scalar, a rank count
// that does not fit the groups, a broadcast root outside the group) are UserErrors naming them.
TensorMap run_reference(const dsl::Program& program, comm::Communicator& comm, const RunArgs& args);

// For a caller that runs the program many times (ReferenceRunner): this rank's group split off
// `comm` once (null when the program has one group: the group is comm itself), every rank
// calling it together; then run_reference on that group, with the sends left in flight in
// `sends_left` when it is not null.
std::unique_ptr<comm::Communicator> split_group(const dsl::Program& program, comm::Communicator& comm);
TensorMap run_reference(const dsl::Program& program, comm::Communicator& comm, comm::Communicator& group,
                        const RunArgs& args, std::vector<comm::Request>* sends_left);

// ---------------------------------------------------------------------------- pieces of tensors

// The piece of `whole` that index r of p holds under `layout`: a copy of the rows of the sliced
// dim for Sliced, `whole` itself (shared storage) otherwise.
Tensor piece_of(const Tensor& whole, const dsl::Layout& layout, int p, int r);

// Rows [offset, offset + count) of dim `dim` of `t`, as a new tensor.
Tensor slice_rows(const Tensor& t, int dim, int64_t offset, int64_t count);
// Writes `part` into rows [offset, offset + part.shape()[dim]) of dim `dim` of `whole`.
void put_rows(const Tensor& whole, const Tensor& part, int dim, int64_t offset);

}  // namespace tandem::exec
