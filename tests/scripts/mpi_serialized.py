"""Two communicators' worker threads call MPI under MPI_THREAD_SERIALIZED.

Run under mpiexec with emulated nodes (``RINGLET_NODE``).  Asynchronous
all_reduces on the world communicator and on a split of it run on two worker
threads at once; under SERIALIZED only one thread of the process may be in MPI
at a time, so every MPI transport takes one lock then.  One JSON line per rank:
``{"rank", "ok", "bad", "level"}``.
"""

from __future__ import annotations

import json

import mpi4py

mpi4py.rc.thread_level = "serialized"

import numpy as np  # noqa: E402

import ringlet  # noqa: E402


def main() -> None:
    from mpi4py import MPI

    comm = ringlet.init()
    sub = comm.split(0)
    n, r = comm.size, comm.rank
    bad = 0
    for _ in range(200):
        x = np.full(20_000, r + 1.0)
        y = np.full(20_000, 2.0 * (r + 1))
        w = comm.all_reduce(x, algorithm="ring", async_op=True)
        w2 = sub.all_reduce(y, algorithm="ring", async_op=True)
        w.wait()
        w2.wait()
        bad += int(not (x == n * (n + 1) / 2).all()) + int(not (y == n * (n + 1)).all())
    level = MPI.Query_thread()
    print(json.dumps({"rank": r, "ok": bad == 0 and level == MPI.THREAD_SERIALIZED,
                      "bad": bad, "level": level}), flush=True)
    sub.close()
    comm.close()


if __name__ == "__main__":
    main()
