"""scan and exscan beyond the oracle's sums: out=, the logical ops (0/1 on every rank,
rank 0 included), MAXLOC pairs, exscan leaving rank 0 as it is, and AVG refused on
every rank between good calls."""

from __future__ import annotations

from typing import Any

import numpy as np

import ringlet


def _scan(comm: ringlet.Communicator) -> list[str]:
    n, r = comm.size, comm.rank
    bad = []
    x = np.array([r + 1, 3 * r], np.int32)
    keep = x.copy()
    out = np.empty_like(x)
    got = comm.scan(x, op="max", out=out)
    if got is not out or not np.array_equal(x, keep) or out.tolist() != [r + 1, 3 * r]:
        bad.append(f"scan max out= {out}")
    b = np.array([2 * (r + 1), 0, 5], np.int16)    # nonzero is true
    comm.scan(b, op="land")
    if b.tolist() != [1, 0, 1]:
        bad.append(f"scan land {b}")
    p = ringlet.pairs([float(r % 2)], [r])
    comm.scan(p, op="maxloc")
    want = (1.0, 1) if r >= 1 else (0.0, 0)
    if (float(p["value"][0]), int(p["index"][0])) != want:
        bad.append(f"scan maxloc {p}")
    lor = np.array([5, 0, -3], np.int32) if r == 0 else np.array([2, 0, 7], np.int32)
    comm.exscan(lor, op="lor")   # rank 1's result is rank 0's x alone: still 0 or 1
    if r > 0 and lor.tolist() != [1, 0, 1]:
        bad.append(f"exscan lor {lor}")
    e = np.full(3, 10.0 * (r + 1))
    comm.exscan(e, algorithm="linear")
    want_e = 10.0 if r == 0 else 10.0 * r * (r + 1) / 2
    if e.tolist() != [want_e] * 3:
        bad.append(f"exscan {e}")
    try:
        comm.scan(np.ones(2), op="avg")
    except ringlet.ArgumentError as exc:
        if "AVG has no prefix form" not in str(exc):
            bad.append(str(exc))
    else:
        bad.append("AVG accepted")
    y = np.ones(1)
    comm.all_reduce(y)
    if y[0] != n:
        bad.append("all_reduce after the rejected scan")
    return bad


def test_scan_and_exscan(world: Any) -> None:
    for r, bad in enumerate(world.run(_scan)):
        assert not bad, f"rank {r}: {bad}"
