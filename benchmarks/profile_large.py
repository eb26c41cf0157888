"""Where the time of a large all_gather, all_to_all or broadcast goes, beside MPICH's (RESULTS.md).

    python benchmarks/profile_large.py [--bytes 16M] [--reps 30] [--no-strace]

Two ranks on this host, the nccl-tests size (the gathered or exchanged
vector: blocks of half of it), fresh ``np.empty`` arrays as users make them.
Three jobs:

1. ringlet (``ringlet.spawn``): the call as the communicator runs it (the
   staged shared-memory path, ``direct``), timed plainly, then again with
   its parts timed: the copies into the output (``transport.fused._put``:
   this rank's own block and the blocks read out of the peers' stage
   areas), the waits for the peer (``Fused._wait``), and the rest (the
   copies into this rank's stage area, and Python).  The same call by the
   single-copy step (``process_vm_readv``; ``RINGLET_CMA_BYTES``).  And
   the floors, both ranks at once after a barrier: one private copy of a
   block (the own block every method copies), one ``process_vm_readv`` of
   the peer's block, and the two in a row (what a single-copy
   implementation must do per rank); for broadcast, the reader's one copy
   of the whole vector, private or by ``process_vm_readv``.
2. MPICH (``mpiexec -n 2``, mpi4py): ``Allgather``/``Alltoall``/``Bcast`` of the same
   arrays, and the same floors measured in that job.
3. Unless ``--no-strace``: MPICH again under ``strace -f -c`` for a few calls,
   counting its ``process_vm_readv`` calls: how MPICH moves a large block
   between two processes on one host (cross-memory attach, one copy).

The broadcast's root is rank 1: rank 0 is the reader.  Prints rank 0's medians
(microseconds) as a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve()
#: the broadcast's root: rank 0, whose figures are printed, is the reader
ROOT = 1
COLLECTIVES = ("all_gather", "all_to_all", "broadcast")


def _median_us(fn: Callable[[], object], reps: int, sync: Callable[[], object]) -> float:
    """Median of ``reps`` calls of ``fn`` in microseconds, each call after ``sync``."""
    sync()
    fn()
    ts = []
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    sync()      # a peer may still be reading this rank's memory
    return statistics.median(ts) * 1e6


def _probe(peer_pid: int, peer_addr: int, into: np.ndarray) -> bool:
    """Whether this rank can read its peer's memory (every rank then agrees on the AND)."""
    from ringlet.transport import cma

    return cma.AVAILABLE and cma.read(peer_pid, peer_addr, into[:1])


def _floors(block: int, peer_pid: int, peer_addr: int, src: np.ndarray, dst: np.ndarray,
            own: np.ndarray, reps: int, sync: Callable[[], object],
            cma_ok: bool) -> dict[str, float]:
    """The copies a two-rank all_gather cannot avoid with private arrays, both ranks at
    once: the own block's private copy, the peer's block read across processes, and both
    (the last two only where every rank can read its peer: ``cma_ok``)."""
    from ringlet.transport import cma
    from ringlet.transport.fused import STREAM_MIN_BYTES, _put

    nt = 2 * block >= STREAM_MIN_BYTES   # the streaming choice the output of that size gets

    def read() -> None:
        if not cma.read(peer_pid, peer_addr, dst):
            raise RuntimeError(f"process_vm_readv failed: {cma.errno_text()}")

    def both() -> None:
        _put(own, src, nt)
        read()

    res = {"own copy": _median_us(lambda: _put(own, src, nt), reps, sync)}
    if cma_ok:
        res["cma read"] = _median_us(read, reps, sync)
        res["own copy + cma read"] = _median_us(both, reps, sync)
    return res


def _whole(root_pid: int, root_addr: int, x: np.ndarray, reader: bool, reps: int,
           sync: Callable[[], object], cma_ok: bool) -> dict[str, float]:
    """A broadcast's floors: the reader's one copy of the whole vector, private (memcpy,
    streaming as the staged path's copies of that size) or across processes."""
    from ringlet.transport import cma
    from ringlet.transport.fused import STREAM_MIN_BYTES, _put

    src, dst = np.ones_like(x), np.empty_like(x)
    nt = x.nbytes >= STREAM_MIN_BYTES

    def read() -> None:
        if reader and not cma.read(root_pid, root_addr, dst):
            raise RuntimeError(f"process_vm_readv failed: {cma.errno_text()}")

    res = {"whole: copy": _median_us(lambda: _put(dst, src, nt) if reader else None, reps,
                                     sync)}
    if cma_ok:
        res["whole: cma read"] = _median_us(read, reps, sync)
    return res


def ringlet_body(comm: Any, nbytes: int, reps: int) -> dict[str, Any] | None:
    import ringlet.transport.fused as fused
    from ringlet.transport import cma

    f = comm._fused
    r, n = comm.rank, comm.size
    m = nbytes // 4 // n
    res: dict[str, Any] = {}
    part, whole = np.ones(m, np.float32), np.empty(n * m, np.float32)
    x, y = np.ones(n * m, np.float32), np.empty(n * m, np.float32)
    where = comm.all_gather_object(cma.address(part))
    dst, own = np.empty(m, np.float32), np.empty(m, np.float32)
    q = (r + 1) % n
    ok = all(comm.all_gather_object(_probe(comm._t.pids[q], where[q], dst)))
    calls = {"all_gather": lambda: comm.all_gather(part, out=whole),
             "all_to_all": lambda: comm.all_to_all(x, out=y),
             "broadcast": lambda: comm.broadcast(x, ROOT)}

    def bcast_single() -> None:
        f._single_copy(x if r == ROOT else None, [] if r == ROOT else [(ROOT, 0, x)])

    singles = {"all_gather": calls["all_gather"], "all_to_all": calls["all_to_all"],
               "broadcast": bcast_single}
    spent = {"put": 0.0, "wait": 0.0}
    real_put, real_wait = fused._put, fused.Fused._wait

    def put(dst: np.ndarray, src: np.ndarray, stream: bool) -> None:
        t = time.perf_counter()
        real_put(dst, src, stream)
        spent["put"] += time.perf_counter() - t

    def wait(self: Any, k: int, target: int, ranks: Any) -> None:
        t = time.perf_counter()
        real_wait(self, k, target, ranks)
        spent["wait"] += time.perf_counter() - t

    for coll in COLLECTIVES:
        row: dict[str, float] = {}
        f.cma = False
        row["call"] = _median_us(calls[coll], reps, comm.barrier)
        fused._put, fused.Fused._wait = put, wait     # type: ignore[method-assign]
        try:
            totals = []
            for key in spent:
                spent[key] = 0.0
            for _ in range(reps):
                comm.barrier()
                t = time.perf_counter()
                calls[coll]()
                totals.append(time.perf_counter() - t)
        finally:
            fused._put, fused.Fused._wait = real_put, real_wait   # type: ignore[method-assign]
        whole_us = sum(totals) / reps * 1e6
        row["timed parts: call"] = whole_us
        row["copies into the output"] = spent["put"] / reps * 1e6
        row["waits for the peer"] = spent["wait"] / reps * 1e6
        row["rest (stage writes, Python)"] = whole_us - row["copies into the output"] - \
            row["waits for the peer"]
        if ok:
            f.cma, f.cma_bytes = True, 1
            row["single-copy call"] = _median_us(singles[coll], reps, comm.barrier)
            f.cma, f.cma_bytes = False, 0
        res[coll] = row
    res["floors"] = _floors(m * 4, comm._t.pids[q], where[q], part, dst, own, reps,
                            comm.barrier, ok)
    res["floors"].update(_whole(comm._t.pids[ROOT], comm.all_gather_object(
        cma.address(x))[ROOT], x, r != ROOT, reps, comm.barrier, ok))
    return res if r == 0 else None


def mpi_main(nbytes: int, reps: int, out: str | None) -> None:
    from mpi4py import MPI

    from ringlet.transport import cma

    c = MPI.COMM_WORLD
    r, n = c.rank, c.size
    cma.allow_peers()
    m = nbytes // 4 // n
    part, whole = np.ones(m, np.float32), np.empty(n * m, np.float32)
    x, y = np.ones(n * m, np.float32), np.empty(n * m, np.float32)
    res: dict[str, Any] = {
        "version": MPI.Get_library_version().splitlines()[0].strip(),
        "all_gather": {"call": _median_us(lambda: c.Allgather(part, whole), reps, c.Barrier)},
        "all_to_all": {"call": _median_us(lambda: c.Alltoall(x, y), reps, c.Barrier)},
        "broadcast": {"call": _median_us(lambda: c.Bcast(x, ROOT), reps, c.Barrier)}}
    pids = c.allgather(os.getpid())
    where = c.allgather(cma.address(part))
    q = (r + 1) % n
    dst = np.empty(m, np.float32)
    ok = all(c.allgather(_probe(pids[q], where[q], dst)))
    res["floors"] = _floors(m * 4, pids[q], where[q], part, dst, np.empty(m, np.float32),
                            reps, c.Barrier, ok)
    res["floors"].update(_whole(pids[ROOT], c.allgather(cma.address(x))[ROOT], x, r != ROOT,
                                reps, c.Barrier, ok))
    if r == 0 and out is not None:
        Path(out).write_text(json.dumps(res))


def _mpiexec() -> str:
    return shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep +
                        os.environ.get("PATH", "")) or "mpiexec"


def run_mpi(nbytes: int, reps: int) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        path = fh.name
    try:
        subprocess.run([_mpiexec(), "-n", "2", sys.executable, str(HERE), "_mpi",
                        str(nbytes), str(reps), path], check=True, timeout=600)
        return dict(json.loads(Path(path).read_text()))
    finally:
        os.unlink(path)


def _syscalls(strace: str, nbytes: int, calls: int, coll: str) -> int:
    """process_vm_readv calls of a 2-rank MPICH job making ``calls`` calls of ``coll``."""
    with tempfile.NamedTemporaryFile(suffix=".txt", delete=False) as fh:
        path = fh.name
    try:
        subprocess.run([strace, "-f", "-c", "-o", path, "-e", "trace=process_vm_readv",
                        _mpiexec(), "-n", "2", sys.executable, str(HERE), "_mpicount",
                        str(nbytes), str(calls), coll], check=True, timeout=600,
                       capture_output=True)
        text = Path(path).read_text()
    finally:
        os.unlink(path)
    for line in text.splitlines():
        parts = line.split()
        if parts and parts[-1] == "process_vm_readv":
            return int(parts[3])    # % time, seconds, usecs/call, calls, [errors,] syscall
    return 0


def strace_mpi(nbytes: int, calls: int = 20) -> str | None:
    """How many process_vm_readv calls MPICH makes per call of each collective (a job
    with ``calls`` calls against one with none: start-up makes some too); None without
    strace."""
    strace = shutil.which("strace")
    if strace is None:
        return None
    per = {coll: (_syscalls(strace, nbytes, calls, coll) - _syscalls(strace, nbytes, 0, coll))
           / calls for coll in COLLECTIVES}
    return "process_vm_readv calls per call on 2 ranks (a job of " + str(calls) + \
        " calls against one of none): " + ", ".join(f"{c} {v:g}" for c, v in per.items())


def mpi_count(nbytes: int, calls: int, coll: str) -> None:
    from mpi4py import MPI

    c = MPI.COMM_WORLD
    m = nbytes // 4 // c.size
    a, b = np.ones(m * (c.size if coll == "all_to_all" else 1), np.float32), \
        np.empty(m * c.size, np.float32)
    for _ in range(calls):
        if coll == "all_gather":
            c.Allgather(a, b)
        elif coll == "all_to_all":
            c.Alltoall(a, b)
        else:
            c.Bcast(b, ROOT)


def table(rl: dict[str, Any], mp: dict[str, Any], nbytes: int) -> str:
    def f(v: float | None) -> str:
        return "" if v is None else f"{v:.0f}"

    lines = [f"Two ranks, {nbytes >> 20} MiB (blocks of {nbytes >> 21} MiB), rank 0's medians "
             f"in microseconds; MPICH: {mp.get('version', '?')}.", "",
             "| | " + " | ".join(COLLECTIVES) + " |", "|---|" + "---:|" * len(COLLECTIVES)]
    rows = [("ringlet (staged, as the communicator runs it)", "call", rl),
            ("  the same call with its parts timed", "timed parts: call", rl),
            ("  - copies into the output (own block, and the peer's out of its stage)",
             "copies into the output", rl),
            ("  - waits for the peer", "waits for the peer", rl),
            ("  - rest: copies into the stage area, Python", "rest (stage writes, Python)", rl),
            ("ringlet by single-copy reads (process_vm_readv)", "single-copy call", rl),
            ("MPICH (mpi4py Allgather / Alltoall / Bcast)", "call", mp)]
    for label, key, src in rows:
        lines.append(f"| {label} | " + " | ".join(f(src.get(c, {}).get(key))
                                                   for c in COLLECTIVES) + " |")
    lines += ["", "The floors: for all_gather and all_to_all, both ranks at once, a block each "
              "(own copy: a private copy of the own block; cma read: process_vm_readv of the "
              "peer's block); for broadcast, the reader alone copying the whole vector:", "",
              "| | in ringlet's job | in MPICH's job |", "|---|---:|---:|"]
    for key in ("own copy", "cma read", "own copy + cma read", "whole: copy",
                "whole: cma read"):
        lines.append(f"| {key} | {f(rl.get('floors', {}).get(key))} | "
                     f"{f(mp.get('floors', {}).get(key))} |")
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_mpi":
        mpi_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_mpicount":
        mpi_count(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        return
    import ringlet
    from ringlet.config import parse_bytes

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bytes", default="16M")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--no-strace", action="store_true")
    a = p.parse_args()
    nbytes = parse_bytes(a.bytes)
    rl = ringlet.spawn(ringlet_body, 2, nbytes, a.reps)[0]
    mp = run_mpi(nbytes, a.reps)
    print(table(rl, mp, nbytes))
    if not a.no_strace:
        counted = strace_mpi(nbytes)
        print("\nstrace -f -c of MPICH: " + (counted or "strace is not installed"))


if __name__ == "__main__":
    main()
