"""Every command's --help ends with examples, and every example still parses with today's flags."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable

import pytest

from fleet_supervisor.__main__ import main as supervisor_main
from gateway.main import main as gateway_main
from vllm_fleet import cli


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli._parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("vllm-fleet has no subcommands")


def _example_argv(help_text: str, prog: str) -> list[list[str]]:
    """The argv of each example line of ``prog`` (env assignments, redirects and comments dropped)."""
    assert "\nexamples:\n" in help_text, f"{prog} --help has no examples section:\n{help_text}"
    out = []
    for line in help_text.split("\nexamples:\n", 1)[1].splitlines():
        if not line.startswith("  "):
            break  # the examples section ends at the first line that is not indented
        words = shlex.split(line, comments=True)
        while words and "=" in words[0] and not words[0].startswith("-"):
            words.pop(0)  # FLEET_X=1 before the command
        if ">" in words:
            words = words[:words.index(">")]
        prog_words = prog.split()
        if words[:len(prog_words)] == prog_words:
            out.append(words[len(prog_words):])
    assert out, f"{prog} --help: no example line starts with {prog!r}"
    return out


SUBCOMMANDS = sorted(_subcommands())


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_each_subcommand_help_shows_examples_that_parse(name: str) -> None:
    sub = _subcommands()[name]
    for argv in _example_argv(sub.format_help(), "vllm-fleet"):
        assert argv[0] == name, f"an example under `vllm-fleet {name} --help` runs `{argv[0]}`"
        cli._parser().parse_args(argv)  # exits 2 (a failed test) if a flag is gone or renamed


def test_every_subcommand_has_an_example_entry() -> None:
    assert set(SUBCOMMANDS) == set(cli.EXAMPLES), "add the new subcommand's examples to vllm_fleet/cli.py EXAMPLES"


def test_top_level_help_shows_examples() -> None:
    for argv in _example_argv(cli._parser().format_help(), "vllm-fleet"):
        cli._parser().parse_args(argv)


@pytest.mark.parametrize(("main", "prog"), [(gateway_main, "python -m gateway"),
                                            (supervisor_main, "python -m fleet_supervisor")])
def test_module_entry_points_show_examples(main: Callable[[list[str]], int], prog: str,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    examples = _example_argv(capsys.readouterr().out, prog)
    for argv in examples:
        assert argv[:1] == ["-c"], argv
