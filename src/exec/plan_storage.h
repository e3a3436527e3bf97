// One rank's storage for a lowered plan, under both plan executors (the plan runner and the
// compiled executor): the group split off the communicator, every stored value's buffer, the
// scalars' values, and the Runner interface's bookkeeping over them (find a value by name, check
// that it is this rank's, view, load, bind, where a piece sits, the bytes allocated, and the
// checks run() makes). Internal to exec/.
//
// Set up, then run: the constructor resolves the shapes, splits the group and allocates (zeroed)
// every value the plan stores on this rank as Plan::values says: Full the whole tensor, Slice this
// rank's part along the layout's dim, Block this rank's part of every row block of its pipeline,
// one after the other (codegen/abi.h). A value aliased to another lives in its root's buffer;
// values the caller binds (RunnerOptions::bound) get no buffer until bind().
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/core/allocator.h"
#include "tandem/core/tensor.h"
#include "tandem/dsl/ir.h"
#include "tandem/exec/reference.h"
#include "tandem/exec/runner.h"
#include "tandem/schedule/plan.h"

namespace tandem::exec {

class PlanStorage {
 public:
  // Collective over `world`. A rank count that does not fit the program's groups, an unbound
  // symbol or bad segments are UserErrors.
  PlanStorage(const schedule::Plan& plan, comm::Communicator& world, const dsl::SymbolMap& symbols,
              const RunnerOptions& options);
  PlanStorage(const PlanStorage&) = delete;
  PlanStorage& operator=(const PlanStorage&) = delete;

  const schedule::Plan& plan() const { return plan_; }
  const dsl::Program& program() const { return plan_.program; }
  const Placement& placement() const { return groups_.placement(); }
  comm::Communicator& world() const { return groups_.world(); }
  comm::Communicator& group() const { return groups_.group(); }
  const dsl::Segments& segments() const { return segments_; }
  // Where the runner's scratch comes from too, so that allocated_bytes() counts it.
  Allocator& allocator() { return alloc_; }

  // Value `id`'s global shape, its piece on this rank (Sliced: this rank's rows), its plan entry,
  // and the value whose buffer it lives in.
  const std::vector<Shape>& shapes() const { return shapes_; }
  const Shape& shape(int id) const { return shapes_[static_cast<size_t>(id)]; }
  Shape local(int id) const;
  const schedule::Value& value(int id) const { return plan_.values[static_cast<size_t>(id)]; }
  int root(int id) const { return roots_[static_cast<size_t>(id)]; }
  // The whole buffer value `id` lives in (its root's; undefined when none is stored here).
  const Tensor& buffer(int id) const { return buffers_[static_cast<size_t>(root(id))]; }
  // This rank's stored piece of value `id`, shaped as its local shape (not for Block values).
  Tensor view(int id) const;
  // Per stage: the start of the buffer it lives in (null when none), and a scalar's value as a
  // dropout seed; arrays of codegen/abi.h, stable from construction on (bind() updates them).
  void** data() { return data_.data(); }
  uint64_t* seeds() { return seeds_.data(); }
  // The dropout seed a stage keys its mask with: a constant's value or the scalar's.
  uint64_t seed(int id) const;

  // The Runner interface (runner.h).
  Tensor input(std::string_view name) const;
  // Copies a value into input `name`: this rank's stored piece as it is, or, when the plan stores
  // a slice of an input the caller holds whole, the whole tensor, of which it keeps its part.
  void load(std::string_view name, const Tensor& value);
  void bind(std::string_view name, const Tensor& memory);
  // A scalar that keys a dropout mask must be an integer in [0, 2^53): a UserError otherwise.
  void set_scalar(std::string_view name, double value);
  Tensor output(std::string_view name) const;
  Piece piece(std::string_view name) const;
  // Bytes allocated to store value `name` (0 when it lives in another value's buffer or in bound
  // memory), and for everything (values and the runner's scratch), as requested from the
  // allocator.
  size_t allocated_bytes(std::string_view name) const;
  size_t allocated_bytes() const { return alloc_.peak_bytes(); }
  // What run() refuses: a value still to be bound, a scalar not set.
  void check_ready() const;

 private:
  int find_named(std::string_view name, dsl::Op op, const char* what) const;
  int output_or_value(std::string_view name) const;
  void check_mine(int id, std::string_view name) const;
  Shape block_shape(int id) const;
  void allocate();

  const schedule::Plan& plan_;
  GroupComm groups_;
  CountingAllocator alloc_;
  std::vector<Shape> shapes_;
  dsl::Segments segments_;
  std::vector<int> roots_;  // per stage: the value owning its buffer
  std::vector<Tensor>
      buffers_;              // per owning value: its buffer (a null view of its shape until bound)
  std::vector<void*> data_;  // per stage: its root's buffer's data
  std::vector<size_t> bytes_;                         // per owning value: bytes allocated for it
  std::vector<uint64_t> seeds_;                       // per scalar: its value as a seed
  std::vector<char> scalar_set_;                      // per scalar: set_scalar called
  std::vector<std::pair<int, std::string>> unbound_;  // bind targets and their names, not bound yet
};

}  // namespace tandem::exec
