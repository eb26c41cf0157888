"""``ringlet report``: the HTML file from a real bench run and a real 3-rank trace, its
parts checked against those inputs, and the file opened in headless Chromium (no console
error, the embedded trace parsed in the page, a screenshot)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from browser import FLAGS, chromium_path
from jobs import clean_env, on_a_terminal

from ringlet.cost.model import Link, Profile, predict
from ringlet.report import human_us

SCRIPTS = Path(__file__).parent / "scripts"
RINGLET = [sys.executable, "-m", "ringlet"]


def _ringlet(*argv: str, cwd: Path | None = None,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RINGLET, *argv], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=clean_env(OMP_NUM_THREADS="1"))


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real bench result (ringlet and MPI, 2 ranks), a 3-rank trace and a link profile."""
    d = tmp_path_factory.mktemp("report")
    bench = d / "bench.json"
    vs = ["--vs", "mpi"] if shutil.which("mpiexec") or _have("mpi4py") else []
    p = _ringlet("bench", "all_reduce", "-n", "2", "-b", "8", "-e", "64K", "-f", "16",
                 "--iters", "3", "--warmup", "1", "--budget", "0.02", "-q", *vs,
                 "--json", str(bench))
    assert p.returncode == 0, p.stdout + p.stderr
    p = _ringlet("run", "--trace", str(d / "tr"), "-n", "3", str(SCRIPTS / "hang.py"), "ok")
    assert p.returncode == 0, p.stderr
    profile = Profile(Link.from_bandwidth(2e9, latency=5e-6), name="test link")
    profile.save(d / "profile.json")
    out = d / "report.html"
    p = _ringlet("report", "--bench", str(bench), "--trace", str(d / "tr"), "--profile",
                 str(d / "profile.json"), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""   # no terminal: no progress bar
    return {"dir": d, "bench": json.loads(bench.read_text()), "profile": profile,
            "trace": json.loads((d / "tr" / "trace.json").read_text()), "html": out,
            "peers": vs[1:]}


def _have(module: str) -> bool:
    from importlib.util import find_spec

    return find_spec(module) is not None


def _section(html: str, ident: str) -> str:
    m = re.search(rf'<section id="{ident}">(.*?)</section>', html, re.S)
    assert m, f"no section {ident}"
    return m.group(1)


def test_the_report_holds_what_it_was_given(inputs: dict[str, Any]) -> None:
    html = inputs["html"].read_text()
    bench = inputs["bench"]
    # self-contained: nothing is loaded from anywhere (and the page's policy forbids it)
    assert not re.search(r"\b(src|href)=\"(https?:)?//", html.replace(
        'href="https://ui.perfetto.dev"', ""))
    assert "default-src 'none'" in html
    # bandwidth: one point per size of ringlet's two forms and of each peer, one table row
    bw = _section(html, "bandwidth")
    assert bw.count("<svg") == 1
    for label in ["ringlet out-of-place", "ringlet in-place",
                  *(f"{p} (" for p in inputs["peers"])]:
        assert label in bw
    for r in bench["rows"]:
        t = r["out-of-place"]
        assert f"{human_us(t['time_us'])} / {t['busbw']:.3g} GB/s" in bw
    assert bw.count("<circle") == 2 * len(bench["rows"])
    assert bw.count("<rect x=") - 1 == len(inputs["peers"]) * len(bench["rows"])
    # predicted: the cost model's figure for every row, and measured / predicted
    pr = _section(html, "predicted")
    for r in bench["rows"]:
        us = predict("all_reduce", r["algorithm"], 2, r["size"], inputs["profile"],
                     "float32").seconds * 1e6
        t = r["in-place"]["time_us"]
        assert f"{human_us(us)}</td>" in pr and f"({t / us:.2f}x)" in pr
    # timeline: a box per operation of every rank, the skew summary, the most skewed
    tl = _section(html, "timeline")
    spans = [e for e in inputs["trace"]["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 12
    for e in spans:
        assert f"rank {e['tid']}: {e['name']}, at +" in tl
    assert "arrival skew over 4 collectives" in tl and "The most skewed collectives" in tl
    # the trace is embedded whole, for the page to parse and save
    m = re.search(r'<script type="application/json" id="trace-json">(.*?)</script>', html, re.S)
    assert m and json.loads(m.group(1))["traceEvents"] == inputs["trace"]["traceEvents"]
    # a diagram per algorithm the bench and the trace used
    alg = _section(html, "algorithms")
    used = {r["algorithm"] for r in bench["rows"]}
    for a in used:
        assert f"all_reduce / {a} on 2 ranks</h3>" in alg
    traced = {e["args"]["algorithm"] for e in spans if e["args"].get("algorithm")}
    for a in traced:
        assert f"all_reduce / {a} on 3 ranks</h3>" in alg
    assert alg.count('<svg xmlns="http://www.w3.org/2000/svg" class="schedule"') == \
        len(used) + len(traced)


def test_report_errors_name_the_bad_input(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"rows": 1}')
    p = _ringlet("report", "--bench", str(bad), "--out", str(tmp_path / "r.html"))
    assert p.returncode == 2 and "not a `ringlet bench --json` file" in p.stderr, p.stderr
    # rows and a job without the fields the report reads: one line, not a KeyError
    job = '"job": {"collective": "all_reduce", "nranks": 2, "dtype": "float32"}'
    for text, want in [
            ('{"rows": [{}], "job": {}}', "its 'job' has no 'collective'"),
            ('{"rows": [{}], ' + job + '}', "row 1 has no 'size' (a number of bytes)"),
            ('{"rows": [{"size": 8}], ' + job + '}', "row 1 has no 'algorithm'"),
            ('{"rows": [{"size": 8, "algorithm": "ring", "in-place": {"busbw": 1}}], '
             + job + '}', "row 1's 'in-place' has no 'time_us'"),
            ('{"rows": [], "peers": {"mpi": 1}, ' + job + '}', "its 'peers' is not"),
            ('{"rows": [{"size": 8, "algorithm": "ring", "mpi": {"time_us": 1, "ratio": '
             '"fast"}}], "peers": {"mpi": {}}, ' + job + '}', "row 1's 'mpi' has no")]:
        bad.write_text(text)
        p = _ringlet("report", "--bench", str(bad), "--out", str(tmp_path / "r.html"))
        assert p.returncode == 2 and want in p.stderr, p.stderr
        assert "Traceback" not in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr
    bad.write_text('{"rows": 1}')
    p = _ringlet("report", "--trace", str(tmp_path), "--out", str(tmp_path / "r.html"))
    assert p.returncode == 2 and "no trace.json and no rank-R.trace.jsonl" in p.stderr
    p = _ringlet("report", "--trace", str(tmp_path), "--vs", "mpi")
    assert p.returncode == 2 and "--vs goes with the short bench" in p.stderr
    assert not (tmp_path / "r.html").exists()
    for empty in ("[]", '{"traceEvents": []}', '{"traceEvents": [1, 2]}'):  # an empty report
        (tmp_path / "t.json").write_text(empty)
        p = _ringlet("report", "--trace", str(tmp_path / "t.json"), "--out",
                     str(tmp_path / "r.html"))
        assert p.returncode == 2 and "no operation in it" in p.stderr, p.stderr
    (tmp_path / "t.json").unlink()
    p = _ringlet("report", "--trace", str(tmp_path), "--out", str(tmp_path))  # a directory
    assert p.returncode == 2 and "is a directory; give a file name" in p.stderr, p.stderr
    # a --profile given that is not one: an error before the short bench, as in predict
    p = _ringlet("report", "--profile", str(tmp_path / "nope.json"), "--out",
                 str(tmp_path / "r.html"))
    assert p.returncode == 2 and "nope.json: no such file" in p.stderr, p.stderr
    p = _ringlet("report", "--profile", str(bad), "--out", str(tmp_path / "r.html"))
    assert p.returncode == 2 and "not a ringlet profile" in p.stderr, p.stderr
    assert not (tmp_path / "r.html").exists()


def test_without_inputs_it_runs_a_short_bench_with_a_bar_on_a_terminal(tmp_path: Path) -> None:
    """The short bench (ringlet only here, to stay quick) on a pseudo-terminal: the bar
    is drawn on stderr, and the report has the bench's sizes, 8 B to 1 MiB."""
    p, text = on_a_terminal([*RINGLET, "report", "--vs", "none", "--profile", "none", "--out",
                             str(tmp_path / "r.html")], env=clean_env(OMP_NUM_THREADS="1"))
    err = text.encode()
    assert p.returncode == 0, err.decode(errors="replace")
    assert b"ringlet report: bench: 1/7 sizes [" in err and b"ringlet report: " in err
    html = (tmp_path / "r.html").read_text()
    assert "--iters 10" in html and "no profile (--profile none)" in html
    for size in ("8 B", "64 B", "512 B", "4 KiB", "32 KiB", "256 KiB", "1 MiB"):
        assert f"<td>{size}</td>" in html


# --- in a real browser ---------------------------------------------------------------------

CHROMIUM_FLAGS = [*FLAGS, "--enable-logging=stderr", "--v=0"]


def chromium() -> str:
    path = chromium_path()
    if path:
        return path
    pytest.skip("no headless Chromium here: .ci/run installs Debian's chromium when it runs "
                "as root with apt-get (apt-get install chromium)")


def browse(url: str, *flags: str, home: Path) -> subprocess.CompletedProcess[str]:
    """Chromium headless on ``url`` with its own profile directory under ``home``."""
    return subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={home / 'chrome'}",
                           *flags, url], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "HOME": str(home)})


def test_the_report_opens_in_chromium_without_console_errors(inputs: dict[str, Any]) -> None:
    html, home = inputs["html"], inputs["dir"]
    p = browse(html.as_uri(), "--dump-dom", home=home)
    assert p.returncode == 0, p.stderr[-2000:]
    dom = p.stdout
    # the page writes every error it meets (script errors, blocked loads, console.error)
    # into #console-errors, and Chromium logs console messages on stderr: neither has any
    errors = re.search(r'<div id="console-errors"( hidden="")?>(.*?)</div>', dom, re.S)
    assert errors and errors.group(1) and errors.group(2) == "", errors and errors.group(2)
    assert ":CONSOLE" not in p.stderr, [ln for ln in p.stderr.splitlines() if "CONSOLE" in ln]
    assert 'data-ready="true"' in dom
    # the 3-rank trace parsed as JSON in the page (the check script counted its events)
    assert "trace.json: 12 operations of 3 ranks" in dom
    assert re.search(r'id="trace-download" download="trace.json" href="blob:', dom)
    shot = home / "report.png"
    p = browse(html.as_uri(), f"--screenshot={shot}", "--window-size=1100,900", home=home)
    assert p.returncode == 0, p.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_the_browser_check_sees_an_error_and_an_outside_load(inputs: dict[str, Any]) -> None:
    """The check above can fail: the same report with a script error and an image from
    the network shows both in #console-errors (the page's policy blocks the load)."""
    bad = inputs["dir"] / "bad.html"
    bad.write_text(inputs["html"].read_text().replace(
        "</body>", '<img src="https://example.invalid/x.png"><script>nosuch();</script></body>'))
    dom = browse(bad.as_uri(), "--dump-dom", home=inputs["dir"]).stdout
    errors = re.search(r'<div id="console-errors">(.*?)</div>', dom, re.S)
    assert errors, dom[:2000]
    assert "nosuch is not defined" in errors.group(1)
    assert "blocked by the page's policy: https://example.invalid/x.png" in errors.group(1)
    assert 'data-ready="true"' not in dom


def test_a_one_rank_bench_with_a_profile_is_reported(tmp_path: Path) -> None:
    # on 1 rank the cost model predicts 0 s: the report says so, it does not divide by it
    from ringlet.report import predicted_section

    row = {"time_us": 0.4, "busbw": None}
    bench = {"job": {"collective": "all_reduce", "nranks": 1, "dtype": "float32"},
             "rows": [{"size": 8, "algorithm": "ring", "out-of-place": row, "in-place": row}]}
    html = predicted_section([bench], Profile(Link.from_bandwidth(2e9, latency=5e-6)), "p")
    assert "0.4 us" in html



def test_a_long_trace_s_timeline_has_every_rank() -> None:
    # the merged trace lists its events rank by rank: the first operations drawn must be the
    # first in time, of every rank, not rank 0's alone
    from ringlet.report import MAX_TIMELINE_EVENTS, timeline_svg

    n = MAX_TIMELINE_EVENTS
    events = [{"name": f"all_reduce #{i}", "cat": "collective", "ph": "X", "ts": float(i),
               "dur": 0.5, "pid": 0, "tid": q, "args": {"rank": q, "seq": i}}
              for q in range(3) for i in range(n)]
    svg = timeline_svg(events)
    assert all(f">rank {q}</text>" in svg for q in range(3))


def test_a_traced_broadcast_is_drawn_from_its_own_root() -> None:
    # the trace says a rooted collective's root, and the report draws its schedule from it
    from types import SimpleNamespace

    from ringlet.agreement import COLL_CODE, Desc
    from ringlet.recorder import trace_event
    from ringlet.report import Inputs, diagram_keys

    fr = SimpleNamespace(offset_ns=0, world_ranks=[0, 1, 2], world_rank=0, ident="world")
    desc = Desc(collective=COLL_CODE["broadcast"], elems=4, root=2)
    e = trace_event([1, desc, "binomial", 1000, 2000], fr)
    assert e["args"]["root"] == 2
    assert diagram_keys(Inputs(trace={"traceEvents": [e]})) == [("broadcast", "binomial", 3, 2)]


def test_an_algorithm_and_its_alias_are_drawn_once() -> None:
    # rows naming tree and binomial (one algorithm) drew two copies of one diagram
    from ringlet.report import Inputs, diagram_keys

    rows = [{"size": 8, "algorithm": a} for a in ("tree", "binomial", "ring", "nonsense")]
    keys = diagram_keys(Inputs(benches=[{"job": {"collective": "all_reduce", "nranks": 4},
                                         "rows": rows}], bench_sources=["x"]))
    assert keys == [("all_reduce", "tree", 4, 0), ("all_reduce", "ring", 4, 0),
                    ("all_reduce", "nonsense", 4, 0)]


def test_every_diagram_has_ids_of_its_own() -> None:
    """The same schedule from two roots had one heading id, and every diagram's arrowheads
    the same ids (ah-r, ah-c): ids must be unique in a page."""
    import re
    from collections import Counter

    from ringlet.report import Inputs, render

    def call(seq: int, name: str, algorithm: str, root: int) -> dict[str, Any]:
        return {"name": f"{name} #{seq}", "cat": "collective", "ph": "X", "ts": 10.0 * seq,
                "dur": 1.0, "pid": 0, "tid": 0,
                "args": {"seq": seq, "rank": 0, "algorithm": algorithm, "root": root,
                         "peers": [0, 1, 2, 3], "comm": "0,1,2,3"}}

    html = render(Inputs(trace={"traceEvents": [
        call(1, "broadcast", "tree", 0), call(2, "broadcast", "tree", 1),
        call(3, "all_reduce", "ring", 0)]}))
    ids = Counter(re.findall(r' id="([^"]*)"', html))
    assert [i for i, k in ids.items() if k > 1] == []
    assert set(re.findall(r"url\(#([^)]*)\)", html)) <= set(ids)
    assert len(re.findall(r'<h3 id="diagram-', html)) == 3
    assert "broadcast / tree on 4 ranks, root 1" in html
