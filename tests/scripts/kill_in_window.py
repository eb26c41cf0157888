"""A rank of a job (torchrun's variables) whose rank 1 SIGKILLs itself inside a window
where shared-memory files exist, for the start-up tests.

``argv[1]``: ``split`` (rank 1 dies in ``comm.split`` before making its
sub-communicator's segment; ``split-reversed`` the same in a split whose key reverses the
ranks, so that rank 1 is the group's rank 0) or ``empty`` (rank 1 dies in ``comm.empty`` right after
making its shared-buffer file).  Every rank prints ``{"rank", "pid"}``, then
``{"rank", "job_id"}`` after init, then ``{"rank", "error", "message", "after"}`` when
the call fails (seconds since it started).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

import ringlet
from ringlet import groups
from ringlet.env import detect
from ringlet.transport.shm import ShmTransport

where = sys.argv[1]
info = detect()
print(json.dumps({"rank": info.rank, "pid": os.getpid()}), flush=True)
comm = ringlet.init()
print(json.dumps({"rank": comm.rank, "job_id": comm.job_id}), flush=True)
if comm.rank == 1:
    if where.startswith("split"):
        def _split(self: ShmTransport, *args: Any, **kwargs: Any) -> Any:
            os.kill(os.getpid(), signal.SIGKILL)

        ShmTransport.split = _split  # type: ignore[method-assign]
    else:
        made = groups.create_region

        def _create(path: str, nbytes: int) -> Any:
            made(path, nbytes)
            os.kill(os.getpid(), signal.SIGKILL)

        groups.create_region = _create
start = time.monotonic()
try:
    if where.startswith("split"):
        comm.split(0, key=-comm.rank if where == "split-reversed" else 0)
    else:
        comm.empty(1 << 16)
except ringlet.RingletError as exc:
    print(json.dumps({"rank": comm.rank, "error": type(exc).__name__, "message": str(exc),
                      "after": time.monotonic() - start}), flush=True)
    sys.exit(1)
