"""The built-in bots, as ordinary handlers on the bot contract, and the one ``--bot`` value.

A bot is ``async def bot(call)`` (:class:`Bot`): the same code answers a direct ``Converse``
call (``voxgate call``), a phone call at the SIP bridge and a media stream, in-process or
served by :func:`voxgate_client.serve_bot` in a process of its own. The built-in bots are
turn-takers (:class:`TurnBot`): a greeting, a reply to each turn (``EndOfTurn`` when the call
has turn detection on, else each final transcript) and to each key press, computed
synchronously so that the rules can be unit-tested without a server.

One rules file serves every door (``voxgate call --bot``, ``voxgate sip --bot``,
``voxgate media-streams --bot``)::

    greeting: "Hello, you are through to the demo line."   # optional, said at the start
    rules:                                                  # first match wins
      - if: [opening hours, when are you open]   # a phrase or a list of phrases, word-aligned,
        say: We are open nine to five.            # ignoring case and punctuation
      - if_says: "your country"                  # substring, case-insensitive
        say: "Thank you, Mr President."
      - if_matches: "block ?books?|printed"      # regular expression, case-insensitive
        say: "I love old books. You said: {text}"
    dtmf:                                        # optional: a reply per keypad key
      "1": You pressed one.
    fallback: "Sorry, I did not catch that."     # optional; else stay silent

``{text}`` in a reply is replaced by what the caller said.
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from voxgate_client import (
    BotPolicy,
    Dtmf,
    EndOfTurn,
    SessionStarted,
    Transcript,
    VoiceCall,
)

__all__ = [
    "BOT_HELP",
    "Bot",
    "BotFileError",
    "EchoBot",
    "Rule",
    "RuleBot",
    "ScriptedBot",
    "SilentBot",
    "TurnBot",
    "add_bot_policy_arguments",
    "bot_policy_from_args",
    "load_bot",
    "sample_bot_path",
]

_WORDS = re.compile(r"[^\w']+")
_DIGITS = frozenset("0123456789*#ABCD")
_KEYS = {"greeting", "rules", "dtmf", "fallback"}
_RULE_KEYS = {"say", "if", "if_says", "if_matches"}


class Bot(Protocol):
    """A bot: one coroutine per call, on the call's events (see :class:`VoiceCall`)."""

    async def __call__(self, call: VoiceCall) -> None:
        """Handle one call until it ends."""
        ...


class BotFileError(ValueError):
    """A ``--bot`` value or rules file that does not describe a bot (one line, names it)."""


def _normalise(text: str) -> str:
    """Lower case, punctuation to spaces, single spaces: what ``if`` phrases compare."""
    return " ".join(_WORDS.sub(" ", text.lower()).split())


def _fill(template: str, text: str) -> str:
    # str.replace, not str.format: a reply with other braces must not raise.
    return template.replace("{text}", text.strip())


class TurnBot:
    """A bot that takes turns: greeting, one reply per final transcript and per key.

    Subclasses override :meth:`reply` and :meth:`on_dtmf` (pure, synchronous); ``__call__``
    is the contract's handler. Replies are spoken only where the gateway has a voice.
    """

    greeting: str | None = None

    def reply(self, text: str) -> str | None:
        """The reply to one final transcript, or None to stay silent."""
        return None

    def on_dtmf(self, digit: str) -> str | None:
        """The reply to one key press, or None."""
        return None

    async def __call__(self, call: VoiceCall) -> None:
        """Greet, then answer each turn (or final transcript) and key until the call ends.

        With turn detection on (the call's config or the server's default), the bot answers
        :class:`EndOfTurn` with the turn's whole text: a pause inside a sentence ends an
        utterance (a final) but not the caller's turn. Off, it answers each final.
        """
        session = call.session
        speaks = session is None or session.has_tts
        turns = session is not None and session.turn_detection != "off"
        if self.greeting and speaks:
            await call.speak(self.greeting)
        async for event in call:
            answer: str | None = None
            if isinstance(event, SessionStarted):
                turns = event.turn_detection != "off"
            elif _answers(event, turns=turns):
                assert isinstance(event, EndOfTurn | Transcript)
                answer = self.reply(event.text)
            elif isinstance(event, Dtmf):
                answer = self.on_dtmf(event.digit)
            if answer and speaks:
                await call.speak(answer)


def _answers(event: object, *, turns: bool) -> bool:
    """Whether a turn-taker answers ``event``: the end of a turn, or a final without turns."""
    if turns:
        return isinstance(event, EndOfTurn)
    return isinstance(event, Transcript) and event.is_final


class SilentBot(TurnBot):
    """``--bot none``: listens (speech and transcripts still flow), never speaks."""


@dataclass(frozen=True, slots=True)
class EchoBot(TurnBot):
    """``--bot echo``: repeats what the caller said (the simplest end-to-end check)."""

    greeting: str | None = None

    def reply(self, text: str) -> str | None:
        """The caller's own words, or None when there were none."""
        return text.strip() or None


@dataclass(frozen=True, slots=True)
class Rule:
    """If the caller's words match, say ``say``.

    ``phrases`` (an ``if`` rule) match word-aligned, ignoring case and punctuation;
    ``pattern`` (``if_says`` / ``if_matches``) searches the raw text, ignoring case.
    """

    say: str
    pattern: re.Pattern[str] | None = None
    phrases: tuple[str, ...] = ()

    def matches(self, text: str) -> bool:
        """Whether this rule fires for ``text``."""
        if self.pattern is not None:
            return self.pattern.search(text) is not None
        said = f" {_normalise(text)} "
        return any(f" {p} " in said for p in self.phrases)


def _rule(raw: Any, where: str) -> Rule:
    if not isinstance(raw, dict) or not isinstance(raw.get("say"), str):
        raise BotFileError(f"{where}: needs `say` and one of `if`, `if_says`, `if_matches`")
    extra = set(raw) - _RULE_KEYS
    if extra:
        raise BotFileError(f"{where}: unknown key(s) {', '.join(sorted(map(str, extra)))}")
    conditions = [k for k in ("if", "if_says", "if_matches") if k in raw]
    if len(conditions) != 1:
        raise BotFileError(f"{where}: give exactly one of `if`, `if_says`, `if_matches`")
    say = raw["say"]
    if "if_says" in raw:
        return Rule(say, re.compile(re.escape(str(raw["if_says"])), re.IGNORECASE))
    if "if_matches" in raw:
        try:
            return Rule(say, re.compile(str(raw["if_matches"]), re.IGNORECASE))
        except re.error as exc:
            raise BotFileError(f"{where}: bad regular expression: {exc}") from None
    phrases = raw["if"] if isinstance(raw["if"], list) else [raw["if"]]
    norm = tuple(n for p in phrases if (n := _normalise(str(p))))
    if not norm:
        raise BotFileError(f"{where}: `if` has no words")
    return Rule(say, phrases=norm)


@dataclass(frozen=True, slots=True)
class RuleBot(TurnBot):
    """``--bot FILE.yaml``: the rules of the module docstring; first match wins.

    Immutable, so one instance serves every call (a turn-taker keeps no state).
    """

    rules: tuple[Rule, ...] = ()
    greeting: str | None = None
    fallback: str | None = None
    dtmf: dict[str, str] = field(default_factory=dict)

    def reply(self, text: str) -> str | None:
        """The first matching rule's reply, the fallback, or None for empty input."""
        if not _normalise(text):
            return None
        for rule in self.rules:
            if rule.matches(text):
                return _fill(rule.say, text)
        return _fill(self.fallback, text) if self.fallback else None

    def on_dtmf(self, digit: str) -> str | None:
        """The reply configured for this key."""
        return self.dtmf.get(digit)

    @classmethod
    def from_dict(cls, data: Any, source: str = "bot rules") -> RuleBot:
        """Build from parsed YAML; errors name the source, the rule and the key."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            kind = type(data).__name__
            raise BotFileError(f"{source}: expected a mapping with `rules`, got {kind}")
        unknown = set(data) - _KEYS
        if unknown:
            raise BotFileError(
                f"{source}: unknown key(s) {', '.join(sorted(map(str, unknown)))}; "
                "use greeting, rules, dtmf, fallback"
            )
        raw_rules = data.get("rules") or []
        if not isinstance(raw_rules, list):
            raise BotFileError(f"{source}: `rules` must be a list")
        rules = tuple(_rule(raw, f"{source}: rule {i + 1}") for i, raw in enumerate(raw_rules))
        for key in ("greeting", "fallback"):
            if data.get(key) is not None and not isinstance(data[key], str):
                raise BotFileError(f"{source}: `{key}` must be text")
        raw_dtmf = data.get("dtmf") or {}
        if not isinstance(raw_dtmf, dict):
            raise BotFileError(f"{source}: `dtmf` must map keys (0-9, *, #, A-D) to replies")
        dtmf: dict[str, str] = {}
        for key, say in raw_dtmf.items():
            digit = str(key).upper()
            if digit not in _DIGITS or len(digit) != 1 or not isinstance(say, str):
                raise BotFileError(f"{source}: dtmf {str(key)[:8]!r}: a key 0-9 * # A-D and text")
            dtmf[digit] = say
        return cls(rules, data.get("greeting") or None, data.get("fallback") or None, dtmf)

    @classmethod
    def from_yaml(cls, path: Path | str) -> RuleBot:
        """Load a rules file.

        Raises:
            BotFileError: the file is not UTF-8 YAML or not valid rules; one line naming the
                file (and, for YAML, the line and column), so a CLI can print it as is.
            OSError: the file cannot be read.
        """
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise BotFileError(f"{p}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        except yaml.YAMLError as exc:
            # PyYAML's message spans several lines and quotes the source; keep the gist.
            where = ""
            mark = getattr(exc, "problem_mark", None)
            if mark is not None:
                where = f" at line {mark.line + 1}, column {mark.column + 1}"
            problem = getattr(exc, "problem", None) or type(exc).__name__
            raise BotFileError(f"{p}: not valid YAML: {problem}{where}") from None
        return cls.from_dict(data, str(p))


#: The name the ``voxgate call`` rules had before the two bot systems became one.
ScriptedBot = RuleBot


def sample_bot_path() -> Path:
    """The shipped rules that answer the bundled sample call."""
    return Path(__file__).with_name("sample_bot.yaml")


GRPC_PREFIX = "grpc://"


def load_bot(spec: str | None) -> Bot | str | None:
    """The bot a ``--bot`` value names.

    ``""``/None → no bot; ``none`` → :class:`SilentBot`; ``echo`` → :class:`EchoBot`;
    ``sample`` → the shipped rules; ``grpc://host:port`` → that address (a bot served with
    :func:`voxgate_client.serve_bot`, for :class:`voxgate_client.BotLink`); anything else →
    a rules file.

    Raises:
        BotFileError: no such file, a bad rules file or a bad address (one line).
        OSError: the rules file exists but cannot be read.
    """
    if not spec:
        return None
    if spec == "none":
        return SilentBot()
    if spec == "echo":
        return EchoBot()
    if spec == "sample":
        return RuleBot.from_yaml(sample_bot_path())
    if spec.startswith(GRPC_PREFIX):
        address = spec.removeprefix(GRPC_PREFIX).rstrip("/")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise BotFileError(f"--bot {spec[:80]!r}: expected grpc://host:port")
        return address
    if not Path(spec).is_file():
        raise BotFileError(
            f"--bot {spec[:200]!r}: expected none, echo, sample, a YAML rules file that exists, "
            "or grpc://host:port"
        )
    return RuleBot.from_yaml(spec)


#: ``--bot`` help, the same on every door.
BOT_HELP = (
    "who answers: none (listen only), echo (repeat the caller), sample (the demo rules), "
    "a YAML rules file (greeting, rules: [{if|if_says|if_matches, say}], dtmf, fallback) or "
    "grpc://HOST:PORT of a bot served with voxgate_client.serve_bot"
)


def add_bot_policy_arguments(parser: argparse.ArgumentParser, *, can_transfer: bool) -> None:
    """The bad-bot policy flags (``voxgate sip``, ``voxgate media-streams``).

    Args:
        parser: the command's parser.
        can_transfer: whether the door can transfer a call (SIP REFER); only then is
            ``--bot-fallback-transfer`` offered (a media stream cannot transfer).
    """
    default = BotPolicy()
    parser.add_argument(
        "--bot-answer-timeout",
        type=float,
        default=default.answer_timeout_s,
        metavar="S",
        help="a bot that has not picked up within S seconds is taken as failed "
        f"(default {default.answer_timeout_s:g})",
    )
    parser.add_argument(
        "--bot-fallback",
        default=default.fallback_speech,
        metavar="TEXT",
        help="said to the caller when the bot is down, slow, crashes or sends garbage "
        "('' says nothing)",
    )
    if can_transfer:
        parser.add_argument(
            "--bot-fallback-transfer",
            default="",
            metavar="URI",
            help="after the fallback, transfer the caller here (SIP REFER) instead of hanging up",
        )


def bot_policy_from_args(args: argparse.Namespace) -> BotPolicy:
    """The :class:`BotPolicy` the flags of :func:`add_bot_policy_arguments` describe."""
    if not args.bot_answer_timeout > 0:
        raise BotFileError(f"--bot-answer-timeout {args.bot_answer_timeout:g}: must be > 0")
    # Absent where the door cannot transfer (add_bot_policy_arguments(can_transfer=False)).
    transfer = str(getattr(args, "bot_fallback_transfer", "") or "")
    return BotPolicy(
        answer_timeout_s=float(args.bot_answer_timeout),
        fallback_speech=str(args.bot_fallback),
        then="transfer" if transfer else "hangup",
        transfer_to=transfer,
    )
