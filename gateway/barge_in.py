"""Barge-in policy: what the caller must do to interrupt the reply being played.

* ``immediate``: playback stops as soon as caller speech begins (after the call's
  ``min_speech_ms``), right behind SPEECH_BEGIN. The fastest, and what most bots want.
* ``after_words``: playback stops on the first transcript (interim or final) of speech heard over
  the reply with at least ``min_words`` words that are not backchannels. A caller who says
  "mm-hmm", "yeah" or "okay" while the bot talks is listening, not interrupting; a cough or a
  door is not a word at all. It costs the time of a word or two plus one interim decode, so the
  session runs interims during such a reply at ``session.barge_in.interim_interval_ms``.
* ``never``: announcements, legal text; playback never stops for the caller.

Speech heard over a reply is speech that begins during it, and speech already in progress when
it starts that goes on over it (a caller still talking when the bot starts is talked over as
much): under ``immediate`` it cuts once the reply plays, when the speech is ``min_speech_ms``
old counted from its start and the caller still talks; under ``after_words`` all its words
count, those said before the reply too. A caller in a pause when the reply starts is taken to
be done and is not cut off unless they talk again (``BargeIn.speech_in_progress`` in
:mod:`voxgate.gateway.call.barge_in`).

The interims that only ``after_words`` reads need a word count in time, not the call's
transcript, so a server may decode them with a smaller model (``asr.barge_in_model``,
:class:`BargeInModel`); the client's own interims and every final keep the call's model.

Pure functions over plain values, so the policy is tested without a session.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

from voxgate.engines.asr.base import AsrOptions

__all__ = [
    "DEFAULT_BACKCHANNELS",
    "BargeInMode",
    "BargeInModel",
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
    "ah",
    "oh",
    "huh",
    "aha",
    "ha",
    "hm",
    "er",
    "erm",
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
_RUN = re.compile(r"(.)\1+")
#: A word of nothing but m's and h's is a hum however it is spelt ("Mmm", "Hmmm", "Mhm", the
#: "M-M-M" or "M.H.M." Whisper writes for a long one), and "haha", "ahaha" are laughter (Whisper
#: also wrote "haha" for "uh-huh" over a reply): no English word is either, so neither is a word.
_HUM = re.compile(r"[mh]+|a?(?:ha)+")


def normalise_words(text: str) -> tuple[str, ...]:
    """Words of ``text`` in lower case, punctuation dropped, hyphenated parts apart."""
    return tuple(_WORD.findall(text.lower().replace("-", " ")))


def _held(words: tuple[str, ...]) -> tuple[str, ...]:
    """Each word with its held letters said once: "mmm" -> "m", "okaaay" -> "okay".

    Whisper spells a drawn-out backchannel with the letters held ("Mmm.", "Ohh.", "Yeahh."), so
    a listed "mm" or "oh" must match however long the caller held it. Both sides are squeezed,
    so the list's own spelling ("mm-hmm", "all right") still matches itself.
    """
    return tuple(_RUN.sub(r"\1", w) for w in words)


def _phrases(backchannels: Iterable[str]) -> list[tuple[str, ...]]:
    phrases = {_held(normalise_words(b)) for b in backchannels}
    phrases.discard(())
    return sorted(phrases, key=len, reverse=True)  # longest match first


def content_words(text: str, backchannels: Iterable[str]) -> int:
    """How many words of ``text`` are not part of a backchannel phrase.

    "Mm-hmm, yeah." has none; "yeah, wait a second" has three ("wait", "a", "second").
    Phrases match whole words only, longest first, however long a letter is held ("Mmm.",
    "Okaaay."); a hum ("Hmmm", "M-M-M") is never a word, listed or not.
    """
    words = tuple(w for w in _held(normalise_words(text)) if not _HUM.fullmatch(w))
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


@dataclass(frozen=True, slots=True)
class BargeInModel:
    """The model that decodes the interims only an ``after_words`` barge-in reads.

    Until such an interim comes back the caller and the bot talk at once, and on a CPU one
    decode of the call's model is most of that time (Whisper base: 0.39-0.45 s on one core for
    a 0.8-1.6 s prefix on its 10 s encoder window; tiny.en: 0.19 s, docs/barge-in.md). The
    decode only has to tell words from backchannels, and the client never sees it; the final,
    which it does see, still comes from the call's model.

    Attributes:
        key: the routing key its requests carry in ``AsrOptions.model``.
        languages: the languages it speaks (``("en",)`` for an English-only model).
    """

    key: str
    languages: tuple[str, ...]

    def options(self, call: AsrOptions) -> AsrOptions | None:
        """The call's interim options on this model; None when it does not speak the language.

        A call that detects its language (``None``) gets the model's only language when it has
        one: an English-only model cannot detect. The prompt and hotwords are the call model's
        tokens (tokenizers differ) and a word count needs neither, nor a beam, alternatives or
        word times; a translating call is transcribed (the words are counted, not read).
        """
        language = call.language
        if language is not None and language not in self.languages:
            return None
        if language is None and len(self.languages) == 1:
            language = self.languages[0]
        return replace(
            call,
            model=self.key,
            language=language,
            task="transcribe",
            beam_size=1,
            mbr_candidates=0,
            num_alternatives=0,
            word_timestamps=False,
            initial_prompt="",
            hotwords=(),
            context_tokens=None,
        )
