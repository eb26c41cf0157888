"""Ranks die during a job on two emulated nodes: the others end in an error, and exit.

Run as ``mpiexec -disable-auto-cleanup -n 2 -env RINGLET_NODE a python mpi_node_dead.py
CASE : -n 2 -env RINGLET_NODE b python mpi_node_dead.py CASE`` (two emulated nodes of
two ranks, the MPI engine between them; ``-n 1`` each for ``recv``).  After a good
all_reduce:

- ``ring``, ``native``: the last rank agrees to the next all_reduce and exits before it
  moves any data (ringlet's ring over the routed transport, whose first round has its
  node peer wait for a message over MPI; or MPI's own all_reduce).  Every other rank
  must get a PeerError naming it within seconds (its node peer sees it die in shared
  memory and aborts), not wait for the deadline;
- ``recv`` (one rank per node): the last rank exits while rank 0 waits to receive from
  it; rank 0 times out (MPI cannot tell a dead rank from a late one), saying so;
- ``idle``: the last rank exits, the others but rank 0 fail in the next all_reduce, and
  rank 0, in no call, closes its communicator 2 s later: having heard of the failure
  it sends nothing more (a send to a dead rank can crash MPICH);
- ``send``: as ``idle``, but rank 0 sends to the dead rank twice first: both sends
  raise, and nothing goes to MPI.

One JSON line per surviving rank: ``{"rank", "error", "message", "seconds"}`` (for
``idle`` and ``send``, rank 0's ``{"rank", "sent", "errors"}``: the peers it sent to
over MPI, and what its sends raised).  The ranks
then end: MPI_Finalize would wait for the dead rank, and the exit alarm ends them,
after ``_FINALIZE_S`` (1 s here) where MPI reported it dead, else after the deadline.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

import ringlet
import ringlet.comm
import ringlet.transport.mpi as tm


def main() -> None:
    case = sys.argv[1]
    tm._FINALIZE_S = 1.0
    comm = ringlet.init()
    x = np.ones(1024, np.float32)
    comm.all_reduce(x)
    if case == "recv":
        if comm.rank == comm.size - 1:
            os._exit(3)
        t0 = time.monotonic()
        try:
            comm.recv(x, comm.size - 1)
            got = {"error": None, "message": ""}
        except ringlet.RingletError as exc:
            got = {"error": type(exc).__name__, "message": str(exc)}
        print(json.dumps({"rank": comm.rank, "seconds": time.monotonic() - t0, **got}),
              flush=True)
        comm.close()
        return
    if case in ("idle", "send"):
        if comm.rank == comm.size - 1:
            os._exit(3)
        if comm.rank > 0:
            try:
                comm.all_reduce(x)
            except ringlet.RingletError:
                pass
            comm.close()
            return
        time.sleep(2)
        engine = comm._t.engine
        sent: list[int] = []
        isend = engine.isend

        def spy(peer: int, *args: object, **kw: object) -> object:
            req = isend(peer, *args, **kw)
            sent.append(peer)   # what MPI was given
            return req

        engine.isend = spy
        errors = []
        if case == "send":
            for _ in range(2):
                try:
                    comm.send(np.ones(1 << 20), comm.size - 1, tag=1)
                    errors.append(None)
                except ringlet.RingletError as exc:
                    errors.append(type(exc).__name__)
        comm.close()
        print(json.dumps({"rank": 0, "sent": sent, "errors": errors}), flush=True)
        return
    if comm.rank == comm.size - 1:   # dies once the call is agreed, before its first message
        if case == "ring":
            ringlet.comm.execute = lambda *a, **k: os._exit(3)
        else:
            comm._t.native_start = lambda *a, **k: os._exit(3)
    t0 = time.monotonic()
    try:
        comm.all_reduce(x, algorithm="ring" if case == "ring" else "native")
        got = {"error": None, "message": ""}
    except ringlet.RingletError as exc:
        got = {"error": type(exc).__name__, "message": str(exc)}
    print(json.dumps({"rank": comm.rank, "seconds": time.monotonic() - t0, **got}), flush=True)
    comm.close()


if __name__ == "__main__":
    main()
