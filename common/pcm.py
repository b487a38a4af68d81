"""Wire audio formats, with no server or client in them: G.711 codecs and PCM16 packing.

Both the gateway (``voxgate.gateway.audio``, the per-call streaming edges) and the client library
import this package, so a client encodes exactly as the server decodes and ships without the server.

The G.711 tables are built from a literal transcription of the ITU-T G.191 reference coder
(``g711.c``: ``ulaw_compress``/``ulaw_expand``/``alaw_compress``/``alaw_expand``), so they are
bit-exact with the standard; the tests check every int16 value and every code against it.
"""

from __future__ import annotations

from enum import Enum

import numpy as np
import numpy.typing as npt

__all__ = [
    "ALAW_DECODE",
    "ALAW_ENCODE",
    "MULAW_DECODE",
    "MULAW_ENCODE",
    "SUPPORTED_RATES_HZ",
    "FloatArray",
    "Int16Array",
    "UInt8Array",
    "WireEncoding",
    "alaw_compress_ref",
    "alaw_expand_ref",
    "bytes_per_ms",
    "float_to_pcm16",
    "pcm16_to_float",
    "ulaw_compress_ref",
    "ulaw_expand_ref",
]

FloatArray = npt.NDArray[np.float32]
Int16Array = npt.NDArray[np.int16]
UInt8Array = npt.NDArray[np.uint8]

#: Sample rates accepted on the wire.
SUPPORTED_RATES_HZ = (8000, 16000, 24000, 48000)


class WireEncoding(Enum):
    """Sample encodings accepted on the wire (mirrors ``voxgate.v1.Encoding``)."""

    LINEAR16 = 1
    MULAW = 2
    ALAW = 3


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
