"""Other processes as /proc tells them: alive, stopped, ended."""

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
