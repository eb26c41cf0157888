"""Many small arrays in few collectives: ``all_reduce_coalesced``, ``all_gather_coalesced``
and :class:`Bucketer`.

A collective costs a fixed time (agreement, a round trip or more) plus its
bytes: a thousand 4 KiB all-reduces pay the fixed time a thousand times.
Packed into one buffer they pay it once (seed 001: "small tensors kill
bandwidth utilization"), which is what DDP's gradient buckets do.

``comm.all_reduce_coalesced(arrays)`` packs the arrays (numpy arrays or torch
CPU tensors) into one buffer per element type, all-reduces each, and writes
the results back into the arrays, in place.  :class:`Bucketer` does it
incrementally, like DDP: arrays are added as they become ready, and every
time the pending ones reach ``cap_bytes`` (25 MiB by default, DDP's
``bucket_cap_mb``) they are all-reduced asynchronously while the caller
goes on; ``wait()`` flushes the rest and waits for all.
``comm.all_gather_coalesced(arrays)`` gathers many arrays the same way
(tensor parallelism's and FSDP's many small all-gathers).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .buffers import as_buffer, refuse_subclass
from .calls import Calls, _collective, check_async
from .errors import ArgumentError, MismatchError, PeerError
from .ops import ReduceOp, check_op, dtype_of_numpy
from .work import Work

if TYPE_CHECKING:
    from .comm import Communicator

#: DDP's default bucket (``bucket_cap_mb=25``)
DEFAULT_CAP = 25 << 20


def _is_torch(a: Any) -> bool:
    return type(a).__module__.startswith("torch")


def _check_item(a: Any, what: str, writable: bool = True, op: ReduceOp | None = None) -> None:
    """A numpy array or a torch CPU tensor (a writable one where the results are written
    back into it) of an element type ringlet moves, and ``op`` reduces."""
    if not _is_torch(a) and not isinstance(a, np.ndarray):
        raise ArgumentError(f"{what} is a {type(a).__name__}; pass numpy arrays or torch "
                            f"CPU tensors")
    if isinstance(a, np.ndarray):   # as all_reduce's (a matrix failed in packing)
        refuse_subclass(a, what)
    if writable and isinstance(a, np.ndarray) and not a.flags.writeable:
        raise ArgumentError(f"{what} is read-only (the results are written back into the "
                            f"arrays)")
    if writable and _is_torch(a) and any(st == 0 and n > 1 for st, n in
                                         zip(a.stride(), a.shape, strict=True)):
        # an expanded tensor: its elements share memory, which torch refuses to write
        # into (it raised after the collective, on this rank alone, with arrays half written)
        raise ArgumentError(f"{what} is expanded (elements share memory, which cannot take "
                            f"the results); pass a clone()")
    try:
        if not _is_torch(a):
            dt = dtype_of_numpy(a.dtype)
        else:   # a tensor's type as as_buffer sees it (an empty one: nothing copied)
            dt = as_buffer(a.new_empty(0), what, writable=False).dt
        if op is not None:
            check_op(op, dt)
    except ArgumentError as exc:
        raise ArgumentError(f"{what}: {exc}") from None


def _groups(arrays: Sequence[Any]) -> list[list[int]]:
    """Indices of ``arrays`` per (kind, element type), in order of first appearance: the
    same on every rank that passes the same kinds of arrays."""
    keys: dict[tuple[bool, str], list[int]] = {}
    for i, a in enumerate(arrays):
        keys.setdefault((_is_torch(a), str(a.dtype)), []).append(i)
    return list(keys.values())


def _count(a: Any) -> int:
    return int(a.numel()) if _is_torch(a) else int(a.size)


def _pack(parts: list[Any]) -> Any:
    if _is_torch(parts[0]):
        import torch

        return torch.cat([p.reshape(-1) for p in parts])
    return np.concatenate([p.reshape(-1) for p in parts])


def _unpack(flat: Any, parts: list[Any]) -> None:
    off = 0
    for p in parts:
        n = p.numel() if _is_torch(p) else p.size
        if _is_torch(p):
            # detached: a parameter (a leaf that requires grad) takes its result as
            # all_reduce writes it, outside autograd
            p.detach().copy_(flat[off:off + n].view(p.shape))
        else:
            np.copyto(p, flat[off:off + n].reshape(p.shape))
        off += n


class Buckets(Calls):
    """all_reduce_coalesced and all_gather_coalesced (a mixin of
    :class:`~ringlet.comm.Communicator`)."""

    _coalesced: int

    if TYPE_CHECKING:
        def all_reduce(self, x: Any, op: ReduceOp | str = "sum", out: Any = None,
                       algorithm: str | None = None, async_op: bool = False) -> Any: ...

        def all_gather(self, x: Any, out: Any = None, algorithm: str | None = None,
                       async_op: bool = False) -> Any: ...

        def barrier(self, async_op: bool = False) -> Any: ...

    @_collective
    def all_reduce_coalesced(self, arrays: Sequence[Any], op: ReduceOp | str = "sum",
                             algorithm: str | None = None, async_op: bool = False) -> Any:
        """All-reduce every array of ``arrays`` in place, packed into one collective per
        element type (numpy arrays and torch tensors apart).  Every rank passes arrays
        of the same shapes and types in the same order (a disagreement is a
        MismatchError, as for ``all_reduce``; each part's descriptor names
        all_reduce_coalesced, so a part never pairs with another rank's all_reduce).
        Arrays one rank refuses (not an array, read-only) fail the call on every rank,
        as any collective's arguments do.  Returns ``arrays``, or a :class:`Work`
        with ``async_op=True`` (the arrays hold the results once it is done; with arrays
        of several element types the first type's all-reduce ends before the call
        returns, so that ranks that disagree on the types fail there, every later call
        pairing rightly)::

            grads = [np.ones(1000, np.float32) for _ in range(100)]
            comm.all_reduce_coalesced(grads)       # one all_reduce of 100,000 floats
        """
        arrays = list(arrays)
        groups, packed = self._coalesce(arrays, writable=True, op=ReduceOp.parse(op))

        def done(_: list[Any]) -> list[Any]:
            for flat, parts in zip(packed, groups, strict=True):
                _unpack(flat, parts)
            return arrays

        return self._parts("all_reduce_coalesced", len(arrays), packed,
                           lambda flat, a: self.all_reduce(flat, op=op, algorithm=algorithm,
                                                           async_op=a), done, async_op)

    @_collective
    def all_gather_coalesced(self, arrays: Sequence[Any], algorithm: str | None = None,
                             async_op: bool = False) -> Any:
        """``all_gather`` of every array of ``arrays``, packed into one collective per
        element type (numpy arrays and torch tensors apart; NCCL's grouped all-gathers,
        torch's ``all_gather_into_tensor_coalesced``).  Returns a list with, for each
        array ``a``, every rank's ``a`` as shape ``(size, *a.shape)``, or a
        :class:`Work` whose ``wait()`` returns it.  Every rank passes arrays of the same
        shapes and types in the same order: ranks that disagree, even only on how one
        element type's elements are split between the arrays, get a MismatchError
        (each part's descriptor carries a digest of every array's kind, type and
        shape)::

            w, b = np.ones((4, 3), np.float32), np.zeros(3, np.float32)
            ws, bs = comm.all_gather_coalesced([w, b])   # shapes (n, 4, 3) and (n, 3)
        """
        arrays = list(arrays)
        groups, packed = self._coalesce(arrays, writable=False)
        n = self.size

        def done(gathered: list[Any]) -> list[Any]:
            outs: dict[int, Any] = {}
            for rows, parts, idx in zip(gathered, groups, _groups(arrays), strict=True):
                off = 0
                for i, p in zip(idx, parts, strict=True):
                    c = _count(p)
                    outs[i] = rows.reshape(n, -1)[:, off:off + c].reshape(n, *p.shape)
                    off += c
            return [outs[i] for i in range(len(arrays))]

        return self._parts("all_gather_coalesced", len(arrays), packed,
                           lambda flat, a: self.all_gather(flat, algorithm=algorithm,
                                                           async_op=a), done, async_op)

    def _coalesce(self, arrays: list[Any], writable: bool, op: ReduceOp | None = None
                  ) -> tuple[list[list[Any]], list[Any]]:
        """The arrays checked (against ``op`` too), grouped by (kind, element type) and
        packed, one flat array per group; the call's digest (every array's kind, type
        and shape, in order) set for the parts' descriptors, so ranks whose arrays
        differ disagree at the first part, on every rank."""
        for i, a in enumerate(arrays):
            _check_item(a, f"item {i}", writable, op)
        groups = [[arrays[i] for i in idx] for idx in _groups(arrays)]
        self._coalesced = zlib.crc32(repr(
            [(_is_torch(a), str(a.dtype), tuple(a.shape)) for a in arrays]).encode()) \
            & 0x7FFFFFFF
        return groups, [_pack(g) for g in groups]

    def _parts(self, name: str, count: int, packed: list[Any],
               one: Callable[[Any, bool], Any], done: Callable[[list[Any]], Any],
               async_op: bool) -> Any:
        """Run ``one(flat, async_op)`` for each packed part, then ``done(their
        results)``: at once, or behind the returned Work.  No arrays is still one call
        (an agreement): a rank that passes none where its peers pass some fails with
        them, instead of its next call pairing with their parts."""
        check_async(async_op)
        if not packed:
            w = self.barrier(async_op=bool(async_op))
            if not async_op:
                return done([])
            finished = Work(f"{name} of no arrays")
            w._then(lambda x: finished._finish(None if x._error else done([]), x._error))
            return finished
        if not async_op:
            return done([one(flat, False) for flat in packed])
        finished = Work(f"{name} of {count} arrays")
        works = []
        for i, flat in enumerate(packed):
            if i == 0 and len(packed) > 1:
                # the first of several parts runs to its end before the next is numbered:
                # where the ranks disagree on how many parts there are, it fails on every
                # rank before a rank with more parts numbers one its peers never make
                w = Work(f"{name} part 1 of {len(packed)}")
                w._finish(one(flat, False))
                works.append(w)
            else:
                works.append(one(flat, True))
        left = [len(works)]

        def each(_: Work) -> None:
            left[0] -= 1
            if left[0]:
                return
            err = next((x._error for x in works if x._error is not None), None)
            result = None
            if err is None:
                try:
                    result = done([x._result for x in works])
                except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                    err = exc
            finished._finish(result, err)

        for w in works:
            w._then(each)
        return finished


class Bucketer:
    """All-reduce arrays as they come, in buckets of about ``cap_bytes`` (like DDP).

    ::

        b = ringlet.Bucketer(comm)            # 25 MiB buckets, sum
        for g in gradients_as_they_are_ready():
            b.add(g)                          # a full bucket starts its all-reduce
        b.wait()                              # the rest, then every result is in place

    Every rank must add arrays of the same shapes and types in the same order.
    ``op`` and ``algorithm`` are passed on to every all-reduce.  ``wait()`` always
    ends with one call, of the arrays pending or of none, so that ranks that added
    different arrays fail there, on every rank, rather than pair a bucket with
    another rank's next call; as a rank may then have made a call more than its
    peers, which nothing could pair again, the communicator is aborted (a
    PeerError naming the disagreement, on every rank and at every later call).
    """

    def __init__(self, comm: Communicator, cap_bytes: int = DEFAULT_CAP,
                 op: ReduceOp | str = "sum", algorithm: str | None = None) -> None:
        if not isinstance(cap_bytes, (int, np.integer)) or isinstance(cap_bytes, bool) \
                or cap_bytes < 1:   # np.int64 as int does; True is not a size
            raise ArgumentError(f"Bucketer: cap_bytes must be a positive whole number, got "
                                f"{cap_bytes!r}")
        self.comm, self.cap, self.op, self.algorithm = comm, int(cap_bytes), op, algorithm
        self._rop = ReduceOp.parse(op)
        self._pending: list[Any] = []
        self._bytes = 0
        self._works: list[Work] = []
        self.buckets = 0    # buckets started so far

    def add(self, array: Any) -> None:
        """Queue ``array``; start the bucket if it reached ``cap_bytes``.  An array that
        cannot take its result (not a numpy array or torch tensor, read-only, of an
        element type ringlet does not move or the op does not reduce) is an
        ArgumentError here, on this rank, and is not queued."""
        _check_item(array, f"Bucketer.add: array {len(self._pending)} of the bucket",
                    op=self._rop)
        self._pending.append(array)
        self._bytes += int(array.nbytes) if not _is_torch(array) else \
            array.numel() * array.element_size()
        if self._bytes >= self.cap:
            self.flush()

    def flush(self, always: bool = False) -> None:
        """Start the all-reduce of the pending arrays (if any; with ``always``, of none
        too), asynchronously.  A bucket that fails to start is not kept pending; one
        whose ranks disagree fails at :meth:`wait`, on every rank."""
        if not self._pending and not always:
            return
        pending, self._pending, self._bytes = self._pending, [], 0
        try:
            w = self.comm.all_reduce_coalesced(pending, op=self.op, algorithm=self.algorithm,
                                               async_op=True)
        except MismatchError as exc:
            # its first part (of several element types) ran at once and the ranks
            # disagree: a bucket that failed, as its peers' fails in their worker, so
            # that wait() aborts on every rank (raised here, it left this rank alone)
            w = Work(f"Bucketer bucket {self.buckets + 1}")
            w._finish(error=exc)
        self._works.append(w)
        self.buckets += bool(pending)

    def wait(self) -> None:
        """Flush (always one call, see the class), then wait for every bucket: every
        array added holds its result.  If buckets failed, every bucket is still waited
        for, then the first error raised."""
        self.flush(always=True)
        works, self._works = self._works, []
        first: BaseException | None = None
        for w in works:
            try:
                w.wait()
            except BaseException as exc:  # noqa: BLE001 - the first is raised below
                first = exc if first is None else first
        if isinstance(first, MismatchError):
            # the ranks' buckets differ, and so may their number: a rank that made one
            # more is a call ahead of its peers for good, and every later call would fail
            # to pair; the communicator is aborted instead, on every rank, saying why
            why = MismatchError(f"Bucketer: {first} (its ranks added different arrays; a "
                                f"rank may have made a bucket more, which no later call "
                                f"could pair with: the communicator is aborted)")
            self.comm._fail(why)
            raise PeerError(self.comm._broken or str(why)) from first
        if first is not None:
            raise first
