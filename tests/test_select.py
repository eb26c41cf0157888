"""Choosing an algorithm: RINGLET_ALGO parsing, precedence, exclusion, errors."""

from __future__ import annotations

import pytest

from ringlet.algorithms import algorithms
from ringlet.algorithms.select import choose, heuristic, parse_algo_setting
from ringlet.errors import ArgumentError
from ringlet.schedule import COLLECTIVES

KiB, MiB = 1 << 10, 1 << 20


# --- parsing -----------------------------------------------------------------------------


def test_parse_forces_and_canonicalises_aliases() -> None:
    assert parse_algo_setting("all_reduce:ring;broadcast:tree") == {
        "all_reduce": ("ring", frozenset()), "broadcast": ("binomial", frozenset())}


def test_parse_exclusions_with_spaces_and_empty_entries() -> None:
    got = parse_algo_setting(" all_reduce : ^naive , ^ direct ;; reduce:^tree ;")
    assert got == {"all_reduce": (None, frozenset({"naive", "direct"})),
                   "reduce": (None, frozenset({"binomial"}))}


def test_parse_force_and_exclude_together() -> None:
    assert parse_algo_setting("all_gather:bruck,^naive") == {
        "all_gather": ("bruck", frozenset({"naive"}))}


def test_parse_empty_setting() -> None:
    assert parse_algo_setting("") == {} and parse_algo_setting("  ;  ") == {}


def test_parse_returns_a_fresh_dict() -> None:
    a = parse_algo_setting("all_reduce:ring")
    a.clear()
    assert parse_algo_setting("all_reduce:ring") == {"all_reduce": ("ring", frozenset())}


@pytest.mark.parametrize(("text", "message"), [
    ("allreduce:ring", r"unknown collective 'allreduce'; valid: all_reduce, broadcast, reduce, "
                       r"all_gather, reduce_scatter, all_to_all, scatter, gather"),
    ("all_reduce:rng", r"all_reduce has no algorithm 'rng'; valid: binomial \(or tree\), direct, "
                       r"double_binary_tree \(or dbtree\), hierarchical, hierarchical_pipelined, "
                       r"naive, oneshot, "
                       r"rabenseifner, "
                       r"recursive_doubling, ring"),
    ("broadcast:^ring", r"broadcast has no algorithm 'ring'; valid: binomial \(or tree\), "
                        r"chain, direct, hierarchical, naive, scatter_allgather"),
    ("all_reduce", r"write collective:algorithm, e.g. all_reduce:ring"),
    ("all_reduce:", r"write collective:algorithm"),
    ("all_reduce:ring,tree", r"forces both 'ring' and 'tree'; force at most one"),
    ("all_reduce:ring,^ring", r"'ring' is both forced and excluded"),
    ("all_reduce:ring;all_reduce:^naive", r"all_reduce is given twice"),
    ("scatter:^binomial,^linear,^naive", r"excludes every algorithm of scatter; keep at least "
                                         r"one of binomial, linear, naive"),
])
def test_parse_errors_name_the_valid_choices(text: str, message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        parse_algo_setting(text)


def test_parse_error_quotes_the_entry() -> None:
    with pytest.raises(ArgumentError, match=r"RINGLET_ALGO entry 'broadcast:rign'"):
        parse_algo_setting("all_reduce:ring; broadcast:rign")


# --- precedence -----------------------------------------------------------------------


def test_requested_wins_over_the_setting() -> None:
    assert choose("all_reduce", 8, 1 * KiB, requested="tree",
                  setting="all_reduce:ring") == "binomial"


def test_requested_wins_even_over_an_exclusion() -> None:
    assert choose("all_reduce", 8, 1 * KiB, requested="naive",
                  setting="all_reduce:^naive") == "naive"


@pytest.mark.parametrize("requested", [None, "auto"])
def test_the_setting_wins_over_the_heuristic(requested: str | None) -> None:
    assert choose("all_reduce", 8, 1 * KiB, requested=requested,
                  setting="all_reduce:direct") == "direct"
    # other collectives are untouched
    assert choose("broadcast", 8, 1 * KiB, requested=requested,
                  setting="all_reduce:direct") == "direct"
    assert choose("all_reduce", 8, 1 * KiB, requested=requested,
                  setting="all_reduce:ring") == "ring"


def test_requested_names_come_back_canonical() -> None:
    assert choose("reduce", 4, 10, requested="reduce_scatter_gather", setting="") == \
        "rabenseifner"
    assert choose("gather", 4, 10, requested="tree", setting="") == "binomial"


def test_unknown_requested_name_lists_the_valid_ones() -> None:
    with pytest.raises(ArgumentError, match=r"algorithm=: all_to_all has no algorithm 'ring'; "
                                            r"valid: bruck, direct, naive, pairwise"):
        choose("all_to_all", 4, 10, requested="ring", setting="")


def test_bad_arguments() -> None:
    with pytest.raises(ArgumentError, match=r"unknown collective 'allgather'; valid: "):
        choose("allgather", 4, 10, requested=None, setting="")
    with pytest.raises(ArgumentError, match=r"nranks must be >= 1, got 0"):
        choose("all_reduce", 0, 10, requested=None, setting="")
    with pytest.raises(ArgumentError, match=r"nbytes must be >= 0, got -1"):
        choose("all_reduce", 4, -1, requested=None, setting="")
    with pytest.raises(ArgumentError, match=r"unknown collective 'alltoall'"):
        choose("all_reduce", 4, 10, requested=None, setting="alltoall:bruck")


# --- the heuristic --------------------------------------------------------------------


def test_all_reduce_by_size() -> None:
    auto = "all_reduce"
    assert choose(auto, 16, 4 * KiB, requested=None, setting="") == "oneshot"
    assert choose(auto, 2, 256 * KiB, requested=None, setting="") == "oneshot"
    assert choose(auto, 2, 256 * KiB + 1, requested=None, setting="") == "direct"
    assert choose(auto, 5, 64 * KiB, requested=None, setting="") == "oneshot"
    assert choose(auto, 5, 64 * KiB + 1, requested=None, setting="") == "direct"
    assert choose(auto, 2, 1 << 30, requested=None, setting="") == "direct"
    # without the shared-memory algorithms: the alpha-beta fallbacks
    plain = "all_reduce:^oneshot,^direct"
    assert choose(auto, 16, 64 * KiB, requested=None, setting=plain) == "rabenseifner"
    assert choose(auto, 16, 16 * 256 * KiB, requested=None, setting=plain) == "ring"
    assert choose(auto, 12, 1 * MiB, requested=None, setting=plain) == "ring"   # not a power of 2


def test_recursive_doubling_is_never_the_automatic_all_reduce() -> None:
    # partners reduce a(op)b and b(op)a: not bit-identical for MIN/MAX of signed zeros
    for n in (1, 2, 3, 8, 64):
        for nbytes in (0, 8, 100, 64 * KiB, 100 * MiB):
            for setting in ("", "all_reduce:^oneshot,^direct",
                            "all_reduce:^oneshot,^direct,^rabenseifner,^ring,^binomial"):
                assert choose("all_reduce", n, nbytes, requested=None,
                              setting=setting) != "recursive_doubling"


def test_other_collectives_by_size() -> None:
    for coll in ("broadcast", "all_gather", "reduce_scatter", "all_to_all"):
        for nbytes in (8, 100 * KiB, 16 * MiB):
            assert choose(coll, 8, nbytes, requested=None, setting="") == "direct"
    assert choose("broadcast", 8, 1 * KiB, requested=None,
                  setting="broadcast:^direct") == "binomial"
    assert choose("broadcast", 8, 4 * MiB, requested=None,
                  setting="broadcast:^direct") == "scatter_allgather"
    assert choose("reduce", 8, 1 * KiB, requested=None, setting="") == "binomial"
    assert choose("reduce", 8, 4 * MiB, requested=None, setting="") == "rabenseifner"
    ag = "all_gather:^direct"
    assert choose("all_gather", 8, 100 * KiB, requested=None, setting=ag) == "recursive_doubling"
    assert choose("all_gather", 6, 10 * KiB, requested=None, setting=ag) == "bruck"
    assert choose("all_gather", 6, 100 * KiB, requested=None, setting=ag) == "ring"
    rs = "reduce_scatter:^direct"
    assert choose("reduce_scatter", 8, 1 * KiB, requested=None, setting=rs) == \
        "recursive_halving"
    assert choose("reduce_scatter", 8, 1 * MiB, requested=None, setting=rs) == "ring"
    a2a = "all_to_all:^direct"
    assert choose("all_to_all", 16, 16 * 64, requested=None, setting=a2a) == "bruck"
    assert choose("all_to_all", 16, 16 * 64 * KiB, requested=None, setting=a2a) == "pairwise"
    assert choose("scatter", 16, 1 * MiB, requested=None, setting="") == "binomial"
    assert choose("gather", 16, 1, requested=None, setting="") == "binomial"


def test_exclusion_falls_back_to_the_next_preference() -> None:
    assert choose("all_reduce", 16, 1 * KiB, requested=None,
                  setting="all_reduce:^oneshot") == "direct"
    assert choose("all_reduce", 16, 1 * KiB, requested=None,
                  setting="all_reduce:^oneshot,^direct,^rabenseifner,^ring") == "binomial"
    assert choose("scatter", 4, 10, requested=None,
                  setting="scatter:^binomial,^linear") == "naive"


@pytest.mark.parametrize("collective", list(COLLECTIVES))
def test_never_chooses_an_excluded_name(collective: str) -> None:
    names = algorithms(collective)
    for keep in names:
        setting = f"{collective}:" + ",".join(f"^{a}" for a in names if a != keep)
        for n in (1, 2, 3, 8, 64):
            for nbytes in (0, 100, 100 * KiB, 100 * MiB):
                assert choose(collective, n, nbytes, requested=None, setting=setting) == keep


@pytest.mark.parametrize("collective", list(COLLECTIVES))
def test_heuristic_returns_an_allowed_name_deterministically(collective: str) -> None:
    allowed = frozenset(algorithms(collective))
    for n in (1, 2, 3, 7, 8, 64, 1000):
        for nbytes in (0, 1, 255, 4 * KiB, 64 * KiB, 1 * MiB, 1 << 30):
            a = heuristic(collective, n, nbytes, allowed)
            assert a in allowed
            assert a != "naive" or collective == "all_to_all"   # the oracle is never automatic
            assert heuristic(collective, n, nbytes, allowed) == a


# --- across nodes ---------------------------------------------------------------------------


def _across(coll: str, n: int, nbytes: int, per: int | None, setting: str = "") -> str:
    return choose(coll, n, nbytes, requested=None, setting=setting, nodes=n // (per or n),
                  ranks_per_node=per)


def test_across_nodes_two_level_where_it_pays() -> None:
    # all_reduce: always two-level when nodes are equal blocks of more than one rank
    for nbytes in (8, 64 * KiB, 1 * MiB):
        assert _across("all_reduce", 8, nbytes, 4) == "hierarchical"
        assert _across("all_reduce", 4, nbytes, 2) == "hierarchical"
    assert _across("all_reduce", 4, 64 * MiB, 2) == "hierarchical_pipelined"
    # all_gather and reduce_scatter: on two nodes, and where the flat rules pick the ring
    for coll in ("all_gather", "reduce_scatter"):
        assert _across(coll, 4, 8, 2) == "hierarchical"
        assert _across(coll, 12, 16 * MiB, 3) == "hierarchical"
        assert _across(coll, 16, 1 * KiB, 4) != "hierarchical"      # 4 nodes, latency
    # broadcast and reduce: where the flat rules pick their bandwidth algorithm
    assert _across("broadcast", 8, 4 * MiB, 2) == "hierarchical"
    assert _across("broadcast", 8, 1 * KiB, 2) == "binomial"
    assert _across("reduce", 8, 4 * MiB, 4) == "hierarchical"
    assert _across("reduce", 8, 1 * KiB, 4) == "binomial"
    # never the one-host algorithms, never two-level on a single rank per node
    for coll in COLLECTIVES:
        for nbytes in (8, 64 * KiB, 64 * MiB):
            assert _across(coll, 4, nbytes, 1) not in ("direct", "oneshot", "hierarchical")
            assert _across(coll, 6, nbytes, 2) not in ("direct", "oneshot")
    # an exclusion holds across nodes too
    assert _across("all_gather", 4, 8, 2, "all_gather:^hierarchical") != "hierarchical"


def test_across_nodes_all_reduce_pipelined_from_two_pieces() -> None:
    """Across nodes, the pipelined two-level all_reduce from two pieces of at least
    1 MiB of each rank's shard (pipeline_pieces), whatever crosses the nodes (the
    engine's own all_reduce or ringlet's ring)."""
    def pick(n: int, nbytes: int, per: int, setting: str = "") -> str:
        return choose("all_reduce", n, nbytes, requested=None, setting=setting,
                      nodes=n // per, ranks_per_node=per)

    assert pick(4, 4 * MiB - 1, 2) == "hierarchical"           # one piece
    assert pick(4, 4 * MiB, 2) == "hierarchical_pipelined"     # two
    assert pick(8, 8 * MiB - 1, 4) == "hierarchical"
    assert pick(8, 8 * MiB, 4) == "hierarchical_pipelined"
    for nbytes in (8, 4 * MiB, 64 * MiB):
        assert pick(4, nbytes, 1) != "hierarchical_pipelined"   # no node-local phase
    assert pick(4, 64 * MiB, 2, "all_reduce:^hierarchical_pipelined") == "hierarchical"
    assert pick(4, 64 * MiB, 2, "all_reduce:hierarchical") == "hierarchical"
    assert choose("all_reduce", 4, 64 * MiB, requested="hierarchical", setting="", nodes=2,
                  ranks_per_node=2) == "hierarchical"


def test_past_the_post_area_the_automatic_oneshot_becomes_direct_and_nothing_else() -> None:
    """A call too large for the fused paths' post area (``post_fits=False``): the automatic
    choice of oneshot (which runs fused or not at all) becomes the staged direct path, but
    an algorithm the user asked for, or forced or excluded with RINGLET_ALGO, is honoured
    (the communicator ran direct for ``all_reduce:oneshot`` and ``all_reduce:^direct``)."""
    small = 1 << 10
    assert choose("all_reduce", 2, small, requested=None, setting="") == "oneshot"
    assert choose("all_reduce", 2, small, requested=None, setting="",
                  post_fits=False) == "direct"
    assert choose("all_reduce", 2, small, requested="auto", setting="",
                  post_fits=False) == "direct"
    assert choose("all_reduce", 2, small, requested="oneshot", setting="",
                  post_fits=False) == "oneshot"
    assert choose("all_reduce", 2, small, requested=None, setting="all_reduce:oneshot",
                  post_fits=False) == "oneshot"
    for setting in ("all_reduce:^direct", "all_reduce:^direct,^ring"):
        excluded = parse_algo_setting(setting)["all_reduce"][1]
        name = choose("all_reduce", 2, small, requested=None, setting=setting,
                      post_fits=False)
        assert name not in excluded | {"oneshot"}, (setting, name)
        assert name == heuristic("all_reduce", 2, small,
                                 frozenset(algorithms("all_reduce")) - excluded - {"oneshot"})
    only = ",".join(f"^{a}" for a in algorithms("all_reduce") if a != "oneshot")
    assert choose("all_reduce", 2, small, requested=None, setting=f"all_reduce:{only}",
                  post_fits=False) == "oneshot"   # nothing else is allowed


def test_docstring_examples() -> None:
    import doctest
    import importlib

    # the module, not the package's function of the same name
    result = doctest.testmod(importlib.import_module("ringlet.algorithms.select"))
    assert result.attempted and not result.failed


def test_settings_that_mean_the_same_compare_equal() -> None:
    from ringlet.algorithms.select import canonical_setting

    same = ["all_reduce:tree;broadcast:^chain", "broadcast: ^chain ; all_reduce: binomial",
            "all_reduce:binomial;;broadcast:^chain;"]
    assert len({canonical_setting(s) for s in same}) == 1
    assert canonical_setting("all_reduce:ring") != canonical_setting("all_reduce:binomial")
    assert canonical_setting("all_reduce:^ring") != canonical_setting("all_reduce:ring")
    assert canonical_setting("") == canonical_setting(" ; ")
