"""The long commands' progress bars (:mod:`ringlet.progress`): drawn on a terminal, every
part counted, quiet otherwise.  The bar itself is tested in test_bench.py; ``ringlet
report``'s on a pseudo-terminal in test_report.py."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import jobs
import pytest

from ringlet.cost.calibrate import calibrate, plan, steps


def test_calibration_counts_every_part_it_reports(capsys: pytest.CaptureFixture[str]) -> None:
    for n, ncores in ((2, 2), (3, 2), (4, 8)):
        p = plan(n, quick=True, ncores=ncores)
        # jobs of 2..n ranks: fixed costs each, oversubscribed calls beyond the cores, and
        # four more parts in the job of min(n, cores) ranks
        assert steps(p, ncores) == (n - 1) + max(0, n - ncores) + 4
    calibrate(2, quick=True, reps=1, progress=True)
    err = capsys.readouterr().err
    total = steps(plan(2, quick=True))
    seen = [int(k) for k in re.findall(rf"ringlet predict --calibrate: (\d+)/{total} parts", err)]
    assert seen == list(range(1, total + 1)), err
    assert "(ping-pong (2 ranks))" in err and err.endswith("\r\033[K")
    calibrate(2, quick=True, reps=1)        # stderr is no terminal here: no bar
    assert capsys.readouterr().err == ""


def test_progress_is_quiet_in_a_log() -> None:
    from ringlet.progress import Progress, on_terminal

    log = io.StringIO()
    assert not on_terminal(log)
    with Progress(3, "x", stream=log) as bar:
        for _ in range(3):
            bar.step()
    assert log.getvalue() == ""


def on_a_terminal(*argv: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """``ringlet ARGV`` with stderr on a pseudo-terminal: (the run, what stderr showed)."""
    return jobs.on_a_terminal([sys.executable, "-m", "ringlet", *argv])


def test_verify_shows_a_bar_on_a_terminal_only() -> None:
    p, err = on_a_terminal("verify", "broadcast", "--ranks", "1-5")
    assert p.returncode == 0, err
    n = p.stdout.count(" ok")   # algorithms, 5 sizes each
    assert n >= 3 and f"ringlet verify: {5 * n}/{5 * n} checks [" in err, err
    assert "(broadcast binomial N=3)" in err
    quiet = subprocess.run([sys.executable, "-m", "ringlet", "verify", "broadcast", "--ranks",
                            "1-5"], capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr   # no terminal: no bar
    assert _same_table(quiet.stdout, p.stdout)


def _same_table(a: str, b: str) -> bool:
    """The tables without their timings."""
    def strip(t: str) -> list[str]:
        return [re.sub(r"\d+\.\d+ s", "", ln) for ln in t.splitlines()]

    return strip(a) == strip(b)
