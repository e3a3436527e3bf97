// The subcommands of the tandem command: each file in src/cli/ adds one to the CLI11 app.
#pragma once

#include <CLI/CLI.hpp>

namespace tandem::cli {

// `tandem info`: what this machine and build will use (CPU features, BLAS kernels, JIT cache).
void add_info(CLI::App& app);

}  // namespace tandem::cli
