"""MPICH + UCX: an Isend to a rank that died with a large message in flight crashes the sender.

Plain mpi4py, no ringlet: the reproduction of what crashes ringlet's MPI transport when
a survivor sends its abort notice to a dead peer (see ``tests/test_netns_jobs.py``).
Run across two hosts of a netbed, 2 ranks each, with ``-disable-auto-cleanup`` (else
Hydra kills rank 3's host-mate)::

    import sys; sys.path.insert(0, "tests"); import netbed
    with netbed.NetBed(2) as bed:
        job = bed.mpiexec([sys.executable, "tests/scripts/netns_mpi_isend_dead.py"], ppn=2,
                          mpiexec_args=["-disable-auto-cleanup"], env={"MODE": "rndv"})
        job.wait(60); print(job.report())

``MODE=rndv`` (default): every rank posts a 4 MiB Isend to rank 3 and a 4 MiB Irecv from
it, rank 3 exits (``os._exit(3)``) without receiving; 2 s later (the pending requests'
``Test`` reports no error meanwhile) each survivor Isends 8 bytes to rank 3.  Observed
with MPICH 5.0.2 (UCX, ``UCX_TLS=self,tcp``): ranks 0 and 1 (on the other host) die of
SIGSEGV inside that ``MPI_Isend``; rank 2 (same host as rank 3, shared memory) prints
"done=True".  ``MODE=warm`` (small messages only, every pair has talked) and
``MODE=fresh`` (no earlier traffic): all three survivors print "done=True".  Each
survivor prints one line before the Isend and one after it.
"""

from __future__ import annotations

import faulthandler
import os
import time

import numpy as np
from mpi4py import MPI

faulthandler.enable()
c = MPI.COMM_WORLD.Dup()
c.Set_errhandler(MPI.ERRORS_RETURN)
mode = os.environ.get("MODE", "rndv")
if mode == "warm":   # every pair has exchanged a message before
    for q in range(c.size):
        if q != c.rank:
            c.Sendrecv(np.zeros(1), q, 0, np.zeros(1), q, 0)
c.Barrier()
pending = []
if mode == "rndv" and c.rank != 3:   # a large send to and a receive from rank 3 outstanding
    big, into = np.zeros(4 << 20, np.uint8), np.zeros(4 << 20, np.uint8)
    pending = [c.Isend([big, MPI.BYTE], 3, 0), c.Irecv([into, MPI.BYTE], 3, 0)]
if c.rank == 3:
    time.sleep(0.5)
    os._exit(3)
t = time.time()
while time.time() - t < 2:
    for r in pending:
        try:
            r.Test()
        except MPI.Exception as e:
            print(f"rank {c.rank}: a pending request failed: {e.Get_error_string()}",
                  flush=True)
            pending = []
            break
    time.sleep(0.01)
print(f"rank {c.rank}: Isend to the dead rank 3 ({mode})", flush=True)
try:
    r = c.Isend([np.zeros(8, np.uint8), MPI.BYTE], 3, 5)
    t = time.time()
    while not r.Test() and time.time() - t < 5:
        time.sleep(0.01)
    print(f"rank {c.rank}: Isend returned, done={r.Test()}", flush=True)
except MPI.Exception as e:
    print(f"rank {c.rank}: MPI.Exception {e.Get_error_string()}", flush=True)
os._exit(0)
