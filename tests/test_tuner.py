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
