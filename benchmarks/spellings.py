"""A small all_reduce, its arguments spelled each way a user may spell them.

    python benchmarks/spellings.py                 # 2 ranks, 8 B, 3 loops of 3000 calls
    python benchmarks/spellings.py -n 3 --calls 5000

The compiled small-message path (``ringlet.lean``) takes a sum all_reduce however its
arguments are spelled; a spelling it did not take went to the Python path, about 30-45
times as long a call (``op=ReduceOp.SUM``, ``"SUM"``, torch's and mpi4py's SUM,
``algorithm="auto"``, ``async_op=numpy.False_`` and ``out=x`` did, until session 35).
Per spelling, the microseconds a call takes on rank 0 (the best of the loops, each
after a barrier) and the share of its calls the compiled path took (the least of any
rank's: a call whose peer is not there within 200 us goes to the Python path too, so
on a busy machine some do);
``op="max"`` is the Python path's time, for scale.  Spellings of mpi4py or torch are
left out where those are not installed.

Session 35, this 2-core machine on a slow day (CPU probe 15-23 us), 2 ranks, 8 B, us
per call and the share on the compiled path, before (commit 5dcc0b8, with
``PYTHONPATH`` pointing at its checkout) and after the fix:

==========================  =============  ============
spelling                    before         after
==========================  =============  ============
``op="sum"``                1.78 (100 %)   1.56 (100 %)
``op=ReduceOp.SUM``         55.2 (0 %)     1.81 (100 %)
``op="SUM"``                56.1 (0 %)     3.23 (100 %)
``algorithm="auto"``        47.5 (0 %)     3.45 (100 %)
``async_op=np.False_``      50.9 (0 %)     3.17 (100 %)
``out=x``                   75.5 (0 %)     1.93 (100 %)
``op=dist.ReduceOp.SUM``    42.4 (0 %)     4.78 (100 %)
``op="max"`` (Python path)  38.2           30.5
==========================  =============  ============

Session 36 (probe 25 us), a torch CPU tensor (``torch.from_numpy(x)``): 89.1 us (0 %)
before, 5.6-6.3 us (100 %) after, where ``op="sum"`` on the array took 1.75 (the tensor's
``numpy()`` view alone costs about 2 us here).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from typing import Any

import numpy as np

import ringlet


def _spellings() -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {
        'op="sum"': {}, "op=ReduceOp.SUM": {"op": ringlet.ReduceOp.SUM},
        'op="SUM"': {"op": "SUM"}, 'algorithm="auto"': {"algorithm": "auto"},
        "async_op=np.False_": {"async_op": np.False_}, "out=x": {"out": "x"}}
    if importlib.util.find_spec("torch") is not None:
        import torch.distributed as dist

        out["op=dist.ReduceOp.SUM"] = {"op": dist.ReduceOp.SUM}
        out["a torch tensor"] = {"x": "tensor"}
    out['op="max" (the Python path)'] = {"op": "max"}
    return out


def _rank(comm: ringlet.Communicator, nbytes: int, loops: int, calls: int
          ) -> dict[str, tuple[float, float]]:
    x = np.ones(max(1, nbytes // 4), np.float32)
    lean = comm._lean
    res: dict[str, tuple[float, float]] = {}
    for label, kw in _spellings().items():
        kw = {k: (x if v == "x" and k == "out" else v) for k, v in kw.items()}
        arg = x
        if kw.pop("x", None) == "tensor":
            import torch

            arg = torch.from_numpy(x)
        for _ in range(calls // 4):   # warm: the size's choice asked, caches filled
            comm.all_reduce(arg, **kw)
        before = lean.calls if lean is not None else 0
        best = float("inf")
        for _ in range(loops):
            comm.barrier()
            t = time.perf_counter()
            for _ in range(calls):
                comm.all_reduce(arg, **kw)
            best = min(best, (time.perf_counter() - t) / calls)
        took = (lean.calls - before if lean is not None else 0) / (loops * calls)
        res[label] = (best * 1e6, float(comm.all_reduce(np.array([took]), op="min")[0]))
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", "--nranks", type=int, default=2)
    ap.add_argument("--bytes", type=int, default=8)
    ap.add_argument("--loops", type=int, default=3)
    ap.add_argument("--calls", type=int, default=3000)
    a = ap.parse_args(argv)
    from ringlet.lean import BUILT

    got = ringlet.spawn(_rank, a.nranks, a.bytes, a.loops, a.calls)[0]
    print(f"all_reduce of {a.bytes} B at {a.nranks} ranks, us per call on rank 0 (best of "
          f"{a.loops} loops of {a.calls}); the compiled path "
          f"{'is built' if BUILT else 'is not built here'}")
    print("| spelling | us | calls on the compiled path (the fewest of any rank) |")
    print("|---|---:|---:|")
    for label, (us, took) in got.items():
        print(f"| {label} | {us:.2f} | {took:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
