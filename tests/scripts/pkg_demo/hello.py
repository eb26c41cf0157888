"""Run with ``-m pkg_demo.hello``: print the rank and the arguments."""

from __future__ import annotations

import os
import sys

print(f"hello from {os.environ['RANK']} of {os.environ['WORLD_SIZE']} args={sys.argv[1:]}")
