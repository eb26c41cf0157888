"""A /dev/shm too small for the job (Docker's default is 64 MB): a clear ConfigError
naming what did not fit and how to make room, on every rank where it can be, never a
SIGBUS.  Each job runs in a mount namespace of its own with a small tmpfs on /dev/shm
(root and util-linux's ``unshare``, as in CI; skipped where not permitted)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from functools import cache
from pathlib import Path

import pytest

JOB = textwrap.dedent("""
    import numpy as np, ringlet
    comm = ringlet.init()
    for s in (1 << 10, 1 << 20, 1 << 24):          # one-shot, channels, staged
        x = np.ones(s // 4, np.float32)
        for alg in ("ring", None):
            comm.all_reduce(x, algorithm=alg)
        comm.all_gather(np.ones(s // 16, np.float32))
    assert x[0] == comm.size ** 2, x[0]
    x = np.ones(4)
    try:
        comm.empty(MB << 20, np.uint8)[:] = 1        # a shared buffer of MB MiB per rank
    except ringlet.ConfigError as exc:
        print("empty:", exc, flush=True)
    comm.all_reduce(x)                               # the communicator still works
    print("done", x[0], flush=True)
""")


def _in_small_shm(size: str, script: Path, n: int = 4) -> subprocess.CompletedProcess[str]:
    inner = (f"mount -t tmpfs -o size={size} tmpfs /dev/shm && exec {sys.executable} -m "
             f"ringlet.cli run -n {n} {script}")
    return subprocess.run(["unshare", "-m", "sh", "-c", inner], capture_output=True,
                          text=True, timeout=180)


@cache
def _why_not() -> str:
    if sys.platform != "linux" or shutil.which("unshare") is None:
        return "needs Linux and util-linux's unshare"
    if os.geteuid() != 0:
        return "needs root (a tmpfs in a mount namespace of its own)"
    p = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs "
                        "/dev/shm"], capture_output=True, text=True, timeout=30)
    return "" if p.returncode == 0 else f"cannot mount a tmpfs here: {p.stderr.strip()}"


@pytest.fixture
def script(tmp_path: Path) -> Path:
    if _why_not():
        pytest.skip(_why_not())
    return tmp_path / "job.py"


def test_a_job_fits_dockers_default_64_mb(script: Path) -> None:
    """4 ranks and every path (one-shot, channels, staged) in 64 MB, and a shared buffer
    too large for what is left: a ConfigError on every rank, then the next call works."""
    script.write_text(JOB.replace("MB <<", "32 <<"))
    p = _in_small_shm("64m", script)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    for r in range(4):
        assert f"[{r}] done 4.0" in lines, p.stdout
        mine = [ln for ln in lines if ln.startswith(f"[{r}] empty:")]
        assert len(mine) == 1 and "could not make" in mine[0] and \
            "/dev/shm has no room for a shared buffer (comm.empty)" in mine[0] and \
            "--shm-size" in mine[0] and "ask for less" in mine[0], p.stdout


@pytest.mark.parametrize("size", ["12m", "3m"])
def test_too_small_is_a_config_error_not_sigbus(script: Path, size: str) -> None:
    """Too little room for the staged areas (12 MB) or a channel (3 MB): the rank that
    could not reserve them fails with a ConfigError saying what and how to make room (it
    was killed by SIGBUS, its peers left to guess)."""
    script.write_text(JOB.replace("MB <<", "1 <<"))
    p = _in_small_shm(size, script)
    assert p.returncode != 0
    assert "SIGBUS" not in p.stderr, p.stderr[-3000:]
    summary = p.stderr.strip().splitlines()[-1]
    assert "failed first (exit code 1: ringlet.errors.ConfigError: /dev/shm has no room " \
        "for rank" in summary and "--shm-size" in summary and "RINGLET_SHM_*" in summary, \
        summary
