"""What the simulated ranks are connected by: links, NICs, rails and a two-level fat-tree.

Rank ``r`` is GPU ``r % gpus_per_node`` of node ``r // gpus_per_node`` (one
node holding every rank when ``gpus_per_node`` is 0).  A message between two
ranks of a node uses the ``intra`` link: the sender's port out and the
receiver's port in, each of ``intra.bandwidth`` per direction.  Any other
message leaves through a NIC of the sender's node and enters through a NIC of
the receiver's: GPU ``i`` uses NIC ``i * nics_per_node // gpus_per_node``, so
with fewer NICs than GPUs several GPUs share one (each NIC has
``inter.bandwidth`` per direction).

Nodes hang off leaf switches, ``nodes_per_leaf`` per leaf (0: one
non-blocking switch).  A message between leaves climbs its leaf's uplink and
descends the other's downlink; a leaf's uplinks together carry what its NICs
can send, divided by ``oversubscription`` (1: a full fat-tree, 2: half the
bandwidth up, ...).  With ``rails`` the fabric is rail-optimised: NIC ``k`` of
every node plugs into rail ``k``'s leaves, so a message from NIC k to NIC k
stays on its rail's leaf while one between different NICs crosses the spine.

Costs per message are LogGP's, charged where the cost model charges them:
every message occupies its sender's port and its receiver's port (for a
message between nodes: their NICs) for the link's per-message ``overhead``
(:attr:`~ringlet.cost.model.Link.overhead`) on top of its bytes, so a rank
that sends or receives k messages in a round is busy ``k * overhead`` more;
``gap`` is LogGP's g, the least time a port spends per message (the larger of
the two counts).  ``overhead`` given here replaces every link's own.  The
message then takes the link's latency plus its port's time.

A calibrated local profile (``ringlet predict --calibrate``) also brings its
``host``: the costs of ringlet's shared-memory transport on this machine
(:class:`~ringlet.cost.host.Host`).  Ranks of one node are then simulated with
that host model (:mod:`ringlet.sim.host`), not with the link's alpha, beta and
gamma, as ``ringlet predict`` predicts them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..cost.host import Host
from ..cost.model import Link, Profile
from ..cost.units import format_seconds
from ..errors import ArgumentError


@dataclass(frozen=True)
class Topology:
    """The links of a simulated job (see the module docs)."""

    intra: Link
    inter: Link | None = None
    gpus_per_node: int = 0
    nics_per_node: int = 0          # 0: one NIC per GPU
    rails: bool = False
    nodes_per_leaf: int = 0         # 0: every node on one non-blocking switch
    oversubscription: float = 1.0
    overhead: float | None = None   # LogGP o per message at each port; None: the links' own
    gap: float = 0.0                # LogGP g: least seconds a port spends per message
    host: Host | None = None        # a calibrated host model: one node is simulated with it

    def __post_init__(self) -> None:
        if self.inter is not None and self.gpus_per_node < 1:
            raise ArgumentError("a two-level topology needs gpus_per_node >= 1, "
                                f"got {self.gpus_per_node}")
        for name in ("gpus_per_node", "nics_per_node", "nodes_per_leaf"):
            if getattr(self, name) < 0:
                raise ArgumentError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.inter is None and (self.nics_per_node or self.nodes_per_leaf):
            raise ArgumentError(
                f"{'nics_per_node' if self.nics_per_node else 'nodes_per_leaf'} describes the "
                f"network between nodes, and this topology has one level (give nodes: "
                f"--nodes, or --link with an inter-node part)")
        if self.nics_per_node > max(self.gpus_per_node, 1):
            raise ArgumentError(f"nics_per_node ({self.nics_per_node}) cannot exceed the GPUs "
                                f"per node ({self.gpus_per_node})")
        if not (self.oversubscription >= 1 and math.isfinite(self.oversubscription)):
            raise ArgumentError(
                f"oversubscription is a ratio >= 1 (1: full bisection), got "
                f"{self.oversubscription!r}")
        if self.oversubscription != 1 and not self.nodes_per_leaf:
            raise ArgumentError(
                f"oversubscription {self.oversubscription:g} is the leaf switches' uplinks' "
                f"ratio: give nodes_per_leaf (--nodes-per-leaf) too")
        if (self.overhead is not None and not self.overhead >= 0) or not self.gap >= 0:
            raise ArgumentError("overhead and gap must be >= 0 seconds")

    def per_message(self, link: Link) -> float:
        """Seconds a port spends per message on ``link``: its overhead (or this topology's
        override), at least the gap."""
        o = link.overhead if self.overhead is None else self.overhead
        return max(o, self.gap)

    @classmethod
    def from_profile(cls, profile: Profile, **kw: object) -> Topology:
        """The topology of a cost-model :class:`~ringlet.cost.model.Profile` (its links,
        ranks per node and host model), with the simulator's own options in ``kw``."""
        kw.setdefault("host", profile.host)
        return cls(profile.intra, profile.inter,
                   profile.gpus_per_node if profile.inter is not None else 0,
                   **kw)  # type: ignore[arg-type]

    def uses_host(self, nranks: int) -> bool:
        """Whether ``nranks`` ranks are simulated with the host model (all on one node of a
        topology with one), as :meth:`~ringlet.cost.model.Profile.uses_host` predicts them."""
        return self.host is not None and (self.inter is None or self.gpus_per_node >= nranks)

    @property
    def nics(self) -> int:
        """NICs per node."""
        return self.nics_per_node or max(self.gpus_per_node, 1)

    def describe(self, nranks: int = 0) -> str:
        if self.host is not None and self.uses_host(nranks):
            h = self.host
            return (f"this host's shared-memory transport (the calibrated host model): "
                    f"{h.cores} cores, {h.llc_bytes >> 20} MiB last-level cache, fixed costs "
                    f"calibrated up to {h.calibrated_ranks} ranks")
        if self.inter is None:
            return (f"one level: {self.intra.bandwidth / 1e9:.4g} GB/s, alpha "
                    f"{format_seconds(self.intra.alpha)}")
        fabric = ("one non-blocking switch" if not self.nodes_per_leaf else
                  f"{self.nodes_per_leaf} nodes per leaf, {self.oversubscription:g}:1 "
                  f"oversubscribed{', rail-optimised' if self.rails else ''}")
        return (f"{self.gpus_per_node} ranks per node on {self.intra.bandwidth / 1e9:.4g} GB/s, "
                f"{self.nics} NICs of {self.inter.bandwidth / 1e9:.4g} GB/s per node, {fabric}")
