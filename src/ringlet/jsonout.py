"""JSON for the command-line tools' ``--json`` output: strict JSON, which every parser reads.

Python's :mod:`json` writes ``Infinity`` and ``NaN`` for floats that are not finite
(a bandwidth on one rank, where nothing moves), which is not JSON: ``jq`` and
JavaScript's ``JSON.parse`` refuse the whole document.  Here such a number is ``null``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any


def finite(obj: Any) -> Any:
    """``obj`` with every float that is not finite replaced by None (in lists, tuples and
    dicts, recursively)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def dumps(obj: Any, indent: int | None = 2, default: Callable[[Any], Any] | None = None
          ) -> str:
    """Strict JSON of ``obj``: floats that are not finite are null."""
    if default is not None:   # objects the default turns into numbers are checked too
        obj = json.loads(json.dumps(obj, default=default))
    return json.dumps(finite(obj), indent=indent, allow_nan=False)


__all__ = ["dumps", "finite"]
