"""Non-temporal stores into users' outputs (transport.fused.STREAM), A/B in one job.

    python benchmarks/ab_stream.py [-n 2] [--sizes 2M,4M,8M,16M,32M]

all_gather, all_to_all and broadcast (out of place, fresh ``np.empty``
arrays) with the staged path's copies into the output as plain numpy copies
and as the compiled module's streaming copy, alternating in blocks within
one job (every rank switches together; the size threshold is lowered to 1
byte here so that both run at every size).  Prints rank 0's median time of
each and the ratio: the figures behind ``STREAM_MIN_BYTES``.  Needs the
compiled module (``ringlet.lean.BUILT``).
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np
from abtimer import timer

import ringlet
import ringlet.transport.fused as fused
from ringlet.config import parse_bytes


def body(comm: ringlet.Communicator, sizes: list[int], blocks: int) -> dict[str, list[float]]:
    n, out = comm.size, {}

    timed = timer(comm, out)

    fused.STREAM_MIN_BYTES = 1
    cases = []
    for nb in sizes:
        part, whole = np.ones(nb // 4 // n, np.float32), np.empty(nb // 4, np.float32)
        x, y = np.ones(nb // 4, np.float32), np.empty(nb // 4, np.float32)
        cases += [(f"all_gather {nb >> 20}M", lambda p=part, w=whole: comm.all_gather(p, out=w)),
                  (f"all_to_all {nb >> 20}M", lambda x=x, y=y: comm.all_to_all(x, out=y)),
                  (f"broadcast {nb >> 20}M", lambda x=x: comm.broadcast(x, 0))]
    for b in range(blocks):
        for on in ((True, False) if b % 2 == 0 else (False, True)):
            fused.STREAM = on
            for label, fn in cases:
                timed(f"{label} {'stream' if on else 'plain'}", fn)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=2)
    ap.add_argument("--sizes", default="2M,4M,8M,16M,32M")
    ap.add_argument("--blocks", type=int, default=8)
    a = ap.parse_args()
    if fused._copy_stream is None:
        raise SystemExit("ab_stream.py: ringlet._lean is not built (no C compiler at install)")
    sizes = [parse_bytes(s) for s in a.sizes.split(",")]
    res = ringlet.spawn(body, a.n, sizes, a.blocks)[0]
    for label in [k for k in res if k.endswith(" stream")]:
        base = label[:-len(" stream")]
        s, p = statistics.median(res[label]), statistics.median(res[base + " plain"])
        print(f"{base:16s} plain {p:8.0f} us   stream {s:8.0f} us   plain/stream {p / s:5.2f}")


if __name__ == "__main__":
    main()
