"""The bots behind ``--bot``: ``none``, ``echo`` and a YAML rule file."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from clients.sip.base import Bot

__all__ = ["BotFileError", "EchoBot", "RuleBot", "SilentBot", "load_bot"]

_WORDS = re.compile(r"[^\w']+")


def _normalise(text: str) -> str:
    """Lower case, punctuation to spaces, single spaces: what rule matching compares."""
    return " ".join(_WORDS.sub(" ", text.lower()).split())


def _fill(template: str, text: str) -> str:
    # str.replace, not str.format: a reply with other braces must not raise.
    return template.replace("{text}", text.strip())


class BotFileError(ValueError):
    """A ``--bot`` YAML file that does not describe a bot."""


class SilentBot:
    """``--bot none``: listens (the gateway still reports speech and transcripts), never speaks."""

    def greeting(self) -> str | None:
        """No greeting."""
        return None

    def on_transcript(self, text: str) -> list[str]:
        """Say nothing."""
        return []

    def on_dtmf(self, digit: str) -> list[str]:
        """Say nothing."""
        return []


class EchoBot(SilentBot):
    """``--bot echo``: repeats each final transcript back to the caller."""

    def on_transcript(self, text: str) -> list[str]:
        """The caller's own words."""
        return [text.strip()] if text.strip() else []


@dataclass(frozen=True, slots=True)
class _Rule:
    """``phrases`` match word-aligned; ``pattern`` (``if_says``/``if_matches``) matches raw text."""

    phrases: tuple[str, ...]
    reply: str
    pattern: re.Pattern[str] | None = None

    def matches(self, text: str) -> bool:
        if self.pattern is not None:
            return self.pattern.search(text) is not None
        said = f" {_normalise(text)} "
        return any(f" {p} " in said for p in self.phrases)


@dataclass(slots=True)
class RuleBot:
    """``--bot FILE.yaml``: "if the caller says X, say Y", plus a greeting and keypad replies.

    File format::

        greeting: Hello, this is voxgate. How can I help?
        rules:
          - if: [opening hours, when are you open]   # a phrase or a list of phrases
            say: We are open nine to five.
          - if_says: "your country"                  # substring, case-insensitive
            say: "You said: {text}"
          - if_matches: "block ?books?"              # regular expression, case-insensitive
            say: Block books came first.
        dtmf:
          "1": You pressed one.
        fallback: Sorry, I did not catch that.          # optional

    An ``if`` rule matches when one of its phrases occurs in the transcript, word-aligned,
    ignoring case and punctuation; ``if_says``/``if_matches`` are the rules of ``voxgate
    call --bot`` files (``clients/bot.py``), so one file serves both; the first matching rule
    wins, and ``{text}`` in a reply is what the caller said.
    """

    greeting_text: str | None = None
    rules: list[_Rule] = field(default_factory=list)
    dtmf: dict[str, str] = field(default_factory=dict)
    fallback: str | None = None

    @classmethod
    def from_mapping(cls, data: Any, source: str = "bot file") -> RuleBot:
        """Validate a parsed YAML document; raises :class:`BotFileError` naming the fix."""
        if not isinstance(data, dict):
            raise BotFileError(f"{source}: expected a mapping with greeting/rules/dtmf keys")
        unknown = set(data) - {"greeting", "rules", "dtmf", "fallback"}
        if unknown:
            raise BotFileError(f"{source}: unknown keys {sorted(unknown)}")
        rules: list[_Rule] = []
        for i, rule in enumerate(data.get("rules") or []):
            conditions = (
                [k for k in ("if", "if_says", "if_matches") if k in rule]
                if isinstance(rule, dict)
                else []
            )
            if len(conditions) != 1 or "say" not in rule:
                raise BotFileError(
                    f"{source}: rules[{i}] needs `say` and one of `if`, `if_says`, `if_matches`"
                )
            if conditions[0] == "if_says":
                pattern = re.compile(re.escape(str(rule["if_says"])), re.IGNORECASE)
                rules.append(_Rule((), str(rule["say"]), pattern))
                continue
            if conditions[0] == "if_matches":
                try:
                    pattern = re.compile(str(rule["if_matches"]), re.IGNORECASE)
                except re.error as exc:
                    raise BotFileError(f"{source}: rules[{i}].if_matches: {exc}") from None
                rules.append(_Rule((), str(rule["say"]), pattern))
                continue
            phrases = rule["if"] if isinstance(rule["if"], list) else [rule["if"]]
            norm = tuple(_normalise(str(p)) for p in phrases if _normalise(str(p)))
            if not norm:
                raise BotFileError(f"{source}: rules[{i}].if is empty")
            rules.append(_Rule(norm, str(rule["say"])))
        dtmf = data.get("dtmf") or {}
        if not isinstance(dtmf, dict):
            raise BotFileError(f"{source}: dtmf must map digits to replies")
        greeting = data.get("greeting")
        fallback = data.get("fallback")
        return cls(
            str(greeting) if greeting else None,
            rules,
            {str(k): str(v) for k, v in dtmf.items()},
            str(fallback) if fallback else None,
        )

    def greeting(self) -> str | None:
        """The configured greeting."""
        return self.greeting_text

    def on_transcript(self, text: str) -> list[str]:
        """The first matching rule's reply, else the fallback."""
        if not _normalise(text):
            return []
        for rule in self.rules:
            if rule.matches(text):
                return [_fill(rule.reply, text)]
        return [_fill(self.fallback, text)] if self.fallback else []

    def on_dtmf(self, digit: str) -> list[str]:
        """The reply configured for this key."""
        reply = self.dtmf.get(digit)
        return [reply] if reply else []


def load_bot(spec: str) -> Callable[[], Bot]:
    """A per-call bot factory for ``--bot``: ``none``, ``echo`` or a YAML file path."""
    if spec == "none":
        return SilentBot
    if spec == "echo":
        return EchoBot
    path = Path(spec)
    if not path.is_file():
        raise BotFileError(f"--bot {spec!r}: expected none, echo or a YAML file that exists")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise BotFileError(f"{spec}: not valid YAML: {exc}") from None
    template = RuleBot.from_mapping(data, spec)

    def make() -> Bot:
        return RuleBot(template.greeting_text, template.rules, template.dtmf, template.fallback)

    return make
