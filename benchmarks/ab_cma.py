"""Single-copy reads (cross-memory attach) against the staged path, A/B in one job.

The figures behind ``RINGLET_CMA_BYTES`` (ringlet.transport.cma; off by
default: the cost model does not know the kernel's copy yet).

    python benchmarks/ab_cma.py [-n 2]        # about a minute on 2 cores

all_gather, all_to_all and broadcast at 1, 4 and 16 MiB (the nccl-tests
size: the gathered or exchanged vector) with fresh ``np.empty`` arrays, the
staged shared-memory path and the single-copy one (``process_vm_readv``, at
every size here: ``cma_bytes`` 1; for broadcast, which the communicator
runs staged, the same single-copy step called directly)
alternating in blocks within one job (every rank switches together), and
the raw speed of one process_vm_readv of 8 MiB against one memcpy of 8 MiB.
Prints the median time of each and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from abtimer import timer

import ringlet
from ringlet.config import Settings
from ringlet.transport import cma

SIZES = (1 << 20, 4 << 20, 16 << 20)


def body(comm: ringlet.Communicator, blocks: int) -> dict[str, list[float]]:
    n, f = comm.size, comm._fused
    out: dict[str, list[float]] = {}

    timed = timer(comm, out)

    r = comm.rank
    cases = []
    for nb in SIZES:
        part, whole = np.ones(nb // 4 // n, np.float32), np.empty(nb // 4, np.float32)
        x, y = np.ones(nb // 4, np.float32), np.empty(nb // 4, np.float32)

        def bcast(x: np.ndarray = x) -> None:
            f._single_copy(x if r == 0 else None, [] if r == 0 else [(0, 0, x)])

        cases += [(f"all_gather {nb >> 20}M", lambda p=part, w=whole: comm.all_gather(p, out=w),
                   None),
                  (f"all_to_all {nb >> 20}M", lambda x=x, y=y: comm.all_to_all(x, out=y), None),
                  (f"broadcast {nb >> 20}M", lambda x=x: comm.broadcast(x, 0), bcast)]
    for b in range(blocks):
        for on in ((True, False) if b % 2 == 0 else (False, True)):
            f.cma = on
            for label, staged, single in cases:
                timed(f"{label} {'single' if on else 'staged'}",
                      single if on and single is not None else staged, 10)
        f.cma = True
    # the raw copy speeds: rank 0 reads rank 1's array (rank 1 waits in the barrier)
    src = np.ones(2 << 20, np.float32)
    where = comm.all_gather_object(cma.address(src))
    if comm.rank == 0 and n > 1:
        dst, pid = np.zeros_like(src), comm._t.pids[1]
        for label, fn in (("memcpy 8M", lambda: np.copyto(dst, src)),
                          ("process_vm_readv 8M", lambda: cma.read(pid, where[1], dst))):
            ts = []
            for _ in range(20):
                a = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - a)
            out[label] = [statistics.median(ts) * 1e6]
    comm.barrier()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--blocks", type=int, default=6)
    a = ap.parse_args()
    # single copies at every size here (cma_bytes 1), switched on and off per block
    res = ringlet.spawn(body, a.n, a.blocks,
                        settings=Settings.from_env().replace(cma_bytes=1))[0]
    for label in [k for k in res if k.endswith("single")]:
        base = label[:-len(" single")]
        s = statistics.median(res[label])
        t = statistics.median(res[base + " staged"])
        print(f"{base:16s} staged {t:8.0f} us   single copy {s:8.0f} us   staged/single "
              f"{t / s:5.2f}")
    for k in ("memcpy 8M", "process_vm_readv 8M"):
        if k in res:
            print(f"{k:20s} {statistics.median(res[k]):8.0f} us")


if __name__ == "__main__":
    main()
