"""Direct algorithms: every message goes straight from the rank that has the data
to the rank that needs it (no forwarding).

``direct`` all-reduce is the shared-memory style of one-host libraries: each
rank reduces its own 1/p of the vector from every peer, then hands it to every
peer, in 2 rounds of p-1 messages.  Pairwise exchange (reduce-scatter,
all-to-all) spreads the same messages over p-1 rounds of one message each, so
that in each round every rank sends to one peer and receives from one peer.
Linear scatter/gather is the root serving the ranks one at a time.
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
    empty_rounds,
    local_reduce,
    recv,
    recv_reduce,
    send,
)
from . import naive, register
from .common import Messages, all_pairs, messages, no_messages

IN, OUT, TMP = Buf.IN, Buf.OUT, Buf.TMP


@register("all_reduce", "direct")
def all_reduce_direct(n: int, root: int = 0) -> Schedule:
    """Each rank reduces block r from every peer, then sends it to every peer: 2 rounds.

    Like a ring it moves 2 (p-1)/p n bytes per rank, in 2 rounds instead of
    2 (p-1), at the price of p-1 messages per round.  Block r is reduced at rank
    r alone (peers in a fixed order) and then copied, so every rank ends
    bit-identical.
    """
    R = 2 if n > 1 else 0

    def rank_fn(r: int) -> list[list[Step]]:
        if n == 1:
            return []
        ahead = [(r + i) % n for i in range(1, n)]    # send to r+1, r+2, ... (no hot spot)
        behind = [(r - i) % n for i in range(1, n)]   # receive from r-1, r-2, ...
        # reduce-scatter
        rs = [send(q, (OUT, q)) for q in ahead] + [recv_reduce(q, (OUT, r)) for q in behind]
        # all-gather
        ag = [send(q, (OUT, r)) for q in ahead] + [recv(q, (OUT, q)) for q in behind]
        return [rs, ag]

    def rounds(i: int) -> Messages:
        # round 0 reduces block q at rank q, round 1 hands it out
        src, dst = all_pairs(n)
        return messages(src, dst, 1, i == 0)

    return Schedule("all_reduce", "direct", n, R, {OUT: Layout(n)}, rank_fn, round_fn=rounds)


def _pairwise(n: int, reduce: bool) -> Callable[[int], Messages]:
    """Round k-1 of pairwise exchange: every rank r sends one block to r+k."""
    r = np.arange(n, dtype=np.int64)

    def rounds(i: int) -> Messages:
        if n == 1:
            return no_messages()
        return messages(r, (r + i + 1) % n, 1, reduce)

    return rounds


@register("reduce_scatter", "pairwise")
def reduce_scatter_pairwise(n: int, root: int = 0) -> Schedule:
    """Pairwise exchange: in round k rank r sends block r+k to r+k and reduces block r
    from r-k.  p-1 rounds, (p-1)/p of the input sent per rank."""
    R = max(1, n - 1)

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        rounds[0].append(copy([(OUT, 0)], [(IN, r)]))
        for k in range(1, n):
            dst, src = (r + k) % n, (r - k) % n
            rounds[k - 1] += [send(dst, (IN, dst)), recv_reduce(src, (OUT, 0))]
        return rounds

    return Schedule("reduce_scatter", "pairwise", n, R, {IN: Layout(n, 1, n), OUT: Layout(1)},
                    rank_fn, round_fn=_pairwise(n, True))


@register("all_to_all", "pairwise")
def all_to_all_pairwise(n: int, root: int = 0) -> Schedule:
    """Pairwise exchange: in round k rank r sends block r+k to r+k and receives from r-k.

    p-1 rounds of one block each: the long-message all-to-all of MPICH.
    """
    R = max(1, n - 1)

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        rounds[0].append(copy([(OUT, r)], [(IN, r)]))
        for k in range(1, n):
            dst, src = (r + k) % n, (r - k) % n
            rounds[k - 1] += [send(dst, (IN, dst)), recv(src, (OUT, src))]
        return rounds

    layouts = {IN: Layout(n, 1, n), OUT: Layout(n, 1, n)}
    return Schedule("all_to_all", "pairwise", n, R, layouts, rank_fn,
                    round_fn=_pairwise(n, False))


@register("scatter", "linear")
def scatter_linear(n: int, root: int = 0) -> Schedule:
    """The root sends block root+k to rank root+k in round k-1: p-1 rounds."""
    R = max(1, n - 1)

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        v = (r - root) % n
        if v:
            rounds[v - 1].append(recv(root, (OUT, 0)))
            return rounds
        rounds[0].append(copy([(OUT, 0)], [(IN, root)]))
        for w in range(1, n):
            q = (w + root) % n
            rounds[w - 1].append(send(q, (IN, q)))
        return rounds

    def rounds(i: int) -> Messages:
        return no_messages() if n == 1 else messages(root, (root + i + 1) % n)

    return Schedule("scatter", "linear", n, R, {IN: Layout(n, 1, n), OUT: Layout(1)}, rank_fn,
                    root=root, round_fn=rounds)


@register("gather", "linear")
def gather_linear(n: int, root: int = 0) -> Schedule:
    """Rank root+k sends its block to the root in round k-1: p-1 rounds."""
    R = max(1, n - 1)

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        v = (r - root) % n
        if v:
            rounds[v - 1].append(send(root, (IN, 0)))
            return rounds
        rounds[0].append(copy([(OUT, root)], [(IN, 0)]))
        for w in range(1, n):
            q = (w + root) % n
            rounds[w - 1].append(recv(q, (OUT, q)))
        return rounds

    def rounds(i: int) -> Messages:
        return no_messages() if n == 1 else messages((root + i + 1) % n, root)

    return Schedule("gather", "linear", n, R, {IN: Layout(1), OUT: Layout(n, 1, n)}, rank_fn,
                    root=root, round_fn=rounds)


# --- one-round direct exchange: what the shared-memory transport runs fused -------------------
#
# These are the naive schedules (everyone sends each peer what it needs, in one round,
# reductions in rank order), under the names the tuner chooses.  On shared memory the
# transport runs them fused (ringlet.transport.fused): a rank publishes its data once and
# every peer reads it in place, so "p-1 messages" cost one copy in and one read each.
# The naive names stay the oracle the tests compare against, always run step by step.


def _renamed(s: Schedule, name: str) -> Schedule:
    s.algorithm = name
    return s


@register("all_reduce", "oneshot")
def all_reduce_oneshot(n: int, root: int = 0) -> Schedule:
    """One round: every rank gets every vector and reduces all p in rank order (latency).

    Every rank computes x0 (op) x1 (op) ... (op) x{p-1} in that order, so all
    ranks hold the same bits.  The reduction is local, after the round, so the
    round never overwrites the vector it sends.
    """
    R = 2 if n > 1 else 0

    def rank_fn(r: int) -> list[list[Step]]:
        if n == 1:
            return []
        peers = [q for q in range(n) if q != r]
        exchange = [send(q, (OUT, 0)) for q in peers] + [recv(q, (TMP, q)) for q in peers]
        # local: OUT = TMP[0] (op) TMP[1] (op) ..., with this rank's own vector in TMP[r]
        combine = [copy([(TMP, r)], [(OUT, 0)]), copy([(OUT, 0)], [(TMP, 0)])]
        combine += [local_reduce([(OUT, 0)], [(TMP, q)]) for q in range(1, n)]
        return [exchange, combine]

    def rounds(i: int) -> Messages:
        if i == 0:
            return messages(*all_pairs(n))
        m = no_messages()   # round 1: every rank reduces the n - 1 vectors it received
        m["local"] = np.full(n, n - 1, np.int64)
        return m

    return Schedule("all_reduce", "oneshot", n, R, {OUT: Layout(1), TMP: Layout(n, 1, n)},
                    rank_fn, round_fn=rounds)


@register("broadcast", "direct")
def broadcast_direct(n: int, root: int = 0) -> Schedule:
    """One round: the root's vector goes straight to every rank."""
    return _renamed(naive.broadcast_naive(n, root), "direct")


@register("all_gather", "direct")
def all_gather_direct(n: int, root: int = 0) -> Schedule:
    """One round: every rank's block goes straight to every rank."""
    return _renamed(naive.all_gather_naive(n, root), "direct")


@register("reduce_scatter", "direct")
def reduce_scatter_direct(n: int, root: int = 0) -> Schedule:
    """One round: block q of every rank goes to rank q, which reduces them in rank order."""
    return _renamed(naive.reduce_scatter_naive(n, root), "direct")


@register("all_to_all", "direct")
def all_to_all_direct(n: int, root: int = 0) -> Schedule:
    """One round: block q of every rank goes straight to rank q."""
    return _renamed(naive.all_to_all_naive(n, root), "direct")
