"""Utterance-sized encoder windows (``UTTERANCE_ENCODER_WINDOWS``) keep the full-window fallback.

A model trained with audio-context fine-tuning is served on a bucket every second (the clip plus
0.5 s); the base model loops on such short windows more often, and the gateway relies on the
engine re-encoding a degenerate final on the full 30 s window. Here the decode-length cap is set
to one token so every decode is degenerate on purpose (the trigger, not the model, is what is
forced): a final must then be re-encoded once on 3000 frames after its utterance-sized window,
and an interim, which the gateway never re-encodes, must stay on its window.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import read_wav_int16

from voxgate.engines.asr._policy import choose_encoder_frames
from voxgate.engines.asr._whisper import WhisperEngine
from voxgate.engines.asr.base import AsrOptions, AsrRequest
from voxgate.engines.asr.config import (
    FULL_WINDOW_FRAMES,
    UTTERANCE_ENCODER_WINDOWS,
    DecodingPolicyConfig,
    WhisperConfig,
)
from voxgate.gateway.testing.signals import stats_for

pytestmark = pytest.mark.model

CAPPED = UTTERANCE_ENCODER_WINDOWS.model_copy(
    update={"max_tokens_per_s": 0.01, "min_max_new_tokens": 1}
)


@pytest.fixture(scope="module")
def engine() -> Iterator[WhisperEngine]:
    # No latency budget: the whole ladder is what is checked (tests/test_asr_budget*.py cut it).
    policy = DecodingPolicyConfig(decode_budget_s=600.0)
    eng = WhisperEngine.load(
        WhisperConfig(encoder=CAPPED, inter_threads=1, intra_threads=2, policy=policy)
    )
    eng.warmup()
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def clip(speech_dir: Path) -> np.ndarray:
    pcm, rate = read_wav_int16(speech_dir / "jfk_inaugural_1961.wav")
    assert rate == 16000
    return pcm.astype(np.float32) / 32768.0


def utterance_frames(audio: np.ndarray) -> int:
    frames = choose_encoder_frames(math.ceil(len(audio) / 160), UTTERANCE_ENCODER_WINDOWS)
    assert frames < FULL_WINDOW_FRAMES and frames % 100 == 0  # a whole-second bucket
    return frames


def test_a_degenerate_final_is_re_encoded_on_the_full_window(
    engine: WhisperEngine, clip: np.ndarray
) -> None:
    engine.counters.reset()
    (res,) = engine.infer_batch([AsrRequest(clip, stats_for(clip), AsrOptions())])
    assert engine.counters.window_fallbacks == 1
    # The result says so too (the gateway counts it per model: voxgate_asr_fallbacks_total).
    assert res.fallbacks[0] == "window" and res.fallbacks.count("window") == 1
    assert len(res.fallbacks) == 1 + engine.counters.temperature_fallbacks
    # the utterance window first, then the 30 s window (hotter retries reuse the full window)
    first = utterance_frames(clip)
    assert res.encoded_frames >= first + FULL_WINDOW_FRAMES
    assert (res.encoded_frames - first) % FULL_WINDOW_FRAMES == 0


def test_an_interim_stays_on_its_utterance_window(engine: WhisperEngine, clip: np.ndarray) -> None:
    engine.counters.reset()
    (res,) = engine.infer_batch([AsrRequest(clip, stats_for(clip), AsrOptions(), is_final=False)])
    assert engine.counters.window_fallbacks == 0 and res.fallbacks == ()
    assert res.encoded_frames == utterance_frames(clip)
