"""The retry ladder's latency budget, on a FAKE CTranslate2 model and a fake clock.

``WhisperEngine`` runs its real rounds, ladder, choice and gates over a stand-in for
``ctranslate2.models.Whisper`` whose calls take scripted (virtual) time and return scripted
decodes, so every deadline decision is exact. Never evidence that recognition works: the real
model's test is tests/test_asr_budget_model.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from voxgate.engines.asr import _policy as policy
from voxgate.engines.asr._jobs import Attempt, Hyp, chosen_attempt
from voxgate.engines.asr._whisper import WhisperEngine
from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult
from voxgate.engines.asr.config import DecodingPolicyConfig, EncoderWindowConfig, WhisperConfig
from voxgate.engines.base import UtteranceStats
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.runtime import AsrTranscriber, BatchMetrics
from voxgate.gateway.scheduling import Batcher, BatchPolicy

pytestmark = pytest.mark.unit

WORDS = ["hello", "world", "not", "again", "please", "call", "me", "back", "la"]
SPECIALS = [
    "<|endoftext|>",
    "<|startoftranscript|>",
    "<|en|>",
    "<|transcribe|>",
    "<|translate|>",
    "<|startoflm|>",
    "<|startofprev|>",
    "<|nospeech|>",
    "<|notimestamps|>",
]
#: Every decode fails Whisper's log-prob rule under this (a typical one scores -0.2 .. -0.9).
STRICT = {"logprob_threshold": -0.1, "drop_logprob_threshold": -5.0}


def tokenizer() -> Tokenizer:
    """A word-level tokenizer with Whisper's special tokens (English-only model layout)."""
    vocab = {w: i for i, w in enumerate(["<unk>", *WORDS, *SPECIALS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")
    return tok


@dataclass
class FakeClock:
    """Seconds that pass only when the fake model works."""

    now: float = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Decode:
    """What the fake model says for one item's decode."""

    words: list[str]
    avg_logprob: float
    no_speech_prob: float = 0.0


#: (item's audio seconds, encoder frames, temperature) -> its decode.
Script = Callable[[int, int, float], Decode]


@dataclass
class _Result:
    sequences_ids: list[list[int]]
    scores: list[float]
    no_speech_prob: float = 0.0


@dataclass
class FakeWhisper:
    """A stand-in for ``ctranslate2.models.Whisper``: scripted decodes, scripted time.

    Items are told apart by their audio length in whole seconds (the engine pads the mel
    features with zeros after the audio, so the length survives the encoder's bucket).

    Args:
        clock: advanced by every call.
        script: each decode's words and score.
        encode_s: seconds to encode one item on that many frames.
        decode_s: seconds per item of one greedy ``generate`` call; ``n`` hypotheses (the
            samples of a hotter retry) take ``sqrt(n)`` times as long, as on the 2-core CPU.
    """

    clock: FakeClock
    script: Script
    encode_s: Callable[[int], float] = lambda frames: frames / 10_000
    decode_s: float = 0.1
    is_multilingual: bool = False
    n_mels: int = 80
    #: (seconds, frames, temperature) of every decode, in order (the observation channel).
    decodes: list[tuple[int, int, float]] = field(default_factory=list)
    #: What decodes with previous text (a prompt) say instead, if they say otherwise.
    prompted: Script | None = None
    #: Whether each decode had previous text, in order.
    had_prompt: list[bool] = field(default_factory=list)

    def encode(self, features: Any, to_cpu: bool = False) -> np.ndarray:
        mel = np.asarray(features)
        batch, _, frames = mel.shape
        self.clock.now += self.encode_s(frames) * batch
        out = np.zeros((batch, frames // 2, 4), np.float32)
        for b in range(batch):
            voiced = np.flatnonzero(np.any(mel[b] != 0.0, axis=0))
            out[b, 0, 0] = round((voiced[-1] + 1) / 100) if len(voiced) else 0
            out[b, 0, 1] = frames
        return out

    def generate(self, encoded: Any, prompts: list[list[int]], **kw: Any) -> list[_Result]:
        enc = np.asarray(encoded)
        self.clock.now += self.decode_s * math.sqrt(kw["num_hypotheses"]) * len(prompts)
        temperature = float(kw.get("sampling_temperature", 0.0))
        out = []
        for b in range(len(prompts)):
            key = (int(enc[b, 0, 0]), int(enc[b, 0, 1]), temperature)
            self.decodes.append(key)
            sot_prev = 1 + len(WORDS) + SPECIALS.index("<|startofprev|>")
            self.had_prompt.append(sot_prev in prompts[b])
            script = self.prompted if self.had_prompt[-1] and self.prompted else self.script
            d = script(*key)
            ids = [1 + WORDS.index(w) for w in d.words]
            n = int(kw["num_hypotheses"])
            out.append(_Result([ids] * n, [d.avg_logprob] * n, d.no_speech_prob))
        return out

    def unload_model(self) -> None:
        pass


def engine(
    script: Script, *, budget_s: float, clock: FakeClock | None = None, **fake: Any
) -> tuple[WhisperEngine, FakeWhisper]:
    clock = clock or FakeClock()
    model = FakeWhisper(clock, script, **fake)
    cfg = WhisperConfig(
        encoder=EncoderWindowConfig(),  # buckets 10/15/20/30 s with a 2 s margin
        policy=DecodingPolicyConfig(**STRICT, decode_budget_s=budget_s),
    )
    return WhisperEngine(model, tokenizer(), cfg, clock=clock), model


def request(
    seconds: int, *, speech_ms: int | None = None, prompt: str = "", is_final: bool = True
) -> AsrRequest:
    rng = np.random.default_rng(seconds)
    audio = (rng.standard_normal(seconds * 16000) * 0.05).astype(np.float32)
    dur = seconds * 1000
    stats = UtteranceStats(dur, speech_ms or dur, 1.0, 0, 0, -26.0, -26.0, -10.0)
    options = AsrOptions(word_timestamps=False, initial_prompt=prompt)
    return AsrRequest(audio, stats, options, is_final=is_final)


def unsure(seconds: int, frames: int, temperature: float) -> Decode:
    """Right words, but never sure enough for the strict gate: every decode is retried."""
    return Decode(["please", "call", "me", "back"], -0.5)


# --- the budget -----------------------------------------------------------------------------------


def test_a_ladder_that_would_overrun_stops_at_the_budget_with_text() -> None:
    eng, model = engine(unsure, budget_s=1.0)
    (res,) = eng.infer_batch([request(4)])
    # The 10 s bucket ends at 0.2 s (encode 0.1 + decode 0.1); the full window (encode
    # 0.3 + decode 0.1) at 0.6 s; the first hotter round (0.1 * sqrt(5)) at 0.82 s, and the
    # second would end at 1.05 s, after the budget.
    assert res.text == "please call me back"
    assert res.fallbacks == ("window", "temperature", "budget")
    assert model.clock.now <= 1.0
    assert eng.counters.budget_cuts == 1

    # The same item without a budget runs the whole ladder, past that second.
    free, free_model = engine(unsure, budget_s=600.0)
    (whole,) = free.infer_batch([request(4)])
    assert whole.fallbacks == ("window", *["temperature"] * 5)
    assert free_model.clock.now > 1.0


def test_no_budget_left_means_the_first_decode_only() -> None:
    eng, model = engine(unsure, budget_s=0.0)
    (res,) = eng.infer_batch([request(4)])
    assert res.text == "please call me back" and res.fallbacks == ("budget",)
    assert len(model.decodes) == 1


def test_a_window_retry_is_priced_with_the_full_window_encode() -> None:
    # The full window costs 1.2 s to encode (the 10 s bucket 0.1 s): a window retry after a
    # 0.2 s round does not fit 1.0 s, while a cheap one would have.
    def encode_s(frames: int) -> float:
        return 1.2 if frames == 3000 else 0.1

    eng, model = engine(unsure, budget_s=1.0, encode_s=encode_s)
    (cold,) = eng.infer_batch([request(3)])
    # Never measured (no warmup), the full window is scaled from the bucket (0.3 s): tried,
    # and late. WhisperEngine.warmup measures it for that reason.
    assert cold.fallbacks == ("window", "budget") and model.clock.now > 1.0
    model.clock.now = 0.0
    (res,) = eng.infer_batch([request(4)])
    assert res.fallbacks == ("budget",)  # measured now: 0.2 + 1.2 + 0.1 does not fit
    assert model.clock.now <= 1.0


def test_budgets_are_per_item_a_spent_item_leaves_and_the_other_retries_on() -> None:
    # A 4 s item (10 s bucket: its next step is a full-window encode, 1.0 s) and a 29 s one
    # (already on the full window: its next step is a cheap hotter decode) share a batch.
    def encode_s(frames: int) -> float:
        return 1.0 if frames == 3000 else 0.1

    eng, model = engine(unsure, budget_s=2.0, encode_s=encode_s)
    short, long_ = eng.infer_batch([request(4), request(29)])
    # Round 1 ends at 0.1 + 1.0 + 0.2 = 1.3 s: the window (1.0 + 0.2) would end at 2.5 s.
    assert short.fallbacks == ("budget",) and short.text
    # The long item retries alone (0.22 s a round, not the 0.45 s of two) until its next
    # round would end after 2.0 s.
    assert long_.fallbacks[:-1] == ("temperature",) * (len(long_.fallbacks) - 1)
    assert long_.fallbacks[-1] == "budget" and len(long_.fallbacks) >= 4
    assert [d[0] for d in model.decodes].count(4) == 1
    assert model.clock.now <= 2.0


# --- the best text so far -------------------------------------------------------------------------


def test_the_cut_ladder_keeps_its_best_attempt() -> None:
    def improving(seconds: int, frames: int, temperature: float) -> Decode:
        if frames < 3000:
            return Decode(["hello", "world"], -0.9)
        if temperature == 0.2:
            return Decode(["hello", "again"], -0.3)  # the best of what there is time for
        return Decode(["not", "again"], -0.6)

    eng, _ = engine(improving, budget_s=1.0)
    (res,) = eng.infer_batch([request(4)])
    assert res.fallbacks == ("window", "temperature", "budget")
    assert res.text == "hello again"


def test_looping_text_loses_to_text_that_does_not_loop() -> None:
    loop = ["la"] * 40  # a repetition loop, and sure of itself

    def looping_then_plain(seconds: int, frames: int, temperature: float) -> Decode:
        if temperature == 0.0:
            return Decode(loop if frames == 3000 else ["not", "again"], -0.2)
        return Decode(loop, -0.15)

    eng, _ = engine(looping_then_plain, budget_s=1.0)
    (res,) = eng.infer_batch([request(4)])
    assert "budget" in res.fallbacks
    # The bucket's plain decode beats the full window's surer loops.
    assert res.text == "not again" and not res.dropped_reason


# --- short speech ---------------------------------------------------------------------------------


def test_short_speech_takes_one_retry_however_much_budget_is_left() -> None:
    eng, model = engine(unsure, budget_s=600.0)
    (word,) = eng.infer_batch([request(1, speech_ms=300)])
    assert word.fallbacks == ("window",) and word.text
    assert len(model.decodes) == 2
    (longer,) = eng.infer_batch([request(2, speech_ms=1500)])
    assert longer.fallbacks == ("window", *["temperature"] * 5)


def test_the_plan_gives_short_speech_the_short_ladder() -> None:
    cfg = DecodingPolicyConfig(short_speech_ms=1000, short_speech_max_fallbacks=2)
    window = EncoderWindowConfig()

    def plan(speech_ms: int) -> policy.DecodingPlan:
        stats = UtteranceStats(2000, speech_ms, speech_ms / 2000, 0, 0, -20.0, -20.0, -6.0)
        return policy.plan_decoding(stats, AsrOptions(), cfg, window)

    assert plan(999).max_fallbacks == 2
    assert plan(1000).max_fallbacks == policy.MAX_FALLBACKS
    assert plan(1000).budget_s == cfg.decode_budget_s == 2.0


# --- the gateway counts the cut -------------------------------------------------------------------


async def test_a_cut_ladder_is_counted_as_a_budget_fallback() -> None:
    metrics = GatewayMetrics()
    eng, _ = engine(unsure, budget_s=0.5)
    batcher: Batcher[AsrRequest, AsrResult] = Batcher(
        [eng], BatchPolicy(max_batch_size=1), observer=BatchMetrics(metrics), name="t"
    )
    async with batcher:
        asr = AsrTranscriber(batcher, 1, lambda prompt, words: (), metrics, default_model="base")
        result = await asr.transcribe(request(4))
    assert result.fallbacks[-1] == "budget"

    def count(step: str) -> float:
        return metrics.value("voxgate_asr_fallbacks_total", model="base", kind="final", step=step)

    assert count("budget") == 1
    assert count("window") == result.fallbacks.count("window")


# --- the prompt -----------------------------------------------------------------------------------


def sure(seconds: int, frames: int, temperature: float) -> Decode:
    """Every word, sure of them (passes even the strict gate)."""
    return Decode(["please", "call", "me", "back"], -0.05)


def test_a_final_the_prompt_cut_short_is_decoded_again_without_it() -> None:
    """4 s of speech, and with the turn's earlier words as its prompt one word, sure of itself
    (what Whisper did on a LibriSpeech turn: "And" for 13 words): retried without the prompt."""
    eng, model = engine(sure, budget_s=600.0, prompted=lambda *_: Decode(["hello"], -0.05))
    (res,) = eng.infer_batch([request(4, prompt="hello world")])
    assert res.text == "please call me back" and res.fallbacks == ("prompt",)
    assert model.had_prompt == [True, False] and eng.counters.prompt_fallbacks == 1
    # Without a prompt there is none to drop: where the model hears speech the ladder's other
    # steps run (and keep the word, all there is); where it hears none, nothing is retried.
    eng, model = engine(lambda *_: Decode(["hello"], -0.05), budget_s=600.0)
    (res,) = eng.infer_batch([request(4)])
    assert res.text == "hello" and res.fallbacks == ("window", *["temperature"] * 5)
    eng, model = engine(lambda *_: Decode(["hello"], -0.05, no_speech_prob=0.9), budget_s=600.0)
    (res,) = eng.infer_batch([request(4)])
    assert res.fallbacks == () and len(model.decodes) == 1
    # One word of a prompted decode on speech too short to say more (1 s) stands.
    eng, model = engine(sure, budget_s=600.0, prompted=lambda *_: Decode(["hello"], -0.05))
    (res,) = eng.infer_batch([request(1, prompt="hello world")])
    assert res.text == "hello" and res.fallbacks == ()


def test_a_prompted_final_that_fails_drops_the_prompt_before_any_other_step() -> None:
    unsure_prompted = lambda *_: Decode(["please", "call", "me", "back"], -0.5)  # noqa: E731
    eng, model = engine(sure, budget_s=600.0, prompted=unsure_prompted)
    (res,) = eng.infer_batch([request(4, prompt="hello world")])
    assert res.fallbacks == ("prompt",) and model.had_prompt == [True, False]
    assert [frames for _, frames, _ in model.decodes] == [1000, 1000]  # the same encoder output


def test_an_interim_is_not_retried_without_its_prompt() -> None:
    eng, model = engine(sure, budget_s=600.0, prompted=lambda *_: Decode(["hello"], -0.05))
    (res,) = eng.infer_batch([request(4, prompt="hello world", is_final=False)])
    assert res.text == "hello" and res.fallbacks == () and len(model.decodes) == 1


def test_cut_short_reads_tokens_per_second_of_speech() -> None:
    assert policy.cut_short(1, 3.46)  # "And" for 3.5 s of speech
    assert not policy.cut_short(3, 3.46)
    assert not policy.cut_short(0, policy.CUT_SHORT_MIN_SPEECH_S - 0.01)
    assert policy.cut_short(0, policy.CUT_SHORT_MIN_SPEECH_S)


def test_a_runner_up_languages_failed_text_never_beats_the_calls_own() -> None:
    """Every attempt fails; the runner-up language's is surer and on the full window, but the
    call speaks the hint's language: its text is kept (a LibriSpeech turn lost "he's in
    charge here" to a Chinese retry's empty text, then to its full-window guess)."""
    job_attempts = [
        Attempt(1000, "en", 0.0, [Hyp([4, 5], "please call", -1.2, -3.6)], 0.05, True),
        Attempt(1000, "zh", 0.0, [Hyp([], "", 0.0, 0.0)], 0.05, True, short=True),
        Attempt(3000, "zh", 0.0, [Hyp([1], "hello", -0.9, -1.8)], 0.05, True),
    ]
    job = SimpleNamespace(
        attempts=job_attempts, frames=3000, options=AsrOptions(language_hint="en")
    )
    assert chosen_attempt(job, 2.4) is job_attempts[0]  # type: ignore[arg-type]
    job.options = AsrOptions()  # no hint: the first attempt's language is the call's
    assert chosen_attempt(job, 2.4) is job_attempts[0]  # type: ignore[arg-type]


def test_a_full_window_retry_that_reads_worse_does_not_replace_the_buckets_words() -> None:
    """Every attempt fails the retry rule. JFK's lone "Not!" on the default server: the short
    bucket read it at -1.08 (a retry under -1.0, kept over -1.2), the full window worse (-1.32,
    dropped): the surer text is kept, as among Whisper's temperatures. Only a short window's
    own artifact (a phrase said twice, the prompt recited) yields to the full window, however
    sure it was."""
    job_attempts = [
        Attempt(1000, "en", 0.0, [Hyp([3], "NOT!", -1.08, -2.16)], 0.05, True),
        Attempt(3000, "en", 0.0, [Hyp([1], "hello", -1.32, -2.64)], 0.05, True),
    ]
    job = SimpleNamespace(attempts=job_attempts, frames=3000, options=AsrOptions())
    assert chosen_attempt(job, 2.4) is job_attempts[0]  # type: ignore[arg-type]
    job_attempts[0] = Attempt(
        1000, "en", 0.0, [Hyp([3, 3], "not not", -0.3, -0.6)], 0.05, True, window_artifact=True
    )
    assert chosen_attempt(job, 2.4) is job_attempts[1]  # type: ignore[arg-type]
