"""Calibration: the least-squares fits, the host model's counts, profiles on disk, the CLI."""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from ringlet.cli import build_parser, main
from ringlet.config import Settings
from ringlet.cost import calibrate as cal
from ringlet.cost.host import (
    DTYPE_CLASSES,
    FUSED,
    Curve,
    Host,
    Level,
    Paths,
    cache_limits,
    counts_at,
    host_counts,
    path_of,
    staged_pieces,
)
from ringlet.cost.host import predict as host_predict
from ringlet.cost.measure import aligned, rounded
from ringlet.cost.model import Calibration, Fit, Link, Profile, predict
from ringlet.errors import ArgumentError
from ringlet.ops import DTYPES

F32 = DTYPES["float32"]
LLC = 32 << 20


def true_host(nranks: int = 3) -> Host:
    """A made-up machine with every term distinct, for the fit to recover."""
    reduce = {c: Curve(1 / (30e9 + i * 1e9), 1 / (8e9 + i * 1e8))
              for i, c in enumerate(DTYPE_CLASSES)}
    calls = {key: 10e-6 + 0.5e-6 * i for i, key in enumerate(cal.CALL_CASES)}
    calls["barrier:generic"] = 3e-6
    levels = [Level(1, 0.0, 0.0, 0.0, 0.0)]
    levels += [Level(p, 2e-6 * (p - 1), 6e-6 + 1e-6 * p, 14e-6 + 2e-6 * p, 5e-6 + 0.5e-6 * p,
                     1.0 if p <= 2 else 1.4, 1.0 if p <= 2 else 1.7, 4e-6 + 1e-6 * p)
               for p in range(2, nranks + 1)]
    return Host(2, LLC, Curve(1 / 10e9, 1 / 5e9), Curve(1 / 70e9, 1 / 9e9),
                Curve(1 / 32e9, 1 / 7e9), Curve(1 / 25e9, 1 / 10e9), reduce, calls,
                tuple(levels))


def synthetic_raw(host: Host, p: cal.Plan, paths: Paths, alpha: float, beta: float
                  ) -> dict[str, Any]:
    """What :func:`ringlet.cost.calibrate.rank_body` would report on ``host``."""

    def model(coll: str, algo: str | None, real: int, n: int) -> float:
        if coll == "barrier":
            lv = host.level(n)[0]
            return host.calls["barrier:generic"] + (lv.sync if n > 1 else 0.0)
        sub = Host(host.cores, host.llc_bytes, host.channel, host.duplex, host.copy,
                   host.shared, host.reduce, host.calls,
                   tuple(lv for lv in host.levels if lv.nranks == n))
        cnt = rounded(coll, real, n)[1]
        return host_predict(sub, coll, algo or "", n, cnt, F32, paths, real).seconds

    raw: dict[str, Any] = {"cores": host.cores, "llc": host.llc_bytes, "tiny": {}}
    for size in range(1, p.nranks + 1):
        rows = []
        for c in cal._tiny_cases(size):
            real = c.nbytes if c.collective == "barrier" else rounded(c.collective, c.nbytes,
                                                                      size)[0]
            if size == 1 and c.collective != "barrier":
                key = next(k for k, v in cal.CALL_CASES.items()
                           if v == (c.collective, c.algorithm))
                sec = host.calls[key]
            else:
                sec = model(c.collective, c.algorithm, real, size)
            rows.append((c.collective, c.algorithm, real, sec))
        raw["tiny"][size] = rows
    raw["pingpong"] = [(n, alpha + beta * n) for n in p.pingpong]
    thr: dict[str, list[float]] = {}
    for name in ("copy_in", "copy_out", *(f"reduce_{c}" for c in DTYPE_CLASSES)):
        curve = host.copy if name.startswith("copy") else host.reduce[name[7:]]
        thr[name] = [1e-6 + curve.at(2.0 * p.active * n, LLC) * n for n in p.copy_sizes]
    raw["throughput"] = thr
    raw["oversub"] = {
        size: [(c.collective, c.algorithm, rounded(c.collective, c.nbytes, size)[0],
                model(c.collective, c.algorithm, rounded(c.collective, c.nbytes, size)[0], size))
               for c in p.oversub_cases]
        for size in range(host.cores + 1, p.nranks + 1)}
    raw["sized"] = []
    for c in p.size_cases:
        real = rounded(c.collective, c.nbytes, p.active)[0]
        raw["sized"].append((c.collective, c.algorithm, real,
                             model(c.collective, c.algorithm, real, p.active)))
    return raw


# --- least squares -------------------------------------------------------------------------


def test_fit_line_recovers_alpha_and_beta() -> None:
    rng = np.random.default_rng(7)
    n = np.array([8, 1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22], float)
    t = 3e-5 + n / 20e9
    a, b, rms, worst = cal.fit_line(n, t * (1 + rng.normal(0, 1e-4, n.size)))
    assert a == pytest.approx(3e-5, rel=1e-2) and b == pytest.approx(1 / 20e9, rel=1e-3)
    assert rms < 1e-3 and worst < 3e-3


def test_fit_line_never_returns_a_negative_term() -> None:
    a, b, _, _ = cal.fit_line([1, 2, 3], [3, 2, 1])       # falling: no slope
    assert (a, b) == (2.0, 0.0)
    a, b, _, _ = cal.fit_line([1, 2, 3], [0.5, 2.5, 4.5])  # line through -1.5: no intercept
    assert a == 0.0 and b > 0


def test_fit_origin_is_non_negative() -> None:
    (c1, c2), rms, _ = cal.fit_origin([[1, 1], [2, 1], [3, 1]], [1, 2, 3])
    assert c1 == pytest.approx(1.0) and c2 == pytest.approx(0.0, abs=1e-12) and rms < 1e-9
    (c1, c2), _, _ = cal.fit_origin([[1, 1], [1, 2]], [1, -5])
    assert c1 >= 0 and c2 >= 0


def test_fit_errors_are_argument_errors() -> None:
    with pytest.raises(ArgumentError, match="equal, non-empty"):
        cal.fit_line([1, 2], [1])
    with pytest.raises(ArgumentError, match=r"an \(n, k\) X"):
        cal.fit_origin([1, 2], [1, 2])   # a vector, not a matrix


@pytest.mark.parametrize("nranks", [2, 3])
def test_fit_recovers_a_known_host(nranks: int) -> None:
    """Measurements generated by the model from known terms give those terms back."""
    host, paths = true_host(nranks), Paths()
    p = cal.plan(nranks, llc=LLC, ncores=2, paths=paths)
    alpha, beta = 3.3e-5, 1 / 20e9
    prof = cal.fit(synthetic_raw(host, p, paths, alpha, beta), p, paths, time.perf_counter())
    got = prof.host
    assert got is not None and prof.calibration is not None
    assert prof.intra.alpha == pytest.approx(alpha, rel=1e-6)
    assert prof.intra.beta == pytest.approx(beta, rel=1e-6)
    assert prof.intra.gamma == pytest.approx(host.reduce["float"].cache, rel=1e-6)
    # the link model's per-message overhead is the executor's endpoint term at two ranks
    assert host.levels[1].nranks == 2 and host.levels[1].endpoint > 0
    assert prof.intra.overhead == pytest.approx(host.levels[1].endpoint, rel=0.02)
    for name in ("copy", "shared", "channel", "duplex"):
        want, have = getattr(host, name), getattr(got, name)
        assert have.cache == pytest.approx(want.cache, rel=0.02), name
        assert have.memory == pytest.approx(want.memory, rel=0.02), name
    for c in DTYPE_CLASSES:
        assert got.reduce[c].cache == pytest.approx(host.reduce[c].cache, rel=1e-6)
        assert got.reduce[c].memory == pytest.approx(host.reduce[c].memory, rel=1e-6)
    for key, v in host.calls.items():
        assert got.calls[key] == pytest.approx(v, rel=1e-6)
    for lv in host.levels[1:]:
        fit = got.level(lv.nranks)[0]
        for term in ("sync", "piece_sync", "round", "endpoint", "work", "work_generic",
                     "post_round"):
            assert getattr(fit, term) == pytest.approx(getattr(lv, term), rel=0.02,
                                                       abs=1e-8), (lv.nranks, term)
        # the model's own measurements give every algorithm the same pace: 1
        assert len(fit.pace) >= 30 and all(v == pytest.approx(1.0, rel=0.01)
                                           for v in fit.pace.values())
    fits = {f.term: f for f in prof.calibration.fits}
    assert fits["link.beta"].rms < 1e-9 and fits[f"round.p{nranks}"].rms < 0.01
    assert {"shared.cache", "channel.memory", "duplex.cache", "copy.memory",
            "reduce.half.cache", "call.all_reduce:post", "sync.p2"} <= set(fits)


def test_plan_sizes_fall_in_the_two_regimes() -> None:
    p = cal.plan(2, llc=LLC, ncores=2)
    lo, hi = cache_limits(LLC)
    ws = [2 * p.active * n for n in p.copy_sizes]
    assert sum(w <= lo for w in ws) == 3 and sum(w >= hi for w in ws) == 2
    for term, coll, algo in cal.RESIDUAL_TERMS:
        sizes = [c.nbytes for c in p.size_cases if (c.collective, c.algorithm) == (coll, algo)]
        assert len(sizes) == 5, term
    with pytest.raises(ArgumentError, match=r"at least 2 ranks \(-n\), got 1"):
        cal.plan(1)
    with pytest.raises(ArgumentError, match=r"--reps must be >= 1, got 0"):
        cal.plan(2, reps=0)


# --- the host model's counts and paths --------------------------------------------------------


def test_fused_paths_are_the_communicators() -> None:
    from ringlet import agreement, comm
    from ringlet.transport import fused

    assert FUSED is fused.FUSED_PATHS   # one table, read by the communicator and the model
    assert comm._PATH_CODE == {"generic": agreement.GENERIC, "post": agreement.POST,
                               "staged": agreement.STAGE}
    paths = Paths(post_bytes=4096)
    assert path_of("all_reduce", "oneshot", 4096, paths) == "post"
    assert path_of("all_reduce", "oneshot", 4097, paths) == "generic"
    assert path_of("all_reduce", "direct", 1 << 30, paths) == "staged"
    assert path_of("all_reduce", "direct", 8, Paths(fused=False)) == "generic"
    assert Paths.from_settings(Settings()) == Paths()


@pytest.mark.parametrize("coll", ["all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                  "all_to_all"])
@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_staged_pieces_match_the_transport(coll: str, n: int) -> None:
    from ringlet.transport.fused import Fused

    for stage, piece in ((8192, 4096), (4 << 20, 1 << 20)):
        t = SimpleNamespace(size=n, rank=0, lay=SimpleNamespace(stage_bytes=stage),
                            settings=SimpleNamespace(shm_piece_bytes=piece, cma_bytes=0))
        f = Fused(t, lambda: "")  # type: ignore[arg-type]
        paths = Paths(stage_bytes=stage, piece_bytes=piece)
        for isz in (1, 4, 8):
            for count in (1, 511, 1024, 1025, 6001, 100_000):
                slots = n if coll in ("reduce_scatter", "all_to_all") else 1
                cap, want = f._widths(isz, slots)
                if coll == "all_reduce":
                    want *= n
                want_pieces = len(f._pieces(count, cap, want))
                assert staged_pieces(coll, n, count, isz, paths) == want_pieces, \
                    (coll, n, stage, isz, count)


def test_shared_view_publishes_once_and_reads_in_place() -> None:
    p = 4
    # direct all_reduce: reduce-scatter publishes p-1 blocks and reduces p-1 peers' blocks
    # where they lie; all-gather publishes the reduced block ONCE for p-1 peers
    c = host_counts("all_reduce", "direct", p)
    assert c.publish[:, 0].tolist() == pytest.approx([(p - 1) / p, 1 / p])
    assert c.sent[:, 0].tolist() == pytest.approx([(p - 1) / p, (p - 1) / p])
    assert c.rreduce[0, 0] == pytest.approx((p - 1) / p) and c.read[1, 0] == pytest.approx(
        (p - 1) / p)
    # one-shot: one publish of the vector; what lands in TMP is read (and reduced) in place
    c = host_counts("all_reduce", "oneshot", p)
    assert c.publish[0].tolist() == [1.0] * p and c.sent[0].tolist() == [p - 1.0] * p
    assert c.read[0].sum() == 0 and c.recv[0].tolist() == [p - 1.0] * p
    assert c.read[1, 1] == 1.0 and c.copy[1, 0] == 1.0          # OUT = TMP[0]
    assert c.rreduce[1].tolist() == [p - 1.0] + [p - 2.0] * (p - 1)
    assert (c.rreduce[1] + c.lreduce[1]).tolist() == [p - 1.0] * p
    # empty chunks are not messages: dbtree's 4 pieces of a 2-element vector
    assert counts_at("all_reduce", "double_binary_tree", 2, 2).messages.sum() < \
        counts_at("all_reduce", "double_binary_tree", 2, 1 << 20).messages.sum()


def test_host_prediction_structure() -> None:
    host, paths = true_host(2), Paths()
    lv = host.level(2)[0]
    tiny = host_predict(host, "broadcast", "direct", 2, 1, F32, paths, 4)
    assert tiny.path == "staged" and tiny.pieces == 1 and tiny.syncs == 2
    assert tiny.fixed_seconds == pytest.approx(host.calls["broadcast:staged"] + lv.sync
                                               + lv.piece_sync)
    big = host_predict(host, "broadcast", "direct", 2, 1 << 20, F32, paths, 4 << 20)
    k = (4 << 20) // paths.piece_bytes   # 4 MiB in pieces of the default size
    assert k > 1 and big.pieces == k and big.syncs == k + 1
    ring = host_predict(host, "all_reduce", "ring", 2, 1, F32, paths, 4)
    assert ring.path == "generic" and ring.rounds == 2 and ring.syncs == 1
    # an algorithm's pace scales its rounds' fixed costs, at its own rank count only
    paced = Host(host.cores, host.llc_bytes, host.channel, host.duplex, host.copy, host.shared,
                 host.reduce, host.calls,
                 (host.levels[0], replace(lv, pace={"broadcast:direct": 0.5})))
    assert host_predict(paced, "broadcast", "direct", 2, 1, F32, paths, 4).seconds == \
        pytest.approx(tiny.seconds - 0.5 * lv.piece_sync)
    assert host_predict(paced, "broadcast", "direct", 3, 1, F32, paths, 4).fixed_seconds == \
        pytest.approx(host_predict(host, "broadcast", "direct", 3, 1, F32, paths, 4)
                      .fixed_seconds)
    # beyond the calibrated ranks: extrapolated, and said so
    far = host_predict(host, "broadcast", "direct", 5, 1, F32, paths, 4)
    assert far.extrapolated and "extrapolated from 2" in far.how
    assert host.level(5)[0].sync == pytest.approx(lv.sync * 4)
    # more ranks than cores share them: the same bytes take longer per rank at 4 ranks
    w2 = host_predict(true_host(4), "all_gather", "direct", 2, 1 << 18, F32, paths, 1 << 21)
    w4 = host_predict(true_host(4), "all_gather", "direct", 4, 1 << 18, F32, paths, 1 << 22)
    assert w4.move_seconds > 2 * w2.move_seconds


def test_curve_interpolates_between_the_regimes() -> None:
    c = Curve(1.0, 3.0)
    lo, hi = cache_limits(LLC)
    assert c.at(lo, LLC) == 1.0 and c.at(hi, LLC) == 3.0 and c.at(10 * hi, LLC) == 3.0
    assert c.at(math.sqrt(lo * hi), LLC) == pytest.approx(2.0)
    with pytest.raises(ArgumentError, match=r"Curve.cache must be a finite number >= 0"):
        Curve(-1.0, 1.0)


def test_aligned_buffers_start_where_asked() -> None:
    for off in (0, 64, 256):
        a = aligned((3, 5), np.float64, off)
        assert a.ctypes.data % 4096 == off and a.shape == (3, 5) and not a.any()


# --- profiles ------------------------------------------------------------------------------


def calibrated_profile() -> Profile:
    host = true_host(2)
    fits = (Fit("sync.p2", 2e-6, "s", 1, 0.0, 0.0, "test"),)
    calib = Calibration("2026-01-01T00:00:00+00:00", "testhost", 2, LLC, 2, 9.5, "3.11",
                        "2.0", "0.1.0", {"fused": True}, fits)
    return Profile(Link(3e-5, 1 / 20e9, 1 / 30e9, "test"), name="this host", source="test",
                   host=host, calibration=calib)


def test_profile_round_trip_with_host_and_calibration(tmp_path: Path) -> None:
    prof = calibrated_profile()
    path = prof.save(tmp_path / "sub" / "profile.json")
    assert Profile.load(path) == prof
    assert not list(path.parent.glob(".*tmp"))       # written aside, then renamed
    data = json.loads(path.read_text())
    assert data["calibration"]["host"] == "testhost" and data["host"]["cores"] == 2
    # profiles written before calibration existed still load
    del data["host"], data["calibration"]
    path.write_text(json.dumps(data))
    assert Profile.load(path).host is None


def test_a_broken_profile_says_what_is_missing(tmp_path: Path) -> None:
    data = calibrated_profile().to_dict()
    del data["host"]["levels"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ArgumentError, match=r"not a ringlet profile \(KeyError: 'levels'\)"):
        Profile.load(path)


def _edit(data: dict[str, Any], where: str, value: Any) -> None:
    """Set the value at ``where`` ("host.levels.0.sync") in a profile's dict."""
    *path, last = where.split(".")
    for k in path:
        data = data[int(k)] if isinstance(data, list) else data[k]
    if isinstance(data, list):
        data[int(last)] = value
    else:
        data[last] = value


@pytest.mark.parametrize("where,value,says", [
    ("host.levels.0.sync", -1.0, "host.levels[0]: Level.sync must be a finite number >= 0, "
                                 "got -1.0"),
    ("host.levels.0.round", float("nan"), "host.levels[0]: Level.round must be a finite "
                                          "number >= 0, got nan"),
    ("host.levels.0.work", 0.0, "Level.work must be a finite number > 0"),
    ("host.levels.0.nranks", 0, "Level.nranks must be a whole number >= 1"),
    ("host.calls.all_reduce:staged", -1.0, "Host.calls['all_reduce:staged'] must be a finite "
                                           "number >= 0"),
    ("host.lean", {"2": float("inf")}, "Host.lean[2] must be a finite number >= 0"),
    ("host.llc_bytes", -5, "Host.llc_bytes must be a finite number >= 0"),
    ("host.copy.cache", -1e-10, "host.copy: Curve.cache must be a finite number >= 0"),
    ("intra.beta", -1.0, "intra: Link.beta must be a finite number >= 0"),
])
def test_a_profile_value_out_of_range_is_named_with_its_file(tmp_path: Path, where: str,
                                                              value: Any, says: str) -> None:
    """Negative, NaN or infinite times in a profile edited by hand predicted '-2 s' and
    'nan h' and steered the automatic choice; a bad value's message named neither the
    file nor where in it the value is."""
    data = calibrated_profile().to_dict()
    data["host"]["calls"]["all_reduce:staged"] = 1e-5
    _edit(data, where, value)
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ArgumentError) as err:
        Profile.load(path)
    assert str(err.value).startswith(f"{path}: not a usable profile: "), err.value
    assert says in str(err.value), err.value


def test_a_profile_with_a_rank_count_twice_is_refused(tmp_path: Path) -> None:
    data = calibrated_profile().to_dict()
    data["host"]["levels"].append(dict(data["host"]["levels"][0], sync=1.0))
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ArgumentError, match=r"Host.levels has a rank count twice"):
        Profile.load(path)


def test_predict_uses_the_host_model_of_a_calibrated_profile() -> None:
    prof = calibrated_profile()
    p = predict("all_reduce", "direct", 2, 1 << 20, prof)
    assert "host model, fused staged path" in p.counted
    hp = host_predict(prof.host, "all_reduce", "direct", 2, 1 << 18, F32, Paths(),  # type: ignore[arg-type]
                      1 << 20)
    assert p.seconds == hp.seconds and p.alpha_seconds == hp.fixed_seconds
    plain = predict("all_reduce", "direct", 2, 1 << 20, Profile(prof.intra))
    assert "host model" not in plain.counted and plain.seconds != p.seconds


# --- the command --------------------------------------------------------------------------


def test_a_quick_calibration_needs_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A smoke test's rough profile replaced the one every job's automatic choice reads."""
    monkeypatch.setenv("RINGLET_PROFILE", str(tmp_path / "profile.json"))
    assert main(["predict", "--calibrate", "-n", "2", "--quick"]) == 2
    assert "--quick makes rough figures for smoke tests: give --out PATH" in \
        capsys.readouterr().err
    assert not (tmp_path / "profile.json").exists()


@pytest.mark.waits
def test_calibrate_end_to_end_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``ringlet predict --calibrate`` on two live ranks, with the tiny sweep."""
    out = tmp_path / "profile.json"
    assert main(["predict", "--calibrate", "-n", "2", "--quick", "--reps", "1",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "quick sweep: rough figures" in text and f"saved to {out}" in text
    for term in ("sync.p2", "piece_sync.p2", "round.p2", "endpoint.p2", "link.alpha",
                 "shared.cache", "channel.cache", "reduce.float.cache"):
        assert f"  {term} " in text
    prof = Profile.load(out)
    assert prof.host is not None and prof.calibration is not None
    assert prof.calibration.nranks == 2 and prof.calibration.quick
    assert [lv.nranks for lv in prof.host.levels] == [1, 2]
    assert main(["predict", "all_reduce", "--bytes", "1MiB", "--ranks", "2", "--profile",
                 str(out), "--no-crossovers"]) == 0
    assert "host model" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "message"), [
    (["predict", "--calibrate", "all_reduce"],
     r"--calibrate takes no collective \(given: all_reduce\); it measures this host"),
    (["predict", "--calibrate", "--bytes", "4"], r"--calibrate takes no --bytes \(given: "
                                                 r"--bytes 4\)"),
    (["predict", "all_reduce", "--calibrate", "--bytes", "1MB"],
     r"--calibrate takes no collective and no --bytes \(given: all_reduce --bytes 1MB\)"),
    (["predict", "all_reduce", "--bytes", "4", "--ranks", "2", "-n", "2"],
     r"-n go with --calibrate"),
    (["predict", "all_reduce", "--ranks", "2"], r"give a collective and --bytes"),
    (["predict", "--calibrate", "-n", "1", "--out", "/nonexistent/x.json"],
     r"calibration needs 2 to 256 ranks \(-n\), got 1"),
    (["predict", "--calibrate", "-n", "100000"], r"calibration needs 2 to 256 ranks"),
    # before measuring, and without making the directory
    (["predict", "--calibrate", "-n", "2", "--out", "/nonexistent/x.json"],
     r"--out /nonexistent/x.json: directory /nonexistent does not exist"),
])
def test_calibrate_argument_errors(argv: list[str], message: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert __import__("re").search(message, capsys.readouterr().err)
    assert not Path("/nonexistent").exists()


def test_help_documents_every_option_with_units() -> None:
    parser = build_parser("predict")
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    p = sub.choices["predict"]
    helps = {}
    for action in p._actions:
        if action.option_strings:
            assert action.help and action.help != argparse.SUPPRESS, action.option_strings
            helps[action.option_strings[-1]] = action.help
    for opt in ("--calibrate", "--nranks", "--out", "--reps", "--quick", "--profile"):
        assert opt in helps
    units = {"--bytes": "bytes", "--bandwidth": "GB/s", "--latency": "us",
             "--gamma": "GB/s", "--nranks": "ranks", "--reps": "batches",
             "--ranks": "ranks", "--nodes": "nodes", "--gpus-per-node": "ranks per node"}
    for opt, unit in units.items():
        assert unit in helps[opt], opt
    text = p.format_help()
    assert "seconds" in text and "bytes/s" in text and "--calibrate -n" in text


def test_docstring_examples() -> None:
    import doctest
    import importlib

    for name in ("ringlet.cost.calibrate", "ringlet.algorithms.select"):
        result = doctest.testmod(importlib.import_module(name))
        assert result.attempted and not result.failed, name
