"""The flight recorder: every communicator's last operations, dumped when something goes wrong.

Each communicator keeps a bounded ring (``RINGLET_FLIGHT_RECORDS``, default
256) of its last operations, collectives and point-to-point alike.  A record
is one small list, made when the operation starts and finished in place::

    [seq, info, algorithm, t_start, t_end]  (+ t_queued, + a failure's dict)

``seq`` is the collective's sequence number (a point-to-point operation's
own counter); ``info`` the collective's :class:`~ringlet.agreement.Desc`
(collective, op, dtype, count, root, algorithm, path) or ``(SEND or RECV,
peer, tag, dtype code, bytes)``; the times are ``time.monotonic_ns()`` (0:
not yet), which every process of a host shares.  A collective's end is
timed only when tracing: otherwise ``t_end`` is :data:`DONE` once it
finished (dumps say ``"state": "done"`` and no end time), which saves the
second clock read of every call (see benchmarks/RECORDER.md: two reads cost
an 8 B all_reduce at 2 ranks 3-4 %, the budget is 2 %).  A call queued
behind async work has its queueing time appended; a failed operation a dict
(``error``, ``waiting_on``: the ranks a timed-out wait still waited for;
``t_failed_us``: when it failed, its end in a trace).
The state is read from these: queued, started, done or failed.  Adding a
record costs one five-item list (which is also the communicator's call in
progress), one list store and one clock read; nothing is formatted until a
dump.  The ring keeps the last ``RINGLET_FLIGHT_RECORDS`` collectives (in
slots by sequence number) and as many sends and receives; a dump has the
last ``RINGLET_FLIGHT_RECORDS`` of them all, and any older one still queued
or running (async calls queued behind it, or later sends, pushed it out).

A dump (:func:`dump`) writes ``DIR/rank-R.json`` (``RINGLET_DUMP_DIR``) with
every live communicator of the process (each with its ``id``: ``"world"``, or
the token its members agreed on when it was split off): on a timeout, an abort, a mismatch
(the communicator calls it), and on ``SIGUSR1`` (the handler is installed by
the first communicator when a dump directory is set and the program has no
SIGUSR1 handler of its own; ``rank-R.signal`` says so to ``ringlet run``).
:mod:`ringlet.diagnose` reads the dumps of every rank.

With ``RINGLET_TRACE=DIR`` every record also becomes a Chrome trace event in
``DIR/rank-R.trace.jsonl`` (one JSON event a line, written in batches, as the
communicator closes and at exit); ``ringlet run --trace`` merges them
(:func:`ringlet.tracing.merge`).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .agreement import GENERIC, POST, SHARED, STAGE, Desc, coll_name, describe
from .ops import ReduceOp, dtype_of_code

if TYPE_CHECKING:
    from .comm import Communicator

#: point-to-point kinds (the first item of a send's or receive's info)
SEND, RECV = 1, 2
#: record fields
SEQ, INFO, ALGO, T_START, T_END = range(5)
#: T_END of a collective that finished when its end was not timed (no trace)
DONE = 1
#: finished records a trace keeps in memory before it writes them out
TRACE_BATCH = 4096
FORMAT = "ringlet-flight-recorder/1"

now_ns = time.monotonic_ns

_PATHS = {GENERIC: "generic", POST: "fused one-shot", STAGE: "fused staged",
          SHARED: "zero-copy"}


class FlightRecorder:
    """One communicator's ring of records (and its trace, when tracing)."""

    def __init__(self, capacity: int, world_ranks: list[int], rank: int, trace_dir: str) -> None:
        self.cap = max(1, capacity)
        #: the last ``cap`` collectives: call ``seq``'s record in slot ``seq % cap``, stored
        #: there by the communicator's hot path itself (cheaper than a method call)
        self.slots: list[list[Any] | None] = [None] * self.cap
        #: the last ``cap`` sends and receives
        self.ring: deque[list[Any]] = deque(maxlen=self.cap)
        #: the compiled path's object, whose own ring has the calls it did (ringlet.lean)
        self.lean: Any = None
        self.world_ranks = world_ranks
        self.rank = rank
        #: which communicator: "world", or the token its members agreed on when it was split
        #: off (two communicators of the same ranks are told apart by it)
        self.ident = "world"
        self.p2p_seq = 0
        #: nanoseconds to add to this process's clock to get the job's clock (rank 0's);
        #: 0 on rank 0's node (measured at init on the other nodes when tracing: align)
        self.offset_ns = 0
        self.trace_dir = trace_dir
        #: records pushed out of the ring (or a slot) while still queued or running, kept
        #: until they end: the call a rank is stuck in is the one a dump must show
        self.held: list[list[Any]] = []
        self._trace: list[list[Any]] = []
        self._lock = threading.Lock()
        #: tracing: collectives' ends are timed (T_END a clock reading, not DONE) and every
        #: record also goes to the trace (:meth:`traced`)
        self.timed = bool(trace_dir)
        #: add(record): a send's or receive's record
        self.add: Callable[[list[Any]], None] = self.ring.append
        if trace_dir:
            self.add = self._add_traced
            _TRACING.append(self)

    def put(self, seq: int, rec: list[Any]) -> None:
        """Keep collective ``seq``'s record (what the hot path does inline; this is the
        queued call's way, which may push out call ``seq - cap`` still running)."""
        self._hold(self.slots[seq % self.cap])
        self.slots[seq % self.cap] = rec
        if self.timed:
            self.traced(rec)

    def _add_traced(self, rec: list[Any]) -> None:
        self.ring.append(rec)
        self.traced(rec)

    def traced(self, rec: list[Any]) -> None:
        """Also write ``rec`` to the trace (once it is finished: :meth:`flush_trace`)."""
        self._trace.append(rec)
        if len(self._trace) >= TRACE_BATCH:
            self.flush_trace()

    def _hold(self, old: list[Any] | None) -> None:
        """``old`` leaves the ring: kept in :attr:`held` if it has not ended."""
        if old is not None and not _finished(old):
            self.held = [r for r in self.held if not _finished(r)] + [old]

    def p2p(self, kind: int, peer: int, tag: int, dtype: int, nbytes: int,
            after: int = 0) -> list[Any]:
        """The record of a send or receive (started now), made after the communicator's
        collective #``after`` (kept where a collective's algorithm is: it orders them)."""
        if len(self.ring) == self.cap:
            self._hold(self.ring[0])
        self.p2p_seq += 1
        rec = [self.p2p_seq, (kind, peer, tag, dtype, nbytes), after, now_ns(), 0]
        self.add(rec)
        return rec

    @property
    def world_rank(self) -> int:
        return self.world_ranks[self.rank]

    # --- output -------------------------------------------------------------------------

    def records(self) -> list[dict[str, Any]]:
        """The ring as JSON-ready dicts, oldest first (times in microseconds, job clock)."""
        colls = [r for r in list(self.slots) if r is not None]
        colls += [r for r in self.held if not _finished(r)]
        if self.lean is not None:   # the calls the compiled path did (ringlet.lean)
            from .lean import records

            colls += records(self.lean)
        # in call order: a send or receive after the collective it followed (by number, not
        # by time: the compiled path's start times are the coarse clock's, up to a tick
        # behind, see ringlet.lean)
        recs = sorted([*colls, *self.ring], key=_order)
        # the last ``cap``, and any older one still queued or running
        recs = [r for r in recs[:-self.cap] if not _finished(r)] + recs[-self.cap:]
        return [record_json(r, self.offset_ns) for r in recs]

    def align(self, offset_ns: int, rtt_ns: int) -> None:
        """Take ``offset_ns`` to rank 0's clock (:func:`ringlet.tracing.clock_offset`); a
        trace's file starts with a line saying so (``ringlet run`` puts it in the merged
        trace's ``otherData.clocks``)."""
        self.offset_ns = offset_ns
        if not self.trace_dir:
            return
        from .tracing import CLOCK_EVENT

        self._append_trace([{"name": CLOCK_EVENT, "ph": "M", "pid": 0,
                             "tid": self.world_rank,
                             "args": {"offset_us": round(offset_ns / 1000, 3),
                                      "round_trip_us": round(rtt_ns / 1000, 3)}}])

    def flush_trace(self, final: bool = False, wait: bool = True) -> None:
        """Write the finished records of the trace (all of them if ``final``); without
        ``wait``, nothing if another flush holds the lock (a dump in a signal handler may
        have interrupted this thread's own flush)."""
        if not self._lock.acquire(blocking=wait):
            return
        try:
            # each record looked at once (another thread may finish it meanwhile: looked at
            # twice, it was in neither part), and the list kept (a record another thread
            # appends meanwhile stays, after the first n)
            n = len(self._trace)
            done: list[list[Any]] = []
            keep: list[list[Any]] = []
            for r in self._trace[:n]:
                (done if final or _finished(r) else keep).append(r)
            if not done:
                return
            self._trace[:n] = keep
        finally:
            self._lock.release()
        self._append_trace([trace_event(r, self) for r in done])

    def close(self) -> None:
        """The communicator closed: write the rest of its trace now (a forked rank of
        ``ringlet.spawn`` ends with ``os._exit``, which runs no exit handler)."""
        if self.trace_dir:
            self.flush_trace(final=True)
            with contextlib.suppress(ValueError):
                _TRACING.remove(self)

    def _append_trace(self, events: list[dict[str, Any]]) -> None:
        """Write events to this rank's trace file (created afresh by the first write of
        this process, appended to after)."""
        path = os.path.join(self.trace_dir, f"rank-{self.world_rank}.trace.jsonl")
        data = "".join(json.dumps(e) + "\n" for e in events).encode()
        with contextlib.suppress(OSError):
            os.makedirs(self.trace_dir, exist_ok=True)
            with _OPEN_LOCK:   # emptied before it is marked (a dump in a signal handler
                if path not in _OPENED:   # may come in here: it finds it empty or marked)
                    open(path, "w").close()
                    _OPENED.add(path)
            # the batch in one write at the end: another communicator's (another thread)
            # or a dump's written at the same time cut its lines (buffered, 8 KiB a write)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)


#: recorders that trace (written out at exit); trace files this process has started
_TRACING: list[FlightRecorder] = []
_OPENED: set[str] = set()
_OPEN_LOCK = threading.RLock()


#: the ``rank-R.signal`` marker this process wrote, and its pid (see install_signal)
_marker: tuple[str, int] | None = None


@atexit.register
def finish() -> None:
    """This process's recorders at its end: the traces' last records written, SIGUSR1
    ignored from here on and the ``rank-R.signal`` marker removed.  An exit handler, and
    called by a rank of ``ringlet.spawn`` before it ends (a forked one runs none)."""
    for fr in list(_TRACING):
        with contextlib.suppress(Exception):
            fr.flush_trace(final=True)
    global _marker
    if _marker is not None and _marker[1] == os.getpid():
        # ignored: when Python finalizes it restores SIGUSR1's default action, which would
        # kill a rank that ringlet run asks for a dump as it exits
        with contextlib.suppress(ValueError, OSError):   # ValueError: not the main thread
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        with contextlib.suppress(OSError):
            os.remove(_marker[0])
        _marker = None


def _dtype_name(code: int) -> str:
    dt = dtype_of_code(code)
    return dt.name if dt is not None else str(code)


def _order(r: list[Any]) -> tuple[int, int, int]:
    """A record's place in call order: a collective's number; a send's or receive's, the
    collective it followed and its own number after it."""
    if type(r[INFO]) is Desc:
        return (r[SEQ], 0, 0)
    return (r[ALGO] if isinstance(r[ALGO], int) else 0, 1, r[SEQ])


def _failure(r: list[Any]) -> dict[str, Any] | None:
    return r[-1] if len(r) > 5 and isinstance(r[-1], dict) else None


def _finished(r: list[Any]) -> bool:
    """Done or failed (a queued call's record is as long as a failed one's: it has its
    queueing time where a failure has its dict)."""
    return bool(r[T_END]) or _failure(r) is not None


def _queued(r: list[Any]) -> int:
    return r[5] if len(r) > 5 and isinstance(r[5], int) else 0


def _state(r: list[Any]) -> str:
    if _failure(r) is not None:
        return "failed"
    if r[T_END]:
        return "done"
    return "started" if r[T_START] else "queued"


def _us(t: int, offset: int) -> float | None:
    return None if t in (0, DONE) else round((t + offset) / 1000, 3)


def record_json(r: list[Any], offset: int = 0) -> dict[str, Any]:
    """One record as a dict: what a dump holds (see the module documentation)."""
    out: dict[str, Any]
    if type(r[INFO]) is Desc:
        d: Desc = r[INFO]
        dt = dtype_of_code(d.dtype)
        out = {"kind": coll_name(d.collective), "seq": r[SEQ], "what": describe(r[SEQ], d),
               "count": d.elems, "bytes": d.elems * dt.itemsize if dt else 0,
               "dtype": _dtype_name(d.dtype) if d.dtype else None,
               "algorithm": r[ALGO] or None, "path": _PATHS[d.path & 3]}
        if out["kind"] in ("all_reduce", "reduce", "reduce_scatter") and \
                d.op in ReduceOp._value2member_map_:
            out["op"] = ReduceOp(d.op).name
        if out["kind"] in ("broadcast", "reduce", "scatter", "gather"):
            out["root"] = d.root
        if d.rejected:
            out["rejected"] = True
    else:
        k, peer, tag, dtype, nbytes = r[INFO]
        kind = "send" if k == SEND else "recv"
        who = f"rank {peer}" if peer >= 0 else "any rank"    # a receive's ANY_SOURCE (-1)
        out = {"kind": kind, "seq": r[SEQ], "peer": peer, "tag": tag, "bytes": nbytes,
               "dtype": _dtype_name(dtype),
               "what": f"{kind} {'to' if kind == 'send' else 'from'} {who} "
                       f"({f'tag {tag}' if tag >= 0 else 'any tag'})"}
    out["state"] = _state(r)
    out["t_queued_us"] = _us(_queued(r), offset)
    out["t_start_us"] = _us(r[T_START], offset)
    out["t_end_us"] = _us(r[T_END], offset)
    fail = dict(_failure(r) or {})
    t_failed = fail.pop("t_failed_ns", 0)
    if t_failed:   # when it failed: its end in a trace (a wait that timed out lasts)
        out["t_failed_us"] = _us(t_failed, offset)
    out.update(fail)
    return out


def failed(rec: list[Any] | None, exc: BaseException) -> None:
    """Mark ``rec`` failed with ``exc`` (and whom a timed-out wait waited for)."""
    if rec is None or _failure(rec) is not None:
        return
    info: dict[str, Any] = {"error": f"{type(exc).__name__}: {exc}", "t_failed_ns": now_ns()}
    on = getattr(exc, "waiting_on", None)
    if on is not None:
        info["waiting_on"] = list(on)
    rec.append(info)


def trace_event(r: list[Any], fr: FlightRecorder) -> dict[str, Any]:
    """One record as a Chrome trace event (``ph: X``, on its rank's row: the merged trace
    gives operations that overlap rows of their own, :func:`ringlet.tracing.merge`)."""
    j = record_json(r, fr.offset_ns)
    start = j["t_start_us"] or j["t_queued_us"] or 0.0
    end = j["t_end_us"] or j.get("t_failed_us") or start
    args: dict[str, Any] = {"seq": j["seq"], "bytes": j["bytes"], "state": j["state"],
                            "comm": ",".join(map(str, fr.world_ranks)), "comm_id": fr.ident,
                            "rank": fr.world_rank}
    if type(r[INFO]) is Desc:
        args.update(algorithm=j["algorithm"], path=j["path"], count=j["count"],
                    dtype=j["dtype"], peers=fr.world_ranks)
        if "root" in j:   # a rooted collective's (the report draws its schedule from it)
            args["root"] = j["root"]
        name = j["what"].split(" (")[0]
        cat = "collective"
    else:
        peer = j["peer"]
        world = fr.world_ranks[peer] if peer >= 0 else -1   # -1: any source
        args.update(peers=[world] if peer >= 0 else [], tag=j["tag"], dtype=j["dtype"])
        name = j["what"]
        if peer >= 0 and world != peer:   # on a group: the rows are world ranks
            name = name.replace(f"rank {peer} ", f"rank {peer} (world rank {world}) ", 1)
        cat = "p2p"
    if "error" in j:
        args["error"] = j["error"]
    return {"name": name, "cat": cat, "ph": "X", "ts": start, "dur": round(end - start, 3),
            "pid": 0, "tid": fr.world_rank, "args": args}


# --- dumps ---------------------------------------------------------------------------------


def _live() -> list[Communicator]:
    from .comm import _LIVE

    return sorted(_LIVE, key=lambda c: c._created)


def comm_json(c: Communicator) -> dict[str, Any]:
    """One communicator's part of a dump."""
    fr = c._fr
    out: dict[str, Any] = {"id": fr.ident if fr is not None else None,
                           "ranks": c._world_ranks, "rank": c.rank, "size": c.size,
                           "seq": c._seq, "broken": c._broken,
                           "ops": fr.records() if fr is not None else []}
    return out


def dump(reason: str, comms: Iterable[Communicator] | None = None,
         directory: str | None = None) -> str | None:
    """Write this process's flight recorders to ``DIR/rank-R.json``; return the path.

    ``comms``: the communicators to write (default: every live one of the
    process); ``directory``: default the communicators' ``dump_dir`` setting.
    Never raises (a dump runs while something else already went wrong).
    """
    global _dumping
    on_demand = reason.startswith("SIGUSR1")
    if on_demand and (_dumping or not _went_on(comms)):
        # the signal came in the middle of a dump (that one is written, not a second on
        # top), or this process is failing (its dump says why, and it is on its way out)
        return None
    from .transport.base import read_only

    _dumping += 1
    try:
        with read_only():   # it may have interrupted a poll or a post: do neither again
            return _dump(reason, on_demand, comms, directory)
    except Exception:  # noqa: BLE001 - see the docstring
        return None
    finally:
        _dumping -= 1


def _dump(reason: str, on_demand: bool, comms: Iterable[Communicator] | None,
          directory: str | None) -> str | None:
    """:func:`dump`'s work (which see), within ``read_only``."""
    global _failure_dumped
    before = _failure_dumped
    cs = list(_live() if comms is None else comms)
    if not cs:
        return None
    directory = directory or cs[0].settings.dump_dir
    if not directory:
        return None
    world = cs[0]._world_ranks[cs[0].rank]
    waits = []
    from .wait import WAITS

    for ident, w in list(WAITS.items()):
        on = w.waiting_on()
        if on:
            waits.append({"thread": ident, "what": w.what(), "waiting_on": on})
    doc = {"format": FORMAT, "rank": world, "pid": os.getpid(), "host": socket.gethostname(),
           "job": cs[0].job_id, "reason": reason, "time_unix": time.time(),
           "now_us": _us(now_ns(), cs[0]._fr.offset_ns if cs[0]._fr else 0),
           "flight_records": cs[0].settings.flight_records,
           "waits": waits, "comms": [comm_json(c) for c in cs]}
    for c in cs:   # the trace so far: a rank asked for its dump may be stopped next (SIGTERM
        fr = c._fr  # ends it without its exit handlers, which write the rest)
        if fr is not None and fr.trace_dir:
            fr.flush_trace(wait=False)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"rank-{world}.json")
    # a file of its own: two dumps at once (a failure on the worker thread, SIGUSR1 on the
    # main one) must not write into one file
    tmp = f"{path}.{os.getpid()}.{next(_tmp_ids)}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
    if on_demand and _failure_dumped is not before:   # a failure's dump was written
        os.unlink(tmp)                                 # meanwhile: it stays
        return None
    os.replace(tmp, path)
    if not on_demand:
        _failure_dumped = {getattr(c, "_created", 0): c._seq for c in cs}
    return path


def _went_on(comms: Iterable[Communicator] | None) -> bool:
    """No failure was dumped, or a call was made since (a MismatchError caught, a failed
    group left behind): a dump asked for now is news, the rank may hang there."""
    at = _failure_dumped
    return at is None or any(c._seq > at.get(getattr(c, "_created", 0), -1)
                             for c in (_live() if comms is None else comms))


_installed = False
#: each communicator's calls (by its ``_created``) when this process's failure was dumped
_failure_dumped: dict[int, int] | None = None
_dumping = 0                     # dumps in progress in this process
_tmp_ids = itertools.count()     # their temporary files' numbers


def install_signal(comm: Communicator) -> None:
    """Dump on SIGUSR1 (once per process, in the main thread, if the program has no SIGUSR1
    handler of its own); ``DIR/rank-R.signal`` (the pid) tells ``ringlet run`` it may ask."""
    global _installed, _marker
    directory = comm.settings.dump_dir
    sig = getattr(signal, "SIGUSR1", None)
    if _installed or not directory or sig is None or \
            threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(sig) not in (signal.SIG_DFL, None):
        return
    signal.signal(sig, lambda signum, frame: dump("SIGUSR1 (on demand)"))
    _installed = True
    marker = os.path.join(directory, f"rank-{comm._world_ranks[comm.rank]}.signal")
    pid = os.getpid()
    with contextlib.suppress(OSError):
        os.makedirs(directory, exist_ok=True)
        with open(marker, "w") as f:
            f.write(str(pid))
    _marker = (marker, pid)   # removed by finish()
