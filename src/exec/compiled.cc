// The compiled executor: the host side of codegen/abi.h. It allocates what the plan stores, binds
// each run's inputs, and carries out the compiled code's callbacks: collectives (their partition
// handed to comm/, the emitted hook installed as the ChunkHook), transfers, and the communication
// thread of pipelines.
#include "tandem/exec/compiled.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <mutex>
#include <utility>
#include <vector>

#include "plan_storage.h"
#include "tandem/codegen/abi.h"
#include "tandem/codegen/cpp.h"
#include "tandem/comm/mpi.h"
#include "tandem/core/blas.h"
#include "tandem/core/error.h"
#include "tandem/core/serial_worker.h"

namespace tandem::exec {

using schedule::Plan;
using schedule::Step;
using schedule::StepKind;
using schedule::Storage;

CompiledPlan::CompiledPlan(schedule::Plan plan, std::string source,
                           std::shared_ptr<JitModule> module)
    : plan_(std::move(plan)), source_(std::move(source)), module_(std::move(module)) {}

std::shared_ptr<const CompiledPlan> compile_plan(const Plan& plan, const JitOptions& options) {
  std::string source = codegen::emit_cpp(plan);
  std::shared_ptr<JitModule> module = jit_compile(source, options);
  auto version = reinterpret_cast<int (*)()>(module->symbol("tandem_abi_version"));
  if (version() != TANDEM_ABI_VERSION)
    internal_error(fmt::format("JIT module {} speaks ABI {}, the host {}", module->path(),
                               version(), TANDEM_ABI_VERSION));
  return std::make_shared<const CompiledPlan>(plan, std::move(source), std::move(module));
}

namespace {

DType dtype_of(int32_t code) {
  return code == 0 ? DType::F32 : (code == 1 ? DType::BF16 : DType::F16);
}

Tensor view(void* data, DType dtype, int64_t n) { return Tensor::view_of(data, dtype, Shape{n}); }
char* bytes_at(void* base, int64_t elems, size_t es) {
  return static_cast<char*>(base) + static_cast<size_t>(elems) * es;
}

void sgemm_trampoline(int ta, int tb, int m, int n, int k, float alpha, const float* a, int lda,
                      const float* b, int ldb, float beta, float* c, int ldc) {
  blas::sgemm(ta != 0, tb != 0, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Visits every step, pipeline bodies included, with the pipeline's block count (0 outside).
template <typename F>
void each_step(const std::vector<Step>& steps, F&& f, int blocks = 0) {
  for (const Step& s : steps) {
    if (s.kind == StepKind::Pipeline)
      each_step(s.pipeline.body, f, s.pipeline.blocks);
    else
      f(s, blocks);
  }
}

}  // namespace

// ------------------------------------------------------------------------------------ state

struct CompiledRunner::State {
  PlanStorage store;
  const Plan& plan;
  const dsl::Program& prog;
  bool overlap = false;
  size_t chunk_bytes = 0;  // every collective's (RunnerOptions::chunk_bytes; 0: the process's)

  // The ABI's arrays (the buffers and seeds are the storage's).
  tandem_args args{};
  std::vector<double> acc;
  std::vector<int64_t> sym;
  std::vector<int64_t> seg;  // the segments' bounds (programs with segment ops)
  Tensor scratch;
  Tensor wide;  // reduce_in_f32: f32 copies of a 16-bit collective's buffer and of this rank's part
  bool reduce_in_f32 = false;
  tandem_entry_fn run_fn = nullptr;

  // A failure inside a callback, rethrown when the compiled code returns.
  std::mutex error_mutex;
  std::exception_ptr error;
  std::vector<comm::Request> sends;

  // The communication thread: a pipeline's async collectives and transfers, run in issue order.
  // Each run queues at most ops.size() of them (counted at setup), kept here so that queueing
  // copies no descriptor onto the heap.
  struct Op {
    bool is_collective = true;
    tandem_collective c{};
    tandem_transfer t{};
    std::chrono::steady_clock::time_point queued;
  };
  std::vector<Op> ops;
  size_t queued = 0;                    // ops queued in this run
  uint64_t last_ticket = 0;             // the worker's ticket of the last op queued
  std::vector<uint64_t> last_of_block;  // per block: the ticket of its last op (0: none)
  std::mutex log_mutex;
  std::vector<CompiledRunner::QueuedOp>* queue_log = nullptr;  // record_queue's, under log_mutex
  std::unique_ptr<SerialWorker> worker;  // last: stopped before what its jobs use goes away

  State(const Plan& p, comm::Communicator& comm, const dsl::SymbolMap& symbols,
        const RunnerOptions& options)
      : store(p, comm, symbols, options),
        plan(p),
        prog(p.program),
        chunk_bytes(options.chunk_bytes) {}

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(error_mutex);
    if (!error) error = std::move(e);
  }

  const Placement& place() const { return store.placement(); }
  comm::Communicator& group() const { return store.group(); }

  // -------------------------------------------------------------------------- collectives

  // Every collective of the plan runs through here, at the runner's chunk size
  // (RunnerOptions::chunk_bytes; 0: the process's).
  void run_desc(comm::CollectiveDesc d) {
    d.chunk_bytes = chunk_bytes;
    group().run(std::move(d));
  }

  void call_hook(const tandem_collective& c, void* chunk, int64_t n, int64_t g) {
    const int rc = c.hook(&args, chunk, n, g, c.block.index >= 0 ? &c.block : nullptr);
    if (rc != 0) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (error) std::rethrow_exception(error);
      internal_error(fmt::format("a compiled hook of step {} returned {}", c.step, rc));
    }
  }

  static comm::PartitionDesc partition_of(const tandem_collective& c) {
    return {c.outer, c.rows, c.inner};
  }

  static void widen(const void* src, DType t, float* dst, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = load_as_f32(src, t, static_cast<size_t>(i));
  }
  static void narrow(const float* src, void* dst, DType t, int64_t n) {
    for (int64_t i = 0; i < n; ++i) store_from_f32(dst, t, static_cast<size_t>(i), src[i]);
  }
  // CompiledOptions::reduce_in_f32: a bf16/f16 all-reduce or reduce-scatter reduces an f32 copy and
  // rounds once (plan.h's rule, the reference's rounding on every algorithm); the hook still sees
  // the value in its own dtype, and a carried value is widened back for the gather.
  void run_wide(const tandem_collective& c) {
    const DType dt = dtype_of(c.dtype);
    const size_t es = dtype_size(dt);
    const int64_t n = c.outer * c.rows * c.inner;
    const int p = group().size(), r = place().index;
    const ReduceOp op = reduce_op_of_code(c.op);
    float* w = wide.data_as<float>();
    widen(c.send, dt, w, n);
    if (c.kind == 0) {
      comm::ChunkHook hook;
      if (c.hook != nullptr)
        hook = [&](const Tensor& chunk, int64_t off) {
          void* mine = bytes_at(c.send, off, es);
          narrow(chunk.data_as<float>(), mine, dt, chunk.numel());
          call_hook(c, mine, chunk.numel(), c.index_base + off);
          if (c.carry) widen(mine, dt, chunk.data_as<float>(), chunk.numel());
        };
      run_desc({.kind = comm::CollectiveKind::AllReduce,
                .op = op,
                .send = view(w, DType::F32, n),
                .hook = std::move(hook),
                .partition = partition_of(c)});
      narrow(w, c.send, dt, n);
      return;
    }
    // The f32 part, packed after the whole; each reduced chunk is rounded into its place in the
    // output (packed, or in a whole-shaped buffer), then hooked there.
    void* whole = c.recv == nullptr ? c.send : (c.recv_whole ? c.recv : nullptr);
    float* part = w + n;
    const int64_t count = c.outer * fx::part_count(c.rows, p, r) * c.inner;
    comm::ChunkHook hook = [&](const Tensor& chunk, int64_t off) {
      void* mine = whole != nullptr ? bytes_at(whole, off, es)
                                    : bytes_at(c.recv, chunk.data_as<float>() - part, es);
      narrow(chunk.data_as<float>(), mine, dt, chunk.numel());
      if (c.hook != nullptr) call_hook(c, mine, chunk.numel(), c.index_base + off);
    };
    run_desc({.kind = comm::CollectiveKind::ReduceScatter,
              .op = op,
              .send = view(w, DType::F32, n),
              .recv = view(part, DType::F32, count),
              .hook = std::move(hook),
              .partition = partition_of(c)});
  }

  // One collective of the compiled code, its [outer, rows, inner] partition handed to comm/.
  void run_collective(const tandem_collective& c) {
    const DType dt = dtype_of(c.dtype);
    const int64_t n = c.outer * c.rows * c.inner;
    const int p = group().size(), r = place().index;
    if (reduce_in_f32 && dt != DType::F32 && (c.kind == 0 || c.kind == 1)) return run_wide(c);
    comm::CollectiveDesc d{comm::CollectiveKind::AllReduce};
    d.op = reduce_op_of_code(c.op);
    d.partition = partition_of(c);
    if (c.hook != nullptr && (c.kind == 0 || c.kind == 1))
      d.hook = [this, &c](const Tensor& chunk, int64_t offset) {
        call_hook(c, chunk.data(), chunk.numel(), c.index_base + offset);
      };
    const int64_t count =
        c.outer * fx::part_count(c.rows, p, r) * c.inner;  // this rank's part, packed
    switch (c.kind) {
      case 0:  // all_reduce
        d.send = view(c.send, dt, n);
        break;
      case 1:  // reduce_scatter: into a packed part, or into its place in a whole-shaped buffer
               // (the input itself when recv is null)
        d.kind = comm::CollectiveKind::ReduceScatter;
        d.send = view(c.send, dt, n);
        d.recv = c.recv == nullptr ? d.send
                                   : (c.recv_whole ? view(c.recv, dt, n) : view(c.recv, dt, count));
        break;
      case 2:  // all_gather: from a packed part, or from the output itself (send null: the part in
               // place)
        d.kind = comm::CollectiveKind::AllGather;
        d.recv = view(c.recv, dt, n);
        d.send = c.send != nullptr ? view(c.send, dt, count) : d.recv;
        break;
      case 3:  // broadcast
        if (c.root < 0 || c.root >= p)
          user_error(
              "program '{}', step {}: Broadcast root {} is outside the group of {} ranks; the root "
              "is a rank index "
              "within the group, 0 to {}",
              prog.name(), c.step, c.root, p, p - 1);
        run_desc(
            {.kind = comm::CollectiveKind::Broadcast, .send = view(c.send, dt, n), .root = c.root});
        return;
      case 4:  // shift: send to the next rank, receive the previous one's
        run_desc({.kind = comm::CollectiveKind::Shift,
                  .send = view(c.send, dt, n),
                  .recv = view(c.recv, dt, n)});
        return;
      default:
        internal_error(fmt::format("collective kind {} from compiled step {}", c.kind, c.step));
    }
    run_desc(std::move(d));
  }

  void run_transfer(const tandem_transfer& t) {
    const int peer = place().world_rank(t.peer_group, place().index);
    // Bytes travel as 2-byte elements: every dtype's size is a multiple of 2.
    const Tensor data = view(t.data, DType::F16, t.bytes / 2);
    if (t.recv == 0)
      sends.push_back(store.world().isend(data, peer, t.tag));
    else
      store.world().irecv(data, peer, t.tag).wait();
  }

  // -------------------------------------------------------------------------- the worker

  void enqueue(Op op) {
    TANDEM_CHECK(queued < ops.size(), "communication queue of {} ops is full", ops.size());
    const size_t k = queued++;
    {
      std::lock_guard<std::mutex> lock(log_mutex);
      if (queue_log != nullptr) op.queued = std::chrono::steady_clock::now();
    }
    ops[k] = op;
    last_ticket = worker->submit([this, k] { run_queued(ops[k]); });
    const int32_t b = op.is_collective ? op.c.block.index : op.t.block;
    if (b >= 0 && static_cast<size_t>(b) < last_of_block.size())
      last_of_block[static_cast<size_t>(b)] = last_ticket;
  }

  // On the communication thread; a failure stops the ops queued after it (SerialWorker).
  void run_queued(const Op& op) {
    const auto began = std::chrono::steady_clock::now();
    if (op.is_collective)
      run_collective(op.c);
    else
      run_transfer(op.t);
    std::lock_guard<std::mutex> lock(log_mutex);
    if (queue_log != nullptr)
      queue_log->push_back({op.is_collective ? op.c.block.index : op.t.block, op.queued, began,
                            std::chrono::steady_clock::now()});
  }

  // Waits for the queued work of blocks <= b (b < 0: all of it, then forgets the blocks); 1 when
  // queued work failed (its error kept for the run to rethrow).
  int sync(int32_t b) {
    if (!overlap) return 0;
    uint64_t target = last_ticket;
    if (b >= 0) {
      target = 0;
      for (int32_t i = 0; i <= b && static_cast<size_t>(i) < last_of_block.size(); ++i)
        target = std::max(target, last_of_block[static_cast<size_t>(i)]);
    }
    try {
      worker->wait_for(target);
    } catch (...) {
      fail(std::current_exception());
      return 1;
    }
    if (b < 0) std::fill(last_of_block.begin(), last_of_block.end(), 0);
    return 0;
  }

  // After a run: every queued op done, the worker ready for the next run.
  void drain() {
    if (!overlap) return;
    try {
      worker->wait();
    } catch (...) {
      fail(std::current_exception());
    }
    queued = 0;
    std::fill(last_of_block.begin(), last_of_block.end(), 0);
  }

  // -------------------------------------------------------------------------- callbacks

  static int on_collective(void* host, const tandem_collective* c) {
    auto* s = static_cast<State*>(host);
    try {
      if (c->async && s->overlap) {
        Op op;
        op.c = *c;
        s->enqueue(op);
      } else {
        s->run_collective(*c);
      }
      return 0;
    } catch (...) {
      s->fail(std::current_exception());
      return 1;
    }
  }

  static int on_transfer(void* host, const tandem_transfer* t) {
    auto* s = static_cast<State*>(host);
    try {
      if (t->async && s->overlap) {
        Op op;
        op.is_collective = false;
        op.t = *t;
        s->enqueue(op);
      } else {
        s->run_transfer(*t);
      }
      return 0;
    } catch (...) {
      s->fail(std::current_exception());
      return 1;
    }
  }

  static int on_sync(void* host, int32_t block) { return static_cast<State*>(host)->sync(block); }
};

// ------------------------------------------------------------------------------------ setup

CompiledRunner::CompiledRunner(const Plan& plan, comm::Communicator& comm,
                               const dsl::SymbolMap& symbols, Allocator& alloc,
                               CompiledOptions options)
    : CompiledRunner(compile_plan(plan), comm, symbols, with_allocator(alloc), options) {}

CompiledRunner::CompiledRunner(std::shared_ptr<const CompiledPlan> compiled,
                               comm::Communicator& comm, const dsl::SymbolMap& symbols,
                               const RunnerOptions& runner, CompiledOptions options)
    : compiled_(std::move(compiled)) {
  const Plan& plan = compiled_->plan();
  const dsl::Program& prog = plan.program;
  state_ = std::make_unique<State>(plan, comm, symbols, runner);
  State& s = *state_;
  for (const std::string& name : prog.symbols()) s.sym.push_back(symbols.find(name)->second);
  s.acc.assign(prog.stages().size() * TANDEM_ACC_SLOTS, 0.0);

  // The f32 copies of reduce_in_f32, and the async queue.
  size_t wide = 0, async_ops = 0, max_blocks = 0, sends = 0;
  each_step(plan.steps, [&](const Step& st, int blocks) {
    if (st.kind == StepKind::Collective && s.place().holds(prog.stage(st.collective.stage))) {
      const size_t numel = static_cast<size_t>(s.store.shape(st.collective.stage).numel());
      if (st.collective.op == dsl::Op::AllReduce || st.collective.op == dsl::Op::ReduceScatter)
        wide = std::max(wide, numel);
    }
    // Inside a pipeline, communication may be queued: at most every block's of every such step.
    if (blocks > 0 &&
        (st.kind == StepKind::Collective || st.kind == StepKind::Send || st.kind == StepKind::Recv))
      async_ops += static_cast<size_t>(blocks);
    if (st.kind == StepKind::Send) sends += static_cast<size_t>(std::max(1, blocks));
    max_blocks = std::max(max_blocks, static_cast<size_t>(blocks));
  });
  s.reduce_in_f32 = options.reduce_in_f32;
  if (s.reduce_in_f32)
    s.wide = Tensor::empty(DType::F32, Shape{static_cast<int64_t>(2 * wide)}, s.store.allocator());
  s.sends.reserve(sends);

  // The ABI.
  tandem_args& a = s.args;
  a.buf = s.store.data();
  a.acc = s.acc.data();
  a.sym = s.sym.data();
  a.seed = s.store.seeds();
  a.p = s.place().group_size;
  a.r = s.place().index;
  a.group = s.place().group;
  a.host = &s;
  a.collective = &State::on_collective;
  a.transfer = &State::on_transfer;
  a.sync = &State::on_sync;
  a.sgemm = &sgemm_trampoline;
  s.seg = s.store.segments();
  a.seg = s.seg.data();
  a.nseg = s.seg.empty() ? 0 : static_cast<int64_t>(s.seg.size()) - 1;
  const JitModule& m = compiled_->module();
  s.run_fn = reinterpret_cast<tandem_entry_fn>(m.symbol("tandem_run"));
  auto scratch_fn = reinterpret_cast<tandem_scratch_fn>(m.symbol("tandem_scratch_elems"));
  s.scratch =
      Tensor::empty(DType::F32, Shape{std::max<int64_t>(1, scratch_fn(&a))}, s.store.allocator());
  a.scratch = s.scratch.data_as<float>();

  // The calling thread computes the next block while the thread runs the queued exchanges.
  const bool threads = options.overlap && max_blocks > 1 &&
                       comm::communication_thread_allowed(comm, /*others_communicate=*/false);
  s.overlap = threads;
  if (threads) {
    s.ops.resize(std::max<size_t>(1, async_ops));
    s.last_of_block.assign(max_blocks, 0);
    s.worker = std::make_unique<SerialWorker>("tandem-comm");
  }
}

CompiledRunner::~CompiledRunner() = default;

size_t CompiledRunner::allocated_bytes() const { return state_->store.allocated_bytes(); }
bool CompiledRunner::overlapping() const { return state_->overlap; }

// ------------------------------------------------------------------------------- interface

const dsl::Program& CompiledRunner::program() const { return state_->prog; }
const Placement& CompiledRunner::placement() const { return state_->place(); }
Tensor CompiledRunner::input(std::string_view name) const { return state_->store.input(name); }
void CompiledRunner::bind(std::string_view name, const Tensor& memory) {
  state_->store.bind(name, memory);
}
void CompiledRunner::load(std::string_view name, const Tensor& value) {
  state_->store.load(name, value);
}
void CompiledRunner::set_scalar(std::string_view name, double value) {
  state_->store.set_scalar(name, value);
}
Tensor CompiledRunner::output(std::string_view name) const { return state_->store.output(name); }
CompiledRunner::Piece CompiledRunner::piece(std::string_view name) const {
  return state_->store.piece(name);
}
size_t CompiledRunner::allocated_bytes(std::string_view name) const {
  return state_->store.allocated_bytes(name);
}

// ------------------------------------------------------------------------------------- run

void CompiledRunner::record_queue(std::vector<QueuedOp>* log) {
  std::lock_guard<std::mutex> lock(state_->log_mutex);
  state_->queue_log = log;
}

void CompiledRunner::run() {
  run_leaving_sends();
  wait_sends();
}

void CompiledRunner::wait_sends() { comm::wait_all(state_->sends); }

void CompiledRunner::run_leaving_sends() {
  State& s = *state_;
  s.store.check_ready();
  const int rc = s.run_fn(&s.args);
  s.drain();
  std::exception_ptr e;
  {
    std::lock_guard<std::mutex> lock(s.error_mutex);
    e = std::exchange(s.error, nullptr);
  }
  if (rc == 0 && !e) return;
  // The run's failure first: its sends are waited for (and their own failures dropped), so that
  // none is left reading memory the caller may free.
  try {
    comm::wait_all(s.sends);
  } catch (...) {
  }
  if (e) std::rethrow_exception(e);
  internal_error(fmt::format("compiled plan '{}' returned {} without an error", s.plan.name, rc));
}

}  // namespace tandem::exec
