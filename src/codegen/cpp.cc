// The C++ target of the plan walker (see cpp.h for the shape of the output and abi.h for the
// contract with the host): a loop as a vectorisable run function and a driver that walks its
// domain in contiguous runs; reductions, finishes and GEMM conversions as plain loops.
#include "tandem/codegen/cpp.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "walker.h"

namespace tandem::codegen {
namespace {

using namespace detail;
using dsl::Op;
using schedule::Storage;

class CppEmitter : public Walker {
 public:
  using Walker::Walker;

 protected:
  std::string target_name() const override { return "cpp"; }
  std::string target_title() const override { return "C++"; }

  std::string emit_loop(const LoopCtx& ctx) override;

  std::string fold_rows_text(const std::string& fn, int x_root, DType xd,
                             dsl::ReduceOp op) override {
    return fmt::format(
        "  const {0}* x = static_cast<const {0}*>(a->buf[{1}]);\n  float* part = a->scratch;\n"
        "  for (int64_t o = 0; o < outer; ++o)\n    for (int64_t i = 0; i < inner; ++i) {{\n      "
        "float acc = {2};\n"
        "      for (int64_t k = 0; k < rows; ++k) acc = {3}(acc, fx::ld_{4}(x[(o * rows + k) * "
        "inner + i]));\n"
        "      part[o * inner + i] = acc;\n    }}\n",
        ctype(xd), x_root, identity_literal(op), combine_fn(op), dt_suffix(xd));
  }

  std::pair<std::string, std::string> finish_lanes_text(const std::string& fn, int id) override {
    // A sum's lanes added in order and rounded once; Prod / Max / Min: the f32 value.
    if (acc_op(id) == dsl::ReduceOp::Sum)
      return {fmt::format("  float v[1] = {{tdm_sum_lanes(a->acc + {} * {})}};  // {}\n", kAccSlots,
                          id, name(id)),
              "v"};
    return {fmt::format("  float v[1] = {{static_cast<float>(a->acc[{} * {}])}};  // {}\n",
                        kAccSlots, id, name(id)),
            "v"};
  }

  std::string store_text(int root, DType dt, const std::string& src, const std::string& count,
                         bool take_sqrt) override {
    const std::string x = fmt::format("{}[i]", src);
    return fmt::format(
        "  {{\n    {0}* out = static_cast<{0}*>(a->buf[{1}]);\n"
        "    for (int64_t i = 0; i < {2}; ++i) out[i] = fx::st_{3}({4});\n  }}\n",
        ctype(dt), root, count, dt_suffix(dt), take_sqrt ? fmt::format("std::sqrt({})", x) : x);
  }

  std::string widen_text(const std::string& tag, const std::string& src, DType dt,
                         const std::string& rows, const std::string& cols,
                         const std::string& ld) override {
    return fmt::format(
        "    {{\n      const {0}* src = {1};\n      for (int64_t i = 0; i < {2}; ++i)\n"
        "        for (int64_t j = 0; j < {3}; ++j) p{4}[i * {3} + j] = fx::ld_{5}(src[i * {6} + "
        "j]);\n    }}\n",
        ctype(dt), src, rows, cols, tag, dt_suffix(dt), ld);
  }

  std::string zero_text() override {
    return "      for (int64_t i = 0; i < m; ++i)\n        for (int64_t j = 0; j < n; ++j) pc[i * "
           "ldc + j] = 0.0f;\n";
  }

  std::string narrow_text(const std::string& dst, DType dt, const std::string& ld) override {
    return fmt::format(
        "    {{\n      {0}* dst = {1};\n      for (int64_t i = 0; i < m; ++i)\n"
        "        for (int64_t j = 0; j < n; ++j) dst[i * {2} + j] = fx::st_{3}(pc[i * n + j]);\n   "
        " }}\n",
        ctype(dt), dst, ld, dt_suffix(dt));
  }

  std::string return_text(const std::string&) override { return "  return 0;\n"; }

  std::string copy_text(const std::string& elems, const std::string& dst, const std::string& src,
                        size_t size) const override {
    return fmt::format("  if ({0} > 0) std::memmove({1}, {2}, static_cast<size_t>({0}) * {3});\n",
                       elems, dst, src, size);
  }

  std::string acc_init_text(int id) const override {
    if (acc_op(id) == dsl::ReduceOp::Sum)
      return fmt::format("  for (int j = 0; j < {0}; ++j) a->acc[{0} * {1} + j] = 0.0;  // {2}\n",
                         kAccSlots, id, name(id));
    return fmt::format("  a->acc[{} * {}] = {};  // {}\n", kAccSlots, id,
                       identity_literal(acc_op(id)), name(id));
  }

  // A segment norm (dsl/ir.h): this rank's piece folded per segment (tdm_segment_sumsq, which is
  // dsl::segment_sums_of_squares), one all-reduce of the S partials when the operand is Sliced,
  // then the square roots.
  std::string emit_segment_norm(const schedule::Step& s) override {
    const int id = s.reduce.stage;
    const int x = look_through(st(id).args[0]);
    const auto [ptr, count] = stored_piece(x, false);
    const std::string fn = fresh("segnorm");
    const std::string extent = dims(x)[0];
    std::string body = function_head(fn) + prologue();
    body += "  float* part = a->scratch;\n";
    body += fmt::format(
        "  tdm_segment_sumsq({}, {}, {}, a->seg, a->nseg, part);\n", ptr,
        s.reduce.across_ranks ? fmt::format("fx::part_offset({}, P, RK)", extent) : "int64_t{0}",
        count);
    if (s.reduce.across_ranks) body += allreduce_text("part", "a->nseg", dsl::ReduceOp::Sum);
    body += store_text(root(id), st(id).type.dtype, "part", "a->nseg", true) + return_text(fn) +
            "}\n\n";
    scratch_.push_back("  if (a->nseg > need) need = a->nseg;\n");
    fns_ += body;
    return fn;
  }
};

// A loop as two functions: the run function, a straight loop over restrict pointers that the
// compiler vectorises, and the driver, which walks the loop's domain in runs that are contiguous
// for every pointer and calls the run function on each.
std::string CppEmitter::emit_loop(const LoopCtx& ctx) {
  const schedule::Loop& loop = *ctx.loop;
  const std::string fn = fresh(ctx.chunk ? "hook" : "loop");
  const LoopIO io = loop_io(ctx);
  const std::vector<Access>& params = io.params;
  // Pointers sharing a buffer under different keys may overlap: no restrict for them.
  std::map<int, int> root_uses;
  for (const Access& a : params)
    if (a.root >= 0) ++root_uses[a.root];

  // ---- the run function: the straight, vectorisable loop
  std::vector<std::string> sig = {"int64_t n", "[[maybe_unused]] int64_t g0"};
  for (size_t i = 0; i < params.size(); ++i) {
    const Access& a = params[i];
    const bool shared = a.root >= 0 && root_uses[a.root] > 1;
    sig.push_back(fmt::format("{}{}* {}q{}", a.write ? "" : "const ", ctype(a.dtype),
                              shared ? "" : "__restrict ", i));
  }
  for (int id : io.scalars) sig.push_back(fmt::format("float s{}", id));
  for (int id : io.segment_scalars) sig.push_back(fmt::format("float s{}", id));
  for (int id : io.seed_params) sig.push_back(fmt::format("uint64_t k{}", id));
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
  auto lanes_of = [&](int id) { return acc_op(id) == dsl::ReduceOp::Sum; };
  auto fold_fn = [&](int id) {
    return st(id).op == Op::Norm ? "tdm_fold_sumsq8" : "tdm_fold_sum8";
  };
  const std::string in = tiled || !worded_.empty() ? "      " : "    ";
  ElementForm form;
  form.in = in;
  form.slot = [](size_t i) { return fmt::format("q{}[t]", i); };
  form.fold = [&](int id, const std::string& x) {
    if (tiled) return fmt::format("{}tile{}[t - t0] = {};  // {}\n", in, id, x, name(id));
    // Double lanes keyed by the global index; a norm adds the exact square of x.
    if (lanes_of(id))
      return fmt::format("{}{{ const float x = {}; {}(acc{}, &x, 1, g0 + t); }}  // {}\n", in, x,
                         fold_fn(id), id, name(id));
    return fmt::format("{0}av{1} = {2}(av{1}, {3});  // {4}\n", in, id,
                       combine_fn(st(id).attrs.reduce), x, name(id));
  };
  const std::string elem = element_text(ctx, io, form);
  // A tile's folds: the lanes of each sum, then Prod / Max / Min in element order.
  std::string fold, lane_fold;
  for (int id : loop.accumulates) {
    if (lanes_of(id))
      lane_fold += fmt::format("    {}(acc{}, tile{}, tn, g0 + t0);\n", fold_fn(id), id, id);
    else
      fold += fmt::format("      av{0} = {1}(av{0}, tile{0}[k]);\n", id,
                          combine_fn(st(id).attrs.reduce));
  }
  // A loop that only sums f32 values read from memory (a norm of a stored tensor) folds them
  // straight from their buffers: no tile to copy them into.
  std::string direct_fold;
  if (tiled && loop.stages.empty()) {
    for (int id : loop.accumulates) {
      auto r = io.reads.find(look_through(st(id).args[0]));
      if (!lanes_of(id) || r == io.reads.end() || params[r->second].dtype != DType::F32) {
        direct_fold.clear();
        break;
      }
      direct_fold +=
          fmt::format("  {}(acc{}, q{}, n, g0);  // {}\n", fold_fn(id), id, r->second, name(id));
    }
  }
  std::string body;
  // Prod / Max / Min keep one f32 value in the accumulator's first double (exactly).
  for (int id : loop.accumulates)
    if (!lanes_of(id)) body += fmt::format("  float av{0} = static_cast<float>(*acc{0});\n", id);
  if (scalar_code) {
    body += "  {\n    const int64_t t = 0;\n    (void)n;\n" + elem + "  }\n";
  } else if (!worded_.empty()) {
    body +=
        "  for (int64_t t0 = 0; t0 < n; t0 += 256) {\n    const int64_t tn = tdm_min(n - t0, "
        "256);\n";
    for (int id : worded_)
      body += fmt::format(
          "    tdm_words w{0};\n    const uint32_t* rw{0} = tdm_random_words(&w{0}, {1}, "
          "static_cast<uint64_t>(g0 + t0), tn);  // {2}\n",
          id, io.seeds.at(id), name(id));
    body += "    for (int64_t t = t0; t < t0 + tn; ++t) {\n" + elem + "    }\n  }\n";
  } else if (!tiled) {
    body += "  for (int64_t t = 0; t < n; ++t) {\n" + elem + "  }\n";
  } else if (!direct_fold.empty()) {
    body += direct_fold;
  } else {
    body +=
        "  for (int64_t t0 = 0; t0 < n; t0 += 256) {\n    const int64_t tn = tdm_min(n - t0, "
        "256);\n";
    for (int id : loop.accumulates) body += fmt::format("    float tile{}[256];\n", id);
    body += "    for (int64_t t = t0; t < t0 + tn; ++t) {\n" + elem + "    }\n";
    body += lane_fold;
    if (!fold.empty())
      body +=
          "    // In element order, as the reference folds them.\n    for (int64_t k = 0; k < tn; "
          "++k) {\n" +
          fold + "    }\n";
    body += "  }\n";
  }
  for (int id : loop.accumulates)
    if (!lanes_of(id)) body += fmt::format("  *acc{0} = av{0};\n", id);
  fns_ += fmt::format("static void {}_run({}) {{\n{}}}\n\n", fn, fmt::join(sig, ", "), body);

  // ---- the driver: walks the domain in runs that are contiguous for every pointer
  std::vector<std::string> call = {"len", "g"};
  for (size_t i = 0; i < params.size(); ++i) {
    const Access& a = params[i];
    if (a.kind == Access::Chunk)
      call.push_back(fmt::format("static_cast<{}*>(chunk) + (g - g0)", ctype(a.dtype)));
    else
      call.push_back(fmt::format("static_cast<{}{}*>({}) + {}", a.write ? "" : "const ",
                                 ctype(a.dtype), base_ptr(a.root), a.index));
  }
  std::string loads;
  for (int id : io.scalars) {
    const int rt = root(id);
    loads += fmt::format(
        "  const float s{} = fx::ld_{}(static_cast<const {}*>(a->buf[{}])[0]);  // {}\n", id,
        dt_suffix(st(rt).type.dtype), ctype(st(rt).type.dtype), rt, name(id));
  }
  for (int id : io.seed_params)
    loads += fmt::format("  const uint64_t k{0} = a->seed[{0}];  // {1}\n", id, name(id));
  for (int id : io.scalars) call.push_back(fmt::format("s{}", id));
  for (int id : io.segment_scalars) call.push_back(fmt::format("s{}", id));
  for (int id : io.seed_params) call.push_back(fmt::format("k{}", id));
  for (int id : loop.accumulates) call.push_back(fmt::format("a->acc + {} * {}", kAccSlots, id));
  const std::string call_text = fmt::format("{}_run({})", fn, fmt::join(call, ", "));
  // With segment factors: `len` is cut at the end of g's segment, whose factors are loaded.
  std::string segment_cut;
  if (!io.segment_scalars.empty()) {
    segment_cut =
        "    const int64_t sg = tdm_segment_of(a->seg, a->nseg, g);\n    len = tdm_min(len, "
        "a->seg[sg + 1] - g);\n";
    for (int id : io.segment_scalars)
      segment_cut +=
          fmt::format("    const float s{} = static_cast<const float*>(a->buf[{}])[sg];  // {}\n",
                      id, root(id), name(id));
  }

  std::string driver;
  if (ctx.chunk) {
    driver = fmt::format(
        "static int {}(const tandem_args* a, void* chunk, int64_t n, int64_t g0, "
        "[[maybe_unused]] const tandem_block* blk) {{\n",
        fn);
    driver += prologue() + loads;
    driver +=
        "  for (int64_t t = 0; t < n;) {\n    const int64_t g = g0 + t;\n    int64_t len = n - "
        "t;\n";
    std::set<std::string> moduli;
    for (const Access& a : params)
      if (!a.modulus.empty()) moduli.insert(a.modulus);
    for (const std::string& m : moduli)
      driver += fmt::format("    len = tdm_min(len, {0} - g % {0});\n", m);
    driver += segment_cut;
    driver += fmt::format("    {};\n    t += len;\n  }}\n  return 0;\n}}\n\n", call_text);
    fns_ += driver;
    return fn;
  }
  driver = function_head(fn) + prologue() + loads;
  const int R = ctx.rank;
  if (R == 0) {
    fns_ += driver + "  const int64_t len = 1, g = 0;\n  " + call_text + ";\n  return 0;\n}\n\n";
    return fn;
  }
  const LoopBox box = loop_box(ctx);
  check_parts(ctx, io, box.whole);
  // The runs span dims c..R-1: every dim after c whole, and every pointer contiguous.
  int c = 0;
  for (int i = 0; i < R; ++i)
    if (!box.whole[static_cast<size_t>(i)]) c = std::max(c, i);
  for (const Access& a : params) {
    if (a.kind == Access::Part) c = std::max(c, a.part_dim);
    if (a.kind == Access::Bcast) c = std::max(c, R - a.bcast_rank);
  }
  c = std::min(c, R - 1);
  for (int i = 0; i <= c; ++i)
    driver += fmt::format("  const int64_t lo{0} = {1}, n{0} = {2};\n", i,
                          box.lo[static_cast<size_t>(i)], box.cnt[static_cast<size_t>(i)]);
  if (!segment_cut.empty()) {  // rank 1 (loop_io checked): the runs of each segment in turn
    driver +=
        "  for (int64_t t = 0; t < n0;) {\n    const int64_t g = lo0 + t;\n    int64_t len = n0 - "
        "t;\n";
    fns_ += driver + segment_cut +
            fmt::format("    {};\n    t += len;\n  }}\n  return 0;\n}}\n\n", call_text);
    return fn;
  }
  std::vector<std::string> run_dims = {fmt::format("n{}", c)};
  for (int i = c + 1; i < R; ++i) run_dims.push_back(ctx.extents[static_cast<size_t>(i)]);
  driver += fmt::format("  const int64_t len = {};\n  if (len <= 0) return 0;\n",
                        product(run_dims, 0, run_dims.size()));
  std::string indent = "  ";
  for (int i = 0; i < c; ++i) {
    driver +=
        fmt::format("{0}for (int64_t x{1} = lo{1}; x{1} < lo{1} + n{1}; ++x{1}) {{\n", indent, i);
    indent += "  ";
  }
  std::string flat = "int64_t{0}";
  for (int i = 0; i <= c; ++i)
    flat = fmt::format("({} * {} + {})", flat, ctx.extents[static_cast<size_t>(i)],
                       i < c ? fmt::format("x{}", i) : fmt::format("lo{}", i));
  flat = fmt::format("{} * {}", flat,
                     product(ctx.extents, static_cast<size_t>(c) + 1, ctx.extents.size()));
  driver += fmt::format("{}const int64_t g = {};\n{}{};\n", indent, flat, indent, call_text);
  for (int i = c - 1; i >= 0; --i) {
    indent.resize(indent.size() - 2);
    driver += indent + "}\n";
  }
  fns_ += driver + "  return 0;\n}\n\n";
  return fn;
}

}  // namespace

std::string step_symbol(int k) { return fmt::format("tandem_step_{}", k); }

std::string emit_cpp(const schedule::Plan& plan) {
  return cpp_prefix() + "\n" + CppEmitter(plan).emit_body();
}

}  // namespace tandem::codegen
