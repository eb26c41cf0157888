"""The per-call descriptor every rank publishes, and the check that all ranks agree.

Before any data moves, each rank publishes a :class:`Desc` of its call under
the call's sequence number, and compares every rank's.  A rank that rejected
its own arguments publishes a descriptor with ``rejected=1`` (and leaves the
reason in its note), so that its peers raise a :class:`MismatchError` quoting
it instead of waiting for a call that will never come.

A descriptor is 15 machine words; the transport publishes it as a sequence
of ints (the shm transport writes it into the rank's segment, sequence
number last).
"""

from __future__ import annotations

import functools
import zlib
from array import array
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from .errors import MismatchError, RingletError, name_ranks
from .ops import ReduceOp, dtype_of_code

#: collective codes in the descriptor; the object forms and split have their own, so that
#: messages name the call the user made (``split``, not the all_gather inside it)
COLLECTIVES = ("none", "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
               "all_to_all", "scatter", "gather", "barrier", "split", "broadcast_object",
               "all_gather_object", "empty", "group", "all_to_all_v", "all_gather_v",
               "gather_v", "scatter_v", "gather_object", "scatter_object", "scan", "exscan",
               "all_reduce_coalesced", "all_gather_coalesced")
COLL_CODE = {name: i for i, name in enumerate(COLLECTIVES)}
#: the coalesced calls: their parts' root word carries a digest of all the arrays
DIGESTS = frozenset({COLL_CODE["all_reduce_coalesced"], COLL_CODE["all_gather_coalesced"]})

#: how the call runs (the ``path`` word's low two bits)
GENERIC, POST, STAGE, SHARED = 0, 1, 2, 3
#: the generic executor with the engine's own all_reduce across nodes (ringlet.rails)
RAILS = GENERIC | 1 << 2
#: up to this many dimensions travel as numbers; more as a digest
SHAPE_DIMS = 6


class Desc(NamedTuple):
    """One rank's call, as published for the agreement check (15 words)."""

    collective: int = 0    # COLL_CODE of the call (the user-facing name)
    op: int = 0            # ReduceOp value (0 where the collective has no op)
    dtype: int = 0         # DType code
    elems: int = 0         # elements of x (scatter: of the block)
    root: int = 0
    algorithm: int = 0     # algo_code(name)
    path: int = 0          # GENERIC / POST / STAGE / SHARED, with the settings digest
    rejected: int = 0      # 1: this rank rejected its own arguments (see its note)
    ndim: int = 0          # the shape of x: ndim, then the dimensions (or a digest)
    d0: int = 0
    d1: int = 0
    d2: int = 0
    d3: int = 0
    d4: int = 0
    d5: int = 0

    @property
    def shape_words(self) -> tuple[int, ...]:
        return tuple(self[8:])


#: the fields compared, in the order their disagreement is reported
COMPARED = ("collective", "op", "dtype", "elems", "root", "algorithm", "path", "shape")
#: how a field is named in messages
LABEL = {"elems": "count"}


@functools.lru_cache(maxsize=4096)
def packed(d: Desc) -> array:
    """``d`` as the machine words a transport publishes (cached: building the array from
    the record costs more than the rest of a small call's agreement)."""
    return array("q", d)


#: a zero-copy path's buffer offset must be below this (its word holds 35 bits of it)
SHARED_OFFSETS = 1 << 35


def shared_path(stage: int, region: int, offset: int) -> int:
    """The zero-copy all_reduce's path word: SHARED, the staged path's settings digest
    (``stage``'s, what the call runs on if the ranks' buffers differ: :func:`staged`), the
    buffer (of ``comm.empty``) and the byte offset in it."""
    return SHARED | (stage >> 2 & 0xFFFF) << 2 | region << 18 | offset << 28


def staged(got: Mapping[int, Desc]) -> bool:
    """True if the descriptors differ only in their paths, and those are zero-copy ones of
    different buffers or offsets, or staged ones, of one settings digest: the ranks' buffers
    are not all at one place of a ``comm.empty`` buffer, and the call runs staged on every
    rank (each copying through the stage areas, as NCCL falls back when a buffer is not
    registered on every rank)."""
    ref = next(iter(got.values()))
    paths = {d.path for d in got.values()}
    return len(paths) > 1 and all(p & 3 in (STAGE, SHARED) for p in paths) and \
        len({p >> 2 & 0xFFFF for p in paths}) == 1 and \
        all(d._replace(path=0) == ref._replace(path=0) for d in got.values())


def algo_code(name: str) -> int:
    """A stable number for an algorithm's name (compared across ranks)."""
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def shape_words(shape: Sequence[int]) -> tuple[int, ...]:
    """``(ndim, d0..d5)``; past six dimensions the last word is a digest of the rest."""
    dims = [int(d) for d in shape]
    if len(dims) > SHAPE_DIMS:
        rest = zlib.crc32(",".join(map(str, dims[SHAPE_DIMS - 1:])).encode())
        dims = dims[:SHAPE_DIMS - 1] + [rest | 1 << 40]
    return (len(shape), *dims, *[0] * (SHAPE_DIMS - len(dims)))


def make(collective: str, *, op: int = 0, dtype: int = 0, count: int = 0, root: int = 0,
         algorithm: str = "", path: int = 0, shape: Sequence[int] = ()) -> Desc:
    return Desc(COLL_CODE[collective], int(op), dtype, count, root,
                algo_code(algorithm) if algorithm else 0, path, 0, *shape_words(shape))


def rejected(collective: str) -> Desc:
    """The descriptor of a call this rank rejected."""
    return Desc(COLL_CODE.get(collective, 0), rejected=1)


def coll_name(code: int) -> str:
    return COLLECTIVES[code] if 0 <= code < len(COLLECTIVES) else f"collective {code}"


#: calls whose descriptors' count and type are not the user's arrays' (the exchange of
#: pickles or of the blocks' sizes the call makes first, which a peer may reject): their
#: messages name the call and its number only ("all_to_all_v #2", not "(13 x int64)")
UNSIZED = frozenset({"barrier", "split", "empty", "group", "broadcast_object",
                     "all_gather_object", "gather_object", "scatter_object", "all_to_all_v",
                     "all_gather_v", "gather_v", "scatter_v"})


def describe(seq: int, d: Desc) -> str:
    """``all_reduce #5 (8 x float32)``, for messages."""
    coll = coll_name(d.collective)
    if coll in UNSIZED or d.rejected or not _has_arrays(d):
        return f"{coll} #{seq}"   # (the last: no arrays, e.g. a coalesced call of none)
    dt = dtype_of_code(d.dtype)
    text = f"{coll} #{seq} ({d.elems} x {dt.name if dt else d.dtype}"
    if coll in ("broadcast", "reduce", "scatter", "gather"):
        text += f", root {d.root}"
    return text + ")"


def _shape_text(d: Desc) -> str:
    n = d.ndim
    dims = [str(x) for x in d.shape_words[1:1 + min(n, SHAPE_DIMS)]]
    if n > SHAPE_DIMS:
        dims[-1] = "..."
    return "(" + ", ".join(dims) + ("," if n == 1 else "") + ")"


def field_text(field: str, d: Desc, alg_name: Callable[[str, int], str]) -> str:
    """One field of ``d`` as a user reads it."""
    if field == "collective":
        return coll_name(d.collective)
    if field == "op":
        return ReduceOp(d.op).name if d.op in ReduceOp._value2member_map_ else str(d.op)
    if field == "dtype":
        dt = dtype_of_code(d.dtype)
        return dt.name if dt else str(d.dtype)
    if field == "algorithm":
        return alg_name(coll_name(d.collective), d.algorithm)
    if field == "shape":
        return _shape_text(d)
    if field == "root" and d.collective in DIGESTS:
        return f"{d.root:#010x}" if _has_arrays(d) else "no arrays"
    if field == "path":
        v = d.path
        kind = ("generic executor", "fused one-shot", "fused staged",
                "zero-copy (buffer from comm.empty)")[v & 3]
        if v & 3 == SHARED:
            return f"{kind}, buffer #{v >> 18 & 0x3FF} at byte {v >> 28} (shm sizes " \
                   f"#{v >> 2 & 0xFFFF})"
        if v == RAILS:
            return "generic executor, the engine's all_reduce across nodes (RINGLET_RAILS)"
        return kind if not v >> 2 else f"{kind} (shm sizes #{v >> 2})"
    return str(getattr(d, field))


def _has_arrays(d: Desc) -> bool:
    """Whether a coalesced call's descriptor is of some arrays (one of none is an
    agreement alone: no type, no count, no shape)."""
    return bool(d.elems or d.dtype or d.ndim)


def _value(field: str, d: Desc) -> object:
    return d.shape_words if field == "shape" else getattr(d, field)


def check(seq: int, got: Mapping[int, Desc], mine: int, note: Callable[[int], str],
          alg_name: Callable[[str, int], str]) -> bool:
    """Raise MismatchError unless every rank's descriptor equals rank ``mine``'s, or they
    differ only where the call falls back to the staged path (:func:`staged`: then True)."""
    ref = got[mine]
    if all(d == ref for d in got.values()):
        return False
    if staged(got):
        return True
    current = describe(seq, ref)
    rejecters = [q for q in sorted(got) if got[q].rejected]
    if rejecters:
        why = "; ".join(f"rank {q}: {note(q)}" for q in rejecters)
        raise MismatchError(
            f"{current} cannot run: {name_ranks(rejecters)} rejected the call's arguments ({why})")
    order: tuple[str, ...] = COMPARED
    if ref.collective in DIGESTS:   # the arrays' digest says more than a part's count or type
        order = ("collective", "root", *[f for f in COMPARED if f not in ("collective", "root")])
    for field in order:
        values: dict[str, list[int]] = {}
        raw = {_value(field, got[r]) for r in got}
        if len(raw) < 2:
            continue
        for r in sorted(got):
            values.setdefault(field_text(field, got[r], alg_name), []).append(r)
        detail = "; ".join(f"{name_ranks(rs)}: {v}" for v, rs in values.items())
        label = LABEL.get(field, field)
        if field == "root" and ref.collective in DIGESTS:
            label = "arrays (a digest of their kinds, element types and shapes)"
            types: dict[str, list[int]] = {}
            for r in sorted(got):
                if _has_arrays(got[r]):
                    types.setdefault(field_text("dtype", got[r], alg_name), []).append(r)
            if len(types) > 1:
                detail += "; the first part's element type: " + "; ".join(
                    f"{name_ranks(rs)}: {v}" for v, rs in types.items())
        what = f"collective #{seq}" if field == "collective" else f"{label} of {current}"
        hint = ""
        if field in ("collective", "elems", "shape", "dtype"):
            hint = (" (calls are paired by their order on each rank: if a rank skipped or "
                    "added a call, every call after it pairs with the wrong one)")
        raise MismatchError(f"ranks disagree about the {what}: {detail}{hint}")
    raise RingletError(f"descriptors of {current} differ in no known field: "  # pragma: no cover
                       f"{dict(got)}")
