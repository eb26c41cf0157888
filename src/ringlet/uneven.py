"""Uneven collectives: ``all_to_all_v``, ``all_gather_v``, ``gather_v``, ``scatter_v``
(a mixin of :class:`~ringlet.comm.Communicator`).

Each is the even collective's schedule run with blocks of different sizes:
the schedule names chunks, and the executor cuts each buffer at the sizes of
this call (:func:`block_bounds`) instead of at equal ones.  That is sound for
an algorithm only if every chunk it moves lands in a place of the same size:
rank q's block must only ever sit where rank q's block goes.
:func:`uneven_ok` checks that symbolically, round by round, with the
verifier (:mod:`ringlet.verify`); ``ring``, ``recursive_doubling`` and
``direct`` all-gathers qualify, Bruck's rotation does not.

A call has two parts.  First every rank's counts and shapes are exchanged
(one small all-gather of int64 words): every rank then sees the same table
and checks it the same way, so counts that disagree (rank 1 sends 3 rows to
rank 2, which expects 4) are a ``MismatchError`` on every rank before any
data moves.  Then the data moves in one schedule.

Counts are in rows: slices along the first dimension, as torch's split
sizes are (``x`` of shape ``(sum(counts), *rest)``; a 1-D array's rows are
its elements).  Every rank's rows have the same shape.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import numpy as np

from . import agreement
from .agreement import GENERIC
from .algorithms import algorithms as _algorithms
from .algorithms import build as _build
from .buffers import Buffer, as_buffer, new_buffer
from .calls import NATIVE, Calls, _collective, check_async
from .errors import ArgumentError, MismatchError, VerificationError
from .executor import Program, compile_bounds, execute
from .schedule import Buf, Layout, Schedule

#: the algorithms tried, in order, when the even collective's choice cannot take uneven blocks
PREFERRED = {"all_to_all": ("pairwise", "direct", "naive"),
             "all_gather": ("ring", "recursive_doubling", "direct", "naive"),
             "gather": ("binomial", "linear", "naive"),
             "scatter": ("binomial", "linear", "naive")}
#: rows of a buffer may have at most this many dimensions (they travel as numbers)
MAX_ROW_DIMS = 4


def block_bounds(sizes: tuple[int, ...], pieces: int = 1) -> np.ndarray:
    """Element offsets of every chunk boundary of a buffer whose blocks hold ``sizes``
    elements, each block cut into ``pieces`` near-equal pieces (as
    :meth:`Layout.bounds` cuts equal blocks)."""
    s = np.asarray(sizes, np.int64)
    lo = np.concatenate([np.zeros(1, np.int64), np.cumsum(s)])
    p = np.arange(pieces, dtype=np.int64)
    pb, pr = np.divmod(s[:, None], pieces)
    starts = lo[:-1, None] + p[None, :] * pb + np.minimum(p[None, :], pr)
    return np.append(starts.ravel(), lo[-1])


def _slot_owner(collective: str, buf: Buf, lay: Layout, n: int, rank: int,
                chunk: int) -> Any:
    """Whose block a chunk of ``buf`` on ``rank`` holds when blocks are uneven (None: the
    place has no owner, so no uneven block may pass through it)."""
    block, piece = divmod(chunk, lay.pieces)
    if collective == "all_to_all":
        if lay.blocks != n or buf is Buf.TMP:
            return None
        return (rank, block, piece) if buf is Buf.IN else (block, rank, piece)
    if lay.blocks == 1 and buf is not Buf.TMP:
        return (rank, piece)
    if lay.blocks == n:
        return (block, piece)
    return None


def _atom_owner(collective: str, atom: Any) -> Any:
    """Whose block a value of the verifier is (see :mod:`ringlet.verify`'s atoms)."""
    if collective == "all_to_all":       # ("a", source, destination, piece)
        return (atom[1], atom[2], atom[3])
    return (atom[1], atom[2])            # ("g", rank, piece) / ("s", rank, piece)


@functools.lru_cache(maxsize=512)
def uneven_ok(schedule: Schedule) -> str | None:
    """None if ``schedule`` stays correct with blocks of different sizes, else why not.

    Runs the verifier and checks, after every round, that every chunk every
    rank holds sits in a place of its owner's size (:func:`_slot_owner`)."""
    c, n = schedule.collective, schedule.nranks
    if c not in PREFERRED:
        return f"{c} has no uneven form"
    bad: list[str] = []

    def check(rnd: int, states: list[dict[Buf, list[Any]]]) -> None:
        if bad:
            return
        for r, st in enumerate(states):
            for buf, vals in st.items():
                lay = schedule.layouts[buf]
                for i, v in enumerate(vals):
                    if v is None:
                        continue
                    want = _slot_owner(c, buf, lay, n, r, i)
                    if want is None or want != _atom_owner(c, v[0]):
                        bad.append(f"round {rnd}: rank {r} keeps {v[0]} in {buf.name} chunk "
                                   f"{i}, a place of another size")
                        return

    from .verify import verify

    try:
        verify(schedule, on_round=check)
    except VerificationError as exc:
        return str(exc)
    return bad[0] if bad else None


def uneven_algorithms(collective: str, nranks: int, root: int = 0) -> list[str]:
    """The algorithms of ``collective`` (even name, e.g. ``all_to_all``) that run its
    uneven form on ``nranks`` ranks (with this root)."""
    return [a for a in _algorithms(collective)
            if a != "hierarchical" and uneven_ok(_build(collective, a, nranks, root)) is None]


#: the collectives with a root, whose uneven forms are checked at every root
ROOTED = frozenset({"gather", "scatter"})


@functools.lru_cache(maxsize=8)
def listed(collective: str) -> list[str]:
    """The algorithms ``ringlet.algorithms("<collective>_v")`` lists: those whose uneven
    form is sound at every world size 1..16 and, for gather and scatter, at every root."""
    return [a for a in _algorithms(collective)
            if all(a in uneven_algorithms(collective, n, root) for n in range(1, 17)
                   for root in (range(n) if collective in ROOTED else (0,)))]


@functools.lru_cache(maxsize=256)
def compile_uneven(schedule: Schedule, rank: int,
                   sizes: tuple[tuple[Buf, tuple[int, ...]], ...]) -> Program:
    """This rank's program with the block sizes (in elements) of each buffer."""
    lay = schedule.layouts
    return compile_bounds(schedule, rank, {b: block_bounds(s, lay[b].pieces) for b, s in sizes})


#: the most rows a count may say (its sums, in Python's ints, are checked against arrays)
MAX_COUNT = 2 ** 62


def _counts(value: Any, n: int, what: str) -> np.ndarray:
    """``value`` as n int64 counts from 0 to :data:`MAX_COUNT` (checked as given, before
    any conversion can wrap or truncate them)."""
    if hasattr(value, "tolist") and not isinstance(value, np.ndarray):
        value = value.tolist()   # a torch tensor
    try:
        arr = np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - reported as the argument error it is
        raise ArgumentError(f"{what} must be a sequence of {n} ints ({exc})") from None
    if arr.shape != (n,):
        raise ArgumentError(f"{what} must hold one count per rank ({n}), got shape "
                            f"{arr.shape}")
    if arr.size and not (np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_ or
                         np.issubdtype(arr.dtype, np.floating) or arr.dtype == object):
        raise ArgumentError(f"{what} must be integers, got {arr.tolist()}")
    values = arr.tolist()
    if arr.dtype == np.bool_ or isinstance(value, (list, tuple)) and \
            any(isinstance(v, (bool, np.bool_)) for v in value):
        # a mask is not counts (np.asarray([True, 2]) would make it [1, 2])
        raise ArgumentError(f"{what} must be integers, got {list(value)}")
    for v in values:
        if isinstance(v, float) and not (math.isfinite(v) and v == int(v)):
            raise ArgumentError(f"{what} must be integers, got {values}")
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            raise ArgumentError(f"{what} must be integers, got {values}")
    ints = [int(v) for v in values]
    if any(v < 0 for v in ints):
        raise ArgumentError(f"{what} must not be negative, got {values}")
    if any(v > MAX_COUNT for v in ints):
        raise ArgumentError(f"{what} must be at most 2**62 rows each, got {values}")
    return np.array(ints, np.int64)


def _total(counts: np.ndarray) -> int:
    """The sum of counts, in Python's ints (numpy's int64 sum can wrap)."""
    return sum(int(v) for v in counts.tolist())


def _rows(b: Buffer, what: str) -> tuple[int, tuple[int, ...]]:
    """(rows, row shape) of a buffer: slices along its first dimension."""
    if not b.shape:
        raise ArgumentError(f"{what} is a 0-d array; pass an array whose first dimension "
                            f"holds the rows")
    rest = tuple(b.shape[1:])
    if len(rest) > MAX_ROW_DIMS:
        raise ArgumentError(f"{what}: rows of more than {MAX_ROW_DIMS} dimensions "
                            f"(shape {b.shape}); reshape it")
    return int(b.shape[0]), rest


class _Table:
    """Every rank's words of an uneven call, as exchanged (see :meth:`Uneven._exchange`)."""

    #: rows, dtype, ndim of a row, the row's dims, out elements, root
    HEAD = 3 + MAX_ROW_DIMS + 2

    def __init__(self, words: np.ndarray, n: int) -> None:
        self.w = words.reshape(n, -1)
        self.n = n

    def rows(self, q: int) -> int:
        return int(self.w[q, 0])

    def dtype(self, q: int) -> int:
        return int(self.w[q, 1])

    def row_shape(self, q: int) -> tuple[int, ...] | None:
        k = int(self.w[q, 2])
        return None if k < 0 else tuple(int(d) for d in self.w[q, 3:3 + k])

    def out_elems(self, q: int) -> int:
        return int(self.w[q, self.HEAD - 2])

    def root(self, q: int) -> int:
        return int(self.w[q, self.HEAD - 1])

    def a(self, q: int) -> np.ndarray | None:
        v = self.w[q, self.HEAD:self.HEAD + self.n]
        return None if v[0] < 0 else v

    def counts(self, q: int, api: str) -> np.ndarray:
        """Rank q's first vector, which the call needs (all_to_all_v's send counts, the
        scatter root's counts); MismatchError if q gave none (the ranks disagree on the
        call, e.g. on its root)."""
        v = self.a(q)
        if v is None:
            raise MismatchError(f"{api}: rank {q} gave no counts, though this rank's call "
                                f"needs them from it (do the ranks agree on the root?)")
        return v

    def b(self, q: int) -> np.ndarray | None:
        v = self.w[q, self.HEAD + self.n:]
        return None if v[0] < 0 else v


def _words(n: int, rows: int, dtype: int, row_shape: tuple[int, ...] | None, out_elems: int,
           a: np.ndarray | None, b: np.ndarray | None, root: int = 0) -> np.ndarray:
    w = np.full(_Table.HEAD + 2 * n, -1, np.int64)
    w[0], w[1] = rows, dtype
    if row_shape is not None:
        w[2] = len(row_shape)
        w[3:3 + len(row_shape)] = row_shape
    w[_Table.HEAD - 2] = out_elems
    w[_Table.HEAD - 1] = root
    if a is not None:
        w[_Table.HEAD:_Table.HEAD + n] = a
    if b is not None:
        w[_Table.HEAD + n:] = b
    return w


class Uneven(Calls):
    """all_to_all_v, all_gather_v, gather_v, scatter_v."""

    if TYPE_CHECKING:   # what these are made of (ringlet.comm)
        _scratch: dict[str, np.ndarray]

        def all_gather(self, x: Any, out: Any = None, algorithm: str | None = None,
                       async_op: bool = False) -> Any: ...
        def _choose(self, collective: str, algorithm: str | None, nbytes: int) -> str: ...
        def _tmp(self, key: str, dtype: np.dtype[Any], count: int) -> np.ndarray: ...
        def _out(self, out: Any, like: Buffer, count: int, what: str,
                 same_is_in_place: bool = False) -> Buffer | None: ...

    # --- the calls ------------------------------------------------------------------------

    @_collective
    def all_to_all_v(self, x: Any, send_counts: Any, recv_counts: Any = None, out: Any = None,
                     algorithm: str | None = None, async_op: bool = False) -> Any:
        """Rows ``x[sum(send_counts[:j]) : sum(send_counts[:j+1])]`` go to rank j; the
        result holds rank j's rows for this rank in rank order: shape
        ``(sum(recv_counts), *x.shape[1:])``.  ``recv_counts`` is optional (the ranks'
        send counts say it); if given it must agree with them (else ArgumentError on the
        rank whose recv_counts disagree, MismatchError quoting it on the others).  MoE
        token dispatch and combine."""
        n = self.size
        xb = as_buffer(x, "x", writable=False)
        rows, rest = _rows(xb, "x")
        check_async(async_op)
        send = _counts(send_counts, n, "send_counts")
        recv = None if recv_counts is None else _counts(recv_counts, n, "recv_counts")
        if _total(send) != rows:
            raise ArgumentError(f"send_counts add up to {_total(send)} rows but x has "
                                f"{rows} (shape {xb.shape})")
        ob = None if out is None else as_buffer(out, "out", writable=True)
        self._same_kind(ob, xb)
        name = self._v_algorithm("all_to_all", algorithm)
        t = self._exchange(_words(n, rows, xb.dt.code, rest, -1 if ob is None else ob.count,
                                  send, recv))
        rest = self._agree_rows(t, range(n))
        row = int(np.prod(rest, dtype=np.int64))
        S = np.stack([t.counts(q, "all_to_all_v") for q in range(n)])   # rows i sends j
        for q in range(n):
            got = t.b(q)
            if got is not None and not np.array_equal(got, S[:, q]):
                j = int(np.flatnonzero(got != S[:, q])[0])
                self._blame(q, f"recv_counts say {int(got[j])} rows from rank {j}, which "
                               f"sends {int(S[j, q])}")
            self._check_out(t, q, int(S[:, q].sum()) * row)
        mine = int(S[:, self.rank].sum())
        ob = ob or self._between(lambda: new_buffer(xb, (mine, *rest)))
        sizes = {Buf.IN: tuple(int(v) * row for v in S[self.rank]),
                 Buf.OUT: tuple(int(v) * row for v in S[:, self.rank])}
        return self._v_run("all_to_all", name, 0, int(S.sum()) * row, xb, ob, sizes,
                           {Buf.IN: xb, Buf.OUT: ob}, async_op)

    @_collective
    def all_gather_v(self, x: Any, counts: Any = None, out: Any = None,
                     algorithm: str | None = None, async_op: bool = False) -> Any:
        """Every rank's ``x`` (``counts[q]`` rows from rank q; optional, the ranks' arrays
        say it), concatenated in rank order on every rank: shape
        ``(sum(counts), *x.shape[1:])``."""
        n = self.size
        check_async(async_op)
        xb, rows, rest, given = self._own_rows(x, counts)
        ob = None if out is None else as_buffer(out, "out", writable=True)
        self._same_kind(ob, xb)
        name = self._v_algorithm("all_gather", algorithm)
        t = self._exchange(_words(n, rows, xb.dt.code, rest, -1 if ob is None else ob.count,
                                  given, None))
        rest, c, row = self._gathered(t)
        for q in range(n):
            self._check_out(t, q, int(c.sum()) * row)
        ob = ob or self._between(lambda: new_buffer(xb, (int(c.sum()), *rest)))
        el = tuple(int(v) * row for v in c)
        sizes = {Buf.IN: (el[self.rank],), Buf.OUT: el}
        return self._v_run("all_gather", name, 0, sum(el), xb, ob, sizes,
                           {Buf.IN: xb, Buf.OUT: ob}, async_op)

    @_collective
    def gather_v(self, x: Any, root: int = 0, counts: Any = None, out: Any = None,
                 algorithm: str | None = None, async_op: bool = False) -> Any:
        """The root gets every rank's ``x`` (``counts[q]`` rows from rank q; optional)
        concatenated in rank order: shape ``(sum(counts), *x.shape[1:])``; None elsewhere."""
        n = self.size
        root = self._root(root)
        check_async(async_op)
        xb, rows, rest, given = self._own_rows(x, counts)
        ob = None
        if out is not None and self.rank == root:
            ob = as_buffer(out, "out", writable=True)
            self._same_kind(ob, xb)
        name = self._v_algorithm("gather", algorithm, root)
        t = self._exchange(_words(n, rows, xb.dt.code, rest, -1 if ob is None else ob.count,
                                  given, None, root))
        self._agree_root(t)
        rest, c, row = self._gathered(t)
        self._check_out(t, root, int(c.sum()) * row)
        if self.rank == root:
            ob = ob or self._between(lambda: new_buffer(xb, (int(c.sum()), *rest)))
        el = tuple(int(v) * row for v in c)
        sizes = {Buf.IN: (el[self.rank],), Buf.OUT: el}
        return self._v_run("gather", name, root, sum(el), xb, ob, sizes,
                           {Buf.IN: xb, Buf.OUT: ob}, async_op)

    @_collective
    def scatter_v(self, x: Any = None, counts: Any = None, root: int = 0, out: Any = None,
                  algorithm: str | None = None, async_op: bool = False) -> Any:
        """Rank q gets ``counts[q]`` rows of the root's ``x``, in rank order.  The root
        passes ``x`` and ``counts``; the other ranks pass ``out=`` (``counts[q]`` rows,
        the row shape of x) and may pass ``counts`` too.  Returns the received rows."""
        n = self.size
        root = self._root(root)
        check_async(async_op)
        given = None if counts is None else _counts(counts, n, "counts")
        if self.rank == root:
            if x is None or given is None:
                raise ArgumentError("the root must pass x and counts")
            xb = as_buffer(x, "x", writable=False)
            rows, rest = _rows(xb, "x")
            if _total(given) != rows:
                raise ArgumentError(f"counts add up to {_total(given)} rows but x has "
                                    f"{rows} (shape {xb.shape})")
            ob = None if out is None else as_buffer(out, "out", writable=True)
            self._same_kind(ob, xb)
            mine = int(given[root])
            desc_rows, kind = mine, xb
        else:
            if out is None:
                raise ArgumentError("ranks other than the root must pass out= (the "
                                    "receive buffer)")
            ob = as_buffer(out, "out", writable=True)
            mine, rest = _rows(ob, "out")
            if given is not None and int(given[self.rank]) != mine:
                raise ArgumentError(f"counts[{self.rank}] is {int(given[self.rank])} but out "
                                    f"has {mine} rows (shape {ob.shape})")
            xb, desc_rows, kind = ob, mine, ob
        name = self._v_algorithm("scatter", algorithm, root)
        t = self._exchange(_words(n, desc_rows, kind.dt.code, rest,
                                  -1 if ob is None else ob.count, given, None, root))
        self._agree_root(t)
        rest = self._agree_rows(t, range(n))
        c = t.counts(root, "scatter_v")
        self._agree_counts(t, range(n), c, "the root's give it")
        row = int(np.prod(rest, dtype=np.int64))
        for q in range(n):
            if q != root and t.rows(q) != int(c[q]):
                self._blame(q, f"out has {t.rows(q)} rows but the root's counts give it "
                               f"{int(c[q])}")
            self._check_out(t, q, int(c[q]) * row)
        if ob is None:
            ob = self._between(lambda: new_buffer(xb, (int(c[root]), *rest)))
        el = tuple(int(v) * row for v in c)
        sizes = {Buf.IN: el, Buf.OUT: (el[self.rank],)}
        bufs: dict[Buf, Buffer | None] = {Buf.OUT: ob}
        if self.rank == root:
            bufs[Buf.IN] = xb
        return self._v_run("scatter", name, root, sum(el), ob, ob, sizes, bufs, async_op)

    # --- the parts ------------------------------------------------------------------------

    def _own_rows(self, x: Any, counts: Any) -> tuple[Buffer, int, tuple[int, ...],
                                                      np.ndarray | None]:
        """x as a buffer, its rows and row shape, and the counts given (which must say
        this rank's rows)."""
        xb = as_buffer(x, "x", writable=False)
        rows, rest = _rows(xb, "x")
        given = None if counts is None else _counts(counts, self.size, "counts")
        if given is not None and int(given[self.rank]) != rows:
            raise ArgumentError(f"counts[{self.rank}] is {int(given[self.rank])} but x has "
                                f"{rows} rows (shape {xb.shape})")
        return xb, rows, rest, given

    def _gathered(self, t: _Table) -> tuple[tuple[int, ...], np.ndarray, int]:
        """After a gather's exchange: the row shape, every rank's rows (checked against
        the counts any rank gave) and a row's elements."""
        ranks = range(self.size)
        rest = self._agree_rows(t, ranks)
        c = np.array([t.rows(q) for q in ranks], np.int64)
        self._agree_counts(t, ranks, c)
        return rest, c, int(np.prod(rest, dtype=np.int64))

    def _same_kind(self, ob: Buffer | None, xb: Buffer) -> None:
        if ob is not None:
            if ob.dt != xb.dt:
                raise ArgumentError(f"out has dtype {ob.dt.name} but x is {xb.dt.name}")
            if xb.count and ob.count and np.shares_memory(ob.flat, xb.flat):
                raise ArgumentError("out overlaps x; pass a separate buffer or leave "
                                    "out=None")

    def _v_algorithm(self, collective: str, algorithm: str | None, root: int = 0) -> str:
        """The algorithm the user named (it must take uneven blocks), or None: chosen
        after the exchange."""
        if algorithm is None:
            return ""
        if not isinstance(algorithm, str):
            raise ArgumentError(f"algorithm must be a name (str), got {algorithm!r}")
        if algorithm == NATIVE:
            raise ArgumentError(f"{collective}: the engine's own collectives take equal "
                                f"blocks only; use one of "
                                f"{uneven_algorithms(collective, self.size, root)}")
        why = uneven_ok(_build(collective, algorithm, self.size, root))
        if why is not None:
            where = f" at root {root}" if collective in ROOTED else ""
            raise ArgumentError(
                f"algorithm {algorithm!r} cannot run {collective} with blocks of different "
                f"sizes{where}; use one of {uneven_algorithms(collective, self.size, root)}")
        return algorithm

    def _exchange(self, words: np.ndarray) -> _Table:
        got = self.all_gather(words)
        return _Table(np.asarray(got).reshape(-1), self.size)

    def _blame(self, q: int, text: str) -> None:
        """Rank q's arguments are wrong: ArgumentError there, MismatchError elsewhere."""
        api = self._api or "uneven collective"
        if q == self.rank:
            raise ArgumentError(f"{api} on rank {q}: {text}")
        raise MismatchError(f"{api}: rank {q}: {text}")

    def _agree_rows(self, t: _Table, ranks: range) -> tuple[int, ...]:
        """The row shape every rank gave (MismatchError unless they agree)."""
        shapes = {q: t.row_shape(q) for q in ranks}
        known = {q: s for q, s in shapes.items() if s is not None}
        first = next(iter(known.values()))
        for q, s in known.items():
            if s != first:
                raise MismatchError(f"{self._api}: ranks disagree on the shape of a row: "
                                    f"rank {next(iter(known))} has {first}, rank {q} has {s}")
        dts = {t.dtype(q) for q in ranks}
        if len(dts) > 1:
            from .ops import dtype_of_code

            def name(code: int) -> str:
                d = dtype_of_code(code)
                return d.name if d is not None else str(code)

            have = ", ".join(f"rank {q}: {name(t.dtype(q))}" for q in ranks)
            raise MismatchError(f"{self._api}: ranks disagree on the dtype ({have})")
        return first

    def _agree_root(self, t: _Table) -> None:
        """Every rank named the same root (MismatchError on every rank unless so)."""
        roots = [t.root(q) for q in range(self.size)]
        if len(set(roots)) > 1:
            raise MismatchError(f"{self._api}: ranks disagree on the root: " + ", ".join(
                f"rank {q}: {rt}" for q, rt in enumerate(roots)))

    def _agree_counts(self, t: _Table, ranks: range, c: np.ndarray,
                      truth: str = "it has") -> None:
        """The counts some ranks passed must be what the ranks' rows say (``truth``: what
        ``c`` is, for the message): an ArgumentError on the rank whose counts differ, a
        MismatchError on the others."""
        for q in ranks:
            given = t.a(q)
            if given is not None and not np.array_equal(given, c):
                j = int(np.flatnonzero(given != c)[0])
                self._blame(q, f"counts[{j}] is {int(given[j])} rows, {truth} {int(c[j])}")

    def _check_out(self, t: _Table, q: int, elems: int) -> None:
        have = t.out_elems(q)
        if have >= 0 and have != elems:
            self._blame(q, f"out has {have} elements, the result has {elems}")

    def _v_run(self, collective: str, name: str, root: int, total: int, like: Buffer,
               ob: Buffer | None, sizes: dict[Buf, tuple[int, ...]],
               bufs: dict[Buf, Buffer | None], async_op: bool) -> Any:
        """Agree on the data part and run it (async if asked)."""
        n = self.size
        if not name:
            name = self._choose(collective, None, total * like.dt.itemsize)
            if name == NATIVE or uneven_ok(_build(collective, name, n, root)) is not None:
                name = next(a for a in PREFERRED[collective]
                            if uneven_ok(_build(collective, a, n, root)) is None)
        sched = _build(collective, name, n, root)
        api = self._api or collective
        desc = agreement.make(api, dtype=like.dt.code, count=total, root=root,
                              algorithm=name, path=GENERIC)
        flat = {b: v.flat for b, v in bufs.items() if v is not None}
        result = None if ob is None else ob.obj

        def run(seq: int) -> Any:
            if total:
                self._v_execute(sched, sizes, flat, like)
            return result

        return self._submit(desc, run, async_op, name, like)

    def _v_execute(self, sched: Schedule, sizes: dict[Buf, tuple[int, ...]],
                   flat: dict[Buf, np.ndarray], like: Buffer) -> None:
        key: list[tuple[Buf, tuple[int, ...]]] = []
        for b, lay in sched.layouts.items():
            if b in sizes:
                key.append((b, sizes[b]))
            else:   # TMP: one block per rank, as OUT (IN for scatter) has them
                src = sizes[Buf.OUT] if len(sizes[Buf.OUT]) == lay.blocks else sizes[Buf.IN]
                key.append((b, src))
        prog = compile_uneven(sched, self.rank, tuple(key))
        arrays = {int(b): a for b, a in flat.items()}
        dt = like.dt.np_dtype
        for b in (Buf.OUT, Buf.TMP):
            if int(b) not in arrays and int(b) in prog.elems:
                arrays[int(b)] = self._tmp(f"v{int(b)}", dt, prog.elems[int(b)])
        execute(prog, self._t, arrays, None, lambda: self._current)


__all__ = ["PREFERRED", "Uneven", "block_bounds", "listed", "uneven_algorithms",
           "uneven_ok"]

