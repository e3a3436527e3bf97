// What the step benchmarks share (Gloo's benchmark runner, in small): command-line options, SPMD
// ranks as threads or as MPI processes, timing with the slowest rank's time per repetition,
// medians and spread, copy bandwidth measured in the same run, checks of a result against the
// baseline's before anything is timed, and the autotuned schedule compiled and set up.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/comm/communicator.h"
#include "tandem/comm/mpi.h"
#include "tandem/core/tensor.h"
#include "tandem/dsl/ir.h"
#include "tandem/exec/compiled.h"
#include "tandem/tune/tune.h"

namespace tandem::bench {

// ------------------------------------------------------------------------------- options

struct Options {
  bool quick = false;               // --quick: small sizes, few repetitions (checks that it runs)
  int reps = 10;                    // --reps: timed repetitions of each contender
  int warmup = 2;                   // --warmup
  int tune_reps = 3;                // --tune-reps: repetitions per schedule when tuning
  int ranks = 2;                    // --ranks (threads; under mpirun the world's size)
  bool retune = false;              // --retune: measure the schedules again despite the cache
  std::vector<std::string> sizes;   // --sizes 16Mi,64Mi (bench-specific meaning)
  std::vector<std::string> dtypes;  // --dtypes f32,bf16
};

// Parses the common flags; `usage` is printed for --help or a bad flag (then exits).
// `default_reps` replaces --reps's default (10) for benchmarks whose contenders are noisy.
Options parse_options(int argc, char** argv, const std::string& usage, int default_ranks = 2,
                      int default_reps = 10);
// A layer benchmark's B, K_PER_RANK, H: --sizes if given (three extents), else the quick or the
// full defaults. Throws UserError naming --sizes.
std::vector<int64_t> layer_dims(const Options& o, std::vector<int64_t> full,
                                std::vector<int64_t> quick);

// ------------------------------------------------------------------------------- ranks

// Where the benchmark's ranks run. mpi is MPI_COMM_WORLD under mpirun, MPI_COMM_NULL for threads.
struct Ranks {
  comm::Communicator& comm;
  MPI_Comm mpi;
  bool is_mpi() const { return mpi != MPI_COMM_NULL; }
  std::string backend() const { return is_mpi() ? "mpi" : "thread"; }
  bool root() const { return comm.rank() == 0; }
};

// Runs fn on every rank: as MPI processes when started by mpirun (the world must have
// options.ranks processes, or any count when --ranks is not given), else on options.ranks threads.
void run_spmd(const Options& options, const std::function<void(Ranks&)>& fn);

// ------------------------------------------------------------------------------- timing

struct Stats {
  double median = 0, min = 0, max = 0;
  std::vector<double> times;
  double spread() const { return median > 0 ? (max - min) / median : 0; }  // (max - min) / median
};
Stats stats_of(std::vector<double> times);

// Times fn once across the ranks: a barrier, fn on every rank, and the slowest rank's seconds
// (every rank gets it). `before` runs before the barrier, untimed (restoring an input).
double time_once(comm::Communicator& comm, const std::function<void()>& fn,
                 const std::function<void()>& before = {});

// Times the contenders in turn, repetition by repetition (A B A B ...), so that a change of load
// on a shared machine falls on all of them alike; each gets `warmup` untimed runs first.
struct Contender {
  std::string name;
  std::function<void()> run;
  std::function<void()> before;  // untimed, before each run
};
std::vector<Stats> time_interleaved(comm::Communicator& comm,
                                    const std::vector<Contender>& contenders, int warmup, int reps);

// The memory roofs of the access patterns an optimizer step makes, with every rank streaming
// `bytes` at once (memory bandwidth is shared): bytes read plus written per second per rank
// (STREAM's convention), the fastest of `reps` (load only ever slows a stream down): a plain
// copy; a read-only stream (a sum over a buffer: reducing peers' gradients); and a
// read-modify-write stream in the optimizer's pattern (a gradient read, and w, m and v updated in
// place: 4 streams in, 3 out).
struct Roofs {
  double copy = 0, read = 0, rmw = 0;
};
// The three streams over buffers of `bytes` each (allocated and touched once), one pass a call,
// so that a benchmark can also time them interleaved with its contenders.
class RoofStreams {
 public:
  explicit RoofStreams(size_t bytes);
  void read();
  void rmw();
  void copy();
  // Bytes read plus written per second per rank of one pass that took `seconds`.
  double read_rate(double seconds) const;
  double rmw_rate(double seconds) const;
  double copy_rate(double seconds) const;

 private:
  size_t n_, q_;
  std::vector<float> a_, g_, w_, m_, v_;
  std::vector<char> src_, dst_;
  int copies_ = 0;
};
Roofs measure_roofs(comm::Communicator& comm, RoofStreams& streams, int reps);
// The faster of two measurements of each roof.
Roofs fastest_of(const Roofs& a, const Roofs& b);

// The 1-minute load average (/proc/loadavg), to record how busy the machine was.
std::string load_average();
int hardware_threads();

// ------------------------------------------------------------------------------- checks

// Compares `got` with `want` elementwise (any dtypes): |got - want| <= rtol (|want| + max|want|).
// Returns a message naming `label`, the count, the largest difference and the first elements
// that differ, or "" when they agree.
std::string compare(const std::string& label, const Tensor& got, const Tensor& want, double rtol);
// Every rank's verdicts: when any rank has a message, rank 0 prints every rank's and the
// benchmark exits with status 1 before timing anything.
void require_agreement(Ranks& ranks, const std::string& message);

// Fills `t` with a deterministic pattern in [lo, hi) from (seed, index).
void fill_uniform(const Tensor& t, uint64_t seed, float lo, float hi);

// ------------------------------------------------------------------------------- tandem

struct Tuned {
  tune::TuneResult result;                             // every schedule's time, the winner
  std::shared_ptr<const exec::CompiledPlan> compiled;  // the winner, compiled
  double seconds = 0;                                  // how long tuning took here
};

// Tunes `program` on these ranks (reading the cache when it can) and compiles the winner, which
// runs as tuned at the record's chunk size (exec::RunnerOptions::chunk_bytes =
// result.record.chunk_bytes).
Tuned tune_and_compile(Ranks& ranks, const dsl::Program& program, const dsl::SymbolMap& sizes,
                       const Options& options);

// Prints (rank 0) the tuner's table in short: each schedule's median and the winner.
void print_tuning(Ranks& ranks, const Tuned& t);

// A labelled result line: "  name  median ms  [min .. max]  spread %  extra".
void print_row(const std::string& name, const Stats& s, const std::string& extra = "");
// "ratio <name> <value>", the line scripts read.
void print_ratio(const std::string& name, double value);

std::string size_label(int64_t n);  // 16777216 -> "16Mi"

}  // namespace tandem::bench
