"""``ringlet show`` and ``ringlet verify``: the drawings read the executor's schedules.

Pure tests: no processes; the PNG test needs matplotlib and is skipped without it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from ringlet import cli, show
from ringlet.algorithms import algorithms, build, entry
from ringlet.errors import ArgumentError
from ringlet.schedule import (
    COLLECTIVES,
    ROOTED,
    Buf,
    Kind,
    Schedule,
    Step,
    local_reduce,
    recv_reduce,
)
from ringlet.show import parse_params, parse_ranks, ranks_text, render, trace

pytestmark = pytest.mark.one_process   # tests/conftest.py


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    got = capsys.readouterr()
    return code, got.out, got.err


def rounds(text: str) -> list[list[str]]:
    """The lines of each ``round k`` block of a drawing."""
    blocks: list[list[str]] = []
    for line in text.splitlines():
        if line.startswith("round "):
            blocks.append([line])
        elif blocks and line.startswith("  "):
            blocks[-1].append(line)
        elif blocks and blocks[-1][-1] != "":
            blocks[-1].append("")
    return [[ln for ln in b if ln] for b in blocks]


def rank_rows(block: list[str]) -> dict[int, list[str]]:
    """rank -> the cells of its row in a round block (first column group)."""
    rows: dict[int, list[str]] = {}
    for line in block[2:]:
        m = re.match(r"^  (\d+) ", line)
        if m and "|" in line:
            rows.setdefault(int(m.group(1)), line.split("|", 1)[1].split())
    return rows


# --- ringlet show ----------------------------------------------------------------------


def test_ring_all_reduce_on_four_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", "all_reduce", "--algo", "ring", "-n", "4",
                       "--width", "120")
    assert code == 0
    head = out.splitlines()[:3]
    assert head[0].startswith("all_reduce / ring (pieces=1) on N=4: 6 rounds; OUT in 4 chunks")
    assert "alpha: 6 rounds with messages" in head[1]
    # 2 (p-1)/p = 1.5 of the vector, at m = 2^20 float32 elements
    assert "each rank sends 1.5 m = 6.29 MB" in head[1]
    assert "gamma: reduces 0.75 m" in head[1]

    blocks = rounds(out)
    assert [b[0].split(":")[0] for b in blocks] == [f"round {i}" for i in range(6)]
    # round 0: rank 0 sends chunk 0 to rank 1 and reduces chunk 3 from rank 3 into its own
    assert re.search(r"^  0\s+c0->1\s+c3\+<-3\s+\| a\s+a\s+a\s+ad$", "\n".join(blocks[0]),
                     re.M)
    assert blocks[0][0] == "round 0: 4 messages (4 reduced)"
    assert blocks[3][0] == "round 3: 4 messages"
    # after the reduce-scatter, rank r holds chunk (r+1) % 4 complete
    after_rs = rank_rows(blocks[2])
    for r in range(4):
        assert after_rs[r][(r + 1) % 4] == "A-D"
        assert sum(c == "A-D" for c in after_rs[r]) == 1
    final = rank_rows(blocks[-1])
    assert final == {r: ["A-D"] * 4 for r in range(4)}
    assert out.rstrip().endswith("every rank holds what the all_reduce spec requires "
                                 "(checked by ringlet.verify)")


def test_the_list_of_algorithms_gives_whole_sentences() -> None:
    """`ringlet show COLLECTIVE` lists each algorithm with its docstring's first sentence
    (its first line stopped mid-phrase: "... across groups on"), cut at a word with '...'
    when long, with no ``markup``."""
    for collective in show.COLLECTIVES:
        for name in algorithms(collective):
            doc = entry(collective, name).doc
            assert doc.endswith((".", "...")) and "``" not in doc, (collective, name, doc)
            assert len(doc) <= 100
    assert entry("reduce_scatter", "pairwise").doc.endswith("reduces block r from r-k.")


def test_drawing_reads_the_schedule_the_executor_runs() -> None:
    s = build("all_reduce", "ring", 5)
    tr = trace(s)
    assert tr.error is None and len(tr.after) == s.nrounds
    for i, msgs in enumerate(tr.messages):
        sends = [(r, st.peer, st.src) for r in range(5) for st in s.steps(r)[i]
                 if st.kind is Kind.SEND]
        assert [(m.src, m.dst, m.refs) for m in msgs] == sends
        assert all(m.reduce == (i < 4) for m in msgs)   # reduce-scatter, then all-gather


def test_double_binary_tree_on_eight_ranks_stays_readable(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", "all_reduce", "--algo", "double_binary_tree", "-n", "8",
                       "--width", "120")
    assert code == 0
    lines = out.splitlines()
    assert max(len(ln) for ln in lines) <= 120
    assert "(pieces=4) on N=8: 9 rounds" in lines[0]
    blocks = rounds(out)
    assert len(blocks) == 9
    assert rank_rows(blocks[-1]) == {r: ["A-H"] * 8 for r in range(8)}


def test_narrow_width_wraps_columns() -> None:
    text = render(trace(build("all_reduce", "ring", 6, pieces=3)), width=80)
    assert max(len(ln) for ln in text.splitlines()) <= 80
    assert re.search(r"^  rank  \| c\d+", text, re.M)   # a continuation group of columns


def test_steps_columns_narrow_to_fit_the_width() -> None:
    # all_reduce direct sends 4 items a round on 5 ranks: at 28 columns each the steps
    # columns alone took 68 of 60, though no single item is longer than 12
    for width in (60, 80):
        text = render(trace(build("all_reduce", "direct", 5)), width=width)
        assert max(len(ln) for ln in text.splitlines()) <= width, width
        assert re.search(r"^  0     c1->1 c2->2 .*\| A-E", text, re.M)
        if width == 60:
            assert re.search(r"^        c4->4 ", text, re.M)   # a send wrapped, not dropped


def test_a_legend_clause_longer_than_the_width_wraps() -> None:
    # the "3:ab = chunk 3 of the vector, ..." clause is 73 characters: at --width 60 it
    # ran to column 81
    text = render(trace(build("all_reduce", "naive", 3)), width=60)
    assert max(len(ln) for ln in text.splitlines()) <= 60
    assert "        3:ab = chunk 3 of the vector, held in TMP or in\n" \
           "          another slot than its own\n" in text


def _cases() -> list[tuple[str, str, int, int]]:
    out = []
    for c in COLLECTIVES:
        for a in algorithms(c):
            for n in range(1, 7):
                for root in sorted({0, n - 1}) if c in ROOTED else [0]:
                    out.append((c, a, n, root))
    return out


def test_every_algorithm_renders_at_small_sizes() -> None:
    for c, a, n, root in _cases():
        params = {"pieces": 2} if "pieces" in entry(c, a).params and n % 2 else {}
        tr = trace(build(c, a, n, root, **params))
        assert tr.error is None, (c, a, n, root)
        text = render(tr, width=120)
        assert max(len(ln) for ln in text.splitlines()) <= 120, (c, a, n, root)
        assert len(rounds(text)) == tr.schedule.nrounds
        assert text.rstrip().endswith("(checked by ringlet.verify)")


@pytest.mark.parametrize(("collective", "algo", "final"), [
    ("all_gather", "ring", ["A", "B", "C", "D"]),
    ("all_to_all", "pairwise", ["A1", "B1", "C1", "D1"]),   # rank 1's row
    ("scatter", "binomial", ["A1"]),
])
def test_data_collectives_name_their_blocks(collective: str, algo: str,
                                            final: list[str]) -> None:
    text = render(trace(build(collective, algo, 4)))
    assert rank_rows(rounds(text)[-1])[1][:len(final)] == final


def test_notation() -> None:
    assert ranks_text(0b1011) == "abd"
    assert ranks_text(0b1110111) == "a-ce-g"
    assert ranks_text(0b11) == "ab"


def test_show_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", "scan")   # without --algo: the list, as --help says
    assert code == 0 and out.startswith("scan: 2 algorithms (draw one: ringlet show scan "
                                        "--algo NAME -n N)\n  linear ")
    code, out, _ = run(capsys, "show", "gather_v")
    assert code == 0 and out.startswith("gather_v: ") and "binomial" in out
    for png, msg in (("out.txt", "give a file name ending in .png"),
                     ("/tmp", "is a directory")):   # it wrote /tmp.png and said "wrote /tmp"
        code, out, err = run(capsys, "show", "all_reduce", "--algo", "ring", "--png", png)
        assert code == 2 and msg in err and out == "", err
    code, _, err = run(capsys, "show", "all_reduce", "--algo", "hierarchical_pipelined",
                       "--pieces", "1000")   # ran for minutes
    assert code == 2 and "pieces=1000: at most 64" in err
    # pieces within the cap, but too much to draw with these ranks (78 s and 72 MB of text)
    code, out, err = run(capsys, "show", "all_reduce", "--algo", "ring", "-n", "26",
                         "--pieces", "16")
    assert code == 2 and out == "" and "8,652,800 cells to draw, more than 600,000" in err
    code, out, _ = run(capsys, "show", "all_reduce", "--algo", "ring", "-n", "26")
    assert code == 0 and out   # the largest default diagram still draws
    # and too much to verify (it took minutes and gigabytes): refused before any runs
    code, out, err = run(capsys, "verify", "all_gather", "--algo", "ring", "--ranks", "4,256",
                         "--pieces", "64")
    assert code == 2 and out == "" and "4,194,304 chunks of state" in err
    code, _, err = run(capsys, "verify", "all_reduce", "--algo", "ring", "--param", "foo=1")
    assert code == 2 and "all_reduce/ring takes no parameter(s) ['foo']" in err
    code, _, err = run(capsys, "verify", "all_reduce", "--root", "1")
    assert code == 2 and "all_reduce has no root" in err
    code, _, err = run(capsys, "show", "all_reduce", "--algo", "ring", "-n", "27")
    assert code == 2 and "draws 1 to 26 ranks" in err
    code, _, err = run(capsys, "show", "all_reduce", "--algo", "ring", "--root", "1")
    assert code == 2 and "all_reduce has no root" in err
    code, _, err = run(capsys, "show", "allreduce", "--algo", "ring")
    assert code == 2 and "unknown collective 'allreduce'" in err
    code, _, err = run(capsys, "show", "broadcast", "--algo", "binomial", "--pieces", "2")
    assert code == 2 and "takes no parameter(s) ['pieces']" in err
    with pytest.raises(ArgumentError, match=r"--param 'group': write NAME=INTEGER"):
        parse_params(["group"])
    with pytest.raises(ArgumentError, match=r"--pieces 2 and --param pieces=3 disagree"):
        parse_params(["pieces=3"], 2)


def test_png(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "ring.png"
    code, out, _ = run(capsys, "show", "all_reduce", "--algo", "ring", "-n", "4",
                       "--png", str(path))
    assert code == 0 and out.rstrip().endswith(f"wrote {path}")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


def test_png_without_matplotlib(capsys: pytest.CaptureFixture[str],
                                monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = run(capsys, "show", "all_reduce", "--algo", "ring", "-n", "4",
                         "--png", f"{tmp_path}/x.png")
    assert code == 2 and out == ""
    assert "--png needs matplotlib, which is not installed: pip install 'ringlet[plot]'" in err


# --- ringlet verify ----------------------------------------------------------------------


def test_verify_all(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "verify", "all", "--ranks", "1-8")
    assert code == 0 and err == ""
    lines = out.splitlines()
    n = sum(len(algorithms(c)) for c in COLLECTIVES)
    assert len(lines) == 1 + n + 1
    assert all(ln.endswith("ok") and " 1-8 " in ln for ln in lines[1:-1])
    assert re.match(rf"{n} algorithms, {8 * n} world sizes verified, 0 failed", lines[-1])


def test_verify_one_algorithm_with_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "verify", "all_reduce", "--algo", "hierarchical", "--ranks",
                       "1-6,9", "--param", "group=3")
    assert code == 0
    assert re.search(r"hierarchical\s+group=3,pieces=1\s+3,6,9\s+3 .* ok, 4 sizes n/a", out)
    assert "n/a: all_reduce/hierarchical at N=1-2,4-5: " in out
    code, out, _ = run(capsys, "verify", "all", "--algo", "ring", "--ranks", "5", "--pieces",
                       "2", "--root", "all")
    assert code == 0
    assert [ln.split()[:3] for ln in out.splitlines()[1:-1]] == [
        ["all_reduce", "ring", "pieces=2"], ["all_gather", "ring", "pieces=2"],
        ["reduce_scatter", "ring", "pieces=2"]]


def test_verify_of_nothing_fails_and_says_why_at_every_size(
        capsys: pytest.CaptureFixture[str]) -> None:
    """No size verified is not a success; the sizes skipped for one reason share a line."""
    code, out, err = run(capsys, "verify", "all_reduce", "--algo", "hierarchical", "--param",
                         "group=5", "--ranks", "1-4")
    assert code == 1 and "nothing was verified" in err
    assert out.splitlines()[-1] == ("n/a: all_reduce/hierarchical at N=1-4: hierarchical "
                                    "all_reduce: group=5 does not divide N ranks into equal "
                                    "groups")
    code, out, _ = run(capsys, "verify", "all_reduce", "--algo", "hierarchical", "--param",
                       "group=5", "--ranks", "1-12")
    assert code == 0 and out.count("n/a:") == 1 and "at N=1-4,6-9,11-12: " in out


def test_verify_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "verify", "all", "--algo", "nope")
    assert code == 2 and "no collective has an algorithm 'nope'" in err
    code, _, err = run(capsys, "verify", "broadcast", "--algo", "ring")
    assert code == 2 and "unknown algorithm 'ring' for broadcast" in err
    code, _, err = run(capsys, "verify", "scatter", "--param", "group=2")
    assert code == 2 and "no selected algorithm takes parameter(s) ['group']" in err
    for argv, msg in ((["all_reduce", "--algo", "ring", "--pieces", "0"],
                       "--pieces: pieces must be >= 1, got 0"),
                      (["all_reduce", "--param", "group=-1"],
                       "--param group: group must be >= 0, got -1"),
                      (["broadcast", "--root", "9", "--ranks", "1-4"],
                       "--root 9 is out of range at every size given"),
                      (["all_reduce", "--ranks", "1-100000000"], "at most 1,024 ranks")):
        code, out, err = run(capsys, "verify", *argv)
        assert code == 2 and msg in err and out == "", (argv, err)
    assert parse_ranks("1-3,8,2") == [1, 2, 3, 8]
    for bad in ("0-4", "5-2", "x", "1-"):
        with pytest.raises(ArgumentError, match=r"--ranks"):
            parse_ranks(bad)


def _broken_build(collective: str, name: str, nranks: int, root: int = 0,
                  **params: int) -> Schedule:
    """The ring all-reduce with rank 2's receive of round 2 dropped (from N = 4 on)."""
    good = build(collective, name, nranks, root, **params)
    if nranks < 4:
        return good
    table: dict[int, list[list[Step]]] = {r: [list(x) for x in good.steps(r)]
                                          for r in range(nranks)}
    table[2][2] = [st for st in table[2][2] if st.kind is not Kind.RRED]
    return Schedule(collective, "broken", nranks, good.nrounds, dict(good.layouts),
                    lambda r: table[r])


def test_verify_fails_on_a_broken_schedule(capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(show, "build", _broken_build)
    code, out, err = run(capsys, "verify", "all_reduce", "--algo", "ring", "--ranks", "1-6")
    assert code == 1
    assert re.search(r"all_reduce\s+ring\s+pieces=1\s+1-3\s+3 .* FAIL at N=4$", out, re.M)
    assert "1 failed" in out
    assert re.search(r"FAILED all_reduce/ring at N=4: all_reduce/broken\(n=4\): round 2: "
                     r"rank 1 'send OUT\[\d\] -> 2' is never received by rank 2", err)


def test_show_draws_a_broken_schedule_up_to_its_error(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(show, "build", _broken_build)
    code, out, _ = run(capsys, "show", "all_reduce", "--algo", "ring", "-n", "4")
    assert code == 1
    assert [b[0].split(":")[0] for b in rounds(out)] == ["round 0", "round 1"]
    assert re.search(r"^FAILED: all_reduce/broken\(n=4\): round 2: rank 1", out, re.M)


def test_verify_hook_sees_every_round() -> None:
    from ringlet.verify import expected_final, verify

    s = build("all_gather", "bruck", 5)
    seen: list[int] = []
    verify(s, on_round=lambda i, states: seen.append(i) if len(states) == 5 else None)
    assert seen == list(range(s.nrounds))
    tr = trace(s)
    assert all(set(st) == set(s.layouts) for states in tr.after for st in states)
    assert tr.after[-1][3][Buf.OUT] == expected_final(s, 3)[Buf.OUT]


# --- the gallery in docs/algorithms.md is the real output -----------------------------

DOCS = Path(__file__).resolve().parent.parent / "docs" / "algorithms.md"


def _gallery() -> list[tuple[list[str], str]]:
    """Each ```` ``` ```` block of the docs that starts ``$ ringlet show``: (argv, output)."""
    blocks = re.findall(r"^```\n\$ ringlet (show .*?)\n(.*?)^```$", DOCS.read_text(),
                        re.M | re.S)
    return [(cmd.split(), out) for cmd, out in blocks]


def test_docs_gallery_is_the_real_output(capsys: pytest.CaptureFixture[str]) -> None:
    gallery = _gallery()
    assert len(gallery) >= 4
    for argv, want in gallery:
        code, out, _ = run(capsys, *argv)
        assert code == 0
        assert out == want, f"docs/algorithms.md is stale for: ringlet {' '.join(argv)}"



def test_operand_order_is_drawn() -> None:
    """Recursive doubling's lower partner puts its own vector first, the higher one
    reduces as usual; a received operand put first is drawn too."""
    text = render(trace(build("all_reduce", "recursive_doubling", 4)))
    first = rounds(text)[0]
    assert "t0=c0+t0" in first[2] and first[2].startswith("  0 ")
    assert "t0+=c0" in first[3] and first[3].startswith("  1 ")
    assert "t0=c0+t0 = reduce c0 into t0, c0 the first operand" in text
    _, items = show.step_items([recv_reduce(3, (Buf.OUT, 0), src_first=True),
                                recv_reduce(2, (Buf.OUT, 1)),
                                local_reduce([(Buf.OUT, 2)], [(Buf.TMP, 0)], src_first=True)])
    assert items == ["c0=3+c0", "c1+<-2", "c2=t0+c2"]
    assert str(recv_reduce(3, (Buf.OUT, 0), src_first=True)) == \
        "recv+reduce OUT[0] <- 3, received first"


def test_show_refuses_a_vector_its_counts_cannot_hold(capsys: pytest.CaptureFixture[str]) -> None:
    """--count x --itemsize past 1 PiB wrapped int64 (negative bytes) or raised a traceback."""
    for count in ("4611686018427387904", str(10**22)):
        code, _, err = run(capsys, "show", "all_reduce", "--algo", "ring", "-n", "5",
                           "--count", count)
        assert code == 2 and "at most" in err and "Traceback" not in err
    code, out, _ = run(capsys, "show", "all_reduce", "--algo", "ring", "-n", "5",
                       "--count", str(2**50), "--itemsize", "1")
    sends = next(ln for ln in out.splitlines() if "sends" in ln)   # wrapped at 80 columns or not
    assert code == 0 and "-" not in sends.split("sends")[1].split("m")[0], out
