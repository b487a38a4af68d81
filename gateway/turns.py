"""End of turn: a pure policy that decides when the caller has finished their turn.

End of speech (the VAD's hangover, ``SPEECH_END``) and end of turn (the caller is done and the
bot should answer) are different events. A caller pauses inside a sentence ("and so, my fellow
Americans ... ask not ...") for longer than any hangover that still answers quickly, and a
caller who has finished a sentence is done well before a hangover long enough to hold those
pauses. So the turn is decided on three signals, each optional but silence:

* **silence**: call audio since the end of the turn's last speech (the VAD's refined end);
* **the words so far**: the turn's finals and the current utterance's final, decoded as soon
  as the silence begins (speculative finals); an unfinished clause -- a trailing conjunction,
  preposition or article, a hesitation ("um", "uh"), a number being read out, a trailing
  comma -- holds the turn, a sentence with its full stop lets it end;
* **an audio end-of-turn model** (Smart Turn v3, :mod:`voxgate.engines.turn`) where the server has
one:
  the prosody of the last seconds says whether the voice trails off as at the end of a turn.

They combine into one probability ``p`` that the turn is complete (the audio model can only
lower the words' -- either signal holds the turn), and the turn ends once the silence reaches
the hold that ``p`` earns: ``min_silence_ms`` for a certain end, growing
linearly to ``max_pause_ms`` for a certainly unfinished one (scaled by eagerness). Everything
here is synchronous and clock-free: the session passes the silence it measured on the call's
own audio clock (so a file sent faster than real time decides the same way).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "TurnDecision",
    "TurnDetector",
    "TurnInput",
    "TurnMode",
    "TurnOptions",
    "text_completion",
]

#: ``off``: no turns (today's finals only); ``silence``: every utterance is a turn, ended by the
#: VAD's hangover; ``smart``: silence + words (+ the audio model).
TurnMode = Literal["off", "silence", "smart"]


@dataclass(frozen=True, slots=True)
class TurnOptions:
    """A call's turn detection, resolved from the server's defaults and the call's config.

    Attributes:
        mode: see :data:`TurnMode`.
        eagerness: 0..1; scales every hold (0.5 = as documented, 1 = end at ``min_silence_ms``
            whatever the words, 0 = twice the hold, capped at ``max_pause_ms``).
        end_silence_ms: ``silence``: the hangover that ends an utterance and its turn.
        min_silence_ms: ``smart``: the shortest silence that ends a turn (a certain end).
        max_pause_ms: ``smart``: the longest pause held over an unfinished sentence.
        decode_after_ms: ``smart``: silence after which the utterance's final decode starts
            (its words are then known when the turn may end).
        audio_model: ``smart``: use the server's audio end-of-turn model when it has one.
        words: ``smart``: read the words so far; False leaves silence and the audio model
            (to measure the audio model on its own; without a model the probability is 0.5).
        whole_text: ``smart``: a turn of two or more utterances is decoded again as one, from
            spare capacity, while the turn may end; its EndOfTurn's text is that decode when
            it is back in time, else the finals joined (gateway/call/turn_taking.py).
    """

    mode: TurnMode = "off"
    eagerness: float = 0.5
    end_silence_ms: int = 600
    min_silence_ms: int = 200
    max_pause_ms: int = 1_800
    decode_after_ms: int = 80
    audio_model: bool = True
    words: bool = True
    whole_text: bool = True

    @property
    def on(self) -> bool:
        """Whether the call gets EndOfTurn events."""
        return self.mode != "off"


@dataclass(frozen=True, slots=True)
class TurnInput:
    """What the session knows of the open turn, at one moment.

    Attributes:
        silence_ms: call audio since the end of the turn's last speech.
        text: the turn's words so far, the current utterance's included; None while the
            current utterance is not decoded yet.
        audio_probability: the audio model's probability that the turn is complete, or None
            (no model, or not run yet on this silence).
        end_mark: how sure Whisper was of the sentence-final mark that ends the turn's last
            final (``AsrResult.end_mark_probability``), or None (no mark, or not reported).
    """

    silence_ms: int
    text: str | None
    audio_probability: float | None = None
    end_mark: float | None = None


@dataclass(frozen=True, slots=True)
class TurnDecision:
    """The policy's answer: whether the turn is over now, and how sure it is.

    Attributes:
        end: the turn is over.
        probability: the combined probability that the turn is complete (0..1).
        reason: what ended it ("words", "audio", "max_pause", "silence"), "" while it holds.
        hold_ms: the silence this turn needs before it ends, as things stand.
    """

    end: bool
    probability: float
    reason: str = ""
    hold_ms: int = 0


# Words after which a sentence hardly ever ends: conjunctions, articles and possessives,
# prepositions that need an object, and hesitations. Compared lower case, punctuation
# stripped. (Pronouns, auxiliaries and "so", "on", "in" end sentences: "I think so", "I can".)
_UNFINISHED = frozenset(
    [
        "and",
        "but",
        "or",
        "nor",
        "because",
        "although",
        "though",
        "whereas",
        "unless",
        "whether",
        "than",
        "if",
        "the",
        "a",
        "an",
        "my",
        "your",
        "our",
        "their",
        "every",
        "each",
        "of",
        "to",
        "at",
        "by",
        "from",
        "with",
        "into",
        "onto",
        "between",
        "through",
        "during",
        "among",
        "within",
        "upon",
        "via",
        "per",
        "towards",
        "toward",
        "um",
        "uh",
        "er",
        "erm",
        "uhm",
    ]
)
_NUMBER_WORDS = frozenset(
    [
        "zero",
        "oh",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
        "twenty",
        "thirty",
        "forty",
        "fifty",
        "sixty",
        "seventy",
        "eighty",
        "ninety",
        "hundred",
        "thousand",
        "million",
        "billion",
        "point",
        "double",
        "triple",
    ]
)
_WORD = re.compile(r"[\w']+")
_TERMINAL = re.compile(r"[.?!。？！][\"')\]]*\s*$")
_SOFT = re.compile(r"[,;:\-–—…]\s*$|\.\.\.\s*$")


#: How sure Whisper must be that the sentence ends where it closed it (``end_mark``) for its
#: full stop to count fully, and at or below which the sentence counts as still open.
END_MARK_SURE = 0.95
END_MARK_UNSURE = 0.8
#: A sentence without its closing mark: most likely still open.
_OPEN = 0.35


def text_completion(text: str, end_mark: float | None = None) -> float:
    """How likely a turn that ends with ``text`` is complete, from its words alone (0..1).

    Whisper punctuates what it hears: a sentence it closes with a full stop or a question mark
    is most likely finished; an unfinished clause (a trailing "and", "the", "because", a
    hesitation), a number being read out (digits or number words: a phone number, an amount)
    or a trailing comma or ellipsis most likely is not.

    ``end_mark`` (``AsrResult.end_mark_probability``) says how far to believe that mark: how
    sure Whisper was that the sentence ends there, against going on with a comma, an ellipsis
    or a next word. Whisper closes a fragment that a pause cut off ("He was not." of "he was
    not an ill disposed young man") with a full stop too, but less surely: on the turn-taking
    pause set that probability was 0.77/0.91 at the mid-sentence pauses (lower quartile,
    median) and 0.93/0.96 at the clips' ends. A closed sentence counts fully at
    ``END_MARK_SURE`` and up, as an open one at ``END_MARK_UNSURE`` and below, in proportion
    between.
    """
    stripped = text.strip()
    words = _WORD.findall(stripped.lower())
    if not words:
        return 0.5
    last = words[-1]
    if stripped.endswith("...") or stripped.endswith("…"):
        return 0.2
    if last in _UNFINISHED:
        return 0.1
    if last.isdigit() or last in _NUMBER_WORDS:
        return 0.25 if not _TERMINAL.search(stripped) else 0.5
    if _SOFT.search(stripped):
        return 0.3
    if _TERMINAL.search(stripped):
        closed = 0.95 if stripped.endswith(("?", "!")) else 0.9
        if end_mark is None:
            return closed
        sure = (end_mark - END_MARK_UNSURE) / (END_MARK_SURE - END_MARK_UNSURE)
        return _OPEN + (closed - _OPEN) * min(1.0, max(0.0, sure))
    # Whisper punctuates the sentences it hears end; none at all is a sentence still open
    # ("And so my fellow Americans").
    return _OPEN


class TurnDetector:
    """Decides the end of the open turn from silence, words and the audio model. Pure.

    Args:
        options: the call's turn detection (``mode`` ``silence`` or ``smart``).
    """

    def __init__(self, options: TurnOptions) -> None:
        self.options = options

    def probability(
        self, text: str | None, audio_probability: float | None, end_mark: float | None = None
    ) -> float:
        """The combined probability that the turn is complete."""
        words = text_completion(text, end_mark) if text is not None and self.options.words else 0.5
        if audio_probability is None or not self.options.audio_model:
            return words
        if not self.options.words:
            return audio_probability
        # Either signal can hold the turn; it ends when both say it is done. Whisper closes
        # fragments with full stops ("ASK!", "Go forward."), and the voice trailing up over a
        # dramatic pause says otherwise; a finished-sounding voice over an unfinished clause
        # ("and the") is held by the words. So the model never ends a turn sooner than the
        # words would; it holds turns the words would end too soon.
        return min(words, audio_probability)

    def hold_ms(self, probability: float) -> int:
        """The silence a turn this likely complete needs before it ends."""
        opts = self.options
        scale = 2.0 * (1.0 - min(1.0, max(0.0, opts.eagerness)))
        span = max(0, opts.max_pause_ms - opts.min_silence_ms)
        hold = opts.min_silence_ms + (1.0 - probability) * span * scale
        return int(min(opts.max_pause_ms, hold))

    def decide(self, state: TurnInput) -> TurnDecision:
        """Whether the turn is over, given the silence so far and what is known of it."""
        opts = self.options
        if opts.mode == "silence":
            end = state.silence_ms >= opts.end_silence_ms
            return TurnDecision(end, 1.0 if end else 0.0, "silence" if end else "")
        if state.text is None:
            # The words (or the audio model) are not in yet: wait for them, up to the longest
            # pause a turn is held over (a decode that keeps them past it does not hold the
            # caller's turn open for good; one that ends a turn the words would hold does).
            end = state.silence_ms >= opts.max_pause_ms
            return TurnDecision(end, 0.5, "silence" if end else "", opts.max_pause_ms)
        p = self.probability(state.text, state.audio_probability, state.end_mark)
        hold = self.hold_ms(p)
        if state.silence_ms >= opts.max_pause_ms:
            return TurnDecision(True, p, "max_pause", hold)
        if state.silence_ms < hold:
            return TurnDecision(False, p, "", hold)
        used_audio = state.audio_probability is not None and opts.audio_model
        return TurnDecision(True, p, "audio" if used_audio else "words", hold)
