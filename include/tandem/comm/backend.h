// The two backends a run's ranks can talk through, as a run's configuration names them.
#pragma once

#include <string_view>

namespace tandem::comm {

// Thread: the ranks are threads of this process (run_ranks). Mpi: this process is one rank of
// MPI_COMM_WORLD (mpi_world).
enum class Backend { Thread, Mpi };

// "thread", "mpi": the names the command line takes and messages and records use.
constexpr std::string_view backend_name(Backend b) { return b == Backend::Mpi ? "mpi" : "thread"; }

}  // namespace tandem::comm
