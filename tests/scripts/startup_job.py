"""A rank that joins a job with ringlet.init() under any launcher, for the start-up tests.

Before init it prints ``{"rank", "pid", "rdv"}`` as one JSON line (``rdv``: the
rendezvous address's name); after it ``{"rank", "job_id"}`` (or, if init
raised, ``{"rank", "error", "message", "after"}`` and exit status 1); then it
runs one all_reduce and prints ``{"rank", "sum"}``.

Environment (read by this script, not settings):
``STARTUP_SLEEP=<rank>:<seconds>[,...]`` sleeps before init on those ranks;
``STARTUP_SKIP=<rank>[,...]`` makes those ranks exit without init;
``STARTUP_SETTINGS=<rank>:<name>=<int>[,...]`` gives a rank its own setting;
``STARTUP_STALL=<rank>`` makes that rank stop in the shared-memory start-up after
creating its segment, polling like the real waits (so it still obeys signals).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable

import numpy as np

import ringlet
from ringlet.config import Settings
from ringlet.env import detect
from ringlet.startup import rendezvous_name


def _per_rank(var: str) -> dict[int, str]:
    out: dict[int, str] = {}
    for item in filter(None, os.environ.get(var, "").split(",")):
        r, _, v = item.partition(":")
        out[int(r)] = v
    return out


info = detect()
print(json.dumps({"rank": info.rank, "pid": os.getpid(),
                  "rdv": rendezvous_name(info.rendezvous_key)}), flush=True)
if str(info.rank) in os.environ.get("STARTUP_SKIP", "").split(","):
    sys.exit(0)
sleep = _per_rank("STARTUP_SLEEP").get(info.rank)
if sleep:
    time.sleep(float(sleep))
if str(info.rank) in os.environ.get("STARTUP_STALL", "").split(","):
    from ringlet.transport.shm import ShmTransport

    def _stall(self: ShmTransport, deadline: float, check: Callable[[], None] | None = None,
               ) -> None:
        while True:
            if check is not None:
                check()
            time.sleep(0.01)

    ShmTransport._map_peers = _stall  # type: ignore[method-assign]
extra = _per_rank("STARTUP_SETTINGS").get(info.rank)
overrides: dict[str, object] = {}
if extra:
    name, _, value = extra.partition("=")
    overrides[name] = int(value)
start = time.monotonic()
try:
    comm = ringlet.init(settings=Settings.from_env().replace(**overrides))
except ringlet.RingletError as exc:
    print(json.dumps({"rank": info.rank, "error": type(exc).__name__, "message": str(exc),
                      "after": time.monotonic() - start}), flush=True)
    sys.exit(1)
print(json.dumps({"rank": comm.rank, "job_id": comm.job_id}), flush=True)
x = np.full(4, comm.rank + 1.0)
comm.all_reduce(x)
print(json.dumps({"rank": comm.rank, "sum": float(x[0])}), flush=True)
comm.close()
