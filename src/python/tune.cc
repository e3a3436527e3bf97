// The autotuner from Python: tandem.tune searches a program's schedules on in-process ranks or on
// the processes of an MPI job, with tune::tune and the same options and defaults as `tandem tune`,
// so its records land in the same cache under the same keys (a record made from Python is the one
// the command reads, and the other way round); tandem.tuned reads the record a tune with default
// options would read, without timing anything (what DistributedFusedAdamW asks).
#include "tandem/tune/tune.h"

#include <fmt/format.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "tandem/comm/agree.h"
#include "tandem/comm/thread.h"
#include "tandem/core/blas.h"
#include "tandem/core/error.h"
#include "tandem/exec/jit.h"
#include "tandem/exec/runner.h"
#include "tandem/schedule/schedule.h"

namespace tandem::python {
namespace {

using dsl::Program;

// The program a Python value names; a Schedule is refused: the tuner searches a program's.
const Program& as_program(const py::handle& target, const char* call) {
  if (py::isinstance<Program>(target)) return target.cast<const Program&>();
  if (py::isinstance<schedule::Schedule>(target))
    user_error("{}: give the tandem.Program (schedule.original); the tuner searches its schedules",
               call);
  user_error("{}: expected a tandem.Program, got {}", call,
             std::string(py::str(target.get_type().attr("__name__"))));
}

// {"N": 4096} or {"N": "4Mi"}: every symbol's extent, as `tandem tune --size` reads them.
dsl::SymbolMap as_sizes(const py::handle& sizes, const char* call) {
  if (!py::isinstance<py::dict>(sizes))
    user_error("{}: sizes must be a dict from each symbol to its extent ({{'N': 4096}}), not {}",
               call, std::string(py::repr(sizes)));
  dsl::SymbolMap out;
  for (const auto& [key, value] : sizes.cast<py::dict>()) {
    if (!py::isinstance<py::str>(key))
      user_error("{}: sizes: symbol names are strings, not {}", call, std::string(py::repr(key)));
    const std::string name = key.cast<std::string>();
    if (py::isinstance<py::bool_>(value))
      user_error("{}: sizes['{}'] is a bool; give an extent", call, name);
    if (py::isinstance<py::int_>(value))
      out[name] = value.cast<int64_t>();
    else if (py::isinstance<py::str>(value))
      out[name] = tune::parse_extent(value.cast<std::string>(), fmt::format("sizes['{}']", name));
    else
      user_error("{}: sizes['{}'] is {}; give an extent (4096 or '4Mi')", call, name,
                 std::string(py::repr(value)));
  }
  return out;
}

std::shared_ptr<comm::Communicator> comm_of(const py::object& comm, const char* call) {
  if (comm.is_none()) return nullptr;
  if (!py::isinstance<PyComm>(comm))
    user_error("{}: comm: expected a tandem.Communicator (tandem.mpi_world()) or None, got {}",
               call, std::string(py::str(comm.get_type().attr("__name__"))));
  return comm.cast<const PyComm&>().comm;
}

// The in-process rank count (default 2, as `tandem tune`'s), or, with a communicator, its size
// (a ranks= that differs is an error rather than ignored).
int ranks_of(std::optional<int> ranks, const comm::Communicator* world, const char* call) {
  if (world != nullptr) {
    if (ranks && *ranks != world->size())
      user_error("{}: ranks={} but comm has {} ranks (one a process); leave ranks out with comm",
                 call, *ranks, world->size());
    return world->size();
  }
  const int n = ranks.value_or(2);
  if (n < 1 || n > comm::kMaxThreadRanks)
    user_error("{}: ranks must be between 1 and {} (threads of this process), not {}", call,
               comm::kMaxThreadRanks, n);
  return n;
}

// On in-process ranks the command gives each rank's BLAS its share of the cores (src/cli/tune.cc),
// and the BLAS thread count is part of the key: so does this, for the call, to find the command's
// records. Restored after.
class BlasShare {
 public:
  explicit BlasShare(int ranks) : before_(blas::num_threads()) {
    blas::set_num_threads(tune::thread_rank_blas_threads(ranks));
  }
  ~BlasShare() { blas::set_num_threads(before_); }
  BlasShare(const BlasShare&) = delete;
  BlasShare& operator=(const BlasShare&) = delete;

 private:
  int before_;
};

py::dict candidate_dict(const tune::CandidateTiming& c) {
  py::dict d;
  d["name"] = c.name;
  d["ok"] = c.ok;
  d["error"] = c.error;
  d["max_error"] = c.max_error;
  d["times"] = c.times;
  d["final_times"] = c.final_times;
  d["median"] = c.ok && !c.times.empty() ? py::cast(c.median()) : py::none();
  return d;
}

// The options every search-describing argument sets, as `tandem tune`'s flags set them: what the
// key depends on besides the program and the ranks.
tune::TuneOptions options_of(const py::object& sizes,
                             const std::optional<std::vector<std::string>>& schedules,
                             std::optional<double> budget,
                             const std::optional<std::vector<int>>& blocks,
                             const std::optional<std::vector<py::object>>& chunks,
                             const std::string& executor, const char* call) {
  tune::TuneOptions o;
  o.sizes = as_sizes(sizes, call);
  o.executor = tune::executor_of(exec::runner_kind_from_name(executor, "executor"));
  if (schedules) o.only = *schedules;
  if (budget) {
    if (!(*budget >= 0)) user_error("{}: budget must be >= 0 seconds, not {}", call, *budget);
    o.budget_s = *budget;
  }
  if (blocks) {
    for (int b : *blocks)
      if (b < 1)
        user_error("{}: blocks: {} is not a block count (an overlap needs at least 1)", call, b);
    o.blocks = *blocks;
  }
  if (chunks) {
    o.chunk_bytes.clear();
    for (const py::object& c : *chunks) {
      int64_t b = 0;
      if (py::isinstance<py::str>(c))
        b = tune::parse_extent(c.cast<std::string>(), "chunks");
      else if (py::isinstance<py::int_>(c) && !py::isinstance<py::bool_>(c))
        b = c.cast<int64_t>();
      else
        user_error("{}: chunks: {} is not a size in bytes (65536 or '64Ki')", call,
                   std::string(py::repr(c)));
      if (b < 1) user_error("{}: chunks: {} is not a chunk size (at least 1 byte)", call, b);
      o.chunk_bytes.push_back(static_cast<size_t>(b));
    }
  }
  return o;
}

// The record found for `key` on rank 0 of `comm`, the same on every rank (nullopt: none).
std::optional<tune::TuneRecord> agreed_record(comm::Communicator& comm, const tune::TuneKey& key,
                                              const std::string& dir) {
  std::string text;
  if (comm.rank() == 0)
    if (auto r = tune::load_record(key, dir)) text = tune::record_to_json(*r, -1);
  text = comm::broadcast_string(comm, text);
  if (text.empty()) return std::nullopt;
  return tune::record_from_json(text);
}

}  // namespace

void bind_tune(py::module_& m) {
  py::class_<tune::TuneRecord>(m, "TuneRecord",
                               "What the autotuner measured for one key (program, sizes, ranks, "
                               "backend, executor, machine, search), as its cache file holds it.")
      .def_property_readonly(
          "winner", [](const tune::TuneRecord& r) { return r.winner; },
          "The fastest schedule's name (a recipe: tandem.schedule(program, winner)).")
      .def_property_readonly(
          "chunk_bytes", [](const tune::TuneRecord& r) { return r.chunk_bytes; },
          "The collectives' chunk size the winner runs fastest at (0: the process's default); "
          "pass it to Compiled.bind.")
      .def_property_readonly(
          "program", [](const tune::TuneRecord& r) { return r.key.program; }, "Its name.")
      .def_property_readonly(
          "sizes", [](const tune::TuneRecord& r) { return r.key.sizes; }, "Every symbol's extent.")
      .def_property_readonly(
          "ranks", [](const tune::TuneRecord& r) { return r.key.ranks; }, "The rank count.")
      .def_property_readonly(
          "backend", [](const tune::TuneRecord& r) { return r.key.backend; }, "'thread' or 'mpi'.")
      .def_property_readonly(
          "executor", [](const tune::TuneRecord& r) { return r.key.executor; },
          "'compiled', 'plan' or 'reference'.")
      .def_property_readonly(
          "machine", [](const tune::TuneRecord& r) { return r.key.machine; },
          "The CPU and the BLAS threads it was timed on.")
      .def_property_readonly(
          "created", [](const tune::TuneRecord& r) { return r.created; }, "UTC, ISO 8601.")
      .def_property_readonly(
          "candidates",
          [](const tune::TuneRecord& r) {
            py::list out;
            for (const tune::CandidateTiming& c : r.candidates) out.append(candidate_dict(c));
            return out;
          },
          "Every schedule timed, in order (the first is the unscheduled baseline): dicts with "
          "name, ok, error, max_error, times and final_times (seconds, each the slowest rank's) "
          "and median.")
      .def(
          "json", [](const tune::TuneRecord& r) { return tune::record_to_json(r); },
          "The record as its cache file holds it.")
      .def("__repr__", [](const tune::TuneRecord& r) {
        return fmt::format("<tandem.TuneRecord {}: winner '{}'>", r.key.str(), r.winner);
      });

  py::class_<tune::TuneResult>(m, "TuneResult", "What tandem.tune returns.")
      .def_property_readonly(
          "record", [](const tune::TuneResult& r) { return r.record; }, "The TuneRecord.")
      .def_property_readonly(
          "winner", [](const tune::TuneResult& r) { return r.record.winner; },
          "The fastest schedule's name.")
      .def_property_readonly(
          "chunk_bytes", [](const tune::TuneResult& r) { return r.record.chunk_bytes; },
          "The chunk size the winner runs at (0: the default).")
      .def_property_readonly(
          "from_cache", [](const tune::TuneResult& r) { return r.from_cache; },
          "True when the record was read from the cache: nothing was timed or compiled.")
      .def_property_readonly(
          "cache_file", [](const tune::TuneResult& r) { return r.cache_file; },
          "The record's path ('' when neither read nor written).")
      .def(
          "speedup",
          [](const tune::TuneResult& r, const std::optional<std::string>& name) {
            const std::string want = name.value_or(r.record.winner);
            for (const tune::CandidateTiming& c : r.record.candidates)
              if (c.name == want) return r.speedup(c);
            user_error("tune result: no schedule '{}' was timed", want);
          },
          py::arg("name") = py::none(),
          "The baseline's median over the schedule's (default: the winner's); above 1 is faster.")
      .def("__repr__", [](const tune::TuneResult& r) {
        return fmt::format("<tandem.TuneResult winner '{}'{}>", r.record.winner,
                           r.from_cache ? " (from the cache)" : "");
      });

  m.def(
      "tune",
      [](const py::object& target, const py::object& sizes, std::optional<int> ranks_given,
         const py::object& comm, const std::optional<std::vector<std::string>>& schedules, int reps,
         int warmup, std::optional<double> budget, const std::optional<std::vector<int>>& blocks,
         const std::optional<std::vector<py::object>>& chunks, bool retune,
         const std::string& executor) {
        const Program& program = as_program(target, "tune");
        tune::TuneOptions o =
            options_of(sizes, schedules, budget, blocks, chunks, executor, "tune");
        if (reps < 1) user_error("tune: reps must be at least 1, not {}", reps);
        if (warmup < 0) user_error("tune: warmup must be >= 0, not {}", warmup);
        o.reps = reps;
        o.warmup = warmup;
        o.read_cache = !retune;
        const std::shared_ptr<comm::Communicator> world = comm_of(comm, "tune");
        const int ranks = ranks_of(ranks_given, world.get(), "tune");
        py::gil_scoped_release nogil;  // seconds to minutes: every schedule compiled and timed
        if (world) return tune::tune(program, *world, o);
        const BlasShare share(ranks);
        return tune::tune_threads(program, ranks, o);
      },
      py::arg("program"), py::arg("sizes"), py::kw_only(), py::arg("ranks") = py::none(),
      py::arg("comm") = py::none(), py::arg("schedules") = py::none(), py::arg("reps") = 5,
      py::arg("warmup") = 1, py::arg("budget") = py::none(), py::arg("blocks") = py::none(),
      py::arg("chunks") = py::none(), py::arg("retune") = false, py::arg("executor") = "compiled",
      "Searches the schedules of `program` and keeps the fastest, as `tandem tune` does, with its "
      "defaults and its cache (records under the JIT cache folder, shared with the command: same "
      "key, same file). sizes: every symbol's extent ({'N': 4096} or {'N': '4Mi'}). ranks: "
      "in-process ranks (threads, default 2) when comm is None; comm=tandem.mpi_world(): the "
      "processes of "
      "the MPI job, every one calling tune together. schedules: time only these recipes and the "
      "baseline (--schedules); reps, warmup, budget (seconds), blocks, chunks (bytes, or '256Ki'; "
      "[] for no chunk round), retune (--retune: time again even when a record exists), executor "
      "('compiled', 'plan', 'reference') as the command's flags. Options other than the "
      "defaults make another key, as they do for the command. Returns a TuneResult.");

  m.def(
      "tuned",
      [](const py::object& target, const py::object& sizes, std::optional<int> ranks_given,
         const py::object& comm, const std::optional<std::vector<std::string>>& schedules,
         std::optional<double> budget, const std::optional<std::vector<int>>& blocks,
         const std::optional<std::vector<py::object>>& chunks,
         const std::string& executor) -> std::optional<tune::TuneRecord> {
        const Program& program = as_program(target, "tuned");
        const tune::TuneOptions o =
            options_of(sizes, schedules, budget, blocks, chunks, executor, "tuned");
        const std::string dir = exec::jit_cache_dir();
        const std::shared_ptr<comm::Communicator> world = comm_of(comm, "tuned");
        const int ranks = ranks_of(ranks_given, world.get(), "tuned");
        py::gil_scoped_release nogil;
        if (world) return agreed_record(*world, tune::tune_key(program, *world, o), dir);
        const BlasShare share(ranks);
        std::optional<tune::TuneRecord> found;
        comm::run_ranks(ranks, [&](comm::Communicator& c) {  // the key needs the ranks' group
          if (c.rank() == 0)
            if (auto r = tune::load_record(tune::tune_key(program, c, o), dir)) found = *r;
        });
        return found;
      },
      py::arg("program"), py::arg("sizes"), py::kw_only(), py::arg("ranks") = py::none(),
      py::arg("comm") = py::none(), py::arg("schedules") = py::none(),
      py::arg("budget") = py::none(), py::arg("blocks") = py::none(),
      py::arg("chunks") = py::none(), py::arg("executor") = "compiled",
      "The record tandem.tune(program, sizes, ...) with the same arguments would read (the same "
      "one `tandem tune` reads and writes), or None when there is none; times "
      "nothing. Under MPI (comm given) every process calls it together and all get rank 0's.");
}

}  // namespace tandem::python
