"""The VAD segmenter: a pure state machine that turns a call's audio into utterances.

Frames go in, events come out. Configuration is in milliseconds; internally everything counts
frames, so the machine is exact and the same events come out however the audio was chunked.

States: ``QUIET`` (no speech; a pre-roll ring buffer keeps recent audio) → ``STARTING`` (voiced
frames seen, not yet enough) → ``SPEAKING`` → ``STOPPING`` (silence seen, hangover running) →
``QUIET``. A forced cut finalises an utterance at ``max_utterance_ms``.

The voice model sits behind :class:`VoiceDetector` (``vad.model``): Silero by default (a small
network that tells speech from hum, hiss, clicks and tones), webrtcvad as the cheap option.
Energy refines the model's boundaries: the start moves back over the loud frames just before
Silero's first voiced frame, a loud unvoiced frame just after speech (a final plosive) extends
its end, and voiced frames at the end that hold nothing but line noise (Silero's lag) are
taken off the reported end. While Silero primes on the first 256 ms of a call its frames are
held, not judged silent, and stepped once it can judge them. In-band DTMF tones never get
here: :mod:`voxgate.gateway.dtmf` silences them first.

Each :class:`Utterance` carries its audio (pre-roll and a little trailing silence included, which
Whisper transcribes better than a hard cut) and its :class:`~voxgate.engines.base.UtteranceStats`,
which feed the silence-aware decoding policy.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import webrtcvad

from voxgate.engines.base import ASR_SAMPLE_RATE_HZ, FloatArray, UtteranceStats
from voxgate.engines.vad import SileroVad
from voxgate.gateway.config import VadConfig

__all__ = [
    "Segmenter",
    "SegmenterEvent",
    "SegmenterState",
    "SpeechBegin",
    "SpeechEnd",
    "LateVoiceDetector",
    "Utterance",
    "VoiceDetector",
    "WebRtcVoiceDetector",
    "make_detector",
]


class VoiceDetector(Protocol):
    """The seam for the voice model: one frame of int16 samples in, a confidence in [0, 1] out."""

    def voice_confidence(self, frame: npt.NDArray[np.int16]) -> float:
        """How likely the frame holds speech."""
        ...


@runtime_checkable
class LateVoiceDetector(VoiceDetector, Protocol):
    """A voice model that may answer NaN ("not judged yet") and judge those frames later.

    Silero primes its state on the call's first 256 ms before it judges any of them; a frame
    it has not judged is neither speech nor silence, so the segmenter holds it until
    :meth:`late_confidence` can answer for it.
    """

    def late_confidence(self, end_sample: int) -> float:
        """The confidence for the frame that ended at ``end_sample`` (16 kHz, call start 0)."""
        ...


class WebRtcVoiceDetector:
    """webrtcvad (GMM, ~10 µs a frame) behind :class:`VoiceDetector`; answers 0.0 or 1.0."""

    def __init__(self, aggressiveness: int, sample_rate_hz: int = ASR_SAMPLE_RATE_HZ) -> None:
        self._vad = webrtcvad.Vad(aggressiveness)
        self._rate = sample_rate_hz

    def voice_confidence(self, frame: npt.NDArray[np.int16]) -> float:
        """Return 1.0 for a voiced frame, else 0.0."""
        return 1.0 if self._vad.is_speech(frame.tobytes(), self._rate) else 0.0


def make_detector(config: VadConfig) -> VoiceDetector:
    """A fresh per-call voice model as ``config.model`` names it.

    Silero's network is loaded once per process and shared (its session is thread-safe); each
    call gets its own LSTM state and window buffer. The segmenter always runs at 16 kHz (8 kHz
    lines are upsampled at the edge), which is the one rate the shipped Silero export takes.
    """
    if config.model == "silero":
        return SileroVad.load().stream()
    return WebRtcVoiceDetector(config.aggressiveness)


class SegmenterState(enum.Enum):
    """Where the state machine is."""

    QUIET = "quiet"
    STARTING = "starting"
    SPEAKING = "speaking"
    STOPPING = "stopping"


@dataclass(frozen=True, slots=True)
class SpeechBegin:
    """The caller started speaking at ``offset_ms`` (first voiced frame) of the call's audio."""

    offset_ms: int
    utterance_index: int


@dataclass(frozen=True, slots=True)
class SpeechEnd:
    """The caller stopped speaking at ``offset_ms`` (end of the last voiced frame)."""

    offset_ms: int
    utterance_index: int


@dataclass(frozen=True, slots=True)
class Utterance:
    """A finished utterance, ready for recognition.

    Attributes:
        index: counter within the call, shared with the speech events.
        audio: float32 mono 16 kHz samples from ``start_ms`` to ``end_ms``.
        start_ms: call offset of ``audio[0]`` (pre-roll included).
        end_ms: call offset just past ``audio[-1]``.
        speech_start_ms: first voiced frame (the ``SPEECH_BEGIN`` offset).
        speech_end_ms: end of the last voiced frame (the ``SPEECH_END`` offset).
        stats: what the VAD measured; feeds the decoding policy.
        dropped: True when shorter than ``min_speech_ms`` (announced but not transcribed).
        loud_end_ms: end of its last *loud* speech frame (see ``Segmenter.LOUD_REL_DB``), at
            most ``speech_end_ms``; 0 where unknown. A decode that got the audio up to here
            got every word: what follows is the fading tail the segmenter still counts.
    """

    index: int
    audio: FloatArray
    start_ms: int
    end_ms: int
    speech_start_ms: int
    speech_end_ms: int
    stats: UtteranceStats
    dropped: bool = False
    loud_end_ms: int = 0


SegmenterEvent = SpeechBegin | SpeechEnd | Utterance

_EMPTY = np.zeros(0, dtype=np.float32)


class Segmenter:
    """Segments one call's 16 kHz float32 audio into utterances. Not thread-safe; no I/O.

    Args:
        config: VAD and endpointing settings (ms).
        detector: the voice model; by default the one ``config.model`` names
            (:func:`make_detector`).
    """

    #: Unvoiced frames tolerated inside STARTING before it falls back to QUIET, in ms.
    START_GAP_MS = 120
    #: Trailing silence kept on an utterance's audio (if the hangover provides it), in ms.
    TRAILING_PAD_MS = 200
    #: Every energy test reads two levels per frame against their own noise floors: the
    #: *tilted* one (first difference, +6 dB/octave), where fricatives and plosive bursts
    #: stand out of low-frequency line noise, and the *plain* one, where vowels, nasals and
    #: low-frequency word endings do. A frame "stands above the floor" when either does.
    #:
    #: webrtcvad misses final plosives and soft word endings ("interes-t"): an unvoiced frame this
    #: many dB above the call's noise floor, within TAIL_MS of the last voiced frame, still counts
    #: as the end of speech (on Silero too: "go forward ten meters" ends 300 ms early without
    #: the plain level, where its last 300 ms are, on ``calls/``).
    TAIL_DB = 8.0
    TAIL_MS = 300
    #: Silero answers per 32 ms window and needs part of a word before it is sure, so its first
    #: voiced frame comes 40-120 ms after the energy onset. Once it has confirmed speech, the
    #: start moves back over the frames just before it that stand this many dB above the noise
    #: floor, at most ONSET_MS: the model decides *whether* it is speech, energy says *where*.
    #: ("In the valley" begins 81 ms late on the tilted level alone: its vowel is all plain.)
    ONSET_DB = 6.0
    ONSET_MS = 100
    #: The same at the end: Silero's probability stays up for a window or more after the last
    #: word, so its last voiced frame can lie 100-200 ms past it. Once the hangover has
    #: declared the end, the end moves back over the voiced frames at its end where neither
    #: level stands END_DB above its floor (nothing but line noise), at most END_MS. Only the
    #: reported end moves: the audio, its voiced flags and the hangover are the model's
    #: (Whisper keeps its context and the final comes no later). Measured on ``calls/`` by
    #: benchmarks/ear.py: 3-5 dB give the same worst ends; 2 dB leaves one 176 ms late.
    END_DB = 4.0
    END_MS = 160
    #: A speech frame (voiced, or the energetic tail) is *loud* when either level stands
    #: within this many dB of the utterance's loudest voiced frame on that level. On a clean
    #: recording the call's noise floor is 50-65 dB under the speech, so the fading tail of
    #: the last word stands above it (and so counts as speech) for 100-250 ms after the
    #: words: the shared clips' last frame within 30 dB of their peak lies 0-160 ms after
    #: their last frame above -40 dBFS, their reported end 120-220 ms after it. The reported
    #: end stays where it is; only the final decode may start from the loud end
    #: (:attr:`quiet_ms`), since nothing after it is a word.
    LOUD_REL_DB = 30.0
    #: The voice model decides whether a frame is speech. Out of quiet (the onset of an
    #: utterance, QUIET or STARTING), a frame it leans towards (at least silence_threshold,
    #: under speech_threshold) counts as voiced when it is as loud as the caller's words:
    #: within SPEECH_PEAK_DB of the loudest frame the model was sure of on this call (plain
    #: level) and SPEECH_OVER_FLOOR_DB over the call's noise floor. Silero read JFK's shouted
    #: "ask", 0.4 s alone between stretches of crowd noise at -11 dBFS, at 0.37-0.54 on a line
    #: noisy from its first frame (0.49-0.61 after 500 ms of zeros: its state remembers the
    #: opening): under 0.5 for most of its frames, so the word never became an utterance and
    #: the turn ended in the pause before it. Breaths, lip noise and a line's noise lie 30 dB
    #: and more under the words, and the model must still lean towards speech. Not before
    #: the model has been sure of a frame of the call: there is nothing to be as loud as, and
    #: on the floor test alone the echo of the bot's reply that a canceller leaves on a line
    #: where the caller has not spoken yet opened an utterance (tests/test_benchmarks_barge_in
    #: .py, the loaded line through gate_aec3). It never keeps a voiced run going: where an
    #: utterance ends stays the model's (with hysteresis). None: off (the model's thresholds
    #: only).
    SPEECH_PEAK_DB: float | None = 10.0
    SPEECH_OVER_FLOOR_DB = 20.0
    #: Digital silence: a frame whose levels both stand under this (about three steps of
    #: 16-bit audio) is no line's noise but its absence: the zeros a bridge or media stream
    #: sends before the caller is connected, a muted phone, a benchmark's lead-in. A floor
    #: learnt there (-120 dB) climbed out at the floor's slow rate, so 240 ms of a caller's
    #: line noise before the first word left it 30-40 dB under that noise; the hum after the
    #: words then stood TAIL_DB over it and counted as speech for TAIL_MS, so the final decode
    #: started on the hum's end, not the words'. So between utterances, after digital silence,
    #: the floor rises at once to the quietest of FLOOR_RISE_FRAMES unvoiced frames of real
    #: audio in a row whose levels lie within FLOOR_STEADY_DB of each other: a line's noise
    #: holds its level. Not in the quiet right after words (a word fading into digital
    #: silence, as a noise gate or a synthetic voice leaves it, is the word's tail), and not
    #: on a climbing onset (a word's first frames out of silence rise 10 dB a frame before
    #: the voice model is sure of them; taken for the floor, they moved the start and lost
    #: a lone short word's text).
    DIGITAL_SILENCE_DB = -80.0
    FLOOR_RISE_FRAMES = 3
    FLOOR_STEADY_DB = 3.0

    def __init__(self, config: VadConfig, detector: VoiceDetector | None = None) -> None:
        self.config = config
        self._detector = detector or make_detector(config)
        self._on = config.speech_threshold
        self._off = config.silence_threshold
        self._was_voiced = False
        # Added for webrtcvad on μ-law; measured with silero by benchmarks/ear.py: it still pays.
        self._tail_db = self.TAIL_DB if config.plosive_tail else math.inf
        onset = config.onset_backtrack
        self._onset_frames = (
            self.ONSET_MS // config.frame_ms
            if onset == "on" or (onset == "auto" and config.model == "silero")
            else 0
        )
        self._recent_db: deque[float] = deque(maxlen=self._onset_frames + 1)
        self._recent_pdb: deque[float] = deque(maxlen=self._onset_frames + 1)
        end = config.end_refine
        self._end_back_frames = (
            self.END_MS // config.frame_ms
            if end == "on" or (end == "auto" and config.model == "silero")
            else 0
        )
        self.frame_len = ASR_SAMPLE_RATE_HZ * config.frame_ms // 1000
        fm = config.frame_ms
        self._start_frames = max(1, math.ceil(config.start_speech_ms / fm))
        self._start_gap_frames = max(1, math.ceil(self.START_GAP_MS / fm))
        self._end_frames = max(1, math.ceil(config.end_silence_ms / fm))
        self._min_speech_frames = math.ceil(config.min_speech_ms / fm)
        self._max_frames = max(self._start_frames + 1, config.max_utterance_ms // fm)
        self._pre_roll_frames = config.pre_roll_ms // fm
        self._pad_frames = self.TRAILING_PAD_MS // fm
        # Every frame of the call's first call_start_lead_in_ms, until its first utterance
        # begins: that utterance's lead-in when it starts within them (None once it cannot).
        self._head_frames = config.call_start_lead_in_ms // fm
        self._head: list[FloatArray] | None = [] if self._head_frames else None
        self._tail_frames = self.TAIL_MS // fm
        self._noise_db: float | None = None  # running noise floor of the call (unvoiced frames)
        self._noise_pdb: float | None = None  # the same on the plain level
        # Unvoiced frames of real audio in a row while the floor is digital silence (levels).
        self._rise: list[tuple[float, float]] = []
        self._end_floors: tuple[float | None, float | None] = (None, None)
        self._last_energetic = -1  # index in _frames of the last unvoiced-but-loud tail frame
        self._last_loud = -1  # index in _frames of the last loud speech frame (LOUD_REL_DB)
        self._peak_db = -math.inf  # loudest voiced frame of the utterance, tilted level
        self._peak_pdb = -math.inf  # and plain level
        # Loudest frame of the call that the voice model was sure of (plain level).
        self._speech_peak_pdb = -math.inf
        self._last_sample = 0.0  # for the first difference across push() boundaries
        # Frames the voice model has not judged yet (NaN), with their energy: the start of a
        # call while Silero primes. They are stepped once it can judge them (_replay_held).
        self._held: list[tuple[FloatArray, float, float]] = []
        self._late = self._detector if isinstance(self._detector, LateVoiceDetector) else None

        self.state = SegmenterState.QUIET
        self._pending = _EMPTY  # samples not yet forming a whole frame
        self._frame_index = 0  # index of the next frame to be processed
        # Room for the onset backtrack too, so that frames it claims do not shorten the
        # pre-roll (Whisper read "in football" as "and suitable" with 40 ms less lead-in).
        self._pre_roll: deque[FloatArray] = deque(
            maxlen=max(1, self._pre_roll_frames + self._onset_frames)
        )
        self._utt_index = 0
        # Current candidate/utterance: frames since the first voiced frame, their voiced flags.
        self._frames: list[FloatArray] = []
        self._voiced: list[bool] = []
        self._dbs: list[float] = []  # each frame's plain level, dB
        self._tdbs: list[float] = []  # and its tilted level (first difference), dB
        self._lead: list[FloatArray] = []  # pre-roll frames captured at STARTING
        self._start_frame = 0
        self._voiced_count = 0
        self._unvoiced_run = 0
        self._last_voiced = 0
        self._last_energetic = -1

    # -- public API ------------------------------------------------------------------------------

    @property
    def offset_ms(self) -> int:
        """Call time consumed so far, in ms (whole frames only; frames still held count)."""
        return (self._frame_index + len(self._held)) * self.config.frame_ms

    @property
    def voiced_ms(self) -> int:
        """Voiced time of the utterance in progress so far (0 while quiet), in ms.

        What the recogniser's ``min_speech_ms`` skip reads, so the session can start the first
        interim over an ``after_words`` reply the moment it is worth decoding, without building
        the utterance's audio to find out.
        """
        if self.state is SegmenterState.QUIET:
            return 0
        return self._voiced_count * self.config.frame_ms

    @property
    def utterance_index(self) -> int:
        """Index the current (or next) utterance has."""
        return self._utt_index

    def push(self, samples: FloatArray) -> list[SegmenterEvent]:
        """Feed 16 kHz float32 samples of any length; return the events they complete."""
        if len(self._pending):
            samples = np.concatenate([self._pending, samples])
        n_frames = len(samples) // self.frame_len
        used = n_frames * self.frame_len
        self._pending = samples[used:].copy()
        if n_frames == 0:
            return []
        frames = samples[:used].reshape(n_frames, self.frame_len)
        # One vectorised conversion per push instead of per frame (hot path).
        pcm = np.clip(np.rint(frames * 32768.0), -32768, 32767).astype(np.int16)
        # Tail detection runs on the first difference (a +6 dB/octave tilt): final plosives and
        # fricatives are high-frequency while line noise is mostly low-frequency (pink/brown),
        # which lifts a μ-law "t" burst ~9 dB above the floor instead of ~4 dB.
        flat = samples[:used]
        diff = np.diff(flat, prepend=np.float32(self._last_sample)).reshape(n_frames, -1)
        self._last_sample = float(flat[-1])
        power = np.mean(np.square(diff, dtype=np.float64), axis=1)
        frame_db = 10.0 * np.log10(np.maximum(power, 1e-12))
        # The plain level too: a voiced word ending ("ten meter-s" fading, a nasal) is mostly
        # low-frequency, which the tilt hides; the end refinement reads this one.
        plain = np.mean(np.square(frames, dtype=np.float64), axis=1)
        frame_pdb = 10.0 * np.log10(np.maximum(plain, 1e-12))
        events: list[SegmenterEvent] = []
        for i in range(n_frames):
            conf = self._detector.voice_confidence(pcm[i])
            if math.isnan(conf):
                self._held.append((frames[i], float(frame_db[i]), float(frame_pdb[i])))
                continue
            if self._held:
                self._replay_held(events)
            self._judge(frames[i], conf, float(frame_db[i]), float(frame_pdb[i]), events)
        return events

    def _judge(
        self,
        frame: FloatArray,
        conf: float,
        db: float,
        pdb: float,
        events: list[SegmenterEvent],
    ) -> None:
        # Hysteresis: a voiced run ends below silence_threshold, starts at speech_threshold.
        voiced = conf >= (self._off if self._was_voiced else self._on)
        if conf >= self._on:
            self._speech_peak_pdb = max(self._speech_peak_pdb, pdb)
        elif (
            not voiced
            and conf >= self._off
            and self.state in (SegmenterState.QUIET, SegmenterState.STARTING)
            and self._as_loud_as_speech(pdb)
        ):
            voiced = True
        self._was_voiced = voiced
        self._recent_db.append(db)
        self._recent_pdb.append(pdb)
        self._step(frame, voiced, db, pdb, events)
        self._frame_index += 1

    def _as_loud_as_speech(self, pdb: float) -> bool:
        """Whether a frame is as loud as the caller's words, far over the floor (plain level)."""
        floor = self._noise_pdb
        return (
            self.SPEECH_PEAK_DB is not None
            and floor is not None
            and math.isfinite(self._speech_peak_pdb)
            and pdb >= self._speech_peak_pdb - self.SPEECH_PEAK_DB
            and pdb >= floor + self.SPEECH_OVER_FLOOR_DB
        )

    def _replay_held(self, events: list[SegmenterEvent], *, final: bool = False) -> None:
        """Step the frames the model had not judged, now that it can (or, at ``final``, as silence).

        Nothing happened while they were held (the machine stays QUIET and learns no noise
        floor from them), so stepping them now gives the same states and offsets as judging
        them on arrival would, only later: a caller who speaks from the first sample of the
        call gets the start and the pre-roll of that speech instead of a noise floor measured
        on it.
        """
        held, self._held = self._held, []
        for frame, db, pdb in held:
            end = (self._frame_index + 1) * self.frame_len
            conf = 0.0 if final or self._late is None else self._late.late_confidence(end)
            self._judge(frame, conf, db, pdb, events)

    def flush(self) -> list[SegmenterEvent]:
        """End of the call's audio: finalise an utterance in progress, drop a partial frame."""
        events: list[SegmenterEvent] = []
        if self._held:
            self._replay_held(events, final=True)
        if self.state in (SegmenterState.SPEAKING, SegmenterState.STOPPING):
            self._finalise(events, forced=False)
        self._reset_to_quiet(keep_tail=False)
        self._pending = _EMPTY
        return events

    def growing(self) -> Utterance | None:
        """The utterance so far (all its audio, real VAD statistics), for interim decodes."""
        if self.state not in (SegmenterState.SPEAKING, SegmenterState.STOPPING):
            return None
        utt = self._build(forced=True)[0]
        return replace(utt, stats=replace(utt.stats, forced_cut=False))

    # -- the state machine -----------------------------------------------------------------------

    def _step(
        self,
        frame: FloatArray,
        voiced: bool,
        db: float,
        pdb: float,
        events: list[SegmenterEvent],
    ) -> None:
        st = self.state
        if self._head is not None:
            if st is SegmenterState.QUIET and self._frame_index > self._head_frames:
                self._head = None
            else:
                self._head.append(frame)
        if not voiced and st is not SegmenterState.SPEAKING:
            self._learn_floor(db, pdb, between=st is SegmenterState.QUIET)
        else:
            self._rise.clear()
        if st is SegmenterState.QUIET:
            if voiced:
                self.state = SegmenterState.STARTING
                lead = list(self._pre_roll)
                back = self._onset_back(len(lead))
                rest = lead[: len(lead) - back]
                # max(0, ...): within the first pre_roll_ms of a call the ring holds fewer
                # frames, and a negative start kept only the last few of them (speech at
                # 0.28 s of a call got 20 ms of lead-in and lost its first word).
                self._lead = (
                    rest[max(0, len(rest) - self._pre_roll_frames) :]
                    if self._pre_roll_frames
                    else []
                )
                self._pre_roll.clear()
                self._start_frame = self._frame_index - back
                if self._head is not None and self._start_frame <= self._head_frames:
                    # Speech at the call's start: Silero, primed on nothing, read LJ001-0006's
                    # "And it is" from 0 s as 0.3-0.57 (0.26-0.34 under line clicks), so its
                    # first voiced frame came at 0.6 s and the 300 ms pre-roll cut "And" off
                    # what Whisper got; the call's first second has no earlier speech to lose.
                    self._lead = self._head[: self._start_frame]
                self._frames = [*lead[len(lead) - back :], frame]
                self._voiced = [False] * back + [True]
                self._dbs = list(self._recent_pdb)[-(back + 1) :]
                self._tdbs = list(self._recent_db)[-(back + 1) :]
                self._voiced_count = 1
                self._unvoiced_run = 0
                self._last_voiced = back
                self._end_floors = (self._noise_db, self._noise_pdb)
                self._last_energetic = -1
                self._peak_db, self._peak_pdb = db, pdb
                self._last_loud = back
                self._maybe_begin(events)
            else:
                self._pre_roll.append(frame)
            return

        self._frames.append(frame)
        self._voiced.append(voiced)
        self._dbs.append(pdb)
        self._tdbs.append(db)
        if voiced:
            self._voiced_count += 1
            self._unvoiced_run = 0
        else:
            self._unvoiced_run += 1

        if st is SegmenterState.STARTING:
            self._track_loud(voiced, db, pdb)
            if voiced:
                self._maybe_begin(events)
            elif self._unvoiced_run >= self._start_gap_frames:
                # A blip, not speech: its frames become pre-roll for whatever comes next.
                frames = self._lead + self._frames
                self._reset_to_quiet(keep_tail=False)
                for f in frames[-self._pre_roll.maxlen :] if self._pre_roll.maxlen else []:
                    self._pre_roll.append(f)
            return

        if voiced:
            self._last_voiced = len(self._frames) - 1
            # The floors the end refinement reads: those of the moment the last word was
            # heard, so that the hangover's frames (which go on teaching the floor) cannot
            # move an end the settled preview already reported.
            self._end_floors = (self._noise_db, self._noise_pdb)
        elif (
            self._noise_db is not None
            and self._noise_pdb is not None
            and (db >= self._noise_db + self._tail_db or pdb >= self._noise_pdb + self._tail_db)
            and len(self._frames) - 1 - self._last_voiced <= self._tail_frames
        ):
            self._last_energetic = len(self._frames) - 1
        self._track_loud(voiced, db, pdb)
        if st is SegmenterState.SPEAKING and not voiced:
            self.state = SegmenterState.STOPPING
        elif st is SegmenterState.STOPPING and voiced:
            self.state = SegmenterState.SPEAKING

        if self.state is SegmenterState.STOPPING and self._unvoiced_run >= self._end_frames:
            self._finalise(events, forced=False)
        elif len(self._frames) >= self._max_frames:
            self._finalise(events, forced=True)

    def _learn_floor(self, db: float, pdb: float, *, between: bool) -> None:
        """Teach the call's noise floor an unvoiced frame's two levels.

        An EMA that tracks down fast and up slowly: a floor, not an average. Out of digital
        silence, between utterances (``between``), it rises at once to the quietest of the
        first steady frames of real audio (:attr:`DIGITAL_SILENCE_DB`).
        """
        if self._noise_db is None or self._noise_pdb is None:
            self._noise_db, self._noise_pdb = db, pdb
            return
        digital = self.DIGITAL_SILENCE_DB
        if between and max(self._noise_db, self._noise_pdb) < digital and max(db, pdb) >= digital:
            self._rise.append((db, pdb))
            del self._rise[: -self.FLOOR_RISE_FRAMES]
            spread = max(max(lv) - min(lv) for lv in zip(*self._rise, strict=True))
            if len(self._rise) >= self.FLOOR_RISE_FRAMES and spread <= self.FLOOR_STEADY_DB:
                self._noise_db = min(d for d, _ in self._rise)
                self._noise_pdb = min(p for _, p in self._rise)
                self._rise.clear()
                return
            # Not steady (yet): learn as on any line, so noise that never holds its level
            # for three frames still lifts the floor at the slow rate.
        else:
            self._rise.clear()
        alpha = 0.3 if db < self._noise_db else 0.05
        self._noise_db += alpha * (db - self._noise_db)
        alpha = 0.3 if pdb < self._noise_pdb else 0.05
        self._noise_pdb += alpha * (pdb - self._noise_pdb)

    def _onset_back(self, available: int) -> int:
        """Frames of pre-roll before this first voiced frame that belong to the speech onset."""
        if not self._onset_frames or self._noise_db is None:
            return 0
        floor = self._noise_db + self.ONSET_DB
        pfloor = (self._noise_pdb or 0.0) + self.ONSET_DB
        # The frames before the current one, oldest first, on both levels: a fricative onset
        # shows on the tilted one, a vowel onset ("In the valley") on the plain one first.
        dbs = list(zip(self._recent_db, self._recent_pdb, strict=True))[:-1]
        back = 0
        for db, pdb in reversed(dbs[-min(available, self._onset_frames) :] if available else []):
            if db < floor and pdb < pfloor:
                break
            back += 1
        return back

    def _end_back(self) -> int:
        """The last voiced frame, moved back over the quiet voiced frames at its end.

        Silero keeps its probability up for a window or more after the last word; those
        frames are voiced but stand no higher than the noise floor. The end moves to the last
        frame within END_MS that does stand above it (END_MS back if the loud frames all lie
        before that); where no frame of the utterance does, the energy has nothing to say and
        the model's end stays. The frames it looks at are already known, never waited for, so
        the settled preview (:attr:`settled_after_ms`) has this end too.
        """
        last = self._last_voiced
        tilted, plain = self._end_floors
        if not self._end_back_frames or tilted is None or plain is None:
            return last
        floor, tfloor = plain + self.END_DB, tilted + self.END_DB
        lo = max(0, last - self._end_back_frames, self._voiced.index(True))
        for i in range(last, lo - 1, -1):
            if self._dbs[i] >= floor or self._tdbs[i] >= tfloor:
                return i
        return lo if any(db >= floor for db in self._dbs[:lo]) else last

    def _maybe_begin(self, events: list[SegmenterEvent]) -> None:
        if self._voiced_count >= self._start_frames:
            self.state = SegmenterState.SPEAKING
            self._head = None
            events.append(SpeechBegin(self._start_frame * self.config.frame_ms, self._utt_index))

    def _track_loud(self, voiced: bool, db: float, pdb: float) -> None:
        """Keep the utterance's peak levels and its last loud speech frame (the newest one)."""
        last = len(self._frames) - 1
        if voiced:
            self._peak_db = max(self._peak_db, db)
            self._peak_pdb = max(self._peak_pdb, pdb)
        speech = voiced or self._last_energetic == last
        if speech and (
            db >= self._peak_db - self.LOUD_REL_DB or pdb >= self._peak_pdb - self.LOUD_REL_DB
        ):
            self._last_loud = last

    @property
    def quiet_ms(self) -> int:
        """Time since the utterance's last loud speech frame, in ms (0 while quiet).

        Runs ahead of :attr:`trailing_silence_ms`, which counts from the voice model's last
        voiced frame: Silero stays voiced for 100-200 ms of a fading word end.
        """
        if self.state not in (SegmenterState.SPEAKING, SegmenterState.STOPPING):
            return 0
        return (len(self._frames) - 1 - self._last_loud) * self.config.frame_ms

    @property
    def loud_end_ms(self) -> int:
        """Call offset just past the utterance's last loud speech frame (0 while quiet)."""
        if self.state not in (SegmenterState.SPEAKING, SegmenterState.STOPPING):
            return 0
        return (self._start_frame + self._last_loud + 1) * self.config.frame_ms

    def end_early(self) -> list[SegmenterEvent]:
        """End the utterance in progress now, before its hangover runs out.

        Only while the voice model hears no speech (STOPPING); how much of that silence is
        enough is the caller's rule. The session asks when the utterance's final is already
        decoded (smart turns), so that the final need not wait out the rest of the hangover.
        Speech after this is the next utterance. Returns the events (SPEECH_END and the
        utterance), or none.
        """
        if self.state is not SegmenterState.STOPPING:
            return []
        events: list[SegmenterEvent] = []
        self._finalise(events, forced=False)
        return events

    def _finalise(self, events: list[SegmenterEvent], *, forced: bool) -> None:
        utt, tail = self._build(forced=forced)
        events.append(SpeechEnd(utt.speech_end_ms, utt.index))
        events.append(utt)
        self._utt_index += 1
        self._reset_to_quiet(keep_tail=not forced, tail=tail)

    def _build(self, *, forced: bool) -> tuple[Utterance, list[FloatArray]]:
        """The utterance as it would end now, and the frames after it; changes no state."""
        fm = self.config.frame_ms
        last_voiced = max(self._last_voiced, self._last_energetic)
        keep = (
            len(self._frames)
            if forced
            else min(len(self._frames), last_voiced + 1 + self._pad_frames)
        )
        last_speech = max(self._end_back(), self._last_energetic)
        frames = self._frames[:keep]
        voiced = self._voiced[:keep]
        lead = self._lead
        audio = np.concatenate(lead + frames)
        speech_end = self._start_frame + (keep if forced else last_speech + 1)
        start_ms = (self._start_frame - len(lead)) * fm
        flags = [False] * len(lead) + voiced
        utt = Utterance(
            index=self._utt_index,
            audio=audio,
            start_ms=start_ms,
            end_ms=start_ms + len(flags) * fm,
            speech_start_ms=self._start_frame * fm,
            speech_end_ms=speech_end * fm,
            stats=self._stats(audio, flags, forced),
            dropped=sum(voiced) < self._min_speech_frames,
            loud_end_ms=min(self._start_frame + min(self._last_loud + 1, keep), speech_end) * fm,
        )
        return utt, self._frames[keep:]

    @property
    def trailing_silence_ms(self) -> int:
        """Unvoiced time since the last voiced frame of the current utterance, in ms."""
        if self.state is not SegmenterState.STOPPING:
            return 0
        return self._unvoiced_run * self.config.frame_ms

    @property
    def settled_after_ms(self) -> int:
        """Trailing silence after which :meth:`preview` has the final speech span.

        Past the plosive-tail window no unvoiced frame can move the end of speech; only new
        speech can, and that cancels the end. The final utterance's audio is then the
        preview's plus at most ``TRAILING_PAD_MS`` more trailing silence.
        """
        return self.TAIL_MS + self.config.frame_ms

    def preview(self, *, early: bool = False) -> Utterance | None:
        """The utterance the hangover will produce if the caller stays silent, or None.

        Used to start the final decode while the hangover still runs (speculative finals):
        once ``trailing_silence_ms >= settled_after_ms`` the preview has the same index, start
        and speech span as the utterance that will be emitted, unless speech resumes.

        ``early``: also while the voice model still hears speech (its lag after the last
        word), for a decode started on :attr:`quiet_ms`: the audio up to now, its frames after
        the loud end counted as unvoiced in the statistics (what the voice model is about to
        say of them).
        """
        if self.state is SegmenterState.STOPPING:
            return self._build(forced=False)[0]
        if not early or self.state is not SegmenterState.SPEAKING:
            return None
        utt = self._build(forced=False)[0]
        lead = len(self._lead)
        kept = self._voiced[: len(utt.audio) // self.frame_len - lead]
        flags = [False] * lead + [v and i <= self._last_loud for i, v in enumerate(kept)]
        return replace(utt, stats=self._stats(utt.audio, flags, False))

    def _stats(self, audio: FloatArray, flags: list[bool], forced: bool) -> UtteranceStats:
        return UtteranceStats.from_frames(audio, flags, self.config.frame_ms, forced_cut=forced)

    def _reset_to_quiet(self, *, keep_tail: bool, tail: list[FloatArray] | None = None) -> None:
        self.state = SegmenterState.QUIET
        self._pre_roll.clear()
        if keep_tail and tail:
            # The hangover's silence is the best pre-roll the next utterance can have.
            for f in tail:
                self._pre_roll.append(f)
        self._frames = []
        self._voiced = []
        self._dbs = []
        self._tdbs = []
        self._lead = []
        self._voiced_count = 0
        self._unvoiced_run = 0
        self._last_voiced = 0
        self._last_energetic = -1
        self._last_loud = -1
        self._peak_db = self._peak_pdb = -math.inf
