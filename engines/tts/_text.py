"""Text front of the TTS engine: markup cleaning, normalisation to speakable words, unit splitting.

Policy on markup (decided here, documented in ``voxgate.engines.tts``): SSML and HTML-like tags are
not interpreted. Tags are stripped and the text between them is spoken; entities (``&amp;``) are
decoded; stray angle brackets and Piper's ``[[ raw phonemes ]]`` brackets are removed so that no
request can inject phonemes. Only text with nothing speakable left is refused.

Each whitespace token of the request stays one :class:`TextWord` with its written form and its
spoken expansion ("$3.50" -> "three dollars and fifty cents"), so word timings can be reported in
the words the caller wrote.
"""

from __future__ import annotations

import html
import re
import unicodedata
from dataclasses import dataclass

from voxgate.engines.tts.base import TtsInputError

__all__ = [
    "TextUnit",
    "TextWord",
    "cardinal",
    "clean_markup",
    "normalize_words",
    "ordinal",
    "prepare_text",
    "split_units",
    "year",
]

_ONES = (
    "zero",
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
)
_TENS = ("_", "_", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")
_SCALES = ((10**12, "trillion"), (10**9, "billion"), (10**6, "million"), (1000, "thousand"))
_ORDINAL_IRREGULAR = {
    "one": "first",
    "two": "second",
    "three": "third",
    "five": "fifth",
    "eight": "eighth",
    "nine": "ninth",
    "twelve": "twelfth",
}
#: Abbreviations whose period does not end a sentence. "st." is resolved by context.
_ABBREVIATIONS = {
    "dr": "doctor",
    "mr": "mister",
    "mrs": "missus",
    "ms": "miz",
    "prof": "professor",
    "jr": "junior",
    "sr": "senior",
    "vs": "versus",
    "etc": "et cetera",
    "inc": "incorporated",
    "ltd": "limited",
    "co": "company",
    "corp": "corporation",
    "ave": "avenue",
    "rd": "road",
    "blvd": "boulevard",
    "approx": "approximately",
    "dept": "department",
    "e.g": "for example",
    "i.e": "that is",
    "a.m": "a m",
    "p.m": "p m",
    "no": "number",
}
_SYMBOLS = {"&": "and", "+": "plus", "=": "equals", "@": "at", "%": "percent", "#": "number"}
_CURRENCY = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
}

_TAG = re.compile(r"<[^<>]*>")
_TOKEN = re.compile(r"^([\"'(\[{]*)(.*?)([\"')\]}.,!?;:]*)$")
_MONEY = re.compile(r"^([$€£])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d{1,2}))?$")
_TIME = re.compile(r"^(\d{1,2}):(\d{2})(am|pm)?$", re.IGNORECASE)
_ORDINAL = re.compile(r"^(\d+)(st|nd|rd|th)$", re.IGNORECASE)
_PERCENT = re.compile(r"^(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?)%$")
_YEAR = re.compile(r"^(1[1-9]\d\d|20\d\d)(s)?$")
_NUMBER = re.compile(r"^(-)?(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?$")
_HOUR_SUFFIX = re.compile(r"^(\d{1,2})(am|pm)$", re.IGNORECASE)
_DIGIT_RUN = re.compile(r"\d+")
_SENTENCE_END = frozenset(".!?")
_CLAUSE_END = frozenset(",;:")


def cardinal(n: int) -> str:
    """Spell a non-negative integer in English words ("one hundred twenty three").

    Numbers of a quadrillion and more are read digit by digit: nobody says them aloud, and a
    digit string is what a listener can check against the text.
    """
    if n < 0:
        return "minus " + cardinal(-n)
    if n >= 10**15:
        return " ".join(_ONES[int(d)] for d in str(n))
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + (" " + _ONES[ones] if ones else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return _ONES[hundreds] + " hundred" + (" " + cardinal(rest) if rest else "")
    for scale, name in _SCALES:
        if n >= scale:
            head, rest = divmod(n, scale)
            return cardinal(head) + " " + name + (" " + cardinal(rest) if rest else "")
    raise AssertionError("unreachable")  # pragma: no cover


#: Longer digit strings are read digit by digit (``cardinal``'s own rule, applied before
#: ``int()``, which refuses strings over Python's 4,300-digit limit).
_MAX_CARDINAL_DIGITS = 15


def _integer_words(digits: str) -> str:
    """Spell a string of decimal digits (of any script, as regex digits are) as a number."""
    digits = digits.replace(",", "")
    if len(digits) > _MAX_CARDINAL_DIGITS:
        return _digits(digits)
    return cardinal(int(digits))


def _ordinal_word(word: str) -> str:
    if word in _ORDINAL_IRREGULAR:
        return _ORDINAL_IRREGULAR[word]
    if word.endswith("y"):
        return word[:-1] + "ieth"
    return word + "th"


def ordinal(n: int) -> str:
    """Spell an ordinal ("twenty third") by changing the last word of the cardinal."""
    words = cardinal(n).split()
    words[-1] = _ordinal_word(words[-1])
    return " ".join(words)


def year(n: int) -> str:
    """Read a year the way people say it: 1999 "nineteen ninety nine", 2005 "two thousand five"."""
    if 2000 <= n <= 2009 or not 1100 <= n <= 2099:
        return cardinal(n)
    head, tail = divmod(n, 100)
    if tail == 0:
        return cardinal(head) + " hundred"
    if tail < 10:
        return cardinal(head) + " oh " + cardinal(tail)
    return cardinal(head) + " " + cardinal(tail)


def _plural(words: str) -> str:
    head, _, last = words.rpartition(" ")
    last = last[:-1] + "ies" if last.endswith("y") else last + "s"
    return (head + " " + last).strip()


#: A run of more digits is refused: 5,000 digits read aloud one by one is half an hour of
#: "seven", which no caller wants; card, phone and order numbers are far shorter.
MAX_READ_DIGITS = 64


def _digits(s: str) -> str:
    if len(s) > MAX_READ_DIGITS:
        raise TtsInputError(
            "text", f"has a run of {len(s)} digits; at most {MAX_READ_DIGITS} are read aloud"
        )
    return " ".join(_ONES[unicodedata.decimal(d)] for d in s)


def _number(sign: str | None, integer: str, fraction: str | None) -> str:
    words = _integer_words(integer)
    if fraction:
        words += " point " + _digits(fraction)
    return ("minus " + words) if sign else words


def _money(symbol: str, integer: str, fraction: str | None) -> str:
    one, many, sub_one, sub_many = _CURRENCY[symbol]
    integer = integer.replace(",", "")
    units = int(integer) if len(integer) <= _MAX_CARDINAL_DIGITS else -1  # -1: "many"
    subunits = int(fraction.ljust(2, "0")) if fraction else 0
    parts = []
    if units or not subunits:
        parts.append(f"{_integer_words(integer)} {one if units == 1 else many}")
    if subunits:
        parts.append(f"{cardinal(subunits)} {sub_one if subunits == 1 else sub_many}")
    return " and ".join(parts)


def _clock(hour: int, minute: int) -> str:
    if minute == 0:
        return cardinal(hour) + (" hundred" if hour > 12 else " o'clock")
    if minute < 10:
        return cardinal(hour) + " oh " + cardinal(minute)
    return cardinal(hour) + " " + cardinal(minute)


def clean_markup(text: str) -> str:
    """Strip tags and control characters, decode entities, and collapse whitespace.

    The order matters: entities are decoded after tags are stripped, so "&lt;b&gt;" stays the
    literal text "<b>" only long enough to lose its brackets; nothing decoded becomes a tag.
    """
    text = unicodedata.normalize("NFKC", text)
    text = _TAG.sub(" ", text)
    text = html.unescape(text)
    text = text.replace("[[", " ").replace("]]", " ")
    text = text.translate(
        {
            ord("<"): " ",
            ord(">"): " ",
            ord("\u2018"): "'",
            ord("\u2019"): "'",
            ord("\u201c"): '"',
            ord("\u201d"): '"',
            ord("\u2026"): "...",
            ord("\u2013"): "-",
            ord("\u2014"): ", ",
        }
    )
    text = "".join(c if unicodedata.category(c)[0] != "C" else " " for c in text)
    return " ".join(text.split())


@dataclass(frozen=True, slots=True)
class TextWord:
    """One written token and how it is spoken.

    Attributes:
        source: the token as written, without surrounding quotes/brackets/punctuation.
        spoken: its normalised words, space separated (at least one word).
        punct: punctuation that follows it in speech ("," "." "?" ...), or "".
    """

    source: str
    spoken: str
    punct: str


@dataclass(frozen=True, slots=True)
class TextUnit:
    """A sentence or clause: the amount of text the front end runs on at once.

    A unit cut out of a longer sentence (the reply's cheap first unit, see
    :func:`split_units`) also carries words on either side that the front end reads for
    context but that this unit does not speak: the front end then shapes the spoken words'
    durations as inside the sentence, not as its end (no phrase-final lengthening, no pause),
    and the audio is cut at a word boundary.

    Attributes:
        words: the words this unit speaks, in order.
        lead: words before them that the front end reads but a previous unit spoke.
        tail: words after them that the front end reads but the next unit speaks.
    """

    words: tuple[TextWord, ...]
    lead: tuple[TextWord, ...] = ()
    tail: tuple[TextWord, ...] = ()

    @property
    def context_words(self) -> tuple[TextWord, ...]:
        """Every word the front end reads: ``lead + words + tail``."""
        return self.lead + self.words + self.tail

    @property
    def text(self) -> str:
        """The text handed to the phonemiser (context words included), punctuation kept."""
        return " ".join(w.spoken + w.punct for w in self.context_words)


def _is_abbreviation(low: str, nxt: str) -> bool:
    """Whether ``low`` followed by a period is an abbreviation rather than a sentence end."""
    if low == "no":
        # "No. 5" is "number five"; "I said no." is a sentence end.
        return nxt[:1].isdigit()
    return low in _ABBREVIATIONS or low == "st"


def _expand_abbreviation(low: str, nxt: str) -> str:
    if low == "st":
        # "St. Louis" (a name follows) vs "Main St." (end of an address).
        return "saint" if nxt[:1].isupper() else "street"
    return _ABBREVIATIONS[low]


def _expand(core: str, prev: str, nxt: str) -> str:
    """Spoken form of one token core (no surrounding punctuation); "" if nothing speakable."""
    low = core.lower()
    if m := _MONEY.match(core):
        return _money(m[1], m[2], m[3])
    if m := _TIME.match(core):
        hour, minute = int(m[1]), int(m[2])
        if hour < 24 and minute < 60:
            return _clock(hour, minute) + (" " + " ".join(m[3].lower()) if m[3] else "")
    if m := _HOUR_SUFFIX.match(core):
        return cardinal(int(m[1])) + " " + " ".join(m[2].lower())
    if low in ("am", "pm") and (_TIME.match(prev) or _HOUR_SUFFIX.match(prev) or prev.isdigit()):
        return " ".join(low)
    if m := _ORDINAL.match(core):
        if len(m[1]) > _MAX_CARDINAL_DIGITS:
            return _digits(m[1]) + " " + m[2].lower()
        return ordinal(int(m[1]))
    if m := _PERCENT.match(core):
        n = _NUMBER.match(m[1])
        assert n is not None
        return _number(n[1], n[2], n[3]) + " percent"
    if m := _YEAR.match(core):
        words = year(int(m[1]))
        return _plural(words) if m[2] else words
    if m := _NUMBER.match(core):
        return _number(m[1], m[2], m[3])
    if core in _SYMBOLS:
        return _SYMBOLS[core]
    if core.startswith("#") and core[1:].isdecimal():
        # isdecimal, not isdigit: "²" is a digit to str.isdigit but not to int().
        return "number " + _integer_words(core[1:])
    # Mixed tokens ("COVID-19", "3D", "and/or"): spell digit runs, keep the letters.
    spoken = _DIGIT_RUN.sub(lambda d: " " + _integer_words(d[0]) + " ", core)
    spoken = re.sub(r"[/&+=@%]", lambda s: " " + _SYMBOLS.get(s[0], " ") + " ", spoken)
    spoken = re.sub(r"[^\w' -]|_", " ", spoken)
    return " ".join(spoken.replace("-", " - ").split()).replace(" - ", "-").strip("-' ")


def normalize_words(text: str) -> list[TextWord]:
    """Turn cleaned text into speakable words, keeping each written token's identity.

    Abbreviation periods are consumed ("Dr." -> "doctor", no sentence end), other trailing
    punctuation is kept for prosody and sentence splitting; ellipses become a comma pause.
    """
    tokens = text.split()
    words: list[TextWord] = []
    for i, token in enumerate(tokens):
        m = _TOKEN.match(token)
        assert m is not None  # the pattern matches every string
        core, trail = m[2], m[3]
        prev = tokens[i - 1].strip("\"'()[]{}.,!?;:") if i else ""
        nxt = tokens[i + 1].lstrip("\"'([{") if i + 1 < len(tokens) else ""
        low = core.lower()
        if trail.startswith(".") and _is_abbreviation(low, nxt):
            # The period belongs to the abbreviation; it ends a sentence only at the very end.
            trail = trail[1:] or ("." if i == len(tokens) - 1 else "")
            spoken = _expand_abbreviation(low, nxt)
        else:
            spoken = _expand(core, prev, nxt)
        punct = "".join(c for c in trail if c in _SENTENCE_END or c in _CLAUSE_END)
        if punct.startswith("..."):
            punct = ","
        punct = punct[:1]
        if not spoken:
            if punct and words and not words[-1].punct:
                last = words[-1]
                words[-1] = TextWord(last.source, last.spoken, punct)
            continue
        words.append(TextWord(core or token, spoken, punct))
    return words


def _pack(words: list[TextWord], limit: int, breaks: frozenset[str]) -> list[list[TextWord]]:
    """Greedily pack words into pieces of at most ``limit`` chars, cutting after ``breaks``."""
    pieces: list[list[TextWord]] = []
    current: list[TextWord] = []
    for word in words:
        current.append(word)
        if not breaks or word.punct in breaks:
            pieces.append(current)
            current = []
    if current:
        pieces.append(current)
    packed: list[list[TextWord]] = []
    for piece in pieces:
        if packed and _length(packed[-1]) + 1 + _length(piece) <= limit:
            packed[-1].extend(piece)
        else:
            packed.append(list(piece))
    return packed


def _length(words: list[TextWord]) -> int:
    return sum(len(w.spoken) + len(w.punct) + 1 for w in words) - 1


def split_units(
    words: list[TextWord],
    *,
    max_unit_chars: int,
    first_unit_max_chars: int,
    first_unit_words: int = 0,
    lookahead_words: int = 2,
) -> list[TextUnit]:
    """Split words into sentences, cutting long ones at clauses and then at word boundaries.

    The first sentence is also cut at its first clause when it is longer than
    ``first_unit_max_chars`` (0 disables): the front end then runs on less text before the
    reply's first audio, at the cost of a clause-level pause the comma already asked for.

    If the first unit is still longer than ``first_unit_max_chars`` and ``first_unit_words``
    is set, it is cut after that many words with no pause at all: the first unit speaks them,
    its front end reading ``lookahead_words`` more for context; the next unit is the whole
    sentence again (its first words as ``lead``), spoken from the cut on. First audio then
    needs the front end of a few words only, and the rest of the sentence keeps the
    sentence's own prosody; what the cut costs is measured by ``benchmarks/tts_first_unit.py``.
    """
    sentences: list[list[TextWord]] = [[]]
    for word in words:
        sentences[-1].append(word)
        if word.punct in _SENTENCE_END:
            sentences.append([])
    units: list[list[TextWord]] = []
    for sentence in filter(None, sentences):
        if _length(sentence) <= max_unit_chars:
            units.append(sentence)
            continue
        for clause in _pack(sentence, max_unit_chars, _CLAUSE_END):
            if _length(clause) <= max_unit_chars:
                units.append(clause)
            else:
                units.extend(_pack(clause, max_unit_chars, frozenset()))
    if first_unit_max_chars and units and _length(units[0]) > first_unit_max_chars:
        first = units[0]
        cut = next((i for i, w in enumerate(first[:-1]) if w.punct in _CLAUSE_END), None)
        if cut is not None:
            units[0:1] = [first[: cut + 1], first[cut + 1 :]]
    out = [TextUnit(tuple(u)) for u in units]
    if first_unit_words and out and _length(units[0]) > first_unit_max_chars:
        head = out[0].words
        k = first_unit_words
        # Cut only where both sides keep at least two words (a one-word remainder would
        # cost a whole-sentence front end for a word).
        if len(head) >= k + 2:
            out[0:1] = [
                TextUnit(head[:k], tail=head[k : k + max(1, lookahead_words)]),
                TextUnit(head[k:], lead=head[:k]),
            ]
    return out


def prepare_text(
    text: str,
    *,
    max_chars: int,
    max_unit_chars: int,
    first_unit_max_chars: int,
    first_unit_words: int = 0,
    lookahead_words: int = 2,
) -> list[TextUnit]:
    """Validate, clean, normalise and split a request's text.

    Raises:
        TtsInputError: the text is empty, longer than ``max_chars``, or has nothing speakable.
    """
    if len(text) > max_chars:
        raise TtsInputError(
            "text",
            f"{len(text)} characters exceeds the limit of {max_chars} (TtsConfig.max_chars); "
            "split the reply into several requests",
        )
    if not text.strip():
        raise TtsInputError("text", "is empty")
    words = normalize_words(clean_markup(text))
    if not words:
        raise TtsInputError("text", "has nothing speakable once markup and symbols are removed")
    return split_units(
        words,
        max_unit_chars=max_unit_chars,
        first_unit_max_chars=first_unit_max_chars,
        first_unit_words=first_unit_words,
        lookahead_words=lookahead_words,
    )
