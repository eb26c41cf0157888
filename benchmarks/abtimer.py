"""The timing loop the A/B benchmarks share (ab_skew.py, ab_cma.py, ab_stream.py)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def timer(comm: Any, out: dict[str, list[float]], warmup: int = 1
          ) -> Callable[..., None]:
    """``timed(label, fn, reps=10)``: ``warmup`` calls of ``fn``, a barrier of ``comm``,
    then ``reps`` timed calls; their median in microseconds is appended to
    ``out[label]`` (one figure per block of an A/B run)."""

    def timed(label: str, fn: Callable[[], object], reps: int = 10) -> None:
        for _ in range(warmup):
            fn()
        comm.barrier()
        ts = []
        for _ in range(reps):
            a = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - a)
        out.setdefault(label, []).append(statistics.median(ts) * 1e6)

    return timed
