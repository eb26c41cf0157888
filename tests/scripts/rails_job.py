"""Two-level all_reduce with each RINGLET_RAILS mode, across emulated nodes (any launcher).

Checks, for the ``rails`` setting the job runs with: every element type and op
against numpy at counts around the shard cuts (0, 1, fewer elements than
shards, odd, large), all_reduce bit-identical on every rank, whether the
communicator runs the engine's all_reduce across nodes exactly when
:func:`ringlet.rails.wanted` says so, the automatic choice of the pipelined
two-level schedule from two pieces (4 MiB) and at four (8 MiB), on the rails or not,
and a sub-communicator of one rank per node (split) too.  With ``--mismatch``
(ranks started with different ``RINGLET_RAILS``): a good call with ``algorithm="ring"``, then the
hierarchical call, which must raise MismatchError naming the path on every
rank, then a good call again.  With ``--nodes-differ`` (the engine's all_reduce across
nodes): calls on which the ranks of each node agree but the nodes do not (the
count; the op, so that one node runs the rails and the other does not; a rank
that rejects its arguments), each between two good calls: a MismatchError
naming the field on every rank, the argument rejected on the rank that
rejected it, and every rank's vector as it was (its node ran the first piece's
phase 1 before the other nodes' descriptors were in: :func:`ringlet.rails.run`), and
an out-of-place call's ``out=`` as it was.
One JSON line per rank: ``{"rank", "ok", "bad", "native"}``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import sys
from collections.abc import Iterator

import numpy as np

import ringlet
from ringlet import rails
from ringlet.errors import ArgumentError, MismatchError
from ringlet.ops import DTYPES, ReduceOp


def data(rank: int, count: int, dtype: str) -> np.ndarray:
    rng = np.random.default_rng([rank, count, len(dtype)])
    if dtype.startswith("int"):
        return rng.integers(-1000, 1000, count).astype(dtype)
    return rng.normal(0, 10, count).astype(dtype)


@contextlib.contextmanager
def traced() -> Iterator[list[logging.LogRecord]]:
    """The records ringlet logs at DEBUG (RINGLET_DEBUG=TRACE) inside the block."""
    got: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            got.append(record)

    log = logging.getLogger("ringlet")
    level, keep = log.level, Keep()
    log.addHandler(keep)
    log.setLevel(logging.DEBUG)
    try:
        yield got
    finally:
        log.setLevel(level)
        log.removeHandler(keep)


def trace_faults(lines: list[logging.LogRecord], comm: ringlet.Communicator, pieces: int,
                 on_rails: bool) -> list[str]:
    """A rails call's TRACE: each piece's rounds inside the node and its engine all_reduce
    across the nodes, named by piece and phase, in the order this rank ran them."""
    if not on_rails:
        return [] if not any(hasattr(r, "rail") for r in lines) else ["a rail traced"]
    said = [re.sub(r", round \d+: .*|: the engine's.*", "", r.getMessage().split("), ", 1)[1])
            for r in lines if r.levelno == logging.DEBUG]
    want = [f"piece {p} of {pieces}, inside the node (reduce-scatter)" for p in
            range(1, pieces + 1)] + [
        w for p in range(1, pieces + 1) for w in
        (f"piece {p} of {pieces}, across the nodes",
         f"piece {p} of {pieces}, inside the node (all-gather)")]
    g, r = comm.topology.ranks_per_node, comm.rank
    rails_of = [rec.rail for rec in lines if hasattr(rec, "rail")]  # type: ignore[attr-defined]
    peers = [q for q in range(r % g, comm.size, g) if q != r]
    if [w for i, w in enumerate(said) if i == 0 or said[i - 1] != w] != want:
        return [f"trace: {said}"]
    if len(rails_of) != pieces or any(d["peers"] != peers or d["bytes"] <= 0
                                      or d["seconds"] <= 0 for d in rails_of):
        return [f"rail records: {rails_of}"]
    return []


def main() -> int:
    comm = ringlet.init()
    n, r = comm.size, comm.rank
    bad: list[str] = []
    h = hashlib.sha1()
    native_used = False
    if "--nodes-differ" in sys.argv:
        node = comm.topology.node
        cases = [("count", lambda: data(r, 100_003 + 2 * node, "float32"), "sum"),
                 ("op", lambda: data(r, 100_003, "float32"), "sum" if node == 0 else "max"),
                 ("rejected", lambda: data(r, 100_003, "float32"),
                  "bogus" if r == n - 1 else "sum")]
        for i, (what, make, op) in enumerate(cases):
            y = np.full(5, r + 1.0, np.float32)
            comm.all_reduce(y, algorithm="ring")
            x = make()
            before = x.copy()
            try:
                comm.all_reduce(x, op=op, algorithm="hierarchical_pipelined")
                bad.append(f"{what}: no error")
            except (MismatchError, ArgumentError) as exc:
                want = ArgumentError if op == "bogus" else MismatchError
                if type(exc) is not want:
                    bad.append(f"{what}: {type(exc).__name__}: {exc}")
                elif want is MismatchError and what not in str(exc) and \
                        not (what == "rejected" and "rejected" in str(exc)):
                    bad.append(f"{what}: message: {exc}")
            if not np.array_equal(x, before):
                bad.append(f"{what}: the vector changed")
            native_used |= comm._rail_group("hierarchical_pipelined", ReduceOp.SUM,
                                            DTYPES["float32"]) and i == 0
            z = np.full(5, r + 1.0, np.float32)
            comm.all_reduce(z, algorithm="ring")
            if not (y == z).all() or z[0] != n * (n + 1) / 2:
                bad.append(f"{what}: the calls around it")
        # out of place: out= is left as it was too (the copy into it waits for the nodes)
        x = data(r, 100_003 + 2 * node, "float32")
        o = np.full_like(x, -7.0)
        try:
            comm.all_reduce(x, out=o, algorithm="hierarchical_pipelined")
            bad.append("count, out=: no error")
        except MismatchError as exc:
            if "count" not in str(exc):
                bad.append(f"count, out=: message: {exc}")
        if not (o == -7.0).all():
            bad.append("count, out=: out changed")
        z = np.full(5, r + 1.0, np.float32)
        comm.all_reduce(z, algorithm="ring")
        if z[0] != n * (n + 1) / 2:
            bad.append("count, out=: the call after it")
    elif "--mismatch" in sys.argv:
        x = np.full(5, r + 1.0, np.float32)
        comm.all_reduce(x, algorithm="ring")
        try:
            comm.all_reduce(np.ones(1000, np.float32), algorithm="hierarchical")
            bad.append("different rails settings not detected")
        except MismatchError as exc:
            if "path" not in str(exc) or "RINGLET_RAILS" not in str(exc):
                bad.append(f"mismatch message: {exc}")
        y = np.full(5, r + 1.0, np.float32)
        comm.all_reduce(y, algorithm="ring")
        if not (x == y).all() or y[0] != n * (n + 1) / 2:
            bad.append("the calls around the mismatch")
    else:
        g = comm.topology.ranks_per_node
        for dtype in ("float32", "float64", "int32", "int64", "float16"):
            for op in ("sum", "avg", "max"):
                if op == "avg" and dtype.startswith("int"):
                    continue
                for count in (0, 1, 3, 1001, 100_003):
                    xs = [data(q, count, dtype) for q in range(n)]
                    x = xs[r].copy()
                    comm.all_reduce(x, op=op, algorithm="hierarchical")
                    wide = np.stack([a.astype(np.float64) for a in xs])
                    want = wide.max(0) if op == "max" else wide.sum(0) / (n if op == "avg"
                                                                          else 1)
                    tol = 0.1 if dtype == "float16" else 1e-4   # float16: 4 roundings of ~40
                    if not np.allclose(x.astype(np.float64), want, rtol=tol, atol=tol):
                        bad.append(f"{dtype} {op} {count}")
                    h.update(x.tobytes())
                    dt = DTYPES[dtype]
                    use = comm._rail_group("hierarchical", ReduceOp.parse(op), dt)
                    native_used |= use
                    if use != rails.wanted(comm.settings.rails, comm.topology.engine, True,
                                           ReduceOp.parse(op), dt):
                        bad.append(f"rails choice {dtype} {op}")
        # the automatic choice at 2 and 4 pieces (4 and 8 MiB of float32 on nodes of 2
        # ranks): the pipelined two-level schedule, on the rails (every piece in flight,
        # phase 3 of each once its rail call ends) or not
        from ringlet.algorithms.hierarchical import pipeline_pieces

        for count in (1 << 20, 1 << 21):
            big = [data(q, count, "float32") for q in range(n)]
            x = big[r].copy()
            pieces = pipeline_pieces(x.nbytes, g or 1)
            want_alg = "hierarchical_pipelined" if pieces > 1 else "hierarchical"
            got_alg = comm._choose("all_reduce", None, x.nbytes)
            if got_alg != want_alg:
                bad.append(f"automatic choice at {x.nbytes} B: {got_alg}, not {want_alg}")
            with traced() as lines:
                comm.all_reduce(x)
            bad += trace_faults(lines, comm, pieces, comm._rail_group(
                got_alg, ReduceOp.SUM, DTYPES["float32"]))
            if not np.allclose(x, np.sum(big, axis=0, dtype=np.float64), rtol=1e-4,
                               atol=1e-3):
                bad.append(f"automatic all_reduce at {x.nbytes} B")
            h.update(x.tobytes())
        if len(set(comm.all_gather_object(h.hexdigest()))) != 1:
            bad.append("all_reduce results differ between ranks")
        # one rank per node: a split communicator across nodes
        sub = comm.split(color=r % (g or 1))
        x = data(r, 999, "float32")
        sub.all_reduce(x, algorithm="hierarchical")
        every = comm.all_gather(data(r, 999, "float32")).reshape(n, 999)
        if not np.allclose(x, every[r % (g or 1)::(g or 1)].sum(0), rtol=1e-4, atol=1e-4):
            bad.append("split across nodes")
        sub.close()
    print(json.dumps({"rank": r, "ok": not bad, "bad": bad[:20], "native": native_used}),
          flush=True)
    comm.close()
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
