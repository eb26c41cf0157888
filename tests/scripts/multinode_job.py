"""Every collective, algorithm and p2p across nodes, checked against numpy (any launcher).

Run under ``ringlet run --nodes K``, ``mpiexec`` with ``RINGLET_NODE`` per
group of ranks, ``torchrun`` per node, or across network namespaces.
``EXPECT_NODES`` (e.g. ``0,0,1,1``: each rank's node) is checked against
``comm.topology``.  Prints one JSON line per rank: ``{"rank", "ok", "bad",
"digest", "topology"}``; exits 1 if anything differed.  With ``--errors``
it also runs the error sequence (a mismatch, a rejected call, good calls
around them) and, with ``--timeout``, a call that one rank skips; ``--no-sweep``
skips the collectives and algorithms before it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time

import numpy as np

import ringlet
from ringlet import lean
from ringlet.errors import ArgumentError, CommTimeoutError, MismatchError

COLLS = ["all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all",
         "scatter", "gather"]


def data(rank: int, count: int, dtype: str, salt: int = 0) -> np.ndarray:
    rng = np.random.default_rng([rank, count, salt])
    if dtype == "int64":
        return rng.integers(-1000, 1000, count).astype(np.int64)
    return rng.normal(0, 10, count).astype(dtype)


def close(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype.kind == "f":
        return bool(np.allclose(a, b, rtol=1e-4, atol=1e-4))
    return bool(np.array_equal(a, b))


def check_all(comm: ringlet.Communicator, bad: list[str], names: dict[str, list[str]]) -> str:
    n, r = comm.size, comm.rank
    h = hashlib.sha1()
    for dtype in ("float32", "int64"):
        for count in (0, 1, 7, 1000, 40_000):
            xs = [data(q, count * n, dtype) for q in range(n)]
            for alg in names["all_reduce"]:
                x = xs[r].copy()
                comm.all_reduce(x, algorithm=alg)
                if not close(x, sum(xs[1:], xs[0].copy())):
                    bad.append(f"all_reduce/{alg} {dtype} {count}")
                h.update(x.tobytes())
            for alg in names["broadcast"]:
                for root in {0, n - 1}:
                    x = xs[r].copy()
                    comm.broadcast(x, root=root, algorithm=alg)
                    if not np.array_equal(x, xs[root]):
                        bad.append(f"broadcast/{alg} root {root} {count}")
            for alg in names["reduce"]:
                root = n - 1
                res = comm.reduce(xs[r].copy(), root=root, algorithm=alg)
                if r == root and not close(res, sum(xs[1:], xs[0].copy())):
                    bad.append(f"reduce/{alg} {dtype} {count}")
            for alg in names["all_gather"]:
                got = comm.all_gather(xs[r][:count], algorithm=alg)
                if not np.array_equal(got, np.stack([x[:count] for x in xs])):
                    bad.append(f"all_gather/{alg} {count}")
            for alg in names["reduce_scatter"]:
                got = comm.reduce_scatter(xs[r], algorithm=alg)
                want = sum(xs[1:], xs[0].copy())[r * count:(r + 1) * count]
                if not close(got, want):
                    bad.append(f"reduce_scatter/{alg} {dtype} {count}")
            for alg in names["all_to_all"]:
                got = comm.all_to_all(xs[r], algorithm=alg)
                want = np.concatenate([x[r * count:(r + 1) * count] for x in xs])
                if not np.array_equal(got, want):
                    bad.append(f"all_to_all/{alg} {count}")
            for alg in names["scatter"]:
                root = 0
                out = np.empty(count, xs[0].dtype)
                got = comm.scatter(xs[root] if r == root else None, root=root, out=out,
                                   algorithm=alg)
                if not np.array_equal(got, xs[root][r * count:(r + 1) * count]):
                    bad.append(f"scatter/{alg} {count}")
            for alg in names["gather"]:
                root = n - 1
                got = comm.gather(xs[r][:count], root=root, algorithm=alg)
                if r == root and not np.array_equal(got, np.stack([x[:count] for x in xs])):
                    bad.append(f"gather/{alg} {count}")
    # p2p: a ring, with tags out of order (the second message is received first)
    a, b = np.full(5, r, np.int64), np.full(3, 10 + r, np.int64)
    w1 = comm.isend(a, (r + 1) % n, tag=1)
    w2 = comm.isend(b, (r + 1) % n, tag=2)
    gb, ga = np.empty(3, np.int64), np.empty(5, np.int64)
    comm.recv(gb, (r - 1) % n, tag=2)
    comm.recv(ga, (r - 1) % n, tag=1)
    w1.wait()
    w2.wait()
    if not (ga == (r - 1) % n).all() or not (gb == 10 + (r - 1) % n).all():
        bad.append("p2p ring")
    # messages to itself (on the torch engine a rank alone on its node reaches itself
    # through the engine, and gloo has no connection to its own rank): isend then recv,
    # recv posted first, sendrecv, and taken by a receive from any source
    w = comm.isend(np.full(2, r, np.int64), r, tag=6)
    mine6 = comm.recv(np.empty(2, np.int64), r, tag=6)
    w.wait()
    w = comm.irecv(np.empty(3, np.int64), r, tag=7)
    comm.send(np.full(3, 2 * r, np.int64), r, tag=7)
    mine7 = w.wait()
    mine8 = comm.sendrecv(np.full(2, 3 * r, np.int64), r, np.empty(2, np.int64), r, 8, 8)
    comm.barrier()   # no message from another rank is on its way with tag 9
    comm.send(np.full(1, 4 * r, np.int64), r, tag=9)
    w = comm.irecv(np.empty(1, np.int64), ringlet.ANY_SOURCE, tag=9)
    mine9 = w.wait()
    if [mine6.tolist(), mine7.tolist(), mine8.tolist(), mine9.tolist(), w.source] != \
            [[r] * 2, [2 * r] * 3, [3 * r] * 2, [4 * r], r]:
        bad.append(f"p2p to itself: {mine6} {mine7} {mine8} {mine9} from {w.source}")
    # blocking small sends and receives: between two ranks of a node on the compiled path
    # (the messages wait in the channel: nothing runs this rank's p2p engine before the
    # recv), between nodes on the engine
    t, mine = comm._t, next(nd for nd in comm.topology.nodes if r in nd)
    taken: list[int] = []
    take = getattr(t, "take_message", None)
    if take is not None:
        def spy(*a: object) -> int:
            taken.append(take(*a))
            return taken[-1]
        t.take_message = spy
    comm.barrier()   # every rank is done with the waits above (which take in what arrives)
    if len(mine) > 1 and r == mine[1]:
        for tag in (3, 4):
            comm.send(np.full(2, 100 * tag + r, np.float64), mine[0], tag=tag)
    comm.barrier()
    if len(mine) > 1 and r == mine[0]:
        got3 = comm.recv(np.empty(2, np.float64), mine[1], tag=3)
        got4 = comm.recv(np.empty(2, np.float64), mine[1], tag=4)
        if got3.tolist() != [300.0 + mine[1]] * 2 or got4.tolist() != [400.0 + mine[1]] * 2:
            bad.append("blocking p2p inside a node")
        if lean.BUILT and os.environ.get("RINGLET_LEAN") != "0" and taken != [1, 1]:
            bad.append(f"blocking p2p inside a node: not on the compiled path {taken}")
    nodes = comm.topology.nodes
    if len(nodes) > 1 and r in (0, nodes[1][0]):
        del taken[:]
        if r == 0:
            comm.send(np.full(2, 7.0), nodes[1][0], tag=5)
        elif comm.recv(np.empty(2), 0, tag=5).tolist() != [7.0, 7.0]:
            bad.append("blocking p2p between nodes")
        if 1 in taken:
            bad.append("blocking p2p between nodes: on shared memory's compiled path")
    if take is not None:
        del t.take_message
    # the pipelined two-level all_reduce in several pieces (pipeline_pieces: 8 MiB on nodes
    # of 2 ranks is 4 pieces); its bits go into the digest every rank compares
    if n > 1 and comm.topology.ranks_per_node:
        from ringlet.algorithms.hierarchical import pipeline_pieces

        big = data(r, 1 << 20, "float64", salt=1)
        if pipeline_pieces(big.nbytes, comm.topology.ranks_per_node) < 2:
            bad.append("pipelined all_reduce: one piece")
        b = big.copy()
        comm.all_reduce(b, algorithm="hierarchical_pipelined")
        want = big.copy()
        comm.all_reduce(want, algorithm="naive")
        if not np.allclose(b, want, rtol=1e-12, atol=1e-9):
            bad.append("pipelined all_reduce in pieces")
        h.update(b.tobytes())
    # objects, split across nodes (even and odd ranks), a sub-communicator's all_reduce
    objs = comm.all_gather_object({"rank": r})
    if [o["rank"] for o in objs] != list(range(n)):
        bad.append("all_gather_object")
    # a large object: its pickle (read-only at the root) goes by hierarchical broadcast on
    # equal nodes, which once wrote into the root's vector
    blob = comm.broadcast_object(bytes(range(256)) * 1024 if r == n - 1 else None, root=n - 1)
    if blob != bytes(range(256)) * 1024:
        bad.append("broadcast_object of 256 KiB")
    sub = comm.split(r % 2)
    assert sub is not None
    x = np.full(4, r, np.float64)
    sub.all_reduce(x)
    if x[0] != sum(q for q in range(n) if q % 2 == r % 2):
        bad.append("split all_reduce")
    sub.close()
    # a split that stays inside each node: one node, its ranks in order, right sums
    mine = next(nd for nd in comm.topology.nodes if r in nd)
    sub = comm.split(comm.topology.nodes.index(mine))
    assert sub is not None
    x = np.full(3, r, np.int64)
    sub.all_reduce(x)
    if [list(nd) for nd in sub.topology.nodes] != [list(range(len(mine)))] or \
            sub.rank != list(mine).index(r) or x[0] != sum(mine):
        bad.append(f"split by node: {sub.topology.nodes} rank {sub.rank} sum {x[0]}")
    sub.close()
    check_more(comm, bad)
    return h.hexdigest()


def check_more(comm: ringlet.Communicator, bad: list[str]) -> None:
    """scan and exscan, the uneven calls (zero rows included) and maxloc pairs, with each
    of their algorithms."""
    n, r = comm.size, comm.rank
    xs = [data(q, 9, "int64") for q in range(n)]
    for alg in ringlet.algorithms("scan"):
        x = xs[r].copy()
        comm.scan(x, algorithm=alg)
        y = xs[r].copy()
        comm.exscan(y, algorithm=alg)
        if not np.array_equal(x, sum(xs[1:r + 1], xs[0].copy())) or \
                not np.array_equal(y, sum(xs[1:r], xs[0].copy()) if r else xs[0]):
            bad.append(f"scan/exscan {alg}")
    sends = np.array([[(i * 3 + j * 5) % 4 for j in range(n)] for i in range(n)])
    for alg in ringlet.algorithms("all_to_all_v"):
        x = np.concatenate([np.full((c, 2), 100 * r + j, np.float32)
                            for j, c in enumerate(sends[r])])
        got = comm.all_to_all_v(x, sends[r], algorithm=alg)
        if not np.array_equal(got, np.concatenate([np.full((sends[i, r], 2), 100 * i + r,
                                                           np.float32) for i in range(n)])):
            bad.append(f"all_to_all_v/{alg}")
    rows = [q % 3 for q in range(n)]
    want = np.concatenate([np.full(c, q, np.int16) for q, c in enumerate(rows)])
    for alg in ringlet.algorithms("all_gather_v"):
        if not np.array_equal(comm.all_gather_v(np.full(rows[r], r, np.int16),
                                                algorithm=alg), want):
            bad.append(f"all_gather_v/{alg}")
    for alg in ringlet.algorithms("gather_v"):
        got = comm.gather_v(np.full(rows[r], r, np.int16), root=n - 1, algorithm=alg)
        if r == n - 1 and not np.array_equal(got, want):
            bad.append(f"gather_v/{alg}")
    for alg in ringlet.algorithms("scatter_v"):
        got = comm.scatter_v(want if r == 0 else None, rows, root=0,
                             out=None if r == 0 else np.empty(rows[r], np.int16),
                             algorithm=alg)
        if not np.array_equal(got, np.full(rows[r], r, np.int16)):
            bad.append(f"scatter_v/{alg}")
    vals = [float((q * 3) % n) for q in range(n)]
    for alg in ringlet.algorithms("all_reduce"):
        p = ringlet.pairs([vals[r], -vals[r]], np.array([r, r], np.int32))
        comm.all_reduce(p, op="maxloc", algorithm=alg)
        if p["index"].tolist() != [int(np.argmax(vals)), int(np.argmin(vals))]:
            bad.append(f"maxloc/{alg}")


def check_errors(comm: ringlet.Communicator, bad: list[str], skip: bool) -> None:
    n, r = comm.size, comm.rank
    x = np.ones(8, np.float32)
    comm.all_reduce(x)
    try:   # ranks disagree about the count: MismatchError on every rank
        comm.all_reduce(np.ones(8 + (r == n - 1), np.float32))
        bad.append("mismatch not detected")
    except MismatchError as exc:
        if "count" not in str(exc):
            bad.append(f"mismatch message: {exc}")
    try:   # one rank's bad op: ArgumentError there, MismatchError quoting it elsewhere
        comm.all_reduce(np.ones(4, np.float32), op="median" if r == 1 else "sum")
        bad.append("rejected call not reported")
    except ArgumentError as exc:
        if r != 1:
            bad.append(f"ArgumentError on rank {r}: {exc}")
    except MismatchError as exc:
        if r == 1 or "rank 1" not in str(exc):
            bad.append(f"rejected-call message on rank {r}: {exc}")
    y = np.full(8, r + 1.0, np.float32)
    comm.all_reduce(y)
    if y[0] != n * (n + 1) / 2:
        bad.append("all_reduce after the errors")
    if skip:   # the last rank skips a call: the others time out naming it
        if r == n - 1:
            time.sleep(comm.settings.timeout + 1)
        else:
            try:
                comm.all_reduce(np.ones(2, np.float32))
                bad.append("timeout not raised")
            except CommTimeoutError as exc:
                # only the rank that skipped is missing, and where it is is said (the ranks
                # on its node send their own descriptors once the call waits: see
                # ringlet.transport.routed), as on one host
                text = str(exc)
                if f": rank {n - 1} did not arrive" not in text or \
                        f"rank {n - 1}'s last call: all_reduce #" not in text:
                    bad.append(f"timeout message: {exc}")
            except ringlet.PeerError as exc:   # a peer's timeout reached this rank first
                if "timed out" not in str(exc):
                    bad.append(f"timeout message: {exc}")


def main() -> int:
    comm = ringlet.init()
    names = {c: ringlet.algorithms(c) for c in COLLS}
    if comm.topology.engine is not None and "--native" in sys.argv:
        for c in COLLS:
            names[c] = [*names[c], "native"]
    bad: list[str] = []
    expect = os.environ.get("EXPECT_NODES")
    if expect:
        keys = expect.split(",")
        want = ringlet.topology.Topology.from_keys(keys, comm.rank, comm.topology.engine)
        if want.nodes != comm.topology.nodes or want.node != comm.topology.node:
            bad.append(f"topology {comm.topology} != expected {want}")
    # --no-sweep: the error sequence alone (a timeout test: the sweep ran in another test on
    # the same launcher)
    dig = "" if "--no-sweep" in sys.argv else check_all(comm, bad, names)
    # all_reduce is bit-identical on every rank
    digs = comm.all_gather_object(dig)
    if len(set(digs)) != 1:
        bad.append("all_reduce results differ between ranks")
    if "--errors" in sys.argv:
        check_errors(comm, bad, "--timeout" in sys.argv)
    print(json.dumps({"rank": comm.rank, "ok": not bad, "bad": bad[:20],
                      "nodes": [list(rs) for rs in comm.topology.nodes],
                      "engine": comm.topology.engine}), flush=True)
    if "--host-first" in sys.argv and comm.rank != 0:
        time.sleep(1.5)   # rank 0, which hosts the torch store, ends first
    if "--timeout" not in sys.argv:
        comm.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
