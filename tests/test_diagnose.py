"""Flight recorder, diagnosis and trace: ``ringlet run`` on jobs that hang or fail
(tests/scripts/hang.py, short timeouts), ``ringlet diagnose DIR``, ``ringlet run --trace``,
and the diagnosis on hand-made dumps (pure)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from jobs import clean_env

import ringlet
from ringlet.diagnose import diagnose

SCRIPTS = Path(__file__).parent / "scripts"
CLI = [sys.executable, str(SCRIPTS / "ringlet_cli.py")]


def _run(n: int, case: str, *opts: str, dumps: Path | None = None,
         timeout: str = "2") -> subprocess.CompletedProcess[str]:
    env = clean_env(RINGLET_TIMEOUT=timeout, OMP_NUM_THREADS="1")
    if dumps is not None:
        env["RINGLET_DUMP_DIR"] = str(dumps)
    return subprocess.run([*CLI, "run", "--grace", "1", *opts, "-n", str(n), "hang.py", case],
                          capture_output=True, text=True, cwd=SCRIPTS, timeout=60, env=env)


def _diagnosis(proc: subprocess.CompletedProcess[str]) -> list[str]:
    """The diagnosis lines ringlet run printed (header first), before its summary."""
    lines = proc.stderr.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("ringlet diagnosis"))
    out = [lines[start]]
    for ln in lines[start + 1:]:
        if not ln.startswith("  "):
            assert ln.startswith("ringlet run: "), proc.stderr   # the summary follows
            break
        out.append(ln.strip())
    return out


# --- the five cases, end to end ------------------------------------------------------------

def test_p2p_cycle_is_a_deadlock_and_no_rank_is_called_missing(tmp_path: Path) -> None:
    proc = _run(3, "cycle", dumps=tmp_path)
    assert proc.returncode == 1, proc.stderr
    d = _diagnosis(proc)
    assert d[1] == "deadlock: rank 0 waits to receive from 2, 2 from 1, 1 from 0; nobody sends", d
    # every rank arrived: no timeout says a source did not arrive
    assert "did not arrive" not in proc.stderr
    assert "has not sent this rank a message, though it is alive" in proc.stderr
    # the dumps stay in the user's directory, and ringlet diagnose reads them offline
    dump = json.loads((tmp_path / "rank-1.json").read_text())
    last = dump["comms"][0]["ops"][-1]
    assert (last["kind"], last["peer"], last["state"]) == ("recv", 0, "failed"), last
    assert dump["comms"][0]["ops"][0]["kind"] == "all_reduce"
    off = subprocess.run([*CLI, "diagnose", str(tmp_path)], capture_output=True, text=True,
                         timeout=30)
    assert off.returncode == 0, off.stderr
    assert "deadlock: rank 0 waits to receive from 2, 2 from 1, 1 from 0" in off.stdout
    for n in ("0", "-1", "2", "5"):   # the job had 3 ranks: never "ranks 0-4 left no record"
        bad = subprocess.run([*CLI, "diagnose", str(tmp_path), "-n", n], capture_output=True,
                             text=True, timeout=30)
        assert bad.returncode == 2 and "-n " + n in bad.stderr and not bad.stdout, bad.stderr


def test_a_cycle_inside_groups_is_named_in_each_group(tmp_path: Path) -> None:
    """The diagnosis read only the world communicator's records and said that no rank
    was waiting while each group of a split waited in a cycle."""
    proc = _run(4, "group-cycle", dumps=tmp_path)
    assert proc.returncode == 1, proc.stderr
    d = _diagnosis(proc)
    for members in ("0, 2", "1, 3"):
        assert (f"in the group of world ranks {members} (ranks here are the group's, 0-1): "
                f"deadlock: rank 0 waits to receive from 1, 1 from 0; nobody sends") in d, d
    assert not any("no rank was waiting" in ln for ln in d), d


@pytest.mark.parametrize("files, args, msg", [
    ({"rank-0.json": '{"a":'}, [], "skipped rank-0.json: not JSON"),
    ({"rank-0.json": '{"rank": 0, "comms": []}'}, [], "not a flight recorder dump"),
    ({"rank-0.json": json.dumps({"format": "ringlet-flight-recorder/1", "rank": 0, "comms": [
        {"size": 2, "ranks": [0, 1], "ops": [{"kind": "all_reduce"}]}]})}, [],
     "an operation without its kind, state, seq or peer"),
])
def test_diagnose_says_why_it_skips_a_file(tmp_path: Path, files: dict[str, str],
                                           args: list[str], msg: str) -> None:
    """A file that is not a dump was a traceback (KeyError, AttributeError) or skipped
    with 'no dumps in DIR'."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    off = subprocess.run([*CLI, "diagnose", str(tmp_path), *args], capture_output=True,
                         text=True, timeout=30)
    assert off.returncode == 1 and msg in off.stderr and "Traceback" not in off.stderr, \
        off.stderr


@pytest.mark.waits
def test_straggler_that_never_arrives_is_behind(tmp_path: Path) -> None:
    proc = _run(3, "straggler", dumps=tmp_path)
    d = _diagnosis(proc)
    assert d[1] == "rank 2 last completed all_reduce #3; ranks 0, 1 are in all_reduce #4", d
    # the straggler was asked for its records (SIGUSR1) while it slept in its own code
    dump = json.loads((tmp_path / "rank-2.json").read_text())
    assert dump["reason"].startswith("SIGUSR1"), dump["reason"]
    assert [op["state"] for op in dump["comms"][0]["ops"]] == ["done"] * 3


def test_mismatched_collectives() -> None:
    proc = _run(2, "mismatch")
    d = _diagnosis(proc)
    assert d[1] == "rank 0 is in all_reduce #4; rank 1 is in broadcast #4", d
    assert d[2].startswith("calls disagree: ranks disagree about the collective #4: "
                           "rank 0: all_reduce; rank 1: broadcast"), d


def test_dead_rank() -> None:
    proc = _run(4, "dead")
    d = _diagnosis(proc)
    assert d[0].endswith("ranks 0, 1, 2:"), d
    assert d[1] == ("rank 3 ended (killed by SIGKILL) and left no flight record while ranks "
                    "0, 1, 2 waited for it in all_reduce #4"), d


def test_missing_rank_that_ended_without_the_call() -> None:
    proc = _run(5, "missing")
    d = _diagnosis(proc)
    assert d[1] == ("rank 4 closed its communicator (its program ended) while ranks 0, 1, "
                    "2, 3 waited for it in all_reduce #4"), d


# --- trace -------------------------------------------------------------------------------------

def test_trace_of_a_3_rank_job(tmp_path: Path) -> None:
    proc = _run(3, "ok", "--trace", str(tmp_path / "tr"))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "tr" / "trace.json").read_text())
    events = doc["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    for e in spans:   # what Chrome's trace format asks of a complete event
        assert isinstance(e["name"], str) and e["ts"] > 0 and e["dur"] >= 0, e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
    got = {(e["tid"], e["args"]["seq"], e["name"]) for e in spans}
    want = {(r, s, f"{'barrier' if s == 4 else 'all_reduce'} #{s}")
            for r in range(3) for s in range(1, 5)}
    assert got == want
    ar = next(e for e in spans if e["name"] == "all_reduce #1")
    assert ar["args"]["bytes"] == 32 and ar["args"]["algorithm"] and ar["args"]["path"], ar
    assert ar["args"]["peers"] == [0, 1, 2]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names == {"rank 0", "rank 1", "rank 2"}
    skew = doc["otherData"]["skew"]
    assert skew["collectives"] == 4 and skew["worst_us"] >= skew["median_us"] >= 0
    assert set(skew["waiting_us"]) == {"0", "1", "2"}
    assert "arrival skew over 4 collectives" in proc.stderr


@pytest.mark.waits
def test_the_trace_of_a_job_that_timed_out_has_every_rank_and_the_wait(tmp_path: Path) -> None:
    """The straggler, asked for its records and then stopped with SIGTERM (no exit
    handlers), used to leave no trace: its records were written only at exit.  A call
    that timed out lasted 0 us in the trace; it lasts its wait."""
    proc = _run(3, "straggler", "--trace", str(tmp_path / "tr"), dumps=tmp_path / "d")
    assert proc.returncode == 1, proc.stderr
    spans = [e for e in json.loads((tmp_path / "tr" / "trace.json").read_text())["traceEvents"]
             if e["ph"] == "X"]
    assert {(e["tid"], e["name"]) for e in spans if e["tid"] == 2} == {
        (2, f"all_reduce #{s}") for s in (1, 2, 3)}
    failed = [e for e in spans if e["args"]["state"] == "failed"]
    assert {e["tid"] for e in failed} == {0, 1}
    assert all(e["dur"] >= 1.5e6 for e in failed), failed   # RINGLET_TIMEOUT=2 s


_SENDS_AMONG_SMALL_CALLS = """
import time
import numpy as np
import ringlet
comm = ringlet.init()
x = np.ones(4)
for _ in range(10):
    comm.all_reduce(x)          # small: the compiled path, whose start times are coarse
if comm.rank == 0:
    comm.send(x, dst=1)
else:
    comm.recv(x, src=0)
for _ in range(2):
    comm.all_reduce(x)
if comm.rank == 1:
    time.sleep(30)
comm.all_gather(x)
"""


@pytest.mark.waits
def test_a_dump_keeps_the_last_records_in_call_order(tmp_path: Path) -> None:
    """Records were merged by start time, and the compiled path's are the coarse
    clock's, up to a tick early: a send came after the calls that followed it, and the
    last N records were not the last N calls."""
    script = tmp_path / "sends.py"
    script.write_text(_SENDS_AMONG_SMALL_CALLS)
    env = clean_env(RINGLET_TIMEOUT="2", OMP_NUM_THREADS="1", RINGLET_FLIGHT_RECORDS="3",
                    RINGLET_DUMP_DIR=str(tmp_path / "d"))
    proc = subprocess.run([*CLI, "run", "--grace", "1", "-n", "2", str(script)],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 1, proc.stderr
    ops = json.loads((tmp_path / "d" / "rank-0.json").read_text())["comms"][0]["ops"]
    assert [(op["kind"], op["seq"]) for op in ops] == [
        ("all_reduce", 11), ("all_reduce", 12), ("all_gather", 13)], ops


def test_trace_across_nodes_aligns_the_clocks_to_rank_0(tmp_path: Path) -> None:
    """ringlet run --nodes 2 -n 4 (two emulated nodes, torch's gloo between them): the
    ranks of node 1 measure their offset to rank 0's clock at start-up; on one host the
    true offset is 0, so each measured one is within half its round trip."""
    pytest.importorskip("torch", reason="torch is not installed (the engine between nodes)")
    env = clean_env(OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "ringlet", "run", "--nodes", "2", "-n", "4",
                           "--trace", str(tmp_path / "tr"), "hang.py", "ok"], cwd=SCRIPTS,
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "tr" / "trace.json").read_text())
    clocks = doc["otherData"]["clocks"]
    assert set(clocks) == {"0", "1", "2", "3"}
    for q in ("0", "1"):   # rank 0's node: its clock
        assert clocks[q] == {"offset_us": 0.0, "round_trip_us": 0.0}
    for q in ("2", "3"):
        c = clocks[q]
        assert 0 < c["round_trip_us"] < 1e6 and abs(c["offset_us"]) <= c["round_trip_us"] / 2
    spans = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    # the alignment's messages are not in the trace: every rank has its 4 collectives only
    assert sorted((e["tid"], e["args"]["seq"]) for e in spans) == \
        [(r, s) for r in range(4) for s in range(1, 5)]
    assert all(e["ph"] != "M" or e["name"] != "ringlet_clock" for e in doc["traceEvents"])


# --- in one process ----------------------------------------------------------------------------

def test_the_ring_is_bounded_and_records_state(tmp_path: Path) -> None:
    s = ringlet.Settings(flight_records=5, dump_dir=str(tmp_path))
    with ringlet.init(settings=s, rank=0, size=1) as comm:
        x = np.ones(3, np.float32)
        for _ in range(7):
            comm.all_reduce(x)
        comm.isend(x, 0, tag=3).wait()
        comm.recv(x, 0, tag=3)
        assert comm._fr is not None
        ops = comm._fr.records()
        assert len(ops) == 5
        assert [(o["kind"], o["seq"]) for o in ops] == [
            ("all_reduce", 5), ("all_reduce", 6), ("all_reduce", 7), ("send", 1), ("recv", 2)]
        assert all(o["state"] == "done" and o["t_start_us"] > 0 for o in ops)
        # a collective's end is timed only when tracing (one clock read per call less)
        assert [o["t_end_us"] is None for o in ops] == [True, True, True, False, False]
        assert all(o["t_end_us"] >= o["t_start_us"] for o in ops[3:])
        assert ops[0]["bytes"] == 12 and ops[0]["dtype"] == "float32" and ops[0]["op"] == "SUM"
        assert ops[3]["tag"] == 3 and ops[3]["peer"] == 0
        # a blocking send and recv that need no wait are recorded as well, and a
        # receive that fails as failed
        comm.send(x, 0, tag=4)
        comm.recv(x, 0, tag=4)
        comm.send(x, 0, tag=5)
        with pytest.raises(ringlet.ArgumentError, match="holds 3 x float32"):
            comm.recv(np.empty(2, np.float32), 0, tag=5)
        ops = comm._fr.records()[-3:]
        assert [(o["kind"], o["seq"], o["tag"], o["state"]) for o in ops] == [
            ("recv", 4, 4, "done"), ("send", 5, 5, "done"), ("recv", 6, 5, "failed")]
        assert all(o["t_end_us"] >= o["t_start_us"] for o in ops[:2])
    off = ringlet.Settings(flight_records=0)
    with ringlet.init(settings=off, rank=0, size=1) as comm:
        assert comm._fr is None
        comm.all_reduce(np.ones(2))


def _doc(rank: int, ops: list[dict[str, Any]], size: int = 3) -> dict[str, Any]:
    return {"rank": rank, "reason": "", "job": "j",
            "comms": [{"ranks": list(range(size)), "rank": rank, "size": size, "ops": ops}]}


def _op(kind: str, seq: int, state: str, **kw: Any) -> dict[str, Any]:
    what = f"{kind} #{seq} (4 x float64)"
    if kind in ("send", "recv"):
        what = f"{kind} {'to' if kind == 'send' else 'from'} rank {kw['peer']} (tag 0)"
    return {"kind": kind, "seq": seq, "state": state, "what": what, **kw}


def test_a_call_still_running_stays_in_the_records_when_later_ones_push_it_out() -> None:
    """Async calls queued behind a running one took its slot (call s + cap in slot s), and
    later sends pushed a pending receive out of the ring: a dump lost the very call the
    rank was stuck in (rank 0 'in all_reduce #8', a queued call, and no wait at all)."""
    from ringlet.agreement import Desc
    from ringlet.recorder import RECV, SEND, T_END, T_START, FlightRecorder, now_ns

    fr = FlightRecorder(4, [0, 1], 0, "")
    desc = Desc(1, 0, 11, 4, 0, 0, 0)
    first = [1, desc, "ring", 0, 0, now_ns()]
    fr.put(1, first)
    first[T_START] = now_ns()   # running; #2-#11 queued behind it
    for seq in range(2, 12):
        fr.put(seq, [seq, desc, "ring", 0, 0, now_ns()])
    assert [(o["seq"], o["state"]) for o in fr.records()][:2] == [(1, "started"),
                                                                   (2, "queued")]
    first[T_END] = now_ns()
    assert [o["seq"] for o in fr.records()][0] == 2
    # a receive still pending when four sends have been made since
    fr2 = FlightRecorder(4, [0, 1], 0, "")
    fr2.p2p(RECV, 1, 7, 0, 8)
    for _ in range(5):
        fr2.p2p(SEND, 1, 0, 0, 8)[T_END] = now_ns()
    ops = fr2.records()
    assert (ops[0]["kind"], ops[0]["state"], ops[0]["tag"]) == ("recv", "started", 7)
    assert len(ops) == 5


def test_mixed_cycle_and_no_diagnosis_when_all_done() -> None:
    docs = {0: _doc(0, [_op("send", 1, "started", peer=1)]),
            1: _doc(1, [_op("all_reduce", 1, "failed")]),
            2: _doc(2, [_op("all_reduce", 1, "done")])}
    # 0 waits for 1 to take its send, 1 waits in all_reduce #1 for 0 (which never entered it)
    lines = diagnose(docs)
    assert lines[0] == ("deadlock: rank 0 waits for 1 to receive its send, rank 1 waits for 0 "
                        "in all_reduce #1"), lines
    done = {q: _doc(q, [_op("all_reduce", 1, "done")]) for q in range(3)}
    assert diagnose(done) == []


def test_dumps_asked_for_again_and_again_across_nodes_never_hang_a_rank() -> None:
    """A flight-recorder dump (SIGUSR1) runs in the main thread, wherever it was: on the
    torch engine it once polled the agreement from there and took the lock of a post the
    thread was in the middle of, and that rank hung for good."""
    pytest.importorskip("torch", reason="torch is not installed (the engine between nodes)")
    env = clean_env(OMP_NUM_THREADS="1", RINGLET_TIMEOUT="20")
    proc = subprocess.run([sys.executable, "-m", "ringlet", "run", "--grace", "5", "--nodes",
                           "2", "-n", "4", "dump_storm.py"], cwd=SCRIPTS, capture_output=True,
                          text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert sorted(line.split("] ", 1)[1] for line in proc.stdout.splitlines()
                  if "barriers" in line) == [f"rank {r}: 300 barriers" for r in range(4)]


def test_a_receive_from_any_rank_with_any_tag_is_named_so_in_the_records() -> None:
    from ringlet.recorder import RECV, SEND, record_json

    rec = record_json([3, (RECV, -1, -1, 0, 64), "", 1000, 0])
    assert rec["what"] == "recv from any rank (any tag)" and rec["peer"] == -1
    assert record_json([4, (SEND, 2, 5, 0, 64), "", 1000, 0])["what"] == "send to rank 2 (tag 5)"


def test_a_dump_asked_for_during_a_dump_does_not_write_over_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``ringlet run`` asks every live rank for its records (SIGUSR1) when one fails; a
    rank in the middle of its own failure's dump used to start a second dump into the
    same temporary file, and the launcher read invalid JSON and blamed that rank."""
    from types import SimpleNamespace

    from ringlet import recorder

    fake = SimpleNamespace(settings=SimpleNamespace(dump_dir=str(tmp_path), flight_records=0),
                           _world_ranks=[0],
                           rank=0, size=1, job_id="j", _fr=None, _seq=3,
                           _broken="rank 0 failed")
    inner: list[str | None] = []

    def write_with_a_signal_halfway(doc: Any, f: Any, **kw: Any) -> None:
        text = json.dumps(doc, **kw)
        f.write(text[:len(text) // 2])
        if not inner:   # the signal arrives here, once
            inner.append(recorder.dump("SIGUSR1 (on demand)", comms=[fake]))
        f.write(text[len(text) // 2:])

    monkeypatch.setattr(recorder, "json", SimpleNamespace(dump=write_with_a_signal_halfway))
    monkeypatch.setattr(recorder, "_failure_dumped", None)
    path = recorder.dump("abort: rank 0 failed", comms=[fake])
    assert inner == [None] and path is not None
    assert json.loads(Path(path).read_text())["reason"] == "abort: rank 0 failed"
    assert [p.name for p in tmp_path.iterdir()] == ["rank-0.json"]
    # once failed, a later request is not written either (the failure's dump stays) ...
    assert recorder.dump("SIGUSR1 (on demand)", comms=[fake]) is None
    # ... unless the rank went on (it caught a MismatchError): it may hang later, and its
    # dump then said only the old failure (it refused every request after one)
    fake._seq += 1
    assert recorder.dump("SIGUSR1 (on demand)", comms=[fake]) == path
    assert json.loads(Path(path).read_text())["reason"] == "SIGUSR1 (on demand)"


def test_a_trace_names_a_groups_peer_by_its_world_rank_too() -> None:
    """The trace's rows are world ranks: a send on a group names both numbers; a receive
    from any rank has no peer (it named the group's last rank)."""
    from types import SimpleNamespace

    from ringlet.recorder import RECV, SEND, trace_event

    fr = SimpleNamespace(offset_ns=0, world_ranks=[1, 3], world_rank=1, ident="ab12")
    send = trace_event([1, (SEND, 1, 0, 0, 8), 0, 1000, 2000], fr)
    assert send["name"] == "send to rank 1 (world rank 3) (tag 0)" and \
        send["args"]["peers"] == [3]
    anyone = trace_event([2, (RECV, -1, -1, 0, 8), 0, 1000, 2000], fr)
    assert anyone["name"] == "recv from any rank (any tag)" and anyone["args"]["peers"] == []
    world = SimpleNamespace(offset_ns=0, world_ranks=[0, 1], world_rank=0, ident="world")
    assert trace_event([1, (SEND, 1, 0, 0, 8), 0, 1000, 2000], world)["name"] == \
        "send to rank 1 (tag 0)"


# --- overlapping operations, communicators of the same ranks, other ends ------------------


def test_overlapping_operations_get_rows_of_their_own_and_each_communicator_its_skew(
        tmp_path: Path) -> None:
    """Receives posted together, queued async calls and a split of every rank on a thread
    of its own (tests/scripts/overlap.py): no two operations on one row of the trace
    partly overlap (Perfetto drops such slices), queued calls are traced done with their
    time, and the skew tells the world's collectives from the split's (same ranks, same
    numbers: they overwrote each other, 'rank 1' was slowest where rank 2 was)."""
    from ringlet.tracing import LANE, rank_of, skew

    env = clean_env(OMP_NUM_THREADS="1")
    p = subprocess.run([*CLI, "run", "--trace", str(tmp_path), "-n", "3", "overlap.py"],
                       capture_output=True, text=True, cwd=SCRIPTS, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    doc = json.loads((tmp_path / "trace.json").read_text())
    spans = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    rows: dict[int, list[dict[str, Any]]] = {}
    for e in spans:
        assert e["tid"] % LANE == rank_of(e), e
        rows.setdefault(e["tid"], []).append(e)
    for es in rows.values():
        es.sort(key=lambda e: e["ts"])
        for a, b in zip(es, es[1:], strict=False):
            assert b["ts"] >= a["ts"] + a["dur"] - 1e-3, (a, b)
    assert any(tid >= LANE for tid in rows), "nothing overlapped: the test tests nothing"
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "thread_name"}
    assert {"rank 0", "rank 0 (overlapping 1)"} <= names, names
    assert {e["args"]["state"] for e in spans} == {"done"}
    assert all(e["dur"] > 0 for e in spans if e["name"].startswith("all_reduce"))
    # the last three calls of each communicator: rank 2 late to the world's, 1 to the split's
    calls: dict[tuple[str, int], dict[int, float]] = {}
    for e in spans:
        if e["cat"] == "collective":
            calls.setdefault((e["args"]["comm_id"], e["args"]["seq"]), {})[rank_of(e)] = e["ts"]
    assert len({c for c, _ in calls}) == 2
    late = {(c == "world", max(t, key=lambda q: t[q])) for (c, _), t in calls.items()
            if max(t.values()) - min(t.values()) > 50e3}
    assert late == {(True, 2), (False, 1)}, late
    assert skew(spans)["collectives"] == len(calls)


def test_a_queued_call_is_written_to_the_trace_once_it_is_done(tmp_path: Path) -> None:
    """A queued call's record is as long as a failed one's ([seq, desc, algorithm, 0, 0,
    t_queued]): a flush took it as finished and wrote it 'queued', with no time."""
    from ringlet.agreement import Desc
    from ringlet.recorder import T_END, T_START, FlightRecorder, now_ns

    fr = FlightRecorder(8, [0, 1], 0, str(tmp_path))
    desc = Desc(1, 0, 11, 4, 0, 0, 0)
    rec = [1, desc, "ring", 0, 0, now_ns()]
    fr.put(1, rec)
    fr.flush_trace()
    path = tmp_path / "rank-0.trace.jsonl"
    assert not path.exists() or not path.read_text()
    rec[T_START] = now_ns()
    rec[T_END] = rec[T_START] + 5000
    fr.flush_trace()
    (event,) = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert event["args"]["state"] == "done" and event["dur"] > 0, event
    fr.close()


def test_a_trace_flush_loses_no_record_another_thread_finishes_or_adds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A flush looked at each record twice (finished? then: not finished?) and replaced the
    list: a record another thread finished between the two looks was in neither part, and
    one it appended meanwhile was dropped (2,308 of 60,000 lost with two threads)."""
    from ringlet import recorder
    from ringlet.recorder import SEND, T_END, FlightRecorder, now_ns

    fr = FlightRecorder(8, [0, 1], 0, str(tmp_path))
    slow = fr.p2p(SEND, 1, 0, 0, 8)   # still running when the flush starts
    late = [3, (SEND, 1, 1, 0, 8), 0, now_ns(), now_ns()]
    looked = recorder._finished

    def other_thread_meanwhile(r: list[Any]) -> bool:
        seen = looked(r)
        if r is slow and not seen and not slow[T_END]:   # the other thread, right now:
            slow[T_END] = now_ns()    # the running send ends
            fr._trace.append(late)    # and a record is added (traced)
        return seen

    monkeypatch.setattr(recorder, "_finished", other_thread_meanwhile)
    fr.flush_trace()
    fr.close()
    lines = (tmp_path / "rank-0.trace.jsonl").read_text().splitlines()
    assert sorted(json.loads(ln)["args"]["seq"] for ln in lines) == [1, 3]


def test_two_communicators_tracing_at_once_write_every_line_whole(tmp_path: Path) -> None:
    """Two communicators of a rank (two threads) write one trace file: their batches were
    written 8 KiB at a time, cutting each other's lines, and the first write of the
    process emptied the file after the other's (about 3,500 of 24,576 events lost)."""
    import threading

    from ringlet.recorder import SEND, TRACE_BATCH, FlightRecorder, now_ns

    frs = [FlightRecorder(8, [0, 1], 0, str(tmp_path)) for _ in range(2)]
    n = 3 * TRACE_BATCH

    def calls(fr: FlightRecorder) -> None:
        for i in range(n):
            fr.add([i + 1, (SEND, 1, 0, 0, 8), 0, now_ns(), now_ns()])

    threads = [threading.Thread(target=calls, args=(fr,)) for fr in frs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for fr in frs:
        fr.close()
    lines = (tmp_path / "rank-0.trace.jsonl").read_text().splitlines()
    assert len([json.loads(ln) for ln in lines]) == 2 * n


def test_a_forked_rank_of_spawn_writes_its_trace_and_removes_its_marker(tmp_path: Path) -> None:
    """ringlet.spawn's forked ranks end with os._exit (no exit handlers): their traces were
    never written and their rank-R.signal markers stayed."""
    code = ("import numpy as np, ringlet\n"
            "def f(comm):\n"
            "    comm.all_reduce(np.ones(4))\n"
            "    comm.barrier()\n"
            "ringlet.spawn(f, 3)\n")
    env = clean_env(RINGLET_TRACE=str(tmp_path / "t"), RINGLET_DUMP_DIR=str(tmp_path / "d"),
                    RINGLET_START_METHOD="fork")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    for q in range(3):
        events = [json.loads(ln) for ln in
                  (tmp_path / "t" / f"rank-{q}.trace.jsonl").read_text().splitlines()]
        assert [e["name"].split(" #")[0] for e in events if e.get("ph") == "X"][-2:] == \
            ["all_reduce", "barrier"], events
    assert not list((tmp_path / "d").glob("rank-*.signal"))


@pytest.mark.waits
def test_an_interrupted_hang_has_every_ranks_records(tmp_path: Path) -> None:
    """Ctrl-C (or a SIGTERM from outside) on a hung ringlet run: the ranks are asked for
    their records before the signal reaches them (the straggler left none)."""
    import signal
    import time

    env = clean_env(RINGLET_TIMEOUT="60", RINGLET_DUMP_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([*CLI, "run", "--grace", "1", "-n", "3", "hang.py", "straggler"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=SCRIPTS, env=env)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("rank-*.signal"))) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)   # ranks 0 and 1 in all_reduce #4, rank 2 asleep
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    d = _diagnosis(subprocess.CompletedProcess(proc.args, proc.returncode, "", err))
    assert d[0].endswith("ranks 0, 1, 2:"), err
    assert d[1] == "rank 2 last completed all_reduce #3; ranks 0, 1 are in all_reduce #4", err


def test_a_hang_in_a_split_of_every_rank_is_found() -> None:
    """A communicator of the same ranks as the world (comm.split(0), a thread's own): its
    hang was not looked for (only groups smaller than the world were)."""
    def doc(q: int, sub: list[dict[str, Any]]) -> dict[str, Any]:
        world = {"id": "world", "ranks": [0, 1, 2], "rank": q, "size": 3,
                 "ops": [_op("all_reduce", 1, "done")]}
        return {"rank": q, "reason": "", "job": "j",
                "comms": [world, {"id": "9f3a", "ranks": [0, 1, 2], "rank": q, "size": 3,
                                  "ops": sub}]}

    docs = {q: doc(q, [_op("all_reduce", 1, "done"), _op("all_reduce", 2, "failed")])
            for q in (0, 1)}
    docs[2] = doc(2, [_op("all_reduce", 1, "done")])
    assert diagnose(docs) == [
        "in the group of world ranks 0, 1, 2 (ranks here are the group's, 0-2): rank 2 last "
        "completed all_reduce #1; ranks 0, 1 are in all_reduce #2"]


def test_a_send_with_another_tag_is_named_not_nobody_sends() -> None:
    docs = {0: _doc(0, [_op("recv", 1, "failed", peer=1, tag=1)], size=2),
            1: _doc(1, [_op("send", 1, "done", peer=0, tag=2),
                        _op("recv", 2, "failed", peer=0, tag=0)], size=2)}
    assert diagnose(docs)[0] == ("deadlock: rank 0 waits to receive from 1, 1 from 0; rank 1 "
                                 "sent 0 tag 2, which its receive (tag 1) does not match")


def test_without_flight_records_the_diagnosis_says_what_the_waits_say() -> None:
    def doc(q: int, waits: list[dict[str, Any]]) -> dict[str, Any]:
        return {"rank": q, "reason": "", "job": "j", "flight_records": 0, "waits": waits,
                "comms": [{"id": None, "ranks": [0, 1, 2], "rank": q, "size": 3, "ops": []}]}

    wait = {"thread": 1, "what": "all_reduce #4 (4 x float64)", "waiting_on": [2]}
    lines = diagnose({0: doc(0, [wait]), 1: doc(1, [wait]), 2: doc(2, [])})
    assert lines[0].startswith("the flight recorders were off (RINGLET_FLIGHT_RECORDS=0)")
    assert lines[1:] == ["rank 0 was waiting in all_reduce #4 (4 x float64) for rank 2",
                         "rank 1 was waiting in all_reduce #4 (4 x float64) for rank 2"]


def test_a_receive_from_any_rank_waits_for_every_rank() -> None:
    # rank 0 receives from any rank, the others from 0: a deadlock, not "rank 0 ended while
    # the others waited for it" (a receive from any rank waited for no rank in particular)
    docs = {0: _doc(0, [_op("recv", 1, "failed", peer=-1, tag=0)]),
            1: _doc(1, [_op("recv", 1, "failed", peer=0, tag=0)]),
            2: _doc(2, [_op("recv", 1, "failed", peer=0, tag=0)])}
    lines = diagnose(docs, ended={0: "exit code 1"})
    assert lines[0].startswith("deadlock: rank 0 waits to receive from "), lines
    assert lines[0].endswith("; nobody sends"), lines


def test_a_hang_in_a_group_of_one_rank_is_found() -> None:
    # comm.split(color=rank): a rank that receives from itself in its group of one waits
    # for good, as in a world of one rank (not "no rank was waiting")
    def doc(q: int) -> dict[str, Any]:
        world = {"id": "world", "ranks": [0, 1], "rank": q, "size": 2,
                 "ops": [_op("all_reduce", 1, "done")]}
        sub = {"id": f"t{q}", "ranks": [q], "rank": 0, "size": 1,
               "ops": [_op("recv", 1, "failed", peer=0, tag=0)]}
        return {"rank": q, "reason": "", "job": "j", "comms": [world, sub]}

    assert diagnose({0: doc(0), 1: doc(1)}) == [
        f"in the group of world ranks {q} (ranks here are the group's, 0-0): deadlock: rank 0 "
        f"waits to receive from 0; nobody sends" for q in (0, 1)]
