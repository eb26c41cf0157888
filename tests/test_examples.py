"""The examples run as golden tests, through `ringlet run`, at several world sizes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from jobs import clean_env

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run(script: str, n: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ringlet.cli", "run", "-n", str(n),
                           str(EXAMPLES / script)], capture_output=True, text=True, timeout=180)


def test_cheatsheet_matches_the_seed_tables() -> None:
    proc = run("collective_cheatsheet.py", 4)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # seed 003: AllReduce of [1,2] [3,4] [2,6] [4,8] is [10, 20]; ours: [1,2] [2,4] [3,6] [4,8]
    assert "[0]   rank 3: before [4.0, 8.0]                   after [10.0, 20.0]" in out
    # seed 003's ReduceScatter: [1,2,3,4] [2,3,4,5] [3,4,5,6] [4,5,6,7] -> [10] [14] [18] [22]
    for r, v in enumerate([10, 14, 18, 22]):
        assert f"rank {r}: before [{r + 1}, {r + 2}, {r + 3}, {r + 4}]" in out
        assert f"after [{v}]" in out
    # seed 002: all_gather [A] [B] [C] [D] -> [ABCD] everywhere; all_to_all transposes
    assert out.count("after ABCD") == 4
    assert "rank 1: before [10, 11, 12, 13]             after [1, 11, 21, 31]" in out
    assert "barrier: every rank arrived" in out
    for coll in ("broadcast", "scatter", "gather", "all_gather", "reduce ", "all_reduce",
                 "reduce_scatter", "all_to_all"):
        assert coll in out


@pytest.mark.parametrize("n", [1, 3, 4])
@pytest.mark.parametrize("script", ["distributed_mean.py", "distributed_argmax.py",
                                    "distributed_softmax.py", "ring_allreduce_sendrecv.py",
                                    "moe_dispatch.py"])
def test_example_checks_itself(script: str, n: int) -> None:
    proc = run(script, n)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    assert len(lines) == n
    assert all(ln.endswith("True") for ln in lines), proc.stdout


def test_ddp_train_on_ringlet_matches_gloo() -> None:
    """examples/ddp_train.py on ringlet under ``ringlet run`` (which sets torch's env://
    variables, as torchrun does) and on gloo under torchrun: the same losses, and
    identical replicas on every rank."""
    pytest.importorskip("torch")
    env = clean_env()
    losses = {}
    for backend in ("ringlet", "gloo"):
        launcher = [sys.executable, "-m", "ringlet.cli", "run", "-n", "2", "--no-prefix"] \
            if backend == "ringlet" else \
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
             "2"]
        proc = subprocess.run(
            [*launcher, str(EXAMPLES / "ddp_train.py"), "--backend", backend, "--steps", "4",
             "--hidden", "128"], capture_output=True, text=True, timeout=180, env=env)
        # torch's own gloo sometimes aborts a rank at exit after the job finished
        # ("terminate called without an active exception"; 2 of 8 runs of this example
        # on gloo with ringlet not even imported): tolerated for the gloo reference only
        gloo_exit = backend == "gloo" and "terminate called without an active exception" \
            in proc.stdout + proc.stderr
        assert proc.returncode == 0 or gloo_exit, proc.stdout + proc.stderr
        assert proc.stdout.count("replicas identical: True") == 2, proc.stdout
        assert f"{backend}: 2 ranks" in proc.stdout and "ringlet plan" in proc.stdout
        losses[backend] = [ln.split(",")[0] for ln in proc.stdout.splitlines()
                           if ln.startswith("step ")]
    assert len(losses["ringlet"]) == 4 and losses["ringlet"] == losses["gloo"], losses
