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

from collections.abc import Callable
from typing import Any, cast

from .errors import VerificationError
from .schedule import COLLECTIVES, Buf, Kind, Ref, Schedule, Step

Value = tuple[Any, int] | None
State = dict[Buf, list[Value]]
#: Called after each round with the round's index and every rank's state (copies).
RoundHook = Callable[[int, list[State]], None]


def initial_state(s: Schedule, rank: int) -> State:
    """The spec's start condition: what ``rank`` holds before the collective."""
    c, n, root = s.collective, s.nranks, s.root
    st: State = {b: [None] * lay.nchunks for b, lay in s.layouts.items()}
    me = 1 << rank
    if c in ("all_reduce", "scan", "exscan"):
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
    if c in ("scan", "exscan"):   # exscan: rank 0 keeps its own vector
        upto = rank + 1 if c == "scan" or rank == 0 else rank
        mask = (1 << upto) - 1 if c == "scan" or rank else 1
        return {Buf.OUT: [(("x", i), mask) for i in range(out.nchunks)]}
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


def verify(s: Schedule, sizes: tuple[int, ...] | None = None,
           on_round: RoundHook | None = None) -> None:
    """Run ``s`` symbolically and raise :class:`VerificationError` unless it meets its spec.

    Also checks that every send has a matching receive of the same size
    (for several unit counts ``sizes``), that no step writes ``IN`` (nor, for
    broadcast, the root's ``OUT``, which is the root's input: ``comm.broadcast``
    takes a read-only vector there) or reads a chunk its rank does not hold,
    that no reduction counts a rank twice, and, for all-reduce, that every
    rank that ends with a chunk computed it as the same expression: the same
    association order and the same operand order (``a (op) b`` on one rank and
    ``b (op) a`` on another differ bit for bit for MIN/MAX of signed zeros and
    for NaNs with different payloads; a step's ``src_first`` flag says which
    operand goes first).

    ``on_round``, if given, is called after every round that passed its checks
    with the round's index and what each rank then holds (``ringlet show``
    draws from it).
    """
    n = s.nranks
    where = s.name
    root_in = s.root if s.collective == "broadcast" else -1
    for buf in s.layouts:
        if buf is not Buf.TMP and buf not in COLLECTIVES[s.collective]:
            raise VerificationError(f"{where}: {s.collective} has no {buf.name} buffer")
    steps = s.all_steps()
    chunks_total = max(lay.nchunks for lay in s.layouts.values())
    if sizes is None:
        sizes = (chunks_total * n * 3 + 1, chunks_total + 5, 1)
    # Every rank's chunks in one flat list: chunk i of buffer b is slot base[b] + i.
    base: dict[Buf, int] = {}
    names: list[tuple[Buf, int]] = []
    csize: list[tuple[int, ...]] = []   # slot -> its sizes at every unit count in ``sizes``
    for b, lay in s.layouts.items():
        base[b] = len(names)
        names += [(b, i) for i in range(lay.nchunks)]
        bds = [lay.bounds(m).tolist() for m in sizes]
        csize += list(zip(*([hi - lo for lo, hi in zip(bd[:-1], bd[1:], strict=True)]
                            for bd in bds), strict=True))
    state: list[list[Value]] = []
    for r in range(n):
        init = initial_state(s, r)
        state.append([v for b in s.layouts for v in init[b]])

    # The expression behind each value (all-reduce only): its shape is a rank for an
    # unreduced contribution or the id of ``left (op) right`` for two shapes (ordered:
    # the operators commute, but not bit for bit).
    track = s.collective == "all_reduce"
    shape = [[r] * len(names) for r in range(n)]
    joined: dict[tuple[int, int], int] = {}

    def join(a: int, b: int) -> int:
        key = (a, b)
        got = joined.get(key)
        if got is None:
            got = joined[key] = n + len(joined)
        return got

    in_lo = base.get(Buf.IN, 0)
    in_hi = in_lo + s.layouts[Buf.IN].nchunks if Buf.IN in s.layouts else 0
    Expanded = tuple[list[int], list[tuple[int, ...]], bool]
    expanded: dict[tuple[Ref, ...], Expanded] = {}

    def slots(r: int, rnd: int, st: Step, refs: tuple[Ref, ...]) -> Expanded:
        """The slots ``refs`` name, their sizes, and whether one is in IN (checked once
        per distinct refs, then cached)."""
        out: list[int] = []
        for b, a, e in refs:
            lay = s.layouts.get(b)
            if lay is None:
                raise VerificationError(
                    f"{where}: rank {r} round {rnd}: step '{st}' uses {b.name}, which "
                    f"this schedule does not declare")
            if not 0 <= a < e <= lay.nchunks:
                raise VerificationError(
                    f"{where}: rank {r} round {rnd}: step '{st}' names chunks {a}:{e} of "
                    f"{b.name}, which has {lay.nchunks}")
            out.extend(range(base[b] + a, base[b] + e))
        got = expanded[refs] = (out, [csize[j] for j in out],
                                any(in_lo <= j < in_hi for j in out))
        return got

    def missing(r: int, rnd: int, st: Step, sl: list[int], vals: list[Value], verb: str) -> None:
        b, i = names[sl[vals.index(None)]]
        raise VerificationError(
            f"{where}: rank {r} round {rnd}: '{st}' {verb} {b.name} chunk {i}, which rank {r} "
            f"never received")

    SEND, RECV, RRED, LRED = Kind.SEND, Kind.RECV, Kind.RRED, Kind.LRED
    Msg = tuple[list[Value], list[int], list[tuple[int, ...]], Step]
    active: list[list[int]] = [[] for _ in range(s.nrounds)]   # round -> ranks with steps
    for r in range(n):
        for rnd, todo in enumerate(steps[r]):
            if todo:
                active[rnd].append(r)
    for rnd in range(s.nrounds):
        # sends read the state at the start of the round
        outbox: dict[tuple[int, int], list[Msg]] = {}
        for r in active[rnd]:
            sr, hr = state[r], shape[r]
            for st in steps[r][rnd]:
                if st.kind is SEND:
                    if not 0 <= st.peer < n or st.peer == r:
                        raise VerificationError(
                            f"{where}: rank {r} round {rnd}: '{st}' has a bad peer")
                    sl, sz, _ = expanded.get(st.src) or slots(r, rnd, st, st.src)
                    vals = [sr[j] for j in sl]
                    if None in vals:
                        missing(r, rnd, st, sl, vals, "sends")
                    shp = [hr[j] for j in sl] if track else []
                    key = (r, st.peer)
                    if key in outbox:
                        outbox[key].append((vals, shp, sz, st))
                    else:
                        outbox[key] = [(vals, shp, sz, st)]
        for r in active[rnd]:
            sr, hr = state[r], shape[r]
            for st in steps[r][rnd]:
                kind = st.kind
                if kind is SEND:
                    continue
                sl, sz, writes_in = expanded.get(st.dst) or slots(r, rnd, st, st.dst)
                if writes_in:
                    raise VerificationError(
                        f"{where}: rank {r} round {rnd}: '{st}' writes IN, which is read-only")
                if r == root_in and any(ref[0] == Buf.OUT for ref in st.dst):
                    raise VerificationError(
                        f"{where}: rank {r} round {rnd}: '{st}' writes the root's vector, "
                        f"which is its input and may be read-only")
                if kind is RECV or kind is RRED:
                    q = outbox.get((st.peer, r))
                    if not q:
                        raise VerificationError(
                            f"{where}: rank {r} round {rnd}: '{st}' has no matching send "
                            f"from rank {st.peer}")
                    vals, shp, szs, sst = q.pop(0)
                    if szs != sz:
                        raise VerificationError(
                            f"{where}: round {rnd}: rank {st.peer} '{sst}' and rank {r} "
                            f"'{st}' move chunks of different sizes")
                else:
                    ssl, ssz, _ = expanded.get(st.src) or slots(r, rnd, st, st.src)
                    if ssz != sz:
                        raise VerificationError(
                            f"{where}: rank {r} round {rnd}: '{st}' copies between chunks of "
                            f"different sizes")
                    vals = [sr[j] for j in ssl]
                    if None in vals:
                        missing(r, rnd, st, ssl, vals, "reads")
                    shp = [hr[j] for j in ssl] if track else []
                if kind is RRED or kind is LRED:
                    for k, j in enumerate(sl):
                        cur, v = sr[j], cast(tuple[Any, int], vals[k])
                        if cur is None or cur[0] != v[0] or cur[1] & v[1]:
                            b, i = names[j]
                            if cur is None:
                                raise VerificationError(
                                    f"{where}: rank {r} round {rnd}: '{st}' reduces into "
                                    f"{b.name} chunk {i}, which holds nothing yet")
                            if cur[0] != v[0]:
                                raise VerificationError(
                                    f"{where}: rank {r} round {rnd}: '{st}' reduces {_fmt(v)} "
                                    f"into {b.name} chunk {i} holding {_fmt(cur)}: "
                                    f"different data")
                            twice = [k for k in range(n) if (cur[1] & v[1]) >> k & 1]
                            raise VerificationError(
                                f"{where}: rank {r} round {rnd}: '{st}' would count rank(s) "
                                f"{twice} twice in {b.name} chunk {i}")
                        sr[j] = (cur[0], cur[1] | v[1])
                        if track:
                            hr[j] = join(shp[k], hr[j]) if st.src_first else join(hr[j], shp[k])
                elif len(sl) == 1:
                    sr[sl[0]] = vals[0]
                    if track:
                        hr[sl[0]] = shp[0]
                else:
                    for k, j in enumerate(sl):
                        sr[j] = vals[k]
                    if track:
                        for k, j in enumerate(sl):
                            hr[j] = shp[k]
        left = {k: v for k, v in outbox.items() if v}
        if left:
            (src_rank, dst_rank), q = next(iter(left.items()))
            raise VerificationError(
                f"{where}: round {rnd}: rank {src_rank} '{q[0][3]}' is never received by "
                f"rank {dst_rank}")
        if on_round is not None:
            on_round(rnd, [{b: state[r][base[b]:base[b] + lay.nchunks]
                            for b, lay in s.layouts.items()} for r in range(n)])

    for r in range(n):
        for buf, want in expected_final(s, r).items():
            have = state[r][base[buf]:base[buf] + len(want)]
            for i, (h, w) in enumerate(zip(have, want, strict=True)):
                if h != w:
                    raise VerificationError(
                        f"{where}: at the end rank {r} {buf.name} chunk {i} holds {_fmt(h)}, "
                        f"but should hold {_fmt(w)}")
    if track:
        out = slice(base[Buf.OUT], base[Buf.OUT] + s.layouts[Buf.OUT].nchunks)
        for r in range(1, n):
            for i, (s0, sr_) in enumerate(zip(shape[0][out], shape[r][out], strict=True)):
                if s0 != sr_:
                    raise VerificationError(
                        f"{where}: at the end rank {r} OUT chunk {i} was reduced in a different "
                        f"order than on rank 0, so floating-point results would differ: "
                        f"reduce each chunk at one rank and copy it, or have partners "
                        f"compute the same expression (src_first puts the received or "
                        f"src operand on the left)")
