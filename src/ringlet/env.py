"""Where this process sits in a job: its rank and size, as its launcher tells it.

:func:`detect` reads the variables that launchers set for the processes they
start and returns a :class:`LaunchInfo`.  It understands, innermost launcher
first (``torchrun`` inside an ``srun`` step is a torchrun job):

=========  ===================================================================
source     variables
=========  ===================================================================
ringlet    ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
           ``RINGLET_JOB_ID`` (set by ``ringlet run``)
torchrun   ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
           ``TORCHELASTIC_RUN_ID``, ``TORCHELASTIC_RESTART_COUNT``,
           ``MASTER_ADDR``, ``MASTER_PORT`` (also torch's ``env://`` convention)
openmpi    ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``,
           ``OMPI_COMM_WORLD_LOCAL_RANK``, ``OMPI_COMM_WORLD_LOCAL_SIZE``
mpich      ``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID``, ``MPI_LOCALNRANKS``
           (Hydra's ``mpiexec``)
slurm      ``SLURM_PROCID``, ``SLURM_STEP_NUM_TASKS`` or ``SLURM_NTASKS``,
           ``SLURM_LOCALID``, ``SLURM_STEP_TASKS_PER_NODE`` or
           ``SLURM_NTASKS_PER_NODE``, ``SLURM_JOB_ID``, ``SLURM_STEP_ID``
           (inside an ``srun`` step only: a batch script is a single process)
single     none of the above: rank 0 of 1
=========  ===================================================================

When a launcher gives the ranks but not the local (per host) numbers, the
job is taken to be on one host (local rank = rank, local size = size), or,
under ``srun``, Slurm's local numbers are used if Slurm agrees on rank and
size.

Job id and rendezvous key
-------------------------
``job_id`` is set only by ``ringlet run`` and ``ringlet.spawn``: 128 random
bits, fresh per job, that name the job's shared-memory segments and so must
not be guessable.  Other launchers' ids (``TORCHELASTIC_RUN_ID``, whose
default is the literal ``none``; ``SLURM_JOB_ID``, a small public number) are
neither unique per host nor secret, so they never become ``job_id``.

``rendezvous_key`` lets the ranks of one job on one host find each other
when there is no ``job_id``.  It is a digest of the launcher's ids and of
the parent process id: the ranks that one launcher starts on one host share
that parent (torchrun's agent, Hydra's proxy, Open MPI's daemon,
slurmstepd, ``ringlet run`` itself), and two jobs on a host do not.  The
key is derived from public information: it is only a meeting point, never a
secret, and nothing may be protected by knowing it.  Rank 0 listens at an
address named after it (:func:`ringlet.startup.rendezvous_name`); what the
ranks trust is the user of the process at the other end of that socket,
checked by the kernel, never the name (see :mod:`ringlet.startup`).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ConfigError

#: Slurm's reserved step ids (batch script, extern, interactive...) are the
#: top of the 32-bit range; an ``srun`` step has a small id.
_SLURM_FIRST_SPECIAL_STEP = 0xFFFFFFF0

_JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,128}\Z")
_TASKS_PER_NODE = re.compile(r"(\d+)(?:\(x(\d+)\))?\Z")


@dataclass(frozen=True)
class LaunchInfo:
    """This process's place in its job, as :func:`detect` found it.

    ``source`` names the launcher: ``"ringlet"``, ``"torchrun"``,
    ``"openmpi"``, ``"mpich"``, ``"slurm"`` or ``"single"``.  ``job_id`` is
    the secret per-job id of ``ringlet run``/``ringlet.spawn``, ``None``
    under other launchers.  ``rendezvous_key`` is a public meeting point for
    the ranks of this job on this host (see the module documentation); it is
    never a secret.
    """

    rank: int
    size: int
    local_rank: int
    local_size: int
    job_id: str | None
    source: str
    rendezvous_key: str


def detect(environ: Mapping[str, str] | None = None, *, ppid: int | None = None) -> LaunchInfo:
    """Find rank, size and local rank/size from the launcher's environment variables.

    ``environ`` defaults to ``os.environ`` and ``ppid`` to ``os.getppid()``;
    given both, this is a pure function.  Raises :class:`ConfigError`, naming
    the variable, when a value is not an integer, a rank is not below its
    size, or a launcher's variables are only partly set.

    Example (under ``ringlet run -n 4``, on the third rank)::

        >>> info = detect()
        >>> info.rank, info.size, info.source
        (2, 4, 'ringlet')
    """
    env = os.environ if environ is None else environ
    parent = os.getppid() if ppid is None else ppid
    if "RINGLET_JOB_ID" in env:
        job_id = env["RINGLET_JOB_ID"]
        if not _JOB_ID.match(job_id):
            raise ConfigError(
                f"RINGLET_JOB_ID={job_id!r} is not a job id (1 to 128 letters, digits, '-' or "
                f"'_'); it is set by `ringlet run`, do not set it by hand")
        return _info(env, parent, "ringlet", ("RANK", "WORLD_SIZE"),
                     ("LOCAL_RANK", "LOCAL_WORLD_SIZE"), ids=(job_id,), job_id=job_id)
    if "RANK" in env or "WORLD_SIZE" in env:
        return _info(env, parent, "torchrun", ("RANK", "WORLD_SIZE"),
                     ("LOCAL_RANK", "LOCAL_WORLD_SIZE"),
                     ids=_present(env, "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
                                  "MASTER_ADDR", "MASTER_PORT"))
    if "OMPI_COMM_WORLD_RANK" in env or "OMPI_COMM_WORLD_SIZE" in env:
        return _info(env, parent, "openmpi", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
                     ("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
                     ids=_present(env, "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
                                  "OMPI_MCA_orte_ess_jobid"))
    if "PMI_RANK" in env or "PMI_SIZE" in env:
        return _info(env, parent, "mpich", ("PMI_RANK", "PMI_SIZE"),
                     ("MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
                     ids=_present(env, "PMI_JOBID", "PMI_KVSNAME"))
    slurm = _slurm(env, parent)
    if slurm is not None:
        return slurm
    return LaunchInfo(rank=0, size=1, local_rank=0, local_size=1, job_id=None,
                      source="single", rendezvous_key=_key("single", (), parent))


def _info(env: Mapping[str, str], ppid: int, source: str, global_vars: tuple[str, str],
          local_vars: tuple[str, str], *, ids: tuple[str, ...],
          job_id: str | None = None) -> LaunchInfo:
    """Read one launcher's rank/size pair and local pair and check them together."""
    rank_var, size_var = global_vars
    size = _int(env, size_var, source, minimum=1, partner=rank_var)
    rank = _int(env, rank_var, source, minimum=0, partner=size_var)
    _below(rank_var, rank, size_var, size)
    lrank_var, lsize_var = local_vars
    if lrank_var in env or lsize_var in env:
        local_size = _int(env, lsize_var, source, minimum=1, partner=lrank_var)
        local_rank = _int(env, lrank_var, source, minimum=0, partner=lsize_var)
        _below(lrank_var, local_rank, lsize_var, local_size)
        _local_fits(lsize_var, local_size, size_var, size)
    else:
        try:
            slurm = _slurm(env, ppid)
        except ConfigError:  # Slurm is not this job's launcher; its variables are only a hint
            slurm = None
        if slurm is not None and (slurm.rank, slurm.size) == (rank, size):
            local_rank, local_size = slurm.local_rank, slurm.local_size
        else:
            local_rank, local_size = rank, size
    return LaunchInfo(rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                      job_id=job_id, source=source, rendezvous_key=_key(source, ids, ppid))


def _slurm(env: Mapping[str, str], ppid: int) -> LaunchInfo | None:
    """Slurm's view, inside an ``srun`` step; ``None`` outside one (e.g. in a batch script)."""
    step_var = "SLURM_STEP_ID" if "SLURM_STEP_ID" in env else "SLURM_STEPID"
    if "SLURM_PROCID" not in env or step_var not in env:
        return None
    step = _int(env, step_var, "slurm", minimum=0)
    if step >= _SLURM_FIRST_SPECIAL_STEP:
        return None
    size_var = "SLURM_STEP_NUM_TASKS" if "SLURM_STEP_NUM_TASKS" in env else "SLURM_NTASKS"
    size = _int(env, size_var, "slurm", minimum=1, partner="SLURM_PROCID")
    rank = _int(env, "SLURM_PROCID", "slurm", minimum=0)
    _below("SLURM_PROCID", rank, size_var, size)
    local_rank = _int(env, "SLURM_LOCALID", "slurm", minimum=0, partner="SLURM_PROCID")
    lsize_var, local_size = _slurm_local_size(env, size_var, size)
    _below("SLURM_LOCALID", local_rank, lsize_var, local_size)
    _local_fits(lsize_var, local_size, size_var, size)
    ids = (env.get("SLURM_JOB_ID", env.get("SLURM_JOBID", "")), str(step))
    return LaunchInfo(rank=rank, size=size, local_rank=local_rank, local_size=local_size,
                      job_id=None, source="slurm", rendezvous_key=_key("slurm", ids, ppid))


def _slurm_local_size(env: Mapping[str, str], size_var: str, size: int) -> tuple[str, int]:
    """Tasks of this step on this node, from ``SLURM_STEP_TASKS_PER_NODE`` (``"2(x3),1"``)."""
    var = "SLURM_STEP_TASKS_PER_NODE"
    if var not in env:
        if "SLURM_NTASKS_PER_NODE" in env:
            return "SLURM_NTASKS_PER_NODE", _int(env, "SLURM_NTASKS_PER_NODE", "slurm", minimum=1)
        if env.get("SLURM_STEP_NUM_NODES", env.get("SLURM_NNODES")) == "1":
            return size_var, size
        raise ConfigError(
            "Slurm step without SLURM_STEP_TASKS_PER_NODE or SLURM_NTASKS_PER_NODE: cannot "
            "tell how many ranks share this node; launch with srun (which sets them)")
    per_node: list[int] = []
    for part in env[var].split(","):
        m = _TASKS_PER_NODE.match(part.strip())
        if m is None:
            raise ConfigError(
                f"{var}={env[var]!r} is not a Slurm task count list like '4' or '2(x3),1'")
        per_node += [int(m.group(1))] * int(m.group(2) or 1)
    if len(set(per_node)) == 1:
        return var, per_node[0]
    node = _int(env, "SLURM_NODEID", "slurm", minimum=0, partner=var)
    if node >= len(per_node):
        raise ConfigError(
            f"SLURM_NODEID={node} is not below the {len(per_node)} nodes of {var}={env[var]!r}")
    return var, per_node[node]


def _int(env: Mapping[str, str], var: str, source: str, *, minimum: int,
         partner: str | None = None) -> int:
    """``env[var]`` as an integer >= ``minimum``, or a ConfigError naming ``var``."""
    if var not in env:
        given = f" but {partner} is" if partner is not None and partner in env else ""
        raise ConfigError(
            f"{var} is not set{given}: {source} launches set both; set it, or unset the "
            f"others to run as a single rank")
    text = env[var]
    try:
        value = int(text.strip())
    except ValueError:
        raise ConfigError(f"{var}={text!r} (from {source}) is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{var}={text!r} (from {source}) must be >= {minimum}")
    return value


def _below(var: str, value: int, limit_var: str, limit: int) -> None:
    if value >= limit:
        raise ConfigError(
            f"{var}={value} is not below {limit_var}={limit}: ranks count 0..{limit - 1}")


def _local_fits(local_var: str, local: int, size_var: str, size: int) -> None:
    if local > size:
        raise ConfigError(f"{local_var}={local} is larger than {size_var}={size}")


def _present(env: Mapping[str, str], *names: str) -> tuple[str, ...]:
    """``name=value`` for each of ``names`` that is set, in order."""
    return tuple(f"{n}={env[n]}" for n in names if n in env)


def _key(source: str, ids: tuple[str, ...], ppid: int) -> str:
    """A filename-safe digest of the launcher's ids and the parent pid (not a secret)."""
    text = "\0".join((source, *ids, str(ppid)))
    return f"{source}-{hashlib.sha256(text.encode()).hexdigest()[:24]}"
