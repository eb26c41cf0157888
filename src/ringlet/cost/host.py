"""The calibrated model of ringlet's own shared-memory transport on this host.

On one host the "link" is the CPUs themselves: every byte a collective moves
is copied (or reduced) by a core, a rank waiting for a peer polls shared
memory, and with more ranks than cores the ranks take turns.  The link model
of :mod:`ringlet.cost.model` (alpha per round, beta per byte on full-duplex
links) does not describe that well enough to choose between algorithms, so a
calibrated profile carries a :class:`Host` and :func:`predict` counts each
call the way the communicator really runs it, on one of three paths
(:func:`path_of`: the rules of ``Communicator._path``), from the same
schedule the executor runs (:func:`host_counts`):

``generic``
    The step executor runs the schedule over per-pair channels: the sender
    copies a message into channel slots, the receiver copies it out or
    reduces straight out of them (that pull *is* the reduction).  Per round
    with messages::

        round + endpoint * (messages sent and received on the busiest core)
              + for the busiest rank: channel * max(bytes out, bytes in)
                                      + duplex * min(bytes out, bytes in)
                                      + copy * bytes copied locally
                                      + reduce * bytes reduced locally

    (the busiest core's messages: the busiest rank's, or with more ranks than
    cores every rank's shared out over the cores, :func:`endpoint_load`; a
    receive that reduces pays the channel only: its pull is the reduction).

    A one-way transfer is paced by the hand-over of slots between the two
    cores, so a rank moving bytes both ways at once pays ``duplex`` (measured:
    between nothing, a full-duplex link, and ``channel``, a half-duplex one)
    for the smaller direction.

``staged`` (the ``direct`` algorithms, fused)
    The same schedule, run on shared buffers: a rank *publishes* what it sends
    once, however many peers read it (a send of the same chunk to k peers in
    one round costs one copy), and peers read it in place (a receive is one
    copy out of the peer's area, a receive-and-reduce one reduction reading
    it).  A chunk received into the scratch buffer ``TMP`` stays in the
    peer's area: the local steps that read it later are the reads.  The data
    goes through the stage area in pieces (:func:`staged_pieces`, cut as
    ``ringlet.transport.fused`` cuts them), and every round of the schedule
    is one synchronisation of all ranks per piece (the READY / REDUCED
    counters).  Per round::

        pieces * piece_sync + shared * (bytes published + read + copied)
                            + reduce * bytes reduced

``post`` (``oneshot`` all_reduce up to ``RINGLET_SHM_POST_BYTES``, fused)
    As staged, in one piece; the exchange round needs no synchronisation of
    its own (each rank copies its vector into its post area before it
    publishes the call's descriptor, so the agreement on the call is the
    exchange): it costs ``post_round``, reading the peers' areas.

Every call also pays ``call[collective:path]`` (its Python, measured at one
rank) and one ``sync`` (the agreement on the call's descriptor); the rounds'
fixed costs are scaled by the algorithm's measured pace at that rank count
(:attr:`Level.pace`).  With more ranks than cores the ranks' work in a round
shares the cores: a round's data work is ``max(busiest rank, total work /
cores)``, times a measured factor per kind of path for the turns not being
taken perfectly (:attr:`Level.work`, :attr:`Level.work_generic`).

One function costs a call round by round and rank by rank, :func:`host_rounds`
(the call's fixed cost, the agreement, each round's fixed costs, :func:`round_fixed`,
each rank's data work, :func:`round_work`, times the cores' sharing, :func:`sharing`):
:func:`predict` runs every rank's rounds on its own clock (on the step executor a rank
waits only for its senders; the fused paths synchronise every rank each round, where
that is the busiest rank of every round, summed), exactly as the simulator
(:mod:`ringlet.sim.host`, ``ringlet simulate --profile``) does without disturbances,
which then adds stragglers and noise.  (When the ranks are too many to walk every one
of them, a sample is walked and the busiest of every round summed.)

Per-byte costs depend on where the data lives: a :class:`Curve` has one
figure while the call's :func:`working_set` fits in half the last-level cache
and another from twice its size on, interpolated in log(size) between.

Everything is measured by :mod:`ringlet.cost.calibrate`; the fixed costs
(:class:`Level`) at every rank count from 1 to the calibrated one.  Beyond
it the synchronisations are scaled by (p - 1) from the largest calibrated
count, there is no pace, and every prediction says so
(:attr:`HostPrediction.extrapolated`).

Not modelled: the element type's effect on the choice (the tuner predicts
float32; float16 reductions run ~100x slower in numpy), zero-copy buffers
from ``Communicator.empty`` (their all_reduce reads peers in place), and
where buffers start in their pages (copies from a page-aligned area into a
buffer 16 bytes past a page boundary are an order of magnitude slower on some
CPUs; see ``benchmarks/VALIDATION.md``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Any, TypeVar

import numpy as np

from ..algorithms import build
from ..config import Settings
from ..errors import ArgumentError
from ..ops import DType
from ..schedule import COLLECTIVES, Buf, Kind
from ..transport.fused import FUSED_PATHS, fused_path

#: (collective, algorithm) -> the fused path the shared-memory transport runs it on
#: (the transport's own table: one place for the rules)
FUSED = FUSED_PATHS
PATHS = ("generic", "staged", "post")

#: How each staged collective cuts its data into pieces (``ringlet.transport.fused``):
#: (the extent cut: the "vector" or one rank's "block", stage slots per piece,
#: whether the piece width is per rank block of an all_reduce piece).
_STAGING: dict[str, tuple[str, int, bool]] = {
    "all_reduce": ("vector", 1, True), "broadcast": ("vector", 1, False),
    "all_gather": ("block", 1, False), "reduce_scatter": ("block", 0, False),
    "all_to_all": ("block", 0, False)}

#: element types by the speed of their reduction kernel
DTYPE_CLASSES = ("float", "half", "int", "complex", "bool")
#: the element type calibration measures for each class
CLASS_DTYPES = {"float": "float32", "half": "float16", "int": "int32", "complex": "complex64",
                "bool": "bool"}


def dtype_class(d: DType) -> str:
    """The reduction class of an element type: float, half, int, complex or bool."""
    if d.name in ("float16", "bfloat16"):
        return "half"
    kind = d.np_dtype.kind
    return {"f": "float", "c": "complex", "b": "bool"}.get(kind, "int")


_DEFAULTS = Settings()


@dataclass(frozen=True)
class Paths:
    """The communicator settings that decide how a call runs on shared memory
    (defaults: :class:`~ringlet.config.Settings`' defaults)."""

    fused: bool = _DEFAULTS.fused
    post_bytes: int = _DEFAULTS.shm_post_bytes
    stage_bytes: int = _DEFAULTS.shm_stage_bytes
    piece_bytes: int = _DEFAULTS.shm_piece_bytes
    #: the compiled one-shot all_reduce runs (ringlet.lean: built, and RINGLET_LEAN on)
    lean: bool = field(default_factory=lambda: _lean_built() and _DEFAULTS.lean)

    @classmethod
    def from_settings(cls, settings: Any) -> Paths:
        """The paths of a :class:`~ringlet.config.Settings` (its shm_*, fused and lean
        fields; lean only where ringlet._lean was built)."""
        return cls(bool(settings.fused), int(settings.shm_post_bytes),
                   int(settings.shm_stage_bytes), int(settings.shm_piece_bytes),
                   bool(settings.lean) and _lean_built())


def _lean_built() -> bool:
    from ..lean import BUILT

    return BUILT


#: the element types the compiled one-shot all_reduce takes (ringlet.lean; op sum)
LEAN_DTYPES = frozenset({"float32", "float64", "int32", "int64"})


def path_of(collective: str, algorithm: str, nbytes: int, paths: Paths) -> str:
    """``generic``, ``staged`` or ``post``: how the communicator runs this call
    (``nbytes``: the collective's size as :func:`~ringlet.algorithms.select.choose` takes it)."""
    return fused_path(collective, algorithm, nbytes, fused=paths.fused,
                      post_bytes=paths.post_bytes)


def staged_pieces(collective: str, nranks: int, count: int, itemsize: int,
                  paths: Paths) -> int:
    """How many pieces the staged path cuts a call into (as ``ringlet.transport.fused``).

    ``count`` is the unit count of the schedule: the vector's elements
    (all_reduce, broadcast) or one rank's block (the others).
    """
    extent, slots, per_block = _STAGING[collective]
    slots = slots or nranks
    cap = paths.stage_bytes // (itemsize * slots)
    want = max(1, paths.piece_bytes // itemsize)
    if per_block:
        want *= nranks
    step = max(1, min(cap, want))
    return max(1, -(-count // step)) if count else 0


# --- calibrated costs -------------------------------------------------------------------------


_T = TypeVar("_T")


def _check(what: str, v: Any, positive: bool = False) -> None:
    """An ArgumentError unless ``v`` is a finite number >= 0 (> 0 if ``positive``): a
    profile edited by hand, or from another version, must not predict negative or NaN
    times (the automatic choice follows them)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or \
            v < 0 or (positive and v == 0):
        raise ArgumentError(f"{what} must be a finite number {'> 0' if positive else '>= 0'}, "
                            f"got {v!r}")


def located(where: str, make: Callable[[], _T]) -> _T:
    """``make()``, its ArgumentError saying where in a profile the value is."""
    try:
        return make()
    except ArgumentError as exc:
        raise ArgumentError(f"{where}: {exc}") from None


def cache_limits(llc: int) -> tuple[float, float]:
    """Working sets up to the first figure run from the cache, from the second on from
    memory (bytes; ``llc`` is the last-level cache's size)."""
    return llc / 2, 2.0 * llc


@dataclass(frozen=True)
class Curve:
    """Seconds per byte while the working set fits in the cache and once it does not.

    Up to ``llc / 2`` bytes of working set (:func:`working_set`) the ``cache``
    figure holds, from ``2 * llc`` on the ``memory`` one; in between the two are
    interpolated in log(size).  (On the machine this was written on, a 32 MiB
    last-level cache, copies slow down between 16 and 24 MiB of working set and
    settle from about 64 MiB.)
    """

    cache: float
    memory: float

    def __post_init__(self) -> None:
        for name in ("cache", "memory"):
            _check(f"Curve.{name}", getattr(self, name))

    def at(self, working_set: float, llc: int) -> float:
        """Seconds per byte for a call whose buffers total ``working_set`` bytes."""
        lo, hi = cache_limits(llc)
        if working_set <= lo or llc <= 0:
            return self.cache
        if working_set >= hi:
            return self.memory
        f = math.log(working_set / lo) / math.log(hi / lo)
        return self.cache + f * (self.memory - self.cache)


@dataclass(frozen=True)
class Level:
    """The fixed costs at ``nranks`` ranks, in seconds, and the oversubscription factors.

    ``sync``: one synchronisation of every rank (a barrier's, less its call);
    ``piece_sync``: one round of one piece of a staged path; ``post_round``:
    the one-shot path's exchange round (no wait: reading the peers' post
    areas); ``round``: one round of the step executor; ``endpoint``: one
    message sent or received on the busiest core of a round.  ``work`` (fused
    paths) and ``work_generic`` (the step executor) multiply the data work
    when there are more ranks than cores (1 otherwise, and never below 1):
    ranks that share cores do not share them perfectly (a rank waiting for a
    descheduled peer spins, then yields).  They hold while the data is in the cache and fade to 1 as
    it moves to memory (a :class:`Curve` from the factor to 1), where the
    memory bandwidth, shared whatever the number of cores, is the limit.
    ``pace`` maps ``"collective:algorithm"`` to the factor its rounds' fixed
    costs take at this rank count (1 if absent): what a tiny call of it took
    beyond its call and agreement, over what the round terms above predict.
    The executor runs a schedule as a data flow, so the rounds of a pipelined
    algorithm overlap (a factor below 1), and an algorithm whose rounds keep
    more ranks waiting on each other than the average costs more (above 1);
    NCCL's tuning tables likewise carry a latency per algorithm.
    """

    nranks: int
    sync: float
    piece_sync: float
    round: float
    endpoint: float
    work: float = 1.0
    work_generic: float = 1.0
    post_round: float = 0.0
    pace: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.nranks, bool) or not isinstance(self.nranks, int) or \
                self.nranks < 1:
            raise ArgumentError(f"Level.nranks must be a whole number >= 1, got "
                                f"{self.nranks!r}")
        for name in ("sync", "piece_sync", "round", "endpoint", "post_round"):
            _check(f"Level.{name}", getattr(self, name))
        for name in ("work", "work_generic"):
            _check(f"Level.{name}", getattr(self, name), positive=True)
        for k, v in self.pace.items():
            _check(f"Level.pace[{k!r}]", v, positive=True)


@dataclass(frozen=True)
class Host:
    """What calibration measured about the shared-memory transport (see the module docs).

    ``calls`` maps ``"collective:path"`` to the seconds of one call of that
    collective on that path at one rank (its Python, no waiting);
    ``reduce`` maps a dtype class (:data:`DTYPE_CLASSES`) to its reduction curve.
    """

    cores: int
    llc_bytes: int
    channel: Curve
    duplex: Curve
    copy: Curve
    shared: Curve
    reduce: dict[str, Curve]
    calls: dict[str, float]
    levels: tuple[Level, ...]
    #: ranks -> seconds of a tiny all_reduce on the compiled path (ringlet.lean), its
    #: whole fixed cost; empty where it was not built at calibration
    lean: dict[int, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cores < 1:
            raise ArgumentError(f"Host.cores must be >= 1, got {self.cores}")
        _check("Host.llc_bytes", self.llc_bytes)
        if not self.levels:
            raise ArgumentError("Host.levels needs the fixed costs of at least one rank count")
        counts = [lv.nranks for lv in self.levels]
        if len(set(counts)) < len(counts):
            raise ArgumentError(f"Host.levels has a rank count twice: {counts}")
        for k, v in self.calls.items():
            _check(f"Host.calls[{k!r}]", v)
        for n, v in self.lean.items():
            if n < 1:
                raise ArgumentError(f"Host.lean: rank counts must be >= 1, got {n}")
            _check(f"Host.lean[{n}]", v)
        missing = sorted(set(DTYPE_CLASSES) - set(self.reduce))
        if missing:
            raise ArgumentError(f"Host.reduce lacks the dtype classes {missing}")

    @property
    def calibrated_ranks(self) -> int:
        """The largest rank count whose fixed costs were measured."""
        return max(lv.nranks for lv in self.levels)

    def level(self, nranks: int) -> tuple[Level, bool]:
        """The fixed costs at ``nranks`` ranks, and whether they are extrapolated."""
        by = {lv.nranks: lv for lv in self.levels}
        if nranks in by:
            return by[nranks], False
        top = by[self.calibrated_ranks]
        if nranks < top.nranks:   # a gap in the table: the next calibrated count up
            return by[min(k for k in by if k > nranks)], True
        scale = (nranks - 1) / max(1, top.nranks - 1)
        known = top.nranks > self.cores or nranks <= self.cores
        return Level(nranks, top.sync * scale, top.piece_sync * scale, top.round,
                     top.endpoint, top.work if known else 1.0,
                     top.work_generic if known else 1.0, top.post_round * scale), True

    def lean_call(self, nranks: int) -> float | None:
        """Seconds of a tiny all_reduce on the compiled path at ``nranks`` (None: not
        calibrated); past the calibrated counts it grows with the peers, as ``sync``."""
        if not self.lean:
            return None
        if nranks in self.lean:
            return self.lean[nranks]
        top = max(self.lean)
        if nranks < top:
            return self.lean[min(k for k in self.lean if k > nranks)]
        one = self.lean.get(1, 0.0)
        return one + (self.lean[top] - one) * (nranks - 1) / max(1, top - 1)

    def call(self, collective: str, path: str) -> float:
        """Seconds of one call's own work on ``path`` (the generic figure if unmeasured)."""
        key = f"{collective}:{path}"
        if key in self.calls:
            return self.calls[key]
        return self.calls.get(f"{collective}:generic", max(self.calls.values(), default=0.0))

    def to_dict(self) -> dict[str, Any]:
        return {"cores": self.cores, "llc_bytes": self.llc_bytes,
                "channel": asdict(self.channel), "duplex": asdict(self.duplex),
                "copy": asdict(self.copy),
                "shared": asdict(self.shared),
                "reduce": {k: asdict(v) for k, v in self.reduce.items()},
                "calls": dict(self.calls), "levels": [asdict(lv) for lv in self.levels],
                "lean": {str(k): v for k, v in self.lean.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Host:
        """The host of a profile's ``host`` object; an ArgumentError says where a bad
        value is (``host.levels[1]: Level.sync must be ...``)."""
        def curve(key: str, v: Any) -> Curve:
            return located(f"host.{key}", lambda: Curve(**v))

        def level(i: int, v: Any) -> Level:
            return located(f"host.levels[{i}]", lambda: Level(**v))

        return cls(int(data["cores"]), int(data["llc_bytes"]), curve("channel", data["channel"]),
                   curve("duplex", data["duplex"]), curve("copy", data["copy"]),
                   curve("shared", data["shared"]),
                   {k: curve(f"reduce.{k}", v) for k, v in data["reduce"].items()},
                   {k: float(v) for k, v in data["calls"].items()},
                   tuple(level(i, lv) for i, lv in enumerate(data["levels"])),
                   {int(k): float(v) for k, v in data.get("lean", {}).items()})


# --- counting a schedule for the host -----------------------------------------------------------


@dataclass(frozen=True)
class HostCounts:
    """One schedule, counted per round and rank, in bytes per element of the unit count.

    Message view (the step executor): ``sent``, ``recv`` (copied out of a
    channel), ``rred`` (reduced out of a channel), ``lcopy``, ``lred`` (local
    copies and reductions) and ``ends`` (non-empty messages sent plus received).
    Shared-buffer view (the fused paths): ``publish`` (distinct chunks sent),
    ``copy`` (local copies of this rank's own data into IN/OUT), ``read``
    (copies out of a peer's area), ``rreduce`` (reductions reading a peer's
    area) and ``lreduce`` (reductions of this rank's own data).  A chunk
    received into ``TMP`` stays in the peer's area: the steps that later read
    it are the reads.  Arrays are ``(rounds, ranks walked)``; ``weight``
    scales a sum over the walked ranks to all ranks.
    """

    nranks: int
    unit: int                 # the unit count the bytes were counted at
    sent: np.ndarray
    recv: np.ndarray
    rred: np.ndarray
    lcopy: np.ndarray
    lred: np.ndarray
    ends: np.ndarray
    publish: np.ndarray
    copy: np.ndarray
    read: np.ndarray
    rreduce: np.ndarray
    lreduce: np.ndarray
    messages: np.ndarray      # per round: whether any rank sends a non-empty message in it
    weight: float
    buffers: float            # elements of IN + OUT per element of m, on one rank
    scratch: float            # elements of TMP per element of m, on one rank


#: rank-rounds a count may walk before it switches to a sample of ranks
_WALK_BUDGET = 40_000
_FIELDS = ("sent", "recv", "rred", "lcopy", "lred", "ends", "publish", "copy", "read",
           "rreduce", "lreduce")


@lru_cache(maxsize=4096)
def host_counts(collective: str, algorithm: str, nranks: int, root: int = 0,
                params: tuple[tuple[str, int], ...] = (), m: int = 0,
                every: bool = False) -> HostCounts:
    """The :class:`HostCounts` of one algorithm (its registry defaults unless ``params``).

    ``m = 0`` counts at the smallest unit count that cuts every chunk evenly, so
    the figures scale to any size; a given ``m`` counts that size exactly (below
    the even size some chunks are empty, and empty messages are never sent).
    ``every`` walks every rank, beyond the budget that otherwise samples them.
    """
    from .model import _m_ref, _sample

    s = build(collective, algorithm, nranks, root, **dict(params))
    unit = m if m > 0 else _m_ref(s)
    bounds = {b: lay.bounds(unit).tolist() for b, lay in s.layouts.items()}
    tmp_chunks = s.layouts[Buf.TMP].nchunks if Buf.TMP in s.layouts else 0
    steps0 = sum(len(rnd) for rnd in s.steps(0))
    ranks = list(range(nranks)) if every or steps0 * nranks <= _WALK_BUDGET else \
        _sample(nranks, s.root, 0)
    R, k = s.nrounds, len(ranks)
    acc = {name: np.zeros((R, k)) for name in _FIELDS}
    messages = np.zeros(R, bool)

    def nbytes(refs: tuple[tuple[Buf, int, int], ...]) -> int:
        return sum(bounds[b][e] - bounds[b][st] for b, st, e in refs)

    def split(refs: tuple[tuple[Buf, int, int], ...], remote: list[bool]) -> tuple[int, int]:
        """(own bytes, bytes in a peer's area) that ``refs`` read."""
        own = far = 0
        for b, st, e in refs:
            if b is Buf.TMP:
                for ch in range(st, e):
                    size = bounds[b][ch + 1] - bounds[b][ch]
                    if remote[ch]:
                        far += size
                    else:
                        own += size
            else:
                own += bounds[b][e] - bounds[b][st]
        return own, far

    for j, r in enumerate(ranks):
        remote = [False] * tmp_chunks     # TMP chunks that hold a peer's data (in its area)
        for i, rnd in enumerate(s.steps(r)):
            published: set[tuple[tuple[Buf, int, int], ...]] = set()
            for st in rnd:
                kind = st.kind
                if kind is Kind.SEND:
                    b = nbytes(st.src)
                    if not b:
                        continue
                    acc["sent"][i, j] += b
                    acc["ends"][i, j] += 1
                    messages[i] = True
                    if st.src not in published:
                        published.add(st.src)
                        acc["publish"][i, j] += b
                elif kind is Kind.RECV or kind is Kind.RRED:
                    b = nbytes(st.dst)
                    if not b:
                        continue
                    acc["ends"][i, j] += 1
                    if kind is Kind.RRED and st.src_first:
                        # dst = received (op) dst: the executor copies the received data
                        # out, reduces the copy with dst and copies it back (SrcFirst)
                        acc["recv"][i, j] += b
                        acc["lred"][i, j] += b
                        acc["lcopy"][i, j] += b
                        acc["rreduce"][i, j] += b
                        continue
                    if kind is Kind.RRED:
                        acc["rred"][i, j] += b
                        acc["rreduce"][i, j] += b
                        continue
                    acc["recv"][i, j] += b
                    for buf, st0, e0 in st.dst:
                        if buf is Buf.TMP:
                            for ch in range(st0, e0):
                                remote[ch] = True
                        else:
                            acc["read"][i, j] += bounds[buf][e0] - bounds[buf][st0]
                elif kind is Kind.COPY:
                    own, far = split(st.src, remote)
                    acc["lcopy"][i, j] += own + far
                    if all(ref[0] is Buf.TMP for ref in st.dst):
                        for _, st0, e0 in st.dst:   # an alias of the source, no copy
                            for ch in range(st0, e0):
                                remote[ch] = far > 0
                        continue
                    acc["copy"][i, j] += own
                    acc["read"][i, j] += far
                elif kind is Kind.LRED:
                    own, far = split(st.src, remote)
                    acc["lred"][i, j] += own + far
                    acc["lreduce"][i, j] += own
                    acc["rreduce"][i, j] += far
                    if st.src_first:   # src copied to scratch, reduced, copied back
                        acc["lcopy"][i, j] += 2 * (own + far)

    out = {name: a / unit for name, a in acc.items()}
    out["ends"] = acc["ends"]
    lay = s.layouts
    buffers = sum(lay[b].scale for b in (Buf.IN, Buf.OUT) if b in lay)
    scratch = float(lay[Buf.TMP].scale) if Buf.TMP in lay else 0.0
    return HostCounts(nranks, unit, out["sent"], out["recv"], out["rred"], out["lcopy"],
                      out["lred"], out["ends"], out["publish"], out["copy"], out["read"],
                      out["rreduce"], out["lreduce"], messages, nranks / k, float(buffers),
                      scratch)


def counts_at(collective: str, algorithm: str, nranks: int, m: int, root: int = 0,
              params: tuple[tuple[str, int], ...] = (), every: bool = False) -> HostCounts:
    """:func:`host_counts` for unit count ``m``: exact below the even size, scaled above."""
    c = host_counts(collective, algorithm, nranks, root, params, 0, every)
    if m < c.unit:
        return host_counts(collective, algorithm, nranks, root, params, m, every)
    return c


# --- predicting --------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostPrediction:
    """The host model's answer for one call (seconds and what they are made of)."""

    seconds: float
    path: str
    pieces: int
    syncs: int                 # synchronisations of all ranks (the agreement included)
    rounds: int                # rounds with messages
    fixed_seconds: float       # call, synchronisations, rounds and messages
    move_seconds: float        # copies: through channels or shared buffers
    reduce_seconds: float
    bytes_per_rank: float      # the most bytes a rank sends (generic) or publishes (fused)
    critical_bytes: float      # per round, the busiest rank's bytes moved, summed
    working_set: float
    extrapolated: bool
    how: str = field(default="")


def working_set(c: HostCounts, path: str, m: int, itemsize: int) -> float:
    """Bytes a call touches, summed over the ranks: each rank's bytes moved, copied and
    reduced, at most its buffers (with the scratch buffer on the generic path)."""
    if path == "generic":
        per = c.sent + c.recv + c.rred + c.lcopy + c.lred
        own = c.buffers + c.scratch
    else:
        per = c.publish + c.copy + c.read + c.rreduce + c.lreduce
        own = c.buffers
    touched = np.minimum(per.sum(axis=0), own) if per.size else np.zeros(0)
    return float(touched.sum()) * c.weight * m * itemsize


def endpoint_load(c: HostCounts, cores: int) -> np.ndarray:
    """Per round, the messages (sent plus received) the round's Python handles on the
    busiest core: the busiest rank's, or every rank's spread over the cores if more."""
    if not c.ends.size:
        return np.zeros(c.ends.shape[0])
    return np.maximum(c.ends.max(axis=1), c.ends.sum(axis=1) * c.weight / cores)


def round_work(host: Host, c: HostCounts, path: str, i: int, size: float, ws: float,
               red: Curve) -> tuple[np.ndarray, np.ndarray]:
    """Per walked rank, round ``i``'s (moving, reducing) seconds at ``size`` bytes per
    unit (= m * itemsize) and working set ``ws``."""
    llc = host.llc_bytes
    g = red.at(ws, llc)
    if path == "generic":
        ch, dx, cp = (x.at(ws, llc) for x in (host.channel, host.duplex, host.copy))
        incoming = c.recv[i] + c.rred[i]
        mv = (ch * np.maximum(c.sent[i], incoming) + dx * np.minimum(c.sent[i], incoming)
              + cp * c.lcopy[i]) * size
        rd = g * c.lred[i] * size      # a receive reduces as it pulls: the pull is the reduction
        return mv, rd
    sh = host.shared.at(ws, llc)
    mv = sh * (c.publish[i] + c.copy[i] + c.read[i]) * size
    rd = g * (c.rreduce[i] + c.lreduce[i]) * size
    return mv, rd


def sharing(work: np.ndarray, weight: float, cores: int) -> float:
    """The factor a round's data work takes when its ranks share the cores: the busiest
    rank's ``work`` (seconds per walked rank) becomes ``max(busiest, total / cores)``."""
    busiest = float(work.max()) if work.size else 0.0
    shared = float(work.sum()) * weight / cores
    return shared / busiest if busiest > 0 and shared > busiest else 1.0


def round_fixed(lv: Level, path: str, pieces: int, load: float) -> float:
    """The fixed costs of a round with messages, before the pace: the step executor's
    round and its busiest core's ``load`` messages, one synchronisation per piece
    (staged), or the one-shot exchange (post)."""
    if path == "generic":
        return lv.round + lv.endpoint * load
    if path == "staged":
        return pieces * lv.piece_sync
    return lv.post_round


@dataclass(frozen=True)
class HostRounds:
    """One call on this host, round by round and rank by rank: what :func:`predict` sums
    (the busiest rank of every round) and the simulator runs (every rank on its own
    clock, :mod:`ringlet.sim.host`).

    Every rank first pays ``call`` (the call's Python), then all of them ``sync`` (the
    agreement on the call).  Round ``i`` then costs a rank that takes part in it
    (:attr:`active`) ``fixed[i]`` (the round's fixed costs, times the algorithm's pace;
    0 in a round without messages) plus ``move[i, j] + reduce[i, j]`` (its data work,
    times the round's cores-sharing factor, :func:`sharing`, and the turns ranks
    sharing cores take, :attr:`Level.work`).  Columns are the walked ranks of
    ``counts`` (every rank unless ``counts.weight > 1``).
    """

    counts: HostCounts
    path: str
    pieces: int
    call: float
    sync: float
    fixed: np.ndarray
    move: np.ndarray
    reduce: np.ndarray
    working_set: float
    extrapolated: bool
    #: the compiled one-shot path (ringlet.lean) runs the call
    compiled: bool = False

    @property
    def active(self) -> np.ndarray:
        """(rounds, walked ranks): whether the rank sends, receives or works in the round."""
        return (self.counts.ends > 0) | (self.move > 0) | (self.reduce > 0)


def host_rounds(host: Host, collective: str, algorithm: str, nranks: int, m: int,
                dtype: DType, paths: Paths, nbytes: int, root: int = 0,
                params: tuple[tuple[str, int], ...] = (), every: bool = False) -> HostRounds:
    """The :class:`HostRounds` of one call (arguments as :func:`predict`'s; ``every``
    walks every rank however many, as the simulator needs)."""
    if collective not in COLLECTIVES:
        raise ArgumentError(f"unknown collective {collective!r}")
    c = counts_at(collective, algorithm, nranks, m, root, params, every)
    path = path_of(collective, algorithm, nbytes, paths)
    lv, extrapolated = host.level(nranks)
    isz = dtype.itemsize
    size = float(m) * isz
    ws = working_set(c, path, m, isz)
    red = host.reduce.get(dtype_class(dtype), host.reduce["float"])
    pieces = staged_pieces(collective, nranks, m, isz, paths) if path == "staged" else 1
    pace = 1.0 if extrapolated else lv.pace.get(f"{collective}:{algorithm}", 1.0)
    # the oversubscription factor holds while the data is in the cache; from memory on the
    # memory bandwidth, shared whatever the number of cores, is the limit
    work = lv.work_generic if path == "generic" else lv.work
    turns = Curve(work, 1.0).at(ws, host.llc_bytes) if work != 1.0 else 1.0
    loads = endpoint_load(c, host.cores)
    R = c.sent.shape[0]
    fixed = np.zeros(R)
    move, reduce = np.zeros_like(c.sent), np.zeros_like(c.sent)
    for i in range(R):
        mv, rd = round_work(host, c, path, i, size, ws, red)
        f = sharing(mv + rd, c.weight, host.cores) * turns   # more ranks than cores
        move[i], reduce[i] = mv * f, rd * f
        if c.messages[i]:
            fixed[i] = round_fixed(lv, path, pieces, float(loads[i])) * pace
    call, sync = host.call(collective, path), lv.sync if nranks > 1 else 0.0
    compiled = host.lean_call(nranks) if path == "post" and paths.lean and \
        dtype.name in LEAN_DTYPES else None
    if compiled is not None:   # one C call: its measured cost is the call, agreement, exchange
        call, sync, fixed = compiled, 0.0, np.zeros(R)
    return HostRounds(c, path, pieces, call, sync, fixed, move, reduce, ws, extrapolated,
                      compiled is not None)


def predict(host: Host, collective: str, algorithm: str, nranks: int, m: int, dtype: DType,
            paths: Paths, nbytes: int, root: int = 0,
            params: tuple[tuple[str, int], ...] = ()) -> HostPrediction:
    """Seconds of one call: ``collective`` with ``algorithm`` at unit count ``m`` on
    ``nranks`` ranks (``nbytes``: the size the path rules look at), the busiest rank's
    round after round (:func:`host_rounds`)."""
    hr = host_rounds(host, collective, algorithm, nranks, m, dtype, paths, nbytes, root,
                     params)
    c, path, pieces = hr.counts, hr.path, hr.pieces
    size = float(m) * dtype.itemsize
    work = hr.move + hr.reduce
    counted = work.any(axis=1) | c.messages if work.size else np.zeros(0, bool)
    busiest = np.argmax(work, axis=1) if work.size else np.zeros(0, int)
    at = (np.arange(len(busiest)), busiest)
    move = float(hr.move[at][counted].sum())
    reduce = float(hr.reduce[at][counted].sum())
    moved = (c.sent + c.recv + c.lcopy if path == "generic"
             else c.publish + c.copy + c.read) * size
    crit = float(moved.max(axis=1)[counted].sum()) if moved.size else 0.0
    rounds = int(c.messages.sum())
    syncs = (1 if nranks > 1 else 0) + (pieces * rounds if path == "staged" else 0)
    fixed = hr.call + hr.sync + float(hr.fixed.sum())
    total = fixed + move + reduce
    if path == "generic" and nranks > 1 and c.weight == 1.0:
        # the step executor's ranks wait only for their own senders: on every rank's own
        # clock (the simulator's host run without disturbances) a rank that feeds no one
        # in the next round can finish its work while the others go on
        from ..sim.host import HostSimulator

        s = build(collective, algorithm, nranks, root, **dict(params))
        total = HostSimulator(s, hr, size).run().seconds
    sent = c.sent if path == "generic" else c.publish
    bytes_per_rank = float(sent.sum(axis=0).max()) * size if sent.size else 0.0
    what = {"generic": "step executor over channels",
            "staged": f"fused staged path, {pieces} piece{'s' if pieces != 1 else ''}",
            "post": "fused one-shot path through the post area"}[path]
    if hr.compiled:
        what = "compiled one-shot path (ringlet._lean) through the post area"
    how = (f"host model, {what}; fixed costs at {nranks} ranks "
           + (f"extrapolated from {host.calibrated_ranks}" if hr.extrapolated
              else "calibrated"))
    return HostPrediction(total, path, pieces, syncs, rounds, fixed, move, reduce,
                          bytes_per_rank, crit, hr.working_set, hr.extrapolated, how)


__all__ = ["CLASS_DTYPES", "DTYPE_CLASSES", "FUSED", "PATHS", "Curve", "Host", "HostCounts",
           "HostPrediction", "HostRounds", "Level", "Paths", "cache_limits", "counts_at",
           "dtype_class", "endpoint_load", "host_counts", "host_rounds", "path_of", "predict",
           "round_fixed", "round_work", "sharing", "staged_pieces", "working_set"]
