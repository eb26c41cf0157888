"""``python -m ringlet``: the same as the ``ringlet`` command."""

import sys

from .cli import main

sys.exit(main())
