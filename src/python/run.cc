// Running a program or a schedule from Python on in-process ranks (threads, comm::run_ranks) with
// NumPy float32 arrays: every argument is checked before any rank starts, so a bad one is one
// tandem.Error naming it; the ranks run with the GIL released through exec::make_runner, the one
// entry point of every executor; what they computed comes back as new arrays.
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <vector>

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

std::string shape_str(const py::array& a) {
  std::vector<int64_t> dims(a.shape(), a.shape() + a.ndim());
  return Shape(dims).str();
}

// A NumPy array of float32, C-contiguous; else one UserError naming `where`.
py::array checked_array(const py::handle& h, const std::string& where) {
  if (!py::isinstance<py::array>(h))
    user_error("{}: expected a NumPy float32 array, got {}", where,
               std::string(py::str(h.get_type().attr("__name__"))));
  py::array a = py::reinterpret_borrow<py::array>(h);
  if (!a.dtype().is(py::dtype::of<float>()))
    user_error("{}: expected a float32 array, got {} (convert with a.astype(numpy.float32))", where,
               std::string(py::str(a.dtype())));
  if ((a.flags() & py::array::c_style) == 0)
    user_error("{}: the array is not C-contiguous (pass numpy.ascontiguousarray(a))", where);
  return a;
}

// Everything a run needs, settled before any rank starts.
struct Call {
  const Program& original;     // the program as written: how the caller's arrays are laid out
  const schedule::Plan& plan;  // what runs; plan.program stores some inputs sliced (as_slice)
  int ranks = 1;
  int group_size = 1;
  dsl::SymbolMap symbols = {};
  exec::ScalarMap scalars = {};
  std::vector<exec::TensorMap> inputs =
      {};  // per rank: each input it holds, as `original` lays it out

  bool holds(int rank, const dsl::Stage& s) const {
    return s.type.group == dsl::kAllGroups || s.type.group == rank / group_size;
  }
  // Whether the schedule stores input `name` otherwise than the program declares it.
  bool restored(const std::string& name) const {
    const std::optional<int> id = plan.program.find(name);
    return id &&
           plan.program.stage(*id).type.layout != original.stage(*original.find(name)).type.layout;
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
// every rank. Returns, per input, each rank's array (None where the rank does not hold it).
std::map<std::string, std::vector<py::object>> read_inputs(const Call& call,
                                                           const py::dict& given) {
  const Program& p = call.original;
  std::set<std::string> names;
  for (int id : p.inputs()) names.insert(p.stage(id).name);
  std::map<std::string, std::vector<py::object>> out;
  for (const auto& [key, value] : given) {
    if (!py::isinstance<py::str>(key))
      user_error("program '{}': input names are strings, not {}", p.name(),
                 std::string(py::repr(key)));
    const std::string name = key.cast<std::string>();
    if (names.count(name) == 0)
      user_error("program '{}' has no input '{}'; its inputs: {}", p.name(), name,
                 fmt::join(names, ", "));
    std::vector<py::object> per_rank;
    if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
      const py::sequence seq = py::reinterpret_borrow<py::sequence>(value);
      if (static_cast<int>(seq.size()) != call.ranks)
        user_error("input '{}': {} arrays given for {} ranks (one per rank, or one array for all)",
                   name, seq.size(), call.ranks);
      for (const py::handle h : seq) per_rank.push_back(py::reinterpret_borrow<py::object>(h));
    } else {
      per_rank.assign(static_cast<size_t>(call.ranks), py::reinterpret_borrow<py::object>(value));
    }
    out[name] = std::move(per_rank);
  }
  std::vector<std::string> missing;
  for (const std::string& n : names)
    if (out.count(n) == 0) missing.push_back(n);
  if (!missing.empty())
    user_error("program '{}': no value given for input{} {}", p.name(),
               missing.size() > 1 ? "s" : "", fmt::join(missing, ", "));
  return out;
}

// Checks every array (type, rank count of dims) and binds the symbols the caller left out from
// the arrays' extents; then checks every shape against what the program declares.
void settle_shapes(Call& call, std::map<std::string, std::vector<py::object>>& arrays) {
  const Program& p = call.original;
  std::map<std::string, std::string> from;  // symbol -> the input it was read from
  for (int id : p.inputs()) {
    const dsl::Stage& s = p.stage(id);
    const dsl::SymShape& shape = s.type.shape;
    std::vector<py::object>& per_rank = arrays.at(s.name);
    for (int r = 0; r < call.ranks; ++r) {
      const std::string where = fmt::format("input '{}' on rank {}", s.name, r);
      if (!call.holds(r, s)) continue;
      if (per_rank[r].is_none())
        user_error("{}: rank {} holds it (group {}); give its array", where, r,
                   r / call.group_size);
      per_rank[r] = checked_array(per_rank[r], where);
      const py::array a = per_rank[r].cast<py::array>();
      if (a.ndim() != shape.rank())
        user_error("{}: expected {} dimension{} ({}), got shape {}", where, shape.rank(),
                   shape.rank() == 1 ? "" : "s", s.type.str(), shape_str(a));
    }
    for (int i = 0; i < shape.rank(); ++i) {
      const dsl::Dim& d = shape[i];
      if (!d.is_symbol() || (call.symbols.count(d.symbol) > 0 && from.count(d.symbol) == 0))
        continue;  // an extent, or a symbol the caller bound
      // Its extent: a sliced dim's is the sum of the group's parts; any other, the first holder's.
      int64_t extent = 0;
      for (int r = 0; r < call.ranks; ++r) {
        if (!call.holds(r, s)) continue;
        const int64_t e = per_rank[r].cast<py::array>().shape(i);
        const bool sliced = s.type.layout.is_sliced() && s.type.layout.dim == i;
        if (!sliced) {
          extent = e;
          break;
        }
        if (s.type.group == dsl::kAllGroups || r / call.group_size == s.type.group) extent += e;
      }
      const auto [it, inserted] = call.symbols.emplace(d.symbol, extent);
      if (inserted) {
        from[d.symbol] = s.name;
      } else if (it->second != extent) {
        user_error("symbol {} is {} by input '{}' but {} by input '{}'", d.symbol, it->second,
                   from[d.symbol], extent, s.name);
      }
    }
  }
  const std::vector<Shape> global = p.resolve_shapes(call.symbols);  // an unbound symbol: error
  for (int id : p.inputs()) {
    const dsl::Stage& s = p.stage(id);
    for (int r = 0; r < call.ranks; ++r) {
      if (!call.holds(r, s)) continue;
      const Shape want = dsl::local_shape(global[static_cast<size_t>(id)], s.type.layout,
                                          call.group_size, r % call.group_size);
      const py::array a = arrays.at(s.name)[r].cast<py::array>();
      if (std::vector<int64_t>(a.shape(), a.shape() + a.ndim()) != want.dims())
        user_error("input '{}' on rank {}: expected shape {} ({} with {} on {} rank{}), got {}",
                   s.name, r, want.str(), s.type.str(), symbols_str(call.symbols), call.group_size,
                   call.group_size == 1 ? "" : "s", shape_str(a));
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

// The arrays as tensors of their inputs' dtypes (bf16 and f16 rounded from the f32 values).
void convert_inputs(Call& call, const std::map<std::string, std::vector<py::object>>& arrays) {
  call.inputs.assign(static_cast<size_t>(call.ranks), {});
  for (int id : call.original.inputs()) {
    const dsl::Stage& s = call.original.stage(id);
    for (int r = 0; r < call.ranks; ++r) {
      if (!call.holds(r, s)) continue;
      const py::array a = arrays.at(s.name)[r].cast<py::array>();
      Tensor t =
          Tensor::empty(s.type.dtype, Shape(std::vector<int64_t>(a.shape(), a.shape() + a.ndim())));
      const float* src = static_cast<const float*>(a.data());
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

// Runs the call on its ranks; returns, by name, each rank's piece of every output and every input
// updated in place (None where a rank does not hold it). An input the schedule stores sliced comes
// back whole, as the program declares it, assembled from its group's slices.
py::dict run_call(Call& call, exec::RunnerKind kind,
                  std::shared_ptr<const exec::CompiledPlan> compiled) {
  std::vector<exec::TensorMap> results(static_cast<size_t>(call.ranks));
  {
    py::gil_scoped_release nogil;
    comm::run_ranks(call.ranks, [&](comm::Communicator& comm) {
      exec::RunnerOptions options;
      options.compiled = compiled;
      const std::unique_ptr<exec::Runner> runner =
          exec::make_runner(kind, call.plan, comm, call.symbols, options);
      const exec::Placement& place = runner->placement();
      for (const auto& [name, given] : call.inputs[static_cast<size_t>(comm.rank())]) {
        const std::optional<int> id = call.plan.program.find(name);
        if (!id) continue;  // an input the schedule no longer reads
        const Tensor piece = call.restored(name)
                                 ? exec::piece_of(given, call.plan.program.stage(*id).type.layout,
                                                  place.group_size, place.index)
                                 : given;
        const Tensor stored = runner->input(name);
        TANDEM_CHECK(stored.nbytes() == piece.nbytes(), "input '{}' stores {} bytes, given {}",
                     name, stored.nbytes(), piece.nbytes());
        std::memcpy(stored.data(), piece.data(), piece.nbytes());
      }
      for (const auto& [name, value] : call.scalars) runner->set_scalar(name, value);
      runner->run();
      for (const auto& [name, t] : runner->results())
        results[static_cast<size_t>(comm.rank())][name] = t.clone();
    });
  }
  const std::vector<Shape> global = call.original.resolve_shapes(call.symbols);
  std::set<std::string> names;
  for (const exec::TensorMap& r : results)
    for (const auto& [name, t] : r) names.insert(name);
  py::dict out;
  for (const std::string& name : names) {
    py::list per_rank;
    if (call.restored(name)) {  // the slices of each group put together
      const int id = *call.original.find(name);
      const dsl::Layout stored = call.plan.program.stage(*call.plan.program.find(name)).type.layout;
      const Shape& whole_shape = global[static_cast<size_t>(id)];
      std::vector<py::object> wholes(static_cast<size_t>(call.ranks), py::none());
      for (int r = 0; r < call.ranks; ++r) {
        if (results[static_cast<size_t>(r)].count(name) == 0) continue;
        const int first = r - r % call.group_size;
        if (r != first && !wholes[static_cast<size_t>(first)].is_none()) {
          wholes[static_cast<size_t>(r)] = wholes[static_cast<size_t>(first)];
          continue;
        }
        Tensor whole = Tensor::empty(call.original.stage(id).type.dtype, whole_shape);
        for (int i = 0; i < call.group_size; ++i)
          exec::put_rows(whole, results[static_cast<size_t>(first + i)].at(name), stored.dim,
                         dsl::part_offset(whole_shape[stored.dim], call.group_size, i));
        wholes[static_cast<size_t>(r)] = to_array(whole);
      }
      for (py::object& w : wholes) per_rank.append(w);
    } else {
      for (const exec::TensorMap& r : results) {
        const auto it = r.find(name);
        per_rank.append(it == r.end() ? py::object(py::none()) : py::object(to_array(it->second)));
      }
    }
    out[py::str(name)] = per_rank;
  }
  return out;
}

// Reads and checks every argument of a run, then runs it.
py::dict run(const Program& original, const schedule::Plan& plan, exec::RunnerKind kind,
             std::shared_ptr<const exec::CompiledPlan> compiled, const py::dict& inputs,
             const std::optional<py::dict>& scalars, std::optional<int> ranks,
             const std::optional<dsl::SymbolMap>& symbols) {
  Call call{original, plan};
  if (ranks) {
    call.ranks = *ranks;
  } else {  // the length of the first list given, else 1
    for (const auto& [key, value] : inputs)
      if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
        call.ranks = static_cast<int>(py::len(value));
        break;
      }
  }
  if (call.ranks < 1 || call.ranks > comm::kMaxThreadRanks)
    user_error("ranks must be between 1 and {}, not {}", comm::kMaxThreadRanks, call.ranks);
  if (call.ranks % original.groups() != 0)
    user_error("program '{}' has {} groups: the rank count must be a multiple of it, not {}",
               original.name(), original.groups(), call.ranks);
  call.group_size = call.ranks / original.groups();
  if (symbols) call.symbols = *symbols;
  std::map<std::string, std::vector<py::object>> arrays = read_inputs(call, inputs);
  settle_shapes(call, arrays);
  read_scalars(call, scalars.value_or(py::dict()));
  convert_inputs(call, arrays);
  return run_call(call, kind, std::move(compiled));
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
    "inputs: a dict from each input's name to a list of NumPy float32 arrays, one per rank (this "
    "rank's piece as the program declares it: the whole tensor for Local and Replicated, this "
    "rank's part for Sliced; None for a rank outside the input's group), or one array for every "
    "rank. bf16 and f16 inputs are rounded from the float32 values. The arrays are copied, never "
    "changed.\nscalars: a dict from each scalar's name to its value.\nranks: the number of "
    "in-process ranks (default: the length of the lists).\nsymbols: extents of symbolic dims "
    "(default: read from the arrays).\nReturns a dict from each output's and each updated input's "
    "name to a list of float32 arrays, one per rank (None where a rank does not hold it).";

}  // namespace

void bind_run(py::module_& m) {
  m.def(
      "run",
      [](const py::object& target, const py::dict& inputs, const std::optional<py::dict>& scalars,
         std::optional<int> ranks, const std::optional<dsl::SymbolMap>& symbols,
         const std::string& executor) {
        const exec::RunnerKind kind = exec::runner_kind_from_name(executor, "executor");
        const schedule::Schedule s = as_schedule(target);
        const schedule::Plan plan = s.lower();
        const auto compiled = kind == exec::RunnerKind::Compiled ? compile(plan) : nullptr;
        return run(s.original(), compiled ? compiled->plan() : plan, kind, compiled, inputs,
                   scalars, ranks, symbols);
      },
      py::arg("target"), py::arg("inputs"), py::arg("scalars") = py::none(), py::kw_only(),
      py::arg("ranks") = py::none(), py::arg("symbols") = py::none(),
      py::arg("executor") = "reference",
      (std::string("Runs a Program or Schedule once on in-process ranks. executor: 'reference' "
                   "(the interpreter, the default), 'plan' or 'compiled' (the CPU JIT).\n") +
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
             std::optional<int> ranks, const std::optional<dsl::SymbolMap>& symbols) {
            return run(c.original, c.plan->plan(), exec::RunnerKind::Compiled, c.plan, inputs,
                       scalars, ranks, symbols);
          },
          py::arg("inputs"), py::arg("scalars") = py::none(), py::kw_only(),
          py::arg("ranks") = py::none(), py::arg("symbols") = py::none(),
          (std::string("Runs the compiled schedule once on in-process ranks.\n") + kRunDoc)
              .c_str());
  m.def(
      "compile",
      [](const py::object& target) {
        const schedule::Schedule s = as_schedule(target);
        return Compiled{s.original(), compile(s.lower())};
      },
      py::arg("target"), "Compiles a Program or Schedule with the CPU JIT; returns a Compiled.");
}

}  // namespace tandem::python
