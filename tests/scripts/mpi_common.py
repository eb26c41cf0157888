"""Helpers of the MPI transport's test scripts (run under ``mpiexec -n N python ...``).

Each script builds ``Communicator(rank, size, world(settings), ...)`` directly, so every
peer is "remote": every message, agreement frame and status notice goes over MPI.  A
script records what went wrong with :meth:`Report.fail` and ends with
:meth:`Report.finish`, which prints this rank's verdict and exits non-zero on failure.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

# tests/ on the path: the suites take their inputs and numpy's answers from tests/oracle.py
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ringlet.comm import Communicator
from ringlet.config import Settings
from ringlet.transport import mpi as tm


def communicator(timeout: float = 30.0) -> Communicator:
    """A communicator over a duplicate of COMM_WORLD (collective over it)."""
    s = Settings(timeout=timeout)
    t = tm.world(s)
    return Communicator(t.rank, t.size, t, s, job_id="mpitest")


class Report:
    """What went wrong on this rank."""

    def __init__(self, comm: Communicator, name: str) -> None:
        self.comm, self.name = comm, name
        self.bad: list[str] = []
        self.checks = 0

    def check(self, ok: bool, what: str) -> None:
        self.checks += 1
        if not ok:
            self.bad.append(what)

    def fail(self, what: str) -> None:
        self.check(False, what)

    def expect_raise(self, exc_type: type[BaseException], fn: Callable[[], Any],
                     *needles: str) -> BaseException | None:
        """Run ``fn``; it must raise ``exc_type`` whose message holds every needle."""
        try:
            fn()
        except exc_type as exc:
            missing = [n for n in needles if n not in str(exc)]
            self.check(not missing, f"{type(exc).__name__} lacks {missing}: {exc}")
            return exc
        except BaseException as exc:   # noqa: BLE001 - reported
            self.fail(f"expected {exc_type.__name__}, got {type(exc).__name__}: {exc}")
            return exc
        self.fail(f"expected {exc_type.__name__}, nothing was raised")
        return None

    def finish(self) -> None:
        r, n = self.comm.rank, self.comm.size
        if self.bad:
            print(f"[{self.name} rank {r}/{n}] FAILED {len(self.bad)} of {self.checks} "
                  f"checks:", flush=True)
            for line in self.bad[:30]:
                print(f"[{self.name} rank {r}/{n}]   {line}", flush=True)
            sys.stdout.flush()
            sys.exit(1)
        print(f"[{self.name} rank {r}/{n}] ok: {self.checks} checks", flush=True)


def guarded(rep: Report, what: str, fn: Callable[[], Any]) -> Any:
    """Run a section; an unexpected exception is a failure (with its traceback)."""
    try:
        return fn()
    except Exception as exc:   # noqa: BLE001 - reported
        rep.fail(f"{what}: {type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        return None
