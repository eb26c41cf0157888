"""Shared fixtures: persistent worlds of N ranks, and a /dev/shm leak check."""

from __future__ import annotations

import ast
import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from world import World

#: the world sizes every multi-process test runs at: one, even, odd, oversubscribed
SIZES = [1, 2, 3, 4, 5, 8]

_worlds: dict[int, World] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    """Compile ringlet (and the tests' helpers) to bytecode once, for the thousands of
    processes the tests start.  Where PYTHONDONTWRITEBYTECODE is set (as on the CI
    machine) each of them compiled ringlet's modules again: 0.3 s of a 4-rank job's 1 s."""
    import compileall

    import ringlet

    for d in (os.path.dirname(ringlet.__file__), os.path.dirname(__file__)):
        compileall.compile_dir(d, quiet=2)
    _preload_forkserver()


def _preload_forkserver() -> None:
    """The session's forkserver (one per process: the test worlds' ranks start from it,
    and so do ``ringlet.spawn``'s forkserver ranks) imports numpy and, where installed,
    torch once, before it forks any rank: importing torch took 2.4 s of CPU in each rank
    that used it (a torch test at N = 8 spent 9.6 s on it with 2 cores), and every
    world's ranks, and every restart's, paid it again.  Set here, before anything starts
    the server, which reads the list once.  Importing torch starts no thread, and
    forking from a process that ran no torch operation is what torch's DataLoader
    workers do.  ringlet itself is imported by each rank (0.3 s): preloaded, its import-
    time state (``ringlet.launch``'s thread count, for ``spawn``'s fork check) would be
    the server's.  tests/test_lazy_imports.py checks in fresh processes that a numpy job
    loads no torch."""
    import importlib.util
    import multiprocessing as mp

    mp.get_context("forkserver").set_forkserver_preload(
        ["numpy"] + (["torch"] if importlib.util.find_spec("torch") else []))


def get_world(n: int) -> World:
    w = _worlds.get(n)
    if w is None:
        w = _worlds[n] = World(n)
    return w


@pytest.fixture(scope="session", autouse=True)
def _close_worlds() -> Iterator[None]:
    yield
    for w in _worlds.values():
        w.close()
    _worlds.clear()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """No ringlet segment is left in /dev/shm once every test ran and every world closed.
    Under pytest-xdist each worker's are closed when its tests end, so the check is the
    controller's, once every worker is done (a worker would see another's in use)."""
    if hasattr(session.config, "workerinput"):
        return
    leftovers = sorted(shm_files())
    if leftovers:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write("\n")
            reporter.write_sep("!", f"shared-memory segments left behind: {leftovers}",
                               red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


#: the two workers' groups: tests that can run beside the others (marked ``waits``, or in a
#: module marked ``one_process``), and the rest
BESIDE, MAIN = "beside", "main"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under pytest-xdist (``-n 2`` in pyproject.toml's addopts), run the tests that can run
    beside the others on one worker and the rest on the other, each group in file order:

    - tests marked ``waits`` spend most of their time waiting (on a deadline, a
      heartbeat, a rank that never comes, a launcher's grace) with the cores idle;
    - the tests of a module marked ``one_process`` (``pytestmark``) run in the test
      process alone and start none: they take one core while the multi-process test
      beside them waits for its ranks half of the time.

    The rest run one at a time as without xdist, so no two jobs of many ranks share the
    two cores (``-n 0`` runs every test in one process).

    xdist's own ``--dist loadgroup`` reads groups from node ids its workers rewrite, which
    pytest 9.2 no longer lets them do (pytest-xdist issue 1386): here the controller reads
    the marks from the test files instead, and xdist's scope scheduler sends each group
    to a worker of its own."""
    from xdist.scheduler import LoadScopeScheduling

    class TwoGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid, config.rootpath)

    return TwoGroups(config, log)


def group_of(nodeid: str, root: Path) -> str:
    """BESIDE or MAIN: the group of the test ``nodeid`` (relative to ``root``)."""
    path, *_, name = nodeid.split("::")
    module, waits = _marks(root / path)
    return BESIDE if module or name.split("[")[0] in waits else MAIN


def _is_mark(d: ast.expr, name: str) -> bool:
    """``d`` is ``pytest.mark.<name>``."""
    return isinstance(d, ast.Attribute) and d.attr == name and \
        isinstance(d.value, ast.Attribute) and d.value.attr == "mark"


@functools.cache
def _marks(path: Path) -> tuple[bool, frozenset[str]]:
    """Whether the test file ``path`` is marked ``one_process`` (``pytestmark``, alone or in
    a list), and the names of its functions decorated ``@pytest.mark.waits``."""
    tree = ast.parse(path.read_text())
    module = any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and
                                                   t.id == "pytestmark" for t in n.targets)
                 and any(_is_mark(v, "one_process") for v in
                         (n.value.elts if isinstance(n.value, ast.List | ast.Tuple)
                          else [n.value]))
                 for n in tree.body)
    waits = frozenset(f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                      and any(_is_mark(d, "waits") for d in f.decorator_list))
    return module, waits


def _mapped_in_some_process(paths: set[str]) -> set[str]:
    """Which of ``paths`` a live process still maps."""
    found: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/maps") as f:
                found.update(p for line in f for p in paths if p in line)
        except OSError:   # gone, or not ours to read
            continue
    return found


@pytest.fixture(autouse=True)
def _mpich_segments() -> Iterator[None]:
    """Remove the MPICH segments a test's MPI job left behind.  MPICH keeps its node's
    segment (/dev/shm/mpich_shm_*) until MPI_Finalize when ranks are started as several
    programs (``mpiexec -n 2 ... : -n 2 ...``, how the tests emulate nodes), so a job
    whose rank the test kills leaves 4 MB there for good, whichever library it runs
    (MPICH's, not ringlet's: ringlet's own segments are checked above).  Only new
    segments that no live process maps are removed."""
    def mpich() -> set[str]:
        try:
            return {f for f in os.listdir("/dev/shm") if f.startswith("mpich_shm_")}
        except OSError:
            return set()

    before = mpich()
    yield
    new = {f"/dev/shm/{f}" for f in mpich() - before}
    if new:
        for path in new - _mapped_in_some_process(new):
            with contextlib.suppress(OSError):
                os.unlink(path)


@pytest.fixture(params=SIZES, ids=lambda n: f"N{n}")
def world(request: pytest.FixtureRequest) -> World:
    return get_world(request.param)


def outcome(fn: Callable[[], Any]) -> str:
    """What ``fn()`` ended in: "no error", or the RingletError it raised as "Type: text"."""
    import ringlet

    try:
        fn()
    except ringlet.RingletError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def shm_files() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith("ringlet-")} \
        if os.path.isdir("/dev/shm") else set()


def shm_left(before: set[str], wait: float = 10.0) -> set[str]:
    """The ringlet segments made since ``before`` (:func:`shm_files`) that are left: none
    that no live process maps may remain once their job had ``wait`` seconds to remove
    them.  Under pytest-xdist another worker's jobs make and remove segments meanwhile:
    theirs are mapped while in use and removed when they end (the session's last check,
    in :func:`pytest_sessionfinish`, sees every one)."""
    deadline = time.monotonic() + wait
    while True:
        new = shm_files() - before
        mapped = _mapped_in_some_process({f"/dev/shm/{f}" for f in new})
        left = {f for f in new if f"/dev/shm/{f}" not in mapped}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)
