"""The suite's own scheduling (tests/conftest.py): under pytest-xdist the controller reads
which tests are marked ``waits`` from the test files' source, and that must be the tests
pytest itself sees marked, or a marked test would run in the wrong group."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import MAIN, WAITS, _marked_waits, group_of


def test_the_files_say_what_pytest_marks(request: pytest.FixtureRequest) -> None:
    items = [i for i in request.session.items if isinstance(i, pytest.Function)]
    files: dict[Path, frozenset[str]] = {}
    marked = 0
    for item in items:
        names = files.setdefault(item.path, _marked_waits(item.path))
        waits = item.get_closest_marker("waits") is not None
        assert (item.originalname in names) == waits, item.nodeid
        marked += waits
    if len(items) > 1000:   # the whole suite: a few dozen tests wait
        assert marked >= 20, marked


def test_the_scheduler_splits_by_the_mark() -> None:
    root = Path(__file__).parent.parent
    faults = "tests/test_faults.py::"
    assert group_of(faults + "test_timeout_names_collective_sequence_and_missing_rank",
                    root) == WAITS
    assert group_of(faults + "test_any_source_wait_fails_when_a_peer_dies[recv]", root) == WAITS
    assert group_of(faults + "test_dead_peer_fails_every_survivor_fast[2-1]", root) == MAIN
    assert group_of("tests/test_cost.py::test_does_not_exist", root) == MAIN
