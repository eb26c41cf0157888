"""The fused shared-memory paths (one-shot and staged direct) against numpy.

A world with tiny post and stage areas makes every size here cross the
thresholds: messages that fit the post area or not, one piece or many,
pieces that end mid-block, odd counts, every dtype.  The generic executor
running the same schedules is the reference for bit-for-bit equality where
the reduction order is the same.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from oracle import close, make
from test_collectives import digest, valid_ops
from world import World

import ringlet
from ringlet.config import Settings
from ringlet.ops import DTYPES, ReduceOp, reference_reduce
from ringlet.transport import cma

SMALL = Settings(timeout=60.0, shm_post_bytes=4096, shm_stage_bytes=8192, shm_piece_bytes=4096,
                 cma_bytes=64 << 10)
#: blocks from this size are read in one copy in the SMALL world (cross-memory attach)
CMA_MIN_BYTES = SMALL.cma_bytes
SIZES_N = [1, 2, 3, 4, 5, 8]
#: element counts around the thresholds for 4- and 8-byte elements: the post area
#: (4 KiB), one piece, one stage half (8 KiB), many pieces, odd remainders
COUNTS = [1, 3, 511, 512, 1023, 1024, 1025, 2047, 2048, 2049, 6001]

_worlds: dict[int, World] = {}


@pytest.fixture(params=SIZES_N, ids=lambda n: f"N{n}")
def small(request: pytest.FixtureRequest) -> Any:
    n = request.param
    if n not in _worlds:
        _worlds[n] = World(n, SMALL)
    yield _worlds[n]


@pytest.fixture(scope="module", autouse=True)
def _close() -> Any:
    yield
    for w in _worlds.values():
        w.close()
    _worlds.clear()


def _fused_all_reduce(comm: ringlet.Communicator) -> list[Any]:
    n, r = comm.size, comm.rank
    bad, digests = [], []
    for algo in ("oneshot", "direct"):
        for dtype in ("float32", "float64", "int32", "uint8", "complex64", "float16", "bool"):
            for op in valid_ops(dtype):
                for count in COUNTS:
                    mine = make(dtype, count, r, op, salt=3)
                    x = mine.copy()
                    out = np.empty_like(x) if count % 2 else None
                    res = comm.all_reduce(x, op=op, out=out, algorithm=algo)
                    # rank 0 checks the sum; every rank's bits are compared with its own
                    # (on 2 cores, every rank computing the reference took most of the time)
                    if r == 0:
                        ref = reference_reduce(np.stack(
                            [make(dtype, count, q, op, salt=3) for q in range(n)]), op)
                        if not close(res, ref):
                            bad.append(f"{algo} {dtype} {op.name} count {count}: {res[:3]} "
                                       f"!= {ref[:3]}")
                    if out is not None and not np.array_equal(x, mine):
                        bad.append(f"{algo} {dtype} {op.name} count {count}: x changed")
                    digests.append(digest(res))
    return [bad[:8], digests]


def test_fused_all_reduce_every_threshold(small: World) -> None:
    res = small.run(_fused_all_reduce)
    for r, (bad, _) in enumerate(res):
        assert not bad, f"rank {r}: " + "\n".join(bad)
    for r, (_, d) in enumerate(res):
        assert d == res[0][1], f"rank {r} holds different bits than rank 0"


def _fused_others(comm: ringlet.Communicator) -> list[str]:
    n, r = comm.size, comm.rank
    bad: list[str] = []
    for dtype in ("float32", "int64", "int8", "complex128"):
        for count in [1, 5, 1000, 1024, 3001]:
            ins = [make(dtype, count, q, salt=4) for q in range(n)]
            # all_gather
            g = comm.all_gather(ins[r], algorithm="direct")
            if not np.array_equal(g, np.stack(ins)):
                bad.append(f"all_gather {dtype} {count}")
            # broadcast from every root
            for root in sorted({0, n - 1}):
                x = ins[r].copy()
                comm.broadcast(x, root=root, algorithm="direct")
                if not np.array_equal(x, ins[root]):
                    bad.append(f"broadcast {dtype} {count} root {root}")
            # reduce_scatter and all_to_all on n blocks of `count`
            full = [make(dtype, count * n, q, salt=5) for q in range(n)]
            rs = comm.reduce_scatter(full[r], algorithm="direct")
            want = reference_reduce(np.stack(full), ReduceOp.SUM)[r * count:(r + 1) * count]
            if not close(rs, want):
                bad.append(f"reduce_scatter {dtype} {count}")
            a2a = comm.all_to_all(full[r], algorithm="direct")
            want = np.concatenate([full[q][r * count:(r + 1) * count] for q in range(n)])
            if not np.array_equal(a2a, want):
                bad.append(f"all_to_all {dtype} {count}")
    return bad[:8]


def test_fused_staged_collectives(small: World) -> None:
    for r, bad in enumerate(small.run(_fused_others)):
        assert not bad, f"rank {r}: {bad}"


def _same_bits_as_generic(comm: ringlet.Communicator, dtype: str) -> list[str]:
    """oneshot reduces in rank order, like the generic executor running its schedule;
    direct gives the same bits in place and out of place."""
    bad = []
    for count in (7, 500):
        x = make(dtype, count, comm.rank, salt=6)
        fused = comm.all_reduce(x.copy(), algorithm="oneshot")
        generic = comm.all_reduce(x.copy(), algorithm="naive")
        if digest(fused) != digest(generic):
            bad.append(f"{dtype} {count}: fused one-shot differs from rank-order reduction")
    # direct out of place reduces into the published slot (in one pass where it can): the
    # same bits as in place, which reduces in x, for a ufunc's op and for complex prod's
    for count in (7, 500, 3001):
        for op in ("sum", "prod"):
            x = make(dtype, count, comm.rank, salt=7)
            inplace = comm.all_reduce(x.copy(), op=op, algorithm="direct")
            out = comm.all_reduce(x, op=op, out=np.empty_like(x), algorithm="direct")
            if digest(out) != digest(inplace):
                bad.append(f"{dtype} {op} {count}: direct out of place differs from in place")
    return bad


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64"])
def test_fused_paths_keep_the_bits(small: World, dtype: str) -> None:
    for r, bad in enumerate(small.run(_same_bits_as_generic, dtype)):
        assert not bad, f"rank {r}: {bad}"


def _bf16(comm: ringlet.Communicator) -> list[str]:
    import torch

    bad = []
    for algo in ("oneshot", "direct"):
        for count in (3, 3000):
            t = torch.arange(count, dtype=torch.float32).to(torch.bfloat16) * (comm.rank + 1)
            out = torch.empty_like(t)
            comm.all_reduce(t, out=out, algorithm=algo)
            comm.all_reduce(t, algorithm=algo)
            want = torch.arange(count, dtype=torch.float32) * sum(range(1, comm.size + 1))
            if not torch.allclose(t.float(), want, rtol=2e-2):
                bad.append(f"{algo} bfloat16 {count}")
            if not torch.equal(out, t):
                bad.append(f"{algo} bfloat16 {count}: out of place differs from in place")
    return bad


def test_fused_bfloat16(small: World) -> None:
    pytest.importorskip("torch")
    for r, bad in enumerate(small.run(_bf16)):
        assert not bad, f"rank {r}: {bad}"


def _init_with(rank: int, job: str, settings: Settings, q: Any) -> None:
    from ringlet.startup import init

    try:
        comm = init(settings=settings, rank=rank, size=2, job_id=job)
        comm.all_reduce(np.ones(5000, np.float32), algorithm="direct")
        q.put((rank, "ok", ""))
        comm.close()
    except ringlet.RingletError as exc:
        q.put((rank, type(exc).__name__, str(exc)))


def _two_ranks(s0: Settings, s1: Settings) -> dict[int, tuple[str, str]]:
    import multiprocessing as mp
    import secrets

    ctx = mp.get_context("forkserver")
    q = ctx.Queue()
    job = secrets.token_hex(16)
    procs = [ctx.Process(target=_init_with, args=(r, job, s, q)) for r, s in enumerate((s0, s1))]
    for p in procs:
        p.start()
    out = {}
    for _ in procs:
        r, kind, msg = q.get(timeout=60)
        out[r] = (kind, msg)
    for p in procs:
        p.join(10)
    return out


@pytest.mark.parametrize("change", [{"shm_slot_bytes": 512 << 10}, {"shm_piece_bytes": 8192},
                                    {"cma_bytes": 4 << 20}])
def test_ranks_with_different_shm_settings_fail_at_start(change: dict[str, int]) -> None:
    """The piece and single-copy sizes too: they failed every fused call instead, with a
    MismatchError about the path's digest of sizes, naming no setting."""
    base = Settings(timeout=20.0)
    res = _two_ranks(base, base.replace(**change))
    var = "RINGLET_" + next(iter(change)).upper()
    for r in (0, 1):
        kind, msg = res[r]
        assert kind == "ConfigError", res
        assert f"{var}: rank 0 has" in msg and "same shared-memory settings" in msg, msg


def test_dtype_table_is_complete() -> None:
    assert set(DTYPES) >= {"bool", "int8", "uint64", "float16", "complex128", "bfloat16"}


# --- zero-copy buffers from comm.empty ---------------------------------------------------------

def _zero_copy(comm: ringlet.Communicator) -> list[str]:
    n, r = comm.size, comm.rank
    bad = []
    for dtype in ("float32", "int64", "complex128", "uint8"):
        for op in valid_ops(dtype)[:3]:
            for count in (1, 7, 1000, 4097):
                g = comm.empty((count,), dtype)
                ins = [make(dtype, count, q, op, salt=11) for q in range(n)]
                g[...] = ins[r]
                res = comm.all_reduce(g, op=op, algorithm="direct")
                ref = reference_reduce(np.stack(ins), op)
                if res is not g or not close(g, ref):
                    bad.append(f"{dtype} {op.name} {count}: {g[:3]} != {ref[:3]}")
    # a slice at the same place on every rank, and a 2-d buffer
    g = comm.empty((40, 25), np.float64)
    g[...] = r
    part = g[10:20]
    comm.all_reduce(part, algorithm="direct")
    if not (part == sum(range(n))).all() or not (g[:10] == r).all():
        bad.append("slice of a shared buffer")
    return bad[:6]


def test_zero_copy_all_reduce(small: World) -> None:
    for r, bad in enumerate(small.run(_zero_copy)):
        assert not bad, f"rank {r}: {bad}"


def _shared_and_private(comm: ringlet.Communicator) -> list[str]:
    """A buffer of comm.empty on some ranks and not on others, or at different places:
    every rank runs the staged path and gets the sum (NCCL, too, falls back when a buffer
    is not registered on every rank); this was a MismatchError about the path."""
    n, r = comm.size, comm.rank
    bad = []
    g = comm.empty(1 << 16, np.float32)
    for case in ("rank 0 only", "offsets", "same place", "rank 0 only"):
        g[...] = r + 1
        if case == "rank 0 only":
            x = g[:4096] if r == 0 else np.full(4096, r + 1, np.float32)
        elif case == "offsets":
            x = g[r * 4096:(r + 1) * 4096]
        else:
            x = g[1024:5120]
        comm.all_reduce(x, algorithm="direct")
        if not (x == n * (n + 1) / 2).all():
            bad.append(f"{case}: {x[:3]}")
        if case == "same place" and comm._fr is not None and \
                comm._fr.records()[-1]["path"] != "zero-copy":
            bad.append(f"same place: {comm._fr.records()[-1]}")
    y = np.ones(3)
    comm.all_reduce(y)
    if (y != n).any():
        bad.append(f"after: {y}")
    return bad


@pytest.mark.parametrize("n", [2, 3])
def test_a_shared_buffer_on_some_ranks_only_runs_staged(n: int) -> None:
    from conftest import get_world

    for r, bad in enumerate(get_world(n).run(_shared_and_private)):
        assert not bad, f"rank {r}: {bad}"


def _empty_disagree(comm: ringlet.Communicator) -> str:
    try:
        comm.empty(10 + comm.rank)
    except ringlet.MismatchError as exc:
        return str(exc)
    return "no error"


def test_empty_with_different_shapes_is_a_mismatch() -> None:
    from conftest import get_world

    for text in get_world(3).run(_empty_disagree):
        assert "ranks asked for different buffers: rank 0: (10,) float32" in text, text


def _empty_torch(comm: ringlet.Communicator) -> bool:
    import torch

    t = torch.from_numpy(comm.empty(5000, np.float32))
    t.fill_(comm.rank + 1)
    comm.all_reduce(t, algorithm="direct")
    return bool((t == sum(range(1, comm.size + 1))).all())


def test_empty_as_a_torch_tensor(small: World) -> None:
    pytest.importorskip("torch")
    assert all(small.run(_empty_torch))


def _empty_torch_dtypes(comm: ringlet.Communicator) -> list[str]:
    import torch

    bad = []
    for dt in (torch.bfloat16, torch.float16, torch.int32):
        t = comm.empty((50, 100), dt)   # a tensor of that type, in shared memory
        if not isinstance(t, torch.Tensor) or t.dtype != dt or t.shape != (50, 100):
            bad.append(f"{dt}: {type(t).__name__}")
            continue
        t.fill_(comm.rank + 1)
        comm.all_reduce(t, algorithm="direct")
        if not bool((t == sum(range(1, comm.size + 1))).all()):
            bad.append(f"{dt}: sum {t.flatten()[:3]}")
    return bad


def test_empty_with_a_torch_dtype(small: World) -> None:
    pytest.importorskip("torch")
    for bad in small.run(_empty_torch_dtypes):
        assert not bad, bad


# --- single copy (cross-memory attach) -------------------------------------------------------

#: element counts per block around CMA_MIN_BYTES for 1-, 4- and 16-byte elements
CMA_COUNTS = {"int8": [CMA_MIN_BYTES - 1, CMA_MIN_BYTES + 7],
              "float32": [CMA_MIN_BYTES // 4 - 1, CMA_MIN_BYTES // 4, CMA_MIN_BYTES // 4 + 3],
              "complex128": [CMA_MIN_BYTES // 16 + 1]}


def _fresh_or_offset(a: np.ndarray, offset: bool) -> np.ndarray:
    """``a`` in a fresh array, or in one that starts ``itemsize`` bytes into a buffer."""
    if not offset:
        return a.copy()
    buf = np.empty(a.size + 1, a.dtype)
    buf[1:] = a
    return buf[1:]


def _single_copy(comm: ringlet.Communicator) -> list[Any]:
    n, r = comm.size, comm.rank
    f = comm._fused
    bad: list[str] = []
    single = []
    for dtype, counts in CMA_COUNTS.items():
        for count in counts:
            for offset in (False, True):
                ins = [make(dtype, count, q, salt=7) for q in range(n)]
                before = f.piece
                g = comm.all_gather(_fresh_or_offset(ins[r], offset), algorithm="direct")
                single.append((count * ins[r].itemsize >= CMA_MIN_BYTES, f.piece - before))
                if not np.array_equal(g, np.stack(ins)):
                    bad.append(f"all_gather {dtype} {count} offset {offset}")
                for root in sorted({0, n - 1}):
                    x = _fresh_or_offset(ins[r], offset)
                    comm.broadcast(x, root=root, algorithm="direct")
                    if not np.array_equal(x, ins[root]):
                        bad.append(f"broadcast {dtype} {count} root {root} offset {offset}")
                full = [make(dtype, count * n, q, salt=8) for q in range(n)]
                before = f.piece
                a2a = comm.all_to_all(_fresh_or_offset(full[r], offset), algorithm="direct")
                single.append((count * ins[r].itemsize >= CMA_MIN_BYTES, f.piece - before))
                want = np.concatenate([full[q][r * count:(r + 1) * count] for q in range(n)])
                if not np.array_equal(a2a, want):
                    bad.append(f"all_to_all {dtype} {count} offset {offset}")
    return [bad[:8], single, f.cma]


def test_single_copy_collectives(small: World) -> None:
    """all_gather and all_to_all (and broadcast, which stays staged) with blocks around
    the single-copy threshold, fresh and offset arrays: numpy's answer; all_gather and
    all_to_all in one step (a piece) per call from the threshold where the kernel
    allows cross-memory attach, in staged pieces below it."""
    for r, (bad, single, on) in enumerate(small.run(_single_copy)):
        assert not bad, f"rank {r}: {bad}"
        if small.size == 1 or not cma.AVAILABLE:
            continue
        assert on, f"rank {r}: single copies were turned off"
        for big, pieces in single:
            assert (pieces == 1) == big, single


def _refused_read(comm: ringlet.Communicator) -> list[Any]:
    """Rank n-1's reads fail (as under a seccomp profile that forbids process_vm_readv):
    every rank falls back to the staged path in the same call and stays there."""
    n, r = comm.size, comm.rank
    f = comm._fused
    count = CMA_MIN_BYTES // 4
    ins = [make("float32", count * n, q, salt=9) for q in range(n)]
    want = np.concatenate([ins[q][r * count:(r + 1) * count] for q in range(n)])
    real = cma.read
    results = []
    try:
        if r == n - 1:
            cma.read = lambda *a: False  # type: ignore[assignment]
        for _ in range(2):
            got = comm.all_to_all(ins[r], algorithm="direct")
            results.append((bool(np.array_equal(got, want)), f.cma, f.cma_off))
    finally:
        cma.read = real  # type: ignore[assignment]
        f.cma, f.cma_off = True, ""   # this world's later tests use it again
    return results


def test_single_copy_refused_falls_back_on_every_rank(small: World) -> None:
    if small.size == 1 or not cma.AVAILABLE:
        pytest.skip("single copies need 2 ranks and process_vm_readv")
    n = small.size
    for r, results in enumerate(small.run(_refused_read)):
        for ok, on, why in results:
            assert ok and not on, (r, results)
            assert f"rank {n - 1} could not read" in why, why


def _streamed(comm: ringlet.Communicator, stream: bool) -> list[str]:
    """all_gather, all_to_all and broadcast whose copies into the output stream (the
    threshold lowered in this rank for the call, odd sizes and offsets), or, without
    ``stream``, are plain copies as where the compiled module is not built."""
    import ringlet.transport.fused as fz

    n, r = comm.size, comm.rank
    bad: list[str] = []
    keep = fz.STREAM_MIN_BYTES, fz.STREAM
    fz.STREAM_MIN_BYTES, fz.STREAM = 1, stream and keep[1]
    try:
        for dtype in ("int8", "float32", "complex128"):
            for count in (1, 17, 1025, 3001):
                for offset in (False, True):
                    ins = [make(dtype, count, q, salt=11) for q in range(n)]
                    g = comm.all_gather(_fresh_or_offset(ins[r], offset), algorithm="direct")
                    if not np.array_equal(g, np.stack(ins)):
                        bad.append(f"all_gather {dtype} {count} offset {offset}")
                    x = _fresh_or_offset(ins[r], offset)
                    comm.broadcast(x, root=n - 1, algorithm="direct")
                    if not np.array_equal(x, ins[n - 1]):
                        bad.append(f"broadcast {dtype} {count} offset {offset}")
                    full = [make(dtype, count * n, q, salt=12) for q in range(n)]
                    a2a = comm.all_to_all(_fresh_or_offset(full[r], offset),
                                          algorithm="direct")
                    want = np.concatenate([full[q][r * count:(r + 1) * count]
                                           for q in range(n)])
                    if not np.array_equal(a2a, want):
                        bad.append(f"all_to_all {dtype} {count} offset {offset}")
    finally:
        fz.STREAM_MIN_BYTES, fz.STREAM = keep
    return bad[:8]


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
def test_streamed_copies_into_the_output(small: World, stream: bool) -> None:
    """The staged path's copies into users' outputs with non-temporal stores (the
    compiled module's, where built) and without give numpy's answer."""
    for r, bad in enumerate(small.run(_streamed, stream)):
        assert not bad, f"rank {r}: {bad}"


def _unaligned(comm: ringlet.Communicator) -> list[str]:
    """Arrays one byte into their memory (np.frombuffer with an offset: writable, C
    contiguous, not aligned): the one-shot path's compiled sum refused them with a
    TypeError, which aborted the communicator."""
    n, r = comm.size, comm.rank
    bad = []
    for dtype in (np.float64, np.float32, np.int64, np.int32):
        for count in (4, 1000, 40000):
            for with_out in (False, True):
                size = np.dtype(dtype).itemsize
                raw = np.zeros(count * size + 1, np.uint8)
                x = np.frombuffer(raw.data, dtype, count=count, offset=1)
                x[...] = r + 1
                out = None
                if with_out:
                    raw_out = np.zeros(count * size + 1, np.uint8)
                    out = np.frombuffer(raw_out.data, dtype, count=count, offset=1)
                got = comm.all_reduce(x, out=out)
                if x.flags.aligned or not (got == n * (n + 1) // 2).all():
                    bad.append(f"{np.dtype(dtype).name} x {count} out={with_out}: {got[:3]}")
    return bad


@pytest.mark.parametrize("n", [2, 3])
def test_unaligned_arrays_are_reduced(n: int) -> None:
    from conftest import get_world

    for r, bad in enumerate(get_world(n).run(_unaligned)):
        assert not bad, f"rank {r}: {bad}"
