"""The shared-memory transport: ringlet's default on one host.

Each rank of a communicator owns one segment (a file in ``/dev/shm``, mode
0600, named ``ringlet-<job id>-<communicator token>-<rank>``, the job id
being 128 random bits).  It holds:

- a header: pid, the two latest collective descriptors, attach flags and an
  abort mailbox;
- for every peer, two single-producer single-consumer channels (one for
  collectives, one for the user's point-to-point messages, so the two never
  mix), each a ring of ``shm_slots`` slots of ``shm_slot_bytes``.

The producer writes a fragment into a slot, then its length, then advances
``head``; the consumer reads, then advances ``tail`` (x86-64's store order
makes this safe without locks).  Segments are unlinked as soon as every peer
has mapped them, so nothing is left in ``/dev/shm`` even if a rank is
SIGKILLed afterwards; the mappings live as long as the processes.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
import time
from array import array
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from ..config import Settings
from ..errors import (
    ArgumentError,
    CommTimeoutError,
    ConfigError,
    PeerError,
    RingletError,
    name_ranks,
    relayed,
)
from ..procs import alive, cores, more_files
from .base import COLL, EMPTY, OTHER, P2P, TAKEN, Caps, Transport

try:
    from .. import _lean  # type: ignore[attr-defined]
except ImportError:   # built without a C compiler
    _lean = None

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else os.path.join(
    os.environ.get("TMPDIR", "/tmp"), "ringlet-shm")

MAGIC = 0x524C4E4731          # "RLNG1"
DESC_WORDS = 16               # one collective descriptor: seq + 15 words
ABORT_BYTES = 1024
STATE_OPEN, STATE_CLOSED = 0, 1


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


#: counters of the staged (fused) paths, one cache line each, in the header
STAGE_COUNTERS = 4
#: where the data areas (channel slots, post and stage halves) start, past a page boundary.
#: Users' large arrays start 16 bytes past one (numpy's, glibc's mmap'd blocks) or at one
#: (torch's, page-aligned allocators); a copy whose destination starts a few bytes past
#: its source's offset in the page (modulo 4 KiB) stalls on this CPU's false 4K-aliasing
#: of loads and stores (256 KiB: 4.6 us instead of 2.9).  Half a page away from both,
#: every such pair of offsets is 2 KiB apart in either direction (benchmarks/RESULTS.md).
SKEW = 2048


class _Layout:
    """Byte offsets inside one rank's segment."""

    def __init__(self, size: int, slots: int, slot_bytes: int, post_bytes: int,
                 stage_bytes: int) -> None:
        self.size, self.K, self.F = size, slots, slot_bytes
        self.desc = 64
        self.attached = self.desc + 2 * DESC_WORDS * 8
        self.abort = _align(self.attached + 8 * size, 64)
        # two notes (why this rank rejected a call), alternating by sequence number
        self.note = _align(self.abort + 16 + ABORT_BYTES, 64)
        self.note_bytes = _align(8 + ABORT_BYTES, 64)
        self.counters = self.note + 2 * self.note_bytes
        # this rank's state: STATE_OPEN, then STATE_CLOSED once it closed the communicator;
        # then the number of calls it had finished
        self.state = self.counters + 64 * STAGE_COUNTERS
        self.ctrl = self.state + 64
        self.ctrl_bytes = 128 + _align(8 * slots, 64)
        self.data = _align(self.ctrl + 2 * size * self.ctrl_bytes, 4096) + SKEW
        # post: two halves for one-shot collectives, alternating by sequence number;
        # stage: two halves for pipelined staged collectives, alternating by piece
        self.post_bytes, self.stage_bytes = post_bytes, stage_bytes
        self.post = _align(self.data + 2 * size * slots * slot_bytes, 4096) + SKEW
        self.stage = _align(self.post + 2 * post_bytes, 4096) + SKEW
        self.total = self.stage + 2 * stage_bytes

    def ctrl_off(self, kind: int, peer: int) -> int:
        return self.ctrl + (kind * self.size + peer) * self.ctrl_bytes

    def data_off(self, kind: int, peer: int) -> int:
        return self.data + (kind * self.size + peer) * self.K * self.F


class _Channel:
    """One direction between two ranks; lives in the producer's segment."""

    __slots__ = ("head", "tail", "lens", "slots", "count", "K", "F", "addrs", "ready")

    def __init__(self, mm: mmap.mmap, lay: _Layout, kind: int, consumer: int) -> None:
        c = lay.ctrl_off(kind, consumer)
        base = np.frombuffer(mm, np.uint8, 1).ctypes.data
        #: the control words' and the slots' addresses, for the compiled path (ringlet._lean)
        self.addrs = (base + c, base + lay.data_off(kind, consumer))
        mv = memoryview(mm)
        self.head = mv[c:c + 8].cast("q")
        self.tail = mv[c + 64:c + 72].cast("q")
        self.lens = mv[c + 128:c + 128 + 8 * lay.K].cast("q")
        d = lay.data_off(kind, consumer)
        self.slots = [np.frombuffer(mm, np.uint8, lay.F, d + i * lay.F) for i in range(lay.K)]
        self.count = 0   # head (producer side) or tail (consumer side), mirrored locally
        self.K, self.F = lay.K, lay.F
        #: the producer has reserved the slots' memory (ShmTransport._reserve_channel)
        self.ready = False

    def release(self) -> None:
        for v in (self.head, self.tail, self.lens):
            v.release()
        self.slots = []


class SendReq:
    """A message being pushed into a channel, fragment by fragment."""

    __slots__ = ("chan", "parts", "pi", "off", "remaining", "peer")

    def __init__(self, chan: _Channel, parts: Sequence[np.ndarray], peer: int) -> None:
        self.chan, self.peer = chan, peer
        self.parts = [p for p in parts if p.size]
        self.pi = self.off = 0
        self.remaining = sum(p.size for p in self.parts)

    @property
    def done(self) -> bool:
        return self.remaining == 0

    def advance(self) -> bool:
        return self.push()

    def push(self) -> bool:
        """Write as many fragments as there are free slots; True if any was written."""
        ch, moved = self.chan, False
        while self.remaining:
            h = ch.count
            if h - ch.tail[0] >= ch.K:
                return moved
            slot = ch.slots[h % ch.K]
            n = min(ch.F, self.remaining)
            filled = 0
            while filled < n:
                part = self.parts[self.pi]
                take = min(part.size - self.off, n - filled)
                slot[filled:filled + take] = part[self.off:self.off + take]
                filled += take
                self.off += take
                if self.off == part.size:
                    self.pi += 1
                    self.off = 0
            ch.lens[h % ch.K] = n
            ch.count = h + 1
            ch.head[0] = h + 1
            self.remaining -= n
            moved = True
        return moved


class RecvReq:
    """A message being pulled from a channel into typed parts, copying or reducing."""

    __slots__ = ("chan", "parts", "reducer", "pi", "off", "remaining", "peer", "itemsize")

    def __init__(self, chan: _Channel, parts: Sequence[np.ndarray],
                 reducer: Callable[[np.ndarray, np.ndarray], None] | None, peer: int) -> None:
        self.chan, self.peer, self.reducer = chan, peer, reducer
        self.parts = [p for p in parts if p.size]
        self.itemsize = self.parts[0].itemsize if self.parts else 1
        self.pi = self.off = 0   # off counts elements of parts[pi]
        self.remaining = sum(p.size for p in self.parts) * self.itemsize

    @property
    def done(self) -> bool:
        return self.remaining == 0

    def advance(self) -> bool:
        return self.pull()

    def pull(self) -> bool:
        """Consume every fragment that has arrived; True if any was."""
        ch, moved, isz = self.chan, False, self.itemsize
        while self.remaining:
            t = ch.count
            if ch.head[0] == t:
                return moved
            slot = ch.slots[t % ch.K]
            n = ch.lens[t % ch.K]
            if n > self.remaining or n % isz:
                raise RingletError(
                    f"message from rank {self.peer} does not fit: {n} bytes arrived, "
                    f"{self.remaining} expected (ranks disagree about a message size)")
            pos = 0
            while pos < n:
                part = self.parts[self.pi]
                take = min(part.size - self.off, (n - pos) // isz)
                src = slot[pos:pos + take * isz].view(part.dtype)
                dst = part[self.off:self.off + take]
                if self.reducer is None:
                    dst[...] = src
                else:
                    self.reducer(dst, src)
                pos += take * isz
                self.off += take
                if self.off == part.size:
                    self.pi += 1
                    self.off = 0
            ch.count = t + 1
            ch.tail[0] = t + 1
            self.remaining -= n
            moved = True
        return moved


def oversubscribed(settings: Settings, nranks: int) -> Settings:
    """``settings`` for waits among ``nranks`` local ranks: when they outnumber the cores
    this process may run on, a wait yields at once instead of spinning first (a spinning
    rank would hold the core the rank it waits for needs; measured on 4 ranks and 2
    cores: 8 B all_reduce about 3x faster)."""
    return settings.replace(spin_us=0.0) if nranks > cores() else settings


class ShmTransport(Transport):
    """Channels between the ranks of one communicator on one host.

    Channels COLL and P2P only: agreement and status live in the header."""

    caps = Caps(fused=True, shared_buffers=True)

    def __init__(self, rank: int, size: int, prefix: str, settings: Settings) -> None:
        self.rank, self.size, self.prefix = rank, size, prefix
        #: the settings every wait of this communicator uses (see oversubscribed())
        self.settings = oversubscribed(settings, size)
        #: the compiled small point-to-point path (RINGLET_LEAN=0: the Python path alone)
        self._lean_p2p = _lean if settings.lean else None
        self.lay = _Layout(size, settings.shm_slots, settings.shm_slot_bytes,
                           settings.shm_post_bytes, settings.shm_stage_bytes)
        self.maps: list[mmap.mmap | None] = [None] * size
        self._views: list[memoryview] = []
        self.pids = [0] * size
        self._closed = False
        self.out: list[list[_Channel]] = []   # [kind][peer]: channels I produce
        self.inn: list[list[_Channel]] = []   # [kind][peer]: channels I consume
        self._sendq: list[deque[SendReq]] = [deque() for _ in range(size)]
        self._recvq: list[deque[RecvReq]] = [deque() for _ in range(size)]
        self._active_send: set[int] = set()
        self._active_recv: set[int] = set()
        self.describe: Callable[[], str] = lambda: "a collective"
        self._state: list[memoryview] | None = None
        #: bytes of each stage half reserved so far (see reserve_stage)
        self._staged = 0
        #: how ranks are named in messages: this communicator's rank of each local rank
        #: (a routed transport's shared memory holds only the ranks of one node)
        self.names: list[int] = list(range(size))
        #: what connecting is part of, for its errors ("" for a communicator's start-up)
        self.building = ""

    # --- start-up -------------------------------------------------------------

    def path(self, rank: int) -> str:
        return os.path.join(SHM_DIR, f"{self.prefix}-{rank}")

    def connect(self, timeout: float | None = None,
                check: Callable[[], None] | None = None) -> None:
        """Create my segment, map every peer's, and unlink mine once all have mapped it.

        ``check`` runs at every poll and may raise to stop (start-up's watch on
        signals and the launcher).  Known peer pids (``self.pids``, from the
        rendezvous) let a peer that dies before creating its segment be seen.
        On any failure this rank's segment is removed, the peers mapped so far
        find the reason in their abort mailbox, and the segments of the peers
        whose pids are known are removed too (a peer's mapping outlives its
        name; a peer that dies without cleaning up leaves nothing).
        """
        os.makedirs(SHM_DIR, mode=0o700, exist_ok=True)
        # every segment mapped keeps a descriptor (Python's mmap holds a duplicate)
        more_files(self.size + 64, f"a communicator of {self.size} ranks")
        mine = self.path(self.rank)
        try:
            fd = os.open(mine, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            raise RingletError(
                f"shared-memory segment {mine} already exists: two jobs share a job id "
                f"(RINGLET_JOB_ID={self.prefix!r}?)") from None
        try:
            lay = self.lay
            try:
                os.ftruncate(fd, lay.total)
                mm = mmap.mmap(fd, lay.total)
                # the parts every call may write, reserved now: a write to a page tmpfs
                # has no room for is a SIGBUS (a channel's slots are reserved at its
                # first message, the staged areas at the first staged call: _reserve)
                me = f"rank {self.names[self.rank]}'s"
                reserve(fd, 0, lay.data, f"{me} segment header")
                reserve(fd, lay.post, lay.stage - lay.post, f"{me} one-shot area")
            except (OSError, OverflowError, MemoryError) as exc:
                raise ConfigError(
                    f"rank {self.rank}: cannot make its shared-memory segment of "
                    f"{lay.total:,} bytes in {SHM_DIR} ({exc}); the RINGLET_SHM_* "
                    f"settings size it (`ringlet config` lists them), and {SHM_DIR}'s free "
                    f"space bounds it") from None
            finally:
                os.close(fd)   # the mapping keeps the file (mmap holds a descriptor)
            self.maps[self.rank] = mm
            hdr = self._words(self.rank, 0, 8)
            hdr[1] = os.getpid()
            for i, v in enumerate(self._shape(), 2):
                hdr[i] = v
            hdr[0] = MAGIC
            deadline = time.monotonic() + (self.settings.timeout if timeout is None else timeout)
            self._map_peers(deadline, check)
            self._await_attached(deadline, check)
        except BaseException as exc:
            # the peers mapped so far learn why (the first reason in a mailbox wins)
            kind = 3 if isinstance(exc, ConfigError) else 2 if isinstance(exc, CommTimeoutError) \
                else 1
            text = str(exc) if kind == 3 else \
                f"rank {self.rank} failed during start-up: {type(exc).__name__}: {exc}"
            data = text.encode()[:ABORT_BYTES]
            a = self.lay.abort
            for q, peer in enumerate(self.maps):
                if q != self.rank and peer is not None and not peer[a:a + 8].strip(b"\0"):
                    peer[a + 16:a + 16 + len(data)] = data
                    peer[a + 8:a + 16] = len(data).to_bytes(8, "little")
                    peer[a:a + 8] = kind.to_bytes(8, "little")
            # the start-up failed for every rank (it is all or nothing), so remove the
            # segments of every known peer too: one that dies now (SIGKILL, e.g. from a
            # launcher reacting to this rank's exit) cannot remove its own
            for q in range(self.size):
                if q != self.rank and self.pids[q]:
                    with contextlib.suppress(OSError, RingletError):
                        pfd = _open_private(self.path(q), os.O_RDONLY, "")
                        if _header(pfd)[1] == self.pids[q]:
                            os.unlink(self.path(q))
            raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(mine)
        self._channels()

    def _map_peers(self, deadline: float, check: Callable[[], None] | None = None) -> None:
        pending = [q for q in range(self.size) if q != self.rank]
        delay = 1e-4
        while pending:
            for q in list(pending):
                try:
                    fd = _open_private(self.path(q), os.O_RDWR,
                                       f"rank {q}'s shared-memory segment")
                except FileNotFoundError:
                    continue
                try:
                    head = os.pread(fd, 64, 0)
                    if len(head) < 64 or int.from_bytes(head[0:8], "little") != MAGIC:
                        continue  # created, but not yet sized and described
                    words = [int.from_bytes(head[i:i + 8], "little") for i in range(0, 64, 8)]
                    if tuple(words[2:8]) != self._shape():
                        msg = self._shape_mismatch(q, tuple(words[2:8]))
                        self._poison(fd, words, msg)
                        raise ConfigError(msg)
                    mm = mmap.mmap(fd, self.lay.total)
                finally:
                    os.close(fd)
                self.maps[q] = mm
                self.pids[q] = words[1]
                self._words(q, self.lay.attached, self.size)[self.rank] = 1
                pending.remove(q)
            if pending:
                self._start_error()
                if check is not None:
                    check()
                for q in pending:
                    if self.pids[q] and not alive(self.pids[q]):
                        raise PeerError(f"rank {self.names[q]} (pid {self.pids[q]}) died "
                                        f"{self._stage()}, before creating its shared-memory "
                                        f"segment")
                if time.monotonic() > deadline:
                    raise CommTimeoutError(
                        f"timed out starting the shared-memory transport ({self.prefix}): "
                        f"{name_ranks(self.names[q] for q in pending)} did not "
                        f"arrive; " + (f"they called {self.building}() too (its agreement "
                                       f"passed): they are stuck or slow there" if
                                       self.building else
                                       "check that every rank called ringlet.init()"))
                time.sleep(delay)
                delay = min(delay * 2, 0.01)
        self.pids[self.rank] = os.getpid()

    def _poison(self, fd: int, words: list[int], msg: str) -> None:
        """Leave ``msg`` in a peer's abort mailbox (its layout read from its header), so
        that it fails with the same ConfigError instead of waiting for this rank."""
        theirs = _Layout(words[2], words[3], words[4], words[5], words[6])
        try:
            mm = mmap.mmap(fd, words[7])
        except (OSError, ValueError):
            return
        data = msg.encode()[:ABORT_BYTES]
        a = theirs.abort
        mm[a + 16:a + 16 + len(data)] = data
        mm[a + 8:a + 16] = len(data).to_bytes(8, "little")
        mm[a:a + 8] = (3).to_bytes(8, "little")
        mm.close()

    def _stage(self) -> str:
        """When connecting happens, for its errors."""
        return f"while its {self.building} group was built" if self.building else \
            "during start-up"

    def _start_error(self) -> None:
        """Raise what a peer left in this rank's abort mailbox during start-up, if anything."""
        mm = self.maps[self.rank]
        if mm is None:
            return
        a = self.lay.abort
        kind = int.from_bytes(mm[a:a + 8], "little")
        if kind:
            n = int.from_bytes(mm[a + 8:a + 16], "little")
            msg = bytes(mm[a + 16:a + 16 + n]).decode(errors="replace")
            raise relayed({2: CommTimeoutError, 3: ConfigError}.get(kind, PeerError)(msg))

    def _shape(self) -> tuple[int, ...]:
        """What a peer must agree with to read this rank's segment."""
        lay = self.lay
        return (self.size, lay.K, lay.F, lay.post_bytes, lay.stage_bytes, lay.total)

    def _shape_mismatch(self, q: int, theirs: tuple[int, ...]) -> str:
        names = ("size", "RINGLET_SHM_SLOTS", "RINGLET_SHM_SLOT_BYTES", "RINGLET_SHM_POST_BYTES",
                 "RINGLET_SHM_STAGE_BYTES", "segment bytes")
        diffs = [f"{n}: rank {q} has {t}, rank {self.rank} has {m}"
                 for n, t, m in zip(names, theirs, self._shape(), strict=True) if t != m]
        return ("ranks must use the same shared-memory settings; " + "; ".join(diffs[:-1] or
                                                                             diffs))

    def _await_attached(self, deadline: float, check: Callable[[], None] | None = None) -> None:
        att = self._words(self.rank, self.lay.attached, self.size)
        delay = 1e-4
        while True:
            missing = [q for q in range(self.size) if q != self.rank and att[q] != 1]
            if not missing:
                return
            self._start_error()
            if check is not None:
                check()
            for q in missing:
                if self.pids[q] and not alive(self.pids[q]):
                    raise PeerError(f"rank {self.names[q]} (pid {self.pids[q]}) died "
                                    f"{self._stage()}")
            if time.monotonic() > deadline:
                raise CommTimeoutError(
                    f"timed out starting the shared-memory transport: "
                    f"{name_ranks(self.names[q] for q in missing)} did not map this "
                    f"rank's segment")
            time.sleep(delay)
            delay = min(delay * 2, 0.01)

    def _words(self, rank: int, offset: int, n: int) -> memoryview:
        mm = self.maps[rank]
        if mm is None:
            raise RingletError(f"rank {rank}'s segment is not mapped")
        v = memoryview(mm)[offset:offset + 8 * n].cast("q")
        self._views.append(v)
        return v

    def _reserve(self, off: int, nbytes: int, what: str) -> None:
        """Give the pages of ``[off, off + nbytes)`` of this rank's segment their memory
        now, as NCCL does: a segment is sparse, and a store to a page that a full
        ``/dev/shm`` cannot back kills the process with SIGBUS.  Through the mapping
        (``MADV_POPULATE_WRITE``, Linux 5.14: an error where a store would be a SIGBUS;
        older kernels leave the segment sparse, as before)."""
        mm = self.maps[self.rank]
        if mm is None or nbytes <= 0 or not _POPULATE[0]:
            return
        start = off // mmap.PAGESIZE * mmap.PAGESIZE
        try:
            mm.madvise(MADV_POPULATE_WRITE, start, off + nbytes - start)
        except OSError as exc:
            if exc.errno in (errno.EFAULT, errno.ENOMEM, errno.ENOSPC):
                raise no_room(f"rank {self.names[self.rank]}'s {what}", nbytes) from None
            _POPULATE[0] = False   # EINVAL: not this kernel

    def reserve_stage(self, nbytes: int) -> None:
        """Reserve the first ``nbytes`` of both of this rank's stage halves (before a
        staged call writes them there)."""
        lay, have = self.lay, self._staged
        nbytes = min(nbytes, lay.stage_bytes)
        if nbytes <= have:
            return
        for h in (0, 1):
            self._reserve(lay.stage + h * lay.stage_bytes + have, nbytes - have,
                          "staged area")
        self._staged = nbytes

    def _reserve_channel(self, ch: _Channel, peer: int, kind: int) -> None:
        self._reserve(self.lay.data_off(kind, peer), self.lay.K * self.lay.F,
                      f"channel to rank {self.names[peer]}")
        ch.ready = True

    def _channels(self) -> None:
        self.out = [[_Channel(self.maps[self.rank], self.lay, k, q)  # type: ignore[arg-type]
                     for q in range(self.size)] for k in (COLL, P2P)]
        self.inn = [[_Channel(self.maps[q], self.lay, k, self.rank)  # type: ignore[arg-type]
                     for q in range(self.size)] for k in (COLL, P2P)]
        self._desc = [self._words(q, self.lay.desc, 2 * DESC_WORDS) for q in range(self.size)]
        self._abort = [self._words(q, self.lay.abort, 2) for q in range(self.size)]
        self._state = [self._words(q, self.lay.state, 2) for q in range(self.size)]
        #: counters[q][k]: rank q's k-th staged-path counter (word 8*k: one per cache line)
        self.counters = [self._words(q, self.lay.counters, 8 * STAGE_COUNTERS)
                         for q in range(self.size)]
        lay = self.lay
        #: post[q][h], stage[q][h]: rank q's halves as uint8 arrays (read by all, written by q)
        self.post = [[np.frombuffer(self.maps[q], np.uint8, lay.post_bytes,  # type: ignore[arg-type]
                                    lay.post + h * lay.post_bytes) for h in (0, 1)]
                     for q in range(self.size)]
        self.stage = [[np.frombuffer(self.maps[q], np.uint8, lay.stage_bytes,  # type: ignore[arg-type]
                                     lay.stage + h * lay.stage_bytes) for h in (0, 1)]
                      for q in range(self.size)]

    # --- collective descriptors -------------------------------------------------

    def publish(self, seq: int, words: Sequence[int], note: str | None = None,
                to: Sequence[int] | None = None) -> None:
        """Publish my descriptor of collective ``seq`` (the sequence number is written last)."""
        if note is not None:
            self.set_note(seq, note)
        d, base = self._desc[self.rank], (seq % 2) * DESC_WORDS
        d[base + 1:base + 1 + len(words)] = words if isinstance(words, array) else \
            array("q", words)
        d[base] = seq

    def peer_desc(self, q: int, seq: int) -> tuple[int, ...] | None:
        """Rank q's descriptor of collective ``seq``, or None if it has not published it."""
        d, base = self._desc[q], (seq % 2) * DESC_WORDS
        if d[base] != seq:
            return None
        return tuple(d[base + 1:base + DESC_WORDS])

    def latest_desc(self, q: int) -> tuple[int, tuple[int, ...]] | None:
        """(seq, descriptor) of the last collective rank q entered, if any."""
        d = self._desc[q]
        best = max((d[0], 0), (d[DESC_WORDS], DESC_WORDS))
        if best[0] <= 0:
            return None
        return best[0], tuple(d[best[1] + 1:best[1] + DESC_WORDS])

    # --- failure ------------------------------------------------------------------

    def abort(self, message: str, timeout: bool = False, tell: bool = True,
              unsure: bool = False) -> None:
        """Tell every rank of this communicator to fail with ``message`` (always: a
        write to shared memory reaches a dead peer's segment harmlessly).

        They raise CommTimeoutError if ``timeout``, else PeerError."""
        data = message.encode()[:ABORT_BYTES]
        for q in range(self.size):
            mm = self.maps[q]
            if mm is None:
                continue
            a = self.lay.abort
            if self._abort[q][0]:
                continue
            mm[a + 16:a + 16 + len(data)] = data
            self._abort[q][1] = len(data)
            self._abort[q][0] = 2 if timeout else 1

    def set_note(self, seq: int, text: str) -> None:
        """Leave a message (why this rank rejected call ``seq``) for the peers to read.

        Written before the call's descriptor; the two notes alternate like the
        descriptors, so a note stays until every peer has read it."""
        data = text.encode()[:ABORT_BYTES]
        mm = self.maps[self.rank]
        if mm is None:
            return
        off = self.lay.note + (seq % 2) * self.lay.note_bytes
        mm[off + 8:off + 8 + len(data)] = data
        mm[off:off + 8] = len(data).to_bytes(8, "little")

    def note(self, q: int, seq: int) -> str:
        """Why rank q rejected call ``seq`` (valid while its descriptor of ``seq`` is)."""
        mm = self.maps[q]
        if mm is None:
            return ""
        off = self.lay.note + (seq % 2) * self.lay.note_bytes
        n = int.from_bytes(mm[off:off + 8], "little")
        return bytes(mm[off + 8:off + 8 + n]).decode(errors="replace")

    def mark_closed(self) -> None:
        """Tell the peers this rank closed the communicator (it will make no more calls)."""
        if self._state is not None and not self._closed:
            st = self._state[self.rank]
            st[1] = self.calls()[1]   # before the state: a peer that sees it reads this
            st[0] = STATE_CLOSED

    def closed(self, q: int) -> bool:
        """True if rank q closed the communicator (or exited normally)."""
        return self._state is not None and self._state[q][0] == STATE_CLOSED

    def aborted(self) -> RingletError | None:
        """The error a peer's abort asks this rank to raise, if any."""
        a = self._abort[self.rank]
        if not a[0]:
            return None
        off = self.lay.abort + 16
        mm = self.maps[self.rank]
        msg = bytes(mm[off:off + a[1]]).decode(errors="replace") if mm is not None else ""
        kinds = {2: CommTimeoutError, 3: ConfigError}
        return relayed(kinds.get(a[0], PeerError)(msg))

    def check(self, watch: Sequence[int] | None = None, what: str | None = None) -> None:
        """Raise if a peer aborted the communicator, or a watched peer died."""
        err = self.aborted()
        if err is not None:
            raise err
        for q in range(self.size) if watch is None else watch:
            if q == self.rank:
                continue
            if self.closed(q):
                err = self.closed_error(self.names[q], self._state[q][1],  # type: ignore[index]
                                        what)
                if err is not None:
                    raise err
                continue
            if not alive(self.pids[q]):
                if self.closed(q):
                    continue  # closed between the two checks: reported next time
                raise PeerError(
                    f"rank {self.names[q]} (pid {self.pids[q]}) died; {what or self.describe()} "
                    f"cannot complete")

    # --- requests -------------------------------------------------------------------

    def isend(self, peer: int, parts: Sequence[np.ndarray], channel: int = COLL) -> SendReq:
        """Queue a message of ``parts`` (uint8 views) to ``peer``; progress() moves it."""
        ch = self.out[channel][peer]
        if not ch.ready:
            self._reserve_channel(ch, peer, channel)
        req = SendReq(ch, parts, peer)
        if channel == COLL and req.remaining:
            self._sendq[peer].append(req)
            self._active_send.add(peer)
        return req

    def irecv(self, peer: int, parts: Sequence[np.ndarray],
              reducer: Callable[[np.ndarray, np.ndarray], None] | None = None,
              channel: int = COLL) -> RecvReq:
        """Queue a receive from ``peer`` into ``parts`` (typed views), copying or reducing."""
        req = RecvReq(self.inn[channel][peer], parts, reducer, peer)
        if channel == COLL and req.remaining:
            self._recvq[peer].append(req)
            self._active_recv.add(peer)
        return req

    def push_message(self, peer: int, fmt: tuple[int, int, int, int], tag: int, code: int,
                     payload: np.ndarray) -> bool:
        if self._lean_p2p is None:
            return False
        ch = self.out[P2P][peer]
        if not ch.ready:
            self._reserve_channel(ch, peer, P2P)
        n = self._lean_p2p.p2p_push(*ch.addrs, ch.K, ch.F, ch.count, *fmt, tag, code, payload)
        if n < 0:
            return False
        ch.count = n
        return True

    def take_message(self, peer: int, fmt: tuple[int, int, int, int], tag: int, code: int,
                     out: np.ndarray, spin_s: float) -> int:
        if self._lean_p2p is None:
            return OTHER
        ch = self.inn[P2P][peer]
        n = self._lean_p2p.p2p_take(*ch.addrs, ch.K, ch.F, ch.count, *fmt, tag, code, out,
                                    int(spin_s * 1e9))
        if n < 0:
            return EMPTY if n == -1 else OTHER
        ch.count = n
        return TAKEN

    def progress(self) -> bool:
        """Advance every queued collective request; True if any byte moved."""
        moved = False
        for q in tuple(self._active_send):
            dq = self._sendq[q]
            while dq:
                moved |= dq[0].push()
                if dq[0].remaining:
                    break
                dq.popleft()
            if not dq:
                self._active_send.discard(q)
        for q in tuple(self._active_recv):
            rq = self._recvq[q]
            while rq:
                moved |= rq[0].pull()
                if rq[0].remaining:
                    break
                rq.popleft()
            if not rq:
                self._active_recv.discard(q)
        return moved

    def pending_peers(self) -> list[int]:
        return sorted(self._active_send | self._active_recv)

    def discard_pending(self) -> None:
        """Forget queued collective requests (after an error the communicator is aborted)."""
        for dq in self._sendq:
            dq.clear()
        for rq in self._recvq:
            rq.clear()
        self._active_send.clear()
        self._active_recv.clear()

    # --- groups -------------------------------------------------------------------------

    def split(self, ranks: Sequence[int], token: str,
              remote: Sequence[int] | None = None, *, names: Sequence[int] | None = None,
              watch: Callable[[], None] | None = None) -> ShmTransport:
        """The shared-memory transport of the group ``ranks`` (its members call this;
        connecting waits under its own deadline, calling ``watch`` at every poll)."""
        t = ShmTransport(list(ranks).index(self.rank), len(ranks), f"{self.prefix}-{token}",
                         self.settings)
        # the members' pids, known already: a member that dies before making its segment
        # fails the others at once (not at the deadline), and the segments of one that
        # dies after are removed by the others
        t.pids[:] = [self.pids[q] for q in ranks]
        # its start-up's errors are split()'s: they name the ranks as its caller does
        t.names, t.building = [self.names[q] for q in ranks], "split"
        t.connect(check=watch)
        t.names, t.building = list(names) if names is not None else list(range(len(ranks))), ""
        return t

    # --- shutdown ---------------------------------------------------------------------

    def close(self) -> None:
        """Unmap every segment (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for chans in self.out + self.inn:
            for c in chans:
                c.release()
        self._state = None
        for v in self._views:
            v.release()
        self._views.clear()
        self.out, self.inn = [], []
        self.post, self.stage, self.counters = [], [], []
        for i, mm in enumerate(self.maps):
            if mm is not None:
                # a view may still be referenced: then the mapping goes with the process
                with contextlib.suppress(BufferError):
                    mm.close()
                self.maps[i] = None

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def _header(fd: int) -> tuple[int, int]:
    """A segment's first two header words, (magic, creator's pid), read from ``fd``, which
    is closed."""
    try:
        head = os.pread(fd, 16, 0)
    finally:
        os.close(fd)
    return int.from_bytes(head[:8], "little"), int.from_bytes(head[8:16], "little")


#: how old a segment left in SHM_DIR must be before :func:`sweep_stale` removes it
STALE_AFTER_S = 600.0


def sweep_stale(older_than: float = STALE_AFTER_S, shm_dir: str | None = None) -> list[str]:
    """Remove the segments that jobs of this user left in ``shm_dir`` (default
    :data:`SHM_DIR`) when every rank was killed inside start-up's milliseconds (as
    mpiexec's proxies SIGKILL the ranks when mpiexec is killed): this user's regular
    ``ringlet-*`` files with a segment header whose creator has ended, untouched for
    ``older_than`` seconds.  The age guards a job whose creator runs where its pid is not
    ours to see (another pid namespace sharing this directory): a live job's segment
    exists only until its peers have mapped it, within its start-up deadline.  Files
    without a header (``comm.empty()``'s buffers) are left alone: nothing says whose they
    are.  Returns the paths removed; never raises for a file it cannot read."""
    where = SHM_DIR if shm_dir is None else shm_dir
    try:
        names = [n for n in os.listdir(where) if n.startswith("ringlet-")]
    except OSError:
        return []
    removed = []
    uid, now = os.geteuid(), time.time()
    for name in names:
        path = os.path.join(where, name)
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != uid or st.st_size < 16 or \
                    now - st.st_mtime < older_than:
                continue
            magic, pid = _header(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK))
            if magic != MAGIC or pid <= 0 or alive(pid):
                continue
            os.unlink(path)
            removed.append(path)
        except OSError:
            continue
    return removed


def _open_private(path: str, flags: int, what: str) -> int:
    """Open ``path`` (not following a symbolic link) if it is a regular file of this user
    with no group or other permissions, as ringlet makes them; else a ConfigError naming
    the file, its owner and mode.  FileNotFoundError passes through."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise ConfigError(f"{what} {path} cannot be opened ({exc.strerror}); ringlet makes "
                          f"it a regular file: remove whatever is there") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        os.close(fd)
        kind = "a regular file" if stat.S_ISREG(st.st_mode) else "not a regular file"
        raise ConfigError(
            f"{what} {path} is not this job's: it belongs to uid {st.st_uid}, mode "
            f"{stat.S_IMODE(st.st_mode):04o} ({kind}); ringlet makes its files regular, owned "
            f"by the job's user (uid {os.geteuid()}) and mode 0600, so another user or process "
            f"made or changed it. It is not used; remove it (as its owner or root) and start "
            f"again")
    return fd


#: madvise(2)'s MADV_POPULATE_WRITE (Linux 5.14; Python 3.11's mmap has no name for it)
MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
#: whether this kernel populates (cleared at its first EINVAL)
_POPULATE = [hasattr(mmap.mmap, "madvise")]


def reserve(fd: int, off: int, nbytes: int, what: str,
            smaller: str = "lower the RINGLET_SHM_* sizes (`ringlet config` lists them)"
            ) -> None:
    """Back ``[off, off + nbytes)`` of the shared-memory file ``fd`` with memory now, or
    raise a ConfigError saying how to make room (a file system that cannot reserve
    leaves the file sparse, as before)."""
    try:
        os.posix_fallocate(fd, off, nbytes)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
            return   # EOPNOTSUPP, EINVAL: no reservation here
        raise no_room(what, nbytes, smaller) from None


def no_room(what: str, nbytes: int,
            smaller: str = "lower the RINGLET_SHM_* sizes (`ringlet config` lists them)"
            ) -> ConfigError:
    """The error of a ``/dev/shm`` with no room for ``nbytes`` of ``what``."""
    try:
        st = os.statvfs(SHM_DIR)
        room = f"{st.f_bavail * st.f_frsize:,} of its {st.f_blocks * st.f_frsize:,} bytes free"
    except OSError:
        room = "its free space unknown"
    return ConfigError(
        f"{SHM_DIR} has no room for {what} ({nbytes:,} bytes; {room}): make it larger "
        f"(in Docker `--shm-size=1g` or `--ipc=host`), run fewer ranks on this host, or "
        f"{smaller}")


def create_region(path: str, nbytes: int) -> mmap.mmap:
    """Create and map a new private (0600) shared-memory file of ``nbytes`` (>= 1), its
    memory reserved (:func:`reserve`); the file is removed again if it cannot be sized,
    reserved or mapped."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.ftruncate(fd, max(nbytes, 1))
        reserve(fd, 0, max(nbytes, 1), "a shared buffer (comm.empty)", "ask for less")
        return mmap.mmap(fd, max(nbytes, 1))
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    finally:
        os.close(fd)


def open_region(path: str, nbytes: int) -> mmap.mmap:
    """Map a peer's shared-memory file created by :func:`create_region` (checked to be a
    private file of this user, see :func:`_open_private`)."""
    fd = _open_private(path, os.O_RDWR, "shared buffer")
    try:
        if os.fstat(fd).st_size < max(nbytes, 1):
            raise RingletError(f"shared buffer {path} is smaller than {nbytes} bytes")
        return mmap.mmap(fd, max(nbytes, 1))
    finally:
        os.close(fd)


def cleanup(job_id: str) -> list[str]:
    """Remove every segment file of ``job_id`` left behind (the launcher's backstop)."""
    removed: list[str] = []
    if not job_id or not all(c.isalnum() or c in "-_" for c in job_id):
        raise ArgumentError(f"bad job id {job_id!r}")
    try:
        names = os.listdir(SHM_DIR)
    except FileNotFoundError:
        return removed
    for name in names:
        if name.startswith(f"ringlet-{job_id}-"):
            path = os.path.join(SHM_DIR, name)
            try:
                if os.lstat(path).st_uid != os.geteuid():
                    continue   # not the job's (its user made it): not ours to remove
                os.unlink(path)
                removed.append(name)
            except FileNotFoundError:
                pass
    return removed

