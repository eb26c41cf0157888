"""numpy is ringlet's only required import: torch, mpi4py and matplotlib load only when a
program uses them.  The test worlds' ranks start from a process that imported torch
(tests/conftest.py), so this is checked in fresh processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from jobs import clean_env

OPTIONAL = ("torch", "mpi4py", "matplotlib")

JOB = textwrap.dedent("""
    import sys
    import numpy as np
    import ringlet

    comm = ringlet.init()
    x = np.arange(1000, dtype=np.float32)
    comm.all_reduce(x)
    comm.all_gather(x[:10])
    comm.broadcast(x, root=0)
    comm.barrier()
    comm.close()
    loaded = [m for m in {optional!r} if m in sys.modules]
    print(f"rank {{comm.rank}} loaded {{loaded}}", flush=True)
""").format(optional=OPTIONAL)


def _env() -> dict[str, str]:
    return clean_env(also=("PMIX_", "SLURM_"), RINGLET_TIMEOUT="60")


def test_a_numpy_job_loads_no_optional_package(tmp_path: Path) -> None:
    """Alone (no launcher) and as 2 ranks of ``ringlet run``."""
    script = tmp_path / "job.py"
    script.write_text(JOB)
    alone = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           timeout=120, env=_env(), check=False)
    assert alone.stdout.strip() == "rank 0 loaded []", alone.stdout + alone.stderr
    run = subprocess.run([sys.executable, "-m", "ringlet", "run", "-n", "2", str(script)],
                         capture_output=True, text=True, timeout=120, env=_env(), check=False)
    for r in range(2):   # ringlet run prefixes each line with [rank]
        assert f"[{r}] rank {r} loaded []" in run.stdout.splitlines(), run.stdout + run.stderr
