"""numpy's answers for the multi-process tests: deterministic inputs, a tolerant
comparison, and one checked call of any collective with any algorithm.

Shared by tests/test_collectives.py (persistent worlds) and the MPI suite
(tests/scripts/mpi_suite.py, which puts this directory on its path).
"""

from __future__ import annotations

import functools

import numpy as np

from ringlet.comm import Communicator
from ringlet.ops import DTYPES, ReduceOp, reference_reduce


def make(dtype: str, count: int, rank: int, op: ReduceOp | None = None,
         salt: int = 0) -> np.ndarray:
    """Rank ``rank``'s deterministic input."""
    rng = np.random.default_rng([rank, count, salt, DTYPES[dtype].code])
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.integers(0, 2, count).astype(bool)
    if dt.kind in "iu":
        info = np.iinfo(dt)
        lo, hi = (max(info.min, -1000), min(info.max, 1000))
        return rng.integers(lo, hi, count, endpoint=True).astype(dt)
    if op is ReduceOp.PROD:
        x = rng.uniform(0.5, 1.5, count)
    else:
        x = rng.normal(0, 10, count)
    if dt.kind == "c":
        x = x + 1j * (rng.uniform(0.5, 1.5, count) if op is ReduceOp.PROD
                      else rng.normal(0, 10, count))
    return x.astype(dt)


@functools.lru_cache(maxsize=128)
def made(dtype: str, count: int, rank: int, op: ReduceOp | None = None,
         salt: int = 0) -> np.ndarray:
    """:func:`make`'s array, kept and read-only: :func:`run_one` makes every rank's input on
    every rank, for every algorithm in turn (most of the time of the algorithm tests on 2
    cores, before)."""
    x = make(dtype, count, rank, op, salt)
    x.flags.writeable = False
    return x


def close(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal for integers and bool, close for floating point (NaN equal to NaN)."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype == np.float16:   # sums of ~N(0, 10) terms in a different order
        return bool(np.allclose(a, b, rtol=2e-2, atol=0.5, equal_nan=True))
    if a.dtype.kind in "fc":
        tol = 1e-4 if a.dtype in (np.float32, np.complex64) else 1e-9
        return bool(np.allclose(a, b, rtol=tol, atol=tol, equal_nan=True))
    return bool(np.array_equal(a, b))


def prefix_reference(coll: str, ins: list[np.ndarray], r: int, op: ReduceOp) -> np.ndarray:
    """numpy's scan (inclusive) or exscan (rank 0 keeps its own vector) on rank r."""
    upto = r + 1 if coll == "scan" else r
    return reference_reduce(np.stack(ins[:upto]), op) if upto else ins[0]


def run_one(comm: Communicator, coll: str, name: str, dtype: str, op: ReduceOp,
            count: int, root: int) -> str | None:
    """One call of ``coll`` with algorithm ``name`` against numpy; what is wrong, or None."""
    n, r = comm.size, comm.rank
    ins = [made(dtype, count, q, op, salt=7) for q in range(n)]
    x = ins[r].copy()
    if coll == "all_reduce":
        ref = reference_reduce(np.stack(ins), op)
        got = comm.all_reduce(x, op=op, algorithm=name)
    elif coll == "broadcast":
        ref = ins[root]
        if r == root:   # the root's vector is its input: comm.broadcast takes it read-only
            x.flags.writeable = False
        got = comm.broadcast(x, root=root, algorithm=name)
    elif coll == "reduce":
        ref = reference_reduce(np.stack(ins), op)
        got = comm.reduce(x, root=root, op=op, algorithm=name)
        if r != root:
            if got is not None:
                return "non-root got a result"
            return None if np.array_equal(x, ins[r]) else "non-root input was modified"
    elif coll == "all_gather":
        ref = np.stack(ins)
        got = comm.all_gather(x, algorithm=name)
    elif coll == "gather":
        ref = np.stack(ins)
        got = comm.gather(x, root=root, algorithm=name)
        if r != root:
            return None if got is None else "non-root got a result"
    elif coll == "reduce_scatter":
        full = [made(dtype, count * n, q, op, salt=8) for q in range(n)]
        ref = reference_reduce(np.stack(full), op)[r * count:(r + 1) * count]
        got = comm.reduce_scatter(full[r], op=op, algorithm=name)
    elif coll == "all_to_all":
        full = [made(dtype, count * n, q, op, salt=9) for q in range(n)]
        ref = np.concatenate([full[q][r * count:(r + 1) * count] for q in range(n)])
        got = comm.all_to_all(full[r], algorithm=name)
    elif coll == "scatter":
        full = made(dtype, count * n, root, op, salt=10)
        ref = full[r * count:(r + 1) * count]
        got = comm.scatter(full if r == root else None, root=root,
                           out=np.empty(count, dtype), algorithm=name)
    elif coll in ("scan", "exscan"):
        ref = prefix_reference(coll, ins, r, op)
        got = getattr(comm, coll)(x, op=op, algorithm=name)
    else:
        raise AssertionError(coll)
    return None if close(np.asarray(got), ref) else f"{np.asarray(got).ravel()[:4]} != " \
                                                    f"{ref.ravel()[:4]}"
