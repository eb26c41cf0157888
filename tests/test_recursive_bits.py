"""Every all_reduce algorithm leaves bit-identical results on every rank, even where the
ops do not commute bit for bit: MIN/MAX of +0.0 and -0.0, and NaNs with different
payloads under SUM, PROD, MIN and MAX (issue 8: recursive doubling's partners used to
compute a (op) b and b (op) a).

Pure tests check the executor's ``src_first`` kernel against numpy; the multi-process
test runs every algorithm at N = 2, 3, 4, 5, 8 and compares the results' bits.
"""

from __future__ import annotations

import itertools
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
COUNTS = [1, 13, 1001]
#: one vector that spans two of the channel's 256 KiB fragments
LARGE = ("float64", 40000)
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


def bits(dtype: str, count: int, seed: int) -> np.ndarray:
    """``awkward`` in ringlet's storage type: bfloat16 as int16 bits, the top half of
    float32's (signed zeros and infinities survive the cut; NaNs get a payload)."""
    if dtype != "bfloat16":
        return awkward(dtype, count, seed)
    wide = awkward("float32", count, seed).view(np.uint32)
    top = (wide >> np.uint32(16)).astype(np.uint16)
    nan = (top & 0x7F80 == 0x7F80) & (top & 0x7F != 0) | np.isnan(wide.view(np.float32))
    top[nan] = (top[nan] & 0xFFC0) | (wide[nan] & 0x3F).astype(np.uint16) | 0x40
    return top.view(np.int16)


# --- the kernel, without processes --------------------------------------------------


@pytest.mark.parametrize("dtype", [*FLOATS, "bfloat16"])
@pytest.mark.parametrize("op", OPS, ids=lambda o: o.name)
def test_src_first_is_the_swapped_call_bit_for_bit(dtype: str, op: ReduceOp) -> None:
    """SrcFirst(reduce)(b, a) leaves in b exactly what reduce(a, b) leaves in a, whatever
    the length (numpy's SIMD body, scalar tail and short-call paths, and torch's
    threads' shares, differ for signed zeros and NaNs)."""
    if dtype == "bfloat16":
        pytest.importorskip("torch")
    red = reducer(op, DTYPES[dtype])
    first = SrcFirst(red)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for count in (1, 2, 9, 17, 33, 100, 4095, 4097, 16385, 32769, 40001, 70001, 5, 1):
            a, b = bits(dtype, count, 1), bits(dtype, count, 2)
            want, got = a.copy(), b.copy()
            red(want, b)
            first(got, a)
            assert want.tobytes() == got.tobytes(), (dtype, op, count)


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


def _as_buffer(dtype: str, count: int, rank: int) -> Any:
    """Rank ``rank``'s awkward input: a numpy array, or a torch bfloat16 tensor."""
    x = bits(dtype, count, rank)
    if dtype != "bfloat16":
        return x
    import torch

    return torch.from_numpy(x).view(torch.bfloat16)


def _every_algorithm(comm: ringlet.Communicator,
                     dtypes: list[str]) -> dict[tuple[str, str, str, int], Any]:
    """This rank's result bits for every algorithm, op, dtype and count, and whether the
    result is right where order does not matter (NaN where numpy's answer has one; for
    numpy dtypes, equal elsewhere)."""
    ufunc = {ReduceOp.SUM: np.add, ReduceOp.PROD: np.multiply,
             ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum}
    out: dict[tuple[str, str, str, int], Any] = {}
    cases = [(dtype, count) for dtype in dtypes for count in COUNTS] + [LARGE]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        for algo, (dtype, count), op in itertools.product(
                ringlet.algorithms("all_reduce"), cases, OPS):
            buf = _as_buffer(dtype, count, comm.rank)
            comm.all_reduce(buf, op=op.name.lower(), algorithm=algo)
            got = bits(dtype, count, 0)   # storage of the right type, overwritten
            got[...] = buf.view(torch_int16()) if dtype == "bfloat16" else buf
            wide = [awkward("float32" if dtype == "bfloat16" else dtype, count, q)
                    for q in range(comm.size)]
            ref = ufunc[op].reduce(np.array(wide), axis=0)
            if dtype == "bfloat16":
                nan = (got.view(np.uint16) & 0x7FFF) > 0x7F80
                right = bool(np.array_equal(nan, np.isnan(ref)))
            else:
                right = bool(np.array_equal(np.isnan(got), np.isnan(ref)) and
                             np.array_equal(got[~np.isnan(got)], ref[~np.isnan(ref)]))
            out[(algo, dtype, op.name, count)] = (got.tobytes(), right)
    return out


def torch_int16() -> Any:
    import torch

    return torch.int16


def _dtypes() -> list[str]:
    try:
        import torch  # noqa: F401
    except ImportError:
        return FLOATS
    return [*FLOATS, "bfloat16"]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_every_all_reduce_is_bit_identical_on_every_rank(n: int) -> None:
    res = get_world(n).run(_every_algorithm, _dtypes())
    wrong = [(r, key) for r in range(n) for key, (_, right) in res[r].items() if not right]
    assert not wrong, wrong[:5]
    differ = sorted({key for r in range(1, n) for key, (bits, _) in res[r].items()
                     if bits != res[0][key][0]})
    assert not differ, f"{len(differ)} cases differ between ranks, e.g. {differ[:5]}"
    assert {k[0] for k in res[0]} == set(ringlet.algorithms("all_reduce"))
