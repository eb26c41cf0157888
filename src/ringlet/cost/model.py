"""The alpha-beta-gamma cost model, counted from the schedules themselves.

A collective's time is the sum, over the rounds of its :class:`~ringlet.schedule.Schedule`
that carry messages, of the slowest rank's time in that round::

    T = sum over rounds of ( alpha + o * round_messages + beta * round_bytes
                             + gamma * round_reduced_bytes )

where ``round_bytes`` is the most bytes any rank sends or receives in the round
(links are full duplex, so a rank sending and receiving the same amount is
busy for one message time, not two), ``round_messages`` the most messages any
rank sends or receives in it (counted the same way) and ``round_reduced_bytes``
the most bytes any rank reduces.  Those per-round maxima come from
:meth:`Schedule.counts` (or, for two-level topologies and very large jobs, from
the same walk over the same steps, split by link), so the formulas of the
textbooks are *outputs* of the model, checked by the tests, never a second
copy of the algorithm that could drift from the code that runs.

Alpha is paid once per round, however many messages a rank sends in it (the
rank's messages share its link, so their bytes add up in ``round_bytes``); each
message also costs its ends the link's per-message ``overhead`` ``o`` (LogGP's
``o``/``g``: posting it, completing it, polling its flag), so a one-round
direct algorithm pays one alpha and ``p - 1`` overheads.  The simulator
(:mod:`ringlet.sim`) charges the same per-message cost at every rank's port,
so without contention, stragglers or noise the two agree.  The presets'
overheads and their sources are in :mod:`ringlet.cost.topology`; a calibration
measures this host's (the host model's ``endpoint``).

Two-level topologies
--------------------
A :class:`Profile` may have an ``inter`` link and ``gpus_per_node``: rank ``r``
is on node ``r // gpus_per_node``, a message between two ranks of one node
uses the ``intra`` link and any other message the ``inter`` link (each rank
has its own NIC, as in a DGX).  A rank's intra and inter traffic run in
parallel (NVLink and the NIC are separate hardware), so a round costs
``max(alpha_intra + beta_intra * intra_bytes, alpha_inter + beta_inter *
inter_bytes)`` (each term only if that link carries a message in the round),
plus the reduction term.  ``gamma`` is the rank's own compute, taken from the
intra link.  ``rails=True`` counts a schedule the way NCCL runs its rings across
nodes, one channel per GPU of a node (see :func:`count`).

Sizes and scaling
-----------------
Counts are taken once per schedule at a reference unit count ``m_ref`` that
divides evenly into every chunk, and kept as bytes per element of ``m``;
a prediction at any ``m`` scales them linearly.  At sizes that do not divide
evenly a real chunk differs from its share by less than one element, so the
scaled figure is off by at most ``itemsize`` bytes per chunk per round.

Large jobs
----------
Counting walks every rank's steps while that stays within
:data:`EXACT_STEP_BUDGET` steps (tens of ranks for ring-like schedules,
hundreds for logarithmic ones).  Beyond it, a schedule with a closed form of
its rounds (:meth:`~ringlet.schedule.Schedule.round_arrays`: every registered
algorithm has one) is counted over every rank from those vectors, a round
pattern once however often it repeats (:func:`_vector_count`: a ring of 16,384
ranks on two levels in well under a second, exact, as the tests check against
the walk), unless its rounds are too big for vectors (:data:`VECTOR_MESSAGES`:
all-pairs rounds at thousands of ranks).  Any other schedule is walked over a fixed,
deterministic sample of ranks (:func:`_sample`: the ends, the root, powers of
two and their mirror images, node boundaries) and takes the per-round maxima
over them.  While every rank walked moved exactly the same bytes in every
round (ring, recursive doubling/halving, Bruck, direct) it stops after three
ranks and :data:`SAMPLE_STEP_BUDGET` steps: for such rank-symmetric algorithms
the result is exact.  Otherwise it walks
the whole sample.  Every prediction says how it was counted
(:attr:`Prediction.counted`); the tests check sampled against exact counts.

Pipelining
----------
For an algorithm with a ``pieces`` parameter the model picks the piece count.
On one level it fits ``rounds(k) = r0 + r1*k`` and ``bytes(k) = b0 + b1/k``
through the counts at ``k0`` and ``2 k0`` pieces and keeps the fit if it
reproduces the count at ``4 k0`` exactly, trying ``k0`` = 1, 2, 4, ... 32 (a
pipeline's fill and drain settle once there are enough pieces).  From ``k0``
on the optimum has a closed form, ``k* = sqrt(n * beta * b1 / (alpha * r1))``
(for a chain broadcast ``r1 = 1`` and ``b1 = p - 2``: the classic
``sqrt((p-2) * n * beta / alpha)``); below ``k0`` the counts decide.  Every
count taken later is checked against the fit.  Without a fit the model
searches 1, 2, 4, ...  On two levels it takes the one-level optimum on the
slower link and counts the nearest powers of two on both links.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import numpy as np

from ..algorithms import algorithms as registered_algorithms
from ..algorithms import build, entry
from ..config import DEFAULT_PROFILE
from ..errors import ArgumentError
from ..ops import DTYPES, DType
from ..schedule import COLLECTIVES, Kind, Schedule
from .host import Host, Paths, located
from .host import predict as host_predict
from .units import bus_factor_of

#: Where a calibration stores this machine's profile (``Profile.save()``/``Profile.load()``);
#: the default of the ``RINGLET_PROFILE`` setting.
DEFAULT_PROFILE_PATH = Path(DEFAULT_PROFILE)

#: The profile file's format (its ``"format"`` key): a file without the key was written
#: before ringlet wrote one and reads the same; a later format is refused, not guessed at.
PROFILE_FORMAT = "ringlet-profile/1"

#: nccl-tests' bus-bandwidth factors, busbw = algbw * factor (nccl-tests doc/PERFORMANCE.md;
#: gather and scatter as in its gather.cu and scatter.cu).
BUS_FACTORS: dict[str, str] = {
    "all_reduce": "2(n-1)/n", "reduce_scatter": "(n-1)/n", "all_gather": "(n-1)/n",
    "all_to_all": "(n-1)/n", "gather": "(n-1)/n", "scatter": "(n-1)/n",
    "broadcast": "1", "reduce": "1", "scan": "1", "exscan": "1",
}

#: The seeds' textbook volume per rank, in units of the collective's size S: an all-reduce
#: sends "about 2S", each of its phases (reduce-scatter, all-gather) "about S".
TEXTBOOK_VOLUME: dict[str, float] = {
    "all_reduce": 2.0, "reduce_scatter": 1.0, "all_gather": 1.0, "all_to_all": 1.0,
    "broadcast": 1.0, "reduce": 1.0, "scatter": 1.0, "gather": 1.0, "scan": 1.0,
    "exscan": 1.0,
}

_DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32",
                  "float": "float32", "single": "float32", "fp64": "float64",
                  "double": "float64", "fp8": "uint8", "int": "int32"}

#: Steps a single count may walk before it switches to a sample of ranks.
EXACT_STEP_BUDGET = 20_000
#: Steps a sampled count walks (at least three ranks are always walked).
SAMPLE_STEP_BUDGET = 10_000
#: The most messages (about ranks x rank 0's steps) a round may have for a count from the
#: rounds' closed form (:func:`_vector_count`); beyond, the walk over a sample of ranks.
VECTOR_MESSAGES = 1 << 21
#: A piece count is counted only if rounds x the ranks walked stays within this; beyond
#: it the fitted closed form answers (or, without one, the search stops).
COUNT_BUDGET = 10_000
#: The most rounds a piece count may have to be counted from the rounds' closed form,
#: and the most messages (ranks x rank 0's steps) it may move in all.
VECTOR_ROUNDS = 1 << 15
VECTOR_WORK = 1 << 24
#: The largest piece count considered.
PIECES_CAP = 1 << 16


def bus_factor(collective: str, nranks: int) -> float:
    """nccl-tests' busbw / algbw for ``collective`` on ``nranks`` ranks."""
    _check_collective(collective)
    return bus_factor_of(BUS_FACTORS[collective], nranks)


def _check_collective(collective: str) -> None:
    if collective not in COLLECTIVES:
        raise ArgumentError(
            f"unknown collective {collective!r}; use one of {', '.join(COLLECTIVES)}")


def dtype_of(dtype: str | DType) -> DType:
    """A :class:`~ringlet.ops.DType` from a name such as ``float32``, ``fp16`` or ``bf16``."""
    if isinstance(dtype, DType):
        return dtype
    name = _DTYPE_ALIASES.get(str(dtype).lower(), str(dtype).lower())
    d = DTYPES.get(name)
    if d is None:
        raise ArgumentError(
            f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)} "
            f"(or fp16, bf16, fp32, fp64)")
    return d


# --- links and profiles ---------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    """One kind of link: ``alpha`` seconds of latency per round, ``beta`` seconds per byte
    per direction, ``gamma`` seconds per byte reduced, ``overhead`` seconds per message at
    each end (LogGP's per-message cost: a rank that sends or receives k messages over the
    link in a round is busy ``k * overhead`` on top of its bytes), and where the numbers
    came from."""

    alpha: float
    beta: float
    gamma: float = 0.0
    source: str = ""
    overhead: float = 0.0

    def __post_init__(self) -> None:
        for name in ("alpha", "beta", "gamma", "overhead"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ArgumentError(f"Link.{name} must be a finite number >= 0, got {v!r}")

    @classmethod
    def from_bandwidth(cls, bandwidth: float, latency: float = 0.0, gamma: float = 0.0,
                       source: str = "", overhead: float = 0.0) -> Link:
        """A link of ``bandwidth`` bytes/s per direction, ``latency`` seconds per round and
        ``overhead`` seconds per message."""
        if not bandwidth > 0:
            raise ArgumentError(f"bandwidth must be > 0 bytes/s, got {bandwidth!r}")
        return cls(float(latency), 1.0 / float(bandwidth), float(gamma), source,
                   float(overhead))

    @property
    def bandwidth(self) -> float:
        """Bytes per second per direction (``1 / beta``)."""
        return math.inf if self.beta == 0 else 1.0 / self.beta


@dataclass(frozen=True)
class Fit:
    """One fitted term of a calibration: its value, unit, the points it was fitted to
    and the residuals relative to the measured times (root mean square and largest)."""

    term: str
    value: float
    unit: str
    points: int
    rms: float
    worst: float
    how: str


@dataclass(frozen=True)
class Calibration:
    """When, where, with what and how well a profile was calibrated
    (:mod:`ringlet.cost.calibrate`)."""

    date: str
    host: str
    cores: int
    llc_bytes: int
    nranks: int
    seconds: float
    python: str
    numpy: str
    ringlet: str
    paths: dict[str, Any]
    fits: tuple[Fit, ...]
    quick: bool = False

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["fits"] = [asdict(f) for f in self.fits]
        return d

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Calibration:
        return cls(str(data["date"]), str(data["host"]), int(data["cores"]),
                   int(data["llc_bytes"]), int(data["nranks"]), float(data["seconds"]),
                   str(data.get("python", "")), str(data.get("numpy", "")),
                   str(data.get("ringlet", "")), dict(data.get("paths", {})),
                   tuple(Fit(**f) for f in data.get("fits", ())), bool(data.get("quick", False)))


@dataclass(frozen=True)
class Profile:
    """The links a job runs on: one level (``intra`` only) or two (``intra``, ``inter``
    and ``gpus_per_node``; rank ``r`` is on node ``r // gpus_per_node``).

    A calibration (``ringlet predict --calibrate``) produces a one-level profile
    with ``host`` (the costs of ringlet's shared-memory transport on this machine,
    :class:`~ringlet.cost.host.Host`) and ``calibration`` (when, where, how well),
    and stores it as JSON::

        profile = Profile(Link(alpha=4e-6, beta=1 / 6e9, gamma=1 / 8e9, source="calibrated"))
        profile.save()                     # ~/.cache/ringlet/profile.json
        Profile.load()                     # the same profile back

    With ``host``, one-level predictions use the host model
    (:func:`ringlet.cost.host.predict`); without it, the link model.
    """

    intra: Link
    inter: Link | None = None
    gpus_per_node: int = 0
    name: str = ""
    source: str = ""
    host: Host | None = None
    calibration: Calibration | None = None

    def __post_init__(self) -> None:
        if self.inter is not None and self.gpus_per_node < 1:
            raise ArgumentError(
                "a two-level profile needs gpus_per_node >= 1 (ranks per node), "
                f"got {self.gpus_per_node}")
        if self.gpus_per_node < 0:
            raise ArgumentError(f"gpus_per_node must be >= 0, got {self.gpus_per_node}")

    def levels_for(self, nranks: int) -> int:
        """1 if every one of ``nranks`` ranks is on one node (or there is one level), else 2."""
        if self.inter is None or self.gpus_per_node >= nranks:
            return 1
        return 2

    def uses_host(self, nranks: int) -> bool:
        """Whether predictions at ``nranks`` ranks use the host model."""
        return self.host is not None and self.levels_for(nranks) == 1

    def calibrated_elsewhere(self) -> str | None:
        """Why this calibrated profile may not describe this machine, or None: it was
        calibrated on another host (a home directory shared between machines).  The reason
        reads after "the profile ... was"."""
        import socket

        cal = self.calibration
        if cal is None or not cal.host or cal.host == socket.gethostname():
            return None
        return (f"calibrated on {cal.host} ({cal.cores} cores), not on this "
                f"host {socket.gethostname()} ({os.cpu_count()} cores): the automatic choice "
                f"may be off here; calibrate this host (`ringlet predict --calibrate --out "
                f"PATH`, then RINGLET_PROFILE=PATH), or set RINGLET_PROFILE='' to choose by "
                f"the built-in size rules")

    def to_dict(self) -> dict[str, Any]:
        return {"format": PROFILE_FORMAT,
                "name": self.name, "source": self.source, "gpus_per_node": self.gpus_per_node,
                "intra": asdict(self.intra),
                "inter": None if self.inter is None else asdict(self.inter),
                "host": None if self.host is None else self.host.to_dict(),
                "calibration": None if self.calibration is None else self.calibration.to_dict()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Profile:
        fmt = data.get("format", PROFILE_FORMAT)
        if fmt != PROFILE_FORMAT:
            from .. import __version__

            raise ArgumentError(
                f"a profile in format {fmt!r}, and this ringlet ({__version__}) reads "
                f"{PROFILE_FORMAT!r}: written by another version of ringlet? recalibrate "
                f"with `ringlet predict --calibrate`")
        try:
            inter = data.get("inter")
            host = data.get("host")
            cal = data.get("calibration")
            return cls(intra=located("intra", lambda: Link(**data["intra"])),
                       inter=None if inter is None else located("inter", lambda: Link(**inter)),
                       gpus_per_node=int(data.get("gpus_per_node", 0)),
                       name=str(data.get("name", "")), source=str(data.get("source", "")),
                       host=None if host is None else Host.from_dict(host),
                       calibration=None if cal is None else Calibration.from_dict(cal))
        except ArgumentError as exc:   # a value out of range: where it is, and why
            raise ArgumentError(f"not a usable profile: {exc}") from None
        except (KeyError, TypeError, AttributeError, ValueError) as exc:
            raise ArgumentError(
                f"not a ringlet profile ({type(exc).__name__}: {exc}); expected keys "
                f"intra{{alpha, beta, gamma, source}}, inter (or null), gpus_per_node, name, "
                f"source, and optionally host and calibration (from a calibration)") from None

    def save(self, path: str | Path | None = None) -> Path:
        """Write the profile as JSON to ``path`` (default :data:`DEFAULT_PROFILE_PATH`).

        The file is replaced in one step (written aside, then renamed), so ranks
        reading it meanwhile see the old profile or the new one, never half of it.
        """
        p = Path(path if path is not None else DEFAULT_PROFILE_PATH).expanduser()
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        os.replace(tmp, p)
        return p

    @classmethod
    def load(cls, path: str | Path | None = None) -> Profile:
        """Read a profile written by :meth:`save` (default :data:`DEFAULT_PROFILE_PATH`)."""
        p = Path(path if path is not None else DEFAULT_PROFILE_PATH).expanduser()
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise ArgumentError(
                f"no profile at {p}; calibrate this machine first, or give links "
                f"explicitly (--link, --bandwidth/--latency)") from None
        except (OSError, ValueError) as exc:
            raise ArgumentError(f"cannot read the profile {p}: {exc}") from None
        if not isinstance(data, dict):
            raise ArgumentError(f"{p} is not a ringlet profile (a JSON object expected)")
        try:
            return cls.from_dict(data)
        except ArgumentError as exc:
            raise ArgumentError(f"{p}: {exc}") from None


# --- counting ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tally:
    """One schedule's per-round maxima, in bytes per element of the unit count ``m``.

    ``intra[i]``/``inter[i]``: the most bytes any rank sends or receives over that
    link in round ``i``; ``*_msgs[i]``: whether the link carries a message in it;
    ``reduced[i]``: the most bytes any rank reduces.  Multiply by ``m * itemsize``.
    ``intra_count[i]``/``inter_count[i]``: the most messages any rank sends or
    receives over that link in round ``i`` (what the per-message overhead multiplies).
    """

    intra: np.ndarray
    inter: np.ndarray
    intra_msgs: np.ndarray
    inter_msgs: np.ndarray
    reduced: np.ndarray
    sent_max: float        # most bytes any rank sends in total (per element of m)
    rounds: int            # rounds with at least one message
    counted: str           # how: "all 8 ranks" / "12 of 4096 ranks (rank-symmetric sample)"
    intra_count: np.ndarray
    inter_count: np.ndarray

    @property
    def messages(self) -> float:
        """Per-message overheads on the critical path if both links cost the same."""
        return float(np.maximum(self.intra_count, self.inter_count).sum())

    @property
    def critical(self) -> float:
        """Bytes per element of m on the critical path (both links together)."""
        return float(np.maximum(self.intra, self.inter).sum())


def _m_ref(schedule: Schedule) -> int:
    """The smallest unit count that cuts every chunk of every buffer evenly."""
    m = 1
    for lay in schedule.layouts.values():
        need = lay.nchunks // math.gcd(lay.nchunks, lay.scale)
        m = m * need // math.gcd(m, need)
    if m > 1 << 40:  # absurd lcm: any large m is within one element per chunk
        m = 1 << 40
    return m


def _sample(n: int, root: int, gpus_per_node: int) -> list[int]:
    """A deterministic sample of ranks likely to include every distinct role.

    The ends, the root and its neighbours, the middle, and every power of two
    with its neighbours, counted from rank 0, from the root and from the end
    (tree levels, recursive-doubling partners and their mirror images), and the
    ranks at node boundaries.
    """
    cand = [0, n - 1, root, (root + 1) % n, (root - 1) % n, 1, n - 2, n // 2, n // 2 - 1,
            n // 2 + 1, 2, 3]
    k = 2
    while k < n:
        for x in (k - 1, k, k + 1):
            cand += [x, n - 1 - x, (root + x) % n]
        k *= 2
    g = gpus_per_node
    if 0 < g < n:
        cand += [g - 1, g, g + 1, 2 * g - 1, n - g, n - g - 1]
    seen: dict[int, None] = {}
    for r in cand:
        if 0 <= r < n:
            seen.setdefault(r, None)
    return list(seen)


def count(schedule: Schedule, gpus_per_node: int = 0, rails: bool = False) -> Tally:
    """The :class:`Tally` of ``schedule``, split by link if ``0 < gpus_per_node < nranks``.

    One level: straight from :meth:`Schedule.counts` when every rank can be
    walked within :data:`EXACT_STEP_BUDGET`.  Otherwise from the rounds' closed
    form over every rank (:func:`_vector_count`) where the schedule has one and its
    rounds are not too big for vectors (:data:`VECTOR_MESSAGES`), or
    the same walk over the
    same steps, split by link, over every rank or over :func:`_sample`: the
    sample stops after three ranks (and :data:`SAMPLE_STEP_BUDGET` steps) if
    every rank walked so far moved exactly the same bytes in every round (a
    rank-symmetric algorithm), and walks the whole sample otherwise.

    ``rails`` (two levels only) counts the schedule as NCCL runs its rings across
    nodes: ``gpus_per_node`` channels, each a copy of the schedule on
    ``1/gpus_per_node`` of the data with the ranks of every node rotated by the
    channel number, so that each channel leaves a node through a different
    GPU's NIC.  A rotation inside a node keeps every message's link (intra or
    inter), so in every round a rank carries the average of its node's loads;
    that is what is counted (sends and receives averaged separately: a NIC
    sends for one channel while it receives for another).
    """
    n = schedule.nranks
    two_level = 0 < gpus_per_node < n
    m = _m_ref(schedule)
    mine = schedule.steps(0)
    first = sum(len(rnd) for rnd in mine)
    # a walk visits every round of every rank walked, steps or not (a chain broadcast of
    # 4,096 ranks has one step on rank 0 but 4,095 rounds: walking them took a minute)
    exact = max(first, schedule.nrounds) * n <= EXACT_STEP_BUDGET
    g = gpus_per_node if two_level else 0
    rails = rails and g > 0
    if not exact and _vectorable(schedule, mine):
        return _vector_count(schedule, m, g, rails)
    if exact or len(_sample(n, schedule.root, g)) * (g if rails else 1) >= n:
        exact, ranks = True, list(range(n))
    elif rails:   # whole nodes: the nodes of the sampled ranks
        nodes = dict.fromkeys(r // g for r in _sample(n, schedule.root, g))
        ranks = [x * g + i for x in nodes for i in range(g) if x * g + i < n]
    else:
        ranks = _sample(n, schedule.root, g)
    return _walk(schedule, m, ranks, g, exact, rails)


#: round patterns :func:`_vector_count` keeps at once
_PATTERNS = 256


def _vectorable(schedule: Schedule, mine: Sequence[Sequence[Any]] | None = None) -> bool:
    """Whether :func:`_vector_count` can count ``schedule`` (``mine``: rank 0's steps):
    it has the rounds' closed form, and a round's vectors, about n times rank 0's steps
    in it, stay small (all-pairs rounds at 16,384 ranks would take gigabytes; their
    ranks are alike: the sample walks 3)."""
    if schedule.round_fn is None:
        return False
    mine = schedule.steps(0) if mine is None else mine
    return schedule.nranks * max(map(len, mine), default=0) <= VECTOR_MESSAGES


def _vector_count(schedule: Schedule, m: int, g: int, rails: bool) -> Tally:
    """:func:`count` over every rank from the rounds' closed form (no rank's steps built).

    At ``m_ref`` every chunk holds the same number of elements, so a message's
    bytes are its chunk count times that and the count is exact, like a walk
    of every rank.  Rounds that repeat a pattern (a ring's ``2(p - 1)`` rounds
    are two) reuse its figures, which is what makes 16,384 ranks quick.
    """
    n, R = schedule.nranks, schedule.nrounds
    e = schedule.chunk_elements(m)
    unit = np.arange(n) // g if rails else None
    size = np.bincount(unit).astype(float) if unit is not None else None

    def per_unit(v: np.ndarray) -> np.ndarray:
        if unit is None or size is None:
            return v
        return np.bincount(unit, v, len(size)) / size

    # pattern -> (its arrays, (intra, inter, reduced, intra count, inter count), the ranks
    # (units) it sends from or None for all, what they send); the arrays are kept with
    # their figures so that the ids in the key stay theirs.  At most _PATTERNS of them: a
    # chain's rounds are all different (16,384 ranks: gigabytes), so the sends counted
    # so far are folded into ``sent`` and the patterns forgotten.
    Figures = tuple[Any, tuple[float, ...], "np.ndarray | None", np.ndarray]
    figures: dict[tuple[int, ...], Figures] = {}
    times: dict[tuple[int, ...], int] = {}
    sent = np.zeros(len(size) if size is not None else n)

    def fold() -> None:
        for k, c in times.items():
            _, _, ids, vals = figures[k]
            if ids is None:
                sent[:] += vals * c
            else:
                sent[ids] += vals * c
        times.clear()

    def few(arrays: tuple[np.ndarray, ...]) -> Figures:
        """:func:`pattern` of a round of a few messages, in plain Python (numpy's calls
        cost more than the work: a chain's 16,384 rounds of one to four messages)."""
        src, dst, chunks, red = (a.tolist() for a in arrays[:4])
        sides: list[list[dict[int, float]]] = [[{}, {}, {}, {}], [{}, {}, {}, {}]]
        reduced: dict[int, float] = {}
        sent: dict[int, float] = {}
        for s_, d_, c, r in zip(src, dst, chunks, red, strict=True):
            b = float(c * e)
            vs, vd, cs, cd = sides[1 if g and s_ // g != d_ // g else 0]
            vs[s_] = vs.get(s_, 0.0) + b
            vd[d_] = vd.get(d_, 0.0) + b
            cs[s_] = cs.get(s_, 0.0) + 1.0
            cd[d_] = cd.get(d_, 0.0) + 1.0
            sent[s_] = sent.get(s_, 0.0) + b
            if r:
                reduced[d_] = reduced.get(d_, 0.0) + b
        figs = [(max([*vs.values(), *vd.values()], default=0.0),
                 max([*cs.values(), *cd.values()], default=0.0)) for vs, vd, cs, cd in sides]
        row = (figs[0][0], figs[1][0], max(reduced.values(), default=0.0), figs[0][1],
               figs[1][1])
        return (arrays, row, np.fromiter(sent, np.int64, len(sent)),
                np.fromiter(sent.values(), float, len(sent)))

    def pattern(ra: dict[str, np.ndarray], arrays: tuple[np.ndarray, ...]) -> Figures:
        src, dst, chunks, red = arrays[:4]
        local = ra.get("local")
        if unit is None and local is None and len(src) <= 16:
            return few(arrays)
        nb = chunks * e
        ids: np.ndarray | None = None
        s_i, d_i, N = src, dst, n
        if unit is None and local is None and 8 * len(src) < n:
            # the few ranks a round touches, numbered 0..N-1 (a pipeline's rounds touch a
            # few of many ranks: vectors of all n ranks per round took minutes)
            ids, inv = np.unique(np.concatenate((src, dst)), return_inverse=True)
            s_i, d_i, N = inv[:len(src)], inv[len(src):], len(ids)

        # every message the same size (most rounds): a rank's bytes are its messages' count
        # times it, so the weighted counts are not needed (16,384 ranks: 16,383 rounds)
        same = float(nb[0]) if unit is None and len(nb) and chunks.min() == chunks.max() \
            else None

        def side(mask: np.ndarray | None) -> tuple[float, float]:
            s_, d_, w = (s_i, d_i, nb) if mask is None else (s_i[mask], d_i[mask], nb[mask])
            if not len(s_):
                return 0.0, 0.0
            cs, cd = np.bincount(s_, minlength=N), np.bincount(d_, minlength=N)
            if same is not None:
                most = float(max(cs.max(), cd.max()))
                return same * most, most
            vol = np.maximum(per_unit(np.bincount(s_, w, N)), per_unit(np.bincount(d_, w, N)))
            if unit is None:
                return float(vol.max()), float(max(cs.max(), cd.max()))
            return float(vol.max()), float(np.maximum(per_unit(cs.astype(float)),
                                                      per_unit(cd.astype(float))).max())

        cross = (src // g != dst // g) if g else None
        inner = side(None if cross is None else ~cross)
        outer = (0.0, 0.0) if cross is None else side(cross)
        if local is None and not red.any():
            most_reduced = 0.0
        else:
            reduced = np.bincount(d_i[red], nb[red], N) + (local * e if local is not None
                                                           else 0.0)
            most_reduced = float(np.max(per_unit(reduced), initial=0.0))
        row = (inner[0], outer[0], most_reduced, inner[1], outer[1])
        vals = np.bincount(s_i, minlength=N) * same if same is not None else \
            np.bincount(s_i, nb, N)
        return arrays, row, ids, vals if ids is not None else per_unit(vals)

    rows = np.zeros((5, R))
    for i in range(R):
        ra = schedule.round_arrays(i)
        arrays = tuple(ra[k] for k in ("src", "dst", "chunks", "reduce", "local") if k in ra)
        key = tuple(id(a) for a in arrays) + (len(arrays),)
        got = figures.get(key)
        if got is None:
            if len(figures) >= _PATTERNS:
                fold()
                figures.clear()
            got = figures[key] = pattern(ra, arrays)
        rows[:, i] = got[1]
        times[key] = times.get(key, 0) + 1
    fold()
    a_in, a_out, a_red, c_in, c_out = rows
    how = f"all {n} ranks (from the rounds' closed form)"
    if rails:
        how += f", as {g} rail channels (loads averaged within each node)"
    return Tally(a_in / m, a_out / m, a_in > 0, a_out > 0, a_red / m,
                 float(np.max(sent)) / m, int(((a_in > 0) | (a_out > 0)).sum()), how,
                 c_in, c_out)


def _walk(schedule: Schedule, m: int, ranks: Sequence[int], g: int, exact: bool,
          rails: bool = False) -> Tally:
    R, n = schedule.nrounds, schedule.nranks
    bounds = {b: lay.bounds(m).tolist() for b, lay in schedule.layouts.items()}

    memo: dict[tuple[tuple[Any, int, int], ...], int] = {}

    def nbytes(refs: tuple[tuple[Any, int, int], ...]) -> int:
        v = memo.get(refs)
        if v is None:
            v = memo[refs] = sum(bounds[b][e] - bounds[b][s] for b, s, e in refs)
        return v

    intra = [0.0] * R
    inter = [0.0] * R
    reduced = [0.0] * R
    c_intra = [0.0] * R
    c_inter = [0.0] * R
    sent_max = 0.0
    walked = steps_seen = units = 0
    signature: tuple[tuple[float, ...], ...] | None = None
    symmetric = True
    # With rails a unit is a node (its ranks' sends and receives averaged, separately:
    # a NIC sends for one channel while it receives for another), otherwise a rank.
    zero = [0] * R
    g_sin, g_rin, g_sout, g_rout, g_red = (list(zero) for _ in range(5))
    n_sin, n_rin, n_sout, n_rout = (list(zero) for _ in range(4))   # message counts
    group_sent = 0.0
    group_size = 0

    def fold() -> None:
        nonlocal intra, inter, reduced, sent_max, signature, symmetric, units
        nonlocal g_sin, g_rin, g_sout, g_rout, g_red, group_sent, group_size
        nonlocal c_intra, c_inter, n_sin, n_rin, n_sout, n_rout
        d = float(group_size) if rails else 1.0
        mine_in = [max(a, b) / d for a, b in zip(g_sin, g_rin, strict=True)]
        mine_out = [max(a, b) / d for a, b in zip(g_sout, g_rout, strict=True)]
        mine_red = [v / d for v in g_red]
        cnt_in = [max(a, b) / d for a, b in zip(n_sin, n_rin, strict=True)]
        cnt_out = [max(a, b) / d for a, b in zip(n_sout, n_rout, strict=True)]
        if not exact:
            sig = (tuple(mine_in), tuple(mine_out), tuple(mine_red), (group_sent / d,),
                   tuple(cnt_in), tuple(cnt_out))
            if signature is None:
                signature = sig
            elif sig != signature:
                symmetric = False
        intra = [max(a, b) for a, b in zip(intra, mine_in, strict=True)]
        inter = [max(a, b) for a, b in zip(inter, mine_out, strict=True)]
        reduced = [max(a, b) for a, b in zip(reduced, mine_red, strict=True)]
        c_intra = [max(a, b) for a, b in zip(c_intra, cnt_in, strict=True)]
        c_inter = [max(a, b) for a, b in zip(c_inter, cnt_out, strict=True)]
        sent_max = max(sent_max, group_sent / d)
        units += 1
        g_sin, g_rin, g_sout, g_rout, g_red = (list(zero) for _ in range(5))
        n_sin, n_rin, n_sout, n_rout = (list(zero) for _ in range(4))
        group_sent, group_size = 0.0, 0

    current = None
    for r in ranks:
        unit = r // g if rails else r
        if current is not None and unit != current:
            fold()
            if not exact and symmetric and units >= 3 and steps_seen >= SAMPLE_STEP_BUDGET:
                current = None
                break
        current = unit
        node = r // g if g else 0
        for i, rnd in enumerate(schedule.steps(r)):
            steps_seen += len(rnd)
            s_in = s_out = r_in = r_out = red = 0
            k_sin = k_sout = k_rin = k_rout = 0
            for st in rnd:
                kind = st.kind
                if kind is Kind.SEND:
                    b = nbytes(st.src)
                    group_sent += b
                    if g and st.peer // g != node:
                        s_out += b
                        k_sout += 1
                    else:
                        s_in += b
                        k_sin += 1
                elif kind is Kind.RECV or kind is Kind.RRED:
                    b = nbytes(st.dst)
                    if g and st.peer // g != node:
                        r_out += b
                        k_rout += 1
                    else:
                        r_in += b
                        k_rin += 1
                    if kind is Kind.RRED:
                        red += b
                elif kind is Kind.LRED:
                    red += nbytes(st.dst)
            if s_in or r_in or s_out or r_out or red:
                g_sin[i] += s_in
                g_rin[i] += r_in
                g_sout[i] += s_out
                g_rout[i] += r_out
                g_red[i] += red
                n_sin[i] += k_sin
                n_rin[i] += k_rin
                n_sout[i] += k_sout
                n_rout[i] += k_rout
        group_size += 1
        walked += 1
    if current is not None:
        fold()
    a_in, a_out, a_red = (np.array(x, float) for x in (intra, inter, reduced))
    rounds = int(((a_in > 0) | (a_out > 0)).sum())
    what = "nodes" if rails else "ranks"
    total = -(-n // g) if rails else n
    if exact:
        how = f"all {n} ranks"
    elif symmetric:
        how = f"{units} of {total} {what} (each moved the same bytes every round: symmetric)"
    else:
        how = f"{units} of {total} {what} (a sample of distinct roles; they differ)"
    if rails:
        how += f", as {g} rail channels (loads averaged within each node)"
    return Tally(a_in / m, a_out / m, a_in > 0, a_out > 0, a_red / m, sent_max / m, rounds, how,
                 np.array(c_intra, float), np.array(c_inter, float))


# --- predictions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """The predicted cost of one collective call with one algorithm."""

    collective: str
    algorithm: str
    nranks: int
    nbytes: int              # the collective's size S (nccl-tests convention)
    dtype: str
    pieces: int              # the piece count used (1 for algorithms without pieces)
    seconds: float
    rounds: int              # rounds with messages: the alpha term's count
    bytes_per_rank: int      # the most bytes any rank sends
    critical_bytes: int      # bytes on the critical path (sum of the per-round maxima)
    alpha_seconds: float
    beta_seconds: float
    gamma_seconds: float
    algbw: float             # nbytes / seconds (inf when nothing moves, e.g. one rank)
    busbw: float             # algbw * bus factor
    counted: str
    pieces_rule: str = ""    # how the piece count was chosen
    params: dict[str, int] = field(default_factory=dict)
    overhead_seconds: float = 0.0   # the per-message part of alpha_seconds

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (an infinite bandwidth becomes None)."""
        d = asdict(self)
        for key in ("algbw", "busbw"):
            if not math.isfinite(d[key]):
                d[key] = None
        return d


@dataclass(frozen=True)
class Inapplicable:
    """An algorithm that cannot run this call (its builder raised ArgumentError)."""

    collective: str
    algorithm: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"collective": self.collective, "algorithm": self.algorithm,
                "applicable": False, "reason": self.reason}


def unit_count(collective: str, nbytes: int, nranks: int, itemsize: int) -> int:
    """The schedule's unit count m for a collective of ``nbytes`` (nccl-tests' size).

    nccl-tests quotes all_gather and gather by their output, reduce_scatter and
    scatter by their input and all_to_all by a rank's whole buffer, all ``nranks``
    times the unit; the others by the vector itself.
    """
    _check_collective(collective)
    per = itemsize * (nranks if _scaled(collective) else 1)
    return max(1, -(-int(nbytes) // per))


def _scaled(collective: str) -> bool:
    return any(v == "N" for v in COLLECTIVES[collective].values())


def path_bytes(collective: str, m: int, nranks: int, itemsize: int) -> int:
    """The size of a call of unit count ``m``, as the shared-memory path rules
    (:func:`ringlet.cost.host.path_of`) and the automatic choice take it."""
    return m * itemsize * (nranks if _scaled(collective) else 1)


def _pieces(k: int) -> str:
    """``1 piece``, ``4 pieces``."""
    return f"{k} piece{'s' if k != 1 else ''}"


@dataclass(frozen=True)
class _Fit:
    """``rounds = r0 + r1*k``, ``bytes = m*(b0 + b1/k)``, ``reduced = m*(g0 + g1/k)`` and
    ``messages = c0 + c1*k`` (the per-round most messages of a rank, summed) for every
    piece count ``k >= k_from`` (counted at ``k_from``, 2x and 4x that)."""

    r0: float
    r1: float
    b0: float
    b1: float
    g0: float
    g1: float
    sent: float
    k_from: int
    c0: float = 0.0
    c1: float = 0.0

    def rounds(self, k: int) -> int:
        return int(round(self.r0 + self.r1 * k))

    def messages(self, k: int) -> float:
        return self.c0 + self.c1 * k

    def critical(self, k: int) -> float:
        return self.b0 + self.b1 / k

    def reduced(self, k: int) -> float:
        return self.g0 + self.g1 / k

    def seconds(self, k: int, size: float, link: Link
                ) -> tuple[float, float, float, float, float]:
        """(total, alpha, beta, gamma, overhead) seconds; alpha includes the overhead."""
        o = link.overhead * self.messages(k)
        a = link.alpha * (self.r0 + self.r1 * k) + o
        b = size * link.beta * self.critical(k)
        g = size * link.gamma * self.reduced(k)
        return a + b + g, a, b, g, o

    def agrees(self, k: int, t: Tally) -> bool:
        tol = 1e-9 * max(1.0, self.b0 + abs(self.b1))
        return (t.rounds == self.rounds(k) and abs(t.critical - self.critical(k)) <= tol
                and abs(float(t.reduced.sum()) - self.reduced(k)) <= tol
                and abs(t.messages - self.messages(k)) <= 1e-6 * max(1.0, t.messages))

    @classmethod
    def through(cls, k: int, a: Tally, b: Tally) -> _Fit:
        """The fit through the counts ``a`` at ``k`` pieces and ``b`` at ``2k``."""
        r1 = (b.rounds - a.rounds) / k
        b1 = 2 * k * (a.critical - b.critical)
        ga, gb = float(a.reduced.sum()), float(b.reduced.sum())
        g1 = 2 * k * (ga - gb)
        c1 = (b.messages - a.messages) / k
        return cls(a.rounds - r1 * k, r1, a.critical - b1 / k, b1, ga - g1 / k, g1,
                   a.sent_max, k, a.messages - c1 * k, c1)


class Estimator:
    """Times one algorithm of one collective on ``nranks`` ranks, at any size.

    Counts are cached per piece count; predicting at another size or with another
    profile costs a few vector operations, so a tuner can call it per call.
    ``params`` fixes the algorithm's other parameters (e.g. ``group`` of the
    hierarchical all-reduce).
    """

    def __init__(self, collective: str, algorithm: str, nranks: int, root: int = 0,
                 gpus_per_node: int = 0, params: tuple[tuple[str, int], ...] = (),
                 rails: bool = False) -> None:
        _check_collective(collective)
        e = entry(collective, algorithm)
        self.collective, self.algorithm, self.nranks = collective, e.name, int(nranks)
        self.root = root
        self.gpus_per_node = gpus_per_node if 0 < gpus_per_node < nranks else 0
        self.rails = bool(rails and self.gpus_per_node)
        self.pipelined = "pieces" in e.params
        self.params = dict(params)
        self._tallies: dict[int, Tally] = {}
        base = self.schedule(1)  # raises ArgumentError if the algorithm cannot run
        self._blocks = [(lay.scale, lay.blocks) for lay in base.layouts.values()]
        self._fit: _Fit | None | bool = False  # False: not computed yet

    def schedule(self, pieces: int = 1) -> Schedule:
        params = {**self.params, **({"pieces": pieces} if self.pipelined else {})}
        return build(self.collective, self.algorithm, self.nranks, self.root, **params)

    def tally(self, pieces: int = 1) -> Tally:
        t = self._tallies.get(pieces)
        if t is None:
            t = self._tallies[pieces] = count(self.schedule(pieces), self.gpus_per_node,
                                              self.rails)
        return t

    def affordable(self, pieces: int) -> bool:
        """Whether counting at ``pieces`` stays within :data:`COUNT_BUDGET` rank-rounds
        (rounds x the ranks a count is likely to walk)."""
        if pieces in self._tallies:
            return True
        n = self.nranks
        s = self.schedule(pieces)
        walked = n if n <= 64 else 40
        if self.rails:
            walked = min(n, walked * self.gpus_per_node)
        if s.nrounds > VECTOR_ROUNDS and s.nrounds * walked > COUNT_BUDGET:
            # too many rounds either way: known without building rank 0's steps (a ring of
            # 16,384 ranks in 4 pieces: 131,064 rounds, a second or more to build)
            return False
        mine = s.steps(0)
        if n * s.nrounds > EXACT_STEP_BUDGET and _vectorable(s, mine):
            # counted from the rounds' closed form: a Python loop over the rounds, and
            # work for about every rank's messages in them (a chain of 16,384 ranks in
            # 11,448 pieces: 187 million, 10 s, where its closed form answers at once)
            first = sum(len(rnd) for rnd in mine)
            return s.nrounds <= VECTOR_ROUNDS and n * first <= VECTOR_WORK
        return s.nrounds * walked <= COUNT_BUDGET

    def max_pieces(self, m: int) -> int:
        """The most pieces that leave no chunk empty at unit count ``m``."""
        if not self.pipelined:
            return 1
        k = min(scale * m // blocks for scale, blocks in self._blocks)
        return int(max(1, min(k, PIECES_CAP)))

    def check_pieces(self, pieces: int, m: int) -> None:
        """ArgumentError if ``pieces`` leave pieces empty at unit count ``m``."""
        kmax = self.max_pieces(m)
        if pieces > kmax:
            raise ArgumentError(
                f"{self.collective}/{self.algorithm}: {pieces:,} pieces of {m:,} "
                f"element{'s' if m != 1 else ''} leave pieces empty; at most {kmax:,} here")

    def fit(self) -> _Fit | None:
        """The closed form in the piece count, or None (one level only).

        Tries the counts at (1, 2, 4) pieces, then (2, 4, 8), ... (32, 64, 128):
        the first triple where the fit through the first two reproduces the third
        exactly holds from there on (a pipeline's fill and drain settle once
        there are enough pieces).  Counts that would exceed the budget stop the
        search.  Also checked against every count :meth:`predict` takes.
        """
        if self._fit is False:
            self._fit = None
            if self.pipelined and not self.gpus_per_node:
                k = 1
                while k <= 32 and self.affordable(4 * k):
                    f = _Fit.through(k, self.tally(k), self.tally(2 * k))
                    if f.agrees(4 * k, self.tally(4 * k)):
                        self._fit = f
                        break
                    k *= 2
        return self._fit if isinstance(self._fit, _Fit) else None

    def _counted_seconds(self, k: int, size: float, profile: Profile) -> float:
        return self._seconds(self.tally(k), size, profile)[0]

    def choose_pieces(self, m: int, itemsize: int, profile: Profile) -> tuple[int, str]:
        """The piece count with the least predicted time at unit count ``m``, and why."""
        if not self.pipelined:
            return 1, ""
        kmax = self.max_pieces(m)
        size = float(m) * itemsize
        f = self.fit() if profile.levels_for(self.nranks) == 1 else None
        if f is not None:
            link = profile.intra
            # below the fit's range, the counts themselves
            cands: dict[int, float] = {}
            k = 1
            while k < f.k_from and k <= kmax:
                cands[k] = self._counted_seconds(k, size, profile)
                k *= 2
            num = size * (link.beta * f.b1 + link.gamma * f.g1)
            per_piece = link.alpha * f.r1 + link.overhead * f.c1
            lo = min(f.k_from, kmax)
            if num <= 0:
                kstar = float(lo)
                why = "more pieces add rounds and save no bytes"
            elif per_piece <= 0:
                kstar = float(kmax)
                why = "more pieces cost no latency here: as many as fit"
            else:
                kstar = math.sqrt(num / per_piece)
                why = (f"closed form k* = sqrt(n*(beta*{f.b1:g} + gamma*{f.g1:g})/"
                       f"(alpha*{f.r1:g} + o*{f.c1:g})) = {kstar:.4g}")
            for c in {lo, kmax, min(kmax, max(lo, math.floor(kstar))),
                      min(kmax, max(lo, math.ceil(kstar)))}:
                cands[c] = f.seconds(c, size, link)[0]
            best = min(sorted(cands), key=lambda c: cands[c])
            rule = (f"{why}; rounds = {f.r0:g} + {f.r1:g}k and bytes = n*({f.b0:g} + "
                    f"{f.b1:g}/k) for k >= {f.k_from}, fitted to the counts at {f.k_from}, "
                    f"{2 * f.k_from} and {4 * f.k_from} pieces")
            return best, rule
        if profile.levels_for(self.nranks) == 2 and profile.inter is not None:
            # Two levels have no closed form in k; take the one-level optimum on the slower
            # link, and count that and its neighbours on both links.
            flat = estimator(self.collective, self.algorithm, self.nranks, self.root, 0,
                             tuple(sorted(self.params.items())))
            slow = max((profile.intra, profile.inter), key=lambda ln: ln.beta)
            k0, _ = flat.choose_pieces(m, itemsize, Profile(slow))
            # the nearest power of two, so that counts are shared between sizes
            k = min(kmax, 1 << max(0, round(math.log2(k0))))
            while k > 1 and not self.affordable(k):
                k //= 2
            tried = sorted({1} | {c for c in (k // 2 or 1, k, 2 * k)
                                  if c <= kmax and self.affordable(c)})
            best = min(tried, key=lambda c: (self._counted_seconds(c, size, profile), c))
            # A schedule that overlaps the two levels (hierarchical_pipelined) gains from
            # pieces the one-level optimum does not see: keep doubling while it pays.
            while best == tried[-1] and 2 * best <= kmax and self.affordable(2 * best) \
                    and self._counted_seconds(2 * best, size, profile) \
                    < self._counted_seconds(best, size, profile):
                best *= 2
                tried.append(best)
            return best, (f"one-level optimum on the slower link: {_pieces(k0)}; counted on "
                          f"both links at {' and '.join(map(str, tried))} (powers of two"
                          f"{', within the counting budget' if k < k0 / 1.5 else ''})")
        # No closed form: search 1, 2, 4, ...; time is convex in k in practice (alpha grows
        # with k, the pipeline's fill shrinks with 1/k), so stop after two worse doublings.
        best_k, best_t, worse, k = 1, math.inf, 0, 1
        while k <= kmax and worse < 2 and self.affordable(k):
            t = self._counted_seconds(k, size, profile)
            if t < best_t:
                best_k, best_t, worse = k, t, 0
            else:
                worse += 1
            k *= 2
        if k == 1:
            return 1, "1 (more pieces would be too many rounds to count)"
        searched = ", ".join(map(str, [1, 2, 4][:(k // 2).bit_length()]))
        return best_k, (f"searched pieces {searched}"
                        f"{f', ... {k // 2}' if k // 2 > 4 else ''} (counted)")

    def _seconds(self, t: Tally, size: float, profile: Profile
                 ) -> tuple[float, float, float, float, float]:
        """(total, alpha, beta, gamma, overhead) seconds of tally ``t`` at ``size`` =
        m * itemsize; alpha includes the per-message overhead."""
        a_in, b_in = profile.intra.alpha, profile.intra.beta
        ovh_in = t.intra_count * profile.intra.overhead
        lat_in = t.intra_msgs * a_in + ovh_in
        bw_in = t.intra * (size * b_in)
        red = t.reduced * (size * profile.intra.gamma)
        if profile.inter is not None and self.gpus_per_node:
            ovh_out = t.inter_count * profile.inter.overhead
            lat_out = t.inter_msgs * profile.inter.alpha + ovh_out
            bw_out = t.inter * (size * profile.inter.beta)
            out = (lat_out + bw_out) > (lat_in + bw_in)
            lat = np.where(out, lat_out, lat_in)
            bw = np.where(out, bw_out, bw_in)
            ovh = np.where(out, ovh_out, ovh_in)
        else:
            lat, bw, ovh = lat_in, bw_in, ovh_in
        a, b, g = float(lat.sum()), float(bw.sum()), float(red.sum())
        return a + b + g, a, b, g, float(ovh.sum())

    def seconds(self, m: int, itemsize: int, profile: Profile) -> float:
        """Predicted seconds at unit count ``m`` with the best piece count (no new counting
        when the closed form covers the chosen piece count)."""
        k, _ = self.choose_pieces(m, itemsize, profile)
        size = float(m) * itemsize
        f = self.fit() if profile.levels_for(self.nranks) == 1 else None
        if f is not None and k >= f.k_from:
            return f.seconds(k, size, profile.intra)[0]
        return self._counted_seconds(k, size, profile)

    def predict(self, m: int, itemsize: int, profile: Profile, dtype: str = "",
                pieces: int | None = None) -> Prediction:
        """The :class:`Prediction` at unit count ``m`` (``pieces=None``: the best count)."""
        if pieces is None:
            k, rule = self.choose_pieces(m, itemsize, profile)
        else:
            if pieces < 1 or (not self.pipelined and pieces != 1):
                raise ArgumentError(
                    f"{self.collective}/{self.algorithm}: pieces must be 1"
                    f"{' or more' if self.pipelined else ' (it is not pipelined)'}, got {pieces}")
            self.check_pieces(pieces, m)
            k, rule = int(pieces), "given"
        size = float(m) * itemsize
        f = self.fit() if profile.levels_for(self.nranks) == 1 else None
        if f is not None and k >= f.k_from and not self.affordable(k):
            # Too many rounds to count: the closed form, fitted to smaller counts, answers.
            total, a, b, g, o = f.seconds(k, size, profile.intra)
            rounds, sent, crit = f.rounds(k), f.sent * size, f.critical(k) * size
            how = (f"closed form fitted to the counts at {f.k_from}, {2 * f.k_from} and "
                   f"{4 * f.k_from} pieces ({_pieces(k)} not counted)")
        else:
            t = self.tally(k)
            if f is not None and k >= f.k_from and not f.agrees(k, t):
                self._fit = None    # the closed form does not hold after all: search instead
                if pieces is None:
                    return self.predict(m, itemsize, profile, dtype)
            total, a, b, g, o = self._seconds(t, size, profile)
            rounds, sent, crit, how = t.rounds, t.sent_max * size, t.critical * size, t.counted
        nbytes = m * itemsize * (self.nranks if _scaled(self.collective) else 1)
        algbw = nbytes / total if total > 0 else math.inf
        params = {**self.params, **({"pieces": k} if self.pipelined else {})}
        return Prediction(
            self.collective, self.algorithm, self.nranks, int(nbytes), dtype, k, total,
            rounds, int(round(sent)), int(round(crit)), a, b, g, algbw,
            algbw * bus_factor(self.collective, self.nranks), how, rule, params, o)


@lru_cache(maxsize=256)
def estimator(collective: str, algorithm: str, nranks: int, root: int = 0,
              gpus_per_node: int = 0, params: tuple[tuple[str, int], ...] = (),
              rails: bool = False) -> Estimator:
    """The cached :class:`Estimator` (raises ArgumentError if the algorithm cannot run)."""
    return Estimator(collective, algorithm, nranks, root, gpus_per_node, params, rails)


#: Parameters that name the ranks per node: on a two-level profile they are set to the
#: profile's gpus_per_node unless the caller fixes them.
NODE_PARAMS = ("group",)


def _estimator_for(collective: str, algorithm: str, nranks: int, root: int,
                   profile: Profile, params: dict[str, int] | None = None,
                   rails: bool = False) -> Estimator:
    e = entry(collective, algorithm)
    two = profile.levels_for(nranks) == 2
    fixed = {k: int(v) for k, v in (params or {}).items() if k in e.params and k != "pieces"}
    if two:
        for name in NODE_PARAMS:
            if name in e.params and name not in fixed:
                fixed[name] = profile.gpus_per_node
    return estimator(collective, e.name, nranks, root if collective in _ROOTED else 0,
                     profile.gpus_per_node if two else 0, tuple(sorted(fixed.items())),
                     rails and two)


_ROOTED = frozenset({"broadcast", "reduce", "scatter", "gather"})


def predict(collective: str, algorithm: str, nranks: int, nbytes: int, profile: Profile,
            dtype: str | DType = "float32", root: int = 0, pieces: int | None = None,
            params: dict[str, int] | None = None, rails: bool = False,
            paths: Paths | None = None) -> Prediction:
    """Predict one call: ``collective`` of ``nbytes`` (nccl-tests' size) with ``algorithm``.

    ``pieces=None`` picks the best piece count for pipelined algorithms (or takes
    ``params["pieces"]`` where the algorithm is pipelined); ``params`` fixes other
    parameters the algorithm takes (others are ignored).
    On a two-level profile a ``group`` parameter defaults to the ranks per node,
    and ``rails=True`` counts the schedule as NCCL's per-NIC channels (see
    :func:`count`).  Raises ArgumentError if the algorithm cannot run on ``nranks`` ranks.

    A calibrated profile (one with ``host``) predicts the call as the
    communicator runs it on this host (:func:`ringlet.cost.host.predict`): with
    the algorithm's default parameters (``pieces`` as given, else the
    registry's) and on the path ``paths`` (the shared-memory settings; default
    :class:`~ringlet.cost.host.Paths`) gives it.

    >>> p = predict("all_reduce", "ring", 8, 14 * 10**9,
    ...             Profile(Link.from_bandwidth(450e9)), dtype="float16")
    >>> p.rounds, p.bytes_per_rank
    (14, 24500000000)
    """
    if nranks < 1:
        raise ArgumentError(f"nranks must be >= 1, got {nranks}")
    if params and "pieces" in params:
        params = dict(params)
        given = params.pop("pieces")
        if pieces is None and "pieces" in entry(collective, algorithm).params:
            pieces = given
    d = dtype_of(dtype)
    if profile.uses_host(nranks):
        return _host(collective, algorithm, nranks, nbytes, profile, d, root, pieces, params,
                     paths or Paths())
    est = _estimator_for(collective, algorithm, nranks, root, profile, params, rails)
    m = unit_count(collective, nbytes, nranks, d.itemsize)
    return est.predict(m, d.itemsize, profile, d.name, pieces)


def _host(collective: str, algorithm: str, nranks: int, nbytes: int, profile: Profile, d: DType,
          root: int, pieces: int | None, params: dict[str, int] | None,
          paths: Paths) -> Prediction:
    """:func:`predict` with the host model of a calibrated profile."""
    _check_collective(collective)
    e = entry(collective, algorithm)
    fixed = {k: int(v) for k, v in (params or {}).items() if k in e.params and k != "pieces"}
    if pieces is not None:
        if pieces < 1 or "pieces" not in e.params:
            raise ArgumentError(
                f"{collective}/{e.name}: pieces must be 1"
                f"{' or more' if 'pieces' in e.params else ' (it is not pipelined)'}, "
                f"got {pieces}")
        fixed["pieces"] = int(pieces)
    m = unit_count(collective, nbytes, nranks, d.itemsize)
    size = path_bytes(collective, m, nranks, d.itemsize)
    host = profile.host
    if host is None:  # pragma: no cover - uses_host() checked it
        raise ArgumentError("this profile has no host model")
    hp = host_predict(host, collective, e.name, nranks, m, d, paths, size,
                      root if collective in _ROOTED else 0, tuple(sorted(fixed.items())))
    algbw = size / hp.seconds if hp.seconds > 0 else math.inf
    rule = ("the shared-memory transport's pieces (RINGLET_SHM_STAGE_BYTES, "
            "RINGLET_SHM_PIECE_BYTES)" if hp.path == "staged" else "")
    return Prediction(collective, e.name, nranks, int(size), d.name, hp.pieces, hp.seconds,
                      hp.rounds, int(round(hp.bytes_per_rank)), int(round(hp.critical_bytes)),
                      hp.fixed_seconds, hp.move_seconds, hp.reduce_seconds, algbw,
                      algbw * bus_factor(collective, nranks), hp.how, rule,
                      {**e.params, **fixed})


def predict_all(collective: str, nranks: int, nbytes: int, profile: Profile,
                dtype: str | DType = "float32", root: int = 0,
                names: Iterable[str] | None = None, params: dict[str, int] | None = None,
                rails: bool = False, paths: Paths | None = None
                ) -> list[Prediction | Inapplicable]:
    """:func:`predict` for every registered algorithm (or ``names``), fastest first;
    algorithms that cannot run this call come last, as :class:`Inapplicable`."""
    out: list[Prediction] = []
    bad: list[Inapplicable] = []
    for name in (registered_algorithms(collective) if names is None else names):
        try:
            out.append(predict(collective, name, nranks, nbytes, profile, dtype, root,
                               params=params, rails=rails, paths=paths))
        except ArgumentError as exc:
            bad.append(Inapplicable(collective, name, str(exc)))
    # on a tie the reference (naive: the tests' oracle, never the automatic choice) goes
    # after the algorithm that runs the same schedule under its own name (oneshot, direct)
    out.sort(key=lambda p: (p.seconds, p.algorithm == "naive", p.algorithm))
    return [*out, *bad]


def fastest(collective: str, nranks: int, nbytes: int, profile: Profile,
            dtype: str | DType = "float32", root: int = 0,
            names: Iterable[str] | None = None, params: dict[str, int] | None = None,
            rails: bool = False, paths: Paths | None = None) -> Prediction:
    """The fastest applicable algorithm's prediction (ArgumentError if none applies)."""
    preds = predict_all(collective, nranks, nbytes, profile, dtype, root, names, params,
                        rails, paths)
    if not preds or isinstance(preds[0], Inapplicable):
        reasons = "; ".join(f"{p.algorithm}: {p.reason}" for p in preds
                            if isinstance(p, Inapplicable))
        raise ArgumentError(f"no algorithm can run {collective} on {nranks} ranks ({reasons})")
    best = preds[0]
    if not isinstance(best, Prediction):  # pragma: no cover - Inapplicable entries sort last
        raise ArgumentError(f"no algorithm can run {collective} on {nranks} ranks")
    return best


def _host_seconds(collective: str, name: str, nranks: int, per: int, profile: Profile,
                  d: DType, root: int, params: dict[str, int] | None, paths: Paths | None,
                  m: int) -> float:
    return predict(collective, name, nranks, m * per, profile, d, root, params=params,
                   paths=paths).seconds


@dataclass(frozen=True)
class Crossover:
    """At ``nbytes`` the fastest algorithm changes from ``below`` to ``above``."""

    nbytes: int
    below: str
    above: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def crossovers(collective: str, nranks: int, profile: Profile, dtype: str | DType = "float32",
               root: int = 0, names: Iterable[str] | None = None, lo: int = 1,
               hi: int = 1 << 40, params: dict[str, int] | None = None,
               rails: bool = False, paths: Paths | None = None) -> list[Crossover]:
    """Sizes between ``lo`` and ``hi`` bytes where the fastest algorithm changes.

    Scans powers of two, then bisects each change down to one unit count.
    """
    d = dtype_of(dtype)
    per = d.itemsize * (nranks if _scaled(collective) else 1)
    timers: list[tuple[str, Any]] = []
    for name in (registered_algorithms(collective) if names is None else names):
        try:
            timer: Callable[[int], float]
            if profile.uses_host(nranks):
                predict(collective, name, nranks, per, profile, d, root, params=params,
                        paths=paths)   # raises if it cannot run
                timer = partial(_host_seconds, collective, name, nranks, per, profile, d, root,
                                params, paths)
            else:
                est = _estimator_for(collective, name, nranks, root, profile, params, rails)
                timer = partial(est.seconds, itemsize=d.itemsize, profile=profile)
            timers.append((entry(collective, name).name, timer))
        except ArgumentError:
            continue
    if len(timers) < 2:
        return []

    def winner(m: int) -> str:
        return min(timers, key=lambda t: (t[1](m), t[0] == "naive", t[0]))[0]   # as predict_all

    m_lo = max(1, lo // per)
    m_hi = max(m_lo + 1, hi // per)
    grid = sorted({m_lo, m_hi, *(1 << k for k in range(0, 62) if m_lo < (1 << k) < m_hi)})
    out: list[Crossover] = []
    prev_m, prev_w = grid[0], winner(grid[0])
    for m in grid[1:]:
        w = winner(m)
        a, wa = prev_m, prev_w
        while wa != w:   # bisect each change between a and m (there may be several)
            lo, hi = a, m
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if winner(mid) == wa:
                    lo = mid
                else:
                    hi = mid
            wb = winner(hi)
            out.append(Crossover(hi * per, wa, wb))
            a, wa = hi, wb
        prev_m, prev_w = m, w
    return out


def textbook_seconds(collective: str, nbytes: float, bandwidth: float) -> float:
    """The seeds' estimate: ``volume * S / B`` (all-reduce ``2S/B``), no latency term."""
    _check_collective(collective)
    if not bandwidth > 0:
        raise ArgumentError(f"bandwidth must be > 0 bytes/s, got {bandwidth!r}")
    return TEXTBOOK_VOLUME[collective] * nbytes / bandwidth


def textbook_bytes(collective: str, nbytes: float) -> float:
    """The seeds' bytes per rank: ``volume * S`` (all-reduce ``2S``)."""
    _check_collective(collective)
    return TEXTBOOK_VOLUME[collective] * nbytes


@dataclass(frozen=True)
class TextbookComparison:
    """Where and by how much the seeds' textbook figure and the model differ.

    ``factors`` multiply together to ``model_seconds / textbook_seconds``; each
    is ``(reason, multiplier)``.
    """

    textbook_seconds: float
    model_seconds: float
    factors: tuple[tuple[str, float], ...]

    @property
    def ratio(self) -> float:
        return self.model_seconds / self.textbook_seconds if self.textbook_seconds else math.inf

    def lines(self) -> list[str]:
        from .units import format_seconds

        out = [f"textbook {format_seconds(self.textbook_seconds)} vs model "
               f"{format_seconds(self.model_seconds)}: {self.ratio:.3g}x"
               + (" because:" if self.factors else "")]
        out += [f"  x{mult:.4g}  {why}" for why, mult in self.factors]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"textbook_seconds": self.textbook_seconds, "model_seconds": self.model_seconds,
                "ratio": self.ratio,
                "factors": [{"reason": why, "factor": mult} for why, mult in self.factors]}


def compare_textbook(*, textbook_seconds: float, textbook_bytes: float, textbook_bandwidth: float,
                     model_seconds: float, beta_seconds: float, alpha_seconds: float,
                     gamma_seconds: float, critical_bytes: float, rounds: int, nranks: int,
                     line_rate: float | None, efficiency: float = 1.0,
                     efficiency_source: str = "", link_name: str = "",
                     headline_bidirectional: bool = False,
                     overhead_seconds: float = 0.0) -> TextbookComparison:
    """Explain ``model_seconds / textbook_seconds`` as a product of named factors.

    ``line_rate`` is the per-direction line rate of the (one-level) link, None
    for two-level predictions.  The factors: direction (the textbook's bandwidth
    over the per-direction rate), efficiency, volume (the schedule's
    critical-path bytes over the textbook's bytes) and latency plus reduction
    (the whole time over its bandwidth term; ``overhead_seconds`` is the
    per-message part of ``alpha_seconds``).  On two levels the first three are
    one: the bandwidth terms, on both links at their achievable rates, over the
    textbook's time (its bytes through one figure, the link between nodes' where
    a group spans them); then latency plus reduction as on one level.
    """
    from .units import format_bandwidth, format_bytes, format_seconds

    factors: list[tuple[str, float]] = []
    if beta_seconds <= 0 or textbook_bytes <= 0 or not textbook_seconds > 0:
        return TextbookComparison(textbook_seconds, model_seconds, ())
    if line_rate is None:
        factors.append((f"two levels of links: the schedules' bandwidth terms, inside and "
                        f"between nodes at each link's achievable rate, take "
                        f"{format_seconds(beta_seconds)}, not the textbook's "
                        f"{format_seconds(textbook_seconds)} for "
                        f"{format_bytes(textbook_bytes)} per rank at "
                        f"{format_bandwidth(textbook_bytes / textbook_seconds)} (the figure of "
                        f"the link between nodes where a group spans them): "
                        f"{beta_seconds / textbook_seconds:.4g}x",
                        beta_seconds / textbook_seconds))
    else:
        factors += _one_level_factors(textbook_bytes, textbook_bandwidth, critical_bytes,
                                      nranks, line_rate, efficiency, efficiency_source,
                                      link_name, headline_bidirectional)
    rest = model_seconds / beta_seconds
    if abs(rest - 1) > 1e-12:
        n_rounds = f"{rounds} round{'' if rounds == 1 else 's'}"
        if overhead_seconds > 0:
            parts = [f"latency: {n_rounds} x alpha + per-message overhead "
                     f"{format_seconds(overhead_seconds)} = {format_seconds(alpha_seconds)}"]
        else:
            parts = [f"latency: {n_rounds} x alpha = {format_seconds(alpha_seconds)}"]
        if gamma_seconds > 0:
            parts.append(f"reduction: {format_seconds(gamma_seconds)}")
        factors.append(("; ".join(parts) + " (the textbook has no latency term)", rest))
    return TextbookComparison(textbook_seconds, model_seconds, tuple(factors))


def _one_level_factors(textbook_bytes: float, textbook_bandwidth: float, critical_bytes: float,
                       nranks: int, line_rate: float, efficiency: float,
                       efficiency_source: str, link_name: str, headline_bidirectional: bool
                       ) -> list[tuple[str, float]]:
    """:func:`compare_textbook`'s factors on one level of links: direction, efficiency and
    volume."""
    from .units import format_bandwidth, format_bytes

    factors: list[tuple[str, float]] = []
    name = link_name or "the link"
    direction = textbook_bandwidth / line_rate
    if abs(direction - 1) > 1e-9:
        if headline_bidirectional and abs(direction - 2) < 0.05:
            why = (f"the textbook divides by {name}'s {format_bandwidth(textbook_bandwidth)}, "
                   f"which counts both directions; per direction it is "
                   f"{format_bandwidth(line_rate)}: {direction:.3g}x slower")
        else:
            why = (f"the textbook divides by {format_bandwidth(textbook_bandwidth)}; "
                   f"{name} moves {format_bandwidth(line_rate)} per direction")
        factors.append((why, direction))
    if abs(efficiency - 1) > 1e-9:
        factors.append((f"collectives reach {efficiency:.3g} of the line rate "
                        f"({efficiency_source or 'preset'}): {1 / efficiency:.3g}x slower",
                        1 / efficiency))
    volume = critical_bytes / textbook_bytes
    if abs(volume - 1) > 1e-9:
        p = nranks
        exact = ""
        for num, den, text in ((p - 1, p, f"(p-1)/p = {p - 1}/{p}"),
                               (2 * (p - 1), p, f"2(p-1)/p = {2 * (p - 1)}/{p}")):
            if abs(volume - num / den) < 1e-6:
                exact = f" = {text}"
        factors.append((f"the schedule moves {format_bytes(critical_bytes)} per rank on its "
                        f"critical path, not the textbook's {format_bytes(textbook_bytes)}"
                        f"{exact}: {volume:.4g}x", volume))
    return factors
