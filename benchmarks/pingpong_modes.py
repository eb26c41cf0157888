"""How an 8 B ping-pong between the two ranks of a node behaves over time, 4 ranks on 2 cores.

    mpiexec -n 2 -env RINGLET_NODE a python benchmarks/pingpong_modes.py : \\
            -n 2 -env RINGLET_NODE b python benchmarks/pingpong_modes.py

Two emulated nodes of two ranks (MPICH's ``mpiexec``; any launcher that gives
two nodes of two works).  Each node's pair makes ``--trips`` round trips of
``comm.send``/``comm.recv`` at once, as ``benchmarks/multihost.py`` measures
``intra_half_rtt_s`` (until run 29 the prediction's intra-node latency; since
run 30 that is a real call's round inside the node, ``multihost.steps``,
because of what this script shows).  Rank 0 prints, as one JSON line, half
the round trip's median and mean over all trips (microseconds), the wall
time, and the median of each window of 200 trips (what one measurement of
multihost.py sees): on this machine the windows are either ~3-6 us or
~190-300 us, and a job stays in one mode for hundreds of milliseconds
(MULTIHOST.md, "History").
"""

from __future__ import annotations

import argparse
import json
import time

import multihost  # this script's folder: the round trip multihost.py measures
import numpy as np

import ringlet


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trips", type=int, default=3000)
    ap.add_argument("--window", type=int, default=200)
    a = ap.parse_args()
    comm = ringlet.init()
    local = comm.topology.local_ranks
    near = local[(local.index(comm.rank) + 1) % len(local)]
    go = multihost.trip(comm, np.ones(2, np.float32), np.empty(2, np.float32), near,
                        local.index(comm.rank) == 0)
    comm.barrier()
    times = []
    start = time.perf_counter()
    for _ in range(a.trips):
        t0 = time.perf_counter()
        go()
        times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - start
    half = np.asarray(times) * 1e6 / 2
    if comm.rank == 0:
        print(json.dumps({
            "half_rtt_median_us": round(float(np.median(half)), 1),
            "half_rtt_mean_us": round(float(half.mean()), 1), "wall_ms": round(wall * 1e3, 1),
            "window_medians_us": [round(float(np.median(half[i:i + a.window])), 1)
                                  for i in range(0, len(half), a.window)]}), flush=True)
    comm.close()


if __name__ == "__main__":
    main()
