// MPI from Python: tandem.mpi_world(), this process's rank of the job mpirun started (MPI
// initialised by tandem and finalised at exit, comm/mpi.h), and the communicator's collectives on
// the caller's arrays, in place: what a PyTorch script needs beside the DSL (a DDP communication
// hook reduces its buckets with all_reduce).
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "tandem/comm/mpi.h"
#include "tandem/core/error.h"

namespace tandem::python {
namespace {

// An array a collective reads and writes where it lies.
Tensor collective_buffer(const py::handle& h, const char* call) {
  const CallerArray a = caller_array(h, call);
  if (!a.dtype)
    user_error("{}: the array holds {}; collectives take float32, bfloat16 or float16", call,
               a.dtype_name);
  if (!a.writable) user_error("{}: the array is read-only; the collective writes into it", call);
  return a.view();
}

// Memory from the communicator's allocator, owned by the NumPy array that views it (through a
// capsule, its base): freed when the last array or tensor viewing it goes.
struct Block {
  Allocator* alloc;
  void* data;
  size_t bytes;
};

// numpy.empty's arguments, checked: an extent or a sequence of extents (each >= 0), and a numeric
// NumPy dtype (an object dtype in foreign memory would hold pointers Python never counted).
py::array comm_empty(const PyComm& c, const py::object& shape, const py::object& dtype) {
  std::vector<py::ssize_t> dims;
  const auto extent = [&](const py::handle& d) {
    if (!py::isinstance<py::int_>(d) || py::isinstance<py::bool_>(d))
      user_error("Communicator.empty: shape {} holds {}, not an extent",
                 std::string(py::repr(shape)), std::string(py::repr(d)));
    try {
      dims.push_back(d.cast<py::ssize_t>());
    } catch (const py::cast_error&) {
      user_error("Communicator.empty: shape {} has an extent too large",
                 std::string(py::repr(shape)));
    }
  };
  if (py::isinstance<py::int_>(shape)) {
    extent(shape);
  } else if (py::isinstance<py::sequence>(shape) && !py::isinstance<py::str>(shape)) {
    for (const py::handle& d : shape) extent(d);
  } else {
    user_error("Communicator.empty: shape {} is neither an extent nor a sequence of extents",
               std::string(py::repr(shape)));
  }
  for (py::ssize_t d : dims)
    if (d < 0)
      user_error("Communicator.empty: shape {} has a negative extent",
                 std::string(py::repr(shape)));
  py::dtype dt;
  try {
    dt = py::dtype::from_args(dtype);
  } catch (const py::error_already_set&) {
    user_error("Communicator.empty: dtype {} is not a NumPy dtype", std::string(py::repr(dtype)));
  }
  const char kind = dt.kind();
  if (kind != 'f' && kind != 'i' && kind != 'u' && kind != 'b' && kind != 'c')
    user_error("Communicator.empty: dtype {} is not numeric (float, int, uint, bool, complex)",
               std::string(py::str(dt)));
  size_t bytes = static_cast<size_t>(dt.itemsize());
  for (py::ssize_t d : dims)
    if (__builtin_mul_overflow(bytes, static_cast<size_t>(d), &bytes))
      user_error("Communicator.empty: shape {} of {} is more bytes than an address space holds",
                 std::string(py::repr(shape)), std::string(py::str(dt)));
  Allocator& alloc = c.comm->allocator();
  auto* block = new Block{&alloc, nullptr, std::max<size_t>(bytes, 1)};
  try {
    block->data = alloc.allocate(block->bytes);
  } catch (...) {
    delete block;
    throw;
  }
  const py::capsule owner(block, [](void* p) {
    auto* b = static_cast<Block*>(p);
    b->alloc->deallocate(b->data, b->bytes);
    delete b;
  });
  return py::array(dt, dims, block->data, owner);
}

}  // namespace

void bind_comm(py::module_& m) {
  py::class_<PyComm>(m, "Communicator",
                     "This process's rank of a group of ranks that run programs and collectives "
                     "together (tandem.mpi_world()). Every rank calls each collective together, "
                     "in the same order.")
      .def_property_readonly(
          "rank", [](const PyComm& c) { return c.comm->rank(); }, "This process's rank.")
      .def_property_readonly(
          "size", [](const PyComm& c) { return c.comm->size(); }, "The number of ranks.")
      .def_property_readonly(
          "backend",
          [](const PyComm& c) { return std::string(comm::backend_name(c.comm->backend())); },
          "'mpi'.")
      .def(
          "barrier",
          [](const PyComm& c) {
            py::gil_scoped_release nogil;
            c.comm->barrier();
          },
          "Returns once every rank has called it.")
      .def(
          "all_reduce",
          [](const PyComm& c, const py::object& array, ReduceOp op) {
            const Tensor t = collective_buffer(array, "all_reduce");
            {
              py::gil_scoped_release nogil;
              c.comm->all_reduce(t, op);
            }
            return array;
          },
          py::arg("array"), py::arg("op") = ReduceOp::Sum,
          "Combines every rank's array (NumPy, or a CPU tensor with __dlpack__, C-contiguous, of "
          "the same shape and dtype on every rank) with `op`, in place, with tandem's own "
          "algorithm; returns the array.")
      .def(
          "broadcast",
          [](const PyComm& c, const py::object& array, int root) {
            if (root < 0 || root >= c.comm->size())
              user_error("broadcast: root {} is not a rank of {}", root, c.comm->size());
            const Tensor t = collective_buffer(array, "broadcast");
            {
              py::gil_scoped_release nogil;
              c.comm->broadcast(t, root);
            }
            return array;
          },
          py::arg("array"), py::arg("root") = 0,
          "Copies rank `root`'s array into every rank's, in place; returns the array.")
      .def("empty", &comm_empty, py::arg("shape"), py::arg("dtype") = "float32",
           "A new NumPy array (contents undefined, as numpy.empty's) in the memory this "
           "communicator's collectives read fastest: under MPI, the process's shared arena, which "
           "the other processes of the node map, so that a collective or a bound program on it "
           "(Compiled.bind) reads its peers' buffers where they lie instead of passing them round "
           "a ring. The memory is freed when the last array viewing it goes; torch.from_numpy(a) "
           "views it as a tensor (and keeps it alive).")
      .def("__repr__", [](const PyComm& c) {
        return fmt::format("<tandem.Communicator rank {} of {} ({})>", c.comm->rank(),
                           c.comm->size(), comm::backend_name(c.comm->backend()));
      });

  m.def(
      "mpi_world",
      []() {
        // One world a process, never freed: MPI is finalised at exit (comm/mpi.h), after Python
        // has let go of its references, and a communicator must not be freed after that.
        static auto* world = new std::shared_ptr<comm::Communicator>();
        if (!*world) *world = comm::mpi_world();
        return PyComm{*world};
      },
      "This process's rank of the MPI job it runs in (started with `mpirun -np N python3 ...`; "
      "a world of one rank otherwise). MPI is initialised on the first call (unless the caller "
      "did it, mpi4py say) and finalised at exit. Pass it as comm= to run, Compiled.run and "
      "Compiled.bind.");
  m.def(
      "launched_by_mpirun", []() { return comm::launched_by_mpirun(); },
      "Whether mpirun (or another MPI launcher) started this process.");
  m.def(
      "abort_mpi_job",
      [](int code) {
        py::gil_scoped_release nogil;
        comm::abort_mpi_job(code);
      },
      py::arg("code") = 1,
      "Ends every process of the MPI job (MPI_Abort). For a rank that failed alone: exiting "
      "instead would wait at MPI_Finalize for peers that wait for it.");
}

}  // namespace tandem::python
