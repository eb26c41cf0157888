"""A job that hangs or fails in one of the ways the flight recorder's diagnosis names.

    ringlet run -n N hang.py CASE      (RINGLET_TIMEOUT small)

cycle: every rank receives from the one before it, then sends (nobody sends);
straggler: the last rank never reaches all_reduce #4 (it sleeps);
mismatch: rank 0 calls all_reduce #4, the others broadcast;
dead: the last rank dies (SIGKILL) before all_reduce #4;
missing: the last rank returns without calling all_reduce #4 (it closes its communicator);
group-cycle: the cycle inside each of two groups (comm.split by rank parity);
ok: every rank runs three all_reduce calls and a barrier.
"""

import os
import signal
import sys
import time

import numpy as np

import ringlet

case = sys.argv[1]
comm = ringlet.init()
n, r = comm.size, comm.rank
x = np.zeros(4)
for _ in range(3):
    comm.all_reduce(x)
last = r == n - 1
if case == "cycle":
    comm.recv(x, src=(r - 1) % n)
    comm.send(x, dst=(r + 1) % n)
elif case == "straggler":
    if last:
        time.sleep(60)
    comm.all_reduce(x)
elif case == "mismatch":
    if r == 0:
        comm.all_reduce(x)
    else:
        comm.broadcast(x)
elif case == "dead":
    if last:
        os.kill(os.getpid(), signal.SIGKILL)
    comm.all_reduce(x)
elif case == "missing":
    if not last:
        comm.all_reduce(x)
elif case == "group-cycle":
    sub = comm.split(color=r % 2, key=r)
    sub.recv(x, src=(sub.rank - 1) % sub.size)
    sub.send(x, dst=(sub.rank + 1) % sub.size)
elif case == "ok":
    comm.barrier()
else:
    raise SystemExit(f"unknown case {case!r}")
