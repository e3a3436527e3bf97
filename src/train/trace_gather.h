// Gathering the Chrome-trace events of every MPI process of a run into rank 0's recorder, so that
// one file shows them all. Internal to train/.
#pragma once

#include "tandem/comm/communicator.h"
#include "tandem/io/trace.h"

namespace tandem::train::detail {

// Every rank sends its trace JSON and its clock origin; rank 0 re-records the complete events
// shifted onto its own origin (one monotonic clock on one machine; across machines the shift is
// only as good as their clocks). Every rank of `world` calls it together.
void gather_trace(comm::Communicator& world, io::TraceRecorder& trace);

}  // namespace tandem::train::detail
