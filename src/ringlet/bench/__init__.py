"""``ringlet bench``: nccl-tests-style measurements, with torch gloo and MPI side by side.

::

    ringlet bench all_reduce -n 2 -b 8 -e 64M -f 4 --vs gloo,mpi

Modules: :mod:`~ringlet.bench.core` (conventions, data, timing loop),
:mod:`~ringlet.bench.suite` (ringlet's registered benchmark functions),
:mod:`~ringlet.bench.gloo` and :mod:`~ringlet.bench.mpi` (the peers' functions
and worker entry points), :mod:`~ringlet.bench.peers` (running the peers),
:mod:`~ringlet.bench.report` (table, JSON, plot) and :mod:`~ringlet.bench.cli`
(the command; its progress bar is :mod:`ringlet.progress`).  torch, mpi4py
and matplotlib are imported only where they are used.
"""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``ringlet bench``'s options to ``parser``."""
    from .cli import configure as _configure

    _configure(parser)


def main(args: argparse.Namespace) -> int:
    """Run ``ringlet bench`` with parsed ``args``; returns the exit status."""
    from .cli import main as _main

    return _main(args)


__all__ = ["configure", "main"]
