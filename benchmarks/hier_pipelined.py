"""hierarchical vs hierarchical_pipelined all_reduce across DGX nodes (issue 11, point 4).

For the ``dgx_a100`` and ``dgx_h100`` presets at 2, 4, 8 and 16 nodes and
256 MB and 1 GB, each algorithm's ``ringlet predict`` time (with the piece
count the model picks) and its ``ringlet simulate`` time with the same
parameters, and the predicted bus bandwidth.  Prints the Markdown table of
``docs/nccl.md`` ("The pipelined hierarchical all-reduce")::

    python benchmarks/hier_pipelined.py          # a few seconds
"""

from __future__ import annotations

import argparse

from ringlet.cost.model import predict
from ringlet.cost.topology import preset_profile
from ringlet.sim import Topology, simulate

ALGORITHMS = ("hierarchical", "hierarchical_pipelined")


def main() -> None:
    print("| preset | nodes | size | hierarchical: predict / simulate (busbw) "
          "| hierarchical_pipelined: predict / simulate (busbw, pieces) | speed-up |")
    print("|---|---:|---:|---:|---:|---:|")
    for link in ("dgx_a100", "dgx_h100"):
        p = preset_profile(link)
        topo = Topology.from_profile(p)
        for nodes in (2, 4, 8, 16):
            n = p.gpus_per_node * nodes
            for nbytes in (256 * 10**6, 10**9):
                cells = []
                for algo in ALGORITHMS:
                    a = predict("all_reduce", algo, n, nbytes, p, "float32")
                    s = simulate("all_reduce", algo, n, nbytes, topo, params=a.params)
                    cells.append((a.seconds, s.seconds, a.busbw, a.pieces))
                (h, hs, hb, _), (q, qs, qb, qk) = cells
                print(f"| {link} | {nodes} | {nbytes / 1e6:g} MB "
                      f"| {h * 1e3:.3g} / {hs * 1e3:.3g} ms ({hb / 1e9:.0f} GB/s) "
                      f"| {q * 1e3:.3g} / {qs * 1e3:.3g} ms ({qb / 1e9:.0f} GB/s, {qk}) "
                      f"| {h / q:.2f}x |")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    main()
