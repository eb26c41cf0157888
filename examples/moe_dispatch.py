"""Mixture-of-Experts token routing (seed 001): "tokens assigned to expert E on rank R
must be physically shipped to rank R before the expert forward pass. One all-to-all
sends them there; a second brings results back."

Each rank holds a batch of tokens and one expert (a small weight matrix).  A
router picks an expert per token, so the counts are uneven and change every
step: ``all_to_all_v`` dispatches the tokens to their experts' ranks, each rank
runs its expert on what it received, and a second ``all_to_all_v`` (with the
counts transposed) combines the results back in the tokens' original order.
Every rank checks the result against running every expert locally.

    ringlet run -n 4 examples/moe_dispatch.py
"""

from __future__ import annotations

import numpy as np

import ringlet

TOKENS, HIDDEN, STEPS = 64, 8, 3


def expert_weights(e: int) -> np.ndarray:
    """Expert e's weights (every rank can build any expert's, for the check)."""
    return np.random.default_rng(1000 + e).standard_normal((HIDDEN, HIDDEN)) / HIDDEN


def main() -> None:
    comm = ringlet.init()
    r, n = comm.rank, comm.size
    mine = expert_weights(r)
    ok = True
    for step in range(STEPS):
        rng = np.random.default_rng(step * 100 + r)
        tokens = rng.standard_normal((TOKENS, HIDDEN))
        # skewed routing: expert 0 is popular, as routers often are
        expert = np.minimum(rng.geometric(0.5, TOKENS) - 1, n - 1)
        order = np.argsort(expert, kind="stable")            # group tokens by expert
        send = np.bincount(expert, minlength=n)               # tokens for each rank
        # how many tokens each rank sends here: one all-to-all of the counts
        came = comm.all_to_all(send)
        # dispatch: tokens to their experts' ranks
        arrived = comm.all_to_all_v(tokens[order], send, came)
        # each rank's expert on what arrived
        done = arrived @ mine
        # combine: the counts transposed bring every result back to its sender
        back = comm.all_to_all_v(done, came, send)
        result = np.empty_like(back)
        result[order] = back                                  # original token order
        want = np.stack([tokens[i] @ expert_weights(int(expert[i])) for i in range(TOKENS)])
        ok &= bool(np.allclose(result, want))
    print(f"rank {r}: routed {STEPS} steps of {TOKENS} tokens to {n} experts:", ok)
    comm.close()


if __name__ == "__main__":
    main()
