"""The path of every call: numbering, agreement, execution and failure (a mixin of
:class:`~ringlet.comm.Communicator`).

Every collective goes through the same path:

1. validate the arguments locally.  A rejected call raises ``ArgumentError``
   on this rank at once, naming the rank, and is still numbered: the rank
   publishes a *rejected* descriptor under the call's sequence number, so
   that its peers raise a ``MismatchError`` quoting the reason, and the calls
   after it keep pairing with the right ones.  Any exception that escapes
   validation (a ``TypeError`` from a strange argument) is turned into such
   an ``ArgumentError``: every rank must hear of every call;
2. take the next sequence number and publish a descriptor
   (:class:`~ringlet.agreement.Desc`: collective, op, dtype, count, shape,
   root, algorithm, path); wait until every rank has published its
   descriptor for that number and compare them all: a disagreement raises
   ``MismatchError`` on every rank, a rank that never arrives a
   ``CommTimeoutError`` naming it;
3. run this rank's steps of the chosen schedule (:mod:`ringlet.executor`).
   A two-level all_reduce on the engine's own all_reduce (:mod:`ringlet.rails`)
   starts once the ranks of its node agree, and finishes the agreement with
   the other nodes before its first message leaves the node.

A failure in step 3 (a peer died, a deadline passed, Ctrl-C) aborts the
communicator on every rank, so the others fail fast instead of waiting for
their own deadline; a ``KeyboardInterrupt`` reaches the caller as it is.

A rank publishes call s+1 where call s-1 was (two alternating places) and
the one-shot path writes its data there too, so it may only do so once every
peer has finished call s-1, that is, once every peer has published call s.
The agreement of a call that runs waits for that; a rejected call does not
wait, so the next call waits first (:meth:`Communicator._settle`).

One thread makes a communicator's calls (:meth:`Communicator._check_thread`):
two threads' calls would pair up differently on different ranks.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np

from . import agreement, recorder
from .agreement import RAILS, Desc, algo_code, describe
from .algorithms import algorithms as _algorithms
from .buffers import Buffer
from .config import Settings
from .errors import ArgumentError, CommTimeoutError, MismatchError, PeerError, RingletError
from .recorder import DONE, T_END, T_START, FlightRecorder, now_ns
from .transport.base import Transport
from .wait import INTERRUPTS, Waiter
from .work import Work

if TYPE_CHECKING:
    from .algorithms.select import Tuner
    from .comm import Communicator

log = logging.getLogger("ringlet")

#: the engine's own collectives (an algorithm name)
NATIVE = "native"
#: calls made of other collectives: the descriptors of their parts carry this name
_COMPOUND = frozenset({"split", "group", "broadcast_object", "all_gather_object", "empty",
                       "all_to_all_v", "all_gather_v", "gather_v", "scatter_v",
                       "gather_object", "scatter_object", "all_reduce_coalesced",
                       "all_gather_coalesced"})


def _collective(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Validate on every rank or tell the peers: the wrapper of every collective call.

    A call whose arguments this rank rejects raises ArgumentError here at
    once, naming this rank; the rank also publishes an error descriptor under
    the call's sequence number, so that its peers raise a MismatchError
    quoting it instead of waiting for it until their deadline.  Any other
    exception raised while the arguments are checked (a TypeError from a
    strange argument, say) becomes such an ArgumentError too: every rank
    must hear of every call, or the calls after it pair up wrongly.
    """
    name = fn.__name__
    compound = name in _COMPOUND

    def wrapper(self: Communicator, *args: Any, **kwargs: Any) -> Any:
        if self._owner_id != threading.get_ident():
            self._check_thread(name)
        outer = compound and self._api is None
        if outer:
            self._api = name
        seq = self._seq
        try:
            return fn(self, *args, **kwargs)
        except Exception as exc:
            err = self._refused(name, seq, exc)
            if err is exc:
                raise
            raise err from exc
        except BaseException as exc:
            # Ctrl-C, or a SystemExit (a signal handler's sys.exit, an object's __reduce__)
            # that a caller may catch: the peers must hear of it, or they pair this call
            # with this rank's next one, silently
            self._interrupt(exc, f"{name} (call #{self._seq + 1})")   # (its next part's)
            raise
        finally:
            if outer:
                self._api = None

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
    return wrapper


def check_async(async_op: Any) -> None:
    """An ArgumentError unless ``async_op`` is a bool (a compound call checks it before
    its first part: a rank that raised after it would skip the rest its peers run)."""
    if not isinstance(async_op, (bool, np.bool_)):
        raise ArgumentError(f"async_op must be True or False, got {async_op!r}")


class Calls:
    """Numbering, agreement, execution and failure of a communicator's calls."""

    rank: int
    size: int
    settings: Settings
    _t: Transport
    _seq: int
    _exec_lock: threading.RLock
    _submit_lock: threading.Lock
    _queue: queue.Queue[Any] | None
    #: the worker thread's ident, once it runs (close() must not wait for itself on it)
    _worker_ident: int | None = None
    #: Ctrl-C in a call of the owner thread while async work ran, and the call it
    #: interrupted: the worker aborts once its call ends (see _interrupt)
    _stopped: tuple[BaseException, str] | None = None
    _inflight: int
    _broken: str | None
    _closed: bool
    #: (seq, desc, ...) of the call in progress: its flight record when recording
    _cur: Sequence[Any] | None
    #: the sequence number of the collective running (0 between them): see _calls_state
    _now: int = 0
    #: the part of the running call's agreement left for later (see _agree)
    _rest: tuple[int, dict[int, Desc], list[int]] | None = None
    #: the call being run falls back to the staged path (agreement.staged)
    _staged = False
    #: the automatic choice's tuner, fixed when the communicator was made: the profile the
    #: ranks agreed on at start-up (ringlet.startup._tuned; a split inherits it), or None
    _tuner: Tuner | None = None
    _api: str | None
    _pending_reject: int | None
    _node_peers: tuple[int, ...]
    _owner: threading.Thread | None
    _owner_id: int
    #: the compiled small all_reduce (ringlet.lean), None where it does not apply
    _lean: Any
    #: the flight recorder (None with RINGLET_FLIGHT_RECORDS=0 and no trace)
    _fr: FlightRecorder | None
    #: each rank's rank in the job's world (its own numbering on the world itself)
    _world_ranks: list[int]
    #: wraps every call's run (after agreement) when set: ``span(what, algorithm, bytes)``
    #: gives a context manager (the torch backend's profiler ranges)
    _span: Callable[[str, str, int], contextlib.AbstractContextManager[Any]] | None = None

    def _group_legend(self) -> str:
        """On a group (``split``, ``group``): what its ranks are in the world, for error
        messages, which number ranks as the communicator does; "" on the world."""
        w = self._world_ranks
        if w == list(range(len(w))):
            return ""
        if len(w) <= 16:
            ranks = ", ".join(map(str, w))
        elif len({b - a for a, b in zip(w, w[1:], strict=False)}) == 1:
            ranks = f"{w[0]}, {w[1]}, ..., {w[-1]}"
        else:
            ranks = ", ".join(map(str, w[:16])) + ", ..."
        return (f" [ranks here are this group's: its ranks 0-{len(w) - 1} are world ranks "
                f"{ranks}]" if len(w) > 1 else f" [this group's rank 0 is world rank {w[0]}]")

    def _name_group(self, exc: BaseException) -> None:
        """Append :meth:`_group_legend` to a RingletError's message (once)."""
        legend = self._group_legend() if isinstance(exc, RingletError) else ""
        if legend and exc.args and isinstance(exc.args[0], str) and legend not in exc.args[0]:
            exc.args = (exc.args[0] + legend, *exc.args[1:])

    def _submit(self, desc: Desc, run: Callable[[int], Any], async_op: bool, name: str,
                xb: Buffer | None, before: Callable[[int], None] | None = None) -> Any:
        """Number the call and run it inline, or queue it behind pending async work."""
        check_async(async_op)
        self._usable()
        with self._submit_lock:
            self._seq += 1
            seq = self._seq
            if not async_op and not self._inflight:
                # nothing queued: run here (holding the lock keeps the numbering in order)
                return self._execute(seq, desc, run, name, xb, before)
            work = Work(describe(seq, desc))
            self._inflight += 1
            rec = None
            if self._fr is not None:   # queued now, started when the worker runs it
                rec = [seq, desc, name, 0, 0, now_ns()]
                self._fr.put(seq, rec)
            q = self._worker()
            work._runner = self._worker_ident
            q.put((seq, desc, run, work, name, xb, before, rec))
        return work if async_op else work.wait()

    def _refused(self, name: str, seq: int, exc: Exception) -> Exception:
        """What a call ``name`` raises for ``exc``, which it raised itself (``seq``: the
        communicator's sequence number when the call began).  Raised before the call was
        numbered, an ArgumentError (or any other exception, which becomes one: a
        TypeError from a strange argument, say) names this rank and is published as the
        call's rejection (:meth:`_reject`), so that the peers raise too and the calls
        after it pair up rightly; on a group every RingletError says what its ranks are
        in the world.  The torch backend's own checks (:mod:`ringlet.torch`) come here
        too, before they reach a call of the communicator."""
        if isinstance(exc, RingletError) and not isinstance(exc, ArgumentError) or \
                getattr(exc, "unpublished", False):
            # (the last: a call from a thread not the communicator's, which must number
            # and publish nothing, or the owner's calls pair wrongly after it)
            self._name_group(exc)
            return exc
        if self._seq != seq or self._closed or self._broken is not None:
            if isinstance(exc, ArgumentError):
                self._name_group(exc)
            return exc
        if isinstance(exc, ArgumentError):   # named after the call the user made
            note, head = str(exc), f"{self._api or name} on rank {self.rank}: "
            note = note.removeprefix(head)   # named already (the torch backend's calls)
            exc.args = (head + note,)
            err = exc
        else:
            note = f"bad argument ({type(exc).__name__}: {exc})"
            err = ArgumentError(f"{self._api or name} on rank {self.rank}: {note}")
        self._reject(name, note, err)
        self._name_group(err)
        return err

    def _between(self, make: Callable[[], Any]) -> Any:
        """``make()``: this rank's own step between two parts of a compound call, such as
        allocating what the next part fills (its size known from the first).  If it
        fails (out of memory), the next part is published as rejected, so that the
        peers raise a MismatchError quoting why and the calls after it pair up; then
        the error is raised here as it is."""
        try:
            return make()
        except Exception as exc:
            note = f"{type(exc).__name__}: {exc}"
            self._reject(self._api or "call", note, ArgumentError(note))
            raise

    def _reject(self, coll: str, note: str, exc: ArgumentError) -> None:
        """Publish an error descriptor under the next sequence number (see _collective).

        The call is numbered like any other, so the calls after it keep pairing
        with the right ones on every rank.
        """
        desc = agreement.rejected(self._api or coll)

        def publish(seq: int) -> None:
            self._t.publish(seq, agreement.packed(desc), note)
            self._pending_reject = seq

        with self._submit_lock:
            self._seq += 1
            seq = self._seq
            if self._inflight:
                self._inflight += 1
                self._worker().put((seq, desc, publish, Work(describe(seq, desc)), "", None,
                                    None, None))
                return
            try:
                self._execute(seq, desc, publish, "", None, None)
            except RingletError as err:  # the peers never came: the communicator is aborted
                raise err from exc

    def _interrupt(self, exc: BaseException, where: str) -> None:
        """Ctrl-C in a call of the owner thread (``where``): abort the communicator, or
        the peers wait for this rank to their deadline and the calls after it pair up
        wrongly.  While async work runs (the call queued behind it, waiting for it, or on
        its way there) the worker does it: its next wait raises ``exc`` and fails its call
        on every rank, as an interrupted inline call does, or, if its calls end first, it
        aborts then (see _work_loop: the interrupt was dropped there, and the peers went on
        to pair this rank's next call with the one it was interrupted in)."""
        with self._submit_lock:
            if self._inflight and self._worker_ident is not None:
                INTERRUPTS[self._worker_ident] = exc
                self._stopped = (exc, where)
                return
        if self._broken is None and not self._closed:
            self._fail(exc, where)

    def _worker(self) -> queue.Queue[Any]:
        if self._queue is None:
            # the queue is published last: Ctrl-C in between leaves no queue that no thread
            # reads (every later call would wait on it), nor a worker whose ident is unknown
            # (an interrupt could not reach its call)
            q: queue.Queue[Any] = queue.Queue()
            t = threading.Thread(target=self._work_loop, args=(q,), name=f"ringlet-{self.rank}",
                                 daemon=True)
            t.start()
            self._worker_ident = t.ident
            self._queue = q
        return self._queue

    def _work_loop(self, q: queue.Queue[Any]) -> None:
        from .wait import background

        background()
        while True:
            item = q.get()
            if item is None:
                return
            seq, desc, run, work, name, xb, before, rec = item
            try:
                res = None if desc is None else self._execute(seq, desc, run, name, xb, before,
                                                              rec)
                work._finish(res)
            except BaseException as exc:  # delivered to the waiter
                if isinstance(exc, KeyboardInterrupt) and self._broken is not None:
                    # Ctrl-C reaches this thread only from the owner's (wait.INTERRUPTS),
                    # which raised its own: a later wait() of this call says what its
                    # peers heard, not KeyboardInterrupt again
                    exc = PeerError(self._broken)
                work._finish(error=exc)
            finally:
                with self._submit_lock:
                    # Ctrl-C in Work.wait for a call that ended meanwhile has nothing left
                    # to stop; in a call of the owner thread it aborts (see _interrupt)
                    INTERRUPTS.pop(threading.get_ident(), None)
                    stopped, self._stopped = self._stopped, None
                    if stopped is not None and self._broken is None and not self._closed:
                        self._fail(*stopped)
                    if desc is not None:
                        self._inflight -= 1

    def _root(self, root: Any) -> int:
        if not isinstance(root, (int, np.integer)) or isinstance(root, bool):
            raise ArgumentError(f"root must be an int, got {root!r}")
        if not 0 <= root < self.size:
            raise ArgumentError(
                f"root {root} is out of range for a communicator of size {self.size} "
                f"(valid: 0..{self.size - 1})")
        return int(root)

    def _usable(self) -> None:
        if self._closed:
            raise RingletError("the communicator is closed")
        if self._broken is not None:
            raise PeerError(f"the communicator was aborted earlier: {self._broken}")

    def _check_thread(self, what: str) -> None:
        """One thread makes a communicator's calls: the first one that calls it.

        Calls of two threads would pair up differently on different ranks (nothing
        orders them), so a second thread gets an ArgumentError at once, before
        anything is numbered or published; once the first thread has ended,
        another may take over.  Use one communicator per thread (``split``).
        """
        me = threading.current_thread()
        owner = self._owner
        if owner is me:
            return
        if owner is None or not owner.is_alive():
            self._owner, self._owner_id = me, threading.get_ident()
            return
        if threading.get_ident() == self._worker_ident:
            err = ArgumentError(
                f"{what} on rank {self.rank}: called from a callback on ringlet's worker "
                f"thread (a torch future's .then(), or a Work's), which finished an "
                f"asynchronous call of thread {owner.name!r}; a call made there would pair "
                f"up differently on different ranks. Wait for the future on {owner.name!r} "
                f"and make the call there (torch's PowerSGD hook chains collectives in "
                f"callbacks: not supported; allreduce_hook and fp16_compress_hook are)")
        else:
            err = ArgumentError(
                f"{what} on rank {self.rank}: this communicator's calls are made by thread "
                f"{owner.name!r}, and thread {me.name!r} called it too; calls from two "
                f"threads would pair up differently on different ranks. Make every call from "
                f"one thread, or give each thread its own communicator (comm.split(color=0) "
                f"once per thread, in the same order on every rank)")
        err.unpublished = True   # type: ignore[attr-defined]  # see _refused
        raise err

    @property
    def _current(self) -> str:
        """The call in progress, described for messages (formatted only when needed)."""
        cur = self._cur
        return "a collective" if cur is None else describe(cur[0], cur[1])

    def _execute(self, seq: int, desc: Desc, run: Callable[[int], Any],
                 name: str, xb: Buffer | None,
                 before: Callable[[int], None] | None = None,
                 rec: list[Any] | None = None) -> Any:
        with self._exec_lock:
            self._usable()
            fr = self._fr
            if fr is None:
                self._cur = (seq, desc)
            elif rec is None:   # the flight recorder: one list per call (ringlet.recorder),
                self._cur = rec = [seq, desc, name, now_ns(), 0]   # also the call in progress
                fr.slots[seq % fr.cap] = rec   # FlightRecorder.put, inline
                if fr.timed:
                    fr.traced(rec)
            else:   # a call that was queued: its record was made then
                self._cur = rec
                rec[T_START] = now_ns()
            self._now = seq
            try:
                self._settle()
                if desc.rejected:
                    res = run(seq)
                    if rec is not None:
                        rec[T_END] = now_ns() if fr.timed else DONE   # type: ignore[union-attr]
                    return res
                if before is not None:
                    before(seq)
                self._agree(seq, desc, self._node_peers if desc.path == RAILS else None)
                if log.isEnabledFor(logging.INFO) and desc.collective != agreement.COLL_CODE[
                        "barrier"]:
                    log.info("rank %d: %s algorithm %s%s, %d B", self.rank, self._current,
                             name or _alg_name(agreement.coll_name(desc.collective),
                                               desc.algorithm),
                             " (fused)" if desc.path else "", xb.nbytes if xb else 0)
                if self._span is not None:
                    with self._span(self._current, name or _alg_name(
                            agreement.coll_name(desc.collective), desc.algorithm),
                            xb.nbytes if xb else 0):
                        res = run(seq)
                else:
                    res = run(seq)
                self._agreed()
                if rec is not None:   # the end is timed when tracing (one clock read less)
                    rec[T_END] = now_ns() if fr.timed else DONE   # type: ignore[union-attr]
                return res
            except MismatchError as exc:
                recorder.failed(rec, exc)
                recorder.dump(f"mismatch: {exc}")
                raise
            except ArgumentError:
                raise
            except BaseException as exc:
                recorder.failed(rec, exc)
                self._failed(exc)
            finally:
                self._now = 0
                self._rest = None

    def _calls_state(self) -> tuple[int, int]:
        """(the collective running, or 0; how many calls have finished) for the
        transport (:attr:`Transport.calls`).  Calls finish in their order: the one
        running, queued or inline, is the first unfinished."""
        now = self._now
        return now, (now - 1 if now else self._seq - self._inflight)

    def _failed(self, exc: BaseException) -> NoReturn:
        """Abort the communicator after ``exc`` (:meth:`_fail`) and raise: a RingletError,
        KeyboardInterrupt or SystemExit as it is, anything else as a PeerError."""
        self._fail(exc)
        if isinstance(exc, RingletError) or not isinstance(exc, Exception):
            raise exc
        raise PeerError(self._broken) from exc

    def _fail(self, exc: BaseException, where: str | None = None) -> None:
        """Abort the communicator on every rank after ``exc`` (this rank's own failure) in
        the call in progress (``where``: the call, if not the last one this rank ran)."""
        if isinstance(exc, (PeerError, CommTimeoutError)) and str(exc).startswith("rank "):
            msg = str(exc)  # already names the rank it started on
        elif isinstance(exc, KeyboardInterrupt):
            msg = (f"rank {self.rank} was interrupted (KeyboardInterrupt) in "
                   f"{where or self._current}")
        elif isinstance(exc, RingletError):
            msg = f"rank {self.rank} failed in {self._current}: {exc}"
        else:
            msg = (f"rank {self.rank} failed in {where or self._current}: "
                   f"{type(exc).__name__}: {exc}")
        self._broken = msg
        self._lean = None
        self._t.discard_pending()
        # after a timeout any rank may be dead, and over MPI a dead rank and a late one look
        # the same, while a send to a dead one can crash MPICH (SIGSEGV in MPI_Isend): the
        # MPI engine then tells nobody (the node hears through shared memory; the others
        # wait for the same missing rank and reach their own deadline)
        timeout = isinstance(exc, CommTimeoutError)
        self._t.abort(msg, timeout=timeout, unsure=timeout)
        kind = "timeout" if timeout else \
            "interrupted" if isinstance(exc, KeyboardInterrupt) else "abort"
        recorder.dump(f"{kind}: {msg}")
        self._name_group(exc)   # an async call's error reaches the caller through Work.wait

    def _settle(self) -> None:
        """Wait until every peer has published the call this rank last rejected.

        A rank publishes call s+1 in the place call s-1 had, and the one-shot
        path writes its data there too: it may only do so once every peer has
        read call s-1, which every peer has once it has published call s.  A
        call that ran had that wait in its agreement; a rejected one has it
        here, before this rank publishes anything else.
        """
        s = self._pending_reject
        if s is None:
            return
        t = self._t
        seen = t.events()
        missing = [q for q in range(self.size) if q != self.rank and t.peer_desc(q, s) is None]
        waiter = None
        while missing:
            if waiter is None:
                waiter = Waiter(t.settings, lambda: self._whereabouts(
                    f"{self._current}, waiting for the peers to reach call #{s} (which rank "
                    f"{self.rank} rejected)", missing), lambda: missing,
                    lambda: t.check(missing))
            t.idle(seen, waiter, lambda: missing)
            seen = t.events()
            missing[:] = [q for q in missing if t.peer_desc(q, s) is None]
        self._pending_reject = None

    def _whereabouts(self, what: str, missing: list[int]) -> str:
        t = self._t
        where = []
        for q in missing:
            last = t.latest_desc(q)
            if last is None:
                where.append(f"rank {q} has not entered any collective")
            else:
                where.append(f"rank {q}'s last call: {describe(last[0], Desc(*last[1]))}")
        return f"{what} ({'; '.join(where)})"

    def _agree(self, seq: int, desc: Desc, first: Sequence[int] | None = None) -> None:
        """Publish this rank's descriptor and compare it with every rank's.

        With ``first`` (the other ranks of this rank's node, for a call whose first
        part stays inside the node: the native rails, :mod:`ringlet.rails`), return
        as soon as those agree with this rank, and leave the other nodes' part to
        :meth:`_agreed`, which the call runs before its first message leaves the node
        (the other nodes' descriptors cross the network meanwhile).  A disagreement
        inside the node waits for every rank, so its message quotes them all."""
        t = self._t
        t.publish(seq, agreement.packed(desc))
        self._staged = False
        if self.size == 1:
            return
        got: dict[int, Desc] = {self.rank: desc}
        missing = [q for q in range(self.size) if q != self.rank]
        if first:
            self._gather(seq, got, [q for q in missing if q in first],
                         [q for q in missing if q not in first])
            if all(d == desc for d in got.values()):
                self._rest = (seq, got, [q for q in missing if q not in got])
                return
            missing = [q for q in missing if q not in got]
        self._gather(seq, got, missing)
        self._staged = agreement.check(seq, got, self.rank, lambda q: t.note(q, seq), _alg_name)

    def _agreed(self) -> None:
        """Finish the agreement :meth:`_agree` left open, if any: raises as the whole
        agreement would have (a MismatchError before the call's data left the node)."""
        rest = self._rest
        if rest is None:
            return
        self._rest = None
        seq, got, missing = rest
        self._gather(seq, got, missing)
        agreement.check(seq, got, self.rank, lambda q: self._t.note(q, seq), _alg_name)

    def _gather(self, seq: int, got: dict[int, Desc], missing: list[int],
                later: Sequence[int] = ()) -> None:
        """Wait under the deadline until the ranks ``missing`` have published call ``seq``,
        adding their descriptors to ``got``.  ``later``: ranks whose descriptors the call
        needs afterwards (the other nodes'); a timeout and the liveness checks include
        those of them that have not published either, so the message names every rank
        that did not arrive."""
        t = self._t
        waiter = None
        while missing:
            seen = t.events()
            for q in list(missing):
                d = t.peer_desc(q, seq)
                if d is not None:
                    got[q] = Desc(*d)
                    missing.remove(q)
            if missing:
                if waiter is None:
                    def late() -> list[int]:
                        return missing + [q for q in later if t.peer_desc(q, seq) is None]

                    waiter = Waiter(t.settings,
                                    lambda: self._whereabouts(self._current, late()),
                                    late, lambda: t.check(late()))
                t.idle(seen, waiter, lambda: missing)


def _alg_name(coll: str, code: int) -> str:
    if code == algo_code(NATIVE):
        return NATIVE
    names = [coll] if coll in agreement.COLLECTIVES[1:9] else agreement.COLLECTIVES[1:9]
    for c in names:
        try:
            for n in _algorithms(c):
                if algo_code(n) == code:
                    return n
        except RingletError:
            pass
    return f"#{code}"


def _configure_logging(level: str) -> None:
    if any(getattr(h, "_ringlet", False) for h in log.handlers):
        return
    h = logging.StreamHandler()
    h.setFormatter(logging.Formatter("ringlet %(levelname)s %(message)s"))
    h._ringlet = True  # type: ignore[attr-defined]
    log.addHandler(h)
    log.setLevel({"WARN": logging.WARNING, "TRACE": logging.DEBUG}.get(level.upper(),
                                                                      logging.INFO))

