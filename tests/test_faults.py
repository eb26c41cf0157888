"""Faults: a peer that dies, a peer that never arrives, a rank killed with SIGKILL.

Every case must end in a RingletError on every surviving rank within
seconds (not at the deadline), and leave nothing in /dev/shm.  These tests
start fresh ranks with ``ringlet.spawn`` because they break the job.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import outcome, shm_files, shm_left

import ringlet
from ringlet.config import Settings

FAST = Settings(timeout=60.0, grace=5.0)


def _die_mid_collective(comm: ringlet.Communicator, victim: int) -> None:
    x = np.ones(1 << 20)
    if comm.rank == victim:
        threading.Timer(0.2, lambda: os._exit(7)).start()
    for _ in range(100_000):   # ends in a PeerError once the victim is gone
        comm.all_reduce(x, algorithm="ring")


@pytest.mark.parametrize("n,victim", [(2, 1), (3, 1), (5, 4), (8, 3)])
def test_dead_peer_fails_every_survivor_fast(n: int, victim: int) -> None:
    before = shm_files()
    with pytest.raises(ringlet.SpawnError) as info:
        ringlet.spawn(_die_mid_collective, n, victim, settings=FAST)
    err = info.value
    assert victim in err.failures and "exit code 7" in err.failures[victim], err.failures
    # every survivor raised on its own (a PeerError naming the dead rank), before the grace
    # period ran out: none of them had to be stopped
    assert set(err.failures) == set(range(n)), err.failures
    for r, text in err.failures.items():
        if r != victim:
            assert "PeerError" in text and f"rank {victim}" in text, (r, text)
            assert "stopped" not in text, (r, text)
    assert not shm_left(before)


def _survivors_report(comm: ringlet.Communicator, victim: int) -> None:
    x = np.ones(1 << 18)
    if comm.rank == victim:
        threading.Timer(0.2, lambda: os._exit(7)).start()
    start = time.monotonic()
    try:
        for _ in range(100_000):
            comm.all_reduce(x, algorithm="ring")
    except ringlet.RingletError as exc:
        raise RuntimeError(f"detected {type(exc).__name__} after "
                           f"{time.monotonic() - start:.2f} s") from exc


def test_dead_peer_detected_within_seconds() -> None:
    with pytest.raises(ringlet.SpawnError) as info:
        ringlet.spawn(_survivors_report, 4, 2, settings=FAST)
    fails = info.value.failures
    for r in (0, 1, 3):
        m = re.search(r"detected PeerError after ([\d.]+) s", fails[r])
        assert m and float(m.group(1)) < 5.0, fails[r]


def _recv_after_abort(comm: ringlet.Communicator) -> str:
    if comm.rank > 0:   # time out waiting for rank 0, which abort the communicator
        with pytest.raises(ringlet.CommTimeoutError):
            comm.all_reduce(np.ones(4))
        return "timed out"
    time.sleep(2.0)
    return outcome(lambda: comm.recv(np.empty(4), 1, tag=5))


@pytest.mark.waits
def test_p2p_wait_after_an_abort_says_what_failed_here_and_there() -> None:
    """A receive on a communicator its peers aborted (their all_reduce timed out waiting
    for this rank) raises their error, and says first that it is this receive that
    failed (it quoted only the peers' all_reduce, which this rank never called)."""
    res = ringlet.spawn(_recv_after_abort, 3, settings=Settings(timeout=1.0))
    assert res[1:] == ["timed out", "timed out"], res
    assert res[0].startswith("CommTimeoutError: recv from rank 1") and "failed: " in res[0] \
        and "all_reduce #1" in res[0], res[0]


def _any_source_dead(comm: ringlet.Communicator, how: str) -> str:
    """Rank 0 waits for a message from any rank; the last rank dies, the others sleep."""
    r, n = comm.rank, comm.size
    comm.barrier()
    if r == n - 1:
        time.sleep(0.3)
        os._exit(1)
    if r > 0:
        time.sleep(4.0)
        return "slept"
    start = time.monotonic()
    if how == "recv":
        got = outcome(lambda: comm.recv(np.empty(1), ringlet.ANY_SOURCE, tag=1))
    elif how == "probe":
        got = outcome(lambda: comm.probe(ringlet.ANY_SOURCE, 1))
    else:
        works = comm.batch_isend_irecv([("recv", np.empty(1), ringlet.ANY_SOURCE, 1)])
        got = outcome(works[0].wait)
    raise RuntimeError(f"{got} after {time.monotonic() - start:.1f} s")


@pytest.mark.parametrize("how", ["recv", "probe", "batch"])
@pytest.mark.waits
def test_any_source_wait_fails_when_a_peer_dies(how: str) -> None:
    """A wait for a message from any rank fails at once when a peer dies (it may have been
    the sender; the communicator is aborted anyway): it waited until ringlet run's grace
    ran out (or RINGLET_TIMEOUT), watching no rank at all."""
    with pytest.raises(ringlet.SpawnError) as info:
        # rank 1 returns 4 s after rank 2 died: a grace long enough for it to end too on
        # a loaded machine (5 s left it about one second to exit, and CI took more)
        ringlet.spawn(_any_source_dead, 3, how, settings=dataclasses.replace(FAST, grace=20.0))
    fails = info.value.failures
    assert set(fails) == {0, 2}, fails   # rank 1 slept its 4 s and returned
    what = "probe for a message from any rank (tag 1)" if how == "probe" else \
        "recv from any rank (tag 1)"
    m = re.search(r"PeerError: rank 2 \(pid \d+\) died; (.*) cannot complete.* after "
                  r"([\d.]+) s", fails[0])
    assert m and m[1] == what and float(m[2]) < 3.0, fails[0]


def _sender_dies_mid_message(comm: ringlet.Communicator, which: str) -> None:
    """Rank 1 starts sending 64 MiB (more than a channel holds) and dies at once; rank 0
    waits for that message (``this``) or for a later one behind it (``later``)."""
    big = 64 << 20
    if comm.rank == 1:
        comm.isend(np.ones(big, np.uint8), 0, tag=3)
        os._exit(1)
    first = comm.irecv(np.empty(big, np.uint8), 1, tag=3)
    w = first if which == "this" else comm.irecv(np.empty(4, np.uint8), 1, tag=4)
    raise RuntimeError(outcome(w.wait))


@pytest.mark.parametrize("which", ["this", "later"])
def test_a_receive_whose_sender_died_part_way_says_so(which: str) -> None:
    """The message was matched and part of it had come: the error says that, not that
    rank 1 sent messages no receive matched (as it said before)."""
    with pytest.raises(ringlet.SpawnError) as info:
        ringlet.spawn(_sender_dies_mid_message, 2, which, settings=FAST)
    text = info.value.failures[0]
    whose = "this receive's" if which == "this" else "an earlier receive's"
    assert "PeerError: rank 1" in text and f"({whose} message from rank 1 was still " \
        "arriving: rank 1 stopped sending it part-way)" in text, text


def _relayed_death(comm: ringlet.Communicator) -> None:
    """Rank 1 dies while rank 0 receives from it and rank 2 from rank 0: rank 2 hears of
    the death from rank 0's abort."""
    if comm.rank == 1:
        time.sleep(0.3)
        os._exit(1)
    src = 1 if comm.rank == 0 else 0
    raise RuntimeError(outcome(lambda: comm.recv(np.empty(3), src, tag=5)))


def test_a_peer_death_relayed_in_point_to_point_says_whose_operation_failed() -> None:
    """Rank 2's error quotes rank 0's: it says so ("rank 0: rank 1 ... died; recv from
    rank 1 ..."), not as if rank 2 had been receiving from rank 1 (it said "recv from
    rank 0 (tag 5) failed: rank 1 (pid ...) died; recv from rank 1 (tag 5) cannot
    complete (nothing from rank 1 is pending: it has not sent this rank a message)")."""
    with pytest.raises(ringlet.SpawnError) as info:
        ringlet.spawn(_relayed_death, 3, settings=FAST)
    text = info.value.failures[2]
    assert re.search(r"PeerError: recv from rank 0 \(tag 5\) failed: rank 0: rank 1 "
                     r"\(pid \d+\) died; recv from rank 1 \(tag 5\) cannot complete", text), text
    assert re.search(r"PeerError: rank 1 \(pid \d+\) died; recv from rank 1",
                     info.value.failures[0]), info.value.failures[0]


def _relayed_timeout(comm: ringlet.Communicator) -> str:
    """Rank 1 sends with tag 3 and times out in a barrier; rank 0, in a recv of tag 4 from
    rank 1 since a second later, hears of that timeout before its own."""
    if comm.rank == 1:
        comm.send(np.ones(3), 0, tag=3)
        return outcome(comm.barrier)
    time.sleep(1.0)
    return outcome(lambda: comm.recv(np.empty(3), 1, tag=4))


@pytest.mark.waits
def test_a_timeout_relayed_to_a_receive_keeps_its_tag_hint() -> None:
    """The receive failing on another rank's timeout says what it holds from its peer (the
    message of another tag), as it does when it fails on a peer's death: it quoted the
    barrier's timeout alone."""
    got = ringlet.spawn(_relayed_timeout, 2, settings=Settings(timeout=2.0, grace=5.0))
    assert got[1].startswith("CommTimeoutError: timed out after 2 s in barrier"), got[1]
    assert got[0].startswith("CommTimeoutError: recv from rank 1 (tag 4) failed: ") and \
        "rank 1 sent this rank messages no receive matched: tag 3" in got[0], got[0]


def _any_source_closed(comm: ringlet.Communicator) -> str:
    """Rank 2 ends its program while rank 0 waits for a message from any rank: rank 1 may
    still send (and does); once rank 1 has ended too, nobody can."""
    r = comm.rank
    comm.barrier()
    if r == 2:
        comm.close()
        return "closed"
    if r == 1:
        time.sleep(1.0)
        comm.send(np.full(1, 5.0), 0, tag=1)
        comm.close()
        return "sent"
    got = comm.recv(np.empty(1), ringlet.ANY_SOURCE, tag=1)
    return f"got {got[0]:g}; then " + outcome(lambda: comm.recv(np.empty(1),
                                                                 ringlet.ANY_SOURCE, tag=1))


@pytest.mark.waits
def test_any_source_wait_outlives_a_peer_that_closed_until_none_is_left() -> None:
    """A peer that closed the communicator is no failure of a wait for any rank while
    another rank may still send; once every other rank has closed, it is one."""
    res = ringlet.spawn(_any_source_closed, 3, settings=FAST)
    assert res[1:] == ["sent", "closed"], res
    assert res[0] == ("got 5; then PeerError: every other rank closed the communicator (or "
                      "its program ended) while recv from any rank (tag 1) waited: no rank is "
                      "left to send"), res[0]


def _absent(comm: ringlet.Communicator) -> str:
    if comm.rank == 1:
        time.sleep(3.0)   # never calls the collective
        return "slept"
    try:
        comm.all_reduce(np.ones(4))
    except ringlet.CommTimeoutError as exc:
        return str(exc)
    return "no error"


@pytest.mark.waits
def test_timeout_names_collective_sequence_and_missing_rank() -> None:
    res = ringlet.spawn(_absent, 3, settings=Settings(timeout=1.0))
    assert res[1] == "slept"
    for r in (0, 2):
        assert re.search(r"timed out after 1 s in all_reduce #1 .*rank 1 did not arrive",
                         res[r]), res[r]
    # the rank that timed out first names rank 1; the other learns of it by the abort
    assert any("rank 1 has not entered any collective" in res[r] for r in (0, 2)), res


def _wrong_order(comm: ringlet.Communicator) -> str:
    try:
        if comm.rank == 0:
            comm.broadcast(np.ones(4))
            comm.all_reduce(np.ones(4))
        else:
            comm.all_reduce(np.ones(4))
            comm.broadcast(np.ones(4))
    except ringlet.MismatchError as exc:
        return str(exc)
    return "no error"


def test_collective_order_mismatch_on_every_rank() -> None:
    res = ringlet.spawn(_wrong_order, 3, settings=FAST)
    for text in res:
        assert "disagree about the collective #1: rank 0: broadcast; ranks 1, 2: all_reduce" \
            in text, text


SIGKILL_SCRIPT = textwrap.dedent("""
    import os, signal, time
    import numpy as np
    import ringlet
    comm = ringlet.init()
    x = np.ones(1 << 16)
    comm.all_reduce(x)
    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    while True:
        comm.all_reduce(x)
""")


def test_sigkill_leaves_no_segments_and_run_exits_promptly(tmp_path: Path) -> None:
    script = tmp_path / "killed.py"
    script.write_text(SIGKILL_SCRIPT)
    before = shm_files()
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ringlet.cli", "run", "-n", "3", "--grace",
                           "5", str(script)], capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    assert "rank 1 failed first" in proc.stderr and "SIGKILL" in proc.stderr, proc.stderr
    assert "PeerError" in proc.stdout + proc.stderr
    assert elapsed < 30, elapsed
    assert not shm_left(before), shm_left(before)


def _log_line(comm: ringlet.Communicator) -> None:
    comm.all_reduce(np.ones(8, np.float32), algorithm="ring")


def test_debug_info_logs_algorithm_and_size(tmp_path: Path) -> None:
    script = tmp_path / "debug.py"
    script.write_text("import numpy as np, ringlet\ncomm = ringlet.init()\n"
                      "comm.all_reduce(np.ones(8, np.float32), algorithm='ring')\n")
    env = {**os.environ, "RINGLET_DEBUG": "INFO"}
    proc = subprocess.run([sys.executable, "-m", "ringlet.cli", "run", "-n", "2", str(script)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"rank 0: all_reduce #1 \(8 x float32\) algorithm ring, 32 B", proc.stderr), \
        proc.stderr


def test_unknown_setting_is_rejected(tmp_path: Path) -> None:
    env = {**os.environ, "RINGLET_TIMEOUTT": "5"}
    proc = subprocess.run([sys.executable, "-c", "import ringlet; ringlet.init()"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode != 0
    assert "unknown setting RINGLET_TIMEOUTT" in proc.stderr


def test_sigterm_on_launcher_stops_everything(tmp_path: Path) -> None:
    script = tmp_path / "forever.py"
    script.write_text("import time, ringlet\ncomm = ringlet.init()\ncomm.barrier()\n"
                      "print('ready', flush=True)\ntime.sleep(600)\n")
    before = shm_files()
    proc = subprocess.Popen([sys.executable, "-m", "ringlet.cli", "run", "-n", "2", str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    seen = 0
    while seen < 2 and time.monotonic() < deadline:
        if "ready" in proc.stdout.readline():
            seen += 1
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    assert proc.returncode != 0
    assert not shm_left(before)
