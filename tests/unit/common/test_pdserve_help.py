"""`pdserve --help` describes every command and `pdserve COMMAND --help` every option:
read from the parser itself, so an option added without help fails here."""

from __future__ import annotations

import argparse

import pytest

from tooling.cli import COMMANDS, build_parser


def _commands(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub


def test_pdserve_help_lists_every_command_with_what_it_does(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--help"])
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert set(_commands(build_parser()).choices) == set(COMMANDS)
    for name, what in COMMANDS.items():
        assert f"{name} {what}" in shown, name


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_of_every_command_has_help(command):
    parser = _commands(build_parser()).choices[command]
    assert parser.description
    missing = [a.option_strings or a.dest for a in parser._actions
               if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    assert not missing, f"pdserve {command}: no help for {missing}"


def test_up_names_its_defaults():
    up = _commands(build_parser()).choices["up"]
    helps = {a.option_strings[0]: a.help for a in up._actions if a.option_strings}
    for option, default in (("--prefill", "1"), ("--decode", "1"), ("--model", "tiny"), ("--num-blocks", "512")):
        assert f"default {default}" in helps[option], option
