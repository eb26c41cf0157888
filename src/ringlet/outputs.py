"""Checks on the files and directories the command-line tools write, made before any work,
and the one-line error when writing them fails after it (:func:`writing`).

A sweep that runs for minutes and then fails to write its result (a directory given
for a file, a format matplotlib does not know, a missing parent) loses the run.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from .errors import ArgumentError, RingletError

#: The image formats matplotlib writes without other packages.
FIGURE_SUFFIXES = (".png", ".svg", ".svgz", ".pdf", ".eps", ".ps")


def file_name(text: str) -> str:
    """argparse's ``type=`` of an option naming a file to write: an empty name is an error
    (``--png ""`` wrote nothing and said nothing, as if the option were not given)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the file name is empty; give one")
    return text


def check_file(path: str, option: str, suffixes: Sequence[str] = ()) -> None:
    """An ArgumentError unless ``path`` can be written as a file (not a directory, in a
    writable directory that exists) and, if ``suffixes`` are given, ends in one of them
    (a figure's format is its name's ending)."""
    p = Path(path)
    if p.is_dir():
        raise ArgumentError(f"{option} {path}: is a directory; give a file name")
    if suffixes and p.suffix.lower() not in suffixes:
        raise ArgumentError(f"{option} {path}: give a file name ending in "
                            f"{', '.join(suffixes)} (its format)")
    parent = p.resolve().parent
    if not parent.is_dir():
        raise ArgumentError(f"{option} {path}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise ArgumentError(f"{option} {path}: directory {parent} is not writable")
    if p.exists() and not os.access(p, os.W_OK):
        raise ArgumentError(f"{option} {path}: the file is not writable")


def check_directory(path: str, option: str) -> None:
    """An ArgumentError unless ``path`` is a writable directory or can be made one."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ArgumentError(f"{option} {path}: is a file, not a directory")
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArgumentError(f"{option} {path}: cannot make the directory: "
                            f"{exc.strerror or exc}") from None
    if not os.access(p, os.W_OK):
        raise ArgumentError(f"{option} {path}: directory is not writable")


@contextmanager
def writing(path: str | os.PathLike[str], option: str) -> Iterator[None]:
    """Write ``path`` inside the block: an OSError there (a full disk, a read-only file
    system, what the checks before the work cannot see) is one line naming the
    option, not a traceback after the work."""
    try:
        yield
    except OSError as exc:
        raise RingletError(f"{option} {os.fspath(path)}: cannot write it: "
                           f"{exc.strerror or exc}") from None


__all__ = ["FIGURE_SUFFIXES", "check_directory", "check_file", "writing"]
