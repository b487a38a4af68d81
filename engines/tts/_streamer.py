"""The streaming VITS synthesiser: front end once per unit, then windowed decoding."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort

from voxgate.engines.base import FloatArray
from voxgate.engines.tts._cache import ByteLruCache
from voxgate.engines.tts._graph import GraphSplit, split_vits_graph
from voxgate.engines.tts._layout import conv1d_as_conv2d
from voxgate.engines.tts._session import CPU, make_session, select_providers
from voxgate.engines.tts._text import TextUnit, prepare_text
from voxgate.engines.tts._voice import (
    PhonemizedUnit,
    load_voice_config,
    phonemize_unit,
    resolve_voice,
)
from voxgate.engines.tts._windows import window_bounds
from voxgate.engines.tts.base import (
    MAX_LENGTH_SCALE,
    MAX_NOISE_SCALE,
    MIN_LENGTH_SCALE,
    SpeakOptions,
    TtsChunk,
    TtsError,
    TtsInputError,
    VoiceGraphError,
    VoiceInfo,
    WordSpan,
)
from voxgate.engines.tts.config import TtsConfig

__all__ = ["ReplyJob", "VitsStreamer", "WindowPlan", "soft_limit"]

_LOGGER = logging.getLogger(__name__)
_WARMUP_TEXT = "Hello, this is a warm up."


def soft_limit(samples: FloatArray, gain: float, threshold: float) -> FloatArray:
    """Apply a fixed gain, then a memoryless soft knee above ``threshold``.

    Memoryless on purpose: each sample's output depends only on that sample, so limiting window
    by window gives exactly the waveform limiting the whole reply would, and nothing has to be
    held back. Above the knee, ``t + (1 - t) * tanh((|x| - t) / (1 - t))`` is continuous with
    slope 1 at the knee and never reaches 1.
    """
    x = samples.astype(np.float32) * np.float32(gain)
    mag = np.abs(x)
    over = mag > threshold
    if np.any(over):
        head = np.float32(1.0 - threshold)
        squashed = threshold + head * np.tanh((mag[over] - threshold) / head)
        # float32 rounding of tanh near 1 could give exactly 1.0; keep strictly inside.
        below_one = np.nextafter(np.float32(1.0), np.float32(0.0))
        x[over] = np.sign(x[over]) * np.minimum(squashed, below_one)
    return x


@dataclass(frozen=True, slots=True)
class _Resolved:
    """Validated per-request values, in model units."""

    length_scale: float
    noise_scale: float
    noise_w: float
    speaker_id: int | None
    #: Later windows' size; not in the cache key: the audio is the same whatever the windows.
    window_frames: int = 0

    @property
    def cache_key(self) -> Hashable:
        return (self.length_scale, self.noise_scale, self.noise_w, self.speaker_id)


@dataclass(frozen=True, slots=True)
class _Piece:
    """A window of a unit as cached: samples and the words ending in it, unit-relative."""

    samples: FloatArray
    words: tuple[tuple[str, int, int], ...]


class VitsStreamer:
    """A Piper VITS voice split into a text front end and a windowed flow + HiFi-GAN decoder.

    Threading: :meth:`stream` may be called from several threads at once (ONNX Runtime sessions
    and the phrase cache are thread-safe, espeak is serialised); each returned iterator must be
    advanced by one thread at a time. One ``next()`` does at most one front-end run plus one
    decoder window (tens of milliseconds on a CPU core), so the gateway can pull it from an
    executor and stop pulling at any chunk boundary (barge-in) without wasted work beyond it.
    """

    def __init__(
        self,
        config: TtsConfig,
        *,
        split: GraphSplit,
        whole_model: onnx.ModelProto,
        voice_config: Any,
        voice_name: str,
        language: str,
    ) -> None:
        self.config = config
        self._split = split
        self._whole_model: onnx.ModelProto | None = whole_model
        self._voice = voice_config
        self._name = voice_name
        self._language = language
        self._providers = select_providers(
            ort.get_available_providers(),
            config.providers,
            config.trt_cache_dir,
            device_id=config.device_id,
        )
        threads = config.onnx_threads
        # On CPU the convolutions run as 2-D ones of height 1 (ONNX Runtime's blocked
        # kernels, see _layout): the front end on any thread count, the decoder on one
        # thread only (on two it is slower that way).
        cpu = self._providers == [CPU]
        front_end = (
            conv1d_as_conv2d(split.front_end) if cpu else split.front_end
        ).SerializeToString()
        self._front: ort.InferenceSession | None = make_session(front_end, self._providers, threads)
        decoder = conv1d_as_conv2d(split.decoder) if cpu and threads == 1 else split.decoder
        self._decoder: ort.InferenceSession | None = make_session(
            decoder.SerializeToString(), self._providers, threads
        )
        self._front_inputs = {i.name for i in self._front.get_inputs()}
        # The first-audio pair: the same graphs on more intra-op threads, for a reply that
        # starts while nothing else is synthesised (the scheduler's call, ``wide=True``): its
        # front end and first window then use the idle cores, where the one-thread sessions
        # would leave them to sit. On an accelerator the pair would add nothing but memory.
        self._front_wide: ort.InferenceSession | None = None
        self._decoder_wide: ort.InferenceSession | None = None
        wide = min(config.first_audio_threads, os.cpu_count() or 1)
        if wide > threads and self.device == "cpu":
            if not cpu:  # an accelerator that failed to start: the CPU graph is not lifted yet
                front_end = conv1d_as_conv2d(split.front_end).SerializeToString()
            self._front_wide = make_session(front_end, [CPU], wide)
            self._decoder_wide = make_session(split.decoder.SerializeToString(), [CPU], wide)
        self._whole: ort.InferenceSession | None = None
        self._whole_lock = threading.Lock()
        self._hop: int = int(voice_config.hop_length)
        self._gain = float(10.0 ** (config.gain_db / 20.0))
        self._cache: ByteLruCache[tuple[_Piece, ...]] = ByteLruCache(config.cache_bytes)

    # -- lifecycle --------------------------------------------------------------------------

    @classmethod
    def load(cls, config: TtsConfig) -> Self:
        """Load the voice, split its graph and create the ONNX Runtime sessions.

        Raises:
            FileNotFoundError: the voice files are missing.
            VoiceGraphError: the graph is not a VITS graph this engine can split.
        """
        files = resolve_voice(config.voice)
        voice_config, raw = load_voice_config(files.config_path)
        model = onnx.load(str(files.model_path))
        split = split_vits_graph(model)
        name = config.voice_name or files.model_path.name.removesuffix(".onnx")
        language = str(raw.get("language", {}).get("code", voice_config.espeak_voice))
        return cls(
            config,
            split=split,
            whole_model=model,
            voice_config=voice_config,
            voice_name=name,
            language=language,
        )

    def warmup(self) -> None:
        """Synthesise a short phrase, bypassing the cache, and check the hop length.

        Besides paying ONNX Runtime's first-run costs, this verifies that the decoder emits
        ``hop_length`` samples per latent frame; windowing relies on it.
        """
        unit = prepare_text(
            _WARMUP_TEXT, max_chars=100, max_unit_chars=100, first_unit_max_chars=0
        )[0]
        resolved = self._resolve(SpeakOptions())
        phonemized = phonemize_unit(unit, self._voice)
        frame_inputs, whole, _ = self._run_front_end(phonemized, resolved)
        frames = int(frame_inputs[self._split.latent].shape[-1])
        audio = self._decode(frame_inputs, whole, 0, frames)
        if len(audio) != frames * self._hop:
            raise VoiceGraphError(
                f"decoder gave {len(audio)} samples for {frames} frames; expected hop_length "
                f"{self._hop} per frame (check 'hop_length' in the voice config)"
            )
        if self._decoder_wide is not None:
            # The first-audio pair's first runs (thread pool start, kernel choice) happen
            # here, not in a caller's first reply.
            self._run_front_end(phonemized, resolved, wide=True)
            self._decode(frame_inputs, whole, 0, frames, wide=True)

    def close(self) -> None:
        """Drop the sessions; later calls raise :class:`TtsError`."""
        self._front = self._decoder = self._whole = None
        self._front_wide = self._decoder_wide = None
        self._whole_model = None

    # -- introspection ----------------------------------------------------------------------

    @property
    def sample_rate_hz(self) -> int:
        """Output rate of the voice."""
        return int(self._voice.sample_rate)

    @property
    def max_text_chars(self) -> int:
        """Longest text one ``stream`` call accepts (``TtsConfig.max_chars``)."""
        return self.config.max_chars

    @property
    def hop_length(self) -> int:
        """Samples per latent frame (from the voice config, verified by :meth:`warmup`)."""
        return self._hop

    @property
    def device(self) -> str:
        """``cuda`` when the decoder runs on a GPU provider, else ``cpu`` (for the scheduler)."""
        if self._decoder is None:
            return "cpu"
        return "cpu" if self._decoder.get_providers()[0] == "CPUExecutionProvider" else "cuda"

    @property
    def has_wide(self) -> bool:
        """Whether the first-audio pair exists (``TtsConfig.first_audio_threads`` > 1 on CPU)."""
        return self._decoder_wide is not None

    @property
    def cache(self) -> ByteLruCache[tuple[_Piece, ...]]:
        """The phrase cache (hit/miss counters, size)."""
        return self._cache

    def voices(self) -> list[VoiceInfo]:
        """The voice this engine serves."""
        return [
            VoiceInfo(
                name=self._name,
                language=self._language,
                sample_rate_hz=self.sample_rate_hz,
                num_speakers=int(self._voice.num_speakers),
            )
        ]

    # -- requests ---------------------------------------------------------------------------

    def _resolve(self, options: SpeakOptions) -> _Resolved:
        """Validate options against the voice and fill in its defaults."""
        if options.voice is not None and options.voice != self._name:
            raise TtsInputError("voice", f"unknown voice {options.voice!r}; have {[self._name]}")
        length = self._voice.length_scale if options.length_scale is None else options.length_scale
        if not MIN_LENGTH_SCALE <= length <= MAX_LENGTH_SCALE:
            raise TtsInputError(
                "length_scale",
                f"{length} is outside [{MIN_LENGTH_SCALE}, {MAX_LENGTH_SCALE}]",
            )
        noise = self._voice.noise_scale if options.noise_scale is None else options.noise_scale
        noise_w = self._voice.noise_w_scale if options.noise_w is None else options.noise_w
        for name, value in (("noise_scale", noise), ("noise_w", noise_w)):
            if not 0.0 <= value <= MAX_NOISE_SCALE:
                raise TtsInputError(name, f"{value} is outside [0, {MAX_NOISE_SCALE}]")
        speakers = int(self._voice.num_speakers)
        sid = options.speaker_id
        if sid is not None and not 0 <= sid < speakers:
            raise TtsInputError("speaker_id", f"{sid} is outside [0, {speakers - 1}]")
        if speakers > 1 and sid is None:
            sid = int(self._voice.default_speaker_id)
        window = (
            self.config.window_frames if options.window_frames is None else options.window_frames
        )
        if not self.config.first_window_frames <= window <= 4096:
            raise TtsInputError(
                "window_frames",
                f"{window} is outside [{self.config.first_window_frames}, 4096]",
            )
        return _Resolved(
            float(length), float(noise), float(noise_w), sid if speakers > 1 else None, window
        )

    def _inputs(self, ids: tuple[int, ...], resolved: _Resolved) -> dict[str, npt.NDArray[Any]]:
        feeds: dict[str, npt.NDArray[Any]] = {
            "input": np.array([ids], dtype=np.int64),
            "input_lengths": np.array([len(ids)], dtype=np.int64),
            "scales": np.array(
                [resolved.noise_scale, resolved.length_scale, resolved.noise_w], dtype=np.float32
            ),
        }
        if resolved.speaker_id is not None:
            feeds["sid"] = np.array([resolved.speaker_id], dtype=np.int64)
        return feeds

    def _run_front_end(
        self, unit: PhonemizedUnit, resolved: _Resolved, *, wide: bool = False
    ) -> tuple[dict[str, npt.NDArray[Any]], dict[str, npt.NDArray[Any]], npt.NDArray[Any]]:
        """Run the front end: (frame-indexed tensors, whole tensors, durations per id).

        ``wide``: on the first-audio pair's session where there is one.
        """
        session = (self._front_wide if wide else None) or self._front
        if session is None:
            raise TtsError("the streamer is closed")
        feeds = self._inputs(unit.phoneme_ids, resolved)
        outputs = session.run(None, {k: v for k, v in feeds.items() if k in self._front_inputs})
        frame: dict[str, npt.NDArray[Any]] = {}
        whole: dict[str, npt.NDArray[Any]] = {k: feeds[k] for k in self._split.decoder_graph_inputs}
        for tensor, value in zip(self._split.crossing, outputs, strict=False):
            (frame if tensor.frame_indexed else whole)[tensor.name] = value
        durations = np.asarray(outputs[-1]).reshape(-1)
        return frame, whole, durations

    def _decode(
        self,
        frame: dict[str, npt.NDArray[Any]],
        whole: dict[str, npt.NDArray[Any]],
        start: int,
        stop: int,
        *,
        wide: bool = False,
    ) -> FloatArray:
        """Decode frames [start, stop) with real context on both sides, context trimmed."""
        decoder = (self._decoder_wide if wide else None) or self._decoder
        if decoder is None:
            raise TtsError("the streamer is closed")
        total = int(frame[self._split.latent].shape[-1])
        lo = max(0, start - self.config.context_frames)
        hi = min(total, stop + self.config.context_frames)
        feeds = {name: value[..., lo:hi] for name, value in frame.items()}
        feeds.update(whole)
        audio = np.asarray(decoder.run(None, feeds)[0], dtype=np.float32).reshape(-1)
        return audio[(start - lo) * self._hop : (stop - lo) * self._hop]

    def _windows(self, total: int, window_frames: int = 0) -> Iterator[tuple[int, int]]:
        """Window bounds: the first small, then doubling up to ``window_frames``."""
        largest = window_frames or self.config.window_frames
        size = self.config.first_window_frames
        start = 0
        while start < total:
            stop = min(total, start + size)
            # A sliver of a window costs a full context decode; fold it into this one.
            if total - stop < self.config.first_window_frames // 2:
                stop = total
            yield start, stop
            start = stop
            size = min(largest, size * 2)

    def open(self, text: str, options: SpeakOptions | None = None) -> ReplyJob:
        """Validate ``text`` and ``options`` now; return the reply as a job a scheduler steps.

        The gateway's synthesis scheduler advances many such jobs, choosing each window's size
        from the reply's playout slack and batching windows of several replies into one
        decoder call (:meth:`decode_windows`); :meth:`stream` steps one job by itself.

        Raises:
            TtsInputError: invalid text or options (``field`` says which).
            TtsError: the streamer is closed.
        """
        if self._front is None:
            raise TtsError("the streamer is closed")
        resolved = self._resolve(options or SpeakOptions())
        units = prepare_text(
            text,
            max_chars=self.config.max_chars,
            max_unit_chars=self.config.max_unit_chars,
            first_unit_max_chars=self.config.first_unit_max_chars,
            first_unit_words=self.config.first_unit_words,
            lookahead_words=self.config.first_unit_lookahead_words,
        )
        return ReplyJob(self, units, resolved)

    def stream(self, text: str, options: SpeakOptions | None = None) -> Iterator[TtsChunk]:
        """Validate ``text`` and ``options`` now, then return a lazy chunk iterator.

        Text policy: markup tags are stripped (not interpreted), entities decoded, numbers,
        currency, times and abbreviations spoken as words; text longer than
        ``TtsConfig.max_chars``, empty, or with nothing speakable raises. Windows follow the
        fixed schedule of :meth:`_windows` (first small, then doubling).

        Raises:
            TtsInputError: invalid text or options (``field`` says which).
            TtsError: the streamer is closed.
        """
        return self._stream(self.open(text, options))

    def _stream(self, job: ReplyJob) -> Iterator[TtsChunk]:
        while not job.done:
            if job.needs_front_end:
                yield from job.run_front_end()
                continue
            plan = job.plan(job.scheduled_frames())
            (audio,) = self.decode_windows([(job, plan)])
            yield job.finish_window(plan, audio)

    def decode_windows(
        self, windows: Sequence[tuple[ReplyJob, WindowPlan]], *, wide: bool = False
    ) -> list[FloatArray]:
        """Decode planned windows of one or more replies; raw audio of each window, in order.

        Windows whose decoder inputs have the same length run as one ONNX Runtime call (the
        decoder's batch axis is dynamic); each item's samples are bit-identical to decoding it
        alone (tests/test_tts_scheduler.py checks it), so batching is purely a speed choice.
        ``wide``: on the first-audio pair's session (more threads) where there is one.
        """
        decoder = (self._decoder_wide if wide else None) or self._decoder
        if decoder is None:
            raise TtsError("the streamer is closed")
        out: list[FloatArray | None] = [None] * len(windows)
        units = [plan.unit if plan.unit is not None else job._unit for job, plan in windows]
        if any(u is None for u in units):
            raise TtsError("a window plan without its unit's front end")
        groups: dict[tuple[int, ...], list[int]] = {}
        for index, ((_, plan), unit) in enumerate(zip(windows, units, strict=True)):
            assert unit is not None
            shapes = tuple(v.shape[1] for v in unit.frame.values()) + tuple(
                int(np.prod(v.shape)) for v in unit.whole.values()
            )
            groups.setdefault((plan.hi - plan.lo, *shapes), []).append(index)
        batchable = not self._split.decoder_graph_inputs  # per-request graph inputs stay alone
        for members in groups.values():
            for chunk in [members] if batchable else [[m] for m in members]:
                first = units[chunk[0]]
                assert first is not None
                feeds: dict[str, npt.NDArray[Any]] = {}
                for name in first.frame:
                    parts = [
                        units[m].frame[name][..., windows[m][1].lo : windows[m][1].hi]  # type: ignore[union-attr]
                        for m in chunk
                    ]
                    feeds[name] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
                for name in first.whole:
                    parts = [units[m].whole[name] for m in chunk]  # type: ignore[union-attr]
                    feeds[name] = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
                audio = np.asarray(decoder.run(None, feeds)[0], dtype=np.float32)
                audio = audio.reshape(len(chunk), -1)
                for row, m in enumerate(chunk):
                    plan = windows[m][1]
                    a, b = (plan.start - plan.lo) * self._hop, (plan.stop - plan.lo) * self._hop
                    out[m] = audio[row, a:b]
        return [a for a in out if a is not None]

    def synthesize_oneshot(self, text: str, options: SpeakOptions | None = None) -> TtsChunk:
        """Synthesise the whole reply with the unsplit graph (the reference for streaming).

        Same text handling, gain and limiter as :meth:`stream`; one front-end + decoder run per
        unit through the original model, durations exposed as an extra output for word times.
        """
        resolved = self._resolve(options or SpeakOptions())
        units = prepare_text(
            text,
            max_chars=self.config.max_chars,
            max_unit_chars=self.config.max_unit_chars,
            first_unit_max_chars=self.config.first_unit_max_chars,
            first_unit_words=self.config.first_unit_words,
            lookahead_words=self.config.first_unit_lookahead_words,
        )
        session = self._whole_session()
        parts: list[FloatArray] = []
        words: list[WordSpan] = []
        offset = 0
        rate = self.sample_rate_hz
        for unit in units:
            phonemized = phonemize_unit(unit, self._voice)
            feeds = self._inputs(phonemized.phoneme_ids, resolved)
            inputs = {i.name for i in session.get_inputs()}
            audio, durations = session.run(None, {k: v for k, v in feeds.items() if k in inputs})
            durations = np.asarray(durations).reshape(-1)
            # A unit cut out of its sentence speaks only its own frames (see TextUnit).
            first, end = phonemized.spoken_frames(unit, durations)
            base = first * self._hop
            samples = soft_limit(
                np.asarray(audio, dtype=np.float32).reshape(-1)[base : end * self._hop],
                self._gain,
                self.config.limiter_threshold,
            )
            spans = phonemized.word_sample_spans(durations, self._hop)[len(unit.lead) :]
            for word, (start, stop_) in zip(unit.words, spans, strict=False):
                stop = min(max(stop_ - base, 1), len(samples))
                words.append(
                    WordSpan(
                        word.source,
                        1000.0 * (offset + start - base) / rate,
                        1000.0 * (offset + stop) / rate,
                    )
                )
            parts.append(samples)
            offset += len(samples)
        return TtsChunk(np.concatenate(parts), rate, 0, tuple(words), len(units) - 1, True)

    def _whole_session(self) -> ort.InferenceSession:
        """The unsplit graph with the durations as a second output, created on first use."""
        with self._whole_lock:
            if self._whole is None:
                if self._whole_model is None:
                    raise TtsError("the streamer is closed")
                model = onnx.ModelProto()
                model.CopyFrom(self._whole_model)
                del model.graph.output[1:]
                model.graph.output.append(onnx.ValueInfoProto(name=self._split.durations))
                self._whole = make_session(
                    model.SerializeToString(), self._providers, self.config.onnx_threads
                )
            return self._whole


@dataclass(eq=False)
class _Unit:
    """One text unit's front-end tensors and what its windows have produced so far."""

    index: int
    key: Hashable
    start_sample: int  # where the unit starts in the reply
    frame: dict[str, npt.NDArray[Any]]
    whole: dict[str, npt.NDArray[Any]]
    total: int  # the frame after the last one the unit speaks
    ends: list[tuple[str, int, int]]  # spoken words, samples from ``first``
    first: int = 0  # the first frame the unit speaks (past its lead words)
    length: int = 0  # latent frames (context words included): windows' context reaches here
    made: dict[int, _Piece] = field(default_factory=dict)  # by window start frame
    done_frames: int = 0


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """A decoder window of a unit: frames ``[start, stop)``, decoder input ``[lo, hi)``."""

    start: int
    stop: int
    lo: int
    hi: int
    unit: _Unit | None = field(default=None, compare=False, repr=False)

    @property
    def input_frames(self) -> int:
        return self.hi - self.lo


class ReplyJob:
    """One reply's synthesis, advanced step by step by whoever schedules it.

    Steps are :meth:`run_front_end` (the next unit's phonemes and front end, or the whole unit
    from the phrase cache) and decoder windows (:meth:`plan`, then
    :meth:`VitsStreamer.decode_windows`, then :meth:`finish_window`). A unit's front end runs
    once, whatever the window sizes, and its windows are independent of each other: once
    planned, windows (even of the previous unit while the next unit's front end runs) may be
    decoded and finished in any order and on any threads; each chunk knows its offset, and the
    caller delivers them in order. Planning (``plan``, ``run_front_end``) is one thread at a
    time.
    """

    def __init__(self, streamer: VitsStreamer, units: list[TextUnit], resolved: _Resolved) -> None:
        self._streamer = streamer
        self._units = units
        self._resolved = resolved
        self._next_unit = 0  # the next unit whose front end has not run
        self._unit: _Unit | None = None  # the unit being planned
        self._position = 0  # frames of the planned unit already planned
        self._planned_samples = 0  # reply samples covered by planned windows
        self._size = 0  # the fixed schedule's next window size (see scheduled_frames)
        self._lock = threading.Lock()  # finish_window may run on several threads

    # -- state the scheduler reads ----------------------------------------------------------

    @property
    def planned_all(self) -> bool:
        """Every window of every unit has been planned (or replayed from the cache)."""
        return self._unit is None and self._next_unit >= len(self._units)

    @property
    def done(self) -> bool:
        """Same as :attr:`planned_all` (for one thread stepping the job in order)."""
        return self.planned_all

    @property
    def needs_front_end(self) -> bool:
        """The next step is a front-end run (or a cache replay) for the next unit."""
        return self._unit is None and self._next_unit < len(self._units)

    @property
    def samples_planned(self) -> int:
        """Reply samples covered by the steps issued so far (the next step starts here)."""
        return self._planned_samples

    @property
    def position(self) -> int:
        """Frames of the unit being planned already planned."""
        return self._position

    @property
    def unit_frames(self) -> int:
        """Frames of the unit being planned (0 before its front end ran)."""
        return self._unit.total if self._unit is not None else 0

    @property
    def frame(self) -> dict[str, npt.NDArray[Any]]:
        """Frame-indexed front-end tensors of the unit being planned."""
        return self._unit.frame if self._unit is not None else {}

    @property
    def whole(self) -> dict[str, npt.NDArray[Any]]:
        """Per-unit front-end tensors of the unit being planned."""
        return self._unit.whole if self._unit is not None else {}

    # -- steps ------------------------------------------------------------------------------

    def run_front_end(self, *, wide: bool = False) -> list[TtsChunk]:
        """Prepare the next unit; a unit found in the phrase cache comes back whole, at once.

        ``wide``: on the first-audio pair's session (more threads) where there is one.
        """
        s = self._streamer
        index = self._next_unit
        unit = self._units[index]
        self._next_unit += 1
        key = (unit, s._name, self._resolved.cache_key)
        cached = s._cache.get(key) if s.config.cache_bytes else None
        start_sample = self._planned_samples
        if cached is not None:
            chunks = []
            offset = start_sample
            for i, piece in enumerate(cached):
                last = i == len(cached) - 1 and index == len(self._units) - 1
                chunks.append(self._chunk(piece, start_sample, offset, index, last))
                offset += len(piece.samples)
            self._planned_samples = offset
            return chunks
        phonemized = phonemize_unit(unit, s._voice)
        frame, whole, durations = s._run_front_end(phonemized, self._resolved, wide=wide)
        length = int(frame[s._split.latent].shape[-1])
        first, total = phonemized.spoken_frames(unit, durations)
        spans = phonemized.word_sample_spans(durations, s._hop)[len(unit.lead) :]
        # A word ends inside the unit; clamp so rounding never pushes it past the last sample.
        base, size = first * s._hop, (total - first) * s._hop
        ends = [
            (w.source, st - base, min(max(e - base, 1), size))
            for w, (st, e) in zip(unit.words, spans, strict=False)
        ]
        self._unit = _Unit(index, key, start_sample, frame, whole, total, ends, first, length)
        self._position = first
        self._size = s.config.first_window_frames
        return []

    def scheduled_frames(self) -> int:
        """The next window's size on the fixed schedule (first small, then doubling)."""
        return self._size

    def plan(self, frames: int, pad_to: int = 0) -> WindowPlan:
        """Reserve the next window of ``frames`` frames (see ``window_bounds``)."""
        s = self._streamer
        unit = self._unit
        if unit is None:
            raise TtsError("no unit to plan a window in: run the front end first")
        start, stop, lo, hi = window_bounds(
            self._position,
            frames,
            unit.total,
            s.config.context_frames,
            min_tail=s.config.first_window_frames // 2,
            pad_to=pad_to,
            length=unit.length,
        )
        self._position = stop
        self._planned_samples += (stop - start) * s._hop
        self._size = min(self._resolved.window_frames or s.config.window_frames, self._size * 2)
        if stop >= unit.total:
            self._unit = None
        return WindowPlan(start, stop, lo, hi, unit)

    def finish_window(self, plan: WindowPlan, audio: FloatArray) -> TtsChunk:
        """Limit the window's audio and turn it into its chunk of the reply (any order)."""
        s = self._streamer
        unit = plan.unit
        assert unit is not None
        samples = soft_limit(audio, s._gain, s.config.limiter_threshold)
        # Chunks may be replayed from the cache to other callers: make them immutable.
        samples.flags.writeable = False
        lo, hi = (plan.start - unit.first) * s._hop, (plan.stop - unit.first) * s._hop
        piece = _Piece(samples, tuple((t, a, e) for t, a, e in unit.ends if lo < e <= hi))
        last = plan.stop >= unit.total and unit.index == len(self._units) - 1
        offset = unit.start_sample + lo
        with self._lock:
            unit.made[plan.start] = piece
            unit.done_frames += plan.stop - plan.start
            complete = unit.done_frames >= unit.total - unit.first
        if complete and s.config.cache_bytes:
            # Only complete units are stored: a reply abandoned mid-unit stores nothing.
            made = tuple(unit.made[k] for k in sorted(unit.made))
            s._cache.put(unit.key, made, sum(p.samples.nbytes + 64 for p in made))
        return self._chunk(piece, unit.start_sample, offset, unit.index, last)

    def _chunk(
        self, piece: _Piece, unit_start: int, offset: int, index: int, last: bool
    ) -> TtsChunk:
        rate = self._streamer.sample_rate_hz
        words = tuple(
            WordSpan(t, 1000.0 * (unit_start + a) / rate, 1000.0 * (unit_start + e) / rate)
            for t, a, e in piece.words
        )
        return TtsChunk(piece.samples, rate, offset, words, index, last)
