"""The simulator's core: a schedule's rounds run over a :class:`~ringlet.sim.topology.Topology`.

Time is kept per rank: ``t[r]`` is when rank ``r`` is done with the rounds so
far.  A round's messages come from the schedule's closed form
(:meth:`~ringlet.schedule.Schedule.round_arrays`), as vectors, and every rank
advances at once (numpy), so a round of 16,384 ranks costs a few vector
operations.  For every message of round ``i`` from ``s`` to ``d``:

* it leaves at ``max(t[s], t[d])``: once both ends are done with the rounds
  before (a rendezvous: the receiver's buffer is free);
* it arrives ``latency + port`` later, where ``port`` is the time of the most
  loaded link on its path: the messages of a round that use a link (a rank's
  port, a NIC, a leaf switch's uplinks) share its bandwidth, as if they ran at
  once, and every message costs the ports (and NICs) it leaves and enters the
  link's per-message overhead (LogGP's ``o``, at least ``g``): ``p - 1``
  messages cost ``p - 1`` overheads, as in the cost model;
* the sender is done with it when it has arrived (a rendezvous: NCCL reuses a
  step's buffer slot only once the receiver has it, so its tuner charges a
  latency per step), the receiver when it has arrived and, if the receiver
  reduces it, after ``gamma * bytes`` more (reductions of one round are serial),
  and after the round's local reductions (the ``local`` chunks of
  ``round_arrays``, e.g. recursive doubling's), ``gamma * bytes`` again.

A rank finishes round ``i`` at the latest of its start, its sends' ends and its
receives' ends.  So ranks are not in lockstep: a chain or a tree pipelines
pieces round after round as far as the data allows, and a late rank delays
exactly the ranks that wait for its data (a ring all-reduce is as slow as its
slowest link).

Stragglers start late (``{rank: seconds}``).  Noise is seeded: with
``jitter=SIGMA`` each message's time (latency and transfer) is multiplied by
``exp(SIGMA * |Z|)``, ``Z`` standard normal: a folded lognormal, at least 1,
so noise only ever slows a message down and, the recurrence being monotone,
never makes a run faster than without it.  ``|Z|`` is drawn by inverse
transform from 16 random bits of ``numpy.random.default_rng(seed)``'s bit
generator: the half-normal's quantile at ``(i + 1/2) / 65536`` for ``i`` the
bits (:data:`NOISE_LEVELS` levels, ``|Z|`` between 1e-5 and 4.48), four
messages per 64-bit draw, which is what lets a ring of 16,384 ranks draw its
5.4e8 messages' noise in a few seconds.  The same seed gives the same answer;
there is no global state.

What it leaves out: messages of different rounds do not contend (a slow
round's traffic does not steal bandwidth from the next), and links are
shared max-min fairly only in the sense above (each message gets its share of
its most loaded link for its whole duration).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from statistics import NormalDist
from typing import Any

import numpy as np

from ..errors import ArgumentError
from ..schedule import Schedule
from .topology import Topology

#: Round patterns kept (a pattern holds its arrays, so ids in the cache stay unique).
PATTERN_CACHE = 64
#: The most rank-rounds a trace may record (a Chrome trace beyond that will not open).
TRACE_LIMIT = 2_000_000
#: Levels of the noise's inverse-CDF table: 16 random bits a message.
NOISE_LEVELS = 1 << 16


@lru_cache(maxsize=1)
def half_normal_quantiles() -> np.ndarray:
    """``|Z|``'s quantiles at ``(i + 1/2) / NOISE_LEVELS``, Z standard normal (read-only)."""
    nd = NormalDist()
    q = np.array([nd.inv_cdf(0.5 + 0.5 * (i + 0.5) / NOISE_LEVELS)
                  for i in range(NOISE_LEVELS)])
    q.setflags(write=False)
    return q


def noise(rng: np.random.Generator, table: np.ndarray, size: int,
          out: np.ndarray | None = None) -> np.ndarray:
    """``size`` factors from ``table`` (:data:`NOISE_LEVELS` entries), 16 random bits each."""
    words = rng.bit_generator.random_raw(-(-size // 4))
    idx = np.asarray(words).view(np.uint16)[:size]
    return np.take(table, idx, out=out if out is not None and len(out) == size else None)


@dataclass
class Result:
    """One simulated run."""

    collective: str
    algorithm: str
    nranks: int
    nbytes: float                 # the collective's size (what --bytes said)
    seconds: float                # the last rank's finish time, from the start at 0
    finish: np.ndarray            # per rank: when it finished
    rounds: int                   # rounds with at least one message
    messages: int                 # messages sent, all ranks
    bytes_moved: float            # bytes sent, all ranks
    wall: float                   # seconds the simulation took
    params: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"collective": self.collective, "algorithm": self.algorithm,
                "nranks": self.nranks,   # a whole number of bytes, as predict's JSON has it
                "nbytes": int(self.nbytes) if float(self.nbytes).is_integer() else self.nbytes,
                "seconds": self.seconds,
                "rounds": self.rounds, "messages": self.messages,
                "bytes_moved": self.bytes_moved, "slowest_rank": int(np.argmax(self.finish)),
                "params": dict(self.params), "wall_seconds": self.wall}


@dataclass
class _Pattern:
    """What a round's messages cost, before anyone's clock is known."""

    arrays: tuple[np.ndarray, ...]     # the round's arrays (kept alive: see PATTERN_CACHE)
    src: np.ndarray
    dst: np.ndarray
    latency: np.ndarray
    transfer: np.ndarray               # its most loaded link's time: bytes and messages
    reduce_dst: np.ndarray             # per receiver (in `rdst` order): reduction seconds
    shift: int                         # -1, or k if src = 0..n-1 and dst = src + k
    sdst: np.ndarray                   # unique senders / receivers and how to group them
    rdst: np.ndarray
    sorder: np.ndarray | None
    sstarts: np.ndarray | None
    rorder: np.ndarray | None
    rstarts: np.ndarray | None
    nbytes: float
    reduce_rank: np.ndarray | None = None   # shift patterns: reduction seconds per rank
    local: np.ndarray | None = None         # per rank: local reduction seconds

    @property
    def cost(self) -> np.ndarray:
        """Per message: from both ends ready to arrival, without noise."""
        if self._cost is None:
            self._cost = self.latency + self.transfer
        return self._cost

    _cost: np.ndarray | None = None


def _groups(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(unique keys, order, starts) to reduce per key with ``reduceat``; order None if
    every key occurs once (then the messages are already one per key)."""
    if len(np.unique(keys)) == len(keys):
        return keys, None, None
    order = np.argsort(keys, kind="stable")
    k = keys[order]
    starts = np.flatnonzero(np.r_[True, k[1:] != k[:-1]])
    return k[starts], order, starts


class _Network:
    """A topology laid over ``n`` ranks: link ids and capacities (see the module docs)."""

    def __init__(self, topo: Topology, n: int) -> None:
        self.topo, self.n = topo, n
        inter = topo.inter
        g = topo.gpus_per_node if inter is not None and 0 < topo.gpus_per_node < n else 0
        self.g = g
        self.two = g > 0
        if inter is None or not self.two:
            return
        self.inter = inter
        nodes = -(-n // g)
        nics = topo.nics
        self.nics = nics
        self.nic_slots = nodes * nics
        rails = topo.rails and topo.nodes_per_leaf > 0
        self.rails = rails
        per_leaf = topo.nodes_per_leaf or nodes
        self.per_leaf = per_leaf
        nleaves = -(-nodes // per_leaf) * (nics if rails else 1)
        self.nleaves = nleaves
        nic_bw = inter.bandwidth
        leaf_nics = per_leaf * (1 if rails else nics)
        self.leaf_bw = leaf_nics * nic_bw / topo.oversubscription

    def transfer(self, src: np.ndarray, dst: np.ndarray, nb: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
        """(latency, transfer seconds) of every message of one round."""
        topo, n = self.topo, self.n
        intra_bw = topo.intra.bandwidth
        o_in = topo.per_message(topo.intra)
        if not self.two:
            out = np.bincount(src, nb, n) / intra_bw
            inn = np.bincount(dst, nb, n) / intra_bw
            if o_in:
                out += np.bincount(src, minlength=n) * o_in
                inn += np.bincount(dst, minlength=n) * o_in
            return (np.full(len(src), topo.intra.alpha),
                    np.maximum(out[src], inn[dst]))
        inter = self.inter
        g = self.g
        ns, nd = src // g, dst // g
        cross = ns != nd
        lat = np.where(cross, inter.alpha, topo.intra.alpha)
        # the intra ports: bytes over the bandwidth, and the per-message overhead
        w_in = np.where(cross, 0.0, nb)
        p_out = np.bincount(src, w_in, n) / intra_bw
        p_in = np.bincount(dst, w_in, n) / intra_bw
        if o_in:
            local = (~cross).astype(float)
            p_out += np.bincount(src, local, n) * o_in
            p_in += np.bincount(dst, local, n) * o_in
        t_intra = np.maximum(p_out[src], p_in[dst])
        # the NICs
        w_x = nb - w_in
        nic_s = ns * self.nics + (src % g) * self.nics // g
        nic_d = nd * self.nics + (dst % g) * self.nics // g
        bw = inter.bandwidth
        n_out = np.bincount(nic_s, w_x, self.nic_slots) / bw
        n_in = np.bincount(nic_d, w_x, self.nic_slots) / bw
        o_x = topo.per_message(inter)
        if o_x:
            remote = cross.astype(float)
            n_out += np.bincount(nic_s, remote, self.nic_slots) * o_x
            n_in += np.bincount(nic_d, remote, self.nic_slots) * o_x
        t_nic = np.maximum(n_out[nic_s], n_in[nic_d])
        # the leaves' uplinks and downlinks
        if self.topo.nodes_per_leaf:
            if self.rails:
                ls = (ns // self.per_leaf) * self.nics + nic_s % self.nics
                ld = (nd // self.per_leaf) * self.nics + nic_d % self.nics
            else:
                ls, ld = ns // self.per_leaf, nd // self.per_leaf
            w_l = np.where(ls != ld, w_x, 0.0)
            t_leaf = np.maximum((np.bincount(ls, w_l, self.nleaves) / self.leaf_bw)[ls],
                                (np.bincount(ld, w_l, self.nleaves) / self.leaf_bw)[ld])
            t_nic = np.where(w_l > 0, np.maximum(t_nic, t_leaf), t_nic)
        return lat, np.where(cross, t_nic, t_intra)


def start_times(n: int, rounds: int, stragglers: Mapping[int, float] | None, jitter: float,
                traced: bool) -> np.ndarray:
    """Every rank's clock at the start (its straggler delay), once the disturbances and a
    trace's size are checked."""
    if not (math.isfinite(jitter) and jitter >= 0):
        raise ArgumentError(f"jitter sigma must be a number >= 0, got {jitter!r}")
    if traced and n * rounds > TRACE_LIMIT:
        raise ArgumentError(
            f"a trace of {n} ranks x {rounds} rounds would hold {n * rounds:,} events (limit "
            f"{TRACE_LIMIT:,}); trace a smaller job")
    t = np.zeros(n)
    for r, delay in (stragglers or {}).items():
        if not 0 <= r < n:
            raise ArgumentError(f"straggler rank {r} is out of range (0..{n - 1})")
        if not (math.isfinite(delay) and delay >= 0):
            raise ArgumentError(f"straggler delay must be >= 0 seconds, got {delay!r}")
        t[r] += delay
    return t


class Simulator:
    """Runs one schedule at one size over one topology (see the module docs)."""

    def __init__(self, schedule: Schedule, unit_bytes: float, topology: Topology) -> None:
        self.schedule = schedule
        self.chunk_bytes = schedule.chunk_elements(unit_bytes)
        self.topology = topology
        self.net = _Network(topology, schedule.nranks)
        self._patterns: OrderedDict[tuple[int, ...], _Pattern] = OrderedDict()

    def pattern(self, ra: Mapping[str, np.ndarray]) -> _Pattern:
        arrays = (ra["src"], ra["dst"], ra["chunks"], ra["reduce"], *(
            [ra["local"]] if "local" in ra else []))
        key = tuple(id(a) for a in arrays)
        got = self._patterns.get(key)
        if got is not None:
            self._patterns.move_to_end(key)
            return got
        src, dst, chunks, red = arrays[:4]
        n, topo = self.schedule.nranks, self.topology
        nb = chunks * self.chunk_bytes
        lat, xfer = self.net.transfer(src, dst, nb)
        sdst, sorder, sstarts = _groups(src)
        rdst, rorder, rstarts = _groups(dst)
        gamma = topo.intra.gamma
        red_bytes = np.bincount(dst, np.where(red, nb, 0.0), n)[rdst] if gamma else \
            np.zeros(len(rdst))
        shift = -1
        if len(src) == n and n > 1 and sorder is None and rorder is None \
                and np.array_equal(src, np.arange(n)):
            k = int((dst[0] - src[0]) % n)
            if np.array_equal(dst, (src + k) % n):
                shift = k
        p = _Pattern(arrays, src, dst, lat, xfer, red_bytes * gamma, shift, sdst, rdst,
                     sorder, sstarts, rorder, rstarts, float(nb.sum()))
        if shift >= 0 and gamma and red.any():
            p.reduce_rank = np.zeros(n)
            p.reduce_rank[rdst] = p.reduce_dst
        if gamma and len(arrays) > 4 and arrays[4].any():
            p.local = arrays[4] * (self.chunk_bytes * gamma)
        self._patterns[key] = p
        if len(self._patterns) > PATTERN_CACHE:
            self._patterns.popitem(last=False)
        return p

    def run(self, stragglers: Mapping[int, float] | None = None, jitter: float = 0.0,
            seed: int = 0, progress: Callable[[int, int], None] | None = None,
            trace: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] | None = None,
            nbytes: float = 0.0) -> Result:
        """Simulate once.  ``trace``, if given, receives ``(round, ranks, start, end)`` for
        every round (ranks with a message in it)."""
        s = self.schedule
        n, R = s.nranks, s.nrounds
        t = start_times(n, R, stragglers, jitter, trace is not None)
        rng = np.random.default_rng(seed)
        wall = time.perf_counter()
        rounds = messages = 0
        moved = 0.0
        every = max(1, R // 100)
        arrive, got = np.empty(n), np.empty(n)   # the shift rounds' work vectors
        table = np.exp(jitter * half_normal_quantiles()) if jitter else None
        factors = np.empty(n)
        for i in range(R):
            if progress is not None and i % every == 0:
                progress(i, R)
            ra = s.round_arrays(i)
            if not len(ra["src"]):
                if "local" in ra and self.topology.intra.gamma:
                    t = t + ra["local"] * (self.chunk_bytes * self.topology.intra.gamma)
                continue
            p = self.pattern(ra)
            rounds += 1
            messages += len(p.src)
            moved += p.nbytes
            cost = p.cost   # leaving, latency and transfer
            if table is not None:
                cost = noise(rng, table, len(p.src), factors)
                cost *= p.cost
            before = t.copy() if trace is not None else None
            if p.shift >= 0:
                # every rank sends to rank + k: shifts instead of gathers, in place
                k = p.shift
                arrive[:n - k], arrive[n - k:] = t[k:], t[:k]   # the receiver's clock
                np.maximum(arrive, t, out=arrive)
                arrive += cost                                  # in sender order
                got[k:], got[:k] = arrive[:n - k], arrive[n - k:]
                np.maximum(got, t, out=got)                     # in receiver order
                if p.reduce_rank is not None:
                    got += p.reduce_rank
                t = np.maximum(arrive, got)
            else:
                ts = np.maximum(t[p.src], t[p.dst])
                arrive_m = done = ts + cost
                new = t.copy()
                if p.sorder is not None and p.sstarts is not None:
                    done = np.maximum.reduceat(done[p.sorder], p.sstarts)
                new[p.sdst] = np.maximum(new[p.sdst], done)
                got_r = arrive_m
                if p.rorder is not None and p.rstarts is not None:
                    got_r = np.maximum.reduceat(arrive_m[p.rorder], p.rstarts)
                new[p.rdst] = np.maximum(new[p.rdst],
                                         np.maximum(t[p.rdst], got_r) + p.reduce_dst)
                t = new
            if p.local is not None:
                t = t + p.local
            if trace is not None and before is not None:
                active = np.union1d(p.sdst, p.rdst)
                trace.append((i, active, before[active], t[active]))
        if progress is not None:
            progress(R, R)
        return Result(s.collective, s.algorithm, n, nbytes, float(t.max()) if n else 0.0, t,
                      rounds, messages, moved, time.perf_counter() - wall, dict(s.params))

