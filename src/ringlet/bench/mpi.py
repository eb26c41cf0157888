"""The MPI peer: the same sweep through mpi4py's buffer interface (MPICH from its wheel).

Started under ``mpiexec`` by :func:`ringlet.bench.peers.run_peer`::

    mpiexec -n N python -m ringlet.bench.mpi JOB_JSON

On one host MPICH moves data through its shared-memory path.  Every
collective is measured out of place (separate send and receive buffers),
except ``Bcast``, which has one buffer.  Rank 0 reports on stdout
(:func:`ringlet.bench.peers.emit`).
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ArgumentError
from .core import IN, OUT, BenchFn, Job, Row, pingpong_partner, sweep
from .peers import emit

Arrays = dict[str, np.ndarray | None]

#: the form each collective has here, and the mpi4py call, for the legend
FORMS: dict[str, tuple[str, str]] = {
    "all_reduce": (OUT, "Allreduce"),
    "broadcast": (IN, "Bcast"),
    "reduce": (OUT, "Reduce"),
    "all_gather": (OUT, "Allgather"),
    "reduce_scatter": (OUT, "Reduce_scatter_block"),
    "all_to_all": (OUT, "Alltoall"),
    "scatter": (OUT, "Scatter"),
    "gather": (OUT, "Gather"),
    "sendrecv": (OUT, "Send/Recv"),
}


@dataclass
class Ctx:
    comm: Any          # MPI.COMM_WORLD
    job: Job
    redop: Any = None  # the MPI.Op of job.op


MPI_SUITE: dict[str, BenchFn[Ctx]] = {}


def register(name: str) -> Callable[[BenchFn[Ctx]], BenchFn[Ctx]]:
    """Decorator: ``fn`` is MPI's benchmark of collective ``name``."""

    def deco(fn: BenchFn[Ctx]) -> BenchFn[Ctx]:
        MPI_SUITE[name] = fn
        return fn

    return deco


@register("all_reduce")
def all_reduce(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = a["x"], a["y"]
    return lambda: c.comm.Allreduce(x, y, c.redop)


@register("broadcast")
def broadcast(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x = a["x"]
    return lambda: c.comm.Bcast(x, c.job.root)


@register("reduce")
def reduce(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = a["x"], a["y"]
    return lambda: c.comm.Reduce(x, y, c.redop, c.job.root)


@register("all_gather")
def all_gather(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = a["x"], a["y"]
    return lambda: c.comm.Allgather(x, y)


@register("reduce_scatter")
def reduce_scatter(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = a["x"], a["y"]
    return lambda: c.comm.Reduce_scatter_block(x, y, c.redop)


@register("all_to_all")
def all_to_all(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = a["x"], a["y"]
    return lambda: c.comm.Alltoall(x, y)


@register("scatter")
def scatter(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = a["x"], a["y"]
    return lambda: c.comm.Scatter(x, y, c.job.root)


@register("gather")
def gather(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = a["x"], a["y"]
    return lambda: c.comm.Gather(x, y, c.job.root)


@register("sendrecv")
def sendrecv(c: Ctx, a: Arrays, form: str) -> Callable[[], object]:
    x, y = a["x"], a["y"]
    comm = c.comm
    rank = comm.Get_rank()
    peer = pingpong_partner(rank, c.job.nranks)
    if peer is None:
        return lambda: None
    if rank % 2 == 0:
        def ping() -> None:
            comm.Send(x, peer)
            comm.Recv(y, peer)
        return ping

    def pong() -> None:
        comm.Recv(y, peer)
        comm.Send(x, peer)
    return pong


class MPISync:
    """:class:`~ringlet.bench.core.Sync` on an MPI communicator."""

    def __init__(self, comm: Any, mpi: Any) -> None:
        self.comm, self.mpi = comm, mpi

    def barrier(self) -> None:
        self.comm.Barrier()

    def max(self, value: float) -> float:
        return float(self.comm.allreduce(value, op=self.mpi.MAX))

    def sum(self, value: int) -> int:
        return int(self.comm.allreduce(value, op=self.mpi.SUM))


def _redop(mpi: Any, op: str, dtype: str) -> Any:
    if op == "none":
        return None
    if op == "avg":
        raise ArgumentError("MPI has no AVG reduction")
    logical = {"land": mpi.LAND, "lor": mpi.LOR, "lxor": mpi.LXOR}
    if dtype == "bool":  # numpy's bool add/multiply are or/and; MPI has only logical ops
        return {"sum": mpi.LOR, "max": mpi.LOR, "bor": mpi.LOR, "prod": mpi.LAND,
                "min": mpi.LAND, "band": mpi.LAND, "bxor": mpi.LXOR, **logical}[op]
    return {"sum": mpi.SUM, "prod": mpi.PROD, "min": mpi.MIN, "max": mpi.MAX,
            "band": mpi.BAND, "bor": mpi.BOR, "bxor": mpi.BXOR, **logical}[op]


def run(job: Job) -> list[Row]:
    """Run ``job``'s sweep on ``MPI.COMM_WORLD``."""
    import mpi4py
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.Get_size() != job.nranks:
        raise ArgumentError(f"started with {comm.Get_size()} MPI ranks, the job needs "
                            f"{job.nranks}")
    rank = comm.Get_rank()
    if rank == 0:
        lib = " ".join(MPI.Get_library_version().strip().splitlines()[0].split())
        lib = lib.replace(" Version:", "")  # "MPICH Version: 5.0.2" -> "MPICH 5.0.2"
        emit({"event": "start", "library": f"{lib} via mpi4py {mpi4py.__version__}",
              "form": FORMS[job.collective][0],
              "call": f"mpi4py Comm.{FORMS[job.collective][1]}"})
    ctx = Ctx(comm, job, _redop(MPI, job.op, job.dtype))
    return sweep(MPI_SUITE[job.collective], ctx, job, rank, (FORMS[job.collective][0],),
                 MPISync(comm, MPI),
                 lambda row: emit({"event": "row", "row": row.to_dict()}) if rank == 0
                 else None)


def main(argv: list[str]) -> int:
    """``mpiexec -n N python -m ringlet.bench.mpi JOB_JSON``."""
    from mpi4py import MPI

    try:
        run(Job.from_json(argv[0]))
    except Exception as exc:
        traceback.print_exc()
        if MPI.COMM_WORLD.Get_rank() == 0:
            emit({"event": "error", "message": f"{type(exc).__name__}: {exc}"})
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)  # the other ranks may wait in a collective: end them all
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
