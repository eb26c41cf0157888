"""Start-up (issue 8): never wrong, never hung, nothing left behind.

Jobs of 2-3 ranks run ``tests/scripts/startup_job.py``, either under the real
launchers (torchrun, mpiexec) or started here with torchrun's variables (so
that every rank's report can be read even when ranks fail; their parent, this
process, is their "launcher").  Every subprocess has a timeout, and start-up
deadlines are a few seconds.  A file is "the job's" if its header holds the
pid of one of the job's ranks (segments do) or its name holds the job id.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jobs import clean_env

from ringlet.config import Settings
from ringlet.env import detect
from ringlet.errors import CommTimeoutError, ConfigError
from ringlet.startup import _held_signals, rendezvous_name
from ringlet.transport.shm import (
    MAGIC,
    SHM_DIR,
    STALE_AFTER_S,
    ShmTransport,
    cleanup,
    create_region,
    open_region,
    sweep_stale,
)

SCRIPT = Path(__file__).parent / "scripts" / "startup_job.py"
BIN = Path(sys.executable).parent
TORCHRUN = shutil.which("torchrun", path=str(BIN)) or shutil.which("torchrun")
MPIEXEC = shutil.which("mpiexec", path=str(BIN)) or shutil.which("mpiexec")
LIMIT = 90   # seconds any one job may take, whatever happens

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make another user's file")


# --- helpers -----------------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    return clean_env(("STARTUP_",), **{"RINGLET_INIT_TIMEOUT": "4", **extra})


def _torch_vars(rank: int, size: int, run_id: str) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(size), "TORCHELASTIC_RUN_ID": run_id,
            "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}


def _reports(text: str) -> list[dict[str, Any]]:
    """Every ``{"rank": ...}`` object in ``text`` (the launchers may join ranks' lines)."""
    found, dec, at = [], json.JSONDecoder(), text.find('{"rank"')
    while at >= 0:
        obj, end = dec.raw_decode(text, at)
        found.append(obj)
        at = text.find('{"rank"', end)
    return found


def _job_files(pids: set[int], jobs: set[str]) -> list[str]:
    """The files in SHM_DIR that belong to the job: a rank's pid in the header, or its id."""
    found = []
    for name in os.listdir(SHM_DIR):
        if not name.startswith("ringlet-"):
            continue
        if any(j in name for j in jobs):
            found.append(name)
            continue
        try:
            with open(os.path.join(SHM_DIR, name), "rb") as f:
                head = f.read(16)
        except OSError:
            continue
        if len(head) == 16 and int.from_bytes(head[8:16], "little") in pids:
            found.append(name)
    return found


def _direct(size: int, **extra: str) -> tuple[list[dict[str, Any]], float]:
    """Run a job of ``size`` ranks started here (torchrun's variables, a fresh run id);
    return every report line and the seconds it took, and check it left nothing."""
    run_id = secrets.token_hex(8)
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, str(SCRIPT)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=_env(**_torch_vars(r, size, run_id), **extra))
             for r in range(size)]
    outs = [p.communicate(timeout=LIMIT)[0] for p in procs]
    took = time.monotonic() - start
    reports = [r for out in outs for r in _reports(out)]
    pids = {r["pid"] for r in reports if "pid" in r}
    jobs = {r["job_id"] for r in reports if "job_id" in r}
    assert _job_files(pids, jobs) == []
    return reports, took


def _errors(reports: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["rank"]: r for r in reports if "error" in r}


def _launcher_cmd(launcher: str, size: int) -> list[str]:
    if launcher == "torchrun":
        if TORCHRUN is None:
            pytest.skip("torchrun is not installed")
        return [TORCHRUN, "--standalone", "--nproc-per-node", str(size), str(SCRIPT)]
    if MPIEXEC is None:
        pytest.skip("mpiexec is not installed")
    return [MPIEXEC, "-n", str(size), sys.executable, str(SCRIPT)]


@pytest.fixture
def shm_dir() -> Iterator[None]:
    if not os.path.isdir(SHM_DIR):
        pytest.skip(f"{SHM_DIR} does not exist")
    yield


# --- a normal start under each launcher ---------------------------------------------------


@pytest.mark.parametrize("launcher", ["torchrun", "mpiexec"])
def test_launcher_starts_a_job_and_leaves_nothing(launcher: str, shm_dir: None) -> None:
    proc = subprocess.run(_launcher_cmd(launcher, 3), capture_output=True, text=True,
                          timeout=LIMIT, env=_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reports = _reports(proc.stdout)
    jobs = {r["job_id"] for r in reports if "job_id" in r}
    assert len(jobs) == 1 and len(jobs.pop()) == 32, reports
    assert sorted(r["sum"] for r in reports if "sum" in r) == [6.0, 6.0, 6.0]
    pids = {r["pid"] for r in reports if "pid" in r}
    assert _job_files(pids, {r["job_id"] for r in reports if "job_id" in r}) == []


# --- 3: a rank that never calls init -------------------------------------------------------


@pytest.mark.waits
def test_missing_rank_is_named_within_the_init_timeout(shm_dir: None) -> None:
    reports, took = _direct(3, STARTUP_SKIP="2", RINGLET_INIT_TIMEOUT="2")
    errs = _errors(reports)
    assert sorted(errs) == [0, 1], reports
    for e in errs.values():
        assert e["error"] == "CommTimeoutError"
        assert "rank 2 of 3 did not call ringlet.init() (ranks 0, 1 did)" in e["message"], e
        assert "RINGLET_INIT_TIMEOUT" in e["message"]
        assert e["after"] < 6, e
    assert took < 20


def test_rank_on_another_node_is_a_hint_where_the_others_time_out(shm_dir: None) -> None:
    """A rank given its own RINGLET_NODE starts over the engine and never comes to the
    node's rendezvous: the others' timeout said it "did not call ringlet.init()" and
    told to check only that it runs, never the setting that kept it away."""
    run_id = secrets.token_hex(8)
    procs = [subprocess.Popen([sys.executable, str(SCRIPT)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=_env(**_torch_vars(r, 3, run_id), RINGLET_INIT_TIMEOUT="2",
                                       **({"RINGLET_NODE": "elsewhere"} if r == 2 else {})))
             for r in range(3)]
    try:
        outs = [p.communicate(timeout=LIMIT)[0] for p in procs[:2]]
    finally:
        for p in procs:
            p.kill()
            p.communicate()
    errs = _errors([r for out in outs for r in _reports(out)])
    assert sorted(errs) == [0, 1], outs
    for e in errs.values():
        assert "rank 2 of 3 did not call ringlet.init()" in e["message"], e
        assert "RINGLET_NODE and RINGLET_ENGINE are the same on every rank" in e["message"], e


@pytest.mark.waits
def test_missing_rank_0_is_named(shm_dir: None) -> None:
    reports, _ = _direct(2, STARTUP_SKIP="0", RINGLET_INIT_TIMEOUT="1.5")
    err = _errors(reports)[1]
    assert err["error"] == "CommTimeoutError"
    assert "found no rank 0 at the rendezvous" in err["message"], err
    assert err["after"] < 5


def test_init_timeout_is_a_setting() -> None:
    assert Settings().init_timeout == 60.0
    assert Settings.from_env({"RINGLET_INIT_TIMEOUT": "2.5"}).init_timeout == 2.5
    with pytest.raises(ConfigError, match=r"init_timeout must be > 0 seconds, got 0.0"):
        Settings.from_env({"RINGLET_INIT_TIMEOUT": "0"})


# --- 4: ranks with different shared-memory settings ---------------------------------------


def test_different_shm_settings_fail_every_rank_at_once(shm_dir: None) -> None:
    reports, _ = _direct(3, STARTUP_SETTINGS="2:shm_slots=8,1:shm_slot_bytes=8192",
                         RINGLET_INIT_TIMEOUT="20")
    errs = _errors(reports)
    assert sorted(errs) == [0, 1, 2], reports
    for e in errs.values():
        assert e["error"] == "ConfigError"
        msg = e["message"]
        assert "ranks must use the same shared-memory settings" in msg
        assert "RINGLET_SHM_SLOTS: rank 0 has 4; rank 2 has 8" in msg, msg
        assert "RINGLET_SHM_SLOT_BYTES: rank 0 has 262144; rank 1 has 8192" in msg, msg
        assert e["after"] < 10, e   # at once, not at the 20 s deadline


# --- 5: a peer that dies during start-up ----------------------------------------------------


def _kill_rank(size: int, victim: int, wait: float, **extra: str) -> list[dict[str, Any]]:
    """Start ``size`` ranks here, SIGKILL rank ``victim`` ``wait`` s after it reported."""
    run_id = secrets.token_hex(8)
    procs = [subprocess.Popen([sys.executable, str(SCRIPT)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=_env(**_torch_vars(r, size, run_id), **extra))
             for r in range(size)]
    out = procs[victim].stdout
    assert out is not None
    first = json.loads(out.readline())
    time.sleep(wait)
    procs[victim].kill()
    outs = [p.communicate(timeout=LIMIT)[0] for p in procs]
    reports = [first] + [r for out in outs for r in _reports(out)]
    pids = {r["pid"] for r in reports if "pid" in r}
    assert _job_files(pids, set()) == []
    return reports


@pytest.mark.waits
def test_peer_killed_at_the_rendezvous_is_named(shm_dir: None) -> None:
    # rank 2 is late, so ranks 0 and 1 wait at the rendezvous when rank 1 dies
    reports = _kill_rank(3, 1, 1.0, STARTUP_SLEEP="2:2.5", RINGLET_INIT_TIMEOUT="5")
    pid1 = next(r["pid"] for r in reports if r["rank"] == 1 and "pid" in r)
    err = _errors(reports)[0]
    assert err["error"] == "PeerError"
    assert f"rank 1 (pid {pid1}) ended during start-up" in err["message"], err
    assert err["after"] < 5, err


@pytest.mark.waits
def test_peer_killed_in_the_segment_window_is_named_and_its_segment_removed(
        shm_dir: None) -> None:
    # rank 1 stops right after creating its segment; SIGKILL cannot clean it up, rank 0 does
    reports = _kill_rank(2, 1, 1.5, STARTUP_STALL="1", RINGLET_INIT_TIMEOUT="10")
    pid1 = next(r["pid"] for r in reports if r["rank"] == 1 and "pid" in r)
    err = _errors(reports)[0]
    assert err["error"] == "PeerError"
    assert f"rank 1 (pid {pid1}) died" in err["message"], err
    assert err["after"] < 6, err


@pytest.mark.waits
@pytest.mark.parametrize("where", ["split", "split-reversed", "empty"])
def test_peer_killed_in_split_or_empty_fails_the_others_at_once_and_leaves_nothing(
        where: str, shm_dir: None) -> None:
    # rank 1 dies by SIGKILL before making its sub-communicator's segment (split: rank 0
    # waited for it until the deadline), or right after making its shared buffer's file
    # (empty: the file stayed in SHM_DIR); no launcher cleans up after these ranks
    run_id = secrets.token_hex(8)
    script = Path(__file__).parent / "scripts" / "kill_in_window.py"
    procs = [subprocess.Popen([sys.executable, str(script), where], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=_env(RINGLET_TIMEOUT="10", **_torch_vars(r, 2, run_id)))
             for r in range(2)]
    outs = [p.communicate(timeout=LIMIT)[0] for p in procs]
    reports = [r for out in outs for r in _reports(out)]
    pid1 = next(r["pid"] for r in reports if r["rank"] == 1 and "pid" in r)
    err = _errors(reports)[0]
    assert err["error"] == "PeerError", err
    # named as comm.split's caller numbers it (rank 1 is the reversed group's rank 0)
    assert f"rank 1 (pid {pid1}) died" in err["message"], err
    if where.startswith("split"):
        assert "while its split group was built" in err["message"], err
    assert err["after"] < 5, err
    jobs = {r["job_id"] for r in reports if "job_id" in r}
    left = _job_files({r["pid"] for r in reports if "pid" in r}, jobs)
    for job in jobs:
        cleanup(job)   # whatever the outcome, the test leaves nothing
    assert len(jobs) == 1
    assert left == []


# --- 1: rendezvous and segments of another user are never trusted ---------------------------


def _squat(name: str, uid: int) -> tuple[int, int]:
    """A child process of user ``uid`` listening on the abstract address ``name``; returns
    its pid and the write end of a pipe whose closing ends it."""
    r, w = os.pipe()
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(w)
            os.setgid(uid)
            os.setuid(uid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind("\0" + name)
            s.listen(8)
            os.write(ready_w, b"1")
            os.read(r, 1)
        finally:
            os._exit(0)
    os.close(r)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    return pid, w


@needs_root
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="abstract sockets are Linux's")
def test_rendezvous_held_by_another_user_is_refused(shm_dir: None) -> None:
    run_id = secrets.token_hex(8)
    key = detect(_torch_vars(0, 2, run_id), ppid=os.getpid()).rendezvous_key
    pid, w = _squat(rendezvous_name(key), 65534)
    try:
        procs = [subprocess.Popen([sys.executable, str(SCRIPT)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True,
                                  env=_env(**_torch_vars(r, 2, run_id),
                                           RINGLET_INIT_TIMEOUT="20"))
                 for r in range(2)]
        outs = [p.communicate(timeout=LIMIT)[0] for p in procs]
    finally:
        os.close(w)
        os.waitpid(pid, 0)
    reports = [r for out in outs for r in _reports(out)]
    errs = _errors(reports)
    assert sorted(errs) == [0, 1], reports
    for e in errs.values():
        assert e["error"] == "ConfigError", e
        assert f"held by another user's process (pid {pid}, uid 65534" in e["message"], e
        assert "will not trust it" in e["message"]
        assert e["after"] < 5, e   # at once
    assert not any("job_id" in r for r in reports)
    assert _job_files({r["pid"] for r in reports if "pid" in r}, set()) == []


def _plant(path: str, *, uid: int | None = None, mode: int = 0o600, pid: int | None = None,
           magic: int = MAGIC, age: float = 0.0) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, 4096)
        os.pwrite(fd, magic.to_bytes(8, "little")
                  + (os.getpid() if pid is None else pid).to_bytes(8, "little"), 0)
    finally:
        os.close(fd)
    os.chmod(path, mode)
    if uid is not None:
        os.chown(path, uid, uid)
    if age:
        then = time.time() - age
        os.utime(path, (then, then))


def _ended_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_sweep_removes_only_old_segments_whose_creator_ended(tmp_path: Path) -> None:
    # a job whose ranks were all SIGKILLed inside start-up leaves its segments: a later
    # job removes them, and nothing else (a live creator's, a young one, another
    # user's, one without a segment header, a shared buffer's, another program's)
    d = str(tmp_path)
    dead = _ended_pid()
    old = 2 * 600.0
    cases = {
        "ringlet-aa-w-0": dict(pid=dead, age=old),                 # removed
        "ringlet-aa-w-1": dict(pid=dead, age=old),                 # removed
        "ringlet-bb-w-0": dict(age=old),                           # its creator (us) runs
        "ringlet-cc-w-0": dict(pid=dead, age=10.0),                # young: maybe in start-up
        "ringlet-dd-buf0-0": dict(pid=dead, magic=0, age=old),     # no header: a buffer
        "other-w-0": dict(pid=dead, age=old),                      # not ringlet's
    }
    for name, how in cases.items():
        _plant(os.path.join(d, name), **how)  # type: ignore[arg-type]
    if os.geteuid() == 0:   # another user's: never
        _plant(os.path.join(d, "ringlet-ee-w-0"), uid=65534, pid=dead, age=old)
    removed = sweep_stale(shm_dir=d)
    assert sorted(removed) == [os.path.join(d, "ringlet-aa-w-0"),
                               os.path.join(d, "ringlet-aa-w-1")]
    left = set(os.listdir(d))
    assert left == set(cases) - {"ringlet-aa-w-0", "ringlet-aa-w-1"} | \
        ({"ringlet-ee-w-0"} if os.geteuid() == 0 else set())
    assert sweep_stale(shm_dir=d) == []   # nothing more


def test_a_job_sweeps_what_a_killed_start_up_left(shm_dir: None) -> None:
    # ringlet.init (here a 1-rank job) is what runs the sweep
    path = os.path.join(SHM_DIR, f"ringlet-{secrets.token_hex(16)}-w-0")
    _plant(path, pid=_ended_pid(), age=2 * 600.0)
    try:
        proc = subprocess.run([sys.executable, "-c", "import ringlet; ringlet.init().close()"],
                              capture_output=True, text=True, timeout=LIMIT,
                              env=_env(RINGLET_DEBUG="INFO"))
        assert proc.returncode == 0, proc.stderr
        assert not os.path.exists(path)
        assert f"removed {path}, a segment left by a job whose ranks were all killed" in \
            proc.stderr, proc.stderr
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


@pytest.mark.parametrize("how", [
    pytest.param({"uid": 65534}, marks=needs_root, id="other-owner"),
    pytest.param({"mode": 0o644}, id="group-readable"),
    pytest.param({"mode": 0o606}, id="other-writable"),
    pytest.param("symlink", id="symlink"),
])
def test_peer_segment_not_ours_is_refused(how: Any, shm_dir: None) -> None:
    prefix = f"ringlet-{secrets.token_hex(16)}-w"
    t = ShmTransport(0, 2, prefix, Settings())
    theirs = t.path(1)
    if how == "symlink":
        os.symlink(os.path.join(SHM_DIR, prefix + "-target"), theirs)
    else:
        _plant(theirs, **how)
    try:
        start = time.monotonic()
        with pytest.raises(ConfigError) as err:
            t.connect(5.0)
        assert time.monotonic() - start < 2
        msg = str(err.value)
        assert theirs in msg and "rank 1's shared-memory segment" in msg
        if how == "symlink":
            assert "cannot be opened" in msg
        else:
            uid = how.get("uid", os.geteuid())
            assert f"belongs to uid {uid}, mode {how.get('mode', 0o600):04o}" in msg, msg
            assert "It is not used; remove it" in msg
        assert not os.path.exists(t.path(0))   # rank 0's own segment is gone
    finally:
        os.unlink(theirs)
        t.close()


@pytest.mark.parametrize("size", [2, 4])
def test_peer_segments_that_never_come_time_out_naming_the_ranks(size: int,
                                                                 shm_dir: None) -> None:
    # no peer ever creates its segment: the timeout names them, "rank" or "ranks" as
    # many as there are, and leaves this rank's own segment removed
    t = ShmTransport(0, size, f"ringlet-{secrets.token_hex(16)}-w", Settings())
    try:
        with pytest.raises(CommTimeoutError) as err:
            t.connect(0.2)
        who = "rank 1" if size == 2 else "ranks 1, 2, 3"
        assert f"timed out starting the shared-memory transport ({t.prefix}): {who} did not " \
               f"arrive; check that every rank called ringlet.init()" in str(err.value)
        assert not os.path.exists(t.path(0))
    finally:
        t.close()


@pytest.mark.parametrize("how", [
    pytest.param({"uid": 65534}, marks=needs_root, id="other-owner"),
    pytest.param({"mode": 0o640}, id="group-readable"),
])
def test_shared_buffer_not_ours_is_refused(how: dict[str, int], shm_dir: None) -> None:
    path = os.path.join(SHM_DIR, f"ringlet-{secrets.token_hex(16)}-buf0-1")
    _plant(path, **how)
    try:
        with pytest.raises(ConfigError, match=r"shared buffer .* is not this job's: it belongs"):
            open_region(path, 4096)
    finally:
        os.unlink(path)
    mine = os.path.join(SHM_DIR, f"ringlet-{secrets.token_hex(16)}-buf0-0")
    mm = create_region(mine, 4096)
    try:
        open_region(mine, 4096).close()   # a region of ours opens
        assert os.stat(mine).st_mode & 0o777 == 0o600
    finally:
        mm.close()
        os.unlink(mine)


# --- 2: nothing left behind under the launchers ---------------------------------------------


def _launch_and_signal(launcher: str, sig: signal.Signals, left: bool = False,
                       **extra: str) -> tuple[int, str]:
    """Start a 2-rank job, signal the launcher while the ranks are in start-up, wait for
    every rank to end; return the launcher's status and output, checking nothing is left
    (``left``: that the two segments are, and that the next job's start-up removes them
    once they are old enough)."""
    proc = subprocess.Popen(_launcher_cmd(launcher, 2), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_env(**extra),
                            start_new_session=True)
    assert proc.stdout is not None
    try:
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + 60
        while len(seen) < 2 and time.monotonic() < deadline:
            seen.extend(_reports(proc.stdout.readline()))   # ranks' lines may be joined
        assert len(seen) == 2, seen
        pids = {r["pid"] for r in seen}
        if "STARTUP_STALL" in extra:   # wait for both segments, so the signal meets them
            while len(_job_files(pids, set())) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert len(_job_files(pids, set())) == 2
        else:
            time.sleep(1.0)            # both at the rendezvous (rank 1 sleeps before init)
        proc.send_signal(sig)
        out = proc.communicate(timeout=LIMIT)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    end = time.monotonic() + 30       # orphaned ranks end by themselves (launcher gone)
    while any(os.path.exists(f"/proc/{p}") for p in pids) and time.monotonic() < end:
        time.sleep(0.05)
    assert not any(os.path.exists(f"/proc/{p}") for p in pids), "ranks outlived start-up"
    if left:
        files = [os.path.join(SHM_DIR, f) for f in _job_files(pids, set())]
        try:
            assert len(files) == 2, (files, out)
            then = time.time() - 2 * STALE_AFTER_S
            for f in files:
                os.utime(f, (then, then))
            nxt = subprocess.run([sys.executable, "-c", "import ringlet; ringlet.init().close()"],
                                 capture_output=True, text=True, timeout=LIMIT, env=_env())
            assert nxt.returncode == 0, nxt.stderr
            assert not any(os.path.exists(f) for f in files), "the next job left them"
        finally:
            for f in files:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(f)
    assert _job_files(pids, set()) == [], out
    return proc.returncode, out


LAUNCHERS = ["torchrun", "mpiexec"]
SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGKILL]


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
@pytest.mark.waits
def test_signal_to_launcher_at_the_rendezvous_leaves_nothing(
        launcher: str, sig: signal.Signals, shm_dir: None) -> None:
    rc, out = _launch_and_signal(launcher, sig, STARTUP_SLEEP="1:2", RINGLET_INIT_TIMEOUT="3")
    assert rc != 0, out


@pytest.mark.parametrize("launcher", LAUNCHERS)
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_signal_to_launcher_with_segments_in_place_leaves_nothing(
        launcher: str, sig: signal.Signals, shm_dir: None) -> None:
    # mpiexec's proxies SIGKILL the ranks when mpiexec dies: nothing of the job can clean up
    # then (start-up keeps segments only for milliseconds, rendezvous first); the next job
    # on the host does, once they are old enough
    left = launcher == "mpiexec" and sig == signal.SIGKILL
    rc, out = _launch_and_signal(launcher, sig, left, STARTUP_STALL="1",
                                 RINGLET_INIT_TIMEOUT="10")
    assert rc != 0, out


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_start_up_timeout_under_launcher_leaves_nothing(launcher: str, shm_dir: None) -> None:
    proc = subprocess.run(_launcher_cmd(launcher, 2), capture_output=True, text=True,
                          timeout=LIMIT,
                          env=_env(STARTUP_SKIP="1", RINGLET_INIT_TIMEOUT="2"))
    reports = _reports(proc.stdout)
    err = _errors(reports)[0]
    assert "rank 1 of 2 did not call ringlet.init()" in err["message"], reports
    assert _job_files({r["pid"] for r in reports if "pid" in r}, set()) == []


# --- the held signals, in this process -----------------------------------------------------


def test_held_signals_are_recorded_then_handlers_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    before_int = signal.getsignal(signal.SIGINT)   # SIG_IGN when started in the background
    held: list[int] = []
    with _held_signals(held):
        if before == signal.SIG_DFL:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
            assert held == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) == before
    assert signal.getsignal(signal.SIGINT) == before_int


def test_a_program_handler_is_left_alone() -> None:
    got: list[int] = []
    old = signal.signal(signal.SIGHUP, lambda s, f: got.append(s))
    try:
        held: list[int] = []
        with _held_signals(held):
            os.kill(os.getpid(), signal.SIGHUP)
            time.sleep(0.01)
        assert got == [signal.SIGHUP] and held == []
    finally:
        signal.signal(signal.SIGHUP, old)



def test_rendezvous_names_are_digests() -> None:
    from ringlet.startup import _job_rendezvous_name

    job = secrets.token_hex(16)
    name = _job_rendezvous_name(job)
    assert name.startswith("ringlet-rdv-") and job not in name   # listed in /proc/net/unix
    assert name != _job_rendezvous_name(secrets.token_hex(16))
    key = detect(_torch_vars(0, 2, "none"), ppid=4242).rendezvous_key
    assert rendezvous_name(key) == rendezvous_name(key) != name
