"""Regenerate benchmarks/DDP.md: torch.distributed on the ringlet backend beside gloo, one job.

    python benchmarks/torch_backend.py --out benchmarks/DDP.md      # 2 and 4 ranks, ~2 min
    python benchmarks/torch_backend.py -n 2 --hidden 512 --out /tmp/ddp.md   # a quick look

It starts ``torchrun --standalone`` itself, one job per world size.  In a job
(the same processes, the same tensors): the default group on
``backend="ringlet"`` and a gloo group (``new_group(backend="gloo")``) over
the same ranks.

- all_reduce (float32, sum) from 8 B to 64 MiB: ``dist.all_reduce`` on each
  group, and ringlet's own ``comm.all_reduce`` on the same tensor (what the
  backend adds); per size, the median over timed loops between barriers.
- 1,000 numpy arrays of 4 KiB all-reduced one by one, with
  ``comm.all_reduce_coalesced`` and with a :class:`ringlet.Bucketer`.
- DDP, for each ``--hidden``: the same model (an MLP of 4 layers) wrapped twice,
  once per group, trained on the same data; the step time (forward, backward
  with the bucketed gradient all-reduces, optimizer) and the time of the
  gradient all-reduces alone (every parameter's grad in DDP's 25 MiB buckets,
  all_reduce'd by the group), medians.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SIZES = [8, 1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]


def _rank(out: str, hiddens: list[int], steps: int) -> None:
    import warnings

    import torch
    import torch.distributed as dist

    import ringlet
    import ringlet.torch

    warnings.filterwarnings("ignore")
    dist.init_process_group("ringlet")
    r, n = dist.get_rank(), dist.get_world_size()
    gloo = dist.new_group(backend="gloo")
    comm = ringlet.torch.communicator()
    res: dict[str, Any] = {"n": n, "all_reduce": {}, "ddp": {}}

    def timed(fn: Any, nbytes: int) -> float:
        k = max(1, min(200, (32 << 20) // max(nbytes, 1)))
        fn()
        times = []
        for _ in range(5):
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            for _ in range(k):
                fn()
            times.append((time.perf_counter() - t0) / k)
        return statistics.median(times)

    for nbytes in SIZES:
        t = torch.ones(max(1, nbytes // 4))
        row = {
            "ringlet backend": timed(lambda t=t: dist.all_reduce(t), nbytes),
            "gloo": timed(lambda t=t: dist.all_reduce(t, group=gloo), nbytes),
            "ringlet direct": timed(lambda t=t: comm.all_reduce(t), nbytes),
        }
        res["all_reduce"][nbytes] = row

    import numpy as np

    small = [np.ones(1024, np.float32) for _ in range(1000)]   # 1,000 arrays of 4 KiB

    def one_by_one() -> None:
        for a in small:
            comm.all_reduce(a)

    def bucketed() -> None:
        b = ringlet.Bucketer(comm)
        for a in small:
            b.add(a)
        b.wait()

    res["coalesce"] = {
        "one by one": timed(one_by_one, 1 << 30),
        "all_reduce_coalesced": timed(lambda: comm.all_reduce_coalesced(small), 1 << 30),
        "Bucketer (25 MiB)": timed(bucketed, 1 << 30),
    }

    for hidden in hiddens:
        res["ddp"][hidden] = _ddp(hidden, steps, gloo, timed)
    if r == 0:
        Path(out).write_text(json.dumps(res))
    dist.destroy_process_group()


def _ddp(hidden: int, steps: int, gloo: Any, timed: Any) -> dict[str, Any]:
    """DDP of an MLP of 4 layers of ``hidden`` units on ringlet (the default group) and on
    gloo: median step, and the gradients' all_reduce alone."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                             nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                             nn.Linear(hidden, 16))

    out: dict[str, Any] = {"params": sum(p.numel() for p in model().parameters())}
    x, y = torch.randn(32, hidden), torch.randn(32, 16)
    for name, group in (("ringlet", None), ("gloo", gloo)):
        m = DDP(model(), process_group=group)
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)

        def step(m: Any = m, opt: Any = opt) -> None:
            opt.zero_grad()
            nn.functional.mse_loss(m(x), y).backward()
            opt.step()

        step()
        times = []
        for _ in range(max(steps, 3)):
            dist.barrier(group=gloo)
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        flat = torch.cat([p.grad.reshape(-1) for p in m.parameters()])
        comm_s = timed(lambda flat=flat, group=group: dist.all_reduce(flat, group=group),
                       flat.numel() * 4)
        out[name] = {"step": statistics.median(times), "comm": comm_s}
    return out


def _fmt_s(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def _size(b: int) -> str:
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB" if b >= 1 << 10 else f"{b} B"


def _section(res: dict[str, Any]) -> list[str]:
    """The tables of one job (one world size)."""
    n = res["n"]
    lines = [
        f"## {n} ranks", "",
        "### all_reduce", "",
        "Median time per call; busbw = 2 (n-1)/n x bytes / time (nccl-tests' definition).  "
        "*backend / direct*: the time through torch.distributed over ringlet's own call on "
        "the same tensor.",
        "",
        "| size | ringlet backend | gloo | ringlet direct | busbw ringlet | busbw gloo | "
        "gloo / ringlet | backend / direct |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for nbytes, row in sorted(res["all_reduce"].items(), key=lambda kv: int(kv[0])):
        b = int(nbytes)
        rb, gl, di = row["ringlet backend"], row["gloo"], row["ringlet direct"]
        bus = 2 * (n - 1) / n * b if n > 1 else b
        lines.append(f"| {_size(b)} | {_fmt_s(rb)} | {_fmt_s(gl)} | {_fmt_s(di)} | "
                     f"{bus / rb / 1e9:.2f} GB/s | {bus / gl / 1e9:.2f} GB/s | "
                     f"{gl / rb:.2f}x | {rb / di:.2f}x |")
    lines += ["", "### DDP step (an MLP of 4 layers, batch 32)", "",
              "| parameters | backend | step | gradient all_reduce alone | share of the step | "
              "gloo's step / ringlet's |", "|---:|---|---:|---:|---:|---:|"]
    for d in res["ddp"].values():
        for name in ("ringlet", "gloo"):
            ratio = f"{d['gloo']['step'] / d['ringlet']['step']:.2f}x" \
                if name == "ringlet" else ""
            lines.append(f"| {d['params']:,} | {name} | {_fmt_s(d[name]['step'])} | "
                         f"{_fmt_s(d[name]['comm'])} | "
                         f"{100 * d[name]['comm'] / d[name]['step']:.0f} % | {ratio} |")
    co = res["coalesce"]
    lines += ["", "### 1,000 numpy arrays of 4 KiB (ringlet's own calls)", "",
              "| how | time | vs one by one |", "|---|---:|---:|"]
    for k, v in co.items():
        lines.append(f"| {k} | {_fmt_s(v)} | {co['one by one'] / v:.1f}x |")
    return lines + [""]


def report(runs: list[dict[str, Any]], cmd: str) -> str:
    """benchmarks/DDP.md: the targets, then one section per world size."""
    def verdict(ok: bool) -> str:
        return "met" if ok else "**not met**"

    def listing(d: dict[int, float]) -> str:
        return ", ".join(f"{_size(b)}: {x:.2f}x" for b, x in sorted(d.items()))

    two = next((r for r in runs if r["n"] == 2), runs[0])
    ar = {int(k): v for k, v in two["all_reduce"].items()}
    bw = {b: v["gloo"] / v["ringlet backend"] for b, v in ar.items() if b >= 64 << 10}
    over = {b: v["ringlet backend"] / v["ringlet direct"] for b, v in ar.items() if b >= 1 << 20}
    small = ar[min(ar)]
    steps = [(r["n"], d["params"], d["gloo"]["step"] / d["ringlet"]["step"])
             for r in runs for d in r["ddp"].values()]
    lines = [
        "# torch.distributed on the ringlet backend, beside gloo",
        "",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: `nproc` = {os.cpu_count()}, {platform.machine()}, "
        f"Linux {platform.release()}; every rank shares these cores",
        "- one job per world size (torchrun --standalone), float32: the default group on "
        "`backend=\"ringlet\"` and a gloo group on the same ranks, timed side by side",
        f"- regenerate: `{cmd}`",
        "",
        "## Targets (issue: the torch.distributed backend)",
        "",
        "| target | measured | verdict |",
        "|---|---|---|",
        f"| busbw >= 2x gloo's from 64 KiB ({two['n']} ranks) | {listing(bw)} | "
        f"{verdict(min(bw.values()) >= 2)} |",
        f"| latency at {_size(min(ar))} <= gloo's ({two['n']} ranks) | "
        f"{_fmt_s(small['ringlet backend'])} vs {_fmt_s(small['gloo'])} | "
        f"{verdict(small['ringlet backend'] <= small['gloo'])} |",
        "| DDP step: ringlet <= gloo (gloo's step / ringlet's) | "
        + ", ".join(f"{n} ranks, {p / 1e6:.1f} M: {x:.2f}x" for n, p, x in steps)
        + f" | {verdict(min(x for _, _, x in steps) >= 1)} |",
        f"| the backend adds <= 20 % to ringlet's own all_reduce from 1 MiB ({two['n']} "
        f"ranks) | {listing(over)} | {verdict(max(over.values()) <= 1.2)} |",
        "",
        "Below 1 MiB the backend's fixed cost shows: 5-15 us per call over ringlet's "
        "own (torch's dispatch into the Python process group, the Work and its Future).",
        "",
    ]
    for res in runs:
        lines += _section(res)
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_rank":
        _rank(sys.argv[2], [int(h) for h in sys.argv[3].split(",")], int(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", default="2,4", help="world sizes, one job each (default 2,4)")
    ap.add_argument("--hidden", default="256,2880",
                    help="units per layer of the DDP models (default 256,2880: about 0.2 M "
                         "and 25 M parameters)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", default=str(HERE / "DDP.md"))
    args = ap.parse_args()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RINGLET_", "MASTER_"))}
    runs = []
    for n in [int(x) for x in args.n.split(",")]:
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            path = f.name
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", str(n), __file__, "_rank", path, args.hidden,
                        str(args.steps)], check=True, env=env)
        runs.append(json.loads(Path(path).read_text()))
        os.unlink(path)
    cmd = "python benchmarks/torch_backend.py" + \
        (f" -n {args.n}" if args.n != "2,4" else "") + \
        (f" --hidden {args.hidden}" if args.hidden != "256,2880" else "") + \
        f" --out {os.path.relpath(args.out)}"
    text = report(runs, cmd)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
