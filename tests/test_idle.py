"""How waits idle (:meth:`ringlet.transport.base.Transport.idle`, :meth:`Waiter.tick`): pure
tests with stand-ins for the transports; the real waits run in every multi-process test."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from ringlet.config import Settings
from ringlet.errors import CommTimeoutError, PeerError
from ringlet.transport.base import Transport
from ringlet.transport.routed import RoutedTransport
from ringlet.transport.shm import ShmTransport
from ringlet.transport.torch import TorchTransport
from ringlet.wait import Waiter


class _Waiter:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def tick(self, now: float | None = None) -> bool:
        self.calls.append("tick")
        return True


def test_tick_checks_the_peers_and_the_deadline_without_pausing() -> None:
    checks: list[int] = []
    w = Waiter(Settings(liveness_s=0.0), lambda: "all_reduce #3 (4 x float32)", lambda: [2],
               lambda: checks.append(1), timeout=60.0)
    assert w.tick() and w.tick() and checks == [1, 1]     # every liveness_s (here: always)
    rare = Waiter(Settings(liveness_s=100.0), lambda: "x", lambda: [2],
                  lambda: checks.append(2), timeout=60.0)
    assert rare.tick() and checks == [1, 1]   # the first check comes after at most 10 ms
    late = Waiter(Settings(liveness_s=0.0), lambda: "all_reduce #3 (4 x float32)",
                  lambda: [2], timeout=0.0)
    with pytest.raises(CommTimeoutError, match=r"all_reduce #3 .*rank 2 did not arrive"):
        late.tick()


def test_the_deadline_does_not_wait_for_the_next_liveness_check() -> None:
    """A deadline is kept at every tick, however long ``liveness_s`` is (it was checked
    only with the peers, so RINGLET_LIVENESS_S=20 made a 3 s timeout come after 20 s);
    the peers are asked once more at the deadline, so that a dead one says it better."""
    checks: list[int] = []
    w = Waiter(Settings(liveness_s=1000.0), lambda: "all_reduce #1 (2 x float64)",
               lambda: [1], lambda: checks.append(1), timeout=60.0)
    w._next_check = w._start + 1000.0        # the first liveness check is far away
    assert w.tick(w._start + 1.0) and checks == []
    with pytest.raises(CommTimeoutError, match=r"after 60 s in all_reduce #1.*rank 1 did not"):
        w.tick(w._start + 60.0)
    assert checks == [1]

    def gone() -> None:
        raise PeerError("rank 1 ended")

    d = Waiter(Settings(liveness_s=1000.0), lambda: "barrier #2", lambda: [1], gone,
               timeout=60.0)
    d._next_check = d._start + 1000.0
    assert d.tick(d._start + 60.0) is False   # one more poll, then the dead peer's error
    with pytest.raises(PeerError, match="rank 1 ended"):
        d.tick(d._start + 60.0)


def test_tick_gives_a_peer_that_ended_one_more_poll() -> None:
    def gone() -> None:
        raise PeerError("rank 1 closed the communicator")

    w = Waiter(Settings(liveness_s=0.0), lambda: "barrier #1", lambda: [1], gone, timeout=60.0)
    assert w.tick() is False                   # poll once more: it may have finished
    with pytest.raises(PeerError, match="rank 1 closed"):
        w.tick()


def test_a_polled_transport_idles_in_the_waiters_pause() -> None:
    w = _Waiter()
    Transport.idle(object.__new__(ShmTransport), 0, w, lambda: [1])
    assert w.calls == ["pause"]


class _Engine:
    def __init__(self) -> None:
        self.idled: list[Any] = []

    def idle(self, seen: int, waiter: Any, peers: Any = None) -> None:
        self.idled.append((seen, peers))

    def events(self) -> int:
        return 7


class _Local:
    def __init__(self, pending: list[int]) -> None:
        self.pending = pending

    def pending_peers(self) -> list[int]:
        return self.pending


def _routed(pending: list[int]) -> tuple[RoutedTransport, _Engine]:
    """Rank 0 of nodes (0, 1) and (2, 3): rank 1 is local, 2 and 3 are the engine's."""
    t = object.__new__(RoutedTransport)
    eng = _Engine()
    t.engine, t.local, t.lidx = eng, _Local(pending), {0: 0, 1: 1}  # type: ignore[assignment]
    return t, eng


@pytest.mark.parametrize(("peers", "pending", "engine_idles"), [
    ([2], [], True),          # only peers on other nodes: the engine blocks on its reports
    ([2, 3], [], True),
    ([1], [], False),         # a local peer: shared memory is polled
    ([2, 1], [], False),
    (None, [], False),        # any rank (a receive from ANY_SOURCE): polled
    ([2], [1], False),        # shared memory has a message in flight: polled
])
def test_a_routed_transport_idles_on_the_engine_only_for_remote_peers(
        peers: list[int] | None, pending: list[int], engine_idles: bool) -> None:
    t, eng = _routed(pending)
    w: Any = _Waiter()
    assert t.events() == 7
    asked = lambda: peers  # noqa: E731
    t.idle(7, w, asked)
    assert (eng.idled == [(7, asked)]) is engine_idles
    assert w.calls == ([] if engine_idles else ["pause"])


class _Cv:
    def __init__(self) -> None:
        self.waits: list[float] = []
        self._lock = threading.Lock()

    def __enter__(self) -> _Cv:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return False


@pytest.mark.parametrize(("seen", "naps"), [(5, 1), (4, 0)])
def test_torch_naps_only_if_no_lane_reported_since_the_poll(seen: int, naps: int) -> None:
    t = object.__new__(TorchTransport)
    t._cv, t._events = _Cv(), 5  # type: ignore[assignment]
    w: Any = _Waiter()
    t.idle(seen, w)
    assert len(t._cv.waits) == naps  # type: ignore[attr-defined]
    assert all(0 < s <= 1e-3 for s in t._cv.waits)  # type: ignore[attr-defined]
    assert w.calls == ["tick"]        # the deadline and the peers are checked either way


@pytest.mark.parametrize(("spin_us", "yield_us", "polls_before_sleeping"), [
    (0.0, 0.0, 0),        # nothing to spin or yield (torch's waits): every pause sleeps
    (0.0, 2000.0, None),  # oversubscribed shared memory: yields first, sleeps after 2 ms
    (50.0, 0.0, None),    # a node's rounds on the rails: spins 50 us, then sleeps
])
def test_pauses_sleep_every_time_once_past_the_spin_and_the_yield(
        monkeypatch: pytest.MonkeyPatch, spin_us: float, yield_us: float,
        polls_before_sleeping: int | None) -> None:
    """Once a wait sleeps, every pause sleeps: the clock is read every 16 polls only while
    the wait spins or yields (a wait whose polls run Python, as the agreement's across
    nodes, spun 15 polls between its sleeps: 53 polls per 8 B barrier, 5 now)."""
    import ringlet.wait as wait

    slept: list[float] = []
    clock = [1000.0]
    monkeypatch.setattr(wait.time, "sleep", slept.append)
    monkeypatch.setattr(wait.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(wait, "_sched_yield", lambda: None)
    w = Waiter(Settings(spin_us=spin_us, yield_us=yield_us, liveness_s=100.0),
               lambda: "barrier #1", lambda: [1], timeout=60.0)
    if polls_before_sleeping is None:      # spinning or yielding: no sleep yet
        for _ in range(64):
            w.pause()
        assert slept == []
        clock[0] += (spin_us + yield_us) * 1e-6 + 1e-3   # past both
        for _ in range(16):                # the next clock read finds it: it sleeps
            w.pause()
        assert len(slept) == 1
    for _ in range(5):
        w.pause()
    # every pause slept, in steps growing from 20 us to sleep_us
    assert slept == pytest.approx([20e-6, 40e-6, 80e-6, 160e-6, 200e-6, 200e-6][:len(slept)])
    assert len(slept) == 5 + (polls_before_sleeping is None)


def test_a_rounds_timeout_says_the_missing_ranks_had_agreed() -> None:
    """The rounds of a collective run after every rank agreed to it: a rank they still
    wait for at the deadline arrived, and said it "did not arrive" (a rank on another
    node that had arrived and then given up, over MPI, which cannot tell the others)."""
    from ringlet.config import Settings
    from ringlet.transport.base import ROUND_ABSENT
    from ringlet.wait import Waiter

    w = Waiter(Settings(timeout=1.0), lambda: "all_reduce #2 (4 x float64), round 1",
               lambda: [0], absent=ROUND_ABSENT)
    text = str(w.timeout_error())
    assert "round 1: rank 0 agreed to the call but did not send or take this round's data" \
        in text and "did not arrive" not in text, text
