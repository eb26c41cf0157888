"""Timing collectives on live ranks: what the calibration, the regret and the validation measure.

A :class:`Case` is one collective of one size with one algorithm (``None``:
the communicator's automatic choice).  :func:`run` starts ``nranks`` ranks
with :func:`ringlet.spawn` and times every case the way nccl-tests does: a
barrier, a batch of calls, and the batch's mean time per call on the slowest
rank.  Cases of one collective and size are timed in turns (case 1, case 2,
..., case 1, case 2, ...) ``reps`` times, so a burst of load from another
process hits every algorithm alike, and :attr:`Sample.seconds` is the median
over the batches.

Sizes follow nccl-tests (and :func:`ringlet.algorithms.select.choose`): the
vector of all_reduce, broadcast and reduce; the whole output of all_gather
and gather; the whole input of reduce_scatter, scatter and all_to_all.  A
size is rounded down to whole float32 elements (whole blocks for the
per-rank collectives), and up to one element per rank.  Buffers hold zeros,
so repeated reductions neither overflow nor slow down.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..config import Settings
from ..errors import ArgumentError
from ..schedule import COLLECTIVES

#: the collectives whose size counts every rank's block (nccl-tests' per-rank convention)
PER_RANK = frozenset({"all_gather", "reduce_scatter", "all_to_all", "scatter", "gather"})
#: the element type every case uses
DTYPE = np.dtype(np.float32)
#: where every buffer starts, in bytes past a 4 KiB page boundary (see :func:`aligned`):
#: where a fresh numpy array of 128 KiB or more starts (glibc's mmap'd blocks), as users'
OFFSET = 16


def aligned(shape: int | tuple[int, ...], dtype: Any = DTYPE, offset: int = OFFSET
            ) -> np.ndarray:
    """Zeros of ``shape`` starting ``offset`` bytes past a page boundary.

    Where a buffer starts matters on some CPUs: copying out of a page-aligned
    area into a buffer that starts 16 bytes past a page boundary (what a fresh
    numpy array of 128 KiB or more gets from glibc) can run several times
    slower than into one that starts elsewhere (false 4K-aliasing; the
    transport's data areas start half a page in for that, ``transport.shm.SKEW``).
    Measurements allocate every buffer at the same offset, the one users' large
    arrays have, so that they are repeatable and say what users see.

    The zeros are written, not left to the allocator: untouched zeroed memory
    is one shared zero page to the CPU, which reads as if it were in the cache.
    """
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) * dt.itemsize
    raw = np.empty(n + 8192, np.uint8)
    raw.fill(0)
    start = (offset - raw.ctypes.data) % 4096
    return raw[start:start + n].view(dt).reshape(shape)


@dataclass(frozen=True)
class Case:
    """One collective call to time: ``collective`` of ``nbytes`` with ``algorithm``
    (``None``: the communicator's automatic choice).  ``barrier`` ignores the size."""

    collective: str
    nbytes: int
    algorithm: str | None = None

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVES and self.collective != "barrier":
            raise ArgumentError(
                f"unknown collective {self.collective!r}; valid: {', '.join(COLLECTIVES)} "
                f"or barrier")
        if self.nbytes < 1:
            raise ArgumentError(f"a case needs nbytes >= 1, got {self.nbytes}")


@dataclass
class Sample:
    """A timed :class:`Case`: median seconds per call, every batch, calls per batch, and
    the algorithm the communicator ran (its own choice for ``algorithm=None``)."""

    case: Case
    nranks: int
    nbytes: int                 # the size actually run (whole elements / blocks)
    seconds: float              # median over the batches
    batches: list[float] = field(default_factory=list)
    calls: int = 1              # calls per batch
    ran: str = ""

    @property
    def spread(self) -> float:
        """(largest - smallest batch) / median: how noisy the measurement was."""
        if not self.batches or self.seconds <= 0:
            return 0.0
        return (max(self.batches) - min(self.batches)) / self.seconds


def rounded(collective: str, nbytes: int, nranks: int) -> tuple[int, int]:
    """``(nbytes actually run, count per rank or block)`` for a requested size."""
    unit = DTYPE.itemsize * (nranks if collective in PER_RANK else 1)
    count = max(1, int(nbytes) // unit)
    return count * unit, count


def _call(comm: Any, collective: str, count: int, algorithm: str | None
          ) -> Callable[[], object]:
    """One rank's buffers for ``collective`` and a function making one call on them."""
    n, r = comm.size, comm.rank
    z = aligned
    a = algorithm
    x: np.ndarray | None
    y: np.ndarray | None
    if collective == "barrier":
        return comm.barrier
    if collective == "all_reduce":
        x = z(count, DTYPE)
        return lambda: comm.all_reduce(x, algorithm=a)
    if collective == "broadcast":
        x = z(count, DTYPE)
        return lambda: comm.broadcast(x, 0, algorithm=a)
    if collective == "reduce":
        x, y = z(count, DTYPE), (z(count, DTYPE) if r == 0 else None)
        return lambda: comm.reduce(x, 0, out=y, algorithm=a)
    if collective == "all_gather":
        x, y = z(count, DTYPE), z((n, count), DTYPE)
        return lambda: comm.all_gather(x, out=y, algorithm=a)
    if collective == "reduce_scatter":
        x, y = z(n * count, DTYPE), z(count, DTYPE)
        return lambda: comm.reduce_scatter(x, out=y, algorithm=a)
    if collective == "all_to_all":
        x, y = z(n * count, DTYPE), z(n * count, DTYPE)
        return lambda: comm.all_to_all(x, out=y, algorithm=a)
    if collective == "scatter":
        x, y = (z(n * count, DTYPE) if r == 0 else None), z(count, DTYPE)
        return lambda: comm.scatter(x, 0, out=y, algorithm=a)
    if collective == "gather":
        x, y = z(count, DTYPE), (z((n, count), DTYPE) if r == 0 else None)
        return lambda: comm.gather(x, 0, out=y, algorithm=a)
    if collective in ("scan", "exscan"):
        x, y = z(count, DTYPE), z(count, DTYPE)
        fn = getattr(comm, collective)
        return lambda: fn(x, out=y, algorithm=a)
    raise ArgumentError(f"no buffers for collective {collective!r}")


def _max(comm: Any, values: Sequence[float]) -> np.ndarray:
    """Element-wise maximum over the ranks (outside any timed region)."""
    v = np.array(values, np.float64)
    if v.size:
        comm.all_reduce(v, "max")
    return v


def warm_up(comm: Any, seconds: float) -> None:
    """Small collectives for ``seconds`` (all ranks stop together), so that every rank is
    running and warm before anything is timed (the first timings of a fresh job are slow)."""
    x = np.zeros(16, np.float32)
    end = np.array([time.perf_counter() + seconds])
    comm.broadcast(end, 0)
    while True:
        comm.all_reduce(x)
        flag = np.array([time.perf_counter() > end[0]], np.int64)
        comm.all_reduce(flag, "max")
        if flag[0]:
            return


def time_rank(comm: Any, cases: Sequence[Case], reps: int, budget: float,
              max_calls: int = 1000) -> list[tuple[int, list[float], int, str]]:
    """The body every rank runs: ``(nbytes run, per-batch seconds, calls per batch,
    algorithm run)`` per case.

    Cases are grouped by (collective, size); within a group they are timed in
    turns.  A batch is as many calls as fit in ``budget`` seconds (at least one,
    at most ``max_calls``), sized from a warm-up call timed on every rank.
    """
    if reps < 1:
        raise ArgumentError(f"reps must be >= 1, got {reps}")
    warm_up(comm, min(0.2, 20 * budget))
    out: list[tuple[int, list[float], int, str]] = [(0, [], 0, "")] * len(cases)
    groups: dict[tuple[str, int], list[int]] = {}
    for i, c in enumerate(cases):
        groups.setdefault((c.collective, c.nbytes), []).append(i)
    for (coll, nbytes), idx in groups.items():
        real, count = rounded(coll, nbytes, comm.size)
        calls = [_call(comm, coll, count, cases[i].algorithm) for i in idx]
        warm: list[float] = []
        for f in calls:
            f()                                  # first touch of the buffers, choice cached
            comm.barrier()
            t0 = time.perf_counter()
            f()
            warm.append(time.perf_counter() - t0)
        ks = [max(1, min(max_calls, int(budget / t) if t > 0 else max_calls))
              for t in _max(comm, warm)]
        local = np.zeros((reps, len(calls)))
        for rep in range(reps):
            for j, f in enumerate(calls):
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(ks[j]):
                    f()
                local[rep, j] = (time.perf_counter() - t0) / ks[j]
        worst = _max(comm, local.ravel().tolist()).reshape(reps, len(calls))
        for j, i in enumerate(idx):
            # the communicator's own (cached) answer: what the calls above ran
            ran = "" if coll == "barrier" else comm._choose(coll, cases[i].algorithm, real)
            out[i] = (real, worst[:, j].tolist(), ks[j], ran)
        del calls
    return out


def run(nranks: int, cases: Sequence[Case], *, reps: int = 5, budget: float = 0.02,
        settings: Settings | None = None, max_calls: int = 1000) -> list[Sample]:
    """Time ``cases`` on ``nranks`` fresh local ranks; one :class:`Sample` per case."""
    from ..launch import spawn

    res = spawn(time_rank, nranks, list(cases), reps, budget, max_calls, settings=settings)
    samples = []
    for c, (real, batches, k, ran) in zip(cases, res[0], strict=True):
        samples.append(Sample(c, nranks, real, statistics.median(batches), batches, k, ran))
    return samples


def applicable(collective: str, nranks: int) -> list[str]:
    """The registered algorithms of ``collective`` that can run on ``nranks`` ranks."""
    from ..algorithms import algorithms, build

    out = []
    for name in algorithms(collective):
        try:
            build(collective, name, nranks)
        except ArgumentError:
            continue
        out.append(name)
    return out


def idle(seconds: float = 1.0) -> float:
    """The fraction of CPU time the whole machine spent idle over ``seconds`` (Linux)."""

    def snap() -> tuple[int, int]:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]

    a = snap()
    time.sleep(seconds)
    b = snap()
    return (b[1] - a[1]) / max(1, b[0] - a[0])


def wait_quiet(limit: float = 300.0, want: float = 0.9) -> tuple[float, float]:
    """Wait (up to ``limit`` seconds) until the CPUs are at least ``want`` idle over a
    second; returns (the idle fraction seen, seconds waited)."""
    start = time.monotonic()
    while True:
        got = idle(1.0)
        waited = time.monotonic() - start
        if got >= want or waited >= limit:
            return got, waited


def sweep(nranks: int, collectives: Sequence[str], sizes: Sequence[int], *, auto: bool,
          reps: int = 5, budget: float = 0.02, repeat: int = 3,
          settings: Settings | None = None, quiet: float = 300.0,
          log: Callable[[str], None] | None = None) -> list[Sample]:
    """Every applicable algorithm (and the automatic choice if ``auto``) of every
    collective at every size, ``repeat`` times, each time after waiting for a quiet
    machine (and again, up to three times, if the machine is not idle right after: some
    other work ran during the measurement): one :class:`Sample` per case, ``seconds``
    the median over the repeats of each repeat's median, ``batches`` those per-repeat
    medians."""
    got: dict[Case, list[Sample]] = {}
    for rnd in range(repeat):
        for coll in collectives:
            names: list[str | None] = list(applicable(coll, nranks))
            if auto:
                names.append(None)
            cases = [Case(coll, s, a) for s in sizes for a in names]
            for attempt in range(1, 4):
                seen, waited = wait_quiet(quiet)
                t0 = time.monotonic()
                samples = run(nranks, cases, reps=reps, budget=budget, settings=settings)
                took = time.monotonic() - t0
                after = idle(1.0)    # someone else's work still running: it ran during ours
                if log is not None:
                    log(f"repeat {rnd + 1}/{repeat}: {coll} on {nranks} ranks, "
                        f"{len(cases)} cases in {took:.1f} s (machine {seen:.0%} idle before, "
                        f"after waiting {waited:.0f} s; {after:.0%} idle after)"
                        + ("" if after >= 0.9 or attempt == 3 else ": disturbed, again"))
                if after >= 0.9:
                    break
            for smp in samples:
                got.setdefault(smp.case, []).append(smp)
    out = []
    for case, runs in got.items():
        meds = [r.seconds for r in runs]
        ran = {r.ran for r in runs}
        first = runs[0]
        out.append(Sample(case, nranks, first.nbytes, statistics.median(meds), meds,
                          first.calls, first.ran if len(ran) == 1 else "/".join(sorted(ran))))
    return out


__all__ = ["DTYPE", "OFFSET", "PER_RANK", "Case", "Sample", "aligned", "applicable", "idle",
           "rounded", "run", "sweep", "time_rank", "wait_quiet", "warm_up"]
