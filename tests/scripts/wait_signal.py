"""Say 'ready', then wait for SIGINT or SIGTERM and report which arrived."""

from __future__ import annotations

import os
import signal
import sys
import time

rank = os.environ["RANK"]


def on_signal(signum: int, frame: object) -> None:
    print(f"rank {rank} got {signal.Signals(signum).name}", flush=True)
    sys.exit(0 if rank == "0" else 5)


signal.signal(signal.SIGINT, on_signal)
signal.signal(signal.SIGTERM, on_signal)
print(f"rank {rank} ready", flush=True)
time.sleep(60)
