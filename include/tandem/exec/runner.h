// One interface for running a scheduled program on one rank, whichever executor carries it out:
// the compiled executor (exec/compiled.h, the one to train with), the plan runner
// (exec/plan_runner.h, the oracle of lowering, kept selectable to debug a schedule) or the
// reference interpreter on the scheduled program (ReferenceRunner below). The trainer's
// communication points (parallel/program_runner.h) and the autotuner (tune/) both run programs
// through it, with one set of executor names.
//
// Set up, then run: the constructor resolves the shapes, splits the program's groups off the
// communicator and allocates what the executor stores (everything that costs); then, any number
// of times: fill or bind the inputs, set the scalars, run, read the outputs.
//
// Binding (zero copy): bind(name, memory) makes input `name` live in the caller's memory instead
// of the runner's, so a trainer's gradient and weight buffers are read and updated in place with
// no copy in or out. An output may be bound too: it is then computed in the caller's memory (and
// so is every value the plan keeps in the same buffer: a matmul's product that the AllReduce sums
// in place, say), with no copy out. The memory must have the dtype and the number of elements the
// runner stores for the value on this rank (the whole tensor, or this rank's slice when the plan
// stores it sliced), and must outlive every run. Names in RunnerOptions::bound are not allocated
// at all; run() refuses while one of them is unbound. A program may reuse a bound input's memory
// for a later value of the same size (a reduce-scatter's result in the gradient's buffer): after
// run() a bound input holds either its old value or such a value, and an updated input (w after
// `update(w, ...)`) holds its new value.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/core/allocator.h"
#include "tandem/core/tensor.h"
#include "tandem/dsl/ir.h"
#include "tandem/exec/jit.h"
#include "tandem/exec/reference.h"
#include "tandem/schedule/plan.h"

namespace tandem::exec {

class CompiledPlan;

// The executors, by the names users give them (--executor, TANDEM_EXECUTOR, tandem tune).
enum class RunnerKind { Compiled, Plan, Reference };
// "compiled", "plan", "reference": the short name (part of the tuning cache's key).
std::string_view runner_kind_name(RunnerKind kind);
// "compiled (JIT)", "plan runner", "reference interpreter": for start-up lines.
std::string_view runner_kind_description(RunnerKind kind);
// The kind of a short name; a UserError naming `what` (the flag or variable) and the names
// otherwise.
RunnerKind runner_kind_from_name(std::string_view name, std::string_view what = "executor");
// TANDEM_EXECUTOR, default compiled.
RunnerKind runner_kind_from_env();
std::vector<std::string_view> runner_kind_names();

// Where a stored piece of a value sits in the whole: rows [offset, offset + count) of dim `dim`
// when sliced (dim -1 and the whole extent otherwise).
struct Piece {
  int dim = -1;
  int64_t offset = 0;
  int64_t count = 0;
};

class Runner {
 public:
  virtual ~Runner() = default;

  // The program as the runner runs it (a scheduled program: its inputs' layouts are the stored
  // ones), and where this rank sits in its groups.
  virtual const dsl::Program& program() const = 0;
  virtual const Placement& placement() const = 0;

  // This rank's stored piece of input `name`: the runner's storage, or the bound memory. Fill it
  // before run(); an input the program updates holds its new value after.
  virtual Tensor input(std::string_view name) const = 0;
  // Input or output `name` lives in `memory` from now on (see the header comment). A UserError
  // when the name is unknown, not this rank's, or `memory` has another dtype or element count.
  virtual void bind(std::string_view name, const Tensor& memory) = 0;
  // A scalar's value for the next runs. A dropout seed must be a non-negative integer below 2^53:
  // any other value is a UserError here, in every executor.
  virtual void set_scalar(std::string_view name, double value) = 0;
  // Runs the program once; every rank of the communicator calls it together.
  virtual void run() = 0;
  // Runs the program once as run() does, but returns with this rank's sends still in flight, so
  // that a pipeline stage goes on computing while its hand-off travels (1F1B deadlocks when both
  // ends of a link wait for their sends). A send reads its value where it lies until it
  // completes: send a bound input, and leave its memory alone until then (the runner's own
  // storage is rewritten by the next run). wait_sends() completes every send left so, and
  // rethrows the first failure; a runner destroyed with sends in flight cancels nothing (comm's
  // Request rules).
  virtual void run_leaving_sends() = 0;
  virtual void wait_sends() = 0;
  // This rank's piece of output `name` after run(): a view of the runner's storage (or of the
  // bound memory), the same memory from construction (or binding) on, so that another runner may
  // bind it as an input.
  virtual Tensor output(std::string_view name) const = 0;
  // Bytes this runner allocated (values, scratch, staging), as requested from its allocator;
  // bound inputs are the caller's and not counted.
  virtual size_t allocated_bytes() const = 0;

  // After a run: this rank's piece of every output of its group, and of every input the program
  // updates in place (by the input's name).
  virtual TensorMap results() const;
};

struct RunnerOptions {
  Allocator* alloc = nullptr;      // null: host_allocator()
  std::vector<std::string> bound;  // inputs and outputs the caller binds: never allocated
  dsl::Segments segments;          // the segments' bounds, for a program with segment ops (ir.h)
  // Compiled: the plan already compiled (shared by every rank of a process), else compiled here
  // with `jit` (or found in the JIT's cache).
  std::shared_ptr<const CompiledPlan> compiled;
  JitOptions jit;
  // The chunk size, in bytes, of every collective the runner runs (comm::CollectiveDesc::
  // chunk_bytes: how a fused collective's hook is cut, and the pipeline's chunks); 0: the
  // process's comm::chunk_bytes(). The autotuner records the fastest for a program (tune/cache.h)
  // and its users run the program at it. Every rank of the communicator must pass the same value.
  // Compiled and plan runners honour it; the reference interpreter has no chunks and ignores it.
  size_t chunk_bytes = 0;
};

// Default options but for the allocator.
inline RunnerOptions with_allocator(Allocator& alloc) {
  RunnerOptions o;
  o.alloc = &alloc;
  return o;
}

// Sets `plan` up on this rank of `comm` (every rank calls it together with the same plan); the
// plan must outlive the runner. The reference interpreter runs plan.program stage by stage:
// split, reorder and slicing take effect, fusion and overlap (which only the plan expresses) do
// not. A plan the executor cannot run, or a rank count that does not fit the program's groups,
// is a UserError.
std::unique_ptr<Runner> make_runner(RunnerKind kind, const schedule::Plan& plan,
                                    comm::Communicator& comm, const dsl::SymbolMap& symbols,
                                    const RunnerOptions& options = {});

// The reference interpreter behind the Runner interface: the inputs are allocated here (or
// bound), each run calls run_reference, and updated inputs are written in place. It runs no
// chunks, so RunnerOptions::chunk_bytes is ignored (its collectives take the process's size).
class ReferenceRunner final : public Runner {
 public:
  ReferenceRunner(const dsl::Program& program, comm::Communicator& comm,
                  const dsl::SymbolMap& symbols, const RunnerOptions& options = {});
  const dsl::Program& program() const override { return program_; }
  const Placement& placement() const override { return groups_.placement(); }
  Tensor input(std::string_view name) const override;
  void bind(std::string_view name, const Tensor& memory) override;
  void set_scalar(std::string_view name, double value) override;
  void run() override;
  void run_leaving_sends() override;
  void wait_sends() override;
  Tensor output(std::string_view name) const override;
  size_t allocated_bytes() const override { return bytes_; }

 private:
  void run(std::vector<comm::Request>* sends_left);

  const dsl::Program& program_;
  GroupComm groups_;
  std::vector<comm::Request> sends_;
  RunArgs args_;
  TensorMap outputs_;
  std::vector<std::string> unbound_;
  size_t bytes_ = 0;
};

// Checks `memory` against the stored piece `stored` of input `name` for bind(): same dtype and
// element count, contiguous. Returns a view of it shaped as `stored` that does not share its
// ownership (the caller keeps the memory alive).
Tensor checked_binding(std::string_view program, std::string_view name, const Shape& stored,
                       DType dtype, const Tensor& memory);

}  // namespace tandem::exec
