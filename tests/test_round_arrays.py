"""Every family's closed-form rounds (``Schedule.round_fn``) against the step-by-step ones.

``Schedule.round_arrays`` answers from a closed form (no rank's steps are
built: the simulator asks it for 16,384 ranks); ``round_arrays_stepwise``
walks every rank's steps.  They must list the same messages (sender,
receiver, chunks, whether the receiver reduces) in every round, for every
registered algorithm, for N = 1..64 (every size to 13, then a sample with
primes, powers of two and their neighbours), roots and parameters included.
"""

from __future__ import annotations

import numpy as np
import pytest

from ringlet.algorithms import algorithms, build, entry
from ringlet.algorithms.hierarchical import divisors
from ringlet.schedule import COLLECTIVES, ROOTED, Kind, Schedule

pytestmark = pytest.mark.one_process   # tests/conftest.py

KEYS = ("src", "dst", "chunks", "reduce")
SIZES = [*range(1, 14), 16, 17, 24, 31, 32, 37, 48, 64]
CASES = [(c, a) for c in COLLECTIVES for a in algorithms(c)]


def rows(ra: dict[str, np.ndarray]) -> list[tuple[int, int, int, bool]]:
    return sorted(zip(ra["src"].tolist(), ra["dst"].tolist(), ra["chunks"].tolist(),
                      ra["reduce"].tolist(), strict=True))


def local(ra: dict[str, np.ndarray], n: int) -> list[int]:
    """Chunks each rank reduces locally in the round (zeros when the key is left out)."""
    return ra["local"].tolist() if "local" in ra else [0] * n


def variants(collective: str, name: str, n: int) -> list[dict[str, int]]:
    """The parameter sets to check at n ranks: defaults, and a few pieces and groups."""
    params = entry(collective, name).params
    out: list[dict[str, int]] = [{}]
    if "pieces" in params and n <= 16:
        out.append({"pieces": 3})
    if "group" in params:
        ds = divisors(n)
        out += [{"group": g} for g in sorted({ds[len(ds) // 2], n} if n > 16 else
                                             {1, ds[len(ds) // 2], n})]
        if n == 12:
            out.append({"group": 4, "pieces": 2})
    return out


def stepwise(s: Schedule) -> list[tuple[list[tuple[int, int, int, bool]], list[int]]]:
    """Every round's rows from every rank's steps, in one pass (what
    ``round_arrays_stepwise`` gives round by round: the k-th send from a to b in a
    round is reduced if the k-th receive of b from a in that round is)."""
    sends: list[list[tuple[int, int, int]]] = [[] for _ in range(s.nrounds)]
    kinds: list[dict[tuple[int, int], list[bool]]] = [{} for _ in range(s.nrounds)]
    locals_ = [[0] * s.nranks for _ in range(s.nrounds)]
    for r in range(s.nranks):
        for i, rnd in enumerate(s.steps(r)):
            for st in rnd:
                if st.kind is Kind.SEND:
                    sends[i].append((r, st.peer, sum(e - b for _, b, e in st.src)))
                elif st.kind in (Kind.RECV, Kind.RRED):
                    kinds[i].setdefault((st.peer, r), []).append(st.kind is Kind.RRED)
                elif st.kind is Kind.LRED:
                    locals_[i][r] += sum(e - b for _, b, e in st.dst)
    out = []
    for i in range(s.nrounds):
        seen: dict[tuple[int, int], int] = {}
        rs = []
        for a, b, c in sends[i]:
            k = seen.get((a, b), 0)
            seen[(a, b)] = k + 1
            ks = kinds[i].get((a, b), [])
            rs.append((a, b, c, ks[k] if k < len(ks) else False))
        out.append((sorted(rs), locals_[i]))
    return out


def check(s: Schedule) -> None:
    assert s.round_fn is not None, f"{s.name} has no closed-form rounds"
    want = stepwise(s)
    for i in range(s.nrounds):
        got = s.round_arrays(i)
        assert [got[k].dtype for k in KEYS] == [np.int64, np.int64, np.int64, np.bool_]
        assert (rows(got), local(got, s.nranks)) == want[i], \
            f"{s.name} {s.params}: round {i} differs"


def test_the_one_pass_reference_is_round_arrays_stepwise() -> None:
    for s in (build("all_reduce", "double_binary_tree", 13), build("reduce", "rabenseifner", 7, 3),
              build("all_reduce", "recursive_doubling", 6), build("reduce", "naive", 5, 2),
              build("all_reduce", "hierarchical", 12, group=3)):
        assert stepwise(s) == [(rows(ra), local(ra, s.nranks))
                               for ra in map(s.round_arrays_stepwise, range(s.nrounds))]


@pytest.mark.parametrize(("collective", "name"), CASES)
def test_closed_form_rounds_match_the_steps(collective: str, name: str) -> None:
    for n in SIZES:
        roots = sorted({0, n - 1, n // 2} if n <= 16 else {n - 1}) \
            if collective in ROOTED else [0]
        for root in roots:
            for params in variants(collective, name, n):
                check(build(collective, name, n, root, **params))


@pytest.mark.parametrize(("collective", "name"), CASES)
def test_every_chunk_is_the_same_share(collective: str, name: str) -> None:
    # the simulator sizes a message as chunks x chunk_elements: every buffer's chunks
    # must hold the same share of the unit count
    for n in (1, 6, 8, 13):
        s = build(collective, name, n)
        shares = {lay.scale / lay.nchunks for lay in s.layouts.values()}
        assert shares == {s.chunk_elements(1.0)}, (s.name, s.layouts)


def test_closed_form_at_scale_builds_no_steps() -> None:
    s = build("all_reduce", "ring", 16384)
    ra = s.round_arrays(s.nrounds - 1)
    assert len(ra["src"]) == 16384 and not ra["reduce"].any()
    assert s._cache == {}
    with pytest.raises(Exception, match="out of range"):
        s.round_arrays(s.nrounds)
