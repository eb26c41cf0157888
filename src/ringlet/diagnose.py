"""What a failed job's ranks were doing: the diagnosis read from their flight recorder dumps.

``ringlet run`` prints it before its summary line when a job fails, and
``ringlet diagnose DIR`` prints it for the dumps of any job (mpiexec,
torchrun: set ``RINGLET_DUMP_DIR=DIR`` on every rank).  Each rank's dump
(``DIR/rank-R.json``, :mod:`ringlet.recorder`) lists its last operations
with their state; from the world communicator's records of every rank (and
then each other communicator's, told apart by the ``id`` its members agreed
on, so a split of every rank is not taken for the world) this module builds:

- the wait-for graph: a rank in a receive waits for its source, in a
  send for its destination, in collective #s for every rank that has not
  reached #s (or, with no dump of that rank, those its wait named);
- any cycle in it: ``deadlock: rank 0 waits to receive from 2, 2 from 1, 1 from 0;
  nobody sends``;
- ranks behind the others: ``rank 2 last completed all_reduce #41; ranks 0, 1
  are in all_reduce #42``;
- calls that disagree (a mismatch), and ranks that ended or died while
  others waited for them.

Without records (``RINGLET_FLIGHT_RECORDS=0``) it lists what each dump says its
rank was waiting for.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any

from .errors import ArgumentError, name_ranks


def load(directory: str, job: str | None = None,
         bad: list[str] | None = None) -> dict[int, dict[str, Any]]:
    """The ``rank-R.json`` dumps in ``directory`` of job ``job`` (default: the job of the
    latest dump), by world rank; files that are not a flight recorder's dump are skipped
    (and named, with why, in ``bad``)."""
    if not os.path.isdir(directory):
        raise ArgumentError(f"{directory!r} is not a directory (give the RINGLET_DUMP_DIR of "
                            f"the job)")
    out: dict[int, dict[str, Any]] = {}
    for path in sorted(glob.glob(os.path.join(directory, "rank-*.json"))):
        try:
            with open(path) as f:
                doc = json.load(f)
            _check_dump(doc)
            out[int(doc["rank"])] = doc
        except (OSError, ValueError, KeyError, TypeError) as exc:
            if bad is not None:
                why = exc.strerror if isinstance(exc, OSError) else \
                    f"not JSON ({exc})" if isinstance(exc, json.JSONDecodeError) else str(exc)
                bad.append(f"{os.path.basename(path)}: {why}")
    if job is None and out:
        job = max(out.values(), key=lambda d: d.get("time_unix", 0)).get("job")
    return {q: d for q, d in out.items() if d.get("job") == job}


def _check_dump(doc: Any) -> None:
    """A ValueError unless ``doc`` is a flight recorder's dump that the diagnosis can read."""
    from .recorder import FORMAT

    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"not a flight recorder dump (no \"format\": \"{FORMAT}\")")
    if not isinstance(doc.get("rank"), int) or not isinstance(doc.get("comms"), list):
        raise ValueError("its rank or comms are missing or of the wrong type")
    for c in doc["comms"]:
        if not (isinstance(c, dict) and isinstance(c.get("size"), int) and
                isinstance(c.get("ranks"), list) and isinstance(c.get("ops"), list)):
            raise ValueError("a communicator without its size, ranks or ops")
        for op in c["ops"]:
            if not (isinstance(op, dict) and isinstance(op.get("kind"), str) and
                    isinstance(op.get("state"), str) and isinstance(op.get("seq"), int) and
                    (op["kind"] not in ("send", "recv") or isinstance(op.get("peer"), int))):
                raise ValueError(f"an operation without its kind, state, seq or peer: {op!r}"
                                 [:200])


def _ranks(rs: list[int] | set[int]) -> str:
    return name_ranks(sorted(rs))


def _name(op: dict[str, Any]) -> str:
    """``all_reduce #42`` (a collective) or ``recv from rank 2 (tag 0)``."""
    if op["kind"] in ("send", "recv"):
        return str(op["what"])
    return f"{op['kind']} #{op['seq']}"


@dataclass
class _Rank:
    """One rank's world-communicator records, read for the diagnosis."""

    rank: int
    ops: list[dict[str, Any]]
    reason: str
    pending: list[dict[str, Any]] = field(default_factory=list)
    last_done: dict[str, Any] | None = None      # the last collective completed
    in_coll: dict[str, Any] | None = None        # the collective it is in (not done)
    entered: int = 0                             # the highest collective seq it entered

    @classmethod
    def of(cls, rank: int, doc: dict[str, Any], size: int, key: str,
           group: bool = False) -> _Rank | None:
        """The records of ``doc``'s communicator ``key`` (:func:`_key`) of ``size`` ranks:
        the world's, or with ``group`` a group's (of dumps that do not name communicators,
        the latest of those ranks with a call pending)."""
        comms = [c for c in doc.get("comms", []) if c.get("size") == size and _key(c) == key]
        if not comms:
            return None
        if group:
            comms.sort(key=lambda c: any(op.get("state") != "done" for op in c.get("ops", [])))
            comms = comms[-1:]
        ops = comms[0].get("ops", [])
        r = cls(rank, ops, str(doc.get("reason", "")))
        for op in ops:
            coll = op["kind"] not in ("send", "recv")
            if op["state"] == "done":
                if coll:
                    r.last_done = op
            else:
                r.pending.append(op)
                if coll and r.in_coll is None:
                    r.in_coll = op
            if coll and op["state"] != "queued":
                r.entered = max(r.entered, int(op["seq"]))
        return r


def _key(c: dict[str, Any]) -> str:
    """Which communicator a dump's entry is: its id ("world", or the token its members
    agreed on when it was split off); dumps that have none, its world ranks."""
    return str(c.get("id") or ",".join(map(str, c.get("ranks", ()))))


def _world_size(docs: dict[int, dict[str, Any]]) -> int:
    sizes = [int(c.get("size", 0)) for d in docs.values() for c in d.get("comms", [])]
    return max(sizes, default=0)


_DIED = re.compile(r"rank (\d+) \(pid \d+\) died|rank (\d+) failed or died")
_CLOSED = re.compile(r"rank (\d+) closed the communicator")


def diagnose(docs: dict[int, dict[str, Any]], nranks: int | None = None,
             ended: dict[int, str] | None = None) -> list[str]:
    """The diagnosis of a job from its ranks' dumps, as lines (empty: nothing to say).

    ``nranks``: the job's size if known (else the largest communicator's);
    ``ended``: how ranks that failed ended, from the launcher (``exit code 1``,
    ``killed by SIGKILL``): a rank that ended and left no dump is named with it.
    """
    ended = dict(ended or {})
    size = nranks or _world_size(docs)
    if not size:
        return []
    comms = [c for d in docs.values() for c in d.get("comms", [])]
    if not any(c.get("ops") for c in comms) and \
            any(d.get("flight_records") == 0 for d in docs.values()):
        return _waits_only(docs, size, ended)
    world = "world" if any(c.get("id") == "world" for c in comms) else \
        ",".join(map(str, range(size)))
    ranks: dict[int, _Rank] = {}
    for q, doc in docs.items():
        r = _Rank.of(q, doc, size, world)
        if r is not None:
            ranks[q] = r
    lines, cycle = _diagnosis(ranks, size, ended, group=False)
    if cycle:
        return lines
    # groups (comm.split, comm.group; one of every rank too): each one's wait-for graph,
    # in the group's numbering
    groups = sorted({(tuple(int(w) for w in c.get("ranks", ())), _key(c)) for c in comms
                     if int(c.get("size", 0)) > 0 and _key(c) != world})
    for members, key in groups:
        sub: dict[int, _Rank] = {}
        for i, w in enumerate(members):
            gdoc = docs.get(w)
            r = None if gdoc is None else _Rank.of(i, gdoc, len(members), key, group=True)
            if r is not None:
                sub[i] = r
        found, _ = _diagnosis(sub, len(members), {i: ended[w] for i, w in enumerate(members)
                                                  if w in ended}, group=True)
        if found:
            lines.append(f"in the group of world ranks {', '.join(map(str, members))} (ranks "
                         f"here are the group's, 0-{len(members) - 1}): " + "; ".join(found))
    return lines


def _waits_only(docs: dict[int, dict[str, Any]], size: int, ended: dict[int, str]
                ) -> list[str]:
    """The diagnosis when the flight recorders were off: what each rank's dump says it
    was waiting for (its ``waits``), and the ranks that left none."""
    several = any(len(d.get("comms", [])) > 1 for d in docs.values())
    lines = ["the flight recorders were off (RINGLET_FLIGHT_RECORDS=0): only what each rank "
             "was waiting for when it dumped is known" +
             (" (ranks numbered in that call's communicator)" if several else "")]
    for q, d in sorted(docs.items()):
        for w in d.get("waits", []):
            on = [int(p) for p in w.get("waiting_on") or []]
            if on:
                lines.append(f"rank {q} was waiting in {w.get('what') or 'a call'} for "
                             f"{_ranks(on)}")
    for q in range(size):
        if q not in docs:
            lines.append(f"rank {q} ended ({ended[q]}) and left no dump" if q in ended else
                         f"rank {q} left no dump")
    return lines


def _diagnosis(ranks: dict[int, _Rank], size: int, ended: dict[int, str], group: bool
               ) -> tuple[list[str], list[int]]:
    """:func:`diagnose` of one communicator's records (``ranks``, by its rank); with
    ``group``, only where a rank waits (a group's ranks in no call are no news)."""
    lines: list[str] = []
    edges: dict[int, list[tuple[int, str]]] = {}
    for q, r in sorted(ranks.items()):
        for op in r.pending:
            if op["kind"] == "recv":   # from any rank (-1): it waits for each of them
                edges.setdefault(q, []).extend(
                    (p, "recv") for p in ([op["peer"]] if op["peer"] >= 0 else
                                          [p for p in range(size) if p != q]))
            elif op["kind"] == "send":
                edges.setdefault(q, []).append((op["peer"], "send"))
            elif op["state"] != "queued":
                s = int(op["seq"])
                named = op.get("waiting_on")
                for p in range(size):
                    if p == q:
                        continue
                    other = ranks.get(p)
                    late = other.entered < s if other is not None else \
                        (named is None or p in named)
                    if late:
                        edges.setdefault(q, []).append((p, f"coll {_name(op)}"))
    # --- cycles in the wait-for graph
    cycle = _cycle(edges)
    if cycle:
        lines.append(_cycle_text(cycle, edges, ranks))
    # --- ranks behind the others, and where each rank is
    where: dict[str, list[int]] = {}
    for q, r in sorted(ranks.items()):
        if r.in_coll is not None:
            where.setdefault(f"in {_name(r.in_coll)}", []).append(q)
        elif r.pending:
            where.setdefault(f"in {_name(r.pending[0])}", []).append(q)
        elif r.last_done is not None:
            where.setdefault(f"last completed {_name(r.last_done)}", []).append(q)
        else:
            where.setdefault("had made no collective call", []).append(q)
    if group and not edges:
        return [], []
    if len(where) > 1 and not cycle:
        # those furthest behind first: their place is the news
        order = sorted(where.items(), key=lambda kv: _progress(kv[0]))
        lines.append("; ".join(_where_text(qs, txt) for txt, qs in order))
    # --- calls that disagree
    mism = [op.get("error", "") for r in ranks.values() for op in r.ops
            if str(op.get("error", "")).startswith("MismatchError")]
    if mism:
        lines.append("calls disagree: " + mism[0].removeprefix("MismatchError: "))
    else:
        by_seq: dict[int, dict[str, list[int]]] = {}
        for q, r in ranks.items():
            if r.in_coll is not None:
                by_seq.setdefault(int(r.in_coll["seq"]), {}).setdefault(
                    r.in_coll["what"].partition(" ")[0] + " " +
                    r.in_coll["what"].partition(") ")[0].partition(" (")[2], []).append(q)
        for s, whats in sorted(by_seq.items()):
            if len(whats) > 1:
                lines.append(f"calls disagree at #{s}: " + "; ".join(
                    f"{_ranks(qs)}: {w}" for w, qs in whats.items()))
    # --- ranks that left no dump: ended, died, or were not asked
    missing = [q for q in range(size) if q not in ranks]
    said_dead: set[int] = set()
    said_closed: set[int] = set()
    for r in ranks.values():
        for text in [r.reason] + [str(op.get("error", "")) for op in r.ops]:
            for m in _DIED.finditer(text):
                said_dead.add(int(m.group(1) or m.group(2)))
            for m in _CLOSED.finditer(text):
                said_closed.add(int(m.group(1)))
    waited: dict[int, dict[str, list[int]]] = {}
    for q, es in sorted(edges.items()):
        for p, kind in es:
            what = kind.removeprefix("coll ") if kind.startswith("coll ") else \
                f"a {kind} with it"
            waited.setdefault(p, {}).setdefault(what, []).append(q)

    def tail(q: int) -> str:
        who = waited.get(q)
        if not who:
            return ""
        return " while " + "; ".join(f"{_ranks(qs)} waited for it in {w}"
                                     for w, qs in who.items())

    for q in missing:
        if group and not waited.get(q):
            continue
        if q in ended:
            lines.append(f"rank {q} ended ({ended[q]}) and left no flight record{tail(q)}")
        elif q in said_dead:
            lines.append(f"rank {q} died{tail(q)}")
        elif q in said_closed:
            lines.append(f"rank {q} closed its communicator (its program ended){tail(q)}")
        else:
            lines.append(f"rank {q} left no flight record (it never failed in a ringlet call "
                         f"and was not asked for one){tail(q)}")
    for q in sorted(set(ended) & set(ranks)):
        if waited.get(q) and not cycle:
            lines.append(f"rank {q} ended ({ended[q]}){tail(q)}")
    return lines, cycle


def _where_text(qs: list[int], txt: str) -> str:
    if txt.startswith("in "):
        return f"{_ranks(qs)} {'is' if len(qs) == 1 else 'are'} {txt}"
    return f"{_ranks(qs)} {txt}"


def _progress(text: str) -> tuple[int, int]:
    """Sort key of a place: how far a rank got (a collective's number; in one after done)."""
    m = re.search(r"#(\d+)", text)
    seq = int(m.group(1)) if m else 0
    return (seq, 1 if text.startswith("in ") else 0)


def _cycle(edges: dict[int, list[tuple[int, str]]]) -> list[int]:
    """A cycle of the wait-for graph (its ranks in order, the smallest first), or []."""
    color: dict[int, int] = {}
    stack: list[int] = []

    def visit(u: int) -> list[int]:
        color[u] = 1
        stack.append(u)
        for v, _ in edges.get(u, []):
            if color.get(v) == 1:
                return stack[stack.index(v):]
            if v not in color:
                found = visit(v)
                if found:
                    return found
        color[u] = 2
        stack.pop()
        return []

    for u in sorted(edges):
        if u not in color:
            found = visit(u)
            if found:
                i = found.index(min(found))
                return found[i:] + found[:i]
    return []


def _cycle_text(cycle: list[int], edges: dict[int, list[tuple[int, str]]],
                ranks: dict[int, _Rank]) -> str:
    kinds = []
    for i, u in enumerate(cycle):
        v = cycle[(i + 1) % len(cycle)]
        kinds.append(next(k for p, k in edges[u] if p == v))

    def src(u: int, v: int) -> str:   # v, or any rank (a receive from any rank)
        return str(v) if any(op["kind"] == "recv" and op["peer"] == v
                             for op in ranks[u].pending) else "any rank"

    if all(k == "recv" for k in kinds):
        steps = [f"rank {cycle[0]} waits to receive from "
                 f"{src(cycle[0], cycle[1 % len(cycle)])}"]
        steps += [f"{u} from {src(u, cycle[(i + 1) % len(cycle)])}"
                  for i, u in enumerate(cycle) if i > 0]
        sending = any(op["kind"] == "send" for q in cycle for op in ranks[q].pending)
        return "deadlock: " + ", ".join(steps) + \
            ("" if sending else _unmatched(cycle, ranks) or "; nobody sends")
    parts = []
    for i, u in enumerate(cycle):
        v, k = cycle[(i + 1) % len(cycle)], kinds[i]
        what = {"recv": f"to receive from {src(u, v)}",
                "send": f"for {v} to receive its send"}.get(
            k, f"for {v} in {k.removeprefix('coll ')}")
        parts.append(f"rank {u} waits {what}")
    return "deadlock: " + ", ".join(parts)


def _unmatched(cycle: list[int], ranks: dict[int, _Rank]) -> str:
    """Of a cycle of receives: the messages its ranks sent each other that the receives
    do not take (another tag), as "; rank 1 sent 0 tag 2, which its receive (tag 1) does
    not match" ('' if none)."""
    out = []
    for i, u in enumerate(cycle):
        v = cycle[(i + 1) % len(cycle)]
        want = next((op for op in ranks[u].pending if op["kind"] == "recv" and
                     op["peer"] == v), None)
        if want is None or int(want.get("tag", -1)) < 0:
            continue
        sent = sorted({int(op["tag"]) for op in ranks[v].ops if op["kind"] == "send" and
                       op["peer"] == u and op["state"] == "done" and
                       int(op.get("tag", -1)) != int(want["tag"])})
        if sent:
            tags = ", ".join(map(str, sent))
            out.append(f"rank {v} sent {u} tag{'s' if len(sent) > 1 else ''} {tags}, which "
                       f"its receive (tag {want['tag']}) does not match")
    return "; " + "; ".join(out) if out else ""


def report(directory: str, nranks: int | None = None,
           ended: dict[int, str] | None = None, job: str | None = None,
           bad: list[str] | None = None) -> str:
    """The diagnosis of the dumps in ``directory`` as text ('' when there are none);
    ``bad`` gets the files that are not dumps (see :func:`load`)."""
    return _text(load(directory, job, bad), nranks, ended)


def _text(docs: dict[int, dict[str, Any]], nranks: int | None = None,
          ended: dict[int, str] | None = None) -> str:
    """:func:`report` of dumps already loaded."""
    if not docs:
        return ""
    lines = diagnose(docs, nranks, ended)
    if not lines:
        lines = ["no rank was waiting for another in its last records"]
    head = f"ringlet diagnosis, from the flight recorders of {_ranks(sorted(docs))}:"
    return "\n".join([head] + [f"  {ln}" for ln in lines])


# --- ringlet diagnose ----------------------------------------------------------------------


def _check_nranks(n: int, docs: dict[int, dict[str, Any]]) -> None:
    """An ArgumentError if ``n`` < 1 or the dumps say the job had another number of ranks:
    its world communicator's size (the one whose ranks are 0..size-1), else more ranks
    than the highest that dumped."""
    if n < 1:
        raise ArgumentError(f"-n {n}: a job has at least 1 rank")
    worlds = [int(c["size"]) for d in docs.values() for c in d.get("comms", [])
              if c.get("ranks") == list(range(int(c.get("size", 0))))]
    if worlds and n != max(worlds):
        raise ArgumentError(f"-n {n}: the job's world communicator has {max(worlds)} ranks "
                            f"(its dumps say so)")
    if docs and n <= max(docs):
        raise ArgumentError(f"-n {n}: rank {max(docs)} left a dump")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", metavar="DIR",
                        help="the directory the ranks dumped their flight recorders into "
                             "(RINGLET_DUMP_DIR)")
    parser.add_argument("-n", "--nranks", type=int, default=None, metavar="N",
                        help="the job's number of ranks (default: the largest communicator "
                             "in the dumps), so that ranks without a dump are named")
    parser.add_argument("--json", action="store_true",
                        help="print every rank's records as they were dumped, as one JSON "
                             "object, after the diagnosis")


def main(args: argparse.Namespace) -> int:
    bad: list[str] = []
    docs = load(args.directory, bad=bad)
    if args.nranks is not None:
        _check_nranks(args.nranks, docs)
    text = _text(docs, args.nranks)
    for line in bad:
        print(f"ringlet diagnose: skipped {line}", file=sys.stderr)
    if not text:
        print(f"ringlet diagnose: no flight recorder dumps (rank-R.json) in {args.directory}"
              + (" that can be read" if bad else ""), file=sys.stderr)
        return 1
    print(text)
    if args.json:
        print(json.dumps({str(k): v for k, v in sorted(docs.items())}, indent=1))
    return 0
