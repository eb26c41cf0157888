"""MINLOC and MAXLOC on (value, index) pairs (ringlet.pairs): every all_reduce algorithm,
reduce and reduce_scatter against numpy's argmax/argmin (ties: the lower index), and
the errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ringlet
from ringlet.ops import ReduceOp, dtype_of_numpy, reference_reduce

PAIRS = (("float64", "int64"), ("int32", "int32"), ("float32", "int64"), ("uint8", "int16"))


def _values(q: int, count: int, vt: str) -> np.ndarray:
    return (np.arange(count) * (q + 3) % 7).astype(vt)   # many ties across ranks


def test_pairs_and_reference() -> None:
    p = ringlet.pairs([3.0, 1.0], [5, 6])
    assert p.dtype.names == ("value", "index") and p["index"].tolist() == [5, 6]
    d = dtype_of_numpy(p.dtype)
    assert d.name == "pair(float64,int64)"
    stack = np.stack([ringlet.pairs([1, 4, 2], [0, 0, 0]), ringlet.pairs([1, 2, 3], [1, 1, 1])])
    got = reference_reduce(stack, ReduceOp.MAXLOC)
    assert got["value"].tolist() == [1, 4, 3] and got["index"].tolist() == [0, 0, 1]
    got = reference_reduce(stack, ReduceOp.MINLOC)
    assert got["value"].tolist() == [1, 2, 2] and got["index"].tolist() == [0, 1, 0]
    with pytest.raises(ringlet.ArgumentError, match="integers"):
        ringlet.pairs([1.0], [0.5])
    with pytest.raises(ringlet.ArgumentError, match="pairs only"):
        dtype_of_numpy(np.dtype([("a", "f8"), ("b", "f8")]))


def _loc(comm: ringlet.Communicator) -> list[str]:
    n, r = comm.size, comm.rank
    bad = []
    for vt, it in PAIRS:
        count = 2 * n + 3
        stack = np.stack([ringlet.pairs(_values(q, count, vt), np.full(count, q, it))
                          for q in range(n)])
        for op in ("maxloc", "minloc"):
            want = reference_reduce(stack, ReduceOp.parse(op))
            for algo in ringlet.algorithms("all_reduce"):
                if algo == "hierarchical":
                    continue
                x = stack[r].copy()
                comm.all_reduce(x, op=op, algorithm=algo)
                if not np.array_equal(x, want):
                    bad.append(f"all_reduce {op} {algo} {vt}/{it}")
            got = comm.reduce(stack[r].copy(), root=n - 1, op=op)
            if r == n - 1 and not np.array_equal(got, want):
                bad.append(f"reduce {op} {vt}")
            sc = comm.reduce_scatter(np.concatenate([stack[r]] * n), op=op)
            if not np.array_equal(sc, want):
                bad.append(f"reduce_scatter {op} {vt}")
    return bad


def test_maxloc_minloc(world: Any) -> None:
    for r, bad in enumerate(world.run(_loc)):
        assert not bad, f"rank {r}: {bad[:5]}"


def _errors(comm: ringlet.Communicator) -> list[tuple[str, str]]:
    n, r = comm.size, comm.rank
    out = []
    for case in ("plain", "sum", "disagree"):
        try:
            if case == "plain":
                comm.all_reduce(np.ones(3), op="maxloc")
            elif case == "sum":
                comm.all_reduce(ringlet.pairs(np.ones(3), [0, 1, 2]), op="sum")
            else:
                vt = "float64" if r == 0 or n == 1 else "float32"
                comm.all_reduce(ringlet.pairs(np.ones(3, vt), [0, 1, 2]), op="maxloc")
        except ringlet.RingletError as exc:
            out.append((type(exc).__name__, str(exc)))
        else:
            out.append(("", ""))
        x = np.full(2, float(r))
        comm.all_reduce(x)
        assert x[0] == n * (n - 1) / 2
    return out


def test_errors(world: Any) -> None:
    for res in world.run(_errors):
        assert res[0][0] == "ArgumentError" and "ringlet.pairs" in res[0][1]
        assert res[1][0] == "ArgumentError" and "MINLOC or MAXLOC" in res[1][1]
        if world.size > 1:
            assert res[2][0] == "MismatchError" and "dtype" in res[2][1], res[2]


def _out_of_place(comm: ringlet.Communicator) -> bool:
    r, n = comm.rank, comm.size
    x = ringlet.pairs(np.array([float(r), -float(r)]), [r, r])
    keep = x.copy()
    y = np.empty_like(x)
    got = comm.all_reduce(x, op="maxloc", out=y)
    return bool(got is y and np.array_equal(x, keep) and y["index"].tolist() == [n - 1, 0]
                and y["value"].tolist() == [float(n - 1), 0.0])


def test_maxloc_out_of_place(world: Any) -> None:
    assert all(world.run(_out_of_place))


def _layouts(comm: ringlet.Communicator) -> list[str]:
    """Pairs padded as C pads them (align=True: 16 bytes, where ringlet.pairs' are 12) on
    one rank and packed on the others: the same fields and count, but not the same bytes."""
    from conftest import outcome

    r, n = comm.rank, comm.size

    def pairs(align: bool) -> np.ndarray:
        p = np.zeros(3, np.dtype([("value", "f8"), ("index", "i4")], align=align))
        p["value"], p["index"] = r, r
        return p

    out = [outcome(lambda: comm.all_reduce(pairs(r == 1), op="maxloc")),
           outcome(lambda: comm.all_gather(pairs(r == 1)))]
    # padded on every rank: one type, reduced as the packed ones are
    got = comm.all_reduce(pairs(True), op="maxloc")
    out.append("ok" if got["value"].tolist() == [n - 1] * 3 and
               got["index"].tolist() == [n - 1] * 3 else f"wrong: {got.tolist()}")
    return out


def test_pairs_of_different_layouts_are_a_mismatch() -> None:
    """A rank whose pairs were padded (align=True) and ranks whose pairs were packed agreed
    on the type (one code for both) and the count: all_gather and all_reduce ran on bytes
    of two sizes and gave garbage (and the padded rank a result no other rank had)."""
    from conftest import get_world

    for r, res in enumerate(get_world(3).run(_layouts)):
        for got in res[:2]:
            assert got.startswith(("MismatchError: ranks disagree about the dtype",
                                   "ArgumentError")), (r, got)
            assert "16 bytes: value at byte 0, index at byte 8" in got, (r, got)
        assert res[2] == "ok", (r, res)
    d = dtype_of_numpy(np.dtype([("value", "f8"), ("index", "i4")], align=True))
    from ringlet.ops import dtype_of_code

    assert d != dtype_of_numpy(ringlet.pairs([1.0], np.array([1], np.int32)).dtype)
    assert dtype_of_code(d.code) == d   # named by a process that never met the type


def _probed_pairs(comm: ringlet.Communicator) -> list[Any]:
    if comm.rank == 0:
        comm.send(ringlet.pairs(np.arange(5.0), np.arange(5, dtype=np.int32)), 1, tag=3)
        return []
    st = comm.probe(0, 3)
    got = comm.recv(st.empty(), 0, tag=3)   # np.empty(st.count, st.dtype) cannot: a name
    return [st.count, st.nbytes, st.dtype, got["index"].tolist(), got["value"].tolist()]


def test_a_probed_message_of_pairs_counts_pairs() -> None:
    """Status.count of a message of pairs is its number of pairs (it was its bytes: a
    receive sized by it was 12 times too large, as mpi4py's Get_count never is)."""
    from conftest import get_world

    assert get_world(2).run(_probed_pairs)[1] == [5, 60, "pair(float64,int32)", list(range(5)),
                                                  [float(v) for v in range(5)]]


def _probed_into_empty(comm: ringlet.Communicator) -> list[Any]:
    import torch

    if comm.rank == 0:
        comm.send(np.arange(6, dtype=np.int16), 1, tag=1)
        comm.send(torch.arange(4, dtype=torch.bfloat16), 1, tag=2)
        return []
    out = []
    for tag in (1, 2):
        st = comm.probe(0, tag)
        buf = st.empty()
        got = comm.recv(buf, 0, tag=tag)
        out.append([type(got).__name__, str(got.dtype), got.tolist()])
    return out


def test_a_probed_message_is_received_into_status_empty() -> None:
    # Status.empty(): the buffer a receive of the probed message takes, whatever its type
    pytest.importorskip("torch")
    from conftest import get_world

    assert get_world(2).run(_probed_into_empty)[1] == [
        ["ndarray", "int16", list(range(6))],
        ["Tensor", "torch.bfloat16", [0.0, 1.0, 2.0, 3.0]]]
