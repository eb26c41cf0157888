"""Hierarchical (two-level) schedules: rings inside groups (e.g. the ranks of a node) and
across them, one "rail" per local rank.

all_reduce
----------

With groups of ``g`` consecutive ranks (``G = p/g`` of them), the vector is cut
into ``g`` shards, each into ``G`` sub-blocks:

1. reduce-scatter inside each group (ring of g): local rank i ends with shard
   (i+1) % g reduced over its group;
2. all-reduce across groups (ring of G) among the ranks that hold the same shard;
3. all-gather inside each group (ring of g).

Only phase 2 crosses groups, and it moves 2 (G-1)/G of a shard, 1/g of the
vector: NCCL's and Horovod's two-level scheme.  Rounds: 2 (g-1) + 2 (G-1),
times ``pieces``; bytes per rank: 2 (g-1)/g n + 2 (G-1)/G n/g.

all_gather and reduce_scatter
-----------------------------
Rank r = j g + i is local rank i of group j; the blocks of local rank i in
every group, (J g + i for J < G), are rail i.

- all_gather: a ring across groups on each rail (every rank gathers its
  rail's G blocks: G-1 rounds of one block), then a ring inside each group
  passing whole rails (g-1 rounds of G blocks).
- reduce_scatter, the mirror: a ring reduce-scatter inside each group over
  rails (local rank i ends with rail i summed over its group: g-1 rounds of
  G blocks), then a ring reduce-scatter across groups on each rail (G-1
  rounds of one block).

Across groups each rank moves (G-1) blocks, so a group's link carries
(G-1)/G of the data in each direction, the least any schedule can; a flat
ring over blocks of consecutive ranks carries (p-1)/p of it through every
one of a group's two ring edges.

broadcast and reduce
--------------------
The vector is cut into g shards, shard i travels on rail i.  The root is
local rank i0 of group j0.

- broadcast: the root sends shard i to local rank i of its group (one
  round), each rail broadcasts its shard across groups on a binomial tree
  rooted at group j0 (ceil(lg G) rounds), and a ring all-gather inside each
  group assembles the vector (g-1 rounds).
- reduce: ring reduce-scatter inside each group (local rank i ends with
  shard i summed over its group; g-1 rounds), binomial reduce of each
  rail's shard to group j0 (ceil(lg G) rounds), and the local ranks of
  group j0 send their shards to the root (one round).

Each group receives (broadcast) or sends (reduce) the vector across groups
once, its g rails at once.  Flat trees numbered from a root that is not at a
group's start cross the network several times per group: a binomial
broadcast at p = 8 in groups of 2 from root 1 sends the vector three times
out of the root's group and twice into three of the other groups.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import ArgumentError
from ..schedule import (
    Buf,
    Layout,
    Schedule,
    Step,
    copy,
    empty_rounds,
    recv,
    recv_reduce,
    send,
)
from . import register
from .common import Messages, check_pieces, frozen, lg, messages, no_messages
from .tree import SEND, binomial_down, binomial_up, down_senders, up_senders

OUT, IN, TMP = Buf.OUT, Buf.IN, Buf.TMP


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def default_group(n: int) -> int:
    """The divisor of n nearest above sqrt(n): it minimises the rounds 2(g-1) + 2(p/g - 1)
    and, of the two that do, makes the (usually faster) inner level the larger."""
    return min(d for d in divisors(n) if d * d >= n)


def _cuts(P: int, G: int) -> tuple[Callable[[int, int], tuple[Buf, int, int]],
                                   Callable[[int, int, int], tuple[Buf, int]]]:
    """The two-level all_reduce's addressing: chunk (s, p, t) is sub-block t of piece p of
    shard s, so a piece of a shard is a contiguous run of G chunks and one chunk is what
    the inter-group ring moves.  (piece(s, p), chunk(s, p, t))"""

    def piece(s: int, p: int) -> tuple[Buf, int, int]:
        return (OUT, (s * P + p) * G, (s * P + p + 1) * G)

    def chunk(s: int, p: int, t: int) -> tuple[Buf, int]:
        return (OUT, (s * P + p) * G + t)

    return piece, chunk


@register("all_reduce", "hierarchical", params={"group": 0, "pieces": 1})
def all_reduce_hierarchical(n: int, root: int = 0, group: int = 0, pieces: int = 1) -> Schedule:
    """Ring reduce-scatter in groups, ring all-reduce across groups, ring all-gather in groups.

    ``group`` is the number of consecutive ranks per group (ranks per node); it
    must divide the number of ranks.  0 (the default) picks
    :func:`default_group`.
    """
    g, G = _groups("all_reduce", n, group)
    P = check_pieces("all_reduce/hierarchical", pieces)
    R = P * (2 * (g - 1) + 2 * (G - 1))

    piece, chunk = _cuts(P, G)

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        i, j, right, left, up, down = _neighbours(r, g, G)
        t = 0
        # reduce-scatter in the group: local rank i ends with shard (i+1) % g
        for k in range(g - 1):
            for p in range(P):
                rounds[t] = [send(right, piece((i - k) % g, p)),
                             recv_reduce(left, piece((i - k - 1) % g, p))]
                t += 1
        # all-reduce across groups on that shard: ring reduce-scatter, ring all-gather;
        # each sub-block is reduced at one rank and then copied, so all end bit-identical
        s = (i + 1) % g
        for k in range(G - 1):
            for p in range(P):
                rounds[t] = [send(up, chunk(s, p, (j - k) % G)),
                             recv_reduce(down, chunk(s, p, (j - k - 1) % G))]
                t += 1
        for k in range(G - 1):
            for p in range(P):
                rounds[t] = [send(up, chunk(s, p, (j + 1 - k) % G)),
                             recv(down, chunk(s, p, (j - k) % G))]
                t += 1
        # all-gather in the group
        for k in range(g - 1):
            for p in range(P):
                rounds[t] = [send(right, piece((i + 1 - k) % g, p)),
                             recv(left, piece((i - k) % g, p))]
                t += 1
        return rounds

    rounds = _phases(n, g, [(P * (g - 1), "right", G, True), (P * (G - 1), "up", 1, True),
                            (P * (G - 1), "up", 1, False), (P * (g - 1), "right", G, False)])
    return Schedule("all_reduce", "hierarchical", n, R, {OUT: Layout(g, P * G)}, rank_fn,
                    round_fn=rounds)


@register("all_reduce", "hierarchical_pipelined", params={"group": 0, "pieces": 1})
def all_reduce_hierarchical_pipelined(n: int, root: int = 0, group: int = 0,
                                      pieces: int = 1) -> Schedule:
    """``hierarchical`` with its pieces in flight at once: piece p runs the three phases
    (reduce-scatter in the group, all-reduce across groups, all-gather in the group) one
    round after piece p-1, so while one piece crosses the network the next is reduced
    and an earlier one gathered inside the group.

    Every piece moves what ``hierarchical`` moves for it, over the same rings and in the
    same order (so the same operands meet in the same order on every rank); only the
    rounds change: L = 2 (g-1) + 2 (G-1) rounds per piece, staggered by one, P + L - 1
    rounds in all against ``hierarchical``'s P L.  In the middle of the pipeline a round
    carries up to 2 (g-1) messages inside the group and 2 (G-1) across, on different
    links, so its time is the slower link's: both levels are busy together, as NCCL's
    rings keep NVLink and the NICs busy (``hierarchical`` runs its levels one after the
    other).  A stagger of one round is the least: any larger one adds rounds (latency)
    and moves the same bytes per link.  ``group`` as for ``hierarchical``.
    """
    g, G = _groups("all_reduce", n, group)
    P = check_pieces("all_reduce/hierarchical_pipelined", pieces)
    a, b = g - 1, G - 1
    L = 2 * a + 2 * b
    R = P + L - 1 if L else 0

    piece, chunk = _cuts(P, G)

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        i, j, right, left, up, down = _neighbours(r, g, G)
        s = (i + 1) % g
        for p in range(P):
            for u in range(L):
                rnd = rounds[p + u]
                if u < a:                     # reduce-scatter in the group
                    k = u
                    rnd += [send(right, piece((i - k) % g, p)),
                            recv_reduce(left, piece((i - k - 1) % g, p))]
                elif u < a + b:               # across groups: ring reduce-scatter of shard s
                    k = u - a
                    rnd += [send(up, chunk(s, p, (j - k) % G)),
                            recv_reduce(down, chunk(s, p, (j - k - 1) % G))]
                elif u < a + 2 * b:           # across groups: ring all-gather of shard s
                    k = u - a - b
                    rnd += [send(up, chunk(s, p, (j + 1 - k) % G)),
                            recv(down, chunk(s, p, (j - k) % G))]
                else:                         # all-gather in the group
                    k = u - a - 2 * b
                    rnd += [send(right, piece((i + 1 - k) % g, p)),
                            recv(left, piece((i - k) % g, p))]
        return rounds

    rr = np.arange(n, dtype=np.int64)
    peer = {"right": (rr // g) * g + (rr % g + 1) % g,
            "up": ((rr // g + 1) % G) * g + rr % g}
    phases = [(a, "right", G, True), (b, "up", 1, True), (b, "up", 1, False),
              (a, "right", G, False)]
    made: dict[tuple[int, ...], Messages] = {}

    def rounds(t: int) -> Messages:
        # the pieces in flight in round t are at local rounds u_lo..u_hi (one piece each)
        u_lo, u_hi = t - min(P - 1, t), t - max(0, t - L + 1)
        counts, start = [], 0
        for length, _, _, _ in phases:
            counts.append(max(0, min(u_hi + 1, start + length) - max(u_lo, start)))
            start += length
        key = tuple(counts)
        if key not in made:
            parts = [messages(rr, peer[where], chunks, red)
                     for c, (_, where, chunks, red) in zip(counts, phases, strict=True)
                     for _ in range(c)]
            made[key] = frozen({k: np.concatenate([m[k] for m in parts]) for k in
                                ("src", "dst", "chunks", "reduce")}) if parts else no_messages()
        return made[key]

    return Schedule("all_reduce", "hierarchical_pipelined", n, R, {OUT: Layout(g, P * G)},
                    rank_fn, round_fn=rounds)



#: pieces of the pipelined two-level all_reduce on real nodes: each piece carries at least
#: this much of a rank's shard (a piece's trip across the network must outweigh the fixed
#: cost of a round of the engine transports, about 0.5 ms: benchmarks/MULTIHOST.md) ...
PIPELINE_PIECE_BYTES = 1 << 20
#: ... and at most this many pieces are in flight (the gain is the shorter of the two
#: levels' times, which a few pieces already overlap; every piece adds a round)
PIPELINE_MAX_PIECES = 8


def pipeline_pieces(nbytes: int, group: int) -> int:
    """Pieces the communicator runs ``hierarchical_pipelined`` in for an ``nbytes`` vector
    on nodes of ``group`` ranks: a power of two, a piece of every rank's shard at least
    :data:`PIPELINE_PIECE_BYTES`, at most :data:`PIPELINE_MAX_PIECES` (1 below two pieces'
    worth).  A function of the size alone, so every rank runs the same schedule."""
    k = max(1, nbytes // max(1, group) // PIPELINE_PIECE_BYTES)
    return min(PIPELINE_MAX_PIECES, 1 << (k.bit_length() - 1))


def _groups(collective: str, n: int, group: int) -> tuple[int, int]:
    """(g, G): ranks per group (``group``, or :func:`default_group` for 0) and groups."""
    if group == 0:
        group = default_group(n)
    if not isinstance(group, int) or isinstance(group, bool) or not 1 <= group <= n \
            or n % group:
        raise ArgumentError(
            f"hierarchical {collective}: group={group} does not divide {n} ranks into equal "
            f"groups; use one of {', '.join(map(str, divisors(n)))} (or 0 to choose)")
    return group, n // group


def _phases(n: int, g: int, phases: list[tuple[int, str, int, bool]]
            ) -> Callable[[int], Messages]:
    """Closed-form rounds of a schedule made of ring phases: ``(rounds, "right"|"up",
    chunks, reduce)`` each, in order; in a phase every rank sends ``chunks`` chunks to its
    right neighbour in its group, or to the same local rank of the next group."""
    r = np.arange(n, dtype=np.int64)
    G = n // g
    peer = {"right": (r // g) * g + (r % g + 1) % g, "up": ((r // g + 1) % G) * g + r % g}
    # one set of vectors per phase, built once: every round of a phase returns the same
    # arrays, which lets the simulator recognise the round it has already costed
    made: dict[int, Messages] = {}

    def rounds(t: int) -> Messages:
        for k, (length, where, chunks, reduce) in enumerate(phases):
            if t < length:
                if k not in made:
                    made[k] = frozen(messages(r, peer[where], chunks, reduce))
                return made[k]
            t -= length
        return no_messages()

    return rounds


def _neighbours(r: int, g: int, G: int) -> tuple[int, int, int, int, int, int]:
    """(i, j, right, left, up, down) of rank r = j g + i: its local rank and group, its
    ring neighbours inside the group, and across groups on its rail."""
    i, j = r % g, r // g
    return (i, j, j * g + (i + 1) % g, j * g + (i - 1) % g, ((j + 1) % G) * g + i,
            ((j - 1) % G) * g + i)


@register("all_gather", "hierarchical", params={"group": 0, "pieces": 1})
def all_gather_hierarchical(n: int, root: int = 0, group: int = 0,
                            pieces: int = 1) -> Schedule:
    """Ring all-gather across groups on each rail, then ring all-gather of whole rails
    inside each group; (G-1) + (g-1) rounds.  ``group`` as for all_reduce."""
    g, G = _groups("all_gather", n, group)
    P = check_pieces("all_gather/hierarchical", pieces)
    R = max(1, P * ((G - 1) + (g - 1)))

    def rank_fn(r: int) -> list[list[Step]]:
        if n == 1:
            return [[copy([(OUT, 0, P)], [(IN, 0, P)])]]
        rounds = empty_rounds(R)
        i, j, right, left, up, down = _neighbours(r, g, G)
        t = 0
        own = [copy([(OUT, r * P + p)], [(IN, p)]) for p in range(P)]
        # across groups, on rail i: pass on the block received last
        for k in range(G - 1):
            for p in range(P):
                src = (IN, p) if k == 0 else (OUT, (((j - k) % G) * g + i) * P + p)
                rounds[t] = [send(up, src),
                             recv(down, (OUT, (((j - k - 1) % G) * g + i) * P + p))]
                if k == 0:
                    rounds[t].append(own[p])
                t += 1

        def rail(c: int, p: int) -> list[tuple[Buf, int]]:
            return [(OUT, (J * g + c) * P + p) for J in range(G)]

        # inside the group: pass on whole rails (G blocks a message)
        for k in range(g - 1):
            for p in range(P):
                if G == 1 and k == 0:      # nothing crossed groups: send the input
                    rounds[t] = [send(right, (IN, p)), own[p]]
                else:
                    rounds[t] = [send(right, *rail((i - k) % g, p))]
                rounds[t].append(recv(left, *rail((i - k - 1) % g, p)))
                t += 1
        return rounds

    rounds = _phases(n, g, [(P * (G - 1), "up", 1, False), (P * (g - 1), "right", G, False)])
    return Schedule("all_gather", "hierarchical", n, R,
                    {IN: Layout(1, P), OUT: Layout(n, P, n)}, rank_fn, round_fn=rounds)


@register("reduce_scatter", "hierarchical", params={"group": 0, "pieces": 1})
def reduce_scatter_hierarchical(n: int, root: int = 0, group: int = 0,
                                pieces: int = 1) -> Schedule:
    """Ring reduce-scatter of whole rails inside each group, then ring reduce-scatter
    across groups on each rail; (g-1) + (G-1) rounds.  ``group`` as for all_reduce."""
    g, G = _groups("reduce_scatter", n, group)
    P = check_pieces("reduce_scatter/hierarchical", pieces)
    R = max(1, P * ((g - 1) + (G - 1)))

    def rank_fn(r: int) -> list[list[Step]]:
        if n == 1:
            return [[copy([(OUT, 0, P)], [(IN, 0, P)])]]
        rounds = empty_rounds(R)
        i, j, right, left, up, down = _neighbours(r, g, G)

        def rail_in(c: int, p: int) -> list[tuple[Buf, int]]:
            return [(IN, (J * g + c) * P + p) for J in range(G)]

        def half(h: int, p: int) -> list[tuple[Buf, int]]:
            return [(TMP, (h * G + J) * P + p) for J in range(G)]

        # inside the group: the partial sums of rail (i-k-1) pass to the right, each rank
        # adding its own input; they alternate between TMP's two halves, and local rank i
        # ends with rail i summed over its group in half h
        t = 0
        for k in range(g - 1):
            c = (i - k - 2) % g
            for p in range(P):
                src = rail_in((i - 1) % g, p) if k == 0 else half((k - 1) % 2, p)
                dst = half(k % 2, p)
                rounds[t] = [send(right, *src), copy(dst, rail_in(c, p)),
                             recv_reduce(left, *dst)]
                t += 1
        h = (g - 2) % 2
        # across groups on rail i: block J of the rail (for rank J g + i) is reduced in
        # place in half h, passed on, and lands at its rank
        for k in range(G - 1):
            send_blk, recv_blk = (j - k - 1) % G, (j - k - 2) % G
            for p in range(P):
                if g == 1:      # nothing was summed inside the group: start from the input
                    out = (TMP, (h * G + send_blk) * P + p) if k else \
                        (IN, (send_blk * g + i) * P + p)
                    into = (TMP, (h * G + recv_blk) * P + p)
                    rounds[t] = [send(up, out), copy([into], [(IN, (recv_blk * g + i) * P + p)]),
                                 recv_reduce(down, into)]
                else:
                    rounds[t] = [send(up, (TMP, (h * G + send_blk) * P + p)),
                                 recv_reduce(down, (TMP, (h * G + recv_blk) * P + p))]
                t += 1
        for p in range(P):
            rounds[R - 1].append(copy([(OUT, p)], [(TMP, (h * G + j) * P + p)]))
        return rounds

    rounds = _phases(n, g, [(P * (g - 1), "right", G, True), (P * (G - 1), "up", 1, True)])
    return Schedule("reduce_scatter", "hierarchical", n, R,
                    {IN: Layout(n, P, n), OUT: Layout(1, P), TMP: Layout(2 * G, P, 2 * G)},
                    rank_fn, round_fn=rounds)


@register("broadcast", "hierarchical", params={"group": 0, "pieces": 1})
def broadcast_hierarchical(n: int, root: int = 0, group: int = 0,
                           pieces: int = 1) -> Schedule:
    """Scatter of shards in the root's group, binomial broadcast of each shard across
    groups on its rail, ring all-gather in every group (the root, which holds every
    shard, only passes them on: nothing is written into its vector, which is its
    input); 1 + ceil(lg G) + (g-1) rounds (times ``pieces``; the scatter only when
    g > 1).  ``group`` as for all_reduce."""
    g, G = _groups("broadcast", n, group)
    P = check_pieces("broadcast/hierarchical", pieces)
    s1, L = (1 if g > 1 else 0), lg(G)
    R = P * (s1 + L + (g - 1))
    j0 = root // g

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        i, j, right, left, _, _ = _neighbours(r, g, G)
        t = 0
        if s1:
            for p in range(P):
                if r == root:
                    rounds[t] = [send(j * g + c, (OUT, c * P + p)) for c in range(g) if c != i]
                elif j == j0:
                    rounds[t] = [recv(root, (OUT, i * P + p))]
                t += 1
        for k, kind, w in binomial_down((j - j0) % G, G):
            peer = ((w + j0) % G) * g + i
            for p in range(P):
                ref = (OUT, i * P + p)
                rounds[t + k * P + p].append(send(peer, ref) if kind == SEND else
                                             recv(peer, ref))
        t += L * P
        # the root holds every shard already: it only passes them on (its vector is its
        # input, which comm.broadcast takes read-only), and its left neighbour sends it none
        for k in range(g - 1):
            for p in range(P):
                if right != root:
                    rounds[t].append(send(right, (OUT, ((i - k) % g) * P + p)))
                if r != root:
                    rounds[t].append(recv(left, (OUT, ((i - k - 1) % g) * P + p)))
                t += 1
        return rounds

    whole = _phases(n, g, [(P * (g - 1), "right", 1, False)])(0)
    keep = whole["dst"] != root
    ring = frozen({k: v[keep] for k, v in whole.items()})
    rails = np.arange(g, dtype=np.int64)

    def rounds(t: int) -> Messages:
        if t < s1 * P:   # the root hands shard c to local rank c of its group
            return messages(root, j0 * g + rails[rails != root % g])
        t -= s1 * P
        if t < L * P:    # binomial broadcast across groups, every rail at once
            w = down_senders(t // P, G)
            d = 1 << (L - 1 - t // P)
            src = ((w + j0) % G)[:, None] * g + rails
            dst = ((w + d + j0) % G)[:, None] * g + rails
            return messages(src, dst)
        return ring   # the ring's rounds (none when g == 1)

    return Schedule("broadcast", "hierarchical", n, R, {OUT: Layout(g, P)}, rank_fn,
                    root=root, round_fn=rounds)


@register("reduce", "hierarchical", params={"group": 0, "pieces": 1})
def reduce_hierarchical(n: int, root: int = 0, group: int = 0, pieces: int = 1) -> Schedule:
    """Ring reduce-scatter in every group, binomial reduce of each shard across groups on
    its rail, gather of the shards at the root; (g-1) + ceil(lg G) + 1 rounds (times
    ``pieces``; the gather only when g > 1).  ``group`` as for all_reduce."""
    g, G = _groups("reduce", n, group)
    P = check_pieces("reduce/hierarchical", pieces)
    s3, L = (1 if g > 1 else 0), lg(G)
    R = max(1, P * ((g - 1) + L + s3))
    j0 = root // g

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        i, j, right, left, _, _ = _neighbours(r, g, G)
        # OUT is every rank's work area (the root's result; scratch elsewhere)
        t = 0
        for k in range(g - 1):
            c = (i - k - 2) % g
            for p in range(P):
                src = (IN if k == 0 else OUT, ((i - k - 1) % g) * P + p)
                dst = (OUT, c * P + p)
                rounds[t] = [send(right, src), copy([dst], [(IN, c * P + p)]),
                             recv_reduce(left, dst)]
                t += 1
        # shard i, summed over the group, is in OUT (g > 1) or still only in IN (g = 1)
        held = g > 1
        for k, kind, w in binomial_up((j - j0) % G, G):
            peer = ((w + j0) % G) * g + i
            for p in range(P):
                ref = (OUT, i * P + p)
                if kind == SEND:
                    rounds[t + k * P + p].append(send(peer, ref if held else (IN, i * P + p)))
                else:
                    if not held:
                        rounds[t + k * P + p].append(copy([ref], [(IN, i * P + p)]))
                    rounds[t + k * P + p].append(recv_reduce(peer, ref))
            if kind != SEND:
                held = True
        t += L * P
        if s3 and j == j0:
            for p in range(P):
                if r == root:
                    rounds[t] = [recv(j * g + c, (OUT, c * P + p)) for c in range(g) if c != i]
                else:
                    rounds[t] = [send(root, (OUT, i * P + p))]
                t += 1
        if n == 1:
            rounds[0].append(copy([(OUT, 0, P)], [(IN, 0, P)]))
        return rounds

    ring = _phases(n, g, [(P * (g - 1), "right", 1, True)])
    rails = np.arange(g, dtype=np.int64)

    def rounds(t: int) -> Messages:
        if t < P * (g - 1):
            return ring(t)
        t -= P * (g - 1)
        if t < L * P:    # binomial reduce across groups, every rail at once
            k = t // P
            w = up_senders(k, G)
            src = ((w + j0) % G)[:, None] * g + rails
            dst = ((w - (1 << k) + j0) % G)[:, None] * g + rails
            return messages(src, dst, 1, True)
        if s3 and t - L * P < P:   # the root's group hands its shards to the root
            return messages(j0 * g + rails[rails != root % g], root)
        return no_messages()

    return Schedule("reduce", "hierarchical", n, R, {IN: Layout(g, P), OUT: Layout(g, P)},
                    rank_fn, root=root, round_fn=rounds)
