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
from typing import Any

import numpy as np

from ringlet.comm import Communicator
from ringlet.config import Settings
from ringlet.ops import DTYPES
from ringlet.transport import mpi as tm


def communicator(timeout: float = 30.0) -> Communicator:
    """A communicator over a duplicate of COMM_WORLD (collective over it)."""
    s = Settings(timeout=timeout)
    t = tm.world(s)
    return Communicator(t.rank, t.size, t, s, job_id="mpitest")


def make(dtype: str, count: int, rank: int, salt: int = 0) -> np.ndarray:
    """Rank ``rank``'s deterministic input (any rank can build any rank's)."""
    rng = np.random.default_rng([rank, count, salt, DTYPES[dtype].code])
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, count).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        return rng.integers(max(info.min, -1000), min(info.max, 1000), count,
                            endpoint=True).astype(dt)
    x = rng.normal(0, 10, count)
    if dt.kind == "c":
        x = x + 1j * rng.normal(0, 10, count)
    return x.astype(dt)


def close(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal for integers and bool, close for floating point (NaN equal to NaN)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == np.float16:
        return bool(np.allclose(a, b, rtol=2e-2, atol=0.5, equal_nan=True))
    if a.dtype.kind in "fc":
        tol = 1e-4 if a.dtype in (np.float32, np.complex64) else 1e-9
        return bool(np.allclose(a, b, rtol=tol, atol=tol, equal_nan=True))
    return bool(np.array_equal(a, b))


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
