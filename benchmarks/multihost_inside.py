"""Inside one hierarchical all_reduce on the torch engine: where its time goes, beside gloo's.

    python benchmarks/multihost_inside.py [--rate 1gbit] [--sizes 64K,1M,4M] [--pieces 0,4]

Needs root and the network-namespace test bed (``tests/netbed.py``), as
``benchmarks/multihost.py``: two hosts, two ranks each, under ``torchrun``,
every host's link shaped to ``--rate``.  Per size (times: the slowest rank's per
loop, medians of five loops; the phases: rank 0's):

- ``comm.all_reduce(x)`` (hierarchical with the native rails) timed in loops
  between barriers, with its three phases timed inside the call: the
  intra-node reduce-scatter (shared memory, including the wait for the
  slower local rank), the rail (gloo's all_reduce of this rank's shard with
  its peer on the other host) and the intra-node all-gather (including the
  wait for the slower rail); what the call spends before them is its
  agreement;
- torch's own ``dist.all_reduce`` of the same vector on the world group
  (gloo's ring over the four ranks);
- ``comm.barrier()`` and ``dist.barrier()``: a call's agreement alone, and
  gloo's.

``--pieces K`` (K > 0) also runs the call with its phases overlapped: the
vector in K pieces, each piece's rail started asynchronously as soon as its
reduce-scatter is done, the all-gathers after (the experiment behind
MULTIHOST.md's "overlapping ... did not help").  Medians of five loops, ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

HERE = Path(__file__).resolve()


def rank_main(out: str, sizes: list[int], pieces: list[int]) -> None:
    from datetime import timedelta

    import numpy as np
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    import ringlet
    from ringlet import rails
    from ringlet.executor import execute
    from ringlet.ops import ReduceOp

    spent = {"reduce_scatter": 0.0, "rail": 0.0, "all_gather": 0.0}
    calls = [0]
    real_run = rails.run

    def timed_run(sched: Any, rank: int, m: int, g: int, transport: Any, rail: Any,
                  out: Any, red: Any, what: Any, dt: Any) -> None:
        p1, p3, lo, hi = rails.phases(sched, rank, m, g)
        t0 = time.perf_counter()
        execute(p1, transport, {1: out}, red, what)
        t1 = time.perf_counter()
        if hi > lo:
            rail.native("all_reduce", 0, hi - lo, {1: out[lo:hi]}, ReduceOp.SUM, what, dt)
        t2 = time.perf_counter()
        execute(p3, transport, {1: out}, red, what)
        t3 = time.perf_counter()
        spent["reduce_scatter"] += t1 - t0
        spent["rail"] += t2 - t1
        spent["all_gather"] += t3 - t2
        calls[0] += 1

    def piped_run(k: int) -> Any:
        def run(sched: Any, rank: int, m: int, g: int, transport: Any, rail: Any,
                out: Any, red: Any, what: Any, dt: Any) -> None:
            bounds = [m * i // k for i in range(k + 1)]
            started = []
            for i in range(k):
                seg = out[bounds[i]:bounds[i + 1]]
                p1, p3, lo, hi = rails.phases(sched, rank, seg.size, g)
                execute(p1, transport, {1: seg}, red, what)
                opts = dist.AllreduceOptions()
                opts.reduceOp = dist.ReduceOp.SUM
                started.append((rail._pg.allreduce([torch.from_numpy(seg[lo:hi])], opts),
                                p3, seg))
            for work, p3, seg in started:
                work.wait()
                execute(p3, transport, {1: seg}, red, what)
        return run

    comm = ringlet.init()

    from multihost import _slowest, _timed  # this script's directory is on the path

    engine = SimpleNamespace(barrier=dist.barrier)

    def loops(call: Any, k: int) -> float:
        return statistics.median(_slowest(comm, _timed(engine, call, k, 5))) * 1e3  # type: ignore[arg-type]

    res: dict[str, Any] = {"sizes": {}}
    for nbytes in sizes:
        x = np.ones(max(2, nbytes // 4), np.float32)
        t = torch.from_numpy(x)
        k = max(2, min(50, (1 << 20) // nbytes))
        row: dict[str, Any] = {}
        rails.run = timed_run
        comm.all_reduce(x)
        for key in spent:
            spent[key] = 0.0
        calls[0] = 0
        row["hierarchical"] = loops(lambda x=x: comm.all_reduce(x), k)
        row["phases"] = {key: v / calls[0] * 1e3 for key, v in spent.items()}
        for p in pieces:
            rails.run = piped_run(p)
            comm.all_reduce(x)
            row[f"hierarchical, {p} pieces overlapped"] = loops(
                lambda x=x: comm.all_reduce(x), k)
        rails.run = real_run
        dist.all_reduce(t)
        row["gloo dist.all_reduce"] = loops(lambda t=t: dist.all_reduce(t), k)
        res["sizes"][str(nbytes)] = row
    res["comm.barrier"] = loops(comm.barrier, 100)
    res["dist.barrier"] = loops(dist.barrier, 100)
    if comm.rank == 0:
        Path(out).write_text(json.dumps(res))
    comm.close()
    dist.destroy_process_group()


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_rank":
        rank_main(sys.argv[2], [int(v) for v in sys.argv[3].split(",")],
                  [int(v) for v in sys.argv[4].split(",") if int(v) > 0])
        return 0
    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(0, str(HERE.parent.parent / "tests"))
    import multihost
    import netbed

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--sizes", default="64K,1M,4M")
    ap.add_argument("--pieces", default="0", help="comma-separated; 0: no overlapped run")
    a = ap.parse_args()
    sizes = [multihost.parse_size(v) for v in a.sizes.split(",")]
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        path = fh.name
    try:
        with netbed.NetBed(2, rate=a.rate) as bed:
            job = bed.torchrun(HERE, ["_rank", path, ",".join(map(str, sizes)), a.pieces],
                               nproc_per_node=2, env=multihost._job_env())
            job.wait(timeout=900)
        res = json.loads(Path(path).read_text())
    finally:
        os.unlink(path)
    print(f"torch engine, 2 hosts x 2 ranks, link {a.rate}; the slowest rank's medians "
          f"(ms; the phases: rank 0's)")
    for nbytes, row in res["sizes"].items():
        ph = row.pop("phases")
        print(f"\n{multihost.human(int(nbytes))}:")
        for label, v in row.items():
            print(f"  {label:<44} {v:8.3f}")
        print("  inside hierarchical: " + ", ".join(f"{key} {v:.3f}" for key, v in ph.items())
              + f"; before them (agreement) {row['hierarchical'] - sum(ph.values()):.3f}")
    print(f"\ncomm.barrier {res['comm.barrier']:.3f}, dist.barrier {res['dist.barrier']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
