"""Reduction operators, supported element types and the reduce kernels.

Kernels reduce in place (``dst = dst (op) src``) with numpy ufuncs and
``out=``, so the hot loop allocates nothing.  torch's bfloat16 has no numpy
type: it travels as 16-bit integers and is reduced by torch's own kernels on
views of the same memory (torch is only imported when such a tensor is seen).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ArgumentError


class ReduceOp(enum.IntEnum):
    """The reduction operators.  Strings (``"sum"``, ``"max"``...) are accepted too."""

    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    AVG = 4
    BAND = 5
    BOR = 6
    BXOR = 7
    LAND = 8
    LOR = 9
    LXOR = 10
    MINLOC = 11
    MAXLOC = 12

    @classmethod
    def parse(cls, op: ReduceOp | str) -> ReduceOp:
        if isinstance(op, str):
            hit = _OP_NAMES.get(op)
            if hit is not None:
                return hit
            name = op.strip().upper()
            name = {"PRODUCT": "PROD", "MEAN": "AVG", "AVERAGE": "AVG"}.get(name, name)
            if name in cls.__members__:
                if len(_OP_NAMES) < 256:   # "SUM", " Sum "...: the next call's a lookup
                    _OP_NAMES[op] = cls[name]
                return cls[name]
        elif isinstance(op, ReduceOp):
            return op
        foreign = _foreign_op(op)
        if foreign is not None:
            return foreign
        raise ArgumentError(
            f"unknown reduction op {op!r}; use one of "
            f"{', '.join(m.lower() for m in cls.__members__)} or ringlet.ReduceOp")


_OP_NAMES: dict[str, ReduceOp] = {}
_TORCH_NAMES = {"SUM": "SUM", "PRODUCT": "PROD", "MIN": "MIN", "MAX": "MAX", "AVG": "AVG",
                "BAND": "BAND", "BOR": "BOR", "BXOR": "BXOR"}


def _foreign_op(op: object) -> ReduceOp | None:
    """torch.distributed's ``ReduceOp.SUM``... and mpi4py's ``MPI.SUM``..., when they are
    what the caller passed (neither library is imported here)."""
    module = type(op).__module__ or ""
    if module.startswith("torch"):
        op = getattr(op, "op", op)   # a ReduceOp object (dist.ReduceOp(...)): its RedOpType
        name = _TORCH_NAMES.get(str(getattr(op, "name", "")))
        return ReduceOp[name] if name else None
    if module.startswith("mpi4py"):
        import sys

        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is None:
            return None
        for name in ("SUM", "PROD", "MIN", "MAX", "BAND", "BOR", "BXOR", "LAND", "LOR",
                     "LXOR", "MINLOC", "MAXLOC"):
            if op == getattr(mpi, name, None):
                return ReduceOp[name]
    return None


@dataclass(frozen=True)
class DType:
    """An element type ringlet moves: its numpy storage type and its identity."""

    name: str          # "float32", "bfloat16", ...
    code: int          # stable number, compared across ranks
    np_dtype: np.dtype[Any]  # storage; bfloat16 is stored as int16

    @property
    def itemsize(self) -> int:
        return int(self.np_dtype.itemsize)

    @property
    def is_float(self) -> bool:
        return self.name == "bfloat16" or self.np_dtype.kind in "fc"

    @property
    def is_complex(self) -> bool:
        return self.np_dtype.kind == "c"


_NUMPY_NAMES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                "uint64", "float16", "float32", "float64", "complex64", "complex128"]
DTYPES: dict[str, DType] = {
    name: DType(name, i, np.dtype(name)) for i, name in enumerate(_NUMPY_NAMES)}
DTYPES["bfloat16"] = DType("bfloat16", len(_NUMPY_NAMES), np.dtype("int16"))
DTYPE_BY_CODE = {d.code: d for d in DTYPES.values()}
_OP_NAMES.update({m.name.lower(): m for m in ReduceOp})


_BY_NUMPY: dict[np.dtype[Any], DType] = {d.np_dtype: d for d in DTYPES.values()
                                         if d.name != "bfloat16"}


def dtype_of_numpy(dt: np.dtype[Any]) -> DType:
    d = _BY_NUMPY.get(dt)
    if d is not None:
        return d
    if dt.names is not None:
        return _pair_dtype(dt)
    d = DTYPES.get(dt.name) if dt.isnative or dt.itemsize == 1 else None
    if d is None:
        raise ArgumentError(
            f"dtype {dt} is not supported; use one of {', '.join(DTYPES)} "
            f"(native byte order)")
    return d


#: (value, index) pairs for MINLOC and MAXLOC: numpy structured types of two fields
_PAIRS: dict[np.dtype[Any], DType] = {}
#: the first code of the pair types (after the plain ones)
_PAIR_BASE = 64


def _pair_dtype(dt: np.dtype[Any]) -> DType:
    """A structured type of two fields, a real value and an integer index (MPI's
    ``MPI_DOUBLE_INT`` and friends), for MINLOC and MAXLOC."""
    hit = _PAIRS.get(dt)
    if hit is not None:
        return hit
    names = dt.names or ()
    fields = [dt.fields[n][0] for n in names] if dt.fields else []
    if len(fields) != 2 or fields[0].kind not in "iuf" or fields[1].kind not in "iu" \
            or not all(f.isnative or f.itemsize == 1 for f in fields):
        raise ArgumentError(
            f"structured dtype {dt} is not supported: ringlet takes (value, index) pairs "
            f"only, a real value and an integer index (ringlet.pairs(values, indices) makes "
            f"them), for MINLOC and MAXLOC")
    v, i = (DTYPES[f.name] for f in fields)
    code, name = _PAIR_BASE + 16 * v.code + i.code, f"pair({v.name},{i.name})"
    ov, oi = (dt.fields[n][1] for n in names)   # type: ignore[index]
    if (ov, oi, dt.itemsize) != (0, v.itemsize, v.itemsize + i.itemsize):
        # not ringlet.pairs' packed layout (align=True pads it, as C does): the layout is
        # part of the type's code, or ranks whose layouts differ would agree on garbage
        if dt.itemsize >= 1 << 16:
            raise ArgumentError(f"structured dtype {dt} is not supported: pairs of "
                                f"{dt.itemsize} bytes (ringlet.pairs makes packed ones)")
        code += (1 + ov + (oi << 16) + (dt.itemsize << 32)) << 8
        name += f"[{dt.itemsize} bytes: value at byte {ov}, index at byte {oi}]"
    d = DType(name, code, dt)
    _PAIRS[dt] = d
    return d


def dtype_of_code(code: int) -> DType | None:
    """The type of a descriptor's or a message's dtype code (a pair type's too, which this
    process may not have met yet); None for a code no type has."""
    d = DTYPE_BY_CODE.get(code)
    if d is not None or code < _PAIR_BASE:
        return d
    base, layout = code & 0xFF, (code >> 8) - 1   # layout: see _pair_dtype (-1: packed)
    v = DTYPE_BY_CODE.get((base - _PAIR_BASE) // 16)
    i = DTYPE_BY_CODE.get((base - _PAIR_BASE) % 16)
    if v is None or i is None or base < _PAIR_BASE:
        return None
    try:
        d = _pair_dtype(np.dtype([("value", v.np_dtype), ("index", i.np_dtype)])
                        if layout < 0 else
                        np.dtype({"names": ["value", "index"],
                                  "formats": [v.np_dtype, i.np_dtype],
                                  "offsets": [layout & 0xFFFF, layout >> 16 & 0xFFFF],
                                  "itemsize": layout >> 32}))
    except (ArgumentError, ValueError):
        return None
    return d if d.code == code else None


def pairs(values: Any, indices: Any) -> np.ndarray:
    """(value, index) pairs for MINLOC and MAXLOC, as one numpy structured array with
    fields ``value`` and ``index`` (MPI's ``MPI_DOUBLE_INT`` and friends)::

        best = ringlet.pairs(local.max(keepdims=True), [comm.rank])
        comm.all_reduce(best, op="maxloc")   # best["value"], best["index"]
    """
    v, i = np.asarray(values), np.asarray(indices)
    if i.dtype.kind not in "iu":
        raise ArgumentError(f"indices must be integers, got dtype {i.dtype}")
    v, i = np.broadcast_arrays(v, i)
    out = np.empty(v.shape, [("value", v.dtype.newbyteorder("=")),
                             ("index", i.dtype.newbyteorder("="))])
    out["value"], out["index"] = v, i
    return out


def _loc(greater: bool) -> Reducer:
    """MAXLOC / MINLOC on pairs: the better value; on a tie, the lower index (as MPI)."""

    def reduce(dst: np.ndarray, src: np.ndarray) -> None:
        nv, ni = dst.dtype.names or ("", "")
        v, i, sv, si = dst[nv], dst[ni], src[nv], src[ni]
        better = np.greater(sv, v) if greater else np.less(sv, v)
        take = better | (np.equal(sv, v) & np.less(si, i))
        if take.any():
            dst[take] = src[take]

    return reduce


LOC = frozenset({ReduceOp.MINLOC, ReduceOp.MAXLOC})

_UFUNC = {ReduceOp.SUM: np.add, ReduceOp.AVG: np.add, ReduceOp.PROD: np.multiply,
          ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum, ReduceOp.BAND: np.bitwise_and,
          ReduceOp.BOR: np.bitwise_or, ReduceOp.BXOR: np.bitwise_xor,
          ReduceOp.LAND: np.logical_and, ReduceOp.LOR: np.logical_or,
          ReduceOp.LXOR: np.logical_xor}
#: the logical ops: every element is true (1) or false (0), as MPI_LAND...
LOGICAL = frozenset({ReduceOp.LAND, ReduceOp.LOR, ReduceOp.LXOR})

Reducer = Callable[[np.ndarray, np.ndarray], None]


def check_op(op: ReduceOp, dt: DType) -> None:
    """Raise ArgumentError if ``op`` is not defined on ``dt`` (before any communication)."""
    pair = dt.code >= _PAIR_BASE
    if op in LOC and not pair:
        raise ArgumentError(
            f"{op.name} reduces (value, index) pairs, not {dt.name}; make them with "
            f"ringlet.pairs(values, indices)")
    if pair and op not in LOC:
        raise ArgumentError(f"{dt.name} pairs reduce with MINLOC or MAXLOC only, not "
                            f"{op.name}")
    if op in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR) and dt.is_float:
        raise ArgumentError(
            f"bitwise op {op.name} is not defined for {dt.name}; use it on bool or integer "
            f"buffers (view the bits as an integer type if that is what you mean)")
    if op in LOGICAL and (dt.is_float or dt.is_complex or dt.name == "bfloat16"):
        raise ArgumentError(
            f"logical op {op.name} is defined for bool and integer buffers (as in MPI), not "
            f"{dt.name}; compare first (x != 0) if that is what you mean")
    if op in (ReduceOp.MIN, ReduceOp.MAX) and dt.is_complex:
        raise ArgumentError(f"{op.name} is not defined for complex dtype {dt.name}")
    if op is ReduceOp.AVG and not dt.is_float:
        raise ArgumentError(
            f"AVG is defined for floating and complex buffers, not {dt.name}; "
            f"use SUM and divide by the size yourself")


def reducer(op: ReduceOp, dt: DType) -> Reducer:
    """The in-place kernel ``dst = dst (op) src`` for this op and element type."""
    if dt.name == "bfloat16":
        return _torch_bf16_reducer(op)
    if op in LOC:
        return _loc(op is ReduceOp.MAXLOC)
    if op is ReduceOp.PROD and dt.is_complex:
        return _complex_prod
    ufunc = _UFUNC[op]

    def reduce(dst: np.ndarray, src: np.ndarray) -> None:
        ufunc(dst, src, out=dst)

    reduce.ufunc = ufunc  # type: ignore[attr-defined]  # for reduce_into's one pass
    return reduce


def reduce_into(red: Reducer, out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
    """out = a (op) b with ``red``'s op, the bits of ``out[...] = a; red(out, b)`` in one
    pass over memory where ``red`` is a plain ufunc's (two otherwise)."""
    ufunc = getattr(red, "ufunc", None)
    if ufunc is not None:
        ufunc(a, b, out=out)
    else:
        out[...] = a
        red(out, b)


def _complex_prod(dst: np.ndarray, src: np.ndarray) -> None:
    """dst *= src for complex buffers, bit-for-bit commutative.

    numpy's complex multiply may fuse a multiply and an add (FMA), which makes
    ``a * b`` and ``b * a`` differ in the last bit.  Schedules now give every
    rank the same operand order (``src_first`` steps), so this is a second line
    of defence: a product is the same whichever operand a schedule puts first.
    """
    ar, ai = dst.real.copy(), dst.imag.copy()
    br, bi = src.real, src.imag
    dst.real = ar * br - ai * bi
    dst.imag = ar * bi + ai * br


def _torch_bf16_reducer(op: ReduceOp) -> Reducer:
    import torch

    fn: Any = {ReduceOp.SUM: torch.add, ReduceOp.AVG: torch.add, ReduceOp.PROD: torch.mul,
          ReduceOp.MIN: torch.minimum, ReduceOp.MAX: torch.maximum}[op]

    def reduce(dst: np.ndarray, src: np.ndarray) -> None:
        d = torch.from_numpy(dst).view(torch.bfloat16)
        s = torch.from_numpy(np.ascontiguousarray(src)).view(torch.bfloat16)
        fn(d, s, out=d)

    return reduce


def finish(op: ReduceOp, buf: np.ndarray, dt: DType, nranks: int) -> None:
    """What a reduction's result needs after the schedule ran, in place, identically on
    every rank: AVG divides the sum; a logical op on one rank makes its input 0 or 1 (on
    more ranks every element went through the op already)."""
    if op is ReduceOp.AVG:
        finish_avg(buf, dt, nranks)
    elif op in LOGICAL and nranks == 1 and buf.size:
        np.not_equal(buf, 0, out=buf, casting="unsafe")


def finish_avg(buf: np.ndarray, dt: DType, nranks: int) -> None:
    """Turn a SUM into the AVG, in place, identically on every rank."""
    if buf.size == 0:
        return
    if dt.name == "bfloat16":
        import torch

        t = torch.from_numpy(buf).view(torch.bfloat16)
        t.div_(nranks)
    else:
        np.divide(buf, nranks, out=buf, casting="unsafe")


def reference_reduce(stack: np.ndarray, op: ReduceOp) -> np.ndarray:
    """numpy's answer for ``op`` over axis 0 of ``stack``, in stack's dtype (the test oracle)."""
    if op is ReduceOp.AVG:
        out = np.add.reduce(stack, axis=0, dtype=stack.dtype)
        return (out / stack.shape[0]).astype(stack.dtype)
    if op in LOGICAL:
        return _UFUNC[op].reduce(stack != 0, axis=0).astype(stack.dtype)
    if op in LOC:
        out = stack[0].copy()
        kernel = _loc(op is ReduceOp.MAXLOC)
        for row in stack[1:]:
            kernel(out, row)
        return out
    return _UFUNC[op].reduce(stack, axis=0, dtype=stack.dtype)
