"""The compiled small-message path (ringlet.lean): the same answers, errors and records as the
Python path, with ranks on either path in one call, at every world size.

On every rank that has the compiled path, ``comm._lean.calls`` counts the calls it did, so
each test checks that the path it means to test really ran.  The whole suite also runs with
the compiled path on (the default) wherever it was built; ``RINGLET_LEAN=0`` and a build
without a compiler run it on the Python path alone (.ci/run does both).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import numpy as np
import pytest
from conftest import SIZES, get_world
from world import lean_from_env

import ringlet
from ringlet import lean
from ringlet.config import Settings

pytestmark = [
    pytest.mark.skipif(not lean.BUILT, reason="ringlet._lean was not built here (no C "
                       "compiler at install): the Python path runs every call"),
    pytest.mark.skipif(not lean_from_env(),
                       reason="RINGLET_LEAN=0: the Python path runs every call")]

DTYPES = ("float32", "float64", "int32", "int64")


def _data(q: int, shape: tuple[int, ...], dtype: str, salt: int = 0) -> np.ndarray:
    rng = np.random.default_rng([q, salt, len(shape), int(np.prod(shape))])
    if dtype.startswith("int"):
        return rng.integers(-(2 ** 30), 2 ** 30, shape).astype(dtype)  # sums wrap alike
    if dtype == "float16":   # small integers: every order of adding them is exact
        return rng.integers(-8, 8, shape).astype(dtype)
    return rng.normal(0, 10, shape).astype(dtype)


def _in_rank_order(xs: list[np.ndarray]) -> np.ndarray:
    """x0 + x1 + ... + x(n-1), elementwise, in rank order: the one-shot path's order."""
    out = xs[0].copy()
    for x in xs[1:]:
        np.add(out, x, out=out)
    return out


def _same(got: np.ndarray, want: np.ndarray) -> bool:
    """Integers exactly; floats close (past the post area other algorithms add in other
    orders; the bits are compared across ranks separately)."""
    if got.dtype.kind in "iu":
        return bool(np.array_equal(got, want))
    tol = 1e-2 if got.dtype == np.float16 else 1e-4
    return bool(np.allclose(got, want, rtol=tol, atol=tol))


def _shapes(post: int) -> list[tuple[int, ...]]:
    """Sizes around the post area's end, odd ones, 0-d and up to six dimensions."""
    return [(), (1,), (7,), (3, 5), (2, 1, 3, 1, 2, 1), (post // 8 - 1,), (post // 8,),
            (post // 4,)]


def _mixed(comm: ringlet.Communicator, every: int) -> dict[str, Any]:
    """Every dtype and shape, in place and out=, with only every ``every``-th rank on the
    compiled path; answers checked against numpy, bits compared across ranks."""
    r, n = comm.rank, comm.size
    keep = comm._lean
    assert keep is not None, "the compiled path is off on this communicator"
    if r % every:
        comm._lean = None
    before = keep.calls
    bad: list[str] = []
    h = hashlib.sha1()
    post = comm._t.lay.post_bytes  # type: ignore[attr-defined]
    try:
        for dtype in (*DTYPES, "float16", "complex64"):
            for shape in _shapes(post):
                if int(np.prod(shape)) * np.dtype(dtype).itemsize > 2 * post:
                    continue
                xs = [_data(q, shape, dtype) for q in range(n)]
                want = _in_rank_order(xs)
                for rep in range(4):   # the first call of a size asks the automatic choice
                    x = xs[r].copy()
                    if rep == 3:   # a view 3 elements into a larger array: offset bytes
                        base = np.empty(x.size + 3, dtype)
                        base[3:] = x.reshape(-1)
                        x = base[3:].reshape(shape)
                    if rep == 2:
                        out = np.empty(int(np.prod(shape)), dtype)   # out= of another shape
                        got = comm.all_reduce(x, out=out)
                        ok = got is out and np.array_equal(x, xs[r]) and \
                            _same(out.reshape(shape), want)
                    else:
                        got = comm.all_reduce(x)
                        ok = got is x and _same(x, want)
                    if not ok:
                        bad.append(f"{dtype} {shape} rep {rep}")
                    h.update(np.asarray(got).tobytes())
    finally:
        comm._lean = keep
    return {"bad": bad, "digest": h.hexdigest(), "lean": keep.calls - before,
            "on": r % every == 0}


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("every", [1, 2])
def test_every_rank_or_every_other_on_the_compiled_path(n: int, every: int) -> None:
    res = get_world(n).run(_mixed, every)
    assert all(not x["bad"] for x in res), [x["bad"] for x in res]
    assert len({x["digest"] for x in res}) == 1, "ranks got different bits"
    # it did the small float and int calls; with more ranks than cores a peer is often
    # more than 200 us late, and the call goes to the Python path (by design)
    least = 20 if n <= (os.cpu_count() or 1) else 0
    for x in res:
        if x["on"]:
            assert x["lean"] > least, x
        else:
            assert x["lean"] == 0, x


def _taker(comm: ringlet.Communicator, out: dict[str, bool]) -> Any:
    """took(label, call, want): calls ``call`` (checking its answer) and records in
    ``out[label]`` whether every rank did it on the compiled path."""
    keep = comm._lean
    assert keep is not None
    n = comm.size

    def took(label: str, call: Any, want: Any) -> None:
        # tries: a call the compiled path takes still goes to the Python path when a peer
        # is not there within 200 us (3 ranks on 2 busy cores: 5 tries missed once in CI)
        out[label] = False
        for _ in range(20):
            before = keep.calls
            got = call()
            assert np.array_equal(np.asarray(got), want), label
            if comm.all_reduce(np.array([keep.calls > before], np.int32))[0] == n:
                out[label] = True   # every rank took it, in the same try
                break

    return took


def _what_it_takes(comm: ringlet.Communicator) -> dict[str, bool]:
    """Which calls the compiled path takes (each answer checked too)."""
    n = comm.size
    out: dict[str, bool] = {}
    took = _taker(comm, out)
    x = np.ones(4, np.float32)
    comm.all_reduce(x.copy())   # on a fresh communicator: the call that makes this its thread
    comm.all_reduce(x.copy())   # the size's first call: the automatic choice is asked
    took("plain", lambda: comm.all_reduce(np.ones(4, np.float32)), np.full(4, n, np.float32))
    took("op=ReduceOp.SUM", lambda: comm.all_reduce(np.ones(4, np.float32),
                                                    op=ringlet.ReduceOp.SUM),
         np.full(4, n, np.float32))
    took("op='SUM'", lambda: comm.all_reduce(np.ones(4, np.float32), op="SUM"),
         np.full(4, n, np.float32))
    took("algorithm='auto'", lambda: comm.all_reduce(np.ones(4, np.float32), algorithm="auto"),
         np.full(4, n, np.float32))
    took("async_op=np.False_", lambda: comm.all_reduce(np.ones(4, np.float32),
                                                       async_op=np.False_),
         np.full(4, n, np.float32))

    def same_out() -> np.ndarray:
        y = np.ones(4, np.float32)
        assert comm.all_reduce(y, out=y) is y   # out= itself, in place
        return y

    took("out=x", same_out, np.full(4, n, np.float32))
    took("op=max", lambda: comm.all_reduce(np.ones(4, np.float32), op="max"),
         np.ones(4, np.float32))
    took("algorithm=ring", lambda: comm.all_reduce(np.ones(4, np.float32), algorithm="ring"),
         np.full(4, n, np.float32))
    took("algorithm=oneshot", lambda: comm.all_reduce(np.ones(3, np.float32),
                                                      algorithm="oneshot"),
         np.full(3, n, np.float32))   # a size never asked about: oneshot needs no asking
    took("float16", lambda: comm.all_reduce(np.ones(4, np.float16)), np.full(4, n, np.float16))
    took("2-d", lambda: comm.all_reduce(np.ones((2, 2), np.float32)),
         np.full((2, 2), n, np.float32))
    ro = np.ones(4, np.float32)
    ro.flags.writeable = False
    took("read-only x with out=", lambda: comm.all_reduce(ro, out=np.empty(4, np.float32)),
         np.full(4, n, np.float32))
    took("async", lambda: comm.all_reduce(np.ones(4, np.float32), async_op=True).wait(),
         np.full(4, n, np.float32))
    return out


@pytest.mark.parametrize("n", [1, 2, 3])
def test_what_the_compiled_path_takes_and_leaves(n: int) -> None:
    res = get_world(n).run(_what_it_takes)
    for took in res:
        assert took == {"plain": True, "op=ReduceOp.SUM": True, "op='SUM'": True,
                        "algorithm='auto'": True, "async_op=np.False_": True, "out=x": True,
                        "op=max": False,
                        "algorithm=ring": False,
                        "algorithm=oneshot": True,
                        "float16": False, "2-d": True, "read-only x with out=": True,
                        "async": False}, took


def _tensors_it_takes(comm: ringlet.Communicator) -> dict[str, Any]:
    """Which torch tensors the compiled path takes, through the arrays that share their
    memory (each answer checked too), and that one numpy cannot view still gets the Python
    path's error, with the next call running."""
    import torch

    n = comm.size
    out: dict[str, Any] = {}
    took = _taker(comm, out)
    full = np.full(4, n, np.float32)
    comm.all_reduce(torch.ones(4))
    comm.all_reduce(torch.ones(4))
    took("tensor", lambda: comm.all_reduce(torch.ones(4)), full)
    took("float64", lambda: comm.all_reduce(torch.ones(4, dtype=torch.float64)), full)
    took("int64 2-d", lambda: comm.all_reduce(torch.ones(2, 2, dtype=torch.int64)),
         np.full((2, 2), n))

    def into_out() -> Any:
        x, o = torch.ones(4), torch.zeros(4)
        assert comm.all_reduce(x, out=o) is o and x[0] == 1
        return o

    took("out=tensor", into_out, full)
    took("Parameter", lambda: comm.all_reduce(torch.nn.Parameter(torch.ones(4))).detach(), full)
    took("requires_grad", lambda: comm.all_reduce(torch.ones(4, requires_grad=True)).detach(),
         full)
    took("bfloat16", lambda: comm.all_reduce(torch.ones(4, dtype=torch.bfloat16)).float(), full)
    took("float16", lambda: comm.all_reduce(torch.ones(4, dtype=torch.float16)).float(), full)
    took("array x, tensor out=", lambda: comm.all_reduce(np.ones(4, np.float32),
                                                         out=torch.zeros(4)), full)
    try:
        comm.all_reduce(torch._neg_view(torch.ones(4)))
        out["neg view"] = "no error"
    except ringlet.ArgumentError as exc:
        out["neg view"] = str(exc).split(": ", 1)[1][:31]
    took("after", lambda: comm.all_reduce(torch.ones(4)), full)
    return out


@pytest.mark.parametrize("n", [2, 3])
def test_torch_tensors_take_the_compiled_path(n: int) -> None:
    pytest.importorskip("torch")
    for took in get_world(n).run(_tensors_it_takes):
        assert took == {"tensor": True, "float64": True, "int64 2-d": True, "out=tensor": True,
                        "Parameter": True, "requires_grad": True, "bfloat16": False,
                        "float16": False, "array x, tensor out=": False,
                        "neg view": "x has a lazy conjugate/negation", "after": True}, took


def _overlap_and_bad_out(comm: ringlet.Communicator) -> list[str]:
    """out= that overlaps x or has another dtype: the Python path's ArgumentError; out= that
    is x itself (the same elements, another view): in place, as NCCL's sendbuff ==
    recvbuff."""
    errs = []
    z = np.ones(9, np.float32)
    for x, out in ((z[:8], z[1:]), (z[:8], np.empty(8, np.float64))):
        try:
            comm.all_reduce(x, out=out)
        except ringlet.ArgumentError as exc:
            errs.append(str(exc).split(": ", 1)[1][:30])
    y = np.ones(8, np.float32)
    view = y[:]
    got = comm.all_reduce(y, out=view)   # returns out=, as any call given one
    errs.append(f"{y[0]} {got is view}")
    return errs


@pytest.mark.parametrize("n", [2, 5])
def test_bad_out_is_the_python_paths_error_and_the_next_call_runs(n: int) -> None:
    for errs in get_world(n).run(_overlap_and_bad_out):
        assert errs[0].startswith("out overlaps x") and errs[1].startswith("out has dtype")
        assert errs[2] == f"{float(n)} True", errs   # in place: it returns x


def _sequence(comm: ringlet.Communicator, odd_lean: bool) -> list[str]:
    """good, mismatched, good, rejected, good: on the compiled path where it applies."""
    r, n = comm.rank, comm.size
    keep = comm._lean
    if r % 2 and not odd_lean:
        comm._lean = None
    seen = []
    try:
        for i in range(5):
            x = np.full(5, float(r + i), np.float64)
            try:
                if i == 1:       # the last rank's vector is longer: a mismatch
                    x = np.full(5 + (r == n - 1), 1.0)
                    comm.all_reduce(x)
                elif i == 3:     # rank 0 rejects its op: everyone hears why
                    comm.all_reduce(x, op="median" if r == 0 else "sum")
                else:
                    comm.all_reduce(x)
                    if x[0] != sum(q + i for q in range(n)):
                        seen.append(f"wrong {i}")
                        continue
                seen.append("ok")
            except (ringlet.MismatchError, ringlet.ArgumentError) as exc:
                seen.append(type(exc).__name__)
    finally:
        comm._lean = keep
    return seen


@pytest.mark.parametrize("n", [2, 3, 5, 8])
@pytest.mark.parametrize("odd_lean", [True, False])
def test_errors_in_a_sequence_on_every_rank(n: int, odd_lean: bool) -> None:
    res = get_world(n).run(_sequence, odd_lean)
    for r, seen in enumerate(res):
        third = "ArgumentError" if r == 0 else "MismatchError"
        assert seen == ["ok", "MismatchError", "ok", third, "ok"], (r, seen)


def _records(comm: ringlet.Communicator) -> list[tuple[str, int, str]]:
    x = np.ones(3, np.float32)
    for _ in range(4):
        comm.all_reduce(x)
    comm.barrier()
    assert comm._fr is not None
    return [(o["kind"], o["seq"], o["state"]) for o in comm._fr.records()[-5:]]


def test_the_flight_recorder_has_the_compiled_calls() -> None:
    res = get_world(2).run(_records)
    for recs in res:
        kinds = [k for k, _, _ in recs]
        seqs = [s for _, s, _ in recs]
        assert kinds == ["all_reduce"] * 4 + ["barrier"], recs
        assert seqs == list(range(seqs[0], seqs[0] + 5)) and all(s == "done" for *_, s in recs)


def _late(comm: ringlet.Communicator) -> str:
    x = np.ones(2, np.float32)
    comm.all_reduce(x)
    comm.all_reduce(x)
    if comm.rank == comm.size - 1:
        import time

        time.sleep(comm.settings.timeout + 1.5)
        return "slept"
    try:
        comm.all_reduce(x)
    except ringlet.CommTimeoutError as exc:
        return str(exc)
    except ringlet.PeerError as exc:
        return "peer: " + str(exc)
    return "no timeout"


@pytest.mark.waits
def test_a_missing_rank_times_out_named_as_on_the_python_path() -> None:
    from world import World

    w = World(3, Settings(timeout=1.5))
    try:
        res = w.run(_late)
    finally:
        w.close()
    assert res[2] == "slept"
    for msg in res[:2]:
        assert "all_reduce #3" in msg and "rank 2" in msg, msg


def _off(comm: ringlet.Communicator) -> bool:
    return comm._lean is None


def test_ringlet_lean_0_turns_it_off() -> None:
    from world import World

    w = World(2, Settings(lean=False))
    try:
        assert w.run(_off) == [True, True]
    finally:
        w.close()
    assert Settings.from_env({"RINGLET_LEAN": "0"}).lean is False


def _split_and_interleave(comm: ringlet.Communicator) -> list[float]:
    """A sub-communicator's compiled calls between the parent's, and calls the compiled
    path leaves to Python (op=max, float16, async) in between, many times over."""
    r, n = comm.rank, comm.size
    sub = comm.split(r % 2)
    assert sub is not None and sub._lean is not None
    got = []
    try:
        for i in range(30):
            x = np.full(3, float(r + i))
            comm.all_reduce(x)
            y = np.full(2, float(r), np.float32)
            sub.all_reduce(y)
            z = np.full(2, float(r + i))
            comm.all_reduce(z, op="max")
            h = comm.all_reduce(np.full(2, 1.0, np.float16), async_op=i % 3 == 0)
            if i % 3 == 0:
                h.wait()
            got.append(float(x[0] + y[0] + z[0]))
        calls = (comm._lean.calls if comm._lean is not None else 0, sub._lean.calls)
    finally:
        sub.close()
    want = [sum(q + i for q in range(n)) + sum(q for q in range(n) if q % 2 == r % 2)
            + (n - 1 + i) for i in range(30)]
    assert got == want, (got, want)
    # a peer more than 200 us late sends a call to the Python path (by design): with more
    # ranks than cores that happens often
    least = 25 if n <= (os.cpu_count() or 1) else 1
    assert calls[0] >= least and calls[1] >= least, calls
    return got


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_sub_communicators_and_python_calls_interleave(n: int) -> None:
    get_world(n).run(_split_and_interleave)


def _nan_payloads(comm: ringlet.Communicator) -> str:
    """NaNs with rank-dependent payloads and signs, signed zeros and infinities, summed with
    every other rank on the Python path: which NaN a + b keeps depends on the instruction's
    operand order, so both paths must add alike (ringlet.lean.oneshot_reducer)."""
    from test_recursive_bits import awkward

    keep = comm._lean
    if comm.rank % 2:
        comm._lean = None
    h = hashlib.sha1()
    try:
        for dtype in ("float32", "float64"):
            for count in (1, 3, 4, 5, 17, 1000, 4099):
                x = awkward(dtype, count, comm.rank)
                for algorithm in (None, "oneshot"):
                    y = x.copy()
                    comm.all_reduce(y, algorithm=algorithm)
                    h.update(y.tobytes())
    finally:
        comm._lean = keep
    return h.hexdigest()


@pytest.mark.parametrize("n", [2, 3, 5])
def test_nan_payloads_are_the_same_on_both_paths(n: int) -> None:
    assert len(set(get_world(n).run(_nan_payloads))) == 1


@pytest.mark.parametrize("nbytes", [0, 1, 15, 16, 63, 64, 65, 1000, 4099, 1 << 16, (1 << 20) + 7])
@pytest.mark.parametrize("shift", [0, 1, 8, 13])
def test_copy_stream_copies_any_size_and_alignment(nbytes: int, shift: int) -> None:
    """The streaming copy (non-temporal stores past an unaligned head, plain tail) writes
    exactly the source's bytes and nothing around them, whatever the alignment."""
    from ringlet import _lean  # type: ignore[attr-defined]

    rng = np.random.default_rng(nbytes + shift)
    src = rng.integers(0, 256, nbytes + 3 + shift, np.uint8)[3:3 + nbytes]
    dst_buf = np.full(nbytes + 32, 0xAB, np.uint8)
    dst = dst_buf[shift:shift + nbytes]
    _lean.copy_stream(dst, src)
    assert np.array_equal(dst, src)
    assert (dst_buf[:shift] == 0xAB).all() and (dst_buf[shift + nbytes:] == 0xAB).all()
    with pytest.raises(ValueError, match="different sizes"):
        _lean.copy_stream(dst_buf, src)
    f = np.ones(5, np.float64)
    g = np.zeros(10, np.float32)   # the same bytes, another type: a byte copy
    _lean.copy_stream(g, f)
    assert np.array_equal(g.view(np.float64), f)


# --- small point-to-point messages ----------------------------------------------------------


def test_blocking_p2p_takes_the_compiled_path_and_leaves_the_rest_to_python() -> None:
    """Blocking send and recv of whole messages go through the compiled push and take
    (one rank sending to itself); a message that is not the one the receive wants (another
    tag, another size) stays for the Python path, which keeps it aside or says it does not
    fit; one larger than a channel never takes the compiled path."""
    from ringlet.transport.base import EMPTY, OTHER, TAKEN

    with ringlet.init(rank=0, size=1, settings=Settings(timeout=0.5)) as comm:
        t = comm._t
        pushed: list[bool] = []
        taken: list[int] = []
        push, take = t.push_message, t.take_message

        def spy_push(*a: Any) -> bool:
            pushed.append(push(*a))
            return pushed[-1]

        def spy_take(*a: Any) -> int:
            taken.append(take(*a))
            return taken[-1]

        t.push_message, t.take_message = spy_push, spy_take  # type: ignore[method-assign]
        for dtype in ("float32", "float64", "int8", "int64"):
            x = np.arange(6).astype(dtype).reshape(3, 2)
            comm.send(x, 0, tag=4)
            got = comm.recv(np.empty_like(x), 0, tag=4)
            assert np.array_equal(got, x), dtype
        assert pushed == [True] * 4 and taken == [TAKEN] * 4
        # another tag first: kept aside by Python, then taken from there
        comm.send(np.full(2, 1.0), 0, tag=1)
        comm.send(np.full(2, 2.0), 0, tag=2)
        y = comm.recv(np.empty(2), 0, tag=2)
        z = comm.recv(np.empty(2), 0, tag=1)
        assert y.tolist() == [2.0, 2.0] and z.tolist() == [1.0, 1.0]
        assert taken[4:] == [OTHER]   # tag 1 came from what Python kept aside
        # a size that does not fit: Python's error, and the channel goes on
        comm.send(np.ones(4, np.float32), 0, tag=3)
        with pytest.raises(ringlet.ArgumentError, match="holds 4 x float32"):
            comm.recv(np.empty(3, np.float32), 0, tag=3)
        assert taken[-1] == OTHER
        # nothing there: the compiled path says so after its spin, and Python waits
        with pytest.raises(ringlet.CommTimeoutError, match="recv from rank 0"):
            comm.recv(np.empty(1), 0, tag=8)
        assert taken[-1] == EMPTY
    # larger: a frame and payload slots (256 KiB each, 4 in a channel), whole in one call
    # while the channel has room for all of it; beyond that the Python path, slot by slot
    with ringlet.init(rank=0, size=1) as comm:
        t = comm._t
        pushed, taken = [], []
        push, take = t.push_message, t.take_message
        t.push_message, t.take_message = spy_push, spy_take  # type: ignore[method-assign]
        for nbytes in (196, 4096, (256 << 10) + 4, 600 << 10, 768 << 10):
            big = np.arange(nbytes // 4, dtype=np.int32) - 5
            comm.send(big, 0, tag=5)
            assert np.array_equal(comm.recv(np.empty_like(big), 0, tag=5), big), nbytes
        assert pushed == [True] * 5 and taken == [TAKEN] * 5
        big = np.arange((768 << 10) // 4 + 1, dtype=np.int32)
        comm.send(big, 0, tag=5)   # to itself: its own wait takes it in, slot by slot
        assert np.array_equal(comm.recv(np.empty_like(big), 0, tag=5), big)
        assert pushed[5:] == [False] and taken[5:] == []   # kept aside: nothing to take
