"""Starting ranks: ``ringlet run`` (N copies of a script), :func:`spawn` (N calls of a function).

Both start N local processes and hand them to one supervisor
(:func:`_supervise`), so they share one failure policy:

1. When a rank fails (a non-zero exit, or killed by a signal), the others get
   a grace period (``--grace``, :attr:`Settings.grace`) to notice the dead
   peer and exit on their own; a communicator does that quickly, raising
   :class:`~ringlet.errors.PeerError`.
2. After the grace period the survivors get SIGTERM, and SIGKILL one second
   later.
3. The report says which rank failed first (the first to report an uncaught
   exception, else the first to exit with an error) and how each other rank ended:
   it had already finished, it exited on its own, or it was stopped.
   ``ringlet run`` quotes why the first failed rank failed: the uncaught
   exception the rank reported on a private pipe once it got through
   ``ringlet.init`` (:func:`report_uncaught`), else the last one it printed
   on stderr; and it names the ranks that were stopped (SIGSTOP, a
   debugger) when the first one failed, since they are the likely cause.

At the end every file the job left in the shared-memory directory
(``/dev/shm/ringlet-<job id>-*``) is removed.  The transport unlinks its
segments as soon as every rank has mapped them, so this is only the
backstop for ranks killed during start-up.

The ranks never outlive the launcher, however it dies (``kill -9``
included), and leave no file behind:

- a watchdog process (:mod:`ringlet._reaper`, :class:`_Watchdog`) holds the
  read end of a pipe only the launcher writes to; when the pipe ends without
  the launcher's ``done``, it SIGKILLs the ranks (``ringlet run``'s: their
  process groups), waits until they are gone and removes the job's files;
- on Linux the kernel also SIGKILLs each rank when the launcher dies
  (``PR_SET_PDEATHSIG``, set before the rank runs any of the user's code:
  ``ringlet run`` starts a rank through a few lines that set it and exec the
  rank's program; a spawned rank sets it first thing), which holds even if
  the watchdog itself was killed.  Not for ``forkserver`` ranks, whose parent
  is the fork server.

Each job gets a fresh ``RINGLET_JOB_ID`` of 128 random bits, which names its
segments (see :mod:`ringlet.env`).
"""

from __future__ import annotations

import abc
import argparse
import atexit
import contextlib
import os
import pickle
import re
import secrets
import signal
import stat
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from multiprocessing import connection, get_all_start_methods, get_context, process
from multiprocessing.process import BaseProcess
from types import FrameType, TracebackType
from typing import IO, Any

from . import _reaper, recorder
from .config import Settings
from .errors import ArgumentError, ConfigError, RingletError, SpawnError, is_relayed
from .procs import cores, more_files, stopped

#: Seconds between SIGTERM and SIGKILL when the supervisor stops a rank.
KILL_AFTER = 1.0
#: Seconds between exit checks of a child that has no pollable sentinel
#: (``os.pidfd_open`` needs Linux 5.3); other waits block on sentinels.
_POLL = 0.05
#: a signal that comes again within this many seconds is the same one sent twice
#: (``timeout`` sends its child the signal and then its own process group, the child
#: included): a second Ctrl-C, which kills the ranks, comes later than this
SAME_SIGNAL_S = 0.5
#: Seconds the launcher waits for output still buffered in a finished rank's pipes.
_DRAIN = 2.0
#: Seconds ``ringlet run`` gives the ranks to write their flight recorders before it
#: forwards an interrupt or stops them at the timeout (a rank that ends on the signal
#: first would leave none).
DUMP_WAIT_S = 2.0

_Report = tuple[Any, ...]  # ("ok", result) or ("error", type name, message, traceback)


# --- the supervisor ---------------------------------------------------------------------------


class _Child(abc.ABC):
    """One started rank as the supervisor sees it: a sentinel, an exit code, signals."""

    #: True if the process leads its own process group (the watchdog kills the group)
    leads_group = False

    def __init__(self, rank: int, sentinel: int | None, pid: int) -> None:
        self.rank = rank
        self.sentinel = sentinel  # a descriptor that becomes readable when the process ends
        self.pid = pid

    @abc.abstractmethod
    def exitcode(self) -> int | None:
        """The exit code, ``-N`` if killed by signal N, ``None`` while it runs."""

    @abc.abstractmethod
    def send_signal(self, sig: int) -> None:
        """Send ``sig`` if the process still runs."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the handles (after the process has ended)."""

    def kill_group(self) -> None:
        """SIGKILL what is left of the process group it leads (the processes it started,
        which outlive it), once it has ended (a group outlives its leader while a member
        runs, and its number stays the leader's)."""
        if self.leads_group and self.exitcode() is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)


class _PopenChild(_Child):
    def __init__(self, rank: int, popen: subprocess.Popen[bytes]) -> None:
        try:
            fd: int | None = os.pidfd_open(popen.pid)
        except (AttributeError, OSError):
            fd = None
        super().__init__(rank, fd, popen.pid)
        self.popen = popen
        self.leads_group = True   # ringlet run starts every rank in a group of its own

    def exitcode(self) -> int | None:
        return self.popen.poll()

    def send_signal(self, sig: int) -> None:
        """To the rank's process group: the rank and the processes it started (a data
        loader's workers), as a terminal's Ctrl-C reaches a foreground job."""
        if self.popen.returncode is None:   # not reaped: the group's number is the rank's
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)

    def close(self) -> None:
        if self.sentinel is not None:
            os.close(self.sentinel)
            self.sentinel = None


class _ProcessChild(_Child):
    """A rank of :func:`spawn`: it leads a process group of its own, as a rank of ``ringlet
    run`` does, so that the processes it starts are stopped with it (:func:`_own_group`)."""

    def __init__(self, rank: int, process: BaseProcess) -> None:
        super().__init__(rank, process.sentinel, process.pid or 0)
        self.process = process
        self.leads_group = True
        _own_group(self.pid)

    def exitcode(self) -> int | None:
        return self.process.exitcode

    def send_signal(self, sig: int) -> None:
        """To the rank's process group (the rank and the processes it started); to the rank
        alone if its group is not made yet (a rank of start method ``spawn`` makes it)."""
        if self.process.exitcode is None:  # not reaped, so the pid is still this process's
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, sig)
            except PermissionError:  # pragma: no cover - a group of someone else's
                pass

    def close(self) -> None:
        if self.process.exitcode is not None:
            self.process.close()


@dataclass
class _Ending:
    """How one rank ended."""

    code: int                  # exit code, or -N if killed by signal N
    stopped_by: str = ""       # what the supervisor did to it, e.g. "stopped with SIGTERM ..."
    signal_sent: int = 0       # the last signal the supervisor sent it


@dataclass
class _Outcome:
    """What became of every rank of a job, and the event that ended it early, if any."""

    nranks: int
    endings: dict[int, _Ending] = field(default_factory=dict)
    first_failed: int | None = None
    interrupted: int = 0                 # the signal the launcher received and forwarded
    timed_out: tuple[int, ...] = ()      # ranks still running at the timeout
    #: ranks that were stopped (SIGSTOP, a debugger) when the first rank failed
    frozen: tuple[int, ...] = ()
    #: the last exception each rank printed (``ringlet run`` reads the ranks' stderr)
    reasons: dict[int, str] = field(default_factory=dict)
    timeout: float | None = None
    #: each rank's pid (a PeerError names a dead peer by its pid and its rank in the
    #: communicator that saw it die, a split's rank perhaps)
    pids: dict[int, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """Every rank exited 0 and nothing was interrupted or timed out."""
        return (not self.interrupted and not self.timed_out
                and all(e.code == 0 for e in self.endings.values()))

    @property
    def exit_code(self) -> int:
        """0, the first failed rank's exit code, or 128 + signal (the shell's convention).

        A failure that came before an interrupt or the timeout decides it.
        """
        if self.first_failed is not None:
            return _exit_status(self.endings[self.first_failed].code)
        if self.interrupted:
            return 128 + self.interrupted
        if self.timed_out:
            return 124  # timeout(1)'s
        return 0

    def how(self, rank: int) -> str:
        """How ``rank`` ended, as a phrase with ``{was}``/``{its}`` for the grammatical number."""
        e = self.endings[rank]
        if rank == self.first_failed:
            why = self.reasons.get(rank)
            if e.stopped_by:   # it raised first, then its exit outlasted the grace period
                first = "then failed" if self._quiet() else "failed first"
                return f"{first} ({why or 'an uncaught exception'}), then {e.stopped_by}"
            first = "then failed" if self._quiet() else "failed first"
            return f"{first} ({_code_text(e.code)}{': ' + why if why else ''})"
        if e.stopped_by:
            code = "" if e.code == -e.signal_sent else f" ({_code_text(e.code)})"
            return f"{e.stopped_by}{code}"
        if e.code == 0:
            if rank in self._quiet():
                return ("exited with code 0 without closing ringlet (os._exit, or no exit "
                        "handlers ran), so {its} peers took {it} for dead")
            return "finished (exit code 0)"
        return f"then exited on {{its}} own ({_code_text(e.code)})"

    def _quiet(self) -> list[int]:
        """The ranks that exited 0 while the others' errors say they died (a PeerError:
        "rank 2 (pid 41) died", known by the pid: the rank may be a split's): they left
        without closing their communicator."""
        died = {int(pid) for why in self.reasons.values()
                for pid in re.findall(r"\brank \d+ \(pid (\d+)\) died", why)}
        return sorted(q for q, pid in self.pids.items()
                      if pid in died and q in self.endings and self.endings[q].code == 0)

    def summary(self) -> str:
        """One line: the events, then every other rank's ending, grouped."""
        head = []
        if self.frozen:
            one = len(self.frozen) == 1
            head.append(f"{_ranks(self.frozen)} {'was' if one else 'were'} stopped (SIGSTOP or "
                        f"a debugger) while the others waited for {'it' if one else 'them'}")
        quiet = self._quiet()
        if quiet:   # the first event: the others failed because these left
            head.append(f"{_ranks(quiet)} " + self.how(quiet[0]).format(**_number(quiet)))
        if self.first_failed is not None:
            head.append(f"rank {self.first_failed} "
                        f"{self.how(self.first_failed).format(**_number([0]))}")
        if self.interrupted:
            head.append(f"interrupted by {_signame(self.interrupted)}, forwarded to the ranks")
        if self.timed_out:
            head.append(f"timed out after {self.timeout:g} s with {_ranks(self.timed_out)} "
                        f"not finished")
        groups: dict[str, list[int]] = {}
        for rank in sorted(self.endings):
            if rank != self.first_failed and rank not in quiet:
                groups.setdefault(self.how(rank), []).append(rank)
        rest = []
        for phrase, ranks in groups.items():
            rest.append(f"{_ranks(ranks)} {phrase.format(**_number(ranks))}")
        return "; ".join(head + rest)


def _supervise(children: Sequence[_Child], *, grace: float, timeout: float | None = None,
               readers: Sequence[connection.Connection] = (),
               on_ready: Callable[[connection.Connection], bool] | None = None,
               interrupts: _Interrupts | None = None,
               on_failure: Callable[[Sequence[_Child]], None] | None = None,
               on_stop: Callable[[Sequence[_Child]], None] | None = None,
               errors: _ErrorPipes | None = None) -> _Outcome:
    """Wait for every child to end, applying the failure policy; return what happened.

    ``readers`` are connections to read whenever they are ready, with
    ``on_ready(conn)``, which returns False once ``conn`` is exhausted.
    ``interrupts`` are the signals the launcher received: the first is
    forwarded to the children (they then get the grace period), a second
    one (the same signal again within :data:`SAME_SIGNAL_S` is not one) kills
    them.  Waits block on the children's sentinels, the readers and the
    interrupt pipe, with a deadline: nothing spins.  ``on_failure(live)`` is
    called once, with the children still running, when the first rank fails or the
    timeout passes (``ringlet run`` asks them for their flight recorders); ``on_stop``,
    if given, instead of it when the first interrupt comes or the timeout passes before
    any failure, before the signal (``ringlet run`` also waits for the records).

    ``errors``: the pipes ``ringlet run``'s ranks report their uncaught exception on,
    read as they come.  The rank that failed first is the first to report one, if it
    did so before another rank exited with an error: a rank's exit handlers (closing
    its communicator) may take longer than its peers take to hear of its failure and
    exit themselves.  A :class:`~ringlet.errors.PeerError` is an echo (a peer died,
    closed its communicator, was interrupted or aborted after its own failure), and so
    is any error relayed from a peer (:func:`ringlet.errors.relayed`: a peer's timeout
    is a CommTimeoutError here too): a rank
    that reports one does not count as failing first while another rank may, so a rank
    that ends with an error without one (``sys.exit(3)`` after ``init``, a kill) and
    not at the supervisor's hand, or reports another exception, takes its place, even
    after the echo's exit.  The grace period still starts at the first failed exit.
    """
    out = _Outcome(nranks=len(children), timeout=timeout,
                   pids={c.rank: c.pid for c in children})
    raised: int | None = None       # the first rank that reported an uncaught exception
    settled = False                 # first_failed is not an echo (see above)
    start = time.monotonic()
    deadline = None if timeout is None else start + timeout
    live = {c.rank: c for c in children}
    reading = list(readers)
    stop_at: float | None = None    # when to SIGTERM the survivors
    kill_at: float | None = None    # when to SIGKILL the ranks SIGTERM did not stop
    event = False                   # a failure, an interrupt or the timeout has happened
    stops: dict[int, tuple[str, int]] = {}  # rank -> what the supervisor last did, the signal
    first_signal = (0, 0.0)         # the first interrupt and when it came

    def signal_all(sig: int, why: str) -> None:
        for c in live.values():
            c.send_signal(sig)
            stops[c.rank] = (why, sig)

    while live:
        now = time.monotonic()
        if errors is not None:   # before the exits: a rank reports before it exits
            for rank in errors.read():
                if not errors.echo(rank, out.interrupted):
                    raised = rank if raised is None else raised
            if event and not settled and raised is not None:
                out.first_failed, settled = raised, True
        for rank, child in list(live.items()):
            code = child.exitcode()
            if code is None:
                continue
            del live[rank]
            out.endings[rank] = _Ending(code, *stops.get(rank, ("", 0)))
            cause = code != 0 and rank not in stops and not (errors and errors.echo(rank))
            if event and not settled and cause:
                out.first_failed, settled = rank, True
            if code != 0 and not event:
                out.first_failed, event = rank if raised is None else raised, True
                settled = raised is not None or cause
                out.frozen = tuple(r for r, c in sorted(live.items()) if stopped(c.pid))
                stop_at = now + grace
                if on_failure is not None:
                    on_failure(list(live.values()))
        for sig in interrupts.take() if interrupts is not None else ():
            if not out.interrupted:
                if on_stop is not None and not event:
                    on_stop(list(live.values()))
                out.interrupted, event = sig, True
                first_signal = (sig, now)
                signal_all(sig, f"ended on the forwarded {_signame(sig)}")
                stop_at = now + grace if stop_at is None else min(stop_at, now + grace)
            elif first_signal[0] == sig and now - first_signal[1] < SAME_SIGNAL_S:
                continue   # one signal sent twice (timeout(1) signals its child and group)
            else:
                signal_all(signal.SIGKILL, f"{{was}} killed with SIGKILL after a second "
                                           f"{_signame(sig)}")
        if not live:
            break
        if deadline is not None and now >= deadline and not out.timed_out:
            stop = on_stop or on_failure
            if stop is not None and not event:
                stop(list(live.values()))
            out.timed_out, event = tuple(sorted(live)), True
            signal_all(signal.SIGTERM, f"{{was}} stopped with SIGTERM at the {timeout:g} s "
                                       f"timeout")
            stop_at, kill_at = None, now + KILL_AFTER
        if stop_at is not None and now >= stop_at:
            signal_all(signal.SIGTERM, f"{{was}} stopped with SIGTERM after the {grace:g} s "
                                       f"grace period")
            stop_at, kill_at = None, now + KILL_AFTER
        if kill_at is not None and now >= kill_at:
            signal_all(signal.SIGKILL, f"{{was}} killed with SIGKILL, {KILL_AFTER:g} s after "
                                       f"SIGTERM did not stop {{its}} process")
            kill_at = None
        wake = [t for t in (stop_at, kill_at, deadline if not out.timed_out else None)
                if t is not None]
        wait_s = max(0.0, min(wake) - now) if wake else None
        if any(c.sentinel is None for c in live.values()):
            wait_s = _POLL if wait_s is None else min(wait_s, _POLL)
        handles: list[Any] = [c.sentinel for c in live.values() if c.sentinel is not None]
        handles += reading
        if errors is not None:
            handles += errors.waitables()
        if interrupts is not None:
            handles.append(interrupts.fd)
        for ready in connection.wait(handles, wait_s):
            if ready in reading and on_ready is not None and not on_ready(ready):
                reading.remove(ready)
    return out


def _stop(children: Sequence[_Child]) -> None:
    """End whatever still runs: SIGTERM, then SIGKILL after :data:`KILL_AFTER` s."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = [c for c in children if c.exitcode() is None]
        for c in live:
            c.send_signal(sig)
        deadline = time.monotonic() + KILL_AFTER
        while live and time.monotonic() < deadline:
            sentinels = [c.sentinel for c in live if c.sentinel is not None]
            connection.wait(sentinels, _POLL if len(sentinels) < len(live) else
                            max(0.0, deadline - time.monotonic()))
            live = [c for c in live if c.exitcode() is None]
        if not live:
            return


class _Watchdog:
    """The job's watchdog process (:mod:`ringlet._reaper`): if this launcher dies, however
    it dies, the watchdog kills the ranks and removes the job's shared-memory files.

    It reads the ranks' pids from a pipe whose write end only this process holds;
    the pipe's end without a final ``done`` is how it learns that the launcher died.
    Started in its own session, so that the terminal's Ctrl-C is the launcher's to
    handle.  If it cannot be started the job runs without it (a warning says so).
    """

    def __init__(self, job_id: str) -> None:
        from .transport.shm import SHM_DIR

        self.proc: subprocess.Popen[bytes] | None = None
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_reaper.py")
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", script, job_id, SHM_DIR], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                close_fds=True)
        except OSError as exc:  # pragma: no cover - no interpreter to start
            warnings.warn(f"ringlet: no watchdog for job {job_id} ({exc}): if this process "
                          f"is killed, its ranks may outlive it", RuntimeWarning, stacklevel=3)

    @property
    def fd(self) -> int | None:
        """The write end of the watchdog's pipe (a forked rank must close its copy)."""
        if self.proc is None or self.proc.stdin is None:
            return None
        return self.proc.stdin.fileno()

    def watch(self, pid: int, group: bool) -> None:
        """Have the watchdog kill ``pid`` (a child of this process, not yet reaped, so its
        start time is read here for sure: the watchdog may read this line only after this
        process died and the kernel killed the rank)."""
        self._say(f"pid {pid} {int(group)} {_reaper.start_time(pid) or '-'}\n")

    def remove_dir(self, path: str) -> None:
        """Have the watchdog also remove the temporary directory ``path`` if this process
        dies (its own exit removes it otherwise)."""
        self._say(f"dir {os.fsencode(path).hex()}\n")

    def done(self) -> None:
        """The job is over (every rank ended, files removed): the watchdog exits quietly."""
        if self.proc is None:
            return
        self._say("done\n")
        with contextlib.suppress(OSError):
            self.proc.stdin.close()  # type: ignore[union-attr]
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:  # pragma: no cover - it only reads a pipe
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def _say(self, line: str) -> None:
        if self.proc is None or self.proc.stdin is None:
            return
        try:
            self.proc.stdin.write(line.encode())
            self.proc.stdin.flush()
        except OSError:  # the watchdog is gone: the job goes on without it
            self.proc = None


#: write ends of the running jobs' watchdog pipes: a forked rank inherits them and closes
#: them first, or the watchdog would not see the pipe end when the launcher dies
_WATCHDOG_FDS: set[int] = set()

#: ``prctl`` option: the signal the kernel sends a process when its parent dies
_PR_SET_PDEATHSIG = 1

#: ``ringlet run`` starts a rank (on Linux) as ``python -I -S -c _DIE_WITH_LAUNCHER LAUNCHER_PID
#: COMMAND...``: the process asks the kernel for SIGKILL when the launcher dies (kept across
#: exec), dies now if the launcher already has (its parent is no longer LAUNCHER_PID), then
#: becomes COMMAND, with the same pid.  No ringlet import: it costs a few milliseconds.
_DIE_WITH_LAUNCHER = """\
import os, sys
try:
    import ctypes
    ctypes.CDLL(None).prctl(1, ctypes.c_ulong(9), 0, 0, 0)  # PR_SET_PDEATHSIG, SIGKILL
except Exception:
    pass
if os.getppid() != int(sys.argv[1]):
    os.kill(os.getpid(), 9)
os.execv(sys.argv[2], sys.argv[2:])
"""


def _own_group(pid: int) -> None:
    """Make ``pid`` (0: this process) lead a new process group, if it does not already.

    A rank of :func:`spawn` calls it first thing, and the parent calls it too as soon as
    the rank has started: whichever comes first makes the group, so the parent's signals
    reach the group from the start where it can (a forked rank; a rank that has exec'd, as
    start method ``spawn``'s do, only makes its group itself)."""
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid if pid else 0)


def _die_with_parent(parent: int | None) -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux; elsewhere nothing).

    ``PR_SET_PDEATHSIG`` fires when the thread that started this process
    ends, which for a rank is the launcher's thread that waits for it.  If
    the parent died before the call (this process's parent is no longer
    ``parent``), it is too late for the kernel: this process ends itself.
    ``parent`` None: nothing is done.
    The watchdog (:class:`_Watchdog`) is the other half: it also removes
    the job's files, which a killed rank cannot.
    """
    if parent is None or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, ctypes.c_ulong(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # pragma: no cover - no libc to call
        return
    if parent is not None and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)


class _Children(list[_Child]):
    """The job's children; each one appended is also handed to the watchdog."""

    def __init__(self, watchdog: _Watchdog) -> None:
        super().__init__()
        self.watchdog = watchdog

    def append(self, child: _Child) -> None:
        super().append(child)
        self.watchdog.watch(child.pid, child.leads_group)


@contextmanager
def _job(job_id: str, temp_dirs: Sequence[str] = ()) -> Iterator[list[_Child]]:
    """The children of one job: on the way out, stop any still running, free, clean /dev/shm.

    A watchdog process does the same if this process dies first, and then also removes
    ``temp_dirs`` (which the caller removes itself on an ordinary exit)."""
    watchdog = _Watchdog(job_id)
    for path in temp_dirs:
        watchdog.remove_dir(path)
    children = _Children(watchdog)
    if watchdog.fd is not None:
        _WATCHDOG_FDS.add(watchdog.fd)
    try:
        yield children
    finally:
        _WATCHDOG_FDS.discard(watchdog.fd)
        try:
            _stop(children)
            for c in children:   # the processes the ranks started, left behind
                c.kill_group()
        finally:
            for c in children:
                c.close()
            _remove_segments(job_id)
            watchdog.done()


def _remove_segments(job_id: str) -> None:
    """Remove the job's leftover shared-memory files (the transport's naming, its backstop)."""
    from .transport.shm import cleanup

    cleanup(job_id)


class _Interrupts:
    """SIGINT, SIGTERM and SIGHUP received by the launcher, kept for the supervisor to forward.

    The handlers only record the signal and write a byte to a pipe whose
    read end the supervisor waits on, so it wakes at once.  Installed only in
    the main thread (Python's rule); elsewhere nothing is intercepted.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self) -> None:
        self.fd, self._w = os.pipe()
        os.set_blocking(self._w, False)
        self._pending: list[int] = []
        self._saved: dict[int, Any] = {}

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self._pending.append(signum)
        with contextlib.suppress(BlockingIOError):   # the pipe is full of wake-ups already
            os.write(self._w, b"\0")

    def take(self) -> list[int]:
        """The signals received since the last call."""
        with contextlib.suppress(BlockingIOError):   # raised once the pipe is drained
            while os.read(self.fd, 4096):
                continue
        taken, self._pending = self._pending, []
        return taken

    def __enter__(self) -> _Interrupts:
        os.set_blocking(self.fd, False)
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._saved[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._saved.items():
            signal.signal(sig, old)
        os.close(self.fd)
        os.close(self._w)


# --- ringlet run ---------------------------------------------------------------------------


def configure_run(parser: argparse.ArgumentParser) -> None:
    """Options of ``ringlet run -n N [--grace S] [--no-prefix] [-m] PROGRAM [ARGS...]``."""
    parser.add_argument("-n", "--nranks", type=int, required=True, metavar="N",
                        help="number of ranks to start on this host")
    parser.add_argument("--nodes", type=int, default=1, metavar="K",
                        help="emulate K nodes on this host: ranks 0..N/K-1 are node 0, and so "
                             "on (RINGLET_NODE); inside a node they share memory, between "
                             "nodes they talk over torch.distributed (gloo on loopback), as "
                             "a multi-node job would. N must be a multiple of K")
    parser.add_argument("--grace", type=float, default=None, metavar="S",
                        help="seconds the other ranks get to exit on their own after one "
                             "failed, before they are stopped (default: RINGLET_GRACE, 3)")
    parser.add_argument("--no-prefix", action="store_true",
                        help="pass the ranks' output through untouched: no [rank] prefix, "
                             "and lines of different ranks may mix")
    parser.add_argument("-m", dest="module", action="store_true",
                        help="PROGRAM is a module to run, as with python -m")
    parser.add_argument("--trace", metavar="DIR", default=None,
                        help="write every rank's operations as Chrome trace events "
                             "(RINGLET_TRACE) and merge them into DIR/trace.json (Perfetto, "
                             "chrome://tracing); print the collectives' arrival skew")
    parser.add_argument("program", nargs=argparse.REMAINDER, metavar="PROGRAM [ARGS...]",
                        help="the script (or with -m, the module) and its arguments")
    parser.epilog = (
        "Each rank runs `python PROGRAM ARGS` with RANK, WORLD_SIZE, LOCAL_RANK, "
        "LOCAL_WORLD_SIZE and RINGLET_JOB_ID set (with --nodes also RINGLET_NODE, "
        "RINGLET_ENGINE=torch, MASTER_ADDR and MASTER_PORT) and RINGLET_DUMP_DIR (a "
        "temporary directory unless set): when the job fails, the ranks' flight recorders "
        "are read from it and a diagnosis is printed before the summary. Exit status: 0, "
        "the first failed rank's exit code, or 128 + signal.")


def main_run(args: argparse.Namespace) -> int:
    """Run ``args.program`` on ``args.nranks`` local ranks; return the job's exit status."""
    settings = Settings.from_env()  # rejects unknown RINGLET_* once, here, not in every rank
    settings.check_paths()
    nranks = _check_nranks(args.nranks, "-n")
    grace = settings.grace
    if args.grace is not None:
        try:
            grace = settings.replace(grace=args.grace).grace
        except ConfigError as exc:
            raise ArgumentError(f"--{exc}") from None
    command = _command(args.program, module=args.module)
    nodes = _check_nranks(args.nodes, "--nodes")
    if nranks % nodes:
        raise ArgumentError(f"--nodes {nodes} does not divide -n {nranks}: every emulated "
                            f"node runs the same number of ranks")
    per_node = nranks // nodes
    # about four descriptors a rank here (its output, errors and report pipes, measured:
    # 4 n + 12 as ranks start), and each rank maps every peer's shared-memory segment
    # (a descriptor each): the soft limit raised as far as the hard limit allows
    more_files(4 * nranks + 16, f"ringlet run -n {nranks}")
    extra: dict[str, str] = {}
    if settings.engine == "mpi" or (nodes > 1 and settings.engine == "none"):
        how = (f"--nodes {nodes} emulates nodes over torch.distributed (gloo on loopback)"
               if nodes > 1 else "ringlet run starts its ranks itself, not through MPI")
        raise ConfigError(
            f"{how}, but RINGLET_ENGINE={settings.engine}: unset it, or run on MPI with "
            f"mpiexec (mpiexec -n 4 python s.py; nodes emulated with RINGLET_NODE: mpiexec "
            f"-n 2 -env RINGLET_NODE a python s.py : -n 2 -env RINGLET_NODE b python s.py)")
    if nodes > 1 or settings.engine == "torch":   # the store torch.distributed meets on
        extra = {"RINGLET_ENGINE": "torch", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": str(_free_port())}
    else:
        # torch.distributed's env:// rendezvous, as torchrun sets it, for a script that
        # calls dist.init_process_group (ringlet itself meets through the job's files):
        # what the user did not set
        if "MASTER_ADDR" not in os.environ:
            extra["MASTER_ADDR"] = "127.0.0.1"
        if "MASTER_PORT" not in os.environ:
            extra["MASTER_PORT"] = str(_free_port())
    job_id = secrets.token_hex(16)
    with _dump_dir(settings) as dumps:
        extra["RINGLET_DUMP_DIR"] = dumps
        if args.trace:
            from .outputs import check_directory
            from .tracing import clear

            trace = os.path.abspath(args.trace)
            check_directory(trace, "--trace")
            clear(trace)
            extra["RINGLET_TRACE"] = trace
        code = _run_job(args, command, nranks, per_node, nodes, grace, job_id, extra,
                        temp_dirs=() if settings.dump_dir else (dumps,))
    return code


@contextmanager
def _dump_dir(settings: Settings) -> Iterator[str]:
    """The ranks' RINGLET_DUMP_DIR: the user's (checked: :meth:`Settings.check_paths`), or a
    temporary one removed at the end."""
    if settings.dump_dir:
        yield os.path.abspath(settings.dump_dir)
        return
    import tempfile

    with tempfile.TemporaryDirectory(prefix="ringlet-dumps-") as tmp:
        yield tmp


def failed_marker(dump_dir: str, job_id: str) -> str:
    """The file ``ringlet run`` writes when a rank of job ``job_id`` fails (its text says
    which), so that a rank still in start-up stops at once: one that reaches
    :func:`ringlet.init` after rank 0 failed finds no rendezvous, as if rank 0 were not
    there yet (:func:`ringlet.startup._checker` looks for it)."""
    return os.path.join(dump_dir, f"job-{job_id}.failed")


def _mark_failed(path: str, children: Sequence[_Child], live: Sequence[_Child]) -> None:
    """Say that the job failed, and which ranks ended, for ranks still in start-up
    (:func:`ringlet.startup.failed_marker`)."""
    alive = {c.rank for c in live}
    ended = [c.rank for c in children if c.rank not in alive]
    text = (f"rank {ended[0]} of this job ended with an error" if len(ended) == 1 else
            f"ranks {', '.join(map(str, ended))} of this job ended, with an error" if ended
            else "this job reached its timeout")
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(f"{path}.tmp", "w") as f:
            f.write(text)
        os.replace(f"{path}.tmp", path)


def _ask_for_dumps(directory: str, live: Sequence[_Child], wait: float = 0.0) -> None:
    """SIGUSR1 to the ranks that said they dump on it (``rank-R.signal`` holds their pid);
    with ``wait``, give them up to that many seconds to write it (their ``rank-R.json``
    written since, or the rank ended)."""
    since = time.time() - 0.02   # a file's time is the kernel's coarse clock: a tick behind
    asked = []
    for c in live:
        try:
            with open(os.path.join(directory, f"rank-{c.rank}.signal")) as f:
                pid = int(f.read().strip() or 0)
        except (OSError, ValueError):
            continue
        if pid == c.pid:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGUSR1)
                asked.append(c)
    end = time.monotonic() + wait
    while asked and time.monotonic() < end:
        asked = [c for c in asked if c.exitcode() is None and
                 _mtime(os.path.join(directory, f"rank-{c.rank}.json")) < since]
        if asked:
            time.sleep(0.02)


def _mtime(path: str) -> float:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return 0.0


def _threads_per_rank(nranks: int) -> dict[str, str]:
    """``OMP_NUM_THREADS`` for each of ``nranks`` ranks on this host, where the user did not
    set it: the cores this process may use shared out (at least one each), as torchrun
    sets it (to 1).  Unset, each rank's torch and BLAS start a thread per core: 2 ranks
    on 2 cores ran examples/ddp_train.py's step in 12-17 ms instead of 1.8-2.8 (one
    rank's threads spinning while the other's waited for a core)."""
    if nranks == 1 or "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, cores() // nranks))}


def _run_job(args: argparse.Namespace, command: list[str], nranks: int, per_node: int,
             nodes: int, grace: float, job_id: str, extra: dict[str, str],
             temp_dirs: Sequence[str] = ()) -> int:
    """Start the ranks and supervise them (see main_run)."""
    dumps = extra["RINGLET_DUMP_DIR"]
    width = len(str(nranks - 1))
    lock = threading.Lock()
    pumps: list[_Pump] = []
    errors = _ErrorPipes()   # the pipes the ranks write their uncaught exception to
    with _Interrupts() as interrupts, _job(job_id, temp_dirs) as children, \
            _closing(errors.fds):
        threads = _threads_per_rank(nranks)
        for rank in range(nranks):
            env = dict(os.environ, **threads, RANK=str(rank), WORLD_SIZE=str(nranks),
                       LOCAL_RANK=str(rank % per_node), LOCAL_WORLD_SIZE=str(per_node),
                       RINGLET_JOB_ID=job_id, PYTHONUNBUFFERED="1", **extra)
            if nodes > 1:
                env["RINGLET_NODE"] = f"node{rank // per_node}"
            pipe = None if args.no_prefix else subprocess.PIPE
            error_r, error_w = os.pipe()
            errors.add(error_r)
            env[_ERRORS_VARIABLE] = f"{os.getpid()}:{error_w}"
            try:
                popen = subprocess.Popen(
                    _dying_with_me(command), env=env, stdin=_stdin_for(rank), stdout=pipe,
                    stderr=pipe, pass_fds=(error_w,), **_own_process_group())
            except OSError as exc:
                raise RingletError(f"could not start rank {rank} ({command[0]}): {exc}") from exc
            finally:
                os.close(error_w)
            children.append(_PopenChild(rank, popen))
            if popen.stdout is not None and popen.stderr is not None:
                prefix = f"[{rank:>{width}}] ".encode()
                pumps += [_Pump(popen.stdout, _binary(sys.stdout), prefix, lock),
                          _Pump(popen.stderr, _binary(sys.stderr), prefix, lock)]
                pumps[-2].start()
                pumps[-1].start()
        failed = failed_marker(dumps, job_id)

        def on_failure(live: Sequence[_Child], wait: float = 0.0) -> None:
            _mark_failed(failed, children, live)
            _ask_for_dumps(dumps, live, wait)

        try:
            outcome = _supervise(children, grace=grace, interrupts=interrupts,
                                 on_failure=on_failure, errors=errors,
                                 on_stop=lambda live: on_failure(live, DUMP_WAIT_S))
        finally:
            with contextlib.suppress(OSError):
                os.unlink(failed)
        errors.read()
        reported = {rank: why for rank in range(nranks)
                    if (why := errors.reported(rank)) is not None}
    deadline = time.monotonic() + _DRAIN
    for pump in pumps:  # a rank's grandchildren may hold its pipes open: do not wait for them
        pump.join(max(0.0, deadline - time.monotonic()))
    for rank, pump in enumerate(pumps[1::2]):  # the stderr pumps, in rank order
        if pump.error:
            outcome.reasons[rank] = pump.error
    for rank, why in reported.items():  # what a rank said of itself outranks its stderr
        outcome.reasons[rank] = why
        if not why:
            del outcome.reasons[rank]
    if "RINGLET_TRACE" in extra:
        _merge_trace(extra["RINGLET_TRACE"])
    if not outcome.ok:
        from .diagnose import report

        ended = {q: _code_text(e.code) for q, e in outcome.endings.items()
                 if e.code != 0 and not e.stopped_by}   # not the ranks the launcher stopped
        with contextlib.suppress(Exception):   # the summary comes whatever the dumps hold
            text = report(dumps, nranks, ended, job=job_id)
            if text:
                print(text, file=sys.stderr, flush=True)
        print(f"ringlet run: {outcome.summary()}", file=sys.stderr, flush=True)
    return outcome.exit_code


def _merge_trace(directory: str) -> None:
    """Merge the ranks' trace files into DIR/trace.json and print the skew summary."""
    from .tracing import merge, skew_text

    try:
        path, s, n = merge(directory)
    except (OSError, ValueError, KeyError) as exc:
        print(f"ringlet run: could not merge the trace in {directory}: {exc}", file=sys.stderr)
        return
    print(f"ringlet run: trace of {n} operations in {path}; {skew_text(s)}", file=sys.stderr,
          flush=True)


def _free_port() -> int:
    """A TCP port on loopback that is free now (for the emulated nodes' store)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: ``ringlet run`` -> rank: ``LAUNCHER_PID:FD``, the write end of the pipe where the rank's
#: uncaught exception goes (:func:`report_uncaught`).  Internal, so not a ``RINGLET_`` setting.
_ERRORS_VARIABLE = "_RINGLET_RUN_ERRORS"
#: the longest error text the summary quotes
_REASON_CHARS = 400


def _clip(text: str) -> str:
    """``text`` as the summary quotes it: at most _REASON_CHARS, a cut marked with '...'
    (a message cut mid-word read as if it ended there: '... (not)')."""
    return text if len(text) <= _REASON_CHARS else text[:_REASON_CHARS - 3].rstrip() + "..."


@contextmanager
def _closing(fds: list[int]) -> Iterator[None]:
    """Close every descriptor in ``fds`` (as it is when the block ends)."""
    try:
        yield
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


class _ErrorPipes:
    """The read ends of the pipes ``ringlet run``'s ranks write to (:func:`report_uncaught`),
    one per rank in rank order, read without blocking as data comes."""

    def __init__(self) -> None:
        self.fds: list[int] = []
        self._data: list[bytes] = []
        self._open: list[int] = []    # the ranks whose pipe has not ended

    def add(self, fd: int) -> None:
        os.set_blocking(fd, False)
        self._open.append(len(self.fds))
        self.fds.append(fd)
        self._data.append(b"")

    def waitables(self) -> list[int]:
        """The descriptors to wait on (those not at their end)."""
        return [self.fds[r] for r in self._open]

    def read(self) -> list[int]:
        """Read whatever is there; the ranks whose uncaught exception just arrived."""
        new = []
        for rank in list(self._open):
            had = self._raised(rank)
            try:
                while chunk := os.read(self.fds[rank], 65536):
                    self._data[rank] += chunk
                self._open.remove(rank)   # b"": the rank (and all it started) closed it
            except BlockingIOError:
                pass
            except OSError:
                self._open.remove(rank)
            if not had and self._raised(rank):
                new.append(rank)
        return new

    def _raised(self, rank: int) -> bool:
        return (b"\n" + self._data[rank]).find(b"\nerror ") >= 0

    def echo(self, rank: int, signalled: int = 0) -> bool:
        """Whether the rank's uncaught exception is not a failure of its own: a PeerError
        or another error relayed from a peer (another rank's failure heard of: a peer's
        timeout is a CommTimeoutError here too, marked by the line before), or the
        KeyboardInterrupt of a SIGINT the launcher forwarded to it (``signalled``: the
        interrupt the launcher forwarded to every rank, 0 if none)."""
        lines, last = self._last_error(rank)
        why = lines[last][len("error "):].strip() if last >= 0 else ""
        if signalled == signal.SIGINT and why.startswith("KeyboardInterrupt"):
            return True
        if last > 0 and lines[last - 1] == "relayed":
            return True
        return why.startswith(("ringlet.errors.PeerError:", "PeerError:"))

    def reported(self, rank: int) -> str | None:
        """What the rank said of itself: its uncaught exception, '' if it had none, None if
        it never said (it did not get through ``ringlet.init``)."""
        lines, last = self._last_error(rank)
        if last >= 0:
            return lines[last][len("error "):].strip()
        states = [ln for ln in lines if ln in ("watching", "unwatched")]
        return "" if states[-1:] == ["watching"] else None

    def _last_error(self, rank: int) -> tuple[list[str], int]:
        """The rank's report lines and the index of its last ``error`` line (-1: none)."""
        lines = self._data[rank].decode(errors="replace").splitlines()
        return lines, max((i for i, ln in enumerate(lines) if ln.startswith("error ")),
                          default=-1)


def report_uncaught() -> None:
    """In a rank of ``ringlet run``: have its uncaught exception reported to the launcher.

    :func:`ringlet.init` calls this.  Chains a :data:`sys.excepthook` that
    writes the exception's type and message, on one line, to the pipe the
    launcher gave this process (then does what the previous hook did), so
    that the launcher's summary quotes why the first failed rank failed,
    with or without ``--no-prefix``.  It first writes ``watching``: from then
    on the launcher trusts the pipe alone (a rank that printed a traceback it
    handled, then called ``sys.exit(1)``, had no uncaught exception), where
    before it can only quote the last exception the rank printed; and so
    again if at exit another hook has replaced this one (``unwatched``).  Anywhere
    else (another launcher, a process the rank started, a second call) it
    does nothing.
    """
    value = os.environ.get(_ERRORS_VARIABLE, "")
    launcher, _, fd_text = value.partition(":")
    if getattr(sys.excepthook, "_ringlet_reports", False):
        return
    try:
        if int(launcher) != os.getppid() or not stat.S_ISFIFO(os.fstat(int(fd_text)).st_mode):
            return
    except (ValueError, OSError):
        return
    fd, pid, previous = int(fd_text), os.getpid(), sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        if os.getpid() == pid:   # not in a process forked from the rank
            line = " ".join(traceback.format_exception_only(kind, exc)[0].split())
            # another rank's failure heard of says so on the line before, in the same write
            # (one write of less than PIPE_BUF bytes: the launcher reads both at once)
            heard = b"relayed\n" if is_relayed(exc) else b""
            with contextlib.suppress(OSError, ValueError):
                os.set_blocking(fd, False)
                os.write(fd, heard + b"error " + _clip(line).encode(errors="replace") + b"\n")
        previous(kind, exc, tb)

    def at_exit() -> None:   # another hook replaced this one: the pipe may miss an error
        if sys.excepthook is not hook and os.getpid() == pid:
            with contextlib.suppress(OSError):
                os.write(fd, b"unwatched\n")

    hook._ringlet_reports = True  # type: ignore[attr-defined]
    try:
        os.write(fd, b"watching\n")
    except OSError:
        return
    sys.excepthook = hook
    atexit.register(at_exit)


#: the first line of a SyntaxError's report, which has no "Traceback" line before it (a
#: traceback's File lines go on ", in f", faulthandler's " in f")
_SYNTAX_AT = re.compile(rb'  File ".*", line \d+\s*$')


class _Pump(threading.Thread):
    """Copy a rank's output to the launcher's, each line whole and prefixed with ``[rank] ``.

    On the rank's stderr it also remembers the last exception the rank printed
    (the line that ends a traceback, or a compile error's location block), or what
    the interpreter itself said (``python: No module named ...``), which the
    launcher's summary quotes.
    """

    def __init__(self, src: IO[bytes], dst: IO[bytes], prefix: bytes,
                 lock: threading.Lock) -> None:
        super().__init__(daemon=True, name=f"ringlet-pump-{prefix.decode().strip()}")
        self.src, self.dst, self.prefix, self.lock = src, dst, prefix, lock
        self.error = ""
        #: how the interpreter starts what it says of the command line (python -m no.such)
        self.interpreter = f"{sys.executable}: ".encode()

    def run(self) -> None:
        broken = False  # the launcher's output is gone: keep draining so the rank never blocks
        in_traceback = False
        with self.src:
            for line in iter(self.src.readline, b""):
                if line.startswith(b"Traceback (most recent call last):") or (
                        not in_traceback and _SYNTAX_AT.match(line)):
                    in_traceback = True   # (a SyntaxError prints its File line alone)
                elif in_traceback and line.strip() and not line[:1].isspace():
                    in_traceback = False
                    self.error = _clip(line.decode(errors="replace").strip())
                elif line.startswith(self.interpreter):
                    self.error = _clip(line[len(self.interpreter):].decode(
                        errors="replace").strip())
                if broken:
                    continue
                if not line.endswith(b"\n"):
                    line += b"\n"
                try:
                    with self.lock:
                        self.dst.write(self.prefix + line)
                        self.dst.flush()
                except (OSError, ValueError):
                    broken = True


def _command(program: Sequence[str], *, module: bool) -> list[str]:
    """``python script.py args`` or ``python -m module args``, checked before any rank starts."""
    program = list(program)
    if program[:1] == ["--"]:
        program = program[1:]
    what = "a module name after -m" if module else "a script to run"
    if not program:
        raise ArgumentError(f"give {what}: ringlet run -n 4 script.py [args...] "
                            f"or ringlet run -n 4 -m package.module [args...]")
    if module:
        return [sys.executable, "-m", *program]
    if not os.path.exists(program[0]):
        raise ArgumentError(f"no such script: {program[0]!r} (to run a module, use -m)")
    return [sys.executable, *program]


def _dying_with_me(command: list[str]) -> list[str]:
    """``command``, started so that the kernel kills it when this launcher dies (Linux)."""
    if not sys.platform.startswith("linux") or not os.path.isabs(command[0]):
        return command
    return [sys.executable, "-I", "-S", "-c", _DIE_WITH_LAUNCHER, str(os.getpid()), *command]


def _stdin_for(rank: int) -> int | None:
    """Rank 0 reads the launcher's stdin when it is a file or pipe; the others read nothing.

    A terminal is not passed on: the ranks run in their own process group
    (so that Ctrl-C reaches them once, forwarded), and reading a terminal
    from a background group stops the process.
    """
    if rank == 0:
        try:
            if not os.isatty(sys.stdin.fileno()):
                return None
        except (AttributeError, ValueError, OSError):
            pass
    return subprocess.DEVNULL


def _own_process_group() -> dict[str, Any]:
    """Popen arguments that put a rank in a new process group."""
    if sys.version_info >= (3, 11):
        return {"process_group": 0}
    return {"start_new_session": True}  # pragma: no cover - Python 3.10


def _binary(stream: IO[str]) -> IO[bytes]:
    """The byte stream under a text stream (``sys.stdout.buffer``)."""
    stream.flush()
    return stream.buffer  # type: ignore[attr-defined]


# --- ringlet.spawn ------------------------------------------------------------------------------


def spawn(fn: Callable[..., Any], nranks: int, *args: Any, settings: Settings | None = None,
          timeout: float | None = None) -> list[Any]:
    """Run ``fn(comm, *args)`` on ``nranks`` local processes; return the results in rank order.

    Each process joins a fresh job with :func:`ringlet.init` and gets its
    world communicator.  The results travel by pickle.  With the default start
    method (``settings.start_method="auto"``) the ranks are forked where that
    is safe (Linux, no other Python thread running and no thread pool started
    since ringlet was imported, such as torch's OpenMP pool after a torch
    operation: see :func:`start_method`), so ``fn`` may be defined anywhere:
    in a script without an ``if __name__ == "__main__":`` guard, in
    ``python -c``, ``python -`` or an interactive session.  With ``spawn`` or
    ``forkserver`` (and ``auto`` where it does not fork) ``fn`` and ``args``
    are pickled and ``fn`` must be importable: defined at module level, in a
    script whose call to spawn is under the ``__main__`` guard; where that
    cannot work, spawn says so and why it did not fork.

    If the calling process is killed, however it is killed (``kill -9``
    included), the ranks are killed too (by the kernel on Linux, and by a
    watchdog process, which also removes their shared memory).

    If a rank fails, the others get the grace period (``settings.grace``)
    to fail on their own, then are stopped, and :class:`SpawnError` is
    raised listing every failed rank with its exception type and message
    (``.failures``; remote tracebacks in ``.details``).  ``timeout`` bounds
    the whole job; by default the ranks' own deadlines
    (``settings.timeout``) bound every wait.

    Example::

        def total(comm, n):
            x = np.full(n, comm.rank + 1.0)
            comm.all_reduce(x)              # rank 0: [3., 3.]   rank 1: [3., 3.]
            return float(x[0])

        ringlet.spawn(total, 2, 2)          # -> [3.0, 3.0]
    """
    from .startup import init

    return _spawn(fn, nranks, args, settings=settings, timeout=timeout, init=init)


def _spawn(fn: Callable[..., Any], nranks: int, args: tuple[Any, ...], *,
           settings: Settings | None, timeout: float | None,
           init: Callable[..., Any]) -> list[Any]:
    """:func:`spawn` with the per-rank start-up function ``init`` (``ringlet.comm.init``)."""
    settings = Settings.from_env() if settings is None else settings
    settings.check_paths()
    if settings.engine in ("mpi", "torch"):
        how = ("not through MPI" if settings.engine == "mpi" else
               "on one node, over shared memory, with no torch.distributed store")
        how_else = ("mpiexec" if settings.engine == "mpi" else   # ringlet run refuses mpi
                    "torchrun (or `ringlet run`, which makes a store for the torch engine)")
        raise ConfigError(f"ringlet.spawn starts its ranks itself, {how}, but "
                          f"RINGLET_ENGINE={settings.engine}: unset it, or start the program "
                          f"with {how_else}")
    nranks = _check_nranks(nranks, "nranks")
    if timeout is not None and not timeout > 0:
        raise ArgumentError(f"timeout must be > 0 seconds or None, got {timeout!r}")
    method = start_method(settings)
    ctx = get_context(method)
    why = _fork_is_unsafe() if settings.start_method == "auto" else \
        f"start method {method!r} was asked for"
    _check_bootstrap(fn, method, why)
    job_id = secrets.token_hex(16)
    reports: dict[int, _Report] = {}
    rank_of: dict[connection.Connection, int] = {}

    def on_ready(conn: connection.Connection) -> bool:
        rank = rank_of[conn]
        try:
            report = conn.recv()
        except (EOFError, OSError):
            return False
        except Exception as exc:  # the result does not unpickle here
            report = _failure(exc, "its result could not be unpickled by the parent: ")
        if report[0] == "error" or rank not in reports:  # an error outranks an earlier result
            reports[rank] = report
        return True

    with _job(job_id) as children:
        try:
            for rank in range(nranks):
                reader, writer = ctx.Pipe(duplex=False)
                rank_of[reader] = rank
                process = ctx.Process(  # type: ignore[attr-defined]
                    target=_rank_main, name=f"ringlet-rank-{rank}",
                    args=(init, fn, rank, nranks, job_id, settings, writer, args,
                          None if method == "forkserver" else os.getpid()))
                try:
                    process.start()  # spawn and forkserver pickle fn and args here
                except (pickle.PicklingError, AttributeError, TypeError) as exc:
                    if rank:
                        raise
                    raise ArgumentError(
                        f"spawn: fn and its arguments must be picklable to reach processes "
                        f"started with start method {method!r} "
                        f"({type(exc).__name__}: {exc}); define fn at module level (not a "
                        f"lambda or a nested function)") from None
                finally:
                    writer.close()
                children.append(_ProcessChild(rank, process))
            outcome = _supervise(children, grace=settings.grace, timeout=timeout,
                                 readers=list(rank_of), on_ready=on_ready)
            for conn in rank_of:  # what the ranks sent just before they ended
                while conn.poll() and on_ready(conn):
                    pass
        finally:
            for conn in rank_of:
                conn.close()
    return _results(outcome, reports, method, why)


def start_method(settings: Settings) -> str:
    """The multiprocessing start method :func:`spawn` uses: ``settings.start_method``, with
    ``auto`` resolved.

    ``auto`` forks where that is safe (:func:`_fork_is_unsafe`): on Linux,
    while this process runs no Python thread but the main one and no more
    native threads than when ringlet was imported.  Forked ranks need nothing
    re-imported, so a function defined in a script without a ``__main__``
    guard, in ``python -c``, ``python -`` or an interactive session works.
    Otherwise ``auto`` is ``spawn``.
    """
    method = settings.start_method
    if method != "auto":
        return method
    return "spawn" if _fork_is_unsafe() else "fork"


def _native_threads() -> int:
    """How many threads this process runs (/proc/self/task), 0 where that cannot be read."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0


#: the process's threads when ringlet was imported: the main one, and numpy's BLAS pool
#: (OpenBLAS re-creates its threads in a forked child).  ``ringlet/__init__`` imports
#: numpy before this module.
_THREADS_AT_IMPORT = _native_threads()


def _fork_is_unsafe() -> str:
    """Why ``auto`` must not fork this process now ('' if it may).

    Forking copies only the calling thread.  A lock another Python thread
    holds (the logging module's, say) stays held in the child forever; an
    OpenMP pool started since ringlet was imported (torch's, by its first
    parallel operation) is gone in the child, whose next parallel
    operation waits for it forever.
    """
    if not sys.platform.startswith("linux") or "fork" not in get_all_start_methods():
        return "fork is Linux's only here"
    if threading.active_count() > 1:
        return f"this process runs {threading.active_count()} Python threads"
    now = _native_threads()
    if now > _THREADS_AT_IMPORT:
        return (f"this process runs {now} threads, {now - _THREADS_AT_IMPORT} more than when "
                f"ringlet was imported (a thread pool such as torch's OpenMP one, which a "
                f"forked process would wait for forever)")
    return ""


def _check_bootstrap(fn: Callable[..., Any], method: str, why: str) -> None:
    """Raise a clear error where spawn/forkserver ranks cannot work (see :func:`spawn`);
    ``why`` says why this method was chosen."""
    if method == "fork":
        return
    if process.current_process().name != "MainProcess" and \
            getattr(process.current_process(), "_inheriting", False):
        raise SpawnError(
            "ringlet.spawn was called while a new rank was importing your main module: the "
            "ranks of start method 'spawn' re-import it, so the call to ringlet.spawn must be "
            "under `if __name__ == \"__main__\":` (or set start_method='fork')")
    main = sys.modules.get("__main__")
    if getattr(fn, "__module__", None) == "__main__" and not getattr(main, "__file__", None):
        raise SpawnError(
            f"ringlet.spawn cannot start {getattr(fn, '__qualname__', fn)!r} with start method "
            f"{method!r}: it is defined in an interactive session, `python -c` or `python -`, "
            f"which new processes cannot import, and ringlet does not fork this process by "
            f"itself ({why}): "
            f"define the function in a module (a .py file you import); or call "
            f"ringlet.spawn before starting threads or running torch operations; or pass "
            f"settings=ringlet.Settings(start_method='fork') if no other thread holds a lock "
            f"and no thread pool is in use while you call spawn")


def _results(outcome: _Outcome, reports: dict[int, _Report], method: str = "fork",
             why: str = "") -> list[Any]:
    """The ranks' results in order, or the SpawnError that describes every failed rank."""
    failures: dict[int, str] = {}
    details: dict[int, str] = {}
    for rank in range(outcome.nranks):
        report = reports.get(rank)
        ending = outcome.endings[rank]
        how = (outcome.how(rank).format(**_number([rank])) if ending.stopped_by
               else _code_text(ending.code))
        if report is not None and report[0] == "error":
            failures[rank] = f"{report[1]}: {report[2]}"
            details[rank] = report[3]
        elif report is None:
            failures[rank] = f"{how}, without reporting a result"
        elif ending.code != 0 or rank in outcome.timed_out:
            failures[rank] = f"returned its result, then {how}"
    if not failures:
        return [reports[rank][1] for rank in range(outcome.nranks)]
    first = outcome.first_failed
    head = []
    if first is not None:
        head.append(f"{len(failures)} of {outcome.nranks} ranks failed, rank {first} first")
    if outcome.timed_out:
        head.append(f"timed out after {outcome.timeout:g} s; {_ranks(outcome.timed_out)} had "
                    f"not finished")
    if not head:
        head.append(f"{len(failures)} of {outcome.nranks} ranks failed")
    order = sorted(failures, key=lambda r: (r != first, r))
    lines = [f"ringlet.spawn: {'; '.join(head)}:"] + [f"  rank {r}: {failures[r]}" for r in order]
    if method != "fork" and all(r not in reports for r in order):
        lines.append(
            f"no rank got as far as reporting: with start method {method!r} every rank first "
            f"re-imports the main module and unpickles fn; their output above says why (a "
            f"call to ringlet.spawn in a script must be under `if __name__ == \"__main__\":`)"
            f"{'; ringlet did not fork: ' + why if why else ''}")
    shown = next((r for r in order if r in details), None)
    if shown is not None:
        lines.append(f"traceback of rank {shown} (all of them in SpawnError.details):")
        lines.append(details[shown].rstrip())
    raise SpawnError("\n".join(lines), failures, details)


def _rank_main(init: Callable[..., Any], fn: Callable[..., Any], rank: int, size: int,
               job_id: str, settings: Settings, conn: connection.Connection,
               args: tuple[Any, ...], parent: int | None = None) -> None:
    """One spawned rank: init, ``fn(comm, *args)``, report, close.

    The rank dies with ``parent``, the process that called :func:`spawn`
    (:func:`_die_with_parent`).  With ``forkserver`` the rank's parent is the
    fork server, which outlives the caller as long as any of its children
    holds its "alive" pipe (they all do): ``parent`` is None, and only the
    watchdog stops the ranks.

    The report is sent before ``comm.close()``, so the parent has it even if
    the rank is stopped while closing.  This is the process's entry point:
    it exits with status 1 (``SystemExit``) after reporting a failure, so
    the supervisor sees the failure as soon as the process ends.
    """
    _own_group(0)
    _die_with_parent(parent)
    for fd in list(_WATCHDOG_FDS):  # forked: this copy would keep the watchdog's pipe open
        with contextlib.suppress(OSError):
            os.close(fd)
    _WATCHDOG_FDS.clear()
    try:
        comm = init(settings=settings, rank=rank, size=size, job_id=job_id)
    except BaseException as exc:
        _send(conn, _failure(exc, "ringlet.init failed: "))
        raise SystemExit(1) from None
    failed = False
    try:
        try:
            report: _Report = ("ok", fn(comm, *args))
        except BaseException as exc:
            report, failed = _failure(exc), True
        if not _send(conn, report):
            failed = True
    finally:
        try:
            comm.close()
        except BaseException as exc:
            _send(conn, _failure(exc, "comm.close() failed: "))
            failed = True
        finally:   # a forked rank ends with os._exit: no exit handler does this
            from .comm import _close_all
            _close_all()   # its other communicators (splits): peers see "closed", not "died"
            recorder.finish()
    conn.close()
    if failed:
        raise SystemExit(1)


def _send(conn: connection.Connection, report: _Report) -> bool:
    """Send ``report`` to the parent; if it does not pickle, send that failure instead."""
    try:
        conn.send(report)
        return report[0] == "ok"
    except OSError:
        return False  # the parent is gone; nobody is listening
    except Exception as exc:
        try:
            conn.send(_failure(exc, "its result could not be pickled: "))
        except OSError:
            pass
        return False


def _failure(exc: BaseException, context: str = "") -> _Report:
    """``("error", type name, message, traceback)`` for a report."""
    return ("error", type(exc).__name__, f"{context}{exc}",
            "".join(traceback.format_exception(exc)))


# --- helpers ---------------------------------------------------------------------------------


def _check_nranks(n: object, name: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ArgumentError(f"{name} must be a whole number of ranks >= 1, got {n!r}")
    return n


def _number(ranks: Sequence[int]) -> dict[str, str]:
    """The words of :meth:`_Outcome.how`'s phrases for one rank or several."""
    one = len(ranks) == 1
    return {"was": "was" if one else "were", "its": "its" if one else "their",
            "it": "it" if one else "them"}


def _signame(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _code_text(code: int) -> str:
    return f"exit code {code}" if code >= 0 else f"killed by {_signame(-code)}"


def _exit_status(code: int) -> int:
    return code if code >= 0 else 128 - code


def _ranks(ranks: Sequence[int]) -> str:
    """``rank 3``, ``ranks 0, 1, 5`` or ``ranks 0-3, 5`` (runs of three or more compressed)."""
    parts: list[str] = []
    run: list[int] = []
    for r in [*sorted(ranks), None]:
        if run and (r is None or r != run[-1] + 1):
            parts += [f"{run[0]}-{run[-1]}"] if len(run) >= 3 else [str(x) for x in run]
            run = []
        if r is not None:
            run.append(r)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts)
