"""The shape of the code that issue 9's transport seam asked to keep: the communicator
stays small, and the executor and point-to-point engine see transports only through the
interface of transport/base.py."""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "ringlet"


def test_comm_py_stays_under_600_lines() -> None:
    lines = len((SRC / "comm.py").read_text().splitlines())
    assert lines < 600, f"comm.py has {lines} lines: move what is not the communicator out"


def test_the_executor_and_p2p_use_the_transport_interface_only() -> None:
    for name in ("executor.py", "p2p.py", "calls.py"):
        imports = re.findall(r"^from \.transport\.(\w+) import", (SRC / name).read_text(), re.M)
        assert set(imports) <= {"base"}, (name, imports)
