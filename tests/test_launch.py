"""The launcher: ``ringlet run`` end to end, ``ringlet.spawn``, and the shared failure policy.

``ringlet run`` is driven as a user would, in a subprocess, with the scripts
in ``tests/scripts`` (they need no communicator).  ``spawn``'s process
management is tested with a stand-in for ``ringlet.init``
(``spawnfns.fake_init``), and once with the real communicator.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import shm_files, shm_left

from ringlet.config import Settings
from ringlet.errors import ArgumentError, SpawnError
from ringlet.launch import _Ending, _Outcome, _ranks, _spawn, spawn

SCRIPTS = Path(__file__).parent / "scripts"
sys.path.insert(0, str(SCRIPTS))  # spawned ranks inherit sys.path and import spawnfns by name

import spawnfns  # noqa: E402

CLI = [sys.executable, str(SCRIPTS / "ringlet_cli.py")]
HEX32 = re.compile(r"[0-9a-f]{32}\Z")


def ringlet_run(*argv: str, env: dict[str, str] | None = None,
                timeout: float = 20) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, "run", *argv], capture_output=True, text=True, cwd=SCRIPTS,
                          timeout=timeout, env=env)


def summary(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("ringlet run:")]
    assert len(lines) == 1, proc.stderr
    return lines[0]


# -- ringlet run: output, arguments, environment ----------------------------------------------


@pytest.mark.parametrize("n", [1, 3, 8])
def test_ranks_see_their_variables_and_arguments(n: int) -> None:
    proc = ringlet_run("-n", str(n), "rank_env.py", "--foo", "1", "-n", "9")
    assert proc.returncode == 0, proc.stderr
    seen = {}
    for line in proc.stdout.splitlines():
        prefix, _, payload = line.partition(" ")
        rank = int(prefix.strip("[]"))
        seen[rank] = json.loads(payload)
        assert seen[rank]["env"]["RANK"] == str(rank)
    assert sorted(seen) == list(range(n))
    job_ids = {r["env"]["RINGLET_JOB_ID"] for r in seen.values()}
    assert len(job_ids) == 1 and HEX32.match(job_ids.pop())
    for r in seen.values():
        assert r["argv"] == ["--foo", "1", "-n", "9"]
        assert r["main"] == "__main__"
        assert r["env"]["WORLD_SIZE"] == r["env"]["LOCAL_WORLD_SIZE"] == str(n)
        assert r["env"]["LOCAL_RANK"] == r["env"]["RANK"]
        assert r["env"]["PYTHONUNBUFFERED"] == "1"
    # stderr: each rank's line, prefixed, and no summary when every rank succeeded
    assert sorted(proc.stderr.splitlines()) == [f"[{r}] to stderr from {r}" for r in range(n)]


@pytest.mark.parametrize("given", [{}, {"MASTER_PORT": "29123"},
                                   {"MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29124"}])
def test_torch_rendezvous_variables_fill_what_is_not_set(given: dict[str, str]) -> None:
    """MASTER_ADDR and MASTER_PORT, as torchrun sets them, where the user did not (a user's
    MASTER_PORT alone used to leave MASTER_ADDR unset: dist.init_process_group failed)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MASTER_")}
    proc = ringlet_run("-n", "2", "rank_env.py", env={**env, **given})
    assert proc.returncode == 0, proc.stderr
    seen = [json.loads(line.partition(" ")[2])["env"] for line in proc.stdout.splitlines()]
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in seen}) == 1
    assert seen[0]["MASTER_ADDR"] == given.get("MASTER_ADDR", "127.0.0.1")
    assert seen[0]["MASTER_PORT"] == given.get("MASTER_PORT", seen[0]["MASTER_PORT"])
    assert 0 < int(seen[0]["MASTER_PORT"]) < 65536


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("given", [None, "3"])
def test_ranks_share_the_cores_out_unless_the_user_says(n: int, given: str | None) -> None:
    """OMP_NUM_THREADS, as torchrun sets it for several ranks, where the user did not: the
    cores shared out, at least one a rank (each rank's torch and BLAS otherwise start a
    thread per core)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = ringlet_run("-n", str(n), "rank_env.py",
                       env=env if given is None else {**env, "OMP_NUM_THREADS": given})
    assert proc.returncode == 0, proc.stderr
    seen = {json.loads(line.partition(" ")[2])["env"]["OMP_NUM_THREADS"]
            for line in proc.stdout.splitlines()}
    shared = str(max(1, len(os.sched_getaffinity(0)) // n)) if n > 1 else None
    assert seen == {given if given is not None else shared}


def test_every_job_gets_a_fresh_job_id() -> None:
    ids = set()
    for _ in range(2):
        proc = ringlet_run("-n", "1", "rank_env.py")
        ids.add(json.loads(proc.stdout.partition(" ")[2])["env"]["RINGLET_JOB_ID"])
    assert len(ids) == 2


def test_prefixes_are_padded_to_one_width() -> None:
    proc = ringlet_run("-n", "11", "-m", "pkg_demo.hello", "a", "-b")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == sorted(
        f"[{r:>2}] hello from {r} of 11 args=['a', '-b']" for r in range(11))


def test_module_without_prefix() -> None:
    proc = ringlet_run("-n", "2", "--no-prefix", "-m", "pkg_demo.hello", "--", "x")
    assert proc.returncode == 0 and "[" not in proc.stdout.replace("['--', 'x']", "")
    # the output is passed through untouched: unbuffered prints of two ranks may mix
    assert sorted(re.findall(r"hello from \d of 2 args=\['--', 'x'\]", proc.stdout)) == [
        f"hello from {r} of 2 args=['--', 'x']" for r in range(2)]


def test_lines_stay_whole() -> None:
    proc = ringlet_run("-n", "4", "chatty.py", "100")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout.splitlines()
    assert len(out) == 4 * 101
    for line in out:
        m = re.fullmatch(r"\[(\d)\] out (\d) \d+ (\d+) end", line) or re.fullmatch(
            r"\[(\d)\] no newline at the end from (\d)()", line)
        assert m and m[1] == m[2] and set(m[3]) <= {m[1]}, line[:80]
    err = proc.stderr.splitlines()
    assert len(err) == 4 * 100
    assert all(re.fullmatch(r"\[(\d)\] err \1 \d+ \1{3000} end", line) for line in err)


def test_ranks_find_each_other_with_the_communicator() -> None:
    proc = ringlet_run("-n", "3", "comm_ring.py")
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == [
        "[0] rank 0 of 3 got 3", "[1] rank 1 of 3 got 1", "[2] rank 2 of 3 got 2"]


# -- ringlet run: failures ---------------------------------------------------------------------


def test_survivors_detect_a_dead_peer_with_the_communicator() -> None:
    proc = ringlet_run("-n", "3", "comm_ring.py", "--crash")
    assert proc.returncode == 4
    assert summary(proc) == ("ringlet run: rank 1 failed first (exit code 4); "
                             "ranks 0, 2 then exited on their own (exit code 1)")
    # each survivor names rank 1, itself or quoting the other survivor's notice ("rank 2:")
    assert len(re.findall(r"^\[[02]\] ringlet.errors.PeerError: (rank [02]: )?rank 1 ",
                          proc.stderr, re.MULTILINE)) == 2


def test_a_peer_error_does_not_take_the_blame_from_the_rank_that_ended() -> None:
    """Rank 1 calls sys.exit(3) after init: its peers report a PeerError (it closed its
    communicator) before its own exit handlers are done, and even exit first; the
    summary and the exit status are still rank 1's (they were rank 0's PeerError)."""
    proc = ringlet_run("-n", "3", "comm_ring.py", "--exit")
    assert proc.returncode == 3, proc.stderr
    assert summary(proc) == ("ringlet run: rank 1 failed first (exit code 3); "
                             "ranks 0, 2 then exited on their own (exit code 1)")
    # each survivor names rank 1, itself or quoting the other survivor's notice ("rank 2:")
    assert len(re.findall(r"^\[[02]\] ringlet.errors.PeerError: (rank [02]: )?rank 1 ",
                          proc.stderr, re.MULTILINE)) == 2


def test_hanging_survivors_are_stopped_after_the_grace_period() -> None:
    start = time.monotonic()
    proc = ringlet_run("-n", "4", "--grace", "0.3", "behave.py", "--fail", "2",
                       "--others", "hang")
    assert time.monotonic() - start < 10  # not the survivors' 60 s
    assert proc.returncode == 1
    assert summary(proc) == ("ringlet run: rank 2 failed first (exit code 1); ranks 0, 1, 3 "
                             "were stopped with SIGTERM after the 0.3 s grace period")
    assert "[2] rank 2 fails" in proc.stderr


def test_survivors_that_exit_on_their_own_are_reported_as_such() -> None:
    proc = ringlet_run("-n", "4", "behave.py", "--fail", "1", "--code", "6",
                       "--others", "notice")
    assert proc.returncode == 6
    assert summary(proc) == ("ringlet run: rank 1 failed first (exit code 6); "
                             "ranks 0, 2, 3 then exited on their own (exit code 3)")


@pytest.mark.waits
def test_mixed_endings_are_grouped() -> None:
    proc = ringlet_run("-n", "5", "--grace", "1", "behave.py", "--fail", "4",
                       "--after", "0.2", "--others", "finish-or-hang")
    assert proc.returncode == 1
    assert summary(proc) == (
        "ringlet run: rank 4 failed first (exit code 1); ranks 0, 2 finished (exit code 0); "
        "ranks 1, 3 were stopped with SIGTERM after the 1 s grace period")


@pytest.mark.waits
def test_a_rank_killed_by_a_signal() -> None:
    proc = ringlet_run("-n", "3", "behave.py", "--fail", "1", "--kill-self",
                       "--others", "notice")
    assert proc.returncode == 128 + signal.SIGKILL
    assert summary(proc) == ("ringlet run: rank 1 failed first (killed by SIGKILL); "
                             "ranks 0, 2 then exited on their own (exit code 3)")


@pytest.mark.waits
def test_survivors_that_ignore_sigterm_are_killed() -> None:
    # the stubborn rank 0 starts first, and rank 1 fails only after 0.3 s, so that rank 0
    # ignores SIGTERM by the time it comes
    proc = ringlet_run("-n", "2", "--grace", "0.2", "behave.py", "--fail", "1",
                       "--after", "0.3", "--others", "stubborn")
    assert proc.returncode == 1
    assert summary(proc) == ("ringlet run: rank 1 failed first (exit code 1); rank 0 was killed "
                             "with SIGKILL, 1 s after SIGTERM did not stop its process")


def test_leftover_shared_memory_of_the_job_is_removed() -> None:
    proc = ringlet_run("-n", "2", "behave.py", "--fail", "1", "--shm", "--code", "9")
    assert proc.returncode == 9
    paths = [line.split()[1] for line in proc.stdout.splitlines() if "/dev/shm/" in line]
    assert len(paths) == 1 and paths[0].startswith("/dev/shm/ringlet-")
    assert not os.path.exists(paths[0])


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_to_the_launcher_are_forwarded(sig: signal.Signals) -> None:
    launcher = subprocess.Popen([*CLI, "run", "-n", "3", "wait_signal.py"], cwd=SCRIPTS,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    ready = [launcher.stdout.readline() for _ in range(3)]
    assert all(line.endswith("ready\n") for line in ready), ready
    launcher.send_signal(sig)
    out, err = launcher.communicate(timeout=10)
    assert launcher.returncode == 128 + sig
    assert sorted(out.splitlines()) == [f"[{r}] rank {r} got {sig.name}" for r in range(3)]
    assert f"ringlet run: interrupted by {sig.name}, forwarded to the ranks; " in err
    assert f"ranks 1, 2 ended on the forwarded {sig.name} (exit code 5)" in err


@pytest.mark.parametrize("program, why", [
    (["syntax_error.py"], "SyntaxError: invalid syntax"),
    (["-m", "no_such_module_here"], "No module named no_such_module_here")])
def test_the_summary_quotes_errors_printed_without_a_traceback(
        program: list[str], why: str, tmp_path: Path) -> None:
    """A script that does not compile, a module that is not there: Python says so
    without a "Traceback" line, and the summary still quotes it."""
    if program[0].endswith(".py"):
        (tmp_path / program[0]).write_text("def f(:\n")
        program = [str(tmp_path / program[0])]
    proc = ringlet_run("-n", "2", *program)
    assert proc.returncode == 1, proc.stderr
    assert re.match(rf"ringlet run: rank [01] failed first \(exit code 1: {why}",
                    summary(proc)), proc.stderr


@pytest.mark.parametrize("init", [True, False])
def test_the_summary_marks_a_long_error_it_cuts(init: bool, tmp_path: Path) -> None:
    """The summary quotes at most 400 characters of the error (reported through init's
    pipe, or read from the traceback before init): a cut ends with '...', where it ended
    mid-word and read as if the message did ('... it has not sent (not)')."""
    words = " ".join(f"w{i:03d}" for i in range(150))
    (tmp_path / "long.py").write_text(
        ("import ringlet\nringlet.init()\n" if init else "") + f"raise ValueError({words!r})\n")
    proc = ringlet_run("-n", "1", str(tmp_path / "long.py"))
    assert proc.returncode == 1, proc.stderr
    why = re.fullmatch(r"ringlet run: rank 0 failed first \(exit code 1: (.*)\)",
                       summary(proc))
    assert why, proc.stderr
    assert len(why[1]) <= 400 and why[1].endswith("...")
    assert f"ValueError: {words}".startswith(why[1][:-3])


def test_the_summary_does_not_quote_a_fault_handlers_stack(tmp_path: Path) -> None:
    """faulthandler's dump (File lines without a Traceback line) is not an exception."""
    (tmp_path / "crash.py").write_text(
        "import faulthandler, os, signal\nimport numpy\nfaulthandler.enable()\n"
        "os.kill(os.getpid(), signal.SIGSEGV)\n")
    proc = ringlet_run("-n", "1", str(tmp_path / "crash.py"))
    assert "Fatal Python error" in proc.stderr, proc.stderr
    assert re.match(r"ringlet run: rank 0 failed first \(killed by SIGSEGV\)", summary(proc)), \
        proc.stderr


FORKS_A_JOB = """
import time

import numpy as np
import ringlet

def inner(comm):
    return comm.all_reduce(np.ones(2))[0]

comm = ringlet.init()
comm.barrier()
if comm.rank == 0:   # the forked ranks inherit this process's communicator: not theirs to close
    assert ringlet.spawn(inner, 2, settings=ringlet.Settings(start_method="fork")) == [2.0, 2.0]
    time.sleep(0.5)   # rank 1, waiting in the barrier, looks at rank 0's state meanwhile
comm.barrier()
print("barrier after the spawn: ok", flush=True)
"""


def test_ranks_forked_by_spawn_leave_their_parents_communicators_open(tmp_path: Path) -> None:
    """A rank of a job that spawns a job of its own by fork: the spawned ranks close only
    the communicators they made (they marked their parent's closed, and its peers raised
    "rank 0 closed the communicator" at the next call)."""
    (tmp_path / "forks.py").write_text(FORKS_A_JOB)
    proc = ringlet_run("-n", "2", str(tmp_path / "forks.py"), timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("barrier after the spawn: ok") == 2, proc.stdout


def test_ranks_interrupted_by_the_forwarded_ctrl_c_did_not_fail_first() -> None:
    """Each rank reports the KeyboardInterrupt the forwarded SIGINT raised, before it
    exits: the launcher's own doing, not a rank's failure (it once said "rank 0 failed
    first (KeyboardInterrupt)" when a report came before the exit)."""
    launcher = subprocess.Popen([*CLI, "run", "-n", "3", "interrupted.py"], cwd=SCRIPTS,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    ready = [launcher.stdout.readline() for _ in range(3)]
    assert all(line.endswith("ready\n") for line in ready), ready
    launcher.send_signal(signal.SIGINT)
    _, err = launcher.communicate(timeout=20)
    assert launcher.returncode == 130, err
    assert summary(subprocess.CompletedProcess([], 130, "", err)) == (
        "ringlet run: interrupted by SIGINT, forwarded to the ranks; ranks 0-2 ended on the "
        "forwarded SIGINT"), err


@pytest.mark.parametrize("argv, message", [
    (["-n", "0", "rank_env.py"], r"-n must be a whole number of ranks >= 1, got 0"),
    (["-n", "2", "missing.py"], r"no such script: 'missing.py' \(to run a module, use -m\)"),
    (["-n", "2"], r"give a script to run: ringlet run -n 4 script.py"),
    (["-n", "2", "-m"], r"give a module name after -m"),
    (["-n", "2", "--grace", "-1", "rank_env.py"], r"--grace must be >= 0, got -1.0"),
    # an OverflowError in the launcher's wait once a rank failed, or never stopping them
    (["-n", "2", "--grace", "inf", "rank_env.py"], r"--grace must be a finite number"),
    (["-n", "2", "--grace", "nan", "rank_env.py"], r"--grace must be a finite number"),
    (["-n", "2", "--grace", "1e300", "rank_env.py"], r"--grace must be at most 604,800 s"),
    # a traceback (FileExistsError, FileNotFoundError) before
    (["--trace", "rank_env.py", "-n", "2", "rank_env.py"],
     r"--trace .*rank_env.py: is a file, not a directory"),
    (["--trace", "/proc/nope", "-n", "2", "rank_env.py"],
     r"--trace /proc/nope: cannot make the directory"),
])
def test_bad_usage(argv: list[str], message: str) -> None:
    proc = ringlet_run(*argv)
    assert proc.returncode == 2
    assert re.search(f"^ringlet run: {message}", proc.stderr), proc.stderr
    assert proc.stdout == ""


def test_unknown_ringlet_variable_is_rejected_at_launch() -> None:
    proc = ringlet_run("-n", "2", "rank_env.py", env={**os.environ, "RINGLET_TIMOUT": "5"})
    assert proc.returncode == 2
    assert "ringlet run: unknown setting RINGLET_TIMOUT='5'; known: " in proc.stderr
    assert "RINGLET_TIMEOUT" in proc.stderr and proc.stdout == ""


# -- the report, without processes ---------------------------------------------------------------


@pytest.mark.parametrize("ranks, text", [
    ([3], "rank 3"), ([0, 1], "ranks 0, 1"), ([0, 1, 2, 3, 5], "ranks 0-3, 5"),
    ([7, 1, 2, 3, 9, 10], "ranks 1-3, 7, 9, 10"),
])
def test_rank_lists(ranks: list[int], text: str) -> None:
    assert _ranks(ranks) == text


def test_outcome_exit_codes_and_summary() -> None:
    ok = _Outcome(2, {0: _Ending(0), 1: _Ending(0)})
    assert ok.ok and ok.exit_code == 0
    assert ok.summary() == "ranks 0, 1 finished (exit code 0)"
    failed = _Outcome(3, {0: _Ending(-signal.SIGSEGV), 1: _Ending(2), 2: _Ending(0)},
                      first_failed=0)
    assert not failed.ok and failed.exit_code == 128 + signal.SIGSEGV
    assert failed.summary() == ("rank 0 failed first (killed by SIGSEGV); rank 1 then exited "
                                "on its own (exit code 2); rank 2 finished (exit code 0)")
    both = _Outcome(2, {0: _Ending(1), 1: _Ending(-2, "ended on the forwarded SIGINT", 2)},
                    first_failed=0, interrupted=signal.SIGINT)
    assert both.exit_code == 1  # the failure came first
    assert both.summary() == ("rank 0 failed first (exit code 1); interrupted by SIGINT, "
                              "forwarded to the ranks; rank 1 ended on the forwarded SIGINT")
    timed = _Outcome(1, {0: _Ending(-15, "{was} stopped at the timeout", 15)}, timed_out=(0,),
                     timeout=2.5)
    assert timed.exit_code == 124
    assert timed.summary() == ("timed out after 2.5 s with rank 0 not finished; "
                               "rank 0 was stopped at the timeout")


def test_summary_puts_a_rank_that_left_quietly_first() -> None:
    """A rank that exited 0 without closing ringlet (os._exit) while its peers were in a
    collective: the peers' PeerError says it died; the summary says what it did first,
    and that the others failed after (it said rank 0 "failed first", rank 2 "finished")."""
    why = "ringlet.errors.PeerError: rank 2 (pid 41) died; all_reduce #9 cannot complete"
    pids = {0: 40, 1: 43, 2: 41, 3: 42}
    out = _Outcome(4, {0: _Ending(1), 1: _Ending(1), 2: _Ending(0), 3: _Ending(0)},
                   first_failed=0, reasons={0: why, 1: why}, pids=pids)
    assert out.exit_code == 1
    assert out.summary() == (
        "rank 2 exited with code 0 without closing ringlet (os._exit, or no exit handlers "
        f"ran), so its peers took it for dead; rank 0 then failed (exit code 1: {why}); "
        "rank 1 then exited on its own (exit code 1); rank 3 finished (exit code 0)")
    # in a split the dead peer's rank is the split's: the pid says which rank it was
    split = _Outcome(4, {0: _Ending(0), 1: _Ending(0), 2: _Ending(1), 3: _Ending(0)},
                     first_failed=2, pids=pids, reasons={
                         2: "PeerError: rank 1 (pid 42) died; all_reduce #5 cannot complete"})
    assert split.summary().startswith("rank 3 exited with code 0 without closing"), \
        split.summary()


# -- spawn ---------------------------------------------------------------------------------------

FORK = Settings(start_method="fork")


def fake_spawn(fn: Any, nranks: int, *args: Any, settings: Settings = FORK,
               timeout: float | None = None) -> list[Any]:
    return _spawn(fn, nranks, args, settings=settings, timeout=timeout,
                  init=spawnfns.fake_init)


@pytest.mark.parametrize("method", ["spawn", "fork"])
def test_spawn_returns_results_in_rank_order(method: str) -> None:
    results = fake_spawn(spawnfns.whoami, 3, 10, settings=Settings(start_method=method))
    assert [r[:3] for r in results] == [(0, 3, 0), (1, 3, 10), (2, 3, 20)]
    assert len({r[3] for r in results}) == 1 and HEX32.match(results[0][3])


def test_spawn_at_eight_ranks() -> None:
    assert [r[2] for r in fake_spawn(spawnfns.whoami, 8, 1)] == list(range(8))


def test_spawn_propagates_exceptions() -> None:
    with pytest.raises(SpawnError, match=r"rank 1: ArgumentError: root 7 is out of range "
                                         r"for a communicator of size 3") as info:
        # ranks 0 and 2 fail 2 s after they start: rank 1, started by then on a busy
        # machine too, fails first (with 0.2 s, rank 0 did once, beside another test)
        fake_spawn(spawnfns.bad_root_on_rank_1, 3, 2.0,
                   settings=Settings(start_method="spawn", grace=6))
    err = info.value
    assert str(err).startswith("ringlet.spawn: 3 of 3 ranks failed, rank 1 first:\n"
                               "  rank 1: ArgumentError: root 7")
    assert err.failures == {
        0: "TimeoutError: rank 0: peer 1 did not arrive",
        1: "ArgumentError: root 7 is out of range for a communicator of size 3",
        2: "TimeoutError: rank 2: peer 1 did not arrive"}
    assert set(err.details) == {0, 1, 2}
    assert "Traceback (most recent call last)" in err.details[1]
    assert "in bad_root_on_rank_1" in err.details[1]
    assert "traceback of rank 1" in str(err) and "in bad_root_on_rank_1" in str(err)


def test_spawn_stops_hanging_ranks_after_the_grace_period() -> None:
    start = time.monotonic()
    with pytest.raises(SpawnError, match=r"rank 2: ValueError: boom") as info:
        fake_spawn(spawnfns.fail_one_hang_others, 3, settings=FORK.replace(grace=0.3))
    assert time.monotonic() - start < 10
    stopped = "was stopped with SIGTERM after the 0.3 s grace period, without reporting a result"
    assert info.value.failures == {0: stopped, 1: stopped, 2: "ValueError: boom"}


def test_spawn_reports_ranks_that_die_without_reporting() -> None:
    with pytest.raises(SpawnError, match=r"rank 1: exit code 7, without reporting a result") \
            as info:
        fake_spawn(spawnfns.exit_without_reporting, 4)
    assert info.value.failures == {1: "exit code 7, without reporting a result",
                                   2: "killed by SIGKILL, without reporting a result",
                                   3: "exit code 0, without reporting a result"}
    assert info.value.details == {}


@pytest.mark.waits
def test_spawn_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(SpawnError, match=r"timed out after 1.5 s; ranks 1, 3 had not finished"
                       ) as info:
        fake_spawn(spawnfns.sleep_on_odd_ranks, 4, 60.0, timeout=1.5)
    assert time.monotonic() - start < 10
    assert sorted(info.value.failures) == [1, 3]
    assert info.value.failures[1] == ("was stopped with SIGTERM at the 1.5 s timeout, "
                                      "without reporting a result")


def test_spawn_within_its_timeout() -> None:
    assert fake_spawn(spawnfns.sleep_on_odd_ranks, 2, 0.1, timeout=30) == [0, 1]


def test_spawn_results_that_do_not_pickle() -> None:
    with pytest.raises(SpawnError, match=r"rank 0: \w+Error: its result could not be pickled"):
        fake_spawn(spawnfns.unpicklable_result, 2)


def test_spawn_large_results() -> None:
    n = 4 << 20  # far beyond a pipe's buffer: the parent reads while the ranks write
    assert fake_spawn(spawnfns.big_result, 3, n) == [bytes([r]) * n for r in range(3)]


def test_spawn_removes_the_jobs_shared_memory() -> None:
    before = shm_files()
    with pytest.raises(SpawnError, match=r"rank 0: RuntimeError: rank 0 crashed"):
        fake_spawn(spawnfns.leave_a_segment, 2)
    assert not shm_left(before)


def test_spawn_reports_a_failed_init_and_a_failed_close() -> None:
    with pytest.raises(SpawnError, match=r"rank 0: OSError: ringlet.init failed: no shared "
                                         r"memory for rank 0"):
        _spawn(spawnfns.whoami, 2, (1,), settings=FORK, timeout=None,
               init=spawnfns.broken_init)
    with pytest.raises(SpawnError) as info:
        fake_spawn(spawnfns.fail_in_close, 2)
    assert info.value.failures == {0: "RuntimeError: comm.close() failed: close went wrong"}


@pytest.mark.parametrize("call, message", [
    (lambda: fake_spawn(spawnfns.whoami, 0, 1), r"nranks must be a whole number of ranks "
                                                r">= 1, got 0"),
    (lambda: fake_spawn(spawnfns.whoami, True, 1), r"got True"),
    (lambda: fake_spawn(spawnfns.whoami, 2, 1, timeout=0), r"timeout must be > 0 seconds"),
    (lambda: fake_spawn(lambda comm: 1, 2, settings=Settings(start_method="spawn")),
     r"fn and its arguments must be picklable .* start method 'spawn'.*module level"),
    (lambda: fake_spawn(spawnfns.whoami, 2, threading.Lock(),
                        settings=Settings(start_method="forkserver")),
     r"must be picklable .* start method 'forkserver' \(TypeError: cannot pickle"),
])
def test_spawn_argument_errors(call: Any, message: str) -> None:
    with pytest.raises(ArgumentError, match=message):
        call()


# -- spawn with the real communicator ------------------------------------------------------------


def test_spawn_with_the_communicator() -> None:
    assert spawn(spawnfns.pass_around, 3) == [3.0, 1.0, 2.0]


def test_spawn_propagates_a_communicator_error() -> None:
    with pytest.raises(SpawnError, match=r"rank 0: ArgumentError: dst 7 "):
        spawn(spawnfns.send_to_a_missing_rank, 2, settings=Settings(timeout=20, grace=1))
