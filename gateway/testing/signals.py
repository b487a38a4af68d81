"""Deterministic non-speech test signals that make Whisper hallucinate, and their VAD-like stats.

The *hallucination set* is what a phone line carries between words: digital silence, noise of
several colours and levels, clicks, mains hum, DTMF, breathing, and μ-law quantisation noise.
The gateway must emit zero words for every item. Several items (DTMF, hum, loud noise) are loud
enough that an energy VAD, and webrtcvad, call them speech, so rejecting them is the job of the
decode-side gates, not of the pre-decode skip.

Everything is float32 mono at 16 kHz and reproducible from ``seed``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from voxgate.common.pcm import MULAW_DECODE, MULAW_ENCODE, float_to_pcm16, pcm16_to_float
from voxgate.engines.base import ASR_SAMPLE_RATE_HZ, FloatArray, UtteranceStats, dbfs

__all__ = [
    "TestSignal",
    "hallucination_set",
    "mulaw_decode",
    "mulaw_encode",
    "stats_for",
]

_SR = ASR_SAMPLE_RATE_HZ


@dataclass(frozen=True, slots=True)
class TestSignal:
    """A named test signal.

    Attributes:
        name: short identifier, e.g. ``"pink_-35dBFS"``.
        samples: float32 mono samples at 16 kHz in [-1, 1].
    """

    name: str
    samples: FloatArray

    __test__ = False  # not a pytest test class despite the name


def _db(level_dbfs: float) -> float:
    return float(10.0 ** (level_dbfs / 20.0))


def _to_rms(x: npt.NDArray[np.float64], level_dbfs: float) -> FloatArray:
    rms = float(np.sqrt(np.mean(x**2))) or 1.0
    return np.clip(x * (_db(level_dbfs) / rms), -1.0, 1.0).astype(np.float32)


def _coloured(rng: np.random.Generator, n: int, exponent: float) -> npt.NDArray[np.float64]:
    """Noise with power spectrum ~ 1/f**exponent (0 white, 1 pink, 2 brown), shaped by FFT."""
    spec = np.fft.rfft(rng.standard_normal(n))
    f = np.fft.rfftfreq(n, 1.0 / _SR)
    f[0] = f[1]
    spec *= f ** (-exponent / 2.0)
    spec[f < 20.0] = 0.0  # no DC or sub-audio rumble, as a real line would not pass them
    return np.fft.irfft(spec, n)


def _bandpass(x: npt.NDArray[np.float64], lo_hz: float, hi_hz: float) -> npt.NDArray[np.float64]:
    spec = np.fft.rfft(x)
    f = np.fft.rfftfreq(len(x), 1.0 / _SR)
    spec[(f < lo_hz) | (f > hi_hz)] = 0.0
    return np.fft.irfft(spec, len(x))


def mulaw_encode(x: npt.NDArray[np.floating]) -> npt.NDArray[np.uint8]:
    """Float samples to G.711 μ-law codes, with the gateway's own (bit-exact) tables."""
    pcm = float_to_pcm16(np.asarray(x, dtype=np.float32))
    code: npt.NDArray[np.uint8] = MULAW_ENCODE[pcm.astype(np.int64) + 32768]
    return code


def mulaw_decode(code: npt.NDArray[np.uint8]) -> FloatArray:
    """G.711 μ-law codes back to float samples (inverse of :func:`mulaw_encode`)."""
    return pcm16_to_float(MULAW_DECODE[code])


def _dtmf(digits: str, tone_s: float, gap_s: float, level_dbfs: float) -> FloatArray:
    rows = {"1": 697, "2": 697, "3": 697, "4": 770, "5": 770, "6": 770, "7": 852, "8": 852}
    rows.update({"9": 852, "*": 941, "0": 941, "#": 941})
    cols = {"1": 1209, "4": 1209, "7": 1209, "*": 1209, "2": 1336, "5": 1336, "8": 1336}
    cols.update({"0": 1336, "3": 1477, "6": 1477, "9": 1477, "#": 1477})
    t = np.arange(int(tone_s * _SR)) / _SR
    parts = [np.zeros(int(0.3 * _SR))]
    for d in digits:
        parts.append(np.sin(2 * np.pi * rows[d] * t) + np.sin(2 * np.pi * cols[d] * t))
        parts.append(np.zeros(int(gap_s * _SR)))
    x = np.concatenate(parts)
    return (x * (_db(level_dbfs) / 2.0)).astype(np.float32)


def _hum(freq_hz: float, seconds: float, level_dbfs: float) -> FloatArray:
    t = np.arange(int(seconds * _SR)) / _SR
    x = sum(
        a * np.sin(2 * np.pi * freq_hz * k * t + k)
        for k, a in ((1, 1.0), (2, 0.5), (3, 0.35), (5, 0.2), (7, 0.1))
    )
    return _to_rms(np.asarray(x, dtype=np.float64), level_dbfs)


def hallucination_set(seed: int = 1234) -> list[TestSignal]:
    """Build the hallucination set: every item should produce zero words.

    Args:
        seed: seeds every random component, so the set is identical run to run.

    Returns:
        About twenty named signals of 1-5 s each.
    """
    rng = np.random.default_rng(seed)
    out: list[TestSignal] = [TestSignal("digital_silence", np.zeros(2 * _SR, np.float32))]
    for level in (-60.0, -45.0, -30.0):
        out.append(TestSignal(f"white_{level:.0f}dBFS", _to_rms(_coloured(rng, 3 * _SR, 0), level)))
    for level in (-50.0, -35.0):
        out.append(TestSignal(f"pink_{level:.0f}dBFS", _to_rms(_coloured(rng, 3 * _SR, 1), level)))
    for level in (-45.0, -30.0):
        out.append(TestSignal(f"brown_{level:.0f}dBFS", _to_rms(_coloured(rng, 3 * _SR, 2), level)))

    clicks = _coloured(rng, 3 * _SR, 1) * _db(-70.0)
    for pos in rng.integers(0, 3 * _SR - 40, size=12):
        clicks[pos : pos + 40] += np.hanning(40) * _db(-12.0) * rng.choice([-1.0, 1.0])
    out.append(TestSignal("clicks", clicks.astype(np.float32)))

    out.append(TestSignal("hum_50hz_-30dBFS", _hum(50.0, 3.0, -30.0)))
    out.append(TestSignal("hum_60hz_-40dBFS", _hum(60.0, 3.0, -40.0)))
    out.append(TestSignal("dtmf_digits", _dtmf("5551234#", 0.12, 0.08, -12.0)))
    out.append(TestSignal("dtmf_long_tone", _dtmf("0", 1.5, 0.5, -15.0)))

    n = 4 * _SR
    env = np.zeros(n)
    for start_s, in_s, out_s in ((0.3, 0.6, 0.8), (2.1, 0.5, 0.9)):
        a, b, c = (int(v * _SR) for v in (start_s, start_s + in_s, start_s + in_s + out_s))
        env[a:b] = np.linspace(0, 1, b - a) ** 2
        env[b:c] = np.linspace(1, 0, c - b) ** 1.5
    breath = _bandpass(rng.standard_normal(n), 300.0, 2500.0) * env
    out.append(TestSignal("breathing", _to_rms(breath, -35.0)))

    faint = _coloured(rng, 3 * _SR, 1) * _db(-58.0)
    out.append(TestSignal("mulaw_faint_noise", mulaw_decode(mulaw_encode(faint))))
    idle = rng.choice([-1.0, 0.0, 1.0], size=3 * _SR) * 2.0 / 32768.0  # idle-channel LSB toggling
    out.append(TestSignal("mulaw_idle_channel", mulaw_decode(mulaw_encode(idle))))
    hum_mu = mulaw_decode(mulaw_encode(_hum(50.0, 3.0, -45.0)))
    out.append(TestSignal("mulaw_hum_-45dBFS", hum_mu))
    return out


def stats_for(
    samples: FloatArray, threshold_dbfs: float = -50.0, frame_ms: int = 20
) -> UtteranceStats:
    """Energy-VAD statistics for a signal, standing in for the segmenter's webrtcvad stats.

    A frame counts as speech when its RMS is above ``threshold_dbfs``, which, like a real VAD
    on a phone line, marks tones, hum and loud noise as speech.

    Args:
        samples: float32 mono at 16 kHz.
        threshold_dbfs: frame RMS above which a frame is "voiced".
        frame_ms: analysis frame length.
    """
    hop = _SR * frame_ms // 1000
    n_frames = len(samples) // hop
    frames = samples[: n_frames * hop].reshape(n_frames, hop)
    voiced = np.array([dbfs(f) > threshold_dbfs for f in frames], dtype=bool)
    return UtteranceStats.from_frames(samples, voiced, frame_ms)
