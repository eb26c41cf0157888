"""A schedule run as NCCL runs its rings across nodes: one channel per GPU of a node.

NCCL splits a large collective into channels, and on a node with one NIC per
GPU it builds them so that each channel leaves the node through a different
GPU's NIC: channel ``c`` is the same ring with every node's ranks rotated by
``c``.  :class:`RailChannels` gives the simulator that job: ``g`` copies of a
schedule (``g`` ranks per node), each on ``1/g`` of the data, copy ``c`` with
local rank ``i`` of every node played by local rank ``(i + c) mod g`` (mod the
node's size for a last, partial node), their messages of a round sent together.

A rotation inside a node keeps every message's link (two ranks of one node
stay on one node, ranks of different nodes stay apart), so the copies move the
schedule's bytes over the same links; what changes is who carries them.  A
single ring sends everything that leaves a node through one NIC; its ``g``
rotated copies send ``1/g`` of it through each of the node's NICs at once.
The cost model counts the same thing by averaging a node's loads
(:func:`ringlet.cost.model.count` with ``rails=True``); here the copies'
messages really share the ports and NICs they meet, round by round.

NCCL runs its channels at once, each on its own thread block and network
connection, so ``g`` channels do not pay ``g`` times a message's fixed costs
one after the other: a channel's message costs its ports ``1/g`` of the links'
per-message overhead (and of the LogGP gap), and the ``g`` copies of a message
cost, in bytes and in overheads, what the message costs
(:meth:`RailChannels.topology`).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

import numpy as np

from ..errors import ArgumentError
from ..schedule import Schedule
from .topology import Topology

#: Expanded rounds kept (keyed by the identity of the schedule's own round arrays).
CACHE = 64


class RailChannels:
    """``g`` rail channels of ``schedule`` (see the module docs), for the simulator.

    It offers what :class:`~ringlet.sim.core.Simulator` reads from a schedule:
    ``nranks``, ``nrounds``, ``round_arrays``, ``chunk_elements``,
    ``collective``, ``algorithm`` and ``params``.
    """

    def __init__(self, schedule: Schedule, gpus_per_node: int) -> None:
        n, g = schedule.nranks, int(gpus_per_node)
        if not 0 < g < n:
            raise ArgumentError(f"rail channels need 0 < gpus_per_node < nranks, got "
                                f"gpus_per_node={gpus_per_node} for {n} ranks")
        self.schedule = schedule
        self.g = g
        self.nranks, self.nrounds = n, schedule.nrounds
        self.collective, self.algorithm = schedule.collective, schedule.algorithm
        self.params = dict(schedule.params)
        r = np.arange(n, dtype=np.int64)
        base = (r // g) * g
        size = np.minimum(g, n - base)   # the node's size (the last node may be partial)
        local = r - base
        #: rot[c][r]: the rank that plays rank r in channel c
        self.rot = np.stack([base + (local + c) % size for c in range(g)])
        self._cache: OrderedDict[tuple[int, ...],
                                tuple[tuple[Any, ...], dict[str, np.ndarray]]] = OrderedDict()

    @property
    def name(self) -> str:
        return f"{self.schedule.name} as {self.g} rail channels"

    def topology(self, topo: Topology) -> Topology:
        """``topo`` with the per-message costs a channel's message pays: ``1/g`` of each
        link's overhead (and of an ``overhead`` override and the ``gap``)."""
        g = self.g
        inter = topo.inter
        return dataclasses.replace(
            topo, intra=dataclasses.replace(topo.intra, overhead=topo.intra.overhead / g),
            inter=None if inter is None else dataclasses.replace(inter,
                                                                 overhead=inter.overhead / g),
            overhead=None if topo.overhead is None else topo.overhead / g, gap=topo.gap / g)

    def chunk_elements(self, m: float) -> float:
        """A channel's chunk: the schedule's chunk of ``1/g`` of the data."""
        return self.schedule.chunk_elements(m) / self.g

    def round_arrays(self, i: int) -> dict[str, np.ndarray]:
        """Round ``i`` of every channel: the schedule's messages, once per channel, with
        the ranks rotated inside their nodes."""
        ra = self.schedule.round_arrays(i)
        arrays = tuple(ra.values())
        key = tuple(id(a) for a in arrays)
        hit = self._cache.get(key)
        if hit is not None and all(a is b for a, b in zip(hit[0], arrays, strict=True)):
            self._cache.move_to_end(key)
            return hit[1]
        src, dst = ra["src"], ra["dst"]
        out = {"src": self.rot[:, src].reshape(-1), "dst": self.rot[:, dst].reshape(-1),
               "chunks": np.tile(ra["chunks"], self.g), "reduce": np.tile(ra["reduce"], self.g)}
        if "local" in ra:
            loc = np.zeros(self.nranks, dtype=np.asarray(ra["local"]).dtype)
            for rot in self.rot:
                np.add.at(loc, rot, ra["local"])
            out["local"] = loc
        self._cache[key] = (arrays, out)   # holding the arrays keeps their ids unique
        if len(self._cache) > CACHE:
            self._cache.popitem(last=False)
        return out
