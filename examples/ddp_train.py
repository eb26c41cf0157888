"""Train a small model with DistributedDataParallel on CPU, on ringlet or on gloo.

    torchrun --standalone --nproc-per-node 2 examples/ddp_train.py                 # ringlet
    torchrun --standalone --nproc-per-node 2 examples/ddp_train.py --backend gloo
    ringlet run -n 2 examples/ddp_train.py          # ringlet run sets torch's env:// too

The seeds' lab: every rank trains a replica of the same MLP on its own shard
of a synthetic regression task; DDP all-reduces the gradients in buckets
while backward runs.  Prints, per step, the loss and the step time; at the
end the median step time, the time of the gradient all-reduce alone (all the
gradients, once) and what ``ringlet plan`` predicts for it, and checks that
every rank holds the same weights (the line ``replicas identical: True``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ringlet.torch  # noqa: F401 - registers the "ringlet" backend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", default="ringlet", choices=["ringlet", "gloo"])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=512)
    args = ap.parse_args()

    dist.init_process_group(args.backend)
    r, n = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)                       # the same initial weights everywhere
    model = nn.Sequential(nn.Linear(64, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 1))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(1000 + r)   # each rank its own shard
    w_true = torch.randn(64, 1, generator=torch.Generator().manual_seed(7))
    times = []
    for step in range(args.steps):
        x = torch.randn(64, 64, generator=data)
        y = x @ w_true
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()                        # the gradient all-reduces happen here
        opt.step()
        times.append(time.perf_counter() - t0)
        if r == 0:
            print(f"step {step}: loss {loss.item():.4f}, {times[-1] * 1e3:.1f} ms", flush=True)

    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(5):
        dist.all_reduce(flat)
    comm = (time.perf_counter() - t0) / 5
    params = sum(p.numel() for p in model.parameters())
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    everyone = [torch.empty_like(weights) for _ in range(n)]
    dist.all_gather(everyone, weights)
    same = all(torch.equal(w, everyone[0]) for w in everyone)
    if r == 0:
        plan = subprocess.run(
            [sys.executable, "-m", "ringlet.cli", "plan", "--params", str(params), "--dtype",
             "fp32", "--ranks", str(n), "--link", "local", "--json"],
            capture_output=True, text=True)
        predicted = json.loads(plan.stdout)["comm_seconds"] if plan.returncode == 0 else None
        print(f"{args.backend}: {n} ranks, {params:,} parameters; median step "
              f"{statistics.median(times[1:] or times) * 1e3:.1f} ms; gradient all-reduce "
              f"alone {comm * 1e3:.2f} ms"
              + (f" (ringlet plan --link local predicts {predicted * 1e3:.2f} ms)"
                 if predicted is not None else ""), flush=True)
    print(f"[rank {r}] replicas identical: {same}", flush=True)
    dist.barrier()          # every rank tears down together (rank 0 ran ringlet plan)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
