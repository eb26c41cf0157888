"""The ``ringlet`` command restricted to the launcher's subcommands (``run``, ``config``,
``diagnose``).

``ringlet.cli.main`` builds every subcommand's parser, so it needs every
subcommand's module; this runs the same ``main`` with only ours, so the
launcher tests do not depend on the others.
"""

from __future__ import annotations

import sys

from ringlet import cli

cli.COMMANDS = {name: cli.COMMANDS[name] for name in ("run", "config", "diagnose")}

if __name__ == "__main__":
    sys.exit(cli.main())
