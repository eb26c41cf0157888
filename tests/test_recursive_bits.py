"""Every all_reduce algorithm leaves bit-identical results on every rank, even where the
ops do not commute bit for bit: MIN/MAX of +0.0 and -0.0, and NaNs with different
payloads under SUM, PROD, MIN and MAX (issue 8: recursive doubling's partners used to
compute a (op) b and b (op) a).

Pure tests check the executor's ``src_first`` kernel against numpy; the multi-process
test runs every algorithm at N = 2, 3, 4, 5, 8 and compares the results' bits.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
from conftest import get_world

import ringlet
from ringlet.executor import SrcFirst
from ringlet.ops import DTYPES, ReduceOp, reducer

OPS = [ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN, ReduceOp.MAX]
FLOATS = ["float16", "float32", "float64"]
#: 20001 float32 elements span two of SrcFirst's blocks with a remainder
COUNTS = [1, 13, 1000, 20001]
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
QUIET_NAN = {2: 0x7E00, 4: 0x7FC0_0000, 8: 0x7FF8_0000_0000_0000}
SIGN = {2: 0x8000, 4: 0x8000_0000, 8: 0x8000_0000_0000_0000}


def awkward(dtype: str, count: int, seed: int) -> np.ndarray:
    """Signed zeros, infinities, ordinary values and NaNs whose sign and payload
    depend on ``seed`` (the rank), so that ranks' NaNs differ."""
    rng = np.random.default_rng([seed, count, DTYPES[dtype].code])
    dt = np.dtype(dtype)
    u = UINT[dt.itemsize]
    x = rng.choice(np.array([0.0, -0.0, 0.0, -0.0, 1.5, -2.0, np.inf], dt), count)
    bits = x.view(u)
    nan = rng.random(count) < 0.3
    payload = rng.integers(1, 32, count).astype(u) + u(seed * 32 % 200)
    sign = (rng.random(count) < 0.5).astype(u) * u(SIGN[dt.itemsize])
    bits[nan] = (u(QUIET_NAN[dt.itemsize]) | payload | sign)[nan]
    return x


# --- the kernel, without processes --------------------------------------------------


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_src_first_is_the_swapped_call_bit_for_bit(dtype: str, op: ReduceOp) -> None:
    """SrcFirst(reduce)(b, a) leaves in b exactly what reduce(a, b) leaves in a, whatever
    the length (numpy's SIMD body, scalar tail and short-call paths differ for NaNs)."""
    red = reducer(op, DTYPES[dtype])
    first = SrcFirst(red)
    step = SrcFirst.BLOCK_BYTES // np.dtype(dtype).itemsize
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for count in (1, 2, 9, 17, 100, step - 1, step, step + 1, 2 * step + 1,
                      4 * step + 1, 5 * step + 7):
            a, b = awkward(dtype, count, 1), awkward(dtype, count, 2)
            want, got = a.copy(), b.copy()
            red(want, b)
            first(got, a)
            assert want.view(UINT[a.itemsize]).tolist() == got.view(UINT[a.itemsize]).tolist(), \
                (dtype, op, count)


def test_operand_order_matters_for_these_values() -> None:
    """The premise: these inputs tell a (op) b from b (op) a, so the test below can fail."""
    a, b = np.array([0.0, -0.0]), np.array([-0.0, 0.0])
    assert np.minimum(a, b).view(np.uint64).tolist() != np.minimum(b, a).view(np.uint64).tolist()
    x, y = awkward("float64", 1000, 1), awkward("float64", 1000, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for op in (np.add, np.multiply, np.minimum, np.maximum):
            assert op(x, y).view(np.uint64).tolist() != op(y, x).view(np.uint64).tolist(), op


# --- every all_reduce algorithm, for real -------------------------------------------


def _every_algorithm(comm: ringlet.Communicator) -> dict[tuple[str, str, str, int], Any]:
    """This rank's result bits for every algorithm, op, dtype and count, and whether the
    result is a right answer (NaN where numpy's has one, equal elsewhere)."""
    out: dict[tuple[str, str, str, int], Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for algo in ringlet.algorithms("all_reduce"):
            for dtype in FLOATS:
                for op in OPS:
                    for count in COUNTS:
                        x = awkward(dtype, count, comm.rank)
                        comm.all_reduce(x, op=op.name.lower(), algorithm=algo)
                        stack = np.array([awkward(dtype, count, q) for q in range(comm.size)])
                        ref = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply,
                               ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum}[op].reduce(
                                   stack, axis=0)
                        right = bool(np.array_equal(np.isnan(x), np.isnan(ref))
                                     and np.array_equal(x[~np.isnan(x)], ref[~np.isnan(ref)]))
                        out[(algo, dtype, op.name, count)] = (
                            x.view(UINT[x.itemsize]).tobytes(), right)
    return out


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_every_all_reduce_is_bit_identical_on_every_rank(n: int) -> None:
    res = get_world(n).run(_every_algorithm)
    wrong = [(r, key) for r in range(n) for key, (_, right) in res[r].items() if not right]
    assert not wrong, wrong[:5]
    differ = sorted({key for r in range(1, n) for key, (bits, _) in res[r].items()
                     if bits != res[0][key][0]})
    assert not differ, f"{len(differ)} cases differ between ranks, e.g. {differ[:5]}"
    assert {k[0] for k in res[0]} == set(ringlet.algorithms("all_reduce"))
