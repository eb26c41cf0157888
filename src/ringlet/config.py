"""ringlet's settings: one typed object, documented defaults, ``RINGLET_<NAME>`` overrides.

Every setting is a field of :class:`Settings`.  ``Settings.from_env()`` reads
``RINGLET_<NAME>`` variables (``RINGLET_TIMEOUT=30``) and rejects any
``RINGLET_*`` variable that names no setting, so a typo fails loudly instead
of being ignored.  Code never reads ``os.environ`` for a setting anywhere
else: the communicator carries its ``Settings`` and passes it down.

Tests override settings in a scoped way, by passing a ``Settings`` object
(``ringlet.spawn(fn, 4, settings=Settings(timeout=5))``) or with
``settings.replace(timeout=5)``.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .errors import ConfigError

#: ``RINGLET_*`` variables that are part of the launch protocol, not settings.
#: ``ringlet run`` and ``ringlet.spawn`` set them for the ranks they start.
LAUNCH_VARIABLES = frozenset({"RINGLET_JOB_ID"})

_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}

#: Where ``ringlet predict --calibrate`` stores this machine's profile by default.
DEFAULT_PROFILE = "~/.cache/ringlet/profile.json"


def parse_bytes(text: str) -> int:
    """``"4096"``, ``"64K"``, ``"1M"``, ``"2G"`` (binary multiples) -> bytes."""
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    mult = 1
    if t and t[-1] in _SUFFIXES:
        mult, t = _SUFFIXES[t[-1]], t[:-1]
    try:
        value = float(t) * mult
    except ValueError:
        raise ConfigError(f"{text!r} is not a byte size; write e.g. 4096, 64K, 1M or 2G") from None
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise ConfigError(f"{text!r} is not a whole, non-negative number of bytes")
    return int(value)


#: what each kind of setting must be (Settings made in code are checked too)
_KINDS = {"float": "a number", "int": "a whole number", "bool": "True or False",
          "str": "a string"}
#: the longest deadline, liveness interval or grace a setting may give: a week (a wait
#: of 1e300 s overflows the clocks of the waits that keep it)
MAX_SECONDS = 7 * 24 * 3600.0
#: the shortest heartbeat_s: its beats go through torch's store, three per heartbeat_s
#: (1e-300 s passed, and beat in a busy loop)
MIN_HEARTBEAT_S = 0.1


@dataclass(frozen=True)
class Settings:
    """All of ringlet's settings.  Each is overridable by ``RINGLET_<NAME>``."""

    timeout: float = field(default=300.0, metadata={
        "doc": "Deadline in seconds for every wait after start-up (a collective, a recv). "
               "A timeout names the collective, its sequence number and the ranks that "
               "did not arrive."})
    init_timeout: float = field(default=60.0, metadata={
        "doc": "Deadline in seconds for start-up (ringlet.init): for every rank to call "
               "init and for the shared memory to be set up. A timeout names the ranks "
               "that did not arrive. Separate from timeout because start-up only waits "
               "for processes to be started (seconds), while a collective may rightly "
               "take long; raise it if ranks do slow work (loading data) before init."})
    debug: str = field(default="", metadata={
        "doc": "Logging, like NCCL_DEBUG: '' (quiet), WARN, INFO (one line per "
               "collective: algorithm, count, bytes), TRACE (also every round the step "
               "executor runs, and a two-level call's engine calls across nodes; the fused "
               "shared-memory paths run a call in one step and log only its INFO line)."})
    algo: str = field(default="", metadata={
        "doc": "Algorithm overrides per collective, e.g. 'all_reduce:ring;broadcast:tree'; "
               "'^name' excludes an algorithm from the automatic choice."})
    engine: str = field(default="auto", metadata={
        "doc": "What carries ringlet between nodes (hosts): 'mpi' (mpi4py), 'torch' "
               "(torch.distributed with gloo), 'none' (one node only) or 'auto': an engine "
               "only when the job spans nodes (the launcher says so, or RINGLET_NODE is "
               "set), MPI under mpiexec or srun, torch under torchrun or `ringlet run "
               "--nodes`. Inside a node ranks always use shared memory."})
    node: str = field(default="", metadata={
        "doc": "This rank's node, like NCCL_HOSTID: ranks with the same value share "
               "memory, others talk over the engine. '' (default): the host (its name and "
               "boot id). Set it differently on groups of ranks to emulate several nodes "
               "on one machine."})
    shm_slot_bytes: int = field(default=256 << 10, metadata={
        "doc": "Bytes in one shared-memory message slot (a fragment). Accepts K/M/G."})
    shm_slots: int = field(default=4, metadata={
        "doc": "Slots per ordered pair of ranks (fragments in flight, >= 2)."})
    shm_post_bytes: int = field(default=256 << 10, metadata={
        "doc": "Bytes of each rank's one-shot area (x2): collectives up to this size per "
               "rank run in a single publish-and-read step. Accepts K/M/G."})
    shm_stage_bytes: int = field(default=4 << 20, metadata={
        "doc": "Bytes of each rank's staging area (x2) for the pipelined shared-memory "
               "paths; larger messages go through it in pieces. Accepts K/M/G."})
    shm_piece_bytes: int = field(default=512 << 10, metadata={
        "doc": "Bytes of one rank's block in one piece of a pipelined staged collective "
               "(capped so a piece fits the staging area). Accepts K/M/G."})
    fused: bool = field(default=True, metadata={
        "doc": "Run the shared-memory transport's fused implementations of the one-shot "
               "and direct algorithms (off: the generic step executor runs them)."})
    cma_bytes: int = field(default=0, metadata={
        "doc": "Blocks of all_gather and all_to_all on one host of at least this many "
               "bytes are read from each peer's own array in one copy (cross-memory "
               "attach, process_vm_readv) instead of being staged through shared memory "
               "(two copies); 0 (the default): never, since the cost model does not know "
               "the kernel's copy. It is slower per byte than memcpy, so it pays for "
               "large blocks only (8 MiB on this project's machines; "
               "benchmarks/ab_cma.py measures both on yours). Where the kernel refuses "
               "the call, every rank falls back to the staged path. Every rank must have "
               "the same setting. Accepts K/M/G."})
    lean: bool = field(default=True, metadata={
        "doc": "Run small all_reduce calls on the compiled path (ringlet._lean, built by "
               "pip install when a C compiler is there) where it applies; off: the Python "
               "path runs every call. Every rank may choose either: they pair up alike."})
    rails: str = field(default="auto", metadata={
        "doc": "How a two-level (hierarchical) all_reduce crosses nodes: 'ring' (ringlet's "
               "ring on each rail, over the engine's point-to-point), 'native' (the "
               "engine's own all_reduce on a group per rail) or 'auto' (native on the "
               "torch engine, whose point-to-point is slower than gloo's collectives; ring "
               "on MPI). native applies to SUM and AVG on float32, float64, int32 and "
               "int64; other calls keep the ring. Every rank must have the same setting."})
    spin_us: float = field(default=50.0, metadata={
        "doc": "Microseconds a wait polls before it starts yielding the core (0 is used "
               "when a communicator has more ranks than this process has cores)."})
    yield_us: float = field(default=2000.0, metadata={
        "doc": "Microseconds a wait yields (sched_yield) before it sleeps between polls."})
    sleep_us: float = field(default=200.0, metadata={
        "doc": "Longest sleep between polls of a long wait, in microseconds."})
    liveness_s: float = field(default=0.1, metadata={
        "doc": "Seconds between checks, during a wait, that the peers are alive."})
    heartbeat_s: float = field(default=5.0, metadata={
        "doc": "Seconds without a heartbeat after which a rank on another node counts as "
               "stopped on the torch engine (a process that hangs or was stopped, or whose "
               "host is down; a process that dies closes its connections and is known at "
               "once). The heartbeat is a thread of the rank's: a rank that holds Python's "
               "GIL longer than this, in one long call into C code that does not release "
               "it, looks stopped too; raise it for such programs. At least 0.1 s."})
    grace: float = field(default=3.0, metadata={
        "doc": "Seconds `ringlet run` and `ringlet.spawn` let the other ranks fail on "
               "their own after one rank failed, before stopping them."})
    profile: str = field(default=DEFAULT_PROFILE, metadata={
        "doc": "The calibrated profile (`ringlet predict --calibrate`) the automatic "
               "algorithm choice predicts times with; while the file does not exist, or "
               "with '' (no tuner), the built-in size rules choose. Read once, when the "
               "job starts (a calibration that replaces it later is the next job's); the "
               "ranks of a node compare its contents then, and differing ones are a "
               "ConfigError. One calibrated on another host (a home directory shared "
               "between machines) is used, and rank 0 warns that it may not fit."})
    flight_records: int = field(default=256, metadata={
        "doc": "Operations each communicator's flight recorder keeps (the last ones: "
               "collectives and point-to-point, with their state and timestamps); dumped "
               "to dump_dir on a timeout, an abort, a mismatch or SIGUSR1. 0: off."})
    dump_dir: str = field(default="", metadata={
        "doc": "Directory where each rank writes its flight recorder (rank-R.json) on a "
               "timeout, an abort, a mismatch, and on SIGUSR1; `ringlet diagnose DIR` "
               "reads them. '' (default): no dumps, except that `ringlet run` gives its "
               "ranks a directory and prints a diagnosis of a failed job."})
    trace: str = field(default="", metadata={
        "doc": "Directory where each rank writes its operations as Chrome trace events "
               "(rank-R.trace.jsonl); `ringlet run --trace DIR` sets it and merges them "
               "into DIR/trace.json (Perfetto, chrome://tracing). '' (default): off."})
    start_method: str = field(default="auto", metadata={
        "doc": "multiprocessing start method of ringlet.spawn: auto, spawn, forkserver or "
               "fork. auto forks where that is safe (Linux, this process has one thread), "
               "so that spawn works from a script without a __main__ guard, python -c, "
               "python - and an interactive session; else spawn."})

    def __post_init__(self) -> None:
        for f in fields(self):   # types first: Settings(fused="no") would be on
            v = getattr(self, f.name)
            kind = f.type if isinstance(f.type, str) else f.type.__name__
            if kind == "int" and isinstance(v, str) and f.name.endswith("_bytes"):
                try:   # "64K", as RINGLET_SHM_POST_BYTES=64K
                    v = parse_bytes(v)
                except ConfigError as exc:
                    raise ConfigError(f"{f.name}: {exc}") from None
                object.__setattr__(self, f.name, v)
            number = {"float": numbers.Real, "int": numbers.Integral}.get(kind)
            if number is not None and isinstance(v, number) and not isinstance(v, bool) \
                    and type(v) is not (float if kind == "float" else int):
                try:   # numpy's numbers, and whole seconds, as Python's own type
                    v = float(v) if kind == "float" else int(v)  # type: ignore[call-overload]
                except OverflowError:
                    raise ConfigError(f"{f.name} must be a finite number, got an integer "
                                      f"of {len(str(v))} digits") from None
                object.__setattr__(self, f.name, v)
            if kind == "bool" and type(v).__module__ == "numpy" \
                    and type(v).__name__ in ("bool", "bool_"):   # numpy 2's name, and 1's
                v = bool(v)   # numpy.True_, as an int setting takes numpy's integers
                object.__setattr__(self, f.name, v)
            want = {"float": float, "int": int, "bool": bool, "str": str}[kind]
            if not isinstance(v, want) or (want is int and isinstance(v, bool)):
                raise ConfigError(f"{f.name} must be {_KINDS[kind]}, got {v!r} "
                                  f"({type(v).__name__})")
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"{f.name} must be a finite number, got {v!r}")
        for name in ("timeout", "init_timeout", "liveness_s", "heartbeat_s", "grace"):
            if getattr(self, name) > MAX_SECONDS:
                raise ConfigError(f"{name} must be at most {MAX_SECONDS:,.0f} s (a week), got "
                                  f"{getattr(self, name)!r}")
        for name, top, unit in (("spin_us", 1e6, " us (1 s)"), ("yield_us", 1e6, " us (1 s)"),
                                ("sleep_us", 1e6, " us (1 s)"),
                                ("flight_records", 1_000_000, " records"),
                                ("shm_slots", 4096, " slots"),
                                ("shm_slot_bytes", 1 << 30, " bytes (1 GiB)"),
                                ("shm_post_bytes", 1 << 30, " bytes (1 GiB)"),
                                ("shm_stage_bytes", 1 << 30, " bytes (1 GiB)"),
                                ("shm_piece_bytes", 1 << 30, " bytes (1 GiB)")):
            if getattr(self, name) > top:
                raise ConfigError(f"{name} must be at most {top:,.0f}{unit}, got "
                                  f"{getattr(self, name)!r}")
        for name in ("timeout", "init_timeout"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0 seconds, got {getattr(self, name)!r}")
        if self.debug.strip().upper() not in ("", "WARN", "INFO", "TRACE"):
            raise ConfigError(f"debug must be '', WARN, INFO or TRACE, got {self.debug!r}")
        object.__setattr__(self, "debug", self.debug.strip().upper())   # " info": as meant
        for name in ("engine", "rails", "start_method"):   # MPI, Native, " fork": as meant
            if isinstance(getattr(self, name), str):
                object.__setattr__(self, name, getattr(self, name).strip().lower())
        if self.engine not in ("auto", "mpi", "torch", "none"):
            raise ConfigError(f"engine must be auto, mpi, torch or none, got {self.engine!r}")
        if self.rails not in ("auto", "ring", "native"):
            raise ConfigError(f"rails must be auto, ring or native, got {self.rails!r}")
        if self.shm_slot_bytes < 4096 or self.shm_slot_bytes % 64:
            raise ConfigError(
                f"shm_slot_bytes must be a multiple of 64 and >= 4096, got {self.shm_slot_bytes}")
        if self.shm_slots < 2:
            raise ConfigError(f"shm_slots must be >= 2, got {self.shm_slots}")
        for name in ("shm_post_bytes", "shm_stage_bytes", "shm_piece_bytes"):
            v = getattr(self, name)
            if v < 4096 or v % 64:
                raise ConfigError(f"{name} must be a multiple of 64 and >= 4096, got {v}")
        if self.cma_bytes < 0:
            raise ConfigError(f"cma_bytes must be >= 0, got {self.cma_bytes}")
        for name in ("spin_us", "yield_us", "sleep_us", "liveness_s", "grace"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(self, name)!r}")
        if not self.heartbeat_s >= MIN_HEARTBEAT_S:
            raise ConfigError(
                f"heartbeat_s must be at least {MIN_HEARTBEAT_S:g} s, got {self.heartbeat_s!r}: "
                f"each rank beats through torch's store at least three times per heartbeat_s, "
                f"and a rank whose beat is late by that much counts as stopped")
        if self.flight_records < 0:
            raise ConfigError(f"flight_records must be >= 0, got {self.flight_records!r}")
        if self.algo.strip():   # every entry names a collective and its algorithms
            from .algorithms.select import _parse
            from .errors import ArgumentError

            try:
                _parse(self.algo)
            except ArgumentError as exc:
                raise ConfigError(str(exc)) from None
        if self.start_method not in ("auto", "spawn", "forkserver", "fork"):
            raise ConfigError(f"start_method must be auto, spawn, forkserver or fork, got "
                              f"{self.start_method!r}")

    def check_paths(self) -> None:
        """A ConfigError unless ``dump_dir`` and ``trace``, where set, are directories this
        process can write (made if missing): checked when a job starts (``init``,
        ``spawn``, ``ringlet run``), since the recorder that writes them later cannot
        say so (its dumps happen on a failure, its trace in batches)."""
        from .errors import ArgumentError
        from .outputs import check_directory

        for name in ("dump_dir", "trace"):
            path = getattr(self, name)
            if path:
                try:
                    check_directory(path, f"RINGLET_{name.upper()}")
                except ArgumentError as exc:
                    raise ConfigError(str(exc)) from None

    def replace(self, **changes: Any) -> Settings:
        """A copy with some settings changed (validated like the original)."""
        names = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ConfigError(f"unknown setting(s) {unknown}; known: {sorted(names)}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Defaults, then ``RINGLET_<NAME>`` variables from ``env``, then ``overrides``."""
        env = os.environ if env is None else env
        by_var = {f"RINGLET_{f.name.upper()}": f for f in fields(cls)}
        values: dict[str, Any] = {}
        given: dict[str, str] = {}   # setting -> the variable and text it came from
        for var, text in env.items():
            if not var.startswith("RINGLET_") or var in LAUNCH_VARIABLES:
                continue
            f = by_var.get(var)
            if f is None:
                raise ConfigError(
                    f"unknown setting {var}={text!r}; known: {', '.join(sorted(by_var))} "
                    f"(see `ringlet config`)")
            values[f.name] = _parse(f, var, text)
            given[f.name] = f"{var}={text!r}"
        values.update(overrides)
        for name in overrides:
            given.pop(name, None)
        try:
            return cls().replace(**values)
        except ConfigError as exc:   # say which variable holds the value refused
            name = str(exc).split(" ", 1)[0]
            if name in given:
                raise ConfigError(f"{given[name]}: {exc}") from None
            raise

    def describe(self) -> list[tuple[str, str, str]]:
        """``(variable, current value, documentation)`` for every setting."""
        return [(f"RINGLET_{f.name.upper()}", repr(getattr(self, f.name)), f.metadata["doc"])
                for f in fields(self)]


def _parse(f: dataclasses.Field[Any], var: str, text: str) -> Any:
    kind = f.type if isinstance(f.type, str) else f.type.__name__
    try:
        if kind == "int":
            return parse_bytes(text) if f.name.endswith("_bytes") else int(text)
        if kind == "float":
            return float(text)
        if kind == "bool":
            t = text.strip().lower()
            if t in ("1", "true", "yes", "on"):
                return True
            if t in ("0", "false", "no", "off"):
                return False
            raise ValueError("write 1/0, true/false, yes/no or on/off")
    except (ValueError, ConfigError) as exc:
        raise ConfigError(f"{var}={text!r} is not a valid {kind}: {exc}") from None
    return text
