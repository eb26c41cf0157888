"""Bruck's algorithms (Bruck et al. 1997; Thakur, Rabenseifner & Gropp 2005).

``ceil(lg p)`` rounds for any ``p``, power of two or not: in round ``k`` rank
``r`` talks to ``r - 2^k`` and ``r + 2^k``.  The latency-optimal choice for
short messages.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..schedule import Buf, Layout, Ref, Schedule, Step, copy, empty_rounds, recv, send
from . import register
from .common import Messages, lg, messages, no_messages, span


def _shifts(n: int, chunks: Callable[[int], int]) -> Callable[[int], Messages]:
    """Round k of a Bruck algorithm: every rank r sends ``chunks(k)`` chunks to r - 2^k."""
    r = np.arange(n, dtype=np.int64)

    def rounds(k: int) -> Messages:
        return no_messages() if n == 1 else messages(r, (r - (1 << k)) % n, chunks(k))

    return rounds


def _with_bit(n: int, k: int) -> int:
    """How many positions 1..n-1 have bit k set (the blocks round k of all-to-all moves)."""
    d = 1 << k
    return sum(min(d, n - base) for base in range(d, n, 2 * d))

IN, OUT, TMP = Buf.IN, Buf.OUT, Buf.TMP


@register("all_gather", "bruck")
def all_gather_bruck(n: int, root: int = 0) -> Schedule:
    """Bruck all-gather: ceil(lg p) rounds, each doubling the run of blocks a rank holds.

    Before round k rank r holds blocks r, r+1, ..., r+2^k-1 (mod p); it sends
    them to r-2^k and gets r+2^k, ... from r+2^k (the last round only what is
    missing).  Blocks land at their final places in OUT, so there is none of
    the original's final rotation.
    """
    L = lg(n)
    R = max(1, L)

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        rounds[0].append(copy([(OUT, r)], [(IN, 0)]))
        for k in range(L):
            d = 1 << k
            cnt = min(d, n - d)
            src = [(IN, 0, 1)] if k == 0 else span(OUT, r, cnt, n)
            rounds[k] += [send((r - d) % n, *src), recv((r + d) % n, *span(OUT, r + d, cnt, n))]
        return rounds

    return Schedule("all_gather", "bruck", n, R, {IN: Layout(1), OUT: Layout(n, 1, n)}, rank_fn,
                    round_fn=_shifts(n, lambda k: min(1 << k, n - (1 << k))))


@register("all_to_all", "bruck")
def all_to_all_bruck(n: int, root: int = 0) -> Schedule:
    """Bruck all-to-all: ceil(lg p) rounds, each moving about half the blocks 2^k ranks on.

    Number the blocks of rank r by position j: position j holds the block for
    rank r - j.  In round k every block whose position has bit k set moves
    from rank x to x - 2^k, keeping its position; after the last round the
    block at position j of rank r came from rank r + j.  Each round sends
    (p/2 for a power of two) blocks, so lg p rounds of n/2 bytes against p-1
    rounds of n/p for pairwise exchange.

    A block is read wherever it is (IN before its first move) and written to
    OUT on its last move, so no rotation is copied; between moves it
    alternates between two halves of TMP, so no round receives into a block
    it sends.
    """
    L = lg(n)
    R = max(1, L)

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        rounds[0].append(copy([(OUT, r)], [(IN, r)]))
        for k in range(L):
            d = 1 << k
            src: list[Ref | tuple[Buf, int]] = []
            dst: list[Ref | tuple[Buf, int]] = []
            for base in range(d, n, 2 * d):
                for j in range(base, min(base + d, n)):   # the positions with bit k set
                    moved = (j & (d - 1)).bit_count()       # moves position j made so far
                    src.append((IN, (r - j) % n) if moved == 0
                               else (TMP, (moved - 1) % 2 * n + j))
                    dst.append((OUT, (r + j) % n) if j < 2 * d   # bit k is its last: arrived
                               else (TMP, moved % 2 * n + j))
            rounds[k] += [send((r - d) % n, *src), recv((r + d) % n, *dst)]
        return rounds

    layouts = {IN: Layout(n, 1, n), OUT: Layout(n, 1, n), TMP: Layout(2 * n, 1, 2 * n)}
    return Schedule("all_to_all", "bruck", n, R, layouts, rank_fn,
                    round_fn=_shifts(n, lambda k: _with_bit(n, k)))
