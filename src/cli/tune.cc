// `tandem tune`: searches the schedules of a workload on the chosen backend with the autotuner and
// prints each timed one's median time and speed-up over the unfused baseline, marking the winner
// and the schedules the final round timed again in turns, then the search and the chunk sizes.
#include "tandem/tune/tune.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "choices.h"
#include "commands.h"
#include "tandem/comm/mpi.h"
#include "tandem/comm/thread.h"
#include "tandem/core/blas.h"
#include "tandem/core/env.h"
#include "tandem/core/error.h"
#include "tandem/dsl/workloads.h"

namespace tandem::cli {
namespace {

struct TuneFlags {
  std::string workload;
  int ranks = 2;
  comm::Backend backend = comm::Backend::Thread;
  std::vector<std::string> sizes;
  std::vector<std::string> only;
  std::string dtype;
  std::string wire;
  exec::RunnerKind executor = exec::RunnerKind::Compiled;
  int reps = 5;
  int warmup = 1;
  bool json = false;
  bool retune = false;
  double budget = tune::TuneOptions{}.budget_s;
  std::vector<int> blocks = tune::TuneOptions{}.blocks;
  std::vector<std::string> chunks;  // extents; empty: the tuner's default sizes
  bool no_chunks = false;
};

std::string ms(double s) { return fmt::format("{:.3f} ms", s * 1e3); }

std::string sizes_str(const dsl::SymbolMap& sizes) {
  std::string out;
  for (const auto& [k, v] : sizes) out += fmt::format("{}{}={}", out.empty() ? "" : " ", k, v);
  return out;
}

void print_table(const tune::TuneResult& r) {
  const tune::TuneKey& k = r.record.key;
  fmt::print("tune {}  {}  on {} ranks ({} backend, {} executor)\n", k.program, sizes_str(k.sizes),
             k.ranks, k.backend, k.executor);
  fmt::print("machine {}\n", k.machine);
  fmt::print("each schedule checked against the reference interpreter at {}\n",
             sizes_str(r.record.check_sizes));
  fmt::print("{} warm-up run(s), {} timed; each time is the slowest rank's; * marks the winner\n",
             r.record.warmup, r.record.reps);
  if (r.record.final_reps > 0)
    fmt::print(
        "final round: the schedules within {:.0f}% of the best median (at most {}, marked +) timed "
        "again in "
        "turns,\n{} times each; the winner has the smallest final median\n",
        r.record.final_margin * 100, r.record.final_max, r.record.final_reps);
  else
    fmt::print("no final round: no other schedule within {:.0f}% of the best median\n",
               r.record.final_margin * 100);
  fmt::print("\n");
  size_t width = 8;
  for (const auto& c : r.record.candidates) width = std::max(width, c.name.size());
  fmt::print("  {:<{}}  {:>12}  {:>12}  {:>12}  {:>12}  {:>8}\n", "schedule", width, "median",
             "min", "max", "final median", "speed-up");
  for (const auto& c : r.record.candidates) {
    const char* mark = c.name == r.record.winner ? "*" : c.retimed() ? "+" : " ";
    if (!c.ok) {
      fmt::print("{} {:<{}}  FAILED: {}\n", mark, c.name, width, c.error);
      continue;
    }
    fmt::print("{} {:<{}}  {:>12}  {:>12}  {:>12}  {:>12}  {:>7.2f}x\n", mark, c.name, width,
               ms(c.median()), ms(c.min()), ms(c.max()),
               c.retimed() ? ms(c.final_median()) : std::string("-"), r.speedup(c));
  }
  fmt::print("\nwinner: {} ({:.2f}x over {})\n", r.record.winner, r.speedup(r.winner()),
             r.baseline().name);
  fmt::print(
      "search: {} schedule(s) timed, the collectives one at a time, of a space of {} recipes",
      r.record.candidates.size(), r.record.space);
  if (r.record.left_untimed > 0)
    fmt::print("; the budget of {} s ran out with {} left untimed (--budget to give more)\n",
               r.record.budget_s, r.record.left_untimed);
  else
    fmt::print(" (budget {} s)\n", r.record.budget_s);
  if (!r.record.chunks.empty()) {
    fmt::print(
        "chunk size (the winner timed at each, in turns; * the fastest, which the tuned program "
        "runs at):");
    for (const tune::ChunkTiming& c : r.record.chunks)
      fmt::print("  {}{} B {}", c.bytes == r.record.chunk_bytes ? "*" : "", c.bytes,
                 ms(c.median()));
    fmt::print("\n");
  }
  if (r.from_cache)
    fmt::print("cache: {} (read: nothing timed, {} compiled; --retune to measure again)\n",
               r.cache_file, r.compiles);
  else
    fmt::print("cache: {} (written; {} kernel(s) compiled)\n",
               r.cache_file.empty() ? "not written" : r.cache_file, r.compiles);
}

void print_json(const tune::TuneResult& r) {
  using nlohmann::json;
  const tune::TuneKey& k = r.record.key;
  json sizes = json::object();
  for (const auto& [s, v] : k.sizes) sizes[s] = v;
  json checked = json::object();
  for (const auto& [s, v] : r.record.check_sizes) checked[s] = v;
  json cands = json::array();
  for (const auto& c : r.record.candidates) {
    json j = {{"name", c.name},
              {"ok", c.ok},
              {"winner", c.name == r.record.winner},
              {"max_error", c.max_error}};
    if (c.ok) {
      j["median_s"] = c.median();
      j["min_s"] = c.min();
      j["max_s"] = c.max();
      j["times_s"] = c.times;
      j["speedup"] = r.speedup(c);
      j["retimed"] = c.retimed();
      if (c.retimed()) {
        j["final_median_s"] = c.final_median();
        j["final_times_s"] = c.final_times;
      }
    } else {
      j["error"] = c.error;
    }
    cands.push_back(std::move(j));
  }
  json doc = {{"workload", k.program},
              {"sizes", sizes},
              {"checked_at", checked},
              {"ranks", k.ranks},
              {"backend", k.backend},
              {"executor", k.executor},
              {"machine", k.machine},
              {"warmup", r.record.warmup},
              {"reps", r.record.reps},
              {"final_round",
               {{"margin", r.record.final_margin},
                {"max", r.record.final_max},
                {"reps", r.record.final_reps}}},
              {"baseline", r.baseline().name},
              {"winner", r.record.winner},
              {"winner_speedup", r.speedup(r.winner())},
              {"search",
               {{"space", r.record.space},
                {"timed", r.record.candidates.size()},
                {"budget_s", r.record.budget_s},
                {"left_untimed", r.record.left_untimed}}},
              {"chunk_bytes", r.record.chunk_bytes},
              {"from_cache", r.from_cache},
              {"cache_file", r.cache_file},
              {"compiles", r.compiles},
              {"candidates", cands}};
  fmt::print("{}\n", doc.dump(2));
}

// Runs this command again under mpirun with `ranks` processes, each given the user's own
// arguments `args` (and returns only on failure).
[[noreturn]] void relaunch_under_mpirun(int ranks, const std::vector<std::string>& args) {
  // The launcher, declared once here with its default, as every TANDEM_* setting is.
  const std::string mpirun = env_str("TANDEM_MPIRUN", "mpirun");
  char self[PATH_MAX];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) user_error("--backend mpi: cannot find this executable to start it under {}", mpirun);
  self[n] = '\0';
  std::vector<std::string> command = {mpirun, "-np", std::to_string(ranks), "--oversubscribe",
                                      self};
  command.insert(command.end(), args.begin(), args.end());
  // OpenMPI refuses to start as root without both of these; containers and CI run as root.
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 0);
  ::setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 0);
  ::setenv("TANDEM_TUNE_RELAUNCHED", "1", 1);
  std::vector<char*> argv;
  for (auto& a : command) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  ::execvp(argv[0], argv.data());
  user_error(
      "--backend mpi: cannot start '{}' ({}); install OpenMPI, set TANDEM_MPIRUN, or start tandem "
      "under "
      "mpirun -np {} yourself",
      mpirun, std::strerror(errno), ranks);
}

void run_tune(const TuneFlags& f, const std::vector<std::string>& args) {
  if (f.ranks < 1) user_error("--ranks must be at least 1 (got {})", f.ranks);
  if (f.backend == comm::Backend::Thread && f.ranks > comm::kMaxThreadRanks)
    user_error(
        "--ranks {}: the thread backend runs at most {} ranks, each a thread of this process "
        "(more only oversubscribe this machine and exhaust its memory); use --backend mpi "
        "for more",
        f.ranks, comm::kMaxThreadRanks);
  const dsl::Program program = workload_program(f.workload, f.dtype, f.wire);
  tune::TuneOptions o;
  o.sizes = tune::parse_sizes(program, f.sizes, default_sizes());
  o.reps = f.reps;
  o.warmup = f.warmup;
  o.read_cache = !f.retune;
  o.executor = tune::executor_of(f.executor);
  o.only = f.only;
  o.budget_s = f.budget;
  o.blocks = f.blocks;
  if (f.no_chunks)
    o.chunk_bytes.clear();
  else if (!f.chunks.empty()) {
    o.chunk_bytes.clear();
    for (const std::string& c : f.chunks) {
      const int64_t b = tune::parse_extent(c, "--chunks");
      if (b < 1) user_error("--chunks {}: a chunk is at least 1 byte", c);
      o.chunk_bytes.push_back(static_cast<size_t>(b));
    }
  }
  if (o.budget_s < 0) user_error("--budget must be >= 0 seconds (got {})", o.budget_s);
  for (int b : o.blocks)
    if (b < 1) user_error("--blocks {}: an overlap needs at least 1 block", b);
  if (o.reps < 1) user_error("--reps must be at least 1 (got {})", o.reps);
  if (o.warmup < 0) user_error("--warmup must be >= 0 (got {})", o.warmup);

  tune::TuneResult r;
  if (f.backend == comm::Backend::Thread) {
    // The thread ranks share this machine's cores: each rank's BLAS gets its share, as the trainer
    // and the benchmarks give it, so that the matmuls are timed as they will run (the BLAS thread
    // count is part of the cache key). Oversubscribed, every schedule's matmul slows alike.
    blas::set_num_threads(tune::thread_rank_blas_threads(f.ranks));
    r = tune::tune_threads(program, f.ranks, o);
  } else {
    if (!comm::launched_by_mpirun()) {
      if (std::getenv("TANDEM_TUNE_RELAUNCHED") != nullptr)
        user_error("--backend mpi: started under {} but this process does not see an MPI launcher",
                   env_str("TANDEM_MPIRUN", "mpirun"));
      relaunch_under_mpirun(f.ranks, args);
    }
    auto world = comm::mpi_world();
    if (world->size() != f.ranks)
      user_error("--backend mpi: started with {} MPI processes but --ranks {}; give mpirun -np {}",
                 world->size(), f.ranks, f.ranks);
    r = tune::tune(program, *world, o);
    if (world->rank() != 0) return;
  }
  if (f.json)
    print_json(r);
  else
    print_table(r);
}

}  // namespace

dsl::Program workload_program(const std::string& name, const std::string& dtype,
                              const std::string& wire) {
  dsl::Program p = dsl::workloads::by_name(name);  // an unknown name: a UserError listing them
  // The layers, with or without their bias (Llama's), take a dtype and a wire dtype.
  constexpr std::string_view kNoBias = "_no_bias";
  const bool no_bias = name.ends_with(kNoBias);
  const std::string layer = no_bias ? name.substr(0, name.size() - kNoBias.size()) : name;
  const bool is_layer = layer == "megatron_layer" || layer == "pipeline_stage";
  const auto bias = no_bias ? dsl::workloads::Bias::Without : dsl::workloads::Bias::With;
  if (is_layer && (!wire.empty() || !dtype.empty())) {
    const DType t = dtype.empty() ? DType::F32 : parse_dtype(dtype);
    const std::optional<DType> w =
        wire.empty() ? std::nullopt : std::optional<DType>(parse_dtype(wire));
    return layer == "megatron_layer" ? dsl::workloads::megatron_layer(t, 0.1, w, bias)
                                     : dsl::workloads::pipeline_stage(t, 0.1, w, bias);
  }
  if (!wire.empty())
    user_error("--wire {}: only the layers (megatron_layer, pipeline_stage) take a wire dtype",
               wire);
  if (dtype.empty()) return p;
  const DType t = parse_dtype(dtype);
  // The dtype a workload takes: the gradient's for the optimizers.
  if (name == "adam") return dsl::workloads::adam(t);
  if (name == "lamb") return dsl::workloads::lamb(t);
  if (t != DType::F32) user_error("--dtype {}: {} moves f32 weights only", dtype_name(t), name);
  return p;
}

const dsl::SymbolMap& default_sizes() {
  static const dsl::SymbolMap sizes = {
      {"N", int64_t{4} << 20}, {"B", 1024}, {"K", 2048}, {"H", 1024}};
  return sizes;
}

void add_tune(CLI::App& app, std::vector<std::string> args) {
  auto f = std::make_shared<TuneFlags>();
  auto* cmd =
      app.add_subcommand("tune",
                         "Search the schedules of a workload, one collective at a time, then the "
                         "overlap's block count and the "
                         "chunk size, and keep the fastest (cached under the JIT cache folder).\n"
                         "Sizes not given: N=4Mi (adam, lamb, gather_weights, kv_gather, "
                         "kv_grad_reduce, kv_ring), B=1024 K=2048 H=1024 "
                         "(megatron_layer, pipeline_stage).\n"
                         "--backend mpi starts itself under `mpirun -np RANKS --oversubscribe` "
                         "(allowing root) unless already "
                         "started by mpirun.");
  cmd->add_option("workload", f->workload,
                  "adam, lamb, megatron_layer, pipeline_stage, gather_weights, kv_gather, "
                  "kv_grad_reduce or kv_ring")
      ->required();
  cmd->add_option("--ranks", f->ranks, "Number of ranks (threads or MPI processes)")
      ->capture_default_str();
  add_choice(cmd, "--backend", f->backend, parse_backend,
             "thread (in-process ranks) or mpi (MPI processes)", comm::backend_name(f->backend));
  cmd->add_option("--size", f->sizes,
                  "Extents: NAME=EXTENT, or bare extents in symbol order (64Mi, 4K, 1024)")
      ->expected(1, 8);
  cmd->add_option("--schedules", f->only,
                  "Time only these schedules (and the baseline); default: search");
  cmd->add_option("--dtype", f->dtype,
                  "Gradient dtype (adam, lamb) or tensor dtype (layers): f32, bf16, f16");
  cmd->add_option("--wire", f->wire,
                  "Layers: the type of x, w, their product and its all-reduce (default --dtype; "
                  "f32 --dtype with bf16 --wire is bf16 training's tensor-parallel exchange)");
  add_choice(cmd, "--executor", f->executor, parse_executor,
             "compiled (the CPU JIT), plan (plan runner) or reference (the interpreter)",
             exec::runner_kind_name(f->executor));
  cmd->add_option("--reps", f->reps, "Timed repetitions per schedule")->capture_default_str();
  cmd->add_option("--warmup", f->warmup, "Untimed runs before the repetitions")
      ->capture_default_str();
  cmd->add_option(
         "--budget", f->budget,
         "Seconds after which no further schedule is timed (the baseline always is); 0: no limit")
      ->capture_default_str();
  cmd->add_option("--blocks", f->blocks,
                  "Block counts tried for each overlap of the leading schedule")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--chunks", f->chunks,
                  "Collective chunk sizes the winner is timed at, the fastest kept for it to run "
                  "at (bytes, e.g. "
                  "64Ki,256Ki,1Mi,4Mi, the default)")
      ->delimiter(',');
  cmd->add_flag("--no-chunks", f->no_chunks,
                "No chunk round: the winner runs at the process's chunk size");
  cmd->add_flag("--json", f->json, "Print the results as JSON");
  cmd->add_flag("--retune", f->retune,
                "Measure again even when the cache has a record for this key");
  cmd->callback([f, args = std::move(args)] { run_tune(*f, args); });
}

}  // namespace tandem::cli
