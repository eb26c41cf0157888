"""Fused shared-memory implementations of the one-shot and direct algorithms.

On one host a collective is a memory problem, not a network one.  The
generic executor moves each message through a channel (a copy in, a copy
out); these paths let every rank read its peers' data where it lies, in the
peers' shared segments, and run the same algorithm as the schedule of the
same name with fewer copies and almost no per-step Python:

``oneshot`` (all_reduce, small vectors)
    Each rank copies its vector into its *post* area before it publishes the
    call's descriptor, so agreeing on the call and exchanging the data are one
    step; then every rank reduces all the vectors in rank order (so every rank
    computes bit-identical results).  The post area alternates between two
    halves by sequence number: a rank can only reuse a half once every peer
    has published the next call, that is, has finished reading it.

``direct`` (all_reduce, reduce_scatter, all_gather, all_to_all, broadcast)
    The data goes through each rank's *stage* area in pieces (pipelined over
    the two halves of the area).  Per piece, every rank copies in what its
    peers need and raises its READY counter; then (reductions) it reduces its
    own block reading every peer's copy in place, publishes the reduced block
    and raises REDUCED; then it copies what it needs from the peers and raises
    DONE.  A rank reuses a half only when every peer's DONE says it has
    finished the piece that used it last.  Each reduced block is computed by
    one rank and copied by the others, so all ranks hold the same bits.

*Single copy* (all_gather and all_to_all, blocks of ``RINGLET_CMA_BYTES`` and up): instead
    of staging, every rank publishes the address of its own
    array and reads each peer's block straight out of the peer's array with
    ``process_vm_readv`` (:mod:`ringlet.transport.cma`), one copy instead of
    two; it counts as one piece (READY: addresses published; DONE: reads
    finished, so no array changes while a peer reads it).  Each rank also
    publishes whether its reads worked; if one failed (a kernel or container
    that forbids the call), every rank sees it in the same call, runs the
    staged path instead and keeps to it.

Counters only grow (they count pieces since the communicator was created),
so no reset can race with a slow reader.  Every wait goes through
:class:`~ringlet.wait.Waiter`: deadlines, dead peers and aborts behave as in
the generic path.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np

from ..ops import reduce_into
from ..wait import Waiter
from . import cma
from .shm import ShmTransport

log = logging.getLogger("ringlet")

READY, REDUCED, DONE = 0, 1, 2
#: the fourth counter line holds the single-copy step's words: this rank's source
#: address (word 24) and its last result (word 25: 2 (piece + 1), + 1 if a read failed)
CMA_ADDR, CMA_RESULT = 24, 25

#: (collective, algorithm) -> the fused path that runs it: "post" (one-shot, through the
#: post area) or "staged" (pipelined through the stage area).  The one place these rules
#: live: the communicator (how a call runs) and the cost model (what it costs) both ask
#: :func:`fused_path`.
FUSED_PATHS: dict[tuple[str, str], str] = {
    ("all_reduce", "oneshot"): "post", ("all_reduce", "direct"): "staged",
    ("broadcast", "direct"): "staged", ("all_gather", "direct"): "staged",
    ("reduce_scatter", "direct"): "staged", ("all_to_all", "direct"): "staged"}


def fused_path(collective: str, algorithm: str, nbytes: int, *, fused: bool,
               post_bytes: int) -> str:
    """``generic``, ``staged`` or ``post``: how a call of ``nbytes`` (the size the
    algorithm choice takes) runs on shared memory; ``fused``: whether the fused paths
    are on (RINGLET_FUSED, and every rank on one host)."""
    kind = FUSED_PATHS.get((collective, algorithm), "generic") if fused else "generic"
    if kind == "post" and nbytes > post_bytes:
        return "generic"
    return kind
Reducer = Callable[[np.ndarray, np.ndarray], None]


try:   # the compiled module's copy with non-temporal stores, where it was built
    from .. import _lean  # type: ignore[attr-defined]
    _copy_stream = _lean.copy_stream
except ImportError:
    _copy_stream = None

#: copies into a user's output of at least this many bytes (all_gather, all_to_all,
#: broadcast) use non-temporal stores: the output's lines are written without being read
#: first and without evicting the staging area from the caches.  Measured A/B on 2 and 4
#: ranks (benchmarks/ab_stream.py): 1.04-1.58x faster from 16 MiB, 0.56-0.88x at 2-8 MiB,
#: where the output still fits the last-level cache and plain stores keep it there.
STREAM_MIN_BYTES = 16 << 20
#: whether those copies stream (benchmarks switch it to compare, on every rank at once)
STREAM = _copy_stream is not None


def _put(dst: np.ndarray, src: np.ndarray, stream: bool) -> None:
    """dst[...] = src, with non-temporal stores if ``stream`` (and built)."""
    if stream and STREAM:
        _copy_stream(dst, src)
    else:
        dst[...] = src


def _blocks(lo: int, hi: int, n: int) -> list[tuple[int, int]]:
    """[lo, hi) cut into n blocks as even as possible."""
    base, rem = divmod(hi - lo, n)
    out, a = [], lo
    for b in range(n):
        e = a + base + (b < rem)
        out.append((a, e))
        a = e
    return out


class Fused:
    """The fused paths of one communicator's shared-memory transport."""

    def __init__(self, t: ShmTransport, what: Callable[[], str]) -> None:
        self.t = t
        self.what = what
        self.piece = 0   # pieces run so far: the same on every rank
        n = t.size
        self.peers = [q for q in range(n) if q != t.rank]
        #: single-copy reads (cross-memory attach) for large blocks: on while every rank
        #: managed every read; the same on every rank (see _single_copy)
        self.cma_bytes = t.settings.cma_bytes
        self.cma = cma.AVAILABLE and self.cma_bytes > 0
        #: why single-copy reads were turned off, if a rank failed one
        self.cma_off = "" if self.cma else (
            "RINGLET_CMA_BYTES=0" if cma.AVAILABLE else "process_vm_readv is not available here")
        if self.cma:
            cma.allow_peers()

    # --- waiting -----------------------------------------------------------------------

    def _wait(self, k: int, target: int, ranks: Sequence[int]) -> None:
        """Until counter k of every rank in ``ranks`` is >= target."""
        c = self.t.counters
        w = 8 * k
        pending = [q for q in ranks if c[q][w] < target]
        if not pending:
            return
        name = ("READY", "REDUCED", "DONE")[k]
        waiter = Waiter(self.t.settings, lambda: f"{self.what()} (staged piece, {name})",
                        lambda: pending, lambda: self.t.check(pending))
        while pending:
            pending = [q for q in pending if c[q][w] < target]
            if pending:
                self.t.idle(0, waiter)   # messages in flight move (BACKGROUND), or a pause

    def _raise(self, k: int, value: int) -> None:
        self.t.counters[self.t.rank][8 * k] = value

    # --- one-shot all_reduce ---------------------------------------------------------------

    def fits_post(self, nbytes: int) -> bool:
        return nbytes <= self.t.lay.post_bytes

    def post(self, seq: int, flat: np.ndarray) -> None:
        """Copy this rank's vector into its post half for call ``seq`` (before agreeing)."""
        self.t.post[self.t.rank][seq % 2][:flat.nbytes] = flat.view(np.uint8)

    def oneshot_all_reduce(self, seq: int, x: np.ndarray, out: np.ndarray, red: Reducer) -> None:
        """out = x0 (op) x1 (op) ... in rank order, reading every rank's post half."""
        if not out.flags.aligned:   # the compiled kernel takes aligned arrays only: reduce
            tmp = np.empty(out.shape, out.dtype)   # in an aligned one, with the same bits
            self.oneshot_all_reduce(seq, x, tmp, red)
            out[...] = tmp
            return
        h, nb, dt = seq % 2, out.nbytes, out.dtype
        post = self.t.post
        if self.t.rank != 0:
            out[...] = post[0][h][:nb].view(dt)
        elif out is not x:
            out[...] = x
        for q in range(1, self.t.size):
            red(out, post[q][h][:nb].view(dt))

    # --- staged, pipelined ---------------------------------------------------------------------

    def _pieces(self, total: int, cap: int, want: int) -> list[tuple[int, int]]:
        """[0, total) cut into pieces of ``want`` elements, at most ``cap`` (what fits)."""
        step = max(1, min(cap, want))
        return [(a, min(a + step, total)) for a in range(0, total, step)]

    def _widths(self, isz: int, slots: int) -> tuple[int, int]:
        """(cap, want): elements per slot that fit a stage half holding ``slots`` slots,
        and the configured piece width."""
        s = self.t.settings
        return self.t.lay.stage_bytes // (isz * slots), max(1, s.shm_piece_bytes // isz)

    def _run_pieces(self, pieces: Sequence[tuple[int, int]],
                    write: Callable[[int, int, int], None] | None,
                    middle: Callable[[int, int, int], None] | None,
                    read: Callable[[int, int, int], None] | None,
                    writers: Sequence[int], readers: Sequence[int], unit: int) -> None:
        """The piece protocol; ``writers`` fill their stage, ``readers`` read others'
        (``unit``: the bytes of a stage half one element of a piece takes)."""
        r = self.t.rank
        if write is not None and r in writers and pieces:
            # the most of each stage half a piece fills: its memory reserved before the
            # first write (ShmTransport.reserve_stage)
            self.t.reserve_stage(max(b - a for a, b in pieces) * unit)
        for a, b in pieces:
            g = self.piece
            h = g % 2
            if write is not None and r in writers:
                # the half was last used by piece g-2: every reader must be done with it
                self._wait(DONE, g - 1, [q for q in readers if q != r])
                write(h, a, b)
            self._raise(READY, g + 1)
            self._wait(READY, g + 1, [q for q in writers if q != r])
            if middle is not None:
                middle(h, a, b)
                self._raise(REDUCED, g + 1)
                self._wait(REDUCED, g + 1, self.peers)
            if read is not None and r in readers:
                read(h, a, b)
            self._raise(DONE, g + 1)
            self.piece = g + 1

    def _blocks_in(self, x: np.ndarray, m: int) -> Callable[[int, int, int], None]:
        """The write phase when x holds one block of m elements per rank: elements a:b of
        block q go to slot q of this rank's stage half, for every peer q."""
        r, dt, isz = self.t.rank, x.dtype, x.itemsize
        stage = self.t.stage

        def write(h: int, a: int, b: int) -> None:
            w = b - a
            for q in self.peers:
                stage[r][h][q * w * isz:(q + 1) * w * isz].view(dt)[...] = \
                    x[q * m + a:q * m + b]

        return write

    def direct_all_reduce(self, x: np.ndarray, red: Reducer, out: np.ndarray | None = None
                          ) -> None:
        """All-reduce of the flat vector ``x`` (reduce-scatter + all-gather), into ``out``
        (default: in place).  Out of place costs no extra pass: the block is reduced
        into the stage slot that publishes it, then copied out (in place: reduced in x,
        then copied into the slot)."""
        n, r, dt = self.t.size, self.t.rank, x.dtype
        y = x if out is None else out
        stage = self.t.stage
        isz = x.itemsize
        everyone = range(n)

        def view(q: int, h: int, lo: int, hi: int) -> np.ndarray:
            return stage[q][h][lo * isz:hi * isz].view(dt)

        def write(h: int, a: int, b: int) -> None:
            # copy in the blocks the peers reduce (offsets relative to the piece)
            for q, (lo, hi) in enumerate(_blocks(a, b, n)):
                if q != r:
                    view(r, h, lo - a, hi - a)[...] = x[lo:hi]

        def middle(h: int, a: int, b: int) -> None:
            # reduce my block: my own values, then rank r-1's, r-2's... (the order of the
            # `direct` schedule, so the generic executor gives the same bits)
            lo, hi = _blocks(a, b, n)[r]
            slot = view(r, h, lo - a, hi - a)   # where the reduced block is published
            if y is x or n == 1:
                mine = y[lo:hi]
                if y is not x:
                    mine[...] = x[lo:hi]
                for k in range(1, n):
                    red(mine, view((r - k) % n, h, lo - a, hi - a))
                slot[...] = mine
                return
            # out of place: reduced straight into the slot, then copied out (one pass
            # over the block fewer than reducing in out= and publishing a copy)
            reduce_into(red, slot, x[lo:hi], view((r - 1) % n, h, lo - a, hi - a))
            for k in range(2, n):
                red(slot, view((r - k) % n, h, lo - a, hi - a))
            y[lo:hi] = slot

        def read(h: int, a: int, b: int) -> None:
            for q, (lo, hi) in enumerate(_blocks(a, b, n)):
                if q != r:
                    y[lo:hi] = view(q, h, lo - a, hi - a)

        cap, want = self._widths(isz, 1)
        self._run_pieces(self._pieces(x.size, cap, n * want), write, middle, read, everyone,
                         everyone, isz)

    def direct_reduce_scatter(self, x: np.ndarray, out: np.ndarray, red: Reducer) -> None:
        """out = block ``rank`` of x reduced over all ranks (x holds n blocks of out.size)."""
        n, r, m, dt = self.t.size, self.t.rank, out.size, x.dtype
        stage, isz = self.t.stage, x.itemsize

        write = self._blocks_in(x, m)

        def read(h: int, a: int, b: int) -> None:
            # reduce block r in rank order, like the `direct` (naive) schedule
            w = b - a
            mine = out[a:b]

            def part(q: int) -> np.ndarray:
                if q == r:
                    return x[r * m + a:r * m + b]
                return stage[q][h][r * w * isz:(r + 1) * w * isz].view(dt)

            mine[...] = part(0)
            for q in range(1, n):
                red(mine, part(q))

        everyone = range(n)
        self._run_pieces(self._pieces(m, *self._widths(isz, n)), write, None, read, everyone,
                         everyone, n * isz)

    # --- single copy (cross-memory attach) ----------------------------------------------------

    def _single(self, block_bytes: int) -> bool:
        return self.cma and block_bytes >= self.cma_bytes and self.t.size > 1

    def _single_copy(self, src: np.ndarray | None, reads: Sequence[tuple[int, int, np.ndarray]],
                     local: Callable[[], None] | None = None) -> bool:
        """One single-copy step: publish the address of ``src`` (this rank's array its
        peers read), wait until every peer has published, read each ``(peer, byte
        offset, into)`` straight from that peer's array, publish whether every read
        worked, run ``local`` (this rank's own copy, while the peers finish reading) and
        wait until every peer is done (so no array changes while a peer reads it).  True
        if every rank's reads worked; else every rank sees the same failure, turns single
        copies off for good, and the caller runs the staged path."""
        t = self.t
        g = self.piece
        mine = t.counters[t.rank]
        if src is not None:
            mine[CMA_ADDR] = cma.address(src)
        self._raise(READY, g + 1)
        self._wait(READY, g + 1, self.peers)
        failed = ""
        for q, offset, into in reads:
            if into.nbytes and not cma.read(t.pids[q], t.counters[q][CMA_ADDR] + offset, into):
                failed = f"rank {t.rank} could not read rank {q}: {cma.errno_text()}"
                break
        mine[CMA_RESULT] = 2 * (g + 1) + bool(failed)
        self._raise(DONE, g + 1)
        if local is not None:
            local()
        self._wait(DONE, g + 1, self.peers)
        self.piece = g + 1
        bad = [q for q in range(t.size) if t.counters[q][CMA_RESULT] != 2 * (g + 1)]
        if bad:
            self.cma = False
            self.cma_off = failed or f"rank {bad[0]} could not read a peer's memory"
            log.warning("single-copy reads (process_vm_readv) are off for this communicator "
                        "(%s); the staged shared-memory path runs instead", self.cma_off)
        return not bad

    def direct_all_gather(self, x: np.ndarray, out: np.ndarray) -> None:
        """out = every rank's x, in rank order (out holds n blocks of x.size)."""
        n, r, m, dt = self.t.size, self.t.rank, x.size, x.dtype
        stage, isz = self.t.stage, x.itemsize
        nt = out.nbytes >= STREAM_MIN_BYTES

        def own() -> None:
            _put(out[r * m:(r + 1) * m], x, nt)

        if self._single(m * isz) and self._single_copy(
                x, [(q, 0, out[q * m:(q + 1) * m]) for q in self.peers], own):
            return
        own()

        def write(h: int, a: int, b: int) -> None:
            stage[r][h][:(b - a) * isz].view(dt)[...] = x[a:b]

        def read(h: int, a: int, b: int) -> None:
            for q in self.peers:
                _put(out[q * m + a:q * m + b], stage[q][h][:(b - a) * isz].view(dt), nt)

        everyone = range(n)
        self._run_pieces(self._pieces(m, *self._widths(isz, 1)), write, None, read, everyone,
                         everyone, isz)

    def direct_all_to_all(self, x: np.ndarray, out: np.ndarray) -> None:
        """Block q of x goes to rank q; block q of out comes from rank q."""
        n, r, dt = self.t.size, self.t.rank, x.dtype
        m = x.size // n
        stage, isz = self.t.stage, x.itemsize

        nt = out.nbytes >= STREAM_MIN_BYTES

        def own() -> None:
            _put(out[r * m:(r + 1) * m], x[r * m:(r + 1) * m], nt)

        if self._single(m * isz) and self._single_copy(
                x, [(q, r * m * isz, out[q * m:(q + 1) * m]) for q in self.peers], own):
            return
        own()
        write = self._blocks_in(x, m)

        def read(h: int, a: int, b: int) -> None:
            w = b - a
            for q in self.peers:
                _put(out[q * m + a:q * m + b],
                     stage[q][h][r * w * isz:(r + 1) * w * isz].view(dt), nt)

        everyone = range(n)
        self._run_pieces(self._pieces(m, *self._widths(isz, n)), write, None, read, everyone,
                         everyone, n * isz)

    def direct_broadcast(self, x: np.ndarray, root: int) -> None:
        """Every rank's x = the root's x."""
        n, dt = self.t.size, x.dtype
        stage, isz = self.t.stage, x.itemsize
        def write(h: int, a: int, b: int) -> None:
            stage[root][h][:(b - a) * isz].view(dt)[...] = x[a:b]

        nt = x.nbytes >= STREAM_MIN_BYTES

        def read(h: int, a: int, b: int) -> None:
            _put(x[a:b], stage[root][h][:(b - a) * isz].view(dt), nt)

        others = [q for q in range(n) if q != root]
        self._run_pieces(self._pieces(x.size, *self._widths(isz, 1)), write, None, read, [root],
                         others, isz)


def shared_all_reduce(f: Fused, mine: np.ndarray, peers: Sequence[np.ndarray],
                      red: Reducer) -> None:
    """Zero-copy all_reduce of buffers that live in shared memory (``comm.empty``).

    ``peers[q]`` is rank q's buffer (the same offset in its region), mapped here;
    ``mine`` is this rank's.  Agreeing on the call was the entry barrier (every
    rank's data is in place).  Each rank reduces its own block in place reading
    the peers' blocks where they lie (the `direct` order), then copies the peers'
    reduced blocks; a final barrier keeps every rank's buffer untouched until
    every peer has read it.
    """
    n, r = f.t.size, f.t.rank
    g = f.piece
    blocks = _blocks(0, mine.size, n)
    lo, hi = blocks[r]
    acc = mine[lo:hi]
    for k in range(1, n):
        red(acc, peers[(r - k) % n][lo:hi])
    f._raise(READY, g + 1)
    f._raise(REDUCED, g + 1)
    f._wait(REDUCED, g + 1, f.peers)
    for q in f.peers:
        a, b = blocks[q]
        mine[a:b] = peers[q][a:b]
    f._raise(DONE, g + 1)
    f._wait(DONE, g + 1, f.peers)
    f.piece = g + 1
