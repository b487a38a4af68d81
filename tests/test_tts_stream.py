"""The streaming VITS engine on the bundled voice: windowing fidelity, words, cache, inputs."""

from __future__ import annotations

import re
from collections.abc import Iterator

import numpy as np
import pytest

from voxgate.engines.tts import (
    SpeakOptions,
    TtsChunk,
    TtsConfig,
    TtsError,
    TtsInputError,
    VitsStreamer,
)

pytestmark = pytest.mark.model

QUIET = SpeakOptions(noise_scale=0.0, noise_w=0.0)  # deterministic, so comparisons are exact
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Your appointment with Dr. Lee is on March 3rd at 10:30, and it costs $45.",
    "Well, I'm not sure about that; let me check our records for you right now. One moment!",
]


@pytest.fixture(scope="module")
def streamer() -> Iterator[VitsStreamer]:
    engine = VitsStreamer.load(TtsConfig())
    engine.warmup()
    yield engine
    engine.close()


def snr_db(reference: np.ndarray, test: np.ndarray) -> float:
    noise = float(np.sum((reference - test) ** 2))
    return float(10 * np.log10(float(np.sum(reference**2)) / max(noise, 1e-30)))


def written_words(text: str) -> list[str]:
    return [w.strip("\"'()[]{}.,!?;:") for w in text.split()]


@pytest.mark.parametrize("text", SENTENCES + [" ".join(SENTENCES)])
def test_windowed_stream_matches_one_shot(streamer: VitsStreamer, text: str) -> None:
    chunks = list(streamer.stream(text, QUIET))
    reference = streamer.synthesize_oneshot(text, QUIET)
    audio = np.concatenate([c.samples for c in chunks])
    assert audio.shape == reference.samples.shape
    assert snr_db(reference.samples, audio) >= 60.0
    assert [(w.text, w.start_ms, w.end_ms) for c in chunks for w in c.words] == [
        (w.text, w.start_ms, w.end_ms) for w in reference.words
    ]


def test_larger_later_windows_keep_the_audio_and_the_first_window() -> None:
    """The degradation ladder's tts_window step: fewer, larger windows, the same reply."""
    engine = VitsStreamer.load(TtsConfig(cache_bytes=0))  # no cache: both runs really decode
    try:
        text = " ".join(SENTENCES)
        cfg = engine.config
        normal = list(engine.stream(text, QUIET))
        wide = SpeakOptions(noise_scale=0.0, noise_w=0.0, window_frames=2 * cfg.window_frames)
        shed = list(engine.stream(text, wide))
        first = cfg.first_window_frames * engine.hop_length
        assert len(shed[0].samples) == len(normal[0].samples) == first
        assert len(shed) < len(normal)
        a = np.concatenate([c.samples for c in normal])
        b = np.concatenate([c.samples for c in shed])
        assert a.shape == b.shape and snr_db(a, b) >= 60.0
        with pytest.raises(TtsInputError, match="window_frames"):
            engine.stream(text, SpeakOptions(window_frames=cfg.first_window_frames - 1))
    finally:
        engine.close()


def test_a_first_unit_cut_after_a_few_words_keeps_the_rest_of_the_sentence(
    streamer: VitsStreamer,
) -> None:
    """``first_unit_words``: the first three words are a unit of their own (their front end
    reads two more), and the rest of the sentence is the whole sentence's own audio from the
    cut on; the join sits nearer the whole sentence's word boundary than a plain cut's."""
    engine = VitsStreamer.load(TtsConfig(cache_bytes=0, first_unit_words=3))
    try:
        text = "Is there anything else I can help you with?"
        chunks = list(engine.stream(text, QUIET))
        cut = engine.synthesize_oneshot(text, QUIET)
        audio = np.concatenate([c.samples for c in chunks])
        assert audio.shape == cut.samples.shape and snr_db(cut.samples, audio) >= 60.0
        assert [w.text for c in chunks for w in c.words] == written_words(text)
        assert [(w.text, w.start_ms, w.end_ms) for c in chunks for w in c.words] == [
            (w.text, w.start_ms, w.end_ms) for w in cut.words
        ]
        assert {c.sentence_index for c in chunks} == {0, 1}
        join = sum(len(c.samples) for c in chunks if c.sentence_index == 0)
        assert join < len(audio) // 2  # a short first unit: its front end is cheap
        whole = streamer.synthesize_oneshot(text, QUIET)
        rate = whole.sample_rate_hz
        at = round(whole.words[3].start_ms * rate / 1000)  # where "else" starts, uncut
        assert len(audio) - join == len(whole.samples) - at
        assert snr_db(whole.samples[at:], audio[join:]) >= 60.0
        plain = streamer.synthesize_oneshot("Is there anything", QUIET)
        assert abs(join - at) < abs(len(plain.samples) - at)
    finally:
        engine.close()


def test_chunks_are_contiguous_and_first_window_is_small(streamer: VitsStreamer) -> None:
    text = " ".join(SENTENCES)
    chunks = list(streamer.stream(text, QUIET))
    hop, config = streamer.hop_length, streamer.config
    offset = 0
    for chunk in chunks:
        assert chunk.offset_samples == offset and chunk.sample_rate_hz == 22050
        assert chunk.samples.dtype == np.float32 and chunk.samples.ndim == 1
        offset += len(chunk.samples)
    assert [c.is_last for c in chunks] == [False] * (len(chunks) - 1) + [True]
    indexes = [c.sentence_index for c in chunks]
    assert indexes == sorted(indexes) and indexes[-1] >= 2
    for index in set(indexes):
        sizes = [len(c.samples) for c in chunks if c.sentence_index == index]
        assert sizes[0] == config.first_window_frames * hop
        assert max(sizes) > sizes[0]
        assert all(
            size <= (config.window_frames + config.first_window_frames) * hop for size in sizes
        )


def test_word_spans_are_monotonic_cover_audio_and_match_input(streamer: VitsStreamer) -> None:
    text = " ".join(SENTENCES)
    chunks = list(streamer.stream(text, QUIET))
    total_ms = chunks[-1].end_ms
    words = [w for c in chunks for w in c.words]
    assert [w.text for w in words] == written_words(text)
    for chunk in chunks:
        start_ms = 1000 * chunk.offset_samples / chunk.sample_rate_hz
        for w in chunk.words:
            assert start_ms < w.end_ms <= chunk.end_ms  # each word is reported where it ends
    for prev, cur in zip(words, words[1:], strict=False):
        assert prev.start_ms < prev.end_ms <= cur.start_ms + 1e-6
    assert 0 <= words[0].start_ms < 300  # only leading silence before the first word
    assert total_ms - 600 < words[-1].end_ms <= total_ms  # and trailing silence after the last
    # Long written tokens take longer to say than short ones.
    spans = {w.text: w.end_ms - w.start_ms for w in words}
    assert spans["$45"] > spans["at"] and spans["appointment"] > spans["is"]


def test_cache_hit_replays_identical_audio(streamer: VitsStreamer) -> None:
    text = "Thanks for waiting, this sentence is cached."
    noisy = SpeakOptions(noise_scale=0.667, noise_w=0.8)
    hits = streamer.cache.hits
    first = list(streamer.stream(text, noisy))
    second = list(streamer.stream(text, noisy))
    assert streamer.cache.hits > hits
    # With noise on, a fresh synthesis would differ; identical audio proves the replay.
    assert all(np.array_equal(a.samples, b.samples) for a, b in zip(first, second, strict=True))
    assert [c.words for c in first] == [c.words for c in second]
    assert not first[0].samples.flags.writeable  # cached audio cannot be altered by a caller
    # Different options are a different key.
    third = np.concatenate([c.samples for c in streamer.stream(text, QUIET)])
    assert not np.array_equal(third, np.concatenate([c.samples for c in first]))


def test_cache_replay_rebases_offsets_inside_a_longer_reply(streamer: VitsStreamer) -> None:
    cached = "Thank you."
    alone = list(streamer.stream(cached, QUIET))
    reply = list(streamer.stream("Hello there. " + cached, QUIET))
    tail = [c for c in reply if c.sentence_index == 1]
    assert [c.samples.tobytes() for c in tail] == [c.samples.tobytes() for c in alone]
    shift = tail[0].offset_samples
    assert shift > 0 and tail[-1].is_last
    rate = tail[0].sample_rate_hz
    assert [w.end_ms for c in tail for w in c.words] == pytest.approx(
        [w.end_ms + 1000 * shift / rate for c in alone for w in c.words]
    )


def test_phrase_cache_stays_within_its_byte_bound() -> None:
    engine = VitsStreamer.load(TtsConfig(cache_bytes=200_000))
    for i in range(4):
        list(engine.stream(f"Sentence number {i + 1} is here.", QUIET))
        assert engine.cache.nbytes <= 200_000
    assert 0 < len(engine.cache) < 4
    engine.close()


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (SpeakOptions(length_scale=0.1), "length_scale"),
        (SpeakOptions(length_scale=5.0), "length_scale"),
        (SpeakOptions(length_scale=float("nan")), "length_scale"),
        (SpeakOptions(noise_scale=-0.1), "noise_scale"),
        (SpeakOptions(noise_w=3.0), "noise_w"),
        (SpeakOptions(speaker_id=1), "speaker_id"),
        (SpeakOptions(voice="no-such-voice"), "voice"),
    ],
)
def test_invalid_options_raise_at_call_time(
    streamer: VitsStreamer, options: SpeakOptions, field: str
) -> None:
    with pytest.raises(TtsInputError) as info:
        streamer.stream("Hello.", options)  # raises before any iteration
    assert info.value.field == field


def test_rate_changes_duration(streamer: VitsStreamer) -> None:
    def duration(scale: float) -> int:
        options = SpeakOptions(length_scale=scale, noise_scale=0.0, noise_w=0.0)
        return sum(len(c.samples) for c in streamer.stream("Speak slowly please.", options))

    assert duration(1.5) > 1.3 * duration(1.0)
    name = streamer.voices()[0].name
    assert sum(len(c.samples) for c in streamer.stream("Hi.", SpeakOptions(voice=name))) > 0


@pytest.mark.parametrize("text", ["", "   ", "<break/>", "..."])
def test_empty_text_is_refused(streamer: VitsStreamer, text: str) -> None:
    with pytest.raises(TtsInputError) as info:
        streamer.stream(text, QUIET)
    assert info.value.field == "text"


def test_100_kb_text_is_refused_with_the_limit(streamer: VitsStreamer) -> None:
    text = "All work and no play. " * 5000  # 110 kB
    with pytest.raises(TtsInputError) as info:
        streamer.stream(text, QUIET)
    assert info.value.field == "text"
    assert str(streamer.config.max_chars) in str(info.value)


def test_text_at_the_limit_streams_lazily(streamer: VitsStreamer) -> None:
    limit = streamer.config.max_chars
    text = ("All work and no play. " * 1000)[:limit]
    chunks = streamer.stream(text, QUIET)
    first = next(chunks)  # only the first unit's first window is synthesised
    assert isinstance(first, TtsChunk) and not first.is_last
    assert len(first.samples) == streamer.config.first_window_frames * streamer.hop_length


def test_markup_is_stripped_and_its_text_spoken(streamer: VitsStreamer) -> None:
    text = '<speak>Hello <emphasis level="strong">world</emphasis><break time="2s"/>!</speak>'
    chunks = list(streamer.stream(text, QUIET))
    assert [w.text for c in chunks for w in c.words] == ["Hello", "world"]
    plain = np.concatenate([c.samples for c in streamer.stream("Hello world!", QUIET)])
    assert np.array_equal(np.concatenate([c.samples for c in chunks]), plain)


def test_limiter_keeps_loud_output_inside_full_scale() -> None:
    loud = VitsStreamer.load(TtsConfig(gain_db=24.0, cache_bytes=0))
    chunks = list(loud.stream(SENTENCES[0], QUIET))
    audio = np.concatenate([c.samples for c in chunks])
    assert np.max(np.abs(audio)) < 1.0
    assert np.mean(np.abs(audio) > loud.config.limiter_threshold) > 0.001  # the knee was hit
    loud.close()
    with pytest.raises(TtsError, match="closed"):
        loud.stream("Hello.", QUIET)


def test_voice_info_describes_the_bundled_voice(streamer: VitsStreamer) -> None:
    (info,) = streamer.voices()
    assert re.fullmatch(r"en_US-joe-medium", info.name)
    assert (info.language, info.sample_rate_hz, info.num_speakers) == ("en_US", 22050, 1)
    assert streamer.sample_rate_hz == 22050 and streamer.hop_length == 256
