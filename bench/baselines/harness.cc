// The step benchmarks' shared harness (see harness.h).
#include "harness.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <thread>

#include "tandem/comm/thread.h"
#include "tandem/core/blas.h"
#include "tandem/core/error.h"
#include "tandem/schedule/lower.h"
#include "tandem/schedule/recipe.h"

namespace tandem::bench {

using Clock = std::chrono::steady_clock;

namespace {

volatile float g_roof_sink = 0;  // keeps RoofStreams::read's sum observable

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    const size_t comma = s.find(',', at);
    const std::string part =
        s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    if (!part.empty()) out.push_back(part);
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return out;
}

double max_over_ranks(comm::Communicator& comm, double x) {
  Tensor t = Tensor::empty(DType::F32, Shape{1});
  t.set(0, static_cast<float>(x));
  comm.all_reduce(t, comm::ReduceOp::Max);
  return t.get(0);
}

bool ranks_given = false;

}  // namespace

Options parse_options(int argc, char** argv, const std::string& usage, int default_ranks,
                      int default_reps) {
  Options o;
  o.ranks = default_ranks;
  o.reps = default_reps;
  auto fail = [&](const std::string& why) {
    fmt::print(stderr, "{}: {}\n\n{}", argv[0], why, usage);
    std::exit(2);
  };
  auto value = [&](int& i) -> std::string {
    if (i + 1 >= argc) fail(fmt::format("{} needs a value", argv[i]));
    return argv[++i];
  };
  auto integer = [&](int& i, int lo) {
    const std::string flag = argv[i], v = value(i);
    char* end = nullptr;
    const long x = std::strtol(v.c_str(), &end, 10);
    if (end == v.c_str() || *end != '\0' || x < lo)
      fail(fmt::format("{} needs an integer >= {}, not '{}'", flag, lo, v));
    return static_cast<int>(x);
  };
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      fmt::print("{}", usage);
      std::exit(0);
    } else if (a == "--quick") {
      o.quick = true;
    } else if (a == "--reps") {
      o.reps = integer(i, 1);
    } else if (a == "--warmup") {
      o.warmup = integer(i, 0);
    } else if (a == "--tune-reps") {
      o.tune_reps = integer(i, 1);
    } else if (a == "--ranks") {
      o.ranks = integer(i, 1);
      ranks_given = true;
    } else if (a == "--retune") {
      o.retune = true;
    } else if (a == "--sizes") {
      o.sizes = split_commas(value(i));
    } else if (a == "--dtypes") {
      o.dtypes = split_commas(value(i));
    } else {
      fail(fmt::format("unknown flag '{}'", a));
    }
  }
  if (o.quick) {
    o.reps = std::min(o.reps, 3);
    o.warmup = std::min(o.warmup, 1);
    o.tune_reps = std::min(o.tune_reps, 2);
  }
  return o;
}

void run_spmd(const Options& options, const std::function<void(Ranks&)>& fn) {
  // The benchmark's ranks are its only threads: BLAS must not start more per rank.
  blas::set_num_threads(1);
  if (comm::launched_by_mpirun()) {
    auto world = comm::mpi_world();
    if (ranks_given && world->size() != options.ranks) {
      if (world->rank() == 0)
        fmt::print(stderr, "started by mpirun with {} processes, but --ranks {}\n", world->size(),
                   options.ranks);
      std::exit(2);
    }
    Ranks r{*world, MPI_COMM_WORLD};
    fn(r);
    return;
  }
  comm::run_ranks(options.ranks, [&](comm::Communicator& comm) {
    Ranks r{comm, MPI_COMM_NULL};
    fn(r);
  });
}

Stats stats_of(std::vector<double> times) {
  Stats s;
  s.times = times;
  if (times.empty()) return s;
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  s.median = n % 2 == 1 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
  s.min = times.front();
  s.max = times.back();
  return s;
}

double time_once(comm::Communicator& comm, const std::function<void()>& fn,
                 const std::function<void()>& before) {
  if (before) before();
  comm.barrier();
  const auto t0 = Clock::now();
  fn();
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  return max_over_ranks(comm, dt);
}

std::vector<Stats> time_interleaved(comm::Communicator& comm,
                                    const std::vector<Contender>& contenders, int warmup,
                                    int reps) {
  for (const Contender& c : contenders)
    for (int i = 0; i < warmup; ++i) time_once(comm, c.run, c.before);
  std::vector<std::vector<double>> times(contenders.size());
  for (int i = 0; i < reps; ++i)
    for (size_t k = 0; k < contenders.size(); ++k)
      times[k].push_back(time_once(comm, contenders[k].run, contenders[k].before));
  std::vector<Stats> out;
  for (auto& t : times) out.push_back(stats_of(t));
  return out;
}

// The optimizer's own pattern for the read-modify-write roof: a gradient read, and w, m and v
// read and written in place (4 streams in, 3 out), `bytes` in all.
RoofStreams::RoofStreams(size_t bytes)
    : n_(bytes / sizeof(float)),
      q_(n_ / 4),
      a_(n_, 1.0f),
      g_(q_, 0.5f),
      w_(q_, 1.0f),
      m_(q_, 0.0f),
      v_(q_, 0.0f),
      src_(bytes, 1),
      dst_(bytes, 0) {}

void RoofStreams::read() {
  float acc[16] = {};
  for (size_t k = 0; k + 16 <= n_; k += 16)
    for (int j = 0; j < 16; ++j) acc[j] += a_[k + static_cast<size_t>(j)];
  float t = 0;
  for (float x : acc) t += x;
  g_roof_sink = t;
}

void RoofStreams::rmw() {
  for (size_t k = 0; k < q_; ++k) {
    m_[k] = 0.9f * m_[k] + g_[k];
    v_[k] = 0.99f * v_[k] + g_[k];
    w_[k] = 0.999f * w_[k] + g_[k];
  }
}

void RoofStreams::copy() {
  std::memcpy(dst_.data(), src_.data(), src_.size());
  const size_t i = static_cast<size_t>(copies_++) % src_.size();
  src_[i] = dst_[i];  // a copy the compiler cannot drop
}

double RoofStreams::read_rate(double seconds) const {
  return static_cast<double>(n_ * sizeof(float)) / seconds;
}
double RoofStreams::rmw_rate(double seconds) const {
  return 7.0 * static_cast<double>(q_ * sizeof(float)) / seconds;  // 4 streams read, 3 written
}
double RoofStreams::copy_rate(double seconds) const {
  return 2.0 * static_cast<double>(src_.size()) / seconds;
}

Roofs measure_roofs(comm::Communicator& comm, RoofStreams& streams, int reps) {
  std::vector<double> read_t, rmw_t, copy_t;
  for (int i = 0; i < reps + 1; ++i) {
    const double tr = time_once(comm, [&] { streams.read(); });
    const double tw = time_once(comm, [&] { streams.rmw(); });
    const double tc = time_once(comm, [&] { streams.copy(); });
    if (i > 0) {
      read_t.push_back(tr);
      rmw_t.push_back(tw);
      copy_t.push_back(tc);
    }
  }
  // The fastest repetition: a roof is what the memory can do, and load only slows it down.
  return {streams.copy_rate(stats_of(copy_t).min), streams.read_rate(stats_of(read_t).min),
          streams.rmw_rate(stats_of(rmw_t).min)};
}

Roofs fastest_of(const Roofs& a, const Roofs& b) {
  return {std::max(a.copy, b.copy), std::max(a.read, b.read), std::max(a.rmw, b.rmw)};
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string one;
  f >> one;
  return one.empty() ? "unknown" : one;
}

int hardware_threads() { return static_cast<int>(std::thread::hardware_concurrency()); }

std::string compare(const std::string& label, const Tensor& got, const Tensor& want, double rtol) {
  if (got.numel() != want.numel())
    return fmt::format("{}: {} elements, expected {}", label, got.numel(), want.numel());
  double scale = 0;
  for (int64_t i = 0; i < want.numel(); ++i)
    scale = std::max(scale, std::fabs(static_cast<double>(want.get(i))));
  int64_t bad = 0;
  double max_diff = 0;
  std::string first;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.get(i), w = want.get(i);
    const double d = std::fabs(g - w);
    if (!(d <= rtol * (std::fabs(w) + scale))) {
      if (bad < 3) first += fmt::format(" [{}] got {} want {};", i, g, w);
      ++bad;
    }
    if (!std::isnan(d)) max_diff = std::max(max_diff, d);
  }
  if (bad == 0) return "";
  return fmt::format(
      "{}: {} of {} elements differ (rtol {:g}, max |want| {:g}), max |diff| {:g};{}", label, bad,
      want.numel(), rtol, scale, max_diff, first);
}

void require_agreement(Ranks& ranks, const std::string& message) {
  comm::Communicator& comm = ranks.comm;
  const bool bad = max_over_ranks(comm, message.empty() ? 0.0 : 1.0) != 0.0;
  if (!bad) return;
  // Each rank in turn states its verdict, so that the messages do not interleave.
  for (int r = 0; r < comm.size(); ++r) {
    comm.barrier();
    if (r == comm.rank() && !message.empty())
      fmt::print(stderr, "rank {}: CHECK FAILED, not timing: {}\n", r, message);
  }
  comm.barrier();
  std::fflush(stderr);
  std::exit(1);
}

void fill_uniform(const Tensor& t, uint64_t seed, float lo, float hi) {
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i) {
    uint64_t x = (static_cast<uint64_t>(i) + 1) * 0x9E3779B97F4A7C15ull ^ seed;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    const float u = static_cast<float>(x >> 40) * 0x1p-24f;
    t.set(i, lo + (hi - lo) * u);
  }
}

Tuned tune_and_compile(Ranks& ranks, const dsl::Program& program, const dsl::SymbolMap& sizes,
                       const Options& options) {
  Tuned t;
  tune::TuneOptions o;
  o.sizes = sizes;
  o.reps = options.tune_reps;
  o.warmup = 1;
  o.read_cache = !options.retune;
  const auto t0 = Clock::now();
  t.result = tune::tune(program, ranks.comm, o);
  const schedule::NamedSchedule s = schedule::schedule_by_name(program, t.result.record.winner);
  t.compiled = exec::compile_plan(s.schedule.lower());
  t.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return t;
}

void print_tuning(Ranks& ranks, const Tuned& t) {
  if (!ranks.root()) return;
  const auto& r = t.result;
  fmt::print(
      "  tuned ({} schedules, {}): winner {}{} ({:.2f}x over {} in the tuner's own timing)\n",
      r.record.candidates.size(),
      r.from_cache ? "from the cache" : fmt::format("measured now in {:.1f} s", t.seconds),
      r.record.winner,
      r.record.chunk_bytes != 0 ? fmt::format(" at {}-byte chunks", r.record.chunk_bytes) : "",
      r.speedup(r.winner()), r.baseline().name);
  std::string line = "   ";
  for (const auto& c : r.record.candidates)
    line += !c.ok         ? fmt::format(" {} FAILED;", c.name)
            : c.retimed() ? fmt::format(" {} {:.2f}ms (in turns {:.2f}ms);", c.name,
                                        c.median() * 1e3, c.final_median() * 1e3)
                          : fmt::format(" {} {:.2f}ms;", c.name, c.median() * 1e3);
  fmt::print("{}\n", line);
}

void print_row(const std::string& name, const Stats& s, const std::string& extra) {
  fmt::print("  {:<52} {:9.2f} ms  [{:.2f} .. {:.2f}]  spread {:4.1f}%  {}\n", name, s.median * 1e3,
             s.min * 1e3, s.max * 1e3, s.spread() * 100, extra);
}

std::vector<int64_t> layer_dims(const Options& o, std::vector<int64_t> full,
                                std::vector<int64_t> quick) {
  if (o.sizes.empty()) return o.quick ? quick : full;
  if (o.sizes.size() != 3) user_error("--sizes takes B,K_PER_RANK,H (three extents)");
  std::vector<int64_t> dims;
  for (const std::string& s : o.sizes) dims.push_back(tune::parse_extent(s, "--sizes"));
  return dims;
}

void print_ratio(const std::string& name, double value) {
  fmt::print("ratio {} {:.3f}\n", name, value);
}

std::string size_label(int64_t n) {
  if (n > 0 && n % (int64_t{1} << 20) == 0) return fmt::format("{}Mi", n >> 20);
  if (n > 0 && n % (int64_t{1} << 10) == 0) return fmt::format("{}Ki", n >> 10);
  return std::to_string(n);
}

}  // namespace tandem::bench
