"""Alpha-beta-gamma counts and communication patterns, pinned to the references' closed forms.

``Counts.rounds`` is the alpha term (rounds with a message), ``sent`` /
``received`` the beta term (bytes per rank; we compare the max over ranks, or
every rank where the formula says they are all equal) and ``reduced`` the
gamma term.  Unit counts are chosen so every chunk has the same size, which is
what the closed forms assume.  References: Thakur, Rabenseifner & Gropp
(2005), Chan et al. (2007), Sanders, Speck & Traeff (2009).
"""

from __future__ import annotations

import numpy as np
import pytest

from ringlet.algorithms import build
from ringlet.algorithms.tree import _dtree
from ringlet.schedule import Counts, Kind, Schedule

pytestmark = pytest.mark.one_process   # tests/conftest.py

POW2 = [2, 4, 8, 16, 32]
ODD_SIZES = [3, 5, 6, 7, 12, 13, 24]
SIZES = sorted(POW2 + ODD_SIZES)


def lg(n: int) -> int:
    """ceil(lg n)"""
    return (n - 1).bit_length()


def flg(n: int) -> int:
    """floor(lg n)"""
    return n.bit_length() - 1


def count(s: Schedule, m: int) -> Counts:
    return s.counts(m)


def messages(s: Schedule) -> list[tuple[int, int, int]]:
    """Every message as (round, src, dst)."""
    out = []
    for i in range(s.nrounds):
        ra = s.round_arrays(i)
        out += [(i, int(a), int(b)) for a, b in zip(ra["src"], ra["dst"], strict=True)]
    return out


def uniform(x: np.ndarray, value: int) -> bool:
    return bool((x == value).all())


# --- all-reduce (m = elements of the vector; 1-byte elements) --------------------------


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("pieces", [1, 3])
def test_all_reduce_ring(n: int, pieces: int) -> None:
    s = build("all_reduce", "ring", n, pieces=pieces)
    m = 60 * n * pieces
    c = count(s, m)
    assert c.rounds == 2 * (n - 1) * pieces
    assert uniform(c.sent, 2 * (n - 1) * m // n) and uniform(c.received, 2 * (n - 1) * m // n)
    assert uniform(c.reduced, (n - 1) * m // n)
    assert uniform(c.messages, 2 * (n - 1) * pieces)
    assert all(dst == (src + 1) % n for _, src, dst in messages(s))


def test_counts_scale_with_the_item_size() -> None:
    s = build("all_reduce", "ring", 4)
    assert (s.counts(400, itemsize=4).sent == 4 * s.counts(400).sent).all()


@pytest.mark.parametrize("n", POW2)
def test_all_reduce_recursive_doubling_power_of_two(n: int) -> None:
    s = build("all_reduce", "recursive_doubling", n)
    m = 64
    c = count(s, m)
    assert c.rounds == flg(n)
    assert uniform(c.sent, m * flg(n)) and uniform(c.reduced, m * flg(n))
    assert {(i, src ^ dst) for i, src, dst in messages(s)} == {(i, 1 << i) for i in range(flg(n))}


@pytest.mark.parametrize("n", [3, 5, 6, 7, 12, 13])
def test_all_reduce_recursive_doubling_folds_the_extra_ranks(n: int) -> None:
    s = build("all_reduce", "recursive_doubling", n)
    p2, rem, m = 1 << flg(n), n - (1 << flg(n)), 64
    c = count(s, m)
    assert c.rounds == flg(n) + 2
    assert c.sent.max() == m * (flg(p2) + 1)    # the exchanges, then the unfold
    # the odd rank of each of the first rem pairs sends one vector and gets one back
    for r in range(1, 2 * rem, 2):
        assert c.sent[r] == m and c.received[r] == m and c.messages[r] == 1
    msgs = messages(s)
    assert {(a, b) for i, a, b in msgs if i == 0} == {(r, r - 1) for r in range(1, 2 * rem, 2)}
    assert {(a, b) for i, a, b in msgs if i == s.nrounds - 1} == \
        {(r - 1, r) for r in range(1, 2 * rem, 2)}


@pytest.mark.parametrize("n", POW2)
def test_all_reduce_rabenseifner_power_of_two(n: int) -> None:
    s = build("all_reduce", "rabenseifner", n)
    m = 64 * n
    c = count(s, m)
    assert c.rounds == 2 * flg(n)
    assert uniform(c.sent, 2 * (n - 1) * m // n) and uniform(c.received, 2 * (n - 1) * m // n)
    assert uniform(c.reduced, (n - 1) * m // n)
    # halving: distances n/2, n/4, ..., 1; then doubling: 1, 2, ..., n/2
    k = flg(n)
    dist = [n >> (i + 1) for i in range(k)] + [1 << i for i in range(k)]
    assert {(i, a ^ b) for i, a, b in messages(s)} == set(enumerate(dist))


@pytest.mark.parametrize("n", [3, 5, 6, 7, 12, 13])
def test_all_reduce_rabenseifner_folds_the_extra_ranks(n: int) -> None:
    s = build("all_reduce", "rabenseifner", n)
    p2 = 1 << flg(n)
    m = 64 * p2
    c = count(s, m)
    assert c.rounds == 2 * flg(n) + 2
    assert c.sent.max() == 2 * (p2 - 1) * m // p2 + m


@pytest.mark.parametrize("n", SIZES)
def test_all_reduce_binomial(n: int) -> None:
    s = build("all_reduce", "binomial", n)
    m = 64
    c = count(s, m)
    assert c.rounds == 2 * lg(n)
    # rank 0 receives from lg p children, reduces, and sends to them
    assert c.received[0] == c.sent[0] == c.reduced[0] == lg(n) * m
    assert c.sent.max() == lg(n) * m
    assert c.messages.sum() == 2 * (n - 1)     # each edge once up, once down
    assert c.sent.sum() == 2 * (n - 1) * m


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7, 8, 12, 13, 16, 17])
@pytest.mark.parametrize("pieces", [1, 4])
def test_all_reduce_double_binary_tree(n: int, pieces: int) -> None:
    s = build("all_reduce", "double_binary_tree", n, pieces=pieces)
    m = 64 * pieces
    c = count(s, m)
    depth = flg(n - 1) + 1
    assert c.rounds == 2 * depth + pieces - 1
    # each tree edge carries each half of the vector once up and once down
    assert c.sent.sum() == 2 * (n - 1) * m and c.messages.sum() == 4 * (n - 1) * pieces
    assert c.reduced.sum() == (n - 1) * m
    # a rank is an inner node of at most one tree, so it sends and receives at most 2n
    assert c.sent.max() == c.received.max() == (2 * m if n >= 4 else (m * 3) // 2 if n == 3
                                                else m)
    assert c.reduced.max() == (m if n >= 3 else m // 2)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 31, 32])
def test_double_binary_tree_shape(n: int) -> None:
    """Two trees over all ranks; every rank but rank 0 (odd p) is a leaf in one of them."""
    for tree in (0, 1):
        parents = {r: _dtree(n, tree, r)[0] for r in range(n)}
        assert sorted(parents.values()).count(-1) == 1            # one root
        for r, (_, kids, _, depth) in ((r, _dtree(n, tree, r)) for r in range(n)):
            assert len(kids) <= 2 and all(parents[k] == r for k in kids)
            assert depth <= flg(n - 1) + 1
    for r in range(n):
        inner = [bool(_dtree(n, t, r)[1]) for t in (0, 1)]
        if not (n % 2 and r == 0):
            assert not all(inner), f"rank {r} is an inner node of both trees"


@pytest.mark.parametrize(("n", "group"), [(4, 2), (6, 2), (6, 3), (8, 4), (12, 3), (12, 4),
                                          (16, 4), (9, 3), (10, 5)])
@pytest.mark.parametrize("pieces", [1, 2])
def test_all_reduce_hierarchical(n: int, group: int, pieces: int) -> None:
    s = build("all_reduce", "hierarchical", n, group=group, pieces=pieces)
    g, G = group, n // group
    m = 16 * n * pieces
    c = count(s, m)
    assert c.rounds == pieces * (2 * (g - 1) + 2 * (G - 1))
    want = 2 * (g - 1) * m // g + 2 * (G - 1) * m // (g * G)
    assert uniform(c.sent, want) and uniform(c.received, want)
    assert uniform(c.reduced, (g - 1) * m // g + (G - 1) * m // (g * G))
    # only the inter-group ring crosses groups, to the same local rank in the next group
    cross = [(a, b) for _, a, b in messages(s) if a // g != b // g]
    assert all(b == (a + g) % n for a, b in cross)
    assert len(cross) == n * 2 * (G - 1) * pieces
    inside = [(a, b) for _, a, b in messages(s) if a // g == b // g]
    assert all(b == a - a % g + (a % g + 1) % g for a, b in inside)


@pytest.mark.parametrize(("n", "group"), [(4, 2), (6, 2), (6, 3), (8, 4), (12, 3), (9, 3),
                                          (10, 5), (5, 1), (5, 5)])
@pytest.mark.parametrize("collective", ["all_gather", "reduce_scatter"])
def test_two_level_all_gather_and_reduce_scatter(collective: str, n: int, group: int) -> None:
    """Each rank moves G-1 blocks across groups (to the same local rank of the next
    group) and (g-1) rails of G blocks inside its group: (p-1) blocks in all."""
    s = build(collective, "hierarchical", n, group=group)
    g, G = group, n // group
    m = 16
    c = count(s, m)
    assert c.rounds == (g - 1) + (G - 1)
    assert uniform(c.sent, (n - 1) * m) and uniform(c.received, (n - 1) * m)
    if collective == "reduce_scatter":
        assert uniform(c.reduced, (n - 1) * m)
    cross = [(a, b) for _, a, b in messages(s) if a // g != b // g]
    assert all(b == (a + g) % n for a, b in cross) and len(cross) == n * (G - 1)
    inside = [(a, b) for _, a, b in messages(s) if a // g == b // g]
    assert all(b == a - a % g + (a % g + 1) % g for a, b in inside)
    assert len(inside) == n * (g - 1)


@pytest.mark.parametrize("n", SIZES)
def test_all_reduce_direct(n: int) -> None:
    s = build("all_reduce", "direct", n)
    m = 64 * n
    c = count(s, m)
    assert c.rounds == 2
    assert uniform(c.sent, 2 * (n - 1) * m // n) and uniform(c.reduced, (n - 1) * m // n)
    assert uniform(c.messages, 2 * (n - 1))
    # each round, every rank sends to every other rank once
    for i in (0, 1):
        pairs = [(a, b) for j, a, b in messages(s) if j == i]
        assert sorted(pairs) == [(a, b) for a in range(n) for b in range(n) if a != b]


@pytest.mark.parametrize("n", [2, 5, 8])
def test_all_reduce_naive(n: int) -> None:
    c = count(build("all_reduce", "naive", n), 10)
    assert c.rounds == 1 and uniform(c.sent, (n - 1) * 10) and uniform(c.reduced, (n - 1) * 10)


def test_one_rank_needs_no_messages() -> None:
    for name in ("ring", "recursive_doubling", "rabenseifner", "binomial", "double_binary_tree",
                 "hierarchical", "direct"):
        c = count(build("all_reduce", name, 1), 10)
        assert c.rounds == 0 and c.sent.sum() == 0


# --- broadcast and reduce (m = elements of the vector) ---------------------------------


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("root", [0, 1])
def test_broadcast_binomial(n: int, root: int) -> None:
    root %= n
    s = build("broadcast", "binomial", n, root)
    c = count(s, 64)
    assert c.rounds == lg(n)
    assert c.sent[root] == lg(n) * 64 and c.received[root] == 0
    assert all(c.received[r] == 64 for r in range(n) if r != root)
    assert c.messages.sum() == n - 1


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("pieces", [1, 4, 7])
def test_broadcast_chain(n: int, pieces: int) -> None:
    root = n // 2
    s = build("broadcast", "chain", n, root, pieces=pieces)
    m = 64 * pieces
    c = count(s, m)
    assert c.rounds == n - 1 + pieces - 1
    last = (root - 1) % n
    assert all(c.received[r] == m for r in range(n) if r != root)
    assert all(c.sent[r] == (0 if r == last else m) for r in range(n))
    assert all(b == (a + 1) % n for _, a, b in messages(s))
    assert c.round_sent.max() == m // pieces    # one piece per link per round


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("pieces", [1, 4, 7])
def test_reduce_chain(n: int, pieces: int) -> None:
    # the broadcast chain backwards: each rank but the root sends the vector once, to the
    # rank before it; each rank but the far end receives it once and reduces it
    root = n // 2
    s = build("reduce", "chain", n, root, pieces=pieces)
    m = 64 * pieces
    c = count(s, m)
    assert c.rounds == n - 2 + pieces
    far = (root - 1) % n   # the chain runs root - 1 -> root - 2 -> ... -> root
    assert all(c.sent[r] == (0 if r == root else m) for r in range(n))
    assert all(c.received[r] == (0 if r == far else m) for r in range(n))
    assert all(b == (a - 1) % n for _, a, b in messages(s))
    assert c.round_sent.max() == m // pieces    # one piece per link per round


@pytest.mark.parametrize("n", SIZES)
def test_broadcast_scatter_allgather(n: int) -> None:
    root = 1 % n
    s = build("broadcast", "scatter_allgather", n, root)
    m = 64 * n
    c = count(s, m)
    assert c.rounds == lg(n) + n - 1
    assert c.sent.max() == c.sent[root] == 2 * (n - 1) * m // n
    assert all(c.received[r] == (0 if r == root else m) for r in range(n))


@pytest.mark.parametrize("n", [2, 5, 8])
def test_broadcast_naive(n: int) -> None:
    c = count(build("broadcast", "naive", n), 10)
    assert c.rounds == 1 and c.sent[0] == (n - 1) * 10


@pytest.mark.parametrize("n", SIZES)
def test_reduce_binomial(n: int) -> None:
    root = n - 1
    c = count(build("reduce", "binomial", n, root), 64)
    assert c.rounds == lg(n)
    assert c.received[root] == c.reduced[root] == lg(n) * 64 and c.sent[root] == 0
    assert all(c.sent[r] == 64 for r in range(n) if r != root)


@pytest.mark.parametrize("n", POW2)
def test_reduce_rabenseifner_power_of_two(n: int) -> None:
    root = n // 2 + 1 if n > 2 else 1
    s = build("reduce", "rabenseifner", n, root)
    m = 64 * n
    c = count(s, m)
    assert c.rounds == 2 * flg(n)
    # the root receives (p-1)/p n in the reduce-scatter and again in the gather
    assert c.received[root] == 2 * (n - 1) * m // n and c.received.max() == c.received[root]
    assert uniform(c.reduced, (n - 1) * m // n)
    assert c.sent[root] == (n - 1) * m // n


@pytest.mark.parametrize("n", [3, 5, 6, 7, 12, 13])
def test_reduce_rabenseifner_folds_the_extra_ranks(n: int) -> None:
    s = build("reduce", "rabenseifner", n, 2)
    c = count(s, 64 * n)
    assert c.rounds == 2 * flg(n) + 1
    assert c.received[2] == 2 * ((1 << flg(n)) - 1) * 64 * n // (1 << flg(n)) + \
        (64 * n if n - (1 << flg(n)) > 0 else 0)


@pytest.mark.parametrize("n", [2, 5, 8])
def test_reduce_naive(n: int) -> None:
    c = count(build("reduce", "naive", n, 1), 10)
    assert c.rounds == 1 and c.received[1] == (n - 1) * 10 and c.reduced[1] == (n - 1) * 10


# --- all-gather (m = elements each rank contributes) ------------------------------------


@pytest.mark.parametrize("n", SIZES)
def test_all_gather_ring(n: int) -> None:
    c = count(build("all_gather", "ring", n), 16)
    assert c.rounds == n - 1 and uniform(c.sent, (n - 1) * 16)


@pytest.mark.parametrize("n", SIZES)
def test_all_gather_bruck(n: int) -> None:
    s = build("all_gather", "bruck", n)
    m = 16
    c = count(s, m)
    # ceil(lg p) rounds and (p-1)/p of the output for every p
    assert c.rounds == lg(n)
    assert uniform(c.sent, (n - 1) * m) and uniform(c.received, (n - 1) * m)
    assert all(a == (b + (1 << i)) % n for i, a, b in messages(s))


@pytest.mark.parametrize("n", POW2)
def test_all_gather_recursive_doubling_power_of_two(n: int) -> None:
    s = build("all_gather", "recursive_doubling", n)
    c = count(s, 16)
    assert c.rounds == flg(n) and uniform(c.sent, (n - 1) * 16)
    assert {(i, a ^ b) for i, a, b in messages(s)} == {(i, 1 << i) for i in range(flg(n))}


@pytest.mark.parametrize("n", [3, 5, 6, 7, 12, 13])
def test_all_gather_recursive_doubling_folds_the_extra_ranks(n: int) -> None:
    c = count(build("all_gather", "recursive_doubling", n), 16)
    rem = n - (1 << flg(n))
    assert c.rounds == flg(n) + 2
    for r in range(1, 2 * rem, 2):   # the folded ranks: one block out, the rest back
        assert c.sent[r] == 16 and c.received[r] == (n - 1) * 16


@pytest.mark.parametrize("n", [2, 5, 8])
def test_all_gather_naive(n: int) -> None:
    c = count(build("all_gather", "naive", n), 10)
    assert c.rounds == 1 and uniform(c.sent, (n - 1) * 10)


# --- reduce-scatter (m = elements each rank ends with) ---------------------------------


@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatter_ring(n: int) -> None:
    c = count(build("reduce_scatter", "ring", n), 16)
    assert c.rounds == n - 1 and uniform(c.sent, (n - 1) * 16) and uniform(c.reduced, (n - 1) * 16)


@pytest.mark.parametrize("n", POW2)
def test_reduce_scatter_recursive_halving_power_of_two(n: int) -> None:
    s = build("reduce_scatter", "recursive_halving", n)
    c = count(s, 16)
    assert c.rounds == flg(n)
    assert uniform(c.sent, (n - 1) * 16) and uniform(c.reduced, (n - 1) * 16)
    assert {(i, a ^ b) for i, a, b in messages(s)} == {(i, n >> (i + 1)) for i in range(flg(n))}


@pytest.mark.parametrize("n", [3, 5, 6, 7, 12, 13])
def test_reduce_scatter_recursive_halving_folds_the_extra_ranks(n: int) -> None:
    c = count(build("reduce_scatter", "recursive_halving", n), 16)
    rem = n - (1 << flg(n))
    assert c.rounds == flg(n) + 2
    for r in range(1, 2 * rem, 2):   # the folded ranks: the whole input out, their block back
        assert c.sent[r] == n * 16 and c.received[r] == 16


@pytest.mark.parametrize("n", SIZES)
def test_reduce_scatter_pairwise(n: int) -> None:
    s = build("reduce_scatter", "pairwise", n)
    c = count(s, 16)
    assert c.rounds == n - 1 and uniform(c.sent, (n - 1) * 16) and uniform(c.reduced, (n - 1) * 16)
    assert all(b == (a + i + 1) % n for i, a, b in messages(s))


@pytest.mark.parametrize("n", [2, 5, 8])
def test_reduce_scatter_naive(n: int) -> None:
    c = count(build("reduce_scatter", "naive", n), 10)
    assert c.rounds == 1 and uniform(c.sent, (n - 1) * 10)


# --- all-to-all (m = elements per block; a rank's buffer is p m) ----------------------


@pytest.mark.parametrize("n", SIZES)
def test_all_to_all_pairwise(n: int) -> None:
    s = build("all_to_all", "pairwise", n)
    c = count(s, 16)
    assert c.rounds == n - 1 and uniform(c.sent, (n - 1) * 16) and uniform(c.messages, n - 1)
    # round k: rank r sends to r+k and receives from r-k
    assert all(b == (a + i + 1) % n for i, a, b in messages(s))


@pytest.mark.parametrize("n", SIZES)
def test_all_to_all_bruck(n: int) -> None:
    s = build("all_to_all", "bruck", n)
    m = 16
    c = count(s, m)
    assert c.rounds == lg(n)
    # round k moves the blocks whose position j in 1..p-1 has bit k set
    per_round = [sum(1 for j in range(1, n) if j >> k & 1) * m for k in range(lg(n))]
    assert uniform(c.sent, sum(per_round)) and list(c.round_sent) == per_round
    if n in POW2:
        assert uniform(c.sent, (n * m // 2) * flg(n))   # (n/2) lg p of the p m buffer
    assert all(a == (b + (1 << i)) % n for i, a, b in messages(s))


@pytest.mark.parametrize("n", [2, 5, 8])
def test_all_to_all_naive(n: int) -> None:
    c = count(build("all_to_all", "naive", n), 10)
    assert c.rounds == 1 and uniform(c.sent, (n - 1) * 10)


# --- scatter and gather (m = elements per rank) ----------------------------------------


def _subtree(v: int, n: int) -> int:
    return n if v == 0 else min(v & -v, n - v)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("collective", ["scatter", "gather"])
def test_scatter_gather_binomial(n: int, collective: str) -> None:
    root = n // 2
    s = build(collective, "binomial", n, root)
    c = count(s, 16)
    assert c.rounds == lg(n)
    moved = c.sent if collective == "scatter" else c.received
    assert moved[root] == (n - 1) * 16
    other = c.received if collective == "scatter" else c.sent
    # each rank gets (or passes up) its subtree's blocks in one message
    for r in range(n):
        v = (r - root) % n
        assert other[r] == (0 if v == 0 else _subtree(v, n) * 16)
    assert c.messages.sum() == n - 1


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("collective", ["scatter", "gather"])
def test_scatter_gather_linear(n: int, collective: str) -> None:
    root = n - 1
    s = build(collective, "linear", n, root)
    c = count(s, 16)
    assert c.rounds == n - 1
    moved = c.sent if collective == "scatter" else c.received
    assert moved[root] == (n - 1) * 16
    # one message per round, to (or from) root+1, root+2, ...
    peers = [b if collective == "scatter" else a for _, a, b in messages(s)]
    assert peers == [(root + k) % n for k in range(1, n)]


@pytest.mark.parametrize("collective", ["scatter", "gather"])
def test_scatter_gather_naive(collective: str) -> None:
    c = count(build(collective, "naive", 5), 10)
    assert c.rounds == 1 and c.messages.sum() == 4


def test_reductions_are_only_in_reducing_collectives() -> None:
    for coll, name in [("broadcast", "chain"), ("all_gather", "bruck"), ("all_to_all", "bruck"),
                       ("scatter", "binomial"), ("gather", "binomial")]:
        s = build(coll, name, 6)
        assert count(s, 12).reduced.sum() == 0
        assert not any(st.kind in (Kind.RRED, Kind.LRED) for r in range(6) for rnd in s.steps(r)
                       for st in rnd)


def _link_bytes(s: Schedule, g: int, m: int) -> tuple[dict[int, int], dict[int, int]]:
    """Bytes each group sends and receives across groups."""
    bounds = {b: lay.bounds(m) for b, lay in s.layouts.items()}
    out: dict[int, int] = {}
    into: dict[int, int] = {}
    for r in range(s.nranks):
        for rnd in s.steps(r):
            for st in rnd:
                if st.kind is Kind.SEND and st.peer // g != r // g:
                    nb = sum(int(bounds[b][e] - bounds[b][a]) for b, a, e in st.src)
                    out[r // g] = out.get(r // g, 0) + nb
                    into[st.peer // g] = into.get(st.peer // g, 0) + nb
    return out, into


@pytest.mark.parametrize(("n", "group"), [(4, 2), (8, 2), (8, 4), (6, 3), (12, 4), (6, 1)])
def test_two_level_broadcast_and_reduce_cross_once_per_group(n: int, group: int) -> None:
    """Whatever the root, every group but the root's receives the vector once across
    groups (broadcast), or sends it once (reduce): binomial trees from a root inside a
    group cross two or three times."""
    m, g, G = 48 * n, group, n // group
    for root in range(n):
        out, into = _link_bytes(build("broadcast", "hierarchical", n, root, group=g), g, m)
        assert into == {j: m for j in range(G) if j != root // g}, (root, into)
        out, into = _link_bytes(build("reduce", "hierarchical", n, root, group=g), g, m)
        assert out == {j: m for j in range(G) if j != root // g}, (root, out)
    out, into = _link_bytes(build("broadcast", "binomial", 8, 1), 2, m)
    # what the flat tree does (the docs' figure)
    assert max(out.values()) == 3 * m and sorted(into.values()) == [m, 2 * m, 2 * m, 2 * m]
