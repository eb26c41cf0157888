"""The ``ringlet`` command.

Each subcommand lives in its own module, which provides
``configure(parser: argparse.ArgumentParser) -> None`` (adds its options) and
``main(args: argparse.Namespace) -> int`` (runs it, returns the exit code).
Modules keep heavy imports (torch, mpi4py, matplotlib) inside ``main``, so
``ringlet --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Sequence

from .errors import ArgumentError, ConfigError, RingletError

#: subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("ringlet.launch", "run a script on N local ranks: ringlet run -n 4 script.py"),
    "show": ("ringlet.show", "draw an algorithm's schedule round by round"),
    "verify": ("ringlet.show", "check algorithms symbolically for a range of world sizes"),
    "bench": ("ringlet.bench", "nccl-tests style benchmark, with gloo and MPI side by side"),
    "predict": ("ringlet.cost.cli", "predict a collective's time with the cost model"),
    "simulate": ("ringlet.sim.cli", "simulate a collective at scale: topology, stragglers, noise"),
    "plan": ("ringlet.plan.cli", "a training step's communication: bytes, time, overlap, money"),
    "diagnose": ("ringlet.diagnose", "what a failed job's ranks were doing, from their dumps"),
    "report": ("ringlet.report", "one HTML file: bench, predictions, trace, algorithm diagrams"),
    "config": ("ringlet.configcli", "list every setting, its RINGLET_* variable and value"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``ringlet`` parser.  Only ``command``'s module is imported and configured
    (all of them if None), so ``ringlet --help`` and each subcommand start fast."""
    parser = argparse.ArgumentParser(
        prog="ringlet", description="ringlet: collective communication for Python.")
    parser.add_argument("--version", action="version", version=f"ringlet {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (modname, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        if command is not None and name != command:
            continue
        mod = importlib.import_module(modname)
        configure = getattr(mod, f"configure_{name}", None) or mod.configure
        configure(p)
        entry = f"main_{name}" if hasattr(mod, f"main_{name}") else "main"
        p.set_defaults(_module=modname, _entry=entry)
    return parser


def _version() -> str:
    """The installed package's version (the source tree's if it is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ringlet")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree
        from . import __version__

        return __version__


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    """The parser of subcommand ``name`` in ``parser`` (None if there is none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found = action.choices.get(name)
            return found if isinstance(found, argparse.ArgumentParser) else None
    return None


#: a value that argparse would take for an option: ``-5GB/s``, ``-1us``, ``-7e9``, ``-.5``
_NEGATIVE = re.compile(r"-[0-9.]")


def _join_negative_values(argv: list[str], parser: argparse.ArgumentParser) -> list[str]:
    """``--option -5GB/s`` as ``--option=-5GB/s``, for ``parser``'s long options that take
    one value, so that a negative value reaches the option's own check (argparse takes
    ``-5GB/s`` for an option and says only "expected one argument").  Nothing after
    ``--``, and nothing for a parser that passes its arguments on (``ringlet run``'s
    program and its arguments)."""
    if any(a.nargs == argparse.REMAINDER for a in parser._actions):
        return argv
    longs = [o for a in parser._actions for o in a.option_strings if o.startswith("--")]
    takes = {o for a in parser._actions if a.nargs is None
             for o in a.option_strings if o.startswith("--")}

    def takes_one(arg: str) -> bool:   # the option, or a prefix argparse reads as it
        if arg in takes:
            return True
        named = [o for o in longs if o.startswith(arg)] if arg.startswith("--") else []
        return len(named) == 1 and named[0] in takes

    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] == "--":
            return out + argv[i:]
        if takes_one(argv[i]) and i + 1 < len(argv) and _NEGATIVE.match(argv[i + 1]):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command if command in COMMANDS else "")
    sub = _subparser(parser, command) if command in COMMANDS else None
    at = argv.index(command) + 1 if command is not None and sub is not None else 0
    if sub is not None:
        argv[at:] = _join_negative_values(argv[at:], sub)
    args, extra = parser.parse_known_args(argv)
    if extra:
        if sub is not None:   # the subcommand's usage and error, if they are its
            sub.parse_args(argv[at:])
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    mod = importlib.import_module(args._module)
    try:
        return int(getattr(mod, args._entry)(args) or 0)
    except RingletError as exc:
        # 2: what was asked cannot be done as asked (arguments, settings); 1: it was tried
        # and failed (a timeout, a peer that died), as a failed run exits
        print(f"ringlet {args.command}: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, (ArgumentError, ConfigError)) else 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `ringlet config | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
