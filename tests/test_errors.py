"""Bad input and disagreeing ranks: a clear RingletError on every rank, never a hang.

Argument errors are raised locally before anything is sent, and the
communicator keeps working after them.  Disagreements between ranks are
caught by the descriptor check and raised on every rank, naming the
disagreement.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import get_world

import ringlet

# --- argument errors: raised locally, communicator still usable ------------------------------

BAD_CALLS = [
    ("unknown op", lambda c: c.all_reduce(np.ones(3), op="median"), "unknown reduction op"),
    ("bitwise on float", lambda c: c.all_reduce(np.ones(3), op="bxor"),
     "bitwise op BXOR is not defined for float64"),
    ("logical on float", lambda c: c.all_reduce(np.ones(3), op="land"),
     "logical op LAND is defined for bool and integer"),
    ("avg on int", lambda c: c.all_reduce(np.ones(3, np.int32), op="avg"),
     "AVG is defined for floating"),
    ("min on complex", lambda c: c.all_reduce(np.ones(3, np.complex64), op="min"),
     "MIN is not defined for complex"),
    ("root too big", lambda c: c.broadcast(np.ones(3), root=c.size), "root .* is out of range"),
    ("negative root", lambda c: c.reduce(np.ones(3), root=-1), "root -1 is out of range"),
    ("root not int", lambda c: c.gather(np.ones(3), root="0"), "root must be an int"),
    ("non-contiguous", lambda c: c.all_reduce(np.ones((4, 4))[:, 1]), "C-contiguous"),
    ("read-only in place", lambda c: c.all_reduce(np.frombuffer(b"\0" * 16, np.float64)),
     "read-only"),
    ("not an array", lambda c: c.all_reduce([1.0, 2.0]), "numpy.ndarray or a torch"),
    ("unsupported dtype", lambda c: c.all_reduce(np.ones(3, np.dtype("<U1"))),
     "not supported"),
    ("reduce_scatter indivisible", lambda c: c.reduce_scatter(np.ones(c.size * 2 + 1)),
     "divisible by the communicator size"),
    ("all_to_all indivisible", lambda c: c.all_to_all(np.ones(c.size + 1)),
     "divisible by the communicator size"),
    ("scatter indivisible", lambda c: c.scatter(np.ones(c.size + 1) if c.rank == 0 else None,
                                                out=np.ones(1)),
     "divisible by the communicator size|holds|out"),
    ("scatter without out", lambda c: c.scatter(None, root=0) if c.rank else
     c.scatter(None, root=0), "must pass"),
    ("out wrong size", lambda c: c.all_reduce(np.ones(3), out=np.ones(4)), "out has 4 elements"),
    ("out wrong dtype", lambda c: c.all_gather(np.ones(3), out=np.ones((c.size, 3), np.float32)),
     "out has dtype float32"),
    ("out overlaps x", lambda c: (lambda a: c.all_reduce(a[:2], out=a[1:]))(np.ones(3)),
     "overlaps"),
    ("unknown algorithm", lambda c: c.all_reduce(np.ones(3), algorithm="telepathy"),
     "all_reduce has no algorithm 'telepathy'; valid: .*ring"),
    ("bad peer", lambda c: c.send(np.ones(3), dst=c.size), "not a rank of this communicator"),
    ("bad tag", lambda c: c.send(np.ones(3), dst=0, tag=-1), "tag must be an int >= 0"),
]


def _bad_call(comm: ringlet.Communicator, i: int) -> list[str]:
    name, call, pattern = BAD_CALLS[i]
    import re

    out: list[str] = []
    if "indivisible" in name and comm.size == 1:
        return out   # every first dimension divides by 1
    try:
        call(comm)
        out.append(f"{name}: no error")
    except (ringlet.ArgumentError, ringlet.MismatchError) as exc:
        # the rank with the bad argument raises ArgumentError; a rank whose own arguments
        # were fine learns of it through the descriptor check (MismatchError quoting it)
        if not re.search(pattern, str(exc)):
            out.append(f"{name}: message {exc!s} does not match {pattern!r}")
    except Exception as exc:  # noqa: BLE001 - reported to the test
        out.append(f"{name}: raised {type(exc).__name__}: {exc}")
    # the communicator keeps working after a local argument error
    x = np.ones(2)
    comm.all_reduce(x)
    if not (x == comm.size).all():
        out.append(f"{name}: communicator broken afterwards")
    return out


@pytest.mark.parametrize("i", range(len(BAD_CALLS)), ids=[b[0] for b in BAD_CALLS])
@pytest.mark.parametrize("n", [1, 3])
def test_bad_arguments_raise_locally(n: int, i: int) -> None:
    for r, bad in enumerate(get_world(n).run(_bad_call, i)):
        assert not bad, f"rank {r}: {bad}"


def _read_only_broadcast(comm: ringlet.Communicator) -> str:
    x = np.ones(3)
    x.flags.writeable = comm.rank == 0   # the root's may be read-only
    try:
        comm.broadcast(x, root=0)
    except (ringlet.ArgumentError, ringlet.MismatchError) as exc:
        return str(exc)
    return "no error"


def test_a_read_only_broadcast_buffer_is_not_told_to_give_out() -> None:
    # broadcast has no out=: the hint was wrong
    assert get_world(2).run(_read_only_broadcast)[1] == \
        "broadcast on rank 1: x is read-only but this call writes into it; pass a writable array"


def test_errors_are_one_hierarchy() -> None:
    for cls in (ringlet.ArgumentError, ringlet.MismatchError, ringlet.CommTimeoutError,
                ringlet.PeerError, ringlet.ConfigError, ringlet.SpawnError,
                ringlet.VerificationError):
        assert issubclass(cls, ringlet.RingletError)
    assert issubclass(ringlet.CommTimeoutError, TimeoutError)
    assert issubclass(ringlet.ArgumentError, ValueError)


# --- ranks that disagree ----------------------------------------------------------------------

def _disagree(comm: ringlet.Communicator, what: str) -> None:
    r = comm.rank
    if what == "dtype":
        comm.all_reduce(np.ones(4, np.float32 if r == 0 else np.float64))
    elif what == "count":
        comm.all_reduce(np.ones(4 + (r == 1)))
    elif what == "op":
        comm.all_reduce(np.ones(4), op="max" if r == 1 else "sum")
    elif what == "root":
        comm.broadcast(np.ones(4), root=r)
    elif what == "collective":
        if r == 0:
            comm.all_reduce(np.ones(4))
        else:
            comm.broadcast(np.ones(4))
    elif what == "algorithm":
        comm.all_reduce(np.ones(4), algorithm="naive" if r == 0 else "ring")


@pytest.mark.parametrize("what,pattern", [
    ("dtype", r"disagree about the dtype of all_reduce #\d+.*rank 0: float32; "
              r"ranks? [\d, ]+: float64"),
    ("count", r"disagree about the count of all_reduce #\d+.*rank 1: 5"),
    ("op", r"disagree about the op of all_reduce #\d+.*rank 1: MAX"),
    ("root", r"disagree about the root of broadcast #\d+.*rank 0: 0; rank 1: 1"),
    ("collective", r"disagree about the collective #\d+: rank 0: all_reduce; "
                   r"ranks? [\d, ]+: broadcast"),
    ("algorithm", r"disagree about the algorithm of all_reduce #\d+.*rank 0: naive"),
])
@pytest.mark.parametrize("n", [2, 3, 5])
def test_disagreement_raises_on_every_rank(n: int, what: str, pattern: str) -> None:
    world = get_world(n)
    errors = world.run_expect_errors(_disagree, what)
    assert sorted(errors) == list(range(n)), f"only ranks {sorted(errors)} raised"
    for r, (kind, msg) in errors.items():
        assert kind == "MismatchError", (r, kind, msg)
        assert __import__("re").search(pattern, msg), (r, msg)
    # and the communicator is still usable on every rank
    assert world.run(_sum_of_ranks) == [sum(range(n))] * n


def _sum_of_ranks(comm: ringlet.Communicator) -> int:
    x = np.array([comm.rank])
    comm.all_reduce(x)
    return int(x[0])


def test_sum_of_ranks_everywhere(world: Any) -> None:
    n = world.size
    assert world.run(_sum_of_ranks) == [n * (n - 1) // 2] * n
