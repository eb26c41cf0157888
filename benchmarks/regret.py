"""The tuner's regret on this machine: benchmarks/REGRET.md.

    python benchmarks/regret.py [--fresh] [--data benchmarks/sweep.json]

For every collective and size of the sweep (benchmarks/sweep.py: 8 B to
64 MiB, 2 and 4 ranks), regret = time of the automatic choice / time of the
fastest algorithm measured.  The automatic choice is timed as its own case
(``algorithm=None``, the communicator with the calibrated profile), not read
off the algorithm it picked, so the table shows what a user gets; the
"choice" column separates the two causes of a regret above 1: the measured
time of the algorithm it picked over the best (a wrong pick) and the rest
(noise between two timings of the same thing).  The heuristic's pick (no
profile) is shown beside it.  ``--fresh`` measures again (about 10 minutes
on two cores); otherwise the saved sweep is used.
"""

from __future__ import annotations

import statistics
from typing import Any

from sweep import HERE, report_args

from ringlet.algorithms.select import choose
from ringlet.cost.units import format_bytes, format_seconds
from ringlet.schedule import COLLECTIVES

TARGET = 1.10


def heuristic_pick(coll: str, n: int, nbytes: int, post_bytes: int) -> str:
    """What the communicator runs without a profile (its oneshot fallback included)."""
    name = choose(coll, n, nbytes, requested=None, setting="")
    if name == "oneshot" and nbytes > post_bytes:
        name = "direct"
    return name


def rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (ranks, collective, size): best, auto, regrets."""
    by: dict[tuple[int, str, int], dict[str | None, dict[str, Any]]] = {}
    for r in data["runs"]:
        by.setdefault((r["nranks"], r["collective"], r["nbytes"]), {})[r["algorithm"]] = r
    post = data["settings"]["shm_post_bytes"]
    out = []
    order = list(COLLECTIVES)
    for (n, coll, nbytes), cases in sorted(by.items(),
                                           key=lambda kv: (kv[0][0], order.index(kv[0][1]),
                                                           kv[0][2])):
        auto = cases.pop(None)
        best = min(cases, key=lambda a: cases[a]["seconds"])
        t_best = cases[best]["seconds"]
        picked = auto["ran"]
        heur = heuristic_pick(coll, n, nbytes, post)
        out.append({
            "nranks": n, "collective": coll, "nbytes": nbytes, "best": best,
            "t_best": t_best, "auto": picked, "t_auto": auto["seconds"],
            "regret": auto["seconds"] / t_best,
            "choice": cases[picked]["seconds"] / t_best if picked in cases else float("nan"),
            "heuristic": heur,
            "h_regret": cases[heur]["seconds"] / t_best if heur in cases else float("nan"),
            "spread": max(auto["repeats"]) / min(auto["repeats"]) - 1,
        })
    return out


def table(rs: list[dict[str, Any]]) -> list[str]:
    lines = ["| ranks | collective | size | fastest measured | time | auto picks | auto time "
             "| regret | choice | heuristic picks | its regret |",
             "|---:|---|---:|---|---:|---|---:|---:|---:|---|---:|"]
    for r in rs:
        mark = " **!**" if r["regret"] > TARGET else ""
        lines.append(
            f"| {r['nranks']} | {r['collective']} | {format_bytes(r['nbytes'], binary=True)} "
            f"| {r['best']} | {format_seconds(r['t_best'])} | {r['auto']} "
            f"| {format_seconds(r['t_auto'])} | {r['regret']:.2f}{mark} | {r['choice']:.2f} "
            f"| {r['heuristic']} | {r['h_regret']:.2f} |")
    return lines


def summary(rs: list[dict[str, Any]]) -> list[str]:
    out = ["| ranks | cases | median regret | worst | cases > 1.10 | of which a wrong pick "
           "(choice > 1.10) | heuristic: median, worst, cases > 1.10 |",
           "|---:|---:|---:|---:|---:|---:|---|"]
    for n in sorted({r["nranks"] for r in rs}):
        sel = [r for r in rs if r["nranks"] == n]
        reg = [r["regret"] for r in sel]
        h = [r["h_regret"] for r in sel]
        over = [r for r in sel if r["regret"] > TARGET]
        out.append(f"| {n} | {len(sel)} | {statistics.median(reg):.2f} | {max(reg):.2f} | "
                   f"{len(over)} | {sum(r['choice'] > TARGET for r in over)} | "
                   f"{statistics.median(h):.2f}, {max(h):.2f}, "
                   f"{sum(x > TARGET for x in h)} |")
    return out


def main() -> None:
    a, data = report_args(__doc__.splitlines()[0], "REGRET.md")
    rs = rows(data)
    notes = (HERE / "regret_notes.md").read_text() if (HERE / "regret_notes.md").exists() \
        else ""
    text = [
        "# Tuner regret on this machine",
        "",
        "Regret = time of the automatic choice (`algorithm=None`, the communicator with a "
        "calibrated profile) / time of the fastest algorithm measured, per collective and "
        "size (nccl-tests sizes, float32), on 2 and 4 local ranks. Target: <= 1.10 at "
        "every size.",
        "",
        "Regenerate (about 10 minutes on two cores; run it on an otherwise idle machine):",
        "",
        "    python benchmarks/sweep.py          # calibrate, measure: benchmarks/sweep.json",
        "    python benchmarks/regret.py         # this file (--fresh: measure again first)",
        "",
        f"Measured {data['date']} on `{data['host']}` ({data['cores']} cores), commit "
        f"{data['commit']}, in {data['minutes']:.0f} minutes; load average "
        f"{data['loadavg_before'][0]:.2f} before and {data['loadavg_after'][0]:.2f} after "
        f"(its own ranks and calibration included). "
        f"Each time is the median of {data['repeat']} sweeps, each the median of "
        f"{data['reps']} batches of calls (at least {data['budget'] * 1e3:.0f} ms or one "
        f"call), each sweep of a collective started once the machine was at least 90 % idle "
        f"(see the log at the end). Buffers start {data.get('offset', 256)} B past a page boundary "
        f"(`ringlet.cost.measure.aligned`).",
        "",
        "Columns: *choice* is the measured time of the algorithm auto picked over the "
        "fastest (above 1: a wrong pick); *regret* above *choice* is noise between two "
        "timings of the same algorithm. *heuristic* is what the communicator runs without "
        "a profile.",
        "",
        "## Summary",
        "",
        *summary(rs),
        "",
        *([notes] if notes else []),
        "## Every case",
        "",
        *table(rs),
        "",
        "## The calibration used",
        "",
        "```",
        *data["calibration"],
        "```",
        "",
        "## Log",
        "",
        "```",
        *data["log"],
        "```",
        "",
    ]
    a.out.write_text("\n".join(text))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
