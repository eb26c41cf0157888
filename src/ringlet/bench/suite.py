"""ringlet's benchmark functions, one per collective, and the rank body of ``ringlet bench``.

Each function is registered under the collective's name (as in mpi4py's
``bench.py``) and turns one rank's buffers into one call; :func:`run_rank`
runs the sweep on every rank started by :func:`ringlet.spawn`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..comm import Communicator
from .core import (
    COLLECTIVES,
    IN,
    BenchFn,
    Data,
    Job,
    Layout,
    Row,
    layout,
    pingpong_partner,
    sweep,
)

Arrays = dict[str, np.ndarray | None]


@dataclass
class Ctx:
    """What a benchmark function needs besides its buffers."""

    comm: Communicator
    job: Job

    @property
    def op(self) -> str:
        return self.job.op

    @property
    def algorithm(self) -> str | None:
        return self.job.algorithm


SUITE: dict[str, BenchFn[Ctx]] = {}


def register(name: str) -> Callable[[BenchFn[Ctx]], BenchFn[Ctx]]:
    """Decorator: ``fn`` is ringlet's benchmark of collective ``name``."""

    def deco(fn: BenchFn[Ctx]) -> BenchFn[Ctx]:
        SUITE[name] = fn
        return fn

    return deco


@register("all_reduce")
def all_reduce(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = a["x"], a.get("y")
    if form == IN:
        return lambda: c.comm.all_reduce(x, c.op, algorithm=c.algorithm)
    return lambda: c.comm.all_reduce(x, c.op, out=y, algorithm=c.algorithm)


@register("broadcast")
def broadcast(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x = a["x"]
    return lambda: c.comm.broadcast(x, c.job.root, algorithm=c.algorithm)


@register("reduce")
def reduce(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = a["x"], a.get("y")
    return lambda: c.comm.reduce(x, c.job.root, c.op, out=y, algorithm=c.algorithm)


@register("all_gather")
def all_gather(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = a["x"], a["y"]
    return lambda: c.comm.all_gather(x, out=y, algorithm=c.algorithm)


@register("reduce_scatter")
def reduce_scatter(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = a["x"], a["y"]
    return lambda: c.comm.reduce_scatter(x, c.op, out=y, algorithm=c.algorithm)


@register("all_to_all")
def all_to_all(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = a["x"], a["y"]
    return lambda: c.comm.all_to_all(x, out=y, algorithm=c.algorithm)


@register("scatter")
def scatter(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = a["x"], a["y"]
    return lambda: c.comm.scatter(x, c.job.root, out=y, algorithm=c.algorithm)


@register("gather")
def gather(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = a["x"], a["y"]
    return lambda: c.comm.gather(x, c.job.root, out=y, algorithm=c.algorithm)


@register("sendrecv")
def sendrecv(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = a["x"], a["y"]
    comm = c.comm
    peer = pingpong_partner(comm.rank, comm.size)
    if peer is None:
        return lambda: None
    if comm.rank % 2 == 0:
        def ping() -> None:
            comm.send(x, peer)
            comm.recv(y, peer)
        return ping

    def pong() -> None:
        comm.recv(y, peer)
        comm.send(x, peer)
    return pong


class CommSync:
    """:class:`~ringlet.bench.core.Sync` on a ringlet communicator."""

    def __init__(self, comm: Communicator) -> None:
        self.comm = comm

    def barrier(self) -> None:
        self.comm.barrier()

    def max(self, value: float) -> float:
        return float(self.comm.all_reduce(np.array([value], np.float64), "max")[0])

    def sum(self, value: int) -> int:
        return int(self.comm.all_reduce(np.array([value], np.int64), "sum")[0])


def shared_placer(comm: Communicator, job: Job) -> Callable[[Layout], None]:
    """Move a layout's arrays into shared memory from ``comm.empty`` (``--buffers shared``).

    One buffer per array name, as large as the largest row needs, allocated
    once (``comm.empty`` is collective and its memory lives as long as the
    communicator); each row uses the leading part of it, at the same place on
    every rank, which is what the zero-copy paths need.
    """
    data = Data(job.dtype, job.op, job.nranks)
    count = max(c for _, c in job.cases)
    need: dict[str, int] = {}
    for form in COLLECTIVES[job.collective].forms:
        for name, a in layout(job, data, comm.rank, count, form).arrays.items():
            if a is not None:
                need[name] = max(need.get(name, 0), a.size)
    pool = {name: comm.empty(need[name], data.dtype) for name in sorted(need)}

    def place(lay: Layout) -> None:
        for name, a in lay.arrays.items():
            if a is not None:
                buf = pool[name][:a.size].reshape(a.shape)
                buf[...] = a
                lay.arrays[name] = buf

    return place


def run_rank(comm: Communicator, job_json: str, progress: Any = None) -> list[Row] | None:
    """The body of each rank of ``ringlet bench`` (started by :func:`ringlet.spawn`).

    Rank 0 puts each finished row's size on ``progress`` (a multiprocessing
    queue, or None) and returns the rows; the other ranks return None.
    """
    job = Job.from_json(job_json)

    def on_row(row: Row) -> None:
        if progress is not None and comm.rank == 0:
            progress.put(row.size)

    place = shared_placer(comm, job) if job.buffers == "shared" else None
    rows = sweep(SUITE[job.collective], Ctx(comm, job), job, comm.rank,
                 COLLECTIVES[job.collective].forms, CommSync(comm), on_row, place)
    return rows if comm.rank == 0 else None
