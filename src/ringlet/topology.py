"""Nodes: which ranks share a host, and so shared memory.

A *node* is the set of ranks that share a host.  A rank's node key is its
host's name and boot id (two machines cloned from one image differ in boot
id, and a rebooted machine is a new node), or ``RINGLET_NODE`` when it is
set (like ``NCCL_HOSTID``): ranks with the same key are one node, whatever
host they run on, so a test or a user can emulate several nodes on one
machine.  Inside a node ranks use shared memory; between nodes the engine
(MPI or torch.distributed).

Nodes are numbered in the order of their lowest rank, and the ranks of a
node are listed in rank order, so every rank computes the same
:class:`Topology` from the same list of keys.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from dataclasses import dataclass

from .config import Settings


def machine() -> str:
    """This machine: its host name and boot id (``name:boot-id``)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}:{boot}"


def node_key(settings: Settings) -> str:
    """This process's node key: ``settings.node``, else the machine (:func:`machine`)."""
    if settings.node:
        return f"node:{settings.node}"
    return f"host:{machine()}"


@dataclass(frozen=True)
class Topology:
    """Where a communicator's ranks are: ``comm.topology``.

    ``nodes``: the ranks of each node (a tuple of rank tuples, nodes in the
    order of their lowest rank); ``node``: this rank's node (an index into
    ``nodes``); ``engine``: what carries traffic between nodes (``"mpi"``,
    ``"torch"``), ``None`` on one node.
    """

    nodes: tuple[tuple[int, ...], ...]
    node: int
    engine: str | None

    @classmethod
    def from_keys(cls, keys: Sequence[str], rank: int, engine: str | None) -> Topology:
        order: dict[str, list[int]] = {}
        for r, k in enumerate(keys):
            order.setdefault(k, []).append(r)
        nodes = tuple(tuple(rs) for rs in order.values())
        node = next(i for i, rs in enumerate(nodes) if rank in rs)
        return cls(nodes, node, engine if len(nodes) > 1 else None)

    @classmethod
    def single(cls, size: int) -> Topology:
        return cls((tuple(range(size)),), 0, None)

    def node_of(self) -> list[int]:
        """The node index of every rank."""
        out = [0] * sum(len(rs) for rs in self.nodes)
        for i, rs in enumerate(self.nodes):
            for r in rs:
                out[r] = i
        return out

    @property
    def local_ranks(self) -> tuple[int, ...]:
        """The ranks on this rank's node."""
        return self.nodes[self.node]

    @property
    def ranks_per_node(self) -> int | None:
        """Ranks per node if every node has the same number of consecutive ranks
        (rank r on node r // ranks_per_node), else None: the layout the two-level
        (hierarchical) algorithms need."""
        g = len(self.nodes[0])
        for i, rs in enumerate(self.nodes):
            if rs != tuple(range(i * g, (i + 1) * g)):
                return None
        return g

    def sub(self, ranks: Sequence[int], rank: int) -> Topology:
        """The topology of the group of ``ranks`` (this topology's ranks, in the
        group's order), seen from the group's rank ``rank``."""
        of = self.node_of()
        return Topology.from_keys([str(of[r]) for r in ranks], rank, self.engine)

    def describe(self) -> str:
        """One line, as ``RINGLET_DEBUG=INFO`` prints it at start-up."""
        parts = [f"node {i}: ranks {_ranges(rs)}" for i, rs in enumerate(self.nodes)]
        return (f"{len(self.nodes)} node{'s' if len(self.nodes) != 1 else ''} "
                f"({'; '.join(parts)}), engine {self.engine or 'none'}")


def _ranges(ranks: Sequence[int]) -> str:
    """``0-3,6`` for (0, 1, 2, 3, 6)."""
    out: list[str] = []
    start = prev = ranks[0]
    for r in [*ranks[1:], None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return ",".join(out)
