"""``--help`` shows every default (issue 26): a user should not read the code to learn them."""

from __future__ import annotations

import argparse
import re

import pytest

from refimpl.cli import _parser, main
from refimpl.cli.types import DefaultsHelpFormatter


def _subparser(name: str) -> argparse.ArgumentParser:
    commands = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices[name]


@pytest.mark.parametrize("command", ["train", "sweep"])
def test_every_option_with_a_default_says_it(command: str) -> None:
    parser = _subparser(command)
    formatter = DefaultsHelpFormatter(prog=command)
    silent = [  # argparse prints no help line at all for an option without help text
        action.option_strings[-1]
        for action in parser._actions
        if action.option_strings
        and action.default not in (None, False, argparse.SUPPRESS)
        and (not action.help or "default" not in formatter._get_help_string(action).lower())
    ]
    assert silent == []


def test_the_printed_help_names_the_defaults(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = re.sub(r"\s+", " ", capsys.readouterr().out)
    for option, default in [
        ("--layers LAYERS", "2"), ("--epochs EPOCHS", "200"), ("--lr LR", "0.005"),
        ("--optimizer {adam,sgd}", "adam"), ("--init", "xavier"), ("--dtype", "float32"),
        ("--weight-decay WEIGHT_DECAY", "0.0"), ("--activation", "relu"),
    ]:  # fmt: skip
        assert re.search(re.escape(option) + r" .*?\(default: " + re.escape(default), text), option
    for name in ("trees", "squirrel", "_filtered", "actor"):  # every dataset is named
        assert name in text
    assert "--version {v1,v2} GAT attention: v2" in text and "(default: v2)" in text


def test_the_formatter_leaves_switches_and_stated_defaults_alone() -> None:
    parser = argparse.ArgumentParser(formatter_class=DefaultsHelpFormatter)
    parser.add_argument("--flag", action="store_true", help="a switch")
    parser.add_argument("--given", default=3, help="three (default 3)")
    parser.add_argument("--on", action=argparse.BooleanOptionalAction, default=True, help="x")
    parser.add_argument("--many", nargs="+", default=[1, 2], help="some")
    text = re.sub(r"\s+", " ", parser.format_help())
    assert "a switch (default" not in text and "three (default 3) (default" not in text
    assert "x (default: on)" in text and "some (default: 1 2)" in text
