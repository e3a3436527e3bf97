// tandem.train and tandem.plan: the `tandem train` and `tandem plan` commands from Python. Their
// keywords are read by the commands' own flag definitions (src/cli/train.cc): a keyword is a
// flag's name with '-' as '_', and every refusal is the command's message. The run's metrics go to
// a per-step callback through the trainer's one metrics hook (TrainConfig::on_step).
#include <fmt/ranges.h>
#include <pybind11/iostream.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "bindings.h"
#include "cli/choices.h"
#include "cli/commands.h"
#include "tandem/core/error.h"
#include "tandem/io/checkpoint_series.h"
#include "tandem/io/metrics.h"
#include "tandem/train/grid_plan.h"
#include "tandem/train/trainer.h"

namespace tandem::python {
namespace {

// A keyword's flag: "--" and the name with '_' as '-'.
std::string flag_of(std::string key) {
  std::replace(key.begin(), key.end(), '_', '-');
  return "--" + key;
}

// The value of keyword `key` as the flag's text: a bool as true/false, an integer as written, a
// real as repr writes it (exactly), a str or path as it is.
std::string flag_text(const char* fn, const std::string& key, const py::handle& v) {
  if (py::isinstance<py::bool_>(v)) return v.cast<bool>() ? "true" : "false";
  if (py::isinstance<py::str>(v)) return v.cast<std::string>();
  // Integers and reals of any type (NumPy's too): as Python writes int(v) and float(v).
  if (PyIndex_Check(v.ptr()) != 0) return py::str(py::int_(py::reinterpret_borrow<py::object>(v)));
  if (py::hasattr(v, "__float__"))
    return py::repr(py::float_(py::reinterpret_borrow<py::object>(v)));
  const py::module_ os = py::module_::import("os");
  if (py::isinstance(v, os.attr("PathLike"))) return os.attr("fspath")(v).cast<std::string>();
  user_error("{}: {}={}: give a str, int, float, bool or path (the text of {})", fn, key,
             std::string(py::repr(v)), flag_of(key));
}

// Parses `kwargs` (None values left out) as the flags of subcommand `name` of `app` (added with
// the callback that takes what it gives), with the GIL released: the parse may read a checkpoint
// or measure rates. Unknown keywords are one error naming them all.
void parse_keywords(CLI::App& app, const std::string& name, const char* fn,
                    const py::kwargs& kwargs) {
  CLI::App* cmd = app.get_subcommand(name);
  std::vector<std::string> args = {"tandem", name}, unknown;
  for (const auto& [k, v] : kwargs) {
    const std::string key = k.cast<std::string>();
    const CLI::Option* o = cmd->get_option_no_throw(flag_of(key));
    if (o == nullptr || o == cmd->get_help_ptr() || key.find('-') != std::string::npos) {
      unknown.push_back("'" + key + "'");
      continue;
    }
    if (v.is_none()) continue;
    args.push_back(flag_of(key) + "=" + flag_text(fn, key, v));
  }
  if (!unknown.empty())
    user_error(
        "{}: unknown keyword{} {}: the keywords are `tandem {}`'s flags with '-' as '_' "
        "(help({}) lists them)",
        fn, unknown.size() == 1 ? "" : "s", fmt::join(unknown, ", "), name, fn);
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  cli::check_numbers(app);
  py::gil_scoped_release nogil;
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::ParseError& e) {
    user_error("{} (tandem {} --help lists the flags)", e.what(), name);
  }
}

// The keywords of subcommand `name` for a docstring: one line a flag, with its help text.
std::string keyword_lines(CLI::App& app, const std::string& name) {
  CLI::App* cmd = app.get_subcommand(name);
  std::string out;
  for (const CLI::Option* o : cmd->get_options()) {
    if (o == cmd->get_help_ptr() || o->get_lnames().empty()) continue;
    std::string key = o->get_lnames().front();
    std::replace(key.begin(), key.end(), '-', '_');
    out += fmt::format("  {}: {}\n", key, o->get_description());
  }
  return out;
}

// A number as the metrics line writes it: null (None) when not finite.
py::object number(double x) { return std::isfinite(x) ? py::object(py::float_(x)) : py::none(); }

// What a step's metrics line holds (io::metrics_json_line), in its order, as a dict.
py::dict metrics_dict(const io::StepMetrics& m) {
  py::dict d;
  d["step"] = m.step;
  d["loss"] = number(m.loss);
  if (m.val_loss) d["val_loss"] = number(*m.val_loss);
  d["tokens_per_s"] = number(m.tokens_per_s);
  if (!m.phase_s.empty()) {
    py::dict phases;
    for (const auto& [name, s] : m.phase_s) phases[py::str(name)] = number(s);
    d["phase_s"] = phases;
  }
  for (const auto& [name, v] : m.extra) d[py::str(name)] = number(v);
  return d;
}

// The run's outcome for Python.
py::dict result_dict(const train::TrainResult& r, const train::TrainConfig& cfg) {
  py::dict d;
  d["first_step"] = r.first_step;
  d["end_step"] = r.end_step;
  d["steps"] = r.end_step - r.first_step;
  d["loss"] = r.losses.empty() ? py::none() : number(r.losses.back());
  py::list losses, vals;
  for (double l : r.losses) losses.append(number(l));
  for (const auto& [step, l] : r.val_losses) vals.append(py::make_tuple(step, number(l)));
  d["losses"] = losses;
  d["val_loss"] = r.val_losses.empty() ? py::none() : number(r.val_losses.back().second);
  d["val_losses"] = vals;
  d["tokens_per_s"] = r.tokens_per_s;
  d["seconds"] = r.seconds;
  d["checkpoint"] = py::none();
  if (!cfg.save_dir.empty() && std::filesystem::exists(cfg.save_dir))
    d["checkpoint"] = io::resolve_checkpoint(cfg.save_dir);
  d["optimizer_schedule"] = r.optimizer_schedule;
  d["executor"] = r.executor;
  return d;
}

// Raises `type` (KeyboardInterrupt, SystemExit) in Python with `value`.
[[noreturn]] void raise_in_python(PyObject* type, const py::object& value) {
  PyErr_SetObject(type, value.ptr());
  throw py::error_already_set();
}

py::dict train_py(py::kwargs kwargs) {
  const char* fn = "tandem.train";
  py::object callback = py::none();
  if (kwargs.contains("callback")) callback = kwargs.attr("pop")("callback");
  if (!callback.is_none() && !PyCallable_Check(callback.ptr()))
    user_error("{}: callback={} is not callable: give a function of one dict (a step's metrics)",
               fn, std::string(py::repr(callback)));
  std::optional<train::TrainConfig> cfg;
  {
    CLI::App app;
    cli::add_train(app, [&cfg](train::TrainConfig& c) { cfg = std::move(c); });
    parse_keywords(app, "train", fn, kwargs);
  }
  // What the command prints goes to Python's sys.stdout (a notebook's cell, pytest's capture).
  py::detail::pythonbuf buf(py::module_::import("sys").attr("stdout"));
  std::ostream out(&buf);
  cfg->out = &out;
  // The callback's exception, kept (under the GIL) until the ranks have stopped.
  std::optional<py::error_already_set> raised;
  if (!callback.is_none())
    cfg->on_step = [&callback, &raised](const io::StepMetrics& m) {
      py::gil_scoped_acquire gil;
      try {
        callback(metrics_dict(m));
        return true;
      } catch (py::error_already_set& e) {
        raised.emplace(std::move(e));
      } catch (const std::exception& e) {  // a cast of the dict failing: not expected
        PyErr_SetString(PyExc_RuntimeError, e.what());
        raised.emplace();
      }
      return false;
    };
  train::TrainResult r;
  {
    py::gil_scoped_release nogil;
    r = train::train(*cfg);
  }
  out.flush();
  if (raised) throw *raised;
  if (r.stopped_by_signal != 0) {
    const std::string what = fmt::format(
        "tandem.train: stopped by {} after step {} of {}{}",
        r.stopped_by_signal == SIGINT ? "SIGINT" : "SIGTERM", r.end_step, cfg->steps,
        cfg->save_dir.empty() ? "" : fmt::format("; resume=\"{}\" continues it", cfg->save_dir));
    // As the command: Ctrl-C is Python's KeyboardInterrupt; SIGTERM ends the script with the
    // status the command exits with (128 + the signal) unless it catches SystemExit.
    if (r.stopped_by_signal == SIGINT) raise_in_python(PyExc_KeyboardInterrupt, py::str(what));
    py::print(what, py::arg("file") = py::module_::import("sys").attr("stderr"));
    raise_in_python(PyExc_SystemExit, py::int_(128 + r.stopped_by_signal));
  }
  return result_dict(r, *cfg);
}

// One configuration of the plan across grids, as a row of `tandem plan --ranks`'s table.
py::dict plan_row(const train::GridOption& o, bool recommended) {
  const perf::StepBreakdown& b = o.breakdown;
  py::dict d;
  d["dp"] = o.cfg.grid.dp;
  d["tp"] = o.cfg.grid.tp;
  d["pp"] = o.cfg.grid.pp;
  d["cp"] = o.cfg.grid.cp;
  d["stage_layers"] = o.cfg.grid.stage_layers.counts();  // [] for the even split
  d["micro_batches"] = o.cfg.micro_batch_count();
  d["shard"] = parallel::sharding_name(o.cfg.optimizer.sharding);
  d["model_state"] = o.cfg.model_state ? o.cfg.model_state->str() : "memory";
  d["activations"] = o.activations;
  d["memory_per_rank"] = o.memory_per_rank;
  d["step_s"] = o.step_s;
  d["tokens_per_s"] = o.tokens_per_s;
  d["compute_s"] = b.compute;
  d["exchange_s"] = b.exposed_exchange;
  d["io_s"] = b.exposed_io;
  d["bubble_s"] = b.bubble;
  d["cores_s"] = b.cores;
  d["update_s"] = b.update;
  d["other_s"] = b.other;
  d["recommended"] = recommended;
  d["description"] = o.describe();
  return d;
}

py::list plan_py(py::kwargs kwargs) {
  const char* fn = "tandem.plan";
  std::optional<train::TrainConfig> one;
  std::optional<train::GridPlan> across;
  {
    CLI::App app;
    cli::add_plan(app, {[&one](train::TrainConfig& c) { one = std::move(c); },
                        [&across](const train::GridPlan& p) { across = p; }});
    parse_keywords(app, "plan", fn, kwargs);
  }
  py::list rows;
  if (across) {
    for (size_t i = 0; i < across->options.size(); ++i)
      rows.append(plan_row(across->options[i], i == across->recommended));
    return rows;
  }
  // --memory-budget: the out-of-core plan of the one grid (its report not printed: returned).
  std::ostringstream text;
  one->out = &text;
  train::TrainResult r;
  {
    py::gil_scoped_release nogil;
    r = train::train(*one);
  }
  py::dict d;
  d["dp"] = one->grid.dp;
  d["tp"] = one->grid.tp;
  d["pp"] = one->grid.pp;
  d["cp"] = one->grid.cp;
  d["activations"] = r.ooc_plan;
  d["step_s"] = r.ooc_predicted_s;
  d["peak_bytes"] = r.ooc_predicted_peak;
  d["resident_blocks"] = r.resident_blocks;
  d["report"] = text.str();
  rows.append(d);
  return rows;
}

}  // namespace

void bind_train(py::module_& m) {
  std::string train_keywords, plan_keywords;
  {
    CLI::App app;
    cli::add_train(app, [](train::TrainConfig&) {});
    cli::add_plan(app, {[](train::TrainConfig&) {}, [](const train::GridPlan&) {}});
    train_keywords = keyword_lines(app, "train");
    plan_keywords = keyword_lines(app, "plan");
  }
  m.def("train", &train_py,
        ("train(*, callback=None, **settings) -> dict\n\n"
         "Runs `tandem train` with its flags as keywords (a flag's name with '-' as '_': "
         "steps=20, d_model=64, save='ck'; None leaves one out), checked as the command checks "
         "them (a bad value or an unknown keyword raises tandem.Error with the command's "
         "message). callback(metrics) is called after each step with what the step's --metrics "
         "line holds (step, loss, val_loss when measured, tokens_per_s, phase_s, lr, step_s, "
         "grad_norm with clip_grad_norm). A callback that raises stops every rank after the step "
         "(with a checkpoint under save=) and its exception is raised. Ctrl-C (SIGINT) stops "
         "after the step in progress, with a checkpoint, and raises KeyboardInterrupt; SIGTERM "
         "likewise ends in SystemExit(143). What the command prints goes to sys.stdout "
         "(quiet=True: the summary only).\n\n"
         "Returns a dict: first_step, end_step, steps, loss (the last step's), losses, val_loss, "
         "val_losses [(step, loss)], tokens_per_s, seconds, checkpoint (the newest under save=, "
         "else None), optimizer_schedule, executor.\n\nKeywords:\n" +
         train_keywords)
            .c_str());
  m.def("plan", &plan_py,
        ("plan(**settings) -> list[dict]\n\n"
         "Runs `tandem plan` with its flags as keywords, as tandem.train reads them. With "
         "ranks=N: the plan across grids, one dict a configuration that fits, fastest first: dp, "
         "tp, pp, cp, shard, model_state, activations, memory_per_rank (bytes), step_s, "
         "tokens_per_s, the step's breakdown (compute_s, exchange_s, io_s, bubble_s, update_s, "
         "other_s), recommended (the one --grid auto takes) and description. With "
         "memory_budget=: one dict, the out-of-core plan of the grid: dp, tp, pp, cp, activations "
         "(the plan), step_s and peak_bytes (predicted), resident_blocks and report (the text "
         "the command prints).\n\nKeywords:\n" +
         plan_keywords)
            .c_str());
}

}  // namespace tandem::python
