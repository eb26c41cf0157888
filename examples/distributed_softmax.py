"""Softmax over a vector split across ranks, composed from primitives.

Each rank holds a slice of the logits.  The global maximum (all_reduce MAX)
keeps exp() from overflowing, the global normaliser is an all_reduce SUM of
the local sums, and each rank scales its own slice: no rank ever holds the
whole vector.  The check all_gathers the slices and compares with numpy.

    ringlet run -n 4 examples/distributed_softmax.py
"""

from __future__ import annotations

import numpy as np

import ringlet


def softmax_sharded(comm: ringlet.Communicator, logits: np.ndarray) -> np.ndarray:
    m = np.array([logits.max()])
    comm.all_reduce(m, op="max")
    e = np.exp(logits - m[0])
    z = np.array([e.sum()])
    comm.all_reduce(z, op="sum")
    return e / z[0]


def main() -> None:
    comm = ringlet.init()
    rng = np.random.default_rng(7)
    full = rng.normal(scale=20.0, size=6 * comm.size)   # every rank can build the reference
    mine = full[comm.rank * 6:(comm.rank + 1) * 6]

    p = softmax_sharded(comm, mine)
    together = comm.all_gather(p).reshape(-1)
    ref = np.exp(full - full.max()) / np.exp(full - full.max()).sum()
    ok = np.allclose(together, ref) and np.isclose(together.sum(), 1.0)
    print(f"rank {comm.rank}: my slice sums to {p.sum():.6f}; the whole softmax sums to "
          f"{together.sum():.6f}; matches numpy: {ok}")
    comm.close()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
