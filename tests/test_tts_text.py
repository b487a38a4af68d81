"""Text normalisation, markup policy and sentence/clause splitting for the TTS engine."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from voxgate.engines.tts import TtsInputError
from voxgate.engines.tts._text import (
    cardinal,
    clean_markup,
    normalize_words,
    ordinal,
    prepare_text,
    split_units,
    year,
)

pytestmark = pytest.mark.unit


def spoken(text: str) -> str:
    return " ".join(w.spoken + w.punct for w in normalize_words(clean_markup(text)))


def units(text: str, max_unit_chars: int = 300, first: int = 0) -> list[str]:
    return [
        u.text
        for u in prepare_text(
            text, max_chars=10_000, max_unit_chars=max_unit_chars, first_unit_max_chars=first
        )
    ]


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (0, "zero"),
        (7, "seven"),
        (13, "thirteen"),
        (40, "forty"),
        (42, "forty two"),
        (100, "one hundred"),
        (105, "one hundred five"),
        (1000, "one thousand"),
        (1_234_567, "one million two hundred thirty four thousand five hundred sixty seven"),
        (2_000_000_001, "two billion one"),
    ],
)
def test_cardinal(n: int, words: str) -> None:
    assert cardinal(n) == words


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (1, "first"),
        (2, "second"),
        (3, "third"),
        (12, "twelfth"),
        (20, "twentieth"),
        (23, "twenty third"),
        (101, "one hundred first"),
    ],
)
def test_ordinal(n: int, words: str) -> None:
    assert ordinal(n) == words


@pytest.mark.parametrize(
    ("n", "words"),
    [
        (1999, "nineteen ninety nine"),
        (2005, "two thousand five"),
        (2024, "twenty twenty four"),
        (1900, "nineteen hundred"),
        (1905, "nineteen oh five"),
    ],
)
def test_year(n: int, words: str) -> None:
    assert year(n) == words


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I paid $3.50.", "I paid three dollars and fifty cents."),
        ("It costs $1", "It costs one dollar"),
        ("Just $0.05", "Just five cents"),
        ("£2.01 each", "two pounds and one penny each"),
        ("Meet at 10:30", "Meet at ten thirty"),
        ("Meet at 10:05 pm", "Meet at ten oh five p m"),
        ("At 9:00.", "At nine o'clock."),
        ("On the 23rd", "On the twenty third"),
        ("In 1999, we", "In nineteen ninety nine, we"),
        ("The 1990s", "The nineteen nineties"),
        ("Up 50% today", "Up fifty percent today"),
        ("About 3.14 units", "About three point one four units"),
        ("It is -7 now", "It is minus seven now"),
        ("We sold 1,234 cars", "We sold one thousand two hundred thirty four cars"),
        ("Dr. Smith", "doctor Smith"),
        ("Mr. and Mrs. Jones", "mister and missus Jones"),
        ("St. Louis", "saint Louis"),
        ("on Main St. today", "on Main street today"),
        ("No. 5 please", "number five please"),
        ("Rock & roll", "Rock and roll"),
        ("COVID-19", "COVID-nineteen"),
    ],
)
def test_normalisation(text: str, expected: str) -> None:
    assert spoken(text) == expected


def test_written_words_are_kept_for_alignment() -> None:
    words = normalize_words(clean_markup('He said "$3.50, please" to Dr. Who.'))
    assert [w.source for w in words] == ["He", "said", "$3.50", "please", "to", "Dr", "Who"]
    assert words[2].spoken == "three dollars and fifty cents" and words[2].punct == ","
    assert words[-1].punct == "."


def test_markup_is_stripped_not_interpreted() -> None:
    text = '<speak>Hello <break time="1s"/><emphasis>world</emphasis> &amp; you</speak>'
    assert clean_markup(text) == "Hello world & you"
    assert spoken(text) == "Hello world and you"
    # Piper's raw-phoneme escape must not pass through; stray brackets vanish.
    assert "[[" not in clean_markup("say [[ h ə l ˈoʊ ]] now")
    assert "<" not in clean_markup("a < b > c") and ">" not in clean_markup("a < b > c")


def test_entities_never_become_tags() -> None:
    assert clean_markup("&lt;b&gt;bold&lt;/b&gt;") == "b bold /b"


@pytest.mark.parametrize("text", ["", "   \n\t", "<p></p>", "<br/> ... !!"])
def test_nothing_speakable_is_refused(text: str) -> None:
    with pytest.raises(TtsInputError) as info:
        units(text)
    assert info.value.field == "text"


def test_too_long_text_names_the_limit() -> None:
    with pytest.raises(TtsInputError) as info:
        prepare_text("a" * 100_001, max_chars=10_000, max_unit_chars=300, first_unit_max_chars=0)
    assert info.value.field == "text"
    assert "10000" in str(info.value) and "100001" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_sentence_splitting_ignores_abbreviation_periods() -> None:
    assert units("Hello Dr. Smith. How are you? Fine! Thanks") == [
        "Hello doctor Smith.",
        "How are you?",
        "Fine!",
        "Thanks",
    ]


def test_long_sentences_split_at_clauses_then_words() -> None:
    clause = "this clause has several words in it"
    text = ", ".join([clause] * 6) + "."
    pieces = units(text, max_unit_chars=80)
    assert len(pieces) > 1
    assert all(len(p) <= 80 for p in pieces)
    assert pieces[0].endswith(",")
    # No clause boundary at all: word boundaries, still within the limit, nothing lost.
    words = " ".join(["word"] * 60)
    pieces = units(words, max_unit_chars=50)
    assert all(len(p) <= 50 for p in pieces)
    assert " ".join(pieces).split() == words.split()


def test_first_long_sentence_is_cut_at_its_first_clause() -> None:
    text = "Well, let me check that order for you in our system right now. Done."
    assert units(text, first=30) == [
        "Well,",
        "let me check that order for you in our system right now.",
        "Done.",
    ]
    assert units(text, first=0)[0].startswith("Well, let me")


def test_first_sentence_without_an_early_clause_is_cut_after_a_few_words() -> None:
    """The cheap first unit: its front end reads two words past the cut for context, the
    next unit is the whole sentence again (the cut words as lead), spoken from the cut."""
    text = "Is there anything else I can help you with? Thanks."
    out = prepare_text(
        text, max_chars=1000, max_unit_chars=300, first_unit_max_chars=30, first_unit_words=3
    )
    source = [[w.source for w in part] for u in out for part in (u.lead, u.words, u.tail)]
    assert source == [
        [],
        ["Is", "there", "anything"],
        ["else", "I"],
        ["Is", "there", "anything"],
        ["else", "I", "can", "help", "you", "with"],
        [],
        [],
        ["Thanks"],
        [],
    ]
    # Every written word is spoken once, in order; the phonemiser reads the context too.
    assert [w.source for u in out for w in u.words] == [w.strip("?.") for w in text.split()]
    assert out[0].text == "Is there anything else I"
    assert out[1].text == "Is there anything else I can help you with?"


@pytest.mark.parametrize(
    ("text", "words", "expected"),
    [
        # The clause split already made the first unit short: no word cut.
        ("Well, let me check that order for you in our system right now.", 3, ["Well,"]),
        # Too few words to leave two on each side of the cut.
        ("Please hold the line now.", 4, ["Please hold the line now."]),
        # Off.
        ("Is there anything else I can help you with?", 0, None),
    ],
)
def test_the_word_cut_only_applies_where_it_shortens_a_long_first_unit(
    text: str, words: int, expected: list[str] | None
) -> None:
    out = prepare_text(
        text, max_chars=1000, max_unit_chars=300, first_unit_max_chars=20, first_unit_words=words
    )
    assert all(not u.lead and not u.tail for u in out)
    if expected is not None:
        assert [u.text for u in out][: len(expected)] == expected


def test_split_units_on_empty_list() -> None:
    assert split_units([], max_unit_chars=100, first_unit_max_chars=10) == []


@given(st.integers(min_value=0, max_value=10**15 - 1))
def test_cardinal_is_words_only(n: int) -> None:
    words = cardinal(n)
    assert re.fullmatch(r"[a-z]+( [a-z]+)*", words)


@given(st.integers(min_value=0, max_value=10**9), st.integers(min_value=0, max_value=99))
def test_money_never_leaves_digits(dollars: int, cents: int) -> None:
    text = spoken(f"${dollars:,}.{cents:02d}")
    assert not re.search(r"\d|\$", text)
    assert ("dollar" in text) == (dollars > 0 or cents == 0)
    assert ("cent" in text) == (cents > 0)


# --- the normaliser never raises anything but TtsInputError ----------------------------------

LIMIT = 10_000

_NUMERIC_PIECES = st.sampled_from(
    ["7", "#", "$", "€", "£", ".", ",", "%", "th", "st", ":", "-", "am", "pm", "²", "٣", "৯", " "]
)


def _repeat(unit: str, times: int) -> str:
    return (unit * times)[:LIMIT]


# Any Unicode; numeric-looking text (where the v0.1 reader crashed); and long repetitions of
# short pieces, which is how text reaches the limit.
_TEXTS = st.one_of(
    st.text(max_size=400),
    st.text(st.sampled_from("7#$€£.,%:-²٣৯ th"), max_size=200),
    st.lists(_NUMERIC_PIECES, max_size=80).map("".join),
    st.builds(_repeat, st.text(min_size=1, max_size=6), st.integers(1, 4_000)),
    st.builds(_repeat, _NUMERIC_PIECES, st.integers(1, 6_000)),
)


@given(_TEXTS)
def test_prepare_text_raises_only_tts_input_error(text: str) -> None:
    try:
        out = prepare_text(text, max_chars=LIMIT, max_unit_chars=300, first_unit_max_chars=40)
    except TtsInputError:
        return
    assert out and all(u.text for u in out)


@pytest.mark.parametrize(
    "text",
    [
        "7" * 5000,
        "$" + "9" * 5000,
        "9" * 5000 + "th",
        "#" + "1" * 5000,
        "1." + "2" * 5000,
        "COVID-" + "1" * 5000,
        "#²",
        "٣" * 5000,
    ],
)
def test_absurd_numbers_are_refused_or_read_never_crash(text: str) -> None:
    """v0.1: int() raised ValueError past Python's 4,300-digit limit (INTERNAL on the call)."""
    try:
        out = prepare_text(text, max_chars=LIMIT, max_unit_chars=300, first_unit_max_chars=0)
    except TtsInputError as exc:
        assert "digits" in str(exc) and len(str(exc)) < 200
    else:
        assert out


def test_digit_runs_up_to_the_limit_are_read_digit_by_digit() -> None:
    assert spoken("#" + "1" * 20) == "number " + " ".join(["one"] * 20)
    assert spoken("٣٣") == "thirty three"
