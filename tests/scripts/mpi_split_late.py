"""A split whose first member gives up before its last member comes (3 ranks over MPI).

Run as ``mpiexec -n 3 python mpi_split_late.py``.  Rank 1 comes to build the group at
once, rank 2 after 1.2 s and rank 0 after 2.2 s, with a 1.5 s deadline: rank 1 times out
naming rank 0.  Rank 2 must not then finish the meeting when rank 0 comes and wait in
``MPI_Comm_create_group`` for rank 1, which left (it hung there for ever before the
meeting's second round): ranks 2 and 0 raise a PeerError naming rank 1 as soon as they
hear it gave up, and each rank's communicator is broken, so its next collective fails
at once.
"""

from __future__ import annotations

import time

import numpy as np
from mpi_common import Report, communicator, guarded

from ringlet.errors import CommTimeoutError, PeerError, RingletError

DEADLINE = 1.5
DELAY = {0: 2.2, 1: 0.0, 2: 1.2}


def late_split(comm: object, rep: Report) -> None:
    c = comm
    r = c.rank  # type: ignore[attr-defined]
    split = c._t.split  # type: ignore[attr-defined]

    def late(*args: object, **kw: object) -> object:
        time.sleep(DELAY[r])
        return split(*args, **kw)

    c._t.split = late  # type: ignore[attr-defined]
    t0 = time.monotonic()
    if r == 1:
        rep.expect_raise(CommTimeoutError, lambda: c.split(0),  # type: ignore[attr-defined]
                         "building the MPI group of ranks [0, 1, 2]: rank 0 did not arrive")
    else:
        rep.expect_raise(PeerError, lambda: c.split(0),  # type: ignore[attr-defined]
                         "rank 1 gave up building the MPI group of ranks [0, 1, 2]")
    took = time.monotonic() - t0
    rep.check(took < max(DELAY[r], DEADLINE) + 1.0, f"the split ended after {took:.1f} s")
    t0 = time.monotonic()
    rep.expect_raise(RingletError, lambda: c.all_reduce(np.ones(2)))  # type: ignore
    rep.check(time.monotonic() - t0 < 0.5, "the next collective did not fail at once")


def main() -> None:
    comm = communicator(timeout=DEADLINE)
    rep = Report(comm, "mpi_split_late")
    if comm.size != 3:
        rep.fail("run with 3 ranks")
        rep.finish()
    comm.barrier()
    guarded(rep, "late split", lambda: late_split(comm, rep))
    comm.close()
    rep.finish()


if __name__ == "__main__":
    main()
