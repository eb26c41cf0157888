"""``ringlet plan``: a training step's communication: bytes, time, overlap and money.

::

    ringlet plan --params 7e9 --dtype fp16 --ranks 8 --strategy ddp --link nvlink4 \\
        --compute-ms 200 --usd-per-gpu-hour 30 --steps-per-second 1
    ringlet plan --params 70e9 --ranks 128 --strategy tp=8,pp=4,zero1 --link dgx_h100 \\
        --layers 80 --hidden 8192 --seq-len 4096 --micro-batch 1 --microbatches 16
    ringlet plan --params 7e9 --ranks 64 --strategy zero3 --link dgx_h100 --compute-ms 300 \\
        --simulate --straggler 5:2ms --jitter lognormal:0.2 --seed 1

See :mod:`ringlet.plan.strategies` for the volumes and the overlap model, and
:mod:`ringlet.plan.step` for ``--simulate``.
"""

from __future__ import annotations

import argparse
import math
import sys
import textwrap

from ..cost.cli import add_link_options, resolve_links, resolve_ranks
from ..cost.model import dtype_of
from ..cost.units import (
    format_bandwidth,
    format_bytes,
    format_count,
    format_seconds,
    format_usd,
    parse_count,
    parse_size,
)
from ..errors import ArgumentError
from ..jsonout import dumps
from ..progress import callback
from ..sim.cli import parse_jitter, parse_straggler
from .step import StepSimulation, simulate_step
from .strategies import (
    DEFAULT_BUCKET_BYTES,
    STRATEGY_HELP,
    Costing,
    ModelShape,
    StepPlan,
    parse_strategy,
    plan,
)


def configure(p: argparse.ArgumentParser) -> None:
    """Add ``ringlet plan``'s options."""
    p.description = textwrap.fill(
        "A training step's communication for a parallelism strategy: bytes sent per rank, "
        "time, what overlaps with compute, overhead and money. --textbook reproduces the "
        "seeds' back-of-the-envelope math (2S/B per all-reduce, no latency); without it the "
        "exact schedules, per-direction bandwidths and latency are used and the output says "
        "how and why the two differ.")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = (
        "strategy syntax: " + STRATEGY_HELP + "\n\n"
        "examples:\n"
        "  ringlet plan --params 7e9 --dtype fp16 --ranks 8 --strategy ddp "
        "--bandwidth 900GB/s --textbook \\\n"
        "      --compute-ms 200 --usd-per-gpu-hour 30 --steps-per-second 1\n"
        "  ringlet plan --params 7e9 --dtype fp16 --ranks 8 --strategy ddp --link nvlink4 "
        "--compute-ms 200\n"
        "  ringlet plan --params 70e9 --ranks 128 --strategy tp=8,pp=4,zero1 --link dgx_h100 "
        "\\\n      --layers 80 --hidden 8192 --seq-len 4096 --micro-batch 1 --microbatches 16")
    p.add_argument("--params", required=True, metavar="COUNT",
                   help="model parameters, e.g. 7e9, 7B, 500k")
    p.add_argument("--dtype", default="fp16",
                   help="gradient/parameter/activation type: fp16 (default), bf16, fp32, ...")
    p.add_argument("--ranks", type=int, metavar="N", help="GPUs (ranks) in the job")
    p.add_argument("--strategy", default="ddp", help=STRATEGY_HELP + " (default ddp)")
    p.add_argument("--textbook", action="store_true",
                   help="the seeds' approximation: all-reduce 2S/B, reduce-scatter and "
                        "all-gather S/B, B the link's headline figure, no latency")
    p.add_argument("--algorithm", metavar="NAME",
                   help="use this algorithm for every collective (default: the fastest; "
                        "not with --textbook, which counts none)")
    m = p.add_argument_group("model shape (needed by tp, pp and ep)")
    m.add_argument("--layers", type=int, default=0, help="transformer layers")
    m.add_argument("--hidden", type=int, default=0, help="hidden size")
    m.add_argument("--seq-len", type=int, default=0, help="sequence length in tokens")
    m.add_argument("--micro-batch", type=int, default=0, help="sequences per micro-batch")
    m.add_argument("--microbatches", type=int, default=1,
                   help="micro-batches per step (gradient accumulation / pipeline depth; "
                        "default 1)")
    m.add_argument("--top-k", type=int, default=2, help="ep: experts per token (default 2)")
    m.add_argument("--capacity-factor", type=float, default=1.0,
                   help="ep: expert capacity factor (default 1.0)")
    m.add_argument("--moe-layers", type=int, default=0,
                   help="ep: layers with experts (default: every layer)")
    m.add_argument("--expert-params", default="0", metavar="COUNT",
                   help="ep: parameters in the experts, sharded ep ways (default 0)")
    t = p.add_argument_group("time and money")
    t.add_argument("--compute-ms", type=float, metavar="MS",
                   help="forward + backward compute time per step, milliseconds")
    t.add_argument("--backward-fraction", type=float, default=2 / 3,
                   help="share of the compute that is the backward pass (default 2/3)")
    t.add_argument("--bucket", default=str(DEFAULT_BUCKET_BYTES), metavar="SIZE",
                   help="gradient bucket size for overlap, e.g. 25MiB (default, like DDP)")
    t.add_argument("--usd-per-gpu-hour", type=float, metavar="USD",
                   help="price of one GPU for an hour, dollars")
    t.add_argument("--steps-per-second", type=float, metavar="RATE",
                   help="training steps per second for the per-day cost (default: 1 / step "
                        "time when --compute-ms is given)")
    s = p.add_argument_group(
        "simulation", "--simulate runs the step through ringlet's simulator: buckets issued "
                      "as the passes produce or need them, one stream, every rank its own clock")
    s.add_argument("--simulate", action="store_true",
                   help="also simulate the step: total and exposed communication time "
                        "(JSON: 'simulated')")
    s.add_argument("--straggler", action="append", metavar="RANK:DELAY", default=[],
                   help="with --simulate: rank RANK starts the step DELAY late, e.g. 5:2ms "
                        "(repeatable)")
    s.add_argument("--jitter", metavar="lognormal:SIGMA",
                   help="with --simulate: per-message noise, as in ringlet simulate")
    s.add_argument("--seed", type=int, default=0, help="with --simulate: seed of the noise "
                                                       "(default 0)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (bytes_per_rank, comm_seconds, overhead, "
                        "usd_per_step_comm, usd_per_day_comm, ..., and with --simulate "
                        "'simulated': total_seconds, exposed_seconds, step_seconds, ...)")
    add_link_options(p)


def main(args: argparse.Namespace) -> int:
    """Run ``ringlet plan``."""
    if args.textbook and args.algorithm:
        raise ArgumentError(f"--algorithm {args.algorithm}: --textbook counts no algorithm "
                            f"(volume x S / bandwidth, no schedule); give one or the other")
    # the library's own checks (plan(), simulate_step()) name no flag and take seconds
    if args.compute_ms is not None and not (math.isfinite(args.compute_ms)
                                            and args.compute_ms > 0):
        raise ArgumentError(f"--compute-ms must be a finite number of milliseconds > 0, "
                            f"got {args.compute_ms:g}")
    if not 0 < args.backward_fraction < 1:
        raise ArgumentError(f"--backward-fraction must be between 0 and 1 (a share of the "
                            f"compute), got {args.backward_fraction:g}")
    links = resolve_links(args)
    ranks = resolve_ranks(args, links)
    par = parse_strategy(args.strategy, ranks)
    bucket = parse_size(args.bucket, "--bucket", least=1)
    model = ModelShape(
        params=parse_count(args.params, "--params", positive=True), dtype=args.dtype,
        layers=args.layers,
        hidden=args.hidden, seq_len=args.seq_len, micro_batch=args.micro_batch,
        microbatches=args.microbatches, top_k=args.top_k,
        capacity_factor=args.capacity_factor, moe_layers=args.moe_layers,
        expert_params=parse_count(args.expert_params, "--expert-params"))
    if model.microbatches < 1:
        raise ArgumentError(f"--microbatches must be >= 1, got {model.microbatches}")
    itemsize = dtype_of(model.dtype).itemsize
    if bucket < itemsize:   # a bucket of a byte was costed as one element: twice the bytes
        raise ArgumentError(f"--bucket {format_bytes(bucket)} holds no whole {model.dtype} "
                            f"element ({itemsize} B)")
    bucket = bucket // itemsize * itemsize   # whole elements, as DDP's buckets hold
    how = Costing(links.profile, args.textbook, links.textbook_bandwidth,
                  links.inter_textbook_bandwidth, bucket, args.algorithm, args.rails)
    step = plan(par, model, how,
                compute_seconds=None if args.compute_ms is None else args.compute_ms / 1e3,
                backward_fraction=args.backward_fraction,
                usd_per_gpu_hour=args.usd_per_gpu_hour,
                steps_per_second=args.steps_per_second, line_rate=links.line_rate,
                efficiency=links.efficiency, efficiency_source=links.efficiency_source,
                link_name=links.link_name, headline_bidirectional=links.headline_bidirectional)
    simulated: StepSimulation | None = None
    if not args.simulate and (args.straggler or args.jitter):
        raise ArgumentError("--straggler and --jitter need --simulate")
    if args.simulate:
        stragglers: dict[int, float] = {}
        for text in args.straggler:
            rank, delay = parse_straggler(text)
            stragglers[rank] = stragglers.get(rank, 0.0) + delay
        simulated = simulate_step(
            par, model, how,
            compute_seconds=None if args.compute_ms is None else args.compute_ms / 1e3,
            backward_fraction=args.backward_fraction, stragglers=stragglers,
            jitter=parse_jitter(args.jitter), seed=args.seed,
            progress=callback("ringlet plan --simulate", "buckets"))
    if args.json:
        out = step.to_dict()
        out["link"] = links.description
        out["notes"] = list(links.hints)
        if simulated is not None:
            out["simulated"] = simulated.to_dict()
        print(dumps(out, default=_json_default))
        return 0
    _print(step, links.description, list(links.hints), links.textbook_bandwidth,
           links.inter_textbook_bandwidth if links.profile.inter is not None else 0.0,
           args.textbook)
    if simulated is not None:
        _print_simulated(simulated)
    return 0


def _print_simulated(sim: StepSimulation) -> None:
    out = sys.stdout
    extra = [f"seed {sim.seed}"]
    if sim.stragglers:
        extra.append("stragglers " + ", ".join(f"rank {r} +{format_seconds(v)}"
                                               for r, v in sorted(sim.stragglers.items())))
    if sim.jitter:
        extra.append(f"jitter lognormal sigma {sim.jitter:g}")
    print(f"\nsimulated step (a data-parallel group of {sim.group_size}, one communication "
          f"stream; {'; '.join(extra)}):", file=out)
    for c in sim.comms:
        unit = "bucket" if c.window != "exposed" else "call"
        print(f"  {c.what}: {c.calls} {unit}{'s' if c.calls != 1 else ''} ({c.algorithm}), "
              f"{format_seconds(c.seconds)} in all, the last {format_seconds(c.last_seconds)}",
              file=out)
    if not sim.comms:
        print("  none (one rank per group)", file=out)
    print(f"communication {format_seconds(sim.total_seconds)} in all (waits for late ranks "
          f"included), exposed {format_seconds(sim.exposed_seconds)} (the step beyond its "
          f"{format_seconds(sim.compute_seconds)} of compute)", file=out)
    print(f"step {format_seconds(sim.step_seconds)}"
          + (f" (pipeline bubble {format_seconds(sim.bubble_seconds)} included)"
             if sim.bubble_seconds else "")
          + f"; the last rank to finish is member {sim.slowest_member} of the group", file=out)


def _json_default(x: object) -> object:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    raise TypeError(f"not JSON serialisable: {x!r}")


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.3g}%"


def _print(step: StepPlan, link: list[str], notes: list[str], tb_bw: float, tb_inter: float,
           textbook: bool) -> None:
    out = sys.stdout
    m, p = step.model, step.parallelism
    print(f"plan: {format_count(m.params)} parameters, {m.dtype} "
          f"({format_bytes(step.buffer_bytes)} of gradients per rank), {step.ranks} ranks: {p}",
          file=out)
    for line in link:
        print(f"  {line}", file=out)
    if textbook:
        over = (f"{format_bandwidth(tb_bw)} inside a node, {format_bandwidth(tb_inter)} for a "
                f"group that spans nodes" if tb_inter else format_bandwidth(tb_bw))
        print(f"  textbook: volume x S / {over}, no latency "
              f"(all-reduce 2S, reduce-scatter and all-gather S)", file=out)
    for n in notes:
        print(f"  note: {n}", file=out)
    print("\ncommunication per step:", file=out)
    for c in step.costs:
        win = {"backward": "overlaps backward", "forward": "prefetched in forward",
               "exposed": "exposed (critical path)"}[c.comm.window]
        print(f"  {c.comm.what}: {c.comm.collective} of {format_bytes(c.comm.nbytes)} over "
              f"{c.comm.group}={c.comm.group_size}, x{c.buckets} "
              f"{'bucket' if c.comm.window != 'exposed' else 'call'}"
              f"{'s' if c.buckets != 1 else ''}: {format_bytes(c.bytes_per_rank)} sent per rank,"
              f" {format_seconds(c.seconds)} ({c.algorithm}; {win})", file=out)
    if not step.costs:
        print("  none (one rank per group)", file=out)
    print(f"\ntotal: {format_bytes(step.bytes_per_rank)} sent per rank, "
          f"{format_seconds(step.comm_seconds)} of communication per step", file=out)
    if step.compute_seconds is not None:
        print(f"compute {format_seconds(step.compute_seconds)}: overhead "
              f"{_pct(step.overhead)} (communication / compute); exposed after overlap "
              f"{format_seconds(step.exposed_seconds)} ({_pct(step.exposed_overhead)})",
              file=out)
    if p.pp > 1:
        bs = step.bubble_seconds
        print(f"pipeline bubble: (pp-1)/(m+pp-1) = {step.bubble:.3g} of the step"
              + (f" ({format_seconds(bs)})" if bs is not None else ""), file=out)
    if step.usd_per_step_comm is not None:
        day = step.usd_per_day_comm
        sps = step.effective_steps_per_second
        print(f"money at ${step.usd_per_gpu_hour:g}/GPU-hour x {step.ranks} GPUs: "
              f"{format_usd(step.usd_per_step_comm)} per step in communication "
              f"({format_usd(step.usd_per_step_exposed or 0)} exposed)"
              + (f"; at {sps:.3g} step{'s' if f'{sps:.3g}' != '1' else ''}/s: "
                 f"{format_usd(day)} per day" if day is not None
                 else ""), file=out)
    if step.explanation:
        print("\nhow this differs from the textbook:", file=out)
        for line in step.explanation:
            print(f"  {line}", file=out)
