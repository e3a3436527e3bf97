// The plan runner: a lowered schedule walked step by step, with the reference interpreter's
// arithmetic, the communicator's chunked collectives, and every buffer from one allocator.
#include "tandem/exec/plan_runner.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "plan_storage.h"
#include "tandem/core/blas.h"
#include "tandem/core/error.h"
#include "tandem/dsl/elementwise.h"

namespace tandem::exec {

using dsl::Op;
using dsl::Stage;
using schedule::Collective;
using schedule::Domain;
using schedule::Loop;
using schedule::Partition;
using schedule::Plan;
using schedule::Step;
using schedule::StepKind;
using schedule::Storage;

namespace {

float round_to(DType t, float v) {
  switch (t) {
    case DType::F32:
      return v;
    case DType::BF16:
      return bf16_to_f32(f32_to_bf16(v));
    case DType::F16:
      return f16_to_f32(f32_to_f16(v));
  }
  return v;
}

// Where a step runs: the whole of every value, or one row block of a pipeline.
struct Ctx {
  bool blocked = false;
  int block = 0;
  int64_t b0 = 0, bc = 0;  // rows [b0, b0 + bc) of dim 0
};

}  // namespace

class PlanRunner::Impl {
 public:
  Impl(const Plan& plan, comm::Communicator& world, const dsl::SymbolMap& symbols,
       const RunnerOptions& options)
      : plan_(plan),
        p_(plan.program),
        store_(plan, world, symbols, options),
        chunk_bytes_(options.chunk_bytes),
        group_size_(store_.placement().group_size),
        index_(store_.placement().index) {
    const size_t ns = p_.stages().size();
    regs_.assign(ns, 0.0f);
    accs_.assign(ns, 0.0f);
    sums_.assign(ns, dsl::SumLanes{});
    in_loop_.assign(ns, 0);
    for (const Step& s : plan.steps) scan(s);
    allocate_scratch();
  }

  PlanStorage& store() { return store_; }
  const PlanStorage& store() const { return store_; }

  // Runs the plan; its sends are waited for here unless `leave_sends` (wait_sends() then).
  void run(bool leave_sends) {
    store_.check_ready();
    for (const Step& s : plan_.steps) {
      if (!mine(s.group)) continue;
      step(s, Ctx{});
    }
    if (!leave_sends) wait_sends();
  }

  void wait_sends() { comm::wait_all(sends_); }

 private:
  // ----------------------------------------------------------------------------------- setup

  const Shape& shape(int id) const { return store_.shape(id); }
  const schedule::Value& value_of(int id) const { return store_.value(id); }
  int root(int id) const { return store_.root(id); }
  bool mine(int group) const { return store_.placement().holds(group); }
  Shape local(int id) const { return store_.local(id); }
  Tensor view(int id) const { return store_.view(id); }
  const Tensor& buffer(int id) const { return store_.buffer(id); }

  // Notes what each step needs: loop membership, Block values and their pipelines, scratch sizes.
  void scan(const Step& s) {
    auto need_work = [&](int64_t n) { work_elems_ = std::max(work_elems_, n); };
    switch (s.kind) {
      case StepKind::Loop:
        for (int x : s.loop.stages) in_loop_[static_cast<size_t>(x)] = 1;
        break;
      case StepKind::Collective:
        if (s.collective.fused)
          for (int x : s.collective.fused->stages) in_loop_[static_cast<size_t>(x)] = 1;
        if (mine(s.group) &&
            (s.collective.op == Op::AllReduce || s.collective.op == Op::ReduceScatter)) {
          need_work(shape(s.collective.operand).numel());
          part_elems_ = std::max(part_elems_, shape(s.collective.operand).numel());
        }
        break;
      case StepKind::Reduce:
        if (mine(s.group))
          reduce_elems_ = std::max({reduce_elems_, local(s.reduce.stage).numel(), int64_t{1}});
        break;
      case StepKind::Matmul:
        if (mine(s.group)) matmul_stages_.push_back(s.matmul.stage);
        break;
      case StepKind::Pipeline:
        for (int v : s.pipeline.values) blocks_of_[v] = s.pipeline.blocks;
        for (const Step& b : s.pipeline.body) scan(b);
        break;
      default:
        break;
    }
  }

  // Scratch, from the storage's allocator (counted in allocated_bytes()).
  Tensor scratch(const Shape& shape) {
    return Tensor::empty(DType::F32, shape, store_.allocator());
  }

  // Rows of Block value v over all blocks (its region for block b starts at block_base(v, b)).
  int64_t block_rows(int v, int b) const {
    const int blocks = blocks_of_.at(v);
    const int64_t rows = shape(v)[0];
    return dsl::part_count(dsl::part_count(rows, blocks, b), group_size_, index_);
  }
  int64_t inner_of(int v) const {
    return shape(v).rank() == 0 || shape(v)[0] == 0 ? 1 : shape(v).numel() / shape(v)[0];
  }
  int64_t block_base(int v, int b) const {
    int64_t rows = 0;
    for (int i = 0; i < b; ++i) rows += block_rows(v, i);
    return rows * inner_of(v);
  }

  void allocate_scratch() {
    if (work_elems_ > 0) work_ = scratch(Shape{work_elems_});
    if (part_elems_ > 0) part_ = scratch(Shape{part_elems_});
    if (reduce_elems_ > 0) reduce_ = scratch(Shape{reduce_elems_});
    one_ = scratch(Shape{1});
    for (int mm : matmul_stages_) {
      const Stage& s = p_.stage(mm);
      Matmul m;
      m.a = scratch(local(s.args[0]));
      m.b = scratch(local(s.args[1]));
      m.c = scratch(local(s.id));
      matmuls_[mm] = std::move(m);
    }
  }

  // -------------------------------------------------------------------------------- indexing

  // How a loop reads or writes a value at global flat index g of the loop's shape.
  struct Access {
    enum Kind : uint8_t { Const, Reg, Chunk, Mem } kind = Mem;
    float constant = 0;
    int reg = -1;
    void* data = nullptr;
    DType dtype = DType::F32;
    enum Map : uint8_t { Direct, Mod, Shift, SliceMap, Segment } map = Direct;
    int64_t mod = 1, shift = 0;
    int64_t rows = 1, inner = 1, off = 0, cnt = 0;
    const dsl::Segments* segments = nullptr;  // Segment: a per-segment vector read at g's segment
    int64_t index(int64_t g) const {
      switch (map) {
        case Direct:
          return g;
        case Segment:
          return dsl::segment_of(*segments, g);
        case Mod:
          return g % mod;
        case Shift:
          return g - shift;
        case SliceMap:
          return fx::part_index(g, rows * inner, inner, off, cnt);
      }
      return g;
    }
    float load(int64_t g) const { return load_as_f32(data, dtype, static_cast<size_t>(index(g))); }
    void store(int64_t g, float v) const {
      store_from_f32(data, dtype, static_cast<size_t>(index(g)), v);
    }
  };

  // The memory access of value x from a loop over `loop_numel` elements, in context c.
  Access memory(int x, const Ctx& c, int64_t loop_numel) const {
    Access a;
    const int r = root(x);
    a.data = buffer(r).data();
    a.dtype = p_.stage(x).type.dtype;
    TANDEM_CHECK(buffer(r).defined(), "value {} read but not stored", p_.display_name(x));
    const Shape& s = shape(x);
    if (s.rank() == 0) {
      a.map = Access::Mod;
      a.mod = 1;
      return a;
    }
    switch (value_of(r).storage) {
      case Storage::Full:
        if (s.numel() != loop_numel && s.numel() > 0) {
          a.map = Access::Mod;
          a.mod = s.numel();
        }
        return a;
      case Storage::Slice: {
        const int d = p_.stage(r).type.layout.dim;
        const Around ar = around(s, d);
        a.off = dsl::part_offset(ar.rows, group_size_, index_);
        a.cnt = dsl::part_count(ar.rows, group_size_, index_);
        if (ar.outer == 1) {
          a.map = Access::Shift;
          a.shift = a.off * ar.inner;
        } else {
          a.map = Access::SliceMap;
          a.rows = ar.rows;
          a.inner = ar.inner;
        }
        return a;
      }
      case Storage::Block: {
        TANDEM_CHECK(c.blocked, "Block value {} read outside its pipeline", p_.display_name(x));
        const int64_t start = c.b0 + dsl::part_offset(c.bc, group_size_, index_);
        a.map = Access::Shift;
        a.shift = start * inner_of(r) - block_base(r, c.block);
        return a;
      }
      case Storage::None:
        break;
    }
    internal_error(fmt::format("value {} has no storage", p_.display_name(x)));
  }

  Access operand(int a, const Ctx& c, int64_t loop_numel, int collective) const {
    Access acc;
    const Stage& s = p_.stage(a);
    if (a == collective) {
      acc.kind = Access::Chunk;
      acc.dtype = s.type.dtype;
      return acc;
    }
    if (s.op == Op::Const) {
      acc.kind = Access::Const;
      acc.constant = static_cast<float>(s.attrs.value);
      return acc;
    }
    if (in_current_[static_cast<size_t>(a)]) {
      acc.kind = Access::Reg;
      acc.reg = a;
      return acc;
    }
    return memory(a, c, loop_numel);
  }

  // ----------------------------------------------------------------------------------- loops

  struct Compiled {
    struct Item {
      int stage;
      bool accumulate;
      Op op;
      DType dtype;
      int nvals;
      Access args[3];
      bool store;
      Access out;
      uint64_t seed;
      double p;
      dsl::ReduceOp reduce;
    };
    std::vector<Item> items;
  };

  // Prepares a loop: its stages and accumulators in evaluation order, with their accesses.
  Compiled compile(const Loop& l, const Ctx& c, int collective) {
    const int64_t numel = dsl::SymShape(l.shape).rank() == 0 ? 1 : loop_numel(l);
    for (int x : l.stages) in_current_[static_cast<size_t>(x)] = 1;
    std::vector<int> order = l.stages;
    order.insert(order.end(), l.accumulates.begin(), l.accumulates.end());
    std::sort(order.begin(), order.end());
    Compiled out;
    for (int x : order) {
      const Stage& s = p_.stage(x);
      Compiled::Item it;
      it.stage = x;
      it.accumulate =
          std::find(l.accumulates.begin(), l.accumulates.end(), x) != l.accumulates.end();
      it.op = s.op;
      it.dtype = s.type.dtype;
      it.seed = 0;
      it.p = s.attrs.value;
      it.reduce = s.op == Op::Norm ? dsl::ReduceOp::Sum : s.attrs.reduce;
      if (it.accumulate) {
        it.nvals = 1;
        it.args[0] = operand(s.args[0], c, numel, collective);
        it.store = false;
      } else if (s.op == Op::Update) {
        it.nvals = 1;
        it.args[0] = operand(s.args[1], c, numel, collective);
        it.store = std::find(l.stores.begin(), l.stores.end(), x) != l.stores.end();
      } else {
        it.nvals = s.op == Op::Dropout ? 1 : static_cast<int>(s.args.size());
        for (int j = 0; j < it.nvals; ++j)
          it.args[j] = operand(s.args[static_cast<size_t>(j)], c, numel, collective);
        if (s.op == Op::Dropout) it.seed = store_.seed(s.args[1]);
        if (s.op == Op::SegmentScale) {  // the factors are read at the element's segment
          it.args[0].map = Access::Segment;
          it.args[0].segments = &store_.segments();
        }
        it.store = std::find(l.stores.begin(), l.stores.end(), x) != l.stores.end();
      }
      if (it.store) it.out = memory(x, c, numel);
      out.items.push_back(it);
    }
    for (int x : l.stages) in_current_[static_cast<size_t>(x)] = 0;
    return out;
  }

  int64_t loop_numel(const Loop& l) const {
    int64_t n = 1;
    for (const dsl::Dim& d : l.shape.dims) n *= d.is_symbol() ? symbol_value(d.symbol) : d.value;
    return n;
  }
  int64_t symbol_value(const std::string& name) const {
    // Every loop's shape is some stage's shape: find the symbol's value through the stages.
    for (const Stage& s : p_.stages())
      for (int i = 0; i < s.type.shape.rank(); ++i)
        if (s.type.shape[i].is_symbol() && s.type.shape[i].symbol == name) return shape(s.id)[i];
    internal_error("symbol " + name + " not found");
  }

  // One element: computes every item at global index g; `cval` is the collective's value there.
  void element(const Compiled& k, int64_t g, float cval) {
    float v[3] = {0, 0, 0};
    for (const Compiled::Item& it : k.items) {
      for (int j = 0; j < it.nvals; ++j) {
        const Access& a = it.args[j];
        switch (a.kind) {
          case Access::Const:
            v[j] = a.constant;
            break;
          case Access::Reg:
            v[j] = regs_[static_cast<size_t>(a.reg)];
            break;
          case Access::Chunk:
            v[j] = cval;
            break;
          case Access::Mem:
            v[j] = a.load(g);
            break;
        }
      }
      if (it.accumulate) {
        if (it.op == Op::Norm) {
          sums_[static_cast<size_t>(it.stage)].add_square(static_cast<uint64_t>(g), v[0]);
        } else if (it.reduce == dsl::ReduceOp::Sum) {
          sums_[static_cast<size_t>(it.stage)].add(static_cast<uint64_t>(g), v[0]);
        } else {
          float& acc = accs_[static_cast<size_t>(it.stage)];
          acc = dsl::reduce_combine(it.reduce, acc, v[0]);
        }
        continue;
      }
      float r;
      switch (it.op) {
        case Op::Update:
          r = v[0];
          break;
        case Op::Select:
          r = dsl::apply_select(v[0], v[1], v[2]);
          break;
        case Op::Dropout:
          r = dsl::apply_dropout(v[0], it.seed, static_cast<uint64_t>(g), it.p);
          break;
        case Op::SegmentScale:
          r = dsl::apply_binary(Op::Mul, v[0], v[1]);
          break;
        default:
          r = dsl::is_unary(it.op) ? dsl::apply_unary(it.op, v[0])
                                   : dsl::apply_binary(it.op, v[0], v[1]);
      }
      r = round_to(it.dtype, r);
      regs_[static_cast<size_t>(it.stage)] = r;
      if (it.store) it.out.store(g, r);
    }
  }

  void start_accumulators(const Loop& l) {
    for (int a : l.accumulates) {
      const Stage& s = p_.stage(a);
      accs_[static_cast<size_t>(a)] =
          dsl::reduce_identity(s.op == Op::Norm ? dsl::ReduceOp::Sum : s.attrs.reduce);
      sums_[static_cast<size_t>(a)] = dsl::SumLanes{};
    }
  }

  // A Full or Slice loop, over the whole value or one block's rows.
  void run_loop(const Loop& l, const Ctx& c) {
    start_accumulators(l);
    const Compiled k = compile(l, c, -1);
    if (l.shape.rank() == 0) {
      element(k, 0, 0.0f);
      return;
    }
    const int64_t numel = loop_numel(l);
    const int64_t rows0 = shape_rows(l);
    const int64_t inner0 = rows0 == 0 ? 0 : numel / rows0;
    if (l.domain == Domain::Full) {
      const int64_t b = c.blocked ? c.b0 * inner0 : 0,
                    e = c.blocked ? (c.b0 + c.bc) * inner0 : numel;
      for (int64_t g = b; g < e; ++g) element(k, g, 0.0f);
      return;
    }
    TANDEM_CHECK(l.domain == Domain::Slice, "a chunk loop outside its collective");
    if (c.blocked) {
      TANDEM_CHECK(l.dim == 0, "a blocked loop sliced along dim {}", l.dim);
      const int64_t start = c.b0 + dsl::part_offset(c.bc, group_size_, index_);
      const int64_t cnt = dsl::part_count(c.bc, group_size_, index_);
      for (int64_t g = start * inner0; g < (start + cnt) * inner0; ++g) element(k, g, 0.0f);
      return;
    }
    // This rank's part along l.dim, in the order of its stored elements.
    std::vector<int64_t> dims;
    for (const dsl::Dim& d : l.shape.dims)
      dims.push_back(d.is_symbol() ? symbol_value(d.symbol) : d.value);
    const Shape full(std::move(dims));
    const Around a = around(full, l.dim);
    const int64_t off = dsl::part_offset(a.rows, group_size_, index_),
                  cnt = dsl::part_count(a.rows, group_size_, index_);
    for (int64_t o = 0; o < a.outer; ++o)
      for (int64_t row = 0; row < cnt; ++row)
        for (int64_t in = 0; in < a.inner; ++in)
          element(k, (o * a.rows + off + row) * a.inner + in, 0.0f);
  }

  int64_t shape_rows(const Loop& l) const {
    const dsl::Dim& d = l.shape.dims.front();
    return d.is_symbol() ? symbol_value(d.symbol) : d.value;
  }

  // Completes an accumulator (a sum's lanes rounded to f32 once), across the group's ranks when
  // its loop ran on a part.
  void finish(const schedule::Finish& f) {
    const Stage& s = p_.stage(f.stage);
    const bool sum = s.op == Op::Norm || s.attrs.reduce == dsl::ReduceOp::Sum;
    float acc =
        sum ? sums_[static_cast<size_t>(f.stage)].total() : accs_[static_cast<size_t>(f.stage)];
    if (f.across_ranks) {
      one_.set(0, acc);
      run_desc({.kind = comm::CollectiveKind::AllReduce,
                .op = s.op == Op::Norm ? ReduceOp::Sum : s.attrs.reduce,
                .send = one_});
      acc = one_.get(0);
    }
    if (s.op == Op::Norm) acc = std::sqrt(acc);
    buffer(f.stage).set(0, acc);
  }

  // A reduction over one dim, as the reference interpreter computes it.
  void reduce(const schedule::Reduce& r) {
    const Stage& s = p_.stage(r.stage);
    const Tensor x = view(s.args[0]);
    const Tensor out = view(r.stage);
    if (s.op == Op::SegmentNorm) return segment_norm(r, x, out);
    const Around a = around(x.shape(), s.attrs.dim);
    // f32 partials in the output's first elements' place: computed into `work_`.
    TANDEM_CHECK(reduce_.defined() || out.numel() == 0, "reduce without scratch");
    Tensor part = reduce_.flat_slice(0, out.numel()).reshape(out.shape());
    for (int64_t o = 0; o < a.outer; ++o)
      for (int64_t in = 0; in < a.inner; ++in) {
        float acc = dsl::reduce_identity(s.attrs.reduce);
        for (int64_t k = 0; k < a.rows; ++k)
          acc = dsl::reduce_combine(s.attrs.reduce, acc, x.get((o * a.rows + k) * a.inner + in));
        part.set(o * a.inner + in, acc);
      }
    if (r.across_ranks && part.numel() > 0)
      run_desc({.kind = comm::CollectiveKind::AllReduce,
                .op = s.attrs.reduce,
                .send = part.reshape(Shape{part.numel()})});
    for (int64_t i = 0; i < out.numel(); ++i) out.set(i, part.get(i));
  }

  // Per segment: the squares of this rank's piece, one all-reduce of the partials when the
  // operand is Sliced, then the square roots (as the reference interpreter computes it).
  void segment_norm(const schedule::Reduce& r, const Tensor& x, const Tensor& out) {
    const Stage& s = p_.stage(r.stage);
    Tensor part = reduce_.flat_slice(0, out.numel());
    const int64_t begin =
        r.across_ranks ? dsl::part_offset(shape(s.args[0]).numel(), group_size_, index_) : 0;
    dsl::segment_sums_of_squares(x.data_as<float>(), begin, x.numel(), store_.segments(),
                                 part.data_as<float>());
    if (r.across_ranks) run_desc({.kind = comm::CollectiveKind::AllReduce, .send = part});
    for (int64_t i = 0; i < out.numel(); ++i) out.set(i, std::sqrt(part.get(i)));
  }

  // --------------------------------------------------------------------------------- matmul

  struct Matmul {
    Tensor a, b, c;
  };

  // f32 copy of value x's piece, or its part along `dim` when the partner is sliced there.
  void copy_f32(const Tensor& src, Tensor& dst, int dim, const Shape& global) {
    if (src.shape() == dst.shape()) {
      for (int64_t i = 0; i < src.numel(); ++i) dst.set(i, src.get(i));
      return;
    }
    const Around a = around(src.shape(), dim);
    const int64_t off = dsl::part_offset(global[dim], group_size_, index_), cnt = dst.shape()[dim];
    for (int64_t o = 0; o < a.outer; ++o)
      for (int64_t row = 0; row < cnt; ++row)
        for (int64_t in = 0; in < a.inner; ++in)
          dst.set((o * cnt + row) * a.inner + in, src.get((o * a.rows + off + row) * a.inner + in));
  }

  void matmul(const schedule::Matmul& mm, const Ctx& c) {
    const Stage& s = p_.stage(mm.stage);
    Matmul& m = matmuls_.at(mm.stage);
    const Stage& as = p_.stage(s.args[0]);
    const Stage& bs = p_.stage(s.args[1]);
    const int ra = as.type.shape.rank(), rb = bs.type.shape.rank();
    const dsl::Layout la = as.type.layout, lb = bs.type.layout;
    // A Replicated partner of a Sliced operand is read at this rank's slice of the dim they share.
    Shape a_shape = local(as.id), b_shape = local(bs.id);
    int a_dim = -1, b_dim = -1;
    if (la.is_sliced() && lb.is_replicated()) {
      if (la.dim == ra - 1)
        b_dim = rb - 2;
      else if (la.dim < ra - 2 && rb > 2)
        b_dim = la.dim;
    } else if (la.is_replicated() && lb.is_sliced()) {
      if (lb.dim == rb - 2)
        a_dim = ra - 1;
      else if (lb.dim < rb - 2 && ra > 2)
        a_dim = lb.dim;
    }
    auto part_shape = [&](Shape sh, int dim, const Shape& global) {
      if (dim < 0) return sh;
      std::vector<int64_t> d = sh.dims();
      d[static_cast<size_t>(dim)] = dsl::part_count(global[dim], group_size_, index_);
      return Shape(std::move(d));
    };
    a_shape = part_shape(a_shape, a_dim, shape(as.id));
    b_shape = part_shape(b_shape, b_dim, shape(bs.id));
    Tensor af = m.a.reshape(Shape{m.a.numel()}).flat_slice(0, a_shape.numel()).reshape(a_shape);
    Tensor bf = m.b.reshape(Shape{m.b.numel()}).flat_slice(0, b_shape.numel()).reshape(b_shape);
    const Tensor out = view(mm.stage);
    const int64_t mrows = a_shape[ra - 2], k = a_shape[ra - 1], n = b_shape[rb - 1];
    if (c.blocked) {
      TANDEM_CHECK(ra == 2 && rb == 2, "blocked batched matmul");
      // Rows [b0, b0 + bc) of A and of the output.
      const Tensor a_all = view(as.id);
      Tensor a_rows = a_all.reshape(Shape{a_all.numel()})
                          .flat_slice(c.b0 * a_all.shape()[1], c.bc * a_all.shape()[1]);
      Tensor a_dst = af.reshape(Shape{af.numel()}).flat_slice(0, c.bc * k).reshape(Shape{c.bc, k});
      if (a_dim < 0) {
        for (int64_t i = 0; i < a_rows.numel(); ++i) a_dst.set(i, a_rows.get(i));
      } else {
        copy_f32(a_rows.reshape(Shape{c.bc, a_all.shape()[1]}), a_dst, a_dim,
                 Shape{c.bc, shape(as.id)[1]});
      }
      if (c.block == 0) copy_f32(view(bs.id), bf, b_dim, shape(bs.id));
      Tensor cf = m.c.reshape(Shape{m.c.numel()}).flat_slice(0, c.bc * n);
      if (k > 0 && c.bc * n > 0)
        blas::sgemm(false, false, static_cast<int>(c.bc), static_cast<int>(n), static_cast<int>(k),
                    1.0f, a_dst.data_as<float>(), static_cast<int>(k), bf.data_as<float>(),
                    static_cast<int>(std::max<int64_t>(1, n)), 0.0f, cf.data_as<float>(),
                    static_cast<int>(std::max<int64_t>(1, n)));
      else
        cf.fill(0.0f);
      Tensor o = out.reshape(Shape{out.numel()}).flat_slice(c.b0 * n, c.bc * n);
      for (int64_t i = 0; i < o.numel(); ++i) o.set(i, cf.get(i));
      return;
    }
    copy_f32(view(as.id), af, a_dim, shape(as.id));
    copy_f32(view(bs.id), bf, b_dim, shape(bs.id));
    m.c.fill(0.0f);
    const int64_t batches = out.numel() / std::max<int64_t>(1, mrows * n);
    const bool a_batched = ra > 2, b_batched = rb > 2;
    if (k > 0)
      for (int64_t i = 0; i < batches && mrows * n > 0; ++i)
        blas::sgemm(false, false, static_cast<int>(mrows), static_cast<int>(n), static_cast<int>(k),
                    1.0f, af.data_as<float>() + (a_batched ? i * mrows * k : 0),
                    static_cast<int>(k), bf.data_as<float>() + (b_batched ? i * k * n : 0),
                    static_cast<int>(std::max<int64_t>(1, n)), 0.0f,
                    m.c.data_as<float>() + i * mrows * n,
                    static_cast<int>(std::max<int64_t>(1, n)));
    for (int64_t i = 0; i < out.numel(); ++i) out.set(i, m.c.get(i));
  }

  // ----------------------------------------------------------------------------- collectives

  // The contiguous elements of value x for context c: the whole stored piece, or the block's
  // rows (of a Full value) / the block's part (of a Block value).
  Tensor span(int x, const Ctx& c) const {
    const int r = root(x);
    const Storage st = value_of(r).storage;
    if (!c.blocked) {
      if (st == Storage::Block) internal_error("Block value outside a pipeline");
      const Tensor v = view(x);
      return v.reshape(Shape{v.numel()});
    }
    const int64_t inner = inner_of(x);
    const Tensor& b = buffer(r);
    const Storage xs = value_of(x).storage;
    if (xs == Storage::Full) return b.flat_slice(c.b0 * inner, c.bc * inner);
    if (st == Storage::Block)
      return b.flat_slice(block_base(r, c.block), block_rows(r, c.block) * inner);
    // A Slice inside a blocked Full buffer (in place): this rank's part of the block's rows.
    TANDEM_CHECK(st == Storage::Full, "a slice stored apart read inside a pipeline: {}",
                 p_.display_name(x));
    const int64_t start = c.b0 + dsl::part_offset(c.bc, group_size_, index_);
    return b.flat_slice(start * inner, dsl::part_count(c.bc, group_size_, index_) * inner);
  }

  // The global flat index of element 0 of context c's rows of a value (0 when not blocked).
  int64_t base_index(int x, const Ctx& c) const { return c.blocked ? c.b0 * inner_of(x) : 0; }

  // Copies `src` into `dst` element by element, converting dtypes.
  static void convert(const Tensor& src, const Tensor& dst) {
    TANDEM_CHECK(src.numel() == dst.numel(), "convert {} -> {}", src.str(), dst.str());
    if (src.dtype() == dst.dtype()) {
      if (src.data() != dst.data() && src.nbytes() > 0)
        std::memmove(dst.data(), src.data(), src.nbytes());
      return;
    }
    for (int64_t i = 0; i < src.numel(); ++i) dst.set(i, src.get(i));
  }

  // The shape of the rows a collective works on in context c.
  Shape block_shape(int x, const Ctx& c) const {
    if (!c.blocked) return shape(x);
    std::vector<int64_t> d = shape(x).dims();
    d[0] = c.bc;
    return Shape(std::move(d));
  }

  // Every collective of the plan runs through here, at the runner's chunk size
  // (RunnerOptions::chunk_bytes; 0: the process's).
  void run_desc(comm::CollectiveDesc d) {
    d.chunk_bytes = chunk_bytes_;
    store_.group().run(std::move(d));
  }

  void collective(const Collective& col, const Ctx& c) {
    switch (col.op) {
      case Op::AllReduce:
        return all_reduce(col, c);
      case Op::ReduceScatter:
        return reduce_scatter(col, c);
      case Op::AllGather:
        return all_gather(col, c);
      case Op::Broadcast: {
        const Tensor dst = span(col.stage, c);
        convert(span(col.operand, c), dst);
        run_desc({.kind = comm::CollectiveKind::Broadcast, .send = dst, .root = col.root});
        return;
      }
      case Op::Shift:
        run_desc({.kind = comm::CollectiveKind::Shift,
                  .send = span(col.operand, c),
                  .recv = span(col.stage, c)});
        return;
      default:
        internal_error("not a collective");
    }
  }

  // The hook of a fused collective: the loop on each reduced chunk. `value` is the collective's
  // reduced chunk in f32 (rounded to the stage's dtype when read); a carried value replaces it.
  comm::ChunkHook hook(const Collective& col, const Ctx& c, int64_t base, const Compiled* k) {
    if (!col.fused) return {};
    const DType dt = p_.stage(col.stage).type.dtype;
    const int carry = col.carry;
    return [this, k, base, dt, carry](const Tensor& chunk, int64_t offset) {
      float* data = chunk.data_as<float>();
      for (int64_t i = 0; i < chunk.numel(); ++i) {
        const int64_t g = base + offset + i;
        element(*k, g, round_to(dt, data[i]));
        if (carry >= 0) data[i] = regs_[static_cast<size_t>(carry)];
      }
    };
  }

  void all_reduce(const Collective& col, const Ctx& c) {
    const Stage& s = p_.stage(col.stage);
    const Tensor dst = value_of(col.stage).storage == Storage::None ? Tensor() : span(col.stage, c);
    const Tensor src = span(col.operand, c);
    // Reduce an f32 copy (the reference interpreter's rounding), in place when the value is f32.
    const bool direct = dst.defined() && s.type.dtype == DType::F32;
    Tensor work = direct ? dst : work_.flat_slice(0, src.numel());
    convert(src, work);
    std::optional<Compiled> k;
    if (col.fused) {
      start_accumulators(*col.fused);
      k = compile(*col.fused, c, col.stage);
    }
    run_desc({.kind = comm::CollectiveKind::AllReduce,
              .op = col.reduce,
              .send = work,
              .hook = hook(col, c, base_index(col.stage, c), k ? &*k : nullptr)});
    if (dst.defined() && !direct) convert(work, dst);
  }

  // The partition of a collective over `whole` (the rows it works on in this context): its Dim
  // partition as [outer, rows, inner], or the flat split.
  static comm::PartitionDesc partition_of(const Collective& col, const Shape& whole) {
    if (col.partition == Partition::Flat || whole.rank() == 0) return {};
    const Around a = around(whole, col.dim);
    return {a.outer, a.rows, a.inner};
  }

  void reduce_scatter(const Collective& col, const Ctx& c) {
    const Stage& s = p_.stage(col.stage);
    const Tensor src = span(col.operand, c);
    const Tensor dst = span(col.stage, c);  // this rank's part, packed
    std::optional<Compiled> k;
    if (col.fused) {
      start_accumulators(*col.fused);
      k = compile(*col.fused, c, col.stage);
    }
    const int64_t base = base_index(col.operand, c);
    Tensor in = work_.flat_slice(0, src.numel());
    convert(src, in);
    const bool direct = s.type.dtype == DType::F32;
    Tensor out = direct ? dst : part_.flat_slice(0, dst.numel());
    run_desc({.kind = comm::CollectiveKind::ReduceScatter,
              .op = col.reduce,
              .send = in,
              .recv = out,
              .hook = hook(col, c, base, k ? &*k : nullptr),
              .partition = partition_of(col, block_shape(col.operand, c))});
    if (!direct) convert(out, dst);
  }

  void all_gather(const Collective& col, const Ctx& c) {
    const Tensor dst = span(col.stage, c);
    if (col.operand < 0) {
      // Completing gather: this rank's flat part of its own buffer goes to every rank.
      const int64_t n = dst.numel();
      const Tensor part = dst.flat_slice(fx::part_offset(n, group_size_, index_),
                                         fx::part_count(n, group_size_, index_));
      run_desc({.kind = comm::CollectiveKind::AllGather, .send = part, .recv = dst});
      return;
    }
    run_desc({.kind = comm::CollectiveKind::AllGather,
              .send = span(col.operand, c),
              .recv = dst,
              .partition = partition_of(col, block_shape(col.stage, c))});
  }

  // ------------------------------------------------------------------------------ transfers

  int tag(int send_stage) const {
    if (send_stage > comm::kMaxUserTag)
      user_error("plan '{}': send {} is stage {}, beyond the {} stages whose sends can be tagged",
                 plan_.name, p_.display_name(send_stage), send_stage, comm::kMaxUserTag + 1);
    return send_stage;
  }

  void send(const schedule::Transfer& t, const Ctx& c) {
    const int peer = t.peer_group * group_size_ + index_;
    sends_.push_back(store_.world().isend(span(t.value, c), peer, tag(t.stage)));
  }

  void recv(const schedule::Transfer& t, const Ctx& c) {
    const int peer = t.peer_group * group_size_ + index_;
    store_.world().irecv(span(t.value, c), peer, tag(p_.stage(t.stage).args[0])).wait();
  }

  // ---------------------------------------------------------------------------------- steps

  void step(const Step& s, const Ctx& c) {
    switch (s.kind) {
      case StepKind::Loop:
        return run_loop(s.loop, c);
      case StepKind::Reduce:
        return reduce(s.reduce);
      case StepKind::Finish:
        return finish(s.finish);
      case StepKind::Matmul:
        return matmul(s.matmul, c);
      case StepKind::Collective:
        return collective(s.collective, c);
      case StepKind::Send:
        return send(s.transfer, c);
      case StepKind::Recv:
        return recv(s.transfer, c);
      case StepKind::Pipeline: {
        const int blocks = s.pipeline.blocks;
        // The blocked rows: those of the first blocked value.
        TANDEM_CHECK(!s.pipeline.values.empty(), "pipeline without blocked values");
        const int64_t rows = shape(s.pipeline.values.front())[0];
        for (int b = 0; b < blocks; ++b) {
          Ctx bc;
          bc.blocked = true;
          bc.block = b;
          bc.b0 = dsl::part_offset(rows, blocks, b);
          bc.bc = dsl::part_count(rows, blocks, b);
          for (const Step& x : s.pipeline.body) step(x, bc);
        }
        return;
      }
    }
  }

  const Plan& plan_;
  const dsl::Program& p_;
  PlanStorage store_;
  size_t chunk_bytes_ = 0;  // every collective's (RunnerOptions::chunk_bytes)
  int group_size_ = 1, index_ = 0;
  std::vector<float> regs_, accs_;   // registers; Prod / Max / Min accumulators
  std::vector<dsl::SumLanes> sums_;  // Norm / Reduce Sum accumulators
  std::vector<char> in_loop_;
  std::vector<char> in_current_ = std::vector<char>(p_.stages().size(), 0);
  std::map<int, int> blocks_of_;
  int64_t work_elems_ = 0, part_elems_ = 0, reduce_elems_ = 0;
  Tensor work_, part_, one_, reduce_;  // f32 scratch: collectives' copies, a reduction's partials
  std::vector<int> matmul_stages_;
  std::map<int, Matmul> matmuls_;
  std::vector<comm::Request> sends_;
};

PlanRunner::PlanRunner(const Plan& plan, comm::Communicator& comm, const dsl::SymbolMap& symbols,
                       Allocator& alloc)
    : PlanRunner(plan, comm, symbols, with_allocator(alloc)) {}
PlanRunner::PlanRunner(const Plan& plan, comm::Communicator& comm, const dsl::SymbolMap& symbols,
                       const RunnerOptions& options)
    : impl_(std::make_unique<Impl>(plan, comm, symbols, options)) {}
PlanRunner::~PlanRunner() = default;
const dsl::Program& PlanRunner::program() const { return impl_->store().program(); }
const Placement& PlanRunner::placement() const { return impl_->store().placement(); }
void PlanRunner::bind(std::string_view name, const Tensor& memory) {
  impl_->store().bind(name, memory);
}
Tensor PlanRunner::input(std::string_view name) const { return impl_->store().input(name); }
void PlanRunner::load(std::string_view name, const Tensor& value) {
  impl_->store().load(name, value);
}
void PlanRunner::set_scalar(std::string_view name, double value) {
  impl_->store().set_scalar(name, value);
}
void PlanRunner::run() { impl_->run(false); }
void PlanRunner::run_leaving_sends() { impl_->run(true); }
void PlanRunner::wait_sends() { impl_->wait_sends(); }
Tensor PlanRunner::output(std::string_view name) const { return impl_->store().output(name); }
PlanRunner::Piece PlanRunner::piece(std::string_view name) const {
  return impl_->store().piece(name);
}
size_t PlanRunner::allocated_bytes(std::string_view name) const {
  return impl_->store().allocated_bytes(name);
}
size_t PlanRunner::allocated_bytes() const { return impl_->store().allocated_bytes(); }

TensorMap run_plan(const Plan& plan, comm::Communicator& comm, const RunArgs& args,
                   Allocator& alloc) {
  RunnerOptions options;
  options.alloc = &alloc;
  options.segments = args.segments;
  PlanRunner runner(plan, comm, args.symbols, options);
  const dsl::Program& p = plan.program;
  const Placement& place = runner.placement();
  for (const auto& [name, value] : args.scalars) runner.set_scalar(name, value);
  for (int id : p.inputs()) {
    const Stage& s = p.stage(id);
    if (!place.holds(s)) continue;
    auto it = args.inputs.find(s.name);
    if (it == args.inputs.end())
      user_error("plan '{}': input '{}' is not given on rank {}", plan.name, s.name, comm.rank());
    runner.load(s.name, it->second);
  }
  runner.run();
  // Write updated inputs back where the caller holds them.
  for (int id : p.inputs()) {
    const Stage& s = p.stage(id);
    if (!place.holds(s) || p.updater(id) < 0) continue;
    const Tensor& mine = args.inputs.find(s.name)->second;
    const Tensor stored = runner.input(s.name);
    if (mine.shape() == stored.shape()) {
      if (stored.nbytes() > 0) std::memcpy(mine.data(), stored.data(), stored.nbytes());
    } else {
      const PlanRunner::Piece pc = runner.piece(s.name);
      put_rows(mine, stored, pc.dim, pc.offset);
    }
  }
  TensorMap out;
  for (const dsl::Output& o : p.outputs())
    if (place.holds(p.stage(o.stage))) out[o.name] = runner.output(o.name).clone();
  return out;
}

}  // namespace tandem::exec
