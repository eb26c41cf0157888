"""The torch.distributed transport: ringlet's messages on a private gloo group (CPU).

:func:`world` joins the job that ``torchrun`` (or any launcher that sets
``MASTER_ADDR``, ``MASTER_PORT``, ``RANK`` and ``WORLD_SIZE``) started, and
returns a :class:`TorchTransport` over every rank::

    from ringlet.comm import Communicator
    from ringlet.config import Settings
    from ringlet.transport.torch import world

    settings = Settings.from_env()
    t = world(settings)
    comm = Communicator(t.rank, t.size, t, settings, job_id="myjob")

How it maps the transport seam (:mod:`ringlet.transport.base`) onto torch 2.13
----------------------------------------------------------------------------
*A private group.*  Messages travel on a ``ProcessGroupGloo`` of ringlet's
own, built on a ``PrefixStore`` of the job's store: they never meet the
user's default group (its own connections, its own tags).  One gloo tag per
channel (COLL, P2P, CTRL, STATUS): gloo matches the messages of one tag
between two ranks in the order they were posted, so each channel is FIFO per
ordered pair, as the seam requires (the tests check the order).

*Completion.*  gloo's point-to-point ``Work`` cannot be polled:
``is_completed()`` stays False until ``wait()`` returned, and a ``wait`` with
a timeout that expires closes *every* connection of the group ("Application
timeout caused pair closure").  So a receive or send is waited for by a lane:
one thread per (peer, channel, direction) that waits, without a deadline of
its own, for that lane's requests in the order they were posted (they finish
in that order) and marks them finished; the thread ends after a few idle
seconds.  ringlet's own deadline and liveness checks stay with the caller's
:class:`~ringlet.wait.Waiter`.  A receive into a single part without a
reducer lands in place (``torch.from_numpy`` shares the memory); otherwise it
lands in a scratch buffer that :meth:`_Msg.advance` (the caller's thread)
copies or reduces into the parts.  Several parts of a send are packed into
one buffer.  gloo sends are rendezvous: a send finishes once the receiver
has posted the matching receive (no eager protocol), so a user's ``send``
finishes once the receiver's point-to-point engine runs (any p2p call there).

A lane needs the GIL for a moment to report a message, and a thread that
polls in a loop holds it (a waiting thread gets it after the interpreter's
switch interval, 5 ms); a wait that sleeps between polls sleeps past the
reports.  So every wait loop over this transport idles in
:meth:`TorchTransport.idle`, which naps (at most 0.2 ms) until a lane, or
gloo's completion callback for the engine's own collectives, reports, and
its ``settings`` never spin or yield.  A 2-rank round trip of small
point-to-point messages (which travel inside their header: one gloo message
each) takes 0.25-0.4 ms on one host (gloo's own, blocking in ``wait``,
0.13 ms), a 2-rank barrier about 0.3 ms.

*Liveness.*  Agreement and status are messages
(:class:`~ringlet.transport.base.MessageAgreement`,
:class:`~ringlet.transport.base.StatusBoard`), so every remote peer always
has a receive posted on the STATUS channel.  When a peer's process dies its
kernel closes the connections and gloo fails that receive within
milliseconds ("Connection closed by peer"): that failure is what declares a
peer dead (a peer that closed the communicator sent CLOSED on that channel
first).  A peer whose host dies, or that hangs or is stopped, closes nothing;
for those a heartbeat through the store: a thread per process bumps
``beat/<rank>`` every second and reads the watched peers' counters; a
counter that has not moved for ``RINGLET_HEARTBEAT_S`` seconds (5) makes ``check``
raise "rank q (host ...) stopped answering".  Counters, not clocks, so
hosts' clocks need not agree.  ``check`` only reads what the threads found.

*Close.*  gloo in torch 2.13 cannot cancel a posted receive
(``ProcessGroupGloo.abort()`` and ``shutdown()`` do nothing for gloo and
``Work.abort`` is not bound), so :meth:`TorchTransport.close` uses the one
switch gloo has: it lets a private receive time out, which closes every
connection of the group, fails every pending request and ends the lanes.
Each rank's last close stops its heartbeat and says so in the store
(``left/<rank>``).  Where rank 0 hosts the store (env:// outside torchrun),
its process waits at exit until every other rank has left, died (known to a
transport, or a process of this machine that is gone) or stopped beating (at
most the deadline, :func:`_linger`): a host that ended first made
the others' store calls fail, each logged by torch with a C++ stack trace.

*Native collectives* (``caps.native``): gloo's own allreduce, broadcast,
reduce, allgather, reduce_scatter, alltoall, scatter and gather, started with
``async_op`` and polled under the Waiter's deadline.  See
:meth:`TorchTransport.native` for the element types and ops gloo supports.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import socket
import sys
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from typing import Any

import numpy as np

from ..config import Settings
from ..errors import (
    ArgumentError,
    CommTimeoutError,
    ConfigError,
    PeerError,
    RingletError,
)
from ..ops import ReduceOp
from ..topology import machine
from ..wait import Waiter
from . import base
from .base import (
    ABORT_PEER,
    ABORT_TIMEOUT,
    CLOSED,
    COLL,
    ROUND_ABSENT,
    STATUS,
    Caps,
    MessageAgreement,
    Reducer,
    Request,
    StatusBoard,
    Transport,
)

#: the variables of torch's ``env://`` rendezvous (what torchrun sets)
ENV_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
TORCH_PIN = "torch==2.13.0"
#: seconds between heartbeats, and after which a peer whose heartbeat has not moved is
#: reported as stopped (several beats: a busy peer's beat may be late by a second or two)
HEARTBEAT_S = 1.0
STALE_S = 5.0
#: a lane's thread ends after this many idle seconds (a new request starts another)
_IDLE_S = 5.0
#: how long a lane waits for one request: "forever" (a wait whose timeout expires
#: closes every connection of the group; ringlet's deadlines are the Waiter's)
_FOREVER = timedelta(days=3650)
#: the longest nap of a wait that found nothing (see TorchTransport.idle)
_NAP_S = 200e-6
#: the tag of the receive close() lets time out (nobody sends on it)
_KILL_TAG = 15
#: seconds close() and mark_closed() give notices in flight to leave
_FLUSH_S = 1.0
#: the gloo group's own timeout, beyond ringlet's deadline: gloo's collectives wait this
#: long internally (and then close the group's connections)
_GLOO_MARGIN_S = 30.0
#: how long a failed gloo collective waits for the lanes to say which peer died
_GRACE_S = 1.0
#: how long close() waits for the lanes to end (gloo fails their waits at once once its
#: connections are closed), and how long the exit hook waits for any still running
_CLOSE_LANES_S = 2.0
_EXIT_LANES_S = 5.0
#: the timeout of the heartbeat thread's store calls (bounds the join at close)
_STORE_CALL_S = 3.0
#: the collectives gloo runs for algorithm "native" (:meth:`TorchTransport.native_start`)
_NATIVE = ("all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter", "all_to_all",
           "scatter", "gather")

#: messages larger than this travel as several gloo messages (base.PIECE_BYTES; a module
#: global, so that a test can make them small)
PIECE_BYTES = base.PIECE_BYTES

_PENDING, _OK, _FAILED = 0, 1, 2
_SEND, _RECV = 0, 1
_CHANNELS = {0: "COLL", 1: "P2P", 2: "CTRL", 3: "STATUS"}


def _dist() -> Any:
    """``torch.distributed``, imported on first use, or a ConfigError saying what to install."""
    try:
        import torch.distributed as dist
    except ImportError as exc:
        raise ConfigError(
            f"the torch transport needs PyTorch ({exc}); install it with "
            f"`pip install {TORCH_PIN}` (the CPU wheel is enough)") from None
    if not dist.is_available() or not dist.is_gloo_available():
        raise ConfigError(
            "this PyTorch build has no torch.distributed with the gloo backend; install a "
            f"build that has it, e.g. `pip install {TORCH_PIN}`")
    return dist


def env_store(settings: Settings, rank: int | None = None, size: int | None = None) -> Any:
    """The job's torch.distributed store (collective: every rank calls it).

    If torch's default process group is initialised already, its store is
    reused; otherwise the store comes from torch's own ``env://`` rendezvous
    (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``, ``WORLD_SIZE``): under
    torchrun every rank is a client of the agent's store
    (``TORCHELASTIC_USE_AGENT_STORE``), elsewhere rank 0 hosts a ``TCPStore``.
    ringlet does not call ``init_process_group``: the default group stays the
    user's to create (with NCCL, say), and ringlet's own group is private
    anyway.  ``rank`` and ``size``, if given (the launcher's, as
    :func:`ringlet.env.detect` read them), must agree with torch's.  Start-up
    waits at most ``settings.init_timeout``.
    """
    dist = _dist()
    if dist.is_initialized():
        store = dist.distributed_c10d._get_default_store()
        r, n = dist.get_rank(), dist.get_world_size()
        where = "torch's default process group"
    else:
        env = os.environ
        missing = [v for v in ENV_VARS if not env.get(v)]
        if missing:
            raise ConfigError(
                f"the torch transport found no job to join: {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not set. Start the program with "
                f"`torchrun --nproc-per-node N script.py` (`--standalone` on one host), or set "
                f"MASTER_ADDR (rank 0's host), MASTER_PORT (a free port there), RANK "
                f"(0..WORLD_SIZE-1) and WORLD_SIZE in every rank's environment")
        for var in ("MASTER_PORT", "RANK", "WORLD_SIZE"):
            try:
                int(env[var])
            except ValueError:
                raise ConfigError(f"{var}={env[var]!r} is not an integer") from None
        r, n = int(env["RANK"]), int(env["WORLD_SIZE"])
        if n < 1 or not 0 <= r < n:
            raise ConfigError(f"RANK={r} and WORLD_SIZE={n} do not fit: RANK must be in "
                              f"0..WORLD_SIZE-1")
        if not 0 < int(env["MASTER_PORT"]) < 65536:
            raise ConfigError(f"MASTER_PORT={env['MASTER_PORT']} is not a port (1..65535)")
        where = "RANK and WORLD_SIZE"
        addr = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
        try:
            store, r, n = next(dist.rendezvous(
                "env://", timeout=timedelta(seconds=settings.init_timeout)))
            # torch's env:// rendezvous: rank 0 hosts the store, unless torchrun's agent does
            if r == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
                _HOST.append(store)
        except (RuntimeError, ValueError) as exc:
            text = str(exc).lower()
            if "timeout" in text or "timed out" in text:
                raise CommTimeoutError(
                    f"rank {r}: the torch.distributed store at {addr} did not gather {n} ranks "
                    f"within {settings.init_timeout:g} s (RINGLET_INIT_TIMEOUT): "
                    f"{_first_line(exc)}") from None
            raise ConfigError(f"rank {r}: cannot reach or start the torch.distributed store "
                              f"at {addr}: {_first_line(exc)}") from None
    if (rank is not None and rank != r) or (size is not None and size != n):
        raise ConfigError(f"{where} say{'s' if where.startswith('torch') else ''} this is "
                          f"rank {r} of {n}, the launcher says rank {rank} of {size}")
    return store


def world(settings: Settings) -> TorchTransport:
    """The transport over every rank of a job started by torchrun (or env:// variables).

    The store comes from :func:`env_store`.  Every rank must call ``world``
    the same number of times, in the same order: each call makes a new gloo
    group under a new key prefix.
    """
    dist = _dist()
    store = env_store(settings)
    if dist.is_initialized():
        rank, size = dist.get_rank(), dist.get_world_size()
    else:
        rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    n = store.add(f"ringlet-torch/worlds/{restart}/{rank}", 1)
    return TorchTransport(store, rank, size, settings, f"ringlet-torch/{restart}/w{n}")


def _pieces(nbytes: int) -> list[tuple[int, int]]:
    return base.pieces(nbytes, PIECE_BYTES)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _gloo_message(exc: BaseException) -> str:
    """gloo's error without the source path it starts with ("[.../pair.cc:553] ...")."""
    text = _first_line(exc)
    if text.startswith("[") and "] " in text:
        text = text.split("] ", 1)[1]
    return text.split(". This is typically", 1)[0]


# --- requests ------------------------------------------------------------------------------


class _Msg:
    """One message: one gloo send or receive per piece, finished by a lane (see the module
    docs).  The lane counts the pieces that arrived (``arrived``, in posting order); the
    caller's thread copies or reduces each arrived piece into the parts (``advance``)."""

    __slots__ = ("peer", "channel", "works", "ranges", "arrived", "state", "error", "_fin",
                 "_parts", "_tmp", "_reducer", "_keep", "_pos")

    def __init__(self, peer: int, channel: int, parts: list[np.ndarray] | None = None,
                 tmp: np.ndarray | None = None, reducer: Reducer | None = None,
                 keep: Any = None, ranges: list[tuple[int, int]] | None = None,
                 finished: bool = False) -> None:
        self.peer = peer
        self.channel = channel
        self.works: list[Any] = []
        self.ranges = ranges or []
        self.arrived = 0            # pieces gloo finished (written by the lane)
        self.state = _OK if finished else _PENDING
        self.error: BaseException | None = None
        self._fin = finished
        self._parts = parts
        self._tmp = tmp
        self._reducer = reducer
        self._keep = keep          # the tensor gloo reads or writes (and so its memory)
        self._pos = 0              # bytes of tmp delivered into the parts

    @property
    def done(self) -> bool:
        """True once the message was sent, or arrived and is in the parts (delivering what
        arrived, but in :func:`~ringlet.transport.base.read_only`)."""
        if not self._fin and not base.READ_ONLY.depth:
            self.advance()
        return self._fin

    def advance(self) -> bool:
        """Deliver the pieces gloo has finished (True if any).  A failed message stays
        pending: ``check`` says why (the peer died or closed), for the peers the caller
        watches."""
        if self._fin:
            return False
        n = self.arrived
        if n == 0 or self.state == _FAILED:
            return False
        tmp = self._tmp
        if tmp is not None and self._parts is not None:
            upto = self.ranges[n - 1][1]
            if upto == self._pos:
                return False
            self._pos = base.deliver(self._parts, tmp, self._pos, upto, self._reducer)
        if n == len(self.ranges):
            self._fin = True
            self.works = []
            self._keep = self._tmp = self._parts = None
            return True
        return tmp is not None

    def __repr__(self) -> str:
        state = "done" if self._fin else {_PENDING: "pending", _OK: "arrived",
                                          _FAILED: "failed"}[self.state]
        return f"<_Msg {_CHANNELS.get(self.channel, self.channel)} peer {self.peer} {state}>"


class _Lane:
    """Waits for the gloo requests of one (peer, channel, direction), in posting order."""

    __slots__ = ("t", "key", "cv", "queue", "thread")

    def __init__(self, t: TorchTransport, key: tuple[int, int, int]) -> None:
        self.t = t
        self.key = key
        self.cv = threading.Condition(threading.Lock())
        self.queue: deque[tuple[_Msg, int]] = deque()
        self.thread: threading.Thread | None = None

    def post(self, msg: _Msg, starts: list[Callable[[], Any]]) -> None:
        """Start the gloo operations of the message's pieces and queue them (under the
        lane's lock: the same order)."""
        with self.cv:
            for k, start in enumerate(starts):
                try:
                    msg.works.append(start())
                except RuntimeError as exc:  # the connection is closed already
                    msg.error, msg.state = exc, _FAILED
                    self.t._failed(msg)
                    break
                self.queue.append((msg, k))
            if not self.queue:
                return
            if self.thread is None:
                peer, channel, direction = self.key
                way = "send" if direction == _SEND else "recv"
                self.thread = threading.Thread(
                    target=self._run, daemon=True,
                    name=f"ringlet-gloo-{self.t.rank}-{way}-{peer}-{_CHANNELS.get(channel)}")
                self.thread.start()
            else:
                self.cv.notify()

    def _run(self) -> None:
        while True:
            with self.cv:
                if not self.queue and not self.t._closed:
                    self.cv.wait(_IDLE_S)
                if not self.queue:
                    self.thread = None
                    return
                msg, k = self.queue[0]
            try:
                ok = msg.works[k].wait(_FOREVER)
            except Exception as exc:  # noqa: BLE001 - gloo's error, reported by check()
                msg.error, msg.state = exc, _FAILED
            else:
                if ok is False:
                    msg.error, msg.state = RingletError("gloo abandoned the wait"), _FAILED
                elif msg.state != _FAILED:
                    msg.arrived = k + 1
                    if k + 1 == len(msg.ranges):
                        msg.state = _OK
            with self.cv:
                self.queue.popleft()
            if msg.state == _FAILED:
                self.t._failed(msg)
            self.t._event()

    def alive(self) -> bool:
        th = self.thread
        return th is not None and th.is_alive()

    def join(self, seconds: float) -> None:
        """Wait for the thread to end (after close: the queue drains as gloo fails it)."""
        with self.cv:
            self.cv.notify()
            th = self.thread
        if th is not None:
            th.join(seconds)


# --- heartbeat ---------------------------------------------------------------------------


class _Heartbeat:
    """A counter per rank in the store, bumped every second; the watched peers' are read.

    One per world (the transports of a world's splits share it).  ``start`` is
    called once every rank has set its keys (after the gloo group is built).
    The thread uses its own connection to the store (``clone``), so that a
    blocking store call of the main thread (building a group) does not stop
    the beat, with a short timeout (:data:`_STORE_CALL_S`).

    The last ``release`` stops the thread and joins it.  It must not be inside
    a store call when the interpreter finalizes: a daemon thread that comes
    back from torch's C++ code then is ended by ``pthread_exit``, whose unwind
    through torch's ``noexcept`` frames aborts the process ("terminate called
    without an active exception", exit code -6, after every rank succeeded).
    """

    def __init__(self, store: Any, rank: int, size: int, watch: Iterable[int],
                 interval: float = HEARTBEAT_S, stale: float = STALE_S,
                 linger: float | None = None) -> None:
        self.store, self.rank, self.size = store, rank, size
        self.watch = sorted(set(watch) - {rank})
        #: if this process hosts the job's store: how long it waits at exit for this world's
        #: other ranks to be done with it (see _linger)
        self.linger = linger
        # beats at least three times within ``stale`` (RINGLET_HEARTBEAT_S may be short)
        self.interval, self.stale = min(interval, stale / 3), stale
        self.hosts: dict[int, str] = {}
        self._seen: dict[int, tuple[int, float]] = {}
        self._ok_at = time.monotonic()
        self._users = 1
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._failing = False
        _BEATS.add(self)
        self._pid = os.getpid()   # a child forked from the store's host does not linger
        if linger is not None:
            _HOSTED.append(self)
        store.set(f"host/{rank}", f"host {socket.gethostname()}, pid {os.getpid()}")
        store.set(f"proc/{rank}", f"{machine()} {os.getpid()}")   # see _linger
        store.add(f"beat/{rank}", 1)

    def start(self) -> None:
        if self.watch:
            hosts = self.store.multi_get([f"host/{q}" for q in self.watch])
            self.hosts = {q: h.decode(errors="replace") for q, h in zip(self.watch, hosts,
                                                                       strict=True)}
        now = time.monotonic()
        self._seen = {q: (-1, now) for q in self.watch}
        self._ok_at = now
        try:
            client = self.store.clone()
            client.set_timeout(timedelta(seconds=_STORE_CALL_S))
        except (AttributeError, RuntimeError):
            client = self.store
        # not a daemon: at exit the interpreter joins it (after _close_all, registered to
        # run first, stopped it), so it is never inside a store call when the interpreter
        # finalizes (see the class documentation)
        self._thread = threading.Thread(target=self._run, args=(client,), daemon=False,
                                        name=f"ringlet-heartbeat-{self.rank}")
        self._thread.start()

    def acquire(self) -> None:
        with self._lock:
            self._users += 1

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users <= 0
        if last:
            self._stop.set()
            th = self._thread
            if th is not None and th is not threading.current_thread():
                th.join(_STORE_CALL_S + 1.0)
            if (th is None or not th.is_alive()) and not self._failing:
                # this rank is done with the store: its host may end (see _linger)
                with contextlib.suppress(Exception):
                    self.store.set(f"left/{self.rank}", "1")

    def _run(self, client: Any) -> None:
        mine = f"beat/{self.rank}"
        keys = [f"beat/{q}" for q in self.watch]
        wait = self.interval
        while not self._stop.wait(wait):
            try:
                client.add(mine, 1)
                values = client.multi_get(keys) if keys else []
            except Exception:  # noqa: BLE001 - the store is unreachable: see store_silent()
                # torch's client logs every failure with a C++ stack trace: a store whose
                # host ended is asked ever more rarely (store_silent reads the clock alone)
                self._failing = True
                wait = min(2 * wait, 30.0)
                continue
            self._failing = False
            wait = self.interval
            now = time.monotonic()
            for q, v in zip(self.watch, values, strict=True):
                n = int(v)
                if n != self._seen[q][0]:
                    self._seen[q] = (n, now)
            self._ok_at = now

    def silent(self, q: int) -> float | None:
        """Seconds rank q's counter had not moved at the last read, if more than ``stale``."""
        seen = self._seen.get(q)
        if seen is None:
            return None
        gap = self._ok_at - seen[1]
        return gap if gap > self.stale else None

    def store_silent(self) -> float | None:
        """Seconds since the store last answered, if more than ``stale``."""
        if not self._seen:
            return None
        gap = time.monotonic() - self._ok_at
        return gap if gap > self.stale + self.interval else None

    def host(self, q: int) -> str:
        return self.hosts.get(q, "unknown host")


# --- the transport -------------------------------------------------------------------------

_LIVE: weakref.WeakSet[TorchTransport] = weakref.WeakSet()


def _close_all() -> None:
    """At exit, say CLOSED and close the groups while gloo's threads still run, make sure
    no lane is still inside a gloo wait (of any group, closed earlier too), and stop every
    heartbeat.  Runs when the main thread ends, before the interpreter joins the threads
    that are not daemons (the heartbeats), and again as an atexit (a no-op then).

    A lane (a daemon thread) that comes back from a gloo wait after the interpreter
    finalized is ended by ``pthread_exit``, whose unwind through pybind11's GIL guard (a
    destructor: ``noexcept``) aborts the process ("terminate called without an active
    exception", SIGABRT, after every rank succeeded)."""
    for t in list(_LIVE):
        with contextlib.suppress(Exception):
            t.mark_closed()
        with contextlib.suppress(Exception):
            t.close()
    for t in list(_ALL):
        with contextlib.suppress(Exception):
            t._end_lanes(_EXIT_LANES_S)
    for hb in list(_BEATS):
        hb._stop.set()
    _linger()
    _HOSTED.clear()


_BEATS: weakref.WeakSet[_Heartbeat] = weakref.WeakSet()
#: the job's store if this process hosts it (rank 0 of torch's env:// rendezvous outside
#: torchrun), and the heartbeats of the worlds on it
_HOST: list[Any] = []
_HOSTED: list[_Heartbeat] = []


def _linger() -> None:
    """At exit, the store's host waits until every other rank of its worlds is done with
    the store (its last heartbeat stopped: key ``left/<rank>``), is known dead (to a
    transport, or a process of this machine that is gone), has stopped beating (dead or
    stuck: ``stale`` seconds), or the world's deadline passed.  A host that ended
    first made the others' heartbeats and closes fail, each failure logged by torch's
    client with a C++ stack trace.  torchrun's agent, which hosts the store there, waits
    for every worker the same way."""
    with contextlib.suppress(KeyboardInterrupt):   # Ctrl-C at exit: stop waiting
        _linger_for([hb for hb in _HOSTED if hb._pid == os.getpid()])


def _gone(pid: int) -> bool:
    """Whether process ``pid`` of this machine has ended (a zombie has)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[:1] in (["Z"], ["X"])
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False


def _linger_for(beats: list[_Heartbeat]) -> None:
    start = time.monotonic()
    told = False
    for hb in list(beats):
        # a peer this rank's transports know is dead, or whose beat had stopped, is not
        # waited for
        dead = {t._world[q] for t in list(_ALL) if t._hb is hb for q in t._dead}
        dead |= {q for q in hb.watch if hb.silent(q) is not None}
        others = [q for q in range(hb.size) if q != hb.rank and q not in dead]
        # a peer on this machine whose process is gone (killed, say) is not waited for
        # either: its beat would take ``stale`` seconds to stop, longer than a launcher's
        # grace before it ends the survivors (ringlet run's: 3 s)
        try:
            procs = dict(zip(others, hb.store.multi_get([f"proc/{q}" for q in others]),
                             strict=True))
        except Exception:  # noqa: BLE001 - nothing to wait for without the store
            return
        here, pids = machine(), {}
        for q, v in procs.items():
            where, _, pid = v.decode(errors="replace").rpartition(" ")
            if where == here and pid.isdigit():
                pids[q] = int(pid)
        seen = {q: (b"", start) for q in others}
        nap = 0.001
        while others:
            now = time.monotonic()
            try:
                left = [q for q in others if hb.store.check([f"left/{q}"])]
                counts = hb.store.multi_get([f"beat/{q}" for q in others])
            except Exception:  # noqa: BLE001 - nothing to wait for without the store
                return
            for q, b in zip(others, counts, strict=True):
                if b != seen[q][0]:
                    seen[q] = (b, now)
            others = [q for q in others if q not in left and now - seen[q][1] <= hb.stale
                      and not (q in pids and _gone(pids[q]))]
            if not others or now - start > (hb.linger or 0.0):
                break
            if not told and now - start > 5.0:
                told = True
                print(f"ringlet: rank {hb.rank} hosts the job's torch store and waits for "
                      f"rank{'s' if len(others) > 1 else ''} {', '.join(map(str, others))} "
                      f"to close ringlet (at most {hb.linger:g} s, RINGLET_TIMEOUT)",
                      file=sys.stderr, flush=True)
            time.sleep(nap)
            nap = min(2 * nap, 0.05)


#: every transport, closed or not, whose lanes may still run (see _close_all)
_ALL: weakref.WeakSet[TorchTransport] = weakref.WeakSet()
atexit.register(_close_all)
with contextlib.suppress(AttributeError, RuntimeError):
    threading._register_atexit(_close_all)  # type: ignore[attr-defined]


def _meet(keys: Any, me: int, size: int, name: Callable[[int], int], settings: Settings,
          what: Callable[[], str], check: Callable[[], None] | None,
          failed: Callable[[], str], timeout: float | None = None) -> None:
    """Say that member ``me`` of a new gloo group came (key ``here/<me>`` in ``keys``, the
    group's store prefix) and wait, polling under the deadline and calling ``check``,
    until all ``size`` members have: gloo's constructor waits for them without a
    deadline of ringlet's and without noticing one that died (up to the group's gloo
    timeout).  A timeout names the members that did not come (``name``: a member's rank
    in messages); a store that fails is a PeerError (``failed``: what was going on)."""
    every = [f"here/{i}" for i in range(size)]

    def store(op: Callable[[], Any]) -> Any:
        try:
            return op()
        except Exception as exc:  # noqa: BLE001 - the store's host ended or is unreachable
            if check is not None:
                check()   # a peer that died or aborted says it better
            raise PeerError(f"{failed()} ({_first_line(exc)})") from None

    def came(which: list[str]) -> bool:
        return bool(store(lambda: keys.check(which)))

    def absent() -> list[int]:
        return [name(i) for i in range(size) if not came([f"here/{i}"])]

    store(lambda: keys.set(f"here/{me}", "1"))
    if came(every):
        return
    store_wait(Waiter(settings, what, absent, check, timeout=timeout), lambda: came(every),
               max(settings.liveness_s, 0.01))


def store_wait(waiter: Waiter, came: Callable[[], bool], slice_s: float) -> None:
    """Wait until keys are in the job's store under ``waiter`` (its deadline and checks):
    ``came()`` asks the store whether they are (and raises if the store failed), after
    naps that grow from 1 ms to ``slice_s`` (a poll of every key by every rank, thousands
    of times a second, would load the store's host at scale).  Not the store's own wait
    in slices: each slice that ended without the keys made torch's store client log a
    warning ("waitForInput ... likely a timeout"), a dozen of them on stderr in a job of
    4 ranks that went well."""
    nap = 0.001
    while not came():
        waiter.tick()
        time.sleep(nap)
        nap = min(2 * nap, slice_s)


class TorchTransport(Transport):
    """ringlet's messages on a private ``ProcessGroupGloo`` (see the module documentation).

    ``store`` is the job's torch store (not prefixed); the group and every key
    of this transport live under ``prefix``.  ``remote`` are the peers this
    transport runs agreement and status for (and watches): by default every
    other rank.  A routed transport passes the peers on other hosts and then
    calls messages, ``progress`` and ``wait`` for those peers only.
    ``world_ranks`` maps this group's ranks to the world's (for the heartbeat,
    which ``heartbeat`` passes on to splits); ``names``, the ranks its messages
    name (by default its own numbering: a rail group's are the communicator's
    ranks).  Building it waits for every rank of the group (collective), under the
    deadline and calling ``watch`` (a split's: see :meth:`split`) between polls.
    """

    caps = Caps(engine="torch", native=frozenset(_NATIVE))

    def __init__(self, store: Any, rank: int, size: int, settings: Settings, prefix: str,
                 remote: Sequence[int] | None = None, *,
                 world_ranks: Sequence[int] | None = None,
                 heartbeat: _Heartbeat | None = None,
                 names: Sequence[int] | None = None,
                 watch: Callable[[], None] | None = None) -> None:
        dist = _dist()
        self._d = dist
        self.rank, self.size, self.prefix = rank, size, prefix
        self.names = list(range(size)) if names is None else list(names)
        #: the settings every wait of this communicator uses: no spinning, which would hold
        #: the GIL that the lane threads need to report a message (a spinning wait made a
        #: 2-rank barrier 2.8 ms, the time a waiting thread gives up the GIL; see _Lane)
        self.settings = settings.replace(spin_us=0.0, yield_us=0.0)
        self.remote = [q for q in (range(size) if remote is None else remote) if q != rank]
        self._remote_set = frozenset(self.remote)
        # the world's ranks, for the heartbeat (a split shares its world's)
        self._world = list(range(size)) if heartbeat is None or world_ranks is None \
            else list(world_ranks)
        self._store = store
        self._lock = threading.Lock()
        self._cv = threading.Condition(threading.Lock())
        self._events = 0
        self._lanes: dict[tuple[int, int, int], _Lane] = {}
        self._coll: list[_Msg] = []
        self._notices: list[_Msg] = []      # STATUS sends (abort, closed) in flight
        #: messages to this rank itself, by channel (gloo has no pair to itself): the sends
        #: not yet received (copies) or the receives not yet sent, in order (:meth:`_self`)
        self._selfq: dict[int, deque[tuple[bool, Any]]] = {}
        self._dead: dict[int, str] = {}
        self._closed = False
        self.describe: Callable[[], str] = lambda: "a collective"
        self._given = settings
        self._keys = dist.PrefixStore(f"{prefix}/", store)
        if heartbeat is None:   # a world: its ranks meet first (a split's met in split())
            _meet(self._keys, rank, size, lambda q: self.names[q], settings,
                  lambda: f"building ringlet's gloo group of {size} ranks", None,
                  lambda: f"rank {self.names[rank]}: the job's store failed while ringlet's "
                          f"gloo group of {size} ranks was built",
                  timeout=max(settings.timeout, settings.init_timeout))
        else:
            self._keys.set(f"here/{rank}", "1")   # for the message if some rank never comes
        if heartbeat is None:
            self._hb = _Heartbeat(dist.PrefixStore(f"{prefix}/hb/", store), rank, size,
                                  [self._world[q] for q in self.remote],
                                  stale=settings.heartbeat_s,
                                  linger=settings.timeout if any(store is h for h in _HOST)
                                  else None)
            own_hb = True
        else:
            self._hb = heartbeat
            heartbeat.acquire()
            own_hb = False
        try:
            self._pg = self._build(dist.PrefixStore(f"{prefix}/pg/", store), watch)
        except (RuntimeError, ValueError) as exc:
            self._hb.release()
            raise self._start_error(exc) from None
        except BaseException:
            self._hb.release()
            raise
        if own_hb:
            self._hb.start()
        self._agree = MessageAgreement(self, self.remote)
        self._status = StatusBoard(self, self.remote)
        _LIVE.add(self)
        _ALL.add(self)

    def _build(self, store: Any, watch: Callable[[], None] | None) -> Any:
        """gloo's group: its constructor, on a thread of its own while this one waits
        under the deadline (both of them: building is collective) and calls ``watch``.

        The members met in the store before, but one can still fail or die while the
        group is built, and the constructor then waits for it without noticing, up to
        the group's gloo timeout (the deadline + :data:`_GLOO_MARGIN_S`).  A wait that
        ends in an error leaves the thread there: it ends when the constructor does,
        and what it built is dropped."""
        settings = self.settings
        limit = max(settings.timeout, settings.init_timeout)
        size, rank = self.size, self.rank
        built: dict[str, Any] = {}
        done = threading.Event()

        def build() -> None:
            try:
                built["pg"] = self._d.ProcessGroupGloo(
                    store, rank, size, timedelta(seconds=limit + _GLOO_MARGIN_S))
            except BaseException as exc:  # noqa: BLE001 - raised by the waiting thread
                built["error"] = exc
            finally:
                done.set()

        threading.Thread(target=build, name="ringlet-gloo-build", daemon=True).start()
        waiter = Waiter(
            settings, lambda: f"building ringlet's gloo group of {size} ranks", list, watch,
            timeout=limit,
            advice=lambda: (
                "every member came to the store, but gloo's constructor did not finish: a "
                "member may have failed or died while building it (ranks on other hosts: "
                "check that they can reach each other)"))
        slice_s = min(max(settings.liveness_s, 0.01), 0.1)
        while not done.wait(slice_s):
            waiter.tick()
        if "error" in built:
            raise built["error"]
        return built["pg"]

    def _start_error(self, exc: BaseException) -> RingletError:
        """Why the group could not be built, naming the ranks that never came."""
        try:
            absent = [self.names[q] for q in range(self.size)
                      if not self._keys.check([f"here/{q}"])]
        except Exception:  # noqa: BLE001 - only for the message
            absent = []
        who = (f": rank{'s' if len(absent) > 1 else ''} {', '.join(map(str, absent))} never "
               f"came") if absent else ""
        text = _first_line(exc)
        if "time" in text.lower():
            return CommTimeoutError(f"rank {self.names[self.rank]}: timed out building "
                                    f"ringlet's gloo group of {self.size} ranks{who} ({text})")
        return PeerError(f"rank {self.names[self.rank]}: could not build ringlet's gloo group "
                         f"of {self.size} ranks{who} ({text})")

    # --- lanes ------------------------------------------------------------------------

    def _lane(self, peer: int, channel: int, direction: int) -> _Lane:
        key = (peer, channel, direction)
        lane = self._lanes.get(key)
        if lane is None:
            with self._lock:
                lane = self._lanes.get(key)
                if lane is None:
                    lane = self._lanes[key] = _Lane(self, key)
        return lane

    def _event(self) -> None:
        """A lane finished a request: wake the waits."""
        with self._cv:
            self._events += 1
            self._cv.notify_all()

    def _failed(self, msg: _Msg) -> None:
        """A request failed.  The STATUS receive of a peer is posted until the peer says
        CLOSED (or aborts): when it fails, the peer died or its connection broke."""
        if self._closed or msg.channel != STATUS:
            return
        q = msg.peer
        if q not in self._dead:
            why = _gloo_message(msg.error) if msg.error is not None else "unknown error"
            self._dead[q] = (f"rank {self.names[q]} ({self._hb.host(self._world[q])}) died "
                             f"or its connection failed (gloo: {why})")

    # --- messages -----------------------------------------------------------------------

    def isend(self, peer: int, parts: Sequence[np.ndarray], channel: int = COLL) -> _Msg:
        """Send ``parts`` (uint8 views) to ``peer`` on ``channel`` (packed into one message)."""
        parts = [p for p in parts if p.size]
        if not parts:
            return _Msg(peer, channel, finished=True)
        if peer == self.rank:
            return self._self(_Msg(peer, channel, finished=True), np.concatenate(parts))
        buf = parts[0] if len(parts) == 1 else np.concatenate(parts)
        if not buf.flags.c_contiguous:
            buf = np.ascontiguousarray(buf)
        tensor = _tensor(buf)
        msg = _Msg(peer, channel, keep=tensor, ranges=_pieces(buf.nbytes))
        self._lane(peer, channel, _SEND).post(msg, self._starts(tensor, msg, peer, channel,
                                                                self._pg.send))
        if channel == COLL:
            self._coll.append(msg)
        elif channel == STATUS:
            self._notices.append(msg)
        return msg

    def irecv(self, peer: int, parts: Sequence[np.ndarray], reducer: Reducer | None = None,
              channel: int = COLL) -> _Msg:
        """Receive from ``peer`` into ``parts`` (typed views), copied or reduced on arrival."""
        parts = [p for p in parts if p.size]
        if not parts:
            return _Msg(peer, channel, finished=True)
        if peer == self.rank:
            return self._self(_Msg(peer, channel, parts=parts, reducer=reducer), None)
        p0 = parts[0]
        if len(parts) == 1 and reducer is None and p0.flags.c_contiguous and p0.flags.writeable:
            target = p0.reshape(-1).view(np.uint8)         # lands in place
            msg = _Msg(peer, channel)
        else:
            target = np.empty(sum(p.nbytes for p in parts), np.uint8)
            msg = _Msg(peer, channel, parts=parts, tmp=target, reducer=reducer)
        tensor = _tensor(target)
        msg._keep = tensor
        msg.ranges = _pieces(target.nbytes)
        self._lane(peer, channel, _RECV).post(msg, self._starts(tensor, msg, peer, channel,
                                                                self._pg.recv))
        if channel == COLL:
            self._coll.append(msg)
        return msg

    def _self(self, msg: _Msg, data: np.ndarray | None) -> _Msg:
        """A message of this rank to itself (a rank alone on its node, whose every peer
        is the engine's): gloo has no connection to its own rank, so the send (``data``,
        a copy: the send is done at once, as an eager one) meets the receive here, in
        posting order per channel, as gloo's messages between two ranks do."""
        with self._lock:
            q = self._selfq.setdefault(msg.channel, deque())
            if q and q[0][0] == (data is None):   # the other side came first
                other = q.popleft()[1]
                recv, data = (msg, other) if data is None else (other, data)
            else:
                q.append((data is not None, msg if data is None else data))
                return msg
        base.deliver(recv._parts, data, 0, data.nbytes, recv._reducer)  # type: ignore[arg-type]
        recv._parts = recv._reducer = None
        recv.state, recv._fin = _OK, True
        self._event()
        return msg

    @staticmethod
    def _starts(tensor: Any, msg: _Msg, peer: int, channel: int,
                op: Callable[[list[Any], int, int], Any]) -> list[Callable[[], Any]]:
        """The gloo send or receive of each piece of ``msg`` (started by its lane)."""
        if len(msg.ranges) == 1:
            return [functools.partial(op, [tensor], peer, channel)]
        return [functools.partial(op, [tensor[lo:hi]], peer, channel) for lo, hi in msg.ranges]

    def progress(self) -> bool:
        """Finish every collective request that gloo has finished; True if any."""
        return self._progress()

    def _progress(self) -> bool:
        moved = False
        if self._coll:
            pending = []
            for m in self._coll:
                moved |= m.advance()
                if not m._fin:
                    pending.append(m)
            self._coll = pending
        return moved

    def events(self) -> int:
        return self._events

    def idle(self, seen: int, waiter: Waiter,
             peers: Callable[[], Sequence[int] | None] | None = None) -> None:
        """Nap until a lane (or gloo's completion callback) reports, at most _NAP_S,
        unless one has since ``seen``; then the waiter's checks.  A wait that polled
        instead holds the GIL the lanes need, or sleeps past their reports (a 2-rank
        point-to-point round trip took 0.95 ms with sleeps, 0.51 ms with naps); one
        that blocked until the report made 4 ranks on 2 cores slower (an 8 B
        hierarchical all_reduce 3.6 ms, against 2.3 ms with naps: on this virtual
        machine a core that went idle wakes late)."""
        if self._in_background(waiter):
            return
        with self._cv:
            if self._events == seen:
                self._cv.wait(_NAP_S)
        waiter.tick()

    def wait(self, reqs: Sequence[Request], what: Callable[[], str]) -> None:
        """Finish the requests as their lanes report them, within the deadline."""
        if all(r.done for r in reqs):
            return
        waiter = Waiter(self.settings, what, lambda: [r.peer for r in reqs if not r.done],
                        lambda: self.check([r.peer for r in reqs if not r.done]),
                        absent=ROUND_ABSENT)
        while True:
            seen = self._events
            moved = self._progress()
            for r in reqs:
                if not r.done:
                    moved |= r.advance()
            if all(r.done for r in reqs):
                return
            if not moved:
                self.idle(seen, waiter)

    def discard_pending(self) -> None:
        """Forget pending collective requests (the communicator is being aborted).

        gloo cannot cancel them: a receive may still land in its buffer until close()."""
        self._coll = []

    # --- agreement ------------------------------------------------------------------------

    def publish(self, seq: int, words: Sequence[int], note: str | None = None,
                to: Sequence[int] | None = None) -> None:
        self._agree.publish(seq, words, note, to)

    def tell_node(self, seq: int, words: Sequence[int] | None, to: Sequence[int]) -> None:
        self._agree.tell_node(seq, words, to)

    def node_desc(self, q: int, seq: int) -> tuple[int, ...] | None:
        return self._agree.node_desc(q, seq)

    def latest_node(self, q: int) -> tuple[int, tuple[int, ...]] | None:
        return self._agree.latest_node(q)

    def peer_desc(self, q: int, seq: int) -> tuple[int, ...] | None:
        return self._agree.peer_desc(q, seq)

    def note(self, q: int, seq: int) -> str:
        return self._agree.note(q, seq)

    def latest_desc(self, q: int) -> tuple[int, tuple[int, ...]] | None:
        return self._agree.latest(q)

    # --- liveness ---------------------------------------------------------------------------

    def check(self, watch: Sequence[int] | None = None, what: str | None = None) -> None:
        """Raise if a peer aborted, or a watched remote peer closed, died or stopped answering.

        Cheap: it reads what the lanes and the heartbeat thread found."""
        if self.watch_also is not None:
            self.watch_also(None, what)
        status = self._status
        status.poll()
        if status.error is not None:
            err = status.error
            raise type(err)(str(err))
        for q in self.remote if watch is None else watch:
            if q not in self._remote_set:
                continue
            done = status.closed.get(q)
            if done is not None:
                closed = self.closed_error(self.names[q], done, what)
                if closed is not None:
                    raise closed
                continue
            dead = self._dead.get(q)
            if dead is not None:
                raise PeerError(f"{dead}; {what or self.describe()} cannot complete")
            w = self._world[q]
            gap = self._hb.silent(w)
            if gap is not None:
                raise PeerError(
                    f"rank {self.names[q]} ({self._hb.host(w)}) stopped answering: its "
                    f"heartbeat has not moved for {gap:.0f} s (the process hangs or was "
                    f"stopped, or its host is down; or it held Python's GIL that long in one "
                    f"call into C: RINGLET_HEARTBEAT_S={self._hb.stale:g} sets the limit); "
                    f"{what or self.describe()} cannot complete")
            if w == 0:
                gap = self._hb.store_silent()
                if gap is not None:
                    raise PeerError(
                        f"rank {self.names[q]} ({self._hb.host(w)}) stopped answering: the "
                        f"job's store (on rank 0's or the torchrun agent's host) has not "
                        f"answered for {gap:.0f} s; {what or self.describe()} cannot complete")

    def abort(self, message: str, timeout: bool = False, tell: bool = True,
              unsure: bool = False) -> None:
        """Tell every remote peer to fail with ``message`` (CommTimeoutError if
        ``timeout``); with ``tell`` False (the node's shared memory told this rank,
        whose first failing rank told the others) nothing is sent.  gloo fails a send
        to a dead peer cleanly, so it tells them when ``unsure`` too."""
        if not self._closed and tell:
            self._status.tell(ABORT_TIMEOUT if timeout else ABORT_PEER, message)

    def mark_closed(self) -> None:
        """Tell the remote peers this rank closed the communicator (sent before returning)."""
        if self._closed:
            return
        self._status.tell(CLOSED, str(self.calls()[1]))
        self._flush()

    def close(self) -> None:
        """Close gloo's connections (ending every pending request and lane); idempotent."""
        if self._closed:
            return
        try:
            self._status.tell(CLOSED, str(self.calls()[1]))    # unless an abort or CLOSED was said
            self._flush()
        finally:
            self._closed = True
            _LIVE.discard(self)
            self._end_lanes(_CLOSE_LANES_S)
            self._coll = []
            self._hb.release()

    def _end_lanes(self, seconds: float) -> bool:
        """Close gloo's connections until every lane thread has ended (True), for up to
        ``seconds``; the group is dropped once they have.  Once no connection is left to
        close (twice: the lanes get a moment to see the last ones close) a lane still
        waiting is one gloo will never end, so this gives up (False) rather than spend
        ``seconds`` on it: after a peer died the survivors' exit took up to 12 s so."""
        deadline = time.monotonic() + seconds
        futile = 0
        while self._pg is not None:
            alive = [lane for lane in self._lanes.values() if lane.alive()]
            if not alive:
                self._pg = None
                return True
            if time.monotonic() >= deadline:
                return False
            if not self._kill():
                futile += 1
                if futile > 1:
                    return False
            for lane in alive:
                lane.join(max(0.0, min(0.5, deadline - time.monotonic())))
        return True

    def _flush(self) -> None:
        """Give the notices in flight up to _FLUSH_S to leave (a notice to a peer that is
        gone fails: it is not waited for)."""
        end = time.monotonic() + _FLUSH_S
        while time.monotonic() < end:
            self._notices = [m for m in self._notices if not m.done and m.state != _FAILED]
            if not self._notices:
                return
            with self._cv:
                self._cv.wait(0.005)

    def _kill(self) -> bool:
        """End every pending gloo operation of the group: let a receive that nobody will
        match time out, which makes gloo close every connection of the group (the only
        way torch 2.13 offers: ``ProcessGroupGloo.abort`` leaves waits blocked; see the
        module documentation).  A receive on a connection a peer already closed fails
        without a timeout and closes only that one: then the next peer is tried.  True
        if a timeout closed them."""
        torch = _torch()
        for q in range(self.size):
            if q == self.rank:
                continue
            try:
                w = self._pg.recv([torch.empty(1, dtype=torch.uint8)], q, _KILL_TAG)
                w.wait(timedelta(milliseconds=1))
            except RuntimeError as exc:
                if "timed out" in str(exc).lower():
                    return True
                continue  # that connection is closed already: try another
        return False

    # --- groups -------------------------------------------------------------------------

    def split(self, ranks: Sequence[int], token: str,
              remote: Sequence[int] | None = None, *, names: Sequence[int] | None = None,
              watch: Callable[[], None] | None = None) -> TorchTransport:
        """A new gloo group of ``ranks`` (its members call this), under a prefix named by
        ``token``; it shares this world's heartbeat.  ``remote`` as in the constructor
        (numbered in the group; default every other member); ``names``, the ranks its
        messages name (default its own numbering).

        gloo's constructor waits for every member without a deadline of ringlet's and
        without noticing a member that died (up to the group's gloo timeout, init_timeout
        + 30 s), so the members first meet in the store under a :class:`Waiter`: this
        rank's deadline, and ``watch`` (default :meth:`check`: this transport's peers)
        between polls.  A member that failed or died before it came to build the group
        then ends the wait within the liveness interval, and a timeout names the members
        that did not come (in this transport's numbering)."""
        ranks = list(ranks)
        me = ranks.index(self.rank)
        prefix = f"{self.prefix}/s{token}"
        self._meet(prefix, ranks, me, watch)
        return TorchTransport(
            self._store, me, len(ranks), self._given, prefix, remote=remote,
            world_ranks=[self._world[r] for r in ranks], heartbeat=self._hb, names=names,
            watch=watch if watch is not None else self.check)

    def _meet(self, prefix: str, ranks: list[int], me: int,
              watch: Callable[[], None] | None) -> None:
        """Wait until every member of the group ``prefix`` of ``ranks`` has said it came
        (the key the group's constructor sets too; see :meth:`split`)."""
        _meet(self._d.PrefixStore(f"{prefix}/", self._store), me, len(ranks),
              lambda i: ranks[i], self.settings,
              lambda: f"{self.describe()}, building the gloo group of ranks {ranks}",
              watch if watch is not None else self.check,
              lambda: f"rank {self.names[self.rank]}: the job's store failed while the gloo "
                      f"group of ranks {ranks} was built in {self.describe()}")

    # --- the engine's own collectives -----------------------------------------------------

    def native_refusal(self, collective: str, op: Any, dtype: Any) -> str | None:
        """gloo reduces only some types and ops as ringlet does (see :meth:`native_start`)."""
        return _refusal(ReduceOp.parse(op), dtype.name, dtype.np_dtype.kind)

    def native_start(self, collective: str, root: int, count: int,
                     bufs: dict[int, np.ndarray], op: Any, what: Callable[[], str],
                     dtype: Any = None) -> base.NativeCall:
        """Start ``collective`` as gloo's own implementation (see the base class); gloo's
        threads run it while this rank goes on, and its ``wait()`` polls it within the
        deadline.

        Data movement (broadcast, all_gather, all_to_all, scatter, gather)
        works for every element type (bytes are moved).  reduce_scatter runs
        gloo's allreduce on a copy of the input and keeps this rank's block:
        torch 2.13's own gloo reduce_scatter is an allreduce per block whose
        ``Work`` never reports completion, so it cannot be waited for under a
        deadline.  Reductions
        (all_reduce, reduce, reduce_scatter) follow what gloo computes:
        int8, uint8, int32 and int64 with SUM, PROD, MIN, MAX; float16,
        float32, float64 and bfloat16 with SUM and PROD (gloo's MIN and MAX do
        not propagate NaN as numpy's do); bool with every op but the logical
        ones (SUM is OR and PROD is AND, as in ringlet); complex with SUM only;
        BAND, BOR and BXOR on every integer type (bitwise, byte by byte).  The
        rest (:func:`_refusal`: logical ops, MINLOC and MAXLOC, int16, uint16,
        uint32 and uint64 arithmetic, float MIN and MAX, complex PROD) raises
        ArgumentError; the communicator asks :meth:`native_refusal` first, so
        that it is refused before the call.  bfloat16 travels as int16 arrays:
        pass ``dtype`` (a :class:`ringlet.ops.DType` or its name) to reduce it
        as bfloat16.
        """
        if collective not in _NATIVE:
            raise ArgumentError(f"no native {collective} in the torch transport; native "
                                f"collectives: {', '.join(_NATIVE)}")
        if count == 0:
            return base.NativeCall(None)
        torch = _torch()
        dist = self._d
        n = self.size
        src, out = bufs.get(0), bufs.get(1)
        if collective in ("all_reduce", "reduce", "reduce_scatter"):
            if op is None:
                raise ArgumentError(f"native {collective} needs a reduction op")
            if collective == "all_reduce":
                t, top = _reduction(torch, dist, _need(out, count, "OUT"), op, dtype, collective)
                opts = dist.AllreduceOptions()
                opts.reduceOp = top
                work = self._pg.allreduce([t], opts)
            elif collective == "reduce":
                s, d = _need(src, count, "IN"), _need(out, count, "OUT")
                t, top = _reduction(torch, dist, d, op, dtype, collective)
                if not np.shares_memory(s, d):
                    d[...] = s
                opts = dist.ReduceOptions()
                opts.reduceOp, opts.rootRank, opts.rootTensor = top, root, 0
                work = self._pg.reduce([t], opts)
            else:
                # torch 2.13's gloo reduce_scatter is one allreduce per block behind a Work
                # whose is_completed() never turns True (not even after wait()): it cannot
                # run under ringlet's deadline.  One allreduce of a copy of the input moves
                # the same bytes; this rank keeps its block.
                s, d = _need(src, n * count, "IN"), _need(out, count, "OUT")
                whole = s.copy()
                t, top = _reduction(torch, dist, whole, op, dtype, collective)
                opts = dist.AllreduceOptions()
                opts.reduceOp = top
                rs_work = self._pg.allreduce([t], opts)

                def keep_block() -> None:
                    self._await(rs_work, collective, what)
                    d[...] = whole[self.rank * count:(self.rank + 1) * count]

                return base.NativeCall(keep_block, (rs_work, whole))
        elif collective == "broadcast":
            opts = dist.BroadcastOptions()
            opts.rootRank, opts.rootTensor = root, 0
            work = self._pg.broadcast([_bytes(_need(out, count, "OUT"))], opts)
        elif collective == "all_gather":
            t_in = _bytes(_need(src, count, "IN"))
            outs = _blocks(_bytes(_need(out, n * count, "OUT")), n)
            work = self._pg.allgather([outs], [t_in])
        elif collective == "all_to_all":
            work = self._pg.alltoall_base(_bytes(_need(out, n * count, "OUT")),
                                          _bytes(_need(src, n * count, "IN")), [], [],
                                          dist.AllToAllOptions())
        elif collective == "scatter":
            opts = dist.ScatterOptions()
            opts.rootRank = root
            t_out = _bytes(_need(out, count, "OUT"))
            ins = [_blocks(_bytes(_need(src, n * count, "IN")), n)] if self.rank == root else []
            work = self._pg.scatter([t_out], ins, opts)
        else:  # gather
            opts = dist.GatherOptions()
            opts.rootRank = root
            t_in = _bytes(_need(src, count, "IN"))
            outs = [_blocks(_bytes(_need(out, n * count, "OUT")), n)] if self.rank == root \
                else []
            work = self._pg.gather(outs, [t_in], opts)
        return base.NativeCall(lambda: self._await(work, collective, what), (work, bufs))

    def _await(self, work: Any, collective: str, what: Callable[[], str]) -> None:
        """Poll a gloo collective until it completes, within the deadline."""
        if not work.is_completed():
            waiter = Waiter(self.settings, what, lambda: [], lambda: self.check(None, what()),
                            advice=lambda: (
                                f"gloo's own {collective} did not finish although every rank "
                                f"entered the call: a rank hangs or its connection is slow. If "
                                f"the peers are just slow, raise RINGLET_TIMEOUT (seconds)"))
            # gloo's worker thread runs the callback when the collective ends or fails, and
            # idle() wakes at its report.  The callback's own flag ends the wait: it runs
            # *before* is_completed() turns True, so a wait that asked is_completed()
            # after the wake-up napped once more (with 20 ms naps, 20 ms late in 2 of 16
            # waits on the test bed).  The naps stay short: longer ones, which the
            # callback would end as well, made a 64 KiB hierarchical all_reduce on the
            # test bed slower (6.7 ms with 10 ms naps against 6.0), as a core that went
            # idle wakes late on this machine
            ended: list[bool] = []

            def done(_f: Any) -> None:
                ended.append(True)
                self._event()

            work.get_future().add_done_callback(done)
            while True:
                seen = self._events
                if ended or work.is_completed():
                    break
                self.idle(seen, waiter)
        try:
            work.wait()
        except RuntimeError as exc:
            # a peer that died or aborted says it better; its STATUS lane may report a
            # closed connection a few milliseconds after gloo's collective failed
            end = time.monotonic() + _GRACE_S
            while True:
                self.check(None, what())
                if time.monotonic() >= end:
                    break
                with self._cv:
                    self._cv.wait(0.01)
            raise PeerError(f"rank {self.names[self.rank]}: gloo's {collective} failed in "
                            f"{what()}: {_gloo_message(exc)}") from None


#: element types gloo reduces arithmetically (numpy name -> torch name)
_ARITH = {"int8": "int8", "uint8": "uint8", "int32": "int32", "int64": "int64",
          "float16": "float16", "float32": "float32", "float64": "float64", "bool": "bool"}
_TORCH_OPS = {ReduceOp.SUM: "SUM", ReduceOp.PROD: "PRODUCT", ReduceOp.MIN: "MIN",
              ReduceOp.MAX: "MAX", ReduceOp.BAND: "BAND", ReduceOp.BOR: "BOR",
              ReduceOp.BXOR: "BXOR"}
#: on bool, ringlet's SUM is OR and PROD is AND (numpy's add and multiply on bool); gloo adds
#: the bytes (1 + 1 = 2), so they run as MAX and MIN
_BOOL_OPS = {ReduceOp.SUM: ReduceOp.MAX, ReduceOp.PROD: ReduceOp.MIN}


def _torch() -> Any:
    import torch

    return torch


def _tensor(a: np.ndarray) -> Any:
    """``torch.from_numpy(a)``: shares the memory (read-only arrays too, gloo only reads)."""
    torch = _torch()
    if a.flags.writeable:
        return torch.from_numpy(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(a)


def _need(a: np.ndarray | None, count: int, name: str) -> np.ndarray:
    if a is None:
        raise ArgumentError(f"native collective: buffer {name} is missing")
    if a.size < count:
        raise ArgumentError(f"native collective: buffer {name} holds {a.size} elements, "
                            f"{count} needed")
    return a.reshape(-1)[:count]


def _bytes(a: np.ndarray) -> Any:
    return _tensor(a.view(np.uint8))


def _blocks(t: Any, n: int) -> list[Any]:
    b = t.numel() // n
    return [t[i * b:(i + 1) * b] for i in range(n)]


def _refusal(rop: ReduceOp, name: str, kind: str) -> str | None:
    """Why gloo cannot compute ``rop`` on elements of type ``name`` (numpy kind ``kind``)
    as ringlet defines it, or None (AVG aside: the communicator sums and divides)."""
    if rop in (ReduceOp.LAND, ReduceOp.LOR, ReduceOp.LXOR):
        return f"gloo has no logical {rop.name}; use a ringlet algorithm (algorithm=None chooses)"
    if rop not in _TORCH_OPS:   # MINLOC, MAXLOC
        return f"gloo has no {rop.name}; use a ringlet algorithm (algorithm=None chooses)"
    if rop in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        return f"bitwise {rop.name} is not defined for {name}" \
            if kind in "fc" or name == "bfloat16" else None
    if rop in (ReduceOp.MIN, ReduceOp.MAX) and (kind == "f" or name == "bfloat16"):
        return (f"gloo's {rop.name} on {name} does not propagate NaN as ringlet's (numpy's) "
                f"does; use a ringlet algorithm (algorithm=None chooses)")
    if name == "bfloat16":
        return None
    if kind == "c":
        return None if rop is ReduceOp.SUM else (
            f"gloo reduces {name} with SUM only, not {rop.name}; use another algorithm "
            f"(algorithm=None chooses)")
    if name not in _ARITH:
        return (f"gloo has no {name} arithmetic ({rop.name}); it reduces "
                f"{', '.join(sorted(_ARITH))}, bfloat16 and complex (SUM); use another "
                f"algorithm (algorithm=None chooses)")
    return None


def _reduction(torch: Any, dist: Any, a: np.ndarray, op: Any, dtype: Any,
               collective: str) -> tuple[Any, Any]:
    """(a tensor over ``a``'s memory, torch's op) for a gloo reduction; ArgumentError if gloo
    cannot compute ``op`` on ``a``'s type as ringlet defines it (:func:`_refusal`)."""
    rop = ReduceOp.parse(op)
    name = getattr(dtype, "name", dtype) if dtype is not None else a.dtype.name
    if rop is ReduceOp.AVG:
        raise ArgumentError(f"native {collective}: AVG is not passed to the engine (the "
                            f"communicator sums and divides); pass SUM")
    why = _refusal(rop, name, a.dtype.kind)
    if why is not None:
        raise ArgumentError(f"native {collective}: {why}")
    if rop in (ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR):
        return _tensor(a.view(np.uint8)), getattr(dist.ReduceOp, _TORCH_OPS[rop])
    if name == "bfloat16":
        return _tensor(a).view(torch.bfloat16), getattr(dist.ReduceOp, _TORCH_OPS[rop])
    if a.dtype.kind == "c":
        return _tensor(a), dist.ReduceOp.SUM
    if name == "bool":
        rop = _BOOL_OPS.get(rop, rop)
    return _tensor(a), getattr(dist.ReduceOp, _TORCH_OPS[rop])


__all__ = ["ENV_VARS", "HEARTBEAT_S", "STALE_S", "TorchTransport", "env_store", "world"]
