"""A rank dies and the launcher leaves the others running: they must still exit.

Run as ``mpiexec -disable-auto-cleanup -n 1 -env RINGLET_NODE a python mpi_dead_exit.py :
-n 1 -env RINGLET_NODE b python mpi_dead_exit.py`` (two emulated nodes, the MPI engine
between them).  Rank 1 dies after a first all_reduce; rank 0's next all_reduce raises,
it closes its communicator, prints a JSON line and returns from its script normally.
MPICH's ``MPI_Finalize`` then waits for rank 1 for ever (mpiexec does not end the job),
so ringlet ends the process with SIGALRM after ``_FINALIZE_S`` (2 s here) or, after a
timeout (MPI may not report the death), after the deadline.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

import ringlet
import ringlet.transport.mpi as tm


def main() -> None:
    tm._FINALIZE_S = 2.0
    comm = ringlet.init()
    x = np.ones(4)
    comm.all_reduce(x)
    if comm.rank == 1:
        os._exit(3)
    t0 = time.monotonic()
    try:
        comm.all_reduce(x)
        got = {"error": None, "message": ""}
    except ringlet.RingletError as exc:
        got = {"error": type(exc).__name__, "message": str(exc)}
    comm.close()
    print(json.dumps({"rank": comm.rank, "seconds": time.monotonic() - t0, **got}),
          flush=True)


if __name__ == "__main__":
    main()
