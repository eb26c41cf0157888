"""Errors over the MPI transport: every rank hears of every problem, and nothing hangs.

    mpiexec -n N python tests/scripts/mpi_errors.py        (N >= 2)

In order, on one communicator: ranks pass different counts (MismatchError on every
rank); one rank passes a bad op between good calls (ArgumentError there, MismatchError
quoting it elsewhere, the next call fine); a split into two colors with collectives in
each.  Then, on communicators of their own: a rank closes early while the others wait
(PeerError naming it); the last rank skips a call (the others time out naming it, and
their abort reaches it).
"""

from __future__ import annotations

import time

import numpy as np
from mpi_common import Report, communicator, guarded

from ringlet.comm import Communicator
from ringlet.errors import ArgumentError, CommTimeoutError, MismatchError, PeerError, RingletError

TIMEOUT = 1.0   # the short deadline of the timeout test, seconds


def mismatch(comm: Communicator, rep: Report) -> None:
    n, r = comm.size, comm.rank
    x = np.ones(5 if r == 0 else 4, np.float32)
    rep.expect_raise(MismatchError, lambda: comm.all_reduce(x), "count")
    y = np.ones(4, np.float32)
    comm.all_reduce(y)
    rep.check(bool((y == n).all()), f"all_reduce after a mismatch: {y}")
    # a different root
    rep.expect_raise(MismatchError, lambda: comm.broadcast(np.zeros(3), root=r % 2), "root")
    comm.barrier()


def rejected(comm: Communicator, rep: Report) -> None:
    n, r = comm.size, comm.rank
    bad = n - 1
    comm.all_reduce(np.ones(3))
    x = np.ones(3)
    if r == bad:
        rep.expect_raise(ArgumentError, lambda: comm.all_reduce(x, op="bogus"),
                         f"on rank {bad}", "bogus")
    else:
        rep.expect_raise(MismatchError, lambda: comm.all_reduce(x),
                         f"rank {bad}", "bogus")
    z = np.full(3, r + 1.0)
    comm.all_reduce(z, op="max")
    rep.check(bool((z == n).all()), f"the call after a rejected one: {z}")
    g = comm.all_gather(np.array([r]))
    rep.check(g.ravel().tolist() == list(range(n)), f"all_gather after: {g.ravel()}")


def split(comm: Communicator, rep: Report) -> None:
    n, r = comm.size, comm.rank
    sub = comm.split(r % 2, key=-r)    # reversed order inside each color
    assert sub is not None
    members = [q for q in range(n) if q % 2 == r % 2][::-1]
    rep.check(sub.size == len(members) and sub.rank == members.index(r),
              f"split: rank {sub.rank} of {sub.size}, want {members.index(r)} of "
              f"{len(members)}")
    x = np.array([r, 1], np.int64)
    sub.all_reduce(x)
    rep.check(x.tolist() == [sum(members), len(members)], f"split all_reduce: {x}")
    g = sub.all_gather(np.array([r]))
    rep.check(g.ravel().tolist() == members, f"split all_gather: {g.ravel()}")
    b = sub.broadcast(np.array([r]), root=0)
    rep.check(b.tolist() == [members[0]], f"split broadcast: {b}")
    nat = np.array([1.5], np.float32)
    sub.all_reduce(nat, algorithm="native")
    rep.check(nat[0] == 1.5 * len(members), f"split native all_reduce: {nat}")
    if sub.size > 1:   # messages inside the group, addressed by group rank
        right, left = (sub.rank + 1) % sub.size, (sub.rank - 1) % sub.size
        sub.send(np.array([r]), right, tag=1)
        got = sub.recv(np.empty(1, np.int64), left, tag=1)
        rep.check(int(got[0]) == members[left], f"split p2p: {got}")
    none = comm.split(None if r == 0 else 0)
    rep.check((none is None) == (r == 0), "split with color None")
    if none is not None:
        rep.check(none.size == n - 1, f"split without rank 0: size {none.size}")
        none.barrier()
        none.close()
    sub.close()
    comm.barrier()   # the parent still works


def closed_early(rep: Report) -> None:
    """Rank 0 closes; the others, waiting for it in a collective, name it."""
    comm = communicator(timeout=20.0)
    if comm.rank == 0:
        comm.close()
        return
    start = time.monotonic()
    rep.expect_raise(PeerError, lambda: comm.all_reduce(np.ones(2)),
                     "rank 0 closed the communicator", "every rank must make the same calls")
    rep.check(time.monotonic() - start < 10, "a closed peer took too long to notice")
    comm.close()


def timeout(rep: Report) -> None:
    """The last rank skips a call: the others time out naming it.  It does not hear of
    it: over MPI a timed-out rank tells nobody (a rank it waited for may be dead, and a
    send to a dead rank can crash MPICH), so its own call times out naming them."""
    comm = communicator(timeout=TIMEOUT)
    n, r = comm.size, comm.rank
    late = n - 1
    comm.barrier()
    if r != late:
        start = time.monotonic()
        rep.expect_raise(CommTimeoutError, lambda: comm.all_reduce(np.ones(4)),
                         f"rank {late} did not arrive", "all_reduce")
        took = time.monotonic() - start
        rep.check(TIMEOUT * 0.9 < took < TIMEOUT + 8, f"timed out after {took:.1f} s")
    else:
        time.sleep(TIMEOUT + 1.5)
        # the peers gave up and left without a word: this rank's call times out too, in
        # the call's first round (their descriptors had come: they agreed to the call)
        others = ", ".join(map(str, range(late)))
        rep.expect_raise(CommTimeoutError, lambda: comm.all_reduce(np.ones(4)),
                         f"{'ranks' if late > 1 else 'rank'} {others} agreed to the call but "
                         f"did not send or take this round's data")
    rep.expect_raise(RingletError, lambda: comm.barrier(), "")
    comm.close()


def main() -> None:
    comm = communicator()
    rep = Report(comm, "mpi_errors")
    if comm.size < 2:
        rep.fail("run with 2 or more ranks")
        rep.finish()
    guarded(rep, "mismatch", lambda: mismatch(comm, rep))
    guarded(rep, "rejected", lambda: rejected(comm, rep))
    guarded(rep, "split", lambda: split(comm, rep))
    guarded(rep, "closed early", lambda: closed_early(rep))
    guarded(rep, "timeout", lambda: timeout(rep))
    comm.barrier()
    comm.close()
    rep.finish()


if __name__ == "__main__":
    main()
