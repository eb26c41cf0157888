"""Cross-memory attach: read a peer process's memory in one copy (``process_vm_readv``).

The staged shared-memory paths move a block twice: its owner copies it into
its stage area, the reader copies it out.  With cross-memory attach the
reader copies it straight from the owner's own array (the kernel pins the
owner's pages and copies once), as MPICH's and Open MPI's CMA modes do for
large messages (see :class:`~ringlet.transport.fused.Fused`).  The kernel's
copy is slower per byte than a user-space one (8 MiB: 243-342 us against
138-212 us for memcpy on this project's machine), so it can only pay where it
saves a copy that misses the caches.  Measured A/B in one job
(``benchmarks/ab_cma.py``, 2 ranks), with the staged path's streaming stores:
all_to_all 1.02-1.47x faster than staged with 8 MiB blocks and 0.99-1.09x
with 2 MiB; all_gather 1.00-1.21x and 0.73-0.90x; broadcast 0.64-0.80x
(``benchmarks/profile_large.py`` puts it beside MPICH, which reads the same
way).  At 4 ranks on 2 cores, with 4 MiB blocks, all_to_all 1.46x and
all_gather 0.58x (``-n 4``): where it pays depends on the collective and the
ranks, not only on the block.  It is off by default (``RINGLET_CMA_BYTES``
0) because the cost model (``ringlet predict``, the tuner) does not know the
kernel's copy yet: set a block size to use it for all_gather and all_to_all
where it is faster.

It needs Linux 3.2+ and permission to read the peer (the same user and, under
Yama's ``ptrace_scope`` 1, a process that allowed it: every rank calls
:func:`allow_peers`; containers' seccomp profiles may forbid the call).  Nothing
is probed in advance: the first call that tries it finds out on every rank
together (the fused path publishes each rank's result), and a rank that could
not read makes every rank fall back to the staged path for good.  ctypes, so
no compiler is needed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from typing import Any

import numpy as np


class _Iovec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


_PR_SET_PTRACER = 0x59616D61
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        fn = lib.process_vm_readv
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_ulong,
                   ctypes.POINTER(_Iovec), ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_ssize_t
    return lib


_LIB = _libc()
#: whether this platform has the call at all (Linux with glibc or musl)
AVAILABLE = _LIB is not None


def allow_peers() -> None:
    """Let processes of the same user read this one (Yama ``ptrace_scope`` 1 otherwise
    allows only ancestors); a no-op where Yama is absent."""
    if _LIB is not None:
        _LIB.prctl(_PR_SET_PTRACER, ctypes.c_ulong(_PR_SET_PTRACER_ANY), 0, 0, 0)


def address(a: np.ndarray) -> int:
    """Where a contiguous array's data starts in this process."""
    return int(a.__array_interface__["data"][0])


def read(pid: int, remote: int, into: np.ndarray) -> bool:
    """Copy ``into.nbytes`` bytes at address ``remote`` of process ``pid`` into ``into``
    (C-contiguous); False if the kernel refused (permission, no such process, a bad
    address), with nothing promised about ``into``."""
    fn = _LIB.process_vm_readv if _LIB is not None else None
    if fn is None:
        return False
    done, total = 0, into.nbytes
    base = address(into)
    local, far = _Iovec(), _Iovec()
    while done < total:
        local.iov_base, local.iov_len = base + done, total - done
        far.iov_base, far.iov_len = remote + done, total - done
        got = fn(pid, ctypes.byref(local), 1, ctypes.byref(far), 1, 0)
        if got <= 0:
            err = ctypes.get_errno()
            if got < 0 and err == 4:   # EINTR
                continue
            return False
        done += got
    return True


def errno_text() -> str:
    """The last failure of :func:`read`, as the OS says it."""
    return os.strerror(ctypes.get_errno())
