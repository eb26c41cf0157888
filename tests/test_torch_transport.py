"""The torch.distributed engine transport (ringlet.transport.torch), at N = 1..4.

The scripts in tests/scripts/torch_*.py build a Communicator on the transport directly
(every peer "remote": every message, agreement frame and notice goes over the private
gloo group), check everything against numpy, print one verdict per rank and exit
non-zero on failure.  Here each runs as N plain processes with the env:// variables
(MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE; rank 0 hosts the TCPStore), and once under
``torchrun --standalone`` (the agent hosts the store), with a time limit; the output is
shown when a job fails.  The machine may have fewer cores than ranks.  A few tests run
in this process (start-up errors, the native op mapping).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from jobs import clean_env

from ringlet.config import Settings
from ringlet.errors import ArgumentError, ConfigError
from ringlet.ops import DTYPES, ReduceOp

SCRIPTS = Path(__file__).parent / "scripts"
LIMIT = 90   # seconds any one job may take, whatever happens
HAVE_TORCH = importlib.util.find_spec("torch") is not None

needs_torch = pytest.mark.skipif(
    not HAVE_TORCH, reason="needs PyTorch with gloo: pip install torch==2.13.0 (CPU wheel)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(**extra: str) -> dict[str, str]:
    return clean_env(**{"OMP_NUM_THREADS": "1", **extra})


def _listening(port: int, proc: subprocess.Popen[str], seconds: float = 30.0) -> None:
    """Wait until rank 0's store listens (the others then connect at once, without the
    client's retry back-off)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end and proc.poll() is None:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)


def _job(script: str, n: int, *args: str) -> tuple[list[int], str]:
    """Run ``script`` as ranks 0..n-1 (env://); (exit codes, everyone's output)."""
    port = _free_port()
    procs: list[subprocess.Popen[str]] = []
    cmd = [sys.executable, str(SCRIPTS / script), *args]
    try:
        for r in range(n):
            procs.append(subprocess.Popen(
                cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                env=_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                         WORLD_SIZE=str(n)), start_new_session=True))
            if r == 0 and n > 1:
                _listening(port, procs[0])
        end = time.monotonic() + LIMIT
        outs = []
        for p in procs:
            try:
                out, _ = p.communicate(timeout=max(1.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(q.pid, signal.SIGKILL)
                out, _ = p.communicate()
                outs.append(out)
                pytest.fail(f"{script} {' '.join(args)} at N={n} did not finish in {LIMIT} s:\n"
                            + "\n".join(outs))
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return [p.returncode for p in procs], "".join(f"--- rank {r} ---\n{o}"
                                                  for r, o in enumerate(outs))


def _all_ok(codes: list[int], out: str, ranks: list[int], what: str) -> None:
    oks = [r for r in ranks if f"[rank {r}] ok: " in out]
    assert oks == ranks and all(codes[r] == 0 for r in ranks), (
        f"{what}: exit codes {codes}, ranks ok {oks} of {ranks}:\n{out}")


# --- jobs --------------------------------------------------------------------------------


def _torchrun(n: int, *args: str) -> tuple[int, str]:
    """``torchrun --standalone --nproc-per-node n`` of the suite: (exit code, output)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(n), str(SCRIPTS / "torch_suite.py"), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(), start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"torchrun torch_suite.py at N={n} did not finish in {LIMIT} s:\n{out}")
    return proc.returncode, out


@needs_torch
@pytest.mark.parametrize("n,how", [(1, "env"), (2, "torchrun, default group"),
                                   (3, "torchrun"), (4, "env")],
                         ids=["N1-env", "N2-torchrun-default-group", "N3-torchrun", "N4-env"])
def test_suite(n: int, how: str) -> None:
    """Every collective x every algorithm and gloo's own, p2p with tags and unexpected
    messages, the transport's messages, mismatch, a rejected call, split, bit-identical
    all_reduce, a timeout naming the absent rank (tests/scripts/torch_suite.py).

    ``env``: plain processes with the env:// variables, rank 0 hosts the TCPStore.
    ``torchrun``: the agent hosts the store, the ranks are its clients
    (TORCHELASTIC_USE_AGENT_STORE).  ``default group``: the program initialised torch's
    default group first; ringlet reuses its store, and the user's group still works at
    the end (ringlet's messages never met it)."""
    if how == "env":
        codes, out = _job("torch_suite.py", n)
        _all_ok(codes, out, list(range(n)), f"torch_suite.py at N={n}")
        return
    code, out = _torchrun(n, *(["--init-default"] if "default" in how else []))
    oks = out.count("] ok: ")
    assert code == 0 and oks == n, f"torchrun: exit code {code}, {oks} of {n} ranks ok:\n{out}"


@needs_torch
def test_messages_in_small_pieces() -> None:
    """The suite with every message over 4160 bytes sent as several gloo messages, each
    piece reduced as it arrives."""
    codes, out = _job("torch_suite.py", 3, "--pieces")
    _all_ok(codes, out, [0, 1, 2], "torch_suite.py --pieces at N=3")


@needs_torch
def test_killed_peer_mid_collective() -> None:
    """SIGKILL of rank 2 during 1 MB all_reduces: ranks 0 and 1 raise PeerError naming it
    within 10 s (gloo sees the connection close: milliseconds in practice)."""
    codes, out = _job("torch_faults.py", 3, "kill")
    assert codes[2] == -signal.SIGKILL, f"the victim was not killed: {codes}\n{out}"
    _all_ok(codes, out, [0, 1], "a killed peer")


@needs_torch
@pytest.mark.waits
def test_stopped_peer_heartbeat() -> None:
    """SIGSTOP of rank 1 (its connections stay open): rank 0 raises PeerError "rank 1 ...
    stopped answering" from the heartbeat, after STALE_S and within 10 s."""
    codes, out = _job("torch_faults.py", 2, "stop")
    assert codes[1] == -signal.SIGKILL, f"rank 0 did not kill the stopped rank: {codes}\n{out}"
    _all_ok(codes, out, [0], "a stopped peer")


@needs_torch
@pytest.mark.parametrize("limit", ["0.6", "30"])
def test_a_rank_that_holds_the_gil_is_stopped_only_past_ringlet_heartbeat_s(limit: str) -> None:
    """Rank 3 holds Python's GIL for about 2 s in one call into C, so its heartbeat thread
    cannot beat: with RINGLET_HEARTBEAT_S=30 its all_reduce across 2 emulated nodes
    succeeds everywhere (the limit was a fixed 5 s whatever the user allowed); with 0.6
    every rank raises PeerError naming rank 3 and the setting."""
    from jobs import clean_env

    proc = subprocess.run([sys.executable, "-m", "ringlet", "run", "--nodes", "2", "-n", "4",
                           "gil_hold.py"], cwd=Path(__file__).parent / "scripts",
                          capture_output=True, text=True, timeout=120,
                          env=clean_env(OMP_NUM_THREADS="1", RINGLET_HEARTBEAT_S=limit))
    said = {int(line[1]): line.split(": ", 1)[1] for line in proc.stdout.splitlines()
            if line.startswith("[") and ": " in line and "held the GIL" not in line}
    assert sorted(said) == [0, 1, 2, 3], proc.stdout + proc.stderr[-3000:]
    for r, text in said.items():
        if limit == "30":
            assert text == "ok 4", f"rank {r}: {text}"
            # and a job that went well says nothing on stderr from torch's store client
            # (start-up's waits for other ranks' keys once logged "waitForInput ... likely
            # a timeout" for every slice of the store's own wait that ended)
            assert "waitForInput" not in proc.stderr, proc.stderr[-2000:]
        else:
            assert text.startswith("PeerError: rank 3 ") and "stopped answering" in text \
                and f"RINGLET_HEARTBEAT_S={limit}" in text, f"rank {r}: {text}"


@needs_torch
@pytest.mark.waits
def test_a_rank_late_to_build_the_transport_is_named_at_the_deadline() -> None:
    """A second world() on the job's store, one rank 2 s late: gloo's constructor waited
    for it without ringlet's deadline (up to init_timeout + 30 s); the ranks now meet
    first, and rank 0 raises CommTimeoutError naming rank 1 at its 1 s deadline."""
    import json

    codes, out = _job("torch_world_late.py", 2)
    reports, dec, at = {}, json.JSONDecoder(), out.find('{"rank"')
    while at >= 0:
        obj, end = dec.raw_decode(out, at)
        reports[obj["rank"]] = obj
        at = out.find('{"rank"', end)
    zero = reports.get(0)
    assert zero is not None and zero["error"] == "CommTimeoutError", out
    assert zero["seconds"] < 1.9 and "rank 1 did not arrive" in zero["message"], out


# --- in this process ---------------------------------------------------------------------


@needs_torch
def test_world_without_launcher(monkeypatch: pytest.MonkeyPatch) -> None:
    """No env:// variables: a ConfigError naming them and saying how to start."""
    from ringlet.transport import torch as tt

    for var in tt.ENV_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match=r"MASTER_ADDR, MASTER_PORT, WORLD_SIZE are not set"
                                          r".*torchrun"):
        tt.world(Settings())
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "http")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"MASTER_PORT='http' is not an integer"):
        tt.world(Settings())
    monkeypatch.setenv("MASTER_PORT", "29500")
    monkeypatch.setenv("RANK", "2")
    with pytest.raises(ConfigError, match=r"RANK=2 and WORLD_SIZE=2 do not fit"):
        tt.env_store(Settings())


def test_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch missing: a ConfigError naming the pip command (torch imported lazily)."""
    from ringlet.transport import torch as tt

    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    with pytest.raises(ConfigError, match=r"pip install torch==2\.13\.0"):
        tt.world(Settings())


@needs_torch
def test_native_op_mapping() -> None:
    """ringlet's meaning of each op on each type, as gloo's op or an ArgumentError."""
    import torch
    import torch.distributed as dist

    from ringlet.transport.torch import _reduction, _refusal

    def mapped(dtype: str, op: ReduceOp, n: int = 4) -> tuple[object, object]:
        a = np.zeros(n, DTYPES[dtype].np_dtype)
        t, top = _reduction(torch, dist, a, op, DTYPES[dtype], "all_reduce")
        assert t.data_ptr() == a.ctypes.data, "the tensor must share the array's memory"
        return t.dtype, top

    assert mapped("bool", ReduceOp.SUM) == (torch.bool, dist.ReduceOp.MAX)      # OR
    assert mapped("bool", ReduceOp.PROD) == (torch.bool, dist.ReduceOp.MIN)     # AND
    assert mapped("float32", ReduceOp.PROD) == (torch.float32, dist.ReduceOp.PRODUCT)
    assert mapped("bfloat16", ReduceOp.SUM) == (torch.bfloat16, dist.ReduceOp.SUM)
    assert mapped("int8", ReduceOp.MAX) == (torch.int8, dist.ReduceOp.MAX)
    assert mapped("uint64", ReduceOp.BXOR) == (torch.uint8, dist.ReduceOp.BXOR)
    assert mapped("complex128", ReduceOp.SUM) == (torch.complex128, dist.ReduceOp.SUM)
    for dtype, op, words in [("uint16", ReduceOp.SUM, "no uint16 arithmetic"),
                             ("int16", ReduceOp.MAX, "no int16 arithmetic"),
                             ("complex64", ReduceOp.PROD, "SUM only"),
                             ("float32", ReduceOp.BAND, "not defined for float32"),
                             ("bfloat16", ReduceOp.MAX, "does not propagate NaN"),
                             ("float64", ReduceOp.MIN, "does not propagate NaN"),
                             ("float32", ReduceOp.AVG, "communicator sums and divides")]:
        with pytest.raises(ArgumentError, match=words):
            mapped(dtype, op)
    # what the communicator asks before a native call refuses exactly what the call would
    for name, dt in DTYPES.items():
        for op in ReduceOp:
            if op is ReduceOp.AVG:
                continue
            why = _refusal(op, name, dt.np_dtype.kind)
            try:
                mapped(name, op)
            except ArgumentError as exc:
                assert why is not None and why in str(exc), (name, op, why, exc)
            else:
                assert why is None, (name, op, why)


def test_native_wait_ends_at_the_callback_not_at_is_completed() -> None:
    """A wait for gloo's own collective ends when the completion callback runs, which
    gloo does before ``is_completed()`` turns True (here 0.05 s into the wait, and True
    only 5 s later: a wait that ended at is_completed() finds it True), and a callback
    that came before the wait started ends it at once."""
    import threading
    import types

    from ringlet.transport.torch import TorchTransport

    class Work:
        def __init__(self, fire_after: float | None) -> None:
            self.cbs: list[object] = []
            self.completed = False
            self.fired = False
            self.waited = 0
            if fire_after is not None:
                self.later(fire_after, self.fire)

        @staticmethod
        def later(seconds: float, fn: object) -> None:
            timer = threading.Timer(seconds, fn)  # type: ignore[arg-type]
            timer.daemon = True
            timer.start()

        def fire(self) -> None:
            self.fired = True
            for cb in self.cbs:
                cb(None)  # type: ignore[operator]
            self.later(5.0, lambda: setattr(self, "completed", True))

        def get_future(self) -> Work:
            return self

        def add_done_callback(self, cb: object) -> None:
            self.cbs.append(cb)
            if self.fired:
                cb(None)  # type: ignore[operator]

        def is_completed(self) -> bool:
            return self.completed

        def wait(self) -> bool:
            self.waited += 1
            return True

    # the parts of a TorchTransport that the wait uses
    t = types.SimpleNamespace(settings=Settings(timeout=20.0), _cv=threading.Condition(),
                              _events=0, check=lambda watch=None, what=None: None,
                              background=None)
    t._event = lambda: TorchTransport._event(t)  # type: ignore[arg-type]
    t._in_background = lambda waiter: TorchTransport._in_background(t, waiter)  # type: ignore[arg-type]
    t.idle = lambda seen, waiter, peers=None: TorchTransport.idle(t, seen, waiter, peers)  # type: ignore[arg-type]
    for fire_after in (0.05, None):
        work = Work(fire_after)
        if fire_after is None:
            work.fire()   # done before the wait started (is_completed() still False)
        t0 = time.monotonic()
        TorchTransport._await(t, work, "all_reduce", lambda: "all_reduce #1")  # type: ignore[arg-type]
        took = time.monotonic() - t0
        assert work.waited == 1
        # (a loaded machine may run the 0.05 s timer late: what tells the two apart is
        # whether is_completed() had turned True)
        assert not work.completed, f"the wait ended {took:.3f} s in, not at the callback"


def test_end_lanes_gives_up_once_no_connection_is_left_to_close() -> None:
    """A lane still inside a gloo wait after every connection of its group was closed
    (the dead peer's, and those of survivors that exited) is one gloo never ends: closing
    gives up after a moment instead of its whole budget (a survivor's exit took 12 s:
    2 s at close and 5 s per group at exit, past ringlet run's 3 s grace)."""
    from types import SimpleNamespace

    from ringlet.transport.torch import TorchTransport

    class StuckLane:
        joined = 0.0

        def alive(self) -> bool:
            return True

        def join(self, seconds: float) -> None:
            StuckLane.joined += seconds
            time.sleep(seconds)

    kills: list[int] = []

    def kill() -> bool:   # every connection is closed already: nothing times out
        kills.append(1)
        return False

    fake = SimpleNamespace(_pg=object(), _lanes={(1, 0, 0): StuckLane()}, _kill=kill)
    t0 = time.monotonic()
    assert TorchTransport._end_lanes(fake, 5.0) is False   # type: ignore[arg-type]
    assert time.monotonic() - t0 < 1.5 and len(kills) == 2
    assert fake._pg is not None   # the group is kept: a lane may still hold it
