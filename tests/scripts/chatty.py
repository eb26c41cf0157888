"""Write many long lines to stdout and stderr at once, to check that lines stay whole."""

from __future__ import annotations

import os
import sys

rank = os.environ["RANK"]
for i in range(int(sys.argv[1])):
    sys.stdout.write(f"out {rank} {i} " + rank * 2000 + " end\n")
    sys.stderr.write(f"err {rank} {i} " + rank * 3000 + " end\n")
sys.stdout.write(f"no newline at the end from {rank}")
