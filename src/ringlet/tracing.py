"""A job's Chrome trace: the ranks' trace files merged, and the arrival skew of its collectives.

With ``RINGLET_TRACE=DIR`` (``ringlet run --trace DIR`` sets it) every rank
writes its operations to ``DIR/rank-R.trace.jsonl`` (:mod:`ringlet.recorder`).
:func:`merge` joins them into ``DIR/trace.json`` in the Chrome trace event
format (``{"traceEvents": [...]}``: one ``ph: "X"`` event per operation, a
row (``tid``) per rank and one more for each operation that overlaps others
(:func:`lanes`), named by metadata events), which Perfetto and
``chrome://tracing`` open.  Times are microseconds of ``CLOCK_MONOTONIC``,
which the processes of one host share; a rank on another node than rank 0's
adds the offset to rank 0's clock that :func:`clock_offset` measured when the
world communicator started (when tracing).

A collective's events of every rank start when that rank arrived (entered
the call, before the agreement step); the spread of those starts is the
collective's *arrival skew*, the last rank to arrive is its straggler, and
``last arrival - own arrival`` is the time a rank waited for the others.
:func:`skew` sums that up; ``trace.json`` carries it in ``otherData.skew``.
"""

from __future__ import annotations

import glob
import json
import os
import statistics
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .comm import Communicator

#: round trips per rank when the clocks are aligned (the one with the shortest is kept)
CLOCK_ROUNDS = 8
#: the tag of the alignment's messages: above every user tag (those are < 2**62)
CLOCK_TAG = 2 ** 62
#: the name of the metadata line a rank's trace file starts with when its clock was aligned
CLOCK_EVENT = "ringlet_clock"


def clock_offset(comm: Communicator, rounds: int = CLOCK_ROUNDS) -> tuple[int, int]:
    """Align this rank's clock to rank 0's, NTP-style; collective over ``comm``.

    Every rank on another node than rank 0's sends rank 0 ``rounds`` pings, one
    at a time; rank 0 answers each with its clock ``t0``, read when the ping
    arrived.  The ping left at ``a`` and the answer came back at ``b`` (this
    rank's clock): rank 0's clock read ``t0`` at about ``(a + b) / 2`` here, so
    the offset is ``t0 - (a + b) / 2``, within half the round trip; the round trip
    that was shortest gives it.  Returns (offset, round trip) in nanoseconds:
    (0, 0) on rank 0's node, whose ranks share its clock.  The messages go by the
    communicator's point-to-point path with a tag no user can give, and the
    flight recorder does not record them.
    """
    import numpy as np

    from .buffers import as_buffer

    of = comm.topology.node_of()
    remote = [q for q in range(comm.size) if of[q] != of[0]]
    if comm.rank != 0 and comm.rank not in remote:
        return 0, 0
    buf = np.zeros(1, np.int64)
    xb = as_buffer(buf, "clock", writable=True)
    p2p, fr = comm._p2p, comm._fr
    comm._fr = None
    try:
        if comm.rank == 0:
            for q in remote:
                for _ in range(rounds):
                    p2p.irecv(xb, q, CLOCK_TAG).wait()
                    buf[0] = time.monotonic_ns()
                    p2p.isend(xb, q, CLOCK_TAG).wait()
            return 0, 0
        best = (2 ** 63, 0)
        for _ in range(rounds):
            a = time.monotonic_ns()
            buf[0] = a
            p2p.isend(xb, 0, CLOCK_TAG).wait()
            p2p.irecv(xb, 0, CLOCK_TAG).wait()
            b = time.monotonic_ns()
            best = min(best, (b - a, int(buf[0]) - (a + b) // 2))
        return best[1], best[0]
    finally:
        comm._fr = fr


#: the row (``tid``) of a rank's ``k``-th overlapping lane: rank + k * LANE
LANE = 1 << 24


def rank_of(e: dict[str, Any]) -> int:
    """The world rank of a trace event (its ``args.rank``; else, in traces written before
    ranks had more than one row, its ``tid``)."""
    a = e.get("args")
    return int(a["rank"]) if isinstance(a, dict) and "rank" in a else int(e.get("tid", 0))


def lanes(events: list[dict[str, Any]]) -> dict[int, int]:
    """Give each rank's operations that overlap in time rows of their own; returns the
    rows each rank has.

    A trace's slices on one row must nest (Perfetto drops a slice that partly overlaps
    another on its row), but a rank's operations overlap: receives posted together, async
    calls, two communicators on two threads.  Each operation takes the rank's first row
    that is free when it starts (row k is ``tid`` rank + k * :data:`LANE`), so row 0 holds
    the calls one after the other and the rows below what overlapped them."""
    ends: dict[int, list[float]] = {}
    for e in sorted(events, key=lambda e: (float(e["ts"]), -float(e.get("dur", 0)))):
        q = rank_of(e)
        rows = ends.setdefault(q, [])
        ts, end = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
        # ends and starts are rounded to the nanosecond: one that starts where another
        # ends follows it
        k = next((i for i, t in enumerate(rows) if ts >= t - 5e-4), len(rows))
        if k == len(rows):
            rows.append(end)
        else:
            rows[k] = end
        e["tid"] = q + k * LANE
    return {q: len(rows) for q, rows in ends.items()}


def _fmt_us(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} us"


def read(directory: str) -> list[dict[str, Any]]:
    """Every event of the ranks' ``rank-R.trace.jsonl`` files in ``directory``."""
    events: list[dict[str, Any]] = []
    for path in sorted(glob.glob(os.path.join(directory, "rank-*.trace.jsonl"))):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        events.append(json.loads(line))
                    except ValueError:
                        continue   # a line cut short by a rank that was killed
    return events


def arrivals(events: list[dict[str, Any]]) -> list[tuple[str, dict[int, float]]]:
    """Each collective that every rank of its communicator traced, as (its name, when
    each rank arrived, in trace microseconds), in the order of its first arrival."""
    groups: dict[tuple[str, str, int], dict[int, dict[str, Any]]] = {}
    for e in events:
        if e.get("cat") != "collective":
            continue
        a = e["args"]   # communicators of the same ranks differ by comm_id
        key = (a["comm"], str(a.get("comm_id", "")), int(a["seq"]))
        groups.setdefault(key, {})[rank_of(e)] = e
    out: list[tuple[str, dict[int, float]]] = []
    for (comm, _, _), by_rank in groups.items():
        members = [int(q) for q in comm.split(",")]
        if len(members) < 2 or len(by_rank) < len(members):
            continue
        name = next(iter(by_rank.values()))["name"]
        out.append((name, {q: float(e["ts"]) for q, e in by_rank.items()}))
    out.sort(key=lambda c: min(c[1].values()))
    return out


def skew(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Arrival skew of the collectives that every rank of their communicator traced."""
    skews: list[tuple[float, str, int]] = []
    last: dict[int, int] = {}
    waited: dict[int, float] = {}
    for name, arrive in arrivals(events):
        latest = max(arrive.values())
        slow = max(arrive, key=lambda q: arrive[q])
        skews.append((latest - min(arrive.values()), name, slow))
        last[slow] = last.get(slow, 0) + 1
        for q, t in arrive.items():
            waited[q] = waited.get(q, 0.0) + latest - t
    if not skews:
        return {"collectives": 0}
    worst = max(skews)
    slowest = max(last, key=lambda q: last[q])
    return {"collectives": len(skews),
            "median_us": round(statistics.median(s for s, _, _ in skews), 3),
            "worst_us": round(worst[0], 3), "worst_call": worst[1], "worst_last_rank": worst[2],
            "slowest_rank": slowest, "slowest_last_in": last[slowest],
            "last_to_arrive": {str(q): n for q, n in sorted(last.items())},
            "waiting_us": {str(q): round(w, 3) for q, w in sorted(waited.items())}}


def skew_text(s: dict[str, Any]) -> str:
    """The skew summary in one line."""
    n = s["collectives"]
    if not n:
        return "no collective was traced by every rank of its communicator"
    waiting = ", ".join(f"rank {q} {_fmt_us(w)}" for q, w in s["waiting_us"].items())
    return (f"arrival skew over {n} collectives: median {_fmt_us(s['median_us'])}, worst "
            f"{_fmt_us(s['worst_us'])} ({s['worst_call']}, rank {s['worst_last_rank']} last); "
            f"slowest to arrive: rank {s['slowest_rank']} (last in {s['slowest_last_in']} of "
            f"{n}); waiting for others: {waiting}")


def merge(directory: str) -> tuple[str, dict[str, Any], int]:
    """Write ``directory/trace.json`` from the ranks' files; (its path, the skew, events).

    The clock offsets the ranks measured (:func:`clock_offset`) go to
    ``otherData.clocks`` (rank: offset and round trip, microseconds)."""
    events = read(directory)
    clocks = {str(e["tid"]): e["args"] for e in events if e.get("name") == CLOCK_EVENT}
    events = [e for e in events if e.get("name") != CLOCK_EVENT]
    rows = lanes(events)
    meta: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": 0, "tid": 0,
                                   "args": {"name": "ringlet job"}}]
    for q, n in sorted(rows.items()):
        for k in range(n):
            meta.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": q + k * LANE,
                         "args": {"name": f"rank {q}" + (f" (overlapping {k})" if k else "")}})
            meta.append({"name": "thread_sort_index", "ph": "M", "pid": 0,
                         "tid": q + k * LANE, "args": {"sort_index": q * 1000 + k}})
    s = skew(events)
    from .outputs import writing

    path = os.path.join(directory, "trace.json")
    with writing(path, "--trace"), open(path, "w") as f:
        json.dump({"traceEvents": meta + sorted(events, key=lambda e: (e["tid"], e["ts"])),
                   "displayTimeUnit": "ms",
                   "otherData": {"skew": s, **({"clocks": clocks} if clocks else {})}}, f)
    return path, s, len(events)


def clear(directory: str) -> None:
    """Remove the ranks' trace files of an earlier job in ``directory``."""
    for path in glob.glob(os.path.join(directory, "rank-*.trace.jsonl")) + \
            [os.path.join(directory, "trace.json")]:
        try:
            os.remove(path)
        except OSError:
            pass
