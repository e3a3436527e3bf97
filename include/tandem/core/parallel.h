// Fork-join over a few threads for the work BLAS does not parallelise itself (per-head attention,
// whose GEMMs are too small for OpenBLAS to split; elementwise passes).
//
// Each calling thread owns its team (so in-process ranks never share one), created on first use.
// Idle helpers block on a condition variable and never spin: a spinning helper would take a core
// from OpenBLAS's own threads, which run between our parallel regions (PyTorch on 2 cores loses
// half its speed to exactly that under OpenMP's default wait policy).
//
// The width follows BLAS: blas::num_threads(), which the trainer sets to the cores per in-process
// rank. Work is split into fixed parts by the caller, and every part writes its own memory, so
// results are bitwise the same at any width.
#pragma once

#include <cstdint>
#include <functional>

namespace tandem {

// How many threads parallel_for uses from this thread: blas::num_threads(), at least 1.
int parallel_width();

// Whether this thread is running a part of a parallel region (its own or as a helper): work
// started here runs serially, and so do the GEMMs it calls (core/gemm.h).
bool in_parallel_region();

// Runs body(begin, end) over [0, n) in contiguous ranges of at least `grain` items, on the calling
// thread and up to parallel_width() - 1 helpers; returns when every range is done. An exception
// thrown by a range is rethrown here (the first one) after all ranges finished. Not reentrant: a
// body must not call parallel_for (it would run serially, which is correct but slower).
void parallel_for(int64_t n, int64_t grain,
                  const std::function<void(int64_t begin, int64_t end)>& body);

// Runs body(part) for part in [0, parts) at once, part 0 on the calling thread (parts is capped
// by nothing: the caller sizes it, usually min(parallel_width(), work items)). For work that
// needs per-part scratch, indexed by part.
void parallel_parts(int parts, const std::function<void(int part)>& body);

}  // namespace tandem
