"""The VAD segmenter: step-driven state machine tests, chunking invariance, real calls."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
import soxr
from conftest import read_wav_int16
from hypothesis import given, settings
from hypothesis import strategies as st

from voxgate.common.pcm import MULAW_ENCODE, WireEncoding, float_to_pcm16, pcm16_to_float
from voxgate.gateway.audio import InputDecoder
from voxgate.gateway.config import VadConfig
from voxgate.gateway.segmenter import (
    Segmenter,
    SegmenterState,
    SpeechBegin,
    SpeechEnd,
    Utterance,
)

pytestmark = pytest.mark.unit

FRAME = 320  # 20 ms at 16 kHz


class ScriptedDetector:
    """A voice model that answers from a script: frames whose first sample is > 100 are voiced."""

    def voice_confidence(self, frame: npt.NDArray[np.int16]) -> float:
        return 1.0 if frame[0] > 100 else 0.0


def pattern(spec: str, level: float = 0.1) -> np.ndarray:
    """'.'=unvoiced frame, 'x'=voiced frame; each is 20 ms."""
    out = np.zeros(len(spec) * FRAME, dtype=np.float32)
    for i, c in enumerate(spec):
        if c == "x":
            out[i * FRAME : (i + 1) * FRAME] = level
    return out


class NoTailSegmenter(Segmenter):
    """The scripted square waves have edges that look like plosive tails; switch that off."""

    TAIL_DB = float("inf")


#: The scripted tests' VAD settings. These steps test the pre-roll itself: no call-start
#: lead-in (tested on its own below).
SCRIPTED = dict(
    frame_ms=20,
    start_speech_ms=60,
    end_silence_ms=100,
    min_speech_ms=0,
    pre_roll_ms=40,
    call_start_lead_in_ms=0,
)


def seg(**kw: int) -> Segmenter:
    return NoTailSegmenter(VadConfig(**{**SCRIPTED, **kw}), ScriptedDetector())


def test_an_unvoiced_burst_right_after_speech_extends_its_end() -> None:
    """A final plosive ("interes-t") is unvoiced but loud: it belongs to the utterance."""
    cfg = VadConfig(
        frame_ms=20, start_speech_ms=60, end_silence_ms=300, pre_roll_ms=0, plosive_tail=True
    )
    rng = np.random.default_rng(0)
    audio = (rng.standard_normal(40 * FRAME) * 1e-4).astype(np.float32)  # noise floor
    audio[10 * FRAME : 20 * FRAME] += 0.1  # voiced frames 10..19 (scripted)
    burst = rng.standard_normal(FRAME).astype(np.float32) * 0.02
    audio[25 * FRAME : 26 * FRAME] = -np.abs(burst)  # unvoiced (first sample <= 0) but loud
    with_tail = Segmenter(cfg, ScriptedDetector()).push(audio)
    without = NoTailSegmenter(cfg, ScriptedDetector()).push(audio)
    end_with = next(e for e in with_tail if isinstance(e, SpeechEnd)).offset_ms
    end_without = next(e for e in without if isinstance(e, SpeechEnd)).offset_ms
    assert end_without == 400
    assert 520 <= end_with <= 540  # the burst frame, or the one after (its falling edge)


def test_states_step_by_step() -> None:
    s = seg()
    assert s.push(pattern("...")) == [] and s.state is SegmenterState.QUIET
    assert s.push(pattern("x")) == [] and s.state is SegmenterState.STARTING
    assert s.push(pattern("x")) == []
    ev = s.push(pattern("x"))  # third voiced frame = 60 ms: speech confirmed at its first frame
    assert ev == [SpeechBegin(offset_ms=60, utterance_index=0)]
    assert s.state is SegmenterState.SPEAKING
    assert s.push(pattern(".")) == [] and s.state is SegmenterState.STOPPING
    assert s.push(pattern("x")) == [] and s.state is SegmenterState.SPEAKING
    assert s.push(pattern("....")) == [] and s.state is SegmenterState.STOPPING
    ev = s.push(pattern("."))  # 5 silent frames = 100 ms hangover
    assert s.state is SegmenterState.QUIET
    assert isinstance(ev[0], SpeechEnd) and ev[0].offset_ms == 160
    utt = ev[1]
    assert isinstance(utt, Utterance)
    assert (utt.speech_start_ms, utt.speech_end_ms) == (60, 160)
    assert utt.start_ms == 20  # 40 ms pre-roll
    assert utt.stats.speech_ms == 80 and utt.stats.leading_silence_ms == 40
    assert len(utt.audio) == (utt.end_ms - utt.start_ms) * 16


def test_a_blip_shorter_than_start_speech_is_ignored() -> None:
    s = seg()
    assert s.push(pattern("xx........")) == []
    assert s.state is SegmenterState.QUIET


def test_max_utterance_forces_a_cut_and_speech_continues() -> None:
    s = seg(max_utterance_ms=1000)
    ev = s.push(pattern("x" * 120))
    utts = [e for e in ev if isinstance(e, Utterance)]
    assert utts and utts[0].stats.forced_cut
    assert utts[0].speech_end_ms - utts[0].speech_start_ms == 1000
    begins = [e for e in ev if isinstance(e, SpeechBegin)]
    assert len(begins) == 3  # 2.4 s of speech cut into 1 s pieces


def test_min_speech_marks_short_utterances_dropped() -> None:
    s = seg(min_speech_ms=200)
    ev = s.push(pattern("...xxxx" + "." * 10))
    (utt,) = [e for e in ev if isinstance(e, Utterance)]
    assert utt.dropped


def test_flush_finalises_an_open_utterance() -> None:
    s = seg()
    s.push(pattern("..xxxxxx"))
    ev = s.flush()
    assert isinstance(ev[0], SpeechEnd) and isinstance(ev[1], Utterance)
    assert s.state is SegmenterState.QUIET


@settings(max_examples=60, deadline=None)
@given(
    spec=st.text(alphabet=".x", min_size=10, max_size=200),
    cuts=st.lists(st.integers(min_value=1, max_value=2000), min_size=1, max_size=30),
)
def test_same_events_however_the_audio_is_chunked(spec: str, cuts: list[int]) -> None:
    audio = pattern(spec)
    whole = seg()
    expected = whole.push(audio) + whole.flush()
    chunked = seg()
    got: list[object] = []
    pos = 0
    for c in cuts:
        got += chunked.push(audio[pos : pos + c])
        pos += c
    got += chunked.push(audio[pos:]) + chunked.flush()
    assert [_key(e) for e in got] == [_key(e) for e in expected]
    # Segments are ordered, non-overlapping and within the audio.
    utts = [e for e in got if isinstance(e, Utterance)]
    for a, b in zip(utts, utts[1:], strict=False):
        assert a.speech_end_ms <= b.speech_start_ms
    for u in utts:
        assert 0 <= u.start_ms <= u.speech_start_ms < u.speech_end_ms <= len(spec) * 20


def _key(e: object) -> tuple[object, ...]:
    if isinstance(e, Utterance):
        return (
            "u",
            e.index,
            e.start_ms,
            e.end_ms,
            e.speech_start_ms,
            e.speech_end_ms,
            e.audio.tobytes(),
        )
    assert isinstance(e, SpeechBegin | SpeechEnd)
    return (type(e).__name__, e.offset_ms, e.utterance_index)


# --- real calls ---------------------------------------------------------------------------------


def _call_events(path: Path, mode: str, model: str = "silero") -> list[object]:
    pcm, rate = read_wav_int16(path)
    assert rate == 16000
    if mode == "mulaw8k":
        x8 = soxr.resample(pcm16_to_float(pcm), 16000, 8000)
        data = MULAW_ENCODE[float_to_pcm16(x8).astype(np.int64) + 32768].tobytes()
        dec, step = InputDecoder(WireEncoding.MULAW, 8000), 160  # 20 ms of 8 kHz mu-law
    else:
        data = pcm.tobytes()
        dec, step = InputDecoder(WireEncoding.LINEAR16, 16000), 640
    s = Segmenter(VadConfig(model=model))  # type: ignore[arg-type]
    events: list[object] = []
    for i in range(0, len(data), step):
        events += s.push(dec.decode(data[i : i + step]))
    events += s.push(dec.flush()) + s.flush()
    return events


#: Worst boundary error allowed against the calls' ground truth, (begin, end) in s. webrtc's is
#: the v0.1 figure; silero's is the issue's goal (<= 70 ms begin, <= 170 ms end), which the
#: boundary refinements meet on every utterance of both encodings (benchmarks/ear.py measures
#: 38 / 164 ms worst on mu-law, 25 / 146 ms on linear 16 kHz).
TOLERANCE_S = {"webrtc": (0.25, 0.25), "silero": (0.07, 0.17)}


@pytest.mark.parametrize("model", ["silero", "webrtc"])
@pytest.mark.parametrize("mode", ["linear16_16k", "mulaw8k"])
@pytest.mark.parametrize("call", ["call_01", "call_02", "call_03"])
def test_real_calls_one_segment_per_utterance(
    speech_dir: Path, call: str, mode: str, model: str
) -> None:
    (wav,) = sorted((speech_dir / "calls").glob(f"{call}_*.wav"))
    truth = json.loads(wav.with_suffix(".json").read_text())["segments"]
    events = _call_events(wav, mode, model)
    tol_begin, tol_end = TOLERANCE_S[model]
    begins = [e for e in events if isinstance(e, SpeechBegin)]
    ends = [e for e in events if isinstance(e, SpeechEnd)]
    utts = [e for e in events if isinstance(e, Utterance)]
    assert len(begins) == len(ends) == len(utts) == len(truth), [
        (u.speech_start_ms, u.speech_end_ms) for u in utts
    ]
    for t, b, e, u in zip(truth, begins, ends, utts, strict=True):
        assert abs(b.offset_ms / 1000 - t["speech_start_s"]) <= tol_begin, (t, b)
        assert abs(e.offset_ms / 1000 - t["speech_end_s"]) <= tol_end, (t, e)
        assert not u.dropped and u.stats.speech_ratio > 0.5
    # Nothing outside the truth: no segment starts in a gap.
    for u in utts:
        assert any(
            t["speech_start_s"] - 0.25 <= u.speech_start_ms / 1000 <= t["speech_end_s"]
            for t in truth
        )


def _previews_match_finals(s: Segmenter, audio: np.ndarray, step: int) -> int:
    """Push audio frame by frame; every settled preview must have the emitted utterance's span,
    and its audio must be a prefix of the emitted audio differing only in trailing silence,
    unless speech resumed in between. Returns how many previews were checked."""
    pending: dict[int, Utterance] = {}
    checked = 0
    for i in range(0, len(audio), step):
        for ev in s.push(audio[i : i + step]):
            if isinstance(ev, Utterance) and ev.index in pending:
                p = pending.pop(ev.index)
                span = ("start_ms", "speech_start_ms", "speech_end_ms")
                assert [getattr(p, a) for a in span] == [getattr(ev, a) for a in span]
                assert np.array_equal(p.audio, ev.audio[: len(p.audio)])
                assert len(ev.audio) - len(p.audio) <= Segmenter.TRAILING_PAD_MS * 16
                checked += 1
        if s.state is SegmenterState.SPEAKING:
            pending.pop(s.utterance_index, None)  # speech resumed: the preview is void
        elif s.trailing_silence_ms >= s.settled_after_ms and s.utterance_index not in pending:
            preview = s.preview()
            assert preview is not None
            pending[s.utterance_index] = preview
    return checked


def test_settled_previews_equal_the_final_utterances_on_a_real_call(speech_dir: Path) -> None:
    (wav,) = sorted((speech_dir / "calls").glob("call_03_*.wav"))
    pcm, _ = read_wav_int16(wav)
    checked = _previews_match_finals(Segmenter(VadConfig()), pcm16_to_float(pcm), 320)
    assert checked == len(json.loads(wav.with_suffix(".json").read_text())["segments"])


@settings(max_examples=60, deadline=None)
@given(spec=st.text(alphabet="..x", min_size=20, max_size=200), seed=st.integers(0, 2**16))
def test_settled_previews_equal_the_final_utterances(spec: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    audio = pattern(spec) + (rng.standard_normal(len(spec) * FRAME) * 1e-3).astype(np.float32)
    cfg = VadConfig(frame_ms=20, start_speech_ms=60, end_silence_ms=500, pre_roll_ms=40)
    _previews_match_finals(Segmenter(cfg, ScriptedDetector()), audio, FRAME)


def test_growing_utterance_carries_its_real_vad_statistics() -> None:
    s = seg()
    assert s.growing() is None
    s.push(pattern("..xxxx.xx"))
    utt = s.growing()
    assert utt is not None and utt.index == 0 and not utt.stats.forced_cut
    assert utt.stats.speech_ms == 120 and utt.stats.trailing_silence_ms == 0
    ev = s.push(pattern("......"))
    final = next(e for e in ev if isinstance(e, Utterance))
    assert final.start_ms == utt.start_ms
    assert np.array_equal(utt.audio, final.audio[: len(utt.audio)])


# --- the boundary refinements and the thresholds ----------------------------------------------


class ConfidenceDetector:
    """A voice model that answers a scripted confidence per frame."""

    def __init__(self, confidences: list[float]) -> None:
        self._it = iter(confidences)

    def voice_confidence(self, frame: npt.NDArray[np.int16]) -> float:
        return next(self._it)


@pytest.mark.parametrize(("silence_threshold", "end_ms"), [(0.35, 300), (0.5, 100)])
def test_hysteresis_keeps_speech_voiced_down_to_the_silence_threshold(
    silence_threshold: float, end_ms: int
) -> None:
    confs = [0.6] * 5 + [0.4] * 10 + [0.1] * 20
    cfg = VadConfig(
        frame_ms=20,
        start_speech_ms=60,
        end_silence_ms=100,
        min_speech_ms=0,
        pre_roll_ms=0,
        silence_threshold=silence_threshold,
        plosive_tail=False,
    )
    events = Segmenter(cfg, ConfidenceDetector(confs)).push(np.zeros(35 * FRAME, np.float32))
    assert [type(e) for e in events] == [SpeechBegin, SpeechEnd, Utterance]
    assert events[0].offset_ms == 0 and events[1].offset_ms == end_ms


@pytest.mark.parametrize(("onset", "begin_ms"), [("on", 180), ("off", 280)])
def test_the_start_moves_back_over_the_loud_frames_before_the_first_voiced_one(
    onset: str, begin_ms: int
) -> None:
    """Silero confirms speech a window or more after it begins; energy says where it began."""
    rng = np.random.default_rng(1)
    audio = (rng.standard_normal(40 * FRAME) * 1e-4).astype(np.float32)
    loud = (rng.standard_normal(8 * FRAME) * 0.02).astype(np.float32)
    for k in range(8):  # frames 6..13: loud but unvoiced to the scripted model
        frame = loud[k * FRAME : (k + 1) * FRAME]
        frame[0] = -0.01
        audio[(6 + k) * FRAME : (7 + k) * FRAME] = frame
    audio[14 * FRAME : 25 * FRAME] = 0.1  # voiced from frame 14 (280 ms)
    cfg = VadConfig(
        frame_ms=20,
        start_speech_ms=60,
        end_silence_ms=100,
        min_speech_ms=0,
        pre_roll_ms=300,
        onset_backtrack=onset,  # type: ignore[arg-type]
    )
    events = Segmenter(cfg, ScriptedDetector()).push(audio)
    begin = next(e for e in events if isinstance(e, SpeechBegin))
    utt = next(e for e in events if isinstance(e, Utterance))
    assert begin.offset_ms == begin_ms == utt.speech_start_ms  # at most ONSET_MS (100) back
    assert (
        utt.start_ms <= utt.speech_start_ms and len(utt.audio) == (utt.end_ms - utt.start_ms) * 16
    )


class LateDetector:
    """A fake voice model that, like primed Silero, judges the first ``held`` frames late."""

    def __init__(self, confidences: list[float], held: int) -> None:
        self._conf = confidences
        self._held = held
        self._n = 0

    def voice_confidence(self, frame: npt.NDArray[np.int16]) -> float:
        self._n += 1
        return float("nan") if self._n <= self._held else self._conf[self._n - 1]

    def late_confidence(self, end_sample: int) -> float:
        assert end_sample % FRAME == 0 and end_sample // FRAME <= self._n - 1
        return self._conf[end_sample // FRAME - 1]


@settings(max_examples=40, deadline=None)
@given(
    spec=st.text(alphabet=".x", min_size=5, max_size=80),
    held=st.integers(0, 20),
    step=st.sampled_from([160, 320, 1000, 4000]),
)
def test_frames_judged_late_give_the_events_of_frames_judged_at_once(
    spec: str, held: int, step: int
) -> None:
    """Held frames are stepped once the model judges them: same states, offsets and audio."""
    rng = np.random.default_rng(len(spec))
    audio = pattern(spec) + (rng.standard_normal(len(spec) * FRAME) * 1e-3).astype(np.float32)
    confs = [0.9 if c == "x" else 0.1 for c in spec]
    cfg = VadConfig(frame_ms=20, start_speech_ms=60, end_silence_ms=100, pre_roll_ms=40)

    def run(detector: object) -> list[object]:
        s = Segmenter(cfg, detector)  # type: ignore[arg-type]
        out: list[object] = []
        for i in range(0, len(audio), step):
            out += s.push(audio[i : i + step])
        return out + s.flush()

    at_once = run(ConfidenceDetector(confs))
    late = run(LateDetector(confs, min(held, len(spec) - 1)))
    assert [_key(e) for e in late] == [_key(e) for e in at_once]


def test_speech_from_the_first_sample_is_not_taken_for_the_noise_floor() -> None:
    """While Silero primes, a frame is "not judged yet", not silence: no floor is learnt from it,
    so the speech at 0 s keeps its start, and its end still refines against the real floor."""
    rng = np.random.default_rng(3)
    audio = (rng.standard_normal(60 * FRAME) * 1e-4).astype(np.float32)
    audio[: 20 * FRAME] += (rng.standard_normal(20 * FRAME) * 0.05).astype(np.float32)
    confs = [0.9] * 20 + [0.1] * 40
    cfg = VadConfig(frame_ms=20, start_speech_ms=60, end_silence_ms=300, pre_roll_ms=300)
    s = Segmenter(cfg, LateDetector(confs, 13))  # 256 ms of priming = 13 frames of 20 ms
    assert s.push(audio[: 13 * FRAME]) == [] and s.offset_ms == 260
    assert s.state is SegmenterState.QUIET
    events = s.push(audio[13 * FRAME :])
    begin = next(e for e in events if isinstance(e, SpeechBegin))
    utt = next(e for e in events if isinstance(e, Utterance))
    assert begin.offset_ms == 0 and utt.start_ms == 0 and utt.speech_end_ms == 400
    assert utt.stats.leading_silence_ms == 0


@pytest.mark.parametrize(
    ("first_voiced", "lead_in_ms", "start_ms"),
    [
        (30, 1000, 0),  # 600 ms into the call: all of it (the pre-roll alone kept from 300 ms)
        (30, 0, 300),  # off: the pre-roll only
        (60, 1000, 900),  # 1.2 s in: past the call's start, the pre-roll only
    ],
)
def test_the_first_utterance_near_the_call_start_keeps_the_audio_from_its_first_sample(
    first_voiced: int, lead_in_ms: int, start_ms: int
) -> None:
    """Speech from 0 s that the model only believes from 0.6 s on loses no word to the pre-roll.

    (LJ001-0006 under line clicks: Silero's first voiced frame at 600 ms, "And" cut off.)
    The reported start is the model's either way; only the audio Whisper gets changes.
    """
    rng = np.random.default_rng(5)
    n = first_voiced + 40
    audio = (rng.standard_normal(n * FRAME) * 0.05).astype(np.float32)  # "speech" throughout
    confs = [0.1] * first_voiced + [0.9] * 20 + [0.1] * 20
    cfg = VadConfig(
        frame_ms=20,
        start_speech_ms=60,
        end_silence_ms=300,
        pre_roll_ms=300,
        call_start_lead_in_ms=lead_in_ms,
        onset_backtrack="off",
    )
    events = Segmenter(cfg, LateDetector(confs, 0)).push(audio)
    begin = next(e for e in events if isinstance(e, SpeechBegin))
    (utt,) = [e for e in events if isinstance(e, Utterance)]
    assert begin.offset_ms == utt.speech_start_ms == first_voiced * 20
    assert utt.start_ms == start_ms
    assert len(utt.audio) == (utt.end_ms - utt.start_ms) * 16
    np.testing.assert_array_equal(utt.audio[: 10 * FRAME], audio[start_ms * 16 :][: 10 * FRAME])
    assert utt.stats.leading_silence_ms == first_voiced * 20 - start_ms


def test_only_the_first_utterance_takes_the_call_start_lead_in() -> None:
    cfg = VadConfig(
        frame_ms=20, start_speech_ms=60, end_silence_ms=100, pre_roll_ms=40, min_speech_ms=0
    )
    audio = pattern("....xxxx......xxxx......")
    first, second = [
        e for e in Segmenter(cfg, ScriptedDetector()).push(audio) if isinstance(e, Utterance)
    ]
    off = cfg.model_copy(update={"call_start_lead_in_ms": 0})
    first_off, second_off = [
        e for e in Segmenter(off, ScriptedDetector()).push(audio) if isinstance(e, Utterance)
    ]
    assert (first.start_ms, first_off.start_ms) == (0, 40)  # 80 ms in: from the first sample
    assert second.start_ms == second_off.start_ms > 200  # the second: its pre-roll only
    np.testing.assert_array_equal(second.audio, second_off.audio)


def _tone(ms: int, dbfs: float) -> np.ndarray:
    t = np.arange(16 * ms) / 16000.0
    return (10 ** (dbfs / 20) * np.sin(2 * np.pi * 300 * t)).astype(np.float32)


def _loud_trace(
    speech_dbfs: float, tail_dbfs: float
) -> tuple[list[tuple[int, int, int]], list[Utterance]]:
    """(quiet_ms, trailing_silence_ms, loud_end_ms) after each frame of 1 s of speech, then a
    200 ms tail the (lagging) voice model still hears, then silence; and the utterances."""
    from voxgate.gateway.testing.fake_engines import EnergyVoiceDetector  # noqa: PLC0415

    s = Segmenter(VadConfig(**{**SCRIPTED, "end_silence_ms": 200}), EnergyVoiceDetector(-60.0))
    audio = np.concatenate(
        [np.zeros(16 * 300, np.float32), _tone(1000, speech_dbfs), _tone(200, tail_dbfs)]
        + [np.zeros(16 * 400, np.float32)]
    )
    trace, utts = [], []
    for i in range(0, len(audio), FRAME):
        utts += [e for e in s.push(audio[i : i + FRAME]) if isinstance(e, Utterance)]
        trace.append((s.quiet_ms, s.trailing_silence_ms, s.loud_end_ms))
    return trace, utts


def test_quiet_counts_from_the_last_loud_frame_while_the_model_still_hears_the_tail() -> None:
    """A tail 40 dB under the speech that the voice model hears as voice (Silero's lag): the
    silence the final decode reads (quiet_ms) runs from the end of the loud speech through
    the tail, while the model's own silence (trailing_silence_ms) has not started; the
    utterance still reports the tail as speech and carries its loud end."""
    trace, utts = _loud_trace(-10.0, -50.0)
    # Frames 65-74 are the tail (1.3-1.5 s); its first frame holds the step down from the
    # speech (loud on the tilted level), so the quiet starts with the second.
    in_tail = trace[65:75]
    assert [q for q, _, _ in in_tail] == list(range(0, 200, 20))
    assert all(silent == 0 and loud_end == 1320 for _, silent, loud_end in in_tail)
    assert len(utts) == 1
    assert utts[0].loud_end_ms == 1320 and utts[0].speech_end_ms >= 1500


def test_a_tail_within_the_loud_range_is_not_quiet() -> None:
    """The same tail 20 dB under quieter speech (-30 dBFS) may be a word: quiet_ms stays 0."""
    trace, utts = _loud_trace(-30.0, -50.0)
    assert all(q == 0 for q, _, _ in trace[20:75])
    assert utts[0].loud_end_ms == 1500  # the end of the tail


def _noise(rng: np.random.Generator, frames: int, dbfs: float) -> npt.NDArray[np.float32]:
    return (rng.standard_normal(frames * FRAME) * 10 ** (dbfs / 20)).astype(np.float32)


@pytest.mark.parametrize("digital_lead_ms", [0, 500, 3000])
def test_an_utterance_ends_at_its_words_whether_or_not_the_call_began_in_digital_silence(
    digital_lead_ms: int,
) -> None:
    """Line noise 26 dB under the words, 240 ms of it before them, the voice model hearing the
    first 100 ms of it after them (Silero's lag). After digital silence (a bridge's zeros
    before the caller is connected) the floor used to climb out at its slow rate and stood
    30 dB under the noise, so the noise after the words counted as their unvoiced tail and the
    utterance, its loud end with it, ran 300 ms past them (the final decode started there)."""
    rng = np.random.default_rng(7)
    lead = digital_lead_ms // 20
    audio = np.concatenate(
        [np.zeros(lead * FRAME, np.float32), _noise(rng, 12, -40.0), _noise(rng, 50, -14.0)]
        + [_noise(rng, 30, -40.0)]
    )
    confs = [0.0] * (lead + 12) + [0.9] * 55 + [0.0] * 25
    s = Segmenter(VadConfig(**{**SCRIPTED, "end_silence_ms": 200}), ConfidenceDetector(confs))
    utts = [e for e in s.push(audio) if isinstance(e, Utterance)]
    words_end = digital_lead_ms + 240 + 1000
    assert len(utts) == 1
    assert utts[0].speech_end_ms == words_end
    assert utts[0].loud_end_ms == words_end


@pytest.mark.parametrize("digital_lead_ms", [500, 3000])
def test_a_word_onset_out_of_digital_silence_is_not_taken_for_the_line_noise(
    digital_lead_ms: int,
) -> None:
    """A word that starts straight out of digital silence climbs 10-12 dB a frame before the
    voice model is sure of it. Those frames are unvoiced and real, but not the line's noise:
    only frames that hold one level teach the floor, so the onset still reads as loud against
    the zeros and the utterance starts on its first frame (JFK's lone "not" lost its onset,
    and its text, to a floor that took them)."""
    rng = np.random.default_rng(7)
    lead = digital_lead_ms // 20
    onset = [_noise(rng, 1, dbfs) for dbfs in (-60.0, -48.0, -36.0, -26.0)]
    audio = np.concatenate(
        [np.zeros(lead * FRAME, np.float32), *onset, _noise(rng, 40, -14.0)]
        + [np.zeros(30 * FRAME, np.float32)]
    )
    confs = [0.0] * (lead + 4) + [0.9] * 40 + [0.0] * 30
    s = Segmenter(VadConfig(**{**SCRIPTED, "end_silence_ms": 200}), ConfidenceDetector(confs))
    utts = [e for e in s.push(audio) if isinstance(e, Utterance)]
    assert len(utts) == 1
    assert utts[0].speech_start_ms == digital_lead_ms


def test_a_floor_out_of_digital_silence_still_learns_noise_that_never_holds_its_level() -> None:
    """Line noise that swings 10 dB from frame to frame never holds one level for three frames,
    so the floor never jumps to it; it must still learn it at the slow rate, as on any line.
    A floor left at digital silence would read every frame of that noise before the words as
    their onset and start the utterance 100 ms early."""
    rng = np.random.default_rng(7)
    swinging = np.concatenate([_noise(rng, 1, -40.0 if i % 2 else -50.0) for i in range(100)])
    words = _noise(rng, 40, -14.0)
    starts = []
    for lead in (0, 25):
        audio = np.concatenate([np.zeros(lead * FRAME, np.float32), swinging, words])
        confs = [0.0] * (lead + 100) + [0.9] * 40
        s = Segmenter(VadConfig(**SCRIPTED), ConfidenceDetector(confs))
        events = s.push(audio)
        begin = next(e for e in events if isinstance(e, SpeechBegin))
        starts.append(begin.offset_ms - lead * 20)
    assert starts[1] == starts[0]


class ModelThresholdsOnly(Segmenter):
    """The voice model's thresholds alone decide the onset (no loudness tie-break)."""

    SPEECH_PEAK_DB = None


@pytest.mark.parametrize(
    ("word_dbfs", "word_conf", "starts"),
    [
        (-12.0, 0.4, True),  # JFK's shouted "ask": as loud as the words, the model unsure
        (-35.0, 0.4, False),  # a breath the model leans towards: 23 dB under the words
        (-12.0, 0.2, False),  # a door slam: as loud as the words, the model says no
    ],
)
def test_a_word_as_loud_as_the_callers_words_starts_speech_where_the_model_is_unsure(
    word_dbfs: float, word_conf: float, starts: bool
) -> None:
    """Crowd noise at -40 dBFS, a sure sentence at -10 dBFS, noise, then 400 ms the model
    reads between its thresholds (0.35-0.5): it is an utterance when it is as loud as the
    caller's words (and far over the floor), as it is not with the model's thresholds alone."""
    rng = np.random.default_rng(3)
    audio = np.concatenate(
        [_noise(rng, 25, -40.0), _noise(rng, 50, -10.0), _noise(rng, 45, -40.0)]
        + [_noise(rng, 20, word_dbfs), _noise(rng, 40, -40.0)]
    )
    confs = [0.02] * 25 + [0.9] * 50 + [0.02] * 45 + [word_conf] * 20 + [0.02] * 40
    cfg = VadConfig(**{**SCRIPTED, "end_silence_ms": 200})
    begins = [
        e.offset_ms
        for e in Segmenter(cfg, ConfidenceDetector(confs)).push(audio)
        if isinstance(e, SpeechBegin)
    ]
    plain = [
        e.offset_ms
        for e in ModelThresholdsOnly(cfg, ConfidenceDetector(confs)).push(audio)
        if isinstance(e, SpeechBegin)
    ]
    assert plain == [500]
    assert begins == ([500, 2400] if starts else [500])


def test_the_loudness_tie_break_never_keeps_an_utterance_going() -> None:
    """Once the model's confidence has fallen under silence_threshold, loud frames it reads
    between its thresholds do not bring the utterance back: it ends as the model says (the
    tie-break is for onsets only)."""
    rng = np.random.default_rng(5)
    audio = np.concatenate([_noise(rng, 25, -40.0), _noise(rng, 60, -10.0), _noise(rng, 40, -40.0)])
    confs = [0.02] * 25 + [0.9] * 40 + [0.2] + [0.4] * 19 + [0.02] * 40
    cfg = VadConfig(**{**SCRIPTED, "end_silence_ms": 200})
    ends = [
        e.offset_ms
        for seg_cls in (Segmenter, ModelThresholdsOnly)
        for e in seg_cls(cfg, ConfidenceDetector(confs)).push(audio)
        if isinstance(e, SpeechEnd)
    ]
    # The model's last voiced frame ends at 1.3 s; loud frames after it count as its tail
    # (TAIL_MS) until the hangover ends the utterance.
    assert ends == [1500, 1500]


def test_the_loudness_tie_break_waits_for_a_word_the_model_was_sure_of() -> None:
    """Before the caller's first sure frame there is nothing to be as loud as: a canceller's
    residue of the bot's reply, loud over the line's floor and read at 0.4, opens nothing."""
    rng = np.random.default_rng(4)
    audio = np.concatenate([_noise(rng, 25, -60.0), _noise(rng, 40, -25.0), _noise(rng, 25, -60.0)])
    confs = [0.02] * 25 + [0.4] * 40 + [0.02] * 25
    cfg = VadConfig(**{**SCRIPTED, "end_silence_ms": 200})
    events = Segmenter(cfg, ConfidenceDetector(confs)).push(audio)
    assert not [e for e in events if isinstance(e, SpeechBegin)]
