"""The simulator: ringlet's own schedules at scale, over a topology, with stragglers and noise.

>>> from ringlet.cost.model import Link
>>> from ringlet.sim import Topology, simulate
>>> r = simulate("all_reduce", "ring", 4, 4_000_000, Topology(Link.from_bandwidth(1e9, 1e-6)))
>>> round(r.seconds * 1e3, 3)      # 6 rounds of (1 us + 1 MB / 1 GB/s)
6.006

The core (:mod:`ringlet.sim.core`) runs a schedule's closed-form rounds
(:meth:`ringlet.schedule.Schedule.round_arrays`) on every rank at once;
:mod:`ringlet.sim.topology` says what the ranks are connected by;
``ringlet simulate`` (:mod:`ringlet.sim.cli`) is the command.

A calibrated local profile (``ringlet predict --calibrate``; its topology
carries the profile's ``host``) is simulated with the host model
(:mod:`ringlet.sim.host`): each rank's round costs what ``ringlet predict``'s
host model (:mod:`ringlet.cost.host`) counts for it (the call's Python, the
agreement, the rounds' fixed costs, bytes moved and reduced on the
cache-or-memory curves, cores shared by ranks, the fused paths' pieces), not
the link's alpha, beta and gamma; stragglers and jitter act per rank as
everywhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ..algorithms import build, entry
from ..cost.host import Paths, host_rounds
from ..cost.model import dtype_of, estimator, path_bytes, unit_count
from ..errors import ArgumentError
from ..ops import DType
from ..schedule import ROOTED
from .core import Result, Simulator
from .host import HostSimulator, check_walk
from .rails import RailChannels
from .topology import Topology

#: What :func:`simulator` builds: over links, or with a calibrated host model.
AnySimulator = Simulator | HostSimulator

__all__ = ["AnySimulator", "HostSimulator", "RailChannels", "Result", "Simulator", "Topology",
           "simulate", "simulator"]


def simulate(collective: str, algorithm: str, nranks: int, nbytes: int, topology: Topology,
             *, dtype: str | DType = "float32", root: int = 0,
             params: Mapping[str, int] | None = None,
             stragglers: Mapping[int, float] | None = None, jitter: float = 0.0,
             seed: int = 0, progress: Callable[[int, int], None] | None = None,
             trace: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] | None = None,
             rails: bool = False, paths: Paths | None = None) -> Result:
    """Simulate one call of ``collective`` (``nbytes``: nccl-tests' size, as ``ringlet
    predict`` takes it) with ``algorithm`` on ``nranks`` ranks over ``topology``.

    ``params`` fixes the algorithm's parameters (``pieces``, ``group``; others are
    ignored); on a two-level topology ``group`` defaults to the ranks per node.
    ``stragglers`` maps a rank to the seconds it starts late; ``jitter`` is the
    sigma of the per-message noise, drawn from ``seed``.  ``rails`` runs the schedule as
    NCCL runs its rings across nodes, one channel per GPU of a node, each leaving the
    node through its own NIC (:class:`~ringlet.sim.rails.RailChannels`; two levels only,
    as ``ringlet predict --rails``).

    A topology with a calibrated host model (:meth:`Topology.uses_host`) runs the
    host model's costs per rank (:mod:`ringlet.sim.host`), on the shared-memory
    path ``paths`` gives the call (default :class:`~ringlet.cost.host.Paths`, as
    :func:`ringlet.cost.model.predict`).
    """
    sim = simulator(collective, algorithm, nranks, nbytes, topology, dtype=dtype, root=root,
                    params=params, rails=rails, paths=paths)
    return sim.run(stragglers, jitter, seed, progress, trace, float(nbytes))


def simulator(collective: str, algorithm: str, nranks: int, nbytes: int, topology: Topology,
              *, dtype: str | DType = "float32", root: int = 0,
              params: Mapping[str, int] | None = None, rails: bool = False,
              paths: Paths | None = None) -> AnySimulator:
    """The :class:`Simulator` :func:`simulate` runs: build it once to run one call many
    times (other stragglers, other seeds), as ``ringlet plan --simulate`` does per bucket."""
    d = dtype_of(dtype)
    e = entry(collective, algorithm)
    fixed = {k: int(v) for k, v in (params or {}).items() if k in e.params}
    if "group" in e.params and "group" not in fixed and topology.inter is not None \
            and 0 < topology.gpus_per_node < nranks and nranks % topology.gpus_per_node == 0:
        fixed["group"] = topology.gpus_per_node
    root = root if collective in ROOTED else 0
    s = build(collective, e.name, nranks, root, **fixed)
    m = unit_count(collective, nbytes, nranks, d.itemsize)
    if fixed.get("pieces", 1) > 1:   # at most as many pieces as predict takes
        estimator(collective, e.name, nranks, root, 0, tuple(sorted(
            (k, v) for k, v in fixed.items() if k != "pieces"))).check_pieces(fixed["pieces"], m)
    if topology.host is not None and topology.uses_host(nranks):
        if rails:
            raise ArgumentError("rails need two levels of links; this host is one node")
        check_walk(s)
        hr = host_rounds(topology.host, collective, e.name, nranks, m, d, paths or Paths(),
                         path_bytes(collective, m, nranks, d.itemsize), root,
                         tuple(sorted(fixed.items())), every=True)
        return HostSimulator(s, hr, m * d.itemsize)
    if rails and topology.inter is None:
        raise ArgumentError("rails need two levels of links (a node shape or --intra/--inter)")
    if rails and 0 < topology.gpus_per_node < nranks:   # on one node there is nothing to rotate
        channels = RailChannels(s, topology.gpus_per_node)
        return Simulator(channels, m * d.itemsize,  # type: ignore[arg-type]
                         channels.topology(topology))
    return Simulator(s, m * d.itemsize, topology)
