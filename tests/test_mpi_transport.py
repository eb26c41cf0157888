"""The MPI engine transport (ringlet.transport.mpi) under mpiexec, at N = 1..5.

The scripts in tests/scripts/mpi_*.py build a Communicator on the transport directly
(every peer "remote", so every message, agreement frame and notice goes over MPI),
check everything against numpy, print one verdict per rank and exit non-zero on
failure; here each runs under ``mpiexec -n N`` with a timeout, and its output is shown
when it fails.  The machine may have fewer cores than ranks: MPICH oversubscribes
without being told.  A few pure tests need no MPI at all.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from jobs import clean_env

from ringlet.errors import ConfigError
from ringlet.ops import DTYPES, ReduceOp
from ringlet.transport import mpi as tm
from ringlet.transport import torch as tt

SCRIPTS = Path(__file__).parent / "scripts"
BIN = Path(sys.executable).parent
MPIEXEC = shutil.which("mpiexec", path=str(BIN)) or shutil.which("mpiexec")
HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None
LIMIT = 90   # seconds any one job may take, whatever happens

needs_mpi = pytest.mark.skipif(
    MPIEXEC is None or not HAVE_MPI4PY,
    reason="needs mpi4py and mpiexec: pip install 'ringlet[mpi]' (mpi4py and the mpich wheel)")


def _env() -> dict[str, str]:
    return clean_env(OMP_NUM_THREADS="1")


def _mpiexec(script: str, n: int, *args: str) -> str:
    """Run ``script`` on ``n`` ranks; fail with its output unless every rank said ok."""
    cmd = [str(MPIEXEC), "-n", str(n), sys.executable, str(SCRIPTS / script), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(), start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd[-2 - len(args):])} -n {n} did not finish in {LIMIT} s:\n"
                    f"{out}")
    oks = out.count("] ok: ")
    assert proc.returncode == 0 and oks == n, (
        f"{script} {' '.join(args)} at N={n}: exit code {proc.returncode}, {oks} of {n} "
        f"ranks ok:\n{out}")
    return out


# --- under mpiexec -------------------------------------------------------------------------


@needs_mpi
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5], ids=lambda n: f"N{n}")
def test_collectives_native_p2p_and_messages(n: int) -> None:
    """Every collective x every algorithm and MPI's own, p2p, the transport's messages."""
    _mpiexec("mpi_suite.py", n)


@needs_mpi
def test_messages_in_small_pieces() -> None:
    """The same with every message over 4160 bytes split in pieces (reduce on arrival)."""
    _mpiexec("mpi_suite.py", 3, "--pieces")


@needs_mpi
@pytest.mark.parametrize("n", [2, 3, 4, 5], ids=lambda n: f"N{n}")
@pytest.mark.waits
def test_errors_reach_every_rank(n: int) -> None:
    """Mismatch, a rejected call, split, a peer that closed, a timeout naming the rank."""
    _mpiexec("mpi_errors.py", n)


@needs_mpi
@pytest.mark.waits
def test_split_whose_member_gave_up_ends_on_every_rank() -> None:
    """A split's first member times out before its last comes: the others must not
    build the group without it (they waited in MPI_Comm_create_group for ever), but
    raise naming it, and every rank's communicator is broken."""
    _mpiexec("mpi_split_late.py", 3)


@needs_mpi
@pytest.mark.waits
def test_a_rank_late_to_build_the_transport_times_out_on_every_rank() -> None:
    """Building the MPI transport duplicates the communicator: MPI_Comm_dup waited for a
    late rank however long it took.  Now polled under the deadline: rank 0 raises at 1 s
    and stays, and rank 1, 2.5 s late, raises at its own deadline instead of waiting for
    rank 0 in the construction's next collective."""
    import json

    cmd = [str(MPIEXEC), "-n", "2", sys.executable, str(SCRIPTS / "mpi_world_late.py")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT, env=_env())
    out = proc.stdout + proc.stderr
    reports, dec, at = {}, json.JSONDecoder(), proc.stdout.find('{"rank"')
    while at >= 0:   # mpiexec may join the ranks' lines
        obj, end = dec.raw_decode(proc.stdout, at)
        reports[obj["rank"]] = obj
        at = proc.stdout.find('{"rank"', end)
    assert sorted(reports) == [0, 1], out
    for r in reports.values():
        assert r["error"] == "CommTimeoutError" and r["seconds"] < 2.5, out
        assert "duplicating the communicator" in r["message"] or \
            "meeting on the new communicator" in r["message"], out


# --- without MPI ---------------------------------------------------------------------------


def test_missing_mpi4py_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mpi4py", None)   # import mpi4py -> ImportError
    with pytest.raises(ConfigError, match=r"pip install 'ringlet\[mpi\]'.*mpi4py mpich"):
        tm.world()


def test_thread_levels_below_serialized_are_refused() -> None:
    fake = types.SimpleNamespace(THREAD_SINGLE=0, THREAD_FUNNELED=1, THREAD_SERIALIZED=2,
                                 THREAD_MULTIPLE=3, Query_thread=lambda: 1)
    with pytest.raises(ConfigError, match="MPI_THREAD_FUNNELED.*SERIALIZED"):
        tm._check_threads(fake)
    for level in (2, 3):
        fake.Query_thread = lambda level=level: level
        tm._check_threads(fake)


@pytest.mark.parametrize("mod", [tm, tt], ids=["mpi", "torch"])
def test_pieces_cover_a_message_once_and_split_no_element(mod: types.ModuleType) -> None:
    """The engine transports' pieces (base.pieces with the module's PIECE_BYTES)."""
    tm = mod
    assert tm._pieces(0) == []
    p = tm.PIECE_BYTES
    assert p % 64 == 0
    for nbytes in (1, p - 1, p, p + 1, 3 * p + 17):
        pieces = tm._pieces(nbytes)
        assert pieces[0][0] == 0 and pieces[-1][1] == nbytes
        assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:], strict=False))
        assert all(hi - lo == p for lo, hi in pieces[:-1])


def test_builtin_ops_only_where_they_compute_ringlets_op() -> None:
    names = ("SUM", "PROD", "MIN", "MAX", "BAND", "BOR", "BXOR", "LAND", "LOR", "LXOR")
    fake = types.SimpleNamespace(**{n: n for n in names})
    got = {(op, d): tm._builtin(fake, op, DTYPES[d]) for d in ("bool", "int8", "uint64",
                                                               "float32", "complex64",
                                                               "bfloat16")
           for op in ReduceOp if op is not ReduceOp.AVG}
    # bool: numpy's add is OR, multiply and min AND, max OR
    assert [got[op, "bool"] for op in (ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MIN,
                                       ReduceOp.MAX, ReduceOp.BXOR)] == \
        ["LOR", "LAND", "LAND", "LOR", "LXOR"]
    assert got[ReduceOp.BXOR, "uint64"] == "BXOR" and got[ReduceOp.SUM, "int8"] == "SUM"
    # numpy's min/max propagate NaN (C's comparisons do not); complex products and
    # bfloat16 take ringlet's own kernels
    assert got[ReduceOp.MIN, "float32"] is None and got[ReduceOp.SUM, "float32"] == "SUM"
    assert got[ReduceOp.PROD, "complex64"] is None and got[ReduceOp.SUM, "complex64"] == "SUM"
    assert all(got[op, "bfloat16"] is None for op in (ReduceOp.SUM, ReduceOp.MAX))


def test_deliver_hands_over_whole_elements_across_any_cut() -> None:
    """base.deliver, as the engine transports use it: parts of several types, bytes
    arriving in cuts that split elements; every element copied (or reduced) once."""
    from ringlet.transport import base

    rng = np.random.default_rng(0)
    src = [np.arange(5, dtype=np.uint8), np.arange(7, dtype=np.float64) + 0.5,
           np.arange(3, dtype=np.int32) - 9, np.arange(11, dtype=np.complex64)]
    buf = np.concatenate([a.view(np.uint8) for a in src])
    for reduce in (False, True):
        parts = [np.ones_like(a) for a in src]
        cuts = sorted({int(c) for c in rng.integers(1, buf.size, 9)} | {buf.size})
        pos = 0
        for upto in cuts:
            pos = base.deliver(parts, buf, pos, upto,
                               (lambda d, s: np.add(d, s, out=d)) if reduce else None)
        assert pos == buf.size
        for got, a in zip(parts, src, strict=True):
            assert np.array_equal(got, a + 1 if reduce else a), (got, a)
