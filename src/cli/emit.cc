// `tandem emit`: the source the code generator emits for one schedule of a workload (named, else
// the tuner's cached choice, else the built-in preference): the CPU JIT's C++ (printed, or written
// into -o DIR), or a CUDA + NCCL program written into a folder with its Makefile and the
// reference interpreter's results for the program's check.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "commands.h"
#include "tandem/codegen/cpp.h"
#include "tandem/codegen/cuda.h"
#include "tandem/comm/thread.h"
#include "tandem/core/error.h"
#include "tandem/exec/jit.h"
#include "tandem/exec/reference.h"
#include "tandem/io/atomic_file.h"
#include "tandem/parallel/model.h"
#include "tandem/parallel/optimizer.h"
#include "tandem/schedule/enumerate.h"
#include "tandem/schedule/lower.h"
#include "tandem/schedule/preference.h"
#include "tandem/schedule/recipe.h"
#include "tandem/tune/cache.h"
#include "tandem/tune/inputs.h"
#include "tandem/tune/tune.h"

namespace tandem::cli {
namespace {

namespace fs = std::filesystem;

struct EmitFlags {
  std::string workload;
  std::string schedule;
  std::string target = "cpp";
  std::string dtype;
  std::string wire;
  std::string out;
  std::vector<int> ranks = {1, 2};
  std::vector<std::string> sizes;
  bool list = false;
};

// Elements per value at which the check runs: small, so the reference's files stay small.
constexpr int64_t kCheckElems = int64_t{1} << 16;

// Through the atomic file: a link planted at the name is refused, never written through.
void write_bytes(const fs::path& path, const void* data, size_t bytes) {
  io::write_file_atomic(path.string(), std::string_view(static_cast<const char*>(data), bytes));
}

// check/np<N>/: what the emitted program loads and compares on N ranks: the sizes, scalars and
// seeds, and each rank's pieces of the inputs and of the reference interpreter's results, laid
// out as the schedule stores them (an input or result the schedule keeps sliced: this rank's part).
void write_reference(const dsl::Program& program, const schedule::Plan& plan, int ranks,
                     const dsl::SymbolMap& sizes, const fs::path& dir) {
  const dsl::Program& scheduled = plan.program;
  const exec::ScalarMap scalars = tune::standard_scalars(program, ranks / program.groups());
  fs::create_directories(dir);
  std::string meta;
  for (const auto& [name, extent] : sizes) meta += fmt::format("sym {} {}\n", name, extent);
  for (int id : scheduled.scalars()) {
    const double v = scalars.at(scheduled.stage(id).name);
    meta += fmt::format("scalar {} {:.17g}\n", id, v);
    if (v >= 0 && v == static_cast<double>(static_cast<uint64_t>(v)))
      meta += fmt::format("seed {} {}\n", id, static_cast<uint64_t>(v));
  }
  std::mutex mutex;
  comm::run_ranks(ranks, [&](comm::Communicator& comm) {
    const exec::Placement place = exec::placement(scheduled, comm);
    const exec::RunArgs args = tune::make_args(scheduled, place, sizes, scalars);
    const tune::Expected want = tune::reference_results(program, comm, sizes, scalars);
    const std::string r = fmt::format("r{}", comm.rank());
    std::lock_guard<std::mutex> lock(mutex);
    for (int id : scheduled.inputs()) {
      auto it = args.inputs.find(scheduled.stage(id).name);
      if (it == args.inputs.end()) continue;  // another group's
      write_bytes(dir / fmt::format("{}.in{}.bin", r, id), it->second.data(), it->second.nbytes());
    }
    std::vector<std::pair<int, std::string>> results;
    for (const dsl::Output& o : scheduled.outputs()) results.push_back({o.stage, o.name});
    for (int id : scheduled.inputs())
      if (scheduled.updater(id) >= 0) results.push_back({id, scheduled.stage(id).name});
    for (const auto& [id, name] : results) {
      auto it = want.values.find(name);
      if (it == want.values.end()) continue;  // another group's
      Tensor w = it->second;
      const dsl::Layout layout = scheduled.stage(id).type.layout;
      if (plan.values[static_cast<size_t>(id)].storage == schedule::Storage::Slice &&
          layout.is_sliced())
        w = exec::piece_of(w, layout, place.group_size, place.index);
      write_bytes(dir / fmt::format("{}.want{}.bin", r, id), w.data(), w.nbytes());
    }
  });
  io::write_file_atomic((dir / "meta.txt").string(), meta);
}

// A schedule's name as a file name: "adam_fused(RS-C-AG)+slice(m,v)" ->
// "adam_fused_RS_C_AG_slice_m_v".
std::string file_stem(const std::string& name) {
  std::string out;
  for (char c : name) {
    const bool word = std::isalnum(static_cast<unsigned char>(c)) != 0;
    if (word)
      out += c;
    else if (!out.empty() && out.back() != '_')
      out += '_';
  }
  while (!out.empty() && out.back() == '_') out.pop_back();
  return out;
}

// -o DIR, created with its parents if need be; a folder that cannot be is the user's error.
fs::path output_folder(const std::string& out) {
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec || !fs::is_directory(out))
    user_error("-o {}: cannot create the folder: {}", out,
               ec ? ec.message() : std::string("a file of that name exists"));
  return out;
}

void emit_cuda(const dsl::Program& program, const schedule::NamedSchedule& s, const EmitFlags& f) {
  if (f.out.empty()) user_error("--target cuda writes a folder: give it with -o DIR");
  // Checked before anything is written: the rank counts, then the sizes.
  for (int r : f.ranks) {
    if (r < 1) user_error("--ranks {}: a rank count is at least 1", r);
    if (r % program.groups() != 0)
      user_error("--ranks {}: program '{}' has {} groups; give multiples of {}", r, program.name(),
                 program.groups(), program.groups());
  }
  const dsl::SymbolMap wanted = tune::parse_sizes(program, f.sizes, default_sizes());
  int modulus = 8;
  for (int r : f.ranks) modulus = std::max(modulus, 8 * r);
  const dsl::SymbolMap sizes = tune::shrink_sizes(program, wanted, kCheckElems, modulus);
  const schedule::Plan plan = s.schedule.lower();
  const std::string name = file_stem(program.name() + "_" + s.name);
  const codegen::CudaProgram prog = codegen::emit_cuda(plan, name);
  const fs::path dir = output_folder(f.out);
  io::write_file_atomic((dir / (name + ".cu")).string(), prog.source);
  io::write_file_atomic((dir / "Makefile").string(), prog.makefile);
  for (int r : f.ranks)
    write_reference(program, plan, r, sizes, dir / "check" / fmt::format("np{}", r));
  fmt::print("wrote {}/{}.cu and {}/Makefile; reference results for {} rank(s) at {} in {}/check\n",
             dir.string(), name, dir.string(), fmt::join(f.ranks, ", "), fmt::join(sizes, " "),
             dir.string());
}

// The built-in preference for a workload's program: the list the trainer runs it with.
std::vector<std::string> preferences(const std::string& workload) {
  if (workload == "adam" || workload == "lamb") return parallel::optimizer_schedule_preferences();
  if (workload == "megatron_layer") return parallel::epilogue_schedule_preferences();
  // Nothing to schedule: an AllGather, a ReduceScatter or a Shift alone.
  if (workload == "gather_weights" || workload == "kv_gather" || workload == "kv_grad_reduce" ||
      workload == "kv_ring")
    return {"C"};
  return parallel::pipeline_schedule_preferences();
}

// The schedule `tandem emit` emits when --schedule is not given: the tuner's newest cached choice
// for this program, else the first built-in preference the program allows; says which, on stderr.
schedule::NamedSchedule default_schedule(const dsl::Program& program, const std::string& workload) {
  const std::string dir = exec::jit_cache_dir();
  if (auto r = tune::latest_record(program, dir)) {
    std::string sizes;
    for (const auto& [k, v] : r->key.sizes) sizes += fmt::format(" {}={}", k, v);
    fmt::print(
        stderr, "emit: schedule {}: the tuner's choice for{} on {} {} rank(s) ({}, tuned {})\n",
        r->winner, sizes, r->key.ranks, r->key.backend, record_path(r->key, dir), r->created);
    return schedule::schedule_by_name(program, r->winner);
  }
  auto chosen = schedule::first_allowed(
      program, preferences(workload),
      fmt::format("the built-in schedule preferences of workload '{}'", workload));
  if (!chosen)
    internal_error(fmt::format("no built-in preference applies to workload '{}'", workload));
  fmt::print(
      stderr,
      "emit: schedule {}: the built-in preference (no tuning record for '{}' in {}; `tandem tune "
      "{}` makes one)\n",
      chosen->schedule.name, program.name(), dir, workload);
  return std::move(chosen->schedule);
}

void run_emit(const EmitFlags& f) {
  const std::vector<std::string> targets = {"cpp", "cuda"};
  if (f.target != "cpp" && f.target != "cuda")
    user_error("--target '{}' is not a target; targets: {}", f.target, fmt::join(targets, ", "));
  const dsl::Program program = workload_program(f.workload, f.dtype, f.wire);
  if (f.list) {
    for (const auto& s : schedule::enumerate_schedules(program)) fmt::print("{}\n", s.name);
    return;
  }
  const schedule::NamedSchedule s = f.schedule.empty()
                                        ? default_schedule(program, f.workload)
                                        : schedule::schedule_by_name(program, f.schedule);
  if (f.target == "cuda") return emit_cuda(program, s, f);
  const std::string source = codegen::emit_cpp(s.schedule.lower());
  if (f.out.empty()) return fmt::print("{}", source);
  // With -o DIR the source goes to DIR/<workload>_<schedule>.cpp, as the CUDA target's .cu does.
  const fs::path file = output_folder(f.out) / (file_stem(program.name() + "_" + s.name) + ".cpp");
  io::write_file_atomic(file.string(), source);
  fmt::print("wrote {}\n", file.string());
}

}  // namespace

void add_emit(CLI::App& app) {
  auto f = std::make_shared<EmitFlags>();
  auto* cmd = app.add_subcommand(
      "emit", "Print (cpp) or write (cuda) the source generated for one schedule of a workload");
  cmd->add_option("workload", f->workload,
                  "adam, lamb, megatron_layer, pipeline_stage, gather_weights, kv_gather, "
                  "kv_grad_reduce or kv_ring")
      ->required();
  cmd->add_option("--schedule", f->schedule,
                  "The schedule's name, as `tandem tune` or --list prints it (default: the tuner's "
                  "newest cached "
                  "choice for the workload, else the built-in preference; stderr says which)");
  cmd->add_option("--target", f->target,
                  "What to emit: cpp (the CPU JIT's C++, printed) or cuda (a CUDA + NCCL program, "
                  "its Makefile and "
                  "reference results, written into -o DIR)")
      ->capture_default_str();
  cmd->add_option("-o,--out", f->out,
                  "The folder to write into (--target cuda: required; cpp: the source goes to "
                  "DIR/<workload>_<schedule>.cpp instead of stdout)");
  cmd->add_option("--ranks", f->ranks, "--target cuda: rank counts to write reference results for")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option(
      "--sizes", f->sizes,
      "--target cuda: NAME=EXTENT for the check (shrunk to at most 65536 elements a value)");
  cmd->add_option("--dtype", f->dtype,
                  "Gradient dtype (adam, lamb) or tensor dtype (layers): f32, bf16, f16");
  cmd->add_option("--wire", f->wire,
                  "Layers: the type of x, w, their product and its all-reduce (default --dtype)");
  cmd->add_flag("--list", f->list, "List the workload's schedules instead");
  cmd->callback([f] { run_emit(*f); });
}

}  // namespace tandem::cli
