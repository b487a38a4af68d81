"""Our Whisper decode loop on the real bundled model: equality with generate, joins, per-item
control, and the engine's routing of boosted calls (Piper-spoken product name).

The full 40-clip equality (greedy and beam 5, float32 and int8) is in benchmarks/decode_loop.py;
here a subset keeps the suite fast.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soxr

from tests.conftest import read_wav_int16
from voxgate.engines.asr._ct2_weights import load_decoder_weights
from voxgate.engines.asr._decode import DecodeItem, DecodeLoop, WhisperDecoder
from voxgate.engines.asr._model_files import resolve_model_dir
from voxgate.engines.asr._processors import SuppressBlank, SuppressTokens
from voxgate.engines.asr._whisper import WhisperEngine
from voxgate.engines.asr.base import AsrOptions, AsrRequest
from voxgate.gateway.testing.signals import stats_for

pytestmark = pytest.mark.model

CLIPS = ("jfk_inaugural_1961.wav", "ljspeech_LJ001-0004.wav")


class Setup:
    def __init__(self) -> None:
        self.engine = WhisperEngine.load({"compute_type": "float32", "intra_threads": 1})
        self.engine._calibrate_max_length()
        model_dir = resolve_model_dir("base", None)
        self.cfg: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
        self.decoder = WhisperDecoder(load_decoder_weights(model_dir, "none"))
        self.tok = self.engine._tokenizer("en", "transcribe")
        self.prompt = [*self.tok.sot_sequence, self.tok.no_timestamps]
        self.suppress = self.engine._suppress_tokens(self.tok)

    def loop(self) -> DecodeLoop:
        t = self.tok
        return DecodeLoop(
            self.decoder, sot=t.sot, eot=t.eot, no_timestamps=t.no_timestamps, no_speech=t.no_speech
        )

    def encode(self, audio: np.ndarray) -> Any:
        return self.engine._model.encode(self.engine._storage([self.engine._feature(audio, 3000)]))

    def item(self, memory: np.ndarray, beam: int = 1, extra: tuple[int, ...] = ()) -> DecodeItem:
        ids: list[int] = list(extra)
        for t in self.suppress:
            ids.extend(self.cfg["suppress_ids"] if t == -1 else [t])
        procs = [SuppressTokens.of(ids), SuppressBlank(tuple(self.cfg["suppress_ids_begin"]))]
        return DecodeItem(memory, self.prompt, max_length=224, beam_size=beam, processors=procs)


@pytest.fixture(scope="module")
def setup() -> Iterator[Setup]:
    s = Setup()
    yield s
    s.engine.close()


@pytest.fixture(scope="module")
def encoded(setup: Setup, speech_dir: Path) -> list[tuple[Any, np.ndarray]]:
    out = []
    for name in CLIPS:
        pcm, _ = read_wav_int16(speech_dir / name)
        enc = setup.encode(pcm.astype(np.float32) / 32768.0)
        out.append((enc, np.array(enc)[0]))
    return out


@pytest.mark.parametrize("beam", [1, 5])
def test_tokens_equal_generate(
    setup: Setup, encoded: list[tuple[Any, np.ndarray]], beam: int
) -> None:
    """No processor beyond Whisper's own: the loop returns generate's tokens and no-speech."""
    max_len = setup.engine.max_length(len(setup.prompt), 224)
    for enc, memory in encoded:
        ref = setup.engine._model.generate(
            enc,
            [setup.prompt],
            beam_size=beam,
            max_length=max_len,
            suppress_blank=True,
            suppress_tokens=setup.suppress,
            return_scores=True,
            return_no_speech_prob=True,
        )[0]
        got = setup.loop().run([setup.item(memory, beam)])[0]
        assert got.sequences_ids[0] == ref.sequences_ids[0]
        assert got.scores[0] == pytest.approx(ref.scores[0], abs=2e-3)
        assert got.no_speech_prob == pytest.approx(ref.no_speech_prob, abs=1e-3)


def test_item_joins_a_running_batch_and_leaves_when_done(
    setup: Setup, encoded: list[tuple[Any, np.ndarray]]
) -> None:
    (_, a), (_, b) = encoded
    alone = [setup.loop().run([setup.item(m)])[0].sequences_ids[0] for m in (a, b)]
    loop = setup.loop()
    first, second = setup.item(a), setup.item(b)
    loop.add(first)
    for _ in range(6):
        loop.step()
    loop.add(second)  # joins at step 7 of the first item
    assert loop.active == 2
    left_at: dict[int, int] = {}
    while loop.active:
        for it in loop.step():
            left_at[id(it)] = loop.steps
        assert loop.active + len(left_at) == 2
    assert first.result is not None and second.result is not None
    assert first.result.sequences_ids[0] == alone[0]
    assert second.result.sequences_ids[0] == alone[1]
    # Each left on the step that produced its <|endoftext|>, not when the batch ended.
    assert left_at[id(first)] == len(alone[0]) + 1
    assert left_at[id(second)] == 6 + len(alone[1]) + 1


def test_per_item_suppress_lists_inside_one_batch(
    setup: Setup, encoded: list[tuple[Any, np.ndarray]]
) -> None:
    _, memory = encoded[0]
    plain = setup.loop().run([setup.item(memory)])[0].sequences_ids[0]
    banned = plain[0]  # " And" of "And so my fellow Americans"
    out = setup.loop().run([setup.item(memory), setup.item(memory, extra=(banned,))])
    assert out[0].sequences_ids[0] == plain
    assert banned not in out[1].sequences_ids[0]


def test_loop_refuses_a_forced_prefix(setup: Setup, encoded: list[tuple[Any, np.ndarray]]) -> None:
    _, memory = encoded[0]
    item = DecodeItem(memory, [*setup.prompt, 400], max_length=8)
    with pytest.raises(ValueError, match="prefix"):
        setup.loop().add(item)


@pytest.fixture(scope="module")
def greeting() -> np.ndarray:
    """A sentence with the product name, spoken by the bundled Piper voice (deterministic)."""
    from voxgate.engines.tts import SpeakOptions, TtsConfig, VitsStreamer

    tts = VitsStreamer.load(TtsConfig())
    chunk = tts.synthesize_oneshot(
        "Please call voxgate support after six.", SpeakOptions(noise_scale=0.0, noise_w=0.0)
    )
    audio = soxr.resample(chunk.samples, chunk.sample_rate_hz, 16000).astype(np.float32)
    pad = np.zeros(8000, np.float32)
    return np.concatenate([pad, audio, pad])


def test_engine_boosts_a_product_name_through_the_loop(greeting: np.ndarray) -> None:
    engine = WhisperEngine.load({"intra_threads": 1})
    try:
        stats = stats_for(greeting)
        plain = engine.infer_batch([AsrRequest(greeting, stats, AsrOptions())])[0]
        assert engine.counters.loop_items == 0, "no processor: generate's fast path"
        assert "voxgate" not in plain.text.lower()
        boosted = engine.infer_batch(
            [AsrRequest(greeting, stats, AsrOptions(hotwords=("voxgate^6",)))]
        )[0]
        assert engine.counters.loop_items >= 1
        assert "voxgate" in boosted.text.lower()
        assert boosted.words, "word timestamps still come from align"
        # A boost the audio does not support is not forced into the transcript.
        unrelated = engine.infer_batch(
            [AsrRequest(greeting, stats, AsrOptions(hotwords=("Nwachukwu^6",)))]
        )[0]
        assert "nwachukwu" not in unrelated.text.lower()
        assert "support after" in unrelated.text.lower()
    finally:
        engine.close()


def test_engine_silence_end_and_hallucination_bias_keep_the_words(speech_dir: Path) -> None:
    """Timestamp mode through the engine: the clip's words, nothing invented in the tail."""
    from benchmarks._wer import wer

    pcm, _ = read_wav_int16(speech_dir / CLIPS[0])
    rng = np.random.default_rng(3)
    tail = (rng.standard_normal(3 * 16000) * 10 ** (-65 / 20)).astype(np.float32)
    audio = np.concatenate([pcm.astype(np.float32) / 32768.0, tail])
    engine = WhisperEngine.load(
        {"intra_threads": 1, "decode_loop": {"silence_end": True, "hallucination_bias": 4.0}}
    )
    try:
        res = engine.infer_batch([AsrRequest(audio, stats_for(audio), AsrOptions())])[0]
        assert engine.counters.loop_items >= 1
        ref = (
            "And so my fellow Americans, ask not what your country can do for you, "
            "ask what you can do for your country."
        )
        assert wer(ref, res.text) <= 0.05, res.text
        assert "<|" not in res.text, "timestamp tokens never reach the text"
        assert res.words and res.words[-1].end_ms <= 11_500
    finally:
        engine.close()
