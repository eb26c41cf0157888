"""``ringlet report``: what ringlet measured and traced, in one self-contained HTML file.

::

    ringlet report --out report.html                       # runs a short bench itself
    ringlet report --bench ar.json --trace /tmp/tr --out report.html

The file has no outside reference (its Content-Security-Policy forbids any):
plots are inline SVG drawn here, so it opens offline and can be mailed.  It
holds, for what it is given:

* each ``ringlet bench --json`` result: bus bandwidth against size, ringlet's
  two forms and the peers measured in the same run, and the table;
* predicted against measured: each row's time as the cost model predicts it
  from the calibrated profile (``ringlet predict --calibrate``), when there is one;
* a ``--trace`` directory's (or ``trace.json``'s) per-rank timeline and its
  arrival skew, and the trace itself, embedded (a link saves it for Perfetto);
* the diagram of every algorithm the bench rows and the trace used
  (:func:`ringlet.show.draw_svg`, the schedule the executor runs).

Without ``--bench`` or ``--trace`` it runs a short ``ringlet bench all_reduce``
on 2 ranks (8 B to 1 MiB, with the peers that are installed), with a progress
bar on a terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from html import escape
from pathlib import Path
from typing import Any

from .errors import ArgumentError, RingletError
from .progress import Progress

#: the short bench run without --bench/--trace: 7 sizes, a few seconds per implementation
SHORT_BENCH = ["all_reduce", "-n", "2", "-b", "8", "-e", "1M", "-f", "8", "--iters", "10",
               "--warmup", "2", "--budget", "0.05"]

#: diagrams drawn at most (one per collective, algorithm and world size), and their largest N
MAX_DIAGRAMS, MAX_DIAGRAM_RANKS = 8, 16

#: trace events drawn in the timeline at most (the rest are summed up, and in the embedded trace)
MAX_TIMELINE_EVENTS = 4000

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f",
           "#ff9da7", "#bab0ac", "#e15759"]
PEER_COLOURS = {"gloo": "#e15759", "mpi": "#9c755f"}


# --- inputs ---------------------------------------------------------------------------------


@dataclass
class Inputs:
    """What a report is made of."""

    benches: list[dict[str, Any]] = field(default_factory=list)   # ringlet bench --json
    bench_sources: list[str] = field(default_factory=list)
    trace: dict[str, Any] | None = None                           # the merged Chrome trace
    trace_source: str = ""
    profile: Any = None                                           # cost.Profile or None
    profile_note: str = ""
    notes: list[str] = field(default_factory=list)


def load_bench(path: str) -> dict[str, Any]:
    """A ``ringlet bench --json`` file, checked for the keys the report reads."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ArgumentError(f"--bench {path}: cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ArgumentError(f"--bench {path}: not JSON ({exc})") from None
    if not (isinstance(data, dict) and isinstance(data.get("rows"), list)
            and isinstance(data.get("job"), dict)):
        raise ArgumentError(f"--bench {path}: not a `ringlet bench --json` file (it has no "
                            f"'rows' and 'job')")
    lack = _bench_lacks(data)
    if lack:
        raise ArgumentError(f"--bench {path}: not a `ringlet bench --json` file: {lack}")
    return data


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _bench_lacks(data: dict[str, Any]) -> str:
    """What ``data`` (with 'rows' and 'job') lacks of the fields the report reads, or ''."""
    job = data["job"]
    for key, kind, ok in (("collective", "a name", lambda v: isinstance(v, str)),
                          ("nranks", "a number of ranks",
                           lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0),
                          ("dtype", "a type name", lambda v: isinstance(v, str))):
        if not ok(job.get(key)):
            return f"its 'job' has no '{key}' ({kind})"
    if "root" in job and not (isinstance(job["root"], int) and not isinstance(job["root"], bool)):
        return "its 'job' has a 'root' that is not a rank"
    peers = data.get("peers") or {}
    if not (isinstance(peers, dict) and all(isinstance(d, dict) and isinstance(
            d.get("error") or "", str) for d in peers.values())):
        return "its 'peers' is not an object of peers"
    for i, r in enumerate(data["rows"], 1):
        if not isinstance(r, dict):
            return f"row {i} is not an object"
        if not (_number(r.get("size")) and r["size"] >= 0):
            return f"row {i} has no 'size' (a number of bytes)"
        if not isinstance(r.get("algorithm"), str):
            return f"row {i} has no 'algorithm' (a name)"
        for form in (*FORMS, *peers):
            t = r.get(form)
            if t and not (isinstance(t, dict) and _number(t.get("time_us"))
                          and all(t.get(k) is None or _number(t[k]) for k in ("busbw", "ratio"))):
                return (f"row {i}'s '{form}' has no 'time_us' (a number; 'busbw' and 'ratio' "
                        f"numbers too where given)")
    return ""


def load_trace(path: str) -> dict[str, Any]:
    """A Chrome trace from ``ringlet run --trace DIR``: ``DIR/trace.json``, or the ranks'
    ``DIR/rank-R.trace.jsonl`` merged here (``RINGLET_TRACE`` under another launcher),
    or a trace file."""
    from . import tracing

    p = Path(path)
    if p.is_dir():
        if (p / "trace.json").is_file():
            p = p / "trace.json"
        else:
            events = [e for e in tracing.read(str(p)) if e.get("name") != tracing.CLOCK_EVENT]
            if not events:
                raise ArgumentError(f"--trace {path}: no trace.json and no rank-R.trace.jsonl "
                                    f"in it (ringlet run --trace {path} writes them)")
            return {"traceEvents": events, "displayTimeUnit": "ms",
                    "otherData": {"skew": tracing.skew(events)}}
    try:
        data = json.loads(p.read_text())
    except OSError as exc:
        raise ArgumentError(f"--trace {path}: cannot read it: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ArgumentError(f"--trace {path}: not JSON ({exc})") from None
    if isinstance(data, list):   # the JSON array form of the format
        data = {"traceEvents": data}
    if not (isinstance(data, dict) and isinstance(data.get("traceEvents"), list)):
        raise ArgumentError(f"--trace {path}: not a Chrome trace (no traceEvents)")
    data["traceEvents"] = [e for e in data["traceEvents"] if isinstance(e, dict)]
    if not any(e.get("ph") == "X" for e in data["traceEvents"]):
        raise ArgumentError(f"--trace {path}: no operation in it (no complete event, "
                            f"\"ph\": \"X\"): nothing to report")
    return data


def load_profile(path: str | None) -> tuple[Any, str]:
    """The calibrated profile at ``path`` (default: RINGLET_PROFILE's), or None and why.

    A ``path`` given (``--profile``) that is not a profile is an ArgumentError, as in
    ``ringlet predict``; the default one may be missing (the report says so)."""
    from .config import Settings
    from .cost.model import Profile

    given = path is not None
    if path is None:
        path = Settings.from_env().profile
    if not path or path == "none":
        return None, "no profile (--profile none)"
    p = Path(path).expanduser()
    if not p.is_file():
        if given:
            raise ArgumentError(f"--profile {path}: no such file (`ringlet predict "
                                f"--calibrate --out {path}` writes one; none: no profile)")
        return None, (f"no calibrated profile at {p}: `ringlet predict --calibrate` measures "
                      f"this host and writes one")
    try:
        return Profile.load(p), f"profile {p}"
    except ArgumentError as exc:
        if given:
            raise ArgumentError(f"--profile {path}: {exc}") from None
        return None, f"the profile {p} could not be read: {exc}"


# --- SVG plots ------------------------------------------------------------------------------


def human_bytes(n: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n:.0f} B"


def human_us(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    if us >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} us"


def _decade(v: float) -> str:
    return f"{v:g}"


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]
    colour: str
    dash: str = ""
    marker: str = "circle"


def chart(series: Sequence[Series], xlabel: str, ylabel: str,
          xfmt: Callable[[float], str] = human_bytes, yfmt: Callable[[float], str] = _decade,
          width: int = 760, height: int = 360) -> str:
    """A log-log line chart as an SVG element: x in powers of 2, y in decades."""
    pts = [(x, y) for s in series for x, y in s.points if x > 0 and y > 0 and math.isfinite(y)]
    if not pts:
        return '<p class="note">nothing to plot</p>'
    ml, mr, mt, mb = 70, 180, 14, 46
    pw, ph = width - ml - mr, height - mt - mb
    x0, x1 = math.log2(min(x for x, _ in pts)), math.log2(max(x for x, _ in pts))
    y0 = math.floor(math.log10(min(y for _, y in pts)))
    y1 = math.ceil(math.log10(max(y for _, y in pts)))
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y1 += 1

    def X(x: float) -> float:
        return ml + pw * (math.log2(x) - x0) / (x1 - x0)

    def Y(y: float) -> float:
        return mt + ph * (1 - (math.log10(y) - y0) / (y1 - y0))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="chart" viewBox="0 0 {width} '
           f'{height}" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="11">',
           f'<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="#fff" stroke="#999"/>']
    step = max(1, math.ceil((x1 - x0) / 10))
    for k in range(math.ceil(x0), math.floor(x1) + 1, step):
        x = X(2.0 ** k)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{mt}" y2="{mt + ph}" stroke="#eee"/>')
        out.append(f'<text x="{x:.1f}" y="{mt + ph + 15}" text-anchor="middle">'
                   f'{escape(xfmt(2.0 ** k))}</text>')
    for k in range(y0, y1 + 1):
        y = Y(10.0 ** k)
        out.append(f'<line x1="{ml}" x2="{ml + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{ml - 6}" y="{y + 4:.1f}" text-anchor="end">'
                   f'{escape(yfmt(10.0 ** k))}</text>')
    out.append(f'<text x="{ml + pw / 2}" y="{height - 8}" text-anchor="middle">'
               f'{escape(xlabel)}</text>')
    out.append(f'<text transform="translate(14 {mt + ph / 2}) rotate(-90)" '
               f'text-anchor="middle">{escape(ylabel)}</text>')
    for i, s in enumerate(series):
        good = [(x, y) for x, y in s.points if x > 0 and y > 0 and math.isfinite(y)]
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        if len(good) > 1:
            path = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in good)
            out.append(f'<polyline points="{path}" fill="none" stroke="{s.colour}" '
                       f'stroke-width="1.8"{dash}/>')
        for x, y in good:
            tip = f"{s.label}: {xfmt(x)}, {y:.4g}"
            if s.marker == "square":
                out.append(f'<rect x="{X(x) - 3:.1f}" y="{Y(y) - 3:.1f}" width="6" height="6" '
                           f'fill="{s.colour}"><title>{escape(tip)}</title></rect>')
            else:
                out.append(f'<circle cx="{X(x):.1f}" cy="{Y(y):.1f}" r="3" fill="{s.colour}">'
                           f'<title>{escape(tip)}</title></circle>')
        ly = mt + 10 + 18 * i
        out.append(f'<line x1="{ml + pw + 12}" x2="{ml + pw + 36}" y1="{ly}" y2="{ly}" '
                   f'stroke="{s.colour}" stroke-width="1.8"{dash}/>')
        out.append(f'<text x="{ml + pw + 42}" y="{ly + 4}">{escape(s.label)}</text>')
    out.append("</svg>")
    return "\n".join(out)


# --- the sections ---------------------------------------------------------------------------


FORMS = ("out-of-place", "in-place")


def _bench_title(b: dict[str, Any]) -> str:
    job = b["job"]
    n = job.get("nranks", "?")
    return (f"{job.get('collective', '?')}, {n} rank{'s' if n != 1 else ''}, "
            f"{job.get('dtype', '?')}" + (f", op {job['op']}" if job.get("op", "none") != "none"
                                          else ""))


def _peers(b: dict[str, Any]) -> list[str]:
    return [p for p, d in (b.get("peers") or {}).items() if not d.get("error")]


def bench_section(b: dict[str, Any], source: str) -> str:
    """busbw against size for ringlet's forms and the peers, and the table."""
    rows = b["rows"]
    series = []
    for form, colour, dash in (("out-of-place", "#4e79a7", ""), ("in-place", "#59a14f", "6,3")):
        pts = [(r["size"], r[form]["busbw"]) for r in rows
               if r.get(form) and r[form].get("busbw")]
        if pts:
            series.append(Series(f"ringlet {form}", pts, colour, dash))
    for p in _peers(b):
        form = b["peers"][p].get("form", "")
        pts = [(r["size"], r[p]["busbw"]) for r in rows if r.get(p) and r[p].get("busbw")]
        if pts:
            series.append(Series(f"{p} ({form})", pts, PEER_COLOURS.get(p, "#888"), "2,3",
                                 "square"))
    head = ["size", "algorithm"] + [f"ringlet {f}<br>time / busbw" for f in FORMS]
    head += [f"{p} ({escape(b['peers'][p].get('form', ''))})<br>time / busbw / ratio"
             for p in _peers(b)]
    body = []
    for r in rows:
        cells = [human_bytes(r["size"]), escape(str(r.get("algorithm", "")))]
        for f in FORMS:
            t = r.get(f)
            cells.append("n/a" if not t else f"{human_us(t['time_us'])} / {_gbs(t.get('busbw'))}")
        for p in _peers(b):
            t = r.get(p)
            cells.append("-" if not t else f"{human_us(t['time_us'])} / {_gbs(t.get('busbw'))}"
                                           f" / {_ratio(t.get('ratio'))}")
        body.append(cells)
    failed = [f"{p}: {d['error'].splitlines()[0]}" for p, d in (b.get("peers") or {}).items()
              if d.get("error")]
    ratio = ("; ratio = peer time / ringlet time at the same size and form, > 1: ringlet is "
             "faster" if _peers(b) else "")
    out = [f'<h3>{escape(_bench_title(b))}</h3>',
           f'<p class="note">from {escape(source)}: <code>{escape(b.get("command", ""))}</code>'
           f'{ratio}</p>',
           chart(series, "size (bytes, nccl-tests' convention)", "bus bandwidth (GB/s)"),
           _table(head, body, raw_head=True)]
    if failed:
        out.append('<p class="bad">not measured: ' + escape("; ".join(failed)) + "</p>")
    if b.get("wrong"):
        out.append(f'<p class="bad">{b["wrong"]} wrong elements</p>')
    return "\n".join(out)


def _gbs(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g} GB/s"


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _table(head: Sequence[str], rows: Sequence[Sequence[str]], raw_head: bool = False) -> str:
    h = "".join(f"<th>{c if raw_head else escape(c)}</th>" for c in head)
    b = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table>'


def predicted_section(benches: Sequence[dict[str, Any]], profile: Any, note: str) -> str:
    """Each bench row's measured time against the cost model's prediction for it."""
    from .cost.model import predict

    if profile is None:
        return f'<p class="note">{escape(note)}</p>'
    out = [f'<p class="note">{escape(note)}'
           + (" (calibrated: the host model of ringlet's shared-memory transport)"
              if getattr(profile, "host", None) is not None else "") + "</p>"]
    for b in benches:
        job = b["job"]
        coll, n = job["collective"], int(job["nranks"])
        if coll == "sendrecv":
            continue
        pred: list[tuple[float, float]] = []
        body = []
        for r in b["rows"]:
            try:
                p = predict(coll, r["algorithm"], n, int(r["size"]), profile, job["dtype"],
                            int(job.get("root", 0)))
            except (RingletError, KeyError, ValueError) as exc:
                body.append([human_bytes(r["size"]), escape(str(r.get("algorithm"))),
                             escape(f"not predicted: {exc}"), "", ""])
                continue
            us = p.seconds * 1e6
            pred.append((r["size"], us))
            cells = [human_bytes(r["size"]), escape(r["algorithm"]), human_us(us)]
            for f in FORMS:
                t = r.get(f)
                cells.append("n/a" if not t else human_us(t['time_us']) + (
                    f" ({t['time_us'] / us:.2f}x)" if us > 0 else ""))   # 1 rank: 0 s
            body.append(cells)
        series = [Series("predicted", pred, "#000", "4,3", "square")]
        for form, colour in (("out-of-place", "#4e79a7"), ("in-place", "#59a14f")):
            pts = [(r["size"], r[form]["time_us"]) for r in b["rows"] if r.get(form)]
            if pts:
                series.append(Series(f"measured {form}", pts, colour))
        out += [f"<h3>{escape(_bench_title(b))}</h3>",
                chart(series, "size (bytes)", "time per call (us)"),
                _table(["size", "algorithm", "predicted",
                        "measured out-of-place (x predicted)", "measured in-place (x predicted)"],
                       body)]
    return "\n".join(out)


def _kind(name: str) -> str:
    return name.split(" #")[0].split(" (")[0]


def timeline_svg(events: Sequence[dict[str, Any]], width: int = 1000) -> str:
    """One row per rank, one box per operation (its arrival to its end); tooltips."""
    spans = [e for e in events if e.get("ph") == "X" and "ts" in e]
    if not spans:
        return '<p class="note">no operations in the trace</p>'
    # the first in time, of every rank (a merged trace lists its events rank by rank)
    spans = sorted(spans, key=lambda e: float(e["ts"]))[:MAX_TIMELINE_EVENTS]
    from .tracing import rank_of

    ranks = sorted({rank_of(e) for e in spans})
    t0 = min(float(e["ts"]) for e in spans)
    t1 = max(float(e["ts"]) + float(e.get("dur", 0)) for e in spans)
    span = max(t1 - t0, 1e-3)
    ml, mr, row, mt = 70, 40, 26, 8
    pw = width - ml - mr
    height = mt + row * len(ranks) + 60
    kinds = sorted({_kind(e["name"]) for e in spans})
    colour = {k: PALETTE[i % len(PALETTE)] for i, k in enumerate(kinds)}
    ypos = {q: mt + row * i for i, q in enumerate(ranks)}

    def X(t: float) -> float:
        return ml + pw * (t - t0) / span

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" viewBox="0 0 {width} '
           f'{height}" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="11">']
    for q in ranks:
        y = ypos[q]
        out.append(f'<rect x="{ml}" y="{y}" width="{pw}" height="{row - 4}" fill="#f6f6f6"/>')
        out.append(f'<text x="{ml - 8}" y="{y + row / 2 + 2}" text-anchor="end">rank {q}</text>')
    for e in spans:
        ts, dur = float(e["ts"]), float(e.get("dur", 0))
        x = X(ts)
        w = max(1.0, X(ts + dur) - x)
        a = e.get("args", {})
        bad = bool(a.get("error"))
        tip = (f"rank {rank_of(e)}: {e['name']}, at +{human_us(ts - t0)} for {human_us(dur)}"
               + "".join(f"; {k} {a[k]}" for k in ("bytes", "algorithm", "path", "state",
                                                  "error") if a.get(k) not in (None, "")))
        stroke = ' stroke="#d00" stroke-width="2"' if bad else ""
        out.append(f'<rect x="{x:.2f}" y="{ypos[rank_of(e)] + 2}" width="{w:.2f}" '
                   f'height="{row - 8}" fill="{colour[_kind(e["name"])]}"{stroke}>'
                   f'<title>{escape(tip)}</title></rect>')
    base = mt + row * len(ranks)
    for i in range(6):
        t = span * i / 5
        out.append(f'<text x="{X(t0 + t):.1f}" y="{base + 12}" text-anchor="middle">'
                   f'+{escape(human_us(t))}</text>')
    lx, ly = ml, base + 26
    for k in kinds:
        if lx + 16 + 7 * len(k) > width:
            lx, ly = ml, ly + 18
        out.append(f'<rect x="{lx}" y="{ly}" width="12" height="12" fill="{colour[k]}"/>')
        out.append(f'<text x="{lx + 16}" y="{ly + 10}">{escape(k)}</text>')
        lx += 30 + 7 * len(k)
    out.append("</svg>")
    out[0] = out[0].replace(f'{height}"', f'{ly + 20}"')
    return "\n".join(out)


def trace_section(trace: dict[str, Any], source: str) -> str:
    """The timeline, the skew summary and the most skewed collectives; the embedded trace."""
    from .tracing import arrivals, rank_of, skew, skew_text

    events = [e for e in trace["traceEvents"] if isinstance(e, dict)]
    spans = [e for e in events if e.get("ph") == "X"]
    ranks = sorted({rank_of(e) for e in spans})
    s = skew(spans)
    out = [f'<p class="note">from {escape(source)}: {len(spans)} operations of '
           f'{len(ranks)} rank{"s" if len(ranks) != 1 else ""}; hover a box for its details. '
           f'<a id="trace-download" download="trace.json" href="#">Save trace.json</a> '
           f'to open it in <a href="https://ui.perfetto.dev">Perfetto</a> or chrome://tracing. '
           f'<span id="trace-check"></span></p>']
    if len(spans) > MAX_TIMELINE_EVENTS:
        out.append(f'<p class="note">the timeline shows the first {MAX_TIMELINE_EVENTS} '
                   f'operations; the saved trace has all of them</p>')
    out.append(timeline_svg(spans))
    out.append(f"<h3>Arrival skew</h3><p>{escape(skew_text(s))}</p>")
    if s["collectives"]:
        waiting = [[f"rank {q}", human_us(w), str(s["last_to_arrive"].get(q, 0))]
                   for q, w in s["waiting_us"].items()]
        out.append(_table(["rank", "time waiting for the others", "last to arrive in"],
                          waiting))
        worst = sorted(arrivals(spans), key=lambda c: min(c[1].values()) - max(c[1].values()))
        rows = []
        for name, arrive in worst[:8]:
            late = max(arrive, key=lambda q: arrive[q])
            rows.append([escape(name), human_us(max(arrive.values()) - min(arrive.values())),
                         f"rank {late}"])
        out.append("<p>The most skewed collectives:</p>"
                   + _table(["collective", "arrival skew", "last to arrive"], rows))
    return "\n".join(out)


def diagram_keys(inputs: Inputs) -> list[tuple[str, str, int, int]]:
    """(collective, algorithm, ranks, root) of the bench rows and the traced collectives."""
    from .algorithms import canonical
    from .schedule import COLLECTIVES, ROOTED

    keys: list[tuple[str, str, int, int]] = []
    for b in inputs.benches:
        job = b["job"]
        for r in b["rows"]:
            c = job.get("collective", "")
            keys.append((c, str(r.get("algorithm")), int(job.get("nranks", 0)),
                         int(job.get("root", 0)) if c in ROOTED else 0))
    if inputs.trace is not None:
        for e in inputs.trace["traceEvents"]:
            if not isinstance(e, dict) or e.get("cat") != "collective":
                continue
            a = e.get("args", {})
            if a.get("algorithm"):
                root = a.get("root", 0)
                keys.append((_kind(e["name"]), str(a["algorithm"]),
                             len(a.get("peers") or str(a.get("comm", "")).split(",")),
                             root if isinstance(root, int) and _kind(e["name"]) in ROOTED
                             else 0))
    seen: list[tuple[str, str, int, int]] = []
    drawn: set[tuple[str, str, int, int]] = set()
    for k in keys:
        if k[0] not in COLLECTIVES:
            continue
        same = k   # an algorithm and its alias (tree, binomial) are one diagram, named first
        with contextlib.suppress(RingletError):
            same = (k[0], canonical(k[0], k[1]), k[2], k[3])
        if same not in drawn:
            drawn.add(same)
            seen.append(k)
    return seen


def diagrams_section(inputs: Inputs) -> str:
    from .algorithms import build
    from .schedule import ROOTED
    from .show import draw_svg, trace

    keys = diagram_keys(inputs)
    out = ['<p class="note">The schedules the executor runs, as <code>ringlet show</code> '
           'draws them (with the algorithm\'s default parameters), in the symbolic '
           'verifier\'s view: what each rank holds after each round.  Hover a box or an '
           'arrow for its chunk.</p>']
    skipped = []
    drawn = 0
    for coll, algo, n, root in keys:
        if drawn >= MAX_DIAGRAMS:
            skipped.append(f"{coll}/{algo} on {n} ranks (more than {MAX_DIAGRAMS} diagrams)")
            continue
        if not 1 <= n <= MAX_DIAGRAM_RANKS:
            skipped.append(f"{coll}/{algo} on {n} ranks (drawn up to {MAX_DIAGRAM_RANKS})")
            continue
        # one id each: the same schedule from two roots had one heading id, every diagram
        # the same arrowheads' ids
        ident = f"diagram-{coll}-{algo}-{n}" + (f"-root-{root}" if root else "")
        try:
            svg = draw_svg(trace(build(coll, algo, n, root)), ident=escape(f"{ident}-"))
        except RingletError as exc:
            skipped.append(f"{coll}/{algo} on {n}: {exc}")
            continue
        out.append(f'<h3 id="{escape(ident)}">{escape(coll)} / {escape(algo)} on {n} ranks'
                   f'{f", root {root}" if coll in ROOTED else ""}</h3>'
                   f'<div class="scroll">{svg}</div>')
        drawn += 1
    if not keys:
        out.append('<p class="note">no collective with an algorithm in the inputs</p>')
    if skipped:
        out.append('<p class="note">not drawn: ' + escape("; ".join(skipped)) + "</p>")
    return "\n".join(out)


# --- the page -------------------------------------------------------------------------------

CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1100px;
       padding: 0 20px 40px; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ccc; margin-top: 1.8em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 12px; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: right; }
th { background: #f3f3f3; } td:nth-child(2) { text-align: left; }
.note { color: #555; } .bad { color: #b00000; } code { background: #f3f3f3; padding: 0 3px; }
.scroll { overflow-x: auto; } svg { max-width: none; } nav a { margin-right: 1em; }
#console-errors { color: #b00000; white-space: pre-wrap; border: 2px solid #b00000;
                  padding: 6px; }
"""

#: first in <head>: every error the page meets is written into #console-errors, so a
#: headless browser's --dump-dom shows them (tests/test_report.py)
CATCH = """
window.__reportErrors = [];
(function () {
  function note(m) {
    window.__reportErrors.push(String(m));
    var el = document.getElementById("console-errors");
    if (el) { el.textContent = window.__reportErrors.join("\\n"); el.hidden = false; }
  }
  window.addEventListener("error", function (e) {
    var t = e.target;
    note(e.message || ("failed to load " + (t && (t.src || t.href || t.tagName))));
  }, true);
  window.addEventListener("unhandledrejection", function (e) {
    note("unhandled rejection: " + e.reason);
  });
  document.addEventListener("securitypolicyviolation", function (e) {
    note("blocked by the page's policy: " + e.blockedURI + " (" + e.violatedDirective + ")");
  });
  var original = console.error;
  console.error = function () {
    note(Array.prototype.join.call(arguments, " "));
    original.apply(console, arguments);
  };
})();
"""

#: last in <body>: parse the embedded trace (as Perfetto would), link it for saving
CHECK = """
(function () {
  var el = document.getElementById("trace-json");
  if (el) {
    var trace = JSON.parse(el.textContent);
    var spans = trace.traceEvents.filter(function (e) { return e.ph === "X"; });
    var ranks = {};
    spans.forEach(function (e) {
      ranks[e.args && e.args.rank !== undefined ? e.args.rank : e.tid] = true;
    });
    var text = JSON.stringify(trace);
    document.getElementById("trace-check").textContent =
      "trace.json: " + spans.length + " operations of " + Object.keys(ranks).length +
      " ranks, " + text.length + " bytes, parsed";
    var link = document.getElementById("trace-download");
    link.href = URL.createObjectURL(new Blob([text], {type: "application/json"}));
  }
  // report.html#only=timeline shows that section alone (a screenshot, a link to it)
  var only = /^#only=([A-Za-z0-9_-]+)$/.exec(location.hash);
  if (only && document.getElementById(only[1])) {
    document.querySelectorAll("section, nav").forEach(function (s) {
      if (s.id !== only[1]) { s.hidden = true; }
    });
  }
  // after every script and image of the page: true if none of them met an error
  window.addEventListener("load", function () {
    document.body.setAttribute("data-ready", String(window.__reportErrors.length === 0));
  });
})();
"""

POLICY = ("default-src 'none'; img-src data: blob:; style-src 'unsafe-inline'; "
          "script-src 'unsafe-inline'")


def _json_script(ident: str, data: Any) -> str:
    text = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return f'<script type="application/json" id="{ident}">{text}</script>'


def render(inputs: Inputs, progress: Progress | None = None) -> str:
    """The whole report as one HTML document."""
    step = progress.step if progress is not None else (lambda label="": None)
    sections: list[tuple[str, str, str]] = []   # (id, title, html)
    if inputs.benches:
        sections.append(("bandwidth", "Bus bandwidth against size",
                         "\n".join(bench_section(b, src) for b, src in
                                   zip(inputs.benches, inputs.bench_sources, strict=True))))
        step("bandwidth")
        sections.append(("predicted", "Predicted against measured",
                         predicted_section(inputs.benches, inputs.profile,
                                           inputs.profile_note)))
        step("predictions")
    if inputs.trace is not None:
        sections.append(("timeline", "Timeline and skew",
                         trace_section(inputs.trace, inputs.trace_source)))
        step("timeline")
    sections.append(("algorithms", "The algorithms", diagrams_section(inputs)))
    step("diagrams")
    env = next((b.get("environment") for b in inputs.benches if b.get("environment")), None)
    about = [f"<p>made by <code>ringlet report</code> (ringlet {escape(_version())}) on "
             f"{escape(_now())}</p>"]
    if env:
        about.append(_table(["", ""], [[escape(k), escape(json.dumps(v) if isinstance(v, dict)
                                                           else str(v))]
                                       for k, v in env.items()]))
    about += [f'<p class="note">{escape(n)}</p>' for n in inputs.notes]
    sections.append(("about", "Where the numbers come from", "\n".join(about)))
    nav = " ".join(f'<a href="#{i}">{escape(t)}</a>' for i, t, _ in sections)
    body = "\n".join(f'<section id="{i}"><h2>{escape(t)}</h2>\n{h}\n</section>'
                     for i, t, h in sections)
    data = _json_script("trace-json", inputs.trace) if inputs.trace is not None else ""
    return textwrap.dedent(f"""\
        <!DOCTYPE html>
        <html lang="en"><head><meta charset="utf-8">
        <meta http-equiv="Content-Security-Policy" content="{POLICY}">
        <meta name="viewport" content="width=device-width, initial-scale=1">
        <title>ringlet report</title>
        <script>{CATCH}</script>
        <style>{CSS}</style></head>
        <body>
        <h1>ringlet report</h1>
        <div id="console-errors" hidden></div>
        <nav>{nav}</nav>
        """) + body + "\n" + data + f"\n<script>{CHECK}</script>\n</body></html>\n"


def _version() -> str:
    from .cli import _version as version

    return version()


def _now() -> str:
    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


# --- the command ----------------------------------------------------------------------------


def configure(p: argparse.ArgumentParser) -> None:
    """Add ``ringlet report``'s options to ``p``."""
    p.description = textwrap.fill(
        "Write one self-contained HTML file (inline SVG, no network) with ringlet bench "
        "results (bus bandwidth against size, ringlet and the peers), predicted against "
        "measured times where a calibrated profile exists, a trace's per-rank timeline and "
        "arrival skew, and the diagrams of the algorithms used.  Without --bench or --trace "
        "it runs a short bench itself (all_reduce, 2 ranks, 8 B to 1 MiB).", 79)
    p.add_argument("--out", default="report.html", metavar="FILE.html",
                   help="where to write the report (default %(default)s)")
    p.add_argument("--bench", action="append", metavar="FILE.json",
                   help="a `ringlet bench --json` result (repeatable)")
    p.add_argument("--trace", metavar="DIR",
                   help="a `ringlet run --trace DIR` directory (or its trace.json)")
    p.add_argument("--profile", metavar="PATH",
                   help="the calibrated profile for the predictions (default: RINGLET_PROFILE's, "
                        "if the file exists; 'none': no predictions)")
    p.add_argument("--vs", metavar="PEERS",
                   help="peers of the short bench (default: gloo and mpi where installed; "
                        "'none': ringlet only)")
    p.add_argument("-q", "--quiet", action="store_true",
                   help="no progress bar (it is also off when stderr is not a terminal)")


def short_bench(vs: str | None, quiet: bool) -> dict[str, Any]:
    """Run :data:`SHORT_BENCH` (with the installed peers unless ``vs`` says) and return
    its JSON form."""
    from .bench.cli import collect, parse
    from .bench.peers import missing
    from .bench.report import to_json

    if vs is None:
        vs = ",".join(p for p in ("gloo", "mpi") if missing(p) is None)
    argv = SHORT_BENCH + (["--vs", vs] if vs and vs != "none" else []) + (["-q"] if quiet
                                                                          else [])
    args = parse(argv)
    return to_json(collect(args, "ringlet report: bench"), ["ringlet", "bench", *argv])


def main(args: argparse.Namespace) -> int:
    """Run ``ringlet report``; 0 when the report is written."""
    from .outputs import check_file, writing

    out = Path(args.out)
    check_file(args.out, "--out")
    if args.vs is not None and (args.bench or args.trace):
        raise ArgumentError("--vs goes with the short bench, which runs only without --bench "
                            "and --trace; measure peers with ringlet bench --vs")
    inputs = Inputs()
    inputs.profile, inputs.profile_note = load_profile(args.profile)   # before the work
    for path in args.bench or []:
        inputs.benches.append(load_bench(path))
        inputs.bench_sources.append(path)
    if args.trace:
        inputs.trace = load_trace(args.trace)
        inputs.trace_source = args.trace
    if not args.bench and not args.trace:
        inputs.benches.append(short_bench(args.vs, args.quiet))
        inputs.bench_sources.append("a short bench run by ringlet report")
    steps = (2 if inputs.benches else 0) + (inputs.trace is not None) + 1
    with Progress(steps, "ringlet report", "parts", False if args.quiet else None) as bar:
        html = render(inputs, bar)
    with writing(out, "--out"):
        out.write_text(html)
    print(f"wrote {out} ({len(html.encode()) / 1024:.0f} KiB)")
    return 0
