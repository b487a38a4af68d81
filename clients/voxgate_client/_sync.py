"""A blocking wrapper for scripts and notebooks: a private event loop in a daemon thread.

Each method submits a coroutine to that loop and waits for it, so a script never sees asyncio.
The grpc channel is created and used only inside the private loop (grpc.aio channels belong to
the loop that made them). Do not call these methods from inside a running event loop's thread
if that loop is the one serving the gateway: the call would block the server it waits for.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import grpc
import numpy as np

from ._audio import (
    AS_FAST_AS_ALLOWED,
    REALTIME,
    Pacing,
    decode_pcm16,
    load_audio,
    stream_audio,
    write_wav,
)
from ._client import VoxgateClient
from ._config import CallConfig
from ._events import MarkReached, ServerEvent, Transcript
from ._proto import voxgate_pb2 as pb

__all__ = ["VoxgateSyncClient"]

T = TypeVar("T")

_END_MARK = "voxgate-sync-end-of-audio"


class VoxgateSyncClient:
    """Blocking client: ``with VoxgateSyncClient("host:port") as c: c.transcribe_file(p)``.

    Args:
        target: ``host:port``.
        tls: as :class:`VoxgateClient`.
        token: as :class:`VoxgateClient`.
        timeout_s: upper bound for any one method (None: wait as long as it takes).
    """

    def __init__(
        self,
        target: str,
        tls: bool | grpc.ChannelCredentials = False,
        token: str | None = None,
        *,
        timeout_s: float | None = 600.0,
    ) -> None:
        self.timeout_s = timeout_s
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="voxgate-sync-loop", daemon=True
        )
        self._thread.start()
        self._client = self._run(self._make_client(target, tls, token))

    @staticmethod
    async def _make_client(
        target: str, tls: bool | grpc.ChannelCredentials, token: str | None
    ) -> VoxgateClient:
        return VoxgateClient(target, tls, token)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if not self._thread.is_alive():
            coro.close()
            raise RuntimeError("VoxgateSyncClient is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self.timeout_s)

    def close(self) -> None:
        """Close the channel and stop the private loop and its thread (idempotent)."""
        if not self._thread.is_alive():
            return
        try:
            self._run(self._client.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- calls -------------------------------------------------------------------------------------

    def call_file(
        self,
        path: Path | str,
        *,
        config: CallConfig | None = None,
        realtime: bool = False,
        mulaw: bool = False,
        pacing: Pacing | None = None,
    ) -> list[ServerEvent]:
        """Play a caller file through ``Converse`` and return every event of the call.

        The call ends once all audio is sent, the last utterance is flushed and its final
        transcript has arrived (a mark after the flush tells when the server is through).
        """
        return self._run(self._call_file(path, config, realtime, mulaw, pacing))

    def transcribe_file(
        self,
        path: Path | str,
        *,
        config: CallConfig | None = None,
        realtime: bool = False,
        mulaw: bool = False,
    ) -> list[Transcript]:
        """Final transcripts of a caller file, in utterance order."""
        events = self.call_file(path, config=config, realtime=realtime, mulaw=mulaw)
        finals = [e for e in events if isinstance(e, Transcript) and e.is_final]
        return sorted(finals, key=lambda t: t.utterance_index)

    async def _call_file(
        self,
        path: Path | str,
        config: CallConfig | None,
        realtime: bool,
        mulaw: bool,
        pacing: Pacing | None,
    ) -> list[ServerEvent]:
        audio = load_audio(path, mulaw=mulaw)
        cfg = config or CallConfig(encoding=audio.encoding, sample_rate_hz=audio.sample_rate_hz)
        pace = pacing or (REALTIME if realtime else AS_FAST_AS_ALLOWED)
        events: list[ServerEvent] = []
        # Faster than real time: say so, so that a busy server admits it from spare capacity.
        bulk = pace.factor is None or pace.factor > 1.0
        async with await self._client.converse(cfg, bulk=bulk) as call:

            async def send() -> None:
                await stream_audio(call, audio, pace)
                await call.flush()
                await call.mark(_END_MARK)

            sender = asyncio.create_task(send(), name="voxgate-sync-sender")
            try:
                async for event in call:
                    events.append(event)
                    if isinstance(event, MarkReached) and event.name == _END_MARK:
                        # Finals of flushed utterances may still be on their way: hang up,
                        # which makes the server finish them before closing the stream.
                        await call.hangup()
            finally:
                if not sender.done():
                    sender.cancel()
                await asyncio.wait([sender])
                # Always retrieve the sender's outcome (an unretrieved task exception is
                # logged at exit); the iteration's error, if any, is the one that propagates.
                send_error = None if sender.cancelled() else sender.exception()
            if send_error is not None:
                raise send_error
        return events

    def synthesize_to_wav(
        self,
        text: str,
        path: Path | str,
        *,
        voice: str = "",
        rate: float | None = None,
        sample_rate_hz: int = 16000,
    ) -> Path:
        """Synthesize ``text`` to a PCM16 WAV; returns the path."""

        async def run() -> Path:
            pieces = [
                c.data
                async for c in self._client.synthesize(
                    text, voice=voice, rate=rate, sample_rate_hz=sample_rate_hz
                )
            ]
            pcm = decode_pcm16(b"".join(pieces), "linear16")
            return write_wav(path, pcm.astype(np.int16), sample_rate_hz)

        return self._run(run())

    # -- discovery ---------------------------------------------------------------------------------

    def list_models(self) -> list[pb.ModelInfo]:
        """Recognition models on the server."""
        return self._run(self._client.list_models())

    def turn_detection(self) -> pb.TurnDetectionInfo:
        """The end-of-turn detection the server runs (see ``VoxgateClient.turn_detection``)."""
        return self._run(self._client.turn_detection())

    def list_voices(self) -> list[pb.VoiceInfo]:
        """Voices on the server."""
        return self._run(self._client.list_voices())

    def health(self, service: str = "") -> Literal["SERVING", "NOT_SERVING", "UNKNOWN"]:
        """The standard gRPC health status."""
        return self._run(self._client.health(service))
