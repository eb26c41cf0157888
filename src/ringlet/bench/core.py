"""What ``ringlet bench`` measures, shared by ringlet and its peers (gloo, MPI).

Nothing here starts processes or prints: this module holds

* the collectives and their nccl-tests conventions (:data:`COLLECTIVES`):
  what the size and count columns mean and the bus-bandwidth factor;
* the sizes of a sweep (:func:`parse_bytes`, :func:`sweep_sizes`, :func:`cases`);
* the job every implementation runs (:class:`Job`, JSON-able for the peers);
* the buffers of one collective call, with deterministic per-rank inputs and
  their numpy reference (:class:`Data`, :func:`layout`);
* the timing loop (:func:`measure`) and the sweep driver (:func:`sweep`), which
  every implementation runs with its own registry of benchmark functions.

Timing follows nccl-tests: a barrier, warm-up calls, a barrier, the timed
calls; a rank's time is its mean time per call, and the reported time is the
maximum over the ranks.  The number of calls is bounded by a time budget, so a
64 MiB sweep stays short on a small machine; every rank derives the same counts
from figures reduced over all ranks, so they always make the same calls.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar

import numpy as np

from ..config import parse_bytes as _parse_bytes
from ..cost.units import bus_factor_of
from ..errors import ArgumentError, ConfigError
from ..ops import DTYPES, ReduceOp, reference_reduce

#: out-of-place (separate input and output) and in-place (the output overwrites the input)
OUT, IN = "out", "in"
FORM_NAMES = {OUT: "out-of-place", IN: "in-place"}


@dataclass(frozen=True)
class Collective:
    """A benchmarked operation and its nccl-tests conventions.

    ``per_rank``: the count column is per rank (or per block), as the count
    argument of NCCL's call, and the size column is the whole buffer,
    ``count * nranks * itemsize``; otherwise both are the whole vector.
    """

    name: str
    reduces: bool
    rooted: bool
    per_rank: bool
    bus: str                      # the bus factor, as printed: "2(n-1)/n", "(n-1)/n" or "1"
    forms: tuple[str, ...]        # the forms ringlet's API has
    messages: int = 1             # messages per call (a ping-pong is two)

    def bus_factor(self, nranks: int) -> float:
        """busbw / algbw, as nccl-tests computes it."""
        return bus_factor_of(self.bus, nranks)


#: nccl-tests' bus factors: doc/PERFORMANCE.md for all_reduce, reduce_scatter,
#: all_gather, broadcast, reduce and all_to_all; src/scatter.cu and src/gather.cu
#: (ScatterGetBw, GatherGetBw) for scatter and gather, which PERFORMANCE.md omits.
#: ``sendrecv`` is a ping-pong between rank pairs (0-1, 2-3, ...); its time is one
#: way (half a round trip) and its factor 1, as nccl-tests' sendrecv.
COLLECTIVES: dict[str, Collective] = {c.name: c for c in [
    Collective("all_reduce", True, False, False, "2(n-1)/n", (OUT, IN)),
    Collective("broadcast", False, True, False, "1", (IN,)),
    Collective("reduce", True, True, False, "1", (OUT, IN)),
    Collective("all_gather", False, False, True, "(n-1)/n", (OUT,)),
    Collective("reduce_scatter", True, False, True, "(n-1)/n", (OUT,)),
    Collective("all_to_all", False, False, True, "(n-1)/n", (OUT,)),
    Collective("scatter", False, True, True, "(n-1)/n", (OUT,)),
    Collective("gather", False, True, True, "(n-1)/n", (OUT,)),
    Collective("sendrecv", False, False, False, "1", (OUT,), messages=2),
]}

#: collectives whose buffers have the same shapes on every rank, so that they can come
#: from the collective ``comm.empty`` (``--buffers shared``)
SHARED_OK = ("all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all",
             "sendrecv")


def collective(name: str) -> Collective:
    """The :class:`Collective` called ``name``; ArgumentError listing the valid names."""
    c = COLLECTIVES.get(name)
    if c is None:
        raise ArgumentError(
            f"unknown collective {name!r}; ringlet bench measures {', '.join(COLLECTIVES)}")
    return c


#: element types the benchmark can fill and check (bfloat16: ringlet only, as torch tensors)
BENCH_DTYPES = tuple(DTYPES)


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bit patterns (int16), rounded to nearest even."""
    u = np.ascontiguousarray(a, np.float32).view(np.uint32).astype(np.uint64)
    r = (u + np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))) >> np.uint64(16)
    return r.astype(np.uint16).view(np.int16)


def bf16_values(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (int16) as float32 values."""
    return (np.ascontiguousarray(bits).view(np.uint16).astype(np.uint32) << 16).view(
        np.float32)


def as_torch_bf16(arrays: dict[str, np.ndarray | None]) -> dict[str, Any]:
    """The bit-pattern arrays of a bfloat16 job as torch bfloat16 tensors (same memory)."""
    import torch

    return {k: None if a is None else torch.from_numpy(a).view(torch.bfloat16)
            for k, a in arrays.items()}


# --- sizes -------------------------------------------------------------------------------------


def parse_bytes(text: str, what: str = "size") -> int:
    """A byte count as nccl-tests writes it: ``8``, ``1K``, ``64M``, ``1G`` (1K = 1024 B).

    >>> parse_bytes("64M"), parse_bytes("1K"), parse_bytes("8")
    (67108864, 1024, 8)
    """
    try:
        return _parse_bytes(str(text))
    except ConfigError:
        raise ArgumentError(
            f"{what} {text!r} is not a byte count; write e.g. 8, 4096, 1K, 64M or 1G "
            f"(binary multiples, as nccl-tests: 1K = 1024)") from None


def sweep_sizes(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    """nccl-tests' sweep, ``minbytes`` times ``factor`` while at most ``maxbytes``, then
    ``maxbytes`` itself if the steps missed it (nccl-tests would stop short of it).

    >>> sweep_sizes(8, 64, 2)
    [8, 16, 32, 64]
    >>> sweep_sizes(8, 64 << 20, 8)[-3:]
    [2097152, 16777216, 67108864]
    """
    if minbytes < 1:
        raise ArgumentError(f"-b/--minbytes must be at least 1 byte, got {minbytes}")
    if maxbytes < minbytes:
        raise ArgumentError(
            f"-e/--maxbytes ({maxbytes}) is below -b/--minbytes ({minbytes}); "
            f"give -e >= -b")
    if factor < 2 and maxbytes > minbytes:
        raise ArgumentError(f"-f/--stepfactor must be at least 2, got {factor}")
    sizes = [minbytes]
    while sizes[-1] * factor <= maxbytes and factor >= 2:
        sizes.append(sizes[-1] * factor)
    if sizes[-1] != maxbytes:
        sizes.append(maxbytes)
    return sizes


def cases(coll: Collective, sizes: Sequence[int], itemsize: int,
          nranks: int) -> list[tuple[int, int]]:
    """``(size, count)`` per row: sizes rounded down to whole elements (and blocks).

    A size too small for one element (one per rank for the per-rank
    collectives) is rounded up to it; rows that round to the same size appear
    once.

    >>> cases(COLLECTIVES["all_reduce"], [8, 12, 64], 4, 2)
    [(8, 2), (12, 3), (64, 16)]
    >>> cases(COLLECTIVES["all_gather"], [8, 16], 4, 4)
    [(16, 1)]
    """
    unit = itemsize * (nranks if coll.per_rank else 1)
    out: list[tuple[int, int]] = []
    for size in sizes:
        count = max(1, size // unit)
        row = (count * unit, count)
        if row not in out:
            out.append(row)
    return out


# --- the job -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    """One sweep, as every implementation runs it (and as the peers get it, in JSON)."""

    collective: str
    nranks: int
    dtype: str
    op: str                                   # a ReduceOp name in lower case, or "none"
    root: int
    cases: tuple[tuple[int, int], ...]        # (size in bytes, count) per row
    warmup: int
    iters: int
    budget: float                             # seconds of timed calls per row and form
    check: bool
    algorithm: str | None = None              # ringlet's algorithm= (None: its own choice)
    buffers: str = "private"                  # ringlet's: private numpy or "shared" (comm.empty)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Job:
        d = json.loads(text)
        d["cases"] = tuple(tuple(c) for c in d["cases"])
        return cls(**d)


@dataclass
class Timing:
    """One form of one row: the reported time, the calls timed, the wrong elements."""

    time_us: float
    iters: int
    wrong: int | None            # None: not checked

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Timing:
        return cls(float(d["time_us"]), int(d["iters"]),
                   None if d["wrong"] is None else int(d["wrong"]))


@dataclass
class Row:
    """One size: its count and a :class:`Timing` per form measured."""

    size: int
    count: int
    forms: dict[str, Timing] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "count": self.count,
                "forms": {f: asdict(t) for f, t in self.forms.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Row:
        return cls(int(d["size"]), int(d["count"]),
                   {f: Timing.from_dict(t) for f, t in d["forms"].items()})


# --- data: deterministic inputs and their reference --------------------------------------------

#: Inputs repeat with this period (a prime, so a block moved to a wrong offset
#: almost never lands on equal values).
PERIOD = 4099


class Data:
    """Deterministic per-rank inputs for one dtype and op, and numpy's expected results.

    Rank r's input is an endless pattern ``T_r[i % PERIOD]`` of small integers
    (``[-30, 30]``; ``{-2, -1, 1, 2}`` for a product; 0/1 for bool), so every
    reduction of up to 68 ranks is exact in every float type and the result
    does not depend on the order of the reduction (AVG adds one rounded
    division, allowed one unit in the last place).  References are computed
    on the period and tiled: O(PERIOD * nranks) work, whatever the size.
    """

    def __init__(self, dtype: str, op: str, nranks: int) -> None:
        #: bfloat16 is generated and reduced as float32 (small integers: exact), stored as
        #: its bit patterns in int16 arrays, and handed to ringlet as torch tensors
        self.bf16 = dtype == "bfloat16"
        self.dtype = np.dtype("float32" if self.bf16 else dtype)
        self.op = None if op == "none" else ReduceOp.parse(op)
        self.nranks = nranks
        self.tables = np.stack([self._table(r) for r in range(nranks)])
        self._reduced = (None if self.op is None
                         else reference_reduce(self.tables, self.op))
        if self.bf16:
            self.tables = bf16_bits(self.tables)
            if self._reduced is not None:
                self._reduced = bf16_bits(self._reduced)
            self.dtype = np.dtype("int16")

    def _table(self, rank: int) -> np.ndarray:
        rng = np.random.default_rng((0x52494E47, rank))
        kind = self.dtype.kind
        if kind == "b":
            return rng.integers(0, 2, PERIOD).astype(bool)
        if self.op is ReduceOp.PROD:
            vals = np.array([1, 2] if kind == "u" else [-2, -1, 1, 2])
            re = rng.choice(vals, PERIOD)
            im = rng.choice(vals, PERIOD)
        else:
            lo = 0 if kind == "u" else -30
            re = rng.integers(lo, lo + 61, PERIOD)
            im = rng.integers(lo, lo + 61, PERIOD)
        if kind == "c":
            return (re + 1j * im).astype(self.dtype)
        return re.astype(self.dtype)

    @staticmethod
    def _window(table: np.ndarray, start: int, count: int) -> np.ndarray:
        """Elements ``start .. start + count - 1`` of the endless pattern of ``table``."""
        return np.resize(np.roll(table, -(start % PERIOD)), count)

    def input(self, rank: int, start: int, count: int) -> np.ndarray:
        """Rank ``rank``'s input elements ``start .. start + count - 1`` (a new array)."""
        return self._window(self.tables[rank], start, count)

    def reduced(self, start: int, count: int) -> np.ndarray:
        """numpy's reduction of every rank's input, elements ``start .. start + count - 1``."""
        if self._reduced is None:
            raise ArgumentError("this job has no reduction op")
        return self._window(self._reduced, start, count)

    def gathered(self, start: int, count: int) -> np.ndarray:
        """Every rank's elements ``start .. start + count - 1``: shape (nranks, count)."""
        return np.stack([self.input(j, start, count) for j in range(self.nranks)])

    def identity(self) -> np.ndarray:
        """A value that the op leaves unchanged when every rank holds it (0-d array).

        In-place calls are timed on it, so repeated reductions neither overflow
        nor slow down; the check then runs on the real inputs.
        """
        op, dt = self.op, self.dtype
        if op is ReduceOp.PROD:
            return bf16_bits(np.ones(1))[0] if self.bf16 else np.ones((), dt)
        if op is ReduceOp.BAND:
            return np.full((), True if dt.kind == "b" else -1).astype(dt)
        return np.zeros((), dt)

    def poison(self, expected: np.ndarray) -> np.ndarray:
        """An array that differs from ``expected`` in every element (to fill outputs).

        Floats get NaN, which equals nothing and is close to nothing (``expected + 1``
        is within bfloat16's tolerance below, and equals ``expected`` past 2048 in
        float16, as a product of 12 ranks can be).
        """
        if self.dtype.kind == "b":
            return np.logical_not(expected)
        if self.bf16:
            return bf16_bits(np.full(expected.shape, np.nan, np.float32))
        if self.dtype.kind in "fc":
            return np.full(expected.shape, np.nan, self.dtype)
        return (expected + np.ones((), self.dtype)).astype(self.dtype)

    def wrong(self, got: np.ndarray, expected: np.ndarray) -> int:
        """How many elements of ``got`` differ from ``expected``."""
        got, expected = got.reshape(-1), expected.reshape(-1)
        if self.bf16 and self.op in (ReduceOp.SUM, ReduceOp.AVG):
            # sums past 256 round in bfloat16; an AVG rounds once more
            g, e = bf16_values(got), bf16_values(expected)
            return int(np.count_nonzero(~np.isclose(g, e, rtol=2.0 ** -7, atol=0)))
        if self.op is ReduceOp.AVG and self.dtype.kind in "fc":
            eps = float(np.finfo(self.dtype).eps)
            return int(np.count_nonzero(~np.isclose(got, expected, rtol=eps, atol=0)))
        return int(np.count_nonzero(got != expected))


def pingpong_partner(rank: int, nranks: int) -> int | None:
    """``sendrecv`` pairs ranks 0-1, 2-3, ...; the last of an odd number waits it out."""
    peer = rank ^ 1
    return peer if peer < nranks else None


# --- buffers of one call -----------------------------------------------------------------------


@dataclass
class Layout:
    """The buffers of one collective call on one rank, and how to check them.

    ``arrays`` are what the call uses (``x`` the input, ``y`` the output; an
    in-place form has ``x`` only; None where this rank passes nothing).
    ``expected`` gives, for the arrays this rank checks, numpy's answer;
    ``initial`` the value an array holds before the checked call.
    """

    arrays: dict[str, np.ndarray | None]
    initial: dict[str, Callable[[], np.ndarray]]
    expected: dict[str, Callable[[], np.ndarray]]


def layout(job: Job, data: Data, rank: int, count: int, form: str) -> Layout:
    """Allocate and fill one rank's buffers for ``job.collective`` with ``count`` (per rank)."""
    c, n, root = job.collective, job.nranks, job.root
    dt = data.dtype
    arrays: dict[str, np.ndarray | None] = {}
    initial: dict[str, Callable[[], np.ndarray]] = {}
    expected: dict[str, Callable[[], np.ndarray]] = {}
    at_root = rank == root

    def mine(start: int = 0, k: int = count) -> Callable[[], np.ndarray]:
        return lambda: data.input(rank, start, k)

    if c == "all_reduce":
        expected["x" if form == IN else "y"] = lambda: data.reduced(0, count)
        if form == IN:
            arrays["x"] = np.full(count, data.identity(), dt)
        else:
            arrays["x"], arrays["y"] = data.input(rank, 0, count), np.empty(count, dt)
        initial["x"] = mine()
    elif c == "broadcast":
        src = data.input(root, 0, count)
        arrays["x"] = src.copy() if at_root else data.poison(src)
        expected["x"] = lambda: data.input(root, 0, count)
        initial["x"] = mine() if at_root else (lambda: data.poison(data.input(root, 0, count)))
    elif c == "reduce":
        if form == IN:
            # every rank times on the identity: the root's result then stays put
            arrays["x"] = np.full(count, data.identity(), dt)
            if at_root:
                expected["x"] = lambda: data.reduced(0, count)
        else:
            arrays["x"] = data.input(rank, 0, count)
            arrays["y"] = np.empty(count, dt) if at_root else None
            if at_root:
                expected["y"] = lambda: data.reduced(0, count)
        initial["x"] = mine()
    elif c in ("all_gather", "gather"):
        arrays["x"] = data.input(rank, 0, count)
        initial["x"] = mine()
        if c == "all_gather" or at_root:
            arrays["y"] = np.empty((n, count), dt)
            expected["y"] = lambda: data.gathered(0, count)
        else:
            arrays["y"] = None
    elif c == "reduce_scatter":
        arrays["x"], arrays["y"] = data.input(rank, 0, n * count), np.empty(count, dt)
        initial["x"] = mine(0, n * count)
        expected["y"] = lambda: data.reduced(rank * count, count)
    elif c == "all_to_all":
        arrays["x"], arrays["y"] = data.input(rank, 0, n * count), np.empty(n * count, dt)
        initial["x"] = mine(0, n * count)
        expected["y"] = lambda: data.gathered(rank * count, count).reshape(-1)
    elif c == "scatter":
        arrays["x"] = data.input(root, 0, n * count) if at_root else None
        if at_root:
            initial["x"] = mine(0, n * count)
        arrays["y"] = np.empty(count, dt)
        expected["y"] = lambda: data.input(root, rank * count, count)
    elif c == "sendrecv":
        peer = pingpong_partner(rank, n)
        arrays["x"], arrays["y"] = data.input(rank, 0, count), np.empty(count, dt)
        initial["x"] = mine()
        if peer is not None:
            expected["y"] = lambda: data.input(peer, 0, count)
    else:
        raise ArgumentError(f"no buffer layout for collective {c!r}")
    return Layout(arrays, initial, expected)


# --- timing ------------------------------------------------------------------------------------


class Sync(Protocol):
    """What the timing loop needs from an implementation, outside the timed region."""

    def barrier(self) -> None:
        """Wait for every rank."""

    def max(self, value: float) -> float:
        """The maximum of ``value`` over the ranks (the same on every rank)."""

    def sum(self, value: int) -> int:
        """The sum of ``value`` over the ranks (the same on every rank)."""


def measure(call: Callable[[], object], sync: Sync, job: Job) -> tuple[float, int]:
    """Warm up, then time ``call``: (max over ranks of the mean seconds per call, calls timed).

    The first warm-up call sizes the rest: more warm-up calls while they fit
    in ``job.budget``, then at most ``job.iters`` timed calls that fit in it
    (at least one).  With ``job.warmup == 0`` nothing is sized and exactly
    ``job.iters`` calls are timed.
    """
    iters = job.iters
    if job.warmup > 0:
        sync.barrier()
        t0 = time.perf_counter()
        call()
        est = sync.max(time.perf_counter() - t0)
        more = min(job.warmup - 1, _fits(job.budget, est))
        if more > 0:
            sync.barrier()
            t0 = time.perf_counter()
            for _ in range(more):
                call()
            est = sync.max((time.perf_counter() - t0) / more)
        iters = max(1, min(iters, _fits(job.budget, est)))
    sync.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    return sync.max((time.perf_counter() - t0) / iters), iters


def _fits(budget: float, seconds_per_call: float) -> int:
    """How many calls of ``seconds_per_call`` fit in ``budget`` (a large number if free)."""
    if seconds_per_call <= 0:
        return 1 << 30
    return int(min(budget / seconds_per_call, 1 << 30))


Ctx = TypeVar("Ctx")
#: A registered benchmark function: ``fn(ctx, arrays, form) -> one call``, where
#: ``arrays`` are the layout's buffers; the returned callable runs the operation once.
BenchFn = Callable[[Ctx, dict[str, np.ndarray | None], str], Callable[[], object]]


def sweep(fn: BenchFn[Ctx], ctx: Ctx, job: Job, rank: int, forms: Sequence[str], sync: Sync,
          on_row: Callable[[Row], None] | None = None,
          place: Callable[[Layout], None] | None = None) -> list[Row]:
    """Run ``job``'s rows with benchmark function ``fn``: time every form, then check it.

    Every rank calls this with the same job; each returns the same rows
    (times and wrong counts are reduced over the ranks).  The check loads the
    inputs again, fills the outputs with values that differ from the expected
    ones everywhere, makes one call and counts the wrong elements on every
    rank.  ``place(layout)``, if given, may move the layout's arrays elsewhere
    (same shapes and contents) before they are used.
    """
    data = Data(job.dtype, job.op, job.nranks)
    messages = COLLECTIVES[job.collective].messages
    rows: list[Row] = []
    for size, count in job.cases:
        row = Row(size, count)
        for form in forms:
            lay = layout(job, data, rank, count, form)
            if place is not None:
                place(lay)
            call = fn(ctx, as_torch_bf16(lay.arrays) if data.bf16 else lay.arrays, form)
            seconds, iters = measure(call, sync, job)
            wrong: int | None = None
            if job.check:
                expected = {name: make() for name, make in lay.expected.items()}
                for name, arr in lay.arrays.items():
                    if arr is None:
                        continue
                    if name in lay.initial:
                        arr[...] = lay.initial[name]().reshape(arr.shape)
                    elif name in expected:
                        arr[...] = data.poison(expected[name]).reshape(arr.shape)
                call()
                mine = 0
                for name, want in expected.items():
                    got = lay.arrays[name]
                    mine += want.size if got is None else data.wrong(got, want)
                wrong = sync.sum(mine)
            row.forms[form] = Timing(seconds * 1e6 / messages, iters, wrong)
            del lay, call
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def algbw(size: int, time_us: float) -> float:
    """GB/s (10**9 bytes per second) of ``size`` bytes in ``time_us``; NaN if no time."""
    return size / (time_us * 1e3) if time_us > 0 and math.isfinite(time_us) else math.nan
