"""Audio at the edges: G.711 codecs, PCM16 packing and per-call streaming resamplers.

Inside voxgate, caller audio is float32 mono at 16 kHz and synthesized audio is float32 mono at
the voice's rate. Everything the wire carries (LINEAR16, mu-law, A-law at 8/16/24/48 kHz) is
converted here, once, at the edge of a call.

The G.711 tables are built from a literal transcription of the ITU-T G.191 reference coder
(``g711.c``: ``ulaw_compress``/``ulaw_expand``/``alaw_compress``/``alaw_expand``), so they are
bit-exact with the standard; the tests check every int16 value and every code against it.
"""

from __future__ import annotations

from enum import Enum

import numpy as np
import numpy.typing as npt
import soxr

from engines.base import ASR_SAMPLE_RATE_HZ, FloatArray

__all__ = [
    "ALAW_DECODE",
    "ALAW_ENCODE",
    "MULAW_DECODE",
    "MULAW_ENCODE",
    "SUPPORTED_RATES_HZ",
    "AudioFormatError",
    "InputDecoder",
    "OutputEncoder",
    "WireEncoding",
    "alaw_compress_ref",
    "alaw_expand_ref",
    "bytes_per_ms",
    "float_to_pcm16",
    "pcm16_to_float",
    "ulaw_compress_ref",
    "ulaw_expand_ref",
]

Int16Array = npt.NDArray[np.int16]
UInt8Array = npt.NDArray[np.uint8]

#: Sample rates accepted on the wire.
SUPPORTED_RATES_HZ = (8000, 16000, 24000, 48000)


class WireEncoding(Enum):
    """Sample encodings accepted on the wire (mirrors ``voxgate.v1.Encoding``)."""

    LINEAR16 = 1
    MULAW = 2
    ALAW = 3


class AudioFormatError(ValueError):
    """The audio does not match the declared format (odd byte count, unsupported rate, ...)."""


# --- ITU-T G.191 reference coder, one sample at a time (the source of truth for the tables) ----


def ulaw_compress_ref(lin: int) -> int:
    """Encode one 16-bit sample to mu-law exactly as ITU-T G.191 ``ulaw_compress`` does."""
    # G.191 works on 14-bit magnitudes; negatives use the one's complement (~x), not -x.
    absno = ((~lin) >> 2) if lin < 0 else (lin >> 2)
    absno += 33
    absno = min(absno, 0x1FFF)
    i = absno >> 6
    segno = 1
    while i != 0:
        segno += 1
        i >>= 1
    high_nibble = 0x0008 - segno
    low_nibble = 0x000F - ((absno >> segno) & 0x000F)
    out = (high_nibble << 4) | low_nibble
    if lin >= 0:
        out |= 0x0080
    return out & 0xFF


def ulaw_expand_ref(code: int) -> int:
    """Decode one mu-law byte to a 16-bit sample exactly as G.191 ``ulaw_expand`` does."""
    sign = -1 if code < 0x80 else 1
    mantissa = ~code
    exponent = (mantissa >> 4) & 0x07
    segment = exponent + 1
    mantissa &= 0x0F
    step = 4 << segment
    return sign * ((0x80 << exponent) + step * mantissa + step // 2 - 4 * 33)


def alaw_compress_ref(lin: int) -> int:
    """Encode one 16-bit sample to A-law exactly as G.191 ``alaw_compress`` does."""
    ix = ((~lin) >> 4) if lin < 0 else (lin >> 4)
    if ix > 15:
        iexp = 1
        while ix > 16 + 15:
            ix >>= 1
            iexp += 1
        ix -= 16
        ix += iexp << 4
    if lin >= 0:
        ix |= 0x80
    return (ix ^ 0x55) & 0xFF


def alaw_expand_ref(code: int) -> int:
    """Decode one A-law byte to a 16-bit sample exactly as G.191 ``alaw_expand`` does."""
    ix = (code ^ 0x55) & 0x7F
    iexp = ix >> 4
    mant = ix & 0x0F
    if iexp > 0:
        mant += 16
    mant = (mant << 4) + 0x08
    if iexp > 1:
        mant <<= iexp - 1
    return mant if code > 127 else -mant


def _build_tables() -> tuple[UInt8Array, Int16Array, UInt8Array, Int16Array]:
    # Built once at import from the reference coder: 2 x 65,536 + 2 x 256 evaluations (~50 ms),
    # cheaper than shipping binary tables and impossible to get out of sync with the reference.
    lin = range(-32768, 32768)
    mu_enc = np.fromiter((ulaw_compress_ref(x) for x in lin), dtype=np.uint8, count=65536)
    a_enc = np.fromiter((alaw_compress_ref(x) for x in lin), dtype=np.uint8, count=65536)
    mu_dec = np.fromiter((ulaw_expand_ref(c) for c in range(256)), dtype=np.int16, count=256)
    a_dec = np.fromiter((alaw_expand_ref(c) for c in range(256)), dtype=np.int16, count=256)
    return mu_enc, mu_dec, a_enc, a_dec


#: Encode tables are indexed by ``int16 + 32768``; decode tables by the code byte.
MULAW_ENCODE, MULAW_DECODE, ALAW_ENCODE, ALAW_DECODE = _build_tables()


def pcm16_to_float(pcm: Int16Array) -> FloatArray:
    """Scale int16 samples to float32 in [-1, 1)."""
    return (pcm.astype(np.float32) * np.float32(1.0 / 32768.0)).astype(np.float32, copy=False)


def float_to_pcm16(samples: FloatArray) -> Int16Array:
    """Round float samples to int16 with clipping (no wrap-around on overs)."""
    scaled = np.clip(np.rint(samples * 32768.0), -32768, 32767)
    out: Int16Array = scaled.astype(np.int16)
    return out


def bytes_per_ms(encoding: WireEncoding, sample_rate_hz: int) -> float:
    """Wire bytes per millisecond of audio."""
    width = 2 if encoding is WireEncoding.LINEAR16 else 1
    return width * sample_rate_hz / 1000.0


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
