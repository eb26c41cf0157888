"""One node simulated with a calibrated host model, rank by rank.

On this host the "link" is the CPUs: what a rank costs in a round is what the
host model of :mod:`ringlet.cost.host` says, the very terms ``ringlet predict``
sums (:func:`ringlet.cost.host.host_rounds`, no second copy of the formulas):

* every rank first pays the call's Python (``Host.call``), then all of them
  agree on the call (``Level.sync``): a synchronisation of every rank, so the
  call starts when its last rank arrives;
* in round ``i`` a rank that takes part (sends, receives or works) pays the
  round's fixed costs (the step executor's round and its busiest core's
  messages, a synchronisation per piece of the staged path, the one-shot
  exchange of the post path, times the algorithm's pace) and its own data work
  (bytes moved and reduced, on the cache-or-memory curves, times the round's
  cores-sharing factor when ranks outnumber cores).

A rank starts round ``i`` when it has finished round ``i - 1`` and the ranks
whose messages it receives in round ``i`` have finished theirs (so they have
sent them); on the fused paths (``staged``, ``post``) every round with
messages is a synchronisation of all ranks (the shared-buffer protocol's
counters), so it starts when the last rank is done with the round before.
Without stragglers or noise this is ``ringlet predict``'s answer: predict runs
this same simulator for the step executor, and on the fused paths, where every
round with messages is a synchronisation, sums the busiest rank of every round,
which is what the clocks give there (tested within 2 % on every case of
``benchmarks/sweep.json`` and every algorithm at 2, 3 and 4 ranks).  Stragglers start late; jitter
multiplies each rank's round by ``exp(SIGMA |Z|)``, drawn as
:mod:`ringlet.sim.core` draws it (16 random bits per rank and round).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

import numpy as np

from ..cost.host import HostRounds
from ..errors import ArgumentError
from ..schedule import Schedule
from .core import Result, half_normal_quantiles, noise, start_times

#: The most rank-steps the host model walks to cost every rank (about a second a million).
WALK_LIMIT = 2_000_000


def walk_size(schedule: Schedule) -> int:
    """Steps of every rank the host model walks for ``schedule`` (rank 0's, times ranks)."""
    return sum(len(rnd) for rnd in schedule.steps(0)) * schedule.nranks


def check_walk(schedule: Schedule) -> None:
    """ArgumentError if costing every rank of ``schedule`` would walk too many steps."""
    size = walk_size(schedule)
    if size > WALK_LIMIT:
        raise ArgumentError(
            f"{schedule.name}: the host model costs every rank's steps ({size:,} of them, "
            f"limit {WALK_LIMIT:,}); simulate fewer ranks, or a link (--bandwidth, --link)")


class HostSimulator:
    """Runs one call of ``schedule`` costed by the host model's ``rounds`` (see the
    module docs); :meth:`run` is :meth:`ringlet.sim.core.Simulator.run`'s."""

    def __init__(self, schedule: Schedule, rounds: HostRounds, unit_bytes: float) -> None:
        c = rounds.counts
        if c.weight != 1.0 or c.sent.shape != (schedule.nrounds, schedule.nranks):
            raise ArgumentError("the host simulator needs every rank counted (every=True)")
        self.schedule = schedule
        self.rounds = rounds
        n, R = schedule.nranks, schedule.nrounds
        barrier = c.messages & (rounds.path != "generic")
        self.barrier = barrier
        active = rounds.active
        active[barrier] = True        # a synchronisation of every rank
        self.active = active
        self.cost = rounds.fixed[:, None] * active + rounds.move + rounds.reduce
        self.live: np.ndarray = np.asarray(active.any(axis=1))
        chunk = schedule.chunk_elements(unit_bytes)
        self.deps: list[tuple[np.ndarray, np.ndarray]] = []
        self.messages, self.moved = 0, 0.0
        for i in range(R):
            ra = schedule.round_arrays(i)
            src, dst = ra["src"], ra["dst"]
            self.deps.append((src, dst))
            self.messages += len(src)
            self.moved += float(ra["chunks"].sum()) * chunk
        self.nranks = n

    def run(self, stragglers: Mapping[int, float] | None = None, jitter: float = 0.0,
            seed: int = 0, progress: Callable[[int, int], None] | None = None,
            trace: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] | None = None,
            nbytes: float = 0.0) -> Result:
        """Simulate once (as :meth:`ringlet.sim.core.Simulator.run`)."""
        s, hr = self.schedule, self.rounds
        n, R = s.nranks, s.nrounds
        t = start_times(n, R, stragglers, jitter, trace is not None)
        rng = np.random.default_rng(seed)
        table = np.exp(jitter * half_normal_quantiles()) if jitter else None
        wall = time.perf_counter()
        t = t + hr.call
        if n > 1:                              # the agreement on the call
            t = np.full(n, t.max() + hr.sync)
        every = max(1, R // 100)
        factors = np.empty(n)
        for i in range(R):
            if progress is not None and i % every == 0:
                progress(i, R)
            if not self.live[i]:
                continue
            active = self.active[i]
            if self.barrier[i]:
                start = np.full(n, t.max())
            else:
                src, dst = self.deps[i]
                start = t.copy()
                if len(src):                    # its senders are done with the round before
                    np.maximum.at(start, dst, t[src])
            cost = self.cost[i]
            if table is not None:
                cost = noise(rng, table, n, factors) * cost
            end = np.where(active, start + cost, t)
            if trace is not None:
                ranks = np.flatnonzero(active)
                trace.append((i, ranks, start[ranks], end[ranks]))
            t = end
        if progress is not None:
            progress(R, R)
        return Result(s.collective, s.algorithm, n, nbytes, float(t.max()) if n else 0.0, t,
                      int(hr.counts.messages.sum()), self.messages, self.moved,
                      time.perf_counter() - wall, dict(s.params))


__all__ = ["WALK_LIMIT", "HostSimulator", "check_walk", "walk_size"]
