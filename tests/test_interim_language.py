"""Interims of a call that sets no language: the language learned from its finals.

Component tests on the virtual clock with the FAKE recogniser (voxgate.gateway.testing), which
records every request and answers a scripted detection; plus the real engine's detection
probability.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import read_wav_int16
from test_session import Call, drive, silence, tone

from voxgate.engines.asr._jobs import runner_up_languages
from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult
from voxgate.gateway.call.options import InterimOptions, RecognitionOptions
from voxgate.gateway.config import LanguageConfig, load_config
from voxgate.gateway.events import TranscriptOut
from voxgate.gateway.testing.fake_engines import FakeTranscriber
from voxgate.gateway.testing.signals import stats_for

DETECT = AsrOptions(language=None)


def scripted(final: tuple[str, float], interim: tuple[str, float] = ("ru", 0.3)) -> Any:
    """A detection per request kind: finals are long and sure, interims short and unsure."""

    def detect(req: AsrRequest) -> tuple[str, float]:
        return final if req.is_final else interim

    return detect


def two_utterances(asr: FakeTranscriber, **recognition: Any) -> Call:
    """``recognition``: the call's recognition options over detecting the language."""
    call = Call(
        transcriber=asr,
        synth=None,
        options={
            "interims": InterimOptions(results=True),
            "recognition": RecognitionOptions(**{"asr_options": DETECT, **recognition}),
        },
    )

    async def script(c: Call) -> None:
        await c.say(tone(2600) + silence(1500) + tone(2600) + silence(1500))
        await c.inbox.put(None)

    drive(call, script)
    return call


def split(asr: FakeTranscriber) -> tuple[list[AsrRequest], list[AsrRequest], list[AsrRequest]]:
    """Interims before the first final, the finals, and interims after the first final."""
    first_final = next(i for i, r in enumerate(asr.requests) if r.is_final)
    before = [r for r in asr.requests[:first_final] if not r.is_final]
    after = [r for r in asr.requests[first_final:] if not r.is_final]
    return before, [r for r in asr.requests if r.is_final], after


@pytest.mark.component
def test_interims_after_a_confident_final_decode_in_its_language() -> None:
    asr = FakeTranscriber(lambda r: "words", detected=scripted(("de", 0.95)), speculate=False)
    two_utterances(asr)
    before, finals, after = split(asr)
    assert before and after and len(finals) == 2
    assert all(r.options.language is None for r in before)  # nothing learned yet
    assert all(r.options.language == "de" for r in after)
    assert all(r.options.language is None for r in finals)  # finals keep detecting ...
    # ... with the call's language as the first retry once it has one (the first final:
    # nothing learned yet; the second: German).
    assert [r.options.language_hint for r in finals] == [None, "de"]


@pytest.mark.component
def test_an_unsure_final_teaches_nothing() -> None:
    asr = FakeTranscriber(lambda r: "words", detected=scripted(("de", 0.6)), speculate=False)
    two_utterances(asr)
    _, finals, after = split(asr)
    assert after and all(r.options.language is None for r in after)
    assert all(r.options.language_hint is None for r in finals)


@pytest.mark.unit
def test_the_calls_language_is_the_first_runner_up() -> None:
    """A short final detected wrongly retries in the call's language first, then in a
    close runner-up of its own detection; a hint that agrees adds nothing."""
    ranked = [("el", 0.41), ("en", 0.30), ("ru", 0.1)]
    assert runner_up_languages(ranked, 0.2, None) == ["en"]
    assert runner_up_languages(ranked, 0.2, "en") == ["en"]  # not twice
    assert runner_up_languages(ranked, 0.2, "de") == ["de", "en"]
    assert runner_up_languages(ranked, 0.2, "el") == ["en"]  # the detection agrees
    assert runner_up_languages([("en", 0.99)], 0.2, None) == []


@pytest.mark.component
def test_an_empty_final_teaches_nothing() -> None:
    asr = FakeTranscriber(
        lambda r: "" if r.is_final else "words", detected=scripted(("de", 0.99)), speculate=False
    )
    two_utterances(asr)
    _, _, after = split(asr)
    assert after and all(r.options.language is None for r in after)


@pytest.mark.component
def test_learning_can_be_turned_off() -> None:
    asr = FakeTranscriber(lambda r: "words", detected=scripted(("de", 0.99)), speculate=False)
    two_utterances(asr, language=LanguageConfig(learn=False, interim_detect_min_ms=0))
    _, _, after = split(asr)
    assert after and all(r.options.language is None for r in after)


@pytest.mark.component
def test_the_server_default_holds_until_a_final_teaches_another() -> None:
    asr = FakeTranscriber(lambda r: "words", detected=scripted(("de", 0.95)), speculate=False)
    two_utterances(asr, language=LanguageConfig(interim_default="en"))
    before, finals, after = split(asr)
    assert before and all(r.options.language == "en" for r in before)
    assert after and all(r.options.language == "de" for r in after)
    assert all(r.options.language is None for r in finals)


@pytest.mark.component
def test_a_call_that_sets_its_language_is_left_alone() -> None:
    asr = FakeTranscriber(lambda r: "words", detected=scripted(("de", 0.95)), speculate=False)
    two_utterances(asr, asr_options=AsrOptions(language="fr"))
    assert asr.requests and all(r.options.language == "fr" for r in asr.requests)


@pytest.mark.component
def test_an_unsure_detection_on_a_short_prefix_is_not_used() -> None:
    # The text says how long the prefix was; the detection is always unsure (0.4).
    asr = FakeTranscriber(
        lambda r: "final" if r.is_final else f"{len(r.audio)}",
        detected=("ru", 0.4),
        speculate=False,
    )
    gate = LanguageConfig(interim_detect_min_ms=1500)
    call = two_utterances(asr, language=gate)
    min_samples = gate.interim_detect_min_ms * 16
    asked = [len(r.audio) for r in asr.requests if not r.is_final]
    shown = [int(e.result.text) for _, e in call.of(TranscriptOut) if not e.is_final]
    assert any(n < min_samples for n in asked)  # short prefixes were decoded ...
    assert shown and all(n >= min_samples for n in shown)  # ... but only long ones shown
    assert sorted(shown) == sorted(n for n in asked if n >= min_samples)


@pytest.mark.component
def test_a_sure_detection_on_a_short_prefix_is_used() -> None:
    asr = FakeTranscriber(
        lambda r: "final" if r.is_final else "words", detected=("en", 0.9), speculate=False
    )
    call = two_utterances(asr, language=LanguageConfig(interim_detect_min_ms=1500))
    interims = [e for _, e in call.of(TranscriptOut) if not e.is_final]
    assert len(interims) == sum(not r.is_final for r in asr.requests)


@pytest.mark.component
def test_by_default_every_interim_is_used_however_unsure() -> None:
    asr = FakeTranscriber(
        lambda r: "final" if r.is_final else "words", detected=("ru", 0.1), speculate=False
    )
    call = two_utterances(asr)
    interims = [e for _, e in call.of(TranscriptOut) if not e.is_final]
    assert interims and len(interims) == sum(not r.is_final for r in asr.requests)


@pytest.mark.component
def test_the_server_config_reaches_the_call() -> None:
    cfg = load_config(None, {"session": {"language": {"interim_default": "es"}}})
    assert cfg.session.language.interim_default == "es"
    with pytest.raises(ValueError, match="interim_default"):
        load_config(None, {"session": {"language": {"interim_default": "English"}}})


# --- the real engine ------------------------------------------------------------------------------


@pytest.mark.model
def test_the_engine_reports_how_sure_its_detection_is(speech_dir: Path) -> None:
    from voxgate.engines.asr._whisper import WhisperEngine  # noqa: PLC0415
    from voxgate.engines.asr.config import WhisperConfig  # noqa: PLC0415

    pcm, rate = read_wav_int16(speech_dir / "jfk_inaugural_1961.wav")
    assert rate == 16000
    audio = pcm.astype(np.float32) / 32768.0
    eng = WhisperEngine.load(WhisperConfig(inter_threads=1, intra_threads=2))
    try:
        detected, fixed = eng.infer_batch(
            [
                AsrRequest(audio, stats_for(audio), AsrOptions(language=None)),
                AsrRequest(audio, stats_for(audio), AsrOptions(language="en")),
            ]
        )
    finally:
        eng.close()
    assert isinstance(detected, AsrResult) and detected.text
    assert detected.language == "en" and 0.8 <= detected.language_probability <= 1.0
    assert fixed.language == "en" and fixed.language_probability == 1.0


@pytest.mark.model
def test_a_short_final_detected_wrongly_is_decoded_in_the_calls_language(speech_dir: Path) -> None:
    """The second part of a sentence after a 1.5 s pause, as the gateway cut it through
    ``Converse`` (400 ms of the pause before 0.9 s of speech): Whisper detects it as Greek,
    its Greek decode fails the log-prob gate, and the full-window retry is Greek again, so
    nothing but an interim was left. With the call's language as the hint it is retried in
    English at once."""
    from benchmarks.turn_taking import splice_pause  # noqa: PLC0415
    from voxgate.engines.asr._whisper import WhisperEngine  # noqa: PLC0415
    from voxgate.engines.base import UtteranceStats  # noqa: PLC0415

    pcm, _ = read_wav_int16(speech_dir / "librispeech_3752-4944-0002.wav")
    spliced = splice_pause(pcm, 1500)
    assert spliced is not None
    audio = spliced[0][3240 * 16 : 4700 * 16].astype(np.float32) / 32768.0
    stats = UtteranceStats(1460, 940, 940 / 1460, 400, 120, -21.8, -20.0, -6.5)
    eng = WhisperEngine.load(None)
    try:
        alone, hinted = (
            eng.infer_batch([AsrRequest(audio, stats, AsrOptions(language=None, **hint))])[0]
            for hint in ({}, {"language_hint": "en"})
        )
    finally:
        eng.close()
    assert alone.text == "" and alone.dropped_reason == "low_logprob"
    assert "window" in alone.fallbacks and alone.language != "en"
    assert hinted.text.lower().strip(" .") == "he is with us"
    assert hinted.fallbacks == ("language",) and hinted.language == "en"
