"""Flight-recorder dumps asked for (SIGUSR1) again and again while the ranks agree on
calls: ``ringlet run --nodes 2 -n 4 dump_storm.py`` (``ringlet run`` sets
RINGLET_DUMP_DIR, which installs the handler).  A thread of rank 0 signals its own
process every 10 ms during 300 barriers; every rank must finish them.  A dump that
polled the agreement from inside the handler, which may have interrupted the main
thread while it posted a receive, once took a lock that thread held: rank 0 hung for
good and the others timed out naming it."""

from __future__ import annotations

import os
import signal
import threading

import ringlet

comm = ringlet.init()
stop = threading.Event()


def storm() -> None:
    while not stop.wait(0.01):
        os.kill(os.getpid(), signal.SIGUSR1)


if comm.rank == 0:
    threading.Thread(target=storm, daemon=True).start()
for _ in range(300):
    comm.barrier()
stop.set()
print(f"rank {comm.rank}: 300 barriers", flush=True)
comm.close()
