"""A persistent world of N ranks for the multi-process tests (mpi4py-style mixins).

Starting processes costs far more than a collective, so each world size is
started once per test session; a test sends a function to every rank and
gets back the per-rank results.  A test body is written once and run at
several world sizes by parametrizing over N.  If a call fails in a way that
may leave the communicator broken, the world is restarted for the next test.
Tests of faults that kill ranks use ``ringlet.spawn`` (fresh processes).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import secrets
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection, wait
from typing import Any

from ringlet.config import Settings

CALL_TIMEOUT = 120.0
#: errors after which the communicator is still usable (raised before any data moved)
RECOVERABLE = frozenset({"ArgumentError", "MismatchError"})


def _serve(rank: int, size: int, job: str, settings: Settings, conn: Connection) -> None:
    from ringlet.startup import init

    comm = init(settings=settings, rank=rank, size=size, job_id=job)
    conn.send(("ready", None))
    while True:
        msg = conn.recv()
        if msg is None:
            break
        fn, args = msg
        try:
            conn.send(("ok", fn(comm, *args)))
        except BaseException as exc:  # reported to the test
            conn.send(("err", (type(exc).__name__, str(exc), traceback.format_exc())))
    comm.close()


def lean_from_env() -> bool:
    """Whether the compiled small-message path is on for the test worlds: RINGLET_LEAN=0 in
    the environment runs them on the Python path alone (only that variable is read)."""
    return Settings.from_env({k: v for k, v in os.environ.items() if k == "RINGLET_LEAN"}).lean


class RankError(Exception):
    """A rank raised; ``errors`` maps rank -> (type name, message)."""

    def __init__(self, errors: dict[int, tuple[str, str, str]]) -> None:
        self.errors = errors
        lines = [f"rank {r}: {t}: {m}\n{tb}" for r, (t, m, tb) in sorted(errors.items())]
        super().__init__("\n".join(lines))


class World:
    def __init__(self, size: int, settings: Settings | None = None) -> None:
        self.size = size
        self.settings = settings or Settings(timeout=60.0, lean=lean_from_env())
        self._start()

    def _start(self) -> None:
        ctx = mp.get_context("forkserver")   # its preload: conftest.pytest_sessionstart
        job = secrets.token_hex(16)
        self.job = job
        self.conns: list[Connection] = []
        self.procs = []
        for r in range(self.size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_serve, args=(r, self.size, job, self.settings, child),
                            daemon=True)
            p.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(p)
        for c in self.conns:
            if not c.poll(CALL_TIMEOUT):
                raise RuntimeError("world did not start")
            c.recv()

    def run(self, fn: Callable[..., Any], *args: Any) -> list[Any]:
        """``fn(comm, *args)`` on every rank; results in rank order, or RankError."""
        for c in self.conns:
            c.send((fn, args))
        results: dict[int, tuple[str, Any]] = {}
        pending = dict(enumerate(self.conns))
        while pending:
            ready = wait(list(pending.values()), timeout=CALL_TIMEOUT)
            if not ready:
                self.restart()
                raise TimeoutError(f"ranks {sorted(pending)} did not answer in {CALL_TIMEOUT} s")
            for r, c in list(pending.items()):
                if c in ready:
                    try:
                        results[r] = c.recv()
                    except EOFError:
                        results[r] = ("err", ("EOFError", "rank died", ""))
                    del pending[r]
        errors = {r: v for r, (k, v) in results.items() if k == "err"}
        if errors:
            if any(t not in RECOVERABLE for t, _, _ in errors.values()):
                self.restart()  # the communicator may be aborted: start afresh
            raise RankError(errors)
        return [results[r][1] for r in range(self.size)]

    def run_expect_errors(self, fn: Callable[..., Any], *args: Any) -> dict[int, tuple[str, str]]:
        """Like run, but returns {rank: (type, message)} for the ranks that raised."""
        try:
            self.run(fn, *args)
        except RankError as exc:
            return {r: (t, m) for r, (t, m, _) in exc.errors.items()}
        return {}

    def restart(self) -> None:
        self.close()
        self._start()

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(None)
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join(5)
        for c in self.conns:
            c.close()
