"""The communicator: the collectives' arguments, the algorithm, and how each runs.

Every call goes through the path of :mod:`ringlet.calls` (validate, number,
agree, run, fail on every rank); object collectives, ``split`` and ``empty``
are in :mod:`ringlet.groups`.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import logging
import os
import queue
import threading
import weakref
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import agreement, lean, rails
from .agreement import GENERIC, POST, RAILS, STAGE, Desc, shared_path
from .algorithms import algorithms as _algorithms
from .algorithms import build as _build
from .algorithms import entry as _entry
from .algorithms.hierarchical import pipeline_pieces
from .bucket import Buckets
from .buffers import Buffer, as_buffer, check_out, new_buffer
from .calls import NATIVE, _collective, _configure_logging
from .config import Settings
from .errors import ArgumentError, RingletError
from .executor import compile_program, execute
from .groups import Groups
from .ops import ReduceOp, check_op, finish, reducer
from .p2p import P2PEngine, PointToPoint
from .prefix import Prefix
from .recorder import FlightRecorder, install_signal
from .schedule import Buf
from .topology import Topology
from .transport.base import Transport
from .transport.fused import Fused, fused_path, shared_all_reduce
from .transport.shm import ShmTransport
from .uneven import Uneven
from .wait import INTERRUPTS
from .work import Work

log = logging.getLogger("ringlet")

#: the descriptor's path code of each fused path (see transport.fused.fused_path)
_PATH_CODE = {"generic": GENERIC, "post": POST, "staged": STAGE}
#: every live communicator, closed at interpreter exit so that peers see "closed", not "died"
_LIVE: weakref.WeakSet[Communicator] = weakref.WeakSet()
_get_ident = threading.get_ident
_SUM = ReduceOp.SUM   # what the compiled all_reduce takes besides "sum" (a global: 20 ns)
#: numbers communicators in the order they were made (a dump lists them so)
_MADE = itertools.count()


@atexit.register
def _close_all() -> None:
    for c in [c for c in _LIVE if c._pid == os.getpid()]:   # not a forked child's parent's
        with contextlib.suppress(Exception):   # (a call Ctrl-C interrupted: say so)
            exc = INTERRUPTS.pop(c._worker_ident, None) if c._worker_ident else None
            if exc is not None and c._inflight:
                c._fail(exc)
            else:
                c._t.mark_closed()


class Communicator(Groups, Buckets, Uneven, PointToPoint, Prefix):
    """A group of ranks that run collectives together.  Create with :func:`ringlet.init`.

    Buffers are C-contiguous numpy arrays or torch CPU tensors.  Per-rank
    example::

        comm = ringlet.init()
        x = np.full(4, comm.rank, np.float32)
        comm.all_reduce(x)          # Rank 0, 1, 2, 3: x == [6, 6, 6, 6]
    """

    def __init__(self, rank: int, size: int, transport: Transport, settings: Settings,
                 job_id: str, topology: Topology | None = None) -> None:
        self.rank, self.size = rank, size
        self.settings = settings
        self.job_id = job_id
        #: which ranks share a node, and the engine between nodes (see ringlet.topology)
        self.topology = topology or Topology.single(size)
        #: the other ranks of this rank's node (a rails call agrees with them first)
        self._node_peers = tuple(q for q in self.topology.nodes[self.topology.node]
                                 if q != rank)
        self._t = transport
        self._seq = 0
        self._exec_lock = threading.RLock()
        self._submit_lock = threading.Lock()
        self._queue: queue.Queue[Any] | None = None
        self._inflight = 0
        self._broken: str | None = None
        self._closed, self._pid = False, os.getpid()   # the process that closes it (_close_all)
        self._scratch: dict[str, np.ndarray] = {}
        self._chosen: dict[tuple[str, str | None, int], str] = {}
        self._descs: dict[tuple[Any, ...], Desc] = {}
        self._shm_digest = zlib.crc32(
            f"{settings.shm_post_bytes}:{settings.shm_stage_bytes}:{settings.shm_piece_bytes}"
            f":{settings.cma_bytes}".encode()) & 0xFFFF
        self._p2p = P2PEngine(self)
        self._cur: Sequence[Any] | None = None
        #: the compound call (split, broadcast_object...) whose parts are being called
        self._api: str | None = None
        #: during a coalesced call: the digest of its arrays' kinds, types and shapes
        self._coalesced = 0
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
        transport.calls = self._calls_state
        self._created = next(_MADE)
        #: the world ranks of this communicator's ranks (a group's are set by its parent)
        self._world_ranks = list(range(size))
        self._fr = FlightRecorder(settings.flight_records, self._world_ranks, rank,
                                  settings.trace) \
            if settings.flight_records or settings.trace else None
        if settings.dump_dir:
            install_signal(self)
        _LIVE.add(self)
        if settings.debug:
            _configure_logging(settings.debug)
        #: the compiled small all_reduce (ringlet.lean), None where it does not apply
        self._lean = lean.make(self)
        if self._fr is not None:
            self._fr.lean = self._lean

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
        xb = as_buffer(x, "x", writable=out is None or out is x)
        check_op(rop, xb.dt)
        ob = self._out(out, xb, xb.count, "x", same_is_in_place=True)
        on_rails = self._rails(rop, xb.dt)
        name = self._choose("all_reduce", algorithm, xb.nbytes, rop, xb.dt)
        path = self._path("all_reduce", name, xb.nbytes)
        if path == GENERIC and on_rails and name in rails.SCHEDULES:
            path = RAILS
        fused = self._fused
        shared = self._shared_view(xb.flat) if ob is None and path & 3 == STAGE else None
        if shared is not None:
            path = shared_path(path, *shared)

        def before(seq: int) -> None:
            if path & 3 == POST:
                fused.post(seq, xb.flat)  # type: ignore[union-attr]

        def run(seq: int) -> Any:
            dst = ob or xb
            if shared is not None and not self._staged:   # else a rank's buffer is elsewhere
                peers = [region[shared[1]:shared[1] + xb.nbytes].view(xb.flat.dtype)
                         for region in self._regions[shared[0]][2]]
                shared_all_reduce(fused, xb.flat, peers,  # type: ignore[arg-type]
                                  reducer(rop, xb.dt))
            elif xb.count and path & 3 == POST:   # the compiled path's kernel where built
                fused.oneshot_all_reduce(seq, xb.flat, dst.flat,  # type: ignore[union-attr]
                                         lean.oneshot_reducer(rop, xb.dt.name)
                                         or reducer(rop, xb.dt))
            elif xb.count and (path & 3 == STAGE or shared is not None):
                fused.direct_all_reduce(xb.flat, reducer(rop, xb.dt),  # type: ignore[union-attr]
                                        None if ob is None else ob.flat)
            else:
                if ob is not None:
                    if path == RAILS:   # the copy writes out: the other nodes agree first
                        self._agreed()  # (a mismatch leaves out= as it was, as elsewhere)
                    ob.flat[...] = xb.flat
                self._run("all_reduce", name, 0, xb.count, {Buf.OUT: dst.flat}, xb.dt, rop)
            finish(rop, dst.flat, xb.dt, self.size)
            return dst.obj if out is None else out   # out= itself, if a view of x too

        return self._submit(self._desc("all_reduce", op=rop, buf=xb, algorithm=name, path=path),
                            run, async_op, name, xb, before)

    _all_reduce = all_reduce

    def all_reduce(self, x: Any, op: ReduceOp | str = "sum", out: Any = None,  # type: ignore[no-redef]  # noqa: F811
                   algorithm: str | None = None, async_op: bool = False) -> Any:
        lean_ = self._lean   # the compiled path first, where it applies (see ringlet.lean)
        if lean_ is not None and (op is _SUM or op == "sum") and async_op is False \
                and (algorithm is None or algorithm == "oneshot") and not self._inflight \
                and self._pending_reject is None and self._api is None \
                and self._owner_id == _get_ident():
            seq = self._seq + 1
            done = lean_.all_reduce(x, seq) if out is None and algorithm is None else \
                lean_.all_reduce(x, seq, out, algorithm is not None)
            if done == lean.NOT_LEAN and type(x) is not np.ndarray:   # a torch tensor?
                done = lean.tensor_call(lean_, x, seq, out, algorithm is not None)
            if done == lean.DONE:
                self._seq = seq
                return x if out is None else out
            if done == lean.UNAPPROVED:
                lean.approve(self, lean_, x.nbytes)
        elif lean_ is not None and (spelled := lean.respelled(op, out, algorithm, async_op)):
            return self.all_reduce(x, *spelled)   # "SUM", MPI.SUM, "auto"...
        return self._all_reduce(x, op, out, algorithm, async_op)

    all_reduce.__doc__ = _all_reduce.__doc__

    @_collective
    def broadcast(self, x: Any, root: int = 0, algorithm: str | None = None,
                  async_op: bool = False) -> Any:
        """Copy the root's ``x`` into every rank's ``x`` (in place); returns ``x``."""
        root = self._root(root)
        xb = as_buffer(x, "x", writable=self.rank != root, has_out=False)
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
        xb = as_buffer(x, "x", writable=at_root and (out is None or out is x))
        check_op(rop, xb.dt)
        ob = self._out(out, xb, xb.count, "x", same_is_in_place=True) if at_root else None
        name = self._choose("reduce", algorithm, xb.nbytes, rop, xb.dt)

        def run(seq: int) -> Any:
            if at_root:
                dst = (ob or xb).flat
                src = xb.flat.copy() if ob is None else xb.flat
            else:
                dst, src = self._tmp("reduce-out", xb.dt.np_dtype, xb.count), xb.flat
            self._run("reduce", name, root, xb.count, {Buf.IN: src, Buf.OUT: dst}, xb.dt, rop)
            if not at_root:
                return None
            finish(rop, dst, xb.dt, self.size)
            return (ob or xb).obj if out is None else out

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
        name = self._choose("reduce_scatter", algorithm, xb.nbytes, rop, xb.dt)
        path = self._path("reduce_scatter", name, xb.nbytes)
        m = xb.count // self.size

        def run(seq: int) -> Any:
            if m and path & 3 == STAGE:
                self._fused.direct_reduce_scatter(  # type: ignore[union-attr]
                    xb.flat, ob.flat, reducer(rop, xb.dt))
            else:
                self._run("reduce_scatter", name, 0, m, {Buf.IN: xb.flat, Buf.OUT: ob.flat},
                          xb.dt, rop)
            finish(rop, ob.flat, xb.dt, self.size)
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

    # --- life cycle ---------------------------------------------------------------------

    def close(self) -> None:
        """Finish pending work (collectives, sends; receives still posted fail) and
        release the shared memory (idempotent)."""
        if self._closed:
            return
        if self._worker_ident == threading.get_ident():
            raise RingletError(
                "close() was called on the communicator's own worker thread (from a "
                "callback of an asynchronous call, such as a torch future's), where it "
                "would wait for itself: close the communicator from another thread")
        if self._queue is not None:
            done = Work("close")
            done._runner = self._worker_ident   # Ctrl-C in its wait stops the call in flight
            self._queue.put((0, None, None, done, "", None, None, None))
            with contextlib.suppress(RingletError):
                done.wait()
            self._queue.put(None)
        self._p2p.close_pending()
        self._closed = True
        self._lean = None   # before the shared memory it points into goes
        _LIVE.discard(self)
        if self._fr is not None:
            self._fr.close()   # its trace written: a forked rank ends without exit handlers
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

    def _blocks(self, xb: Buffer, what: str) -> tuple[int, ...]:
        if not xb.shape or xb.shape[0] % self.size:
            raise ArgumentError(
                f"{what}: x.shape[0] must be divisible by the communicator size {self.size}, "
                f"got shape {xb.shape}")
        return (xb.shape[0] // self.size, *xb.shape[1:])

    def _out(self, out: Any, like: Buffer, count: int, what: str, same_is_in_place: bool = False
             ) -> Buffer | None:
        """``out=`` checked against ``like`` (x); None where there is none.  ``out`` that is
        ``x`` itself is in place for all_reduce, reduce, scan and exscan (NCCL's
        ``sendbuff == recvbuff``); any other overlap is an ArgumentError."""
        if out is None:
            return None
        ob = as_buffer(out, "out", writable=True)
        check_out(ob, like, count, what)
        if like.count and np.shares_memory(ob.flat, like.flat):
            a, b = ob.flat, like.flat
            if same_is_in_place and a.dtype == b.dtype and a.nbytes == b.nbytes and \
                    a.__array_interface__["data"][0] == b.__array_interface__["data"][0]:
                return None
            raise ArgumentError("out overlaps x; pass a separate buffer or leave out=None")
        return ob

    def _choose(self, collective: str, algorithm: str | None, nbytes: int,
                op: ReduceOp | None = None, dt: Any = None) -> str:
        if algorithm is not None and not isinstance(algorithm, str):
            raise ArgumentError(
                f"algorithm must be a name (str) or None, got {algorithm!r}; valid: "
                f"{', '.join(_algorithms(collective))}")
        key = (collective, algorithm, nbytes)
        name = self._chosen.get(key)
        if name is None and algorithm == NATIVE:
            natives = self._t.caps.native
            if not natives:
                raise ArgumentError(
                    f"algorithm 'native' runs the engine's own {collective}: it needs an "
                    f"engine (MPI or torch.distributed, RINGLET_ENGINE=mpi|torch); this "
                    f"communicator has none")
            if collective not in natives:
                raise ArgumentError(
                    f"algorithm 'native': the {self._t.caps.engine} engine has no {collective} "
                    f"of its own; it runs {', '.join(sorted(natives))}")
            name = NATIVE
        if name == NATIVE and op is not None:   # the engine's reduction, as ringlet defines it
            why = self._t.native_refusal(
                collective, ReduceOp.SUM if op is ReduceOp.AVG else op, dt)
            if why is not None:
                raise ArgumentError(f"algorithm 'native': {why}")
        if name is None:
            from .algorithms.select import choose

            topo = self.topology
            name = choose(collective, self.size, nbytes, requested=algorithm,
                          setting=self.settings.algo, nodes=len(topo.nodes),
                          ranks_per_node=topo.ranks_per_node,
                          tuner=self._tuner if len(topo.nodes) == 1 else None,
                          post_fits=self._fused is None or self._fused.fits_post(nbytes))
            if len(self._chosen) > 4096:
                self._chosen.clear()
            self._chosen[key] = name
        return name

    def _path(self, collective: str, name: str, nbytes: int) -> int:
        """How this rank runs the call: generic executor, or a fused shared-memory path (in
        the descriptor with a digest of the sizes it depends on: ranks whose settings
        differ get a MismatchError, not garbage)."""
        path = _PATH_CODE[fused_path(collective, name, nbytes, fused=self._fused is not None,
                                     post_bytes=self.settings.shm_post_bytes)]
        if path == GENERIC:
            return GENERIC
        return path | self._shm_digest << 2

    def _rails(self, op: ReduceOp | None, dt: Any) -> bool:
        """Whether a two-level all_reduce of ``op`` on ``dt`` crosses nodes on the engine's
        own all_reduce (:mod:`ringlet.rails`)."""
        topo = self.topology
        return len(topo.nodes) > 1 and topo.ranks_per_node is not None and \
            self._t.caps.rails and \
            rails.wanted(self.settings.rails, self._t.caps.engine, bool(self._t.caps.native),
                         op, dt)

    def _rail_group(self, name: str, op: ReduceOp | None, dt: Any) -> bool:
        """Whether the all_reduce schedule ``name`` crosses nodes on the engine's all_reduce."""
        return name in rails.SCHEDULES and self._rails(op, dt)

    def _tmp(self, key: str, dtype: np.dtype[Any], count: int) -> np.ndarray:
        nbytes = count * dtype.itemsize
        buf = self._scratch.get(key)
        if buf is None or buf.size < nbytes:
            buf = self._scratch[key] = np.empty(max(nbytes, 64), np.uint8)
        return buf[:nbytes].view(dtype)

    def _run(self, collective: str, name: str, root: int, m: int, bufs: dict[Buf, np.ndarray],
             dt: Any, op: ReduceOp | None) -> None:
        """Run this rank's steps of ``name`` for ``collective`` over flat typed buffers."""
        if m == 0:
            return
        if name == NATIVE:
            self._t.native(collective, root, m, {int(b): a for b, a in bufs.items()},
                           ReduceOp.SUM if op is ReduceOp.AVG else op, lambda: self._current,
                           dt)
            return
        g = self.topology.ranks_per_node   # the groups of a two-level schedule: the nodes
        params: dict[str, int] = {}
        if "group" in _entry(collective, name).params and g is not None \
                and len(self.topology.nodes) > 1:
            params["group"] = g
            if name == "hierarchical_pipelined":   # its pieces overlap the two levels
                params["pieces"] = pipeline_pieces(m * dt.itemsize, g)
        sched = _build(collective, name, self.size, root, **params)
        if collective == "all_reduce" and op is not None and g is not None \
                and self._rail_group(name, op, dt):
            rails.run(sched, self.rank, m, g, self._t, lambda: self._t.rail(g),
                      bufs[Buf.OUT], reducer(op, dt), lambda: self._current, dt,
                      self._agreed)
            return
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
        if api.endswith("_coalesced"):   # each part carries the digest of all the arrays
            root = self._coalesced
        key = (api, op, buf.dt.code, buf.shape, root, algorithm, path)
        d = self._descs.get(key)
        if d is None:
            d = agreement.make(api, op=int(op), dtype=buf.dt.code, count=buf.count, root=root,
                               algorithm=algorithm, path=path, shape=buf.shape)
            if len(self._descs) > 4096:
                self._descs.clear()
            self._descs[key] = d
        return d
