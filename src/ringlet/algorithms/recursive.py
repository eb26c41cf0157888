"""Recursive doubling and halving (Thakur, Rabenseifner & Gropp 2005, as in MPICH).

On ``p' = 2^k`` ranks, round ``s`` pairs rank ``x`` with ``x XOR d``: distances
grow 1, 2, 4... (recursive doubling: the data each pair owns doubles) or shrink
p'/2, p'/4, ..., 1 (recursive halving: the data each rank is responsible for
halves).  ``lg p'`` rounds.

Any other ``p`` is made a power of two the standard way: with
``p' = 2^floor(lg p)`` and ``rem = p - p'``, the first ``2 rem`` ranks pair up
``(2i, 2i+1)`` and the odd one folds its data into the even one before the
power-of-two part (one round) and gets the result back after it (one round).
The survivors are renumbered ``0..p'-1``: new rank ``x`` is old rank
``old(x) = 2x`` for ``x < rem`` and ``x + rem`` after, and stands for old
ranks ``[old(x), old(x+1))``, so any aligned group of new ranks stands for a
contiguous run of old ranks (and of their blocks, for all-gather and
reduce-scatter).  Rooted collectives number ranks relative to the root, so the
root always survives.
"""

from __future__ import annotations

import numpy as np

from ..schedule import (
    Buf,
    Layout,
    Ref,
    Schedule,
    Step,
    copy,
    empty_rounds,
    local_reduce,
    recv,
    recv_reduce,
    send,
)
from . import register
from .common import Messages, lowbit, messages, no_messages

IN, OUT, TMP = Buf.IN, Buf.OUT, Buf.TMP


class Fold:
    """The power-of-two fix-up for p ranks: p' = 2^floor(lg p), rem = p - p'."""

    def __init__(self, n: int) -> None:
        self.pof2 = 1 << (n.bit_length() - 1)
        self.rem = n - self.pof2
        self.steps = self.pof2.bit_length() - 1    # lg p': rounds of the power-of-two part

    def new(self, v: int) -> int:
        """New rank of old rank v; -1 if v folds away (the odd one of a pair)."""
        if v < 2 * self.rem:
            return -1 if v % 2 else v // 2
        return v - self.rem

    def old(self, x: int) -> int:
        """Old rank of new rank x: also the first of the old ranks x stands for
        (``old(p')`` is p, the end of the last run)."""
        return 2 * x if x < self.rem else x + self.rem

    def olds(self, x: np.ndarray) -> np.ndarray:
        """:meth:`old` of every new rank in ``x``."""
        return np.where(x < self.rem, 2 * x, x + self.rem)

    @property
    def survivors(self) -> np.ndarray:
        """New ranks 0..p'-1."""
        return np.arange(self.pof2, dtype=np.int64)

    def fold_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(even, odd) old ranks of the first rem pairs."""
        even = np.arange(0, 2 * self.rem, 2, dtype=np.int64)
        return even, even + 1


def _halve(lo: int, hi: int, x: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Split [lo, hi) in two: (the half holding x, the other half)."""
    mid = (lo + hi) // 2
    return ((lo, mid), (mid, hi)) if x < mid else ((mid, hi), (lo, mid))


# --- all-reduce ----------------------------------------------------------------------


@register("all_reduce", "recursive_doubling")
def all_reduce_recursive_doubling(n: int, root: int = 0) -> Schedule:
    """Recursive-doubling all-reduce: partners exchange and reduce the whole vector.

    lg p rounds of n bytes on a power of two (two more otherwise).  Both
    partners compute the same expression, the lower rank's operand on the left
    (``src_first`` on the lower one's reduction), so every rank ends
    bit-identical even where the ops do not commute bit for bit (MIN/MAX of
    +0.0 and -0.0, NaNs with different payloads).
    """
    f = Fold(n)
    k = f.steps
    # The vector alternates between OUT and TMP, so no round writes what it sends; when
    # it ends in TMP it is copied back in the unfold round, or in a last local round.
    R = k + (2 if f.rem else k % 2)

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        x, t = f.new(r), 0
        if f.rem:
            # fold: the odd rank of each of the first rem pairs hands its vector over
            if r < 2 * f.rem:
                rounds[0].append(send(r - 1, (OUT, 0)) if x < 0 else recv_reduce(r + 1, (OUT, 0)))
            t = 1
        if x < 0:
            # unfold: the result comes back
            rounds[R - 1].append(recv(r - 1, (OUT, 0)))
            return rounds
        # doubling: receive the partner's vector into the other buffer and reduce ours into
        # it; both partners compute (lower new rank's vector) (op) (higher one's)
        cur, other = OUT, TMP
        for s in range(k):
            peer = f.old(x ^ (1 << s))
            lower = not x >> s & 1
            rounds[t + s] = [send(peer, (cur, 0)), recv(peer, (other, 0)),
                             local_reduce([(other, 0)], [(cur, 0)], src_first=lower)]
            cur, other = other, cur
        if f.rem and r < 2 * f.rem:
            rounds[R - 1].append(send(r + 1, (cur, 0)))
        if cur is TMP:
            rounds[R - 1].append(copy([(OUT, 0)], [(TMP, 0)]))
        return rounds

    def rounds(i: int) -> Messages:
        even, odd = f.fold_pairs()
        if f.rem and i == 0:        # fold, reduced on arrival
            return messages(odd, even, 1, True)
        if f.rem and i == R - 1:    # unfold
            return messages(even, odd)
        s = i - (1 if f.rem else 0)
        if s >= k:                  # the last local copy back to OUT
            return no_messages()
        x = f.survivors   # doubling (received into the other buffer, reduced locally)
        m = messages(f.olds(x), f.olds(x ^ (1 << s)))
        m["local"] = np.zeros(n, np.int64)
        m["local"][m["src"]] = 1
        return m

    return Schedule("all_reduce", "recursive_doubling", n, R, {OUT: Layout(1), TMP: Layout(1)},
                    rank_fn, round_fn=rounds)


@register("all_reduce", "rabenseifner")
def all_reduce_rabenseifner(n: int, root: int = 0) -> Schedule:
    """Rabenseifner all-reduce: recursive-halving reduce-scatter, recursive-doubling all-gather.

    2 lg p rounds and 2 (p-1)/p n bytes per rank on a power of two (the fold
    adds two rounds and n bytes otherwise).  Each block is reduced at one rank
    only and then copied, so every rank ends bit-identical.
    """
    f = Fold(n)
    k = f.steps
    R = 2 * k + (2 if f.rem else 0)

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        x, t = f.new(r), 0
        whole: Ref = (OUT, 0, f.pof2)
        if f.rem:
            # fold the odd rank of each of the first rem pairs into the even one
            if r < 2 * f.rem:
                rounds[0].append(send(r - 1, whole) if x < 0 else recv_reduce(r + 1, whole))
            t = 1
        if x >= 0:
            # reduce-scatter: keep the half of the range that holds block x, send the other;
            # after lg p' rounds new rank x holds block x reduced over everyone
            lo, hi = 0, f.pof2
            for s in range(k):
                peer = f.old(x ^ (f.pof2 >> (s + 1)))
                (lo, hi), (glo, ghi) = _halve(lo, hi, x)
                rounds[t] = [send(peer, (OUT, glo, ghi)), recv_reduce(peer, (OUT, lo, hi))]
                t += 1
            # all-gather: partners swap the aligned runs of blocks they hold
            for s in range(k):
                d = 1 << s
                mine, theirs = x & -d, (x ^ d) & -d
                rounds[t] = [send(f.old(x ^ d), (OUT, mine, mine + d)),
                             recv(f.old(x ^ d), (OUT, theirs, theirs + d))]
                t += 1
        if f.rem and r < 2 * f.rem:
            # unfold
            rounds[R - 1].append(recv(r - 1, whole) if x < 0 else send(r + 1, whole))
        return rounds

    def rounds(i: int) -> Messages:
        even, odd = f.fold_pairs()
        if f.rem and i == 0:
            return messages(odd, even, f.pof2, True)
        if f.rem and i == R - 1:
            return messages(even, odd, f.pof2)
        x, s = f.survivors, i - (1 if f.rem else 0)
        if s < k:   # reduce-scatter: half of what is left goes to the partner
            d = f.pof2 >> (s + 1)
            return messages(f.olds(x), f.olds(x ^ d), d, True)
        d = 1 << (s - k)   # all-gather: the aligned run of d blocks
        return messages(f.olds(x), f.olds(x ^ d), d)

    return Schedule("all_reduce", "rabenseifner", n, R, {OUT: Layout(f.pof2)}, rank_fn,
                    round_fn=rounds)


# --- reduce --------------------------------------------------------------------------


@register("reduce", "rabenseifner", aliases=("reduce_scatter_gather",))
def reduce_rabenseifner(n: int, root: int = 0) -> Schedule:
    """Rabenseifner reduce: recursive-halving reduce-scatter, then binomial gather to the root.

    2 lg p rounds on a power of two (one more otherwise); the root receives
    2 (p-1)/p n bytes and reduces (p-1)/p n, against lg p n for a binomial tree.
    Ranks are numbered relative to the root, so the root always survives the fold.
    """
    f = Fold(n)
    k = f.steps
    R = max(1, 2 * k + (1 if f.rem else 0))

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        v = (r - root) % n
        x, t = f.new(v), 0

        def phys(w: int) -> int:
            return (w + root) % n

        # The root accumulates in OUT, everyone else in TMP; until a rank has received
        # something its partial vector is its own input.
        acc = OUT if v == 0 else TMP
        cur = IN
        if n == 1:
            rounds[0].append(copy([(OUT, 0, 1)], [(IN, 0, 1)]))
            return rounds
        if f.rem:
            # fold (relative ranks: the odd one of each of the first rem pairs folds away)
            if x < 0:
                rounds[0].append(send(phys(v - 1), (IN, 0, f.pof2)))
            elif v < 2 * f.rem:
                rounds[0] += [copy([(acc, 0, f.pof2)], [(IN, 0, f.pof2)]),
                              recv_reduce(phys(v + 1), (acc, 0, f.pof2))]
                cur = acc
            t = 1
        if x < 0:
            return rounds
        # reduce-scatter (recursive halving): new rank x ends with block x
        lo, hi = 0, f.pof2
        for s in range(k):
            peer = phys(f.old(x ^ (f.pof2 >> (s + 1))))
            (lo, hi), (glo, ghi) = _halve(lo, hi, x)
            rounds[t] = [send(peer, (cur, glo, ghi))]
            if cur is IN:
                rounds[t].append(copy([(acc, lo, hi)], [(IN, lo, hi)]))
            rounds[t].append(recv_reduce(peer, (acc, lo, hi)))
            cur, t = acc, t + 1
        # gather (binomial, to new rank 0 = the root): x passes up [x, x + lowbit(x))
        for s in range(k):
            d = 1 << s
            if x & d:
                rounds[t + s].append(send(phys(f.old(x - d)), (acc, x, x + d)))
                break
            rounds[t + s].append(recv(phys(f.old(x + d)), (acc, x + d, x + 2 * d)))
        return rounds

    def rounds(i: int) -> Messages:
        if n == 1:
            return no_messages()
        even, odd = f.fold_pairs()
        if f.rem and i == 0:
            m = messages(odd, even, f.pof2, True)
        else:
            x, s = f.survivors, i - (1 if f.rem else 0)
            if s < k:   # reduce-scatter
                d = f.pof2 >> (s + 1)
                m = messages(f.olds(x), f.olds(x ^ d), d, True)
            else:       # binomial gather: x sends its d blocks up when bit s is its lowest
                d = 1 << (s - k)
                x = x[lowbit(x) == d]
                m = messages(f.olds(x), f.olds(x - d), d)
        return {**m, "src": (m["src"] + root) % n, "dst": (m["dst"] + root) % n}

    lay = Layout(f.pof2)
    return Schedule("reduce", "rabenseifner", n, R, {IN: lay, OUT: lay, TMP: lay}, rank_fn,
                    root=root, round_fn=rounds)


# --- reduce-scatter ------------------------------------------------------------------


@register("reduce_scatter", "recursive_halving")
def reduce_scatter_recursive_halving(n: int, root: int = 0) -> Schedule:
    """Recursive-halving reduce-scatter: lg p rounds, (p-1)/p of the input sent per rank.

    Round s pairs new ranks d = p'/2^(s+1) apart; each keeps the half of its
    blocks that holds its own and sends the other half (two rounds more, and
    a whole input, for the fold when p is not a power of two).
    """
    f = Fold(n)
    k = f.steps
    R = max(1, k + (2 if f.rem else 0))

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        if n == 1:
            rounds[0].append(copy([(OUT, 0)], [(IN, 0)]))
            return rounds
        x, t = f.new(r), 0
        cur = IN
        if f.rem:
            # fold the odd rank of each of the first rem pairs into the even one
            if x < 0:
                rounds[0].append(send(r - 1, (IN, 0, n)))
            elif r < 2 * f.rem:
                rounds[0] += [copy([(TMP, 0, n)], [(IN, 0, n)]), recv_reduce(r + 1, (TMP, 0, n))]
                cur = TMP
            t = 1
        if x >= 0:
            pair = x < f.rem   # this rank also reduces block r+1, for the rank that folded
            lo, hi = 0, f.pof2   # new ranks whose blocks this rank still reduces
            for s in range(k):
                peer = f.old(x ^ (f.pof2 >> (s + 1)))
                (lo, hi), (glo, ghi) = _halve(lo, hi, x)
                steps = [send(peer, (cur, f.old(glo), f.old(ghi)))]
                if s < k - 1:
                    dst: list[Ref] = [(TMP, f.old(lo), f.old(hi))]
                    if cur is IN:
                        steps.append(copy(dst, [(IN, f.old(lo), f.old(hi))]))
                else:
                    # last round: this rank's own block lands in OUT
                    dst = [(OUT, 0, 1)] + ([(TMP, r + 1, r + 2)] if pair else [])
                    steps.append(copy([(OUT, 0, 1)], [(cur, r, r + 1)]))
                    if pair and cur is IN:
                        steps.append(copy([(TMP, r + 1, r + 2)], [(IN, r + 1, r + 2)]))
                rounds[t + s] = [*steps, recv_reduce(peer, *dst)]
                cur = TMP
        if f.rem and r < 2 * f.rem:
            # unfold: the folded rank's block goes back to it
            rounds[R - 1].append(recv(r - 1, (OUT, 0)) if x < 0 else send(r + 1, (TMP, r + 1)))
        return rounds

    def rounds(i: int) -> Messages:
        if n == 1:
            return no_messages()
        even, odd = f.fold_pairs()
        if f.rem and i == 0:
            return messages(odd, even, n, True)
        if f.rem and i == R - 1:
            return messages(even, odd)
        x, d = f.survivors, f.pof2 >> (i - (1 if f.rem else 0) + 1)
        glo = (x ^ d) & -d     # the half x gives away: the old ranks' blocks it stands for
        return messages(f.olds(x), f.olds(x ^ d), f.olds(glo + d) - f.olds(glo), True)

    layouts = {IN: Layout(n, 1, n), OUT: Layout(1), TMP: Layout(n, 1, n)}
    return Schedule("reduce_scatter", "recursive_halving", n, R, layouts, rank_fn,
                    round_fn=rounds)


# --- all-gather ----------------------------------------------------------------------


@register("all_gather", "recursive_doubling")
def all_gather_recursive_doubling(n: int, root: int = 0) -> Schedule:
    """Recursive-doubling all-gather: lg p rounds, partners swap everything they hold.

    On a power of two each rank sends and receives (p-1) blocks in lg p rounds;
    otherwise the fold adds a round before (one block) and one after (the
    whole output, to the ranks that folded).
    """
    f = Fold(n)
    k = f.steps
    R = max(1, k + (2 if f.rem else 0))

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        rounds[0].append(copy([(OUT, r)], [(IN, 0)]))
        x, t = f.new(r), 0
        if f.rem:
            # fold: the odd rank of each of the first rem pairs gives its block to the even one
            if x < 0:
                rounds[0].append(send(r - 1, (IN, 0)))
            elif r < 2 * f.rem:
                rounds[0].append(recv(r + 1, (OUT, r + 1)))
            t = 1
        if x >= 0:
            # doubling: partners swap the blocks of their aligned groups of new ranks
            for s in range(k):
                d = 1 << s
                mine, theirs = x & -d, (x ^ d) & -d
                src: Ref = (IN, 0, 1) if t + s == 0 else (OUT, f.old(mine), f.old(mine + d))
                peer = f.old(x ^ d)
                rounds[t + s] += [send(peer, src),
                                  recv(peer, (OUT, f.old(theirs), f.old(theirs + d)))]
        if f.rem and r < 2 * f.rem:
            # unfold: everything but its own block goes back to the rank that folded
            a = r + 1 - r % 2   # the folded (odd) rank's own block
            rest: list[Ref] = [(OUT, 0, a)] if a > 0 else []
            rest += [(OUT, a + 1, n)] if a + 1 < n else []
            rounds[R - 1].append(recv(r - 1, *rest) if x < 0 else send(r + 1, *rest))
        return rounds

    def rounds(i: int) -> Messages:
        if n == 1:
            return no_messages()
        even, odd = f.fold_pairs()
        if f.rem and i == 0:
            return messages(odd, even)
        if f.rem and i == R - 1:
            return messages(even, odd, n - 1)
        x, d = f.survivors, 1 << (i - (1 if f.rem else 0))
        mine = x & -d
        return messages(f.olds(x), f.olds(x ^ d), f.olds(mine + d) - f.olds(mine))

    return Schedule("all_gather", "recursive_doubling", n, R,
                    {IN: Layout(1), OUT: Layout(n, 1, n)}, rank_fn, round_fn=rounds)
