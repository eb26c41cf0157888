"""A torch.distributed gloo all_reduce across the hosts of a netbed (run by torchrun per host).

Plain torch.distributed, no ringlet.  Prints one JSON line per rank: its rank, world size,
RINGLET_NODE, and whether the sum of a 1 Mi-element float32 tensor came out right.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.full((1 << 20,), float(rank + 1))
dist.all_reduce(t)
expected = size * (size + 1) / 2
print(json.dumps({"rank": rank, "size": size, "node": os.environ.get("RINGLET_NODE"),
                  "local_rank": int(os.environ["LOCAL_RANK"]),
                  "ok": bool(torch.all(t == expected)), "value": float(t[0])}), flush=True)
dist.destroy_process_group()
