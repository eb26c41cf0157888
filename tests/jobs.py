"""The environment of a job a test starts (mpiexec, torchrun, plain processes): the
test's own, without any launcher's or ringlet's variables it may have inherited."""

from __future__ import annotations

import os
import pty
import subprocess

#: variables a launcher (Hydra, Open MPI, torchrun) or ringlet sets, by prefix and by name
LAUNCHER_PREFIXES = ("RINGLET_", "PMI_", "OMPI_", "MPIR_", "HYDRA_", "MASTER_",
                     "TORCHELASTIC_")
LAUNCHER_NAMES = frozenset({"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"})


def launcher_vars(also: tuple[str, ...] = ()) -> list[str]:
    """The launcher and ringlet variables of this process's environment (and those
    starting with one of ``also``)."""
    return [k for k in os.environ
            if k.startswith(LAUNCHER_PREFIXES + also) or k in LAUNCHER_NAMES]


def clean_env(also: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    """This process's environment less :func:`launcher_vars`, unbuffered, plus ``extra``."""
    drop = set(launcher_vars(also))
    env = {k: v for k, v in os.environ.items() if k not in drop}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def on_a_terminal(cmd: list[str], env: dict[str, str] | None = None,
                  timeout: float = 120) -> tuple[subprocess.CompletedProcess[str], str]:
    """Run ``cmd`` with stderr on a pseudo-terminal (so progress bars draw): the run, and
    what stderr showed."""
    main, sub = pty.openpty()
    try:
        p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=sub, text=True,
                           timeout=timeout, env=env)
        os.close(sub)
        err = b""
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:
                break
            if not chunk:
                break
            err += chunk
    finally:
        os.close(main)
    return p, err.decode(errors="replace")
