"""The transport seam: what the Communicator, the executor and p2p need from a transport.

A transport moves bytes between the ranks of one communicator.  Three
implement :class:`Transport`:

- :class:`~ringlet.transport.shm.ShmTransport`: shared memory, every rank on
  one host (the default; it also has the fused paths and shared buffers);
- the engine transports, :mod:`ringlet.transport.mpi` (mpi4py) and
  :mod:`ringlet.transport.torch` (torch.distributed with gloo), which carry
  ringlet between hosts on an existing engine;
- :class:`~ringlet.transport.routed.RoutedTransport`: shared memory to the
  peers on this rank's node, the engine to the others.

The interface
-------------
*Messages.*  ``isend(peer, parts, channel)`` and ``irecv(peer, parts,
reducer, channel)`` start a message and return a :class:`Request`.  Messages
between two ranks on one channel arrive in the order they were sent (FIFO per
ordered pair and channel), and a receive must expect exactly the bytes the
matching send sends.  ``parts`` of a send are uint8 views; of a receive,
typed views that the message fills in order, copied or, with ``reducer``,
reduced on arrival (``reducer(dst, src)`` computes ``dst = dst (op) src``).
A message of zero bytes is never sent: both requests are done at once.
Collective requests (channel :data:`COLL`) are moved by ``progress()``;
requests on other channels are moved by their owner with
:meth:`Request.advance` (the p2p engine matches user messages itself).
``wait(reqs, what)`` progresses until the requests are done, within the
deadline, checking liveness as it goes.

*Agreement.*  Before any data of call ``seq`` moves, every rank publishes a
descriptor (``publish(seq, words, note)``: 15 words, see
:class:`ringlet.agreement.Desc`, and, for a call the rank rejected, why) and
reads every peer's (``peer_desc(q, seq)``, ``note(q, seq)``).  A rank
publishes call s+1 only after every peer has published call s (the
communicator waits for that), so a transport needs to keep only the last
two calls of each peer.  ``latest_desc(q)`` says where a peer is, for
timeout messages.

*Liveness.*  ``check(watch, what)`` raises if a peer aborted the
communicator, closed it, or died; ``abort(message)`` makes every peer's next
``check`` raise; ``mark_closed()`` tells the peers this rank makes no more
calls.

*Groups.*  ``split(ranks, token, remote)`` is called by the members of a new group
(``ranks``, this transport's ranks in the group's order, all calling with the
same ``token``) and returns the group's transport.

*Capabilities* (:class:`Caps`) say what more a transport can do: the fused
shared-memory paths, buffers that every rank maps (``comm.empty``), and the
engine's own collectives.

:class:`MessageAgreement` and :class:`StatusBoard` implement agreement and
liveness with messages, for transports that have nothing better (the
engines); shared memory publishes descriptors in place instead.
"""

from __future__ import annotations

import contextlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ..config import Settings
from ..errors import CommTimeoutError, ConfigError, PeerError, RingletError, relayed
from ..wait import Waiter

#: channels: collective data, the user's point-to-point messages, agreement frames and
#: status frames (abort, closed).  They never mix.
COLL, P2P, CTRL, STATUS = 0, 1, 2, 3


class _ReadOnly(threading.local):
    depth = 0


#: inside :func:`read_only` (per thread): transports report what they already know
READ_ONLY = _ReadOnly()


@contextlib.contextmanager
def read_only() -> Iterator[None]:
    """Within it, asking a transport what it knows (a peer's descriptor, whether a request
    is done) polls, posts and delivers nothing.  A flight recorder dump runs in a signal
    handler, which may have interrupted this very thread in the middle of a poll or of
    posting a message: doing either again there took a lock the thread already held (the
    rank hung for good) or handled one frame twice."""
    READ_ONLY.depth += 1
    try:
        yield
    finally:
        READ_ONLY.depth -= 1
#: what Transport.take_message found
TAKEN, EMPTY, OTHER = 1, 0, -1

#: words of a descriptor as published (see ringlet.agreement.Desc)
DESC_WORDS = 15
#: bytes of a note (why a rank rejected a call) carried with a descriptor
NOTE_BYTES = 1024

Reducer = Callable[[np.ndarray, np.ndarray], None]

#: an engine transport (MPI, torch) sends a message of more than this many bytes as
#: several engine messages (pieces), so that the receiver reduces one piece while the
#: next is on the wire.  A multiple of 64: a piece never splits an element.
PIECE_BYTES = 4 << 20


def deliver(parts: Sequence[np.ndarray], buf: np.ndarray, pos: int, upto: int,
            reducer: Reducer | None) -> int:
    """Copy (or reduce, with ``reducer(dst, src)``) the whole elements of bytes
    ``buf[pos:upto]`` into ``parts``, laid end to end in ``buf``; returns the byte up to
    which everything is delivered (an element that ``upto`` cuts waits for the next
    call).  How an engine transport hands over a message that arrives in pieces."""
    off = 0
    for p in parts:
        end = off + p.nbytes
        if pos >= upto:
            break
        if end > pos:
            isz = p.itemsize
            lo, hi = (pos - off) // isz, (min(end, upto) - off) // isz
            if hi > lo:
                dst = p.reshape(-1)[lo:hi]
                src = buf[off + lo * isz:off + hi * isz].view(p.dtype)
                if reducer is None:
                    dst[...] = src
                else:
                    reducer(dst, src)
                pos = off + hi * isz
            if pos < end:
                break           # the rest of this part has not arrived
        off = end
    return pos


def pieces(nbytes: int, size: int = PIECE_BYTES) -> list[tuple[int, int]]:
    """The byte ranges a message of ``nbytes`` travels as (none for an empty one); both
    sides compute the same ranges from the size."""
    return [(lo, min(lo + size, nbytes)) for lo in range(0, nbytes, size)]


#: engine operations that failed or timed out while in flight: an engine's collective or
#: message cannot be cancelled, so it (and the buffers it writes) is kept for the life of
#: the process; the communicator is aborted
ABANDONED: list[Any] = []


class NativeCall:
    """An engine's own collective in flight (:meth:`Transport.native_start`).

    :meth:`wait` finishes it within the deadline (once; later calls return at
    once); :meth:`abandon`, after an error elsewhere, keeps the operation and its
    buffers alive in :data:`ABANDONED` instead of waiting for it."""

    __slots__ = ("_finish", "_keep")

    def __init__(self, finish: Callable[[], None] | None, keep: Any = None) -> None:
        self._finish, self._keep = finish, keep

    def wait(self) -> None:
        finish, self._finish = self._finish, None
        if finish is not None:
            try:
                finish()
            except BaseException:
                ABANDONED.append(self._keep)
                raise

    def abandon(self) -> None:
        if self._finish is not None:
            self._finish = None
            ABANDONED.append(self._keep)


#: what the ranks a collective's round still waits for did not do (every rank agreed to
#: the call first: "did not arrive" said the opposite, of a rank on another node that
#: had arrived and then given up)
ROUND_ABSENT = "agreed to the call but did not send or take this round's data"

#: the point-to-point engines of this process with messages in flight: each one's
#: ``background()`` advances its sends and receives, True if a byte moved (see
#: :class:`ringlet.p2p.P2PEngine`, which adds and removes itself).  Every wait's
#: :meth:`Transport.idle`, of every communicator, calls them first, so that an ``isend``
#: left in flight completes while its rank waits in a collective, of this communicator
#: or of another (a split's), as MPI's progress rule has it, per process (a message
#: larger than the channel stopped once the channel was full: the receiver waited in
#: ``recv``, the sender in the next collective)
BACKGROUND: set[Callable[[], bool]] = set()


class Request(Protocol):
    """One message being sent or received."""

    peer: int

    @property
    def done(self) -> bool: ...

    def advance(self) -> bool:
        """Move what can be moved now; True if any byte moved."""
        ...


@dataclass(frozen=True)
class Caps:
    """What a transport can do besides messages."""

    #: the fused shared-memory paths (oneshot, staged direct): every rank on one host
    fused: bool = False
    #: buffers every rank maps (comm.empty gives zero-copy collectives)
    shared_buffers: bool = False
    #: the engine under the transport ("mpi", "torch"), None for shared memory only
    engine: str | None = None
    #: the collectives the engine's own implementation can run (algorithm "native")
    native: frozenset[str] = frozenset()
    #: ranks on several nodes, with the engine's groups per rail (:meth:`Transport.rail`)
    rails: bool = False


class Transport(ABC):
    """Moves bytes between the ranks of one communicator (see the module documentation)."""

    rank: int
    size: int
    #: the settings every wait of this communicator uses
    settings: Settings
    caps: Caps = Caps()
    #: the call in progress, described for messages (set by the communicator)
    describe: Callable[[], str] = staticmethod(lambda: "a collective")
    #: ``check(None, what)`` of a transport this one serves (a routed transport's rail
    #: group: :meth:`RoutedTransport.rail`), called by this one's ``check``
    watch_also: Callable[[Sequence[int] | None, str | None], None] | None = None
    #: ``(now, done)``: the sequence number of the collective this rank is in (0 between
    #: collectives) and how many calls it has finished (set by the communicator).  A
    #: closed notice carries ``done``: see :meth:`closed_error`
    calls: Callable[[], tuple[int, int]] = staticmethod(lambda: (0, 0))

    def closed_error(self, name: int, done: int, what: str | None) -> PeerError | None:
        """The error for peer ``name``, which closed the communicator after finishing
        ``done`` calls, while this rank waits in ``what``; None if that peer had finished
        the collective this rank is in: then its closing is no error (what it sent this
        rank is on its way; gloo's ring all_reduce ends on one rank before another) and
        the wait goes on under its deadline.  Between collectives (a point-to-point
        wait) a closed peer is always one."""
        now = self.calls()[0]
        if 0 < now <= done:
            return None
        err = PeerError(
            f"rank {name} closed the communicator (or its program ended) while "
            f"{what or self.describe()} waited for it: every rank must make the same calls")
        err.peer_closed = True  # type: ignore[attr-defined]  # not dead: see p2p.check_any
        return err

    # --- messages ---------------------------------------------------------------------

    @abstractmethod
    def isend(self, peer: int, parts: Sequence[np.ndarray], channel: int = COLL) -> Request:
        """Start sending ``parts`` (uint8 views) to ``peer``."""

    @abstractmethod
    def irecv(self, peer: int, parts: Sequence[np.ndarray], reducer: Reducer | None = None,
              channel: int = COLL) -> Request:
        """Start receiving from ``peer`` into ``parts`` (typed views), copying or reducing."""

    @abstractmethod
    def progress(self) -> bool:
        """Advance every pending collective request; True if any byte moved."""

    def wait(self, reqs: Sequence[Request], what: Callable[[], str]) -> None:
        """Progress until every request in ``reqs`` is done, within the deadline,
        checking the peers still missing (a transport may refine this)."""
        if all(r.done for r in reqs):
            return

        def missing() -> list[int]:
            return [r.peer for r in reqs if not r.done]

        waiter = Waiter(self.wait_settings(reqs), what, missing,
                        lambda: self.check(missing()), absent=ROUND_ABSENT)
        while True:
            seen = self.events()
            if self.progress():
                waiter.moved()
            else:
                if all(r.done for r in reqs):
                    return
                self.idle(seen, waiter)

    def events(self) -> int:
        """A counter of the completions this transport was told of (by an engine's
        threads), for :meth:`idle`; 0 where nothing tells (the caller polls)."""
        return 0

    def _in_background(self, waiter: Waiter) -> bool:
        """Advance the point-to-point messages in flight (:data:`BACKGROUND`); True (and
        the waiter's checks made) if a byte moved, so the caller polls again instead of
        pausing."""
        if not BACKGROUND:
            return False
        moved = False
        for fn in list(BACKGROUND):
            moved |= fn()
        if not moved:
            return False
        waiter.moved()
        waiter.tick()
        return True

    def idle(self, seen: int, waiter: Waiter,
             peers: Callable[[], Sequence[int] | None] | None = None) -> None:
        """A poll found nothing to do: pause until something may have moved.

        ``seen`` is what :meth:`events` returned before the poll; ``peers``
        gives the peers whose messages the caller waits for (None: any rank;
        called only by a transport that needs to know).  By default
        the waiter spins, yields or sleeps (shared memory and MPI are polled);
        an engine whose completions are reported by threads (torch's gloo)
        naps until the next report instead (briefly: then the waiter checks the
        peers and the deadline), unless one came since ``seen``.
        Every wait loop of the communicator, the executor and p2p idles here,
        so the waits of such an engine never sleep past a completion."""
        if not self._in_background(waiter):
            waiter.pause()

    def push_message(self, peer: int, fmt: tuple[int, int, int, int], tag: int, code: int,
                     payload: np.ndarray) -> bool:
        """Put a whole point-to-point message on the P2P channel to ``peer`` at once (a
        compiled path), as :mod:`ringlet.p2p` would send it: its frame (``fmt``: bytes,
        header bytes, magic, inline flag), then the payload unless it is inline.  False:
        not done (no room for all of it, or no such path here): the caller sends it as
        usual."""
        return False

    def take_message(self, peer: int, fmt: tuple[int, int, int, int], tag: int, code: int,
                     out: np.ndarray, spin_s: float) -> int:
        """Take the message at the head of the P2P channel from ``peer`` into ``out`` (a
        compiled path), if it has ``tag`` (-1: any), fits ``out`` exactly and has arrived
        whole: TAKEN; EMPTY: none arrived within ``spin_s``; OTHER: any other message is
        there, or not all of it, or no such path here (nothing taken: the caller takes it
        in as usual)."""
        return OTHER

    def wait_settings(self, reqs: Sequence[Request]) -> Settings:
        """How :meth:`wait` waits for ``reqs`` (spin, yield, sleep): ``settings``."""
        return self.settings

    @abstractmethod
    def discard_pending(self) -> None:
        """Forget pending collective requests (the communicator is being aborted)."""

    # --- agreement ----------------------------------------------------------------------

    @abstractmethod
    def publish(self, seq: int, words: Sequence[int], note: str | None = None,
                to: Sequence[int] | None = None) -> None:
        """Publish this rank's descriptor of call ``seq``; ``note`` is given exactly when
        this rank rejected its call, and says why.  An engine that sends descriptors as
        frames sends them to ``to`` (None: every peer it agrees with)."""

    def tell_node(self, seq: int, words: Sequence[int] | None, to: Sequence[int]) -> None:
        """Send ``to`` these peers this rank's node's verdict on call ``seq`` (engines that
        send frames; :meth:`MessageAgreement.tell_node`)."""
        raise NotImplementedError(f"{type(self).__name__} sends no node verdicts")

    def node_desc(self, q: int, seq: int) -> tuple[int, ...] | None:
        """Peer ``q``'s node's verdict on call ``seq`` (:meth:`MessageAgreement.node_desc`)."""
        raise NotImplementedError(f"{type(self).__name__} receives no node verdicts")

    def latest_node(self, q: int) -> tuple[int, tuple[int, ...]] | None:
        """The last call peer ``q``'s node agreed on (:meth:`MessageAgreement.latest_node`)."""
        raise NotImplementedError(f"{type(self).__name__} receives no node verdicts")

    @abstractmethod
    def peer_desc(self, q: int, seq: int) -> tuple[int, ...] | None:
        """Rank q's descriptor of call ``seq``, or None if it has not arrived."""

    @abstractmethod
    def note(self, q: int, seq: int) -> str:
        """Why rank q rejected call ``seq`` ("" if it gave no reason)."""

    @abstractmethod
    def latest_desc(self, q: int) -> tuple[int, tuple[int, ...]] | None:
        """(seq, descriptor) of the last call rank q is known to have entered."""

    # --- liveness ---------------------------------------------------------------------

    @abstractmethod
    def check(self, watch: Sequence[int] | None = None, what: str | None = None) -> None:
        """Raise if a peer aborted the communicator, or a watched peer closed or died."""

    @abstractmethod
    def abort(self, message: str, timeout: bool = False, tell: bool = True,
              unsure: bool = False) -> None:
        """Make every peer fail with ``message`` (CommTimeoutError if ``timeout``).
        ``tell`` False: this rank was told already (by a transport it serves beside,
        e.g. its node's shared memory) and only marks the communicator failed.
        ``unsure``: whether the peers are alive is in doubt (this rank timed out: one
        of them may be dead); an engine that cannot send to a dead rank safely then
        tells nobody (see MpiTransport)."""

    def sees_death(self, q: int) -> bool:
        """Whether :meth:`check` raises once peer ``q`` died (shared memory reads its pid,
        the torch engine its heartbeat); False where a dead peer and a late one look the
        same (the MPI engine, unless MPI reports an error)."""
        return True

    @abstractmethod
    def mark_closed(self) -> None:
        """Tell the peers this rank closed the communicator, and how many calls it had
        finished (``calls()[1]``)."""

    @abstractmethod
    def close(self) -> None:
        """Release everything (idempotent)."""

    # --- the engine's own collectives ---------------------------------------------------

    def native(self, collective: str, root: int, count: int, bufs: dict[int, np.ndarray],
               op: Any, what: Callable[[], str], dtype: Any = None) -> None:
        """Run ``collective`` with the engine's own implementation (``caps.native``).

        ``bufs`` are the flat typed buffers the executor would get (keys
        ``int(Buf.IN)``, ``int(Buf.OUT)``; all_reduce and broadcast work in place
        on OUT), ``count`` the elements per rank (per block for reduce_scatter,
        all_to_all, scatter), ``op`` a :class:`ringlet.ReduceOp` (never AVG: the
        communicator divides) or None, ``dtype`` ringlet's element type (a
        :class:`ringlet.ops.DType`: bfloat16 is stored as int16).  Waits within
        the deadline.
        """
        self.native_start(collective, root, count, bufs, op, what, dtype).wait()

    def native_refusal(self, collective: str, op: Any, dtype: Any) -> str | None:
        """Why the engine's own ``collective`` cannot reduce with ``op`` (a
        :class:`ringlet.ReduceOp`, never AVG) on elements of ``dtype`` (a
        :class:`ringlet.ops.DType`) as ringlet defines it, or None: the communicator
        asks before a native call, so that every rank refuses it as a bad argument
        before the call starts.  None by default (an engine that can run every
        reduction)."""
        return None

    def native_start(self, collective: str, root: int, count: int,
                     bufs: dict[int, np.ndarray], op: Any, what: Callable[[], str],
                     dtype: Any = None) -> NativeCall:
        """Start :meth:`native`'s collective and return it in flight: the caller may run
        other steps (not on this transport's engine) before its ``wait()``.  Every rank
        starts its native collectives in the same order.  The buffers must stay
        untouched until then."""
        raise ConfigError(f"this transport has no native collectives ({collective})")

    # --- groups -----------------------------------------------------------------------

    def rail(self, g: int) -> Transport:
        """The engine's group of this rank's rail (``caps.rails``): local rank
        ``rank % g`` of every group of ``g`` consecutive ranks, for a two-level
        schedule's inter-node phase (:mod:`ringlet.rails`)."""
        raise ConfigError("this transport has no nodes, so no rails")

    @abstractmethod
    def split(self, ranks: Sequence[int], token: str,
              remote: Sequence[int] | None = None, *, names: Sequence[int] | None = None,
              watch: Callable[[], None] | None = None) -> Transport:
        """The transport of the group ``ranks`` (called by its members only).

        ``remote``: for an engine transport under a routed one, the group's
        ranks (numbered in the group) that the new transport's agreement and
        status frames cover, as ``remote=`` of its constructor; default all
        other members.  ``names``: the ranks the new transport's messages name
        (default its own numbering; a rail group's are its communicator's ranks).
        ``watch``: raises if a peer failed, called while the members gather under
        the deadline before the engine builds the group (gloo's constructor and
        ``MPI_Comm_create_group`` wait without one)."""


# --- agreement and status by messages ---------------------------------------------------

#: a control frame: seq, the descriptor's words, the note's length, then the note
_FRAME_WORDS = 1 + DESC_WORDS + 1
FRAME_BYTES = _FRAME_WORDS * 8 + NOTE_BYTES
#: a status frame: kind, length, then the text
STATUS_BYTES = 16 + NOTE_BYTES
ABORT_PEER, ABORT_TIMEOUT, ABORT_CONFIG, CLOSED = 1, 2, 3, 4
_ERRORS: dict[int, type[RingletError]] = {ABORT_PEER: PeerError,
                                          ABORT_TIMEOUT: CommTimeoutError,
                                          ABORT_CONFIG: ConfigError}


def _frame(words: Sequence[int], head: int, note: str | None, size: int) -> np.ndarray:
    """A fixed-size frame: ``head``, ``words``, the note's length and the note."""
    buf = np.zeros(size, np.uint8)
    data = (note or "").encode()[:NOTE_BYTES]
    ints = buf[:(len(words) + 2) * 8].view(np.int64)
    ints[0] = head
    ints[1:1 + len(words)] = words
    ints[1 + len(words)] = len(data)
    off = (len(words) + 2) * 8
    buf[off:off + len(data)] = np.frombuffer(data, np.uint8)
    return buf


#: a frame's head: the call's sequence number, and these flags on a node's verdict
#: (:meth:`MessageAgreement.tell_node`)
NODE_FRAME, NODE_AGREES = 1 << 61, 1 << 60


class MessageAgreement:
    """Descriptors exchanged as fixed-size frames on the CTRL channel.

    ``publish`` sends this rank's frame to every peer in ``peers`` (or to those
    given); ``tell_node`` sends a node's verdict on a call (the descriptor all
    its ranks published, or that they did not agree) for the two-level
    agreement of :class:`~ringlet.transport.routed.RoutedTransport`.  A receive
    per peer is always posted, and what arrives is kept (the last two calls
    per peer, of each kind).
    """

    def __init__(self, t: Transport, peers: Sequence[int]) -> None:
        self.t = t
        self.peers = list(peers)
        self._got: dict[int, dict[int, tuple[tuple[int, ...], str]]] = {q: {} for q in peers}
        self._nodes: dict[int, dict[int, tuple[int, ...]]] = {q: {} for q in peers}
        self._latest: dict[int, int] = {}
        self._bufs: dict[int, np.ndarray] = {}
        self._reqs: dict[int, Request] = {}
        self._sends: list[Request] = []
        for q in self.peers:
            self._post(q)

    def _post(self, q: int) -> None:
        buf = np.empty(FRAME_BYTES, np.uint8)
        self._bufs[q] = buf
        self._reqs[q] = self.t.irecv(q, [buf], None, CTRL)

    def publish(self, seq: int, words: Sequence[int], note: str | None,
                to: Sequence[int] | None = None) -> None:
        self._send(_frame(words, seq, note, FRAME_BYTES), self.peers if to is None else to)

    def tell_node(self, seq: int, words: Sequence[int] | None, to: Sequence[int]) -> None:
        """Send ``to`` these peers the descriptor every rank of this rank's node published
        for call ``seq`` (None: they did not all publish the same one)."""
        head = seq | NODE_FRAME | (NODE_AGREES if words is not None else 0)
        self._send(_frame(words if words is not None else (), head, None, FRAME_BYTES), to)

    def _send(self, frame: np.ndarray, to: Sequence[int]) -> None:
        self._sends = [r for r in self._sends if not r.advance() and not r.done]
        for q in to:
            r = self.t.isend(q, [frame], CTRL)
            r.advance()
            if not r.done:
                self._sends.append(r)

    def poll(self) -> bool:
        """Take in every frame that has arrived; True if any did (nothing is taken in
        :func:`read_only`)."""
        if READ_ONLY.depth:
            return False
        got = False
        for r in self._sends:
            r.advance()
        self._sends = [r for r in self._sends if not r.done]
        for q in self.peers:
            while True:
                r = self._reqs[q]
                r.advance()
                if not r.done:
                    break
                buf = self._bufs[q]
                ints = buf[:_FRAME_WORDS * 8].view(np.int64)
                head = int(ints[0])
                seq = head & (NODE_AGREES - 1)
                words = tuple(int(w) for w in ints[1:1 + DESC_WORDS])
                if head & NODE_FRAME:
                    nodes = self._nodes[q]
                    nodes[seq] = words if head & NODE_AGREES else ()
                    for old in [s for s in nodes if s < seq - 1]:
                        del nodes[old]
                else:
                    n = int(ints[_FRAME_WORDS - 1])
                    note = bytes(buf[_FRAME_WORDS * 8:_FRAME_WORDS * 8 + n]).decode(
                        errors="replace")
                    calls = self._got[q]
                    calls[seq] = (words, note)
                    for old in [s for s in calls if s < seq - 1]:
                        del calls[old]
                    self._latest[q] = max(self._latest.get(q, 0), seq)
                self._post(q)
                got = True
        return got

    def peer_desc(self, q: int, seq: int) -> tuple[int, ...] | None:
        hit = self._got[q].get(seq)
        if hit is None:
            self.poll()
            hit = self._got[q].get(seq)
        return None if hit is None else hit[0]

    def node_desc(self, q: int, seq: int) -> tuple[int, ...] | None:
        """The verdict of peer ``q``'s node on call ``seq``: the descriptor all its ranks
        published, ``()`` if they did not agree, None if it has not arrived."""
        hit = self._nodes[q].get(seq)
        if hit is None:
            self.poll()
            hit = self._nodes[q].get(seq)
        return hit

    def note(self, q: int, seq: int) -> str:
        hit = self._got[q].get(seq)
        return "" if hit is None else hit[1]

    def latest(self, q: int) -> tuple[int, tuple[int, ...]] | None:
        """Peer ``q``'s last published call, by its own frame or its node's verdict (the
        two-level agreement: ``q`` is then a rank of that node; see the routed transport's
        :meth:`~ringlet.transport.routed.RoutedTransport.latest_desc`)."""
        self.poll()
        s = self._latest.get(q)
        return None if s is None else (s, self._got[q][s][0])

    def latest_node(self, q: int) -> tuple[int, tuple[int, ...]] | None:
        """The last call peer ``q``'s node agreed on, and its descriptor."""
        self.poll()
        agreed = [s for s, w in self._nodes[q].items() if w]
        return None if not agreed else (max(agreed), self._nodes[q][max(agreed)])

    def pending_sends(self) -> bool:
        self.poll()
        return bool(self._sends)


class StatusBoard:
    """Abort and closed notices exchanged as frames on the STATUS channel.  A closed
    notice's text is the number of calls its rank finished (``closed[q]``)."""

    def __init__(self, t: Transport, peers: Sequence[int]) -> None:
        self.t = t
        self.peers = list(peers)
        self.error: RingletError | None = None
        self.closed: dict[int, int] = {}
        self._bufs: dict[int, np.ndarray] = {}
        self._reqs: dict[int, Request] = {}
        self._sends: list[Request] = []
        self._said = False
        for q in self.peers:
            self._post(q)

    def _post(self, q: int) -> None:
        buf = np.empty(STATUS_BYTES, np.uint8)
        self._bufs[q] = buf
        self._reqs[q] = self.t.irecv(q, [buf], None, STATUS)

    def tell(self, kind: int, text: str) -> None:
        """Send a notice to every peer (once: an abort or a close is final)."""
        if self._said:
            return
        self._said = True
        frame = _frame([], kind, text, STATUS_BYTES)
        for q in self.peers:
            if q in self.closed:
                continue
            r = self.t.isend(q, [frame], STATUS)
            r.advance()
            self._sends.append(r)

    def poll(self) -> None:
        for r in self._sends:
            r.advance()
        self._sends = [r for r in self._sends if not r.done]
        for q in self.peers:
            if q in self.closed:
                continue
            r = self._reqs[q]
            r.advance()
            if not r.done:
                continue
            buf = self._bufs[q]
            kind, n = (int(v) for v in buf[:16].view(np.int64))
            text = bytes(buf[16:16 + n]).decode(errors="replace")
            if kind == CLOSED:
                self.closed[q] = int(text) if text.isdigit() else 0
            elif self.error is None:
                self.error = relayed(_ERRORS.get(kind, PeerError)(text))

    def flush(self, seconds: float) -> None:
        """Give notices in flight up to ``seconds`` to leave (best effort, at close)."""
        import time

        end = time.monotonic() + seconds
        while self._sends and time.monotonic() < end:
            self.poll()
            time.sleep(0.001)

