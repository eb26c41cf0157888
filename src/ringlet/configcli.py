"""``ringlet config``: every setting, its ``RINGLET_*`` variable, current value and meaning.

The values are read from the environment exactly as the library reads them
(:meth:`Settings.from_env`), so a malformed or unknown ``RINGLET_*``
variable is reported here too.
"""

from __future__ import annotations

import argparse
import textwrap

from .config import Settings


def configure(parser: argparse.ArgumentParser) -> None:
    """``ringlet config`` takes no options."""
    parser.epilog = "Set RINGLET_<NAME>=value in the environment to change a setting."


def main(args: argparse.Namespace) -> int:
    """Print each setting: ``VARIABLE = value``, whether it is the default, then its doc."""
    current = Settings.from_env().describe()
    defaults = {var: value for var, value, _ in Settings().describe()}
    width = max(len(var) for var, _, _ in current)
    for var, value, doc in current:
        origin = "default" if value == defaults[var] else "from the environment"
        print(f"{var:<{width}} = {value}  ({origin})")
        print(textwrap.fill(doc, width=96, initial_indent="    ", subsequent_indent="    "))
    return 0
