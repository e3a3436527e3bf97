// The CUDA emitter's text, where it matters and no compiler would notice: every schedule of every
// workload emits; one NCCL-backed collective call per collective step (a fused stage is one
// collective with its hook, not a reduce, a kernel and a gather of its own); the chunk loop that
// pipelines a hook against the next chunk's reduction; no host synchronisation in any step (so a
// pipeline's blocks overlap); 16-byte vectors in plain elementwise kernels and in those that fold;
// whole-tensor sums added to global memory once per block and lane, never in an element loop; GEMMs
// through the ABI's sgemm in an overlap pipeline, skewed so block b + 1's GEMM is queued before
// block b waits; and core/formulas.h's text pasted as the build embedded it.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tandem/codegen/cuda.h"
#include "tandem/codegen/formulas_text.h"
#include "tandem/dsl/dsl.h"
#include "tandem/dsl/workloads.h"
#include "tandem/schedule/transforms.h"

namespace tandem::codegen {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

// The step functions only: after the prefix, before the tables and the runtime.
std::string steps_of(const std::string& src) {
  const size_t from = src.find("// Plan '");
  const size_t to = src.find("// ---- the plan's tables");
  EXPECT_NE(from, std::string::npos);
  EXPECT_NE(to, std::string::npos);
  return src.substr(from, to - from);
}

int collective_steps(const std::vector<schedule::Step>& steps) {
  int n = 0;
  for (const schedule::Step& s : steps) {
    if (s.kind == schedule::StepKind::Collective) ++n;
    if (s.kind == schedule::StepKind::Pipeline) n += collective_steps(s.pipeline.body);
  }
  return n;
}

bool has_fused(const std::vector<schedule::Step>& steps) {
  for (const schedule::Step& s : steps) {
    if (s.kind == schedule::StepKind::Collective && s.collective.fused) return true;
    if (s.kind == schedule::StepKind::Pipeline && has_fused(s.pipeline.body)) return true;
  }
  return false;
}

bool has_pipeline(const std::vector<schedule::Step>& steps) {
  for (const schedule::Step& s : steps)
    if (s.kind == schedule::StepKind::Pipeline) return true;
  return false;
}

std::vector<dsl::Program> workloads() {
  return {dsl::workloads::adam(), dsl::workloads::lamb(), dsl::workloads::megatron_layer(),
          dsl::workloads::pipeline_stage(),
          // The tensor-parallel exchanges of bf16 training: casts around bf16 collectives.
          dsl::workloads::megatron_layer(DType::F32, 0.1, DType::BF16),
          dsl::workloads::pipeline_stage(DType::F32, 0.1, DType::BF16),
          dsl::workloads::sum_in_place(DType::BF16), dsl::workloads::kv_ring()};
}

TEST(CudaEmit, EveryScheduleEmitsAProgram) {
  int programs = 0;
  for (const dsl::Program& p : workloads())
    for (const schedule::NamedSchedule& ns : schedule::enumerate_schedules(p)) {
      const schedule::Plan plan = ns.schedule.lower();
      const CudaProgram prog = emit_cuda(plan, "prog");
      ++programs;
      EXPECT_NE(prog.source.find("int main(int argc, char** argv)"), std::string::npos)
          << p.name() << " " << ns.name;
      EXPECT_NE(prog.source.find("ncclCommInitRank"), std::string::npos);
      EXPECT_NE(prog.source.find("extern \"C\" int tandem_run(const tandem_args* a)"),
                std::string::npos);
      EXPECT_NE(prog.makefile.find("prog: prog.cu"), std::string::npos);
      EXPECT_NE(prog.makefile.find("code=sm_80"), std::string::npos);
      EXPECT_NE(prog.makefile.find("code=sm_90"), std::string::npos);
      // Deterministic.
      EXPECT_EQ(prog.source, emit_cuda(plan, "prog").source) << p.name() << " " << ns.name;
    }
  EXPECT_GE(programs, 4 * 2);
}

TEST(CudaEmit, OneCollectiveCallPerCollectiveStep) {
  for (const dsl::Program& p : workloads())
    for (const schedule::NamedSchedule& ns : schedule::enumerate_schedules(p)) {
      const schedule::Plan plan = ns.schedule.lower();
      const std::string steps = steps_of(emit_cuda(plan, "prog").source);
      // Each Collective step hands exactly one descriptor over; norms and reductions across
      // ranks add their own one-element all-reduces (written `if (int rc = a->collective`).
      EXPECT_EQ(count(steps, "return a->collective(a->host, &c);"),
                static_cast<size_t>(collective_steps(plan.steps)))
          << p.name() << " " << ns.name;
      if (has_fused(plan.steps)) {
        EXPECT_NE(steps.find("c.hook = hook"), std::string::npos) << p.name() << " " << ns.name;
      }
    }
}

TEST(CudaEmit, FusedCollectivesPipelineChunksAgainstTheirHooks) {
  const dsl::Program adam = dsl::workloads::adam();
  for (const schedule::NamedSchedule& ns : schedule::enumerate_schedules(adam)) {
    const schedule::Plan plan = ns.schedule.lower();
    if (!has_fused(plan.steps)) continue;
    const std::string src = emit_cuda(plan, "prog").source;
    // The hook is a kernel launched on the compute stream for each reduced chunk.
    EXPECT_NE(src.find("static int hook"), std::string::npos) << ns.name;
    EXPECT_NE(src.find("__global__ void __launch_bounds__(TDM_THREADS) hook"), std::string::npos)
        << ns.name;
    // The runtime's chunk loop: the next chunk's reduction is issued before this chunk's gather.
    const size_t loop = src.find("for (int64_t k0 = 0; k0 < most; k0 += chunk)");
    ASSERT_NE(loop, std::string::npos);
    const size_t next = src.find("tdm_reduce_parts(h, c, send, mine, n, k0 + chunk", loop);
    const size_t gather = src.find("tdm_gather_parts(h, c, send, n, k0, chunk, es)", loop);
    ASSERT_NE(next, std::string::npos);
    ASSERT_NE(gather, std::string::npos);
    EXPECT_LT(next, gather);
  }
}

TEST(CudaEmit, NoHostSynchronisationInAnyStep) {
  for (const dsl::Program& p : workloads())
    for (const schedule::NamedSchedule& ns : schedule::enumerate_schedules(p)) {
      const std::string steps = steps_of(emit_cuda(ns.schedule.lower(), "prog").source);
      for (const char* sync : {"cudaStreamSynchronize", "cudaDeviceSynchronize",
                               "cudaEventSynchronize", "cudaMemcpy(", "cudaMalloc", "cudaFree"})
        EXPECT_EQ(steps.find(sync), std::string::npos)
            << p.name() << " " << ns.name << ": " << sync;
    }
}

TEST(CudaEmit, OverlapRunsGemmBlocksWithAsynchronousCollectives) {
  const dsl::Program layer = dsl::workloads::megatron_layer();
  int overlapped = 0, skewed = 0;
  for (const schedule::NamedSchedule& ns : schedule::enumerate_schedules(layer)) {
    const schedule::Plan plan = ns.schedule.lower();
    if (!has_pipeline(plan.steps)) continue;
    ++overlapped;
    const std::string steps = steps_of(emit_cuda(plan, "prog").source);
    EXPECT_NE(steps.find("a->sgemm("), std::string::npos) << ns.name;
    // A body that never waits for its block's communication issues GEMM after GEMM. One that
    // does is skewed: block b + 1's GEMM and collective are issued before block b waits for its
    // own communication, so the compute stream does not queue the GEMM behind that wait.
    const size_t wait = steps.find("a->sync(a->host, blk->index)");
    if (wait == std::string::npos) {
      EXPECT_NE(steps.find("for (int32_t b = 0; b < blocks; ++b)"), std::string::npos) << ns.name;
      continue;
    }
    ++skewed;
    const size_t loop = steps.find("for (int32_t b = 0; b <= blocks; ++b)");
    ASSERT_NE(loop, std::string::npos) << ns.name;
    const size_t head = steps.find("if (b < blocks) {", loop),
                 tail = steps.find("if (b > 0) {", loop);
    const size_t matmul = steps.find("(rc = matmul", loop);
    EXPECT_LT(head, matmul) << ns.name;
    EXPECT_LT(matmul, tail) << ns.name;
    EXPECT_LT(tail, wait) << ns.name;
    EXPECT_NE(steps.find("c.async = 1"), std::string::npos) << ns.name;
    EXPECT_NE(steps.find("c.block = *blk;"), std::string::npos) << ns.name;
  }
  EXPECT_GT(overlapped, 0) << "megatron_layer has an overlap schedule";
  EXPECT_GT(skewed, 0)
      << "some overlap schedule waits inside its blocks (a split AllReduce's epilogue)";
}

TEST(CudaEmit, PlainElementwiseKernelsMove16ByteVectors) {
  for (DType dt : {DType::F32, DType::BF16}) {
    const dsl::Program adam = dsl::workloads::adam(dt);
    const schedule::Plan plan =
        schedule::enumerate_schedules(adam).front().schedule.lower();  // AR-C: one loop
    const std::string steps = steps_of(emit_cuda(plan, "prog").source);
    EXPECT_NE(steps.find(dt == DType::F32 ? "tdm_vload<4>" : "tdm_vload<8>"), std::string::npos)
        << dtype_name(dt);
    EXPECT_NE(steps.find("tdm_aligned16("), std::string::npos);
  }
}

// The emitted kernels, each from its `__global__` to its closing brace.
std::vector<std::string> kernels_of(const std::string& steps) {
  std::vector<std::string> out;
  for (size_t at = steps.find("__global__ void"); at != std::string::npos;
       at = steps.find("__global__ void", at + 1)) {
    const size_t end = steps.find("\n}\n", at);
    EXPECT_NE(end, std::string::npos);
    out.push_back(steps.substr(at, end - at));
  }
  return out;
}

// A whole-tensor sum (LAMB's norms) folds into a register per thread in the element loop; the
// block adds its threads' lanes, and only then, outside every element loop, at most 8 of its
// threads add them to the accumulator in global memory.
TEST(CudaEmit, SumsReachGlobalMemoryOncePerBlockLane) {
  int folding = 0, strided = 0;
  std::vector<dsl::Program> programs = workloads();
  programs.push_back(dsl::workloads::strided_sums());
  for (const dsl::Program& p : programs)
    for (const schedule::NamedSchedule& ns : schedule::enumerate_schedules(p)) {
      const std::string steps = steps_of(emit_cuda(ns.schedule.lower(), "prog").source);
      for (const std::string& k : kernels_of(steps)) {
        if (k.find("double* acc") == std::string::npos) continue;
        if (k.find("double lane") == std::string::npos) continue;  // Prod, Max, Min only
        ++folding;
        // A lane that moves: flushed into the block's shared lanes, not to global memory.
        if (k.find("lane_of") != std::string::npos) ++strided;
        const std::string what = p.name() + " " + ns.name + ":\n" + k;
        // The element loops (at the kernel's first indentation; their bodies are deeper).
        size_t loops = 0;
        for (size_t at = k.find("\n  for (int64_t "); at != std::string::npos;
             at = k.find("\n  for (int64_t ", at + 1)) {
          ++loops;
          const size_t end = k.find("\n  }\n", at);
          ASSERT_NE(end, std::string::npos) << what;
          EXPECT_EQ(k.substr(at, end - at).find("atomicAdd(acc"), std::string::npos) << what;
        }
        if (k.find("if (first == 0)") != std::string::npos) continue;  // the one-thread kernel
        EXPECT_GT(loops, 0u) << what;
        // Global atomics only from the block's first 8 threads, after the block's barrier.
        const size_t eight = k.rfind("if (threadIdx.x < 8) {");
        ASSERT_NE(eight, std::string::npos) << what;
        ASSERT_NE(k.rfind("__syncthreads();", eight), std::string::npos) << what;
        EXPECT_EQ(k.substr(0, eight).find("atomicAdd(acc"), std::string::npos) << what;
        EXPECT_NE(k.find("atomicAdd(acc", eight), std::string::npos) << what;
      }
    }
  EXPECT_GT(folding, 0) << "LAMB's norms fold in some kernel";
  EXPECT_GT(strided, 0) << "a sum over a strided box folds in some kernel";
  // LAMB's fused update: the hook folds both norms, its lanes fixed per thread (a chunk is
  // contiguous), so the block adds them by warp shuffles.
  for (const schedule::NamedSchedule& ns : schedule::enumerate_schedules(dsl::workloads::lamb())) {
    if (ns.name != "fused(RS-C-AG)+slice(m,v)") continue;
    const std::string steps = steps_of(emit_cuda(ns.schedule.lower(), "prog").source);
    const size_t hook = steps.find("__launch_bounds__(TDM_THREADS) hook");
    ASSERT_NE(hook, std::string::npos);
    const std::string k = steps.substr(hook, steps.find("\n}\n", hook) - hook);
    EXPECT_EQ(count(k, "__shfl_xor_sync("), 4u) << k;
    EXPECT_EQ(count(k, "atomicAdd(acc"), 2u) << k;
    EXPECT_EQ(k.find("lane_of"), std::string::npos) << k;
  }
}

// A loop that folds takes the 16-byte vector path too: a sum keeps one register per lane of
// the vector's elements (indexed by the unrolled j, no local memory), transposed onto the
// threads' own lanes before the block's reduction. With 4 f32 lanes the vector loop stops at a
// multiple of 8 elements, so the scalar tail keeps the thread's lane.
TEST(CudaEmit, FoldingLoopsMove16ByteVectors) {
  int seen4 = 0, seen8 = 0;
  for (DType dt : {DType::F32, DType::BF16})
    for (const schedule::NamedSchedule& ns :
         schedule::enumerate_schedules(dsl::workloads::lamb(dt))) {
      const std::string steps = steps_of(emit_cuda(ns.schedule.lower(), "prog").source);
      for (const std::string& k : kernels_of(steps)) {
        if (k.find("double lane") == std::string::npos) continue;
        if (k.find("if (first == 0)") != std::string::npos) continue;  // the one-thread kernel
        if (k.find("lane_of") != std::string::npos) continue;          // a strided box: scalar
        const std::string what = ns.name + ":\n" + k;
        // A contiguous loop whose operands all move with t: every one of LAMB's.
        const int V = k.find("tdm_vload<8>") != std::string::npos ? 8 : 4;
        ++(V == 8 ? seen8 : seen4);
        const std::string v = std::to_string(V);
        EXPECT_NE(k.find("tdm_vload<" + v + ">"), std::string::npos) << what;
        EXPECT_NE(k.find("[j % " + v + "] += "), std::string::npos) << what;
        EXPECT_NE(k.find("tdm_vec_lanes<" + v + ">("), std::string::npos) << what;
        EXPECT_NE(k.find(V == 8 ? "nv = vec ? n / 8 : 0" : "nv = vec ? n / 8 * 2 : 0"),
                  std::string::npos)
            << what;
        // The transpose precedes the block's shuffles.
        EXPECT_LT(k.find("tdm_vec_lanes<"), k.find("__shfl_xor_sync(")) << what;
      }
    }
  EXPECT_GT(seen4, 0) << "a norm of f32 values folds in a vector loop";
  EXPECT_GT(seen8, 0) << "a norm next to bf16 gradients folds in a vector loop";
}

// Prod, Max, Min over every dim: the block combines its threads' values (shuffles, then shared
// memory) and only its first thread, after the barrier, makes the compare-and-swap in global
// memory: one a block, not one a thread.
TEST(CudaEmit, ProdMaxMinReachGlobalMemoryOncePerBlock) {
  int seen = 0;
  for (const schedule::NamedSchedule& ns :
       schedule::enumerate_schedules(dsl::workloads::strided_sums())) {
    const std::string steps = steps_of(emit_cuda(ns.schedule.lower(), "prog").source);
    for (const std::string& k : kernels_of(steps)) {
      const size_t folds = count(k, "  float av");
      if (folds == 0 || k.find("if (first == 0)") != std::string::npos) continue;
      ++seen;
      const std::string what = ns.name + ":\n" + k;
      EXPECT_EQ(count(k, "tdm_atomic_combine("), folds) << what;
      const size_t barrier = k.rfind("__syncthreads();");
      const size_t one = k.find("if (threadIdx.x == 0) {", barrier);
      ASSERT_NE(barrier, std::string::npos) << what;
      ASSERT_NE(one, std::string::npos) << what;
      EXPECT_EQ(k.substr(0, one).find("tdm_atomic_combine("), std::string::npos) << what;
      EXPECT_NE(k.find("fx::max(av"), std::string::npos) << what;
    }
  }
  EXPECT_GT(seen, 0) << "strided_sums folds a Max";
}

TEST(CudaEmit, PastesTheEmbeddedFormulas) {
  const std::string src =
      emit_cuda(schedule::enumerate_schedules(dsl::workloads::adam()).front().schedule.lower(), "p")
          .source;
  EXPECT_EQ(count(src, std::string(formulas_text())), 1u);
  EXPECT_NE(formulas_text().find("namespace tandem::fx"), std::string_view::npos);
  EXPECT_NE(formulas_text().find("__host__ __device__"), std::string_view::npos);
  // The kernels print the formulas by name.
  EXPECT_NE(src.find("fx::sqrt("), std::string::npos);
  EXPECT_NE(src.find("fx::st_bf16("), std::string::npos);
}

}  // namespace
}  // namespace tandem::codegen
