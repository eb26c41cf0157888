"""The communicator: validates, numbers, checks agreement, picks an algorithm, runs it.

Every collective goes through the same path:

1. validate the arguments locally.  A rejected call raises ``ArgumentError``
   on this rank at once, naming the rank, and is still numbered: the rank
   publishes a *rejected* descriptor under the call's sequence number, so
   that its peers raise a ``MismatchError`` quoting the reason, and the calls
   after it keep pairing with the right ones.  Any exception that escapes
   validation (a ``TypeError`` from a strange argument) is turned into such
   an ``ArgumentError``: every rank must hear of every call;
2. take the next sequence number and publish a descriptor
   (:class:`~ringlet.agreement.Desc`: collective, op, dtype, count, shape,
   root, algorithm, path); wait until every rank has published its
   descriptor for that number and compare them all: a disagreement raises
   ``MismatchError`` on every rank, a rank that never arrives a
   ``CommTimeoutError`` naming it;
3. run this rank's steps of the chosen schedule (:mod:`ringlet.executor`).

A failure in step 3 (a peer died, a deadline passed, Ctrl-C) aborts the
communicator on every rank, so the others fail fast instead of waiting for
their own deadline; a ``KeyboardInterrupt`` reaches the caller as it is.

A rank publishes call s+1 where call s-1 was (two alternating places) and
the one-shot path writes its data there too, so it may only do so once every
peer has finished call s-1, that is, once every peer has published call s.
The agreement of a call that runs waits for that; a rejected call does not
wait, so the next call waits first (:meth:`Communicator._settle`).

One thread makes a communicator's calls (:meth:`Communicator._check_thread`):
two threads' calls would pair up differently on different ranks.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pickle
import queue
import secrets
import threading
import weakref
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from . import agreement
from .agreement import GENERIC, POST, SHARED, STAGE, Desc, algo_code, describe
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
from .ops import ReduceOp, check_op, finish_avg, reducer
from .p2p import P2PEngine
from .schedule import Buf
from .topology import Topology
from .transport.base import Transport
from .transport.fused import Fused, shared_all_reduce
from .transport.shm import SHM_DIR, ShmTransport, create_region, open_region
from .wait import Waiter
from .work import Work

log = logging.getLogger("ringlet")

_FUSED = {("all_reduce", "oneshot"): POST, ("all_reduce", "direct"): STAGE,
          ("broadcast", "direct"): STAGE, ("all_gather", "direct"): STAGE,
          ("reduce_scatter", "direct"): STAGE, ("all_to_all", "direct"): STAGE}
#: the engine's own collectives (an algorithm name)
NATIVE = "native"
#: calls made of other collectives: the descriptors of their parts carry this name
_COMPOUND = frozenset({"split", "broadcast_object", "all_gather_object", "empty"})
#: every live communicator, closed at interpreter exit so that peers see "closed", not "died"
_LIVE: weakref.WeakSet[Communicator] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for c in list(_LIVE):
        with contextlib.suppress(Exception):
            c._t.mark_closed()


def _collective(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Validate on every rank or tell the peers: the wrapper of every collective call.

    A call whose arguments this rank rejects raises ArgumentError here at
    once, naming this rank; the rank also publishes an error descriptor under
    the call's sequence number, so that its peers raise a MismatchError
    quoting it instead of waiting for it until their deadline.  Any other
    exception raised while the arguments are checked (a TypeError from a
    strange argument, say) becomes such an ArgumentError too: every rank
    must hear of every call, or the calls after it pair up wrongly.
    """
    name = fn.__name__
    compound = name in _COMPOUND

    def wrapper(self: Communicator, *args: Any, **kwargs: Any) -> Any:
        if self._owner_id != threading.get_ident():
            self._check_thread(name)
        outer = compound and self._api is None
        if outer:
            self._api = name
        seq = self._seq
        try:
            return fn(self, *args, **kwargs)
        except ArgumentError as exc:
            if self._seq == seq and not self._closed and self._broken is None:
                note = str(exc)
                exc.args = (f"{name} on rank {self.rank}: {note}",)
                self._reject(name, note, exc)
            raise
        except RingletError:
            raise
        except Exception as exc:
            if self._seq != seq or self._closed or self._broken is not None:
                raise
            note = f"bad argument ({type(exc).__name__}: {exc})"
            err = ArgumentError(f"{name} on rank {self.rank}: {note}")
            self._reject(name, note, err)
            raise err from exc
        finally:
            if outer:
                self._api = None

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

    def __init__(self, rank: int, size: int, transport: Transport, settings: Settings,
                 job_id: str, topology: Topology | None = None) -> None:
        self.rank = rank
        self.size = size
        self.settings = settings
        self.job_id = job_id
        #: which ranks share a node, and the engine between nodes (see ringlet.topology)
        self.topology = topology or Topology.single(size)
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
        self._descs: dict[tuple[Any, ...], Desc] = {}
        self._shm_digest = zlib.crc32(
            f"{settings.shm_post_bytes}:{settings.shm_stage_bytes}:{settings.shm_piece_bytes}"
            .encode()) & 0xFFFF
        self._p2p = P2PEngine(self)
        self._cur: tuple[int, Desc] | None = None
        #: the compound call (split, broadcast_object...) whose parts are being called
        self._api: str | None = None
        #: the sequence number of a call this rank rejected and whose peers may not have
        #: published it yet: the next publication waits for them (see _settle)
        self._pending_reject: int | None = None
        #: the thread that makes this communicator's calls (see _check_thread)
        self._owner: threading.Thread | None = None
        self._owner_id = -1
        self._fused = Fused(transport, lambda: self._current) \
            if settings.fused and isinstance(transport, ShmTransport) else None
        #: shared buffers from empty(): (start address, stop address, every rank's region)
        self._regions: list[tuple[int, int, list[np.ndarray]]] = []
        self._region_maps: list[Any] = []
        transport.describe = lambda: self._current
        _LIVE.add(self)
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
        shared = self._shared_view(xb.flat) if ob is None and path & 3 == STAGE else None
        if shared is not None:
            path = SHARED | shared[0] << 2 | shared[1] << 12

        def before(seq: int) -> None:
            if path & 3 == POST:
                fused.post(seq, xb.flat)  # type: ignore[union-attr]

        def run(seq: int) -> Any:
            dst = ob or xb
            if shared is not None:
                peers = [region[shared[1]:shared[1] + xb.nbytes].view(xb.flat.dtype)
                         for region in self._regions[shared[0]][2]]
                shared_all_reduce(fused, xb.flat, peers,  # type: ignore[arg-type]
                                  reducer(rop, xb.dt))
            elif xb.count and path & 3 == POST:
                fused.oneshot_all_reduce(seq, xb.flat, dst.flat,  # type: ignore[union-attr]
                                         reducer(rop, xb.dt))
            elif xb.count and path & 3 == STAGE:
                fused.direct_all_reduce(xb.flat, reducer(rop, xb.dt),  # type: ignore[union-attr]
                                        None if ob is None else ob.flat)
            else:
                if ob is not None:
                    ob.flat[...] = xb.flat
                self._run("all_reduce", name, 0, xb.count, {Buf.OUT: dst.flat}, xb.dt, rop)
            if rop is ReduceOp.AVG:
                finish_avg(dst.flat, xb.dt, self.size)
            return dst.obj

        return self._submit(self._desc("all_reduce", op=rop, buf=xb, algorithm=name, path=path),
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
            if xb.count and path & 3 == STAGE:
                self._fused.direct_broadcast(xb.flat, root)  # type: ignore[union-attr]
            else:
                self._run("broadcast", name, root, xb.count, {Buf.OUT: xb.flat}, xb.dt, None)
            return xb.obj

        return self._submit(self._desc("broadcast", buf=xb, root=root, algorithm=name, path=path),
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

        return self._submit(self._desc("reduce", op=rop, buf=xb, root=root, algorithm=name),
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
            if xb.count and path & 3 == STAGE:
                self._fused.direct_all_gather(xb.flat, ob.flat)  # type: ignore[union-attr]
            else:
                self._run("all_gather", name, 0, xb.count, {Buf.IN: xb.flat, Buf.OUT: ob.flat},
                          xb.dt, None)
            return ob.obj

        return self._submit(self._desc("all_gather", buf=xb, algorithm=name, path=path),
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
            if m and path & 3 == STAGE:
                self._fused.direct_reduce_scatter(  # type: ignore[union-attr]
                    xb.flat, ob.flat, reducer(rop, xb.dt))
            else:
                self._run("reduce_scatter", name, 0, m, {Buf.IN: xb.flat, Buf.OUT: ob.flat},
                          xb.dt, rop)
            if rop is ReduceOp.AVG:
                finish_avg(ob.flat, xb.dt, self.size)
            return ob.obj

        return self._submit(self._desc("reduce_scatter", op=rop, buf=xb, algorithm=name, path=path),
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
            if m and path & 3 == STAGE:
                self._fused.direct_all_to_all(xb.flat, ob.flat)  # type: ignore[union-attr]
            else:
                self._run("all_to_all", name, 0, m, {Buf.IN: xb.flat, Buf.OUT: ob.flat},
                          xb.dt, None)
            return ob.obj

        return self._submit(self._desc("all_to_all", buf=xb, algorithm=name, path=path),
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

        return self._submit(self._desc("scatter", buf=ob, root=root, algorithm=name),
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

        return self._submit(self._desc("gather", buf=xb, root=root, algorithm=name),
                            run, async_op, name, xb)

    @_collective
    def barrier(self, async_op: bool = False) -> Any:
        """Wait until every rank has entered the barrier."""
        return self._submit(self._desc("barrier"), lambda seq: None, async_op, "", None)

    # --- objects (pickled; trusted peers only) -----------------------------------------

    @_collective
    def broadcast_object(self, obj: Any, root: int = 0) -> Any:
        """The root's ``obj``, pickled and sent to every rank.  Trusted peers only:
        unpickling runs code chosen by the sender."""
        root = self._root(root)
        data = np.empty(0, np.uint8)
        if self.rank == root:
            data, ok = _pickled(obj)
        n = np.array([data.size if self.rank != root or ok else -1 - data.size], np.int64)
        self.broadcast(n, root)
        size = int(n[0]) if n[0] >= 0 else -1 - int(n[0])
        buf = data if self.rank == root else np.empty(size, np.uint8)
        self.broadcast(buf, root)
        if n[0] < 0:  # the root could not pickle its object: buf holds why, on every rank
            raise ArgumentError(f"rank {root} could not pickle its object "
                                f"({buf.tobytes().decode(errors='replace')})")
        return obj if self.rank == root else pickle.loads(buf.tobytes())

    @_collective
    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (pickled; trusted peers only)."""
        data, ok = _pickled(obj)
        sizes = self.all_gather(np.array([data.size if ok else -1 - data.size],
                                         np.int64)).reshape(-1)
        lengths = np.where(sizes < 0, -1 - sizes, sizes)
        padded = np.zeros(int(lengths.max()), np.uint8)
        padded[:data.size] = data
        allb = self.all_gather(padded)
        if (sizes < 0).any():  # every rank learns every reason
            why = "; ".join(f"rank {q}: " + allb[q, :int(lengths[q])].tobytes().decode(
                errors="replace") for q in np.flatnonzero(sizes < 0))
            raise ArgumentError(f"objects that could not be pickled ({why})")
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
        try:
            t = self._t.split(ranks, token)
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
        except TypeError as exc:
            raise ArgumentError(f"empty: bad dtype {dtype!r} ({exc})") from None
        if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
            shp: tuple[int, ...] = (int(shape),)
        elif isinstance(shape, (tuple, list)) and all(
                isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in shape):
            shp = tuple(int(d) for d in shape)
        else:
            raise ArgumentError(f"empty: shape must be an int or a tuple of ints, got "
                                f"{shape!r}")
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
        if not self._t.caps.shared_buffers:   # ranks on several hosts: an ordinary array
            return np.empty(shp, dt)
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
            self._queue.put((0, None, None, done, "", None, None))
            with contextlib.suppress(RingletError):
                done.wait()
            self._queue.put(None)
        self._closed = True
        _LIVE.discard(self)
        self._t.mark_closed()
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
        if algorithm is not None and not isinstance(algorithm, str):
            raise ArgumentError(
                f"algorithm must be a name (str) or None, got {algorithm!r}; valid: "
                f"{', '.join(_algorithms(collective))}")
        key = (collective, algorithm, nbytes)
        name = self._chosen.get(key)
        if name is None and algorithm == NATIVE:
            if not self._t.caps.native:
                raise ArgumentError(
                    f"algorithm 'native' runs the engine's own {collective}: it needs an "
                    f"engine (MPI or torch.distributed, RINGLET_ENGINE=mpi|torch); this "
                    f"communicator has none")
            name = NATIVE
        if name is None:
            from .algorithms.select import choose, tuner_for

            topo = self.topology
            name = choose(collective, self.size, nbytes, requested=algorithm,
                          setting=self.settings.algo, nodes=len(topo.nodes),
                          ranks_per_node=topo.ranks_per_node,
                          tuner=tuner_for(self.settings) if len(topo.nodes) == 1 else None)
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
        path = _FUSED.get((collective, name), GENERIC) if self._fused else GENERIC
        if path == POST and not self._fused.fits_post(nbytes):  # type: ignore[union-attr]
            path = GENERIC
        if path == GENERIC:
            return GENERIC
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
        if name == NATIVE:
            self._t.native(collective, root, m, {int(b): a for b, a in bufs.items()},
                           ReduceOp.SUM if op is ReduceOp.AVG else op, lambda: self._current)
            return
        g = self.topology.ranks_per_node   # the groups of a two-level schedule: the nodes
        sched = _build(collective, name, self.size, root, **(
            {"group": g} if name == "hierarchical" and g is not None
            and len(self.topology.nodes) > 1 else {}))
        prog = compile_program(sched, self.rank, m)
        flat = {int(b): a for b, a in bufs.items()}
        tmp_elems = prog.elems.get(int(Buf.TMP))
        if tmp_elems:
            flat[int(Buf.TMP)] = self._tmp("tmp", dt.np_dtype, tmp_elems)
        if int(Buf.OUT) not in flat and int(Buf.OUT) in prog.elems:
            flat[int(Buf.OUT)] = self._tmp("out", dt.np_dtype, prog.elems[int(Buf.OUT)])
        red = reducer(op, dt) if op is not None else None
        execute(prog, self._t, flat, red, lambda: self._current)

    def _desc(self, coll: str, *, op: ReduceOp | int = 0, buf: Buffer | None = None,
              root: int = 0, algorithm: str = "", path: int = 0) -> Desc:
        """This rank's descriptor of a call (named after the compound call it is part of)."""
        api = self._api or coll
        if buf is None:
            return agreement.make(api)
        key = (api, op, buf.dt.code, buf.shape, root, algorithm, path)
        d = self._descs.get(key)
        if d is None:
            d = agreement.make(api, op=int(op), dtype=buf.dt.code, count=buf.count, root=root,
                               algorithm=algorithm, path=path, shape=buf.shape)
            if len(self._descs) > 4096:
                self._descs.clear()
            self._descs[key] = d
        return d

    def _submit(self, desc: Desc, run: Callable[[int], Any], async_op: bool, name: str,
                xb: Buffer | None, before: Callable[[int], None] | None = None) -> Any:
        """Number the call and run it inline, or queue it behind pending async work."""
        if not isinstance(async_op, (bool, np.bool_)):
            raise ArgumentError(f"async_op must be True or False, got {async_op!r}")
        self._usable()
        with self._submit_lock:
            self._seq += 1
            seq = self._seq
            if not async_op and not self._inflight:
                # nothing queued: run here (holding the lock keeps the numbering in order)
                return self._execute(seq, desc, run, name, xb, before)
            work = Work(describe(seq, desc))
            self._inflight += 1
            self._worker().put((seq, desc, run, work, name, xb, before))
        return work if async_op else work.wait()

    def _reject(self, coll: str, note: str, exc: ArgumentError) -> None:
        """Publish an error descriptor under the next sequence number (see _collective).

        The call is numbered like any other, so the calls after it keep pairing
        with the right ones on every rank.
        """
        desc = agreement.rejected(self._api or coll)

        def publish(seq: int) -> None:
            self._t.publish(seq, agreement.packed(desc), note)
            self._pending_reject = seq

        with self._submit_lock:
            self._seq += 1
            seq = self._seq
            if self._inflight:
                self._inflight += 1
                self._worker().put((seq, desc, publish, Work(describe(seq, desc)), "", None,
                                    None))
                return
            try:
                self._execute(seq, desc, publish, "", None, None)
            except RingletError as err:  # the peers never came: the communicator is aborted
                raise err from exc

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
            seq, desc, run, work, name, xb, before = item
            try:
                res = None if desc is None else self._execute(seq, desc, run, name, xb, before)
                work._finish(res)
            except BaseException as exc:  # delivered to the waiter
                work._finish(error=exc)
            finally:
                with self._submit_lock:
                    if desc is not None:
                        self._inflight -= 1

    def _usable(self) -> None:
        if self._closed:
            raise RingletError("the communicator is closed")
        if self._broken is not None:
            raise PeerError(f"the communicator was aborted earlier: {self._broken}")

    def _check_thread(self, what: str) -> None:
        """One thread makes a communicator's calls: the first one that calls it.

        Calls of two threads would pair up differently on different ranks (nothing
        orders them), so a second thread gets an ArgumentError at once, before
        anything is numbered or published; once the first thread has ended,
        another may take over.  Use one communicator per thread (``split``).
        """
        me = threading.current_thread()
        owner = self._owner
        if owner is me:
            return
        if owner is None or not owner.is_alive():
            self._owner, self._owner_id = me, threading.get_ident()
            return
        raise ArgumentError(
            f"{what} on rank {self.rank}: this communicator's calls are made by thread "
            f"{owner.name!r}, and thread {me.name!r} called it too; calls from two threads "
            f"would pair up differently on different ranks. Make every call from one thread, "
            f"or give each thread its own communicator (comm.split(color=0) once per thread, "
            f"in the same order on every rank)")

    @property
    def _current(self) -> str:
        """The call in progress, described for messages (formatted only when needed)."""
        return "a collective" if self._cur is None else describe(*self._cur)

    def _execute(self, seq: int, desc: Desc, run: Callable[[int], Any],
                 name: str, xb: Buffer | None,
                 before: Callable[[int], None] | None = None) -> Any:
        with self._exec_lock:
            self._usable()
            self._cur = (seq, desc)
            try:
                self._settle()
                if desc.rejected:
                    return run(seq)
                if before is not None:
                    before(seq)
                self._agree(seq, desc)
                if log.isEnabledFor(logging.INFO) and desc.collective != agreement.COLL_CODE[
                        "barrier"]:
                    log.info("rank %d: %s algorithm %s%s, %d B", self.rank, self._current,
                             name or _alg_name(agreement.coll_name(desc.collective),
                                               desc.algorithm),
                             " (fused)" if desc.path else "", xb.nbytes if xb else 0)
                return run(seq)
            except (MismatchError, ArgumentError):
                raise
            except BaseException as exc:
                self._fail(exc)
                if isinstance(exc, RingletError) or not isinstance(exc, Exception):
                    raise  # KeyboardInterrupt and SystemExit reach the caller as they are
                raise PeerError(self._broken) from exc

    def _fail(self, exc: BaseException) -> None:
        """Abort the communicator on every rank after ``exc`` (this rank's own failure)."""
        if isinstance(exc, (PeerError, CommTimeoutError)) and str(exc).startswith("rank "):
            msg = str(exc)  # already names the rank it started on
        elif isinstance(exc, KeyboardInterrupt):
            msg = f"rank {self.rank} was interrupted (KeyboardInterrupt) in {self._current}"
        elif isinstance(exc, RingletError):
            msg = f"rank {self.rank} failed in {self._current}: {exc}"
        else:
            msg = f"rank {self.rank} failed in {self._current}: {type(exc).__name__}: {exc}"
        self._broken = msg
        self._t.discard_pending()
        self._t.abort(msg, timeout=isinstance(exc, CommTimeoutError))

    def _settle(self) -> None:
        """Wait until every peer has published the call this rank last rejected.

        A rank publishes call s+1 in the place call s-1 had, and the one-shot
        path writes its data there too: it may only do so once every peer has
        read call s-1, which every peer has once it has published call s.  A
        call that ran had that wait in its agreement; a rejected one has it
        here, before this rank publishes anything else.
        """
        s = self._pending_reject
        if s is None:
            return
        t = self._t
        missing = [q for q in range(self.size) if q != self.rank and t.peer_desc(q, s) is None]
        waiter = None
        while missing:
            if waiter is None:
                waiter = Waiter(t.settings, lambda: self._whereabouts(
                    f"{self._current}, waiting for the peers to reach call #{s} (which rank "
                    f"{self.rank} rejected)", missing), lambda: missing,
                    lambda: t.check(missing))
            waiter.pause()
            missing[:] = [q for q in missing if t.peer_desc(q, s) is None]
        self._pending_reject = None

    def _whereabouts(self, what: str, missing: list[int]) -> str:
        t = self._t
        where = []
        for q in missing:
            last = t.latest_desc(q)
            if last is None:
                where.append(f"rank {q} has not entered any collective")
            else:
                where.append(f"rank {q} is in {describe(last[0], Desc(*last[1]))}")
        return f"{what} ({'; '.join(where)})"

    def _agree(self, seq: int, desc: Desc) -> None:
        """Publish this rank's descriptor and compare it with every rank's."""
        t = self._t
        t.publish(seq, agreement.packed(desc))
        if self.size == 1:
            return
        got: dict[int, Desc] = {self.rank: desc}
        missing = [q for q in range(self.size) if q != self.rank]
        waiter = None
        while missing:
            for q in list(missing):
                d = t.peer_desc(q, seq)
                if d is not None:
                    got[q] = Desc(*d)
                    missing.remove(q)
            if missing:
                if waiter is None:
                    waiter = Waiter(t.settings,
                                    lambda: self._whereabouts(self._current, missing),
                                    lambda: missing, lambda: t.check(missing))
                waiter.pause()
        agreement.check(seq, got, self.rank, lambda q: t.note(q, seq), _alg_name)


def _pickled(obj: Any) -> tuple[np.ndarray, bool]:
    """(the pickle of ``obj``, True), or (why it does not pickle, as bytes, False)."""
    try:
        return np.frombuffer(pickle.dumps(obj), np.uint8), True
    except Exception as exc:  # noqa: BLE001 - every rank must hear of it
        return np.frombuffer(f"{type(exc).__name__}: {exc}".encode()[:4096], np.uint8), False


def _alg_name(coll: str, code: int) -> str:
    if code == algo_code(NATIVE):
        return NATIVE
    names = [coll] if coll in agreement.COLLECTIVES[1:9] else agreement.COLLECTIVES[1:9]
    for c in names:
        try:
            for n in _algorithms(c):
                if algo_code(n) == code:
                    return n
        except RingletError:
            pass
    return f"#{code}"


def _configure_logging(level: str) -> None:
    if any(getattr(h, "_ringlet", False) for h in log.handlers):
        return
    h = logging.StreamHandler()
    h.setFormatter(logging.Formatter("ringlet %(levelname)s %(message)s"))
    h._ringlet = True  # type: ignore[attr-defined]
    log.addHandler(h)
    log.setLevel({"WARN": logging.WARNING, "TRACE": logging.DEBUG}.get(level.upper(),
                                                                      logging.INFO))
