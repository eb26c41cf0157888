"""A torch.distributed backend named ``ringlet``, for CPU tensors.

::

    import ringlet.torch                      # registers the backend
    import torch.distributed as dist

    dist.init_process_group("ringlet")        # under torchrun (env://), or with
                                              # store=, rank=, world_size=
    dist.all_reduce(t)                        # ringlet's schedules and shared memory

Each process group (the default one and every ``new_group``) builds a
:class:`ringlet.Communicator` on the store torch gives it
(:func:`ringlet.startup.init_on_store`): shared memory among the group's ranks
on a node, torch.distributed's gloo between nodes.  The group's ``timeout``
(``init_process_group(timeout=...)``) is ringlet's deadline for every wait;
without one, ``RINGLET_TIMEOUT`` if the job sets it, else torch's default (30 min).

Operations map onto the communicator's calls with torch's semantics:
``all_reduce`` (SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR, AVG), ``broadcast``,
``reduce``, ``all_gather`` (list and into a tensor), ``reduce_scatter`` (list
and from a tensor), ``all_to_all`` and ``all_to_all_single`` (even splits),
``gather``, ``scatter``, ``barrier``, ``send``/``recv``/``isend``/``irecv``
with tags, and the object collectives through torch's wrappers.  A
collective runs on the communicator's worker thread and completes the
:class:`torch.futures.Future` of its ``Work`` (so ``async_op=True``,
``Work.wait()``, ``Work.get_future()`` and DDP's communication hooks work); a
ringlet error (mismatch, timeout, dead peer) reaches ``wait()`` with
ringlet's message.  What torch offers and ringlet does not (CUDA tensors,
PREMUL_SUM) raises a :class:`~ringlet.errors.ArgumentError` that says so.  A
call that one rank's arguments fail (a list of the wrong length, say) fails
on every rank as ringlet's own calls do: an ArgumentError on that rank, a
MismatchError quoting it on the others, and the next call works.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist
from torch.futures import Future

from .comm import Communicator
from .config import Settings
from .errors import ArgumentError, ConfigError
from .ops import ReduceOp
from .p2p import ANY_SOURCE
from .work import Work

BACKEND = "ringlet"


def _profiler_range(what: str, algorithm: str, nbytes: int) -> Any:
    """A named range in torch.profiler traces for one ringlet call, e.g.
    ``ringlet all_reduce #3 (1024 x float32) ring 4096 B`` (nothing unless profiling)."""
    if not torch.autograd.profiler._is_profiler_enabled:
        return contextlib.nullcontext()
    return torch.profiler.record_function(f"ringlet {what} {algorithm} {nbytes} B")


_OPS: dict[Any, ReduceOp] = {}


def _op(opts: Any) -> ReduceOp:
    """The reduction of torch's options, or of a short form's bare op (None: SUM)."""
    red: Any = dist.ReduceOp.SUM if opts is None else getattr(opts, "reduceOp", opts)
    kind = getattr(red, "op", red)
    op = _OPS.get(kind)
    if op is not None:
        return op
    name = str(getattr(kind, "name", kind))
    try:
        op = ReduceOp.parse(kind)
    except ArgumentError:
        raise ArgumentError(
            f"the ringlet backend has no reduction {name}; it has SUM, PRODUCT, MIN, MAX, "
            f"BAND, BOR, BXOR and AVG") from None
    _OPS[kind] = op
    return op


def _cpu(tensors: Sequence[Any], what: str) -> None:
    for t in tensors:
        if t.device.type != "cpu":
            raise ArgumentError(
                f"{what}: the ringlet backend runs on CPU tensors, got one on {t.device}; "
                f"use gloo or nccl for other devices (init_process_group('cpu:ringlet,"
                f"cuda:nccl') puts each device on its own backend)")


def _dense(t: Any) -> Any:
    """``t``, or a contiguous copy of it if it is strided (a transposed view): gloo takes
    those, and so does this backend, writing a copy back with :func:`_back` after the
    call (ringlet's own calls take contiguous buffers only)."""
    return t if t is None or t.is_contiguous() else t.contiguous()


def _apart(x: Any, out: Any) -> Any:
    """``x``, or a copy of it if it shares storage with ``out``: torch's in-place forms
    (``all_gather_into_tensor(out, out.chunk(n)[rank])``, as FSDP2 calls it, and an
    output inside the input of ``reduce_scatter_tensor``) work on gloo and NCCL, while
    ringlet's calls refuse an ``out=`` that overlaps ``x``."""
    if x.numel() and out.numel() and \
            x.untyped_storage().data_ptr() == out.untyped_storage().data_ptr():
        return x.clone()
    return x


def _overlaps_itself(t: Any) -> bool:
    """Whether elements of ``t`` share memory (an ``expand()``ed view): a result cannot be
    written into it."""
    check = getattr(torch, "_debug_has_internal_overlap", None)
    if check is not None:
        return bool(check(t) == 1)   # 1: MemOverlap::Yes (2: too complex to tell)
    return any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape, strict=True))


def _writable(outs: Sequence[Any]) -> None:
    """An ArgumentError, before the call, if an output has elements that share memory: the
    copy into it after the call would fail on this rank alone."""
    for t in outs:
        if _overlaps_itself(t):
            raise ArgumentError(
                f"an output tensor whose elements share memory (an expand()ed view, strides "
                f"{tuple(t.stride())}) cannot hold a result; pass .clone() or .contiguous()")


def _back(finish: Callable[[Any], Any], *pairs: tuple[Any, Any]) -> Callable[[Any], Any]:
    """``finish``, then each dense copy copied back into its strided tensor.  An output
    whose elements share memory is refused here, before the call (an ArgumentError)."""
    pairs = tuple((t, d) for t, d in pairs if t is not d)
    if not pairs:
        return finish
    _writable([t for t, _ in pairs])

    def done(res: Any) -> Any:
        value = finish(res)   # which may fill the dense copies
        for t, d in pairs:
            t.copy_(d)
        return value
    return done


def _root(opts: Any) -> int:
    """The root of torch's options, or a short form's bare root rank (None: 0)."""
    return 0 if opts is None else int(opts) if isinstance(opts, int) else int(opts.rootRank)


def _listed(t: Any) -> Any:
    """A short form's bare tensor as the list the long form passes."""
    return [t] if isinstance(t, torch.Tensor) else t


def _one(tensors: Sequence[Any], what: str) -> Any:
    if len(tensors) != 1:
        raise ArgumentError(f"{what}: the ringlet backend takes one tensor per call, got "
                            f"{len(tensors)}")
    _cpu(tensors, what)
    return tensors[0]


#: torch's handles that its C++ side may hold without keeping their Python part alive
#: (a handle Python code passes to C++, as ``Join`` gives DDP's reducer its all_reduce's):
#: kept while their call runs, and after it until waited for or their future taken (the
#: :data:`_UNWAITED` most recent such ones at most; see :func:`_keep`)
_KEPT: dict[int, _Work] = {}
#: finished handles nobody waited for that are kept: the most recent ones
_UNWAITED = 64
_KEPT_LOCK = threading.Lock()
_made = 0


def _keep(w: _Work) -> None:
    """Keep ``w``'s Python part alive while torch may still call it (once C++ holds a
    Python handle that Python code dropped, torch calls the base class's methods: a
    ``wait`` that never returns, a ``get_future`` that is "not implemented").  Every 16
    handles made, the finished ones go that were waited for (or their future taken), and
    those nobody waited for but the :data:`_UNWAITED` most recent (they hold their
    outputs).  Handles are made on several threads (DDP's hooks run on autograd's)."""
    global _made
    with _KEPT_LOCK:
        _made += 1
        if _made % 16 == 0:
            unwaited = 0
            for k, v in reversed(list(_KEPT.items())):
                if not v._finished():
                    continue
                if v._let_go or unwaited >= _UNWAITED:
                    del _KEPT[k]
                else:
                    unwaited += 1
        _KEPT[id(w)] = w


class _Work(dist._Work):
    """torch's handle of a ringlet call.  ``wait`` waits for ringlet's :class:`Work`
    (driving it, for point-to-point) and raises its error as it is; the future
    completes with ``finish(result)`` in the thread that finishes the call
    (ringlet's worker thread for a collective), or fails with the error as torch's
    own futures do (so that DDP's C++ reducer, which reads it, raises it)."""

    def __init__(self, work: Work, finish: Callable[[Any], Any]) -> None:
        super().__init__()
        self._work = work
        self._finish: Callable[[Any], Any] | None = finish
        self._error: BaseException | None = None
        self._done: Future[Any] = Future()   # its value, None if the call failed
        self._fut: Future[Any] | None = None
        self._let_go = False
        _keep(self)
        work._then(self._settle)

    def _settle(self, w: Work) -> None:
        err, value = w._error, None
        if err is None and self._finish is not None:
            try:
                value = self._finish(w._result)
            except BaseException as exc:  # noqa: BLE001 - handed to the waiter
                err = exc
        self._error, self._finish = err, None
        self._done.set_result(value)

    def _finished(self) -> bool:
        """Done, as :meth:`is_completed` but without driving a point-to-point call."""
        return self._work._done.is_set() and self._done.done()

    def _value(self, f: Future[Any]) -> Any:
        if self._error is not None:
            raise self._error
        return f.value()

    def wait(self, timeout: timedelta | None = None) -> bool:
        self._let_go = True
        secs = timeout.total_seconds() if timeout is not None and \
            timeout.total_seconds() > 0 else None
        self._work.wait(secs)
        self._done.wait()    # finish() ran: outputs are in place (or it failed)
        if self._error is not None:
            raise self._error
        return True

    def is_completed(self) -> bool:
        return self._work.is_completed() and self._done.done()

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self) -> BaseException | None:
        return self._error if self._done.done() else self._work._error

    def result(self) -> list[Any]:
        """The output tensors (torch's ``Work.result``), once the call is done."""
        self.wait()
        value = self._done.value()
        return list(value) if isinstance(value, (list, tuple)) else []

    def get_future(self) -> Future[Any]:
        # a future that fails in C++ (torch's Future.set_exception only sets a result
        # that raises when Python unwraps it: DDP's reducer read it as a value, SIGSEGV)
        self._let_go = True
        if self._fut is None:
            self._fut = self._done.then(self._value)
            if self._work._driver is not None and not self._work._done.is_set():
                # a point-to-point call moves only as it is driven (wait(), is_completed()):
                # driven here, under its deadline, or its future would wait for ever
                threading.Thread(target=_drive, args=(self._work,), daemon=True,
                                 name="ringlet-p2p-future").start()
        return self._fut

    def _source_rank(self) -> int:
        """The sender of a receive (torch's ``recv(src=None)`` asks)."""
        if self._work.source is None:
            raise ArgumentError("_source_rank: this work is not a completed receive")
        return self._work.source


def _drive(w: Work) -> None:
    """Drive a point-to-point ``w`` to its end, successful or not (a wait that fails aborts
    the communicator, and the next one finishes ``w`` with that failure)."""
    for _ in range(3):
        if w._done.is_set():
            return
        with contextlib.suppress(Exception):
            w.wait()


class _Done(dist._Work):
    """torch's handle of a call that ran inline and finished: nothing to wait for (not
    kept: torch's synchronous calls wait at once, and C++ callers keep their handles'
    Python part themselves)."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self._fut: Future[Any] = Future()
        self._fut.set_result(value)

    def wait(self, timeout: timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> BaseException | None:
        return None

    def result(self) -> list[Any]:
        value = self._fut.value()
        return list(value) if isinstance(value, (list, tuple)) else []

    def get_future(self) -> Future[Any]:
        return self._fut


_F = TypeVar("_F", bound=Callable[..., Any])


def _checked(name: str) -> Callable[[_F], _F]:
    """A collective of the backend whose own checks of torch's arguments (the lists'
    lengths, the device, the op) fail as the communicator's do: the call is numbered
    and its rejection published (:meth:`ringlet.calls.Calls._refused`), so that the
    other ranks raise a MismatchError quoting it at once instead of pairing this
    call with their next one."""
    def wrap(fn: _F) -> _F:
        @functools.wraps(fn)
        def method(self: ProcessGroupRinglet, *args: Any, **kwargs: Any) -> Any:
            comm = self.comm
            seq = comm._seq
            try:
                return fn(self, *args, **kwargs)
            except Exception as exc:
                err = comm._refused(name, seq, exc)
                if err is exc:
                    raise
                raise err from exc
        return cast(_F, method)
    return wrap


class ProcessGroupRinglet(dist.ProcessGroup):
    """A torch.distributed process group whose collectives are a ringlet communicator's."""

    def __init__(self, comm: Communicator) -> None:
        super().__init__(comm.rank, comm.size)  # type: ignore[call-arg]
        self.comm = comm
        comm._span = _profiler_range
        comm._lean = None   # every call through the Python path, in a profiler range

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    def setGroupName(self, name: str) -> None:  # noqa: N802 - torch's name
        """torch names the group when it registers it (DeviceMesh, FSDP2 and the functional
        collectives find it by that name); a group written in Python keeps it itself."""
        self._group_name = name

    def getGroupName(self) -> str:  # noqa: N802 - torch's name
        return getattr(self, "_group_name", "")

    def __repr__(self) -> str:
        return f"<ProcessGroupRinglet rank {self.comm.rank} of {self.comm.size}>"

    # --- the bridge --------------------------------------------------------------------

    def _async(self, start: Callable[[bool], Any], finish: Callable[[Any], Any],
               opts: Any = None) -> _Work | _Done:
        """Run a ringlet call, ``start(async_op)``; torch's handle of it.  When torch
        says the caller waits at once (``opts.asyncOp`` False: ``async_op=False`` of
        all_reduce, broadcast, reduce, all_gather), the call runs here, inline, as
        ringlet's own; otherwise on the communicator's worker thread."""
        if opts is not None and getattr(opts, "asyncOp", True) is False:
            return _Done(finish(start(False)))
        return _Work(start(True), finish)

    # --- collectives -------------------------------------------------------------------

    @_checked("all_reduce")
    def allreduce(self, tensors: list[Any], opts: Any = None,  # type: ignore[override]
                  timeout: Any = None, op: Any = None) -> Any:
        tensors = _listed(tensors)
        t = _one(tensors, "all_reduce")
        op = _op(opts if op is None else op)
        d = _dense(t)
        return self._async(lambda a: self.comm.all_reduce(d, op=op, async_op=a),
                           _back(lambda _: tensors, (t, d)), opts)

    @_checked("broadcast")
    def broadcast(self, tensors: list[Any], opts: Any = None,  # type: ignore[override]
                  timeout: Any = None, root: int | None = None) -> Any:
        tensors = _listed(tensors)
        t = _one(tensors, "broadcast")
        d = _dense(t)
        root = _root(opts if root is None else root)
        return self._async(lambda a: self.comm.broadcast(d, root=root, async_op=a),
                           _back(lambda _: tensors, (t, d)), opts)

    @_checked("reduce")
    def reduce(self, tensors: list[Any], opts: Any = None,  # type: ignore[override]
               op: Any = None, timeout: Any = None, root: int | None = None) -> Any:
        tensors = _listed(tensors)
        t = _one(tensors, "reduce")
        root = _root(opts if root is None else root)
        rop = _op(op if isinstance(opts, int) or opts is None else opts)
        d = _dense(t)
        return self._async(
            lambda a: self.comm.reduce(d, root=root, op=rop, async_op=a),
            _back(lambda _: tensors, (t, d)), opts)

    @_checked("all_gather")
    def allgather(self, outputs: list[list[Any]], inputs: list[Any],  # type: ignore[override]
                  opts: Any = None, timeout: Any = None) -> Any:
        if isinstance(inputs, torch.Tensor):   # the short form: a list of outputs, a tensor
            outputs, inputs = [outputs], [inputs]
        x = _dense(_one(inputs, "all_gather"))
        outs = outputs[0]
        _cpu(outs, "all_gather")
        _writable(outs)
        sizes = [o.numel() for o in outs]
        if len(outs) != self.comm.size or len(set(sizes)) == 1:
            self._count(outs, x, "all_gather")

            def finish(res: Any) -> Any:
                for o, r in zip(outs, res, strict=True):
                    o.copy_(r.reshape(o.shape))
                return outs

            return self._async(lambda a: self.comm.all_gather(x, async_op=a), finish, opts)
        # tensors of different sizes (as NCCL allows): the uneven all-gather
        if x.numel() != sizes[self.comm.rank]:
            raise ArgumentError(f"all_gather: this rank's tensor has {x.numel()} elements, "
                                f"its output tensor {sizes[self.comm.rank]}")

        def finish_v(res: Any) -> Any:
            for o, r in zip(outs, torch.split(res, sizes), strict=True):
                o.copy_(r.reshape(o.shape))
            return outs

        return self._async(lambda a: self.comm.all_gather_v(x.reshape(-1), sizes, async_op=a),
                           finish_v, opts)

    @_checked("all_gather")
    def all_gather_single(self, output: Any, input: Any, opts: Any = None) -> Any:  # noqa: A002
        _cpu([output, input], "all_gather_into_tensor")
        x, out = _dense(input), _dense(output)
        x = _apart(x, out)
        return self._async(lambda a: self.comm.all_gather(x, out=out, async_op=a),
                           _back(lambda _: [output], (output, out)), opts)

    @_checked("all_gather_coalesced")
    def allgather_into_tensor_coalesced(self, outputs: list[Any], inputs: list[Any],
                                        opts: Any = None) -> Any:
        """Several ``all_gather_into_tensor`` at once (torch's functional all_gather, which
        DTensor and tensor parallelism call, comes here): ringlet's
        :meth:`~ringlet.Communicator.all_gather_coalesced` (one all_gather per element
        type; ranks whose tensors differ in type or shape get a MismatchError)."""
        _cpu([*outputs, *inputs], "all_gather_into_tensor_coalesced")
        n = self.comm.size
        if len(outputs) != len(inputs):
            raise ArgumentError(f"all_gather_into_tensor_coalesced: {len(outputs)} outputs "
                                f"for {len(inputs)} inputs")
        for i, (o, x) in enumerate(zip(outputs, inputs, strict=True)):
            if o.dtype != x.dtype or o.numel() != n * x.numel():
                raise ArgumentError(
                    f"all_gather_into_tensor_coalesced: output {i} ({o.numel()} x {o.dtype}) "
                    f"is not {n} times its input ({x.numel()} x {x.dtype})")
        outs = [_dense(o) for o in outputs]
        xs = [_dense(x) for x in inputs]   # packed (copied) before the call

        def finish(gathered: Any) -> Any:
            for o, g in zip(outs, gathered, strict=True):
                o.view(-1).copy_(g.reshape(-1))
            return outputs

        return self._async(lambda a: self.comm.all_gather_coalesced(xs, async_op=a),
                           _back(finish, *zip(outputs, outs, strict=True)), opts)

    @_checked("reduce_scatter")
    def reduce_scatter_tensor_coalesced(self, outputs: list[Any], inputs: list[Any],
                                        opts: Any = None) -> Any:
        """Several ``reduce_scatter_tensor`` of one element type at once (torch's functional
        reduce_scatter comes here): one reduce_scatter of the inputs' blocks, rank by rank."""
        _cpu([*outputs, *inputs], "reduce_scatter_tensor_coalesced")
        n = self.comm.size
        if len(outputs) != len(inputs):
            raise ArgumentError(f"reduce_scatter_tensor_coalesced: {len(outputs)} outputs "
                                f"for {len(inputs)} inputs")
        if len({t.dtype for t in [*outputs, *inputs]}) > 1:
            raise ArgumentError("reduce_scatter_tensor_coalesced: tensors of one element type "
                                "per call (a reduction adds like to like)")
        for i, (o, x) in enumerate(zip(outputs, inputs, strict=True)):
            if x.numel() != n * o.numel():
                raise ArgumentError(
                    f"reduce_scatter_tensor_coalesced: input {i} has {x.numel()} elements, "
                    f"not {n} times its output's {o.numel()}")
        op = _op(opts)
        if not inputs:   # still one call, as all_reduce_coalesced's: a rank with no tensors
            # where its peers have some fails with them (its next call paired with theirs)
            return self._async(lambda a: self.comm.barrier(async_op=a), lambda _: outputs,
                               opts)
        x = torch.cat([torch.cat([_dense(t).reshape(n, -1)[r] for t in inputs])
                       for r in range(n)])
        mine = torch.empty(sum(o.numel() for o in outputs), dtype=x.dtype)
        outs = [_dense(o) for o in outputs]

        def finish(_: Any) -> Any:
            for o, part in zip(outs, torch.split(mine, [o.numel() for o in outs]),
                               strict=True):
                o.view(-1).copy_(part)
            return outputs

        return self._async(lambda a: self.comm.reduce_scatter(x, op=op, out=mine, async_op=a),
                           _back(finish, *zip(outputs, outs, strict=True)), opts)

    @_checked("all_reduce_coalesced")
    def allreduce_coalesced(self, tensors: list[Any], opts: Any = None) -> Any:
        """``dist.all_reduce_coalesced`` and torch's functional one: ringlet's
        :meth:`~ringlet.Communicator.all_reduce_coalesced` (one all_reduce per type)."""
        _cpu(tensors, "all_reduce_coalesced")
        op = _op(opts)
        dense = [_dense(t) for t in tensors]
        return self._async(
            lambda a: self.comm.all_reduce_coalesced(dense, op=op, async_op=a),
            _back(lambda _: tensors, *zip(tensors, dense, strict=True)), opts)

    @_checked("reduce_scatter")
    def reduce_scatter(self, outputs: list[Any],  # type: ignore[override]
                       inputs: list[list[Any]], opts: Any = None, timeout: Any = None,
                       op: Any = None) -> Any:
        if isinstance(outputs, torch.Tensor):   # the short form: a tensor, a list of inputs
            outputs, inputs = [outputs], [inputs]
        out = _one(outputs, "reduce_scatter")
        ins = inputs[0]
        _cpu(ins, "reduce_scatter")
        self._count(ins, out, "reduce_scatter")
        x = torch.cat([t.reshape(-1) for t in ins])
        rop = _op(opts if op is None else op)
        d = _dense(out)
        return self._async(lambda a: self.comm.reduce_scatter(x, op=rop, out=d, async_op=a),
                           _back(lambda _: outputs, (out, d)), opts)

    @_checked("reduce_scatter")
    def reduce_scatter_single(self, output: Any, input: Any,  # noqa: A002
                              opts: Any = None) -> Any:
        _cpu([output, input], "reduce_scatter_tensor")
        op = _op(opts)
        x, out = _dense(input), _dense(output)
        x = _apart(x, out)
        return self._async(
            lambda a: self.comm.reduce_scatter(x, op=op, out=out, async_op=a),
            _back(lambda _: [output], (output, out)), opts)

    @_checked("all_to_all")
    def alltoall(self, outputs: list[Any], inputs: list[Any], opts: Any = None) -> Any:
        _cpu([*outputs, *inputs], "all_to_all")
        n = self.comm.size
        if len(inputs) != n or len(outputs) != n:
            raise ArgumentError(f"all_to_all: {len(inputs)} input and {len(outputs)} output "
                                f"tensors for {n} ranks")
        _writable(outputs)
        x = torch.cat([t.reshape(-1) for t in inputs])
        send = [t.numel() for t in inputs]
        recv = [t.numel() for t in outputs]

        def finish(res: Any) -> Any:
            for o, r in zip(outputs, torch.split(res.reshape(-1), recv), strict=True):
                o.copy_(r.reshape(o.shape))
            return outputs

        # always the uneven collective: a rank whose blocks happen to be one size cannot
        # know that the others' are too, and every rank must make the same call
        return self._async(lambda a: self.comm.all_to_all_v(x, send, recv, async_op=a),
                           finish, opts)

    @_checked("all_to_all")
    def alltoall_base(self, output: Any, input: Any, output_split_sizes: list[int],  # noqa: A002
                      input_split_sizes: list[int], opts: Any = None) -> Any:
        _cpu([output, input], "all_to_all_single")
        n = self.comm.size
        splits = {}
        for name, t, given in (("output", output, output_split_sizes),
                               ("input", input, input_split_sizes)):
            if given and len(given) != n:
                raise ArgumentError(f"all_to_all_single: {name}_split_sizes has "
                                    f"{len(given)} entries for {n} ranks")
            rows = t.shape[0] if t.dim() else t.numel()
            if not given and rows % n:
                raise ArgumentError(f"all_to_all_single: {name} has {rows} rows, not a "
                                    f"multiple of {n} ranks; give {name}_split_sizes")
            splits[name] = list(given) if given else [rows // n] * n
        x, out = _dense(input), _dense(output)
        finish = _back(lambda _: [output], (output, out))
        # the even collective only without split sizes (torch's even form, which a program
        # uses on every rank): a rank whose given splits happen to be one size must still
        # make the uneven call its peers make
        if not output_split_sizes and not input_split_sizes:
            return self._async(lambda a: self.comm.all_to_all(x, out=out, async_op=a),
                               finish, opts)
        return self._async(lambda a: self.comm.all_to_all_v(
            x, splits["input"], splits["output"], out=out, async_op=a), finish, opts)

    def all_to_all_single(self, output: Any, input: Any,  # noqa: A002
                          output_split_sizes: list[int], input_split_sizes: list[int],
                          opts: Any = None) -> Any:
        """torch's functional all_to_all_single comes here: :meth:`alltoall_base`."""
        return self.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)

    @_checked("gather")
    def gather(self, outputs: list[list[Any]], inputs: list[Any],  # type: ignore[override]
               opts: Any = None, timeout: Any = None, root: int | None = None) -> Any:
        if isinstance(inputs, torch.Tensor):   # the short form: a list of outputs, a tensor
            outputs, inputs = [outputs], [inputs]
        x = _dense(_one(inputs, "gather"))
        root = _root(opts if root is None else root)
        outs = outputs[0] if outputs else []
        if self.comm.rank == root:
            _cpu(outs, "gather")
            _writable(outs)
            self._count(outs, x, "gather")

        def finish(res: Any) -> Any:
            if res is not None:
                for o, r in zip(outs, res, strict=True):
                    o.copy_(r.reshape(o.shape))
            return outs   # gloo's value: the list of tensors ([] off the root)

        return self._async(lambda a: self.comm.gather(x, root=root, async_op=a), finish, opts)

    @_checked("scatter")
    def scatter(self, outputs: list[Any], inputs: list[list[Any]],  # type: ignore[override]
                opts: Any = None, timeout: Any = None, root: int | None = None) -> Any:
        if isinstance(outputs, torch.Tensor):   # the short form: a tensor, a list of inputs
            outputs, inputs = [outputs], [inputs]
        out = _one(outputs, "scatter")
        root = _root(opts if root is None else root)
        x = None
        if self.comm.rank == root:
            ins = inputs[0]
            _cpu(ins, "scatter")
            self._count(ins, out, "scatter")
            x = torch.cat([t.reshape(-1) for t in ins])
        d = _dense(out)
        return self._async(lambda a: self.comm.scatter(x, root=root, out=d, async_op=a),
                           _back(lambda _: outputs, (out, d)), opts)

    @_checked("barrier")
    def barrier(self, opts: Any = None, timeout: Any = None) -> Any:  # type: ignore[override]
        return self._async(lambda a: self.comm.barrier(async_op=a), lambda _: [], opts)

    # --- point-to-point ----------------------------------------------------------------

    def send(self, tensors: list[Any], dst: int, tag: int) -> Any:
        t = _one(tensors, "send")
        return _Work(self.comm.isend(_dense(t), dst, tag), lambda _: tensors)

    def recv(self, tensors: list[Any], src: int, tag: int) -> Any:
        t = _one(tensors, "recv")
        d = _dense(t)
        return _Work(self.comm.irecv(d, src, tag), _back(lambda _: tensors, (t, d)))

    def recv_anysource(self, tensors: list[Any], tag: int) -> Any:
        t = _one(tensors, "recv")
        d = _dense(t)
        return _Work(self.comm.irecv(d, ANY_SOURCE, tag), _back(lambda _: tensors, (t, d)))

    # --- life --------------------------------------------------------------------------

    def shutdown(self) -> None:
        self.comm.close()

    def abort(self) -> None:
        self.comm.close()

    def _count(self, parts: Sequence[Any], one: Any, what: str) -> None:
        n = self.comm.size
        if len(parts) != n:
            raise ArgumentError(f"{what}: {len(parts)} tensors for {n} ranks")
        bad = [i for i, t in enumerate(parts) if t.numel() != one.numel()]
        if bad:
            raise ArgumentError(f"{what}: tensor {bad[0]} has {parts[bad[0]].numel()} "
                                f"elements, the call's has {one.numel()}")


def communicator(group: Any = None) -> Communicator:
    """The ringlet communicator behind a torch process group on this backend (the default
    group if None): for ringlet's own calls (``algorithm=``, explanations) on the same
    ranks.  ArgumentError if the group is on another backend."""
    pg = dist.distributed_c10d._get_default_group() if group is None else group
    if not isinstance(pg, ProcessGroupRinglet):
        raise ArgumentError(f"this process group's backend is {dist.get_backend(pg)!r}, not "
                            f"'ringlet' (dist.init_process_group('ringlet') or "
                            f"dist.new_group(backend='ringlet'))")
    return pg.comm


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> ProcessGroupRinglet:
    """torch's constructor of the backend (see ``Backend.register_backend``)."""
    from torch.distributed.constants import default_pg_timeout

    from .startup import init_on_store

    settings = Settings.from_env()
    secs = timeout.total_seconds() if timeout is not None else 0.0
    # torch gives its default (30 min) when init_process_group has no timeout=: then a
    # RINGLET_TIMEOUT the job sets is what it asked for
    torch_default = timeout == default_pg_timeout and "RINGLET_TIMEOUT" in os.environ
    if timeout is not None and not torch_default:
        try:
            settings = settings.replace(timeout=secs)
        except ConfigError as exc:   # say where the value came from
            raise ConfigError(f"init_process_group(timeout={timeout!r}): {exc}") from None
    return ProcessGroupRinglet(init_on_store(store, rank, size, settings=settings))


if BACKEND not in dist.Backend.backend_list:
    dist.Backend.register_backend(BACKEND, _create, devices=["cpu"])
