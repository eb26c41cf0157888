"""The last rank dies (or is late) where its first call on the engine's all_reduce would
build its rail.

Run as ``ringlet run --nodes 2 -n 4 rails_dead.py`` with ``RINGLET_RAILS=native``
(torch engine).  Every rank builds its rail's gloo group on the first two-level
all_reduce that crosses on the engine's all_reduce, after its node's phase 1; the
last rank exits there instead (``os._exit(9)``), so its rail peer would wait in
gloo's constructor, which knows neither ringlet's deadline nor a dead peer.  Each
survivor prints a JSON line ``{"rank", "error", "message", "seconds"}``, then
rank 0, which may host the job's store, stays a few seconds so that the others
read what they read with the store up.

With ``--inside`` the last rank dies inside gloo's constructor instead, after the
members met in the store (the constructor then waited for it up to gloo's timeout).

With ``--late S`` the last rank sleeps S seconds there and then builds its rail (under
mpiexec, whose ``MPI_Comm_create_group`` would wait for it without a deadline), and
prints its line too.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

import ringlet


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--late", type=float, default=0.0)
    ap.add_argument("--inside", action="store_true")
    args = ap.parse_args()
    comm = ringlet.init()
    r = comm.rank
    x = np.ones(1 << 16, np.float32)
    comm.all_reduce(x, algorithm="ring")
    if r == comm.size - 1 and args.inside:
        import torch.distributed as dist

        def die(*_: object, **__: object) -> None:
            time.sleep(0.2)
            os._exit(9)

        dist.ProcessGroupGloo = die
    elif r == comm.size - 1:
        rail = comm._t.rail

        def late(g: int) -> object:
            time.sleep(args.late)
            return rail(g)

        comm._t.rail = late if args.late else lambda g: os._exit(9)
    t0 = time.monotonic()
    try:
        comm.all_reduce(x, algorithm="hierarchical")
        got = {"error": None, "message": ""}
    except Exception as exc:  # noqa: BLE001 - reported
        got = {"error": type(exc).__name__, "message": str(exc)}
    print(json.dumps({"rank": r, "seconds": time.monotonic() - t0, **got}), flush=True)
    if r == 0:
        time.sleep(2)
    comm.close()


if __name__ == "__main__":
    main()
