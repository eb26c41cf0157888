"""``ringlet simulate``: run an algorithm's schedule through the simulator, at any scale.

::

    ringlet simulate all_reduce --bytes 1GB --link dgx_h100 --nodes 2048 --algorithm ring
    ringlet simulate all_reduce --bytes 256MB --ranks 512 --bandwidth 50GB/s --latency 5us \\
        --straggler 7:10ms --jitter lognormal:0.2 --seed 1 --trace ring.json

The link and shape options are ``ringlet predict``'s (:func:`ringlet.cost.cli.add_link_options`).
With ``--link local`` (the default) and a calibrated profile (``--profile PATH``,
else the saved one) the ranks of this host are simulated with the profile's host
model (:mod:`ringlet.sim.host`) on the shared-memory paths the ``RINGLET_*``
settings give, as ``ringlet predict`` predicts them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import textwrap
from typing import Any

from ..algorithms import algorithms as registered_algorithms
from ..algorithms import entry, parse_params
from ..config import Settings
from ..cost.cli import (
    add_link_options,
    chosen_algorithms,
    resolve_links,
    resolve_ranks,
    size_and_root,
)
from ..cost.host import Paths
from ..cost.model import Profile, bus_factor, dtype_of, path_bytes, predict, unit_count
from ..cost.units import format_bandwidth, format_bytes, format_seconds, parse_time
from ..errors import ArgumentError
from ..jsonout import dumps
from ..outputs import check_file, file_name, writing
from ..progress import callback
from ..schedule import COLLECTIVES, ROOTED
from . import simulate
from .core import Result
from .topology import Topology

#: Algorithms that send every rank's data to every other rank in one round: p (p-1)
#: messages a round, which the simulator holds in memory; skipped above this many.
ALL_PAIRS = frozenset({"naive", "direct", "oneshot"})
ALL_PAIRS_LIMIT = 1 << 24
#: Pieces x ranks ringlet simulate takes from ringlet predict's piece count at most, and
#: the least bytes a piece so taken holds: predict doubles the pieces while that pays at
#: all, so with no latency it takes 65,536 pieces of a few bytes, which take the
#: simulator minutes (0.35 ms a piece for a double binary tree at 8 ranks) and change
#: nothing.  (Up to 128 pieces at 512 ranks: the piece count predict takes on 64 DGX
#: nodes; --param pieces=K simulates any count.)
SIM_PIECES = 1 << 16
SIM_PIECE_BYTES = 4096
#: The largest --jitter sigma: exp(10 |Z|) is already 10^26 at six standard deviations;
#: much more and a message's time overflows to infinity.
MAX_SIGMA = 10.0


def configure(p: argparse.ArgumentParser) -> None:
    """Add ``ringlet simulate``'s options."""
    p.description = textwrap.fill(
        "Simulate a collective with ringlet's own schedules over a topology: links with "
        "bandwidth and latency, NICs per node, rails, a two-level fat-tree with "
        "oversubscription, per-message overheads, stragglers and seeded noise. Prints the "
        "simulated time per algorithm, fastest first.")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = (
        "examples:\n"
        "  ringlet simulate all_reduce --bytes 1GB --link dgx_h100 --nodes 2048 "
        "--algorithm ring --algorithm hierarchical\n"
        "  ringlet simulate all_reduce --bytes 64MB --ranks 512 --bandwidth 50GB/s "
        "--latency 5us --straggler 7:10ms\n"
        "  ringlet simulate all_reduce --bytes 64MB --ranks 64 --bandwidth 50GB/s "
        "--jitter lognormal:0.3 --seed 2 --trace run.json   # open in ui.perfetto.dev\n"
        "  ringlet simulate all_gather --bytes 1MiB --ranks 4 --link local --profile "
        "prof.json --compare   # this host's calibrated model\n"
        "sizes: --bytes as in ringlet predict (nccl-tests' size). Without contention, "
        "stragglers or jitter the simulator agrees with ringlet predict's link model. A "
        "calibrated local profile (--link local, --profile) is simulated with its host model "
        "(each rank's rounds costed as ringlet predict costs them, on the shared-memory paths "
        "of the RINGLET_* settings).")
    p.add_argument("collective", choices=list(COLLECTIVES), help="the collective")
    p.add_argument("--bytes", metavar="SIZE", dest="nbytes", required=True,
                   help="size in bytes: 1GB (10^9), 1GiB (2^30), 25MiB, 4096")
    p.add_argument("--ranks", type=int, metavar="N", help="number of ranks")
    p.add_argument("--dtype", default="float32", help="element type (default float32)")
    p.add_argument("--root", type=int, default=0, help="root of rooted collectives (default 0)")
    p.add_argument("--algorithm", action="append", metavar="NAME",
                   help="only these algorithms (repeatable; default: every registered one "
                        "but the naive oracle)")
    p.add_argument("--param", action="append", metavar="NAME=INT",
                   help="fix an algorithm parameter where it exists, e.g. pieces=8 or group=8")
    s = p.add_argument_group("disturbances")
    s.add_argument("--straggler", action="append", metavar="RANK:DELAY", default=[],
                   help="rank RANK starts DELAY late, e.g. 7:10ms (repeatable)")
    s.add_argument("--jitter", metavar="lognormal:SIGMA",
                   help="multiply every message's time by exp(SIGMA |Z|), Z standard normal "
                        "(never faster than without noise)")
    s.add_argument("--seed", type=int, default=0, help="seed of the noise (default 0)")
    f = p.add_argument_group("fabric", "beyond ringlet predict's links (two levels only "
                                       "for the NICs and the fat-tree)")
    f.add_argument("--nics-per-node", type=int, default=0, metavar="K",
                   help="NICs per node, shared by its GPUs (default, or 0: one per GPU)")
    f.add_argument("--nodes-per-leaf", type=int, default=0, metavar="L",
                   help="nodes per leaf switch of a two-level fat-tree (default 0: one "
                        "non-blocking switch); with --rails the leaves are rail-optimised "
                        "(NIC k of every node on rail k's leaves)")
    f.add_argument("--oversubscription", type=float, default=1.0, metavar="RATIO",
                   help="a leaf's downlinks over its uplinks, e.g. 2 for 2:1 (default 1)")
    f.add_argument("--gap", metavar="TIME", default="0",
                   help="LogGP g: least time a rank's port spends per message, when more "
                        "than the links' per-message overhead (--overhead) (default 0)")
    o = p.add_argument_group("output")
    o.add_argument("--json", action="store_true", help="print a JSON list, one object per "
                                                       "algorithm")
    o.add_argument("--trace", metavar="FILE", type=file_name,
                   help="write a Chrome trace (chrome://tracing, ui.perfetto.dev): a process "
                        "per algorithm, a row per rank, an event per round")
    o.add_argument("--compare", action="store_true",
                   help="also give ringlet predict's figure for the same algorithm and "
                        "parameters")
    add_link_options(p)


def parse_straggler(text: str) -> tuple[int, float]:
    rank, colon, delay = text.partition(":")
    try:
        if not colon:
            raise ValueError
        r = int(rank)
    except ValueError:
        raise ArgumentError(f"--straggler {text!r}: write RANK:DELAY, e.g. 7:10ms") from None
    return r, parse_time(delay, "--straggler delay")


def parse_jitter(text: str | None) -> float:
    if not text:
        return 0.0
    kind, colon, sigma = text.partition(":")
    try:
        if kind.strip().lower() != "lognormal" or not colon:
            raise ValueError
        v = float(sigma)
        if not (math.isfinite(v) and 0 <= v <= MAX_SIGMA):
            raise ValueError
    except ValueError:
        raise ArgumentError(f"--jitter {text!r}: write lognormal:SIGMA with SIGMA from 0 to "
                            f"{MAX_SIGMA:g}, e.g. lognormal:0.2") from None
    return v


def trace_events(results: list[tuple[Result, list[Any]]]) -> dict[str, Any]:
    """A Chrome trace: process per algorithm, thread per rank, an 'X' event per round."""
    events: list[dict[str, Any]] = []
    for pid, (res, rounds) in enumerate(results):
        events.append({"name": "process_name", "ph": "M", "pid": pid,
                       "args": {"name": f"{res.collective}/{res.algorithm}"}})
        for r in range(res.nranks):
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": r,
                           "args": {"name": f"rank {r}"}})
        for i, ranks, start, end in rounds:
            for r, a, b in zip(ranks.tolist(), (start * 1e6).tolist(), (end * 1e6).tolist(),
                               strict=True):
                events.append({"name": f"round {i}", "ph": "X", "pid": pid, "tid": r,
                               "ts": a, "dur": b - a})
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def main(args: argparse.Namespace) -> int:
    links = resolve_links(args)
    n = resolve_ranks(args, links)
    profile: Profile = links.profile
    nbytes = size_and_root(args, n)
    dt = dtype_of(args.dtype)
    whole = path_bytes(args.collective, unit_count(args.collective, nbytes, n, dt.itemsize), n,
                       dt.itemsize)
    if whole != nbytes:   # as ringlet predict: the size in whole elements, and a note
        links = dataclasses.replace(links, description=[
            *links.description, f"{nbytes:,} B is not a size {args.collective} moves in whole "
            f"{dt.name} elements on {n} ranks: simulated at {whole:,} B"])
        nbytes = whole
    if args.seed < 0:
        raise ArgumentError(f"--seed must be >= 0, got {args.seed}")
    if args.rails and profile.inter is None:
        raise ArgumentError("--rails needs two levels of links (a node shape or --intra/--inter)")
    topo = Topology.from_profile(
        profile, nics_per_node=args.nics_per_node, rails=bool(args.rails),
        nodes_per_leaf=args.nodes_per_leaf, oversubscription=args.oversubscription,
        gap=parse_time(args.gap, "--gap"))
    stragglers: dict[int, float] = {}
    for text in args.straggler:
        rank, delay = parse_straggler(text)
        if not 0 <= rank < n:   # one error, not one per algorithm
            raise ArgumentError(f"--straggler {text!r}: rank {rank} is out of range "
                                f"(0..{n - 1})")
        stragglers[rank] = stragglers.get(rank, 0.0) + delay
    jitter = parse_jitter(args.jitter)
    params = parse_params(args.param)
    chosen = chosen_algorithms(args.collective, args.algorithm, params)
    if args.trace:   # before the work: a path that cannot be written fails now
        check_file(args.trace, "--trace")
    paths = Paths.from_settings(Settings.from_env())   # as ringlet predict takes them
    names = chosen or [a for a in registered_algorithms(args.collective) if a != "naive"]
    out: list[dict[str, Any]] = []
    traced: list[tuple[Result, list[Any]]] = []
    for name in names:
        if name in ALL_PAIRS and args.collective not in ROOTED and n * (n - 1) > ALL_PAIRS_LIMIT:
            out.append({"algorithm": name, "applicable": False,
                        "reason": f"{n * (n - 1):,} messages a round: too many to simulate "
                                  f"(limit {ALL_PAIRS_LIMIT:,})"})
            continue
        rec: list[Any] | None = [] if args.trace else None
        try:
            run = params
            if "pieces" in entry(args.collective, name).params and "pieces" not in params \
                    and not profile.uses_host(n):
                # the piece count ringlet predict chooses (not the registry's default),
                # so that simulate and predict describe the same schedule
                best = predict(args.collective, name, n, nbytes, profile, args.dtype,
                               args.root, params=params, rails=bool(args.rails), paths=paths)
                # (within SIM_PIECES and SIM_PIECE_BYTES, see there)
                run = {**params, "pieces": max(1, min(best.pieces, max(4, SIM_PIECES // n),
                                                      int(nbytes) // SIM_PIECE_BYTES))}
            res = simulate(args.collective, name, n, nbytes, topo, dtype=args.dtype,
                           root=args.root, params=run, stragglers=stragglers, jitter=jitter,
                           seed=args.seed, trace=rec, rails=bool(args.rails), paths=paths,
                           progress=callback(f"ringlet simulate {name}", "rounds"))
        except ArgumentError as exc:
            if args.algorithm:
                raise
            out.append({"algorithm": name, "applicable": False, "reason": str(exc)})
            continue
        d = res.to_dict()
        # nccl-tests' bus bandwidth of the simulated time, as ringlet predict reports it
        d["busbw"] = nbytes / res.seconds * bus_factor(args.collective, n) if res.seconds \
            else float("inf")   # --json: null
        if args.compare:
            pieces = res.params.get("pieces")
            p = predict(args.collective, name, n, nbytes, profile, args.dtype, args.root,
                        pieces=pieces, params=res.params, rails=bool(args.rails),
                        paths=paths)
            d["predicted_seconds"] = p.seconds
        out.append(d)
        if rec is not None:
            traced.append((res, rec))
    ok = sorted((d for d in out if "seconds" in d), key=lambda d: (d["seconds"], d["algorithm"]))
    bad = [d for d in out if "seconds" not in d]
    if args.trace:   # written once the work is done: a failed run leaves no empty file
        with writing(args.trace, "--trace"), open(args.trace, "w") as trace:
            json.dump(trace_events(traced), trace)
    if args.json:
        print(dumps([*ok, *bad], indent=1))
        return 0 if ok else 1
    channels = (f"; as NCCL runs its rings: {profile.gpus_per_node} rail channels, each on "
                f"1/{profile.gpus_per_node} of the data (--rails)") if args.rails else ""
    print(f"simulate {args.collective} of {format_bytes(nbytes)} on {n} ranks: "
          f"{topo.describe(n)}{channels}")
    for line in links.description:
        print(f"  {line}")
    extra = []
    if stragglers:
        extra.append("stragglers " + ", ".join(f"rank {r} +{format_seconds(v)}"
                                               for r, v in sorted(stragglers.items())))
    if jitter:
        extra.append(f"jitter lognormal sigma {jitter:g}, seed {args.seed}")
    if extra:
        print("  " + "; ".join(extra))
    w = max([20, *(len(d["algorithm"]) for d in out)])
    head = (f"{'algorithm':<{w}} {'time':>11} {'busbw':>12} {'rounds':>7} {'messages':>13} "
            f"{'slowest':>8} {'pieces':>7}")
    print(head + (f" {'predict':>11} {'sim/predict':>11}" if args.compare else ""))
    for d in ok:
        line = (f"{d['algorithm']:<{w}} {format_seconds(d['seconds']):>11} "
                f"{format_bandwidth(d['busbw']):>12} {d['rounds']:>7} "
                f"{d['messages']:>13,} {d['slowest_rank']:>8} "
                f"{d.get('params', {}).get('pieces', 1):>7}")
        if args.compare:
            # nothing to compare where both are 0 s (one rank): '-', as busbw (was 'nan')
            ratio = f"{d['seconds'] / d['predicted_seconds']:.4f}" if d["predicted_seconds"] \
                else "-"
            line += f" {format_seconds(d['predicted_seconds']):>11} {ratio:>11}"
        print(line)
    for d in bad:
        print(f"{d['algorithm']:<{w}} not simulated: {d['reason']}")
    if args.trace:
        print(f"trace: {args.trace} (chrome://tracing or ui.perfetto.dev)")
    return 0 if ok else 1
