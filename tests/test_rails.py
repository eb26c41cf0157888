"""The two-level all_reduce's phases around the engine's all_reduce (ringlet.rails): pure."""

from __future__ import annotations

import numpy as np
import pytest

from ringlet import rails
from ringlet.algorithms import build
from ringlet.errors import ConfigError
from ringlet.ops import DTYPES, ReduceOp
from ringlet.schedule import Kind


@pytest.mark.parametrize("mode,engine,native,op,dtype,want", [
    ("auto", "torch", True, ReduceOp.SUM, "float32", True),
    ("auto", "torch", True, ReduceOp.AVG, "float64", True),
    ("auto", "torch", True, ReduceOp.SUM, "int32", True),
    ("auto", "mpi", True, ReduceOp.SUM, "float32", False),     # MPI: ringlet's ring
    ("native", "mpi", True, ReduceOp.SUM, "int64", True),
    ("ring", "torch", True, ReduceOp.SUM, "float32", False),
    ("native", "torch", True, ReduceOp.MAX, "float32", False),  # gloo's MAX drops NaN
    ("native", "torch", True, ReduceOp.SUM, "float16", False),
    ("native", "torch", True, ReduceOp.PROD, "float32", False),
    ("native", None, False, ReduceOp.SUM, "float32", False),    # no engine
    ("native", "torch", False, ReduceOp.SUM, "float32", False),
])
def test_wanted(mode: str, engine: str | None, native: bool, op: ReduceOp, dtype: str,
                want: bool) -> None:
    assert rails.wanted(mode, engine, native, op, DTYPES[dtype]) is want


def test_only_a_transport_across_nodes_has_rails() -> None:
    """The communicator asks ``caps.rails`` before it asks for a rail; a transport
    without nodes says why it has none."""
    from ringlet.transport.base import Transport
    from ringlet.transport.mpi import MpiTransport
    from ringlet.transport.routed import RoutedTransport
    from ringlet.transport.shm import ShmTransport
    from ringlet.transport.torch import TorchTransport

    assert not any(t.caps.rails for t in (ShmTransport, MpiTransport, TorchTransport))
    assert "rail" in RoutedTransport.__dict__
    with pytest.raises(ConfigError, match="no nodes, so no rails"):
        Transport.rail(object(), 2)  # type: ignore[arg-type]


@pytest.mark.parametrize("n,g", [(4, 2), (6, 2), (6, 3), (8, 4), (9, 3), (8, 1), (4, 4)])
@pytest.mark.parametrize("m", [1, 5, 1001])
def test_phases_stay_in_the_node_and_rails_hold_one_shard(n: int, g: int, m: int) -> None:
    sched = build("all_reduce", "hierarchical", n, 0, group=g)
    shards = {}
    for r in range(n):
        p1, p3, lo, hi = rails.phases(sched, r, m, g)
        for prog in (p1, p3):
            for ops in prog.rounds:
                for op in ops:
                    if op.kind in (Kind.SEND, Kind.RECV, Kind.RRED):
                        assert op.peer // g == r // g, (r, op.peer)   # inside the node
        assert len(p1.rounds) == len(p3.rounds) == g - 1
        for prog in (p1, p3):
            assert prog.messages == sum(op.kind is Kind.SEND for ops in prog.rounds
                                        for op in ops)
        # every rank of a rail holds the same shard: its local rank's
        shards.setdefault(r % g, set()).add((lo, hi))
        # phase 1 ends with this rank's shard reduced over the node: its last receive
        # reduces into [lo, hi), and phase 3's first send sends it
        if g > 1 and hi > lo:
            last = [op for op in p1.rounds[-1] if op.kind is Kind.RRED]
            first = [op for op in p3.rounds[0] if op.kind is Kind.SEND]
            assert [(a, b) for _, a, b in last[0].dst] == [(lo, hi)]
            assert [(a, b) for _, a, b in first[0].src] == [(lo, hi)]
    assert all(len(s) == 1 for s in shards.values())
    cuts = sorted(next(iter(s)) for s in shards.values())
    edges = np.array(cuts).ravel()
    assert edges[0] == 0 and edges[-1] == m and all(edges[1:-1:2] == edges[2::2])
