"""Ring algorithms (Patarasuk & Yuan 2009; the seeds' "canonical algorithm").

Ranks form a ring ``r -> r+1``.  Every round each rank sends one piece to
its right neighbour and receives one from its left, so every link is busy
and each rank moves ``(p-1)/p`` of the data per phase: bandwidth-optimal,
with ``p-1`` rounds per phase of latency.

``pieces`` (default 1) cuts every block into that many pieces, each carried
in a round of its own: more rounds (alpha) for the same bytes (beta), and a
pipeline the executor overlaps piece by piece.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..schedule import Buf, Layout, Schedule, Step, copy, empty_rounds, recv, recv_reduce, send
from . import register
from .common import Messages, check_pieces, frozen, messages


def ring_rounds(n: int, reducing_rounds: int) -> Callable[[int], Messages]:
    """Closed form of a ring's rounds: every rank sends one chunk to its right
    neighbour; the first ``reducing_rounds`` rounds are reduced on arrival."""
    src = np.arange(n, dtype=np.int64)
    # two sets of vectors for all the rounds (see common.frozen)
    reducing, passing = (frozen(messages(src, (src + 1) % n, 1, flag)) for flag in (True, False))

    def rounds(i: int) -> Messages:
        if n == 1:
            return messages(src[:0], src[:0])
        return reducing if i < reducing_rounds else passing

    return rounds

OUT, IN, TMP = Buf.OUT, Buf.IN, Buf.TMP


@register("all_reduce", "ring", params={"pieces": 1})
def all_reduce_ring(n: int, root: int = 0, pieces: int = 1) -> Schedule:
    """Ring all-reduce: ring reduce-scatter, then ring all-gather; 2(p-1) rounds."""
    P = check_pieces("all_reduce/ring", pieces)
    R = 2 * (n - 1) * P

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        right, left = (r + 1) % n, (r - 1) % n
        t = 0
        # reduce-scatter: after step k, rank r holds block (r-k-1) reduced over k+2 ranks;
        # after p-1 steps it holds block (r+1) % p fully reduced.
        for k in range(n - 1):
            for p in range(P):
                rounds[t] = [send(right, (OUT, ((r - k) % n) * P + p)),
                             recv_reduce(left, (OUT, ((r - k - 1) % n) * P + p))]
                t += 1
        # all-gather: pass the reduced blocks on around the ring.
        for k in range(n - 1):
            for p in range(P):
                rounds[t] = [send(right, (OUT, ((r + 1 - k) % n) * P + p)),
                             recv(left, (OUT, ((r - k) % n) * P + p))]
                t += 1
        return rounds

    return Schedule("all_reduce", "ring", n, R, {OUT: Layout(n, P)}, rank_fn,
                    round_fn=ring_rounds(n, (n - 1) * P))


@register("all_gather", "ring", params={"pieces": 1})
def all_gather_ring(n: int, root: int = 0, pieces: int = 1) -> Schedule:
    """Ring all-gather: p-1 rounds, each passing on the block received last."""
    P = check_pieces("all_gather/ring", pieces)
    R = max(1, (n - 1) * P)

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        if n == 1:
            return [[copy([(OUT, 0, P)], [(IN, 0, P)])]]
        right, left = (r + 1) % n, (r - 1) % n
        t = 0
        for k in range(n - 1):
            for p in range(P):
                # step 0 sends the rank's own input; later steps forward what arrived.
                src = (IN, p) if k == 0 else (OUT, ((r - k) % n) * P + p)
                rounds[t] = [send(right, src), recv(left, (OUT, ((r - k - 1) % n) * P + p))]
                if k == 0:
                    rounds[t].append(copy([(OUT, r * P + p)], [(IN, p)]))
                t += 1
        return rounds

    return Schedule("all_gather", "ring", n, R, {IN: Layout(1, P), OUT: Layout(n, P, n)},
                    rank_fn, round_fn=ring_rounds(n, 0))


@register("reduce_scatter", "ring", params={"pieces": 1})
def reduce_scatter_ring(n: int, root: int = 0, pieces: int = 1) -> Schedule:
    """Ring reduce-scatter: p-1 rounds; rank r ends with block r reduced over all ranks."""
    P = check_pieces("reduce_scatter/ring", pieces)
    R = max(1, (n - 1) * P)

    def rank_fn(r: int) -> list[list[Step]]:
        if n == 1:
            return [[copy([(OUT, 0, P)], [(IN, 0, P)])]]
        rounds = empty_rounds(R)
        right, left = (r + 1) % n, (r - 1) % n
        t = 0
        # At step k rank r sends its partial of block (r-k-1) and receives block (r-k-2),
        # adding its own input; the partials alternate between the two halves of TMP so a
        # round never receives into what it sends. The last step lands in OUT.
        for k in range(n - 1):
            blk = (r - k - 2) % n
            for p in range(P):
                src = (IN, ((r - 1) % n) * P + p) if k == 0 else (TMP, ((k - 1) % 2) * P + p)
                dst = (OUT, p) if k == n - 2 else (TMP, (k % 2) * P + p)
                rounds[t] = [send(right, src), copy([dst], [(IN, blk * P + p)]),
                             recv_reduce(left, dst)]
                t += 1
        return rounds

    layouts = {IN: Layout(n, P, n), OUT: Layout(1, P)}
    if n > 2:
        layouts[TMP] = Layout(2, P, 2)
    return Schedule("reduce_scatter", "ring", n, R, layouts, rank_fn,
                    round_fn=ring_rounds(n, R))
