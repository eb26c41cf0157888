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
