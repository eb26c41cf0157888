"""The torch transport at work: every collective x every algorithm and gloo's own,
point-to-point messages, errors, split, and the transport's messages themselves,
against numpy.  Run on every rank:

    torchrun --standalone --nproc-per-node N tests/scripts/torch_suite.py [--init-default]
    MASTER_ADDR=127.0.0.1 MASTER_PORT=<free> RANK=r WORLD_SIZE=N python torch_suite.py

``--init-default`` calls ``init_process_group("gloo")`` first, as a user's program would:
ringlet then reuses the default group's store, and the user's group must still work at
the end.  Prints ``[rank r] ok: ...`` per rank, or the failed checks and exit status 1.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
import torch
from torch_common import Report, communicator, make, prefix_reference, raises

import ringlet
from ringlet.algorithms import algorithms
from ringlet.comm import Communicator
from ringlet.errors import (
    ArgumentError,
    CommTimeoutError,
    MismatchError,
    PeerError,
    RingletError,
)
from ringlet.ops import ReduceOp, reference_reduce
from ringlet.transport import torch as tm
from ringlet.transport.base import COLL, P2P
from ringlet.transport.torch import TorchTransport

ROOTED = ("broadcast", "reduce", "scatter", "gather")
BLOCKED = ("reduce_scatter", "all_to_all", "scatter")
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
               "all_to_all", "scatter", "gather", "scan", "exscan")
COUNTS = [0, 7, 1001]          # elements per rank (not divisible by any N > 1)
BLOCKS = [0, 1, 333]           # elements per block for the blocked collectives
#: (dtype, op) of the reductions: exact in float32 (small integers), wrapping in int64
CASES = [("float32", ReduceOp.SUM), ("int64", ReduceOp.SUM), ("int64", ReduceOp.MAX)]


def call(comm: Communicator, coll: str, name: str, dtype: str, op: ReduceOp, count: int,
         root: int, salt: int) -> str | None:
    """One call of ``coll`` with algorithm ``name``: what is wrong, or None."""
    n, r = comm.size, comm.rank
    per = count * n if coll in BLOCKED else count     # elements of each rank's x
    ins = [make(dtype, per, q, salt) for q in range(n)]
    x = ins[r].copy()
    keep = x.copy()
    if coll == "all_reduce":
        ref: Any = reference_reduce(np.stack(ins), op)
        got = comm.all_reduce(x, op=op, algorithm=name)
    elif coll == "broadcast":
        ref = ins[root]
        if r == root:   # the root's vector is its input: comm.broadcast takes it read-only
            x.flags.writeable = False
        got = comm.broadcast(x, root=root, algorithm=name)
    elif coll == "reduce":
        ref = reference_reduce(np.stack(ins), op)
        got = comm.reduce(x, root=root, op=op, algorithm=name)
        if r != root:
            if got is not None:
                return "a rank other than the root got a result"
            return None if np.array_equal(x, keep) else "a non-root input changed"
    elif coll == "all_gather":
        ref = np.stack(ins)
        got = comm.all_gather(x, algorithm=name)
    elif coll == "gather":
        ref = np.stack(ins)
        got = comm.gather(x, root=root, algorithm=name)
        if r != root:
            return None if got is None else "a rank other than the root got a result"
    elif coll == "reduce_scatter":
        ref = reference_reduce(np.stack(ins), op)[r * count:(r + 1) * count]
        got = comm.reduce_scatter(x, op=op, algorithm=name)
    elif coll == "all_to_all":
        ref = np.concatenate([ins[q][r * count:(r + 1) * count] for q in range(n)])
        got = comm.all_to_all(x, algorithm=name)
    elif coll in ("scan", "exscan"):
        ref = prefix_reference(coll, ins, r, op)
        got = getattr(comm, coll)(x, op=op, algorithm=name)
    else:  # scatter
        ref = ins[root][r * count:(r + 1) * count]
        if r == root:
            got = comm.scatter(x, root=root, algorithm=name)
        else:
            got = comm.scatter(None, root=root, out=np.empty(count, dtype), algorithm=name)
    changes = ("all_reduce", "broadcast", "scan", "exscan") + (("reduce",) if r == root else ())
    if coll not in changes and not np.array_equal(x, keep):
        return "the input changed"
    got = np.asarray(got)
    if got.shape != np.shape(ref) or not np.array_equal(got, ref):
        diff = np.flatnonzero(got.reshape(-1) != np.asarray(ref).reshape(-1))[:5] \
            if got.shape == np.shape(ref) else f"shape {got.shape} != {np.shape(ref)}"
        return f"wrong result (elements {diff})"
    return None


def collectives(comm: Communicator, rep: Report, names: dict[str, list[str]]) -> None:
    """Every collective x every algorithm (and "native": gloo's own)."""
    n = comm.size
    salt = 0
    for coll in COLLECTIVES:
        cases = CASES if coll in ("all_reduce", "reduce", "reduce_scatter") else \
            [("float32", ReduceOp.SUM), ("int64", ReduceOp.SUM)]
        roots = sorted({0, n - 1}) if coll in ROOTED else [0]
        for name in names[coll]:
            for dtype, op in cases:
                for count in BLOCKS if coll in BLOCKED else COUNTS:
                    for root in roots:
                        salt += 1
                        bad = call(comm, coll, name, dtype, op, count, root, salt)
                        rep.check(bad is None, f"{coll} {name} {dtype} {op.name} count={count} "
                                               f"root={root}: {bad}")


def native_extras(comm: Communicator, t: TorchTransport, rep: Report) -> None:
    """gloo's own collectives beyond float32/int64: ringlet's meaning of bool SUM (OR),
    complex SUM, torch bfloat16, reductions gloo cannot compute as ringlet does
    (refused before the call, on every rank that asked)."""
    n, r = comm.size, comm.rank
    for coll in ("scan", "exscan"):   # gloo has none: refused before the call, on every rank
        err = raises(lambda coll=coll: getattr(comm, coll)(np.ones(3), algorithm="native"),
                     ArgumentError)
        rep.check(f"{coll} on rank {r}: algorithm 'native'" in str(err)
                  and "torch engine has no" in str(err), f"native {coll}: {err!r}")
    b = np.array([r == 0, False, True, r % 2 == 1])
    comm.all_reduce(b, algorithm="native")
    rep.check(b.tolist() == [True, False, True, n > 1], f"native bool SUM (OR): {b}")
    b = np.array([True, r != 0, False])
    comm.all_reduce(b, op="prod", algorithm="native")
    rep.check(b.tolist() == [True, False, False], f"native bool PROD (AND): {b}")
    c = np.full(5, complex(r, -r), np.complex64)
    comm.all_reduce(c, algorithm="native")
    s = n * (n - 1) / 2
    rep.check(bool(np.all(c == complex(s, -s))), f"native complex64 SUM: {c}")
    bf = torch.full((6,), float(r + 1), dtype=torch.bfloat16)
    comm.all_reduce(bf, algorithm="native")
    rep.check(bool(torch.all(bf == n * (n + 1) / 2)), f"native bfloat16 SUM: {bf}")
    u = np.arange(4, dtype=np.uint64) << np.uint64(33)
    comm.all_reduce(u, op="bor", algorithm="native")
    rep.check(np.array_equal(u, np.arange(4, dtype=np.uint64) << np.uint64(33)),
              f"native uint64 BOR: {u}")
    # what gloo cannot reduce as ringlet does: refused before the call, on every rank, with
    # the usual prefix, the buffer untouched
    for coll, v, op, words in [
            ("all_reduce", np.ones(3, np.uint16), "sum", "gloo has no uint16 arithmetic"),
            ("all_reduce", np.ones(3, bool), "land", "gloo has no logical LAND"),
            ("reduce", np.ones(n, np.complex64), "prod", "SUM only, not PROD"),
            ("reduce_scatter", np.ones(n, np.uint32), "max", "no uint32 arithmetic"),
            ("all_reduce", np.ones(3, np.float32), "max", "does not propagate NaN"),
            ("reduce", np.ones(3, np.float64), "min", "does not propagate NaN"),
            ("all_reduce", ringlet.pairs(np.ones(2), np.arange(2)), "minloc",
             "gloo has no MINLOC")]:
        keep = v.copy()
        err = raises(lambda coll=coll, v=v, op=op: getattr(comm, coll)(
            v, op=op, algorithm="native"), ArgumentError)
        rep.check(f"{coll} on rank {r}: algorithm 'native': gloo" in str(err)
                  and words in str(err) and np.array_equal(v, keep),
                  f"native {coll} {v.dtype} {op}: {err!r}")
    # ranks that disagree: rank 0's call is refused before it starts, the others' is not:
    # every rank raises (the others hear of rank 0's rejection), and the next call works
    v = np.ones(3, np.uint16 if r == 0 else np.float32)
    err = raises(lambda: comm.all_reduce(v, algorithm="native"), RingletError)
    rep.check(err is not None and (r != 0 or "uint16 arithmetic" in str(err)),
              f"native uint16 on rank 0 only: {err!r}")
    x = np.full(3, float(r), np.float32)
    comm.all_reduce(x, op="avg", algorithm="native")
    rep.check(bool(np.allclose(x, (n - 1) / 2)), f"native AVG after an error: {x}")
    # the communicator's flat buffers, straight through the transport (no agreement)
    src = np.arange(2 * n, dtype=np.float32) + r
    keep = src.copy()
    out = np.empty(2, np.float32)
    t.native("reduce_scatter", 0, 2, {0: src, 1: out}, ReduceOp.SUM, lambda: "rs")
    want = np.sum([np.arange(2 * n, dtype=np.float32) + q for q in range(n)],
                  axis=0)[2 * r:2 * r + 2]
    rep.check(np.array_equal(out, want) and np.array_equal(src, keep),
              f"transport.native reduce_scatter: {out} (input kept: {np.array_equal(src, keep)})")


def bit_identical(comm: Communicator, rep: Report) -> None:
    """all_reduce of random float32 gives the same bits on every rank, every algorithm."""
    rng = np.random.default_rng(comm.rank + 17)
    for name in [*algorithms("all_reduce"), "native"]:
        x = rng.standard_normal(10_007).astype(np.float32)
        comm.all_reduce(x, algorithm=name)
        rows = comm.all_gather(x.view(np.uint8))
        rep.check(bool(np.all(rows == rows[0])), f"all_reduce {name}: ranks differ")


def messages(comm: Communicator, t: TorchTransport, rep: Report) -> None:
    """The transport's own interface: FIFO per channel, parts, reducers, zero bytes."""
    n, r = comm.size, comm.rank
    if n == 1:
        return
    right, left = (r + 1) % n, (r - 1) % n
    sends = [t.isend(right, [np.full(16, i, np.int64).view(np.uint8)], COLL)
             for i in range(40)]
    bufs = [np.empty(16, np.int64) for _ in range(40)]
    recvs = [t.irecv(left, [b], None, COLL) for b in bufs]
    t.wait(sends + recvs, lambda: "FIFO check")
    rep.check([int(b[0]) for b in bufs] == list(range(40)), "COLL messages out of order")
    # three parts packed into one message, received into two parts and reduced
    a, b, c = (np.arange(k, k + 5, dtype=np.float64) for k in (0, 5, 10))
    s = t.isend(right, [a.view(np.uint8), b.view(np.uint8), c.view(np.uint8)], COLL)
    d1, d2 = np.ones(7), np.ones(8)

    def add(dst: np.ndarray, src: np.ndarray) -> None:
        np.add(dst, src, out=dst)

    q = t.irecv(left, [d1, d2], add, COLL)
    t.wait([s, q], lambda: "parts check")
    rep.check(np.array_equal(np.concatenate([d1, d2]), np.arange(15) + 1.0),
              f"parts reduced: {d1} {d2}")
    z1, z2 = t.isend(right, [np.empty(0, np.uint8)], COLL), t.irecv(left, [np.empty(0)])
    rep.check(z1.done and z2.done, "zero-byte messages are done at once")
    # a P2P message never meets a COLL one
    p = t.isend(right, [np.full(4, 7, np.int32).view(np.uint8)], P2P)
    k = t.isend(right, [np.full(4, 9, np.int32).view(np.uint8)], COLL)
    pb, kb = np.zeros(4, np.int32), np.zeros(4, np.int32)
    kr = t.irecv(left, [kb], None, COLL)
    pr = t.irecv(left, [pb], None, P2P)
    t.wait([p, k, kr], lambda: "channels check")
    while not pr.done:
        pr.advance()
        time.sleep(0.001)
    rep.check(pb.tolist() == [7] * 4 and kb.tolist() == [9] * 4, f"channels: {pb} {kb}")
    # parts of several types whose boundaries fall inside pieces (with --pieces: 4160 B),
    # reduced piece by piece as the pieces arrive; and one part that lands in place
    parts = [np.arange(1000, dtype=np.float64) + r, np.arange(3001, dtype=np.int32) - r,
             np.arange(5, dtype=np.uint8), np.arange(2000, dtype=np.float32) * (r + 1)]
    s = t.isend(right, [x.view(np.uint8) for x in parts], COLL)
    into = [np.ones_like(x) for x in parts]
    q = t.irecv(left, into, add, COLL)
    big = np.arange(5000, dtype=np.int64) * (r + 1)
    s2 = t.isend(right, [big.view(np.uint8)], COLL)
    land = np.zeros(5000, np.int64)
    q2 = t.irecv(left, [land], None, COLL)
    t.wait([s, q, s2, q2], lambda: "pieces check")
    want = [np.arange(1000, dtype=np.float64) + left + 1,
            np.arange(3001, dtype=np.int32) - left + 1, np.arange(5, dtype=np.uint8) + 1,
            np.arange(2000, dtype=np.float32) * (left + 1) + 1]
    rep.check(all(np.array_equal(g, w) for g, w in zip(into, want, strict=True)),
              "parts across pieces reduced wrong")
    rep.check(np.array_equal(land, np.arange(5000, dtype=np.int64) * (left + 1)),
              "a message of several pieces landed wrong")
    t.check()


def p2p(comm: Communicator, rep: Report) -> None:
    """send/recv with tags, messages that arrive before their receive, size mismatch."""
    n, r = comm.size, comm.rank
    if n == 1:
        return
    right, left = (r + 1) % n, (r - 1) % n
    w5 = comm.isend(np.full(3, 10 * r + 5, np.int64), right, tag=5)
    w3 = comm.isend(np.full(3, 10 * r + 3, np.int64), right, tag=3)
    got3 = comm.recv(np.zeros(3, np.int64), left, tag=3)   # tag 5 arrived first: unexpected
    got5 = comm.irecv(np.zeros(3, np.int64), left, tag=5).wait()
    w5.wait()
    w3.wait()
    rep.check(got3.tolist() == [10 * left + 3] * 3 and got5.tolist() == [10 * left + 5] * 3,
              f"tags: {got3} {got5}")
    works = [comm.isend(np.array([i], np.int32), right, tag=1) for i in range(20)]
    got = [int(comm.recv(np.zeros(1, np.int32), left, tag=1)[0]) for _ in range(20)]
    for w in works:
        w.wait()
    rep.check(got == list(range(20)), f"p2p order: {got}")
    big = np.arange(300_000, dtype=np.float32) * (r + 1)
    wb = comm.isend(big, right, tag=2)
    gb = comm.recv(np.empty(300_000, np.float32), left, tag=2)
    wb.wait()
    rep.check(np.array_equal(gb, np.arange(300_000, dtype=np.float32) * (left + 1)),
              "p2p 1.2 MB message")
    ws = comm.isend(np.ones(4, np.float32), right, tag=9)
    err = raises(lambda: comm.recv(np.zeros(5, np.float32), left, tag=9), ArgumentError)
    ws.wait()
    rep.check(err is not None and "4 x float32" in str(err), f"size mismatch: {err!r}")
    comm.barrier()


def errors(comm: Communicator, rep: Report) -> None:
    """A disagreement raises MismatchError on every rank; a call one rank rejects raises
    ArgumentError there and MismatchError on the others; the next calls work."""
    n, r = comm.size, comm.rank
    x = np.ones(4 if r == 0 else 5, np.float32)
    err: BaseException | None
    if n > 1:
        err = raises(lambda: comm.all_reduce(x), MismatchError)
        rep.check(err is not None and "disagree" in str(err), f"count mismatch: {err!r}")
    y = np.ones(3, np.float32)
    if r == n - 1:
        err = raises(lambda: comm.all_reduce(y, op="bogus"), ArgumentError)
        rep.check(err is not None and "bogus" in str(err), f"rejected call: {err!r}")
    else:
        err = raises(lambda: comm.all_reduce(y), MismatchError)
        rep.check(err is not None and "bogus" in str(err) and f"rank {n - 1}" in str(err),
                  f"peer of a rejected call: {err!r}")
    y = np.ones(3, np.float32)
    comm.all_reduce(y)
    rep.check(bool(np.all(y == n)), f"the call after the errors: {y}")


def split(comm: Communicator, rep: Report) -> None:
    """Two colors; ranks ordered by key (reversed); collectives and gloo's own in each."""
    n, r = comm.size, comm.rank
    members = sorted((q for q in range(n) if q % 2 == r % 2), reverse=True)
    sub = comm.split(r % 2, key=-r)
    assert sub is not None
    rep.check((sub.rank, sub.size) == (members.index(r), len(members)),
              f"split: rank {sub.rank} of {sub.size}, members {members}")
    x = np.array([r], np.int64)
    sub.all_reduce(x, algorithm="ring")
    rep.check(int(x[0]) == sum(members), f"split all_reduce: {x}")
    v = np.array([r], np.int64)
    sub.broadcast(v, root=0)
    rep.check(int(v[0]) == members[0], f"split broadcast from its rank 0: {v}")
    w = np.array([r], np.int64)
    sub.all_reduce(w, op="max", algorithm="native")
    rep.check(int(w[0]) == max(members), f"split native all_reduce: {w}")
    sub.close()
    comm.barrier()


def timeout(comm: Communicator, rep: Report) -> None:
    """A call the last rank never makes times out in 2 s on the others, naming it; the
    last rank hears of it (the timeout aborts the communicator everywhere)."""
    n, r = comm.size, comm.rank
    c2, t2 = communicator(timeout=2.0)
    if n > 1:
        if r != n - 1:
            t0 = time.monotonic()
            err = raises(lambda: c2.barrier(), CommTimeoutError)
            took = time.monotonic() - t0
            rep.check(err is not None and str(n - 1) in str(err) and "arrive" in str(err),
                      f"timeout: {err!r}")
            rep.check(1.5 < took < 8, f"timeout after {took:.1f} s, 2 s expected")
            comm.barrier()
        else:
            comm.barrier()
            deadline = time.monotonic() + 5
            err = None
            while err is None and time.monotonic() < deadline:
                err = raises(lambda: t2.check(), CommTimeoutError)
                time.sleep(0.01)
            rep.check(err is not None and "timed out" in str(err),
                      f"the absent rank hears of the timeout: {err!r}")
    c2.close()
    comm.barrier()


def closing(rep: Report) -> None:
    """The last rank closes after finishing 5 calls: the others' check() calls that an
    error between calls and in call 6, not in call 5 (which that rank finished)."""
    c1, t1 = communicator()
    n, r = c1.size, c1.rank
    if r == n - 1:
        t1.calls = lambda: (0, 5)
        t1.mark_closed()
    elif n > 1:
        err = None
        deadline = time.monotonic() + 10
        while err is None and time.monotonic() < deadline:
            err = raises(lambda: t1.check([n - 1], "the raw test"), PeerError)
            time.sleep(0.005)
        rep.check(err is not None and f"rank {n - 1} closed the communicator" in str(err),
                  f"between calls: {err!r}")
        t1.calls = lambda: (5, 4)
        err = raises(lambda: t1.check([n - 1], "call 5"), PeerError)
        rep.check(err is None, f"in call 5, which the closed rank finished: {err!r}")
        t1.calls = lambda: (6, 5)
        err = raises(lambda: t1.check([n - 1], "call 6"), PeerError)
        rep.check(err is not None and "closed" in str(err), f"in call 6: {err!r}")
    c1.close()


def main() -> None:
    default = "--init-default" in sys.argv
    if "--pieces" in sys.argv:    # every message over 4160 bytes in pieces
        tm.PIECE_BYTES = 4160
    if default:   # the user's own default group first: ringlet reuses its store
        import torch.distributed as dist

        dist.init_process_group("gloo")
    comm, t = communicator()
    rep = Report(comm.rank)
    rep.check(isinstance(t, TorchTransport) and t.caps.native and t.caps.engine == "torch",
              "caps")
    names = {c: algorithms(c) + (["native"] if c not in ("scan", "exscan") else [])
             for c in COLLECTIVES}
    rep.run("messages", lambda: messages(comm, t, rep))
    comm.barrier()
    rep.run("collectives", lambda: collectives(comm, rep, names))
    rep.run("native extras", lambda: native_extras(comm, t, rep))
    rep.run("bit identical", lambda: bit_identical(comm, rep))
    rep.run("p2p", lambda: p2p(comm, rep))
    rep.run("errors", lambda: errors(comm, rep))
    rep.run("split", lambda: split(comm, rep))
    rep.run("timeout", lambda: timeout(comm, rep))
    rep.run("closing", lambda: closing(rep))
    n, r = comm.size, comm.rank
    comm.close()
    t.close()
    if default:   # the user's group still works (closing ringlet's closed only its own)
        import torch.distributed as dist

        v = torch.tensor([float(r + 1)])
        dist.all_reduce(v)
        rep.check(float(v[0]) == n * (n + 1) / 2, f"the user's group: {v}")
        dist.destroy_process_group()
    rep.verdict()


if __name__ == "__main__":
    main()
