// Running a program or a schedule from Python, on in-process ranks (threads, comm::run_ranks) or
// on this process's rank of an MPI job (tandem.mpi_world()), with NumPy arrays or DLPack tensors
// (arrays.h): every argument is checked before any rank starts, so a bad one is one tandem.Error
// naming it; the ranks run with the GIL released through exec::make_runner, the one entry point of
// every executor. By default the arrays are copied in and the results come back as new arrays; in
// place, the runner binds the caller's memory (exec::Runner::bind) and updates it with no copy.
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "tandem/comm/thread.h"
#include "tandem/core/error.h"
#include "tandem/exec/compiled.h"
#include "tandem/exec/runner.h"
#include "tandem/schedule/schedule.h"

namespace tandem::python {
namespace {

using dsl::Program;

// The schedule a Python value stands for: a Schedule as it is, a Program as written.
schedule::Schedule as_schedule(const py::handle& target) {
  if (py::isinstance<schedule::Schedule>(target)) return target.cast<const schedule::Schedule&>();
  if (py::isinstance<Program>(target)) return schedule::Schedule(target.cast<const Program&>());
  user_error("expected a tandem.Program or tandem.Schedule, got {}",
             std::string(py::str(target.get_type().attr("__name__"))));
}

// Everything a run needs, settled before any rank starts.
struct Call {
  const Program& original;     // the program as written: how the caller's arrays are laid out
  const schedule::Plan& plan;  // what runs; plan.program stores some inputs sliced (as_slice)
  int ranks = 1;
  int group_size = 1;
  comm::Communicator* comm = nullptr;  // MPI: this process is one rank; null: in-process ranks
  bool in_place = false;               // bind the caller's memory rather than copy it
  size_t chunk_bytes = 0;       // the collectives' chunk size (a tuned program's); 0: the default
  dsl::Segments segments = {};  // the segments' bounds, for a program with segment ops (ir.h)
  dsl::SymbolMap symbols = {};
  exec::ScalarMap scalars = {};
  // Per input, per rank: the caller's object and its memory (None / empty where the rank does not
  // hold the input, or is another process's).
  std::map<std::string, std::vector<py::object>> given = {};
  std::map<std::string, std::vector<std::optional<CallerArray>>> arrays = {};
  std::vector<exec::TensorMap> inputs = {};  // copies: per rank, as `original` lays them out

  bool mine(int rank) const { return comm == nullptr || rank == comm->rank(); }
  bool holds(int rank, const dsl::Stage& s) const {
    return s.type.group == dsl::kAllGroups || s.type.group == rank / group_size;
  }
  // Whether the schedule stores input `name` otherwise than the program declares it.
  bool restored(const std::string& name) const {
    const std::optional<int> id = plan.program.find(name);
    return id &&
           plan.program.stage(*id).type.layout != original.stage(*original.find(name)).type.layout;
  }
  // How the caller lays input `s` out: as the program declares it, or, in place, as the schedule
  // stores it (this rank's slice of an input stored sliced).
  dsl::Layout caller_layout(const dsl::Stage& s) const {
    const std::optional<int> id = plan.program.find(s.name);
    return in_place && id ? plan.program.stage(*id).type.layout : s.type.layout;
  }
};

// "N=10, B=4", for messages.
std::string symbols_str(const dsl::SymbolMap& symbols) {
  std::string out;
  for (const auto& [name, value] : symbols)
    out += fmt::format("{}{}={}", out.empty() ? "" : ", ", name, value);
  return out.empty() ? "no symbols" : out;
}

// The caller's inputs: a dict from input name to one array per rank (a list) or one array for
// every rank; under MPI, this process's rank's array. Fills call.given.
void read_inputs(Call& call, const py::dict& given) {
  const Program& p = call.original;
  std::set<std::string> names;
  for (int id : p.inputs()) names.insert(p.stage(id).name);
  for (const auto& [key, value] : given) {
    if (!py::isinstance<py::str>(key))
      user_error("program '{}': input names are strings, not {}", p.name(),
                 std::string(py::repr(key)));
    const std::string name = key.cast<std::string>();
    if (names.count(name) == 0)
      user_error("program '{}' has no input '{}'; its inputs: {}", p.name(), name,
                 fmt::join(names, ", "));
    const bool listed = py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value);
    std::vector<py::object> per_rank(static_cast<size_t>(call.ranks), py::none());
    if (call.comm != nullptr) {
      if (listed)
        user_error("input '{}': under MPI each process gives its own rank's array, not a list",
                   name);
      per_rank[static_cast<size_t>(call.comm->rank())] = py::reinterpret_borrow<py::object>(value);
    } else if (listed) {
      const py::sequence seq = py::reinterpret_borrow<py::sequence>(value);
      if (static_cast<int>(seq.size()) != call.ranks)
        user_error("input '{}': {} arrays given for {} ranks (one per rank, or one array for all)",
                   name, seq.size(), call.ranks);
      for (size_t r = 0; r < seq.size(); ++r) per_rank[r] = seq[r];
    } else {
      per_rank.assign(static_cast<size_t>(call.ranks), py::reinterpret_borrow<py::object>(value));
    }
    call.given[name] = std::move(per_rank);
  }
  std::vector<std::string> missing;
  for (const std::string& n : names)
    if (call.given.count(n) == 0) missing.push_back(n);
  if (!missing.empty())
    user_error("program '{}': no value given for input{} {}", p.name(),
               missing.size() > 1 ? "s" : "", fmt::join(missing, ", "));
}

// One array of the caller's, checked for what the run does with it: copied, it must hold float32;
// in place, the input's own dtype, and be writable.
CallerArray checked_array(const Call& call, const py::handle& h, const dsl::Stage& s,
                          const std::string& where) {
  CallerArray a = caller_array(h, where);
  const bool numpy = py::isinstance<py::array>(h);
  if (!call.in_place && a.dtype != DType::F32)
    user_error("{}: expected a float32 array, got {} (convert with {})", where, a.dtype_name,
               numpy ? "a.astype(numpy.float32)" : "t.float()");
  if (call.in_place && a.dtype != s.type.dtype)
    user_error("{}: in place, the array must have the input's dtype, {}; got {}", where,
               element_name(s.type.dtype), a.dtype_name);
  if (call.in_place && !a.writable)
    user_error("{}: the array is read-only, and a run in place writes into it", where);
  return a;
}

// Reads every array (type, dtype, count of dims) and binds the symbols the caller left out from
// the arrays' extents; then checks every shape against what the program declares (in place: what
// the schedule stores) and, in place, that no two arrays share memory.
void settle_shapes(Call& call) {
  const Program& p = call.original;
  std::map<std::string, std::string> from;  // symbol -> the input it was read from
  for (int id : p.inputs()) {
    const dsl::Stage& s = p.stage(id);
    const dsl::SymShape& shape = s.type.shape;
    const dsl::Layout layout = call.caller_layout(s);
    std::vector<py::object>& per_rank = call.given.at(s.name);
    std::vector<std::optional<CallerArray>>& arrays = call.arrays[s.name];
    arrays.assign(static_cast<size_t>(call.ranks), std::nullopt);
    for (int r = 0; r < call.ranks; ++r) {
      const std::string where = fmt::format("input '{}' on rank {}", s.name, r);
      if (!call.holds(r, s) || !call.mine(r)) continue;
      if (per_rank[r].is_none())
        user_error("{}: rank {} holds it (group {}); give its array", where, r,
                   r / call.group_size);
      const CallerArray& a = arrays[r].emplace(checked_array(call, per_rank[r], s, where));
      if (static_cast<int>(a.shape.size()) != shape.rank())
        user_error("{}: expected {} dimension{} ({}), got shape {}", where, shape.rank(),
                   shape.rank() == 1 ? "" : "s", s.type.str(), a.shape_str());
    }
    for (int i = 0; i < shape.rank(); ++i) {
      const dsl::Dim& d = shape[i];
      if (!d.is_symbol() || (call.symbols.count(d.symbol) > 0 && from.count(d.symbol) == 0))
        continue;  // an extent, or a symbol the caller bound
      // Its extent: a sliced dim's is the sum of the group's parts (under MPI, only this rank's
      // part is here: read it from another input, or give symbols=); any other, a holder's.
      const bool sliced = layout.is_sliced() && layout.dim == i;
      if (sliced && call.comm != nullptr) continue;
      int64_t extent = 0;
      bool found = false;
      for (int r = 0; r < call.ranks; ++r) {
        if (!arrays[r]) continue;
        found = true;
        const int64_t e = arrays[r]->shape[static_cast<size_t>(i)];
        if (!sliced) {
          extent = e;
          break;
        }
        if (s.type.group == dsl::kAllGroups || r / call.group_size == s.type.group) extent += e;
      }
      if (!found) continue;
      const auto [it, inserted] = call.symbols.emplace(d.symbol, extent);
      if (inserted) {
        from[d.symbol] = s.name;
      } else if (it->second != extent) {
        user_error("symbol {} is {} by input '{}' but {} by input '{}'{}", d.symbol, it->second,
                   from[d.symbol], extent, s.name,
                   layout != s.type.layout
                       ? fmt::format(" (in place, each rank gives its slice of '{}': the "
                                     "schedule stores it {})",
                                     s.name, layout.str())
                       : "");
      }
    }
  }
  const std::vector<Shape> global = p.resolve_shapes(call.symbols);  // an unbound symbol: error
  std::vector<std::pair<std::string, const CallerArray*>> seen;      // in place: name, memory
  for (int id : p.inputs()) {
    const dsl::Stage& s = p.stage(id);
    const dsl::Layout layout = call.caller_layout(s);
    for (int r = 0; r < call.ranks; ++r) {
      const std::optional<CallerArray>& a = call.arrays.at(s.name)[r];
      if (!a) continue;
      const Shape want = dsl::local_shape(global[static_cast<size_t>(id)], layout, call.group_size,
                                          r % call.group_size);
      const std::string where = fmt::format("input '{}' on rank {}", s.name, r);
      if (a->shape != want.dims())
        user_error("{}: expected shape {} ({} with {} on {} rank{}{}), got {}", where, want.str(),
                   s.type.str(), symbols_str(call.symbols), call.group_size,
                   call.group_size == 1 ? "" : "s",
                   layout != s.type.layout ? "; in place, this rank's slice: the schedule stores "
                                             "it sliced"
                                           : "",
                   a->shape_str());
      if (!call.in_place) continue;
      for (const auto& [other, memory] : seen)
        if (a->overlaps(*memory))
          user_error(
              "{} shares memory with {}: in place, each rank's inputs need memory of "
              "their own (one array per rank, no two the same)",
              where, other);
      seen.emplace_back(where, &*a);
    }
  }
}

// The caller's scalars: exactly the program's, each a number.
void read_scalars(Call& call, const py::dict& given) {
  const Program& p = call.original;
  std::set<std::string> names;
  for (int id : p.scalars()) names.insert(p.stage(id).name);
  for (const auto& [key, value] : given) {
    const std::string name = py::str(key);
    if (names.count(name) == 0)
      user_error("program '{}' has no scalar '{}'; its scalars: {}", p.name(), name,
                 names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", ")));
    if (py::isinstance<py::bool_>(value) ||
        !(py::isinstance<py::float_>(value) || py::isinstance<py::int_>(value)))
      user_error("scalar '{}': expected a number, got {}", name, std::string(py::repr(value)));
    call.scalars[name] = value.cast<double>();
  }
  std::vector<std::string> missing;
  for (const std::string& n : names)
    if (call.scalars.count(n) == 0) missing.push_back(n);
  if (!missing.empty())
    user_error("program '{}': no value given for scalar{} {}", p.name(),
               missing.size() > 1 ? "s" : "", fmt::join(missing, ", "));
}

// Copies of the arrays as tensors of their inputs' dtypes (bf16 and f16 rounded from f32).
void convert_inputs(Call& call) {
  call.inputs.assign(static_cast<size_t>(call.ranks), {});
  for (int id : call.original.inputs()) {
    const dsl::Stage& s = call.original.stage(id);
    for (int r = 0; r < call.ranks; ++r) {
      const std::optional<CallerArray>& a = call.arrays.at(s.name)[r];
      if (!a) continue;
      Tensor t = Tensor::empty(s.type.dtype, Shape(a->shape));
      const float* src = static_cast<const float*>(a->data);
      for (int64_t i = 0; i < t.numel(); ++i) t.set(i, src[i]);
      call.inputs[static_cast<size_t>(r)][s.name] = std::move(t);
    }
  }
}

// A tensor as a new float32 array of its shape.
py::array_t<float> to_array(const Tensor& t) {
  py::array_t<float> a(std::vector<py::ssize_t>(t.shape().dims().begin(), t.shape().dims().end()));
  float* dst = a.mutable_data();
  for (int64_t i = 0; i < t.numel(); ++i) dst[i] = t.get(i);
  return a;
}

// One rank's runner, set up: in place, every input it holds bound to the caller's memory.
std::unique_ptr<exec::Runner> make_rank_runner(const Call& call, exec::RunnerKind kind,
                                               std::shared_ptr<const exec::CompiledPlan> compiled,
                                               comm::Communicator& comm) {
  exec::RunnerOptions options;
  options.compiled = std::move(compiled);
  options.chunk_bytes = call.chunk_bytes;
  options.segments = call.segments;
  const auto& mine = [&](const std::string& name) -> const std::optional<CallerArray>& {
    return call.arrays.at(name)[static_cast<size_t>(comm.rank())];
  };
  if (call.in_place)
    for (int id : call.plan.program.inputs()) {
      const std::string& name = call.plan.program.stage(id).name;
      if (call.arrays.count(name) > 0 && mine(name)) options.bound.push_back(name);
    }
  std::unique_ptr<exec::Runner> runner =
      exec::make_runner(kind, call.plan, comm, call.symbols, options);
  for (const std::string& name : options.bound) runner->bind(name, mine(name)->view());
  return runner;
}

// Runs one rank: copies its inputs in (unless bound), sets the scalars, runs; returns copies of
// what it computed (of bound inputs, nothing: the caller's memory holds them).
exec::TensorMap run_rank(const Call& call, exec::Runner& runner, int rank) {
  if (!call.in_place) {
    const exec::Placement& place = runner.placement();
    for (const auto& [name, given] : call.inputs[static_cast<size_t>(rank)]) {
      const std::optional<int> id = call.plan.program.find(name);
      if (!id) continue;  // an input the schedule no longer reads
      const Tensor piece = call.restored(name)
                               ? exec::piece_of(given, call.plan.program.stage(*id).type.layout,
                                                place.group_size, place.index)
                               : given;
      const Tensor stored = runner.input(name);
      TANDEM_CHECK(stored.nbytes() == piece.nbytes(), "input '{}' stores {} bytes, given {}", name,
                   stored.nbytes(), piece.nbytes());
      std::memcpy(stored.data(), piece.data(), piece.nbytes());
    }
  }
  for (const auto& [name, value] : call.scalars) runner.set_scalar(name, value);
  runner.run();
  exec::TensorMap out;
  for (const auto& [name, t] : runner.results())
    if (!(call.in_place && call.given.count(name) > 0)) out[name] = t.clone();
  return out;
}

// What the ranks computed, by name: each rank's piece of every output and every input updated in
// place (None where a rank does not hold it). Copied, an input the schedule stores sliced comes
// back whole, as the program declares it, assembled from its group's slices (under MPI, where the
// other slices are other processes', as this rank's slice); in place, updated inputs are the
// caller's own objects. Under MPI, each name maps to this rank's piece alone.
py::dict collect(const Call& call, const std::vector<exec::TensorMap>& results) {
  const std::vector<Shape> global = call.original.resolve_shapes(call.symbols);
  std::set<std::string> names;
  for (const exec::TensorMap& r : results)
    for (const auto& [name, t] : r) names.insert(name);
  if (call.in_place)  // the inputs the program updates, which the caller's memory now holds
    for (int id : call.original.inputs())
      if (call.original.updater(id) >= 0) names.insert(call.original.stage(id).name);
  py::dict out;
  for (const std::string& name : names) {
    std::vector<py::object> per_rank(static_cast<size_t>(call.ranks), py::none());
    if (call.in_place && call.given.count(name) > 0) {
      for (int r = 0; r < call.ranks; ++r)
        if (call.arrays.at(name)[r]) per_rank[r] = call.given.at(name)[r];
    } else if (call.restored(name) && call.comm == nullptr) {  // the group's slices put together
      const int id = *call.original.find(name);
      const dsl::Layout stored = call.plan.program.stage(*call.plan.program.find(name)).type.layout;
      const Shape& whole_shape = global[static_cast<size_t>(id)];
      for (int r = 0; r < call.ranks; ++r) {
        if (results[static_cast<size_t>(r)].count(name) == 0) continue;
        const int first = r - r % call.group_size;
        if (r != first && !per_rank[static_cast<size_t>(first)].is_none()) {
          per_rank[static_cast<size_t>(r)] = per_rank[static_cast<size_t>(first)];
          continue;
        }
        Tensor whole = Tensor::empty(call.original.stage(id).type.dtype, whole_shape);
        for (int i = 0; i < call.group_size; ++i)
          exec::put_rows(whole, results[static_cast<size_t>(first + i)].at(name), stored.dim,
                         dsl::part_offset(whole_shape[stored.dim], call.group_size, i));
        per_rank[static_cast<size_t>(r)] = to_array(whole);
      }
    } else {
      for (int r = 0; r < call.ranks; ++r) {
        const auto it = results[static_cast<size_t>(r)].find(name);
        if (it != results[static_cast<size_t>(r)].end()) per_rank[r] = to_array(it->second);
      }
    }
    if (call.comm != nullptr) {
      out[py::str(name)] = per_rank[static_cast<size_t>(call.comm->rank())];
    } else {
      py::list list;
      for (py::object& o : per_rank) list.append(o);
      out[py::str(name)] = list;
    }
  }
  return out;
}

// The segments' bounds (a program with segment ops: lamb_bucket), and the count symbol of its
// segment ops (S), unless the caller bound it, as their number: the bounds say it already.
void read_segments(Call& call, const std::optional<dsl::Segments>& segments) {
  const Program& p = call.original;
  const std::vector<int> ops = p.segment_stages();
  // Here rather than in check_segments, which would first miss the count symbol.
  if (!ops.empty() && (!segments || segments->size() < 2))
    user_error(
        "program '{}' cuts its tensors into segments ({}): give their bounds, at least one "
        "segment, with segments=[0, ..., N] (one segment a tensor)",
        p.name(),
        p.stage(ops.front()).name.empty() ? fmt::format("%{}", ops.front())
                                          : p.stage(ops.front()).name);
  if (!segments) return;
  call.segments = *segments;
  for (int id : ops) {
    const dsl::Stage& s = p.stage(id);
    if (s.op != dsl::Op::SegmentNorm || !s.attrs.shape[0].is_symbol()) continue;
    call.symbols.emplace(s.attrs.shape[0].symbol, static_cast<int64_t>(call.segments.size()) - 1);
  }
}

// Reads and checks every argument but the scalars: the rank count (the communicator's under MPI),
// the arrays, the symbols.
void settle(Call& call, const py::dict& inputs, std::optional<int> ranks,
            const std::optional<dsl::SymbolMap>& symbols,
            const std::optional<dsl::Segments>& segments) {
  const Program& original = call.original;
  if (call.comm != nullptr) {
    if (ranks && *ranks != call.comm->size())
      user_error("ranks={} under MPI: the job has {} processes, one a rank", *ranks,
                 call.comm->size());
    call.ranks = call.comm->size();
  } else if (ranks) {
    call.ranks = *ranks;
  } else {  // the length of the first list given, else 1
    for (const auto& [key, value] : inputs)
      if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
        call.ranks = static_cast<int>(py::len(value));
        break;
      }
  }
  if (call.comm == nullptr && (call.ranks < 1 || call.ranks > comm::kMaxThreadRanks))
    user_error("ranks must be between 1 and {}, not {}", comm::kMaxThreadRanks, call.ranks);
  if (call.ranks % original.groups() != 0)
    user_error("program '{}' has {} groups: the rank count must be a multiple of it, not {}",
               original.name(), original.groups(), call.ranks);
  call.group_size = call.ranks / original.groups();
  if (symbols) call.symbols = *symbols;
  read_segments(call, segments);
  read_inputs(call, inputs);
  settle_shapes(call);
  // The bounds against the program (ascending from 0 to the segmented extent, as many as its
  // count symbol), before any rank starts: the runners check them again, each on its own.
  original.check_segments(call.symbols, call.segments);
  if (!call.in_place) convert_inputs(call);
}

// The communicator a Python value names: None (in-process ranks) or a tandem.Communicator.
std::shared_ptr<comm::Communicator> as_comm(const py::object& comm) {
  if (comm.is_none()) return nullptr;
  if (!py::isinstance<PyComm>(comm))
    user_error("comm: expected a tandem.Communicator (tandem.mpi_world()) or None, got {}",
               type_name(comm));
  return comm.cast<const PyComm&>().comm;
}

// A schedule set up on this process's rank of a communicator, its inputs read (and, in place,
// bound) once, ready to run any number of times: what a training step calls.
class Bound {
 public:
  Bound(dsl::Program original, schedule::Plan plan, exec::RunnerKind kind,
        std::shared_ptr<const exec::CompiledPlan> compiled,
        std::shared_ptr<comm::Communicator> comm, const py::dict& inputs, bool in_place,
        const std::optional<dsl::SymbolMap>& symbols, const std::optional<dsl::Segments>& segments,
        size_t chunk_bytes = 0)
      : original_(std::move(original)),
        plan_(std::move(plan)),
        comm_(std::move(comm)),
        call_(original_, plan_) {
    call_.comm = comm_.get();
    call_.in_place = in_place;
    call_.chunk_bytes = chunk_bytes;
    settle(call_, inputs, std::nullopt, symbols, segments);
    py::gil_scoped_release nogil;  // sets up with its peers: splits, allocations
    runner_ = make_rank_runner(call_, kind, std::move(compiled), *comm_);
  }

  py::dict run(const std::optional<py::dict>& scalars) {
    call_.scalars.clear();
    read_scalars(call_, scalars.value_or(py::dict()));
    std::vector<exec::TensorMap> results(static_cast<size_t>(call_.ranks));
    {
      py::gil_scoped_release nogil;
      results[static_cast<size_t>(comm_->rank())] = run_rank(call_, *runner_, comm_->rank());
    }
    return collect(call_, results);
  }

 private:
  dsl::Program original_;
  schedule::Plan plan_;
  std::shared_ptr<comm::Communicator> comm_;
  Call call_;
  std::unique_ptr<exec::Runner> runner_;
};

// Reads and checks every argument of a run, then runs it: on in-process ranks, or (comm given)
// on this process's rank.
py::dict run(const Program& original, const schedule::Plan& plan, exec::RunnerKind kind,
             std::shared_ptr<const exec::CompiledPlan> compiled, const py::dict& inputs,
             const std::optional<py::dict>& scalars, std::optional<int> ranks,
             const std::optional<dsl::SymbolMap>& symbols,
             const std::optional<dsl::Segments>& segments, bool in_place, const py::object& comm) {
  if (std::shared_ptr<comm::Communicator> c = as_comm(comm)) {
    if (ranks && *ranks != c->size())
      user_error("ranks={} under MPI: the job has {} processes, one a rank", *ranks, c->size());
    return Bound(original, plan, kind, std::move(compiled), std::move(c), inputs, in_place, symbols,
                 segments)
        .run(scalars);
  }
  Call call{original, plan};
  call.in_place = in_place;
  settle(call, inputs, ranks, symbols, segments);
  read_scalars(call, scalars.value_or(py::dict()));
  std::vector<exec::TensorMap> results(static_cast<size_t>(call.ranks));
  {
    py::gil_scoped_release nogil;
    comm::run_ranks(call.ranks, [&](comm::Communicator& c) {
      const std::unique_ptr<exec::Runner> runner = make_rank_runner(call, kind, compiled, c);
      results[static_cast<size_t>(c.rank())] = run_rank(call, *runner, c.rank());
    });
  }
  return collect(call, results);
}

// A schedule compiled by the CPU JIT, ready to run many times.
struct Compiled {
  dsl::Program original;
  std::shared_ptr<const exec::CompiledPlan> plan;
};

std::shared_ptr<const exec::CompiledPlan> compile(const schedule::Plan& plan) {
  py::gil_scoped_release nogil;  // compiling takes seconds the first time
  return exec::compile_plan(plan);
}

const char* const kRunDoc =
    "inputs: a dict from each input's name to its arrays: NumPy arrays or tensors with __dlpack__ "
    "(torch.Tensor), C-contiguous, in CPU memory. On in-process ranks, a list with one array per "
    "rank (this rank's piece as the program declares it: the whole tensor for Local and "
    "Replicated, this rank's part for Sliced; None for a rank outside the input's group), or one "
    "array for every rank; under MPI (comm given), this process's array.\n"
    "scalars: a dict from each scalar's name to its value.\nranks: the number of in-process ranks "
    "(default: the length of the lists).\nsymbols: extents of symbolic dims (default: read from "
    "the arrays).\nsegments: for a program with segment ops (lamb_bucket), the bounds that cut "
    "its tensors into segments: 0 < b1 < ... < N, one segment a tensor of the bucket (its count "
    "symbol, S, is their number unless symbols gives it).\nin_place: False (the default): the "
    "arrays must hold float32 (bf16 and f16 "
    "inputs are rounded from them); they are copied, never changed. True: each array must have "
    "its input's dtype and be the piece the schedule stores (this rank's slice of an input stored "
    "sliced); the run reads and updates it where it lies, with no copy; each rank needs arrays of "
    "its own, and an input the program does not update may be left holding intermediate values "
    "(the reduce-scatter's in the gradient's memory).\ncomm: None (in-process ranks, the "
    "default) or a tandem.Communicator (tandem.mpi_world()): this process is one rank of the "
    "job, and every process of it calls run together.\nReturns a dict from each output's and "
    "each updated input's name to a list of arrays, one per rank (under MPI, this rank's alone; "
    "None where a rank does not hold it): new float32 arrays (an input the schedule stores sliced "
    "whole, as the program declares it; under MPI this rank's slice), or, in place, the "
    "caller's own for the updated inputs.";

}  // namespace

void bind_run(py::module_& m) {
  m.def(
      "run",
      [](const py::object& target, const py::dict& inputs, const std::optional<py::dict>& scalars,
         std::optional<int> ranks, const std::optional<dsl::SymbolMap>& symbols,
         const std::optional<dsl::Segments>& segments, const std::string& executor, bool in_place,
         const py::object& comm) {
        const exec::RunnerKind kind = exec::runner_kind_from_name(executor, "executor");
        const schedule::Schedule s = as_schedule(target);
        const schedule::Plan plan = s.lower();
        const auto compiled = kind == exec::RunnerKind::Compiled ? compile(plan) : nullptr;
        return run(s.original(), compiled ? compiled->plan() : plan, kind, compiled, inputs,
                   scalars, ranks, symbols, segments, in_place, comm);
      },
      py::arg("target"), py::arg("inputs"), py::arg("scalars") = py::none(), py::kw_only(),
      py::arg("ranks") = py::none(), py::arg("symbols") = py::none(),
      py::arg("segments") = py::none(), py::arg("executor") = "reference",
      py::arg("in_place") = false, py::arg("comm") = py::none(),
      (std::string("Runs a Program or Schedule once. executor: 'reference' (the interpreter, the "
                   "default), 'plan' or 'compiled' (the CPU JIT).\n") +
       kRunDoc)
          .c_str());

  py::class_<Compiled>(m, "Compiled",
                       "A schedule emitted as C++, compiled by the system compiler and loaded "
                       "(found in the JIT's cache when compiled before).")
      .def_property_readonly(
          "name", [](const Compiled& c) { return c.plan->plan().name; }, "The schedule's name.")
      .def_property_readonly(
          "source", [](const Compiled& c) { return c.plan->source(); }, "The emitted C++.")
      .def_property_readonly(
          "compiled_now", [](const Compiled& c) { return c.plan->compiled_now(); },
          "False when it came from the cache.")
      .def(
          "run",
          [](const Compiled& c, const py::dict& inputs, const std::optional<py::dict>& scalars,
             std::optional<int> ranks, const std::optional<dsl::SymbolMap>& symbols,
             const std::optional<dsl::Segments>& segments, bool in_place, const py::object& comm) {
            return run(c.original, c.plan->plan(), exec::RunnerKind::Compiled, c.plan, inputs,
                       scalars, ranks, symbols, segments, in_place, comm);
          },
          py::arg("inputs"), py::arg("scalars") = py::none(), py::kw_only(),
          py::arg("ranks") = py::none(), py::arg("symbols") = py::none(),
          py::arg("segments") = py::none(), py::arg("in_place") = false,
          py::arg("comm") = py::none(),
          (std::string("Runs the compiled schedule once.\n") + kRunDoc).c_str())
      .def(
          "bind",
          [](const Compiled& c, const py::dict& inputs, const py::object& comm,
             const std::optional<dsl::SymbolMap>& symbols,
             const std::optional<dsl::Segments>& segments, bool in_place, int64_t chunk_bytes) {
            std::shared_ptr<comm::Communicator> world = as_comm(comm);
            if (!world)
              user_error(
                  "Compiled.bind: give comm=tandem.mpi_world(); in-process ranks run "
                  "with Compiled.run");
            if (chunk_bytes < 0)
              user_error("Compiled.bind: chunk_bytes {} is negative (0: the default chunk size)",
                         chunk_bytes);
            return std::make_unique<Bound>(c.original, c.plan->plan(), exec::RunnerKind::Compiled,
                                           c.plan, std::move(world), inputs, in_place, symbols,
                                           segments, static_cast<size_t>(chunk_bytes));
          },
          py::arg("inputs"), py::kw_only(), py::arg("comm"), py::arg("symbols") = py::none(),
          py::arg("segments") = py::none(), py::arg("in_place") = true, py::arg("chunk_bytes") = 0,
          "Sets the compiled schedule up on this process's rank of `comm` with its inputs (in "
          "place by default: bound to the arrays, which must outlive it) and returns a Bound, "
          "whose run(scalars) runs it: a training step's call, with no set-up per run. Arguments "
          "as run's; chunk_bytes: the collectives' chunk size (a TuneRecord's; 0: the process's "
          "default). Under MPI, arrays from comm.empty (the shared arena) let the collectives "
          "read the peers' memory where it lies; others take the ring.");
  py::class_<Bound>(m, "Bound",
                    "A compiled schedule set up on this process's rank, its inputs bound: "
                    "Compiled.bind.")
      .def("run", &Bound::run, py::arg("scalars") = py::none(),
           "Runs once (every process of the job together); returns what run returns.");
  m.def(
      "compile",
      [](const py::object& target) {
        const schedule::Schedule s = as_schedule(target);
        return Compiled{s.original(), compile(s.lower())};
      },
      py::arg("target"), "Compiles a Program or Schedule with the CPU JIT; returns a Compiled.");
}

}  // namespace tandem::python
