// The autotuner's on-disk memory: one JSON file per tuning key (program text, sizes, ranks,
// backend, executor, machine, candidate list) under <JIT cache folder>/tune/, holding every
// candidate's times and the winner, so that a second tune of the same key times and compiles
// nothing and `tandem tune` can still print the whole table. Records are format "tandem-tune-2":
// "tandem-tune-1" records (from before the interleaved final round) still read, but load_record
// treats them as stale, so their key is tuned again.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tandem/dsl/ir.h"

namespace tandem::tune {

// What decides which schedule is fastest. Two tunes with equal keys share one cache file.
struct TuneKey {
  std::string program;       // the program's name, for people reading the file
  std::string program_hash;  // 16 hex digits of the program's text (Program::str)
  dsl::SymbolMap sizes;      // every symbol's extent
  int ranks = 1;
  // The nodes the ranks span (Communicator::rank_nodes): one node's ranks talk through shared
  // memory, ranks of two nodes over the network, and a choice timed on one is not the other's.
  // The network's speed is not in the key: after changing it, tune again (--retune).
  int nodes = 1;
  std::string backend;   // "thread" or "mpi"
  std::string executor;  // "compiled", "plan", "reference"
  std::string machine;   // machine_id()
  // 16 hex digits of the search: the first round's schedule names, the enumeration options, the
  // block counts and chunk sizes tried, the time budget and the names of `only`.
  std::string candidates;
  bool operator==(const TuneKey&) const = default;

  std::string str() const;     // one line, for messages
  std::string digest() const;  // 32 hex digits of everything above: the cache file's name
};

// This machine, as far as timings depend on it: the CPU model, the instruction-set extensions
// that change generated code (SSE4.2 .. AVX-512, AMX) and the hardware thread count.
std::string machine_id();

// This build of tandem, as far as measured times depend on it: the running program's size and
// modification time, so that a rebuilt or upgraded tandem measures again instead of reusing the
// times of kernels it no longer runs ("unknown build" where the program cannot be read).
std::string build_id();

// 16 hex digits of a 64-bit FNV-1a hash.
std::string hash_hex(const std::string& text);

// One candidate schedule as the tuner measured it.
struct CandidateTiming {
  std::string name;
  bool ok = true;             // it ran and matched the reference
  std::string error;          // why not, when !ok
  double max_error = 0;       // the largest relative difference from the reference (see Check)
  std::vector<double> times;  // first pass: seconds per repetition, each the slowest rank's
  // The final round: the same, timed in turns with the other finalists (empty: not a finalist).
  std::vector<double> final_times;
  bool user_error = false;  // its set-up failed with a UserError (not recorded)
  double median() const;    // of `times`; infinity when there are no times
  double min() const;
  double max() const;
  bool retimed() const { return !final_times.empty(); }
  double final_median() const;  // of `final_times`; infinity when there are none
};

// The winner timed at one chunk size of the collectives, in turns with the other sizes.
struct ChunkTiming {
  size_t bytes = 0;
  std::vector<double> times;  // seconds, each the slowest rank's
  double median() const;
};

struct TuneRecord {
  TuneKey key;
  std::vector<CandidateTiming> candidates;  // in enumeration order; the first is the baseline
  // The finalist with the smallest final median; without a final round (fewer than two
  // finalists), the ok candidate with the smallest median.
  std::string winner;
  int warmup = 0, reps = 0;
  // The final round: candidates within final_margin of the best median (at most final_max) were
  // timed again in turns, final_reps times each (0: there was no final round).
  double final_margin = 0;
  int final_max = 0, final_reps = 0;
  dsl::SymbolMap check_sizes;  // where each schedule was checked against the reference
  // The search: the recipes in the space (schedule::recipe_space_size), the time budget, and the
  // candidates it left untimed when the budget ran out (0: it finished).
  int64_t space = 0;
  double budget_s = 0;
  int64_t left_untimed = 0;
  // The chunk sizes the winner was timed at (empty: none tried) and the fastest (0: none; also
  // what a record written before chunk rounds reads as), which the winner is to run at
  // (exec::RunnerOptions::chunk_bytes; 0: the process's comm::chunk_bytes()).
  std::vector<ChunkTiming> chunks;
  size_t chunk_bytes = 0;
  std::string created;  // UTC, ISO 8601
};

std::string record_to_json(const TuneRecord& record, int indent = 2);
// A malformed document is a UserError naming `source` (e.g. "tuning record 'PATH'") and what
// is wrong.
TuneRecord record_from_json(const std::string& text, const std::string& source = "tuning record");

// <cache_dir>/tune/<digest>.json
std::string record_path(const TuneKey& key, const std::string& cache_dir);
inline constexpr const char* kRecordFormat = "tandem-tune-2";

// The record for `key`, or nullopt when there is none, or the file is unreadable, malformed, holds
// another key or is of an older format (it is then retuned and overwritten). For an older format,
// `stale` (when given) is set to a sentence saying so, for the user. The cache follows
// core/private_cache.h: a folder or file another user owns or can write is a UserError naming it.
std::optional<TuneRecord> load_record(const TuneKey& key, const std::string& cache_dir,
                                      std::string* stale = nullptr);
// The newest record (by its creation time) of `program` (the same text) in the cache, whatever
// its sizes, ranks, backend or machine; nullopt when there is none. Unreadable or older records
// are passed over.
std::optional<TuneRecord> latest_record(const dsl::Program& program, const std::string& cache_dir);
// Writes the record (0600, in a 0700 folder) under a temporary name and renames it into place;
// returns the path.
std::string store_record(const TuneRecord& record, const std::string& cache_dir);

}  // namespace tandem::tune
