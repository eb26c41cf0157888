"""benchmarks/profile_large.py, the profile behind RESULTS.md's 16 MiB rows, still runs: at
a small size, ringlet's job and MPICH's, every figure present and positive."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from test_mpi_transport import needs_mpi

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "profile_large.py"


@needs_mpi
def test_profile_large_runs() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), "--bytes", "256K", "--reps", "3",
                          "--no-strace"], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = {line.split("|")[1].strip(): line.split("|")[2:-1]
            for line in out.stdout.splitlines() if line.startswith("| ") and "---" not in line}
    for label in ("ringlet (staged, as the communicator runs it)",
                  "MPICH (mpi4py Allgather / Alltoall / Bcast)",
                  "- copies into the output (own block, and the peer's out of its stage)",
                  "- waits for the peer"):
        cells = rows[label]
        assert len(cells) == 3 and all(re.fullmatch(r"\s*\d+\s*", c) for c in cells), cells
    # the floors every machine has (the process_vm_readv ones need the kernel's permission)
    for label in ("own copy", "whole: copy"):
        assert re.fullmatch(r"\s*\d+\s*", rows[label][0]), rows[label]
        assert re.fullmatch(r"\s*\d+\s*", rows[label][1]), rows[label]
