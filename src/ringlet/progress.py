"""One progress bar for the long commands (bench, calibration, simulate, report).

It draws on stderr only when stderr is a terminal (and the command was not
told ``-q``), so CI logs and pipes stay quiet; it rewrites one line::

    ringlet bench: 3/12 sizes [#######.....................]  (gloo 16 MiB)

:class:`Progress` counts steps (``step(label)``) or is told where it is
(``update(done, total)``); :func:`callback` is the same bar as a plain
``(done, total)`` function, or None when there is no terminal, for code that
takes an optional progress callback (:func:`ringlet.sim.simulate`).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TextIO

#: characters of the bar itself
WIDTH = 28


def on_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (default stderr) is a terminal: the bar's only place."""
    s = sys.stderr if stream is None else stream
    try:
        return bool(s.isatty())
    except (AttributeError, ValueError):   # closed or not a file
        return False


class Progress:
    """A one-line progress bar on ``stream`` (default stderr).

    ``enabled=None`` draws only on a terminal; False makes every method a
    no-op.  ``what`` names the command, ``unit`` what is counted::

        bar = Progress(len(sizes), "ringlet bench", "sizes")
        for size in sizes:
            measure(size)
            bar.step(f"ringlet {size} B")
        bar.close()
    """

    def __init__(self, total: int, what: str = "ringlet", unit: str = "steps",
                 enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream
        self.enabled = on_terminal(self.stream) if enabled is None else enabled
        self.total, self.done, self.what, self.unit = max(0, total), 0, what, unit
        self._drawn = False

    def step(self, label: str = "") -> None:
        """One more step done; ``label`` says which (e.g. ``mpi 16 MiB``)."""
        self.update(self.done + 1, label=label)

    def update(self, done: int, total: int | None = None, label: str = "") -> None:
        """``done`` of ``total`` (default: the total given at the start) steps done."""
        if total is not None:
            self.total = max(0, total)
        self.done = done
        if not self.enabled:
            return
        frac = min(1.0, done / self.total) if self.total else 1.0
        bar = "#" * int(WIDTH * frac) + "." * (WIDTH - int(WIDTH * frac))
        tail = f"  ({label})" if label else ""
        self.stream.write(f"\r{self.what}: {done}/{self.total} {self.unit} [{bar}]{tail}\033[K")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        """Erase the bar (the command's own output follows on a clean line)."""
        if self.enabled and self._drawn:
            self.stream.write("\r\033[K")
            self.stream.flush()
        self._drawn = False

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def callback(what: str, unit: str = "steps",
             stream: TextIO | None = None) -> Callable[[int, int], None] | None:
    """A ``(done, total)`` function drawing a :class:`Progress` bar that erases itself
    when done, or None when ``stream`` (default stderr) is not a terminal."""
    if not on_terminal(stream):
        return None
    bar = Progress(0, what, unit, True, stream)

    def show(done: int, total: int) -> None:
        bar.update(done, total)
        if done >= total:
            bar.close()

    return show


@contextlib.contextmanager
def from_ranks(step: Callable[[Any], None], settings: Any, name: str
               ) -> Iterator[tuple[Any, Any]]:
    """A queue for the ranks of a job to put what they finished on (small items: each is
    one write to a pipe, whole or not at all), and a thread that calls ``step`` with each
    until the block ends; yields the queue and ``settings`` with the start method the
    queue was made for, to start the ranks with (the watcher thread would change
    ``auto``'s answer).  The thread is stopped by an event, never by a message on the
    queue: a rank killed inside ``put`` (at a timeout, by a signal) keeps the queue's
    write lock for good, and a last ``put`` of ours waited for it forever."""
    from multiprocessing import get_context

    from .launch import start_method

    settings = settings.replace(start_method=start_method(settings))
    q = get_context(settings.start_method).SimpleQueue()
    done = threading.Event()

    def follow() -> None:
        while not done.is_set():
            if q.empty():
                done.wait(0.05)
            else:
                step(q.get())
        while not q.empty():   # what the ranks put before they ended
            step(q.get())

    watcher = threading.Thread(target=follow, name=name, daemon=True)
    watcher.start()
    try:
        yield q, settings
    finally:
        done.set()
        watcher.join(timeout=5.0)
        q.close()
