// The plan walker both source emitters share (codegen/cpp for the CPU JIT, codegen/cuda for
// GPUs): how a lowered plan's values are reached from a loop (Access), each step's geometry and
// buffers, and the host-side C++ of every step. The C++ target is this class as it is; the CUDA
// target (cuda_steps.cc) overrides the steps whose work touches memory (loops, reductions,
// finishes, matmul conversions, copies, accumulator starts) to launch kernels instead, and keeps
// the rest (collectives, transfers, pipelines) as host code over device pointers.
// Private to src/codegen.
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "tandem/codegen/abi.h"
#include "tandem/codegen/cpp.h"
#include "tandem/core/error.h"
#include "tandem/dsl/elementwise.h"
#include "tandem/schedule/plan.h"

namespace tandem::codegen::detail {

using dsl::Op;
using schedule::Domain;
using schedule::Plan;
using schedule::Step;
using schedule::StepKind;
using schedule::Storage;

// ------------------------------------------------------------------------------ small pieces

inline std::string dt_suffix(DType t) { return std::string(dtype_name(t)); }  // "f32", "bf16", "f16"
inline std::string ctype(DType t) { return t == DType::F32 ? "float" : "uint16_t"; }
inline int dtype_code(DType t) { return t == DType::F32 ? 0 : (t == DType::BF16 ? 1 : 2); }

// An exact f32 literal: hexadecimal for finite values, bits otherwise.
inline std::string flit(float v) {
  if (std::isfinite(v)) return std::signbit(v) ? fmt::format("({:a}f)", v) : fmt::format("{:a}f", v);
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  return fmt::format("fx::from_bits(0x{:08x}u)", bits);
}

inline std::string product(const std::vector<std::string>& xs, size_t from, size_t to) {
  std::vector<std::string> parts;
  for (size_t i = from; i < to && i < xs.size(); ++i) parts.push_back(xs[i]);
  if (parts.empty()) return "int64_t{1}";
  if (parts.size() == 1) return parts[0];
  return fmt::format("({})", fmt::join(parts, " * "));
}

// An access's index (a C expression of the name `g`) at another global index.
inline std::string at_index(const std::string& index, const std::string& g) {
  auto word = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  std::string out;
  for (size_t i = 0; i < index.size(); ++i) {
    if (index[i] == 'g' && (i == 0 || !word(index[i - 1])) && (i + 1 == index.size() || !word(index[i + 1])))
      out += "(" + g + ")";
    else
      out += index[i];
  }
  return out;
}

inline constexpr int kAccSlots = TANDEM_ACC_SLOTS;  // doubles per stage in tandem_args::acc

inline std::string identity_literal(dsl::ReduceOp op) {
  switch (op) {
    case dsl::ReduceOp::Sum: return "0.0f";
    case dsl::ReduceOp::Prod: return "1.0f";
    case dsl::ReduceOp::Max: return "-INFINITY";
    case dsl::ReduceOp::Min: return "INFINITY";
  }
  return "0.0f";
}

inline std::string combine_fn(dsl::ReduceOp op) {
  switch (op) {
    case dsl::ReduceOp::Sum: return "fx::sum";
    case dsl::ReduceOp::Prod: return "fx::prod";
    case dsl::ReduceOp::Max: return "fx::max";
    case dsl::ReduceOp::Min: return "fx::min";
  }
  return "fx::sum";
}

// ------------------------------------------------------------------------------ accesses

// How a loop reaches one value in memory: through which buffer and which map from the element's
// global flat index g to the buffer's index.
struct Access {
  enum Kind { Full, Bcast, Part, Chunk } kind = Full;
  int root = -1;         // the owning value (its buffer); -1 for Chunk
  DType dtype = DType::F32;
  std::string index;     // the buffer index of global flat index `g`, as C
  std::string key;       // equal keys: the same pointer
  int part_dim = -1;     // Part: the dim whose rows the buffer holds a range of
  int bcast_rank = 0;    // Bcast: the operand's rank
  std::string modulus;   // Bcast: its element count; Part (dim > 0): the dim's span
  bool read = false, write = false;
};

// What a loop is emitted inside of.
struct LoopCtx {
  const schedule::Loop* loop = nullptr;
  int rank = 0;
  std::vector<std::string> extents;  // the loop shape's dims, as C
  bool chunk = false;                // a hook of a collective
  int coll_stage = -1;               // Chunk: the collective's value (the chunk itself)
  int carry = -1;                    // Chunk: the value written over the chunk
  bool in_pipe = false;
};

class Emitter {
 public:
  virtual ~Emitter() = default;
  explicit Emitter(const Plan& plan) : plan_(plan), p_(plan.program) {
    const std::vector<std::string> syms = p_.symbols();
    for (size_t i = 0; i < syms.size(); ++i) sym_index_[syms[i]] = static_cast<int>(i);
    TANDEM_CHECK(plan_.values.size() == p_.stages().size(), "plan '{}' has {} values for {} stages",
                 plan_.name, plan_.values.size(), p_.stages().size());
  }

  // The plan's functions: one per step, tandem_step_<k>, tandem_run, tandem_scratch_elems and
  // tandem_abi_version (after the target's prefix, which defines what they call).
  std::string emit_body() {
    std::string head = fmt::format(
        "// Plan '{}' of program '{}', as lowered:\n", plan_.name, p_.name());
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
    std::string scratch =
        "extern \"C\" int64_t tandem_scratch_elems(const tandem_args* a) {\n" + prologue() +
        "  int64_t need = 0;\n";
    for (const std::string& s : scratch_) scratch += s;
    scratch += "  return need;\n}\n\n";
    return head + "\n" + fns_ + fmt::format("{}", fmt::join(steps, "")) + run + scratch +
           fmt::format("extern \"C\" int tandem_abi_version() {{ return {}; }}\n", TANDEM_ABI_VERSION);
  }

 protected:
  // ---------------------------------------------------------------------------- the target

  // "cpp" or "cuda", for messages.
  virtual std::string target_name() const { return "cpp"; }
  // Statements copying `elems` elements of `size` bytes from src to dst (C pointer expressions).
  virtual std::string copy_text(const std::string& elems, const std::string& dst, const std::string& src,
                                size_t size) const {
    return fmt::format("  if ({0} > 0) std::memmove({1}, {2}, static_cast<size_t>({0}) * {3});\n", elems, dst, src, size);
  }
  // Statements starting accumulator `id` from its op's identity (a sum: its 8 lanes at 0).
  virtual std::string acc_init_text(int id) const {
    if (acc_op(id) == dsl::ReduceOp::Sum)
      return fmt::format("  for (int j = 0; j < {0}; ++j) a->acc[{0} * {1} + j] = 0.0;  // {2}\n", kAccSlots, id, name(id));
    return fmt::format("  a->acc[{} * {}] = {};  // {}\n", kAccSlots, id, identity_literal(acc_op(id)), name(id));
  }

  // ---------------------------------------------------------------------------- errors

  // The box a loop that is not a hook covers (rank > 0), per dim as C: whole dims, but this
  // rank's part of the sliced dim and the block's rows in a pipeline.
  struct LoopBox {
    std::vector<std::string> lo, cnt;
    std::vector<bool> whole;
  };
  LoopBox loop_box(const LoopCtx& ctx) const {
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
      if (d < 0 || d >= R) unsupported(fmt::format("a slice loop over dim {} of a rank-{} shape", d, R));
      if (ctx.in_pipe && d == 0) {
        b.lo[0] = "(blk->row0 + fx::part_offset(blk->rows, P, RK))";
        b.cnt[0] = "fx::part_count(blk->rows, P, RK)";
      } else {
        b.lo[static_cast<size_t>(d)] = fmt::format("fx::part_offset({}, P, RK)", ctx.extents[static_cast<size_t>(d)]);
        b.cnt[static_cast<size_t>(d)] = fmt::format("fx::part_count({}, P, RK)", ctx.extents[static_cast<size_t>(d)]);
      }
      b.whole[static_cast<size_t>(d)] = false;
    }
    return b;
  }

  [[noreturn]] void unsupported(const std::string& what) const {
    std::string where = step_ >= 0 ? fmt::format("step {}", step_) : std::string("the plan");
    if (step_ >= 0 && !plan_.steps[static_cast<size_t>(step_)].label.empty())
      where += fmt::format(" <{}>", plan_.steps[static_cast<size_t>(step_)].label);
    user_error("codegen/{}: plan '{}' of program '{}', {}: {} is not supported by the {} emitter", target_name(),
               plan_.name, p_.name(), where, what, target_name() == "cpp" ? "C++" : "CUDA");
  }

  // ---------------------------------------------------------------------------- the plan

  const dsl::Stage& st(int id) const { return p_.stage(id); }
  const schedule::Value& val(int id) const { return plan_.values.at(static_cast<size_t>(id)); }
  std::string name(int id) const { return p_.display_name(id); }

  // The value owning the buffer `id` lives in.
  int root(int id) const {
    int r = id;
    for (int hops = 0; val(r).alias >= 0; ++hops) {
      if (hops > static_cast<int>(plan_.values.size())) unsupported(fmt::format("an alias cycle at {}", name(id)));
      r = val(r).alias;
    }
    return r;
  }

  // Scatter stages that were never materialised are views of their operand.
  int look_through(int id) const {
    while (st(id).op == Op::Scatter && val(id).storage == Storage::None) id = st(id).args[0];
    return id;
  }

  std::string dim(const dsl::Dim& d) const {
    if (!d.is_symbol()) return fmt::format("int64_t{{{}}}", d.value);
    auto it = sym_index_.find(d.symbol);
    TANDEM_CHECK(it != sym_index_.end(), "symbol {} of program {}", d.symbol, p_.name());
    return fmt::format("S{}", it->second);
  }
  std::vector<std::string> dims(const dsl::SymShape& s) const {
    std::vector<std::string> out;
    for (const dsl::Dim& d : s.dims) out.push_back(dim(d));
    return out;
  }
  std::vector<std::string> dims(int id) const { return dims(st(id).type.shape); }

  std::string prologue() const {
    std::string out = "  [[maybe_unused]] const int64_t P = a->p, RK = a->r;\n";
    for (const auto& [sym, i] : sym_index_)
      out += fmt::format("  [[maybe_unused]] const int64_t S{} = a->sym[{}];  // {}\n", i, i, sym);
    return out;
  }

  std::string fresh(const std::string& prefix) { return fmt::format("{}{}", prefix, counter_++); }

  std::string base_ptr(int root_id) const {
    return fmt::format("a->buf[{}]", root_id);
  }

  // The access to value `v` (same rank as the loop, or a broadcast suffix) from a loop.
  Access access(int v, const LoopCtx& ctx) {
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
      unsupported(fmt::format("{} ({}) living in the buffer of {} ({})", name(v), dtype_name(st(v).type.dtype),
                              name(rt), dtype_name(rs.type.dtype)));
    const Storage storage = val(rt).storage;
    if (storage == Storage::None)
      unsupported(fmt::format("reading or writing {}, which the plan never stores", name(v)));
    if (storage == Storage::Block && !ctx.in_pipe) unsupported(fmt::format("block value {} used outside its pipeline", name(v)));
    const int vr = st(v).type.shape.rank();
    if (vr < ctx.rank) {
      if (storage != Storage::Full)
        unsupported(fmt::format("broadcast operand {} stored as {}", name(v), schedule::storage_name(storage)));
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
      if (!layout.is_sliced()) unsupported(fmt::format("slice storage of {} ({})", name(rt), layout.str()));
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

  // A pointer to global flat element `g` of value v's buffer, for whole-buffer calls
  // (collectives, transfers, copies): as C, typed `char*`-compatible `T*`.
  std::string pointer_at(int v, const std::string& g, bool in_pipe) {
    LoopCtx ctx;
    ctx.rank = st(v).type.shape.rank();
    ctx.in_pipe = in_pipe;
    const Access acc = access(v, ctx);
    return fmt::format("(static_cast<{}*>({}) + {})", ctype(acc.dtype), base_ptr(acc.root), at_index(acc.index, g));
  }

  // ---------------------------------------------------------------------------- loops

  // The f32 expression of elementwise stage s, from its operands' expressions.
  std::string formula(const dsl::Stage& s, const std::vector<std::string>& x, const LoopCtx& ctx,
                      const std::map<int, std::string>& seeds) {
    switch (s.op) {
      case Op::Scatter: return x[0];
      case Op::Update: return x[1];
      case Op::Select: return fmt::format("fx::select({}, {}, {})", x[0], x[1], x[2]);
      case Op::SegmentScale: return fmt::format("fx::mul({}, {})", x[0], x[1]);  // x[0]: the run's segment's factor
      case Op::Dropout: break;
      default:
        if (dsl::is_unary(s.op)) return fmt::format("fx::{}({})", dsl::formula_name(s.op), x[0]);
        if (dsl::is_binary(s.op)) return fmt::format("fx::{}({}, {})", dsl::formula_name(s.op), x[0], x[1]);
        unsupported(fmt::format("stage {} ({}) inside a loop", name(s.id), dsl::op_name(s.op)));
    }
    switch (s.op) {
      case Op::Dropout: {
        const double prob = s.attrs.value;
        const float pf = static_cast<float>(prob);
        const float scale = dsl::dropout_scale(prob);
        if (worded_.count(s.id))
          return fmt::format("fx::dropout_word({}, rw{}[t - t0], {}, {})", x[0], s.id, flit(pf), flit(scale));
        std::string index = fmt::format("static_cast<uint64_t>({})", elem_index_);
        if (s.type.shape.rank() < ctx.rank)
          index = fmt::format("static_cast<uint64_t>({} % {})", elem_index_, product(dims(s.id), 0, s.type.shape.dims.size()));
        return fmt::format("fx::dropout({}, {}, {}, {}, {})", x[0], seeds.at(s.id), index, flit(pf), flit(scale));
      }
      default: unsupported(fmt::format("stage {} ({}) inside a loop", name(s.id), dsl::op_name(s.op)));
    }
  }

  // Emits the run function and the driver of a loop; returns the driver's name. The driver is
  // `int name(const tandem_args*, const tandem_block*)` for Full/Slice domains and a
  // tandem_hook_fn for the Chunk domain.
  // What a loop reads and writes, for every target: its pointer parameters (one per buffer map),
  // the rank-0 values it reads from memory, its dropout seeds, and its stores.
  struct LoopIO {
    std::set<int> regs;                // the loop's stages (values in registers)
    std::vector<Access> params;        // pointer parameters, deduplicated by key
    std::vector<int> scalars;          // rank-0 operands read from memory, by stage id
    // The factors of segment_scale stages (f32[S]), read at the run's segment: the driver cuts the
    // runs at segment bounds, so each is one value per run, passed like a scalar.
    std::vector<int> segment_scalars;
    std::map<int, std::string> seeds;  // dropout stage -> its seed expression
    std::vector<int> seed_params;      // Scalar stages passed as seeds
    std::map<int, size_t> reads;       // operand stage -> param
    std::map<int, size_t> writes;      // stored stage -> param
    std::vector<int> stores;           // the loop's stores (and a hook's carried value)
  };
  LoopIO loop_io(const LoopCtx& ctx) {
    const schedule::Loop& loop = *ctx.loop;
    LoopIO io;
    io.regs = std::set<int>(loop.stages.begin(), loop.stages.end());
    std::set<int>& regs = io.regs;

    std::vector<Access>& params = io.params;
    auto param_of = [&](const Access& acc) -> size_t {
      for (size_t i = 0; i < params.size(); ++i)
        if (params[i].key == acc.key) {
          if (params[i].index != acc.index)
            unsupported(fmt::format("two maps into the buffer of {}", name(acc.root)));
          return i;
        }
      params.push_back(acc);
      return params.size() - 1;
    };
    std::vector<int>& scalars = io.scalars;
    std::map<int, std::string>& seeds = io.seeds;
    std::vector<int>& seed_params = io.seed_params;
    std::map<int, size_t>& reads = io.reads;
    std::map<int, size_t>& writes = io.writes;

    auto operand = [&](int id) {
      const int v = look_through(id);
      if (regs.count(id) || regs.count(v)) return;
      if (st(v).op == Op::Const) return;
      if (st(v).type.shape.rank() == 0 && ctx.rank > 0) {
        if (std::find(scalars.begin(), scalars.end(), v) == scalars.end()) scalars.push_back(v);
        return;
      }
      if (st(v).type.shape.rank() == 0 && !(ctx.chunk && v == ctx.coll_stage)) {
        // Scalar code (a rank-0 loop) reads rank-0 values once too.
        if (std::find(scalars.begin(), scalars.end(), v) == scalars.end()) scalars.push_back(v);
        return;
      }
      Access acc = access(v, ctx);
      acc.read = true;
      const size_t i = param_of(acc);
      params[i].read = true;
      reads[v] = i;
    };
    for (int id : loop.stages) {
      const dsl::Stage& s = st(id);
      const bool elementwise = dsl::op_kind(s.op) == dsl::OpKind::Elementwise || s.op == Op::Update ||
                               s.op == Op::Scatter;
      if (!elementwise) unsupported(fmt::format("stage {} ({}) inside a loop", name(id), dsl::op_name(s.op)));
      const size_t nvals = s.op == Op::Dropout ? 1 : (s.op == Op::Update ? 2 : s.args.size());
      for (size_t j = 0; j < nvals; ++j) {
        if (s.op == Op::Update && j == 0) continue;  // the target is written, not read
        if (s.op == Op::SegmentScale && j == 0) {
          const int t = look_through(s.args[0]);
          if (ctx.rank != 1) unsupported(fmt::format("{} in a loop of rank {}", name(id), ctx.rank));
          if (std::find(io.segment_scalars.begin(), io.segment_scalars.end(), t) == io.segment_scalars.end())
            io.segment_scalars.push_back(t);
          continue;
        }
        operand(s.args[j]);
      }
      if (s.op == Op::Dropout) {
        const dsl::Stage& seed = st(s.args[1]);
        if (seed.op == Op::Const) {
          seeds[id] = fmt::format("uint64_t{{{}}}", static_cast<uint64_t>(seed.attrs.value));
        } else if (seed.op == Op::Scalar) {
          seeds[id] = fmt::format("k{}", seed.id);
          if (std::find(seed_params.begin(), seed_params.end(), seed.id) == seed_params.end())
            seed_params.push_back(seed.id);
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
    std::vector<int>& stores = io.stores;
    stores = loop.stores;
    if (ctx.chunk && ctx.carry >= 0 && std::find(stores.begin(), stores.end(), ctx.carry) == stores.end())
      stores.push_back(ctx.carry);
    for (int id : stores) {
      if (!regs.count(id)) unsupported(fmt::format("storing {}, which the loop does not compute", name(id)));
      Access acc = access(id, ctx);
      const size_t i = param_of(acc);
      params[i].write = true;
      writes[id] = i;
    }
    return io;
  }

  virtual std::string emit_loop(const LoopCtx& ctx) {
    const schedule::Loop& loop = *ctx.loop;
    const std::string fn = fresh(ctx.chunk ? "hook" : "loop");
    LoopIO io = loop_io(ctx);
    const std::set<int>& regs = io.regs;
    std::vector<Access>& params = io.params;
    const std::vector<int>& scalars = io.scalars;
    const std::map<int, std::string>& seeds = io.seeds;
    const std::vector<int>& seed_params = io.seed_params;
    const std::map<int, size_t>& reads = io.reads;
    std::map<int, size_t>& writes = io.writes;
    const std::vector<int>& stores = io.stores;
    // Pointers sharing a buffer under different keys may overlap: no restrict for them.
    std::map<int, int> root_uses;
    for (const Access& a : params)
      if (a.root >= 0) ++root_uses[a.root];

    // ---- the run function: the straight, vectorisable loop
    std::vector<std::string> sig = {"int64_t n", "[[maybe_unused]] int64_t g0"};
    for (size_t i = 0; i < params.size(); ++i) {
      const Access& a = params[i];
      const bool shared = a.root >= 0 && root_uses[a.root] > 1;
      sig.push_back(fmt::format("{}{}* {}q{}", a.write ? "" : "const ", ctype(a.dtype), shared ? "" : "__restrict ", i));
    }
    for (int id : scalars) sig.push_back(fmt::format("float s{}", id));
    for (int id : io.segment_scalars) sig.push_back(fmt::format("float s{}", id));
    for (int id : seed_params) sig.push_back(fmt::format("uint64_t k{}", id));
    for (int id : loop.accumulates) sig.push_back(fmt::format("double* __restrict acc{}", id));

    // Scalar code (a rank-0 loop) is one element: no loop for the vectoriser to look at. Loops
    // that accumulate keep the fold out of the element loop: each tile of elements is computed
    // vectorised into a small array, then folded: a sum (norm: of squares) into its 8 double
    // lanes by global index (tdm_fold_sum8, vectorised), Prod / Max / Min in element order in
    // f32, as the reference folds them.
    const bool scalar_code = ctx.rank == 0 && !ctx.chunk;
    const bool tiled = !scalar_code && !loop.accumulates.empty();
    // A dropout keyed by the loop's own element index draws its random words a tile at a time:
    // one Philox block per 4 elements, vectorised across blocks (tdm_random_words), instead of
    // a whole block per element. Broadcast dropouts and loops that accumulate draw per element.
    worded_.clear();
    if (!scalar_code && !tiled)
      for (int id : loop.stages)
        if (st(id).op == Op::Dropout && st(id).type.shape.rank() == ctx.rank) worded_.insert(id);
    const std::string in = tiled || !worded_.empty() ? "      " : "    ";
    std::string elem;
    for (size_t i = 0; i < params.size(); ++i)
      if (params[i].read) elem += fmt::format("{}const float m{} = fx::ld_{}(q{}[t]);\n", in, i, dt_suffix(params[i].dtype), i);
    auto value_of = [&](int id) -> std::string {
      const int v = look_through(id);
      if (regs.count(id)) return fmt::format("v{}", id);
      if (regs.count(v)) return fmt::format("v{}", v);
      if (st(v).op == Op::Const) return flit(static_cast<float>(st(v).attrs.value));
      auto r = reads.find(v);
      if (r != reads.end()) return fmt::format("m{}", r->second);
      return fmt::format("s{}", v);
    };
    for (int id : loop.stages) {
      const dsl::Stage& s = st(id);
      std::vector<std::string> x;
      for (size_t j = 0; j < s.args.size(); ++j)
        x.push_back(s.op == Op::Update && j == 0 ? std::string() : (s.op == Op::Dropout && j == 1 ? std::string() : value_of(s.args[j])));
      const std::string f = formula(s, x, ctx, seeds);
      if (s.type.dtype == DType::F32)
        elem += fmt::format("{}const float v{} = {};  // {}\n", in, id, f, name(id));
      else
        elem += fmt::format("{}const float v{} = fx::rt_{}({});  // {}\n", in, id, dt_suffix(s.type.dtype), f, name(id));
    }
    std::string fold, lane_fold;
    auto lanes_of = [&](int id) { return acc_op(id) == dsl::ReduceOp::Sum; };
    for (int id : loop.accumulates) {
      const dsl::Stage& s = st(id);
      const std::string x = value_of(s.args[0]);
      if (lanes_of(id)) {
        // Double lanes keyed by the global index; a norm adds the exact square of x.
        const std::string fn_name = s.op == Op::Norm ? "tdm_fold_sumsq8" : "tdm_fold_sum8";
        if (tiled) {
          elem += fmt::format("{}tile{}[t - t0] = {};  // {}\n", in, id, x, name(id));
          lane_fold += fmt::format("    {}(acc{}, tile{}, tn, g0 + t0);\n", fn_name, id, id);
        } else {
          elem += fmt::format("{}{{ const float x = {}; {}(acc{}, &x, 1, g0 + t); }}  // {}\n", in, x, fn_name, id,
                              name(id));
        }
        continue;
      }
      const std::string fn_name = combine_fn(s.attrs.reduce);
      if (tiled) {
        elem += fmt::format("{}tile{}[t - t0] = {};  // {}\n", in, id, x, name(id));
        fold += fmt::format("      av{0} = {1}(av{0}, tile{0}[k]);\n", id, fn_name);
      } else {
        elem += fmt::format("{0}av{1} = {2}(av{1}, {3});  // {4}\n", in, id, fn_name, x, name(id));
      }
    }
    for (int id : stores)
      elem += fmt::format("{}q{}[t] = fx::st_{}(v{});\n", in, writes[id], dt_suffix(params[writes[id]].dtype), id);
    // A loop that only sums f32 values read from memory (a norm of a stored tensor) folds them
    // straight from their buffers: no tile to copy them into.
    std::string direct_fold;
    if (tiled && loop.stages.empty()) {
      for (int id : loop.accumulates) {
        auto r = reads.find(look_through(st(id).args[0]));
        if (!lanes_of(id) || r == reads.end() || params[r->second].dtype != DType::F32) {
          direct_fold.clear();
          break;
        }
        direct_fold += fmt::format("  {}(acc{}, q{}, n, g0);  // {}\n",
                                   st(id).op == Op::Norm ? "tdm_fold_sumsq8" : "tdm_fold_sum8", id, r->second, name(id));
      }
    }
    std::string body;
    // Prod / Max / Min keep one f32 value in the accumulator's first double (exactly).
    for (int id : loop.accumulates)
      if (!lanes_of(id)) body += fmt::format("  float av{0} = static_cast<float>(*acc{0});\n", id);
    if (scalar_code) {
      body += "  {\n    const int64_t t = 0;\n    (void)n;\n" + elem + "  }\n";
    } else if (!worded_.empty()) {
      body += "  for (int64_t t0 = 0; t0 < n; t0 += 256) {\n    const int64_t tn = tdm_min(n - t0, 256);\n";
      for (int id : worded_)
        body += fmt::format("    tdm_words w{0};\n    const uint32_t* rw{0} = tdm_random_words(&w{0}, {1}, "
                            "static_cast<uint64_t>(g0 + t0), tn);  // {2}\n",
                            id, seeds.at(id), name(id));
      body += "    for (int64_t t = t0; t < t0 + tn; ++t) {\n" + elem + "    }\n  }\n";
    } else if (!tiled) {
      body += "  for (int64_t t = 0; t < n; ++t) {\n" + elem + "  }\n";
    } else if (!direct_fold.empty()) {
      body += direct_fold;
    } else {
      body += "  for (int64_t t0 = 0; t0 < n; t0 += 256) {\n    const int64_t tn = tdm_min(n - t0, 256);\n";
      for (int id : loop.accumulates) body += fmt::format("    float tile{}[256];\n", id);
      body += "    for (int64_t t = t0; t < t0 + tn; ++t) {\n" + elem + "    }\n";
      body += lane_fold;
      if (!fold.empty())
        body += "    // In element order, as the reference folds them.\n    for (int64_t k = 0; k < tn; ++k) {\n" + fold + "    }\n";
      body += "  }\n";
    }
    for (int id : loop.accumulates)
      if (!lanes_of(id)) body += fmt::format("  *acc{0} = av{0};\n", id);
    fns_ += fmt::format("static void {}_run({}) {{\n{}}}\n\n", fn, fmt::join(sig, ", "), body);

    // ---- the driver: walks the domain in runs that are contiguous for every pointer
    std::vector<std::string> call_ptrs;
    for (size_t i = 0; i < params.size(); ++i) {
      const Access& a = params[i];
      if (a.kind == Access::Chunk)
        call_ptrs.push_back(fmt::format("static_cast<{}*>(chunk) + (g - g0)", ctype(a.dtype)));
      else
        call_ptrs.push_back(fmt::format("static_cast<{}{}*>({}) + {}", a.write ? "" : "const ", ctype(a.dtype),
                                        base_ptr(a.root), a.index));
    }
    std::string loads;
    for (int id : scalars) {
      const int rt = root(id);
      if (val(rt).storage == Storage::None) unsupported(fmt::format("reading {}, which the plan never stores", name(id)));
      if (val(rt).storage == Storage::Block) unsupported(fmt::format("rank-0 block value {}", name(id)));
      loads += fmt::format("  const float s{} = fx::ld_{}(static_cast<const {}*>(a->buf[{}])[0]);  // {}\n", id,
                           dt_suffix(st(rt).type.dtype), ctype(st(rt).type.dtype), rt, name(id));
    }
    for (int id : seed_params) loads += fmt::format("  const uint64_t k{0} = a->seed[{0}];  // {1}\n", id, name(id));
    std::vector<std::string> call = {"len", "g"};
    for (auto& s : call_ptrs) call.push_back(s);
    for (int id : scalars) call.push_back(fmt::format("s{}", id));
    for (int id : io.segment_scalars) call.push_back(fmt::format("s{}", id));
    for (int id : seed_params) call.push_back(fmt::format("k{}", id));
    for (int id : loop.accumulates) call.push_back(fmt::format("a->acc + {} * {}", kAccSlots, id));
    const std::string call_text = fmt::format("{}_run({})", fn, fmt::join(call, ", "));
    // With segment factors: `len` is cut at the end of g's segment, whose factors are loaded.
    std::string segment_cut;
    if (!io.segment_scalars.empty()) {
      segment_cut = "    const int64_t sg = tdm_segment_of(a->seg, a->nseg, g);\n    len = tdm_min(len, a->seg[sg + 1] - g);\n";
      for (int id : io.segment_scalars)
        segment_cut += fmt::format("    const float s{} = static_cast<const float*>(a->buf[{}])[sg];  // {}\n", id,
                                   root(id), name(id));
    }

    std::string driver;
    if (ctx.chunk) {
      driver = fmt::format(
          "static int {}(const tandem_args* a, void* chunk, int64_t n, int64_t g0, "
          "[[maybe_unused]] const tandem_block* blk) {{\n",
          fn);
      driver += prologue() + loads;
      driver += "  for (int64_t t = 0; t < n;) {\n    const int64_t g = g0 + t;\n    int64_t len = n - t;\n";
      std::set<std::string> moduli;
      for (const Access& a : params)
        if (!a.modulus.empty()) moduli.insert(a.modulus);
      for (const std::string& m : moduli) driver += fmt::format("    len = tdm_min(len, {0} - g % {0});\n", m);
      driver += segment_cut;
      driver += fmt::format("    {};\n    t += len;\n  }}\n  return 0;\n}}\n\n", call_text);
    } else {
      driver = fmt::format("static int {}(const tandem_args* a, [[maybe_unused]] const tandem_block* blk) {{\n", fn);
      driver += prologue() + loads;
      const int R = ctx.rank;
      if (R == 0) {
        driver += "  const int64_t len = 1, g = 0;\n  " + call_text + ";\n  return 0;\n}\n\n";
      } else {
        const LoopBox box = loop_box(ctx);
        const std::vector<std::string>& lo = box.lo;
        const std::vector<std::string>& cnt = box.cnt;
        const std::vector<bool>& whole = box.whole;
        // The runs span dims c..R-1: every dim after c whole, and every pointer contiguous.
        int c = 0;
        for (int i = 0; i < R; ++i)
          if (!whole[static_cast<size_t>(i)]) c = std::max(c, i);
        for (const Access& a : params) {
          if (a.kind == Access::Part) {
            if (whole[static_cast<size_t>(a.part_dim)] && !(a.part_dim == 0 && ctx.in_pipe))
              unsupported(fmt::format("{} is held as a part of dim {}, but the loop covers that whole dim",
                                      name(a.root), a.part_dim));
            c = std::max(c, a.part_dim);
          }
          if (a.kind == Access::Bcast) c = std::max(c, R - a.bcast_rank);
        }
        c = std::min(c, R - 1);
        for (int i = 0; i <= c; ++i)
          driver += fmt::format("  const int64_t lo{0} = {1}, n{0} = {2};\n", i, lo[static_cast<size_t>(i)],
                                cnt[static_cast<size_t>(i)]);
        std::vector<std::string> run_dims = {fmt::format("n{}", c)};
        for (int i = c + 1; i < R; ++i) run_dims.push_back(ctx.extents[static_cast<size_t>(i)]);
        if (!segment_cut.empty()) {  // rank 1 (loop_io checked): the runs of each segment in turn
          driver += "  for (int64_t t = 0; t < n0;) {\n    const int64_t g = lo0 + t;\n    int64_t len = n0 - t;\n";
          driver += segment_cut + fmt::format("    {};\n    t += len;\n  }}\n  return 0;\n}}\n\n", call_text);
          fns_ += driver;
          return fn;
        }
        driver += fmt::format("  const int64_t len = {};\n  if (len <= 0) return 0;\n", product(run_dims, 0, run_dims.size()));
        std::string indent = "  ";
        for (int i = 0; i < c; ++i) {
          driver += fmt::format("{0}for (int64_t x{1} = lo{1}; x{1} < lo{1} + n{1}; ++x{1}) {{\n", indent, i);
          indent += "  ";
        }
        std::string flat = "int64_t{0}";
        for (int i = 0; i <= c; ++i)
          flat = fmt::format("({} * {} + {})", flat, ctx.extents[static_cast<size_t>(i)],
                             i < c ? fmt::format("x{}", i) : fmt::format("lo{}", i));
        flat = fmt::format("{} * {}", flat, product(ctx.extents, static_cast<size_t>(c) + 1, ctx.extents.size()));
        driver += fmt::format("{}const int64_t g = {};\n{}{};\n", indent, flat, indent, call_text);
        for (int i = c - 1; i >= 0; --i) {
          indent.resize(indent.size() - 2);
          driver += indent + "}\n";
        }
        driver += "  return 0;\n}\n\n";
      }
    }
    fns_ += driver;
    return fn;
  }

  LoopCtx loop_ctx(const schedule::Loop& loop, bool in_pipe) const {
    LoopCtx ctx;
    ctx.loop = &loop;
    ctx.rank = loop.shape.rank();
    ctx.extents = dims(loop.shape);
    ctx.in_pipe = in_pipe;
    return ctx;
  }

  // ---------------------------------------------------------------------------- steps

  // Per top-level step: `tandem_step_<k>`, which checks the group and calls the step's function.
  std::string emit_top_step(const Step& s) {
    const std::string fn = emit_step(s, false, nullptr);
    std::string out = fmt::format("// step {}: {}", step_, s.label.empty() ? std::string(schedule::step_kind_name(s.kind)) : s.label);
    out += fmt::format("\nextern \"C\" int {}(const tandem_args* a) {{\n", step_symbol(step_));
    if (s.group != dsl::kAllGroups) out += fmt::format("  if (a->group != {}) return 0;\n", s.group);
    // Accumulators start from their identity at the first step that folds into them.
    for (int id : accumulated_in(s))
      if (acc_started_.insert(id).second) {
        out += acc_init_text(id);
      }
    out += fmt::format("  return {}(a{});\n}}\n\n", fn, s.kind == StepKind::Pipeline ? "" : ", nullptr");
    return out;
  }

  dsl::ReduceOp acc_op(int id) const { return st(id).op == Op::Norm ? dsl::ReduceOp::Sum : st(id).attrs.reduce; }

  std::vector<int> accumulated_in(const Step& s) const {
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

  // Emits the function of one step; returns its name. Inside a pipeline the function takes the
  // block; a Pipeline's function takes only the args.
  std::string emit_step(const Step& s, bool in_pipe, const schedule::Pipeline* pipe) {
    switch (s.kind) {
      case StepKind::Loop: {
        if (s.loop.domain == Domain::Chunk) unsupported("a chunk loop outside a collective");
        return emit_loop(loop_ctx(s.loop, in_pipe));
      }
      case StepKind::Collective: return emit_collective(s, in_pipe);
      case StepKind::Reduce: return emit_reduce(s, in_pipe);
      case StepKind::Finish: return emit_finish(s, in_pipe);
      case StepKind::Matmul: return emit_matmul(s, in_pipe);
      case StepKind::Send:
      case StepKind::Recv: return emit_transfer(s, in_pipe, pipe);
      case StepKind::Pipeline: {
        if (in_pipe) unsupported("a pipeline inside a pipeline");
        return emit_pipeline(s);
      }
    }
    unsupported("an unknown step kind");
  }

  // The element count and collective geometry of value v, whole or (in a pipeline) one block.
  struct Geometry {
    std::string numel, outer, rows, inner, first;  // first: the global flat index of element 0
  };
  Geometry geometry(int v, bool in_pipe, const schedule::Collective* c) {
    std::vector<std::string> e = dims(v);
    Geometry g;
    if (e.empty()) e = {"int64_t{1}"};
    std::string rows0 = e[0];
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
      if (d < 0 || d >= static_cast<int>(e.size())) unsupported(fmt::format("a collective partitioned along dim {}", d));
      g.outer = product(e, 0, static_cast<size_t>(d));
      g.rows = e[static_cast<size_t>(d)];
      g.inner = product(e, static_cast<size_t>(d) + 1, e.size());
    }
    return g;
  }

  std::string emit_collective(const Step& s, bool in_pipe) {
    const schedule::Collective& c = s.collective;
    const std::string fn = fresh("coll");
    const int v = c.stage;
    const dsl::Stage& vs = st(v);
    std::string hook = "nullptr";
    if (c.fused) {
      if (c.op != Op::AllReduce && c.op != Op::ReduceScatter) unsupported(fmt::format("a hook on {}", dsl::op_name(c.op)));
      if (c.fused->domain != Domain::Chunk) unsupported("a fused loop whose domain is not the chunks");
      LoopCtx ctx = loop_ctx(*c.fused, in_pipe);
      ctx.chunk = true;
      ctx.coll_stage = v;
      ctx.carry = c.carry;
      if (c.carry >= 0 && (st(c.carry).type.dtype != vs.type.dtype || !(st(c.carry).type.shape == vs.type.shape)))
        unsupported(fmt::format("carrying {} through the buffer of {}", name(c.carry), name(v)));
      hook = emit_loop(ctx);
    }
    const Geometry g = geometry(v, in_pipe, &c);
    const DType dt = vs.type.dtype;
    std::string body = fmt::format("static int {}(const tandem_args* a, [[maybe_unused]] const tandem_block* blk) {{\n", fn);
    body += prologue();
    body += "  tandem_collective c;\n  std::memset(&c, 0, sizeof c);\n";
    int kind = 0;
    const std::string numel = g.numel;
    auto copy = [&](int from, int to) {
      if (from < 0 || root(look_through(from)) == root(to)) return std::string();
      if (st(look_through(from)).type.dtype != st(to).type.dtype)
        unsupported(fmt::format("copying {} into {} of another dtype", name(from), name(to)));
      return copy_text(numel, pointer_at(to, g.first, in_pipe), pointer_at(look_through(from), g.first, in_pipe),
                       dtype_size(dt));
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
            body += fmt::format("  c.recv = {};\n  c.recv_whole = 1;\n", pointer_at(root(v), g.first, in_pipe));
          } else if (sv == Storage::Slice || sv == Storage::Block) {
            body += fmt::format("  c.recv = {};\n", stored_piece(v, in_pipe).first);
          } else {
            unsupported(fmt::format("reduce-scatter into {} stored as {}", name(v), schedule::storage_name(sv)));
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
            unsupported(fmt::format("all-gather of {} stored as {}", name(x), schedule::storage_name(sx)));
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
      default: unsupported(fmt::format("collective {}", dsl::op_name(c.op)));
    }
    body += fmt::format(
        "  c.step = {}; c.kind = {}; c.op = {}; c.dtype = {}; c.root = {}; c.async = {}; c.carry = {};\n", step_, kind,
        reduce_op_code(c.reduce), dtype_code(dt), c.root, in_pipe ? 1 : 0, c.carry >= 0 ? 1 : 0);
    body += fmt::format("  c.outer = {}; c.rows = {}; c.inner = {};\n  c.index_base = {};\n  c.hook = {};\n", g.outer,
                        g.rows, g.inner, g.first, hook);
    body += in_pipe ? "  c.block = *blk;\n" : "  c.block.index = -1;\n";
    body += "  return a->collective(a->host, &c);\n}\n\n";
    fns_ += body;
    return fn;
  }

  std::string emit_transfer(const Step& s, bool in_pipe, const schedule::Pipeline* pipe) {
    const schedule::Transfer& t = s.transfer;
    const bool recv = s.kind == StepKind::Recv;
    const int v = recv ? t.stage : look_through(t.value);
    const int send_stage = recv ? st(t.stage).args[0] : t.stage;
    if (send_stage > 32766) unsupported(fmt::format("send {} beyond the taggable stages", name(send_stage)));
    const Storage sv = val(root(v)).storage;
    if (sv == Storage::None) unsupported(fmt::format("transferring {}, which the plan never stores", name(v)));
    // The message structure is the sender's: one message, or one per block of its pipeline.
    const int wire_blocks = sender_blocks(send_stage);
    const std::string fn = fresh(recv ? "recv" : "send");
    std::string body = fmt::format("static int {}(const tandem_args* a, [[maybe_unused]] const tandem_block* blk) {{\n", fn);
    body += prologue();
    const DType dt = st(v).type.dtype;
    std::vector<std::string> e = dims(v);
    auto emit_one = [&](const std::string& ptr, const std::string& elems, const std::string& block) {
      return fmt::format(
          "  {{\n    tandem_transfer t;\n    std::memset(&t, 0, sizeof t);\n    t.step = {}; t.recv = {}; t.peer_group = {}; "
          "t.tag = {}; t.async = {}; t.block = {};\n    t.data = {};\n    t.bytes = {} * {};\n"
          "    if ((rc = a->transfer(a->host, &t)) != 0) return rc;\n  }}\n",
          step_, recv ? 1 : 0, t.peer_group, send_stage, in_pipe ? 1 : 0, block, ptr, elems, dtype_size(dt));
    };
    body += "  int rc = 0;\n";
    if (in_pipe) {
      if (wire_blocks != pipe->blocks)
        unsupported(fmt::format("{} in blocks that the send of {} does not use", recv ? "a receive" : "a send", name(send_stage)));
      const auto [ptr, numel] = stored_piece(v, true);
      body += emit_one(ptr, numel, "blk->index");
    } else if (wire_blocks > 1) {
      if (!recv) unsupported("a send in blocks outside a pipeline");
      if (sv != Storage::Full || e.empty()) unsupported(fmt::format("receiving {} in blocks", name(v)));
      const std::string rest = product(e, 1, e.size());
      body += fmt::format("  for (int32_t b = 0; b < {}; ++b) {{\n", wire_blocks);
      body += fmt::format("    const int64_t row0 = fx::part_offset({0}, {1}, b), rows = fx::part_count({0}, {1}, b);\n", e[0],
                          wire_blocks);
      body += emit_one(fmt::format("(static_cast<{}*>(a->buf[{}]) + row0 * {})", ctype(dt), root(v), rest),
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

  // This rank's stored piece of value v, as one contiguous span: (pointer, element count) in C.
  // In a pipeline: the block's rows (a Full value) or the block's part (a Block value).
  std::pair<std::string, std::string> stored_piece(int v, bool in_pipe) {
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
      return {fmt::format("(static_cast<{}*>({}) + {})", ctype(st(rt).type.dtype), base_ptr(rt), first), product(d, 0, d.size())};
    }
    if (sv == Storage::Slice) {
      if (in_pipe) unsupported(fmt::format("the slice {} handled block by block", name(v)));
      std::vector<std::string> d = e;
      d[static_cast<size_t>(l.dim)] = part(e[static_cast<size_t>(l.dim)]);
      if (sr == Storage::Slice) return {fmt::format("static_cast<{}*>({})", ctype(st(rt).type.dtype), base_ptr(rt)), product(d, 0, d.size())};
      if (l.dim != 0) unsupported(fmt::format("the slice {} along dim {} of a whole buffer (not contiguous)", name(v), l.dim));
      return {pointer_at(v, fmt::format("fx::part_offset({}, P, RK) * {}", e[0], inner), false), product(d, 0, d.size())};
    }
    if (in_pipe) return {pointer_at(v, fmt::format("blk->row0 * {}", inner), true), fmt::format("(blk->rows * {})", inner)};
    return {pointer_at(v, "int64_t{0}", false), product(e, 0, e.size())};
  }

  // The number of blocks the send of `send_stage` goes out in (1 outside a pipeline).
  int sender_blocks(int send_stage) const {
    for (const Step& s : plan_.steps) {
      if (s.kind == StepKind::Send && s.transfer.stage == send_stage) return 1;
      if (s.kind == StepKind::Pipeline)
        for (const Step& b : s.pipeline.body)
          if (b.kind == StepKind::Send && b.transfer.stage == send_stage) return s.pipeline.blocks;
    }
    return 1;
  }

  virtual std::string emit_finish(const Step& s, bool in_pipe) {
    const int id = s.finish.stage;
    const dsl::Stage& fs = st(id);
    const int rt = root(id);
    if (val(rt).storage != Storage::Full) unsupported(fmt::format("finishing {} stored as {}", name(id), schedule::storage_name(val(rt).storage)));
    const std::string fn = fresh("finish");
    std::string body = fmt::format("static int {}(const tandem_args* a, [[maybe_unused]] const tandem_block* blk) {{\n", fn);
    body += prologue();
    // A sum's lanes added in order and rounded once; Prod / Max / Min: the f32 value.
    if (acc_op(id) == dsl::ReduceOp::Sum)
      body += fmt::format("  float v = tdm_sum_lanes(a->acc + {} * {});\n", kAccSlots, id);
    else
      body += fmt::format("  float v = static_cast<float>(a->acc[{} * {}]);\n", kAccSlots, id);
    if (s.finish.across_ranks) {
      // The ranks' f32 values, all-reduced in f32.
      if (in_pipe) body += "  if (int rc = a->sync(a->host, blk->index)) return rc;\n";
      body += fmt::format(
          "  {{\n    tandem_collective c;\n    std::memset(&c, 0, sizeof c);\n    c.step = {}; c.kind = 0; c.op = {}; c.dtype = 0;\n"
          "    c.send = &v; c.outer = 1; c.rows = 1; c.inner = 1; c.block.index = -1;\n"
          "    if (int rc = a->collective(a->host, &c)) return rc;\n  }}\n",
          step_, reduce_op_code(acc_op(id)));
    }
    if (fs.op == Op::Norm) body += "  v = std::sqrt(v);\n";
    body += fmt::format("  static_cast<{}*>(a->buf[{}])[0] = fx::st_{}(v);  // {}\n  return 0;\n}}\n\n", ctype(fs.type.dtype), rt,
                        dt_suffix(fs.type.dtype), name(id));
    fns_ += body;
    return fn;
  }

  // The stored piece of value v as C: its dims (local extents) and whether index = local flat.
  std::vector<std::string> local_dims(int v) {
    const int rt = root(v);
    std::vector<std::string> e = dims(v);
    const Storage s = val(rt).storage;
    if (s == Storage::Full && val(v).storage == Storage::Full) return e;
    if (s == Storage::Slice && rt != v && val(v).storage != Storage::Slice)
      unsupported(fmt::format("{} read through the slice buffer of {}", name(v), name(rt)));
    if (s == Storage::Slice) {
      const dsl::Layout l = st(rt).type.layout;
      e[static_cast<size_t>(l.dim)] = fmt::format("fx::part_count({}, P, RK)", e[static_cast<size_t>(l.dim)]);
      return e;
    }
    unsupported(fmt::format("{} held as {} in the buffer of {}", name(v), schedule::storage_name(val(v).storage), name(rt)));
  }

  // A segment norm (ir.h): this rank's piece folded per segment (tdm_segment_sumsq, which is
  // dsl::segment_sums_of_squares), one all-reduce of the S partials when the operand is Sliced,
  // then the square roots.
  std::string emit_segment_norm(const Step& s) {
    const int id = s.reduce.stage;
    const int x = look_through(st(id).args[0]);
    const auto [ptr, count] = stored_piece(x, false);
    const std::string fn = fresh("segnorm");
    const std::string extent = dims(x)[0];
    std::string body = fmt::format("static int {}(const tandem_args* a, [[maybe_unused]] const tandem_block* blk) {{\n", fn);
    body += prologue();
    body += "  float* part = a->scratch;\n";
    body += fmt::format("  tdm_segment_sumsq({}, {}, {}, a->seg, a->nseg, part);\n", ptr,
                        s.reduce.across_ranks ? fmt::format("fx::part_offset({}, P, RK)", extent) : "int64_t{0}", count);
    if (s.reduce.across_ranks)
      body += fmt::format(
          "  {{\n    tandem_collective c;\n    std::memset(&c, 0, sizeof c);\n    c.step = {}; c.kind = 0; c.op = 0; c.dtype = 0;\n"
          "    c.send = part; c.outer = 1; c.rows = a->nseg; c.inner = 1; c.block.index = -1;\n"
          "    if (int rc = a->collective(a->host, &c)) return rc;\n  }}\n",
          step_);
    body += fmt::format("  float* out = static_cast<float*>(a->buf[{}]);\n", root(id));
    body += "  for (int64_t i = 0; i < a->nseg; ++i) out[i] = fx::st_f32(std::sqrt(part[i]));\n  return 0;\n}\n\n";
    scratch_.push_back("  if (a->nseg > need) need = a->nseg;\n");
    fns_ += body;
    return fn;
  }

  virtual std::string emit_reduce(const Step& s, bool in_pipe) {
    if (in_pipe) unsupported("a reduction inside a pipeline");
    const int id = s.reduce.stage;
    const dsl::Stage& rs = st(id);
    if (rs.op == Op::SegmentNorm) return emit_segment_norm(s);
    const int x = look_through(rs.args[0]);
    const int k = rs.attrs.dim;
    if (k < 0) unsupported(fmt::format("reduce step {} over every dim (that is a loop accumulation)", name(id)));
    const std::vector<std::string> xe = local_dims(x);
    const std::vector<std::string> oe = local_dims(id);
    const std::string fn = fresh("reduce");
    const std::string outer = product(xe, 0, static_cast<size_t>(k)), rows = xe[static_cast<size_t>(k)],
                      inner = product(xe, static_cast<size_t>(k) + 1, xe.size());
    std::string body = fmt::format("static int {}(const tandem_args* a, [[maybe_unused]] const tandem_block* blk) {{\n", fn);
    body += prologue();
    const DType xd = st(x).type.dtype, od = rs.type.dtype;
    body += fmt::format("  const int64_t outer = {}, rows = {}, inner = {};\n", outer, rows, inner);
    body += fmt::format("  const {}* x = static_cast<const {}*>(a->buf[{}]);\n", ctype(xd), ctype(xd), root(x));
    body += "  float* part = a->scratch;\n";
    body += fmt::format(
        "  for (int64_t o = 0; o < outer; ++o)\n    for (int64_t i = 0; i < inner; ++i) {{\n      float acc = {};\n"
        "      for (int64_t k = 0; k < rows; ++k) acc = {}(acc, fx::ld_{}(x[(o * rows + k) * inner + i]));\n"
        "      part[o * inner + i] = acc;\n    }}\n",
        identity_literal(rs.attrs.reduce), combine_fn(rs.attrs.reduce), dt_suffix(xd));
    if (s.reduce.across_ranks)
      body += fmt::format(
          "  {{\n    tandem_collective c;\n    std::memset(&c, 0, sizeof c);\n    c.step = {}; c.kind = 0; c.op = {}; c.dtype = 0;\n"
          "    c.send = part; c.outer = 1; c.rows = outer * inner; c.inner = 1; c.block.index = -1;\n"
          "    if (int rc = a->collective(a->host, &c)) return rc;\n  }}\n",
          step_, reduce_op_code(rs.attrs.reduce));
    body += fmt::format("  {}* out = static_cast<{}*>(a->buf[{}]);\n", ctype(od), ctype(od), root(id));
    body += fmt::format("  for (int64_t i = 0; i < {}; ++i) out[i] = fx::st_{}(part[i]);\n  return 0;\n}}\n\n",
                        product(oe, 0, oe.size()), dt_suffix(od));
    scratch_.push_back(fmt::format("  {{ const int64_t e = {} * {}; if (e > need) need = e; }}\n", outer, inner));
    fns_ += body;
    return fn;
  }

  // One matrix operand (or the result) of a matmul, as the rows x cols sub-matrix of its
  // buffer: base pointer, leading dimension, and the distance between batches.
  struct Matrix {
    int v = -1;
    DType dtype = DType::F32;
    std::string base;      // C: pointer to element (batch 0, row lo, col lo)
    std::string ld;        // C
    std::string batch;     // C: elements between batches (0 when not batched)
  };

  // Sub-matrix of value v (rank q >= 2) with rows [rlo, rlo + rows) and cols [clo, clo + cols)
  // in global coordinates.
  Matrix matrix(int v, const std::string& rlo, const std::string& clo, bool in_pipe) {
    Matrix m;
    m.v = v;
    m.dtype = st(v).type.dtype;
    const std::vector<std::string> e = dims(v);
    const int q = static_cast<int>(e.size());
    const int rt = root(v);
    const Storage s = val(rt).storage;
    if (s == Storage::None) unsupported(fmt::format("matmul operand {}, which the plan never stores", name(v)));
    if (st(rt).type.shape.rank() != q) unsupported(fmt::format("matmul operand {} in the buffer of {}", name(v), name(rt)));
    // The buffer's extents of the last two dims.
    std::string brows = e[static_cast<size_t>(q - 2)], bcols = e[static_cast<size_t>(q - 1)];
    const dsl::Layout l = st(rt).type.layout;
    if (s == Storage::Slice || (s == Storage::Block && l.is_sliced())) {
      if (l.dim == q - 1) bcols = fmt::format("fx::part_count({}, P, RK)", e[static_cast<size_t>(q - 1)]);
      else if (l.dim == q - 2 && s == Storage::Slice) brows = fmt::format("fx::part_count({}, P, RK)", e[static_cast<size_t>(q - 2)]);
      else unsupported(fmt::format("matmul operand {} sliced along dim {}", name(v), l.dim));
    }
    if (s == Storage::Block && q != 2) unsupported("a batched matmul in a pipeline");
    if (s == Storage::Block && l.is_sliced() && l.dim == 0) unsupported(fmt::format("matmul operand {} sliced by rows in a block", name(v)));
    m.ld = bcols;
    m.batch = q > 2 ? fmt::format("({} * {})", brows, bcols) : "int64_t{0}";
    const std::string g = fmt::format("({} * {} + {})", rlo, e[static_cast<size_t>(q - 1)], clo);
    LoopCtx ctx;
    ctx.rank = q;
    ctx.in_pipe = in_pipe;
    const Access acc = access(v, ctx);
    m.base = fmt::format("(static_cast<{}*>({}) + {})", ctype(m.dtype), base_ptr(rt), at_index(acc.index, g));
    return m;
  }

  // A matmul's three matrices and extents on this rank (a block's rows in a pipeline).
  struct MatmulDims {
    Matrix A, B, C;
    std::string mn, kn, nn;  // C: this rank's m, k, n
    int qa = 0, qb = 0, qc = 0;
    std::vector<std::string> ec;  // C's dims
  };
  MatmulDims matmul_dims(const Step& s, bool in_pipe) {
    const int id = s.matmul.stage;
    const dsl::Stage& ms = st(id);
    const dsl::Stage& as = st(ms.args[0]);
    const dsl::Stage& bs = st(ms.args[1]);
    const dsl::Layout la = as.type.layout, lb = bs.type.layout, lc = ms.type.layout;
    const int qa = as.type.shape.rank(), qb = bs.type.shape.rank(), qc = ms.type.shape.rank();
    const std::vector<std::string> ea = dims(as.id), eb = dims(bs.id), ec = dims(id);
    auto part = [](const std::string& n) {
      return std::pair{fmt::format("fx::part_offset({}, P, RK)", n), fmt::format("fx::part_count({}, P, RK)", n)};
    };
    const std::string M = ea[static_cast<size_t>(qa - 2)], K = ea[static_cast<size_t>(qa - 1)],
                      N = eb[static_cast<size_t>(qb - 1)];
    // Batch dims are never sliced here; rows of A (and C), the contraction, and columns of B
    // (and C) may be: a rank reads its own part, or the matching part of a replicated partner.
    for (const auto& [l, q, who] : {std::tuple{la, qa, as.id}, std::tuple{lb, qb, bs.id}, std::tuple{lc, qc, id}})
      if (l.is_sliced() && l.dim < q - 2)
        unsupported(fmt::format("matmul {} with {} sliced along batch dim {}", name(id), name(who), l.dim));
    std::string mlo = "int64_t{0}", mn = M, klo = "int64_t{0}", kn = K, nlo = "int64_t{0}", nn = N;
    if (la.is_sliced() && la.dim == qa - 2) std::tie(mlo, mn) = part(M);
    if ((la.is_sliced() && la.dim == qa - 1) || (lb.is_sliced() && lb.dim == qb - 2)) std::tie(klo, kn) = part(K);
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

  virtual std::string emit_matmul(const Step& s, bool in_pipe) {
    const int id = s.matmul.stage;
    const MatmulDims d = matmul_dims(s, in_pipe);
    const Matrix &A = d.A, &B = d.B, &C = d.C;
    const std::string &mn = d.mn, &kn = d.kn, &nn = d.nn;
    const int qa = d.qa, qb = d.qb, qc = d.qc;
    const std::vector<std::string>& ec = d.ec;
    const std::string fn = fresh("matmul");
    std::string body = fmt::format("static int {}(const tandem_args* a, [[maybe_unused]] const tandem_block* blk) {{\n", fn);
    body += prologue();
    body += fmt::format("  const int64_t m = {}, k = {}, n = {};  // {}\n", mn, kn, nn, name(id));
    body += fmt::format("  const int64_t batches = {};\n", product(ec, 0, static_cast<size_t>(qc - 2)));
    body += "  if (m <= 0 || n <= 0) return 0;\n  [[maybe_unused]] float* scratch = a->scratch;\n";
    body += "  for (int64_t bt = 0; bt < batches; ++bt) {\n";
    // Operands that are not f32 are converted into scratch: [A][B][C], each only when needed.
    std::string off = "int64_t{0}";
    std::vector<std::string> scratch_parts;
    auto emit_in = [&](const Matrix& X, int q, const std::string& tag, const std::string& rows, const std::string& cols,
                       const std::string& rows_c, const std::string& cols_c) {
      const std::string src = fmt::format("({} + bt * {})", X.base, q > 2 ? X.batch : std::string("int64_t{0}"));
      if (X.dtype == DType::F32) {
        body += fmt::format("    const float* p{0} = {1};\n    const int64_t ld{0} = {2};\n", tag, src, X.ld);
        return;
      }
      body += fmt::format(
          "    float* p{0} = scratch + {1};\n    const int64_t ld{0} = {3};\n    {{\n      const {4}* src = {2};\n"
          "      for (int64_t i = 0; i < {5}; ++i)\n        for (int64_t j = 0; j < {3}; ++j) p{0}[i * {3} + j] = "
          "fx::ld_{6}(src[i * {7} + j]);\n    }}\n",
          tag, off, src, cols, ctype(X.dtype), rows, dt_suffix(X.dtype), X.ld);
      off = fmt::format("{} + {} * {}", off, rows, cols);
      scratch_parts.push_back(fmt::format("{} * {}", rows_c, cols_c));
    };
    emit_in(A, qa, "a", "m", "k", mn, kn);
    emit_in(B, qb, "b", "k", "n", kn, nn);
    const std::string csrc = fmt::format("({} + bt * {})", C.base, qc > 2 ? C.batch : std::string("int64_t{0}"));
    if (C.dtype == DType::F32) {
      body += fmt::format("    float* pc = {};\n    const int64_t ldc = {};\n", csrc, C.ld);
    } else {
      body += fmt::format("    float* pc = scratch + {};\n    const int64_t ldc = n;\n", off);
      scratch_parts.push_back(fmt::format("{} * {}", mn, nn));
    }
    body +=
        "    if (k > 0) {\n"
        "      a->sgemm(0, 0, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, pa, static_cast<int>(lda),\n"
        "               pb, static_cast<int>(ldb), 0.0f, pc, static_cast<int>(ldc));\n"
        "    } else {\n"
        "      for (int64_t i = 0; i < m; ++i)\n        for (int64_t j = 0; j < n; ++j) pc[i * ldc + j] = 0.0f;\n    }\n";
    if (C.dtype != DType::F32)
      body += fmt::format(
          "    {{\n      {0}* dst = {1};\n      for (int64_t i = 0; i < m; ++i)\n        for (int64_t j = 0; j < n; ++j) "
          "dst[i * {2} + j] = fx::st_{3}(pc[i * n + j]);\n    }}\n",
          ctype(C.dtype), csrc, C.ld, dt_suffix(C.dtype));
    body += "  }\n  return 0;\n}\n\n";
    if (!scratch_parts.empty())
      scratch_.push_back(fmt::format("  {{ {}const int64_t e = {}; if (e > need) need = e; }}\n",
                                     in_pipe ? scratch_block_prefix_ : std::string(), fmt::join(scratch_parts, " + ")));
    fns_ += body;
    return fn;
  }

  // ---------------------------------------------------------------------------- pipelines

  // The buffers a step reads and writes (by root), for the pipeline's dependencies.
  void footprint(const Step& s, std::set<int>& reads, std::set<int>& writes) {
    auto rd = [&](int id) {
      id = look_through(id);
      if (id >= 0 && val(root(id)).storage != Storage::None) reads.insert(root(id));
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
      case StepKind::Loop: loop(s.loop); break;
      case StepKind::Matmul: rd(st(s.matmul.stage).args[0]); rd(st(s.matmul.stage).args[1]); wr(s.matmul.stage); break;
      case StepKind::Reduce: rd(st(s.reduce.stage).args[0]); wr(s.reduce.stage); break;
      case StepKind::Finish: wr(s.finish.stage); break;
      case StepKind::Collective:
        rd(s.collective.operand);
        rd(s.collective.stage);
        wr(s.collective.stage);
        if (s.collective.fused) loop(*s.collective.fused);
        if (s.collective.carry >= 0) wr(s.collective.carry);
        break;
      case StepKind::Send: rd(s.transfer.value); break;
      case StepKind::Recv: wr(s.transfer.stage); break;
      case StepKind::Pipeline: break;
    }
  }

  static bool is_async(const Step& s) {
    return s.kind == StepKind::Collective || s.kind == StepKind::Send || s.kind == StepKind::Recv;
  }

  std::string emit_pipeline(const Step& s) {
    const schedule::Pipeline& pipe = s.pipeline;
    if (pipe.values.empty()) unsupported("a pipeline without blocked values");
    if (pipe.blocks < 1) unsupported(fmt::format("a pipeline of {} blocks", pipe.blocks));
    const dsl::SymShape& first = st(pipe.values[0]).type.shape;
    if (first.rank() < 1) unsupported("a pipeline over rank-0 values");
    const dsl::Dim rows = first[0];
    for (int v : pipe.values)
      if (st(v).type.shape.rank() < 1 || !(st(v).type.shape[0] == rows))
        unsupported(fmt::format("pipelined values with different rows ({} has {})", name(v), st(v).type.shape.str()));
    const std::string R = dim(rows);
    scratch_block_prefix_ = fmt::format(
        "const tandem_block blk0 = {{0, fx::part_count({}, {}, 0), 0, 0, {}}}; [[maybe_unused]] const tandem_block* blk = &blk0; ",
        R, pipe.blocks, pipe.blocks);
    std::vector<std::string> calls;
    std::set<int> async_reads, async_writes;
    size_t first_wait = pipe.body.size();    // the first step that waits for the block's communication
    std::set<int> head_reads, head_writes, tail_writes;  // roots read / written before it, written after
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
          call += "    if ((rc = a->sync(a->host, blk->index)) != 0) return rc;  // needs this block's communication\n";
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
    body += fmt::format("  const int64_t rows = {};\n  const int32_t blocks = {};\n  int rc = 0;\n", R, pipe.blocks);
    if (skew) {
      // Block b + 1's steps up to its first wait for communication are issued before block b's
      // remaining steps: b + 1's work (a GEMM) is queued while b's collective is in flight.
      body +=
          "  // Skewed: the head of block b + 1 (up to its first wait) is issued before the tail of block b.\n"
          "  auto block_of = [&](int32_t b) {\n"
          "    int64_t part_row0 = 0;  // this rank's rows of the row-sliced block values before block b\n"
          "    for (int32_t j = 0; j < b; ++j) part_row0 += fx::part_count(fx::part_count(rows, blocks, j), P, RK);\n"
          "    return tandem_block{fx::part_offset(rows, blocks, b), fx::part_count(rows, blocks, b), part_row0, b, blocks};\n"
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
        for (size_t pos = 0; (pos = c.find("\n    ", pos)) != std::string::npos; pos += 7) c.replace(pos, 5, "\n      ");
        body += "  " + c;
      }
      body += "    }\n  }\n  return a->sync(a->host, -1);\n}\n\n";
    } else {
      body +=
          "  int64_t part_row0 = 0;  // this rank's rows of the row-sliced block values so far\n"
          "  for (int32_t b = 0; b < blocks; ++b) {\n"
          "    const int64_t row0 = fx::part_offset(rows, blocks, b), count = fx::part_count(rows, blocks, b);\n"
          "    const tandem_block blk_ = {row0, count, part_row0, b, blocks};\n"
          "    const tandem_block* blk = &blk_;\n"
          "    part_row0 += fx::part_count(count, P, RK);\n";
      for (const std::string& c : calls) body += c;
      body += "  }\n  return a->sync(a->host, -1);\n}\n\n";
    }
    fns_ += body;
    return fn;
  }

  const Plan& plan_;
  const dsl::Program& p_;
  std::map<std::string, int> sym_index_;
  std::string fns_;
  std::vector<std::string> scratch_;
  std::string scratch_block_prefix_;
  std::set<int> acc_started_;
  std::set<int> worded_;  // the loop being emitted: dropouts whose words are drawn per tile
  std::string elem_index_ = "(g0 + t)";  // the global flat index of the element being computed, as C
  // Whether a pipeline issues block b + 1's steps up to its first wait before block b's rest (the
  // CUDA target: its compute stream would otherwise queue b + 1's GEMM behind b's wait).
  bool skew_pipelines_ = false;
  int counter_ = 0;
  int step_ = -1;
};

}  // namespace tandem::codegen::detail
