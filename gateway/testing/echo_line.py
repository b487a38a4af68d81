"""A simulated phone line that echoes the bot's reply back into the caller's audio.

For echo tests and the barge-in benchmark: the client side of a call plays the reply audio it
receives (as a phone does: each frame from its arrival, or right after the frame before it)
and the line returns that playout, ``delay_ms`` late and ``level_db`` down, mixed into what the
caller sends. A test signal, not a model of any particular hybrid: the echo path is flat unless
``path`` gives it an impulse response (a hybrid spreads echo over milliseconds).
"""

from __future__ import annotations

import numpy as np

from voxgate.common.pcm import FloatArray

__all__ = ["EchoLine", "dispersive_path"]


class EchoLine:
    """The caller's end of a line: reply playout in, echo out, on one clock (seconds).

    Args:
        rate_hz: sample rate of the audio given to :meth:`heard` and taken from :meth:`echo`.
        level_db: echo level relative to the playout (-10 = 10 dB down).
        delay_ms: echo path delay after playout.
        jitter_ms: the phone's jitter buffer: playout starts this long after the first frame
            of a reply arrived, so that frames arriving a little late play without a gap.
        path: the echo path's impulse response at ``rate_hz`` after the bulk delay (scaled
            to unit energy, so ``level_db`` stays the echo's level); None = flat.
    """

    def __init__(
        self,
        rate_hz: int,
        level_db: float,
        delay_ms: float,
        jitter_ms: float = 60.0,
        path: FloatArray | None = None,
    ) -> None:
        self.rate_hz = rate_hz
        self.jitter_s = jitter_ms / 1000.0
        self.gain = float(10.0 ** (level_db / 20.0))
        self.delay_s = delay_ms / 1000.0
        self.path = (
            None
            if path is None
            else np.asarray(path, np.float64) / float(np.sqrt(np.sum(np.square(path))))
        )
        self._origin: float | None = None  # clock time of sample 0 of the playout
        self._played = np.zeros(0, np.float32)

    def heard(self, samples: FloatArray, arrived_at: float) -> None:
        """A reply frame reached the phone at ``arrived_at``; it plays ``jitter_ms`` later.

        A frame that arrives while earlier audio is still playing queues behind it, as a
        phone's jitter buffer plays it; after an underrun the buffer fills again first.
        """
        if self._origin is None:
            self._origin = arrived_at + self.jitter_s
        # After an underrun the buffer fills again before playout resumes.
        start = max(
            round((arrived_at + self.jitter_s - self._origin) * self.rate_hz), len(self._played)
        )
        if start > len(self._played):
            self._played = np.concatenate(
                [self._played, np.zeros(start - len(self._played), np.float32)]
            )
        self._played = np.concatenate([self._played, np.asarray(samples, np.float32)])

    def echo(self, at: float, n: int) -> FloatArray:
        """The ``n`` echo samples that reach the line at clock times from ``at`` on."""
        out = np.zeros(n, np.float32)
        if self._origin is None:
            return out
        first = round((at - self.delay_s - self._origin) * self.rate_hz)
        taps = 0 if self.path is None else len(self.path) - 1
        start = first - taps  # the path reaches this far back
        seg = np.zeros(n + taps, np.float32)
        lo, hi = max(start, 0), min(first + n, len(self._played))
        if hi > lo:
            seg[lo - start : hi - start] = self._played[lo:hi]
        if self.path is not None:
            seg = np.convolve(seg, self.path, mode="valid").astype(np.float32)
        return (seg * self.gain).astype(np.float32)


def dispersive_path(tau_ms: float) -> FloatArray:
    """An echo path that spreads: 12 ms at 8 kHz of a 1.6 kHz ring decaying with ``tau_ms``.

    A test shape, not a measured hybrid: real line echo spreads over a few milliseconds
    after its bulk delay (ITU-T G.168's model paths), a speakerphone's over far more.
    """
    n = np.arange(96)
    ring: FloatArray = np.exp(-n / (8 * tau_ms)) * np.cos(2 * np.pi * 0.2 * n + 0.5)
    return ring.astype(np.float32)
