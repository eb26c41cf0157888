"""Distributed argmax: the global maximum and which rank holds it.

As the seed suggests: all_reduce with MAX, then all_gather to find who has it.
Ties go to the lowest rank.  Then the same in one call, as MPI does it: MAXLOC
reduces (value, index) pairs, keeping the larger value and, on a tie, the
lower index.

    ringlet run -n 4 examples/distributed_argmax.py
"""

from __future__ import annotations

import numpy as np

import ringlet


def main() -> None:
    comm = ringlet.init()
    rng = np.random.default_rng(1234 + comm.rank)
    local = rng.integers(0, 1000, size=8)

    best = np.array([local.max()])
    comm.all_reduce(best, op="max")
    holders = comm.all_gather(np.array([local.max() == best[0]]))
    owner = int(np.argmax(holders.reshape(-1)))
    index = int(np.argmax(local)) if comm.rank == owner else -1
    where = np.array([index])
    comm.broadcast(where, root=owner)

    # one call: (value, global index) pairs reduced with MAXLOC
    pair = ringlet.pairs([local.max()], [comm.rank * 8 + int(np.argmax(local))])
    comm.all_reduce(pair, op="maxloc")
    one_call = (int(pair["value"][0]), int(pair["index"][0]))

    everything = np.concatenate([np.random.default_rng(1234 + r).integers(0, 1000, size=8)
                                 for r in range(comm.size)])
    ok = everything.max() == best[0] and np.argmax(everything) == owner * 8 + where[0] \
        and one_call == (best[0], owner * 8 + where[0])
    print(f"rank {comm.rank}: local max {local.max()}; global max {best[0]} "
          f"at rank {owner}, index {where[0]}; MAXLOC in one call: {one_call}; "
          f"matches numpy: {ok}")
    comm.close()
    if not ok:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
