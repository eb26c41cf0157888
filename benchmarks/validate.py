"""Predicted (calibrated) vs measured on this machine: benchmarks/VALIDATION.md.

    python benchmarks/validate.py [--fresh] [--data benchmarks/sweep.json]

Every collective, every applicable algorithm and the automatic choice, 8 B to
64 MiB, on 2 and 4 local ranks (the sweep of benchmarks/sweep.py), against
``ringlet.cost.predict`` with the profile calibrated before the sweep (the
host model of ``ringlet.cost.host``), and against ``ringlet.sim.simulate``
with the same profile (the host model run rank by rank, ``ringlet.sim.host``).
Error = (predicted - measured) / measured; the tables give the median of
|error| per size, for every algorithm and for the automatic choice alone (what
users run).  Targets: <= 15 % from 64 KiB, <= 30 % below.  ``--fresh``
measures again first.
"""

from __future__ import annotations

import statistics
from typing import Any

from sweep import HERE, report_args

from ringlet.cost.host import Paths
from ringlet.cost.model import Profile, predict
from ringlet.cost.units import format_bytes, format_seconds
from ringlet.schedule import COLLECTIVES
from ringlet.sim import Topology, simulate

KiB = 1 << 10
BIG = 64 * KiB


def target(nbytes: int) -> float:
    return 0.15 if nbytes >= BIG else 0.30


def rows(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Every measured case with its prediction, its simulation and their errors."""
    prof = Profile.from_dict(data["profile"])
    st = data["settings"]
    paths = Paths(st["fused"], st["shm_post_bytes"], st["shm_stage_bytes"],
                  st["shm_piece_bytes"])
    topo = Topology.from_profile(prof)
    out = []
    for r in data["runs"]:
        algo = r["algorithm"] or r["ran"]
        pred = predict(r["collective"], algo, r["nranks"], r["nbytes"], prof, "float32",
                       paths=paths)
        sim = simulate(r["collective"], algo, r["nranks"], r["nbytes"], topo, paths=paths)
        out.append({**r, "auto": r["algorithm"] is None, "algo": algo, "pred": pred.seconds,
                    "err": (pred.seconds - r["seconds"]) / r["seconds"], "how": pred.counted,
                    "sim": sim.seconds, "serr": (sim.seconds - r["seconds"]) / r["seconds"]})
    return out


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def by_size(rs: list[dict[str, Any]]) -> list[str]:
    lines = ["| size | target | all algorithms: 2 ranks | 4 ranks | both | auto choice: 2 ranks "
             "| 4 ranks | both | cases | measurement spread |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in sorted({r["nbytes"] for r in rs if r["collective"] == "all_reduce"}):
        def m(auto: bool, n: int | None, s: int = s) -> str:
            sel = [abs(r["err"]) for r in rs if r["auto"] == auto and
                   _size_class(r) == s and (n is None or r["nranks"] == n)]
            v = med(sel)
            return f"{v:.0%}" + (" **!**" if v > target(s) else "")
        count = sum(1 for r in rs if _size_class(r) == s)
        spread = med([max(r["repeats"]) / min(r["repeats"]) - 1 for r in rs
                      if _size_class(r) == s])
        lines.append(f"| {format_bytes(s, binary=True)} | {target(s):.0%} | {m(False, 2)} | "
                     f"{m(False, 4)} | {m(False, None)} | {m(True, 2)} | {m(True, 4)} | "
                     f"{m(True, None)} | {count} | {spread:.0%} |")
    return lines


def sim_by_size(rs: list[dict[str, Any]]) -> list[str]:
    """The simulator's median |error| per size (every algorithm and the automatic choice)
    beside predict's, and how far the two ever are apart."""
    lines = ["| size | target | simulate: 2 ranks | 4 ranks | both | auto choice: both "
             "| predict: both | largest \\|simulate / predict - 1\\| |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in sorted({r["nbytes"] for r in rs if r["collective"] == "all_reduce"}):
        sel = [r for r in rs if _size_class(r) == s]

        def m(key: str, auto: bool, n: int | None, s: int = s,
              sel: list[dict[str, Any]] = sel) -> str:
            v = med([abs(r[key]) for r in sel if r["auto"] == auto
                     and (n is None or r["nranks"] == n)])
            return f"{v:.0%}" + (" **!**" if v > target(s) else "")
        apart = max(abs(r["sim"] / r["pred"] - 1) for r in sel)
        lines.append(f"| {format_bytes(s, binary=True)} | {target(s):.0%} | "
                     f"{m('serr', False, 2)} | {m('serr', False, 4)} | {m('serr', False, None)} "
                     f"| {m('serr', True, None)} | {m('err', False, None)} | {apart:.1e} |")
    return lines


def _size_class(r: dict[str, Any]) -> int:
    """The sweep size a case belongs to (per-rank collectives round to whole blocks)."""
    sizes = [8 * 8 ** k for k in range(8)] + [64 << 20]
    return min(sizes, key=lambda s: abs(s - r["nbytes"]))


def by_collective(rs: list[dict[str, Any]]) -> list[str]:
    lines = ["| collective | ranks | median error < 64 KiB | >= 64 KiB | worst case (algorithm, "
             "size, error) |", "|---|---:|---:|---:|---|"]
    for coll in COLLECTIVES:
        for n in sorted({r["nranks"] for r in rs}):
            sel = [r for r in rs if r["collective"] == coll and r["nranks"] == n
                   and not r["auto"]]
            if not sel:      # not measured (scan and exscan are not in the sweep)
                continue
            small = [abs(r["err"]) for r in sel if r["nbytes"] < BIG]
            big = [abs(r["err"]) for r in sel if r["nbytes"] >= BIG]
            w = max(sel, key=lambda r: abs(r["err"]))
            lines.append(f"| {coll} | {n} | {med(small):.0%} | {med(big):.0%} | {w['algo']}, "
                         f"{format_bytes(w['nbytes'], binary=True)}, {w['err']:+.0%} |")
    return lines


def auto_table(rs: list[dict[str, Any]]) -> list[str]:
    lines = ["| ranks | collective | size | auto ran | measured | predicted | error |",
             "|---:|---|---:|---|---:|---:|---:|"]
    order = list(COLLECTIVES)
    for r in sorted((r for r in rs if r["auto"]),
                    key=lambda r: (r["nranks"], order.index(r["collective"]), r["nbytes"])):
        lines.append(f"| {r['nranks']} | {r['collective']} | "
                     f"{format_bytes(r['nbytes'], binary=True)} | {r['algo']} | "
                     f"{format_seconds(r['seconds'])} | {format_seconds(r['pred'])} | "
                     f"{r['err']:+.0%} |")
    return lines


def main() -> None:
    a, data = report_args(__doc__.splitlines()[0], "VALIDATION.md")
    rs = rows(data)
    notes_file = HERE / "validation_notes.md"
    notes = notes_file.read_text() if notes_file.exists() else ""
    big = [abs(r["err"]) for r in rs if not r["auto"] and r["nbytes"] >= BIG]
    small = [abs(r["err"]) for r in rs if not r["auto"] and r["nbytes"] < BIG]

    def sim_med(n: int | None, large: bool) -> str:
        sel = [abs(r["serr"]) for r in rs if not r["auto"] and (r["nbytes"] >= BIG) == large
               and (n is None or r["nranks"] == n)]
        return f"{med(sel):.1%}"
    apart = max(abs(r["sim"] / r["pred"] - 1) for r in rs)
    text = [
        "# Predicted vs measured on this machine",
        "",
        "The calibrated cost model (`ringlet predict --calibrate`, then `ringlet.cost.predict`: "
        "the host model of `src/ringlet/cost/host.py`) against the measured time of every "
        "collective with every applicable algorithm, and with the automatic choice, from 8 B "
        "to 64 MiB (float32, nccl-tests sizes), on 2 and 4 local ranks; and the simulator "
        "(`ringlet simulate --profile`, `ringlet.sim.simulate`) with the same profile. Error = "
        "(predicted - measured) / measured. Targets: median |error| <= 15 % for sizes >= 64 "
        "KiB, <= 30 % below.",
        "",
        "Regenerate (about 10 minutes on two cores; run it on an otherwise idle machine):",
        "",
        "    python benchmarks/sweep.py          # calibrate, measure: benchmarks/sweep.json",
        "    python benchmarks/validate.py       # this file (--fresh: measure again first)",
        "",
        f"Measured {data['date']} on `{data['host']}` ({data['cores']} cores), commit "
        f"{data['commit']}, in {data['minutes']:.0f} minutes; load average "
        f"{data['loadavg_before'][0]:.2f} before and {data['loadavg_after'][0]:.2f} after "
        f"(its own ranks and calibration included). "
        f"Each time is the median of {data['repeat']} sweeps, each the median of "
        f"{data['reps']} batches of calls (at least {data['budget'] * 1e3:.0f} ms or one "
        f"call), each sweep of a collective started once the machine was at least 90 % idle. "
        f"The profile was calibrated just before, with {data['profile']['calibration']['nranks']}"
        f" ranks (at the end). Buffers start {data.get('offset', 256)} B past a page boundary "
        f"(`ringlet.cost.measure.aligned`).",
        "",
        f"Overall, every algorithm: median |error| {med(small):.0%} below 64 KiB "
        f"({len(small)} cases), {med(big):.0%} from 64 KiB ({len(big)} cases). The "
        f"simulator, the same cases: {sim_med(None, False)} below 64 KiB, "
        f"{sim_med(None, True)} from 64 KiB ({sim_med(2, True)} at 2 ranks, "
        f"{sim_med(4, True)} at 4).",
        "",
        "## Median |error| per size",
        "",
        "*Measurement spread*: the median, over the cases of a size, of (slowest / fastest "
        "of the three sweeps) - 1: how far the same measurement moves from one sweep to the "
        "next on this machine.",
        "",
        *by_size(rs),
        "",
        "## The simulator against the same measurements",
        "",
        "`ringlet simulate --profile PROFILE` (here `ringlet.sim.simulate` over "
        "`Topology.from_profile`, with the sweep's path settings) runs a calibrated local "
        "profile with the host model of `ringlet predict`, rank by rank "
        "(`src/ringlet/sim/host.py`): every rank pays the call's Python, all of them agree on "
        "the call, and each rank's round costs what `ringlet.cost.host.host_rounds` counts for "
        "it (the round's fixed costs, its bytes moved and reduced, the cores it shares); a rank "
        "starts a round once it is done with the one before and its senders are done with "
        "theirs (on the fused paths, once every rank is). Without stragglers or jitter a round "
        "then lasts what its busiest rank takes, which is what predict sums, so at 2 and 4 "
        f"ranks the two agree (at most {apart:.1e} apart on these cases) and the simulator's "
        "errors are predict's; stragglers and jitter then act on each rank's clock "
        "(`tests/test_sim_host.py`).",
        "",
        *sim_by_size(rs),
        "",
        *([notes] if notes else []),
        "## Per collective (every algorithm)",
        "",
        *by_collective(rs),
        "",
        "## The automatic choice, case by case",
        "",
        *auto_table(rs),
        "",
        "Every algorithm's case is in `benchmarks/sweep.json` (measured) and can be predicted "
        "with `ringlet predict COLLECTIVE --bytes N --ranks P --profile PROFILE`.",
        "",
        "## The calibration used",
        "",
        "```",
        *data["calibration"],
        "```",
        "",
    ]
    a.out.write_text("\n".join(text))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
