"""A rank on node 1 holds Python's GIL for 2-4 s in one call into C (big-integer
arithmetic), so its heartbeat thread cannot beat, then joins an all_reduce.  Run with
``ringlet run --nodes 2 -n 4``: with RINGLET_HEARTBEAT_S above that the call succeeds
on every rank; below it the others take the rank for stopped, and the message says how
to allow more."""

from __future__ import annotations

import time

import numpy as np

import ringlet

comm = ringlet.init()
if comm.rank == 3:
    t = time.monotonic()
    big = 3 ** 9_000_000   # one call that holds the GIL throughout
    print(f"rank 3 held the GIL {time.monotonic() - t:.1f} s", flush=True)
x = np.ones(4)
try:
    comm.all_reduce(x)
    print(f"rank {comm.rank}: ok {x[0]:g}", flush=True)
except ringlet.RingletError as exc:
    print(f"rank {comm.rank}: {type(exc).__name__}: {exc}", flush=True)
comm.close()
