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

**The two-level agreement** (on the torch engine).  Where every node has the
same number of ranks, a call's descriptors do not cross the network
all-to-all.  A rank publishes
its descriptor in shared memory; once it has every descriptor of its node, it
sends its node's verdict (the descriptor they all published, or that they did
not) to its rail peers only: the ranks with its local index on the other
nodes.  Every rank of a node reaches the same verdict, so each rank hears
every node's from its rail peer there, and knows each rank's descriptor when
its node agreed: one frame per node per rank instead of one per rank (the
torch engine's agreement took 2.1 ms a call all-to-all on 2 x 2 ranks, its
rail pairs 1.2 ms).  A rank whose node did not agree (a mismatch, or a rank
that rejected its call) sends its own descriptor to every rank on other nodes,
as does a rank still waiting after :data:`FALLBACK_S` (a rank late or dead
somewhere): so a mismatch's message quotes every rank, and a timeout names
the ranks that did not arrive and where the others are, as on one host.
The MPI engine keeps the all-to-all agreement, sent as each call starts: that
late send could go to a rank that died meanwhile, and a send to a dead rank
can crash MPICH (SIGSEGV in ``MPI_Isend``, seen on the network-namespace bed
with ``tests/scripts/netns_dead_rank.py``); MPI's agreement is cheap anyway
(a polled engine: 0.4-1 ms a barrier on the bed, where torch's lane threads
take 2-3 ms).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..config import Settings
from ..wait import Waiter
from .base import COLL, OTHER, P2P, READ_ONLY, Caps, NativeCall, Reducer, Request, Transport
from .shm import ShmTransport

#: seconds a rank waits in a two-level agreement before it also sends its descriptor to every
#: rank on other nodes (at most a quarter of the timeout)
FALLBACK_S = 1.0


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
            # the engine's own waits (its requests alone, its native collectives) also
            # watch this node: over MPI a dead rank and a late one look the same, but
            # shared memory knows a node peer died, or that one aborted
            engine.watch_also = self._watch_node
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
        # the two-level agreement (see the module's docs): my rail's rank on every other node
        nodes: dict[int, list[int]] = {}
        for q, n in enumerate(self.node_of):
            nodes.setdefault(n, []).append(q)
        at = self.locals.index(rank)
        self._rail_of: dict[int, int] | None = \
            {n: qs[at] for n, qs in nodes.items() if n != me} \
            if len({len(qs) for qs in nodes.values()}) == 1 and engine.caps.engine == "torch" \
            else None   # MPI: see the module's docs
        self._rail_peers = sorted((self._rail_of or {}).values())
        self._call: tuple[int, tuple[int, ...], str | None] | None = None
        self._told = self._spread = False
        self._since = 0.0
        self._fallback_s = min(FALLBACK_S, self.settings.timeout / 4)

    def _set_describe(self, fn: Callable[[], str]) -> None:
        self._describe = fn
        self.engine.describe = fn
        if self.local is not None:
            self.local.describe = fn

    describe = property(lambda self: self._describe, _set_describe)
    _describe: Callable[[], str] = staticmethod(lambda: "a collective")

    def _set_calls(self, fn: Callable[[], tuple[int, int]]) -> None:
        self._calls = fn
        for t in (self.engine, self.local, *self._rails.values()):
            if t is not None:
                t.calls = fn

    calls = property(lambda self: self._calls, _set_calls)
    _calls: Callable[[], tuple[int, int]] = staticmethod(lambda: (0, 0))

    # --- messages ---------------------------------------------------------------------

    def isend(self, peer: int, parts: Sequence[np.ndarray], channel: int = COLL) -> Request:
        i = self.lidx.get(peer)
        if i is None:
            if channel == P2P and self.local is not None:
                # the node heard of a failure: nothing more to other nodes (as the engine
                # refuses once it heard; a send to a dead rank can crash MPICH)
                err = self.local.aborted()
                if err is not None:
                    raise type(err)(str(err))
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
        if self._in_background(waiter):
            return
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

    def publish(self, seq: int, words: Sequence[int], note: str | None = None,
                to: Sequence[int] | None = None) -> None:
        if self.local is not None:
            self.local.publish(seq, words, note)
        if self._rail_of is None:
            self.engine.publish(seq, words, note)
            return
        self._call = (seq, tuple(words), note)
        self._told = self._spread = False
        self._since = time.monotonic()
        if note is not None:   # rejected: every peer quotes its note, as on one host
            self._spread_out()
        self._advance()

    def _advance(self) -> None:
        """The two-level agreement's next step: tell the rail peers the node's verdict once
        every descriptor of the node is in; send this rank's own to every rank on other
        nodes if the node did not agree, or after :data:`FALLBACK_S`."""
        call = self._call
        if call is None or self._told and self._spread or READ_ONLY.depth:
            return
        seq, words, note = call
        if not self._told:
            here = [] if self.local is None else \
                [self.local.peer_desc(self.lidx[q], seq) for q in self.locals if q != self.rank]
            if all(d is not None for d in here):
                agrees = note is None and all(d == words for d in here)
                self.engine.tell_node(seq, words if agrees else None, self._rail_peers)
                self._told = True
                if not agrees:
                    self._spread_out()
        if not self._spread and time.monotonic() - self._since > self._fallback_s:
            self._spread_out()

    def _spread_out(self) -> None:
        seq, words, note = self._call  # type: ignore[misc]
        self.engine.publish(seq, words, note, self.remote)
        self._spread = True

    def peer_desc(self, q: int, seq: int) -> tuple[int, ...] | None:
        i = self.lidx.get(q)
        if i is not None:
            d = self.local.peer_desc(i, seq)  # type: ignore[union-attr]
        else:
            d = self.engine.peer_desc(q, seq)
            if d is None and self._rail_of is not None:
                d = self.engine.node_desc(self._rail_of[self.node_of[q]], seq) or None
        # after the read: once the caller has seen its node's last descriptor, the verdict
        # is out (a caller that has every rank's moves on to its next call)
        if self._call is not None and self._call[0] == seq:
            self._advance()
        return d

    def note(self, q: int, seq: int) -> str:
        i = self.lidx.get(q)
        return self.engine.note(q, seq) if i is None else \
            self.local.note(i, seq)  # type: ignore[union-attr]

    def latest_desc(self, q: int) -> tuple[int, tuple[int, ...]] | None:
        i = self.lidx.get(q)
        if i is not None:
            return self.local.latest_desc(i)  # type: ignore[union-attr]
        own = self.engine.latest_desc(q)
        if self._rail_of is None:
            return own
        node = self.engine.latest_node(self._rail_of[self.node_of[q]])
        return node if own is None or node is not None and node[0] > own[0] else own

    # --- liveness ---------------------------------------------------------------------

    def _watch_node(self, watch: Sequence[int] | None, what: str | None) -> None:
        """The engine's ``watch_also``: the node's abort mailbox, and inside a collective
        every node peer (between collectives a dead node peer is none of a point-to-point
        wait's business; that wait watches its own peer)."""
        self.local.check(None if self._calls()[0] else [], what)  # type: ignore[union-attr]

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

    def sees_death(self, q: int) -> bool:
        return q in self.lidx or self.engine.sees_death(q)

    def mark_closed(self) -> None:
        told = None if self.local is None else self.local.aborted()
        if self.local is not None:
            self.local.mark_closed()
        if told is not None:   # the node heard of a failure: the engine says nothing more
            self.engine.abort(str(told), tell=False)
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

    def native_refusal(self, collective: str, op: Any, dtype: Any) -> str | None:
        return self.engine.native_refusal(collective, op, dtype)

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
            t = self.engine.split(ranks, f"rail{g}.{self.rank % g}", names=ranks,
                                  watch=self.check)
            t.watch_also = self.check
            t.calls = self._calls
            self._rails[g] = t
        return t

    def split(self, ranks: Sequence[int], token: str,
              remote: Sequence[int] | None = None, *, names: Sequence[int] | None = None,
              watch: Callable[[], None] | None = None) -> Transport:
        """The group ``ranks``: shared memory among its members on this node, the engine
        (a group of the engine's) among all its members (``names`` and ``watch`` as in
        :meth:`Transport.split`)."""
        ranks = list(ranks)
        watch = self.check if watch is None else watch   # the node's ranks too
        me = self.node_of[self.rank]
        here = [r for r in ranks if self.node_of[r] == me]
        local = self.local.split([self.lidx[r] for r in here], token, watch=watch) \
            if self.local is not None and len(here) > 1 else None
        if len(here) == len(ranks):   # the whole group is on this node
            if local is not None:
                local.names = list(range(len(ranks)))
                return local
        far = [i for i, r in enumerate(ranks) if self.node_of[r] != me]
        try:
            engine = self.engine.split(ranks, token, remote=far, names=names, watch=watch)
        except BaseException:
            if local is not None:
                local.close()
            raise
        if len(here) == len(ranks):
            return engine   # a group of one rank
        return RoutedTransport(ranks.index(self.rank), [self.node_of[r] for r in ranks], local,
                               engine)
