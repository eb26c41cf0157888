"""Every algorithm's schedule meets its collective's spec, for every world size.

Pure tests: no processes, no data beyond a small numpy run of the schedules
that checks the values (and the bit-identical all-reduce) independently of
the symbolic verifier.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator

import numpy as np
import pytest

import ringlet
from ringlet.algorithms import algorithms, build, canonical, entry
from ringlet.algorithms.hierarchical import default_group, divisors
from ringlet.errors import ArgumentError, VerificationError
from ringlet.schedule import (
    COLLECTIVES,
    ROOTED,
    Buf,
    Kind,
    Layout,
    Schedule,
    Step,
    copy,
    local_reduce,
    recv,
    recv_reduce,
    send,
)
from ringlet.verify import verify

pytestmark = pytest.mark.one_process   # tests/conftest.py

IN, OUT, TMP = Buf.IN, Buf.OUT, Buf.TMP

ALGOS = [(c, a) for c in COLLECTIVES for a in algorithms(c)]
PIPELINED = [(c, a) for c, a in ALGOS if "pieces" in entry(c, a).params]
IDS = [f"{c}/{a}" for c, a in ALGOS]

EXPECTED = {
    "all_reduce": {"ring", "recursive_doubling", "rabenseifner", "binomial",
                   "double_binary_tree", "hierarchical", "hierarchical_pipelined", "direct",
                   "oneshot", "naive"},
    "broadcast": {"binomial", "chain", "scatter_allgather", "hierarchical", "direct", "naive"},
    "reduce": {"binomial", "chain", "rabenseifner", "hierarchical", "naive"},
    "all_gather": {"ring", "recursive_doubling", "bruck", "hierarchical", "direct", "naive"},
    "reduce_scatter": {"ring", "recursive_halving", "pairwise", "hierarchical", "direct",
                       "naive"},
    "all_to_all": {"pairwise", "bruck", "direct", "naive"},
    "scatter": {"binomial", "linear", "naive"},
    "gather": {"binomial", "linear", "naive"},
}


@pytest.fixture(autouse=True)
def _no_cyclic_gc() -> Iterator[None]:
    """The symbolic runs allocate millions of small, acyclic objects (steps, values) that
    the cyclic collector would traverse again and again for nothing: half the time."""
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def roots(collective: str, n: int) -> list[int]:
    """Root 0, and for rooted collectives a root that is neither 0 nor a power of two."""
    return sorted({0, (n // 2 + 1) % n}) if collective in ROOTED else [0]


def chunks_per_rank(collective: str, name: str, n: int) -> int:
    """How many chunks the steps of a middle rank name: the work of verifying one rank."""
    return sum(e - a for rnd in build(collective, name, n).steps(n // 2) for st in rnd
               for _, a, e in st.src + st.dst)


#: Every N from 1 to 64, every root, is verified by CI (`.ci/run` runs `ringlet verify all
#: --ranks 1-64` beside the tests).  Here, to keep this file within seconds: every N up to
#: 20 (where the schedules' odd shapes are: non-powers of two, a last chunk of its own) and
#: then primes, powers of two and their neighbours, to 64 for schedules whose ranks name
#: O(lg p) chunks, to 33 for those naming O(p) (p^2 in all: ring, pairwise, direct, naive,
#: Bruck's all-to-all...), which cost up to 0.1 s each at N = 64 in this pure-Python run.
ALL_N = [*range(1, 21), 23, 29, 31, 32, 33, 47, 63, 64]
SPREAD_N = [*range(1, 21), 23, 31, 32, 33]


def sizes_for(collective: str, name: str) -> list[int]:
    return SPREAD_N if chunks_per_rank(collective, name, 64) > 64 else ALL_N


# --- the registry ----------------------------------------------------------------------


def test_every_collective_lists_its_algorithms() -> None:
    for c, names in EXPECTED.items():
        assert set(ringlet.algorithms(c)) == names


@pytest.mark.parametrize("collective", ["all_reduce", "broadcast", "reduce", "scatter",
                                        "gather"])
def test_tree_is_the_binomial_alias(collective: str) -> None:
    assert canonical(collective, "tree") == "binomial"
    assert build(collective, "tree", 6).algorithm == "binomial"


def test_other_aliases() -> None:
    assert canonical("reduce", "reduce_scatter_gather") == "rabenseifner"
    assert canonical("all_reduce", "dbtree") == "double_binary_tree"


def test_unknown_algorithm_lists_the_valid_ones() -> None:
    with pytest.raises(ArgumentError, match=r"unknown algorithm 'bruck' for broadcast; "
                                            r"valid: binomial \(or tree\), chain, direct, "
                                            r"hierarchical, "
                                            r"naive, scatter_allgather"):
        build("broadcast", "bruck", 4)


def test_unknown_parameter_is_rejected() -> None:
    with pytest.raises(ArgumentError, match=r"takes no parameter\(s\) \['pieces'\]"):
        build("all_reduce", "binomial", 4, pieces=2)


# --- every algorithm, every world size -----------------------------------------------------


@pytest.mark.parametrize(("collective", "name"), ALGOS, ids=IDS)
def test_verifies_for_every_world_size(collective: str, name: str) -> None:
    for n in sizes_for(collective, name):
        for root in roots(collective, n):
            verify(build(collective, name, n, root))


@pytest.mark.parametrize(("collective", "name"), PIPELINED,
                         ids=[f"{c}/{a}" for c, a in PIPELINED])
@pytest.mark.parametrize("pieces", [1, 2, 5])
def test_verifies_pipelined(collective: str, name: str, pieces: int) -> None:
    if pieces == entry(collective, name).params["pieces"]:
        pytest.skip("the default: verified for every world size above")
    for n in [*range(1, 10), 12, 13, 16, 17, 24]:
        for root in roots(collective, n):
            verify(build(collective, name, n, root, pieces=pieces))


HIERARCHICAL = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce"]


@pytest.mark.parametrize("collective", HIERARCHICAL)
def test_hierarchical_verifies_for_every_group(collective: str) -> None:
    for n in [*range(1, 17), 18, 20, 24]:
        for g in divisors(n):
            for pieces in (1, 2) if n <= 12 else (1,):
                for root in sorted({0, n - 1, (n // 2 + 1) % n}) if collective in ROOTED \
                        else [0]:
                    verify(build(collective, "hierarchical", n, root, group=g, pieces=pieces))


def test_hierarchical_pipelined_verifies_for_every_group_and_depth() -> None:
    for n in [*range(1, 17), 18, 20, 24]:
        for g in divisors(n):
            for pieces in (1, 2, 3, 7) if n <= 12 else (1, 3):
                verify(build("all_reduce", "hierarchical_pipelined", n, group=g, pieces=pieces))


def test_hierarchical_pipelined_moves_what_hierarchical_moves_in_fewer_rounds() -> None:
    # the same messages, piece by piece; P + L - 1 rounds instead of P L
    for n, g, pieces in ((8, 4, 1), (12, 4, 3), (16, 4, 5), (24, 8, 4)):
        flat = build("all_reduce", "hierarchical", n, group=g, pieces=pieces)
        pipe = build("all_reduce", "hierarchical_pipelined", n, group=g, pieces=pieces)
        L = 2 * (g - 1) + 2 * (n // g - 1)
        assert flat.nrounds == pieces * L and pipe.nrounds == pieces + L - 1
        a, b = flat.counts(10 * n * pieces), pipe.counts(10 * n * pieces)
        for k in ("sent", "received", "reduced", "messages"):
            assert np.array_equal(getattr(a, k), getattr(b, k)), k
        # mid-pipeline, one round carries traffic inside the group and across groups at once
        mid = pipe.round_arrays(g - 1)   # piece 0 starts across groups, piece 1 is inside
        same = mid["src"] // g == mid["dst"] // g
        assert (pieces == 1 or n == g) or (same.any() and (~same).any())


@pytest.mark.parametrize("collective", HIERARCHICAL)
def test_hierarchical_rejects_a_group_that_does_not_divide(collective: str) -> None:
    with pytest.raises(ArgumentError, match=rf"hierarchical {collective}: group=3 does not "
                                            rf"divide 8 ranks into equal groups; "
                                            r"use one of 1, 2, 4, 8"):
        build(collective, "hierarchical", 8, group=3)
    with pytest.raises(ArgumentError, match=r"group=9 does not divide 8 ranks"):
        build(collective, "hierarchical", 8, group=9)


@pytest.mark.parametrize(("collective", "name"), PIPELINED,
                         ids=[f"{c}/{a}" for c, a in PIPELINED])
@pytest.mark.parametrize("pieces", [0, -1, 1.5])
def test_pieces_must_be_a_positive_whole_number(collective: str, name: str,
                                                pieces: float) -> None:
    with pytest.raises(ArgumentError, match=rf"{collective}/{name}: pieces must be a whole "
                                            rf"number >= 1, got {pieces}"):
        build(collective, name, 4, pieces=pieces)  # type: ignore[arg-type]


def test_hierarchical_default_group_is_the_divisor_nearest_above_sqrt() -> None:
    assert [default_group(n) for n in (1, 2, 7, 8, 12, 16, 18, 64)] == [1, 2, 7, 4, 4, 4, 6, 8]
    # the vector is cut in one shard per rank of a group
    assert build("all_reduce", "hierarchical", 12).layouts[OUT].blocks == 4


# --- no round receives into what it sends ------------------------------------------------


def _overlaps(a: tuple, b: tuple) -> bool:
    return any(x[0] == y[0] and x[1] < y[2] and y[1] < x[2] for x in a for y in b)


@pytest.mark.parametrize(("collective", "name"), ALGOS, ids=IDS)
def test_no_round_writes_what_it_sends(collective: str, name: str) -> None:
    """The executor must snapshot a send whose chunks a later step of the round writes;
    every algorithm but the naive oracle's all-reduce avoids that."""
    if (collective, name) == ("all_reduce", "naive"):
        pytest.skip("the oracle reduces into the vector it sends, on purpose: it is simple")
    for n in [*range(1, 10), 12, 16, 17]:
        s = build(collective, name, n, roots(collective, n)[-1])
        for r in range(n):
            for i, rnd in enumerate(s.steps(r)):
                sent = tuple(ref for st in rnd if st.kind is Kind.SEND for ref in st.src)
                written = tuple(ref for st in rnd if st.kind is not Kind.SEND for ref in st.dst)
                assert not _overlaps(sent, written), (s.name, r, i, [str(x) for x in rnd])


# --- one rank's steps, cheaply, at scale ---------------------------------------------------


@pytest.mark.parametrize(("collective", "name"),
                         [(c, a) for c, a in ALGOS
                          if entry(c, a).builder.__module__.rsplit(".", 1)[1]
                          in ("ring", "tree", "recursive", "hierarchical")],
                         ids=lambda x: str(x))
def test_one_rank_at_16384_ranks_is_cheap(collective: str, name: str) -> None:
    n = 16384
    s = build(collective, name, n, 5 if collective in ROOTED else 0)
    t0 = time.process_time()     # CPU time: other processes on the machine do not count
    steps = s.steps(777)
    elapsed = time.process_time() - t0
    assert len(steps) == s.nrounds
    assert list(s._cache) == [777]     # nothing built for any other rank
    assert elapsed < 1.0, f"{s.name}: {elapsed:.2f}s to build one rank's steps"


# --- the values, by running the schedules on numpy data --------------------------------


def _run(s: Schedule, m: int, inputs: list[np.ndarray],
         op: np.ufunc = np.add) -> list[dict[Buf, np.ndarray]]:
    """Execute every rank's steps round by round on the inputs' dtype (reducing with
    ``op``, in the operand order each step says), as the IR says: sends read the state
    at the start of the round, writes apply in step order."""
    n = s.nranks
    bounds = {b: lay.bounds(m) for b, lay in s.layouts.items()}
    bufs = [{b: np.full(lay.scale * m, np.nan, inputs[0].dtype) for b, lay in s.layouts.items()}
            for _ in range(n)]
    spec = COLLECTIVES[s.collective]
    first = IN if IN in spec else OUT
    for r in range(n):
        if s.collective in ("broadcast", "scatter") and r != s.root:
            continue
        bufs[r][first][:] = inputs[r]

    def parts(r: int, refs: tuple) -> list[np.ndarray]:
        return [bufs[r][b][bounds[b][a]:bounds[b][e]] for b, a, e in refs]

    for i in range(s.nrounds):
        box: dict[tuple[int, int], list[np.ndarray]] = {}
        for r in range(n):
            for st in s.steps(r)[i]:
                if st.kind is Kind.SEND:
                    box.setdefault((r, st.peer), []).append(
                        np.concatenate(parts(r, st.src)).copy())
        for r in range(n):
            for st in s.steps(r)[i]:
                if st.kind is Kind.SEND:
                    continue
                if st.kind in (Kind.RECV, Kind.RRED):
                    data = box[(st.peer, r)].pop(0)
                else:
                    data = np.concatenate(parts(r, st.src)).copy()
                pos = 0
                for d in parts(r, st.dst):
                    piece = data[pos:pos + d.size]
                    if st.kind in (Kind.RRED, Kind.LRED):
                        if st.src_first:
                            op(piece, d, out=d)
                        else:
                            op(d, piece, out=d)
                    else:
                        d[:] = piece
                    pos += d.size
    return bufs


def _data(rng: np.random.Generator, size: int) -> np.ndarray:
    # a wide dynamic range, so that adding in another order changes the bits
    return (rng.standard_normal(size) * 10.0 ** rng.uniform(-4, 4, size)).astype(np.float32)


@pytest.mark.parametrize(("collective", "name"), ALGOS, ids=IDS)
def test_values(collective: str, name: str) -> None:
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 5, 6, 8, 11):
        root = roots(collective, n)[-1]
        s = build(collective, name, n, root)
        m = 37
        per = m * (n if COLLECTIVES[collective].get(IN, COLLECTIVES[collective].get(OUT)) == "N"
                   else 1)
        xs = [_data(rng, per) for _ in range(n)]
        out = [b[OUT] for b in _run(s, m, xs)]
        total = np.sum(np.array(xs, np.float64), axis=0)
        if collective == "all_reduce":
            for r in range(n):
                np.testing.assert_allclose(out[r], total, rtol=1e-5, atol=1e-3)
                # bit-identical on every rank
                assert out[r].tobytes() == out[0].tobytes(), (s.name, r)
        elif collective == "broadcast":
            for r in range(n):
                assert np.array_equal(out[r], xs[root])
        elif collective == "reduce":
            np.testing.assert_allclose(out[root], total, rtol=1e-5, atol=1e-3)
        elif collective == "reduce_scatter":
            for r in range(n):
                np.testing.assert_allclose(out[r], total[r * m:(r + 1) * m], rtol=1e-5, atol=1e-3)
        elif collective == "all_gather":
            for r in range(n):
                assert np.array_equal(out[r], np.concatenate(xs))
        elif collective == "gather":
            assert np.array_equal(out[root], np.concatenate(xs))
        elif collective == "scatter":
            for r in range(n):
                assert np.array_equal(out[r], xs[root][r * m:(r + 1) * m])
        elif collective in ("scan", "exscan"):
            for r in range(n):
                upto = r + 1 if collective == "scan" else r
                want = np.sum(np.array(xs[:upto], np.float64), axis=0) if upto else xs[0]
                np.testing.assert_allclose(out[r], want, rtol=1e-5, atol=1e-3)
        else:
            for r in range(n):
                want = np.concatenate([xs[q][r * m:(r + 1) * m] for q in range(n)])
                assert np.array_equal(out[r], want)


# --- the seeds' worked examples, on every algorithm ------------------------------------

#: (collective, every rank's input, every rank's expected OUT or None where unconstrained),
#: on 4 ranks with root 0, from the seeds' tables: seed 003's AllReduce, AllGather,
#: ReduceScatter and All-to-All pictures, seed 002's broadcast, scatter, gather, reduce and
#: all_reduce ([1] [2] [3] [4] -> [10]).  A0..D3 are written 10 * rank + block.
SEED_TABLES = [
    ("all_reduce", [[1, 2], [3, 4], [2, 6], [4, 8]], [[10, 20]] * 4),
    ("all_reduce", [[1], [2], [3], [4]], [[10]] * 4),
    ("all_gather", [[0], [1], [2], [3]], [[0, 1, 2, 3]] * 4),
    ("reduce_scatter", [[1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6], [4, 5, 6, 7]],
     [[10], [14], [18], [22]]),
    ("all_to_all", [[10 * r + j for j in range(4)] for r in range(4)],
     [[10 * q + r for q in range(4)] for r in range(4)]),
    ("broadcast", [[7], [0], [0], [0]], [[7]] * 4),
    ("scatter", [[0, 1, 2, 3], [], [], []], [[0], [1], [2], [3]]),
    ("gather", [[0], [1], [2], [3]], [[0, 1, 2, 3], None, None, None]),
    ("reduce", [[1], [2], [3], [4]], [[10], None, None, None]),
]


@pytest.mark.parametrize(("collective", "inputs", "want"), SEED_TABLES,
                         ids=[f"{c}-{len(i[0])}" for c, i, _ in SEED_TABLES])
def test_the_seeds_tables_on_every_algorithm(collective: str, inputs: list[list[int]],
                                             want: list[list[int] | None]) -> None:
    """Each seed's before/after picture, exactly, from every algorithm's schedule (the
    multi-process cheatsheet, tests/test_examples.py, runs the default algorithm only and
    seed 003's all-reduce on other inputs)."""
    spec = COLLECTIVES[collective]
    for name in algorithms(collective):
        s = build(collective, name, 4)
        xs = [np.array(x or inputs[0], np.float64) for x in inputs]
        m = len(xs[0]) // (4 if spec.get(IN) == "N" else 1)
        out = [b[OUT] for b in _run(s, m, xs)]
        for r, w in enumerate(want):
            if w is not None:
                assert out[r].tolist() == w, (name, r)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_ring_all_reduce_moves_the_chunks_the_seeds_name(n: int) -> None:
    """Seed 001: in step k of the reduce-scatter, node i sends chunk (i-k) mod P to its
    right neighbour and receives chunk (i-k-1) mod P from its left.  Seed 000: after N-1
    steps worker i holds the fully-reduced chunk (i+1) mod N; N-1 more steps of passing
    give every worker all N; 2(N-1) steps of S/N each."""
    s = build("all_reduce", "ring", n)
    assert s.nrounds == 2 * (n - 1) and s.layouts[OUT].nchunks == n
    for i in range(n):
        for k in range(n - 1):
            sends = [(st.peer, st.src) for st in s.steps(i)[k]
                     if st.kind is Kind.SEND]
            recvs = [(st.peer, st.dst) for st in s.steps(i)[k] if st.kind is Kind.RRED]
            assert [(p, [c for _, c, _ in refs]) for p, refs in sends] == \
                [((i + 1) % n, [(i - k) % n])]
            assert [(p, [c for _, c, _ in refs]) for p, refs in recvs] == \
                [((i - 1) % n, [(i - k - 1) % n])]
    full = (1 << n) - 1
    complete: dict[int, list[list[int]]] = {}

    def on_round(k: int, states: list[dict[Buf, list]]) -> None:
        complete[k] = [[c for c, v in enumerate(st[OUT]) if v is not None and v[1] == full]
                       for st in states]

    verify(s, on_round=on_round)
    assert complete[n - 2] == [[(i + 1) % n] for i in range(n)]
    assert complete[2 * n - 3] == [list(range(n))] * n

# --- verify catches broken schedules ---------------------------------------------------


def _sched(collective: str, n: int, table: dict[int, list[list[Step]]],
           layouts: dict[Buf, Layout], root: int = 0) -> Schedule:
    R = max(len(v) for v in table.values())
    return Schedule(collective, "broken", n, R, layouts,
                    lambda r: table.get(r, [[] for _ in range(R)]), root=root)


def _ring_allreduce_without(rank: int, rnd: int, kind: Kind) -> Schedule:
    good = build("all_reduce", "ring", 4)
    table = {r: [list(x) for x in good.steps(r)] for r in range(4)}
    table[rank][rnd] = [st for st in table[rank][rnd] if st.kind is not kind]
    return _sched("all_reduce", 4, table, dict(good.layouts))


def test_verify_catches_a_missing_receive() -> None:
    with pytest.raises(VerificationError, match=r"round 2: rank 1 'send OUT\[\d\] -> 2' is "
                                                r"never received by rank 2"):
        verify(_ring_allreduce_without(2, 2, Kind.RRED))


def test_verify_catches_a_missing_send() -> None:
    with pytest.raises(VerificationError, match=r"rank 2 round 3: 'recv OUT\[\d\] <- 1' has no "
                                                r"matching send from rank 1"):
        verify(_ring_allreduce_without(1, 3, Kind.SEND))


def test_verify_catches_counting_a_rank_twice() -> None:
    # the root adds rank 0's input, then adds it again
    table = {0: [[send(1, (IN, 0))], [send(1, (IN, 0))]],
             1: [[copy([(OUT, 0)], [(IN, 0)]), recv_reduce(0, (OUT, 0))],
                 [recv_reduce(0, (OUT, 0))]]}
    with pytest.raises(VerificationError, match=r"rank 1 round 1: 'recv\+reduce OUT\[0\] <- 0' "
                                                r"would count rank\(s\) \[0\] twice in OUT "
                                                r"chunk 0"):
        verify(_sched("reduce", 2, table, {IN: Layout(1), OUT: Layout(1)}, root=1))


def test_verify_rejects_a_buffer_the_collective_has_not() -> None:
    table = {0: [[send(1, (OUT, 0))]], 1: [[recv_reduce(0, (OUT, 0))]]}
    with pytest.raises(VerificationError, match=r"all_reduce has no IN buffer"):
        verify(_sched("all_reduce", 2, table, {OUT: Layout(1), IN: Layout(1)}))


def test_verify_catches_reading_a_chunk_never_received() -> None:
    # rank 1 forwards the vector to rank 2 in the same round it receives it
    table = {0: [[send(1, (OUT, 0))]], 1: [[recv(0, (OUT, 0)), send(2, (OUT, 0))]],
             2: [[recv(1, (OUT, 0))]]}
    with pytest.raises(VerificationError, match=r"rank 1 round 0: 'send OUT\[0\] -> 2' sends OUT "
                                                r"chunk 0, which rank 1 never received"):
        verify(_sched("broadcast", 3, table, {OUT: Layout(1)}))


def test_verify_catches_a_local_read_of_nothing() -> None:
    table = {0: [[copy([(OUT, 0)], [(TMP, 0)])]]}
    with pytest.raises(VerificationError, match=r"reads TMP chunk 0, which rank 0 never received"):
        verify(_sched("reduce", 1, table, {IN: Layout(1), OUT: Layout(1), TMP: Layout(1)}))


def test_verify_catches_writing_in() -> None:
    table = {0: [[send(1, (IN, 0))]], 1: [[recv_reduce(0, (IN, 0))]]}
    with pytest.raises(VerificationError, match=r"rank 1 round 0: 'recv\+reduce IN\[0\] <- 0' "
                                                r"writes IN, which is read-only"):
        verify(_sched("reduce", 2, table, {IN: Layout(1), OUT: Layout(1)}, root=1))


def test_verify_catches_writing_the_broadcast_roots_vector() -> None:
    # rank 1 echoes the vector back into the root's (comm.broadcast takes it read-only)
    table = {0: [[send(1, (OUT, 0))], [recv(1, (OUT, 0))]], 1: [[recv(0, (OUT, 0))],
                                                             [send(0, (OUT, 0))]]}
    with pytest.raises(VerificationError, match=r"rank 0 round 1: 'recv OUT\[0\] <- 1' writes "
                                                r"the root's vector, which is its input"):
        verify(_sched("broadcast", 2, table, {OUT: Layout(1)}))


def test_verify_catches_mismatched_sizes() -> None:
    # rank 0 sends one of its two chunks, rank 1 receives into both
    table = {0: [[send(1, (OUT, 0))]], 1: [[recv(0, (OUT, 0, 2))]]}
    with pytest.raises(VerificationError, match=r"round 0: rank 0 'send OUT\[0\] -> 1' and rank 1 "
                                                r"'recv OUT\[0:2\] <- 0' move chunks of different "
                                                r"sizes"):
        verify(_sched("broadcast", 2, table, {OUT: Layout(2)}))


def test_verify_catches_mismatched_sizes_of_a_copy() -> None:
    table = {0: [[copy([(OUT, 0, 2)], [(IN, 0)])]]}
    with pytest.raises(VerificationError, match=r"copies between chunks of different sizes"):
        verify(_sched("gather", 1, table, {IN: Layout(1), OUT: Layout(1, 2)}))


def test_verify_catches_reducing_different_data() -> None:
    table = {0: [[send(1, (OUT, 1))], [recv(1, (OUT, 0, 2))]],
             1: [[recv_reduce(0, (OUT, 0))], [send(0, (OUT, 0, 2))]]}
    with pytest.raises(VerificationError, match=r"reduces \('x', 1\) from ranks \[0\] into OUT "
                                                r"chunk 0 holding \('x', 0\) from ranks \[1\]: "
                                                r"different data"):
        # (unit counts at which both chunks have the same size)
        verify(_sched("all_reduce", 2, table, {OUT: Layout(2)}), sizes=(8, 2))


def test_verify_catches_a_wrong_end_state() -> None:
    # the root forgets rank 2
    table = {0: [[send(1, (OUT, 0))]], 1: [[recv(0, (OUT, 0))]]}
    with pytest.raises(VerificationError, match=r"at the end rank 2 OUT chunk 0 holds nothing, "
                                                r"but should hold \('x', 0\) from ranks \[0\]"):
        verify(_sched("broadcast", 3, table, {OUT: Layout(1)}))


def test_verify_catches_a_bad_peer_and_bad_chunks() -> None:
    with pytest.raises(VerificationError, match=r"'send OUT\[0\] -> 0' has a bad peer"):
        verify(_sched("broadcast", 2, {0: [[send(0, (OUT, 0))]]}, {OUT: Layout(1)}))
    with pytest.raises(VerificationError, match=r"names chunks 1:2 of OUT, which has 1"):
        verify(_sched("broadcast", 2, {0: [[send(1, (OUT, 1))]]}, {OUT: Layout(1)}))
    with pytest.raises(VerificationError, match=r"uses TMP, which this schedule does not declare"):
        verify(_sched("broadcast", 2, {0: [[send(1, (TMP, 0))]]}, {OUT: Layout(1)}))


def _asymmetric_allreduce(n: int) -> Schedule:
    """Everyone gets every vector and adds them up starting from its own: right sums,
    but each rank associates them differently."""
    def rank_fn(r: int) -> list[list[Step]]:
        peers = [q for q in range(n) if q != r]
        rnd = [send(q, (OUT, 0)) for q in peers] + [recv(q, (TMP, q)) for q in peers]
        rnd += [local_reduce([(OUT, 0)], [(TMP, (r + i) % n)]) for i in range(1, n)]
        return [rnd]
    return Schedule("all_reduce", "asymmetric", n, 1, {OUT: Layout(1), TMP: Layout(n, 1, n)},
                    rank_fn)


def test_verify_catches_reduction_orders_that_differ_between_ranks() -> None:
    with pytest.raises(VerificationError, match=r"at the end rank 1 OUT chunk 0 was reduced in a "
                                                r"different order than on rank 0"):
        verify(_asymmetric_allreduce(3))
    # and the floating-point run shows why it matters
    rng = np.random.default_rng(1)
    xs = [_data(rng, 64) for _ in range(3)]
    out = [b[OUT] for b in _run(_asymmetric_allreduce(3), 64, xs)]
    assert out[1].tobytes() != out[0].tobytes()


def _pair(first: tuple[bool, bool]) -> Schedule:
    """Two ranks swap vectors and each reduces: rank r's reduction puts the received
    operand first if ``first[r]``."""
    def rank_fn(r: int) -> list[list[Step]]:
        return [[send(1 - r, (OUT, 0)), recv(1 - r, (TMP, 0)),
                 local_reduce([(TMP, 0)], [(OUT, 0)], src_first=first[r])],
                [copy([(OUT, 0)], [(TMP, 0)])]]
    return Schedule("all_reduce", "pair", 2, 2, {OUT: Layout(1), TMP: Layout(1)}, rank_fn)


def test_verify_tells_a_op_b_from_b_op_a() -> None:
    # b (op) a on rank 0 and a (op) b on rank 1: MIN of +0.0 and -0.0 differs
    with pytest.raises(VerificationError, match=r"rank 1 OUT chunk 0 was reduced in a "
                                                r"different order than on rank 0"):
        verify(_pair((False, False)))
    xs = [np.array([0.0, -0.0]), np.array([-0.0, 0.0])]
    out = [b[OUT] for b in _run(_pair((False, False)), 2, xs, np.minimum)]
    assert out[0].tobytes() != out[1].tobytes()
    # the same expression on both ranks: a (op) b
    verify(_pair((True, False)))
    out = [b[OUT] for b in _run(_pair((True, False)), 2, xs, np.minimum)]
    assert out[0].tobytes() == out[1].tobytes()


def _awkward(rng: np.random.Generator, size: int, rank: int) -> np.ndarray:
    """Signed zeros and NaNs whose payload says which rank they came from."""
    x = rng.choice(np.array([0.0, -0.0, 1.0, -1.0]), size)
    bits = x.view(np.uint64)
    nan = rng.random(size) < 0.3
    bits[nan] = np.uint64(0x7FF8_0000_0000_0000 + 1 + rank)
    return x


@pytest.mark.parametrize("name", algorithms("all_reduce"))
@pytest.mark.parametrize("op", [np.add, np.multiply, np.minimum, np.maximum],
                         ids=lambda u: u.__name__)
def test_all_reduce_is_bit_identical_where_ops_do_not_commute(name: str, op: np.ufunc) -> None:
    """The numpy run of the schedule, on values where a (op) b and b (op) a differ."""
    rng = np.random.default_rng(3)
    for n in (2, 3, 4, 5, 8, 11):
        s = build("all_reduce", name, n)
        xs = [_awkward(rng, 41, r) for r in range(n)]
        with np.errstate(invalid="ignore"):
            out = [b[OUT] for b in _run(s, 41, xs, op)]
        for r in range(1, n):
            assert out[r].tobytes() == out[0].tobytes(), (s.name, r)


def test_hierarchical_pipelined_values_with_pieces_in_flight() -> None:
    """The numpy run with several pieces in flight: the sum, bit-identical everywhere,
    and the same bits as ``hierarchical`` (the same operands in the same order)."""
    rng = np.random.default_rng(11)
    for n, g, pieces in ((4, 2, 3), (6, 3, 2), (8, 4, 5), (12, 4, 4), (12, 6, 7)):
        xs = [_data(rng, 53) for _ in range(n)]
        pipe = [b[OUT] for b in _run(build("all_reduce", "hierarchical_pipelined", n, group=g,
                                           pieces=pieces), 53, xs)]
        flat = [b[OUT] for b in _run(build("all_reduce", "hierarchical", n, group=g,
                                           pieces=pieces), 53, xs)]
        np.testing.assert_allclose(pipe[0], np.sum(np.array(xs, np.float64), axis=0),
                                   rtol=1e-5, atol=1e-3)
        for r in range(n):
            assert pipe[r].tobytes() == pipe[0].tobytes() == flat[r].tobytes(), (n, g, r)


def test_the_communicator_pipelines_in_pieces_of_a_mebibyte_or_more() -> None:
    """``pipeline_pieces``: a power of two, every rank's shard at least 1 MiB a piece, at
    most 8 pieces, one below two pieces' worth."""
    from ringlet.algorithms.hierarchical import pipeline_pieces

    MiB = 1 << 20
    assert [pipeline_pieces(s * MiB, 2) for s in (0, 1, 2, 3, 4, 6, 8, 16, 24, 1024)] == \
        [1, 1, 1, 1, 2, 2, 4, 8, 8, 8]
    assert pipeline_pieces(64 * MiB, 8) == 8 and pipeline_pieces(16 * MiB, 8) == 2
    assert pipeline_pieces(5, 0) == 1
