"""Variants of the torch engine's two-level all_reduce side by side, call by call.

    python benchmarks/rails_ab.py base pin                  # 4 MiB at 1 Gbit/s, 40 calls each
    python benchmarks/rails_ab.py base pieces4 pieces1 --bytes 4M --calls 60
    python benchmarks/rails_ab.py base gloo1 --bytes 64K

Needs root and the network-namespace test bed (``tests/netbed.py``): two hosts of
two ranks under ``torchrun``, the link shaped to ``--rate``.  The variants take
turns call by call (each call after ``dist.barrier()``), so a slow stretch of the
machine falls on all of them; per variant the slowest rank's time of each call,
then the median and quartiles over the calls, and the median over the bound
S / rate.  On this bed the same variant's median moves by 1-3 ms from one job to
the next, so compare variants within a job, and repeat the job.

Variants (``base`` is ringlet as it is; each other one changes one thing for its
own calls and puts it back):

- ``pieces1``, ``pieces4``, ``pieces8``: the vector in 1 (``hierarchical``), 4 or
  8 pieces (``hierarchical_pipelined``) instead of what the communicator picks (2
  at 4 MiB: :data:`ringlet.algorithms.hierarchical.PIPELINE_PIECE_BYTES`);
- ``pin``: every thread of a rank on one core, the host's (host 0 on core 0,
  host 1 on core 1), as if each host had its own CPU;
- ``lpin``: every thread of a rank on the core of its place in the host (each
  host's local rank 0 on core 0, local rank 1 on core 1): a rail's two ends
  share a core, a host's two ranks do not;
- ``nap1``, ``nap5``: waits that found nothing nap 1 or 5 ms instead of 0.2 ms
  (``ringlet.transport.torch._NAP_S``);
- ``lsleep50``, ``lspin300``: waits for messages inside the node (phases 1 and 3)
  sleep at most 50 us at a time instead of 200, or spin 300 us before they sleep
  instead of 50;
- ``gloo1``: the rails' gloo groups with one worker thread instead of two (gloo
  then runs the pieces' all_reduces one after the other), on a communicator split
  from the world for it.
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

import multihost  # this script's folder: parse_size, the jobs' environment

VARIANTS = ("base", "pieces1", "pieces4", "pieces8", "pin", "lpin", "nap1", "nap5", "lsleep50",
            "lspin300", "gloo1")


def _variants(comm: Any, nbytes: int) -> dict[str, Callable[[], Callable[[], None]]]:
    """name -> set up the variant for one call, returning what puts it back."""
    import importlib

    import torch.distributed as dist

    import ringlet.transport.torch as tt

    hier = importlib.import_module("ringlet.algorithms.hierarchical")
    gloo = dist.ProcessGroupGloo
    ncpu = os.cpu_count() or 1

    def nothing() -> None:
        pass

    def pieces(n: int) -> Callable[[], Callable[[], None]]:
        def on() -> Callable[[], None]:
            old = hier.PIPELINE_PIECE_BYTES
            hier.PIPELINE_PIECE_BYTES = nbytes // comm.topology.ranks_per_node // n

            def off() -> None:
                hier.PIPELINE_PIECE_BYTES = old
            return off
        return on

    def threads(cpus: set[int]) -> None:
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), cpus)
            except OSError:   # a thread that just ended
                pass

    def pin() -> Callable[[], None]:
        threads({comm.topology.node % ncpu})
        return lambda: threads(set(range(ncpu)))

    def lpin() -> Callable[[], None]:
        threads({comm.topology.local_ranks.index(comm.rank) % ncpu})
        return lambda: threads(set(range(ncpu)))

    def nap(seconds: float) -> Callable[[], Callable[[], None]]:
        def on() -> Callable[[], None]:
            old = tt._NAP_S
            tt._NAP_S = seconds

            def off() -> None:
                tt._NAP_S = old
            return off
        return on

    def local(**settings: float) -> Callable[[], Callable[[], None]]:
        def on() -> Callable[[], None]:
            t = comm._t
            old = t._local_wait
            t._local_wait = old.replace(**settings)

            def off() -> None:
                t._local_wait = old
            return off
        return on

    class OneThread:
        def __new__(cls, store: Any, rank: int, size: int, timeout: Any) -> Any:
            opts = gloo._Options()
            opts._timeout = timeout
            opts._threads = 1
            opts._devices = [gloo.create_default_device()]
            return gloo(store, rank, size, opts)

    def gloo1() -> Callable[[], None]:
        dist.ProcessGroupGloo = OneThread   # the rails are built in this call, if at all

        def off() -> None:
            dist.ProcessGroupGloo = gloo
        return off

    return {"base": lambda: nothing, "pieces1": pieces(1), "pieces4": pieces(4),
            "pieces8": pieces(8), "pin": pin, "lpin": lpin, "nap1": nap(1e-3), "nap5": nap(5e-3),
            "lsleep50": local(sleep_us=50.0), "lspin300": local(spin_us=300.0),
            "gloo1": gloo1}


def rank_main(names: list[str], nbytes: int, calls: int) -> None:
    from datetime import timedelta

    import numpy as np
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    import ringlet

    comm = ringlet.init()
    variants = _variants(comm, nbytes)
    # gloo1 needs rails of its own: a communicator of the same ranks, split for it
    comms = {n: comm.split(0) if n == "gloo1" else comm for n in names}
    x = np.ones(max(1, nbytes // 4), np.float32)
    times: dict[str, list[float]] = {n: [] for n in names}
    for i in range(calls + 2):          # two warm-up rounds
        for n in names:
            off = variants[n]()
            try:
                dist.barrier()
                t0 = time.perf_counter()
                comms[n].all_reduce(x)
                took = time.perf_counter() - t0
            finally:
                off()
            if i >= 2:
                times[n].append(took)
    for n in names:
        a = np.asarray(times[n])
        comm.all_reduce(a, op="max")    # a call is done when every rank is
        times[n] = [float(v) for v in a]
    if comm.rank == 0:
        print(json.dumps(times), flush=True)
    if "gloo1" in comms:
        comms["gloo1"].close()
    comm.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("names", nargs="+", choices=VARIANTS, metavar="VARIANT",
                    help=f"variants to compare: {', '.join(VARIANTS)}")
    multihost.bed_job_args(ap, 40, "calls per variant")
    a = ap.parse_args(argv)
    nbytes = multihost.parse_size(a.bytes)
    if a.rank:
        rank_main(a.names, nbytes, a.calls)
        return 0
    times = multihost.torch_job(__file__, ["--bytes", str(nbytes), "--calls", str(a.calls),
                                           *a.names], a.rate, "rails_ab",
                                own_cpus=a.own_cpus, mtu=a.mtu)
    if times is None:
        return 1
    netbed = multihost._netbed()
    bound = nbytes * 8 / netbed.parse_rate(a.rate)
    print(f"all_reduce of {nbytes} B, 2 hosts x 2 ranks at {a.rate} (bound S/rate "
          f"{bound * 1e3:.2f} ms), {a.calls} calls per variant, in turns; the slowest "
          f"rank's time per call, ms")
    print("| variant | median | / bound | 25 % | 75 % |")
    print("|---|---:|---:|---:|---:|")
    for n, ts in times.items():
        q = statistics.quantiles(ts, n=4)
        med = statistics.median(ts)
        print(f"| {n} | {med * 1e3:.2f} | {med / bound:.3f} | {q[0] * 1e3:.2f} | "
              f"{q[2] * 1e3:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
