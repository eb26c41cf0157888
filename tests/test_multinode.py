"""Across nodes on one machine: emulated nodes (RINGLET_NODE) with a real engine between them.

Every collective, every registered algorithm (and the engine's ``native``)
and p2p give numpy's answer, all_reduce is bit-identical on every rank,
``comm.topology`` is right and ``split`` works across nodes, under:

- ``mpiexec`` (MPICH), 4 ranks in 2 nodes and 6 in 3 (MPMD: one
  ``RINGLET_NODE`` per group of ranks);
- ``ringlet run --nodes K`` (torch.distributed's gloo between nodes);
- ``torchrun``, one per node (``--nnodes 2 --node-rank i``), as on two hosts.

Mismatches, rejected calls and timeouts end in the same errors as on one
host (``--errors --timeout`` in the job script).  The same job across real
network namespaces is in ``test_netns_jobs.py``.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from jobs import clean_env

SCRIPT = Path(__file__).parent / "scripts" / "multinode_job.py"
RAILS = Path(__file__).parent / "scripts" / "rails_job.py"
RAILS_DEAD = Path(__file__).parent / "scripts" / "rails_dead.py"
SERIALIZED = Path(__file__).parent / "scripts" / "mpi_serialized.py"
DEAD_EXIT = Path(__file__).parent / "scripts" / "mpi_dead_exit.py"
STORE_LATE = Path(__file__).parent / "scripts" / "torch_store_late.py"
STARTUP = Path(__file__).parent / "scripts" / "mpi_startup.py"
NODE_DEAD = Path(__file__).parent / "scripts" / "mpi_node_dead.py"
PEER_KILLED = Path(__file__).parent / "scripts" / "peer_killed_at_end.py"
BIN = Path(sys.executable).parent
MPIEXEC = shutil.which("mpiexec", path=str(BIN)) or shutil.which("mpiexec")
TORCHRUN = shutil.which("torchrun", path=str(BIN)) or shutil.which("torchrun")
LIMIT = 240


def _env(**extra: str) -> dict[str, str]:
    return clean_env(**{"RINGLET_TIMEOUT": "60", **extra})


def _reports(text: str) -> list[dict[str, Any]]:
    found, dec, at = [], json.JSONDecoder(), text.find('{"rank"')
    while at >= 0:
        obj, end = dec.raw_decode(text, at)
        found.append(obj)
        at = text.find('{"rank"', end)
    return found


def _check(proc: subprocess.CompletedProcess[str], size: int, nodes: list[list[int]],
           engine: str) -> None:
    out = proc.stdout + proc.stderr
    reports = {r["rank"]: r for r in _reports(proc.stdout)}
    assert sorted(reports) == list(range(size)), out
    for r in reports.values():
        assert r["ok"], (r["bad"], out)
        assert r["nodes"] == nodes and r["engine"] == engine, r
    assert proc.returncode == 0, out


def _mpmd(nodes: int, per: int, *args: str, script: Path = SCRIPT) -> list[str]:
    if MPIEXEC is None:
        pytest.skip("mpiexec is not installed (pip install mpich)")
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install mpi4py)")
    cmd = [MPIEXEC]
    for k in range(nodes):
        if k:
            cmd.append(":")
        cmd += ["-n", str(per), "-env", "RINGLET_NODE", f"n{k}", sys.executable, str(script),
                *args]
    return cmd


@pytest.mark.parametrize("nodes,per", [(2, 2), (3, 2)])
def test_mpiexec_emulated_nodes(nodes: int, per: int) -> None:
    keys = ",".join(f"n{r // per}" for r in range(nodes * per))
    proc = subprocess.run(_mpmd(nodes, per, "--native", "--errors"), capture_output=True,
                          text=True, timeout=LIMIT, env=_env(EXPECT_NODES=keys))
    _check(proc, nodes * per, [list(range(k * per, (k + 1) * per)) for k in range(nodes)],
           "mpi")


@pytest.mark.waits
def test_mpiexec_timeout_across_nodes_names_the_rank() -> None:
    proc = subprocess.run(_mpmd(2, 2, "--errors", "--timeout", "--no-sweep"),
                          capture_output=True, text=True, timeout=LIMIT,
                          env=_env(RINGLET_TIMEOUT="2"))
    reports = _reports(proc.stdout)
    assert len(reports) == 4 and all(r["ok"] for r in reports), proc.stdout + proc.stderr


def test_mpi_thread_serialized_with_two_communicators() -> None:
    """Under MPI_THREAD_SERIALIZED two communicators' worker threads (a world's and its
    split's asynchronous all_reduces) take one lock for MPI: right sums on every rank
    (with a lock per transport, messages were lost and MPICH crashed)."""
    proc = subprocess.run(_mpmd(2, 2, script=SERIALIZED), capture_output=True, text=True,
                          timeout=LIMIT, env=_env())
    out = proc.stdout + proc.stderr
    reports = {r["rank"]: r for r in _reports(proc.stdout)}
    assert sorted(reports) == list(range(4)) and proc.returncode == 0, out
    assert all(r["ok"] for r in reports.values()), out


@pytest.mark.waits
def test_mpi_rail_member_late_times_out_naming_it() -> None:
    """MPI_Comm_create_group waits for every member without a deadline: the members of a
    new MPI group (here a rail, RINGLET_RAILS=native) first meet under the deadline.  A
    rank 6 s late to build its rail fails its rail peer after the 2 s timeout, naming
    it (before, that peer waited in MPI for it and then returned as if nothing had
    happened, while the other ranks had failed), and every rank ends in an error."""
    cmd = _mpmd(2, 2, "--late", "6", script=RAILS_DEAD)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT,
                          env=_env(RINGLET_RAILS="native", RINGLET_TIMEOUT="2"))
    out = proc.stdout + proc.stderr
    reports = {r["rank"]: r for r in _reports(proc.stdout)}
    assert sorted(reports) == [0, 1, 2, 3], out
    assert all(r["error"] in ("CommTimeoutError", "PeerError") for r in reports.values()), out
    one = reports[1]
    assert one["error"] == "CommTimeoutError" and one["seconds"] < 5, out
    assert "building the MPI group of ranks [1, 3]: rank 3 did not arrive" in one["message"]


def _left_running(script: Path, *args: str, per: int = 1, **env: str
                  ) -> tuple[subprocess.CompletedProcess[str], float, dict[int, Any]]:
    """``script args`` as ``per`` ranks on each of two emulated nodes under ``mpiexec
    -disable-auto-cleanup`` (a rank that dies does not end the job, as on other hosts):
    the job, how long it took, and the ranks' JSON lines by rank."""
    if MPIEXEC is None:
        pytest.skip("mpiexec is not installed (pip install mpich)")
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install mpi4py)")
    cmd = [MPIEXEC, "-disable-auto-cleanup"]
    for node in ("a", "b"):
        cmd += [*([":"] if node == "b" else []), "-n", str(per), "-env", "RINGLET_NODE", node,
                sys.executable, str(script), *args]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT, env=_env(**env))
    return proc, time.monotonic() - t0, {r["rank"]: r for r in _reports(proc.stdout)}


@pytest.mark.waits
def test_mpi_rank_exits_after_a_peer_died_where_mpiexec_does_not_end_the_job() -> None:
    """With ``mpiexec -disable-auto-cleanup`` a rank that died leaves the others in
    MPICH's MPI_Finalize for ever once they have raised and returned: after a failure
    ringlet ends the process if finalizing takes longer than _FINALIZE_S (2 s here) or,
    after a timeout, the deadline (3 s here), saying so."""
    proc, took, reports = _left_running(DEAD_EXIT, RINGLET_TIMEOUT="3")
    out = proc.stdout + proc.stderr
    assert list(reports) == [0] and reports[0]["error"] in ("PeerError", "CommTimeoutError"), \
        out
    # rank 0 timed out (one rank per node: MPI did not report rank 1 dead): the grace is
    # then the deadline, 3 s
    assert "this process ends in 3 s (SIGALRM)" in proc.stderr, out
    assert took < 30, out


@pytest.mark.parametrize("case", ["ring", "native"])
@pytest.mark.waits
def test_mpi_rank_dead_inside_a_call_is_a_peer_error_at_once(case: str) -> None:
    """The last rank agrees to a call and dies before its first message.  Its node peer's
    wait is for MPI alone (ringlet's ring: a message from the other node; the native
    case: MPI's all_reduce), which cannot tell a dead rank from a late one: that wait
    also watches the node's shared memory, so the node peer raises PeerError naming the
    dead rank at once and tells the others (before, every rank waited out the 6 s
    deadline)."""
    proc, took, reports = _left_running(NODE_DEAD, case, per=2, RINGLET_TIMEOUT="6")
    out = proc.stdout + proc.stderr
    assert sorted(reports) == [0, 1, 2], out
    for r in reports.values():
        assert r["error"] == "PeerError" and "rank 3" in r["message"], out
        assert r["seconds"] < 4, out
    assert took < 60, out


@pytest.mark.waits
def test_mpi_recv_from_a_dead_rank_times_out_and_the_rank_exits() -> None:
    """A receive from a rank on another node that died: over MPI a dead rank and a late
    one look the same, so the receive times out, and says that MPI cannot tell (not
    "though it is alive"); the failed wait aborts the communicator, which arms the exit
    alarm, so the rank ends though MPI_Finalize waits for the dead one (before, it waited
    for ever)."""
    proc, took, reports = _left_running(NODE_DEAD, "recv", RINGLET_TIMEOUT="2")
    out = proc.stdout + proc.stderr
    assert list(reports) == [0] and reports[0]["error"] == "CommTimeoutError", out
    assert "MPI cannot tell whether it is alive" in reports[0]["message"], out
    assert "recv from rank 1" in reports[0]["message"], out
    assert "rank 0's MPI communicator failed" in proc.stderr and \
        "this process ends in 2 s (SIGALRM)" in proc.stderr, out
    assert took < 30, out


@pytest.mark.waits
def test_mpi_rank_that_heard_of_a_failure_sends_nothing_at_close() -> None:
    """A rank in no call when a peer died and the others failed closes its communicator
    later: it has heard of the failure (the node's shared memory, the peers' notices), so
    it sends no closed notice over MPI, to the dead rank or any other (a send to a dead
    rank can crash MPICH), and ends (before, it sent one to every remote peer)."""
    proc, took, reports = _left_running(NODE_DEAD, "idle", per=2, RINGLET_TIMEOUT="3")
    out = proc.stdout + proc.stderr
    assert reports.get(0, {}).get("sent") == [], out
    assert took < 30, out


@pytest.mark.waits
def test_mpi_rank_that_heard_of_a_failure_sends_nothing_point_to_point() -> None:
    """As above, but the rank sends to the dead rank twice before it closes: both sends
    raise PeerError and nothing goes to MPI (before, both went: a send to a dead rank
    can crash MPICH)."""
    proc, took, reports = _left_running(NODE_DEAD, "send", per=2, RINGLET_TIMEOUT="3")
    out = proc.stdout + proc.stderr
    assert reports.get(0, {}).get("sent") == [], out
    assert reports[0]["errors"] == ["PeerError", "PeerError"], out
    assert took < 30, out


@pytest.mark.waits
def test_mpiexec_startup_late_rank_times_out() -> None:
    """Start-up's exchanges over MPI are nonblocking collectives under
    RINGLET_INIT_TIMEOUT: a rank that comes 6 s late (MPI started) makes the others
    fail after 2 s, saying what to check, and the job ends."""
    t0 = time.monotonic()
    proc = subprocess.run(_mpmd(2, 2, script=STARTUP), capture_output=True, text=True,
                          timeout=LIMIT, env=_env(STARTUP_CASE="late",
                                                  RINGLET_INIT_TIMEOUT="2"))
    out = proc.stdout + proc.stderr
    reports = {r["rank"]: r for r in _reports(proc.stdout)}
    assert {0, 1, 2} <= set(reports), out
    for q in (0, 1, 2):
        r = reports[q]
        assert r["error"] == "CommTimeoutError" and r["seconds"] < 5, out
        assert "RINGLET_INIT_TIMEOUT" in r["message"] and "RINGLET_NODE" in r["message"], out
    assert time.monotonic() - t0 < 90, out


@pytest.mark.waits
def test_mpiexec_startup_timeout_exits_where_mpiexec_does_not_end_the_job() -> None:
    """A rank dies before ringlet.init() and ``mpiexec -disable-auto-cleanup`` leaves the
    job running: the other times out in start-up's exchange over MPI, whose collective
    stays pending, and then ends itself at exit (before, MPICH's MPI_Finalize waited
    for the dead rank for ever)."""
    proc, took, reports = _left_running(STARTUP, STARTUP_CASE="dead", RINGLET_INIT_TIMEOUT="2")
    out = proc.stdout + proc.stderr
    assert list(reports) == [0] and reports[0]["error"] == "CommTimeoutError", out
    assert "rank 0's start-up over MPI" in proc.stderr and \
        "this process ends in 2 s (SIGALRM)" in proc.stderr, out
    assert took < 30, out


def test_mpiexec_startup_failure_on_one_node_fails_every_rank() -> None:
    """A node whose shared-memory start-up fails (its two ranks differ in
    RINGLET_SHM_SLOTS) fails every rank of the job with that ConfigError at once: the
    other node's ranks hear it over MPI instead of waiting in the engine's next
    collective for ever.  The message names the ranks by their ranks in the job."""
    if MPIEXEC is None:
        pytest.skip("mpiexec is not installed (pip install mpich)")
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install mpi4py)")
    py, script = sys.executable, str(STARTUP)
    cmd = [MPIEXEC, "-n", "2", "-env", "RINGLET_NODE", "n0", py, script, ":",
           "-n", "1", "-env", "RINGLET_NODE", "n1", py, script, ":",
           "-n", "1", "-env", "RINGLET_NODE", "n1", "-env", "RINGLET_SHM_SLOTS", "8", py, script]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT,
                          env=_env(STARTUP_CASE="node"))
    out = proc.stdout + proc.stderr
    reports = {r["rank"]: r for r in _reports(proc.stdout)}
    assert sorted(reports) == list(range(4)), out
    for r in reports.values():
        assert r["error"] == "ConfigError" and "RINGLET_SHM_SLOTS" in r["message"], out
        assert r["seconds"] < 20, out
    assert "could not start" in reports[0]["message"], out
    # the node's ranks are named by their ranks in the job, not on the node
    for r in reports.values():
        assert "RINGLET_SHM_SLOTS: rank 2 has 4; rank 3 has 8" in r["message"], out


def test_mpiexec_nodes_of_uneven_size() -> None:
    """Five ranks as nodes of 2, 2 and 1: every collective, algorithm, uneven call and
    the error sequence, as on nodes of equal size."""
    if MPIEXEC is None:
        pytest.skip("mpiexec is not installed (pip install mpich)")
    pytest.importorskip("mpi4py")
    cmd = [MPIEXEC]
    for k, per in enumerate((2, 2, 1)):
        cmd += ([":"] if k else []) + ["-n", str(per), "-env", "RINGLET_NODE", f"n{k}",
                                       sys.executable, str(SCRIPT), "--errors"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT,
                          env=_env(EXPECT_NODES="a,a,b,b,c"))
    _check(proc, 5, [[0, 1], [2, 3], [4]], "mpi")


def test_mpiexec_nodes_that_are_not_blocks() -> None:
    """Ranks 0, 2 on one node and 1, 3 on the other: no two-level layout, still right."""
    if MPIEXEC is None:
        pytest.skip("mpiexec is not installed (pip install mpich)")
    pytest.importorskip("mpi4py")
    cmd = [MPIEXEC]
    for r in range(4):
        cmd += ([":"] if r else []) + ["-n", "1", "-env", "RINGLET_NODE", f"n{r % 2}",
                                       sys.executable, str(SCRIPT)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT,
                          env=_env(EXPECT_NODES="a,b,a,b"))
    _check(proc, 4, [[0, 2], [1, 3]], "mpi")


def _torch() -> None:
    pytest.importorskip("torch", reason="torch is not installed")


@pytest.mark.parametrize("nodes", [2, 3])
def test_ringlet_run_nodes(nodes: int) -> None:
    """On the torch engine the agreement is two-level (ringlet.transport.routed): the error
    sequence's mismatch is on the last node only, and its rejected call on the first.

    Rank 0, which hosts the job's torch store, ends first (the others close 1.5 s later):
    it waits for them at exit, so no rank's store client fails and logs torch's C++
    stack trace ("recvValue failed", "Broken pipe"), as each one did every second."""
    _torch()
    proc = subprocess.run([sys.executable, "-m", "ringlet", "run", "--nodes", str(nodes), "-n",
                           str(2 * nodes), str(SCRIPT), "--native", "--errors", "--host-first"],
                          capture_output=True, text=True, timeout=LIMIT,
                          env=_env(EXPECT_NODES=",".join("abc"[k // 2] for k in range(2 * nodes))))
    _check(proc, 2 * nodes, [[2 * k, 2 * k + 1] for k in range(nodes)], "torch")
    assert "TCPStore" not in proc.stderr and "Broken pipe" not in proc.stderr, proc.stderr


def test_ringlet_run_one_rank_per_node() -> None:
    """Every rank alone on its node: every collective and algorithm, and p2p, with every
    peer through gloo, p2p to itself included (gloo has no connection to a rank's own:
    such messages timed out)."""
    _torch()
    proc = subprocess.run([sys.executable, "-m", "ringlet", "run", "--nodes", "2", "-n", "2",
                           str(SCRIPT), "--native"], capture_output=True, text=True,
                          timeout=LIMIT, env=_env(EXPECT_NODES="a,b"))
    _check(proc, 2, [[0], [1]], "torch")


def test_a_peer_killed_after_the_last_call_does_not_hold_the_store_host() -> None:
    """Rank 3 dies (SIGKILL) after the job's last call: rank 0, which hosts the torch store
    and waits at exit for the others to leave it, sees that its process is gone (its beat
    would take RINGLET_HEARTBEAT_S to stop) and exits normally, before ringlet run's grace
    ends it with SIGTERM (which it did).  The grace is 10 s here, not 3 (a loaded machine
    took longer than 3 s to end rank 0 once), and the beat's 30 s: still only the gone
    process lets rank 0 out in time."""
    _torch()
    proc = subprocess.run([sys.executable, "-m", "ringlet", "run", "--grace", "10", "--nodes",
                           "2", "-n", "4", str(PEER_KILLED)], capture_output=True, text=True,
                          timeout=LIMIT, env=_env(KILL="3", RINGLET_HEARTBEAT_S="30"))
    out = proc.stdout + proc.stderr
    assert "ranks 0-2 finished (exit code 0)" in proc.stderr, out
    assert all(f"rank {r}: done 4" in proc.stdout for r in range(3)), out
    assert "TCPStore" not in proc.stderr, out


@pytest.mark.parametrize("nodes, engine", [(2, "mpi"), (2, "none"), (1, "mpi")])
def test_ringlet_run_refuses_an_engine_it_cannot_start(nodes: int, engine: str) -> None:
    """--nodes emulates nodes on torch.distributed, and ringlet run is no MPI launcher: an
    explicit RINGLET_ENGINE it cannot honour is a ConfigError before any rank starts
    (--nodes silently ran torch; -n alone failed in every rank, saying that MPI saw each
    rank alone and to run one job per mpiexec)."""
    proc = subprocess.run([sys.executable, "-m", "ringlet", "run", "--nodes", str(nodes),
                           "-n", "4", str(SCRIPT)], capture_output=True, text=True,
                          timeout=LIMIT, env=_env(RINGLET_ENGINE=engine))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""
    how = "--nodes 2 emulates nodes over torch.distributed (gloo on loopback)" if nodes > 1 \
        else "ringlet run starts its ranks itself, not through MPI"
    assert f"ringlet run: {how}, but RINGLET_ENGINE={engine}: unset it, or run on MPI with " \
           f"mpiexec" in proc.stderr, proc.stderr


def test_ringlet_run_on_one_node_can_force_the_torch_engine() -> None:
    """RINGLET_ENGINE=torch on one node: ringlet run gives the ranks a store to meet on
    (they failed, MASTER_ADDR not set)."""
    _torch()
    proc = subprocess.run([sys.executable, "-m", "ringlet", "run", "-n", "2", str(SCRIPT),
                           "--no-sweep"], capture_output=True, text=True, timeout=LIMIT,
                          env=_env(RINGLET_ENGINE="torch"))
    reports = _reports(proc.stdout)
    assert proc.returncode == 0 and len(reports) == 2 and all(r["ok"] for r in reports), \
        proc.stdout + proc.stderr
    assert all(r["engine"] == "torch" and r["nodes"] == [[0, 1]] for r in reports), reports


def test_ringlet_run_timeout_across_nodes_names_the_rank() -> None:
    """The last rank skips a call: the others' timeout names it alone and says where it is,
    though on the torch engine its node's verdict never comes (its node's other rank sends
    its own descriptor to every rank once the call waits)."""
    _torch()
    proc = subprocess.run([sys.executable, "-m", "ringlet", "run", "--nodes", "2", "-n", "4",
                           str(SCRIPT), "--errors", "--timeout", "--no-sweep"],
                          capture_output=True, text=True, timeout=LIMIT,
                          env=_env(RINGLET_TIMEOUT="2"))
    reports = _reports(proc.stdout)
    assert len(reports) == 4 and all(r["ok"] for r in reports), proc.stdout + proc.stderr


def _rails_reports(proc: subprocess.CompletedProcess[str], size: int) -> list[dict[str, Any]]:
    out = proc.stdout + proc.stderr
    reports = {r["rank"]: r for r in _reports(proc.stdout)}
    assert sorted(reports) == list(range(size)), out
    assert all(r["ok"] for r in reports.values()) and proc.returncode == 0, out
    return list(reports.values())


@pytest.mark.parametrize("launcher,nodes,mode", [("mpi", 2, "native"), ("mpi", 3, "auto"),
                                                 ("torch", 2, "ring"), ("torch", 3, "auto")])
def test_rails_modes(launcher: str, nodes: int, mode: str) -> None:
    """hierarchical all_reduce with its inter-node phase as ringlet's ring or the engine's
    own all_reduce (RINGLET_RAILS; auto: native on torch, ring on MPI): numpy's answer
    for every dtype and op, bit-identical, and the mode the settings ask for."""
    if launcher == "mpi":
        cmd = _mpmd(nodes, 2, script=RAILS)
    else:
        _torch()
        cmd = [sys.executable, "-m", "ringlet", "run", "--nodes", str(nodes), "-n",
               str(2 * nodes), str(RAILS)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT,
                          env=_env(RINGLET_RAILS=mode))
    used = {r["native"] for r in _rails_reports(proc, 2 * nodes)}
    assert used == {mode == "native" or (mode == "auto" and launcher == "torch")}, used


def test_rails_settings_that_differ_are_a_mismatch() -> None:
    """Ranks whose RINGLET_RAILS differ get a MismatchError naming the path on every rank
    (not a hang), between two good calls."""
    cmd = _mpmd(2, 2, "--mismatch", script=RAILS)
    cmd[cmd.index("n1") + 1:cmd.index("n1") + 1] = ["-env", "RINGLET_RAILS", "native"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT,
                          env=_env(RINGLET_RAILS="ring"))
    _rails_reports(proc, 4)


@pytest.mark.parametrize("launcher", ["mpi", "torch"])
def test_rails_nodes_that_differ(launcher: str) -> None:
    """A call on which each node agrees but the nodes do not (count, op, a rank that
    rejected its arguments), on the engine's all_reduce across nodes, whose node runs
    the first phase before the other nodes' descriptors are in: the error on every
    rank, each vector as it was, and the calls around it good."""
    if launcher == "mpi":
        cmd = _mpmd(2, 2, "--nodes-differ", script=RAILS)
    else:
        _torch()
        cmd = [sys.executable, "-m", "ringlet", "run", "--nodes", "2", "-n", "4", str(RAILS),
               "--nodes-differ"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT,
                          env=_env(RINGLET_RAILS="native"))
    assert all(r["native"] for r in _rails_reports(proc, 4))


@pytest.mark.parametrize("where", ["before", "inside"])
def test_torch_rail_peer_dies_building_its_rail(where: str) -> None:
    """The first call on the engine's all_reduce builds every rail's gloo group, whose
    constructor waits without ringlet's deadline and does not notice a dead member
    (gloo's own timeout is init_timeout + 30 s).  The members meet first under the
    deadline, watching the communicator, and the constructor runs on a thread of its
    own while the caller waits the same way: a rank that dies before building its rail,
    or inside gloo's constructor, fails every survivor within seconds, its rail peer
    too, naming it (inside: the rail peer waited 90 s before)."""
    _torch()
    cmd = [sys.executable, "-m", "ringlet", "run", "--nodes", "2", "-n", "4", str(RAILS_DEAD),
           *(["--inside"] if where == "inside" else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT,
                          env=_env(RINGLET_RAILS="native", RINGLET_TIMEOUT="60",
                                   RINGLET_GRACE="60"))
    out = proc.stdout + proc.stderr
    reports = {r["rank"]: r for r in _reports(proc.stdout)}
    assert sorted(reports) == [0, 1, 2], out
    for r in reports.values():
        assert r["error"] == "PeerError" and "rank 3" in r["message"], out
        assert r["seconds"] < 15, out


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.waits
def test_torch_start_up_on_the_callers_store_keeps_its_deadline() -> None:
    """``ringlet.init()`` after the caller's own ``dist.init_process_group``: start-up
    meets on that group's store, whose own waits have the group's timeout (30 min): it
    polls instead, under RINGLET_INIT_TIMEOUT, and a late rank is named at the deadline
    (before, rank 0 waited for it however long it took)."""
    _torch()
    port = str(_port())
    procs = [subprocess.Popen(
        [sys.executable, str(STORE_LATE)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=_env(RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=port, RINGLET_NODE=f"host{r}", LATE="3.5",
                            RINGLET_INIT_TIMEOUT="1.5")) for r in range(2)]
    outs = [p.communicate(timeout=LIMIT) for p in procs]
    text = "".join(o + e for o, e in outs)
    reports = {r["rank"]: r for o, _ in outs for r in _reports(o)}
    assert sorted(reports) == [0, 1], text
    zero = reports[0]
    assert zero["error"] == "CommTimeoutError" and zero["seconds"] < 3, text
    assert "torch's store" in zero["message"] and "rank 1 did not arrive" in zero["message"], \
        text
    assert reports[1]["error"] is not None, text


def test_torchrun_two_nodes() -> None:
    """Two torchruns, one per node, as on two hosts (RINGLET_NODE tells them apart)."""
    _torch()
    if TORCHRUN is None:
        pytest.skip("torchrun is not installed")
    port = str(_port())
    procs = [subprocess.Popen(
        [TORCHRUN, "--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", "2",
         "--master-addr", "127.0.0.1", "--master-port", port, str(SCRIPT), "--errors"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(RINGLET_NODE=f"host{k}", EXPECT_NODES="a,a,b,b")) for k in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=LIMIT))
        finally:
            if p.poll() is None:
                p.kill()
    text = "".join(o + e for o, e in outs)
    reports = {r["rank"]: r for o, _ in outs for r in _reports(o)}
    assert sorted(reports) == [0, 1, 2, 3], text
    for r in reports.values():
        assert r["ok"] and r["nodes"] == [[0, 1], [2, 3]] and r["engine"] == "torch", (r, text)
    assert all(p.returncode == 0 for p in procs), text


def test_info_prints_the_topology() -> None:
    if MPIEXEC is None:
        pytest.skip("mpiexec is not installed")
    pytest.importorskip("mpi4py")
    code = "import ringlet; c = ringlet.init(); c.close()"
    cmd = [MPIEXEC, "-n", "2", "-env", "RINGLET_NODE", "x", sys.executable, "-c", code, ":",
           "-n", "1", "-env", "RINGLET_NODE", "y", sys.executable, "-c", code]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT,
                          env=_env(RINGLET_DEBUG="INFO"))
    assert proc.returncode == 0, proc.stderr
    assert "2 nodes (node 0: ranks 0-1; node 1: ranks 2), engine mpi" in proc.stderr, \
        proc.stderr
    assert "rank 2 of 3" in proc.stderr and "local rank 0 of 1" in proc.stderr


def test_engine_missing_is_a_config_error() -> None:
    """RINGLET_ENGINE=mpi where mpi4py cannot be imported: a ConfigError saying what to
    install (mpi4py hidden with an import hook)."""
    code = ("import sys, ringlet\n"
            "class Hide:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'mpi4py': raise ImportError('hidden')\n"
            "sys.meta_path.insert(0, Hide())\n"
            "try:\n"
            "    ringlet.init()\n"
            "except ringlet.ConfigError as e:\n"
            "    print('CONFIG', e)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=LIMIT, env=_env(RINGLET_ENGINE="mpi", RANK="0",
                                                  WORLD_SIZE="2", RINGLET_JOB_ID="abc"))
    assert "CONFIG" in proc.stdout and "mpi4py" in proc.stdout, proc.stdout + proc.stderr


_INIT_ONLY = """
import ringlet
try:
    ringlet.init()
    print("started", flush=True)
except ringlet.RingletError as exc:
    print(f"{type(exc).__name__}: {exc}", flush=True)
"""


def test_ranks_on_other_nodes_with_another_ringlet_algo_fail_at_start_up() -> None:
    """The ranks of a node compare the settings that steer the choice at their own
    start-up; RINGLET_ALGO, which steers it on every node, is compared across nodes too
    (each call failed with a MismatchError about the algorithm, naming no setting)."""
    if MPIEXEC is None:
        pytest.skip("mpiexec is not installed (pip install mpich)")
    pytest.importorskip("mpi4py", reason="mpi4py is not installed (pip install mpi4py)")
    cmd = [MPIEXEC, "-n", "1", "-env", "RINGLET_NODE", "n0", sys.executable, "-c", _INIT_ONLY,
           ":", "-n", "1", "-env", "RINGLET_NODE", "n1", "-env", "RINGLET_ALGO",
           "all_reduce:ring", sys.executable, "-c", _INIT_ONLY]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT, env=_env())
    # (mpiexec may forward the two ranks' lines run together)
    said = "ConfigError: ranks must use the same RINGLET_ALGO (they would choose different " \
        "algorithms): rank 0 has ''; rank 1 has 'all_reduce:ring'"
    assert proc.stdout.count(said) == 2 and "started" not in proc.stdout, \
        proc.stdout + proc.stderr
