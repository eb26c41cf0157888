"""The tuner: the automatic choice by predicted time with a calibrated profile."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_calibrate import calibrated_profile

import ringlet
from ringlet.algorithms import algorithms, build
from ringlet.algorithms.select import (
    NEVER_AUTO,
    Tuner,
    choose,
    heuristic,
    tuner_for,
)
from ringlet.config import Settings
from ringlet.cost.model import Link, Profile, predict
from ringlet.errors import ArgumentError, ConfigError
from ringlet.schedule import COLLECTIVES

KiB, MiB = 1 << 10, 1 << 20


def runnable(collective: str, n: int) -> set[str]:
    out = set()
    for name in algorithms(collective):
        try:
            build(collective, name, n)
        except ArgumentError:
            continue
        out.add(name)
    return out


@pytest.mark.parametrize("collective", list(COLLECTIVES))
@pytest.mark.parametrize("n", [2, 3, 4])
def test_the_tuner_picks_the_least_predicted_time(collective: str, n: int) -> None:
    t = Tuner(calibrated_profile())
    allowed = frozenset(algorithms(collective))
    for nbytes in (8, 64 * KiB, 4 * MiB):
        times = t.times(collective, n, nbytes, allowed)
        assert set(times) == runnable(collective, n) - NEVER_AUTO.get(collective, frozenset())
        for name, sec in times.items():
            assert sec == predict(collective, name, n, nbytes, t.profile).seconds
        best = t.choose(collective, n, nbytes, allowed)
        assert times[best] == min(times.values())


def test_the_choice_follows_the_predictions_across_sizes() -> None:
    """Small all_reduces go one-shot through the post area, large ones staged direct."""
    t = Tuner(calibrated_profile())
    allowed = frozenset(algorithms("all_reduce"))
    assert t.choose("all_reduce", 2, 1 * KiB, allowed) == "oneshot"
    assert t.choose("all_reduce", 2, 64 * MiB, allowed) == "direct"


def test_never_recursive_doubling_for_all_reduce(monkeypatch: pytest.MonkeyPatch) -> None:
    """Even when the model says recursive doubling is fastest, it is not picked (partners
    reduce in opposite orders: not bit-identical for MIN/MAX of signed zeros)."""
    import ringlet.cost.model as model

    real = model.predict

    def rigged(collective: str, algorithm: str, *args: Any, **kw: Any) -> Any:
        p = real(collective, algorithm, *args, **kw)
        if algorithm == "recursive_doubling":
            return type(p)(**{**p.__dict__, "seconds": 1e-12})
        return p

    monkeypatch.setattr(model, "predict", rigged)
    t = Tuner(calibrated_profile())
    allowed = frozenset(algorithms("all_reduce"))
    assert "recursive_doubling" not in t.times("all_reduce", 4, MiB, allowed)
    assert t.choose("all_reduce", 4, MiB, allowed) != "recursive_doubling"
    # other collectives' recursive doubling is fair game
    assert t.choose("all_gather", 4, MiB, frozenset(algorithms("all_gather"))) == \
        "recursive_doubling"


def test_ringlet_algo_forces_and_excludes_with_a_tuner() -> None:
    t = Tuner(calibrated_profile())
    assert choose("all_reduce", 4, MiB, requested=None, setting="all_reduce:ring",
                  tuner=t) == "ring"
    assert choose("all_reduce", 4, MiB, requested="tree", setting="all_reduce:ring",
                  tuner=t) == "binomial"
    excluded = {"direct", "oneshot", "naive"}
    got = choose("all_reduce", 4, MiB, requested=None,
                 setting="all_reduce:" + ",".join(f"^{a}" for a in excluded), tuner=t)
    allowed = frozenset(algorithms("all_reduce")) - excluded
    times = t.times("all_reduce", 4, MiB, allowed)
    assert got not in excluded and times[got] == min(times.values())
    # only recursive doubling left: the user asked for it
    only = ",".join(f"^{a}" for a in algorithms("all_reduce") if a != "recursive_doubling")
    assert choose("all_reduce", 4, MiB, requested=None, setting=f"all_reduce:{only}",
                  tuner=t) == "recursive_doubling"


def test_without_a_profile_the_heuristic_chooses(tmp_path: Path) -> None:
    assert tuner_for(Settings(profile="")) is None
    assert tuner_for(Settings(profile=str(tmp_path / "missing.json"))) is None
    allowed = frozenset(algorithms("all_reduce"))
    for n, nbytes in ((2, 8), (4, MiB), (8, 64 * MiB)):
        assert choose("all_reduce", n, nbytes, requested=None, setting="", tuner=None) == \
            heuristic("all_reduce", n, nbytes, allowed)


def test_the_profile_is_read_once_per_version(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    calibrated_profile().save(path)
    s = Settings(profile=str(path))
    first = tuner_for(s)
    assert first is not None and first.profile == calibrated_profile()
    assert tuner_for(s) is first
    Profile(Link(1e-3, 1e-12), name="other").save(path)
    os.utime(path, ns=(1, 1))           # a new version, whatever the clock's resolution
    second = tuner_for(s)
    assert second is not None and second is not first and second.profile.name == "other"


def test_a_bad_profile_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text("{not json")
    with pytest.raises(ConfigError, match=r"RINGLET_PROFILE=.* is not a usable profile .* "
                                          r"recalibrate with `ringlet predict --calibrate`, "
                                          r"or set RINGLET_PROFILE=''"):
        tuner_for(Settings(profile=str(path)))


def test_the_profile_setting() -> None:
    assert Settings().profile == "~/.cache/ringlet/profile.json"
    assert Settings.from_env({"RINGLET_PROFILE": ""}).profile == ""
    assert Settings.from_env({"RINGLET_PROFILE": "/x/p.json"}).profile == "/x/p.json"


def _chosen(comm: ringlet.Communicator, nbytes: int) -> tuple[str, float]:
    x = np.full(nbytes // 4, comm.rank + 1.0, np.float32)
    comm.all_reduce(x)
    return comm._choose("all_reduce", None, nbytes), float(x[0])


def test_the_communicator_chooses_with_the_profile(tmp_path: Path) -> None:
    """Slow links, fast bytes: the fewest rounds win, ties by name; every rank agrees."""
    path = tmp_path / "profile.json"
    Profile(Link(alpha=1.0, beta=1e-12)).save(path)
    t = Tuner(Profile.load(path))
    pick = t.choose("all_reduce", 2, KiB, frozenset(algorithms("all_reduce")))
    assert pick != heuristic("all_reduce", 2, KiB, frozenset(algorithms("all_reduce")))
    res = ringlet.spawn(_chosen, 2, KiB, settings=Settings(timeout=60.0, profile=str(path)))
    assert res == [(pick, 3.0), (pick, 3.0)]


# --- what the ranks agree on at start-up --------------------------------------------------------


def _job(settings: list[Settings], fn: Any, *args: Any) -> list[tuple[str, Any]]:
    """Run ``fn(comm, *args)`` on one rank per entry of ``settings`` (each its own): each
    rank's ("ok", result) or (error type, message)."""
    import multiprocessing as mp
    import secrets

    ctx = mp.get_context("forkserver")
    q = ctx.Queue()
    job = secrets.token_hex(16)
    procs = [ctx.Process(target=_rank, args=(r, len(settings), job, s, q, fn, args))
             for r, s in enumerate(settings)]
    for p in procs:
        p.start()
    out: dict[int, tuple[str, Any]] = {}
    for _ in procs:
        r, kind, what = q.get(timeout=90)
        out[r] = (kind, what)
    for p in procs:
        p.join(10)
    return [out[r] for r in range(len(settings))]


def _rank(r: int, n: int, job: str, settings: Settings, q: Any, fn: Any, args: Any) -> None:
    try:
        comm = ringlet.init(settings=settings, rank=r, size=n, job_id=job)
        q.put((r, "ok", fn(comm, *args)))
        comm.close()
    except ringlet.RingletError as exc:
        q.put((r, type(exc).__name__, str(exc)))


def _choices(comm: ringlet.Communicator, sizes: list[int]) -> list[str]:
    out = []
    for nbytes in sizes:
        comm.all_reduce(np.ones(nbytes // 4, np.float32))
        out.append(comm._choose("all_reduce", None, nbytes))
    return out


@pytest.mark.parametrize("var,change", [
    ("RINGLET_ALGO", {"algo": "all_reduce:ring"}),
    ("RINGLET_FUSED", {"fused": False}),
    ("RINGLET_PROFILE", {"profile": ""}),
    ("RINGLET_SHM_PIECE_BYTES", {"shm_piece_bytes": 64 << 10}),
    ("RINGLET_CMA_BYTES", {"cma_bytes": 1 << 20}),
])
def test_ranks_that_would_choose_differently_fail_at_start_up(tmp_path: Path, var: str,
                                                             change: dict[str, Any]) -> None:
    """Settings that steer the automatic choice or the fused paths: a rank whose differ
    failed every call (or the calls of the sizes where they mattered, hours into a job)
    with a MismatchError about an algorithm or a path digest, naming no setting."""
    path = tmp_path / "profile.json"
    calibrated_profile().save(path)
    base = Settings(timeout=20.0, profile=str(path))
    res = _job([base, base.replace(**change), base], _choices, [8])
    for kind, text in res:
        assert kind == "ConfigError", res
        assert f"{var}: rank 0 has " in text and "rank 1 has " in text, text
        assert "the automatic choice" in text, text
    if var == "RINGLET_PROFILE":
        assert f"rank 0 has {path} (contents " in res[0][1], res[0][1]
        assert "rank 1 has none (RINGLET_PROFILE='')" in res[0][1], res[0][1]


def test_ranks_whose_settings_mean_the_same_agree_at_start_up() -> None:
    """RINGLET_ALGO is compared by what it means: an alias, spaces or another order of
    its entries failed every rank with a ConfigError."""
    base = Settings(timeout=20.0, profile="", algo="all_reduce:tree;broadcast:^chain")
    res = _job([base, base.replace(algo="broadcast: ^chain; all_reduce:binomial"), base],
               _choices, [8])
    assert res == [("ok", ["binomial"])] * 3, res


def _recalibrated(comm: ringlet.Communicator, path: str, sizes: list[int]) -> list[str]:
    """The profile is replaced after the first call, before the others reach a new size."""
    comm.all_reduce(np.ones(2, np.float32))
    if comm.rank == 0:
        Profile(Link(alpha=1e-9, beta=1.0), name="replaced").save(path)
        os.utime(path, ns=(1, 1))
    comm.barrier()
    return _choices(comm, sizes)


def test_a_profile_replaced_while_the_job_runs_is_the_next_jobs(tmp_path: Path) -> None:
    """The ranks read it at start-up: a rank reaching a new size after the file changed
    chose by the new one, its peers by the old, and that size failed for good."""
    path = tmp_path / "profile.json"
    Profile(Link(alpha=1.0, beta=1e-12)).save(path)
    sizes = [4 * KiB, 64 * KiB, MiB]
    before = Tuner(Profile.load(path))
    want = [choose("all_reduce", 3, s, requested=None, setting="", tuner=before)
            for s in sizes]
    res = _job([Settings(timeout=20.0, profile=str(path))] * 3, _recalibrated, str(path),
               sizes)
    assert res == [("ok", want)] * 3, res


def _paths_lean(comm: ringlet.Communicator, sizes: list[int]) -> tuple[bool, list[str]]:
    assert comm._tuner is not None
    return comm._tuner.paths.lean, _choices(comm, sizes)


def test_ranks_on_either_path_choose_alike_with_a_profile(tmp_path: Path) -> None:
    """RINGLET_LEAN may differ between ranks (they pair up either way), but a profile's
    tuner weighed the compiled path's cost on the ranks that took it: they chose
    differently.  The tuner counts it only where every rank takes it."""
    import dataclasses

    from ringlet.lean import BUILT

    p = calibrated_profile()
    assert p.host is not None
    p = dataclasses.replace(p, host=dataclasses.replace(p.host, lean={1: 1e-7, 2: 6e-7}))
    path = tmp_path / "profile.json"
    p.save(path)
    base = Settings(timeout=20.0, profile=str(path))
    sizes = [8, 4 * KiB, 64 * KiB, MiB]
    mixed = _job([base.replace(lean=False), base], _paths_lean, sizes)
    python = _job([base.replace(lean=False)] * 2, _paths_lean, sizes)
    assert mixed == python, (mixed, python)
    assert mixed[0] == ("ok", (False, mixed[0][1][1])), mixed
    if BUILT:
        both = _job([base, base], _paths_lean, sizes)
        assert all(lean for _, (lean, _) in both), both


# --- the profile file: its format, and the host it describes ---------------------------------


def test_a_profile_says_its_format_and_one_in_another_is_refused(tmp_path: Path) -> None:
    import json

    from ringlet.cost.model import PROFILE_FORMAT

    path = tmp_path / "profile.json"
    calibrated_profile().save(path)
    data = json.loads(path.read_text())
    assert data["format"] == PROFILE_FORMAT == "ringlet-profile/1"
    del data["format"]                  # written before the key: reads the same
    path.write_text(json.dumps(data))
    assert Profile.load(path) == calibrated_profile()
    path.write_text(json.dumps({**data, "format": "ringlet-profile/2"}))
    with pytest.raises(ArgumentError, match=r"profile.json: a profile in format "
                                            r"'ringlet-profile/2', and this ringlet .* reads "
                                            r"'ringlet-profile/1'.* recalibrate"):
        Profile.load(path)
    with pytest.raises(ConfigError, match=r"RINGLET_PROFILE=.* is not a usable profile"):
        tuner_for(Settings(profile=str(path)))


def _calibrated_on(host: str) -> Profile:
    import dataclasses

    p = calibrated_profile()
    assert p.calibration is not None
    return dataclasses.replace(p, calibration=dataclasses.replace(p.calibration, host=host))


def test_a_profile_calibrated_on_another_host_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    from ringlet.cli import main

    assert _calibrated_on(socket.gethostname()).calibrated_elsewhere() is None
    assert Profile(Link(1e-6, 1e-9)).calibrated_elsewhere() is None   # not calibrated
    why = _calibrated_on("big-box").calibrated_elsewhere()
    assert why is not None
    assert why.startswith(f"calibrated on big-box (2 cores), not on this host "
                          f"{socket.gethostname()}"), why
    assert "RINGLET_PROFILE" in why and "ringlet predict --calibrate" in why, why
    for host, note in (("big-box", True), (socket.gethostname(), False)):
        path = tmp_path / f"{host}.json"
        _calibrated_on(host).save(path)
        assert main(["predict", "all_reduce", "--bytes", "1MB", "--ranks", "2",
                     "--no-crossovers", "--profile", str(path)]) == 0
        out = capsys.readouterr().out
        assert "local: this host: test" in out, out
        assert ("note: this profile was calibrated on big-box" in out) == note, out


def test_a_job_on_another_hosts_profile_warns_once(tmp_path: Path) -> None:
    """A home directory shared between machines: the profile in it describes the machine
    that calibrated it.  Rank 0 says so once, however many communicators the job makes;
    the job runs (the choice is still the same on every rank)."""
    import socket
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text("import numpy as np, ringlet\ncomm = ringlet.init()\n"
                      "sub = comm.split(0)\nsub.all_reduce(np.ones(4, np.float32))\n"
                      "print('done', flush=True)\n")
    for host, warned in (("big-box", 1), (socket.gethostname(), 0)):
        path = tmp_path / f"{host}.json"
        _calibrated_on(host).save(path)
        proc = subprocess.run(
            [sys.executable, "-m", "ringlet.cli", "run", "-n", "2", str(script)],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "RINGLET_PROFILE": str(path)})
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.count("done") == 2, proc.stdout
        assert proc.stderr.count(f"ringlet: the profile {path} was calibrated on big-box "
                                 f"(2 cores), not on this host") == warned, proc.stderr


@pytest.mark.parametrize("algo,want", [("all_reduce:oneshot", "oneshot"),
                                       ("all_reduce:^direct", None), ("", "direct")])
def test_the_setting_holds_past_the_post_area(algo: str, want: str | None) -> None:
    """Past the fused post area the communicator turned an automatic oneshot into direct,
    also where RINGLET_ALGO forced oneshot or excluded direct."""
    got = ringlet.spawn(_chosen, 2, MiB,
                        settings=Settings(timeout=60.0, profile="", algo=algo))
    for name, value in got:
        assert value == 3.0
        assert name == want if want else name not in ("direct", "oneshot"), got
