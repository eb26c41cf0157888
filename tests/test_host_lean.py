"""The host model and the compiled one-shot path (ringlet.lean): where it runs, the model
charges its calibrated cost for the call, the agreement and the exchange (pure tests)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ringlet.cost.host import Host, Paths
from ringlet.cost.model import Profile, predict

SWEEP = Path(__file__).resolve().parent.parent / "benchmarks" / "sweep.json"


def _profiles() -> tuple[Profile, Profile]:
    prof = Profile.from_dict(json.loads(SWEEP.read_text())["profile"])
    assert prof.host is not None
    lean = {1: 0.25e-6, 2: 0.4e-6, 4: 3.0e-6}
    # the same host without the compiled path's figures, and with made-up ones
    return (dataclasses.replace(prof, host=dataclasses.replace(prof.host, lean={})),
            dataclasses.replace(prof, host=dataclasses.replace(prof.host, lean=lean)))


def test_the_compiled_cost_replaces_the_python_paths_fixed_costs() -> None:
    base, withlean = _profiles()
    on, off = Paths(lean=True), Paths(lean=False)
    for n, fixed in ((2, 0.4e-6), (4, 3.0e-6)):
        py = predict("all_reduce", "oneshot", n, 8, base, "float32", paths=on)
        c = predict("all_reduce", "oneshot", n, 8, withlean, "float32", paths=on)
        assert py.seconds > 5e-6 and abs(c.seconds - fixed) < 0.2e-6, (n, py, c)
        assert "compiled" in c.counted and "compiled" not in py.counted
        # the same profile without the compiled path, other dtypes, other paths: unchanged
        for args in (("oneshot", "float32", off), ("oneshot", "float16", on),
                     ("oneshot", "complex64", on), ("ring", "float32", on)):
            a, dt, paths = args
            assert predict("all_reduce", a, n, 8, withlean, dt, paths=paths).seconds == \
                predict("all_reduce", a, n, 8, base, dt, paths=paths).seconds, args
    # past the post area the staged path runs, not the compiled one
    big = predict("all_reduce", "oneshot", 2, 1 << 20, withlean, "float32", paths=on)
    assert "compiled" not in big.counted


def test_the_compiled_cost_beyond_the_calibrated_ranks_grows_with_the_peers() -> None:
    _, withlean = _profiles()
    host = withlean.host
    assert host is not None
    assert host.lean_call(3) == 3.0e-6        # a gap: the next calibrated count up
    assert abs(host.lean_call(7) - (0.25e-6 + (3.0e-6 - 0.25e-6) * 6 / 3)) < 1e-12  # type: ignore[operator]
    assert Host.from_dict(host.to_dict()) == host
    base, _ = _profiles()
    assert base.host is not None and base.host.lean_call(2) is None
