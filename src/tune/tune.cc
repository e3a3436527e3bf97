// The autotuner's protocol: search (search.h), check each schedule against the reference, warm
// up, time, take medians, time the leading ones again in turns, pick the fastest, time it at each
// chunk size, and cache the record.
#include "tandem/tune/tune.h"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <exception>
#include <limits>
#include <numeric>
#include <set>
#include <thread>

#include "search.h"
#include "tandem/comm/agree.h"
#include "tandem/comm/thread.h"
#include "tandem/core/blas.h"
#include "tandem/core/env.h"
#include "tandem/core/error.h"
#include "tandem/exec/jit.h"
#include "tandem/schedule/lower.h"
#include "tandem/tune/inputs.h"

namespace tandem::tune {
namespace {

using Clock = std::chrono::steady_clock;

// TANDEM_DEBUG_TUNE=1: rank 0 prints each phase of the tune (reference, set-up, check, timing)
// with the seconds it took, to stderr.
bool debug_tune() {
  static const bool on = env_int("TANDEM_DEBUG_TUNE", 0) != 0;
  return on;
}

// Times a phase for TANDEM_DEBUG_TUNE.
class Phase {
 public:
  Phase(const comm::Communicator& comm, std::string what)
      : on_(debug_tune() && comm.rank() == 0), what_(std::move(what)) {}
  ~Phase() {
    if (on_)
      fmt::print(stderr, "tune: {:<60} {:8.3f} s\n", what_,
                 std::chrono::duration<double>(Clock::now() - t0_).count());
  }
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  bool on_;
  std::string what_;
  Clock::time_point t0_ = Clock::now();
};

// The largest value of `x` over the ranks (every rank gets it).
double max_over_ranks(comm::Communicator& comm, double x) {
  Tensor t = Tensor::empty(DType::F32, Shape{1});
  t.set(0, static_cast<float>(x));
  comm.all_reduce(t, comm::ReduceOp::Max);
  return t.get(0);
}

// Whether every rank says yes.
bool all_ranks(comm::Communicator& comm, bool yes) {
  return max_over_ranks(comm, yes ? 0.0 : 1.0) == 0.0;
}

// The program's symbols bound by `sizes` (and nothing else).
dsl::SymbolMap checked_sizes(const dsl::Program& program, const dsl::SymbolMap& sizes) {
  const std::vector<std::string> symbols = program.symbols();
  for (const auto& [name, v] : sizes) {
    if (std::find(symbols.begin(), symbols.end(), name) == symbols.end())
      user_error(
          "program '{}' has no symbol '{}' (its symbols: {})", program.name(), name,
          symbols.empty() ? std::string("none") : fmt::format("{}", fmt::join(symbols, ", ")));
    if (v < 0)
      user_error("program '{}': symbol '{}' = {}; extents must be >= 0", program.name(), name, v);
  }
  for (const std::string& s : symbols)
    if (!sizes.count(s))
      user_error("program '{}': symbol '{}' is not bound; give its extent (e.g. --size {}=1024)",
                 program.name(), s, s);
  return sizes;
}

TuneKey make_key(const dsl::Program& program, const dsl::SymbolMap& sizes,
                 const comm::Communicator& comm, const std::string& executor,
                 const std::string& search) {
  TuneKey k;
  k.program = program.name();
  k.program_hash = hash_hex(program.str());
  k.sizes = sizes;
  k.ranks = comm.size();
  const std::vector<int> nodes = comm.rank_nodes();
  k.nodes = static_cast<int>(std::set<int>(nodes.begin(), nodes.end()).size());
  k.backend = std::string(comm::backend_name(comm.backend()));
  k.executor = executor;
  // The BLAS threads per rank change what a matmul costs (ranks x threads against the cores):
  // a choice timed with another count is not this one's.
  k.machine = fmt::format("{}, {} BLAS thread(s) per rank", machine_id(), blas::num_threads());
  k.candidates = hash_hex(search);
  return k;
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", tm);
}

void check_options(const TuneOptions& o) {
  if (o.reps < 1) user_error("tune: --reps must be at least 1 (got {})", o.reps);
  if (o.warmup < 0) user_error("tune: the warm-up count must be >= 0 (got {})", o.warmup);
  if (!(o.final_margin >= 0))
    user_error("tune: the final round's margin must be >= 0 (got {})", o.final_margin);
  if (o.final_reps < 0)
    user_error("tune: the final round's repetitions must be >= 0 (got {})", o.final_reps);
  for (int b : o.blocks)
    if (b < 1) user_error("tune: --blocks {}: an overlap needs at least 1 block", b);
  for (size_t c : o.chunk_bytes)
    if (c < 1) user_error("tune: --chunks 0: a chunk is at least 1 byte");
  if (!(o.budget_s >= 0)) user_error("tune: --budget must be >= 0 seconds (got {})", o.budget_s);
}

// Sets a schedule up, its collectives at `chunk_bytes` (0: the process's chunk size), and fills
// its inputs and scalars, or says why it could not be set up.
// Set-up failures (an emitter that cannot compile a step) are the same on every rank, so they are
// caught and reported as the candidate's failure; failures while running are not (a rank that
// stops inside a collective would leave its peers waiting) and end the tune.
std::unique_ptr<exec::Runner> prepare(const schedule::Plan& plan, comm::Communicator& comm,
                                      Executor& executor, const dsl::SymbolMap& sizes,
                                      const exec::ScalarMap& scalars, size_t chunk_bytes,
                                      std::string& error, bool* user_fault = nullptr) {
  std::unique_ptr<exec::Runner> run;
  try {
    Phase ph(comm, fmt::format("{}: set up", plan.name));
    run = executor.prepare(plan, comm, sizes, chunk_bytes);
  } catch (const UserError& e) {
    error = e.what();
    if (user_fault != nullptr) *user_fault = true;
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (!all_ranks(comm, error.empty())) {
    error = error.empty() ? "set-up failed on another rank" : "set-up failed: " + error;
    return nullptr;
  }
  Phase ph(comm, fmt::format("{}: inputs", plan.name));
  const exec::Placement place = exec::placement(plan.program, comm);
  const std::vector<Shape> global = plan.program.resolve_shapes(sizes);
  for (int id : plan.program.inputs()) {
    const dsl::Stage& st = plan.program.stage(id);
    if (place.holds(st))
      fill_input(run->input(st.name), plan.program, id, global[static_cast<size_t>(id)], place);
  }
  for (const auto& [name, v] : scalars) run->set_scalar(name, v);
  return run;
}

// Checks one candidate against the reference at the check sizes, then times it at the tuned
// sizes, on this rank (every rank calls it together).
CandidateTiming measure(const schedule::NamedSchedule& cand, comm::Communicator& comm,
                        Executor& executor, const TuneOptions& o, const dsl::SymbolMap& check_sizes,
                        const exec::ScalarMap& scalars, const Expected& want) {
  CandidateTiming t;
  t.name = cand.name;
  const schedule::Plan plan = cand.schedule.lower();
  std::unique_ptr<exec::Runner> run =
      prepare(plan, comm, executor, check_sizes, scalars, 0, t.error, &t.user_error);
  if (run == nullptr) {
    t.ok = false;
    return t;
  }
  Check check;
  {
    Phase ph(comm, cand.name + ": check");
    run->run();
    check =
        compare_results(plan.program, exec::placement(plan.program, comm), want, run->results());
  }
  t.max_error = max_over_ranks(comm, check.max_error);
  if (!all_ranks(comm, check.ok)) {
    t.ok = false;
    t.error = check.ok ? "results differ from the reference on another rank"
                       : fmt::format("rank {}: {}", comm.rank(), check.message);
    return t;
  }
  if (check_sizes != o.sizes) {
    run.reset();  // its memory, before the full-size set-up asks for more
    run = prepare(plan, comm, executor, o.sizes, scalars, 0, t.error, &t.user_error);
    if (run == nullptr) {
      t.ok = false;
      return t;
    }
  }
  Phase ph(comm, cand.name + ": warm-up and timed runs");
  for (int i = 0; i < o.warmup; ++i) run->run();
  for (int i = 0; i < o.reps; ++i) {
    comm.barrier();
    const auto t0 = Clock::now();
    run->run();
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    t.times.push_back(max_over_ranks(comm, dt));
  }
  return t;
}

// The final round: sets the finalists up together at the tuned sizes (they were checked in the
// first pass) and times them in turns, A, B, C, A, B, C, ..., `reps` times each, after `warmup`
// untimed turns, so that a drift in the machine's load reaches every finalist alike. Each time is
// the slowest rank's, as in the first pass, so every rank records the same times. A finalist that
// cannot be set up again (out of memory, say: the same verdict on every rank) sits the round out.
void final_round(const std::vector<schedule::NamedSchedule>& schedules,
                 const std::vector<size_t>& chosen, std::vector<CandidateTiming>& timings,
                 comm::Communicator& comm, Executor& executor, const TuneOptions& o,
                 const exec::ScalarMap& scalars, int reps) {
  std::vector<schedule::Plan> plans;
  plans.reserve(chosen.size());  // every run keeps a reference to its plan
  std::vector<std::unique_ptr<exec::Runner>> runs;
  std::vector<size_t> index;
  for (size_t i : chosen) {
    plans.push_back(schedules[i].schedule.lower());
    std::string error;
    std::unique_ptr<exec::Runner> run =
        prepare(plans.back(), comm, executor, o.sizes, scalars, 0, error);
    if (run == nullptr) {
      plans.pop_back();
      continue;
    }
    runs.push_back(std::move(run));
    index.push_back(i);
  }
  if (runs.size() < 2) return;
  Phase ph(comm, fmt::format("final round: {} schedules in turns", runs.size()));
  for (int i = 0; i < o.warmup; ++i)
    for (auto& run : runs) run->run();
  for (int i = 0; i < reps; ++i)
    for (size_t k = 0; k < runs.size(); ++k) {
      comm.barrier();
      const auto t0 = Clock::now();
      runs[k]->run();
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      timings[index[k]].final_times.push_back(max_over_ranks(comm, dt));
    }
}

// The chunk round: the winner set up at the tuned sizes once per chunk size, each runner's
// collectives at its size (exec::RunnerOptions::chunk_bytes: the process's chunk size is left
// alone, and the size timed is the one a user of the record runs at), the runners timed in turns
// (64 KiB, 256 KiB, 1 MiB, ...: a drift in the machine's load reaches every size alike) after
// `warmup` untimed turns. A size whose runner cannot be set up (out of memory, say: the same
// verdict on every rank) sits the round out. Chunking does not change results (every element is
// reduced and computed the same in any chunk), so the winner's check stands.
void chunk_round(const schedule::NamedSchedule& winner, TuneRecord& record,
                 comm::Communicator& comm, Executor& executor, const TuneOptions& o,
                 const exec::ScalarMap& scalars, int reps) {
  const schedule::Plan plan = winner.schedule.lower();
  std::vector<std::unique_ptr<exec::Runner>> runs;
  for (size_t c : o.chunk_bytes) {
    std::string error;
    std::unique_ptr<exec::Runner> run = prepare(plan, comm, executor, o.sizes, scalars, c, error);
    if (run == nullptr) continue;
    record.chunks.push_back({c, {}});
    runs.push_back(std::move(run));
  }
  Phase ph(comm, fmt::format("chunk round: {} sizes in turns", runs.size()));
  for (int i = -o.warmup; i < reps; ++i)
    for (size_t k = 0; k < runs.size(); ++k) {
      comm.barrier();
      const auto t0 = Clock::now();
      runs[k]->run();
      const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
      const double slowest = max_over_ranks(comm, dt);
      if (i >= 0) record.chunks[k].times.push_back(slowest);
    }
  double best = std::numeric_limits<double>::infinity();
  for (const ChunkTiming& c : record.chunks)
    if (c.median() < best) {
      best = c.median();
      record.chunk_bytes = c.bytes;
    }
}

// The row-block modulus the check sizes keep: every block count the search may try.
int64_t blocks_modulus(const TuneOptions& o) {
  int64_t m = std::max(o.enumerate.blocks, 1);
  for (int b : o.blocks) m = std::lcm(m, static_cast<int64_t>(std::max(b, 1)));
  return std::min<int64_t>(m, 1024);
}

}  // namespace

std::vector<size_t> finalists(const std::vector<CandidateTiming>& candidates, double margin,
                              int max) {
  double best = std::numeric_limits<double>::infinity();
  for (const CandidateTiming& c : candidates)
    if (c.ok) best = std::min(best, c.median());
  std::vector<size_t> out;
  if (!std::isfinite(best)) return out;
  for (size_t i = 0; i < candidates.size(); ++i)
    if (candidates[i].ok && candidates[i].median() <= best * (1 + margin)) out.push_back(i);
  // The fastest first; equal medians in enumeration order.
  std::stable_sort(out.begin(), out.end(), [&](size_t a, size_t b) {
    return candidates[a].median() < candidates[b].median();
  });
  if (out.size() > static_cast<size_t>(std::max(max, 0)))
    out.resize(static_cast<size_t>(std::max(max, 0)));
  if (out.size() < 2) return {};
  std::sort(out.begin(), out.end());
  return out;
}

std::string choose_winner(const std::vector<CandidateTiming>& candidates) {
  const bool final_round =
      std::any_of(candidates.begin(), candidates.end(),
                  [](const CandidateTiming& c) { return c.ok && c.retimed(); });
  std::string winner;
  double best = std::numeric_limits<double>::infinity();
  for (const CandidateTiming& c : candidates) {
    if (!c.ok || (final_round && !c.retimed())) continue;
    const double t = final_round ? c.final_median() : c.median();
    if (t < best) {
      best = t;
      winner = c.name;
    }
  }
  return winner;
}

const CandidateTiming& TuneResult::winner() const {
  for (const CandidateTiming& c : record.candidates)
    if (c.name == record.winner) return c;
  internal_error(fmt::format("tuning record without its winner '{}'", record.winner));
}

const CandidateTiming& TuneResult::baseline() const {
  TANDEM_CHECK(!record.candidates.empty(), "tuning record without candidates");
  return record.candidates.front();
}

double TuneResult::speedup(const CandidateTiming& c) const {
  return baseline().median() / c.median();
}

TuneKey tune_key(const dsl::Program& program, const comm::Communicator& comm,
                 const TuneOptions& o) {
  const dsl::SymbolMap sizes = checked_sizes(program, o.sizes);
  const std::string executor =
      o.executor ? o.executor->name()
                 : std::string(exec::runner_kind_name(exec::RunnerKind::Compiled));
  return make_key(program, sizes, comm, executor, detail::search_description(program, o));
}

TuneResult tune(const dsl::Program& program, comm::Communicator& comm, const TuneOptions& options) {
  check_options(options);
  TuneOptions o = options;
  o.sizes = checked_sizes(program, options.sizes);
  std::shared_ptr<Executor> executor =
      o.executor ? o.executor : std::shared_ptr<Executor>(executor_of(exec::RunnerKind::Compiled));
  const std::string cache_dir = o.cache_dir.empty() ? exec::jit_cache_dir() : o.cache_dir;
  const int64_t compiles_before = exec::jit_stats().compiles;

  const TuneKey key =
      make_key(program, o.sizes, comm, executor->name(), detail::search_description(program, o));

  TuneResult result;
  // Rank 0 looks the key up and tells the others, so that all take the same path.
  std::string cached;
  if (o.read_cache && comm.rank() == 0) {
    std::string stale;
    if (auto r = load_record(key, cache_dir, &stale)) cached = record_to_json(*r, -1);
    if (!stale.empty()) fmt::print(stderr, "tune: {}; tuning again\n", stale);
  }
  cached = comm::broadcast_string(comm, cached);
  if (!cached.empty()) {
    result.record = record_from_json(cached);
    result.from_cache = true;
    result.cache_file = record_path(key, cache_dir);
    result.compiles = exec::jit_stats().compiles - compiles_before;
    return result;
  }

  const exec::Placement place = exec::placement(program, comm);
  const exec::ScalarMap scalars = standard_scalars(program, place.group_size, o.scalars);
  TuneRecord record;
  std::vector<schedule::NamedSchedule> timed;  // the schedules of record.candidates, in order
  record.key = key;
  record.space = schedule::recipe_space_size(program);
  record.budget_s = o.budget_s;
  record.warmup = o.warmup;
  record.reps = o.reps;
  record.created = now_utc();
  record.check_sizes = shrink_sizes(program, o.sizes, o.check_elements,
                                    static_cast<int64_t>(place.group_size) * blocks_modulus(o));
  {
    // The reference's results are computed once and every candidate is compared with them.
    const Expected want = [&] {
      Phase ph(comm,
               fmt::format("reference interpreter at {}",
                           record.check_sizes == o.sizes ? "the tuned sizes" : "the check sizes"));
      return reference_results(program, comm, record.check_sizes, scalars);
    }();
    // The search decides what to time; every rank follows it alike (the times and the budget's
    // verdict are the slowest rank's).
    const auto start = Clock::now();
    auto time = [&](schedule::NamedSchedule ns) {
      for (const CandidateTiming& c : record.candidates)
        if (c.name == ns.name) return;
      if (!timed.empty() && o.budget_s > 0 &&
          max_over_ranks(comm, std::chrono::duration<double>(Clock::now() - start).count()) >
              o.budget_s) {
        ++record.left_untimed;
        return;
      }
      record.candidates.push_back(
          measure(ns, comm, *executor, o, record.check_sizes, scalars, want));
      timed.push_back(std::move(ns));
      if (comm.rank() == 0 && o.on_candidate) o.on_candidate(record.candidates.back());
    };
    auto leader = [&]() -> const schedule::NamedSchedule& {
      size_t best = 0;
      for (size_t i = 1; i < record.candidates.size(); ++i)
        if (record.candidates[i].ok &&
            record.candidates[i].median() < record.candidates[best].median())
          best = i;
      return timed[best];
    };
    detail::search(program, o, time, leader);
  }
  // The leading schedules again, in turns. The first-pass times are the slowest rank's, the same on
  // every rank, so every rank chooses the same finalists, and then the same winner.
  record.final_margin = o.final_margin;
  record.final_max = o.final_max;
  const std::vector<size_t> chosen = finalists(record.candidates, o.final_margin, o.final_max);
  if (!chosen.empty()) {
    const int reps = o.final_reps > 0 ? o.final_reps : 2 * o.reps;
    final_round(timed, chosen, record.candidates, comm, *executor, o, scalars, reps);
    const bool ran = std::any_of(record.candidates.begin(), record.candidates.end(),
                                 [](const CandidateTiming& c) { return c.retimed(); });
    if (ran) record.final_reps = reps;
  }
  record.winner = choose_winner(record.candidates);
  if (record.winner.empty()) {
    // UserErrors behind every failure (a cache folder that cannot be written, each schedule's
    // in a shard folder of its own; a compiler that does not run) are the user's to fix, not a
    // fault of the schedules: the first is said, as train says it.
    const auto& all = record.candidates;
    if (!all.empty() && std::all_of(all.begin(), all.end(),
                                    [&](const CandidateTiming& c) { return c.user_error; })) {
      const bool same = std::all_of(all.begin(), all.end(), [&](const CandidateTiming& c) {
        return c.error == all.front().error;
      });
      user_error("tune: program '{}': {}{}", program.name(), all.front().error,
                 same || all.size() == 1 ? std::string()
                                         : fmt::format(" (schedule {}; the other {} failed alike)",
                                                       all.front().name, all.size() - 1));
    }
    std::string why;
    for (const CandidateTiming& c : record.candidates)
      why += fmt::format("\n  {}: {}", c.name, c.error);
    internal_error(fmt::format(
        "no schedule of program '{}' passed its check against the reference ({} executor):{}",
        program.name(), executor->name(), why));
  }
  // The winner at each chunk size, when it has a collective to chunk (an AllGather alone too:
  // gather_weights).
  const bool collectives = std::any_of(
      program.stages().begin(), program.stages().end(),
      [](const dsl::Stage& s) { return dsl::op_kind(s.op) == dsl::OpKind::Collective; });
  if (!o.chunk_bytes.empty() && collectives) {
    for (size_t i = 0; i < timed.size(); ++i)
      if (timed[i].name == record.winner)
        chunk_round(timed[i], record, comm, *executor, o, scalars,
                    o.final_reps > 0 ? o.final_reps : 2 * o.reps);
  }
  // Every rank returns rank 0's record (the times agree already; error texts are rank 0's).
  std::string text = comm.rank() == 0 ? record_to_json(record, -1) : std::string();
  if (comm.rank() == 0 && o.write_cache) result.cache_file = store_record(record, cache_dir);
  text = comm::broadcast_string(comm, text);
  result.record = record_from_json(text);
  result.compiles = exec::jit_stats().compiles - compiles_before;
  if (o.write_cache) result.cache_file = record_path(key, cache_dir);
  return result;
}

int thread_rank_blas_threads(int ranks) {
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, hw / std::max(1, ranks));
}

TuneResult tune_threads(const dsl::Program& program, int ranks, const TuneOptions& options) {
  // What can be checked before the ranks start is checked here, so that a user's mistake reads
  // as itself rather than as the failure of rank 0.
  if (ranks < 1) user_error("tune: the rank count must be at least 1 (got {})", ranks);
  if (ranks % program.groups() != 0)
    user_error(
        "program '{}' has {} groups, but {} ranks were asked for; the ranks split into {} equal "
        "groups of "
        "consecutive ranks, so tune it on a multiple of {} ranks",
        program.name(), program.groups(), ranks, program.groups(), program.groups());
  check_options(options);
  checked_sizes(program, options.sizes);
  detail::search_description(program, options);  // a bad `only` name, said before the ranks start
  TuneResult out;
  comm::run_ranks(ranks, [&](comm::Communicator& comm) {
    TuneResult r = tune(program, comm, options);
    if (comm.rank() == 0) out = std::move(r);
  });
  return out;
}

int64_t parse_extent(std::string_view text, std::string_view what) {
  size_t i = 0;
  int64_t v = 0;
  while (i < text.size() && text[i] >= '0' && text[i] <= '9') {
    if (v > (std::numeric_limits<int64_t>::max() - 9) / 10)
      user_error("{}: '{}' is too large", what, text);
    v = v * 10 + (text[i] - '0');
    ++i;
  }
  const std::string_view suffix = text.substr(i);
  int64_t mult = 0;
  if (suffix.empty())
    mult = 1;
  else if (suffix == "K" || suffix == "k")
    mult = 1000;
  else if (suffix == "M")
    mult = 1000 * 1000;
  else if (suffix == "G")
    mult = 1000 * 1000 * 1000;
  else if (suffix == "Ki")
    mult = int64_t{1} << 10;
  else if (suffix == "Mi")
    mult = int64_t{1} << 20;
  else if (suffix == "Gi")
    mult = int64_t{1} << 30;
  if (i == 0 || mult == 0)
    user_error(
        "{}: '{}' is not an extent; write digits with an optional suffix K, M, G (powers of 1000) "
        "or Ki, Mi, "
        "Gi (powers of 1024), e.g. 64Mi",
        what, text);
  if (v > std::numeric_limits<int64_t>::max() / mult)
    user_error("{}: '{}' is too large", what, text);
  return v * mult;
}

dsl::SymbolMap parse_sizes(const dsl::Program& program, const std::vector<std::string>& words,
                           const dsl::SymbolMap& defaults) {
  const std::vector<std::string> symbols = program.symbols();
  const std::string listed =
      symbols.empty() ? std::string("none") : fmt::format("{}", fmt::join(symbols, ", "));
  dsl::SymbolMap out;
  std::vector<std::string> bare;
  for (const std::string& w : words) {
    const size_t eq = w.find('=');
    if (eq == std::string::npos) {
      bare.push_back(w);
      continue;
    }
    const std::string name = w.substr(0, eq);
    if (std::find(symbols.begin(), symbols.end(), name) == symbols.end())
      user_error("--size {}: workload '{}' has no symbol '{}' (its symbols: {})", w, program.name(),
                 name, listed);
    if (out.count(name)) user_error("--size: symbol '{}' is given twice", name);
    out[name] = parse_extent(w.substr(eq + 1), fmt::format("--size {}", w));
  }
  const size_t unnamed = symbols.size() - out.size();
  if (bare.size() > unnamed)
    user_error(
        "--size: {} bare extent(s) given, but workload '{}' has {} symbol(s) left to bind (its "
        "symbols: {})",
        bare.size(), program.name(), unnamed, listed);
  size_t next = 0;
  for (const std::string& s : symbols)
    if (!out.count(s) && next < bare.size())
      out[s] = parse_extent(bare[next++], fmt::format("--size for {}", s));
  for (const auto& [s, v] : out)
    if (v < 1) user_error("--size {}={}: an extent is at least 1", s, v);
  for (const auto& [s, v] : defaults)
    if (!out.count(s) && std::find(symbols.begin(), symbols.end(), s) != symbols.end()) out[s] = v;
  for (const std::string& s : symbols)
    if (!out.count(s))
      user_error("--size: workload '{}' needs an extent for symbol '{}' (e.g. --size {}=1024)",
                 program.name(), s, s);
  return out;
}

}  // namespace tandem::tune
