"""The staged ``direct`` all_reduce out of place: one pass fewer, A/B in one job.

    python benchmarks/ab_direct_out.py [-n 2] [--sizes 256K,512K,1M,2M,4M] [--reps 200]

Before: a rank copied its block of x into out=, reduced the peers' copies into
it, then copied it into its stage slot to publish it.  Now it reduces x and
the first peer's copy straight into the slot (``ops.reduce_into``) and copies
the slot into out=.  Both forms alternate call by call within one job (every
rank switches together), out of place, private numpy arrays; prints rank 0's
10th percentile and median of each and the ratio of the medians (> 1: the
new form is faster).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

import ringlet
from ringlet.config import parse_bytes
from ringlet.transport import fused as F


def before(self: Any, x: np.ndarray, red: Any, out: np.ndarray | None = None) -> None:
    """Fused.direct_all_reduce as it was (the "before" of this A/B)."""
    n, r, dt = self.t.size, self.t.rank, x.dtype
    y = x if out is None else out
    stage, isz = self.t.stage, x.itemsize

    def view(q: int, h: int, lo: int, hi: int) -> np.ndarray:
        return stage[q][h][lo * isz:hi * isz].view(dt)

    def write(h: int, a: int, b: int) -> None:
        for q, (lo, hi) in enumerate(F._blocks(a, b, n)):
            if q != r:
                view(r, h, lo - a, hi - a)[...] = x[lo:hi]

    def middle(h: int, a: int, b: int) -> None:
        lo, hi = F._blocks(a, b, n)[r]
        mine = y[lo:hi]
        if y is not x:
            mine[...] = x[lo:hi]
        for k in range(1, n):
            red(mine, view((r - k) % n, h, lo - a, hi - a))
        view(r, h, lo - a, hi - a)[...] = mine

    def read(h: int, a: int, b: int) -> None:
        for q, (lo, hi) in enumerate(F._blocks(a, b, n)):
            if q != r:
                y[lo:hi] = view(q, h, lo - a, hi - a)

    cap, want = self._widths(isz, 1)
    self._run_pieces(self._pieces(x.size, cap, n * want), write, middle, read, range(n),
                     range(n), isz)


def body(comm: ringlet.Communicator, sizes: list[int], reps: int) -> dict[int, Any]:
    forms = {"before": before, "now": F.Fused.direct_all_reduce}
    res = {}
    for size in sizes:
        x = np.ones(size // 4, np.float32)
        out = np.empty_like(x)
        times: dict[str, list[float]] = {k: [] for k in forms}
        for i in range(reps):
            for name in (("before", "now") if i % 2 else ("now", "before")):
                F.Fused.direct_all_reduce = forms[name]   # type: ignore[method-assign]
                comm.barrier()
                t = time.perf_counter()
                comm.all_reduce(x, out=out, algorithm="direct")
                times[name].append(time.perf_counter() - t)
        F.Fused.direct_all_reduce = forms["now"]   # type: ignore[method-assign]
        assert np.all(out == comm.size)
        res[size] = {k: (float(np.percentile(v[5:], 10)) * 1e6, float(np.median(v[5:])) * 1e6)
                     for k, v in times.items()}
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--sizes", default="256K,512K,1M,2M,4M")
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args()
    sizes = [parse_bytes(s) for s in a.sizes.split(",")]
    res = ringlet.spawn(body, a.n, sizes, a.reps)[0]
    print(f"direct all_reduce out of place, {a.n} ranks, float32, rank 0, us")
    for size, d in res.items():
        (b10, bmed), (n10, nmed) = d["before"], d["now"]
        print(f"{size:>9} B  before p10 {b10:7.0f} median {bmed:7.0f}  |  now p10 {n10:7.0f} "
              f"median {nmed:7.0f}  |  before/now {bmed / nmed:.2f}")


if __name__ == "__main__":
    main()
