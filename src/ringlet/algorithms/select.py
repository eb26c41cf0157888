"""Which algorithm a collective call runs.

Precedence, most specific first:

1. the call's ``algorithm=`` (``None`` or ``"auto"`` means: choose);
2. a name the ``RINGLET_ALGO`` setting forces for the collective;
3. with a calibrated profile (the ``RINGLET_PROFILE`` setting, by default
   ``~/.cache/ringlet/profile.json``, written by ``ringlet predict
   --calibrate``), the :class:`Tuner`: the allowed algorithm with the least
   predicted time; without one, :func:`heuristic`, a small size/N rule.
   Neither picks a name the setting excludes with ``^name``, nor
   ``recursive_doubling`` for all_reduce (:data:`NEVER_AUTO`) unless the
   setting excludes everything else.

``RINGLET_ALGO`` is ``collective:item,item;collective:...``; an item is an
algorithm name or alias (force it) or ``^name`` (exclude it from the automatic
choice), e.g. ``all_reduce:ring;broadcast:tree`` or ``all_reduce:^naive,^direct``.

Everything here is a pure function of its arguments (and of the profile's
contents), so every rank that asks the same question gets the same answer.
A communicator reads its profile once, at start-up (:func:`choosing`), where
the ranks of each node compare it and the settings above
(``ringlet.startup``): a profile replaced while a job runs, or one rank's
``RINGLET_ALGO``, would otherwise make ranks choose differently.
``nbytes`` is the size of the collective's whole buffer on one rank, as
nccl-tests counts it: the vector of all_reduce, broadcast and reduce; the
output of all_gather and gather; the input of reduce_scatter, all_to_all and
scatter.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from ..errors import ArgumentError, ConfigError
from ..schedule import COLLECTIVES
from . import algorithms, canonical, valid
from .hierarchical import pipeline_pieces

if TYPE_CHECKING:
    from ..cost.host import Paths
    from ..cost.model import Profile

KiB = 1 << 10
MiB = 1 << 20

Setting = dict[str, tuple[str | None, frozenset[str]]]


def _resolve(collective: str, name: str, where: str) -> str:
    try:
        return canonical(collective, name)
    except ArgumentError:
        raise ArgumentError(
            f"{where}: {collective} has no algorithm {name!r}; valid: "
            f"{valid(collective)}") from None


@lru_cache(maxsize=64)
def _parse(text: str) -> tuple[tuple[str, str | None, frozenset[str]], ...]:
    out: dict[str, tuple[str | None, frozenset[str]]] = {}
    for part in text.split(";"):
        part = part.strip()
        if not part:
            continue
        where = f"RINGLET_ALGO entry {part!r}"
        coll, sep, items = part.partition(":")
        coll = coll.strip()
        if not sep or not items.strip():
            raise ArgumentError(
                f"{where}: write collective:algorithm, e.g. all_reduce:ring or "
                f"all_reduce:^naive")
        if coll not in COLLECTIVES:
            raise ArgumentError(
                f"{where}: unknown collective {coll!r}; valid: {', '.join(COLLECTIVES)}")
        if coll in out:
            raise ArgumentError(f"{where}: {coll} is given twice; put its items in one entry")
        forced: str | None = None
        excluded: set[str] = set()
        for item in items.split(","):
            item = item.strip()
            if not item:
                continue
            if item.startswith("^"):
                excluded.add(_resolve(coll, item[1:].strip(), where))
            elif forced is not None:
                raise ArgumentError(
                    f"{where}: forces both {forced!r} and {item!r}; force at most one "
                    f"algorithm per collective (exclude others with ^name)")
            else:
                forced = _resolve(coll, item, where)
        if forced is not None and forced in excluded:
            raise ArgumentError(f"{where}: {forced!r} is both forced and excluded")
        if not set(algorithms(coll)) - excluded:
            raise ArgumentError(
                f"{where}: excludes every algorithm of {coll}; keep at least one of "
                f"{', '.join(algorithms(coll))}")
        out[coll] = (forced, frozenset(excluded))
    return tuple((c, f, e) for c, (f, e) in out.items())


def parse_algo_setting(text: str) -> Setting:
    """Parse ``RINGLET_ALGO``: collective -> (forced name or None, excluded names).

    Names come back canonical (aliases resolved).  Unknown collectives or names
    raise :class:`ArgumentError` listing the valid ones.

    >>> parse_algo_setting("all_reduce:ring;broadcast:tree")
    {'all_reduce': ('ring', frozenset()), 'broadcast': ('binomial', frozenset())}
    >>> parse_algo_setting("all_reduce:^naive")["all_reduce"]
    (None, frozenset({'naive'}))
    """
    return {c: (f, e) for c, f, e in _parse(text)}


def canonical_setting(text: str) -> str:
    """``RINGLET_ALGO`` as ranks compare it: what it means, not how it is written (aliases
    resolved, spaces and the entries' order left out), so that ``all_reduce:tree`` and
    ``all_reduce: binomial`` agree.  Text that does not parse is compared as it is.

    >>> canonical_setting("broadcast:tree; all_reduce:^naive") == \\
    ...     canonical_setting("all_reduce: ^naive;broadcast:binomial")
    True
    """
    try:
        parsed = parse_algo_setting(text)
    except ArgumentError:
        return text
    return repr(sorted((c, f or "", sorted(e)) for c, (f, e) in parsed.items()))


#: Algorithms the automatic choice never picks (the user may still ask for them).
#: Recursive doubling all_reduce was left out because its partners reduced a (op) b and
#: b (op) a (not bit-identical for MIN/MAX of signed zeros or NaN payloads); since issue 8
#: they compute the same expression, so that reason is gone and there is no cost reason
#: (the tuner predicts it like any other).  It stays out until the tests that pin the
#: exclusion (tests/test_select.py, tests/test_tuner.py) are changed with it.
NEVER_AUTO: dict[str, frozenset[str]] = {"all_reduce": frozenset({"recursive_doubling"})}


def _pow2(n: int) -> bool:
    return n & (n - 1) == 0


def heuristic(collective: str, nranks: int, nbytes: int, allowed: frozenset[str]) -> str:
    """The automatic choice: the first algorithm of a size/N preference list in ``allowed``.

    On one host (the shared-memory transport, ringlet's home) a collective is a
    memory problem: the one-round direct algorithms, which the transport runs
    fused (each rank publishes its data once, every peer reads it in place),
    beat every multi-round algorithm at every size measured here
    (``benchmarks/RESULTS.md``), so they come first:

    * all_reduce: ``oneshot`` while the vector is small (every rank reduces all
      p vectors itself: one synchronisation, (p-1) n bytes read and reduced),
      then ``direct`` (each rank reduces 1/p and copies the rest: 2 (p-1)/p n
      bytes, three synchronisations per piece).  Measured on 2 ranks
      (``benchmarks/RESULTS.md``), oneshot is still ahead at 64 KiB and direct
      at 1 MiB; the crossover moves down as p grows because oneshot reads
      (p-1) n bytes: oneshot while (p-1) n <= 256 KiB.  (The communicator
      also falls back to direct when the vector does not fit its post area,
      ``RINGLET_SHM_POST_BYTES``.)
    * broadcast, all_gather, reduce_scatter, all_to_all: ``direct``.
    * reduce, scatter, gather: binomial (lg p rounds, the same bytes from or to
      the root as linear).

    If those are excluded (``RINGLET_ALGO=all_reduce:^oneshot,^direct``), the
    fallbacks follow the alpha-beta rules of Thakur, Rabenseifner & Gropp
    (2005) with shared-memory-class constants (alpha ~ 5 us, beta ~ 0.2 ns/B,
    alpha/beta ~ 25 KB): Rabenseifner on a power of two until a block (n/p)
    reaches 256 KiB, then the ring; van de Geijn's scatter + all-gather for a
    long broadcast and Rabenseifner's reduce-scatter + gather for a long reduce
    (64 KiB); MPICH's all_gather thresholds (recursive doubling below 512 KiB on
    a power of two, Bruck below 80 KiB, ring above); recursive halving below
    512 KiB for reduce_scatter; Bruck for tiny all_to_all blocks on 8+ ranks.
    Recursive doubling all_reduce is not chosen automatically (:data:`NEVER_AUTO`).

    A cost-model tuner replaces this; it is kept in one function for that.
    """
    p, n = nranks, nbytes
    prefs: list[str]
    if collective == "all_reduce":
        first = ["oneshot", "direct"] if (p - 1) * n <= 256 * KiB else ["direct", "oneshot"]
        if _pow2(p) and n // p < 256 * KiB:
            prefs = first + ["rabenseifner", "ring", "binomial"]
        else:
            prefs = first + ["ring", "rabenseifner", "binomial"]
    elif collective == "broadcast":
        small = p <= 2 or n < 64 * KiB
        prefs = ["direct"] + (["binomial", "scatter_allgather"] if small
                              else ["scatter_allgather", "binomial"])
    elif collective == "reduce":
        small = p <= 2 or n < 64 * KiB
        prefs = ["binomial", "rabenseifner"] if small else ["rabenseifner", "binomial"]
    elif collective == "all_gather":
        if n < 512 * KiB and _pow2(p):
            prefs = ["direct", "recursive_doubling", "bruck", "ring"]
        elif n < 80 * KiB:
            prefs = ["direct", "bruck", "recursive_doubling", "ring"]
        else:
            prefs = ["direct", "ring", "bruck", "recursive_doubling"]
    elif collective == "reduce_scatter":
        prefs = ["direct"] + (["recursive_halving", "ring"] if n < 512 * KiB
                              else ["ring", "recursive_halving"])
    elif collective == "all_to_all":
        block = n // p
        if block <= 256 and p >= 8:
            prefs = ["direct", "bruck", "pairwise"]
        else:
            prefs = ["direct", "pairwise", "bruck"]
    elif collective in ("scatter", "gather"):
        prefs = ["binomial", "linear"]
    elif collective in ("scan", "exscan"):
        # lg p rounds of the whole vector against p - 1: the chain only sends less in all
        prefs = ["recursive_doubling", "linear"]
    else:
        raise ArgumentError(
            f"unknown collective {collective!r}; valid: {', '.join(COLLECTIVES)}")
    for name in prefs:
        if name in allowed:
            return name
    # everything preferred is excluded: any other allowed one, the reference last
    never = NEVER_AUTO.get(collective, frozenset())
    rest = sorted(allowed, key=lambda a: (a in never, a == "naive", a == "recursive_doubling", a))
    if not rest:
        raise ArgumentError(f"no algorithm of {collective} is allowed")
    return rest[0]


class Tuner:
    """The automatic choice by predicted time, from a calibrated profile.

    For a collective of ``nbytes`` on ``nranks`` ranks, every allowed algorithm
    (less :data:`NEVER_AUTO`) is predicted with
    :func:`ringlet.cost.model.predict` on ``profile`` (the host model of a
    calibrated profile, on the path ``paths`` gives the call), and the least
    time wins; ties go to the name first in alphabetical order, so every rank
    with the same profile picks the same.  Predictions use float32 elements
    (the choice is per size, as the communicator caches it, not per dtype).
    Answers are cached per (collective, nranks, nbytes, allowed set).

    >>> from ringlet.cost.model import Link, Profile
    >>> slow_links = Tuner(Profile(Link(alpha=1e-3, beta=1e-12)))
    >>> slow_links.choose("broadcast", 8, 1 << 10, frozenset({"binomial", "chain"}))
    'binomial'
    """

    def __init__(self, profile: Profile, paths: Paths | None = None) -> None:
        from ..cost.host import Paths

        self.profile = profile
        self.paths = Paths() if paths is None else paths
        self._cache: dict[tuple[str, int, int, frozenset[str]], str] = {}

    def times(self, collective: str, nranks: int, nbytes: int,
              allowed: frozenset[str]) -> dict[str, float]:
        """Predicted seconds of every allowed algorithm that can run this call."""
        from ..cost.model import predict

        out: dict[str, float] = {}
        for name in sorted(allowed - NEVER_AUTO.get(collective, frozenset())):
            try:
                out[name] = predict(collective, name, nranks, max(1, nbytes), self.profile,
                                    "float32", paths=self.paths).seconds
            except ArgumentError:
                continue   # cannot run on this many ranks (e.g. a group size that divides)
        return out

    def choose(self, collective: str, nranks: int, nbytes: int, allowed: frozenset[str]) -> str:
        """The allowed algorithm with the least predicted time (the heuristic's pick if
        none can be predicted)."""
        key = (collective, nranks, nbytes, allowed)
        name = self._cache.get(key)
        if name is None:
            times = self.times(collective, nranks, nbytes, allowed)
            if times:
                name = min(times, key=lambda a: (times[a], a))
            else:
                name = heuristic(collective, nranks, nbytes, allowed)
            if len(self._cache) > 4096:
                self._cache.clear()
            self._cache[key] = name
        return name


#: algorithms whose point is that every rank reads its peers' memory (one host only)
ONE_HOST = frozenset({"oneshot", "direct"})


#: the flat choice that says a call is in the bandwidth regime, per collective with a
#: two-level schedule (``hierarchical``): there the two-level one replaces it across nodes
BANDWIDTH = {"all_reduce": None, "all_gather": "ring", "reduce_scatter": "ring",
             "broadcast": "scatter_allgather", "reduce": "rabenseifner"}


def multinode(collective: str, nranks: int, nbytes: int, allowed: frozenset[str],
              ranks_per_node: int | None) -> str:
    """The automatic choice across nodes.

    When every node holds the same number g of consecutive ranks (1 < g < p),
    ``hierarchical`` (one rail per local rank, see
    :mod:`ringlet.algorithms.hierarchical`):

    - all_reduce, always: reduce-scatter inside each node, all-reduce of one
      shard per local rank across nodes, all-gather inside each node; only
      1/g of the vector per rank crosses the network, all local ranks at once
      (NCCL's and Horovod's scheme).  In ``hierarchical_pipelined``'s pieces
      from two of them
      (:func:`~ringlet.algorithms.hierarchical.pipeline_pieces`), whatever
      crosses the nodes (the engine's own all_reduce, :mod:`ringlet.rails`,
      or ringlet's ring): each piece crosses the network while the node
      reduces the next piece and gathers the earlier ones, so the node-local
      phases hide behind the network but for one piece's.  A piece of every
      rank's shard is at least 1 MiB, so the extra rounds (one with two
      pieces, seven with eight) cost little beside the bytes: on the test bed
      it was 3-9 % faster from 4 MiB on both engines (benchmarks/MULTIHOST.md),
      and the model puts it ahead or level on fast networks too, unless a
      round costs as much as 0.5 ms there;
    - all_gather, reduce_scatter, broadcast and reduce where the flat rules
      pick their bandwidth algorithm (:data:`BANDWIDTH`), and all_gather and
      reduce_scatter on two nodes (one round across the network, as few as
      any): each node's link then carries the least data any schedule can.

    Otherwise the alpha-beta rules of :func:`heuristic` for a network, without
    the one-host algorithms.
    """
    g = ranks_per_node
    flat = heuristic(collective, nranks, nbytes, (allowed - ONE_HOST) or allowed)
    if collective in BANDWIDTH and "hierarchical" in allowed and g is not None \
            and 1 < g < nranks and nranks % g == 0:
        two_nodes = nranks // g == 2 and collective in ("all_gather", "reduce_scatter")
        if collective == "all_reduce" and "hierarchical_pipelined" in allowed \
                and pipeline_pieces(nbytes, g) > 1:
            return "hierarchical_pipelined"
        if collective == "all_reduce" or flat == BANDWIDTH[collective] or two_nodes:
            return "hierarchical"
    return flat


class Choosing(NamedTuple):
    """What a communicator's automatic choice reads besides the call, read once at start-up
    (:func:`choosing`): a calibration that replaces the profile while the job runs is the
    next job's (ranks reaching a new size before and after the file changed chose
    differently), and the ranks of a node compare it there (``ringlet.startup``)."""

    #: the calibrated profile, or None (the built-in size rules choose)
    profile: Profile | None
    #: the profile as messages name it
    where: str
    #: a digest of the profile's contents ('' without one): what the ranks compare
    digest: str


def choosing(settings: Any) -> Choosing:
    """The :class:`Choosing` of ``settings``: its profile file read now (ConfigError if it
    is not a usable profile)."""
    if not settings.profile:
        return Choosing(None, "none (RINGLET_PROFILE='')", "")
    version = _version(settings.profile)
    if version is None:
        return Choosing(None, f"none ({Path(settings.profile).expanduser()} does not exist)",
                        "")
    profile = _profile(*version)
    digest = hashlib.sha256(json.dumps(profile.to_dict(), sort_keys=True).encode())
    return Choosing(profile, version[0], digest.hexdigest()[:12])


def _version(text: str) -> tuple[str, int, int] | None:
    """(path, mtime_ns, size) of the profile file ``text`` names (what the caches key on),
    None if it does not exist; a ConfigError if it cannot be read."""
    path = Path(text).expanduser()
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"RINGLET_PROFILE={text!r}: cannot read it ({exc})") from None
    return str(path), st.st_mtime_ns, st.st_size


def agreed_tuner(c: Choosing, settings: Any, lean_everywhere: bool) -> Tuner | None:
    """The :class:`Tuner` of a communicator whose ranks agreed on ``c`` at start-up; its
    compiled path (``ringlet.lean``) counted only if every rank takes it
    (``lean_everywhere``: RINGLET_LEAN may differ between ranks, the choice may not)."""
    if c.profile is None:
        return None
    from ..cost.host import Paths

    paths = Paths.from_settings(settings)
    return Tuner(c.profile, replace(paths, lean=paths.lean and lean_everywhere))


def tuner_for(settings: Any) -> Tuner | None:
    """The :class:`Tuner` of a :class:`~ringlet.config.Settings`: its ``profile`` file
    read (once per version of the file) with its shared-memory paths, or None if the
    setting is empty or the file does not exist.  A file that is not a profile raises
    ConfigError.  (A communicator's is fixed at start-up instead: :func:`choosing`.)"""
    version = _version(settings.profile) if settings.profile else None
    if version is None:
        return None
    from ..cost.host import Paths

    return _tuner(*version, Paths.from_settings(settings))


@lru_cache(maxsize=8)
def _tuner(path: str, mtime_ns: int, size: int, paths: Paths) -> Tuner:
    return Tuner(_profile(path, mtime_ns, size), paths)


@lru_cache(maxsize=8)
def _profile(path: str, mtime_ns: int, size: int) -> Profile:
    """The profile at ``path`` (read once per version of the file)."""
    from ..cost.model import Profile

    try:
        return Profile.load(path)
    except ArgumentError as exc:
        raise ConfigError(
            f"RINGLET_PROFILE={path!r} is not a usable profile ({exc}); recalibrate with "
            f"`ringlet predict --calibrate`, or set RINGLET_PROFILE='' to choose by the "
            f"built-in size rules") from None


def choose(collective: str, nranks: int, nbytes: int, *, requested: str | None,
           setting: str, tuner: Tuner | None = None, nodes: int = 1,
           ranks_per_node: int | None = None, post_fits: bool = True) -> str:
    """The canonical name of the algorithm to run (see the module docs for the precedence).

    ``tuner`` (see :func:`tuner_for`) makes the automatic choice by predicted
    time; without it, :func:`heuristic` does.

    ``post_fits`` False (the call is too large for the fused paths' post area): an
    automatic choice of ``oneshot``, which runs fused or not at all, becomes
    ``direct`` (the staged fused path), or, where ``RINGLET_ALGO`` excludes that, the
    choice among the rest.  An algorithm asked for or forced by the setting stays.

    ``nodes`` > 1 (a job across nodes, :func:`multinode`): the automatic
    choice leaves out the one-host algorithms and puts the two-level one first
    where the node layout allows it; a tuner is not used, since its profile is
    one host's and ranks on different hosts must never choose differently.

    >>> choose("all_reduce", 8, 1 << 10, requested=None, setting="")
    'oneshot'
    >>> choose("all_reduce", 8, 1 << 10, requested="tree", setting="all_reduce:ring")
    'binomial'
    >>> choose("all_reduce", 8, 1 << 10, requested=None, setting="all_reduce:ring")
    'ring'
    """
    if collective not in COLLECTIVES:
        raise ArgumentError(
            f"unknown collective {collective!r}; valid: {', '.join(COLLECTIVES)}")
    if nranks < 1:
        raise ArgumentError(f"nranks must be >= 1, got {nranks}")
    if nbytes < 0:
        raise ArgumentError(f"nbytes must be >= 0, got {nbytes}")
    if requested is not None and requested != "auto":
        return _resolve(collective, requested, "algorithm=")
    forced, excluded = parse_algo_setting(setting).get(collective, (None, frozenset()))
    if forced is not None:
        return forced
    allowed = frozenset(algorithms(collective)) - excluded
    name = _automatic(collective, nranks, nbytes, allowed, tuner, nodes, ranks_per_node)
    if name == "oneshot" and not post_fits:
        if "direct" in allowed:
            return "direct"
        if allowed - {"oneshot"}:
            return _automatic(collective, nranks, nbytes, allowed - {"oneshot"}, tuner, nodes,
                              ranks_per_node)
    return name


def _automatic(collective: str, nranks: int, nbytes: int, allowed: frozenset[str],
               tuner: Tuner | None, nodes: int, ranks_per_node: int | None) -> str:
    if nodes > 1:
        return multinode(collective, nranks, nbytes, allowed, ranks_per_node)
    if tuner is not None:
        return tuner.choose(collective, nranks, nbytes, allowed)
    return heuristic(collective, nranks, nbytes, allowed)
