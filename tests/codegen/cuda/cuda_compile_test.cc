// The emitted CUDA programs compile and link with nvcc (sm_80 and sm_90, every warning an error)
// against NCCL, cuBLAS and MPI, and ptxas reports no register spills in any kernel; the runtime
// files they are made of (src/codegen/runtime/) compile on their own, without a plan. Nothing
// here runs on a GPU. Skipped, with the reason, where nvcc, nccl.h or mpicc is missing.
//
// nvcc takes ~10-20 s per program on two cores, so by default one representative schedule per
// workload is built (each exercising what its workload adds: fused chunks, norms, overlapped GEMMs
// and dropout, transfers between groups, sums over a strided box, every fold in a vector loop);
// TANDEM_CUDA_ALL=1 builds every schedule of every workload (79 programs, about 20 minutes).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "tandem/codegen/cuda.h"
#include "tandem/dsl/dsl.h"
#include "tandem/dsl/workloads.h"
#include "tandem/schedule/transforms.h"

namespace tandem::codegen {
namespace {

namespace fs = std::filesystem;

// The CUDA toolkit's root: $CUDA_HOME, else /usr/local/cuda, else nvcc's on PATH; empty if none.
std::string cuda_home() {
  std::vector<std::string> roots;
  if (const char* env = std::getenv("CUDA_HOME")) roots.push_back(env);
  roots.push_back("/usr/local/cuda");
  for (const std::string& r : roots)
    if (fs::exists(fs::path(r) / "bin" / "nvcc")) return r;
  return {};
}

struct Output {
  int rc = -1;
  std::string text;
};

Output run(const std::string& command) {
  Output out;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.text.append(buf.data(), n);
  const int status = pclose(pipe);
  out.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// Why the toolkit cannot build here, or empty.
std::string missing_toolkit() {
  const std::string home = cuda_home();
  if (home.empty()) return "nvcc not found (no $CUDA_HOME/bin/nvcc, no /usr/local/cuda/bin/nvcc)";
  if (!fs::exists(fs::path(home) / "include" / "nccl.h") && !fs::exists("/usr/include/nccl.h"))
    return "nccl.h not found next to nvcc or in /usr/include";
  if (run("mpicc --showme:compile").rc != 0)
    return "mpicc --showme (OpenMPI) not available for the MPI flags";
  return {};
}

struct Built {
  bool ok = false;
  std::string log;
};

// Emits `plan` into a fresh folder and builds it with its own Makefile (asking ptxas for each
// kernel's resources when `resources` is given).
Built build(const schedule::Plan& plan, const std::string& stem, std::string* resources) {
  const fs::path dir =
      fs::temp_directory_path() / ("tandem_cuda_" + std::to_string(getpid())) / stem;
  fs::create_directories(dir);
  const CudaProgram prog = emit_cuda(plan, "prog");
  std::ofstream(dir / "prog.cu") << prog.source;
  std::ofstream(dir / "Makefile") << prog.makefile;
  const std::string make = "cd '" + dir.string() + "' && make CUDA_HOME='" + cuda_home() + "'";
  Built b;
  const Output o = run(make + (resources != nullptr ? " EXTRA=--resource-usage" : "") + " prog");
  b.log = o.text;
  b.ok = o.rc == 0 && fs::exists(dir / "prog");
  if (resources != nullptr) *resources = o.text;
  fs::remove_all(dir);
  return b;
}

// ptxas -v per function: "Compiling entry function '_Z..' for 'sm_80'", "Used N registers",
// "N bytes stack frame, S bytes spill stores, L bytes spill loads".
void expect_no_spills(const std::string& resources, const std::string& what) {
  const std::regex spill(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
  int functions = 0;
  for (auto it = std::sregex_iterator(resources.begin(), resources.end(), spill);
       it != std::sregex_iterator(); ++it) {
    ++functions;
    EXPECT_EQ((*it)[1].str(), "0") << what << ": spill stores in\n" << resources;
    EXPECT_EQ((*it)[2].str(), "0") << what << ": spill loads in\n" << resources;
  }
  EXPECT_GT(functions, 0) << what << ": ptxas reported no functions:\n" << resources;
  // The emitted kernels keep their box, vectors and accumulators in registers: no local memory.
  const std::regex frame(
      R"(Function properties for (\S*(?:loop|hook)\d+_k\S*)\s+(\d+) bytes stack frame)");
  for (auto it = std::sregex_iterator(resources.begin(), resources.end(), frame);
       it != std::sregex_iterator(); ++it)
    EXPECT_EQ((*it)[2].str(), "0") << what << ": " << (*it)[1].str() << " uses local memory";
  // The emitted kernels' registers, for the record (in the test's output).
  const std::regex regs(
      R"(Function properties for (\S*(?:loop|hook)\d+_k\S*)[\s\S]*?Used (\d+) registers)");
  for (auto it = std::sregex_iterator(resources.begin(), resources.end(), regs);
       it != std::sregex_iterator(); ++it)
    std::printf("  %s: %s %s registers\n", what.c_str(), (*it)[1].str().c_str(),
                (*it)[2].str().c_str());
}

std::string stem_of(const std::string& program, const std::string& schedule) {
  std::string out = program + "_";
  for (char c : schedule) out += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return out;
}

// src/codegen/runtime/cuda_main.cu (which includes the other runtime files) compiled with nvcc -c
// by an emitted program's Makefile, so with the very flags and warnings of every emitted program.
TEST(CudaCompile, RuntimeFilesCompileOnTheirOwn) {
  if (const std::string why = missing_toolkit(); !why.empty()) GTEST_SKIP() << why;
  const fs::path source = TANDEM_SOURCE_DIR;
  const fs::path dir =
      fs::temp_directory_path() / ("tandem_cuda_" + std::to_string(getpid())) / "runtime";
  fs::create_directories(dir);
  const schedule::Plan plan =
      schedule::enumerate_schedules(dsl::workloads::adam()).front().schedule.lower();
  std::ofstream(dir / "Makefile") << emit_cuda(plan, "runtime").makefile;
  std::ofstream(dir / "runtime.cu")
      << "#include \"" << (source / "src/codegen/runtime/cuda_main.cu").string() << "\"\n";
  const Output o = run("cd '" + dir.string() + "' && make CUDA_HOME='" + cuda_home() +
                       "' EXTRA='-I" + (source / "include").string() + "' resources");
  fs::remove_all(dir);
  EXPECT_EQ(o.rc, 0) << o.text;
}

// One representative schedule of a workload: what it exercises, its program, its schedule.
struct Representative {
  std::string what;
  std::function<dsl::Program()> program;
  std::string schedule;
};

const std::vector<Representative>& representatives() {
  static const std::vector<Representative> all = {
      {"adam", [] { return dsl::workloads::adam(); },
       "fused(RS-C-AG)+slice(m,v)"},  // a hook per chunk, bf16 gradients
      {"lamb", [] { return dsl::workloads::lamb(); },
       "fused(RS-C-AG)"},  // norms: accumulators and finishes
      {"megatron", [] { return dsl::workloads::megatron_layer(); },
       "ol(MM,fused(RS-C-AG))"},  // GEMM blocks, async collectives, dropout
      {"pipeline", [] { return dsl::workloads::pipeline_stage(); },
       "ol(MM,fused(RS-C)-P2P)-AG"},  // send/recv between groups
      {"sum_in_place", [] { return dsl::workloads::sum_in_place(); },
       "AR-C"},  // the all-reduce in its input's buffer
      {"megatron_bf16", [] { return dsl::workloads::megatron_layer(DType::F32, 0.1, DType::BF16); },
       "ol(MM,fused(RS-C-AG))"},  // bf16 GEMM blocks and sums, the hook's cast to f32
      {"sum_in_place_bf16", [] { return dsl::workloads::sum_in_place(DType::BF16); },
       "fused(AR-C)"},  // casts around a bf16 sum
      {"grad_handoff", [] { return dsl::workloads::grad_handoff(); },
       "C"},  // a receive into an input's buffer
      {"strided_sums", [] { return dsl::workloads::strided_sums(); },
       "C"},  // sums whose lane moves along a thread's loop
      {"folds", [] { return dsl::workloads::folds(); },
       "C"},  // every fold in a 16-byte vector loop
  };
  return all;
}

// One CTest test a program (nvcc takes 10-20 s each), so that they spread over CTest's jobs.
class CudaRepresentative : public ::testing::TestWithParam<size_t> {};

TEST_P(CudaRepresentative, BuildsWithoutSpills) {
  if (const std::string why = missing_toolkit(); !why.empty()) GTEST_SKIP() << why;
  const Representative& r = representatives()[GetParam()];
  const dsl::Program program = r.program();
  bool found = false;
  for (const schedule::NamedSchedule& ns : schedule::enumerate_schedules(program)) {
    if (ns.name != r.schedule) continue;
    found = true;
    std::string resources;
    const Built b = build(ns.schedule.lower(), stem_of(program.name(), r.schedule), &resources);
    ASSERT_TRUE(b.ok) << program.name() << " " << r.schedule << ":\n" << b.log;
    expect_no_spills(resources, program.name() + " " + r.schedule);
  }
  EXPECT_TRUE(found) << "no schedule " << r.schedule << " of " << program.name();
}

INSTANTIATE_TEST_SUITE_P(EveryWorkload, CudaRepresentative,
                         ::testing::Range<size_t>(0, representatives().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return representatives()[info.param].what;
                         });

// A Shift (kv_ring, ring attention's exchange): kind 4, one ncclSend and one ncclRecv in a group.
TEST(CudaCompile, ShiftBuilds) {
  if (const std::string why = missing_toolkit(); !why.empty()) GTEST_SKIP() << why;
  const dsl::Program program = dsl::workloads::kv_ring();
  const schedule::Plan plan = schedule::enumerate_schedules(program).front().schedule.lower();
  const CudaProgram prog = emit_cuda(plan, "kv_ring");
  EXPECT_NE(prog.source.find("c.kind = 4;"), std::string::npos);
  EXPECT_NE(prog.source.find("ncclRecv(c->recv"), std::string::npos);
  const Built b = build(plan, "kv_ring_C", nullptr);
  ASSERT_TRUE(b.ok) << b.log;
}

TEST(CudaCompile, EveryScheduleOfEveryWorkloadBuilds) {
  if (const std::string why = missing_toolkit(); !why.empty()) GTEST_SKIP() << why;
  if (std::getenv("TANDEM_CUDA_ALL") == nullptr)
    GTEST_SKIP()
        << "set TANDEM_CUDA_ALL=1 to build all 79 programs (about 20 minutes on two cores)";
  for (const dsl::Program& program :
       {dsl::workloads::adam(), dsl::workloads::lamb(), dsl::workloads::megatron_layer(),
        dsl::workloads::pipeline_stage()})
    for (const schedule::NamedSchedule& ns : schedule::enumerate_schedules(program)) {
      const Built b = build(ns.schedule.lower(), stem_of(program.name(), ns.name), nullptr);
      EXPECT_TRUE(b.ok) << program.name() << " " << ns.name << ":\n" << b.log;
    }
}

}  // namespace
}  // namespace tandem::codegen
