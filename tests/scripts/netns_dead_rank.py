"""A rank dies between two all_reduces; every other rank must raise a RingletError.

Run across the hosts of a netbed (``tests/test_netns_jobs.py``) under any
launcher.  All ranks do a first all_reduce; then the last rank (or
``DEAD_RANK``) leaves with ``os._exit(3)`` a little after the others have
entered a second, 4 MiB all_reduce.  Each survivor prints one JSON line:
``{"rank", "node", "raised", "peer_error", "timeout_error", "seconds", "msg"}``
(``raised`` is the exception's class name, None if the call returned, and
``seconds`` how long the call took), then ``{"rank", "closed"}`` once
``comm.close()`` returned, and leaves with ``os._exit(0)``: a survivor cannot
finalize MPI with a dead peer (``MPI_Finalize`` waits for it), so it skips that,
as a program that handles the error and stops would.

``faulthandler`` is on, so a crash in the engine shows a Python traceback.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time

import numpy as np

import ringlet

faulthandler.enable()


def main() -> None:
    comm = ringlet.init()
    dead = int(os.environ.get("DEAD_RANK", comm.size - 1))
    node = os.environ.get("RINGLET_NODE")
    x = np.full(1000, comm.rank + 1.0, np.float32)
    comm.all_reduce(x)
    if x[0] != comm.size * (comm.size + 1) / 2:
        print(json.dumps({"rank": comm.rank, "node": node, "raised": "wrong first result"}),
              flush=True)
        os._exit(1)
    if comm.rank == dead:
        time.sleep(0.5)   # the others are waiting in the second all_reduce by now
        os._exit(3)
    y = np.ones(1 << 20, np.float32)
    t = time.monotonic()
    report: dict[str, object] = {"rank": comm.rank, "node": node}
    try:
        comm.all_reduce(y)
        report.update(raised=None, peer_error=False, timeout_error=False, msg="")
    except ringlet.RingletError as exc:
        report.update(raised=type(exc).__name__,
                      peer_error=isinstance(exc, ringlet.PeerError),
                      timeout_error=isinstance(exc, ringlet.CommTimeoutError),
                      msg=str(exc)[:400])
    report["seconds"] = round(time.monotonic() - t, 3)
    print(json.dumps(report), flush=True)
    t = time.monotonic()
    comm.close()
    print(json.dumps({"rank": comm.rank, "closed": round(time.monotonic() - t, 3)}),
          flush=True)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
