// The plan walker's steps: the entry point of each top-level step, the steps both targets print
// alike (collectives, transfers, pipelines, a matmul's GEMM) and the shared frame of the steps
// whose work the target prints (a reduction over a dim, an accumulator's finish).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <tuple>

#include "tandem/codegen/cpp.h"
#include "tandem/core/error.h"
#include "walker.h"

namespace tandem::codegen::detail {

using dsl::Op;
using schedule::Domain;
using schedule::Step;
using schedule::StepKind;
using schedule::Storage;

// Per top-level step: `tandem_step_<k>`, which checks the group and calls the step's function.
std::string Walker::emit_top_step(const Step& s) {
  const std::string fn = emit_step(s, false, nullptr);
  std::string out =
      fmt::format("// step {}: {}", step_,
                  s.label.empty() ? std::string(schedule::step_kind_name(s.kind)) : s.label);
  out += fmt::format("\nextern \"C\" int {}(const tandem_args* a) {{\n", step_symbol(step_));
  if (s.group != dsl::kAllGroups) out += fmt::format("  if (a->group != {}) return 0;\n", s.group);
  // Accumulators start from their identity at the first step that folds into them.
  for (int id : accumulated_in(s))
    if (acc_started_.insert(id).second) out += acc_init_text(id);
  out +=
      fmt::format("  return {}(a{});\n}}\n\n", fn, s.kind == StepKind::Pipeline ? "" : ", nullptr");
  return out;
}

std::vector<int> Walker::accumulated_in(const Step& s) const {
  std::vector<int> out;
  if (s.kind == StepKind::Loop) out = s.loop.accumulates;
  if (s.kind == StepKind::Collective && s.collective.fused) out = s.collective.fused->accumulates;
  if (s.kind == StepKind::Pipeline)
    for (const Step& b : s.pipeline.body) {
      std::vector<int> more = accumulated_in(b);
      out.insert(out.end(), more.begin(), more.end());
    }
  return out;
}

std::string Walker::emit_step(const Step& s, bool in_pipe, const schedule::Pipeline* pipe) {
  switch (s.kind) {
    case StepKind::Loop: {
      if (s.loop.domain == Domain::Chunk) unsupported("a chunk loop outside a collective");
      return emit_loop(loop_ctx(s.loop, in_pipe));
    }
    case StepKind::Collective:
      return emit_collective(s, in_pipe);
    case StepKind::Reduce:
      return emit_reduce(s, in_pipe);
    case StepKind::Finish:
      return emit_finish(s, in_pipe);
    case StepKind::Matmul:
      return emit_matmul(s, in_pipe);
    case StepKind::Send:
    case StepKind::Recv:
      return emit_transfer(s, in_pipe, pipe);
    case StepKind::Pipeline: {
      if (in_pipe) unsupported("a pipeline inside a pipeline");
      return emit_pipeline(s);
    }
  }
  unsupported("an unknown step kind");
}

Geometry Walker::geometry(int v, bool in_pipe, const schedule::Collective* c) {
  std::vector<std::string> e = dims(v);
  Geometry g;
  if (e.empty()) e = {"int64_t{1}"};
  g.first = "int64_t{0}";
  if (in_pipe) {
    g.first = fmt::format("(blk->row0 * {})", product(e, 1, e.size()));
    e[0] = "blk->rows";
  }
  g.numel = product(e, 0, e.size());
  if (c == nullptr || c->partition == schedule::Partition::Flat) {
    g.outer = "int64_t{1}";
    g.rows = g.numel;
    g.inner = "int64_t{1}";
  } else {
    const int d = c->dim;
    if (d < 0 || d >= static_cast<int>(e.size()))
      unsupported(fmt::format("a collective partitioned along dim {}", d));
    g.outer = product(e, 0, static_cast<size_t>(d));
    g.rows = e[static_cast<size_t>(d)];
    g.inner = product(e, static_cast<size_t>(d) + 1, e.size());
  }
  return g;
}

std::string Walker::emit_collective(const Step& s, bool in_pipe) {
  const schedule::Collective& c = s.collective;
  const std::string fn = fresh("coll");
  const int v = c.stage;
  const dsl::Stage& vs = st(v);
  std::string hook = "nullptr";
  if (c.fused) {
    if (c.op != Op::AllReduce && c.op != Op::ReduceScatter)
      unsupported(fmt::format("a hook on {}", dsl::op_name(c.op)));
    if (c.fused->domain != Domain::Chunk)
      unsupported("a fused loop whose domain is not the chunks");
    LoopCtx ctx = loop_ctx(*c.fused, in_pipe);
    ctx.chunk = true;
    ctx.coll_stage = v;
    ctx.carry = c.carry;
    if (c.carry >= 0 &&
        (st(c.carry).type.dtype != vs.type.dtype || !(st(c.carry).type.shape == vs.type.shape)))
      unsupported(fmt::format("carrying {} through the buffer of {}", name(c.carry), name(v)));
    hook = emit_loop(ctx);
  }
  const Geometry g = geometry(v, in_pipe, &c);
  const DType dt = vs.type.dtype;
  std::string body = fmt::format(
      "static int {}(const tandem_args* a, [[maybe_unused]] const tandem_block* blk) {{\n", fn);
  body += prologue();
  body += "  tandem_collective c;\n  std::memset(&c, 0, sizeof c);\n";
  int kind = 0;
  const std::string numel = g.numel;
  auto copy = [&](int from, int to) {
    if (from < 0 || root(look_through(from)) == root(to)) return std::string();
    if (st(look_through(from)).type.dtype != st(to).type.dtype)
      unsupported(fmt::format("copying {} into {} of another dtype", name(from), name(to)));
    return copy_text(numel, pointer_at(to, g.first, in_pipe),
                     pointer_at(look_through(from), g.first, in_pipe), dtype_size(dt));
  };
  switch (c.op) {
    case Op::AllReduce:
      kind = 0;
      body += copy(c.operand, v);
      body += fmt::format("  c.send = {};\n", pointer_at(v, g.first, in_pipe));
      break;
    case Op::ReduceScatter: {
      kind = 1;
      if (c.operand < 0) unsupported("a reduce-scatter without an operand");
      const int x = look_through(c.operand);
      body += fmt::format("  c.send = {};\n", pointer_at(x, g.first, in_pipe));
      if (root(v) != root(x)) {
        const Storage sv = val(root(v)).storage;
        if (sv == Storage::Full) {
          // The part is computed straight into its place in a whole buffer (a gather follows).
          if (st(root(v)).type.dtype != dt || !(st(root(v)).type.shape == vs.type.shape))
            unsupported(fmt::format("reduce-scatter into {} inside {}", name(v), name(root(v))));
          body += fmt::format("  c.recv = {};\n  c.recv_whole = 1;\n",
                              pointer_at(root(v), g.first, in_pipe));
        } else if (sv == Storage::Slice || sv == Storage::Block) {
          body += fmt::format("  c.recv = {};\n", stored_piece(v, in_pipe).first);
        } else {
          unsupported(fmt::format("reduce-scatter into {} stored as {}", name(v),
                                  schedule::storage_name(sv)));
        }
      }
      break;
    }
    case Op::AllGather: {
      kind = 2;
      if (c.operand >= 0 && root(look_through(c.operand)) != root(v)) {
        const int x = look_through(c.operand);
        const Storage sx = val(root(x)).storage;
        if (sx != Storage::Slice && sx != Storage::Block)
          unsupported(
              fmt::format("all-gather of {} stored as {}", name(x), schedule::storage_name(sx)));
        body += fmt::format("  c.send = {};\n", stored_piece(x, in_pipe).first);
      }
      body += fmt::format("  c.recv = {};\n", pointer_at(v, g.first, in_pipe));
      break;
    }
    case Op::Broadcast:
      kind = 3;
      body += copy(c.operand, v);
      body += fmt::format("  c.send = {};\n", pointer_at(v, g.first, in_pipe));
      break;
    case Op::Shift: {
      // Out of place: the operand leaves while the value arrives.
      kind = 4;
      const int x = look_through(c.operand);
      if (root(x) == root(v)) unsupported(fmt::format("a shift of {} in place", name(x)));
      body += fmt::format("  c.send = {};\n  c.recv = {};\n", pointer_at(x, g.first, in_pipe),
                          pointer_at(v, g.first, in_pipe));
      break;
    }
    default:
      unsupported(fmt::format("collective {}", dsl::op_name(c.op)));
  }
  body += fmt::format(
      "  c.step = {}; c.kind = {}; c.op = {}; c.dtype = {}; c.root = {}; c.async = {}; c.carry = "
      "{};\n",
      step_, kind, reduce_op_code(c.reduce), dtype_code(dt), c.root, in_pipe ? 1 : 0,
      c.carry >= 0 ? 1 : 0);
  body += fmt::format(
      "  c.outer = {}; c.rows = {}; c.inner = {};\n  c.index_base = {};\n  c.hook = {};\n", g.outer,
      g.rows, g.inner, g.first, hook);
  body += in_pipe ? "  c.block = *blk;\n" : "  c.block.index = -1;\n";
  body += "  return a->collective(a->host, &c);\n}\n\n";
  fns_ += body;
  return fn;
}

std::string Walker::emit_transfer(const Step& s, bool in_pipe, const schedule::Pipeline* pipe) {
  const schedule::Transfer& t = s.transfer;
  const bool recv = s.kind == StepKind::Recv;
  const int v = recv ? t.stage : look_through(t.value);
  const int send_stage = recv ? st(t.stage).args[0] : t.stage;
  if (send_stage > 32766)
    unsupported(fmt::format("send {} beyond the taggable stages", name(send_stage)));
  const Storage sv = val(root(v)).storage;
  if (sv == Storage::None)
    unsupported(fmt::format("transferring {}, which the plan never stores", name(v)));
  // The message structure is the sender's: one message, or one per block of its pipeline.
  const int wire_blocks = sender_blocks(send_stage);
  const std::string fn = fresh(recv ? "recv" : "send");
  std::string body = fmt::format(
      "static int {}(const tandem_args* a, [[maybe_unused]] const tandem_block* blk) {{\n", fn);
  body += prologue();
  const DType dt = st(v).type.dtype;
  std::vector<std::string> e = dims(v);
  auto emit_one = [&](const std::string& ptr, const std::string& elems, const std::string& block) {
    return fmt::format(
        "  {{\n    tandem_transfer t;\n    std::memset(&t, 0, sizeof t);\n    t.step = {}; t.recv "
        "= {}; t.peer_group = {}; "
        "t.tag = {}; t.async = {}; t.block = {};\n    t.data = {};\n    t.bytes = {} * {};\n"
        "    if ((rc = a->transfer(a->host, &t)) != 0) return rc;\n  }}\n",
        step_, recv ? 1 : 0, t.peer_group, send_stage, in_pipe ? 1 : 0, block, ptr, elems,
        dtype_size(dt));
  };
  body += "  int rc = 0;\n";
  if (in_pipe) {
    if (wire_blocks != pipe->blocks)
      unsupported(fmt::format("{} in blocks that the send of {} does not use",
                              recv ? "a receive" : "a send", name(send_stage)));
    const auto [ptr, numel] = stored_piece(v, true);
    body += emit_one(ptr, numel, "blk->index");
  } else if (wire_blocks > 1) {
    if (!recv) unsupported("a send in blocks outside a pipeline");
    if (sv != Storage::Full || e.empty())
      unsupported(fmt::format("receiving {} in blocks", name(v)));
    const std::string rest = product(e, 1, e.size());
    body += fmt::format("  for (int32_t b = 0; b < {}; ++b) {{\n", wire_blocks);
    body += fmt::format(
        "    const int64_t row0 = fx::part_offset({0}, {1}, b), rows = fx::part_count({0}, {1}, "
        "b);\n",
        e[0], wire_blocks);
    body += emit_one(
        fmt::format("(static_cast<{}*>(a->buf[{}]) + row0 * {})", ctype(dt), root(v), rest),
        fmt::format("(rows * {})", rest), "b");
    body += "  }\n";
  } else {
    const auto [ptr, numel] = stored_piece(v, false);
    body += emit_one(ptr, numel, "-1");
  }
  body += "  return 0;\n}\n\n";
  fns_ += body;
  return fn;
}

std::pair<std::string, std::string> Walker::stored_piece(int v, bool in_pipe) {
  const int rt = root(v);
  const Storage sr = val(rt).storage, sv = val(v).storage;
  const std::vector<std::string> e = dims(v);
  const dsl::Layout l = st(v).type.layout;
  auto part = [&](const std::string& n) { return fmt::format("fx::part_count({}, P, RK)", n); };
  if (e.empty()) return {pointer_at(v, "int64_t{0}", in_pipe), "int64_t{1}"};
  const std::string inner = product(e, 1, e.size());
  if (sr == Storage::Block) {
    std::vector<std::string> d = e;
    d[0] = "blk->rows";
    std::string first;
    if (l.is_sliced() && l.dim == 0) {
      d[0] = part("blk->rows");
      first = fmt::format("blk->part_row0 * {}", inner);
    } else {
      d[static_cast<size_t>(l.dim)] = part(e[static_cast<size_t>(l.dim)]);
      first = fmt::format("blk->row0 * {}", product(d, 1, d.size()));
    }
    return {
        fmt::format("(static_cast<{}*>({}) + {})", ctype(st(rt).type.dtype), base_ptr(rt), first),
        product(d, 0, d.size())};
  }
  if (sv == Storage::Slice) {
    if (in_pipe) unsupported(fmt::format("the slice {} handled block by block", name(v)));
    std::vector<std::string> d = e;
    d[static_cast<size_t>(l.dim)] = part(e[static_cast<size_t>(l.dim)]);
    if (sr == Storage::Slice)
      return {fmt::format("static_cast<{}*>({})", ctype(st(rt).type.dtype), base_ptr(rt)),
              product(d, 0, d.size())};
    if (l.dim != 0)
      unsupported(fmt::format("the slice {} along dim {} of a whole buffer (not contiguous)",
                              name(v), l.dim));
    return {pointer_at(v, fmt::format("fx::part_offset({}, P, RK) * {}", e[0], inner), false),
            product(d, 0, d.size())};
  }
  if (in_pipe)
    return {pointer_at(v, fmt::format("blk->row0 * {}", inner), true),
            fmt::format("(blk->rows * {})", inner)};
  return {pointer_at(v, "int64_t{0}", false), product(e, 0, e.size())};
}

int Walker::sender_blocks(int send_stage) const {
  for (const Step& s : plan_.steps) {
    if (s.kind == StepKind::Send && s.transfer.stage == send_stage) return 1;
    if (s.kind == StepKind::Pipeline)
      for (const Step& b : s.pipeline.body)
        if (b.kind == StepKind::Send && b.transfer.stage == send_stage) return s.pipeline.blocks;
  }
  return 1;
}

std::vector<std::string> Walker::local_dims(int v) {
  const int rt = root(v);
  std::vector<std::string> e = dims(v);
  const Storage s = val(rt).storage;
  if (s == Storage::Full && val(v).storage == Storage::Full) return e;
  if (s == Storage::Slice && rt != v && val(v).storage != Storage::Slice)
    unsupported(fmt::format("{} read through the slice buffer of {}", name(v), name(rt)));
  if (s == Storage::Slice) {
    const dsl::Layout l = st(rt).type.layout;
    e[static_cast<size_t>(l.dim)] =
        fmt::format("fx::part_count({}, P, RK)", e[static_cast<size_t>(l.dim)]);
    return e;
  }
  unsupported(fmt::format("{} held as {} in the buffer of {}", name(v),
                          schedule::storage_name(val(v).storage), name(rt)));
}

std::string Walker::emit_reduce(const Step& s, bool in_pipe) {
  if (in_pipe) unsupported("a reduction inside a pipeline");
  const int id = s.reduce.stage;
  const dsl::Stage& rs = st(id);
  if (rs.op == Op::SegmentNorm) return emit_segment_norm(s);
  const int x = look_through(rs.args[0]);
  const int k = rs.attrs.dim;
  if (k < 0)
    unsupported(
        fmt::format("reduce step {} over every dim (that is a loop accumulation)", name(id)));
  const std::vector<std::string> xe = local_dims(x);
  const std::vector<std::string> oe = local_dims(id);
  const std::string fn = fresh("reduce");
  const std::string outer = product(xe, 0, static_cast<size_t>(k)),
                    rows = xe[static_cast<size_t>(k)],
                    inner = product(xe, static_cast<size_t>(k) + 1, xe.size());
  // The partial folds of this rank's rows go to scratch, are all-reduced there when the rows are
  // split across ranks, and are stored in the result's dtype.
  std::string body = function_head(fn) + prologue();
  body += fmt::format("  const int64_t outer = {}, rows = {}, inner = {};\n", outer, rows, inner);
  body += fold_rows_text(fn, root(x), st(x).type.dtype, rs.attrs.reduce);
  if (s.reduce.across_ranks) body += allreduce_text("a->scratch", "outer * inner", rs.attrs.reduce);
  body += store_text(root(id), rs.type.dtype, "a->scratch", product(oe, 0, oe.size()), false);
  body += return_text(fn) + "}\n\n";
  scratch_.push_back(
      fmt::format("  {{ const int64_t e = {} * {}; if (e > need) need = e; }}\n", outer, inner));
  fns_ += body;
  return fn;
}

std::string Walker::emit_finish(const Step& s, bool in_pipe) {
  const int id = s.finish.stage;
  const dsl::Stage& fs = st(id);
  const int rt = root(id);
  if (val(rt).storage != Storage::Full)
    unsupported(fmt::format("finishing {} stored as {}", name(id),
                            schedule::storage_name(val(rt).storage)));
  const std::string fn = fresh("finish");
  std::string body = function_head(fn) + prologue();
  // The accumulator's f32 value; across ranks, the ranks' values all-reduced in f32; a norm's
  // square root; the store in the stage's dtype.
  const auto [lanes, value] = finish_lanes_text(fn, id);
  body += lanes;
  if (s.finish.across_ranks) {
    if (in_pipe) body += "  if (int rc = a->sync(a->host, blk->index)) return rc;\n";
    body += allreduce_text(value, "1", acc_op(id));
  }
  body += store_text(rt, fs.type.dtype, value, "1", fs.op == Op::Norm);
  body += return_text(fn) + "}\n\n";
  fns_ += body;
  return fn;
}

Matrix Walker::matrix(int v, const std::string& rlo, const std::string& clo, bool in_pipe) {
  Matrix m;
  m.v = v;
  m.dtype = st(v).type.dtype;
  const std::vector<std::string> e = dims(v);
  const int q = static_cast<int>(e.size());
  const int rt = root(v);
  const Storage s = val(rt).storage;
  if (s == Storage::None)
    unsupported(fmt::format("matmul operand {}, which the plan never stores", name(v)));
  if (st(rt).type.shape.rank() != q)
    unsupported(fmt::format("matmul operand {} in the buffer of {}", name(v), name(rt)));
  // The buffer's extents of the last two dims.
  std::string brows = e[static_cast<size_t>(q - 2)], bcols = e[static_cast<size_t>(q - 1)];
  const dsl::Layout l = st(rt).type.layout;
  if (s == Storage::Slice || (s == Storage::Block && l.is_sliced())) {
    if (l.dim == q - 1)
      bcols = fmt::format("fx::part_count({}, P, RK)", e[static_cast<size_t>(q - 1)]);
    else if (l.dim == q - 2 && s == Storage::Slice)
      brows = fmt::format("fx::part_count({}, P, RK)", e[static_cast<size_t>(q - 2)]);
    else
      unsupported(fmt::format("matmul operand {} sliced along dim {}", name(v), l.dim));
  }
  if (s == Storage::Block && q != 2) unsupported("a batched matmul in a pipeline");
  if (s == Storage::Block && l.is_sliced() && l.dim == 0)
    unsupported(fmt::format("matmul operand {} sliced by rows in a block", name(v)));
  m.ld = bcols;
  m.batch = q > 2 ? fmt::format("({} * {})", brows, bcols) : "int64_t{0}";
  const std::string g = fmt::format("({} * {} + {})", rlo, e[static_cast<size_t>(q - 1)], clo);
  LoopCtx ctx;
  ctx.rank = q;
  ctx.in_pipe = in_pipe;
  const Access acc = access(v, ctx);
  m.base = fmt::format("(static_cast<{}*>({}) + {})", ctype(m.dtype), base_ptr(rt),
                       at_index(acc.index, g));
  return m;
}

std::string Walker::emit_matmul(const Step& s, bool in_pipe) {
  const int id = s.matmul.stage;
  const MatmulDims d = matmul_dims(s, in_pipe);
  const std::string fn = fresh("matmul");
  std::string body = function_head(fn) + prologue();
  body +=
      fmt::format("  const int64_t m = {}, k = {}, n = {};  // {}\n", d.mn, d.kn, d.nn, name(id));
  body += fmt::format("  const int64_t batches = {};\n",
                      product(d.ec, 0, static_cast<size_t>(d.qc - 2)));
  body += "  if (m <= 0 || n <= 0) return 0;\n  [[maybe_unused]] float* scratch = a->scratch;\n";
  body += "  for (int64_t bt = 0; bt < batches; ++bt) {\n";
  // Operands that are not f32 are converted into scratch: [A][B][C], each only when needed.
  std::string off = "int64_t{0}";
  std::vector<std::string> scratch_parts;
  auto operand = [&](const Matrix& X, int q, const std::string& tag, const std::string& rows,
                     const std::string& cols, const std::string& rows_c,
                     const std::string& cols_c) {
    const std::string src =
        fmt::format("({} + bt * {})", X.base, q > 2 ? X.batch : std::string("int64_t{0}"));
    if (X.dtype == DType::F32) {
      body += fmt::format("    const float* p{0} = {1};\n    const int64_t ld{0} = {2};\n", tag,
                          src, X.ld);
      return;
    }
    body += fmt::format("    float* p{0} = scratch + {1};\n    const int64_t ld{0} = {2};\n", tag,
                        off, cols);
    body += widen_text(tag, src, X.dtype, rows, cols, X.ld);
    off = fmt::format("{} + {} * {}", off, rows, cols);
    scratch_parts.push_back(fmt::format("{} * {}", rows_c, cols_c));
  };
  operand(d.A, d.qa, "a", "m", "k", d.mn, d.kn);
  operand(d.B, d.qb, "b", "k", "n", d.kn, d.nn);
  const std::string csrc =
      fmt::format("({} + bt * {})", d.C.base, d.qc > 2 ? d.C.batch : std::string("int64_t{0}"));
  if (d.C.dtype == DType::F32) {
    body += fmt::format("    float* pc = {};\n    const int64_t ldc = {};\n", csrc, d.C.ld);
  } else {
    body += fmt::format("    float* pc = scratch + {};\n    const int64_t ldc = n;\n", off);
    scratch_parts.push_back(fmt::format("{} * {}", d.mn, d.nn));
  }
  body +=
      "    if (k > 0) {\n"
      "      a->sgemm(0, 0, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, "
      "pa, static_cast<int>(lda),\n"
      "               pb, static_cast<int>(ldb), 0.0f, pc, static_cast<int>(ldc));\n"
      "    } else {\n" +
      zero_text() + "    }\n";
  if (d.C.dtype != DType::F32) body += narrow_text(csrc, d.C.dtype, d.C.ld);
  body += "  }\n" + return_text(fn) + "}\n\n";
  if (!scratch_parts.empty())
    scratch_.push_back(fmt::format("  {{ {}const int64_t e = {}; if (e > need) need = e; }}\n",
                                   in_pipe ? scratch_block_prefix_ : std::string(),
                                   fmt::join(scratch_parts, " + ")));
  fns_ += body;
  return fn;
}

MatmulDims Walker::matmul_dims(const Step& s, bool in_pipe) {
  const int id = s.matmul.stage;
  const dsl::Stage& ms = st(id);
  const dsl::Stage& as = st(ms.args[0]);
  const dsl::Stage& bs = st(ms.args[1]);
  const dsl::Layout la = as.type.layout, lb = bs.type.layout, lc = ms.type.layout;
  const int qa = as.type.shape.rank(), qb = bs.type.shape.rank(), qc = ms.type.shape.rank();
  const std::vector<std::string> ea = dims(as.id), eb = dims(bs.id), ec = dims(id);
  auto part = [](const std::string& n) {
    return std::pair{fmt::format("fx::part_offset({}, P, RK)", n),
                     fmt::format("fx::part_count({}, P, RK)", n)};
  };
  const std::string M = ea[static_cast<size_t>(qa - 2)], K = ea[static_cast<size_t>(qa - 1)],
                    N = eb[static_cast<size_t>(qb - 1)];
  // Batch dims are never sliced here; rows of A (and C), the contraction, and columns of B
  // (and C) may be: a rank reads its own part, or the matching part of a replicated partner.
  for (const auto& [l, q, who] :
       {std::tuple{la, qa, as.id}, std::tuple{lb, qb, bs.id}, std::tuple{lc, qc, id}})
    if (l.is_sliced() && l.dim < q - 2)
      unsupported(
          fmt::format("matmul {} with {} sliced along batch dim {}", name(id), name(who), l.dim));
  std::string mlo = "int64_t{0}", mn = M, klo = "int64_t{0}", kn = K, nlo = "int64_t{0}", nn = N;
  if (la.is_sliced() && la.dim == qa - 2) std::tie(mlo, mn) = part(M);
  if ((la.is_sliced() && la.dim == qa - 1) || (lb.is_sliced() && lb.dim == qb - 2))
    std::tie(klo, kn) = part(K);
  if (lb.is_sliced() && lb.dim == qb - 1) std::tie(nlo, nn) = part(N);
  if (in_pipe) {
    // A's and C's rows are the block's.
    if (qa != 2 || qc != 2) unsupported("a batched matmul in a pipeline");
    if (la.is_sliced() && la.dim == 0) unsupported("a matmul with row-sliced A in a pipeline");
    mlo = "blk->row0";
    mn = "blk->rows";
  }
  MatmulDims d;
  d.A = matrix(look_through(as.id), mlo, klo, in_pipe);
  d.B = matrix(look_through(bs.id), klo, nlo, in_pipe);
  d.C = matrix(id, mlo, nlo, in_pipe);
  d.mn = mn;
  d.kn = kn;
  d.nn = nn;
  d.qa = qa;
  d.qb = qb;
  d.qc = qc;
  d.ec = ec;
  return d;
}
void Walker::footprint(const Step& s, std::set<int>& reads, std::set<int>& writes) {
  // -1: no value (a completing gather's operand: it reads and writes its own buffer, its stage).
  auto rd = [&](int id) {
    if (id < 0) return;
    id = look_through(id);
    if (val(root(id)).storage != Storage::None) reads.insert(root(id));
  };
  auto wr = [&](int id) {
    if (id >= 0 && val(root(id)).storage != Storage::None) writes.insert(root(id));
  };
  auto loop = [&](const schedule::Loop& l) {
    for (int id : l.stages)
      for (size_t j = 0; j < st(id).args.size(); ++j)
        if (!(st(id).op == Op::Update && j == 0)) rd(st(id).args[j]);
    for (int id : l.accumulates) rd(st(id).args[0]);
    for (int id : l.stores) wr(id);
  };
  switch (s.kind) {
    case StepKind::Loop:
      loop(s.loop);
      break;
    case StepKind::Matmul:
      rd(st(s.matmul.stage).args[0]);
      rd(st(s.matmul.stage).args[1]);
      wr(s.matmul.stage);
      break;
    case StepKind::Reduce:
      rd(st(s.reduce.stage).args[0]);
      wr(s.reduce.stage);
      break;
    case StepKind::Finish:
      wr(s.finish.stage);
      break;
    case StepKind::Collective:
      rd(s.collective.operand);
      rd(s.collective.stage);
      wr(s.collective.stage);
      if (s.collective.fused) loop(*s.collective.fused);
      if (s.collective.carry >= 0) wr(s.collective.carry);
      break;
    case StepKind::Send:
      rd(s.transfer.value);
      break;
    case StepKind::Recv:
      wr(s.transfer.stage);
      break;
    case StepKind::Pipeline:
      break;
  }
}

namespace {
bool is_async(const Step& s) {
  return s.kind == StepKind::Collective || s.kind == StepKind::Send || s.kind == StepKind::Recv;
}

}  // namespace

std::string Walker::emit_pipeline(const Step& s) {
  const schedule::Pipeline& pipe = s.pipeline;
  if (pipe.values.empty()) unsupported("a pipeline without blocked values");
  if (pipe.blocks < 1) unsupported(fmt::format("a pipeline of {} blocks", pipe.blocks));
  const dsl::SymShape& first = st(pipe.values[0]).type.shape;
  if (first.rank() < 1) unsupported("a pipeline over rank-0 values");
  const dsl::Dim rows = first[0];
  for (int v : pipe.values)
    if (st(v).type.shape.rank() < 1 || !(st(v).type.shape[0] == rows))
      unsupported(fmt::format("pipelined values with different rows ({} has {})", name(v),
                              st(v).type.shape.str()));
  const std::string R = dim(rows);
  scratch_block_prefix_ = fmt::format(
      "const tandem_block blk0 = {{0, fx::part_count({}, {}, 0), 0, 0, {}}}; [[maybe_unused]] "
      "const tandem_block* blk = &blk0; ",
      R, pipe.blocks, pipe.blocks);
  std::vector<std::string> calls;
  std::set<int> async_reads, async_writes;
  size_t first_wait = pipe.body.size();  // the first step that waits for the block's communication
  std::set<int> head_reads, head_writes,
      tail_writes;  // roots read / written before it, written after
  for (const Step& b : pipe.body) {
    const std::string fn = emit_step(b, true, &pipe);
    std::set<int> reads, writes;
    footprint(b, reads, writes);
    std::string call;
    if (!is_async(b)) {
      bool depends = false;
      for (int r : reads) depends |= async_writes.count(r) > 0;
      for (int w : writes) depends |= async_writes.count(w) > 0 || async_reads.count(w) > 0;
      if (depends) {
        call +=
            "    if ((rc = a->sync(a->host, blk->index)) != 0) return rc;  // needs this block's "
            "communication\n";
        if (first_wait == pipe.body.size()) first_wait = calls.size();
      }
    } else {
      async_reads.insert(reads.begin(), reads.end());
      async_writes.insert(writes.begin(), writes.end());
    }
    if (first_wait == pipe.body.size()) {
      head_reads.insert(reads.begin(), reads.end());
      head_writes.insert(writes.begin(), writes.end());
    } else {
      tail_writes.insert(writes.begin(), writes.end());
    }
    call += fmt::format("    if ((rc = {}(a, blk)) != 0) return rc;\n", fn);
    calls.push_back(call);
  }
  scratch_block_prefix_.clear();
  // Skewing is safe when the head of block b + 1 touches only its own block's rows of the
  // pipelined values (every step inside a pipeline reaches those by block) and reads nothing the
  // tail of block b writes outside them.
  std::set<int> blocked;
  for (int v : pipe.values) blocked.insert(root(v));
  bool skew = skew_pipelines_ && first_wait > 0 && first_wait < calls.size();
  for (int w : head_writes) skew = skew && blocked.count(w) > 0;
  for (int r : head_reads) skew = skew && (blocked.count(r) > 0 || tail_writes.count(r) == 0);
  const std::string fn = fresh("pipeline");
  std::string body = fmt::format("static int {}(const tandem_args* a) {{\n", fn);
  body += prologue();
  body += fmt::format("  const int64_t rows = {};\n  const int32_t blocks = {};\n  int rc = 0;\n",
                      R, pipe.blocks);
  if (skew) {
    // Block b + 1's steps up to its first wait for communication are issued before block b's
    // remaining steps: b + 1's work (a GEMM) is queued while b's collective is in flight.
    body +=
        "  // Skewed: the head of block b + 1 (up to its first wait) is issued before the tail of "
        "block b.\n"
        "  auto block_of = [&](int32_t b) {\n"
        "    int64_t part_row0 = 0;  // this rank's rows of the row-sliced block values before "
        "block b\n"
        "    for (int32_t j = 0; j < b; ++j) part_row0 += fx::part_count(fx::part_count(rows, "
        "blocks, j), P, RK);\n"
        "    return tandem_block{fx::part_offset(rows, blocks, b), fx::part_count(rows, blocks, "
        "b), part_row0, b, blocks};\n"
        "  };\n"
        "  for (int32_t b = 0; b <= blocks; ++b) {\n"
        "    if (b < blocks) {\n"
        "      const tandem_block blk_ = block_of(b);\n"
        "      const tandem_block* blk = &blk_;\n";
    for (size_t i = 0; i < first_wait; ++i) body += "  " + calls[i];
    body +=
        "    }\n"
        "    if (b > 0) {\n"
        "      const tandem_block blk_ = block_of(b - 1);\n"
        "      const tandem_block* blk = &blk_;\n";
    for (size_t i = first_wait; i < calls.size(); ++i) {
      std::string c = calls[i];
      for (size_t pos = 0; (pos = c.find("\n    ", pos)) != std::string::npos; pos += 7)
        c.replace(pos, 5, "\n      ");
      body += "  " + c;
    }
    body += "    }\n  }\n  return a->sync(a->host, -1);\n}\n\n";
  } else {
    body +=
        "  int64_t part_row0 = 0;  // this rank's rows of the row-sliced block values so far\n"
        "  for (int32_t b = 0; b < blocks; ++b) {\n"
        "    const int64_t row0 = fx::part_offset(rows, blocks, b), count = fx::part_count(rows, "
        "blocks, b);\n"
        "    const tandem_block blk_ = {row0, count, part_row0, b, blocks};\n"
        "    const tandem_block* blk = &blk_;\n"
        "    part_row0 += fx::part_count(count, P, RK);\n";
    for (const std::string& c : calls) body += c;
    body += "  }\n  return a->sync(a->host, -1);\n}\n\n";
  }
  fns_ += body;
  return fn;
}

}  // namespace tandem::codegen::detail
