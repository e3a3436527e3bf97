// What the files of the Python bindings share: the handles Python holds on programs and their
// stages, and the functions that add each file's part to the module. Bindings only: every rule
// (typing, layouts, schedules, running) is the C++ library's, and its UserError reaches Python as
// tandem.Error with the same message.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>

#include "tandem/comm/communicator.h"
#include "tandem/dsl/ir.h"

namespace tandem::python {

namespace py = pybind11;

// A stage of a program, as Python holds it: the program is shared, so that an Expr keeps its
// program alive (a C++ dsl::Expr only points at it) and the program never moves while Exprs exist.
struct PyExpr {
  std::shared_ptr<dsl::Program> program;
  int id = -1;
  dsl::Expr expr() const { return {program.get(), id}; }
};

// A communicator Python holds (tandem.Communicator): this process's rank of an MPI job.
struct PyComm {
  std::shared_ptr<comm::Communicator> comm;
};

// The DSL (types, layouts, programs, stages, operators, the workloads) and schedules (module.cc).
void bind_dsl(py::module_& m);
void bind_schedule(py::module_& m);
// Running with the interpreter, the plan runner and the compiled executor, on in-process ranks or
// on this process's rank of an MPI job, on copies of the caller's arrays or in them (run.cc).
void bind_run(py::module_& m);
// MPI from Python: the world communicator and its collectives on the caller's arrays (comm.cc).
void bind_comm(py::module_& m);
// tandem.train and tandem.plan: the commands' flags as keywords, a per-step callback (train.cc).
void bind_train(py::module_& m);
// tandem.load_checkpoint: a checkpoint's or Hugging Face folder's weights (checkpoint.cc).
void bind_checkpoint(py::module_& m);
// tandem.Tokenizer: SentencePiece and tokenizer.json encoding and decoding (tokenizer.cc).
void bind_tokenizer(py::module_& m);
// The autotuner: tandem.tune and tandem.tuned, on the command's cache (tune.cc).
void bind_tune(py::module_& m);

}  // namespace tandem::python
