"""A tiny scripted bot for demos and tests: YAML rules, or ``echo``.

Rules file format::

    greeting: "Hello, you are through to the demo line."   # optional, said at the start
    rules:                                                  # first match wins
      - if_says: "your country"          # substring, case-insensitive
        say: "Thank you, Mr President."
      - if_matches: "block ?books?|printed"  # regular expression, case-insensitive
        say: "I love old books. You said: {text}"
    fallback: "Sorry, I did not catch that."               # optional; else stay silent

``{text}`` in a reply is replaced by what the caller said.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

__all__ = ["Bot", "EchoBot", "Rule", "ScriptedBot", "load_bot"]


class Bot(Protocol):
    """Decides what to say; pure and synchronous so it can be unit-tested without a server."""

    @property
    def greeting(self) -> str | None:
        """Said once when the call starts (None: say nothing)."""
        ...

    def reply(self, text: str) -> str | None:
        """The reply to one final transcript, or None to stay silent."""
        ...


@dataclass(frozen=True, slots=True)
class Rule:
    """If the caller's words match ``pattern``, say ``say``."""

    pattern: re.Pattern[str]
    say: str

    def matches(self, text: str) -> bool:
        """Whether this rule fires for ``text``."""
        return self.pattern.search(text) is not None


def _fill(template: str, text: str) -> str:
    # str.replace, not str.format: a reply with other braces must not raise.
    return template.replace("{text}", text.strip())


@dataclass(frozen=True, slots=True)
class ScriptedBot:
    """Rules tried in order; the first match answers, else the fallback (if any)."""

    rules: tuple[Rule, ...] = ()
    greeting: str | None = None
    fallback: str | None = None

    def reply(self, text: str) -> str | None:
        """The first matching rule's reply, the fallback, or None for empty input."""
        if not text.strip():
            return None
        for rule in self.rules:
            if rule.matches(text):
                return _fill(rule.say, text)
        return _fill(self.fallback, text) if self.fallback else None

    @classmethod
    def from_dict(cls, data: Any, source: str = "bot rules") -> ScriptedBot:
        """Build from parsed YAML; errors name the rule and the key, as a ValueError."""
        if not isinstance(data, dict):
            kind = type(data).__name__
            raise ValueError(f"{source}: expected a mapping with `rules`, got {kind}")
        unknown = set(data) - {"greeting", "rules", "fallback"}
        if unknown:
            raise ValueError(
                f"{source}: unknown key(s) {', '.join(sorted(unknown))}; "
                "use greeting, rules, fallback"
            )
        rules: list[Rule] = []
        raw_rules = data.get("rules") or []
        if not isinstance(raw_rules, list):
            raise ValueError(f"{source}: `rules` must be a list")
        for i, raw in enumerate(raw_rules):
            where = f"{source}: rule {i + 1}"
            if not isinstance(raw, dict) or not isinstance(raw.get("say"), str):
                raise ValueError(f"{where}: needs `say` and one of `if_says` / `if_matches`")
            extra = set(raw) - {"say", "if_says", "if_matches"}
            if extra:
                raise ValueError(f"{where}: unknown key(s) {', '.join(sorted(extra))}")
            if ("if_says" in raw) == ("if_matches" in raw):
                raise ValueError(f"{where}: give exactly one of `if_says` / `if_matches`")
            if "if_says" in raw:
                pattern = re.compile(re.escape(str(raw["if_says"])), re.IGNORECASE)
            else:
                try:
                    pattern = re.compile(str(raw["if_matches"]), re.IGNORECASE)
                except re.error as exc:
                    raise ValueError(f"{where}: bad regular expression: {exc}") from None
            rules.append(Rule(pattern, raw["say"]))
        for key in ("greeting", "fallback"):
            if data.get(key) is not None and not isinstance(data[key], str):
                raise ValueError(f"{source}: `{key}` must be text")
        return cls(tuple(rules), data.get("greeting"), data.get("fallback"))

    @classmethod
    def from_yaml(cls, path: Path | str) -> ScriptedBot:
        """Load a rules file.

        Raises:
            ValueError: the file is not UTF-8 YAML or not valid rules; one line that names
                the file (and, for YAML, the line and column), so a CLI can print it as is.
            OSError: the file cannot be read.
        """
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise ValueError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except yaml.YAMLError as exc:
            # PyYAML's message spans several lines and quotes the source; keep the gist.
            where = ""
            mark = getattr(exc, "problem_mark", None)
            if mark is not None:
                where = f" at line {mark.line + 1}, column {mark.column + 1}"
            problem = getattr(exc, "problem", None) or type(exc).__name__
            raise ValueError(f"{p}: not valid YAML: {problem}{where}") from None
        return cls.from_dict(data, str(p))


@dataclass(frozen=True, slots=True)
class EchoBot:
    """Repeats what the caller said (the simplest end-to-end check of ASR + TTS)."""

    greeting: str | None = None

    def reply(self, text: str) -> str | None:
        """The caller's own words, or None when there were none."""
        return text.strip() or None


def sample_bot_path() -> Path:
    """The shipped rules that answer the bundled sample call."""
    return Path(__file__).with_name("sample_bot.yaml")


def load_bot(spec: str | None) -> Bot | None:
    """The bot named by a ``--bot`` value.

    ``""``/None → no bot, ``"echo"`` → :class:`EchoBot`, ``"sample"`` → the shipped rules,
    anything else → a YAML rules file.
    """
    if not spec:
        return None
    if spec == "echo":
        return EchoBot()
    if spec == "sample":
        return ScriptedBot.from_yaml(sample_bot_path())
    return ScriptedBot.from_yaml(spec)
