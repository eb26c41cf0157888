"""Prefix reductions, ``scan`` and ``exscan`` (a mixin of
:class:`~ringlet.comm.Communicator`); their schedules are in
:mod:`ringlet.algorithms.scan`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from .buffers import Buffer, as_buffer
from .calls import Calls, _collective
from .errors import ArgumentError
from .ops import LOGICAL, ReduceOp, check_op
from .schedule import Buf

if TYPE_CHECKING:
    from .agreement import Desc


class Prefix(Calls):
    """scan, exscan."""

    if TYPE_CHECKING:   # what these are made of (ringlet.comm)
        def _out(self, out: Any, like: Buffer, count: int, what: str,
                 same_is_in_place: bool = False) -> Buffer | None: ...
        def _choose(self, collective: str, algorithm: str | None, nbytes: int) -> str: ...
        def _run(self, collective: str, name: str, root: int, m: int,
                 bufs: dict[Buf, np.ndarray], dt: Any, op: ReduceOp | None) -> None: ...
        def _desc(self, coll: str, *, op: ReduceOp | int = 0, buf: Buffer | None = None,
                  root: int = 0, algorithm: str = "", path: int = 0) -> Desc: ...

    @_collective
    def scan(self, x: Any, op: ReduceOp | str = "sum", out: Any = None,
             algorithm: str | None = None, async_op: bool = False) -> Any:
        """Inclusive prefix reduction: rank r gets ``x0 (op) x1 (op) ... (op) xr`` (as
        MPI_Scan), in place unless ``out`` is given::

            # Rank 0: x = [1]   Rank 1: x = [2]   Rank 2: x = [3]
            comm.scan(x)                  # x == [1], [3], [6]
        """
        return self._prefix("scan", x, op, out, algorithm, async_op)

    @_collective
    def exscan(self, x: Any, op: ReduceOp | str = "sum", out: Any = None,
               algorithm: str | None = None, async_op: bool = False) -> Any:
        """Exclusive prefix reduction: rank r > 0 gets ``x0 (op) ... (op) x{r-1}`` (as
        MPI_Exscan); rank 0's result is its own ``x``, unchanged (MPI leaves it undefined).
        In place unless ``out`` is given."""
        return self._prefix("exscan", x, op, out, algorithm, async_op)

    def _prefix(self, collective: str, x: Any, op: ReduceOp | str, out: Any,
                algorithm: str | None, async_op: bool) -> Any:
        rop = ReduceOp.parse(op)
        if rop is ReduceOp.AVG:
            raise ArgumentError(f"AVG has no prefix form (each rank would divide by its own "
                                f"count); use SUM and divide by rank + 1 in {collective}")
        xb = as_buffer(x, "x", writable=out is None or out is x)
        check_op(rop, xb.dt)
        ob = self._out(out, xb, xb.count, "x", same_is_in_place=True)
        name = self._choose(collective, algorithm, xb.nbytes)
        dst = ob or xb
        # the result that went through no op (scan's rank 0: its own x; exscan's rank 1:
        # rank 0's) is made 0 or 1 as the logical ops' results are
        first = rop in LOGICAL and self.rank == (0 if collective == "scan" else 1)

        def run(seq: int) -> Any:
            if ob is not None:
                ob.flat[...] = xb.flat
            self._run(collective, name, 0, xb.count, {Buf.OUT: dst.flat}, xb.dt, rop)
            if first and dst.count:
                np.not_equal(dst.flat, 0, out=dst.flat, casting="unsafe")
            return dst.obj if out is None else out

        return self._submit(self._desc(collective, op=rop, buf=xb, algorithm=name),
                            run, async_op, name, xb)
