"""The MPI engine transport: ringlet's messages over mpi4py, between hosts.

:class:`MpiTransport` implements :class:`~ringlet.transport.base.Transport`
on an mpi4py communicator, which it duplicates (``Dup``) so that ringlet's
messages never meet the user's.  :func:`world` starts MPI if needed and
returns the transport of ``COMM_WORLD``::

    from ringlet.comm import Communicator
    from ringlet.config import Settings
    from ringlet.transport.mpi import world

    s = Settings.from_env()
    t = world(s)                                  # under mpiexec -n N
    comm = Communicator(t.rank, t.size, t, s, job_id="job")
    comm.all_reduce(x)                            # a ringlet algorithm over MPI
    comm.all_reduce(x, algorithm="native")        # MPI's own Iallreduce

Messages
--------
Every message is a nonblocking ``Isend``/``Irecv`` of bytes, with one MPI
tag per channel (COLL, P2P, CTRL, STATUS): MPI's non-overtaking rule (two
messages from one sender that match the same receive arrive in the order
they were sent) gives the FIFO order per pair and channel that the interface
promises.  A send of one part goes straight from the caller's memory; several
parts are packed into one buffer first.  A receive into one part without a
reducer lands in place; otherwise it lands in a scratch buffer and is copied
or reduced (``reducer(dst, src)``) into the parts as it completes.  Messages
of more than :data:`PIECE_BYTES` travel as several MPI messages (pieces) so
that each piece is reduced while the next ones are still on the wire.  That
is meant for a network, where the interface moves a piece while the CPU
reduces the one before (not measured: no network here).  MPICH moves
shared-memory messages only inside MPI calls, so on one host it changes
nothing (measured, ring all_reduce of 16 and 64 MiB
at N = 2 and 4 on one 2-core host: 4 MiB and 1 MiB pieces within noise of
none, 256 KiB pieces 10-30% slower), hence pieces of 4 MiB.  The receiver
checks the bytes that arrived: ranks that disagree about a message size get a
RingletError, not garbage.

Engine collectives
------------------
``native`` runs MPI's nonblocking collectives (Iallreduce, Ibcast, ...)
under the deadline.  Reductions compute exactly ringlet's op: MPI's
predefined op where it does (integers wrap, bool SUM is OR...), else a
user-defined MPI op running ringlet's own kernel (floating-point MIN/MAX,
which propagate NaN in numpy and not in C; complex PROD; bfloat16, which MPI
lacks; float16 where MPI lacks it).  bfloat16 is stored as int16, so a
reduction of int16 storage needs ``dtype=``.

Closing
-------
A communicator's duplicate is freed only once every remote peer's last word
(its close or abort notice) has arrived: MPI may hand a freed communicator's
context to the next communicator, and a message still on its way to the old
one would be received by the new one (seen in testing: a peer's abort,
matched by the next communicator).  Until then the closed transport lingers
with its status receives posted; creating or closing any MpiTransport frees
those that have become quiet, and at exit every receive still posted is
cancelled (before mpi4py finalizes MPI, so nothing is written into freed
memory).

Agreement and status
--------------------
For its ``remote`` peers (by default every other rank) the transport runs
agreement (descriptors as frames on the CTRL channel,
:class:`~ringlet.transport.base.MessageAgreement`) and status (abort and
closed notices on the STATUS channel,
:class:`~ringlet.transport.base.StatusBoard`) itself.  A routed transport,
which reaches the peers on its own host through shared memory, passes
``remote=`` the peers on other hosts.

What MPI can and cannot tell
----------------------------
MPI reports a peer's abort or close only because ringlet sends a notice.  It
does not report that a process died unless an operation with that process
fails: under ``mpiexec`` (MPICH's Hydra, Open MPI) the launcher normally
kills the whole job when one rank dies, so the peers never get to report
anything.  Where the engine does return an error on a request (the job was
started with ``mpiexec -disable-auto-cleanup``, or the network failed), the
transport raises a :class:`~ringlet.errors.PeerError` naming the peer; a peer
that vanishes with nothing outstanding is caught by the deadline
(``RINGLET_TIMEOUT``), whose message names the ranks that did not arrive.
An engine's own collective (``native``) cannot say which rank is missing.

So that a survivor never sends to a dead rank (MPICH 5.0.2 with UCX crashes in
``MPI_Isend`` then), a rank that was told of a failure (a peer's notice, MPI,
its node's shared memory) sends nothing more, not even its closed notice, and a
rank that timed out tells nobody over MPI: any rank it waited for may be dead,
and a late rank looks the same.  The ranks on other nodes then reach their own
deadline, and a late rank that comes afterwards times out naming the ranks that
left (``tests/test_netns_jobs.py``, ``tests/scripts/mpi_errors.py``).

Threads
-------
ringlet calls a communicator from its owner thread and, for asynchronous
collectives, from one worker thread; every communicator has its worker, so
under ``MPI_THREAD_MULTIPLE`` each transport serialises its own MPI calls with
a lock of its own, and under ``MPI_THREAD_SERIALIZED`` every transport of the
process takes one lock (:data:`_SERIAL_LOCK`; per-transport locks let two
communicators' workers call MPI at once: lost messages and a segfault with
MPICH), so SERIALIZED is enough.  :func:`world`
asks for ``MPI_THREAD_MULTIPLE`` (mpi4py's default, and what a program that
makes its own MPI calls from other threads needs) and accepts SERIALIZED;
with less (FUNNELED, SINGLE) it raises ConfigError.

The transport never calls ``MPI_Finalize``: mpi4py does at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..config import Settings
from ..errors import ArgumentError, CommTimeoutError, ConfigError, PeerError, RingletError
from ..ops import DTYPES, LOC, DType, ReduceOp, check_op, dtype_of_numpy, reducer
from ..wait import Waiter
from . import base
from .base import (
    ABORT_PEER,
    ABORT_TIMEOUT,
    CLOSED,
    COLL,
    CTRL,
    P2P,
    ROUND_ABSENT,
    STATUS,
    STATUS_BYTES,
    Caps,
    MessageAgreement,
    Reducer,
    Request,
    StatusBoard,
    Transport,
    _frame,
)
from .shm import oversubscribed

#: messages larger than this travel as pieces of this many bytes (base.PIECE_BYTES; a
#: module global, so that a test can make them small)
PIECE_BYTES = base.PIECE_BYTES
#: scratch buffers kept for reuse (receives that reduce, sends of several parts)
_POOL_MAX = 8
#: the channels' MPI tags; split() derives its meeting's and Create_group's tag above them
_TAGS = {COLL: 0, P2P: 1, CTRL: 2, STATUS: 3}
_SPLIT_TAG_BASE = 16
#: at exit, how long a transport that did not fail waits for the remote peers' last words
#: before it cancels their receives (see MpiTransport._await_last_words): ranks that close
#: within this of each other leave no message behind; a peer that closes later still
#: sends its notice to a cancelled receive (UCX then warns at MPI_Finalize), which is
#: better than holding every finished rank until the slowest closes (or, if it died
#: where MPI cannot tell, until the deadline)
_EXIT_WORDS_S = 3.0

_INSTALL = "pip install 'ringlet[mpi]' (or: pip install mpi4py mpich)"


def _mpi() -> Any:
    """mpi4py's MPI module, MPI initialised (MULTIPLE asked, SERIALIZED at least)."""
    try:
        import mpi4py
    except ImportError:
        raise ConfigError(f"the MPI engine needs mpi4py and an MPI library: {_INSTALL}") \
            from None
    try:
        from mpi4py import MPI
    except ImportError as exc:   # mpi4py without a usable MPI library
        raise ConfigError(f"mpi4py {mpi4py.__version__} is installed but cannot load an MPI "
                          f"library ({exc}): {_INSTALL}") from None
    if MPI.Is_finalized():
        raise ConfigError("MPI was already finalized in this process; the MPI engine "
                          "cannot start")
    if not MPI.Is_initialized():   # mpi4py.rc.initialize = False: start it here
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    _check_threads(MPI)
    return MPI


def _check_threads(MPI: Any) -> None:
    provided = MPI.Query_thread()
    if provided < MPI.THREAD_SERIALIZED:
        names = {MPI.THREAD_SINGLE: "SINGLE", MPI.THREAD_FUNNELED: "FUNNELED"}
        raise ConfigError(
            f"MPI was initialised with MPI_THREAD_{names.get(provided, provided)}, but "
            f"ringlet runs asynchronous collectives on a worker thread and needs at least "
            f"MPI_THREAD_SERIALIZED; set mpi4py.rc.thread_level = 'multiple' (or "
            f"'serialized') before importing mpi4py.MPI")


def world_comm() -> Any:
    """``MPI.COMM_WORLD``, MPI started if needed (for start-up's own exchanges)."""
    return _mpi().COMM_WORLD


def world(settings: Settings | None = None) -> MpiTransport:
    """The transport of ``MPI.COMM_WORLD`` (a duplicate of it), MPI started if needed.

    Collective over COMM_WORLD.  Raises ConfigError naming what to install if
    mpi4py or an MPI library is missing.
    """
    MPI = _mpi()
    return MpiTransport(MPI.COMM_WORLD, settings if settings is not None else
                        Settings.from_env())


def poll_request(req: Any, waiter: Waiter,
                 lock: threading.RLock | contextlib.nullcontext[None] | None = None) -> None:
    """Test ``req`` (a nonblocking collective: MPI's blocking ones wait for every rank for
    ever, deaf to signals) until it completes, pausing ``waiter`` (its deadline and
    checks) between tests, each under ``lock`` (the transport's MPI lock), if any.

    If it does not complete, the collective stays pending for the life of the process,
    and MPICH's ``MPI_Finalize`` waits for the ranks that never joined it: the exit
    alarm (:func:`_at_exit`) is armed as after any failure, with the wait's deadline
    as the grace where it is longer (those ranks may be alive and just late)."""
    guard = lock if lock is not None else contextlib.nullcontext()
    try:
        while True:
            with guard:
                if req.Test():
                    return
            waiter.pause()
    except BaseException as exc:
        _failed_unsure(f"{waiter.what()} failed ({type(exc).__name__}), and MPI's collective "
                       f"in it stays pending", waiter.timeout)
        raise


def _pieces(nbytes: int) -> list[tuple[int, int]]:
    """The byte ranges a message of ``nbytes`` travels as (none for an empty one)."""
    return base.pieces(nbytes, PIECE_BYTES)


def _too_big(peer: int, expected: int) -> RingletError:
    return RingletError(f"message from rank {peer} does not fit: more than the {expected} "
                        f"bytes expected arrived (ranks disagree about a message size)")


def _as_bytes(a: np.ndarray) -> np.ndarray:
    """The bytes of ``a`` (a contiguous view: MPI reads or writes them in place)."""
    if not a.flags.c_contiguous:
        raise RingletError(f"a message part must be contiguous (strides {a.strides})")
    return a if a.dtype == np.uint8 else a.reshape(-1).view(np.uint8)


class MpiSend:
    """A message being sent: one MPI send per piece."""

    __slots__ = ("_t", "peer", "channel", "_reqs", "_next", "_buf", "_pooled")

    def __init__(self, t: MpiTransport, peer: int, parts: Sequence[np.ndarray],
                 channel: int) -> None:
        self._t, self.peer, self.channel = t, peer, channel
        parts = [p for p in parts if p.size]
        nbytes = sum(p.nbytes for p in parts)
        self._pooled = len(parts) > 1
        if len(parts) == 1:
            buf = _as_bytes(parts[0])            # zero-copy: the caller keeps it alive
        elif parts:
            buf = t._take(nbytes)
            pos = 0
            for p in parts:
                buf[pos:pos + p.nbytes] = _as_bytes(p)
                pos += p.nbytes
        else:
            buf = np.empty(0, np.uint8)
        self._buf = buf
        comm, tag, MPI = t.comm, _TAGS[channel], t.MPI
        with t._lock:
            t._usable()
            try:
                self._reqs = [comm.Isend([buf[lo:hi], MPI.BYTE], peer, tag)
                              for lo, hi in _pieces(nbytes)]
            except MPI.Exception as exc:
                raise t._engine_error(peer, exc, "to") from None
            if self._reqs:
                t._sends.add(self)
        self._next = 0

    @property
    def done(self) -> bool:
        return self._next == len(self._reqs)

    def advance(self) -> bool:
        """Test the pieces in order; True if one completed."""
        moved = False
        reqs = self._reqs
        if self._next == len(reqs):
            return False
        t = self._t
        with t._lock:
            while self._next < len(reqs):
                try:
                    ok = reqs[self._next].Test()
                except t.MPI.Exception as exc:
                    raise t._engine_error(self.peer, exc, "to") from None
                if not ok:
                    break
                self._next += 1
                moved = True
            if self._next == len(reqs):
                t._sends.discard(self)
                if self._pooled:
                    self._pooled = False
                    t._give(self._buf)
        return moved

    def pending(self) -> list[Any]:
        return self._reqs[self._next:]


class MpiRecv:
    """A message being received: one MPI receive per piece, each piece copied or reduced
    into the parts as it completes (in order)."""

    __slots__ = ("_t", "peer", "channel", "_reqs", "_next", "_buf", "_parts", "_pos",
                 "_reducer", "_direct", "_ranges", "_failed")

    def __init__(self, t: MpiTransport, peer: int, parts: Sequence[np.ndarray],
                 reducer: Reducer | None, channel: int) -> None:
        self._t, self.peer, self.channel, self._reducer = t, peer, channel, reducer
        self._parts = [p for p in parts if p.size]
        nbytes = sum(p.nbytes for p in self._parts)
        self._direct = reducer is None and len(self._parts) == 1
        if self._direct:
            self._buf = _as_bytes(self._parts[0])
        else:
            self._buf = t._take(nbytes) if nbytes else np.empty(0, np.uint8)
        self._pos = 0       # bytes delivered into the parts
        self._ranges = _pieces(nbytes)
        comm, tag, MPI, buf = t.comm, _TAGS[channel], t.MPI, self._buf
        with t._lock:
            t._usable()
            try:
                self._reqs = [comm.Irecv([buf[lo:hi], MPI.BYTE], peer, tag)
                              for lo, hi in self._ranges]
            except MPI.Exception as exc:
                raise t._engine_error(peer, exc, "from") from None
            if self._reqs:
                t._recvs.add(self)
        self._next = 0
        #: the error a piece ended with: raised again by every later advance (the
        #: transport's progress drops the request; close cancels its other pieces)
        self._failed: RingletError | None = None

    @property
    def done(self) -> bool:
        return self._next == len(self._reqs) and self._failed is None

    def advance(self) -> bool:
        """Test the pieces in order, delivering each that completed; True if one did."""
        if self._failed is not None:
            raise self._failed
        reqs = self._reqs
        if self._next == len(reqs):
            return False
        moved = False
        t = self._t
        with t._lock:
            st = t._status
            while self._next < len(reqs):
                try:
                    ok = reqs[self._next].Test(st)
                except t.MPI.Exception as exc:
                    self._failed = t._engine_error(self.peer, exc, "from",
                                                   self._ranges[self._next][1]
                                                   - self._ranges[self._next][0])
                    raise self._failed from None
                if not ok:
                    break
                lo, hi = self._ranges[self._next]
                got = st.Get_count(t.MPI.BYTE)
                self._next += 1
                if got != hi - lo:
                    # said in the status only
                    self._failed = _too_big(self.peer, hi - lo) \
                        if st.Get_error() == t.MPI.ERR_TRUNCATE else RingletError(
                            f"message from rank {self.peer} does not fit: {got} bytes "
                            f"arrived, {hi - lo} expected (ranks disagree about a message "
                            f"size)")
                    break
                moved = True
                if not self._direct:
                    self._pos = base.deliver(self._parts, self._buf, self._pos, hi,
                                             self._reducer)
            if self._next == len(reqs):
                t._recvs.discard(self)
                if not self._direct and self._buf.size:
                    t._give(self._buf)
        if self._failed is not None:
            raise self._failed
        return moved

    def pending(self) -> list[Any]:
        return self._reqs[self._next:]


# --- the engine's own reductions -----------------------------------------------------------

#: (op, dtype name) -> (MPI datatype, MPI op), process-wide: mpi4py allows only 32
#: user-defined operations per process, so one is made per combination and kept
_REDUCTIONS: dict[tuple[ReduceOp, str], tuple[Any, Any]] = {}
_TYPES_BY_NAME = {"bool": "C_BOOL", "int8": "INT8_T", "int16": "INT16_T", "int32": "INT32_T",
                  "int64": "INT64_T", "uint8": "UINT8_T", "uint16": "UINT16_T",
                  "uint32": "UINT32_T", "uint64": "UINT64_T", "float32": "FLOAT",
                  "float64": "DOUBLE", "complex64": "C_FLOAT_COMPLEX",
                  "complex128": "C_DOUBLE_COMPLEX", "bfloat16": "INT16_T"}
#: bool: numpy's add is OR, multiply AND, min AND, max OR
_BOOL_OPS = {ReduceOp.SUM: "LOR", ReduceOp.PROD: "LAND", ReduceOp.MIN: "LAND",
             ReduceOp.MAX: "LOR", ReduceOp.BAND: "LAND", ReduceOp.BOR: "LOR",
             ReduceOp.BXOR: "LXOR", ReduceOp.LAND: "LAND", ReduceOp.LOR: "LOR",
             ReduceOp.LXOR: "LXOR"}
_CONTIGUOUS: dict[int, Any] = {}


def _mpi_type(MPI: Any, dt: DType) -> Any:
    """The MPI datatype of ``dt``'s elements (float16: MPICH's MPIX_C_FLOAT16 where it
    exists; else, and for any type MPI lacks, a contiguous type of the element's bytes,
    which only ringlet's own kernels reduce)."""
    name = _TYPES_BY_NAME.get(dt.name)
    t = getattr(MPI, name, None) if name else None
    if t is None and dt.name == "float16":
        try:
            from mpi4py.util.dtlib import from_numpy_dtype

            t = from_numpy_dtype(dt.np_dtype)
        except (ImportError, ValueError, KeyError, TypeError):
            t = None
    if t is None or t == MPI.DATATYPE_NULL:
        t = _CONTIGUOUS.get(dt.itemsize)
        if t is None:
            t = _CONTIGUOUS[dt.itemsize] = MPI.BYTE.Create_contiguous(dt.itemsize).Commit()
    return t


def _builtin(MPI: Any, op: ReduceOp, dt: DType) -> Any:
    """MPI's predefined op that computes exactly ringlet's ``op`` on ``dt``, or None.

    Integers: every op (both wrap on overflow).  bool: the logical ops (numpy's
    add is OR).  Floating point: SUM and PROD only; MIN and MAX take ringlet's
    kernel, because numpy's propagate NaN and C's comparisons do not.  Complex:
    SUM only (ringlet's product is bit-for-bit commutative, C's may not be).
    bfloat16: none (MPI has no such type).
    """
    kind = dt.np_dtype.kind
    if dt.name == "bfloat16" or op in LOC or kind == "V":   # pairs: ringlet's MINLOC/MAXLOC
        return None
    if kind == "b":
        return getattr(MPI, _BOOL_OPS[op])
    if kind in "iu":
        return getattr(MPI, op.name)
    if kind == "f" and op in (ReduceOp.SUM, ReduceOp.PROD):
        return getattr(MPI, op.name)
    if kind == "c" and op is ReduceOp.SUM:
        return MPI.SUM
    return None


def _reduction(MPI: Any, op: ReduceOp, dt: DType) -> tuple[Any, Any]:
    """(MPI datatype, MPI op) that compute ringlet's ``op`` on ``dt``.

    A predefined op where it computes the same thing and this MPI library
    supports it on the type (checked locally with ``MPI_Reduce_local``, so every
    rank decides alike); otherwise a user-defined op that runs ringlet's own
    numpy (or torch, for bfloat16) kernel.
    """
    key = (op, dt.name)
    hit = _REDUCTIONS.get(key)
    if hit is not None:
        return hit
    check_op(op, dt)
    mtype = _mpi_type(MPI, dt)
    mop = _builtin(MPI, op, dt)
    if mop is not None:
        a = np.zeros(1, dt.np_dtype)
        b = np.zeros(1, dt.np_dtype)
        try:
            mop.Reduce_local([a, 1, mtype], [b, 1, mtype])
        except MPI.Exception:
            mop = None
    if mop is None:
        kernel = reducer(op, dt)
        storage = dt.np_dtype

        def apply(inbuf: Any, inoutbuf: Any, datatype: Any) -> None:
            kernel(np.frombuffer(inoutbuf, storage), np.frombuffer(inbuf, storage))

        # not commutative: ringlet's kernels are not bit for bit (MIN/MAX of +0.0 and -0.0,
        # NaN payloads), and a commutative op lets MPI combine in another order on each
        # rank, which then held different bits; a fixed order gives every rank the same
        try:
            mop = MPI.Op.Create(apply, commute=False)
        except RuntimeError as exc:   # mpi4py's 32 user-defined operations are taken
            raise ArgumentError(
                f"the MPI engine cannot reduce {dt.name} with {op.name} natively ({exc}); "
                f"use a ringlet algorithm (e.g. algorithm='ring')") from None
    _REDUCTIONS[key] = (mtype, mop)
    return mtype, mop


#: transports not yet closed, and closed ones whose communicator waits for the peers'
#: last words (see MpiTransport.close): held so that no posted receive's buffer is freed
_OPEN: set[MpiTransport] = set()
_LINGER: list[MpiTransport] = []
_LINGER_LOCK = threading.Lock()
#: every MPI call of the process, under MPI_THREAD_SERIALIZED (see Threads above)
_SERIAL_LOCK = threading.RLock()
#: under MPI_THREAD_SERIALIZED, held while a group is built (MpiTransport.split)
_GROUPS_LOCK = threading.Lock()
#: a group's meeting (MpiTransport._meet): its words, and how long a member that failed in
#: its second round still waits for the other members' READY already on their way
_MEET_HELLO, _MEET_READY, _MEET_GONE = 1, 2, 3
_MEET_WORDS = {w: np.array([w], np.uint8) for w in (_MEET_HELLO, _MEET_READY, _MEET_GONE)}
_READY_GRACE_S = 1.0
#: this process's MPI failures, each with how long MPI_Finalize may then take (_at_exit)
_FAILED: list[tuple[str, float]] = []
#: seconds MPI_Finalize may take at exit after a failure before the process ends itself
_FINALIZE_S = 10.0


def _failed_unsure(why: str, deadline: float) -> None:
    """Arm the exit alarm (:func:`_at_exit`) after a failure MPI did not report, where the
    ranks waited for may be alive and busy: the grace is the deadline if it is longer
    than :data:`_FINALIZE_S`.  The first such failure is the one the alarm names."""
    if not _FAILED:
        _FAILED.append((why, max(_FINALIZE_S, deadline)))


def _sweep() -> None:
    """Free the communicators of closed transports that have become quiet."""
    with _LINGER_LOCK:
        _LINGER[:] = [t for t in _LINGER if not t._quiet()]


@atexit.register
def _at_exit() -> None:
    """Before the interpreter frees its objects (and mpi4py finalizes MPI after that):
    tell the peers, and cancel every receive still posted, so that no message that
    arrives during MPI_Finalize is written into freed memory.

    After a failure a peer may be dead, and MPICH's ``MPI_Finalize`` then waits for it
    for ever where the launcher does not end the job (``mpiexec
    -disable-auto-cleanup``, or ranks on another host): so the process ends itself
    (SIGALRM, whose default action ends a process even once Python has stopped running
    handlers; not where the program handles SIGALRM itself) if finalizing has not
    finished in time, saying so on stderr first.  In time is :data:`_FINALIZE_S` once
    MPI reported a peer failed (an error on a message to or from it); after a failure
    that MPI did not report (a timeout: the ranks waited for may be alive and busy, and
    finalizing waits for them as it should) it is the communicator's deadline
    (RINGLET_TIMEOUT) if that is longer."""
    with _LINGER_LOCK:
        every = [*_OPEN, *_LINGER]
    for t in every:
        try:
            t._shutdown()
        except Exception:   # noqa: BLE001 - the interpreter is exiting: do what can be done
            pass
    if _FAILED and hasattr(signal, "alarm") and \
            threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None):
        why, grace = min(_FAILED, key=lambda f: f[1])
        seconds = max(1, math.ceil(grace))
        with contextlib.suppress(Exception):
            sys.stderr.write(
                f"ringlet: {why}; if MPI_Finalize waits for a rank that died, this "
                f"process ends in {seconds} s (SIGALRM)\n")
            sys.stderr.flush()
            signal.alarm(seconds)


#: what native() runs for each collective (the mpi4py method), for messages
_NATIVE = {"all_reduce": "Iallreduce", "broadcast": "Ibcast", "reduce": "Ireduce",
           "all_gather": "Iallgather", "reduce_scatter": "Ireduce_scatter_block",
           "all_to_all": "Ialltoall", "scatter": "Iscatter", "gather": "Igather"}


class MpiTransport(Transport):
    """ringlet's messages over an mpi4py communicator (see the module documentation).

    ``comm`` is duplicated (collective over it); ``remote`` are the peers
    whose agreement and status this transport handles (default: every other
    rank).
    """

    caps = Caps(engine="mpi", native=frozenset(_NATIVE))

    def __init__(self, comm: Any, settings: Settings,
                 remote: Sequence[int] | None = None) -> None:
        MPI = _mpi()
        self.MPI = MPI
        _sweep()
        self._lock = _SERIAL_LOCK if MPI.Query_thread() < MPI.THREAD_MULTIPLE \
            else threading.RLock()
        # nonblocking and polled: MPI_Comm_dup waits without a deadline for every rank of
        # ``comm`` (one that never came, or died, hung it)
        with self._lock:
            self.comm, req = comm.Idup()
        self._poll_start(req, settings, "duplicating the communicator")
        self.comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.rank: int = self.comm.Get_rank()
        self.size: int = self.comm.Get_size()
        #: the ranks messages name (a rail group's: its communicator's ranks)
        self.names = list(range(self.size))
        if remote is None:
            remote = [q for q in range(self.size) if q != self.rank]
        self.remote = sorted({int(q) for q in remote})
        bad = [q for q in self.remote if not 0 <= q < self.size or q == self.rank]
        if bad:
            self.comm.Free()
            raise ArgumentError(f"remote peers {bad} are not other ranks of this "
                                f"communicator (0..{self.size - 1}, this is rank {self.rank})")
        self._remote_set = frozenset(self.remote)
        # a rank whose duplicate completed against one its peer abandoned (after its
        # deadline) must not wait in MPI_Comm_split_type for it: a polled barrier on the
        # duplicate first, which only ranks that built it complete
        with self._lock:
            req = self.comm.Ibarrier()
        self._poll_start(req, settings, "meeting on the new communicator")
        with self._lock:   # every rank is here: MPI_Comm_split_type does not wait
            node = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
            local = node.Get_size()
            node.Free()
        self._given = settings
        #: the settings every wait uses: no spinning when this host's ranks outnumber cores
        self.settings = oversubscribed(settings, local)
        self.describe: Callable[[], str] = lambda: "a collective"
        self._status = MPI.Status()
        self._pending: list[MpiSend | MpiRecv] = []     # collective requests not yet done
        # every message not yet done, held here with its buffers: MPI writes into (or
        # reads) a buffer until its request completes, whatever becomes of the Python
        # Request object (mpi4py 4.1 does not free a collected one's MPI request)
        self._recvs: set[MpiRecv] = set()
        self._sends: set[MpiSend] = set()
        self._orphans: list[Any] = []                    # forgotten requests, for close()
        self._pool: list[np.ndarray] = []
        self._error: RingletError | None = None          # an error MPI reported on a request
        self._closed = False
        self._said = False                               # sent its last word (_tell)
        #: peers MPI reported an error with: never sent to again (MPICH may crash)
        self._dead: set[int] = set()
        self._notices: list[MpiSend] = []
        self.agreement = MessageAgreement(self, self.remote)
        self.board = StatusBoard(self, self.remote)
        with _LINGER_LOCK:
            _OPEN.add(self)

    # --- messages ---------------------------------------------------------------------

    def isend(self, peer: int, parts: Sequence[np.ndarray], channel: int = COLL) -> MpiSend:
        """Start sending ``parts`` (uint8 views) to ``peer``.  A point-to-point message is
        refused once this rank has heard of a failure (a peer's abort notice, or MPI
        reporting ``peer`` dead), though it was in no call then: a send to a dead rank
        can crash MPICH, and over MPI a dead rank and a late one look the same."""
        if channel == P2P:
            with self._lock:
                err = self._heard()
            if err is not None:
                raise type(err)(str(err))
            if peer in self._dead:
                raise PeerError(f"MPI reported rank {self.names[peer]} failed or dead: nothing "
                                f"more is sent to it")
        req = MpiSend(self, peer, parts, channel)
        if channel == COLL and not req.done:
            self._pending.append(req)
        return req

    def irecv(self, peer: int, parts: Sequence[np.ndarray], reducer: Reducer | None = None,
              channel: int = COLL) -> MpiRecv:
        """Start receiving from ``peer`` into ``parts``, copying or reducing."""
        req = MpiRecv(self, peer, parts, reducer, channel)
        if channel == COLL and not req.done:
            self._pending.append(req)
        return req

    def progress(self) -> bool:
        """Advance every pending collective request; True if any completed a piece."""
        if not self._pending:
            return False
        moved = False
        keep: list[MpiSend | MpiRecv] = []
        pending = self._pending
        for i, r in enumerate(pending):
            try:
                moved |= r.advance()
            except BaseException:   # the request failed: raised here, then forgotten
                self._pending = keep + pending[i + 1:]
                raise
            if not r.done:
                keep.append(r)
        self._pending = keep
        return moved

    def wait(self, reqs: Sequence[Request], what: Callable[[], str]) -> None:
        """Progress until every request in ``reqs`` is done, within the deadline."""
        if all(r.done for r in reqs):
            return
        for r in reqs:   # a receive that failed earlier fails again, not after the deadline
            if getattr(r, "_failed", None) is not None:
                r.advance()

        def missing() -> list[int]:
            return [r.peer for r in reqs if not r.done]

        waiter = Waiter(self.settings, what, missing, lambda: self.check(missing(), what()),
                        absent=ROUND_ABSENT)
        while True:
            moved = self.progress()
            for r in reqs:
                if not r.done and getattr(r, "channel", COLL) != COLL:
                    moved |= r.advance()
            if all(r.done for r in reqs):
                return
            if not moved:
                self.idle(0, waiter)   # point-to-point in flight first, then a pause

    def discard_pending(self) -> None:
        """Forget pending collective requests: their receives are cancelled, and close()
        finishes them (MPI may still write into their buffers until then)."""
        with self._lock:
            for r in self._pending:
                if isinstance(r, MpiRecv):
                    self._cancel(r)
                self._orphans.extend(r.pending())
                self._orphans.append(r)   # keeps its buffers alive
            self._pending = []

    # --- agreement ----------------------------------------------------------------------

    def publish(self, seq: int, words: Sequence[int], note: str | None = None,
                to: Sequence[int] | None = None) -> None:
        with self._lock:
            self.agreement.publish(seq, words, note, to)

    def tell_node(self, seq: int, words: Sequence[int] | None, to: Sequence[int]) -> None:
        with self._lock:
            self.agreement.tell_node(seq, words, to)

    def node_desc(self, q: int, seq: int) -> tuple[int, ...] | None:
        with self._lock:
            return self.agreement.node_desc(q, seq)

    def latest_node(self, q: int) -> tuple[int, tuple[int, ...]] | None:
        with self._lock:
            return self.agreement.latest_node(q)

    def peer_desc(self, q: int, seq: int) -> tuple[int, ...] | None:
        with self._lock:
            return self.agreement.peer_desc(q, seq)

    def note(self, q: int, seq: int) -> str:
        with self._lock:
            return self.agreement.note(q, seq)

    def latest_desc(self, q: int) -> tuple[int, tuple[int, ...]] | None:
        with self._lock:
            return self.agreement.latest(q)

    # --- liveness ---------------------------------------------------------------------

    def check(self, watch: Sequence[int] | None = None, what: str | None = None) -> None:
        """Raise if a peer aborted the communicator, a watched remote peer closed it, or
        MPI reported an error on a message (peers not in ``remote`` are not watched
        here: a routed transport watches them through shared memory)."""
        if self.watch_also is not None:
            self.watch_also(None, what)
        with self._lock:
            if self._error is not None:
                raise type(self._error)(str(self._error))
            if self._closed:
                return
            self.board.poll()
            err = self.board.error
            if err is not None:
                raise type(err)(str(err))
            closed = self.board.closed
            if not closed:
                return
            for q in self.remote if watch is None else watch:
                done = closed.get(q)
                err = None if done is None else self.closed_error(q, done, what)
                if err is not None:
                    raise err

    def _heard(self) -> RingletError | None:
        """The failure this rank has heard of, if any: MPI's error on a message of its, or
        a peer's abort notice (taken in now).  Under the lock."""
        self.board.poll()
        return self._error or self.board.error

    def sees_death(self, q: int) -> bool:
        return q == self.rank

    def abort(self, message: str, timeout: bool = False, tell: bool = True,
              unsure: bool = False) -> None:
        """Tell every remote peer to fail with ``message``; this rank's own ``check``
        raises it from now on too (as shared memory's abort mailbox does).

        A send to a peer that died can crash MPICH (SIGSEGV in MPI_Isend while a large
        message to or from it was in flight).  So nothing is sent, now or at close,
        when a peer's notice, MPI or (``tell`` False) the node's shared memory told
        this rank: the rank that failed first told every rank already; nor when
        ``unsure`` (a communicator that timed out: a rank it waited for may be dead,
        and over MPI a dead rank and a late one look the same).  The peers keep their
        duplicate of the communicator (a failure path)."""
        _failed_unsure(f"rank {self.names[self.rank]}'s MPI communicator failed",
                       self.settings.timeout)
        with self._lock:
            if self._closed:
                return
            if self.board.error is None and self._error is None and tell and not unsure:
                self._tell(ABORT_TIMEOUT if timeout else ABORT_PEER, message)
            else:
                self._said = True
            if self.board.error is None:
                self.board.error = (CommTimeoutError if timeout else PeerError)(message)

    def mark_closed(self) -> None:
        """Tell the remote peers this rank makes no more calls; unless this rank has heard
        of a failure (a peer's abort notice, an MPI error), though it was in no call
        then: a rank may be dead, and a send to it can crash MPICH (as :meth:`abort`)."""
        with self._lock:
            if self._closed or self.MPI.Is_finalized():
                return
            err = self._heard()
        if err is not None:
            self.abort(str(err), tell=False)
            return
        with self._lock:
            self._tell(CLOSED, str(self.calls()[1]))

    def _tell(self, kind: int, text: str) -> None:
        """This rank's last word on the communicator (an abort or a close), to every
        remote peer, closed ones included: a peer frees its duplicate of the
        communicator only once every peer's last word has arrived (see close())."""
        if self._said:
            return
        self._said = True
        frame = _frame([], kind, text, STATUS_BYTES)
        for q in self.remote:
            if q in self._dead:
                continue
            try:
                r = self.isend(q, [frame], STATUS)
                r.advance()
            except RingletError:   # MPI refused: the peer is gone, nobody to tell
                continue
            if not r.done:
                self._notices.append(r)

    def close(self) -> None:
        """Release the communicator (idempotent; MPI itself is finalized by mpi4py).

        Notices in flight get half a second to leave, posted receives are
        cancelled, and the duplicated communicator is freed, but only once every
        remote peer's last word (its close or abort notice) has arrived and what
        else it sent has been taken in: MPI may give a freed communicator's
        context to the next one, and a late message to the old one would then be
        received by the new one.  Until then the transport lingers with its
        status receives posted; every later MpiTransport's creation or close
        frees the lingering ones that have become quiet.
        """
        with self._lock:
            if self._closed:
                return
            if self.MPI.Is_finalized():
                self._closed = True
                return
            self._tell(CLOSED, "")
            self._closed = True
            self._flush_notices(0.5)
            for r in list(self._recvs):
                if r.channel != STATUS:
                    self._cancel(r)
                    self._orphans.extend(r.pending())
            for q in self._pending:
                self._orphans.extend(q.pending())
            self._pending = []
            self._finish(self._orphans, 1.0)
            self._orphans = []
        with _LINGER_LOCK:
            _OPEN.discard(self)
            _LINGER.append(self)
        _sweep()

    def _shutdown(self) -> None:
        """At exit: the last word, notices flushed, the remote peers' last words
        awaited (unless the communicator failed, at most :data:`_EXIT_WORDS_S`), every
        receive cancelled."""
        MPI = self.MPI
        with self._lock:
            if MPI.Is_finalized():
                return
            if not self._closed:
                self._tell(CLOSED, "")
            self._flush_notices(0.5)
            if self.board.error is None and self._error is None and not self._dead:
                # a communicator that failed does not wait: a peer may be dead, and over
                # MPI a dead peer and a late one look the same
                self._await_last_words(_EXIT_WORDS_S)
            reqs: list[Any] = []
            for r in list(self._recvs):
                self._cancel(r)
                reqs.extend(r.pending())
            for q in list(self._sends):
                reqs.extend(q.pending())
            reqs.extend(self._orphans)
            self._finish(reqs, 1.0)

    def _flush_notices(self, seconds: float) -> None:
        """Give this rank's last word, in flight, up to ``seconds`` to leave."""
        end = time.monotonic() + seconds
        while self._notices and time.monotonic() < end:
            self._notices = [r for r in self._notices if not (r.advance() or r.done)]
            if self._notices:
                time.sleep(0.001)

    def _last_words_pending(self) -> bool:
        """Take in what arrived on the status receives; True while one is still posted
        (a remote peer whose close or abort notice has not arrived)."""
        for r in [r for r in self._recvs if r.channel == STATUS]:
            try:
                r.advance()
            except RingletError:
                self._recvs.discard(r)
        return any(r.channel == STATUS for r in self._recvs)

    def _await_last_words(self, seconds: float) -> None:
        """Wait up to ``seconds`` for every remote peer's last word.  At exit a peer
        that closes a little later than this rank would otherwise send its notice to a
        receive already cancelled: it arrives during MPI_Finalize as a message nobody
        takes, and MPICH's UCX layer prints "unexpected tag-receive descriptor ...
        was not matched" for it."""
        end = time.monotonic() + seconds
        while self._last_words_pending() and time.monotonic() < end:
            time.sleep(0.002)

    def _quiet(self) -> bool:
        """Free the communicator if every remote peer's last word has arrived (after
        taking in whatever else is left); True once it is freed."""
        MPI = self.MPI
        with self._lock:
            if MPI.Is_finalized():
                return True
            if self._last_words_pending():
                return False
            st = MPI.Status()
            while True:
                try:
                    msg = self.comm.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, st)
                    if msg is None or msg == MPI.MESSAGE_NULL:
                        break
                    msg.Recv([np.empty(st.Get_count(MPI.BYTE), np.uint8), MPI.BYTE])
                except MPI.Exception:
                    break
            for q in self._sends:   # never received: keep their buffers alive
                base.ABANDONED.extend(q.pending())
            self._sends.clear()
            # a communicator MPI refuses to free stays allocated: nothing else holds it
            with contextlib.suppress(MPI.Exception):
                self.comm.Free()
            return True

    def _cancel(self, r: MpiRecv) -> None:
        for req in r.pending():
            try:
                req.Cancel()
            except self.MPI.Exception:
                pass
        self._recvs.discard(r)

    def _finish(self, reqs: list[Any], seconds: float) -> None:
        """Complete cancelled or abandoned requests within ``seconds``; keep the rest
        (and so their buffers) for the life of the process."""
        MPI = self.MPI
        live = [r for r in reqs if isinstance(r, MPI.Request)]
        end = time.monotonic() + seconds
        while live and time.monotonic() < end:
            left = []
            for r in live:
                try:
                    if not r.Test():
                        left.append(r)
                except MPI.Exception:
                    pass
            live = left
            if live:
                time.sleep(0.001)
        base.ABANDONED.extend(live)

    # --- helpers ----------------------------------------------------------------------

    def _usable(self) -> None:
        if self._closed:
            raise RingletError("the MPI transport is closed")

    def _take(self, nbytes: int) -> np.ndarray:
        """A scratch buffer of ``nbytes`` (reused: fresh memory costs page faults)."""
        with self._lock:
            for i, b in enumerate(self._pool):
                if nbytes <= b.size <= 4 * nbytes:
                    del self._pool[i]
                    return b[:nbytes]
        return np.empty(nbytes, np.uint8)

    def _give(self, buf: np.ndarray) -> None:
        base = buf.base if isinstance(buf.base, np.ndarray) else buf
        if base.size < 4096:
            return
        with self._lock:
            if len(self._pool) >= _POOL_MAX:
                self._pool.pop(0)
            self._pool.append(base)

    def _engine_error(self, peer: int, exc: Any, direction: str,
                      expected: int = 0) -> RingletError:
        """A RingletError for an error MPI returned on a message to or from ``peer``."""
        MPI = self.MPI
        text = (exc.Get_error_string() or str(exc)).strip().splitlines()
        why = text[0] if text else f"error class {exc.Get_error_class()}"
        if exc.Get_error_class() == MPI.ERR_TRUNCATE:
            return _too_big(peer, expected)
        err = PeerError(
            f"rank {self.names[peer]} failed or died: MPI reported an error on a message "
            f"{direction} it "
            f"({why}); {self.describe()} cannot complete")
        self._dead.add(peer)
        _FAILED.append((f"MPI reported rank {self.names[peer]} failed or dead", _FINALIZE_S))
        if self._error is None:
            self._error = err
        return err

    # --- the engine's own collectives ---------------------------------------------------

    def native_refusal(self, collective: str, op: Any, dtype: Any) -> str | None:
        """MPI computes every reduction as ringlet does (its own op where it matches,
        ringlet's kernel as a user-defined op elsewhere), but mpi4py makes at most 32
        user-defined ops a process: the op is made here, before the call, so that a
        rank out of them refuses the call instead of failing after every rank agreed."""
        try:
            with self._lock:   # MPI_Reduce_local checks a predefined op: an MPI call
                _reduction(self.MPI, ReduceOp.parse(op), dtype)
        except ArgumentError as exc:
            return str(exc)
        return None

    def native_start(self, collective: str, root: int, count: int,
                     bufs: dict[int, np.ndarray], op: Any, what: Callable[[], str],
                     dtype: DType | str | None = None) -> base.NativeCall:
        """Start ``collective`` as MPI's own nonblocking collective (see
        :meth:`Transport.native`); its ``wait()`` tests it within the deadline, watching
        the peers.  MPI moves its data while this rank is in an MPI call (MPICH and Open
        MPI have no progress thread by default), so it overlaps what the rank does
        before ``wait()`` only as far as the engine progresses on its own.

        ``dtype`` is ringlet's element type of the buffers (needed for bfloat16,
        whose storage is int16; inferred from the buffers otherwise).  Reductions
        compute exactly ringlet's op (see :func:`_reduction`).  The call spans
        every rank of this transport's communicator.
        """
        MPI = self.MPI
        fn = _NATIVE.get(collective)
        if fn is None:
            raise ArgumentError(f"the MPI engine has no native {collective}; it runs "
                                f"{', '.join(_NATIVE)}")
        if count == 0:
            return base.NativeCall(None)  # every rank agreed on the count: nothing to move
        IN, OUT = bufs.get(0), bufs.get(1)
        some = OUT if OUT is not None else IN
        if some is None:
            raise ArgumentError(f"native {collective}: no buffer given")
        dt = DTYPES[dtype] if isinstance(dtype, str) else dtype if dtype is not None \
            else dtype_of_numpy(some.dtype)
        n, c = self.size, count
        rop = None
        if collective in ("all_reduce", "reduce", "reduce_scatter"):
            if op is None:
                raise ArgumentError(f"native {collective} needs a reduction op")
            rop = ReduceOp.parse(op)
            if dtype is None and dt.name == "int16":
                # bfloat16 travels as int16: reducing its bits as integers would give
                # garbage, so the element type must be said (dtype=)
                raise ArgumentError(
                    f"native {collective} of 16-bit integer storage needs dtype= (int16 or "
                    f"bfloat16: both are stored as int16); or use a ringlet algorithm "
                    f"(e.g. algorithm='ring')")
            if rop is ReduceOp.AVG:
                raise ArgumentError("native reductions take SUM for AVG: the communicator "
                                    "divides")
            with self._lock:
                mtype, mop = _reduction(MPI, rop, dt)

        def typed(a: np.ndarray | None, elems: int) -> list[Any]:
            if a is None:
                raise ArgumentError(f"native {collective}: a buffer is missing on rank "
                                    f"{self.rank}")
            return [a[:elems], mtype]

        def raw(a: np.ndarray | None, elems: int) -> list[Any]:
            if a is None:
                raise ArgumentError(f"native {collective}: a buffer is missing on rank "
                                    f"{self.rank}")
            return [_as_bytes(a[:elems]), MPI.BYTE]

        comm, me = self.comm, self.rank
        with self._lock:
            self._usable()
            if collective == "all_reduce":
                req = comm.Iallreduce(MPI.IN_PLACE, typed(OUT, c), mop)
            elif collective == "broadcast":
                req = comm.Ibcast(raw(OUT, c), root)
            elif collective == "reduce":
                req = comm.Ireduce(typed(IN, c), typed(OUT, c) if me == root else None,
                                   mop, root)
            elif collective == "all_gather":
                req = comm.Iallgather(raw(IN, c), raw(OUT, c * n))
            elif collective == "reduce_scatter":
                req = comm.Ireduce_scatter_block(typed(IN, c * n), typed(OUT, c), mop)
            elif collective == "all_to_all":
                req = comm.Ialltoall(raw(IN, c * n), raw(OUT, c * n))
            elif collective == "scatter":
                req = comm.Iscatter(raw(IN, c * n) if me == root else None, raw(OUT, c), root)
            else:   # gather
                req = comm.Igather(raw(IN, c), raw(OUT, c * n) if me == root else None, root)


        def finish() -> None:
            waiter = Waiter(
                self.settings, what, list, lambda: self.check(None, what()),
                advice=lambda: f"MPI's {fn} has not completed on rank "
                               f"{self.names[self.rank]}; MPI does "
                               f"not say which ranks have not joined it (every rank agreed "
                               f"to this call, so one is slow, stuck or gone)")
            while True:
                with self._lock:
                    try:
                        ok = req.Test()
                    except MPI.Exception as exc:
                        raise PeerError(
                            f"rank {self.names[self.rank]}: MPI's {fn} failed "
                            f"({exc.Get_error_string()}); {what()} cannot complete (a "
                            f"peer may have died)") from None
                if ok:
                    return
                self.idle(0, waiter)   # messages in flight move (BACKGROUND), or a pause

        # a collective cannot be cancelled nor its request freed: after an error the
        # NativeCall keeps it (and so its buffers) for the life of the process
        return base.NativeCall(finish, req)

    def _poll_start(self, req: Any, settings: Settings, what: str) -> None:
        """Poll a nonblocking collective of the transport's construction (collective over
        the communicator it duplicates) under the deadline."""
        poll_request(req, Waiter(
            settings, lambda: f"{what} for a new MPI transport", list,
            advice=lambda: (
                "not every rank of the MPI communicator came (MPI's collectives do not say "
                "which): a rank that never builds it, or died, never comes; if the ranks are "
                "just slow, raise RINGLET_TIMEOUT (seconds)")), self._lock)

    # --- groups -----------------------------------------------------------------------

    def split(self, ranks: Sequence[int], token: str,
              remote: Sequence[int] | None = None, *, names: Sequence[int] | None = None,
              watch: Callable[[], None] | None = None) -> MpiTransport:
        """The transport of the group ``ranks`` (this transport's ranks, in the group's
        order): ``MPI_Comm_create_group``, collective over the members only, with a tag
        derived from ``token``.  ``remote`` (group ranks) defaults to the members that
        are remote peers of this transport.

        ``MPI_Comm_create_group`` waits for every member without a deadline, so the
        members first meet (:meth:`_meet`, under this rank's deadline, calling
        ``watch``, default :meth:`check`, between polls), and a member enters it only
        once every member is sure to: one that is late, failed or gave up ends the
        others' wait with an error naming it.  Only a member that dies between the
        meeting and the group's creation can still hang it (where mpiexec does not end
        the job).  Under ``MPI_THREAD_SERIALIZED`` a process builds one group at a time
        (:data:`_GROUPS_LOCK`): two threads building two groups at once, each holding
        MPI's lock in ``MPI_Comm_create_group`` while the other's peers waited for it,
        hung."""
        ranks = [int(r) for r in ranks]
        if self.rank not in ranks:
            raise ArgumentError(f"split: rank {self.rank} is not a member of {ranks}")
        MPI = self.MPI
        if remote is None:
            remote = [i for i, r in enumerate(ranks) if r in self._remote_set]
        with self._lock:
            ub = self.comm.Get_attr(MPI.TAG_UB) or 32767
        digest = int.from_bytes(hashlib.sha256(token.encode()).digest()[:8], "little")
        tag = _SPLIT_TAG_BASE + digest % (ub - _SPLIT_TAG_BASE)
        serial = self._lock is _SERIAL_LOCK
        if serial and not _GROUPS_LOCK.acquire(timeout=self.settings.timeout):
            raise CommTimeoutError(
                f"rank {self.names[self.rank]}: timed out after {self.settings.timeout:g} s "
                f"in {self.describe()}: another thread of this process was building an MPI "
                f"group all that time (under MPI_THREAD_SERIALIZED a process builds one at "
                f"a time, and two threads that build groups in different orders on "
                f"different ranks wait for each other): initialise MPI with "
                f"MPI_THREAD_MULTIPLE, or build groups (split, group, the first "
                f"two-level all_reduce with RINGLET_RAILS=native) from one thread at a "
                f"time")
        try:
            failed = self._meet(ranks, tag, watch)
            with self._lock:
                group = self.comm.Get_group()
                sub_group = group.Incl(ranks)
                try:
                    sub = self.comm.Create_group(sub_group, tag)
                finally:
                    sub_group.Free()
                    group.Free()
                # every member builds the transport, whose construction is collective;
                # then one that failed in the meeting's second round closes it and raises
                try:
                    t = MpiTransport(sub, self._given, remote)
                finally:
                    sub.Free()
            if failed is not None:
                t.close()
                raise failed
        finally:
            if serial:
                _GROUPS_LOCK.release()
        if names is not None:
            t.names = list(names)
        return t

    def _meet(self, ranks: list[int], tag: int,
              watch: Callable[[], None] | None) -> BaseException | None:
        """Wait under the deadline until every member of the group ``ranks`` is sure to
        build it, in two rounds of one-byte messages (tag ``tag``, on this transport's
        communicator, where a split's tags are above the channels'; the messages of a
        pair keep their order, so a later split with the same tag cannot take these):

        1. each member sends every other one HELLO and waits for theirs;
        2. then READY, and waits for theirs.

        A member that fails in round 1 (its deadline, or ``watch`` raised) sends GONE
        instead of READY, so that none of the others finishes round 2 and each fails at
        once naming it.  A member that finished round 2 enters ``MPI_Comm_create_group``
        knowing that every member sent READY, so every member will finish round 2 too:
        a member that fails in round 2 still waits, up to :data:`_READY_GRACE_S`, for the
        READYs already on their way, and if they come it builds the group with the
        others and returns its error (to raise after); if they do not, it raises."""
        MPI = self.MPI
        check = watch if watch is not None else self.check
        check()   # nothing is sent to a peer known to be dead or gone
        me = self.rank
        others = [r for r in ranks if r != me]
        if not others:
            return None
        n = len(others)
        got = np.zeros(2 * n, np.uint8)      # per peer: its first and second message
        state = [0] * n                      # per peer: messages received
        second = [0] * n                     # per peer: its second message (READY or GONE)
        sends: list[Any] = []
        recvs: list[Any] = [None] * n

        def post(i: int) -> None:
            k = state[i]
            try:
                recvs[i] = self.comm.Irecv([got[2 * i + k:2 * i + k + 1], 1, MPI.BYTE],
                                           source=others[i], tag=tag)
            except MPI.Exception as exc:
                raise self._engine_error(others[i], exc, "from") from None

        def tell(word: int) -> None:
            msg = _MEET_WORDS[word]
            for r in others:
                if r in self._dead:
                    continue
                try:
                    sends.append(self.comm.Isend([msg, 1, MPI.BYTE], dest=r, tag=tag))
                except MPI.Exception as exc:
                    raise self._engine_error(r, exc, "to") from None

        def poll() -> None:
            for i, req in enumerate(recvs):
                if req is None:
                    continue
                try:
                    done = req.Test()
                except MPI.Exception as exc:
                    raise self._engine_error(others[i], exc, "from") from None
                if not done:
                    continue
                word = int(got[2 * i + state[i]])
                state[i] += 1
                recvs[i] = None
                if state[i] == 1:
                    post(i)
                else:
                    second[i] = word
                if word == _MEET_GONE:
                    raise PeerError(
                        f"rank {self.names[others[i]]} gave up building the MPI group of "
                        f"ranks {[self.names[r] for r in ranks]} (it timed out waiting for "
                        f"a member, or failed; see its error); {self.describe()} cannot "
                        f"complete")

        def missing(round_: int) -> list[int]:
            return [self.names[r] for i, r in enumerate(others) if state[i] < round_]

        def what() -> str:
            return (f"{self.describe()}, building the MPI group of ranks "
                    f"{[self.names[r] for r in ranks]}")

        def round_done(k: int) -> None:   # every peer's k-th message in, under the deadline
            waiter = Waiter(self.settings, what, lambda: missing(k), check)
            while True:
                with self._lock:
                    poll()
                if min(state) >= k:
                    return
                self.idle(0, waiter)

        try:
            with self._lock:
                tell(_MEET_HELLO)
                for i in range(n):
                    post(i)
            try:
                round_done(1)
            except BaseException:
                with self._lock, contextlib.suppress(RingletError):
                    tell(_MEET_GONE)   # the others must not finish: they hear this rank left
                raise
            with self._lock:
                tell(_MEET_READY)
            failed: BaseException | None = None
            try:
                round_done(2)
            except PeerError as exc:
                if any(w == _MEET_GONE for w in second):
                    raise
                failed = exc
            except BaseException as exc:   # noqa: BLE001 - kept, raised below
                failed = exc
            if failed is not None:   # READYs may be on their way: then every member builds
                end = time.monotonic() + _READY_GRACE_S
                while min(state) < 2 and time.monotonic() < end:
                    with self._lock:
                        poll()
                    time.sleep(0.001)
                if min(state) < 2:
                    raise failed
            with self._lock:
                MPI.Request.Waitall(sends)   # one byte each: sent already, or at once
            sends.clear()
            return failed
        except BaseException:
            with self._lock:   # take back what can be taken back
                for req in recvs:
                    if req is not None:
                        with contextlib.suppress(MPI.Exception):
                            req.Cancel()
                            req.Wait()
                for req in sends:
                    if req != MPI.REQUEST_NULL:
                        with contextlib.suppress(MPI.Exception):
                            req.Free()
            raise
