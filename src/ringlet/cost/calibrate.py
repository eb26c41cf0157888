"""``ringlet predict --calibrate``: measure this host and store a profile.

Everything is measured on live ranks of the shared-memory transport
(:func:`ringlet.spawn`, ``-n`` ranks, default 2) and fitted by least squares;
every fitted term keeps its residuals (:class:`~ringlet.cost.model.Fit`).
What is measured, and which term of the host model
(:mod:`ringlet.cost.host`) it gives:

1. **Fixed costs at every rank count p from 1 to n** (one job of p ranks for
   each p, so that no idle rank shares the cores; p = 1 is a ``split`` of the
   job of min(n, cores) ranks).  At p = 1 one tiny call of every collective
   on each path it has (:data:`CALL_CASES`): ``calls``.  At p >= 2: a
   barrier (``sync`` = barrier(p) - barrier(1)); a tiny one-shot all_reduce
   (``post_round``: what is left of it beyond its call and agreement); tiny
   staged calls (:data:`PIECE_CASES`: direct broadcast and all_gather with
   one round of the shared-buffer protocol, direct all_reduce with two):
   ``piece_sync``; tiny step-executor calls with different numbers of rounds
   and of messages per round (:data:`ROUND_CASES`): ``round`` and
   ``endpoint``; then a tiny call of every other algorithm, and each one's
   ``pace``: its rounds' fixed costs over what the terms above predict.  With more ranks
   than cores, calls that move data (:data:`OVERSUB_CASES`): ``work`` and
   ``work_generic``, the factors on the data work of the fused paths and of
   the step executor.
2. **Ping-pong** between ranks 0 and 1 with ``comm.send``/``comm.recv`` over
   sizes: one-way time = alpha + beta * bytes, the profile's
   :class:`~ringlet.cost.model.Link` (the link model's alpha and beta; its
   per-message ``overhead`` is the ``endpoint`` term of step 1 at two ranks).
3. **Copy and reduction throughput**: numpy copies into and out of a
   shared-memory mapping, and the in-place ufunc of each dtype class
   (float32, float16, int32, complex64, bool), on min(n, cores) ranks at once:
   ``copy`` and ``reduce``.
4. **Data through the transport** (:data:`RESIDUAL_TERMS`), on min(n, cores)
   ranks: direct all_gather and reduce_scatter (fused): ``shared``, per byte
   published, read or copied; naive broadcast (one way) on the step
   executor: ``channel`` per byte; then naive all_gather (both ways at once):
   ``duplex``, per byte of the smaller direction.  Each is what the model's
   other terms leave of the measured time, fitted per byte.

Throughput terms are measured at sizes in the two regimes of
:func:`~ringlet.cost.host.cache_limits` (working set within half the
last-level cache, and beyond twice it) and fitted separately in each
(:class:`~ringlet.cost.host.Curve`).  Timing is
:func:`ringlet.cost.measure.time_rank`'s: a barrier, a batch of calls, the
slowest rank's mean, the median of ``reps`` batches; buffers start at a fixed
offset in a page (:func:`~ringlet.cost.measure.aligned`).  A calibration
takes about 10 s at ``-n 2`` on two cores; ``quick`` is a tiny sweep for smoke
tests (a few seconds, rough figures).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import mmap
import platform
import socket
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from ..config import Settings
from ..errors import ArgumentError
from ..ops import DTYPES
from ..procs import cores
from ..schedule import COLLECTIVES
from .host import (
    CLASS_DTYPES,
    Curve,
    Host,
    HostCounts,
    Level,
    Paths,
    cache_limits,
    counts_at,
    endpoint_load,
    path_of,
    working_set,
)
from .host import predict as host_predict
from .measure import Case, aligned, applicable, rounded, time_rank, warm_up
from .model import Calibration, Fit, Link, Profile

#: p = 1: one small call of each collective on each path it has -> "collective:path"
CALL_CASES: dict[str, tuple[str, str]] = {
    "all_reduce:post": ("all_reduce", "oneshot"), "all_reduce:staged": ("all_reduce", "direct"),
    "all_reduce:generic": ("all_reduce", "ring"),
    "broadcast:staged": ("broadcast", "direct"), "broadcast:generic": ("broadcast", "binomial"),
    "reduce:generic": ("reduce", "binomial"),
    "all_gather:staged": ("all_gather", "direct"), "all_gather:generic": ("all_gather", "ring"),
    "reduce_scatter:staged": ("reduce_scatter", "direct"),
    "reduce_scatter:generic": ("reduce_scatter", "ring"),
    "all_to_all:staged": ("all_to_all", "direct"),
    "all_to_all:generic": ("all_to_all", "pairwise"),
    "scatter:generic": ("scatter", "binomial"), "gather:generic": ("gather", "binomial"),
}
#: p >= 2: staged calls with one or two rounds of the shared-buffer protocol
PIECE_CASES = (("broadcast", "direct"), ("all_gather", "direct"), ("all_reduce", "direct"))
#: what each per-byte term is fitted to (on min(n, cores) ranks), and the bytes it costs
RESIDUAL_TERMS = (("shared", "all_gather", "direct"), ("shared", "reduce_scatter", "direct"),
                  ("channel", "broadcast", "naive"), ("duplex", "all_gather", "naive"))
#: p >= 2: step-executor calls with different rounds and messages per round
ROUND_CASES = (("broadcast", "binomial"), ("reduce", "binomial"), ("gather", "linear"),
               ("all_gather", "ring"), ("all_gather", "naive"), ("all_to_all", "pairwise"),
               ("all_reduce", "ring"))
#: the size of the "tiny" calls (bytes; per-rank collectives: per rank)
TINY = 64
#: with more ranks than cores: calls that move data through both paths, one way and both
#: ways (at 256 KiB and 2 MiB), fitted to the factor the ranks' data work takes when they
#: share the cores
OVERSUB_CASES = (("all_gather", "direct"), ("all_reduce", "direct"), ("broadcast", "direct"),
                 ("all_gather", "ring"), ("reduce_scatter", "ring"), ("broadcast", "binomial"),
                 ("all_reduce", "binomial"))


# --- the machine ---------------------------------------------------------------------------


def llc_bytes() -> int:
    """The last-level cache's size in bytes (Linux sysfs; 8 MiB if it cannot be read)."""
    best = (0, 0)
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for idx in sorted(base.glob("index*")) if base.exists() else []:
        try:
            level = int((idx / "level").read_text())
            kind = (idx / "type").read_text().strip()
            text = (idx / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        if kind == "Instruction":
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        try:
            size = int(text.rstrip("KMG")) * mult
        except ValueError:
            continue
        best = max(best, (level, size))
    return best[1] or 8 << 20


# --- least squares -----------------------------------------------------------------------------


def _residuals(pred: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    rel = (pred - y) / np.where(y > 0, y, 1.0)
    return float(np.sqrt(np.mean(rel ** 2))), float(np.max(np.abs(rel)))


def fit_line(x: npt.ArrayLike, y: npt.ArrayLike) -> tuple[float, float, float, float]:
    """``y = a + b x`` by least squares: ``(a, b, rms, worst)`` (relative residuals).

    A negative intercept or slope is clamped to 0 and the other refitted (a
    time cannot be negative).

    >>> a, b, rms, worst = fit_line([1, 2, 3], [3, 5, 7])
    >>> round(a, 9), round(b, 9), round(rms, 9)
    (1.0, 2.0, 0.0)
    """
    xv, yv = np.asarray(x, float), np.asarray(y, float)
    if xv.size != yv.size or xv.size < 1:
        raise ArgumentError(f"fit_line needs equal, non-empty x and y, got {xv.size}, {yv.size}")
    if xv.size == 1 or np.ptp(xv) == 0:
        a, b = 0.0, float(yv.mean() / xv.mean()) if xv.mean() else 0.0
    else:
        b, a = (float(v) for v in np.polyfit(xv, yv, 1))
    if b < 0:
        a, b = float(yv.mean()), 0.0
    elif a < 0:
        a, b = 0.0, float(np.dot(xv, yv) / np.dot(xv, xv))
    return (a, b, *_residuals(a + b * xv, yv))


def fit_origin(X: npt.ArrayLike, y: npt.ArrayLike) -> tuple[list[float], float, float]:
    """``y = X @ c`` by non-negative least squares (few columns): ``(c, rms, worst)``.

    Columns whose coefficient comes out negative are dropped (set to 0) and the
    rest refitted, until every coefficient is >= 0.

    >>> c, rms, worst = fit_origin([[1, 0], [0, 1], [1, 1]], [2, 3, 5])
    >>> [round(v, 9) for v in c], round(rms, 9)
    ([2.0, 3.0], 0.0)
    """
    A, yv = np.asarray(X, float), np.asarray(y, float)
    if A.ndim != 2 or A.shape[0] != yv.size or yv.size < 1:
        raise ArgumentError(f"fit_origin needs an (n, k) X and n values, got {A.shape}, "
                            f"{yv.size}")
    keep = list(range(A.shape[1]))
    coef = np.zeros(A.shape[1])
    while keep:
        sol, *_ = np.linalg.lstsq(A[:, keep], yv, rcond=None)
        if (sol >= 0).all():
            coef[keep] = sol
            break
        keep = [k for k, v in zip(keep, sol, strict=True) if v >= 0] if (sol >= 0).any() \
            else []
    return [float(v) for v in coef], *_residuals(A @ coef, yv)


# --- what every rank runs -------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What the ranks measure (see :func:`plan`)."""

    nranks: int
    reps: int
    budget: float
    active: int                     # ranks measuring throughput at once
    pingpong: tuple[int, ...]       # bytes
    copy_sizes: tuple[int, ...]     # bytes per rank
    size_cases: tuple[Case, ...]    # larger calls on `active` ranks (RESIDUAL_TERMS)
    oversub_cases: tuple[Case, ...]  # at more ranks than cores (OVERSUB_CASES)
    warmup: float
    quick: bool


def plan(nranks: int, *, quick: bool = False, reps: int = 5, llc: int | None = None,
         ncores: int | None = None, paths: Paths | None = None) -> Plan:
    """The measurements of a calibration with ``nranks`` ranks (``quick``: a tiny sweep).

    Throughput is measured at sizes whose working set (:func:`~ringlet.cost.host.working_set`;
    for the kernels, every active rank's source and destination) is at most half
    the cache limit (three sizes over a factor of 16: clear of the transition)
    and at least the memory limit (two sizes) of
    :func:`~ringlet.cost.host.cache_limits`.
    """
    if nranks < 2:
        raise ArgumentError(f"calibration needs at least 2 ranks (-n), got {nranks}")
    if reps < 1:
        raise ArgumentError(f"--reps must be >= 1, got {reps}")
    llc = llc_bytes() if llc is None else llc
    c = cores() if ncores is None else ncores
    a = max(2, min(nranks, c))
    paths = Paths() if paths is None else paths
    if quick:
        sizes = [Case(coll, n, algo) for _, coll, algo in RESIDUAL_TERMS
                 for n in (64 << 10, 256 << 10)]
        return Plan(nranks, 1, 0.002, a, (64, 64 << 10), (64 << 10, 256 << 10), tuple(sizes),
                    tuple(Case(coll, 64 << 10, algo) for coll, algo in OVERSUB_CASES[::3]),
                    0.02, True)
    lo, hi = cache_limits(llc)
    top, bottom = int(lo // (4 * a)), int(hi // (2 * a))
    copy_sizes = (max(4096, top // 16), max(4096, top // 4), max(4096, top), bottom, 2 * bottom)
    cases: list[Case] = []
    for _, coll, algo in RESIDUAL_TERMS:
        f32 = DTYPES["float32"].itemsize
        ws = {}
        for k in range(16, 31):
            n = 1 << k
            cnt = rounded(coll, n, a)[1]
            ws[n] = working_set(counts_at(coll, algo, a, cnt), path_of(coll, algo, n, paths),
                                cnt, f32)
        # a factor of 16 of the cache regime, half of its limit away from the transition
        top_n = max(n for n, w in ws.items() if w <= lo / 2)
        small = [top_n // 16, top_n // 4, top_n]
        large = sorted(n for n, w in ws.items() if w >= hi)[:2]
        cases += [Case(coll, n, algo) for n in small + large]
    over = tuple(Case(coll, n, algo) for coll, algo in OVERSUB_CASES for n in (256 << 10, 2 << 20))
    return Plan(nranks, reps, 0.02, a, (8, 1 << 10, 8 << 10, 64 << 10, 256 << 10, 1 << 20,
                                       4 << 20), copy_sizes, tuple(cases), over, 0.3, False)


def _tiny_cases(p: int) -> list[Case]:
    cases = [Case("barrier", 1)]
    if p == 1:
        return cases + [Case(c, TINY * (p if c in _PER_RANK else 1), a)
                        for c, a in CALL_CASES.values()]
    cases.append(Case("all_reduce", TINY, "oneshot"))
    seen = {("all_reduce", "oneshot")}
    every = [(c, a) for c in COLLECTIVES for a in applicable(c, p)]
    for c, a in (*PIECE_CASES, *ROUND_CASES, *every):
        if (c, a) not in seen:
            seen.add((c, a))
            cases.append(Case(c, TINY * (p if c in _PER_RANK else 1), a))
    return cases


_PER_RANK = frozenset({"all_gather", "reduce_scatter", "all_to_all", "scatter", "gather"})


def _kernel(name: str, own: np.ndarray, peer: np.ndarray) -> Callable[[], object]:
    """One call of a throughput kernel: copy into or out of shared memory, or reduce."""
    if name == "copy_in":
        return lambda: np.copyto(peer, own)
    if name == "copy_out":
        return lambda: np.copyto(own, peer)
    ufunc = np.logical_or if own.dtype.kind == "b" else np.add
    return lambda: ufunc(own, peer, out=own)


def _throughput(comm: Any, sizes: Sequence[int], reps: int, budget: float
                ) -> dict[str, list[float]]:
    """Per kernel, seconds per call at each size (slowest rank, median of ``reps``)."""
    top = max(sizes)
    area = mmap.mmap(-1, top + 4096)                 # shared memory, page aligned
    shared = np.frombuffer(area, np.uint8, top)
    out: dict[str, list[float]] = {}
    kernels: list[tuple[str, int, str]] = [("copy_in", 1, "uint8"), ("copy_out", 1, "uint8")]
    kernels += [(f"reduce_{cls}", 0, dt) for cls, dt in CLASS_DTYPES.items()]
    for name, _, dt_name in kernels:
        dt = np.dtype(dt_name)
        times: list[float] = []
        for n in sizes:
            count = n // dt.itemsize
            own = aligned(count, dt)
            peer = shared[:count * dt.itemsize].view(dt)
            peer[...] = 0
            f = _kernel(name, own, peer)
            f()
            comm.barrier()
            t0 = time.perf_counter()
            f()
            t1 = np.array([time.perf_counter() - t0])
            comm.all_reduce(t1, "max")
            k = max(1, min(200, int(budget / max(float(t1[0]), 1e-7))))
            local = []
            for _ in range(reps):
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(k):
                    f()
                local.append((time.perf_counter() - t0) / k)
            worst = np.array(local)
            comm.all_reduce(worst, "max")
            times.append(float(np.median(worst)))
        out[name] = times
    return out   # the mapping goes with its last view


def _pingpong(comm: Any, sizes: Sequence[int], reps: int, budget: float) -> list[float]:
    """One-way seconds between ranks 0 and 1 at each size (median of ``reps``)."""
    r = comm.rank
    peer = 1 - r
    res: list[float] = []
    for n in sizes:
        x, y = aligned(n, np.uint8), aligned(n, np.uint8)

        def once(x: np.ndarray = x, y: np.ndarray = y) -> None:
            if r == 0:
                comm.send(x, peer)
                comm.recv(y, peer)
            else:
                comm.recv(y, peer)
                comm.send(x, peer)

        once()
        t0 = time.perf_counter()
        once()
        t1 = np.array([time.perf_counter() - t0])
        comm.all_reduce(t1, "max")
        k = max(1, min(500, int(budget / max(float(t1[0]), 1e-7))))
        local = []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(k):
                once()
            local.append((time.perf_counter() - t0) / (2 * k))
        res.append(statistics.median(local))
    return res


def _reps(comm: Any, p: Plan) -> int:
    """Batches per case: twice as many with more ranks than cores (noisier timings)."""
    return p.reps * (2 if comm.size > cores() else 1)


def _tiny(comm: Any, p: Plan) -> list[tuple[str, str | None, int, float]]:
    """The tiny calls on the Python path; then, where the compiled one-shot all_reduce
    runs (ringlet.lean), a tiny all_reduce on it: ``("all_reduce", None, ...)``."""
    cases = _tiny_cases(comm.size)
    lean, comm._lean = comm._lean, None
    try:
        got = time_rank(comm, cases, _reps(comm, p), p.budget)
    finally:
        comm._lean = lean
    out = [(c.collective, c.algorithm, real, float(np.median(b)))
           for c, (real, b, _, _) in zip(cases, got, strict=True)]
    if lean is not None:
        case = Case("all_reduce", TINY, None)
        (real, b, _, _), = time_rank(comm, [case], _reps(comm, p), p.budget)
        out.append(("all_reduce", None, real, float(np.median(b))))
    return out


def rank_body(comm: Any, p: Plan, done: Any = None) -> dict[str, Any] | None:
    """What each rank of a calibration job runs; rank 0 returns the raw measurements.

    A job of p ranks measures the fixed costs at p (:func:`calibrate` starts one
    job per rank count, so that no idle rank shares the cores with the measured
    ones); the job of ``p.active`` ranks also measures them at one rank, the
    ping-pong and the throughput.  Rank 0 puts the name of each part it finished
    on the queue ``done``, if given (the progress bar; :func:`steps` counts them).
    """

    def finished(what: str) -> None:
        if done is not None and comm.rank == 0:
            done.put(f"{what} ({comm.size} ranks)")

    warm_up(comm, p.warmup)
    raw: dict[str, Any] = {"tiny": {comm.size: _tiny(comm, p)}, "cores": cores(),
                           "llc": llc_bytes(), "oversub": {}}
    finished("fixed costs")
    if comm.size > cores():
        got = time_rank(comm, p.oversub_cases, _reps(comm, p), p.budget)
        raw["oversub"][comm.size] = [
            (c.collective, c.algorithm, real, float(np.median(b)))
            for c, (real, b, _, _) in zip(p.oversub_cases, got, strict=True)]
        finished("oversubscribed calls")
    if comm.size != p.active:
        return raw if comm.rank == 0 else None
    one = comm.split(0 if comm.rank == 0 else None)
    if one is not None:
        raw["tiny"][1] = _tiny(one, p)
        one.close()
    comm.barrier()
    finished("fixed costs at 1 rank")
    pair = comm.split(0 if comm.rank < 2 else None, key=comm.rank)
    if pair is not None:
        raw["pingpong"] = list(zip(p.pingpong, _pingpong(pair, p.pingpong, p.reps, p.budget),
                                   strict=True))
        pair.close()
    comm.barrier()
    finished("ping-pong")
    raw["throughput"] = _throughput(comm, p.copy_sizes, p.reps, p.budget)
    finished("copy and reduction throughput")
    got = time_rank(comm, p.size_cases, p.reps, p.budget)
    raw["sized"] = [(c.collective, c.algorithm, real, float(np.median(b)))
                    for c, (real, b, _, _) in zip(p.size_cases, got, strict=True)]
    finished("data through the transport")
    return raw if comm.rank == 0 else None


def steps(p: Plan, ncores: int | None = None) -> int:
    """The parts :func:`rank_body` reports over a calibration's jobs (2..n ranks)."""
    c = cores() if ncores is None else ncores
    return sum(1 + (size > c) + 4 * (size == p.active) for size in range(2, p.nranks + 1))


# --- fitting -----------------------------------------------------------------------------------


def _curve(sizes: Sequence[int], times: Sequence[float], ranks: int, llc: int, term: str,
           what: str) -> tuple[Curve, list[Fit]]:
    """Per-byte cost in the two regimes from times at ``sizes`` (bytes per rank; the
    working set is ``ranks`` x (source + destination))."""
    lo, hi = cache_limits(llc)
    ws = [2.0 * ranks * s for s in sizes]
    cache = [(s, t) for s, t, w in zip(sizes, times, ws, strict=True) if w <= lo]
    mem = [(s, t) for s, t, w in zip(sizes, times, ws, strict=True) if w >= hi]
    fits: list[Fit] = []
    slopes: dict[str, float] = {}
    for regime, pts in (("cache", cache), ("memory", mem)):
        if not pts:
            continue
        _, b, rms, worst = fit_line([s for s, _ in pts], [t for _, t in pts])
        slopes[regime] = b
        fits.append(Fit(f"{term}.{regime}", b, "s/B", len(pts), rms, worst,
                        f"{what}: slope of time vs bytes ({regime} regime)"))
    if not slopes:
        raise ArgumentError(f"calibration: no size measured for {term}")
    c = slopes.get("cache", slopes.get("memory", 0.0))
    return Curve(c, slopes.get("memory", c)), fits


def _rest(host: Host, coll: str, algo: str, real: int, paths: Paths) -> tuple[float, HostCounts,
                                                                              int, float]:
    """(the model's seconds, counts, unit count, working set) of one measured call."""
    n = host.levels[-1].nranks
    cnt = rounded(coll, real, n)[1]
    c = counts_at(coll, algo, n, cnt)
    f32 = DTYPES["float32"]
    sec = host_predict(host, coll, algo, n, cnt, f32, paths, real).seconds
    return sec, c, cnt, working_set(c, path_of(coll, algo, real, paths), cnt, f32.itemsize)


def _columns(term: str, c: HostCounts) -> list[np.ndarray]:
    """Per (round, rank): the bytes each per-byte term of ``term`` is charged for."""
    if term == "shared":
        return [c.publish + c.copy + c.read]
    incoming = c.recv + c.rred
    if term == "channel":
        return [np.maximum(c.sent, incoming)]
    return [np.minimum(c.sent, incoming)]


#: the per-byte terms each residual fit gives (one per column of :func:`_columns`)
_TERMS = {"shared": ("shared",), "channel": ("channel",), "duplex": ("duplex",)}


def _residual(term: str, rows: Sequence[tuple[str, str, int, float]], host: Host,
              paths: Paths) -> tuple[list[Curve], list[Fit]]:
    """Fit the per-byte terms of ``term`` to what the model without them leaves of
    ``rows``, per regime (non-negative least squares).

    ``host`` has every other term and these at zero; each term's bytes are the
    busiest rank's in each round (:func:`_columns`), summed over the rounds.
    """
    lo, hi = cache_limits(host.llc_bytes)
    names = _TERMS[term]
    pts: dict[str, list[tuple[list[float], float, float]]] = {"cache": [], "memory": []}
    for coll, algo, real, sec in rows:
        rest, c, cnt, ws = _rest(host, coll, algo, real, paths)
        cols = _columns(term, c)
        j = np.argmax(cols[0], axis=1)           # the busiest rank of each round
        x = [float(col[np.arange(col.shape[0]), j].sum()) * cnt * DTYPES["float32"].itemsize
             for col in cols]
        regime = "cache" if ws <= lo else "memory" if ws >= hi else ""
        if regime and x[0] > 0:
            pts[regime].append((x, max(0.0, sec - rest), sec))
    fits: list[Fit] = []
    slopes: dict[str, list[float]] = {}
    what = ", ".join(sorted({f"{coll} {algo}" for coll, algo, _, _ in rows}))
    for regime, got in pts.items():
        if not got:
            continue
        X = np.array([g[0] for g in got])
        y = np.array([g[1] for g in got])
        full = np.array([g[2] for g in got])
        coef, _, _ = fit_origin(X.tolist(), y.tolist())
        rms, worst = _residuals(full - y + X @ np.array(coef), full)
        slopes[regime] = coef
        for name, v in zip(names, coef, strict=True):
            fits.append(Fit(f"{name}.{regime}", v, "s/B", len(got), rms, worst,
                            f"{what}: what the other terms leave, per byte"))
    if not slopes:
        raise ArgumentError(f"calibration: no size measured for {term}")
    cache = slopes.get("cache", slopes.get("memory"))
    memory = slopes.get("memory", cache)
    if cache is None or memory is None:  # pragma: no cover - one of them exists
        raise ArgumentError(f"calibration: no size measured for {term}")
    return [Curve(a, b) for a, b in zip(cache, memory, strict=True)], fits


def fit(raw: dict[str, Any], p: Plan, paths: Paths, started: float) -> Profile:
    """The :class:`~ringlet.cost.model.Profile` the raw measurements give."""
    from .. import __version__

    ncores, llc = int(raw["cores"]), int(raw["llc"])
    fits: list[Fit] = []
    zero = Curve(0.0, 0.0)
    # 1. calls at one rank
    given, paths = paths, replace(paths, lean=False)   # the terms below: the Python path's
    one = {(c, a): t for c, a, _, t in raw["tiny"][1]}
    barrier1 = one[("barrier", None)]
    # the compiled one-shot all_reduce (ringlet.lean), where it ran: its whole tiny call
    lean = {size: sec for size, got in raw["tiny"].items()
            for c, a, _, sec in got if (c, a) == ("all_reduce", None)}
    for size, v in sorted(lean.items()):
        fits.append(Fit(f"lean.p{size}", v, "s", 1, 0.0, 0.0,
                        "tiny all_reduce on the compiled one-shot path (ringlet._lean)"))
    calls = {key: one[ca] for key, ca in CALL_CASES.items()}
    calls["barrier:generic"] = barrier1
    for key, v in calls.items():
        fits.append(Fit(f"call.{key}", v, "s", 1, 0.0, 0.0, "measured at one rank"))
    # 3. copy and reduce curves
    thr = raw["throughput"]
    copy_t = [(a + b) / 2 for a, b in zip(thr["copy_in"], thr["copy_out"], strict=True)]
    copy, cf = _curve(p.copy_sizes, copy_t, p.active, llc, "copy",
                      "numpy copy into and out of shared memory")
    fits += cf
    reduce: dict[str, Curve] = {}
    for cls in CLASS_DTYPES:
        reduce[cls], rf = _curve(p.copy_sizes, thr[f"reduce_{cls}"], p.active, llc,
                                 f"reduce.{cls}", f"in-place {CLASS_DTYPES[cls]} ufunc")
        fits += rf

    def host(levels: Sequence[Level], channel: Curve = zero, shared: Curve = copy,
             duplex: Curve = zero) -> Host:
        return Host(ncores, llc, channel, duplex, copy, shared, reduce, calls, tuple(levels))

    # 1. fixed costs at 2..n ranks (tiny calls: the per-byte terms hardly matter)
    levels = [Level(1, 0.0, 0.0, 0.0, 0.0)]
    for size in range(2, p.nranks + 1):
        t = {(c, a): (real, sec) for c, a, real, sec in raw["tiny"][size]}
        sync = max(0.0, t[("barrier", None)][1] - barrier1)
        fits.append(Fit(f"sync.p{size}", sync, "s", 1, 0.0, 0.0,
                        "barrier at p ranks less barrier at one"))
        probe = host([Level(size, sync, 0.0, 0.0, 0.0)])
        xs, ys, full = [], [], []
        for coll, algo in PIECE_CASES:
            real, sec = t[(coll, algo)]
            rest, c, _, _ = _rest(probe, coll, algo, real, paths)
            xs.append([float(c.messages.sum())])
            ys.append(sec - rest)
            full.append(sec)
        (piece_sync,), _, _ = fit_origin(xs, ys)
        rms, worst = _residuals(np.array(full) - np.array(ys) + piece_sync * np.array(xs)[:, 0],
                                np.array(full))
        fits.append(Fit(f"piece_sync.p{size}", piece_sync, "s", len(ys), rms, worst,
                        "staged fused calls: per round of the shared-buffer protocol (per "
                        "piece)"))
        real, sec = t[("all_reduce", "oneshot")]
        post_round = max(0.0, sec - _rest(probe, "all_reduce", "oneshot", real, paths)[0])
        fits.append(Fit(f"post_round.p{size}", post_round, "s", 1, 0.0, 0.0,
                        "tiny one-shot all_reduce less its call and agreement"))
        xs, ys, full = [], [], []
        for coll, algo in ROUND_CASES:
            real, sec = t[(coll, algo)]
            rest, c, _, _ = _rest(probe, coll, algo, real, paths)
            loads = endpoint_load(c, ncores)
            xs.append([float(c.messages.sum()), float(loads[c.messages].sum())])
            ys.append(sec - rest)
            full.append(sec)
        (rnd, endpoint), _, _ = fit_origin(xs, ys)
        pred = np.array(full) - np.array(ys) + np.array(xs) @ np.array([rnd, endpoint])
        rms, worst = _residuals(pred, np.array(full))
        for name, v, what in (("round", rnd, "per round"),
                              ("endpoint", endpoint, "per message sent or received on the "
                                                     "busiest core in a round")):
            fits.append(Fit(f"{name}.p{size}", v, "s", len(ys), rms, worst,
                            f"step executor, tiny calls: {what}"))
        lv = Level(size, sync, piece_sync, rnd, endpoint, 1.0, 1.0, post_round)
        # every algorithm's pace: its tiny call beyond call and agreement, over the rounds'
        # terms (the executor overlaps the rounds of pipelined algorithms)
        full_probe = host([lv])
        pace, rel = {}, []
        for (coll, algo), (real, sec) in t.items():
            if coll == "barrier" or algo is None:
                continue
            cnt = rounded(coll, real, size)[1]
            hp = host_predict(full_probe, coll, algo, size, cnt, DTYPES["float32"], paths, real)
            head = full_probe.call(coll, hp.path)
            steps = hp.fixed_seconds - head - sync
            if steps <= 0:
                continue
            left = sec - head - sync - hp.move_seconds - hp.reduce_seconds
            pace[f"{coll}:{algo}"] = min(10.0, max(0.1, left / steps))
            rel.append(abs(hp.seconds - sec) / sec)
        if pace:
            fits.append(Fit(f"pace.p{size}", float(np.median(list(pace.values()))), "x",
                            len(pace), float(np.sqrt(np.mean(np.square(rel)))), float(max(rel)),
                            f"every algorithm's tiny call: its rounds' fixed costs over the "
                            f"terms above (the median shown; from {min(pace.values()):.2g} to "
                            f"{max(pace.values()):.2g}; errors: the terms alone)"))
        levels.append(dataclasses.replace(lv, pace=pace))
    # 4. what the shared buffers and the channels cost per byte, on `active` ranks
    lv = next(lv for lv in levels if lv.nranks == p.active)
    rows = {t: [r for r in raw["sized"] if (r[0], r[1]) in
                {(c, a) for tt, c, a in RESIDUAL_TERMS if tt == t}]
            for t, _, _ in RESIDUAL_TERMS}
    (shared,), f1 = _residual("shared", rows["shared"], host([lv], shared=zero), paths)
    # one way first (broadcast), then what both ways at once add (all_gather)
    (channel,), f2 = _residual("channel", rows["channel"], host([lv], shared=shared), paths)
    (duplex,), f3 = _residual("duplex", rows["duplex"],
                              host([lv], channel=channel, shared=shared), paths)
    fits += f1 + f2 + f3
    # 5. more ranks than cores: the factor on the data work, per kind of path
    for i, lv in enumerate(levels):
        rows_p = raw.get("oversub", {}).get(lv.nranks)
        if not rows_p:
            continue
        probe = Host(ncores, llc, channel, duplex, copy, shared, reduce, calls, (lv,))
        factors = {}
        for kind in ("fused", "generic"):
            xs, ys, full = [], [], []
            for coll, algo, real, sec in rows_p:
                if (path_of(coll, algo, real, paths) == "generic") != (kind == "generic"):
                    continue
                cnt = rounded(coll, real, lv.nranks)[1]
                hp = host_predict(probe, coll, algo, lv.nranks, cnt, DTYPES["float32"], paths,
                                  real)
                xs.append([hp.move_seconds + hp.reduce_seconds])
                ys.append(sec - hp.fixed_seconds)
                full.append(sec)
            if not xs:
                continue
            (fitted,), _, _ = fit_origin(xs, ys)
            factors[kind] = max(1.0, fitted)   # sharing cores cannot beat a fair share
            rms, worst = _residuals(
                np.array(full) - np.array(ys) + factors[kind] * np.array(xs)[:, 0],
                np.array(full))
            fits.append(Fit(f"work{'' if kind == 'fused' else '_generic'}.p{lv.nranks}",
                            factors[kind], "x", len(ys), rms, worst,
                            f"{lv.nranks} ranks on {ncores} cores, {kind} paths: measured data "
                            f"work over the ranks' share of the cores"))
        levels[i] = dataclasses.replace(lv, work=factors.get("fused", 1.0),
                                        work_generic=factors.get("generic", 1.0))
    # 2. the link: ping-pong
    pp = raw["pingpong"]
    alpha, beta, rms, worst = fit_line([n for n, _ in pp], [t for _, t in pp])
    for name, v, unit in (("link.alpha", alpha, "s"), ("link.beta", beta, "s/B")):
        fits.append(Fit(name, v, unit, len(pp), rms, worst,
                        "send/recv ping-pong: one-way time = alpha + beta * bytes"))
    done = Host(ncores, llc, channel, duplex, copy, shared, reduce, calls, tuple(levels),
                lean)
    now = _dt.datetime.now(_dt.timezone.utc).astimezone()
    cal = Calibration(now.isoformat(timespec="seconds"), socket.gethostname(), ncores, llc,
                      p.nranks, time.perf_counter() - started, platform.python_version(),
                      np.__version__, __version__, asdict(given), tuple(fits), p.quick)
    src = (f"calibrated on {cal.host} at {cal.date} with {p.nranks} ranks"
           + (" (quick: rough)" if p.quick else ""))
    # the link model's per-message overhead: the step executor's cost per message sent or
    # received by a rank in a round, at two ranks (one per core): what a rank of a larger
    # job pays per extra peer (the levels above two ranks also share the cores)
    two = [lv for lv in levels if lv.nranks == 2] or levels[-1:]
    overhead = max(0.0, two[0].endpoint) if two else 0.0
    link = Link(alpha, beta, reduce["float"].cache, f"{src}: send/recv ping-pong; gamma: "
                f"float32 in-place add in cache; per-message overhead: the step executor's "
                f"'endpoint' at {two[0].nranks if two else 1} ranks", overhead)
    return Profile(link, name="this host", source=src, host=done, calibration=cal)


def calibrate(nranks: int = 2, *, quick: bool = False, reps: int = 5,
              settings: Settings | None = None, progress: bool | None = None) -> Profile:
    """Measure this host on ``nranks`` live ranks and return the fitted
    :class:`~ringlet.cost.model.Profile` (not saved; see ``Profile.save``).

    ``progress``: draw a progress bar on stderr (None: when it is a terminal)."""
    from ..progress import Progress, from_ranks

    started = time.perf_counter()
    settings = Settings.from_env() if settings is None else settings
    p = plan(nranks, quick=quick, reps=reps)
    bar = Progress(steps(p), "ringlet predict --calibrate", "parts", progress)
    try:
        if bar.enabled:
            with from_ranks(bar.step, settings, "ringlet-calibrate-progress") as (done, ranks):
                raw = _jobs(p, ranks, done)
        else:
            raw = _jobs(p, settings, None)
    finally:
        bar.close()
    return fit(raw, p, Paths.from_settings(settings), started)


def _jobs(p: Plan, settings: Settings, done: Any) -> dict[str, Any]:
    """The raw measurements of the jobs of 2..n ranks."""
    from ..launch import spawn

    raw: dict[str, Any] = {}
    for size in range(2, p.nranks + 1):   # one job per rank count: no idle rank in the way
        got = spawn(rank_body, size, p, done, settings=settings)[0]
        if got is None:  # pragma: no cover - rank 0 always reports
            raise ArgumentError("calibration: rank 0 reported nothing")
        tiny, over = raw.get("tiny", {}), raw.get("oversub", {})
        raw.update(got)
        raw["tiny"] = {**tiny, **got["tiny"]}
        raw["oversub"] = {**over, **got["oversub"]}
    return raw


def report(profile: Profile) -> list[str]:
    """Lines describing a calibrated profile: every term with its fit error."""
    from .units import format_bandwidth, format_seconds

    cal = profile.calibration
    if cal is None:
        return [f"{profile.name}: {profile.source} (not calibrated)"]
    out = [f"calibrated {cal.date} on {cal.host}: {cal.cores} cores, last-level cache "
           f"{cal.llc_bytes >> 20} MiB, {cal.nranks} ranks, {cal.seconds:.1f} s"
           + (" (quick sweep: rough figures)" if cal.quick else "")]
    out.append(f"  {'term':<28} {'value':>14} {'points':>6} {'rms err':>8} {'worst':>8}")
    for f in cal.fits:
        if f.unit == "s/B":
            val = format_bandwidth(1 / f.value) if f.value > 0 else "inf"
        elif f.unit == "x":
            val = f"x {f.value:.3g}"
        else:
            val = format_seconds(f.value)
        out.append(f"  {f.term:<28} {val:>14} {f.points:>6} {f.rms:>8.1%} {f.worst:>8.1%}")
    return out


__all__ = ["CALL_CASES", "Calibration", "Fit", "Plan", "calibrate", "cores", "fit",
           "fit_line", "fit_origin", "llc_bytes", "plan", "rank_body", "report", "steps"]
