"""Tree algorithms: binomial trees, the pipelined chain, and the double binary tree.

Binomial tree (Thakur, Rabenseifner & Gropp 2005, as in MPICH).  Ranks are
numbered relative to the root, ``v = (r - root) % p``.  Going down (broadcast,
scatter), round ``j`` uses distance ``d = 2^(L-1-j)`` with ``L = ceil(lg p)``:
every ``v`` that is a multiple of ``2d`` sends to ``v + d``.  So ``v`` hears
from ``v - lowbit(v)`` and its subtree is the contiguous range
``[v, v + lowbit(v))``, which is what makes the binomial scatter and gather
move contiguous runs of blocks.  Going up (reduce, gather) is the same tree
in reverse: round ``k`` uses ``d = 2^k``.  ``ceil(lg p)`` rounds either way.

Chain: the degenerate tree ``root -> root+1 -> ...``, pipelined in pieces:
``p - 2 + pieces`` rounds, every link busy once the pipe is full; the reduce
runs it backwards, into the root.

Double binary tree (Sanders, Speck & Traeff 2009; NCCL's Tree): two binary
trees, complementary in that a rank which is an inner node of one is a leaf
of the other (rank 0 excepted for odd p), each reducing and then broadcasting
half of the vector, pipelined in pieces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from ..schedule import (
    Buf,
    Layout,
    Ref,
    Schedule,
    Step,
    copy,
    empty_rounds,
    recv,
    recv_reduce,
    send,
)
from . import register
from .common import Messages, check_pieces, lg, lowbit, messages, no_messages, span

IN, OUT, TMP = Buf.IN, Buf.OUT, Buf.TMP
SEND, RECV = "send", "recv"


def _subtree(v: int, n: int) -> int:
    """How many ranks the binomial subtree of relative rank v holds (v's own included)."""
    return n if v == 0 else min(v & -v, n - v)


def binomial_down(v: int, n: int) -> Iterator[tuple[int, str, int]]:
    """(round, SEND|RECV, peer) of relative rank v in a binomial broadcast from 0."""
    L = lg(n)
    for j in range(L):
        d = 1 << (L - 1 - j)
        if v % (2 * d) == 0 and v + d < n:
            yield j, SEND, v + d
        elif v % (2 * d) == d:
            yield j, RECV, v - d


def binomial_up(v: int, n: int) -> Iterator[tuple[int, str, int]]:
    """(round, SEND|RECV, peer) of relative rank v in a binomial reduce/gather to 0."""
    for k in range(lg(n)):
        d = 1 << k
        if v % (2 * d) == d:
            yield k, SEND, v - d
            return
        if v + d < n:
            yield k, RECV, v + d


def subtree_sizes(v: np.ndarray, n: int) -> np.ndarray:
    """:func:`_subtree` of every relative rank in ``v``."""
    return np.where(v == 0, n, np.minimum(lowbit(v), n - v))


def down_senders(j: int, n: int) -> np.ndarray:
    """The relative ranks that send in round j of a binomial broadcast from 0 (each to
    v + d, d = 2^(L-1-j))."""
    d = 1 << (lg(n) - 1 - j)
    return np.arange(0, max(0, n - d), 2 * d, dtype=np.int64)


def up_senders(k: int, n: int) -> np.ndarray:
    """The relative ranks that send in round k of a binomial reduce to 0 (each to v - 2^k)."""
    d = 1 << k
    return np.arange(d, n, 2 * d, dtype=np.int64)


def _binomial(n: int, root: int, up: bool, reduce: bool, sized: bool = False
              ) -> Callable[[int], Messages]:
    """Closed form of a binomial tree's rounds, down (broadcast, scatter) or up (reduce,
    gather); ``sized``: a message carries the subtree below (or of) its sender's child."""

    def rounds(j: int) -> Messages:
        if n == 1:
            return no_messages()
        if up:
            d = 1 << j
            v = up_senders(j, n)
            w, child = v - d, v
        else:
            d = 1 << (lg(n) - 1 - j)
            v = down_senders(j, n)
            w, child = v + d, v + d
        chunks = subtree_sizes(child, n) if sized else 1
        return messages((v + root) % n, (w + root) % n, chunks, reduce)

    return rounds


# --- binomial ------------------------------------------------------------------------


@register("broadcast", "binomial", aliases=("tree",))
def broadcast_binomial(n: int, root: int = 0) -> Schedule:
    """Binomial-tree broadcast: ceil(lg p) rounds, each rank receives the vector once."""

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(lg(n))
        v = (r - root) % n
        for t, kind, w in binomial_down(v, n):
            peer = (w + root) % n
            rounds[t].append(send(peer, (OUT, 0)) if kind == SEND else recv(peer, (OUT, 0)))
        return rounds

    return Schedule("broadcast", "binomial", n, lg(n), {OUT: Layout(1)}, rank_fn, root=root,
                    round_fn=_binomial(n, root, up=False, reduce=False))


@register("reduce", "binomial", aliases=("tree",))
def reduce_binomial(n: int, root: int = 0) -> Schedule:
    """Binomial-tree reduce: ceil(lg p) rounds; each rank adds its children's partials."""
    R = max(1, lg(n))

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        v = (r - root) % n
        # The root accumulates in OUT, inner ranks in TMP; a leaf sends its input as it is.
        acc = OUT if v == 0 else TMP
        leaf = v != 0 and (v % 2 or v + 1 >= n)
        if not leaf:
            rounds[0].append(copy([(acc, 0)], [(IN, 0)]))
        for t, kind, w in binomial_up(v, n):
            peer = (w + root) % n
            if kind == SEND:
                rounds[t].append(send(peer, (IN if leaf else acc, 0)))
            else:
                rounds[t].append(recv_reduce(peer, (acc, 0)))
        return rounds

    layouts = {IN: Layout(1), OUT: Layout(1), TMP: Layout(1)}
    return Schedule("reduce", "binomial", n, R, layouts, rank_fn, root=root,
                    round_fn=_binomial(n, root, up=True, reduce=True))


@register("all_reduce", "binomial", aliases=("tree",))
def all_reduce_binomial(n: int, root: int = 0) -> Schedule:
    """Binomial reduce to rank 0, then binomial broadcast from it: 2 ceil(lg p) rounds."""
    L = lg(n)

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(2 * L)
        # reduce: every chunk is reduced at rank 0 alone, so all ranks end bit-identical
        for t, kind, w in binomial_up(r, n):
            rounds[t].append(send(w, (OUT, 0)) if kind == SEND else recv_reduce(w, (OUT, 0)))
        # broadcast
        for t, kind, w in binomial_down(r, n):
            rounds[L + t].append(send(w, (OUT, 0)) if kind == SEND else recv(w, (OUT, 0)))
        return rounds

    reduce, bcast = (_binomial(n, 0, up=True, reduce=True),
                     _binomial(n, 0, up=False, reduce=False))

    def rounds(i: int) -> Messages:
        return reduce(i) if i < L else bcast(i - L)

    return Schedule("all_reduce", "binomial", n, 2 * L, {OUT: Layout(1)}, rank_fn,
                    round_fn=rounds)


@register("scatter", "binomial", aliases=("tree",))
def scatter_binomial(n: int, root: int = 0) -> Schedule:
    """Binomial-tree scatter: ceil(lg p) rounds; each rank forwards its subtree's blocks."""
    R = max(1, lg(n))

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        v = (r - root) % n
        # Inner ranks keep their subtree's blocks in TMP, each in its own rank's place (a
        # subtree's run of ranks may wrap past rank n-1: two ranges), so that blocks of
        # different sizes (scatter_v) fit at any root; the root sends straight from IN,
        # everyone's own block lands in OUT.
        if v == 0:
            rounds[0].append(copy([(OUT, 0)], [(IN, root)]))
        for t, kind, w in binomial_down(v, n):
            peer = (w + root) % n
            if kind == RECV:
                size = _subtree(v, n)
                dst: list[Ref] = [(OUT, 0, 1)] + (span(TMP, r + 1, size - 1, n)
                                                  if size > 1 else [])
                rounds[t].append(recv(peer, *dst))
            else:
                size = _subtree(w, n)
                rounds[t].append(send(peer, *span(IN if v == 0 else TMP, peer, size, n)))
        return rounds

    layouts = {IN: Layout(n, 1, n), OUT: Layout(1), TMP: Layout(n, 1, n)}
    return Schedule("scatter", "binomial", n, R, layouts, rank_fn, root=root,
                    round_fn=_binomial(n, root, up=False, reduce=False, sized=True))


@register("gather", "binomial", aliases=("tree",))
def gather_binomial(n: int, root: int = 0) -> Schedule:
    """Binomial-tree gather: ceil(lg p) rounds; each rank passes up its subtree's blocks."""
    R = max(1, lg(n))

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        v = (r - root) % n
        # Inner ranks collect their subtree in TMP, each block in its own rank's place (as
        # scatter's: gather_v's blocks of different sizes fit at any root); the root
        # collects straight into OUT.
        if v == 0:
            rounds[0].append(copy([(OUT, root)], [(IN, 0)]))
        for t, kind, w in binomial_up(v, n):
            peer = (w + root) % n
            if kind == RECV:
                size = _subtree(w, n)
                rounds[t].append(recv(peer, *span(OUT if v == 0 else TMP, peer, size, n)))
            else:
                size = _subtree(v, n)
                src: list[Ref] = [(IN, 0, 1)] + (span(TMP, r + 1, size - 1, n)
                                                 if size > 1 else [])
                rounds[t].append(send(peer, *src))
        return rounds

    layouts = {IN: Layout(1), OUT: Layout(n, 1, n), TMP: Layout(n, 1, n)}
    return Schedule("gather", "binomial", n, R, layouts, rank_fn, root=root,
                    round_fn=_binomial(n, root, up=True, reduce=False, sized=True))


# --- van de Geijn broadcast ----------------------------------------------------------


@register("broadcast", "scatter_allgather")
def broadcast_scatter_allgather(n: int, root: int = 0) -> Schedule:
    """Van de Geijn broadcast: binomial scatter of p blocks, then ring all-gather.

    ceil(lg p) + p - 1 rounds, about 2 (p-1)/p of the vector per rank instead
    of lg p vectors: the long-message broadcast of MPICH.
    """
    L = lg(n)
    R = L + n - 1

    def has(w: int, b: int) -> bool:
        """Whether relative rank w holds block b after the scatter (its subtree's blocks)."""
        return w == 0 or w <= b < w + _subtree(w, n)

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        v = (r - root) % n
        # scatter: relative rank v ends with block v (the root keeps them all)
        for t, kind, w in binomial_down(v, n):
            peer = (w + root) % n
            if kind == SEND:
                rounds[t].append(send(peer, (OUT, w, w + _subtree(w, n))))
            else:
                rounds[t].append(recv(peer, (OUT, v, v + _subtree(v, n))))
        # all-gather: ring v -> v+1; step k passes block v-k on.  A block the receiver
        # already has from the scatter is not sent (both sides know it).
        right, left = (v + 1) % n, (v - 1) % n
        for k in range(n - 1):
            out_b, in_b = (v - k) % n, (v - k - 1) % n
            if not has(right, out_b):
                rounds[L + k].append(send((right + root) % n, (OUT, out_b)))
            if not has(v, in_b):
                rounds[L + k].append(recv((left + root) % n, (OUT, in_b)))
        return rounds

    scatter = _binomial(n, root, up=False, reduce=False, sized=True)
    v = np.arange(n, dtype=np.int64)
    right = (v + 1) % n
    lo, hi = right, right + subtree_sizes(right, n)
    # what does not change from round to round, computed once (16,384 ranks: 16,383 rounds)
    moves, src, dst = right != 0, (v + root) % n, (right + root) % n

    def rounds(i: int) -> Messages:
        if i < L:
            return scatter(i)
        b = (v - (i - L)) % n     # the block v passes on; sent unless right has it
        send = moves & ((b < lo) | (b >= hi))
        return messages(src[send], dst[send])

    return Schedule("broadcast", "scatter_allgather", n, R, {OUT: Layout(n)}, rank_fn, root=root,
                    round_fn=rounds)


# --- chain ---------------------------------------------------------------------------


@register("broadcast", "chain", params={"pieces": 4})
def broadcast_chain(n: int, root: int = 0, pieces: int = 4) -> Schedule:
    """Pipelined chain broadcast root -> root+1 -> ...: p - 2 + pieces rounds.

    Default 4 pieces: unlike a ring, a chain keeps its links busy only when
    pipelined; with k pieces it costs (p - 2 + k) (alpha + n/k beta), so
    k = 4 already takes the bandwidth term from (p-1) n beta to about
    (p+2)/4 n beta.  The tuner picks k per size.
    """
    P = check_pieces("broadcast/chain", pieces)
    R = n - 2 + P if n > 1 else 0

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        v = (r - root) % n
        # piece p reaches relative rank v in round v-1+p and leaves it in round v+p
        for p in range(P):
            if v > 0:
                rounds[v - 1 + p].append(recv((r - 1) % n, (OUT, p)))
            if v + 1 < n:
                rounds[v + p].append(send((r + 1) % n, (OUT, p)))
        return rounds

    def rounds(t: int) -> Messages:
        # piece t - v leaves relative rank v in round t
        v = np.arange(max(0, t - P + 1), min(t, n - 2) + 1, dtype=np.int64)
        return messages((v + root) % n, (v + 1 + root) % n)

    return Schedule("broadcast", "chain", n, R, {OUT: Layout(1, P)}, rank_fn, root=root,
                    round_fn=rounds)


@register("reduce", "chain", params={"pieces": 4})
def reduce_chain(n: int, root: int = 0, pieces: int = 4) -> Schedule:
    """Pipelined chain reduce, rank root - 1 first, the root last: p - 2 + pieces rounds.

    The broadcast chain run backwards, as NCCL's ring reduce: the rank farthest
    from the root sends its first piece, every rank adds what it receives to its
    own piece and passes the sum on, and the root adds the last.  With k pieces
    it costs (p - 2 + k) (alpha + n/k (beta + gamma)): every link carries the
    vector once, where a binomial tree's root receives it lg p times and
    Rabenseifner's moves about 2 (p-1)/p of it, so for long vectors it is the
    cheapest reduce on a network whose links run at once.  On one host, where
    every copy shares the memory, it measured level with those two (4 ranks,
    64 KiB-64 MiB, ``ringlet bench reduce --algo chain``): the size rules do not
    take it there, a calibrated profile's tuner may.
    """
    P = check_pieces("reduce/chain", pieces)
    R = n - 2 + P if n > 1 else 1
    layouts = {IN: Layout(1, P), OUT: Layout(1, P), TMP: Layout(1, P)}

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        v = (r - root) % n
        u = n - 1 - v   # how far from the chain's far end: it sends first
        # the root sums into OUT, the ranks between into TMP, the far end sends its input
        acc = OUT if v == 0 else TMP
        if u > 0 or n == 1:
            rounds[0].append(copy([(acc, 0, P)], [(IN, 0, P)]))
        # piece p reaches the rank u links from the far end in round u - 1 + p and
        # leaves it, with this rank's part added, in round u + p
        for p in range(P):
            if u > 0:
                rounds[u - 1 + p].append(recv_reduce((r + 1) % n, (acc, p)))
            if v > 0:
                rounds[u + p].append(send((r - 1) % n, (IN if u == 0 else acc, p)))
        return rounds

    def rounds(t: int) -> Messages:
        # piece t - u leaves the rank u links from the far end (relative rank n - 1 - u)
        u = np.arange(max(0, t - P + 1), min(t, n - 2) + 1, dtype=np.int64)
        v = n - 1 - u
        return messages((v + root) % n, (v - 1 + root) % n, reduce=True)

    return Schedule("reduce", "chain", n, R, layouts, rank_fn, root=root, round_fn=rounds)


# --- double binary tree --------------------------------------------------------------


def _btree(n: int, x: int) -> tuple[int, list[int], int]:
    """(parent, children, height) of x in the in-order binary tree on 0..n-1.

    Rank 0 is the root and has one child, the highest power of two below n;
    under it, 1..n-1 form the in-order tree in which x's level is its lowest set
    bit: leaves are the odd ranks, x's children are x -/+ lowbit(x)/2 (the right
    one shrunk towards x while it is out of range).  Parent -1 for the root.
    """
    top = 1 << ((n - 1).bit_length() - 1)
    if x == 0:
        return -1, [top], top.bit_length()
    b = x & -x
    if x == top:
        parent = 0
    else:
        parent = x + b if not x & (2 * b) else x - b
        if parent >= n:
            parent = x - b
    kids = []
    if b > 1:
        kids.append(x - b // 2)
        c = b // 2
        while c and x + c >= n:
            c //= 2
        if c:
            kids.append(x + c)
    return parent, kids, b.bit_length() - 1


def _dtree(n: int, tree: int, r: int) -> tuple[int, list[int], int, int]:
    """(parent, children, height, depth) of rank r in tree 0 or 1 of the double binary tree.

    Tree 1 is tree 0 mirrored (r -> n-1-r) when n is even, shifted by one rank
    when n is odd, so that the leaves of one tree (odd labels) are inner nodes of
    the other (NCCL's construction).
    """
    if tree == 0:
        to, back = (lambda x: x), (lambda x: x)
    elif n % 2 == 0:
        to = back = (lambda x: n - 1 - x)
    else:
        to, back = (lambda x: (x - 1) % n), (lambda x: (x + 1) % n)
    x = to(r)
    parent, kids, height = _btree(n, x)
    depth, y = 0, x
    while y != 0:
        y = _btree(n, y)[0]
        depth += 1
    return (back(parent) if parent >= 0 else -1), [back(k) for k in kids], height, depth


@register("all_reduce", "double_binary_tree", aliases=("dbtree",), params={"pieces": 4})
def all_reduce_double_binary_tree(n: int, root: int = 0, pieces: int = 4) -> Schedule:
    """Two complementary binary trees, each reducing then broadcasting half the vector.

    Each half is cut in ``pieces`` pieces that stream up the tree and back down:
    2 D + pieces - 1 rounds with D = floor(lg(p-1)) + 1 the depth of a tree.
    A rank is an inner node of at most one tree (rank 0 excepted for odd p, the
    root with one child in tree 0), so it sends and receives at most twice the
    vector, like a ring, but in O(lg p) rounds.  Default 4 pieces:
    a tree keeps its links busy only when pipelined (see the chain).
    """
    P = check_pieces("all_reduce/double_binary_tree", pieces)
    D = (n - 1).bit_length() if n > 1 else 0   # height of the root = floor(lg(n-1)) + 1
    R = 2 * D + P - 1 if n > 1 else 0

    def rank_fn(r: int) -> list[list[Step]]:
        rounds = empty_rounds(R)
        if n == 1:
            return rounds
        for tree in (0, 1):   # tree t carries block t; steps list tree 0 first on both sides
            parent, kids, h, d = _dtree(n, tree, r)
            kid_h = [_dtree(n, tree, k)[2] for k in kids]
            for p in range(P):
                c = tree * P + p
                # reduce: a node of height h sends piece p up in round h + p, after its
                # children (height <= h-1) sent theirs; each chunk is reduced on the way
                # up only, then copied down, so every rank ends bit-identical.
                for k, hk in zip(kids, kid_h, strict=True):
                    rounds[hk + p].append(recv_reduce(k, (OUT, c)))
                if parent >= 0:
                    rounds[h + p].append(send(parent, (OUT, c)))
                # broadcast: the root sends piece p down in round D + p; depth d forwards
                # it in round D + p + d.
                if parent >= 0:
                    rounds[D + p + d - 1].append(recv(parent, (OUT, c)))
                for k in kids:
                    rounds[D + p + d].append(send(k, (OUT, c)))
        return rounds

    trees: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def rounds(i: int) -> Messages:
        if not trees:
            trees.extend(_dtree_arrays(n, t) for t in (0, 1))
        parts = []
        for r, parent, h, d in trees:
            # up: a node of height h sends piece i - h to its parent, reduced there
            p = i - h
            up = (parent >= 0) & (p >= 0) & (p < P)
            parts.append(messages(r[up], parent[up], 1, True))
            # down: a parent at depth d - 1 sends piece i - D - (d - 1) to its child
            p = i - D - (d - 1)
            down = (parent >= 0) & (p >= 0) & (p < P)
            parts.append(messages(parent[down], r[down], 1, False))
        return {k: np.concatenate([m[k] for m in parts]) for k in parts[0]}

    return Schedule("all_reduce", "double_binary_tree", n, R, {OUT: Layout(2, P)}, rank_fn,
                    round_fn=rounds)


def _dtree_arrays(n: int, tree: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(rank, parent, height, depth) of every rank in tree 0 or 1 of the double binary tree,
    as vectors (:func:`_dtree` for all ranks at once; parent -1 for the root)."""
    x = np.arange(n, dtype=np.int64)
    top = 1 << ((n - 1).bit_length() - 1)
    b = lowbit(x)
    parent = np.where(x & (2 * b), x - b, x + b)
    parent = np.where(parent >= n, x - b, parent)
    parent[x == top] = 0
    parent[0] = -1
    height = np.zeros(n, np.int64)
    height[1:] = np.log2(b[1:]).round().astype(np.int64)
    height[0] = top.bit_length()
    depth = np.zeros(n, np.int64)
    cur = x.copy()
    while (cur > 0).any():
        move = cur > 0
        depth[move] += 1
        cur[move] = parent[cur[move]]
    # x is the tree's label of a rank: rank = back(x)
    if tree == 0:
        rank = x
    elif n % 2 == 0:
        rank = n - 1 - x
    else:
        rank = (x + 1) % n
    back = np.empty(n, np.int64)
    back[x] = rank
    par = np.where(parent >= 0, back[np.maximum(parent, 0)], -1)
    return rank, par, height, depth
