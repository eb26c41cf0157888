"""The schedule IR: an algorithm is data.

A :class:`Schedule` says, for one collective on ``nranks`` ranks, what each
rank does in each round: send chunks to a peer, receive chunks (overwriting,
or reducing into what it holds), or copy/reduce chunks locally.  The same
schedule is executed for real (:mod:`ringlet.executor`), checked symbolically
(:mod:`ringlet.verify`), counted into alpha-beta-gamma terms (:meth:`Schedule.counts`),
and drawn (:mod:`ringlet.show`).

Buffers and chunks
------------------
Each rank has up to three buffers: ``IN`` (read only), ``OUT`` and ``TMP``
(scratch).  A buffer holds ``scale * m`` elements, where ``m`` is the
collective's unit count (see :data:`UNIT`), and is cut into ``blocks`` blocks
and each block into ``pieces`` pieces, both as even as possible (sizes
differ by at most one element).  Chunk ``c`` is piece ``c % pieces`` of
block ``c // pieces``.  A step names chunk ranges ``(buf, start, stop)``.

Round semantics
---------------
Within a round a rank's sends read what it held at the start of the round;
receives, copies and reductions are applied in the order the steps are
listed.  Between a pair of ranks, the k-th send of a round matches the k-th
receive of that round.

Operand order
-------------
A reduction writes ``dst = dst (op) src`` (``src`` being the received data of
a ``RRED`` step), or, when the step's ``src_first`` is set, ``dst = src (op)
dst``.  The operators commute mathematically but not bit for bit: MIN/MAX of
+0.0 and -0.0, and any op on two NaNs with different payloads, depend on the
order.  So when two ranks compute the same reduced chunk (recursive doubling's
partners do), they must compute the same expression, and the flag lets a
schedule say which operand goes on the left.  Rounds are a logical clock for verification and cost;
the executor runs them as a data flow, and ranks need not be in the same
round at the same time.

Scale
-----
``Schedule.steps(rank)`` builds one rank's steps without building the
others', which is all the executor needs.  ``Schedule.round_arrays(i)``
gives one round of the whole job as vectors for the simulator and the cost
model; families may override it with a closed form.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .errors import ArgumentError


class Buf(enum.IntEnum):
    IN = 0
    OUT = 1
    TMP = 2


class Kind(enum.IntEnum):
    SEND = 0   # send src chunks to peer
    RECV = 1   # receive from peer into dst chunks (overwrite)
    RRED = 2   # receive from peer and reduce into dst chunks: dst = dst (op) received
    COPY = 3   # local: dst chunks = src chunks
    LRED = 4   # local: dst chunks = dst (op) src chunks
    # (RRED and LRED with src_first: dst = received (op) dst, dst = src (op) dst)


Ref = tuple[Buf, int, int]   # (buffer, first chunk, stop chunk)


@dataclass(frozen=True, slots=True)
class Step:
    kind: Kind
    peer: int                  # -1 for local steps
    dst: tuple[Ref, ...] = ()  # chunks written (RECV, RRED, COPY, LRED)
    src: tuple[Ref, ...] = ()  # chunks read (SEND, COPY, LRED)
    src_first: bool = False    # RRED/LRED: dst = src (op) dst, not dst (op) src

    def __str__(self) -> str:
        def refs(rs: tuple[Ref, ...]) -> str:
            return "+".join(f"{b.name}[{s}]" if e == s + 1 else f"{b.name}[{s}:{e}]"
                            for b, s, e in rs)
        if self.kind is Kind.SEND:
            return f"send {refs(self.src)} -> {self.peer}"
        if self.kind is Kind.RECV:
            return f"recv {refs(self.dst)} <- {self.peer}"
        if self.kind is Kind.RRED:
            first = ", received first" if self.src_first else ""
            return f"recv+reduce {refs(self.dst)} <- {self.peer}{first}"
        if self.kind is Kind.LRED and self.src_first:
            return f"reduce {refs(self.dst)} <- {refs(self.src)}, src first"
        verb = "copy" if self.kind is Kind.COPY else "reduce"
        return f"{verb} {refs(self.dst)} <- {refs(self.src)}"


def _refs(refs: Sequence[Ref | tuple[Buf, int]]) -> tuple[Ref, ...]:
    out = []
    for r in refs:
        # (schedules build millions of these: skip the conversions when types are right)
        b = r[0] if type(r[0]) is Buf else Buf(r[0])
        s = r[1] if type(r[1]) is int else int(r[1])
        if len(r) == 2:
            out.append((b, s, s + 1))
        else:
            e = r[2]
            out.append((b, s, e if type(e) is int else int(e)))
    return tuple(out)


def send(peer: int, *src: Ref | tuple[Buf, int]) -> Step:
    return Step(Kind.SEND, int(peer), (), _refs(src))


def recv(peer: int, *dst: Ref | tuple[Buf, int]) -> Step:
    return Step(Kind.RECV, int(peer), _refs(dst), ())


def recv_reduce(peer: int, *dst: Ref | tuple[Buf, int], src_first: bool = False) -> Step:
    """Receive from ``peer`` and reduce into ``dst``: ``dst = dst (op) received``, or
    ``received (op) dst`` with ``src_first``."""
    return Step(Kind.RRED, int(peer), _refs(dst), (), bool(src_first))


def copy(dst: Sequence[Ref | tuple[Buf, int]], src: Sequence[Ref | tuple[Buf, int]]) -> Step:
    return Step(Kind.COPY, -1, _refs(dst), _refs(src))


def local_reduce(dst: Sequence[Ref | tuple[Buf, int]],
                 src: Sequence[Ref | tuple[Buf, int]], src_first: bool = False) -> Step:
    """``dst = dst (op) src``, or ``src (op) dst`` with ``src_first``."""
    return Step(Kind.LRED, -1, _refs(dst), _refs(src), bool(src_first))


# --- buffers -----------------------------------------------------------------

#: What the unit count ``m`` is for each collective, and each buffer's scale.
#: ``IN``/``OUT`` of a collective hold ``scale * m`` elements.
COLLECTIVES: dict[str, dict[Buf, int | str]] = {
    # all_reduce and broadcast work in OUT only (the communicator copies IN to OUT first).
    "all_reduce": {Buf.OUT: 1},
    "broadcast": {Buf.OUT: 1},
    "reduce": {Buf.IN: 1, Buf.OUT: 1},
    "all_gather": {Buf.IN: 1, Buf.OUT: "N"},
    "reduce_scatter": {Buf.IN: "N", Buf.OUT: 1},
    "all_to_all": {Buf.IN: "N", Buf.OUT: "N"},
    "scatter": {Buf.IN: "N", Buf.OUT: 1},
    "gather": {Buf.IN: 1, Buf.OUT: "N"},
    # prefix reductions work in OUT (the communicator copies IN to OUT first)
    "scan": {Buf.OUT: 1},
    "exscan": {Buf.OUT: 1},
}

#: The unit count m, in words, for docs and diagrams.
UNIT = {
    "all_reduce": "elements of the vector", "broadcast": "elements of the vector",
    "reduce": "elements of the vector", "all_gather": "elements each rank contributes",
    "reduce_scatter": "elements each rank ends with", "all_to_all": "elements per block",
    "scatter": "elements each rank receives", "gather": "elements each rank sends",
    "scan": "elements of the vector", "exscan": "elements of the vector",
}

ROOTED = frozenset({"broadcast", "reduce", "scatter", "gather"})


def check_root(collective: str, root: int) -> None:
    """An :class:`ArgumentError` for a ``--root`` other than 0 given with a collective
    that has no root (it would be ignored); an uneven one (gather_v) has its even one's."""
    even = collective[:-2] if collective.endswith("_v") else collective
    if root and even not in ROOTED:
        raise ArgumentError(f"--root {root}: {collective} has no root; only "
                            f"{', '.join(sorted(ROOTED))} (and gather_v, scatter_v) do")


REDUCING = frozenset({"all_reduce", "reduce", "reduce_scatter", "scan", "exscan"})


@dataclass(frozen=True)
class Layout:
    """A buffer of ``scale * m`` elements cut into ``blocks`` x ``pieces`` chunks."""

    blocks: int
    pieces: int = 1
    scale: int = 1

    @property
    def nchunks(self) -> int:
        return self.blocks * self.pieces

    def bounds(self, m: int) -> np.ndarray:
        """Element offsets of every chunk boundary (length nchunks + 1) for unit count m."""
        total = self.scale * m
        b = np.arange(self.blocks + 1, dtype=np.int64)
        base, rem = divmod(total, self.blocks)
        block_lo = b * base + np.minimum(b, rem)
        sizes = np.diff(block_lo)
        p = np.arange(self.pieces, dtype=np.int64)
        pb, pr = np.divmod(sizes[:, None], self.pieces)
        starts = block_lo[:-1, None] + p[None, :] * pb + np.minimum(p[None, :], pr)
        return np.append(starts.ravel(), total)


@dataclass
class Counts:
    """Alpha-beta-gamma counts of a schedule at one size (see :meth:`Schedule.counts`)."""

    rounds: int                  # rounds with at least one message: the alpha term
    sent: np.ndarray             # bytes sent, per rank
    received: np.ndarray         # bytes received, per rank
    reduced: np.ndarray          # bytes reduced (received-and-reduced plus local), per rank
    messages: np.ndarray         # messages sent, per rank
    round_sent: np.ndarray       # per round: the most bytes any rank sends in it
    round_received: np.ndarray   # per round: the most bytes any rank receives in it
    round_reduced: np.ndarray    # per round: the most bytes any rank reduces in it


@dataclass(eq=False)
class Schedule:
    """One algorithm for one collective on ``nranks`` ranks (see the module docs)."""

    collective: str
    algorithm: str
    nranks: int
    nrounds: int
    layouts: dict[Buf, Layout]
    rank_fn: Callable[[int], list[list[Step]]] = field(repr=False)
    root: int = 0
    params: dict[str, int] = field(default_factory=dict)
    _cache: dict[int, list[list[Step]]] = field(default_factory=dict, repr=False)
    #: The closed form of :meth:`round_arrays` (round -> message vectors), if the family
    #: has one; without it every rank's steps are built.
    round_fn: Callable[[int], dict[str, np.ndarray]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.collective not in COLLECTIVES:
            raise ArgumentError(f"unknown collective {self.collective!r}")
        for buf, scale in COLLECTIVES[self.collective].items():
            want = self.nranks if scale == "N" else 1
            lay = self.layouts.get(buf)
            if lay is None or lay.scale != want:
                raise ArgumentError(
                    f"{self.algorithm}: {self.collective} needs a {buf.name} layout of "
                    f"scale {want}, got {lay}")
            if scale == "N" and lay.blocks != self.nranks:
                raise ArgumentError(
                    f"{self.algorithm}: {buf.name} of {self.collective} must have one block "
                    f"per rank ({self.nranks}), got {lay.blocks}")

    @property
    def pieces(self) -> int:
        """Pieces per block of the collective's own buffers (the pipelining depth)."""
        return self.layouts[Buf.OUT].pieces

    def steps(self, rank: int) -> list[list[Step]]:
        """This rank's steps, one list per round (built once, then cached)."""
        got = self._cache.get(rank)
        if got is None:
            if not 0 <= rank < self.nranks:
                raise ArgumentError(f"rank {rank} is out of range for {self.nranks} ranks")
            got = self.rank_fn(rank)
            if len(got) != self.nrounds:
                raise ArgumentError(
                    f"{self.algorithm}: rank {rank} has {len(got)} rounds, "
                    f"schedule says {self.nrounds}")
            self._cache[rank] = got
        return got

    def all_steps(self) -> list[list[list[Step]]]:
        return [self.steps(r) for r in range(self.nranks)]

    @cached_property
    def name(self) -> str:
        return f"{self.collective}/{self.algorithm}(n={self.nranks})"

    def round_arrays(self, i: int) -> dict[str, np.ndarray]:
        """Every message of round ``i`` as vectors: ``src``, ``dst``, ``chunks``, ``reduce``.

        ``chunks`` is the number of chunks a message carries (every chunk of a
        schedule holds the same share of the data, ``scale / nchunks`` of a
        buffer's unit count: see :meth:`chunk_elements`); ``reduce`` says whether
        the receiver reduces it into what it holds.  An optional ``local``
        vector (one entry per rank) counts the chunks each rank reduces locally
        (``LRED`` steps) in the round; it is left out when there are none.  From
        the family's closed
        form (:attr:`round_fn`: no rank's steps are built, so it serves 16,384
        ranks) or, without one, from every rank's steps
        (:meth:`round_arrays_stepwise`).  The order of the messages is unspecified.
        """
        if self.round_fn is None:
            return self.round_arrays_stepwise(i)
        if not 0 <= i < self.nrounds:
            raise ArgumentError(f"{self.name}: round {i} is out of range (0..{self.nrounds - 1})")
        return self.round_fn(i)

    def chunk_elements(self, m: float) -> float:
        """The elements one chunk holds at unit count ``m`` (on average: chunks of one
        buffer differ by at most one element)."""
        lay = self.layouts[Buf.OUT]
        return lay.scale * m / lay.nchunks

    def round_arrays_stepwise(self, i: int) -> dict[str, np.ndarray]:
        """:meth:`round_arrays` built from every rank's steps (the reference the closed
        forms are tested against; slow at scale)."""
        src, dst, nch, red = [], [], [], []
        recv_kinds: dict[tuple[int, int], list[bool]] = {}
        local = np.zeros(self.nranks, np.int64)
        for r in range(self.nranks):
            for st in self.steps(r)[i]:
                if st.kind in (Kind.RECV, Kind.RRED):
                    recv_kinds.setdefault((st.peer, r), []).append(st.kind is Kind.RRED)
                elif st.kind is Kind.LRED:
                    local[r] += sum(e - s for _, s, e in st.dst)
        seen: dict[tuple[int, int], int] = {}
        for r in range(self.nranks):
            for st in self.steps(r)[i]:
                if st.kind is Kind.SEND:
                    k = seen.get((r, st.peer), 0)
                    seen[(r, st.peer)] = k + 1
                    kinds = recv_kinds.get((r, st.peer), [])
                    src.append(r)
                    dst.append(st.peer)
                    nch.append(sum(e - s for _, s, e in st.src))
                    red.append(kinds[k] if k < len(kinds) else False)
        out = {"src": np.array(src, np.int64), "dst": np.array(dst, np.int64),
               "chunks": np.array(nch, np.int64), "reduce": np.array(red, bool)}
        if local.any():
            out["local"] = local
        return out

    def counts(self, m: int, itemsize: int = 1) -> Counts:
        """Count rounds, bytes sent/received/reduced for unit count ``m``.

        Exact for these chunk sizes: it walks every rank's steps.
        """
        n, R = self.nranks, self.nrounds
        bounds = {b: lay.bounds(m) for b, lay in self.layouts.items()}

        def nbytes(refs: tuple[Ref, ...]) -> int:
            return sum(int(bounds[b][e] - bounds[b][s]) for b, s, e in refs) * itemsize

        sent = np.zeros((n, R), np.int64)
        recvd = np.zeros((n, R), np.int64)
        red = np.zeros((n, R), np.int64)
        msgs = np.zeros(n, np.int64)
        for r in range(n):
            for i, rnd in enumerate(self.steps(r)):
                for st in rnd:
                    if st.kind is Kind.SEND:
                        sent[r, i] += nbytes(st.src)
                        msgs[r] += 1
                    elif st.kind in (Kind.RECV, Kind.RRED):
                        b = nbytes(st.dst)
                        recvd[r, i] += b
                        if st.kind is Kind.RRED:
                            red[r, i] += b
                    elif st.kind is Kind.LRED:
                        red[r, i] += nbytes(st.dst)
        active = (sent.sum(axis=0) + recvd.sum(axis=0)) > 0
        return Counts(
            rounds=int(active.sum()), sent=sent.sum(axis=1), received=recvd.sum(axis=1),
            reduced=red.sum(axis=1), messages=msgs,
            round_sent=sent.max(axis=0) if n else np.zeros(R, np.int64),
            round_received=recvd.max(axis=0) if n else np.zeros(R, np.int64),
            round_reduced=red.max(axis=0) if n else np.zeros(R, np.int64))


def empty_rounds(nrounds: int) -> list[list[Step]]:
    return [[] for _ in range(nrounds)]
