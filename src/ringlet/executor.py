"""Runs one rank's steps of a schedule on a transport.

A schedule's steps name chunks; :func:`compile_program` turns one rank's
steps, for one unit count ``m``, into element ranges (cached, so a repeated
call costs nothing to plan).  :func:`execute` then runs the rounds: it
queues the round's sends, posts its receives (reducing in place with the
numpy kernels as fragments arrive), performs local copies and reductions in
the order the schedule lists them, and waits for the round to finish.

Order within a round follows the schedule's semantics: a send reads what the
rank held when the round began (if a later write of the same round overlaps
it, the executor sends a snapshot), and writes apply in step order (a
receive that reduces into a region an earlier receive of the round is still
writing waits for it, so reductions happen in the same order on every run).

Reductions compute ``dst = dst (op) src`` with the kernel they are given, or,
for steps marked ``src_first``, ``dst = src (op) dst``: the kernel runs on a
copy of ``src`` in a scratch buffer, which is then copied back.

With ``RINGLET_DEBUG=TRACE`` (the ``ringlet`` logger at DEBUG) every round this
rank runs is logged: its steps' kinds, peers and bytes, and the time it took.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from .schedule import Buf, Kind, Ref, Schedule, Step
from .transport.base import Request, Transport

Range = tuple[int, int, int]   # (buffer, first element, stop element)
Reducer = Callable[[np.ndarray, np.ndarray], None]

log = logging.getLogger("ringlet")


@dataclass
class _Op:
    kind: Kind
    peer: int
    dst: tuple[Range, ...]
    src: tuple[Range, ...]
    src_first: bool = False     # RRED/LRED: dst = src (op) dst
    snapshot: bool = False      # SEND: send a copy taken at the start of the round
    after_recvs: bool = False   # RECV/RRED: wait for the round's earlier receives first


@dataclass
class Program:
    """One rank's steps of one schedule at one unit count, as element ranges."""

    rounds: list[list[_Op]]
    elems: dict[int, int]                       # buffer -> elements it must hold
    messages: int = 0
    snap_elems: int = 0                         # most elements snapshotted in one round
    src_first: bool = False                     # some reduction puts its source first
    _peers: set[int] = field(default_factory=set)


def _ranges(refs: tuple[Ref, ...], bounds: dict[Buf, np.ndarray]) -> tuple[Range, ...]:
    out: list[list[int]] = []
    for b, s, e in refs:
        lo, hi = int(bounds[b][s]), int(bounds[b][e])
        if hi == lo:
            continue
        if out and out[-1][0] == b and out[-1][2] == lo:
            out[-1][2] = hi
        else:
            out.append([int(b), lo, hi])
    return tuple((b, lo, hi) for b, lo, hi in out)


def _overlap(a: tuple[Range, ...], b: tuple[Range, ...]) -> bool:
    return any(x[0] == y[0] and x[1] < y[2] and y[1] < x[2] for x in a for y in b)


@lru_cache(maxsize=256)
def compile_program(schedule: Schedule, rank: int, m: int) -> Program:
    """Element-level plan of ``rank``'s steps for unit count ``m`` (cached)."""
    return compile_bounds(schedule, rank, {b: lay.bounds(m) for b, lay in
                                           schedule.layouts.items()})


def compile_bounds(schedule: Schedule, rank: int, bounds: dict[Buf, np.ndarray]) -> Program:
    """Element-level plan of ``rank``'s steps with each buffer's chunk boundaries given
    (equal blocks: :func:`compile_program`; uneven ones: :mod:`ringlet.uneven`)."""
    return compile_steps(schedule.steps(rank), bounds)


def compile_steps(step_rounds: Sequence[Sequence[Step]], bounds: dict[Buf, np.ndarray]
                  ) -> Program:
    """Element-level plan of rounds of steps (a rank's, or a part of them that its peers
    run as the same part: :mod:`ringlet.rails`), chunk boundaries given per buffer."""
    rounds: list[list[_Op]] = []
    snap = msgs = 0
    for steps in step_rounds:
        ops = [_Op(st.kind, st.peer, _ranges(st.dst, bounds), _ranges(st.src, bounds),
                   st.src_first) for st in steps]
        writes = tuple(r for op in ops if op.kind is not Kind.SEND for r in op.dst)
        recv_dsts: tuple[Range, ...] = ()
        for op in ops:
            if op.kind is Kind.SEND:
                op.snapshot = _overlap(op.src, writes)
                if op.snapshot:
                    snap += sum(hi - lo for _, lo, hi in op.src)
            elif op.kind in (Kind.RECV, Kind.RRED):
                op.after_recvs = _overlap(op.dst, recv_dsts)
                recv_dsts += op.dst
        # a message of zero elements is never sent (both sides agree it is empty)
        ops = [op for op in ops if (op.src if op.kind is Kind.SEND else op.dst)]
        msgs += sum(op.kind is Kind.SEND for op in ops)
        rounds.append(ops)
    elems = {int(b): int(bd[-1]) for b, bd in bounds.items()}
    first = any(op.src_first for ops in rounds for op in ops)
    return Program(rounds, elems, msgs, snap, first)


def writes(program: Program) -> tuple[Range, ...]:
    """The element ranges ``program`` writes (its receives' and local steps'
    destinations), merged and in order."""
    spans = sorted(r for ops in program.rounds for op in ops if op.kind is not Kind.SEND
                   for r in op.dst)
    out: list[list[int]] = []
    for b, lo, hi in spans:
        if out and out[-1][0] == b and lo <= out[-1][2]:
            out[-1][2] = max(out[-1][2], hi)
        else:
            out.append([b, lo, hi])
    return tuple((b, lo, hi) for b, lo, hi in out)


class SrcFirst:
    """``dst = src (op) dst`` from an in-place kernel ``reduce(dst, src)`` (``dst = dst
    (op) src``): the kernel runs on a copy of ``src`` in a scratch buffer, which is
    then copied back.

    It makes exactly one kernel call, over the whole range, as the partner's
    ``reduce(dst, src)`` on the swapped operands does: numpy's and torch's kernels
    treat an element differently by its place in the call (SIMD body, scalar
    tail, short-call path, each thread's share), so the same operands only give
    the same bits in calls of the same shape.  The scratch grows to the largest
    range it is given and is kept for the rest of the collective call: one
    allocation per call, none per step.
    """

    def __init__(self, reduce: Reducer) -> None:
        self.reduce = reduce
        self.scratch = np.empty(0, np.uint8)

    def __call__(self, dst: np.ndarray, src: np.ndarray) -> None:
        if self.scratch.size < dst.nbytes:
            self.scratch = np.empty(dst.nbytes, np.uint8)
        t = self.scratch[:dst.nbytes].view(dst.dtype)
        t[...] = src
        self.reduce(t, dst)
        dst[...] = t


def execute(program: Program, transport: Transport, bufs: dict[int, np.ndarray],
            reduce: Reducer | None, what: Callable[[], str]) -> None:
    """Run ``program`` on ``transport`` over the flat typed buffers ``bufs``."""
    round_no = 0
    first = SrcFirst(reduce) if program.src_first and reduce is not None else None
    trace = log.isEnabledFor(logging.DEBUG)
    t0 = 0.0

    def describe() -> str:
        return f"{what()}, round {round_no}"

    for round_no, ops in enumerate(program.rounds):  # noqa: B007 - read by describe()
        if not ops:
            continue
        if trace:
            t0 = time.perf_counter()
        reqs: list[Request] = []
        recvs: list[Request] = []
        for op in ops:
            if op.kind is Kind.SEND:
                parts = [bufs[b][lo:hi] for b, lo, hi in op.src]
                if op.snapshot:
                    parts = [p.copy() for p in parts]
                reqs.append(transport.isend(op.peer, [p.view(np.uint8) for p in parts]))
            elif op.kind in (Kind.RECV, Kind.RRED):
                if op.after_recvs:
                    transport.wait(recvs, describe)
                kernel = None if op.kind is Kind.RECV else first if op.src_first else reduce
                r = transport.irecv(op.peer, [bufs[b][lo:hi] for b, lo, hi in op.dst], kernel)
                recvs.append(r)
                reqs.append(r)
            else:
                transport.wait(recvs, describe)
                srcs = [bufs[b][lo:hi] for b, lo, hi in op.src]
                dsts = [bufs[b][lo:hi] for b, lo, hi in op.dst]
                _local(op.kind, dsts, srcs, first if op.src_first else reduce)
        transport.wait(reqs, describe)
        if trace:
            _trace(transport.rank, describe(), ops, bufs, time.perf_counter() - t0)


_VERB = {Kind.SEND: "send", Kind.RECV: "recv", Kind.RRED: "recv+reduce", Kind.COPY: "copy",
         Kind.LRED: "reduce"}


def _trace(rank: int, where: str, ops: list[_Op], bufs: dict[int, np.ndarray],
           seconds: float) -> None:
    """One TRACE line for a round this rank ran: each step's kind, peer and bytes.  The
    record also carries the round as data, ``record.round``: ``{"peers": [...], "sent":
    bytes sent, "seconds": ...}`` (``benchmarks/multihost.py`` reads it)."""
    items = []
    peers: list[int] = []
    sent = 0
    for op in ops:
        refs = op.src if op.kind is Kind.SEND else op.dst
        nbytes = sum((hi - lo) * bufs[b].itemsize for b, lo, hi in refs)
        arrow = f" -> {op.peer}" if op.kind is Kind.SEND else \
            f" <- {op.peer}" if op.peer >= 0 else ""
        if op.peer >= 0:
            peers.append(op.peer)
        if op.kind is Kind.SEND:
            sent += nbytes
        first = ", src first" if op.src_first else ""
        items.append(f"{_VERB[op.kind]} {nbytes} B{arrow}{first}")
    log.debug("rank %d: %s: %s; %.1f us", rank, where, ", ".join(items), seconds * 1e6,
              extra={"round": {"peers": peers, "sent": sent, "seconds": seconds}})


def _local(kind: Kind, dsts: list[np.ndarray], srcs: list[np.ndarray],
           reduce: Reducer | None) -> None:
    """COPY or LRED between equal-length lists of ranges (they may split differently)."""
    src = srcs[0] if len(srcs) == 1 else np.concatenate(srcs)
    pos = 0
    for d in dsts:
        piece = src[pos:pos + d.size]
        if kind is Kind.COPY:
            d[...] = piece
        else:
            if reduce is None:
                raise TypeError("a local reduction needs a reduce kernel")
            reduce(d, piece)
        pos += d.size
