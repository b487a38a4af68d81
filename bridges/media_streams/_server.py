"""The media-streams adapter: one WebSocket per call, bridged to a gateway call and a bot.

Per stream, three tasks and one rule each:

* ``reader`` (the WebSocket's only reader): provider messages in order; caller audio and DTMF
  go straight to the gateway ``Call`` (μ-law or A-law 8 kHz as it came: no resampling here).
* ``link`` (:class:`voxgate_client.BotLink`, the only reader of the gateway call): relays the
  call's events to the bot and its actions back; it tees every event to :meth:`_Stream._on_event`
  first, which turns reply audio, marks and barge-in into outbound work.
* ``sender`` (the WebSocket's only writer): 20 ms ``media`` chunks paced by
  :class:`OutboundPacer`, ``mark`` after a reply's last chunk (and for each bot mark), and
  ``clear`` on barge-in.

A stream's own fault (bad JSON, media before ``start``, a wrong stream id, a frame over
``max_size``) closes that socket with a precise close code and one log line, ends its gateway
call, and touches no other stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections import deque
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import grpc
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from voxgate_client import (
    AudioOut,
    BotHandler,
    BotLink,
    BotPolicy,
    Call,
    CallConfig,
    CallEndedError,
    CallInfo,
    EchoHandlingName,
    MarkReached,
    PlaybackInterrupted,
    ServerEvent,
    TurnOptions,
    VoxgateClient,
    VoxgateError,
)
from voxgate_client._common.aio import cancel_and_wait

from ._dialect import (
    CLOSE_POLICY,
    Connected,
    DialectName,
    Dtmf,
    Mark,
    Media,
    ProtocolError,
    ProviderError,
    Start,
    Stop,
    Unknown,
    build_clear,
    build_mark,
    build_media,
    echo,
    parse,
)
from ._timing import ChunkOrderer, OutboundPacer, Rechunker

__all__ = ["MediaStreamServer", "MediaStreamsConfig", "StreamRecord"]

log = logging.getLogger("voxgate.media_streams")

#: WebSocket close codes for what is not the stream's fault.
CLOSE_NORMAL = 1000
CLOSE_INTERNAL = 1011  # the gateway failed the call
CLOSE_TRY_AGAIN = 1013  # the gateway is full or shutting down
CLOSE_GOING_AWAY = 1001  # this adapter is shutting down

#: Provider mark names the adapter sends (the provider echoes them back when played).
REPLY_END = "voxgate-reply-end:"
BOT_MARK = "voxgate-mark:"

#: One byte of G.711 silence (the code nearest zero) per encoding.
SILENCE = {"mulaw": b"\xff", "alaw": b"\xd5"}

#: Header entries passed to the bot from ``start`` (custom parameters first), and their length.
MAX_INFO_ENTRIES = 32
MAX_INFO_CHARS = 256


@dataclass(frozen=True, slots=True)
class MediaStreamsConfig:
    """How the adapter listens, which gateway it uses and how it treats a stream.

    Attributes:
        dialect: the default dialect; a request path ending in ``/twilio`` or ``/telnyx``
            picks that one instead, so one adapter can serve both providers.
        max_message_bytes: the WebSocket ``max_size``: a bigger frame closes the stream with
            1009 (a 20 ms media message is about 300 bytes).
        start_timeout_s: a socket that sends no ``start`` within this is closed (1008).
        lead_ms: how far outbound audio may run ahead of the provider's playout.
        drain_timeout_s: after the call ends, how long the last reply may take to be played
            (confirmed by the provider echoing a final mark) before the socket is closed.
        max_streams: concurrent streams; more are closed with 1013 at once.
        echo_handling: how the gateway keeps the line's echo of the bot from barging in
            (``"gate"``, ``"gate_aec3"`` or ``"aec3"``; None: the gateway's default; see
            docs/barge-in.md). Provider media streams
            are usually cancelled upstream (None or ``"gate"``); ``"aec3"`` is for a carrier
            leg known to echo through an analogue hybrid.
        log_content: debugging only: log DTMF digits (personal data; off by default).
        stream_token: when set, a WebSocket must carry it, as one segment of the URL path
            (``wss://host/<token>/twilio``: Twilio's ``<Stream url>`` takes no query string)
            or as Telnyx's ``x-telnyx-streaming-auth-token`` header; others get HTTP 401
            before the upgrade. Never logged.
        gateway_chunk_ms: caller audio is sent to the gateway in pieces of this length
            (a multiple of 20 ms): each gRPC write costs the adapter about 0.5 ms of CPU, so
            40 ms halves the cost of 20 ms at 20 ms more delay (benchmarks/media_streams.py).
        turns: end-of-turn detection on each call (mode, eagerness); the default keeps the
            gateway's. With it on, the bot answers each EndOfTurn rather than each final.
    """

    host: str = "127.0.0.1"
    port: int = 8080
    gateway: str = "127.0.0.1:50051"
    gateway_tls: bool | grpc.ChannelCredentials = False
    gateway_token: str | None = None
    dialect: DialectName = "twilio"
    language: str = ""
    voice: str = ""
    echo_handling: EchoHandlingName | None = None
    max_message_bytes: int = 64 * 1024
    start_timeout_s: float = 10.0
    lead_ms: int = 100
    drain_timeout_s: float = 10.0
    max_streams: int = 200
    log_content: bool = False
    gateway_chunk_ms: int = 40
    stream_token: str | None = field(default=None, repr=False)
    bot_policy: BotPolicy = field(default_factory=BotPolicy)
    turns: TurnOptions = field(default_factory=TurnOptions)


@dataclass(slots=True)
class StreamRecord:
    """What one stream did; kept (bounded) on the server for tests and logged at its end."""

    stream_id: str = ""
    call_id: str = ""
    dialect: str = ""
    close_code: int = 0
    close_reason: str = ""
    end: str = ""
    media_in: int = 0
    media_out: int = 0
    ignored_tracks: int = 0
    dtmf: int = 0
    out_of_order: int = 0
    lost_messages: int = 0
    late_chunks: int = 0
    lost_chunks: int = 0
    reordered_chunks: int = 0
    unknown_events: int = 0
    marks_sent: int = 0
    marks_played: int = 0
    marks_cleared: int = 0  # returned by the provider after our clear, unplayed
    marks_unsent: int = 0  # dropped by a barge-in before they were sent
    clears: int = 0
    #: Per confirmed reply-end mark: seconds from sending it to the provider's echo.
    mark_lag_s: list[float] = field(default_factory=list)


class _Clear:
    pass


_CLEAR = _Clear()


class _Finish:
    """Sender sentinel: send a final mark, then stop."""


_FINISH = _Finish()


class _Stream:
    """One provider WebSocket: its gateway call, its bot link and its tasks."""

    def __init__(
        self, server: MediaStreamServer, ws: ServerConnection, dialect: DialectName
    ) -> None:
        self.server = server
        self.ws = ws
        self.dialect: DialectName = dialect
        self.config = server.config
        self.record = StreamRecord(dialect=dialect)
        self.start: Start | None = None
        self.call: Call | None = None
        self.link: BotLink | None = None
        self._out: deque[bytes | str | _Clear | _Finish] = deque()
        self._out_ready = asyncio.Event()
        self._rechunker = Rechunker()
        self._orderer = ChunkOrderer()
        self._pacer = OutboundPacer(server.config.lead_ms)
        self._last_seq: int | None = None
        self._marks_out: dict[str, float] = {}  # provider mark name -> time sent
        # Marks outstanding when we sent `clear`: the provider returns them unplayed.
        self._marks_dropped: set[str] = set()
        self._final_mark = ""
        self._final_played = asyncio.Event()
        self._warned: set[str] = set()
        self._inbound = bytearray()
        self._inbound_bytes = max(1, server.config.gateway_chunk_ms // 20) * 160

    # -- lifecycle ---------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._run()
        finally:
            r = self.record
            log.info(
                "stream %s (call %s, %s) ended: %s; close %d; media in %d out %d; dtmf %d; "
                "marks sent %d played %d cleared %d; clears %d; out-of-order %d; "
                "lost messages %d; chunks late %d lost %d reordered %d; unknown events %d; "
                "other tracks %d",
                r.stream_id or "-",
                r.call_id or "-",
                r.dialect,
                r.end,
                r.close_code,
                r.media_in,
                r.media_out,
                r.dtmf,
                r.marks_sent,
                r.marks_played,
                r.marks_cleared,
                r.clears,
                r.out_of_order,
                r.lost_messages,
                r.late_chunks,
                r.lost_chunks,
                r.reordered_chunks,
                r.unknown_events,
                r.ignored_tracks,
            )

    async def _run(self) -> None:
        try:
            async with asyncio.timeout(self.config.start_timeout_s):
                self.start = await self._await_start()
        except TimeoutError:
            await self._close(CLOSE_POLICY, f"no start within {self.config.start_timeout_s:g} s")
            return
        except ProtocolError as exc:
            await self._close(exc.close_code, exc.reason)
            return
        except ConnectionClosed:
            self.record.end = "socket closed before start"
            return
        start = self.start
        self.record.stream_id, self.record.call_id = start.stream_id, start.call_id
        silence = SILENCE[start.encoding]
        self._orderer = ChunkOrderer(silence=silence)
        self._rechunker = Rechunker(silence=silence)
        try:
            self.call = await self.server.client.converse(
                CallConfig(
                    encoding=start.encoding,
                    sample_rate_hz=8000,
                    language=self.config.language,
                    voice=self.config.voice,
                    call_id=start.call_id[:128],
                    echo_handling=self.config.echo_handling,
                    turns=self.config.turns,
                )
            )
        except (VoxgateError, CallEndedError) as exc:
            log.warning(
                "stream %s: gateway %s refused the call: %s",
                start.stream_id,
                self.config.gateway,
                exc,
            )
            code = exc.code if isinstance(exc, VoxgateError) else None
            busy = code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)
            name = code.name if code is not None else "no session"
            await self._close(CLOSE_TRY_AGAIN if busy else CLOSE_INTERNAL, f"gateway: {name}")
            return
        self.link = BotLink(
            self.call,
            self.server.bot,
            self._info(start),
            on_event=self._on_event,
            transfer=None,  # a media stream cannot transfer: the bot gets UNIMPLEMENTED
            policy=self.config.bot_policy,
        )
        link_task = asyncio.create_task(self.link.run(), name="media-stream-link")
        reader = asyncio.create_task(self._read_loop(), name="media-stream-reader")
        sender = asyncio.create_task(self._send_loop(), name="media-stream-sender")
        try:
            await asyncio.wait([link_task, reader], return_when=asyncio.FIRST_COMPLETED)
            if reader.done():
                await self._caller_side_end(reader, link_task)
            else:
                await self._bot_side_end(link_task, sender)
        finally:
            await cancel_and_wait(reader, sender)
            if not sender.cancelled() and sender.exception() is not None:
                # The socket went away under a send; the reader has reported how.
                log.debug("stream %s: sender ended: %r", self.record.stream_id, sender.exception())
            await self.link.aclose()
            await cancel_and_wait(link_task)  # a link that has ended is only looked at
            if not link_task.cancelled() and link_task.exception() is not None:
                log.error(
                    "stream %s: bot link failed",
                    self.record.stream_id,
                    exc_info=link_task.exception(),
                )
            await self.call.aclose()

    async def _caller_side_end(self, reader: asyncio.Task[str], link: asyncio.Task[Any]) -> None:
        """The provider sent ``stop``, broke the protocol or vanished: end the gateway call."""
        exc = reader.exception()
        assert self.call is not None
        if isinstance(exc, ProtocolError):  # tell the provider first, then end the call
            await self._close(exc.close_code, exc.reason)
        elif isinstance(exc, VoxgateError):  # a send failed: the gateway ended the call
            self.record.end = f"gateway error: {exc.code.name}"
            log.warning("stream %s: %s", self.record.stream_id, self.record.end)
            await self._close(CLOSE_INTERNAL, self.record.end)
        elif isinstance(exc, CallEndedError):
            await self._close(CLOSE_NORMAL, "call ended")
        elif isinstance(exc, ConnectionClosed):
            sent = exc.sent
            if sent is not None and sent.code == 1009:  # websockets refused a frame > max_size
                self.record.close_code, self.record.close_reason = sent.code, sent.reason
                self.record.end = f"a frame over {self.config.max_message_bytes} bytes"
            else:
                self.record.end = f"socket closed without stop ({_close_text(exc)})"
            log.warning("stream %s: %s", self.record.stream_id, self.record.end)
        elif exc is not None:
            log.error("stream %s: reader failed", self.record.stream_id, exc_info=exc)
            await self._close(CLOSE_INTERNAL, "adapter error")
        else:
            self.record.end = "provider sent stop"
        with contextlib.suppress(Exception):  # the call may already be over
            await self.call.hangup()
        # The gateway flushes the last utterance, the link tells the bot; bounded.
        await asyncio.wait([link], timeout=5.0)
        if exc is None:
            await self._close(CLOSE_NORMAL, "stopped")

    async def _bot_side_end(self, link: asyncio.Task[Any], sender: asyncio.Task[None]) -> None:
        """The bot hung up or the gateway ended the call: let the last reply play, then close."""
        outcome = link.result() if not link.cancelled() and link.exception() is None else None
        self.record.end = outcome.reason if outcome is not None else "gateway call ended"
        if self.record.end.startswith("gateway error"):
            # The gateway failed the call (its status is in the reason): nothing more to play.
            log.warning("stream %s: %s", self.record.stream_id, self.record.end)
            await self._close(CLOSE_INTERNAL, self.record.end)
            return
        self._final_mark = f"{REPLY_END}final"
        self._push(_FINISH)
        with contextlib.suppress(TimeoutError, ConnectionClosed):
            async with asyncio.timeout(self.config.drain_timeout_s):
                # The sender paces media at the provider's playout, so once it has sent the
                # final mark, what is left to play is the pacer's lead; the provider's echo of
                # the mark is then due within that (a deadline taken before the sender got
                # there, from a snapshot of its queue, ran out under load).
                await asyncio.wait([sender])
                async with asyncio.timeout(self._pacer.queued_s(_now()) + 2.0):
                    await self._final_played.wait()
        await self._close(CLOSE_NORMAL, "call ended")

    async def _close(self, code: int, reason: str) -> None:
        if not self.record.close_code:
            self.record.close_code, self.record.close_reason = code, reason
        if not self.record.end:
            self.record.end = reason
        if code not in (CLOSE_NORMAL, CLOSE_GOING_AWAY):
            log.warning(
                "stream %s: closing with %d: %s", self.record.stream_id or "-", code, reason
            )
        # A close reason must fit a control frame: at most 123 bytes of UTF-8.
        short = reason.encode()[:120].decode(errors="ignore")
        with contextlib.suppress(Exception):
            await self.ws.close(code, short)

    def _info(self, start: Start) -> CallInfo:
        headers: dict[str, str] = {}
        for key, value in [*start.parameters.items(), *start.provider.items()]:
            if len(headers) >= MAX_INFO_ENTRIES:
                break
            headers.setdefault(key[:MAX_INFO_CHARS], value[:MAX_INFO_CHARS])
        headers.setdefault("stream_id", start.stream_id[:MAX_INFO_CHARS])
        headers.setdefault("provider", self.dialect)
        params = {k.lower(): v for k, v in start.parameters.items()}
        return CallInfo(
            call_id=start.call_id[:MAX_INFO_CHARS],
            from_uri=(start.from_ or params.get("from", ""))[:MAX_INFO_CHARS],
            to_uri=(start.to or params.get("to", ""))[:MAX_INFO_CHARS],
            channel="media_stream",
            headers=headers,
            transfer_supported=False,
        )

    # -- inbound -----------------------------------------------------------------------------------

    async def _recv(self) -> Any:
        return parse(await self.ws.recv(), self.dialect)

    async def _await_start(self) -> Start:
        while True:
            msg = await self._recv()
            if isinstance(msg, Start):
                return msg
            if isinstance(msg, Connected):
                continue
            if isinstance(msg, Unknown):
                self._unknown(msg.event)
                continue
            if isinstance(msg, ProviderError):
                self._provider_error(msg)
                continue
            raise ProtocolError(CLOSE_POLICY, f"{_kind(msg)} before start")

    def _check(self, msg: Media | Dtmf | Mark | Stop | ProviderError | Unknown) -> bool:
        """The stream id must be this stream's; the sequence must go up (False: drop it)."""
        assert self.start is not None
        if msg.stream_id is not None and msg.stream_id != self.start.stream_id:
            raise ProtocolError(
                CLOSE_POLICY, f"{_kind(msg)} for stream {echo(msg.stream_id, 40)}, not this one"
            )
        seq = msg.sequence
        if seq is None:
            return True
        last = self._last_seq
        if last is not None and seq <= last:
            self.record.out_of_order += 1
            if self.record.out_of_order == 1:
                log.warning(
                    "stream %s: message %d after %d (out of order or repeated)",
                    self.record.stream_id,
                    seq,
                    last,
                )
            # Media finds its place by chunk number; any other event repeated is dropped.
            return isinstance(msg, Media)
        if last is not None and seq > last + 1:
            self.record.lost_messages += seq - last - 1
        self._last_seq = seq
        return True

    async def _read_loop(self) -> str:
        assert self.call is not None and self.start is not None
        call = self.call
        while True:
            msg = await self._recv()
            if isinstance(msg, Connected):
                continue
            if isinstance(msg, Start):
                raise ProtocolError(CLOSE_POLICY, "a second start on one stream")
            if not self._check(msg):
                continue
            if isinstance(msg, Media):
                if msg.track not in ("inbound", "inbound_track"):
                    self.record.ignored_tracks += 1  # both_tracks: the bot's own audio
                    continue
                self.record.media_in += 1
                if not msg.payload:
                    continue
                for audio in self._orderer.push(msg.chunk, msg.payload):
                    self._inbound += audio
                if len(self._inbound) >= self._inbound_bytes:
                    await self._flush_inbound()
                st = self._orderer.stats
                self.record.late_chunks = st.late + st.duplicate
                self.record.lost_chunks = st.lost
                self.record.reordered_chunks = st.reordered
            elif isinstance(msg, Dtmf):
                await self._flush_inbound()  # the key press lands after the audio before it
                self.record.dtmf += 1
                if self.config.log_content:
                    log.info("stream %s: DTMF %s", self.record.stream_id, msg.digit)
                await call.dtmf(msg.digit)
            elif isinstance(msg, Mark):
                self._mark_echo(msg.name)
            elif isinstance(msg, Stop):
                await self._flush_inbound()
                return "stop"
            elif isinstance(msg, ProviderError):
                self._provider_error(msg)
            else:
                self._unknown(msg.event)

    async def _flush_inbound(self) -> None:
        if self._inbound:
            assert self.call is not None
            data, self._inbound = bytes(self._inbound), bytearray()
            # NOTE: once the gateway call is over (the bot hung up), the caller's audio has
            # nowhere to go, but the reader must go on: the provider's echo of the final mark
            # (the last reply played) and its `stop` still arrive here. The link's end, not a
            # failed send, decides how the stream closes.
            with contextlib.suppress(CallEndedError):
                await self.call.send_audio(data)

    def _mark_echo(self, name: str) -> None:
        sent = self._marks_out.pop(name, None)
        if sent is None:
            self._warn_once("mark", "stream %s: mark %s was never sent", echo(name, 40))
            return
        if name in self._marks_dropped:
            self._marks_dropped.discard(name)
            self.record.marks_cleared += 1
            if name == self._final_mark:
                self._final_played.set()
            return
        self.record.marks_played += 1
        if name.startswith(REPLY_END):
            self.record.mark_lag_s.append(_now() - sent)
        if name == self._final_mark:
            self._final_played.set()

    def _unknown(self, event: str) -> None:
        self.record.unknown_events += 1
        self._warn_once(f"event:{event[:40]}", "stream %s: ignored unknown event %s", echo(event))

    def _provider_error(self, msg: ProviderError) -> None:
        log.warning(
            "stream %s: provider error %s: %s",
            self.record.stream_id or "-",
            echo(msg.code, 16),
            echo(msg.title, 80),
        )

    def _warn_once(self, key: str, fmt: str, arg: str) -> None:
        if key in self._warned or len(self._warned) > 16:
            return
        self._warned.add(key)
        log.warning(fmt, self.record.stream_id or "-", arg)

    # -- outbound ----------------------------------------------------------------------------------

    def _push(self, item: bytes | str | _Clear | _Finish) -> None:
        self._out.append(item)
        self._out_ready.set()

    def _on_event(self, event: ServerEvent) -> None:
        """The link's tee: called in order, before the bot sees the event; must not block."""
        if isinstance(event, AudioOut):
            for chunk in self._rechunker.push(event.data, last=event.is_last):
                self._push(chunk)
            if event.is_last:
                self._push(f"{REPLY_END}{event.speak_id}")
        elif isinstance(event, MarkReached):
            # The gateway reached the bot's mark by its clock; the provider confirms playout.
            self._push(f"{BOT_MARK}{event.name}")
        elif isinstance(event, PlaybackInterrupted):
            self._interrupt()

    def _interrupt(self) -> None:
        """Barge-in or Clear: drop what is queued here and have the provider drop its buffer."""
        self._rechunker.reset()
        had_audio = False
        kept: deque[bytes | str | _Clear | _Finish] = deque()
        for item in self._out:
            if isinstance(item, bytes):
                had_audio = True
            elif isinstance(item, str):
                self.record.marks_unsent += 1  # dropped here before it was sent
            else:
                kept.append(item)
        self._out = kept
        if had_audio or self._pacer.queued_s(_now()) > 0 or self._marks_out:
            self._out.appendleft(_CLEAR)
            self._out_ready.set()

    async def _send_loop(self) -> None:
        assert self.start is not None
        sid = self.start.stream_id
        ws, pacer = self.ws, self._pacer
        while True:
            while not self._out:
                self._out_ready.clear()
                await self._out_ready.wait()
            item = self._out[0]
            if isinstance(item, bytes):
                delay = pacer.delay_s(_now())
                if delay > 0:
                    # Wait, but wake for a clear (it jumps the queue).
                    self._out_ready.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(delay):
                            await self._out_ready.wait()
                    continue
                self._out.popleft()
                await ws.send(build_media(self.dialect, sid, item))
                pacer.sent(_now())
                self.record.media_out += 1
            elif isinstance(item, str):
                self._out.popleft()
                self._marks_out[item] = _now()
                self.record.marks_sent += 1
                await ws.send(build_mark(self.dialect, sid, item))
            elif isinstance(item, _Clear):
                self._out.popleft()
                self.record.clears += 1
                self._marks_dropped.update(self._marks_out)
                await ws.send(build_clear(self.dialect, sid))
                pacer.reset(_now())
            else:
                self._out.popleft()
                self._marks_out[self._final_mark] = _now()
                self.record.marks_sent += 1
                await ws.send(build_mark(self.dialect, sid, self._final_mark))
                return


def _peer(ws: ServerConnection) -> str:
    addr = ws.remote_address
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else "?"


def _now() -> float:
    return time.monotonic()


def _kind(msg: object) -> str:
    return type(msg).__name__.lower()


def _close_text(exc: ConnectionClosed) -> str:
    rcvd = exc.rcvd
    return f"code {rcvd.code}" if rcvd is not None else "no close frame"


class MediaStreamServer:
    """A WebSocket server that answers media streams (``async with`` or start/aclose).

    Args:
        config: listening address, gateway and stream limits.
        bot: who answers each call: a bot's ``host:port`` (``grpc://`` stripped by
            :func:`voxgate.bridges.bots.load_bot`) or an in-process handler ``async def (call)``.
        client: an existing gateway client (tests); by default one is made from ``config``.
    """

    def __init__(
        self,
        config: MediaStreamsConfig,
        bot: str | BotHandler,
        *,
        client: VoxgateClient | None = None,
    ) -> None:
        self.config = config
        self.bot = bot
        self._own_client = client is None
        self.client = client or VoxgateClient(
            config.gateway, config.gateway_tls, config.gateway_token
        )
        self._server: Server | None = None
        self._streams: set[_Stream] = set()
        #: The last streams' records, newest last (bounded).
        self.records: deque[StreamRecord] = deque(maxlen=256)

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); valid after :meth:`start`."""
        assert self._server is not None
        sock = next(iter(self._server.sockets))
        host, port = sock.getsockname()[:2]
        return str(host), int(port)

    @property
    def active(self) -> int:
        """Streams open now."""
        return len(self._streams)

    async def start(self) -> None:
        """Bind and start accepting streams."""
        self._server = await serve(
            self._handle,
            self.config.host,
            self.config.port,
            process_request=self._authorize if self.config.stream_token else None,
            max_size=self.config.max_message_bytes,
            # Per-message compression buys nothing on base64 audio and costs CPU per frame.
            compression=None,
            ping_interval=20,
            ping_timeout=20,
        )

    async def aclose(self) -> None:
        """Stop accepting, close every stream (1001) and end their calls; then the client."""
        if self._server is not None:
            self._server.close(close_connections=False)
            for stream in list(self._streams):
                with contextlib.suppress(Exception):
                    await stream.ws.close(CLOSE_GOING_AWAY, "adapter shutting down")
            await self._server.wait_closed()
        if self._own_client:
            await self.client.aclose()

    async def __aenter__(self) -> MediaStreamServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _authorize(self, ws: ServerConnection, request: Request) -> Response | None:
        """Before the upgrade: the stream token in a path segment or Telnyx's header, or 401."""
        token = self.config.stream_token
        assert token is not None
        expected = token.encode()
        path = request.path.split("?", 1)[0]
        offered = [seg.encode() for seg in path.split("/") if seg]
        header = request.headers.get("x-telnyx-streaming-auth-token")
        if header is not None:
            offered.append(header.encode())
        # compare_digest on every candidate: the time taken does not tell where a match was.
        if sum(hmac.compare_digest(x, expected) for x in offered[:16]) > 0:
            return None
        log.warning("media stream from %s refused: no valid stream token", _peer(ws))
        return ws.respond(HTTPStatus.UNAUTHORIZED, "a valid stream token is required\n")

    def _dialect_for(self, path: str) -> DialectName:
        tail = path.split("?", 1)[0].rstrip("/").rsplit("/", 1)[-1]
        if tail == "telnyx":
            return "telnyx"
        if tail == "twilio":
            return "twilio"
        return self.config.dialect

    async def _handle(self, ws: ServerConnection) -> None:
        dialect = self._dialect_for(ws.request.path if ws.request is not None else "/")
        stream = _Stream(self, ws, dialect)
        if len(self._streams) >= self.config.max_streams:
            await stream._close(CLOSE_TRY_AGAIN, f"adapter full ({self.config.max_streams})")
            return
        self._streams.add(stream)
        try:
            await stream.run()
        except Exception:  # one stream's bug must not reach the server
            log.exception("stream %s failed", stream.record.stream_id or "-")
            await stream._close(CLOSE_INTERNAL, "adapter error")
        finally:
            self._streams.discard(stream)
            self.records.append(stream.record)
