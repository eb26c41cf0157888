"""Pass each rank's number around a ring with the real communicator (``ringlet.init()``).

With ``--crash``, rank 1 dies after the first round; the others then wait
for it and fail fast with PeerError, on their own.  With ``--exit``, rank 1 ends
with ``sys.exit(3)`` instead: its communicator closes as the program ends, which
the others hear of (a PeerError) before its exit handlers are done.
"""

from __future__ import annotations

import os
import sys

import numpy as np

from ringlet.startup import init

comm = init()
mine, theirs = np.array([comm.rank + 1.0]), np.zeros(1)
work = comm.isend(mine, (comm.rank + 1) % comm.size)
comm.recv(theirs, (comm.rank - 1) % comm.size)
work.wait()
print(f"rank {comm.rank} of {comm.size} got {theirs[0]:g}")
if "--crash" in sys.argv or "--exit" in sys.argv:
    if comm.rank == 1:
        if "--exit" in sys.argv:
            sys.exit(3)
        os._exit(4)
    comm.recv(theirs, 1)
comm.close()
