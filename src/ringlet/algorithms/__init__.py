"""The algorithm library: one module per family, each algorithm a pure schedule.

An algorithm is a builder ``fn(nranks, root=0, **params) -> Schedule``,
registered for a collective under a name (and optional aliases).  Nothing
here touches data or processes.

>>> import ringlet
>>> "ring" in ringlet.algorithms("all_reduce")
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from ..errors import ArgumentError
from ..schedule import COLLECTIVES, Schedule

Builder = Callable[..., Schedule]


@dataclass
class Entry:
    name: str
    builder: Builder
    params: dict[str, int] = field(default_factory=dict)   # parameter -> default
    doc: str = ""


#: The family modules, one per classic family of algorithms.
FAMILIES = ("naive", "ring", "tree", "recursive", "bruck", "direct", "hierarchical", "scan")

_REGISTRY: dict[str, dict[str, Entry]] = {c: {} for c in COLLECTIVES}
_ALIASES: dict[str, dict[str, str]] = {c: {} for c in COLLECTIVES}


def _summary(doc: str, width: int = 100) -> str:
    """The first sentence of a docstring, on one line, for ``ringlet show``'s list: cut
    at a word with '...' past ``width`` (its first line alone stopped mid-phrase)."""
    text = " ".join(doc.strip().split("\n\n")[0].split()).replace("``", "")
    text = text.split(". ")[0].rstrip(".") + "."
    return text if len(text) <= width else text[:width - 3].rsplit(" ", 1)[0] + "..."


def register(collective: str, name: str, *, aliases: tuple[str, ...] = (),
             params: dict[str, int] | None = None) -> Callable[[Builder], Builder]:
    """Decorator: register ``fn`` as algorithm ``name`` of ``collective``."""

    def deco(fn: Builder) -> Builder:
        doc = _summary(fn.__doc__ or "")
        _REGISTRY[collective][name] = Entry(name, fn, dict(params or {}), doc)
        for a in aliases:
            _ALIASES[collective][a] = name
        return fn

    return deco


_loaded: list[bool] = []


def _load() -> None:
    # Importing the family modules registers their algorithms (once: this is on every
    # collective call's path).
    if _loaded:
        return
    import importlib

    for family in FAMILIES:
        importlib.import_module(f"{__name__}.{family}")
    _loaded.append(True)


def _check_collective(collective: str) -> None:
    if collective not in _REGISTRY:
        raise ArgumentError(
            f"unknown collective {collective!r}; use one of {', '.join(_REGISTRY)} (or an "
            f"uneven form, in algorithms(): {', '.join(UNEVEN)})")


def algorithms(collective: str) -> list[str]:
    """The names of the algorithms that implement ``collective``.

    An uneven form (``all_to_all_v``, ``all_gather_v``, ``gather_v``, ``scatter_v``)
    runs the even collective's algorithms that keep every block in places of its
    size (:mod:`ringlet.uneven`): those that do so at every world size up to 16 and, for
    ``gather_v`` and ``scatter_v``, at every root."""
    _load()
    if collective in UNEVEN:
        from ..uneven import listed

        return listed(UNEVEN[collective])
    _check_collective(collective)
    return sorted(_REGISTRY[collective])


#: the uneven forms of collectives (see ringlet.uneven)
UNEVEN = {"all_to_all_v": "all_to_all", "all_gather_v": "all_gather", "gather_v": "gather",
           "scatter_v": "scatter"}


def entry(collective: str, name: str) -> Entry:
    """The registry entry for ``name`` (an alias is resolved); a clear error if unknown."""
    _load()
    _check_collective(collective)
    key = _ALIASES[collective].get(name, name)
    e = _REGISTRY[collective].get(key)
    if e is None:
        raise ArgumentError(
            f"unknown algorithm {name!r} for {collective}; valid: {valid(collective)}")
    return e


def valid(collective: str) -> str:
    """The names ``collective``'s algorithms take, for a message: each algorithm with its
    aliases beside it (``binomial (or tree), chain, ...``)."""
    _load()
    _check_collective(collective)
    also: dict[str, list[str]] = {}
    for alias, name in _ALIASES[collective].items():
        also.setdefault(name, []).append(alias)
    return ", ".join(n + (f" (or {', '.join(sorted(also[n]))})" if n in also else "")
                     for n in sorted(_REGISTRY[collective]))


def canonical(collective: str, name: str) -> str:
    return entry(collective, name).name


@lru_cache(maxsize=512)
def _build(collective: str, name: str, nranks: int, root: int,
           params: tuple[tuple[str, int], ...]) -> Schedule:
    e = entry(collective, name)
    s = e.builder(nranks, root, **dict(params))
    s.params = {**e.params, **dict(params)}
    return s


def build(collective: str, name: str, nranks: int, root: int = 0, **params: int) -> Schedule:
    """The schedule of algorithm ``name`` for ``collective`` on ``nranks`` ranks (cached)."""
    if nranks < 1:
        raise ArgumentError(f"nranks must be >= 1, got {nranks}")
    if not 0 <= root < nranks:
        raise ArgumentError(f"root {root} is out of range for {nranks} ranks (0..{nranks - 1})")
    e = entry(collective, name)
    unknown = sorted(set(params) - set(e.params))
    if unknown:
        raise ArgumentError(
            f"{collective}/{e.name} takes no parameter(s) {unknown}; "
            f"it takes {sorted(e.params) or 'none'}")
    return _build(collective, e.name, nranks, root if collective in _ROOTED else 0,
                  tuple(sorted(params.items())))


_ROOTED = frozenset({"broadcast", "reduce", "scatter", "gather"})

#: The most ranks the command-line tools build schedules for (``ringlet predict``,
#: ``simulate``, ``plan``, ``verify``, ``show``): they build them rank by rank (a 1 GB
#: all_reduce on 131,072 ranks took 37 s and 1.8 GB of memory to predict; on 16,384, 6 s).
MAX_RANKS = 1 << 16

#: The smallest value of each algorithm parameter (group=0: the algorithm chooses).
PARAM_MIN = {"group": 0, "pieces": 1}


def parse_params(items: Sequence[str] | None, pieces: int | None = None) -> dict[str, int]:
    """The command line's ``--param NAME=INT`` options (and ``--pieces K``) as a dict,
    each known parameter's value checked (which algorithms take them is the caller's
    check: :func:`build` refuses one an algorithm does not take)."""
    out: dict[str, int] = {}
    for item in items or []:
        name, eq, value = item.partition("=")
        try:
            if not eq or not name.strip():
                raise ValueError
            out[name.strip()] = int(value)
        except ValueError:
            raise ArgumentError(
                f"--param {item!r}: write NAME=INTEGER, e.g. --param group=2") from None
    if pieces is not None:
        if out.get("pieces", pieces) != pieces:
            raise ArgumentError(
                f"--pieces {pieces} and --param pieces={out['pieces']} disagree; give one")
        out["pieces"] = pieces
    for key, v in out.items():
        least = PARAM_MIN.get(key)
        if least is not None and v < least:
            flag = "--pieces" if key == "pieces" and pieces is not None else f"--param {key}"
            raise ArgumentError(f"{flag}: {key} must be >= {least}, got {v}")
    return out
