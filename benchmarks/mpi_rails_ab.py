"""The MPI engine's two-level all_reduce with its rails as ringlet's ring or MPI's own.

    python benchmarks/mpi_rails_ab.py                          # 1, 4, 16 MiB at 1 Gbit/s
    python benchmarks/mpi_rails_ab.py --rate 200mbit --sizes 256K,1M,4M --jobs 3

Needs root and the network-namespace test bed (``tests/netbed.py``): two hosts of
two ranks under ``mpiexec``, the link shaped to ``--rate``.  In each job, per
size, four calls take turns call by call (each after ``MPI_Barrier``), so a slow
stretch of the machine falls on all of them:

- ``ring``: ``comm.all_reduce(x)`` with ``rails="ring"`` (the default on MPI:
  phase 2 is ringlet's ring over MPI's point-to-point);
- ``native``: the same with ``rails="native"`` (phase 2 is MPI's Iallreduce on a
  communicator per rail, and the first piece's reduction inside the node runs
  while the other node's descriptor crosses);
- ``mpi pair``: MPI's own ``Allreduce`` of each rank's shard (S/2) on both rails
  at once: what phase 2 costs at best;
- ``mpi``: MPI's own ``Allreduce`` of the whole vector on the 4 ranks.

Per call the slowest rank's time; per size the median over ``--calls`` calls, in
milliseconds, one row per job.  On this bed a job settles into a mode for its
whole life, so compare within a job, and run several (``--jobs``).  Session 26's
figures are in ``benchmarks/MULTIHOST.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import multihost  # this script's folder: the bed, sizes, the jobs' environment

METHODS = ("ring", "native", "mpi pair", "mpi")


def _row(comm: Any, eng: Any, nbytes: int, calls: int) -> dict[str, float]:
    """One size: per method, the median over the calls of the slowest rank's time."""
    import numpy as np

    modes = {m: comm.settings.replace(rails=m) for m in ("ring", "native")}
    x = np.ones(nbytes // 4, np.float32)
    h = np.ones(x.size // 2, np.float32)

    def hier(mode: str) -> None:
        comm.settings = modes[mode]   # every rank alike, call by call
        comm.all_reduce(x)

    run = {"ring": lambda: hier("ring"), "native": lambda: hier("native"),
           "mpi pair": lambda: eng.all_reduce(h, h, pair=True),
           "mpi": lambda: eng.all_reduce(x, x)}
    for call in run.values():
        call()   # warm up: the rails' groups, MPI's connections
    times: dict[str, list[float]] = {m: [] for m in METHODS}
    for _ in range(calls):
        for m in METHODS:
            eng.barrier()
            t0 = time.perf_counter()
            run[m]()
            times[m].append(time.perf_counter() - t0)
    return {m: statistics.median(multihost._slowest(comm, times[m])) for m in METHODS}


def rank_main(sizes: list[int], calls: int) -> None:
    import ringlet

    comm = ringlet.init()
    eng = multihost._Engine("mpi", comm)
    out = {str(nbytes): _row(comm, eng, nbytes, calls) for nbytes in sizes}
    if comm.rank == 0:
        print(json.dumps(out), flush=True)
    comm.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--sizes", default="1M,4M,16M", help="comma-separated (K/M suffixes)")
    ap.add_argument("--calls", type=int, default=15, help="calls per method and size")
    ap.add_argument("--jobs", type=int, default=2, help="jobs, one after the other")
    ap.add_argument("--own-cpus", action="store_true", help=multihost.OWN_CPUS_HELP)
    ap.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    sizes = [multihost.parse_size(s) for s in a.sizes.split(",")]
    if a.rank:
        rank_main(sizes, a.calls)
        return 0
    netbed = multihost._netbed()
    why = netbed.check().why_not(rate=a.rate)
    if why:
        print(f"mpi_rails_ab: cannot run here: {why}", file=sys.stderr)
        return 2
    bound = {s: s * 8 / netbed.parse_rate(a.rate) for s in sizes}
    print(f"all_reduce, 2 hosts x 2 ranks at {a.rate}, {a.calls} calls per method and size in "
          f"turns; the slowest rank's time per call, median, ms [/ bound S/rate]")
    print("| job | size | " + " | ".join(METHODS) + " |")
    print("|---|---:|" + "---:|" * len(METHODS))
    args = [sys.executable, __file__, "--rank", "--sizes", a.sizes, "--calls", str(a.calls)]
    for job in range(1, a.jobs + 1):
        with netbed.NetBed(2, rate=a.rate, own_cpus=a.own_cpus) as bed:
            run = bed.mpiexec(args, ppn=2, env=multihost._job_env())
            codes = run.wait(timeout=900)
            line = next((ln for ln in run.stdout(0).splitlines() if ln.startswith("{")), None)
            if any(codes) or line is None:
                print(run.report()[-3000:], file=sys.stderr)
                return 1
        res: dict[str, Any] = json.loads(line)
        for s in sizes:
            row = res[str(s)]
            cells = [f"{row[m] * 1e3:.2f} [{row[m] / bound[s]:.2f}x]" for m in METHODS]
            print(f"| {job} | {multihost.human(s)} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
