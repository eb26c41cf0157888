"""ringlet predict through ringlet.cli.main: the table, the JSON, errors, help and speed."""

from __future__ import annotations

import json
import math
import time

import pytest

import ringlet.cost.model as model
from ringlet.algorithms import algorithms
from ringlet.cli import main

pytestmark = pytest.mark.one_process   # tests/conftest.py

H100 = ["predict", "all_reduce", "--bytes", "14GB", "--ranks", "8", "--link", "nvlink4"]


def test_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*H100, "--dtype", "float16", "--textbook"]) == 0
    out = capsys.readouterr().out
    assert "all_reduce of 14 GB on 8 ranks: m = 7,000,000,000 float16" in out
    assert "450 GB/s per direction (headline 900 GB/s bidirectional)" in out
    for name in algorithms("all_reduce"):
        assert name in out
    assert "<- fastest" in out and "\nfastest: " in out
    assert "crossovers (fastest by size):" in out
    assert "textbook: 2S / 900 GB/s = 31.1 ms" in out
    assert "counts both directions; per direction it is 450 GB/s: 2x slower" in out


def test_the_textbook_comparison_counts_one_round_as_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    # a one-round gather said 'latency: 1 rounds x alpha'
    assert main(["predict", "gather", "--bytes", "8GB", "--ranks", "8", "--link", "nvlink4",
                 "--algorithm", "naive", "--textbook", "--no-crossovers"]) == 0
    out = capsys.readouterr().out
    assert "latency: 1 round x alpha + per-message overhead 2.8 us = 4.7 us" in out
    assert main([*H100, "--algorithm", "ring", "--textbook", "--no-crossovers"]) == 0
    assert "latency: 14 rounds x alpha" in capsys.readouterr().out


def test_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*H100, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list) and rows
    ok = [r for r in rows if r["applicable"]]
    assert {r["algorithm"] for r in rows} == set(algorithms("all_reduce"))
    for r in ok:
        for key in ("algorithm", "seconds", "rounds", "bytes_per_rank", "algbw", "busbw",
                    "pieces", "fastest", "fastest_ranges", "counted"):
            assert key in r
    assert ok[0]["fastest"] and not any(r["fastest"] for r in ok[1:])
    ring = next(r for r in ok if r["algorithm"] == "ring")
    assert ring["rounds"] == 14
    assert ring["bytes_per_rank"] == pytest.approx(2 * 7 / 8 * 14e9)
    # NCCL's ring on 8 H100s: ~370 GB/s busbw
    assert ring["busbw"] == pytest.approx(370e9, rel=0.15)
    # every size up to 1 TiB has exactly one fastest algorithm
    spans = sorted(s for r in ok for s in r["fastest_ranges"])
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))


def test_inapplicable_algorithms_are_listed(capsys: pytest.CaptureFixture[str]) -> None:
    if "hierarchical" not in algorithms("all_reduce"):
        pytest.skip("no hierarchical all_reduce registered")
    assert main([*H100, "--param", "group=3", "--json", "--no-crossovers"]) == 0
    rows = json.loads(capsys.readouterr().out)
    bad = [r for r in rows if not r["applicable"]]
    assert sorted(r["algorithm"] for r in bad) == ["hierarchical", "hierarchical_pipelined"]
    assert all("does not divide" in r["reason"] for r in bad)


@pytest.mark.parametrize("argv, msg", [
    (["--algorithm", "foo"], "unknown algorithm 'foo' for all_reduce; valid: "),
    (["--param", "grup=2"], "--param grup: none of the algorithms of all_reduce takes it "
                            "(they take: group, pieces)"),
    (["--algorithm", "binomial", "--param", "group=2"],
     "--param group: none of --algorithm's choices takes it"),
    (["--param", "pieces=0"], "--param pieces: pieces must be >= 1, got 0"),
    (["--ranks", "100000000"], "100,000,000 ranks: at most 65,536"),   # was a hang
    (["--gpus-per-node", "2"], "--gpus-per-node is for two levels of links"),
    # read by --link local only: it was ignored, a path that does not exist too
    (["--profile", "/nonexistent"], "--profile is what --link local reads; --link does not"),
])
def test_a_request_that_predicts_nothing_is_refused(
        capsys: pytest.CaptureFixture[str], argv: list[str], msg: str) -> None:
    """A typo in an algorithm or a parameter used to exit 0 with nothing predicted (or
    with the parameter ignored)."""
    assert main(["predict", "all_reduce", "--bytes", "1MB", "--ranks", "4", "--link",
                 "nvlink4", *argv]) == 2
    assert msg in capsys.readouterr().err


def test_no_applicable_algorithm_exits_1_and_json_is_strict(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "all_reduce", "--bytes", "1MB", "--ranks", "6", "--link",
                 "nvlink4", "--algorithm", "hierarchical", "--param", "group=4"]) == 1
    out = capsys.readouterr().out
    assert "no algorithm applies:" in out and "group=4 does not divide 6 ranks" in out
    assert main(["predict", "all_reduce", "--bytes", "1MB", "--ranks", "1", "--link",
                 "nvlink4", "--algorithm", "ring", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out,
                        parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    assert row["busbw"] is None and row["seconds"] == 0


def test_notes_on_sizes_and_units(capsys: pytest.CaptureFixture[str]) -> None:
    """A size the collective cannot move in whole elements is said to be rounded; a
    bandwidth without a unit (bytes/s) gets a hint; a calibrated or default local link
    is not called 'local: local:'."""
    assert main(["predict", "all_gather", "--bytes", "1MB", "--ranks", "3", "--link",
                 "nvlink4", "--no-crossovers"]) == 0
    assert ("1,000,000 B is not a size all_gather moves in whole float32 elements on 3 "
            "ranks: predicted at 1,000,008 B") in capsys.readouterr().out
    assert main(["predict", "all_reduce", "--bytes", "1MB", "--ranks", "4", "--bandwidth",
                 "25", "--no-crossovers"]) == 0
    assert "--bandwidth is 25 B/s per direction: a number without a unit is bytes per " \
        "second" in capsys.readouterr().out
    assert main(["predict", "all_reduce", "--bytes", "1MB", "--ranks", "4",
                 "--no-crossovers", "--profile", "/nonexistent"]) == 2
    capsys.readouterr()
    assert main(["predict", "all_reduce", "--bytes", "1MB", "--ranks", "4",
                 "--no-crossovers"]) == 0
    assert "local: local:" not in capsys.readouterr().out


def test_the_textbook_across_nodes_divides_by_the_link_between_them(
        capsys: pytest.CaptureFixture[str]) -> None:
    """2S/B with B the inter-node link's figure (the slowest), not NVLink's 900 GB/s."""
    assert main(["predict", "all_reduce", "--bytes", "1GB", "--link", "dgx_h100", "--nodes",
                 "2", "--textbook", "--algorithm", "ring", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["textbook"]["textbook_seconds"] == pytest.approx(2 * 1e9 / 50e9)
    assert main(["predict", "all_reduce", "--bytes", "1GB", "--link", "dgx_h100", "--ranks",
                 "8", "--textbook", "--algorithm", "ring", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["textbook"]["textbook_seconds"] == pytest.approx(2 * 1e9 / 900e9)


def test_the_textbook_across_nodes_is_explained_too(
        capsys: pytest.CaptureFixture[str]) -> None:
    # two levels of links: the bandwidth terms on both links against the textbook's time,
    # then latency; the factors multiply to the ratio (there were none: a bare ratio)
    assert main(["predict", "all_reduce", "--bytes", "1GB", "--link", "dgx_h100", "--nodes",
                 "2", "--textbook", "--algorithm", "hierarchical", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    tb = row["textbook"]
    factors = [f["factor"] for f in tb["factors"]]
    assert len(factors) == 2 and math.prod(factors) == pytest.approx(tb["ratio"], rel=1e-9)
    assert factors[0] == pytest.approx(row["beta_seconds"] / tb["textbook_seconds"])
    assert "two levels of links" in tb["factors"][0]["reason"] and \
        "2 GB per rank at 50 GB/s" in tb["factors"][0]["reason"]
    assert tb["factors"][1]["reason"].startswith("latency: ")


def test_two_levels_and_rails(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["predict", "all_reduce", "--bytes", "8GB", "--link", "dgx_a100", "--nodes", "2",
            "--algorithm", "ring", "--json"]
    assert main(argv) == 0
    plain = json.loads(capsys.readouterr().out)[0]
    assert main([*argv, "--rails"]) == 0
    rails = json.loads(capsys.readouterr().out)[0]
    assert plain["nranks"] == 16
    assert rails["busbw"] == pytest.approx(8 * plain["busbw"], rel=0.02)


def test_custom_links(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "broadcast", "--bytes", "64MB", "--ranks", "4", "--bandwidth",
                 "400Gb/s", "--latency", "5us", "--algorithm", "naive", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["seconds"] == pytest.approx(5e-6 + 3 * 64e6 / 50e9)
    assert main(["predict", "all_reduce", "--bytes", "1GB", "--ranks", "8", "--intra",
                 "450GB/s,2us", "--inter", "ib_ndr", "--gpus-per-node", "4", "--algorithm",
                 "ring", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["rounds"] == 14
    assert main(["predict", "all_reduce", "--bytes", "1GB", "--link", "nvlink4", "--inter",
                 "ib_ndr", "--nodes", "2", "--gpus-per-node", "8", "--algorithm", "ring",
                 "--json"]) == 0
    (two,) = json.loads(capsys.readouterr().out)
    assert two["nranks"] == 16 and two["busbw"] == pytest.approx(48e9, rel=0.02)  # one NIC


@pytest.mark.parametrize("links", [
    ["--link", "nvlink4", "--ranks", "8"],
    ["--intra", "nvlink4", "--inter", "ib_ndr", "--gpus-per-node", "4", "--ranks", "8"],
    ["--link", "dgx_h100", "--ranks", "8"],
])
def test_gamma_is_the_reduction_speed_of_preset_links_too(
        capsys: pytest.CaptureFixture[str], links: list[str]) -> None:
    """--gamma was dropped without a word with a preset link (--link nvlink4, --intra
    nvlink4, a node shape): a ring all_reduce of 80 MB on 8 ranks reduces 7/8 of it, 70 ms
    at 1 GB/s, and the prediction said 0 s of reduction."""
    argv = ["predict", "all_reduce", "--bytes", "80MB", *links, "--algorithm", "ring",
            "--json", "--no-crossovers"]
    assert main(argv) == 0
    (free,) = json.loads(capsys.readouterr().out)
    assert main([*argv, "--gamma", "1GB/s"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["seconds"] - free["seconds"] == pytest.approx(7 / 8 * 80e6 / 1e9, rel=1e-6)


@pytest.mark.parametrize("cmd", ["predict", "simulate"])
def test_a_profile_with_links_given_is_refused(capsys: pytest.CaptureFixture[str],
                                               cmd: str) -> None:
    assert main([cmd, "all_reduce", "--bytes", "1MB", "--ranks", "4", "--bandwidth", "1GB/s",
                 "--profile", "/nonexistent"]) == 2
    assert "--profile is what --link local reads; --bandwidth does not" in \
        capsys.readouterr().err


def test_gamma_is_refused_for_the_local_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "all_reduce", "--bytes", "1MB", "--ranks", "4", "--link", "local",
                 "--gamma", "1GB/s"]) == 2
    assert "--link local has its calibrated reduction speed" in capsys.readouterr().err


def test_a_fixed_cost_per_call(capsys: pytest.CaptureFixture[str]) -> None:
    """--call adds the same seconds to every algorithm (the agreement and an engine's
    per-call costs), counted with the latency terms; bandwidths follow."""
    argv = ["predict", "all_reduce", "--bytes", "64MB", "--nodes", "2", "--gpus-per-node",
            "2", "--intra", "30GB/s,17us", "--inter", "60MB/s,300us", "--json",
            "--no-crossovers"]
    assert main(argv) == 0
    plain = {r["algorithm"]: r for r in json.loads(capsys.readouterr().out) if r["applicable"]}
    assert main([*argv, "--call", "1.5ms"]) == 0
    more = {r["algorithm"]: r for r in json.loads(capsys.readouterr().out) if r["applicable"]}
    assert plain.keys() == more.keys() and len(plain) > 3
    for name, p in plain.items():
        q = more[name]
        assert q["seconds"] == pytest.approx(p["seconds"] + 1.5e-3)
        assert q["alpha_seconds"] == pytest.approx(p["alpha_seconds"] + 1.5e-3)
        assert q["busbw"] == pytest.approx(p["busbw"] * p["seconds"] / q["seconds"])
    assert main([*argv[:-2], "--call", "1.5ms", "--algorithm", "ring"]) == 0
    assert "a fixed 1.5 ms per call on top of the schedule (--call)" in capsys.readouterr().out


def test_the_engines_call_in_place_of_the_rails_latency(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--rail-call: hierarchical's inter-node phase (a ring all_reduce of one shard,
    S/g, among the G ranks of a rail on the inter link) costs the engine's call plus
    its bytes: the ring's latency terms give way to it, at every size; other
    algorithms do not change, and the fastest is listed first again."""
    two = ["predict", "all_reduce", "--nodes", "2", "--gpus-per-node", "2",
           "--intra", "30GB/s,17us", "--inter", "60MB/s,100us", "--json", "--no-crossovers"]

    def rows(*argv: str) -> dict[str, dict[str, object]]:
        assert main([*two, *argv]) == 0
        got = json.loads(capsys.readouterr().out)
        assert got[0]["fastest"]
        return {r["algorithm"]: r for r in got if r["applicable"]}

    def phase(shard: int) -> dict[str, float]:   # the same ring on one level: the inter link
        assert main(["predict", "all_reduce", "--bytes", str(shard), "--ranks", "2",
                     "--bandwidth", "60MB/s", "--latency", "100us", "--algorithm", "ring",
                     "--json", "--no-crossovers"]) == 0
        return json.loads(capsys.readouterr().out)[0]

    for size, shard in (("64KiB", 32 * 1024), ("16MiB", 8 << 20)):
        plain, railed = rows("--bytes", size), rows("--bytes", size, "--rail-call", "3ms")
        ring = phase(shard)
        assert ring["alpha_seconds"] == pytest.approx(2 * 100e-6)   # two rounds of 2 ranks
        more = 3e-3 - ring["alpha_seconds"]
        h, r = plain["hierarchical"], railed["hierarchical"]
        assert r["seconds"] == pytest.approx(h["seconds"] + more)
        assert r["alpha_seconds"] == pytest.approx(h["alpha_seconds"] + more)
        assert r["beta_seconds"] == pytest.approx(h["beta_seconds"])
        assert railed["ring"] == plain["ring"]
    # 64 KiB: the 2.8 ms more make hierarchical slower than another algorithm
    plain, railed = rows("--bytes", "64KiB"), rows("--bytes", "64KiB", "--rail-call", "3ms")
    assert min(plain, key=lambda k: plain[k]["seconds"]) == "hierarchical"
    assert min(railed, key=lambda k: railed[k]["seconds"]) != "hierarchical"
    # an engine faster than the link's latency makes the phase shorter
    quick = rows("--bytes", "64KiB", "--rail-call", "50us")["hierarchical"]
    assert quick["seconds"] == pytest.approx(plain["hierarchical"]["seconds"] - 150e-6)
    assert main([*two[:-2], "--bytes", "64KiB", "--rail-call", "3ms",
                 "--algorithm", "hierarchical"]) == 0
    assert "inter-node phase 3 ms plus its bytes on the inter link, the engine's own " \
           "all_reduce on a rail (--rail-call)" in capsys.readouterr().out


def test_pieces_given_and_the_engines_call_per_piece(
        capsys: pytest.CaptureFixture[str]) -> None:
    """--param pieces=K fixes the pipelined algorithms' pieces (others keep one); with
    --rail-call each of hierarchical_pipelined's pieces' inter-node phases pays the
    engine's call in place of the ring's latency."""
    two = ["predict", "all_reduce", "--nodes", "2", "--gpus-per-node", "2",
           "--intra", "30GB/s,17us", "--inter", "60MB/s,100us", "--json", "--no-crossovers",
           "--algorithm", "hierarchical_pipelined", "--algorithm", "rabenseifner"]

    def rows(*argv: str) -> dict[str, dict[str, object]]:
        assert main([*two, *argv]) == 0
        return {r["algorithm"]: r for r in json.loads(capsys.readouterr().out)
                if r["applicable"]}

    for k in (1, 2, 8):
        got = rows("--bytes", "4MiB", "--param", f"pieces={k}")
        assert got["hierarchical_pipelined"]["pieces"] == k
        assert got["rabenseifner"]["pieces"] == 1   # not pipelined: applicable, one piece
    # 8 pieces, each phase two rounds of 100 us: a 10 ms call adds 8 x 9.8 ms
    for k in (2, 8):
        plain = rows("--bytes", "4MiB", "--param", f"pieces={k}")["hierarchical_pipelined"]
        got = rows("--bytes", "4MiB", "--param", f"pieces={k}", "--rail-call", "10ms")
        extra = got["hierarchical_pipelined"]["seconds"] - plain["seconds"]
        assert extra == pytest.approx(k * (10e-3 - 200e-6))


@pytest.mark.parametrize("command", [
    ["simulate", "all_reduce", "--bytes", "1MB", "--ranks", "4", "--bandwidth", "1GB/s"],
    ["plan", "--params", "1B", "--ranks", "8", "--link", "nvlink4"]])
@pytest.mark.parametrize("option", ["--call", "--rail-call"])
def test_engine_costs_are_predicts_alone(command: list[str], option: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """simulate and plan count schedules on links: an engine's per-call costs are not
    theirs to take, and they refuse them rather than ignore them."""
    with pytest.raises(SystemExit) as e:
        main([*command, option, "1ms"])
    assert e.value.code == 2
    assert f"unrecognized arguments: {option} 1ms" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [
    ["all_reduce", "--bytes", "1MB", "--ranks", "4", "--link", "nvlink4"],
    ["broadcast", "--bytes", "1MB", "--nodes", "2", "--gpus-per-node", "2", "--intra",
     "4GB/s", "--inter", "1GB/s"]])
def test_a_rail_call_needs_a_two_level_all_reduce(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", *argv, "--rail-call", "1ms"]) == 2
    assert "--rail-call is for all_reduce on two levels" in capsys.readouterr().err


@pytest.mark.parametrize("argv,match", [
    (["--bytes", "14G", "--ranks", "8", "--link", "nvlink4"], "'14G' is not a size"),
    (["--bytes", "1GB", "--ranks", "8", "--link", "nvlink9"], "unknown link 'nvlink9'"),
    (["--bytes", "1GB", "--ranks", "8", "--bandwidth", "25GB"], "is not a bandwidth"),
    (["--bytes", "1GB", "--link", "dgx_h100", "--nodes", "2", "--ranks", "8"], "disagrees"),
    (["--bytes", "1GB", "--ranks", "8", "--link", "nvlink4", "--bandwidth", "1GB/s"],
     "give one of --link, --bandwidth"),
    (["--bytes", "1GB", "--ranks", "8", "--link", "nvlink4", "--dtype", "float128"],
     "unknown dtype"),
    (["--bytes", "1GB", "--link", "nvlink4"], "give --ranks"),
    (["--bytes", "1GB", "--link", "nvlink4", "--nodes", "2", "--gpus-per-node", "8"],
     "--nodes > 1 needs a link between nodes"),
    # --latency's own value, named as --latency (was "--bandwidth latency '-1us'")
    (["--bytes", "1MB", "--ranks", "4", "--bandwidth", "5GB/s", "--latency=-1us"],
     "ringlet predict: --latency '-1us' is negative; a time is >= 0"),
    (["--bytes", "1MB", "--ranks", "4", "--bandwidth", "5GB/s", "--latency", "fast"],
     "--latency 'fast' is not a time"),
    # a root where there is none was ignored; ringlet show's rule
    (["--bytes", "1MB", "--ranks", "4", "--root", "2"],
     "--root 2: all_reduce has no root; only broadcast, gather, reduce, scatter (and "
     "gather_v, scatter_v) do"),
    (["--bytes", "1MB", "--ranks", "4", "--bandwidth", "5GB/s,1us", "--latency", "2us"],
     "--bandwidth '5GB/s,1us' gives a latency, and so does --latency '2us': give it once"),
])
def test_errors(capsys: pytest.CaptureFixture[str], argv: list[str], match: str) -> None:
    assert main(["predict", "all_reduce", *argv]) == 2
    assert match in capsys.readouterr().err


@pytest.mark.parametrize("collective", ["gather_v", "scatter_v"])
def test_an_uneven_rooted_collective_takes_a_root(collective: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", collective, "--bytes", "1MB", "--ranks", "4", "--link", "nvlink4",
                 "--root", "1"]) == 0, capsys.readouterr().err


def test_help_documents_units(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["predict", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for phrase in ("14GB (10^9)", "1.5GiB (2^30)", "PER DIRECTION", "400Gb/s",
                   "e.g. 5us", "--gpus-per-node", "--json", "--rails", "nccl-tests' size"):
        assert phrase in text, phrase


def test_a_first_answer_does_not_run_away(capsys: pytest.CaptureFixture[str]) -> None:
    # a guard against a piece search that runs for minutes, not a speed target (a first
    # answer takes about 0.1 s; speed is the benchmarks' business, and CI's machine is
    # loaded): nothing counted yet, the full cost of a first answer
    model.estimator.cache_clear()
    t0 = time.perf_counter()
    assert main([*H100, "--dtype", "bf16"]) == 0
    assert time.perf_counter() - t0 < 10.0
    capsys.readouterr()


def test_local_profile_from_a_file(capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:
    from ringlet.cost.model import Link, Profile

    path = f"{tmp_path}/p.json"
    Profile(Link(1e-5, 1 / 5e9, 1 / 10e9, "calibrated"), name="here", source="test").save(path)
    assert main(["predict", "all_reduce", "--bytes", "1MB", "--ranks", "2", "--profile", path,
                 "--algorithm", "ring", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    # 2 rounds of 0.5 MB, each reduced once (gamma) in the reduce-scatter round
    assert row["seconds"] == pytest.approx(2 * 1e-5 + 1e6 / 5e9 + 0.5e6 / 10e9)
    assert main(["predict", "all_reduce", "--bytes", "1MB", "--ranks", "2", "--profile",
                 f"{tmp_path}/missing.json"]) == 2
    assert "no profile at" in capsys.readouterr().err


def test_overhead_option_sets_every_links_per_message_cost(
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["predict", "all_reduce", "--bytes", "64KB", "--link", "dgx_h100", "--nodes", "4",
            "--algorithm", "direct", "--json"]
    assert main(argv) == 0
    default = json.loads(capsys.readouterr().out)[0]
    assert main([*argv, "--overhead", "0"]) == 0
    off = json.loads(capsys.readouterr().out)[0]
    assert main([*argv, "--overhead", "3us"]) == 0
    three = json.loads(capsys.readouterr().out)[0]
    assert off["overhead_seconds"] == 0
    # 2 rounds, 24 of a rank's 31 peers on other nodes: 1 us each by default (NCCL's)
    assert default["overhead_seconds"] == pytest.approx(2 * 24 * 1e-6)
    assert three["overhead_seconds"] == pytest.approx(2 * 24 * 3e-6)
    assert main(argv[:-1] + ["--overhead", "0"]) == 0
    assert "per-message overhead 0 s on every link (--overhead)" in capsys.readouterr().out


def test_an_uneven_form_is_its_even_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "all_to_all_v", "--bytes", "1MB", "--ranks", "8",
                 "--link", "nvlink4"]) == 0
    out = capsys.readouterr().out
    assert "pairwise" in out and "bruck" not in out
    assert "all_to_all_v: the all_to_all schedule with equal blocks" in out
    assert main(["predict", "all_to_all_v", "--bytes", "1MB", "--ranks", "8",
                 "--link", "nvlink4", "--algorithm", "bruck"]) == 2
    assert "bruck: not an algorithm of all_to_all_v" in capsys.readouterr().err


def test_the_reference_never_wins_a_tie(capsys: pytest.CaptureFixture[str]) -> None:
    """naive (the tests' oracle) ties with oneshot, the same schedule under the name the
    tuner runs: predict names oneshot fastest, in the table and in the crossovers."""
    assert main(["predict", "all_reduce", "--bytes", "100KB", "--ranks", "8", "--link",
                 "nvlink4"]) == 0
    out = capsys.readouterr().out
    assert "fastest: oneshot" in out and "naive below" not in out and "oneshot below" in out


# --- extremes (a review's findings) -----------------------------------------------------------

LINK = ["--bandwidth", "25GB/s", "--latency", "5us"]


@pytest.mark.parametrize("argv, want", [
    # more pieces than elements: 100,000,000 rounds for 4 bytes, predicted at 8.33 min
    (["predict", "all_reduce", "--ranks", "8", "--bytes", "4", *LINK, "--algorithm",
      "double_binary_tree", "--param", "pieces=100000000"],
     "100,000,000 pieces of 1 element leave pieces empty; at most 1 here"),
    (["simulate", "all_reduce", "--ranks", "8", "--bytes", "4", *LINK, "--algorithm",
      "double_binary_tree", "--param", "pieces=100000000"],
     "100,000,000 pieces of 1 element leave pieces empty"),
    # a float no longer holds every whole byte count
    (["predict", "all_reduce", "--ranks", "8", "--bytes", "1e30", *LINK],
     "is more than 2^53 bytes (9 PB)"),
    # infinity: `inf h` and numpy's warnings, null in JSON
    (["simulate", "all_reduce", "--bytes", "64MB", "--link", "dgx_h100", "--nodes", "4",
      "--nodes-per-leaf", "2", "--oversubscription", "inf"], "got inf"),
    # a bucket of a byte was costed as one whole fp16 element: twice the bytes
    (["plan", "--params", "7e9", "--ranks", "8", "--link", "nvlink4", "--bucket", "1"],
     "--bucket 1 B holds no whole fp16 element (2 B)"),
    # 14 million buckets simulated one by one: no end
    (["plan", "--params", "7e9", "--ranks", "32", "--link", "nvlink4", "--compute-ms", "200",
      "--simulate", "--bucket", "1KB"], "make 14,000,000 of them a step"),
    # alpha x rounds overflowed: every algorithm but oneshot 'inf h', exit 0
    (["predict", "all_reduce", "--ranks", "8", "--bytes", "1MB", "--bandwidth", "1GB/s",
      "--latency", "1e308"], "--latency '1e308' is more than a week"),
    (["predict", "all_reduce", "--ranks", "8", "--bytes", "1MB", *LINK, "--overhead", "1e308"],
     "--overhead '1e308' is more than a week"),
    (["predict", "all_reduce", "--ranks", "8", "--bytes", "1MB", *LINK, "--call", "1e308"],
     "--call '1e308' is more than a week"),
    # beta x bytes overflowed
    (["predict", "all_reduce", "--ranks", "8", "--bytes", "9PB", "--bandwidth", "1e-305GB/s"],
     "--bandwidth '1e-305GB/s' is less than 1 byte/s"),
    (["simulate", "all_reduce", "--ranks", "8", "--bytes", "1MB", "--bandwidth", "1GB/s",
      "--latency", "1e308", "--algorithm", "ring"], "--latency '1e308' is more than a week"),
    (["simulate", "all_reduce", "--ranks", "8", "--bytes", "1MB", "--bandwidth", "1GB/s",
      "--gap", "1e308", "--algorithm", "ring"], "--gap '1e308' is more than a week"),
    (["plan", "--params", "7e9", "--ranks", "8", "--bandwidth", "1GB/s", "--latency", "1e308"],
     "--latency '1e308' is more than a week"),
    (["plan", "--params", "7e9", "--ranks", "8", "--bandwidth", "1GB/s", "--compute-ms", "100",
      "--simulate", "--straggler", "1:1e308"], "--straggler delay '1e308' is more than a week"),
])
def test_extremes_are_clear_errors(argv: list[str], want: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    code = main(argv)
    out = capsys.readouterr()
    assert want in out.out + out.err, (out.out, out.err)
    assert code == 2 or "not applicable" in out.out, (code, out.out)
    assert " inf " not in out.out and "nan" not in out.out, out.out


def test_absurd_values_print_no_page_of_digits(capsys: pytest.CaptureFixture[str]) -> None:
    # the largest size over the slowest link ringlet takes: 1.6e16 s
    assert main(["predict", "all_reduce", "--ranks", "8", "--bytes", "9PB",
                 "--bandwidth", "1B/s", "--algorithm", "ring"]) == 0
    out = capsys.readouterr().out
    assert "e+12 h" in out and max(map(len, out.splitlines())) < 200, out


def test_simulate_takes_whole_elements_as_predict_does(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    for cmd, done in (("predict", "predicted"), ("simulate", "simulated")):
        assert main([cmd, "all_reduce", "--ranks", "3", "--bytes", "7", *LINK]) == 0
        out = capsys.readouterr().out
        assert f"7 B is not a size all_reduce moves in whole float32 elements on 3 ranks: " \
               f"{done} at 8 B" in out and "not simulated" not in out, out


# --- the command line's own rules (a review's findings) ---------------------------------------


@pytest.mark.parametrize("argv, want", [
    (["predict", "all_reduce", "--bytes", "1MB", "--ranks", "4", "--bandwidth", "-5GB/s"],
     "--bandwidth '-5GB/s' must be > 0"),
    (["predict", "all_reduce", "--bytes", "1MB", "--ranks", "4", "--bandwidth", "5GB/s",
      "--overhead", "-1us"], "--overhead '-1us' is negative; a time is >= 0"),
    (["predict", "all_reduce", "--bytes", "-.5MB", "--ranks", "4"], "--bytes '-.5MB'"),
    (["plan", "--params", "-7e9", "--ranks", "8"], "--params '-7e9' must be"),
    (["simulate", "all_reduce", "--bytes", "1MB", "--ranks", "4", *LINK, "--gap", "-1us"],
     "--gap '-1us' is negative"),
    # a prefix argparse takes for the option (--lat: --latency) too
    (["predict", "all_reduce", "--bytes", "1MB", "--ranks", "4", "--bandwidth", "5GB/s",
      "--lat", "-1us"], "--latency '-1us' is negative"),
])
def test_a_negative_value_after_an_option_is_its_value(
        argv: list[str], want: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--option -5GB/s`` is checked as ``--option=-5GB/s`` is (argparse took the value for
    an option: "expected one argument" under the usage)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert want in err and "usage:" not in err, err


def test_negative_values_are_joined_only_to_options_that_take_one() -> None:
    from ringlet.cli import _join_negative_values, _subparser, build_parser

    predict = _subparser(build_parser("predict"), "predict")
    run = _subparser(build_parser("run"), "run")
    assert predict is not None and run is not None
    assert _join_negative_values(["--latency", "-1us", "--rails", "-1", "--", "--call", "-1"],
                                 predict) == ["--latency=-1us", "--rails", "-1", "--", "--call",
                                              "-1"]
    # ringlet run passes its program's arguments on untouched
    argv = ["-n", "2", "x.py", "--latency", "-1us"]
    assert _join_negative_values(argv, run) == argv


def test_a_root_only_where_the_collective_has_one(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "all_to_all_v", "--bytes", "1MB", "--ranks", "4", *LINK,
                 "--root", "1"]) == 2
    assert "--root 1: all_to_all_v has no root" in capsys.readouterr().err
    assert main(["simulate", "all_gather", "--bytes", "1MB", "--ranks", "4", *LINK,
                 "--root", "1"]) == 2
    assert "--root 1: all_gather has no root" in capsys.readouterr().err
    for cmd in ("predict", "simulate"):
        assert main([cmd, "gather", "--bytes", "1MB", "--ranks", "4", *LINK, "--root", "1",
                     "--json"]) == 0
        capsys.readouterr()
        assert main([cmd, "gather", "--bytes", "1MB", "--ranks", "4", *LINK, "--root",
                     "4"]) == 2
        assert "--root 4 is out of range for 4 ranks" in capsys.readouterr().err


def test_one_piece_is_singular(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", "all_reduce", "--bytes", "1KB", "--link", "dgx_h100", "--nodes",
                 "2", "--algorithm", "hierarchical_pipelined"]) == 0
    out = capsys.readouterr().out
    assert "one-level optimum on the slower link: 1 piece;" in out and "1 pieces" not in out
