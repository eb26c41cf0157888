"""Start-up: joining a job (:func:`init`) and the rendezvous of its ranks.

How the ranks meet
------------------
``ringlet run`` and :func:`ringlet.spawn` hand every rank a secret random job
id.  Under torchrun, mpiexec or srun there is none, so rank 0 makes one.
Either way the ranks of a job (more than one) first meet at a *rendezvous*:
rank 0 listens on a Unix socket in Linux's abstract namespace, which has no
file and vanishes with the process; every other rank connects, checks that
the listener runs as its own user (``SO_PEERCRED``), and says hello (its
rank, pid and shared-memory settings).  Once all ranks have said hello, rank
0 answers each with the job id and every rank's pid, or with the error that
stops the job.  Only then does each rank create its shared-memory segment
(see :mod:`ringlet.transport.shm`).

The rendezvous address is a digest of the secret job id, or, under other
launchers, of the launcher's public ids and the parent pid
(:func:`rendezvous_name`).  The latter is predictable, so it is only a
meeting point, never trusted:

- rank 0 accepts hellos only from processes of its own user and sends the
  job id to no one else;
- a rank that finds the address held by another user's process fails at
  once with a :class:`ConfigError` naming that process (its pid and uid),
  and so does rank 0 when it cannot bind the address for that reason.
  A job never joins a job id it did not make;
- peers' segments (and shared buffers) are opened without following
  symbolic links and used only if they are regular files of this user with
  no group or other permissions; otherwise a :class:`ConfigError` names the
  file, its owner and its mode.

Start-up guarantees
-------------------
- *Bounded.*  Start-up has its own deadline, ``RINGLET_INIT_TIMEOUT``
  (default 60 s).  When it passes, every rank that arrived fails with the
  same :class:`CommTimeoutError` naming the ranks that did not call
  :func:`init`.  Ranks whose settings differ (``RINGLET_SHM_*``, or the
  world size) all fail at once with one :class:`ConfigError` naming every
  difference.  A rank that dies, and the launcher itself exiting (its ranks
  orphaned), make the others that have reached :func:`init` fail at once with a
  :class:`PeerError`.  A rank that reaches it after rank 0 failed finds no
  rendezvous, as if rank 0 had not started yet: under ``ringlet run`` the
  launcher's mark of a failed rank stops it (:func:`ringlet.launch.failed_marker`),
  else its launcher or the deadline does (the error says rank 0 may have failed
  first).
  Across nodes, a node whose start-up failed fails every rank of the job
  (:func:`ringlet.engines.start`); ``MPI_Init`` is MPI's own start-up and waits
  for every rank, unbounded, with signals not held.
- *Nothing left behind.*  While ranks wait for each other nothing exists in
  the shared-memory directory, so even SIGKILL of every rank (what mpiexec's
  proxies do when mpiexec dies) leaves nothing.  Segments exist only from
  the moment every rank has arrived until every peer has mapped them (a few
  milliseconds); on any failure in that window a rank removes its own
  segment and its peers' (start-up is all or nothing, and a peer killed
  with SIGKILL cannot remove its own).  SIGTERM, SIGINT and
  SIGHUP arriving during :func:`init` (when their handler is the default)
  are held until the clean-up has run, then delivered as usual (the
  process still dies of the signal).  Only SIGKILL inside those few
  milliseconds can leave a segment, which ``ringlet run`` removes at exit;
  under another launcher the next job's start-up on that host does
  (:func:`ringlet.transport.shm.sweep_stale`, once the segment's creator has
  ended and nobody touched it for 10 minutes).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import selectors
import signal
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

from .algorithms.select import agreed_tuner, canonical_setting, choosing
from .comm import Communicator
from .config import Settings
from .errors import (
    ArgumentError,
    CommTimeoutError,
    ConfigError,
    PeerError,
    RingletError,
    name_ranks,
)
from .topology import Topology
from .transport.base import Transport
from .transport.shm import SHM_DIR, ShmTransport, sweep_stale

#: Linux has abstract Unix sockets (no file, gone with the process); elsewhere the
#: rendezvous socket is a file in SHM_DIR, a private (0700) directory there.
_ABSTRACT = sys.platform.startswith("linux")

#: the settings every rank must share to read each other's segments and run the fused
#: paths alike (their pieces, their single copies)
_SHAPE = ("shm_slots", "shm_slot_bytes", "shm_post_bytes", "shm_stage_bytes",
          "shm_piece_bytes", "cma_bytes")

#: signals held during start-up (when their handler is the default), then re-delivered
_HELD = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)

#: longest pause between polls while waiting at the rendezvous
_POLL = 0.05


def init(*, settings: Settings | None = None, rank: int | None = None, size: int | None = None,
         job_id: str | None = None) -> Communicator:
    """Join the job and return the world communicator.

    Rank and size come from the arguments, else from the launcher's
    environment: ``ringlet run``, torchrun, mpiexec (MPICH, Open MPI) or
    srun.  With no launcher at all, a single-rank communicator.  Start-up
    waits at most ``settings.init_timeout`` seconds for the other ranks
    (see the module documentation for what it guarantees).
    """
    settings = Settings.from_env() if settings is None else settings
    settings.check_paths()
    key = None
    parent = None
    engine = settings.engine if settings.engine in ("mpi", "torch") else None
    if rank is None or size is None:
        from .engines import engine_for
        from .env import detect

        info = detect()
        engine = engine_for(settings, info)
        rank = info.rank if rank is None else rank
        size = info.size if size is None else size
        if info.source != "single":
            parent = os.getppid()   # the launcher (or its proxy): watched during start-up
        if job_id is None:
            job_id = info.job_id
            key = info.rendezvous_key
    if not 0 <= rank < size:
        raise ArgumentError(f"rank {rank} is out of range for size {size}")
    if job_id is None and key is None and size > 1:
        raise ArgumentError("init: give job_id when passing rank and size for more than "
                            "one rank (every rank must pass the same one)")
    if settings.debug:
        from .comm import _configure_logging

        _configure_logging(settings.debug)
    if engine == "mpi":
        # MPI_Init waits for every rank of the job (MPI's own start-up, which no deadline
        # of ringlet's can bound) and leaves nothing to clean up: it runs before signals
        # are held, so that SIGTERM and SIGINT (mpiexec's, a user's) still end a rank
        # stuck there, e.g. when another rank never starts MPI
        from .transport.mpi import world_comm

        world_comm()
    held: list[int] = []
    started: tuple[str, Transport, Topology] | None = None
    agreed: dict[str, Any] = {}
    try:
        with _held_signals(held):
            with contextlib.suppress(_Interrupted):  # re-delivered below, after clean-up
                check = _checker(held, parent)
                if engine is None:
                    job, shm = _start(rank, size, settings, job_id, key, check, None, agreed)
                    started = job, shm, Topology.single(size)
                else:
                    from .engines import start

                    started = start(engine, rank, size, settings, job_id,
                                    lambda lr, ls, j, names: _start(lr, ls, settings, j, None,
                                                                    check, names, agreed),
                                    check=check)
    finally:
        if held:
            if started is not None:
                started[1].close()
            _redeliver(held[0])
    if started is None:
        raise RingletError("start-up was interrupted")   # not reached: _redeliver raises
    job_id, t, topo = started
    _log(f"rank {rank} of {size}: {topo.describe()}; this rank: node {topo.node}, local rank "
         f"{topo.local_ranks.index(rank)} of {len(topo.local_ranks)}")
    __import__("ringlet.launch").launch.report_uncaught()  # for `ringlet run`'s summary
    return _aligned(_tuned(Communicator(rank, size, t, settings, job_id, topo), agreed))


def _tuned(comm: Communicator, agreed: dict[str, Any]) -> Communicator:
    """``comm`` with the tuner its node's ranks agreed on at start-up (the profile read
    then; the compiled path counted if every rank takes it), which its splits inherit.
    Used on one node only: a profile is one host's (see Communicator._choose)."""
    if agreed:
        comm._tuner = agreed_tuner(agreed["choosing"], comm.settings, agreed["lean"])
        elsewhere = comm._tuner and comm._tuner.profile.calibrated_elsewhere()
        if elsewhere and comm.rank == 0 and elsewhere not in _WARNED:
            _WARNED.add(elsewhere)   # once a process: a job may make many communicators
            warnings.warn(f"ringlet: the profile {agreed['choosing'].where} was {elsewhere}",
                          stacklevel=3)
    return comm


_WARNED: set[str] = set()


def _aligned(comm: Communicator) -> Communicator:
    """``comm`` with its trace's clock aligned to rank 0's when tracing across nodes
    (:func:`ringlet.tracing.clock_offset`; on one host every rank shares the clock)."""
    if comm.settings.trace and comm._fr is not None and len(comm.topology.nodes) > 1:
        from .tracing import clock_offset

        try:
            offset, rtt = clock_offset(comm)
        except BaseException:
            comm.close()
            raise
        comm._fr.align(offset, rtt)
        _log(f"rank {comm.rank}: clock offset to rank 0 {offset / 1000:.1f} us "
             f"(round trip {rtt / 1000:.1f} us)")
    return comm


def init_on_store(store: Any, rank: int, size: int, *,
                  settings: Settings | None = None) -> Communicator:
    """A communicator of ``size`` ranks that meet on a torch.distributed ``store``
    (what the torch backend gets for each process group): shared memory among the
    ranks of a node, torch.distributed's gloo between nodes
    (:func:`ringlet.engines.start`); one node gets shared memory only unless
    ``RINGLET_ENGINE=torch``.  Collective: every rank of the group calls it."""
    settings = Settings.from_env() if settings is None else settings
    settings.check_paths()
    if not 0 <= rank < size:
        raise ArgumentError(f"rank {rank} is out of range for size {size}")
    if settings.engine == "none" or settings.engine == "mpi":
        raise ConfigError(f"RINGLET_ENGINE={settings.engine}: a torch.distributed process "
                          f"group meets on torch's store and uses torch between nodes; "
                          f"unset RINGLET_ENGINE or set it to torch or auto")
    from .engines import start

    agreed: dict[str, Any] = {}
    job_id, t, topo = start("torch", rank, size, settings, None,
                            lambda lr, ls, j, names: _start(lr, ls, settings, j, None,
                                                            lambda: None, names, agreed),
                            store=store, keep_engine=settings.engine == "torch")
    _log(f"rank {rank} of {size} (on a torch store): {topo.describe()}")
    return _aligned(_tuned(Communicator(rank, size, t, settings, job_id, topo), agreed))


def _start(rank: int, size: int, settings: Settings, job_id: str | None, key: str | None,
           check: Callable[[], None], names: Sequence[int] | None = None,
           agreed: dict[str, Any] | None = None) -> tuple[str, ShmTransport]:
    """The rendezvous, then the shared-memory transport's start-up.  ``names``: the job's
    ranks of this node's ranks, where the node is part of a multi-node job (messages
    name those; ``rank`` and ``size`` are the node's).  ``agreed`` gets what the ranks
    agreed on for the automatic choice (:func:`_tuned`)."""
    pids = [0] * size
    c = choosing(settings)   # the profile, read once: every rank compares it below
    lean = bool(settings.lean)
    if size > 1:
        name = _job_rendezvous_name(job_id) if job_id is not None else \
            rendezvous_name(key or "")
        hello = {"rank": rank, "size": size, "pid": os.getpid(),
                 "shm": [getattr(settings, n) for n in _SHAPE],
                 "choice": [settings.algo, str(bool(settings.fused)), c.digest, c.where],
                 "lean": lean}
        if rank == 0:
            job_id, pids, lean = _serve(name, hello, job_id, settings, check, names)
        else:
            job_id, pids, lean = _join(name, hello, settings, check)
    elif job_id is None:
        job_id = secrets.token_hex(16)
    if agreed is not None:
        agreed.update(choosing=c, lean=lean)
    if names is not None:   # a node of a multi-node job: say which ranks these are
        _log(f"rank {names[rank]} (local rank {rank} of {size} on its node): job "
             f"{job_id[:8]}, the node's ranks {list(names)} have pids {pids}")
    else:
        _log(f"rank {rank} of {size}: job {job_id[:8]}, ranks' pids {pids}")
    t = ShmTransport(rank, size, f"ringlet-{job_id}-w", settings)
    if names is not None:
        t.names = list(names)
    t.pids[:] = pids
    t.connect(settings.init_timeout, check=check)
    if rank == 0:   # one rank per node: what jobs killed in their start-up left behind
        for path in sweep_stale():
            _log(f"removed {path}, a segment left by a job whose ranks were all killed "
                 f"during their start-up")
    return job_id, t


def rendezvous_name(key: str) -> str:
    """The rendezvous address (abstract socket name) of the ranks whose launcher gives
    them ``key`` (:attr:`ringlet.env.LaunchInfo.rendezvous_key`): public, predictable."""
    return "ringlet-rdv-" + hashlib.sha256(key.encode()).hexdigest()[:32]


def _job_rendezvous_name(job_id: str) -> str:
    # a one-way digest: abstract socket names are listed in /proc/net/unix for every
    # user to read, and the job id names the segments, so it must not show there
    return "ringlet-rdv-" + hashlib.sha256(f"job\0{job_id}".encode()).hexdigest()[:32]


def _address(name: str) -> str:
    return "\0" + name if _ABSTRACT else os.path.join(SHM_DIR, name)


def _shown(name: str) -> str:
    return f"@{name} (an abstract Unix socket)" if _ABSTRACT else os.path.join(SHM_DIR, name)


# --- rank 0: the rendezvous --------------------------------------------------------------


def _serve(name: str, mine: dict[str, Any], job_id: str | None, settings: Settings,
           check: Callable[[], None], names: Sequence[int] | None = None
           ) -> tuple[str, list[int], bool]:
    """Rank 0: wait for every rank's hello, then answer all with the job id, the pids and
    whether every rank takes the compiled path."""
    size = mine["size"]
    deadline = time.monotonic() + settings.init_timeout
    lsock = _listen(name)
    sel = selectors.DefaultSelector()
    sel.register(lsock, selectors.EVENT_READ)
    peers: dict[socket.socket, bytes] = {}            # connected, hello not complete
    hellos: dict[int, tuple[socket.socket, dict[str, Any]]] = {}
    try:
        try:
            while len(hellos) < size - 1:
                check()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CommTimeoutError(_missing(size, hellos, settings))
                for k, _ in sel.select(min(remaining, _POLL)):
                    s = cast(socket.socket, k.fileobj)
                    if s is lsock:
                        _accept(lsock, peers, sel)
                    elif s in peers:
                        _read_hello(s, peers, hellos, mine, sel)
                    else:   # a rank that said hello closed its end: it ended
                        _closed(s, hellos)
            _compare(mine, [h for _, h in hellos.values()], names)
            job = secrets.token_hex(16) if job_id is None else job_id
            pids = [mine["pid"]] + [hellos[q][1]["pid"] for q in range(1, size)]
            # the compiled path counts in the choice if every rank takes it
            lean = mine["lean"] and all(h["lean"] for _, h in hellos.values())
            for s, _ in hellos.values():
                _send(s, {"job": job, "pids": pids, "lean": lean})
            return job, pids, lean
        except BaseException as exc:
            # tell every rank that said hello why the job stops (they wait for an answer)
            kind = ("config" if isinstance(exc, ConfigError) else
                    "timeout" if isinstance(exc, CommTimeoutError) else "peer")
            text = str(exc) if isinstance(exc, RingletError) else \
                f"rank 0 (pid {mine['pid']}) stopped during start-up ({_why(exc)})"
            for s, _ in hellos.values():
                with contextlib.suppress(OSError):
                    _send(s, {"error": text, "kind": kind})
            raise
    finally:
        sel.close()
        for s in [*peers, *(s for s, _ in hellos.values())]:
            s.close()
        lsock.close()
        if not _ABSTRACT:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(_address(name))


def _listen(name: str) -> socket.socket:
    """Bind the rendezvous address, or say who holds it."""
    if not _ABSTRACT:
        _private_dir()
    for attempt in (0, 1):
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            lsock.bind(_address(name))
            lsock.listen(128)
            return lsock
        except OSError as exc:
            lsock.close()
            holder = _holder(name)
            if holder is None and not _ABSTRACT and attempt == 0:
                # a socket file left by a killed job of ours: nobody listens on it
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(_address(name))
                continue
            if holder is not None and holder[1] != os.geteuid():
                raise ConfigError(_foreign(name, holder)) from None
            pid = f" (pid {holder[0]})" if holder is not None else ""
            raise ConfigError(
                f"cannot start the rendezvous at {_shown(name)}: it is already in use by "
                f"another process of this user{pid} ({exc.strerror}); two jobs have the same "
                f"launcher ids and parent process, or a rank 0 of an earlier job still "
                f"runs: stop it, or start one job per launcher") from None
    raise AssertionError("unreachable")


def _holder(name: str) -> tuple[int, int] | None:
    """(pid, uid) of the process listening on the rendezvous address, if any."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(_address(name))
        pid, uid, _ = _creds(s)
        return pid, uid
    except OSError:
        return None
    finally:
        s.close()


def _accept(lsock: socket.socket, peers: dict[socket.socket, bytes],
            sel: selectors.BaseSelector) -> None:
    try:
        s, _ = lsock.accept()
    except OSError:
        return
    if _creds(s)[1] != os.geteuid():   # another user's process: never answered
        s.close()
        return
    s.setblocking(False)
    peers[s] = b""
    sel.register(s, selectors.EVENT_READ)


def _read_hello(s: socket.socket, peers: dict[socket.socket, bytes],
                hellos: dict[int, tuple[socket.socket, dict[str, Any]]],
                mine: dict[str, Any], sel: selectors.BaseSelector) -> None:
    try:
        data = s.recv(4096)
    except OSError:
        data = b""
    if not data:        # gone before saying hello: it will not be waited for
        del peers[s]
        sel.unregister(s)
        s.close()
        return
    buf = peers[s] + data
    if b"\n" not in buf:
        peers[s] = buf if len(buf) < 1 << 16 else b""
        return
    del peers[s]
    try:
        hello = json.loads(buf.split(b"\n", 1)[0])
        q, n, pid = int(hello["rank"]), int(hello["size"]), int(hello["pid"])
        shm = [int(v) for v in hello["shm"]]
        choice = [str(v) for v in hello["choice"]]
        lean = bool(hello["lean"])
    except (ValueError, KeyError, TypeError):
        sel.unregister(s)
        s.close()
        return
    hello = {"rank": q, "size": n, "pid": pid, "shm": shm, "choice": choice, "lean": lean}
    # a bad hello is kept under a negative key, so that it too is answered with the error
    if n != mine["size"]:
        hellos[-q - 1] = (s, hello)
        raise ConfigError(
            f"ranks disagree about the world size: rank 0 (pid {mine['pid']}) has "
            f"{mine['size']}, rank {q} (pid {pid}) has {n}; check the launcher's "
            f"WORLD_SIZE (or equivalent) and that one job runs per launcher")
    if not 0 < q < n or q in hellos:
        other = mine["pid"] if q == 0 else hellos[q][1]["pid"] if q in hellos else None
        hellos[-q - 1] = (s, hello)
        also = f" and pid {other}" if other is not None else ""
        raise ConfigError(
            f"two processes claim rank {q} of the job (pid {pid}{also}): two jobs share one "
            f"rendezvous (same launcher ids and parent process); start one job per launcher")
    hellos[q] = (s, hello)


def _closed(s: socket.socket, hellos: dict[int, tuple[socket.socket, dict[str, Any]]]) -> None:
    with contextlib.suppress(OSError):
        if s.recv(4096):
            return   # nothing else is expected: ignored
    q = next(r for r, (c, _) in hellos.items() if c is s)
    raise PeerError(f"rank {q} (pid {hellos[q][1]['pid']}) ended during start-up, before "
                    f"every rank had arrived; see its output for why")


def _settings_of(hello: dict[str, Any]) -> dict[str, tuple[Any, str]]:
    """The settings a hello carries that every rank must share: variable -> (the value
    compared, the value as messages show it).  The profile is compared by its contents
    (their digest) and shown with its path."""
    out: dict[str, tuple[Any, str]] = {f"RINGLET_{n.upper()}": (v, str(v))
                                       for n, v in zip(_SHAPE, hello["shm"], strict=True)}
    algo, fused, digest, where = hello["choice"]
    out["RINGLET_ALGO"] = (canonical_setting(algo), repr(algo))
    out["RINGLET_FUSED"] = (fused, fused)
    out["RINGLET_PROFILE"] = (digest, where + (f" (contents {digest})" if digest else ""))
    return out


def _compare(mine: dict[str, Any], theirs: list[dict[str, Any]],
             names: Sequence[int] | None = None) -> None:
    """One ConfigError naming every setting on which ranks differ that must be the same:
    the shared-memory ones, and those the automatic choice of algorithms reads (the
    ranks would choose differently), by their ranks in the job (``names``, where this
    is one node of a multi-node job)."""
    def name(q: int) -> int:
        return int(names[q]) if names is not None else q

    others = [(h["rank"], _settings_of(h)) for h in sorted(theirs, key=lambda h: h["rank"])]
    diffs = []
    for var, (value, shown) in _settings_of(mine).items():
        odd = [(q, got[var][1]) for q, got in others if got[var][0] != value]
        if odd:
            diffs.append(f"{var}: rank {name(0)} has {shown}; " +
                         "; ".join(f"rank {name(q)} has {text}" for q, text in odd))
    if diffs:
        raise ConfigError("ranks must use the same shared-memory settings and the same "
                          "settings for the automatic choice of algorithms (they would "
                          "choose differently); " + " | ".join(diffs))


def _missing(size: int, hellos: dict[int, Any], settings: Settings) -> str:
    missing = [q for q in range(1, size) if q not in hellos]
    came = [0] + sorted(q for q in hellos if q >= 0)
    return (f"start-up timed out after {settings.init_timeout:g} s (RINGLET_INIT_TIMEOUT): "
            f"{name_ranks(missing)} of {size} did not call ringlet.init() "
            f"({name_ranks(came)} did). "
            f"Check that every rank runs and calls ringlet.init(), that none failed or is "
            f"still busy before it (raise RINGLET_INIT_TIMEOUT if so), that all ranks "
            f"were started by the same launcher, and that RINGLET_NODE and RINGLET_ENGINE "
            f"are the same on every rank (a rank with either set differently starts over "
            f"MPI or torch.distributed instead of this rendezvous)")


# --- the other ranks -------------------------------------------------------------------


def _join(name: str, hello: dict[str, Any], settings: Settings,
          check: Callable[[], None]) -> tuple[str, list[int], bool]:
    """A rank > 0: connect to rank 0, say hello, wait for the job id or the job's error."""
    deadline = time.monotonic() + settings.init_timeout
    delay = 1e-3
    while True:
        check()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(1.0)
            s.connect(_address(name))
            break
        except OSError:
            s.close()
        if time.monotonic() > deadline:
            raise CommTimeoutError(
                f"start-up timed out after {settings.init_timeout:g} s "
                f"(RINGLET_INIT_TIMEOUT): rank {hello['rank']} of {hello['size']} found no "
                f"rank 0 at the rendezvous {_shown(name)}. Check that rank 0 runs and calls "
                f"ringlet.init(), that it did not fail first (see its output), that all "
                f"ranks were started by the same launcher, and that RINGLET_NODE and "
                f"RINGLET_ENGINE are the same on every rank (a rank with either set differently "
                f"starts over MPI or torch.distributed instead of this rendezvous)")
        time.sleep(delay)
        delay = min(delay * 2, _POLL)
    try:
        pid, uid, _ = _creds(s)
        if uid != os.geteuid():
            raise ConfigError(_foreign(name, (pid, uid)))
        _send(s, hello)
        s.settimeout(_POLL)
        # rank 0 answers within its own deadline, which started before it listened,
        # so before this connection: init_timeout from now always covers it
        limit = time.monotonic() + settings.init_timeout + 5.0
        buf = b""
        while b"\n" not in buf:
            check()
            if time.monotonic() > limit:
                raise CommTimeoutError(
                    f"start-up timed out: rank 0 (pid {pid}) did not answer within "
                    f"{settings.init_timeout:g} s (RINGLET_INIT_TIMEOUT); is it stopped?")
            try:
                data = s.recv(1 << 16)
            except TimeoutError:
                continue
            if not data:
                raise PeerError(
                    f"rank 0 (pid {pid}) ended during start-up without an answer: it "
                    f"failed or was killed; see its output")
            buf += data
    finally:
        s.close()
    reply = json.loads(buf.split(b"\n", 1)[0])
    if "error" in reply:
        kind = {"config": ConfigError, "timeout": CommTimeoutError}.get(reply["kind"],
                                                                       PeerError)
        raise kind(reply["error"])
    return str(reply["job"]), [int(p) for p in reply["pids"]], bool(reply["lean"])


# --- helpers ----------------------------------------------------------------------------


def _creds(s: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    if hasattr(socket, "SO_PEERCRED"):
        raw = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
        pid, uid, gid = (int.from_bytes(raw[i:i + 4], sys.byteorder) for i in (0, 4, 8))
        return pid, uid, gid
    return 0, os.geteuid(), os.getegid()   # only with a socket file in a private directory


def _foreign(name: str, holder: tuple[int, int]) -> str:
    pid, uid = holder
    return (f"the rendezvous {_shown(name)} is held by another user's process (pid {pid}, "
            f"uid {uid}{_user(uid)}), not by this job (uid {os.geteuid()}{_user(os.geteuid())})."
            f" Its name derives from the launcher's public ids, so another local user can "
            f"take it first; this job will not trust it. Stop that process (or ask its owner "
            f"to), or launch with `ringlet run`, whose rendezvous is private")


def _user(uid: int) -> str:
    try:
        import pwd

        return f" = {pwd.getpwuid(uid).pw_name}"
    except (ImportError, KeyError):
        return ""


def _private_dir() -> None:
    """Without abstract sockets the rendezvous socket lives in SHM_DIR, which must be ours."""
    os.makedirs(SHM_DIR, mode=0o700, exist_ok=True)
    st = os.lstat(SHM_DIR)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise ConfigError(
            f"{SHM_DIR} (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o}) is not a private "
            f"directory of this user: remove it, or set TMPDIR to a private directory")


def _send(s: socket.socket, msg: dict[str, Any]) -> None:
    s.setblocking(True)
    s.settimeout(5.0)
    s.sendall(json.dumps(msg).encode() + b"\n")


def _why(exc: BaseException) -> str:
    if isinstance(exc, _Interrupted):
        return f"it got {signal.Signals(exc.signum).name}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _log(msg: str) -> None:
    import logging

    logging.getLogger("ringlet").info(msg)


# --- signals and the launcher during start-up ---------------------------------------------


class _Interrupted(BaseException):
    """A held signal arrived: unwind start-up (every clean-up runs), then re-deliver it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def _held_signals(held: list[int]) -> Iterator[None]:
    """Hold SIGTERM, SIGINT and SIGHUP while the block runs: record them instead of dying
    mid-way with segments in place.  Only in the main thread (Python's rule) and only for
    signals whose handler is the default: a handler the program installed is kept."""
    saved: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in _HELD:
            current = signal.getsignal(sig)
            if current in (signal.SIG_DFL, signal.default_int_handler):
                saved[sig] = current
                signal.signal(sig, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _redeliver(signum: int) -> None:
    """Deliver a held signal again, now that its handler is restored (default: it kills)."""
    os.kill(os.getpid(), signum)
    time.sleep(0.1)   # the default action ends the process here; a Python handler runs here
    raise PeerError(f"start-up stopped by {signal.Signals(signum).name}")


def _checker(held: list[int], parent: int | None) -> Callable[[], None]:
    """What every start-up poll calls: stop for a held signal, if the launcher died, or
    if ``ringlet run`` says a rank of the job failed."""
    marker = None
    if "_RINGLET_RUN_ERRORS" in os.environ and os.environ.get("RINGLET_DUMP_DIR") and \
            os.environ.get("RINGLET_JOB_ID"):
        from .launch import failed_marker

        marker = failed_marker(os.environ["RINGLET_DUMP_DIR"], os.environ["RINGLET_JOB_ID"])

    def check() -> None:
        if held:
            raise _Interrupted(held[0])
        if parent is not None and os.getppid() != parent:
            raise PeerError(
                f"the launcher (pid {parent}, this rank's parent) exited during start-up; "
                f"this rank was orphaned and stops")
        if marker is not None:
            try:
                with open(marker) as f:
                    why = f.read().strip()
            except OSError:
                return
            raise PeerError(f"{why or 'a rank of this job failed'} while this rank was in "
                            f"start-up (ringlet run); it stops")

    return check
