"""Start-up across nodes: meet over the engine, find the nodes, build the routed transport.

When a job spans nodes (see :func:`engine_for`), :func:`ringlet.init` does:

1. join the engine: MPI (``MPI_Init`` through mpi4py, under ``mpiexec`` or
   ``srun``) or torch.distributed's env:// rendezvous (a TCP store, under
   ``torchrun`` or ``ringlet run --nodes``);
2. exchange every rank's node key (:func:`ringlet.topology.node_key`) and the
   job id (rank 0's) over it, so every rank computes the same
   :class:`~ringlet.topology.Topology`;
3. start shared memory among the ranks of its node (the one-host start-up of
   :mod:`ringlet.startup`, per node), then tell every rank over the engine
   whether that worked: a node whose start-up failed (settings that differ, a
   rank that died or never came) fails every rank of the job with its error,
   instead of leaving the other nodes in the engine's next collective;
4. start the engine transport for the peers on other nodes, and return a
   :class:`~ringlet.transport.routed.RoutedTransport` over both.

Every wait has ``RINGLET_INIT_TIMEOUT``: the torch store's waits have it as
their timeout, and MPI's exchanges are nonblocking collectives polled under it
(calling start-up's check between polls: a held signal, an orphaned rank).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .algorithms.select import canonical_setting
from .config import Settings
from .env import LaunchInfo
from .errors import CommTimeoutError, ConfigError, PeerError, RingletError, name_ranks
from .topology import Topology, node_key
from .transport.base import Transport

#: what each launcher's jobs use between nodes when RINGLET_ENGINE=auto
_AUTO = {"mpich": "mpi", "openmpi": "mpi", "slurm": "mpi", "torchrun": "torch",
         "ringlet": "torch"}

#: init() calls in this process so far: keys in a torch store are per call
_calls = 0


def engine_for(settings: Settings, info: LaunchInfo) -> str | None:
    """The engine a job needs, or None for one node (shared memory only).

    ``RINGLET_ENGINE=mpi|torch`` forces one; ``none`` forbids one.  ``auto``
    uses one when the job spans nodes: the launcher runs fewer ranks on this
    host than in the job, or ``RINGLET_NODE`` is set (emulated nodes).
    """
    if settings.engine == "none" or info.size == 1:
        return None
    if settings.engine != "auto":
        return settings.engine
    if not settings.node and info.local_size >= info.size:
        return None
    engine = _AUTO.get(info.source)
    if engine is None:
        raise ConfigError(
            f"this job spans nodes but its launcher ({info.source}) has no engine ringlet "
            f"knows; set RINGLET_ENGINE=mpi (under mpiexec/srun) or RINGLET_ENGINE=torch "
            f"(with MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE)")
    return engine


class _Mpi:
    """MPI's COMM_WORLD for start-up; the transport on a duplicate of it."""

    name = "mpi"

    def __init__(self, settings: Settings, rank: int, size: int,
                 check: Callable[[], None] | None = None) -> None:
        from .transport import mpi as tm

        self.tm = tm
        self.settings = settings
        self.rank = rank
        self.check = check
        self.comm = tm.world_comm()
        if (self.comm.Get_rank(), self.comm.Get_size()) != (rank, size):
            raise ConfigError(
                f"MPI says this is rank {self.comm.Get_rank()} of {self.comm.Get_size()}, the "
                f"launcher's variables say rank {rank} of {size}: run one job per mpiexec")

    def _wait(self, req: Any, what: str) -> None:
        """Poll a nonblocking collective of start-up until it completes, under
        RINGLET_INIT_TIMEOUT (MPI's blocking ones would wait for ever, deaf to signals)."""
        from .wait import Waiter

        self.tm.poll_request(req, Waiter(
            self.settings, lambda: f"rank {self.rank}'s start-up over MPI ({what})", list,
            self.check, timeout=self.settings.init_timeout,
            advice=lambda: (
                "not every rank of the MPI job reached it (MPI's collectives do not say "
                "which). A rank that did not call ringlet.init(), or whose RINGLET_NODE or "
                "RINGLET_ENGINE differs from the others' (it starts without the engine), "
                "never comes; if the ranks are just slow, raise RINGLET_INIT_TIMEOUT "
                "(seconds)")))

    def allgather(self, text: str, name: str = "key") -> list[str]:
        data = np.frombuffer(text.encode(), np.uint8)
        counts = np.zeros(self.comm.Get_size(), np.int64)
        what = _EXCHANGES.get(name, name)
        self._wait(self.comm.Iallgather(np.array([data.size], np.int64), counts), what)
        got = np.empty(max(1, int(counts.sum())), np.uint8)
        self._wait(self.comm.Iallgatherv(data, [got, [int(c) for c in counts]]), what)
        ends = np.cumsum(counts)
        return [bytes(got[e - c:e]).decode() for c, e in zip(counts, ends, strict=True)]

    def from_rank0(self, text: str) -> str:
        n = np.array([len(text.encode())], np.int64)
        self._wait(self.comm.Ibcast(n, root=0), "the job id")
        buf = np.frombuffer(text.encode(), np.uint8).copy() if self.rank == 0 else \
            np.empty(int(n[0]), np.uint8)
        if buf.size:
            self._wait(self.comm.Ibcast(buf, root=0), "the job id")
        return bytes(buf).decode()

    def transport(self, remote: list[int]) -> Transport:
        return self.tm.MpiTransport(self.comm, self.settings, remote=remote)


#: the longest nap between polls of the store while start-up waits for other ranks' keys
_STORE_SLICE_S = 0.1
#: what start-up's exchanges are, for a timeout's message
_EXCHANGES = {"key": "exchanging the node keys", "verdict": "each node's start-up verdict",
              "algo": "exchanging RINGLET_ALGO"}


class _Torch:
    """torch.distributed's env:// store for start-up; a gloo group on it for the transport."""

    name = "torch"

    def __init__(self, settings: Settings, rank: int, size: int, store: Any = None,
                 check: Callable[[], None] | None = None) -> None:
        from .transport import torch as tt

        global _calls
        self.tt = tt
        self.settings = settings
        self.rank, self.size = rank, size
        self.check = check
        #: meeting on a store of the caller's own (a torch process group's)
        self.callers = store is not None
        if store is None:
            _calls += 1
            self.store = tt.env_store(settings, rank, size)
            self.prefix = f"ringlet/{_calls}"
        else:   # its keys are ours
            self.store, self.prefix = store, "ringlet"

    def _op(self, op: Callable[[], Any], what: str) -> Any:
        try:
            return op()
        except Exception as exc:  # noqa: BLE001 - the store's host ended or is unreachable
            raise PeerError(f"rank {self.rank}'s start-up on torch's store ({what}): the "
                            f"store failed ({type(exc).__name__}: {exc}); the process that "
                            f"hosts it may have ended") from None

    def _wait(self, keys: list[str], ranks: list[int], what: str) -> None:
        """Wait until ``keys`` (set by ``ranks``) are in the store, under the deadline and
        start-up's check (``store_wait``), not in one wait with the store's timeout,
        which holds signals until it returns.  The deadline is RINGLET_INIT_TIMEOUT, or
        on a store of the caller's own (a torch process group's) the group's timeout
        where that is longer."""
        from .wait import Waiter

        timeout = self.settings.init_timeout if not self.callers else \
            max(self.settings.init_timeout, self.settings.timeout)

        def has(key: str) -> bool:
            return bool(self._op(lambda: self.store.check([key]), what))

        def missing() -> list[int]:
            return [q for q, k in zip(ranks, keys, strict=True) if not has(k)]

        def advice() -> str:
            late = missing()
            return (f"{name_ranks(late)} did not arrive. A rank that did not start ringlet "
                    f"(ringlet.init(), or the torch group), or whose RINGLET_NODE or "
                    f"RINGLET_ENGINE differs from the others' (it starts without the engine), "
                    f"never comes; if the ranks are just slow, raise RINGLET_INIT_TIMEOUT "
                    f"(seconds)")

        waiter = Waiter(
            self.settings, lambda: f"rank {self.rank}'s start-up on torch's store ({what})",
            missing, self.check, timeout=timeout, advice=advice)
        self.tt.store_wait(waiter,
                           lambda: bool(self._op(lambda: self.store.check(keys), what)),
                           _STORE_SLICE_S)

    def allgather(self, text: str, name: str = "key") -> list[str]:
        what = _EXCHANGES.get(name, name)
        self._op(lambda: self.store.set(f"{self.prefix}/{name}/{self.rank}", text), what)
        keys = [f"{self.prefix}/{name}/{q}" for q in range(self.size)]
        self._wait(keys, list(range(self.size)), what)

        def get(key: str) -> str:
            return bytes(self._op(lambda: self.store.get(key), what)).decode()

        return [get(k) for k in keys]

    def from_rank0(self, text: str) -> str:
        key = f"{self.prefix}/job"
        if self.rank == 0:
            self._op(lambda: self.store.set(key, text), "the job id")
        self._wait([key], [0], "the job id")
        return bytes(self._op(lambda: self.store.get(key), "the job id")).decode()

    def transport(self, remote: list[int]) -> Transport:
        return self.tt.TorchTransport(self.store, self.rank, self.size, self.settings,
                                      f"{self.prefix}/pg", remote=remote)


def start(engine: str, rank: int, size: int, settings: Settings, job_id: str | None,
          local_start: Callable[[int, int, str, Sequence[int] | None], Any],
          store: Any = None,
          keep_engine: bool = True, check: Callable[[], None] | None = None
          ) -> tuple[str, Transport, Topology]:
    """Steps 1 to 4 of the module documentation; ``local_start(local rank, local size,
    node job id, the node's ranks in the job or None)`` is the one-host start-up,
    returning (job id, ShmTransport).

    ``store``: meet on this torch store (engine torch) instead of the env:// one.
    ``keep_engine=False``: a job that turns out to be on one node gets shared memory
    only (its fused paths), without the engine.  ``check``: called between the polls
    of the engine's exchanges (start-up's: a held signal, an orphaned rank)."""
    from .transport.routed import RoutedTransport

    boot: _Mpi | _Torch = _Mpi(settings, rank, size, check) if engine == "mpi" else \
        _Torch(settings, rank, size, store, check)
    keys = boot.allgather(node_key(settings))
    # RINGLET_ALGO steers every rank's choice: ranks on different nodes must share it (the
    # ranks of a node compare the rest at their own start-up)
    algos = boot.allgather(settings.algo, "algo")
    if len({canonical_setting(a) for a in algos}) > 1:
        raise ConfigError("ranks must use the same RINGLET_ALGO (they would choose "
                          "different algorithms): " + "; ".join(
                              f"rank {q} has {a!r}" for q, a in enumerate(algos)))
    job = boot.from_rank0(job_id or secrets.token_hex(16) if rank == 0 else "")
    if job_id is not None and job != job_id:
        raise ConfigError("ranks were given different job ids (RINGLET_JOB_ID): run one job "
                          "per launcher")
    topo = Topology.from_keys(keys, rank, engine)
    if topo.engine is None and not keep_engine:
        return job, local_start(rank, size, job, None)[1], Topology.single(size)
    if topo.engine is None:   # one node, engine forced: it stays available (native)
        topo = Topology(topo.nodes, topo.node, engine)
    here = topo.local_ranks
    local = None
    failed: RingletError | None = None
    if len(here) > 1:
        try:
            local = local_start(here.index(rank), len(here), f"{job}-n{topo.node}",
                                here)[1]
        except RingletError as exc:
            failed = exc
    _verdict(boot, failed, local)
    remote = [q for q in range(size) if q not in here]
    try:
        eng = boot.transport(remote)
    except BaseException:
        if local is not None:
            local.close()
        raise
    return job, RoutedTransport(rank, topo.node_of(), local, eng), topo


_KINDS: dict[str, type[RingletError]] = {"ConfigError": ConfigError,
                                         "CommTimeoutError": CommTimeoutError}


def _verdict(boot: _Mpi | _Torch, failed: RingletError | None, local: Any) -> None:
    """Step 3's verdict over the engine: raise on every rank if any rank's node failed to
    start (its own error on a rank that failed; the first failed rank's, naming it, on
    the others: a ConfigError stays one, and a timeout, so that every rank reads why)."""
    said = boot.allgather("" if failed is None else f"{type(failed).__name__}:{failed}",
                          "verdict")
    bad = [(q, v) for q, v in enumerate(said) if v]
    if not bad:
        return
    if local is not None:
        local.close()
    if failed is not None:
        raise failed
    q, text = bad[0]
    kind, _, why = text.partition(":")
    more = f" (and {len(bad) - 1} more rank{'s' if len(bad) > 2 else ''})" \
        if len(bad) > 1 else ""
    raise _KINDS.get(kind, PeerError)(f"rank {q}'s node could not start{more}: {why}")
