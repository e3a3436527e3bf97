// The plan walker's view of the plan and of loops: small C pieces, the plan's values and buffers,
// how a loop reaches each value (access, loop_io, the box it covers) and the statements of one
// element, which both targets wrap in their own loop.
#include "walker.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>

#include "tandem/codegen/cpp.h"
#include "tandem/core/error.h"
#include "tandem/dsl/elementwise.h"

namespace tandem::codegen::detail {

using dsl::Op;
using schedule::Domain;
using schedule::Storage;

// ------------------------------------------------------------------------------ small pieces

std::string dt_suffix(DType t) { return std::string(dtype_name(t)); }
std::string ctype(DType t) { return t == DType::F32 ? "float" : "uint16_t"; }
int dtype_code(DType t) { return t == DType::F32 ? 0 : (t == DType::BF16 ? 1 : 2); }

std::string flit(float v) {
  if (std::isfinite(v))
    return std::signbit(v) ? fmt::format("({:a}f)", v) : fmt::format("{:a}f", v);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return fmt::format("fx::from_bits(0x{:08x}u)", bits);
}

std::string product(const std::vector<std::string>& xs, size_t from, size_t to) {
  std::vector<std::string> parts;
  for (size_t i = from; i < to && i < xs.size(); ++i) parts.push_back(xs[i]);
  if (parts.empty()) return "int64_t{1}";
  if (parts.size() == 1) return parts[0];
  return fmt::format("({})", fmt::join(parts, " * "));
}

std::string at_index(const std::string& index, const std::string& g) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  std::string out;
  for (size_t i = 0; i < index.size(); ++i) {
    if (index[i] == 'g' && (i == 0 || !word(index[i - 1])) &&
        (i + 1 == index.size() || !word(index[i + 1])))
      out += "(" + g + ")";
    else
      out += index[i];
  }
  return out;
}

std::string identity_literal(dsl::ReduceOp op) {
  switch (op) {
    case dsl::ReduceOp::Sum:
      return "0.0f";
    case dsl::ReduceOp::Prod:
      return "1.0f";
    case dsl::ReduceOp::Max:
      return "-INFINITY";
    case dsl::ReduceOp::Min:
      return "INFINITY";
  }
  return "0.0f";
}

std::string combine_fn(dsl::ReduceOp op) {
  switch (op) {
    case dsl::ReduceOp::Sum:
      return "fx::sum";
    case dsl::ReduceOp::Prod:
      return "fx::prod";
    case dsl::ReduceOp::Max:
      return "fx::max";
    case dsl::ReduceOp::Min:
      return "fx::min";
  }
  return "fx::sum";
}

// ------------------------------------------------------------------------------ the plan

Walker::Walker(const schedule::Plan& plan) : plan_(plan), p_(plan.program) {
  const std::vector<std::string> syms = p_.symbols();
  for (size_t i = 0; i < syms.size(); ++i) sym_index_[syms[i]] = static_cast<int>(i);
  TANDEM_CHECK(plan_.values.size() == p_.stages().size(), "plan '{}' has {} values for {} stages",
               plan_.name, plan_.values.size(), p_.stages().size());
}

std::string Walker::emit_body() {
  std::string head =
      fmt::format("// Plan '{}' of program '{}', as lowered:\n", plan_.name, p_.name());
  std::string text = plan_.str();
  for (size_t pos = 0, next; pos < text.size(); pos = next + 1) {
    next = text.find('\n', pos);
    if (next == std::string::npos) next = text.size();
    head += "//   " + text.substr(pos, next - pos) + "\n";
  }
  std::vector<std::string> steps;
  for (size_t k = 0; k < plan_.steps.size(); ++k) {
    step_ = static_cast<int>(k);
    steps.push_back(emit_top_step(plan_.steps[k]));
  }
  step_ = -1;
  std::string run = "extern \"C\" int tandem_run(const tandem_args* a) {\n  int rc = 0;\n";
  for (size_t k = 0; k < steps.size(); ++k)
    run += fmt::format("  if ((rc = {}(a)) != 0) return rc;\n", step_symbol(static_cast<int>(k)));
  run += "  return 0;\n}\n\n";
  std::string scratch = "extern \"C\" int64_t tandem_scratch_elems(const tandem_args* a) {\n" +
                        prologue() + "  int64_t need = 0;\n";
  for (const std::string& s : scratch_) scratch += s;
  scratch += "  return need;\n}\n\n";
  return head + "\n" + fns_ + fmt::format("{}", fmt::join(steps, "")) + run + scratch +
         fmt::format("extern \"C\" int tandem_abi_version() {{ return {}; }}\n",
                     TANDEM_ABI_VERSION);
}

std::string Walker::emit_segment_norm(const schedule::Step& s) {
  unsupported(fmt::format("segment_norm ({})", name(s.reduce.stage)));
}

void Walker::unsupported(const std::string& what) const {
  std::string where = step_ >= 0 ? fmt::format("step {}", step_) : std::string("the plan");
  if (step_ >= 0 && !plan_.steps[static_cast<size_t>(step_)].label.empty())
    where += fmt::format(" <{}>", plan_.steps[static_cast<size_t>(step_)].label);
  user_error("codegen/{}: plan '{}' of program '{}', {}: {} is not supported by the {} emitter",
             target_name(), plan_.name, p_.name(), where, what, target_title());
}

int Walker::root(int id) const {
  int r = id;
  for (int hops = 0; val(r).alias >= 0; ++hops) {
    if (hops > static_cast<int>(plan_.values.size()))
      unsupported(fmt::format("an alias cycle at {}", name(id)));
    r = val(r).alias;
  }
  return r;
}

int Walker::look_through(int id) const {
  while (st(id).op == Op::Scatter && val(id).storage == Storage::None) id = st(id).args[0];
  return id;
}

dsl::ReduceOp Walker::acc_op(int id) const {
  return st(id).op == Op::Norm ? dsl::ReduceOp::Sum : st(id).attrs.reduce;
}

std::string Walker::dim(const dsl::Dim& d) const {
  if (!d.is_symbol()) return fmt::format("int64_t{{{}}}", d.value);
  auto it = sym_index_.find(d.symbol);
  TANDEM_CHECK(it != sym_index_.end(), "symbol {} of program {}", d.symbol, p_.name());
  return fmt::format("S{}", it->second);
}

std::vector<std::string> Walker::dims(const dsl::SymShape& s) const {
  std::vector<std::string> out;
  for (const dsl::Dim& d : s.dims) out.push_back(dim(d));
  return out;
}

std::string Walker::prologue() const {
  std::string out = "  [[maybe_unused]] const int64_t P = a->p, RK = a->r;\n";
  for (const auto& [sym, i] : sym_index_)
    out += fmt::format("  [[maybe_unused]] const int64_t S{} = a->sym[{}];  // {}\n", i, i, sym);
  return out;
}

std::string Walker::function_head(const std::string& fn) {
  return fmt::format(
      "static int {}(const tandem_args* a, [[maybe_unused]] const tandem_block* blk) {{\n", fn);
}

std::string Walker::base_ptr(int root_id) const { return fmt::format("a->buf[{}]", root_id); }

std::string Walker::allreduce_text(const std::string& send, const std::string& count,
                                   dsl::ReduceOp op) const {
  return fmt::format(
      "  {{\n    tandem_collective c;\n    std::memset(&c, 0, sizeof c);\n    c.step = {}; c.kind "
      "= 0; c.op = {}; c.dtype = 0;\n"
      "    c.send = {}; c.outer = 1; c.rows = {}; c.inner = 1; c.block.index = -1;\n"
      "    if (int rc = a->collective(a->host, &c)) return rc;\n  }}\n",
      step_, reduce_op_code(op), send, count);
}

// ------------------------------------------------------------------------------ loops

Access Walker::access(int v, const LoopCtx& ctx) {
  v = look_through(v);
  Access acc;
  if (ctx.chunk && (v == ctx.coll_stage || v == ctx.carry)) {
    acc.kind = Access::Chunk;
    acc.dtype = st(v).type.dtype;
    acc.key = "chunk";
    acc.index = "(g - g0)";
    return acc;
  }
  const int rt = root(v);
  const dsl::Stage& rs = st(rt);
  acc.root = rt;
  acc.dtype = rs.type.dtype;
  if (rs.type.dtype != st(v).type.dtype)
    unsupported(fmt::format("{} ({}) living in the buffer of {} ({})", name(v),
                            dtype_name(st(v).type.dtype), name(rt), dtype_name(rs.type.dtype)));
  const Storage storage = val(rt).storage;
  if (storage == Storage::None)
    unsupported(fmt::format("reading or writing {}, which the plan never stores", name(v)));
  if (storage == Storage::Block && !ctx.in_pipe)
    unsupported(fmt::format("block value {} used outside its pipeline", name(v)));
  const int vr = st(v).type.shape.rank();
  if (vr < ctx.rank) {
    if (storage != Storage::Full)
      unsupported(fmt::format("broadcast operand {} stored as {}", name(v),
                              schedule::storage_name(storage)));
    acc.kind = Access::Bcast;
    acc.bcast_rank = vr;
    acc.modulus = product(dims(rt), 0, static_cast<size_t>(vr));
    acc.index = fmt::format("(g % {})", acc.modulus);
    acc.key = fmt::format("bcast{}", rt);
    return acc;
  }
  if (vr != ctx.rank)
    unsupported(fmt::format("{} of rank {} in a loop of rank {}", name(v), vr, ctx.rank));
  const std::vector<std::string> e = dims(rt);
  const dsl::Layout layout = rs.type.layout;
  if (storage == Storage::Full) {
    acc.kind = Access::Full;
    acc.index = "g";
    acc.key = fmt::format("full{}", rt);
    return acc;
  }
  // Slice or Block: the buffer holds a range of rows of one dim.
  int d = 0;
  std::string off, cnt;
  if (storage == Storage::Slice) {
    if (!layout.is_sliced())
      unsupported(fmt::format("slice storage of {} ({})", name(rt), layout.str()));
    d = layout.dim;
    off = fmt::format("fx::part_offset({}, P, RK)", e[static_cast<size_t>(d)]);
    cnt = fmt::format("fx::part_count({}, P, RK)", e[static_cast<size_t>(d)]);
  } else if (layout.is_sliced() && layout.dim == 0) {
    // This rank's rows of the block, after its rows of the earlier blocks.
    off = "(blk->row0 + fx::part_offset(blk->rows, P, RK) - blk->part_row0)";
    cnt = "fx::part_count(blk->rows, P, RK)";
  } else if (layout.is_sliced()) {
    // Every row, this rank's part of another dim: laid out as a Slice.
    d = layout.dim;
    off = fmt::format("fx::part_offset({}, P, RK)", e[static_cast<size_t>(d)]);
    cnt = fmt::format("fx::part_count({}, P, RK)", e[static_cast<size_t>(d)]);
  } else {
    unsupported(fmt::format("block storage of {}, which is not sliced", name(rt)));
  }
  const std::string inner = product(e, static_cast<size_t>(d) + 1, e.size());
  acc.kind = Access::Part;
  acc.part_dim = d;
  acc.key = fmt::format("part{}", rt);
  if (d == 0) {
    acc.index = fmt::format("(g - {} * {})", off, inner);
  } else {
    acc.modulus = fmt::format("({} * {})", e[static_cast<size_t>(d)], inner);
    acc.index = fmt::format("fx::part_index(g, {}, {}, {}, {})", acc.modulus, inner, off, cnt);
  }
  return acc;
}

std::string Walker::pointer_at(int v, const std::string& g, bool in_pipe) {
  LoopCtx ctx;
  ctx.rank = st(v).type.shape.rank();
  ctx.in_pipe = in_pipe;
  const Access acc = access(v, ctx);
  return fmt::format("(static_cast<{}*>({}) + {})", ctype(acc.dtype), base_ptr(acc.root),
                     at_index(acc.index, g));
}

LoopCtx Walker::loop_ctx(const schedule::Loop& loop, bool in_pipe) const {
  LoopCtx ctx;
  ctx.loop = &loop;
  ctx.rank = loop.shape.rank();
  ctx.extents = dims(loop.shape);
  ctx.in_pipe = in_pipe;
  return ctx;
}

LoopIO Walker::loop_io(const LoopCtx& ctx) {
  const schedule::Loop& loop = *ctx.loop;
  LoopIO io;
  io.regs = std::set<int>(loop.stages.begin(), loop.stages.end());
  auto param_of = [&](const Access& acc) -> size_t {
    for (size_t i = 0; i < io.params.size(); ++i)
      if (io.params[i].key == acc.key) {
        if (io.params[i].index != acc.index)
          unsupported(fmt::format("two maps into the buffer of {}", name(acc.root)));
        return i;
      }
    io.params.push_back(acc);
    return io.params.size() - 1;
  };
  auto add_once = [](std::vector<int>& xs, int x) {
    if (std::find(xs.begin(), xs.end(), x) == xs.end()) xs.push_back(x);
  };
  auto operand = [&](int id) {
    const int v = look_through(id);
    if (io.regs.count(id) || io.regs.count(v)) return;
    if (st(v).op == Op::Const) return;
    // Rank-0 values are read once, as scalars (in a hook, the chunk itself is not one).
    if (st(v).type.shape.rank() == 0 && (ctx.rank > 0 || !(ctx.chunk && v == ctx.coll_stage))) {
      add_once(io.scalars, v);
      return;
    }
    Access acc = access(v, ctx);
    acc.read = true;
    const size_t i = param_of(acc);
    io.params[i].read = true;
    io.reads[v] = i;
  };
  for (int id : loop.stages) {
    const dsl::Stage& s = st(id);
    const bool elementwise =
        dsl::op_kind(s.op) == dsl::OpKind::Elementwise || s.op == Op::Update || s.op == Op::Scatter;
    if (!elementwise)
      unsupported(fmt::format("stage {} ({}) inside a loop", name(id), dsl::op_name(s.op)));
    const size_t nvals = s.op == Op::Dropout ? 1 : (s.op == Op::Update ? 2 : s.args.size());
    for (size_t j = 0; j < nvals; ++j) {
      if (s.op == Op::Update && j == 0) continue;  // the target is written, not read
      if (s.op == Op::SegmentScale && j == 0) {
        if (ctx.rank != 1) unsupported(fmt::format("{} in a loop of rank {}", name(id), ctx.rank));
        add_once(io.segment_scalars, look_through(s.args[0]));
        continue;
      }
      operand(s.args[j]);
    }
    if (s.op == Op::Dropout) {
      const dsl::Stage& seed = st(s.args[1]);
      if (seed.op == Op::Const) {
        io.seeds[id] = fmt::format("uint64_t{{{}}}", static_cast<uint64_t>(seed.attrs.value));
      } else if (seed.op == Op::Scalar) {
        io.seeds[id] = fmt::format("k{}", seed.id);
        add_once(io.seed_params, seed.id);
      } else {
        unsupported(fmt::format("dropout {} keyed by computed stage {}", name(id), name(seed.id)));
      }
    }
  }
  for (int id : loop.accumulates) {
    const dsl::Stage& s = st(id);
    if (s.op != Op::Norm && !(s.op == Op::Reduce && s.attrs.dim == dsl::kAllDims))
      unsupported(fmt::format("accumulating {} ({})", name(id), dsl::op_name(s.op)));
    operand(s.args[0]);
  }
  io.stores = loop.stores;
  if (ctx.chunk && ctx.carry >= 0 &&
      std::find(io.stores.begin(), io.stores.end(), ctx.carry) == io.stores.end())
    io.stores.push_back(ctx.carry);
  for (int id : io.stores) {
    if (!io.regs.count(id))
      unsupported(fmt::format("storing {}, which the loop does not compute", name(id)));
    const size_t i = param_of(access(id, ctx));
    io.params[i].write = true;
    io.writes[id] = i;
  }
  for (int id : io.scalars) {
    const Storage s = val(root(id)).storage;
    if (s == Storage::None)
      unsupported(fmt::format("reading {}, which the plan never stores", name(id)));
    if (s == Storage::Block) unsupported(fmt::format("rank-0 block value {}", name(id)));
  }
  return io;
}

LoopBox Walker::loop_box(const LoopCtx& ctx) const {
  const schedule::Loop& loop = *ctx.loop;
  const int R = ctx.rank;
  LoopBox b{std::vector<std::string>(static_cast<size_t>(R), "int64_t{0}"), ctx.extents,
            std::vector<bool>(static_cast<size_t>(R), true)};
  if (ctx.in_pipe) {
    b.lo[0] = "blk->row0";
    b.cnt[0] = "blk->rows";
    b.whole[0] = false;
  }
  if (loop.domain == Domain::Slice) {
    const int d = loop.dim;
    if (d < 0 || d >= R)
      unsupported(fmt::format("a slice loop over dim {} of a rank-{} shape", d, R));
    if (ctx.in_pipe && d == 0) {
      b.lo[0] = "(blk->row0 + fx::part_offset(blk->rows, P, RK))";
      b.cnt[0] = "fx::part_count(blk->rows, P, RK)";
    } else {
      b.lo[static_cast<size_t>(d)] =
          fmt::format("fx::part_offset({}, P, RK)", ctx.extents[static_cast<size_t>(d)]);
      b.cnt[static_cast<size_t>(d)] =
          fmt::format("fx::part_count({}, P, RK)", ctx.extents[static_cast<size_t>(d)]);
    }
    b.whole[static_cast<size_t>(d)] = false;
  }
  return b;
}

void Walker::check_parts(const LoopCtx& ctx, const LoopIO& io,
                         const std::vector<bool>& whole) const {
  for (const Access& a : io.params)
    if (a.kind == Access::Part && whole[static_cast<size_t>(a.part_dim)] &&
        !(a.part_dim == 0 && ctx.in_pipe))
      unsupported(fmt::format("{} is held as a part of dim {}, but the loop covers that whole dim",
                              name(a.root), a.part_dim));
}

std::string Walker::formula(const dsl::Stage& s, const std::vector<std::string>& x,
                            const LoopCtx& ctx, const std::map<int, std::string>& seeds) {
  switch (s.op) {
    case Op::Scatter:
      return x[0];
    case Op::Update:
      return x[1];
    case Op::Select:
      return fmt::format("fx::select({}, {}, {})", x[0], x[1], x[2]);
    case Op::SegmentScale:
      return fmt::format("fx::mul({}, {})", x[0], x[1]);  // x[0]: the run's segment's factor
    case Op::Dropout: {
      const double prob = s.attrs.value;
      const float pf = static_cast<float>(prob);
      const float scale = dsl::dropout_scale(prob);
      if (worded_.count(s.id))
        return fmt::format("fx::dropout_word({}, rw{}[t - t0], {}, {})", x[0], s.id, flit(pf),
                           flit(scale));
      std::string index = fmt::format("static_cast<uint64_t>({})", elem_index_);
      if (s.type.shape.rank() < ctx.rank)
        index = fmt::format("static_cast<uint64_t>({} % {})", elem_index_,
                            product(dims(s.id), 0, s.type.shape.dims.size()));
      return fmt::format("fx::dropout({}, {}, {}, {}, {})", x[0], seeds.at(s.id), index, flit(pf),
                         flit(scale));
    }
    default:
      if (dsl::is_unary(s.op)) return fmt::format("fx::{}({})", dsl::formula_name(s.op), x[0]);
      if (dsl::is_binary(s.op))
        return fmt::format("fx::{}({}, {})", dsl::formula_name(s.op), x[0], x[1]);
      unsupported(fmt::format("stage {} ({}) inside a loop", name(s.id), dsl::op_name(s.op)));
  }
}

std::string Walker::value_of(const LoopIO& io, int id) const {
  const int v = look_through(id);
  if (io.regs.count(id)) return fmt::format("v{}", id);
  if (io.regs.count(v)) return fmt::format("v{}", v);
  if (st(v).op == Op::Const) return flit(static_cast<float>(st(v).attrs.value));
  auto r = io.reads.find(v);
  if (r != io.reads.end()) return fmt::format("m{}", r->second);
  return fmt::format("s{}", v);
}

std::string Walker::element_text(const LoopCtx& ctx, const LoopIO& io, const ElementForm& form) {
  const schedule::Loop& loop = *ctx.loop;
  const std::string& in = form.in;
  std::string e;
  for (size_t i = 0; i < io.params.size(); ++i)
    if (io.params[i].read)
      e += fmt::format("{}const float m{} = fx::ld_{}({});\n", in, i, dt_suffix(io.params[i].dtype),
                       form.slot(i));
  for (int id : loop.stages) {
    const dsl::Stage& s = st(id);
    std::vector<std::string> x;
    for (size_t j = 0; j < s.args.size(); ++j) {
      const bool unused =
          (s.op == Op::Update && j == 0) || (s.op == Op::Dropout && j == 1);  // a target, a seed
      x.push_back(unused ? std::string() : value_of(io, s.args[j]));
    }
    const std::string f = formula(s, x, ctx, io.seeds);
    if (s.type.dtype == DType::F32)
      e += fmt::format("{}const float v{} = {};  // {}\n", in, id, f, name(id));
    else
      e += fmt::format("{}const float v{} = fx::rt_{}({});  // {}\n", in, id,
                       dt_suffix(s.type.dtype), f, name(id));
  }
  for (int id : loop.accumulates) e += form.fold(id, value_of(io, st(id).args[0]));
  for (int id : io.stores) {
    const size_t i = io.writes.at(id);
    e += fmt::format("{}{} = fx::st_{}(v{});\n", in, form.slot(i), dt_suffix(io.params[i].dtype),
                     id);
  }
  return e;
}

}  // namespace tandem::codegen::detail
