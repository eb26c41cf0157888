"""The simulator with a calibrated local profile (ringlet.sim.host): pure tests, about a second.

Issue 11 point 5: a calibrated profile is simulated with the same host model
``ringlet predict`` uses (ringlet.cost.host.host_rounds), rank by rank, so
without stragglers or jitter the two agree, and a straggler or jitter acts
per rank.  The profile and path settings are those of the measured sweep
(benchmarks/sweep.json), which benchmarks/VALIDATION.md checks both against.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ringlet.algorithms import algorithms
from ringlet.cli import main as cli_main
from ringlet.cost.host import Paths
from ringlet.cost.model import Profile, predict
from ringlet.errors import ArgumentError
from ringlet.schedule import COLLECTIVES
from ringlet.sim import HostSimulator, Simulator, Topology, simulate, simulator

pytestmark = pytest.mark.one_process   # tests/conftest.py

SWEEP = Path(__file__).resolve().parents[1] / "benchmarks" / "sweep.json"


@cache
def sweep() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(SWEEP.read_text())
    return data


def profile() -> Profile:
    return Profile.from_dict(sweep()["profile"])


def fused() -> Paths:
    st = sweep()["settings"]
    return Paths(True, st["shm_post_bytes"], st["shm_stage_bytes"], st["shm_piece_bytes"])


GENERIC = Paths(False)


@pytest.mark.parametrize("paths", ["fused", "generic"])
def test_without_disturbances_the_host_simulator_is_ringlet_predict(paths: str) -> None:
    """Every measured case of the sweep (every collective and algorithm it ran, 8 B to
    64 MiB, 2 and 4 ranks, the automatic choice's too), on the fused paths and on the
    step executor alone: within 2 % of ringlet predict."""
    prof = profile()
    topo = Topology.from_profile(prof)
    pp = fused() if paths == "fused" else GENERIC
    ran: set[tuple[str, int]] = set()
    kinds: set[str] = set()
    for r in sweep()["runs"]:
        algo = r["algorithm"] or r["ran"]
        p = predict(r["collective"], algo, r["nranks"], r["nbytes"], prof, paths=pp)
        s = simulate(r["collective"], algo, r["nranks"], r["nbytes"], topo, paths=pp)
        assert s.seconds == pytest.approx(p.seconds, rel=0.02), (r["collective"], algo,
                                                                 r["nranks"], r["nbytes"])
        assert s.rounds == p.rounds
        ran.add((r["collective"], r["nranks"]))
        kinds.add(p.counted.split(", ")[1].split(";")[0])
    assert {c for c, _ in ran} == set(COLLECTIVES)
    assert {n for _, n in ran} == {2, 4}
    if paths == "fused":   # one-shot: the compiled path where the profile has its figures
        assert kinds & {"fused one-shot path through the post area",
                        "compiled one-shot path (ringlet._lean) through the post area"}, kinds
    assert kinds >= ({"step executor over channels", "fused staged path"} if paths == "fused" else
                     {"step executor over channels"}), kinds


def test_every_algorithm_agrees_with_predict_which_follows_every_ranks_clock() -> None:
    """Every collective (scan and exscan too) with every algorithm, on both paths, at 2, 3
    and 4 ranks: the simulator within 2 % of predict.  On the step executor predict runs
    the same per-rank clocks (a rank waits only for its senders), so a rank busy in one
    round that feeds no one in the next (recursive doubling at 3 ranks; the copies of a
    src-first local reduction) costs less than the busiest-rank-per-round sum: there
    are such cases, and predict is never above that sum."""
    from ringlet.cost.host import predict as host_predict
    from ringlet.cost.model import dtype_of, unit_count

    prof = profile()
    assert prof.host is not None
    topo = Topology.from_profile(prof)
    below = 0
    for n in (2, 3, 4):
        for coll in COLLECTIVES:
            for algo in algorithms(coll):
                for nbytes in (8, 1 << 16, 1 << 20, 1 << 26):
                    for pp in (fused(), GENERIC):
                        try:
                            p = predict(coll, algo, n, nbytes, prof, paths=pp).seconds
                        except ArgumentError:
                            continue
                        s = simulate(coll, algo, n, nbytes, topo, paths=pp).seconds
                        assert s == pytest.approx(p, rel=0.02), (coll, algo, n, nbytes)
                        d = dtype_of("float32")
                        m = unit_count(coll, nbytes, n, d.itemsize)
                        hp = host_predict(prof.host, coll, algo, n, m, d, pp, nbytes)
                        summed = hp.fixed_seconds + hp.move_seconds + hp.reduce_seconds
                        assert hp.seconds <= summed * (1 + 1e-9), (coll, algo, n, nbytes)
                        below += hp.seconds < summed * 0.98
    assert below > 0


def test_a_calibrated_profile_is_simulated_with_its_host_model() -> None:
    prof = profile()
    host = simulator("all_reduce", "ring", 4, 1 << 20, Topology.from_profile(prof))
    links = simulator("all_reduce", "ring", 4, 1 << 20, Topology(prof.intra))
    assert isinstance(host, HostSimulator) and isinstance(links, Simulator)
    assert host.run().seconds != pytest.approx(links.run().seconds, rel=0.05)
    assert "host model" in Topology.from_profile(prof).describe(4)


@pytest.mark.parametrize("collective,algorithm", [("all_reduce", "ring"),
                                                  ("all_reduce", "direct"),
                                                  ("broadcast", "binomial"),
                                                  ("all_gather", "direct")])
def test_a_straggler_on_a_host_profile_adds_its_delay(collective: str, algorithm: str) -> None:
    """The call starts with an agreement of every rank, so a rank 3 ms late makes the
    whole call 3 ms later, whatever the path (step executor or fused)."""
    topo = Topology.from_profile(profile())
    for nbytes in (1 << 16, 1 << 24):
        base = simulate(collective, algorithm, 4, nbytes, topo, paths=fused())
        late = simulate(collective, algorithm, 4, nbytes, topo, paths=fused(),
                        stragglers={2: 0.003})
        assert late.seconds == pytest.approx(base.seconds + 0.003, rel=1e-9)
        assert (late.finish >= 0.003).all()


def test_jitter_acts_per_rank_and_never_makes_a_run_faster() -> None:
    topo = Topology.from_profile(profile())
    for algorithm in ("ring", "direct", "binomial"):
        sim = simulator("all_reduce", algorithm, 4, 1 << 20, topo, paths=fused())
        base = sim.run()
        runs = [sim.run(jitter=0.3, seed=k) for k in range(5)]
        assert all(r.seconds >= base.seconds for r in runs)
        assert len({r.seconds for r in runs}) > 1                 # another seed, another run
        assert sim.run(jitter=0.3, seed=2).seconds == runs[2].seconds   # the same seed
    ring = simulator("all_reduce", "ring", 4, 1 << 20, topo, paths=GENERIC).run(jitter=0.3)
    assert len(set(ring.finish.tolist())) > 1          # ranks end at their own times


def test_the_trace_has_a_row_per_rank_and_round() -> None:
    rec: list[Any] = []
    r = simulate("all_reduce", "ring", 4, 1 << 20, Topology.from_profile(profile()),
                 trace=rec, stragglers={1: 0.001}, paths=GENERIC)
    assert [i for i, *_ in rec] == list(range(6))
    for _, ranks, start, end in rec:
        assert ranks.tolist() == [0, 1, 2, 3] and (end > start).all() and (start >= 0.001).all()
    assert float(np.max(rec[-1][3])) == r.seconds


def test_too_many_ranks_for_the_host_model_are_refused() -> None:
    topo = Topology.from_profile(profile())
    with pytest.raises(ArgumentError, match="host model costs every rank"):
        simulate("all_reduce", "ring", 2048, 1 << 20, topo)


def test_cli_profile_simulates_the_host_and_compares_with_predict(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(sweep()["profile"]))
    monkeypatch.setenv("RINGLET_FUSED", "1")
    assert cli_main(["simulate", "all_reduce", "--bytes", "16MiB", "--ranks", "4", "--link",
                     "local", "--profile", str(path), "--compare", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    done = [d for d in out if "seconds" in d]
    assert {d["algorithm"] for d in done} >= {"ring", "direct", "oneshot"}
    for d in done:
        assert d["seconds"] == pytest.approx(d["predicted_seconds"], rel=0.02), d["algorithm"]
    assert cli_main(["simulate", "all_reduce", "--bytes", "16MiB", "--ranks", "4",
                     "--profile", str(path), "--algorithm", "ring", "--compare"]) == 0
    text = capsys.readouterr().out
    assert "host model" in text and "1.0000" in text
