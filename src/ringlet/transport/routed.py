"""Shared memory inside a node, the engine between nodes: the transport of a multi-node job.

A :class:`RoutedTransport` dispatches by peer.  A peer on this rank's node
is reached through the node's :class:`~ringlet.transport.shm.ShmTransport`
(which holds only the node's ranks, numbered locally); any other peer
through the engine transport (MPI or torch.distributed), which numbers every
rank of the communicator and runs agreement and status frames only with the
peers on other nodes (its ``remote`` peers).  Nothing above this class sees
the difference: the executor runs any schedule on it, so a two-level
schedule (``hierarchical``) keeps its intra-node rounds in shared memory and
sends only its inter-node rounds over the network.

The fused shared-memory paths need every rank on one host, so a routed
transport has none (``caps.fused`` is False); the engine's own collectives
(``native``) run over the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..config import Settings
from ..wait import Waiter
from .base import COLL, OTHER, Caps, NativeCall, Reducer, Request, Transport
from .shm import ShmTransport


class RoutedTransport(Transport):
    """Shared memory to the peers on this node, ``engine`` to the others."""

    def __init__(self, rank: int, node_of: Sequence[int], local: ShmTransport | None,
                 engine: Transport) -> None:
        self.rank, self.size = rank, len(node_of)
        self.node_of = list(node_of)
        me = self.node_of[rank]
        #: this communicator's ranks on this node, in order (the local transport's ranks)
        self.locals = [q for q in range(self.size) if self.node_of[q] == me]
        # alone on its node: every peer, this rank included (p2p polls it), is the engine's
        self.lidx = {q: i for i, q in enumerate(self.locals)} if local is not None else {}
        self.remote = [q for q in range(self.size) if self.node_of[q] != me]
        if (local is None) != (len(self.locals) == 1):
            raise ValueError("a routed transport needs shared memory iff its node has peers")
        self.local = local
        self.engine = engine
        if local is not None:
            local.names = list(self.locals)
        # waits poll both transports: an engine whose messages are reported by threads
        # (torch's gloo) needs waits that let them run, so its settings win over the
        # shared memory's spinning ones
        self.settings = engine.settings if local is None or engine.caps.engine == "torch" \
            else local.settings
        self.caps = Caps(engine=engine.caps.engine, native=engine.caps.native, rails=True)
        #: waits for node-local requests only: shared memory's spin, then sleep (no
        #: yielding: other ranks' engine threads need the cores, 4 ranks on 2 here)
        self._local_wait = self.settings if local is None else \
            local.settings.replace(yield_us=0.0)
        #: the engine's groups of this rank's rails (:meth:`rail`), by ranks per group
        self._rails: dict[int, Transport] = {}

    def _set_describe(self, fn: Callable[[], str]) -> None:
        self._describe = fn
        self.engine.describe = fn
        if self.local is not None:
            self.local.describe = fn

    describe = property(lambda self: self._describe, _set_describe)
    _describe: Callable[[], str] = staticmethod(lambda: "a collective")

    # --- messages ---------------------------------------------------------------------

    def isend(self, peer: int, parts: Sequence[np.ndarray], channel: int = COLL) -> Request:
        i = self.lidx.get(peer)
        if i is None:
            return self.engine.isend(peer, parts, channel)
        r = self.local.isend(i, parts, channel)  # type: ignore[union-attr]
        r.peer = peer
        return r

    def irecv(self, peer: int, parts: Sequence[np.ndarray], reducer: Reducer | None = None,
              channel: int = COLL) -> Request:
        i = self.lidx.get(peer)
        if i is None:
            return self.engine.irecv(peer, parts, reducer, channel)
        r = self.local.irecv(i, parts, reducer, channel)  # type: ignore[union-attr]
        r.peer = peer
        return r

    def push_message(self, peer: int, fmt: tuple[int, int, int, int], tag: int, code: int,
                     payload: np.ndarray) -> bool:
        i = self.lidx.get(peer)
        if i is None:   # the engine has no such path: the frame goes through isend
            return False
        return self.local.push_message(i, fmt, tag, code, payload)  # type: ignore[union-attr]

    def take_message(self, peer: int, fmt: tuple[int, int, int, int], tag: int, code: int,
                     out: np.ndarray, spin_s: float) -> int:
        i = self.lidx.get(peer)
        if i is None:
            return OTHER
        return self.local.take_message(i, fmt, tag, code, out,  # type: ignore[union-attr]
                                      spin_s)

    def progress(self) -> bool:
        moved = self.engine.progress()
        if self.local is not None:
            moved |= self.local.progress()
        return moved

    def wait(self, reqs: Sequence[Request], what: Callable[[], str]) -> None:
        """Wait for ``reqs``.  While only engine requests are pending here (none of
        ``reqs`` local, nothing pending in shared memory), the engine's own wait, which
        for torch blocks until a lane reports: a poll of both transports kept 4 ranks on
        2 cores so busy that two flows across a 1 Gbit/s link got half its rate
        (hierarchical's rounds across nodes took twice as long as alone)."""
        if self.local is not None and not self.local.pending_peers() and \
                all(r.done or r.peer not in self.lidx for r in reqs):
            self.engine.wait(reqs, what)
            return
        super().wait(reqs, what)

    def wait_settings(self, reqs: Sequence[Request]) -> Settings:
        """The engine's settings while an engine request is pending (torch's do not spin:
        its lanes need the GIL); shared memory's, which spin and yield, while only
        shared-memory ones are (a hierarchical schedule's rounds inside the node)."""
        if self.local is not None and all(r.done or r.peer in self.lidx for r in reqs):
            return self._local_wait
        return self.settings

    def events(self) -> int:
        return self.engine.events()

    def idle(self, seen: int, waiter: Waiter,
             peers: Callable[[], Sequence[int] | None] | None = None) -> None:
        """The engine's idle while the caller waits only for peers on other nodes and
        nothing is in flight in shared memory; otherwise the waiter's pause (shared
        memory is polled)."""
        if self.local is not None:
            who = None if peers is None else peers()
            if who is None or self.local.pending_peers() or any(q in self.lidx for q in who):
                waiter.pause()
                return
        self.engine.idle(seen, waiter, peers)

    def discard_pending(self) -> None:
        self.engine.discard_pending()
        if self.local is not None:
            self.local.discard_pending()

    # --- agreement ----------------------------------------------------------------------

    def publish(self, seq: int, words: Sequence[int], note: str | None = None) -> None:
        if self.local is not None:
            self.local.publish(seq, words, note)
        self.engine.publish(seq, words, note)

    def peer_desc(self, q: int, seq: int) -> tuple[int, ...] | None:
        i = self.lidx.get(q)
        if i is None:
            return self.engine.peer_desc(q, seq)
        return self.local.peer_desc(i, seq)  # type: ignore[union-attr]

    def note(self, q: int, seq: int) -> str:
        i = self.lidx.get(q)
        return self.engine.note(q, seq) if i is None else \
            self.local.note(i, seq)  # type: ignore[union-attr]

    def latest_desc(self, q: int) -> tuple[int, tuple[int, ...]] | None:
        i = self.lidx.get(q)
        return self.engine.latest_desc(q) if i is None else \
            self.local.latest_desc(i)  # type: ignore[union-attr]

    # --- liveness ---------------------------------------------------------------------

    def check(self, watch: Sequence[int] | None = None, what: str | None = None) -> None:
        peers = range(self.size) if watch is None else watch
        if self.local is not None:
            self.local.check([self.lidx[q] for q in peers if q in self.lidx], what)
        self.engine.check([q for q in peers if q not in self.lidx], what)

    def abort(self, message: str, timeout: bool = False, tell: bool = True,
              unsure: bool = False) -> None:
        # told through shared memory: the rank that failed first told every other node
        # over the engine itself, so this rank does not repeat it there, nor say it
        # closed later (a send to a rank that died can crash MPICH)
        told = self.local is not None and self.local.aborted() is not None
        if self.local is not None:
            self.local.abort(message, timeout)
        self.engine.abort(message, timeout, tell=tell and not told, unsure=unsure)

    def mark_closed(self) -> None:
        if self.local is not None:
            self.local.mark_closed()
        self.engine.mark_closed()

    def close(self) -> None:
        rails, self._rails = list(self._rails.values()), {}
        try:
            for t in rails:
                t.close()
        finally:
            if self.local is not None:
                self.local.close()
            self.engine.close()

    # --- the engine's collectives, and groups --------------------------------------------

    def native_start(self, collective: str, root: int, count: int,
                     bufs: dict[int, np.ndarray], op: Any, what: Callable[[], str],
                     dtype: Any = None) -> NativeCall:
        return self.engine.native_start(collective, root, count, bufs, op, what, dtype)

    def rail(self, g: int) -> Transport:
        """The engine's group of this rank's rail for groups of ``g`` consecutive ranks
        (local rank ``rank % g`` of every group: ranks ``rank % g``, ``+ g``, ...), for
        a two-level schedule's inter-node phase (:mod:`ringlet.rails`).  Built on first
        use, collectively over the rail's ranks (every rank of a two-level call asks for
        its own).  Its waits also watch this whole communicator: a rank that aborts
        anywhere, or dies on this node, ends them."""
        t = self._rails.get(g)
        if t is None:
            ranks = list(range(self.rank % g, self.size, g))
            t = self.engine.split(ranks, f"rail{g}.{self.rank % g}")
            t.watch_also = self.check
            self._rails[g] = t
        return t

    def split(self, ranks: Sequence[int], token: str,
              remote: Sequence[int] | None = None) -> Transport:
        """The group ``ranks``: shared memory among its members on this node, the engine
        (a group of the engine's) among all its members."""
        ranks = list(ranks)
        me = self.node_of[self.rank]
        here = [r for r in ranks if self.node_of[r] == me]
        local = self.local.split([self.lidx[r] for r in here], token) \
            if self.local is not None and len(here) > 1 else None
        if len(here) == len(ranks):   # the whole group is on this node
            if local is not None:
                local.names = list(range(len(ranks)))
                return local
        far = [i for i, r in enumerate(ranks) if self.node_of[r] != me]
        engine = self.engine.split(ranks, token, remote=far)
        if len(here) == len(ranks):
            return engine   # a group of one rank
        return RoutedTransport(ranks.index(self.rank), [self.node_of[r] for r in ranks], local,
                               engine)
