"""Running the peers (gloo, MPI) beside ringlet, in their own processes, with deadlines.

``--vs gloo`` starts N processes of :mod:`ringlet.bench.gloo` that meet on a
free localhost port; ``--vs mpi`` runs :mod:`ringlet.bench.mpi` under the
``mpiexec`` next to this Python (the MPICH wheel's).  Rank 0 of a peer writes
one line per event on stdout, ``@ringlet-bench {json}``: ``start`` (library
and form), ``row`` (a measured size) or ``error``.  The parent reads them as
they come, so the progress bar moves, and stops every process of a peer that
fails or passes its deadline, reporting why.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, cast

from ..errors import ArgumentError
from .core import Job, Row

PREFIX = "@ringlet-bench "
PEERS = ("gloo", "mpi")
INSTALL = "pip install 'ringlet[peers]'"
#: seconds between SIGTERM and SIGKILL when a peer's processes are stopped
KILL_AFTER = 1.0
#: longest block on the event queue before the processes' exit codes are looked at
_WAKE = 0.2


def emit(event: dict[str, Any]) -> None:
    """Write one event line for the parent (peer rank 0 only)."""
    sys.stdout.write(PREFIX + json.dumps(event) + "\n")
    sys.stdout.flush()


def mpiexec_path() -> Path:
    """The ``mpiexec`` installed beside this Python (by the ``mpich`` wheel)."""
    return Path(sys.executable).parent / "mpiexec"


def _have(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing(peer: str) -> str | None:
    """What ``peer`` lacks here, as a phrase, or None if it can run."""
    if peer == "gloo":
        return None if _have("torch") else "torch is not installed"
    if peer == "mpi":
        if not _have("mpi4py"):
            return "mpi4py is not installed"
        if not mpiexec_path().exists():
            return f"there is no mpiexec beside {sys.executable} (the mpich wheel provides it)"
        return None
    raise ArgumentError(f"unknown peer {peer!r}; --vs takes {', '.join(PEERS)}")


def parse_vs(text: str) -> list[str]:
    """``"gloo,mpi"`` -> ``["gloo", "mpi"]``: known names, each once, installed.

    Raises ArgumentError naming what to install when a peer cannot run.
    """
    names: list[str] = []
    for part in text.split(","):
        name = part.strip().lower()
        if not name:
            continue
        if name not in PEERS:
            raise ArgumentError(f"--vs: unknown peer {name!r}; use gloo, mpi or gloo,mpi")
        if name not in names:
            names.append(name)
    if not names:
        raise ArgumentError("--vs: name at least one peer: gloo, mpi or gloo,mpi")
    problems = [f"{n}: {why}" for n in names if (why := missing(n)) is not None]
    if problems:
        raise ArgumentError(
            f"--vs {','.join(names)} cannot run ({'; '.join(problems)}); install the peers "
            f"with: {INSTALL}")
    return names


def unsupported(peer: str, job: Job) -> str | None:
    """Why ``peer`` cannot run ``job`` (known before starting it), or None."""
    if job.op == "avg":
        return (f"{peer} has no AVG reduction" + (" (torch.distributed's AVG is NCCL-only)"
                                                  if peer == "gloo" else ""))
    if peer == "gloo":
        if job.op in ("land", "lor", "lxor"):
            return f"gloo has no {job.op.upper()} reduction"
        if job.dtype in ("uint16", "uint32", "uint64"):
            return f"gloo does not move {job.dtype} tensors"
        if job.dtype.startswith("complex") and job.op == "prod":
            return "gloo does not multiply complex tensors (torch.distributed sums them only)"
        if job.dtype.startswith("complex") and job.collective in ("reduce", "gather"):
            return f"gloo's {job.collective} does not take complex tensors"
    return None


def check_supported(peers: Sequence[str], job: Job) -> None:
    """ArgumentError if a peer of ``--vs`` cannot run ``job``, before anything runs."""
    problems = [why for p in peers if (why := unsupported(p, job)) is not None]
    if problems:
        raise ArgumentError(f"--vs {','.join(peers)}: {'; '.join(problems)}; drop that peer "
                            f"from --vs or change --op/--dtype")


@dataclass
class PeerRun:
    """What one peer measured, or why it did not."""

    name: str
    library: str = ""
    form: str = ""
    call: str = ""
    rows: list[Row] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def commands(peer: str, job: Job, timeout: float) -> list[list[str]]:
    """The command line of each process to start for ``peer`` (rank 0's first)."""
    py, spec = sys.executable, job.to_json()
    if peer == "gloo":
        init = f"tcp://127.0.0.1:{free_port()}"
        return [[py, "-m", "ringlet.bench.gloo", str(r), init, spec, f"{timeout:g}"]
                for r in range(job.nranks)]
    if peer == "mpi":
        return [[str(mpiexec_path()), "-n", str(job.nranks), py, "-m", "ringlet.bench.mpi",
                 spec]]
    raise ArgumentError(f"unknown peer {peer!r}; --vs takes {', '.join(PEERS)}")


def run_peer(peer: str, job: Job, timeout: float,
             on_row: Callable[[Row], None] | None = None) -> PeerRun:
    """Measure ``job`` with ``peer``; never raises for the peer's own failures.

    A peer that fails, or runs past ``timeout`` seconds, is stopped (all of
    its processes) and the returned :class:`PeerRun` says why in ``error``,
    with the last lines it wrote on stderr.
    """
    result = PeerRun(peer)
    start = time.monotonic()
    cmds = commands(peer, job, timeout)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    with contextlib.ExitStack() as stack:
        errs = [stack.enter_context(tempfile.TemporaryFile("w+b")) for _ in cmds]
        procs: list[subprocess.Popen[bytes]] = []
        culprit = 0
        reader: threading.Thread | None = None
        try:
            for i, cmd in enumerate(cmds):
                procs.append(subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, env=env, stderr=errs[i],
                    stdout=subprocess.PIPE if i == 0 else subprocess.DEVNULL,
                    start_new_session=True))
            events: queue.Queue[dict[str, Any] | None] = queue.Queue()
            stdout = cast(IO[bytes], procs[0].stdout)  # a pipe: stdout=PIPE above
            reader = threading.Thread(target=_read_events, args=(stdout, events),
                                      name=f"ringlet-bench-{peer}", daemon=True)
            reader.start()
            culprit = _follow(result, procs, events, start + timeout, timeout, on_row)
        finally:
            _stop(procs)
            if reader is not None:
                reader.join(timeout=KILL_AFTER)  # the pipe ends with the processes
            for p in procs:
                if p.stdout is not None:
                    p.stdout.close()
        if result.error is not None:
            text = _stderr(errs, culprit)
            if " failed (" in result.error and (why := _exception(text)):
                result.error += f": {why}"
            if text:
                who = f"rank {culprit}" if len(errs) > 1 else "stderr"
                result.error += "".join(f"\n  [{who}] {line}"
                                        for line in text.splitlines()[-6:])
    result.seconds = time.monotonic() - start
    return result


def _read_events(stream: IO[bytes], events: queue.Queue[dict[str, Any] | None]) -> None:
    """Put every event line of ``stream`` on ``events``, then None at end of file."""
    try:
        for raw in stream:
            line = raw.decode(errors="replace").strip()
            if line.startswith(PREFIX):
                try:
                    events.put(json.loads(line[len(PREFIX):]))
                except json.JSONDecodeError:
                    continue
    except (OSError, ValueError):  # the pipe was closed under us: the peer was stopped
        pass
    finally:
        events.put(None)


def _follow(result: PeerRun, procs: Sequence[subprocess.Popen[bytes]],
            events: queue.Queue[dict[str, Any] | None], deadline: float, timeout: float,
            on_row: Callable[[Row], None] | None) -> int:
    """Take events until rank 0's stdout ends and every process exited, or a failure.

    Returns the index of the process whose stderr explains a failure (0 if
    none stands out).
    """
    eof = False
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            result.error = (f"did not finish within {timeout:g} s (raise --timeout if it is "
                            f"only slow); its processes were stopped")
            return 0
        ev: dict[str, Any] | None = None
        if not eof:
            try:
                ev = events.get(timeout=min(_WAKE, remaining))
            except queue.Empty:
                ev = None
            else:
                if ev is None:
                    eof = True
        if ev is not None:
            kind = ev.get("event")
            if kind == "start":
                result.library = str(ev.get("library", ""))
                result.form = str(ev.get("form", ""))
                result.call = str(ev.get("call", ""))
            elif kind == "row":
                row = Row.from_dict(ev["row"])
                result.rows.append(row)
                if on_row is not None:
                    on_row(row)
            elif kind == "error":
                result.error = str(ev.get("message", "failed"))
            continue
        codes = [p.poll() for p in procs]
        failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            i, code = failed[0]
            who = f"rank {i}" if len(procs) > 1 else "mpiexec"
            if result.error is None:
                result.error = f"{who} failed ({_code_text(code)})"
            return i
        if eof and all(c == 0 for c in codes):
            return 0
        if eof:
            # stdout is closed; the processes are ending: wait for them, within the deadline
            with contextlib.suppress(subprocess.TimeoutExpired):
                procs[codes.index(None)].wait(timeout=min(_WAKE, remaining))


def _code_text(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """End every process of the peer (and its children): SIGTERM, then SIGKILL."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, signal.SIGTERM)
    end = time.monotonic() + KILL_AFTER
    for p in live:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=KILL_AFTER)


def _stderr(errs: Sequence[IO[bytes]], i: int) -> str:
    """What process ``i`` wrote on stderr."""
    errs[i].seek(0)
    return errs[i].read().decode(errors="replace").rstrip()


_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(\w*(?:Error|Exception|Interrupt)): (.*)$")


def _exception(text: str) -> str | None:
    """The last ``SomeError: message`` line of a traceback in ``text``, shortened."""
    for line in reversed(text.splitlines()):
        m = _EXCEPTION.match(line.strip())
        if m:
            return f"{m.group(1)}: {m.group(2)}"
    return None
