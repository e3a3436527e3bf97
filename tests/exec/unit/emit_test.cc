// The emitter's output: deterministic (the cache key is its text), one extern "C" entry signature
// per step plus tandem_run, the shared prefix once, fused computation as hooks handed to the
// collectives, and inner loops that the compiler reports vectorised.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <vector>

#include "support/schedules.h"
#include "tandem/codegen/cpp.h"
#include "tandem/core/env.h"
#include "tandem/dsl/dsl.h"
#include "tandem/exec/jit.h"
#include "tandem/schedule/transforms.h"

namespace tandem::codegen {
namespace {

using tandem::testing::plan_named;

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

TEST(Emit, SameTextForTheSamePlan) {
  for (const char* name : {"fused(RS-C-AG)+slice(m,v)", "AR-C"}) {
    const std::string a = emit_cpp(plan_named(dsl::workloads::adam(), name));
    const std::string b = emit_cpp(plan_named(dsl::workloads::adam(), name));
    EXPECT_EQ(a, b) << name;
  }
  // Different schedules, different text.
  EXPECT_NE(emit_cpp(plan_named(dsl::workloads::adam(), "AR-C")),
            emit_cpp(plan_named(dsl::workloads::adam(), "fused(AR-C)")));
}

TEST(Emit, OneEntrySignaturePerStepAndTheSharedPrefix) {
  const schedule::Plan plan = plan_named(dsl::workloads::adam(), "fused(RS-C-AG)");
  const std::string src = emit_cpp(plan);
  EXPECT_EQ(src.rfind(cpp_prefix(), 0), 0u) << "the source starts with the shared prefix";
  EXPECT_EQ(count(src, "Emitted by tandem codegen/cpp"), 1u);
  EXPECT_EQ(count(src, "extern \"C\" int tandem_run(const tandem_args* a)"), 1u);
  for (size_t k = 0; k < plan.steps.size(); ++k)
    EXPECT_EQ(count(src, "extern \"C\" int " + step_symbol(static_cast<int>(k)) +
                             "(const tandem_args* a)"),
              1u)
        << k;
  EXPECT_EQ(
      count(src, "extern \"C\" int " + step_symbol(static_cast<int>(plan.steps.size())) + "("), 0u);
  // The update runs inside the reduce-scatter: a hook function handed over in the descriptor.
  EXPECT_NE(src.find("c.hook = hook"), std::string::npos);
  EXPECT_NE(src.find("__restrict"), std::string::npos);
  // Nothing of the host's world: no communicator, no std::function, no BLAS header.
  for (const char* banned : {"Communicator", "std::function", "cblas", "#include \"tandem"})
    EXPECT_EQ(src.find(banned), std::string::npos) << banned;
}

TEST(Emit, SourceDoesNotDependOnTheSizes) {
  // Sizes and rank counts are run-time values: the text names the symbols, never their extents.
  const std::string src =
      emit_cpp(plan_named(dsl::workloads::megatron_layer(), "ol(MM,fused(AR-C))"));
  EXPECT_NE(src.find("a->sym["), std::string::npos);
  EXPECT_NE(src.find("a->p"), std::string::npos);
}

// The lines of `src` where a run function's element loop starts.
std::set<int> element_loops(const std::string& src) {
  std::set<int> lines;
  std::istringstream in(src);
  std::string line;
  bool in_run = false;
  for (int no = 1; std::getline(in, line); ++no) {
    if (line.rfind("static void ", 0) == 0) in_run = line.find("_run(") != std::string::npos;
    // Straight loops, and the element loops of tiles (a dropout's words drawn per tile).
    if (in_run && (line.find("for (int64_t t = 0; t < n; ++t)") != std::string::npos ||
                   line.find("for (int64_t t = t0; t < t0 + tn; ++t)") != std::string::npos))
      lines.insert(no);
  }
  return lines;
}

// Compiles `src` as the JIT does, asking GCC which loops it vectorised; returns their lines.
std::set<int> vectorised_lines(const std::string& src, const std::string& tag) {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("tandem-emit-test-{}", ::getpid());
  fs::create_directories(dir);
  const fs::path file = dir / (tag + ".cc");
  std::ofstream(file) << src;
  std::string cmd = env_str("CXX", "c++");
  for (const std::string& f : exec::default_jit_flags())
    if (f != "-shared") cmd += " " + f;
  cmd += " -fopt-info-vec-optimized -c -o /dev/null " + file.string() + " 2>&1";
  std::set<int> lines;
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  if (p == nullptr) return lines;
  char buf[4096];
  const std::regex re(":([0-9]+):[0-9]+: optimized: loop vectorized");
  while (fgets(buf, sizeof buf, p) != nullptr) {
    std::cmatch m;
    if (std::regex_search(buf, m, re)) lines.insert(std::stoi(m[1].str()));
  }
  EXPECT_EQ(pclose(p), 0) << cmd;
  fs::remove_all(dir);
  return lines;
}

TEST(Emit, FusedLoopsVectorise) {
  if (env_str("CXX", "c++").find("clang") != std::string::npos)
    GTEST_SKIP() << "-fopt-info is GCC's";
  // AdamW inside the reduce-scatter (bf16 gradient loaded and widened in the loop), and the
  // Megatron epilogue inside the all-reduce (bias broadcast, counter-based dropout, residual).
  const std::pair<dsl::Program, std::string> cases[] = {
      {dsl::workloads::adam(DType::BF16), "fused(RS-C-AG)+slice(m,v)"},
      {dsl::workloads::megatron_layer(DType::F32, 0.1), "fused(AR-C)"},
      {dsl::workloads::megatron_layer(DType::BF16, 0.1), "ol(MM,fused(RS-C-AG))"},
  };
  for (const auto& [program, name] : cases) {
    const std::string src = emit_cpp(plan_named(program, name));
    const std::set<int> loops = element_loops(src), done = vectorised_lines(src, program.name());
    ASSERT_FALSE(loops.empty());
    // Every element loop (scalar code is emitted without one).
    for (int line : loops)
      EXPECT_TRUE(done.count(line)) << program.name() << " / " << name << ": the loop at line "
                                    << line << " is not vectorised";
  }
}

// The lines where tile loops start in run functions that fold a sum into lanes, and where the
// group loop of each lane-fold helper the source calls starts (in the prefix).
std::set<int> sum_fold_loops(const std::string& src) {
  std::set<int> lines;
  std::vector<std::string> text;
  std::istringstream in(src);
  for (std::string line; std::getline(in, line);) text.push_back(line);
  // Run functions: from "static void ..._run(" to the next line that is "}".
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i].rfind("static void ", 0) != 0 || text[i].find("_run(") == std::string::npos)
      continue;
    size_t end = i;
    bool folds = false;
    while (end < text.size() && text[end] != "}")
      folds |= text[end++].find("tdm_fold_sum") != std::string::npos;
    if (folds)
      for (size_t j = i; j < end; ++j)
        if (text[j].find("for (int64_t t = t0; t < t0 + tn; ++t)") != std::string::npos)
          lines.insert(static_cast<int>(j + 1));
    i = end;
  }
  for (const char* helper : {"tdm_fold_sum8(", "tdm_fold_sumsq8("}) {
    if (src.find(std::string(helper) + "acc") == std::string::npos) continue;  // not called
    size_t j = 0;
    while (j < text.size() &&
           text[j].find(std::string("inline void ") + helper) == std::string::npos)
      ++j;
    while (j < text.size() && text[j].find("for (int64_t q = 0; q < groups;") == std::string::npos)
      ++j;
    EXPECT_LT(j, text.size()) << helper << " has no group loop";
    lines.insert(static_cast<int>(j + 1));
  }
  return lines;
}

TEST(Emit, SumAndNormFoldsVectorise) {
  if (env_str("CXX", "c++").find("clang") != std::string::npos)
    GTEST_SKIP() << "-fopt-info is GCC's";
  // LAMB's norms folded into double lanes: the tile loop computing the update, and the helpers'
  // groups of 8 (2 x 4 doubles on AVX2), in the fused and the unfused sliced schedules; a
  // whole-tensor sum too.
  dsl::Program sum("sum_fold");
  {
    using namespace tandem::dsl;  // NOLINT
    const Expr x = sum.input(F32, {"N"}, Replicated, "x");
    sum.output(reduce(ReduceOp::Sum, x * 2.0), "t");
    sum.output(norm(x), "n");
  }
  const std::pair<dsl::Program, std::string> cases[] = {
      {dsl::workloads::lamb(DType::BF16), "fused(RS-C-AG)+slice(m,v)"},
      {dsl::workloads::lamb(DType::F32), "AR-C"},
      {sum, "C"},
  };
  for (const auto& [program, name] : cases) {
    std::string plan_name = name;
    if (name == "C") plan_name = schedule::enumerate_schedules(program).front().name;
    const std::string src = emit_cpp(plan_named(program, plan_name));
    const std::set<int> loops = sum_fold_loops(src), done = vectorised_lines(src, program.name());
    ASSERT_FALSE(loops.empty()) << program.name() << " / " << plan_name;
    EXPECT_NE(src.find("tdm_fold_sumsq8(acc"), std::string::npos);
    for (int line : loops)
      EXPECT_TRUE(done.count(line)) << program.name() << " / " << plan_name << ": the loop at line "
                                    << line << " is not vectorised";
  }
}

}  // namespace
}  // namespace tandem::codegen
