"""An mpi4py Allreduce across the hosts of a netbed (run by mpiexec from the bed's switch).

Prints one JSON line per rank: its rank, world size, RINGLET_NODE, the CPUs it may run on,
and whether the sum of a 1 Mi-element float64 array came out right.
"""

from __future__ import annotations

import json
import os

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
a = np.full(1 << 20, comm.rank + 1.0)
b = np.empty_like(a)
comm.Allreduce(a, b)
expected = comm.size * (comm.size + 1) / 2
print(json.dumps({"rank": comm.rank, "size": comm.size, "node": os.environ.get("RINGLET_NODE"),
                  "cpus": sorted(os.sched_getaffinity(0)),
                  "ok": bool(np.all(b == expected)), "value": float(b[0])}), flush=True)
