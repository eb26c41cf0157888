"""User point-to-point messages (send, recv, isend, irecv) on their own channels."""

from __future__ import annotations

import functools
import itertools
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, overload

import numpy as np

from . import recorder
from .buffers import Buffer, as_buffer
from .errors import ArgumentError, CommTimeoutError, PeerError, RingletError, relayed
from .ops import dtype_of_code
from .recorder import RECV, SEND, T_END, T_START, now_ns
from .transport.base import BACKGROUND, EMPTY, P2P, TAKEN, Request, Transport
from .wait import Waiter
from .work import Work

if TYPE_CHECKING:
    from .comm import Communicator

_P2P_MAGIC = 0x50325031
#: a message's header: 8 words (magic, tag, bytes, dtype code, flags, 3 spare), then up to
#: INLINE_BYTES of payload in the same transport message
_HEAD_BYTES = 64
#: payloads up to this size travel inside the header: one transport message instead of
#: two, and no wait for the receiver to post the payload's receive (an engine whose sends
#: are rendezvous, gloo, finishes a send only then)
INLINE_BYTES = 192
_FRAME_BYTES = _HEAD_BYTES + INLINE_BYTES
_INLINE = 1
#: the frame as a transport's compiled path writes and reads it (Transport.push_message)
_FMT = (_FRAME_BYTES, _HEAD_BYTES, _P2P_MAGIC, _INLINE)
#: a failure's text that names the rank it happened on (relayed; see P2PEngine._abort)
_NAMED = re.compile(r"rank \d+(: | failed in | was interrupted )")
#: ``src`` of a receive (or probe) that takes a message from any rank, as MPI_ANY_SOURCE
ANY_SOURCE = -1
#: ``tag`` of a receive (or probe) that takes a message with any tag, as MPI_ANY_TAG
ANY_TAG = -1


@dataclass(frozen=True)
class Status:
    """What :meth:`Communicator.probe` found (and a receive got): who sent, with which
    tag, how many bytes of which element type."""

    source: int
    tag: int
    nbytes: int
    dtype: str
    #: bytes of one element (pair types' too), 0 if the type is not known
    itemsize: int = field(default=0, repr=False, compare=False)
    #: the element type's dtype code (:func:`ringlet.ops.dtype_of_code`), -1 if unknown
    code: int = field(default=-1, repr=False, compare=False)

    @property
    def count(self) -> int:
        """Elements of the message (in its own element type)."""
        return self.nbytes // self.itemsize if self.itemsize else self.nbytes

    def empty(self) -> Any:
        """A buffer of ``count`` elements that a receive of this message takes: a numpy
        array of its type (a structured one for (value, index) pairs, as
        :func:`ringlet.pairs` makes), a torch tensor for bfloat16 (numpy has no such
        type; torch is imported for it).  ``np.empty(st.count, st.dtype)`` does the
        same for numpy's own types only."""
        d = dtype_of_code(self.code)
        if d is None:
            raise ArgumentError(f"the message's element type ({self.dtype}) is not one this "
                                f"process can make a buffer of")
        if d.name == "bfloat16":
            import torch

            return torch.empty(self.count, dtype=torch.bfloat16)
        return np.empty(self.count, d.np_dtype)


class P2PEngine:
    """User point-to-point messages, on channels of their own (never mixed with collectives).

    A message is a 256-byte frame, a 64-byte header (magic, tag, bytes,
    dtype, flags) and, for a payload of up to :data:`INLINE_BYTES`, the
    payload itself; a larger payload follows as a second message.  Both
    travel on the transport's P2P channel.  One header receive per
    source is posted at a time, and the next only once the payload before it
    has been taken in (an engine matches receives in the order they were
    posted).  Receives match messages from a source in order by tag; a message
    that arrives before its receive is posted is kept aside (unexpected queue).
    A receive from ANY_SOURCE waits in a queue of its own; a message that can
    go to several receives goes to the one posted first, and an ANY_SOURCE
    receive takes the message that arrived first (numbered as they arrive).
    """

    def __init__(self, comm: Communicator) -> None:
        self.c = comm
        n = comm.size
        self.lock = threading.RLock()
        self.sends: list[deque[tuple[Request, Request, Work]]] = [deque() for _ in range(n)]
        #: posted receives per source, and from any source: (buffer, tag, work, post number)
        self.posted: list[deque[tuple[Buffer, int, Work, int]]] = [deque() for _ in range(n)]
        self.posted_any: deque[tuple[Buffer, int, Work, int]] = deque()
        #: messages nobody received yet: (tag, dtype code, data, arrival number)
        self.unexpected: list[deque[tuple[int, int, np.ndarray, int]]] = \
            [deque() for _ in range(n)]
        self._numbers = itertools.count()
        self.active: list[tuple[Request, Callable[[], None]] | None] = [None] * n
        #: the posted header receive per source, and the buffer it fills
        self.hdr: list[tuple[Request, np.ndarray] | None] = [None] * n
        #: sends or receives may be in flight (set as they start, see :meth:`_started`;
        #: :meth:`background` clears it once none are)
        self._busy = False
        #: what moving the messages in the background raised (see :meth:`background`)
        self._failed: Exception | None = None

    def _usable(self) -> None:
        """Raise if the communicator is closed or broken, or moving this engine's messages
        in another wait failed (every path checks it, the compiled ones too)."""
        self.c._usable()
        if self._failed is not None:
            raise self._failed

    def _started(self) -> None:
        """Something is in flight: every wait of this process moves it from now on."""
        if not self._busy:
            self._busy = True
            BACKGROUND.add(self.background)

    def background(self) -> bool:
        """Advance what is in flight while this rank waits in something else (a collective,
        of this communicator or another: every transport's waits call this, see
        ``transport.base.BACKGROUND``); True if a byte moved.  Nothing while the engine
        is busy in another thread."""
        if not self._busy or not self.lock.acquire(blocking=False):
            return False
        try:
            if self.c._closed or self._failed is not None or self.c._broken is not None:
                BACKGROUND.discard(self.background)
                return False
            # the sends, and the receives from sources a receive is posted or a payload
            # is arriving from: a message nobody asked for stays in the channel, where a
            # blocking recv takes it on the compiled path
            moved = self._progress_sends()
            t = self.c._t
            for src in (range(self.c.size) if self.posted_any else
                        [q for q in range(self.c.size)
                         if self.posted[q] or self.active[q] is not None]):
                moved |= self._progress_in(src, t)
            self._busy = bool(self.posted_any or any(self.sends) or any(self.posted)
                              or any(a is not None for a in self.active))
            if not self._busy:
                BACKGROUND.discard(self.background)
            return moved
        except Exception as exc:  # noqa: BLE001 - for this engine's own waits, not the caller's
            # the caller may be another communicator's wait: the error is this one's, and
            # its own waits raise it (see _progress)
            self._failed = exc
            BACKGROUND.discard(self.background)
            return False
        finally:
            self.lock.release()

    def isend(self, xb: Buffer, dst: int, tag: int) -> Work:
        return self._send(xb, dst, tag, False)

    def send(self, xb: Buffer, dst: int, tag: int) -> None:
        """A blocking send: a whole message the transport takes at once (shared memory
        with room in the channel) needs no Work and no wait."""
        w = self._send(xb, dst, tag, True)
        if w is not None:
            w.wait()

    @overload
    def _send(self, xb: Buffer, dst: int, tag: int, blocking: Literal[False]) -> Work: ...

    @overload
    def _send(self, xb: Buffer, dst: int, tag: int, blocking: bool) -> Work | None: ...

    def _send(self, xb: Buffer, dst: int, tag: int, blocking: bool) -> Work | None:
        """Start a send; None if ``blocking`` and the message is already on its way
        whole (nothing queued before it to ``dst``, and the transport took all of it at
        once: then nothing is left to wait for)."""
        fr = self.c._fr
        rec = fr.p2p(SEND, dst, tag, xb.dt.code, xb.nbytes, self.c._seq) if fr is not None else None
        inline = xb.nbytes <= INLINE_BYTES
        t = self.c._t
        if blocking:
            with self.lock:
                self._usable()
                if not self.sends[dst] and xb.flat.flags.c_contiguous and \
                        t.push_message(dst, _FMT, tag, xb.dt.code, xb.flat):
                    if rec is not None:
                        rec[T_END] = now_ns()
                    return None
        frame = np.zeros(_FRAME_BYTES, np.uint8)
        frame[:_HEAD_BYTES].view(np.int64)[:5] = (_P2P_MAGIC, tag, xb.nbytes, xb.dt.code,
                                                  _INLINE if inline else 0)
        if inline:
            frame[_HEAD_BYTES:_HEAD_BYTES + xb.nbytes] = xb.flat.view(np.uint8)
        with self.lock:
            self._usable()
            try:
                h = t.isend(dst, [frame], P2P)
            except (PeerError, CommTimeoutError) as exc:   # a failure heard of before
                raise relayed(type(exc)(f"send to rank {dst} (tag {tag}) failed: {exc}"),
                              exc) from None
            if blocking and inline and not self.sends[dst]:
                h.advance()
                if h.done:
                    if rec is not None:
                        rec[T_END] = now_ns()
                    return None
            w = Work(f"send to rank {dst} (tag {tag})", dst)
            w._rec, w._named = rec, self.c._name_group
            # an inline payload leaves nothing to send: an empty message is done at once
            p = t.isend(dst, [] if inline else [xb.flat.view(np.uint8)], P2P)
            self.sends[dst].append((h, p, w))
            self._started()
            w._driver = self._drive
            self._progress()
        return w

    def recv(self, xb: Buffer, src: int, tag: int) -> None:
        """A blocking receive: a message from ``src`` that is already here (kept aside,
        or whole at the head of its channel) is taken without a Work or a wait, when no
        receive posted before this one could want it."""
        if src != ANY_SOURCE:
            t = self.c._t
            spin_end = 0.0
            with self.lock:
                self._usable()
                if not self.posted[src] and not self.posted_any and \
                        self.active[src] is None and \
                        xb.flat.flags.c_contiguous and self._unexpected(src, tag) is None:
                    # the compiled path: the message at the head of the channel, if it is
                    # the one (spinning as the waits do first); else as below
                    got = t.take_message(src, _FMT, tag, xb.dt.code, xb.flat,
                                         t.settings.spin_us * 1e-6)
                    if got == TAKEN:
                        fr = self.c._fr
                        if fr is not None:
                            done = fr.p2p(RECV, src, tag, xb.dt.code, xb.nbytes, self.c._seq)
                            done[T_END] = done[T_START]
                        return
                    if got == EMPTY:
                        spin_end = -1.0   # spun already
                while not self.posted[src] and not self.posted_any:
                    kept = self._take_kept(src, tag)
                    if kept is None:
                        try:
                            self._progress_in(src, t)   # take in what has arrived
                        except KeyboardInterrupt as exc:
                            self.c._fail(exc)   # a message may be half received
                            raise
                        kept = self._take_kept(src, tag)
                    if kept is None:
                        # as the waits spin first (settings.spin_us: none when ranks
                        # outnumber cores, nor on an engine whose threads report)
                        now = time.perf_counter()
                        if not spin_end:
                            spin_end = now + t.settings.spin_us * 1e-6
                        if now < spin_end:
                            continue
                        break
                    q, utag, code, data = kept
                    fr = self.c._fr
                    rec = fr.p2p(RECV, src, tag, xb.dt.code, xb.nbytes, self.c._seq) \
                        if fr is not None else None
                    err = _mismatch(xb, q, utag, code, data.size)
                    if err is not None:
                        recorder.failed(rec, err)
                        raise err
                    xb.flat.view(np.uint8)[...] = data
                    if rec is not None:
                        rec[T_END] = now_ns()
                    return
        self.irecv(xb, src, tag).wait()

    def irecv(self, xb: Buffer, src: int, tag: int) -> Work:
        who = "any rank" if src == ANY_SOURCE else f"rank {src}"
        what = "any tag" if tag == ANY_TAG else f"tag {tag}"
        w = Work(f"recv from {who} ({what})", None if src == ANY_SOURCE else src)
        w._named = self.c._name_group   # wait() names a group's ranks in its errors
        fr = self.c._fr
        if fr is not None:
            w._rec = fr.p2p(RECV, src, tag, xb.dt.code, xb.nbytes, self.c._seq)
        with self.lock:
            self._usable()
            kept = self._take_kept(src, tag)
            if kept is not None:
                q, utag, code, data = kept
                self._deliver(xb, q, utag, code, data.size, w, data)
                return w
            entry = (xb, tag, w, next(self._numbers))
            (self.posted_any if src == ANY_SOURCE else self.posted[src]).append(entry)
            self._started()
            w._driver = self._drive
            self._progress()
        return w

    def _take_kept(self, src: int, tag: int) -> tuple[int, int, int, np.ndarray] | None:
        """Remove and return (source, tag, dtype code, bytes) of the first-arrived kept
        message that a receive of (src, tag) takes, if any."""
        hit = self._unexpected(src, tag)
        if hit is None:
            return None
        q, i = hit
        utag, code, data, _ = self.unexpected[q][i]
        del self.unexpected[q][i]
        return q, utag, code, data

    def _unexpected(self, src: int, tag: int) -> tuple[int, int] | None:
        """(source, index) of the first-arrived kept message that a receive of (src, tag)
        takes, if any."""
        best: tuple[int, int, int] | None = None
        for q in (range(self.c.size) if src == ANY_SOURCE else (src,)):
            for i, (utag, _, _, number) in enumerate(self.unexpected[q]):
                if tag in (ANY_TAG, utag):
                    if best is None or number < best[0]:
                        best = (number, q, i)
                    break
        return None if best is None else (best[1], best[2])

    def _posted(self, src: int, tag: int) -> tuple[Buffer, int, Work] | None:
        """The receive posted first that takes a message from src with tag (removed)."""
        cands = []
        for dq in (self.posted[src], self.posted_any):
            i = next((i for i, e in enumerate(dq) if e[1] in (ANY_TAG, tag)), None)
            if i is not None:
                cands.append((dq[i][3], dq, i))
        if not cands:
            return None
        _, dq, i = min(cands, key=lambda c: c[0])
        xb, ptag, w, _ = dq[i]
        del dq[i]
        return xb, ptag, w

    def iprobe(self, src: int, tag: int) -> Status | None:
        """The message a receive of (src, tag) would take now, without taking it."""
        with self.lock:
            self._usable()
            self._progress()
            hit = self._unexpected(src, tag)
            if hit is None:
                return None
            q, i = hit
            utag, code, data, _ = self.unexpected[q][i]
            d = dtype_of_code(code)
            return Status(q, utag, int(data.size), d.name if d else str(code),
                          d.itemsize if d else 0, code)

    def probe(self, src: int, tag: int) -> Status:
        """Wait (under the deadline) for a message a receive of (src, tag) would take."""
        who = "any rank" if src == ANY_SOURCE else f"rank {src}"
        what = f"probe for a message from {who} (" + \
            ("any tag" if tag == ANY_TAG else f"tag {tag}") + ")"
        got = self.iprobe(src, tag)
        if got is not None:
            return got
        t = self.c._t
        watch = [] if src == ANY_SOURCE else [src]
        with self.lock:
            probe = Work(what, None if src == ANY_SOURCE else src)   # for the advice only
            waiter = Waiter(t.settings, lambda: what, lambda: watch,
                            lambda: self._check_any(what) if src == ANY_SOURCE
                            else t.check(watch, what),
                            advice=lambda: self._advice(probe, True))
            peers = functools.partial(self._in_flight, None if src == ANY_SOURCE else src)
            try:
                while True:
                    seen = t.events()
                    got = self.iprobe(src, tag)
                    if got is not None:
                        return got
                    if not self._progress():
                        self._idle(seen, waiter, peers)
            except (CommTimeoutError, PeerError) as exc:
                self._abort(exc)
                raise

    def _deliver(self, xb: Buffer, src: int, tag: int, code: int, nbytes: int, w: Work,
                 data: np.ndarray | None) -> Request | None:
        w.source, w.tag = src, tag
        err = _mismatch(xb, src, tag, code, nbytes)
        if err is not None:
            if data is None:   # its payload is still to come: drained aside, and known to
                # be before the work's callbacks run (one may wait, and that wait move this
                # engine: it must not take the payload for the next header)
                drain = self.c._t.irecv(src, [np.empty(nbytes, np.uint8)], None, P2P)
                self.active[src] = (drain, _nothing)
            w._finish(error=err)
            return None
        if data is not None:
            xb.flat.view(np.uint8)[...] = data
            w._finish(xb.obj)
            return None
        return self.c._t.irecv(src, [xb.flat], None, P2P)

    def _progress(self) -> bool:
        if self._failed is not None:   # moving messages in another wait failed
            raise self._failed
        moved = self._progress_sends()
        t = self.c._t
        for src in range(self.c.size):
            moved |= self._progress_in(src, t)
        return moved

    def _progress_sends(self) -> bool:
        moved = False
        for dq in self.sends:
            while dq:
                h, p, w = dq[0]
                moved |= h.advance()
                if not h.done:
                    break       # the header first (a payload that is done may be empty)
                moved |= p.advance()
                if not p.done:
                    break
                dq.popleft()
                w._finish(None)
        return moved

    def _progress_in(self, src: int, t: Transport) -> bool:
        moved = False
        while True:
            act = self.active[src]
            if act is not None:
                req, finish = act
                moved |= req.advance()
                if not req.done:
                    return moved
                self.active[src] = None
                finish()
                continue
            posted = self.hdr[src]
            if posted is None:
                buf = np.empty(_FRAME_BYTES, np.uint8)
                posted = self.hdr[src] = (t.irecv(src, [buf], None, P2P), buf)
            hreq, buf = posted
            moved |= hreq.advance()
            if not hreq.done:
                return moved
            self.hdr[src] = None
            hdr = buf.view(np.int64)
            if hdr[0] != _P2P_MAGIC:
                raise RingletError(f"corrupt point-to-point stream from rank {src}")
            moved = True
            tag, nbytes, code = int(hdr[1]), int(hdr[2]), int(hdr[3])
            if int(hdr[4]) & _INLINE:   # the payload came with the header
                self._arrived(src, tag, code, buf[_HEAD_BYTES:_HEAD_BYTES + nbytes].copy())
                continue
            match = self._posted(src, tag)
            if match is not None:
                xb, _, w = match
                into = self._deliver(xb, src, tag, code, nbytes, w, None)
                if into is not None:   # else a size mismatch: drained aside (_deliver)
                    self.active[src] = (into, functools.partial(w._finish, xb.obj))
            else:
                data = np.empty(nbytes, np.uint8)
                req = t.irecv(src, [data], None, P2P)
                self.active[src] = (req, functools.partial(self._arrived, src, tag, code, data))

    def _arrived(self, src: int, tag: int, code: int, data: np.ndarray) -> None:
        """A message that had no receive when its header came is complete: give it to a
        receive posted since, or keep it for the next one."""
        match = self._posted(src, tag)
        if match is None:
            self.unexpected[src].append((tag, code, data, next(self._numbers)))
            return
        xb, _, w = match
        self._deliver(xb, src, tag, code, data.size, w, data)

    def close_pending(self) -> None:
        """The communicator closes: finish the sends in flight (their receivers expect
        them; under the deadline, an error is the receiver's to report), then fail the
        receives still posted, saying so (their Works raised a ValueError from the
        released shared memory)."""
        for dq in self.sends if self.c._broken is None else ():
            for _, _, w in list(dq):
                try:
                    w.wait()
                except RingletError:
                    break   # this destination failed: its other sends cannot go either
        with self.lock:
            for posted in [*self.posted, self.posted_any]:
                while posted:
                    w = posted.popleft()[2]
                    w._finish(error=RingletError(
                        f"{w._what}: the communicator was closed before a message came"))

    def _drive(self, w: Work, timeout: float | None) -> None:
        t = self.c._t
        with self.lock:
            if self.c._closed:   # a receive under way, or a send a failure left
                w._finish(error=RingletError(
                    f"{w._what}: the communicator was closed before it completed"))
                return
            if self.c._broken is not None:   # a failure aborted the communicator since
                w._finish(error=PeerError(f"{w._what}: the communicator was aborted "
                                          f"earlier: {self.c._broken}"))
                return
            self._progress()
            if w._done.is_set():
                return
            watch = [] if w._peer is None or w._peer == self.c.rank else [w._peer]
            if timeout == 0.0:   # is_completed(): nobody blocks, the deadline still holds
                self._poll(w, watch)
                return
            # the caller's bound, if shorter than the operation's own deadline (which
            # still ends it, with its diagnosis: it ended the wait at the caller's bound)
            bounded = timeout is not None and timeout < t.settings.timeout
            waiter = Waiter(t.settings, lambda: w._what,
                            lambda: [] if w._peer is None else [w._peer],
                            lambda: self._check(watch, w),
                            timeout=timeout if bounded else None,
                            advice=lambda: self._advice(w, True))
            peers = functools.partial(self._in_flight, w._peer)
            try:
                while not w._done.is_set():
                    seen = t.events()
                    if not self._progress():
                        try:
                            self._idle(seen, waiter, peers)
                        except CommTimeoutError as exc:
                            if bounded:   # the caller's bound: Work.wait says so
                                return
                            recorder.failed(w._rec, exc)
                            self._abort(exc)
                            raise
            except PeerError as exc:
                recorder.failed(w._rec, exc)
                self._abort(exc)
                raise
            except KeyboardInterrupt as exc:
                # a message may be half sent or received: the channels are out of step
                self.c._fail(exc)
                raise

    def _idle(self, seen: Any, waiter: Waiter, peers: Callable[[], list[int] | None]) -> None:
        """Wait for the transport's next event without this engine's lock: another thread's
        point-to-point call goes on meanwhile (a send on one thread while a receive waits
        on another, as MPI_THREAD_MULTIPLE has it; it waited behind the lock until the
        receive's deadline).  Every change to the engine's state is made under the lock,
        and the caller checks its operation again once it has the lock back."""
        self.lock.release()
        try:
            self.c._t.idle(seen, waiter, peers)
        finally:
            self.lock.acquire()

    def _poll(self, w: Work, watch: list[int]) -> None:
        """``is_completed()`` of an operation nobody waits for: its deadline (from its
        start; a ``wait()`` has one of its own from its own start, as before) and its
        peer's liveness hold as in a wait, checked every liveness interval;
        a failure finishes the Work with its error, which ``wait()`` raises, and aborts
        the communicator (a polling loop ends: is_completed() is True)."""
        if w._poller is None:
            w._poller = Waiter(self.c._t.settings, lambda: w._what,
                               lambda: [] if w._peer is None or w._done.is_set()
                               else [w._peer], lambda: self._check(watch, w),
                               advice=lambda: self._advice(w, True), start=w._start)
        try:
            w._poller.tick()
        except (CommTimeoutError, PeerError) as exc:
            w._finish(error=exc)
            self._abort(exc)

    def _abort(self, exc: RingletError) -> None:
        """A point-to-point operation failed at its deadline or with its peer: the
        communicator is aborted on every rank, as after a collective's failure (its
        receive stays posted, and must not fill a buffer its caller gave up on with a
        message that comes later); every later call raises, naming this failure."""
        with self.lock:
            failed = RingletError(f"the communicator was aborted: {exc}")
            for posted in [*self.posted, self.posted_any]:
                while posted:
                    left = posted.popleft()[2]
                    if not left._done.is_set():
                        left._finish(error=failed)
        # with this rank's number, a peer's death or close too: the text names this
        # rank's own operation ("rank 1 died; recv from rank 1 cannot complete (nothing
        # from rank 1 is pending...)"), which the others, in other operations, took for
        # theirs; a failure relayed from another rank already names that rank
        self.c._fail(exc if _NAMED.match(str(exc)) else
                     type(exc)(f"rank {self.c.rank}: {exc}"))

    def _in_flight(self, peer: int | None) -> list[int] | None:
        """The peers a wait for ``peer`` (None: any rank) needs polled: ``peer`` and
        those with a message still moving (for :meth:`Transport.idle`)."""
        if peer is None:
            return None
        return [peer, *(q for q in range(self.c.size) if q != peer and
                        (self.sends[q] or self.active[q] is not None))]

    def _check_any(self, what: str) -> None:
        """The check of a wait for a message from any rank: a peer that died (or aborted)
        fails it, as MPI's fault-tolerant ANY_SOURCE receives fail when any process
        does (it may have been the sender, and the communicator is aborted anyway); a
        peer that closed the communicator does not, while another rank may still send,
        but once every other rank has closed, nobody can."""
        t, me = self.c._t, self.c.rank
        t.check([], what)
        others = [q for q in range(self.c.size) if q != me]
        closed = 0
        for q in others:
            try:
                t.check([q], what)
            except PeerError as exc:
                if not getattr(exc, "peer_closed", False):
                    raise
                closed += 1
        if others and closed == len(others):
            raise PeerError(f"every other rank closed the communicator (or its program "
                            f"ended) while {what} waited: no rank is left to send")

    def _check(self, watch: list[int], w: Work) -> None:
        try:
            if w._peer is None:
                self._check_any(w._what)
                return
            self.c._t.check(watch, w._what)
        except (PeerError, CommTimeoutError) as exc:
            # a peer's abort notice says what failed there (a timeout too: this wait's own
            # is its waiter's): say what failed here first, and what is pending from the
            # peer (a message of another tag), whether the peer died or timed out
            text = str(exc) if w._what in str(exc) else f"{w._what} failed: {exc}"
            advice = self._advice(w)
            raise relayed(type(exc)(f"{text} ({advice})" if advice and advice not in text
                                    else text), exc) from None

    def _advice(self, w: Work, timed_out: bool = False) -> str:
        """Why a point-to-point wait may never end: what is pending from or to the peer
        (read under the lock: the wait asks while idle, when another thread may move
        messages)."""
        with self.lock:
            return self._pending_advice(w, timed_out)

    def _pending_advice(self, w: Work, timed_out: bool) -> str:
        q = w._peer
        if q is None:   # a receive from any rank
            if not timed_out:
                return ""
            held = [f"rank {s} tag {tag} ({data.size} B)"
                    for s, queue in enumerate(self.unexpected) for tag, _, data, _ in queue]
            return ("no rank has sent this rank a message it matches"
                    + (f"; messages no receive matched: {', '.join(held)} (check the tags)"
                       if held else ""))
        if w._what.startswith("send"):
            return (f"rank {q} has not received the message (is a matching recv posted on "
                    f"rank {q}, with the same tag?)")
        pending = [f"tag {tag} ({data.size} B)" for tag, _, data, _ in self.unexpected[q]]
        act = self.active[q]
        into = getattr(act[1], "func", None) if act is not None else None
        if into is not None and into == self._arrived:
            pending.append("a message still arriving")
        if pending:
            return (f"rank {q} sent this rank messages no receive matched: "
                    f"{', '.join(pending)}; check that send and recv use the same tag")
        if into is not None:   # a receive's message, this one's or an earlier one's
            whose = "this receive's" if getattr(into, "__self__", None) is w else \
                "an earlier receive's"
            return (f"{whose} message from rank {q} was still arriving: rank {q} stopped "
                    f"sending it part-way")
        if not timed_out:
            return f"nothing from rank {q} is pending: it has not sent this rank a message"
        alive = ", though it is alive" if self.c._t.sees_death(q) else \
            " (MPI cannot tell whether it is alive: it may have died)"
        return (f"rank {q} has not sent this rank a message{alive}: it may be "
                f"waiting itself (if every rank receives before it sends, they wait for each "
                f"other in a cycle; `ringlet run` prints the wait-for graph, `ringlet "
                f"diagnose DIR` reads it from the dumps in RINGLET_DUMP_DIR)")


class PointToPoint:
    """send, recv, isend, irecv, sendrecv, probe, iprobe and batch_isend_irecv (a mixin of
    :class:`~ringlet.comm.Communicator`)."""

    size: int
    _p2p: P2PEngine
    _broken: str | None

    if TYPE_CHECKING:
        def _name_group(self, exc: BaseException) -> None: ...

    # each method names a group's ranks in its errors (Calls._name_group) in a try block of
    # its own, not through a decorator: a try costs nothing until it raises, and a wrapper
    # would add a call to every small message

    def send(self, x: Any, dst: int, tag: int = 0) -> None:
        """Send ``x`` to rank ``dst``; returns once ``x`` may be reused.

        On shared memory a send the channel to ``dst`` has room for returns at once
        (eager): up to ``RINGLET_SHM_SLOTS`` (4) small messages that ``dst`` has not
        received yet, fewer larger ones (768 KiB in all by default); beyond that a
        send waits for the receiver, as MPI's rendezvous does.  A send that returned
        at once does not know whether ``dst`` is alive: a dead receiver is found by
        this rank's next wait.  Across
        nodes on torch.distributed every send waits for the receiver to run
        point-to-point (gloo's sends are rendezvous): as with MPI, a correct
        program never counts on a send being buffered.  To a rank on this node,
        a message the channel has room for (up to 768 KiB by default) goes whole
        in one compiled call where ``ringlet._lean`` is built.
        """
        try:
            self._p2p.send(as_buffer(x, "x", writable=False), self._peer(dst, "dst"),
                           self._tag(tag))
        except RingletError as exc:
            self._name_group(exc)
            raise

    def recv(self, x: Any, src: int = ANY_SOURCE, tag: int = 0) -> Any:
        """Receive a message from ``src`` with ``tag`` into ``x``; returns ``x``.

        ``src=ringlet.ANY_SOURCE`` takes a message from any rank (the first to
        arrive), ``tag=ringlet.ANY_TAG`` one with any tag; :meth:`irecv`'s Work
        says who sent it (``work.source``, ``work.tag``), or :meth:`probe` first.
        The message must have ``x``'s size and dtype (MPI would take a shorter one
        into a larger buffer): another is taken all the same, and this raises
        ArgumentError; :meth:`probe` first for a message of unknown size.
        A message from a rank on this node that is already there whole is taken in
        one compiled call where ``ringlet._lean`` is built."""
        try:
            xb = as_buffer(x, "x", writable=True, has_out=False)
            self._p2p.recv(xb, self._peer(src, "src", True), self._tag(tag, True))
        except RingletError as exc:
            self._name_group(exc)
            raise
        return xb.obj

    def isend(self, x: Any, dst: int, tag: int = 0) -> Work:
        """Start sending ``x``; ``wait()`` the returned :class:`Work` before reusing ``x``."""
        try:
            return self._p2p.isend(as_buffer(x, "x", writable=False), self._peer(dst, "dst"),
                                   self._tag(tag))
        except RingletError as exc:
            self._name_group(exc)
            raise

    def irecv(self, x: Any, src: int = ANY_SOURCE, tag: int = 0) -> Work:
        """Start receiving into ``x``; ``wait()`` returns ``x`` once it arrived, and then
        ``work.source`` and ``work.tag`` say who sent it with which tag."""
        try:
            return self._p2p.irecv(as_buffer(x, "x", writable=True, has_out=False),
                                   self._peer(src, "src", True), self._tag(tag, True))
        except RingletError as exc:
            self._name_group(exc)
            raise

    def sendrecv(self, x: Any, dst: int, out: Any, src: int = ANY_SOURCE, sendtag: int = 0,
                 recvtag: int = 0) -> Any:
        """Send ``x`` to ``dst`` and receive a message from ``src`` into ``out`` at once, as
        MPI's ``Sendrecv``; returns ``out`` once both are done.  Both start before either
        waits, so a ring shift (every rank sending right and receiving from the left)
        never waits on itself, whatever the message size.  ``x`` and ``out`` must not
        overlap.  Both are checked before either starts."""
        try:
            xb = as_buffer(x, "x", writable=False)
            ob = as_buffer(out, "out", writable=True)
            d, s = self._peer(dst, "dst"), self._peer(src, "src", True)
            st, rt = self._tag(sendtag), self._tag(recvtag, True)
            if np.shares_memory(xb.flat, ob.flat):
                raise ArgumentError("sendrecv: x and out overlap; receive into a buffer of "
                                    "its own")
            sent = self._p2p.isend(xb, d, st)
            try:
                self._p2p.irecv(ob, s, rt).wait()
            finally:   # x is the caller's again only once its send is done, error or not
                if not self._broken:   # (an aborted communicator fails the send's wait too)
                    sent.wait()
        except RingletError as exc:
            self._name_group(exc)
            raise
        return ob.obj

    def probe(self, src: int = ANY_SOURCE, tag: int = ANY_TAG) -> Status:
        """Wait for a message a receive of (src, tag) would take, and say what it is
        (:class:`Status`: source, tag, nbytes, dtype, count) without receiving it."""
        try:
            return self._p2p.probe(self._peer(src, "src", True), self._tag(tag, True))
        except RingletError as exc:
            self._name_group(exc)
            raise

    def iprobe(self, src: int = ANY_SOURCE, tag: int = ANY_TAG) -> Status | None:
        """:meth:`probe` that does not wait: None if no such message is here yet."""
        try:
            return self._p2p.iprobe(self._peer(src, "src", True), self._tag(tag, True))
        except RingletError as exc:
            self._name_group(exc)
            raise

    def batch_isend_irecv(self, ops: Sequence[tuple[str, Any, int] | tuple[str, Any, int, int]]
                          ) -> list[Work]:
        """Start several sends and receives at once, as torch's ``batch_isend_irecv``:
        ``ops`` are ``("send", x, dst[, tag])`` and ``("recv", x, src[, tag])``; returns
        their Works in the same order.  Every op is checked before any starts."""
        try:
            return self._batch(ops)
        except RingletError as exc:
            self._name_group(exc)
            raise

    def _batch(self, ops: Sequence[tuple[str, Any, int] | tuple[str, Any, int, int]]
               ) -> list[Work]:
        checked = []
        for i, op in enumerate(ops):
            if not isinstance(op, tuple) or len(op) not in (3, 4) or op[0] not in ("send",
                                                                                   "recv"):
                raise ArgumentError(f"batch_isend_irecv: op {i} must be (\"send\"|\"recv\", "
                                    f"x, peer[, tag]), got {op!r}")
            kind, x, peer = op[0], op[1], op[2]
            tag = op[3] if len(op) == 4 else 0
            send = kind == "send"
            xb = as_buffer(x, f"op {i}'s x", writable=not send, has_out=False)
            checked.append((send, xb, self._peer(peer, "dst" if send else "src", not send),
                            self._tag(tag, not send)))
        return [self._p2p.isend(xb, q, t) if send else self._p2p.irecv(xb, q, t)
                for send, xb, q, t in checked]

    def _peer(self, peer: Any, what: str, any_ok: bool = False) -> int:
        if type(peer) is int and 0 <= peer < self.size:   # the common case
            return peer
        if any_ok and isinstance(peer, (int, np.integer)) and peer == ANY_SOURCE:
            return ANY_SOURCE
        if not isinstance(peer, (int, np.integer)) or isinstance(peer, bool) or \
                not 0 <= peer < self.size:
            raise ArgumentError(
                f"{what} {peer!r} is not a rank of this communicator (0..{self.size - 1})"
                + (" or ringlet.ANY_SOURCE" if any_ok else ""))
        return int(peer)

    def _tag(self, tag: Any, any_ok: bool = False) -> int:
        if type(tag) is int and 0 <= tag < 2 ** 62:   # the common case
            return tag
        if any_ok and isinstance(tag, (int, np.integer)) and tag == ANY_TAG:
            return ANY_TAG
        if not isinstance(tag, (int, np.integer)) or isinstance(tag, bool) or \
                not 0 <= tag < 2 ** 62:
            raise ArgumentError("tag must be an int >= 0 and below 2**62" +
                                (" or ringlet.ANY_TAG" if any_ok else "") + f", got {tag!r}")
        return int(tag)


def _mismatch(xb: Buffer, src: int, tag: int, code: int, nbytes: int) -> ArgumentError | None:
    """The error of a message that does not fit the receive buffer ``xb`` (None: fits)."""
    if code == xb.dt.code and nbytes == xb.nbytes:
        return None
    d = dtype_of_code(code)
    n = nbytes // d.itemsize if d else nbytes
    return ArgumentError(f"message from rank {src} (tag {tag}) holds {n} x "
                         f"{d.name if d else code}, but the receive buffer holds {xb.count} x "
                         f"{xb.dt.name}; the message was taken (a receive takes a message "
                         f"of its own size and dtype only: probe() first for one of "
                         f"unknown size)")


def _nothing() -> None:
    """Completion of a payload nobody wants (drained after a size mismatch)."""
