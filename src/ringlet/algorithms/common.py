"""Small helpers the family modules share (no algorithms here)."""

from __future__ import annotations

import numpy as np

from ..errors import ArgumentError
from ..schedule import Buf, Ref

#: A round's messages as vectors (see :meth:`ringlet.schedule.Schedule.round_arrays`).
Messages = dict[str, np.ndarray]


def lg(n: int) -> int:
    """ceil(lg n) for n >= 1: the rounds of a binomial tree or of Bruck on n ranks."""
    return (n - 1).bit_length()


def span(buf: Buf, first: int, count: int, n: int) -> list[Ref]:
    """Blocks ``first, first+1, ...`` (``count`` of them, mod ``n``) of an ``n``-block buffer,
    as at most two ranges (the run may wrap past block ``n-1``)."""
    first %= n
    head = min(count, n - first)
    refs: list[Ref] = [(buf, first, first + head)]
    if count > head:
        refs.append((buf, 0, count - head))
    return refs


def check_pieces(name: str, pieces: int) -> int:
    """``pieces`` as given, or an ArgumentError if it is not a positive whole number."""
    if not isinstance(pieces, int) or isinstance(pieces, bool) or pieces < 1:
        raise ArgumentError(f"{name}: pieces must be a whole number >= 1, got {pieces!r}")
    return pieces


def messages(src: np.ndarray | int, dst: np.ndarray | int, chunks: np.ndarray | int = 1,
             reduce: np.ndarray | bool = False) -> Messages:
    """One round's messages as the vectors of ``Schedule.round_arrays`` (scalars are
    broadcast to the length of the others)."""
    if isinstance(src, np.ndarray) and isinstance(dst, np.ndarray) and src.ndim == 1 and \
            src.shape == dst.shape and np.ndim(chunks) == 0 and np.ndim(reduce) == 0:
        # the common form, without broadcast_arrays' cost (a third of a 16,384-rank round)
        k = len(src)
        # (views, as broadcast_arrays gives: frozen() makes them read-only, not the caller's)
        return {"src": src.astype(np.int64, copy=False).view(),
                "dst": dst.astype(np.int64, copy=False).view(),
                "chunks": np.full(k, chunks, np.int64), "reduce": np.full(k, reduce, bool)}
    s, d, c, r = np.broadcast_arrays(np.asarray(src, np.int64), np.asarray(dst, np.int64),
                                     np.asarray(chunks, np.int64), np.asarray(reduce, bool))
    return {"src": s.ravel(), "dst": d.ravel(), "chunks": c.ravel(), "reduce": r.ravel()}


def frozen(m: Messages) -> Messages:
    """``m`` with read-only vectors: for closed forms that hand out the same vectors for
    many rounds (the simulator recognises them), so no caller can change them."""
    for v in m.values():
        v.flags.writeable = False
    return m


def no_messages() -> Messages:
    return messages(np.zeros(0, np.int64), np.zeros(0, np.int64))


def all_pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) of one message from every rank to every other (r -> r+1, r+2, ...)."""
    r = np.arange(n, dtype=np.int64)
    k = np.arange(1, n, dtype=np.int64)
    return np.repeat(r, n - 1), ((r[:, None] + k[None, :]) % n).ravel()


def lowbit(x: np.ndarray) -> np.ndarray:
    """x & -x, elementwise (0 for 0)."""
    return x & -x
