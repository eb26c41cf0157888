"""The torch.distributed backend ``ringlet`` (``import ringlet.torch``), driven by torch's own
API under torchrun: every operation against its answer, async work and futures, a
subgroup, point-to-point with tags, object collectives, clear errors, and DDP trained on
ringlet and on gloo in the same job ending with the same weights
(tests/scripts/torch_backend.py).  N = 1, 2, 3, 4 on one host, and 2 emulated nodes x 2
ranks (two torchruns with different RINGLET_NODE: shared memory inside a node, gloo
between)."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from jobs import clean_env

SCRIPT = Path(__file__).parent / "scripts" / "torch_backend.py"
LIMIT = 150   # seconds any one job may take, whatever happens
_SEP = "\n<<< next launcher >>>\n"

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                reason="torch is not installed (pip install torch==2.13.0)")


def _env(**extra: str) -> dict[str, str]:
    return clean_env(**{"OMP_NUM_THREADS": "1", **extra})


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(cmds: list[list[str]], envs: list[dict[str, str]]) -> tuple[list[int], str]:
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=e, start_new_session=True) for c, e in zip(cmds, envs,
                                                                              strict=True)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=LIMIT)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
            outs.append(p.communicate()[0])
            pytest.fail(f"the job did not finish in {LIMIT} s:\n{''.join(outs)}")
    return [p.returncode for p in procs], _SEP.join(outs)


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args, str(SCRIPT)]


def _all_ok(codes: list[int], out: str, n: int) -> None:
    oks = sorted(r for r in range(n) if f"[rank {r}] ok" in out)
    if oks == list(range(n)) and all(c == 0 for c in codes):
        return
    # each launcher's output, its C++ stack frames left out (faulthandler's are kept)
    parts = out.split(_SEP)
    shown = ["\n".join(ln for ln in p.splitlines() if not ln.lstrip().startswith("frame #"))
             [-5000:] for p in parts]
    pytest.fail(f"exit codes {codes}, ranks ok {oks} of {n}:\n" + "\n=====\n".join(shown))


@pytest.mark.parametrize("n", [1, 2, 3, 4], ids=lambda n: f"N{n}")
def test_torch_api_on_ringlet(n: int) -> None:
    codes, out = _run([_torchrun("--standalone", "--nproc-per-node", str(n))], [_env()])
    _all_ok(codes, out, n)


def test_two_emulated_nodes() -> None:
    port = str(_port())
    cmds = [_torchrun("--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", "2",
                      "--master-addr", "127.0.0.1", "--master-port", port) for k in range(2)]
    codes, out = _run(cmds, [_env(RINGLET_NODE=f"host{k}") for k in range(2)])
    _all_ok(codes, out, 4)


@pytest.mark.parametrize("nodes", [1, 2], ids=["one-node", "two-nodes"])
def test_a_dead_peer_is_a_peer_error_through_torch(nodes: int) -> None:
    """A rank that dies: the others' dist.all_reduce raises ringlet's PeerError naming
    it, within seconds; on one node (shared memory) and across emulated nodes (gloo).
    The ranks are started here with torch's env:// variables, not by torchrun (which
    would stop the survivors as soon as one rank fails)."""
    port = str(_port())
    envs = [_env(RANK=str(r), WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                 RINGLET_NODE=f"host{r * nodes // 4}") for r in range(4)]
    codes, out = _run([[sys.executable, str(SCRIPT), "--dead-peer"]] * 4, envs)
    oks = sorted(r for r in range(4) if f"[rank {r}] ok" in out)
    assert oks == [0, 1, 2] and codes == [0, 0, 0, 3], \
        f"exit codes {codes}, ranks ok {oks}:\n{out[-5000:]}"


def test_registered_on_import() -> None:
    import torch.distributed as dist

    import ringlet.torch as rt

    assert "ringlet" in dist.Backend.backend_list
    assert dist.Backend("ringlet") == "ringlet"
    assert rt.BACKEND == "ringlet"


def test_handles_are_kept_until_done_with_and_no_longer() -> None:
    """torch's C++ side may hold a work whose Python part Python code dropped (Join gives
    DDP's reducer its all_reduce): the backend keeps each while its call runs and until
    it is waited for (or its future taken), then lets it go; of the finished ones nobody
    waits for, only the most recent (they hold their outputs: 200 fire-and-forget 1 MB
    all_reduces kept 200 tensors alive)."""
    import ringlet.torch as rt
    from ringlet.work import Work

    def handle() -> tuple[Work, rt._Work]:
        w = Work("test")
        return w, rt._Work(w, lambda r: [])

    rt._KEPT.clear()
    running = [handle() for _ in range(5)]            # never finished: always kept
    waited = [handle() for _ in range(5)]
    for w, h in waited:
        w._finish([])
        h.wait()
    unwaited = [handle() for _ in range(rt._UNWAITED + 20)]
    for w, _ in unwaited:
        w._finish([])
    for _ in range(16):   # a sweep comes every 16 handles made
        handle()
    kept = set(rt._KEPT)
    assert all(id(h) in kept for _, h in running)
    assert not any(id(h) in kept for _, h in waited)
    assert sum(id(h) in kept for _, h in unwaited) == rt._UNWAITED
    assert all(id(h) in kept for _, h in unwaited[-rt._UNWAITED:])   # the most recent
    assert not any(id(rt._Done([])) in rt._KEPT for _ in range(3))   # inline: not kept
    rt._KEPT.clear()


@pytest.mark.parametrize(("env", "given", "expected"), [
    ({"RINGLET_TIMEOUT": "7"}, None, 7.0),       # no timeout=: the job's RINGLET_TIMEOUT
    ({"RINGLET_TIMEOUT": "7"}, 12.0, 12.0),      # timeout= wins
    ({}, None, 1800.0),                          # neither: torch's default, 30 min
])
def test_the_groups_deadline(monkeypatch: pytest.MonkeyPatch, env: dict[str, str],
                             given: float | None, expected: float) -> None:
    """init_process_group's timeout= is every wait's deadline; without it a
    RINGLET_TIMEOUT the job sets (torch passes its 30-minute default, which used to win)."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.constants import default_pg_timeout

    import ringlet.torch as rt

    monkeypatch.delenv("RINGLET_TIMEOUT", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    timeout = default_pg_timeout if given is None else timedelta(seconds=given)
    pg = rt._create(dist.HashStore(), 0, 1, timeout)
    try:
        assert pg.comm.settings.timeout == expected
    finally:
        pg.comm.close()


@pytest.mark.parametrize("seconds", [0, -5, 30 * 86400])
def test_a_timeout_ringlet_cannot_keep_is_refused_naming_init_process_group(
        seconds: int) -> None:
    """A zero or negative timeout= was ignored (the job ran on RINGLET_TIMEOUT or the
    default), and one over a week was refused without saying where it came from."""
    from datetime import timedelta

    import torch.distributed as dist

    import ringlet
    import ringlet.torch as rt

    with pytest.raises(ringlet.ConfigError, match=r"init_process_group\(timeout=.*timeout must"):
        rt._create(dist.HashStore(), 0, 1, timedelta(seconds=seconds))


def _p2p_futures(comm: Any) -> list[Any]:
    """A point-to-point work's future, waited for on its own (as NCCL's complete): the
    message, and a receive that no message comes for fails at the deadline (both waited
    for ever, as nobody drove the operation: only wait() and is_completed() did)."""
    import threading

    import torch

    import ringlet.torch as rt

    pg = rt.ProcessGroupRinglet(comm)
    got: list[Any] = []

    def bounded(fut: Any) -> Any:
        th = threading.Thread(target=lambda: got.append(_outcome(fut)), daemon=True)
        th.start()
        th.join(10.0)
        return got.pop() if got else "hung"

    if comm.rank == 0:
        comm.barrier()   # the receive is posted before the message comes
        pg.send([torch.full((1 << 16,), 7.0)], 1, 3).wait()
        comm.barrier()
        return ["sent"]
    t = torch.empty(1 << 16)
    fut = pg.recv([t], 0, 3).get_future()
    comm.barrier()
    first = bounded(fut)
    comm.barrier()
    never = bounded(pg.recv([torch.empty(2)], 0, 4).get_future())   # nobody sends it
    return [first if isinstance(first, str) else float(first[0][0]), never]


def _outcome(fut: Any) -> Any:
    try:
        return fut.wait()
    except Exception as exc:  # noqa: BLE001 - reported
        return f"{type(exc).__name__}: {exc}"


def test_a_point_to_point_future_completes_by_itself() -> None:
    import ringlet
    from ringlet.config import Settings

    res = ringlet.spawn(_p2p_futures, 2, settings=Settings(timeout=2.0), timeout=60)
    assert res[0] == ["sent"]
    assert res[1][0] == 7.0, res
    assert "hung" not in res[1][1] and "recv from rank 0 (tag 4)" in res[1][1], res
