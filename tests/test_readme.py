"""What README.md shows runs as shown: the API tour under ``ringlet run`` at 2 and 3
ranks (with its comments' claims checked), the ``ringlet.spawn`` example, and
``RINGLET_DEBUG`` (INFO: one line per collective; TRACE: also one per round).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
CLI = [sys.executable, "-m", "ringlet.cli"]


def tour_blocks() -> list[str]:
    """The python code blocks of the README's "A tour of the API" section."""
    text = README.read_text()
    section = text[text.index("## A tour of the API\n"):]
    section = section[:section.index("\n#", 1)]
    return re.findall(r"^```python\n(.*?)^```$", section, re.M | re.S)


def run(argv: list[str], cwd: Path, debug: str | None = None,
        timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGLET_")}
    if debug is not None:
        env["RINGLET_DEBUG"] = debug
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


#: The tour's claims, checked after it ran (x changes along the way; these do not).
CHECKS = '''
assert y.tolist() == [n * (n - 1) / 2] * 4
assert b.shape == (2, 3) and (b == n).all()
assert t.tolist() == [2 * r, 2 * r + 1] * n
assert s.tolist() == [2 * r, 2 * r + 1]
assert sub.size == (n + 1 - r % 2) // 2
assert ringlet.algorithms("all_reduce")[:3] == ['binomial', 'direct', 'double_binary_tree']
assert work.is_completed() and g.shape == (1 << 20,)
print(f"tour ok on rank {r} of {n}")
'''


def test_the_readme_has_the_tour_and_the_spawn_example() -> None:
    blocks = tour_blocks()
    assert len(blocks) == 2
    assert "ringlet.init()" in blocks[0] and "ringlet.spawn(fn, 4, 10)" in blocks[1]


@pytest.mark.parametrize("n", [2, 3])
def test_the_tour_runs_as_written(tmp_path: Path, n: int) -> None:
    (tmp_path / "tour.py").write_text(tour_blocks()[0] + CHECKS)
    proc = run([*CLI, "run", "-n", str(n), "tour.py"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for r in range(n):
        assert f"tour ok on rank {r} of {n}" in proc.stdout


def test_the_spawn_example_runs_as_written(tmp_path: Path) -> None:
    (tmp_path / "spawn_demo.py").write_text(tour_blocks()[1])
    proc = run([sys.executable, "spawn_demo.py"], tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == str([[60, 60, 60]] * 4)


TINY = '''
import numpy as np
import ringlet

comm = ringlet.init()
x = np.ones(1000, np.float32)
comm.all_reduce(x, algorithm="ring")
assert (x == 2).all()
'''


def test_debug_trace_adds_a_line_per_round_and_info_does_not(tmp_path: Path) -> None:
    (tmp_path / "tiny.py").write_text(TINY)
    argv = [*CLI, "run", "-n", "2", "tiny.py"]
    info = run(argv, tmp_path, "INFO")
    trace = run(argv, tmp_path, "TRACE")
    assert info.returncode == 0 and trace.returncode == 0, info.stderr + trace.stderr
    for out in (info.stdout + info.stderr, trace.stdout + trace.stderr):
        for r in range(2):
            assert f"ringlet INFO rank {r}: all_reduce #1 (1000 x float32) algorithm ring" in out
    assert "DEBUG" not in info.stdout + info.stderr
    assert "round" not in info.stdout + info.stderr
    # the ring on 2 ranks: a reduce-scatter round and an all-gather round, half the
    # vector (2000 B) each way in each
    rounds = re.findall(r"ringlet DEBUG rank (\d): all_reduce #1 \(1000 x float32\), "
                        r"round (\d): (.*); ([\d.]+) us", trace.stdout + trace.stderr)
    assert sorted((int(rk), int(i)) for rk, i, _, _ in rounds) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for rk, i, steps, _ in rounds:
        peer = 1 - int(rk)
        kind = "recv+reduce" if i == "0" else "recv"
        assert steps == f"send 2000 B -> {peer}, {kind} 2000 B <- {peer}"
