"""A rank that dies or stops in the middle of a job on the torch transport; the others
must raise PeerError naming it within seconds (never only at the 60 s deadline).

    RANK=r WORLD_SIZE=N MASTER_ADDR=127.0.0.1 MASTER_PORT=<free> python torch_faults.py MODE

MODE ``kill``: the last rank SIGKILLs itself from a timer thread while all_reduces of
1 MB run (mid-collective, as a crash would); gloo's connections close with the process.
MODE ``stop``: the last rank SIGSTOPs itself between collectives; its connections stay
open, so only the heartbeat says it stopped answering; rank 0 then SIGKILLs it.
The victim writes the time it went into the store first; the others measure from it.
Survivors print ``[rank r] ok: ...`` (or FAILED, exit 1).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import numpy as np
from torch_common import Report, communicator

from ringlet.errors import PeerError
from ringlet.transport.torch import STALE_S

LIMIT = 10.0    # seconds the survivors may take to notice


def main(mode: str) -> None:
    comm, t = communicator(timeout=60.0)
    n, r = comm.size, comm.rank
    victim = n - 1            # rank 0 hosts the store: it must live
    pids = comm.all_gather_object(os.getpid())
    rep = Report(r)
    store = t._store
    x = np.ones(1 << 18, np.float32)      # 1 MB
    if r == victim and mode == "kill":
        def die() -> None:
            store.set("torchtest/fault", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Timer(0.5, die).start()
    err: BaseException | None = None
    try:
        for i in range(100_000):
            if r == victim and mode == "stop" and i == 20:
                store.set("torchtest/fault", repr(time.time()))
                os.kill(os.getpid(), signal.SIGSTOP)
            comm.all_reduce(x, algorithm="ring" if i % 2 else "native")
    except PeerError as exc:
        err = exc
    noticed = time.time()
    if r == victim:
        print(f"[rank {r}] the victim was not stopped: {err!r}", flush=True)
        sys.exit(1)
    since = noticed - float(store.get("torchtest/fault").decode())
    print(f"[rank {r}] noticed after {since:.2f} s: {err}", flush=True)
    rep.check(err is not None and f"rank {victim}" in str(err), f"PeerError names the rank: "
                                                                f"{err!r}")
    if mode == "stop":
        rep.check("stopped answering" in str(err), f"the heartbeat's words: {err}")
        rep.check(STALE_S - 1 < since < LIMIT, f"noticed after {since:.2f} s, expected "
                                               f"{STALE_S:g} to {LIMIT:g}")
        if r == 0:
            os.kill(pids[victim], signal.SIGKILL)
    else:
        rep.check(since < LIMIT, f"noticed after {since:.2f} s, expected < {LIMIT:g}")
    t0 = time.monotonic()
    comm.close()
    rep.check(time.monotonic() - t0 < 5, "close after the failure took over 5 s")
    rep.verdict()


if __name__ == "__main__":
    main(sys.argv[1])
