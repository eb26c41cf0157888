"""Helpers of the torch transport scripts (tests/scripts/torch_*.py).

Each rank builds ``Communicator(rank, size, world(settings), settings, job_id="torchtest")``
directly, so every peer is "remote": every message, agreement frame and notice goes
over the transport's gloo group.  A check that fails is collected, not raised at once
(the ranks must keep making the same calls); the verdict is one line per rank,
``[rank r] ok: ...`` or ``[rank r] FAILED: ...``, and the exit status says it too.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

# tests/ on the path: the suite takes numpy's prefix answers from tests/oracle.py
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from oracle import prefix_reference  # noqa: F401 - re-exported for torch_suite.py

from ringlet.comm import Communicator
from ringlet.config import Settings
from ringlet.transport.torch import TorchTransport, world


def communicator(timeout: float = 60.0) -> tuple[Communicator, TorchTransport]:
    settings = Settings(timeout=timeout, init_timeout=60.0)
    t = world(settings)
    return Communicator(t.rank, t.size, t, settings, job_id="torchtest"), t


def make(dtype: str, count: int, rank: int, salt: int = 0) -> np.ndarray:
    """Rank ``rank``'s input: small integers (exact in float32 for any summation order)."""
    rng = np.random.default_rng(1000 * salt + rank)
    if dtype == "bool":
        return rng.integers(0, 2, count).astype(bool)
    return rng.integers(-50, 50, count).astype(dtype)


class Report:
    """Failures of one rank, and its verdict."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.failures: list[str] = []
        self.checks = 0
        self.t0 = time.monotonic()
        self.times: dict[str, float] = {}

    def check(self, ok: bool, what: str) -> None:
        self.checks += 1
        if not ok:
            self.failures.append(what)
            print(f"[rank {self.rank}] check failed: {what}", flush=True)

    def run(self, name: str, fn: Callable[[], Any]) -> None:
        """Run one group of checks; an unexpected exception is a failure (and is shown)."""
        t0 = time.monotonic()
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - reported
            self.failures.append(f"{name}: {type(exc).__name__}: {exc}")
            print(f"[rank {self.rank}] {name} raised:\n{traceback.format_exc()}", flush=True)
        self.times[name] = time.monotonic() - t0

    def verdict(self) -> None:
        took = time.monotonic() - self.t0
        if self.failures:
            print(f"[rank {self.rank}] FAILED: {len(self.failures)} of {self.checks} checks "
                  f"({took:.1f} s): {self.failures[:5]}", flush=True)
            sys.stdout.flush()
            os._exit(1)
        parts = ", ".join(f"{k} {v:.1f}" for k, v in self.times.items())
        print(f"[rank {self.rank}] ok: {self.checks} checks in {took:.1f} s ({parts})",
              flush=True)


def raises(fn: Callable[[], Any], kind: type[BaseException]) -> BaseException | None:
    """The exception ``fn`` raised if it is a ``kind``; None if it raised nothing."""
    try:
        fn()
    except kind as exc:
        return exc
    return None
