"""Start-up under mpiexec that cannot succeed: every rank must end, with a clear error.

``STARTUP_CASE`` (environment):

- ``late``: every rank starts MPI, then the last rank waits 6 s before
  ``ringlet.init()``; with ``RINGLET_INIT_TIMEOUT=2`` the others time out in
  start-up's exchange over MPI (nonblocking collectives under the deadline);
- ``dead``: the last rank exits before ``ringlet.init()``.  Run under ``mpiexec
  -disable-auto-cleanup`` (the job is not ended for it) with
  ``RINGLET_INIT_TIMEOUT=2``, the others time out in start-up's exchange, whose MPI
  collective stays pending, so MPICH's ``MPI_Finalize`` waits for the dead rank for
  ever: ringlet ends the process after ``_FINALIZE_S`` (2 s here);
- ``node``: ranks differ in ``RINGLET_SHM_*`` inside one node (set by the
  launch): that node's start-up fails, and every rank of the job gets its
  ConfigError (the nodes tell each other before the engine's next collective).

One JSON line per rank that got an error or returned: ``{"rank", "error",
"message", "seconds"}``; a rank that got an error then exits with status 1 (as an
uncaught exception would), which lets mpiexec end the job.
"""

from __future__ import annotations

import json
import os
import sys
import time

from mpi4py import MPI

import ringlet
import ringlet.transport.mpi as tm


def main() -> int:
    r, n = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    case = os.environ.get("STARTUP_CASE")
    if case == "late" and r == n - 1:
        time.sleep(6)
    if case == "dead":
        tm._FINALIZE_S = 2.0
        if r == n - 1:
            os._exit(3)
    t0 = time.monotonic()
    try:
        comm = ringlet.init()
    except Exception as exc:  # noqa: BLE001 - reported
        print(json.dumps({"rank": r, "error": type(exc).__name__, "message": str(exc),
                          "seconds": time.monotonic() - t0}), flush=True)
        return 1
    print(json.dumps({"rank": r, "error": None, "message": "",
                      "seconds": time.monotonic() - t0}), flush=True)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
