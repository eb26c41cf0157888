"""ringlet: collective communication for Python.

Real collectives across processes (shared memory on one host by default),
every algorithm written once as a schedule that is executed, verified,
costed and drawn.
"""

from __future__ import annotations

from .algorithms import algorithms
from .bucket import Bucketer
from .comm import Communicator, Work
from .config import Settings
from .errors import (
    ArgumentError,
    CommTimeoutError,
    ConfigError,
    MismatchError,
    PeerError,
    RingletError,
    SpawnError,
    VerificationError,
)
from .launch import spawn
from .ops import ReduceOp, pairs
from .p2p import ANY_SOURCE, ANY_TAG, Status
from .schedule import Schedule
from .startup import init
from .verify import verify as _verify_schedule

__version__ = "0.1.0"


def verify(collective: str, algorithm: str, nranks: int, root: int = 0, **params: int) -> None:
    """Run ``algorithm``'s schedule for ``collective`` on ``nranks`` ranks symbolically.

    Raises :class:`VerificationError`, naming the rank and chunk, if the end
    condition fails or a step reads a chunk its rank never received.
    """
    from .algorithms import build

    _verify_schedule(build(collective, algorithm, nranks, root, **params))


__all__ = [
    "ANY_SOURCE", "ANY_TAG", "ArgumentError", "Bucketer", "CommTimeoutError", "Communicator",
    "ConfigError", "MismatchError",
    "PeerError", "ReduceOp", "RingletError", "Schedule", "Settings", "SpawnError", "Status",
    "VerificationError", "Work", "algorithms", "init", "pairs", "spawn", "verify",
]
