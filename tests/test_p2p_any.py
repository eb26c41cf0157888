"""Receiving from any source and with any tag, probe and iprobe, batch_isend_irecv:
matching order (first posted receive, first arrived message), the status of what
arrived, and bad arguments."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import ringlet
from ringlet import ANY_SOURCE, ANY_TAG


def _gather_any(comm: ringlet.Communicator) -> list[str]:
    """Rank 0 receives one message from every other rank, in whatever order they come."""
    n, r = comm.size, comm.rank
    bad = []
    if r == 0:
        seen = set()
        for _ in range(n - 1):
            st = comm.probe()
            if st.tag != 10 + st.source or st.count != 3 or st.dtype != "int64":
                bad.append(f"probe {st}")
            x = np.empty(3, np.int64)
            w = comm.irecv(x, ANY_SOURCE, ANY_TAG)
            w.wait()
            if w.source != st.source or w.tag != st.tag or x.tolist() != [w.source] * 3:
                bad.append(f"recv from {w.source} tag {w.tag}: {x}")
            seen.add(w.source)
        if seen != set(range(1, n)):
            bad.append(f"sources {seen}")
        if comm.iprobe() is not None:
            bad.append("iprobe found a message after all were taken")
    else:
        comm.send(np.full(3, r, np.int64), 0, tag=10 + r)
    comm.barrier()
    return bad


def _order(comm: ringlet.Communicator) -> list[str]:
    """Messages from one source in order; a specific receive posted before an any-source
    one takes the first message it matches, the any-source one the first of the rest
    (the same whenever the messages arrive)."""
    r = comm.rank
    bad = []
    if r == 1:
        works = [comm.isend(np.array([k], np.int32), 0, tag=7 if k % 2 else 5)
                 for k in range(4)]
        for w in works:
            w.wait()
    elif r == 0:
        a, b = np.empty(1, np.int32), np.empty(1, np.int32)
        wa = comm.irecv(a, 1, 7)                 # posted first: takes k=1
        wb = comm.irecv(b, ANY_SOURCE, ANY_TAG)  # the first of the rest: k=0
        wa.wait(), wb.wait()
        rest = [comm.recv(np.empty(1, np.int32), ANY_SOURCE, ANY_TAG)[0] for _ in range(2)]
        if (a[0], b[0], rest) != (1, 0, [2, 3]) or wb.tag != 5 or wa.source != 1:
            bad.append(f"order a={a[0]} b={b[0]} rest={rest} tag {wb.tag}")
    comm.barrier()
    return bad


def _batch(comm: ringlet.Communicator) -> list[str]:
    n, r = comm.size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    x, y = np.full(5, float(r)), np.empty(5)
    works = comm.batch_isend_irecv([("recv", y, left, 3), ("send", x, right, 3)])
    for w in works:
        w.wait()
    return [] if y.tolist() == [float(left)] * 5 and works[0].source == left else [str(y)]


@pytest.mark.parametrize("body", [_gather_any, _batch])
def test_any_source_probe_and_batch(world: Any, body: Any) -> None:
    for r, bad in enumerate(world.run(body)):
        assert not bad, f"rank {r}: {bad}"


def test_matching_order() -> None:
    from conftest import get_world

    for r, bad in enumerate(get_world(3).run(_order)):
        assert not bad, f"rank {r}: {bad}"


def _bad(comm: ringlet.Communicator) -> list[str]:
    out = []
    for fn in (lambda: comm.send(np.ones(1), ANY_SOURCE),
               lambda: comm.isend(np.ones(1), 0, ANY_TAG),
               lambda: comm.probe(comm.size),
               lambda: comm.batch_isend_irecv([("put", np.ones(1), 0)]),
               lambda: comm.batch_isend_irecv([("recv", np.ones(1), 0, -5)])):
        try:
            fn()
        except ringlet.ArgumentError as exc:
            out.append(str(exc))
        else:
            out.append("")
    return out


def test_bad_arguments() -> None:
    from conftest import get_world

    msgs = get_world(2).run(_bad)[0]
    assert "not a rank" in msgs[0] and "ANY_SOURCE" not in msgs[0]
    assert "tag must be an int >= 0, got -1" in msgs[1]
    assert "or ringlet.ANY_SOURCE" in msgs[2]
    assert "must be (" in msgs[3]
    assert "or ringlet.ANY_TAG, got -5" in msgs[4]
