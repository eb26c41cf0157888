"""The MPI transport at work: every collective and algorithm, MPI's own collectives,
point-to-point messages, and the transport's messages themselves, against numpy.

    mpiexec -n N python tests/scripts/mpi_suite.py [--pieces]

``--pieces`` makes large messages travel as pieces of 4160 bytes (every rank alike),
so that piecewise receiving and reducing is exercised by small messages too.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import numpy as np
from mpi_common import Report, communicator, guarded
from oracle import close, make, run_one

import ringlet
from ringlet.comm import Communicator
from ringlet.errors import (
    ArgumentError,
    CommTimeoutError,
    MismatchError,
    PeerError,
    RingletError,
)
from ringlet.ops import DTYPES, ReduceOp, check_op, reference_reduce
from ringlet.transport import mpi as tm
from ringlet.transport.base import COLL, P2P

ROOTED = ("broadcast", "reduce", "scatter", "gather")
COLLECTIVES = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
               "all_to_all", "scatter", "gather", "scan", "exscan")
#: collectives the engines have no native form of here
NO_NATIVE = ("scan", "exscan")
COUNTS = [0, 1, 7, 1000]
BIG = 70_001   # float32: 280 KB, many pieces with --pieces


def every_algorithm(comm: Communicator, rep: Report) -> None:
    """Every collective x every algorithm (and native) x float32/int64 x counts x roots."""
    n = comm.size
    roots = sorted({0, n - 1})
    for coll in COLLECTIVES:
        for name in [*ringlet.algorithms(coll), *(["native"] if coll not in NO_NATIVE else [])]:
            for dtype in ("float32", "int64"):
                op = ReduceOp.SUM if dtype == "float32" else ReduceOp.MAX
                counts = COUNTS + ([BIG] if dtype == "float32" and name in (
                    "ring", "native", "binomial", "direct") else [])
                for count in counts:
                    for root in roots if coll in ROOTED else [0]:
                        try:
                            err = run_one(comm, coll, name, dtype, op, count, root)
                        except RingletError as exc:
                            err = f"raised {type(exc).__name__}: {exc}"
                        rep.check(err is None, f"{coll}/{name} {dtype} count {count} root "
                                               f"{root}: {err}")
    for coll in NO_NATIVE:   # MPI's own is not run: refused before the call, on every rank
        rep.expect_raise(ArgumentError,
                         lambda coll=coll: getattr(comm, coll)(np.ones(3), algorithm="native"),
                         f"{coll} on rank {comm.rank}: algorithm 'native'", "mpi engine has no")


def _valid(op: ReduceOp, dtype: str) -> bool:
    try:
        check_op(op, DTYPES[dtype])
    except ArgumentError:
        return False
    return True


def special(dtype: str, op: ReduceOp, rank: int, count: int = 37) -> np.ndarray:
    """Inputs that tell reduction semantics apart: wrap-around, NaN, bool arithmetic."""
    x = make(dtype, count, rank, salt=int(op) + 20)
    dt = np.dtype(dtype)
    if dt.kind in "iu" and op in (ReduceOp.SUM, ReduceOp.PROD):
        info = np.iinfo(dt)
        x[:4] = [info.max, info.max // 3 + 1, info.min if dt.kind == "i" else 7, 100]
    if dt.kind == "f" and op in (ReduceOp.MIN, ReduceOp.MAX):
        x[rank % count] = np.nan           # numpy's min/max propagate NaN
        x[(rank + 5) % count] = -0.0
    if dt.kind == "f" and op is ReduceOp.PROD:
        x = (1 + x / 100).astype(dt)
    return x


def native_semantics(comm: Communicator, rep: Report) -> None:
    """MPI's reductions compute exactly ringlet's op: every dtype and op, against numpy."""
    n, r = comm.size, comm.rank
    for dtype in ("bool", "int8", "int32", "int64", "uint8", "uint64", "float16", "float32",
                  "float64", "complex64", "complex128"):
        for op in ReduceOp:
            if not _valid(op, dtype):
                continue
            ins = [special(dtype, op, q) for q in range(n)]
            ref = reference_reduce(np.stack(ins), op)
            x = ins[r].copy()
            with np.errstate(all="ignore"):
                comm.all_reduce(x, op=op, algorithm="native")
            rep.check(close(x, ref), f"native all_reduce {dtype} {op.name}: "
                                     f"{x[:5]} != {ref[:5]}")
            if dtype in ("int8", "float32") and op is not ReduceOp.AVG:
                got = comm.reduce(ins[r].copy(), root=n - 1, op=op, algorithm="native")
                if r == n - 1:
                    rep.check(close(got, ref), f"native reduce {dtype} {op.name}")
                full = [special(dtype, op, q, count=4 * n) for q in range(n)]
                rs = comm.reduce_scatter(full[r], op=op, algorithm="native")
                want = reference_reduce(np.stack(full), op)[4 * r:4 * r + 4]
                rep.check(close(rs, want), f"native reduce_scatter {dtype} {op.name}: "
                                           f"{rs} != {want}")
    # int16 storage through the communicator: right, or refused on every rank (the
    # transport cannot tell int16 from bfloat16 unless told), never garbage
    x16 = np.full(5, r + 1, np.int16)
    try:
        comm.all_reduce(x16, algorithm="native")
        rep.check(bool((x16 == n * (n + 1) // 2).all()), f"native int16 via comm: {x16}")
    except ArgumentError as exc:
        rep.check("dtype=" in str(exc) and (x16 == r + 1).all(), f"native int16: {exc}")
    comm.barrier()
    # bfloat16 has int16 storage: the transport must be told (the communicator does not
    # pass ringlet's dtype to native() yet, so this calls the transport directly); only
    # at N <= 2, where importing torch on every rank costs little
    if n > 2:
        return
    try:
        import torch
    except ImportError:
        return
    t = comm._t
    assert isinstance(t, tm.MpiTransport)
    for bop, value in ((ReduceOp.SUM, n * (n + 1) / 2), (ReduceOp.MAX, float(n)),
                       (ReduceOp.MIN, 1.0)):
        b = torch.full((9,), float(r + 1), dtype=torch.bfloat16)
        flat = b.view(torch.int16).numpy()
        t.native("all_reduce", 0, 9, {1: flat}, bop, lambda: "bfloat16 test",
                 dtype="bfloat16")
        rep.check(bool((b.float() == value).all()), f"native bfloat16 {bop.name}: {b}")
    b = torch.full((4,), 1.5, dtype=torch.bfloat16)
    try:
        comm.all_reduce(b, algorithm="native")
        rep.check(bool((b.float() == 1.5 * n).all()), f"native bfloat16 via comm: {b}")
    except ArgumentError as exc:
        rep.check("dtype=" in str(exc), f"native bfloat16 via comm: {exc}")


def native_ops_exhausted(comm: Communicator, rep: Report) -> None:
    """mpi4py makes at most 32 user-defined ops a process.  Rank 0 takes every one left,
    then all ranks ask for a native MINLOC (which needs one): rank 0 refuses the call
    before it starts ("<collective> on rank 0: algorithm 'native': ..."), the others
    hear of it (a MismatchError naming rank 0, not a hang in MPI's collective), and
    the next native call, on MPI's own SUM, works on every rank.  Last in the suite:
    rank 0 has no user-defined op left afterwards."""
    from mpi4py import MPI

    r = comm.rank
    taken = []
    if r == 0:
        while len(taken) < 64:
            try:
                taken.append(MPI.Op.Create(lambda a, b, t: None, commute=True))
            except RuntimeError:
                break
    p = ringlet.pairs(np.array([float(r)]), np.array([r], np.int64))
    try:
        comm.all_reduce(p, op="minloc", algorithm="native")
        err: RingletError | None = None
    except RingletError as exc:
        err = exc
    if r == 0:
        rep.check(isinstance(err, ArgumentError) and "all_reduce on rank 0: algorithm "
                  "'native': the MPI engine cannot reduce" in str(err),
                  f"native MINLOC with no user op left: {err!r}")
    else:
        rep.check(isinstance(err, MismatchError) and "rank 0" in str(err),
                  f"native MINLOC refused on rank 0: {err!r}")
    x = np.full(3, float(r))
    comm.all_reduce(x, algorithm="native")
    rep.check(bool((x == comm.size * (comm.size - 1) / 2).all()),
              f"native SUM after a refused call: {x}")


def bit_identical(comm: Communicator, rep: Report) -> None:
    """After an all_reduce every rank holds the same bits (compared via all_gather)."""
    for name in ("ring", "recursive_doubling", "double_binary_tree", "native", None):
        for dtype in ("float32", "complex64"):
            x = make(dtype, 10_001, comm.rank, salt=99)
            comm.all_reduce(x, algorithm=name)
            rows = comm.all_gather(x.view(np.uint8))
            same = all(np.array_equal(rows[0], rows[q]) for q in range(comm.size))
            rep.check(same, f"all_reduce {name} {dtype}: ranks hold different bits")
    # MIN/MAX of +0.0 and -0.0 (and NaN payloads) do not commute bit for bit: MPI runs
    # ringlet's kernel as an op it must not reorder, else ranks got different zeros
    for op in ("min", "max"):
        z = np.random.default_rng([comm.rank, 7]).choice([0.0, -0.0], 64)
        comm.all_reduce(z, op=op, algorithm="native")
        rows = comm.all_gather(z.view(np.uint8))
        rep.check(all(np.array_equal(rows[0], rows[q]) for q in range(comm.size)),
                  f"native all_reduce {op} of signed zeros: ranks hold different bits")
    x = make("float32", 1000, comm.rank, salt=98)
    y = x.copy()
    comm.all_reduce(x, algorithm="native", op="avg")
    want = reference_reduce(np.stack([make("float32", 1000, q, salt=98)
                                      for q in range(comm.size)]), ReduceOp.AVG)
    rep.check(close(x, want), "native all_reduce AVG")
    out = np.empty_like(y)
    comm.all_reduce(y, out=out, algorithm="native")
    rep.check(np.array_equal(y, make("float32", 1000, comm.rank, salt=98)),
              "native all_reduce out=: x changed")


def p2p(comm: Communicator, rep: Report) -> None:
    """send/recv/isend/irecv with tags, unexpected messages, sizes 0 and large, self."""
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    # two tags sent in one order, received in the other: the first is unexpected
    comm.send(np.arange(5, dtype=np.float64) + r, right, tag=7)
    comm.send(np.arange(1000, dtype=np.int32) * (r + 1), right, tag=3)
    b = np.empty(1000, np.int32)
    comm.recv(b, left, tag=3)
    rep.check(np.array_equal(b, np.arange(1000, dtype=np.int32) * (left + 1)), "p2p tag 3")
    a = np.empty(5, np.float64)
    comm.recv(a, left, tag=7)
    rep.check(np.array_equal(a, np.arange(5.0) + left), "p2p tag 7 (unexpected)")
    # a receive posted before the send; a large message (pieces); an empty one
    w = comm.irecv(big := np.empty(600_000, np.float64), left, tag=11)
    z = comm.irecv(np.empty(0, np.float32), left, tag=12)
    comm.barrier()
    s1 = comm.isend(np.full(600_000, r, np.float64), right, tag=11)
    s2 = comm.isend(np.empty(0, np.float32), right, tag=12)
    w.wait()
    z.wait()
    s1.wait()
    s2.wait()
    rep.check(bool((big == left).all()), "p2p large message")
    # to itself
    me = comm.isend(np.array([r, 42]), r, tag=5)
    got = comm.recv(np.empty(2, np.int64), r, tag=5)
    me.wait()
    rep.check(got.tolist() == [r, 42], f"p2p to self: {got}")
    # a receive whose buffer does not match: ArgumentError, and the stream stays in step
    comm.send(np.array([1, 2, 3], np.int32), right, tag=20)
    comm.send(np.array([4.5], np.float64), right, tag=21)
    rep.expect_raise(ArgumentError, lambda: comm.recv(np.empty(3, np.float32), left, tag=20),
                     f"from rank {left}", "3 x int32")
    rep.check(comm.recv(np.empty(1), left, tag=21)[0] == 4.5, "p2p after a mismatch")
    # an asynchronous collective (worker thread) while this thread sends and receives
    x = np.ones(200_000, np.float32)
    work = comm.all_reduce(x, async_op=True)
    for i in range(20):
        comm.send(np.array([i, r]), right, tag=30)
        v = comm.recv(np.empty(2, np.int64), left, tag=30)
        rep.check(v.tolist() == [i, left], f"p2p beside async work: {v}")
    work.wait()
    rep.check(bool((x == n).all()), "async all_reduce beside p2p")


def raw_transport(comm: Communicator, rep: Report) -> None:
    """The transport's own messages: parts, reduce on arrival, empty, sizes that differ."""
    from mpi4py import MPI

    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    t = tm.MpiTransport(MPI.COMM_WORLD, comm.settings)
    rep.check(t.rank == r and t.size == n and t.caps.native and t.caps.engine == "mpi",
              "transport rank/size/caps")
    what = lambda: "raw test"  # noqa: E731
    # several parts into several typed parts
    src = np.arange(10, dtype=np.float32) + r
    s = t.isend(right, [src[:3].view(np.uint8), src[3:3].view(np.uint8),
                        src[3:].view(np.uint8)])
    dst = np.zeros(10, np.float32)
    q = t.irecv(left, [dst[:6], dst[6:]])
    t.wait([s, q], what)
    rep.check(np.array_equal(dst, np.arange(10, dtype=np.float32) + left), f"parts: {dst}")
    # reduce on arrival, many pieces when --pieces
    m = 50_000
    src = np.full(m, r + 1, np.int64)
    acc = np.full(m, 100, np.int64)
    s = t.isend(right, [src.view(np.uint8)])
    def add(d: np.ndarray, x: np.ndarray) -> None:
        np.add(d, x, out=d)

    q = t.irecv(left, [acc[:m // 2], acc[m // 2:]], add)
    t.wait([s, q], what)
    rep.check(bool((acc == 100 + left + 1).all()), "reduce on arrival")
    # one part, received in place, on the p2p channel (advanced by its owner)
    s = t.isend(right, [src.view(np.uint8)], P2P)
    into = np.empty(m, np.int64)
    q = t.irecv(left, [into], None, P2P)
    t.wait([s, q], what)
    rep.check(bool((into == left + 1).all()), "p2p channel message")
    # an empty message is never sent: both requests are done at once
    e1 = t.isend(right, [np.empty(0, np.uint8)])
    e2 = t.irecv(left, [np.empty(0, np.float32)])
    rep.check(e1.done and e2.done, "empty message not done at once")
    # ranks that disagree about a size: an error on the receiver, not garbage (odd ranks
    # expect more bytes than arrive, even ranks fewer)
    if n > 1:
        s = t.isend(right, [np.zeros(16, np.uint8)])
        q = t.irecv(left, [np.zeros(8 if r % 2 else 2, np.float32)])
        why = "16 bytes arrived, 32 expected" if r % 2 else "more than the 8 bytes expected"
        rep.expect_raise(RingletError, lambda: t.wait([q], what), "does not fit",
                         f"from rank {left}", why)
        # the failed receive keeps its error and leaves the others' progress alone (it used
        # to be tested again there: "0 bytes arrived", raised in a later wait on the send)
        t.progress()
        rep.check(not q.done, "a failed receive is not done")
        rep.expect_raise(RingletError, lambda: t.wait([q], what), "does not fit", why)
        t.wait([s], what)
    # an error MPI reports on a message becomes a PeerError naming the peer, and every
    # later check() raises it
    err = t._engine_error(right, MPI.Exception(MPI.ERR_OTHER), "to")
    rep.check(isinstance(err, PeerError) and str(err).startswith(f"rank {right} failed"),
              f"engine error: {err!r}")
    rep.expect_raise(PeerError, lambda: t.check([]), f"rank {right} failed or died")
    t.close()
    t.close()   # idempotent
    rep.expect_raise(RingletError, lambda: t.isend(right, [np.zeros(4, np.uint8)]), "closed")
    if n == 1:
        return
    # a peer's close and abort reach the others' check()
    t1 = tm.MpiTransport(MPI.COMM_WORLD, comm.settings)
    t2 = tm.MpiTransport(MPI.COMM_WORLD, comm.settings.replace(timeout=5.0))
    if r == n - 1:
        t1.calls = lambda: (0, 5)   # it closes after finishing 5 calls
        t1.mark_closed()
        t2.abort(f"rank {r} gave up on purpose", timeout=True)
        rep.expect_raise(CommTimeoutError, lambda: t2.check(), "gave up on purpose")
    else:
        _until_raises(rep, lambda: t1.check([n - 1], "the raw test"), PeerError,
                      f"rank {n - 1} closed the communicator", "while the raw test waited")
        # an error in call 6 and between calls, not in call 5 (the closed rank finished it)
        t1.calls = lambda: (5, 4)
        t1.check([n - 1], "call 5")
        t1.calls = lambda: (6, 5)
        rep.expect_raise(PeerError, lambda: t1.check([n - 1], "call 6"), "closed")
        _until_raises(rep, lambda: t2.check(), CommTimeoutError,
                      f"rank {n - 1} gave up on purpose")
        t1.check([q for q in range(n - 1) if q != r])   # the others did not close
    comm.barrier()
    t1.close()
    t2.close()


def _until_raises(rep: Report, fn: Any, exc: type[BaseException], *needles: str) -> None:
    end = time.monotonic() + 10
    while time.monotonic() < end:
        try:
            fn()
        except exc as e:
            missing = [s for s in needles if s not in str(e)]
            rep.check(not missing, f"{type(e).__name__} lacks {missing}: {e}")
            return
        time.sleep(0.005)
    rep.fail(f"{exc.__name__} never raised (needles {needles})")


def main() -> None:
    pieces = "--pieces" in sys.argv
    if pieces:
        tm.PIECE_BYTES = 4160
    comm = communicator()
    rep = Report(comm, "mpi_suite" + (" --pieces" if pieces else ""))
    assert comm._t.caps.engine == "mpi" and COLL == 0
    start = time.monotonic()
    guarded(rep, "every algorithm", lambda: every_algorithm(comm, rep))
    t1 = time.monotonic()
    guarded(rep, "native semantics", lambda: native_semantics(comm, rep))
    guarded(rep, "bit identical", lambda: bit_identical(comm, rep))
    t2 = time.monotonic()
    guarded(rep, "p2p", lambda: p2p(comm, rep))
    guarded(rep, "raw transport", lambda: raw_transport(comm, rep))
    guarded(rep, "native ops exhausted", lambda: native_ops_exhausted(comm, rep))
    t3 = time.monotonic()
    if comm.rank == 0:
        print(f"[mpi_suite] N={comm.size}: algorithms {t1 - start:.1f} s, native "
              f"{t2 - t1:.1f} s, p2p and transport {t3 - t2:.1f} s", flush=True)
    comm.close()
    rep.finish()


if __name__ == "__main__":
    main()
