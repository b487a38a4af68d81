"""The scripted demo bot: YAML rules, echo, and the shipped sample rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from voxgate.bridges.bots import BotFileError, EchoBot, ScriptedBot, load_bot, sample_bot_path

pytestmark = pytest.mark.unit

RULES = {
    "greeting": "Hello!",
    "rules": [
        {"if_says": "Refund", "say": "Refunds take five days."},
        {"if_matches": r"\border (number|no\.?) ?\d+", "say": "Looking up {text}."},
    ],
    "fallback": "Sorry? You said: {text}",
}


def test_substring_rules_are_case_insensitive_and_first_match_wins() -> None:
    bot = ScriptedBot.from_dict(RULES)
    assert bot.greeting == "Hello!"
    assert bot.reply("I want a REFUND for order number 12") == "Refunds take five days."
    assert bot.reply("  Order no. 42 please ") == "Looking up Order no. 42 please."
    assert bot.reply("what's the weather") == "Sorry? You said: what's the weather"
    assert bot.reply("   ") is None


def test_without_fallback_the_bot_stays_silent() -> None:
    bot = ScriptedBot.from_dict({"rules": [{"if_says": "hi", "say": "hello {not a field}"}]})
    assert bot.reply("HI there") == "hello {not a field}"  # braces other than {text} are kept
    assert bot.reply("bye") is None
    assert bot.greeting is None


def test_regex_special_characters_in_substrings_are_literal() -> None:
    bot = ScriptedBot.from_dict({"rules": [{"if_says": "c++ (fast)", "say": "yes"}]})
    assert bot.reply("is C++ (fast)?") == "yes"
    assert bot.reply("is c fast") is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([1, 2], "expected a mapping"),
        ({"rulez": []}, "unknown key"),
        ({"rules": {"a": 1}}, "must be a list"),
        ({"rules": [{"if_says": "x"}]}, "rule 1: needs `say`"),
        ({"rules": [{"say": "x"}]}, "exactly one of"),
        ({"rules": [{"say": "x", "if_says": "a", "if_matches": "b"}]}, "exactly one of"),
        ({"rules": [{"say": "x", "if_matches": "("}]}, "bad regular expression"),
        ({"rules": [{"say": "x", "if_says": "a", "then": 1}]}, "unknown key"),
        ({"greeting": 3}, "`greeting` must be text"),
    ],
)
def test_bad_rules_are_rejected_with_the_rule_and_key(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ScriptedBot.from_dict(data, "rules.yaml")


def test_yaml_file_and_specs(tmp_path: Path) -> None:
    path = tmp_path / "bot.yaml"
    path.write_text(json.dumps(RULES))  # JSON is YAML
    bot = load_bot(str(path))
    assert isinstance(bot, ScriptedBot) and bot.reply("refund") == "Refunds take five days."
    assert load_bot("") is None and load_bot(None) is None
    echo = load_bot("echo")
    assert isinstance(echo, EchoBot)
    assert echo.reply(" Ask not what your country can do ") == "Ask not what your country can do"
    assert echo.reply("") is None
    with pytest.raises(BotFileError, match="expected none, echo, sample, a YAML rules file"):
        load_bot(str(tmp_path / "missing.yaml"))


def test_sample_rules_answer_both_utterances_of_the_demo_call() -> None:
    bot = ScriptedBot.from_yaml(sample_bot_path())
    assert bot.greeting
    jfk = "And so my fellow Americans, ask not what your country can do for you"
    lj = "produced the block books, which were the immediate predecessors of the true printed book,"
    assert "Mister President" in (bot.reply(jfk) or "")
    assert "Block books" in (bot.reply(lj) or "")
    # Whisper might write "blockbooks" or split the first sentence at its pause.
    assert "Block books" in (bot.reply("produced the blockbooks") or "")
    assert "Mister President" in (bot.reply("ask what you can do for your country.") or "")
    assert "did not catch" in (bot.reply("And so my fellow Americans,") or "")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "rules: [\n  - if_says: hi\n",
            "not valid YAML: expected the node content, but found '-' at line 2, column 3",
        ),
        ("greeting: 'unclosed\n", "not valid YAML: found unexpected end of stream at line 2"),
        (b"\xff\xfe rules", "not UTF-8 text (invalid start byte at byte 0)"),
    ],
)
def test_a_broken_rules_file_is_one_line_naming_it(
    tmp_path: Path, text: str | bytes, expected: str
) -> None:
    # PyYAML's own errors are not ValueErrors and span lines; the CLI prints ValueErrors.
    path = tmp_path / "rules.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    with pytest.raises(ValueError) as info:
        load_bot(str(path))
    assert str(info.value).startswith(f"{path}: {expected}")
    assert "\n" not in str(info.value)
