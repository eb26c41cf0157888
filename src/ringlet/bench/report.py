"""The output of ``ringlet bench``: the nccl-tests-style table, JSON and the plot.

Everything here is a pure function of a :class:`Result`, except
:func:`write_plot` (which writes a PNG).
"""

from __future__ import annotations

import datetime
import importlib.metadata
import math
import os
import platform
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ..jsonout import finite
from ..procs import cores
from .core import COLLECTIVES, FORM_NAMES, IN, OUT, Job, Row, Timing, algbw
from .peers import PeerRun

NA = "n/a"    # the form does not exist, or it was not checked
MISSING = "-"  # not measured (a peer that failed)


@dataclass
class Result:
    """Everything one ``ringlet bench`` run measured."""

    job: Job
    rows: list[Row]                       # ringlet's
    algorithms: list[str]                 # ringlet's algorithm per row
    peers: list[PeerRun] = field(default_factory=list)
    command: str = ""
    environment: dict[str, Any] = field(default_factory=dict)

    def peer_timing(self, peer: PeerRun, size: int) -> Timing | None:
        """``peer``'s timing at ``size`` (in its form), or None."""
        for r in peer.rows:
            if r.size == size:
                return r.forms.get(peer.form)
        return None

    def total_wrong(self) -> int:
        """Wrong elements over every row and form of ringlet and the peers."""
        n = sum(t.wrong or 0 for r in self.rows for t in r.forms.values())
        return n + sum(t.wrong or 0 for p in self.peers for r in p.rows
                       for t in r.forms.values())

    def failed(self) -> bool:
        """True if an element was wrong or a peer could not be measured."""
        return self.total_wrong() > 0 or any(p.error is not None for p in self.peers)


def busbw(job: Job, size: int, time_us: float) -> float:
    """nccl-tests' bus bandwidth in GB/s."""
    return algbw(size, time_us) * COLLECTIVES[job.collective].bus_factor(job.nranks)


def ratio(peer: Timing | None, mine: Timing | None) -> float:
    """peer time / ringlet time (> 1: ringlet is faster); NaN if either is missing."""
    if peer is None or mine is None or mine.time_us <= 0:
        return math.nan
    return peer.time_us / mine.time_us


# --- the table ---------------------------------------------------------------------------------


def _num(x: float, digits: int = 2) -> str:
    return MISSING if not math.isfinite(x) else f"{x:.{digits}f}"


def _wrong(t: Timing | None) -> str:
    if t is None:
        return MISSING
    return NA if t.wrong is None else str(t.wrong)


@dataclass(frozen=True)
class _Col:
    name: str
    unit: str
    width: int
    left: bool = False


_HEAD = [_Col("size", "(B)", 11), _Col("count", "(elements)", 10), _Col("type", "", 8),
         _Col("redop", "", 5), _Col("root", "", 4)]
_FORM = [_Col("time", "(us)", 9), _Col("algbw", "(GB/s)", 6), _Col("busbw", "(GB/s)", 6),
         _Col("#wrong", "", 6)]
_ALGO = _Col("algorithm", "", 18, left=True)
_PEER = [_Col("time", "(us)", 9), _Col("busbw", "(GB/s)", 6), _Col("ratio", "", 6)]


def _cell(col: _Col, text: str) -> str:
    return text.ljust(col.width) if col.left else text.rjust(col.width)


def _group(title: str, cols: Sequence[_Col]) -> str:
    width = sum(c.width for c in cols) + 2 * (len(cols) - 1)
    return title.center(width)


def legend(res: Result) -> list[str]:
    """The comment lines above the table: what was run and what every column means."""
    job = res.job
    coll = COLLECTIVES[job.collective]
    sizes = [s for s, _ in job.cases]
    lines = [
        f"# ringlet bench {job.collective}: {job.nranks} rank{'s' if job.nranks > 1 else ''}, "
        f"{job.dtype}" + (f", op {job.op}" if coll.reduces else "")
        + (f", root {job.root}" if coll.rooted else ""),
        (f"#   {len(sizes)} sizes from {human_bytes(sizes[0])} to {human_bytes(sizes[-1])}; "
         if len(sizes) > 1 else f"#   1 size: {human_bytes(sizes[0])}; ")
        + (f"warm-up up to {job.warmup} calls, then up to {job.iters} timed calls within "
           f"{job.budget:g} s per size and form" if job.warmup
           else f"no warm-up, {job.iters} timed calls per size and form")
        + ("; every size checked against numpy" if job.check else "; not checked (--no-check)"),
        "#   time: the maximum over ranks of each rank's mean time per call"
        + (" (one way: half a round trip)" if coll.messages == 2 else ""),
        f"#   algbw = size / time; busbw = algbw * {coll.bus} (nccl-tests' factor "
        f"for {job.collective}); GB/s = 1e9 B/s",
        "#   #wrong: elements that differ from numpy's answer, summed over ranks "
        "(n/a: not checked)",
    ]
    missing = [FORM_NAMES[f] for f in (OUT, IN) if f not in coll.forms]
    if missing:
        lines.append(f"#   {' and '.join(missing)}: n/a, ringlet's {job.collective} has no "
                     f"such form")
    if job.buffers == "shared":
        lines.append("#   ringlet's buffers: shared memory from comm.empty (zero-copy paths); "
                     "the peers' are private numpy arrays")
    if job.collective != "sendrecv":
        lines.append("#   algorithm: ringlet's choice for the size"
                     + ("" if job.algorithm is None else f" (--algo {job.algorithm})"))
    for p in res.peers:
        what = (f"not measured: {p.error.splitlines()[0]}" if p.error
                else f"{p.library}, {p.call}")
        form = f", {FORM_NAMES.get(p.form, p.form)}" if p.form and not p.error else ""
        lines.append(f"#   {p.name}: {what}{form}")
    if res.peers:
        lines.append("#   ratio = peer time / ringlet time, same size and same form "
                     "(in-place or out-of-place, as the peer's call): > 1 means ringlet is "
                     "faster")
    return lines


def table(res: Result) -> str:
    """The table as text: legend, two header lines, one line per size, the summary."""
    job = res.job
    coll = COLLECTIVES[job.collective]
    out = legend(res)
    # header
    groups = [" " * (sum(c.width for c in _HEAD) + 2 * (len(_HEAD) - 1))]
    names = [_cell(c, c.name) for c in _HEAD]
    units = [_cell(c, c.unit) for c in _HEAD]
    for f in (OUT, IN):
        groups.append(_group(FORM_NAMES[f], _FORM))
        names += [_cell(c, c.name) for c in _FORM]
        units += [_cell(c, c.unit) for c in _FORM]
    head = "  ".join(groups)
    names.append(_cell(_ALGO, _ALGO.name))
    units.append(_cell(_ALGO, ""))
    head += "  " + " " * _ALGO.width
    names_line, units_line = "  ".join(names), "  ".join(units)
    for p in res.peers:
        head += " | " + _group(f"{p.name} ({FORM_NAMES.get(p.form, '?')})", _PEER)
        names_line += " | " + "  ".join(_cell(c, c.name) for c in _PEER)
        units_line += " | " + "  ".join(_cell(c, c.unit) for c in _PEER)
    out += ["#", ("#" + head[1:]).rstrip(), ("#" + names_line[1:]).rstrip(),
            ("#" + units_line[1:]).rstrip()]
    # rows
    redop = job.op if coll.reduces else "none"
    root = str(job.root) if coll.rooted else "-1"
    for row, algo in zip(res.rows, res.algorithms, strict=True):
        cells = [_cell(c, v) for c, v in zip(
            _HEAD, [str(row.size), str(row.count), job.dtype, redop, root], strict=True)]
        for f in (OUT, IN):
            t = row.forms.get(f)
            if t is None:
                vals = [NA] * 4 if f not in coll.forms else [MISSING] * 4
            else:
                vals = [_num(t.time_us), _num(algbw(row.size, t.time_us)),
                        _num(busbw(job, row.size, t.time_us)), _wrong(t)]
            cells += [_cell(c, v) for c, v in zip(_FORM, vals, strict=True)]
        line = "  ".join(cells) + "  " + _cell(_ALGO, algo)
        for p in res.peers:
            pt = res.peer_timing(p, row.size)
            vals = ([MISSING] * 3 if pt is None else
                    [_num(pt.time_us), _num(busbw(job, row.size, pt.time_us)),
                     _num(ratio(pt, row.forms.get(p.form)))])
            line += " | " + "  ".join(_cell(c, v) for c, v in zip(_PEER, vals, strict=True))
        out.append(line.rstrip())
    out += summary(res)
    return "\n".join(out) + "\n"


def summary(res: Result) -> list[str]:
    """nccl-tests' closing lines: wrong values, average bus bandwidth; the peers' errors."""
    job = res.job
    checked = job.check
    wrong = res.total_wrong()
    lines = ["#", f"# #wrong in total: {wrong if checked else NA}"
             + ("" if not checked else ("  OK" if wrong == 0 else "  FAILED"))]
    avgs = []
    for f in (OUT, IN):
        vals = [busbw(job, r.size, r.forms[f].time_us) for r in res.rows if f in r.forms]
        if vals:
            avgs.append(f"ringlet {FORM_NAMES[f]} {_num(sum(vals) / len(vals))}")
    for p in res.peers:
        vals = [busbw(job, r.size, t.time_us) for r in p.rows
                if (t := r.forms.get(p.form)) is not None]
        if vals:
            avgs.append(f"{p.name} {_num(sum(vals) / len(vals))}")
    lines.append(f"# Avg bus bandwidth (GB/s): {', '.join(avgs)}")
    for p in res.peers:
        rs = [ratio(res.peer_timing(p, r.size), r.forms.get(p.form)) for r in res.rows]
        rs = [x for x in rs if math.isfinite(x) and x > 0]
        if rs:
            geo = math.exp(sum(math.log(x) for x in rs) / len(rs))
            lines.append(f"# ratio vs {p.name}: geometric mean {geo:.2f}, "
                         f"from {min(rs):.2f} to {max(rs):.2f}")
    for p in res.peers:
        if p.error:
            lines.append(f"# {p.name} was not (fully) measured:")
            lines += [f"#   {line}" for line in p.error.splitlines()]
    return lines


# --- JSON --------------------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    """Where the numbers come from: date, host, cores, and the versions that matter."""

    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "usable_cores": cores(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": {name: version(name) for name in
                     ("ringlet", "numpy", "torch", "mpi4py", "mpich", "matplotlib")},
    }


def to_json(res: Result, argv: Sequence[str]) -> dict[str, Any]:
    """Every row with every figure, the peers, the job and the environment."""
    job = res.job
    coll = COLLECTIVES[job.collective]
    rows = []
    for row, algo in zip(res.rows, res.algorithms, strict=True):
        d: dict[str, Any] = {
            "size": row.size, "count": row.count, "type": job.dtype,
            "redop": job.op if coll.reduces else "none",
            "root": job.root if coll.rooted else -1, "algorithm": algo}
        for f in (OUT, IN):
            t = row.forms.get(f)
            d[FORM_NAMES[f]] = None if t is None else {
                **asdict(t), "algbw": finite(algbw(row.size, t.time_us)),
                "busbw": finite(busbw(job, row.size, t.time_us))}
        for p in res.peers:
            pt = res.peer_timing(p, row.size)
            d[p.name] = None if pt is None else {
                **asdict(pt), "form": FORM_NAMES.get(p.form, p.form),
                "algbw": finite(algbw(row.size, pt.time_us)),
                "busbw": finite(busbw(job, row.size, pt.time_us)),
                "ratio": finite(ratio(pt, row.forms.get(p.form)))}
        rows.append(d)
    return {
        "command": res.command,
        "argv": list(argv),
        "environment": res.environment,
        "job": asdict(job),
        "bus_factor": {"formula": coll.bus, "value": coll.bus_factor(job.nranks)},
        "ratio": "peer time / ringlet time at the same size and form; > 1: ringlet is faster",
        "peers": {p.name: {"library": p.library, "call": p.call,
                           "form": FORM_NAMES.get(p.form, p.form), "error": p.error,
                           "seconds": round(p.seconds, 3)} for p in res.peers},
        "rows": rows,
        "wrong": res.total_wrong() if job.check else None,
    }


# --- plot --------------------------------------------------------------------------------------


def write_plot(res: Result, path: str) -> None:
    """busbw against size (log x) for ringlet's forms and each peer, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    job = res.job
    fig, ax = plt.subplots(figsize=(8, 5))
    try:
        for f, style in ((OUT, "-"), (IN, "--")):
            pts = [(r.size, busbw(job, r.size, r.forms[f].time_us)) for r in res.rows
                   if f in r.forms]
            if pts:
                ax.plot(*zip(*pts, strict=True), style, marker="o", markersize=3,
                        label=f"ringlet ({FORM_NAMES[f]})")
        for p in res.peers:
            pts = [(r.size, busbw(job, r.size, t.time_us)) for r in p.rows
                   if (t := r.forms.get(p.form)) is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), ":", marker="s", markersize=3,
                        label=f"{p.name} ({FORM_NAMES.get(p.form, p.form)})")
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(
            matplotlib.ticker.FuncFormatter(lambda v, _: human_bytes(int(round(v)))))
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.set_title(f"{job.collective}, {job.nranks} ranks, {job.dtype}"
                     + (f", {job.op}" if COLLECTIVES[job.collective].reduces else ""))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)


def human_bytes(n: int) -> str:
    """``67108864`` -> ``64 MiB``; ``8`` -> ``8 B``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"
