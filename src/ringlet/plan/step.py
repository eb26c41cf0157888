"""A training step simulated: ``ringlet plan --simulate``.

:func:`~ringlet.plan.strategies.plan` overlaps communication with compute by a
formula (:func:`~ringlet.plan.strategies.window_exposed`: one stream walks the
buckets as the passes make them ready).  Here the step is run
through the simulator (:mod:`ringlet.sim`), bucket by bucket, on the ranks of
one data-parallel group, each rank with its own clock:

* **Compute.**  The forward pass takes ``(1 - backward_fraction)`` of the compute
  time, the backward pass the rest; each rank runs them back to back, the
  backward when its forward is done.  The communication that sits on the
  critical path (tensor-parallel all-reduces, expert all-to-alls, pipeline
  sends) is simulated once per kind, one call times its calls per step, and
  lengthens each pass by half of it (half of it is in the forward pass, half
  in the backward).
* **Buckets.**  Data-parallel traffic is cut into buckets (``bucket_bytes``, 25
  MiB by default, like PyTorch DDP).  A gradient bucket (DDP's all-reduce,
  ZeRO's reduce-scatter) is *released* when the backward pass has produced it:
  the pass makes a kind's bytes at an even rate, so bucket ``k`` once a rank's
  backward has made the bytes up to its end (a 25 MiB bucket of a 30 MB
  gradient at 87 % of the way; the last, at the end).  A parameter bucket
  (ZeRO's all-gathers) is *needed*: the pass cannot run past the fraction of
  the bytes before bucket ``k`` before it has arrived, and it is prefetched one
  bucket ahead (issued when the pass reaches bucket ``k - 1``'s start; the
  first at the pass's start).  ZeRO-1/2's all-gather of the updated
  parameters is prefetched in the forward pass, ZeRO-3's in both passes.
* **One communication stream.**  The buckets run one after the other, in the
  order they are issued (NCCL's stream order); on each rank a bucket starts
  when the rank is done with the previous one and has issued this one, and the
  simulator runs it with the ranks' different start times (a rank that is late
  holds up the others, exactly as in ``ringlet simulate --straggler``).  The
  critical-path communication is not on that stream (it is part of the passes,
  on its own communicator), and the two do not contend for links here.
* **Stragglers** (``{rank: seconds}``) start the step that late.  Every rank of
  the job is placed in one data-parallel group: rank ``r`` is member ``(r //
  tp) % dp`` (Megatron's layout; a straggler's tensor-parallel peers wait for
  it at every layer, so its whole slice of the group is late), the group
  holding every straggler, which is the slowest.  ``jitter`` and ``seed`` are
  the simulator's, each call drawing its noise from its own seed derived from
  ``seed``: the same seed gives the same step.

What it reports: ``total_seconds``, the communication time (each bucket from
the first rank's start to the last rank's end, the waits for late ranks
included, plus the critical-path communication); ``exposed_seconds``, what the
step takes beyond its compute (``step - compute``: the passes' stalls on
parameter buckets, the critical-path communication and the tail of gradient
buckets after the backward pass); and ``step_seconds`` (the pipeline bubble
added as in :attr:`~ringlet.plan.strategies.StepPlan.step_seconds`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cost.units import format_bytes
from ..errors import ArgumentError
from ..sim import AnySimulator, Topology, simulator
from .strategies import (
    Comm,
    Costing,
    ModelShape,
    Parallelism,
    _predict_one,
    communications,
    group_profile,
)

#: Order of the kinds in the stream when two buckets are issued at the same point.
_NEED, _RELEASE = 0, 1


@dataclass
class _Op:
    """One bucket of data-parallel communication."""

    comm: int                 # index into the step's data-parallel comms
    bucket: int
    nbytes: int
    pass_: int                # 0 forward, 1 backward
    kind: int                 # _NEED (parameters) or _RELEASE (gradients)
    issue: float              # fraction of the pass at which it is issued
    gate: float               # _NEED: fraction of the pass it must be there before


@dataclass(frozen=True)
class SimulatedComm:
    """One kind of communication of a simulated step."""

    what: str
    collective: str
    group: str
    group_size: int
    window: str
    algorithm: str
    calls: int                # buckets (data-parallel) or calls per step (critical path)
    seconds: float            # busy time per step, waits for late ranks included
    last_seconds: float       # the last bucket's (or one call's) time

    def to_dict(self) -> dict[str, Any]:
        return {"what": self.what, "collective": self.collective, "group": self.group,
                "group_size": self.group_size, "window": self.window,
                "algorithm": self.algorithm, "calls": self.calls, "seconds": self.seconds,
                "last_seconds": self.last_seconds}


@dataclass(frozen=True)
class StepSimulation:
    """A simulated training step (see the module docs)."""

    compute_seconds: float
    comms: tuple[SimulatedComm, ...]
    total_seconds: float
    exposed_seconds: float
    step_seconds: float
    bubble_seconds: float
    group_size: int
    slowest_member: int
    stragglers: dict[int, float] = field(default_factory=dict)
    jitter: float = 0.0
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"compute_seconds": self.compute_seconds, "total_seconds": self.total_seconds,
                "exposed_seconds": self.exposed_seconds, "step_seconds": self.step_seconds,
                "bubble_seconds": self.bubble_seconds, "group_size": self.group_size,
                "slowest_member": self.slowest_member,
                "stragglers": {str(k): v for k, v in sorted(self.stragglers.items())},
                "jitter": self.jitter, "seed": self.seed,
                "communications": [c.to_dict() for c in self.comms]}


class _Pass:
    """Per-rank progress through a pass of ``width`` seconds that waits at gates."""

    def __init__(self, start: np.ndarray, width: float) -> None:
        self.t = start.copy()
        self.f = 0.0
        self.width = width
        self.gates: list[tuple[float, np.ndarray]] = []   # (fraction, members' arrival)

    def advance(self, f: float) -> np.ndarray:
        """Run every rank to fraction ``f`` of the pass, waiting at the gates on the way."""
        f = max(f, self.f)
        self.gates.sort(key=lambda g: g[0])
        while self.gates and self.gates[0][0] <= f:
            g, arrive = self.gates.pop(0)
            self.t = np.maximum(self.t + (g - self.f) * self.width, arrive)
            self.f = g
        self.t = self.t + (f - self.f) * self.width
        self.f = f
        return self.t


def _seed(seed: int, i: int) -> int:
    return int(np.random.SeedSequence([seed, i]).generate_state(1)[0])


def _run(sim: AnySimulator, start: np.ndarray, jitter: float, seed: int) -> np.ndarray:
    """The simulated call from per-rank ``start`` times: per-rank end times."""
    base = float(start.min())
    late = start - base
    stragglers = {int(r): float(late[r]) for r in np.flatnonzero(late > 0)}
    res = sim.run(stragglers, jitter, seed)
    return base + np.maximum(res.finish, late)


#: the most data-parallel buckets a simulated step takes (each is simulated: 14 million
#: 1 KB buckets of a 7B model ran without end)
MAX_BUCKETS = 100_000


def _buckets(c: Comm, bucket_bytes: float) -> list[int]:
    full, rest = divmod(c.nbytes, bucket_bytes)
    sizes = [int(round(bucket_bytes))] * int(full)
    if rest > 0 or not sizes:
        sizes.append(max(1, int(round(rest))))
    return sizes


def simulate_step(par: Parallelism, model: ModelShape, how: Costing, *,
                  compute_seconds: float | None = None, backward_fraction: float = 2 / 3,
                  stragglers: Mapping[int, float] | None = None, jitter: float = 0.0,
                  seed: int = 0, progress: Callable[[int, int], None] | None = None
                  ) -> StepSimulation:
    """Simulate one training step (see the module docs)."""
    if how.textbook:
        raise ArgumentError("--simulate runs the exact schedules: leave out --textbook")
    if not 0 < backward_fraction < 1:
        raise ArgumentError(f"backward fraction must be in (0, 1), got {backward_fraction}")
    compute = 0.0 if compute_seconds is None else float(compute_seconds)
    if not (math.isfinite(compute) and compute >= 0):
        raise ArgumentError(f"compute time must be >= 0, got {compute_seconds}")
    if not (math.isfinite(jitter) and jitter >= 0):
        raise ArgumentError(f"jitter sigma must be a number >= 0, got {jitter!r}")
    comms = communications(par, model)
    buckets = sum(max(1, math.ceil(c.nbytes / how.bucket_bytes)) for c in comms
                  if c.window != "exposed")
    if buckets > MAX_BUCKETS:
        raise ArgumentError(
            f"--simulate: {format_bytes(how.bucket_bytes)} buckets make {buckets:,} of them a "
            f"step, more than the {MAX_BUCKETS:,} the simulator takes; give a larger --bucket "
            f"(DDP's default is 25 MiB), or leave out --simulate")
    n = par.dp
    late = np.zeros(max(n, 1))
    for r, d in (stragglers or {}).items():
        if not 0 <= r < par.ranks:
            raise ArgumentError(f"straggler rank {r} is out of range (0..{par.ranks - 1})")
        if not (math.isfinite(d) and d >= 0):
            raise ArgumentError(f"straggler delay must be >= 0 seconds, got {d!r}")
        j = (r // par.tp) % par.dp
        late[j] = max(late[j], d)
    cache: dict[tuple[Any, ...], tuple[AnySimulator, str]] = {}

    def sim_for(c: Comm, nbytes: int) -> tuple[AnySimulator, str]:
        coll = "broadcast" if c.collective == "send" else c.collective
        size = 2 if c.collective == "send" else c.group_size
        key = (coll, size, c.stride, nbytes)
        if key not in cache:
            gp = group_profile(how.profile, c.stride, c.group_size)
            p = _predict_one(coll, size, nbytes, gp, model.dtype, how)
            topo = Topology.from_profile(gp)
            cache[key] = (simulator(coll, p.algorithm, size, nbytes, topo, dtype=model.dtype,
                                    params=p.params), p.algorithm)
        return cache[key]

    calls = 0
    out: list[SimulatedComm] = []
    # the critical path: one call simulated, times the calls per step
    critical = 0.0
    for c in comms:
        if c.window != "exposed":
            continue
        sim, algo = sim_for(c, int(round(c.nbytes)))
        one = sim.run(None, jitter, _seed(seed, calls)).seconds
        calls += 1
        critical += one * c.calls
        out.append(SimulatedComm(c.what, c.collective, c.group, c.group_size, c.window,
                                 "send" if c.collective == "send" else algo, c.calls,
                                 one * c.calls, one))
    # the data-parallel buckets, in stream order
    dps = [c for c in comms if c.window != "exposed"]
    ops: list[_Op] = []
    for ci, c in enumerate(dps):
        sizes = _buckets(c, how.bucket_bytes)
        # the pass makes (or uses) the kind's bytes evenly: bucket k is released when the
        # bytes up to its end are made, needed when the bytes before it are used
        made = np.cumsum(sizes) / sum(sizes)
        before = [0.0, *made[:-1]]
        pass_ = 0 if c.window == "forward" else 1
        for k, size in enumerate(sizes):
            if c.collective == "all_gather":
                ops.append(_Op(ci, k, size, pass_, _NEED, before[max(0, k - 1)], before[k]))
            else:
                ops.append(_Op(ci, k, size, pass_, _RELEASE, float(made[k]), 1.0))
    ops.sort(key=lambda o: (o.pass_, o.issue, o.kind, o.comm, o.bucket))
    groups = [_groups(c, par) for c in dps]
    fwd = _Pass(late, compute * (1 - backward_fraction) + critical / 2)
    bwd: _Pass | None = None
    stream = late.copy()
    busy = [0.0] * len(dps)
    last = [0.0] * len(dps)
    algos = [""] * len(dps)
    total_ops = len(ops)
    for i, o in enumerate(ops):
        if progress is not None:
            progress(i, total_ops)
        if o.pass_ == 0:
            ps = fwd
        else:
            if bwd is None:
                bwd = _Pass(fwd.advance(1.0), compute * backward_fraction + critical / 2)
            ps = bwd
        issued = ps.advance(o.issue)
        sim, algo = sim_for(dps[o.comm], o.nbytes)
        arrive = np.zeros(len(late))
        first, final = math.inf, -math.inf
        prev: tuple[np.ndarray, np.ndarray] | None = None
        for idx in groups[o.comm]:
            start = np.maximum(stream[idx], issued[idx])
            if prev is not None and not jitter and np.array_equal(start, prev[0]):
                end = prev[1]    # the same call from the same start: the same end
            else:
                end = _run(sim, start, jitter, _seed(seed, calls))
                calls += 1
            prev = (start, end)
            stream[idx] = end
            arrive[idx] = end
            first, final = min(first, float(start.min())), max(final, float(end.max()))
        took = final - first
        busy[o.comm] += took
        last[o.comm] = took
        algos[o.comm] = algos[o.comm] or algo
        if o.kind == _NEED:
            ps.gates.append((o.gate, arrive))
    if progress is not None:
        progress(total_ops, total_ops)
    if bwd is None:
        bwd = _Pass(fwd.advance(1.0), compute * backward_fraction + critical / 2)
    done = np.maximum(bwd.advance(1.0), stream)
    for ci, c in enumerate(dps):
        out.append(SimulatedComm(c.what, c.collective, c.group, c.group_size, c.window,
                                 algos[ci], len(_buckets(c, how.bucket_bytes)), busy[ci],
                                 last[ci]))
    step = float(done.max()) if len(done) else compute + critical
    exposed = max(0.0, step - compute)
    p, m = par.pp, model.microbatches
    bubble = compute * (p - 1) / m if p > 1 else 0.0
    return StepSimulation(compute, tuple(out), sum(c.seconds for c in out), exposed,
                          step + bubble, bubble, n, int(np.argmax(done)) if len(done) else 0,
                          {int(k): float(v) for k, v in (stragglers or {}).items()}, jitter,
                          seed)


def _groups(c: Comm, par: Parallelism) -> list[np.ndarray]:
    """The members of the data-parallel group that run ``c``, one array per group that runs
    it: all of them, or for the experts' gradients every expert shard's ``dp / ep`` members
    (``ep`` apart in the group), each shard in its own group at the same time."""
    if c.group_size == par.dp:
        return [np.arange(par.dp)]
    step = par.dp // c.group_size
    return [np.arange(k, par.dp, step) for k in range(step)]
