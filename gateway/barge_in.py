"""Barge-in policy: what the caller must do to interrupt the reply being played.

* ``immediate``: playback stops as soon as caller speech begins (after the call's
  ``min_speech_ms``), right behind SPEECH_BEGIN. The fastest, and what most bots want.
* ``after_words``: playback stops on the first transcript (interim or final) of speech that began
  during the reply with at least ``min_words`` words that are not backchannels. A caller who says
  "mm-hmm", "yeah" or "okay" while the bot talks is listening, not interrupting; a cough or a
  door is not a word at all. It costs the time of a word or two plus one interim decode, so the
  session runs interims during such a reply at ``session.barge_in.interim_interval_ms``.
* ``never``: announcements, legal text; playback never stops for the caller.

Pure functions over plain values, so the policy is tested without a session.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "DEFAULT_BACKCHANNELS",
    "BargeInMode",
    "BargeInPolicy",
    "content_words",
    "normalise_words",
]

BargeInMode = Literal["immediate", "after_words", "never"]

#: Listener responses that never interrupt under ``after_words`` (matched after normalisation:
#: lower case, punctuation dropped, hyphens as spaces, so "Mm-hmm." matches "mm hmm").
DEFAULT_BACKCHANNELS: tuple[str, ...] = (
    "mm-hmm",
    "mhm",
    "mm",
    "hmm",
    "uh-huh",
    "uh",
    "um",
    "yeah",
    "yes",
    "yep",
    "yup",
    "okay",
    "ok",
    "right",
    "sure",
    "alright",
    "all right",
    "i see",
    "got it",
)

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")


def normalise_words(text: str) -> tuple[str, ...]:
    """Words of ``text`` in lower case, punctuation dropped, hyphenated parts apart."""
    return tuple(_WORD.findall(text.lower().replace("-", " ")))


def _phrases(backchannels: Iterable[str]) -> list[tuple[str, ...]]:
    phrases = {normalise_words(b) for b in backchannels}
    phrases.discard(())
    return sorted(phrases, key=len, reverse=True)  # longest match first


def content_words(text: str, backchannels: Iterable[str]) -> int:
    """How many words of ``text`` are not part of a backchannel phrase.

    "Mm-hmm, yeah." has none; "yeah, wait a second" has three ("wait", "a", "second").
    Phrases match whole words only, longest first.
    """
    words = normalise_words(text)
    phrases = _phrases(backchannels)
    count, i = 0, 0
    while i < len(words):
        for p in phrases:
            if words[i : i + len(p)] == p:
                i += len(p)
                break
        else:
            count += 1
            i += 1
    return count


@dataclass(frozen=True, slots=True)
class BargeInPolicy:
    """The resolved policy of one reply (the call's, overridden by its Speak)."""

    mode: BargeInMode = "immediate"
    min_words: int = 1
    backchannels: tuple[str, ...] = DEFAULT_BACKCHANNELS

    def interrupts(self, text: str) -> bool:
        """Whether a caller transcript ``text`` interrupts a reply under ``after_words``."""
        return content_words(text, self.backchannels) >= max(1, self.min_words)

    def for_speak(
        self, mode: BargeInMode | None, min_words: int, *, uninterruptible: bool
    ) -> BargeInPolicy:
        """This call policy as a Speak overrides it (``None`` / ``0`` keep the call's)."""
        if uninterruptible:
            mode = "never"
        return BargeInPolicy(
            mode=mode or self.mode,
            min_words=min_words or self.min_words,
            backchannels=self.backchannels,
        )
