"""Short-window decodes that recite their prompt's end or say a phrase twice go to the full window.

A 7 s encoder window gave a fragment "He was not." as "He was not. He was not." (traced through
``Converse``, docs/turns.md), and Whisper sometimes recites its previous-text prompt (a turn's
earlier words) before the new ones. Neither can be had from the model on demand (given a prompt
that the clip itself opens with, it skips the prompt's words instead), so the decode's result is
given here and the engine's own bookkeeping judges it: ``_record`` with the bundled model's
tokenizer, as after a real ``generate``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest

from voxgate.engines.asr import _policy as policy
from voxgate.engines.asr._jobs import Job
from voxgate.engines.asr._whisper import WhisperEngine
from voxgate.engines.asr.base import AsrOptions
from voxgate.engines.asr.config import FULL_WINDOW_FRAMES, WhisperConfig
from voxgate.gateway.testing.signals import stats_for

pytestmark = pytest.mark.model

#: The recital with other casing and punctuation than the prompt's: not its tokens.
SAID = " he was not, and he'll dispose young man"


@dataclass
class Decoded:
    """What ``generate`` returns for one item (the fields ``_record`` reads)."""

    sequences_ids: list[list[int]]
    scores: list[float]
    no_speech_prob: float = 0.01


@pytest.fixture(scope="module")
def engine() -> Iterator[WhisperEngine]:
    eng = WhisperEngine.load(WhisperConfig())
    yield eng
    eng.close()


def recorded(engine: WhisperEngine, prompt: str, frames: int, said: str = SAID) -> tuple[str, bool]:
    audio = np.zeros(32_000, np.float32)
    audio[8000:24000] = 0.1 * np.sin(np.arange(16000) * 0.2)
    stats = stats_for(audio)
    options = AsrOptions(language="en", initial_prompt=prompt)
    cfg = engine.config
    plan = policy.plan_decoding(stats, options, cfg.policy, cfg.encoder)
    job = Job(0, 0.0, audio, options, stats, plan, "en", frames)
    ids = engine._hf_tokenizer.encode(said, add_special_tokens=False).ids
    engine._record(job, 0.0, Decoded([ids], [-0.2]))
    attempt = job.attempts[-1]
    return attempt.hyps[0].text, attempt.degenerate


def test_a_recited_prompt_end_on_a_short_window_is_degenerate(engine: WhisperEngine) -> None:
    text, degenerate = recorded(engine, "He was not.", 700)
    assert text == SAID.strip()  # not the prompt's tokens: the engine's exact strip misses it
    assert degenerate  # so the ladder re-encodes it on the full window (its first step)


def test_the_same_text_is_kept_on_the_full_window_or_after_another_prompt(
    engine: WhisperEngine,
) -> None:
    assert recorded(engine, "He was not.", FULL_WINDOW_FRAMES) == (SAID.strip(), False)
    assert recorded(engine, "The captain said so.", 700) == (SAID.strip(), False)
    assert recorded(engine, "", 700) == (SAID.strip(), False)


def test_a_phrase_said_twice_on_a_short_window_is_degenerate(engine: WhisperEngine) -> None:
    # The 7 s window's "He was not. He was not." for a fragment "He was not." (no prompt).
    twice = " He was not. He was not."
    assert recorded(engine, "", 700, twice) == (twice.strip(), True)
    assert recorded(engine, "", FULL_WINDOW_FRAMES, twice) == (twice.strip(), False)
