"""all_reduce_coalesced and Bucketer: many arrays in few collectives, results in place."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import get_world

import ringlet

SIZES = [1, 2, 3, 5, 8]


def _arrays(r: int, seed: int = 0) -> list[Any]:
    g = np.random.default_rng(seed)
    shapes = [(g.integers(1, 50),) for _ in range(20)] + [(3, 4), (0,), (2, 2, 2)]
    dtypes = [np.float32, np.float64, np.int64, np.float32]
    return [np.full(s, r + 1 + i % 7, dtypes[i % len(dtypes)]) for i, s in enumerate(shapes)]


def _want(n: int, seed: int = 0) -> list[np.ndarray]:
    per = [_arrays(q, seed) for q in range(n)]
    return [sum(p[i] for p in per) for i in range(len(per[0]))]


def _coalesced(c: ringlet.Communicator, how: str) -> list[Any]:
    a = _arrays(c.rank)
    if how == "sync":
        out = c.all_reduce_coalesced(a)
        assert out is not None and all(x is y for x, y in zip(out, a, strict=True))
    elif how == "async":
        w = c.all_reduce_coalesced(a, async_op=True)
        c.barrier()    # other calls while it runs, in order
        assert w.wait() is not None
    else:
        b = ringlet.Bucketer(c, cap_bytes=256)
        for x in a:
            b.add(x)
        b.wait()
        assert b.buckets > 1
    return [x.tolist() for x in a]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("how", ["sync", "async", "bucketer"])
def test_every_array_gets_the_sum(n: int, how: str) -> None:
    want = [w.tolist() for w in _want(n)]
    for r, got in enumerate(get_world(n).run(_coalesced, how)):
        assert got == want, f"rank {r} ({how})"


def _torch_and_max(c: ringlet.Communicator) -> list[Any]:
    import torch

    t = [torch.full((5,), float(c.rank)), torch.arange(6, dtype=torch.int32) * c.rank]
    c.all_reduce_coalesced(t, op="max")
    return [x.tolist() for x in t]


def test_torch_tensors_and_another_op() -> None:
    pytest.importorskip("torch")
    n = 3
    for got in get_world(n).run(_torch_and_max):
        assert got == [[2.0] * 5, [2 * i for i in range(6)]]


def _params(c: ringlet.Communicator) -> list[list[float]]:
    import torch

    m = torch.nn.Linear(3, 2)
    for q in m.parameters():
        torch.nn.init.constant_(q, float(c.rank))
    c.all_reduce_coalesced(list(m.parameters()))     # leaves that require grad, as all_reduce
    b = ringlet.Bucketer(c, cap_bytes=8)
    for q in m.parameters():
        b.add(q)
    b.wait()
    return [q.detach().reshape(-1).tolist() for q in m.parameters()]


def test_parameters_that_require_grad() -> None:
    pytest.importorskip("torch")
    n = 3
    s = float(sum(range(n)) * n)
    for got in get_world(n).run(_params):
        assert got == [[s] * 6, [s] * 2]


def _bad(c: ringlet.Communicator) -> str:
    out = []
    try:
        c.all_reduce_coalesced([[1, 2]])
    except ringlet.ArgumentError as exc:
        out.append(str(exc))
    ro = np.ones(2)
    ro.setflags(write=False)
    try:
        c.all_reduce_coalesced([ro])
    except ringlet.ArgumentError as exc:
        out.append(str(exc))
    try:
        ringlet.Bucketer(c, cap_bytes=0)
    except ringlet.ArgumentError as exc:
        out.append(str(exc))
    try:
        ringlet.Bucketer(c, cap_bytes=True)   # a bool is not a size (it was taken as 1)
    except ringlet.ArgumentError as exc:
        out.append(str(exc))
    assert ringlet.Bucketer(c, cap_bytes=np.int64(64)).cap == 64   # numpy's ints are
    x = [np.ones(4)]
    c.all_reduce_coalesced(x)          # the communicator still works
    out.append(str(x[0].tolist()))
    return " | ".join(out)


def test_bad_arguments_are_argument_errors() -> None:
    n = 2
    for text in get_world(n).run(_bad):
        assert "item 0 is a list" in text and "read-only" in text and "cap_bytes" in text
        assert "cap_bytes must be a positive whole number, got True" in text
        assert text.endswith(str([float(n)] * 4))


def _mismatch(c: ringlet.Communicator) -> str:
    try:
        c.all_reduce_coalesced([np.ones(3 + (c.rank == 0))])
    except ringlet.MismatchError as exc:
        return str(exc)
    return "no error"


def test_ranks_that_disagree_get_a_mismatch_error() -> None:
    for text in get_world(2).run(_mismatch):
        assert "disagree" in text


def _one_rank_wrong(c: ringlet.Communicator, case: str) -> list[str]:
    """A good all_reduce, the case (the last rank's arguments wrong), a good all_reduce:
    what each call gave, as text ("ok", or the error's type and message)."""
    n, r = c.size, c.rank
    me = r == n - 1
    seen: list[str] = []

    def good() -> None:
        y = np.full(8, 10.0 * (r + 1))
        c.all_reduce(y)
        seen.append("ok" if y[0] == 10.0 * n * (n + 1) / 2 else f"wrong {y[0]}")

    good()
    try:
        if case in ("readonly", "notarray"):
            a = [np.ones(4), np.ones(4)]
            if me and case == "readonly":
                a[1].setflags(write=False)
            if me and case == "notarray":
                a[1] = [1.0] * 4   # type: ignore[call-overload]
            c.all_reduce_coalesced(a)
            seen.append("ok" if a[0][0] == n else f"wrong {a[0][0]}")
        elif case == "bucketer":
            b = ringlet.Bucketer(c, cap_bytes=1 << 20)
            with pytest.raises(ringlet.ArgumentError, match=r"Bucketer.add: array 0 .* list"):
                if me:
                    b.add([1.0, 2.0])
                else:
                    raise ringlet.ArgumentError("Bucketer.add: array 0 (a list here)")
            b.add(np.ones(4) if not me else np.ones(5))   # the count differs: a mismatch
            b.wait()
            seen.append("ok")
        else:   # the parts differ (float64 and float32 on the last rank, or one more
            # part there, whose first part agrees), asynchronously
            a = [np.ones(4), np.ones(4, np.float32 if me else np.float64)] if case == "parts" \
                else [np.ones(4)] + [np.ones(3, np.float32)] * me
            c.all_reduce_coalesced(a, async_op=True).wait()
            seen.append("ok")
    except ringlet.RingletError as exc:
        seen.append(f"{type(exc).__name__}: {exc}")
    try:
        good()
    except ringlet.RingletError as exc:
        seen.append(f"{type(exc).__name__}: {exc}")
    return seen


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize("case", ["readonly", "notarray", "bucketer", "parts", "extra_part"])
def test_one_rank_wrong_fails_every_rank_and_the_next_call_pairs(n: int, case: str) -> None:
    """Arguments one rank refuses fail all_reduce_coalesced on every rank (the refusal is
    numbered and published, as any collective's); parts that differ never pair silently
    with another rank's all_reduce; the call after works."""
    res = get_world(n).run(_one_rank_wrong, case)
    if case == "bucketer":
        get_world(n).restart()   # its communicator was aborted
    for r, seen in enumerate(res):
        if case == "bucketer":   # a Bucketer's disagreement aborts (test_no_arrays_...)
            assert seen[0] == "ok" and len(seen) == 3, (r, seen)
            assert seen[1].startswith("PeerError") and "Bucketer: ranks disagree about " \
                "the arrays" in seen[1], (r, seen)
            assert seen[2].startswith("PeerError: the communicator was aborted"), (r, seen)
            continue
        assert seen[0] == "ok" and seen[-1] == "ok", (r, seen)
        assert not any(s.startswith("wrong") for s in seen), (r, seen)
        middle = seen[1:-1]
        if case in ("parts", "extra_part"):   # the first part fails on every rank: nobody
            # numbers a second (its descriptor carries a digest of every part)
            assert len(middle) == 1 and middle[0].startswith("MismatchError") and \
                "all_reduce_coalesced" in middle[0], (r, seen)
            # named by what differs, the arrays, not by a part's count or type
            assert "arrays (a digest of their kinds, element types" in middle[0], (r, seen)
            continue
        want = "ArgumentError" if r == n - 1 and case != "bucketer" else "MismatchError"
        assert len(middle) == 1 and middle[0].startswith(want), (r, seen)


def _gather_coalesced(c: ringlet.Communicator, how: str) -> list[Any]:
    a = _arrays(c.rank)
    if how == "torch":
        import torch

        a = [torch.from_numpy(x) for x in a[:5]] + a[5:8]   # torch and numpy apart
    if how == "async":
        w = c.all_gather_coalesced(a, async_op=True)
        c.barrier()    # other calls while it runs, in order
        out = w.wait()
    else:
        out = c.all_gather_coalesced(a)
    assert len(out) == len(a)
    for x, o in zip(a, out, strict=True):
        assert type(o) is type(x) and o.dtype == x.dtype and \
            tuple(o.shape) == (c.size, *x.shape), (o.shape, x.shape)
    return [np.asarray(o).tolist() for o in out]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("how", ["sync", "async", "torch"])
def test_all_gather_coalesced_gives_every_ranks_arrays(n: int, how: str) -> None:
    if how == "torch":
        pytest.importorskip("torch")
    per = [_arrays(q) for q in range(n)]
    k = 8 if how == "torch" else len(per[0])
    want = [np.stack([p[i] for p in per]).tolist() for i in range(k)]
    for r, got in enumerate(get_world(n).run(_gather_coalesced, how)):
        assert got == want, f"rank {r} ({how})"


def _split_differently(c: ringlet.Communicator, which: str) -> list[str]:
    """A good call, then two float32 arrays of 8 elements in all, split 3 + 5 on the
    last rank and 5 + 3 on the others, then a good call: what each gave."""
    seen = []
    last = c.rank == c.size - 1
    for step in ("good", "split", "good"):
        a = [np.ones(3 if last and step == "split" else 5, np.float32),
             np.ones(5 if last and step == "split" else 3, np.float32)]
        try:
            if which == "all_gather":
                out = c.all_gather_coalesced(a)
                ok = [o.shape for o in out] == [(c.size, 5), (c.size, 3)]
            else:
                c.all_reduce_coalesced(a)
                ok = a[0][0] == c.size
            seen.append("ok" if ok else "wrong")
        except ringlet.RingletError as exc:
            seen.append(f"{type(exc).__name__}: {exc}")
    return seen


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("which", ["all_gather", "all_reduce"])
def test_ranks_that_split_a_type_differently_disagree(n: int, which: str) -> None:
    """The same element type and total count, split between the arrays differently: a
    MismatchError on every rank (the parts' descriptors carry a digest of every
    array's shape), and the next call works."""
    for r, seen in enumerate(get_world(n).run(_split_differently, which)):
        assert seen[0] == "ok" and seen[2] == "ok", (r, seen)
        assert seen[1].startswith("MismatchError") and f"{which}_coalesced" in seen[1] \
            and "kinds, element types and shapes" in seen[1], (r, seen)


def _gather_refused(c: ringlet.Communicator) -> list[str]:
    seen = []
    ro = np.arange(3.0)
    ro.setflags(write=False)   # read-only inputs are fine: all_gather only reads them
    seen.append(str([o.tolist() for o in c.all_gather_coalesced([ro])][0][-1]))
    try:
        c.all_gather_coalesced([np.ones(2), "x"] if c.rank == 0 else [np.ones(2), np.ones(2)])
    except ringlet.RingletError as exc:
        seen.append(f"{type(exc).__name__}: {exc}")
    seen.append(str(c.all_gather_coalesced([]) == []))
    return seen


def test_all_gather_coalesced_refuses_what_is_not_an_array_on_every_rank() -> None:
    for r, seen in enumerate(get_world(3).run(_gather_refused)):
        assert seen[0] == "[0.0, 1.0, 2.0]" and seen[-1] == "True", (r, seen)
        want = "ArgumentError" if r == 0 else "MismatchError"
        assert seen[1].startswith(want) and "item 1 is a str" in seen[1], (r, seen)


def _one_bucket_fails(c: ringlet.Communicator) -> list[str]:
    """Two buckets, the first of which the ranks disagree on: wait() raises its error
    only once the second is done too (it raised at the first, leaving the second's
    arrays to be written behind the caller's back)."""
    b = ringlet.Bucketer(c, cap_bytes=8)
    b.add(np.ones(3 + (c.rank == 0)))     # a bucket of its own: the counts differ
    good = np.full(4, float(c.rank + 1))
    b.add(good)
    try:
        b.wait()
        return ["no error"]
    except ringlet.PeerError as exc:   # a Bucketer's disagreement aborts
        return [str(exc), str(good.tolist())]


def test_bucketer_waits_for_every_bucket_before_raising() -> None:
    n = 3
    res = get_world(n).run(_one_bucket_fails)
    get_world(n).restart()   # its communicator was aborted
    for r, (err, good) in enumerate(res):
        assert "Bucketer: ranks disagree" in err, (r, err)
        assert good == str([float(sum(range(1, n + 1)))] * 4), (r, good)


def _last_bucket_splits_differently(c: ringlet.Communicator) -> list[str]:
    """A good bucket, then a last one of one element type on rank 0 and two on rank 1,
    whose first part (ended before the call returns) fails there at once: wait() raised
    that MismatchError on rank 1 alone, without the abort its peers made."""
    b = ringlet.Bucketer(c, cap_bytes=1 << 10)
    good = np.full(256, float(c.rank + 1))     # 2 KiB: a bucket of its own
    b.add(good)
    b.add(np.ones(4))
    if c.rank == 1:
        b.add(np.ones(4, np.float32))
    try:
        b.wait()
        return ["no error"]
    except ringlet.RingletError as exc:
        return [f"{type(exc).__name__}: {exc}", str(good[[0, -1]].tolist())]


def test_a_last_bucket_that_fails_at_once_aborts_on_every_rank() -> None:
    n = 2
    res = get_world(n).run(_last_bucket_splits_differently)
    get_world(n).restart()   # its communicator was aborted
    for r, seen in enumerate(res):
        assert seen[0].startswith("PeerError") and "Bucketer: ranks disagree" in seen[0] \
            and "the communicator is aborted" in seen[0], (r, seen)
        assert seen[1] == str([3.0, 3.0]), (r, seen)


def _full_bucket_splits_differently(c: ringlet.Communicator) -> list[str]:
    """A bucket that fills in add(), of one element type on rank 0 and two on rank 1:
    its first part fails at once on rank 1, where add() raised that MismatchError alone
    while rank 0 went on to abort at wait()."""
    b = ringlet.Bucketer(c, cap_bytes=1 << 10)
    seen = []
    try:
        b.add(np.ones(4))
        if c.rank == 1:
            b.add(np.ones(4, np.float32))
        b.add(np.ones(256))                    # 2 KiB: the bucket starts here
        seen.append("added")
        b.wait()
        seen.append("no error")
    except ringlet.RingletError as exc:
        seen.append(f"{type(exc).__name__}: {exc}")
    return seen


def test_a_bucket_that_fails_at_once_in_add_fails_at_wait_on_every_rank() -> None:
    n = 2
    res = get_world(n).run(_full_bucket_splits_differently)
    get_world(n).restart()   # its communicator was aborted
    for r, seen in enumerate(res):
        assert seen[0] == "added" and seen[1].startswith("PeerError") \
            and "Bucketer: ranks disagree" in seen[1], (r, seen)


def _sequence(c: ringlet.Communicator, case: str, async_op: bool) -> list[str]:
    """A good call, one where a rank passes no arrays (or adds one array more to a
    Bucketer), a good one: the bad one fails on every rank and the last pairs rightly
    (a coalesced call of no arrays made no call: its rank's next call paired with its
    peers' bad one, silently, summing one step's gradients with the next's)."""
    n, me = c.size, c.rank == 1
    seen = []
    for i in range(3):
        a = [np.full(2, float(c.rank + i))]
        try:
            if case == "bucketer":
                b = ringlet.Bucketer(c, cap_bytes=16)   # each array fills a bucket
                for x in a + ([np.ones(2)] if i == 1 and me else []):
                    b.add(x)
                b.wait()
            elif case == "gather":
                parts = [] if i == 1 and me else a
                w = c.all_gather_coalesced(parts, async_op=async_op)
                got = w.wait() if async_op else w
                if parts and got[0][:, 0].tolist() != [float(q + i) for q in range(n)]:
                    seen.append(f"wrong {got}")
                    continue
            else:
                parts = [] if i == 1 and me else a
                w = c.all_reduce_coalesced(parts, async_op=async_op)
                if async_op:
                    w.wait()
                if parts and a[0][0] != sum(q + i for q in range(n)):
                    seen.append(f"wrong {a[0][0]}")
                    continue
            seen.append("ok")
        except ringlet.RingletError as exc:
            seen.append(f"{type(exc).__name__}: {exc}")
    return seen


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("case,async_op", [("reduce", False), ("reduce", True),
                                           ("gather", False), ("gather", True),
                                           ("bucketer", True)])
def test_no_arrays_on_one_rank_fails_every_rank(n: int, case: str, async_op: bool) -> None:
    """A coalesced call makes one call on every rank whatever it is given, so the call
    after a bad one pairs; a Bucketer's rank that made a bucket more is a call ahead for
    good: the communicator is aborted, every rank told why."""
    res = get_world(n).run(_sequence, case, async_op)
    if case == "bucketer":
        get_world(n).restart()   # its communicator was aborted
    for r, seen in enumerate(res):
        assert seen[0] == "ok", (r, seen)
        assert "arrays (a digest" in seen[1] or "all_reduce_coalesced" in seen[1], (r, seen)
        if case == "bucketer":
            assert seen[1].startswith("PeerError") and "Bucketer: ranks disagree" in seen[1] \
                and "the communicator is aborted" in seen[1], (r, seen)
            assert seen[2].startswith("PeerError: the communicator was aborted earlier"), \
                (r, seen)
            continue
        assert seen[1].startswith("MismatchError") and seen[2] == "ok", (r, seen)


def _none_anywhere(c: ringlet.Communicator) -> list[Any]:
    """No arrays on every rank: one agreement, nothing moved."""
    b = ringlet.Bucketer(c)
    b.wait()
    return [c.all_reduce_coalesced([]), c.all_gather_coalesced([]),
            c.all_reduce_coalesced([], async_op=True).wait(), b.buckets]


def test_no_arrays_on_every_rank_is_one_call() -> None:
    for got in get_world(3).run(_none_anywhere):
        assert got == [[], [], [], 0]


def test_a_bucketer_refuses_what_it_cannot_reduce_at_add() -> None:
    """A float128 array, or an int32 one with AVG, was taken by add() and failed the flush
    on every rank, and stayed pending: every later flush and wait raised again, and the
    good arrays were never reduced."""
    comm = ringlet.init(rank=0, size=1)
    try:
        b = ringlet.Bucketer(comm)
        g = np.ones(2)
        b.add(g)
        with pytest.raises(ringlet.ArgumentError, match=r"Bucketer.add: array 1 .*float128"):
            b.add(np.ones(2, np.longdouble))
        avg = ringlet.Bucketer(comm, op="avg")
        with pytest.raises(ringlet.ArgumentError, match="AVG is defined for floating"):
            avg.add(np.ones(2, np.int32))
        b.wait()
        assert g.tolist() == [1.0, 1.0]
        # a bucket that fails to start is not kept pending
        bad = ringlet.Bucketer(comm, algorithm="no_such")
        bad.add(np.ones(2))
        with pytest.raises(ringlet.ArgumentError, match="no_such"):
            bad.wait()
        assert bad._pending == []
    finally:
        comm.close()


def _expanded_on_one_rank(c: ringlet.Communicator, how: str) -> list[str]:
    """An expanded tensor (elements sharing memory) on the last rank: refused before the
    call (torch raised its RuntimeError after the collective, on that rank alone, the
    arrays before it written and those after not), and the next call pairs."""
    import torch

    seen = []
    a = [torch.ones(2), torch.ones(1).expand(4) if c.rank == c.size - 1 else torch.ones(4)]
    try:
        if how == "bucketer":
            b = ringlet.Bucketer(c)
            for x in a:
                b.add(x)
            b.wait()
        else:
            c.all_reduce_coalesced(a)
        seen.append("ok")
    except ringlet.RingletError as exc:
        seen.append(f"{type(exc).__name__}: {exc}")
    except RuntimeError as exc:
        seen.append(f"raw {type(exc).__name__}: {exc}")
    y = np.ones(2)
    c.all_reduce(y)
    seen.append(str(y.tolist()))
    return seen


def test_an_expanded_tensor_is_refused_before_the_call() -> None:
    pytest.importorskip("torch")
    n = 2
    for r, seen in enumerate(get_world(n).run(_expanded_on_one_rank, "coalesced")):
        want = "ArgumentError" if r == n - 1 else "MismatchError"
        assert seen[0].startswith(want) and "expanded" in seen[0], (r, seen)
        assert seen[1] == str([float(n)] * 2), (r, seen)
    comm = ringlet.init(rank=0, size=1)
    try:
        import torch

        with pytest.raises(ringlet.ArgumentError, match="Bucketer.add: array 0 .* expanded"):
            ringlet.Bucketer(comm).add(torch.ones(1).expand(3))
        g = torch.ones(1).expand(3)
        assert [x.tolist() for x in comm.all_gather_coalesced([g])] == [[[1.0] * 3]]
    finally:
        comm.close()


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_an_ndarray_subclass_is_refused_at_add_and_named() -> None:
    """np.matrix and masked arrays, as all_reduce refuses them: add() took them and a later
    flush failed (on an error naming 'x', not the item), leaving the Bucketer's promise
    that what it cannot reduce is refused at add() unkept."""
    comm = ringlet.init(rank=0, size=1)
    try:
        for bad in (np.matrix([[1.0, 2.0]]), np.ma.array([1.0, 2.0], mask=[0, 1])):
            b = ringlet.Bucketer(comm)
            with pytest.raises(ringlet.ArgumentError, match=r"Bucketer.add: array 0 of the bucket "
                               r"is a numpy.*subclass of numpy.ndarray"):
                b.add(bad)
            b.wait()
            with pytest.raises(ringlet.ArgumentError, match=r"item 1 is a numpy.*subclass"):
                comm.all_reduce_coalesced([np.ones(2), bad])
        x = [np.ones(2)]
        comm.all_reduce_coalesced(x)
        assert x[0].tolist() == [1.0, 1.0]
    finally:
        comm.close()
