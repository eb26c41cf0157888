"""Functions that ``ringlet.spawn`` tests run on each rank (module level, so they pickle).

``fake_init`` stands in for ``ringlet.init`` in the tests of the process
management, which need no communication.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from typing import Any

from ringlet.errors import ArgumentError


@dataclass
class FakeComm:
    rank: int
    size: int
    job_id: str
    closed_ok: bool = True

    def close(self) -> None:
        if not self.closed_ok:
            raise RuntimeError("close went wrong")


def fake_init(*, settings: Any, rank: int, size: int, job_id: str) -> FakeComm:
    return FakeComm(rank, size, job_id)


def broken_init(*, settings: Any, rank: int, size: int, job_id: str) -> FakeComm:
    raise OSError(f"no shared memory for rank {rank}")


def whoami(comm: FakeComm, scale: int) -> tuple[int, int, int, str]:
    time.sleep(0.05 * (comm.size - comm.rank))  # finish in reverse rank order
    return comm.rank, comm.size, comm.rank * scale, comm.job_id


def bad_root_on_rank_1(comm: FakeComm, after: float) -> int:
    if comm.rank == 1:
        raise ArgumentError(f"root 7 is out of range for a communicator of size {comm.size}")
    time.sleep(after)
    raise TimeoutError(f"rank {comm.rank}: peer 1 did not arrive")


def fail_one_hang_others(comm: FakeComm) -> None:
    if comm.rank == comm.size - 1:
        raise ValueError("boom")
    time.sleep(60)


def exit_without_reporting(comm: FakeComm) -> int:
    if comm.rank == 1:
        os._exit(7)
    if comm.rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    if comm.rank == 3:
        os._exit(0)
    return comm.rank


def sleep_on_odd_ranks(comm: FakeComm, seconds: float) -> int:
    if comm.rank % 2:
        time.sleep(seconds)
    return comm.rank


def unpicklable_result(comm: FakeComm) -> Any:
    return (lambda: None) if comm.rank == 0 else comm.rank


def big_result(comm: FakeComm, n: int) -> bytes:
    return bytes([comm.rank]) * n


def leave_a_segment(comm: FakeComm) -> None:
    with open(f"/dev/shm/ringlet-{comm.job_id}-w-test-{comm.rank}", "w") as f:
        f.write("left behind")
    raise RuntimeError(f"rank {comm.rank} crashed during start-up")


def fail_in_close(comm: FakeComm) -> int:
    comm.closed_ok = comm.rank != 0
    return comm.rank


# -- with the real communicator ---------------------------------------------------------------


def pass_around(comm: Any) -> float:
    """Send this rank's number to the next rank; return what the previous one sent."""
    import numpy as np

    mine, theirs = np.array([comm.rank + 1.0]), np.zeros(1)
    work = comm.isend(mine, (comm.rank + 1) % comm.size)
    comm.recv(theirs, (comm.rank - 1) % comm.size)
    work.wait()
    return float(theirs[0])


def send_to_a_missing_rank(comm: Any) -> None:
    import numpy as np

    comm.send(np.zeros(4), dst=7)
