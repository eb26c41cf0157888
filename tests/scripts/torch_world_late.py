"""A rank comes late to build the torch engine's transport (``ringlet.transport.torch.world``).

Run two processes with torch's env:// variables (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT).  Both build a first transport (which gathers them on the job's store, deadlines 60 s);
then rank 1 calls ``world()`` again 2 s after rank 0, whose deadlines are 1 s: rank 0
must raise CommTimeoutError naming rank 1 at about 1 s (gloo's constructor waited for it
without a deadline of ringlet's, up to init_timeout + 30 s).  Each rank prints a JSON
line ``{"rank", "error", "message", "seconds"}``; rank 0, which hosts the store, stays
until rank 1 has printed.
"""

from __future__ import annotations

import json
import os
import time

from ringlet.config import Settings
from ringlet.errors import RingletError
from ringlet.transport.torch import world


def main() -> None:
    r = int(os.environ["RANK"])
    # the first world gathers the ranks on the job's store, with time for rank 1 to import
    # torch (2.4 s of CPU on a slow machine, after rank 0 listens: 1 s was too little)
    world(Settings(timeout=60.0, init_timeout=60.0)).close()
    settings = Settings(timeout=1.0, init_timeout=1.0)
    if r == 1:
        time.sleep(2)
    t0 = time.monotonic()
    try:
        world(settings).close()
        got = {"error": None, "message": ""}
    except RingletError as exc:
        got = {"error": type(exc).__name__, "message": str(exc)}
    print(json.dumps({"rank": r, "seconds": time.monotonic() - t0, **got}), flush=True)
    if r == 0:
        time.sleep(2)


if __name__ == "__main__":
    main()
