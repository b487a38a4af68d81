"""Caller audio in: decode, the call's pace and rate limit, in-band DTMF, the echo guard.

Everything a call does to a chunk of caller audio before the segmenter hears it, in order:
check it against the per-call limits, decode and resample it to 16 kHz float
(gateway/audio.py), take the bot's own reply out of it (gateway/echo.py, whose reference is
each reply frame as it leaves: :meth:`Ingress.frame_sent`), then silence DTMF tones and report
their digits (gateway/dtmf.py). Synchronous: it runs inside the call's ``recv`` task.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from voxgate.common.pcm import bytes_per_ms
from voxgate.engines.base import ASR_SAMPLE_RATE_HZ, FloatArray
from voxgate.gateway.audio import AudioFormatError, InputDecoder
from voxgate.gateway.call.options import CallConfig
from voxgate.gateway.config import LimitsConfig
from voxgate.gateway.dtmf import DtmfDigit, DtmfGate
from voxgate.gateway.echo import EchoGuard, GatedEchoCanceller, LineEchoCanceller
from voxgate.gateway.errors import CallError

__all__ = ["Ingress"]

#: Samples ready for the segmenter, and the DTMF digits heard in them.
Gated = tuple[FloatArray, Sequence[DtmfDigit]]


class Ingress:
    """The caller's audio of one call, from wire bytes to samples the segmenter may hear.

    Args:
        config: the call's settings (input format, DTMF, echo guard).
        limits: per-call limits (chunk size, real-time factor, burst).
        plays_replies: the call plays replies (a Converse call on a server with a voice), so
            the echo guard has something to guard against.
        realtime_slack_ms: audio this far ahead of the call's own clock makes it :attr:`bulk`.
        declared_bulk: the client said it sends faster than real time.
        opened_at: the loop's time when the call's stream opened; the real-time-factor quota
            counts real time from there (from the first audio chunk when None). A client starts
            its pacing clock no sooner than that (``voxgate_client`` waits for ``started``), so
            a server that reads the first chunks late, and then finds them bunched, does not
            mistake its own lag for the client's speed (5.5 s of a file sent as fast as allowed
            was refused in 113 ms of the server's time, once, on a loaded 2-core machine).
    """

    def __init__(
        self,
        config: CallConfig,
        limits: LimitsConfig,
        *,
        plays_replies: bool,
        realtime_slack_ms: int,
        declared_bulk: bool,
        opened_at: float | None = None,
    ) -> None:
        self._limits = limits
        self._quota_from = opened_at
        self._realtime_slack_ms = realtime_slack_ms
        self._declared_bulk = declared_bulk
        self._decoder = InputDecoder(config.ingress.encoding, config.ingress.rate_hz)
        self._dtmf = DtmfGate(config.ingress.dtmf) if config.ingress.dtmf is not None else None
        self._bytes_per_ms = bytes_per_ms(config.ingress.encoding, config.ingress.rate_hz)
        self._audio_ms_in = 0.0
        self._first_audio_at: float | None = None
        # The echo guard hears what the caller heard: output frames decoded back to 16 kHz.
        self._echo: EchoGuard | GatedEchoCanceller | LineEchoCanceller | None = None
        if config.ingress.echo_guard and plays_replies:
            self._echo = {
                "gate": EchoGuard,
                "gate_aec3": GatedEchoCanceller,
                "aec3": LineEchoCanceller,
            }[config.ingress.echo_canceller]()
        self._echo_decoder = (
            InputDecoder(config.playback.encoding, config.playback.rate_hz)
            if self._echo is not None
            else None
        )
        self._lead_s = config.playback.lead_ms / 1000.0
        self._echo_next_at = 0.0  # when the far end finishes playing what was sent so far

    @property
    def echo_guard(self) -> bool:
        """Whether the call's audio goes through an echo guard (then it needs the reference)."""
        return self._echo is not None

    @property
    def bulk(self) -> bool:
        """Whether the caller's audio runs ahead of real time (a file sent fast), now.

        Such a call is legitimate and is served, but from spare capacity: its finals carry a
        later deadline, and their latency (mostly its own backlog) is not a real-time
        caller's, so admission and the ladder do not read it.
        """
        if self._first_audio_at is None:
            return self._declared_bulk
        elapsed_ms = (asyncio.get_running_loop().time() - self._first_audio_at) * 1000.0
        if self._declared_bulk and elapsed_ms < 2 * self._realtime_slack_ms:
            # Declared, and too early for its pace to show (a fast sender is past the slack
            # by then): believed. After that, the pace decides, as for any call.
            return True
        return self._audio_ms_in - elapsed_ms > self._realtime_slack_ms

    def audio(self, data: bytes) -> Gated:
        """One chunk of caller audio: checked, decoded, echo removed, DTMF tones silenced.

        Raises:
            CallError: the chunk is too large, audio arrives too fast, or it does not decode.
        """
        loop = asyncio.get_running_loop()
        self._check(data, loop.time())
        try:
            samples = self._decoder.decode(data)
        except AudioFormatError as exc:
            raise CallError.invalid(str(exc)) from None
        if self._echo is not None:
            samples = self._echo.process(samples, loop.time())
        return self._gate(samples)

    def flush(self) -> list[Gated]:
        """The end of the caller's audio: what the decoder, then the DTMF gate, still held."""
        held = [self._gate(self._decoder.flush())]
        if self._dtmf is not None:
            held.append(self._dtmf.flush())
        return held

    def frame_sent(self, frame: bytes) -> None:
        """A reply frame left: what the caller hears, when it hears it (the echo reference).

        The far end plays each frame ``playout_lead_ms`` after it left, or right after the
        frame before it (a jitter buffer): late frames shift the rest.
        """
        assert self._echo is not None and self._echo_decoder is not None
        loop = asyncio.get_running_loop()
        heard = self._echo_decoder.decode(frame)
        play_at = max(loop.time() + self._lead_s, self._echo_next_at)
        self._echo.played(heard, play_at)
        self._echo_next_at = play_at + len(heard) / ASR_SAMPLE_RATE_HZ

    def _check(self, data: bytes, now: float) -> None:
        lim = self._limits
        if len(data) > lim.max_chunk_bytes:
            raise CallError.invalid(
                f"audio.data has {len(data)} bytes, over max_chunk_bytes={lim.max_chunk_bytes}; "
                "send smaller chunks (20-100 ms is typical)"
            )
        if self._first_audio_at is None:
            self._first_audio_at = now
        if self._quota_from is None:
            self._quota_from = now
        self._audio_ms_in += len(data) / self._bytes_per_ms
        elapsed_ms = (now - self._quota_from) * 1000.0
        allowed_ms = lim.burst_allowance_ms + lim.max_realtime_factor * elapsed_ms
        if self._audio_ms_in > allowed_ms:
            raise CallError.exhausted(
                f"audio arrives faster than max_realtime_factor={lim.max_realtime_factor:g}x real "
                f"time: {self._audio_ms_in:.0f} ms of audio in {elapsed_ms:.0f} ms "
                f"(burst_allowance_ms={lim.burst_allowance_ms})",
                quota="max_realtime_factor",
            )

    def _gate(self, samples: FloatArray) -> Gated:
        """In-band DTMF: the digits heard, and their tones silenced before the VAD."""
        if self._dtmf is None:
            return samples, ()
        return self._dtmf.push(samples)
