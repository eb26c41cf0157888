"""Uneven collectives (all_to_all_v, all_gather_v, gather_v, scatter_v) against numpy.

Pure part: which algorithms take blocks of different sizes (checked
symbolically, round by round) and the chunk boundaries.  Multi-process part:
random, skewed and zero counts with every such algorithm, 1-D and 2-D rows,
out= and async; then bad arguments and disagreeing counts between good calls.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

import ringlet
from ringlet.algorithms import build
from ringlet.schedule import Layout
from ringlet.uneven import PREFERRED, block_bounds, uneven_algorithms, uneven_ok

DTYPES = ("float64", "float32", "int32", "uint8", "complex64", "bool")


# --- pure -------------------------------------------------------------------------------

@pytest.mark.parametrize("collective", sorted(PREFERRED))
def test_preferred_algorithms_take_uneven_blocks(collective: str) -> None:
    """Checked symbolically, round by round, for N = 1..16 and a sample up to 64."""
    for n in [*range(1, 17), 17, 31, 32, 33, 64]:
        ok = uneven_algorithms(collective, n, n - 1)
        assert ok, f"{collective} N={n}: no algorithm takes uneven blocks"
        # the fallback list always has one that works
        assert any(a in ok for a in PREFERRED[collective])


def test_bruck_all_to_all_is_refused_where_it_rotates() -> None:
    why = uneven_ok(build("all_to_all", "bruck", 5))
    assert why is not None and "another size" in why
    assert "bruck" not in uneven_algorithms("all_to_all", 8)


def test_algorithms_lists_the_uneven_forms() -> None:
    assert ringlet.algorithms("all_to_all_v") == ["direct", "naive", "pairwise"]
    assert "ring" in ringlet.algorithms("all_gather_v")
    for v, even in (("gather_v", "gather"), ("scatter_v", "scatter")):
        assert set(ringlet.algorithms(v)) <= set(ringlet.algorithms(even))
        # listed: sound at every root of every world size up to 16; binomial too (its
        # subtrees keep each block in its own rank's place, two ranges where they wrap)
        for a in ringlet.algorithms(v):
            assert all(a in uneven_algorithms(even, n, root) for n in range(1, 17)
                       for root in range(n)), (v, a)
        assert "binomial" in ringlet.algorithms(v)


@pytest.mark.parametrize("pieces", [1, 3])
def test_block_bounds(pieces: int) -> None:
    for n, m in ((1, 0), (3, 7), (4, 9), (5, 1)):
        lay = Layout(n, pieces, n)
        assert block_bounds((m,) * n, pieces).tolist() == lay.bounds(m).tolist()
    b = block_bounds((3, 0, 5), 2)
    assert b.tolist() == [0, 2, 3, 3, 3, 6, 8]


# --- multi-process ------------------------------------------------------------------------

def _matrix(n: int, kind: str, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "random":
        return rng.integers(0, 5, (n, n))
    if kind == "skewed":   # MoE: most tokens go to one expert
        s = rng.integers(0, 2, (n, n))
        s[:, seed % n] += 9
        return s
    return np.zeros((n, n), np.int64) if kind == "zero" else \
        np.where(np.eye(n, dtype=bool), 0, 2)


def _rows(src: int, dst: int, k: int, rest: tuple[int, ...], dtype: str) -> np.ndarray:
    """Rank src's rows for rank dst: values that name both."""
    base = np.arange(k * int(np.prod(rest, dtype=np.int64)), dtype=np.int64)
    v = (src * 1000 + dst * 100 + base) % 251
    a = v.astype(dtype) if dtype != "bool" else (v % 2).astype(bool)
    return a.reshape((k, *rest))


def _a2av(comm: ringlet.Communicator) -> list[str]:
    n, r = comm.size, comm.rank
    bad: list[str] = []
    for k, kind in enumerate(("random", "skewed", "zero", "offdiag")):
        S = _matrix(n, kind, 7 + k)
        for algo in [None, *uneven_algorithms("all_to_all", n)]:
            for dtype, rest in (("float64", ()), ("int32", (3,)), ("complex64", (2, 2)),
                                ("bool", ())):
                x = np.concatenate([_rows(r, j, int(S[r, j]), rest, dtype) for j in range(n)])
                want = np.concatenate([_rows(j, r, int(S[j, r]), rest, dtype)
                                       for j in range(n)])
                recv = S[:, r] if algo is None else None
                out = np.empty_like(want) if dtype == "int32" else None
                got = comm.all_to_all_v(x, S[r], recv, out=out, algorithm=algo)
                if out is not None and got is not out:
                    bad.append("out= not returned")
                if got.shape != want.shape or not np.array_equal(got, want):
                    bad.append(f"{kind} {algo} {dtype}: got {got.ravel()[:6]} want "
                               f"{want.ravel()[:6]}")
    # async, and torch-like counts (a list)
    S = _matrix(n, "random", 3)
    x = np.concatenate([_rows(r, j, int(S[r, j]), (), "float32") for j in range(n)])
    w = comm.all_to_all_v(x, S[r].tolist(), async_op=True)
    got = w.wait()
    want = np.concatenate([_rows(j, r, int(S[j, r]), (), "float32") for j in range(n)])
    if not np.array_equal(got, want):
        bad.append("async")
    return bad


def test_all_to_all_v(world: Any) -> None:
    for r, bad in enumerate(world.run(_a2av)):
        assert not bad, f"rank {r}: {bad[:5]}"


def _gathers(comm: ringlet.Communicator) -> list[str]:
    n, r = comm.size, comm.rank
    bad: list[str] = []
    for k, counts in enumerate((np.arange(n) % 3, np.zeros(n, np.int64),
                                np.r_[7, np.zeros(n - 1, np.int64)])):
        for dtype in DTYPES:
            rest = (2,) if dtype == "float32" else ()
            mine = _rows(r, 0, int(counts[r]), rest, dtype)
            every = [_rows(q, 0, int(counts[q]), rest, dtype) for q in range(n)]
            want = np.concatenate(every)
            for algo in [None, *uneven_algorithms("all_gather", n)]:
                got = comm.all_gather_v(mine, counts if k else None, algorithm=algo)
                if not np.array_equal(got, want) or got.shape != want.shape:
                    bad.append(f"all_gather_v {counts} {algo} {dtype}")
            for root in {0, n - 1}:
                for algo in [None, *uneven_algorithms("gather", n, root)]:
                    got = comm.gather_v(mine, root, algorithm=algo)
                    if r == root and (got is None or not np.array_equal(got, want)):
                        bad.append(f"gather_v root {root} {algo} {dtype}")
                    if r != root and got is not None:
                        bad.append("gather_v: a result off the root")
                for algo in [None, *uneven_algorithms("scatter", n, root)]:
                    if r == root:
                        got = comm.scatter_v(want, counts, root, algorithm=algo)
                    else:
                        got = comm.scatter_v(None, None, root, out=np.empty_like(mine),
                                             algorithm=algo)
                    if not np.array_equal(got, mine):
                        bad.append(f"scatter_v root {root} {algo} {dtype}")
    return bad


def test_all_gather_gather_scatter_v(world: Any) -> None:
    for r, bad in enumerate(world.run(_gathers)):
        assert not bad, f"rank {r}: {bad[:5]}"


def _good(comm: ringlet.Communicator) -> bool:
    n, r = comm.size, comm.rank
    S = _matrix(n, "random", 11)
    x = np.concatenate([_rows(r, j, int(S[r, j]), (), "int32") for j in range(n)])
    want = np.concatenate([_rows(j, r, int(S[j, r]), (), "int32") for j in range(n)])
    y = np.full(3, r, np.float64)
    comm.all_reduce(y)
    return bool(np.array_equal(comm.all_to_all_v(x, S[r]), want)) and \
        float(y[0]) == n * (n - 1) / 2


def _bad_then_good(comm: ringlet.Communicator, case: str) -> tuple[str, str, bool]:
    """One bad call (of kind ``case``), then a good one: (error type, message, good ok)."""
    n, r = comm.size, comm.rank
    S = np.ones((n, n), np.int64)
    x = np.zeros(n, np.float32)
    err = ("", "")
    try:
        if case == "length" and r == n - 1:
            comm.all_to_all_v(x, [1] * (n + 1))
        elif case == "negative" and r == 0:
            comm.all_to_all_v(x, [-1] + [1] * (n - 1))
        elif case == "rows" and r == 0:
            comm.all_to_all_v(np.zeros(n + 1, np.float32), S[r])
        elif case == "recv":
            recv = S[:, r].copy()
            if r == n - 1:
                recv[0] += 1
            comm.all_to_all_v(x, S[r], recv)
        elif case == "dtype":
            comm.all_to_all_v(x.astype(np.float64) if r == 0 else x, S[r])
        elif case == "pairs":   # named as pairs (they were bare numbers)
            idx = np.zeros(1, np.int32 if r == 0 else np.int64)
            comm.all_gather_v(ringlet.pairs(np.zeros(1), idx), [1] * n)
        elif case == "algorithm":
            comm.all_to_all_v(x, S[r], algorithm="bruck" if n >= 4 else "no_such")
        elif case == "out" and r == 0:
            comm.all_to_all_v(x, S[r], out=np.empty(n + 2, np.float32))
        elif case == "counts":
            c = np.ones(n, np.int64)
            if r == 0:
                c[-1] = 2
            comm.all_gather_v(np.zeros(1, np.int16), c)
        elif case == "scatter_out" and r != 0:
            comm.scatter_v(None, None, 0, out=np.empty(2, np.int8))
        elif case == "scatter_out":
            comm.scatter_v(np.zeros(n, np.int8), np.ones(n, np.int64), 0)
        else:
            comm.all_to_all_v(x, S[r])
    except ringlet.RingletError as exc:
        err = (type(exc).__name__, str(exc))
    return err[0], err[1], _good(comm)


@pytest.mark.parametrize("case", ["length", "negative", "rows", "recv", "dtype", "pairs",
                                  "algorithm", "out", "counts", "scatter_out"])
def test_errors_between_good_calls(world: Any, case: str) -> None:
    n = world.size
    assert all(world.run(_good))
    res = world.run(_bad_then_good, case)
    assert all(ok for _, _, ok in res), f"a good call after {case} failed: {res}"
    kinds = [k for k, _, _ in res]
    if n == 1 and case in ("recv", "dtype", "pairs", "counts", "scatter_out"):
        return   # one rank cannot disagree with itself
    if case == "algorithm" and n < 4:
        assert set(kinds) == {"ArgumentError"}, res
        assert "no_such" in res[0][1]
        return
    assert all(kinds), f"{case}: some rank raised nothing: {res}"
    assert set(kinds) <= {"ArgumentError", "MismatchError"}, res
    text = {"length": "one count per rank", "negative": "negative", "rows": "add up to",
            "recv": "recv_counts", "dtype": "dtype", "pairs": "rank 0: pair(float64,int32)",
            "algorithm": "different sizes",
            "out": "out has", "counts": "counts", "scatter_out": "rows"}[case]
    assert all(text in m for _, m, _ in res), res


def test_show_draws_the_schedule_an_uneven_form_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from ringlet.cli import main

    assert main(["show", "all_to_all_v", "--algo", "pairwise", "--ranks", "3"]) == 0
    out = capsys.readouterr().out
    assert "all_to_all / pairwise on N=3" in out and "all_to_all_v runs this schedule" in out
    assert main(["show", "all_to_all_v", "--algo", "bruck", "--ranks", "5"]) == 2
    assert "bruck cannot run all_to_all_v" in capsys.readouterr().err


def _every_dtype(comm: ringlet.Communicator) -> list[str]:
    """Every element type ringlet moves, numpy's and torch's bfloat16, through the uneven
    forms and the prefix reductions (sums of small integers: exact in every type)."""
    from ringlet.ops import DTYPES

    n, r = comm.size, comm.rank
    bad = []
    S = _matrix(n, "random", 5)
    for name in DTYPES:
        if name == "bfloat16":
            try:
                import torch
            except ImportError:
                continue
            def make(v: np.ndarray) -> Any:
                return torch.from_numpy(v.astype(np.float32)).to(torch.bfloat16)
            def back(t: Any) -> np.ndarray:
                return t.float().numpy()
        else:
            def make(v: np.ndarray, name: str = name) -> Any:
                return v.astype(name) if name != "bool" else (v % 2).astype(bool)
            def back(t: Any) -> np.ndarray:
                return np.asarray(t)
        rows = [np.full(int(S[r, j]), 10 * r + j) for j in range(n)]
        x = make(np.concatenate(rows) if rows else np.zeros(0))
        want = make(np.concatenate([np.full(int(S[j, r]), 10 * j + r) for j in range(n)]))
        got = comm.all_to_all_v(x, S[r])
        if not np.array_equal(back(got), back(want)):
            bad.append(f"all_to_all_v {name}")
        g = comm.all_gather_v(make(np.full(r % 3, r + 1)))
        if not np.array_equal(back(g), back(make(np.concatenate(
                [np.full(q % 3, q + 1) for q in range(n)])))):
            bad.append(f"all_gather_v {name}")
        if name not in ("bool",) and not name.startswith("complex"):
            s = make(np.full(3, r + 1))
            comm.scan(s)
            if not np.array_equal(back(s), back(make(np.full(3, (r + 1) * (r + 2) // 2)))):
                bad.append(f"scan {name}: {back(s)}")
    return bad


def test_every_dtype(world: Any) -> None:
    for r, bad in enumerate(world.run(_every_dtype)):
        assert not bad, f"rank {r}: {bad}"


def _outs(comm: ringlet.Communicator) -> list[str]:
    """out= for every uneven form: filled and returned, x left as it was."""
    n, r = comm.size, comm.rank
    bad = []
    c = np.arange(n) % 3 + 1
    mine = np.full((int(c[r]), 2), float(r))
    every = np.concatenate([np.full((int(c[q]), 2), float(q)) for q in range(n)])
    out = np.empty_like(every)
    if comm.all_gather_v(mine, out=out) is not out or not np.array_equal(out, every):
        bad.append("all_gather_v out=")
    out = np.empty_like(every) if r == 0 else None
    got = comm.gather_v(mine, 0, out=out)
    if r == 0 and (got is not out or not np.array_equal(out, every)):
        bad.append("gather_v out=")
    out2 = np.empty_like(mine)
    got = comm.scatter_v(every if r == 0 else None, c, 0, out=out2)
    if got is not out2 or not np.array_equal(out2, mine):
        bad.append("scatter_v out= at every rank")
    if not np.array_equal(mine, np.full((int(c[r]), 2), float(r))):
        bad.append("x changed")
    return bad


def test_out_for_every_uneven_form(world: Any) -> None:
    for r, bad in enumerate(world.run(_outs)):
        assert not bad, f"rank {r}: {bad}"


def _roots_disagree(comm: ringlet.Communicator) -> list[tuple[str, str, bool]]:
    n, r = comm.size, comm.rank
    root = 0 if r != n - 1 else n - 2
    calls = (lambda: comm.gather_v(np.ones(1), root),
             lambda: comm.scatter_v(np.ones(n) if r == root else None,
                                    [1] * n if r == root else None, root,
                                    out=None if r == root else np.empty(1)))
    out = []
    for call in calls:
        err = ("", "")
        try:
            call()
        except ringlet.RingletError as exc:
            err = (type(exc).__name__, str(exc))
        out.append((err[0], err[1], _good(comm)))
    return out


def test_ranks_that_disagree_on_the_root() -> None:
    """gather_v and scatter_v: a rank naming another root is a MismatchError on every rank
    (before any data moves), and the calls after it pair up."""
    from conftest import get_world

    for n in (3, 4):
        for per_rank in get_world(n).run(_roots_disagree):
            for kind, msg, ok in per_rank:
                assert ok and kind == "MismatchError" and "disagree on the root" in msg, msg


def _local_failures(comm: ringlet.Communicator, case: str) -> tuple[str, str, bool]:
    """Errors of one rank only after a v call's exchange of counts (a bad async_op, its
    result's allocation failing): that rank skipped the data part its peers ran, and
    every later call paired with the wrong one."""
    n, r = comm.size, comm.rank
    err = ("", "")
    try:
        if case == "async":
            comm.all_gather_v(np.ones(r + 1), async_op=1 if r == 1 else False)
        elif case == "memory":
            if r == 0:
                import ringlet.uneven as uneven

                def no_memory(*args: Any) -> Any:
                    raise MemoryError("no room for the result")

                real, uneven.new_buffer = uneven.new_buffer, no_memory
            try:
                comm.all_to_all_v(np.ones(n), [1] * n)
            finally:
                if r == 0:
                    uneven.new_buffer = real
        elif case == "wrap":   # 2 * (2**63 - 1) + 2 wraps to 0 in int64: x's 0 rows
            comm.all_to_all_v(np.ones((0, 2)) if r == 0 else np.ones((n, 2)),
                              [2 ** 63 - 1, 2 ** 63 - 1] + [2] * (n - 2) if r == 0 else
                              [1] * n)
        elif case in ("object", "scatter_object"):
            if r == 1:
                import ringlet.groups as groups

                real_np = groups.np

                class Tight:
                    def __getattr__(self, a: str) -> Any:
                        if a == "empty":
                            def empty(size: Any, *args: Any, **kw: Any) -> Any:
                                if size:   # the pickle's buffer, its size just heard
                                    raise MemoryError("no room for the pickle")
                                return real_np.empty(size, *args, **kw)
                            return empty
                        return getattr(real_np, a)

                groups.np = Tight()   # type: ignore[assignment]
            try:
                if case == "object":
                    comm.broadcast_object({"big": "object"}, 0)
                else:
                    comm.scatter_object([{"big": q} for q in range(n)] if r == 0 else None)
            finally:
                if r == 1:
                    groups.np = real_np
    except (ringlet.RingletError, MemoryError) as exc:
        err = (type(exc).__name__, str(exc))
    return err[0], err[1], _good(comm)


@pytest.mark.parametrize("case", ["async", "memory", "wrap", "object", "scatter_object"])
def test_a_rank_that_fails_alone_after_the_exchange_fails_every_rank(case: str) -> None:
    from conftest import get_world

    res = get_world(3).run(_local_failures, case)
    assert all(ok for _, _, ok in res), f"a good call after {case} failed: {res}"
    kinds = [k for k, _, _ in res]
    assert all(kinds), res
    want = {"async": ("async_op must be True or False", "ArgumentError"),
            "memory": ("no room for the result", "MemoryError"),
            "wrap": ("at most 2**62", "ArgumentError"),
            "object": ("no room for the pickle", "MemoryError"),
            "scatter_object": ("no room for the pickle", "MemoryError")}[case]
    failing = {"async": 1, "memory": 0, "wrap": 0, "object": 1, "scatter_object": 1}[case]
    for r, (kind, text, _) in enumerate(res):
        assert want[0] in text, res
        assert kind == (want[1] if r == failing else "MismatchError"), res


def _blamed(comm: ringlet.Communicator) -> tuple[str, str]:
    """Counts that disagree with the rows: the rank that gave them is told it is its
    argument (an ArgumentError), the others why they cannot run (it was a MismatchError
    on that rank too)."""
    n, r = comm.size, comm.rank
    c = np.ones(n, np.int64)
    if r == 0:
        c[-1] = 2
    try:
        comm.all_gather_v(np.zeros(1, np.int16), c)
    except ringlet.RingletError as exc:
        return type(exc).__name__, str(exc)
    return "", ""


def test_counts_that_disagree_blame_the_rank_that_gave_them() -> None:
    from conftest import get_world

    res = get_world(3).run(_blamed)
    assert res[0] == ("ArgumentError", "all_gather_v on rank 0: counts[2] is 2 rows, it has 1")
    assert all(k == "MismatchError" and "rank 0: counts[2] is 2 rows" in m
               for k, m in res[1:]), res


def _rejected(comm: ringlet.Communicator) -> tuple[str, str]:
    """Rank 1's send_counts do not add up: it rejects the call before its header goes."""
    x = np.arange(comm.size, dtype=np.float32)
    counts = [1] * comm.size
    if comm.rank == 1:
        counts[0] = 2
    try:
        comm.all_to_all_v(x, counts)
    except ringlet.RingletError as exc:
        return type(exc).__name__, str(exc)
    return "", ""


def test_a_rejected_call_is_named_as_the_user_made_it() -> None:
    """The peers' message names the call and its number, not the size of the header of
    block sizes exchanged first ("all_to_all_v #2 (13 x int64) cannot run")."""
    from conftest import get_world

    res = get_world(3).run(_rejected)
    assert res[1][0] == "ArgumentError", res
    for kind, text in (res[0], res[2]):
        assert kind == "MismatchError", res
        assert re.match(r"all_to_all_v #\d+ cannot run: rank 1 rejected the call's arguments",
                        text), text


@pytest.mark.parametrize("counts,text", [
    ([float("inf"), 1.0, 1.0], "must be integers"),
    ([1e20, 1, 1], "at most 2**62"),
    (np.array([2 ** 64 - 1, 1, 1], np.uint64), "at most 2**62"),
    ([2 ** 70, 1, 1], "at most 2**62"),
    ([1.5, 1, 1], "must be integers"),
    (["1", 1, 1], "must be integers"),
    ([True, False, True], "must be integers"),           # a mask, not counts
    ([2, True, 1], "must be integers"),                  # np.asarray made it [2, 1, 1]
    (np.array([True, False, True]), "must be integers"),
    (np.array([1, True, 1], dtype=object), "must be integers"),
])
def test_counts_are_checked_as_given(counts: Any, text: str) -> None:
    from ringlet.uneven import _counts

    with pytest.raises(ringlet.ArgumentError, match=re.escape(text)):
        _counts(counts, 3, "send_counts")
