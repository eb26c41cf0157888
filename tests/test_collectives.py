"""Every collective gives numpy's answer, at N = 1, 2, 3, 4, 5, 8.

Each body runs on every rank of a persistent world.  Every rank can build
every rank's input (seeded by rank), so each computes the numpy reference
locally and reports what differs; all_reduce results must also be
bit-identical across ranks.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pytest
from oracle import close, make, run_one

import ringlet
from ringlet.ops import DTYPES, ReduceOp, check_op, reference_reduce

NUMPY_DTYPES = [d for d in DTYPES if d != "bfloat16"]
OPS = list(ReduceOp)
COUNTS = [0, 1, 13, 1000]


def digest(a: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(a).view(np.uint8).tobytes()).hexdigest()


def valid_ops(dtype: str) -> list[ReduceOp]:
    ok = []
    for op in OPS:
        try:
            check_op(op, DTYPES[dtype])
            ok.append(op)
        except ringlet.ArgumentError:
            pass
    return ok


# --- all_reduce: every dtype, every valid op, in and out of place ----------------------------

def _all_reduce_matrix(comm: ringlet.Communicator) -> list[Any]:
    bad, digests = [], []
    n, r = comm.size, comm.rank
    for dtype in NUMPY_DTYPES:
        for op in valid_ops(dtype):
            for count in COUNTS:
                for inplace in (True, False):
                    x = make(dtype, count, r, op)
                    ref = reference_reduce(np.stack([make(dtype, count, q, op)
                                                     for q in range(n)]), op)
                    if inplace:
                        res = comm.all_reduce(x, op=op)
                        if res is not x:
                            bad.append(f"{dtype} {op.name}: in-place result is not x")
                    else:
                        out = np.empty_like(x)
                        keep = x.copy()
                        res = comm.all_reduce(x, op=op, out=out)
                        if res is not out or not np.array_equal(x, keep):
                            bad.append(f"{dtype} {op.name}: out-of-place changed x or "
                                       f"returned the wrong buffer")
                    if not close(res, ref):
                        bad.append(f"{dtype} {op.name} count {count} inplace {inplace}: "
                                   f"{res[:4]} != {ref[:4]}")
                    digests.append(digest(res))
    return [bad, digests]


def test_all_reduce_every_dtype_and_op(world: Any) -> None:
    res = world.run(_all_reduce_matrix)
    for r, (bad, _) in enumerate(res):
        assert not bad, f"rank {r}: " + "\n".join(bad[:10])
    first = res[0][1]
    for r, (_, digests) in enumerate(res):
        assert digests == first, f"rank {r} holds different bits than rank 0"


# --- every algorithm of every collective -----------------------------------------------------

ALGO_DTYPES = ["float32", "int64", "complex128", "uint8"]
ALGO_COUNTS = [1, 7, 1000]
BIG = 70_001   # x 4 B spans several shared-memory slots: run for float32 only


def _algorithms(comm: ringlet.Communicator, collective: str) -> list[str]:
    n = comm.size
    bad: list[str] = []
    roots = sorted({0, n - 1, n // 2})
    for name in ringlet.algorithms(collective):
        for dtype in ALGO_DTYPES:
            op = ReduceOp.SUM if dtype != "uint8" else ReduceOp.MAX
            for count in ALGO_COUNTS + ([BIG] if dtype == "float32" else []):
                for root in (roots if collective in ("broadcast", "reduce", "scatter",
                                                     "gather") else [0]):
                    try:
                        err = run_one(comm, collective, name, dtype, op, count, root)
                    except ringlet.RingletError as exc:
                        err = f"raised {type(exc).__name__}: {exc}"
                    if err:
                        bad.append(f"{collective}/{name} {dtype} count {count} root {root}: "
                                   f"{err}")
                        if len(bad) > 5:
                            return bad
    return bad


@pytest.mark.parametrize("collective", ["all_reduce", "broadcast", "reduce", "all_gather",
                                        "reduce_scatter", "all_to_all", "scatter", "gather",
                                        "scan", "exscan"])
def test_every_algorithm(world: Any, collective: str) -> None:
    res = world.run(_algorithms, collective)
    for r, bad in enumerate(res):
        assert not bad, f"rank {r}: " + "\n".join(bad)


# --- shapes, out=, empty and torch -----------------------------------------------------------

def _shapes(comm: ringlet.Communicator) -> list[str]:
    n, r = comm.size, comm.rank
    bad = []
    x = np.full((2, 3), r, np.float32)
    g = comm.all_gather(x)
    if g.shape != (n, 2, 3) or not all((g[q] == q).all() for q in range(n)):
        bad.append(f"all_gather shape/values {g.shape}")
    out = np.empty((n, 2, 3), np.float32)
    if comm.all_gather(x, out=out) is not out:
        bad.append("all_gather out= not returned")
    rs = comm.reduce_scatter(np.ones((2 * n, 3), np.int32))
    if rs.shape != (2, 3) or not (rs == n).all():
        bad.append(f"reduce_scatter shape {rs.shape}")
    e = np.empty((0, 4), np.float64)
    comm.all_reduce(e)
    if comm.all_gather(e).shape != (n, 0, 4):
        bad.append("empty all_gather shape")
    s = comm.all_gather(np.full((), r, np.float64))
    if s.shape != (n,):
        bad.append(f"0-d all_gather shape {s.shape}")
    # out= a view of x's memory in another shape is in place, and it is out= that returns
    # (it returned x, of x's shape)
    for call in ("all_reduce", "reduce", "scan", "exscan"):
        v = np.full(4, 1.0)
        o = v.reshape(2, 2)
        got = getattr(comm, call)(v, out=o)
        if (call != "reduce" or r == 0) and (got is not o or got.shape != (2, 2)):
            bad.append(f"{call} out= a view: returned {getattr(got, 'shape', got)}")
    return bad


def test_shapes_out_and_empty(world: Any) -> None:
    for r, bad in enumerate(world.run(_shapes)):
        assert not bad, f"rank {r}: {bad}"


def _torch(comm: ringlet.Communicator) -> list[str]:
    import torch

    n, r = comm.size, comm.rank
    bad = []
    for dt in (torch.float32, torch.float64, torch.int64, torch.bfloat16, torch.float16,
               torch.int8, torch.bool, torch.complex64):
        t = (torch.arange(6) + r).to(dt) if dt != torch.bool else torch.tensor(
            [r % 2 == 0, True, False])
        ref = sum((torch.arange(6) + q).to(torch.float64) for q in range(n)) \
            if dt != torch.bool else None
        res = comm.all_reduce(t)
        if res is not t:
            bad.append(f"{dt}: all_reduce did not return the tensor")
        if ref is not None and not torch.allclose(res.to(torch.float64).real, ref,
                                                  rtol=1e-2):
            bad.append(f"{dt}: {res} != {ref}")
        g = comm.all_gather(t)
        if not isinstance(g, torch.Tensor) or g.dtype != dt or tuple(g.shape) != (n, *t.shape):
            bad.append(f"{dt}: all_gather gave {type(g).__name__} {getattr(g, 'shape', '')}")
    b = torch.full((4,), 1.5, dtype=torch.bfloat16) * (r + 1)
    comm.all_reduce(b, op="max")
    if not (b == 1.5 * n).all():
        bad.append(f"bfloat16 max {b}")
    w = torch.ones(3, requires_grad=True)
    comm.broadcast(w.data)
    return bad


def test_torch_tensors(world: Any) -> None:
    pytest.importorskip("torch")
    for r, bad in enumerate(world.run(_torch)):
        assert not bad, f"rank {r}: {bad}"


# --- point to point, objects, barrier, async, split -------------------------------------------

def _p2p(comm: ringlet.Communicator) -> list[str]:
    n, r = comm.size, comm.rank
    bad = []
    right, left = (r + 1) % n, (r - 1) % n
    # tags are matched, not order: send tag 2 then tag 1, receive 1 then 2
    big = np.arange(400_000, dtype=np.float64) + r   # larger than the channel
    w2 = comm.isend(np.full(3, 10 * r + 2, np.int32), right, tag=2)
    w1 = comm.isend(np.full(3, 10 * r + 1, np.int32), right, tag=1)
    wb = comm.isend(big, right, tag=3)
    a, b = np.empty(3, np.int32), np.empty(3, np.int32)
    comm.recv(a, left, tag=1)
    comm.recv(b, left, tag=2)
    got = np.empty_like(big)
    comm.recv(got, left, tag=3)
    for w in (w1, w2, wb):
        w.wait()
    if not (a == 10 * left + 1).all() or not (b == 10 * left + 2).all():
        bad.append(f"tag matching: {a} {b}")
    if not np.array_equal(got, np.arange(400_000, dtype=np.float64) + left):
        bad.append("big message corrupted")
    # send to self
    s = comm.isend(np.arange(5), r, tag=9)
    me = np.empty(5, np.int64)
    comm.recv(me, r, tag=9)
    s.wait()
    if not np.array_equal(me, np.arange(5)):
        bad.append("send to self")
    # a receive posted before the send
    rw = comm.irecv(np.empty(2, np.float32), left, tag=4)
    comm.send(np.full(2, r, np.float32), right, tag=4)
    if not (rw.wait() == left).all():
        bad.append("irecv before send")
    # wrong size: a clear error at the receiver, and the stream stays usable
    comm.send(np.zeros(4, np.float32), right, tag=5)
    try:
        comm.recv(np.empty(3, np.float32), left, tag=5)
        bad.append("size mismatch not detected")
    except ringlet.ArgumentError as exc:
        if "holds 4 x float32" not in str(exc):
            bad.append(f"size mismatch message: {exc}")
    comm.send(np.full(1, 7, np.int8), right, tag=6)
    z = comm.recv(np.empty(1, np.int8), left, tag=6)
    if z[0] != 7:
        bad.append("stream broken after a size mismatch")
    comm.barrier()
    return bad


def test_point_to_point(world: Any) -> None:
    for r, bad in enumerate(world.run(_p2p)):
        assert not bad, f"rank {r}: {bad}"


def _p2p_many_small(comm: ringlet.Communicator) -> list[str]:
    """More small messages in flight to one peer than its channel has slots (4): empty
    ones, ones that travel inside their header (up to 192 B) and ones just past that."""
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    sizes = [0, 1, 8, 0, 48, 49, 0, 2, 100, 3]     # float32 elements: 0..400 B
    works = [comm.isend(np.full(k, 100 * r + i, np.float32), right, tag=i)
             for i, k in enumerate(sizes)]
    bad = []
    for i in reversed(range(len(sizes))):    # tags matched, not arrival order
        got = comm.recv(np.empty(sizes[i], np.float32), left, tag=i)
        if not (got == 100 * left + i).all():
            bad.append(f"tag {i}: {got}")
    for w in works:
        w.wait()
    comm.barrier()
    return bad


def test_more_small_messages_in_flight_than_slots(world: Any) -> None:
    for r, bad in enumerate(world.run(_p2p_many_small)):
        assert not bad, f"rank {r}: {bad}"


def _misc(comm: ringlet.Communicator) -> list[str]:
    n, r = comm.size, comm.rank
    bad = []
    objs = comm.all_gather_object({"rank": r, "payload": "x" * r})
    if objs != [{"rank": q, "payload": "x" * q} for q in range(n)]:
        bad.append(f"all_gather_object {objs}")
    got = comm.broadcast_object(("hello", [1, 2]) if r == n - 1 else None, root=n - 1)
    if got != ("hello", [1, 2]):
        bad.append(f"broadcast_object {got}")
    comm.barrier()
    # async work completes in order, results as the sync call's
    xs = [np.full(5, r + i, np.float64) for i in range(4)]
    works = [comm.all_reduce(x, async_op=True) for x in xs]
    y = np.full(2, r, np.int64)
    comm.all_reduce(y)   # a sync call after async ones waits its turn
    for i, w in enumerate(works):
        res = w.wait()
        if not w.is_completed() or not np.allclose(res, sum(q + i for q in range(n))):
            bad.append(f"async {i}: {res}")
    if not (y == sum(range(n))).all():
        bad.append(f"sync after async: {y}")
    # split: even and odd ranks, ordered by descending key
    sub = comm.split(r % 2, key=-r)
    members = [q for q in range(n) if q % 2 == r % 2][::-1]
    if sub is None or sub.size != len(members) or sub.rank != members.index(r):
        bad.append(f"split gave {sub}")
    elif sub.all_gather_object(r) != members:
        bad.append("split order")
    else:
        x = np.array([r], np.int64)
        sub.all_reduce(x)
        if x[0] != sum(members):
            bad.append(f"sub all_reduce {x}")
        sub.close()
    none = comm.split(None if r == 0 else 1)
    if (none is None) != (r == 0):
        bad.append("split with color None")
    if none is not None:
        none.close()
    return bad


def test_objects_async_split(world: Any) -> None:
    for r, bad in enumerate(world.run(_misc)):
        assert not bad, f"rank {r}: {bad}"


def _group(comm: ringlet.Communicator) -> list[str]:
    """comm.group(ranks): members numbered in the list's order, None elsewhere; a bad
    list, then a good call, then ranks that disagree, then a good call."""
    n, r = comm.size, comm.rank
    bad = []

    def still_works(after: str) -> None:
        x = np.ones(3)
        comm.all_reduce(x)
        if x[0] != n:
            bad.append(f"all_reduce after {after}")

    want = list(range(n))[::-2]             # e.g. N=5: [4, 2, 0]
    sub = comm.group(want)
    if (sub is None) != (r not in want):
        bad.append(f"group membership {sub}")
    if sub is not None:
        if (sub.rank, sub.size) != (want.index(r), len(want)):
            bad.append(f"group numbering {sub.rank}/{sub.size}")
        x = np.array([r], np.int64)
        sub.all_reduce(x)
        if x[0] != sum(want):
            bad.append(f"group all_reduce {x}")
        sub.close()
    # rank 0's bad ranks: out of range, and not ints (1.7 was taken for 1, "0" for 0)
    for what, ranks, says in (("a rank out of range", [0, n], "out of range"),
                              ("a float rank", [0, 1.7] if n > 1 else ["0"], "must be ints")):
        try:
            comm.group(ranks if r == 0 else [0])
        except (ringlet.ArgumentError, ringlet.MismatchError) as exc:
            if r == 0 and not (isinstance(exc, ringlet.ArgumentError) and says in str(exc)):
                bad.append(f"rank 0's error for {what}: {exc}")
        else:
            bad.append(f"{what}: no error")
        still_works(f"a group of {what}")
    if n > 1:
        try:
            comm.group([0] if r == 0 else [0, 1])
        except ringlet.MismatchError as exc:
            if "group" not in str(exc):
                bad.append(f"mismatch message: {exc}")
        else:
            bad.append("ranks that disagree: no error")
    still_works("a mismatched group")
    return bad


def test_group_from_a_rank_list(world: Any) -> None:
    for r, bad in enumerate(world.run(_group)):
        assert not bad, f"rank {r}: {bad}"


def _group_errors(comm: ringlet.Communicator) -> list[str]:
    """Errors on a group number ranks as the group does, and say what they are in the
    world: a bad argument, a mismatch and a bad peer, each followed by a good call; the
    world's own errors have no such note."""
    n, r = comm.size, comm.rank
    members = [q for q in range(n) if q % 2 == r % 2]
    sub = comm.split(r % 2)
    assert sub is not None
    # (none where the group's numbering is the world's: rank 0 alone)
    legend = f"world rank{'s' if len(members) > 1 else ''} {', '.join(map(str, members))}]" \
        if members != list(range(len(members))) else ""
    bad = []

    def check(what: str, fn: Any, kind: type[BaseException]) -> None:
        try:
            fn()
        except kind as exc:
            if not str(exc).endswith(legend) or str(exc).count("[") > 1 + bool(legend) \
                    or (not legend and "world rank" in str(exc)):
                bad.append(f"{what}: {exc}")
        else:
            if kind is not ringlet.MismatchError or sub.size > 1:
                bad.append(f"{what}: no error")
        x = np.full(3, float(r))
        sub.all_reduce(x)
        if x.tolist() != [float(sum(members))] * 3:
            bad.append(f"after {what}: {x}")

    check("a bad op", lambda: sub.all_reduce(np.ones(2), op="median"), ringlet.ArgumentError)
    check("a mismatch", lambda: sub.all_reduce(np.ones(2 + (sub.rank == sub.size - 1))),
          ringlet.MismatchError)
    check("a bad peer", lambda: sub.send(np.ones(1), dst=sub.size), ringlet.ArgumentError)
    try:
        comm.all_reduce(np.ones(2), op="median")
    except ringlet.ArgumentError as exc:
        if "[ranks here" in str(exc):
            bad.append(f"the world's error: {exc}")
    sub.close()
    return bad


def test_errors_on_a_group_name_its_ranks_in_the_world(world: Any) -> None:
    for r, bad in enumerate(world.run(_group_errors)):
        assert not bad, f"rank {r}: {bad}"


def _logical(comm: ringlet.Communicator) -> list[Any]:
    """LAND, LOR, LXOR give 0 or 1 in the buffer's type, at every size (N = 1 included)."""
    r = comm.rank
    out = []
    for op in ("land", "lor", "lxor"):
        x = np.array([5, 0, r, 7 * (r % 2)], np.int32)
        comm.all_reduce(x, op=op)
        out.append(x.tolist())
    return out


def test_logical_ops(world: Any) -> None:
    n = world.size
    ranks = range(n)
    want = [
        [1, 0, int(all(ranks)), int(all(q % 2 for q in ranks))],
        [1, 0, int(any(ranks)), int(any(q % 2 for q in ranks))],
        [n % 2, 0, sum(1 for q in ranks if q) % 2, sum(q % 2 for q in ranks) % 2],
    ]
    for r, got in enumerate(world.run(_logical)):
        assert got == want, f"rank {r}: {got} != {want}"
