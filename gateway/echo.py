"""The echo guard: the bot's own reply coming back on the caller's line is not the caller.

Phone lines return part of what the caller hears (hybrid echo, speakerphones), typically 10-30 dB
down and 20-250 ms late. Without a guard that echo opens utterances and barges in on the very
reply that caused it. The gateway knows exactly what it played, so for every short block of
inbound audio it asks: is this block, up to a delay and a gain, the reply that was played a
moment ago? It measures that with the normalised cross-correlation between the inbound block
(with a little context) and the recently played reply, over every delay in a range, and
silences blocks that the reply explains (echo suppression, the "non-linear processor" of a line
echo canceller). A block the reply does not explain, such as the caller talking over the echo,
passes unchanged, so the VAD hears that caller as it would without the guard.

Why this and not an adaptive echo canceller, by default (measured by
``benchmarks/echo_canceller.py`` and ``benchmarks/barge_in.py``, see docs/barge-in.md): WebRTC's
AEC3 (``pywebrtc-audio``) removes the echo too, at about the same CPU, but on a line that
returns no echo at all (a digital line) its suppressor held a caller back 0.7-6 s, and it must
converge on every call. The gate needs no convergence (the first echo of a reply is caught),
handles any delay in its range without a hint, and passes the caller's speech as it is. Its
limits: a caller quieter than the bot's own echo (a -10 dB echo and a soft talker) is heard
only once they are louder than the echo, since a block that the echo explains is silenced;
and echo that a hybrid spreads over a millisecond or more is not one delay and gain, so the
gate recognises only parts of it. For such lines :class:`LineEchoCanceller` runs AEC3 instead
(``session.barge_in.echo_canceller: aec3``). :class:`GatedEchoCanceller` (``gate_aec3``) runs
both: the gate chooses the blocks, AEC3's output fills the ones it calls echo, so that a quiet
caller over a loud flat echo is heard sooner and a line without echo is not held back.

Pure and synchronous (no asyncio, no I/O): the session stamps both directions with its loop
clock, which the virtual clock of the tests drives exactly.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np
import numpy.typing as npt

from voxgate.engines.base import ASR_SAMPLE_RATE_HZ, FloatArray

__all__ = [
    "EchoGuard",
    "EchoGuardStats",
    "GatedEchoCanceller",
    "LineEchoCanceller",
    "echo_similarity",
]

#: Analysis rate: call audio is band-limited to 4 kHz on a phone line, and half the samples make
#: the correlation four times cheaper.
ANALYSIS_RATE_HZ = 8000
_DECIMATE = ASR_SAMPLE_RATE_HZ // ANALYSIS_RATE_HZ


def echo_similarity(
    block: npt.NDArray[np.float64], reference: npt.NDArray[np.float64]
) -> tuple[float, int, float]:
    """Best normalised cross-correlation of ``block`` against every window of ``reference``.

    Returns ``(rho, k, gain)``: ``|rho|`` in [0, 1] is the largest magnitude over the offsets
    ``k`` (``reference[k:k+len(block)]``), and ``gain`` the least-squares scale of that window
    onto the block. Polarity does not matter (an echo path may invert it). FFT-based: one call
    costs well under a millisecond for a 60 ms block against 600 ms of reference at 8 kHz.
    """
    n, m = len(block), len(reference)
    if n == 0 or m < n:
        return 0.0, 0, 0.0
    size = 1 << (n + m - 1).bit_length()
    corr = np.fft.irfft(np.fft.rfft(reference, size) * np.conj(np.fft.rfft(block, size)), size)
    corr = corr[: m - n + 1]
    csum = np.concatenate([[0.0], np.cumsum(reference * reference)])
    energy = csum[n:] - csum[:-n]
    block_energy = float(np.dot(block, block))
    if block_energy <= 0.0:
        return 0.0, 0, 0.0
    # Windows of (near-)silent reference cannot explain anything: keep them out of the max.
    floor = max(float(energy.max()) * 1e-3, 1e-12)
    rho = np.where(energy > floor, corr / np.sqrt(block_energy * np.maximum(energy, floor)), 0.0)
    k = int(np.argmax(np.abs(rho)))
    return float(abs(rho[k])), k, float(corr[k] / max(energy[k], 1e-12))


def _direct_similarity(
    block: npt.NDArray[np.float64], reference: npt.NDArray[np.float64]
) -> tuple[float, int, float]:
    """:func:`echo_similarity` by a direct product, for a reference only a little longer."""
    n = len(block)
    windows = np.lib.stride_tricks.sliding_window_view(reference, n)
    corr = windows @ block
    energy = np.einsum("ij,ij->i", windows, windows)
    block_energy = float(np.dot(block, block))
    if block_energy <= 0.0:
        return 0.0, 0, 0.0
    floor = max(float(energy.max()) * 1e-3, 1e-12)
    rho = np.where(energy > floor, corr / np.sqrt(block_energy * np.maximum(energy, floor)), 0.0)
    k = int(np.argmax(np.abs(rho)))
    return float(abs(rho[k])), k, float(corr[k] / max(energy[k], 1e-12))


class EchoGuardStats:
    """What a guard did on one call (for tests, metrics and the benchmark)."""

    __slots__ = ("blocks_by_level", "blocks_checked", "blocks_suppressed")

    def __init__(self) -> None:
        self.blocks_checked = 0
        self.blocks_suppressed = 0
        self.blocks_by_level = 0  # suppressed by the level test (see _no_louder_than_echo)


class EchoGuard:
    """Suppresses inbound audio that is the echo of what the caller was just played. One per call.

    Both directions are 16 kHz float32 stamped with the session's loop clock: :meth:`played`
    takes reply audio at the time it plays to the caller, :meth:`process` takes inbound audio at
    the time its last sample arrived and returns it, echo blocks attenuated.

    Args:
        min_delay_ms: the earliest the echo may arrive relative to the playout stamp; negative,
            because reply audio leaves ``playout_lead_ms`` before it is due and a client may
            play it at once.
        max_delay_ms: the latest (echo path delay plus network, both ways).
        window_ms: inbound context correlated per block; long enough to be unmistakable, short
            enough that a caller who starts talking lowers the correlation within a block.
        block_ms: decision granularity; also the length of the gain ramp's neighbourhood.
        threshold: correlation from which a block counts as echo. Echo through two G.711
            passes correlates > 0.95; a caller over the echo at equal level ~0.7, 10 dB louder
            ~0.3; unrelated speech stays below ~0.5 over a 60 ms window.
        max_gain: largest echo gain believed (an echo is not louder than what was played).
        suppress_db: attenuation applied to echo blocks; in effect silence, because webrtcvad
            still calls echo 45 dB down (about -65 dBFS) speech.
        history_ms: how long played audio is kept.
    """

    RAMP_SAMPLES = 40  # 2.5 ms at 16 kHz: gain changes without a click
    LEVEL_SPAN_MS = 150  # the level test looks this far either side of the last delay
    LEVEL_MARGIN = 1.0  # and lets a block be no louder than the loudest echo there
    LEVEL_HOLD_S = 2.0  # for this long after a delay last explained a block clearly:
    LEARN_RHO = 0.75  # a match this close,
    LEVEL_MAX_GAIN = 0.5  # of an echo at least 6 dB down (phone echo is 10-30 dB down)
    CLEAR_RHO = 0.9  # a block this close is the echo, ~9 dB over anything else in it

    def __init__(
        self,
        *,
        min_delay_ms: int = -200,
        max_delay_ms: int = 700,
        window_ms: int = 40,
        block_ms: int = 20,
        threshold: float = 0.6,
        max_gain: float = 2.0,
        suppress_db: float = -90.0,
        history_ms: int = 1500,
    ) -> None:
        if max_delay_ms <= min_delay_ms:
            raise ValueError("max_delay_ms must exceed min_delay_ms")
        fs = ANALYSIS_RATE_HZ
        self._min_lag = min_delay_ms * fs // 1000
        self._max_lag = max_delay_ms * fs // 1000
        self._window = window_ms * fs // 1000
        self._block = block_ms * ASR_SAMPLE_RATE_HZ // 1000
        self._threshold = threshold
        self._max_gain = max_gain
        self._suppress = float(10.0 ** (suppress_db / 20.0))
        self._history = history_ms * fs // 1000
        # Played audio at 8 kHz on the loop clock.
        self._playout = _Playout(fs, self._history, np.float64)
        # Inbound context at 8 kHz (the last window's worth) and the last applied gain.
        self._ctx = np.zeros(0, np.float64)
        self._gain = 1.0
        # Offset into the correlated reference span of the last echo found (a delay), and how
        # far around it the cheap search looks: +-10 ms of jitter.
        self._lag_index: int | None = None
        self._clock = _SteadyClock()
        self._echo_gain = 0.0  # measured on blocks a delay explained; 0 = not yet
        self._last_echo = False  # the block before was echo
        self._t_end = 0.0  # the block being decided
        self._confirmed_at = -math.inf  # when a delay last explained a block
        self._level_span = self.LEVEL_SPAN_MS * fs // 1000
        self._track = 10 * fs // 1000
        #: The last :meth:`process` call's echo blocks: ``(lo, hi, rho)``, the sample range and
        #: the block's own correlation with the reply (0 for a block the level test took).
        self.last_echo_blocks: list[tuple[int, int, float]] = []
        self._block_rho = 0.0
        #: How often the echo's delay, as blocks it clearly explains place it, moved by more
        #: than the cheap search's reach (the far end's playout shifted): an echo canceller
        #: beside the gate must find it again.
        self.delay_jumps = 0
        self._clear_lag: int | None = None
        self.stats = EchoGuardStats()

    # -- reply side --------------------------------------------------------------------------

    def played(self, samples: FloatArray, at: float) -> None:
        """Record reply audio (16 kHz) whose first sample plays to the caller at ``at``."""
        self._playout.add(np.asarray(samples, np.float64)[::_DECIMATE], at)

    def active(self, now: float) -> bool:
        """Whether an echo of played audio can still arrive at ``now``."""
        return now <= self._playout.last_t + self._max_lag / ANALYSIS_RATE_HZ

    # -- caller side -------------------------------------------------------------------------

    def process(
        self, samples: FloatArray, now: float, *, under: FloatArray | None = None
    ) -> FloatArray:
        """Return inbound 16 kHz ``samples`` (last one arrived at ``now``) with echo suppressed.

        Audio passes untouched (the same array) while no echo of a reply can arrive. ``under``
        (as long as ``samples``): what an echo block becomes instead of silence, such as an
        echo canceller's output of the same audio (see :class:`GatedEchoCanceller`).
        """
        n = len(samples)
        if n == 0:
            return samples
        now = self._steady(now, n)
        self.last_echo_blocks = []
        if not self.active(now):
            self._remember(np.asarray(samples[::_DECIMATE], np.float64))
            self._gain = 1.0
            return samples
        out = np.array(samples, np.float32, copy=True)
        fs16 = ASR_SAMPLE_RATE_HZ
        for lo in range(0, n, self._block):
            hi = min(n, lo + self._block)
            block8 = np.asarray(samples[lo:hi:_DECIMATE], np.float64)
            self._remember(block8)
            t_end = now - (n - hi) / fs16
            echo = self._is_echo(t_end)
            if echo:
                self.last_echo_blocks.append((lo, hi, self._block_rho))
            if under is None:
                self._apply(out, lo, hi, self._suppress if echo else 1.0)
            else:
                self._apply(out, lo, hi, 0.0 if echo else 1.0, under)
        return out

    def _steady(self, now: float, n: int) -> float:
        """The arrival time of the chunk's last sample, with the network's jitter taken out.

        A chunk that waited in a queue arrives late, though its audio is not later on the
        line. A client sends its audio at real time, so ``arrival - audio time`` is constant
        up to that delay: its smallest value over the last second is the line's clock.
        """
        return self._clock.steady(now, n)

    def _remember(self, block8: npt.NDArray[np.float64]) -> None:
        self._ctx = np.concatenate([self._ctx, block8])[-self._window :]

    def _is_echo(self, t_end: float) -> bool:
        """Whether the inbound context ending at ``t_end`` is explained by played audio."""
        x = self._ctx
        self._block_rho = 0.0
        if len(x) < self._window // 2:
            return False
        # Echo at inbound time t is reply audio played at t - lag, lag in [min, max].
        fs = ANALYSIS_RATE_HZ
        played = self._playout
        pos = round((t_end - played.t0) * fs)
        first = pos - len(x) - self._max_lag
        last = pos - self._min_lag
        lo, hi = max(first, 0), min(last, len(played.samples))
        if hi - lo < len(x):
            return False
        self.stats.blocks_checked += 1
        self._t_end = t_end
        ref = played.span(first, last - first)
        echo = False
        k0 = self._lag_index
        if k0 is not None:
            # The echo path's delay is stable within a call: look around the last one first
            # (a direct product over a few hundred lags, ~20x cheaper than the full search).
            a = max(0, k0 - self._track)
            b = min(len(ref) - len(x), k0 + self._track)
            if b > a:
                rho, k, gain = _direct_similarity(x, ref[a : b + len(x)])
                echo = self._explained(x, ref, a + k, rho, gain)
        if not echo:
            rho, k, gain = echo_similarity(x, ref)
            echo = self._explained(x, ref, k, rho, gain)
        if not echo and self._no_louder_than_echo(x, ref, t_end):
            echo = True
            self.stats.blocks_by_level += 1
        if echo:
            self.stats.blocks_suppressed += 1
        self._last_echo = echo
        return echo

    def _no_louder_than_echo(
        self, x: npt.NDArray[np.float64], ref: npt.NDArray[np.float64], t_end: float
    ) -> bool:
        """The level test (a Geigel double-talk detector) for blocks no single delay explains.

        Where the far end's playout stutters (jitter-buffer underruns, a late frame played
        after a gap) the echo is the reply cut and shifted, and no one delay fits a window. The
        echo's gain is known from the blocks that did fit, so a block no louder than that gain
        times the loudest reply audio near the echo's delay cannot hold a caller talking at a
        normal level: treat it as echo too, as long as the echo goes on (the block before was
        echo). A caller over the echo is louder, and passes.
        """
        k0 = self._lag_index
        if k0 is None or self._echo_gain <= 0.0 or t_end - self._confirmed_at > self.LEVEL_HOLD_S:
            return False
        if not self._last_echo:
            return False  # it only carries an echo on: after a pause, a delay must fit again
        n = self._block // _DECIMATE
        blk = x[-n:]
        e_blk = float(np.dot(blk, blk))
        span = self._level_span
        a, b = max(0, k0 + len(x) - n - span), min(len(ref), k0 + len(x) + span)
        if b - a < n:
            return False
        csum = np.concatenate([[0.0], np.cumsum(ref[a:b] ** 2)])
        loudest = float((csum[n:] - csum[:-n]).max())
        return e_blk <= self.LEVEL_MARGIN * self._echo_gain**2 * loudest

    def _explained(
        self,
        x: npt.NDArray[np.float64],
        ref: npt.NDArray[np.float64],
        k: int,
        rho: float,
        gain: float,
    ) -> bool:
        """Whether the newest block of ``x`` is echo, given the window's best match at ``k``.

        The window finds the delay; the newest block alone decides, so that the first block
        of a caller talking over the echo is not judged by the echo before it.
        """
        if rho < self._threshold or abs(gain) > self._max_gain:
            return False
        n = self._block // _DECIMATE
        blk = x[-n:]
        r = ref[k + len(x) - n : k + len(x)]
        e_blk, e_ref = float(np.dot(blk, blk)), float(np.dot(r, r))
        if e_blk <= 0.0 or e_ref <= 0.0:
            return False
        block_rho = abs(float(np.dot(blk, r))) / math.sqrt(e_blk * e_ref)
        if block_rho < self._threshold:
            return False
        self._block_rho = block_rho
        if block_rho >= self.CLEAR_RHO:
            # Only clear matches move the delay that counts: a caller over the echo can match
            # the reply loosely somewhere else for a block.
            if self._clear_lag is not None and abs(k - self._clear_lag) > self._track:
                self.delay_jumps += 1
            self._clear_lag = k
        self._lag_index = k
        # The echo's gain (its energy ratio), smoothed: what the level test compares against.
        # Learnt only from clear matches of a plausible echo, so that a caller's vowel that
        # happens to resemble the bot's cannot teach it "echo as loud as the caller".
        g = math.sqrt(e_blk / e_ref)
        if rho >= self.LEARN_RHO and g <= self.LEVEL_MAX_GAIN:
            self._echo_gain = g if self._echo_gain <= 0.0 else 0.8 * self._echo_gain + 0.2 * g
            self._confirmed_at = self._t_end
        return True

    def _apply(
        self, out: FloatArray, lo: int, hi: int, gain: float, under: FloatArray | None = None
    ) -> None:
        """Scale ``out[lo:hi]`` by ``gain``, ramping from the previous block's gain.

        With ``under``, the rest (``1 - gain``) of the block is ``under``'s, not silence.
        """
        if gain == 1.0 and self._gain == 1.0:
            return
        ramp = min(self.RAMP_SAMPLES, hi - lo)
        g = np.full(hi - lo, gain, np.float32)
        if ramp and self._gain != gain:
            g[:ramp] = np.linspace(self._gain, gain, ramp, endpoint=False, dtype=np.float32)
        if under is None:
            out[lo:hi] *= g
        else:
            out[lo:hi] = g * out[lo:hi] + (1.0 - g) * under[lo:hi]
        self._gain = gain


class LineEchoCanceller:
    """WebRTC's AEC3 on the inbound audio, fed the reply as the caller heard it. One per call.

    The same interface and clocks as :class:`EchoGuard` (``session.barge_in.echo_canceller:
    aec3``). Where the guard asks "is this block the reply at one delay and gain?", an
    adaptive canceller models the whole echo path, so it also takes out echo that a hybrid
    spreads over milliseconds, which no single delay explains: measured offline
    (``benchmarks/echo_canceller.py --dispersion``), echo through a path decaying over
    0.7-2.7 ms opened 2-5 utterances per reply through the guard and none through AEC3. Its
    cost: ~0.8% of a core per call while a reply can echo, about 40 ms more before a caller
    over the echo is heard, and, on a line that returns no echo at all, a suppressor that held
    the caller back 0.7-6 s (measured through the gateway, docs/barge-in.md): for lines known
    to echo, not the default. It also minds timing more than the gate: when a loaded event
    loop shifts the playout stamps against the inbound clock it must find the delay again,
    and about one echo-only call in ten barged in on a loaded 2-core machine.

    AEC3 finds the echo's delay itself (it is given the reply at the moment it played at the
    far end, and estimates the rest); it adapts on every frame it is shown, so it sees the
    inbound audio only while an echo of a reply can arrive, and audio passes untouched (the
    same array) otherwise.
    """

    def __init__(self, *, max_delay_ms: int = 700, history_ms: int = 1500) -> None:
        from pywebrtc_audio import EchoCanceller  # noqa: PLC0415 - loaded when a call uses it

        self._aec = EchoCanceller(ASR_SAMPLE_RATE_HZ, 1, 0)
        self._max_delay_s = max_delay_ms / 1000.0
        self._playout = _Playout(
            ASR_SAMPLE_RATE_HZ, history_ms * ASR_SAMPLE_RATE_HZ // 1000, np.float32
        )
        self._clock = _SteadyClock()
        self.stats = EchoGuardStats()

    def played(self, samples: FloatArray, at: float) -> None:
        """Record reply audio (16 kHz) whose first sample plays to the caller at ``at``."""
        self._playout.add(np.asarray(samples, np.float32), at)

    def active(self, now: float) -> bool:
        """Whether an echo of played audio can still arrive at ``now``."""
        return now <= self._playout.last_t + self._max_delay_s

    def process(self, samples: FloatArray, now: float) -> FloatArray:
        """Return inbound 16 kHz ``samples`` (last one arrived at ``now``), echo cancelled."""
        n = len(samples)
        if n == 0:
            return samples
        now = self._clock.steady(now, n)
        if not self.active(now):
            return samples
        # The far end's playout over the same span of time as these samples.
        first = round((now - self._playout.t0) * ASR_SAMPLE_RATE_HZ) - n
        far = self._playout.span(first, n)
        self.stats.blocks_checked += 1
        out = self._aec.process(np.asarray(samples, np.float32), far)
        return np.asarray(out, np.float32)


class GatedEchoCanceller:
    """The gate decides, AEC3 fills in: echo blocks become AEC3's output, not silence. One per call.

    (``session.barge_in.echo_canceller: gate_aec3``.) The gate alone silences every block the
    reply explains, so a caller quieter than the bot's own echo (a -10 dB echo and a soft
    talker) is not heard until they are louder than it: up to 0.86 s late offline, ~1 s at p95
    through the gateway. AEC3 alone hears that caller sooner but, on a line that returns no
    echo, holds a caller back for seconds. Here AEC3 runs on all the inbound audio while a
    reply can echo (so that it converges as it would alone), and the gate chooses per block:
    a block it does not explain passes untouched, as with the gate alone (no line without
    echo waits on AEC3), and a block it calls echo becomes AEC3's cancelled output of that
    block, in which what is left of a quiet caller survives, instead of silence. AEC3 starts
    on the first block the reply clearly explains: on a line that returns no echo, AEC3 never
    runs and the call costs what the gate costs.

    AEC3's output is used only once it has shown that it cancels this line's echo: until it
    has taken at least ``CONVERGED_DB`` out of ``CONVERGED_BLOCKS`` blocks that the reply
    clearly explains (block correlation ``CLEAR_RHO`` or more: echo at least ~9 dB over
    anything else), echo blocks are silenced as by the gate alone. After that, AEC3's output
    of an echo block the gate fitted at a delay with correlation rho may hold at most
    ``RESIDUAL_MARGIN`` times what that fit leaves unexplained (1 - rho^2 of the block: the
    caller, if any); more, and AEC3 has lost the echo path and leaves the bot's own voice:
    the block is silenced, and so is every echo block until a block the reply clearly
    explains shows again that AEC3 leaves no more than the fit. The same distrust follows a
    jump of the echo's delay (a far end whose playout ran dry plays the rest of the reply
    later, and AEC3 must find the new delay). Only a block the reply explains to within 1 %
    (``TRUST_RHO``) restores trust, because in a loosely fitted one (a caller over the echo,
    or an echo whose playout shifted within the window) the fit leaves so much that a lost
    AEC3 passes the test too. Blocks the gate holds for their level rather than their shape
    carry AEC3's output only while it is trusted: what it leaves then is the caller. And an
    echo block where no caller can be (what the fit leaves, or AEC3's output, is below
    ``CALLER_FLOOR_DBFS``) is silenced whatever AEC3 did: what it left there is the bot's
    voice, quiet but speech, in bursts the voice detector hears.
    (Measured offline: unconverged at the start of a reply, AEC3 passed the first echo nearly
    whole and, used at once, opened an utterance in 1 of 54 echo-only calls; on a loaded line
    whose far end's playout shifts, trusting AEC3 until a clear block showed it had lost the
    echo let 6 of 18 echo-only calls barge in; with that fixed, 14 of 1080 over 40 seeded
    replies still did, on AEC3's -60 dBFS residue or on trust restored by a block at
    |rho| 0.92-0.98, and 0 of 1080 with the caller floor and ``TRUST_RHO``,
    ``benchmarks/echo_canceller.py --stalls``.) Costs both:
    about twice the gate's CPU while a reply can echo. Echo that a hybrid spreads is still
    judged by the gate, which misses parts of it (there, ``aec3``).
    """

    CONVERGED_DB = 12.0
    CONVERGED_BLOCKS = 5
    CLEAR_RHO = EchoGuard.CLEAR_RHO
    TRUST_RHO = 0.99  # only a block this close (echo 20 dB over the rest) restores the trust
    RESIDUAL_MARGIN = 2.0  # AEC3 may leave up to 3 dB more than the gate's fit leaves
    FLOOR_DBFS = -50.0  # blocks quieter than this say nothing about convergence
    LOST_FLOOR_DBFS = -70.0  # below this nothing a voice detector hears is left to cancel
    CALLER_FLOOR_DBFS = -50.0  # no caller talks this quietly on a phone line
    # The same as power ratios, for the per-chunk path.
    _FLOOR = 10.0 ** (FLOOR_DBFS / 10.0)
    _HEARD = 10.0 ** (LOST_FLOOR_DBFS / 10.0)
    _CONVERGED = 10.0 ** (-CONVERGED_DB / 10.0)
    _CALLER_FLOOR = 10.0 ** (CALLER_FLOOR_DBFS / 10.0)

    def __init__(self, *, max_delay_ms: int = 700, history_ms: int = 1500) -> None:
        self._gate = EchoGuard(max_delay_ms=max_delay_ms, history_ms=history_ms)
        self._aec = LineEchoCanceller(max_delay_ms=max_delay_ms, history_ms=history_ms)
        self._block = self._gate._block  # noqa: SLF001 - the same blocks as the gate's
        self._cancelled_blocks = 0
        self._line_echoes = False  # AEC3 runs from the first block the reply clearly explains
        self._aec_holds = True  # the last block fitted at a delay: AEC3 left no more than the fit
        # Until then the inbound audio of the last second, so that AEC3 starts from where it
        # would be had it run all along (it converges as fast as alone).
        self._before: deque[tuple[FloatArray, float]] = deque()
        self._before_n = 0
        self.stats = self._gate.stats

    @property
    def converged(self) -> bool:
        """Whether AEC3 has shown that it cancels this line's echo (its output is used)."""
        return self._cancelled_blocks >= self.CONVERGED_BLOCKS

    @property
    def aec3_trusted(self) -> bool:
        """Whether AEC3's output fills echo blocks now.

        Converged, and the last block the reply clearly explained showed it has the echo path.
        """
        return self.converged and self._aec_holds

    @property
    def aec3_running(self) -> bool:
        """Whether AEC3 has started (the reply has clearly echoed on this line)."""
        return self._line_echoes

    def played(self, samples: FloatArray, at: float) -> None:
        """Record reply audio (16 kHz) whose first sample plays to the caller at ``at``."""
        self._gate.played(samples, at)
        self._aec.played(samples, at)

    def active(self, now: float) -> bool:
        """Whether an echo of played audio can still arrive at ``now``."""
        return self._gate.active(now)

    def process(self, samples: FloatArray, now: float) -> FloatArray:
        """Return inbound 16 kHz ``samples`` (last one arrived at ``now``), echo handled.

        Echo blocks carry AEC3's output; audio passes untouched (the same array) while no
        echo can arrive.
        """
        if not self._line_echoes:
            # A line that returns no echo (a digital one) costs only the gate: AEC3 starts on
            # the first block the reply clearly explains, and adapts from there on.
            out = self._gate.process(samples, now)
            if not self._gate.active(now):
                self._before.clear()  # nothing played lately: nothing for AEC3 to learn from
                self._before_n = 0
                return out
            self._before.append((samples, now))
            self._before_n += len(samples)
            while self._before_n - len(self._before[0][0]) >= ASR_SAMPLE_RATE_HZ:
                self._before_n -= len(self._before.popleft()[0])
            if any(rho >= self.CLEAR_RHO for _, _, rho in self._gate.last_echo_blocks):
                self._line_echoes = True
                for x, t in self._before:
                    self._aec.process(x, t)
                self._before.clear()
            return out
        cancelled = self._aec.process(samples, now)
        if cancelled is samples:  # no echo can arrive: nothing for either to do
            return self._gate.process(samples, now)
        jumps = self._gate.delay_jumps
        used = self.converged
        out = self._gate.process(samples, now, under=cancelled if used else None)
        if self._gate.delay_jumps != jumps:
            # The echo moved: AEC3 must find the new delay, and until a block clearly fitted
            # at it shows that it has, what AEC3 leaves is the bot's voice as likely as not.
            self._aec_holds = False
        x = np.asarray(samples, np.float32)
        floor, heard, converged = self._FLOOR, self._HEARD, self._CONVERGED
        for lo, hi, rho in self._gate.last_echo_blocks:
            if rho <= 0.0:
                # Held by the level test: no fit to judge AEC3 by, so the last one's verdict.
                if used and not self._aec_holds:
                    out[lo:hi] = 0.0
                continue
            ex = float(np.mean(np.square(x[lo:hi], dtype=np.float64)))
            left = float(np.mean(np.square(cancelled[lo:hi], dtype=np.float64)))
            if rho >= self.CLEAR_RHO and ex > floor and left <= converged * ex:
                self._cancelled_blocks += 1
            # What the reply does not explain of this block (1 - rho^2 of it) is all that a
            # canceller that has the echo path leaves; AEC3 leaving more has lost it (the far
            # end's playout shifted and it must find the delay again), and what it leaves is
            # the bot's own voice: the gate's silence here, and in a loosely fitted block
            # until a clear one has shown AEC3 has the path.
            unexplained = (1.0 - rho * rho) * ex
            holds = left <= max(self.RESIDUAL_MARGIN * unexplained, heard)
            restores = rho >= self.TRUST_RHO
            # No caller talks below the floor: a block whose fit leaves less than that (the
            # caller is at most what the fit leaves), or whose AEC3 output is quieter (the
            # caller and what is left of the echo), holds no one to hear. What AEC3 leaves
            # there is the bot's voice, 30-40 dB down but speech all the same, in bursts
            # between silenced blocks: Silero heard -60 dBFS of it and opened utterances.
            silent = unexplained < self._CALLER_FLOOR or left < self._CALLER_FLOOR
            if used and (silent or not (holds and (restores or self._aec_holds))):
                out[lo:hi] = 0.0
            if not holds or restores:
                # Only a block that is clearly the echo shows AEC3 has the path (again).
                self._aec_holds = holds
        return out


class _Playout:
    """Reply audio on the session's loop clock: ``samples[i]`` plays at ``t0 + i / rate``.

    Kept for ``history`` samples; audio that plays more than a second after the last ends
    starts a new buffer (a new reply after a pause).
    """

    def __init__(self, rate: int, history: int, dtype: type[np.floating[Any]]) -> None:
        self.rate = rate
        self.history = history
        self.dtype = dtype
        self.samples: npt.NDArray[Any] = np.zeros(0, dtype)
        self.t0 = 0.0
        self.last_t = -math.inf  # loop time just past the last played sample

    def add(self, x: npt.NDArray[Any], at: float) -> None:
        """Record ``x`` (at ``rate``) whose first sample plays at ``at``."""
        if len(x) == 0:
            return
        if len(self.samples) == 0 or at > self.last_t + 1.0:
            self.samples = np.zeros(0, self.dtype)
            self.t0 = at
        start = round((at - self.t0) * self.rate)
        if start < 0:  # earlier than what is kept: drop the part before the buffer
            x, start = x[-start:], 0
        end = start + len(x)
        if end > len(self.samples):
            grown = np.zeros(end - len(self.samples), self.dtype)
            self.samples = np.concatenate([self.samples, grown])
        self.samples[start:end] = x
        self.last_t = max(self.last_t, self.t0 + end / self.rate)
        excess = len(self.samples) - self.history
        if excess > 0:
            self.samples = self.samples[excess:]
            self.t0 += excess / self.rate

    def span(self, first: int, n: int) -> npt.NDArray[Any]:
        """Samples ``[first, first + n)``, zeros where nothing was played (or is kept)."""
        out = np.zeros(n, self.dtype)
        lo, hi = max(first, 0), min(first + n, len(self.samples))
        if hi > lo:
            out[lo - first : hi - first] = self.samples[lo:hi]
        return out


class _SteadyClock:
    """Arrival times with the network's jitter taken out (see :meth:`EchoGuard._steady`)."""

    WINDOW_S = 1.0  # how far back it looks for the least-delayed chunk

    def __init__(self) -> None:
        self._samples_in = 0
        self._offsets: deque[tuple[float, float]] = deque()

    def steady(self, now: float, n: int) -> float:
        """The arrival time of a chunk's last sample if it had not waited in any queue."""
        self._samples_in += n
        audio_t = self._samples_in / ASR_SAMPLE_RATE_HZ
        offset = now - audio_t
        offsets = self._offsets
        # A monotonic deque: offsets increase from the front, which holds the window's minimum.
        while offsets and offsets[-1][1] >= offset:
            offsets.pop()
        offsets.append((now, offset))
        while offsets[0][0] < now - self.WINDOW_S:
            offsets.popleft()
        return offsets[0][1] + audio_t
