"""The gloo peer: the same sweep through ``torch.distributed`` with the gloo backend.

One process per rank, started by :func:`ringlet.bench.peers.run_peer`::

    python -m ringlet.bench.gloo RANK tcp://127.0.0.1:PORT JOB_JSON

Buffers are CPU tensors that share memory with the layout's numpy arrays, so
inputs and checks are exactly ringlet's.  Each collective is measured in the
form torch offers: in place for all_reduce, broadcast and reduce, out of place
for the others.  Rank 0 reports on stdout (:func:`ringlet.bench.peers.emit`).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import numpy as np

from ..errors import ArgumentError
from .core import IN, OUT, BenchFn, Job, Row, pingpong_partner, sweep
from .peers import emit

Arrays = dict[str, np.ndarray | None]

#: the form each collective has in torch.distributed, and the call, for the legend
FORMS: dict[str, tuple[str, str]] = {
    "all_reduce": (IN, "all_reduce"),
    "broadcast": (IN, "broadcast"),
    "reduce": (IN, "reduce"),
    "all_gather": (OUT, "all_gather_single"),
    "reduce_scatter": (OUT, "reduce_scatter_single"),
    "all_to_all": (OUT, "all_to_all_single"),
    "scatter": (OUT, "scatter"),
    "gather": (OUT, "gather"),
    "sendrecv": (OUT, "send/recv"),
}


@dataclass
class Ctx:
    dist: Any          # the torch.distributed module
    torch: Any         # the torch module
    job: Job
    rank: int
    redop: Any = None  # the torch ReduceOp of job.op

    def t(self, a: np.ndarray | None) -> Any:
        """A tensor on the same memory as ``a``."""
        return None if a is None else self.torch.from_numpy(a)


GLOO: dict[str, BenchFn[Ctx]] = {}


def register(name: str) -> Callable[[BenchFn[Ctx]], BenchFn[Ctx]]:
    """Decorator: ``fn`` is gloo's benchmark of collective ``name``."""

    def deco(fn: BenchFn[Ctx]) -> BenchFn[Ctx]:
        GLOO[name] = fn
        return fn

    return deco


@register("all_reduce")
def all_reduce(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x = c.t(a["x"])
    return lambda: c.dist.all_reduce(x, op=c.redop)


@register("broadcast")
def broadcast(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x = c.t(a["x"])
    return lambda: c.dist.broadcast(x, src=c.job.root)


@register("reduce")
def reduce(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x = c.t(a["x"])
    return lambda: c.dist.reduce(x, dst=c.job.root, op=c.redop)


@register("all_gather")
def all_gather(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = c.t(a["x"]), c.t(a["y"])
    fn = getattr(c.dist, "all_gather_single", None) or c.dist.all_gather_into_tensor
    return lambda: fn(y.view(-1), x)


@register("reduce_scatter")
def reduce_scatter(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = c.t(a["x"]), c.t(a["y"])
    fn = getattr(c.dist, "reduce_scatter_single", None) or c.dist.reduce_scatter_tensor
    return lambda: fn(y, x, op=c.redop)


@register("all_to_all")
def all_to_all(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = c.t(a["x"]), c.t(a["y"])
    return lambda: c.dist.all_to_all_single(y, x)


@register("scatter")
def scatter(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    y = c.t(a["y"])
    x = c.t(a["x"])
    blocks = None if x is None else list(x.view(c.job.nranks, -1).unbind(0))
    return lambda: c.dist.scatter(y, blocks, src=c.job.root)


@register("gather")
def gather(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = c.t(a["x"]), c.t(a["y"])
    blocks = None if y is None else list(y.unbind(0))
    return lambda: c.dist.gather(x, blocks, dst=c.job.root)


@register("sendrecv")
def sendrecv(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = c.t(a["x"]), c.t(a["y"])
    dist = c.dist
    peer = pingpong_partner(c.rank, c.job.nranks)
    if peer is None:
        return lambda: None
    if c.rank % 2 == 0:
        def ping() -> None:
            dist.send(x, peer)
            dist.recv(y, peer)
        return ping

    def pong() -> None:
        dist.recv(y, peer)
        dist.send(x, peer)
    return pong


class GlooSync:
    """:class:`~ringlet.bench.core.Sync` on the gloo process group."""

    def __init__(self, dist: Any, torch: Any) -> None:
        self.dist, self.torch = dist, torch

    def barrier(self) -> None:
        self.dist.barrier()

    def max(self, value: float) -> float:
        t = self.torch.tensor([value], dtype=self.torch.float64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX)
        return float(t[0])

    def sum(self, value: int) -> int:
        t = self.torch.tensor([value], dtype=self.torch.int64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.SUM)
        return int(t[0])


def _redop(dist: Any, op: str) -> Any:
    if op == "none":
        return None
    ops = {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX", "band": "BAND",
           "bor": "BOR", "bxor": "BXOR"}
    if op not in ops:
        raise ArgumentError(f"gloo has no {op.upper()} reduction (torch.distributed's "
                            f"ReduceOp.AVG is NCCL-only)")
    return getattr(dist.ReduceOp, ops[op])


def run(rank: int, init_method: str, job: Job, timeout: float) -> list[Row]:
    """Join the gloo group as ``rank`` and run ``job``'s sweep."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # one process per core, as ringlet's and MPI's ranks
    dist.init_process_group("gloo", init_method=init_method, rank=rank,
                            world_size=job.nranks, timeout=timedelta(seconds=timeout))
    try:
        if rank == 0:
            emit({"event": "start", "library": f"torch {torch.__version__} gloo",
                  "form": FORMS[job.collective][0],
                  "call": f"torch.distributed.{FORMS[job.collective][1]}"})
        ctx = Ctx(dist, torch, job, rank, _redop(dist, job.op))
        return sweep(GLOO[job.collective], ctx, job, rank, (FORMS[job.collective][0],),
                     GlooSync(dist, torch),
                     lambda row: emit({"event": "row", "row": row.to_dict()}) if rank == 0
                     else None)
    finally:
        dist.destroy_process_group()


def main(argv: list[str]) -> int:
    """``python -m ringlet.bench.gloo RANK INIT_METHOD JOB_JSON [TIMEOUT]``."""
    rank = int(argv[0])
    try:
        run(rank, argv[1], Job.from_json(argv[2]), float(argv[3]) if len(argv) > 3 else 300.0)
    except Exception as exc:
        traceback.print_exc()
        if rank == 0:
            emit({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
