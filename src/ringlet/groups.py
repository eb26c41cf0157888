"""Object collectives, sub-communicators and shared buffers (a mixin of
:class:`~ringlet.comm.Communicator`)."""

from __future__ import annotations

import contextlib
import operator
import os
import pickle
import secrets
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .agreement import SHARED_OFFSETS
from .calls import Calls, _collective
from .errors import ArgumentError, ConfigError, MismatchError, RingletError
from .procs import alive
from .topology import Topology
from .transport.shm import SHM_DIR, create_region, open_region

if TYPE_CHECKING:
    from .comm import Communicator


class Groups(Calls):
    """broadcast_object, all_gather_object, split, group, empty."""

    job_id: str
    _world_ranks: list[int]
    topology: Topology
    _regions: list[tuple[int, int, list[np.ndarray]]]
    _region_maps: list[Any]

    if TYPE_CHECKING:   # the collectives these are made of (ringlet.comm)
        def broadcast(self, x: Any, root: int = 0, algorithm: str | None = None,
                      async_op: bool = False) -> Any: ...
        def all_gather(self, x: Any, out: Any = None, algorithm: str | None = None,
                       async_op: bool = False) -> Any: ...
        def barrier(self, async_op: bool = False) -> Any: ...
        def gather_v(self, x: Any, root: int = 0, counts: Any = None, out: Any = None,
                     algorithm: str | None = None, async_op: bool = False) -> Any: ...
        def scatter_v(self, x: Any = None, counts: Any = None, root: int = 0, out: Any = None,
                      algorithm: str | None = None, async_op: bool = False) -> Any: ...
        def send(self, x: Any, dst: int, tag: int = 0) -> None: ...
        def recv(self, x: Any, src: int = -1, tag: int = 0) -> Any: ...
        def irecv(self, x: Any, src: int = -1, tag: int = 0) -> Any: ...

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
        buf = data if self.rank == root else self._between(lambda: np.empty(size, np.uint8))
        self.broadcast(buf, root)
        if n[0] < 0:  # the root could not pickle its object: buf holds why, on every rank
            raise ArgumentError(f"rank {root} could not pickle its object "
                                f"({buf.tobytes().decode(errors='replace')})")
        return self._unpickled(lambda: obj if self.rank == root else
                               pickle.loads(buf.tobytes()))

    @_collective
    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order, on every rank (pickled; trusted peers only)."""
        data, ok = _pickled(obj)
        sizes = self.all_gather(np.array([data.size if ok else -1 - data.size],
                                         np.int64)).reshape(-1)
        lengths = np.where(sizes < 0, -1 - sizes, sizes)
        padded = self._between(lambda: np.zeros(int(lengths.max()), np.uint8))
        padded[:data.size] = data
        allb = self.all_gather(padded)
        if (sizes < 0).any():  # every rank learns every reason
            why = "; ".join(f"rank {q}: " + allb[q, :int(lengths[q])].tobytes().decode(
                errors="replace") for q in np.flatnonzero(sizes < 0))
            raise ArgumentError(f"objects that could not be pickled ({why})")
        return self._unpickled(lambda: [pickle.loads(allb[i, :int(sizes[i])].tobytes())
                                        for i in range(self.size)])

    @_collective
    def gather_object(self, obj: Any, root: int = 0) -> list[Any] | None:
        """Every rank's ``obj`` at the root, in rank order; None elsewhere (pickled; trusted
        peers only).  One uneven gather of the pickles (:meth:`gather_v`)."""
        root = self._root(root)
        data, ok = _pickled(obj)
        sizes = self.all_gather(np.array([data.size if ok else -1], np.int64)).reshape(-1)
        if (sizes < 0).any():   # every rank learns every reason
            why = self.all_gather_object(None if ok else data.tobytes().decode(errors="replace"))
            raise ArgumentError("objects that could not be pickled (" + "; ".join(
                f"rank {q}: {w}" for q, w in enumerate(why) if w is not None) + ")")
        got = self.gather_v(data, root, counts=sizes)
        return self._unpickled(lambda: None if got is None else [
            pickle.loads(b.tobytes()) for b in np.split(got, np.cumsum(sizes)[:-1])])

    @_collective
    def scatter_object(self, objs: Any = None, root: int = 0) -> Any:
        """Rank q gets ``objs[q]`` of the root's list (pickled; trusted peers only).  One
        uneven scatter of the pickles (:meth:`scatter_v`)."""
        root = self._root(root)
        sizes = np.zeros(self.size, np.int64)
        blob = np.empty(0, np.uint8)
        if self.rank == root:
            if objs is None or len(objs) != self.size:
                raise ArgumentError(f"the root must pass one object per rank "
                                    f"({self.size})")
            parts = [_pickled(o) for o in objs]
            bad = [q for q, (_, ok) in enumerate(parts) if not ok]
            sizes = np.array([p.size for p, _ in parts], np.int64)
            if bad:
                sizes[:] = -1
                blob = parts[bad[0]][0]
                sizes[0] = -1 - blob.size
            else:
                blob = np.concatenate([p for p, _ in parts]) if parts else blob
        self.broadcast(sizes, root)
        if sizes[0] < 0 and (sizes < 0).all():   # the root could not pickle one
            why = blob if self.rank == root else np.empty(-1 - int(sizes[0]), np.uint8)
            self.broadcast(why, root)
            raise ArgumentError(f"rank {root} could not pickle an object for scatter_object "
                                f"({why.tobytes().decode(errors='replace')})")
        out = self._between(lambda: np.empty(int(sizes[self.rank]), np.uint8))
        got = self.scatter_v(blob if self.rank == root else None,
                             sizes if self.rank == root else None, root, out=out)
        return self._unpickled(lambda: pickle.loads(got.tobytes()))

    def _unpickled(self, load: Callable[[], Any]) -> Any:
        """``load()`` (the unpickling of what an object collective received), then every
        rank learns whether every rank could: an object whose class only some ranks can
        import fails the call on every rank with an ArgumentError that names the ranks,
        not with a bare exception on those ranks alone (one more small all_gather)."""
        try:
            value, why = load(), ""
        except Exception as exc:  # noqa: BLE001 - any unpickling error, reported
            value, why = None, f"{type(exc).__name__}: {exc}"
        failed = self.all_gather(np.array([bool(why)], np.int8)).reshape(-1)
        if failed.any():
            who = ", ".join(map(str, np.flatnonzero(failed)))
            here = f"; here: {why}" if why else " (their errors say why)"
            raise ArgumentError(
                f"rank{'s' if failed.sum() > 1 else ''} {who} could not unpickle the objects "
                f"received{here}: every rank must be able to import what the objects are "
                f"made of")
        return value

    def send_object(self, obj: Any, dst: int, tag: int = 0) -> None:
        """Send a picklable ``obj`` to ``dst`` (its size, then its pickle; trusted peers
        only).  The receiver calls :meth:`recv_object` with the same tag."""
        data, ok = _pickled(obj)
        # an object that does not pickle is sent as why (its size negative), so that the
        # receiver raises too instead of waiting for it to its deadline
        self.send(np.array([data.size if ok else -1 - data.size], np.int64), dst, tag)
        self.send(data, dst, tag)
        if not ok:
            raise ArgumentError(f"send_object: the object does not pickle "
                                f"({data.tobytes().decode(errors='replace')}); rank {dst}'s "
                                f"recv_object raises too")

    def recv_object(self, src: int, tag: int = 0) -> Any:
        """The object ``src`` sent with :meth:`send_object` and this tag.  ArgumentError if
        the sender's object did not pickle or this rank cannot unpickle it."""
        n = np.empty(1, np.int64)
        w = self.irecv(n, src, tag)
        w.wait()
        # the pickle from the sender (and with the tag) the size came with: with ANY_SOURCE
        # or ANY_TAG another sender's size message may otherwise be taken as the pickle
        sender = w.source if w.source is not None else src
        data = np.empty(int(n[0]) if n[0] >= 0 else -1 - int(n[0]), np.uint8)
        self.recv(data, sender, w.tag if w.tag is not None else tag)
        if n[0] < 0:
            raise ArgumentError(f"rank {sender}'s send_object could not pickle its object "
                                f"({data.tobytes().decode(errors='replace')})")
        try:
            return pickle.loads(data.tobytes())
        except Exception as exc:
            raise ArgumentError(f"recv_object could not unpickle the object from rank "
                                f"{sender} ({type(exc).__name__}: {exc}): this rank must be "
                                f"able to import what it is made of") from exc

    # --- groups -------------------------------------------------------------------------

    @_collective
    def split(self, color: int | None, key: int = 0) -> Communicator | None:
        """Split into sub-communicators, one per ``color`` (like ``MPI_Comm_split``).

        Ranks with equal ``color`` form a group, ordered by ``(key, rank)``.
        ``color=None`` (or negative) joins no group and returns None.  Collective
        over this communicator.
        """
        # a bool is refused whether Python's or numpy's (True was colour 1, np.True_ refused)
        if color is not None and (not isinstance(color, (int, np.integer))
                                  or isinstance(color, bool)):
            raise ArgumentError(f"split: color must be an int or None, got {color!r}")
        if not isinstance(key, (int, np.integer)) or isinstance(key, bool):
            raise ArgumentError(f"split: key must be an int, got {key!r}")
        c = -1 if color is None or color < 0 else int(color)
        table = self.all_gather_object((c, int(key), secrets.token_hex(8)))
        if c < 0:
            self.barrier()
            return None
        members = sorted((k, r) for r, (cc, k, _) in enumerate(table) if cc == c)
        ranks = [r for _, r in members]
        return self._subgroup(ranks, table[ranks[0]][2])

    @_collective
    def group(self, ranks: Any) -> Communicator | None:
        """The sub-communicator of ``ranks`` (like torch's ``new_group``), numbered in
        the order given; None on the other ranks.  Every rank of this communicator
        calls it with the same list (a MismatchError on every rank otherwise)::

            sub = comm.group([0, 2, 3])     # rank 2 of comm is rank 1 of sub
        """
        try:
            items = list(ranks)
        except TypeError:
            raise ArgumentError(f"group: ranks must be a list of ranks, got {ranks!r}") from None
        try:   # whole numbers only (1.7 was rank 1, "2" rank 2); numpy's and torch's too
            if isinstance(ranks, (str, bytes)) or \
                    any(isinstance(q, (bool, np.bool_)) for q in items):
                raise TypeError
            wanted = [operator.index(q) for q in items]
        except TypeError:
            raise ArgumentError(f"group: ranks must be ints, got {ranks!r}") from None
        if not wanted:
            raise ArgumentError("group: ranks is empty")
        bad = [q for q in wanted if not 0 <= q < self.size]
        if bad:
            raise ArgumentError(f"group: ranks {bad} are out of range for {self.size} ranks")
        if len(set(wanted)) != len(wanted):
            raise ArgumentError(f"group: ranks {wanted} name a rank twice")
        table = self.all_gather_object((wanted, secrets.token_hex(8)))
        differ = [q for q, (w, _) in enumerate(table) if w != wanted]
        if differ:
            raise MismatchError(
                "ranks disagree about group's ranks: " + "; ".join(
                    f"rank {q}: {table[q][0]}" for q in range(self.size)))
        if self.rank not in wanted:
            self.barrier()
            return None
        return self._subgroup(wanted, table[wanted[0]][1])

    def _subgroup(self, ranks: list[int], token: str) -> Communicator:
        """This rank's communicator of ``ranks`` (a member's half of split and group)."""
        try:
            t = self._t.split(ranks, token)
        except ArgumentError:
            raise
        except BaseException as exc:
            # a member failed, timed out or gave up: the communicator is broken, and every
            # rank hears why (a barrier here would only wait for the ranks that left)
            self._failed(exc)
        # no rank leaves before every group has mapped its segments
        self.barrier()
        from .comm import Communicator

        me = ranks.index(self.rank)
        sub = Communicator(me, len(ranks), t, self.settings, self.job_id,
                           self.topology.sub(ranks, me))
        sub._world_ranks[:] = [self._world_ranks[q] for q in ranks]   # its flight recorder's
        sub._tuner = self._tuner   # agreed at start-up by the ranks of each node
        if sub._fr is not None:   # name (the token all its members have), and its clock
            sub._fr.ident = token  # (rank 0's of the job)
            if self._fr is not None:
                sub._fr.offset_ns = self._fr.offset_ns
        return sub

    # --- shared buffers -------------------------------------------------------------------

    @_collective
    def empty(self, shape: int | tuple[int, ...], dtype: Any = np.float32) -> Any:
        """A numpy array in shared memory, for zero-copy collectives.  Collective.

        Every rank calls it with the same shape and dtype and gets its own
        array; every peer maps it too, so an in-place ``all_reduce`` of it (or
        of a contiguous slice at the same place on every rank) with the
        ``direct`` algorithm (the automatic choice for large vectors) reads the
        peers' data where it lies instead of copying it through the staging
        area (where the ranks' buffers are not all at one place of one, every rank
        copies through it instead).  ``torch.from_numpy(a)`` shares the memory, so
        tensors work too.
        The array lives as long as the communicator (mode 0600; its file is
        unlinked as soon as every rank has mapped it)::

            g = comm.empty(1 << 24)      # every rank
            g[...] = local_gradients
            comm.all_reduce(g)           # zero-copy

        A torch dtype (``torch.bfloat16``, ``torch.float16``...) gives a torch
        tensor on the same shared memory.
        """
        torch_dt = None
        if type(dtype).__module__.split(".")[0] == "torch":
            import torch

            if not isinstance(dtype, torch.dtype):
                raise ArgumentError(f"empty: bad dtype {dtype!r}")
            torch_dt = dtype
            dtype = np.int16 if dtype == torch.bfloat16 else \
                torch.empty(0, dtype=dtype).numpy().dtype
        arr = self._empty(shape, dtype)
        if torch_dt is None:
            return arr
        import torch

        return torch.from_numpy(arr).view(torch_dt)

    def _empty(self, shape: Any, dtype: Any) -> np.ndarray:
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
            try:
                maps[self.rank] = create_region(path.format(self.rank), nbytes)
                why = ""
            except (OSError, RingletError) as exc:
                why = str(exc) if isinstance(exc, RingletError) else \
                    f"{type(exc).__name__}: {exc}"
            whys = self.all_gather_object(why)    # every file exists, or why not
            bad = [q for q, w in enumerate(whys) if w]
            if bad:
                for mm in maps:
                    if mm is not None:
                        mm.close()
                raise ConfigError(f"empty: {'ranks' if len(bad) > 1 else 'rank'} "
                                  f"{', '.join(map(str, bad))} could not make "
                                  f"{'their' if len(bad) > 1 else 'its'} shared buffer of "
                                  f"{nbytes:,} bytes (rank {bad[0]}: {whys[bad[0]]})")
            for q in range(self.size):
                if q != self.rank:
                    maps[q] = open_region(path.format(q), nbytes)
            self.barrier()                        # every rank has mapped every file
        except BaseException:
            # a peer killed after making its file cannot remove it: the survivors do
            for q, pid in enumerate(getattr(self._t, "pids", ())):
                if q != self.rank and pid and not alive(pid):
                    with contextlib.suppress(OSError):
                        os.unlink(path.format(q))
            raise
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
        """(region index, byte offset) if ``flat`` lies inside a buffer from empty() (the
        first 1,024 such buffers, offsets below ``agreement.SHARED_OFFSETS``)."""
        if not self._regions or flat.size == 0:
            return None
        addr = flat.__array_interface__["data"][0]
        for i, (lo, hi, _) in enumerate(self._regions):
            if lo <= addr and addr + flat.nbytes <= hi and i < 1024 and \
                    addr - lo < SHARED_OFFSETS:
                return i, addr - lo
        return None

def _pickled(obj: Any) -> tuple[np.ndarray, bool]:
    """(the pickle of ``obj``, True), or (why it does not pickle, as bytes, False)."""
    try:
        return np.frombuffer(pickle.dumps(obj), np.uint8), True
    except Exception as exc:  # noqa: BLE001 - every rank must hear of it
        return np.frombuffer(f"{type(exc).__name__}: {exc}".encode()[:4096], np.uint8), False
