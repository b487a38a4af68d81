"""Audio at the edges of a call: per-call streaming decoders, encoders and resamplers.

Inside voxgate, caller audio is float32 mono at 16 kHz and synthesized audio is float32 mono at
the voice's rate. Everything the wire carries (LINEAR16, mu-law, A-law at 8/16/24/48 kHz) is
converted here, once, at the edge of a call; the codecs themselves live in
:mod:`voxgate.common.pcm`.
"""

from __future__ import annotations

import numpy as np
import soxr

from voxgate.common.pcm import (
    ALAW_DECODE,
    ALAW_ENCODE,
    MULAW_DECODE,
    MULAW_ENCODE,
    SUPPORTED_RATES_HZ,
    WireEncoding,
    float_to_pcm16,
    pcm16_to_float,
)
from voxgate.engines.base import ASR_SAMPLE_RATE_HZ, FloatArray

__all__ = ["AudioFormatError", "InputDecoder", "OutputEncoder"]


class AudioFormatError(ValueError):
    """The audio does not match the declared format (odd byte count, unsupported rate, ...)."""


def _check_rate(sample_rate_hz: int, field: str) -> None:
    if sample_rate_hz not in SUPPORTED_RATES_HZ:
        raise AudioFormatError(
            f"{field}={sample_rate_hz} is not supported; use one of "
            f"{', '.join(str(r) for r in SUPPORTED_RATES_HZ)}"
        )


class _Upsample2x:
    """Streaming 2x interpolator (8 → 16 kHz) with ~2 ms delay.

    soxr's HQ stream holds back ~89 ms when upsampling 8 kHz by 2, which delays every speech
    event of a telephone call by that much. Telephone audio has nothing above 4 kHz, so a short
    Kaiser-windowed sinc (63 taps, ≥ 60 dB image rejection past 4.4 kHz) is all the
    interpolation needs, and it delays the signal by only 31 samples at 16 kHz.
    """

    TAPS = 63

    def __init__(self) -> None:
        n = np.arange(self.TAPS) - (self.TAPS - 1) // 2
        h = np.sinc(n / 2.0) * np.kaiser(self.TAPS, 8.0)
        self._h = (h * (2.0 / h.sum())).astype(np.float32)  # DC gain 2 undoes zero-stuffing
        self._hist = np.zeros(self.TAPS - 1, dtype=np.float32)
        # Drop the filter's group delay at the start so output sample k is input time k/16 kHz
        # (call offsets stay exact); flush() returns the same number of held-back samples.
        self._delay = (self.TAPS - 1) // 2
        self._skip = self._delay

    def process(self, x: FloatArray) -> FloatArray:
        """Interpolate one chunk; returns 2 * len(x) samples (fewer at the very start)."""
        up = np.zeros(2 * len(x), dtype=np.float32)
        up[::2] = x
        buf = np.concatenate([self._hist, up])
        self._hist = buf[len(buf) - (self.TAPS - 1) :]
        y = np.convolve(buf, self._h, mode="valid").astype(np.float32)
        if self._skip:
            cut = min(self._skip, len(y))
            self._skip -= cut
            y = y[cut:]
        return y

    def flush(self) -> FloatArray:
        """The held-back tail, so that the total output is exactly twice the input."""
        tail = self.process(np.zeros((self._delay + 1) // 2, dtype=np.float32))
        return tail[: self._delay]


class InputDecoder:
    """Turns one call's wire audio into float32 mono 16 kHz, chunk by chunk.

    Holds a streaming soxr resampler, so chunk boundaries leave no clicks and the output length
    tracks the input exactly over a call. Not thread-safe: one per call, used by its recv task.
    """

    def __init__(self, encoding: WireEncoding, sample_rate_hz: int) -> None:
        _check_rate(sample_rate_hz, "input_audio.sample_rate_hertz")
        self.encoding = encoding
        self.sample_rate_hz = sample_rate_hz
        # Latency matters on this side (speech events wait on it): 8 kHz uses the 2 ms
        # interpolator above; 24/48 kHz use soxr's LQ stream (~6 ms hold-back vs ~33 ms for HQ).
        self._up2 = _Upsample2x() if sample_rate_hz == 8000 else None
        self._resampler = (
            None
            if sample_rate_hz in (ASR_SAMPLE_RATE_HZ, 8000)
            else soxr.ResampleStream(
                sample_rate_hz, ASR_SAMPLE_RATE_HZ, 1, dtype="float32", quality="LQ"
            )
        )
        self.samples_in = 0

    def to_float(self, data: bytes) -> FloatArray:
        """Decode wire bytes to float32 at the wire rate (no resampling)."""
        if self.encoding is WireEncoding.LINEAR16:
            if len(data) % 2:
                raise AudioFormatError(
                    f"audio.data has {len(data)} bytes; LINEAR16 needs an even byte count "
                    "(2 bytes per sample)"
                )
            pcm = np.frombuffer(data, dtype="<i2")
        else:
            table = MULAW_DECODE if self.encoding is WireEncoding.MULAW else ALAW_DECODE
            pcm = table[np.frombuffer(data, dtype=np.uint8)]
        self.samples_in += len(pcm)
        return pcm16_to_float(pcm)

    def decode(self, data: bytes) -> FloatArray:
        """Decode and resample one chunk to 16 kHz float32."""
        x = self.to_float(data)
        if self._up2 is not None:
            return self._up2.process(x)
        if self._resampler is None:
            return x
        return np.asarray(self._resampler.resample_chunk(x), dtype=np.float32)

    def flush(self) -> FloatArray:
        """Return the resampler's delayed tail at the end of the call."""
        if self._up2 is not None:
            return self._up2.flush()
        if self._resampler is None:
            return np.zeros(0, dtype=np.float32)
        tail = self._resampler.resample_chunk(np.zeros(0, dtype=np.float32), last=True)
        return np.asarray(tail, dtype=np.float32)


class OutputEncoder:
    """Turns synthesized float32 audio into one call's wire format, chunk by chunk.

    Not thread-safe: one per call (or per Synthesize stream), used by its tts task.
    """

    def __init__(self, encoding: WireEncoding, sample_rate_hz: int, source_rate_hz: int) -> None:
        _check_rate(sample_rate_hz, "output_audio.sample_rate_hertz")
        self.encoding = encoding
        self.sample_rate_hz = sample_rate_hz
        self.source_rate_hz = source_rate_hz
        self._resampler = (
            None
            if sample_rate_hz == source_rate_hz
            else soxr.ResampleStream(source_rate_hz, sample_rate_hz, 1, dtype="float32")
        )

    def resample(self, samples: FloatArray, *, last: bool = False) -> FloatArray:
        """Resample to the wire rate (float32)."""
        if self._resampler is None:
            return samples
        return np.asarray(self._resampler.resample_chunk(samples, last=last), dtype=np.float32)

    def encode(self, samples: FloatArray, *, last: bool = False) -> bytes:
        """Resample and encode float32 samples to wire bytes."""
        pcm = float_to_pcm16(self.resample(samples, last=last))
        if self.encoding is WireEncoding.LINEAR16:
            return pcm.astype("<i2").tobytes()
        table = MULAW_ENCODE if self.encoding is WireEncoding.MULAW else ALAW_ENCODE
        return table[pcm.astype(np.int32) + 32768].tobytes()

    def reset(self) -> None:
        """Drop the resampler's state (after barge-in, the next reply starts clean)."""
        if self._resampler is not None:
            self._resampler = soxr.ResampleStream(
                self.source_rate_hz, self.sample_rate_hz, 1, dtype="float32"
            )
