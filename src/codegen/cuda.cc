// The CUDA target of the plan walker (see cuda.h for the shape of the program): a loop as a
// __global__ kernel and the host function that launches it, reductions, finishes and GEMM
// conversions as kernels on the compute stream, and the per-plan tables main() reads; the program
// is that, between the runtime files of src/codegen/runtime/.
#include "tandem/codegen/cuda.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "runtime_text.h"
#include "tandem/codegen/cpp.h"
#include "tandem/codegen/formulas_text.h"
#include "walker.h"

namespace tandem::codegen {
namespace {

using namespace detail;
using dsl::Op;
using schedule::Step;
using schedule::StepKind;
using schedule::Storage;

class CudaEmitter : public Walker {
 public:
  explicit CudaEmitter(const schedule::Plan& plan) : Walker(plan) {
    elem_index_ = "g";
    skew_pipelines_ = true;
  }

  // The tables main() reads: stage count, groups, symbols, per-stage buffer facts and sizes,
  // scalars and seeds, and what the check compares.
  std::string emit_tables() {
    std::string out = "// ---- the plan's tables, for main()\n";
    const std::vector<std::string> syms = p_.symbols();
    out += fmt::format("const int tdm_nstages = {};\nconst int tdm_groups = {};\n",
                       p_.stages().size(), p_.groups());
    out += fmt::format("const int tdm_nsyms = {};\nconst char* const tdm_sym_names[] = {{",
                       syms.size());
    for (const auto& sname : syms) out += fmt::format("\"{}\", ", sname);
    out += "nullptr};\n";
    out += fmt::format(
        "const char* const tdm_plan_name = \"{}\";\nconst char* const tdm_program_name = \"{}\";\n",
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
    out += fmt::format("const int tdm_owner[] = {{{}}};\n", fmt::join(owner, ", "));
    out += fmt::format("const int tdm_group_of[] = {{{}}};\n", fmt::join(group, ", "));
    out += fmt::format("const int tdm_dtype_of[] = {{{}}};\n", fmt::join(dtype, ", "));
    out += fmt::format("const int tdm_kind_of[] = {{{}}};  // 1 input, 2 scalar\n",
                       fmt::join(kind, ", "));
    std::vector<std::string> names;
    for (const dsl::Stage& s : p_.stages()) names.push_back(fmt::format("\"{}\"", name(s.id)));
    out += fmt::format("const char* const tdm_stage_name[] = {{{}}};\n", fmt::join(names, ", "));
    // Elements of each owned buffer on this rank.
    out += "int64_t tdm_buffer_elems(const tandem_args* a, int id) {\n" + prologue() +
           "  switch (id) {\n";
    for (const dsl::Stage& s : p_.stages()) {
      const schedule::Value& v = val(s.id);
      if (v.alias >= 0 || v.storage == Storage::None) continue;
      out += fmt::format("    case {}: return {};  // {} ({})\n", s.id, buffer_elems(s.id),
                         name(s.id), schedule::storage_name(v.storage));
    }
    out += "    default: return -1;\n  }\n}\n";
    // What the check loads (inputs) and compares (outputs, inputs updated in place): this rank's
    // stored piece of each, as a pointer into its buffer and an element count.
    out +=
        "void tdm_check_items(const tandem_args* a, std::vector<tdm_item>& items) {\n" + prologue();
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
  std::string target_title() const override { return "CUDA"; }

  std::string emit_loop(const LoopCtx& ctx) override;

  // One thread per output element folds the rows in order.
  std::string fold_rows_text(const std::string& fn, int x_root, DType xd,
                             dsl::ReduceOp op) override {
    fns_ += fmt::format(
        "__global__ void {0}_k(int64_t outer, int64_t rows, int64_t inner, const {1}* __restrict__ "
        "x, float* __restrict__ part) {{\n"
        "  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < outer "
        "* inner;\n"
        "       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {{\n"
        "    const int64_t o = e / inner, i = e % inner;\n    float acc = {2};\n"
        "    for (int64_t k = 0; k < rows; ++k) acc = {3}(acc, fx::ld_{4}(x[(o * rows + k) * inner "
        "+ i]));\n"
        "    part[e] = acc;\n  }}\n}}\n\n",
        fn, ctype(xd), identity_literal(op), combine_fn(op), dt_suffix(xd));
    return fmt::format(
        "  if (outer * inner <= 0) return 0;\n"
        "  {0}_k<<<tdm_blocks(outer * inner), TDM_THREADS, 0, tdm_stream(a)>>>(outer, rows, inner, "
        "static_cast<const {1}*>(a->buf[{2}]), a->scratch);\n"
        "  if (int rc = tdm_launched(a, \"{0}\")) return rc;\n",
        fn, ctype(xd), x_root);
  }

  // The lanes added in order and rounded once into an f32 in the accumulator's own slot, on the
  // device.
  std::pair<std::string, std::string> finish_lanes_text(const std::string& fn, int id) override {
    return {fmt::format("  double* acc = a->acc + {} * {};  // {}\n"
                        "  tdm_finish_lanes<<<1, 1, 0, tdm_stream(a)>>>(acc, {});\n"
                        "  if (int rc = tdm_launched(a, \"{}\")) return rc;\n",
                        kAccSlots, id, name(id), acc_op(id) == dsl::ReduceOp::Sum ? 1 : 0, fn),
            "reinterpret_cast<float*>(acc)"};
  }

  std::string store_text(int root, DType dt, const std::string& src, const std::string& count,
                         bool take_sqrt) override {
    return fmt::format(
        "  tdm_store_f32<<<tdm_blocks({0}), TDM_THREADS, 0, tdm_stream(a)>>>(a->buf[{1}], {2}, "
        "{3}, {0}, {4});\n",
        count, root, dtype_code(dt), src, take_sqrt ? 1 : 0);
  }

  std::string widen_text(const std::string& tag, const std::string& src, DType dt,
                         const std::string& rows, const std::string& cols,
                         const std::string& ld) override {
    return fmt::format(
        "    tdm_widen2d<<<tdm_blocks({0} * {1}), TDM_THREADS, 0, tdm_stream(a)>>>(p{2}, {3}, {4}, "
        "{0}, {1}, {5});\n",
        rows, cols, tag, src, dtype_code(dt), ld);
  }

  std::string zero_text() override {
    return "      tdm_fill2d<<<tdm_blocks(m * n), TDM_THREADS, 0, tdm_stream(a)>>>(pc, m, n, ldc, "
           "0.0f);\n";
  }

  std::string narrow_text(const std::string& dst, DType dt, const std::string& ld) override {
    return fmt::format(
        "    tdm_narrow2d<<<tdm_blocks(m * n), TDM_THREADS, 0, tdm_stream(a)>>>({}, {}, pc, m, n, "
        "{});\n",
        dst, dtype_code(dt), ld);
  }

  std::string return_text(const std::string& fn) override {
    return fmt::format("  return tdm_launched(a, \"{}\");\n", fn);
  }

  std::string copy_text(const std::string& elems, const std::string& dst, const std::string& src,
                        size_t size) const override {
    return fmt::format(
        "  if ({0} > 0 && (void*){1} != (void*){2})\n"
        "    TDM_CUDA(a, cudaMemcpyAsync({1}, {2}, static_cast<size_t>({0}) * {3}, "
        "cudaMemcpyDeviceToDevice, tdm_stream(a)));\n",
        elems, dst, src, size);
  }

  std::string acc_init_text(int id) const override {
    const bool sum = acc_op(id) == dsl::ReduceOp::Sum;
    return fmt::format(
        "  tdm_acc_init<<<1, {}, 0, tdm_stream(a)>>>(a->acc + {} * {}, {});  // {}\n", kAccSlots,
        kAccSlots, id, sum ? "0.0f" : identity_literal(acc_op(id)), name(id));
  }

 private:
  // The elements of value id's own buffer on this rank, as C (abi.h's layout of each storage).
  std::string buffer_elems(int id) {
    const Storage s = val(id).storage;
    const std::vector<std::string> e = dims(id);
    if (s == Storage::Full) return product(e, 0, e.size());
    const dsl::Layout l = st(id).type.layout;
    if (!l.is_sliced())
      unsupported(fmt::format("{} storage of {}, which is not sliced", schedule::storage_name(s),
                              name(id)));
    std::vector<std::string> part = e;
    part[static_cast<size_t>(l.dim)] =
        fmt::format("fx::part_count({}, P, RK)", e[static_cast<size_t>(l.dim)]);
    if (s == Storage::Slice || l.dim != 0) return product(part, 0, part.size());
    // A row-sliced Block value: this rank's part of each block's rows, one block after another.
    for (const Step& step : plan_.steps) {
      if (step.kind != StepKind::Pipeline) continue;
      const auto& vs = step.pipeline.values;
      if (std::find(vs.begin(), vs.end(), id) == vs.end()) continue;
      const std::string rows = dims(vs[0])[0];
      return fmt::format("(tdm_block_rows({}, {}, P, RK) * {})", rows, step.pipeline.blocks,
                         product(e, 1, e.size()));
    }
    unsupported(fmt::format("block value {} outside every pipeline", name(id)));
  }

  std::string check_item(int id, int want) {
    const auto [ptr, elems] = stored_piece(id, false);
    std::string out = fmt::format(
        "  if (tdm_mine(a, {})) items.push_back(tdm_item{{{}, {}, {}, (void*){}, {}}});  // {}\n",
        id, id, want, dtype_code(st(id).type.dtype), ptr, elems, name(id));
    return out;
  }
};

// A loop as a kernel, grid-stride over the loop's box, plus the host function that launches it on
// the compute stream (a tandem_hook_fn for a hook).
std::string CudaEmitter::emit_loop(const LoopCtx& ctx) {
  const schedule::Loop& loop = *ctx.loop;
  const std::string fn = fresh(ctx.chunk ? "hook" : "loop");
  const LoopIO io = loop_io(ctx);
  if (!io.segment_scalars.empty())
    unsupported(fmt::format("segment_scale ({})", name(io.segment_scalars.front())));
  const int R = ctx.rank;
  const bool scalar_code = R == 0 && !ctx.chunk;

  // The domain: a box of lo/cnt per dim (the whole shape, this rank's part of the sliced dim,
  // the block's rows), walked by a flat index t. Contiguous when every dim after the first is
  // whole: then the element's global index is g0 + t.
  LoopBox box{std::vector<std::string>(static_cast<size_t>(R), "int64_t{0}"), ctx.extents,
              std::vector<bool>(static_cast<size_t>(R), true)};
  if (!ctx.chunk && R > 0) box = loop_box(ctx);
  bool contiguous = true;
  for (int i = 1; i < R; ++i) contiguous = contiguous && box.whole[static_cast<size_t>(i)];
  if (!ctx.chunk) check_parts(ctx, io, box.whole);

  // Pointers sharing a buffer under different keys may overlap: no __restrict__ for them.
  std::map<int, int> root_uses;
  for (const Access& acc : io.params)
    if (acc.root >= 0) ++root_uses[acc.root];
  // 16-byte vectors where every operand moves with t (no broadcast, no strided part); V
  // elements per thread, V = 16 bytes of the narrowest dtype. A loop that folds a sum keeps W
  // lane registers a sum in its vector loop (see the lanes below).
  bool vec = (contiguous || ctx.chunk) && !scalar_code && !io.params.empty();
  size_t narrow = 4;
  for (const Access& acc : io.params) {
    vec = vec && (acc.kind == Access::Full || acc.kind == Access::Chunk ||
                  (acc.kind == Access::Part && acc.part_dim == 0));
    vec = vec && (acc.root < 0 || root_uses[acc.root] == 1);
    narrow = std::min(narrow, dtype_size(acc.dtype));
  }
  const int V = static_cast<int>(16 / narrow);
  const int W = std::min(V, 8);

  // ---- the kernel
  std::vector<std::string> sig = {"int64_t n", "int64_t g0", "tdm_box box", "tandem_block bk",
                                  "int64_t P", "int64_t RK", "tdm_syms sy", "int vec"};
  for (size_t i = 0; i < io.params.size(); ++i) {
    const Access& acc = io.params[i];
    const bool shared = acc.root >= 0 && root_uses[acc.root] > 1;
    sig.push_back(fmt::format("{}{}* {}q{}", acc.write ? "" : "const ", ctype(acc.dtype),
                              shared ? "" : "__restrict__ ", i));
  }
  for (int id : io.scalars)
    sig.push_back(fmt::format("const {}* __restrict__ sp{}", ctype(st(root(id)).type.dtype), id));
  for (int id : io.seed_params) sig.push_back(fmt::format("uint64_t k{}", id));
  for (int id : loop.accumulates) sig.push_back(fmt::format("double* acc{}", id));

  std::string k = fmt::format("__global__ void __launch_bounds__(TDM_THREADS) {}_k({}) {{\n", fn,
                              fmt::join(sig, ", "));
  k += "  [[maybe_unused]] const tandem_block* blk = &bk;\n";
  for (const auto& [sym, i] : sym_index_)
    k += fmt::format("  [[maybe_unused]] const int64_t S{0} = sy.v[{0}];  // {1}\n", i, sym);
  for (int id : io.scalars)
    k += fmt::format("  const float s{0} = fx::ld_{1}(sp{0}[0]);  // {2}\n", id,
                     dt_suffix(st(root(id)).type.dtype), name(id));
  // A sum's lanes: element g goes to lane g % 8 of the accumulator (a double each). Where g is
  // g0 + t (a contiguous box, a chunk), a thread's lane is fixed: t runs first, first + stride,
  // ... with stride = gridDim.x * TDM_THREADS, a multiple of 8 (blockDim.x is TDM_THREADS in
  // every launch but the one-thread scalar kernel), so g % 8 = (g0 + threadIdx.x) % 8. The thread
  // then sums into one register, the block adds its threads' registers lane by lane (warp
  // shuffles, then shared memory, in a fixed order) and 8 of its threads add the block's lanes to
  // the accumulator: 8 global atomics per block. Where g jumps (a box with a strided part), the
  // lane changes along the loop: the register is flushed into the block's shared lanes when it
  // does (a shared atomic), and the block's lanes go to the accumulator at the end.
  // In the vector loop element j of each vector has lane (g0 + first * V + j) % 8, fixed too
  // (stride * V is a multiple of 8): W registers vl (indexed by j % W, a constant under the
  // unroll), transposed onto the threads' own lanes (tdm_vec_lanes) before the block's
  // reduction. The vector loop stops at a multiple of 8 elements, so that the scalar tail's
  // lane is the thread's, (g0 + threadIdx.x) % 8.
  const bool fixed_lane = contiguous || ctx.chunk;
  bool sums = false;
  for (int id : loop.accumulates) {
    if (acc_op(id) == dsl::ReduceOp::Sum) {
      sums = true;
      k += fmt::format("  double lane{} = 0.0;\n", id);
      if (vec) k += fmt::format("  double vl{}[{}] = {{}};\n", id, W);
      if (!fixed_lane && !scalar_code)
        k += fmt::format(
            "  int64_t lane_of{0} = -1;\n  __shared__ double sl{0}[8];\n  if (threadIdx.x < 8) "
            "sl{0}[threadIdx.x] = 0.0;\n",
            id);
    } else {
      k += fmt::format("  float av{} = {};\n", id, identity_literal(acc_op(id)));
    }
  }
  if (sums && !fixed_lane && !scalar_code) k += "  __syncthreads();\n";
  k += "  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;\n  (void)stride;\n";
  k += "  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;\n";
  // The global index of flat element t of the box.
  const std::string g_of_t = !contiguous && !ctx.chunk ? "tdm_box_index(box, t)" : "g0 + t";
  auto element = [&](bool vector_form) {
    const std::string in = vector_form ? "        " : "    ";
    ElementForm form;
    form.in = in;
    form.slot = [&](size_t i) {
      return vector_form ? fmt::format("x{}[j]", i)
                         : fmt::format("q{}[{}]", i, at_index(io.params[i].index, "g"));
    };
    form.fold = [&](int id, const std::string& x) {
      if (acc_op(id) != dsl::ReduceOp::Sum)
        return fmt::format("{0}av{1} = {2}(av{1}, {3});  // {4}\n", in, id,
                           combine_fn(st(id).attrs.reduce), x, name(id));
      // Lane g % 8 in double (a norm: the exact square). A fixed lane stays in its register
      // (see above); else the register is flushed into the block's lane when g % 8 changes.
      const std::string term =
          st(id).op == Op::Norm
              ? fmt::format("static_cast<double>({0}) * static_cast<double>({0})", x)
              : fmt::format("static_cast<double>({})", x);
      if (vector_form)
        return fmt::format("{0}vl{1}[j % {2}] += {3};  // {4}\n", in, id, W, term, name(id));
      if (fixed_lane || scalar_code)
        return fmt::format("{0}lane{1} += {2};  // {3}\n", in, id, term, name(id));
      return fmt::format(
          "{0}if ((g & 7) != lane_of{1}) {{ if (lane_of{1} >= 0) atomicAdd(sl{1} + lane_of{1}, "
          "lane{1}); lane{1} = 0.0; lane_of{1} = g & 7; }}\n{0}lane{1} += {2};  // {3}\n",
          in, id, term, name(id));
    };
    return element_text(ctx, io, form);
  };
  if (scalar_code) {
    k += "  if (first == 0) {\n    const int64_t t = 0, g = 0;\n    (void)t;\n    (void)g;\n" +
         element(false) + "  }\n";
  } else {
    if (vec) {
      // Vectors of V consecutive elements: every operand loaded as 16-byte words first (reads
      // precede stores at each element, as the plan requires), computed, stored back.
      if (sums && V < 8)
        k += fmt::format("  const int64_t nv = vec ? n / 8 * {} : 0;\n", 8 / V);
      else
        k += fmt::format("  const int64_t nv = vec ? n / {} : 0;\n", V);
      k += fmt::format(
          "  for (int64_t w = first; w < nv; w += stride) {{\n    const int64_t t0 = w * {};\n", V);
      for (size_t i = 0; i < io.params.size(); ++i) {
        const Access& acc = io.params[i];
        k += fmt::format("    {} x{}[{}];\n", ctype(acc.dtype), i, V);
        if (acc.read)
          k += fmt::format("    tdm_vload<{}>(q{} + {}, x{});\n", V, i,
                           at_index(acc.index, "g0 + t0"), i);
      }
      k += fmt::format(
          "#pragma unroll\n    for (int j = 0; j < {}; ++j) {{\n      const int64_t t = t0 + j, g "
          "= g0 + t;\n      (void)g;\n",
          V);
      k += element(true) + "    }\n";
      for (size_t i = 0; i < io.params.size(); ++i)
        if (io.params[i].write)
          k += fmt::format("    tdm_vstore<{}>(q{} + {}, x{});\n", V, i,
                           at_index(io.params[i].index, "g0 + t0"), i);
      k += fmt::format("  }}\n  for (int64_t t = nv * {} + first; t < n; t += stride) {{\n", V);
    } else {
      k += "  for (int64_t t = first; t < n; t += stride) {\n";
    }
    k +=
        fmt::format("    const int64_t g = {};\n    (void)g;\n", g_of_t) + element(false) + "  }\n";
  }
  // The sums' lanes: the block's, then the accumulator's (no thread has returned: every one
  // reaches the barrier).
  std::vector<int> sum_ids;
  for (int id : loop.accumulates)
    if (acc_op(id) == dsl::ReduceOp::Sum) sum_ids.push_back(id);
  if (scalar_code) {
    // One thread, g = 0.
    for (int id : sum_ids) k += fmt::format("  atomicAdd(acc{0}, lane{0});\n", id);
  } else if (fixed_lane && !sum_ids.empty()) {
    // Threads l, l + 8, l + 16, l + 24 of a warp share lane (g0 + l) % 8: after two shuffles
    // warp lane l < 8 holds the warp's sum of that lane, which the block adds warp by warp.
    if (vec)
      for (int id : sum_ids)
        k += fmt::format(
            "  lane{0} += tdm_vec_lanes<{1}>(vl{0}, static_cast<int>((threadIdx.x * {2}) & 7));\n",
            id, W, V);
    for (int id : sum_ids)
      k += fmt::format(
          "  __shared__ double wl{0}[TDM_THREADS / 32][8];\n"
          "  lane{0} += __shfl_xor_sync(0xffffffffu, lane{0}, 8);\n"
          "  lane{0} += __shfl_xor_sync(0xffffffffu, lane{0}, 16);\n"
          "  if ((threadIdx.x & 31) < 8) wl{0}[threadIdx.x / 32][threadIdx.x & 31] = lane{0};\n",
          id);
    k += "  __syncthreads();\n  if (threadIdx.x < 8) {\n";
    for (int id : sum_ids)
      k += fmt::format(
          "    double b{0} = 0.0;\n"
          "    for (int w = 0; w < TDM_THREADS / 32; ++w) b{0} += wl{0}[w][threadIdx.x];\n"
          "    if (b{0} != 0.0) atomicAdd(acc{0} + ((g0 + threadIdx.x) & 7), b{0});\n",
          id);
    k += "  }\n";
  } else if (!sum_ids.empty()) {
    for (int id : sum_ids)
      k += fmt::format("  if (lane_of{0} >= 0) atomicAdd(sl{0} + lane_of{0}, lane{0});\n", id);
    k += "  __syncthreads();\n  if (threadIdx.x < 8) {\n";
    for (int id : sum_ids)
      k += fmt::format(
          "    if (sl{0}[threadIdx.x] != 0.0) atomicAdd(acc{0} + threadIdx.x, "
          "sl{0}[threadIdx.x]);\n",
          id);
    k += "  }\n";
  }
  // Prod, Max, Min: the block combines its threads' values (warp shuffles, then shared memory,
  // warp by warp) and its first thread makes the one compare-and-swap in global memory.
  std::vector<int> other_ids;
  for (int id : loop.accumulates)
    if (acc_op(id) != dsl::ReduceOp::Sum) other_ids.push_back(id);
  if (scalar_code) {
    for (int id : other_ids)
      k += fmt::format("  tdm_atomic_combine(acc{0}, av{0}, {1});\n", id,
                       reduce_op_code(acc_op(id)));
  } else if (!other_ids.empty()) {
    for (int id : other_ids) {
      const std::string f = combine_fn(acc_op(id));
      k += fmt::format("  __shared__ float wa{0}[TDM_THREADS / 32];\n", id);
      for (int h = 16; h >= 1; h /= 2)
        k += fmt::format("  av{0} = {1}(av{0}, __shfl_xor_sync(0xffffffffu, av{0}, {2}));\n", id, f,
                         h);
      k += fmt::format("  if ((threadIdx.x & 31) == 0) wa{0}[threadIdx.x / 32] = av{0};\n", id);
    }
    k += "  __syncthreads();\n  if (threadIdx.x == 0) {\n";
    for (int id : other_ids)
      k += fmt::format(
          "    float c{0} = wa{0}[0];\n"
          "    for (int w = 1; w < TDM_THREADS / 32; ++w) c{0} = {1}(c{0}, wa{0}[w]);\n"
          "    tdm_atomic_combine(acc{0}, c{0}, {2});\n",
          id, combine_fn(acc_op(id)), reduce_op_code(acc_op(id)));
    k += "  }\n";
  }
  k += "}\n\n";
  fns_ += k;

  // ---- the host function that launches it
  std::vector<std::string> call = {
      "n",  "g0", "box", "blk != nullptr ? *blk : tandem_block{}", "P", "RK", "tdm_syms_of(a)",
      "vec"};
  std::string aligned;
  for (size_t i = 0; i < io.params.size(); ++i) {
    const Access& acc = io.params[i];
    const std::string base =
        acc.kind == Access::Chunk
            ? fmt::format("static_cast<{}*>(chunk)", ctype(acc.dtype))
            : fmt::format("static_cast<{}*>({})", ctype(acc.dtype), base_ptr(acc.root));
    call.push_back(base);
    if (vec) aligned += fmt::format(" && tdm_aligned16({} + {})", base, at_index(acc.index, "g0"));
  }
  for (int id : io.scalars)
    call.push_back(fmt::format("static_cast<const {}*>(a->buf[{}])", ctype(st(root(id)).type.dtype),
                               root(id)));
  for (int id : io.seed_params) call.push_back(fmt::format("a->seed[{}]", id));
  for (int id : loop.accumulates) call.push_back(fmt::format("a->acc + {} * {}", kAccSlots, id));

  std::string h;
  if (ctx.chunk)
    h = fmt::format(
        "static int {}(const tandem_args* a, void* chunk, int64_t n, int64_t g0, const "
        "tandem_block* blk) {{\n",
        fn);
  else
    h = fmt::format("static int {}(const tandem_args* a, const tandem_block* blk) {{\n", fn);
  h += prologue();
  h += "  tdm_box box{};\n";
  if (ctx.chunk) {
    h += "  if (n <= 0) return 0;\n";
  } else if (R == 0) {
    h += "  const int64_t n = 1, g0 = 0;\n";
  } else {
    // The box, and the global index of its first element.
    std::string g0_expr = "int64_t{0}";
    for (int i = 0; i < R; ++i) {
      h += fmt::format("  box.lo[{0}] = {1};\n  box.cnt[{0}] = {2};\n  box.ext[{0}] = {3};\n", i,
                       box.lo[static_cast<size_t>(i)], box.cnt[static_cast<size_t>(i)],
                       ctx.extents[static_cast<size_t>(i)]);
      g0_expr = fmt::format("({} * box.ext[{}] + box.lo[{}])", g0_expr, i, i);
    }
    h += fmt::format("  box.rank = {};\n", R);
    h += "  int64_t n = 1;\n  for (int i = 0; i < box.rank; ++i) n *= box.cnt[i];\n  if (n <= 0) "
         "return 0;\n";
    h += fmt::format("  const int64_t g0 = {};\n", g0_expr);
  }
  h += fmt::format("  const int vec = 1{};\n", aligned);
  const std::string grid =
      scalar_code ? "1"
                  : (vec ? fmt::format("tdm_blocks((n + {0} - 1) / {0})", V) : "tdm_blocks(n)");
  h += fmt::format("  {}_k<<<{}, {}, 0, tdm_stream(a)>>>({});\n", fn, grid,
                   scalar_code ? "1" : "TDM_THREADS", fmt::join(call, ", "));
  h += fmt::format("  return tdm_launched(a, \"{}\");\n}}\n\n", fn);
  fns_ += h;
  return fn;
}

// What precedes the plan's steps: the ABI, core/formulas.h, the plan's two constants and
// runtime/cuda_prefix.cuh.
std::string cuda_prefix(int symbols) {
  return std::string(
             "// Emitted by tandem codegen/cuda: one schedule of one program as a standalone CUDA "
             "+ NCCL program.\n"
             "// Build: make (see the Makefile). Run: mpirun -np N ./<name> [SYMBOL=EXTENT ...] "
             "[--iters K]\n"
             "#include <stdint.h>\n\nextern \"C\" {\n") +
         abi_declarations() + "}\n\n// ---- core/formulas.h\n" + std::string(formulas_text()) +
         fmt::format(
             "\n// ---- the program's constants\n#define TANDEM_ACC_SLOTS {}\n#define TDM_NSYMS "
             "{}\n",
             TANDEM_ACC_SLOTS, symbols) +
         "\n// ---- codegen/runtime/cuda_prefix.cuh\n" + std::string(cuda_prefix_text());
}

// A Makefile building <name>.cu into <name> with nvcc for sm_80 and sm_90.
std::string cuda_makefile(const std::string& name) {
  return fmt::format(
      R"(# Builds {0} from {0}.cu (emitted by tandem) with nvcc, against NCCL, cuBLAS and MPI.
#   make            the program, for sm_80 and sm_90
#   make resources  each kernel's registers, spills and local memory (ptxas -v); or make EXTRA=--resource-usage
#   make EXTRA=...  more nvcc flags, for either target
#   mpirun -np N ./{0}   checks against check/npN (if emitted for N ranks), then times
CUDA_HOME ?= /usr/local/cuda
NVCC ?= $(CUDA_HOME)/bin/nvcc
ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90
# -fmad=false: a*b+c is not fused, so + - * / round as on the CPU (and as the reference).
NVCCFLAGS ?= -std=c++20 -O3 -fmad=false -lineinfo
WARNINGS ?= -Werror all-warnings -Xcompiler -Wall,-Wextra,-Wno-unused-parameter,-Werror
MPI_CFLAGS ?= $(shell mpicc --showme:compile 2>/dev/null) -DOMPI_SKIP_MPICXX=1 -DMPICH_SKIP_MPICXX=1
MPI_LIBS ?= $(shell mpicc --showme:link 2>/dev/null | sed 's/-pthread//g; s/-Wl,[^ ]*//g')
LIBS ?= -lnccl -lcublas $(MPI_LIBS)

{0}: {0}.cu
	$(NVCC) $(NVCCFLAGS) $(WARNINGS) $(ARCH) $(MPI_CFLAGS) $(EXTRA) -o $@ $< $(LIBS)

resources: {0}.cu
	$(NVCC) $(NVCCFLAGS) $(WARNINGS) $(ARCH) $(MPI_CFLAGS) $(EXTRA) --resource-usage -c -o /dev/null $<

.PHONY: resources
)",
      name);
}

}  // namespace

CudaProgram emit_cuda(const schedule::Plan& plan, const std::string& name) {
  CudaEmitter e(plan);
  CudaProgram out;
  const std::string body = e.emit_body();
  out.source = cuda_prefix(static_cast<int>(plan.program.symbols().size())) + "\n" + body + "\n" +
               e.emit_tables() + "\n// ---- codegen/runtime/cuda_runtime.cuh\n" +
               std::string(cuda_runtime_text()) + "\n// ---- codegen/runtime/cuda_main.cu\n" +
               std::string(cuda_main_text());
  out.makefile = cuda_makefile(name);
  return out;
}

}  // namespace tandem::codegen
