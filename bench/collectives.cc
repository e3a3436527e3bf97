// All-reduce bus bandwidth of tandem's thread backend, tandem over MPI (the ring, and the Direct
// algorithm over shared memory, or the hierarchical one with --ranks-per-node) and OpenMPI's own
// MPI_Allreduce, measured in one run against the memory-traffic bound from a STREAM-style copy.
//
// Run standalone it measures the copy and the thread backend in this process, then relaunches
// itself under `mpirun -np P --oversubscribe` for the MPI rows. Each row checks its result
// once, warms up, and reports the median of several timed repetitions (min and max beside it).
//
// A repetition's time is the slowest rank's, from the barrier that starts it to the end of its
// call (the barrier's own exit, slow on a busy machine, is not counted).
//
// Bus bandwidth follows nccl-tests: algbw = bytes / time, busbw = algbw * 2 (p - 1) / p.
// The memory-traffic bound: an in-place all-reduce over shared memory must, per rank, read its
// buffer, read the peers' copies of its part and write its part (2 N in all), then copy the
// (p - 1) / p of the buffer it does not own (another (p - 1) / p N read and as much written):
// (2 + (p - 1) / p) N bytes per rank, 2.5 N for 2 ranks. Divided into the machine's copy
// bandwidth (bytes read + written per second, all cores), that is the fastest time possible.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tandem/comm/mpi.h"
#include "tandem/comm/thread.h"
#include "tandem/core/error.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif

namespace {

using tandem::DType;
using tandem::Tensor;
using tandem::comm::Communicator;
using tandem::comm::ReduceOp;
using clock_type = std::chrono::steady_clock;

constexpr size_t kMiB = size_t{1} << 20;

struct Options {
  std::vector<int> ranks{2, 4};
  std::vector<size_t> sizes_mib{1, 4, 16, 64, 256};
  int reps = 7;
  int warmup = 2;
  bool mpi = true;
  bool child = false;      // run by mpirun from the standalone run: print rows only
  int ranks_per_node = 0;  // --ranks-per-node: the MPI rows as nodes of this many ranks, over TCP
};

// A timing: median, min and max seconds of the repetitions.
struct Timing {
  double median = 0, min = 0, max = 0;
};

Timing summarise(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return Timing{t[t.size() / 2], t.front(), t.back()};
}

double seconds_since(clock_type::time_point t0) {
  return std::chrono::duration<double>(clock_type::now() - t0).count();
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  f >> a >> b >> c;
  return a.empty() ? "unknown" : fmt::format("{} {} {}", a, b, c);
}

// ---- Inputs and the check before timing ---------------------------------------------------------

// Rank r holds (r + 1) * (i % 7); the sum over p ranks is p (p + 1) / 2 * (i % 7), exact in f32.
void fill_input(float* x, size_t n, int r) {
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>((r + 1) * static_cast<int>(i % 7));
}

bool check_sum(const float* x, size_t n, int p) {
  const float k = static_cast<float>(p * (p + 1) / 2);
  for (size_t i = 0; i < n; ++i)
    if (x[i] != k * static_cast<float>(i % 7)) return false;
  return true;
}

// ---- The physical bound: a STREAM-style copy on every core --------------------------------------

// Bytes read + written per second by `threads` threads each copying its own 64 MiB array (far
// beyond the last-level cache), best of five. `streaming` uses non-temporal stores.
double copy_bandwidth(int threads, bool streaming) {
  const size_t bytes = 64 * kMiB;
  std::vector<Tensor> src, dst;
  for (int t = 0; t < threads; ++t) {
    src.push_back(Tensor::empty(DType::F32, {static_cast<int64_t>(bytes / 4)}));
    dst.push_back(Tensor::empty(DType::F32, {static_cast<int64_t>(bytes / 4)}));
    std::memset(src.back().data(), 1, bytes);
    std::memset(dst.back().data(), 2, bytes);
  }
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = clock_type::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        auto* d = static_cast<char*>(dst[t].data());
        const auto* s = static_cast<const char*>(src[t].data());
#if defined(__AVX__)
        if (streaming) {
          for (size_t i = 0; i < bytes; i += 32)
            _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i),
                                _mm256_load_si256(reinterpret_cast<const __m256i*>(s + i)));
          _mm_sfence();
          return;
        }
#endif
        std::memcpy(d, s, bytes);
      });
    for (auto& th : pool) th.join();
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * static_cast<double>(bytes) * threads / best;
}

// Memory traffic of an in-place all-reduce of N bytes per rank over p ranks (see the top).
double traffic_bytes(size_t n_bytes, int p) {
  return p * (2.0 + static_cast<double>(p - 1) / p) * static_cast<double>(n_bytes);
}

double bus_factor(int p) { return 2.0 * (p - 1) / p; }

// ---- Thread backend ---------------------------------------------------------------------------

// Times all_reduce on p in-process ranks for each size. Throws if a result is wrong.
std::map<size_t, Timing> run_thread_rows(int p, const Options& o) {
  std::map<size_t, Timing> out;
  for (size_t mib : o.sizes_mib) {
    const size_t n = mib * kMiB / 4;
    std::vector<double> times, slowest(static_cast<size_t>(p), 0.0);
    std::atomic<bool> ok{true};
    tandem::comm::run_ranks(p, [&](Communicator& c) {
      Tensor buf = Tensor::empty(DType::F32, {static_cast<int64_t>(n)});
      float* x = static_cast<float*>(buf.data());
      fill_input(x, n, c.rank());
      c.all_reduce(buf, ReduceOp::Sum);
      if (!check_sum(x, n, p)) ok = false;
      for (int i = 0; i < o.warmup; ++i) c.all_reduce(buf, ReduceOp::Sum);
      for (int i = 0; i < o.reps; ++i) {
        c.barrier();
        const auto t0 = clock_type::now();
        c.all_reduce(buf, ReduceOp::Sum);
        slowest[static_cast<size_t>(c.rank())] = seconds_since(t0);
        c.barrier();
        if (c.rank() == 0) times.push_back(*std::max_element(slowest.begin(), slowest.end()));
      }
    });
    if (!ok)
      tandem::internal_error(
          fmt::format("thread all_reduce of {} MiB on {} ranks gave a "
                      "wrong sum",
                      mib, p));
    out[mib] = summarise(times);
  }
  return out;
}

// ---- MPI rows (inside mpirun) -------------------------------------------------------------------

// Times tandem's algorithms and MPI_Allreduce on the MPI world, alternating repetitions so that
// all see the same machine load; rank 0 prints one line per row:
// "row <method> <ranks> <MiB> <median s> <min s> <max s>". The methods:
// - tandem-mpi-ring: the ring over point-to-point, on a buffer from the heap;
// - tandem-mpi-direct (one node): the Direct algorithm on a buffer from the communicator's shared
//   arena, each rank reading its peers' buffers (what a DSL runner's buffers get);
// - tandem-mpi-hier (nodes forced by TANDEM_RANKS_PER_NODE): the hierarchical algorithm;
// - MPI_Allreduce on a buffer from the heap.
int run_mpi_child(const Options& o) {
  auto comm = tandem::comm::mpi_world();
  const int p = comm->size(), r = comm->rank();
  const bool one_node = comm->shares_memory();
  const std::string tandem_auto = one_node ? "tandem-mpi-direct" : "tandem-mpi-hier";
  const std::vector<std::string> methods = {"tandem-mpi-ring", tandem_auto, "MPI_Allreduce"};
  const int nm = static_cast<int>(methods.size());
  for (size_t mib : o.sizes_mib) {
    const size_t n = mib * kMiB / 4;
    const int64_t ne = static_cast<int64_t>(n);
    Tensor heap = Tensor::empty(DType::F32, {ne});
    Tensor shared = Tensor::empty(DType::F32, {ne}, comm->allocator());
    auto buffer = [&](int m) { return m == 1 ? shared : heap; };
    auto once = [&](int m) {
      tandem::comm::CollectiveDesc d{tandem::comm::CollectiveKind::AllReduce};
      d.send = buffer(m);
      if (m == 0) {
        d.algo = tandem::comm::CollectiveAlgo::Ring;
        comm->run(d);
      } else if (m == 1) {
        comm->run(d);
      } else {
        MPI_Allreduce(MPI_IN_PLACE, heap.data(), static_cast<int>(n), MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
      }
    };
    for (int m = 0; m < nm; ++m) {
      float* x = static_cast<float*>(buffer(m).data());
      fill_input(x, n, r);
      once(m);
      int ok = check_sum(x, n, p) ? 1 : 0, all_ok = 0;
      MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
      if (!all_ok) {
        if (r == 0)
          std::fprintf(stderr, "%s of %zu MiB on %d ranks gave a wrong sum\n", methods[m].c_str(),
                       mib, p);
        return 1;
      }
    }
    for (int i = 0; i < o.warmup; ++i)
      for (int m = 0; m < nm; ++m) once(m);
    std::vector<std::vector<double>> times(nm);
    for (int i = 0; i < o.reps; ++i) {
      for (int m = 0; m < nm; ++m) {
        MPI_Barrier(MPI_COMM_WORLD);
        const auto t0 = clock_type::now();
        once(m);
        double mine = seconds_since(t0), slowest = 0;
        MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        times[m].push_back(slowest);
      }
    }
    for (int m = 0; m < nm; ++m) {
      const Timing t = summarise(times[m]);
      if (r == 0)
        std::printf("row %s %d %zu %.9f %.9f %.9f\n", methods[m].c_str(), p, mib, t.median, t.min,
                    t.max);
    }
    std::fflush(stdout);
  }
  return 0;
}

std::string self_path() {
  char buf[4096];
  const ssize_t len = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (len <= 0) return "bench_collectives";
  return std::string(buf, static_cast<size_t>(len));
}

std::string join(const std::vector<size_t>& v) {
  std::string s;
  for (size_t x : v) {
    if (!s.empty()) s.push_back(',');
    s.append(std::to_string(x));
  }
  return s;
}

// Relaunches this program under mpirun for p ranks and collects its rows: method -> MiB -> timing.
std::map<std::string, std::map<size_t, Timing>> run_mpi_rows(int p, const Options& o) {
  // Forced nodes: the inter-node part goes over TCP (as between real hosts); so does all of
  // MPI_Allreduce.
  const std::string nodes =
      o.ranks_per_node > 0 ? fmt::format("TANDEM_RANKS_PER_NODE={} ", o.ranks_per_node) : "";
  const std::string cmd = fmt::format(
      "{}OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np {} --oversubscribe "
      "{}'{}' --mpi-child --sizes {} --reps {} --warmup {} 2>&1",
      nodes, p, o.ranks_per_node > 0 ? "--mca btl tcp,self " : "", self_path(), join(o.sizes_mib),
      o.reps, o.warmup);
  std::map<std::string, std::map<size_t, Timing>> rows;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    std::fprintf(stderr, "could not run: %s\n", cmd.c_str());
    return rows;
  }
  char line[1024];
  std::string other;
  while (std::fgets(line, sizeof(line), pipe) != nullptr) {
    std::istringstream in(line);
    std::string tag, method;
    int ranks = 0;
    size_t mib = 0;
    Timing t;
    if (in >> tag >> method >> ranks >> mib >> t.median >> t.min >> t.max && tag == "row") {
      rows[method][mib] = t;
    } else {
      other += line;
    }
  }
  const int status = pclose(pipe);
  if (status != 0 || rows.empty())
    std::fprintf(stderr, "mpirun for %d ranks failed (status %d):\n%s", p, status, other.c_str());
  return rows;
}

// ---- Report -------------------------------------------------------------------------------------

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(item);
  return out;
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) tandem::user_error("{} needs a value", a);
      return argv[++i];
    };
    auto number = [&](const std::string& v) -> long {
      char* end = nullptr;
      const long x = std::strtol(v.c_str(), &end, 10);
      if (v.empty() || *end != '\0' || x < 0) tandem::user_error("{}: '{}' is not a number", a, v);
      return x;
    };
    if (a == "--quick") {
      o.ranks = {2};
      o.sizes_mib = {1, 16, 64};
      o.reps = 3;
      o.warmup = 1;
    } else if (a == "--ranks") {
      o.ranks.clear();
      for (const auto& v : split_list(value())) {
        const long r = number(v);
        if (r < 1) tandem::user_error("--ranks: every rank count must be at least 1, got {}", r);
        o.ranks.push_back(static_cast<int>(r));
      }
    } else if (a == "--sizes") {
      o.sizes_mib.clear();
      for (const auto& v : split_list(value())) {
        const long s = number(v);
        if (s < 1) tandem::user_error("--sizes: sizes are in MiB, at least 1, got {}", s);
        o.sizes_mib.push_back(static_cast<size_t>(s));
      }
    } else if (a == "--reps") {
      o.reps = std::max(1, static_cast<int>(number(value())));
    } else if (a == "--warmup") {
      o.warmup = static_cast<int>(number(value()));
    } else if (a == "--ranks-per-node") {
      o.ranks_per_node = static_cast<int>(number(value()));
    } else if (a == "--no-mpi") {
      o.mpi = false;
    } else if (a == "--mpi-child") {
      o.child = true;
    } else if (a == "--help" || a == "-h") {
      std::printf(
          "usage: bench_collectives [--quick] [--ranks 2,4] [--sizes 1,4,16,64,256] [--reps 7]\n"
          "                         [--warmup 2] [--no-mpi] [--ranks-per-node K]\n"
          "  --quick   2 ranks, 1/16/64 MiB, 3 repetitions (what `make run` shows)\n"
          "  --sizes   buffer sizes per rank, in MiB (f32)\n"
          "  --no-mpi  skip the rows that need mpirun\n"
          "  --ranks-per-node K  the MPI rows with every K ranks as one node\n"
          "            (TANDEM_RANKS_PER_NODE=K, `--mca btl tcp,self`): the hierarchical\n"
          "            all-reduce against the flat ring and MPI_Allreduce, all over TCP\n");
      std::exit(0);
    } else {
      tandem::user_error("unknown flag '{}'; try --help", a);
    }
  }
  if (o.ranks.empty() || o.sizes_mib.empty()) tandem::user_error("--ranks and --sizes need values");
  return o;
}

int run(int argc, char** argv) {
  const Options o = parse(argc, argv);
  if (o.child || tandem::comm::launched_by_mpirun()) return run_mpi_child(o);

  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  std::printf("tandem all-reduce bus bandwidth (f32 sum, in place)\n");
  std::printf("machine: %d cores; load average before: %s; chunk %zu KiB\n", cores,
              load_average().c_str(), tandem::comm::chunk_bytes() >> 10);
  const double copy_bw = copy_bandwidth(cores, false);
  const double copy_nt = copy_bandwidth(cores, true);
  std::printf(
      "STREAM-style copy on %d threads (bytes read + written): %.1f GB/s memcpy, %.1f GB/s "
      "with non-temporal stores\n",
      cores, copy_bw / 1e9, copy_nt / 1e9);
  std::printf(
      "memory-traffic bound: (2 + (p-1)/p) x buffer per rank (2.5x for 2 ranks) / %.1f "
      "GB/s\n\n",
      copy_bw / 1e9);

  std::printf("%5s %8s  %-16s %10s %10s %10s %10s %9s\n", "ranks", "size", "method", "time ms",
              "(min-max)", "algbw GB/s", "busbw GB/s", "of bound");
  std::vector<std::string> ratios;
  for (int p : o.ranks) {
    std::map<std::string, std::map<size_t, Timing>> rows;
    rows["tandem-thread"] = run_thread_rows(p, o);
    if (o.mpi && p > 1) {
      auto mpi = run_mpi_rows(p, o);
      rows.insert(mpi.begin(), mpi.end());
    }
    const double bound_busbw_per_byte = copy_bw / traffic_bytes(1, p) * bus_factor(p);
    for (size_t mib : o.sizes_mib) {
      const double bytes = static_cast<double>(mib * kMiB);
      auto busbw = [&](const std::string& m) -> double {
        auto it = rows.find(m);
        if (it == rows.end() || !it->second.count(mib)) return 0;
        return bytes / it->second.at(mib).median * bus_factor(p);
      };
      for (const char* m : {"tandem-thread", "tandem-mpi-ring", "tandem-mpi-direct",
                            "tandem-mpi-hier", "MPI_Allreduce"}) {
        auto it = rows.find(m);
        if (it == rows.end() || !it->second.count(mib)) continue;
        const Timing& t = it->second.at(mib);
        const double algbw = bytes / t.median;
        std::printf("%5d %5zu MiB  %-16s %10.3f %4.1f-%-5.1f %10.2f %10.2f %8.0f%%\n", p, mib, m,
                    t.median * 1e3, t.min * 1e3, t.max * 1e3, algbw / 1e9,
                    algbw * bus_factor(p) / 1e9,
                    100.0 * algbw * bus_factor(p) / bound_busbw_per_byte);
      }
      std::printf("%5d %5zu MiB  %-16s %10.3f %10s %10.2f %10.2f %8s\n", p, mib, "(bound)",
                  traffic_bytes(mib * kMiB, p) / copy_bw * 1e3, "",
                  bound_busbw_per_byte / bus_factor(p) / 1e9, bound_busbw_per_byte / 1e9, "100%");
      const double thread = busbw("tandem-thread"), ring = busbw("tandem-mpi-ring"),
                   direct = busbw("tandem-mpi-direct"), hier = busbw("tandem-mpi-hier"),
                   mpi = busbw("MPI_Allreduce");
      const std::string at = fmt::format("p={} {}MiB", p, mib);
      if (thread > 0 && mpi > 0)
        ratios.push_back(
            fmt::format("ratio thread/MPI_Allreduce busbw {}: {:.2f}x", at, thread / mpi));
      if (thread > 0)
        ratios.push_back(fmt::format("ratio thread/memory-traffic-bound {}: {:.2f}", at,
                                     thread / bound_busbw_per_byte));
      if (ring > 0 && mpi > 0)
        ratios.push_back(
            fmt::format("ratio tandem-mpi-ring/MPI_Allreduce busbw {}: {:.2f}x", at, ring / mpi));
      if (direct > 0 && thread > 0)
        ratios.push_back(
            fmt::format("ratio tandem-mpi-direct/thread busbw {}: {:.2f}x", at, direct / thread));
      if (direct > 0 && mpi > 0)
        ratios.push_back(fmt::format("ratio tandem-mpi-direct/MPI_Allreduce busbw {}: {:.2f}x", at,
                                     direct / mpi));
      if (hier > 0 && mpi > 0)
        ratios.push_back(
            fmt::format("ratio tandem-mpi-hier/MPI_Allreduce busbw {}: {:.2f}x", at, hier / mpi));
      if (hier > 0 && ring > 0)
        ratios.push_back(fmt::format("ratio tandem-mpi-hier/tandem-mpi-ring busbw {}: {:.2f}x", at,
                                     hier / ring));
    }
  }
  std::printf("\n");
  for (const auto& line : ratios) std::printf("%s\n", line.c_str());
  std::printf("load average after: %s\n", load_average().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const tandem::UserError& e) {
    std::fprintf(stderr, "bench_collectives: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_collectives: %s\n", e.what());
    return 1;
  }
}
