"""ringlet plan: the seed's worked examples, strategy volumes against hand formulas, overlap."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ringlet.cli import main
from ringlet.cost.model import Link, Profile
from ringlet.cost.topology import preset_profile
from ringlet.errors import ArgumentError
from ringlet.plan.step import simulate_step
from ringlet.plan.strategies import (
    Costing,
    ModelShape,
    Parallelism,
    StepPlan,
    exposed_seconds,
    group_profile,
    parse_strategy,
    plan,
    stream_end,
)

pytestmark = pytest.mark.one_process   # tests/conftest.py

GB = 10**9
SEED = ["plan", "--params", "7e9", "--dtype", "fp16", "--ranks", "8", "--strategy", "ddp",
        "--textbook", "--compute-ms", "200", "--usd-per-gpu-hour", "30",
        "--steps-per-second", "1", "--json"]


def run_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict:
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


# --- seed 000's worked example ----------------------------------------------------------------


def test_seed_worked_example_nvlink(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, [*SEED, "--bandwidth", "900GB/s"])
    assert out["buffer_bytes"] == 14 * GB                  # 2 x 7e9
    assert out["bytes_per_rank"] == 28 * GB                # "2 x 14 = 28 GB"
    assert out["comm_seconds"] == pytest.approx(0.031, abs=5e-4)     # "28/900 = 31 ms"
    assert out["overhead"] == pytest.approx(0.15, abs=0.01)          # "31/200 = 15%"
    assert out["usd_per_step_comm"] == pytest.approx(2.1e-3, rel=0.03)   # "2.1 x 10^-3"
    assert out["usd_per_day_comm"] == pytest.approx(180, rel=0.01)       # "about $180/day"
    # the seed's own arithmetic, unrounded
    assert out["usd_per_step_comm"] == pytest.approx(28 / 900 * 30 / 3600 * 8)
    assert out["usd_per_day_comm"] == pytest.approx(out["usd_per_step_comm"] * 86400)
    # seed 001: DDP's default bucket, bucket_cap_mb=25 (PyTorch's MB is a MiB)
    assert out["communications"][0]["buckets"] == math.ceil(14 * GB / (25 * 2**20)) == 535


@pytest.mark.parametrize("bandwidth,seconds,overhead", [
    ("64GB/s", 0.44, 2.2),       # "28/64 = 440 ms", "440/200 = 220%"
    ("25GB/s", 1.12, 5.6),       # "28/25 = 1.12 s", "1120/200 = 560%"
    ("1.25GB/s", 22.0, None),    # "28/1.25 = 22 s"
])
def test_seed_worked_example_slower_links(capsys: pytest.CaptureFixture[str], bandwidth: str,
                                          seconds: float, overhead: float | None) -> None:
    out = run_json(capsys, [*SEED, "--bandwidth", bandwidth])
    assert out["bytes_per_rank"] == 28 * GB
    assert out["comm_seconds"] == pytest.approx(seconds, rel=0.02)
    if overhead is not None:
        assert out["overhead"] == pytest.approx(overhead, rel=0.01)


def test_seed_grammar_tutor(capsys: pytest.CaptureFixture[str]) -> None:
    # 500k parameters in fp16: a 1 MB buffer, 2 MB per worker per all-reduce; on 2 GPUs at
    # $0.70/hr total, 1 ms of communication costs 1.9e-7 per step
    out = run_json(capsys, ["plan", "--params", "500k", "--dtype", "fp16", "--ranks", "2",
                            "--textbook", "--bandwidth", "2GB/s", "--usd-per-gpu-hour", "0.35",
                            "--steps-per-second", "1", "--json"])
    assert out["buffer_bytes"] == 1_000_000
    assert out["bytes_per_rank"] == 2_000_000
    assert out["comm_seconds"] == pytest.approx(1e-3)
    assert out["usd_per_step_comm"] == pytest.approx(1.9e-7, rel=0.03)


def test_exact_model_explains_the_textbook(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--params", "7e9", "--dtype", "fp16", "--ranks", "8", "--link", "nvlink4",
            "--compute-ms", "200"]
    out = run_json(capsys, [*argv, "--json"])
    s = 14 * GB
    assert out["bytes_per_rank"] == pytest.approx(2 * 7 / 8 * s)
    # 24.5 GB at 450 GB/s x 0.824 per direction, plus one latency per round of each bucket
    # and the per-message overhead: 535 buckets of 25 MiB, each a direct all-reduce of two
    # rounds of 7 messages a rank (1.9 us + 7 x 0.4 us a round)
    assert out["communications"][0]["algorithm"] == "direct"
    latency = 535 * 2 * (1.9e-6 + 7 * 0.4e-6)
    assert out["comm_seconds"] == pytest.approx(2 * 7 / 8 * s / 370.8e9 + latency, rel=0.01)
    text = "\n".join(out["explanation"])
    assert ("the textbook divides by nvlink4's 900 GB/s, which counts both directions; "
            "per direction it is 450 GB/s: 2x slower") in text
    assert "(p-1)/p = 7/8: 0.875x" in text
    assert "of the line rate" in text and "latency:" in text and "per-message overhead" in text
    assert main(argv) == 0
    human = capsys.readouterr().out
    assert "how this differs from the textbook" in human and "2x slower" in human


def test_given_bandwidth_that_is_a_bidirectional_headline_is_flagged(
        capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, ["plan", "--params", "7e9", "--ranks", "8", "--bandwidth", "900GB/s",
                            "--json"])
    assert any("nvlink4's headline figure, which counts both directions" in n
               for n in out["notes"])
    assert out["bytes_per_rank"] == pytest.approx(2 * 7 / 8 * 14 * GB)


# --- strategy volumes against hand formulas ---------------------------------------------------

B = 100e9
EXACT = Costing(Profile(Link(0.0, 1 / B)), bucket_bytes=25 * 2**20)
SHAPE = dict(layers=8, hidden=1024, seq_len=512, micro_batch=2, microbatches=4)


def _plan(strategy: str, ranks: int, **shape: float) -> StepPlan:
    model = ModelShape(params=1e9, dtype="fp16", **{**SHAPE, **shape})  # type: ignore[arg-type]
    return plan(parse_strategy(strategy, ranks), model, EXACT, compute_seconds=1.0)


def test_ddp_volume() -> None:
    p = _plan("ddp", 8)
    s = 2e9
    assert p.bytes_per_rank == pytest.approx(2 * 7 / 8 * s)
    assert p.comm_seconds == pytest.approx(2 * 7 / 8 * s / B)


@pytest.mark.parametrize("kind", ["zero1", "zero2"])
def test_zero12_same_volume_as_ddp(kind: str) -> None:
    ddp, zero = _plan("ddp", 8), _plan(kind, 8)
    assert [c.comm.collective for c in zero.costs] == ["reduce_scatter", "all_gather"]
    assert zero.bytes_per_rank == pytest.approx(ddp.bytes_per_rank)
    assert zero.comm_seconds == pytest.approx(ddp.comm_seconds)


def test_zero3_is_one_and_a_half_ddp() -> None:
    ddp, z3 = _plan("ddp", 8), _plan("zero3", 8)
    assert sorted(c.comm.collective for c in z3.costs) == [
        "all_gather", "all_gather", "reduce_scatter"]
    assert z3.bytes_per_rank == pytest.approx(1.5 * ddp.bytes_per_rank)


def test_tensor_parallel_volume() -> None:
    t, layers, mb = 4, 8, 4
    p = _plan("tp=4,ddp", 8)
    (tp,) = [c for c in p.costs if c.comm.group == "tp"]
    act = 2 * 512 * 1024 * 2                       # micro_batch x seq x hidden x fp16
    assert tp.comm.calls == 4 * layers * mb        # 2 forward + 2 backward per layer
    assert tp.bytes_per_rank == pytest.approx(4 * layers * mb * 2 * (t - 1) / t * act)
    assert tp.comm.window == "exposed"
    # the data-parallel gradients are the tp shard: 1e9 / 4 params over 2 ranks
    (dp,) = [c for c in p.costs if c.comm.group == "dp"]
    assert dp.bytes_per_rank == pytest.approx(2 * 1 / 2 * 1e9 / 4 * 2)


def test_pipeline_volume_and_bubble() -> None:
    pp, mb = 4, 4
    p = _plan("pp=4,ddp", 8)
    (c,) = [c for c in p.costs if c.comm.group == "pp"]
    act = 2 * 512 * 1024 * 2
    assert c.comm.calls == 2 * mb
    assert c.bytes_per_rank == pytest.approx(2 * mb * act)
    assert c.seconds == pytest.approx(2 * mb * act / B)
    assert p.bubble == pytest.approx((pp - 1) / (mb + pp - 1))
    assert p.bubble_seconds == pytest.approx(1.0 * (pp - 1) / mb)


def test_expert_parallel_volume() -> None:
    e, layers, mb, k = 4, 8, 4, 2
    p = _plan("ep=4,ddp", 8, top_k=k, capacity_factor=1.25, expert_params=6e8)
    (c,) = [c for c in p.costs if c.comm.group == "ep"]
    buf = 2 * 512 * k * 1.25 * 1024 * 2            # tokens x top_k x cf x hidden x fp16
    assert c.comm.collective == "all_to_all" and c.comm.calls == 4 * layers * mb
    assert c.bytes_per_rank == pytest.approx(4 * layers * mb * (e - 1) / e * buf)
    # dense gradients over dp=8, expert gradients (sharded 4 ways) over dp/ep = 2
    grads = {c.comm.group: c.bytes_per_rank for c in p.costs if "gradient" in c.comm.what}
    assert grads["dp"] == pytest.approx(2 * 7 / 8 * 4e8 * 2)
    assert grads["dp/ep"] == pytest.approx(2 * 1 / 2 * 6e8 / 4 * 2)


def test_doubling_expert_parallelism_does_not_quadruple_the_all_to_all() -> None:
    """Seed 001: "Doubling the expert-parallelism degree quadruples the all-to-all cost."
    Not per rank: a rank sends its own tokens, all but the 1/E that stay with its own
    experts, so its bytes go from 3/4 to 7/8 of its buffer (x7/6) when E goes from 4 to 8;
    what grows with E is the number of messages (E - 1 a rank, E(E - 1) in all) and the
    job's total traffic, linearly with the ranks, the seed's own "O(batch * P)"."""
    four, eight = (_plan(f"ep={e},ddp", 8, top_k=2, capacity_factor=1.0) for e in (4, 8))
    a2a = [[c for c in p.costs if c.comm.group == "ep"][0] for p in (four, eight)]
    assert a2a[1].bytes_per_rank / a2a[0].bytes_per_rank == pytest.approx(7 / 6)
    assert a2a[1].seconds / a2a[0].seconds == pytest.approx(7 / 6)   # no latency here


def test_activation_strategies_need_the_model_shape() -> None:
    with pytest.raises(ArgumentError, match="tp moves activations: give --layers, --hidden"):
        plan(parse_strategy("tp=2", 4), ModelShape(1e9), EXACT)


# --- the strategy grammar ---------------------------------------------------------------------


@pytest.mark.parametrize("text,ranks,want", [
    ("ddp", 8, Parallelism(1, 1, 8, 1, "ddp")),
    ("zero3", 8, Parallelism(1, 1, 8, 1, "zero3")),
    ("tp=8,pp=4,ddp", 128, Parallelism(8, 4, 4, 1, "ddp")),
    ("tp=2", 8, Parallelism(2, 1, 4, 1, "ddp")),
    ("tp=2,pp", 8, Parallelism(2, 4, 1, 1, "ddp")),
    ("TP=2, ep=2, zero1", 8, Parallelism(2, 1, 4, 2, "zero1")),
    ("zero2=4,tp=2", 8, Parallelism(2, 1, 4, 1, "zero2")),
])
def test_parse_strategy(text: str, ranks: int, want: Parallelism) -> None:
    assert parse_strategy(text, ranks) == want


@pytest.mark.parametrize("text,ranks,match", [
    ("fsdp", 8, r"unknown strategy 'fsdp'"),
    ("ddp,zero1", 8, r"twice"),
    ("tp,pp", 8, r"leaves out the degree of tp and pp"),
    ("tp=3,ddp", 8, r"do(es)? not divide 8 ranks"),
    ("tp=2,pp=2,ddp=4", 8, r"= 16, but --ranks is 8"),
    ("ep=4,ddp", 6, r"ep=4 must divide the data-parallel degree 6"),
    ("tp=x", 8, r"not a whole number"),
])
def test_parse_strategy_errors(text: str, ranks: int, match: str) -> None:
    with pytest.raises(ArgumentError, match=match):
        parse_strategy(text, ranks)


# --- overlap and topology ---------------------------------------------------------------------


def test_exposed_seconds() -> None:
    # fast enough: only the last bucket shows
    assert exposed_seconds(1.0, 10, 100.0) == pytest.approx(0.1)
    # too slow: everything beyond what the window hides
    assert exposed_seconds(10.0, 10, 2.0) == pytest.approx(10 - 2 * 9 / 10)
    assert exposed_seconds(0.0, 5, 1.0) == 0.0
    assert exposed_seconds(3.0, 1, 100.0) == 3.0      # one bucket never overlaps
    # the last bucket is the remainder: that is what shows, not an equal share
    assert exposed_seconds(1.0, 10, 100.0, last=0.01) == pytest.approx(0.01)
    assert exposed_seconds(10.0, 10, 2.0, last=0.01) == pytest.approx(10 - 2 * 9 / 10)


def _kind(*runs: tuple[float, float, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    size, secs, count = zip(*runs, strict=True)
    return np.array(size, float), np.array(secs, float), np.array(count, np.int64)


def _walk(ready: list[float], secs: list[float]) -> float:
    """The stream's end by hand: buckets in ready order, each after the previous one."""
    t = 0.0
    for r, c in sorted(zip(ready, secs, strict=True)):
        t = max(t, r) + c
    return t


def test_stream_end_weighs_buckets_by_their_bytes() -> None:
    # a 199 MB bucket and a 1 MB remainder: ready at 0.995 and 1, not at 1/2 and 1
    end, total = stream_end([_kind((199.0, 0.3, 1), (1.0, 0.01, 1))])
    assert total == pytest.approx(0.31)
    assert end == pytest.approx(0.995 + 0.31)
    assert end == pytest.approx(_walk([0.995, 1.0], [0.3, 0.01]))
    # equal buckets: the closed form exposed_seconds gives
    end, total = stream_end([_kind((1.0, 0.25, 10))])
    assert end - 1 == pytest.approx(exposed_seconds(2.5, 10, 1.0))
    # parameters (reversed): the first bucket is needed at the start and never hides
    end, _ = stream_end([_kind((199.0, 0.3, 1), (1.0, 0.01, 1))], [True])
    assert end == pytest.approx(_walk([1 - 199 / 200, 1.0], [0.01, 0.3]))


def test_stream_end_in_groups_is_within_a_group_of_the_exact_walk(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kinds = [_kind((3.0, 2e-4, 5000), (1.0, 5e-5, 1)), _kind((7.0, 3e-4, 2999))]
    exact = stream_end(kinds)
    ready = [3 * (k + 1) / 15001 for k in range(5000)] + [1.0]
    ready += [(k + 1) / 2999 for k in range(2999)]
    secs = [2e-4] * 5000 + [5e-5] + [3e-4] * 2999
    assert exact[0] == pytest.approx(_walk(ready, secs), rel=1e-12)
    monkeypatch.setattr("ringlet.plan.strategies._WALK", 64)
    grouped = stream_end(kinds)
    assert grouped[1] == pytest.approx(exact[1], rel=1e-12)       # every bucket's seconds
    # a group is ready with its last bucket: later, never earlier, by its span of the pass
    span = max((-(-5000 // 32) - 1) * 3 / 15001, (-(-2999 // 32) - 1) / 2999)
    assert exact[0] <= grouped[0] <= exact[0] + span
    assert grouped[0] > exact[0]


@pytest.mark.parametrize("strategy", ["ddp", "zero1", "zero3"])
@pytest.mark.parametrize("params,bucket", [(4e8, 25 * 2**20), (1e8, 199e6), (1.5e7, 25 * 2**20)])
@pytest.mark.parametrize("compute", [0.001, 0.02, 0.3])
def test_the_plans_exposed_time_is_the_simulated_steps(strategy: str, params: float,
                                                      bucket: float, compute: float) -> None:
    """The formula walks the buckets as the simulation runs them (no noise, no
    straggler): the same exposed time; ZeRO-3's backward pass mixes parameters and
    gradients on one stream, which the formula only approximates."""
    how = Costing(preset_profile("dgx_h100"), bucket_bytes=bucket)
    par, model = parse_strategy(strategy, 32), ModelShape(params, "fp16")
    formula = plan(par, model, how, compute_seconds=compute).exposed_seconds
    simulated = simulate_step(par, model, how, compute_seconds=compute).exposed_seconds
    assert formula == pytest.approx(simulated, rel=1e-2 if strategy == "zero3" else 1e-9)


def test_a_big_bucket_ready_late_is_exposed() -> None:
    """--bucket 199MB of a 200 MB gradient: the big bucket is ready at 99.5 % of the
    backward pass, so nearly all of it shows (the formula took it as ready half-way and
    said only the 1 MB remainder showed)."""
    how = Costing(preset_profile("dgx_h100"), bucket_bytes=199e6)
    p = plan(parse_strategy("ddp", 32), ModelShape(1e8, "fp16"), how, compute_seconds=0.3)
    (c,) = p.costs
    (big, first, _), (rest, last, _) = c.parts
    assert (big, rest) == (199e6, pytest.approx(1e6))
    assert p.exposed_seconds == pytest.approx(first + last - 0.005 * 0.2)
    assert p.exposed_seconds > 5 * last


def test_group_profiles_on_two_levels() -> None:
    dgx = preset_profile("dgx_h100")
    assert group_profile(dgx, 1, 8).inter is None                   # tp=8 inside a node
    assert group_profile(dgx, 1, 8).intra == dgx.intra
    across = group_profile(dgx, 8, 4)                               # one per node
    assert across.inter is None and across.intra == dgx.inter
    mixed = group_profile(dgx, 2, 16)                               # 4 per node
    assert (mixed.gpus_per_node, mixed.inter) == (4, dgx.inter)


def test_plan_on_a_cluster_uses_each_groups_links(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, ["plan", "--params", "70e9", "--ranks", "64", "--strategy",
                            "tp=8,pp=2,zero1", "--link", "dgx_h100", "--layers", "80",
                            "--hidden", "8192", "--seq-len", "4096", "--micro-batch", "1",
                            "--microbatches", "8", "--compute-ms", "3000", "--json"])
    comms = {c["group"]: c for c in out["communications"]}
    assert comms["tp"]["seconds"] < comms["dp"]["seconds"] * 100   # NVLink for tp
    assert out["bubble"] == pytest.approx(1 / 9)
    assert out["exposed_seconds"] <= out["comm_seconds"]
    for key in ("bytes_per_rank", "comm_seconds", "overhead", "usd_per_step_comm",
                "usd_per_day_comm"):
        assert key in out


def test_plan_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--params", "1e9", "--ranks", "8", "--strategy", "tp=2",
                 "--bandwidth", "10GB/s"]) == 2
    assert "give --layers" in capsys.readouterr().err


# --- checks on the inputs and the review's findings ---------------------------------------------


@pytest.mark.parametrize("argv, msg", [
    (["--compute-ms", "nan"], "--compute-ms must be a finite number of milliseconds > 0, "
                              "got nan"),
    (["--compute-ms", "inf"], "--compute-ms must be a finite number of milliseconds > 0, "
                              "got inf"),
    # it said "compute time must be ... > 0, got -0.005": no flag, and in seconds
    (["--compute-ms", "-5"], "--compute-ms must be a finite number of milliseconds > 0, got -5"),
    (["--compute-ms", "0"], "--compute-ms must be a finite number of milliseconds > 0, got 0"),
    (["--backward-fraction", "2"], "--backward-fraction must be between 0 and 1 (a share of the "
                                   "compute), got 2"),
    (["--backward-fraction", "nan", "--simulate"], "--backward-fraction must be between 0"),
    (["--usd-per-gpu-hour", "nan"], "--usd-per-gpu-hour must be a finite number >= 0"),
    (["--usd-per-gpu-hour", "inf"], "--usd-per-gpu-hour must be a finite number >= 0"),
    (["--steps-per-second", "inf"], "--steps-per-second must be a finite number > 0"),
    # finite, but the money overflowed: '$inf per step', '$inf per day'
    (["--usd-per-gpu-hour", "1e308", "--compute-ms", "100"],
     "--usd-per-gpu-hour 1e+308 makes the communication's cost more dollars than a float "
     "holds"),
    (["--usd-per-gpu-hour", "30", "--steps-per-second", "1e308"],
     "--usd-per-gpu-hour 30 at --steps-per-second 1e+308 makes"),
    (["--layers", "-3"], "--layers must be >= 0, got -3"),
    (["--top-k", "0"], "--top-k must be >= 1, got 0"),
    (["--capacity-factor", "nan"], "--capacity-factor must be a finite number > 0"),
    (["--layers", "4", "--moe-layers", "9"], "--moe-layers 9 exceeds --layers 4"),
    (["--microbatches", "0"], "--microbatches must be >= 1, got 0"),
    (["--params=-5"], "--params '-5' must be a finite number > 0"),   # it said >= 0
    (["--bucket=-1"], "--bucket '-1' must be at least 1 byte"),   # it said >= 0 bytes
    (["--bucket", "0"], "--bucket '0' must be at least 1 byte"),
    # the textbook counts no schedule: --algorithm was ignored
    (["--textbook", "--algorithm", "ring"], "--algorithm ring: --textbook counts no algorithm"),
])
def test_plan_refuses_inputs_that_are_not_numbers_it_can_use(
        capsys: pytest.CaptureFixture[str], argv: list[str], msg: str) -> None:
    """nan and inf used to pass (every check was 'x <= 0') and come out as bare NaN and
    Infinity in the JSON; shapes that cannot be were taken."""
    assert main(["plan", "--params", "7e9", "--ranks", "8", "--link", "nvlink4", *argv]) == 2
    assert msg in capsys.readouterr().err


def test_absurd_prices_print_no_page_of_digits(capsys: pytest.CaptureFixture[str]) -> None:
    # $1.58e+304 a step was printed with every one of its 305 digits
    assert main(["plan", "--params", "7e9", "--ranks", "8", "--link", "nvlink4",
                 "--usd-per-gpu-hour", "1e300"]) == 0
    out = capsys.readouterr().out
    assert "e+296 per step" in out and max(map(len, out.splitlines())) < 400, out


def test_gradients_per_rank_count_the_experts_sharded_ep_ways(
        capsys: pytest.CaptureFixture[str]) -> None:
    """With ep=4 a rank holds a quarter of the expert parameters: 1e9 dense + 8e9 / 4
    experts, fp16, is 6 GB of gradients per rank (it said 18 GB, as if unsharded)."""
    out = run_json(capsys, ["plan", "--params", "9e9", "--expert-params", "8e9", "--ranks",
                            "8", "--strategy", "ep=4,ddp", "--link", "nvlink4", "--layers",
                            "4", "--hidden", "64", "--seq-len", "16", "--micro-batch", "1",
                            "--json"])
    assert out["buffer_bytes"] == pytest.approx(2 * (1e9 + 8e9 / 4))
    sizes = {c["what"]: c["nbytes"] for c in out["communications"]}
    assert sizes["gradient all-reduce"] + sizes["gradient all-reduce (experts)"] == \
        pytest.approx(out["buffer_bytes"])


def test_the_textbook_divides_a_group_across_nodes_by_the_link_between_them(
        capsys: pytest.CaptureFixture[str]) -> None:
    """tp=8 inside a DGX node is on NVLink (900 GB/s); the data-parallel group, one GPU
    per node, and a group with several GPUs on each of several nodes are limited by the
    node's NIC (50 GB/s)."""
    def textbook_seconds(strategy: str, ranks: int) -> dict[str, float]:
        out = run_json(capsys, ["plan", "--params", "8e9", "--ranks", str(ranks),
                                "--strategy", strategy, "--link", "dgx_h100", "--layers", "8",
                                "--hidden", "1024", "--seq-len", "1024", "--micro-batch", "1",
                                "--json"])
        return {c["group"]: c["textbook_seconds"] / (c["nbytes"] * c["calls"])
                for c in out["communications"] if c["collective"] == "all_reduce"}
    per_byte = textbook_seconds("tp=8,ddp", 16)
    assert per_byte["tp"] == pytest.approx(2 / 900e9)
    assert per_byte["dp"] == pytest.approx(2 / 50e9)
    assert textbook_seconds("tp=2,ddp", 32)["dp"] == pytest.approx(2 / 50e9)  # 4 per node
    assert textbook_seconds("tp=2,ddp", 8)["dp"] == pytest.approx(2 / 900e9)  # one node


@pytest.mark.parametrize("rate, said", [("1", "at 1 step/s:"), ("2", "at 2 steps/s:"),
                                        ("0.5", "at 0.5 steps/s:")])
def test_steps_per_second_is_said_in_the_right_number(
        rate: str, said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*SEED[:-2], rate, "--bandwidth", "900GB/s"]) == 0
    out = capsys.readouterr().out
    assert said in out and "1 steps" not in out, out
