// `tandem info`: prints what this build will use on this machine, for bug reports and set-up
// checks.
#include <fmt/format.h>

#include <string>
#include <thread>

#include "commands.h"
#include "tandem/core/blas.h"
#include "tandem/exec/jit.h"

namespace tandem::cli {

void add_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Show the CPU features, BLAS kernels and settings in use");
  cmd->callback([] {
    fmt::print("hardware threads : {}\n", std::thread::hardware_concurrency());
    fmt::print("AVX2+FMA         : {}\n", blas::cpu_has_avx2_fma() ? "yes" : "no");
    fmt::print("AVX-512          : {}\n", blas::cpu_has_avx512() ? "yes" : "no");
    fmt::print("BLAS library     : {}\n", blas::library_path());
    const std::string user = blas::user_kernels();
    const std::string chooser = !user.empty()                          ? "OPENBLAS_CORETYPE=" + user
                                : blas::preferred_kernels() != nullptr ? "chosen by tandem"
                                                                       : "the library's choice";
    fmt::print("BLAS kernels     : {} ({}){}\n", blas::kernel_name(), chooser,
               blas::using_generic_kernels_on_capable_cpu() ? " (generic: slow on this CPU!)" : "");
    fmt::print("BLAS threads     : {}\n", blas::num_threads());
    fmt::print("JIT cache        : {}\n", exec::jit_cache_dir());
  });
}

}  // namespace tandem::cli
