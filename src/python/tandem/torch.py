"""PyTorch training with tandem's collectives, one process a rank under mpirun.

DistributedFusedAdamW is a torch.optim.Optimizer whose step is the `adam` workload under the
autotuner's schedule for its size and job when a record exists (tandem.tune, `tandem tune`), else
"fused(RS-C-AG)+slice(m,v)" (CoCoNeT's fused schedule, ZeRO-1's memory): the gradients are
reduce-scattered, AdamW runs on this rank's slice inside the reduce-scatter chunk by chunk, and the
new parameters are all-gathered, by the compiled program, in the parameters' and gradients' own
memory, which lives in the communicator's shared arena (Communicator.empty). allreduce_hook is a DistributedDataParallel communication hook that sums each bucket with
tandem's all_reduce. Both run across the processes of tandem.mpi_world(). See docs/python.md."""
import torch

import tandem

__all__ = ["DistributedFusedAdamW", "allreduce_hook"]

DEFAULT_SCHEDULE = "fused(RS-C-AG)+slice(m,v)"


def _part(n, ranks, rank):
    """Rank `rank`'s rows [begin, end) of n, as tandem slices them (the first n % ranks one more)."""
    base, extra = divmod(n, ranks)
    begin = rank * base + min(rank, extra)
    return begin, begin + base + (1 if rank < extra else 0)


class DistributedFusedAdamW(torch.optim.Optimizer):
    """AdamW (as torch.optim.AdamW computes it) across the processes of an MPI job, each process
    holding the whole model and its own batch, as with DistributedDataParallel, but with no DDP:
    step() averages the gradients and updates the parameters in one compiled tandem program.

    Schedule: `schedule` (a recipe name, docs/schedules.md) when given; else the autotuner's
    record for the adam program at this parameter count on this job (tandem.tuned: what
    tandem.tune(tandem.workloads.adam(tandem.F32), {"N": n}, comm=world) or `tandem tune adam
    --dtype f32 --size N=n --backend mpi --ranks R` wrote), at its chunk size; else
    "fused(RS-C-AG)+slice(m,v)". self.schedule and self.tuning_record say which.

    Memory: the parameters (float32, on the CPU, dense) are moved into one flat buffer, each
    parameter's .data becoming a view of it, and each .grad a view of a flat gradient buffer that
    backward accumulates into; the program reads and writes both in place. Both buffers come from
    comm.empty (under MPI the shared arena the node's processes map), so that the collectives
    read the peers' buffers where they lie. Under a schedule that slices the moments (the default)
    each rank stores only its slice of them (1/ranks). After step() the gradients hold intermediate values
    (the reduce-scatter's): call zero_grad() before the next backward, as usual. A parameter whose
    .grad was replaced (or set to None) is copied back into the buffer at the next step.

    Construction broadcasts rank 0's parameters to every rank (as DDP does), and compiles the
    schedule (seconds the first time, then from the JIT's cache). Every rank constructs it and
    calls step() together. lr may be changed between steps through param_groups[0]["lr"] (an LR
    scheduler does); the other hyper-parameters are fixed at construction."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *,
                 comm=None, schedule=None):
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise tandem.Error(f"DistributedFusedAdamW takes one parameter group, not {len(self.param_groups)}")
        self._params = [p for p in self.param_groups[0]["params"] if p.requires_grad]
        if not self._params:
            raise tandem.Error("DistributedFusedAdamW: no parameter requires grad")
        for i, p in enumerate(self._params):
            if p.dtype != torch.float32 or p.device.type != "cpu" or p.layout != torch.strided:
                raise tandem.Error(
                    f"DistributedFusedAdamW: parameter {i} ({tuple(p.shape)}) is a {p.dtype} {p.layout} "
                    f"tensor on {p.device}; tandem updates dense float32 CPU parameters")
        if schedule is not None and not isinstance(schedule, str):
            raise tandem.Error(f"DistributedFusedAdamW: schedule must be a recipe name (str) or None, "
                               f"not {type(schedule).__name__}")
        self.comm = comm if comm is not None else tandem.mpi_world()
        ranks, rank = self.comm.size, self.comm.rank
        n = sum(p.numel() for p in self._params)
        program = tandem.workloads.adam(tandem.F32)
        # The schedule: the caller's recipe, else the autotuner's record for this program, size and
        # job (tandem.tune or `tandem tune`; every rank gets rank 0's), else CoCoNeT's fused one.
        self.tuning_record = None
        chunk_bytes = 0
        if schedule is None:
            self.tuning_record = tandem.tuned(program, {"N": n}, comm=self.comm)
            if self.tuning_record is not None:
                schedule, chunk_bytes = self.tuning_record.winner, self.tuning_record.chunk_bytes
            else:
                schedule = DEFAULT_SCHEDULE
        self.schedule = schedule
        self.chunk_bytes = chunk_bytes
        scheduled = tandem.schedule(program, schedule)  # a recipe that does not parse: tandem.Error
        # The flat parameters and gradients live in the communicator's memory (comm.empty: under
        # MPI the shared arena, which the node's processes map), so that the program's collectives
        # read the peers' buffers where they lie rather than pass them round a ring. The tensors
        # view the NumPy arrays, which keep the memory alive as long as any view of it.
        with torch.no_grad():
            self._flat = torch.from_numpy(self.comm.empty(n))
            self._flat_grad = torch.from_numpy(self.comm.empty(n)).zero_()
            self._views = []  # per parameter: (its .data view, its .grad view)
            offset = 0
            for p in self._params:
                w = self._flat[offset:offset + p.numel()].view_as(p)
                g = self._flat_grad[offset:offset + p.numel()].view_as(p)
                w.copy_(p.data)
                if p.grad is not None:
                    g.copy_(p.grad)
                p.data = w
                p.grad = g
                self._views.append((w, g))
                offset += p.numel()
        self.comm.broadcast(self._flat, 0)  # every rank starts from rank 0's parameters
        # The moments as the schedule stores them: this rank's slice (slice(m,v): ZeRO-1) or whole.
        def moment(name):
            begin, end = _part(n, ranks, rank) if scheduled.program[name].layout.dim >= 0 else (0, n)
            return torch.zeros(end - begin, dtype=torch.float32)

        self._m, self._v = moment("m"), moment("v")
        self._compiled = tandem.compile(scheduled)
        self._bound = self._compiled.bind(
            {"g": self._flat_grad, "w": self._flat, "m": self._m, "v": self._v}, comm=self.comm,
            chunk_bytes=chunk_bytes)
        self._step = 0

    def zero_grad(self, set_to_none=False):
        """Zeroes the flat gradient buffer (the parameters' .grad views stay: set_to_none is
        ignored, as the gradients must live in the buffer)."""
        with torch.no_grad():
            self._flat_grad.zero_()
            for p, (_, g) in zip(self._params, self._views):
                if p.grad is None or p.grad.data_ptr() != g.data_ptr():
                    p.grad = g

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW step on every rank's averaged gradient; returns closure()'s loss if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for p, (w, g) in zip(self._params, self._views):
            if p.data.data_ptr() != w.data_ptr():  # replaced by the caller: back into the buffer
                w.copy_(p.data)
                p.data = w
            if p.grad is None:
                g.zero_()
                p.grad = g
            elif p.grad.data_ptr() != g.data_ptr():
                g.copy_(p.grad)
                p.grad = g
        group = self.param_groups[0]
        self._step += 1
        beta1, beta2 = group["betas"]
        self._bound.run(dict(lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                             weight_decay=group["weight_decay"], step=self._step,
                             grad_scale=1.0 / self.comm.size))
        return loss


def allreduce_hook(comm, bucket):
    """A DistributedDataParallel communication hook: model.register_comm_hook(tandem.mpi_world(),
    tandem.torch.allreduce_hook). Sums each gradient bucket across the ranks with tandem's
    all_reduce, in place, and divides by the rank count (the average DDP's own hook computes).
    The process group DDP is constructed with must have the same ranks as `comm` (None: the MPI
    world)."""
    comm = comm if comm is not None else tandem.mpi_world()
    buffer = bucket.buffer()
    comm.all_reduce(buffer)
    buffer.div_(comm.size)
    future = torch.futures.Future()
    future.set_result(buffer)
    return future
