"""Shared fixtures: persistent worlds of N ranks, and a /dev/shm leak check."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
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
    leftovers = [f for f in os.listdir("/dev/shm") if f.startswith("ringlet-")] \
        if os.path.isdir("/dev/shm") else []
    assert not leftovers, f"shared-memory segments left behind: {leftovers}"


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
