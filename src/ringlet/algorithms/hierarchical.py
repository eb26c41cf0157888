"""Hierarchical all-reduce: rings inside groups (e.g. the ranks of a node) and across them.

With groups of ``g`` consecutive ranks (``G = p/g`` of them), the vector is cut
into ``g`` shards, each into ``G`` sub-blocks:

1. reduce-scatter inside each group (ring of g): local rank i ends with shard
   (i+1) % g reduced over its group;
2. all-reduce across groups (ring of G) among the ranks that hold the same shard;
3. all-gather inside each group (ring of g).

Only phase 2 crosses groups, and it moves 2 (G-1)/G of a shard, 1/g of the
vector: NCCL's and Horovod's two-level scheme.  Rounds: 2 (g-1) + 2 (G-1),
times ``pieces``; bytes per rank: 2 (g-1)/g n + 2 (G-1)/G n/g.
"""

from __future__ import annotations

from ..errors import ArgumentError
from ..schedule import Buf, Layout, Schedule, Step, empty_rounds, recv, recv_reduce, send
from . import register
from .common import check_pieces

OUT = Buf.OUT


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def default_group(n: int) -> int:
    """The divisor of n nearest above sqrt(n): it minimises the rounds 2(g-1) + 2(p/g - 1)
    and, of the two that do, makes the (usually faster) inner level the larger."""
    return min(d for d in divisors(n) if d * d >= n)


@register("all_reduce", "hierarchical", params={"group": 0, "pieces": 1})
def all_reduce_hierarchical(n: int, root: int = 0, group: int = 0, pieces: int = 1) -> Schedule:
    """Ring reduce-scatter in groups, ring all-reduce across groups, ring all-gather in groups.

    ``group`` is the number of consecutive ranks per group (ranks per node); it
    must divide the number of ranks.  0 (the default) picks
    :func:`default_group`.
    """
    if group == 0:
        group = default_group(n)
    if not isinstance(group, int) or isinstance(group, bool) or not 1 <= group <= n \
            or n % group:
        raise ArgumentError(
            f"hierarchical all_reduce: group={group} does not divide {n} ranks into equal "
            f"groups; use one of {', '.join(map(str, divisors(n)))} (or 0 to choose)")
    g, G, P = group, n // group, check_pieces("all_reduce/hierarchical", pieces)
    R = P * (2 * (g - 1) + 2 * (G - 1))

    # Chunk (s, p, t) = sub-block t of piece p of shard s, so a piece of a shard is a
    # contiguous run of G chunks and one chunk is what the inter-group ring moves.
    def piece(s: int, p: int) -> tuple[Buf, int, int]:
        return (OUT, (s * P + p) * G, (s * P + p + 1) * G)

    def chunk(s: int, p: int, t: int) -> tuple[Buf, int]:
        return (OUT, (s * P + p) * G + t)

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        i, j = r % g, r // g               # local rank, group
        right, left = r - i + (i + 1) % g, r - i + (i - 1) % g
        up, down = ((j + 1) % G) * g + i, ((j - 1) % G) * g + i
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

    return Schedule("all_reduce", "hierarchical", n, R, {OUT: Layout(g, P * G)}, rank_fn)

