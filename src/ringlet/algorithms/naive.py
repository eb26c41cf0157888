"""The naive reference: everyone sends everything, in one round.

Every rank sends each peer all the data that peer needs, straight from its
input; reductions are then done locally in rank order, so every rank that
reduces computes ``x0 (op) x1 (op) ... (op) x{p-1}`` in the same order.  It
is slow (p-1 messages of the whole vector per rank) and obviously right,
which is what the tests want from an oracle.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..schedule import (
    Buf,
    Layout,
    Schedule,
    Step,
    copy,
    local_reduce,
    recv,
    send,
)
from . import register
from .common import Messages, all_pairs, messages


def _everyone(n: int, reduced: bool = False) -> Callable[[int], Messages]:
    """The one round of an all-to-all exchange: every rank sends one chunk to every other
    (received whole; ``reduced``: then every rank reduces the n - 1 it received locally)."""

    def rounds(i: int) -> Messages:
        m = messages(*all_pairs(n))
        if reduced and n > 1:
            m["local"] = np.full(n, n - 1, np.int64)
        return m

    return rounds


def _from_root(n: int, root: int) -> Callable[[int], Messages]:
    others = np.array([q for q in range(n) if q != root], np.int64)
    return lambda i: messages(root, others)


def _to_root(n: int, root: int, reduced: bool = False) -> Callable[[int], Messages]:
    others = np.array([q for q in range(n) if q != root], np.int64)

    def rounds(i: int) -> Messages:
        m = messages(others, root)
        if reduced and n > 1:
            m["local"] = np.zeros(n, np.int64)
            m["local"][root] = n - 1
        return m

    return rounds

IN, OUT, TMP = Buf.IN, Buf.OUT, Buf.TMP


def _reduce_in_rank_order(n: int, dst: tuple[Buf, int]) -> list[Step]:
    """dst = TMP[0] (op) TMP[1] (op) ... (op) TMP[n-1], in that order."""
    steps = [copy([dst], [(TMP, 0)])]
    steps += [local_reduce([dst], [(TMP, q)]) for q in range(1, n)]
    return steps


@register("all_reduce", "naive")
def all_reduce_naive(n: int, root: int = 0) -> Schedule:
    """Every rank sends its vector to every other, then reduces all p in rank order."""

    def rank_fn(r: int) -> list[list[Step]]:
        peers = [q for q in range(n) if q != r]
        rnd = [send(q, (OUT, 0)) for q in peers]
        rnd += [recv(q, (TMP, q)) for q in peers]
        rnd += [copy([(TMP, r)], [(OUT, 0)])]
        return [rnd + _reduce_in_rank_order(n, (OUT, 0))]

    return Schedule("all_reduce", "naive", n, 1, {OUT: Layout(1), TMP: Layout(n, 1, n)}, rank_fn,
                    round_fn=_everyone(n, reduced=True))


@register("broadcast", "naive")
def broadcast_naive(n: int, root: int = 0) -> Schedule:
    """The root sends the vector to every other rank."""

    def rank_fn(r: int) -> list[list[Step]]:
        if r == root:
            return [[send(q, (OUT, 0)) for q in range(n) if q != root]]
        return [[recv(root, (OUT, 0))]]

    return Schedule("broadcast", "naive", n, 1, {OUT: Layout(1)}, rank_fn, root=root,
                    round_fn=_from_root(n, root))


@register("reduce", "naive")
def reduce_naive(n: int, root: int = 0) -> Schedule:
    """Every rank sends its vector to the root, which reduces all p in rank order."""

    def rank_fn(r: int) -> list[list[Step]]:
        if r != root:
            return [[send(root, (IN, 0))]]
        rnd = [recv(q, (TMP, q)) for q in range(n) if q != root]
        rnd += [copy([(TMP, root)], [(IN, 0)])]
        return [rnd + _reduce_in_rank_order(n, (OUT, 0))]

    layouts = {IN: Layout(1), OUT: Layout(1), TMP: Layout(n, 1, n)}
    return Schedule("reduce", "naive", n, 1, layouts, rank_fn, root=root,
                    round_fn=_to_root(n, root, reduced=True))


@register("all_gather", "naive")
def all_gather_naive(n: int, root: int = 0) -> Schedule:
    """Every rank sends its input to every other rank."""

    def rank_fn(r: int) -> list[list[Step]]:
        peers = [q for q in range(n) if q != r]
        rnd = [send(q, (IN, 0)) for q in peers] + [recv(q, (OUT, q)) for q in peers]
        return [rnd + [copy([(OUT, r)], [(IN, 0)])]]

    return Schedule("all_gather", "naive", n, 1, {IN: Layout(1), OUT: Layout(n, 1, n)}, rank_fn,
                    round_fn=_everyone(n))


@register("reduce_scatter", "naive")
def reduce_scatter_naive(n: int, root: int = 0) -> Schedule:
    """Every rank sends block q to rank q, which reduces the p blocks in rank order."""

    def rank_fn(r: int) -> list[list[Step]]:
        peers = [q for q in range(n) if q != r]
        rnd = [send(q, (IN, q)) for q in peers] + [recv(q, (TMP, q)) for q in peers]
        rnd += [copy([(TMP, r)], [(IN, r)])]
        return [rnd + _reduce_in_rank_order(n, (OUT, 0))]

    layouts = {IN: Layout(n, 1, n), OUT: Layout(1), TMP: Layout(n, 1, n)}
    return Schedule("reduce_scatter", "naive", n, 1, layouts, rank_fn,
                    round_fn=_everyone(n, reduced=True))


@register("all_to_all", "naive")
def all_to_all_naive(n: int, root: int = 0) -> Schedule:
    """Every rank sends block q of its input straight to rank q."""

    def rank_fn(r: int) -> list[list[Step]]:
        peers = [q for q in range(n) if q != r]
        rnd = [send(q, (IN, q)) for q in peers] + [recv(q, (OUT, q)) for q in peers]
        return [rnd + [copy([(OUT, r)], [(IN, r)])]]

    layouts = {IN: Layout(n, 1, n), OUT: Layout(n, 1, n)}
    return Schedule("all_to_all", "naive", n, 1, layouts, rank_fn, round_fn=_everyone(n))


@register("scatter", "naive")
def scatter_naive(n: int, root: int = 0) -> Schedule:
    """The root sends block q straight to rank q."""

    def rank_fn(r: int) -> list[list[Step]]:
        if r != root:
            return [[recv(root, (OUT, 0))]]
        rnd = [send(q, (IN, q)) for q in range(n) if q != root]
        return [rnd + [copy([(OUT, 0)], [(IN, root)])]]

    layouts = {IN: Layout(n, 1, n), OUT: Layout(1)}
    return Schedule("scatter", "naive", n, 1, layouts, rank_fn, root=root,
                    round_fn=_from_root(n, root))


@register("gather", "naive")
def gather_naive(n: int, root: int = 0) -> Schedule:
    """Every rank sends its input straight to the root."""

    def rank_fn(r: int) -> list[list[Step]]:
        if r != root:
            return [[send(root, (IN, 0))]]
        rnd = [recv(q, (OUT, q)) for q in range(n) if q != root]
        return [rnd + [copy([(OUT, root)], [(IN, 0)])]]

    layouts = {IN: Layout(1), OUT: Layout(n, 1, n)}
    return Schedule("gather", "naive", n, 1, layouts, rank_fn, root=root,
                    round_fn=_to_root(n, root))
