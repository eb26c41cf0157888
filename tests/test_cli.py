"""The ``ringlet`` command's own parsing (ringlet.cli.main), whatever the subcommand."""

from __future__ import annotations

import pytest

from ringlet.cli import main

pytestmark = pytest.mark.one_process   # tests/conftest.py


@pytest.mark.parametrize("argv, usage, unknown", [
    (["run", "-n", "2", "--bogus", "ok.py"], "usage: ringlet run ", "--bogus"),
    (["config", "--foo"], "usage: ringlet config ", "--foo"),
    (["simulate", "all_reduce", "--bytes", "1MB", "--ranks", "4", "--call", "1ms"],
     "usage: ringlet simulate ", "--call 1ms"),
    (["--bogus", "config"], "usage: ringlet [-h] [--version] COMMAND", "--bogus"),
])
def test_an_unknown_option_is_reported_by_the_parser_it_was_given_to(
        argv: list[str], usage: str, unknown: str, capsys: pytest.CaptureFixture[str]) -> None:
    """After a subcommand: its usage and its prog (the top-level usage said nothing of the
    subcommand's options); before one: the top level's."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(usage) and f"error: unrecognized arguments: {unknown}\n" in err, err
    assert ("ringlet: error" in err) == (argv[0] == "--bogus"), err


@pytest.mark.parametrize("argv", [
    ["show", "all_reduce", "--algo", "ring", "-n", "2", "--png", ""],
    ["bench", "all_reduce", "-n", "2", "-b", "8", "-e", "8", "--json", ""],
    ["bench", "all_reduce", "-n", "2", "-b", "8", "-e", "8", "--plot", " "],
    ["simulate", "all_reduce", "--bytes", "1MB", "--ranks", "4", "--trace", ""],
    ["predict", "--calibrate", "-n", "2", "--quick", "--out", ""],
], ids=["show-png", "bench-json", "bench-plot", "simulate-trace", "calibrate-out"])
def test_an_empty_file_name_is_refused(argv: list[str],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """An empty name was taken as no option: nothing written, exit 0 (bench ran its sweep
    and dropped the JSON it was asked for)."""
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    option = argv[-2]
    assert f"error: argument {option}: the file name is empty" in capsys.readouterr().err
