"""Where one two-level all_reduce on the torch engine spends its time, rank by rank.

    python benchmarks/rails_timeline.py                    # 4 MiB at 1 Gbit/s, ~20 s
    python benchmarks/rails_timeline.py --rate 200mbit --bytes 16M

Needs root and the network-namespace test bed (``tests/netbed.py``): two hosts of
two ranks under ``torchrun``, the link shaped to ``--rate``.  Each rank times,
from the start of ``comm.all_reduce`` (the automatic choice: on the torch engine
``hierarchical_pipelined`` from 4 MiB), the end of the call's agreement inside
the node, the end of each phase the native rails run (:func:`ringlet.rails.run`:
phase 1 inside the node per piece, the rest of the agreement after the first
piece's, per piece the wait for gloo's all_reduce on the rail and phase 3 inside the
node: the rows come in the order the first call ran them), and the end of the
call; beside it the same job
times gloo's own all_reduce of each rank's shard on both rails at once (what the
network part costs alone) and a ``comm.barrier()`` (the agreement alone).  The
median over ``--calls`` single calls, each after ``dist.barrier()``, per rank,
in milliseconds; the bound is S / rate.

Then the link, call by call (``--no-link`` leaves it out): a sampler in the
switch's namespace reads the hosts' switch ports' byte counters (each host's
download) every ~0.3 ms on the ranks' clock, and for each call gives when its
first bytes crossed (past 20 KB) and its last, from the first rank's start,
the time between them, and how long after the last byte the last rank left the
call; the medians over the calls.  What crosses is the call's bytes each way
plus the frames' headers; the bed's HTB counts whole frames, so the least time
for them is about S / (0.95 rate).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import multihost  # this script's folder: parse_size, the jobs' environment


def rank_main(nbytes: int, calls: int) -> None:
    from datetime import timedelta

    import numpy as np
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=600))
    import ringlet
    import ringlet.comm
    import ringlet.rails
    from ringlet.transport.base import NativeCall

    marks: list[tuple[str, float]] = []

    def mark(what: str) -> None:
        marks.append((what, time.perf_counter()))

    def wrap(owner: Any, name: str, label: Any) -> None:
        inner = getattr(owner, name)

        def timed(*args: Any, **kw: Any) -> Any:
            res = inner(*args, **kw)
            mark(label(args))
            return res

        setattr(owner, name, timed)

    pieces = {"wait": 0}

    def count(kind: str) -> Any:
        def label(_args: Any) -> str:
            pieces[kind] += 1
            return f"{kind} {pieces[kind] - 1}"
        return label

    wrap(ringlet.comm.Communicator, "_agree", lambda _a: "agreement (the node)")
    agreed = ringlet.comm.Communicator._agreed

    def other_nodes(self: Any) -> None:   # the agreement's part left for after phase 1
        pending = self._rest is not None
        agreed(self)
        if pending:
            mark("agreement (other nodes)")

    ringlet.comm.Communicator._agreed = other_nodes  # type: ignore[method-assign]
    wrap(NativeCall, "wait", count("wait"))
    execute, cut = ringlet.rails.execute, ringlet.rails.phases
    parts: list[Any] = []

    def phases(*args: Any) -> Any:   # the call's pieces: which program is which phase
        parts[:] = cut(*args)
        return parts[:]

    def phase(prog: Any, *args: Any, **kw: Any) -> None:
        execute(prog, *args, **kw)
        mark(next(f"p{1 + 2 * j} {k}" for k, part in enumerate(parts)
                  for j in (0, 1) if part[j] is prog))

    ringlet.rails.execute = phase  # type: ignore[assignment]  # rails.run calls them so
    ringlet.rails.phases = phases  # type: ignore[assignment]
    comm = ringlet.init()
    r, n = comm.rank, comm.size
    g = len(comm.topology.local_ranks)
    x = np.ones(nbytes // 4, np.float32)
    rail = [dist.new_group([q for q in range(n) if q % g == i]) for i in range(g)]
    shard = torch.ones(x.size // g)
    rows: dict[str, list[float]] = {}
    spans: list[tuple[float, float]] = []   # each timed call's start and end (perf_counter)
    for i in range(calls + 2):
        for p in pieces:
            pieces[p] = 0
        dist.barrier()
        marks.clear()
        t0 = time.perf_counter()
        comm.all_reduce(x)
        mark("end")
        if i >= 2:   # two warm-up calls
            for what, t in marks:
                rows.setdefault(what, []).append((t - t0) * 1e3)
            spans.append((t0, marks[-1][1]))
    alone: dict[str, list[float]] = {"gloo's all_reduce of the shard, both rails": [],
                                     "agreement alone (comm.barrier)": []}
    for _ in range(calls):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(shard, group=rail[comm.topology.local_ranks.index(r)])
        alone["gloo's all_reduce of the shard, both rails"].append(
            (time.perf_counter() - t0) * 1e3)
        dist.barrier()
        t0 = time.perf_counter()
        comm.barrier()
        alone["agreement alone (comm.barrier)"].append((time.perf_counter() - t0) * 1e3)
    med = {k: statistics.median(v) for k, v in {**rows, **alone}.items()}
    every = comm.all_gather_object(med)
    # perf_counter is CLOCK_MONOTONIC: one clock for every process of the machine, so the
    # ranks' calls line up with each other and with the link's samples
    calls_at = comm.all_gather_object(spans)
    if r == 0:
        print(json.dumps({"algorithm": comm._choose("all_reduce", None, x.nbytes),
                          "ranks": every, "calls": calls_at}), flush=True)
    comm.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    multihost.bed_job_args(ap, 15)
    ap.add_argument("--no-link", action="store_true", help="do not sample the link")
    a = ap.parse_args(argv)
    nbytes = multihost.parse_size(a.bytes)
    if a.rank:
        rank_main(nbytes, a.calls)
        return 0
    samples: list[list[list[float]]] = []
    data = multihost.torch_job(__file__, ["--bytes", str(nbytes), "--calls", str(a.calls)],
                               a.rate, "rails_timeline",
                               None if a.no_link else lambda bed: _link(bed, samples),
                               own_cpus=a.own_cpus, mtu=a.mtu)
    if data is None:
        return 1
    netbed = multihost._netbed()
    ranks = data["ranks"]
    bound = nbytes * 8 / netbed.parse_rate(a.rate) * 1e3
    print(f"all_reduce of {nbytes} B ({data['algorithm']}), 2 hosts x 2 ranks at {a.rate}: "
          f"bound S/rate {bound:.2f} ms; ms from the call's start, median of {a.calls} "
          f"calls, per rank")
    keys = list(ranks[0])
    print("| | " + " | ".join(f"rank {q}" for q in range(len(ranks))) + " |")
    print("|---|" + "---:|" * len(ranks))
    for k in keys:
        print(f"| {k} | " + " | ".join(f"{rk.get(k, float('nan')):.2f}" for rk in ranks)
              + " |")
    if samples:
        print()
        print(link_table(data["calls"], samples[0], nbytes, netbed.parse_rate(a.rate)))
    return 0


#: the sampler, run in the switch's namespace: every ~0.3 ms the ports' tx_bytes (each
#: host's download) on CLOCK_MONOTONIC, until the stop file appears; then JSON rows
_SAMPLER = """
import json, os, sys, time
out, stop, ports = sys.argv[1], sys.argv[2], sys.argv[3:]
files = [open(f"/sys/class/net/{p}/statistics/tx_bytes", "rb", buffering=0) for p in ports]
rows, n = [], 0
while True:
    row = [time.perf_counter()]
    for f in files:
        f.seek(0)
        row.append(int(f.read()))
    rows.append(row)
    n += 1
    if n % 500 == 0 and os.path.exists(stop) or n > 3_000_000:
        break
    time.sleep(0.0003)
with open(out, "w") as fh:
    json.dump(rows, fh)
"""


@contextlib.contextmanager
def _link(bed: Any, samples: list[list[list[float]]]) -> Iterator[None]:
    """Sample the link (:data:`_SAMPLER`, in the switch's namespace) while the block runs;
    then put its rows in ``samples`` (nothing if the sampler did not finish)."""
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        p = subprocess.Popen(["ip", "netns", "exec", bed.switch_ns, sys.executable, "-c",
                              _SAMPLER, str(tmp / "link.json"), str(tmp / "stop")]
                             + [h.port for h in bed.hosts])
        try:
            yield
        finally:
            (tmp / "stop").touch()
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
            if (tmp / "link.json").exists() and p.returncode == 0:
                samples.append(json.loads((tmp / "link.json").read_text()))


def link_table(calls: list[list[list[float]]], samples: list[list[float]], nbytes: int,
               bps: float) -> str:
    """Per call (``calls[rank][i]`` = that rank's start and end of call i), when the
    link's first and last bytes of the call crossed, from its first rank's start; the
    medians over the calls, in milliseconds."""
    times = [row[0] for row in samples]
    cols: dict[str, list[float]] = {}
    for i in range(len(calls[0])):
        start = min(rk[i][0] for rk in calls)
        end = max(rk[i][1] for rk in calls)
        lo = bisect.bisect_left(times, start - 1e-3)
        hi = bisect.bisect_right(times, end + 1e-3)
        seg = samples[lo:hi]
        if len(seg) < 2:
            continue
        firsts, lasts, moved = [], [], []
        for k in range(1, len(seg[0])):
            base, total = seg[0][k], seg[-1][k] - seg[0][k]
            if total <= 40_000:
                continue
            firsts.append(next(row[0] for row in seg if row[k] - base > 20_000))
            lasts.append(next(row[0] for row in seg if row[k] - base >= total - 20_000))
            moved.append(total)
        if not firsts:
            continue
        for key, v in (("first bytes", min(firsts) - start), ("last bytes", max(lasts) - start),
                       ("last - first", max(lasts) - min(firsts)),
                       ("end - last bytes", end - max(lasts)), ("call", end - start)):
            cols.setdefault(key, []).append(v * 1e3)
        cols.setdefault("MB each way", []).append(statistics.median(moved) / 1e6)
    if not cols:
        return "the link: no call moved bytes the sampler saw"
    head = (f"the link, {len(cols['call'])} calls (ms from the first rank's start; "
            f"S / rate {nbytes * 8 / bps * 1e3:.2f} ms):")
    return head + "\n" + "\n".join(
        f"- {k}: median {statistics.median(v):.2f} (range {min(v):.2f}-{max(v):.2f})"
        for k, v in cols.items())


if __name__ == "__main__":
    sys.exit(main())
