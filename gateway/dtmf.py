"""In-band DTMF: a Goertzel detector on the eight keypad frequencies, and a gate for the VAD.

Many lines carry keypad tones in the audio instead of RFC 4733 events. :class:`DtmfGate` sits
between the input decoder and the segmenter of one call: it reports each digit once, when the
tone ends (with its duration, like an RFC 4733 end event), and it silences the samples a tone
occupies, so a tone never opens an utterance, never barges in and never reaches Whisper.

Detection follows the usual reading of ITU-T Q.24 (and the Bellcore figures most
administrations adopt):

* analysis: 20 ms rectangular windows at 16 kHz (50 Hz bins; the closest DTMF pair is 73 Hz
  apart) every 10 ms; the DFT at each of the eight exact frequencies (Goertzel, done as one
  matrix product per push);
* a window is a *tone window* when the strongest low-group and high-group frequencies are each
  at least ``min_level_dbm0``, each stands ``6 dB`` above the others of its group, the pair
  carries at least 75 % of the window's power (speech and noise spread theirs), and the twist
  (high minus low) lies in ``[-max_twist_db, +max_reverse_twist_db]`` (8 dB normal, 4 dB
  reverse by default);
* duration: a digit is confirmed after three consecutive tone windows of the same pair, which
  accepts every tone of 40 ms or more and rejects every tone under 28 ms (Q.24 asks to reject
  under 23 ms); it ends after three windows without it, which bridges a 10 ms interruption and
  recognises a 40 ms pause.

The gate holds back 30 ms of audio (one window and one hop): a sample can only be passed on once
every window that may claim it has been analysed. The segmenter's offsets count samples, not
wall time, so event offsets do not move; events leave at most 30 ms later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from voxgate.engines.base import ASR_SAMPLE_RATE_HZ, FloatArray
from voxgate.gateway.config import DtmfConfig

__all__ = ["DTMF_HIGH_HZ", "DTMF_KEYS", "DTMF_LOW_HZ", "DtmfDigit", "DtmfGate", "dbm0_to_rms"]

DTMF_LOW_HZ = (697.0, 770.0, 852.0, 941.0)
DTMF_HIGH_HZ = (1209.0, 1336.0, 1477.0, 1633.0)
#: Keypad layout: row = low-group frequency, column = high-group frequency.
DTMF_KEYS = ("123A", "456B", "789C", "*0#D")

_RATE = ASR_SAMPLE_RATE_HZ
_WIN = _RATE * 20 // 1000  # 320 samples
_HOP = _RATE * 10 // 1000  # 160 samples
_CONFIRM = 3  # consecutive tone windows that confirm a digit
_RELEASE = 3  # consecutive windows without it that end a digit
_GROUP_MARGIN = 10 ** (6.0 / 10)  # the strongest of a group over the second, power ratio
_PURITY = 0.75  # the pair's share of the window's power

#: Mean square of a 0 dBm0 sine in float full scale: G.711's largest sine is +3.17 dBm0.
_DBM0_MS = 0.5 * 10 ** (-3.17 / 10)


def dbm0_to_rms(level_dbm0: float) -> float:
    """RMS (float full scale) of a sine at ``level_dbm0``; -3 dBm0 is ~0.35."""
    return math.sqrt(_DBM0_MS * 10 ** (level_dbm0 / 10))


def _basis() -> npt.NDArray[np.float64]:
    """``[WIN, 16]``: cos and sin at the eight frequencies, for the DFT of one window."""
    t = np.arange(_WIN) / _RATE
    freqs = np.array(DTMF_LOW_HZ + DTMF_HIGH_HZ)
    arg = 2.0 * np.pi * np.outer(t, freqs)
    return np.concatenate([np.cos(arg), np.sin(arg)], axis=1)


_BASIS = _basis().astype(np.float32)
_BASIS_FIRST, _BASIS_SECOND = _BASIS[:_HOP].copy(), _BASIS[_HOP:].copy()
_SCALE = np.float32(2.0 / (_WIN * _WIN))


@dataclass(frozen=True, slots=True)
class DtmfDigit:
    """A keypad digit heard in the audio.

    Attributes:
        digit: one of ``0-9 * # A-D``.
        offset_ms: call offset where the tone began.
        duration_ms: how long it lasted (10 ms resolution).
    """

    digit: str
    offset_ms: int
    duration_ms: int


class DtmfGate:
    """One call's in-band DTMF detector and VAD gate, over 16 kHz float32 audio. No I/O.

    Args:
        config: thresholds (levels in dBm0, twists in dB).
    """

    #: Samples the gate holds back (one window plus one hop).
    DELAY_SAMPLES = _WIN + _HOP

    def __init__(self, config: DtmfConfig) -> None:
        self._min_ms = _DBM0_MS * 10 ** (config.min_level_dbm0 / 10)
        self._twist_lo = 10 ** (-config.max_twist_db / 10)  # high/low power, normal twist
        self._twist_hi = 10 ** (config.max_reverse_twist_db / 10)
        self._buf = np.zeros(0, dtype=np.float32)  # samples not yet passed on
        self._claims: list[tuple[int, int]] = []  # absolute spans that tone windows claim
        self._base = 0  # absolute index of _buf[0]
        self._next_win = 0  # absolute start of the next window to analyse
        self._run_key: str | None = None
        self._run_len = 0
        self._run_start = 0
        self._active: str | None = None
        self._active_start = 0
        self._active_last = 0
        self._gap = 0

    def push(self, samples: FloatArray) -> tuple[FloatArray, list[DtmfDigit]]:
        """Feed samples; return the samples now safe to pass on (tones silenced) and digits."""
        self._buf = np.concatenate([self._buf, samples.astype(np.float32, copy=False)])
        digits: list[DtmfDigit] = []
        end = self._base + len(self._buf)
        n = (end - self._next_win - _WIN) // _HOP + 1 if end - self._next_win >= _WIN else 0
        if n > 0:
            off = self._next_win - self._base
            # A window is two consecutive hops: project hops once, add neighbours.
            hops = self._buf[off : off + (n + 1) * _HOP].reshape(n + 1, _HOP)
            keys = self._classify(hops)
            for k, key in enumerate(keys):
                start = self._next_win + k * _HOP
                if key is not None:
                    self._claims.append((start - _HOP, start + _WIN + _HOP))
                self._track(key, start, digits)
            self._next_win += n * _HOP
        # Every window that can claim a sample before `ready` has been analysed.
        ready = max(self._next_win - _HOP - self._base, 0)
        return self._release(ready), digits

    def flush(self) -> tuple[FloatArray, list[DtmfDigit]]:
        """End of the audio: pass on everything held, end a digit in progress."""
        digits: list[DtmfDigit] = []
        if self._active is not None:
            self._emit(digits)
        self._run_key, self._run_len = None, 0
        out = self._release(len(self._buf))
        self._next_win = self._base
        return out, digits

    # -- internals ---------------------------------------------------------------------------------

    def _release(self, n: int) -> FloatArray:
        out = self._buf[:n].copy()
        if self._claims:
            for lo, hi in self._claims:
                out[max(lo - self._base, 0) : max(hi - self._base, 0)] = 0.0
            self._claims = [c for c in self._claims if c[1] > self._base + n]
        self._buf = self._buf[n:]
        self._base += n
        return out

    def _classify(self, hops: npt.NDArray[np.float32]) -> list[str | None]:
        """The key each window (hops k and k+1) carries, or None.

        The tests: levels, group margins, purity, twist. This runs on every 10 ms of every
        call, so the common case (no tone: the pair's share of the power is low) returns after
        a handful of array operations.
        """
        proj = (hops[:-1] @ _BASIS_FIRST) + (hops[1:] @ _BASIS_SECOND)
        sq = proj * proj
        power = (sq[:, :8] + sq[:, 8:]) * _SCALE  # mean square of each tone
        low, high = power[:, :4], power[:, 4:]
        pl, ph = low.max(axis=1), high.max(axis=1)
        energy = np.einsum("ij,ij->i", hops, hops)
        total = (energy[:-1] + energy[1:]) * (1.0 / _WIN)
        cand = (pl + ph >= _PURITY * total) & (np.minimum(pl, ph) >= self._min_ms)
        if not cand.any():
            return [None] * len(total)
        rows = np.arange(len(total))
        li, hi = np.argmax(low, axis=1), np.argmax(high, axis=1)
        low2 = np.partition(low, 2, axis=1)[:, 2]  # the second largest of four
        high2 = np.partition(high, 2, axis=1)[:, 2]
        twist = ph / np.maximum(pl, 1e-20)
        ok = (
            cand
            & (pl >= _GROUP_MARGIN * low2)
            & (ph >= _GROUP_MARGIN * high2)
            & (twist >= self._twist_lo)
            & (twist <= self._twist_hi)
        )
        return [DTMF_KEYS[li[r]][hi[r]] if ok[r] else None for r in rows]

    def _track(self, key: str | None, start: int, digits: list[DtmfDigit]) -> None:
        """The duration rules, one window at a time."""
        if self._active is not None:
            if key == self._active:
                self._gap = 0
                self._active_last = start
            else:
                self._gap += 1
                if self._gap >= _RELEASE:
                    self._emit(digits)
        if key is not None and key == self._run_key:
            self._run_len += 1
        else:
            self._run_key, self._run_len, self._run_start = key, int(key is not None), start
        if self._active is None and self._run_key is not None and self._run_len >= _CONFIRM:
            self._active = self._run_key
            self._active_start = self._run_start
            self._active_last = start
            self._gap = 0

    def _emit(self, digits: list[DtmfDigit]) -> None:
        assert self._active is not None
        ms_per_sample = 1000 / _RATE
        begin = self._active_start
        duration = self._active_last + _WIN - begin
        digits.append(
            DtmfDigit(self._active, round(begin * ms_per_sample), round(duration * ms_per_sample))
        )
        self._active = None
        self._gap = 0
        # A run of the same key that outlived the release is the same press, not a new digit.
        self._run_key, self._run_len = None, 0
