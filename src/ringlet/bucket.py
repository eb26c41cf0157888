"""Many small arrays in few collectives: ``all_reduce_coalesced`` and :class:`Bucketer`.

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
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .calls import Calls, _collective
from .errors import ArgumentError
from .ops import ReduceOp
from .work import Work

if TYPE_CHECKING:
    from .comm import Communicator

#: DDP's default bucket (``bucket_cap_mb=25``)
DEFAULT_CAP = 25 << 20


def _is_torch(a: Any) -> bool:
    return type(a).__module__.startswith("torch")


def _check_item(a: Any, what: str) -> None:
    """An array the results can be written back into: a writable numpy array or a
    torch CPU tensor."""
    if not _is_torch(a) and not isinstance(a, np.ndarray):
        raise ArgumentError(f"{what} is a {type(a).__name__}; pass numpy arrays or torch "
                            f"CPU tensors")
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        raise ArgumentError(f"{what} is read-only (the results are written back into the "
                            f"arrays)")


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
    """all_reduce_coalesced (a mixin of :class:`~ringlet.comm.Communicator`)."""

    _coalesced: int

    if TYPE_CHECKING:
        def all_reduce(self, x: Any, op: ReduceOp | str = "sum", out: Any = None,
                       algorithm: str | None = None, async_op: bool = False) -> Any: ...

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
        for i, a in enumerate(arrays):
            _check_item(a, f"item {i}")
        groups = [[arrays[i] for i in idx] for idx in _groups(arrays)]
        packed = [_pack(g) for g in groups]
        # every part's descriptor carries a digest of all the parts (kinds, element types,
        # counts): ranks whose arrays differ disagree at the first part, on every rank
        self._coalesced = zlib.crc32(repr(
            [(_is_torch(f), str(f.dtype), _count(f)) for f in packed]).encode()) & 0x7FFFFFFF
        if not async_op:
            for flat, parts in zip(packed, groups, strict=True):
                self.all_reduce(flat, op=op, algorithm=algorithm)
                _unpack(flat, parts)
            return arrays
        done = Work(f"all_reduce_coalesced of {len(arrays)} arrays")
        works = []
        for i, flat in enumerate(packed):
            if i == 0 and len(packed) > 1:
                # the first of several parts runs to its end before the next is numbered:
                # where the ranks disagree on how many parts there are, it fails on every
                # rank before a rank with more parts numbers one its peers never make
                w = Work(f"all_reduce_coalesced part 1 of {len(packed)}")
                w._finish(self.all_reduce(flat, op=op, algorithm=algorithm))
                works.append(w)
            else:
                works.append(self.all_reduce(flat, op=op, algorithm=algorithm, async_op=True))
        left = [len(works)]

        def one(w: Work) -> None:
            left[0] -= 1
            if left[0]:
                return
            err = next((x._error for x in works if x._error is not None), None)
            if err is None:
                try:
                    for flat, parts in zip(packed, groups, strict=True):
                        _unpack(flat, parts)
                except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                    err = exc
            done._finish(arrays if err is None else None, err)

        if not works:
            done._finish(arrays)
        for w in works:
            w._then(one)
        return done


class Bucketer:
    """All-reduce arrays as they come, in buckets of about ``cap_bytes`` (like DDP).

    ::

        b = ringlet.Bucketer(comm)            # 25 MiB buckets, sum
        for g in gradients_as_they_are_ready():
            b.add(g)                          # a full bucket starts its all-reduce
        b.wait()                              # the rest, then every result is in place

    Every rank must add arrays of the same shapes and types in the same order.
    ``op`` and ``algorithm`` are passed on to every all-reduce.
    """

    def __init__(self, comm: Communicator, cap_bytes: int = DEFAULT_CAP,
                 op: ReduceOp | str = "sum", algorithm: str | None = None) -> None:
        if not isinstance(cap_bytes, int) or cap_bytes < 1:
            raise ArgumentError(f"Bucketer: cap_bytes must be a positive whole number, got "
                                f"{cap_bytes!r}")
        self.comm, self.cap, self.op, self.algorithm = comm, cap_bytes, op, algorithm
        self._pending: list[Any] = []
        self._bytes = 0
        self._works: list[Work] = []
        self.buckets = 0    # buckets started so far

    def add(self, array: Any) -> None:
        """Queue ``array``; start the bucket if it reached ``cap_bytes``.  An array that
        cannot take its result (not a numpy array or torch tensor, read-only) is an
        ArgumentError here, on this rank, and is not queued."""
        _check_item(array, f"Bucketer.add: array {len(self._pending)} of the bucket")
        self._pending.append(array)
        self._bytes += int(array.nbytes) if not _is_torch(array) else \
            array.numel() * array.element_size()
        if self._bytes >= self.cap:
            self.flush()

    def flush(self) -> None:
        """Start the all-reduce of the pending arrays (if any), asynchronously."""
        if not self._pending:
            return
        self._works.append(self.comm.all_reduce_coalesced(
            self._pending, op=self.op, algorithm=self.algorithm, async_op=True))
        self._pending, self._bytes = [], 0
        self.buckets += 1

    def wait(self) -> None:
        """Flush, then wait for every bucket: every array added holds its result."""
        self.flush()
        works, self._works = self._works, []
        for w in works:
            w.wait()
