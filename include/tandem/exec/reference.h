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
//   Partial, and part_count(S[d], p, r) rows of dim d for Sliced(d) (core/formulas.h's split, the
//   one comm/ collectives partition by).
// - Elementwise stages, reductions and norms load their operands as f32, compute in f32 with the
//   formulas of dsl/elementwise.h (reductions accumulate in element order; whole-tensor sums and
//   norms in 8 double lanes keyed by the global flat index, rounded to f32 once), and round to the
//   stage's dtype once, when the result is stored. matmul converts its operands to f32, multiplies
//   with blas::sgemm and rounds the product once.
// - Reducing collectives (AllReduce, ReduceScatter, and the cross-rank step of a norm or reduce of
//   a Sliced tensor) reduce f32 copies of their operands, whatever the dtype, and round once;
//   AllGather, Broadcast, Shift, Send and Recv move the stage's own bytes. ReduceScatter and
//   AllGather use the communicator's reduce_scatter/all_gather when the layout's split coincides
//   with its flat split (1-D tensors, or dim 0 with rows dividing evenly); otherwise an all_reduce
//   and a slice, or one broadcast per rank.
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
#include <string_view>
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
  // Whether this rank holds what group g holds (a stage's type.group, a plan step's group): its
  // own group's values, and those every rank holds (dsl::kAllGroups: scalars, constants).
  bool holds(int g) const { return g == dsl::kAllGroups || g == group; }
  bool holds(const dsl::Stage& s) const { return holds(s.type.group); }
};

// A communicator of n ranks must split evenly into the program's groups: n % G != 0 is a
// UserError.
Placement placement(const dsl::Program& program, const comm::Communicator& comm);

// This rank's group of a program, split off `world` once at set-up (every rank of `world`
// constructs it together): the placement, and the communicator the group's collectives run on
// (`world` itself when the program has one group). A rank count that does not fit the groups is
// placement()'s UserError.
class GroupComm {
 public:
  GroupComm(const dsl::Program& program, comm::Communicator& world);
  const Placement& placement() const { return place_; }
  comm::Communicator& world() const { return world_; }
  comm::Communicator& group() const { return owned_ != nullptr ? *owned_ : world_; }

 private:
  comm::Communicator& world_;
  Placement place_;
  std::unique_ptr<comm::Communicator> owned_;
};

// Whether scalar `id` keys a dropout mask (is a Dropout's seed operand).
bool keys_dropout(const dsl::Program& program, int id);
// The seed a dropout scalar's value gives: an integer in [0, 2^53), else a UserError beginning
// with `where` (the program or plan, quoted).
uint64_t dropout_seed(std::string_view where, std::string_view name, double value);

// Runs `program` on this rank; every rank of `comm` calls it with its own pieces. Returns this
// rank's piece of every output held by its group (an output may share storage with an input).
// Bad arguments (a missing, misshapen or unknown input, an unbound symbol or scalar, a rank count
// that does not fit the groups, a broadcast root outside the group) are UserErrors naming them.
TensorMap run_reference(const dsl::Program& program, comm::Communicator& comm, const RunArgs& args);

// For a caller that runs the program many times (ReferenceRunner): run_reference on a group
// split off once, with the sends left in flight in `sends_left` when it is not null.
TensorMap run_reference(const dsl::Program& program, const GroupComm& groups, const RunArgs& args,
                        std::vector<comm::Request>* sends_left);

// ---------------------------------------------------------------------------- pieces of tensors

// A shape seen around its dim d, as a Sliced(d) layout, a collective's Dim partition and a
// reduction over d cut it: [outer, rows, inner] = the product of the dims before d, the extent of
// d, the product of the dims after it. Index r of p holds rows [part_offset(rows, p, r),
// + part_count(rows, p, r)) of every outer index (core/formulas.h).
struct Around {
  int64_t outer = 1, rows = 1, inner = 1;
};
Around around(const Shape& s, int d);

// The piece of `whole` that index r of p holds under `layout`: a copy of the rows of the sliced
// dim for Sliced, `whole` itself (shared storage) otherwise.
Tensor piece_of(const Tensor& whole, const dsl::Layout& layout, int p, int r);

// Rows [offset, offset + count) of dim `dim` of `t`, as a new tensor.
Tensor slice_rows(const Tensor& t, int dim, int64_t offset, int64_t count);
// Writes `part` into rows [offset, offset + part.shape()[dim]) of dim `dim` of `whole`.
void put_rows(const Tensor& whole, const Tensor& part, int dim, int64_t offset);

}  // namespace tandem::exec
