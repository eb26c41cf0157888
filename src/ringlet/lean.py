"""The small-message path: a small all_reduce in one compiled call, when ringlet was built with it.

An 8 B all_reduce on the Python path costs about 9 us at 2 ranks, nearly all of it
Python: validation, numbering, agreement, the one-shot exchange, the flight record.
``ringlet._lean`` (``src/ringlet/_lean.c``, built by ``pip install`` when a C compiler
is there; optional) does the common case of that call in one C function, through the
same shared memory and in the same order as the Python path, so that ranks on either
path pair up, agree and get the same bits:

* it takes only what the Python path would run as the fused one-shot all_reduce (sum)
  and publish the same descriptor for: an exact ``numpy.ndarray`` or a torch CPU tensor
  (through the array that shares its memory, :func:`tensor_call`), C-contiguous and
  writable (or with ``out=``, a writable one of the same kind, element type and count that
  is x's own elements or shares none of them), of float32, float64, int32 or int64,
  whose size the automatic choice runs one-shot through the post area (:func:`approve`,
  asked once per size) or that fits the post area with ``algorithm="oneshot"``, called
  with ``op="sum"`` (or ``ReduceOp.SUM``; any other spelling of SUM,
  ``algorithm="auto"`` and ``async_op=numpy.False_`` are taken as those,
  :func:`respelled`) and no other ``algorithm`` and no ``async_op``, on a communicator
  of one host with the fused paths on, from its thread, with nothing queued, nothing
  rejected before, not inside a compound call, and neither tracing, logging nor a
  profiler's ranges on;
* anything else, and anything that goes wrong (a peer that is not there within a
  short wait, a descriptor that differs), goes to the Python path, which runs the whole
  call again from its start (writing the same bytes and words again) with every
  guarantee: deadlines naming the missing ranks, liveness, mismatch messages;
* the flight recorder gets the calls done in C from the C side's own ring
  (:func:`records`): the sequence number, the descriptor and the start time, read from
  the coarse monotonic clock (the kernel's tick, 4 ms here: about 3 ns where the precise
  clock takes 20, 7 % of a 0.3 us call; benchmarks/RECORDER.md).

``RINGLET_LEAN=0`` turns it off; :data:`BUILT` says whether this installation has it.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from .agreement import COLL_CODE, POST, Desc, algo_code
from .cost.host import LEAN_DTYPES as TAKEN
from .errors import ArgumentError
from .ops import DTYPES, ReduceOp
from .procs import cores
from .transport.shm import DESC_WORDS, ShmTransport

if TYPE_CHECKING:
    from .comm import Communicator

try:
    from . import _lean  # type: ignore[attr-defined]
except ImportError:   # built without a C compiler: the Python path does everything
    _lean = None

#: whether this installation has the compiled path
BUILT = _lean is not None
#: what Lean.all_reduce answers
NOT_LEAN, DONE, PUBLISHED, UNAPPROVED = 0, 1, 2, 3
#: how long the compiled call waits for its peers before it leaves the wait to Python
#: (which waits with deadlines and liveness checks), beyond the settings' spinning time
WAIT_US = 200.0
#: the algorithm the compiled call runs
ONESHOT = "oneshot"
MAX_RANKS = 64


def make(comm: Communicator) -> Any:
    """The compiled path for ``comm``, or None where it does not apply."""
    st = comm.settings
    t = comm._t
    if _lean is None or not st.lean or comm._fused is None or not isinstance(t, ShmTransport) \
            or st.trace or st.debug or comm.size > MAX_RANKS:
        return None
    if any(mm is None for mm in t.maps):
        return None
    path = comm._path("all_reduce", ONESHOT, 8)
    if path & 3 != POST:
        return None
    lay = t.lay
    desc = [np.frombuffer(mm, np.int64, 2 * DESC_WORDS, lay.desc) for mm in t.maps]  # type: ignore[arg-type]
    post = [t.post[q][h] for q in range(comm.size) for h in (0, 1)]
    spin_us = st.spin_us if comm.size <= cores() else 0.0
    fr = comm._fr
    return _lean.Lean(
        comm.rank, comm.size, [int(d.ctypes.data) for d in desc],
        [int(p.ctypes.data) for p in post], lay.post_bytes,
        (COLL_CODE["all_reduce"], int(ReduceOp.SUM), algo_code(ONESHOT), path),
        tuple(DTYPES[n].code for n in ("float32", "float64", "int32", "int64")),
        np.ndarray, (t.maps, desc, post), int(spin_us * 1000),
        int((spin_us + WAIT_US) * 1000), fr.cap if fr is not None else 0)


def approve(comm: Communicator, lean: Any, nbytes: int) -> None:
    """For an array the compiled call would take but for its size (UNAPPROVED): if the
    automatic choice runs that size one-shot through the post area, with the descriptor the
    compiled call publishes, let the compiled call take it from now on."""
    if comm._choose("all_reduce", None, nbytes) == ONESHOT and \
            comm._path("all_reduce", ONESHOT, nbytes) == comm._path("all_reduce", ONESHOT, 8):
        lean.approve(nbytes)


# bound once: an enum class's attributes take 0.1-0.2 us to look up
_parse, _SUM, _FALSE = ReduceOp.parse, ReduceOp.SUM, np.False_


def respelled(op: Any, out: Any, algorithm: str | None, async_op: Any
              ) -> tuple[str, Any, str | None, bool] | None:
    """``op``, ``out``, ``algorithm`` and ``async_op`` of an all_reduce the compiled call did
    not take, spelled as it takes them, where the spelling alone stood in its way: any
    spelling of SUM (``"SUM"``, torch's and mpi4py's), ``algorithm="auto"`` (None) and
    ``async_op=numpy.False_``.  None where they mean something else, or are spelled so
    already (the call goes to the Python path)."""
    try:
        if _parse(op) is not _SUM:
            return None
    except ArgumentError:
        return None
    algo = None if algorithm == "auto" else algorithm
    flag = False if async_op is _FALSE else async_op
    if algo not in (None, ONESHOT) or flag is not False:
        return None
    if op == "sum" and algo is algorithm and flag is async_op:
        return None
    return "sum", out, algo, False


#: torch's tensor types, once torch is imported (tensor_call)
_TENSORS: tuple[type, ...] = ()


def tensor_call(lean: Any, x: Any, seq: int, out: Any, oneshot: bool) -> int:
    """The compiled call for a torch CPU tensor ``x`` (and ``out=``, None or a tensor too),
    through the numpy arrays that share their memory, as the Python path views them
    (``detach().numpy()``; torch's bfloat16 has no numpy twin and is not taken); NOT_LEAN
    for anything else, or for a tensor numpy cannot view (on another device, sparse, with a
    lazy conjugate or negation bit)."""
    global _TENSORS
    if not _TENSORS:
        torch = sys.modules.get("torch")
        if torch is None:   # not imported: x cannot be a tensor
            return NOT_LEAN
        _TENSORS = (torch.Tensor, torch.nn.Parameter)
    if type(x) not in _TENSORS or (out is not None and type(out) not in _TENSORS):
        return NOT_LEAN
    try:
        a = (x.detach() if x.requires_grad else x).numpy()   # detach() costs 1 us
        o = None if out is None else (out.detach() if out.requires_grad else out).numpy()
    except (TypeError, RuntimeError):
        return NOT_LEAN
    return int(lean.all_reduce(a, seq, o, oneshot))


def oneshot_reducer(op: ReduceOp, dtype_name: str) -> Any:
    """The Python path's reduction kernel for the one-shot all_reduce: the compiled path's
    own (``_lean.add``) for what it takes, wherever the module is built (whatever
    RINGLET_LEAN says), so that a call one rank does in C and another in Python gives the
    same bits, NaN payloads included (which NaN ``a + b`` keeps depends on the instruction's
    operand order); None: numpy's."""
    if _lean is None or op is not ReduceOp.SUM or dtype_name not in TAKEN:
        return None
    return _lean.add


def records(lean: Any) -> list[list[Any]]:
    """The flight records of the calls the compiled path did (done: their end not timed)."""
    from .recorder import DONE as RDONE

    return [[seq, Desc(*words), ONESHOT, t0, RDONE] for seq, t0, words in lean.records()]
