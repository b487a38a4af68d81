"""voxgate.adapt.data: every bad input is refused before training, naming its file or line;
augmentation.

The recordings here are generated tones (the reader only cares about the WAV container and the
transcript rules); ``synthesize_phrases`` runs the real bundled Piper voice.
"""

from __future__ import annotations

import json
import re
import wave
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import pytest

from voxgate.adapt.data import (
    GENERAL_SENTENCES,
    MAX_CLIP_S,
    SAMPLE_RATE_HZ,
    AdaptDataError,
    Pair,
    general_sentences,
    load_pairs,
    load_recordings,
    phone_line,
    read_audio,
    read_phrases,
    split,
    synthesize_phrases,
)

pytestmark = pytest.mark.unit


def tone(seconds: float, rate: int = SAMPLE_RATE_HZ, hz: float = 440.0) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def write_wav(
    path: Path, x: np.ndarray, rate: int = SAMPLE_RATE_HZ, width: int = 2, channels: int = 1
) -> Path:
    if channels > 1:
        x = np.repeat(x[:, None], channels, axis=1).reshape(-1)
    if width == 1:
        raw = (np.clip(x, -1, 1) * 127 + 128).astype(np.uint8).tobytes()
    elif width == 2:
        raw = (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()
    elif width == 3:
        v = (np.clip(x, -1, 1) * 8_388_607).astype("<i4")
        raw = v.view(np.uint8).reshape(-1, 4)[:, :3].tobytes()
    else:
        raw = (np.clip(x, -1, 1) * 2_147_483_000).astype("<i4").tobytes()
    with wave.open(str(path), "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(width)
        w.setframerate(rate)
        w.writeframes(raw)
    return path


def pair_folder(tmp_path: Path, n: int = 2) -> Path:
    for i in range(n):
        write_wav(tmp_path / f"clip{i}.wav", tone(1.0 + i))
        (tmp_path / f"clip{i}.txt").write_text(f"  refill my\nprescription number {i} \n")
    return tmp_path


# -- reading ------------------------------------------------------------------------------------


def test_folder_pairs_are_read_in_order_with_text_collapsed(tmp_path: Path) -> None:
    pairs = load_pairs(pair_folder(tmp_path, 3))
    assert [p.origin for p in pairs] == ["clip0.wav", "clip1.wav", "clip2.wav"]
    assert pairs[1].text == "refill my prescription number 1"
    assert pairs[2].audio.dtype == np.float32 and len(pairs[2].audio) == 3 * SAMPLE_RATE_HZ


@pytest.mark.parametrize(
    ("rate", "width", "channels"),
    [(8000, 2, 1), (44100, 2, 2), (16000, 1, 1), (22050, 3, 1), (48000, 4, 2)],
)
def test_pcm_widths_rates_and_channels_become_16k_mono(
    tmp_path: Path, rate: int, width: int, channels: int
) -> None:
    x = tone(1.5, rate)
    audio = read_audio(write_wav(tmp_path / "a.wav", x, rate, width, channels))
    assert audio.ndim == 1 and abs(len(audio) - 1.5 * SAMPLE_RATE_HZ) <= 2
    # the tone survives at its level: the conversion did not scale or offset the samples
    assert 0.27 < float(np.max(np.abs(audio[1000:-1000]))) < 0.33
    assert abs(float(np.mean(audio))) < 0.01


def test_a_text_file_named_wav_is_refused_with_the_fix(tmp_path: Path) -> None:
    bad = tmp_path / "fake.wav"
    bad.write_text("this is not audio")
    (tmp_path / "fake.txt").write_text("hello there")
    with pytest.raises(AdaptDataError, match=r"fake\.wav: not a readable PCM WAV.*16-bit PCM"):
        load_pairs(tmp_path)


def test_compressed_audio_in_a_folder_is_refused_not_skipped(tmp_path: Path) -> None:
    pair_folder(tmp_path)
    (tmp_path / "extra.mp3").write_bytes(b"ID3")
    with pytest.raises(AdaptDataError, match=r"extra\.mp3: only WAV audio is read"):
        load_pairs(tmp_path)


def test_audio_without_a_transcript_names_the_wav(tmp_path: Path) -> None:
    pair_folder(tmp_path)
    write_wav(tmp_path / "orphan.wav", tone(1.0))
    with pytest.raises(AdaptDataError, match=r"orphan\.wav: audio without a transcript"):
        load_pairs(tmp_path)


def test_a_transcript_without_audio_names_the_txt(tmp_path: Path) -> None:
    pair_folder(tmp_path)
    (tmp_path / "lonely.txt").write_text("words")
    with pytest.raises(AdaptDataError, match=r"lonely\.txt: a transcript without audio"):
        load_pairs(tmp_path)


def test_hidden_entries_are_ignored(tmp_path: Path) -> None:
    pair_folder(tmp_path)
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "x.txt").write_text("stray")
    assert len(load_pairs(tmp_path)) == 2


def test_an_empty_transcript_names_its_file(tmp_path: Path) -> None:
    pair_folder(tmp_path)
    (tmp_path / "clip1.txt").write_text("  \n ... \n")
    with pytest.raises(AdaptDataError, match=r"clip1\.txt: the transcript is empty"):
        load_pairs(tmp_path)


def test_a_transcript_too_long_for_its_clip_is_a_mismatch(tmp_path: Path) -> None:
    pair_folder(tmp_path)
    (tmp_path / "clip0.txt").write_text("word " * 40)  # 40 words in 1 s
    with pytest.raises(AdaptDataError, match=r"clip0\.txt: .*40 words for 1\.0 s"):
        load_pairs(tmp_path)


def test_a_clip_longer_than_the_window_is_refused(tmp_path: Path) -> None:
    write_wav(tmp_path / "long.wav", tone(MAX_CLIP_S + 1.0))
    (tmp_path / "long.txt").write_text("a long call")
    with pytest.raises(AdaptDataError, match=r"long\.wav: 31\.0 s is longer than .* 30 s window"):
        load_pairs(tmp_path)


def test_silent_and_too_short_clips_are_refused(tmp_path: Path) -> None:
    silent = write_wav(tmp_path / "silent.wav", np.zeros(SAMPLE_RATE_HZ, np.float32))
    with pytest.raises(AdaptDataError, match=r"silent\.wav: the audio is silent"):
        read_audio(silent)
    short = write_wav(tmp_path / "short.wav", tone(0.05))
    with pytest.raises(AdaptDataError, match=r"short\.wav: 50 ms of audio is too short"):
        read_audio(short)
    low = write_wav(tmp_path / "low.wav", tone(1.0, 4000), 4000)
    with pytest.raises(AdaptDataError, match=r"low\.wav: sample rate 4000 Hz is below 8000"):
        read_audio(low)


def test_jsonl_manifest_resolves_paths_next_to_it(tmp_path: Path) -> None:
    (tmp_path / "audio").mkdir()
    write_wav(tmp_path / "audio" / "a.wav", tone(1.0))
    rows = [{"audio": "audio/a.wav", "text": "is Eliquis covered"}, {}]
    (tmp_path / "m.jsonl").write_text(json.dumps(rows[0]) + "\n\n")
    pairs = load_pairs(tmp_path / "m.jsonl")
    assert [(p.origin, p.text) for p in pairs] == [("m.jsonl:1", "is Eliquis covered")]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"audio": "a.wav", "text": "ok"}', '{"audio": "a.wav", "text": '],
         r"m\.jsonl:2: not valid JSON"),
        (['{"audio": "a.wav"}'], r"m\.jsonl:1: missing field 'text'"),
        (['{"text": "hi"}'], r"m\.jsonl:1: missing field 'audio'"),
        (['["a.wav", "hi"]'], r"m\.jsonl:1: expected an object"),
        (['{"audio": "gone.wav", "text": "hi"}'], r"m\.jsonl:1: gone\.wav: audio file not found"),
        (['{"audio": "a.wav", "text": 7}'], r"m\.jsonl:1: the transcript must be a string"),
        (['{"audio": "a.wav", "text": ""}'], r"m\.jsonl:1: the transcript is empty"),
    ],
)  # fmt: skip
def test_jsonl_errors_name_the_line(tmp_path: Path, lines: list[str], message: str) -> None:
    write_wav(tmp_path / "a.wav", tone(1.0))
    (tmp_path / "m.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(AdaptDataError, match=message):
        load_pairs(tmp_path / "m.jsonl")


def test_csv_manifest_and_its_errors(tmp_path: Path) -> None:
    write_wav(tmp_path / "a.wav", tone(1.0))
    (tmp_path / "m.csv").write_text('audio,text\na.wav,"refill, please"\n')
    assert [p.text for p in load_pairs(tmp_path / "m.csv")] == ["refill, please"]
    (tmp_path / "m.csv").write_text("path,words\na.wav,hi\n")
    with pytest.raises(AdaptDataError, match=r"m\.csv:1: the header must name an 'audio'"):
        load_pairs(tmp_path / "m.csv")
    (tmp_path / "m.csv").write_text("audio,text\na.wav,hi\na.wav\n")
    with pytest.raises(AdaptDataError, match=r"m\.csv:3: expected 2 columns"):
        load_pairs(tmp_path / "m.csv")


def test_unknown_sources_and_empty_sources(tmp_path: Path) -> None:
    with pytest.raises(AdaptDataError, match="no such file or folder"):
        load_pairs(tmp_path / "nope")
    (tmp_path / "data.tsv").write_text("x")
    with pytest.raises(AdaptDataError, match=r"expected a folder .* or a \.jsonl or \.csv"):
        load_pairs(tmp_path / "data.tsv")
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdaptDataError, match="holds no"):
        load_pairs(tmp_path / "empty")


def test_recordings_need_no_transcript_and_get_the_same_checks(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    (calls / "day2").mkdir(parents=True)
    write_wav(calls / "b.wav", tone(1.0, rate=8000), rate=8000)
    write_wav(calls / "day2" / "a.wav", tone(2.0))
    (calls / "b.txt").write_text("a transcript beside it is not read")
    (calls / ".hidden.wav").write_text("not audio")
    got = load_recordings(calls)
    assert [(origin, len(audio)) for audio, origin in got] == [
        ("b.wav", SAMPLE_RATE_HZ),  # 8 kHz read as 16 kHz
        ("day2/a.wav", 2 * SAMPLE_RATE_HZ),
    ]
    (tmp_path / "m.jsonl").write_text('{"audio": "calls/b.wav"}\n\n{"file": "calls/day2/a.wav"}\n')
    assert [o for _, o in load_recordings(tmp_path / "m.jsonl")] == ["m.jsonl:1", "m.jsonl:3"]
    (tmp_path / "m.csv").write_text("audio\ncalls/b.wav\n")
    assert [o for _, o in load_recordings(tmp_path / "m.csv")] == ["m.csv:2"]
    (tmp_path / "m.csv").write_text("text\nhello\n")
    with pytest.raises(AdaptDataError, match=r"m\.csv:1: the header must name an 'audio' column"):
        load_recordings(tmp_path / "m.csv")
    write_wav(calls / "long.wav", tone(MAX_CLIP_S + 1))
    with pytest.raises(AdaptDataError, match=r"long\.wav: .* longer than Whisper's 30 s window"):
        load_recordings(calls)
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdaptDataError, match="holds no .wav recordings"):
        load_recordings(tmp_path / "empty")
    with pytest.raises(AdaptDataError, match="no such file or folder"):
        load_recordings(tmp_path / "nope")


def test_errors_never_quote_the_transcript(tmp_path: Path) -> None:
    write_wav(tmp_path / "a.wav", tone(0.5))
    secret = "my card number is four four four four " * 3
    (tmp_path / "a.txt").write_text(secret)
    with pytest.raises(AdaptDataError) as err:
        load_pairs(tmp_path)
    assert "card" not in str(err.value)


def test_read_phrases_skips_comments_and_names_bad_lines(tmp_path: Path) -> None:
    f = tmp_path / "p.txt"
    f.write_text("# header\n\n  Is   Ozempic covered?  \n#5 is a comment\nRefill Xarelto\n")
    assert read_phrases(f) == ["Is Ozempic covered?", "Refill Xarelto"]
    f.write_text("ok phrase\n" + "x" * 401 + "\n")
    with pytest.raises(AdaptDataError, match=r"p\.txt:2: 401 characters"):
        read_phrases(f)
    f.write_text("ok\n1234 !!\n")
    with pytest.raises(AdaptDataError, match=r"p\.txt:2: the phrase has no words"):
        read_phrases(f)
    f.write_text("# only comments\n")
    with pytest.raises(AdaptDataError, match="holds no phrases"):
        read_phrases(f)
    f.write_bytes(b"caf\xe9\n")
    with pytest.raises(AdaptDataError, match="not UTF-8"):
        read_phrases(f)


# -- split --------------------------------------------------------------------------------------


def fake_pairs(groups: int, variants: int) -> list[Pair]:
    a = np.zeros(SAMPLE_RATE_HZ, np.float32)
    return [Pair(a, f"p{g}", f"phrase:{g}#v{v}") for g in range(groups) for v in range(variants)]


def test_split_keeps_variants_together_and_is_seeded() -> None:
    pairs = fake_pairs(10, 3)
    train, held = split(pairs, held_out=0.2, seed=7)
    assert len(held) == 6 and len(train) == 24
    assert {p.group for p in train}.isdisjoint({p.group for p in held})
    assert split(pairs, held_out=0.2, seed=7) == (train, held)
    assert split(pairs, held_out=0.2, seed=8) != (train, held)
    assert split(pairs, held_out=0.0, seed=7) == (pairs, [])


def test_split_refuses_too_little_data_and_bad_fractions() -> None:
    with pytest.raises(AdaptDataError, match=r"3 pairs \(3 distinct .*too few"):
        split(fake_pairs(3, 1), held_out=0.2, seed=0)
    with pytest.raises(AdaptDataError, match="too few"):
        split(fake_pairs(1, 5), held_out=0.5, seed=0)  # one phrase cannot be on both sides
    with pytest.raises(AdaptDataError, match=r"held-out fraction 0\.9 must be within 0\.\.0\.5"):
        split(fake_pairs(10, 1), held_out=0.9, seed=0)


# -- augmentation -------------------------------------------------------------------------------


def band_energy(x: np.ndarray, lo: float, hi: float) -> float:
    spec = np.abs(np.fft.rfft(x)) ** 2
    f = np.fft.rfftfreq(len(x), 1 / SAMPLE_RATE_HZ)
    return float(spec[(f >= lo) & (f < hi)].sum() / spec.sum())


def test_phone_line_is_seeded_band_limited_and_speed_perturbed() -> None:
    x = np.random.default_rng(0).standard_normal(2 * SAMPLE_RATE_HZ).astype(np.float32) * 0.1
    a = phone_line(x, np.random.default_rng(3))
    assert np.array_equal(a, phone_line(x, np.random.default_rng(3)))
    assert not np.array_equal(a, phone_line(x, np.random.default_rng(4)))
    assert a.dtype == np.float32 and float(np.max(np.abs(a))) <= 1.0
    # white noise in, a 300-3400 Hz telephone channel out
    assert band_energy(x, 3700, 8000) > 0.5
    assert band_energy(a, 3700, 8000) < 0.01
    assert band_energy(a, 0, 200) < 0.01
    lengths = {len(phone_line(x, np.random.default_rng(s))) for s in range(12)}
    assert min(lengths) >= len(x) / 1.1 - 2 and max(lengths) <= len(x) / 0.9 + 2
    assert len(lengths) > 6  # the factor really varies


def test_phone_line_sets_the_speech_level_within_its_range() -> None:
    x = tone(1.0)
    y = phone_line(x, np.random.default_rng(1), speed=(1.0, 1.0), snr_db=(60.0, 60.0))
    rms_in = float(np.sqrt(np.mean(x**2)))
    rms_out = float(np.sqrt(np.mean(y**2)))
    assert 10 ** (-32 / 20) / 1.5 < rms_out < 10 ** (-16 / 20) * 1.5
    assert rms_in > rms_out  # levels were drawn under the input's -13.5 dBFS


@pytest.mark.model
def test_synthesize_phrases_speaks_each_variant_with_the_bundled_voice() -> None:
    pairs = synthesize_phrases(["Refill my Xarelto.", "Is Eliquis covered?"], variants=2, seed=5)
    assert [p.origin for p in pairs] == ["phrase:1#v1", "phrase:1#v2", "phrase:2#v1", "phrase:2#v2"]
    assert [p.text for p in pairs[:2]] == ["Refill my Xarelto."] * 2
    for p in pairs:
        assert 0.8 < p.duration_s < 6.0 and float(np.max(np.abs(p.audio))) > 0.01
    assert len(pairs[0].audio) != len(pairs[1].audio)  # each variant drew its own rate and pads
    with pytest.raises(AdaptDataError, match="phrase 1: the voice refuses it"):
        synthesize_phrases(["<b></b>"], variants=1, seed=0)
    with pytest.raises(AdaptDataError, match="variants=0"):
        synthesize_phrases(["x"], variants=0, seed=0)


@pytest.mark.model
def test_one_seed_speaks_bit_identical_audio_whatever_the_process_seed() -> None:
    """The voice's sampling noise follows ``seed``, not the clock-seeded process-wide generator.

    Without the seeding, runs of ``voxgate adapt`` with one seed trained on different audio
    (measured: one setting's general-WER change +1.18 points one day and +0.59 the next).
    Another process starts from another clock seed; setting two different process-wide seeds
    here stands in for that.
    """
    phrase = ["Refill my Xarelto."]
    onnxruntime.set_seed(1)
    first = synthesize_phrases(phrase, variants=1, seed=5, phone_share=0.0)
    onnxruntime.set_seed(2)
    again = synthesize_phrases(phrase, variants=1, seed=5, phone_share=0.0)
    other = synthesize_phrases(phrase, variants=1, seed=6, phone_share=0.0)
    assert np.array_equal(first[0].audio, again[0].audio)
    assert not np.array_equal(first[0].audio, other[0].audio)


def test_the_replay_sentences_are_a_seeded_choice_refused_out_of_range() -> None:
    every = read_phrases(GENERAL_SENTENCES)
    assert len(every) == 157 and len(set(every)) == 157  # no sentence twice
    some = general_sentences(20, seed=3)
    assert some == general_sentences(20, seed=3) and some != general_sentences(20, seed=4)
    assert len(some) == 20 and set(some) <= set(every)
    assert [every.index(s) for s in some] == sorted(every.index(s) for s in some)  # file order
    assert general_sentences(157, seed=0) == every
    for bad in (0, -1, 158):
        with pytest.raises(AdaptDataError, match=f"--replay {bad}: choose 1..157"):
            general_sentences(bad, seed=0)


def _five_grams(text: str) -> set[tuple[str, ...]]:
    w = re.sub(r"[^a-z' ]", " ", text.lower()).split()
    return {tuple(w[i : i + 5]) for i in range(len(w) - 4)}


def test_the_replay_sentences_share_no_words_run_with_any_test_set(
    manifest: list[dict[str, Any]],
) -> None:
    # The replay set must not hand the training a test sentence: no five words in a row of it
    # appear in the 40 clips' references or in the adaptation benchmark's held-out sentences.
    heldout = Path(__file__).parents[1] / "benchmarks" / "data" / "adapt_heldout.txt"
    tests = [row["text"] for row in manifest] + heldout.read_text().splitlines()
    seen = set().union(*map(_five_grams, tests))
    assert len(seen) > 500
    clash = [s for s in read_phrases(GENERAL_SENTENCES) if _five_grams(s) & seen]
    assert clash == []
