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
``g - 1`` rounds (``pieces`` 1), and the engine's all_reduce replaces the
``2 (G - 1)`` rounds in between, which move the same shard among the same
ranks.  Every rank of a node ends bit-identical (phase 3 copies each shard
from the one rank that reduced it) and the ranks of a rail hold the same
shard after the engine's all_reduce (gloo's ring reduces each block at one
rank and copies it on).  The choice is in the call's descriptor, so ranks
whose settings differ get a MismatchError, not a hang.

Only SUM (and AVG, which the communicator turns into a sum and a division)
on float32, float64, int32 and int64 take this path: what gloo computes there
is what ringlet computes (gloo's MIN and MAX do not propagate NaN as numpy
does, and it lacks several types); everything else keeps the ring.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np

from .executor import Program, compile_program, execute
from .ops import DType, ReduceOp, Reducer
from .schedule import Buf, Kind, Layout, Schedule
from .transport.base import Transport

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


def _sends(rounds: list[list[Any]]) -> int:
    return sum(op.kind is Kind.SEND for ops in rounds for op in ops)


@lru_cache(maxsize=64)
def phases(sched: Schedule, rank: int, m: int, g: int) -> tuple[Program, Program, int, int]:
    """This rank's phase 1 and phase 3 programs of the hierarchical all_reduce ``sched``
    (groups of ``g``, one piece) at unit count ``m``, and the element range of the
    shard its rail all-reduces in between."""
    prog = compile_program(sched, rank, m)
    G = sched.nranks // g
    inner = g - 1
    first, last = prog.rounds[:inner], prog.rounds[inner + 2 * (G - 1):]
    p1 = Program(first, prog.elems, _sends(first), prog.snap_elems, prog.src_first)
    p3 = Program(last, prog.elems, _sends(last), prog.snap_elems, prog.src_first)
    s = (rank % g + 1) % g
    bounds = Layout(g, G).bounds(m)
    return p1, p3, int(bounds[s * G]), int(bounds[(s + 1) * G])


def run(sched: Schedule, rank: int, m: int, g: int, transport: Transport,
        rail: Transport, out: np.ndarray, red: Reducer | None, what: Callable[[], str],
        dt: DType) -> None:
    """Run the hierarchical all_reduce ``sched`` with the engine's all_reduce on ``rail``
    (this rank's rail group) as its inter-node phase; ``out`` is the flat typed vector."""
    p1, p3, lo, hi = phases(sched, rank, m, g)
    bufs = {int(Buf.OUT): out}
    execute(p1, transport, bufs, red, what)
    if hi > lo:
        rail.native("all_reduce", 0, hi - lo, {int(Buf.OUT): out[lo:hi]}, ReduceOp.SUM, what, dt)
    execute(p3, transport, bufs, red, what)
