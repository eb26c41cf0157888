"""The communicator: validates, numbers, checks agreement, picks an algorithm, runs it.

Every collective goes through the same path:

1. validate the arguments locally (``ArgumentError``, nothing sent, the
   communicator stays usable);
2. take the next sequence number and publish a descriptor (collective, op,
   dtype, count, root, algorithm); wait until every rank has published its
   descriptor for that number and compare them all: a disagreement raises
   ``MismatchError`` on every rank, a rank that never arrives a
   ``CommTimeoutError`` naming it;
3. run this rank's steps of the chosen schedule (:mod:`ringlet.executor`).

A failure in step 3 (a peer died, a deadline passed) aborts the communicator
on every rank, so the others fail fast instead of waiting for their own
deadline.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import pickle
import queue
import secrets
import threading
import zlib
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from .algorithms import algorithms as _algorithms
from .algorithms import build as _build
from .buffers import Buffer, as_buffer, check_out, new_buffer
from .config import Settings
from .errors import (
    ArgumentError,
    CommTimeoutError,
    MismatchError,
    PeerError,
    RingletError,
)
from .executor import compile_program, execute
from .ops import DTYPE_BY_CODE, ReduceOp, check_op, finish_avg, reducer
from .schedule import Buf
from .transport.fused import Fused, shared_all_reduce
from .transport.shm import (
    P2P,
    SHM_DIR,
    RecvReq,
    SendReq,
    ShmTransport,
    create_region,
    open_region,
)
from .wait import Waiter

log = logging.getLogger("ringlet")

_COLL_CODES = {name: i for i, name in enumerate(
    ["none", "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
     "all_to_all", "scatter", "gather", "barrier", "split"])}
_COLL_NAMES = {v: k for k, v in _COLL_CODES.items()}
_FIELDS = ("collective", "op", "dtype", "count", "root", "algorithm", "path")
_GENERIC, _POST, _STAGE, _SHARED = 0, 1, 2, 3
_FUSED = {("all_reduce", "oneshot"): _POST, ("all_reduce", "direct"): _STAGE,
          ("broadcast", "direct"): _STAGE, ("all_gather", "direct"): _STAGE,
          ("reduce_scatter", "direct"): _STAGE, ("all_to_all", "direct"): _STAGE}
_P2P_MAGIC = 0x50325031


def _algo_code(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


class Work:
    """Handle of an asynchronous operation (``async_op=True``, ``isend``, ``irecv``)."""

    def __init__(self, what: str, peer: int | None = None) -> None:
        self._what = what
        self._peer = peer
        self._done = threading.Event()
        self._result: Any = None
        self._error: BaseException | None = None
        self._driver: Callable[[Work, float | None], None] | None = None

    def _finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self._result, self._error = result, error
        self._done.set()

    def is_completed(self) -> bool:
        """True once the operation finished (successfully or not)."""
        if not self._done.is_set() and self._driver is not None:
            self._driver(self, 0.0)
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until done and return the operation's result; re-raise its error.

        ``timeout`` (seconds) bounds this wait only; the operation keeps its own
        deadline (``RINGLET_TIMEOUT``).
        """
        if self._driver is not None and not self._done.is_set():
            self._driver(self, timeout)
        if not self._done.wait(timeout):
            raise CommTimeoutError(f"{self._what} did not complete within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def __repr__(self) -> str:
        state = "done" if self._done.is_set() else "pending"
        return f"<ringlet.Work {self._what} {state}>"


def _collective(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Tell the peers when this rank rejects a collective call's arguments.

    The ArgumentError is raised here at once, without waiting; the rank also
    publishes an error descriptor under the call's sequence number, so that
    the ranks whose arguments were fine raise a MismatchError naming this one
    instead of waiting for it until their deadline.
    """

    def wrapper(self: Communicator, *args: Any, **kwargs: Any) -> Any:
        seq = self._seq
        try:
            return fn(self, *args, **kwargs)
        except ArgumentError as exc:
            if self._seq == seq and not self._closed and self._broken is None:
                self._reject(fn.__name__, exc)
            raise

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


class Communicator:
    """A group of ranks that run collectives together.  Create with :func:`ringlet.init`.

    Buffers are C-contiguous numpy arrays or torch CPU tensors.  Per-rank
    example::

        comm = ringlet.init()
        x = np.full(4, comm.rank, np.float32)
        comm.all_reduce(x)          # Rank 0, 1, 2, 3: x == [6, 6, 6, 6]
    """

    def __init__(self, rank: int, size: int, transport: ShmTransport, settings: Settings,
                 job_id: str) -> None:
        self.rank = rank
        self.size = size
        self.settings = settings
        self.job_id = job_id
        self._t = transport
        self._seq = 0
        self._exec_lock = threading.RLock()
        self._submit_lock = threading.Lock()
        self._queue: queue.Queue[Any] | None = None
        self._inflight = 0
        self._broken: str | None = None
        self._closed = False
        self._scratch: dict[str, np.ndarray] = {}
        self._chosen: dict[tuple[str, str | None, int], str] = {}
        self._shm_digest = zlib.crc32(
            f"{settings.shm_post_bytes}:{settings.shm_stage_bytes}:{settings.shm_piece_bytes}"
            .encode()) & 0xFFFF
        self._p2p = _P2P(self)
        self._cur: tuple[int, tuple[int, ...]] | None = None
        self._fused = Fused(transport, lambda: self._current) if settings.fused else None
        #: shared buffers from empty(): (start address, stop address, every rank's region)
        self._regions: list[tuple[int, int, list[np.ndarray]]] = []
        self._region_maps: list[Any] = []
        transport.describe = lambda: self._current
        if settings.debug:
            _configure_logging(settings.debug)

    def __repr__(self) -> str:
        return f"<ringlet.Communicator rank {self.rank} of {self.size}, job {self.job_id}>"

    # --- collectives -----------------------------------------------------------------

    @_collective
    def all_reduce(self, x: Any, op: ReduceOp | str = "sum", out: Any = None,
                   algorithm: str | None = None, async_op: bool = False) -> Any:
        """Reduce ``x`` over all ranks; every rank gets the result, bit-identical.

        In place unless ``out`` is given.  Returns the result buffer (or a
        :class:`Work` with ``async_op=True``)::

            # Rank 0: x = [1, 2]   Rank 1: x = [3, 4]
            comm.all_reduce(x)            # both ranks: x == [4, 6]
        """
        rop = ReduceOp.parse(op)
        xb = as_buffer(x, "x", writable=out is None)
        check_op(rop, xb.dt)
        ob = self._out(out, xb, xb.count, "x")
        name = self._choose("all_reduce", algorithm, xb.nbytes)
        path = self._path("all_reduce", name, xb.nbytes)
        fused = self._fused
        shared = self._shared_view(xb.flat) if ob is None and path & 3 == _STAGE else None
        if shared is not None:
            path = _SHARED | shared[0] << 2 | shared[1] << 12

        def before(seq: int) -> None:
            if path & 3 == _POST:
                fused.post(seq, xb.flat)  # type: ignore[union-attr]

        def run(seq: int) -> Any:
            dst = ob or xb
            if shared is not None:
                peers = [region[shared[1]:shared[1] + xb.nbytes].view(xb.flat.dtype)
                         for region in self._regions[shared[0]][2]]
                shared_all_reduce(fused, xb.flat, peers,  # type: ignore[arg-type]
                                  reducer(rop, xb.dt))
            elif xb.count and path & 3 == _POST:
                fused.oneshot_all_reduce(seq, xb.flat, dst.flat,  # type: ignore[union-attr]
                                         reducer(rop, xb.dt))
            elif xb.count and path & 3 == _STAGE:
                fused.direct_all_reduce(xb.flat, reducer(rop, xb.dt),  # type: ignore[union-attr]
                                        None if ob is None else ob.flat)
            else:
                if ob is not None:
                    ob.flat[...] = xb.flat
                self._run("all_reduce", name, 0, xb.count, {Buf.OUT: dst.flat}, xb.dt, rop)
            if rop is ReduceOp.AVG:
                finish_avg(dst.flat, xb.dt, self.size)
            return dst.obj

        return self._submit("all_reduce",
                            (rop, xb.dt.code, xb.count, 0, _algo_code(name), path),
                            run, async_op, name, xb, before)

    @_collective
    def broadcast(self, x: Any, root: int = 0, algorithm: str | None = None,
                  async_op: bool = False) -> Any:
        """Copy the root's ``x`` into every rank's ``x`` (in place); returns ``x``."""
        root = self._root(root)
        xb = as_buffer(x, "x", writable=self.rank != root)
        name = self._choose("broadcast", algorithm, xb.nbytes)
        path = self._path("broadcast", name, xb.nbytes)

        def run(seq: int) -> Any:
            if xb.count and path & 3 == _STAGE:
                self._fused.direct_broadcast(xb.flat, root)  # type: ignore[union-attr]
            else:
                self._run("broadcast", name, root, xb.count, {Buf.OUT: xb.flat}, xb.dt, None)
            return xb.obj

        return self._submit("broadcast",
                            (0, xb.dt.code, xb.count, root, _algo_code(name), path),
                            run, async_op, name, xb)

    @_collective
    def reduce(self, x: Any, root: int = 0, op: ReduceOp | str = "sum", out: Any = None,
               algorithm: str | None = None, async_op: bool = False) -> Any:
        """Reduce ``x`` over all ranks into the root's ``x`` (or ``out``).

        Other ranks' ``x`` is left unchanged.  Returns the result at the root
        and None elsewhere.
        """
        root = self._root(root)
        rop = ReduceOp.parse(op)
        at_root = self.rank == root
        xb = as_buffer(x, "x", writable=at_root and out is None)
        check_op(rop, xb.dt)
        ob = self._out(out, xb, xb.count, "x") if at_root else None
        name = self._choose("reduce", algorithm, xb.nbytes)

        def run(seq: int) -> Any:
            if at_root:
                dst = (ob or xb).flat
                src = xb.flat.copy() if ob is None else xb.flat
            else:
                dst, src = self._tmp("reduce-out", xb.dt.np_dtype, xb.count), xb.flat
            self._run("reduce", name, root, xb.count, {Buf.IN: src, Buf.OUT: dst}, xb.dt, rop)
            if not at_root:
                return None
            if rop is ReduceOp.AVG:
                finish_avg(dst, xb.dt, self.size)
            return (ob or xb).obj

        return self._submit("reduce", (rop, xb.dt.code, xb.count, root, _algo_code(name), 0),
                            run, async_op, name, xb)

    @_collective
    def all_gather(self, x: Any, out: Any = None, algorithm: str | None = None,
                   async_op: bool = False) -> Any:
        """Every rank gets every rank's ``x``: returns shape ``(size, *x.shape)``."""
        xb = as_buffer(x, "x", writable=False)
        ob = self._out(out, xb, xb.count * self.size, "size * x") or \
            new_buffer(xb, (self.size, *xb.shape))
        name = self._choose("all_gather", algorithm, xb.nbytes * self.size)
        path = self._path("all_gather", name, xb.nbytes * self.size)

        def run(seq: int) -> Any:
            if xb.count and path & 3 == _STAGE:
                self._fused.direct_all_gather(xb.flat, ob.flat)  # type: ignore[union-attr]
            else:
                self._run("all_gather", name, 0, xb.count, {Buf.IN: xb.flat, Buf.OUT: ob.flat},
                          xb.dt, None)
            return ob.obj

        return self._submit("all_gather",
                            (0, xb.dt.code, xb.count, 0, _algo_code(name), path),
                            run, async_op, name, xb)

    @_collective
    def reduce_scatter(self, x: Any, op: ReduceOp | str = "sum", out: Any = None,
                       algorithm: str | None = None, async_op: bool = False) -> Any:
        """Reduce ``x`` over all ranks; rank i gets block i (``x.shape[0]`` split in size)."""
        rop = ReduceOp.parse(op)
        xb = as_buffer(x, "x", writable=False)
        check_op(rop, xb.dt)
        shape = self._blocks(xb, "reduce_scatter")
        ob = self._out(out, xb, xb.count // self.size, "a block of x") or new_buffer(xb, shape)
        name = self._choose("reduce_scatter", algorithm, xb.nbytes)
        path = self._path("reduce_scatter", name, xb.nbytes)
        m = xb.count // self.size

        def run(seq: int) -> Any:
            if m and path & 3 == _STAGE:
                self._fused.direct_reduce_scatter(  # type: ignore[union-attr]
                    xb.flat, ob.flat, reducer(rop, xb.dt))
            else:
                self._run("reduce_scatter", name, 0, m, {Buf.IN: xb.flat, Buf.OUT: ob.flat},
                          xb.dt, rop)
            if rop is ReduceOp.AVG:
                finish_avg(ob.flat, xb.dt, self.size)
            return ob.obj

        return self._submit("reduce_scatter",
                            (rop, xb.dt.code, xb.count, 0, _algo_code(name), path),
                            run, async_op, name, xb)

    @_collective
    def all_to_all(self, x: Any, out: Any = None, algorithm: str | None = None,
                   async_op: bool = False) -> Any:
        """Block i of ``x`` goes to rank i; block j of the result came from rank j."""
        xb = as_buffer(x, "x", writable=False)
        self._blocks(xb, "all_to_all")
        ob = self._out(out, xb, xb.count, "x") or new_buffer(xb, xb.shape)
        name = self._choose("all_to_all", algorithm, xb.nbytes)
        path = self._path("all_to_all", name, xb.nbytes)
        m = xb.count // self.size

        def run(seq: int) -> Any:
            if m and path & 3 == _STAGE:
                self._fused.direct_all_to_all(xb.flat, ob.flat)  # type: ignore[union-attr]
            else:
                self._run("all_to_all", name, 0, m, {Buf.IN: xb.flat, Buf.OUT: ob.flat},
                          xb.dt, None)
            return ob.obj

        return self._submit("all_to_all",
                            (0, xb.dt.code, xb.count, 0, _algo_code(name), path),
                            run, async_op, name, xb)

    @_collective
    def scatter(self, x: Any = None, root: int = 0, out: Any = None,
                algorithm: str | None = None, async_op: bool = False) -> Any:
        """Block i of the root's ``x`` goes to rank i.

        ``x`` is needed at the root only (first dimension divisible by the
        size); other ranks pass ``out=`` so ringlet knows the block's shape.
        Returns the received block.
        """
        root = self._root(root)
        at_root = self.rank == root
        if at_root:
            if x is None:
                raise ArgumentError("scatter: the root must pass x (the blocks to send)")
            xb = as_buffer(x, "x", writable=False)
            shape = self._blocks(xb, "scatter")
            ob = self._out(out, xb, xb.count // self.size, "a block of x") or \
                new_buffer(xb, shape)
        else:
            if out is None:
                raise ArgumentError(
                    "scatter: ranks other than the root must pass out= (the receive buffer)")
            ob = as_buffer(out, "out", writable=True)
            xb = ob
        name = self._choose("scatter", algorithm, ob.nbytes * self.size)

        def run(seq: int) -> Any:
            bufs = {Buf.OUT: ob.flat}
            if at_root:
                bufs[Buf.IN] = xb.flat
            self._run("scatter", name, root, ob.count, bufs, ob.dt, None)
            return ob.obj

        return self._submit("scatter", (0, ob.dt.code, ob.count, root, _algo_code(name), 0),
                            run, async_op, name, ob)

    @_collective
    def gather(self, x: Any, root: int = 0, out: Any = None, algorithm: str | None = None,
               async_op: bool = False) -> Any:
        """The root gets every rank's ``x``: shape ``(size, *x.shape)``; None elsewhere."""
        root = self._root(root)
        at_root = self.rank == root
        xb = as_buffer(x, "x", writable=False)
        ob = None
        if at_root:
            ob = self._out(out, xb, xb.count * self.size, "size * x") or \
                new_buffer(xb, (self.size, *xb.shape))
        name = self._choose("gather", algorithm, xb.nbytes * self.size)

        def run(seq: int) -> Any:
            bufs = {Buf.IN: xb.flat}
            if ob is not None:
                bufs[Buf.OUT] = ob.flat
            self._run("gather", name, root, xb.count, bufs, xb.dt, None)
            return None if ob is None else ob.obj

        return self._submit("gather", (0, xb.dt.code, xb.count, root, _algo_code(name), 0),
                            run, async_op, name, xb)

    def barrier(self, async_op: bool = False) -> Any:
        """Wait until every rank has entered the barrier."""
        return self._submit("barrier", (0, 0, 0, 0, 0, 0), lambda seq: None, async_op, "", None)

    # --- objects (pickled; trusted peers only) -----------------------------------------

    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """The root's ``obj``, pickled and sent to every rank.  Trusted peers only:
        unpickling runs code chosen by the sender."""
        root = self._root(root)
        data, why = None, ""
        if self.rank == root:
            try:
                data = np.frombuffer(pickle.dumps(obj), np.uint8)
            except Exception as exc:  # noqa: BLE001 - every rank must hear of it
                why = f"{type(exc).__name__}: {exc}"
        n = np.array([-1 if data is None else data.size], np.int64)
        self.broadcast(n, root)
        if n[0] < 0:
            raise ArgumentError(
                f"broadcast_object: rank {root} could not pickle its object"
                + (f" ({why})" if why else ""))
        buf = data.copy() if data is not None else np.empty(int(n[0]), np.uint8)
        self.broadcast(buf, root)
        return obj if self.rank == root else pickle.loads(buf.tobytes())

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (pickled; trusted peers only)."""
        try:
            data, why = np.frombuffer(pickle.dumps(obj), np.uint8), ""
        except Exception as exc:  # noqa: BLE001 - every rank must hear of it
            data, why = np.empty(0, np.uint8), f"{type(exc).__name__}: {exc}"
        sizes = self.all_gather(np.array([-1 if why else data.size], np.int64)).reshape(-1)
        if (sizes < 0).any():
            bad = [int(q) for q in np.flatnonzero(sizes < 0)]
            raise ArgumentError(f"all_gather_object: rank(s) {bad} could not pickle their "
                                f"object" + (f" ({why})" if why else ""))
        padded = np.zeros(int(sizes.max()), np.uint8)
        padded[:data.size] = data
        allb = self.all_gather(padded)
        return [pickle.loads(allb[i, :int(sizes[i])].tobytes()) for i in range(self.size)]

    # --- point to point -------------------------------------------------------------------

    def send(self, x: Any, dst: int, tag: int = 0) -> None:
        """Send ``x`` to rank ``dst``; returns once ``x`` may be reused.

        Small messages are buffered (eager); a message larger than the channel
        waits for the receiver, as MPI's rendezvous does.
        """
        self.isend(x, dst, tag).wait()

    def recv(self, x: Any, src: int, tag: int = 0) -> Any:
        """Receive a message from ``src`` with ``tag`` into ``x``; returns ``x``."""
        return self.irecv(x, src, tag).wait()

    def isend(self, x: Any, dst: int, tag: int = 0) -> Work:
        """Start sending ``x``; ``wait()`` the returned :class:`Work` before reusing ``x``."""
        xb = as_buffer(x, "x", writable=False)
        return self._p2p.isend(xb, self._peer(dst, "dst"), self._tag(tag))

    def irecv(self, x: Any, src: int, tag: int = 0) -> Work:
        """Start receiving into ``x``; ``wait()`` returns ``x`` once it arrived."""
        xb = as_buffer(x, "x", writable=True)
        return self._p2p.irecv(xb, self._peer(src, "src"), self._tag(tag))

    # --- groups -------------------------------------------------------------------------

    @_collective
    def split(self, color: int | None, key: int = 0) -> Communicator | None:
        """Split into sub-communicators, one per ``color`` (like ``MPI_Comm_split``).

        Ranks with equal ``color`` form a group, ordered by ``(key, rank)``.
        ``color=None`` (or negative) joins no group and returns None.  Collective
        over this communicator.
        """
        if color is not None and not isinstance(color, (int, np.integer)):
            raise ArgumentError(f"split: color must be an int or None, got {color!r}")
        if not isinstance(key, (int, np.integer)):
            raise ArgumentError(f"split: key must be an int, got {key!r}")
        c = -1 if color is None or color < 0 else int(color)
        table = self.all_gather_object((c, int(key), secrets.token_hex(8)))
        if c < 0:
            self.barrier()
            return None
        members = sorted((k, r) for r, (cc, k, _) in enumerate(table) if cc == c)
        ranks = [r for _, r in members]
        token = table[ranks[0]][2]
        t = ShmTransport(ranks.index(self.rank), len(ranks),
                         f"ringlet-{self.job_id}-{token}", self.settings)
        try:
            t.connect()
        finally:
            # no rank leaves split before every group has mapped its segments
            self.barrier()
        return Communicator(ranks.index(self.rank), len(ranks), t, self.settings, self.job_id)

    # --- shared buffers -------------------------------------------------------------------

    @_collective
    def empty(self, shape: int | tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        """A numpy array in shared memory, for zero-copy collectives.  Collective.

        Every rank calls it with the same shape and dtype and gets its own
        array; every peer maps it too, so an in-place ``all_reduce`` of it (or
        of a contiguous slice at the same place on every rank) with the
        ``direct`` algorithm (the automatic choice for large vectors) reads the
        peers' data where it lies instead of copying it through the staging
        area.  ``torch.from_numpy(a)`` shares the memory, so tensors work too.
        The array lives as long as the communicator (mode 0600; its file is
        unlinked as soon as every rank has mapped it)::

            g = comm.empty(1 << 24)      # every rank
            g[...] = local_gradients
            comm.all_reduce(g)           # zero-copy
        """
        try:
            dt = np.dtype(dtype)
            shp = (int(shape),) if isinstance(shape, (int, np.integer)) else \
                tuple(int(d) for d in shape)
        except TypeError as exc:
            raise ArgumentError(f"empty: bad shape or dtype ({exc})") from None
        from .ops import dtype_of_numpy

        dtype_of_numpy(dt)
        if any(d < 0 for d in shp):
            raise ArgumentError(f"empty: shape {shp} has a negative dimension")
        nbytes = int(np.prod(shp, dtype=np.int64)) * dt.itemsize
        spec = self.all_gather_object((shp, dt.str))
        if any(sp != spec[0] for sp in spec):
            raise MismatchError(
                "empty: ranks asked for different buffers: " + "; ".join(
                    f"rank {q}: {sp[0]} {np.dtype(sp[1]).name}" for q, sp in enumerate(spec)))
        token = self.broadcast_object(secrets.token_hex(8) if self.rank == 0 else None)
        path = os.path.join(SHM_DIR, f"ringlet-{self.job_id}-buf{token}-{{}}")
        maps: list[Any] = [None] * self.size
        try:
            maps[self.rank] = create_region(path.format(self.rank), nbytes)
            self.barrier()                        # every file exists
            for q in range(self.size):
                if q != self.rank:
                    maps[q] = open_region(path.format(q), nbytes)
            self.barrier()                        # every rank has mapped every file
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path.format(self.rank))
        regions = [np.frombuffer(mm, np.uint8, max(nbytes, 1)) for mm in maps]
        mine = regions[self.rank]
        start = mine.__array_interface__["data"][0]
        self._regions.append((start, start + nbytes, regions))
        self._region_maps.extend(maps)
        return mine[:nbytes].view(dt).reshape(shp)

    def _shared_view(self, flat: np.ndarray) -> tuple[int, int] | None:
        """(region index, byte offset) if ``flat`` lies inside a buffer from empty()."""
        if not self._regions or flat.size == 0:
            return None
        addr = flat.__array_interface__["data"][0]
        for i, (lo, hi, _) in enumerate(self._regions):
            if lo <= addr and addr + flat.nbytes <= hi and i < 1024:
                return i, addr - lo
        return None

    # --- life cycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Finish pending work and release the shared memory (idempotent)."""
        if self._closed:
            return
        if self._queue is not None:
            done = Work("close")
            self._queue.put((0, "", (), lambda seq: None, done, "", None, None))
            done.wait()
            self._queue.put(None)
        self._closed = True
        self._regions.clear()
        for mm in self._region_maps:
            with contextlib.suppress(BufferError):  # the user still holds the array
                mm.close()
        self._region_maps.clear()
        self._t.close()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def empty_scratch(self) -> None:
        """Drop cached scratch buffers (they are reused between calls)."""
        self._scratch.clear()

    # --- internals ----------------------------------------------------------------------

    def _root(self, root: Any) -> int:
        if not isinstance(root, (int, np.integer)) or isinstance(root, bool):
            raise ArgumentError(f"root must be an int, got {root!r}")
        if not 0 <= root < self.size:
            raise ArgumentError(
                f"root {root} is out of range for a communicator of size {self.size} "
                f"(valid: 0..{self.size - 1})")
        return int(root)

    def _peer(self, peer: Any, what: str) -> int:
        if not isinstance(peer, (int, np.integer)) or isinstance(peer, bool) or \
                not 0 <= peer < self.size:
            raise ArgumentError(
                f"{what} {peer!r} is not a rank of this communicator (0..{self.size - 1})")
        return int(peer)

    def _tag(self, tag: Any) -> int:
        if not isinstance(tag, (int, np.integer)) or not 0 <= tag < 2 ** 62:
            raise ArgumentError(f"tag must be an int >= 0, got {tag!r}")
        return int(tag)

    def _blocks(self, xb: Buffer, what: str) -> tuple[int, ...]:
        if not xb.shape or xb.shape[0] % self.size:
            raise ArgumentError(
                f"{what}: x.shape[0] must be divisible by the communicator size {self.size}, "
                f"got shape {xb.shape}")
        return (xb.shape[0] // self.size, *xb.shape[1:])

    def _out(self, out: Any, like: Buffer, count: int, what: str) -> Buffer | None:
        if out is None:
            return None
        ob = as_buffer(out, "out", writable=True)
        check_out(ob, like, count, what)
        if like.count and np.shares_memory(ob.flat, like.flat):
            raise ArgumentError("out overlaps x; pass a separate buffer or leave out=None")
        return ob

    def _choose(self, collective: str, algorithm: str | None, nbytes: int) -> str:
        key = (collective, algorithm, nbytes)
        name = self._chosen.get(key)
        if name is None:
            from .algorithms.select import choose, tuner_for

            name = choose(collective, self.size, nbytes, requested=algorithm,
                          setting=self.settings.algo, tuner=tuner_for(self.settings))
            if name == "oneshot" and algorithm in (None, "auto") and self._fused is not None \
                    and not self._fused.fits_post(nbytes):
                # the automatic choice runs oneshot fused or not at all: past the post area
                # the staged direct path is the fast one (every rank has the same settings)
                name = "direct"
            if len(self._chosen) > 4096:
                self._chosen.clear()
            self._chosen[key] = name
        return name

    def _path(self, collective: str, name: str, nbytes: int) -> int:
        """How this rank runs the call: generic executor, or a fused shared-memory path.

        The answer (with a digest of the sizes it depends on) goes into the
        descriptor, so ranks whose settings differ get a MismatchError, not garbage.
        """
        path = _FUSED.get((collective, name), _GENERIC) if self._fused else _GENERIC
        if path == _POST and not self._fused.fits_post(nbytes):  # type: ignore[union-attr]
            path = _GENERIC
        if path == _GENERIC:
            return _GENERIC
        return path | self._shm_digest << 2

    def _tmp(self, key: str, dtype: np.dtype[Any], count: int) -> np.ndarray:
        nbytes = count * dtype.itemsize
        buf = self._scratch.get(key)
        if buf is None or buf.size < nbytes:
            buf = np.empty(max(nbytes, 64), np.uint8)
            self._scratch[key] = buf
        return buf[:nbytes].view(dtype)

    def _run(self, collective: str, name: str, root: int, m: int, bufs: dict[Buf, np.ndarray],
             dt: Any, op: ReduceOp | None) -> None:
        """Run this rank's steps of ``name`` for ``collective`` over flat typed buffers."""
        if m == 0:
            return
        sched = _build(collective, name, self.size, root)
        prog = compile_program(sched, self.rank, m)
        flat = {int(b): a for b, a in bufs.items()}
        tmp_elems = prog.elems.get(int(Buf.TMP))
        if tmp_elems:
            flat[int(Buf.TMP)] = self._tmp("tmp", dt.np_dtype, tmp_elems)
        if int(Buf.OUT) not in flat and int(Buf.OUT) in prog.elems:
            flat[int(Buf.OUT)] = self._tmp("out", dt.np_dtype, prog.elems[int(Buf.OUT)])
        red = reducer(op, dt) if op is not None else None
        execute(prog, self._t, flat, red, lambda: self._current)

    def _submit(self, coll: str, words: tuple[int, ...], run: Callable[[int], Any],
                async_op: bool, name: str, xb: Buffer | None,
                before: Callable[[int], None] | None = None) -> Any:
        """Number the call and run it inline, or queue it behind pending async work."""
        self._usable()
        full = (_COLL_CODES[coll], *words, 0)
        with self._submit_lock:
            self._seq += 1
            seq = self._seq
            if not async_op and not self._inflight:
                # nothing queued: run here (holding the lock keeps the numbering in order)
                return self._execute(seq, coll, full, run, name, xb, before)
            work = Work(f"{coll} #{seq}")
            self._inflight += 1
            self._worker().put((seq, coll, full, run, work, name, xb, before))
        return work if async_op else work.wait()

    def _reject(self, coll: str, exc: ArgumentError) -> None:
        """Publish an error descriptor for the next sequence number (see _collective)."""
        code = _COLL_CODES.get(coll, 0)

        def publish() -> None:
            self._t.set_note(f"{exc}")
            self._t.publish(seq, (code, 0, 0, 0, 0, 0, 0, 1))

        with self._submit_lock:
            self._seq += 1
            seq = self._seq
            if not self._inflight:
                publish()
                return
            self._inflight += 1
            self._worker().put((seq, "reject", (), lambda _: publish(), Work(f"{coll} #{seq}"),
                                "", None, None))

    def _worker(self) -> queue.Queue[Any]:
        if self._queue is None:
            self._queue = queue.Queue()
            threading.Thread(target=self._work_loop, name=f"ringlet-{self.rank}",
                             daemon=True).start()
        return self._queue

    def _work_loop(self) -> None:
        q = self._queue
        while q is not None:
            item = q.get()
            if item is None:
                return
            seq, coll, full, run, work, name, xb, before = item
            try:
                if coll == "reject":
                    res = run(seq)
                else:
                    res = self._execute(seq, coll, full, run, name, xb, before) if coll else None
                work._finish(res)
            except BaseException as exc:  # delivered to the waiter
                work._finish(error=exc)
            finally:
                with self._submit_lock:
                    if coll:
                        self._inflight -= 1

    def _usable(self) -> None:
        if self._closed:
            raise RingletError("the communicator is closed")
        if self._broken is not None:
            raise PeerError(f"the communicator was aborted earlier: {self._broken}")

    @property
    def _current(self) -> str:
        """The call in progress, described for messages (formatted only when needed)."""
        return "a collective" if self._cur is None else self._describe(*self._cur)

    def _describe(self, seq: int, full: tuple[int, ...]) -> str:
        coll = _COLL_NAMES.get(full[0], f"collective {full[0]}")
        if coll == "barrier":
            return f"barrier #{seq}"
        dt = DTYPE_BY_CODE.get(full[2])
        text = f"{coll} #{seq} ({full[3]} x {dt.name if dt else full[2]}"
        if coll in ("broadcast", "reduce", "scatter", "gather"):
            text += f", root {full[4]}"
        return text + ")"

    def _execute(self, seq: int, coll: str, full: tuple[int, ...], run: Callable[[int], Any],
                 name: str, xb: Buffer | None,
                 before: Callable[[int], None] | None = None) -> Any:
        with self._exec_lock:
            self._usable()
            self._cur = (seq, full)
            try:
                if before is not None:
                    before(seq)
                self._agree(seq, full)
                if log.isEnabledFor(logging.INFO) and coll != "barrier":
                    log.info("rank %d: %s algorithm %s%s, %d B", self.rank, self._current,
                             name or _alg_name(coll, full[5]),
                             " (fused)" if full[6] else "", xb.nbytes if xb else 0)
                return run(seq)
            except (MismatchError, ArgumentError):
                raise
            except BaseException as exc:
                msg = f"rank {self.rank} failed in {self._current}: {exc}"
                if isinstance(exc, (PeerError, CommTimeoutError)) and str(exc).startswith("rank "):
                    msg = str(exc)  # already names the rank it started on
                self._broken = msg
                self._t.discard_pending()
                self._t.abort(msg, timeout=isinstance(exc, CommTimeoutError))
                if isinstance(exc, RingletError):
                    raise
                raise PeerError(msg) from exc

    def _agree(self, seq: int, full: tuple[int, ...]) -> None:
        """Publish this rank's descriptor and compare it with every rank's."""
        t = self._t
        t.publish(seq, full)
        if self.size == 1:
            return
        got: dict[int, tuple[int, ...]] = {self.rank: tuple(full)}
        missing = [q for q in range(self.size) if q != self.rank]

        def what() -> str:
            where = []
            for q in missing:
                last = t.latest_desc(q)
                if last is None:
                    where.append(f"rank {q} has not entered any collective")
                else:
                    where.append(f"rank {q} is in {self._describe(last[0], last[1])}")
            return f"{self._current} ({'; '.join(where)})"

        waiter = None
        while missing:
            for q in list(missing):
                d = t.peer_desc(q, seq)
                if d is not None:
                    got[q] = d[:len(full)]
                    missing.remove(q)
            if missing:
                if waiter is None:
                    waiter = Waiter(t.settings, what, lambda: missing,
                                    lambda: t.check(missing))
                waiter.pause()
        ref = got[self.rank]
        if all(d == ref for d in got.values()):
            return
        rejected = [q for q in sorted(got) if got[q][7] == 1]
        if rejected:
            why = "; ".join(f"rank {q}: {t.note(q)}" for q in rejected)
            raise MismatchError(
                f"{self._current} cannot run: rank{'s' if len(rejected) > 1 else ''} "
                f"{', '.join(map(str, rejected))} rejected the call's arguments ({why})")
        for i, field in enumerate(_FIELDS):
            values: dict[str, list[int]] = {}
            for r in sorted(got):
                values.setdefault(self._field(field, got[r][i], got[r]), []).append(r)
            if len(values) > 1:
                detail = "; ".join(f"rank{'s' if len(rs) > 1 else ''} "
                                   f"{', '.join(map(str, rs))}: {v}" for v, rs in values.items())
                what_ = (f"collective #{seq}" if field == "collective"
                         else f"{field} of {self._current}")
                raise MismatchError(f"ranks disagree about the {what_}: {detail}")

    def _field(self, field: str, v: int, full: tuple[int, ...]) -> str:
        if field == "collective":
            return _COLL_NAMES.get(v, str(v))
        if field == "op":
            return ReduceOp(v).name if v in ReduceOp._value2member_map_ else str(v)
        if field == "dtype":
            d = DTYPE_BY_CODE.get(v)
            return d.name if d else str(v)
        if field == "algorithm":
            return _alg_name(_COLL_NAMES.get(full[0], ""), v)
        if field == "path":
            kind = ("generic executor", "fused one-shot", "fused staged",
                    "zero-copy (buffer from comm.empty)")[v & 3]
            if v & 3 == _SHARED:
                return f"{kind}, buffer #{v >> 2 & 0x3FF} at byte {v >> 12}"
            return kind if not v >> 2 else f"{kind} (shm sizes #{v >> 2})"
        return str(v)


def _alg_name(coll: str, code: int) -> str:
    try:
        for n in _algorithms(coll):
            if _algo_code(n) == code:
                return n
    except RingletError:
        pass
    return f"#{code}"


class _P2P:
    """User point-to-point messages, on channels of their own (never mixed with collectives).

    A message is a header fragment (magic, tag, bytes, dtype) followed by the
    payload.  Receives match messages from a source in order by tag; a message
    that arrives before its receive is posted is kept aside (unexpected queue).
    """

    def __init__(self, comm: Communicator) -> None:
        self.c = comm
        n = comm.size
        self.lock = threading.RLock()
        self.sends: list[deque[tuple[SendReq, SendReq, Work]]] = [deque() for _ in range(n)]
        self.posted: list[deque[tuple[Buffer, int, Work]]] = [deque() for _ in range(n)]
        self.unexpected: list[deque[tuple[int, int, np.ndarray]]] = [deque() for _ in range(n)]
        self.active: list[tuple[RecvReq, Callable[[], None]] | None] = [None] * n

    def isend(self, xb: Buffer, dst: int, tag: int) -> Work:
        w = Work(f"send to rank {dst} (tag {tag})", dst)
        hdr = np.array([_P2P_MAGIC, tag, xb.nbytes, xb.dt.code, 0, 0, 0, 0], np.int64)
        t = self.c._t
        with self.lock:
            self.c._usable()
            h = t.isend(dst, [hdr.view(np.uint8)], kind=P2P)
            p = t.isend(dst, [xb.flat.view(np.uint8)], kind=P2P)
            self.sends[dst].append((h, p, w))
            w._driver = self._drive
            self._progress()
        return w

    def irecv(self, xb: Buffer, src: int, tag: int) -> Work:
        w = Work(f"recv from rank {src} (tag {tag})", src)
        with self.lock:
            self.c._usable()
            for i, (utag, code, data) in enumerate(self.unexpected[src]):
                if utag == tag:
                    del self.unexpected[src][i]
                    self._deliver(xb, src, tag, code, data.size, w, data)
                    return w
            self.posted[src].append((xb, tag, w))
            w._driver = self._drive
            self._progress()
        return w

    def _deliver(self, xb: Buffer, src: int, tag: int, code: int, nbytes: int, w: Work,
                 data: np.ndarray | None) -> RecvReq | None:
        if code != xb.dt.code or nbytes != xb.nbytes:
            d = DTYPE_BY_CODE.get(code)
            n = nbytes // d.itemsize if d else nbytes
            w._finish(error=ArgumentError(
                f"message from rank {src} (tag {tag}) holds {n} x {d.name if d else code}, "
                f"but the receive buffer holds {xb.count} x {xb.dt.name}"))
            return None
        if data is not None:
            xb.flat.view(np.uint8)[...] = data
            w._finish(xb.obj)
            return None
        return self.c._t.irecv(src, [xb.flat], None, kind=P2P)

    def _progress(self) -> bool:
        moved = False
        t = self.c._t
        for dq in self.sends:
            while dq:
                h, p, w = dq[0]
                moved |= h.push()
                if h.done:
                    moved |= p.push()
                if not p.done:
                    break
                dq.popleft()
                w._finish(None)
        for src in range(self.c.size):
            moved |= self._progress_in(src, t)
        return moved

    def _progress_in(self, src: int, t: ShmTransport) -> bool:
        moved = False
        while True:
            act = self.active[src]
            if act is not None:
                req, finish = act
                moved |= req.pull()
                if not req.done:
                    return moved
                self.active[src] = None
                finish()
                continue
            ch = t.inn[P2P][src]
            if ch.head[0] == ch.count:
                return moved
            hdr = ch.slots[ch.count % ch.K][:64].view(np.int64).copy()
            if ch.lens[ch.count % ch.K] != 64 or hdr[0] != _P2P_MAGIC:
                raise RingletError(f"corrupt point-to-point stream from rank {src}")
            ch.count += 1
            ch.tail[0] = ch.count
            moved = True
            tag, nbytes, code = int(hdr[1]), int(hdr[2]), int(hdr[3])
            match = next((i for i, (_, ptag, _) in enumerate(self.posted[src]) if ptag == tag),
                         None)
            if match is not None:
                xb, _, w = self.posted[src][match]
                del self.posted[src][match]
                into = self._deliver(xb, src, tag, code, nbytes, w, None)
                if into is None:  # size mismatch: drain the payload aside
                    drain = t.irecv(src, [np.empty(nbytes, np.uint8)], None, kind=P2P)
                    self.active[src] = (drain, _nothing)
                else:
                    self.active[src] = (into, functools.partial(w._finish, xb.obj))
            else:
                data = np.empty(nbytes, np.uint8)
                req = t.irecv(src, [data], None, kind=P2P)
                self.active[src] = (req, functools.partial(self._arrived, src, tag, code, data))

    def _arrived(self, src: int, tag: int, code: int, data: np.ndarray) -> None:
        """A message that had no receive when its header came is complete: give it to a
        receive posted since, or keep it for the next one."""
        match = next((i for i, (_, ptag, _) in enumerate(self.posted[src]) if ptag == tag),
                     None)
        if match is None:
            self.unexpected[src].append((tag, code, data))
            return
        xb, _, w = self.posted[src][match]
        del self.posted[src][match]
        self._deliver(xb, src, tag, code, data.size, w, data)

    def _drive(self, w: Work, timeout: float | None) -> None:
        t = self.c._t
        with self.lock:
            self._progress()
            if w._done.is_set() or timeout == 0.0:
                return
            watch = [] if w._peer is None or w._peer == self.c.rank else [w._peer]
            waiter = Waiter(t.settings, lambda: w._what,
                            lambda: [] if w._peer is None else [w._peer],
                            lambda: t.check(watch, w._what),
                            timeout=timeout)
            while not w._done.is_set():
                if not self._progress():
                    try:
                        waiter.pause()
                    except CommTimeoutError:
                        if timeout is not None:
                            return
                        raise


def _nothing() -> None:
    """Completion of a payload nobody wants (drained after a size mismatch)."""


def _configure_logging(level: str) -> None:
    if any(getattr(h, "_ringlet", False) for h in log.handlers):
        return
    h = logging.StreamHandler()
    h.setFormatter(logging.Formatter("ringlet %(levelname)s %(message)s"))
    h._ringlet = True  # type: ignore[attr-defined]
    log.addHandler(h)
    log.setLevel({"WARN": logging.WARNING, "TRACE": logging.DEBUG}.get(level.upper(),
                                                                      logging.INFO))
