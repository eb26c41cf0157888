"""Other processes as /proc tells them: alive, stopped, ended; and this one's cores."""

from __future__ import annotations

import os


def proc_state(pid: int) -> bytes | None:
    """The process's state letter (``b"R"``, ``b"S"``, ``b"T"``, ``b"Z"``...), or None if
    there is no such process.  Where /proc cannot be read, ``b"?"`` if the pid exists."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            return b"?"
        return b"?"
    end = stat.rfind(b")")
    return stat[end + 2:end + 3]


def alive(pid: int) -> bool:
    """True while the process runs (or is stopped); False once it ended (a zombie too)."""
    return proc_state(pid) not in (None, b"Z", b"X")


def stopped(pid: int) -> bool:
    """True if the process is stopped (SIGSTOP, or traced by a debugger)."""
    return proc_state(pid) in (b"T", b"t")


def more_files(needed: int, what: str) -> None:
    """Raise this process's soft limit of open files (RLIMIT_NOFILE) towards its hard
    limit so that ``needed`` fit (children inherit it), as ``ulimit -n`` would; a
    ConfigError saying what needs them if the hard limit is lower."""
    try:
        import resource
    except ImportError:   # pragma: no cover - not on Linux
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or needed <= soft:
        return
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        target = soft
    if target < needed:
        from .errors import ConfigError

        raise ConfigError(f"{what} needs about {needed:,} open files, and this process may "
                          f"open {target:,} (its hard limit, `ulimit -Hn`): raise it, or run "
                          f"fewer ranks")


def cores() -> int:
    """Cores this process may run on (its CPU affinity)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1
