"""The launcher's watchdog: when ``ringlet run`` or a ``ringlet.spawn`` parent dies, its ranks go.

``ringlet run`` and :func:`ringlet.spawn` start this script (by its path, so
that it imports nothing of ringlet, numpy included) with a pipe as its
standard input, whose write end only the launcher holds.  The launcher writes
one line per rank it starts (``pid PID GROUP START``, GROUP 1 if the rank leads its
own process group, START its start time as :func:`start_time` read it in the launcher,
``-`` if it could not), ``dir HEXPATH`` for a temporary directory of the launcher's to remove
too (its path, hex-encoded), and ``done`` when the job is over.  If the pipe reaches its
end without ``done``, the launcher died, however it died (SIGKILL included):
the watchdog SIGKILLs every rank still running (its process group where it
leads one), waits until they are gone, and removes every file the job left in
the shared-memory directory (``ringlet-<job id>-*`` owned by this user), and the
launcher's temporary directories (``ringlet run``'s dump directory).

Usage: ``python _reaper.py JOB_ID SHM_DIR`` (the launcher's business only).
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import sys
import time

#: seconds to wait for killed ranks to be gone before removing their files anyway
GONE_WITHIN = 2.0


def start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), to tell a reused pid apart;
    None if it is gone, a zombie, or /proc cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    if fields[:1] in ([b"Z"], [b"X"]):
        return None
    return fields[19].decode() if len(fields) > 19 else None


def _kill(pid: int, group: bool, started: str | None) -> None:
    now = start_time(pid)
    if started is None or (now is not None and now != started):
        return  # the pid now belongs to another process (and so would a group of its number)
    if now is None and not group:
        return  # gone
    try:
        # a group outlives its leader while a member runs: the processes the rank started
        # (the kernel's PR_SET_PDEATHSIG has usually killed the rank itself already)
        if group:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:  # its group not made yet (ringlet.spawn's ranks)
                os.kill(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _remove(job_id: str, shm_dir: str) -> None:
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return
    uid = os.geteuid()
    for name in names:
        if not name.startswith(f"ringlet-{job_id}-"):
            continue
        path = os.path.join(shm_dir, name)
        try:
            if os.lstat(path).st_uid == uid:
                os.unlink(path)
        except OSError:
            pass


def _remove_dir(path: str) -> None:
    """Remove a temporary directory of the launcher's: a real directory of this user only."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        shutil.rmtree(path, ignore_errors=True)


def main(argv: list[str]) -> int:
    job_id, shm_dir = argv[1], argv[2]
    if not job_id or not all(c.isalnum() or c in "-_" for c in job_id):
        return 2
    # the terminal's Ctrl-C is the launcher's to handle, not this process's
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ranks: list[tuple[int, bool, str | None]] = []
    dirs: list[str] = []
    done = False
    for line in sys.stdin.buffer:
        words = line.split()
        if words[:1] == [b"pid"] and len(words) == 4:
            # the start time the launcher read while the rank surely ran: this process may
            # read the line only after the launcher died and the kernel killed the rank
            # (it starts slowly on a busy machine), too late to read it here
            pid = int(words[1])
            started = words[3].decode() if words[3] != b"-" else start_time(pid)
            ranks.append((pid, words[2] == b"1", started))
        elif words[:1] == [b"dir"] and len(words) == 2:
            try:
                dirs.append(os.fsdecode(bytes.fromhex(words[1].decode())))
            except ValueError:
                pass
        elif words == [b"done"]:
            done = True
    if done:
        return 0
    for pid, group, started in ranks:
        _kill(pid, group, started)
    deadline = time.monotonic() + GONE_WITHIN
    while time.monotonic() < deadline and any(
            start_time(pid) == started and started is not None for pid, _, started in ranks):
        time.sleep(0.01)
    _remove(job_id, shm_dir)
    for path in dirs:
        _remove_dir(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
