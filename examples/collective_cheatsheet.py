"""Every collective, before and after, on every rank.

    ringlet run -n 4 examples/collective_cheatsheet.py

Each rank runs the collective; rank 0 gathers what every rank held before
and after and prints it in rank order, so the output reads like the tables
in the seed documents (and is the same on every run).
"""

from __future__ import annotations

import numpy as np

import ringlet


def show(comm: ringlet.Communicator, title: str, before: object, after: object) -> None:
    rows = comm.all_gather_object((before, after))
    if comm.rank == 0:
        print(f"{title}")
        for r, (b, a) in enumerate(rows):
            print(f"  rank {r}: before {b!s:<28} after {a}")


def fmt(x: np.ndarray | None) -> str:
    return "-" if x is None else str(x.tolist())


def main() -> None:
    comm = ringlet.init()
    r, n = comm.rank, comm.size
    letters = [chr(ord("A") + i) for i in range(n)]

    # broadcast: the root's buffer is copied to every rank (in place)
    x = np.array([42.0]) if r == 0 else np.zeros(1)
    before = fmt(x)
    comm.broadcast(x, root=0)
    show(comm, "broadcast (root 0): [A] -> [A] [A] ...", before, fmt(x))

    # scatter: block i of the root's buffer goes to rank i
    src = np.arange(10, 10 + n, dtype=np.int64) if r == 0 else None
    out = np.zeros(1, np.int64)
    comm.scatter(src, root=0, out=out)
    show(comm, "scatter (root 0): [A B C D] -> [A] [B] [C] [D]", fmt(src), fmt(out))

    # gather: the root collects every rank's buffer
    x = np.array([10 + r], np.int64)
    g = comm.gather(x, root=0)
    show(comm, "gather (root 0): [A] [B] [C] [D] -> [A B C D] at the root", fmt(x),
         fmt(None if g is None else g.reshape(-1)))

    # all_gather: every rank collects every rank's buffer
    x = np.array([ord(letters[r])], np.int64)
    g = comm.all_gather(x)
    show(comm, "all_gather: [A] [B] [C] [D] -> [A B C D] everywhere",
         letters[r], "".join(chr(c) for c in g.reshape(-1)))

    # reduce: the sum lands at the root; other ranks' buffers are unchanged
    x = np.array([r + 1.0])
    before = fmt(x)
    res = comm.reduce(x, root=0, op="sum")
    show(comm, "reduce (sum, root 0): [1] [2] [3] [4] -> [10] at the root", before,
         fmt(res) if res is not None else "(None: not the root)")

    # all_reduce: every rank gets the sum (in place)
    x = np.array([r + 1.0])
    before = fmt(x)
    comm.all_reduce(x, op="sum")
    show(comm, "all_reduce (sum): [1] [2] [3] [4] -> [10] everywhere", before, fmt(x))

    # all_reduce of the seed's example vectors, for each op
    for op in ("sum", "prod", "min", "max", "avg"):
        x = np.array([1.0 + r, 2.0 * (r + 1)])
        before = fmt(x)
        comm.all_reduce(x, op=op)
        show(comm, f"all_reduce ({op})", before, fmt(x))

    # reduce_scatter: rank i gets block i of the sum
    x = np.arange(n, dtype=np.int64) + r + 1
    y = comm.reduce_scatter(x, op="sum")
    show(comm, "reduce_scatter (sum): rank i gets sum over ranks of block i", fmt(x), fmt(y))

    # all_to_all: block j of rank i goes to rank j
    x = np.array([10 * r + j for j in range(n)], np.int64)
    y = comm.all_to_all(x)
    show(comm, "all_to_all: block j of rank i -> block i of rank j", fmt(x), fmt(y))

    # barrier
    comm.barrier()
    if r == 0:
        print("barrier: every rank arrived")
    comm.close()


if __name__ == "__main__":
    main()
