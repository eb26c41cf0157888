"""The suite's own scheduling (tests/conftest.py): under pytest-xdist the controller reads
which tests run beside the rest (marked ``waits``, or in a module marked ``one_process``)
from the test files' source, and that must be what pytest itself sees marked, or a test
would run in the wrong group."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import BESIDE, MAIN, _marks, group_of

ROOT = Path(__file__).parent.parent


def test_the_files_say_what_pytest_marks(request: pytest.FixtureRequest) -> None:
    items = [i for i in request.session.items if isinstance(i, pytest.Function)]
    counts = {"waits": 0, "one_process": 0}
    for item in items:
        module, waits = _marks(item.path)
        assert (item.get_closest_marker("one_process") is not None) == module, item.nodeid
        assert (item.get_closest_marker("waits") is not None) == \
            (item.originalname in waits), item.nodeid
        counts["waits"] += item.originalname in waits
        counts["one_process"] += module
    if len(items) > 1000:   # the whole suite
        assert counts["waits"] >= 20 and counts["one_process"] >= 500, counts


def test_the_scheduler_splits_by_the_marks() -> None:
    faults = "tests/test_faults.py::"
    assert group_of(faults + "test_timeout_names_collective_sequence_and_missing_rank",
                    ROOT) == BESIDE
    assert group_of(faults + "test_any_source_wait_fails_when_a_peer_dies[recv]", ROOT) \
        == BESIDE
    assert group_of(faults + "test_dead_peer_fails_every_survivor_fast[2-1]", ROOT) == MAIN
    assert group_of("tests/test_cost.py::test_does_not_exist", ROOT) == BESIDE
    assert group_of("tests/test_collectives.py::test_does_not_exist", ROOT) == MAIN


def test_a_module_mark_in_a_list_counts(tmp_path: Path) -> None:
    f = tmp_path / "test_x.py"
    f.write_text("import pytest\npytestmark = [pytest.mark.slow, pytest.mark.one_process]\n"
                 "@pytest.mark.waits\ndef test_a(): pass\ndef test_b(): pass\n")
    assert _marks(f) == (True, frozenset({"test_a"}))
    g = tmp_path / "test_y.py"
    g.write_text("import pytest\npytestmark = pytest.mark.slow\ndef test_a(): pass\n")
    assert _marks(g) == (False, frozenset())
