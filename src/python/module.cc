// The `tandem` Python package's extension module, tandem._tandem (tandem/__init__.py re-exports
// it): its errors, the DSL (types, layouts, programs, stages and their
// operators, the workloads) and schedules (the rewrites, recipes by name, enumeration). Running
// is in run.cc.
#include <pybind11/operators.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.h"
#include "tandem/core/error.h"
#include "tandem/dsl/dsl.h"
#include "tandem/schedule/transforms.h"

namespace tandem::python {
namespace {

using dsl::Program;
using ProgramPtr = std::shared_ptr<Program>;

PyExpr wrap(const ProgramPtr& program, const dsl::Expr& e) { return {program, e.id()}; }

// A Python shape ([4, "N"]) as the DSL's: ints are extents, strings symbols.
dsl::SymShape to_shape(const py::sequence& dims, const std::string& what) {
  std::vector<dsl::Dim> out;
  for (size_t i = 0; i < dims.size(); ++i) {
    const py::object d = dims[i];
    if (py::isinstance<py::bool_>(d) ||
        !(py::isinstance<py::int_>(d) || py::isinstance<py::str>(d)))
      user_error("{}: dimension {} is {}; give an extent (int) or a symbol's name (str)", what, i,
                 std::string(py::repr(d)));
    if (py::isinstance<py::str>(d))
      out.emplace_back(d.cast<std::string>());
    else
      out.emplace_back(d.cast<long long>());
  }
  return dsl::SymShape(std::move(out));
}

// A stage named by a Python value for a schedule: a name, an id of the schedule's current program,
// or an Expr (by its name when it has one, since rewrites renumber stages).
schedule::StageRef to_ref(const py::handle& h) {
  if (py::isinstance<PyExpr>(h)) {
    const PyExpr& e = h.cast<const PyExpr&>();
    const dsl::Stage& s = e.program->stage(e.id);
    if (!s.name.empty()) return s.name;
    return e.id;
  }
  if (py::isinstance<py::str>(h)) return h.cast<std::string>();
  if (py::isinstance<py::int_>(h) && !py::isinstance<py::bool_>(h)) return h.cast<int>();
  user_error("a stage is named by its name (str), its id (int) or an Expr, not {}",
             std::string(py::repr(h)));
}

std::vector<schedule::StageRef> to_refs(const py::sequence& stages) {
  std::vector<schedule::StageRef> out;
  for (const py::handle h : stages) out.push_back(to_ref(h));
  return out;
}

std::vector<std::string> stage_names(const Program& p, const std::vector<int>& ids) {
  std::vector<std::string> out;
  for (int id : ids) out.push_back(p.display_name(id));
  return out;
}

// Binds a Python operator (and its reflected form, for arithmetic) to the DSL's operator for Expr
// and number operands; an operand of another type gives NotImplemented (py::is_operator), so Python
// raises its usual TypeError.
template <class F>
void def_binary(py::class_<PyExpr>& c, const char* name, F f) {
  c.def(
      name,
      [f](const PyExpr& a, const PyExpr& b) { return wrap(a.program, f(a.expr(), b.expr())); },
      py::is_operator());
  c.def(
      name, [f](const PyExpr& a, double b) { return wrap(a.program, f(a.expr(), b)); },
      py::is_operator());
}
template <class F>
void def_binary(py::class_<PyExpr>& c, const char* name, const char* reflected, F f) {
  def_binary(c, name, f);
  c.def(
      reflected, [f](const PyExpr& a, double b) { return wrap(a.program, f(b, a.expr())); },
      py::is_operator());
}

void bind_types(py::module_& m) {
  py::enum_<DType>(m, "DType", "Element types: F32, BF16, F16.")
      .value("F32", DType::F32)
      .value("BF16", DType::BF16)
      .value("F16", DType::F16);
  m.attr("F32") = DType::F32;
  m.attr("BF16") = DType::BF16;
  m.attr("F16") = DType::F16;

  py::enum_<ReduceOp>(m, "ReduceOp", "How collectives and reductions combine: Sum, Prod, Max, Min.")
      .value("Sum", ReduceOp::Sum)
      .value("Prod", ReduceOp::Prod)
      .value("Max", ReduceOp::Max)
      .value("Min", ReduceOp::Min);
  m.attr("Sum") = ReduceOp::Sum;
  m.attr("Prod") = ReduceOp::Prod;
  m.attr("Max") = ReduceOp::Max;
  m.attr("Min") = ReduceOp::Min;

  py::class_<dsl::Layout>(m, "Layout",
                          "How a value is held by the ranks of its group: Local (each rank its "
                          "own), Replicated (the same on every rank), Sliced(dim) (rank r holds "
                          "part r along dim) or Partial (each rank a summand).")
      .def_property_readonly("kind", [](const dsl::Layout& l) { return l.str(); })
      .def_readonly("dim", &dsl::Layout::dim, "The sliced dimension (Sliced only; else -1).")
      .def("__str__", &dsl::Layout::str)
      .def("__repr__", &dsl::Layout::str)
      .def(py::self == py::self)
      .def("__hash__", [](const dsl::Layout& l) {
        return py::hash(py::make_tuple(static_cast<int>(l.kind), l.dim));
      });
  m.attr("Local") = dsl::Local;
  m.attr("Replicated") = dsl::Replicated;
  m.attr("Partial") = dsl::Partial;
  m.def(
      "Sliced",
      [](int dim) {
        if (dim < 0) user_error("Sliced({}): the sliced dimension must be 0 or more", dim);
        return dsl::Sliced(dim);
      },
      py::arg("dim"), "The layout in which rank r of p holds part r of dimension `dim`.");
}

void bind_expr(py::module_& m) {
  py::class_<PyExpr> e(m, "Expr",
                       "A stage of a Program, as the builder returns it. Python's operators (+ - * "
                       "/ ** @, unary -, abs, < <= > >=) add stages to its program; numbers become "
                       "constants. Compare for equality with tandem.eq and tandem.ne.");
  e.def_property_readonly(
       "program", [](const PyExpr& x) { return x.program; }, "The Program this stage belongs to.")
      .def_property_readonly("id", [](const PyExpr& x) { return x.id; })
      .def_property_readonly(
          "name", [](const PyExpr& x) { return x.program->display_name(x.id); },
          "The stage's name, or %id when it has none.")
      .def_property_readonly("dtype", [](const PyExpr& x) { return x.expr().type().dtype; })
      .def_property_readonly("layout", [](const PyExpr& x) { return x.expr().type().layout; })
      .def_property_readonly(
          "shape",
          [](const PyExpr& x) {
            py::list out;
            for (const dsl::Dim& d : x.expr().type().shape.dims)
              if (d.is_symbol())
                out.append(d.symbol);
              else
                out.append(d.value);
            return out;
          },
          "The global shape: extents (int) and symbols (str).")
      .def_property_readonly(
          "type", [](const PyExpr& x) { return x.expr().type().str(); },
          "The stage's type as the program prints it, e.g. 'f32[N] Replicated'.")
      .def(
          "named",
          [](const PyExpr& x, const std::string& name) {
            x.expr().named(name);
            return x;
          },
          py::arg("name"), "Names the stage (for printing, schedules and outputs); returns it.")
      .def("__str__", [](const PyExpr& x) { return x.program->stage_str(x.id); })
      .def("__repr__",
           [](const PyExpr& x) {
             return "<tandem.Expr " + x.program->display_name(x.id) + ": " + x.expr().type().str() +
                    ">";
           })
      .def("__bool__", [](const PyExpr& x) -> bool {
        user_error(
            "{} is a stage of a program, not a truth value: use tandem.select, tandem.eq "
            "or tandem.ne to compute with comparisons",
            x.program->display_name(x.id));
      });
  def_binary(e, "__add__", "__radd__", [](const auto& a, const auto& b) { return a + b; });
  def_binary(e, "__sub__", "__rsub__", [](const auto& a, const auto& b) { return a - b; });
  def_binary(e, "__mul__", "__rmul__", [](const auto& a, const auto& b) { return a * b; });
  def_binary(e, "__truediv__", "__rtruediv__", [](const auto& a, const auto& b) { return a / b; });
  def_binary(e, "__pow__", "__rpow__", [](const auto& a, const auto& b) { return dsl::pow(a, b); });
  def_binary(e, "__lt__", [](const auto& a, const auto& b) { return a < b; });
  def_binary(e, "__le__", [](const auto& a, const auto& b) { return a <= b; });
  def_binary(e, "__gt__", [](const auto& a, const auto& b) { return a > b; });
  def_binary(e, "__ge__", [](const auto& a, const auto& b) { return a >= b; });
  e.def("__neg__", [](const PyExpr& a) { return wrap(a.program, -a.expr()); });
  e.def("__abs__", [](const PyExpr& a) { return wrap(a.program, dsl::abs(a.expr())); });
  e.def(
      "__matmul__",
      [](const PyExpr& a, const PyExpr& b) {
        return wrap(a.program, dsl::matmul(a.expr(), b.expr()));
      },
      py::is_operator());
}

void bind_program(py::module_& m) {
  py::class_<Program, ProgramPtr>(
      m, "Program",
      "A distributed step: compute and communication stages over tensors with layouts.\n\n"
      "Build it with input(), scalar() and the operators and functions of tandem on the Exprs "
      "they return; declare results with output(); print it with str().")
      .def(py::init([](const std::string& name, int groups) {
             if (groups < 1)
               user_error("program '{}': groups must be 1 or more, not {}", name, groups);
             return std::make_shared<Program>(name, groups);
           }),
           py::arg("name"), py::arg("groups") = 1,
           "A new empty program; `groups` splits the ranks into that many equal groups "
           "(pipeline stages).")
      .def_property_readonly("name", &Program::name)
      .def_property_readonly("groups", &Program::groups)
      .def(
          "input",
          [](const ProgramPtr& p, DType dtype, const py::sequence& shape, const dsl::Layout& layout,
             const std::string& name, int group) {
            return wrap(
                p, p->input(dtype, to_shape(shape, "input '" + name + "'"), layout, name, group));
          },
          py::arg("dtype"), py::arg("shape"), py::arg("layout"), py::arg("name"),
          py::arg("group") = 0,
          "Declares an input: its dtype, its global shape (ints and symbol names), its layout and "
          "the group holding it.")
      .def(
          "scalar",
          [](const ProgramPtr& p, const std::string& name, DType dtype) {
            return wrap(p, p->scalar(dtype, name));
          },
          py::arg("name"), py::arg("dtype") = DType::F32,
          "Declares a scalar bound at run time (the same on every rank).")
      .def(
          "constant", [](const ProgramPtr& p, double v) { return wrap(p, p->constant(v)); },
          py::arg("value"))
      .def(
          "output",
          [](const ProgramPtr& p, const PyExpr& e, const std::string& name) {
            if (e.program != p)
              user_error("program '{}': output '{}' is a stage of program '{}'", p->name(), name,
                         e.program->name());
            p->output(e.expr(), name);
          },
          py::arg("expr"), py::arg("name"), "Declares a stage a result of the program.")
      .def("validate", &Program::validate,
           "Whole-program checks (every send received, reads before updates, ...).")
      .def_property_readonly("inputs", [](const Program& p) { return stage_names(p, p.inputs()); })
      .def_property_readonly("scalars",
                             [](const Program& p) { return stage_names(p, p.scalars()); })
      .def_property_readonly("symbols", &Program::symbols)
      .def_property_readonly("outputs",
                             [](const Program& p) {
                               std::vector<std::string> out;
                               for (const dsl::Output& o : p.outputs()) out.push_back(o.name);
                               return out;
                             })
      .def(
          "__getitem__",
          [](const ProgramPtr& p, const std::string& name) {
            const std::optional<int> id = p->find(name);
            if (!id) user_error("program '{}' has no stage named '{}'", p->name(), name);
            return PyExpr{p, *id};
          },
          py::arg("name"), "The stage of that name.")
      .def("__str__", &Program::str)
      .def("__repr__", [](const Program& p) {
        return "<tandem.Program '" + p.name() + "': " + std::to_string(p.stages().size()) +
               " stages>";
      });
}

// The builder's functions on Exprs, under the same names.
void bind_functions(py::module_& m) {
  auto unary = [&m](const char* name, dsl::Expr (*f)(const dsl::Expr&), const char* doc) {
    m.def(
        name, [f](const PyExpr& x) { return wrap(x.program, f(x.expr())); }, py::arg("x"), doc);
  };
  unary("neg", dsl::neg, "-x, elementwise.");
  unary("abs", dsl::abs, "|x|, elementwise.");
  unary("sqrt", dsl::sqrt, "The square root, elementwise.");
  unary("rsqrt", dsl::rsqrt, "1 / sqrt(x), elementwise.");
  unary("exp", dsl::exp, "e^x, elementwise.");
  unary("log", dsl::log, "The natural logarithm, elementwise.");
  unary("tanh", dsl::tanh, "tanh, elementwise.");
  unary("gelu", dsl::gelu, "GELU (tanh approximation), elementwise.");
  unary("relu", dsl::relu, "max(x, 0), elementwise.");
  unary("norm", dsl::norm, "The L2 norm of the whole tensor (an f32 scalar).");
  unary("AllGather", dsl::AllGather, "Sliced(d) -> Replicated: every rank gets the whole value.");
  unary("Shift", dsl::Shift,
        "Local -> Local: rank i gets rank (i - 1) mod p's value (a ring step).");
  auto binary = [&m](const char* name, auto f, const char* doc) {
    m.def(
        name,
        [f](const PyExpr& a, const PyExpr& b) { return wrap(a.program, f(a.expr(), b.expr())); },
        py::arg("a"), py::arg("b"), doc);
  };
  binary(
      "eq", [](const dsl::Expr& a, const dsl::Expr& b) { return dsl::eq(a, b); },
      "1 where a == b, else 0.");
  binary(
      "ne", [](const dsl::Expr& a, const dsl::Expr& b) { return dsl::ne(a, b); },
      "1 where a != b, else 0.");
  binary(
      "matmul", [](const dsl::Expr& a, const dsl::Expr& b) { return dsl::matmul(a, b); },
      "The matrix product over the last two dims ([..., M, K] x [..., K, N]); also a @ b.");
  binary(
      "update", [](const dsl::Expr& a, const dsl::Expr& b) { return dsl::update(a, b); },
      "Writes `b` into input `a` in place; the result is the new value.");
  // max, min and pow also take a number as the second operand.
  auto with_number = [&m](const char* name, auto f, const char* doc) {
    m.def(
        name,
        [f](const PyExpr& a, const PyExpr& b) { return wrap(a.program, f(a.expr(), b.expr())); },
        py::arg("a"), py::arg("b"), doc);
    m.def(
        name, [f](const PyExpr& a, double b) { return wrap(a.program, f(a.expr(), b)); },
        py::arg("a"), py::arg("b"), doc);
  };
  with_number(
      "max", [](const dsl::Expr& a, const auto& b) { return dsl::max(a, b); },
      "The larger of a and b, elementwise.");
  with_number(
      "min", [](const dsl::Expr& a, const auto& b) { return dsl::min(a, b); },
      "The smaller of a and b, elementwise.");
  with_number(
      "pow", [](const dsl::Expr& a, const auto& b) { return dsl::pow(a, b); },
      "a to the power b, elementwise; also a ** b.");
  m.def(
      "select",
      [](const PyExpr& c, const PyExpr& a, const PyExpr& b) {
        return wrap(c.program, dsl::select(c.expr(), a.expr(), b.expr()));
      },
      py::arg("cond"), py::arg("a"), py::arg("b"), "cond != 0 ? a : b, elementwise.");
  m.def(
      "cast", [](const PyExpr& x, DType t) { return wrap(x.program, dsl::cast(x.expr(), t)); },
      py::arg("x"), py::arg("dtype"), "x rounded to another dtype.");
  m.def(
      "dropout",
      [](const PyExpr& x, double p, const PyExpr& seed) {
        return wrap(x.program, dsl::dropout(x.expr(), p, seed.expr()));
      },
      py::arg("x"), py::arg("p"), py::arg("seed"),
      "Drops each element with probability p and scales the kept ones by 1/(1-p); the mask "
      "depends only on the seed scalar and the element's index in the whole tensor.");
  m.def(
      "reduce",
      [](ReduceOp op, const PyExpr& x, int dim) {
        return wrap(x.program, dsl::reduce(op, x.expr(), dim));
      },
      py::arg("op"), py::arg("x"), py::arg("dim") = dsl::kAllDims,
      "Sum, Prod, Max or Min over one dim, or over every dim (dim=-1).");
  m.def(
      "scatter",
      [](const PyExpr& x, int dim) { return wrap(x.program, dsl::scatter(x.expr(), dim)); },
      py::arg("x"), py::arg("dim"),
      "This rank's part of a Replicated tensor along `dim` (Sliced(dim)), without communication.");
  m.def(
      "AllReduce",
      [](ReduceOp op, const PyExpr& x) { return wrap(x.program, dsl::AllReduce(op, x.expr())); },
      py::arg("op"), py::arg("x"), "Local or Partial -> Replicated: the ranks' values combined.");
  m.def(
      "ReduceScatter",
      [](ReduceOp op, const PyExpr& x, int dim) {
        return wrap(x.program, dsl::ReduceScatter(op, x.expr(), dim));
      },
      py::arg("op"), py::arg("x"), py::arg("dim") = 0,
      "Local or Partial -> Sliced(dim): each rank gets its part of the combined value.");
  m.def(
      "Broadcast",
      [](const PyExpr& x, int root) { return wrap(x.program, dsl::Broadcast(x.expr(), root)); },
      py::arg("x"), py::arg("root"), "Local -> Replicated: every rank gets the root's value.");
  m.def(
      "Send", [](const PyExpr& x, int to) { return wrap(x.program, dsl::Send(x.expr(), to)); },
      py::arg("x"), py::arg("to_group"),
      "Rank i of x's group sends its piece to rank i of group `to_group`.");
  m.def(
      "Recv", [](const PyExpr& sent) { return wrap(sent.program, dsl::Recv(sent.expr())); },
      py::arg("sent"), "The value a Send hands over, in the receiving group.");
}

ProgramPtr shared(Program p) { return std::make_shared<Program>(std::move(p)); }

void bind_workloads(py::module_& m) {
  py::module_ w = m.def_submodule(
      "workloads",
      "The programs tandem ships (include/tandem/dsl/workloads.h has what each binds).");
  namespace wl = dsl::workloads;
  w.def(
      "adam", [](DType g) { return shared(wl::adam(g)); }, py::arg("grad_dtype") = DType::BF16,
      "AdamW, data parallel: g (Local) summed by an AllReduce, then w, m, v (Replicated) updated "
      "in place. Symbol N; scalars lr, beta1, beta2, eps, weight_decay, step, grad_scale.");
  w.def(
      "lamb", [](DType g) { return shared(wl::lamb(g)); }, py::arg("grad_dtype") = DType::BF16,
      "LAMB: Adam's direction scaled by the trust ratio ||w|| / ||r|| (the norms over all of w "
      "and r: one tensor); binds as adam.");
  w.def(
      "lamb_bucket", [](DType g) { return shared(wl::lamb_bucket(g)); },
      py::arg("grad_dtype") = DType::BF16,
      "LAMB over a bucket of tensors: lamb with a trust ratio per segment of w (one a tensor). "
      "Binds as lamb, with segments= (the tensors' bounds in the flat buffer) when run or bound; "
      "symbol S, their number, follows from them.");
  // The layer workloads take the bias as a bool.
  auto layer = [](auto f) {
    return [f](DType dtype, double p, std::optional<DType> wire, bool bias) {
      return shared(f(dtype, p, wire, bias ? wl::Bias::With : wl::Bias::Without));
    };
  };
  w.def("megatron_layer", layer([](auto... a) { return wl::megatron_layer(a...); }),
        py::arg("dtype") = DType::F32, py::arg("dropout_p") = 0.1, py::arg("wire") = py::none(),
        py::arg("bias") = true,
        "Megatron's row-parallel layer: out = dropout(AllReduce(x @ w) + bias) + residual. "
        "Symbols B, K, H; x Sliced(1), w Sliced(0), bias and residual Replicated; scalar seed.");
  w.def("pipeline_stage", layer([](auto... a) { return wl::pipeline_stage(a...); }),
        py::arg("dtype") = DType::F32, py::arg("dropout_p") = 0.1, py::arg("wire") = py::none(),
        py::arg("bias") = true,
        "megatron_layer on group 0, its output sent to group 1 (output h there): 2 groups.");
  w.def(
      "grad_reduce", [](DType g) { return shared(wl::grad_reduce(g)); },
      py::arg("grad_dtype") = DType::BF16, "g_sum = ReduceScatter(Sum, g): this rank's slice.");
  w.def(
      "adam_update", [](DType g) { return shared(wl::adam_update(g)); },
      py::arg("grad_dtype") = DType::BF16, "AdamW on this rank's slice after grad_reduce.");
  w.def(
      "sum_in_place", [](DType wire) { return shared(wl::sum_in_place(wire)); },
      py::arg("wire") = DType::F32, "update(g, AllReduce(Sum, g)), optionally summed in `wire`.");
  w.def(
      "gather_weights", [] { return shared(wl::gather_weights()); },
      "w_all = AllGather(w): ZeRO-3's gather of a block's weights.");
  w.def(
      "names",
      [] {
        std::vector<std::string> out;
        for (std::string_view n : wl::names()) out.emplace_back(n);
        return out;
      },
      "The workloads by_name knows.");
  w.def(
      "by_name", [](const std::string& name) { return shared(wl::by_name(name)); }, py::arg("name"),
      "The named workload with its default dtypes.");
}

}  // namespace

void bind_dsl(py::module_& m) {
  bind_types(m);
  bind_expr(m);
  bind_program(m);
  bind_functions(m);
  bind_workloads(m);
}

void bind_schedule(py::module_& m) {
  using schedule::Schedule;
  py::class_<Schedule>(
      m, "Schedule",
      "How a program runs: the program rewritten by split, reorder and as_slice, with the stages "
      "fuse and overlap group. Every rewrite is checked and keeps what the program computes. "
      "Stages are named by name (str), id (int) or Expr.")
      .def(py::init([](const ProgramPtr& p) { return Schedule(*p); }), py::arg("program"),
           "The program as written, not yet transformed.")
      .def(
          "split",
          [](Schedule& s, const py::handle& ar) {
            const Schedule::SplitResult r = s.split(to_ref(ar));
            return py::make_tuple(s.program().display_name(r.reduce_scatter),
                                  s.program().display_name(r.all_gather));
          },
          py::arg("allreduce"),
          "AllReduce -> ReduceScatter + AllGather; returns their names (<name>.rs, <name>.ag).")
      .def(
          "reorder",
          [](Schedule& s, const py::handle& ag, const py::sequence& stages) {
            return stage_names(s.program(), s.reorder(to_ref(ag), to_refs(stages)));
          },
          py::arg("allgather"), py::arg("stages"),
          "Moves an AllGather past the computations leading to `stages`, which then run on this "
          "rank's slice; returns the names of the AllGathers of their results.")
      .def(
          "fuse", [](Schedule& s, const py::sequence& stages) { return s.fuse(to_refs(stages)); },
          py::arg("stages"),
          "Runs the stages as one unit: one loop, or one collective computing on each chunk.")
      .def(
          "overlap",
          [](Schedule& s, const py::sequence& stages, int blocks) {
            return s.overlap(to_refs(stages), blocks);
          },
          py::arg("stages"), py::arg("blocks") = schedule::kDefaultBlocks,
          "Runs a producer and its consumer (matmul -> collective -> send) block by block.")
      .def(
          "as_slice", [](Schedule& s, const py::handle& input) { s.as_slice(to_ref(input)); },
          py::arg("input"),
          "Stores a Replicated input used only through its slice as Sliced (ZeRO's saving).")
      .def_property("name", &Schedule::name, &Schedule::set_name,
                    "The schedule's name: its recipe's, or the transformations so far.")
      .def_property_readonly(
          "program", [](const Schedule& s) { return shared(s.program()); },
          "A copy of the program as rewritten so far.")
      .def_property_readonly(
          "original", [](const Schedule& s) { return shared(s.original()); },
          "A copy of the program as written.")
      .def_property_readonly("history", &Schedule::history)
      .def(
          "plan", [](const Schedule& s) { return s.lower().str(); },
          "The lowered plan, as text: how the executors will run it.")
      .def("__str__", &Schedule::str)
      .def("__repr__", [](const Schedule& s) { return "<tandem.Schedule '" + s.name() + "'>"; });

  m.def(
      "schedule",
      [](const ProgramPtr& p, const std::string& name) {
        return schedule::schedule_by_name(*p, name).schedule;
      },
      py::arg("program"), py::arg("recipe"),
      "The schedule a recipe name describes (e.g. 'fused(RS-C-AG)+slice(m,v)'), as `tandem "
      "emit --schedule` and the tuner read it.");
  m.def(
      "schedules",
      [](const ProgramPtr& p) {
        std::vector<std::string> out;
        for (const schedule::NamedSchedule& s : schedule::enumerate_schedules(*p))
          out.push_back(s.name);
        return out;
      },
      py::arg("program"), "The names of every legal schedule of a program, the unscheduled first.");
}

}  // namespace tandem::python

PYBIND11_MODULE(_tandem, m) {
  namespace py = pybind11;
  m.doc() =
      "tandem from Python: write a distributed step as a DSL program, schedule it, and run it with "
      "the reference interpreter or the compiled executor on NumPy arrays and PyTorch tensors, on "
      "in-process ranks or one process a rank under mpirun; tandem.torch: a fused distributed "
      "optimizer and a DDP communication hook for PyTorch scripts. See docs/python.md.";
  // One exception type for bad input, with the library's message; a broken invariant (a bug) is
  // a subclass, so that `except tandem.Error` catches both but they stay apart.
  auto& error = py::register_exception<tandem::UserError>(m, "Error");
  py::register_exception<tandem::InternalError>(m, "InternalError", error.ptr());
  tandem::python::bind_dsl(m);
  tandem::python::bind_schedule(m);
  tandem::python::bind_run(m);
  tandem::python::bind_comm(m);
  tandem::python::bind_train(m);
  tandem::python::bind_checkpoint(m);
  tandem::python::bind_tokenizer(m);
  tandem::python::bind_tune(m);
}
