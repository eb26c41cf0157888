"""Join the job, say 'ready', then sleep until Ctrl-C (the launcher forwards it): the
KeyboardInterrupt is uncaught, and the rank's exit handlers then take a while, so that
the launcher hears of the exception well before the rank's exit."""

from __future__ import annotations

import atexit
import time

import ringlet

comm = ringlet.init()
atexit.register(time.sleep, 0.5)
print(f"rank {comm.rank} ready", flush=True)
time.sleep(60)
