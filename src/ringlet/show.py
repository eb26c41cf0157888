"""``ringlet show`` draws an algorithm's schedule; ``ringlet verify`` checks algorithms.

::

    ringlet show all_reduce --algo ring -n 4
    ringlet show all_reduce --algo double_binary_tree -n 8 --png dbtree.png
    ringlet verify all --ranks 1-64

Both read the schedule the executor runs (:func:`ringlet.algorithms.build`)
and run it through the symbolic verifier (:func:`ringlet.verify.verify`).
``show`` prints, round by round, each rank's steps and what it holds after the
round (the verifier's own state), in the spirit of the seeds' diagrams::

    round 0: 4 messages (4 reduced)
      rank  sends  receives  | c0   c1   c2   c3
      0     c0->1  c3+<-3    | a    a    a    ad
      1     c1->2  c0+<-0    | ab   b    b    b

Letters are ranks' contributions (``a`` is rank 0's), ``ad`` a partial
reduction over ranks 0 and 3, and upper case marks a chunk that is complete.
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import textwrap
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .algorithms import MAX_RANKS as MOST_RANKS
from .algorithms import algorithms, build, entry, parse_params
from .errors import ArgumentError, VerificationError
from .outputs import file_name
from .progress import Progress
from .schedule import (
    COLLECTIVES,
    REDUCING,
    ROOTED,
    UNIT,
    Buf,
    Kind,
    Ref,
    Schedule,
    Step,
    check_root,
)
from .verify import State, Value, expected_final, initial_state, verify

#: How the diagrams name a buffer's chunks: ``c3`` is OUT chunk 3.
SLOT = {Buf.IN: "i", Buf.OUT: "c", Buf.TMP: "t"}

#: Ranks are letters, so a diagram has at most this many.
MAX_RANKS = 26
#: The most ranks ``ringlet verify`` takes (its symbolic state grows as ranks^2 x chunks).
MAX_VERIFY_RANKS = 1024

#: The largest vector (--count x --itemsize) whose byte counts ringlet show gives.
MAX_SHOW_BYTES = 2 ** 50

#: Widest a steps column grows before its items wrap onto more lines.
STEPS_WIDTH = 28

#: The unit count the header's byte counts are for, unless ``--count``/``--itemsize``
#: say otherwise: 2^20 elements of 4 bytes (float32).
DEFAULT_COUNT = 1 << 20
DEFAULT_ITEMSIZE = 4


# --- the trace: the verifier's state after every round ---------------------------------


@dataclass(frozen=True)
class Message:
    """One message of a round: ``src`` sends its chunks ``refs`` to ``dst``."""

    src: int
    dst: int
    refs: tuple[Ref, ...]
    reduce: bool   # the receiver reduces it into what it holds (else overwrites)


@dataclass
class Trace:
    """What every rank holds at the start and after each round, and each round's messages.

    ``error`` is the verifier's complaint, if any; ``after`` then stops at the
    last round that passed its checks.
    """

    schedule: Schedule
    start: list[State]
    after: list[list[State]] = field(default_factory=list)
    messages: list[list[Message]] = field(default_factory=list)
    error: VerificationError | None = None


def trace(s: Schedule) -> Trace:
    """Run ``s`` through :func:`ringlet.verify.verify`, recording every rank's state."""
    tr = Trace(s, [initial_state(s, r) for r in range(s.nranks)])

    def record(rnd: int, states: list[State]) -> None:
        tr.after.append(states)

    try:
        verify(s, on_round=record)
    except VerificationError as exc:
        tr.error = exc
    tr.messages = [round_messages(s, i) for i in range(len(tr.after))]
    return tr


def round_messages(s: Schedule, i: int) -> list[Message]:
    """The messages of round ``i``, each send paired with the receive that matches it
    (between two ranks, the k-th send of a round meets the k-th receive)."""
    reduces: dict[tuple[int, int], list[bool]] = {}
    for r in range(s.nranks):
        for st in s.steps(r)[i]:
            if st.kind in (Kind.RECV, Kind.RRED):
                reduces.setdefault((st.peer, r), []).append(st.kind is Kind.RRED)
    out: list[Message] = []
    seen: dict[tuple[int, int], int] = {}
    for r in range(s.nranks):
        for st in s.steps(r)[i]:
            if st.kind is Kind.SEND:
                k = seen.get((r, st.peer), 0)
                seen[(r, st.peer)] = k + 1
                kinds = reduces.get((r, st.peer), [])
                out.append(Message(r, st.peer, st.src, k < len(kinds) and kinds[k]))
    return out


# --- notation ------------------------------------------------------------------------


def _runs(xs: Sequence[int]) -> list[tuple[int, int]]:
    """Sorted distinct integers as runs ``(first, last)`` of consecutive ones."""
    runs: list[tuple[int, int]] = []
    for x in xs:
        if runs and x == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], x)
        else:
            runs.append((x, x))
    return runs


def drawable(n: int) -> None:
    """Raise unless a diagram can show ``n`` ranks (one letter each)."""
    if not 1 <= n <= MAX_RANKS:
        raise ArgumentError(
            f"-n {n}: ringlet show draws 1 to {MAX_RANKS} ranks (one letter each); check "
            f"larger runs with `ringlet verify` and cost them with `ringlet predict`")


def letter(rank: int) -> str:
    """Rank 0 is ``a``, rank 1 ``b``..."""
    return chr(ord("a") + rank)


def ranks_text(mask: int) -> str:
    """The ranks in a bit mask as letters, runs of three or more as ``a-c``: ``a-ce``."""
    ranks = [i for i in range(mask.bit_length()) if mask >> i & 1]
    parts = []
    for lo, hi in _runs(ranks):
        if hi - lo >= 2:
            parts.append(f"{letter(lo)}-{letter(hi)}")
        else:
            parts.append("".join(letter(x) for x in range(lo, hi + 1)))
    return "".join(parts)


def refs_text(refs: Sequence[Ref]) -> str:
    """Chunk ranges in the diagrams' names: ``c0``, ``c0-3``, ``c0+t2``."""
    return "+".join(f"{SLOT[b]}{a}" if e == a + 1 else f"{SLOT[b]}{a}-{e - 1}"
                    for b, a, e in refs)


def peers_text(peers: Sequence[int]) -> str:
    """Rank numbers, runs of three or more as ``1-7``: ``1,2,4-7``."""
    return ",".join(f"{lo}-{hi}" if hi - lo >= 2 else ",".join(map(str, range(lo, hi + 1)))
                    for lo, hi in _runs(sorted(set(peers))))


class Notation:
    """How a diagram of schedule ``s`` writes a chunk's content.

    A reduced chunk is the set of ranks it has contributions from (``abd``);
    other data names its origin: ``b`` (rank 1's all-gather block), ``b0``
    (rank 1's all-to-all block for rank 0), ``a2`` (root ``a``'s scatter block
    for rank 2), with ``.p`` for piece ``p`` when blocks are cut in pieces.  A
    chunk ``k`` of the vector held in TMP or in another slot than ``k`` is ``k:abd``.
    Upper case marks a chunk that is complete: reduced over every rank, or
    already what the spec wants in that slot at the end.
    """

    def __init__(self, s: Schedule) -> None:
        self.full = (1 << s.nranks) - 1
        self.reducing = s.collective in REDUCING
        self.pieces = s.pieces
        self.final = [expected_final(s, r) for r in range(s.nranks)]
        self.displaced = False   # a "k:" prefix was written (the legend then explains it)

    def _piece(self, p: int) -> str:
        return f".{p}" if self.pieces > 1 else ""

    def complete(self, v: Value, rank: int, buf: Buf, slot: int) -> bool:
        """Whether ``v`` in ``rank``'s ``buf`` chunk ``slot`` is fully reduced or final."""
        if v is None:
            return False
        if self.reducing and v[0][0] == "x" and v[1] == self.full:
            return True
        want = self.final[rank].get(buf)
        return want is not None and slot < len(want) and want[slot] == v

    def data(self, v: Value, buf: Buf, slot: int) -> str:
        """``v``'s content in lower case; ``buf`` and ``slot`` are where it sits (for the
        ``k:`` prefix)."""
        if v is None:
            return "."
        atom: tuple[Any, ...] = v[0]
        mask: int = v[1]
        kind = atom[0]
        if kind == "x":
            text = ranks_text(mask)
            if buf is Buf.TMP or atom[1] != slot:
                self.displaced = True
                return f"{atom[1]}:{text}"
            return text
        if kind == "g":
            return letter(atom[1]) + self._piece(atom[2])
        if kind == "a":
            return f"{letter(atom[1])}{atom[2]}{self._piece(atom[3])}"
        if kind == "s":
            return f"{ranks_text(mask)}{atom[1]}{self._piece(atom[2])}"
        return str(atom)

    def cell(self, v: Value, rank: int, buf: Buf, slot: int) -> str:
        """What a diagram writes for ``v`` in ``rank``'s ``buf`` chunk ``slot``."""
        text = self.data(v, buf, slot)
        return text.upper() if self.complete(v, rank, buf, slot) else text


def step_items(steps: Sequence[Step]) -> tuple[list[str], list[str]]:
    """One rank's steps of one round as (sends, receives and local steps), in the
    diagrams' notation; steps moving the same chunks to or from several peers
    are merged (``c0->1-3``)."""
    sends: dict[str, list[int]] = {}
    gets: dict[tuple[str, str], list[int]] = {}
    local: list[str] = []
    for st in steps:
        if st.kind is Kind.SEND:
            sends.setdefault(refs_text(st.src), []).append(st.peer)
        elif st.kind in (Kind.RECV, Kind.RRED):
            arrow = "<-" if st.kind is Kind.RECV else "=<-" if st.src_first else "+<-"
            gets.setdefault((refs_text(st.dst), arrow), []).append(st.peer)
        elif st.kind is Kind.LRED and st.src_first:
            d = refs_text(st.dst)
            local.append(f"{d}={refs_text(st.src)}+{d}")
        else:
            op = "+=" if st.kind is Kind.LRED else "="
            local.append(f"{refs_text(st.dst)}{op}{refs_text(st.src)}")
    out = [f"{refs}->{peers_text(p)}" for refs, p in sends.items()]
    # a reduction with the received operand first reads dst = (from peers) + dst
    into = [f"{refs}={peers_text(p)}+{refs}" if arrow == "=<-" else
            f"{refs}{arrow}{peers_text(p)}" for (refs, arrow), p in gets.items()]
    return out, into + local


# --- text ----------------------------------------------------------------------------


def _pack(items: Sequence[str], width: int) -> list[str]:
    """Items joined by spaces into lines of at most ``width`` (an item never splits)."""
    lines: list[str] = []
    cur = ""
    for it in items:
        if cur and len(cur) + 1 + len(it) > width:
            lines.append(cur)
            cur = it
        else:
            cur = f"{cur} {it}" if cur else it
    if cur:
        lines.append(cur)
    return lines or [""]


def _segments(widths: Sequence[int], first: int, rest: int) -> list[list[int]]:
    """Split columns of ``widths`` (two spaces apart) into groups: the first group fits
    in ``first`` characters, the others in ``rest``; each group has at least one column."""
    groups: list[list[int]] = [[]]
    used = 0
    for i, w in enumerate(widths):
        room = first if len(groups) == 1 else rest
        need = w if not groups[-1] else used + 2 + w
        if groups[-1] and need > room:
            groups.append([i])
            used = w
        else:
            groups[-1].append(i)
            used = need
    return groups


def _fraction(x: float) -> str:
    return f"{x:.3g}"


def _spread(values: Sequence[float], m: float) -> tuple[str, bool]:
    """The range of per-rank ``values`` in units of ``m`` (``1.5 m`` or ``0.5-1 m``), and
    whether they are all the same at that precision."""
    lo, hi = _fraction(min(values) / m), _fraction(max(values) / m)
    return (f"{hi} m", True) if lo == hi else (f"{lo}-{hi} m", False)


def _bytes(n: float) -> str:
    # imported here: importing ringlet.cost loads its cost model too
    from .cost.units import format_bytes

    return format_bytes(n)


def header(s: Schedule, count: int, itemsize: int, width: int = 120) -> list[str]:
    """The title and the alpha-beta-gamma counts of ``s`` at unit count ``count``
    (elements of ``itemsize`` bytes), wrapped to ``width``."""
    params = ", ".join(f"{k}={v}" for k, v in sorted(s.params.items()))
    root = f", root {s.root}" if s.collective in ROOTED else ""
    out = s.layouts[Buf.OUT]
    shape = f"{out.blocks} block{'s' * (out.blocks != 1)}"
    if out.pieces > 1:
        shape += f" x {out.pieces} pieces"
    title = (f"{s.collective} / {s.algorithm}{f' ({params})' if params else ''} on N={s.nranks}"
             f"{root}: {s.nrounds} round{'s' * (s.nrounds != 1)}; OUT in {out.nchunks} "
             f"chunk{'s' * (out.nchunks != 1)} ({shape})")
    c = s.counts(count, itemsize)
    m = float(count * itemsize)
    if s.nranks > 1 and c.sent.max():
        spread, same = _spread(c.sent.tolist(), m)
        most = _bytes(int(c.sent.max()))
        sent = f"each rank sends {spread}" + (f" = {most}" if same else f" (at most {most})")
    else:
        sent = "nothing is sent"
    gamma = f"reduces {_spread(c.reduced.tolist(), m)[0]}" if c.reduced.max() else \
        "no reductions"
    counts = [f"alpha: {c.rounds} round{'s' * (c.rounds != 1)} with messages",
              f"beta: {sent}", f"gamma: {gamma}"]
    lines = textwrap.wrap(title, width, subsequent_indent="  ")
    lines += ["   ".join(counts)] if len("   ".join(counts)) <= width else counts
    lines += textwrap.wrap(f"m = {count:,} elements x {itemsize} B = {_bytes(m)} "
                           f"({UNIT[s.collective]})", width, subsequent_indent="  ")
    return lines


def legend(s: Schedule, notation: Notation, width: int) -> list[str]:
    """What the letters and arrows mean, for the notation ``s``'s diagram uses."""
    n = s.nranks
    c = s.collective
    if c in REDUCING:
        if n == 1:
            data = ["a = what rank 0 contributes"]
        elif n == 2:
            data = ["a, b = what ranks 0 and 1 contribute"]
        else:
            data = [f"{ranks_text((1 << n) - 1)} = what ranks 0-{n - 1} contribute"]
        if n >= 4:
            data += ["abd = reduced over ranks 0, 1 and 3", "a-c = ranks a to c"]
        data.append("UPPER CASE = reduced over every rank")
    else:
        if c == "broadcast":
            data = [f"{letter(s.root)} = the root's data"]
        elif c in ("all_gather", "gather"):
            data = ["b = rank 1's block"]
        elif c == "all_to_all":
            data = ["b0 = rank 1's block for rank 0"]
        else:
            data = [f"{letter(s.root)}2 = the root's block for rank 2"]
        if notation.pieces > 1:
            data.append("b.1 = piece 1 of it")
        data.append("UPPER CASE = in its final place")
    data.append(". = empty")
    if notation.displaced:
        data.append("3:ab = chunk 3 of the vector, held in TMP or in another slot than its own")
    names = [f"{SLOT[b]}0 = {b.name} chunk 0" for b in (Buf.IN, Buf.OUT, Buf.TMP)
             if b in s.layouts]
    # each kind of step the schedule has, explained on its first one
    first: dict[tuple[Kind, bool], Step] = {}
    for r in range(n):
        for rnd in s.steps(r):
            for st in rnd:
                first.setdefault((st.kind, st.src_first), st)
    ops = []
    for key in [(k, f) for k in Kind for f in (False, True)]:
        if key not in first:
            continue
        one = first[key]
        d, src, p = refs_text(one.dst), refs_text(one.src), one.peer
        if key == (Kind.RRED, True):
            ops.append(f"{d}={p}+{d} = receive from rank {p} and reduce into {d}, "
                       f"the received operand first")
        elif key == (Kind.LRED, True):
            ops.append(f"{d}={src}+{d} = reduce {src} into {d}, {src} the first operand")
        else:
            ops.append({Kind.SEND: f"{src}->{p} = send {src} to rank {p}",
                        Kind.RECV: f"{d}<-{p} = receive {d} from rank {p}",
                        Kind.RRED: f"{d}+<-{p} = receive from rank {p} and reduce into {d}",
                        Kind.COPY: f"{d}={src} = copy {src} to {d}",
                        Kind.LRED: f"{d}+={src} = reduce {src} into {d}"}[key[0]])
    lines = _pack_clauses(data, width, "legend: ", " " * 8)
    lines += _pack_clauses(names + ops, width, " " * 8, " " * 8)
    return lines


def _pack_clauses(clauses: Sequence[str], width: int, first: str, rest: str) -> list[str]:
    """Clauses joined by "; " into lines of at most ``width`` (a clause splits only when
    it is too long for a line of its own, its continuation indented two more), the
    first line indented by ``first``, the others by ``rest``."""
    lines: list[str] = []
    cur = ""
    for i, cl in enumerate(clauses):
        text = cl + (";" if i < len(clauses) - 1 else "")
        indent = rest if lines else first
        if len(indent) + len(text) > width:   # a line of its own is too short: wrap it
            if cur:
                lines.append(indent + cur)
                indent = rest
            parts = textwrap.wrap(text, width - len(indent), break_long_words=False,
                                  break_on_hyphens=False)
            lines.append(indent + parts[0])
            parts = textwrap.wrap(" ".join(parts[1:]), width - len(rest) - 2,
                                  break_long_words=False, break_on_hyphens=False)
            lines += [f"{rest}  {part}" for part in parts]
            cur = ""
        elif cur and len(indent) + len(cur) + 1 + len(text) > width:
            lines.append(indent + cur)
            cur = text
        else:
            cur = f"{cur} {text}" if cur else text
    if cur:
        lines.append((rest if lines else first) + cur)
    return lines


def render(tr: Trace, width: int = 120, count: int = DEFAULT_COUNT,
           itemsize: int = DEFAULT_ITEMSIZE) -> str:
    """The text diagram of a trace: header (counts at ``count`` elements of ``itemsize``
    bytes), legend, the start, then every round; lines stay within ``width`` where
    the widest single item allows."""
    s = tr.schedule
    drawable(s.nranks)
    n = s.nranks
    note = Notation(s)
    shown: list[Buf] = [b for b in (Buf.OUT, Buf.TMP) if b in s.layouts]
    start_bufs: list[Buf] = [b for b in (Buf.IN, Buf.OUT, Buf.TMP) if b in s.layouts]

    def cells(states: list[State], bufs: list[Buf]) -> list[list[str]]:
        return [[note.cell(v, r, b, i) for b in bufs for i, v in enumerate(states[r][b])]
                for r in range(n)]

    # (the cells first: the legend explains the "k:" prefix only if one was written)
    start_cells = cells(tr.start, start_bufs)
    round_cells = [cells(st, shown) for st in tr.after]
    items = [[step_items(s.steps(r)[i]) for r in range(n)] for i in range(len(tr.after))]

    def columns(bufs: list[Buf], rows: list[list[list[str]]]) -> tuple[list[str], list[int]]:
        heads = [f"{SLOT[b]}{i}" for b in bufs for i in range(s.layouts[b].nchunks)]
        widths = [max([len(h)] + [len(t[r][j]) for t in rows for r in range(n)])
                  for j, h in enumerate(heads)]
        return heads, widths

    rank_w = max(4, len(str(n - 1)))

    def step_width(k: int, title: str) -> tuple[int, int]:
        """The column's width at most STEPS_WIDTH, and the least it can take (its title,
        its longest item)."""
        natural = max([len(title)] + [len(" ".join(it[r][k])) for it in items for r in range(n)])
        longest = max([len(title)] + [len(x) for it in items for r in range(n) for x in it[r][k]])
        return max(longest, min(natural, STEPS_WIDTH)), longest

    (send_w, send_min), (recv_w, recv_min) = step_width(0, "sends"), step_width(1, "receives")
    # a round's first line is "  rank  sends  receives  | c0 ...": narrow the steps columns
    # (wrapping more of their items) until it holds at least the first chunk's column
    first_cell = max([2] + [len(t[r][0]) for t in round_cells for r in range(n) if t[r]])
    room = width - (rank_w + 10) - first_cell
    while send_w + recv_w > room and (send_w > send_min or recv_w > recv_min):
        if send_w - send_min >= recv_w - recv_min:
            send_w -= 1
        else:
            recv_w -= 1
    lines = header(s, count, itemsize, width)
    lines += legend(s, note, width)

    def table(title: str, heads: list[str], widths: list[int], rows: list[list[str]],
              steps: list[tuple[list[str], list[str]]] | None) -> None:
        lines.append("")
        lines.append(title)
        lead = 2 + rank_w + 2 + (send_w + 2 + recv_w + 2 if steps is not None else 0)
        groups = _segments(widths, width - lead - 2, max(8, width - 2 - rank_w - 4))

        def cell_line(r: int, group: list[int]) -> str:
            return "  ".join(f"{rows[r][j]:<{widths[j]}}" for j in group).rstrip()

        for g, group in enumerate(groups):
            head_cells = "  ".join(f"{heads[j]:<{widths[j]}}" for j in group).rstrip()
            with_steps = steps is not None and g == 0
            if with_steps:
                lines.append(f"  {'rank':<{rank_w}}  {'sends':<{send_w}}  "
                             f"{'receives':<{recv_w}}  | {head_cells}")
            else:
                lines.append(f"  {'rank':<{rank_w}}  | {head_cells}")
            for r in range(n):
                if with_steps and steps is not None:
                    sent = _pack(steps[r][0], send_w)
                    got = _pack(steps[r][1], recv_w)
                    for k in range(max(len(sent), len(got))):
                        a = sent[k] if k < len(sent) else ""
                        b = got[k] if k < len(got) else ""
                        tail = cell_line(r, group) if k == 0 else ""
                        who = str(r) if k == 0 else ""
                        lines.append(f"  {who:<{rank_w}}  {a:<{send_w}}  {b:<{recv_w}}  | "
                                     f"{tail}".rstrip())
                else:
                    lines.append(f"  {r:<{rank_w}}  | {cell_line(r, group)}")

    heads, widths = columns(start_bufs, [start_cells])
    table("start", heads, widths, start_cells, None)
    heads, widths = columns(shown, round_cells) if round_cells else ([], [])
    for i, rows in enumerate(round_cells):
        msgs = tr.messages[i]
        red = sum(m.reduce for m in msgs)
        if msgs:
            what = f"{len(msgs)} message{'s' * (len(msgs) != 1)}" + (
                f" ({red} reduced)" if red else "")
        else:
            what = "local steps only" if any(s.steps(r)[i] for r in range(n)) else "idle"
        table(f"round {i}: {what}", heads, widths, rows, items[i])
    lines.append("")
    if tr.error is not None:
        lines += textwrap.wrap(f"FAILED: {tr.error}", width, subsequent_indent="  ")
    else:
        lines += textwrap.wrap(f"end: every rank holds what the {s.collective} spec requires "
                               f"(checked by ringlet.verify)", width)
    return "\n".join(lines)


# --- picture -------------------------------------------------------------------------

#: Colours of the picture (from matplotlib's tab10 and Blues/Oranges maps).
EMPTY, TRANSIT, DONE = "#ffffff", "#fdd0a2", "#2ca02c"
PARTIAL_LO, PARTIAL_HI = "#deebf7", "#3182bd"   # one rank's contribution .. all but one
REDUCE_ARROW, COPY_ARROW = "#d62728", "#1f77b4"


def _mix(lo: str, hi: str, f: float) -> tuple[float, float, float]:
    a = [int(lo[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    b = [int(hi[i:i + 2], 16) / 255 for i in (1, 3, 5)]
    return (a[0] + (b[0] - a[0]) * f, a[1] + (b[1] - a[1]) * f, a[2] + (b[2] - a[2]) * f)


def _drawing(tr: Trace) -> tuple[Schedule, int, int, Notation, list[Buf], int, int]:
    """What both drawings lay out: the schedule, ranks, rounds, notation, the buffers
    shown (OUT, TMP), their chunks, and the gap between the buffers (0 or 1 box)."""
    s = tr.schedule
    drawable(s.nranks)
    shown: list[Buf] = [b for b in (Buf.OUT, Buf.TMP) if b in s.layouts]
    return (s, s.nranks, len(tr.after), Notation(s), shown,
            sum(s.layouts[b].nchunks for b in shown), 1 if len(shown) > 1 else 0)


def draw_png(tr: Trace, path: str, count: int = DEFAULT_COUNT,
             itemsize: int = DEFAULT_ITEMSIZE) -> None:
    """Draw ``tr`` as a time-space diagram and write it to ``path`` as a PNG.

    Ranks are rows and time runs left to right.  After each round every rank's
    OUT (then TMP) chunks are a row of boxes: empty, partly reduced (darker as
    more ranks contribute) or in transit, and green once complete.  Each
    message is an arrow from its sender before the round to its receiver after
    it, labelled with the chunks it carries: red when the receiver reduces it,
    dashed blue when it overwrites.  Needs matplotlib (``pip install 'ringlet[plot]'``).
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.collections import PatchCollection
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch, Rectangle
    except ImportError:
        raise ArgumentError(
            "--png needs matplotlib, which is not installed: pip install 'ringlet[plot]'"
        ) from None
    s, n, R, note, shown, ncells, gap = _drawing(tr)
    box_w = min(0.5 / (ncells + gap), 0.12)
    strip = box_w * (ncells + gap)
    box_h = 0.36

    # Room per round grows with its messages, so that their labels stay apart.
    busiest = max([len(m) for m in tr.messages] + [1])
    width = min(max(2.5 + (1.2 + 0.05 * busiest) * max(R, 1), 7.0), 36.0)
    height = min(max(2.4 + 0.6 * n, 3.8), 20.0)
    fig = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()

    def colour(v: Value, rank: int, buf: Buf, slot: int) -> Any:
        if v is None:
            return EMPTY
        if note.complete(v, rank, buf, slot):
            return DONE
        if note.reducing and v[0][0] == "x":
            return _mix(PARTIAL_LO, PARTIAL_HI, (v[1].bit_count() - 1) / max(1, n - 1))
        return TRANSIT

    boxes: list[Rectangle] = []
    faces: list[Any] = []
    for t, states in enumerate([tr.start, *tr.after]):
        for r in range(n):
            x = t - strip / 2
            for b in shown:
                for i, v in enumerate(states[r][b]):
                    boxes.append(Rectangle((x, r - box_h / 2), box_w, box_h))
                    faces.append(colour(v, r, b, i))
                    x += box_w
                x += box_w * gap
    ax.add_collection(PatchCollection(boxes, facecolors=faces, edgecolors="#888888",
                                      linewidths=0.4, zorder=3))
    for r in range(n):
        ax.axhline(r, color="#dddddd", lw=0.8, zorder=0)

    font = 7 if R <= 24 else 6
    for t, msgs in enumerate(tr.messages):
        for m in msgs:
            x0, x1 = t + strip / 2, t + 1 - strip / 2
            col = REDUCE_ARROW if m.reduce else COPY_ARROW
            ax.annotate("", xy=(x1, m.dst), xytext=(x0, m.src), zorder=2,
                        arrowprops={"arrowstyle": "-|>", "color": col, "lw": 1.1,
                                    "shrinkA": 0, "shrinkB": 0,
                                    "linestyle": "-" if m.reduce else (0, (4, 2))})
            # Labels about a third of a row from the sender: arrows from different senders
            # start a row apart, and a pair exchanging chunks crosses at the middle, where
            # labels would collide.
            f = min(max(0.35 / abs(m.dst - m.src), 0.12), 0.35)
            ax.text(x0 + (x1 - x0) * f, m.src + (m.dst - m.src) * f, refs_text(m.refs),
                    fontsize=font, ha="center", va="center", color=col, zorder=4,
                    bbox={"boxstyle": "round,pad=0.12", "fc": "white", "ec": "none",
                          "alpha": 0.85})

    ax.set_xlim(-0.5, max(R, 1) + 0.5)
    ax.set_ylim(n - 0.5, -0.6)
    ax.set_yticks(range(n), [f"rank {r} ({letter(r)})" for r in range(n)])
    step = max(1, -(-R // 30))
    ax.set_xticks([t + 0.5 for t in range(0, R, step)], [str(t) for t in range(0, R, step)])
    ax.set_xlabel("round (boxes: what each rank holds before round 0 and after each round)")
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    chars = int(width * 12)   # what fits across the figure at 9 points
    lines = header(s, count, itemsize, width=chars)
    title = "\n".join(lines[:-1])   # the title and the counts, without the line on m
    if tr.error is not None:
        title += "\n" + "\n".join(textwrap.wrap(f"FAILED: {tr.error}", chars))
    ax.set_title(title, fontsize=9, loc="left", color="#b00000" if tr.error else "black")
    bufs = " then ".join(f"{b.name} {refs_text([(b, 0, s.layouts[b].nchunks)])}"
                         for b in shown)
    handles = [Line2D([], [], color=REDUCE_ARROW, lw=1.2, label="received and reduced"),
               Line2D([], [], color=COPY_ARROW, lw=1.2, ls=(0, (4, 2)), label="received (copy)"),
               Patch(fc=EMPTY, ec="#888888", label="empty")]
    if note.reducing:
        handles.append(Patch(fc=_mix(PARTIAL_LO, PARTIAL_HI, 0.5), ec="#888888",
                             label="partly reduced"))
        done = "reduced over every rank"
    else:
        handles.append(Patch(fc=TRANSIT, ec="#888888", label="in transit"))
        done = "in its final place"
    handles.append(Patch(fc=DONE, ec="#888888", label=done))
    ncol = len(handles) if width >= 9 else 3
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8,
               frameon=False, title=f"boxes, left to right: {bufs}", title_fontsize=8)
    legend_rows = -(-len(handles) // ncol)
    fig.tight_layout(rect=(0, (0.4 + 0.18 * legend_rows) / height, 1, 1))
    try:
        fig.savefig(path)
    except OSError as exc:
        raise ArgumentError(f"--png {path!r}: cannot write it: {exc.strerror or exc}") from None


def _hex(rgb: tuple[float, float, float]) -> str:
    return "#" + "".join(f"{round(255 * c):02x}" for c in rgb)


def draw_svg(tr: Trace, count: int = DEFAULT_COUNT, itemsize: int = DEFAULT_ITEMSIZE,
             ident: str = "") -> str:
    """Draw ``tr`` as the time-space diagram of :func:`draw_png`, as an SVG element
    (text, no dependency): ranks are rows, time runs left to right, each rank's
    chunks after every round are a row of boxes and every message an arrow
    labelled with its chunks (red: reduced into the receiver's, dashed blue: copied).
    Each box and arrow has a tooltip (its chunk's content, in the text diagram's notation).
    ``ident`` starts its element ids (its arrowheads'): one page's diagrams need their own.
    """
    from html import escape

    s, n, R, note, shown, ncells, gap = _drawing(tr)
    busiest = max([len(m) for m in tr.messages] + [1])
    col = max(70.0, min(220.0, 40.0 + 9.0 * busiest), 14.0 * (ncells + gap) + 50)
    box_w = min(12.0, (col - 40.0) / (ncells + gap))
    strip = box_w * (ncells + gap)
    box_h, row_h = 16.0, 46.0
    left = 84.0 + strip / 2
    title = header(s, count, itemsize, width=max(60, int((left + col * (R + 1)) / 6.5)))
    if tr.error is not None:
        title += textwrap.wrap(f"FAILED: {tr.error}", 100)
    top = 18.0 * len(title) + 16.0
    width = left + col * (max(R, 1) + 0.5)
    height = top + row_h * n + 70.0

    def x(t: float) -> float:
        return left + col * t

    def y(r: float) -> float:
        return top + row_h * (r + 0.5)

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="schedule" '
           f'viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" '
           f'height="{height:.0f}" font-family="sans-serif" font-size="11">',
           '<defs>' + "".join(
               f'<marker id="{ident}ah-{k}" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
               f'markerHeight="7" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" '
               f'fill="{c}"/></marker>' for k, c in (("r", REDUCE_ARROW), ("c", COPY_ARROW)))
           + '</defs>']
    for i, line in enumerate(title):
        ink = "#b00000" if tr.error is not None and line.startswith("FAILED") else "#000"
        out.append(f'<text x="8" y="{18 + 18 * i}" font-size="{13 if i == 0 else 11}" '
                   f'fill="{ink}" xml:space="preserve">{escape(line)}</text>')
    for r in range(n):
        out.append(f'<line x1="{left - 6}" x2="{width - 4:.0f}" y1="{y(r):.1f}" '
                   f'y2="{y(r):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - strip / 2 - 8:.1f}" y="{y(r) + 4:.1f}" '
                   f'text-anchor="end">rank {r} '
                   f'({letter(r)})</text>')
    step = max(1, -(-R // 30))
    for t in range(0, R, step):
        out.append(f'<text x="{x(t + 0.5):.1f}" y="{top + row_h * n + 14:.1f}" '
                   f'text-anchor="middle" fill="#555">{t}</text>')
    out.append(f'<text x="{left}" y="{top + row_h * n + 32:.1f}" fill="#555">round (boxes: '
               f'what each rank holds before round 0 and after each round)</text>')

    def colour(v: Value, rank: int, buf: Buf, slot: int) -> str:
        if v is None:
            return EMPTY
        if note.complete(v, rank, buf, slot):
            return DONE
        if note.reducing and v[0][0] == "x":
            return _hex(_mix(PARTIAL_LO, PARTIAL_HI, (v[1].bit_count() - 1) / max(1, n - 1)))
        return TRANSIT

    for t, states in enumerate([tr.start, *tr.after]):
        for r in range(n):
            bx = x(t) - strip / 2
            for b in shown:
                for i, v in enumerate(states[r][b]):
                    tip = f"rank {r}, {SLOT[b]}{i}: {note.cell(v, r, b, i)}"
                    out.append(f'<rect x="{bx:.1f}" y="{y(r) - box_h / 2:.1f}" '
                               f'width="{box_w:.1f}" height="{box_h}" '
                               f'fill="{colour(v, r, b, i)}" stroke="#888" stroke-width="0.5">'
                               f'<title>{escape(tip)}</title></rect>')
                    bx += box_w
                bx += box_w * gap
    for t, msgs in enumerate(tr.messages):
        for m in msgs:
            x0, x1 = x(t) + strip / 2, x(t + 1) - strip / 2
            c, k = (REDUCE_ARROW, "r") if m.reduce else (COPY_ARROW, "c")
            dash = "" if m.reduce else ' stroke-dasharray="5,3"'
            label = refs_text(m.refs)
            tip = (f"round {t}: rank {m.src} sends {label} to rank {m.dst}, "
                   + ("reduced into what it holds" if m.reduce else "copied"))
            out.append(f'<line x1="{x0:.1f}" y1="{y(m.src):.1f}" x2="{x1:.1f}" '
                       f'y2="{y(m.dst):.1f}" stroke="{c}" stroke-width="1.3"{dash} '
                       f'marker-end="url(#{ident}ah-{k})"><title>{escape(tip)}</title></line>')
            f = min(max(0.35 / abs(m.dst - m.src), 0.12), 0.35) if m.dst != m.src else 0.3
            lx, ly = x0 + (x1 - x0) * f, y(m.src) + (y(m.dst) - y(m.src)) * f
            out.append(f'<text x="{lx:.1f}" y="{ly + 3.5:.1f}" text-anchor="middle" '
                       f'font-size="10" fill="{c}" stroke="#fff" stroke-width="3" '
                       f'paint-order="stroke">{escape(label)}</text>')
    # legend
    items = [(REDUCE_ARROW, "line", "received and reduced"),
             (COPY_ARROW, "dash", "received (copy)"), (EMPTY, "box", "empty")]
    if note.reducing:
        items.append((_hex(_mix(PARTIAL_LO, PARTIAL_HI, 0.5)), "box", "partly reduced"))
        items.append((DONE, "box", "reduced over every rank"))
    else:
        items += [(TRANSIT, "box", "in transit"), (DONE, "box", "in its final place")]
    lx, ly = left, top + row_h * n + 54
    for c, kind, text in items:
        if kind == "box":
            out.append(f'<rect x="{lx}" y="{ly - 9}" width="12" height="12" fill="{c}" '
                       f'stroke="#888" stroke-width="0.5"/>')
        else:
            dash = ' stroke-dasharray="5,3"' if kind == "dash" else ""
            out.append(f'<line x1="{lx}" y1="{ly - 3}" x2="{lx + 14}" y2="{ly - 3}" '
                       f'stroke="{c}" stroke-width="1.5"{dash}/>')
        out.append(f'<text x="{lx + 18}" y="{ly + 1}">{escape(text)}</text>')
        lx += 26 + 6.2 * len(text)
    out.append("</svg>")
    return "\n".join(out)


# --- ringlet show --------------------------------------------------------------------


#: The most pieces ``ringlet show`` draws and ``ringlet verify`` checks: a schedule's
#: steps grow with them (hierarchical_pipelined on 4 ranks: 1.3 s at 100 pieces, 104 s
#: and 1.2 GB at 1,000), and more pieces repeat the same pattern.
MAX_PIECES = 64


#: The most cells (ranks x rounds x chunks) ``ringlet show`` draws: its text grows by about
#: 8 bytes and 11 us a cell (all_reduce ring on 26 ranks: 33,800 cells at 1 piece, 0.3 s;
#: 540,800 at 4 pieces, 6 s and 4.7 MB; at 16 pieces 78 s and 72 MB).
MAX_SHOW_CELLS = 600_000
#: The most state ``ringlet verify`` keeps and steps it runs for one world size: ranks x
#: chunks and ranks x rounds (all_reduce ring at 1,024 ranks: 2^20 and 2,095,104, 54 s; at
#: 128 ranks with 64 pieces all_gather ring has 2^20 too, 31 s and 680 MB).
MAX_VERIFY_STATE = 1 << 20
MAX_VERIFY_STEPS = 1 << 21


def _chunks(s: Schedule) -> int:
    return max((lay.nchunks for lay in s.layouts.values()), default=1)


def _drawable_size(s: Schedule) -> None:
    """Raise unless ``ringlet show`` can draw ``s`` in seconds (:data:`MAX_SHOW_CELLS`)."""
    cells = s.nranks * s.nrounds * _chunks(s)
    if cells > MAX_SHOW_CELLS:
        raise ArgumentError(
            f"{s.collective}/{s.algorithm} on {s.nranks} ranks"
            f"{' with ' + ', '.join(f'{k}={v}' for k, v in s.params.items()) if s.params else ''}"
            f": {s.nranks} ranks x {s.nrounds} rounds x {_chunks(s)} chunks is {cells:,} cells "
            f"to draw, more than {MAX_SHOW_CELLS:,} (minutes and tens of MB of text); draw "
            f"fewer ranks or pieces (the pattern repeats), or check it with `ringlet verify`")


def _verifiable_size(s: Schedule) -> None:
    """Raise unless ``ringlet verify`` can check ``s`` (:data:`MAX_VERIFY_STATE`, steps)."""
    state, steps = s.nranks * _chunks(s), s.nranks * s.nrounds
    if state > MAX_VERIFY_STATE or steps > MAX_VERIFY_STEPS:
        raise ArgumentError(
            f"{s.collective}/{s.algorithm} on {s.nranks} ranks"
            f"{' with ' + ', '.join(f'{k}={v}' for k, v in s.params.items()) if s.params else ''}"
            f": {state:,} chunks of state and {steps:,} steps, more than the {MAX_VERIFY_STATE:,} "
            f"and {MAX_VERIFY_STEPS:,} ringlet verify takes (memory grows with the state); give "
            f"fewer ranks or pieces")


def _few_pieces(params: dict[str, int]) -> dict[str, int]:
    k = params.get("pieces", 1)
    if k > MAX_PIECES:
        raise ArgumentError(f"pieces={k}: at most {MAX_PIECES} here (more pieces repeat the "
                            f"same pattern; ringlet predict takes more)")
    return params


def _collective(name: str) -> str:
    if name not in COLLECTIVES:
        raise ArgumentError(
            f"unknown collective {name!r}; use one of {', '.join(COLLECTIVES)}")
    return name


def _default_width() -> int:
    return max(60, min(120, shutil.get_terminal_size((120, 24)).columns))


def configure_show(p: argparse.ArgumentParser) -> None:
    """Add ``ringlet show``'s options."""
    p.description = textwrap.fill(
        "Draw an algorithm's schedule round by round: who sends which chunk to whom and "
        "what each rank holds after the round, from the very schedule the executor runs, "
        "as the symbolic verifier sees it. Example: ringlet show all_reduce --algo ring -n 4",
        100)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("collective", metavar="COLLECTIVE", help=", ".join(COLLECTIVES))
    p.add_argument("--algo", "--algorithm", dest="algo", metavar="NAME",
                   help="the algorithm; without it, ringlet show lists the collective's")
    p.add_argument("-n", "--ranks", dest="ranks", type=int, default=4, metavar="N",
                   help=f"number of ranks, 1-{MAX_RANKS} (default 4)")
    p.add_argument("--root", type=int, default=0, metavar="R",
                   help="root rank of broadcast, reduce, scatter, gather (default 0)")
    p.add_argument("--pieces", type=int, metavar="K",
                   help="pieces per block, for the pipelined algorithms")
    p.add_argument("--param", action="append", metavar="NAME=INT",
                   help="an algorithm parameter, e.g. --param group=2 (repeatable)")
    p.add_argument("--count", type=int, default=DEFAULT_COUNT, metavar="M",
                   help=f"unit count m in elements, for the header's byte counts "
                        f"(default {DEFAULT_COUNT})")
    p.add_argument("--itemsize", type=int, default=DEFAULT_ITEMSIZE, metavar="B",
                   help=f"bytes per element (default {DEFAULT_ITEMSIZE})")
    p.add_argument("--width", type=int, metavar="COLS",
                   help="wrap to this many columns (default: the terminal's, at most 120)")
    p.add_argument("--png", metavar="FILE", type=file_name,
                   help="also draw a time-space diagram to FILE (needs matplotlib: "
                        "pip install 'ringlet[plot]')")


def main_show(args: argparse.Namespace) -> int:
    """Run ``ringlet show``: 0 if the schedule verifies, 1 (after drawing it) if not.

    An uneven form (``all_to_all_v``...) draws the even collective's schedule it runs,
    after checking that the algorithm keeps every block in places of its own size."""
    from .algorithms import UNEVEN

    uneven = args.collective if args.collective in UNEVEN else None
    collective = UNEVEN[uneven] if uneven else _collective(args.collective)
    if not args.algo:   # the list to choose from
        names = algorithms(uneven or collective)
        w = max(len(a) for a in names)
        print(f"{uneven or collective}: {len(names)} algorithms (draw one: ringlet show "
              f"{uneven or collective} --algo NAME -n N)")
        for a in names:
            print(f"  {a:<{w}}  {entry(collective, a).doc}")
        return 0
    n = args.ranks
    drawable(n)
    check_root(collective, args.root)
    if args.count < 1 or args.itemsize < 1:
        raise ArgumentError(
            f"--count {args.count} --itemsize {args.itemsize}: both must be >= 1")
    if args.count * args.itemsize > MAX_SHOW_BYTES:
        # the header's counts are int64 arithmetic: beyond this they wrap around
        raise ArgumentError(
            f"--count {args.count} --itemsize {args.itemsize}: at most "
            f"{MAX_SHOW_BYTES:,} bytes (1 PiB) in all")
    width = args.width if args.width is not None else _default_width()
    if width < 40:
        raise ArgumentError(f"--width {width}: give at least 40 columns")
    s = build(collective, args.algo, n, args.root,
              **_few_pieces(parse_params(args.param, args.pieces)))
    _drawable_size(s)
    if uneven:
        from .uneven import uneven_ok

        why = uneven_ok(s)
        if why is not None:
            raise ArgumentError(f"{args.algo} cannot run {uneven} (blocks of different "
                                f"sizes): {why}")
    if args.png:
        from .outputs import FIGURE_SUFFIXES, check_file

        check_file(args.png, "--png", FIGURE_SUFFIXES)
    tr = trace(s)
    text = render(tr, width, args.count, args.itemsize)
    if args.png:   # before printing, so that a missing matplotlib is all the output
        draw_png(tr, args.png, args.count, args.itemsize)
    print(text)
    if uneven:
        print(f"\n{uneven} runs this schedule with each block cut at the call's own sizes "
              f"(rank q's rows where block q is); every block stays in places of its owner's "
              f"size, round by round (checked)")
    if args.png:
        print(f"wrote {args.png}")
    return 1 if tr.error is not None else 0


# --- ringlet verify ------------------------------------------------------------------


def parse_ranks(text: str) -> list[int]:
    """World sizes from ``1-64``, ``1,2,3,17`` or ``1-8,12,16``, sorted and distinct."""
    out: set[int] = set()
    for part in text.split(","):
        lo, dash, hi = part.strip().partition("-")
        try:
            a = int(lo)
            b = int(hi) if dash else a
        except ValueError:
            raise ArgumentError(
                f"--ranks {text!r}: write sizes and ranges, e.g. 1-64 or 1,2,3,17") from None
        if a < 1 or b < a:
            raise ArgumentError(
                f"--ranks {text!r}: {part.strip()!r} is not a range of sizes >= 1")
        if b > MAX_VERIFY_RANKS:
            raise ArgumentError(
                f"--ranks {text!r}: at most {MAX_VERIFY_RANKS:,} ranks: the symbolic run "
                f"keeps which ranks each chunk holds on every rank, so its time and memory "
                f"grow as ranks^2 x chunks (a ring all_reduce at 1,024 ranks: about a minute "
                f"and 1.7 GB); ringlet simulate runs a schedule at up to {MOST_RANKS:,}")
        out.update(range(a, b + 1))
    return sorted(out)


@dataclass
class Outcome:
    """``ringlet verify``'s result for one algorithm of one collective."""

    collective: str
    algorithm: str
    params: dict[str, int]
    checked: list[int] = field(default_factory=list)      # world sizes that verified
    skipped: dict[int, str] = field(default_factory=dict)  # size -> why it does not apply
    failed: VerificationError | None = None
    failed_at: int = 0
    seconds: float = 0.0


def check(collective: str, algorithm: str, sizes: Sequence[int], root: int | None,
          params: dict[str, int], progress: Callable[[int], None] | None = None) -> Outcome:
    """Verify ``algorithm`` at every size (every root if ``root`` is None), stopping at the
    first failure; sizes where it does not apply (a root out of range, a parameter
    that does not fit) are skipped with the reason.  ``progress(n)`` is called before
    each size ``n``."""
    out = Outcome(collective, algorithm, params)
    t0 = time.perf_counter()
    for n in sizes:
        if progress is not None:
            progress(n)
        if collective in ROOTED:
            roots = list(range(n)) if root is None else [root]
        else:
            roots = [0]
        try:
            for r in roots:
                verify(build(collective, algorithm, n, r, **params))
        except ArgumentError as exc:
            out.skipped[n] = str(exc)
            continue
        except VerificationError as exc:
            out.failed, out.failed_at = exc, n
            break
        out.checked.append(n)
    out.seconds = time.perf_counter() - t0
    return out


def _stepper(bar: Progress, what: str) -> Callable[[int], None]:
    return lambda n: bar.step(f"{what} N={n}")


def _sizes_text(sizes: Sequence[int]) -> str:
    return ",".join(f"{lo}-{hi}" if hi > lo else str(lo) for lo, hi in _runs(sorted(sizes)))


def configure_verify(p: argparse.ArgumentParser) -> None:
    """Add ``ringlet verify``'s options."""
    p.description = textwrap.fill(
        "Check algorithms symbolically against their collective's spec for a range of world "
        "sizes: every step reads only what its rank holds, every send meets a receive, no "
        "rank is counted twice, and every rank ends with what it must. "
        "Example: ringlet verify all_reduce --algo all --ranks 1-64", 100)
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("collective", nargs="?", default="all", metavar="COLLECTIVE",
                   help=f"{', '.join(COLLECTIVES)} or all (default)")
    p.add_argument("--algo", "--algorithm", dest="algo", default="all", metavar="NAME",
                   help="an algorithm, or all (default)")
    p.add_argument("--ranks", default="1-16", metavar="SIZES",
                   help="world sizes: 1-64, 1,2,3,17 or a mix (default 1-16)")
    p.add_argument("--root", default="0", metavar="R",
                   help="root of the rooted collectives, or all for every root (default 0)")
    p.add_argument("--pieces", type=int, metavar="K",
                   help="pieces per block, for the algorithms that take it")
    p.add_argument("--param", action="append", metavar="NAME=INT",
                   help="an algorithm parameter, e.g. --param group=2, for the algorithms "
                        "that take it (repeatable)")


def main_verify(args: argparse.Namespace) -> int:
    """Run ``ringlet verify``: print a pass table; 1 and the failures if any failed."""
    collectives = list(COLLECTIVES) if args.collective == "all" else [
        _collective(args.collective)]
    sizes = parse_ranks(args.ranks)
    root: int | None
    if args.root == "all":
        root = None
    else:
        try:
            root = int(args.root)
        except ValueError:
            raise ArgumentError(f"--root {args.root!r}: give a rank or all") from None
        if root < 0:
            raise ArgumentError(f"--root {root}: a rank is >= 0")
        if root >= sizes[-1]:
            raise ArgumentError(f"--root {root} is out of range at every size given (the "
                                f"largest is {sizes[-1]} ranks: 0..{sizes[-1] - 1})")
    if root and not any(c in ROOTED for c in collectives):
        raise ArgumentError(f"--root {root}: {collectives[0]} has no root; only "
                            f"{', '.join(sorted(ROOTED))} do")
    params = _few_pieces(parse_params(args.param, args.pieces))

    cases: list[tuple[str, str, dict[str, int]]] = []
    for c in collectives:
        if args.algo == "all":
            names = algorithms(c)
        else:
            try:
                names = [entry(c, args.algo).name]
            except ArgumentError:
                if len(collectives) == 1:
                    raise
                continue   # `verify all --algo ring`: the collectives that have a ring
        for name in names:
            takes = entry(c, name).params
            unknown = sorted(set(params) - set(takes))
            if args.algo != "all" and len(collectives) == 1 and unknown:
                raise ArgumentError(f"{c}/{name} takes no parameter(s) {unknown}; it takes "
                                    f"{sorted(takes) or 'none'}")
            mine = ({k: v for k, v in params.items() if k in takes} if args.algo == "all"
                    else params)
            cases.append((c, name, mine))
    if not cases:
        raise ArgumentError(f"no collective has an algorithm {args.algo!r}")
    for c, name, p in cases:   # what the largest size would take, before any runs
        try:
            big = build(c, name, sizes[-1], root or 0, **p)
        except ArgumentError:
            continue   # n/a there: said in the run
        _verifiable_size(big)
    unused = sorted(set(params) - {k for _, _, p in cases for k in p})
    if unused:
        raise ArgumentError(f"no selected algorithm takes parameter(s) {unused}")

    row = "{:<15} {:<19} {:<16} {:<10} {:>6} {:>8}  {}"
    print(row.format("collective", "algorithm", "params", "N", "checks", "time", "result"))
    outcomes: list[Outcome] = []
    t0 = time.perf_counter()
    bar = Progress(len(cases) * len(sizes), "ringlet verify", "checks")
    for i, (c, name, p) in enumerate(cases):
        o = check(c, name, sizes, root, p, _stepper(bar, f"{c} {name}"))
        bar.done = (i + 1) * len(sizes)    # with the sizes skipped after a failure
        bar.close()                        # the row takes the bar's line
        outcomes.append(o)
        if o.failed is not None:
            result = f"FAIL at N={o.failed_at}"
        else:
            result = "ok" + (f", {len(o.skipped)} sizes n/a" if o.skipped else "")
        used = {**entry(c, name).params, **p}
        ptext = ",".join(f"{k}={v}" for k, v in sorted(used.items())) or "-"
        print(row.format(c, name, ptext, _sizes_text(o.checked) or "-", len(o.checked),
                         f"{o.seconds:.2f} s", result), flush=True)
    failed = [o for o in outcomes if o.failed is not None]
    total = sum(len(o.checked) for o in outcomes)
    roots = " (every root)" if root is None else (f" (root {root})" if root else "")
    print(f"{len(outcomes)} algorithm{'s' * (len(outcomes) != 1)}, {total} world sizes "
          f"verified{roots}, {len(failed)} failed, in {time.perf_counter() - t0:.2f} s")
    for o in outcomes:
        by_reason: dict[str, list[int]] = {}
        for n, why in o.skipped.items():   # one line per reason, its sizes
            by_reason.setdefault(_general(why.split("; ")[0], n), []).append(n)
        reasons = list(by_reason.items())
        for why, ns in reasons[:NA_LINES]:
            print(f"n/a: {o.collective}/{o.algorithm} at N={_sizes_text(ns)}: {why}")
        if len(reasons) > NA_LINES:
            rest = sorted(n for _, ns in reasons[NA_LINES:] for n in ns)
            print(f"n/a: {o.collective}/{o.algorithm} at N={_sizes_text(rest)}: "
                  f"{len(reasons) - NA_LINES} more reason"
                  f"{'s' * (len(reasons) - NA_LINES != 1)} (ringlet verify at one of them "
                  f"says why)")
    for o in failed:
        print(f"FAILED {o.collective}/{o.algorithm} at N={o.failed_at}: {o.failed}",
              file=sys.stderr)
    if not total and not failed:
        print("nothing was verified: no algorithm applies at the sizes given (n/a above)",
              file=sys.stderr)
        return 1
    return 1 if failed else 0


#: Lines of reasons ``ringlet verify`` prints per algorithm for the sizes it skipped.
NA_LINES = 3


def _general(reason: str, n: int) -> str:
    """A reason an algorithm does not apply at ``n`` ranks (its first clause), with its
    number of ranks written as N, so that sizes skipped for the same reason share a line."""
    return re.sub(rf"\b{n} ranks\b", "N ranks", reason)

