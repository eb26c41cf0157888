"""benchmarks/multihost.py's pure parts: several sweep jobs combined into one result."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import multihost  # noqa: E402 - the benchmarks folder is not a package


def job(scale: float, half_rtt: float, auto: str = "hierarchical") -> dict[str, Any]:
    """A sweep job's result as run_job returns it, every time ``scale`` times a base."""
    res = {m: {str(s): {"median_s": scale * s * 1e-8, "reps_s": [scale * s * 1e-8],
                        "calls_per_rep": 4, "rank0_median_s": scale * s * 0.9e-8}
               for s in (64 * 1024, 4 << 20)} for m in ("hierarchical", "peer")}
    return {"engine": "mpi", "results": res, "auto": {"65536": auto, "4194304": auto},
            "costs": {"half_rtt_s": half_rtt, "barrier_s": 5e-4},
            "costs_each": [{"half_rtt_s": half_rtt, "barrier_s": 5e-4}], "wrong": [],
            "exit_codes": [0, 0, 0, 0], "seconds": 30.0,
            "host0_eth0": {"tx_bytes": 100, "rx_bytes": 50}}


def test_one_job_is_its_own_result() -> None:
    j = job(1.0, 5e-5)
    assert multihost.combine([j]) is j
    assert multihost._spread(j, "hierarchical", 4 << 20) is None


def test_several_jobs_give_the_median_of_each_figure_and_keep_every_jobs() -> None:
    jobs = [job(1.0, 5e-5), job(1.3, 9e-5), job(1.1, 4e-5)]
    c = multihost.combine(jobs)
    v = c["results"]["hierarchical"]["4194304"]
    base = (4 << 20) * 1e-8
    assert v["median_s"] == base * 1.1
    assert v["jobs_s"] == [base, base * 1.3, base * 1.1]
    assert multihost._t(c, "peer", 4 << 20) == base * 1.1
    assert multihost._spread(c, "hierarchical", 4 << 20) == (base, base * 1.3)
    # the prediction's inputs: the median job's, input by input
    assert c["costs"] == {"half_rtt_s": 5e-5, "barrier_s": 5e-4}
    assert [x["half_rtt_s"] for x in c["costs_jobs"]] == [5e-5, 9e-5, 4e-5]
    assert c["seconds"] == 90.0 and c["host0_eth0"] == {"tx_bytes": 300, "rx_bytes": 150}
    assert c["jobs"] == 3 and not c["autos_differ"] and "costs_each" not in c


def test_a_failed_or_wrong_job_is_the_result() -> None:
    bad = {"engine": "mpi", "error": "rank 2 exited with 1", "exit_codes": [0, 0, 1, 0],
           "seconds": 3.0}
    got = multihost.combine([job(1.0, 5e-5), bad, job(1.1, 5e-5)])
    assert got["error"] == bad["error"] and "results" not in got
    assert got["jobs"] == 1 and got["failed_job"] == "job 2 of 3"
    # the jobs after a failed one do not run: it says how many there were to be
    assert multihost.combine([bad], 3)["failed_job"] == "job 1 of 3"
    assert "failed_job" not in multihost.combine([bad])
    wrong = {**job(1.2, 5e-5), "wrong": ["hierarchical 65536"]}
    got = multihost.combine([job(1.0, 5e-5), wrong])
    assert got["wrong"] == ["hierarchical 65536"] and got["failed_job"] == "job 2 of 2"
    # its tables say so, and that the figures are that job's alone
    run = {"rate": "1gbit", "rate_bps": 1e9, "sizes": [64 * 1024, 4 << 20],
           "link": {"goodput_bps": [9e8, 9e8], "two_flows_bps": 9e8, "rtt_min_s": 5e-5,
                    "rtt_median_s": 6e-5},
           "mpi": {**got, "peer": "MPI_Allreduce"}}
    text = "\n".join(multihost.tables(run))
    assert "**mpi: job 2 of 2 computed wrong sums (hierarchical 65536); the figures below " \
           "are that job's alone**" in text


def test_a_ratio_of_two_methods_is_the_median_of_the_jobs_ratios() -> None:
    """gloo / hierarchical per job, then the median: not the ratio of two medians, which
    may come from different jobs."""
    a, b, c = job(1.0, 5e-5), job(2.0, 5e-5), job(3.0, 5e-5)
    for j, peer in ((a, 3.0), (b, 2.2), (c, 3.3)):   # peer / hier: 3.0, 1.1, 1.1
        j["results"]["peer"]["4194304"]["median_s"] = peer * (4 << 20) * 1e-8
    got = multihost.combine([a, b, c])
    assert multihost._ratio(got, "peer", "hierarchical", 4 << 20) == pytest.approx(1.1)
    # the ratio of the medians would be 3.0 / 2.0
    assert multihost._t(got, "peer", 4 << 20) / multihost._t(got, "hierarchical", 4 << 20) \
        == pytest.approx(1.5)
    assert multihost._ratio(a, "peer", "hierarchical", 4 << 20) == pytest.approx(3.0)


def test_jobs_that_chose_differently_are_said_to() -> None:
    c = multihost.combine([job(1.0, 5e-5), job(1.0, 5e-5, "hierarchical_pipelined")])
    assert c["autos_differ"]


def test_history_tallies_each_target_over_the_kept_runs(tmp_path: Path) -> None:
    """--history: per target and rate the runs that met it and those that did not, as the
    generated section judges them, and the runs that met every target at once."""
    import json

    def run_file(n: int, hier: float) -> Path:
        j = job(1.0, 5e-5)
        # 4 MiB at 1 Gbit/s: the bound is 33.55 ms; hier is the ratio to it
        j["results"]["hierarchical"]["4194304"]["median_s"] = hier * (4 << 20) / 125e6
        j["results"]["peer"]["4194304"]["median_s"] = 1.4 * hier * (4 << 20) / 125e6
        run = {"rate": "1gbit", "rate_bps": 1e9, "sizes": [64 * 1024, 4 << 20],
               "mpi": j, "torch": j}
        p = tmp_path / f"multihost_run{n}.json"
        p.write_text(json.dumps({"runs": [run]}))
        return p

    files = [run_file(12, 1.3), run_file(9, 1.2), run_file(10, 1.1), run_file(11, 1.24)]
    text = multihost.history(files)
    assert "| hierarchical (mpi engine) within 1.25x of S/rate from 4 MiB | 1gbit | 9-11 | " \
           "12 |" in text, text
    assert "faster than gloo's own all_reduce (torchrun job) from 4 MiB | 1gbit | 9-12 | - |" \
           in text, text
    # no prediction in these runs: not measured, so not in the tally
    assert "predict" not in text
    assert text.endswith("Every target met at once in: 9-11; of the 4 runs kept (9-12).")
    assert multihost._runs([3, 1, 2, 7, 9, 10]) == "1-3, 7, 9-10" and multihost._runs([]) == "-"
