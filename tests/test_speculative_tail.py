"""A speculative final is not restarted for every frame of a word's fading tail (issue 38).

The segmenter counts quiet unvoiced frames just after speech that stand above the call's
noise floor as the end of speech (a released "-t", a fading "-s"). On clean audio that tail
goes on for 60-200 ms after the voice model's last frame, and each frame of it moved the end
of speech: the final decode started at ``decode_after_ms`` of silence was restarted once per
frame, and the superseded decodes (already on the engine, where they cannot be stopped) held
the workers while the one that counted waited. A decode that holds the speech up to the
reported end, or all but its last 100 ms of tail, now stands for the final; one that lacks
more is restarted. The session on the virtual clock with the FAKE recogniser and the energy
voice model (speech = a loud tone, the tail = a tone under its threshold, silence = zeros).
Also: no interim starts in the silence just before the final decode (it would decode beside it),
and an utterance whose final is decoded ends then, once the model has heard no voice for half
the hangover, instead of when the hangover runs out.

The voice model lags a fading word end (Silero stays voiced for 100-200 ms of it): with smart
turns the final decode also counts its silence (plus a margin) from the last *loud* frame
(within ``Segmenter.LOUD_REL_DB`` of the utterance's loudest), so it starts while the model
still hears the tail, and only loud speech after the audio it got cancels it. Here the lagging model
is the energy one with a threshold under the tail.
"""

from __future__ import annotations

import pytest

from voxgate.common.pcm import WireEncoding
from voxgate.gateway.call.options import (
    IngressOptions,
    PlaybackOptions,
    RecognitionOptions,
)
from voxgate.gateway.config import LimitsConfig, VadConfig
from voxgate.gateway.events import OutboundEvent, SpeechOut, TranscriptOut
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.session import CallConfig, CallSession
from voxgate.gateway.testing.fake_engines import EnergyVoiceDetector, FakeTranscriber
from voxgate.gateway.testing.sessions import pcm_silence as silence
from voxgate.gateway.testing.sessions import pcm_tone as tone
from voxgate.gateway.testing.sessions import play_virtual, smart_session
from voxgate.gateway.turns import TurnOptions

pytestmark = pytest.mark.component

#: The FAKE recogniser's decode time, virtual seconds.
DECODE_S = 0.15


def run_call(
    pcm: bytes,
    *,
    hangover_ms: int,
    decode_after_ms: int,
    voice_dbfs: float = -40.0,
    decode_s: float = DECODE_S,
    mode: str = "smart",
) -> tuple[FakeTranscriber, list[tuple[float, OutboundEvent]]]:
    """One smart-turn call of ``pcm`` at real time (virtual); its requests and timed events."""
    asr = FakeTranscriber(delay_s=decode_s)
    cfg = CallConfig(
        ingress=IngressOptions(WireEncoding.LINEAR16, 16000),
        playback=PlaybackOptions(WireEncoding.LINEAR16, 16000),
        vad=VadConfig(end_silence_ms=hangover_ms),
        recognition=RecognitionOptions(
            turns=TurnOptions(
                mode=mode,
                min_silence_ms=hangover_ms,
                max_pause_ms=1600,
                decode_after_ms=decode_after_ms,
            )
        ),
    )
    detector = EnergyVoiceDetector(voice_dbfs)
    session = CallSession(
        cfg, LimitsConfig(), asr, None, metrics=GatewayMetrics(), detector=detector
    )
    return asr, play_virtual(session, pcm)  # 20 ms chunks; chunk k is sent at k * 20 ms


def test_a_fading_tail_does_not_restart_the_final_decode() -> None:
    """The final decode starts once, at 120 ms after the last voiced frame, and is the final,
    although the 180 ms tail after that frame moves the end of speech three more times; the
    final goes out one decode after that start (it waited for three restarts before)."""
    speech_end_s = 1.3
    pcm = silence(300) + tone(1000, -10) + tone(180, -50) + silence(1200)
    asr, out = run_call(pcm, hangover_ms=200, decode_after_ms=120)
    ends = [e for _, e in out if isinstance(e, SpeechOut) and not e.begin]
    # The tail counts as speech: the end is reported after it (the test exercises the tail;
    # the step back to zeros is one more frame above the all-zero floor).
    assert len(ends) == 1 and 1480 <= ends[0].offset_ms <= 1500
    finals = [r for r in asr.requests if r.is_final]
    assert len(finals) == 1
    # It was started at 120 ms of silence after the voiced tone: 1.3 s + 120 ms of audio.
    assert len(finals[0].audio) / 16 <= 1300 + 120 + 20  # pre-roll starts at 0 here
    sent = [(t, e) for t, e in out if isinstance(e, TranscriptOut) and e.is_final]
    assert len(sent) == 1
    at, final = sent[0]
    assert final.result.text == "utterance 0"
    # One decode after its start (a chunk's 20 ms of slack), not after the tail's last frame.
    assert at - speech_end_s <= 0.120 + DECODE_S + 0.02


def test_a_tail_longer_than_the_slack_restarts_it_with_the_speech() -> None:
    """With a longer hangover and an early decode, a decode that lacks more than 100 ms of
    a loud tail (within Segmenter.LOUD_REL_DB of the speech: it may be a word) is restarted,
    and the decode that stands for the final holds the speech up to the reported end but for
    at most 100 ms."""
    pcm = silence(300) + tone(1000, -30) + tone(280, -50) + silence(1500)
    asr, out = run_call(pcm, hangover_ms=400, decode_after_ms=40)
    ends = [e for _, e in out if isinstance(e, SpeechOut) and not e.begin]
    assert len(ends) == 1 and 1580 <= ends[0].offset_ms <= 1600
    end_ms = ends[0].offset_ms
    finals = [r for r in asr.requests if r.is_final]
    assert len(finals) >= 2  # restarted
    assert len(finals[-1].audio) / 16 >= end_ms - 100
    # Every earlier one was restarted because it lacked more than that.
    assert all(len(r.audio) / 16 < end_ms - 100 for r in finals[:-1])
    sent = [e for _, e in out if isinstance(e, TranscriptOut) and e.is_final]
    assert [e.result.text for e in sent] == [f"utterance {len(asr.requests) - 1}"]


@pytest.mark.parametrize("tone_ms", range(1500, 1760, 20))
def test_no_interim_starts_once_the_final_is_imminent(tone_ms: int) -> None:
    """Smart turns: once the caller has been silent for half of decode_after_ms, no interim of
    the utterance starts (the final decode is about to); interims ran while they spoke. The
    tone lengths slide the interim ticks across the silence (two of them land in it)."""
    asr = FakeTranscriber(delay_s=0.05)
    play_virtual(
        smart_session(asr, interval_ms=200), silence(200) + tone(tone_ms, -10) + silence(1500)
    )
    interims = [r for r in asr.requests if not r.is_final]
    assert interims  # they ran while the tone played
    speech_end_ms = 200 + tone_ms  # the utterance's audio starts at the call's start here
    # None holds more than half of decode_after_ms (60 ms) of the silence, a frame's slack.
    assert all(len(r.audio) / 16 <= speech_end_ms + 60 for r in interims)


def test_the_final_decode_starts_from_the_loud_end_while_the_model_still_hears_the_tail() -> None:
    """A voice model that stays voiced over a 300 ms tail 40 dB under the speech: the final
    decode starts decode_after_ms (120 ms here) after the loud speech, inside
    that voiced tail (not that long after it), runs once, and is the final; the reported end
    still includes the tail."""
    loud_end_ms = 1320  # the tail's first frame holds the step down: loud on the tilted level
    tail_end_ms = 1600
    pcm = silence(300) + tone(1000, -10) + tone(300, -50) + silence(1200)
    asr, out = run_call(pcm, hangover_ms=200, decode_after_ms=120, voice_dbfs=-60.0)
    ends = [e for _, e in out if isinstance(e, SpeechOut) and not e.begin]
    assert len(ends) == 1 and ends[0].offset_ms >= tail_end_ms  # the tail is speech
    finals = [r for r in asr.requests if r.is_final]
    assert len(finals) == 1
    # Started 120 ms after the loud end (a frame of slack), while the tail was voiced.
    after_ms = 120
    got_ms = len(finals[0].audio) / 16
    assert loud_end_ms + after_ms <= got_ms <= loud_end_ms + after_ms + 20 < tail_end_ms
    # Its statistics read the quiet tail as the silence it is about to be.
    assert finals[0].stats.trailing_silence_ms >= after_ms - 20
    sent = [(t, e) for t, e in out if isinstance(e, TranscriptOut) and e.is_final]
    assert [e.result.text for _, e in sent] == ["utterance 0"]
    # Out when the utterance ends (200 ms of the model's silence after the tail), the decode
    # already done: not a decode after 120 ms of that silence, as when the silence counted
    # from the model's last voiced frame.
    tail_end_s = tail_end_ms / 1000
    assert sent[0][0] <= tail_end_s + 0.200 + 0.02 < tail_end_s + 0.120 + DECODE_S


def test_loud_speech_after_an_early_decode_cancels_it() -> None:
    """The caller goes on after 260 ms under the speech level (the model voiced throughout):
    the decode started 200 ms into it is cancelled and the final holds the words after it."""
    pcm = silence(300) + tone(1000, -10) + tone(260, -50) + tone(600, -10) + silence(1200)
    asr, out = run_call(pcm, hangover_ms=200, decode_after_ms=120, voice_dbfs=-60.0)
    finals = [r for r in asr.requests if r.is_final]
    assert len(finals) == 2
    assert len(finals[0].audio) / 16 < 1300 + 260
    assert len(finals[-1].audio) / 16 >= 1300 + 260 + 600
    sent = [e for _, e in out if isinstance(e, TranscriptOut) and e.is_final]
    assert len(sent) == 1 and sent[0].result.text == f"utterance {len(asr.requests) - 1}"


#: run_call sends each 20 ms chunk at the start of its span: audio at t is in at t - 20 ms.
AHEAD_S = 0.02


def _timed(
    out: list[tuple[float, OutboundEvent]],
) -> tuple[list[tuple[float, SpeechOut]], list[float]]:
    """The SPEECH_END events with their times, and the finals' times."""
    ends = [(t, e) for t, e in out if isinstance(e, SpeechOut) and not e.begin]
    finals = [t for t, e in out if isinstance(e, TranscriptOut) and e.is_final]
    return ends, finals


def test_an_utterance_whose_final_is_decoded_ends_before_its_hangover_runs_out() -> None:
    """Smart turns, a 400 ms hangover: the final decode starts 80 ms after the words and is
    done 150 ms later; the voice model has heard nothing for 200 ms (half the hangover) by
    then, so the utterance ends there, its final at once, 170 ms before the hangover would
    have ended it. The reported end of speech is the same as at the hangover."""
    words_end_s = 1.3
    pcm = silence(300) + tone(1000, -10) + silence(1500)
    asr, out = run_call(pcm, hangover_ms=400, decode_after_ms=80)
    ends, finals = _timed(out)
    assert len(ends) == 1 and len(finals) == 1
    at, end = ends[0]
    assert 1300 <= end.offset_ms <= 1320
    decoded_s = words_end_s - AHEAD_S + 0.080 + DECODE_S
    # At once (the decode's end wakes the session), not at the next audio chunk.
    assert decoded_s <= at <= decoded_s + 0.005 < words_end_s - AHEAD_S + 0.400
    assert finals[0] - at < 0.005  # the decode was already done
    assert len([r for r in asr.requests if r.is_final]) == 1


def test_the_utterance_waits_for_half_the_hangover_of_the_models_silence() -> None:
    """A decode faster than half the hangover: the utterance ends when the model has heard
    no voice for 200 ms (of 400), not when the decode is done."""
    pcm = silence(300) + tone(1000, -10) + silence(1500)
    _, out = run_call(pcm, hangover_ms=400, decode_after_ms=40, decode_s=0.02)
    ends, _ = _timed(out)
    assert len(ends) == 1
    assert 1.3 - AHEAD_S + 0.200 <= ends[0][0] <= 1.3 + 0.200


def test_a_final_slower_than_the_hangover_changes_nothing() -> None:
    """A decode that outlasts the hangover: the utterance ends on the hangover, as before."""
    pcm = silence(300) + tone(1000, -10) + silence(1500)
    _, out = run_call(pcm, hangover_ms=400, decode_after_ms=80, decode_s=0.6)
    ends, finals = _timed(out)
    assert len(ends) == 1 and 1.3 - AHEAD_S + 0.400 <= ends[0][0] <= 1.3 + 0.400
    assert finals[0] >= 1.3 - AHEAD_S + 0.080 + 0.6


def test_speech_after_an_early_end_is_the_next_utterance_and_nothing_is_lost() -> None:
    """A 300 ms pause, which a 400 ms hangover would hold inside one utterance: the first
    part's final is decoded 230 ms into it, so it ends there; the words after the pause are
    the next utterance, with its own final; every word is in one or the other."""
    pcm = silence(300) + tone(1000, -10) + silence(300) + tone(800, -10) + silence(1500)
    asr, out = run_call(pcm, hangover_ms=400, decode_after_ms=80)
    ends, finals = _timed(out)
    assert len(ends) == 2 and len(finals) == 2
    texts = [e.result.text for _, e in out if isinstance(e, TranscriptOut) and e.is_final]
    assert texts == ["utterance 0", "utterance 1"]
    first, second = (r for r in asr.requests if r.is_final and not r.bulk)
    assert len(first.audio) / 16 >= 1300  # the first tone, whole
    # The turn is decoded again as one (from spare capacity): both utterances' audio.
    (whole,) = (r for r in asr.requests if r.bulk)
    assert len(whole.audio) >= len(first.audio) + len(second.audio)
    begins = [e for _, e in out if isinstance(e, SpeechOut) and e.begin]
    assert len(begins) == 2 and begins[1].offset_ms <= 1600  # the second tone, from its start


def test_without_smart_turns_the_hangover_ends_the_utterance() -> None:
    """Turn detection off: the speculative final is not used to end the utterance early."""
    pcm = silence(300) + tone(1000, -10) + silence(1500)
    _, out = run_call(pcm, hangover_ms=400, decode_after_ms=80, mode="off")
    ends, _ = _timed(out)
    assert len(ends) == 1 and 1.3 - AHEAD_S + 0.400 <= ends[0][0] <= 1.3 + 0.400
