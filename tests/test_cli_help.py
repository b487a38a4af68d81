"""`voxgate --help` as a terminal shows it, and the call/demo flags' parsing."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from voxgate.bridges.door_args import turn_options_from_args
from voxgate.cli._main import build_parser
from voxgate.cli.call import WAIT_FOR_BOT_CHOICES, WaitForBot, _CallState
from voxgate_client import TurnOptions

pytestmark = pytest.mark.unit

COMMANDS = {"serve", "call", "demo", "sip", "media-streams", "adapt"}


def help_text(*args: str) -> str:
    """The real command's help at a common terminal width."""
    proc = subprocess.run(
        [sys.executable, "-m", "voxgate.cli", *args, "--help"],
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
        m = re.fullmatch(r"    ([\w-]+)\s{2,}(\S.*)", line)
        assert m, f"not a one-line command entry: {line!r}\n{text}"
        listed[m.group(1)] = m.group(2)
    assert set(listed) == COMMANDS, text
    # And nothing the parser knows is missing from the list.
    parser = build_parser()
    (sub,) = (a for a in parser._actions if a.dest == "command")
    assert set(sub.choices or {}) == COMMANDS


def test_wait_for_bot_takes_the_modes_play_call_knows() -> None:
    parser = build_parser()
    (call,) = (a for a in parser._actions if a.dest == "command")
    call_parser = (call.choices or {})["call"]
    (flag,) = (a for a in call_parser._actions if a.dest == "wait_for_bot")
    assert tuple(flag.choices or ()) == WAIT_FOR_BOT_CHOICES
    assert parser.parse_args(["call", "a.wav"]).wait_for_bot == "never"
    assert parser.parse_args(["call", "a.wav", "--wait-for-bot"]).wait_for_bot == "end"
    assert parser.parse_args(["call", "a.wav", "--wait-for-bot", "start"]).wait_for_bot == "start"


def test_demo_is_real_time_unless_fast() -> None:
    parser = build_parser()
    assert parser.parse_args(["demo"]).fast is False
    assert parser.parse_args(["demo", "--fast"]).fast is True
    # The old flag (real time is the default now) is still accepted, and hidden.
    assert parser.parse_args(["demo", "--realtime"]).fast is False
    text = help_text("demo")
    assert "--fast" in text and "--realtime" not in text


def test_demo_takes_the_doors_turn_flags() -> None:
    """voxgate demo --turns smart: the bot answers each EndOfTurn (voice to voice with turns)."""
    parser = build_parser()
    args = parser.parse_args(["demo", "--turns", "smart", "--turn-eagerness", "0.7"])
    assert turn_options_from_args(args) == TurnOptions(mode="smart", eagerness=0.7)
    assert turn_options_from_args(parser.parse_args(["demo"])) == TurnOptions()


@pytest.mark.parametrize("mode", ["start", "end"])
def test_a_turn_taking_caller_never_holds_its_audio_for_the_end_of_its_own_turn(
    mode: WaitForBot,
) -> None:
    """With turn detection the server ends a turn on the silence it hears, so a caller that
    held its audio until the EndOfTurn (or the final) waited for good; it waits for the bot's
    answer. Without turns, an utterance whose final has not come still holds it."""
    state = _CallState(has_asr=True, turns_on=True)
    state.open_utterances.add(0)  # spoken, final not yet back
    state.open_turns.add(0)  # its final back, EndOfTurn not yet
    assert not state.caller_waits(mode)
    state.awaiting_reply.add(0)  # the EndOfTurn came: the bot's answer is due
    assert state.caller_waits(mode)
    off = _CallState(has_asr=True)
    off.open_utterances.add(0)
    assert off.caller_waits(mode)
