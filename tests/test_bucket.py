"""all_reduce_coalesced and Bucketer: many arrays in few collectives, results in place."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import get_world

import ringlet

SIZES = [1, 2, 3, 5, 8]


def _arrays(r: int, seed: int = 0) -> list[Any]:
    g = np.random.default_rng(seed)
    shapes = [(g.integers(1, 50),) for _ in range(20)] + [(3, 4), (0,), (2, 2, 2)]
    dtypes = [np.float32, np.float64, np.int64, np.float32]
    return [np.full(s, r + 1 + i % 7, dtypes[i % len(dtypes)]) for i, s in enumerate(shapes)]


def _want(n: int, seed: int = 0) -> list[np.ndarray]:
    per = [_arrays(q, seed) for q in range(n)]
    return [sum(p[i] for p in per) for i in range(len(per[0]))]


def _coalesced(c: ringlet.Communicator, how: str) -> list[Any]:
    a = _arrays(c.rank)
    if how == "sync":
        out = c.all_reduce_coalesced(a)
        assert out is not None and all(x is y for x, y in zip(out, a, strict=True))
    elif how == "async":
        w = c.all_reduce_coalesced(a, async_op=True)
        c.barrier()    # other calls while it runs, in order
        assert w.wait() is not None
    else:
        b = ringlet.Bucketer(c, cap_bytes=256)
        for x in a:
            b.add(x)
        b.wait()
        assert b.buckets > 1
    return [x.tolist() for x in a]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("how", ["sync", "async", "bucketer"])
def test_every_array_gets_the_sum(n: int, how: str) -> None:
    want = [w.tolist() for w in _want(n)]
    for r, got in enumerate(get_world(n).run(_coalesced, how)):
        assert got == want, f"rank {r} ({how})"


def _torch_and_max(c: ringlet.Communicator) -> list[Any]:
    import torch

    t = [torch.full((5,), float(c.rank)), torch.arange(6, dtype=torch.int32) * c.rank]
    c.all_reduce_coalesced(t, op="max")
    return [x.tolist() for x in t]


def test_torch_tensors_and_another_op() -> None:
    pytest.importorskip("torch")
    n = 3
    for got in get_world(n).run(_torch_and_max):
        assert got == [[2.0] * 5, [2 * i for i in range(6)]]


def _bad(c: ringlet.Communicator) -> str:
    out = []
    try:
        c.all_reduce_coalesced([[1, 2]])
    except ringlet.ArgumentError as exc:
        out.append(str(exc))
    ro = np.ones(2)
    ro.setflags(write=False)
    try:
        c.all_reduce_coalesced([ro])
    except ringlet.ArgumentError as exc:
        out.append(str(exc))
    try:
        ringlet.Bucketer(c, cap_bytes=0)
    except ringlet.ArgumentError as exc:
        out.append(str(exc))
    x = [np.ones(4)]
    c.all_reduce_coalesced(x)          # the communicator still works
    out.append(str(x[0].tolist()))
    return " | ".join(out)


def test_bad_arguments_are_argument_errors() -> None:
    n = 2
    for text in get_world(n).run(_bad):
        assert "item 0 is a list" in text and "read-only" in text and "cap_bytes" in text
        assert text.endswith(str([float(n)] * 4))


def _mismatch(c: ringlet.Communicator) -> str:
    try:
        c.all_reduce_coalesced([np.ones(3 + (c.rank == 0))])
    except ringlet.MismatchError as exc:
        return str(exc)
    return "no error"


def test_ranks_that_disagree_get_a_mismatch_error() -> None:
    for text in get_world(2).run(_mismatch):
        assert "disagree" in text
