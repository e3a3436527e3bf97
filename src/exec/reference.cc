// The reference interpreter: a Visitor that evaluates each stage of its rank's group with plain
// loops over this rank's pieces, and the communicator's collectives for communication.
#include "tandem/exec/reference.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "tandem/core/blas.h"
#include "tandem/core/error.h"
#include "tandem/dsl/elementwise.h"

namespace tandem::exec {

using dsl::Layout;
using dsl::Op;
using dsl::Program;
using dsl::Stage;

// ------------------------------------------------------------------------------------ pieces

Around around(const Shape& s, int d) {
  Around a;
  for (int i = 0; i < s.rank(); ++i) {
    if (i < d)
      a.outer *= s[i];
    else if (i == d)
      a.rows = s[i];
    else
      a.inner *= s[i];
  }
  return a;
}

namespace {

Shape with_dim(const Shape& s, int d, int64_t extent) {
  std::vector<int64_t> dims = s.dims();
  dims.at(static_cast<size_t>(d)) = extent;
  return Shape(std::move(dims));
}

}  // namespace

Tensor slice_rows(const Tensor& t, int dim, int64_t offset, int64_t count) {
  TANDEM_CHECK(dim >= 0 && dim < t.shape().rank(), "slice of dim {} of {}", dim, t.str());
  const Around a = around(t.shape(), dim);
  TANDEM_CHECK(offset >= 0 && count >= 0 && offset + count <= a.rows, "rows [{}, {}) of {}", offset,
               offset + count, t.str());
  Tensor out = Tensor::empty(t.dtype(), with_dim(t.shape(), dim, count));
  const size_t es = dtype_size(t.dtype());
  const size_t run = static_cast<size_t>(count * a.inner) * es;  // contiguous bytes per outer index
  for (int64_t o = 0; o < a.outer; ++o)
    if (run > 0)
      std::memcpy(static_cast<char*>(out.data()) + static_cast<size_t>(o) * run,
                  static_cast<const char*>(t.data()) +
                      static_cast<size_t>((o * a.rows + offset) * a.inner) * es,
                  run);
  return out;
}

void put_rows(const Tensor& whole, const Tensor& part, int dim, int64_t offset) {
  TANDEM_CHECK(whole.dtype() == part.dtype() && dim >= 0 && dim < whole.shape().rank(),
               "put {} into {}", part.str(), whole.str());
  const Around a = around(whole.shape(), dim);
  const int64_t count = part.shape()[dim];
  TANDEM_CHECK(offset >= 0 && offset + count <= a.rows, "rows [{}, {}) of {}", offset,
               offset + count, whole.str());
  const size_t es = dtype_size(whole.dtype());
  const size_t run = static_cast<size_t>(count * a.inner) * es;
  for (int64_t o = 0; o < a.outer; ++o)
    if (run > 0)
      std::memcpy(static_cast<char*>(whole.data()) +
                      static_cast<size_t>((o * a.rows + offset) * a.inner) * es,
                  static_cast<const char*>(part.data()) + static_cast<size_t>(o) * run, run);
}

Tensor piece_of(const Tensor& whole, const Layout& layout, int p, int r) {
  if (!layout.is_sliced()) return whole;
  const int64_t n = whole.shape()[layout.dim];
  return slice_rows(whole, layout.dim, dsl::part_offset(n, p, r), dsl::part_count(n, p, r));
}

Placement placement(const Program& program, const comm::Communicator& comm) {
  const int n = comm.size();
  const int g = program.groups();
  if (n % g != 0)
    user_error(
        "program '{}' has {} groups, but the communicator has {} ranks; the ranks split into {} "
        "equal "
        "groups of consecutive ranks, so run it on a multiple of {} ranks",
        program.name(), g, n, g, g);
  Placement pl;
  pl.groups = g;
  pl.group_size = n / g;
  pl.group = comm.rank() / pl.group_size;
  pl.index = comm.rank() % pl.group_size;
  return pl;
}

bool keys_dropout(const Program& program, int id) {
  for (int u : program.users(id)) {
    const Stage& s = program.stage(u);
    if (s.op == Op::Dropout && s.args.size() > 1 && s.args[1] == id) return true;
  }
  return false;
}

uint64_t dropout_seed(std::string_view where, std::string_view name, double value) {
  if (!(value >= 0.0 && value < 9007199254740992.0 && std::floor(value) == value))
    user_error("{}: scalar '{}' = {} keys a dropout mask, so it must be an integer in [0, 2^53)",
               where, name, value);
  return static_cast<uint64_t>(value);
}

GroupComm::GroupComm(const Program& program, comm::Communicator& world)
    : world_(world), place_(exec::placement(program, world)) {
  if (place_.groups > 1) owned_ = world.split(place_.group, place_.index);
}

// ------------------------------------------------------------------------------- interpreter

namespace {

Tensor to_f32(const Tensor& t) { return t.dtype() == DType::F32 ? t.clone() : t.to(DType::F32); }
Tensor flat(const Tensor& t) { return t.reshape(Shape{t.numel()}); }

// The flat index in the whole tensor of element i of a rank's piece: `piece` and `whole` seen
// around the sliced dim, the piece's rows starting at row `offset` of the whole.
int64_t global_index(int64_t i, const Around& piece, const Around& whole, int64_t offset) {
  const int64_t inr = i % piece.inner, row = (i / piece.inner) % piece.rows,
                o = i / (piece.inner * piece.rows);
  return (o * whole.rows + offset + row) * whole.inner + inr;
}

// Whether Sliced(d) of `shape` over p ranks gives each rank the same elements as the
// communicator's flat split of the whole buffer, so that its reduce_scatter/all_gather apply.
bool flat_split_matches(const Shape& shape, int d, int p) {
  if (p == 1) return true;
  const Around a = around(shape, d);
  if (a.outer != 1) return false;
  const int64_t n = shape.numel();
  for (int r = 0; r < p; ++r)
    if (dsl::part_offset(a.rows, p, r) * a.inner != fx::part_offset(n, p, r) ||
        dsl::part_count(a.rows, p, r) * a.inner != fx::part_count(n, p, r))
      return false;
  return true;
}

class Interpreter : public dsl::Visitor {
 public:
  // `groups`: this rank's group already split off the world; `sends_left`: where the sends go
  // unwaited (null: waited before run returns).
  Interpreter(const Program& program, const GroupComm& groups, const RunArgs& args,
              std::vector<comm::Request>* sends_left = nullptr)
      : p_(program),
        world_(groups.world()),
        args_(args),
        place_(groups.placement()),
        group_(&groups.group()),
        sends_left_(sends_left) {}

  TensorMap run() {
    p_.validate();
    check_bindings();
    global_ = p_.resolve_shapes(args_.symbols);
    p_.check_segments(args_.symbols, args_.segments);
    values_.assign(p_.stages().size(), Tensor());
    last_use_.assign(p_.stages().size(), -1);
    keep_.assign(p_.stages().size(), 0);
    for (const Stage& s : p_.stages()) {
      for (int a : s.args) last_use_[static_cast<size_t>(a)] = s.id;
      if (s.op == Op::Send) keep_[static_cast<size_t>(s.id)] = 1;
    }
    for (const dsl::Output& o : p_.outputs()) keep_[static_cast<size_t>(o.stage)] = 1;
    check_inputs();
    visit(p_);
    if (sends_left_ != nullptr) {
      for (comm::Request& r : sends_) sends_left_->push_back(std::move(r));
    } else {
      comm::wait_all(sends_);
    }
    TensorMap out;
    for (const dsl::Output& o : p_.outputs())
      if (mine(p_.stage(o.stage))) out[o.name] = values_[static_cast<size_t>(o.stage)];
    return out;
  }

 protected:
  void visit_stage(const Program& p, const Stage& s) override {
    if (!mine(s)) return;
    Visitor::visit_stage(p, s);
    // Drop each operand after its last reader, so that memory stays near the live set rather
    // than the whole program (outputs and sent values are kept).
    for (int a : s.args)
      if (last_use_[static_cast<size_t>(a)] == s.id && !keep_[static_cast<size_t>(a)])
        values_[static_cast<size_t>(a)] = {};
  }

  void visit_source(const Program&, const Stage& s) override {
    switch (s.op) {
      case Op::Input:
        set(s, args_.inputs.find(s.name)->second);
        break;
      case Op::Scalar: {
        Tensor t = Tensor::empty(s.type.dtype, Shape{});
        t.set(0, static_cast<float>(args_.scalars.find(s.name)->second));
        set(s, t);
        break;
      }
      default: {
        Tensor t = Tensor::empty(DType::F32, Shape{});
        t.set(0, static_cast<float>(s.attrs.value));
        set(s, t);
      }
    }
  }

  // out[i] = f(operands at i). A Sliced result's element i is element g(i) of the whole tensor;
  // Sliced operands share its piece (same index i); the others are whole tensors whose shape is
  // a suffix of the result's, so they are read at g(i) modulo their element count.
  void visit_elementwise(const Program&, const Stage& s) override {
    Tensor out = alloc(s);
    const Shape& global = shape(s.id);
    const bool sliced = s.type.layout.is_sliced();
    Around whole, piece;
    int64_t offset = 0;
    if (sliced) {
      whole = around(global, s.type.layout.dim);
      piece = around(out.shape(), s.type.layout.dim);
      offset = dsl::part_offset(whole.rows, place_.group_size, place_.index);
    }
    const int nvals = s.op == Op::Dropout ? 1 : static_cast<int>(s.args.size());
    struct Operand {
      Tensor t;
      bool same_piece;
      int64_t numel;
    };
    std::vector<Operand> ops;
    for (int j = 0; j < nvals; ++j) {
      const Stage& a = p_.stage(s.args[static_cast<size_t>(j)]);
      ops.push_back({value(a.id), a.type.layout.is_sliced(), shape(a.id).numel()});
    }
    const uint64_t seed = s.op == Op::Dropout ? dropout_seed(p_.stage(s.args[1])) : 0;
    float v[3] = {0, 0, 0};
    for (int64_t i = 0; i < out.numel(); ++i) {
      const int64_t g = sliced ? global_index(i, piece, whole, offset) : i;
      for (int j = 0; j < nvals; ++j) {
        const Operand& op = ops[static_cast<size_t>(j)];
        v[j] = op.t.get(op.same_piece ? i : g % op.numel);
      }
      // A segment's factor is read at the element's segment.
      if (s.op == Op::SegmentScale) v[0] = ops[0].t.get(dsl::segment_of(args_.segments, g));
      float r;
      if (s.op == Op::Select)
        r = dsl::apply_select(v[0], v[1], v[2]);
      else if (s.op == Op::SegmentScale)
        r = dsl::apply_binary(Op::Mul, v[0], v[1]);
      else if (s.op == Op::Dropout)
        r = dsl::apply_dropout(v[0], seed, static_cast<uint64_t>(g), s.attrs.value);
      else if (dsl::is_unary(s.op))
        r = dsl::apply_unary(s.op, v[0]);
      else
        r = dsl::apply_binary(s.op, v[0], v[1]);
      out.set(i, r);
    }
    set(s, out);
  }

  void visit_reduction(const Program&, const Stage& s) override {
    const Stage& xs = p_.stage(s.args[0]);
    const Tensor& x = value(xs.id);
    const bool cross = xs.type.layout.is_sliced();
    if (s.op == Op::SegmentNorm) return segment_norm(s, x, cross);
    const dsl::ReduceOp op = s.op == Op::Norm ? dsl::ReduceOp::Sum : s.attrs.reduce;
    const int dim = s.op == Op::Norm ? dsl::kAllDims : s.attrs.dim;
    // Reduce this rank's piece into f32 partials: one value, or one per element of the other dims.
    Tensor part;
    if (dim == dsl::kAllDims) {
      float acc = dsl::reduce_identity(op);
      if (op == dsl::ReduceOp::Sum) {
        // Sums go to 8 double lanes keyed by the element's flat index in the whole tensor.
        dsl::SumLanes lanes;
        Around whole, piece;
        int64_t offset = 0;
        if (cross) {
          whole = around(shape(xs.id), xs.type.layout.dim);
          piece = around(x.shape(), xs.type.layout.dim);
          offset = dsl::part_offset(whole.rows, place_.group_size, place_.index);
        }
        for (int64_t i = 0; i < x.numel(); ++i) {
          const int64_t g = cross ? global_index(i, piece, whole, offset) : i;
          if (s.op == Op::Norm)
            lanes.add_square(static_cast<uint64_t>(g), x.get(i));
          else
            lanes.add(static_cast<uint64_t>(g), x.get(i));
        }
        acc = lanes.total();
      } else {
        for (int64_t i = 0; i < x.numel(); ++i) acc = dsl::reduce_combine(op, acc, x.get(i));
      }
      part = Tensor::empty(DType::F32, Shape{}, group_->allocator());
      part.set(0, acc);
    } else {
      const Around a = around(x.shape(), dim);
      std::vector<int64_t> dims = x.shape().dims();
      dims.erase(dims.begin() + dim);
      part = Tensor::empty(DType::F32, Shape(std::move(dims)), group_->allocator());
      for (int64_t o = 0; o < a.outer; ++o)
        for (int64_t in = 0; in < a.inner; ++in) {
          float acc = dsl::reduce_identity(op);
          for (int64_t k = 0; k < a.rows; ++k)
            acc = dsl::reduce_combine(op, acc, x.get((o * a.rows + k) * a.inner + in));
          part.set(o * a.inner + in, acc);
        }
    }
    // Over the sliced dim (or all dims) of a Sliced tensor, the ranks' partials combine.
    if (cross && (dim == dsl::kAllDims || dim == xs.type.layout.dim)) group_->all_reduce(part, op);
    if (s.op == Op::Norm) part.set(0, std::sqrt(part.get(0)));
    set(s, s.type.dtype == DType::F32 ? part : part.to(s.type.dtype));
  }

  // Per segment: this rank's sums of squares of its piece, one all-reduce of them over the
  // group when x is Sliced, then the square roots.
  void segment_norm(const Stage& s, const Tensor& x, bool cross) {
    const Tensor xf = to_f32(x);
    Tensor part = Tensor::empty(DType::F32, shape(s.id), group_->allocator());
    const int64_t begin =
        cross ? dsl::part_offset(shape(s.args[0]).numel(), place_.group_size, place_.index) : 0;
    dsl::segment_sums_of_squares(xf.data_as<float>(), begin, xf.numel(), args_.segments,
                                 part.data_as<float>());
    if (cross) group_->all_reduce(part, comm::ReduceOp::Sum);
    for (int64_t i = 0; i < part.numel(); ++i) part.set(i, std::sqrt(part.get(i)));
    set(s, part);
  }

  void visit_matmul(const Program&, const Stage& s) override {
    const Stage& as = p_.stage(s.args[0]);
    const Stage& bs = p_.stage(s.args[1]);
    Tensor a = value(as.id);
    Tensor b = value(bs.id);
    const int ra = a.shape().rank(), rb = b.shape().rank();
    // A Replicated partner of a Sliced operand is read at this rank's slice of the dim they
    // share (the contraction dim, or a batch dim); rows of A and columns of B belong to one side.
    const Layout la = as.type.layout, lb = bs.type.layout;
    if (la.is_sliced() && lb.is_replicated()) {
      if (la.dim == ra - 1)
        b = piece_along(b, rb - 2, shape(bs.id));
      else if (la.dim < ra - 2 && rb > 2)
        b = piece_along(b, la.dim, shape(bs.id));
    } else if (la.is_replicated() && lb.is_sliced()) {
      if (lb.dim == rb - 2)
        a = piece_along(a, ra - 1, shape(as.id));
      else if (lb.dim < rb - 2 && ra > 2)
        a = piece_along(a, lb.dim, shape(as.id));
    }
    const int64_t m = a.shape()[ra - 2], k = a.shape()[ra - 1], n = b.shape()[rb - 1];
    TANDEM_CHECK(b.shape()[rb - 2] == k, "matmul pieces {} x {}", a.str(), b.str());
    Tensor out = alloc(s);
    const int64_t batches = out.numel() / std::max<int64_t>(1, m * n);
    TANDEM_CHECK(out.numel() == batches * m * n, "matmul output {}", out.str());
    const Tensor af = to_f32(a), bf = to_f32(b);
    Tensor cf = Tensor::zeros(DType::F32, out.shape());
    const bool a_batched = ra > 2, b_batched = rb > 2;
    if (k > 0)
      for (int64_t i = 0; i < batches && m * n > 0; ++i)
        blas::sgemm(false, false, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k),
                    1.0f, af.data_as<float>() + (a_batched ? i * m * k : 0), static_cast<int>(k),
                    bf.data_as<float>() + (b_batched ? i * k * n : 0),
                    static_cast<int>(std::max<int64_t>(1, n)), 0.0f,
                    cf.data_as<float>() + i * m * n, static_cast<int>(std::max<int64_t>(1, n)));
    for (int64_t i = 0; i < out.numel(); ++i) out.set(i, cf.get(i));
    set(s, out);
  }

  void visit_scatter(const Program&, const Stage& s) override {
    set(s, piece_of(value(s.args[0]), s.type.layout, place_.group_size, place_.index));
  }

  void visit_update(const Program&, const Stage& s) override {
    const Tensor& target = value(s.args[0]);
    const Tensor& v = value(s.args[1]);
    TANDEM_CHECK(target.dtype() == v.dtype() && target.numel() == v.numel(), "update of {} with {}",
                 target.str(), v.str());
    if (v.nbytes() > 0) std::memcpy(target.data(), v.data(), v.nbytes());
    set(s, target);
  }

  void visit_collective(const Program&, const Stage& s) override {
    const Tensor& x = value(s.args[0]);
    const int p = place_.group_size;
    switch (s.op) {
      case Op::AllReduce: {
        Tensor buf = reducible(x);
        group_->all_reduce(flat(buf), s.attrs.reduce);
        set(s, stored(buf, s));
        break;
      }
      case Op::ReduceScatter: {
        const Shape& global = shape(s.id);
        Tensor buf = reducible(x);
        Tensor part;
        if (flat_split_matches(global, s.attrs.dim, p)) {
          part = Tensor::empty(DType::F32, local(s.id), group_->allocator());
          group_->reduce_scatter(flat(buf), flat(part), s.attrs.reduce);
        } else {
          group_->all_reduce(flat(buf), s.attrs.reduce);
          part = piece_of(buf, s.type.layout, p, place_.index);
        }
        set(s, stored(part, s));
        break;
      }
      case Op::AllGather: {
        const Shape& global = shape(s.id);
        const int d = p_.stage(s.args[0]).type.layout.dim;
        Tensor out = Tensor::empty(s.type.dtype, global);
        if (flat_split_matches(global, d, p)) {
          group_->all_gather(flat(x), flat(out));
        } else {
          // Each rank's piece in turn, from that rank to all.
          for (int r = 0; r < p; ++r) {
            const Shape piece = dsl::local_shape(global, Layout::sliced(d), p, r);
            if (piece.numel() == 0) continue;
            Tensor buf = r == place_.index ? x.clone() : Tensor::empty(s.type.dtype, piece);
            group_->broadcast(flat(buf), r);
            put_rows(out, buf, d, dsl::part_offset(global[d], p, r));
          }
        }
        set(s, out);
        break;
      }
      case Op::Shift: {
        // One message each way, posted together: to the next rank, from the previous one.
        Tensor out = alloc(s);
        if (p == 1 || x.numel() == 0) {
          if (x.nbytes() > 0) std::memcpy(out.data(), x.data(), x.nbytes());
        } else {
          comm::Request sent = group_->isend(x, (place_.index + 1) % p, tag(s.id));
          group_->irecv(out, (place_.index + p - 1) % p, tag(s.id)).wait();
          sent.wait();
        }
        set(s, out);
        break;
      }
      default: {  // Broadcast
        if (s.attrs.root >= p)
          user_error(
              "program '{}', stage {}: Broadcast root {} is outside the group of {} ranks; the "
              "root is a "
              "rank index within the group, 0 to {}",
              p_.name(), p_.display_name(s.id), s.attrs.root, p, p - 1);
        Tensor buf = x.clone();
        group_->broadcast(flat(buf), s.attrs.root);
        set(s, buf);
      }
    }
  }

  void visit_transfer(const Program&, const Stage& s) override {
    if (s.op == Op::Send) {
      // Posted now, completed at the end: the value stays alive in values_ until then.
      const Tensor& x = value(s.args[0]);
      sends_.push_back(world_.isend(x, place_.world_rank(s.attrs.group, place_.index), tag(s.id)));
      set(s, x);
    } else {
      const Stage& sent = p_.stage(s.args[0]);
      Tensor buf = alloc(s);
      world_.irecv(buf, place_.world_rank(sent.type.group, place_.index), tag(sent.id)).wait();
      set(s, buf);
    }
  }

 private:
  // x in f32, in memory from the group's allocator: a reduction then runs the algorithm a runner's
  // buffers get (on MPI ranks of one node the Direct one, which adds in rank order).
  Tensor reducible(const Tensor& x) const {
    Tensor f = to_f32(x);
    Tensor buf = Tensor::empty(DType::F32, f.shape(), group_->allocator());
    if (f.nbytes() > 0) std::memcpy(buf.data(), f.data(), f.nbytes());
    return buf;
  }
  bool mine(const Stage& s) const { return place_.holds(s); }
  const Shape& shape(int id) const { return global_[static_cast<size_t>(id)]; }
  Shape local(int id) const {
    return dsl::local_shape(shape(id), p_.stage(id).type.layout, place_.group_size, place_.index);
  }
  Tensor alloc(const Stage& s) const { return Tensor::empty(s.type.dtype, local(s.id)); }
  const Tensor& value(int id) const {
    const Tensor& t = values_[static_cast<size_t>(id)];
    TANDEM_CHECK(t.defined(), "stage {} read before it was computed", p_.display_name(id));
    return t;
  }
  void set(const Stage& s, Tensor t) {
    TANDEM_CHECK(t.shape() == local(s.id) && t.dtype() == s.type.dtype,
                 "stage {}: computed {}, expected {}{}", p_.display_name(s.id), t.str(),
                 dtype_name(s.type.dtype), local(s.id).str());
    values_[static_cast<size_t>(s.id)] = std::move(t);
  }
  // An f32 result in the stage's dtype and this rank's shape.
  Tensor stored(const Tensor& f, const Stage& s) const {
    Tensor t = s.type.dtype == DType::F32 ? f : f.to(s.type.dtype);
    return t.reshape(local(s.id));
  }
  // This rank's part along `dim` of a whole tensor of global shape `global`.
  Tensor piece_along(const Tensor& whole, int dim, const Shape& global) const {
    const int64_t n = global[dim];
    return slice_rows(whole, dim, dsl::part_offset(n, place_.group_size, place_.index),
                      dsl::part_count(n, place_.group_size, place_.index));
  }

  int tag(int send_id) const {
    if (send_id > comm::kMaxUserTag)
      user_error(
          "program '{}': send {} is stage {}, beyond the {} stages whose sends can be tagged",
          p_.name(), p_.display_name(send_id), send_id, comm::kMaxUserTag + 1);
    return send_id;
  }

  uint64_t dropout_seed(const Stage& seed) const {
    if (seed.op == Op::Const) return static_cast<uint64_t>(seed.attrs.value);
    return exec::dropout_seed(fmt::format("program '{}'", p_.name()), seed.name,
                              args_.scalars.find(seed.name)->second);
  }

  // Every scalar bound, no unknown names; symbols are checked by resolve_shapes and here.
  void check_bindings() const {
    std::vector<std::string> scalars, symbols = p_.symbols(), inputs;
    for (int id : p_.scalars()) scalars.push_back(p_.stage(id).name);
    for (int id : p_.inputs()) inputs.push_back(p_.stage(id).name);
    for (const std::string& name : scalars)
      if (args_.scalars.find(name) == args_.scalars.end())
        user_error("program '{}': scalar '{}' is not bound; give its value in RunArgs::scalars",
                   p_.name(), name);
    for (const auto& [name, v] : args_.scalars)
      if (std::find(scalars.begin(), scalars.end(), name) == scalars.end())
        user_error("program '{}' has no scalar '{}' (its scalars: {})", p_.name(), name,
                   fmt::join(scalars, ", "));
    for (const auto& [name, v] : args_.symbols) {
      if (std::find(symbols.begin(), symbols.end(), name) == symbols.end())
        user_error("program '{}' has no symbol '{}' (its symbols: {})", p_.name(), name,
                   fmt::join(symbols, ", "));
      if (v < 0)
        user_error("program '{}': symbol '{}' is bound to {}; extents are >= 0", p_.name(), name,
                   v);
    }
    for (const auto& [name, t] : args_.inputs)
      if (std::find(inputs.begin(), inputs.end(), name) == inputs.end())
        user_error("program '{}' has no input '{}' (its inputs: {})", p_.name(), name,
                   fmt::join(inputs, ", "));
  }

  // Every input of this rank's group given, as this rank's piece in the declared dtype.
  void check_inputs() const {
    for (int id : p_.inputs()) {
      const Stage& s = p_.stage(id);
      if (!mine(s)) continue;
      const std::string want = fmt::format("{}{}", dtype_name(s.type.dtype), local(id).str());
      const std::string where =
          fmt::format("rank {} (index {} of group {}, {} ranks)", world_.rank(), place_.index,
                      place_.group, place_.group_size);
      const std::string whole = fmt::format("global {} {}", shape(id).str(), s.type.layout.str());
      auto it = args_.inputs.find(s.name);
      if (it == args_.inputs.end())
        user_error("program '{}': input '{}' is not given on {}; pass this rank's piece, {} ({})",
                   p_.name(), s.name, where, want, whole);
      const Tensor& t = it->second;
      if (t.dtype() != s.type.dtype || !(t.shape() == local(id)))
        user_error("program '{}': input '{}' on {} is {}, but this rank's piece is {} ({})",
                   p_.name(), s.name, where, t.str(), want, whole);
      if (!t.defined())
        user_error("program '{}': input '{}' on {} has no storage", p_.name(), s.name, where);
    }
  }

  const Program& p_;
  comm::Communicator& world_;
  const RunArgs& args_;
  Placement place_;
  comm::Communicator* group_ = nullptr;
  std::vector<Shape> global_;
  std::vector<Tensor> values_;
  std::vector<int> last_use_;  // the last stage reading each value, or -1
  std::vector<char> keep_;     // values that must outlive their readers
  std::vector<comm::Request> sends_;
  std::vector<comm::Request>* sends_left_ = nullptr;
};

}  // namespace

TensorMap run_reference(const Program& program, comm::Communicator& comm, const RunArgs& args) {
  // Every rank joins the split, then talks to its own group.
  const GroupComm groups(program, comm);
  return Interpreter(program, groups, args).run();
}

TensorMap run_reference(const Program& program, const GroupComm& groups, const RunArgs& args,
                        std::vector<comm::Request>* sends_left) {
  return Interpreter(program, groups, args, sends_left).run();
}

}  // namespace tandem::exec
