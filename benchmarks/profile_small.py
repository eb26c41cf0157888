"""Where the time of a small all_reduce goes: the profile behind RESULTS.md's latency rows.

    python benchmarks/profile_small.py [--ranks 2] [--bytes 8] [--calls 20000]

Runs ``comm.all_reduce`` of a tiny float32 vector on N ranks (shared memory,
the automatic choice: the fused one-shot path) and prints, for rank 0, the
mean time per call without a profiler, then cProfile's view of the same loop
(the profiler itself roughly doubles the time; read it for proportions), and
a breakdown timed piece by piece: validation, agreement (publish and wait for
every rank's descriptor, which is also where a rank waits for a slower
peer), and the data step.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

import numpy as np

import ringlet


def body(comm: ringlet.Communicator, nbytes: int, calls: int) -> str | None:
    x = np.zeros(max(1, nbytes // 4), np.float32)   # sums of zeros: no overflow warnings
    for _ in range(200):
        comm.all_reduce(x)
    comm.barrier()
    t = time.perf_counter()
    for _ in range(calls):
        comm.all_reduce(x)
    plain = (time.perf_counter() - t) / calls
    comm.barrier()
    prof = cProfile.Profile() if comm.rank == 0 else None
    if prof is not None:
        prof.enable()
    for _ in range(calls // 4):
        comm.all_reduce(x)
    if prof is None:
        return None
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
    # the pieces of one call, timed on their own (numpy ops and Python, no waiting)
    from ringlet.buffers import as_buffer
    from ringlet.ops import ReduceOp, check_op, reducer

    k = 20000
    t = time.perf_counter()
    for _ in range(k):
        xb = as_buffer(x, "x", writable=True)
        check_op(ReduceOp.parse("sum"), xb.dt)
    validate = (time.perf_counter() - t) / k
    red = reducer(ReduceOp.SUM, xb.dt)
    y = x.copy()
    t = time.perf_counter()
    for _ in range(k):
        red(y, x)
    ufunc = (time.perf_counter() - t) / k
    return (f"{comm.size} ranks, {x.nbytes} B all_reduce: {plain * 1e6:.1f} us per call\n"
            f"  argument validation alone: {validate * 1e6:.2f} us; one in-place numpy "
            f"add of the vector: {ufunc * 1e6:.2f} us\n\n"
            f"cProfile of rank 0 (profiler overhead included):\n{out.getvalue()}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--bytes", type=int, default=8)
    p.add_argument("--calls", type=int, default=20000)
    a = p.parse_args()
    print(ringlet.spawn(body, a.ranks, a.bytes, a.calls)[0])


if __name__ == "__main__":
    main()
