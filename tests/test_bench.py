"""ringlet bench: sizes, bus factors, data and checks, the timing loop, the table, the CLI,
the peers (gloo, MPI) and what happens when they are missing, fail or hang."""

from __future__ import annotations

import io
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ringlet.bench import core, peers, report
from ringlet.bench.core import (
    COLLECTIVES,
    IN,
    OUT,
    Data,
    Job,
    Row,
    Timing,
    cases,
    layout,
    measure,
    parse_bytes,
    sweep,
    sweep_sizes,
)
from ringlet.cli import main
from ringlet.errors import ArgumentError
from ringlet.ops import ReduceOp

# --- sizes and conventions ---------------------------------------------------------------------


@pytest.mark.parametrize("text, value", [
    ("8", 8), ("4096", 4096), ("1K", 1024), ("64M", 64 << 20), ("1G", 1 << 30),
    ("64MiB", 64 << 20), ("2k", 2048)])
def test_parse_bytes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1X", "-8", "1.5"])
def test_parse_bytes_rejects(text: str) -> None:
    with pytest.raises(ArgumentError, match="is not a byte count; write e.g. 8, 4096, 1K"):
        parse_bytes(text)


def test_sweep_sizes() -> None:
    assert sweep_sizes(8, 64 << 20, 4)[:3] == [8, 32, 128]
    assert sweep_sizes(8, 64 << 20, 4)[-2:] == [32 << 20, 64 << 20]   # -e always measured
    assert sweep_sizes(8, 64 << 20, 8)[-2:] == [16 << 20, 64 << 20]
    assert sweep_sizes(8, 64 << 20, 2) == [8 << k for k in range(24)]
    assert sweep_sizes(16 << 20, 16 << 20, 2) == [16 << 20]
    with pytest.raises(ArgumentError, match="is below -b/--minbytes"):
        sweep_sizes(64, 8, 2)
    with pytest.raises(ArgumentError, match="stepfactor must be at least 2"):
        sweep_sizes(8, 64, 1)
    with pytest.raises(ArgumentError, match="at least 1 byte"):
        sweep_sizes(0, 64, 2)


def test_cases_round_to_elements_and_blocks() -> None:
    ar, ag = COLLECTIVES["all_reduce"], COLLECTIVES["all_gather"]
    assert cases(ar, [8, 10, 64], 4, 3) == [(8, 2), (64, 16)]       # 10 B -> 8 B, seen
    assert cases(ar, [1], 8, 2) == [(8, 1)]                         # at least one element
    # per rank: size = count * n * itemsize, the whole output (nccl-tests)
    assert cases(ag, [8, 16, 64], 4, 4) == [(16, 1), (64, 4)]
    assert cases(COLLECTIVES["all_to_all"], [96], 4, 3) == [(96, 8)]


@pytest.mark.parametrize("coll, n, factor", [
    ("all_reduce", 4, 1.5), ("all_reduce", 2, 1.0), ("all_gather", 4, 0.75),
    ("reduce_scatter", 8, 0.875), ("all_to_all", 2, 0.5), ("broadcast", 8, 1.0),
    ("reduce", 8, 1.0), ("scatter", 4, 0.75), ("gather", 4, 0.75), ("sendrecv", 2, 1.0),
    ("all_reduce", 1, 0.0)])
def test_bus_factors(coll: str, n: int, factor: float) -> None:
    assert COLLECTIVES[coll].bus_factor(n) == pytest.approx(factor)


def test_every_collective_has_every_implementation() -> None:
    from ringlet.bench import gloo, mpi, suite

    assert set(suite.SUITE) == set(COLLECTIVES) == set(gloo.GLOO) == set(mpi.MPI_SUITE)
    assert set(gloo.FORMS) == set(mpi.FORMS) == set(COLLECTIVES)


# --- data, references and the check ------------------------------------------------------------


@pytest.mark.parametrize("dtype, op", [
    ("float32", "sum"), ("float16", "sum"), ("float64", "prod"), ("int8", "sum"),
    ("uint8", "max"), ("int32", "bxor"), ("bool", "sum"), ("complex64", "prod"),
    ("float32", "avg"), ("int64", "min")])
def test_references_match_numpy(dtype: str, op: str) -> None:
    n, start, count = 5, 4097, 9000   # across the period's wrap-around
    d = Data(dtype, op, n)
    stack = np.stack([d.input(r, start, count) for r in range(n)])
    from ringlet.ops import reference_reduce

    want = reference_reduce(stack, ReduceOp.parse(op))
    assert d.reduced(start, count).dtype == np.dtype(dtype)
    assert d.wrong(d.reduced(start, count), want) == 0
    assert d.wrong(d.poison(want), want) == count          # poison differs everywhere
    assert not np.array_equal(d.input(0, 0, 64), d.input(1, 0, 64))  # ranks differ


@pytest.mark.parametrize("dtype, op, n", [
    ("bfloat16", "sum", 2), ("bfloat16", "none", 2), ("bfloat16", "max", 3),
    ("bfloat16", "avg", 3), ("float16", "prod", 14),
    ("complex64", "sum", 2)])
def test_poison_is_wrong_everywhere(dtype: str, op: str, n: int) -> None:
    """Outputs are filled with values the check counts as wrong, every one of them
    (bfloat16's tolerance took ``expected + 1``, one unit in the last place, as right;
    float16 rounds 2048 + 1 back to 2048)."""
    d = Data(dtype, op, n)
    want = d.input(0, 0, core.PERIOD) if op == "none" else d.reduced(0, core.PERIOD)
    assert d.wrong(d.poison(want), want) == core.PERIOD


def test_bfloat16_moves_are_checked_exactly() -> None:
    """Only bfloat16 sums and averages round: a value one unit off elsewhere is wrong."""
    for op in ("none", "max", "prod"):
        d = Data("bfloat16", op, 2)
        want = d.input(1, 0, 64) if op == "none" else d.reduced(0, 64)
        assert d.wrong(want + np.int16(1), want) == 64
        assert d.wrong(want.copy(), want) == 0


def test_a_bfloat16_call_that_does_nothing_is_wrong_everywhere() -> None:
    pytest.importorskip("torch")

    def noop(ctx: None, a: dict[str, Any], form: str) -> Callable[[], object]:
        return lambda: None

    for coll, op in (("all_reduce", "sum"), ("all_gather", "none")):
        rows = sweep(noop, None, _job(coll, dtype="bfloat16", op=op), 0, (OUT,), OneRank())
        assert [r.forms[OUT].wrong for r in rows] == [16, 1024]


def test_float_sums_are_exact_at_large_sizes() -> None:
    d = Data("float16", "sum", 64)
    got = d.tables.astype(np.float64).sum(axis=0)
    assert np.array_equal(d.reduced(0, core.PERIOD).astype(np.float64), got)


class OneRank:
    """A Sync for one rank: nothing to wait for, nothing to reduce."""

    def __init__(self) -> None:
        self.barriers = 0

    def barrier(self) -> None:
        self.barriers += 1

    def max(self, value: float) -> float:
        return value

    def sum(self, value: int) -> int:
        return value


def _job(coll: str = "all_reduce", **kw: object) -> Job:
    base: dict[str, object] = dict(collective=coll, nranks=1, dtype="float32", op="sum",
                                   root=0, cases=((64, 16), (4096, 1024)), warmup=1, iters=3,
                                   budget=1.0, check=True)
    base.update(kw)
    return Job(**base)  # type: ignore[arg-type]


def test_sweep_counts_wrong_elements() -> None:
    """A call that does nothing leaves the poisoned output: every element is wrong."""

    def noop(ctx: None, a: dict[str, np.ndarray | None], form: str) -> Callable[[], object]:
        return lambda: None

    def copy(ctx: None, a: dict[str, np.ndarray | None], form: str) -> Callable[[], object]:
        x, y = a["x"], a.get("y")
        return (lambda: None) if y is None or x is None else (lambda: np.copyto(y, x))

    rows = sweep(noop, None, _job(), 0, (OUT, IN), OneRank())
    assert [r.forms[OUT].wrong for r in rows] == [16, 1024]
    assert [r.forms[IN].wrong for r in rows] == [0, 0]   # one rank: the input is the answer
    rows = sweep(copy, None, _job(), 0, (OUT,), OneRank())
    assert [r.forms[OUT].wrong for r in rows] == [0, 0]
    assert all(r.forms[OUT].iters == 3 for r in rows)
    rows = sweep(copy, None, _job(check=False), 0, (OUT,), OneRank())
    assert rows[0].forms[OUT].wrong is None


def test_layout_of_rooted_and_blocked_collectives() -> None:
    job = _job("scatter", nranks=3, root=2)
    d = Data("int32", "none", 3)
    at_root, other = layout(job, d, 2, 4, OUT), layout(job, d, 0, 4, OUT)
    assert at_root.arrays["x"] is not None and at_root.arrays["x"].shape == (12,)
    assert other.arrays["x"] is None
    assert np.array_equal(other.expected["y"](), d.input(2, 0, 4))
    ag = layout(_job("all_to_all", nranks=3, op="none"), d, 1, 4, OUT)
    want = np.concatenate([d.input(j, 4, 4) for j in range(3)])
    assert np.array_equal(ag.expected["y"](), want)
    red = layout(_job("reduce", nranks=3, root=1, op="sum"), Data("int32", "sum", 3), 0, 4, IN)
    assert "x" not in red.expected                       # only the root is checked


def test_measure_warms_up_and_fits_the_budget() -> None:
    calls: list[float] = []

    def call() -> None:
        calls.append(time.perf_counter())
        time.sleep(0.01)

    sync = OneRank()
    seconds, iters = measure(call, sync, _job(warmup=3, iters=100, budget=0.05))
    assert 1 <= iters <= 6 and seconds == pytest.approx(0.01, rel=0.9)
    assert len(calls) <= 3 + 6 and sync.barriers == 3
    calls.clear()
    _, iters = measure(call, OneRank(), _job(warmup=0, iters=4, budget=0.001))
    assert iters == 4 and len(calls) == 4       # no warm-up: exactly --iters, no budget
    _, iters = measure(lambda: time.sleep(0.03), OneRank(), _job(warmup=2, iters=9, budget=0.01))
    assert iters == 1                           # at least one timed call


# --- the table, JSON, plot ---------------------------------------------------------------------


def _result(wrong: int = 0, peer_error: str | None = None) -> report.Result:
    job = _job("all_reduce", nranks=4, cases=((8, 2), (1 << 20, 1 << 18)))
    rows = [Row(8, 2, {OUT: Timing(10.0, 20, 0), IN: Timing(8.0, 20, 0)}),
            Row(1 << 20, 1 << 18, {OUT: Timing(1000.0, 5, wrong), IN: Timing(500.0, 5, 0)})]
    mpi = peers.PeerRun("mpi", "MPICH 5", OUT, "mpi4py Comm.Allreduce",
                        [Row(8, 2, {OUT: Timing(5.0, 20, 0)}),
                         Row(1 << 20, 1 << 18, {OUT: Timing(2000.0, 5, 0)})])
    gloo = peers.PeerRun("gloo", error=peer_error) if peer_error else peers.PeerRun(
        "gloo", "torch gloo", IN, "torch.distributed.all_reduce",
        [Row(8, 2, {IN: Timing(400.0, 20, 0)})])
    return report.Result(job, rows, ["recursive_doubling", "ring"], [gloo, mpi], "ringlet bench")


def test_table_columns_and_values() -> None:
    text = report.table(_result())
    lines = text.splitlines()
    names = next(line for line in lines if "#wrong" in line and "algorithm" in line)
    for col in ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
                "algorithm", "ratio"):
        assert col in names
    assert "out-of-place" in text and "in-place" in text and "gloo (in-place)" in text
    assert "ratio = peer time / ringlet time" in text and "> 1 means ringlet is faster" in text
    assert "busbw = algbw * 2(n-1)/n" in text
    big = next(line for line in lines if line.lstrip().startswith(str(1 << 20)))
    cells = big.replace("|", " ").split()
    # size count type redop root | out: time algbw busbw wrong | in: ... | algo | gloo | mpi
    assert cells[:5] == [str(1 << 20), str(1 << 18), "float32", "sum", "-1"]
    assert cells[5:9] == ["1000.00", "1.05", "1.57", "0"]   # 1 MiB / 1 ms; * 2*3/4
    assert cells[9:13] == ["500.00", "2.10", "3.15", "0"]
    assert cells[13] == "ring"
    assert cells[14:17] == ["-", "-", "-"]                   # gloo did not measure 1 MiB
    assert cells[17:20] == ["2000.00", "0.79", "2.00"]       # mpi vs ringlet out-of-place
    small = next(line for line in lines if line.lstrip().startswith("8 "))
    assert small.replace("|", " ").split()[14:17] == ["400.00", "0.00", "50.00"]  # vs in-place
    assert "# #wrong in total: 0  OK" in text
    assert "# ratio vs mpi: geometric mean 1.00, from 0.50 to 2.00" in text


def test_table_flags_wrong_values_and_failed_peers() -> None:
    res = _result(wrong=3, peer_error="rank 1 failed (exit code 1): ValueError: boom\n  [rank 1] x")
    text = report.table(res)
    assert "# #wrong in total: 3  FAILED" in text
    assert "#   gloo: not measured: rank 1 failed (exit code 1): ValueError: boom" in text
    assert "# gloo was not (fully) measured:" in text and "#     [rank 1] x" in text
    assert res.failed()
    assert not _result().failed()


def test_table_marks_missing_forms() -> None:
    job = _job("all_gather", nranks=2, op="none", cases=((8, 1),), check=False)
    res = report.Result(job, [Row(8, 1, {OUT: Timing(5.0, 3, None)})], ["ring"])
    text = report.table(res)
    row = [line for line in text.splitlines() if not line.startswith("#")][0]
    assert row.split()[5:13] == ["5.00", "0.00", "0.00", "n/a", "n/a", "n/a", "n/a", "n/a"]
    assert "in-place: n/a, ringlet's all_gather has no such form" in text
    assert "# #wrong in total: n/a" in text


def test_json_and_plot(tmp_path: Path) -> None:
    d = report.to_json(_result(), ["ringlet", "bench"])
    assert d["bus_factor"] == {"formula": "2(n-1)/n", "value": 1.5}
    row = d["rows"][1]
    assert row["out-of-place"]["busbw"] == pytest.approx((1 << 20) / 1e6 * 1.5)
    assert row["mpi"]["ratio"] == pytest.approx(2.0) and row["gloo"] is None
    assert d["peers"]["mpi"]["form"] == "out-of-place" and d["wrong"] == 0
    json.dumps(d)  # serialisable
    pytest.importorskip("matplotlib")
    report.write_plot(_result(), str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_progress_bar_only_on_a_terminal() -> None:
    from ringlet.progress import Progress, callback

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    p = Progress(2, "ringlet bench", "sizes", stream=out)
    p.step("ringlet 8 B")
    p.close()
    assert "ringlet bench: 1/2 sizes [" in out.getvalue()
    assert "(ringlet 8 B)" in out.getvalue() and out.getvalue().endswith("\r\033[K")
    quiet = io.StringIO()   # not a terminal: nothing drawn
    p = Progress(2, "ringlet bench", "sizes", stream=quiet)
    p.step("x")
    p.close()
    assert quiet.getvalue() == "" and callback("sim", stream=quiet) is None
    off = Tty()             # -q on a terminal
    p = Progress(2, "ringlet bench", "sizes", enabled=False, stream=off)
    p.step("x")
    p.close()
    assert off.getvalue() == ""
    show = callback("simulate ring", "rounds", stream=out)
    assert show is not None
    show(5, 10)
    assert "simulate ring: 5/10 rounds [##############" in out.getvalue()


# --- the command -------------------------------------------------------------------------------

TINY = ["-n", "2", "-b", "8", "-e", "4K", "-f", "8", "--iters", "2", "--warmup", "1", "-q"]


def _rows(out: str) -> list[list[str]]:
    return [line.replace("|", " ").split() for line in out.splitlines()
            if line and not line.startswith("#")]


@pytest.mark.parametrize("coll, extra", [
    ("all_reduce", []), ("reduce_scatter", ["--op", "max", "--dtype", "int16"]),
    ("broadcast", ["--root", "1"]), ("sendrecv", [])])
def test_real_run(coll: str, extra: list[str], capsys: pytest.CaptureFixture[str],
                  tmp_path: Path) -> None:
    path = tmp_path / "b.json"
    assert main(["bench", coll, *TINY, *extra, "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"# ringlet bench {coll}: 2 ranks" in out and "#wrong" in out
    rows = _rows(out)
    assert [int(r[0]) for r in rows] == [s for s, _ in json.loads(path.read_text())["job"]
                                         ["cases"]]
    for r in rows:
        assert all(r[i] in ("0", "n/a") for i in (8, 12)), r    # #wrong columns
    d = json.loads(path.read_text())
    assert d["wrong"] == 0 and d["environment"]["cores"] >= 1
    assert d["command"].startswith(f"ringlet bench {coll} -n 2 -b 8 -e 4K -f 8")
    for r in d["rows"]:
        for form in ("out-of-place", "in-place"):
            if r[form] is not None:
                assert r[form]["wrong"] == 0 and r[form]["iters"] >= 1


@pytest.mark.parametrize("coll, extra", [
    ("all_to_all", ["-w", "2", "-c", "1", "-d", "bfloat16"]),
    ("all_reduce", ["-o", "avg", "-d", "bfloat16"]),
    ("reduce", ["-o", "max", "-r", "1", "-d", "float16", "-c", "1"])])
def test_nccl_tests_flags_and_half_types(coll: str, extra: list[str],
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """nccl-tests' short flags (-w -c -d -o -r) and the 16-bit floats, checked."""
    if extra[-1] == "bfloat16":
        pytest.importorskip("torch")
    assert main(["bench", coll, *TINY, *extra]) == 0
    out = capsys.readouterr().out
    assert "# #wrong in total: 0  OK" in out
    assert all(r[2] == extra[extra.index("-d") + 1] for r in _rows(out))


def test_c_takes_0_or_1(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "all_reduce", "-c", "2"])
    assert "-c takes 0 or 1, got '2'" in capsys.readouterr().err


def test_c_0_turns_the_check_off(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "all_gather", *TINY, "-e", "64", "-c", "0"]) == 0
    assert all(r[8] == "n/a" for r in _rows(capsys.readouterr().out))


@pytest.mark.parametrize("flags", [["-c", "0", "--check"], ["--check", "-c", "0"],
                                   ["--no-check", "-c", "1"]])
def test_c_and_check_are_one_or_the_other(flags: list[str],
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """The last of them won, whatever the other said."""
    with pytest.raises(SystemExit) as exc:
        main(["bench", "all_gather", *TINY, *flags])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_shared_buffers(capsys: pytest.CaptureFixture[str]) -> None:
    """--buffers shared: ringlet's buffers from comm.empty, one pool reused by every row."""
    assert main(["bench", "all_reduce", *TINY, "-e", "64K", "--buffers", "shared"]) == 0
    out = capsys.readouterr().out
    assert "ringlet's buffers: shared memory from comm.empty" in out
    assert "# #wrong in total: 0  OK" in out and len(_rows(out)) == 6   # 8 B .. 32K, 64K


def test_vs_peers(capsys: pytest.CaptureFixture[str]) -> None:
    if peers.missing("gloo") or peers.missing("mpi"):
        pytest.skip("the peers extra is not installed")
    assert main(["bench", "all_reduce", *TINY, "-e", "64", "--vs", "gloo,mpi"]) == 0
    out = capsys.readouterr().out
    assert "gloo (in-place)" in out and "mpi (out-of-place)" in out
    assert "#   mpi: MPICH" in out and "torch.distributed.all_reduce" in out
    for r in _rows(out):
        assert len(r) == 20 and all(x != "-" for x in r), r      # every peer cell measured
        assert float(r[16]) > 0 and float(r[19]) > 0             # ratios
    assert "# #wrong in total: 0  OK" in out


def test_help_lists_every_op_the_bench_takes(capsys: pytest.CaptureFixture[str]) -> None:
    from ringlet.bench.cli import BENCH_OPS
    from ringlet.ops import ReduceOp

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "reduction: sum prod min max avg band bor bxor land lor lxor " in text
    assert set(BENCH_OPS) == {op.name.lower() for op in ReduceOp} - {"minloc", "maxloc"}


@pytest.mark.parametrize("argv, message", [
    (["allreduce"], "unknown collective 'allreduce'; ringlet bench measures all_reduce"),
    (["all_reduce", "-b", "1X"], "-b/--minbytes '1X' is not a byte count"),
    (["all_reduce", "-n", "0"], "-n/--nranks must be at least 1"),
    (["sendrecv", "-n", "1"], "sendrecv is a ping-pong between rank pairs"),
    (["all_reduce", "--dtype", "bfloat16x"], "--dtype 'bfloat16x' is not one of bool"),
    (["all_reduce", "-d", "bfloat16", "--vs", "gloo"], "bfloat16 is measured for ringlet only"),
    (["all_reduce", "--op", "avg", "--dtype", "int32"], "AVG is defined for floating"),
    (["all_reduce", "--op", "nope"], "unknown reduction op 'nope'"),
    # it said to make pairs with ringlet.pairs(...), which a bench user cannot call
    (["all_reduce", "-o", "maxloc"], "-o/--op maxloc: ringlet bench does not measure MINLOC "
                                     "or MAXLOC .*; use one of sum, .*, land, lor, lxor$"),
    (["broadcast", "--root", "2"], "--root 2 is not a rank of 2"),
    (["all_reduce", "--algo", "nope"], "--algo nope: all_reduce has no algorithm 'nope'"),
    (["all_reduce", "--iters", "0"], "--iters must be at least 1"),
    (["all_reduce", "--budget", "0"], "--budget must be a positive number"),
    (["all_reduce", "-e", "1000G"], "need about .* of memory"),
    (["all_reduce", "--vs", "nccl"], "--vs: unknown peer 'nccl'"),
    (["all_reduce", "--vs", ""], "--vs: name at least one peer"),   # ran with no peer
    (["all_reduce", "--op", "avg", "--vs", "gloo"], "gloo has no AVG reduction"),
    (["all_reduce", "--json", "/nonexistent/dir/x.json"], "directory /nonexistent/dir does not"),
    (["gather", "--buffers", "shared"], "--buffers shared: gather's buffers differ"),
    # checked before the sweep, which then could not write its result (a traceback)
    (["all_reduce", "--json", "/tmp"], "--json /tmp: is a directory"),
    (["all_reduce", "--plot", "x.txt"], "--plot x.txt: give a file name ending in .png"),
    (["all_reduce", "--timeout", "inf"], "--timeout must be a number of seconds from 0"),
    (["all_reduce", "--timeout", "1e300"], "--timeout must be a number of seconds from 0"),
])
def test_bad_arguments(argv: list[str], message: str,
                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ringlet bench: ")
    assert re.search(message, err), err


def test_too_many_ranks_for_the_memory_are_refused_before_starting() -> None:
    """Every rank holds every rank's input pattern, and is a process: -n 100000 was
    let through and ran out of open files forking them (a traceback, after a wait).
    make_job, not main: without the check, main would start the ranks."""
    from ringlet.bench.cli import make_job, parse

    with pytest.raises(ArgumentError, match="100000 ranks at 8 B need about .* of memory"):
        make_job(parse(["all_reduce", "-n", "100000", "-b", "8", "-e", "8"]))
    make_job(parse(["all_reduce", "-n", "64", "-b", "8", "-e", "64M"]))   # still fine


def test_a_run_that_fails_exits_1_not_the_usage_errors_2(
        capsys: pytest.CaptureFixture[str]) -> None:
    """A timeout is a failed run (exit code 1); 2 is for arguments, as --help says."""
    assert main(["bench", "all_reduce", "-n", "2", "-b", "8", "-e", "8M", "-q",
                 "--timeout", "0.05"]) == 1
    assert "timed out after 0.05 s" in capsys.readouterr().err


def test_a_rank_killed_inside_its_progress_put_does_not_hang_the_bench(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank killed at the timeout while it put a size on the progress queue keeps the
    queue's write lock for good: ``run_ringlet`` then waited forever to put its own stop
    message (a CI run hung there, in the test above)."""
    import threading

    import ringlet.launch
    from ringlet.bench.cli import make_job, parse, run_ringlet
    from ringlet.config import Settings
    from ringlet.progress import Progress

    def killed_holding_the_lock(fn: object, n: int, job: str, q: Any, **kw: object) -> None:
        q.put(8)                 # a size, then a put that never ends
        q._wlock.acquire()
        raise ringlet.SpawnError("rank 0 was killed", {0: "killed"})

    monkeypatch.setattr(ringlet.launch, "spawn", killed_holding_the_lock)
    job = make_job(parse(["all_reduce", "-n", "2", "-e", "8"]))
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            run_ringlet(job, Settings.from_env(), 5.0, Progress(1, "t", "sizes", False))
        except BaseException as exc:  # noqa: BLE001 - looked at below
            outcome.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "run_ringlet hung on the progress queue"
    assert len(outcome) == 1 and isinstance(outcome[0], ringlet.SpawnError), outcome


def test_a_result_that_cannot_be_written_is_one_line_not_a_traceback(
        capsys: pytest.CaptureFixture[str]) -> None:
    """What the checks before the sweep cannot see (a full disk, a read-only file
    system) fails the write after it: one line and exit code 1 (an OSError traceback before)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    assert main(["bench", "all_reduce", "-n", "1", "-e", "8", "-q", "--json",
                 "/dev/full"]) == 1
    err = capsys.readouterr().err
    assert err == "ringlet bench: --json /dev/full: cannot write it: No space left on device\n"
    assert main(["simulate", "all_reduce", "--bytes", "1MB", "--ranks", "8", "--bandwidth",
                 "10GB/s", "--trace", "/dev/full"]) == 1
    assert "ringlet simulate: --trace /dev/full: cannot write it: No space left on device" \
        in capsys.readouterr().err


@pytest.mark.parametrize("option, name", [("--json", "r.json"), ("--plot", "r.png")])
def test_a_read_only_file_is_refused_before_the_sweep(
        option: str, name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """It passed the checks, the sweep ran, and the write failed after it (exit 1)."""
    import subprocess

    if option == "--plot":
        pytest.importorskip("matplotlib")
    f = tmp_path / name
    f.write_text("{}")
    f.chmod(0o444)
    immutable = False
    if os.access(f, os.W_OK):   # root writes a read-only file; not an immutable one
        immutable = subprocess.run(["chattr", "+i", str(f)], capture_output=True,
                                   check=False).returncode == 0
        if not immutable or os.access(f, os.W_OK):
            pytest.skip("no file here that this user cannot write")
    try:
        assert main(["bench", "all_reduce", "-n", "1", "-e", "8", "-q", option,
                     str(f)]) == 2
        assert capsys.readouterr().err == \
            f"ringlet bench: {option} {f}: the file is not writable\n"
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(f)], check=False)


def test_missing_peers_say_what_to_install(monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str],
                                           tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    assert main(["bench", "all_reduce", "--vs", "gloo"]) == 2
    err = capsys.readouterr().err
    assert "gloo: torch is not installed" in err and "pip install 'ringlet[peers]'" in err
    monkeypatch.setattr(peers, "mpiexec_path", lambda: tmp_path / "mpiexec")
    assert main(["bench", "all_reduce", "--vs", "mpi"]) == 2
    err = capsys.readouterr().err
    assert "mpi: there is no mpiexec beside" in err and "pip install 'ringlet[peers]'" in err
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(ArgumentError, match=r"gloo: torch .*; mpi: mpi4py is not installed"):
        peers.parse_vs("gloo, mpi")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["bench", "all_reduce", "--plot", str(tmp_path / "x.png")]) == 2
    assert "pip install 'ringlet[plot]'" in capsys.readouterr().err


# --- peers that fail or hang -------------------------------------------------------------------


def _fake_peer(monkeypatch: pytest.MonkeyPatch, code: str) -> None:
    monkeypatch.setattr(peers, "commands",
                        lambda peer, job, timeout: [[sys.executable, "-c", code]] * 2)


@pytest.mark.parametrize("dtype", ["int32", "bool"])
def test_the_mpi_peer_has_every_op_but_avg(dtype: str) -> None:
    """-o land/lor/lxor with --vs mpi failed in the peer with KeyError: 'lxor' (MPI has
    MPI_LAND, MPI_LOR, MPI_LXOR), after ringlet's sweep, exit 1."""
    from types import SimpleNamespace

    from ringlet.bench import mpi
    from ringlet.bench.cli import BENCH_OPS

    fake = SimpleNamespace(**{n: n for n in ("SUM", "PROD", "MIN", "MAX", "BAND", "BOR",
                                             "BXOR", "LAND", "LOR", "LXOR")})
    for op in BENCH_OPS:
        if op != "avg":
            assert mpi._redop(fake, op, dtype) is not None
    assert [mpi._redop(fake, op, dtype) for op in ("land", "lor", "lxor")] == [
        "LAND", "LOR", "LXOR"]


@pytest.mark.parametrize("dtype, op, why", [
    ("int8", "lxor", "gloo has no LXOR reduction"), ("bool", "land", "gloo has no LAND"),
    ("complex64", "prod", "gloo does not multiply complex tensors")])
def test_what_gloo_cannot_run_is_refused_before_anything_runs(dtype: str, op: str,
                                                              why: str) -> None:
    """These ran ringlet's whole sweep, then failed in gloo (exit 1), where what gloo
    cannot do is known before: exit 2, as for AVG."""
    job = _job("reduce_scatter", nranks=2, dtype=dtype, op=op)
    with pytest.raises(ArgumentError, match=f"--vs gloo: {why}.*drop that peer"):
        peers.check_supported(["gloo"], job)
    peers.check_supported(["mpi"], job)


def test_hung_peer_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_peer(monkeypatch, "import time; time.sleep(60)")
    t0 = time.monotonic()
    run = peers.run_peer("gloo", _job(nranks=2), timeout=0.5)
    assert time.monotonic() - t0 < 5
    assert run.error is not None and run.error.startswith(
        "did not finish within 0.5 s (raise --timeout if it is only slow)")


def test_failed_peer_reports_its_error(monkeypatch: pytest.MonkeyPatch) -> None:
    code = ("import sys, json; print('@ringlet-bench ' + json.dumps({'event': 'start', "
            "'library': 'fake', 'form': 'out', 'call': 'f'}), flush=True); "
            "raise ValueError('boom')")
    _fake_peer(monkeypatch, code)
    run = peers.run_peer("mpi", _job(nranks=2), timeout=20)
    assert run.library == "fake" and run.rows == []
    assert run.error is not None
    # both ranks fail at once: either may be the one reported first
    first = re.fullmatch(r"rank ([01]) failed \(exit code 1\): ValueError: boom",
                         run.error.splitlines()[0])
    assert first is not None, run.error
    assert f"[rank {first.group(1)}] ValueError: boom" in run.error


def test_peer_rows_arrive_as_they_are_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    row = Row(8, 2, {OUT: Timing(3.0, 5, 0)}).to_dict()
    code = f"import json; print('noise'); print('@ringlet-bench ' + json.dumps({{'event': " \
           f"'row', 'row': {row!r}}}))"
    _fake_peer(monkeypatch, code)
    seen: list[int] = []
    run = peers.run_peer("mpi", _job(nranks=2), timeout=20, on_row=lambda r: seen.append(r.size))
    assert run.error is None and seen == [8] and run.rows[0].forms[OUT].time_us == 3.0
    assert math.isfinite(run.seconds)
