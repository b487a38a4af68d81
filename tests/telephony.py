"""A telephony test set, generated at run time from the shared speech clips and synthetic signals.

Nothing large is committed: every item is a deterministic function of a seed. Signals are
float32 mono 16 kHz (the segmenter's rate) until :func:`through_mulaw_8k` sends them down a
phone line: 8 kHz, G.711 μ-law, and back up as the gateway's input decoder would see them.

* line noises: :func:`hum` (50/60 Hz mains with harmonics), :func:`hiss` (white),
  :func:`pink`, :func:`babble` (other talkers, attenuated), :func:`clicks`;
* :func:`mix_at_snr` lays a noise under a speech clip at an SNR measured on the speech;
* DTMF: :func:`dtmf_tone` at a level in dBm0 with twist, :func:`dtmf_sequence` with gaps;
* :func:`non_speech_files`: each noise alone, digital silence, DTMF, and the composite
  ``line_noise`` file (silence, white, pink, hum, clicks, four DTMF tones);
* :func:`noisy_clips`: each real clip with each noise at 20, 10 and 5 dB SNR.

Levels: speech clips sit near -20 dBFS; noises alone are made at the level they have in a
10 dB SNR mix against -20 dBFS speech (-30 dBFS), which is a loud line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import soxr
from conftest import SPEECH_DIR, read_wav_int16

from voxgate.common.pcm import (
    ALAW_DECODE,
    ALAW_ENCODE,
    MULAW_DECODE,
    MULAW_ENCODE,
    float_to_pcm16,
    pcm16_to_float,
)
from voxgate.gateway.dtmf import DTMF_HIGH_HZ, DTMF_KEYS, DTMF_LOW_HZ, dbm0_to_rms

__all__ = [
    "NOISES",
    "SNRS_DB",
    "Clip",
    "babble",
    "clicks",
    "dtmf_sequence",
    "dtmf_tone",
    "hiss",
    "hum",
    "line_noise",
    "load_clips",
    "mix_at_snr",
    "noise",
    "noisy_clips",
    "non_speech_files",
    "pink",
    "rms_dbfs",
    "through_alaw_8k",
    "through_mulaw_8k",
    "to_alaw_8k",
    "to_mulaw_8k",
]

SR = 16_000
F32 = npt.NDArray[np.float32]
#: The noises every clip is mixed with.
NOISES = ("hum", "hiss", "babble", "clicks")
SNRS_DB = (20.0, 10.0, 5.0)
#: Level of a noise file alone, dBFS RMS.
NOISE_ALONE_DBFS = -30.0


@dataclass(frozen=True, slots=True)
class Clip:
    """A shared speech clip with its reference transcript."""

    name: str
    audio: F32
    text: str


def load_clips(speech_dir: Path = SPEECH_DIR, limit: int | None = None) -> list[Clip]:
    """The shared clips (16 kHz float32) in manifest order."""
    rows = [json.loads(line) for line in (speech_dir / "manifest.jsonl").read_text().splitlines()]
    out = []
    for row in rows[:limit]:
        pcm, sr = read_wav_int16(speech_dir / row["file"])
        assert sr == SR
        out.append(Clip(row["file"], pcm16_to_float(pcm).astype(np.float32), row["text"]))
    return out


def rms_dbfs(x: npt.NDArray[np.floating]) -> float:
    """RMS level in dBFS (-120 for digital silence)."""
    ms = float(np.mean(np.square(x, dtype=np.float64))) if len(x) else 0.0
    return 10 * np.log10(ms) if ms > 1e-12 else -120.0


def _at(x: npt.NDArray[np.float64], level_dbfs: float) -> F32:
    ms = float(np.mean(x * x)) or 1.0
    return (x * (10 ** (level_dbfs / 20) / np.sqrt(ms))).astype(np.float32)


def hum(n: int, mains_hz: float = 50.0, level_dbfs: float = NOISE_ALONE_DBFS) -> F32:
    """Mains hum: the fundamental and harmonics 2-6 (odd ones stronger, as from a transformer);
    the telephone band passes the harmonics, the 8 kHz line loses little of them."""
    t = np.arange(n) / SR
    amps = {1: 1.0, 2: 0.3, 3: 0.6, 4: 0.15, 5: 0.35, 6: 0.1}
    x = sum(a * np.sin(2 * np.pi * mains_hz * k * t + 0.3 * k) for k, a in amps.items())
    return _at(np.asarray(x), level_dbfs)


def hiss(n: int, seed: int = 0, level_dbfs: float = NOISE_ALONE_DBFS) -> F32:
    """White noise (line hiss)."""
    return _at(np.random.default_rng(seed).standard_normal(n), level_dbfs)


def pink(n: int, seed: int = 0, level_dbfs: float = NOISE_ALONE_DBFS) -> F32:
    """Pink (1/f) noise, shaped by FFT."""
    spec = np.fft.rfft(np.random.default_rng(seed).standard_normal(n))
    f = np.fft.rfftfreq(n, 1 / SR)
    spec[1:] /= np.sqrt(f[1:])
    spec[0] = 0
    return _at(np.fft.irfft(spec, n), level_dbfs)


def clicks(n: int, seed: int = 0, per_s: float = 3.0, peak_dbfs: float = -10.0) -> F32:
    """Line clicks: short decaying bursts (1-4 ms) at random times, random polarity."""
    rng = np.random.default_rng(seed)
    x = np.zeros(n)
    count = max(1, int(per_s * n / SR))
    peak = 10 ** (peak_dbfs / 20)
    for at in rng.integers(0, max(1, n - 80), size=count):
        length = int(rng.integers(16, 64))
        burst = rng.standard_normal(length) * np.exp(-np.arange(length) / (length / 4))
        x[at : at + length] += peak * burst / np.max(np.abs(burst)) * rng.choice([-1.0, 1.0])
    return np.clip(x, -1, 1).astype(np.float32)


def babble(
    n: int, others: Sequence[F32], seed: int = 0, level_dbfs: float = NOISE_ALONE_DBFS
) -> F32:
    """Other talkers: up to six other clips, looped from random offsets, summed, attenuated."""
    rng = np.random.default_rng(seed)
    x = np.zeros(n)
    picks = rng.permutation(len(others))[:6]
    for i in picks:
        src = others[int(i)]
        start = int(rng.integers(0, len(src)))
        reps = int(np.ceil((n + start) / len(src))) + 1
        x += np.tile(src, reps)[start : start + n]
    return _at(x, level_dbfs)


def noise(kind: str, n: int, seed: int = 0, others: Sequence[F32] = ()) -> F32:
    """One of :data:`NOISES` (or ``pink``/``hum60``/``silence``) of ``n`` samples."""
    if kind == "hum":
        return hum(n, 50.0)
    if kind == "hum60":
        return hum(n, 60.0)
    if kind == "hiss":
        return hiss(n, seed)
    if kind == "pink":
        return pink(n, seed)
    if kind == "clicks":
        return clicks(n, seed)
    if kind == "babble":
        if not others:
            raise ValueError("babble needs other clips")
        return babble(n, others, seed)
    if kind == "silence":
        return np.zeros(n, dtype=np.float32)
    raise ValueError(f"unknown noise {kind!r}")


def mix_at_snr(speech: F32, noise_: F32, snr_db: float) -> F32:
    """Speech plus noise scaled so that speech RMS / noise RMS = ``snr_db``.

    Speech RMS is taken over its active part (20 ms frames within 30 dB of its loudest), so a
    clip's leading silence does not make the noise look quieter than it sounds.
    """
    frames = speech[: len(speech) // 320 * 320].reshape(-1, 320).astype(np.float64)
    e = np.mean(frames**2, axis=1)
    active = e[e >= e.max() * 1e-3]
    s_ms = float(np.mean(active))
    n_ms = float(np.mean(np.square(noise_[: len(speech)], dtype=np.float64))) or 1.0
    gain = np.sqrt(s_ms / n_ms / 10 ** (snr_db / 10))
    return np.clip(speech + gain * noise_[: len(speech)], -1, 1).astype(np.float32)


def dtmf_tone(
    key: str, ms: float, level_dbm0: float = -10.0, twist_db: float = 0.0, rate: int = SR
) -> F32:
    """One keypad tone: each frequency at ``level_dbm0``; the high one ``twist_db`` louder."""
    row = next(i for i, r in enumerate(DTMF_KEYS) if key in r)
    col = DTMF_KEYS[row].index(key)
    t = np.arange(int(rate * ms / 1000)) / rate
    a = dbm0_to_rms(level_dbm0) * np.sqrt(2)
    x = a * np.sin(2 * np.pi * DTMF_LOW_HZ[row] * t) + a * 10 ** (twist_db / 20) * np.sin(
        2 * np.pi * DTMF_HIGH_HZ[col] * t
    )
    return x.astype(np.float32)


def dtmf_sequence(
    keys: str, tone_ms: float = 100, gap_ms: float = 80, level_dbm0: float = -10.0
) -> F32:
    """Keys with gaps of digital silence between them (and after the last)."""
    gap = np.zeros(int(SR * gap_ms / 1000), dtype=np.float32)
    return np.concatenate([np.concatenate([dtmf_tone(k, tone_ms, level_dbm0), gap]) for k in keys])


def line_noise(seed: int = 0) -> F32:
    """The composite non-speech file: silence, white, pink, 50 Hz hum, clicks, four tones."""
    s = SR
    parts = [
        np.zeros(2 * s, dtype=np.float32),
        hiss(3 * s, seed, -35.0),
        pink(3 * s, seed + 1, -35.0),
        hum(3 * s, 50.0, -25.0),
        clicks(3 * s, seed + 2),
        dtmf_sequence("1590", 150, 350, -8.0),
        np.zeros(2 * s, dtype=np.float32),
    ]
    return np.concatenate(parts)


def non_speech_files(
    seconds: float = 20.0, others: Sequence[F32] = (), seed: int = 0
) -> dict[str, F32]:
    """Each noise alone (babble only when ``others`` is given), silence, DTMF, the composite."""
    n = int(seconds * SR)
    kinds = ["silence", "hum", "hum60", "hiss", "pink", "clicks"]
    if others:
        kinds.append("babble")
    out = {k: noise(k, n, seed, others) for k in kinds}
    out["hum60"] = hum(n, 60.0, -20.0)  # a loud 60 Hz line, from the first sample on
    seq = dtmf_sequence("0123456789*#ABCD", 120, 200, -10.0)
    out["dtmf"] = np.tile(seq, int(np.ceil(n / len(seq))))[:n]
    out["line_noise"] = line_noise(seed)
    return out


def noisy_clips(
    clips: Sequence[Clip], snrs: Sequence[float] = SNRS_DB, kinds: Sequence[str] = NOISES
) -> Iterator[tuple[str, float, Clip]]:
    """Every clip mixed with every noise at every SNR: ``(noise, snr, clip)``; deterministic."""
    for i, clip in enumerate(clips):
        others = [c.audio for j, c in enumerate(clips) if j != i]
        for kind in kinds:
            nz = noise(kind, len(clip.audio), seed=i, others=others)
            for snr in snrs:
                yield kind, snr, Clip(clip.name, mix_at_snr(clip.audio, nz, snr), clip.text)


def to_mulaw_8k(x16: F32) -> bytes:
    """16 kHz float32 → 8 kHz μ-law bytes, as a phone line carries it."""
    x8 = soxr.resample(x16, SR, 8000)
    return bytes(MULAW_ENCODE[float_to_pcm16(x8).astype(np.int64) + 32768].tobytes())


def to_alaw_8k(x16: F32) -> bytes:
    """16 kHz float32 → 8 kHz A-law bytes."""
    x8 = soxr.resample(x16, SR, 8000)
    return bytes(ALAW_ENCODE[float_to_pcm16(x8).astype(np.int64) + 32768].tobytes())


def through_mulaw_8k(x16: F32) -> F32:
    """The signal after a μ-law 8 kHz line, back at 16 kHz."""
    codes = np.frombuffer(to_mulaw_8k(x16), dtype=np.uint8)
    return soxr.resample(pcm16_to_float(MULAW_DECODE[codes]), 8000, SR).astype(np.float32)


def through_alaw_8k(x16: F32) -> F32:
    """The signal after an A-law 8 kHz line, back at 16 kHz."""
    codes = np.frombuffer(to_alaw_8k(x16), dtype=np.uint8)
    return soxr.resample(pcm16_to_float(ALAW_DECODE[codes]), 8000, SR).astype(np.float32)
