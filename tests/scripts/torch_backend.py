"""torch.distributed's own API on the ringlet backend (run under torchrun or env://).

Every operation of the backend against the answer computed here, async work,
futures, a subgroup, point-to-point with tags, the object collectives, errors
that must be clear, and DDP: the same model trained on ringlet and on gloo
(a gloo group in the same job) ends with the same weights, identical on every
rank.  Prints ``[rank r] ok`` or ``[rank r] FAILED: ...`` and exits 0 or 1.
Arguments the backend refuses on one rank only fail on every rank, between good calls.
Flags: ``--ddp-only``, ``--no-ddp``.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import threading
import time
import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringlet
import ringlet.torch  # noqa: F401 - registers the backend

warnings.filterwarnings("ignore", category=FutureWarning)


def check(bad: list[str], ok: bool, what: str) -> None:
    if not ok:
        bad.append(what)


def operations(r: int, n: int, bad: list[str]) -> None:
    t = torch.full((5,), float(r + 1))
    dist.all_reduce(t)
    check(bad, t.tolist() == [n * (n + 1) / 2] * 5, f"all_reduce sum {t}")
    for op, want in ((dist.ReduceOp.MAX, n), (dist.ReduceOp.MIN, 1),
                     (dist.ReduceOp.PRODUCT, float(torch.arange(1, n + 1).prod())),
                     (dist.ReduceOp.AVG, (n + 1) / 2)):
        t = torch.full((4,), float(r + 1))
        dist.all_reduce(t, op=op)
        check(bad, abs(t[0].item() - want) < 1e-6, f"all_reduce {op}: {t}")
    for op, want in ((dist.ReduceOp.BAND, 0 if n > 1 else 1), (dist.ReduceOp.BOR, 1)):
        t = torch.full((3,), 1 if r == 0 else 0, dtype=torch.int64)
        dist.all_reduce(t, op=op)
        check(bad, t[0].item() == want, f"all_reduce {op}: {t}")
    t = torch.full((3,), r + 1, dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.BXOR)
    x = 0
    for q in range(n):
        x ^= q + 1
    check(bad, t[0].item() == x, f"all_reduce BXOR: {t}")
    bf = torch.full((8,), float(r + 1), dtype=torch.bfloat16)
    dist.all_reduce(bf)
    check(bad, bf.float()[0].item() == n * (n + 1) / 2, f"all_reduce bfloat16: {bf}")
    root = 1 % n
    b = torch.arange(6.0) if r == root else torch.zeros(6)
    dist.broadcast(b, root)
    check(bad, b.tolist() == list(range(6)), f"broadcast {b}")
    outs = [torch.empty(3) for _ in range(n)]
    dist.all_gather(outs, torch.full((3,), float(r)))
    check(bad, [o[0].item() for o in outs] == list(range(n)), f"all_gather {outs}")
    big = torch.empty(3 * n)
    dist.all_gather_into_tensor(big, torch.full((3,), float(r)))
    check(bad, big.tolist() == [float(q) for q in range(n) for _ in range(3)],
          f"all_gather_into_tensor {big}")
    big = torch.zeros(3 * n)       # in place, as FSDP2 calls it: the input is this rank's block
    mine = big[3 * r:3 * r + 3]
    mine.fill_(float(r))
    dist.all_gather_into_tensor(big, mine)
    check(bad, big.tolist() == [float(q) for q in range(n) for _ in range(3)],
          f"in-place all_gather_into_tensor {big}")
    x = torch.arange(2.0 * n)      # in place: the output is this rank's block of the input
    dist.reduce_scatter_tensor(x[2 * r:2 * r + 2], x)
    check(bad, x[2 * r:2 * r + 2].tolist() == [2.0 * r * n, (2.0 * r + 1) * n],
          f"in-place reduce_scatter_tensor {x}")
    check(bad, dist.group.WORLD.group_name == dist.distributed_c10d._world.pg_names[
        dist.group.WORLD], "the group has no name (DeviceMesh and FSDP2 ask for it)")
    o = torch.empty(2)
    dist.reduce_scatter(o, [torch.full((2,), float(10 * q + r)) for q in range(n)])
    check(bad, o.tolist() == [float(sum(10 * r + q for q in range(n)))] * 2,
          f"reduce_scatter {o}")
    o = torch.empty(2)
    dist.reduce_scatter_tensor(o, torch.arange(2.0 * n))
    check(bad, o.tolist() == [2.0 * r * n, (2.0 * r + 1) * n], f"reduce_scatter_tensor {o}")
    outs = [torch.empty(2) for _ in range(n)]
    dist.all_to_all(outs, [torch.full((2,), float(10 * r + q)) for q in range(n)])
    check(bad, [x[0].item() for x in outs] == [10.0 * q + r for q in range(n)],
          f"all_to_all {outs}")
    o = torch.empty(2 * n)
    dist.all_to_all_single(o, torch.tensor([float(10 * r + q) for q in range(n)
                                            for _ in range(2)]))
    check(bad, o.tolist() == [10.0 * q + r for q in range(n) for _ in range(2)],
          f"all_to_all_single {o}")
    # uneven: rank q sends (q + j) % 3 rows of 2 to rank j (MoE token routing); then
    # rank 0's splits all 2 (even on that rank alone) while the others' are not
    uneven = [[(q + j) % 3 for j in range(n)] for q in range(n)]
    for cnt in (uneven, [[2 if 0 in (q, j) else 1 + (q + j) % 2 for j in range(n)]
                         for q in range(n)]):
        x = torch.cat([torch.full((cnt[r][j], 2), float(10 * r + j)) for j in range(n)])
        o = torch.empty(sum(cnt[q][r] for q in range(n)), 2)
        dist.all_to_all_single(o, x, [cnt[q][r] for q in range(n)], cnt[r])
        want = torch.cat([torch.full((cnt[q][r], 2), float(10 * q + r)) for q in range(n)])
        check(bad, torch.equal(o, want), f"uneven all_to_all_single {cnt} {o.tolist()}")
        outs = [torch.empty(cnt[q][r]) for q in range(n)]
        dist.all_to_all(outs, [torch.full((cnt[r][j],), float(10 * r + j)) for j in range(n)])
        check(bad, all(torch.equal(outs[q], torch.full((cnt[q][r],), float(10 * q + r)))
                       for q in range(n)), f"uneven all_to_all {cnt} {outs}")
    sizes = [q % 3 + 1 for q in range(n)]   # all_gather of tensors of different sizes
    parts = [torch.empty(k) for k in sizes]
    dist.all_gather(parts, torch.full((sizes[r],), float(r)))
    check(bad, all(torch.equal(p, torch.full((k,), float(q)))
                   for q, (p, k) in enumerate(zip(parts, sizes, strict=True))),
          f"uneven all_gather {parts}")
    g = [torch.empty(2) for _ in range(n)] if r == root else None
    dist.gather(torch.full((2,), float(r)), g, root)
    if g is not None:
        check(bad, [x[0].item() for x in g] == list(range(n)), f"gather {g}")
    s = torch.empty(2)
    dist.scatter(s, [torch.full((2,), float(q)) for q in range(n)] if r == root else None,
                 root)
    check(bad, s.tolist() == [float(r)] * 2, f"scatter {s}")
    t = torch.full((3,), float(r))
    dist.reduce(t, root)
    if r == root:
        check(bad, t.tolist() == [float(sum(range(n)))] * 3, f"reduce {t}")
    dist.barrier()
    # async work, futures
    ts = [torch.full((1000,), float(r)) for _ in range(4)]
    works = [dist.all_reduce(x, async_op=True) for x in ts]
    for w in works:
        w.wait()
    check(bad, all(x[0].item() == sum(range(n)) for x in ts), "async all_reduce")
    fut = dist.all_reduce(torch.ones(10), async_op=True).get_future()
    check(bad, fut.wait()[0][0].item() == n, "future's value")
    chained = dist.all_reduce(torch.ones(4), async_op=True).get_future().then(
        lambda f: f.value()[0] * 2)
    check(bad, chained.wait()[0].item() == 2 * n, "future.then")
    # the process group's own methods in torch's short forms (DDP and Join call them so)
    pg = dist.distributed_c10d._get_default_group()
    short = [
        ("allreduce(tensor)", lambda: pg.allreduce(torch.ones(3)), [n] * 3),
        ("allreduce([t], MAX)", lambda: pg.allreduce([torch.ones(2) * (r + 1)],
                                                     dist.ReduceOp.MAX), [n] * 2),
        ("broadcast(tensor, root)", lambda: pg.broadcast(torch.ones(2) * (r + 1), n - 1),
         [n] * 2),
        ("broadcast([t])", lambda: pg.broadcast([torch.ones(2) * (r + 1)]), [1] * 2),
        ("reduce(tensor, root, MIN)", lambda: pg.reduce(torch.ones(2) * (r + 1), 0,
                                                         dist.ReduceOp.MIN), [1] * 2),
        # torch's keyword names for them
        ("allreduce(tensor, op=MAX)", lambda: pg.allreduce(torch.ones(2) * (r + 1),
                                                           op=dist.ReduceOp.MAX), [n] * 2),
        ("broadcast(tensor, root=)", lambda: pg.broadcast(torch.ones(2) * (r + 1),
                                                          root=n - 1), [n] * 2),
        ("reduce(tensor, root=, op=)", lambda: pg.reduce(torch.ones(2) * (r + 1), root=0,
                                                         op=dist.ReduceOp.MAX), [n] * 2),
    ]
    for what, call, want in short:
        res = call().result()
        if what.startswith("reduce") and r != 0:
            continue
        check(bad, res[0].tolist() == [float(v) for v in want], f"pg.{what}: {res}")
    outs = [torch.empty(2) for _ in range(n)]
    pg.allgather(outs, torch.full((2,), float(r))).wait()
    check(bad, [o[0].item() for o in outs] == list(range(n)), f"pg.allgather short: {outs}")
    # point-to-point with tags, messages that arrive before their receive
    if n > 1:
        right, left = (r + 1) % n, (r - 1) % n
        s5 = dist.isend(torch.full((3,), 10.0 * r + 5), right, tag=5)
        s3 = dist.isend(torch.full((3,), 10.0 * r + 3), right, tag=3)
        got3, got5 = torch.empty(3), torch.empty(3)
        dist.recv(got3, left, tag=3)
        dist.irecv(got5, left, tag=5).wait()
        s5.wait()
        s3.wait()
        check(bad, got3[0].item() == 10.0 * left + 3 and got5[0].item() == 10.0 * left + 5,
              f"p2p tags {got3} {got5}")
        # from any source: dist.recv(src=None) says who sent
        s9 = dist.isend(torch.full((2,), float(r)), right, tag=9)
        anyt = torch.empty(2)
        sender = dist.recv(anyt, tag=9)
        s9.wait()
        check(bad, sender == left and anyt[0].item() == float(left),
              f"recv from any source: {sender} {anyt}")
        # batch_isend_irecv
        back = torch.empty(2)
        for w in dist.batch_isend_irecv([dist.P2POp(dist.irecv, back, right, tag=4),
                                         dist.P2POp(dist.isend, torch.full((2,), float(r)),
                                                    left, tag=4)]):
            w.wait()
        check(bad, back[0].item() == float(right), f"batch_isend_irecv {back}")
    objs: list[object] = [None] * n
    dist.all_gather_object(objs, {"r": r})
    check(bad, objs == [{"r": q} for q in range(n)], f"all_gather_object {objs}")
    lst: list[object] = [{"x": 42}] if r == 0 else [None]
    dist.broadcast_object_list(lst, 0)
    check(bad, lst == [{"x": 42}], f"broadcast_object_list {lst}")
    # a subgroup
    if n > 2:
        sub = dist.new_group([0, 2])
        if r in (0, 2):
            t = torch.full((3,), float(r))
            dist.all_reduce(t, group=sub)
            check(bad, t.tolist() == [2.0] * 3, f"subgroup all_reduce {t}")
    # strided tensors (a transposed view) are taken, as gloo takes them
    base = torch.arange(6.0).reshape(2, 3) + r
    tv = base.t()
    dist.all_reduce(tv)
    want = (torch.arange(6.0).reshape(2, 3) * n + n * (n - 1) / 2).t()
    check(bad, torch.equal(tv, want) and torch.equal(base, want.t()),
          f"all_reduce of a transposed view {tv}")
    tv = (torch.zeros(2, 3) + r).t()
    dist.broadcast(tv, n - 1)
    check(bad, torch.equal(tv, torch.full((3, 2), float(n - 1))), f"broadcast strided {tv}")
    out = torch.zeros(2, 3).t()                       # a strided (3, 2) output
    dist.reduce_scatter_tensor(out, torch.ones(6 * n))
    check(bad, torch.equal(out, torch.full((3, 2), float(n))),
          f"reduce_scatter_tensor into a strided output {out}")
    # the futures' values are gloo's: a list of tensors for all_gather and gather
    outs = [torch.empty(2) for _ in range(n)]
    v = dist.all_gather(outs, torch.full((2,), float(r)), async_op=True).get_future().wait()
    check(bad, isinstance(v, list) and len(v) == n and all(torch.is_tensor(x) for x in v)
          and [x[0].item() for x in v] == [float(q) for q in range(n)],
          f"all_gather future value {v}")
    gl = [torch.empty(2) for _ in range(n)] if r == 0 else None
    v = dist.gather(torch.full((2,), float(r)), gl, dst=0, async_op=True).get_future().wait()
    check(bad, (isinstance(v, list) and len(v) == n and torch.is_tensor(v[0])) if r == 0
          else v == [], f"gather future value {v}")
    # clear errors, and the group still works after them
    for what, fn in (
            ("CUDA-less device", lambda: dist.all_reduce(torch.ones(2, device="meta"))),
            ("disagreeing split sizes", lambda: dist.all_to_all_single(
                torch.empty(n + 1), torch.empty(n + 1),
                [2] + [1] * (n - 1), [2] + [1] * (n - 1))),
            ("PREMUL_SUM", lambda: dist.all_reduce(
                torch.ones(2), op=dist._make_nccl_premul_sum(2.0)))):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - the check is on the message
            check(bad, "ringlet" in str(exc) or "split" in what and "counts" in str(exc),
                  f"{what}: unclear error {exc!r}")
        else:
            if n > 1 or what != "disagreeing split sizes":
                bad.append(f"{what}: no error")
    t = torch.ones(3)
    dist.all_reduce(t)
    check(bad, t.tolist() == [float(n)] * 3, "all_reduce after the errors")
    # ringlet's calls are named ranges in torch.profiler (async ones with all threads)
    from torch.profiler import ProfilerActivity, profile

    cfg = torch._C._profiler._ExperimentalConfig(profile_all_threads=True)
    with profile(activities=[ProfilerActivity.CPU], experimental_config=cfg) as prof:
        dist.all_reduce(torch.ones(256))
        dist.all_reduce(torch.ones(256), async_op=True).wait()
        dist.broadcast(torch.ones(4), 0)
    names = [e.name for e in prof.events() if e.name.startswith("ringlet ")]
    check(bad, len(names) == 3 and "all_reduce" in names[0] and "1024 B" in names[0]
          and "broadcast" in names[2], f"profiler ranges: {names}")
    # ringlet's own errors reach torch with ringlet's message: ranks that disagree
    if n > 1:
        try:
            dist.all_reduce(torch.ones(3 + (r == 0)))
        except Exception as exc:  # noqa: BLE001
            check(bad, "all_reduce" in str(exc) and "count" in str(exc).lower(),
                  f"mismatch message: {exc}")
        else:
            bad.append("mismatched counts: no error")


def functional(r: int, n: int, bad: list[str]) -> None:
    """torch's functional collectives (the C++ ops DTensor and tensor parallelism call),
    DTensor itself, and dist.all_reduce_coalesced: each reaches the backend's
    ``*_coalesced`` and ``all_to_all_single`` methods."""
    import torch.distributed._functional_collectives as fc
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    world = dist.group.WORLD

    def same(what: str, got: Any, want: Any) -> None:
        check(bad, torch.equal(got, want), f"{what}: {got.tolist()} != {want.tolist()}")

    same("functional all_reduce",
         fc.wait_tensor(fc.all_reduce(torch.ones(2) * (r + 1), "sum", world)),
         torch.full((2,), n * (n + 1) / 2))
    same("functional all_gather", fc.wait_tensor(fc.all_gather_tensor(
        torch.ones(2) * r, 0, world)), torch.arange(n).repeat_interleave(2).float())
    same("functional reduce_scatter", fc.wait_tensor(fc.reduce_scatter_tensor(
        torch.arange(2.0 * n), "sum", 0, world)), torch.tensor([2.0 * r, 2.0 * r + 1]) * n)
    same("functional all_to_all_single", fc.wait_tensor(fc.all_to_all_single(
        torch.arange(n) + 10 * r, None, None, world)), torch.arange(n) * 10 + r)
    # several tensors of several types gathered at once (one all_gather per type)
    got = [fc.wait_tensor(x) for x in fc.all_gather_into_tensor_coalesced(
        [torch.ones(1) * r, torch.tensor([r, r]), torch.tensor([r % 2 == 0])], world)]
    for g, want in zip(got, (torch.arange(n).float(), torch.arange(n).repeat_interleave(2),
                             torch.arange(n) % 2 == 0), strict=True):
        same("functional all_gather coalesced", g, want)
    got = [fc.wait_tensor(y) for y in fc.reduce_scatter_tensor_coalesced(
        [torch.arange(float(n)), torch.arange(2.0 * n)], "sum", [0, 0], world)]
    same("functional reduce_scatter coalesced", torch.cat(got),
         torch.tensor([r * n, 2.0 * r * n, (2.0 * r + 1) * n]))
    ts = [torch.ones(3), torch.ones(2) * r]
    dist.all_reduce_coalesced(ts)
    same("all_reduce_coalesced", torch.cat(ts),
         torch.tensor([float(n)] * 3 + [float(sum(range(n)))] * 2))
    mesh = init_device_mesh("cpu", (n,))
    full = torch.arange(4.0 * n).reshape(2 * n, 2)
    d = distribute_tensor(full, mesh, [Shard(0)])
    same("DTensor full_tensor", d.full_tensor(), full)
    same("DTensor redistribute", d.redistribute(mesh, [Replicate()]).to_local(), full)
    same("DTensor sum", d.sum().full_tensor(), full.sum())


def one_rank_wrong(r: int, n: int, bad: list[str]) -> None:
    """Arguments that the backend's own checks refuse on one rank only (the last, or the
    root), each between two good calls: that rank gets ArgumentError saying why, the
    others a MismatchError quoting it, at once, and the next call pairs rightly (the
    refused call is numbered, as ringlet's own calls are)."""
    import torch.distributed._functional_collectives as fc

    last = n - 1
    me = r == last
    cases: list[tuple[str, Any, str]] = [
        ("all_gather list", lambda: dist.all_gather(
            [torch.empty(2) for _ in range(n + me)], torch.ones(2)), "tensors for"),
        ("device", lambda: dist.all_reduce(
            torch.ones(2, device="meta" if me else "cpu")), "CPU tensors"),
        ("op", lambda: dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0)
                                       if me else dist.ReduceOp.SUM), "no reduction"),
        ("split sizes", lambda: dist.all_to_all_single(
            torch.empty(n), torch.empty(n), [1] * (n + me), [1] * n), "split_sizes"),
        ("scatter list", lambda: dist.scatter(
            torch.empty(2), [torch.ones(2) for _ in range(n + 1)] if me else None,
            src=last), "tensors for"),
        ("uneven all_gather", lambda: dist.all_gather(
            [torch.empty(q + 1) for q in range(n)], torch.ones(r + 1 + me)), "elements"),
        ("expanded output", lambda: dist.all_reduce(
            torch.ones(1).expand(3) if me else torch.ones(3)), "share memory"),
        ("expanded output in a list", lambda: dist.all_gather(
            [torch.empty(1).expand(2) if me and q == 0 else torch.empty(2) for q in range(n)],
            torch.ones(2)), "share memory"),
        ("expanded all_to_all output", lambda: dist.all_to_all(
            [torch.empty(1).expand(2) if me and q == 0 else torch.empty(2) for q in range(n)],
            [torch.ones(2) for _ in range(n)]), "share memory"),
    ]
    for what, call, why in cases:
        t = torch.full((3,), float(r + 1))
        dist.all_reduce(t)
        try:
            call()
            bad.append(f"one rank wrong, {what}: no error")
        except ringlet.ArgumentError as exc:
            check(bad, me and why in str(exc), f"one rank wrong, {what}: {exc!r}")
        except ringlet.MismatchError as exc:
            check(bad, not me and why in str(exc) and f"rank {last}" in str(exc),
                  f"one rank wrong, {what}: {exc!r}")
        except Exception as exc:  # noqa: BLE001 - reported
            bad.append(f"one rank wrong, {what}: {exc!r}")
        u = torch.full((3,), float(r + 1))
        dist.all_reduce(u)
        check(bad, torch.equal(t, u) and u[0].item() == n * (n + 1) / 2,
              f"one rank wrong, {what}: the calls around it {t} {u}")


    # no tensors to reduce-scatter on the last rank, some on the others: every rank fails
    # at that call (the last rank made none: its next call paired with theirs)
    backend = dist.distributed_c10d._get_default_group()
    try:
        backend.reduce_scatter_tensor_coalesced(
            [] if me else [torch.empty(1)], [] if me else [torch.ones(n)]).wait()
        bad.append("reduce_scatter_tensor_coalesced of none on one rank: no error")
    except ringlet.MismatchError as exc:
        check(bad, f"rank {last}" in str(exc) or me, f"coalesced of none: {exc!r}")
    u = torch.ones(3)
    dist.all_reduce(u)
    check(bad, u[0].item() == n, "reduce_scatter_tensor_coalesced of none: the call after it")

    # ranks that disagree on a functional all_gather's element type: a MismatchError on
    # every rank (its tensors are gathered in their type, not as bytes), then a good call
    try:
        fc.wait_tensor(fc.all_gather_tensor(
            torch.ones(2, dtype=torch.int32 if me else torch.float32), 0, dist.group.WORLD))
        bad.append("functional all_gather of different dtypes: no error")
    except ringlet.MismatchError as exc:
        check(bad, "the first part's element type: rank" in str(exc) and "int32" in str(exc),
              f"functional all_gather dtype: {exc!r}")
    u = torch.ones(3)
    dist.all_reduce(u)
    check(bad, u[0].item() == n, "functional all_gather dtype: the call after it")

    # a call from a second thread on the last rank: an ArgumentError there, nothing numbered
    # or published (it published a rejection: every later call paired one off)
    if me:
        seen: list[BaseException] = []

        def other() -> None:
            try:
                dist.all_reduce(torch.ones(5))
            except BaseException as exc:  # noqa: BLE001 - checked below
                seen.append(exc)

        th = threading.Thread(target=other)
        th.start()
        th.join()
        check(bad, len(seen) == 1 and isinstance(seen[0], ringlet.ArgumentError) and
              "calls from two threads" in str(seen[0]), f"second thread: {seen!r}")
    for k in range(3):
        v = torch.full((2,), float(r + k))
        dist.all_reduce(v)
        check(bad, v[0].item() == n * (n - 1) / 2 + n * k,
              f"second thread: call {k} after it gave {v}")


def timeout(r: int, n: int, bad: list[str]) -> None:
    """A group's timeout is ringlet's deadline: rank 0 calls, the others do not; rank 0
    gets ringlet's CommTimeoutError naming them."""
    from datetime import timedelta

    sub = dist.new_group(list(range(n)), timeout=timedelta(seconds=1))
    if r == 0:
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4), group=sub)
        except ringlet.CommTimeoutError as exc:
            others = ", ".join(map(str, range(1, n)))
            check(bad, "did not arrive" in str(exc) and others in str(exc)
                  and time.monotonic() - t0 < 10, f"timeout message: {exc}")
        else:
            bad.append("a call nobody else made: no timeout")
    dist.barrier()


def ddp(r: int, n: int, bad: list[str]) -> None:
    """The same model on ringlet and on gloo: same weights after training."""
    gloo = dist.new_group(backend="gloo")
    torch.manual_seed(0)
    base = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                         nn.Linear(64, 4))
    if r == 0:  # rank 0's weights win at construction: DDP broadcasts them
        with torch.no_grad():
            for p in base.parameters():
                p.mul_(1.5)
    models = {}
    for name, pg in (("ringlet", None), ("gloo", gloo)):
        m = nn.Sequential(*[type(layer)(*(
            (layer.in_features, layer.out_features) if isinstance(layer, nn.Linear) else ()))
            for layer in base])
        m.load_state_dict(base.state_dict())
        models[name] = (DDP(m, process_group=pg, bucket_cap_mb=0.01), m)
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    models["ringlet"][0].register_comm_hook(None, default_hooks.allreduce_hook)
    opts = {k: torch.optim.SGD(v[0].parameters(), lr=0.05) for k, v in models.items()}
    g = torch.Generator().manual_seed(100 + r)
    for step in range(6):
        x, y = torch.randn(16, 32, generator=g), torch.randn(16, 4, generator=g)
        for k, (model, _) in models.items():
            opts[k].zero_grad()
            if step == 2:   # accumulate locally, then sync
                with model.no_sync():
                    nn.functional.mse_loss(model(x), y).backward()
            nn.functional.mse_loss(model(x), y).backward()
            opts[k].step()
    a = torch.cat([p.detach().reshape(-1) for p in models["ringlet"][1].parameters()])
    b = torch.cat([p.detach().reshape(-1) for p in models["gloo"][1].parameters()])
    check(bad, torch.allclose(a, b, rtol=1e-5, atol=1e-6),
          f"DDP weights differ from gloo's by {float((a - b).abs().max()):.3g}")
    everyone = [torch.empty_like(a) for _ in range(n)]
    dist.all_gather(everyone, a)
    check(bad, all(torch.equal(e, everyone[0]) for e in everyone),
          "DDP replicas differ between ranks")
    ddp_plain_and_join(r, n, gloo, bad)
    # fp16 compression hook
    m16 = nn.Linear(8, 8)
    m16.load_state_dict(nn.Linear(8, 8).state_dict())
    d16 = DDP(m16)
    d16.register_comm_hook(None, default_hooks.fp16_compress_hook)
    d16(torch.randn(4, 8, generator=g)).sum().backward()
    grads = [torch.empty_like(m16.weight.grad) for _ in range(n)]
    dist.all_gather(grads, m16.weight.grad)
    check(bad, all(torch.equal(e, grads[0]) for e in grads), "fp16 hook: grads differ")
    fsdp2(r, gloo, bad)


class _Branchy(nn.Module):
    """A model one of whose layers is used only on odd steps (find_unused_parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = nn.Linear(8, 8), nn.Linear(8, 4), nn.Linear(8, 4)

    def forward(self, x: Any, step: int) -> Any:
        h = torch.relu(self.a(x))
        return self.b(h) + (self.c(h) if step % 2 else 0)


def ddp_plain_and_join(r: int, n: int, gloo: Any, bad: list[str]) -> None:
    """DDP with its reducer's own (C++) all_reduce, no hook, and ``Join`` over uneven
    inputs (rank r runs 2 + r steps) with unused parameters and without dividing by the
    initial world size, on ringlet and on gloo: the same weights.  (Join handed DDP's
    reducer a work whose Python part torch then freed: one rank failed with "getFuture
    not implemented", the others hung; its unused-parameter map is all-reduced through
    the group's short form, which the backend refused.)"""
    from torch.distributed.algorithms.join import Join

    weights = {}
    for name, pg in (("ringlet", None), ("gloo", gloo)):
        torch.manual_seed(1)
        m = _Branchy()
        d = DDP(m, process_group=pg, bucket_cap_mb=0.0001, find_unused_parameters=True)
        opt = torch.optim.SGD(d.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(7 + r)
        with Join([d], divide_by_initial_world_size=False):
            for step in range(2 + r):
                opt.zero_grad()
                d(torch.randn(4, 8, generator=g), step).sum().backward()
                opt.step()
        weights[name] = torch.cat([p.detach().reshape(-1) for p in m.parameters()])
    a, b = weights["ringlet"], weights["gloo"]
    check(bad, torch.allclose(a, b, rtol=1e-5, atol=1e-6),
          f"DDP with Join and unused parameters differs from gloo by "
          f"{float((a - b).abs().max()):.3g}")


def fsdp2(r: int, gloo: Any, bad: list[str]) -> None:
    """FSDP2 (``fully_shard``, ZeRO-3) on ringlet and on gloo: same weights.  It names its
    group (DeviceMesh asks for ``group_name``) and gathers in place
    (``all_gather_into_tensor(out, out's block of this rank)``)."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    weights = {}
    for name, mesh in (("ringlet", DeviceMesh.from_group(dist.group.WORLD, "cpu")),
                       ("gloo", DeviceMesh.from_group(gloo, "cpu"))):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
        for layer in m:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, mesh=mesh)
        fully_shard(m, mesh=mesh)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(200 + r)
        for _ in range(3):
            opt.zero_grad()
            m(torch.randn(4, 8, generator=g)).pow(2).sum().backward()
            opt.step()
        weights[name] = torch.cat([p.to_local().detach().reshape(-1) for p in m.parameters()])
    a, b = weights["ringlet"], weights["gloo"]
    check(bad, torch.allclose(a, b, rtol=1e-5, atol=1e-6),
          f"FSDP2 shards differ from gloo's by {float((a - b).abs().max()):.3g}")


def dead_peer(r: int, n: int, bad: list[str]) -> None:
    """The last rank dies (os._exit) between two calls: the others' torch call raises
    ringlet's PeerError naming it, within seconds (not at the deadline)."""
    t = torch.ones(8)
    dist.all_reduce(t)
    model = DDP(nn.Linear(10, 10))   # plain: its reducer's own all_reduce, read in C++
    if r == n - 1:
        os._exit(3)
    time.sleep(0.5)
    try:   # it read a failed future as a value: SIGSEGV
        model(torch.randn(3, 10)).sum().backward()
        bad.append("DDP's backward with a dead peer returned")
    except RuntimeError as exc:
        check(bad, "PeerError" in str(exc) and f"rank {n - 1}" in str(exc),
              f"DDP's backward with a dead peer: {exc}")
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
    except Exception as exc:  # noqa: BLE001 - the check is on its type and message
        took = time.monotonic() - t0
        check(bad, isinstance(exc, ringlet.PeerError) and f"rank {n - 1}" in str(exc)
              and took < 20, f"dead peer: {type(exc).__name__} after {took:.1f} s: {exc}")
    else:
        bad.append("a call with a dead peer returned")


def main() -> int:
    dist.init_process_group("ringlet", timeout=timedelta(seconds=60))
    r, n = dist.get_rank(), dist.get_world_size()
    bad: list[str] = []
    if "--dead-peer" in sys.argv:
        dead_peer(r, n, bad)
        print(f"[rank {r}] " + ("ok" if not bad else "FAILED: " + "; ".join(bad[:10])),
              flush=True)
        os._exit(1 if bad else 0)   # the group's peer is gone: no orderly teardown
    check(bad, dist.get_backend() == "ringlet", f"backend {dist.get_backend()}")
    check(bad, ringlet.torch.communicator().size == n, "ringlet.torch.communicator()")
    try:
        if "--ddp-only" not in sys.argv:
            operations(r, n, bad)
            functional(r, n, bad)
        if n > 1 and "--ddp-only" not in sys.argv:
            one_rank_wrong(r, n, bad)
            timeout(r, n, bad)
        if "--no-ddp" not in sys.argv:
            ddp(r, n, bad)
    except Exception as exc:  # noqa: BLE001 - reported
        bad.append(f"raised {type(exc).__name__}: {exc}")
    print(f"[rank {r}] " + ("ok" if not bad else "FAILED: " + "; ".join(bad[:10])),
          flush=True)
    # a rank that is still here 4 s later, or aborts, says where each thread is
    faulthandler.enable()
    faulthandler.dump_traceback_later(4.0)
    dist.destroy_process_group()
    return 1 if bad else 0


if __name__ == "__main__":
    ringlet.__name__  # noqa: B018 - imported for the backend
    sys.exit(main())
