"""Receiving from any source and with any tag, probe and iprobe, batch_isend_irecv:
matching order (first posted receive, first arrived message), the status of what
arrived, and bad arguments."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ringlet
from ringlet import ANY_SOURCE, ANY_TAG


def _gather_any(comm: ringlet.Communicator) -> list[str]:
    """Rank 0 receives one message from every other rank, in whatever order they come."""
    n, r = comm.size, comm.rank
    bad = []
    if r == 0:
        seen = set()
        for _ in range(n - 1):
            st = comm.probe()
            if st.tag != 10 + st.source or st.count != 3 or st.dtype != "int64":
                bad.append(f"probe {st}")
            x = np.empty(3, np.int64)
            w = comm.irecv(x, ANY_SOURCE, ANY_TAG)
            w.wait()
            if w.source != st.source or w.tag != st.tag or x.tolist() != [w.source] * 3:
                bad.append(f"recv from {w.source} tag {w.tag}: {x}")
            seen.add(w.source)
        if seen != set(range(1, n)):
            bad.append(f"sources {seen}")
        if comm.iprobe() is not None:
            bad.append("iprobe found a message after all were taken")
    else:
        comm.send(np.full(3, r, np.int64), 0, tag=10 + r)
    comm.barrier()
    return bad


def _order(comm: ringlet.Communicator) -> list[str]:
    """Messages from one source in order; a specific receive posted before an any-source
    one takes the first message it matches, the any-source one the first of the rest
    (the same whenever the messages arrive)."""
    r = comm.rank
    bad = []
    if r == 1:
        works = [comm.isend(np.array([k], np.int32), 0, tag=7 if k % 2 else 5)
                 for k in range(4)]
        for w in works:
            w.wait()
    elif r == 0:
        a, b = np.empty(1, np.int32), np.empty(1, np.int32)
        wa = comm.irecv(a, 1, 7)                 # posted first: takes k=1
        wb = comm.irecv(b, ANY_SOURCE, ANY_TAG)  # the first of the rest: k=0
        wa.wait(), wb.wait()
        rest = [comm.recv(np.empty(1, np.int32), ANY_SOURCE, ANY_TAG)[0] for _ in range(2)]
        if (a[0], b[0], rest) != (1, 0, [2, 3]) or wb.tag != 5 or wa.source != 1:
            bad.append(f"order a={a[0]} b={b[0]} rest={rest} tag {wb.tag}")
    comm.barrier()
    return bad


def _batch(comm: ringlet.Communicator) -> list[str]:
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    x, y = np.full(5, float(r)), np.empty(5)
    works = comm.batch_isend_irecv([("recv", y, left, 3), ("send", x, right, 3)])
    for w in works:
        w.wait()
    return [] if y.tolist() == [float(left)] * 5 and works[0].source == left else [str(y)]


def _sendrecv(comm: ringlet.Communicator) -> list[str]:
    """A ring shift by sendrecv, small and larger than a channel holds (a send that
    waits for its receiver), then from any source; each checked."""
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    bad = []
    for count in (3, 300_000):   # 2.4 MB: beyond the eager channel
        x, y = np.full(count, float(r)), np.empty(count)
        got = comm.sendrecv(x, right, y, left, sendtag=4, recvtag=4)
        if got is not y or not (y == left).all():
            bad.append(f"{count}: {y[:3]}")
    z = comm.sendrecv(np.full(2, r, np.int32), right, np.empty(2, np.int32))
    if z.tolist() != [left] * 2:
        bad.append(f"any source: {z}")
    return bad


def _sendrecv_that_does_not_fit(comm: ringlet.Communicator) -> Any:
    """Rank 0's receive does not fit rank 1's message (an ArgumentError, the communicator
    usable): its send of 4 MiB, larger than a channel holds, is done before sendrecv
    raises, so that what rank 0 then writes into x is not what rank 1 receives."""
    if comm.rank == 0:
        x = np.zeros(1 << 20, np.float32)
        try:
            comm.sendrecv(x, 1, np.empty(3), 1)
        except ringlet.ArgumentError as exc:
            x[:] = 7
            return str(exc)
        return "no error"
    y = np.empty(1 << 20, np.float32)
    comm.sendrecv(np.ones(5), 0, y, 0)
    return bool((y == 0).all())


def test_sendrecv_that_raises_has_sent_first() -> None:
    from conftest import get_world

    err, intact = get_world(2).run(_sendrecv_that_does_not_fit)
    assert "holds 5 x float64, but the receive buffer holds 3 x float64" in err, err
    assert intact is True


@pytest.mark.parametrize("body", [_gather_any, _batch, _sendrecv])
def test_any_source_probe_and_batch(world: Any, body: Any) -> None:
    for r, bad in enumerate(world.run(body)):
        assert not bad, f"rank {r}: {bad}"


def test_matching_order() -> None:
    from conftest import get_world

    for r, bad in enumerate(get_world(3).run(_order)):
        assert not bad, f"rank {r}: {bad}"


def _blocking(comm: ringlet.Communicator) -> list[str]:
    """Blocking send and recv take a message that is already there without a wait; a
    receive posted before them still comes first, and a message that does not fit is
    an error at the receiver that leaves the stream usable."""
    r = comm.rank
    bad: list[str] = []
    if r == 1:   # (a channel holds 4 messages: a fifth would wait for rank 0)
        for k, tag in enumerate((7, 7, 5, 6)):
            comm.send(np.array([k], np.int32), 0, tag=tag)   # eager: in the channel now
    comm.barrier()      # rank 1's messages have all arrived at rank 0 (none taken yet)
    if r == 0:
        c = comm.recv(np.empty(1, np.int32), 1, 6)   # k=3: k=0..2 are kept aside
        a, b = np.empty(1, np.int32), np.empty(1, np.int32)
        wa = comm.irecv(a, 1, 7)            # the first kept with tag 7: k=0
        comm.recv(b, 1, 7)                  # the next one: k=1
        wa.wait()
        x = np.empty(1, np.int32)
        any_w = comm.irecv(x, ANY_SOURCE, ANY_TAG)   # what is left: k=2 (tag 5)
        any_w.wait()
        if (c[0], a[0], b[0], x[0], any_w.tag) != (3, 0, 1, 2, 5):
            bad.append(f"order c={c[0]} a={a[0]} b={b[0]} x={x[0]} tag {any_w.tag}")
    comm.barrier()
    if r == 1:
        comm.send(np.array([4], np.int32), 0, tag=9)
    comm.barrier()
    if r == 0:
        try:
            comm.recv(np.empty(2, np.int32), 1, tag=9)   # here already
            bad.append("a message that does not fit was received")
        except ringlet.ArgumentError as exc:
            if "holds 1 x int32, but the receive buffer holds 2 x int32" not in str(exc):
                bad.append(f"mismatch message: {exc}")
    comm.barrier()
    # and the stream goes on: a ping-pong
    if r < 2 and comm.size > 1:
        z = np.array([10 * r], np.int64)
        for _ in range(3):
            if r == 0:
                comm.send(z, 1, tag=1)
                comm.recv(z, 1, tag=2)
            else:
                comm.recv(z, 0, tag=1)
                z += 1
                comm.send(z, 0, tag=2)
        if r == 0 and z[0] != 3:
            bad.append(f"ping-pong after the mismatch: {z[0]}")
    comm.barrier()
    return bad


#: message sizes around the edges of the shared-memory paths: inline in the frame (up to
#: 192 B), a frame and payload slots of 256 KiB (a channel holds 4 slots: up to 768 KiB of
#: payload goes whole in one compiled call), and larger (pushed as slots free up)
EDGES = [0, 8, 192, 196, 4096, (256 << 10) - 4, 256 << 10, (256 << 10) + 4, 600 << 10,
         768 << 10, (768 << 10) + 4, 2 << 20]


def _sizes(comm: ringlet.Communicator) -> list[str]:
    """Every size, with each side blocking or not (so the compiled and the Python paths
    meet in every pairing), gets the bytes it was sent: rank 1 sends one message that is
    there before rank 0 receives it; then rank 0 sends, rank 1 sends back one more."""
    r = comm.rank
    bad: list[str] = []
    for nbytes in EDGES:
        want = (np.arange(nbytes // 4, dtype=np.int64) * 7 + nbytes).astype(np.int32)
        # the message waits in the channel (whole if it fits) before the receive starts
        if r == 1:
            w = comm.isend(want, 0, tag=2)
        comm.barrier()
        if r == 0 and not np.array_equal(comm.recv(np.empty_like(want), 1, tag=2), want):
            bad.append(f"{nbytes} B there before the recv: wrong data")
        if r == 1:
            w.wait()
        for mode in ("send/recv", "isend/recv", "send/irecv"):
            if r == 0:
                if mode == "isend/recv":
                    comm.isend(want, 1, tag=3).wait()
                else:
                    comm.send(want, 1, tag=3)
                back = np.empty_like(want)
                if mode == "send/irecv":
                    comm.irecv(back, 1, tag=4).wait()
                else:
                    comm.recv(back, 1, tag=4)
                if not np.array_equal(back, want + 1):
                    bad.append(f"{nbytes} B {mode}: wrong data back")
            elif r == 1:
                got = np.empty_like(want)
                if mode == "send/irecv":
                    comm.irecv(got, 0, tag=3).wait()
                else:
                    comm.recv(got, 0, tag=3)
                if not np.array_equal(got, want):
                    bad.append(f"{nbytes} B {mode}: wrong data")
                got += 1
                if mode == "isend/recv":
                    comm.isend(got, 0, tag=4).wait()
                else:
                    comm.send(got, 0, tag=4)
    comm.barrier()
    return bad


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("job", [_blocking, _sizes], ids=["blocking", "every_size"])
def test_blocking_send_and_recv(n: int, job: Any) -> None:
    """Blocking send/recv around the other calls, and every size on either path."""
    from conftest import get_world

    for r, bad in enumerate(get_world(n).run(job)):
        assert not bad, f"rank {r}: {bad}"


def _bad(comm: ringlet.Communicator) -> list[str]:
    out = []
    ro = np.ones(2)
    ro.flags.writeable = False
    for fn in (lambda: comm.send(np.ones(1), ANY_SOURCE),
               lambda: comm.isend(np.ones(1), 0, ANY_TAG),
               lambda: comm.probe(comm.size),
               lambda: comm.batch_isend_irecv([("put", np.ones(1), 0)]),
               lambda: comm.batch_isend_irecv([("recv", np.ones(1), 0, -5)]),
               lambda: comm.sendrecv(np.ones(1), ANY_SOURCE, np.ones(1), 0),
               lambda: comm.sendrecv(z := np.ones(4), 0, z[1:3], 0),
               lambda: comm.send(np.ones(1), 0, 2 ** 62),
               lambda: comm.recv(ro, 0),
               lambda: comm.irecv(ro, 0),
               lambda: comm.batch_isend_irecv([("recv", ro, 0)])):
        try:
            fn()
        except ringlet.ArgumentError as exc:
            out.append(str(exc))
        else:
            out.append("")
    return out


def test_bad_arguments() -> None:
    from conftest import get_world

    msgs = get_world(2).run(_bad)[0]
    assert "not a rank" in msgs[0] and "ANY_SOURCE" not in msgs[0]
    assert "tag must be an int >= 0 and below 2**62, got -1" in msgs[1]
    assert "or ringlet.ANY_SOURCE" in msgs[2]
    assert "must be (" in msgs[3]
    assert "or ringlet.ANY_TAG, got -5" in msgs[4]
    assert msgs[5].startswith("dst -1 is not a rank"), msgs[5]
    assert "x and out overlap" in msgs[6], msgs[6]
    # a tag too large says so (it said "must be an int >= 0" of a positive tag)
    assert msgs[7] == f"tag must be an int >= 0 and below 2**62, got {2 ** 62}", msgs[7]
    # a read-only receive buffer is not told to "give out=", which receives have not
    for m, name in zip(msgs[8:], ["x", "x", "op 0's x"], strict=True):
        assert m == f"{name} is read-only but this call writes into it; pass a writable " \
                    f"array", m


def _objects_any(comm: ringlet.Communicator) -> list[str]:
    """recv_object from ANY_SOURCE takes the pickle from the rank its size came from,
    even when another rank's size message arrived between the two (rank 1's large
    pickle completes only after rank 2's whole object was kept aside)."""
    import time
    r, bad = comm.rank, []
    comm.barrier()
    if r == 0:
        time.sleep(1.0)   # rank 1's large pickle waits for this rank; rank 2's is here whole
        for _ in range(2):
            comm.recv(np.empty(1), ANY_SOURCE, tag=99)
        got = sorted(comm.recv_object(ANY_SOURCE)["from"] for _ in range(2))
        if got != [1, 2]:
            bad.append(f"objects from {got}")
    elif r in (1, 2):
        if r == 2:
            time.sleep(0.3)
        comm.send_object({"from": r, "pad": b"x" * (4_000_000 if r == 1 else 0)}, 0)
        comm.send(np.zeros(1), 0, tag=99)
    comm.barrier()
    return bad


@pytest.mark.waits
def test_recv_object_any_source() -> None:
    from conftest import get_world

    for r, bad in enumerate(get_world(3).run(_objects_any)):
        assert not bad, f"rank {r}: {bad}"


def _in_flight_through_a_collective(comm: ringlet.Communicator) -> list[str]:
    """An isend (then an irecv) of 8 MiB, 32 times the channel, left in flight while its
    rank is in a barrier: every wait moves it, as MPI's progress rule has it (the sender
    stopped once the channel was full, in the barrier, the receiver in recv: a timeout)."""
    r, bad = comm.rank, []
    big = 1 << 20    # float64s
    if r == 0:
        w = comm.isend(np.ones(big), 1, tag=1)
        comm.barrier()
        w.wait()
        comm.send(np.full(big, 2.0), 1, tag=2)
        comm.barrier()
    elif r == 1:
        y = np.empty(big)
        comm.recv(y, 0, tag=1)
        comm.barrier()
        z = np.empty(big)
        w = comm.irecv(z, 0, tag=2)
        comm.barrier()
        w.wait()
        if not (y == 1).all() or not (z == 2).all():
            bad.append("wrong data")
    else:
        comm.barrier()
        comm.barrier()
    return bad


def test_sends_and_receives_in_flight_move_while_their_rank_is_in_a_collective() -> None:
    from conftest import get_world

    for r, bad in enumerate(get_world(3).run(_in_flight_through_a_collective)):
        assert not bad, f"rank {r}: {bad}"


def _in_flight_through_another_communicators_collective(comm: ringlet.Communicator
                                                       ) -> list[str]:
    """The same, with the collective on a split of the communicator: rank 0's 16 MiB isend
    on the world must move while it waits in its split's barrier for rank 2, which first
    waits for a message rank 1 sends once it has rank 0's (each engine moved only its own
    communicator's messages: ranks 1 and 2 timed out)."""
    r, bad = comm.rank, []
    big = 1 << 21    # float64s
    sub = comm.split(r % 2)
    if r == 0:
        w = comm.isend(np.full(big, 5.0), 1, tag=1)
        sub.barrier()
        w.wait()
    elif r == 1:
        y = np.empty(big)
        comm.recv(y, 0, tag=1)
        comm.send(np.ones(1), 2, tag=2)
        sub.barrier()
        if not (y == 5).all():
            bad.append("wrong data")
    elif r == 2:
        comm.recv(np.empty(1), 1, tag=2)
        sub.barrier()
    else:
        sub.barrier()
    sub.close()
    return bad


@pytest.mark.parametrize("n", [3, 4])
def test_in_flight_messages_move_while_their_rank_is_in_another_communicators_call(
        n: int) -> None:
    from conftest import get_world

    for r, bad in enumerate(get_world(n).run(
            _in_flight_through_another_communicators_collective)):
        assert not bad, f"rank {r}: {bad}"


def _stashed_failure_everywhere(comm: ringlet.Communicator) -> list[str]:
    """What moving this engine's messages in another communicator's wait raised (stashed
    in ``_failed``) is raised by every later point-to-point call, the compiled blocking
    send and recv included (they skipped the check and succeeded)."""
    from ringlet.errors import PeerError

    bad = []
    if comm.rank == 0:
        comm.send(np.ones(4), 1, tag=1)            # the compiled path works before
    else:
        comm.recv(np.empty(4), 0, tag=1)
    comm.barrier()
    comm._p2p._failed = PeerError("moving a message in the background failed")
    peer = 1 - comm.rank
    calls = {"send": lambda: comm.send(np.ones(4), peer, tag=2),
             "recv": lambda: comm.recv(np.empty(4), peer, tag=2),
             "isend": lambda: comm.isend(np.ones(4), peer, tag=3),
             "irecv": lambda: comm.irecv(np.empty(4), peer, tag=3).wait()}
    for name, call in calls.items():
        try:
            call()
            bad.append(f"{name} did not raise")
        except PeerError as exc:
            if "in the background" not in str(exc):
                bad.append(f"{name}: {exc}")
    comm._p2p._failed = None
    return bad


def test_a_failure_stashed_by_a_background_pass_fails_every_point_to_point_call() -> None:
    from conftest import get_world

    for r, bad in enumerate(get_world(2).run(_stashed_failure_everywhere)):
        assert not bad, f"rank {r}: {bad}"


def _bounded_wait(comm: ringlet.Communicator) -> list[str]:
    """Work.wait(timeout=T) of a receive: CommTimeoutError after T, not 2T (the driver
    waited T, then Work.wait T more, moving nothing), and the receive still completes."""
    import time

    bad = []
    if comm.rank == 0:
        w = comm.irecv(np.zeros(2), 1, tag=9)
        t0 = time.monotonic()
        try:
            w.wait(timeout=1.0)
            bad.append("no timeout")
        except ringlet.CommTimeoutError as exc:
            took = time.monotonic() - t0
            if not 1.0 <= took < 1.6 or "did not complete within 1.0 s" not in str(exc):
                bad.append(f"{took:.2f} s: {exc}")
        comm.barrier()
        if w.wait().tolist() != [7.0, 7.0]:
            bad.append("the receive after the bound")
    else:
        comm.barrier()
        comm.send(np.full(2, 7.0), 0, tag=9)
    return bad


@pytest.mark.waits
def test_a_bounded_wait_of_a_receive_waits_its_bound_once() -> None:
    from conftest import get_world

    for r, bad in enumerate(get_world(2).run(_bounded_wait)):
        assert not bad, f"rank {r}: {bad}"


def _close_with_messages_pending(comm: ringlet.Communicator) -> list[str]:
    """close() with a send larger than the channel in flight and a receive nobody will
    match: the send is finished (its receiver gets it whole), the receive fails saying
    the communicator closed (both raised ValueError: operation forbidden on released
    memoryview object, and the receiver heard the sender closed mid-message)."""
    import time

    bad = []
    sub = comm.split(0)
    assert sub is not None
    big = 1 << 22   # float64s: 32 MiB, more than a channel holds
    if sub.rank == 0:
        ws = sub.isend(np.arange(big, dtype=np.float64), 1, tag=3)
        wr = sub.irecv(np.zeros(3), 1, tag=99)
        sub.close()
        if not ws.is_completed() or ws.wait() is not None:
            bad.append("the send was not finished by close()")
        try:
            if not wr.is_completed():   # finished, with its error
                bad.append("the receive is not completed")
            wr.wait()
            bad.append("receive: no error")
        except ringlet.RingletError as exc:
            if "the communicator was closed before a message came" not in str(exc):
                bad.append(f"receive: {exc}")
        except Exception as exc:  # noqa: BLE001 - the old ValueError
            bad.append(f"receive: {type(exc).__name__}: {exc}")
    else:
        time.sleep(0.5)
        got = sub.recv(np.zeros(big), 0, tag=3)
        if got[-1] != big - 1:
            bad.append("the big message")
        sub.close()
    comm.barrier()
    return bad


def test_close_finishes_sends_and_fails_receives_in_flight() -> None:
    from conftest import get_world

    for r, bad in enumerate(get_world(2).run(_close_with_messages_pending)):
        assert not bad, f"rank {r}: {bad}"


def _group_errors(comm: ringlet.Communicator) -> list[str]:
    """On a group, the errors of a receive's Work.wait(), of batch_isend_irecv, of iprobe
    and of recv's and sendrecv's buffers say what the group's ranks are in the world, as
    recv's other errors do."""
    g = comm.split(0 if comm.rank else None)
    if g is None:
        return []
    out = []
    ro = np.ones(2)
    ro.flags.writeable = False
    if g.rank == 0:
        for _ in range(2):
            g.send(np.ones(2), 1)
    for fn in ((lambda: g.irecv(np.ones(3), 0).wait()) if g.rank else (lambda: None),
               (lambda: g.batch_isend_irecv([("recv", np.ones(3), 0)])[0].wait())
               if g.rank else (lambda: None),
               lambda: g.batch_isend_irecv([("recv", np.ones(3), 7)]),
               lambda: g.iprobe(5),
               lambda: g.recv(ro, 0),
               lambda: g.sendrecv(np.ones(2), 1 - g.rank, out=[0.0, 0.0])):
        try:
            fn()
        except ringlet.ArgumentError as exc:
            out.append(str(exc))
    return out


def test_point_to_point_errors_on_a_group_name_its_world_ranks() -> None:
    from conftest import get_world

    res = get_world(3).run(_group_errors)
    legend = "[ranks here are this group's: its ranks 0-1 are world ranks 1, 2]"
    assert len(res[1]) == 4 and len(res[2]) == 6, res
    for msg in res[1] + res[2]:
        assert msg.endswith(legend), msg
