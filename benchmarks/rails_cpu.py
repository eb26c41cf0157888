"""What a two-level all_reduce on the torch engine costs in CPU, by thread and by phase.

    python benchmarks/rails_cpu.py                   # 4 MiB at 1 Gbit/s, 30 calls, ~1 min
    python benchmarks/rails_cpu.py --bytes 16M --calls 10

Needs root and the network-namespace test bed (``tests/netbed.py``): two hosts of
two ranks under ``torchrun``, the link shaped to ``--rate``.  Two tables, per rank:

- **per call, by thread**: ringlet's ``comm.all_reduce`` (the automatic choice),
  gloo's own all_reduce of each rank's shard on both rails at once (what the
  network part costs alone) and gloo's own all_reduce of the whole vector on the
  default group; the median wall time, the process's CPU time per call, and the
  threads' (``/proc/self/task/*/stat``, whose clock ticks are 10 ms: averaged over
  the calls), with the main thread's time in the torch engine's waits
  (``TorchTransport.idle``) and in waits inside the node (``Waiter.pause``);
- **per phase** of ringlet's call (:func:`ringlet.rails.run`: phase 1 and phase
  3 of each piece inside the node, each piece's wait for gloo's all_reduce on its
  rail): the median wall time, the main thread's CPU time and its time waiting on
  the run queue (``/proc/thread-self/schedstat``), and how often a wait inside the
  node paused.

Four ranks on two cores share the CPU with gloo's threads and the kernel's network
stack: a phase that takes longer than its CPU time waited for the CPU (the run
queue) or for a peer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import multihost  # this script's folder: parse_size, the jobs' environment


def _threads() -> dict[int, tuple[str, int]]:
    """Every thread of this process: tid -> (name, CPU clock ticks so far)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                s = f.read()
        except OSError:   # a thread that just ended
            continue
        fields = s[s.rfind(")") + 2:].split()
        out[int(tid)] = (s[s.find("(") + 1:s.rfind(")")], int(fields[11]) + int(fields[12]))
    return out


def _sched() -> tuple[int, int]:
    """This thread's ns on a CPU and ns waiting on the run queue so far."""
    with open("/proc/thread-self/schedstat") as f:
        on, queued, _ = f.read().split()
    return int(on), int(queued)


def rank_main(nbytes: int, calls: int) -> None:
    from datetime import timedelta

    import numpy as np
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    import ringlet
    import ringlet.rails
    import ringlet.transport.torch as tt
    import ringlet.wait as rw
    from ringlet.transport.base import NativeCall

    waits = {"engine": 0.0, "node": 0.0, "pauses": 0}

    def timed(owner: Any, name: str, key: str, count: str | None = None) -> None:
        inner = getattr(owner, name)

        def wrapper(*args: Any, **kw: Any) -> Any:
            c = time.thread_time()
            try:
                return inner(*args, **kw)
            finally:
                waits[key] += time.thread_time() - c
                if count:
                    waits[count] += 1
        setattr(owner, name, wrapper)

    timed(tt.TorchTransport, "idle", "engine")
    timed(rw.Waiter, "pause", "node", "pauses")

    phases: dict[str, list[tuple[float, float, float, int]]] = {}
    execute, cut = ringlet.rails.execute, ringlet.rails.phases
    parts: list[Any] = []

    def cut_and_keep(*args: Any) -> Any:
        parts[:] = cut(*args)
        return parts[:]

    def measured(name: Callable[[], str], run: Callable[[], None]) -> None:
        (c0, q0), w0, p0 = _sched(), time.perf_counter(), waits["pauses"]
        run()
        (c1, q1), w1 = _sched(), time.perf_counter()
        phases.setdefault(name(), []).append(
            ((w1 - w0) * 1e3, (c1 - c0) / 1e6, (q1 - q0) / 1e6, int(waits["pauses"] - p0)))

    def phase(prog: Any, *args: Any, **kw: Any) -> None:
        measured(lambda: next(f"phase {1 + 2 * j}, piece {k}" for k, part in enumerate(parts)
                              for j in (0, 1) if part[j] is prog),
                 lambda: execute(prog, *args, **kw))

    native_wait = NativeCall.wait
    waited = [0]

    def wait(self: Any) -> None:
        k = waited[0]
        waited[0] += 1
        measured(lambda: f"wait for gloo, piece {k}", lambda: native_wait(self))

    ringlet.rails.execute = phase  # type: ignore[assignment]  # rails.run calls them so
    ringlet.rails.phases = cut_and_keep  # type: ignore[assignment]
    NativeCall.wait = wait  # type: ignore[method-assign]

    comm = ringlet.init()
    r, n = comm.rank, comm.size
    g = len(comm.topology.local_ranks)
    x = np.ones(nbytes // 4, np.float32)
    rail = [dist.new_group([q for q in range(n) if q % g == i]) for i in range(g)]
    shard, full = torch.ones(x.size // g), torch.ones(x.size)
    mine = rail[comm.topology.local_ranks.index(r)]
    calls_of = {"ringlet": lambda: comm.all_reduce(x),
                "gloo, the shard on both rails": lambda: dist.all_reduce(shard, group=mine),
                "gloo, the vector (default group)": lambda: dist.all_reduce(full)}
    tick, me = os.sysconf("SC_CLK_TCK"), threading.get_native_id()
    threads: dict[str, Any] = {}
    for what, call in calls_of.items():
        for _ in range(2):   # warm-up
            call()
        phases.clear()
        for k in waits:
            waits[k] = 0
        dist.barrier()
        before, cpu0, main0 = _threads(), time.process_time(), time.thread_time()
        walls = []
        for _ in range(calls):
            dist.barrier()
            waited[0] = 0
            t0 = time.perf_counter()
            call()
            walls.append((time.perf_counter() - t0) * 1e3)
        after, cpu1, main1 = _threads(), time.process_time(), time.thread_time()
        per: dict[str, float] = {}
        for tid, (name, ticks) in after.items():
            spent = (ticks - before.get(tid, (name, 0))[1]) * 1e3 / tick / calls
            if spent and tid != me:
                per[name] = per.get(name, 0.0) + spent
        threads[what] = {
            "wall": statistics.median(walls), "cpu": (cpu1 - cpu0) * 1e3 / calls,
            "main": (main1 - main0) * 1e3 / calls,
            "engine waits": waits["engine"] * 1e3 / calls,
            "node waits": waits["node"] * 1e3 / calls,
            "others": dict(sorted(per.items(), key=lambda kv: -kv[1]))}
        if what == "ringlet":
            threads[what]["phases"] = {
                k: [statistics.median(v[i] for v in rows) for i in range(4)]
                for k, rows in phases.items()}
    every = comm.all_gather_object(threads)
    if r == 0:
        print(json.dumps({"algorithm": comm._choose("all_reduce", None, x.nbytes),
                          "ranks": every}), flush=True)
    comm.close()


def report(data: dict[str, Any], nbytes: int, rate: str, calls: int) -> str:
    ranks = data["ranks"]
    lines = [f"all_reduce of {nbytes} B ({data['algorithm']}), 2 hosts x 2 ranks at {rate}, "
             f"{calls} calls; ms per call, per rank", "",
             "| call | rank | wall (median) | CPU, the process | main thread | its engine "
             "waits | its waits in the node | other threads (by name) |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for what in ranks[0]:
        for q, rk in enumerate(ranks):
            v = rk[what]
            others = ", ".join(f"{k} {t:.1f}" for k, t in v["others"].items() if t >= 0.2)
            lines.append(f"| {what} | {q} | {v['wall']:.1f} | {v['cpu']:.1f} | {v['main']:.1f} "
                         f"| {v['engine waits']:.2f} | {v['node waits']:.2f} | {others} |")
    lines += ["", "ringlet's call by phase (medians: wall ms, the main thread's CPU ms and run-"
              "queue ms, pauses of the waits inside the node)", "",
              "| phase | " + " | ".join(f"rank {q}" for q in range(len(ranks))) + " |",
              "|---|" + "---:|" * len(ranks)]
    for k in ranks[0]["ringlet"]["phases"]:
        cells = []
        for rk in ranks:
            w, c, qd, p = rk["ringlet"]["phases"].get(k, [float("nan")] * 4)
            cells.append(f"{w:.2f} / {c:.2f} / {qd:.2f} / {p:.0f}")
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    multihost.bed_job_args(ap, 30)
    a = ap.parse_args(argv)
    nbytes = multihost.parse_size(a.bytes)
    if a.rank:
        rank_main(nbytes, a.calls)
        return 0
    data = multihost.torch_job(__file__, ["--bytes", str(nbytes), "--calls", str(a.calls)],
                               a.rate, "rails_cpu", own_cpus=a.own_cpus, mtu=a.mtu)
    if data is None:
        return 1
    print(report(data, nbytes, a.rate, a.calls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
