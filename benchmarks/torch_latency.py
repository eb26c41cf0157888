"""Small calls on the torch engine beside torch.distributed's own, across two hosts.

    python benchmarks/torch_latency.py                  # 1 Gbit/s, 5 loops of 100 calls
    python benchmarks/torch_latency.py --rate 200mbit --loops 9

Needs root and the network-namespace test bed (``tests/netbed.py``): two hosts of
two ranks under ``torchrun``, the link shaped to ``--rate``.  Per operation, the
microseconds a call takes (a loop of ``--calls`` calls between ``dist.barrier()``,
over the calls; the operations take turns loop by loop), the median and the
range over the loops, on rank 0:

- ``ringlet send/recv``: a round trip of 8 B between each rank and its peer on
  the other host (``comm.send`` then ``comm.recv``; both pairs at once), beside
  ``torch send/recv``, the same with ``dist.send``/``dist.recv``;
- ``ringlet barrier`` (a call's agreement alone) beside ``dist.barrier()``;
- ``ringlet all_reduce 8 B`` (the automatic choice) beside ``dist.all_reduce``.

It also says whether a gloo receive can be polled: ``Work.is_completed()`` once the
data is in, and ``Work.get_future()``.  On torch 2.13 neither works for
point-to-point (the first stays False, the second raises), and a wait with a
timeout that expires fails every pair of the group (gloo's ``signalException``),
so the torch engine finishes each message on a thread that blocks in
``Work.wait()`` (``ringlet.transport.torch``): one more thread to wake per
message than a caller that blocks in ``dist.recv``.  If a later torch makes these
works pollable, this script shows it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import multihost  # this script's folder: the bed's torchrun job

OPS = ("ringlet send/recv", "torch send/recv", "ringlet barrier", "torch barrier",
       "ringlet all_reduce 8 B", "torch all_reduce 8 B")


def _pollable(dist: Any, torch: Any, rank: int) -> dict[str, Any]:
    """Whether rank 1's gloo receive from rank 0 reports itself done (rank 0 sends after
    0.2 s; rank 1 polls for 1 s after that)."""
    if rank not in (0, 1):
        dist.barrier()
        return {}
    got: dict[str, Any] = {}
    if rank == 0:
        time.sleep(0.2)
        dist.send(torch.ones(2), 1)
    else:
        buf = torch.zeros(2)
        work = dist.irecv(buf, 0)
        try:
            work.get_future()
            got["get_future"] = "works"
        except RuntimeError as exc:
            got["get_future"] = f"raises: {exc}"
        end = time.monotonic() + 1.2
        while not work.is_completed() and time.monotonic() < end:
            time.sleep(0.001)
        got["data_arrived"] = bool(buf[0] == 1)
        got["is_completed_once_arrived"] = work.is_completed()
        work.wait()
    dist.barrier()
    return got


def rank_main(loops: int, calls: int) -> None:
    from datetime import timedelta

    import numpy as np
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    import ringlet

    comm = ringlet.init()
    r = comm.rank
    per = comm.topology.ranks_per_node
    peer = (r + per) % comm.size          # the same local rank on the other host
    leads = comm.topology.node == 0
    x, y = np.zeros(2, np.float32), np.zeros(2, np.float32)
    tx, ty = torch.zeros(2), torch.zeros(2)

    def trip(send: Callable[[], Any], recv: Callable[[], Any]) -> Callable[[], None]:
        def go() -> None:
            if leads:
                send()
                recv()
            else:
                recv()
                send()
        return go

    ops: dict[str, Callable[[], Any]] = {
        "ringlet send/recv": trip(lambda: comm.send(x, peer), lambda: comm.recv(y, peer)),
        "torch send/recv": trip(lambda: dist.send(tx, peer), lambda: dist.recv(ty, peer)),
        "ringlet barrier": comm.barrier,
        "torch barrier": dist.barrier,
        "ringlet all_reduce 8 B": lambda: comm.all_reduce(x),
        "torch all_reduce 8 B": lambda: dist.all_reduce(tx),
    }
    polled = _pollable(dist, torch, r)
    times: dict[str, list[float]] = {n: [] for n in OPS}
    for i in range(loops + 1):          # one warm-up loop
        for n in OPS:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(calls):
                ops[n]()
            if i:
                times[n].append((time.perf_counter() - t0) / calls * 1e6)
    told = [polled]
    dist.broadcast_object_list(told, src=1)     # rank 1 polled the receive
    if r == 0:
        print(json.dumps({"us": times, "pollable": told[0], "calls": calls,
                          "torch": torch.__version__}))
    comm.close()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", default="1gbit", help="the link's rate (tc syntax)")
    ap.add_argument("--loops", type=int, default=5, help="timed loops per operation")
    ap.add_argument("--calls", type=int, default=100, help="calls per loop")
    a = ap.parse_args(argv)
    got = multihost.torch_job(os.path.abspath(__file__),
                              [str(a.loops), str(a.calls)], a.rate, "torch_latency")
    if got is None:
        return 1
    print(f"2 hosts x 2 ranks at {a.rate}, torch {got['torch']}: us per call, "
          f"median [min-max] of {a.loops} loops of {got['calls']} calls (rank 0)")
    for n in OPS:
        v = got["us"][n]
        print(f"  {n:24s} {statistics.median(v):8.0f}  [{min(v):.0f}-{max(v):.0f}]")
    p = got["pollable"]
    print(f"a gloo receive, once its data arrived: is_completed() "
          f"{p.get('is_completed_once_arrived')} (data in: {p.get('data_arrived')}); "
          f"get_future() {p.get('get_future')}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(int(sys.argv[2]), int(sys.argv[3]))
    else:
        sys.exit(main())
