"""Distributed mean: each rank holds a different amount of data; all_reduce the sums
and the counts, divide.  This is what gradient averaging does.

    ringlet run -n 4 examples/distributed_mean.py
"""

from __future__ import annotations

import numpy as np

import ringlet


def main() -> None:
    comm = ringlet.init()
    rng = np.random.default_rng(comm.rank)
    data = rng.normal(loc=comm.rank, size=100 * (comm.rank + 1))   # uneven shards

    stats = np.array([data.sum(), data.size], np.float64)
    comm.all_reduce(stats, op="sum")
    mean = stats[0] / stats[1]

    # check against the mean of all the data in one place
    everything = np.concatenate([np.random.default_rng(r).normal(loc=r, size=100 * (r + 1))
                                 for r in range(comm.size)])
    ok = np.isclose(mean, everything.mean())
    print(f"rank {comm.rank}: local mean {data.mean():+.4f} over {data.size} values; "
          f"global mean {mean:+.4f} over {int(stats[1])} values; matches numpy: {ok}")
    comm.close()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
