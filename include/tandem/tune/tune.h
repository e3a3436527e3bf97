// The autotuner: searches the legal schedules of a program on the real backend and keeps the
// fastest. The search (tune/search.cc) tunes the collectives one at a time: it times every
// schedule in which the first collective's choice (and the program-wide ones: loop fusion,
// slicing) varies, the others unscheduled, keeps the fastest, then varies the second collective
// with the first fixed at its best, and so on; then it tries other block counts for each overlap
// of the leader. Why one at a time rather than pruning with a cost estimate: the choices this
// space offers (fusing into a collective's hook, overlapping a matmul with its reduction) win or
// lose by effects a simple cost model does not see (cache reuse inside the hook, two threads
// sharing the cores), which is why they are measured at all; and a collective's best choice
// depends mostly on its own consumers, so fixing the others costs little. It times 1 + sum over
// collectives of the choices of one collective, instead of their product: for one collective
// (the four workloads) it is the whole space, as before. After the final round (below) it times
// the winner at each chunk size of the collectives and keeps the fastest, which those who run the
// tuned program apply (exec::RunnerOptions::chunk_bytes). A time budget bounds the search: once it
// is spent no further candidate starts (the record says how many were left).
//
// For each schedule it sets the schedule up (compiling it), checks one run against the reference
// interpreter on the same inputs, then warms up and times several repetitions (each the slowest
// rank's time) and takes the median. On a noisy machine the
// leading schedules are often within one timing's spread of each other, so a final round follows:
// the finalists (every checked schedule whose median is within final_margin of the best, at most
// final_max of them) are set up together and timed again in turns (A, B, C, A, B, C, ...: a slow
// drift in the machine's load hits all of them alike), final_reps times each, and the winner is
// the finalist with the smallest median of those interleaved times. So the choice is never
// measurably slower than the best schedule it timed. The choice and every time are cached on disk
// (tune/cache.h); a second tune of the same key reads the record and neither times nor compiles
// anything.
//
// Every rank calls tune() together (SPMD), on the thread backend or on MPI; rank 0 reads and
// writes the cache and the ranks agree on everything through the communicator: every time is the
// maximum over the ranks (all-reduced), so every rank picks the same finalists and winner.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/dsl/ir.h"
#include "tandem/exec/reference.h"
#include "tandem/schedule/enumerate.h"
#include "tandem/tune/cache.h"
#include "tandem/tune/executor.h"

namespace tandem::tune {

struct TuneOptions {
  dsl::SymbolMap sizes;     // every symbol's extent (missing ones are a UserError naming them)
  exec::ScalarMap scalars;  // overrides of standard_scalars()
  int warmup = 1;           // untimed runs before the repetitions
  int reps = 5;             // timed repetitions per schedule (>= 1)
  // The final round (see above): finalists are within final_margin (0.15: 15%) of the best
  // first-pass median, at most final_max of them (< 2: no final round); each is timed
  // final_reps times in turns (0: 2 x reps), after `warmup` untimed turns.
  double final_margin = 0.15;
  int final_max = 4;
  int final_reps = 0;
  // The check against the reference interpreter (which is slow: it is the oracle) runs where no
  // value holds more than this many elements: at the tuned sizes when they fit, else at sizes
  // scaled down by shrink_sizes (the compiled code is the same: sizes are run-time values).
  // 0: always at the tuned sizes.
  int64_t check_elements = int64_t{1} << 20;
  bool read_cache = true;  // false: tune again even when a record exists
  bool write_cache = true;
  std::string cache_dir;               // empty: exec::jit_cache_dir()
  std::shared_ptr<Executor> executor;  // null: executor_of(exec::RunnerKind::Compiled)
  schedule::EnumerateOptions enumerate;
  // Time only these schedules, by name (schedule::Recipe), and the baseline (the unscheduled
  // program, which every speed-up is measured against); empty: search (above). A name that does
  // not parse or that the program does not allow is a UserError saying why.
  std::vector<std::string> only;
  // Block counts tried for each overlap of the leader (besides enumerate.blocks); empty: none.
  std::vector<int> blocks = {2, 8, 16};
  // Chunk sizes (bytes) the winner is timed at, each by runners set up at that size
  // (exec::RunnerOptions::chunk_bytes; the process's comm::chunk_bytes() is left alone); the
  // fastest is the record's chunk_bytes. Empty: no chunk round (the record's chunk_bytes is 0).
  std::vector<size_t> chunk_bytes = {size_t{64} << 10, size_t{256} << 10, size_t{1} << 20,
                                     size_t{4} << 20};
  // Seconds after which no further candidate starts (the baseline always runs); 0: no limit.
  double budget_s = 600;
  // Called on rank 0 as each schedule is measured (for progress output); not on a cache hit.
  std::function<void(const CandidateTiming&)> on_candidate;
};

struct TuneResult {
  TuneRecord record;        // the same on every rank
  bool from_cache = false;  // read from the cache: nothing was timed or compiled
  std::string cache_file;   // the record's path ("" when neither read nor written)
  int64_t compiles = 0;     // JIT compilations in this process during the tune (rank 0's view)

  const CandidateTiming& winner() const;
  // The unscheduled program (the first candidate: AR-C when the program has an AllReduce).
  const CandidateTiming& baseline() const;
  // baseline().median() / c.median(): above 1 is faster than the baseline.
  double speedup(const CandidateTiming& c) const;
};

TuneResult tune(const dsl::Program& program, comm::Communicator& comm, const TuneOptions& options);

// The candidates the final round times again, as indices into `candidates` in enumeration order:
// the ok ones whose median is within `margin` of the smallest median (median <= best x (1 +
// margin)), the fastest `max` of them; none when fewer than two qualify.
std::vector<size_t> finalists(const std::vector<CandidateTiming>& candidates, double margin,
                              int max);

// The winner's name: the retimed candidate with the smallest final median when any was retimed,
// else the ok candidate with the smallest median ("" when none is ok). Ties go to the earlier one.
std::string choose_winner(const std::vector<CandidateTiming>& candidates);

// The BLAS threads each of `ranks` in-process ranks gets when tuning: its share of this machine's
// cores (at least 1), as the trainer and the benchmarks give it, so that matmuls are timed as they
// will run; part of the cache key, so `tandem tune` and Python's tandem.tune both use it.
int thread_rank_blas_threads(int ranks);

// tune() on `ranks` in-process ranks (the thread backend); returns rank 0's result.
TuneResult tune_threads(const dsl::Program& program, int ranks, const TuneOptions& options);

// The key tune() would use for `program` on the ranks of `comm` (their count, nodes and backend).
TuneKey tune_key(const dsl::Program& program, const comm::Communicator& comm,
                 const TuneOptions& options);

// Parses an extent: digits with an optional suffix K, M, G (powers of 1000) or Ki, Mi, Gi
// (powers of 1024): "64Mi" is 67108864. Anything else is a UserError quoting `what`.
int64_t parse_extent(std::string_view text, std::string_view what);

// Binds `program`'s symbols from command-line words: "NAME=EXTENT" binds NAME; bare extents bind
// the symbols not named, in Program::symbols() order. Symbols left unbound take `defaults`.
// Unknown names, repeats, too many extents or an unbound symbol are UserErrors naming them.
dsl::SymbolMap parse_sizes(const dsl::Program& program, const std::vector<std::string>& words,
                           const dsl::SymbolMap& defaults = {});

}  // namespace tandem::tune
