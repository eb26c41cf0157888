"""Prefix reductions: ``scan`` (rank r gets x0 (op) ... (op) xr) and ``exscan`` (rank r
gets x0 (op) ... (op) x{r-1}; rank 0's buffer is left as it is, where MPI leaves it
undefined).

* ``linear``: a chain.  Rank r receives the prefix of the ranks below it,
  folds its own vector in and passes the result up: p - 1 rounds of one
  message; every rank sends and receives the vector once (the fewest bytes,
  the most rounds).
* ``recursive_doubling``: the hypercube scan of MPICH.  In round k rank r
  trades its partial reduction (of its aligned block of 2^k ranks) with rank
  r XOR 2^k; a partner below contributes a whole block of lower ranks to the
  prefix.  ceil(lg p) rounds, the vector sent and received in each.

Every operand order is the ranks' order (a lower rank's data comes first),
so the results are right for operators that do not commute too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..schedule import Buf, Layout, Schedule, Step, copy, local_reduce, recv, recv_reduce, send
from . import register
from .common import Messages, lg, messages

OUT, TMP = Buf.OUT, Buf.TMP
P0, P1 = (TMP, 0), (TMP, 1)        # the partial reduction; what the partner sent


def _chain_rounds(n: int, exclusive: bool) -> Callable[[int], Messages]:
    def rounds(i: int) -> Messages:
        m = messages(i, i + 1, 1, not exclusive)
        if exclusive:   # rank i+1 folds its own vector into what it passes on
            m["local"] = np.zeros(n, np.int64)
            if i + 1 <= n - 2:
                m["local"][i + 1] = 1
        return m

    return rounds


def _chain(n: int, exclusive: bool) -> Schedule:
    def rank_fn(r: int) -> list[list[Step]]:
        rounds: list[list[Step]] = [[] for _ in range(n - 1)]
        if r >= 1:
            if not exclusive:
                rounds[r - 1] = [recv_reduce(r - 1, (OUT, 0), src_first=True)]
            elif r == n - 1:
                rounds[r - 1] = [recv(r - 1, (OUT, 0))]
            else:
                rounds[r - 1] = [recv(r - 1, P0), copy([P1], [P0]),
                                 local_reduce([P1], [(OUT, 0)]), copy([(OUT, 0)], [P0])]
        if r <= n - 2:
            carry = P1 if exclusive and r >= 1 else (OUT, 0)
            rounds[r].append(send(r + 1, carry))
        return rounds

    c = "exscan" if exclusive else "scan"
    layouts = {OUT: Layout(1), TMP: Layout(2, 1, 2)} if exclusive else {OUT: Layout(1)}
    return Schedule(c, "linear", n, max(n - 1, 0), layouts, rank_fn,
                    round_fn=_chain_rounds(n, exclusive))


def _first_set_bit(r: int) -> int:
    return (r & -r).bit_length() - 1


def _hypercube_rounds(n: int, exclusive: bool) -> Callable[[int], Messages]:
    r = np.arange(n, dtype=np.int64)

    def rounds(i: int) -> Messages:
        if i == 0:   # the partial reduction starts as a copy of the rank's own vector
            return messages(np.zeros(0, np.int64), np.zeros(0, np.int64))
        mask = 1 << (i - 1)
        p = r ^ mask
        ok = p < n
        m = messages(r[ok], p[ok])
        local = np.where(ok, np.where((r & mask) != 0, 2, 1), 0).astype(np.int64)
        if exclusive:   # the first block from below is copied, not reduced, into OUT
            first = ok & ((r & mask) != 0) & (np.bitwise_and(r, mask - 1) == 0)
            local = local - first.astype(np.int64)
        m["local"] = local
        return m

    return rounds


def _hypercube(n: int, exclusive: bool) -> Schedule:
    L = lg(n)

    def rank_fn(r: int) -> list[list[Step]]:
        if L == 0:
            return []
        # round 0 copies the vector to the partial reduction (P0); then, in round k + 1,
        # the partial goes to r XOR 2^k and the partner's arrives in the other slot, where
        # the new partial is made (so no round writes what it sends)
        rounds: list[list[Step]] = [[copy([P0], [(OUT, 0)])]]
        cur, other = P0, P1
        for k in range(L):
            mask = 1 << k
            p = r ^ mask
            if p >= n:
                rounds.append([])
                continue
            rnd = [send(p, cur), recv(p, other)]
            if r & mask:    # the partner's block is below: it comes first
                if exclusive and k == _first_set_bit(r):
                    rnd.append(copy([(OUT, 0)], [other]))
                else:
                    rnd.append(local_reduce([(OUT, 0)], [other], src_first=True))
                rnd.append(local_reduce([other], [cur]))
            else:
                rnd.append(local_reduce([other], [cur], src_first=True))
            rounds.append(rnd)
            cur, other = other, cur
        return rounds

    c = "exscan" if exclusive else "scan"
    return Schedule(c, "recursive_doubling", n, L + 1 if L else 0,
                    {OUT: Layout(1), TMP: Layout(2, 1, 2)}, rank_fn,
                    round_fn=_hypercube_rounds(n, exclusive))


@register("scan", "linear", aliases=("chain",))
def scan_linear(n: int, root: int = 0) -> Schedule:
    """Chain: the prefix passes up the ranks, each folds its vector in (p - 1 rounds)."""
    return _chain(n, False)


@register("scan", "recursive_doubling", aliases=("hypercube",))
def scan_recursive_doubling(n: int, root: int = 0) -> Schedule:
    """Hypercube: partner r XOR 2^k trades partial reductions (ceil(lg p) rounds)."""
    return _hypercube(n, False)


@register("exscan", "linear", aliases=("chain",))
def exscan_linear(n: int, root: int = 0) -> Schedule:
    """Chain: the prefix of the ranks below passes up (p - 1 rounds)."""
    return _chain(n, True)


@register("exscan", "recursive_doubling", aliases=("hypercube",))
def exscan_recursive_doubling(n: int, root: int = 0) -> Schedule:
    """Hypercube: partner r XOR 2^k trades partial reductions (ceil(lg p) rounds)."""
    return _hypercube(n, True)
