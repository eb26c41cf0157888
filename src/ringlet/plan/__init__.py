"""A training job's communication per step: volume, time, overlap and money.

:func:`~ringlet.plan.strategies.plan` costs a step for a :class:`Parallelism`
(DDP, ZeRO-1/2/3, tensor, pipeline and expert parallelism, combined) with the
cost model; :func:`~ringlet.plan.step.simulate_step` runs the step through the
simulator instead (buckets, stragglers, noise: ``ringlet plan --simulate``);
``ringlet plan`` is the command line (:mod:`ringlet.plan.cli`).
"""

from __future__ import annotations

from .step import SimulatedComm, StepSimulation, simulate_step
from .strategies import (
    Comm,
    CommCost,
    Costing,
    ModelShape,
    Parallelism,
    StepPlan,
    communications,
    exposed_seconds,
    parse_strategy,
    plan,
    window_exposed,
)

__all__ = [
    "Comm", "CommCost", "Costing", "ModelShape", "Parallelism", "StepPlan", "communications",
    "exposed_seconds", "parse_strategy", "plan", "SimulatedComm", "StepSimulation",
    "simulate_step", "window_exposed",
]
