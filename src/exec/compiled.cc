// The compiled executor: the host side of codegen/abi.h. It allocates what the plan stores, binds
// each run's inputs, and carries out the compiled code's callbacks: collectives (their partition
// handed to comm/, the emitted hook installed as the ChunkHook), transfers, and the communication
// thread of pipelines.
#include "tandem/exec/compiled.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "tandem/codegen/abi.h"
#include "tandem/codegen/cpp.h"
#include "tandem/core/blas.h"
#include "tandem/core/error.h"

namespace tandem::exec {

using schedule::Plan;
using schedule::Step;
using schedule::StepKind;
using schedule::Storage;

CompiledPlan::CompiledPlan(schedule::Plan plan, std::string source, std::shared_ptr<JitModule> module)
    : plan_(std::move(plan)), source_(std::move(source)), module_(std::move(module)) {}

std::shared_ptr<const CompiledPlan> compile_plan(const Plan& plan, const JitOptions& options) {
  std::string source = codegen::emit_cpp(plan);
  std::shared_ptr<JitModule> module = jit_compile(source, options);
  auto version = reinterpret_cast<int (*)()>(module->symbol("tandem_abi_version"));
  if (version() != TANDEM_ABI_VERSION)
    internal_error(fmt::format("JIT module {} speaks ABI {}, the host {}", module->path(), version(), TANDEM_ABI_VERSION));
  return std::make_shared<const CompiledPlan>(plan, std::move(source), std::move(module));
}

namespace {

DType dtype_of(int32_t code) { return code == 0 ? DType::F32 : (code == 1 ? DType::BF16 : DType::F16); }

Tensor view(void* data, DType dtype, int64_t n) { return Tensor::view_of(data, dtype, Shape{n}); }
char* bytes_at(void* base, int64_t elems, size_t es) { return static_cast<char*>(base) + static_cast<size_t>(elems) * es; }

void sgemm_trampoline(int ta, int tb, int m, int n, int k, float alpha, const float* a, int lda, const float* b,
                      int ldb, float beta, float* c, int ldc) {
  blas::sgemm(ta != 0, tb != 0, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// Visits every step, pipeline bodies included, with the pipeline's block count (0 outside).
template <typename F>
void each_step(const std::vector<Step>& steps, F&& f, int blocks = 0) {
  for (const Step& s : steps) {
    if (s.kind == StepKind::Pipeline) each_step(s.pipeline.body, f, s.pipeline.blocks);
    else f(s, blocks);
  }
}

RunnerOptions with_allocator(Allocator& alloc) {
  RunnerOptions o;
  o.alloc = &alloc;
  return o;
}

bool mpi_allows_threads() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return false;
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  return level >= MPI_THREAD_SERIALIZED;
}

}  // namespace

// ------------------------------------------------------------------------------------ state

struct CompiledRunner::State {
  const Plan& plan;
  const dsl::Program& prog;
  comm::Communicator& world;
  std::unique_ptr<comm::Communicator> group_owned;
  comm::Communicator* group = nullptr;
  Placement place;
  std::vector<Shape> global;
  CountingAllocator alloc;
  bool overlap = false;
  size_t chunk_bytes = 0;  // every collective's (RunnerOptions::chunk_bytes; 0: the process's)

  // The ABI's arrays.
  tandem_args args{};
  std::vector<void*> buf;
  std::vector<double> acc;
  std::vector<int64_t> sym;
  std::vector<int64_t> seg;  // the segments' bounds (programs with segment ops)
  std::vector<uint64_t> seed;
  std::vector<int> root;       // stage -> the value owning its buffer
  std::vector<Tensor> owned;   // the buffers allocated here
  std::vector<Tensor> views;   // per owning value: its (first) buffer
  std::vector<size_t> bytes;   // per owning value: bytes allocated for it
  std::vector<char> scalar_bound;
  Tensor scratch;
  std::vector<std::pair<int, std::string>> unbound;  // buffers the caller binds (bind_target) and their names, not bound yet
  Tensor wide;  // reduce_in_f32: f32 copies of a 16-bit collective's buffer and of this rank's part
  bool reduce_in_f32 = false;
  tandem_entry_fn run_fn = nullptr;

  // A failure inside a callback, rethrown when the compiled code returns.
  std::mutex error_mutex;
  std::exception_ptr error;
  std::vector<comm::Request> sends;

  // The communication thread: a FIFO of the pipeline's collectives and transfers.
  struct Op {
    bool is_collective = true;
    tandem_collective c{};
    tandem_transfer t{};
    uint64_t seq = 0;
    std::chrono::steady_clock::time_point queued;
  };
  std::vector<CompiledRunner::QueuedOp>* queue_log = nullptr;  // record_queue's, written under `mutex`
  std::thread worker;
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<Op> ring;  // capacity fixed at setup
  size_t head = 0, tail = 0;
  uint64_t issued = 0, done = 0;
  bool stop = false, failed = false;
  std::vector<uint64_t> last_of_block;

  State(const Plan& p, comm::Communicator& comm, Allocator& base)
      : plan(p), prog(p.program), world(comm), alloc(comm::buffer_allocator(comm, base)) {}

  int find_named(std::string_view name, dsl::Op op, const char* what) const;
  void check_mine(int id, std::string_view name) const;
  Tensor view_of(int id) const;

  ~State() {
    if (worker.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mutex);
        stop = true;
      }
      cv.notify_all();
      worker.join();
    }
  }

  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(error_mutex);
    if (!error) error = std::move(e);
  }

  int world_rank(int g) const { return place.world_rank(g, place.index); }

  // -------------------------------------------------------------------------- collectives

  // Every collective of the plan runs through here, at the runner's chunk size
  // (RunnerOptions::chunk_bytes; 0: the process's).
  void run_desc(comm::CollectiveDesc d) {
    d.chunk_bytes = chunk_bytes;
    group->run(std::move(d));
  }

  void call_hook(const tandem_collective& c, void* chunk, int64_t n, int64_t g) {
    const int rc = c.hook(&args, chunk, n, g, c.block.index >= 0 ? &c.block : nullptr);
    if (rc != 0) {
      std::lock_guard<std::mutex> lock(error_mutex);
      if (error) std::rethrow_exception(error);
      internal_error(fmt::format("a compiled hook of step {} returned {}", c.step, rc));
    }
  }

  static comm::PartitionDesc partition_of(const tandem_collective& c) { return {c.outer, c.rows, c.inner}; }

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
    const int p = group->size(), r = place.index;
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
      run_desc({.kind = comm::CollectiveKind::AllReduce, .op = op, .send = view(w, DType::F32, n),
                .hook = std::move(hook), .partition = partition_of(c)});
      narrow(w, c.send, dt, n);
      return;
    }
    // The f32 part, packed after the whole; each reduced chunk is rounded into its place in the
    // output (packed, or in a whole-shaped buffer), then hooked there.
    void* whole = c.recv == nullptr ? c.send : (c.recv_whole ? c.recv : nullptr);
    float* part = w + n;
    const int64_t count = c.outer * fx::part_count(c.rows, p, r) * c.inner;
    comm::ChunkHook hook = [&](const Tensor& chunk, int64_t off) {
      void* mine = whole != nullptr ? bytes_at(whole, off, es) : bytes_at(c.recv, chunk.data_as<float>() - part, es);
      narrow(chunk.data_as<float>(), mine, dt, chunk.numel());
      if (c.hook != nullptr) call_hook(c, mine, chunk.numel(), c.index_base + off);
    };
    run_desc({.kind = comm::CollectiveKind::ReduceScatter, .op = op, .send = view(w, DType::F32, n),
              .recv = view(part, DType::F32, count), .hook = std::move(hook), .partition = partition_of(c)});
  }

  // One collective of the compiled code, its [outer, rows, inner] partition handed to comm/.
  void run_collective(const tandem_collective& c) {
    const DType dt = dtype_of(c.dtype);
    const int64_t n = c.outer * c.rows * c.inner;
    const int p = group->size(), r = place.index;
    if (reduce_in_f32 && dt != DType::F32 && (c.kind == 0 || c.kind == 1)) return run_wide(c);
    comm::CollectiveDesc d{comm::CollectiveKind::AllReduce};
    d.op = reduce_op_of_code(c.op);
    d.partition = partition_of(c);
    if (c.hook != nullptr && (c.kind == 0 || c.kind == 1))
      d.hook = [this, &c](const Tensor& chunk, int64_t offset) { call_hook(c, chunk.data(), chunk.numel(), c.index_base + offset); };
    const int64_t count = c.outer * fx::part_count(c.rows, p, r) * c.inner;  // this rank's part, packed
    switch (c.kind) {
      case 0:  // all_reduce
        d.send = view(c.send, dt, n);
        break;
      case 1:  // reduce_scatter: into a packed part, or into its place in a whole-shaped buffer (the input itself
               // when recv is null)
        d.kind = comm::CollectiveKind::ReduceScatter;
        d.send = view(c.send, dt, n);
        d.recv = c.recv == nullptr ? d.send : (c.recv_whole ? view(c.recv, dt, n) : view(c.recv, dt, count));
        break;
      case 2:  // all_gather: from a packed part, or from the output itself (send null: the part in place)
        d.kind = comm::CollectiveKind::AllGather;
        d.recv = view(c.recv, dt, n);
        d.send = c.send != nullptr ? view(c.send, dt, count) : d.recv;
        break;
      case 3:  // broadcast
        if (c.root < 0 || c.root >= p)
          user_error("program '{}', step {}: Broadcast root {} is outside the group of {} ranks; the root is a rank index "
                     "within the group, 0 to {}", prog.name(), c.step, c.root, p, p - 1);
        run_desc({.kind = comm::CollectiveKind::Broadcast, .send = view(c.send, dt, n), .root = c.root});
        return;
      default: internal_error(fmt::format("collective kind {} from compiled step {}", c.kind, c.step));
    }
    run_desc(std::move(d));
  }

  void run_transfer(const tandem_transfer& t) {
    const int peer = world_rank(t.peer_group);
    // Bytes travel as 2-byte elements: every dtype's size is a multiple of 2.
    const Tensor data = view(t.data, DType::F16, t.bytes / 2);
    if (t.recv == 0) sends.push_back(world.isend(data, peer, t.tag));
    else world.irecv(data, peer, t.tag).wait();
  }

  // -------------------------------------------------------------------------- the worker

  void enqueue(Op op) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      TANDEM_CHECK(tail - head < ring.size(), "communication queue of {} ops is full", ring.size());
      op.seq = ++issued;
      if (queue_log != nullptr) op.queued = std::chrono::steady_clock::now();
      const int32_t b = op.is_collective ? op.c.block.index : op.t.block;
      if (b >= 0 && static_cast<size_t>(b) < last_of_block.size()) last_of_block[static_cast<size_t>(b)] = op.seq;
      ring[tail % ring.size()] = op;
      ++tail;
    }
    cv.notify_all();
  }

  void work() {
    for (;;) {
      Op op;
      {
        std::unique_lock<std::mutex> lock(mutex);
        cv.wait(lock, [&] { return stop || head != tail; });
        if (head == tail) return;  // stopping with nothing queued
        op = ring[head % ring.size()];
      }
      bool ok = true;
      const auto began = std::chrono::steady_clock::now();
      if (!failed) {
        try {
          if (op.is_collective) run_collective(op.c);
          else run_transfer(op.t);
        } catch (...) {
          fail(std::current_exception());
          ok = false;
        }
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (queue_log != nullptr)
          queue_log->push_back({op.is_collective ? op.c.block.index : op.t.block, op.queued, began,
                                std::chrono::steady_clock::now()});
        ++head;
        done = op.seq;
        if (!ok) failed = true;
      }
      cv.notify_all();
    }
  }

  // Waits for the queued work of blocks <= b (b < 0: all of it, then forgets the blocks).
  int sync(int32_t b) {
    if (!overlap) return 0;
    std::unique_lock<std::mutex> lock(mutex);
    uint64_t target = issued;
    if (b >= 0) {
      target = 0;
      for (int32_t i = 0; i <= b && static_cast<size_t>(i) < last_of_block.size(); ++i)
        target = std::max(target, last_of_block[static_cast<size_t>(i)]);
    }
    cv.wait(lock, [&] { return done >= target || failed; });
    if (b < 0) std::fill(last_of_block.begin(), last_of_block.end(), 0);
    return failed ? 1 : 0;
  }

  void drain() {
    if (!overlap) return;
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return head == tail; });
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

namespace {

bool mine(const dsl::Stage& s, const Placement& pl) { return s.type.group == dsl::kAllGroups || s.type.group == pl.group; }

// A Block value's buffer: this rank's part of every block of its pipeline, one after the other
// (codegen/abi.h): for a row-sliced value, the sum of its part of each block's rows; otherwise
// every row, as a Slice.
Shape block_shape(const Plan& plan, int id, const std::vector<Shape>& global, int p, int r) {
  const Shape& g = global[static_cast<size_t>(id)];
  const dsl::Layout l = plan.program.stage(id).type.layout;
  if (l.dim != 0 || g.rank() == 0) return dsl::local_shape(g, l, p, r);
  for (const Step& s : plan.steps) {
    if (s.kind != StepKind::Pipeline) continue;
    const auto& v = s.pipeline.values;
    if (std::find(v.begin(), v.end(), id) == v.end()) continue;
    const int64_t rows = global[static_cast<size_t>(v[0])][0];
    int64_t mine = 0;
    for (int b = 0; b < s.pipeline.blocks; ++b) mine += dsl::part_count(dsl::part_count(rows, s.pipeline.blocks, b), p, r);
    const int64_t inner = g[0] == 0 ? 0 : g.numel() / g[0];
    return Shape{mine * inner};
  }
  internal_error(fmt::format("block value {} outside every pipeline", plan.program.display_name(id)));
}

}  // namespace

CompiledRunner::CompiledRunner(const Plan& plan, comm::Communicator& comm, const dsl::SymbolMap& symbols,
                               Allocator& alloc, CompiledOptions options)
    : CompiledRunner(compile_plan(plan), comm, symbols, with_allocator(alloc), options) {}

CompiledRunner::CompiledRunner(std::shared_ptr<const CompiledPlan> compiled, comm::Communicator& comm,
                               const dsl::SymbolMap& symbols, const RunnerOptions& runner, CompiledOptions options)
    : compiled_(std::move(compiled)) {
  const Plan& plan = compiled_->plan();
  const dsl::Program& prog = plan.program;
  state_ = std::make_unique<State>(plan, comm, runner.alloc != nullptr ? *runner.alloc : host_allocator());
  State& s = *state_;
  s.chunk_bytes = runner.chunk_bytes;
  const int n = comm.size(), groups = prog.groups();
  if (n % groups != 0)
    user_error("plan '{}' of program '{}' has {} groups, but the communicator has {} ranks; run it on a multiple of {} "
               "ranks", plan.name, prog.name(), groups, n, groups);
  s.place = exec::placement(prog, comm);
  const std::vector<std::string> syms = prog.symbols();
  s.global = prog.resolve_shapes(symbols);
  for (const std::string& name : syms) s.sym.push_back(symbols.find(name)->second);
  if (s.place.groups > 1) {
    s.group_owned = comm.split(s.place.group, s.place.index);
    s.group = s.group_owned.get();
  } else {
    s.group = &comm;
  }
  const int p = s.place.group_size, r = s.place.index;
  for (const std::string& name : runner.bound) {
    const int id = schedule::bind_target(plan, name);
    if (mine(prog.stage(id), s.place)) s.unbound.emplace_back(id, name);
  }

  // Buffers: one per value that owns storage, in this rank's group (bound inputs: the caller's).
  const size_t nstages = prog.stages().size();
  s.buf.assign(nstages, nullptr);
  s.views.assign(nstages, Tensor());
  s.bytes.assign(nstages, 0);
  s.acc.assign(nstages * TANDEM_ACC_SLOTS, 0.0);
  s.seed.assign(nstages, 0);
  s.scalar_bound.assign(nstages, 0);
  s.root.assign(nstages, -1);
  for (size_t id = 0; id < nstages; ++id) {
    int rt = static_cast<int>(id);
    for (size_t hops = 0; plan.values[static_cast<size_t>(rt)].alias >= 0; ++hops) {
      TANDEM_CHECK(hops <= nstages, "alias cycle at stage {}", id);
      rt = plan.values[static_cast<size_t>(rt)].alias;
    }
    s.root[id] = rt;
  }
  for (size_t id = 0; id < nstages; ++id) {
    const schedule::Value& v = plan.values[id];
    const dsl::Stage& st = prog.stage(static_cast<int>(id));
    if (v.alias >= 0 || v.storage == Storage::None || !mine(st, s.place)) continue;
    Shape shape = schedule::stored_shape(plan, static_cast<int>(id), s.global, p, r);
    if (v.storage == Storage::Block) shape = block_shape(plan, static_cast<int>(id), s.global, p, r);
    if (std::any_of(s.unbound.begin(), s.unbound.end(), [&](const auto& u) { return u.first == static_cast<int>(id); })) {
      s.views[id] = Tensor::view_of(nullptr, st.type.dtype, shape);  // its shape, until bind()
      continue;
    }
    Tensor t = Tensor::zeros(st.type.dtype, shape, s.alloc);
    s.buf[id] = t.data();
    s.views[id] = t;
    s.bytes[id] = t.nbytes();
    s.owned.push_back(std::move(t));
    if (st.op == dsl::Op::Const) s.views[id].fill(static_cast<float>(st.attrs.value));
  }
  // Every stage points at its owner's buffers.
  for (size_t id = 0; id < nstages; ++id) {
    const size_t rt = static_cast<size_t>(s.root[id]);
    s.buf[id] = s.buf[rt];
  }
  // The f32 copies of reduce_in_f32, and the async queue.
  size_t wide = 0, async_ops = 0, max_blocks = 0, sends = 0;
  each_step(plan.steps, [&](const Step& st, int blocks) {
    if (st.kind == StepKind::Collective && mine(prog.stage(st.collective.stage), s.place)) {
      const size_t numel = static_cast<size_t>(s.global[static_cast<size_t>(st.collective.stage)].numel());
      if (st.collective.op == dsl::Op::AllReduce || st.collective.op == dsl::Op::ReduceScatter) wide = std::max(wide, numel);
    }
    // Inside a pipeline, communication may be queued: at most every block's of every such step.
    if (blocks > 0 && (st.kind == StepKind::Collective || st.kind == StepKind::Send || st.kind == StepKind::Recv))
      async_ops += static_cast<size_t>(blocks);
    if (st.kind == StepKind::Send) sends += static_cast<size_t>(std::max(1, blocks));
    max_blocks = std::max(max_blocks, static_cast<size_t>(blocks));
  });
  s.reduce_in_f32 = options.reduce_in_f32;
  if (s.reduce_in_f32) s.wide = Tensor::empty(DType::F32, Shape{static_cast<int64_t>(2 * wide)}, s.alloc);
  s.sends.reserve(sends);

  // The ABI.
  tandem_args& a = s.args;
  a.buf = s.buf.data();
  a.acc = s.acc.data();
  a.sym = s.sym.data();
  a.seed = s.seed.data();
  a.p = p;
  a.r = r;
  a.group = s.place.group;
  a.host = &s;
  a.collective = &State::on_collective;
  a.transfer = &State::on_transfer;
  a.sync = &State::on_sync;
  a.sgemm = &sgemm_trampoline;
  prog.check_segments(symbols, runner.segments);
  s.seg = runner.segments;
  a.seg = s.seg.data();
  a.nseg = s.seg.empty() ? 0 : static_cast<int64_t>(s.seg.size()) - 1;
  const JitModule& m = compiled_->module();
  s.run_fn = reinterpret_cast<tandem_entry_fn>(m.symbol("tandem_run"));
  auto scratch_fn = reinterpret_cast<tandem_scratch_fn>(m.symbol("tandem_scratch_elems"));
  s.scratch = Tensor::empty(DType::F32, Shape{std::max<int64_t>(1, scratch_fn(&a))}, s.alloc);
  a.scratch = s.scratch.data_as<float>();

  bool threads = options.overlap && max_blocks > 1;
  if (threads && comm.backend() == "mpi") threads = mpi_allows_threads();
  s.overlap = threads;
  if (threads) {
    s.ring.resize(std::max<size_t>(1, async_ops));
    s.last_of_block.assign(max_blocks, 0);
    s.worker = std::thread([&s] { s.work(); });
  }
}

CompiledRunner::~CompiledRunner() = default;

size_t CompiledRunner::allocated_bytes() const { return state_->alloc.peak_bytes(); }
bool CompiledRunner::overlapping() const { return state_->overlap; }

// ------------------------------------------------------------------------------- interface

int CompiledRunner::State::find_named(std::string_view name, dsl::Op op, const char* what) const {
  for (const dsl::Stage& st : prog.stages())
    if (st.name == name && (op == dsl::Op::Const || st.op == op)) return st.id;
  user_error("plan '{}': program '{}' has no {} named '{}'", plan.name, prog.name(), what, name);
}

void CompiledRunner::State::check_mine(int id, std::string_view name) const {
  if (!mine(prog.stage(id), place))
    user_error("plan '{}': '{}' belongs to group {}, and this rank is in group {}", plan.name, name,
               prog.stage(id).type.group, place.group);
}

// This rank's stored piece of value `id`, shaped as its local shape.
Tensor CompiledRunner::State::view_of(int id) const {
  const int rt = root[static_cast<size_t>(id)];
  const Tensor& b = views[static_cast<size_t>(rt)];
  TANDEM_CHECK(b.defined(), "value {} has no buffer on this rank",
               prog.display_name(id));
  const dsl::Stage& st = prog.stage(id);
  const Shape local = dsl::local_shape(global[static_cast<size_t>(id)], st.type.layout, place.group_size, place.index);
  const Storage mine_s = plan.values[static_cast<size_t>(id)].storage, root_s = plan.values[static_cast<size_t>(rt)].storage;
  if (mine_s == root_s) return b.reshape(local);
  TANDEM_CHECK(mine_s == Storage::Slice && root_s == Storage::Full, "view of {} in {}", prog.display_name(id),
               prog.display_name(rt));
  const Shape& g = global[static_cast<size_t>(id)];
  const int d = st.type.layout.dim;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < g.rank(); ++i) {
    if (i < d) outer *= g[i];
    if (i > d) inner *= g[i];
  }
  TANDEM_CHECK(outer == 1, "a slice along dim {} of {} is not contiguous", d, g.str());
  const int64_t off = dsl::part_offset(g[d], place.group_size, place.index);
  return b.reshape(Shape{b.numel()}).flat_slice(off * inner, local.numel()).reshape(local);
}

Tensor CompiledRunner::input(std::string_view name) const {
  const int id = state_->find_named(name, dsl::Op::Input, "input");
  state_->check_mine(id, name);
  return state_->view_of(id);
}

const dsl::Program& CompiledRunner::program() const { return state_->prog; }
const Placement& CompiledRunner::placement() const { return state_->place; }

// The input's buffer becomes the caller's memory, for every value that lives in it.
void CompiledRunner::bind(std::string_view name, const Tensor& memory) {
  State& s = *state_;
  const int id = schedule::bind_target(s.plan, name);
  s.check_mine(id, name);
  const size_t sid = static_cast<size_t>(id);
  const Storage st = s.plan.values[sid].storage;
  TANDEM_CHECK(s.root[sid] == id && (st == Storage::Full || st == Storage::Slice),
               "plan '{}': '{}' owns no buffer of its own", s.plan.name, name);
  const Tensor& stored = s.views[sid];
  s.views[sid] = checked_binding(s.prog.name(), name, stored.shape(), stored.dtype(), memory);
  for (size_t k = 0; k < s.root.size(); ++k)
    if (s.root[k] == id) s.buf[k] = s.views[sid].data();
  std::erase_if(s.unbound, [&](const auto& u) { return u.first == id; });
}

void CompiledRunner::load(std::string_view name, const Tensor& value) {
  const State& s = *state_;
  const int id = s.find_named(name, dsl::Op::Input, "input");
  s.check_mine(id, name);
  const Tensor dst = s.view_of(id);
  const dsl::Stage& st = s.prog.stage(id);
  if (value.dtype() != dst.dtype())
    user_error("plan '{}': input '{}' is {}, given {}", s.plan.name, name, dtype_name(dst.dtype()), value.str());
  if (value.shape() == dst.shape()) {
    if (value.nbytes() > 0) std::memcpy(dst.data(), value.data(), value.nbytes());
    return;
  }
  if (st.type.layout.is_sliced() && value.shape() == s.global[static_cast<size_t>(id)]) {
    const Tensor part = piece_of(value, st.type.layout, s.place.group_size, s.place.index);
    if (part.nbytes() > 0) std::memcpy(dst.data(), part.data(), part.nbytes());
    return;
  }
  user_error("plan '{}': input '{}' is stored as {} on this rank (global {} {}); given {}", s.plan.name, name, dst.str(),
             s.global[static_cast<size_t>(id)].str(), st.type.layout.str(), value.str());
}

void CompiledRunner::set_scalar(std::string_view name, double value) {
  State& s = *state_;
  const int id = s.find_named(name, dsl::Op::Scalar, "scalar");
  const size_t sid = static_cast<size_t>(id);
  const bool integral = value >= 0.0 && value < 9007199254740992.0 && std::floor(value) == value;
  for (int user : s.prog.users(id))
    if (s.prog.stage(user).op == dsl::Op::Dropout && s.prog.stage(user).args[1] == id && !integral)
      user_error("plan '{}': scalar '{}' = {} keys a dropout mask, so it must be an integer in [0, 2^53)", s.plan.name,
                 name, value);
  s.seed[sid] = integral ? static_cast<uint64_t>(value) : 0;
  s.scalar_bound[sid] = 1;
  if (s.buf[sid] != nullptr) store_from_f32(s.buf[sid], s.prog.stage(id).type.dtype, 0, static_cast<float>(value));
}

Tensor CompiledRunner::output(std::string_view name) const {
  const State& s = *state_;
  for (const dsl::Output& o : s.prog.outputs())
    if (o.name == name) {
      s.check_mine(o.stage, name);
      return s.view_of(o.stage);
    }
  user_error("plan '{}': program '{}' has no output '{}'", s.plan.name, s.prog.name(), name);
}

CompiledRunner::Piece CompiledRunner::piece(std::string_view name) const {
  const State& s = *state_;
  int id = -1;
  for (const dsl::Output& o : s.prog.outputs())
    if (o.name == name) id = o.stage;
  if (id < 0) id = s.find_named(name, dsl::Op::Const, "value");
  Piece pc;
  const dsl::Stage& st = s.prog.stage(id);
  const Shape& g = s.global[static_cast<size_t>(id)];
  if (st.type.layout.is_sliced() && s.plan.values[static_cast<size_t>(id)].storage == Storage::Slice) {
    pc.dim = st.type.layout.dim;
    pc.offset = dsl::part_offset(g[pc.dim], s.place.group_size, s.place.index);
    pc.count = dsl::part_count(g[pc.dim], s.place.group_size, s.place.index);
  } else {
    pc.count = g.rank() > 0 ? g[0] : 1;
  }
  return pc;
}

size_t CompiledRunner::allocated_bytes(std::string_view name) const {
  const State& s = *state_;
  int id = -1;
  for (const dsl::Output& o : s.prog.outputs())
    if (o.name == name) id = o.stage;
  if (id < 0) id = s.find_named(name, dsl::Op::Const, "value");
  return s.bytes[static_cast<size_t>(id)];
}

// ------------------------------------------------------------------------------------- run

void CompiledRunner::record_queue(std::vector<QueuedOp>* log) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->queue_log = log;
}

void CompiledRunner::run() {
  run_leaving_sends();
  wait_sends();
}

void CompiledRunner::wait_sends() {
  State& s = *state_;
  comm::wait_all(s.sends);
}

void CompiledRunner::run_leaving_sends() {
  State& s = *state_;
  if (!s.unbound.empty())
    user_error("plan '{}': '{}' is to be bound, and is not; call bind first", s.plan.name, s.unbound.front().second);
  for (int id : s.prog.scalars())
    if (mine(s.prog.stage(id), s.place) && !s.scalar_bound[static_cast<size_t>(id)])
      user_error("plan '{}': scalar '{}' is not bound; call set_scalar first", s.plan.name, s.prog.display_name(id));
  const int rc = s.run_fn(&s.args);
  s.drain();
  if (rc != 0) {
    // The run's failure first: its sends are waited for (and their own failures dropped), so
    // that none is left reading memory the caller may free.
    try {
      comm::wait_all(s.sends);
    } catch (...) {
    }
    std::exception_ptr e;
    {
      std::lock_guard<std::mutex> lock(s.error_mutex);
      e = s.error;
      s.error = nullptr;
    }
    {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.failed = false;
    }
    if (e) std::rethrow_exception(e);
    internal_error(fmt::format("compiled plan '{}' returned {} without an error", s.plan.name, rc));
  }
}

}  // namespace tandem::exec
