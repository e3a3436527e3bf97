// The CUDA emitter: the shared plan walker (emitter.h) with the steps that touch memory turned
// into kernels, plus the per-plan tables the driver needs (buffers, check items). See cuda.h.
#include "tandem/codegen/cuda.h"

#include "cuda_text.h"
#include "emitter.h"

namespace tandem::codegen {
namespace {

using namespace detail;

class CudaEmitter : public Emitter {
 public:
  explicit CudaEmitter(const Plan& plan) : Emitter(plan) {
    elem_index_ = "g";
    skew_pipelines_ = true;
  }

  // The tables main() reads: stage count, groups, symbols, per-stage buffer facts and sizes,
  // scalars and seeds, and what the check compares.
  std::string emit_tables() {
    std::string out = "// ---- the plan's tables, for main()\n";
    const std::vector<std::string> syms = p_.symbols();
    out += fmt::format("static const int tdm_nstages = {};\nstatic const int tdm_groups = {};\n", p_.stages().size(),
                       p_.groups());
    out += fmt::format("static const int tdm_nsyms = {};\nstatic const char* const tdm_sym_names[] = {{", syms.size());
    for (const auto& sname : syms) out += fmt::format("\"{}\", ", sname);
    out += "nullptr};\n";
    out += fmt::format("static const char* const tdm_plan_name = \"{}\";\nstatic const char* const tdm_program_name = \"{}\";\n",
                       plan_.name, p_.name());
    // Per stage: the buffer owner (-1: none), group (-1: every group), dtype code, kind.
    std::vector<std::string> owner, group, dtype, kind;
    for (const dsl::Stage& s : p_.stages()) {
      const schedule::Value& v = val(s.id);
      owner.push_back(std::to_string(v.storage == Storage::None ? -1 : root(s.id)));
      group.push_back(std::to_string(s.type.group));
      dtype.push_back(std::to_string(dtype_code(s.type.dtype)));
      kind.push_back(std::to_string(s.op == Op::Input ? 1 : (s.op == Op::Scalar ? 2 : 0)));
    }
    out += fmt::format("static const int tdm_owner[] = {{{}}};\n", fmt::join(owner, ", "));
    out += fmt::format("static const int tdm_group_of[] = {{{}}};\n", fmt::join(group, ", "));
    out += fmt::format("static const int tdm_dtype_of[] = {{{}}};\n", fmt::join(dtype, ", "));
    out += fmt::format("static const int tdm_kind_of[] = {{{}}};  // 1 input, 2 scalar\n", fmt::join(kind, ", "));
    std::vector<std::string> names;
    for (const dsl::Stage& s : p_.stages()) names.push_back(fmt::format("\"{}\"", name(s.id)));
    out += fmt::format("static const char* const tdm_stage_name[] = {{{}}};\n", fmt::join(names, ", "));
    // Elements of each owned buffer on this rank.
    out += "static int64_t tdm_buffer_elems(const tandem_args* a, int id) {\n" + prologue() + "  switch (id) {\n";
    for (const dsl::Stage& s : p_.stages()) {
      const schedule::Value& v = val(s.id);
      if (v.alias >= 0 || v.storage == Storage::None) continue;
      out += fmt::format("    case {}: return {};  // {} ({})\n", s.id, buffer_elems(s.id), name(s.id),
                         schedule::storage_name(v.storage));
    }
    out += "    default: return -1;\n  }\n}\n";
    // What the check loads (inputs) and compares (outputs, inputs updated in place): this rank's
    // stored piece of each, as a pointer into its buffer and an element count.
    out += "static void tdm_check_items(const tandem_args* a, std::vector<tdm_item>& items) {\n" + prologue();
    for (int id : p_.inputs()) out += check_item(id, 0);
    std::set<int> wanted;
    for (const dsl::Output& o : p_.outputs()) wanted.insert(o.stage);
    for (int id : p_.inputs())
      if (p_.updater(id) >= 0) wanted.insert(id);
    for (int id : wanted) out += check_item(id, 1);
    out += "}\n\n";
    return out;
  }

 protected:
  std::string target_name() const override { return "cuda"; }

  std::string copy_text(const std::string& elems, const std::string& dst, const std::string& src,
                        size_t size) const override {
    return fmt::format(
        "  if ({0} > 0 && (void*){1} != (void*){2})\n"
        "    TDM_CUDA(a, cudaMemcpyAsync({1}, {2}, static_cast<size_t>({0}) * {3}, cudaMemcpyDeviceToDevice, tdm_stream(a)));\n",
        elems, dst, src, size);
  }

  std::string acc_init_text(int id) const override {
    const bool sum = acc_op(id) == dsl::ReduceOp::Sum;
    return fmt::format("  tdm_acc_init<<<1, {}, 0, tdm_stream(a)>>>(a->acc + {} * {}, {});  // {}\n", kAccSlots,
                       kAccSlots, id, sum ? "0.0f" : identity_literal(acc_op(id)), name(id));
  }

  // A loop as a kernel plus the host function that launches it (a tandem_hook_fn for a hook).
  std::string emit_loop(const LoopCtx& ctx) override {
    const schedule::Loop& loop = *ctx.loop;
    const std::string fn = fresh(ctx.chunk ? "hook" : "loop");
    LoopIO io = loop_io(ctx);
    if (!io.segment_scalars.empty()) unsupported(fmt::format("segment_scale ({})", name(io.segment_scalars.front())));
    const int R = ctx.rank;
    const bool scalar_code = R == 0 && !ctx.chunk;

    // The domain: a box of lo/cnt per dim (the whole shape, this rank's part of the sliced dim,
    // the block's rows), walked by a flat index t. Contiguous when every dim after the first is
    // whole: then the element's global index is g0 + t.
    std::vector<std::string> lo(static_cast<size_t>(R), "int64_t{0}"), cnt = ctx.extents;
    std::vector<bool> whole(static_cast<size_t>(R), true);
    if (!ctx.chunk && R > 0) {
      LoopBox box = loop_box(ctx);
      lo = std::move(box.lo);
      cnt = std::move(box.cnt);
      whole = std::move(box.whole);
    }
    bool contiguous = true;
    for (int i = 1; i < R; ++i) contiguous = contiguous && whole[static_cast<size_t>(i)];
    // A buffer holding only this rank's part of a dim can serve a loop only over that part.
    for (const Access& acc : io.params)
      if (!ctx.chunk && acc.kind == Access::Part && whole[static_cast<size_t>(acc.part_dim)] && !(acc.part_dim == 0 && ctx.in_pipe))
        unsupported(fmt::format("{} is held as a part of dim {}, but the loop covers that whole dim", name(acc.root), acc.part_dim));

    // Pointers sharing a buffer under different keys may overlap: no __restrict__ for them.
    std::map<int, int> root_uses;
    for (const Access& acc : io.params)
      if (acc.root >= 0) ++root_uses[acc.root];
    // 16-byte vectors where every operand moves with t (no broadcast, no strided part) and
    // nothing accumulates; V elements per thread, V = 16 bytes of the narrowest dtype.
    bool vec = (contiguous || ctx.chunk) && !scalar_code && loop.accumulates.empty() && !io.params.empty();
    size_t narrow = 4;
    for (const Access& acc : io.params) {
      vec = vec && (acc.kind == Access::Full || acc.kind == Access::Chunk || (acc.kind == Access::Part && acc.part_dim == 0));
      vec = vec && (acc.root < 0 || root_uses[acc.root] == 1);
      narrow = std::min(narrow, dtype_size(acc.dtype));
    }
    const int V = static_cast<int>(16 / narrow);

    // ---- the kernel
    std::vector<std::string> sig = {"int64_t n", "int64_t g0", "tdm_box box", "tandem_block bk", "int64_t P",
                                    "int64_t RK", "tdm_syms sy", "int vec"};
    for (size_t i = 0; i < io.params.size(); ++i) {
      const Access& acc = io.params[i];
      const bool shared = acc.root >= 0 && root_uses[acc.root] > 1;
      sig.push_back(fmt::format("{}{}* {}q{}", acc.write ? "" : "const ", ctype(acc.dtype), shared ? "" : "__restrict__ ", i));
    }
    for (int id : io.scalars) sig.push_back(fmt::format("const {}* __restrict__ sp{}", ctype(st(root(id)).type.dtype), id));
    for (int id : io.seed_params) sig.push_back(fmt::format("uint64_t k{}", id));
    for (int id : loop.accumulates) sig.push_back(fmt::format("double* acc{}", id));

    std::string k = fmt::format("__global__ void __launch_bounds__(TDM_THREADS) {}_k({}) {{\n", fn, fmt::join(sig, ", "));
    k += "  [[maybe_unused]] const tandem_block* blk = &bk;\n";
    for (const auto& [sym, i] : sym_index_) k += fmt::format("  [[maybe_unused]] const int64_t S{0} = sy.v[{0}];  // {1}\n", i, sym);
    for (int id : io.scalars)
      k += fmt::format("  const float s{0} = fx::ld_{1}(sp{0}[0]);  // {2}\n", id, dt_suffix(st(root(id)).type.dtype), name(id));
    for (int id : loop.accumulates) {
      if (acc_op(id) == dsl::ReduceOp::Sum)
        k += fmt::format("  double lane{0} = 0.0;\n  int64_t lane_of{0} = -1;\n", id);
      else
        k += fmt::format("  float av{} = {};\n", id, identity_literal(acc_op(id)));
    }
    k += "  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;\n  (void)stride;\n";
    k += "  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;\n";
    // The global index of flat element t of the box.
    std::string g_of_t = "g0 + t";
    if (!contiguous && !ctx.chunk) {
      g_of_t = "tdm_box_index(box, t)";
    }
    auto element = [&](bool vector_form) {
      const std::string in = vector_form ? "        " : "    ";
      std::string e;
      for (size_t i = 0; i < io.params.size(); ++i)
        if (io.params[i].read) {
          const std::string src = vector_form ? fmt::format("x{}[j]", i) : fmt::format("q{}[{}]", i, at_index(io.params[i].index, "g"));
          e += fmt::format("{}const float m{} = fx::ld_{}({});\n", in, i, dt_suffix(io.params[i].dtype), src);
        }
      auto value_of = [&](int id) -> std::string {
        const int v = look_through(id);
        if (io.regs.count(id)) return fmt::format("v{}", id);
        if (io.regs.count(v)) return fmt::format("v{}", v);
        if (st(v).op == Op::Const) return flit(static_cast<float>(st(v).attrs.value));
        auto r = io.reads.find(v);
        if (r != io.reads.end()) return fmt::format("m{}", r->second);
        return fmt::format("s{}", v);
      };
      for (int id : loop.stages) {
        const dsl::Stage& s = st(id);
        std::vector<std::string> x;
        for (size_t j = 0; j < s.args.size(); ++j)
          x.push_back(s.op == Op::Update && j == 0 ? std::string()
                                                   : (s.op == Op::Dropout && j == 1 ? std::string() : value_of(s.args[j])));
        const std::string f = formula(s, x, ctx, io.seeds);
        e += fmt::format("{}const float v{} = fx::rt_{}({});  // {}\n", in, id, dt_suffix(s.type.dtype), f, name(id));
      }
      for (int id : loop.accumulates) {
        const std::string x = value_of(st(id).args[0]);
        if (acc_op(id) == dsl::ReduceOp::Sum) {
          // Lane g % 8 in double (a norm: the exact square); flushed to memory when it changes.
          const std::string term = st(id).op == Op::Norm ? fmt::format("static_cast<double>({0}) * static_cast<double>({0})", x)
                                                         : fmt::format("static_cast<double>({})", x);
          e += fmt::format(
              "{0}if ((g & 7) != lane_of{1}) {{ if (lane_of{1} >= 0) atomicAdd(acc{1} + lane_of{1}, lane{1}); lane{1} = 0.0; "
              "lane_of{1} = g & 7; }}\n{0}lane{1} += {2};  // {3}\n",
              in, id, term, name(id));
        } else {
          e += fmt::format("{0}av{1} = {2}(av{1}, {3});  // {4}\n", in, id, combine_fn(st(id).attrs.reduce), x, name(id));
        }
      }
      for (int id : io.stores) {
        const size_t i = io.writes.at(id);
        const std::string dst = vector_form ? fmt::format("x{}[j]", i) : fmt::format("q{}[{}]", i, at_index(io.params[i].index, "g"));
        e += fmt::format("{}{} = fx::st_{}(v{});\n", in, dst, dt_suffix(io.params[i].dtype), id);
      }
      return e;
    };
    if (scalar_code) {
      k += "  if (first == 0) {\n    const int64_t t = 0, g = 0;\n    (void)t;\n    (void)g;\n" + element(false) + "  }\n";
    } else {
      if (vec) {
        // Vectors of V consecutive elements: every operand loaded as 16-byte words first (reads
        // precede stores at each element, as the plan requires), computed, stored back.
        k += fmt::format("  const int64_t nv = vec ? n / {} : 0;\n", V);
        k += fmt::format("  for (int64_t w = first; w < nv; w += stride) {{\n    const int64_t t0 = w * {};\n", V);
        for (size_t i = 0; i < io.params.size(); ++i) {
          const Access& acc = io.params[i];
          k += fmt::format("    {} x{}[{}];\n", ctype(acc.dtype), i, V);
          if (acc.read)
            k += fmt::format("    tdm_vload<{}>(q{} + {}, x{});\n", V, i, at_index(acc.index, "g0 + t0"), i);
        }
        k += fmt::format("#pragma unroll\n    for (int j = 0; j < {}; ++j) {{\n      const int64_t t = t0 + j, g = g0 + t;\n      (void)g;\n", V);
        k += element(true) + "    }\n";
        for (size_t i = 0; i < io.params.size(); ++i)
          if (io.params[i].write)
            k += fmt::format("    tdm_vstore<{}>(q{} + {}, x{});\n", V, i, at_index(io.params[i].index, "g0 + t0"), i);
        k += fmt::format("  }}\n  for (int64_t t = nv * {} + first; t < n; t += stride) {{\n", V);
      } else {
        k += "  for (int64_t t = first; t < n; t += stride) {\n";
      }
      k += fmt::format("    const int64_t g = {};\n    (void)g;\n", g_of_t) + element(false) + "  }\n";
    }
    for (int id : loop.accumulates) {
      if (acc_op(id) == dsl::ReduceOp::Sum)
        k += fmt::format("  if (lane_of{0} >= 0) atomicAdd(acc{0} + lane_of{0}, lane{0});\n", id);
      else
        k += fmt::format("  tdm_atomic_combine(acc{0}, av{0}, {1});\n", id, reduce_op_code(acc_op(id)));
    }
    k += "}\n\n";
    fns_ += k;

    // ---- the host function that launches it
    std::vector<std::string> call = {"n", "g0", "box", "blk != nullptr ? *blk : tandem_block{}", "P", "RK", "tdm_syms_of(a)", "vec"};
    std::string aligned;
    for (size_t i = 0; i < io.params.size(); ++i) {
      const Access& acc = io.params[i];
      const std::string base = acc.kind == Access::Chunk
                                   ? fmt::format("static_cast<{}*>(chunk)", ctype(acc.dtype))
                                   : fmt::format("static_cast<{}*>({})", ctype(acc.dtype), base_ptr(acc.root));
      call.push_back(base);
      if (vec) aligned += fmt::format(" && tdm_aligned16({} + {})", base, at_index(acc.index, "g0"));
    }
    for (int id : io.scalars) {
      const int rt = root(id);
      if (val(rt).storage == Storage::None) unsupported(fmt::format("reading {}, which the plan never stores", name(id)));
      if (val(rt).storage == Storage::Block) unsupported(fmt::format("rank-0 block value {}", name(id)));
      call.push_back(fmt::format("static_cast<const {}*>(a->buf[{}])", ctype(st(rt).type.dtype), rt));
    }
    for (int id : io.seed_params) call.push_back(fmt::format("a->seed[{}]", id));
    for (int id : loop.accumulates) call.push_back(fmt::format("a->acc + {} * {}", kAccSlots, id));

    std::string h;
    if (ctx.chunk)
      h = fmt::format("static int {}(const tandem_args* a, void* chunk, int64_t n, int64_t g0, const tandem_block* blk) {{\n", fn);
    else
      h = fmt::format("static int {}(const tandem_args* a, const tandem_block* blk) {{\n", fn);
    h += prologue();
    h += "  tdm_box box{};\n";
    if (!ctx.chunk) {
      if (R == 0) {
        h += "  const int64_t n = 1, g0 = 0;\n";
      } else {
        // The box, and the global index of its first element.
        std::string n_expr, g0_expr = "int64_t{0}";
        for (int i = 0; i < R; ++i) {
          h += fmt::format("  box.lo[{0}] = {1};\n  box.cnt[{0}] = {2};\n  box.ext[{0}] = {3};\n", i, lo[static_cast<size_t>(i)],
                           cnt[static_cast<size_t>(i)], ctx.extents[static_cast<size_t>(i)]);
          g0_expr = fmt::format("({} * box.ext[{}] + box.lo[{}])", g0_expr, i, i);
        }
        h += fmt::format("  box.rank = {};\n", R);
        h += "  int64_t n = 1;\n  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];\n  if (n <= 0) return 0;\n";
        h += fmt::format("  const int64_t g0 = {};\n", g0_expr);
      }
    } else {
      h += "  if (n <= 0) return 0;\n";
    }
    h += fmt::format("  const int vec = 1{};\n", aligned);
    const std::string grid = scalar_code ? "1" : (vec ? fmt::format("tdm_blocks((n + {0} - 1) / {0})", V) : "tdm_blocks(n)");
    h += fmt::format("  {}_k<<<{}, {}, 0, tdm_stream(a)>>>({});\n", fn, grid, scalar_code ? "1" : "TDM_THREADS",
                     fmt::join(call, ", "));
    h += fmt::format("  return tdm_launched(a, \"{}\");\n}}\n\n", fn);
    fns_ += h;
    return fn;
  }

  // A reduction over one dim: one thread per output element folds the rows in order, into f32
  // scratch; then the cross-rank all-reduce (NCCL, in place on the scratch) and the store.
  std::string emit_reduce(const Step& s, bool in_pipe) override {
    if (in_pipe) unsupported("a reduction inside a pipeline");
    const int id = s.reduce.stage;
    const dsl::Stage& rs = st(id);
    if (rs.op == Op::SegmentNorm) unsupported(fmt::format("segment_norm ({})", name(id)));
    const int x = look_through(rs.args[0]);
    const int kd = rs.attrs.dim;
    if (kd < 0) unsupported(fmt::format("reduce step {} over every dim (that is a loop accumulation)", name(id)));
    const std::vector<std::string> xe = local_dims(x);
    const std::vector<std::string> oe = local_dims(id);
    const std::string fn = fresh("reduce");
    const DType xd = st(x).type.dtype, od = rs.type.dtype;
    fns_ += fmt::format(
        "__global__ void {0}_k(int64_t outer, int64_t rows, int64_t inner, const {1}* __restrict__ x, float* __restrict__ part) {{\n"
        "  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < outer * inner;\n"
        "       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {{\n"
        "    const int64_t o = e / inner, i = e % inner;\n    float acc = {2};\n"
        "    for (int64_t k = 0; k < rows; ++k) acc = {3}(acc, fx::ld_{4}(x[(o * rows + k) * inner + i]));\n"
        "    part[e] = acc;\n  }}\n}}\n\n",
        fn, ctype(xd), identity_literal(rs.attrs.reduce), combine_fn(rs.attrs.reduce), dt_suffix(xd));
    std::string body = fmt::format("static int {}(const tandem_args* a, [[maybe_unused]] const tandem_block* blk) {{\n", fn);
    body += prologue();
    body += fmt::format("  const int64_t outer = {}, rows = {}, inner = {};\n", product(xe, 0, static_cast<size_t>(kd)),
                        xe[static_cast<size_t>(kd)], product(xe, static_cast<size_t>(kd) + 1, xe.size()));
    body += "  if (outer * inner <= 0) return 0;\n";
    body += fmt::format("  {0}_k<<<tdm_blocks(outer * inner), TDM_THREADS, 0, tdm_stream(a)>>>(outer, rows, inner, "
                        "static_cast<const {1}*>(a->buf[{2}]), a->scratch);\n",
                        fn, ctype(xd), root(x));
    body += fmt::format("  if (int rc = tdm_launched(a, \"{}\")) return rc;\n", fn);
    if (s.reduce.across_ranks)
      body += fmt::format(
          "  {{\n    tandem_collective c;\n    std::memset(&c, 0, sizeof c);\n    c.step = {}; c.kind = 0; c.op = {}; c.dtype = 0;\n"
          "    c.send = a->scratch; c.outer = 1; c.rows = outer * inner; c.inner = 1; c.block.index = -1;\n"
          "    if (int rc = a->collective(a->host, &c)) return rc;\n  }}\n",
          step_, reduce_op_code(rs.attrs.reduce));
    body += fmt::format("  tdm_store_f32<<<tdm_blocks({0}), TDM_THREADS, 0, tdm_stream(a)>>>(a->buf[{1}], {2}, a->scratch, {0}, 0);\n",
                        product(oe, 0, oe.size()), root(id), dtype_code(od));
    body += fmt::format("  return tdm_launched(a, \"{}\");\n}}\n\n", fn);
    scratch_.push_back(fmt::format("  {{ const int64_t e = {} * {}; if (e > need) need = e; }}\n",
                                   product(xe, 0, static_cast<size_t>(kd)), product(xe, static_cast<size_t>(kd) + 1, xe.size())));
    fns_ += body;
    return fn;
  }

  // Completes an accumulator on the device: lanes added in order and rounded once into an f32 in
  // the accumulator's own slot, all-reduced across ranks when the loop ran on a part, then the
  // norm's square root and the store in the stage's dtype.
  std::string emit_finish(const Step& s, bool in_pipe) override {
    const int id = s.finish.stage;
    const dsl::Stage& fs = st(id);
    const int rt = root(id);
    if (val(rt).storage != Storage::Full)
      unsupported(fmt::format("finishing {} stored as {}", name(id), schedule::storage_name(val(rt).storage)));
    const std::string fn = fresh("finish");
    std::string body = fmt::format("static int {}(const tandem_args* a, [[maybe_unused]] const tandem_block* blk) {{\n", fn);
    body += fmt::format("  double* acc = a->acc + {} * {};  // {}\n", kAccSlots, id, name(id));
    body += fmt::format("  tdm_finish_lanes<<<1, 1, 0, tdm_stream(a)>>>(acc, {});\n", acc_op(id) == dsl::ReduceOp::Sum ? 1 : 0);
    body += fmt::format("  if (int rc = tdm_launched(a, \"{}\")) return rc;\n", fn);
    if (s.finish.across_ranks) {
      if (in_pipe) body += "  if (int rc = a->sync(a->host, blk->index)) return rc;\n";
      body += fmt::format(
          "  {{\n    tandem_collective c;\n    std::memset(&c, 0, sizeof c);\n    c.step = {}; c.kind = 0; c.op = {}; c.dtype = 0;\n"
          "    c.send = reinterpret_cast<float*>(acc); c.outer = 1; c.rows = 1; c.inner = 1; c.block.index = -1;\n"
          "    if (int rc = a->collective(a->host, &c)) return rc;\n  }}\n",
          step_, reduce_op_code(acc_op(id)));
    }
    body += fmt::format("  tdm_store_f32<<<1, 1, 0, tdm_stream(a)>>>(a->buf[{}], {}, reinterpret_cast<float*>(acc), 1, {});\n", rt,
                        dtype_code(fs.type.dtype), fs.op == Op::Norm ? 1 : 0);
    body += fmt::format("  return tdm_launched(a, \"{}\");\n}}\n\n", fn);
    fns_ += body;
    return fn;
  }

  // cuBLAS SGEMM (through the ABI's sgemm, on the compute stream) on f32 operands; 16-bit
  // operands are widened into f32 scratch by a kernel first and the result narrowed after.
  std::string emit_matmul(const Step& s, bool in_pipe) override {
    const int id = s.matmul.stage;
    const MatmulDims d = matmul_dims(s, in_pipe);
    const std::string fn = fresh("matmul");
    std::string body = fmt::format("static int {}(const tandem_args* a, [[maybe_unused]] const tandem_block* blk) {{\n", fn);
    body += prologue();
    body += fmt::format("  const int64_t m = {}, k = {}, n = {};  // {}\n", d.mn, d.kn, d.nn, name(id));
    body += fmt::format("  const int64_t batches = {};\n", product(d.ec, 0, static_cast<size_t>(d.qc - 2)));
    body += "  if (m <= 0 || n <= 0) return 0;\n  [[maybe_unused]] float* scratch = a->scratch;\n";
    body += "  for (int64_t bt = 0; bt < batches; ++bt) {\n";
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
          "    float* p{0} = scratch + {1};\n    const int64_t ld{0} = {3};\n"
          "    tdm_widen2d<<<tdm_blocks({4} * {3}), TDM_THREADS, 0, tdm_stream(a)>>>(p{0}, {2}, {6}, {4}, {3}, {5});\n",
          tag, off, src, cols, rows, X.ld, dtype_code(X.dtype));
      off = fmt::format("{} + {} * {}", off, rows, cols);
      scratch_parts.push_back(fmt::format("{} * {}", rows_c, cols_c));
    };
    emit_in(d.A, d.qa, "a", "m", "k", d.mn, d.kn);
    emit_in(d.B, d.qb, "b", "k", "n", d.kn, d.nn);
    const std::string csrc = fmt::format("({} + bt * {})", d.C.base, d.qc > 2 ? d.C.batch : std::string("int64_t{0}"));
    if (d.C.dtype == DType::F32) {
      body += fmt::format("    float* pc = {};\n    const int64_t ldc = {};\n", csrc, d.C.ld);
    } else {
      body += fmt::format("    float* pc = scratch + {};\n    const int64_t ldc = n;\n", off);
      scratch_parts.push_back(fmt::format("{} * {}", d.mn, d.nn));
    }
    body +=
        "    if (k > 0) {\n"
        "      a->sgemm(0, 0, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, pa, static_cast<int>(lda),\n"
        "               pb, static_cast<int>(ldb), 0.0f, pc, static_cast<int>(ldc));\n"
        "    } else {\n"
        "      tdm_fill2d<<<tdm_blocks(m * n), TDM_THREADS, 0, tdm_stream(a)>>>(pc, m, n, ldc, 0.0f);\n"
        "    }\n";
    if (d.C.dtype != DType::F32)
      body += fmt::format("    tdm_narrow2d<<<tdm_blocks(m * n), TDM_THREADS, 0, tdm_stream(a)>>>({}, {}, pc, m, n, {});\n", csrc,
                          dtype_code(d.C.dtype), d.C.ld);
    body += fmt::format("  }}\n  return tdm_launched(a, \"{}\");\n}}\n\n", fn);
    if (!scratch_parts.empty())
      scratch_.push_back(fmt::format("  {{ {}const int64_t e = {}; if (e > need) need = e; }}\n",
                                     in_pipe ? scratch_block_prefix_ : std::string(), fmt::join(scratch_parts, " + ")));
    fns_ += body;
    return fn;
  }

 private:
  // The elements of value id's own buffer on this rank, as C (abi.h's layout of each storage).
  std::string buffer_elems(int id) {
    const Storage s = val(id).storage;
    const std::vector<std::string> e = dims(id);
    if (s == Storage::Full) return product(e, 0, e.size());
    const dsl::Layout l = st(id).type.layout;
    if (!l.is_sliced()) unsupported(fmt::format("{} storage of {}, which is not sliced", schedule::storage_name(s), name(id)));
    std::vector<std::string> part = e;
    part[static_cast<size_t>(l.dim)] = fmt::format("fx::part_count({}, P, RK)", e[static_cast<size_t>(l.dim)]);
    if (s == Storage::Slice || l.dim != 0) return product(part, 0, part.size());
    // A row-sliced Block value: this rank's part of each block's rows, one block after another.
    for (const Step& step : plan_.steps) {
      if (step.kind != StepKind::Pipeline) continue;
      const auto& vs = step.pipeline.values;
      if (std::find(vs.begin(), vs.end(), id) == vs.end()) continue;
      const std::string rows = dims(vs[0])[0];
      return fmt::format("(tdm_block_rows({}, {}, P, RK) * {})", rows, step.pipeline.blocks, product(e, 1, e.size()));
    }
    unsupported(fmt::format("block value {} outside every pipeline", name(id)));
  }

  std::string check_item(int id, int want) {
    const auto [ptr, elems] = stored_piece(id, false);
    std::string out = fmt::format("  if (tdm_mine(a, {})) items.push_back(tdm_item{{{}, {}, {}, (void*){}, {}}});  // {}\n", id,
                                  id, want, dtype_code(st(id).type.dtype), ptr, elems, name(id));
    return out;
  }
};

}  // namespace

CudaProgram emit_cuda(const schedule::Plan& plan, const std::string& name) {
  CudaEmitter e(plan);
  CudaProgram out;
  const std::string body = e.emit_body();
  out.source = cuda_prefix(static_cast<int>(plan.program.symbols().size())) + "\n" + body + "\n" + e.emit_tables() +
               cuda_runtime() + cuda_main();
  out.makefile = cuda_makefile(name);
  return out;
}

}  // namespace tandem::codegen
