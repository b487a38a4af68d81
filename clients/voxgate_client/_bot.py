"""The bot contract: one handler for direct calls and for calls that start elsewhere.

A bot is ``async def handler(call)``. On a direct call, ``call`` is the :class:`Call` that
:meth:`VoxgateClient.converse` returns. On a call that starts elsewhere (a SIP INVITE at the SIP
bridge, a media-stream WebSocket at the adapter) the bridge holds the media and the gateway's
``Converse`` stream, and dials the bot once per call on the ``voxgate.v1.VoxgateBot`` service
(:func:`serve_bot` serves it); the handler then gets a :class:`ServedCall`. Both satisfy
:class:`VoiceCall`, so the same handler type-checks and runs for all three.

Why the bot is a gRPC server that the bridge dials (and not a worker that connects out for
dispatch): bots already deploy as network services behind ordinary load balancers; the bridge
stays the only thing that holds media; the gateway keeps no dispatcher state; and the events a bot
sees are the very ``Converse`` events. ``docs/bots.md`` has the whole argument.

The bridge side is :class:`BotLink`: given the gateway :class:`Call` the bridge opened and the
bot (an address, or an in-process handler for built-in bots and tests), it relays the call's
events to the bot and the bot's actions to the gateway, tees every event to the bridge (which
still plays the audio out and honours marks and barge-in), and applies the bad-bot policy
(:class:`BotPolicy`): a bot that is down, slow to answer, crashes or sends garbage gets one log
line and a defined caller experience, and the bridge's other calls go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, Self

import grpc

from ._client import Call, open_channel
from ._config import CallControls, new_id
from ._contract import (
    BotHandler,
    CallInfo,
    TransferError,
    TransferResult,
    VoiceCall,
    not_supported,
)
from ._errors import CallEndedError, VoxgateError
from ._events import (
    AudioOut,
    PlaybackFinished,
    PlaybackInterrupted,
    ServerEvent,
    SessionStarted,
    event_from_proto,
    event_to_proto,
)
from ._proto import voxgate_pb2 as pb

__all__ = [
    "BOT_SERVICE",
    "BotFault",
    "BotHandler",
    "BotLink",
    "BotPolicy",
    "BotServer",
    "CallInfo",
    "LinkOutcome",
    "ServedCall",
    "TransferError",
    "TransferHook",
    "TransferResult",
    "VoiceCall",
    "serve_bot",
]

log = logging.getLogger("voxgate.bot")
#: The bot process's side (serve_bot): a handler's own failures.
served_log = logging.getLogger("voxgate.bot.served")

#: The fully qualified bot service; its one method is ``/voxgate.v1.VoxgateBot/HandleCall``.
BOT_SERVICE = "voxgate.v1.VoxgateBot"
_HANDLE_CALL = f"/{BOT_SERVICE}/HandleCall"

#: What went wrong with a bot, as the bad-bot log line and :class:`LinkOutcome` name it.
BotFault = Literal["down", "slow", "crashed", "garbage"]

_DTMF_DIGITS = frozenset("0123456789*#ABCD")
_MAX_DTMF_MS = 60_000
_MAX_ID_CHARS = 128
#: Events queued for a bot that does not read them before it counts as not keeping up.
BOT_EVENT_BUFFER = 1000


# -- the bot's side of a bot call -----------------------------------------------------------------


class _End:
    pass


_END = _End()


class ServedCall(CallControls):
    """The call a handler gets from :func:`serve_bot` (or a :class:`BotLink` in-process).

    The same API as :class:`Call`: iterate for events, ``speak``/``clear``/``mark``/``flush``/
    ``hangup``, plus ``transfer``. Sends are messages to the bridge, which applies them to the
    gateway call it holds. The first iteration tells the bridge the bot has picked up
    (``BotAction.answer``), so a bot that listens before it speaks is not taken for a slow one.
    """

    def __init__(
        self,
        info: CallInfo,
        session: SessionStarted,
        send: Callable[[pb.BotAction], Awaitable[None]],
    ) -> None:
        self._info = info
        self.session: SessionStarted | None = session
        self._send_raw = send
        self._events: asyncio.Queue[ServerEvent | _End] = asyncio.Queue()
        self._events.put_nowait(session)
        self._transfers: dict[str, asyncio.Future[TransferResult]] = {}
        self._acted = False
        self._ended = False
        self._half_closed = False
        self._lock = asyncio.Lock()

    @property
    def info(self) -> CallInfo:
        """Who is calling whom, over what."""
        return self._info

    @property
    def done(self) -> bool:
        """Whether the bridge has ended the call's bot stream."""
        return self._ended

    # -- fed by the transport ----------------------------------------------------------------------

    def _feed(self, msg: pb.BotEvent) -> None:
        kind = msg.WhichOneof("event")
        if kind == "converse":
            loop = asyncio.get_running_loop()
            event = event_from_proto(msg.converse, loop.time())
            if event is not None:
                self._events.put_nowait(event)
        elif kind == "transfer_result":
            result = TransferResult.from_proto(msg.transfer_result)
            fut = self._transfers.pop(result.transfer_id, None)
            if fut is not None and not fut.done():
                fut.set_result(result)

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._events.put_nowait(_END)
        for fut in self._transfers.values():
            if not fut.done():
                fut.set_exception(CallEndedError("the call ended before the transfer completed"))
        self._transfers.clear()

    # -- reading -----------------------------------------------------------------------------------

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> ServerEvent:
        if not self._acted:
            with contextlib.suppress(CallEndedError):
                await self._send(pb.BotAction(answer=pb.Answer()))
        item = await self._events.get()
        if isinstance(item, _End):
            self._events.put_nowait(item)
            raise StopAsyncIteration
        return item

    # -- writing -----------------------------------------------------------------------------------

    async def _send(self, action: pb.BotAction) -> None:
        async with self._lock:
            if self._ended:
                raise CallEndedError("the call has ended; nothing more can be sent")
            if self._half_closed:
                raise CallEndedError("the call was hung up")
            self._acted = True
            await self._send_raw(action)

    async def _request(self, request: pb.ConverseRequest) -> None:
        await self._send(pb.BotAction(request=request))

    async def _control(self, request: pb.ConverseRequest) -> None:
        await self._request(request)

    async def hangup(self) -> None:
        """End the call; events keep arriving until the bridge ends the stream."""
        await self._request(pb.ConverseRequest(hangup=pb.Hangup()))
        self._half_closed = True

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        """Nothing to close: the bridge owns the call (the handler returning ends its part)."""

    async def transfer(self, target_uri: str) -> TransferResult:
        """Hand the call to ``target_uri`` (SIP REFER at the SIP bridge).

        Raises:
            TransferError: the channel cannot transfer (UNIMPLEMENTED, without asking the
                bridge) or the peer refused (its code and SIP status).
            CallEndedError: the call ended first.
        """
        tid = new_id()
        if not self._info.transfer_supported:
            raise TransferError(not_supported(self._info.channel, tid))
        fut: asyncio.Future[TransferResult] = asyncio.get_running_loop().create_future()
        self._transfers[tid] = fut
        try:
            await self._send(
                pb.BotAction(transfer=pb.Transfer(target_uri=target_uri, transfer_id=tid))
            )
            result = await fut
        finally:
            self._transfers.pop(tid, None)
        if not result.ok:
            raise TransferError(result)
        return result


if TYPE_CHECKING:
    # mypy --strict proves here that one handler type-checks for both doors: a direct call and
    # a served one are each a VoiceCall.
    def _both_are_voice_calls(direct: Call, served: ServedCall) -> tuple[VoiceCall, VoiceCall]:
        return direct, served


# -- serving a bot --------------------------------------------------------------------------------


class BotServer:
    """A running ``voxgate.v1.VoxgateBot`` server: one handler task per HandleCall.

    Use :func:`serve_bot` to make one. ``async with`` stops it on exit.
    """

    def __init__(self, server: grpc.aio.Server, port: int, host: str) -> None:
        self._server = server
        self.port = port
        self.host = host
        self.calls = 0

    @property
    def address(self) -> str:
        """``host:port`` to give a bridge (``--bot grpc://<address>``)."""
        return f"{self.host}:{self.port}"

    async def wait_closed(self) -> None:
        """Serve until the server is stopped (a bot process's main loop)."""
        await self._server.wait_for_termination()

    async def aclose(self, grace_s: float = 1.0) -> None:
        """Stop: refuse new calls, give open ones ``grace_s``, then cancel them."""
        await self._server.stop(grace_s)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def serve_bot(
    handler: BotHandler,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    credentials: grpc.ServerCredentials | None = None,
    max_calls: int = 1000,
    start_timeout_s: float = 10.0,
) -> BotServer:
    """Serve ``handler`` as a ``voxgate.v1.VoxgateBot`` on ``host:port`` (0 picks a port).

    Each ``HandleCall`` runs ``await handler(call)`` with a :class:`ServedCall`. The handler
    returning ends the bot's part of the call (the bridge then hangs up); an exception in it is
    logged here and ends the stream with INTERNAL, which the bridge treats as a crashed bot.

    Args:
        handler: the bot, ``async def handler(call)``.
        host: the address to listen on.
        port: the port (0: a free one, see :attr:`BotServer.port`).
        credentials: TLS for the bot's port (None: plaintext, e.g. behind a mesh).
        max_calls: concurrent calls; more are refused with RESOURCE_EXHAUSTED.
        start_timeout_s: a call whose first two messages (CallInfo, ``started``) have not come
            within this is ended with DEADLINE_EXCEEDED, so a broken bridge holds nothing.
    """
    bot = BotServer.__new__(BotServer)
    active = 0

    async def handle_call(
        request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        nonlocal active
        if active >= max_calls:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"the bot is at max_calls={max_calls}"
            )
        order = "a bot call starts with BotEvent.call, then the converse `started` event"

        async def first_read() -> Any:
            try:
                return await asyncio.wait_for(context.read(), start_timeout_s)
            except TimeoutError:
                await context.abort(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"the call did not start within {start_timeout_s:g} s ({order})",
                )

        first = await first_read()
        if first is grpc.aio.EOF or first.WhichOneof("event") != "call":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, order)
        second = await first_read()
        if (
            second is grpc.aio.EOF
            or second.WhichOneof("event") != "converse"
            or second.converse.WhichOneof("event") != "started"
        ):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, order)
        started = event_from_proto(second.converse)
        assert isinstance(started, SessionStarted)
        write_lock = asyncio.Lock()

        async def send(action: pb.BotAction) -> None:
            async with write_lock:
                try:
                    await context.write(action)
                except Exception:  # the bridge went away: the call is over for the bot too
                    served._end()
                    raise CallEndedError("the bridge ended the call") from None

        served = ServedCall(CallInfo.from_proto(first.call), started, send)

        async def read() -> None:
            try:
                while (msg := await context.read()) is not grpc.aio.EOF:
                    served._feed(msg)
            except Exception:  # cancelled by the bridge: the call is over
                pass
            finally:
                served._end()

        active += 1
        bot.calls += 1
        reader = asyncio.create_task(read(), name="voxgate-bot-reader")
        try:
            await handler(served)
        except Exception as exc:
            served_log.exception("bot handler failed on call %s", served.info.call_id[:64])
            await context.abort(
                grpc.StatusCode.INTERNAL, f"the bot's handler failed ({type(exc).__name__})"
            )
        finally:
            active -= 1
            reader.cancel()
            await asyncio.wait([reader])

    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                BOT_SERVICE,
                {
                    "HandleCall": grpc.stream_stream_rpc_method_handler(
                        handle_call,
                        request_deserializer=pb.BotEvent.FromString,
                        response_serializer=pb.BotAction.SerializeToString,
                    )
                },
            ),
        )
    )
    address = f"{host}:{port}"
    bound = (
        server.add_secure_port(address, credentials)
        if credentials is not None
        else server.add_insecure_port(address)
    )
    if not bound:
        raise OSError(f"cannot listen on {address}")
    await server.start()
    BotServer.__init__(bot, server, bound, host)
    return bot


# -- the bridge's side ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BotPolicy:
    """What a :class:`BotLink` does with a bot that fails the call.

    Attributes:
        answer_timeout_s: the bot must act (``answer``, which the client library sends when
            the handler starts listening, or any action) within this; else it is "slow".
        fallback_speech: said to the caller when the bot fails ("" says nothing).
        then: after the fallback, ``"hangup"`` or ``"transfer"`` to ``transfer_to``.
        transfer_to: the URI for ``then="transfer"`` (a human queue); where the channel cannot
            transfer, the call is hung up.
        fallback_timeout_s: the most time the fallback speech may take before ``then``.
        max_speak_chars: a speak longer than this is garbage (it would hold the line).
    """

    answer_timeout_s: float = 5.0
    fallback_speech: str = (
        "Sorry, the assistant is not available right now. Please call again later."
    )
    then: Literal["hangup", "transfer"] = "hangup"
    transfer_to: str = ""
    fallback_timeout_s: float = 20.0
    max_speak_chars: int = 2000


@dataclass(frozen=True, slots=True)
class LinkOutcome:
    """How a :class:`BotLink` ended.

    Attributes:
        reason: ``"gateway ended"``, ``"gateway error: CODE"``, ``"bot hung up"``, ``"bot left"``,
            ``"transferred"`` or ``"bot failed (<fault>)"``.
        bot_fault: the fault, when the bot failed the call.
        transferred_to: the target, after a transfer.
    """

    reason: str
    bot_fault: BotFault | None = None
    transferred_to: str = ""


#: A bridge's transfer: target URI in, the outcome out; it must not raise.
TransferHook = Callable[[str], Awaitable[TransferResult]]


class _BotFailure(Exception):
    def __init__(self, fault: BotFault, detail: str) -> None:
        super().__init__(detail)
        self.fault = fault
        self.detail = detail


class _Transport(Protocol):
    async def send(self, msg: pb.BotEvent) -> None: ...
    async def recv(self) -> pb.BotAction | None: ...
    async def close(self) -> None: ...
    async def cancel(self) -> None: ...


class _GrpcTransport:
    """A HandleCall stream to a bot server."""

    def __init__(self, target: str, tls: bool | grpc.ChannelCredentials) -> None:
        self._channel = open_channel(target, tls)
        self._rpc: Any = self._channel.stream_stream(
            _HANDLE_CALL,
            request_serializer=pb.BotEvent.SerializeToString,
            response_deserializer=pb.BotAction.FromString,
        )()
        self._answered = False

    async def send(self, msg: pb.BotEvent) -> None:
        try:
            await self._rpc.write(msg)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            pass  # the stream is over; recv() reports how
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise

    async def recv(self) -> pb.BotAction | None:
        try:
            msg = await self._rpc.read()
        except grpc.aio.AioRpcError as exc:
            down = not self._answered and exc.code() == grpc.StatusCode.UNAVAILABLE
            raise _BotFailure(
                "down" if down else "crashed", f"{exc.code().name}: {(exc.details() or '')[:160]}"
            ) from None
        if msg is grpc.aio.EOF:
            return None
        self._answered = True
        return msg  # type: ignore[no-any-return]

    async def close(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self._rpc.done_writing()

    async def cancel(self) -> None:
        self._rpc.cancel()
        await self._channel.close()


class _LocalTransport:
    """An in-process handler on a :class:`ServedCall`: the same messages, no network."""

    def __init__(self, handler: BotHandler) -> None:
        self._handler = handler
        self._actions: asyncio.Queue[pb.BotAction | BaseException | None] = asyncio.Queue()
        self._served: ServedCall | None = None
        self._info: CallInfo | None = None
        self._task: asyncio.Task[None] | None = None

    async def _action(self, action: pb.BotAction) -> None:
        self._actions.put_nowait(action)

    async def send(self, msg: pb.BotEvent) -> None:
        kind = msg.WhichOneof("event")
        if kind == "call":
            self._info = CallInfo.from_proto(msg.call)
            return
        if self._served is None:
            started = event_from_proto(msg.converse)
            assert isinstance(started, SessionStarted) and self._info is not None
            self._served = ServedCall(self._info, started, self._action)
            self._task = asyncio.create_task(self._run(self._served), name="voxgate-local-bot")
            return
        self._served._feed(msg)

    async def _run(self, served: ServedCall) -> None:
        try:
            await self._handler(served)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("in-process bot failed", exc_info=True)
            self._actions.put_nowait(exc)
        else:
            self._actions.put_nowait(None)

    async def recv(self) -> pb.BotAction | None:
        item = await self._actions.get()
        if isinstance(item, BaseException):
            raise _BotFailure("crashed", f"handler raised {type(item).__name__}")
        return item

    async def close(self) -> None:
        if self._served is not None:
            self._served._end()

    async def cancel(self) -> None:
        await self.close()
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])


class BotLink:
    """Connects one gateway :class:`Call` (opened by a bridge) to one bot, for the call's life.

    The link is the call's only reader: every event goes first to ``on_event`` (the bridge's
    tee: audio to play, marks, barge-in), then, except :class:`AudioOut`, to the bot. The bot's
    actions are validated and applied to the call. The bridge keeps writing caller audio and
    DTMF to the call itself, and ends it from its side with ``call.hangup()``.

    Args:
        call: the gateway call the bridge opened.
        bot: ``host:port`` of a VoxgateBot server, or an in-process handler.
        info: the call's metadata for the bot.
        on_event: called synchronously, in order, with every gateway event; must not block.
        on_action: called with each valid bot request before it is applied (a speak is
            dropped, not applied, when the gateway has no voice), for a door that shows what
            the bot said; must not block.
        transfer: the bridge's transfer; None answers the bot UNIMPLEMENTED.
        policy: the bad-bot policy.
        tls: channel security to a bot server.
    """

    def __init__(
        self,
        call: Call,
        bot: str | BotHandler,
        info: CallInfo,
        *,
        on_event: Callable[[ServerEvent], None] | None = None,
        on_action: Callable[[pb.ConverseRequest], None] | None = None,
        transfer: TransferHook | None = None,
        policy: BotPolicy | None = None,
        tls: bool | grpc.ChannelCredentials = False,
    ) -> None:
        self._on_action = on_action
        self._told_no_voice = False
        self.call = call
        self.info = info
        self.policy = policy or BotPolicy()
        self._bot = bot
        self._on_event = on_event
        self._transfer = transfer
        self._tls = tls
        self.bot_name = (
            bot if isinstance(bot, str) else getattr(bot, "__name__", type(bot).__name__)
        )
        self._to_bot: asyncio.Queue[pb.BotEvent | None] = asyncio.Queue(maxsize=BOT_EVENT_BUFFER)
        self._transport: _Transport | None = None
        self._failed: BotFault | None = None
        self._fault_seen = asyncio.Event()
        self._reason = ""
        self._transferred_to = ""
        self._answered = asyncio.Event()
        self._settled = asyncio.Event()  # answered, failed, or the call is over
        self._fallback_id = ""
        self._fallback_done = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False

    # -- public ------------------------------------------------------------------------------------

    async def run(self) -> LinkOutcome:
        """Relay until the gateway call's events end; never raises for a bot's faults.

        Raises:
            VoxgateError: never; a gateway error ends the link with reason
                ``"gateway error: CODE"`` (the bridge can read it from ``call.error()``).
        """
        transport: _Transport = (
            _GrpcTransport(self._bot, self._tls)
            if isinstance(self._bot, str)
            else _LocalTransport(self._bot)
        )
        self._transport = transport
        session = self.call.session
        assert session is not None, "the link needs a started call"
        self._queue(pb.BotEvent(call=self.info.to_proto()))
        self._queue(pb.BotEvent(converse=event_to_proto(session)))
        self._tasks = [
            asyncio.create_task(self._send_loop(transport), name="bot-send"),
            asyncio.create_task(self._action_loop(transport), name="bot-actions"),
            asyncio.create_task(self._answer_watch(), name="bot-answer-timer"),
        ]
        try:
            await self._event_loop()
        finally:
            await self._finish(transport)
        if self._failed is not None:
            return LinkOutcome(f"bot failed ({self._failed})", self._failed)
        return LinkOutcome(self._reason or "gateway ended", None, self._transferred_to)

    async def wait_answered(self) -> bool:
        """Wait until the bot has picked up (its first action), failed, or the call ended.

        A door that plays a recording (``voxgate call``) waits for this so the bot's opening
        lines come before the caller's audio. Returns whether the bot answered.
        """
        await self._settled.wait()
        return self._answered.is_set()

    async def aclose(self) -> None:
        """Stop now (bridge shutdown): cancel the bot's stream and the relay. Idempotent."""
        self._closed = True
        for task in self._tasks:
            task.cancel()
        if self._transport is not None:
            await self._transport.cancel()

    # -- gateway → bridge, bot ---------------------------------------------------------------------

    async def _event_loop(self) -> None:
        try:
            async for event in self.call:
                if self._on_event is not None:
                    try:
                        self._on_event(event)
                    except Exception:  # a bridge observer's bug must not end the call
                        log.exception("call %s: bridge event handler failed", self._id)
                if (
                    isinstance(event, PlaybackFinished | PlaybackInterrupted)
                    and self._fallback_id
                    and event.speak_id == self._fallback_id
                ):
                    self._fallback_done.set()
                if isinstance(event, AudioOut | SessionStarted) or self._failed is not None:
                    continue
                self._queue(pb.BotEvent(converse=event_to_proto(event)))
        except VoxgateError as exc:
            self._reason = self._reason or f"gateway error: {exc.code.name}"
        finally:
            self._fallback_done.set()
            self._settled.set()

    def _queue(self, msg: pb.BotEvent) -> None:
        try:
            self._to_bot.put_nowait(msg)
        except asyncio.QueueFull:
            self._fail("slow", f"not reading its events ({BOT_EVENT_BUFFER} queued)")

    async def _send_loop(self, transport: _Transport) -> None:
        while (msg := await self._to_bot.get()) is not None:
            await transport.send(msg)

    # -- bot → gateway -----------------------------------------------------------------------------

    async def _answer_watch(self) -> None:
        try:
            await asyncio.wait_for(self._answered.wait(), self.policy.answer_timeout_s)
        except TimeoutError:
            self._fail("slow", f"no answer within {self.policy.answer_timeout_s:g} s")

    async def _action_loop(self, transport: _Transport) -> None:
        try:
            while True:
                action = await transport.recv()
                if self._failed is not None:
                    return
                if action is None:
                    if not self.call.done:
                        self._reason = self._reason or "bot left"
                        log.info("call %s: the bot left the call; hanging up", self._id)
                        await self._hangup()
                    return
                self._answered.set()
                self._settled.set()
                await self._apply(action)
        except _BotFailure as exc:
            self._fail(exc.fault, exc.detail)
        except (CallEndedError, VoxgateError):
            return  # the gateway call is over; the event loop reports why

    async def _apply(self, action: pb.BotAction) -> None:
        kind = action.WhichOneof("action")
        if kind == "answer":
            return
        if kind == "transfer":
            target = action.transfer.target_uri
            tid = action.transfer.transfer_id
            task = asyncio.create_task(self._do_transfer(target, tid), name="bot-transfer")
            self._tasks.append(task)
            return
        if kind != "request":
            raise _BotFailure("garbage", "an action with nothing set")
        req = action.request
        problem = self._check(req)
        if problem is not None:
            raise _BotFailure("garbage", problem)
        kind = req.WhichOneof("event")
        if self._on_action is not None:
            try:
                self._on_action(req)
            except Exception:
                log.exception("call %s: bridge action handler failed", self._id)
        session = self.call.session
        if kind == "speak" and session is not None and not session.has_tts:
            # A gateway without a voice refuses Speak; the bot's words go unspoken, not fatal.
            if not self._told_no_voice:
                self._told_no_voice = True
                log.info("call %s: bot replies not spoken: the gateway has no voice", self._id)
            return
        if kind == "hangup":
            self._reason = self._reason or "bot hung up"
            await self._hangup()
            return
        await self.call._write(req)

    def _check(self, req: pb.ConverseRequest) -> str | None:
        """Why a bot's request is invalid (what the gateway would refuse or end the call for)."""
        kind = req.WhichOneof("event")
        if kind == "speak":
            sp = req.speak
            if len(sp.text) > self.policy.max_speak_chars:
                return (
                    f"speak of {len(sp.text)} characters "
                    f"(over max_speak_chars={self.policy.max_speak_chars})"
                )
            if len(sp.speak_id) > _MAX_ID_CHARS:
                return f"speak_id of {len(sp.speak_id)} characters"
            return None
        if kind == "mark":
            if not req.mark.name or len(req.mark.name) > _MAX_ID_CHARS:
                return f"mark name of {len(req.mark.name)} characters"
            return None
        if kind == "dtmf":
            if req.dtmf.digit not in _DTMF_DIGITS or len(req.dtmf.digit) != 1:
                return "dtmf with an invalid digit"
            if not 0 <= req.dtmf.duration_ms <= _MAX_DTMF_MS:
                return f"dtmf of {req.dtmf.duration_ms} ms"
            return None
        if kind in ("clear", "hangup", "flush"):
            return None
        return f"a `{kind or 'empty'}` request (a bot may speak, clear, mark, flush, dtmf, hangup)"

    async def _do_transfer(self, target: str, tid: str) -> None:
        result = await self._run_transfer(target, tid)
        if self._failed is None:
            self._queue(pb.BotEvent(transfer_result=result.to_proto()))
        if result.ok:
            self._reason = self._reason or "transferred"
            self._transferred_to = target
            await self._hangup()

    async def _run_transfer(self, target: str, tid: str) -> TransferResult:
        if self._transfer is None or not self.info.transfer_supported:
            return not_supported(self.info.channel, tid)
        if not target or len(target) > 512 or not target.isprintable():
            return TransferResult(
                tid, grpc.StatusCode.INVALID_ARGUMENT, "the transfer target is not a URI"
            )
        try:
            result = await self._transfer(target)
        except Exception as exc:  # the hook must not raise; if it does, the transfer failed
            log.exception("call %s: transfer hook failed", self._id)
            return TransferResult(tid, grpc.StatusCode.UNAVAILABLE, type(exc).__name__)
        return TransferResult(tid, result.code, result.message, result.sip_status)

    async def _hangup(self) -> None:
        with contextlib.suppress(CallEndedError, VoxgateError):
            await self.call.hangup()

    # -- bad bots ----------------------------------------------------------------------------------

    @property
    def _id(self) -> str:
        return self.info.call_id[:64]

    def _fail(self, fault: BotFault, detail: str) -> None:
        if self._failed is not None or self._closed or self.call.done:
            return
        self._failed = fault
        self._settled.set()
        # One line, no transcript text: the fault, the bot and what was observed.
        log.warning(
            "call %s: bot %s %s: %s; %s",
            self._id,
            self.bot_name,
            fault,
            detail,
            f"fallback speech, then {self.policy.then}",
        )
        task = asyncio.create_task(self._fallback(), name="bot-fallback")
        self._tasks.append(task)

    async def _fallback(self) -> None:
        if self._transport is not None:
            await self._transport.cancel()
        policy = self.policy
        session = self.call.session
        try:
            if policy.fallback_speech and session is not None and session.has_tts:
                await self.call.clear()
                self._fallback_id = f"fallback-{uuid.uuid4().hex[:8]}"
                await self.call.speak(policy.fallback_speech, self._fallback_id, barge_in="never")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._fallback_done.wait(), policy.fallback_timeout_s)
            if policy.then == "transfer" and policy.transfer_to:
                result = await self._run_transfer(policy.transfer_to, "fallback")
                if result.ok:
                    self._transferred_to = policy.transfer_to
                else:
                    log.warning(
                        "call %s: fallback transfer failed (%s); hanging up",
                        self._id,
                        result.code.name,
                    )
            await self._hangup()
        except (CallEndedError, VoxgateError):
            pass

    async def _finish(self, transport: _Transport) -> None:
        """The gateway call is over: tell the bot, stop the tasks."""
        fallback = [t for t in self._tasks if t.get_name() == "bot-fallback"]
        if fallback:
            await asyncio.wait(fallback, timeout=1.0)
        with contextlib.suppress(asyncio.QueueFull):
            self._to_bot.put_nowait(None)
        sender = self._tasks[0] if self._tasks else None
        if sender is not None and self._failed is None:
            await asyncio.wait([sender], timeout=1.0)
            await transport.close()
            actions = self._tasks[1]
            await asyncio.wait([actions], timeout=1.0)  # the bot sees the end and returns
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks)
        await transport.cancel()
