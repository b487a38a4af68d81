"""A provider replayer for tests: plays the Twilio (or Telnyx) side of a media stream.

:class:`ReplayClient` speaks the providers' published schemas exactly: ``connected``, then
``start`` with the full metadata, then ``media`` every 20 ms in real time with ``sequenceNumber``
(``sequence_number`` for Telnyx) and ``media.chunk`` as increasing decimal strings counted from
"1" and ``media.timestamp`` in ms since the stream started, ``dtmf`` and ``stop``. On the way back
it behaves like the provider's playout buffer, on its own playback clock:

* outbound ``media`` is queued and "played" 20 ms per chunk in real time (recorded in
  :attr:`ReplayClient.played`);
* a ``mark`` is answered only once all audio queued before it has been played;
* ``clear`` drops the queued audio, stops the chunk playing, and answers at once every mark it
  dropped (what Twilio and Telnyx document).

Every outbound message is checked against the dialect's schema; deviations are collected in
:attr:`ReplayClient.violations` (a test asserts it stays empty). :meth:`send_raw` sends
anything at all, for malformed-input tests.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from voxgate_client import encode_pcm16, read_wav
from voxgate_client._common.aio import cancel_and_wait

from ._dialect import DialectName
from ._timing import CHUNK_BYTES, CHUNK_MS

__all__ = ["ReplayClient", "ReturnedMark"]


@dataclass(frozen=True, slots=True)
class ReturnedMark:
    """A mark the replayer sent back: when (its playback clock) and whether ``clear`` dropped it.

    Attributes:
        played_bytes: how much outbound audio had been played when it was answered.
        waited_s: from its arrival to its answer (the audio queued ahead of it).
    """

    name: str
    at_s: float
    cleared: bool
    played_bytes: int
    waited_s: float = 0.0


@dataclass(slots=True)
class _Playout:
    queue: deque[bytes | str] = field(default_factory=deque)
    wake: asyncio.Event = field(default_factory=asyncio.Event)


class ReplayClient:
    """One provider-side media stream against an adapter URL (``async with``).

    Args:
        url: the adapter's WebSocket URL (``ws://host:port/...``).
        dialect: ``"twilio"`` or ``"telnyx"`` field names and formats.
        custom_parameters: sent in ``start`` (Twilio ``customParameters``).
        encoding: Telnyx only: ``"PCMU"`` or ``"PCMA"`` (Twilio is always ``audio/x-mulaw``).
        tracks: the ``start.tracks`` list (Twilio).
        playout_delay_ms: a jitter buffer: each talk spurt starts playing this long after
            its first chunk arrives (so marks wait in the buffer, as behind a real provider).
    """

    def __init__(
        self,
        url: str,
        dialect: DialectName = "twilio",
        *,
        custom_parameters: dict[str, str] | None = None,
        from_: str = "+15550100001",
        to: str = "+15550100002",
        encoding: str = "PCMU",
        tracks: tuple[str, ...] = ("inbound",),
        max_size: int | None = 1 << 20,
        playout_delay_ms: int = 0,
    ) -> None:
        self.url = url
        self.dialect: DialectName = dialect
        self.custom_parameters = dict(custom_parameters or {})
        self.from_, self.to = from_, to
        self.encoding = encoding
        self.tracks = tracks
        self._max_size = max_size
        self._playout_delay_s = playout_delay_ms / 1000.0
        hexid = uuid.uuid4().hex
        if dialect == "twilio":
            self.stream_id = "MZ" + hexid
            self.call_id = "CA" + uuid.uuid4().hex
        else:
            self.stream_id = str(uuid.UUID(hexid)).upper()
            self.call_id = "v3:" + uuid.uuid4().hex
        self.account_id = "AC" + uuid.uuid4().hex
        self._ws: ClientConnection | None = None
        # Numbers are taken and messages sent under one lock, so that they leave in order.
        self._send_lock = asyncio.Lock()
        self._seq = 0
        self._chunk = 0
        self._sent_ms = 0
        self._t0 = 0.0
        self._playout = _Playout()
        self._tasks: list[asyncio.Task[None]] = []
        #: Every outbound message as parsed JSON, in arrival order.
        self.received: list[dict[str, Any]] = []
        #: Outbound audio as played by the playback clock (what the caller heard).
        self.played = bytearray()
        #: Marks answered, in order.
        self.returned: list[ReturnedMark] = []
        #: ``clear`` messages received.
        self.clears = 0
        #: Schema deviations of the adapter's messages.
        self.violations: list[str] = []
        #: Most audio queued ahead of playout at any arrival, in ms (the adapter's lead).
        self.max_queued_ms = 0.0
        #: Times playback started from an empty buffer (a reply's start, or an underrun).
        self.spurts = 0
        self._mark_arrived: dict[str, float] = {}
        self.closed = asyncio.Event()
        self.close_code: int | None = None
        self.close_reason = ""

    # -- connection --------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def connect(self) -> None:
        """Open the socket and start the receive and playback tasks."""
        self._ws = await connect(self.url, max_size=self._max_size, compression=None)
        self._tasks = [
            asyncio.create_task(self._receive(), name="replay-receive"),
            asyncio.create_task(self._play(), name="replay-playout"),
        ]

    async def aclose(self) -> None:
        """Close the socket (if open) and stop the tasks."""
        if self._ws is not None:
            with contextlib.suppress(Exception):
                await self._ws.close()
        await cancel_and_wait(*self._tasks)

    async def wait_closed(self, timeout_s: float = 30.0) -> tuple[int | None, str]:
        """Wait until the adapter closes the socket; its close code and reason."""
        async with asyncio.timeout(timeout_s):
            await self.closed.wait()
        return self.close_code, self.close_reason

    # -- sending -----------------------------------------------------------------------------------

    def _next_seq(self) -> str:
        self._seq += 1
        return str(self._seq)

    def _names(self) -> tuple[str, str]:
        if self.dialect == "twilio":
            return "sequenceNumber", "streamSid"
        return "sequence_number", "stream_id"

    async def send_raw(self, message: str | bytes | dict[str, Any]) -> None:
        """Send anything (a dict is JSON-encoded as is): for malformed-input tests."""
        assert self._ws is not None
        text = json.dumps(message) if isinstance(message, dict) else message
        await self._ws.send(text)

    async def _send_numbered(self, build: Callable[[], dict[str, Any]]) -> None:
        async with self._send_lock:
            await self.send_raw(build())

    async def send_event(self, event: str, body: dict[str, Any] | None = None, **top: Any) -> None:
        """Send one well-formed message: next sequence number, this stream's id, ``body``."""
        seq_key, sid_key = self._names()

        def build() -> dict[str, Any]:
            msg: dict[str, Any] = {"event": event, seq_key: self._next_seq()}
            msg[sid_key] = self.stream_id
            if body is not None:
                msg[event] = body
            msg.update(top)
            return msg

        await self._send_numbered(build)

    async def send_connected(self) -> None:
        """The ``connected`` message (no sequence number in either dialect)."""
        if self.dialect == "twilio":
            await self.send_raw({"event": "connected", "protocol": "Call", "version": "1.0.0"})
        else:
            await self.send_raw({"event": "connected", "version": "1.0.0"})

    async def send_start(self) -> None:
        """The ``start`` message, with the dialect's full metadata."""
        seq_key, sid_key = self._names()
        if self.dialect == "twilio":
            start: dict[str, Any] = {
                "accountSid": self.account_id,
                "streamSid": self.stream_id,
                "callSid": self.call_id,
                "tracks": list(self.tracks),
                "customParameters": self.custom_parameters,
                "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
            }
        else:
            start = {
                "user_id": str(uuid.uuid4()),
                "call_control_id": self.call_id,
                "call_session_id": str(uuid.uuid4()),
                "from": self.from_,
                "to": self.to,
                "tags": [],
                "client_state": "",
                "custom_parameters": self.custom_parameters,
                "media_format": {"encoding": self.encoding, "sample_rate": 8000, "channels": 1},
            }
        await self._send_numbered(
            lambda: {
                "event": "start",
                seq_key: self._next_seq(),
                "start": start,
                sid_key: self.stream_id,
            }
        )
        self._t0 = time.monotonic()

    async def begin(self) -> None:
        """``connected`` then ``start``: what a provider sends when the call reaches the bot."""
        await self.send_connected()
        await self.send_start()

    def media_message(self, payload: bytes, track: str = "inbound") -> dict[str, Any]:
        """The next ``media`` message (numbers advanced), not yet sent: tests may reorder it."""
        seq_key, sid_key = self._names()
        self._chunk += 1
        msg = {
            "event": "media",
            seq_key: self._next_seq(),
            "media": {
                "track": track,
                "chunk": str(self._chunk),
                "timestamp": str(self._sent_ms),
                "payload": base64.b64encode(payload).decode("ascii"),
            },
            sid_key: self.stream_id,
        }
        self._sent_ms += len(payload) * 1000 // 8000
        return msg

    async def send_audio(self, audio: bytes, *, realtime: bool = True) -> None:
        """Stream 8 kHz G.711 in 20 ms ``media`` messages, paced on an absolute clock."""
        start = time.monotonic()
        for i in range(0, len(audio), CHUNK_BYTES):
            if realtime:
                delay = start + (i // CHUNK_BYTES) * CHUNK_MS / 1000.0 - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            piece = audio[i : i + CHUNK_BYTES]
            async with self._send_lock:
                await self.send_raw(self.media_message(piece))

    async def send_wav(self, path: Path | str, *, realtime: bool = True) -> None:
        """Stream a WAV as 8 kHz G.711: μ-law (Twilio, Telnyx PCMU) or A-law (Telnyx PCMA)."""
        pcm, rate = read_wav(path)
        alaw = self.dialect == "telnyx" and self.encoding == "PCMA"
        wire = encode_pcm16(pcm, rate, "alaw" if alaw else "mulaw")
        await self.send_audio(wire.data, realtime=realtime)

    async def send_silence(self, ms: int, *, realtime: bool = True) -> None:
        """G.711 silence, e.g. to let a reply play out while the caller listens."""
        code = b"\xd5" if self.dialect == "telnyx" and self.encoding == "PCMA" else b"\xff"
        await self.send_audio(code * (8 * ms), realtime=realtime)

    async def send_dtmf(self, digit: str) -> None:
        """A keypad press (Twilio carries the track; Telnyx only the digit)."""
        body: dict[str, Any] = {"digit": digit}
        if self.dialect == "twilio":
            body = {"track": "inbound_track", "digit": digit}
        await self.send_event("dtmf", body)

    async def send_stop(self) -> None:
        """The caller hung up."""
        if self.dialect == "twilio":
            await self.send_event("stop", {"accountSid": self.account_id, "callSid": self.call_id})
        else:
            await self.send_event("stop", {"call_control_id": self.call_id})

    # -- receiving ---------------------------------------------------------------------------------

    def _violation(self, text: str) -> None:
        if len(self.violations) < 100:
            self.violations.append(text)

    async def _receive(self) -> None:
        assert self._ws is not None
        try:
            async for raw in self._ws:
                if isinstance(raw, bytes):
                    self._violation("binary frame")
                    continue
                try:
                    msg = json.loads(raw)
                except json.JSONDecodeError:
                    self._violation("not JSON")
                    continue
                self.received.append(msg)
                self._on_message(msg)
        except ConnectionClosed:
            pass
        finally:
            ws = self._ws
            if ws.close_code is not None:
                self.close_code, self.close_reason = ws.close_code, ws.close_reason or ""
            self.closed.set()

    def _on_message(self, msg: dict[str, Any]) -> None:
        event = msg.get("event")
        if self.dialect == "twilio":
            if msg.get("streamSid") != self.stream_id:
                self._violation(f"{event}: streamSid {msg.get('streamSid')!r}")
        elif "streamSid" in msg:
            self._violation(f"{event}: Twilio's streamSid in a Telnyx frame")
        p = self._playout
        if event == "media":
            media = msg.get("media")
            payload = media.get("payload") if isinstance(media, dict) else None
            try:
                audio = base64.b64decode(payload or "", validate=True)
            except (binascii.Error, ValueError):
                self._violation("media: payload is not base64")
                return
            if not audio:
                self._violation("media: empty payload")
                return
            if len(audio) % CHUNK_BYTES:
                self._violation(f"media: {len(audio)} bytes is not whole 20 ms chunks")
            # The provider's model of its buffer: what arrived and has not had time to play.
            # Kept apart from the playback task so a slow wake-up cannot inflate it.
            now = time.monotonic()
            if self._model_end < now:
                self._model_end = now + self._playout_delay_s
            self.max_queued_ms = max(self.max_queued_ms, (self._model_end - now) * 1000.0)
            self._model_end += len(audio) / 8000.0
            p.queue.append(audio)
        elif event == "mark":
            mark = msg.get("mark")
            name = mark.get("name") if isinstance(mark, dict) else None
            if not isinstance(name, str) or not name:
                self._violation("mark: no name")
                return
            self._mark_arrived[name] = time.monotonic()
            p.queue.append(name)
        elif event == "clear":
            self.clears += 1
            dropped = [x for x in p.queue if isinstance(x, str)]
            p.queue.clear()
            self._cut = True
            self._model_end = time.monotonic()
            for name in dropped:
                self._answer(name, cleared=True)
        else:
            self._violation(f"unknown outbound event {event!r}")
        p.wake.set()

    _cut = False
    _playing_until = 0.0
    _model_end = 0.0

    def _answer(self, name: str, *, cleared: bool) -> None:
        now = time.monotonic()
        waited = now - self._mark_arrived.pop(name, now)
        mark = ReturnedMark(name, now, cleared, len(self.played), waited)
        task = asyncio.ensure_future(self._send_mark(mark))
        self._tasks.append(task)

    async def _send_mark(self, mark: ReturnedMark) -> None:
        # Listed in `returned` once sent, so a test that waits for it and then sends `stop`
        # cannot overtake the mark on the wire.
        with contextlib.suppress(ConnectionClosed):
            await self.send_event("mark", {"name": mark.name})
        self.returned.append(mark)

    async def _play(self) -> None:
        """The playback clock: 20 ms of audio per 20 ms of time; marks when reached."""
        p = self._playout
        clock = 0.0
        while True:
            ran_dry = not p.queue
            while not p.queue:
                p.wake.clear()
                await p.wake.wait()
            item = p.queue.popleft()
            if isinstance(item, str):
                self._answer(item, cleared=False)
                continue
            now = time.monotonic()
            # A new talk spurt starts at its arrival (after the jitter buffer's delay); within
            # one, the clock is absolute, so a late wake-up of this task loses no audio time.
            if ran_dry and clock < now:
                clock = now + self._playout_delay_s
                self.spurts += 1
            # Play in 20 ms steps so that a clear cuts within one chunk.
            for i in range(0, len(item), CHUNK_BYTES):
                piece = item[i : i + CHUNK_BYTES]
                self._playing_until = clock + len(piece) / 8000.0
                self._cut = False
                p.wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, self._playing_until - time.monotonic())):
                        while not self._cut:
                            await p.wake.wait()
                            p.wake.clear()
                if self._cut:
                    # clear: the rest of this chunk is never heard; the clock restarts now.
                    heard = int((time.monotonic() - clock) * 8000)
                    self.played += piece[: max(0, min(len(piece), heard))]
                    clock = time.monotonic()
                    break
                self.played += piece
                clock = self._playing_until

    # -- views -------------------------------------------------------------------------------------

    def outbound(self, event: str) -> list[dict[str, Any]]:
        """The outbound messages of one kind."""
        return [m for m in self.received if m.get("event") == event]
