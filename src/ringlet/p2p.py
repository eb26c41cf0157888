"""User point-to-point messages (send, recv, isend, irecv) on their own channels."""

from __future__ import annotations

import functools
import threading
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from . import recorder
from .buffers import Buffer
from .errors import ArgumentError, CommTimeoutError, PeerError, RingletError
from .ops import DTYPE_BY_CODE
from .recorder import RECV, SEND
from .transport.base import P2P, Request, Transport
from .wait import Waiter
from .work import Work

if TYPE_CHECKING:
    from .comm import Communicator

_P2P_MAGIC = 0x50325031


class P2PEngine:
    """User point-to-point messages, on channels of their own (never mixed with collectives).

    A message is a 64-byte header (magic, tag, bytes, dtype) followed by the
    payload, both on the transport's P2P channel.  One header receive per
    source is posted at a time, and the next only once the payload before it
    has been taken in (an engine matches receives in the order they were
    posted).  Receives match messages from a source in order by tag; a message
    that arrives before its receive is posted is kept aside (unexpected queue).
    """

    def __init__(self, comm: Communicator) -> None:
        self.c = comm
        n = comm.size
        self.lock = threading.RLock()
        self.sends: list[deque[tuple[Request, Request, Work]]] = [deque() for _ in range(n)]
        self.posted: list[deque[tuple[Buffer, int, Work]]] = [deque() for _ in range(n)]
        self.unexpected: list[deque[tuple[int, int, np.ndarray]]] = [deque() for _ in range(n)]
        self.active: list[tuple[Request, Callable[[], None]] | None] = [None] * n
        #: the posted header receive per source, and the buffer it fills
        self.hdr: list[tuple[Request, np.ndarray] | None] = [None] * n

    def isend(self, xb: Buffer, dst: int, tag: int) -> Work:
        w = Work(f"send to rank {dst} (tag {tag})", dst)
        fr = self.c._fr
        if fr is not None:
            w._rec = fr.p2p(SEND, dst, tag, xb.dt.code, xb.nbytes)
        hdr = np.array([_P2P_MAGIC, tag, xb.nbytes, xb.dt.code, 0, 0, 0, 0], np.int64)
        t = self.c._t
        with self.lock:
            self.c._usable()
            h = t.isend(dst, [hdr.view(np.uint8)], P2P)
            p = t.isend(dst, [xb.flat.view(np.uint8)], P2P)
            self.sends[dst].append((h, p, w))
            w._driver = self._drive
            self._progress()
        return w

    def irecv(self, xb: Buffer, src: int, tag: int) -> Work:
        w = Work(f"recv from rank {src} (tag {tag})", src)
        fr = self.c._fr
        if fr is not None:
            w._rec = fr.p2p(RECV, src, tag, xb.dt.code, xb.nbytes)
        with self.lock:
            self.c._usable()
            for i, (utag, code, data) in enumerate(self.unexpected[src]):
                if utag == tag:
                    del self.unexpected[src][i]
                    self._deliver(xb, src, tag, code, data.size, w, data)
                    return w
            self.posted[src].append((xb, tag, w))
            w._driver = self._drive
            self._progress()
        return w

    def _deliver(self, xb: Buffer, src: int, tag: int, code: int, nbytes: int, w: Work,
                 data: np.ndarray | None) -> Request | None:
        if code != xb.dt.code or nbytes != xb.nbytes:
            d = DTYPE_BY_CODE.get(code)
            n = nbytes // d.itemsize if d else nbytes
            w._finish(error=ArgumentError(
                f"message from rank {src} (tag {tag}) holds {n} x {d.name if d else code}, "
                f"but the receive buffer holds {xb.count} x {xb.dt.name}"))
            return None
        if data is not None:
            xb.flat.view(np.uint8)[...] = data
            w._finish(xb.obj)
            return None
        return self.c._t.irecv(src, [xb.flat], None, P2P)

    def _progress(self) -> bool:
        moved = False
        t = self.c._t
        for dq in self.sends:
            while dq:
                h, p, w = dq[0]
                moved |= h.advance()
                if h.done:
                    moved |= p.advance()
                if not p.done:
                    break
                dq.popleft()
                w._finish(None)
        for src in range(self.c.size):
            moved |= self._progress_in(src, t)
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
                buf = np.empty(64, np.uint8)
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
            match = next((i for i, (_, ptag, _) in enumerate(self.posted[src]) if ptag == tag),
                         None)
            if match is not None:
                xb, _, w = self.posted[src][match]
                del self.posted[src][match]
                into = self._deliver(xb, src, tag, code, nbytes, w, None)
                if into is None:  # size mismatch: drain the payload aside
                    drain = t.irecv(src, [np.empty(nbytes, np.uint8)], None, P2P)
                    self.active[src] = (drain, _nothing)
                else:
                    self.active[src] = (into, functools.partial(w._finish, xb.obj))
            else:
                data = np.empty(nbytes, np.uint8)
                req = t.irecv(src, [data], None, P2P)
                self.active[src] = (req, functools.partial(self._arrived, src, tag, code, data))

    def _arrived(self, src: int, tag: int, code: int, data: np.ndarray) -> None:
        """A message that had no receive when its header came is complete: give it to a
        receive posted since, or keep it for the next one."""
        match = next((i for i, (_, ptag, _) in enumerate(self.posted[src]) if ptag == tag),
                     None)
        if match is None:
            self.unexpected[src].append((tag, code, data))
            return
        xb, _, w = self.posted[src][match]
        del self.posted[src][match]
        self._deliver(xb, src, tag, code, data.size, w, data)

    def _drive(self, w: Work, timeout: float | None) -> None:
        t = self.c._t
        with self.lock:
            self._progress()
            if w._done.is_set() or timeout == 0.0:
                return
            watch = [] if w._peer is None or w._peer == self.c.rank else [w._peer]
            waiter = Waiter(t.settings, lambda: w._what,
                            lambda: [] if w._peer is None else [w._peer],
                            lambda: self._check(watch, w),
                            timeout=timeout, advice=lambda: self._advice(w, True))
            try:
                while not w._done.is_set():
                    if not self._progress():
                        try:
                            waiter.pause()
                        except CommTimeoutError as exc:
                            if timeout is not None:
                                return
                            recorder.failed(w._rec, exc)
                            recorder.dump(f"timeout: {exc}")
                            raise
            except PeerError as exc:
                recorder.failed(w._rec, exc)
                recorder.dump(f"abort: {exc}")
                raise
            except KeyboardInterrupt as exc:
                # a message may be half sent or received: the channels are out of step
                self.c._fail(exc)
                raise

    def _check(self, watch: list[int], w: Work) -> None:
        try:
            self.c._t.check(watch, w._what)
        except PeerError as exc:
            advice = self._advice(w)
            if not advice:
                raise
            raise PeerError(f"{exc} ({advice})") from None

    def _advice(self, w: Work, timed_out: bool = False) -> str:
        """Why a point-to-point wait may never end: what is pending from or to the peer."""
        q = w._peer
        if q is None:
            return ""
        if w._what.startswith("send"):
            return (f"rank {q} has not received the message (is a matching recv posted on "
                    f"rank {q}, with the same tag?)")
        pending = [f"tag {tag} ({data.size} B)" for tag, _, data in self.unexpected[q]]
        act = self.active[q]
        if act is not None and act[1] is not _nothing:
            pending.append("a message still arriving")
        if pending:
            return (f"rank {q} sent this rank messages no receive matched: "
                    f"{', '.join(pending)}; check that send and recv use the same tag")
        if not timed_out:
            return f"nothing from rank {q} is pending: it has not sent this rank a message"
        return (f"rank {q} has not sent this rank a message, though it is alive: it may be "
                f"waiting itself (if every rank receives before it sends, they wait for each "
                f"other in a cycle; `ringlet run` prints the wait-for graph, `ringlet "
                f"diagnose DIR` reads it from the dumps in RINGLET_DUMP_DIR)")


def _nothing() -> None:
    """Completion of a payload nobody wants (drained after a size mismatch)."""
