"""PyTorch training with tandem's collectives, one process a rank under mpirun.

DistributedFusedAdamW and DistributedFusedLAMB are torch.optim.Optimizers whose step is one tandem
program (the `adam` workload, or `lamb_bucket` with a trust ratio per parameter) under the
autotuner's schedule for its size and job when a record exists (tandem.tune, `tandem tune`), else
"fused(RS-C-AG)+slice(m,v)" (CoCoNeT's fused schedule, ZeRO-1's memory): the gradients are
reduce-scattered, the update runs on this rank's slice inside the reduce-scatter chunk by chunk,
and the new parameters are all-gathered, by the compiled program, in the parameters' and
gradients' own memory, which lives in the communicator's shared arena (Communicator.empty). Both
are _FusedOptimizer with its program chosen (the two bind and run alike). allreduce_hook is a
DistributedDataParallel communication hook that sums each bucket with tandem's all_reduce. All run
across the processes of tandem.mpi_world(). See docs/python.md."""
import numbers

import torch

import tandem

__all__ = ["DistributedFusedAdamW", "DistributedFusedLAMB", "allreduce_hook"]

DEFAULT_SCHEDULE = "fused(RS-C-AG)+slice(m,v)"


def _part(n, ranks, rank):
    """Rank `rank`'s rows [begin, end) of n, as tandem slices them (the first n % ranks one more)."""
    base, extra = divmod(n, ranks)
    begin = rank * base + min(rank, extra)
    return begin, begin + base + (1 if rank < extra else 0)


def _check_hyper_parameters(name, lr, betas, eps, weight_decay):
    """torch.optim's checks of the hyper-parameters, with its exception (ValueError)."""
    def number(x):  # NumPy's scalars too (numbers.Real), not bools
        return isinstance(x, numbers.Real) and not isinstance(x, bool)

    if not number(lr) or not lr >= 0:
        raise ValueError(f"{name}: lr must be a number >= 0, not {lr!r}")
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"{name}: betas must be two numbers (beta1, beta2), not {betas!r}")
    for i, b in enumerate(betas):
        if not number(b) or not 0 <= b < 1:
            raise ValueError(f"{name}: betas[{i}] must be a number in [0, 1), not {b!r}")
    if not number(eps) or not eps >= 0:
        raise ValueError(f"{name}: eps must be a number >= 0, not {eps!r}")
    if not number(weight_decay) or not weight_decay >= 0:
        raise ValueError(f"{name}: weight_decay must be a number >= 0, not {weight_decay!r}")


class _FusedOptimizer(torch.optim.Optimizer):
    """What DistributedFusedAdamW and DistributedFusedLAMB share: a torch.optim.Optimizer whose
    step() runs one tandem optimizer program (w, m, v updated in place from every rank's g, with
    the scalars lr, beta1, beta2, eps, weight_decay, step and grad_scale) across the processes of
    an MPI job, each process holding the whole model and its own batch, as with
    DistributedDataParallel, but with no DDP: step() averages the gradients and updates the
    parameters in one compiled program.

    Schedule: `schedule` (a recipe name, docs/schedules.md) when given; else the autotuner's
    record for `tuned_program` at this parameter count on this job (tandem.tuned), at its chunk
    size; else "fused(RS-C-AG)+slice(m,v)". self.schedule and self.tuning_record say which.

    Memory: the parameters (float32, on the CPU, dense) are moved into one flat buffer, each
    parameter's .data becoming a view of it, and each .grad a view of a flat gradient buffer that
    backward accumulates into; the program reads and writes both in place. Both buffers come from
    comm.empty (under MPI the shared arena the node's processes map), so that the collectives
    read the peers' buffers where they lie. Under a schedule that slices the moments (the
    default) each rank stores only its slice of them (1/ranks). After step() the gradients hold
    intermediate values (the reduce-scatter's): call zero_grad() before the next backward, as
    usual. A parameter whose .grad was replaced (or set to None) is copied back into the buffer at
    the next step. With `per_tensor`, the program takes the parameters' bounds in the flat buffer
    as its segments (lamb_bucket: a trust ratio per parameter).

    Construction broadcasts rank 0's parameters to every rank (as DDP does), and compiles the
    schedule (seconds the first time, then from the JIT's cache). Every rank constructs it and
    calls step() together. The hyper-parameters are read from param_groups[0] at every step (an
    LR scheduler sets "lr"). state_dict() and load_state_dict() carry the step count, the
    hyper-parameters and this rank's moments, for a checkpoint a job of as many processes
    resumes."""

    def __init__(self, params, defaults, *, comm, schedule, program, tuned_program, per_tensor):
        name = type(self).__name__
        _check_hyper_parameters(name, **defaults)
        defaults = dict(defaults, betas=tuple(defaults["betas"]))
        super().__init__(params, defaults)
        if len(self.param_groups) != 1:
            raise tandem.Error(f"{name} takes one parameter group, not {len(self.param_groups)}")
        self._params = [p for p in self.param_groups[0]["params"] if p.requires_grad]
        if not self._params:
            raise tandem.Error(f"{name}: no parameter requires grad")
        for i, p in enumerate(self._params):
            if p.dtype != torch.float32 or p.device.type != "cpu" or p.layout != torch.strided:
                raise tandem.Error(
                    f"{name}: parameter {i} ({tuple(p.shape)}) is a {p.dtype} {p.layout} "
                    f"tensor on {p.device}; tandem updates dense float32 CPU parameters")
        if schedule is not None and not isinstance(schedule, str):
            raise tandem.Error(f"{name}: schedule must be a recipe name (str) or None, "
                               f"not {type(schedule).__name__}")
        self.comm = comm if comm is not None else tandem.mpi_world()
        ranks, rank = self.comm.size, self.comm.rank
        n = sum(p.numel() for p in self._params)
        if n == 0:
            raise tandem.Error(f"{name}: the parameters that require grad hold no elements")
        # The schedule: the caller's recipe, else the autotuner's record for this program, size and
        # job (tandem.tune or `tandem tune`; every rank gets rank 0's), else CoCoNeT's fused one.
        self.tuning_record = None
        chunk_bytes = 0
        if schedule is None:
            self.tuning_record = tandem.tuned(tuned_program, {"N": n}, comm=self.comm)
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
            bounds = [0]  # the parameters' bounds in the flat buffer (empty ones left out)
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
                if p.numel() > 0:
                    bounds.append(offset)
        self.comm.broadcast(self._flat, 0)  # every rank starts from rank 0's parameters
        # The moments as the schedule stores them: this rank's slice (slice(m,v): ZeRO-1) or whole.
        sliced = scheduled.program["m"].layout.dim >= 0
        self._moment_part = _part(n, ranks, rank) if sliced else (0, n)
        begin, end = self._moment_part
        self._m = torch.zeros(end - begin, dtype=torch.float32)
        self._v = torch.zeros(end - begin, dtype=torch.float32)
        self._compiled = tandem.compile(scheduled)
        self._bound = self._compiled.bind(
            {"g": self._flat_grad, "w": self._flat, "m": self._m, "v": self._v}, comm=self.comm,
            chunk_bytes=chunk_bytes, segments=bounds if per_tensor else None)
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
        """One step on every rank's averaged gradient; returns closure()'s loss if given."""
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

    def _layout(self):
        """What a state must match to be loaded here: whose it is and which moments it holds."""
        return {"optimizer": type(self).__name__, "numel": self._flat.numel(),
                "ranks": self.comm.size, "rank": self.comm.rank, "moments": list(self._moment_part)}

    def state_dict(self):
        """This rank's optimizer state, for a checkpoint: {"state": {"step": the steps taken,
        "exp_avg" and "exp_avg_sq": the first and second moments as this rank stores them (its
        slice of the flat buffer under a schedule that slices them, else all of it; copies),
        "optimizer", "numel", "ranks", "rank", "moments": the slice [begin, end)}, "param_groups":
        [the hyper-parameters, as torch.optim's]}. The parameters are the model's state_dict().
        Every rank saves its own (torch.save to a file a rank)."""
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        group["params"] = list(range(len(self._params)))
        state = dict(self._layout(), step=self._step, exp_avg=self._m.clone(),
                     exp_avg_sq=self._v.clone())
        return {"state": state, "param_groups": [group]}

    def load_state_dict(self, state_dict):
        """Resumes from state_dict()'s result, saved by the same rank of a job of as many processes
        with an optimizer of the same class over as many parameter elements and a schedule that
        stores the moments alike: the moments, the step count and the hyper-parameters are
        replaced by the saved ones. Anything else is a ValueError naming what differs."""
        name = f"{type(self).__name__}.load_state_dict"
        if (not isinstance(state_dict, dict) or not isinstance(state_dict.get("state"), dict)
                or not isinstance(state_dict.get("param_groups"), (list, tuple))):
            raise ValueError(f"{name}: expected what state_dict() returns (a dict with 'state' and "
                             f"'param_groups'), got {type(state_dict).__name__}")
        state, groups = state_dict["state"], state_dict["param_groups"]
        missing = [k for k in ("optimizer", "numel", "ranks", "rank", "moments", "step", "exp_avg",
                               "exp_avg_sq") if k not in state]
        if missing:
            raise ValueError(f"{name}: the state has no {', '.join(missing)} (not a tandem fused "
                             f"optimizer's state_dict())")
        mine = self._layout()
        if state["optimizer"] != mine["optimizer"]:
            raise ValueError(f"{name}: the state is {state['optimizer']}'s, not {mine['optimizer']}'s")
        if state["numel"] != mine["numel"]:
            raise ValueError(f"{name}: the state is of {state['numel']} parameter elements; this "
                             f"optimizer's parameters hold {mine['numel']} (another model?)")
        if state["ranks"] != mine["ranks"]:
            raise ValueError(f"{name}: the state was saved by a job of {state['ranks']} processes, "
                             f"this one has {mine['ranks']}: each rank stores its slice of the "
                             f"moments, so resume with as many processes")
        if list(state["moments"]) != mine["moments"]:
            begin, end = mine["moments"]
            raise ValueError(
                f"{name}: the state holds elements [{state['moments'][0]}, {state['moments'][1]}) "
                f"of the moments (rank {state['rank']}'s), this rank {mine['rank']} stores [{begin}, "
                f"{end}) under schedule {self.schedule}: load each rank's own state, under a "
                f"schedule that stores the moments alike")
        for key, want in (("exp_avg", self._m), ("exp_avg_sq", self._v)):
            t = state[key]
            if (not isinstance(t, torch.Tensor) or t.dtype != torch.float32
                    or t.numel() != want.numel()):
                got = (f"a {t.dtype} tensor of {t.numel()} elements" if isinstance(t, torch.Tensor)
                       else type(t).__name__)
                raise ValueError(f"{name}: state['{key}'] must be a float32 tensor of "
                                 f"{want.numel()} elements, got {got}")
        step = state["step"]
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"{name}: state['step'] must be an int >= 0, not {step!r}")
        if len(groups) != 1 or not isinstance(groups[0], dict):
            raise ValueError(f"{name}: expected one parameter group, got {len(groups)}")
        hyper = {k: groups[0].get(k) for k in ("lr", "betas", "eps", "weight_decay")}
        _check_hyper_parameters(name, **hyper)
        with torch.no_grad():  # the bound memory: copied into, never replaced
            self._m.copy_(state["exp_avg"].reshape(-1))
            self._v.copy_(state["exp_avg_sq"].reshape(-1))
        self._step = step
        # As torch.optim does: the saved group's entries (an LR scheduler's initial_lr too).
        saved = {k: v for k, v in groups[0].items() if k != "params"}
        self.param_groups[0].update(saved, betas=tuple(hyper["betas"]))


class DistributedFusedAdamW(_FusedOptimizer):
    """AdamW (as torch.optim.AdamW computes it) across the processes of an MPI job: the `adam`
    workload (float32 gradients). What it shares with DistributedFusedLAMB (schedule, memory,
    state) is _FusedOptimizer's docstring.

    Schedule: `schedule` (a recipe name, docs/schedules.md) when given; else the autotuner's
    record for the adam program at this parameter count on this job (tandem.tuned: what
    tandem.tune(tandem.workloads.adam(tandem.F32), {"N": n}, comm=world) or `tandem tune adam
    --dtype f32 --size N=n --backend mpi --ranks R` wrote), at its chunk size; else
    "fused(RS-C-AG)+slice(m,v)". self.schedule and self.tuning_record say which."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *,
                 comm=None, schedule=None):
        adam = tandem.workloads.adam(tandem.F32)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay),
                         comm=comm, schedule=schedule, program=adam, tuned_program=adam,
                         per_tensor=False)


class DistributedFusedLAMB(_FusedOptimizer):
    """LAMB (You et al.) across the processes of an MPI job, as CoCoNeT fuses it: the gradients
    reduce-scattered, LAMB on this rank's slice, the new parameters all-gathered, one program
    (the `lamb_bucket` workload, float32 gradients). Per parameter tensor p, with g the gradient
    averaged over the ranks:
        m = beta1 m + (1 - beta1) g,   v = beta2 v + (1 - beta2) g^2
        r = (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps) + weight_decay p
        trust = ||p|| / ||r||  (1 where either norm is 0),   p = p - lr trust r
    The norms are each parameter's, over the whole tensor (the program's segments, one a
    parameter: each rank sums the squares of the part of the tensor in its slice, then one
    all-reduce adds the ranks' parts), as apex's FusedLAMB computes them; there is no gradient
    clipping (apex's max_grad_norm). What it shares with DistributedFusedAdamW (memory, state) is
    _FusedOptimizer's docstring.

    Schedule: `schedule` (a recipe name) when given; else the autotuner's record for the `lamb`
    program at this parameter count on this job (tandem.tune(tandem.workloads.lamb(tandem.F32),
    {"N": n}, comm=world), or `tandem tune lamb --dtype f32 ...`: the tuner times programs
    without segments, and lamb_bucket has lamb's stages, so lamb's recipes are its), at its chunk
    size; else "fused(RS-C-AG)+slice(m,v)"."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=1e-2, *,
                 comm=None, schedule=None):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay),
                         comm=comm, schedule=schedule,
                         program=tandem.workloads.lamb_bucket(tandem.F32),
                         tuned_program=tandem.workloads.lamb(tandem.F32), per_tensor=True)

# Per communicator object (DDP hands the hook the one it was registered with, every call): (the
# communicator, a float32 tensor in its shared arena), grown to the largest bucket seen. One buffer
# serves every bucket, as the hook returns only once its sum is copied out.
_staging = {}
_world = []  # tandem.mpi_world() for a hook registered with None: one object, one buffer


def _default_world():
    if not _world:
        _world.append(tandem.mpi_world())  # each call makes a new object over the one world
    return _world[0]


def _staging_buffer(comm, numel):
    """The first `numel` elements of `comm`'s staging buffer in its shared arena."""
    entry = _staging.get(id(comm))
    if entry is None or entry[1].numel() < numel:
        entry = (comm, torch.from_numpy(comm.empty(numel)))
        _staging[id(comm)] = entry
    return entry[1][:numel]


def allreduce_hook(comm, bucket):
    """A DistributedDataParallel communication hook: model.register_comm_hook(tandem.mpi_world(),
    tandem.torch.allreduce_hook). Sums each gradient bucket across the ranks with tandem's
    all_reduce and divides by the rank count (the average DDP's own hook computes), in the
    bucket's memory. A float32 bucket is summed in a buffer of the communicator's shared arena
    (Communicator.empty: the shared-memory algorithms, each rank reading its peers' buffers where
    they lie, at the cost of a copy in and out); a bucket of another dtype is summed where it lies
    (over MPI, the ring of messages). The process group DDP is constructed with must have the
    same ranks as `comm` (None: the MPI world)."""
    comm = comm if comm is not None else _default_world()
    buffer = bucket.buffer()
    if buffer.dtype == torch.float32 and buffer.is_contiguous():
        staged = _staging_buffer(comm, buffer.numel())
        staged.copy_(buffer.reshape(-1))
        comm.all_reduce(staged)
        torch.div(staged, comm.size, out=buffer.view(-1))
    else:
        comm.all_reduce(buffer)
        buffer.div_(comm.size)
    future = torch.futures.Future()
    future.set_result(buffer)
    return future
