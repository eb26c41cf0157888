"""The measurements behind REGRET.md and VALIDATION.md (shared by regret.py and validate.py).

    python benchmarks/sweep.py [--ranks 2,4] [--profile PATH] [--repeat 3] [--reps 3]
                               [--data benchmarks/sweep.json]

Every collective, every applicable algorithm and the automatic choice (the
tuner with the profile), at 8 B to 64 MiB (factor 8, then 64 MiB), on 2 and 4
local ranks, timed with :func:`ringlet.cost.measure.sweep` (barrier, batch,
slowest rank's mean; the median of ``--reps`` batches; the whole sweep
``--repeat`` times, each collective after waiting for the machine to be idle
and again if it was not idle right after, and the median over the repeats).
Without ``--profile`` this host is calibrated first (``-n`` the largest rank
count).  Everything, the profile included, goes to one JSON file that
regret.py and validate.py read.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ringlet.config import Settings
from ringlet.cost.calibrate import calibrate, report
from ringlet.cost.measure import OFFSET, idle, sweep, wait_quiet
from ringlet.cost.model import Profile
from ringlet.schedule import COLLECTIVES

HERE = Path(__file__).resolve().parent
DATA = HERE / "sweep.json"
#: 8 B .. 16 MiB by factors of 8, then 64 MiB
SIZES = [8 * 8 ** k for k in range(8)] + [64 << 20]


def commit() -> str:
    """The repository's current commit (with +dirty if the tree has changes)."""
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, check=True,
                             capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=HERE, check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("+dirty" if dirty.strip() else "")


def measure(ranks: list[int], profile_path: str | None, repeat: int, reps: int,
            budget: float) -> dict[str, Any]:
    """Calibrate (unless given a profile), then sweep; everything in one JSON-able dict."""
    started = time.time()
    log: list[str] = []

    def say(line: str) -> None:
        log.append(line)
        print(line, file=sys.stderr, flush=True)

    load_before = os.getloadavg()
    if profile_path is None:
        for attempt in range(1, 4):
            seen, waited = wait_quiet()
            prof = calibrate(max(ranks))
            after = idle(1.0)
            say(f"calibrated with {max(ranks)} ranks (machine {seen:.0%} idle before, after "
                f"waiting {waited:.0f} s; {after:.0%} idle after)"
                + ("" if after >= 0.9 or attempt == 3 else ": disturbed, again"))
            if after >= 0.9:
                break
        fd, tmp = tempfile.mkstemp(prefix="ringlet-profile-", suffix=".json")
        os.close(fd)
        profile_path = str(prof.save(tmp))
    prof = Profile.load(profile_path)
    settings = Settings.from_env(profile=profile_path)
    runs = []
    for n in ranks:
        for smp in sweep(n, list(COLLECTIVES), SIZES, auto=True, reps=reps, budget=budget,
                         repeat=repeat, settings=settings, log=say):
            runs.append({"nranks": n, "collective": smp.case.collective,
                         "algorithm": smp.case.algorithm, "nbytes": smp.nbytes,
                         "seconds": smp.seconds, "repeats": smp.batches, "ran": smp.ran})
    return {
        "date": dt.datetime.now(dt.timezone.utc).astimezone().isoformat(timespec="seconds"),
        "host": socket.gethostname(), "cores": len(os.sched_getaffinity(0)),
        "commit": commit(), "ranks": ranks, "sizes": SIZES, "repeat": repeat, "reps": reps,
        "budget": budget, "minutes": (time.time() - started) / 60,
        "offset": OFFSET,   # where the buffers start past a page boundary
        "loadavg_before": load_before, "loadavg_after": os.getloadavg(),
        "profile": prof.to_dict(), "calibration": report(prof),
        "settings": {"shm_post_bytes": settings.shm_post_bytes,
                     "shm_stage_bytes": settings.shm_stage_bytes,
                     "shm_piece_bytes": settings.shm_piece_bytes, "fused": settings.fused},
        "log": log, "runs": runs,
    }


def load(path: Path = DATA) -> dict[str, Any]:
    """The measurements saved by :func:`main` (run ``python benchmarks/sweep.py`` first)."""
    if not path.exists():
        raise SystemExit(f"{path} does not exist: run python benchmarks/sweep.py first")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="2,4", help="rank counts, comma-separated (default 2,4)")
    p.add_argument("--profile", help="a calibrated profile (default: calibrate now)")
    p.add_argument("--repeat", type=int, default=3, help="sweeps (default 3)")
    p.add_argument("--reps", type=int, default=3, help="timed batches per case (default 3)")
    p.add_argument("--budget", type=float, default=0.02,
                   help="seconds of calls per batch (default 0.02)")
    p.add_argument("--data", type=Path, default=DATA, help=f"output JSON (default {DATA})")
    a = p.parse_args()
    ranks = [int(x) for x in a.ranks.split(",")]
    data = measure(ranks, a.profile, a.repeat, a.reps, a.budget)
    a.data.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {a.data}", file=sys.stderr)


def report_args(description: str, out_name: str) -> tuple[argparse.Namespace, dict[str, Any]]:
    """The options every report script takes (--fresh, --data, --out) and the sweep's data,
    measured again first when asked or when there is none yet."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--fresh", action="store_true", help="measure again (benchmarks/sweep.py)")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--out", type=Path, default=HERE / out_name)
    a = p.parse_args()
    if a.fresh or not a.data.exists():
        a.data.write_text(json.dumps(measure([2, 4], None, 3, 3, 0.02), indent=1) + "\n")
    return a, load(a.data)


if __name__ == "__main__":
    main()
