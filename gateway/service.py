"""The gRPC servicer: its RPCs, each call's life from admission to its last write, and statuses.

With :mod:`.wire` (requests validated and converted to the session's dataclasses, events back
to protobuf) it is the only server code that touches generated protobuf code. Domain errors
become gRPC statuses in one table (:data:`STATUS_OF`); each RPC's failures end that RPC alone.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Literal

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

from voxgate.common.pcm import WireEncoding
from voxgate.engines.turn import SmartTurn, smart_turn_spec
from voxgate.engines.vad import SileroVad
from voxgate.gateway import wire
from voxgate.gateway.admission import AdmissionPolicy, LoadSnapshot, Refusal, StreamKind
from voxgate.gateway.audio import OutputEncoder
from voxgate.gateway.base import EngineInfo, Synthesizer, Transcriber
from voxgate.gateway.calls import CallRegistry
from voxgate.gateway.config import (
    ConfigError,
    GatewayConfig,
)
from voxgate.gateway.degrade import QualityLevel
from voxgate.gateway.errors import CallError, ErrorKind, echo
from voxgate.gateway.events import (
    InboundEvent,
    OutboundEvent,
)
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.models import ModelLease, ModelRegistry
from voxgate.gateway.neighbours import Neighbours
from voxgate.gateway.session import CallConfig, CallSession, SynthesisCap, write_stalled
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

__all__ = [
    "SERVICE_NAME",
    "STATUS_OF",
    "VoiceGatewayServicer",
    "add_to_server",
]

log = logging.getLogger("voxgate.service")

#: The one place where domain errors become gRPC statuses.
STATUS_OF: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.UNIMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
}


#: Request metadata by which a client says how it will send its audio (see ``_declared_pacing``).
PACING_METADATA = "voxgate-pacing"


#: Full name of the gRPC service (health checks and reflection list it).
SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["VoiceGateway"].full_name


@dataclass(frozen=True, slots=True)
class _Undecodable:
    """A request whose bytes are not the expected message (the client's fault)."""

    message: str
    size: int

    def error(self) -> CallError:
        return CallError.invalid(
            f"a request of {self.size} bytes is not a valid voxgate.v1.{self.message}; "
            "the client's protobuf encoding is broken or it speaks another protocol"
        )


def _lenient(message_cls: Any) -> Any:
    """A request deserializer that turns undecodable bytes into :class:`_Undecodable`.

    grpc's own path answers a deserializer exception with INTERNAL (and the protobuf error
    text); malformed bytes are the client's fault, so the servicer must see them and answer
    INVALID_ARGUMENT.
    """
    name = message_cls.DESCRIPTOR.name

    def deserialize(data: bytes) -> Any:
        try:
            return message_cls.FromString(data)
        except DecodeError:
            return _Undecodable(name, len(data))

    return deserialize


def add_to_server(servicer: VoiceGatewayServicer, server: grpc.aio.Server) -> None:
    """Register the servicer with lenient request deserializers (see :func:`_lenient`)."""
    out = pb.ConverseResponse.SerializeToString
    handlers = {
        "Converse": grpc.stream_stream_rpc_method_handler(
            servicer.Converse,
            request_deserializer=_lenient(pb.ConverseRequest),
            response_serializer=out,
        ),
        "StreamingRecognize": grpc.stream_stream_rpc_method_handler(
            servicer.StreamingRecognize,
            request_deserializer=_lenient(pb.ConverseRequest),
            response_serializer=out,
        ),
        "Synthesize": grpc.unary_stream_rpc_method_handler(
            servicer.Synthesize,
            request_deserializer=_lenient(pb.SynthesizeRequest),
            response_serializer=pb.SynthesizeResponse.SerializeToString,
        ),
        "ListModels": grpc.unary_unary_rpc_method_handler(
            servicer.ListModels,
            request_deserializer=_lenient(pb.ListModelsRequest),
            response_serializer=pb.ListModelsResponse.SerializeToString,
        ),
        "ListVoices": grpc.unary_unary_rpc_method_handler(
            servicer.ListVoices,
            request_deserializer=_lenient(pb.ListVoicesRequest),
            response_serializer=pb.ListVoicesResponse.SerializeToString,
        ),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


class VoiceGatewayServicer(pb_grpc.VoiceGatewayServicer):
    """Implements ``voxgate.v1.VoiceGateway`` on top of :class:`~.session.CallSession`.

    Args:
        config: the server configuration (limits and VAD defaults).
        transcriber: shared recogniser, or None for a VAD-only server.
        synthesizer: shared voice, or None for a server without TTS.
        info: models and voices to list.
        metrics: where to count (the server's registry); a private one when omitted.
        models: the default and named recognition models (``asr.models_dir``); when given,
            ListModels and ``config.model`` go by it instead of ``info.models``.
    """

    def __init__(
        self,
        config: GatewayConfig,
        transcriber: Transcriber | None = None,
        synthesizer: Synthesizer | None = None,
        info: EngineInfo | None = None,
        metrics: GatewayMetrics | None = None,
        *,
        models: ModelRegistry | None = None,
    ) -> None:
        self.config = config
        self.models = models
        self.metrics = metrics if metrics is not None else GatewayMetrics()
        self.transcriber = transcriber
        self.synthesizer = synthesizer
        self.info = info or EngineInfo()
        #: The calls in progress, their counts and the drain (gateway/calls.py).
        self.calls = CallRegistry()
        #: What other processes keep busy: a lone call encodes on every core only on a quiet
        #: machine (:meth:`alone`).
        self.neighbours = Neighbours()
        #: Admission by measured load; the server's monitor refreshes ``load`` and ``quality``.
        self.admission = AdmissionPolicy(config.admission, config.limits)
        self.load = LoadSnapshot()
        self.quality = QualityLevel()
        if config.vad.model == "silero":
            # Load (and warm) the shared voice model now: a missing model file stops start-up
            # instead of failing every call, and the first call does not wait for it.
            try:
                SileroVad.load()
            except (FileNotFoundError, ValueError) as exc:
                raise ConfigError(f"vad.model=silero: {exc}") from None
        #: The audio end-of-turn model ``smart`` calls use (session.turns.smart_turn_model).
        self.turn_model: SmartTurn | None = None
        spec = config.session.turns.smart_turn_model
        if spec == "auto" and transcriber is None:
            spec = ""  # a server without a recogniser has no turns: nothing could use it
        elif spec == "auto":
            spec = smart_turn_spec(spec)
            if not spec:
                log.info(
                    "no audio end-of-turn model (pip install 'voxgate[turn]' brings Smart "
                    "Turn): smart turns read silence and the words"
                )
        if spec:
            try:
                self.turn_model = SmartTurn.load(spec)
                self.turn_model.warmup()
            except (FileNotFoundError, OSError, ValueError) as exc:
                raise ConfigError(f"session.turns.smart_turn_model: {exc}") from None
            log.info("audio end-of-turn model: %s", self.turn_model.name)

    # -- RPCs --------------------------------------------------------------------------------------

    async def Converse(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:  # noqa: N802
        """One full-duplex call."""
        await self._run_call(context, "converse")

    async def StreamingRecognize(  # noqa: N802
        self, request_iterator: Any, context: grpc.aio.ServicerContext
    ) -> None:
        """Recognition only."""
        await self._run_call(context, "recognize")

    async def Synthesize(  # noqa: N802
        self, request: pb.SynthesizeRequest, context: grpc.aio.ServicerContext
    ) -> None:
        """Text in, streamed audio out."""
        request_id = uuid.uuid4().hex[:16]
        if self.synthesizer is not None:
            if not self.calls.accepting:
                self.metrics.synthesize_refused.labels("shutting_down").inc()
                await _abort(context, CallError(ErrorKind.UNAVAILABLE, "server is shutting down"))
            refusal = self.refusal("synthesize")
            if refusal is not None:
                self.metrics.synthesize_refused.labels(refusal.reason).inc()
                await _abort(context, _refused(refusal))
        self.calls.active_synthesize += 1
        self.metrics.synthesize_active.inc()
        try:
            if isinstance(request, _Undecodable):
                raise request.error()
            await self._synthesize(request, context)
        except CallError as exc:
            log.info("synthesize %s: %s: %s", request_id, exc.kind.value, exc.message)
            if not context.done():
                await _end_with(context, exc, self.config.limits.write_stall_timeout_s)
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            if context.done() or _peer_gone(exc):  # the client left; a late write failed
                return
            log.exception("synthesize %s failed", request_id)
            await _end_with(
                context, _internal(request_id), self.config.limits.write_stall_timeout_s
            )
        finally:
            self.calls.active_synthesize -= 1
            self.metrics.synthesize_active.dec()

    def refusal(self, kind: StreamKind, *, declared_bulk: bool = False) -> Refusal | None:
        """Whether one more stream of ``kind`` would be refused now, and why.

        ``declared_bulk``: the call said it sends faster than real time (``voxgate-pacing:
        bulk``), so it is admitted from spare capacity (see ``AdmissionPolicy.decide``).
        """
        return self.admission.decide(
            kind,
            self.load,
            active_calls=self.calls.active_calls,
            active_synthesize=self.calls.active_synthesize,
            bulk_calls=self.calls.bulk_calls() if kind == "call" else 0,
            declared_bulk=declared_bulk,
        )

    def _audio_model(self, cfg: CallConfig) -> str:
        """The audio end-of-turn model a call's turns consult (its file name), or ''."""
        t = cfg.recognition.turns
        if self.turn_model is None or t.mode != "smart" or not t.audio_model:
            return ""
        return self.turn_model.name

    async def ListModels(  # noqa: N802
        self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListModelsResponse:
        """The default recognition model first, then the named ones (loaded or loadable)."""
        if isinstance(request, _Undecodable):
            await _abort(context, request.error())
        models = self.models.descriptions() if self.models is not None else self.info.models
        turns = self.config.session.turns
        return pb.ListModelsResponse(
            turn_detection=pb.TurnDetectionInfo(
                # A turn ends after its finals: a server without a recogniser sends no EndOfTurn.
                modes=[pb.TURN_DETECTION_SILENCE, pb.TURN_DETECTION_SMART]
                if self.transcriber is not None
                else [],
                default_mode=wire.PB_TURN_MODE[turns.mode],
                audio_model=self.turn_model.name if self.turn_model is not None else "",
            ),
            models=[
                pb.ModelInfo(
                    name=m.name,
                    family=m.family,
                    languages=list(m.languages),
                    device=m.device,
                    compute_type=m.compute_type,
                    is_default=i == 0,
                    loaded=m.loaded,
                )
                for i, m in enumerate(models)
            ],
        )

    async def ListVoices(  # noqa: N802
        self, request: pb.ListVoicesRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListVoicesResponse:
        """Loaded voices."""
        if isinstance(request, _Undecodable):
            await _abort(context, request.error())
        return pb.ListVoicesResponse(
            voices=[
                pb.VoiceInfo(
                    name=v.name,
                    language=v.language,
                    sample_rate_hertz=v.sample_rate_hz,
                    num_speakers=v.num_speakers,
                    is_default=i == 0,
                    license_note=v.license_note,
                )
                for i, v in enumerate(self.info.voices)
            ]
        )

    # -- lifecycle helpers -------------------------------------------------------------------------

    async def wait_idle(self) -> None:
        """Return once no call is active (the server's drain; see CallRegistry.wait_idle)."""
        await self.calls.wait_idle()

    # -- calls -------------------------------------------------------------------------------------

    async def _run_call(
        self, context: grpc.aio.ServicerContext, mode: Literal["converse", "recognize"]
    ) -> None:
        limits = self.config.limits
        if not self.calls.accepting:
            self.metrics.calls_refused.labels("shutting_down").inc()
            await _abort(context, CallError(ErrorKind.UNAVAILABLE, "server is shutting down"))
        try:
            declared_bulk = _declared_pacing(context) == "bulk"
        except CallError as exc:
            await _abort(context, exc)
        # Refused before reading anything, so a balancer can still retry it elsewhere.
        refusal = self.refusal("call", declared_bulk=declared_bulk)
        if refusal is not None:
            self.metrics.calls_refused.labels(refusal.reason).inc()
            await _abort(context, _refused(refusal))
        self.calls.opened()
        self.metrics.calls_active.inc()
        self.metrics.calls_total.labels(mode).inc()
        session_id = uuid.uuid4().hex[:16]
        loop = asyncio.get_running_loop()
        began = loop.time()
        outcome = "ok"
        try:
            ended_by_eof = await self._call(context, mode, session_id, declared_bulk, began)
            if ended_by_eof and not context.cancelled():
                await _settle_cancel(context)
            if context.cancelled():  # the client cancelled; the session saw it as EOF
                outcome = "cancelled"
        except CallError as exc:
            if context.cancelled():  # e.g. EOF before `config` because the client cancelled
                outcome = "cancelled"
            else:
                outcome = exc.kind.value
                log.info("call %s: %s: %s", session_id, exc.kind.value, exc.message)
                await _end_with(context, exc, limits.write_stall_timeout_s)
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except grpc.aio.AbortError:
            raise
        except Exception as exc:
            if context.done() or _peer_gone(exc):
                # The client left while a write was in flight (grpc raises ExecuteBatchError
                # or InvalidStateError there, sometimes before the context says it is done):
                # a cancellation, not a server fault.
                outcome = "cancelled"
            else:
                outcome = "internal"
                log.exception("call %s failed", session_id)
                await _end_with(context, _internal(session_id), limits.write_stall_timeout_s)
        finally:
            self.metrics.calls_ended.labels(outcome).inc()
            self.metrics.calls_active.dec()
            self.calls.closed(session_id, outcome)
            log.info("call %s ended: %s after %.1f s", session_id, outcome, loop.time() - began)

    async def _call(
        self,
        context: grpc.aio.ServicerContext,
        mode: Literal["converse", "recognize"],
        session_id: str,
        declared_bulk: bool = False,
        opened_at: float | None = None,
    ) -> bool:
        """Run one call; True when it ended because its request stream ended (EOF).

        ``opened_at``: the loop's time when the stream opened (the audio quota's origin).
        """
        limits = self.config.limits
        try:
            # A stream that never sends its config holds a call slot for nothing.
            # asyncio.timeout, not wait_for: no extra task, so a client cancel stays a cancel.
            async with asyncio.timeout(limits.first_message_timeout_s or None):
                first = await context.read()
        except TimeoutError:
            limit_s = limits.first_message_timeout_s
            raise CallError(
                ErrorKind.DEADLINE_EXCEEDED,
                f"no `config` arrived within first_message_timeout_s={limit_s:g}",
            ) from None
        if first is grpc.aio.EOF:
            # A client's cancel can reach the stream as this EOF before the context says so
            # (one churned call in 80 was counted invalid_argument): let it show first.
            await _settle_cancel(context)
            raise CallError.invalid("the stream ended before its first ConverseRequest (config)")
        if isinstance(first, _Undecodable):
            raise first.error()
        kind = first.WhichOneof("event")
        if kind != "config":
            raise CallError.invalid(
                f"the first ConverseRequest must carry `config`; got `{kind or 'nothing'}`"
            )
        # A named model loads on its first call (that call waits; others go on); the lease keeps
        # it in memory until this call ends, even if a rescan stops offering it meanwhile.
        lease = await self._acquire_model(first.config.model)
        try:
            return await self._run_session(
                context,
                mode,
                session_id,
                first,
                lease,
                declared_bulk=declared_bulk,
                opened_at=opened_at,
            )
        finally:
            if lease is not None:
                lease.release()

    def alone(self) -> bool:
        """Whether a call has the server, and the machine's cores, to itself.

        No other call, no reply being synthesized, and no other process busy on the cores
        (:class:`~voxgate.gateway.neighbours.Neighbours`).

        Asked by a call when it requests a final (``AsrRequest.alone``): on the CPU such a
        final may encode on every core, which only pays while nothing else wants one. Another
        call's decode, or a voice's window, started meanwhile would share the cores with it
        (docs/turns.md, "A lone call's final encoded on both cores"). Replies and Synthesize
        streams are the voice's own count, the one admission reads; it is read only for a
        call that is alone. A core another process keeps busy would hold the encode's whole
        thread team back to its share of that core.
        """
        return (
            self.calls.active_calls <= 1
            and not self.metrics.value("voxgate_tts_streams_active")
            and self.neighbours.quiet()
        )

    async def _run_session(
        self,
        context: grpc.aio.ServicerContext,
        mode: Literal["converse", "recognize"],
        session_id: str,
        first: pb.ConverseRequest,
        lease: ModelLease | None,
        *,
        declared_bulk: bool = False,
        opened_at: float | None = None,
    ) -> bool:
        limits = self.config.limits
        self.neighbours.start()  # read from the first call on (a no-op once started)
        call_cfg = wire.call_config(self, first.config, mode, lease)
        session = CallSession(
            call_cfg,
            self.config.limits,
            self.transcriber,
            self.synthesizer if mode == "converse" else None,
            log_id=session_id,
            metrics=self.metrics,
            quality=self.quality,
            realtime_slack_ms=self.config.admission.realtime_slack_ms,
            turn_model=self.turn_model,
            declared_bulk=declared_bulk,
            opened_at=opened_at,
            alone=self.alone,
            decode_budget_s=self.config.asr.policy.decode_budget_s,
        )
        self.calls.started(session_id, session)
        started = pb.SessionStarted(
            session_id=session_id,
            effective_config=wire.effective_config(
                first.config, call_cfg, self._audio_model(call_cfg)
            ),
            model=wire.model_name(self, lease),
            voice=self.info.voices[0].name if self.info.voices else "",
            server_version=_version(),
        )
        # Headers on their own (they are not flow-controlled): were they to ride on a first
        # write that stalls, the abort after it would need them again and grpc would refuse it.
        await context.send_initial_metadata(())
        await _write(context, pb.ConverseResponse(started=started), limits.write_stall_timeout_s)
        log.info(
            "call %s started (%s, client call_id=%s)", session_id, mode, echo(first.config.call_id)
        )

        eof = False

        async def source() -> InboundEvent | None:
            nonlocal eof
            msg = await context.read()
            if msg is grpc.aio.EOF:
                eof = True
                return None
            if isinstance(msg, _Undecodable):
                raise msg.error()
            return wire.inbound(self, msg)

        async def sink(event: OutboundEvent) -> None:
            await context.write(wire.outbound(event))

        await session.run(source, sink)
        return eof

    async def _acquire_model(self, requested: str) -> ModelLease | None:
        """The call's model from the registry (loading it if need be); None without one."""
        if self.models is None:
            return None
        return await self.models.acquire(requested)

    # -- Synthesize --------------------------------------------------------------------------------

    async def _synthesize(
        self, request: pb.SynthesizeRequest, context: grpc.aio.ServicerContext
    ) -> None:
        synth = self.synthesizer
        if synth is None:
            raise CallError(
                ErrorKind.UNIMPLEMENTED,
                "Synthesize is not served: this server runs without a voice (engines setting)",
            )
        fmt = request.output_audio
        enc = (
            WireEncoding.LINEAR16
            if fmt.encoding == pb.ENCODING_UNSPECIFIED
            else wire.encoding(fmt.encoding, "output_audio.encoding")
        )
        rate = (
            wire.rate(fmt.sample_rate_hertz, "output_audio.sample_rate_hertz")
            if fmt.sample_rate_hertz
            else (8000 if enc is not WireEncoding.LINEAR16 else 16000)
        )
        speak = wire.speak_in(
            self,
            pb.Speak(
                text=request.text,
                voice=request.voice,
                rate=request.rate,
                speaker_id=request.speaker_id,
            ),
        )
        encoder = OutputEncoder(enc, rate, synth.sample_rate_hz)
        await context.send_initial_metadata(())  # apart from the first write (see _call)
        cap = SynthesisCap(self.config.limits.max_synthesis_s, synth.sample_rate_hz)
        seq = 0
        offset_ms = 0.0
        async for piece in cap.apply(synth.stream(self.quality.speak(speak))):
            data = encoder.encode(piece.samples, last=piece.is_last)
            seq += 1
            words = [pb.Word(word=w, end_ms=end) for w, end in piece.words]
            await _write(
                context,
                pb.SynthesizeResponse(
                    data=data,
                    sequence_number=seq,
                    offset_ms=int(offset_ms),
                    is_last=piece.is_last,
                    words=words,
                ),
                self.config.limits.write_stall_timeout_s,
            )
            offset_ms += 1000.0 * len(piece.samples) / synth.sample_rate_hz
        if cap.cut:
            raise CallError.invalid(cap.message("text"))


async def _write(context: grpc.aio.ServicerContext, message: Any, stall_s: float) -> None:
    """``context.write`` bounded by ``limits.write_stall_timeout_s`` (0 = no bound).

    Once the client stops reading, HTTP/2 flow control makes the write wait for good.
    """
    try:
        async with asyncio.timeout(stall_s or None):
            await context.write(message)
    except TimeoutError:
        raise write_stalled(stall_s) from None


#: Aborts whose status waits behind data the client never read (see :func:`_end_with`).
_DETACHED: set[asyncio.Future[None]] = set()


async def _end_with(context: grpc.aio.ServicerContext, exc: CallError, stall_s: float) -> None:
    """:func:`_abort`, but give up waiting after ``stall_s`` (0 = wait for good).

    HTTP/2 delivers the status after the messages queued before it, so for a client that
    stopped reading the abort never completes, and neither would the handler: the call would
    keep its slot. Past the bound the abort is left queued (grpc frees the stream when the
    connection closes; keepalive closes a dead one) and the handler returns; grpc then ends
    the RPC with the status already set.
    """
    task = asyncio.ensure_future(_abort(context, exc))
    try:
        await asyncio.wait({task}, timeout=stall_s or None)
    finally:
        if not task.done():
            _DETACHED.add(task)
            task.add_done_callback(_forget)
    if task.done():
        task.result()  # raises the AbortError that ends the RPC


def _forget(task: asyncio.Future[None]) -> None:
    _DETACHED.discard(task)
    if not task.cancelled():
        task.exception()  # AbortError, or ExecuteBatchError once the peer is gone


def _declared_pacing(context: grpc.aio.ServicerContext) -> Literal["realtime", "bulk"]:
    """How the client says it will send its audio: ``voxgate-pacing`` request metadata.

    ``bulk``: recorded audio, faster than real time (a file being transcribed); such a call
    is admitted from spare capacity, never refused because real-time callers are near their
    latency limit, and its finals wait behind theirs. ``realtime`` (the default, also when the
    key is absent): a live caller. The server checks the claim against the audio's pace (see
    ``CallSession.bulk``): a "bulk" call that keeps to real time counts as real-time.

    Raises:
        CallError: INVALID_ARGUMENT for any other value, or the key sent twice.
    """
    values = [v for k, v in context.invocation_metadata() or () if k == PACING_METADATA]
    if not values:
        return "realtime"
    if len(values) == 1 and values[0] in ("realtime", "bulk"):
        return "bulk" if values[0] == "bulk" else "realtime"
    raise CallError.invalid(
        f"{PACING_METADATA} metadata must be sent once, as 'realtime' or 'bulk'; got "
        f"{echo(values if len(values) > 1 else values[0])}"
    )


async def _abort(context: grpc.aio.ServicerContext, exc: CallError) -> None:
    """End the RPC with the mapped status (and a QuotaFailure detail for quotas).

    A refusal with a retry hint also carries a ``RetryInfo`` detail and the
    ``grpc-retry-pushback-ms`` trailer: gRPC clients with a retry policy in their service
    config wait that long before their next attempt (gRFC A6). Envoy ignores the trailer; its
    route retries a RESOURCE_EXHAUSTED at once on another replica (deploy/envoy/envoy.yaml).
    """
    if exc.kind is ErrorKind.RESOURCE_EXHAUSTED and exc.quota:
        details = []
        quota = any_pb2.Any()
        quota.Pack(
            error_details_pb2.QuotaFailure(
                violations=[
                    error_details_pb2.QuotaFailure.Violation(
                        subject=exc.quota, description=exc.message
                    )
                ]
            )
        )
        details.append(quota)
        trailers: list[tuple[str, str | bytes]] = []
        if exc.retry_after_ms:
            retry = any_pb2.Any()
            info = error_details_pb2.RetryInfo()
            info.retry_delay.FromMilliseconds(exc.retry_after_ms)
            retry.Pack(info)
            details.append(retry)
            trailers.append(("grpc-retry-pushback-ms", str(exc.retry_after_ms)))
        status = status_pb2.Status(
            code=wire.RPC_CODE[exc.kind], message=exc.message, details=details
        )
        # The standard rich-error trailer; clients read it with grpc_status.rpc_status.from_call.
        trailers.append(("grpc-status-details-bin", status.SerializeToString()))
        await context.abort(STATUS_OF[exc.kind], exc.message, trailing_metadata=tuple(trailers))
    await context.abort(STATUS_OF[exc.kind], exc.message)


def _refused(refusal: Refusal) -> CallError:
    """Admission's refusal as a RESOURCE_EXHAUSTED with a QuotaFailure and a retry hint."""
    quota = refusal.reason if refusal.reason == "max_concurrent_calls" else "admission"
    return CallError(
        ErrorKind.RESOURCE_EXHAUSTED,
        refusal.message,
        quota=quota,
        retry_after_ms=refusal.retry_after_ms,
    )


async def _settle_cancel(context: grpc.aio.ServicerContext, limit_s: float = 0.05) -> None:
    """Give a client's cancel a moment to show before a call that read EOF is counted ``ok``.

    A client cancel reaches the request stream as EOF, and grpc can flag the context as
    cancelled a few loop turns later (seen under load: one churned call in 80 counted ``ok``).
    A true half-close waits at most ``limit_s`` longer for its OK status.
    """
    loop = asyncio.get_running_loop()
    until = loop.time() + limit_s
    # grpc.aio has no awaitable for "the client cancelled" short of the RPC's end, which a
    # handler that has not returned never sees: poll, briefly.
    while not context.cancelled() and not context.done() and loop.time() < until:  # noqa: ASYNC110
        await asyncio.sleep(0.005)


def _peer_gone(exc: BaseException) -> bool:
    """Whether ``exc`` (or every exception in its group) is a write to a departed client.

    grpc's Cython layer raises ``ExecuteBatchError`` (a private class, matched by name) when a
    message is sent on a call the peer has already left; the server itself never causes one.
    """
    if isinstance(exc, BaseExceptionGroup):
        return all(_peer_gone(e) for e in exc.exceptions)
    return isinstance(exc, asyncio.InvalidStateError) or type(exc).__name__ == "ExecuteBatchError"


def _internal(call_id: str) -> CallError:
    """The generic INTERNAL error: the exception's text is in the log, never in the status."""
    return CallError(
        ErrorKind.INTERNAL, f"internal error; the server log has the details under call {call_id}"
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version  # noqa: PLC0415

    try:
        return version("voxgate")
    except PackageNotFoundError:
        return "0+unknown"
