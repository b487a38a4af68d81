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
from voxgate.engines.asr._jobs import EngineCounters, Job, next_step
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


def record(engine: WhisperEngine, prompt: str, frames: int, said: str, score: float = -0.2) -> Job:
    """A job of 0.6 s of speech (short speech: one retry) after one decode that said ``said``."""
    audio = np.zeros(32_000, np.float32)
    audio[8000:17600] = 0.1 * np.sin(np.arange(9600) * 0.2)
    stats = stats_for(audio)
    options = AsrOptions(language="en", initial_prompt=prompt)
    cfg = engine.config
    plan = policy.plan_decoding(stats, options, cfg.policy, cfg.encoder)
    job = Job(0, 0.0, audio, options, stats, plan, "en", frames)
    ids = engine._hf_tokenizer.encode(said, add_special_tokens=False).ids
    engine._record(job, 0.0, Decoded([ids], [score]))
    return job


def recorded(engine: WhisperEngine, prompt: str, frames: int, said: str = SAID) -> tuple[str, bool]:
    attempt = record(engine, prompt, frames, said).attempts[-1]
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


def test_the_full_window_comes_before_a_runner_up_language_for_such_a_decode(
    engine: WhisperEngine,
) -> None:
    # Short speech gets one retry; a close runner-up language would otherwise take it, and
    # the phrase said twice would stay.
    job = record(engine, "", 700, " He was not. He was not.")
    job.alt_languages = ["de"]
    assert job.plan.max_fallbacks == 1
    next_step(job, 0.0, engine.config, EngineCounters(), {})
    assert (job.fallbacks, job.frames, job.language) == (["window"], FULL_WINDOW_FRAMES, "en")
    # Any other degenerate decode keeps the ladder's order: the runner-up language first.
    other = record(engine, "", 700, " Go forward ten meters.", score=-3.0)  # an unsure decode
    other.alt_languages = ["de"]
    assert other.attempts[-1].degenerate and not other.attempts[-1].window_artifact
    next_step(other, 0.0, engine.config, EngineCounters(), {})
    assert (other.fallbacks, other.frames, other.language) == (["language"], 700, "de")
