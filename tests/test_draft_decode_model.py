"""Drafted finals on the real bundled model (engines/asr/_draft.py, issue 38).

A final that comes with its interim's words as the draft decodes to the same text and word
times as without one, and the draft saved it steps: most of its tokens were taken from the
draft, in fewer decoder passes than tokens. Beams, and the switch turned off, decode as
before. The tokenizer's missing first merge, which a draft would otherwise trip on, is shown
on the bundled file itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import read_wav_int16
from voxgate.engines.asr._decode import DecodeItem, DecodeLoop
from voxgate.engines.asr._draft import draft_greedy, with_first_merge
from voxgate.engines.asr._whisper import WhisperEngine
from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult
from voxgate.engines.asr.config import WhisperConfig
from voxgate.gateway.testing.signals import stats_for

pytestmark = pytest.mark.model

#: Short read sentences on the 10 s window (3.3 s and 5.7 s).
CLIPS = ("librispeech_1988-24833-0000.wav", "ljspeech_LJ001-0006.wav")


@pytest.fixture(scope="module")
def engine() -> Iterator[WhisperEngine]:
    eng = WhisperEngine.load(WhisperConfig())
    eng.warmup()
    yield eng
    eng.close()


def audio_of(speech_dir: Path, name: str) -> np.ndarray:
    pcm, rate = read_wav_int16(speech_dir / name)
    assert rate == 16000
    return pcm.astype(np.float32) / 32768.0


def final(engine: WhisperEngine, audio: np.ndarray, draft: str = "", **opts: object) -> AsrResult:
    options = AsrOptions(language="en", **opts)  # type: ignore[arg-type]
    req = AsrRequest(audio, stats_for(audio), options, is_final=True, draft=draft)
    return engine.infer_batch([req])[0]


def interim(engine: WhisperEngine, audio: np.ndarray) -> str:
    """What an interim 0.8 s before the end said (the draft a final gets)."""
    part = audio[: len(audio) - 12800]
    req = AsrRequest(part, stats_for(part), AsrOptions(language="en"), is_final=False)
    return engine.infer_batch([req])[0].text


@pytest.mark.parametrize("name", CLIPS)
def test_a_final_with_its_interim_as_draft_says_the_same_in_fewer_passes(
    engine: WhisperEngine, speech_dir: Path, name: str
) -> None:
    audio = audio_of(speech_dir, name)
    draft = interim(engine, audio)
    assert draft
    engine.counters.reset()
    plain = final(engine, audio)
    assert engine.counters.draft_items == 0  # no draft: generate, as before
    drafted = final(engine, audio, draft)
    c = engine.counters
    assert c.draft_items == 1
    assert drafted.text == plain.text
    assert [w.text for w in drafted.words] == [w.text for w in plain.words]
    assert [w.start_ms for w in drafted.words] == [w.start_ms for w in plain.words]
    # The draft saved steps: most tokens came from it, in fewer passes than tokens.
    assert c.draft_accepted * 2 >= c.draft_tokens
    assert c.draft_passes < c.draft_tokens


def test_beams_and_the_switch_off_decode_as_before(
    engine: WhisperEngine, speech_dir: Path
) -> None:
    audio = audio_of(speech_dir, CLIPS[0])
    draft = interim(engine, audio)
    engine.counters.reset()
    final(engine, audio, draft, beam_size=2)
    assert engine.counters.draft_items == 0
    off = WhisperEngine.load(WhisperConfig.model_validate({"decode_loop": {"draft_finals": False}}))
    try:
        off.warmup()
        plain = final(off, audio, draft)
        assert off.counters.draft_items == 0
        assert plain.text == final(engine, audio).text
    finally:
        off.close()


def test_the_decode_s_own_tokens_as_the_draft_are_its_result_in_one_pass(
    engine: WhisperEngine, speech_dir: Path
) -> None:
    """On the real decoder: the loop's greedy tokens, given back as the draft, are taken
    whole in the one pass that also runs the prompt, with the loop's no-speech probability."""
    audio = audio_of(speech_dir, CLIPS[1])
    feats = engine._storage([engine._feature(audio, 1000)])
    memory = np.array(engine._model.encode(feats))[0]
    tok = engine._tokenizer("en", "transcribe")
    prompt = [*tok.sot_sequence, tok.no_timestamps]
    decoder = engine._loop_shared.decoder()
    loop = DecodeLoop(
        decoder, sot=tok.sot, eot=tok.eot, no_timestamps=tok.no_timestamps, no_speech=tok.no_speech
    )
    ref = loop.run([DecodeItem(memory, prompt, max_length=100)])[0]
    out = draft_greedy(
        decoder,
        memory,
        prompt,
        ref.sequences_ids[0],
        sot=tok.sot,
        eot=tok.eot,
        no_speech=tok.no_speech,
        max_length=100,
    )
    assert out.result.sequences_ids == ref.sequences_ids
    assert out.passes == 1
    assert out.accepted == len(ref.sequences_ids[0])
    assert out.result.no_speech_prob == pytest.approx(ref.no_speech_prob, abs=1e-4)


def test_the_bundled_tokenizer_lacks_the_first_merge_and_drafts_put_it_back(
    engine: WhisperEngine,
) -> None:
    """Whisper decodes " the" as one token (264, "Ġthe"); the bundled tokenizer.json cannot
    form it (its merges lost "Ġ t"), so a draft is encoded with the merge restored."""
    bundled = engine._hf_tokenizer
    restored = with_first_merge(bundled)
    text = " the cat sat on the mat to think"
    assert bundled.encode(" the", add_special_tokens=False).ids == [220, 3322]
    assert restored.encode(" the", add_special_tokens=False).ids == [264]
    ids = restored.encode(text, add_special_tokens=False).ids
    assert len(ids) < len(bundled.encode(text, add_special_tokens=False).ids)
    assert restored.decode(ids) == text
    assert engine._draft_tokens("the cat") == ids[:2]
