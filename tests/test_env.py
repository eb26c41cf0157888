"""Launch-environment detection: one dict environment per launcher, and the broken ones."""

from __future__ import annotations

import os

import pytest

from ringlet.env import LaunchInfo, detect
from ringlet.errors import ConfigError

PPID = 4242

RINGLET = {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4",
           "RINGLET_JOB_ID": "0123456789abcdef0123456789abcdef"}
TORCHRUN = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
            "GROUP_RANK": "1", "TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "0",
            "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
OPENMPI = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "6",
           "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "3",
           "PMIX_NAMESPACE": "prterun-node0-1234@1"}
MPICH = {"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2",
         "PMI_FD": "6"}
SLURM = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "SLURM_PROCID": "5", "SLURM_NTASKS": "6",
         "SLURM_LOCALID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x3)", "SLURM_NODEID": "2"}


def info(env: dict[str, str], ppid: int = PPID) -> LaunchInfo:
    return detect(env, ppid=ppid)


def without(env: dict[str, str], *names: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


@pytest.mark.parametrize("env, expected", [
    (RINGLET, (2, 4, 2, 4, "0123456789abcdef0123456789abcdef", "ringlet")),
    (TORCHRUN, (5, 8, 1, 4, None, "torchrun")),
    (OPENMPI, (3, 6, 0, 3, None, "openmpi")),
    (MPICH, (1, 2, 1, 2, None, "mpich")),
    (SLURM, (5, 6, 1, 2, None, "slurm")),
    ({}, (0, 1, 0, 1, None, "single")),
    ({"HOME": "/root", "PATH": "/bin"}, (0, 1, 0, 1, None, "single")),
], ids=["ringlet", "torchrun", "openmpi", "mpich", "slurm", "empty", "unrelated"])
def test_each_launcher(env: dict[str, str], expected: tuple[object, ...]) -> None:
    i = info(env)
    assert (i.rank, i.size, i.local_rank, i.local_size, i.job_id, i.source) == expected


def test_uses_os_environ_and_getppid_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("RINGLET_JOB_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "3")
    i = detect()
    assert (i.rank, i.size, i.source) == (1, 3, "openmpi")
    assert i == detect(ppid=os.getppid())


def test_innermost_launcher_wins() -> None:
    # torchrun inside an srun step; mpiexec inside an srun allocation
    assert info({**SLURM, **TORCHRUN}).source == "torchrun"
    assert info({**SLURM, **MPICH}).source == "mpich"
    assert info({**SLURM, **OPENMPI}).source == "openmpi"
    assert info({**TORCHRUN, **RINGLET}).source == "ringlet"


def test_launch_info_is_frozen() -> None:
    with pytest.raises(AttributeError):
        info(RINGLET).rank = 3  # type: ignore[misc]


# -- rendezvous key -----------------------------------------------------------------


def test_rendezvous_key_shared_by_one_job_on_one_host() -> None:
    ranks = [{**TORCHRUN, "RANK": str(r), "LOCAL_RANK": str(r % 4)} for r in range(4, 8)]
    keys = {info(env).rendezvous_key for env in ranks}
    assert len(keys) == 1
    key = keys.pop()
    assert key.startswith("torchrun-") and key.replace("-", "").isalnum()


@pytest.mark.parametrize("env, change", [
    (TORCHRUN, {"MASTER_PORT": "29501"}),
    (TORCHRUN, {"TORCHELASTIC_RESTART_COUNT": "1"}),
    (OPENMPI, {"PMIX_NAMESPACE": "prterun-node0-999@1"}),
    (SLURM, {"SLURM_STEP_ID": "1"}),
    (SLURM, {"SLURM_JOB_ID": "78"}),
    (RINGLET, {"RINGLET_JOB_ID": "f" * 32}),
])
def test_rendezvous_key_differs_between_jobs(env: dict[str, str],
                                             change: dict[str, str]) -> None:
    assert info(env).rendezvous_key != info({**env, **change}).rendezvous_key


@pytest.mark.parametrize("env", [TORCHRUN, OPENMPI, MPICH, SLURM, RINGLET, {}])
def test_rendezvous_key_differs_between_parents(env: dict[str, str]) -> None:
    # two jobs on one host with identical launcher ids (torchrun's run id 'none') differ
    # by their launcher's process
    assert info(env, ppid=1000).rendezvous_key != info(env, ppid=1001).rendezvous_key


def test_rendezvous_key_does_not_reveal_the_job_id() -> None:
    i = info(RINGLET)
    assert i.job_id is not None and i.job_id not in i.rendezvous_key


# -- local numbers --------------------------------------------------------------------


def test_missing_local_numbers_mean_one_host() -> None:
    i = info({"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "localhost", "MASTER_PORT": "1"})
    assert (i.rank, i.size, i.local_rank, i.local_size, i.source) == (3, 4, 3, 4, "torchrun")


def test_missing_local_numbers_taken_from_a_matching_srun_step() -> None:
    # srun --mpi=pmi2 sets PMI_RANK/PMI_SIZE but not Hydra's MPI_LOCAL* variables
    env = {**SLURM, "PMI_RANK": "5", "PMI_SIZE": "6"}
    i = info(env)
    assert (i.source, i.rank, i.size, i.local_rank, i.local_size) == ("mpich", 5, 6, 1, 2)
    # a Slurm step that disagrees (mpiexec's proxy was the srun task) is not used
    i = info({**SLURM, "SLURM_PROCID": "0", "PMI_RANK": "5", "PMI_SIZE": "6"})
    assert (i.local_rank, i.local_size) == (5, 6)
    # nor is a broken one
    i = info({**SLURM, "SLURM_LOCALID": "x", "PMI_RANK": "5", "PMI_SIZE": "6"})
    assert (i.local_rank, i.local_size) == (5, 6)


@pytest.mark.parametrize("tasks, node, local_size", [
    ("4", None, 4), ("2(x3)", None, 2), ("3,2", "0", 3), ("3,2", "1", 2),
    ("2(x2),1", "2", 1), (" 4 ", None, 4),
])
def test_slurm_tasks_per_node(tasks: str, node: str | None, local_size: int) -> None:
    env = {**SLURM, "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
           "SLURM_STEP_TASKS_PER_NODE": tasks}
    env.pop("SLURM_NODEID")
    if node is not None:
        env["SLURM_NODEID"] = node
    assert info(env).local_size == local_size


def test_slurm_variants() -> None:
    env = without(SLURM, "SLURM_STEP_TASKS_PER_NODE", "SLURM_STEP_ID")
    assert info({**env, "SLURM_STEPID": "0", "SLURM_NTASKS_PER_NODE": "3"}).local_size == 3
    one_node = {**env, "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "1", "SLURM_PROCID": "4"}
    assert info(one_node).local_size == 6
    # --preserve-env keeps the allocation's SLURM_NTASKS; the step's own count wins
    assert info({**SLURM, "SLURM_NTASKS": "64", "SLURM_STEP_NUM_TASKS": "6"}).size == 6


@pytest.mark.parametrize("extra", [
    {},                                        # batch script: SLURM_PROCID=0, no step
    {"SLURM_STEP_ID": "4294967294"},           # the batch step's reserved id
    {"SLURM_STEP_ID": "4294967291"},           # the interactive step
])
def test_slurm_outside_an_srun_step_is_a_single_rank(extra: dict[str, str]) -> None:
    env = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "0", "SLURM_NTASKS": "32", **extra}
    i = info(env)
    assert (i.source, i.rank, i.size) == ("single", 0, 1)


# -- broken environments ----------------------------------------------------------------


@pytest.mark.parametrize("env, message", [
    ({**TORCHRUN, "RANK": "8"}, r"RANK=8 is not below WORLD_SIZE=8"),
    ({**TORCHRUN, "RANK": "two"}, r"RANK='two' \(from torchrun\) is not an integer"),
    ({**TORCHRUN, "WORLD_SIZE": "0"}, r"WORLD_SIZE='0' \(from torchrun\) must be >= 1"),
    ({**TORCHRUN, "RANK": "-1"}, r"RANK='-1' .* must be >= 0"),
    ({"RANK": "0"}, r"WORLD_SIZE is not set but RANK is"),
    ({"WORLD_SIZE": "2"}, r"RANK is not set but WORLD_SIZE is"),
    ({**TORCHRUN, "LOCAL_RANK": "4"}, r"LOCAL_RANK=4 is not below LOCAL_WORLD_SIZE=4"),
    ({**TORCHRUN, "LOCAL_WORLD_SIZE": "9"}, r"LOCAL_WORLD_SIZE=9 is larger than WORLD_SIZE=8"),
    (without(TORCHRUN, "LOCAL_RANK"),
     r"LOCAL_RANK is not set but LOCAL_WORLD_SIZE is"),
    ({**RINGLET, "RINGLET_JOB_ID": "../etc"}, r"RINGLET_JOB_ID='../etc' is not a job id"),
    ({**RINGLET, "RINGLET_JOB_ID": ""}, r"RINGLET_JOB_ID='' is not a job id"),
    ({"RINGLET_JOB_ID": "abc"}, r"WORLD_SIZE is not set"),
    ({**OPENMPI, "OMPI_COMM_WORLD_RANK": "6"},
     r"OMPI_COMM_WORLD_RANK=6 is not below OMPI_COMM_WORLD_SIZE=6"),
    ({**OPENMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "3.5"},
     r"OMPI_COMM_WORLD_LOCAL_SIZE='3.5' \(from openmpi\) is not an integer"),
    ({**MPICH, "PMI_SIZE": ""}, r"PMI_SIZE='' \(from mpich\) is not an integer"),
    ({**MPICH, "MPI_LOCALRANKID": "2"}, r"MPI_LOCALRANKID=2 is not below MPI_LOCALNRANKS=2"),
    ({**SLURM, "SLURM_PROCID": "6"}, r"SLURM_PROCID=6 is not below SLURM_NTASKS=6"),
    ({**SLURM, "SLURM_LOCALID": "2"},
     r"SLURM_LOCALID=2 is not below SLURM_STEP_TASKS_PER_NODE=2"),
    ({**SLURM, "SLURM_STEP_TASKS_PER_NODE": "2(3)"},
     r"SLURM_STEP_TASKS_PER_NODE='2\(3\)' is not a Slurm task count list"),
    ({**SLURM, "SLURM_STEP_TASKS_PER_NODE": "3,2", "SLURM_NODEID": "2"},
     r"SLURM_NODEID=2 is not below the 2 nodes"),
    ({**without(SLURM, "SLURM_NODEID"), "SLURM_STEP_TASKS_PER_NODE": "3,2"},
     r"SLURM_NODEID is not set but SLURM_STEP_TASKS_PER_NODE is"),
    (without(SLURM, "SLURM_STEP_TASKS_PER_NODE"),
     r"cannot tell how many ranks share this node"),
    (without(SLURM, "SLURM_NTASKS"),
     r"SLURM_NTASKS is not set but SLURM_PROCID is"),
    ({**SLURM, "SLURM_STEP_ID": "x"}, r"SLURM_STEP_ID='x' \(from slurm\) is not an integer"),
])
def test_broken_environments_name_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        info(env)
