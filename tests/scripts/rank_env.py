"""Print what a rank sees: its launch variables and argv, as one JSON line."""

from __future__ import annotations

import json
import os
import sys

names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RINGLET_JOB_ID",
         "PYTHONUNBUFFERED", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
print(json.dumps({"env": {n: os.environ.get(n) for n in names}, "argv": sys.argv[1:],
                  "main": __name__}))
print(f"to stderr from {os.environ['RANK']}", file=sys.stderr)
