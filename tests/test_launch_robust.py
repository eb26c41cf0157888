"""Launchers under attack: killed with SIGKILL, signalled during start-up, used from a REPL.

Every test runs real processes with deadlines: a rank that outlives its
launcher, a file left in the shared-memory directory or a hang fails it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from ringlet.procs import alive
from ringlet.transport.shm import SHM_DIR

_ENV = {**os.environ, "RINGLET_TIMEOUT": "20", "RINGLET_INIT_TIMEOUT": "20"}

#: each rank prints its pid and job id, then waits in a collective for a long time
_SLEEPER = textwrap.dedent("""
    import os, sys, time
    import numpy as np, ringlet
    job = os.environ.get("RINGLET_JOB_ID", "")
    print("pid", os.getpid(), "job", job, flush=True)
    if os.environ.get("RANK") == "1" and len(sys.argv) > 1:
        time.sleep(float(sys.argv[1]))          # the others wait in start-up meanwhile
    comm = ringlet.init()
    comm.all_reduce(np.ones(2))
    print("ready", flush=True)
    time.sleep(60)
""")

_SPAWN_PARENT = textwrap.dedent("""
    import os, subprocess, sys, time
    import ringlet

    def body(comm, path, delay):
        child = subprocess.Popen(["sleep", "300"])   # a data loader's worker, say
        with open(f"{path}.{comm.rank}", "w") as f:
            f.write(f"{os.getpid()} {comm.job_id} {child.pid}")
        time.sleep(delay)
        return child.pid

    if __name__ == "__main__":
        print("parent", os.getpid(), flush=True)
        print("children", *ringlet.spawn(body, 3, sys.argv[1], float(sys.argv[2])), flush=True)
""")


def _wait_gone(pids: list[int], within: float) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids):
            return []
        time.sleep(0.02)
    return [p for p in pids if alive(p)]


def _assert_gone(pids: list[int], within: float = 2.0) -> None:
    """Fail if any of ``pids`` still runs after ``within`` s (then SIGKILL it: no leftovers)."""
    alive = _wait_gone(pids, within)
    for pid in alive:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    assert alive == [], f"processes {alive} still run {within:g} s after their launcher died"


def _assert_no_files(job: str, within: float = 2.0) -> None:
    """No file of ``job`` in the shared-memory directory (the watchdog has ``within`` s)."""
    deadline = time.monotonic() + within
    while _files_of(job) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _files_of(job) == []


def _files_of(job: str) -> list[str]:
    try:
        return [f for f in os.listdir(SHM_DIR) if f.startswith(f"ringlet-{job}-")]
    except FileNotFoundError:
        return []


class _Output:
    """A process's output lines, read by a thread (so a test waits with a deadline)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self.proc = proc
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, want: str, count: int, timeout: float) -> list[str]:
        deadline = time.monotonic() + timeout
        while sum(want in ln for ln in self.lines) < count:
            if time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"timed out waiting for {count} x {want!r}: {self.lines}")
            time.sleep(0.02)
        return list(self.lines)


def _pids_and_job(lines: list[str]) -> tuple[list[int], str]:
    pids, job = [], ""
    for ln in lines:
        words = ln.split()
        if "pid" in words:
            pids.append(int(words[words.index("pid") + 1]))
            job = words[words.index("job") + 1] if "job" in words else job
    return pids, job


def _run(script: Path, *args: str, n: int = 3) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "ringlet.cli", "run", "-n", str(n),
                             str(script), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_ENV)


def _children(pid: int) -> dict[int, str]:
    """``pid``'s child processes and their command lines, from /proc."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(stat[stat.rfind(b")") + 2:].split()[1]) == pid:
            found[int(entry)] = cmdline
    return found


def _kill_watchdog(launcher: int) -> None:
    """SIGKILL the launcher's watchdog (``ringlet._reaper``), so only the kernel is left."""
    dogs = [pid for pid, cmd in _children(launcher).items() if "_reaper.py" in cmd]
    assert len(dogs) == 1, _children(launcher)
    os.kill(dogs[0], signal.SIGKILL)
    _assert_gone(dogs)


@pytest.mark.parametrize("during,n", [("running", 2), ("running", 4), ("start-up", 3)])
def test_kill_9_of_ringlet_run_takes_the_ranks_and_their_files(tmp_path: Path, during: str,
                                                                 n: int) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(_SLEEPER)
    args = ["30"] if during == "start-up" else []
    proc = _run(script, *args, n=n)
    out = _Output(proc)
    out.wait_for("ready" if during == "running" else "pid", n, timeout=30)
    if args:
        time.sleep(0.5)   # ranks 0 and 2 are inside ringlet.init, rank 1 sleeps before it
    pids, job = _pids_and_job(out.wait_for("pid", n, timeout=5))
    assert len(pids) == n and job
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    _assert_gone(pids)
    _assert_no_files(job)


def test_kill_9_of_ringlet_run_removes_its_temporary_dump_dir(tmp_path: Path) -> None:
    """The dump directory ``ringlet run`` made in TMPDIR goes with the job, SIGKILL or not."""
    script = tmp_path / "sleeper.py"
    script.write_text(_SLEEPER)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {k: v for k, v in _ENV.items() if k != "RINGLET_DUMP_DIR"}
    proc = subprocess.Popen([sys.executable, "-m", "ringlet.cli", "run", "-n", "2", str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**env, "TMPDIR": str(tmp)})
    out = _Output(proc)
    pids, job = _pids_and_job(out.wait_for("ready", 2, timeout=30))
    assert [p.name for p in tmp.iterdir() if p.name.startswith("ringlet-dumps-")]
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    _assert_gone(pids)
    _assert_no_files(job)
    deadline = time.monotonic() + 3
    while list(tmp.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert list(tmp.iterdir()) == []


#: each rank starts a process of its own (a data loader's worker, say) and prints its pid
_PARENT_RANK = textwrap.dedent("""
    import os, subprocess, sys, time
    import numpy as np, ringlet
    comm = ringlet.init()
    child = subprocess.Popen(["sleep", "300"])
    print("pid", child.pid, "job", comm.job_id, flush=True)
    comm.all_reduce(np.ones(2))
    print("ready", flush=True)
    if sys.argv[1] != "end":
        time.sleep(60)
""")


@pytest.mark.parametrize("how", ["end", "SIGTERM", "SIGKILL"])
def test_the_processes_a_rank_started_end_with_the_job(tmp_path: Path, how: str) -> None:
    """They are in the rank's process group: the launcher forwards signals to the group
    and kills what is left of it at the end; its watchdog kills the group if the
    launcher is SIGKILLed (the kernel's parent-death signal had already killed the rank,
    and the watchdog, finding the rank gone, used to leave its group alone)."""
    script = tmp_path / "parent_rank.py"
    script.write_text(_PARENT_RANK)
    proc = _run(script, how, n=2)
    out = _Output(proc)
    pids, job = _pids_and_job(out.wait_for("ready", 2, timeout=30))
    assert len(pids) == 2 and all(alive(p) for p in pids)
    if how != "end":
        proc.send_signal(getattr(signal, how))
    proc.wait(15)
    _assert_gone(pids, within=3.0)
    _assert_no_files(job)


_LATE_TO_INIT = textwrap.dedent("""
    import os, time, ringlet
    rank = int(os.environ["RANK"])
    if rank == 2:
        time.sleep(0.5)
        os._exit(9)                 # dies before ringlet.init
    if rank in (1, 3):
        time.sleep(3)               # reach ringlet.init after rank 0 has given up
    try:
        ringlet.init()
    except ringlet.RingletError as exc:
        print(f"rank {rank}: {type(exc).__name__}: {exc}", flush=True)
        raise SystemExit(1)
""")


@pytest.mark.waits
def test_a_rank_that_reaches_init_after_the_job_failed_stops_at_once(tmp_path: Path) -> None:
    """Rank 0 fails when rank 2 dies in start-up; ranks that reach init later find no
    rendezvous and used to wait for the whole RINGLET_INIT_TIMEOUT (or the grace
    period), then blame rank 0.  ringlet run's marker stops them at once, naming rank 2."""
    script = tmp_path / "late_to_init.py"
    script.write_text(_LATE_TO_INIT)
    proc = subprocess.run([sys.executable, "-m", "ringlet.cli", "run", "-n", "4", "--grace",
                           "60", str(script)], capture_output=True, text=True, timeout=60,
                          env={**_ENV, "RINGLET_INIT_TIMEOUT": "40",
                               "RINGLET_DUMP_DIR": str(tmp_path / "dumps")})
    for rank in (1, 3):
        assert (f"rank {rank}: PeerError: rank 2 of this job ended with an error while this "
                f"rank was in start-up") in proc.stdout, proc.stdout + proc.stderr
    assert "rank 2 failed first (exit code 9)" in proc.stderr
    assert not list((tmp_path / "dumps").glob("*.failed"))   # the marker is removed at the end


_CHECKPOINTER = textwrap.dedent("""
    import signal, sys, time
    import ringlet
    comm = ringlet.init()

    def save(signum, frame):
        print("saving a checkpoint", flush=True)
        time.sleep(0.5)
        print("checkpoint saved", flush=True)
        sys.exit(0)

    signal.signal(signal.SIGTERM, save)
    print("ready", flush=True)
    time.sleep(60)
""")


@pytest.mark.waits
def test_a_signal_sent_twice_at_once_is_one_signal(tmp_path: Path) -> None:
    """timeout(1) sends its SIGTERM to the launcher and again to its own process group:
    that used to count as a second Ctrl-C, which SIGKILLs the ranks without their
    grace period, so no rank finished saving its checkpoint."""
    script = tmp_path / "checkpointer.py"
    script.write_text(_CHECKPOINTER)
    proc = subprocess.Popen(["timeout", "-s", "TERM", "8", sys.executable, "-m", "ringlet.cli",
                             "run", "-n", "3", str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_ENV)
    try:
        text = proc.communicate(timeout=60)[0]
    finally:
        proc.kill()
    assert text.count("checkpoint saved") == 3, text
    assert "SIGKILL" not in text, text


#: each rank leaves a file in the job's name (as a rank killed in start-up leaves its
#: segment), then waits; rank 1 sleeps before ringlet.init, so the others wait inside it
_LITTERER = textwrap.dedent("""
    import os, sys, time
    import ringlet
    from ringlet.transport.shm import SHM_DIR
    job, rank = os.environ["RINGLET_JOB_ID"], os.environ["RANK"]
    fd = os.open(os.path.join(SHM_DIR, f"ringlet-{job}-left{rank}"),
                 os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    os.ftruncate(fd, 1 << 20)
    print("pid", os.getpid(), "job", job, flush=True)
    if rank == "1":
        time.sleep(30)
    ringlet.init()
    time.sleep(30)
""")


def test_double_fault_leaves_no_file(tmp_path: Path) -> None:
    """``ringlet run`` and a rank in start-up are both SIGKILLed: nobody is left to clean
    up but the watchdog, which must remove every file of the job."""
    script = tmp_path / "litterer.py"
    script.write_text(_LITTERER)
    proc = _run(script, n=3)
    lines = _Output(proc).wait_for("pid", 3, timeout=30)
    time.sleep(0.5)
    pids, job = _pids_and_job(lines)
    assert len(_files_of(job)) == 3
    os.kill(pids[0], signal.SIGKILL)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    _assert_gone(pids)
    _assert_no_files(job)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_ranks_die_with_ringlet_run_even_without_its_watchdog(tmp_path: Path) -> None:
    """The kernel (PR_SET_PDEATHSIG, set before the rank's program runs) kills the ranks."""
    script = tmp_path / "sleeper.py"
    script.write_text(_SLEEPER)
    proc = _run(script, "30", n=2)   # rank 1 sleeps before ringlet.init, rank 0 waits in it
    pids, _ = _pids_and_job(_Output(proc).wait_for("pid", 2, timeout=30))
    _kill_watchdog(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    _assert_gone(pids)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_ringlet_run_during_start_up_leaves_nothing(tmp_path: Path, sig: int) -> None:
    script = tmp_path / "sleeper.py"
    script.write_text(_SLEEPER)
    proc = _run(script, "30")
    lines = _Output(proc).wait_for("pid", 3, timeout=30)
    time.sleep(0.5)
    pids, job = _pids_and_job(lines)
    proc.send_signal(sig)
    proc.wait(15)
    assert proc.returncode == 128 + sig
    _assert_gone(pids)
    assert _files_of(job) == []


@pytest.mark.parametrize("method", ["auto", "spawn", "forkserver"])
@pytest.mark.parametrize("watchdog", ["watchdog", "no watchdog"])
def test_kill_9_of_a_spawn_parent_takes_the_ranks(tmp_path: Path, method: str,
                                                  watchdog: str) -> None:
    """With its watchdog, or with only the kernel (PR_SET_PDEATHSIG) left to do it."""
    if watchdog == "no watchdog" and not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux's")
    if watchdog == "no watchdog" and method == "forkserver":
        pytest.skip("a fork server's children keep it alive: only the watchdog stops them")
    script = tmp_path / "parent.py"
    script.write_text(_SPAWN_PARENT)
    marks = tmp_path / "pid"
    proc = subprocess.Popen([sys.executable, str(script), str(marks), "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**_ENV, "RINGLET_START_METHOD": method})
    deadline = time.monotonic() + 30
    files = [Path(f"{marks}.{r}") for r in range(3)]
    while not all(f.exists() and f.read_text() for f in files):
        assert time.monotonic() < deadline, "the ranks did not start"
        time.sleep(0.05)
    pids = [int(f.read_text().split()[0]) for f in files]
    job = files[0].read_text().split()[1]
    started = [int(f.read_text().split()[2]) for f in files]   # the ranks' own children
    if watchdog == "no watchdog":
        _kill_watchdog(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    _assert_gone(pids)
    assert _files_of(job) == []
    if watchdog == "no watchdog":   # the kernel kills the ranks only
        for pid in started:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    else:    # the watchdog kills each rank's process group
        _assert_gone(started, within=3.0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="start times come from /proc")
def test_a_watchdog_that_reads_late_still_kills_what_a_dead_rank_left(tmp_path: Path) -> None:
    """On a busy machine the watchdog may read its pipe only after the launcher died and
    the kernel killed the ranks (it is a Python process starting up meanwhile): it read
    each rank's start time then, found none, and left the rank's group (the processes the
    rank started) running.  The launcher now reads the start time and sends it."""
    from ringlet.launch import _Watchdog

    rank = subprocess.Popen(["sh", "-c", "sleep 300 & echo $!; wait"], stdout=subprocess.PIPE,
                            text=True, process_group=0)
    assert rank.stdout is not None
    started = int(rank.stdout.readline())       # the rank's own child, in the rank's group
    dog = _Watchdog("latereader")
    assert dog.proc is not None
    try:
        os.kill(dog.proc.pid, signal.SIGSTOP)   # it reads nothing until told to
        dog.watch(rank.pid, True)
        rank.kill()                            # as the kernel's PR_SET_PDEATHSIG does
        rank.wait(10)
        dog.proc.stdin.close()                 # type: ignore[union-attr]  # the launcher dies
        os.kill(dog.proc.pid, signal.SIGCONT)
        dog.proc.wait(10)
        _assert_gone([started], within=3.0)
    finally:
        with contextlib.suppress(OSError):
            os.killpg(rank.pid, signal.SIGKILL)
        dog.proc.kill()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_the_processes_a_spawned_rank_started_end_with_the_job(tmp_path: Path,
                                                               method: str) -> None:
    """Each rank of ringlet.spawn leads a process group, as ringlet run's do: what a rank
    started and left running is killed when the job ends (it was left running)."""
    script = tmp_path / "parent.py"
    script.write_text(_SPAWN_PARENT)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "pid"), "0"],
                          capture_output=True, text=True, timeout=60,
                          env={**_ENV, "RINGLET_START_METHOD": method})
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("children")), None)
    assert proc.returncode == 0 and line, proc.stdout + proc.stderr
    _assert_gone([int(p) for p in line.split()[1:]])


# --- ringlet.spawn where people try it first -----------------------------------------------

_TOTAL = textwrap.dedent("""
    import numpy as np
    import ringlet

    def total(comm, n):
        x = np.full(n, comm.rank + 1.0)
        comm.all_reduce(x)
        return float(x[0])

    print("result", ringlet.spawn(total, 2, 2))
""")


@pytest.mark.parametrize("how", ["script without guard", "python -c", "python -",
                                 "interactive"])
def test_spawn_works_where_people_try_it_first(tmp_path: Path, how: str) -> None:
    script = tmp_path / "noguard.py"
    script.write_text(_TOTAL)
    cmd: list[str]
    stdin = None
    if how == "script without guard":
        cmd = [sys.executable, str(script)]
    elif how == "python -c":
        cmd = [sys.executable, "-c", _TOTAL]
    elif how == "python -":
        cmd = [sys.executable, "-"]
        stdin = _TOTAL
    else:
        cmd = [sys.executable, "-i", "-q"]
        stdin = _TOTAL.replace("    return float(x[0])\n", "    return float(x[0])\n\n")
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=120,
                       cwd=tmp_path, env=_ENV)
    assert "result [3.0, 3.0]" in p.stdout, p.stdout + p.stderr


_TORCH = textwrap.dedent("""
    import sys
    import torch
    import ringlet

    def total(comm):
        x = (torch.ones(300, 300) @ torch.ones(300, 300))[0, :2].contiguous()
        comm.all_reduce(x)
        return x.tolist()

    if sys.argv[1] == "warm":   # torch starts its OpenMP pool: a forked rank would hang in it
        torch.ones(300, 300) @ torch.ones(300, 300)
    if sys.argv[2] == "guard":
        if __name__ == "__main__":
            print("result", ringlet.spawn(total, 2))
    else:
        print("result", ringlet.spawn(total, 2))
""")


@pytest.mark.parametrize("warm,guard", [("cold", "noguard"), ("warm", "guard"),
                                        ("warm", "noguard")])
def test_spawn_with_torch_never_hangs(tmp_path: Path, warm: str, guard: str) -> None:
    """auto forks only while no thread pool runs: torch's OpenMP pool does not survive fork."""
    script = tmp_path / "withtorch.py"
    script.write_text(_TORCH)
    p = subprocess.run([sys.executable, str(script), warm, guard], capture_output=True,
                       text=True, timeout=120, cwd=tmp_path, env=_ENV)
    if warm == "warm" and guard == "noguard":   # spawn, which needs the guard: says so
        assert p.returncode != 0
        assert "ringlet did not fork: this process runs" in p.stderr, p.stderr
    else:
        assert "result [[600.0, 600.0], [600.0, 600.0]]" in p.stdout, p.stdout + p.stderr


def test_spawn_method_without_guard_says_what_to_change(tmp_path: Path) -> None:
    script = tmp_path / "noguard.py"
    script.write_text(_TOTAL)
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path, env={**_ENV, "RINGLET_START_METHOD": "spawn"})
    assert p.returncode != 0
    assert 'must be under `if __name__ == "__main__":`' in p.stderr, p.stderr


def test_spawn_refuses_an_interactive_function_it_cannot_fork(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import threading, time, ringlet
        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()
        def f(comm):
            return comm.rank
        try:
            ringlet.spawn(f, 2)
        except ringlet.SpawnError as exc:
            print("refused:", exc)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, env=_ENV)
    assert "refused: ringlet.spawn cannot start 'f'" in p.stdout, p.stdout + p.stderr
    assert "start_method='fork'" in p.stdout


# --- the summary names the rank at fault ------------------------------------------------

_STOPPER = textwrap.dedent("""
    import os, signal
    import numpy as np, ringlet
    comm = ringlet.init()
    if comm.rank == comm.size - 1:
        os.kill(os.getpid(), signal.SIGSTOP)
    comm.all_reduce(np.ones(2))
""")


@pytest.mark.waits
def test_summary_blames_the_stopped_rank_and_quotes_the_error(tmp_path: Path) -> None:
    script = tmp_path / "stopper.py"
    script.write_text(_STOPPER)
    p = subprocess.run([sys.executable, "-m", "ringlet.cli", "run", "-n", "3", "--grace", "1",
                        str(script)], capture_output=True, text=True, timeout=60,
                       env={**_ENV, "RINGLET_TIMEOUT": "2"})
    summary = p.stderr.strip().splitlines()[-1]
    assert summary.startswith("ringlet run: rank 2 was stopped (SIGSTOP or a debugger) while "
                              "the others waited for it; rank "), summary
    assert "failed first (exit code 1: ringlet.errors.CommTimeoutError: " in summary
    assert "rank 2 did not arrive" in summary


#: rank 2 raises between two calls; its exit handlers outlast its peers' (ringlet's own, which
#: tell the peers, run first: atexit runs the last registered first); the peers exit with 3
_RAISES = textwrap.dedent("""
    import atexit, os, sys, time
    if os.environ["RANK"] == "2":   # before ringlet registers its own
        atexit.register(time.sleep, 2.5)
    import numpy as np, ringlet
    comm = ringlet.init()
    comm.all_reduce(np.ones(2))
    if comm.rank == 2:
        raise ValueError("boom")
    try:
        comm.all_reduce(np.ones(2))
    except ringlet.RingletError:
        sys.exit(3)
""")


@pytest.mark.parametrize("grace", [6, 1])
@pytest.mark.waits
def test_summary_blames_the_rank_that_raised_first_not_the_first_to_exit(
        tmp_path: Path, grace: int) -> None:
    """The first rank to report an uncaught exception failed first, though its peers heard
    of it and exited before it did; the job's exit code is its; with a grace period
    shorter than its exit, it is stopped, and the summary says both."""
    script = tmp_path / "raises.py"
    script.write_text(_RAISES)
    p = subprocess.run([sys.executable, "-m", "ringlet.cli", "run", "-n", "4", "--grace",
                        str(grace), str(script)], capture_output=True, text=True, timeout=60,
                       env=_ENV)
    summary = p.stderr.strip().splitlines()[-1]
    if grace > 3:
        assert summary == "ringlet run: rank 2 failed first (exit code 1: ValueError: boom); " \
                          "ranks 0, 1, 3 then exited on their own (exit code 3)", p.stderr
        assert p.returncode == 1
    else:
        assert summary == "ringlet run: rank 2 failed first (ValueError: boom), then was " \
                          f"stopped with SIGTERM after the {grace} s grace period; ranks 0, " \
                          "1, 3 then exited on their own (exit code 3)", p.stderr


#: the last rank never calls a collective: the others time out waiting for it
_ABSENT = textwrap.dedent("""
    import time
    import numpy as np, ringlet
    comm = ringlet.init()
    if comm.rank == comm.size - 1:
        time.sleep(60)
    comm.all_reduce(np.ones(2))
""")


@pytest.mark.parametrize("prefix", ["prefix", "no prefix"])
@pytest.mark.waits
def test_summary_quotes_the_error_that_names_the_absent_rank(tmp_path: Path,
                                                             prefix: str) -> None:
    """The ranks' own reports (a pipe to the launcher), not their stderr: --no-prefix too."""
    script = tmp_path / "absent.py"
    script.write_text(_ABSENT)
    flags = ["--no-prefix"] if prefix == "no prefix" else []
    p = subprocess.run([sys.executable, "-m", "ringlet.cli", "run", "-n", "4", "--grace", "1",
                        *flags, str(script)], capture_output=True, text=True, timeout=60,
                       env={**_ENV, "RINGLET_TIMEOUT": "2"})
    summary = p.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"ringlet run: rank [012] failed first \(exit code 1: ringlet\.errors\.CommTimeoutError: "
        r".*rank 3 did not arrive\..*\); .*rank 3 was stopped with SIGTERM after the 1 s "
        r"grace period", summary), summary
    assert p.returncode == 1


#: rank 1 times out first (rank 0 sends it nothing) and reports late; rank 0, in a barrier
#: by then, fails with rank 1's timeout, relayed, and reports first
_RELAYED = textwrap.dedent("""
    import time
    import numpy as np, ringlet
    comm = ringlet.init()
    if comm.rank == 1:
        try:
            comm.recv(np.empty(1), 0)
        except ringlet.CommTimeoutError:
            time.sleep(1.5)
            raise
    time.sleep(1)
    comm.barrier()
""")


@pytest.mark.waits
def test_summary_blames_the_rank_that_timed_out_not_one_that_heard_of_it(
        tmp_path: Path) -> None:
    """A timeout relayed to a rank is an echo, as a PeerError is: the rank whose own wait
    passed its deadline failed first, though a rank that heard of it reported first."""
    script = tmp_path / "relayed.py"
    script.write_text(_RELAYED)
    p = subprocess.run([sys.executable, "-m", "ringlet.cli", "run", "-n", "2", str(script)],
                       capture_output=True, text=True, timeout=60,
                       env={**_ENV, "RINGLET_TIMEOUT": "2"})
    summary = p.stderr.strip().splitlines()[-1]
    assert summary.startswith("ringlet run: rank 1 failed first (exit code 1: ringlet.errors."
                              "CommTimeoutError: timed out after 2 s in recv from rank 0"), \
        p.stderr
    assert "rank 0 then exited on their own" in summary or \
        "rank 0 then exited on its own" in summary, summary
    assert "rank 1: timed out after 2 s in recv from rank 0" in p.stderr   # what rank 0 heard


_HANDLED = textwrap.dedent("""
    import sys, traceback
    import ringlet
    try:
        raise ValueError("handled before init")
    except ValueError:
        traceback.print_exc()
    comm = ringlet.init()
    if comm.rank == 1:
        try:
            raise KeyError("handled after init")
        except KeyError:
            traceback.print_exc()
        if len(sys.argv) > 1:
            sys.excepthook = sys.__excepthook__   # a hook of the user's own
            raise RuntimeError("the real one")
        sys.exit(5)
""")


@pytest.mark.parametrize("how", ["sys.exit", "own excepthook"])
def test_summary_does_not_quote_a_handled_exception(tmp_path: Path, how: str) -> None:
    script = tmp_path / "handled.py"
    script.write_text(_HANDLED)
    args = ["raise"] if how == "own excepthook" else []
    p = subprocess.run([sys.executable, "-m", "ringlet.cli", "run", "-n", "2", str(script),
                        *args], capture_output=True, text=True, timeout=60, env=_ENV)
    summary = p.stderr.strip().splitlines()[-1]
    if how == "sys.exit":     # no uncaught exception: nothing to quote
        assert summary == "ringlet run: rank 1 failed first (exit code 5); rank 0 finished " \
                          "(exit code 0)", p.stderr
    else:                     # the pipe was not told: the last exception on stderr is quoted
        assert summary == "ringlet run: rank 1 failed first (exit code 1: RuntimeError: the " \
                          "real one); rank 0 finished (exit code 0)", p.stderr


def test_version() -> None:
    from ringlet import __version__

    p = subprocess.run([sys.executable, "-m", "ringlet.cli", "--version"], capture_output=True,
                       text=True, timeout=30)
    assert p.stdout.strip() == f"ringlet {__version__}"


_SMALL = "import numpy as np, ringlet\nc = ringlet.init()\nx = np.ones(2)\nc.all_reduce(x)\n" \
         "print('sum', x[0])\n"


@pytest.mark.parametrize("soft, hard", [(20, None), (20, 30)])
def test_open_files_limit_is_raised_or_named(tmp_path: Path, soft: int, hard: int | None
                                             ) -> None:
    """A soft limit of open files too low for the job (each rank maps every peer's
    segment, and ringlet run keeps pipes per rank) is raised towards the hard limit, as
    `ulimit -n` would; a hard limit too low is a ConfigError saying so (it was "could not
    start rank 4: Too many open files", or the same error in a rank's start-up)."""
    import resource

    script = tmp_path / "small.py"
    script.write_text(_SMALL)
    _, cur_hard = resource.getrlimit(resource.RLIMIT_NOFILE)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard if hard else cur_hard))

    p = subprocess.run([sys.executable, "-m", "ringlet.cli", "run", "-n", "8", str(script)],
                       capture_output=True, text=True, timeout=120, env=_ENV,
                       preexec_fn=limit)
    if hard is None:
        assert p.returncode == 0 and p.stdout.count("sum 8.0") == 8, p.stderr[-2000:]
    else:
        assert p.returncode != 0 and "ringlet run -n 8 needs about 48 open files, and this " \
            "process may open 30 (its hard limit, `ulimit -Hn`)" in p.stderr, p.stderr[-2000:]
