"""Two-level all_reduce whose inter-node phase is the engine's own all_reduce ("native rails").

``hierarchical`` all_reduce (:mod:`ringlet.algorithms.hierarchical`) runs three
phases: a ring reduce-scatter inside each node (shared memory), an
all-reduce across nodes of each local rank's shard among the ranks that hold
the same shard (its *rail*: local rank i of every node), and a ring
all-gather inside each node.  Phase 2 is a ring over the engine's
point-to-point messages.  On torch.distributed's gloo those cost more than
gloo's own collectives move the same bytes in (a gloo ``Work`` cannot be
polled, so every message is reported by a lane thread, and four ranks on two
cores wait for each other's threads): at 64 MiB over a 1 Gbit/s link phase 2
took 789 ms as ringlet's ring and 565 ms as gloo's allreduce on the same pairs
(``benchmarks/MULTIHOST.md``).  So with ``rails`` (``RINGLET_RAILS``) at
``auto`` on the torch engine, or ``native`` on any engine, phase 2 is the
engine's all_reduce on a group per rail; phases 1 and 3 are the schedule's
own rounds, run by the step executor as always.

The schedule is unchanged: phases 1 and 3 are its first ``g - 1`` and last
``g - 1`` rounds, and the engine's all_reduce replaces the ``2 (G - 1)``
rounds in between, which move the same shard among the same ranks.
``hierarchical_pipelined`` runs the same way piece by piece (:func:`run`):
each piece's engine all_reduce is started without waiting, so it crosses
the network while the next piece is reduced inside the node and earlier
pieces are gathered there (the torch engine's gloo moves it on its own
threads); the automatic choice takes it across nodes from two pieces
(:func:`ringlet.algorithms.select.multinode`).  gloo runs two of the calls in
flight at once, on its two threads, so two pieces share the link.  One piece
on a rail at a time, the next started when it ended, was tried and not kept:
at 4 MiB over 1 Gbit/s it ended the first piece at 21 ms into the call
instead of 32.5 ms, but the call took as long (40.5-43.6 ms against
42.0-43.2), and at 16 MiB (8 pieces) it was slower, 155-168 ms against
150-153 (``benchmarks/rails_timeline.py``): each call's start and its
reduction between gloo's two halves leave the link idle unless another
call fills it.

Every rank of a node ends bit-identical (phase 3 copies each shard from the
one rank that reduced it) and the ranks of a rail hold the same
shard after the engine's all_reduce (gloo's ring reduces each block at one
rank and copies it on).  The choice is in the call's descriptor, so ranks
whose settings differ get a MismatchError, not a hang.

Only SUM (and AVG, which the communicator turns into a sum and a division)
on float32, float64, int32 and int64 take this path: what gloo computes there
is what ringlet computes (gloo's MIN and MAX do not propagate NaN as numpy
does, and it lacks several types); everything else keeps the ring.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import lru_cache

import numpy as np

from .executor import Program, compile_steps, execute, log, writes
from .ops import DType, ReduceOp, Reducer
from .schedule import Buf, Schedule, Step
from .transport.base import NativeCall, Transport

#: the two-level all_reduce schedules whose inter-node phase the rails can run
SCHEDULES = frozenset({"hierarchical", "hierarchical_pipelined"})
#: element types and ops whose gloo all_reduce equals ringlet's (see the module docs)
RAIL_DTYPES = frozenset({"float32", "float64", "int32", "int64"})
RAIL_OPS = frozenset({ReduceOp.SUM, ReduceOp.AVG})


def wanted(mode: str, engine: str | None, native: bool, op: ReduceOp | None,
           dt: DType) -> bool:
    """Whether a two-level all_reduce runs its inter-node phase on the engine's own
    all_reduce: ``mode`` is the ``rails`` setting; ``engine`` and ``native`` the
    transport's capabilities (every rank computes the same answer from agreed
    arguments and settings, and the descriptor carries it)."""
    if mode == "ring" or not native or engine is None or op not in RAIL_OPS \
            or dt.name not in RAIL_DTYPES:
        return False
    return mode == "native" or engine == "torch"


@lru_cache(maxsize=64)
def phases(sched: Schedule, rank: int, m: int, g: int
           ) -> tuple[tuple[Program, Program, int, int], ...]:
    """This rank's parts of the two-level all_reduce ``sched`` (``hierarchical`` or
    ``hierarchical_pipelined``, groups of ``g``) at unit count ``m``: per piece, its
    phase 1 and phase 3 programs and the element range of the shard's piece its rail
    all-reduces in between.

    A piece's steps are the ones on its chunks (chunk ``c`` of the layout's ``g`` x
    ``P G`` is in piece ``(c mod P G) // G``); its rounds come in the schedule's order,
    ``g - 1`` of phase 1, ``2 (G - 1)`` across groups (left out), ``g - 1`` of phase 3.
    Every rank of a group cuts its steps the same way, so the messages of a part are
    exactly those its peers' same part sends and receives."""
    lay = sched.layouts[Buf.OUT]
    G = sched.nranks // g
    P = lay.pieces // G
    inner = g - 1
    parts: list[list[list[Step]]] = [[] for _ in range(P)]
    for steps in sched.steps(rank):
        here: dict[int, list[Step]] = {}
        for st in steps:
            _, c, _ = (st.src or st.dst)[0]
            here.setdefault(c % lay.pieces // G, []).append(st)
        for p, got in here.items():
            parts[p].append(got)
    bounds = {Buf.OUT: lay.bounds(m)}
    s = (rank % g + 1) % g
    out = []
    for p, rounds in enumerate(parts):
        if len(rounds) != 2 * inner + 2 * (G - 1):
            raise AssertionError(f"{sched.algorithm}: piece {p} has {len(rounds)} rounds")
        first = s * lay.pieces + p * G
        out.append((compile_steps(rounds[:inner], bounds),
                    compile_steps(rounds[len(rounds) - inner:], bounds),
                    int(bounds[Buf.OUT][first]), int(bounds[Buf.OUT][first + G])))
    return tuple(out)


def run(sched: Schedule, rank: int, m: int, g: int, transport: Transport,
        rail_of: Callable[[], Transport], out: np.ndarray, red: Reducer | None,
        what: Callable[[], str], dt: DType, agreed: Callable[[], None] | None = None
        ) -> None:
    """Run the two-level all_reduce ``sched`` with the engine's all_reduce on this rank's
    rail group (``rail_of()``, built on first use with the rail's ranks on the other
    nodes, so only once the call is agreed) as its inter-node phase; ``out`` is the flat
    typed vector.

    Piece by piece: phase 1 inside the group, then the piece's engine all_reduce is
    started and left in flight (the engine's threads move it) while the next piece's
    phase 1 runs; then each piece's all_reduce is waited for and its phase 3 run, which
    overlaps the later pieces' time on the network.

    ``agreed`` finishes the call's agreement with the other nodes (the communicator's
    ``_agreed``: its node agreed before the call started).  It runs after the first
    piece's phase 1, which needs only the node, and before anything leaves the node,
    so that the other nodes' descriptors cross the network while phase 1 runs; if it
    raises, what phase 1 wrote into ``out`` is put back first (a mismatch leaves the
    vector of an in-place call as it was)."""
    bufs = {int(Buf.OUT): out}
    parts = phases(sched, rank, m, g)
    started: list[NativeCall] = []
    rail: Transport | None = None
    trace = log.isEnabledFor(logging.DEBUG)
    begun: list[float] = []

    def phase(p: int, which: str) -> Callable[[], str]:
        """``what``, and under RINGLET_DEBUG=TRACE which piece and phase a round is of"""
        return (lambda: f"{what()}, piece {p + 1} of {len(parts)}, {which}") if trace else what

    try:
        for p, (p1, _, lo, hi) in enumerate(parts):
            w1 = phase(p, "inside the node (reduce-scatter)")
            if agreed is not None:
                kept = [(a, b, out[a:b].copy()) for _, a, b in writes(p1)]
                execute(p1, transport, bufs, red, w1)
                try:
                    agreed()
                except BaseException:
                    for a, b, old in kept:
                        out[a:b] = old
                    raise
                agreed = None
            else:
                execute(p1, transport, bufs, red, w1)
            if rail is None:
                rail = rail_of()
            begun.append(time.perf_counter())
            started.append(rail.native_start("all_reduce", 0, hi - lo,
                                              {int(Buf.OUT): out[lo:hi]}, ReduceOp.SUM,
                                              what, dt))
        for p, ((_, p3, lo, hi), call) in enumerate(zip(parts, started, strict=True)):
            call.wait()
            if trace and rail is not None:
                _trace_rail(rank, phase(p, "across the nodes")(), rank % g, g, rail.size,
                            (hi - lo) * out.itemsize, time.perf_counter() - begun[p])
            execute(p3, transport, bufs, red, phase(p, "inside the node (all-gather)"))
    except BaseException:
        for call in started:
            call.abandon()
        raise


def _trace_rail(rank: int, where: str, local: int, g: int, members: int, nbytes: int,
                seconds: float) -> None:
    """The TRACE line of a piece's inter-node phase: the engine's all_reduce on this rank's
    rail, from its start (before the next piece's phase 1) to its end as this rank saw it.
    Its record carries it as data too, ``record.rail``, not as ``record.round``: the
    engine's rounds are its own."""
    peers = [q * g + local for q in range(members) if q * g + local != rank]
    log.debug("rank %d: %s: the engine's all_reduce of %d B with ranks %s (this rank's "
              "rail); %.1f us from its start", rank, where, nbytes, peers, seconds * 1e6,
              extra={"rail": {"peers": peers, "bytes": nbytes, "seconds": seconds}})
