"""How ringlet waits: spin briefly, then yield the core, then sleep; always with a deadline.

Every wait in ringlet goes through a :class:`Waiter`.  It polls for a while
(the fast path when peers are running), then yields the core with
``sched_yield`` so that more ranks than cores still make progress, then
sleeps in growing steps.  Every ``liveness_s`` it asks the transport whether
a peer died or aborted, and at the deadline it raises
:class:`~ringlet.errors.CommTimeoutError` with a message that names the
operation, its sequence number and the ranks that did not arrive.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable

from .config import Settings
from .errors import CommTimeoutError, PeerError, name_ranks

_sched_yield = getattr(os, "sched_yield", lambda: time.sleep(0))
_get_ident = threading.get_ident


class _Background(threading.local):
    """``on`` in a thread that runs calls in the background (a communicator's worker
    thread, for ``async_op=True``): its waits spin briefly and then sleep, never
    yield, because the caller computes meanwhile on the same cores (a yielding wait
    took the CPU that DDP's backward needed)."""

    on = False


_background = _Background()


def background() -> None:
    """Mark this thread as a background thread (see :class:`_Background`)."""
    _background.on = True


#: the latest wait each thread started (thread id -> waiter): what a flight recorder dump
#: made meanwhile (a signal) says the thread waits for (``missing()`` is empty once done)
WAITS: dict[int, Waiter] = {}
#: Ctrl-C the main thread received while it waited for a call a worker thread runs (an
#: async one, or one queued behind it): that thread's next tick raises it there, where
#: the call's failure aborts the communicator as an interrupted inline call does (thread
#: ident -> the exception; see Work.wait)
INTERRUPTS: dict[int, BaseException] = {}


class Waiter:
    """One wait.  Call :meth:`pause` whenever a poll found nothing to do."""

    __slots__ = ("_what", "_missing", "_check", "_start", "_deadline", "_spin_end",
                 "_yield_end", "_sleeping", "_sleep", "_sleep_max", "_next_check", "_liveness",
                 "_polls", "timeout", "_rechecked", "_advice", "_absent")

    def __init__(self, settings: Settings, what: Callable[[], str],
                 missing: Callable[[], Iterable[int]],
                 check: Callable[[], None] | None = None,
                 timeout: float | None = None,
                 advice: Callable[[], str] | None = None,
                 absent: str = "did not arrive", start: float | None = None) -> None:
        self._what = what
        #: what the ranks still missing at the deadline did not do
        self._absent = absent
        self._missing = missing
        self._check = check
        self.timeout = settings.timeout if timeout is None else timeout
        now = time.monotonic()
        self._start = now if start is None else start   # an operation started earlier
        self._deadline = self._start + self.timeout
        self._spin_end = now + settings.spin_us * 1e-6
        self._yield_end = self._spin_end + (0.0 if _background.on else settings.yield_us * 1e-6)
        #: past the spin and the yield: every poll that found nothing sleeps (a wait whose
        #: polls run Python, as the agreement's across nodes, spun 15 polls between sleeps)
        self._sleeping = now >= self._yield_end
        self._sleep = 20e-6
        self._sleep_max = max(settings.sleep_us * 1e-6, 20e-6)
        self._liveness = settings.liveness_s
        self._next_check = now + min(self._liveness, 0.01)
        self._polls = 0
        self._rechecked = False
        self._advice = advice
        WAITS[_get_ident()] = self

    def waiting_on(self) -> list[int]:
        """The ranks this wait still waits for (best effort, for a flight recorder dump)."""
        try:
            return sorted(set(self._missing()))
        except Exception:  # noqa: BLE001 - read from a signal handler, mid-update
            return []

    def what(self) -> str:
        try:
            return self._what()
        except Exception:  # noqa: BLE001 - as waiting_on
            return ""

    def pause(self) -> None:
        """Nothing to do this poll: spin, yield or sleep, and check peers and the deadline."""
        self._polls += 1
        if self._polls & 15 and not self._sleeping:
            return  # pure spin between clock reads
        now = time.monotonic()
        if not self.tick(now):
            return
        if now < self._spin_end:
            return
        if now < self._yield_end:
            _sched_yield()
            return
        self._sleeping = True
        time.sleep(self._sleep)
        self._sleep = min(self._sleep * 2, self._sleep_max)

    def tick(self, now: float | None = None) -> bool:
        """Check the peers (every ``liveness_s``) and the deadline, without pausing: for
        a wait that blocks by other means (:meth:`ringlet.transport.base.Transport.idle`).
        False if a peer was found gone just now: the caller polls once more (a peer
        that ended may have done what we wait for just before it ended), and the next
        tick raises."""
        if INTERRUPTS:
            exc = INTERRUPTS.pop(_get_ident(), None)
            if exc is not None:
                raise exc
        if now is None:
            now = time.monotonic()
        # the peers every liveness_s, and once more at the deadline (a dead peer says it
        # better than a timeout), which is checked at every tick, whatever liveness_s is
        if now >= self._next_check or now >= self._deadline:
            self._next_check = now + self._liveness
            if self._check is not None:
                try:
                    self._check()
                except PeerError:
                    if self._rechecked:
                        raise
                    self._rechecked = True
                    self._next_check = now
                    return False
            if now >= self._deadline:
                raise self.timeout_error()
        return True

    def moved(self) -> None:
        """Something happened: the next pauses sleep briefly again (the sleeps grow only
        while nothing happens)."""
        self._sleep = 20e-6

    def timeout_error(self) -> CommTimeoutError:
        """The error of this wait's deadline; ``waiting_on`` holds the ranks still missing
        (what the flight recorder records)."""
        missing = sorted(set(self._missing()))
        advice = self._advice() if self._advice is not None else ""
        if advice:
            err = CommTimeoutError(f"timed out after {self.timeout:g} s in {self._what()}: "
                                   f"{advice}")
            err.waiting_on = missing  # type: ignore[attr-defined]
            return err
        who = f"{name_ranks(missing)} {self._absent}" if missing else \
            "no rank is known to be missing"
        err = CommTimeoutError(
            f"timed out after {self.timeout:g} s in {self._what()}: {who}. If the peers are "
            f"just slow, raise RINGLET_TIMEOUT (seconds); if they called a different "
            f"collective or none, fix the program's collective order")
        err.waiting_on = missing  # type: ignore[attr-defined]
        return err
