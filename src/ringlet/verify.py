"""Executable specs of the collectives, and a symbolic run of any schedule against them.

A symbolic value is ``(atom, mask)``: ``atom`` names a piece of logical data
(chunk ``c`` of the vector being reduced, block ``j`` of rank ``r``'s
all-to-all input...), ``mask`` is the set of ranks whose contribution it
holds, as bits.  Reducing two values needs the same atom and disjoint masks
(else a contribution would count twice).  :func:`verify` raises
:class:`~ringlet.errors.VerificationError` naming the rank, round, step and
chunk at the first thing that is wrong; it never prints and returns False.
"""

from __future__ import annotations

from typing import Any, cast

from .errors import VerificationError
from .schedule import COLLECTIVES, Buf, Kind, Ref, Schedule, Step

Value = tuple[Any, int] | None
State = dict[Buf, list[Value]]


def initial_state(s: Schedule, rank: int) -> State:
    """The spec's start condition: what ``rank`` holds before the collective."""
    c, n, root = s.collective, s.nranks, s.root
    st: State = {b: [None] * lay.nchunks for b, lay in s.layouts.items()}
    me = 1 << rank
    if c == "all_reduce":
        st[Buf.OUT] = [(("x", i), me) for i in range(s.layouts[Buf.OUT].nchunks)]
    elif c == "broadcast":
        if rank == root:
            st[Buf.OUT] = [(("x", i), me) for i in range(s.layouts[Buf.OUT].nchunks)]
    elif c in ("reduce", "reduce_scatter"):
        st[Buf.IN] = [(("x", i), me) for i in range(s.layouts[Buf.IN].nchunks)]
    elif c in ("all_gather", "gather"):
        st[Buf.IN] = [(("g", rank, p), me) for p in range(s.layouts[Buf.IN].nchunks)]
    elif c == "all_to_all":
        P = s.layouts[Buf.IN].pieces
        st[Buf.IN] = [(("a", rank, i // P, i % P), me) for i in range(n * P)]
    elif c == "scatter":
        if rank == root:
            P = s.layouts[Buf.IN].pieces
            st[Buf.IN] = [(("s", i // P, i % P), me) for i in range(n * P)]
    return st


def expected_final(s: Schedule, rank: int) -> dict[Buf, list[Value]]:
    """The spec's end condition: what ``rank`` must hold after the collective
    (buffers not named here are unconstrained)."""
    c, n, root = s.collective, s.nranks, s.root
    full = (1 << n) - 1
    out = s.layouts[Buf.OUT]
    if c == "all_reduce":
        return {Buf.OUT: [(("x", i), full) for i in range(out.nchunks)]}
    if c == "broadcast":
        return {Buf.OUT: [(("x", i), 1 << root) for i in range(out.nchunks)]}
    if c == "reduce":
        return {Buf.OUT: [(("x", i), full) for i in range(out.nchunks)]} if rank == root else {}
    if c == "reduce_scatter":
        P = out.pieces
        return {Buf.OUT: [(("x", rank * P + p), full) for p in range(P)]}
    if c == "all_gather":
        P = out.pieces
        return {Buf.OUT: [(("g", i // P, i % P), 1 << (i // P)) for i in range(n * P)]}
    if c == "gather":
        if rank != root:
            return {}
        P = out.pieces
        return {Buf.OUT: [(("g", i // P, i % P), 1 << (i // P)) for i in range(n * P)]}
    if c == "all_to_all":
        P = out.pieces
        return {Buf.OUT: [(("a", i // P, rank, i % P), 1 << (i // P)) for i in range(n * P)]}
    if c == "scatter":
        P = out.pieces
        return {Buf.OUT: [(("s", rank, p), 1 << root) for p in range(P)]}
    raise VerificationError(f"no spec for collective {c!r}")


def _fmt(v: Value) -> str:
    if v is None:
        return "nothing"
    atom, mask = v
    ranks = [i for i in range(mask.bit_length()) if mask >> i & 1]
    return f"{atom} from ranks {ranks}"


def verify(s: Schedule, sizes: tuple[int, ...] | None = None) -> None:
    """Run ``s`` symbolically and raise :class:`VerificationError` unless it meets its spec.

    Also checks that every send has a matching receive of the same size
    (for several unit counts ``sizes``), that no step writes ``IN`` or reads
    a chunk its rank does not hold, and that no reduction counts a rank twice.
    """
    n = s.nranks
    where = s.name
    for buf in s.layouts:
        if buf is not Buf.TMP and buf not in COLLECTIVES[s.collective]:
            raise VerificationError(f"{where}: {s.collective} has no {buf.name} buffer")
    state = [initial_state(s, r) for r in range(n)]
    steps = s.all_steps()
    chunks_total = max(lay.nchunks for lay in s.layouts.values())
    if sizes is None:
        sizes = (chunks_total * n * 3 + 1, chunks_total + 5, 1)
    bounds = [{b: lay.bounds(m) for b, lay in s.layouts.items()} for m in sizes]

    def chunk_list(r: int, rnd: int, st: Step, refs: tuple[Ref, ...]) -> list[tuple[Buf, int]]:
        out = []
        for b, a, e in refs:
            lay = s.layouts.get(b)
            if lay is None:
                raise VerificationError(
                    f"{where}: rank {r} round {rnd}: step '{st}' uses {b.name}, which this "
                    f"schedule does not declare")
            if not 0 <= a < e <= lay.nchunks:
                raise VerificationError(
                    f"{where}: rank {r} round {rnd}: step '{st}' names chunks {a}:{e} of "
                    f"{b.name}, which has {lay.nchunks}")
            out.extend((b, i) for i in range(a, e))
        return out

    def sizes_of(chunks: list[tuple[Buf, int]]) -> list[tuple[int, ...]]:
        return [tuple(int(bd[b][i + 1] - bd[b][i]) for bd in bounds) for b, i in chunks]

    for rnd in range(s.nrounds):
        # sends read the state at the start of the round
        outbox: dict[tuple[int, int], list[tuple[list[Value], list[tuple[int, ...]], str]]] = {}
        for r in range(n):
            for st in steps[r][rnd]:
                if st.kind is Kind.SEND:
                    if not 0 <= st.peer < n or st.peer == r:
                        raise VerificationError(
                            f"{where}: rank {r} round {rnd}: '{st}' has a bad peer")
                    ch = chunk_list(r, rnd, st, st.src)
                    vals = [state[r][b][i] for b, i in ch]
                    for (b, i), v in zip(ch, vals, strict=True):
                        if v is None:
                            raise VerificationError(
                                f"{where}: rank {r} round {rnd}: '{st}' sends {b.name} chunk "
                                f"{i}, which rank {r} never received")
                    outbox.setdefault((r, st.peer), []).append((vals, sizes_of(ch), str(st)))
        for r in range(n):
            for st in steps[r][rnd]:
                if st.kind is Kind.SEND:
                    continue
                ch = chunk_list(r, rnd, st, st.dst)
                if any(b is Buf.IN for b, _ in ch):
                    raise VerificationError(
                        f"{where}: rank {r} round {rnd}: '{st}' writes IN, which is read-only")
                if st.kind in (Kind.RECV, Kind.RRED):
                    q = outbox.get((st.peer, r))
                    if not q:
                        raise VerificationError(
                            f"{where}: rank {r} round {rnd}: '{st}' has no matching send "
                            f"from rank {st.peer}")
                    vals, szs, sdesc = q.pop(0)
                    if szs != sizes_of(ch):
                        raise VerificationError(
                            f"{where}: round {rnd}: rank {st.peer} '{sdesc}' and rank {r} "
                            f"'{st}' move chunks of different sizes")
                else:
                    src = chunk_list(r, rnd, st, st.src)
                    if sizes_of(src) != sizes_of(ch):
                        raise VerificationError(
                            f"{where}: rank {r} round {rnd}: '{st}' copies between chunks of "
                            f"different sizes")
                    vals = [state[r][b][i] for b, i in src]
                    for (b, i), v in zip(src, vals, strict=True):
                        if v is None:
                            raise VerificationError(
                                f"{where}: rank {r} round {rnd}: '{st}' reads {b.name} chunk "
                                f"{i}, which rank {r} never received")
                reducing = st.kind in (Kind.RRED, Kind.LRED)
                for (b, i), v in zip(ch, vals, strict=True):
                    if reducing:
                        cur = state[r][b][i]
                        if cur is None:
                            raise VerificationError(
                                f"{where}: rank {r} round {rnd}: '{st}' reduces into {b.name} "
                                f"chunk {i}, which holds nothing yet")
                        v = cast(tuple[Any, int], v)
                        if cur[0] != v[0]:
                            raise VerificationError(
                                f"{where}: rank {r} round {rnd}: '{st}' reduces {_fmt(v)} "
                                f"into {b.name} chunk {i} holding {_fmt(cur)}: different data")
                        if cur[1] & v[1]:
                            raise VerificationError(
                                f"{where}: rank {r} round {rnd}: '{st}' would count rank(s) "
                                f"{[k for k in range(n) if (cur[1] & v[1]) >> k & 1]} twice "
                                f"in {b.name} chunk {i}")
                        state[r][b][i] = (cur[0], cur[1] | v[1])
                    else:
                        state[r][b][i] = v
        left = {k: v for k, v in outbox.items() if v}
        if left:
            (a, b), q = next(iter(left.items()))
            raise VerificationError(
                f"{where}: round {rnd}: rank {a} '{q[0][2]}' is never received by rank {b}")

    for r in range(n):
        for buf, want in expected_final(s, r).items():
            have = state[r][buf]
            for i, (h, w) in enumerate(zip(have, want, strict=True)):
                if h != w:
                    raise VerificationError(
                        f"{where}: at the end rank {r} {buf.name} chunk {i} holds {_fmt(h)}, "
                        f"but should hold {_fmt(w)}")
