// The compiled executor of the CPU JIT: a lowered plan is emitted as C++ (codegen/cpp), compiled
// and cached (exec/jit), and run on a Communicator with the calling convention of the reference
// interpreter (RunArgs in, this rank's outputs out).
//
// Set up, then run (Gloo, ggml): the runner's constructor sets up the storage it shares with the
// plan runner (the group communicator and every value the plan stores on this rank, inputs
// included), allocates the f32 scratch the kernels ask for and the f32 copies of reduce_in_f32,
// and starts the communication thread; run() calls the compiled code and allocates no tensor
// storage. The default allocator means the communicator's (comm::buffer_allocator): on MPI ranks
// of one node, shared memory the peers read directly.
//
// Overlap: inside a Pipeline step the compiled code hands its collectives, sends and receives to
// a communication thread of this rank (a core::SerialWorker: in issue order, so every rank runs
// them in the same order) and computes the next block meanwhile. On MPI this needs
// MPI_THREAD_SERIALIZED or more (comm::communication_thread_allowed); with less, or with
// CompiledOptions::overlap = false, the blocks run one after the other (same results).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "tandem/comm/communicator.h"
#include "tandem/core/allocator.h"
#include "tandem/exec/jit.h"
#include "tandem/exec/plan_runner.h"
#include "tandem/exec/reference.h"
#include "tandem/exec/runner.h"
#include "tandem/schedule/plan.h"

namespace tandem::exec {

// A plan's emitted source and loaded module; immutable, so every rank (thread) of a process and
// every runner share one.
class CompiledPlan {
 public:
  CompiledPlan(schedule::Plan plan, std::string source, std::shared_ptr<JitModule> module);

  const schedule::Plan& plan() const { return plan_; }
  const std::string& source() const { return source_; }
  const JitModule& module() const { return *module_; }
  bool compiled_now() const { return module_->compiled_now(); }  // false: it came from the cache

 private:
  friend class CompiledRunner;
  schedule::Plan plan_;
  std::string source_;
  std::shared_ptr<JitModule> module_;
};

// Emits `plan` (a UserError naming the step if the emitter cannot compile it) and compiles it, or
// finds it in the cache (a failed compile is a UserError with the command and the compiler's
// output).
std::shared_ptr<const CompiledPlan> compile_plan(const schedule::Plan& plan,
                                                 const JitOptions& options = {});

struct CompiledOptions {
  bool overlap = true;  // run a Pipeline's communication on a communication thread
  // How a bf16/f16 AllReduce or ReduceScatter rounds. false: it reduces in its own dtype, half the
  // bytes of f32 on the wire; the thread backend's direct algorithm and a ring of 2 ranks still
  // round once, as the reference does, but a ring of p >= 3 rounds after each of its p - 1 steps.
  // true: it reduces an f32 copy and rounds once on every algorithm (plan.h's rule, bitwise with
  // the reference), at the cost of f32 traffic and conversions.
  bool reduce_in_f32 = false;
};

// The executor to train with, behind the Runner interface the tuner and the trainer run every
// executor through; its storage and checks are the plan runner's (one class under both).
class CompiledRunner final : public Runner {
 public:
  using Piece = exec::Piece;
  // Collective over `comm` (it splits off the group communicator when the program has groups).
  // A rank count that does not fit the program's groups, or an unbound symbol, is a UserError.
  CompiledRunner(std::shared_ptr<const CompiledPlan> compiled, comm::Communicator& comm,
                 const dsl::SymbolMap& symbols, const RunnerOptions& runner = {},
                 CompiledOptions options = {});
  // Compiles `plan` first (compile_plan with default options).
  CompiledRunner(const schedule::Plan& plan, comm::Communicator& comm,
                 const dsl::SymbolMap& symbols, Allocator& alloc = host_allocator(),
                 CompiledOptions options = {});
  ~CompiledRunner() override;
  CompiledRunner(const CompiledRunner&) = delete;
  CompiledRunner& operator=(const CompiledRunner&) = delete;

  const dsl::Program& program() const override;
  const Placement& placement() const override;
  // As PlanRunner: this rank's stored piece of input `name`, to fill before run() (an input
  // updated in place holds its new value after); bound to the caller's memory; a copy into it
  // from this rank's piece or, for an input the plan stores sliced, from the whole tensor; a
  // scalar's value (a dropout seed: a non-negative integer below 2^53).
  Tensor input(std::string_view name) const override;
  void bind(std::string_view name, const Tensor& memory) override;
  void load(std::string_view name, const Tensor& value);
  void set_scalar(std::string_view name, double value) override;

  // Runs the compiled plan once; every rank of the communicator calls it together.
  void run() override;
  void run_leaving_sends() override;
  void wait_sends() override;

  // This rank's piece of output `name` after run() (a view of the runner's storage), and where a
  // stored piece sits in the whole.
  Tensor output(std::string_view name) const override;
  Piece piece(std::string_view name) const;

  // Bytes this rank allocated at setup to store value `name` (0 when it lives in another value's
  // buffer or in bound memory), and for everything (values, scratch, reduce_in_f32's copies; a
  // collective's partition goes to the communicator, which needs no staging here).
  size_t allocated_bytes(std::string_view name) const;
  size_t allocated_bytes() const override;
  // Whether pipelines run their communication on the communication thread.
  bool overlapping() const;
  const CompiledPlan& compiled() const { return *compiled_; }

  // The overlap's timeline: each operation the computing thread queued for the communication
  // thread (a pipeline block's collective or transfer), with its block, when it was queued, and
  // when the communication thread began and ended it. Block b + 1 computes between the queueing
  // of block b's operation and of block b + 1's, so an operation of block b that ended after it
  // was queued and began before block b + 1's was queued ran while block b + 1 computed.
  struct QueuedOp {
    int block = -1;
    std::chrono::steady_clock::time_point queued, began, ended;
  };
  // Records the queued operations of the following runs into `log` (null: stops recording). For
  // tests and profiling; the log must outlive the runs.
  void record_queue(std::vector<QueuedOp>* log);

  struct State;  // the host side of the ABI (storage, callbacks, the communication thread)

 private:
  std::shared_ptr<const CompiledPlan> compiled_;
  std::unique_ptr<State> state_;
};

}  // namespace tandem::exec
