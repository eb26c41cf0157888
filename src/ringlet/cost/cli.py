"""``ringlet predict``: what a collective will cost, per algorithm, before you run it.

::

    ringlet predict all_reduce --bytes 14GB --ranks 8 --link nvlink4
    ringlet predict all_reduce --bytes 1GB --link dgx_h100 --nodes 16
    ringlet predict broadcast --bytes 64MB --ranks 32 --bandwidth 25GB/s --latency 5us --json
    ringlet predict --calibrate -n 2          # measure this host, save the profile

The link options (:func:`add_link_options`, :func:`resolve_links`) are shared
with ``ringlet plan``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..algorithms import MAX_RANKS, UNEVEN, parse_params
from ..config import Settings
from ..errors import ArgumentError
from ..jsonout import dumps
from ..ops import DType
from ..outputs import file_name
from ..rails import SCHEDULES as RAIL_SCHEDULES
from ..schedule import COLLECTIVES, UNIT, check_root
from .host import Paths
from .model import (
    DEFAULT_PROFILE_PATH,
    Crossover,
    Inapplicable,
    Link,
    Prediction,
    Profile,
    TextbookComparison,
    compare_textbook,
    crossovers,
    dtype_of,
    predict,
    predict_all,
    textbook_bytes,
    textbook_seconds,
    unit_count,
)
from .topology import NODES, LinkSpec, link_spec, local_profile, names, spec_for_bandwidth
from .units import (
    BANDWIDTH_EXAMPLES,
    format_bandwidth,
    format_bytes,
    format_seconds,
    parse_bandwidth,
    parse_size,
    parse_time,
)

#: The most ranks ``--calibrate -n`` takes: it runs a job at every count from 2 to N.
MAX_CALIBRATE_RANKS = 256


@dataclass(frozen=True)
class Links:
    """The resolved links: the model's profile and what the textbook divides by."""

    profile: Profile
    description: list[str]
    textbook_bandwidth: float            # the figure the seed would divide by (one level/intra)
    inter_textbook_bandwidth: float      # two levels: the inter link's figure
    line_rate: float | None              # one level: per-direction line rate
    efficiency: float = 1.0
    efficiency_source: str = ""
    link_name: str = ""
    headline_bidirectional: bool = False
    hints: tuple[str, ...] = ()


def add_link_options(p: argparse.ArgumentParser) -> None:
    """The options that say what the ranks are connected by (shared with ``ringlet plan``)."""
    g = p.add_argument_group(
        "links", "what the ranks are connected by. Bandwidths are per direction in bytes/s "
        f"(e.g. {BANDWIDTH_EXAMPLES}; a lower-case b is a bit); times take us/ms/s. "
        "Default: --link local")
    g.add_argument("--link", metavar="PRESET",
                   help=f"a preset link or node shape: {', '.join(names())}. A node shape "
                        "(dgx_*) gives two levels: NVLink inside a node, one NIC per GPU "
                        "between nodes. 'local' is this host (the calibrated profile if any, "
                        "else a conservative default)")
    g.add_argument("--bandwidth", metavar="BW",
                   help="your own one-level link: bandwidth PER DIRECTION, e.g. 25GB/s or "
                        "400Gb/s (NVLink 4's '900 GB/s' counts both directions: 450GB/s)")
    g.add_argument("--latency", metavar="TIME",
                   help="latency (alpha) per message of --bandwidth, e.g. 5us (default 0)")
    g.add_argument("--gamma", metavar="BW",
                   help="reduction speed for --bandwidth/--intra/--inter and preset links, "
                        "e.g. 10GB/s (default: free, as on GPUs where NCCL fuses it into the "
                        "copy; a preset's own)")
    g.add_argument("--intra", metavar="LINK",
                   help="two levels: the link inside a node, a preset or BW[,LATENCY] "
                        "(e.g. nvlink4 or 450GB/s,2us); needs --inter and --gpus-per-node")
    g.add_argument("--inter", metavar="LINK",
                   help="two levels: each rank's link to other nodes, a preset or "
                        "BW[,LATENCY] (e.g. ib_ndr or 50GB/s,4us); with --link X, X is the "
                        "link inside a node")
    g.add_argument("--nodes", type=int, metavar="N",
                   help="number of nodes; --ranks defaults to nodes x gpus-per-node")
    g.add_argument("--gpus-per-node", type=int, metavar="G",
                   help="ranks per node (rank r is on node r // G); a node shape sets it")
    g.add_argument("--rails", action="store_true",
                   help="two levels: count algorithms as NCCL runs its rings across nodes, "
                        "one channel per GPU, each leaving the node through its own NIC")
    g.add_argument("--overhead", metavar="TIME",
                   help="per-message cost of every link (LogGP's o: a rank that sends or "
                        "receives k messages in a round pays k x TIME on top of one latency), "
                        "e.g. 1us; 0 turns it off. Default: each preset's (NCCL's figures, "
                        "see docs/nccl.md), a calibrated profile's, 0 for --bandwidth and "
                        "BW[,LATENCY] links")
    g.add_argument("--line-rate", action="store_true",
                   help="use the presets' raw line rates, not their achievable efficiency")
    g.add_argument("--profile", metavar="PATH",
                   help=f"the profile --link local uses (JSON saved by --calibrate; default: "
                        f"the RINGLET_PROFILE setting, {DEFAULT_PROFILE_PATH}, if the file "
                        f"exists, else a conservative default)")


def _custom_link(text: str, what: str, gamma: float, latency: str | None = None
                 ) -> tuple[Link, float, str]:
    """BW[,LATENCY] (``latency``: ``--latency``'s text, which takes the place of LATENCY)."""
    bw_text, _, lat_text = text.partition(",")
    bw = parse_bandwidth(bw_text, what)
    if latency is not None and lat_text.strip():
        raise ArgumentError(f"{what} {text!r} gives a latency, and so does --latency "
                            f"{latency!r}: give it once")
    if latency is not None:
        lat = parse_time(latency, "--latency")
    else:
        lat = parse_time(lat_text, f"{what} latency") if lat_text.strip() else 0.0
    label = f"{format_bandwidth(bw)} per direction, alpha {format_seconds(lat)} (given)"
    return Link.from_bandwidth(bw, lat, gamma, f"given: {label}"), bw, label


def _slow(bw: float, what: str) -> list[str]:
    """A hint when a given bandwidth is so slow it is probably a unit left out."""
    if bw >= 1e6:
        return []
    return [f"{what} is {format_bandwidth(bw)} per direction: a number without a unit is "
            f"bytes per second (write e.g. 25GB/s or 100Gb/s)"]


def _level(text: str, what: str, gamma: float, efficiency: bool
           ) -> tuple[Link, float, str, LinkSpec | None]:
    """A preset name or BW[,LATENCY] -> (link, textbook bandwidth, description, spec)."""
    t = text.strip()
    if t and (t[0].isdigit() or t[0] == "."):
        link, bw, label = _custom_link(t, what, gamma)
        return link, bw, label, None
    spec = link_spec(t)
    return (spec.link(efficiency), spec.marketing, _describe(spec, efficiency), spec)


def _describe(spec: LinkSpec, efficiency: bool) -> str:
    eff = (f" x {spec.efficiency:.3g} achievable ({spec.efficiency_source})" if efficiency
           else " (line rate)")
    return (f"{spec.name}: {spec.description}; {format_bandwidth(spec.bandwidth)} per "
            f"direction (headline {spec.headline()}){eff}; alpha "
            f"{format_seconds(spec.latency)} ({spec.latency_source}); "
            f"{format_seconds(spec.overhead)} per message ({spec.overhead_source})")


def resolve_links(args: argparse.Namespace) -> Links:
    """The :class:`Links` the link options describe (ArgumentError if they conflict)."""
    links = _resolve_links(args)
    if args.gamma:
        # the presets' own reduction cost gives way to --gamma, as --bandwidth's does
        g = 1.0 / parse_bandwidth(args.gamma, "--gamma")
        prof = links.profile
        prof = dataclasses.replace(
            prof, intra=dataclasses.replace(prof.intra, gamma=g),
            inter=None if prof.inter is None else dataclasses.replace(prof.inter, gamma=g))
        links = dataclasses.replace(links, profile=prof)
    text = getattr(args, "overhead", None)
    if text is None:
        return links
    o = parse_time(text, "--overhead")
    prof = links.profile
    prof = dataclasses.replace(
        prof, intra=dataclasses.replace(prof.intra, overhead=o),
        inter=None if prof.inter is None else dataclasses.replace(prof.inter, overhead=o))
    return dataclasses.replace(links, profile=prof, description=[
        *links.description, f"per-message overhead {format_seconds(o)} on every link "
                            f"(--overhead)"])


def _resolve_links(args: argparse.Namespace) -> Links:
    gamma = parse_bandwidth(args.gamma, "--gamma") if args.gamma else 0.0
    gamma_s = 1.0 / gamma if gamma else 0.0
    eff = not args.line_rate
    link_key = (args.link or "").strip().lower().replace("-", "_")
    if args.link and args.inter and not args.intra and link_key not in NODES:
        args.intra, args.link = args.link, None   # --link X --inter Y: X inside a node
    sources = [n for n, v in (("--link", args.link), ("--bandwidth", args.bandwidth),
                              ("--intra/--inter", args.intra or args.inter)) if v]
    if len(sources) > 1:
        raise ArgumentError(f"give one of --link, --bandwidth or --intra/--inter, not "
                            f"{' and '.join(sources)}")
    if args.latency and not args.bandwidth:
        raise ArgumentError("--latency goes with --bandwidth (presets have their own)")
    local = not (args.bandwidth or args.intra or args.inter) and \
        (args.link or "local").strip().lower().replace("-", "_") == "local"
    if getattr(args, "profile", None) and not local:
        raise ArgumentError(f"--profile is what --link local reads; {sources[0]} does not "
                            f"(give one or the other)")
    hints: list[str] = []
    if args.bandwidth:
        link, bw, label = _custom_link(args.bandwidth, "--bandwidth", gamma_s,
                                       args.latency or None)
        for spec in spec_for_bandwidth(bw):
            hints.append(
                f"{format_bandwidth(bw)} is {spec.name}'s headline figure, which counts both "
                f"directions ({format_bandwidth(spec.bandwidth)} per direction); --bandwidth "
                f"is per direction, so use --link {spec.name} if that is your link")
        if not args.latency:
            hints.append("no --latency given: alpha = 0")
        hints += _slow(bw, "--bandwidth")
        return _with_nodes(args, Links(Profile(link, name="given"), [f"link: {label}"], bw, 0.0,
                                       bw, hints=tuple(hints)))
    if args.intra or args.inter:
        if not (args.intra and args.inter):
            raise ArgumentError("two levels need both --intra and --inter")
        if not args.gpus_per_node:
            raise ArgumentError("--intra/--inter need --gpus-per-node (ranks per node)")
        li, bi, di, _ = _level(args.intra, "--intra", gamma_s, eff)
        lo, bo, do, _ = _level(args.inter, "--inter", gamma_s, eff)
        prof = Profile(li, lo, args.gpus_per_node, "given")
        return _with_nodes(args, Links(prof, [f"inside a node: {di}", f"between nodes: {do}"],
                                       bi, bo, None,
                                       hints=(*_slow(bi, "--intra"), *_slow(bo, "--inter"))))
    name = (args.link or "local").strip().lower().replace("-", "_")
    if name in NODES:
        shape = NODES[name]
        g = args.gpus_per_node or shape.gpus_per_node
        base = shape.profile(eff)
        prof = Profile(base.intra, base.inter, g, shape.name, base.source)
        desc = [f"{shape.description} ({shape.source})",
                f"inside a node: {_describe(shape.intra, eff)}",
                f"between nodes: {_describe(shape.inter, eff)}"]
        return _with_nodes(args, Links(prof, desc, shape.intra.marketing, shape.inter.marketing,
                                       None))
    if name == "local":
        if args.gamma:
            raise ArgumentError("--gamma is for --bandwidth, --intra/--inter and preset links; "
                                "--link local has its calibrated reduction speed")
        # an explicit --profile must exist; the setting's path falls back to the default link
        prof = Profile.load(args.profile) if args.profile else \
            local_profile(Settings.from_env().profile)
        named = f"{prof.name}: " if prof.name and prof.name != "local" else ""
        where = [f"local: {named}{prof.source}"]
        elsewhere = prof.calibrated_elsewhere()
        if elsewhere:
            where.append(f"note: this profile was {elsewhere}")
        line = prof.intra.bandwidth if prof.inter is None else None
        return _with_nodes(args, Links(prof, where, prof.intra.bandwidth,
                                       prof.inter.bandwidth if prof.inter else 0.0, line))
    spec = link_spec(name)
    return _with_nodes(args, Links(
        Profile(spec.link(eff), name=spec.name, source=spec.source), [_describe(spec, eff)],
        spec.marketing, 0.0, spec.bandwidth, spec.efficiency if eff else 1.0,
        spec.efficiency_source if eff else "", spec.name, spec.bidirectional))


def _with_nodes(args: argparse.Namespace, links: Links) -> Links:
    """Check --nodes/--gpus-per-node against the links."""
    if args.gpus_per_node is not None and args.gpus_per_node < 1:
        raise ArgumentError(f"--gpus-per-node must be >= 1, got {args.gpus_per_node}")
    if args.nodes is not None and args.nodes < 1:
        raise ArgumentError(f"--nodes must be >= 1, got {args.nodes}")
    if links.profile.inter is None and (args.nodes or 1) > 1:
        raise ArgumentError(
            "--nodes > 1 needs a link between nodes: a node shape (--link dgx_h100), or "
            "--inter (e.g. --link nvlink4 --inter ib_ndr --gpus-per-node 8)")
    if args.rails and links.profile.inter is None:
        raise ArgumentError("--rails needs two levels of links (a node shape or --intra/--inter)")
    if args.gpus_per_node is not None and links.profile.inter is None:
        raise ArgumentError(
            "--gpus-per-node is for two levels of links (a node shape such as dgx_h100, or "
            "--intra/--inter); one level of links has no nodes: give --ranks")
    return links


def resolve_ranks(args: argparse.Namespace, links: Links, limit: int = MAX_RANKS) -> int:
    """--ranks, or --nodes x gpus per node; they must agree when both are given, and be
    at most ``limit``."""
    g = links.profile.gpus_per_node
    from_nodes = args.nodes * g if args.nodes and g else None
    if args.nodes and not g:
        raise ArgumentError("--nodes needs --gpus-per-node (or a node shape such as dgx_h100)")
    ranks = args.ranks if args.ranks is not None else from_nodes
    if ranks is None:
        raise ArgumentError("give --ranks N (or --nodes with a node shape / --gpus-per-node)")
    if from_nodes is not None and ranks != from_nodes:
        raise ArgumentError(
            f"--ranks {ranks} disagrees with --nodes {args.nodes} x {g} ranks per node "
            f"= {from_nodes}")
    if ranks < 1:
        raise ArgumentError(f"--ranks must be >= 1, got {ranks}")
    if ranks > limit:
        raise ArgumentError(f"{ranks:,} ranks: at most {limit:,} (the schedules are built "
                            f"rank by rank)")
    return int(ranks)


def size_and_root(args: argparse.Namespace, n: int) -> int:
    """``--bytes`` (at least 1) in bytes, after checking ``--root`` against ``n`` ranks
    and the collective."""
    nbytes = parse_size(args.nbytes, "--bytes", least=1)
    check_root(args.collective, args.root)
    if not 0 <= args.root < n:
        raise ArgumentError(f"--root {args.root} is out of range for {n} ranks")
    return nbytes


def chosen_algorithms(collective: str, names: list[str] | None,
                      params: dict[str, int]) -> list[str] | None:
    """The canonical names of ``--algorithm``'s choices (None: all), in order, once
    each; an :class:`ArgumentError` for an unknown name or for a ``--param`` that none
    of the algorithms in play takes (a misspelt one would be ignored silently)."""
    from ..algorithms import algorithms, entry

    chosen = list(dict.fromkeys(entry(collective, a).name for a in names)) if names else None
    takes = {k for a in (chosen or algorithms(collective))
             for k in entry(collective, a).params}
    unknown = sorted(set(params) - takes)
    if unknown:
        which = "--algorithm's choices" if chosen else f"the algorithms of {collective}"
        raise ArgumentError(f"--param {', '.join(unknown)}: none of {which} takes it "
                            f"(they take: {', '.join(sorted(takes)) or 'no parameters'})")
    return chosen


def configure(p: argparse.ArgumentParser) -> None:
    """Add ``ringlet predict``'s options."""
    p.description = textwrap.fill(
        "Predict a collective's time for every algorithm with the alpha-beta-gamma model, "
        "counted from the algorithms' own schedules: time, rounds (alpha), bytes per rank, "
        "algbw and nccl-tests busbw, the fastest, and the sizes where the fastest changes.")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = (
        "examples:\n"
        "  ringlet predict all_reduce --bytes 14GB --ranks 8 --link nvlink4\n"
        "  ringlet predict all_reduce --bytes 1GiB --link dgx_h100 --nodes 16 --rails\n"
        "  ringlet predict broadcast --bytes 64MB --ranks 32 --bandwidth 25GB/s --latency 5us\n"
        "  ringlet predict --calibrate -n 4           # this host, up to 4 ranks\n"
        "  ringlet predict all_reduce --bytes 1MiB --ranks 4   # then: with the profile\n"
        "sizes: --bytes is nccl-tests' size: the vector for all_reduce, broadcast and reduce; "
        "the whole output of all_gather and gather; the whole input of reduce_scatter and "
        "scatter; a rank's whole buffer for all_to_all.")
    p.add_argument("collective", nargs="?", choices=[*COLLECTIVES, *UNEVEN],
                   help="the collective (not with --calibrate); an uneven form "
                        "(all_to_all_v...) is predicted as its even schedule with equal "
                        "blocks of the same total")
    p.add_argument("--bytes", metavar="SIZE", dest="nbytes",
                   help="size in bytes: 14GB (10^9), 1.5GiB (2^30), 25MiB, 4096 "
                        "(required unless --calibrate)")
    p.add_argument("--ranks", type=int, metavar="N", help="number of ranks")
    p.add_argument("--dtype", default="float32",
                   help="element type (float32, float16/fp16, bfloat16/bf16, ...; "
                        "default float32)")
    p.add_argument("--root", type=int, default=0, help="root rank of rooted collectives "
                                                       "(default 0)")
    p.add_argument("--algorithm", action="append", metavar="NAME",
                   help="only these algorithms (repeatable; default: every registered one)")
    p.add_argument("--param", action="append", metavar="NAME=INT",
                   help="fix an algorithm parameter where it exists, e.g. group=8, or "
                        "pieces=4 for the pipelined ones (default: the model chooses the "
                        "pieces)")
    p.add_argument("--textbook", action="store_true",
                   help="also give the seeds' textbook estimate (volume x S / headline "
                        "bandwidth, e.g. 2S/B for all_reduce; no latency) and how the model "
                        "differs from it")
    p.add_argument("--no-crossovers", action="store_true",
                   help="skip the search for the sizes where the fastest algorithm changes")
    p.add_argument("--json", action="store_true",
                   help="print a JSON list, one object per algorithm (with --calibrate: the "
                        "profile)")
    add_link_options(p)
    # what a call costs on an engine besides its links (predict only: ringlet simulate and
    # ringlet plan count schedules on links)
    p.add_argument("--call", metavar="TIME",
                   help="a fixed cost of every call on top of its schedule, e.g. 1.2ms: "
                        "ringlet's agreement on the call and the engine's own per-call "
                        "costs, which the links do not describe (measure it as the time of "
                        "comm.barrier() on the job: benchmarks/multihost.py does); the same "
                        "for every algorithm, so it changes no choice. Default 0")
    p.add_argument("--rail-call", metavar="TIME",
                   help="two levels, all_reduce: what the engine's own all_reduce of a "
                        "tiny shard on a rail takes, e.g. 2ms, where it runs the two-level "
                        "algorithms' inter-node phase (ringlet's native rails: "
                        "RINGLET_RAILS, auto on torch.distributed): its fixed cost, which "
                        "the link's latency does not describe (torch's gloo: its threads' "
                        "wake-ups for each of its ring's segments). That phase "
                        "(hierarchical_pipelined: each piece's) then costs TIME plus its "
                        "bytes on the inter link, in place of the link's latency terms "
                        "(measure it as the engine's all_reduce of 1 KiB on one rail, all "
                        "rails at once: benchmarks/multihost.py does). Default: none, the "
                        "phase is the link's ring")
    c = p.add_argument_group("calibration", textwrap.fill(
        "--calibrate measures this host's shared-memory transport on live ranks (fixed "
        "costs in seconds at every rank count up to -n, ping-pong, copy and reduction "
        "throughput in bytes/s, data through the fused and the step-executor paths), fits "
        "them by least squares, prints every term with its fit error and saves the "
        "profile: the automatic algorithm choice then predicts with it. About 10 s at -n 2 "
        "on two cores; run it on a quiet machine.", 78))
    c.add_argument("--calibrate", action="store_true",
                   help="calibrate this host and save the profile (no collective, no --bytes)")
    c.add_argument("-n", "--nranks", type=int, metavar="N",
                   help="ranks to calibrate with (default 2); fixed costs are measured at "
                        "every count from 1 to N, so use at least the largest job you run "
                        "here (beyond N they are extrapolated)")
    c.add_argument("--out", metavar="PATH", type=file_name,
                   help=f"where to save the profile (default: the RINGLET_PROFILE setting, "
                        f"{DEFAULT_PROFILE_PATH})")
    c.add_argument("--reps", type=int, metavar="R",
                   help="timed batches per measurement, the median is kept (default 5)")
    c.add_argument("--quick", action="store_true",
                   help="a tiny sweep for smoke tests: a few seconds, rough figures (not for "
                        "real use: it needs --out, so that it never replaces the profile "
                        "jobs choose by)")


def _ranges(cross: list[Crossover], name: str, lo: int, hi: int, first: str
            ) -> list[list[int]]:
    """The size ranges [from, to) where ``name`` is the fastest."""
    out: list[list[int]] = []
    start, cur = lo, first
    for c in cross:
        if cur == name:
            out.append([start, c.nbytes])
        start, cur = c.nbytes, c.above
    if cur == name:
        out.append([start, hi])
    return out


def calibrate(args: argparse.Namespace) -> int:
    """Run ``ringlet predict --calibrate``: measure, fit, report and save the profile."""
    from .calibrate import calibrate as run_calibration
    from .calibrate import report

    given = [(n, t) for n, t, v in (("collective", args.collective, args.collective),
                                    ("--bytes", f"--bytes {args.nbytes}", args.nbytes))
             if v is not None]
    if given:
        raise ArgumentError(
            f"--calibrate takes {' and '.join(f'no {n}' for n, _ in given)} (given: "
            f"{' '.join(t for _, t in given)}); it measures this host (ringlet predict "
            f"--calibrate [-n N] [--out PATH])")
    settings = Settings.from_env()
    if args.quick and not args.out:
        raise ArgumentError("--quick makes rough figures for smoke tests: give --out PATH (it "
                            "would replace the profile the jobs' automatic choice reads, "
                            "RINGLET_PROFILE's)")
    out = args.out or settings.profile
    if not out:
        raise ArgumentError("RINGLET_PROFILE is '' (no tuner): give --out PATH to say where "
                            "the profile goes")
    if args.nranks is not None and not 2 <= args.nranks <= MAX_CALIBRATE_RANKS:
        raise ArgumentError(
            f"calibration needs 2 to {MAX_CALIBRATE_RANKS} ranks (-n), got {args.nranks} (it "
            f"runs a job at every count up to N; beyond N the fixed costs are extrapolated)")
    from ..outputs import check_file, writing

    option = "--out" if args.out else "RINGLET_PROFILE"
    if not args.out:   # the default place (~/.cache/ringlet) is made if missing
        with writing(out, option):
            Path(out).expanduser().parent.mkdir(parents=True, exist_ok=True)
    check_file(str(Path(out).expanduser()), option)   # before minutes of measuring
    from .measure import idle

    before = idle(0.5)
    profile = run_calibration(2 if args.nranks is None else args.nranks, quick=args.quick,
                              reps=5 if args.reps is None else args.reps, settings=settings)
    after = idle(0.5)
    if min(before, after) < 0.8:
        print(f"warning: the CPUs were busy around the calibration ({before:.0%} idle "
              f"before, {after:.0%} after): other work may have skewed it; calibrate again "
              f"on a quiet machine", file=sys.stderr)
    with writing(out, option):
        path = profile.save(out)
    if args.json:
        print(json.dumps(profile.to_dict(), indent=2))
        return 0
    for line in report(profile):
        print(line)
    print(f"\nsaved to {path}")
    return 0


def main(args: argparse.Namespace) -> int:
    """Run ``ringlet predict`` (or, with ``--calibrate``, the calibration)."""
    if args.calibrate:
        return calibrate(args)
    extra = [n for n, v in (("-n", args.nranks), ("--out", args.out), ("--reps", args.reps))
             if v is not None] + (["--quick"] if args.quick else [])
    if extra:
        raise ArgumentError(f"{', '.join(extra)} go with --calibrate")
    if args.collective is None or args.nbytes is None:
        raise ArgumentError("give a collective and --bytes (e.g. ringlet predict all_reduce "
                            "--bytes 1MiB --ranks 4), or --calibrate")
    check_root(args.collective, args.root)   # as given: all_to_all_v, not all_to_all
    uneven = args.collective if args.collective in UNEVEN else None
    if uneven:   # the even schedule it runs, among the algorithms that take uneven blocks
        from ..uneven import listed

        args.collective = UNEVEN[uneven]
        args.algorithm = args.algorithm or listed(args.collective)
        bad_algos = sorted(set(args.algorithm) - set(listed(args.collective)))
        if bad_algos:
            raise ArgumentError(f"{', '.join(bad_algos)}: not an algorithm of {uneven} "
                                f"(ringlet.algorithms({uneven!r}): "
                                f"{', '.join(listed(args.collective))})")
    started = time.perf_counter()
    links = resolve_links(args)
    n = resolve_ranks(args, links)
    nbytes = size_and_root(args, n)
    d = dtype_of(args.dtype)
    params = parse_params(args.param)
    args.algorithm = chosen_algorithms(args.collective, args.algorithm, params)
    paths = Paths.from_settings(Settings.from_env())
    preds = predict_all(args.collective, n, nbytes, links.profile, d, args.root,
                        args.algorithm, params, args.rails, paths)
    ok = [p for p in preds if isinstance(p, Prediction)]
    bad = [p for p in preds if isinstance(p, Inapplicable)]
    # an engine's own costs, which the links do not describe (measured on the job)
    notes: list[str] = []
    call = parse_time(args.call, "--call") if args.call else 0.0
    if call:
        ok = [with_call(p, call) for p in ok]
        notes.append(f"a fixed {format_seconds(call)} per call on top of the schedule (--call)")
    rail = parse_time(args.rail_call, "--rail-call") if args.rail_call else 0.0
    if rail:
        if args.collective != "all_reduce" or links.profile.levels_for(n) < 2:
            raise ArgumentError("--rail-call is for all_reduce on two levels (the native "
                                "rails run its hierarchical algorithm's inter-node phase): "
                                "give --inter with --nodes and --gpus-per-node, or a node "
                                "shape")
        ok = sorted((with_rail_call(p, rail, links.profile, d)
                     if p.algorithm in RAIL_SCHEDULES else p for p in ok),
                    key=lambda p: (p.seconds, p.algorithm))   # predict_all's order
        notes.append(f"hierarchical's inter-node phase {format_seconds(rail)} plus its bytes "
                     f"on the inter link, the engine's own all_reduce on a rail (--rail-call)")
    if ok and ok[0].nbytes != nbytes:
        notes.append(f"{nbytes:,} B is not a size {args.collective} moves in whole {d.name} "
                     f"elements on {n} ranks: predicted at {ok[0].nbytes:,} B")
    if notes:
        links = dataclasses.replace(links, description=[*links.description, *notes])
    lo = d.itemsize * (n if any(v == "N" for v in COLLECTIVES[args.collective].values())
                       else 1)
    hi = max(1 << 40, 4 * nbytes)
    cross: list[Crossover] = []
    first = ok[0].algorithm if ok else ""
    if ok and not args.no_crossovers and len(ok) > 1:
        names_ok = [p.algorithm for p in ok]
        cross = crossovers(args.collective, n, links.profile, d, args.root, names_ok, lo, hi,
                           params, args.rails, paths)
        first = cross[0].below if cross else ok[0].algorithm
    if links.profile.levels_for(n) == 2 and links.inter_textbook_bandwidth:
        # ranks on several nodes: the textbook divides by the link between them, the slowest
        links = dataclasses.replace(links, textbook_bandwidth=links.inter_textbook_bandwidth)
    tb_s = (textbook_seconds(args.collective, ok[0].nbytes, links.textbook_bandwidth)
            if ok and args.textbook and links.textbook_bandwidth else None)
    if args.json:
        rows: list[dict[str, Any]] = []
        for p in ok:
            row = {**p.to_dict(), "applicable": True, "fastest": p is ok[0]}
            if not args.no_crossovers:
                row["fastest_ranges"] = _ranges(cross, p.algorithm, lo, hi, first)
            if tb_s is not None:
                row["textbook"] = _comparison(p, links, tb_s).to_dict()
            rows.append(row)
        rows += [b.to_dict() for b in bad]
        print(dumps(rows))
        return 0 if ok else 1
    out = sys.stdout
    m = unit_count(args.collective, nbytes, n, d.itemsize)
    size = ok[0].nbytes if ok else nbytes
    print(f"{args.collective} of {format_bytes(size)} on {n} ranks: m = {m:,} {d.name} "
          f"({UNIT[args.collective]})", file=out)
    for line in links.description:
        print(f"  {line}", file=out)
    for h in links.hints:
        print(f"  note: {h}", file=out)
    if not ok:
        print("no algorithm applies:", file=out)
    else:
        w = max(len(p.algorithm) for p in ok)
        print(f"\n  {'algorithm':<{w}}  {'time':>10}  {'rounds':>7}  {'bytes/rank':>10}  "
              f"{'algbw':>11}  {'busbw':>11}  {'pieces':>6}", file=out)
        for p in ok:
            mark = "  <- fastest" if p is ok[0] else ""
            print(f"  {p.algorithm:<{w}}  {format_seconds(p.seconds):>10}  {p.rounds:>7}  "
                  f"{format_bytes(p.bytes_per_rank):>10}  {format_bandwidth(p.algbw):>11}  "
                  f"{format_bandwidth(p.busbw):>11}  {p.pieces:>6}{mark}", file=out)
        best = ok[0]
        print(f"\nfastest: {best.algorithm}, {format_seconds(best.seconds)} "
              f"(alpha {format_seconds(best.alpha_seconds)}"
              + (f" of which per-message {format_seconds(best.overhead_seconds)}"
                 if best.overhead_seconds else "")
              + f", beta "
              f"{format_seconds(best.beta_seconds)}, gamma {format_seconds(best.gamma_seconds)};"
              f" counted over {best.counted})", file=out)
        if best.pieces_rule:
            print(f"  pieces: {best.pieces_rule}", file=out)
        if not args.no_crossovers and len(ok) > 1:
            if cross:
                segs = [f"{first} below {format_bytes(cross[0].nbytes)}"]
                segs += [f"{c.above} from {format_bytes(c.nbytes)}" for c in cross]
                print("crossovers (fastest by size): " + "; ".join(segs), file=out)
            else:
                print(f"crossovers: none; {first} is fastest from {format_bytes(lo)} to "
                      f"{format_bytes(hi)}", file=out)
        if tb_s is not None:
            print(f"\ntextbook: {textbook_bytes(args.collective, size) / size:g}S / "
                  f"{format_bandwidth(links.textbook_bandwidth)} = {format_seconds(tb_s)}",
                  file=out)
            for line in _comparison(best, links, tb_s).lines():
                print(f"  {line}", file=out)
    for b in bad:
        print(f"  not applicable: {b.algorithm}: {b.reason}", file=out)
    elapsed = time.perf_counter() - started
    if uneven:
        print(f"\n{uneven}: the {args.collective} schedule with equal blocks of the same "
              f"total; uneven counts move the same rounds with other bytes per message "
              f"(the largest block bounds each round)", file=out)
    print(f"\n(answered in {elapsed:.2f} s)", file=out)
    return 0 if ok else 1


def with_call(p: Prediction, call: float) -> Prediction:
    """``p`` with a fixed ``call`` seconds more (counted with the latency terms)."""
    seconds = p.seconds + call
    algbw = p.nbytes / seconds if seconds > 0 else math.inf
    factor = p.busbw / p.algbw if p.algbw and math.isfinite(p.algbw) else 0.0
    return dataclasses.replace(p, seconds=seconds, alpha_seconds=p.alpha_seconds + call,
                               algbw=algbw, busbw=algbw * factor)


def with_rail_call(p: Prediction, call: float, profile: Profile, d: DType) -> Prediction:
    """``p``, a two-level hierarchical all_reduce, with its inter-node phase run by the
    engine's own all_reduce, which takes ``call`` seconds plus its bytes' time.

    That phase is a ring all_reduce of one shard (``1/g`` of the vector, ``g`` ranks
    per node) among the ``G`` ranks of a rail, over the inter link: the
    hierarchical schedule's inter-node rounds.  With the native rails the engine's
    all_reduce runs it, and an engine's call has a fixed cost of its own (torch's
    gloo: its threads' wake-ups at each of its ring's steps, on every rank), which
    the link's latency does not describe and which does not overlap the bytes' time
    (each step waits for its segment to arrive before the next starts).  So per
    piece the ring's latency terms give way to ``call``: the call changes by
    ``call`` minus their time per piece, counted with the latency terms; its
    bandwidth and reduction terms stay the link's.

    Until run 17 of benchmarks/MULTIHOST.md this phase cost the larger of ``call``
    and the ring (a floor that the bytes' time overlapped): measured on a test bed
    whose link let short transfers through faster than its rate.  On the corrected
    bed that law put the torch engine's 64 KiB-1 MiB calls 18-39 % low."""
    if profile.inter is None:
        raise ArgumentError("--rail-call needs two levels of links (--inter)")
    g = profile.gpus_per_node
    G = p.nranks // g
    pieces = max(1, p.pieces)
    shard = max(d.itemsize, p.nbytes // (g * pieces) // d.itemsize * d.itemsize)
    phase = predict("all_reduce", "ring", G, shard, Profile(profile.inter), d)
    return with_call(p, pieces * (call - phase.alpha_seconds))


def _comparison(p: Prediction, links: Links, tb_s: float) -> TextbookComparison:
    return compare_textbook(
        textbook_seconds=tb_s, textbook_bytes=textbook_bytes(p.collective, p.nbytes),
        textbook_bandwidth=links.textbook_bandwidth, model_seconds=p.seconds,
        beta_seconds=p.beta_seconds, alpha_seconds=p.alpha_seconds,
        gamma_seconds=p.gamma_seconds, critical_bytes=p.critical_bytes, rounds=p.rounds,
        nranks=p.nranks, line_rate=links.line_rate, efficiency=links.efficiency,
        efficiency_source=links.efficiency_source, link_name=links.link_name,
        headline_bidirectional=links.headline_bidirectional,
        overhead_seconds=p.overhead_seconds)


__all__ = ["Links", "add_link_options", "calibrate", "configure", "main", "resolve_links",
           "resolve_ranks"]
