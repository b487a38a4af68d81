"""A call's session run on the virtual clock: caller audio in, the session's events out, timed.

For component tests of what a session does between the wire and the engines (turns, the final
decode's start, interims, what its requests say), with the FAKE recogniser and the energy
detector of :mod:`~voxgate.gateway.testing.fake_engines` and the clock of
:mod:`~voxgate.gateway.testing.virtual_time`: ten seconds of a call run in milliseconds and every
event's time is exact. Never evidence that a model feature works.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from voxgate.common.pcm import WireEncoding
from voxgate.gateway.base import Transcriber
from voxgate.gateway.call.options import (
    IngressOptions,
    InterimOptions,
    PlaybackOptions,
    RecognitionOptions,
)
from voxgate.gateway.config import LimitsConfig, VadConfig
from voxgate.gateway.events import AudioIn, InboundEvent, OutboundEvent
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.session import CallConfig, CallSession
from voxgate.gateway.testing.fake_engines import EnergyVoiceDetector
from voxgate.gateway.testing.virtual_time import run_virtual
from voxgate.gateway.turns import TurnOptions

__all__ = ["pcm_silence", "pcm_tone", "play_virtual", "smart_session"]

#: Bytes of 16 kHz 16-bit mono per millisecond.
_BYTES_PER_MS = 32


def pcm_tone(ms: int, dbfs: float) -> bytes:
    """``ms`` of a 300 Hz tone peaking at ``dbfs``, 16 kHz LINEAR16 (speech to a FAKE detector)."""
    t = np.arange(16 * ms) / 16000.0
    amplitude = 32767 * 10 ** (dbfs / 20)
    return (amplitude * np.sin(2 * np.pi * 300 * t)).astype("<i2").tobytes()


def pcm_silence(ms: int) -> bytes:
    """``ms`` of digital silence, 16 kHz LINEAR16."""
    return bytes(_BYTES_PER_MS * ms)


def smart_session(
    transcriber: Transcriber, *, interval_ms: int = 200, **options: Any
) -> CallSession:
    """A 16 kHz LINEAR16 call with smart turns (200 ms hangover), no voice, the FAKE detector.

    The shape the session's component tests share: turns on, so the final decode starts early,
    and interims every ``interval_ms`` while the caller speaks (0: none). ``options`` go to
    :class:`~voxgate.gateway.session.CallSession` (``declared_bulk``, ``alone``, ...).
    """
    config = CallConfig(
        ingress=IngressOptions(WireEncoding.LINEAR16, 16000),
        playback=PlaybackOptions(WireEncoding.LINEAR16, 16000),
        vad=VadConfig(end_silence_ms=200),
        interims=InterimOptions(results=interval_ms > 0, interval_ms=interval_ms or 200),
        recognition=RecognitionOptions(
            turns=TurnOptions(mode="smart", min_silence_ms=200, max_pause_ms=1600)
        ),
    )
    return CallSession(
        config,
        LimitsConfig(),
        transcriber,
        None,
        metrics=GatewayMetrics(),
        detector=EnergyVoiceDetector(),
        **options,
    )


def play_virtual(
    session: CallSession, pcm: bytes, *, chunk_ms: int = 20, speed: float = 1.0
) -> list[tuple[float, OutboundEvent]]:
    """Send ``pcm`` (16 kHz LINEAR16) to ``session`` and end the call; its events, timed.

    Chunk ``k`` is sent at ``k * chunk_ms / speed`` virtual ms (``speed`` above 1: a file sent
    faster than real time). Returns each event with the loop's time when the session emitted
    it. The call gets 600 virtual seconds to end after its audio (a hang guard).
    """
    out: list[tuple[float, OutboundEvent]] = []
    step = _BYTES_PER_MS * chunk_ms

    async def main() -> None:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[InboundEvent | None] = asyncio.Queue()

        async def sink(event: OutboundEvent) -> None:
            out.append((loop.time(), event))

        runner = asyncio.create_task(session.run(inbox.get, sink))
        for i in range(0, len(pcm), step):
            await inbox.put(AudioIn(pcm[i : i + step]))
            await asyncio.sleep(chunk_ms / 1000.0 / speed)
        await inbox.put(None)
        await asyncio.wait_for(runner, 600)

    run_virtual(main())
    return out
