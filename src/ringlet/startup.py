"""Start-up: joining a job (:func:`init`) and the rendezvous under other launchers.

``ringlet run`` and :func:`ringlet.spawn` hand every rank a random job id.
Under torchrun, mpiexec or srun the ranks agree on one through a
rendezvous file in the shared-memory directory (:func:`_rendezvous`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
import zlib

from .comm import Communicator
from .config import Settings
from .errors import ArgumentError, CommTimeoutError
from .transport.shm import ShmTransport


def init(*, settings: Settings | None = None, rank: int | None = None, size: int | None = None,
         job_id: str | None = None) -> Communicator:
    """Join the job and return the world communicator.

    Rank and size come from the arguments, else from the launcher's
    environment: ``ringlet run``, torchrun, mpiexec (MPICH, Open MPI) or
    srun.  With no launcher at all, a single-rank communicator.
    """
    settings = Settings.from_env() if settings is None else settings
    rdv_file = None
    if rank is None or size is None:
        from .env import detect

        info = detect()
        rank = info.rank if rank is None else rank
        size = info.size if size is None else size
        if job_id is None:
            job_id = info.job_id
            if job_id is None and size > 1:
                job_id, rdv_file = _rendezvous(info.rendezvous_key, rank, size, settings)
    if not 0 <= rank < size:
        raise ArgumentError(f"rank {rank} is out of range for size {size}")
    if job_id is None:
        if size > 1:
            raise ArgumentError("init: give job_id when passing rank and size for more than "
                                "one rank (every rank must pass the same one)")
        job_id = secrets.token_hex(16)
    t = ShmTransport(rank, size, f"ringlet-{job_id}-w", settings)
    t.connect()
    if rdv_file is not None and rank == 0:
        # every rank has connected, so every rank has read the rendezvous file
        with contextlib.suppress(FileNotFoundError):
            os.unlink(rdv_file)
    return Communicator(rank, size, t, settings, job_id)


def _rendezvous(key: str, rank: int, size: int, settings: Settings) -> tuple[str, str]:
    """Agree on a random job id through a file named after the launcher's ids.

    Rank 0 writes a fresh random id; the others read it.  The file is only a
    meeting point (its name is derivable from the environment); the segments
    themselves get the random id and mode 0600.
    """
    from .transport.shm import SHM_DIR

    digest = format(zlib.crc32(key.encode()), "08x") + format(
        zlib.adler32(key.encode()), "08x")
    path = os.path.join(SHM_DIR, f"ringlet-rdv-{digest}")
    deadline = time.monotonic() + settings.timeout
    if rank == 0:
        job = secrets.token_hex(16)
        tmp = f"{path}.{os.getpid()}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"{key}\n{job}\n")
        os.replace(tmp, path)
        return job, path
    start = time.time() - 5.0
    delay = 1e-3
    while True:
        try:
            st = os.stat(path)
            if st.st_mtime >= start - settings.timeout:
                with open(path) as f:
                    k, job = f.read().split("\n")[:2]
                if k == key and job:
                    return job, path
        except (FileNotFoundError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise CommTimeoutError(
                f"timed out after {settings.timeout:g} s waiting for rank 0 to start "
                f"(rendezvous file {path})")
        time.sleep(delay)
        delay = min(delay * 2, 0.05)
