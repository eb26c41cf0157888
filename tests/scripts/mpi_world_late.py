"""A rank comes late to build the MPI transport (``ringlet.transport.mpi.world``).

Run as ``mpiexec -n 2 python mpi_world_late.py``.  With a 1 s deadline, rank 1 calls
``world()`` 2.5 s after rank 0: rank 0 must raise CommTimeoutError at its deadline
(``MPI_Comm_dup`` waited for rank 1 however long it took), and stays alive; rank 1's
duplicate then completes against the one rank 0 abandoned, and it must not wait for
rank 0 in the construction's next collective for ever (it raises at its deadline too).
Each rank prints a JSON line ``{"rank", "error", "message", "seconds"}``.
"""

from __future__ import annotations

import json
import time

from mpi4py import MPI

from ringlet.config import Settings
from ringlet.errors import RingletError
from ringlet.transport.mpi import world


def main() -> None:
    r = MPI.COMM_WORLD.Get_rank()
    if r == 1:
        time.sleep(2.5)
    t0 = time.monotonic()
    try:
        world(Settings(timeout=1.0)).close()
        got = {"error": None, "message": ""}
    except RingletError as exc:
        got = {"error": type(exc).__name__, "message": str(exc)}
    print(json.dumps({"rank": r, "seconds": time.monotonic() - t0, **got}), flush=True)
    if r == 0:
        time.sleep(3)   # alive while rank 1 builds its transport


if __name__ == "__main__":
    main()
