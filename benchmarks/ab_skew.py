"""Where the shared-memory data areas start in their page (transport.shm.SKEW), A/B.

    python benchmarks/ab_skew.py        # about a minute on 2 cores

Runs all_reduce (64 KiB .. 16 MiB, in place and out=), all_gather, all_to_all,
broadcast and reduce_scatter (16 MiB) on 2 ranks with fresh ``np.empty`` arrays
(large ones start 16 bytes past a page boundary, as users' do), three times with
the data areas page-aligned (SKEW = 0) and three times half a page in (2048, the
default), alternating, and prints the median time of each and the ratio.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from abtimer import timer

import ringlet
import ringlet.transport.shm as shm


def body(comm: ringlet.Communicator) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    n = comm.size
    timed = timer(comm, out, warmup=3)

    for nb in (64 << 10, 256 << 10, 1 << 20, 16 << 20):
        x = np.empty(nb // 4, np.float32)
        x[:] = 1
        y = np.empty(nb // 4, np.float32)
        reps = 200 if nb < 1 << 20 else 40
        timed(f"all_reduce {nb >> 10}K in", lambda x=x: comm.all_reduce(x), reps)
        timed(f"all_reduce {nb >> 10}K out", lambda x=x, y=y: comm.all_reduce(x, out=y), reps)
    nb = 16 << 20
    part, whole = np.ones(nb // 4 // n, np.float32), np.empty(nb // 4, np.float32)
    timed("all_gather 16M", lambda: comm.all_gather(part, out=whole), 40)
    x, y = np.ones(nb // 4, np.float32), np.empty(nb // 4, np.float32)
    timed("all_to_all 16M", lambda: comm.all_to_all(x, out=y), 40)
    timed("broadcast 16M", lambda: comm.broadcast(x, 0), 40)
    block = np.empty(nb // 4 // n, np.float32)
    timed("reduce_scatter 16M", lambda: comm.reduce_scatter(x, out=block), 40)
    return out


def main() -> None:
    res: dict[int, list[dict[str, list[float]]]] = {0: [], 2048: []}
    for rnd in range(3):
        for skew in ((0, 2048) if rnd % 2 == 0 else (2048, 0)):
            shm.SKEW = skew   # the ranks are forked: they build their layout with it
            res[skew].append(ringlet.spawn(body, 2)[0])
    for k in res[0][0]:
        a = statistics.median(r[k][0] for r in res[0])
        b = statistics.median(r[k][0] for r in res[2048])
        print(f"{k:24s} skew 0: {a:9.1f} us   skew 2048: {b:9.1f} us   ratio {a / b:5.2f}")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
