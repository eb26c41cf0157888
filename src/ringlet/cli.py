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
import sys
from collections.abc import Sequence

from .errors import RingletError

#: subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("ringlet.launch", "run a script on N local ranks: ringlet run -n 4 script.py"),
    "show": ("ringlet.show", "draw an algorithm's schedule round by round"),
    "verify": ("ringlet.show", "check algorithms symbolically for a range of world sizes"),
    "bench": ("ringlet.bench", "nccl-tests style benchmark, with gloo and MPI side by side"),
    "predict": ("ringlet.cost.cli", "predict a collective's time with the cost model"),
    "plan": ("ringlet.plan.cli", "a training step's communication: bytes, time, overlap, money"),
    "config": ("ringlet.configcli", "list every setting, its RINGLET_* variable and value"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ringlet", description="ringlet: collective communication for Python.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (modname, help_) in COMMANDS.items():
        mod = importlib.import_module(modname)
        p = sub.add_parser(name, help=help_, description=help_)
        configure = getattr(mod, f"configure_{name}", None) or mod.configure
        configure(p)
        p.set_defaults(_module=modname, _entry=f"main_{name}" if hasattr(
            mod, f"main_{name}") else "main")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    mod = importlib.import_module(args._module)
    try:
        return int(getattr(mod, args._entry)(args) or 0)
    except RingletError as exc:
        print(f"ringlet {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
