"""`voxgate --help` as a terminal shows it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from cli._main import build_parser

pytestmark = pytest.mark.unit

COMMANDS = {"serve", "call", "demo", "sip"}


def help_text(*args: str) -> str:
    """The real command's help at a common terminal width."""
    proc = subprocess.run(
        [sys.executable, "-m", "cli", *args, "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "80"},
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_top_level_help_is_plain_text() -> None:
    text = help_text()
    # It used to print the module docstring: ``literals`` and :mod:`roles` are reST markup.
    assert "``" not in text, text
    assert not re.search(r":[a-z]+:`", text), text
    assert text.startswith("usage: voxgate ")


def test_top_level_help_lists_every_command_on_one_line() -> None:
    text = help_text()
    section = text.split("\ncommands:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert section[0].strip() == "COMMAND"
    listed = {}
    for line in section[1:]:
        m = re.fullmatch(r"    (\w+)\s{2,}(\S.*)", line)
        assert m, f"not a one-line command entry: {line!r}\n{text}"
        listed[m.group(1)] = m.group(2)
    assert set(listed) == COMMANDS, text
    # And nothing the parser knows is missing from the list.
    parser = build_parser()
    (sub,) = (a for a in parser._actions if a.dest == "command")
    assert set(sub.choices or {}) == COMMANDS
