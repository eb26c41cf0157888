"""User buffers: numpy arrays and torch CPU tensors, seen as flat numpy views.

Nothing below the communicator knows about user types: it gets a 1-D numpy
view of the same memory (torch's bfloat16 as int16 bits).  torch is imported
only when a tensor is actually passed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ArgumentError
from .ops import DTYPES, DType, dtype_of_numpy


@dataclass(slots=True)
class Buffer:
    obj: Any             # what the user passed (or what ringlet allocated for them)
    flat: np.ndarray     # 1-D view of the same memory, storage dtype
    dt: DType
    shape: tuple[int, ...]
    torch: bool

    @property
    def count(self) -> int:
        return int(self.flat.size)

    @property
    def nbytes(self) -> int:
        return int(self.flat.nbytes)


def _is_tensor(x: Any) -> bool:
    return type(x).__module__.split(".")[0] == "torch"


def refuse_subclass(x: np.ndarray, name: str) -> None:
    """An ArgumentError if ``x`` is a subclass of numpy.ndarray (but a memmap): np.matrix
    stays 2-D when flattened, a masked array's mask would be ignored: subclasses change
    what an array means, so only the plain kind is taken."""
    if type(x) is not np.ndarray and not isinstance(x, np.memmap):
        raise ArgumentError(
            f"{name} is a {type(x).__module__}.{type(x).__name__}, a subclass of "
            f"numpy.ndarray that ringlet does not take; pass np.asarray() of it (or "
            f".filled() for a masked array)")


def as_buffer(x: Any, name: str, *, writable: bool, has_out: bool = True) -> Buffer:
    """Validate ``x`` and view it flat.  Raises ArgumentError before anything is sent.
    ``has_out``: the call takes an ``out=`` (a read-only ``x`` is told to give one)."""
    if type(x) is np.ndarray:   # the common case, checked first and cheaply
        flags = x.flags
        if flags.c_contiguous and (flags.writeable or not writable):
            return Buffer(x, x.reshape(-1), dtype_of_numpy(x.dtype), x.shape, False)
    if isinstance(x, np.ndarray):
        refuse_subclass(x, name)
        if not x.flags.c_contiguous:
            raise ArgumentError(
                f"{name} must be C-contiguous (got strides {x.strides} for shape {x.shape}); "
                f"pass np.ascontiguousarray({name})")
        if writable and not x.flags.writeable:
            raise ArgumentError(
                f"{name} is read-only but this call writes into it; pass a writable array"
                + ("" if name == "out" or not has_out else " or give out="))
        dt = dtype_of_numpy(x.dtype)
        return Buffer(x, x.reshape(-1), dt, tuple(x.shape), False)
    if _is_tensor(x):
        import torch

        if not isinstance(x, torch.Tensor):
            raise ArgumentError(f"{name}: unsupported torch object {type(x).__name__}")
        if x.device.type != "cpu":
            raise ArgumentError(f"{name} is on {x.device}; ringlet moves CPU tensors only")
        if x.layout != torch.strided:
            raise ArgumentError(f"{name} is a {str(x.layout).removeprefix('torch.')} tensor; "
                                f"ringlet moves dense ones only: pass {name}.to_dense()")
        if not x.is_contiguous():
            raise ArgumentError(f"{name} must be contiguous; pass {name}.contiguous()")
        if x.is_conj() or x.is_neg():
            raise ArgumentError(f"{name} has a lazy conjugate/negation bit; "
                                f"pass {name}.resolve_conj().resolve_neg()")
        t = x.detach()
        if t.dtype == torch.bfloat16:
            return Buffer(x, t.view(torch.int16).numpy().reshape(-1), DTYPES["bfloat16"],
                          tuple(x.shape), True)
        try:
            arr = t.numpy()
        except TypeError as exc:
            raise ArgumentError(f"{name}: torch dtype {x.dtype} is not supported ({exc})") \
                from None
        return Buffer(x, arr.reshape(-1), dtype_of_numpy(arr.dtype), tuple(x.shape), True)
    hint = ""
    if isinstance(x, (list, tuple, int, float, complex, bool, np.generic)):
        hint = f"; pass np.asarray({name}) (a list or a scalar has no memory to fill in place)"
    raise ArgumentError(
        f"{name} must be a numpy.ndarray or a torch CPU tensor, got {type(x).__name__}{hint}")


def new_buffer(like: Buffer, shape: tuple[int, ...]) -> Buffer:
    """A fresh, uninitialised buffer of ``like``'s kind and dtype."""
    if like.torch:
        import torch

        tdt = torch.bfloat16 if like.dt.name == "bfloat16" else \
            torch.from_numpy(np.empty(0, like.dt.np_dtype)).dtype
        return as_buffer(torch.empty(shape, dtype=tdt), "out", writable=True)
    return as_buffer(np.empty(shape, like.dt.np_dtype), "out", writable=True)


def check_out(out: Buffer, like: Buffer, count: int, what: str) -> None:
    """``out`` must have ``like``'s dtype and ``count`` elements."""
    if out.dt != like.dt:
        raise ArgumentError(f"out has dtype {out.dt.name} but {what} is {like.dt.name}")
    if out.count != count:
        raise ArgumentError(
            f"out has {out.count} elements (shape {out.shape}) but {what} needs {count}")
