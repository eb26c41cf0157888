"""Predict before you run: alpha-beta-gamma costs counted from the schedules.

* :mod:`.model`: :class:`Link`, :class:`Profile` (save/load a calibration),
  :func:`predict` one call, :func:`predict_all` algorithms, :func:`crossovers`.
* :mod:`.host`: the calibrated model of ringlet's own shared-memory transport
  on this host (step executor, fused staged and one-shot paths).
* :mod:`.calibrate`: ``ringlet predict --calibrate``, measuring this host on
  live ranks and fitting the host model by least squares.
* :mod:`.measure`: timing collectives on live ranks (calibration, regret,
  validation).
* :mod:`.topology`: link presets (NVLink, PCIe, InfiniBand, RoCE, Ethernet,
  this host) and node shapes (DGX A100/H100/B200), each with its sources.
* :mod:`.units`: parse and print sizes, bandwidths and times.
* :mod:`.cli`: ``ringlet predict``.
"""

from __future__ import annotations

from .model import (
    DEFAULT_PROFILE_PATH,
    Crossover,
    Inapplicable,
    Link,
    Prediction,
    Profile,
    crossovers,
    fastest,
    predict,
    predict_all,
    textbook_seconds,
)

__all__ = [
    "DEFAULT_PROFILE_PATH", "Crossover", "Inapplicable", "Link", "Prediction", "Profile",
    "crossovers", "fastest", "predict", "predict_all", "textbook_seconds",
]
