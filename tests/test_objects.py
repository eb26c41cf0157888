"""Object calls built on the others: gather_object and scatter_object (uneven gather and
scatter of pickles), send_object and recv_object; unpicklable objects are an
ArgumentError on every rank, and the communicator works after it."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

import ringlet


def _objects(comm: ringlet.Communicator) -> list[str]:
    n, r = comm.size, comm.rank
    bad = []
    for root in sorted({0, n - 1}):
        obj = {"rank": r, "data": list(range(r * 7))}       # sizes differ by rank
        got = comm.gather_object(obj, root)
        want = [{"rank": q, "data": list(range(q * 7))} for q in range(n)]
        if (got != want) if r == root else (got is not None):
            bad.append(f"gather_object root {root}: {got}")
        objs = [("for", q, "x" * q) for q in range(n)] if r == root else None
        mine = comm.scatter_object(objs, root)
        if mine != ("for", r, "x" * r):
            bad.append(f"scatter_object root {root}: {mine}")
    if n > 1:   # a ring of objects, by tag
        dst, src = (r + 1) % n, (r - 1) % n
        t = threading.Thread(target=comm.send_object, args=({"from": r, "big": b"y" * 70000},
                                                           dst, 5))
        # one thread makes the communicator's calls; p2p may overlap on another
        t.start()
        got = comm.recv_object(src, 5)
        t.join()
        if got != {"from": src, "big": b"y" * 70000}:
            bad.append(f"recv_object {str(got)[:40]}")
    return bad


def test_object_calls(world: Any) -> None:
    for r, bad in enumerate(world.run(_objects)):
        assert not bad, f"rank {r}: {bad}"


def _unpicklable(comm: ringlet.Communicator) -> list[tuple[str, str]]:
    n, r = comm.size, comm.rank
    out = []
    for call in ("gather", "scatter"):
        try:
            if call == "gather":
                comm.gather_object(threading.Lock() if r == n - 1 else r, 0)
            else:
                comm.scatter_object([threading.Lock()] * n if r == 0 else None, 0)
        except ringlet.RingletError as exc:
            out.append((type(exc).__name__, str(exc)))
        else:
            out.append(("", ""))
        assert comm.gather_object(r, 0) == (list(range(n)) if r == 0 else None)
    return out


def test_unpicklable_objects(world: Any) -> None:
    for res in world.run(_unpicklable):
        for kind, msg in res:
            assert kind == "ArgumentError" and "pickle" in msg, res


#: this process's rank, for _fussy_load (each rank is a process of its own)
_ME = [0]


def _fussy_load(payload: int) -> int:
    """Unpickling fails on odd ranks, as a class only some ranks can import does."""
    if _ME[0] % 2:
        raise ModuleNotFoundError("No module named 'only_on_even_ranks'")
    return payload


class _Fussy:
    def __init__(self, payload: int) -> None:
        self.payload = payload

    def __reduce__(self) -> tuple[Any, tuple[int]]:
        return _fussy_load, (self.payload,)


def _unloadable(comm: ringlet.Communicator) -> list[tuple[str, str]]:
    n, r = comm.size, comm.rank
    _ME[0] = r
    out = []
    for call in ("broadcast", "all_gather", "gather", "scatter"):
        try:
            if call == "broadcast":
                comm.broadcast_object(_Fussy(7) if r == 0 else None, 0)
            elif call == "all_gather":
                comm.all_gather_object(_Fussy(r))
            elif call == "gather":
                comm.gather_object(_Fussy(r), 1)            # rank 1 unpickles them
            else:
                comm.scatter_object([_Fussy(q) for q in range(n)] if r == 0 else None, 0)
        except ringlet.RingletError as exc:
            out.append((type(exc).__name__, str(exc)))
        else:
            out.append(("", ""))
        assert comm.all_gather_object(r) == list(range(n))   # the next call works
    return out


def test_objects_that_do_not_unpickle_on_some_ranks_fail_every_rank() -> None:
    """An object only some ranks can unpickle (its class's module is not there): an
    ArgumentError on every rank naming the ranks that could not, each of them saying why,
    not a bare exception on those ranks alone; the next call works."""
    from conftest import get_world

    n = 3
    for r, res in enumerate(get_world(n).run(_unloadable)):
        for kind, msg in res:
            assert kind == "ArgumentError", (r, res)
            assert "rank 1 could not unpickle the objects received" in msg, (r, res)
            assert ("No module named 'only_on_even_ranks'" in msg) == (r == 1), (r, res)


def _p2p_objects_that_fail(comm: ringlet.Communicator) -> list[tuple[str, str]]:
    """send_object of an object that does not pickle, then one the receiver cannot
    unpickle: an ArgumentError on both ranks at once (not the receiver's deadline); the
    next object goes through."""
    r = comm.rank
    _ME[0] = r + 1   # rank 0 cannot unpickle a _Fussy
    out = []
    for obj in (threading.Lock(), _Fussy(3)):
        try:
            if r == 1:
                comm.send_object(obj, 0, tag=2)
            else:
                comm.recv_object(1, tag=2)
        except ringlet.RingletError as exc:
            out.append((type(exc).__name__, str(exc)))
        else:
            out.append(("", ""))
    if r == 1:
        comm.send_object("next", 0)
    elif comm.recv_object(1) != "next":
        out.append(("the next object", "did not arrive"))
    return out


def test_point_to_point_objects_that_fail_fail_the_receiver_too() -> None:
    from conftest import get_world

    got = get_world(2).run(_p2p_objects_that_fail)
    recv, send = got
    assert recv[0][0] == send[0][0] == "ArgumentError", got
    assert "rank 1's send_object could not pickle its object (TypeError" in recv[0][1], got
    assert "the object does not pickle" in send[0][1] and "rank 0's recv_object" in \
        send[0][1], got
    assert recv[1][0] == "ArgumentError" and "could not unpickle the object from rank 1 " \
        "(ModuleNotFoundError" in recv[1][1], got
    assert send[1] == ("", ""), got   # its object pickled and was sent
    assert len(recv) == 2, got


class _Interrupting:
    """Pickling it is interrupted by Ctrl-C (the KeyboardInterrupt raised as SIGINT would:
    not the signal itself, which a process started in the background ignores)."""

    def __reduce__(self) -> Any:
        raise KeyboardInterrupt


def _interrupted_while_pickling(comm: ringlet.Communicator) -> tuple[str, str]:
    """Ctrl-C on rank 1 while it pickles its object, before the call's first part: rank 1
    raises KeyboardInterrupt and its peers a PeerError naming it and the call, not the
    wrong call's data (or their deadline)."""
    try:
        # every rank past ringlet.init first: under load a peer still finishing it heard
        # of the abort there ("ringlet.init failed: ..."), and spawn reported that instead
        comm.barrier()
        comm.all_gather_object(_Interrupting() if comm.rank == 1 else comm.rank)
        comm.all_gather_object(comm.rank)
    except KeyboardInterrupt:
        return "KeyboardInterrupt", ""
    except ringlet.RingletError as exc:
        return type(exc).__name__, str(exc)
    return "", ""


def test_ctrl_c_while_an_object_call_pickles_fails_its_peers() -> None:
    got = ringlet.spawn(_interrupted_while_pickling, 3, settings=ringlet.Settings(timeout=20))
    assert got[1][0] == "KeyboardInterrupt", got
    for kind, msg in (got[0], got[2]):
        assert kind == "PeerError", got
        assert msg.startswith("rank 1 was interrupted (KeyboardInterrupt) in "
                              "all_gather_object (call #"), got


class _Exiting:
    """Pickling it raises SystemExit (a signal handler's sys.exit, say), which the
    caller catches."""

    def __reduce__(self) -> Any:
        raise SystemExit(3)


def _exited_while_pickling(comm: ringlet.Communicator) -> tuple[str, str]:
    """SystemExit on rank 1 while it pickles its object, before the call's first part,
    caught there: its peers raise a PeerError naming it and the call; they paired the
    call with rank 1's next one, and returned that call's objects as this one's."""
    comm.barrier()
    try:
        got = comm.all_gather_object(_Exiting() if comm.rank == 1 else 1)
    except SystemExit:
        pass
    except ringlet.RingletError as exc:
        return type(exc).__name__, str(exc)
    else:
        return "returned", repr(got)
    try:
        comm.all_gather_object(comm.rank)
    except ringlet.RingletError as exc:
        return "SystemExit", f"{type(exc).__name__}: {exc}"
    return "SystemExit", "the next call ran"


def test_system_exit_while_an_object_call_pickles_fails_its_peers() -> None:
    got = ringlet.spawn(_exited_while_pickling, 3, settings=ringlet.Settings(timeout=20))
    assert got[1] == ("SystemExit", "PeerError: the communicator was aborted earlier: "
                      "rank 1 failed in all_gather_object (call #2): SystemExit: 3"), got
    for kind, msg in (got[0], got[2]):
        assert kind == "PeerError", got
        assert msg.startswith("rank 1 failed in all_gather_object (call #2): "
                              "SystemExit: 3"), got


def _interrupted_behind_async_work(comm: ringlet.Communicator) -> list[str]:
    """Ctrl-C on rank 1 while it pickles an object call's argument with an async call in
    flight, which ends before its worker waits again (held in a callback, as a torch
    future's): the interrupt was dropped with the async call, and rank 1's next object
    call paired with the one its peers made for the interrupted call."""
    got = []
    if comm.rank == 1:
        held, ended = threading.Event(), threading.Event()
        w = comm.all_reduce(np.ones(4), async_op=True)
        # the worker lingers after the call's end; Ctrl-C comes once it has ended (under
        # load it came while the worker still waited in it, which stops that call instead)
        w._then(lambda w: (ended.set(), held.wait(10)))
        ended.wait(10)
        threading.Timer(0.5, held.set).start()
        try:
            comm.all_gather_object(_Interrupting())
        except KeyboardInterrupt:
            got.append("KeyboardInterrupt")
        w.wait()
        time.sleep(0.5)
    else:
        comm.all_reduce(np.ones(4))
    try:
        got.append(repr(comm.all_gather_object(comm.rank)))
    except ringlet.RingletError as exc:
        got.append(f"{type(exc).__name__}: {exc}")
    return got


@pytest.mark.parametrize("n", [3, 4])
def test_ctrl_c_outside_a_wait_behind_async_work_aborts(n: int) -> None:
    got = ringlet.spawn(_interrupted_behind_async_work, n, settings=ringlet.Settings(timeout=20))
    assert got[1][0] == "KeyboardInterrupt", got
    assert got[1][1].startswith("PeerError: the communicator was aborted earlier: rank 1 was "
                                "interrupted (KeyboardInterrupt) in all_gather_object"), got
    for q in range(n):
        if q != 1:
            assert got[q] == ["PeerError: rank 1 was interrupted (KeyboardInterrupt) in "
                              "all_gather_object (call #2)"], got
