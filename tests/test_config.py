"""Settings: defaults, RINGLET_* overrides, validation, and ``ringlet config``."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import pytest

from ringlet.config import LAUNCH_VARIABLES, Settings, parse_bytes
from ringlet.configcli import configure, main
from ringlet.errors import ConfigError


def test_defaults() -> None:
    s = Settings()
    assert s.timeout == 300.0
    assert s.debug == ""
    assert s.algo == ""
    assert s.engine == "auto" and s.node == ""
    assert s.shm_slot_bytes == 256 << 10
    assert s.shm_slots == 4
    assert s.grace == 3.0
    assert s.start_method == "auto"
    assert Settings.from_env({}) == s


def test_every_setting_has_a_variable_and_a_doc() -> None:
    rows = Settings().describe()
    assert [var for var, _, _ in rows] == [
        f"RINGLET_{f.name.upper()}" for f in dataclasses.fields(Settings)]
    assert all(doc.strip() for _, _, doc in rows)


def test_overrides_are_parsed_and_typed() -> None:
    s = Settings.from_env({
        "RINGLET_TIMEOUT": "30", "RINGLET_DEBUG": "INFO", "RINGLET_ALGO": "all_reduce:ring",
        "RINGLET_SHM_SLOTS": "8", "RINGLET_SHM_SLOT_BYTES": "64K", "RINGLET_GRACE": "0.5",
        "RINGLET_START_METHOD": "fork", "RINGLET_SPIN_US": "0",
        "HOME": "/root", "RINGLET_JOB_ID": "abc",   # not settings: ignored
    })
    assert s.timeout == 30.0 and isinstance(s.timeout, float)
    assert s.shm_slots == 8 and isinstance(s.shm_slots, int)
    assert s.shm_slot_bytes == 65536
    assert (s.debug, s.algo, s.grace, s.start_method, s.spin_us) == (
        "INFO", "all_reduce:ring", 0.5, "fork", 0.0)
    assert "RINGLET_JOB_ID" in LAUNCH_VARIABLES


def test_keyword_overrides_win_over_the_environment() -> None:
    s = Settings.from_env({"RINGLET_TIMEOUT": "30"}, timeout=7)
    assert s.timeout == 7


@pytest.mark.parametrize("text, value", [
    ("4096", 4096), ("64K", 65536), ("64k", 65536), ("64KiB", 65536), ("64KB", 65536),
    ("1M", 1 << 20), ("2G", 2 << 30), ("1.5K", 1536), (" 8K ", 8192), ("0", 0),
])
def test_byte_sizes(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text, message", [
    ("lots", r"'lots' is not a byte size; write e.g. 4096, 64K"),
    ("", r"'' is not a byte size"),
    ("1.3", r"'1.3' is not a whole, non-negative number of bytes"),
    ("-4K", r"'-4K' is not a whole, non-negative"),
])
def test_bad_byte_sizes(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_bytes(text)


def test_unknown_variable_is_rejected_with_the_known_names() -> None:
    with pytest.raises(ConfigError, match=r"unknown setting RINGLET_FOO='1'; known: .*"
                                          r"RINGLET_GRACE.*RINGLET_TIMEOUT.*ringlet config"):
        Settings.from_env({"RINGLET_FOO": "1"})


@pytest.mark.parametrize("env, message", [
    ({"RINGLET_TIMEOUT": "soon"}, r"RINGLET_TIMEOUT='soon' is not a valid float"),
    ({"RINGLET_SHM_SLOTS": "4.0"}, r"RINGLET_SHM_SLOTS='4.0' is not a valid int"),
    ({"RINGLET_SHM_SLOT_BYTES": "big"}, r"RINGLET_SHM_SLOT_BYTES='big' is not a valid int"),
    ({"RINGLET_TIMEOUT": "0"}, r"timeout must be > 0 seconds, got 0.0"),
    ({"RINGLET_TIMEOUT": "nan"}, r"RINGLET_TIMEOUT='nan': timeout must be a finite number"),
    ({"RINGLET_TIMEOUT": "inf"}, r"timeout must be a finite number, got inf"),
    ({"RINGLET_LIVENESS_S": "nan"}, r"RINGLET_LIVENESS_S='nan': liveness_s must be a finite"),
    ({"RINGLET_GRACE": "inf"}, r"grace must be a finite number"),
    ({"RINGLET_SPIN_US": "1e30"}, r"RINGLET_SPIN_US='1e30': spin_us must be at most 1,000,000"),
    ({"RINGLET_SLEEP_US": "2e6"}, r"sleep_us must be at most 1,000,000 us"),
    ({"RINGLET_FLIGHT_RECORDS": "99999999999999"}, r"flight_records must be at most"),
    ({"RINGLET_SHM_SLOTS": "1000000000"}, r"shm_slots must be at most 4,096 slots"),
    ({"RINGLET_SHM_POST_BYTES": "100G"}, r"RINGLET_SHM_POST_BYTES='100G': shm_post_bytes "
                                         r"must be at most 1,073,741,824 bytes"),
    ({"RINGLET_DEBUG": "LOUD"}, r"debug must be '', WARN, INFO or TRACE, got 'LOUD'"),
    ({"RINGLET_ENGINE": "tcp"}, r"engine must be auto, mpi, torch or none, got 'tcp'"),
    ({"RINGLET_SHM_SLOT_BYTES": "1K"}, r"shm_slot_bytes must be a multiple of 64 and >= 4096"),
    ({"RINGLET_SHM_SLOT_BYTES": "4100"}, r"shm_slot_bytes must be a multiple of 64"),
    ({"RINGLET_SHM_SLOTS": "1"}, r"shm_slots must be >= 2, got 1"),
    ({"RINGLET_GRACE": "-1"}, r"grace must be >= 0, got -1.0"),
    # beat through torch's store in a busy loop, and saw every peer as stopped
    ({"RINGLET_HEARTBEAT_S": "1e-300"}, r"heartbeat_s must be at least 0.1 s, got 1e-300"),
    ({"RINGLET_HEARTBEAT_S": "0"}, r"heartbeat_s must be at least 0.1 s, got 0.0"),
    # an OverflowError traceback before, for every byte size
    ({"RINGLET_SHM_SLOT_BYTES": "inf"}, r"RINGLET_SHM_SLOT_BYTES='inf' is not a valid int"),
    ({"RINGLET_CMA_BYTES": "-inf"}, r"RINGLET_CMA_BYTES='-inf' is not a valid int"),
    # the launcher's and the waits' clocks overflowed
    ({"RINGLET_GRACE": "1e300"}, r"RINGLET_GRACE='1e300': grace must be at most 604,800 s"),
    ({"RINGLET_TIMEOUT": "1e300"}, r"timeout must be at most 604,800 s \(a week\)"),
    ({"RINGLET_START_METHOD": "thread"}, r"start_method must be auto, spawn, forkserver or fork"),
    # every entry of RINGLET_ALGO at once, not at the first call of its collective
    ({"RINGLET_ALGO": "broadcast:bogus"}, r"RINGLET_ALGO entry 'broadcast:bogus': broadcast "
                                          r"has no algorithm 'bogus'; valid: binomial"),
    ({"RINGLET_ALGO": "^ring"}, r"RINGLET_ALGO entry '\^ring': write collective:algorithm"),
])
def test_invalid_values_are_rejected(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env(env)


@pytest.mark.parametrize("given, message", [
    # strings are truthy: fused="no" left the fused paths on
    ({"fused": "no"}, r"fused must be True or False, got 'no' \(str\)"),
    ({"lean": "off"}, r"lean must be True or False, got 'off' \(str\)"),
    # a false mismatch between ranks, a TypeError in the recorder, an OverflowError in a
    # wait, TypeError and AttributeError tracebacks
    ({"shm_slots": 2.5}, r"shm_slots must be a whole number, got 2.5 \(float\)"),
    ({"shm_slots": True}, r"shm_slots must be a whole number, got True \(bool\)"),
    ({"flight_records": 10.7}, r"flight_records must be a whole number"),
    ({"timeout": 10 ** 400}, r"timeout must be a finite number, got an integer of 401 digits"),
    ({"timeout": "5"}, r"timeout must be a number, got '5' \(str\)"),
    ({"timeout": None}, r"timeout must be a number, got None"),
    ({"debug": None}, r"debug must be a string, got None"),
    ({"algo": 5}, r"algo must be a string, got 5 \(int\)"),
    ({"node": 3}, r"node must be a string"),
    ({"dump_dir": None}, r"dump_dir must be a string"),
    ({"shm_post_bytes": "lots"}, r"shm_post_bytes: 'lots' is not a byte size"),
    ({"cma_bytes": "-4K"}, r"cma_bytes: '-4K' is not a whole, non-negative number"),
    ({"shm_slots": "8"}, r"shm_slots must be a whole number, got '8' \(str\)"),
])
def test_settings_made_in_code_are_checked_too(given: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings(**given)


def test_whole_seconds_and_numpy_numbers_are_numbers() -> None:
    import numpy as np

    s = Settings(timeout=10, grace=0, shm_slots=np.int64(8), liveness_s=np.float32(0.5))
    assert s.timeout == 10.0 and type(s.timeout) is float and s.grace == 0.0
    assert s.shm_slots == 8 and type(s.shm_slots) is int
    assert s.liveness_s == 0.5 and type(s.liveness_s) is float


def test_byte_sizes_made_in_code_take_the_variables_spelling() -> None:
    # RINGLET_SHM_POST_BYTES=64K worked and Settings(shm_post_bytes="64K") did not
    s = Settings(shm_post_bytes="64K", shm_stage_bytes=" 1M ", cma_bytes="8MiB")
    assert (s.shm_post_bytes, s.shm_stage_bytes, s.cma_bytes) == (65536, 1 << 20, 8 << 20)
    assert Settings().replace(shm_slot_bytes="64K").shm_slot_bytes == 65536
    with pytest.raises(ConfigError, match=r"shm_post_bytes must be a multiple of 64 and >= 4096"):
        Settings(shm_post_bytes="1K")


def test_replace_validates() -> None:
    s = Settings()
    t = s.replace(timeout=5, grace=0.1)
    assert (t.timeout, t.grace) == (5, 0.1)
    assert s.timeout == 300.0  # the original is untouched (frozen)
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['timout'\]; known: .*'timeout'"):
        s.replace(timout=5)
    with pytest.raises(ConfigError, match=r"shm_slots must be >= 2, got 0"):
        s.replace(shm_slots=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.timeout = 1  # type: ignore[misc]


# -- ringlet config -----------------------------------------------------------------


def run_config(capsys: pytest.CaptureFixture[str]) -> str:
    parser = argparse.ArgumentParser(prog="ringlet config")
    configure(parser)
    assert main(parser.parse_args([])) == 0
    return capsys.readouterr().out


def test_config_command_lists_every_setting(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGLET_TIMEOUT", "12")
    out = run_config(capsys)
    for var, _, doc in Settings().describe():
        assert var in out
        assert doc.split()[0] in out
    lines = out.splitlines()
    assert any(line.startswith("RINGLET_TIMEOUT") and "= 12.0  (from the environment)" in line
               for line in lines)
    assert any(line.startswith("RINGLET_GRACE") and "= 3.0  (default)" in line for line in lines)


def test_config_command_reports_bad_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RINGLET_TIMOUT", "12")
    parser = argparse.ArgumentParser()
    configure(parser)
    with pytest.raises(ConfigError, match="unknown setting RINGLET_TIMOUT"):
        main(parser.parse_args([]))


def _returns_rank(comm: Any) -> int:
    return int(comm.rank)


@pytest.mark.parametrize("name, var", [("dump_dir", "RINGLET_DUMP_DIR"),
                                       ("trace", "RINGLET_TRACE")])
def test_unusable_dump_and_trace_directories_fail_the_start(name: str, var: str,
                                                            tmp_path: Any) -> None:
    """The recorder writes these on a failure or in batches and cannot say then that it
    could not: a directory that cannot be made or written is a ConfigError when the job
    starts, in init, in spawn (before any rank starts) and in ringlet run (they were
    ignored in silence: no trace, no dumps)."""
    import os
    import subprocess
    import sys

    import ringlet

    bad = Settings(**{name: "/proc/nope"})
    with pytest.raises(ConfigError, match=f"{var} /proc/nope: cannot make the directory"):
        bad.check_paths()
    with pytest.raises(ConfigError, match=f"{var} /proc/nope"):
        ringlet.spawn(_returns_rank, 2, settings=bad)
    with pytest.raises(ConfigError, match=f"{var} /proc/nope"):
        ringlet.init(settings=bad, rank=0, size=1)
    made = tmp_path / "made" / "here"
    Settings(**{name: str(made)}).check_paths()
    assert made.is_dir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RINGLET_")}
    proc = subprocess.run([sys.executable, "-m", "ringlet", "run", "-n", "2", "-m",
                           "json.tool", "--help"],
                          env={**env, var: "/proc/nope"}, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert f"ringlet run: {var} /proc/nope: cannot make the directory" in proc.stderr


def test_spawn_refuses_the_mpi_and_torch_engines() -> None:
    """spawn starts its ranks itself: RINGLET_ENGINE=mpi cannot hold there (every rank
    failed, MPI seeing each alone; ringlet bench, which spawns, the same), nor torch, which
    needs a store (each rank failed asking for torchrun's variables)."""
    import ringlet

    with pytest.raises(ConfigError, match=r"ringlet.spawn starts its ranks itself, not "
                                          r"through MPI, but RINGLET_ENGINE=mpi") as mpi:
        ringlet.spawn(_returns_rank, 2, settings=Settings(engine="mpi"))
    # not `ringlet run`, which refuses RINGLET_ENGINE=mpi too (it was suggested)
    assert str(mpi.value).endswith("start the program with mpiexec")
    with pytest.raises(ConfigError, match=r"with no torch.distributed store, but "
                                          r"RINGLET_ENGINE=torch: .* torchrun \(or `ringlet "
                                          r"run`, which makes a store"):
        ringlet.spawn(_returns_rank, 2, settings=Settings(engine="torch"))


def test_named_values_in_any_case_and_spacing() -> None:
    """RINGLET_DEBUG=info worked; RINGLET_ENGINE=MPI, RINGLET_RAILS=Native and
    RINGLET_START_METHOD=' fork' were ConfigErrors (and ranks compare the values after)."""
    s = Settings.from_env({"RINGLET_DEBUG": "info", "RINGLET_ENGINE": "MPI",
                           "RINGLET_RAILS": " Native", "RINGLET_START_METHOD": "Fork "})
    assert (s.debug, s.engine, s.rails, s.start_method) == ("INFO", "mpi", "native", "fork")
    assert Settings(engine="Torch").engine == "torch"
    assert s == Settings.from_env({"RINGLET_DEBUG": "INFO", "RINGLET_ENGINE": "mpi",
                                   "RINGLET_RAILS": "native", "RINGLET_START_METHOD": "fork"})


def test_debug_takes_spacing_as_the_other_named_values() -> None:
    """RINGLET_DEBUG=' INFO' (or 'TRACE\\n' from a file) was a ConfigError, while
    RINGLET_ENGINE=' mpi' and RINGLET_RAILS=' Native' were taken as meant."""
    assert Settings.from_env({"RINGLET_DEBUG": " info "}).debug == "INFO"
    assert Settings.from_env({"RINGLET_DEBUG": "TRACE\n"}).debug == "TRACE"
    assert Settings(debug=" warn").debug == "WARN"
    assert Settings.from_env({"RINGLET_DEBUG": "  "}).debug == ""
    with pytest.raises(ConfigError, match=r"RINGLET_DEBUG=' loud': debug must be '', WARN"):
        Settings.from_env({"RINGLET_DEBUG": " loud"})


def test_numpy_bools_are_bools() -> None:
    """Settings(fused=np.True_) was refused with "fused must be True or False, got
    np.True_ (bool)", while numpy's integers are taken for whole-number settings."""
    import numpy as np

    s = Settings(fused=np.False_, lean=np.True_, shm_slots=np.int64(8))
    assert (s.fused, s.lean, s.shm_slots) == (False, True, 8)
    assert type(s.fused) is bool and type(s.lean) is bool and type(s.shm_slots) is int
    with pytest.raises(ConfigError, match=r"fused must be True or False, got np.str_"):
        Settings(fused=np.str_("yes"))  # type: ignore[arg-type]
