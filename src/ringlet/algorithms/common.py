"""Small helpers the family modules share (no algorithms here)."""

from __future__ import annotations

from ..errors import ArgumentError
from ..schedule import Buf, Ref


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
