"""The two-level all_reduce's phases around the engine's all_reduce (ringlet.rails): pure."""

from __future__ import annotations

import numpy as np
import pytest

from ringlet import rails
from ringlet.algorithms import build
from ringlet.errors import ConfigError
from ringlet.ops import DTYPES, ReduceOp
from ringlet.schedule import Kind

pytestmark = pytest.mark.one_process   # tests/conftest.py


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
@pytest.mark.parametrize("name,pieces", [("hierarchical", 1), ("hierarchical_pipelined", 1),
                                         ("hierarchical_pipelined", 2),
                                         ("hierarchical_pipelined", 4)])
def test_phases_stay_in_the_node_and_rails_hold_one_shard(n: int, g: int, m: int, name: str,
                                                          pieces: int) -> None:
    sched = build("all_reduce", name, n, 0, group=g, pieces=pieces)
    shards: dict[int, set[tuple[int, int]]] = {}
    for r in range(n):
        parts = rails.phases(sched, r, m, g)
        assert len(parts) == pieces
        for piece, (p1, p3, lo, hi) in enumerate(parts):
            for prog in (p1, p3):
                for ops in prog.rounds:
                    for op in ops:
                        if op.kind in (Kind.SEND, Kind.RECV, Kind.RRED):
                            assert op.peer // g == r // g, (r, op.peer)   # inside the node
            assert len(p1.rounds) == len(p3.rounds) == g - 1
            for prog in (p1, p3):
                assert prog.messages == sum(op.kind is Kind.SEND for ops in prog.rounds
                                            for op in ops)
            # every rank of a rail holds the same shard's piece: its local rank's
            shards.setdefault(r % g * pieces + piece, set()).add((lo, hi))
            # phase 1 ends with this rank's piece of its shard reduced over the node: its
            # last receive reduces into [lo, hi), and phase 3's first send sends it
            if g > 1 and hi > lo:
                last = [op for op in p1.rounds[-1] if op.kind is Kind.RRED]
                first = [op for op in p3.rounds[0] if op.kind is Kind.SEND]
                assert [(a, b) for _, a, b in last[0].dst] == [(lo, hi)]
                assert [(a, b) for _, a, b in first[0].src] == [(lo, hi)]
    # the rails' ranges, one per local rank and piece, tile the vector
    assert all(len(s) == 1 for s in shards.values())
    assert len(shards) == g * pieces
    cuts = sorted(next(iter(s)) for s in shards.values())
    edges = np.array(cuts).ravel()
    assert edges[0] == 0 and edges[-1] == m and all(edges[1:-1:2] == edges[2::2])


@pytest.mark.parametrize("n,g,pieces", [(4, 2, 4), (6, 3, 2), (6, 2, 3), (8, 4, 2)])
@pytest.mark.parametrize("m", [7, 1000])
def test_pieces_on_rails_give_the_sum_on_every_rank(n: int, g: int, pieces: int,
                                                    m: int) -> None:
    """Every rank's parts run in lockstep on numpy (phase 1 of each piece, the rail's
    sum of each piece, phase 3 of each piece): the vector's sum everywhere, the ranks of
    a node bit-identical."""
    sched = build("all_reduce", "hierarchical_pipelined", n, 0, group=g, pieces=pieces)
    rng = np.random.default_rng(n * 100 + m)
    xs = [rng.normal(0, 1, m) for _ in range(n)]
    want = np.sum(xs, axis=0)
    bufs = [x.copy() for x in xs]
    parts = [rails.phases(sched, r, m, g) for r in range(n)]

    def lockstep(progs: list) -> None:   # one round at a time, sends read before writes
        for t in range(len(progs[0].rounds)):
            sent = {}
            for r, prog in enumerate(progs):
                for op in prog.rounds[t]:
                    if op.kind is Kind.SEND:
                        sent.setdefault((r, op.peer), []).append(
                            np.concatenate([bufs[r][lo:hi] for _, lo, hi in op.src]))
            for r, prog in enumerate(progs):
                for op in prog.rounds[t]:
                    if op.kind in (Kind.RECV, Kind.RRED):
                        got, pos = sent[(op.peer, r)].pop(0), 0
                        for _, lo, hi in op.dst:
                            if op.kind is Kind.RECV:
                                bufs[r][lo:hi] = got[pos:pos + hi - lo]
                            else:
                                bufs[r][lo:hi] += got[pos:pos + hi - lo]
                            pos += hi - lo

    for p in range(pieces):
        lockstep([parts[r][p][0] for r in range(n)])
        for i in range(g):   # the rail of local rank i: its ranks' piece, summed
            lo, hi = parts[i][p][2], parts[i][p][3]
            rail = range(i, n, g)
            total = np.sum([bufs[q][lo:hi] for q in rail], axis=0)
            for q in rail:
                assert (parts[q][p][2], parts[q][p][3]) == (lo, hi)
                bufs[q][lo:hi] = total
    for p in range(pieces):
        lockstep([parts[r][p][1] for r in range(n)])
    for r in range(n):
        np.testing.assert_allclose(bufs[r], want, rtol=1e-12, atol=1e-12)
        assert bufs[r].tobytes() == bufs[r // g * g].tobytes()


@pytest.mark.parametrize("n,g,pieces", [(4, 2, 1), (4, 2, 2), (6, 3, 2), (8, 4, 4)])
def test_phase_one_writes_are_what_its_receives_and_local_steps_write(n: int, g: int,
                                                                      pieces: int) -> None:
    """``executor.writes``, which a rails call keeps a copy of before its first phase 1 runs
    ahead of the other nodes' descriptors: sorted, disjoint, and exactly the elements its
    receives and local steps write (a mismatch then puts back every one of them)."""
    from ringlet.executor import writes

    sched = build("all_reduce", "hierarchical_pipelined", n, 0, group=g, pieces=pieces)
    m = 1001
    for r in range(n):
        p1 = rails.phases(sched, r, m, g)[0][0]
        spans = writes(p1)
        assert spans and all(a[2] < b[1] for a, b in zip(spans, spans[1:], strict=False))
        covered = np.zeros(sched.layouts[next(iter(sched.layouts))].bounds(m)[-1], bool)
        for _, lo, hi in spans:
            covered[lo:hi] = True
        want = np.zeros_like(covered)
        for ops in p1.rounds:
            for op in ops:
                if op.kind is not Kind.SEND:
                    for _, lo, hi in op.dst:
                        want[lo:hi] = True
        assert (covered == want).all() and want.any()


def test_a_traced_round_carries_its_peers_bytes_and_time_as_data() -> None:
    """The executor's DEBUG line for a round also carries it as data (``record.round``),
    which ``benchmarks/multihost.py`` reads to time a call's rounds inside a node: the
    peers of its steps, the bytes it sends and its seconds, as the line says them."""
    import re
    import sys
    from pathlib import Path

    from ringlet.executor import _trace, compile_program

    sys.path.insert(0, str(Path(__file__).parent / "scripts"))
    from rails_job import traced  # the rails job's own catch of the DEBUG records

    sched = build("all_reduce", "hierarchical", 4, 0, group=2)
    prog = compile_program(sched, 1, 1000)
    bufs = {int(b): np.zeros(1000, np.float32) for b in sched.layouts}
    with traced() as got:
        for i, ops in enumerate(prog.rounds):
            _trace(1, f"round {i}", ops, bufs, 0.25 + i)
    assert len(got) == len(prog.rounds) == 4
    for i, record in enumerate(got):
        data = record.round  # type: ignore[attr-defined]
        line = record.getMessage()
        assert data["seconds"] == 0.25 + i and line.endswith(f"; {(0.25 + i) * 1e6:.1f} us")
        assert sorted(data["peers"]) == sorted(int(q) for q in
                                               re.findall(r"(?:->|<-) (\d+)", line))
        assert data["sent"] == sum(int(b) for b in
                                   re.findall(r"send (\d+) B", line))
    # rank 1 of nodes {0, 1} and {2, 3}: phase 1 and 3 with rank 0, phase 2 with rank 3
    assert [set(r.round["peers"]) for r in got] == [{0}, {3}, {3}, {0}]  # type: ignore[attr-defined]
    assert [r.round["sent"] for r in got] == [2000, 1000, 1000, 2000]  # type: ignore[attr-defined]
