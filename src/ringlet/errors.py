"""The one error hierarchy of ringlet.

Every problem a user can trigger is one of these, never an ``assert``, a
``print`` or ``sys.exit``.  Messages quote the bad value and say how to fix it.

::

    RingletError
    ├── ArgumentError      bad arguments, raised before any communication (also a ValueError)
    ├── ConfigError        an unknown or malformed setting / RINGLET_* variable (also a ValueError)
    ├── MismatchError      ranks disagree about a collective (op, dtype, count, root, order)
    ├── CommTimeoutError   a wait passed its deadline (also a TimeoutError)
    ├── PeerError          a peer process died or the communicator was aborted by a peer
    ├── VerificationError  a schedule failed its symbolic check
    └── SpawnError         a rank started by ringlet.spawn failed
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar


class RingletError(Exception):
    """Base class of every error ringlet raises on purpose."""


class ArgumentError(RingletError, ValueError):
    """A bad argument, detected locally before any communication.

    The communicator stays usable after it.
    """


class ConfigError(RingletError, ValueError):
    """An unknown or malformed setting."""


class MismatchError(RingletError):
    """Ranks called a collective with arguments that disagree.

    Raised on every rank of the communicator, naming the disagreement.
    """


class CommTimeoutError(RingletError, TimeoutError):
    """A wait passed its deadline.

    The message names the collective, its sequence number and the ranks that
    did not arrive.
    """


class PeerError(RingletError):
    """A peer died, or a peer aborted the communicator after its own error."""


class VerificationError(RingletError):
    """A schedule does not meet its collective's end condition."""


class SpawnError(RingletError):
    """One or more ranks started by :func:`ringlet.spawn` failed.

    ``failures`` maps each failed rank to a one-line description;
    ``details`` maps it to the full remote traceback where there is one.
    """

    def __init__(self, message: str, failures: dict[int, str] | None = None,
                 details: dict[int, str] | None = None) -> None:
        super().__init__(message)
        self.failures: dict[int, str] = dict(failures or {})
        self.details: dict[int, str] = dict(details or {})


_E = TypeVar("_E", bound=BaseException)


def relayed(exc: _E, like: BaseException | None = None) -> _E:
    """Mark ``exc`` as another rank's failure that this rank heard of (a peer's abort
    notice), not a failure of its own; with ``like``, only if ``like`` was one (an error
    that rewraps it).  ``ringlet run`` does not blame a rank for failing first with one,
    as with a PeerError: a timeout relayed is a CommTimeoutError like the rank's own."""
    if like is None or is_relayed(like):
        exc.relayed = True  # type: ignore[attr-defined]
    return exc


def is_relayed(exc: BaseException) -> bool:
    """Whether ``exc`` is another rank's failure this rank heard of (:func:`relayed`)."""
    return bool(getattr(exc, "relayed", False))


def name_ranks(ranks: Iterable[object]) -> str:
    """``rank 3`` or ``ranks 1, 2``: ranks as an error message names them, in the order given."""
    rs = list(ranks)
    return f"rank{'' if len(rs) == 1 else 's'} {', '.join(map(str, rs))}"
