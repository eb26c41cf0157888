"""Handles of asynchronous operations (``async_op=True``, ``isend``, ``irecv``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .errors import CommTimeoutError, RingletError


class Work:
    """Handle of an asynchronous operation (``async_op=True``, ``isend``, ``irecv``)."""

    #: a point-to-point operation's flight record (see ringlet.recorder), finished here
    _rec: list[Any] | None = None
    #: a receive's sender and tag, once its message matched (useful with ANY_SOURCE/ANY_TAG)
    source: int | None = None
    tag: int | None = None
    #: the thread that runs the operation, if another (a communicator's worker): Ctrl-C
    #: during wait() is raised there too (wait.INTERRUPTS), to fail the call on every rank
    _runner: int | None = None
    #: the wait that is_completed() polls (point-to-point: its deadline holds there too)
    _poller: Any = None
    #: names a group's ranks in an error wait() raises (Calls._name_group; point-to-point)
    _named: Callable[[BaseException], None] | None = None

    def __init__(self, what: str, peer: int | None = None) -> None:
        self._what = what
        self._peer = peer
        #: when the operation started: its deadline counts from here
        self._start = time.monotonic()
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self._driver: Callable[[Work, float | None], None] | None = None
        self._callbacks: list[Callable[[Work], None]] = []
        self._lock = threading.Lock()

    def _finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        rec = self._rec
        if rec is not None:
            from .recorder import T_END, failed, now_ns

            if error is None:
                rec[T_END] = now_ns()
            else:
                failed(rec, error)
        with self._lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for fn in callbacks:
            fn(self)

    def _then(self, fn: Callable[[Work], None]) -> None:
        """Call ``fn(self)`` once the operation finished (at once if it has), in the
        thread that finishes it (the torch backend completes torch futures this way)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(fn)
                return
        fn(self)

    def is_completed(self) -> bool:
        """True once the operation finished (successfully or not: ``wait()`` then returns
        its result or raises its error).  Polling it keeps the operation's deadline and
        watches its peer, as ``wait()`` does: a point-to-point operation whose deadline
        passed or whose peer died is finished with that error."""
        if not self._done.is_set() and self._driver is not None:
            self._driver(self, 0.0)
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until done and return the operation's result; re-raise its error.

        ``timeout`` (seconds) bounds this wait only; the operation keeps its own
        deadline (``RINGLET_TIMEOUT``).
        """
        driver = self._driver if not self._done.is_set() else None
        try:
            if driver is not None:   # it waits (up to ``timeout``): not a second time below
                driver(self, timeout)
            done = self._done.wait(0.0 if driver is not None else timeout)
        except RingletError as exc:   # the operation's failure, as its driver raised it
            self._name(exc)
            raise
        except KeyboardInterrupt as exc:
            if self._runner is not None and not self._done.is_set():
                from .wait import INTERRUPTS

                INTERRUPTS[self._runner] = exc
                if self._done.is_set():
                    # it ended meanwhile, its worker maybe past the note's removal (see
                    # calls._work_loop): left there, it would fail a later, unrelated call
                    INTERRUPTS.pop(self._runner, None)
            raise
        if not done:
            raise self._name(CommTimeoutError(f"{self._what} did not complete within "
                                              f"{timeout} s"))
        if self._error is not None:
            raise self._name(self._error)
        return self._result

    def _name(self, exc: BaseException) -> BaseException:
        """``exc``, its message naming a group's ranks where this Work's communicator is one."""
        if self._named is not None:
            self._named(exc)
        return exc

    def __repr__(self) -> str:
        state = "done" if self._done.is_set() else "pending"
        return f"<ringlet.Work {self._what} {state}>"
