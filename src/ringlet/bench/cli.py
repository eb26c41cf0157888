"""``ringlet bench``: nccl-tests-style measurements, with gloo and MPI side by side.

::

    ringlet bench all_reduce -n 2 -b 8 -e 64M -f 4
    ringlet bench all_reduce -n 2 -b 8 -e 64M -f 8 --vs gloo,mpi --json ar.json --plot ar.png
    ringlet bench broadcast -n 4 -b 16M -e 16M --vs mpi --root 1

The command starts its own ranks (:func:`ringlet.spawn`), measures every size,
then measures the same sizes with each peer of ``--vs`` in the peer's own
processes (one implementation runs at a time, so they never compete for the
cores), and prints one table.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import shlex
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

from ..config import Settings
from ..errors import ArgumentError, RingletError
from ..jsonout import dumps
from ..ops import DTYPES, LOC, ReduceOp, check_op
from ..outputs import FIGURE_SUFFIXES, check_file, file_name, writing
from ..progress import Progress, from_ranks
from .core import (
    BENCH_DTYPES,
    COLLECTIVES,
    PERIOD,
    SHARED_OK,
    Job,
    Row,
    cases,
    collective,
    parse_bytes,
    sweep_sizes,
)
from .peers import INSTALL, PeerRun, check_supported, parse_vs, run_peer
from .report import Result, environment, human_bytes, table, to_json, write_plot

#: the reductions -o takes (every ReduceOp but MINLOC and MAXLOC, which reduce pairs)
BENCH_OPS = ("sum", "prod", "min", "max", "avg", "band", "bor", "bxor", "land", "lor", "lxor")

DEFAULTS = {"nranks": 2, "minbytes": "8", "maxbytes": "64M", "stepfactor": 4, "iters": 20,
            "warmup": 5, "budget": 0.5, "dtype": "float32", "op": "sum", "root": 0,
            "algo": "auto"}


#: the longest --timeout: a week
MAX_TIMEOUT = 7 * 86400.0
#: memory of a rank's process before its buffers (a forked rank writes about 7 MB)
RANK_MEMORY = 8 << 20


def configure(p: argparse.ArgumentParser) -> None:
    """Add ``ringlet bench``'s options to ``p``."""
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = textwrap.fill(
        "nccl-tests style benchmark of one collective over a range of sizes, on N local "
        "ranks that it starts itself; with --vs, torch's gloo and MPI (mpi4py + MPICH) "
        "measured at the same sizes in the same run.", 79)
    p.epilog = "\n".join(textwrap.fill(para, 79, subsequent_indent="  ") for para in [
        "sizes take K, M, G (binary, as nccl-tests: 64M = 64 MiB).",
        "columns: time = max over ranks of the mean time per call (us); algbw = size/time; "
        "busbw = algbw * nccl-tests' bus factor (GB/s); #wrong = elements that differ from "
        "numpy's answer.",
        "ratio (with --vs) = peer time / ringlet time in the same form: > 1 means ringlet "
        "is faster.",
        f"--vs needs the peers extra: {INSTALL}; --plot needs matplotlib "
        "(pip install 'ringlet[plot]').",
        "exit status: 0 if every checked element was right and every peer ran, 1 if not, "
        "2 for bad arguments."])
    p.add_argument("collective", metavar="COLLECTIVE",
                   help=f"one of: {', '.join(COLLECTIVES)} (sendrecv: a ping-pong)")
    p.add_argument("-n", "--nranks", type=int, default=DEFAULTS["nranks"], metavar="N",
                   help="ranks to start (default %(default)s)")
    p.add_argument("-b", "--minbytes", default=DEFAULTS["minbytes"], metavar="SIZE",
                   help="smallest size in bytes (default %(default)s)")
    p.add_argument("-e", "--maxbytes", default=DEFAULTS["maxbytes"], metavar="SIZE",
                   help="largest size in bytes (default %(default)s)")
    p.add_argument("-f", "--stepfactor", type=int, default=DEFAULTS["stepfactor"],
                   metavar="F", help="multiply the size by F between rows; the last row "
                                     "is always -e (default %(default)s)")
    p.add_argument("--algo", default=DEFAULTS["algo"], metavar="NAME",
                   help="ringlet's algorithm (see ringlet.algorithms(collective)), or auto "
                        "(default: ringlet's choice per size)")
    p.add_argument("-o", "--op", default=DEFAULTS["op"],
                   help=f"reduction: {' '.join(BENCH_OPS)} (band bor bxor land lor lxor on "
                        f"bool and integer -d; default %(default)s)")
    p.add_argument("-d", "--dtype", default=DEFAULTS["dtype"],
                   help=f"element type: {', '.join(BENCH_DTYPES)} (default %(default)s)")
    p.add_argument("-r", "--root", type=int, default=DEFAULTS["root"],
                   help="root of broadcast, reduce, scatter, gather (default %(default)s)")
    p.add_argument("--iters", type=int, default=DEFAULTS["iters"], metavar="N",
                   help="timed calls per size and form, at most (default %(default)s)")
    p.add_argument("-w", "--warmup", type=int, default=DEFAULTS["warmup"], metavar="N",
                   help="warm-up calls per size and form, at most (default %(default)s); 0 "
                        "times exactly --iters calls, unbounded by --budget")
    p.add_argument("--budget", type=float, default=DEFAULTS["budget"], metavar="SECONDS",
                   help="time allowed for the timed calls (and for the warm-up) of one size "
                        "and form; fewer calls are made when they would not fit, at least "
                        "one (default %(default)s)")
    p.add_argument("--buffers", choices=("private", "shared"), default="private",
                   help="ringlet's buffers: private numpy arrays (default), or shared: "
                        "allocated with comm.empty, in shared memory, for the zero-copy "
                        "paths (all_reduce in place); the peers always use private arrays")
    p.add_argument("--vs", metavar="PEERS",
                   help="also measure these peers at the same sizes: gloo, mpi or gloo,mpi")
    check = p.add_mutually_exclusive_group()   # one of them: the last one won
    check.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                       help="check every size against numpy (default: on)")
    check.add_argument("-c", dest="check", type=lambda v: _flag(v, "-c"), metavar="0|1",
                       help="nccl-tests' spelling of --check / --no-check (not with them)")
    p.add_argument("--json", metavar="FILE", type=file_name,
                   help="write every row and the environment here")
    p.add_argument("--plot", metavar="FILE.png", type=file_name,
                   help="draw busbw against size here")
    p.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="deadline for ringlet's sweep and for each peer's (default: 60 s plus "
                        "2 * budget + 10 s per size and form)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar (it is also off when stderr is not a terminal)")


def _flag(value: str, option: str) -> bool:
    """nccl-tests' 0/1 switches (``-c 1``)."""
    if value not in ("0", "1"):
        raise argparse.ArgumentTypeError(f"{option} takes 0 or 1, got {value!r}")
    return value == "1"


def make_job(args: argparse.Namespace) -> Job:
    """Validate the options and build the :class:`Job`; ArgumentError before anything runs."""
    coll = collective(args.collective)
    n = args.nranks
    if n < 1:
        raise ArgumentError(f"-n/--nranks must be at least 1, got {n}")
    if coll.name == "sendrecv" and n < 2:
        raise ArgumentError("sendrecv is a ping-pong between rank pairs: give -n 2 or more")
    if args.dtype not in BENCH_DTYPES:
        raise ArgumentError(f"--dtype {args.dtype!r} is not one of {', '.join(BENCH_DTYPES)}")
    if args.dtype == "bfloat16":
        if importlib.util.find_spec("torch") is None:
            raise ArgumentError("--dtype bfloat16 runs on torch tensors: pip install "
                                "torch==2.13.0")
        if args.vs is not None:
            raise ArgumentError("--dtype bfloat16 is measured for ringlet only (the peers' "
                                "benchmarks fill numpy arrays); drop --vs")
        if args.buffers == "shared":
            raise ArgumentError("--dtype bfloat16 runs on torch tensors: drop --buffers "
                                "shared")
    op = "none"
    if coll.reduces:
        rop = ReduceOp.parse(args.op)
        if rop in LOC:   # check_op would point at ringlet.pairs, which a bench user cannot call
            raise ArgumentError(f"-o/--op {args.op}: ringlet bench does not measure MINLOC or "
                                f"MAXLOC (they reduce (value, index) pairs, which it does not "
                                f"make); use one of {', '.join(BENCH_OPS)}")
        check_op(rop, DTYPES[args.dtype])
        op = rop.name.lower()
    if coll.rooted and not 0 <= args.root < n:
        raise ArgumentError(f"--root {args.root} is not a rank of {n} (0..{n - 1})")
    if args.iters < 1:
        raise ArgumentError(f"--iters must be at least 1, got {args.iters}")
    if args.warmup < 0:
        raise ArgumentError(f"--warmup must be 0 or more, got {args.warmup}")
    if not (args.budget > 0 and math.isfinite(args.budget)):
        raise ArgumentError(f"--budget must be a positive number of seconds, got {args.budget}")
    if args.timeout is not None and not 0 < args.timeout <= MAX_TIMEOUT:
        raise ArgumentError(f"--timeout must be a number of seconds from 0 to "
                            f"{MAX_TIMEOUT:g} (a week), got {args.timeout}")
    sizes = sweep_sizes(parse_bytes(args.minbytes, "-b/--minbytes"),
                        parse_bytes(args.maxbytes, "-e/--maxbytes"), args.stepfactor)
    rows = cases(coll, sizes, DTYPES[args.dtype].itemsize, n)
    algo = None if args.algo in (None, "auto") else args.algo
    if coll.name == "sendrecv" and algo is not None:
        raise ArgumentError("sendrecv is plain send/recv: it has no algorithms; drop --algo")
    if args.buffers == "shared" and coll.name not in SHARED_OK:
        raise ArgumentError(
            f"--buffers shared: {coll.name}'s buffers differ between the root and the other "
            f"ranks, and comm.empty needs the same on every rank; it works with "
            f"{', '.join(SHARED_OK)}")
    job = Job(coll.name, n, args.dtype, op, args.root if coll.rooted else 0, tuple(rows),
              args.warmup, args.iters, args.budget, args.check, algo, args.buffers)
    _check_memory(job)
    return job


def _check_memory(job: Job) -> None:
    """Refuse a sweep whose buffers would not fit in this machine's memory."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    size = max(s for s, _ in job.cases)
    # per rank: input, output, the expected answer, and the transport's copies (and the
    # shared buffers); every rank's input pattern (Data.tables: nranks * PERIOD elements,
    # bfloat16's as float32, twice while they are made); and the process itself
    itemsize = 4 if job.dtype == "bfloat16" else DTYPES[job.dtype].itemsize
    tables = 2 * job.nranks * PERIOD * itemsize
    need = job.nranks * ((6 if job.buffers == "shared" else 4) * size + tables + RANK_MEMORY)
    if need > 0.8 * phys:
        raise ArgumentError(
            f"{job.nranks} ranks at {human_bytes(size)} need about {human_bytes(need)} of "
            f"memory; this machine has {human_bytes(phys)}: lower -e/--maxbytes or -n")


def algorithms(job: Job, settings: Settings) -> list[str]:
    """ringlet's algorithm for each row, chosen as the communicator chooses."""
    if job.collective == "sendrecv":
        return ["send/recv"] * len(job.cases)
    from ..algorithms import build
    from ..algorithms.select import choose

    try:
        names = [choose(job.collective, job.nranks, size, requested=job.algorithm,
                        setting=settings.algo) for size, _ in job.cases]
        for name in sorted(set(names)):  # an algorithm that cannot run on n ranks says so here
            build(job.collective, name, job.nranks, job.root)
    except RingletError as exc:
        if job.algorithm is None:  # RINGLET_ALGO's own message names it
            raise
        raise ArgumentError(
            f"--algo {job.algorithm}: {str(exc).removeprefix('algorithm=: ')}") from None
    return names


def default_timeout(job: Job, forms: int) -> float:
    """60 s to start, and 2 budgets + 10 s per size and form."""
    return 60.0 + len(job.cases) * forms * (2 * job.budget + 10.0)


def command_line(args: argparse.Namespace) -> str:
    """The equivalent command, every option explicit (for RESULTS.md and the JSON)."""
    parts = ["ringlet", "bench", args.collective, "-n", str(args.nranks), "-b", args.minbytes,
             "-e", args.maxbytes, "-f", str(args.stepfactor)]
    coll = COLLECTIVES[args.collective]
    if args.algo not in (None, "auto"):
        parts += ["--algo", args.algo]
    if coll.reduces:
        parts += ["--op", args.op]
    parts += ["--dtype", args.dtype]
    if coll.rooted:
        parts += ["--root", str(args.root)]
    parts += ["--iters", str(args.iters), "--warmup", str(args.warmup),
              "--budget", f"{args.budget:g}"]
    if args.buffers != "private":
        parts += ["--buffers", args.buffers]
    if args.vs:
        parts += ["--vs", args.vs]
    if not args.check:
        parts.append("--no-check")
    if args.json:
        parts += ["--json", args.json]
    if args.plot:
        parts += ["--plot", args.plot]
    return shlex.join(parts)


def run_ringlet(job: Job, settings: Settings, timeout: float, progress: Progress) -> list[Row]:
    """ringlet's sweep on ``job.nranks`` ranks started by :func:`ringlet.spawn`."""
    from ..launch import spawn
    from .suite import run_rank

    with from_ranks(lambda size: progress.step(f"ringlet {human_bytes(size)}"),
                    settings, "ringlet-bench-progress") as (q, settings):
        rows = spawn(run_rank, job.nranks, job.to_json(), q, settings=settings,
                     timeout=timeout)[0]
    if not isinstance(rows, list):
        raise ArgumentError("internal: rank 0 returned no rows")
    return rows


def main(args: argparse.Namespace) -> int:
    """Run ``ringlet bench``; 0 if all is well, 1 if an element was wrong or a peer failed."""
    if args.plot:
        _check_plot(args.plot)
    if args.json:
        check_file(args.json, "--json")
    res = collect(args)
    sys.stdout.write(table(res))
    sys.stdout.flush()
    if args.json:
        with writing(args.json, "--json"):
            Path(args.json).write_text(dumps(to_json(res, sys.argv), indent=1) + "\n")
    if args.plot:
        with writing(args.plot, "--plot"):
            write_plot(res, args.plot)
    return 1 if res.failed() else 0


def parse(argv: list[str]) -> argparse.Namespace:
    """``ringlet bench``'s options from ``argv`` (e.g. ``["all_reduce", "-e", "1M"]``)."""
    p = argparse.ArgumentParser(prog="ringlet bench")
    configure(p)
    return p.parse_args(argv)


def collect(args: argparse.Namespace, what: str = "ringlet bench") -> Result:
    """Validate ``args``, measure ringlet and the peers of ``--vs``, and return the
    :class:`Result` (nothing printed but the progress bar ``what``, on a terminal
    unless ``-q``).  ArgumentError before anything runs."""
    job = make_job(args)
    settings = Settings.from_env()
    algos = algorithms(job, settings)  # also rejects an unknown --algo before anything runs
    peers = parse_vs(args.vs) if args.vs is not None else []
    check_supported(peers, job)
    coll = COLLECTIVES[job.collective]
    timeout = args.timeout or default_timeout(job, len(coll.forms))
    progress = Progress(len(job.cases) * (1 + len(peers)), what, "sizes",
                        False if args.quiet else None)
    runs: list[PeerRun] = []
    try:
        rows = run_ringlet(job, settings, timeout, progress)
        for name in peers:
            runs.append(run_peer(name, job, args.timeout or default_timeout(job, 1),
                                 _stepper(progress, name)))
    finally:
        progress.close()
    return Result(job, rows, algos, runs, command_line(args), environment())


def _stepper(progress: Progress, name: str) -> Callable[[Row], None]:
    """Advance ``progress`` by one size of ``name``."""
    return lambda row: progress.step(f"{name} {human_bytes(row.size)}")


def _check_plot(path: str) -> None:
    from importlib.util import find_spec

    try:
        found = find_spec("matplotlib") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ArgumentError("--plot needs matplotlib, which is not installed: "
                            "pip install 'ringlet[plot]'")
    check_file(path, "--plot", FIGURE_SUFFIXES)


