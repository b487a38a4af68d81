"""The asyncio client: :class:`VoxgateClient` (a channel) and :class:`Call` (one call).

grpc.aio rules this module is built around (each one cost a bug somewhere):

* A call's ``read()``/``write()`` API must never be mixed with async iteration of the same call.
  :class:`Call` uses ``read()``/``write()`` only: one private reader task reads, the caller's
  coroutines write, and events reach the application through a queue.
* A client must read while it writes. If the server aborts (bad audio, a quota) while a write
  is in flight, grpc fails that write *locally* (INTERNAL "Internal error from Core", or
  ``InvalidStateError`` once the call is done) and may report that local INTERNAL as the call's
  status, to the reader too, before or after the server's real status. :class:`Call` records
  every status grpc sets (:meth:`Call._on_status`) and surfaces the server's, with its
  QuotaFailure; a failed write waits for the reader and raises the same
  :class:`VoxgateError`.
* grpc allows one write at a time per call, so writes are serialised by a lock; each write
  awaits HTTP/2 flow control, which is the send-side backpressure.
* ``aclose()`` cancels the RPC and awaits the reader, so no task outlives a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncGenerator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ._config import CallConfig, CallControls, EncodingName, encoding_number
from ._contract import CallInfo, TransferError, TransferResult, not_supported
from ._errors import CallEndedError, VoxgateError, quota_from_trailers
from ._events import (
    ServerEvent,
    SessionStarted,
    SynthesisChunk,
    event_from_proto,
)
from ._proto import voxgate_pb2 as pb
from ._stub import VoiceGatewayStub

__all__ = [
    "PACING_METADATA",
    "TOKEN_ENV",
    "Call",
    "VoxgateClient",
    "auth_metadata",
    "open_channel",
    "read_token",
    "tls_credentials",
]

#: The environment variable ``voxgate call`` (and :func:`read_token`) takes a token from.
TOKEN_ENV = "VOXGATE_TOKEN"

#: How long a reader waits for the server's status to replace grpc's local INTERNAL, s.
TRUE_STATUS_WAIT_S = 1.0

_LOCAL_INTERNAL = "Internal error from Core"

#: Events buffered between the reader and the application before the reader stops reading
#: (which then pushes back on the server through HTTP/2 flow control).
EVENT_BUFFER = 1024


class _End:
    """Queue sentinel: the RPC is over."""


_END = _End()


class Call(CallControls):
    """One ``Converse`` or ``StreamingRecognize`` call.

    Created by :meth:`VoxgateClient.converse` / :meth:`VoxgateClient.recognize`, which have
    already sent the config and received :class:`SessionStarted` (available as
    :attr:`session`, and also yielded first by the iteration).

    Threading: use from the event loop that created it. Sending methods may be called from
    several tasks at once (writes are serialised); iterate from one task only.

    Iteration yields typed events until the server ends the call; a non-OK status is raised from
    the iteration as :class:`VoxgateError`. Iteration ends quietly after :meth:`aclose`.
    """

    def __init__(self, rpc: Any, info: CallInfo | None = None) -> None:
        self._rpc = rpc
        self._info = info or CallInfo()
        self._events: asyncio.Queue[ServerEvent | _End] = asyncio.Queue()
        self._space = asyncio.Semaphore(EVENT_BUFFER)
        self._write_lock = asyncio.Lock()
        self._error: VoxgateError | None = None
        self._closed = False
        self._half_closed = False
        self._started = asyncio.Event()
        self.session: SessionStarted | None = None
        self._statuses: list[VoxgateError] = []
        rpc.add_done_callback(self._on_status)
        self._reader = asyncio.create_task(self._read_loop(), name="voxgate-call-reader")

    # -- lifecycle ---------------------------------------------------------------------------------

    async def _wait_started(self) -> SessionStarted:
        await self._started.wait()
        if self.session is None:
            await self.aclose()
            raise self._error or CallEndedError("the call ended before SessionStarted")
        return self.session

    async def aclose(self) -> None:
        """Cancel the RPC (if still running) and wait for the reader task to finish.

        Idempotent. Safe to call from any task of the call's loop; it never raises.
        """
        self._closed = True
        self._rpc.cancel()
        self._reader.cancel()
        # asyncio.wait, unlike awaiting the task, never raises the reader's CancelledError into
        # us, so our own cancellation (if any) stays ours.
        await asyncio.wait([self._reader])

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    @property
    def done(self) -> bool:
        """Whether the RPC is over (status received, or closed locally)."""
        return self._reader.done()

    @property
    def info(self) -> CallInfo:
        """The call as a bot sees it (:class:`VoiceCall`): channel ``"converse"``, its call_id."""
        return self._info

    # -- reading -----------------------------------------------------------------------------------

    async def _read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                msg = await self._rpc.read()
                if msg is grpc.aio.EOF:
                    return
                event = event_from_proto(msg, loop.time())
                if event is None:
                    continue
                if isinstance(event, SessionStarted) and self.session is None:
                    self.session = event
                    self._started.set()
                await self._space.acquire()
                self._events.put_nowait(event)
        except grpc.aio.AioRpcError as exc:
            if not (self._closed and exc.code() == grpc.StatusCode.CANCELLED):
                self._error = await self._true_error(exc)
        finally:
            # Unbounded queue: the sentinel always fits, even when the buffer is full.
            self._events.put_nowait(_END)
            self._started.set()

    def _on_status(self, rpc: Any) -> None:
        """Done callback: keep every status grpc sets on the call, in order.

        NOTE: grpc.aio can set a call's status more than once. When a write fails it sets a
        local INTERNAL("Internal error from Core"); the peer's status, delivered by core, may
        come before it (and is then overwritten) or after it (and then replaces it). grpc
        calls done callbacks on every set, so recording each one here keeps the peer's status
        in both orders. The status is already set when this runs, so the public async
        accessors complete without suspending; they are driven synchronously.
        """
        values: list[Any] = []
        for coro in (rpc.code(), rpc.details(), rpc.trailing_metadata()):
            try:
                coro.send(None)
            except StopIteration as stop:
                values.append(stop.value)
            else:  # would have to wait: not a set status after all
                coro.close()
                return
        code, details, trailers = values
        self._statuses.append(VoxgateError(code, details or "", quota_from_trailers(trailers)))

    def _peer_status(self) -> VoxgateError | None:
        for status in self._statuses:
            if not (status.code == grpc.StatusCode.INTERNAL and status.message == _LOCAL_INTERNAL):
                return status
        return None

    async def _true_error(self, exc: grpc.aio.AioRpcError) -> VoxgateError:
        """The server's status behind ``exc``, seeing through grpc's local INTERNAL.

        See :meth:`_on_status`. If only the local INTERNAL is known yet, the peer's status is
        awaited for at most :data:`TRUE_STATUS_WAIT_S`.
        """
        if exc.code() != grpc.StatusCode.INTERNAL or exc.details() != _LOCAL_INTERNAL:
            return VoxgateError.from_rpc_error(exc)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TRUE_STATUS_WAIT_S
        while (peer := self._peer_status()) is None and loop.time() < deadline:
            if self._closed:
                break
            await asyncio.sleep(0.002)
        if peer is not None and peer.code != grpc.StatusCode.OK:
            return peer
        return VoxgateError.from_rpc_error(exc)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> ServerEvent:
        item = await self._events.get()
        if isinstance(item, _End):
            self._events.put_nowait(item)  # later calls end too
            if self._error is not None and not self._closed:
                raise self._error
            raise StopAsyncIteration
        self._space.release()
        return item

    async def error(self) -> VoxgateError | None:
        """Wait for the RPC to end; its error, or None for an OK end or a local close."""
        await asyncio.wait([self._reader])
        return self._error

    # -- writing -----------------------------------------------------------------------------------

    async def _write(self, request: pb.ConverseRequest) -> None:
        async with self._write_lock:
            if self._closed:
                raise CallEndedError("the call was closed locally (aclose)")
            if self._half_closed:
                raise CallEndedError("the call is half-closed (done_sending or hangup)")
            try:
                await self._rpc.write(request)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                raise await self._send_failure() from None
            except asyncio.CancelledError:
                # grpc raises CancelledError from write() when the RPC itself was cancelled
                # locally; that is an ended call, unless *this task* is being cancelled.
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise
                raise CallEndedError("the call was cancelled") from None

    async def _send_failure(self) -> Exception:
        # The local write error hides the real status: the reader has (or will have) it.
        await asyncio.wait([self._reader])
        if self._error is not None:
            return self._error
        return CallEndedError("the call has ended; nothing more can be sent")

    async def send_audio(self, data: bytes) -> None:
        """Send caller audio in the call's input format (20-100 ms per chunk is typical).

        Awaits flow control, so a sender can never outrun the network or the server.
        """
        await self._write(pb.ConverseRequest(audio=pb.AudioChunk(data=data)))

    async def _control(self, request: pb.ConverseRequest) -> None:
        await self._write(request)

    async def hangup(self) -> None:
        """End the call: the server transcribes the pending utterance, then closes the stream.

        Also half-closes the request stream, since the server reads nothing after a hangup.
        """
        await self._write(pb.ConverseRequest(hangup=pb.Hangup()))
        await self.done_sending()

    async def transfer(self, target_uri: str) -> TransferResult:
        """Part of :class:`VoiceCall`: a direct Converse call has no telephone leg to hand over.

        Raises:
            TransferError: always, UNIMPLEMENTED ("transfer is not supported on a converse
                call"), so a bot written for the SIP bridge learns it precisely here too.
        """
        raise TransferError(not_supported("converse"))

    async def done_sending(self) -> None:
        """Half-close: no more requests; events keep arriving until the server ends the call."""
        async with self._write_lock:
            if self._half_closed or self._closed or self._rpc.done():
                self._half_closed = True
                return
            self._half_closed = True
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                # A failure here means the call already ended; its status is the reader's.
                await self._rpc.done_writing()


def _read_pem(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise OSError(exc.errno, f"{what}: cannot read {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise ValueError(f"{what}: {path} is not a PEM file")
    return data


def tls_credentials(
    ca: str | os.PathLike[str] | None = None,
    cert: str | os.PathLike[str] | None = None,
    key: str | os.PathLike[str] | None = None,
) -> grpc.ChannelCredentials:
    """TLS channel credentials from PEM files, for ``VoxgateClient(..., tls=...)``.

    Args:
        ca: the CA bundle the server's certificate must chain to (a private CA); None trusts
            the system roots.
        cert: this client's certificate chain, for a server that requires client
            certificates (mutual TLS); needs ``key``.
        key: the private key of ``cert`` (unencrypted PEM).

    Raises:
        OSError: a file cannot be read (the message names it).
        ValueError: a file is not PEM, or only one of ``cert`` and ``key`` is given.
    """
    if (cert is None) != (key is None):
        raise ValueError("a client certificate needs its key and the key its certificate")
    return grpc.ssl_channel_credentials(
        root_certificates=_read_pem(ca, "TLS CA") if ca is not None else None,
        private_key=_read_pem(key, "client key") if key is not None else None,
        certificate_chain=_read_pem(cert, "client certificate") if cert is not None else None,
    )


def read_token(
    token: str | None = None,
    token_file: str | os.PathLike[str] | None = None,
    env: str = TOKEN_ENV,
    environ: Mapping[str, str] | None = None,
) -> str | None:
    """The bearer token to send: ``token``, else the first line of ``token_file``, else ``env``.

    A file is the way to keep a token out of the process list and shell history.

    Raises:
        OSError: ``token_file`` cannot be read.
        ValueError: the token found is empty or holds whitespace or control characters
            (it could not travel as a header value).
    """
    source = "the token"
    if token is None and token_file is not None:
        try:
            lines = Path(token_file).read_text(encoding="utf-8").split()
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot read token file {token_file}: {exc.strerror}"
            ) from None
        except UnicodeDecodeError:
            raise ValueError(f"token file {token_file} is not UTF-8 text") from None
        if len(lines) != 1:
            raise ValueError(f"token file {token_file} must hold exactly one token")
        token, source = lines[0], f"the token in {token_file}"
    if token is None:
        token = (os.environ if environ is None else environ).get(env)
        source = f"the token in {env}"
        if token is None:
            return None
    token = token.strip()
    if not token or not token.isascii() or not token.isprintable() or " " in token:
        raise ValueError(f"{source} must be non-empty printable ASCII without spaces")
    return token


#: The request metadata key by which a call says how it sends audio (``bulk`` or ``realtime``).
PACING_METADATA = "voxgate-pacing"


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata that carries ``token`` (what the gateway checks); empty for None."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def open_channel(
    target: str,
    tls: bool | grpc.ChannelCredentials = False,
    *,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.aio.Channel:
    """A grpc.aio channel to a gateway: plaintext, TLS with the system roots, or ``tls``.

    Shared by :class:`VoxgateClient` and the SIP bridge, so both speak to a secured gateway
    the same way (send :func:`auth_metadata` with each RPC for the token).
    """
    opts = [("grpc.max_receive_message_length", 8 * 1024 * 1024), *options]
    if tls is False:
        return grpc.aio.insecure_channel(target, options=opts)
    creds = grpc.ssl_channel_credentials() if tls is True else tls
    return grpc.aio.secure_channel(target, creds, options=opts)


class VoxgateClient:
    """A channel to one gateway.

    ``async with VoxgateClient("host:port") as client: ...``. Leaving the block closes every
    call still open and then the channel.

    Args:
        target: ``host:port``.
        tls: False for plaintext, True for TLS with the system roots, or ready
            ``grpc.ChannelCredentials``: :func:`tls_credentials` makes them from a private
            CA and, for mutual TLS, a client certificate and key.
        token: sent as ``authorization: Bearer <token>`` on every RPC (metadata rather than
            call credentials, so it also works on plaintext channels behind a TLS proxy).
        options: extra grpc channel options.
        stub: the RPCs' callables (an object with :class:`VoiceGatewayStub`'s attributes);
            None (the default) binds them on the channel. A test passes a fake here (a
            ``Converse`` that returns a scripted stream): the client then never dials the
            channel, which it still opens and closes.
    """

    def __init__(
        self,
        target: str,
        tls: bool | grpc.ChannelCredentials = False,
        token: str | None = None,
        *,
        options: Sequence[tuple[str, Any]] = (),
        stub: VoiceGatewayStub | None = None,
    ) -> None:
        self.target = target
        self._channel = open_channel(target, tls, options=options)
        self._metadata = auth_metadata(token)
        self._stub = stub if stub is not None else VoiceGatewayStub(self._channel)
        self._calls: set[Call] = set()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every open call, then the channel."""
        calls, self._calls = list(self._calls), set()
        for call in calls:
            await call.aclose()
        await self._channel.close()

    # -- calls -------------------------------------------------------------------------------------

    async def converse(self, config: CallConfig | pb.SessionConfig, *, bulk: bool = False) -> Call:
        """Start a full-duplex call; returns once the server has accepted the config.

        ``bulk``: the call will send recorded audio faster than real time (a file, not a live
        caller). The server then admits it from spare capacity, beside real-time callers near
        its latency limit too, and its finals wait behind theirs (``voxgate-pacing: bulk``
        metadata). Leave it False for a live caller: a real-time call that claims it is
        counted as real-time once its pace shows.

        Raises:
            VoxgateError: the server refused the config (INVALID_ARGUMENT with the field) or the
                call (RESOURCE_EXHAUSTED at capacity, UNAVAILABLE while shutting down).
        """
        return await self._start(self._stub.Converse, config, bulk)

    async def recognize(self, config: CallConfig | pb.SessionConfig, *, bulk: bool = False) -> Call:
        """Start a recognition-only call (StreamingRecognize): ``speak``/``mark`` are refused.

        ``bulk``: as for :meth:`converse` (a file transcribed faster than real time).
        """
        return await self._start(self._stub.StreamingRecognize, config, bulk)

    async def _start(
        self, method: Any, config: CallConfig | pb.SessionConfig, bulk: bool = False
    ) -> Call:
        cfg = config.to_proto() if isinstance(config, CallConfig) else config
        metadata = self._metadata + ((PACING_METADATA, "bulk"),) if bulk else self._metadata
        call = Call(method(metadata=metadata), CallInfo(call_id=cfg.call_id))
        self._calls.add(call)
        # A call that ended on its own needs no closing by the client; forget it.
        call._reader.add_done_callback(lambda _: self._calls.discard(call))
        try:
            await call._write(pb.ConverseRequest(config=cfg))
            await call._wait_started()
        except BaseException:
            self._calls.discard(call)
            await call.aclose()
            raise
        return call

    async def synthesize(
        self,
        text: str,
        *,
        voice: str = "",
        rate: float | None = None,
        speaker_id: int = 0,
        encoding: EncodingName = "linear16",
        sample_rate_hz: int = 16000,
    ) -> AsyncGenerator[SynthesisChunk, None]:
        """Stream synthesized audio for ``text`` (not paced: as fast as the voice runs).

        Leaving the iteration early cancels the RPC.

        Raises:
            VoxgateError: e.g. UNIMPLEMENTED on a server without a voice.
        """
        request = pb.SynthesizeRequest(
            text=text,
            voice=voice,
            rate=rate or 0.0,
            speaker_id=speaker_id,
            output_audio=pb.AudioFormat(
                encoding=encoding_number(encoding), sample_rate_hertz=sample_rate_hz
            ),
        )
        rpc = self._stub.Synthesize(request, metadata=self._metadata)
        try:
            while (msg := await rpc.read()) is not grpc.aio.EOF:
                yield SynthesisChunk(
                    msg.data,
                    msg.sequence_number,
                    msg.offset_ms,
                    msg.is_last,
                    tuple((w.word, w.end_ms) for w in msg.words),
                )
        except grpc.aio.AioRpcError as exc:
            raise VoxgateError.from_rpc_error(exc) from None
        finally:
            rpc.cancel()

    # -- discovery ---------------------------------------------------------------------------------

    async def list_models(self) -> list[pb.ModelInfo]:
        """Recognition models loaded on the server (empty for a VAD-only server)."""
        resp = await self._unary(self._stub.ListModels, pb.ListModelsRequest())
        return list(resp.models)

    async def turn_detection(self) -> pb.TurnDetectionInfo:
        """The end-of-turn detection the server runs (from ListModels).

        Its modes (none without a recogniser), the default a call gets, and the audio model
        ``smart`` consults ('' for none), so a bot can ask for what the server has.
        """
        resp: pb.ListModelsResponse = await self._unary(
            self._stub.ListModels, pb.ListModelsRequest()
        )
        return resp.turn_detection

    async def list_voices(self) -> list[pb.VoiceInfo]:
        """Voices loaded on the server (empty without TTS)."""
        resp = await self._unary(self._stub.ListVoices, pb.ListVoicesRequest())
        return list(resp.voices)

    async def health(self, service: str = "") -> Literal["SERVING", "NOT_SERVING", "UNKNOWN"]:
        """The standard gRPC health status ("" = the whole server)."""
        stub = health_pb2_grpc.HealthStub(self._channel)
        resp = await self._unary(stub.Check, health_pb2.HealthCheckRequest(service=service))
        if resp.status == health_pb2.HealthCheckResponse.SERVING:
            return "SERVING"
        if resp.status == health_pb2.HealthCheckResponse.NOT_SERVING:
            return "NOT_SERVING"
        return "UNKNOWN"

    async def _unary(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            raise VoxgateError.from_rpc_error(exc) from None
