"""The streaming VITS synthesiser: front end once per unit, then windowed decoding."""

from __future__ import annotations

import logging
import threading
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from typing import Any, Self

import numpy as np
import numpy.typing as npt
import onnx
import onnxruntime as ort

from engines.base import FloatArray
from engines.tts._cache import ByteLruCache
from engines.tts._graph import GraphSplit, split_vits_graph
from engines.tts._session import make_session, select_providers
from engines.tts._text import TextUnit, prepare_text
from engines.tts._voice import PhonemizedUnit, load_voice_config, phonemize_unit, resolve_voice
from engines.tts.base import (
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
from engines.tts.config import TtsConfig

__all__ = ["VitsStreamer", "soft_limit"]

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
        self._front: ort.InferenceSession | None = make_session(
            split.front_end.SerializeToString(), self._providers, threads
        )
        self._decoder: ort.InferenceSession | None = make_session(
            split.decoder.SerializeToString(), self._providers, threads
        )
        self._front_inputs = {i.name for i in self._front.get_inputs()}
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

    def close(self) -> None:
        """Drop the sessions; later calls raise :class:`TtsError`."""
        self._front = self._decoder = self._whole = None
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
    def graph_split(self) -> GraphSplit:
        """How the voice graph was split (for tests and diagnostics)."""
        return self._split

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
        for field, value in (("noise_scale", noise), ("noise_w", noise_w)):
            if not 0.0 <= value <= MAX_NOISE_SCALE:
                raise TtsInputError(field, f"{value} is outside [0, {MAX_NOISE_SCALE}]")
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
        self, unit: PhonemizedUnit, resolved: _Resolved
    ) -> tuple[dict[str, npt.NDArray[Any]], dict[str, npt.NDArray[Any]], npt.NDArray[Any]]:
        """Run the front end: (frame-indexed tensors, whole tensors, durations per id)."""
        if self._front is None:
            raise TtsError("the streamer is closed")
        feeds = self._inputs(unit.phoneme_ids, resolved)
        outputs = self._front.run(None, {k: v for k, v in feeds.items() if k in self._front_inputs})
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
    ) -> FloatArray:
        """Decode frames [start, stop) with real context on both sides, context trimmed."""
        if self._decoder is None:
            raise TtsError("the streamer is closed")
        total = int(frame[self._split.latent].shape[-1])
        lo = max(0, start - self.config.context_frames)
        hi = min(total, stop + self.config.context_frames)
        feeds = {name: value[..., lo:hi] for name, value in frame.items()}
        feeds.update(whole)
        audio = np.asarray(self._decoder.run(None, feeds)[0], dtype=np.float32).reshape(-1)
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

    def _synthesize_unit(
        self, unit: TextUnit, resolved: _Resolved
    ) -> Iterator[tuple[_Piece, bool]]:
        """Yield the unit's windows and whether each is the unit's last."""
        phonemized = phonemize_unit(unit, self._voice)
        frame, whole, durations = self._run_front_end(phonemized, resolved)
        total = int(frame[self._split.latent].shape[-1])
        spans = phonemized.word_sample_spans(durations, self._hop)
        # A word ends inside the unit; clamp so rounding never pushes it past the last sample.
        ends = [
            (w.source, s, min(max(e, 1), total * self._hop))
            for w, (s, e) in zip(unit.words, spans, strict=True)
        ]
        for start, stop in self._windows(total, resolved.window_frames):
            audio = self._decode(frame, whole, start, stop)
            samples = soft_limit(audio, self._gain, self.config.limiter_threshold)
            # Chunks may be replayed from the cache to other callers: make them immutable.
            samples.flags.writeable = False
            lo, hi = start * self._hop, stop * self._hop
            words = tuple((t, s, e) for t, s, e in ends if lo < e <= hi)
            yield _Piece(samples, words), stop == total

    def stream(self, text: str, options: SpeakOptions | None = None) -> Iterator[TtsChunk]:
        """Validate ``text`` and ``options`` now, then return a lazy chunk iterator.

        Text policy: markup tags are stripped (not interpreted), entities decoded, numbers,
        currency, times and abbreviations spoken as words; text longer than
        ``TtsConfig.max_chars``, empty, or with nothing speakable raises.

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
        )
        return self._stream(units, resolved)

    def _stream(self, units: list[TextUnit], resolved: _Resolved) -> Iterator[TtsChunk]:
        offset = 0
        rate = self.sample_rate_hz
        for index, unit in enumerate(units):
            key = (unit.words, self._name, resolved.cache_key)
            cached = self._cache.get(key) if self.config.cache_bytes else None
            pieces: Iterator[tuple[_Piece, bool]] = (
                ((p, i == len(cached) - 1) for i, p in enumerate(cached))
                if cached is not None
                else self._synthesize_unit(unit, resolved)
            )
            made: list[_Piece] = []
            unit_start = offset
            last_unit = index == len(units) - 1
            for piece, unit_done in pieces:
                made.append(piece)
                words = tuple(
                    WordSpan(t, 1000.0 * (unit_start + s) / rate, 1000.0 * (unit_start + e) / rate)
                    for t, s, e in piece.words
                )
                # Yield at once (no look-ahead): the window schedule says which chunk is last.
                yield TtsChunk(piece.samples, rate, offset, words, index, last_unit and unit_done)
                offset += len(piece.samples)
            if cached is None and self.config.cache_bytes:
                # Only complete units are stored: a stream abandoned mid-unit stores nothing.
                self._cache.put(key, tuple(made), sum(p.samples.nbytes + 64 for p in made))

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
            samples = soft_limit(
                np.asarray(audio, dtype=np.float32).reshape(-1),
                self._gain,
                self.config.limiter_threshold,
            )
            spans = phonemized.word_sample_spans(np.asarray(durations).reshape(-1), self._hop)
            for word, (start, end) in zip(unit.words, spans, strict=True):
                stop = min(max(end, 1), len(samples))
                words.append(
                    WordSpan(
                        word.source,
                        1000.0 * (offset + start) / rate,
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
