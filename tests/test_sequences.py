"""Error paths in sequences: a good call, a bad one, a good one... on every rank, checked.

A rank that rejects a call must leave the communicator exactly in step: the
calls after it pair with the right ones on every rank and give the right
values.  These tests run every collective with every kind of bad argument
between checked good calls, at N = 2..5 (4 and 5 are oversubscribed on a
2-core machine: where the last hang hid), on the bad rank alone and on every
rank, after async calls, and twice in a row.  A hang fails the world's call
deadline; a wrong value is counted and reported with where it happened.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import get_world, outcome

import ringlet
from ringlet.wait import INTERRUPTS

SEQ_SIZES = [2, 3, 4, 5]

# --- the good calls, each checked against numpy on every rank ------------------------------

Good = Callable[[ringlet.Communicator, int], tuple[Any, Any]]


def _all_reduce(c: ringlet.Communicator, i: int, **kw: Any) -> tuple[Any, Any]:
    x = np.full(6, c.rank + 1 + i, np.float64)
    return c.all_reduce(x, **kw), np.full(6, sum(q + 1 + i for q in range(c.size)), np.float64)


def _broadcast(c: ringlet.Communicator, i: int, **kw: Any) -> tuple[Any, Any]:
    root = kw.pop("root", i % c.size)
    x = np.full(5, c.rank * 10 + i, np.int32)
    return c.broadcast(x, root=root, **kw), np.full(5, root * 10 + i, np.int32)


def _reduce(c: ringlet.Communicator, i: int, **kw: Any) -> tuple[Any, Any]:
    root = kw.pop("root", (i + 1) % c.size)
    x = np.full(4, c.rank + i, np.int64)
    want = np.full(4, sum(q + i for q in range(c.size)), np.int64) if c.rank == root else None
    return c.reduce(x, root=root, **kw), want


def _all_gather(c: ringlet.Communicator, i: int, **kw: Any) -> tuple[Any, Any]:
    x = np.full(3, c.rank + i, np.float32)
    return c.all_gather(x, **kw), np.repeat(np.arange(c.size, dtype=np.float32)[:, None] + i,
                                            3, axis=1)


def _reduce_scatter(c: ringlet.Communicator, i: int, **kw: Any) -> tuple[Any, Any]:
    n = c.size
    x = np.arange(2 * n, dtype=np.float64) + c.rank + i
    total = sum(np.arange(2 * n, dtype=np.float64) + q + i for q in range(n))
    return c.reduce_scatter(x, **kw), total[2 * c.rank:2 * c.rank + 2]


def _all_to_all(c: ringlet.Communicator, i: int, **kw: Any) -> tuple[Any, Any]:
    n, r = c.size, c.rank
    x = np.repeat(r * 100 + np.arange(n) + i, 2).astype(np.int64)
    want = np.repeat(np.arange(n) * 100 + r + i, 2).astype(np.int64)
    return c.all_to_all(x, **kw), want


def _scatter(c: ringlet.Communicator, i: int, **kw: Any) -> tuple[Any, Any]:
    root = kw.pop("root", i % c.size)
    x = np.arange(2 * c.size, dtype=np.float64) + i if c.rank == root else None
    got = c.scatter(x, root=root, out=np.empty(2), **kw)
    return got, np.arange(2 * c.rank, 2 * c.rank + 2, dtype=np.float64) + i


def _gather(c: ringlet.Communicator, i: int, **kw: Any) -> tuple[Any, Any]:
    root = kw.pop("root", (i + 2) % c.size)
    x = np.full(2, c.rank - i, np.int16)
    want = (np.repeat(np.arange(c.size, dtype=np.int16)[:, None] - i, 2, axis=1)
            if c.rank == root else None)
    return c.gather(x, root=root, **kw), want


def _barrier(c: ringlet.Communicator, i: int, **kw: Any) -> tuple[Any, Any]:
    return c.barrier(**kw), None


def _broadcast_object(c: ringlet.Communicator, i: int, **kw: Any) -> tuple[Any, Any]:
    root = kw.pop("root", i % c.size)
    obj = {"i": i, "from": c.rank}
    return c.broadcast_object(obj, root=root), {"i": i, "from": root}


def _all_gather_object(c: ringlet.Communicator, i: int, **kw: Any) -> tuple[Any, Any]:
    return c.all_gather_object((c.rank, i)), [(q, i) for q in range(c.size)]


def _p2p(c: ringlet.Communicator, i: int, **kw: Any) -> tuple[Any, Any]:
    n, r = c.size, c.rank
    out = np.empty(3, np.float64)
    w = c.isend(np.full(3, r + i, np.float64), (r + 1) % n, tag=i % 5)
    c.recv(out, (r - 1) % n, tag=i % 5)
    w.wait()
    return out, np.full(3, (r - 1) % n + i, np.float64)


GOOD: dict[str, Callable[..., tuple[Any, Any]]] = {
    "all_reduce": _all_reduce, "broadcast": _broadcast, "reduce": _reduce,
    "all_gather": _all_gather, "reduce_scatter": _reduce_scatter, "all_to_all": _all_to_all,
    "scatter": _scatter, "gather": _gather, "barrier": _barrier,
    "broadcast_object": _broadcast_object, "all_gather_object": _all_gather_object,
    "p2p": _p2p,
}


def _same(got: Any, want: Any) -> bool:
    if want is None or got is None:
        return got is None and want is None
    if isinstance(want, np.ndarray):
        return isinstance(got, np.ndarray) and got.shape == want.shape and \
            bool(np.array_equal(got, want))
    return bool(got == want)


# --- the bad calls -------------------------------------------------------------------------

REDUCING = ("all_reduce", "reduce", "reduce_scatter")
ROOTED = ("broadcast", "reduce", "scatter", "gather")
BUFFERS = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all",
           "gather")


def _call_with_x(c: ringlet.Communicator, coll: str, x: Any) -> Any:
    return getattr(c, coll)(x)


#: kind -> (collectives it applies to, the bad call)
BAD: dict[str, tuple[tuple[str, ...], Callable[[ringlet.Communicator, str], Any]]] = {
    "unknown op": (REDUCING, lambda c, k: GOOD[k](c, 0, op="median")),
    "op None": (REDUCING, lambda c, k: GOOD[k](c, 0, op=None)),
    "band on floats": (("all_reduce", "reduce_scatter"), lambda c, k: GOOD[k](c, 0, op="band")),
    "root out of range": (ROOTED + ("broadcast_object",),
                          lambda c, k: GOOD[k](c, 0, root=c.size + 3)),
    "root a string": (ROOTED, lambda c, k: GOOD[k](c, 0, root="0")),
    "algorithm an int": (ROOTED + ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"),
                         lambda c, k: GOOD[k](c, 0, algorithm=5)),
    "algorithm a list": (("all_reduce", "broadcast", "all_gather", "all_to_all"),
                         lambda c, k: GOOD[k](c, 0, algorithm=["ring"])),
    "unknown algorithm": (("all_reduce", "gather", "reduce_scatter"),
                          lambda c, k: GOOD[k](c, 0, algorithm="telepathy")),
    "async_op a string": (("all_reduce", "broadcast", "all_gather", "barrier"),
                          lambda c, k: GOOD[k](c, 0, async_op="yes")),
    "numpy scalar": (BUFFERS, lambda c, k: _call_with_x(c, k, np.float32(1))),
    "list": (BUFFERS, lambda c, k: _call_with_x(c, k, [1.0, 2.0])),
    "Fortran order": (BUFFERS, lambda c, k: _call_with_x(
        c, k, np.asfortranarray(np.ones((2 * c.size, 3))))),
    "np.matrix": (BUFFERS, lambda c, k: _call_with_x(c, k, np.matrix(np.ones((2 * c.size, 4))))),
    "indivisible": (("reduce_scatter", "all_to_all"),
                    lambda c, k: _call_with_x(c, k, np.ones(2 * c.size + 1))),
    "out of the wrong size": (("all_reduce", "all_gather", "all_to_all"),
                              lambda c, k: getattr(c, k)(np.ones(2 * c.size), out=np.ones(7))),
    "unpicklable object": (("broadcast_object", "all_gather_object"),
                           lambda c, k: getattr(c, k)(threading.Lock())),
    "empty: shape a string": (("empty",), lambda c, k: c.empty("abc")),
    "empty: bad dtype": (("empty",), lambda c, k: c.empty(4, dtype="nonsense")),
    "split: color a string": (("split",), lambda c, k: c.split(color="x")),
    "split: color a bool": (("split",), lambda c, k: c.split(color=True)),
    "split: key a numpy bool": (("split",), lambda c, k: c.split(color=0, key=np.True_)),
}

#: kinds where only the root's arguments matter (every rank raises: the root's error travels)
_EVERY_RANK_RAISES = {"unpicklable object"}


def _cases() -> list[tuple[str, str]]:
    return [(kind, coll) for kind, (colls, _) in BAD.items() for coll in colls]


def _sequence(c: ringlet.Communicator, bad_ranks: str) -> dict[str, Any]:
    """Every (kind, collective): good, bad, good, bad, bad, async good + bad, good; all checked."""
    n, r = c.size, c.rank
    goods = list(GOOD)
    wrong: list[str] = []
    errors: list[str] = []
    step = 0

    def good() -> None:
        nonlocal step
        k = goods[step % len(goods)]
        got, want = GOOD[k](c, step)
        if not _same(got, want):
            wrong.append(f"{k} step {step}: got {got!r}, want {want!r}")
        step += 1

    def bad(kind: str, coll: str) -> None:
        _, fn = BAD[kind]
        am_bad = bad_ranks == "all" or r == 1 or kind in _EVERY_RANK_RAISES
        try:
            if am_bad or kind in _EVERY_RANK_RAISES:
                fn(c, coll)
            elif coll in GOOD:
                GOOD[coll](c, 99)
            elif coll == "empty":
                c.empty(4)
            elif coll == "split":
                c.split(color=0)
        except ringlet.RingletError as exc:
            want = ringlet.ArgumentError if am_bad else ringlet.MismatchError
            if kind in _EVERY_RANK_RAISES:
                want = ringlet.ArgumentError
            if not isinstance(exc, want):
                errors.append(f"{kind}/{coll}: {type(exc).__name__}: {exc}")
            elif am_bad and bad_ranks != "all" and kind not in _EVERY_RANK_RAISES and \
                    f"on rank {r}" not in str(exc):
                errors.append(f"{kind}/{coll}: the rank at fault is not named: {exc}")
        else:
            errors.append(f"{kind}/{coll}: no error on rank {r} ({bad_ranks} bad)")

    for kind, coll in _cases():
        good()
        bad(kind, coll)
        good()
        bad(kind, coll)
        bad(kind, coll)          # two bad calls in a row
        w = c.all_reduce(np.full(4, r, np.int64), async_op=True)
        bad(kind, coll)          # a bad call behind async work
        if not np.array_equal(w.wait(), np.full(4, n * (n - 1) // 2)):
            wrong.append(f"async all_reduce before {kind}/{coll}")
        good()
    return {"wrong": wrong, "errors": errors, "steps": step}


@pytest.mark.parametrize("n", SEQ_SIZES, ids=lambda n: f"N{n}")
@pytest.mark.parametrize("bad_ranks", ["one", "all"])
def test_bad_calls_between_good_ones(n: int, bad_ranks: str) -> None:
    world = get_world(n)
    results = world.run(_sequence, bad_ranks)
    for r, res in enumerate(results):
        assert not res["wrong"], f"rank {r}: wrong results: {res['wrong'][:5]}"
        assert not res["errors"], f"rank {r}: {res['errors'][:5]}"
        assert res["steps"] == 3 * len(_cases())


def _issue_loop(c: ringlet.Communicator, iters: int) -> list[int]:
    """The reproduction from the issue: one rank passes an unknown op every other call."""
    r, n = c.rank, c.size
    bad = []
    for i in range(iters):
        x = np.full(8, (r + 1) * 1000 + i, np.float64)
        c.all_reduce(x)
        if x[0] != sum((q + 1) * 1000 + i for q in range(n)):
            bad.append(i)
        try:
            c.all_reduce(np.ones(4, np.float32), op="median" if r == 1 else "sum")
        except (ringlet.ArgumentError, ringlet.MismatchError):
            pass
        try:
            c.broadcast(np.ones(4), root=n + 3)
        except ringlet.ArgumentError:
            pass
    return bad


@pytest.mark.parametrize("n", SEQ_SIZES, ids=lambda n: f"N{n}")
def test_issue_loop_never_wrong(n: int) -> None:
    assert get_world(n).run(_issue_loop, 150) == [[]] * n


# --- threads ---------------------------------------------------------------------------------

def _two_threads(c: ringlet.Communicator) -> dict[str, Any]:
    errors: list[str] = []
    results: list[float] = []

    def other() -> None:
        try:
            c.all_reduce(np.ones(4))
        except ringlet.ArgumentError as exc:
            errors.append(str(exc))

    c.all_reduce(np.ones(2))          # this thread owns the communicator
    t = threading.Thread(target=other, name="intruder")
    t.start()
    t.join()
    x = np.full(2, float(c.rank))
    c.all_reduce(x)                    # still in step on every rank
    results.append(float(x[0]))
    return {"errors": errors, "results": results}


def _spawned_thread_owner(c: ringlet.Communicator) -> list[float]:
    box: list[float] = []

    def body() -> None:
        y = np.ones(3)
        c.all_reduce(y)
        box.append(float(y[0]))

    t = threading.Thread(target=body)
    t.start()
    t.join()                      # the first thread has ended: the main thread takes over
    z = np.ones(2)
    c.all_reduce(z)
    box.append(float(z[0]))
    return box


@pytest.mark.parametrize("n", SEQ_SIZES, ids=lambda n: f"N{n}")
def test_second_thread_is_refused_and_the_calls_stay_in_step(n: int) -> None:
    out = ringlet.spawn(_thread_job, n, settings=ringlet.Settings(timeout=20))
    for r, res in enumerate(out):
        assert len(res["errors"]) == 1, res
        assert "thread 'intruder'" in res["errors"][0] and f"on rank {r}" in res["errors"][0]
        assert res["results"] == [n * (n - 1) / 2]
        assert res["after"] == [float(n), float(n)]


def _thread_job(c: ringlet.Communicator) -> dict[str, Any]:
    res = _two_threads(c)
    c2 = c.split(color=0)
    assert c2 is not None
    res["after"] = _spawned_thread_owner(c2)
    c2.close()
    return res


# --- KeyboardInterrupt -------------------------------------------------------------------------

_INTERRUPT = textwrap.dedent("""
    import os, signal, sys, threading, time
    import numpy as np, ringlet
    comm = ringlet.init()
    comm.all_reduce(np.ones(2))
    if comm.rank == 1:
        # interrupt this rank while it waits for rank 0 (which sleeps first)
        def soon():
            # Ctrl-C once the main thread waits inside ringlet (under load it may reach
            # the wait late, and an interrupt in the script's own code stops no call)
            def fire():
                main, end = threading.main_thread().ident, time.monotonic() + 20
                while time.monotonic() < end:
                    f, inside = sys._current_frames().get(main), False
                    while f is not None and not inside:
                        inside = os.sep + "ringlet" + os.sep in f.f_code.co_filename
                        f = f.f_back
                    if inside:
                        break
                    time.sleep(0.01)
                time.sleep(0.3)
                os.kill(os.getpid(), signal.SIGINT)

            threading.Thread(target=fire, daemon=True).start()

        try:
            mode = os.environ["MODE"]
            if mode == "sync":
                soon()
                comm.all_reduce(np.ones(2))
            elif mode == "async":   # the worker thread runs it; the main thread waits
                w = comm.all_reduce(np.ones(2), async_op=True)
                soon()
                w.wait()
            else:   # queued: a sync call behind an async one waits for the worker
                w = comm.barrier(async_op=True)
                soon()
                comm.all_reduce(np.ones(2))
        except KeyboardInterrupt:
            print("got KeyboardInterrupt", flush=True)
            open(os.environ["MARK"], "w").close()
            sys.exit(3)
    else:
        # until rank 1 was interrupted, and a moment more (its worker thread, running the
        # call, has it from then on): else under load rank 0 could come first and the
        # call complete on rank 1 (its data posted), leaving nothing to interrupt
        end = time.monotonic() + 30
        while not os.path.exists(os.environ["MARK"]) and time.monotonic() < end:
            time.sleep(0.05)
        time.sleep(1.0)
        try:
            if os.environ["MODE"] == "queued":
                comm.barrier()
            comm.all_reduce(np.ones(2))   # may complete: rank 1 had posted its data
            comm.barrier()
        except ringlet.PeerError as exc:
            print("peer error:", exc, flush=True)
            sys.exit(4)
    print("no error", flush=True)
""")


@pytest.mark.parametrize("n,mode", [(2, "sync"), (5, "sync"), (3, "async"), (3, "queued")],
                         ids=lambda v: f"N{v}" if isinstance(v, int) else v)
def test_keyboard_interrupt_reaches_the_rank_and_its_peers_hear_why(tmp_path: Any, n: int,
                                                                     mode: str) -> None:
    """Ctrl-C while a rank waits in a call fails the call on every rank: inline, and
    while it waits for a Work its worker thread runs (async, or a call queued behind
    one), which went on running: the peers heard nothing and waited for it.  Under load
    the interrupt may come before the queued call reaches its wait: the collective
    wrapper passes it on too (it was lost there, and the peers passed the async call)."""
    script = tmp_path / "interrupt.py"
    script.write_text(_INTERRUPT)
    p = subprocess.run([sys.executable, "-m", "ringlet.cli", "run", "-n", str(n), "--grace", "10",
                        str(script)], capture_output=True, text=True, timeout=60,
                       env={**__import__("os").environ, "RINGLET_TIMEOUT": "20", "MODE": mode,
                            "MARK": str(tmp_path / "interrupted")})
    out = p.stdout + p.stderr
    assert "[1] got KeyboardInterrupt" in out, out
    call = "barrier #2" if mode == "queued" else "all_reduce #2"
    assert f"[0] peer error: rank 1 was interrupted (KeyboardInterrupt) in {call}" in out, out
    assert p.returncode == 3, out


class _EndsMeanwhile(threading.Event):
    """A Work's event: Ctrl-C during its wait, and the call ends (its worker past the end
    of the call) between Work.wait's check that it is still pending and its note for the
    worker: the interleaving a real Ctrl-C can hit."""

    def __init__(self, comm: ringlet.Communicator) -> None:
        super().__init__()
        self.comm, self.armed = comm, False

    def wait(self, timeout: float | None = None) -> bool:
        self.armed = True
        raise KeyboardInterrupt

    def is_set(self) -> bool:
        if self.armed:
            self.armed = False
            end = time.monotonic() + 10
            while self.comm._inflight and time.monotonic() < end:
                time.sleep(0.01)
            return False
        return super().is_set()


def _interrupt_after_the_end(comm: ringlet.Communicator) -> list[Any]:
    got: list[Any] = []
    w = comm.all_reduce(np.ones(4), async_op=True)
    if comm.rank == 1 and not w._done.is_set():
        w._done = _EndsMeanwhile(comm)
        with contextlib.suppress(KeyboardInterrupt):
            w.wait()
        w._done = threading.Event()
        w._done.set()
    w.wait()
    time.sleep(0.5 if comm.rank == 0 else 0.2)   # rank 1's next call waits for rank 0
    try:
        got.append(float(comm.all_reduce(np.ones(4), async_op=True).wait()[0]))
    except BaseException as exc:  # noqa: BLE001 - reported
        got.append(f"{type(exc).__name__}: {exc}")
    return got


def test_ctrl_c_in_a_wait_for_a_call_that_ended_does_not_fail_a_later_one() -> None:
    """A Work.wait() interrupted as its call ended is benign; its note for the worker was
    left behind, and the next async call raised KeyboardInterrupt (and aborted)."""
    got = ringlet.spawn(_interrupt_after_the_end, 2, settings=ringlet.Settings(timeout=20))
    assert got == [[2.0], [2.0]], got


def _outcomes(*calls: Callable[[], Any]) -> list[str]:
    """Each call's outcome: "ok" or its error's type and message."""
    got = []
    for call in calls:
        try:
            call()
            got.append("ok")
        except BaseException as exc:  # noqa: BLE001 - reported
            got.append(f"{type(exc).__name__}: {exc}")
    return got


def _interrupted_async(comm: ringlet.Communicator) -> list[str]:
    if comm.rank == 0:
        time.sleep(1.0)   # rank 1's call waits for this rank
    w = comm.all_reduce(np.ones(4), async_op=True)
    if comm.rank == 1:
        t = time.monotonic() + 10
        while w._runner is None and time.monotonic() < t:
            time.sleep(0.01)
        time.sleep(0.2)
        INTERRUPTS[w._runner] = KeyboardInterrupt()   # Ctrl-C in a wait() of it
    # rank 1: the call's wait() twice; rank 0, whose call may still pair with the data
    # rank 1 had posted, its next call too
    return _outcomes(w.wait, w.wait if comm.rank == 1 else comm.barrier)


def test_an_interrupted_async_call_fails_with_what_its_peers_heard() -> None:
    """Ctrl-C in a wait for an async call fails it on every rank; its Work's own error,
    raised by a later wait() on the rank interrupted (whose main thread had its own
    KeyboardInterrupt), is the PeerError its peers get: it was KeyboardInterrupt again,
    which a handler of the first Ctrl-C would not expect from a wait()."""
    got = ringlet.spawn(_interrupted_async, 2, settings=ringlet.Settings(timeout=20))
    want = "PeerError: rank 1 was interrupted (KeyboardInterrupt) in all_reduce #1"
    assert got[1][0] == got[1][1] and got[1][0].startswith(want), got
    assert got[0][1].startswith(want), got


def _interrupted_close(comm: ringlet.Communicator) -> list[str]:
    import signal

    got: list[str] = []
    if comm.rank == 0:
        time.sleep(1.0)   # rank 1's call waits for this rank
    w = comm.all_reduce(np.ones(4), async_op=True)
    if comm.rank == 1:
        signal.signal(signal.SIGINT, signal.default_int_handler)   # CI's may ignore it
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        try:
            comm.close()   # waits for the call in flight: Ctrl-C there
            got.append("closed")
        except KeyboardInterrupt:
            got.append("KeyboardInterrupt")
    return got + _outcomes(w.wait, comm.barrier)


def test_ctrl_c_in_close_stops_the_call_in_flight_on_every_rank() -> None:
    """Ctrl-C while close() waits for an async call in flight fails that call on every
    rank, as in any wait for it: the worker thread went on with it, and the peers heard
    only that the rank closed, at its exit."""
    got = ringlet.spawn(_interrupted_close, 2, settings=ringlet.Settings(timeout=20))
    want = "PeerError: rank 1 was interrupted (KeyboardInterrupt) in all_reduce #1"
    assert got[1][0] == "KeyboardInterrupt" and got[1][1].startswith(want), got
    assert got[0][1].startswith(want), got


# --- messages ----------------------------------------------------------------------------------

def _skipped(c: ringlet.Communicator) -> str:
    try:
        c.all_reduce(np.ones(8 if c.rank == 0 else 4))   # as if rank 1 skipped a call
    except ringlet.MismatchError as exc:
        return str(exc)
    return ""


def test_a_skipped_call_is_explained() -> None:
    for m in get_world(2).run(_skipped_ok):
        assert "count of all_reduce #" in m and "paired by their order" in m, m


def _skipped_ok(c: ringlet.Communicator) -> str:
    return _skipped(c)


def _shapes(c: ringlet.Communicator) -> Any:
    x = np.ones((2, 3)) if c.rank == 0 else np.ones((3, 2))
    return c.all_reduce(x)


def test_shapes_must_agree_not_only_counts() -> None:
    errs = get_world(2).run_expect_errors(_shapes)
    assert set(errs) == {0, 1}
    for t, m in errs.values():
        assert t == "MismatchError"
        assert "shape of all_reduce #" in m and "(2, 3)" in m and "(3, 2)" in m


def _split_vs_gather(c: ringlet.Communicator) -> Any:
    if c.rank == 0:
        return c.split(color=0)
    return c.all_gather(np.ones(1))


def test_mismatch_names_the_calls_users_made() -> None:
    errs = get_world(2).run_expect_errors(_split_vs_gather)
    for _, m in errs.values():
        assert "split" in m and "all_gather" in m, m
        assert "rank 0: split" in m


def _bcast_obj_mismatch(c: ringlet.Communicator) -> Any:
    if c.rank == 0:
        return c.broadcast_object({"a": 1})
    return c.broadcast(np.zeros(1, np.int64))


def test_mismatch_names_broadcast_object() -> None:
    errs = get_world(2).run_expect_errors(_bcast_obj_mismatch)
    assert all("broadcast_object" in m for _, m in errs.values()), errs


def _unpicklable_root(c: ringlet.Communicator) -> Any:
    return c.broadcast_object(threading.Lock() if c.rank == 0 else None)


def test_every_rank_hears_why_an_object_did_not_pickle() -> None:
    errs = get_world(3).run_expect_errors(_unpicklable_root)
    assert set(errs) == {0, 1, 2}
    for t, m in errs.values():
        assert t == "ArgumentError" and "rank 0 could not pickle" in m and "lock" in m, m


def _foreign_ops(c: ringlet.Communicator) -> list[float]:
    import mpi4py
    import torch.distributed as dist

    mpi4py.rc.initialize = False      # the op constants only: no MPI job, no MPICH files
    mpi4py.rc.finalize = False
    from mpi4py import MPI

    out = []
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, MPI.SUM, MPI.PROD):
        x = np.full(2, c.rank + 2.0)
        c.all_reduce(x, op=op)
        out.append(float(x[0]))
    return out


def test_torch_and_mpi4py_ops_are_accepted() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("mpi4py")
    out = ringlet.spawn(_foreign_ops, 2)
    assert out == [[5.0, 3.0, 5.0, 6.0]] * 2


def test_every_torch_and_mpi4py_op_parses_to_ringlets() -> None:
    """Every op of mpi4py's with a ringlet counterpart (the logical ones and MINLOC/MAXLOC
    were "unknown reduction op"), and torch's ReduceOp objects as well as its names."""
    torch_dist = pytest.importorskip("torch.distributed")
    mpi = pytest.importorskip("mpi4py.MPI")
    from ringlet.ops import ReduceOp

    for op in ReduceOp:
        if op is not ReduceOp.AVG:
            assert ReduceOp.parse(getattr(mpi, op.name)) is op
    for name, op in (("SUM", ReduceOp.SUM), ("PRODUCT", ReduceOp.PROD),
                     ("MAX", ReduceOp.MAX), ("AVG", ReduceOp.AVG), ("BXOR", ReduceOp.BXOR)):
        red = getattr(torch_dist.ReduceOp, name)
        assert ReduceOp.parse(red) is op
        assert ReduceOp.parse(torch_dist.ReduceOp(red)) is op
    with pytest.raises(ringlet.ArgumentError, match="unknown reduction op"):
        ReduceOp.parse(mpi.REPLACE)


def _recv_wrong_tag(c: ringlet.Communicator, src: int = 0) -> str:
    x = np.ones(4)
    if c.rank == 0:
        c.send(x, 1, tag=3)
        time.sleep(2.5)   # stays open: rank 1 times out
        return ""
    try:
        c.recv(x, src, tag=7)
    except ringlet.CommTimeoutError as exc:
        return str(exc)
    return "no timeout"


@pytest.mark.waits
def test_p2p_timeout_from_any_rank_says_what_is_pending() -> None:
    out = ringlet.spawn(_recv_wrong_tag, 2, ringlet.ANY_SOURCE,
                        settings=ringlet.Settings(timeout=1.0))
    assert "no rank has sent this rank a message it matches" in out[1], out[1]
    assert "rank 0 tag 3 (32 B)" in out[1] and "collective order" not in out[1], out[1]


@pytest.mark.waits
def test_p2p_timeout_says_what_is_pending() -> None:
    out = ringlet.spawn(_recv_wrong_tag, 2, settings=ringlet.Settings(timeout=1.0))
    assert "recv from rank 0 (tag 7)" in out[1]
    assert "tag 3 (32 B)" in out[1] and "same tag" in out[1], out[1]


def _late_message(c: ringlet.Communicator) -> list[str]:
    """Rank 1's receive times out; rank 0's message comes after it.  The receive that
    raised must not fill its buffer then (it stayed posted), and the communicator is
    aborted on both ranks, as after a collective's timeout."""
    if c.rank == 0:
        time.sleep(1.6)
        c.send(np.full(4, 7.0), 1, tag=1)   # eager: into the channel, after the timeout
        time.sleep(1.0)
        return [outcome(c.barrier)]
    x = np.zeros(4)
    first = outcome(lambda: c.recv(x, 0, tag=1))
    time.sleep(1.5)   # the message is in the channel by now
    again = outcome(lambda: c.recv(np.zeros(4), 0, tag=1))
    return [first, str(x.tolist()), again]


@pytest.mark.waits
def test_a_p2p_timeout_aborts_the_communicator_and_a_late_message_fills_nothing() -> None:
    out = ringlet.spawn(_late_message, 2, settings=ringlet.Settings(timeout=1.0))
    first, x, again = out[1]
    assert first.startswith("CommTimeoutError: timed out after 1 s in recv from rank 0"), first
    assert x == "[0.0, 0.0, 0.0, 0.0]", x   # the late message went nowhere
    assert again.startswith("PeerError: the communicator was aborted earlier: rank 1: timed "
                            "out after 1 s in recv from rank 0 (tag 1)"), again
    assert "CommTimeoutError" in out[0][0] and "rank 1: timed out" in out[0][0], out[0]


def _poll_is_completed(c: ringlet.Communicator) -> str:
    """A receive nobody sends to, polled with is_completed() instead of waited for: the
    polling ends at the operation's deadline, and wait() raises the timeout."""
    if c.rank == 0:
        time.sleep(2.5)
        return ""
    w = c.irecv(np.zeros(2), 0, tag=5)
    t0 = time.monotonic()
    while not w.is_completed():
        if time.monotonic() - t0 > 10:
            return "still polling after 10 s"
        time.sleep(0.01)
    took = time.monotonic() - t0
    return f"{took < 2.0} {outcome(w.wait)}"


@pytest.mark.waits
def test_polling_is_completed_keeps_the_deadline() -> None:
    out = ringlet.spawn(_poll_is_completed, 2, settings=ringlet.Settings(timeout=1.0))
    assert out[1].startswith("True CommTimeoutError: timed out after 1 s in recv from rank 0 "
                             "(tag 5): rank 0 has not sent this rank a message"), out[1]


def _second_thread_p2p(c: ringlet.Communicator) -> str:
    """A receive waits in one thread while another sends the message its reply answers:
    the send goes at once (it used to wait behind the receive's lock until the
    deadline), and the reply comes."""
    if c.rank == 1:
        x = c.recv(np.zeros(1), 0, tag=1)
        c.send(x + 1, 0, tag=2)
        return ""
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(float(c.recv(np.zeros(1), 1, tag=2)[0])))
    t.start()
    time.sleep(0.3)   # the receive is waiting
    t0 = time.monotonic()
    c.send(np.ones(1), 1, tag=1)
    quick = time.monotonic() - t0 < 1.0
    t.join()
    return f"{quick} {got}"


@pytest.mark.waits
def test_point_to_point_on_two_threads_does_not_wait_for_each_other() -> None:
    out = ringlet.spawn(_second_thread_p2p, 2, settings=ringlet.Settings(timeout=5.0))
    assert out[0] == "True [2.0]", out[0]


def _probe_wrong_tag(c: ringlet.Communicator) -> str:
    if c.rank == 0:
        c.send(np.ones(2), 1, tag=3)
        time.sleep(2.0)
        return ""
    return outcome(lambda: c.probe(0, tag=2))


@pytest.mark.waits
def test_probe_timeout_says_what_is_pending() -> None:
    out = ringlet.spawn(_probe_wrong_tag, 2, settings=ringlet.Settings(timeout=1.0))
    assert "probe for a message from rank 0 (tag 2)" in out[1], out[1]
    assert "tag 3 (16 B)" in out[1] and "collective order" not in out[1], out[1]


def _recv_nothing(c: ringlet.Communicator) -> str:
    if c.rank == 0:
        return ""
    return outcome(lambda: c.recv(np.ones(4), 0, tag=0))


def test_recv_from_a_rank_that_closed_without_sending() -> None:
    out = ringlet.spawn(_recv_nothing, 2, settings=ringlet.Settings(timeout=5.0))
    assert out[1].startswith("PeerError: rank 0 closed the communicator"), out[1]
    assert "it has not sent this rank a message" in out[1], out[1]


def _exits_without_calling(c: ringlet.Communicator) -> str:
    if c.rank == 0:
        return ""
    try:
        c.all_reduce(np.ones(4))
    except ringlet.RingletError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def test_a_peer_that_closed_is_not_reported_as_dead() -> None:
    out = ringlet.spawn(_exits_without_calling, 3, settings=ringlet.Settings(timeout=10.0))
    for m in out[1:]:
        assert "rank 0 closed the communicator" in m and "died" not in m, m


def _split_peer_returns(c: ringlet.Communicator) -> str:
    sub = c.split(0)
    if c.rank == 1:
        return ""    # returns without closing sub: spawn closes it with the world
    return outcome(lambda: sub.all_reduce(np.ones(4)))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_spawned_rank_that_returned_closed_its_split_communicators(method: str) -> None:
    """A spawned rank whose function returns closes every communicator it made, as a
    program that ends does: its peers on a split are told it closed, not that it died."""
    out = ringlet.spawn(_split_peer_returns, 3,
                        settings=ringlet.Settings(timeout=10.0, start_method=method))
    for m in (out[0], out[2]):
        assert "rank 1 closed the communicator" in m and "died" not in m, m


def _closed_after_three(c: ringlet.Communicator) -> Any:
    """Rank 1 makes three calls and closes; rank 0 then asks its transport whether that
    is an error while it is in call 3 (no: rank 1 finished it), in call 4 and between
    calls (yes)."""
    for _ in range(3):
        c.barrier()
    if c.rank == 1:
        c.close()
        return None
    t = c._t
    state = [t.calls()]   # between calls: (0, 3)
    deadline = time.monotonic() + 10
    while not t.closed(1) and time.monotonic() < deadline:   # type: ignore[attr-defined]
        time.sleep(0.005)
    verdicts = []
    for now in (3, 4, 0):
        t.calls = lambda now=now: (now, max(now - 1, 0))   # type: ignore[misc]
        try:
            t.check([1], f"call {now}")
            verdicts.append("ok")
        except ringlet.PeerError as exc:
            verdicts.append(str(exc))
    return state, verdicts


def test_a_peer_that_closed_after_finishing_the_call_is_no_error() -> None:
    """gloo's ring all_reduce (and a shared-memory sender) can finish on one rank while
    another still receives; the first may then close.  Its closed notice says how many
    calls it finished, and only a rank waiting in a later call (or in a point-to-point
    wait) calls it an error (a 3-node CI run failed so on all_reduce #585)."""
    state, verdicts = ringlet.spawn(_closed_after_three, 2)[0]
    assert state == [(0, 3)], state
    assert verdicts[0] == "ok", verdicts
    for v in verdicts[1:]:
        assert "rank 1 closed the communicator" in v, verdicts


def _calls_state(c: ringlet.Communicator) -> Any:
    seen: list[tuple[int, int]] = []

    @contextlib.contextmanager
    def span(what: str, alg: str, nbytes: int) -> Any:
        seen.append(c._t.calls())
        yield

    c.all_reduce(np.ones(4))            # 1 (the compiled path, where it applies)
    seen.append(c._t.calls())
    c._span = span
    c.broadcast(np.ones(4), root=0)     # 2
    works = [c.all_reduce(np.ones(4), async_op=True) for _ in range(2)]   # 3, 4 (queued)
    for w in works:
        w.wait()
    seen.append(c._t.calls())
    c._span = None
    return seen


def test_the_transport_knows_the_call_in_progress_and_the_calls_finished() -> None:
    for seen in ringlet.spawn(_calls_state, 3):
        assert seen == [(0, 1), (2, 1), (3, 2), (4, 3), (0, 4)], seen


def _close_in_a_callback(c: Any) -> list[str]:
    """A callback of an asynchronous call runs on the communicator's worker thread: a
    close() there raises instead of waiting for itself; the call's result stands, and
    close() from the rank's own thread works afterwards."""
    sub = c.split(color=0)
    seen: list[str] = []

    def close_here(_w: Any) -> None:
        try:
            sub.close()
            seen.append("closed")
        except ringlet.RingletError as exc:
            seen.append(str(exc))

    w = sub.all_reduce(np.ones(4), async_op=True)
    w._then(close_here)
    got = w.wait()
    deadline = time.monotonic() + 5
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    sub.close()
    return [*seen, f"sum {got[0]:g}"]


@pytest.mark.parametrize("n", [2], ids=lambda n: f"N{n}")
def test_close_from_a_callback_on_the_worker_thread_raises_instead_of_hanging(n: int) -> None:
    for res in get_world(n).run(_close_in_a_callback):
        assert len(res) == 2 and "own worker thread" in res[0], res
        assert res[1] == f"sum {n}", res
