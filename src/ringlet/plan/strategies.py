"""A training step's communication, strategy by strategy, costed with the cost model.

Strategies and what they move per step
--------------------------------------
With ``P`` parameters of ``b`` bytes, a rank holds a shard of ``P / (tp * pp)``
parameters (tensor and pipeline parallelism split the model), ``S`` bytes:

* ``ddp``: one all-reduce of the gradients, ``S``, over the data-parallel group.
* ``zero1``, ``zero2``: a reduce-scatter of the gradients and an all-gather of
  the updated parameters, ``S`` each: the same volume as DDP (ZeRO paper,
  section 7).  They differ in memory, not in communication.
* ``zero3``: an all-gather of the parameters in the forward pass, another in
  the backward pass, and a reduce-scatter of the gradients: 1.5x DDP.
* ``tp`` (Megatron-LM): two all-reduces of the activations ``micro_batch * seq_len
  * hidden`` per layer in the forward pass and two in the backward pass, per
  micro-batch, over the tensor-parallel group.
* ``pp``: each stage sends its activations ``micro_batch * seq_len * hidden / tp``
  forward and receives their gradient back, per micro-batch (Megatron's
  scatter-gather of pipeline messages over the ``tp`` ranks); the pipeline
  bubble idles ``(pp - 1) / (microbatches + pp - 1)`` of the step.
* ``ep`` (mixture of experts): per MoE layer and micro-batch an all-to-all
  dispatches ``micro_batch * seq_len * top_k * capacity_factor`` tokens of
  ``hidden`` values to their experts and another combines them, in the forward
  and again in the backward pass.  The expert-parallel group is carved out of
  the data-parallel group (Megatron-Core, DeepSpeed-MoE): expert parameters
  (``expert_params``) are sharded ``ep`` ways and their gradients synchronised
  over ``dp / ep`` ranks, the dense ones over all ``dp``.

Layout
------
Ranks are numbered with ``tp`` innermost, then data parallel (with ``ep``
inside it), then ``pp`` outermost (Megatron's order), so a group of ``d``
ranks with stride ``s`` sits on ``gpus_per_node / s`` ranks per node:
tensor parallelism stays on NVLink when ``tp <= gpus_per_node``.

Overlap
-------
Gradient communication is bucketed (``bucket_bytes``, default 25 MiB like
PyTorch DDP) and launched as each bucket's gradients are ready during the
backward pass; parameter all-gathers (ZeRO) are prefetched bucket by bucket
during the forward pass.  A pass of ``W`` seconds produces (or consumes) a
kind's bytes at an even rate, so a gradient bucket is ready at the fraction of
``W`` its bytes and the ones before it make of the kind's total (a 25 MiB
bucket of a 30 MB gradient is ready at 0.87 W, not at W / 2).  One stream runs
the buckets in the order they are ready, so it ends at::

    end = max over buckets i of (ready_i + the seconds of bucket i and every later one)

and ``exposed = max(0, end - W)``: the last bucket never overlaps, and the
stream cannot finish before it has done all its work.  With ``nb`` equal
buckets this is ``max(C / nb, C - W * (nb - 1) / nb)`` for ``C`` seconds of
communication.  Parameter buckets are the same walk with time reversed (the
first is needed when the pass starts, so it never overlaps), as the
simulation (``plan --simulate``, :mod:`ringlet.plan.step`) finds.

Tensor-parallel all-reduces, expert all-to-alls and pipeline sends sit on the
critical path and are fully exposed.  The backward pass is ``backward_fraction``
(default 2/3) of the compute time.

Money
-----
``usd_per_step_comm = comm_seconds * usd_per_gpu_hour / 3600 * ranks`` (the
seed's formula: communication time, overlapped or not, is GPU time spent on
it) and ``usd_per_day_comm = usd_per_step_comm * steps_per_second * 86400``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..cost.model import (
    Prediction,
    Profile,
    compare_textbook,
    dtype_of,
    fastest,
    predict,
    textbook_bytes,
)
from ..errors import ArgumentError

DATA_PARALLEL = ("ddp", "zero1", "zero2", "zero3")
MODEL_PARALLEL = ("tp", "pp", "ep")
#: PyTorch DDP's default bucket_cap_mb=25.
DEFAULT_BUCKET_BYTES = 25 * 2**20

STRATEGY_HELP = (
    "comma-separated NAME[=DEGREE] terms: tp=T (tensor), pp=P (pipeline), ep=E (experts, "
    "within data parallel) and one data-parallel kind: ddp, zero1, zero2 or zero3. "
    "tp x pp x data-parallel = --ranks; one term may leave out its degree to take the "
    "ranks left (a data-parallel kind always does); e.g. ddp, zero3, tp=8,pp=4,ddp, "
    "tp=2,ep=4,zero1")


@dataclass(frozen=True)
class Parallelism:
    """Degrees of each kind of parallelism; ``ranks = tp * pp * dp``, ``ep`` divides ``dp``."""

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    dp_kind: str = "ddp"

    @property
    def ranks(self) -> int:
        return self.tp * self.pp * self.dp

    def __str__(self) -> str:
        terms = [f"{k}={v}" for k, v in (("tp", self.tp), ("pp", self.pp), ("ep", self.ep))
                 if v > 1]
        return ",".join([*terms, f"{self.dp_kind}={self.dp}"])


def parse_strategy(text: str, ranks: int) -> Parallelism:
    """Parse ``--strategy`` (see :data:`STRATEGY_HELP`) for ``ranks`` ranks.

    >>> parse_strategy("tp=8,pp=4,ddp", 128)
    Parallelism(tp=8, pp=4, dp=4, ep=1, dp_kind='ddp')
    """
    if ranks < 1:
        raise ArgumentError(f"--ranks must be >= 1, got {ranks}")
    degrees: dict[str, int | None] = {}
    dp_kind = ""
    for raw in str(text).split(","):
        term = raw.strip().lower()
        if not term:
            continue
        name, _, deg = term.partition("=")
        name = name.strip()
        if name not in DATA_PARALLEL + MODEL_PARALLEL:
            raise ArgumentError(
                f"unknown strategy {name!r} in {text!r}; {STRATEGY_HELP}")
        if name in degrees or (name in DATA_PARALLEL and dp_kind):
            raise ArgumentError(
                f"{text!r} names {name if name in degrees else 'a data-parallel kind'} "
                f"twice; use one data-parallel kind ({', '.join(DATA_PARALLEL)})")
        value: int | None = None
        if deg.strip():
            try:
                value = int(deg)
            except ValueError:
                raise ArgumentError(
                    f"degree {deg!r} of {name} in {text!r} is not a whole number") from None
            if value < 1:
                raise ArgumentError(f"degree of {name} must be >= 1, got {value}")
        if name in DATA_PARALLEL:
            dp_kind = name
            name = "dp"
        degrees[name] = value
    if not degrees:
        raise ArgumentError(f"empty --strategy; {STRATEGY_HELP}")
    open_terms = [k for k, v in degrees.items() if v is None]
    if len(open_terms) > 1:
        raise ArgumentError(
            f"{text!r} leaves out the degree of {' and '.join(open_terms)}; only one term "
            f"may take the ranks left")
    tp = degrees.get("tp") or 1
    pp = degrees.get("pp") or 1
    ep = degrees.get("ep") or 1
    fixed = tp * pp * (degrees.get("dp") or 1)
    if open_terms:
        name = open_terms[0]
        if name == "ep":
            raise ArgumentError("ep needs a degree (ep=E); it is carved out of data parallel")
        if ranks % fixed:
            raise ArgumentError(
                f"{text!r}: the other degrees multiply to {fixed}, which does not divide "
                f"{ranks} ranks")
        rest = ranks // fixed
        if name == "tp":
            tp = rest
        elif name == "pp":
            pp = rest
        dp = rest if name == "dp" else (degrees.get("dp") or 1)
    else:
        dp = degrees.get("dp") or 1
        if tp * pp * dp != ranks and "dp" not in degrees and ranks % (tp * pp) == 0:
            dp = ranks // (tp * pp)   # no data-parallel term: ddp takes the rest
    if tp * pp * dp != ranks:
        raise ArgumentError(
            f"{text!r}: tp={tp} x pp={pp} x data-parallel={dp} = {tp * pp * dp}, "
            f"but --ranks is {ranks}")
    if dp % ep:
        raise ArgumentError(
            f"ep={ep} must divide the data-parallel degree {dp} (experts are sharded "
            f"within data parallel)")
    return Parallelism(tp, pp, dp, ep, dp_kind or "ddp")


@dataclass(frozen=True)
class ModelShape:
    """What the step moves: parameters, and the activation shape for tp/pp/ep."""

    params: float
    dtype: str = "float16"
    layers: int = 0
    hidden: int = 0
    seq_len: int = 0
    micro_batch: int = 0
    microbatches: int = 1
    top_k: int = 2
    capacity_factor: float = 1.0
    moe_layers: int = 0          # 0: every layer
    expert_params: float = 0.0

    def __post_init__(self) -> None:
        def bad(flag: str, value: object, rule: str) -> ArgumentError:
            return ArgumentError(f"--{flag} must be {rule}, got {value}")

        if not (math.isfinite(self.params) and self.params > 0):
            raise bad("params", f"{self.params:g}", "a finite number > 0")
        for name in ("layers", "hidden", "seq_len", "micro_batch", "moe_layers"):
            if getattr(self, name) < 0:
                raise bad(name.replace("_", "-"), getattr(self, name), ">= 0")
        if self.microbatches < 1:
            raise bad("microbatches", self.microbatches, ">= 1")
        if self.top_k < 1:
            raise bad("top-k", self.top_k, ">= 1")
        if not (math.isfinite(self.capacity_factor) and self.capacity_factor > 0):
            raise bad("capacity-factor", self.capacity_factor, "a finite number > 0")
        if not (math.isfinite(self.expert_params) and self.expert_params >= 0):
            raise bad("expert-params", f"{self.expert_params:g}", "a finite number >= 0")
        if self.moe_layers > self.layers:
            raise ArgumentError(f"--moe-layers {self.moe_layers} exceeds --layers "
                                f"{self.layers}")

    @property
    def itemsize(self) -> int:
        return dtype_of(self.dtype).itemsize

    @property
    def activation_bytes(self) -> float:
        """One micro-batch's activations at a layer boundary: micro_batch x seq x hidden."""
        return float(self.micro_batch) * self.seq_len * self.hidden * self.itemsize


@dataclass(frozen=True)
class Comm:
    """One kind of communication in a training step."""

    what: str
    collective: str          # or "send" for pipeline point-to-point messages
    group: str               # tp, pp, dp, ep, dp/ep
    group_size: int
    stride: int              # rank distance between consecutive group members
    nbytes: float            # size of one call (nccl-tests convention)
    calls: int               # per step
    window: str              # "backward", "forward" (overlappable, bucketed) or "exposed"


def _need(model: ModelShape, strategy: str, *names: str) -> None:
    missing = [n for n in names if not getattr(model, n)]
    if missing:
        flags = ", ".join("--" + n.replace("_", "-") for n in missing)
        raise ArgumentError(
            f"{strategy} moves activations: give {flags} (e.g. --layers 32 --hidden 4096 "
            f"--seq-len 4096 --micro-batch 1)")


def communications(par: Parallelism, model: ModelShape) -> list[Comm]:
    """The step's communication for ``par`` and ``model`` (see the module docs)."""
    b = model.itemsize
    out: list[Comm] = []
    shard = par.tp * par.pp
    if model.expert_params > model.params:
        raise ArgumentError(
            f"--expert-params {model.expert_params:g} exceeds --params {model.params:g}")
    expert = model.expert_params if par.ep > 1 else 0.0
    dense_bytes = (model.params - expert) / shard * b
    syncs = [("", dense_bytes, par.dp, "dp", par.tp)]
    if expert:
        syncs.append((" (experts)", expert / (shard * par.ep) * b, par.dp // par.ep, "dp/ep",
                      par.tp * par.ep))
    for tag, size, members, group, stride in syncs:
        if members < 2 or size <= 0:
            continue
        kind = par.dp_kind
        if kind == "ddp":
            out.append(Comm(f"gradient all-reduce{tag}", "all_reduce", group, members, stride,
                            size, 1, "backward"))
        else:
            if kind == "zero3":
                out.append(Comm(f"parameter all-gather, forward{tag}", "all_gather", group,
                                members, stride, size, 1, "forward"))
                out.append(Comm(f"parameter all-gather, backward{tag}", "all_gather", group,
                                members, stride, size, 1, "backward"))
            out.append(Comm(f"gradient reduce-scatter{tag}", "reduce_scatter", group, members,
                            stride, size, 1, "backward"))
            if kind in ("zero1", "zero2"):
                out.append(Comm(f"updated-parameter all-gather{tag}", "all_gather", group,
                                members, stride, size, 1, "forward"))
    stage_layers = 0
    if par.tp > 1 or par.pp > 1 or par.ep > 1:
        names = ("tp" if par.tp > 1 else "pp" if par.pp > 1 else "ep")
        _need(model, names, "layers", "hidden", "seq_len", "micro_batch")
        if model.layers % par.pp:
            raise ArgumentError(
                f"--layers {model.layers} does not split evenly over pp={par.pp} stages")
        stage_layers = model.layers // par.pp
    act = model.activation_bytes
    mb = model.microbatches
    if par.tp > 1:
        out.append(Comm("activation all-reduce (2 forward + 2 backward per layer)",
                        "all_reduce", "tp", par.tp, 1, act, 4 * stage_layers * mb, "exposed"))
    if par.pp > 1:
        out.append(Comm("activations to the next stage and gradients back", "send", "pp",
                        par.pp, par.tp * par.dp, act / par.tp, 2 * mb, "exposed"))
    if par.ep > 1:
        moe = model.moe_layers or model.layers
        if moe % par.pp:
            raise ArgumentError(f"--moe-layers {moe} does not split evenly over pp={par.pp}")
        tokens = float(model.micro_batch) * model.seq_len * model.top_k * model.capacity_factor
        out.append(Comm("token all-to-all (dispatch + combine, forward and backward)",
                        "all_to_all", "ep", par.ep, par.tp, tokens * model.hidden * b,
                        4 * (moe // par.pp) * mb, "exposed"))
    return out


def group_profile(profile: Profile, stride: int, size: int) -> Profile:
    """The links a group of ``size`` ranks, ``stride`` apart, runs on.

    One level: ``profile``.  Two levels: all on one node (intra only), one per
    node (inter only), or ``gpus_per_node / stride`` members per node.
    """
    if profile.inter is None or profile.gpus_per_node < 1:
        return profile
    g = profile.gpus_per_node
    per_node = max(1, g // stride) if stride < g else 1
    if per_node >= size:
        return Profile(profile.intra, name=f"{profile.name} (inside a node)",
                       source=profile.source)
    if per_node == 1:
        return Profile(profile.inter, name=f"{profile.name} (across nodes)",
                       source=profile.source)
    return Profile(profile.intra, profile.inter, per_node, profile.name, profile.source)


@dataclass(frozen=True)
class CommCost:
    """One :class:`Comm` costed: per step totals."""

    comm: Comm
    bytes_per_rank: float     # sent per rank per step
    seconds: float            # per step
    buckets: int              # calls after bucketing (1 per call when not bucketed)
    algorithm: str
    critical_bytes: float
    alpha_seconds: float
    beta_seconds: float
    gamma_seconds: float
    rounds: int
    textbook_bytes: float
    textbook_seconds: float
    overhead_seconds: float = 0.0   # the per-message part of alpha_seconds
    #: the buckets (or calls) in order, as runs of (bytes, seconds, how many) each; empty:
    #: ``buckets`` equal ones
    parts: tuple[tuple[float, float, int], ...] = ()

    @property
    def last_seconds(self) -> float:
        """The last bucket's seconds: the remainder, smaller than the full ones."""
        if self.parts:
            return self.parts[-1][1]
        return self.seconds / self.buckets if self.buckets else 0.0

    def timeline(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The buckets in order as runs: each run's bytes per bucket, seconds per bucket
        and number of buckets (arrays)."""
        parts = self.parts or ((self.comm.nbytes, self.seconds / max(1, self.buckets),
                                max(1, self.buckets)),)
        size, secs, count = zip(*parts, strict=True)
        return np.array(size, float), np.array(secs, float), np.array(count, np.int64)

    def to_dict(self) -> dict[str, Any]:
        c = self.comm
        return {"what": c.what, "collective": c.collective, "group": c.group,
                "group_size": c.group_size, "nbytes": c.nbytes, "calls": c.calls,
                "window": c.window, "buckets": self.buckets, "algorithm": self.algorithm,
                "bytes_per_rank": self.bytes_per_rank, "seconds": self.seconds,
                "textbook_seconds": self.textbook_seconds}


@dataclass(frozen=True)
class Costing:
    """How to cost: the profile, and for the textbook the bandwidth it divides by."""

    profile: Profile
    textbook: bool = False
    textbook_bandwidth: float = 0.0              # one level: the figure the seed divides by
    inter_textbook_bandwidth: float = 0.0        # two levels: the inter link's figure
    bucket_bytes: float = DEFAULT_BUCKET_BYTES
    algorithm: str | None = None                 # force one algorithm (else the fastest)
    rails: bool = False


def _cost(comm: Comm, model: ModelShape, how: Costing) -> CommCost:
    gp = group_profile(how.profile, comm.stride, comm.group_size)
    overlappable = comm.window in ("forward", "backward")
    # pipeline messages are single sends: a two-rank naive broadcast is exactly one message.
    coll = "broadcast" if comm.collective == "send" else comm.collective
    n = 2 if comm.collective == "send" else comm.group_size
    text_bw = textbook_bandwidth(gp, how)
    tb_bytes = textbook_bytes(coll, comm.nbytes) * comm.calls
    tb_seconds = tb_bytes / text_bw if text_bw > 0 else math.nan
    sizes: list[tuple[float, int]]
    if overlappable:
        full, rest = divmod(comm.nbytes, how.bucket_bytes)
        sizes = [(how.bucket_bytes, int(full))] if full else []
        if rest > 0:
            sizes.append((rest, 1))
        sizes = [(s, k * comm.calls) for s, k in sizes]
    else:
        sizes = [(comm.nbytes, comm.calls)]
    if how.textbook:
        # the textbook's time is its bytes over a bandwidth: each bucket its share
        share = tb_seconds / (comm.nbytes * comm.calls) if comm.nbytes > 0 else 0.0
        return CommCost(comm, tb_bytes, tb_seconds, sum(k for _, k in sizes), "textbook",
                        tb_bytes, 0.0, tb_seconds, 0.0, 0, tb_bytes, tb_seconds,
                        parts=tuple((s, s * share, k) for s, k in sizes))
    sent = secs = crit = a = bt = g = o = 0.0
    rounds = buckets = 0
    algo = ""
    parts = []
    for size, k in sizes:
        p = _predict_one(coll, n, int(round(size)), gp, model.dtype, how)
        parts.append((size, p.seconds, k))
        sent += p.bytes_per_rank * k
        secs += p.seconds * k
        crit += p.critical_bytes * k
        a += p.alpha_seconds * k
        o += p.overhead_seconds * k
        bt += p.beta_seconds * k
        g += p.gamma_seconds * k
        rounds += p.rounds * k
        buckets += k
        algo = algo or ("send" if comm.collective == "send" else p.algorithm)
    return CommCost(comm, sent, secs, buckets, algo, crit, a, bt, g, rounds, tb_bytes, tb_seconds,
                    o, tuple(parts))


def textbook_bandwidth(gp: Profile, how: Costing) -> float:
    """The figure the textbook divides a group's volume by: the inter link's when the
    group (on links ``gp``, :func:`group_profile`) spans nodes (its slowest link, where
    the seed's back-of-the-envelope math puts the time), else the link inside a node."""
    spans = gp.inter is not None or gp.name.endswith("(across nodes)")
    return how.inter_textbook_bandwidth if spans and how.inter_textbook_bandwidth \
        else how.textbook_bandwidth


def _predict_one(collective: str, n: int, nbytes: int, profile: Profile, dtype: str,
                 how: Costing) -> Prediction:
    if n == 2 and collective == "broadcast":
        return predict("broadcast", "naive", 2, nbytes, profile, dtype)
    if how.algorithm:
        return predict(collective, how.algorithm, n, nbytes, profile, dtype, rails=how.rails)
    return fastest(collective, n, nbytes, profile, dtype, rails=how.rails)


#: the most buckets a window's walk takes one by one; beyond, runs of equal buckets are
#: walked in groups, each ready with its last bucket: the stream's end can come out later,
#: never earlier, by at most a group's span of the pass (2 / _WALK of it with two kinds)
_WALK = 1 << 18


def stream_end(kinds: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
               reverse: Sequence[bool] = ()) -> tuple[float, float]:
    """When one stream is done with every bucket of a window of length 1, and its
    communication in all: ``(end, total seconds)``.

    ``kinds``: each kind's buckets in order as runs (bytes per bucket, seconds per bucket,
    how many; :meth:`CommCost.timeline`).  A kind's bucket is ready when the pass has made
    the bytes up to its end (fraction of the kind's total); a ``reverse`` kind's buckets
    (parameters) are needed in order from the pass's start, which is the same walk with
    time reversed: ready at 1 - the fraction made before them, last bucket first.  The
    stream takes the buckets in the order they are ready and ends at the latest of
    (ready + the seconds of that bucket and all later ones)."""
    ready: list[np.ndarray] = []
    secs: list[np.ndarray] = []
    for i, (size, sec, count) in enumerate(kinds):
        total = float(np.dot(size, count))
        step = np.maximum(1, -(-count // max(1, _WALK // max(1, len(kinds)))))
        groups = -(-count // step)
        rsize = np.repeat(size, groups)
        rsec = np.repeat(sec, groups)
        rn = np.repeat(count, groups)
        k = np.arange(len(rn)) - np.repeat(np.cumsum(groups) - groups, groups)
        n = np.minimum(np.repeat(step, groups), rn - k * np.repeat(step, groups))
        made = np.cumsum(rsize * n)
        if i < len(reverse) and reverse[i]:
            r = 1 - (made - rsize * n) / total if total > 0 else np.zeros(len(n))
            ready.append(r[::-1])
            secs.append((rsec * n)[::-1])
        else:
            ready.append(made / total if total > 0 else np.ones(len(n)))
            secs.append(rsec * n)
    if not ready:
        return 0.0, 0.0
    t = np.concatenate(ready)
    c = np.concatenate(secs)
    order = np.argsort(t, kind="stable")
    t, c = t[order], c[order]
    after = np.cumsum(c[::-1])[::-1]
    return float(np.max(t + after)), float(after[0])


def exposed_seconds(comm_seconds: float, buckets: int, window: float,
                    last: float | None = None) -> float:
    """Communication left exposed by ``buckets`` equal buckets ready evenly over ``window``
    seconds, ``comm_seconds`` for all of them: ``max(L, C - W (nb - 1) / nb)``, the last
    bucket's ``L`` (default ``C / nb``) never overlapping (module docs).  A plan's windows
    weigh each bucket by its bytes (:func:`window_exposed`)."""
    if comm_seconds <= 0:
        return 0.0
    nb = max(1, buckets)
    tail = comm_seconds / nb if last is None else last
    return max(tail, comm_seconds - window * (nb - 1) / nb)


def window_exposed(costs: Sequence[CommCost], window: float) -> float:
    """Communication of ``costs`` (one pass's overlapped kinds) left exposed by a pass of
    ``window`` seconds (module docs: buckets ready by their bytes, parameters reversed)."""
    kinds = [c.timeline() for c in costs]
    total = sum(c.seconds for c in costs)
    if total <= 0:
        return 0.0
    if window <= 0:
        return total
    # walk in units of the window; the seconds scale with it
    scaled = [(size, sec / window, count) for size, sec, count in kinds]
    end, _ = stream_end(scaled, [c.comm.collective == "all_gather" for c in costs])
    return max(0.0, (end - 1.0) * window)


@dataclass(frozen=True)
class StepPlan:
    """A training step's communication, time, overlap and money."""

    parallelism: Parallelism
    model: ModelShape
    costs: tuple[CommCost, ...]
    textbook: bool
    compute_seconds: float | None
    backward_fraction: float
    usd_per_gpu_hour: float | None
    steps_per_second: float | None
    explanation: tuple[str, ...] = field(default=())

    @property
    def ranks(self) -> int:
        return self.parallelism.ranks

    @property
    def buffer_bytes(self) -> float:
        """Gradient bytes per rank: the parameters this rank holds x dtype size (the
        dense ones split tp x pp ways, the experts' with ep > 1 also ep ways)."""
        p, m = self.parallelism, self.model
        expert = m.expert_params if p.ep > 1 else 0.0
        return ((m.params - expert) + expert / p.ep) / (p.tp * p.pp) * m.itemsize

    @property
    def bytes_per_rank(self) -> float:
        return sum(c.bytes_per_rank for c in self.costs)

    @property
    def comm_seconds(self) -> float:
        return sum(c.seconds for c in self.costs)

    @property
    def bubble(self) -> float:
        """Fraction of the step the pipeline idles: (pp - 1) / (microbatches + pp - 1)."""
        p, m = self.parallelism.pp, self.model.microbatches
        return (p - 1) / (m + p - 1) if p > 1 else 0.0

    @property
    def bubble_seconds(self) -> float | None:
        if self.compute_seconds is None:
            return None
        p, m = self.parallelism.pp, self.model.microbatches
        return self.compute_seconds * (p - 1) / m if p > 1 else 0.0

    @property
    def exposed_seconds(self) -> float:
        """Communication not hidden behind compute (all of it without a compute time)."""
        if self.compute_seconds is None:
            return self.comm_seconds
        windows = {"forward": self.compute_seconds * (1 - self.backward_fraction),
                   "backward": self.compute_seconds * self.backward_fraction}
        total = 0.0
        for name, width in windows.items():
            total += window_exposed([c for c in self.costs if c.comm.window == name], width)
        total += sum(c.seconds for c in self.costs if c.comm.window == "exposed")
        return total

    @property
    def overhead(self) -> float | None:
        """The seed's overhead: communication time / compute time (before overlap)."""
        if not self.compute_seconds:
            return None
        return self.comm_seconds / self.compute_seconds

    @property
    def exposed_overhead(self) -> float | None:
        if not self.compute_seconds:
            return None
        return self.exposed_seconds / self.compute_seconds

    @property
    def step_seconds(self) -> float | None:
        if self.compute_seconds is None:
            return None
        return self.compute_seconds + (self.bubble_seconds or 0.0) + self.exposed_seconds

    @property
    def effective_steps_per_second(self) -> float | None:
        if self.steps_per_second is not None:
            return self.steps_per_second
        s = self.step_seconds
        return 1 / s if s else None

    @property
    def usd_per_step_comm(self) -> float | None:
        if self.usd_per_gpu_hour is None:
            return None
        return self.comm_seconds * self.usd_per_gpu_hour / 3600 * self.ranks

    @property
    def usd_per_step_exposed(self) -> float | None:
        if self.usd_per_gpu_hour is None:
            return None
        return self.exposed_seconds * self.usd_per_gpu_hour / 3600 * self.ranks

    @property
    def usd_per_day_comm(self) -> float | None:
        per_step, sps = self.usd_per_step_comm, self.effective_steps_per_second
        if per_step is None or sps is None:
            return None
        return per_step * sps * 86400

    def to_dict(self) -> dict[str, Any]:
        p = self.parallelism
        return {
            "strategy": str(p), "ranks": self.ranks, "tp": p.tp, "pp": p.pp, "dp": p.dp,
            "ep": p.ep, "data_parallel": p.dp_kind, "params": self.model.params,
            "dtype": dtype_of(self.model.dtype).name, "textbook": self.textbook,
            "buffer_bytes": self.buffer_bytes, "bytes_per_rank": self.bytes_per_rank,
            "comm_seconds": self.comm_seconds, "exposed_seconds": self.exposed_seconds,
            "compute_seconds": self.compute_seconds, "overhead": self.overhead,
            "exposed_overhead": self.exposed_overhead, "bubble": self.bubble,
            "bubble_seconds": self.bubble_seconds, "step_seconds": self.step_seconds,
            "steps_per_second": self.effective_steps_per_second,
            "usd_per_gpu_hour": self.usd_per_gpu_hour,
            "usd_per_step_comm": self.usd_per_step_comm,
            "usd_per_step_exposed": self.usd_per_step_exposed,
            "usd_per_day_comm": self.usd_per_day_comm,
            "communications": [c.to_dict() for c in self.costs],
            "explanation": list(self.explanation),
        }


def plan(par: Parallelism, model: ModelShape, how: Costing, *,
         compute_seconds: float | None = None, backward_fraction: float = 2 / 3,
         usd_per_gpu_hour: float | None = None, steps_per_second: float | None = None,
         line_rate: float | None = None, efficiency: float = 1.0, efficiency_source: str = "",
         link_name: str = "", headline_bidirectional: bool = False) -> StepPlan:
    """Cost a training step; ``line_rate`` etc. describe a one-level link for the
    explanation of how the model differs from the textbook."""
    if not 0 < backward_fraction < 1:
        raise ArgumentError(f"backward fraction must be in (0, 1), got {backward_fraction}")
    for value, what, zero in ((compute_seconds, "compute time", False),
                              (usd_per_gpu_hour, "--usd-per-gpu-hour", True),
                              (steps_per_second, "--steps-per-second", False)):
        if value is not None and not (math.isfinite(value) and (value >= 0 if zero
                                                                  else value > 0)):
            raise ArgumentError(f"{what} must be a finite number {'>=' if zero else '>'} 0, "
                                f"got {value}")
    costs = tuple(_cost(c, model, how) for c in communications(par, model))
    explanation: list[str] = []
    if not how.textbook and costs:
        tb_s = sum(c.textbook_seconds for c in costs)
        if math.isfinite(tb_s) and tb_s > 0:
            one_level = how.profile.inter is None
            cmp = compare_textbook(
                textbook_seconds=tb_s, textbook_bytes=sum(c.textbook_bytes for c in costs),
                textbook_bandwidth=how.textbook_bandwidth,
                model_seconds=sum(c.seconds for c in costs),
                beta_seconds=sum(c.beta_seconds for c in costs),
                alpha_seconds=sum(c.alpha_seconds for c in costs),
                gamma_seconds=sum(c.gamma_seconds for c in costs),
                critical_bytes=sum(c.critical_bytes for c in costs),
                rounds=sum(c.rounds for c in costs), nranks=par.dp if par.dp > 1 else par.ranks,
                line_rate=line_rate if one_level else None, efficiency=efficiency,
                efficiency_source=efficiency_source, link_name=link_name,
                headline_bidirectional=headline_bidirectional,
                overhead_seconds=sum(c.overhead_seconds for c in costs))
            explanation = cmp.lines()
    step = StepPlan(par, model, costs, how.textbook, compute_seconds, backward_fraction,
                    usd_per_gpu_hour, steps_per_second, tuple(explanation))
    money = (step.usd_per_step_comm, step.usd_per_step_exposed, step.usd_per_day_comm)
    if any(v is not None and not math.isfinite(v) for v in money):
        # --usd-per-gpu-hour 1e308 printed '$inf per step', --steps-per-second 1e308 '$inf
        # per day'
        raise ArgumentError(
            f"--usd-per-gpu-hour {usd_per_gpu_hour:g}"
            + (f" at --steps-per-second {steps_per_second:g}" if steps_per_second else "")
            + " makes the communication's cost more dollars than a float holds; give real "
              "prices and rates")
    return step
