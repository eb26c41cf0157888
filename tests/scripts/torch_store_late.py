"""``ringlet.init()`` on the store of the caller's own torch.distributed group, one rank late.

Run two processes with torch's env:// variables (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) and ``RINGLET_NODE`` different on each, so that ringlet uses the torch
engine and meets on the default group's store, whose own waits have the group's timeout
(30 minutes by default).  Rank 1 calls ``ringlet.init()`` ``LATE`` seconds after rank 0:
with a shorter ``RINGLET_INIT_TIMEOUT`` rank 0 must raise CommTimeoutError naming rank 1
at that deadline (it used to wait for rank 1 however long it took).  Each rank prints a
JSON line ``{"rank", "error", "message", "seconds"}``.
"""

from __future__ import annotations

import json
import os
import time


def main() -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")   # the caller's own default group
    import ringlet

    r = dist.get_rank()
    if r == 1:
        time.sleep(float(os.environ.get("LATE", "4")))
    t0 = time.monotonic()
    try:
        comm = ringlet.init()
        comm.close()
        got = {"error": None, "message": ""}
    except ringlet.RingletError as exc:
        got = {"error": type(exc).__name__, "message": str(exc)}
    print(json.dumps({"rank": r, "seconds": time.monotonic() - t0, **got}), flush=True)
    if r == 0:
        time.sleep(1)   # the store's host stays a moment: rank 1 reads what it reads
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
