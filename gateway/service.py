"""The gRPC servicer: the only server module that touches generated protobuf code.

It validates requests, converts between protobuf and the session's dataclasses, and maps domain
errors to gRPC statuses in one table (:data:`STATUS_OF`). Each RPC's failures end that RPC alone.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

import grpc
from google.protobuf import any_pb2
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, error_details_pb2, status_pb2

from voxgate.engines.asr import MAX_BOOST
from voxgate.engines.asr.base import AsrOptions
from voxgate.engines.turn import SmartTurn
from voxgate.engines.vad import SileroVad
from voxgate.gateway.admission import AdmissionPolicy, LoadSnapshot, Refusal, StreamKind
from voxgate.gateway.audio import OutputEncoder
from voxgate.gateway.barge_in import BargeInMode, BargeInModel, BargeInPolicy
from voxgate.gateway.base import EngineInfo, Synthesizer, Transcriber
from voxgate.gateway.config import (
    ConfigError,
    EchoCancellerName,
    GatewayConfig,
    TurnsConfig,
    VadConfig,
)
from voxgate.gateway.degrade import QualityLevel
from voxgate.gateway.errors import CallError, ErrorKind, echo
from voxgate.gateway.events import (
    AudioIn,
    AudioOutEvent,
    ClearIn,
    DtmfIn,
    DtmfOut,
    EndOfTurnOut,
    ErrorOut,
    FlushIn,
    HangupIn,
    InboundEvent,
    InterruptedOut,
    MarkIn,
    MarkReachedOut,
    OutboundEvent,
    PlaybackFinishedOut,
    QualityOut,
    RejectedSpeakIn,
    SpeakIn,
    SpeechOut,
    TranscriptOut,
)
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.models import ModelLease, ModelRegistry
from voxgate.gateway.session import CallConfig, CallSession, SynthesisCap, write_stalled
from voxgate.gateway.turns import TurnMode, TurnOptions
from voxgate.pcmcodec import SUPPORTED_RATES_HZ, WireEncoding
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

_RPC_CODE: dict[ErrorKind, int] = {
    ErrorKind.INVALID_ARGUMENT: code_pb2.INVALID_ARGUMENT,
    ErrorKind.RESOURCE_EXHAUSTED: code_pb2.RESOURCE_EXHAUSTED,
    ErrorKind.FAILED_PRECONDITION: code_pb2.FAILED_PRECONDITION,
    ErrorKind.UNIMPLEMENTED: code_pb2.UNIMPLEMENTED,
    ErrorKind.UNAVAILABLE: code_pb2.UNAVAILABLE,
    ErrorKind.INTERNAL: code_pb2.INTERNAL,
    ErrorKind.NOT_FOUND: code_pb2.NOT_FOUND,
    ErrorKind.DEADLINE_EXCEEDED: code_pb2.DEADLINE_EXCEEDED,
}

_ENCODINGS: dict[int, WireEncoding] = {
    int(pb.LINEAR16): WireEncoding.LINEAR16,
    int(pb.MULAW): WireEncoding.MULAW,
    int(pb.ALAW): WireEncoding.ALAW,
}
_PB_ENCODING = {
    WireEncoding.LINEAR16: pb.LINEAR16,
    WireEncoding.MULAW: pb.MULAW,
    WireEncoding.ALAW: pb.ALAW,
}


_DTMF_DIGITS = frozenset("0123456789*#ABCD")
#: A keypad press longer than this is no press (RFC 4733 events top out near 8 s).
_MAX_DTMF_MS = 60_000
#: Bounds of the barge-in options a call may give.
_MAX_MIN_WORDS = 20
#: Request metadata by which a client says how it will send its audio (see ``_declared_pacing``).
PACING_METADATA = "voxgate-pacing"
_MAX_BACKCHANNELS = 200
_MAX_BACKCHANNEL_CHARS = 64
_BARGE_IN_MODES: dict[pb.BargeIn, BargeInMode] = {
    pb.BARGE_IN_IMMEDIATE: "immediate",
    pb.BARGE_IN_AFTER_WORDS: "after_words",
    pb.BARGE_IN_NEVER: "never",
}
_PB_BARGE_IN = {mode: value for value, mode in _BARGE_IN_MODES.items()}
_ECHO_HANDLING: dict[pb.EchoHandling, EchoCancellerName] = {
    pb.ECHO_HANDLING_GATE: "gate",
    pb.ECHO_HANDLING_GATE_AEC3: "gate_aec3",
    pb.ECHO_HANDLING_AEC3: "aec3",
}
_PB_ECHO_HANDLING = {mode: value for value, mode in _ECHO_HANDLING.items()}


def _echo_handling(value: pb.EchoHandling, default: EchoCancellerName) -> EchoCancellerName:
    """A call's EchoHandling as the session's echo_canceller; UNSPECIFIED: the server's."""
    if value == pb.ECHO_HANDLING_UNSPECIFIED:
        return default
    mode = _ECHO_HANDLING.get(value)
    if mode is None:
        raise CallError.invalid(
            f"config.barge_in.echo_handling={value} is not an EchoHandling value; use "
            + ", ".join(pb.EchoHandling.Name(v) for v in _ECHO_HANDLING)
        )
    return mode


_TURN_MODES: dict[pb.TurnDetection, TurnMode] = {
    pb.TURN_DETECTION_OFF: "off",
    pb.TURN_DETECTION_SILENCE: "silence",
    pb.TURN_DETECTION_SMART: "smart",
}
_PB_TURN_MODE = {mode: value for value, mode in _TURN_MODES.items()}


def _turn_options(
    req: pb.TurnDetectionOptions, defaults: TurnsConfig, vad: VadConfig
) -> TurnOptions:
    """A call's turn detection: the server's defaults, as ``config.turn_detection`` sets it."""
    if req.mode == pb.TURN_DETECTION_UNSPECIFIED:
        mode: TurnMode = defaults.mode
    elif req.mode in _TURN_MODES:
        mode = _TURN_MODES[req.mode]
    else:
        raise CallError.invalid(
            f"config.turn_detection.mode={req.mode} is not a TurnDetection value; use "
            + ", ".join(pb.TurnDetection.Name(v) for v in _TURN_MODES)
        )
    if not 0.0 <= req.eagerness <= 1.0:
        raise CallError.invalid(
            f"config.turn_detection.eagerness={req.eagerness:g} is outside 0..1"
        )
    if req.end_silence_ms and not 100 <= req.end_silence_ms <= 10_000:
        raise CallError.invalid(
            f"config.turn_detection.end_silence_ms={req.end_silence_ms} is outside 100..10000"
        )
    if req.max_pause_ms and not 200 <= req.max_pause_ms <= 10_000:
        raise CallError.invalid(
            f"config.turn_detection.max_pause_ms={req.max_pause_ms} is outside 200..10000"
        )
    min_silence = defaults.min_silence_ms
    end_silence = vad.end_silence_ms
    if mode == "smart" and req.end_silence_ms:
        min_silence = req.end_silence_ms
    elif req.end_silence_ms:
        end_silence = req.end_silence_ms
    max_pause = req.max_pause_ms or max(defaults.max_pause_ms, min_silence)
    if max_pause < min_silence:
        raise CallError.invalid(
            f"config.turn_detection.max_pause_ms={max_pause} is shorter than its end_silence_ms"
            f"={min_silence}"
        )
    return TurnOptions(
        mode=mode,
        eagerness=req.eagerness or defaults.eagerness,
        end_silence_ms=end_silence,
        min_silence_ms=min_silence,
        max_pause_ms=max_pause,
        decode_after_ms=min(defaults.decode_after_ms, min_silence),
    )


def _turn_vad(vad: VadConfig, turns: TurnOptions) -> VadConfig:
    """The VAD a call runs with its turn detection: the hangover ends utterances, not turns.

    ``smart`` ends each utterance after ``min_silence_ms`` (its final comes then, decoded with
    the turn's earlier words as its prompt) and decides the turn on top; ``silence`` ends the
    utterance and its turn on ``end_silence_ms``.
    """
    hangover = {"smart": turns.min_silence_ms, "silence": turns.end_silence_ms}.get(turns.mode)
    if hangover is None or hangover == vad.end_silence_ms:
        return vad
    return vad.model_copy(update={"end_silence_ms": hangover})


def _barge_in_mode(value: pb.BargeIn, field: str) -> BargeInMode | None:
    """A proto BargeIn as a mode; None for UNSPECIFIED (inherit)."""
    if value == pb.BARGE_IN_UNSPECIFIED:
        return None
    mode = _BARGE_IN_MODES.get(value)
    if mode is None:
        raise CallError.invalid(
            f"{field}={value} is not a BargeIn value; use BARGE_IN_IMMEDIATE, "
            "BARGE_IN_AFTER_WORDS or BARGE_IN_NEVER"
        )
    return mode


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
        self.active_calls = 0
        self.accepting = True
        #: How this servicer's calls ended, by outcome (the metric's labels), for observers.
        self.outcomes: Counter[str] = Counter()
        self._sessions: dict[str, CallSession] = {}
        self._ending = False
        #: Admission by measured load; the server's monitor refreshes ``load`` and ``quality``.
        self.admission = AdmissionPolicy(config.admission, config.limits)
        self.load = LoadSnapshot()
        self.quality = QualityLevel()
        self.active_synthesize = 0
        self._idle = asyncio.Event()
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
        if spec:
            try:
                self.turn_model = SmartTurn.load(spec)
                self.turn_model.warmup()
            except (FileNotFoundError, OSError, ValueError) as exc:
                raise ConfigError(f"session.turns.smart_turn_model: {exc}") from None
        self._idle.set()

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
            if not self.accepting:
                self.metrics.synthesize_refused.labels("shutting_down").inc()
                await _abort(context, CallError(ErrorKind.UNAVAILABLE, "server is shutting down"))
            refusal = self.refusal("synthesize")
            if refusal is not None:
                self.metrics.synthesize_refused.labels(refusal.reason).inc()
                await _abort(context, _refused(refusal))
        self.active_synthesize += 1
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
            self.active_synthesize -= 1
            self.metrics.synthesize_active.dec()

    def bulk_calls(self) -> int:
        """Calls in progress whose audio runs ahead of real time now (see CallSession.bulk)."""
        return sum(1 for session in self._sessions.values() if session.bulk)

    def refusal(self, kind: StreamKind, *, declared_bulk: bool = False) -> Refusal | None:
        """Whether one more stream of ``kind`` would be refused now, and why.

        ``declared_bulk``: the call said it sends faster than real time (``voxgate-pacing:
        bulk``), so it is admitted from spare capacity (see ``AdmissionPolicy.decide``).
        """
        return self.admission.decide(
            kind,
            self.load,
            active_calls=self.active_calls,
            active_synthesize=self.active_synthesize,
            bulk_calls=self.bulk_calls() if kind == "call" else 0,
            declared_bulk=declared_bulk,
        )

    def _audio_model(self, cfg: CallConfig) -> str:
        """The audio end-of-turn model a call's turns consult (its file name), or ''."""
        t = cfg.turns
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
                default_mode=_PB_TURN_MODE[turns.mode],
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
        """Return once no call is active (used by graceful shutdown)."""
        await self._idle.wait()

    def end_calls(self) -> int:
        """Ask every active call to end without losing speech (see ``CallSession.shutdown``).

        Calls that have not sent their config yet are ended as soon as they do. Returns how
        many calls were asked.
        """
        self._ending = True
        for session in self._sessions.values():
            session.shutdown()
        return len(self._sessions)

    # -- calls -------------------------------------------------------------------------------------

    async def _run_call(
        self, context: grpc.aio.ServicerContext, mode: Literal["converse", "recognize"]
    ) -> None:
        limits = self.config.limits
        if not self.accepting:
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
        self.active_calls += 1
        self._idle.clear()
        self.metrics.calls_active.inc()
        self.metrics.calls_total.labels(mode).inc()
        session_id = uuid.uuid4().hex[:16]
        loop = asyncio.get_running_loop()
        began = loop.time()
        outcome = "ok"
        try:
            ended_by_eof = await self._call(context, mode, session_id, declared_bulk)
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
            self.outcomes[outcome] += 1
            self.metrics.calls_active.dec()
            self.active_calls -= 1
            self._sessions.pop(session_id, None)
            if self.active_calls == 0:
                self._idle.set()
            log.info("call %s ended: %s after %.1f s", session_id, outcome, loop.time() - began)

    async def _call(
        self,
        context: grpc.aio.ServicerContext,
        mode: Literal["converse", "recognize"],
        session_id: str,
        declared_bulk: bool = False,
    ) -> bool:
        """Run one call; True when it ended because its request stream ended (EOF)."""
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
                context, mode, session_id, first, lease, declared_bulk=declared_bulk
            )
        finally:
            if lease is not None:
                lease.release()

    async def _run_session(
        self,
        context: grpc.aio.ServicerContext,
        mode: Literal["converse", "recognize"],
        session_id: str,
        first: pb.ConverseRequest,
        lease: ModelLease | None,
        *,
        declared_bulk: bool = False,
    ) -> bool:
        limits = self.config.limits
        call_cfg = self._call_config(first.config, mode, lease)
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
        )
        self._sessions[session_id] = session
        if self._ending:
            session.shutdown()
        started = pb.SessionStarted(
            session_id=session_id,
            effective_config=_effective_config(first.config, call_cfg, self._audio_model(call_cfg)),
            model=self._model_name(lease),
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
            return self._inbound(msg)

        async def sink(event: OutboundEvent) -> None:
            await context.write(_outbound(event))

        await session.run(source, sink)
        return eof

    def _call_config(
        self,
        cfg: pb.SessionConfig,
        mode: Literal["converse", "recognize"],
        lease: ModelLease | None = None,
    ) -> CallConfig:
        in_enc = _encoding(cfg.input_audio.encoding, "config.input_audio.encoding")
        in_rate = _rate(cfg.input_audio.sample_rate_hertz, "config.input_audio.sample_rate_hertz")
        if cfg.output_audio.encoding == pb.ENCODING_UNSPECIFIED:
            out_enc = in_enc
        else:
            out_enc = _encoding(cfg.output_audio.encoding, "config.output_audio.encoding")
        out_rate = (
            _rate(cfg.output_audio.sample_rate_hertz, "config.output_audio.sample_rate_hertz")
            if cfg.output_audio.sample_rate_hertz
            else in_rate
        )
        vad = _vad_config(self.config.vad, cfg.vad)
        turns = _turn_options(cfg.turn_detection, self.config.session.turns, vad)
        vad = _turn_vad(vad, turns)
        dec = cfg.decoding
        if dec.beam_size < 0 or dec.beam_size > 16:
            raise CallError.invalid(f"config.decoding.beam_size={dec.beam_size} is outside 0..16")
        if dec.mbr_candidates < 0 or dec.mbr_candidates > 16:
            raise CallError.invalid(
                f"config.decoding.mbr_candidates={dec.mbr_candidates} is outside 0..16"
            )
        if dec.max_alternatives < 0 or dec.max_alternatives > 10:
            raise CallError.invalid(
                f"config.decoding.max_alternatives={dec.max_alternatives} is outside 0..10"
            )
        limits = self.config.limits
        if len(cfg.call_id) > limits.max_id_chars:
            raise CallError.invalid(
                f"config.call_id has {len(cfg.call_id)} characters, over "
                f"max_id_chars={limits.max_id_chars}"
            )
        language = self._language(cfg.language, lease)
        if lease is None:
            self._model(cfg.model)
        hotwords, context_tokens = self._context_tokens(dec, lease)
        asr_options = AsrOptions(
            language=language,
            task="translate" if dec.translate else "transcribe",
            beam_size=max(1, dec.beam_size),
            mbr_candidates=dec.mbr_candidates,
            num_alternatives=dec.max_alternatives,
            word_timestamps=dec.word_timestamps,
            initial_prompt=dec.initial_prompt,
            hotwords=hotwords,
            silence_aware=not dec.disable_silence_policy,
            context_tokens=context_tokens,
            model=lease.key if lease is not None else "",
        )
        if cfg.interim_interval_ms and not 200 <= cfg.interim_interval_ms <= 10_000:
            raise CallError.invalid(
                f"config.interim_interval_ms={cfg.interim_interval_ms} is outside 200..10000"
            )
        if cfg.barge_in.min_speech_ms < 0 or cfg.barge_in.min_speech_ms > 5_000:
            raise CallError.invalid(
                f"config.barge_in.min_speech_ms={cfg.barge_in.min_speech_ms} is outside 0..5000"
            )
        if cfg.voice and self.info.voices and cfg.voice not in {v.name for v in self.info.voices}:
            raise CallError.invalid(
                f"config.voice={echo(cfg.voice)} is not loaded; ListVoices has "
                f"{', '.join(v.name for v in self.info.voices)}"
            )
        return CallConfig(
            input_encoding=in_enc,
            input_rate_hz=in_rate,
            output_encoding=out_enc,
            output_rate_hz=out_rate,
            vad=vad,
            dtmf=self.config.dtmf if self.config.dtmf.inband else None,
            asr_options=asr_options,
            interim_results=cfg.interim_results,
            interim_interval_ms=cfg.interim_interval_ms or self.config.session.interim_interval_ms,
            barge_in=not cfg.barge_in.disabled,
            barge_in_min_speech_ms=cfg.barge_in.min_speech_ms,
            barge_in_policy=self._barge_in_policy(cfg.barge_in),
            barge_in_interim_ms=self.config.session.barge_in.interim_interval_ms,
            barge_in_first_interim_speech_ms=self.config.session.barge_in.first_interim_speech_ms,
            barge_in_urgent_interims=self.config.session.barge_in.urgent_interims,
            barge_in_overlap_ms=self.config.session.barge_in.overlap_interim_ms,
            barge_in_model=self._barge_in_model(),
            reply_language=self._reply_language(cfg.voice),
            echo_guard=self.config.session.barge_in.echo_guard
            and not cfg.barge_in.echo_guard_disabled,
            echo_canceller=_echo_handling(
                cfg.barge_in.echo_handling, self.config.session.barge_in.echo_canceller
            ),
            mode=mode,
            speculative_finals=self.config.session.speculative_finals,
            language=self.config.session.language,
            playout_lead_ms=self.config.session.playout_lead_ms,
            playout_prebuffer_ms=self.config.session.playout_prebuffer_ms,
            turns=turns,
        )

    def _reply_language(self, voice: str) -> str | None:
        """The call's voice's language as Whisper names it (``en_US`` -> ``en``), if known."""
        voices = self.info.voices
        chosen = next((v for v in voices if v.name == voice), voices[0] if voices else None)
        if chosen is None or not chosen.language:
            return None
        return chosen.language.replace("-", "_").split("_")[0].lower() or None

    def _barge_in_model(self) -> BargeInModel | None:
        """The model for interims only ``after_words`` reads (``asr.barge_in_model``), if on."""
        model = self.models.barge_in if self.models is not None else None
        if model is None or not self.config.session.barge_in.barge_in_model:
            return None
        return BargeInModel(model.key, tuple(model.description.languages))

    def _barge_in_policy(self, req: pb.BargeInConfig) -> BargeInPolicy:
        """The call's barge-in policy: the server's defaults, as ``config.barge_in`` sets it."""
        defaults = self.config.session.barge_in
        mode = _barge_in_mode(req.policy, "config.barge_in.policy") or defaults.policy
        if not 0 <= req.min_words <= _MAX_MIN_WORDS:
            raise CallError.invalid(
                f"config.barge_in.min_words={req.min_words} is outside 0..{_MAX_MIN_WORDS}"
            )
        if len(req.backchannels) > _MAX_BACKCHANNELS:
            raise CallError.invalid(
                f"config.barge_in.backchannels has {len(req.backchannels)} entries, over "
                f"{_MAX_BACKCHANNELS}"
            )
        for phrase in req.backchannels:
            if len(phrase) > _MAX_BACKCHANNEL_CHARS:
                raise CallError.invalid(
                    f"config.barge_in.backchannels has an entry of {len(phrase)} characters, "
                    f"over {_MAX_BACKCHANNEL_CHARS}"
                )
        return BargeInPolicy(
            mode=mode,
            min_words=req.min_words or defaults.min_words,
            backchannels=tuple(req.backchannels) or defaults.backchannels,
        )

    def _language(self, requested: str, lease: ModelLease | None = None) -> str | None:
        """``config.language`` as a Whisper code ("en-US" -> "en"); None detects per utterance."""
        language = requested.split("-", maxsplit=1)[0].lower() or None
        model = lease.description if lease is not None else None
        if model is None and self.info.models:
            model = self.info.models[0]
        if language is None or model is None:
            return language
        known = model.languages
        if known and language not in known:
            raise CallError.invalid(
                f"config.language={echo(requested)} is not a language of model "
                f"{model.name!r}; use one of {', '.join(known)} (see ListModels), "
                "or leave it empty to detect"
            )
        return language

    async def _acquire_model(self, requested: str) -> ModelLease | None:
        """The call's model from the registry (loading it if need be); None without one."""
        if self.models is None:
            return None
        return await self.models.acquire(requested)

    def _model_name(self, lease: ModelLease | None) -> str:
        """What SessionStarted.model says: the call's model, else the default."""
        if lease is not None:
            return lease.description.name
        return self.info.models[0].name if self.info.models else ""

    def _model(self, requested: str) -> None:
        """Refuse a ``config.model`` that is not loaded (it used to be ignored silently)."""
        if not requested:
            return
        names = [m.name for m in self.info.models]
        if requested not in names:
            have = f"ListModels has {', '.join(names)}" if names else "none is loaded"
            raise CallError.invalid(f"config.model={echo(requested)} is not loaded; {have}")

    def _context_tokens(
        self, dec: pb.DecodingOptions, lease: ModelLease | None = None
    ) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
        """Bound the call's prompt and hotwords, then tokenise them once for the whole call.

        Returns the hotwords (its ``boosted_phrases`` among them, see :func:`_hotwords`) and
        their tokens with the prompt's (None without a recogniser).
        """
        limits = self.config.limits
        count = len(dec.hotwords) + len(dec.boosted_phrases)
        if count > limits.max_hotwords:
            raise CallError.invalid(
                f"config.decoding.hotwords and boosted_phrases have {count} entries together, "
                f"over max_hotwords={limits.max_hotwords}"
            )
        chars = (
            len(dec.initial_prompt)
            + sum(len(h) for h in dec.hotwords)
            + sum(len(p.phrase) for p in dec.boosted_phrases)
        )
        if chars > limits.max_context_chars:
            raise CallError.invalid(
                f"config.decoding.initial_prompt, hotwords and boosted_phrases have {chars} "
                f"characters together, over max_context_chars={limits.max_context_chars}"
            )
        hotwords = _hotwords(dec)
        if self.transcriber is None:
            return hotwords, None
        if lease is not None and lease.key:  # a named model: its own tokenizer
            tokens = lease.encode_context(dec.initial_prompt, hotwords)
        else:
            tokens = self.transcriber.encode_context(dec.initial_prompt, hotwords)
        if len(tokens) > limits.max_prompt_tokens:
            raise CallError.invalid(
                f"config.decoding.initial_prompt and hotwords make {len(tokens)} Whisper tokens, "
                f"over max_prompt_tokens={limits.max_prompt_tokens}; shorten them"
            )
        return hotwords, tokens

    def _id(self, value: str, name: str) -> str:
        if len(value) > self.config.limits.max_id_chars:
            raise CallError.invalid(
                f"{name} has {len(value)} characters, over "
                f"max_id_chars={self.config.limits.max_id_chars}"
            )
        return value

    def _inbound(self, msg: pb.ConverseRequest) -> InboundEvent:
        kind = msg.WhichOneof("event")
        if kind == "audio":
            return AudioIn(msg.audio.data)
        if kind == "speak":
            # A bad Speak must not hang up on the caller: it becomes an ErrorEvent on the call.
            try:
                return self._speak(msg.speak)
            except CallError as exc:
                speak_id = msg.speak.speak_id
                if len(speak_id) > self.config.limits.max_id_chars:
                    speak_id = ""  # never echo an unbounded id back on every event
                return RejectedSpeakIn(speak_id, exc)
        if kind == "clear":
            return ClearIn()
        if kind == "mark":
            if not msg.mark.name:
                raise CallError.invalid("mark.name is empty; name the mark to be told about it")
            return MarkIn(self._id(msg.mark.name, "mark.name"))
        if kind == "hangup":
            return HangupIn()
        if kind == "flush":
            return FlushIn()
        if kind == "dtmf":
            if len(msg.dtmf.digit) != 1 or msg.dtmf.digit not in _DTMF_DIGITS:
                raise CallError.invalid(
                    f"dtmf.digit={echo(msg.dtmf.digit)} is not one of 0-9 * # A-D"
                )
            if not 0 <= msg.dtmf.duration_ms <= _MAX_DTMF_MS:
                raise CallError.invalid(
                    f"dtmf.duration_ms={msg.dtmf.duration_ms} is outside 0..{_MAX_DTMF_MS}"
                )
            return DtmfIn(msg.dtmf.digit, msg.dtmf.duration_ms)
        if kind == "config":
            raise CallError.invalid("a second `config` arrived; config is only valid first")
        raise CallError.invalid("a ConverseRequest with no event set arrived")

    def _speak(self, sp: pb.Speak) -> SpeakIn:
        # The one text limit is the voice's own (tts.max_chars), checked here on arrival so
        # that a queued Speak is never refused only when its turn comes.
        max_chars = self.synthesizer.max_text_chars if self.synthesizer is not None else 0
        if not sp.text.strip():
            raise CallError.invalid("speak.text is empty")
        if max_chars and len(sp.text) > max_chars:
            raise CallError.invalid(
                f"speak.text has {len(sp.text)} characters, over tts.max_chars={max_chars}; "
                "split it into several Speak requests"
            )
        self._id(sp.speak_id, "speak.speak_id")
        rate = sp.rate or 1.0
        if not 0.5 <= rate <= 2.0:
            raise CallError.invalid(f"speak.rate={sp.rate:g} is outside 0.5..2.0")
        if sp.voice and self.info.voices and sp.voice not in {v.name for v in self.info.voices}:
            raise CallError.invalid(f"speak.voice={echo(sp.voice)} is not loaded (see ListVoices)")
        if sp.speaker_id < 0:
            raise CallError.invalid(f"speak.speaker_id={sp.speaker_id} is negative")
        if not 0 <= sp.barge_in_min_words <= _MAX_MIN_WORDS:
            raise CallError.invalid(
                f"speak.barge_in_min_words={sp.barge_in_min_words} is outside 0..{_MAX_MIN_WORDS}"
            )
        return SpeakIn(
            text=sp.text,
            speak_id=sp.speak_id or uuid.uuid4().hex[:12],
            voice=sp.voice,
            rate=rate,
            speaker_id=sp.speaker_id,
            uninterruptible=sp.uninterruptible,
            barge_in=_barge_in_mode(sp.barge_in, "speak.barge_in"),
            barge_in_min_words=sp.barge_in_min_words,
        )

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
            else _encoding(fmt.encoding, "output_audio.encoding")
        )
        rate = (
            _rate(fmt.sample_rate_hertz, "output_audio.sample_rate_hertz")
            if fmt.sample_rate_hertz
            else (8000 if enc is not WireEncoding.LINEAR16 else 16000)
        )
        speak = self._speak(
            pb.Speak(
                text=request.text,
                voice=request.voice,
                rate=request.rate,
                speaker_id=request.speaker_id,
            )
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


def _encoding(value: int, field: str) -> WireEncoding:
    enc = _ENCODINGS.get(value)
    if enc is None:
        name: str = pb.Encoding.Name(value) if value in pb.Encoding.values() else str(value)
        raise CallError.invalid(f"{field}={name} is not supported; use LINEAR16, MULAW or ALAW")
    return enc


def _rate(value: int, field: str) -> int:
    if value not in SUPPORTED_RATES_HZ:
        raise CallError.invalid(
            f"{field}={value} is not supported; use one of "
            f"{', '.join(str(r) for r in SUPPORTED_RATES_HZ)}"
        )
    return value


def _vad_config(default: VadConfig, req: pb.VadConfig) -> VadConfig:
    over: dict[str, int] = {}
    if req.HasField("aggressiveness"):
        over["aggressiveness"] = req.aggressiveness
    for name in (
        "frame_ms",
        "start_speech_ms",
        "end_silence_ms",
        "min_speech_ms",
        "max_utterance_ms",
        "pre_roll_ms",
    ):
        value = getattr(req, name)
        if value < 0:
            raise CallError.invalid(f"config.vad.{name}={value} is negative")
        if value:
            over[name] = value
    if not over:
        return default
    try:
        return VadConfig.model_validate({**default.model_dump(), **over})
    except ValueError as exc:
        first = exc.errors()[0] if hasattr(exc, "errors") else None
        if first is not None:
            loc = ".".join(str(p) for p in first["loc"]) or "vad"
            raise CallError.invalid(f"config.vad.{loc}: {first['msg']}") from None
        raise CallError.invalid(f"config.vad: {exc}") from None


def _effective_config(
    req: pb.SessionConfig, cfg: CallConfig, audio_model: str = ""
) -> pb.SessionConfig:
    eff = pb.SessionConfig()
    eff.CopyFrom(req)
    eff.input_audio.encoding = _PB_ENCODING[cfg.input_encoding]
    eff.input_audio.sample_rate_hertz = cfg.input_rate_hz
    eff.output_audio.encoding = _PB_ENCODING[cfg.output_encoding]
    eff.output_audio.sample_rate_hertz = cfg.output_rate_hz
    v = cfg.vad
    eff.vad.aggressiveness = v.aggressiveness
    eff.vad.frame_ms = v.frame_ms
    eff.vad.start_speech_ms = v.start_speech_ms
    eff.vad.end_silence_ms = v.end_silence_ms
    eff.vad.min_speech_ms = v.min_speech_ms
    eff.vad.max_utterance_ms = v.max_utterance_ms
    eff.vad.pre_roll_ms = v.pre_roll_ms
    eff.interim_interval_ms = cfg.interim_interval_ms
    policy = cfg.barge_in_policy
    eff.barge_in.policy = _PB_BARGE_IN[policy.mode if cfg.barge_in else "never"]
    eff.barge_in.min_words = policy.min_words
    eff.barge_in.backchannels[:] = list(policy.backchannels)
    eff.barge_in.echo_guard_disabled = not cfg.echo_guard
    eff.barge_in.echo_handling = _PB_ECHO_HANDLING[cfg.echo_canceller]
    t = cfg.turns
    if t.on or req.HasField("turn_detection"):
        eff.turn_detection.mode = _PB_TURN_MODE[t.mode]
        eff.turn_detection.eagerness = t.eagerness
        eff.turn_detection.end_silence_ms = (
            t.min_silence_ms if t.mode == "smart" else t.end_silence_ms
        )
        eff.turn_detection.max_pause_ms = t.max_pause_ms
        eff.turn_detection.audio_model = audio_model
    return eff


def _outbound(event: OutboundEvent) -> pb.ConverseResponse:
    if isinstance(event, AudioOutEvent):
        return pb.ConverseResponse(
            audio=pb.AudioOut(
                data=event.data,
                sequence_number=event.sequence_number,
                speak_id=event.speak_id,
                offset_ms=event.offset_ms,
                is_last=event.is_last,
            )
        )
    if isinstance(event, SpeechOut):
        t = pb.SpeechEvent.SPEECH_BEGIN if event.begin else pb.SpeechEvent.SPEECH_END
        return pb.ConverseResponse(
            speech=pb.SpeechEvent(
                type=t, offset_ms=event.offset_ms, utterance_index=event.utterance_index
            )
        )
    if isinstance(event, TranscriptOut):
        r = event.result
        return pb.ConverseResponse(
            transcript=pb.Transcript(
                text=r.text,
                is_final=event.is_final,
                start_ms=event.start_ms,
                end_ms=event.end_ms,
                words=[
                    pb.Word(
                        word=w.text,
                        start_ms=event.start_ms + w.start_ms,
                        end_ms=event.start_ms + w.end_ms,
                        probability=w.probability,
                    )
                    for w in r.words
                ],
                confidence=r.confidence,
                no_speech_probability=r.no_speech_prob,
                alternatives=[
                    pb.Alternative(text=a.text, confidence=a.confidence) for a in r.alternatives
                ],
                language=r.language,
                utterance_index=event.utterance_index,
                latency_ms=event.latency_ms,
                turn_index=event.turn_index,
            )
        )
    if isinstance(event, MarkReachedOut):
        return pb.ConverseResponse(mark=pb.MarkReached(name=event.name))
    if isinstance(event, InterruptedOut):
        return pb.ConverseResponse(
            interrupted=pb.PlaybackInterrupted(
                speak_id=event.speak_id,
                played_ms=event.played_ms,
                words_played=list(event.words_played),
                at_offset_ms=event.at_offset_ms,
                caller_text=event.caller_text,
            )
        )
    if isinstance(event, PlaybackFinishedOut):
        return pb.ConverseResponse(
            playback_finished=pb.PlaybackFinished(
                speak_id=event.speak_id, duration_ms=event.duration_ms
            )
        )
    if isinstance(event, QualityOut):
        return pb.ConverseResponse(
            quality_changed=pb.QualityChanged(shed=list(event.shed), description=event.description)
        )
    if isinstance(event, ErrorOut):
        return pb.ConverseResponse(
            error=pb.ErrorEvent(
                code=_RPC_CODE[event.kind],
                message=event.message,
                scope=event.scope,
                utterance_index=event.utterance_index,
                speak_id=event.speak_id,
            )
        )
    if isinstance(event, EndOfTurnOut):
        return pb.ConverseResponse(
            end_of_turn=pb.EndOfTurn(
                turn_index=event.turn_index,
                probability=event.probability,
                offset_ms=event.offset_ms,
                text=event.text,
                first_utterance_index=event.first_utterance_index,
                last_utterance_index=event.last_utterance_index,
                reason=event.reason,
                silence_ms=event.silence_ms,
                latency_ms=event.latency_ms,
            )
        )
    if isinstance(event, DtmfOut):
        return pb.ConverseResponse(dtmf=pb.Dtmf(digit=event.digit, duration_ms=event.duration_ms))
    raise TypeError(f"unknown outbound event {event!r}")


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


def _hotwords(dec: pb.DecodingOptions) -> tuple[str, ...]:
    """The call's hotwords, its typed ``boosted_phrases`` among them.

    Written the way the engine reads a boost (``phrase^boost``, ``engines/asr/_phrases.py``),
    so that the server has one form of a boosted phrase.

    Raises:
        CallError: INVALID_ARGUMENT for an empty phrase, one with '^' (it would be read as
            a boost), or a boost outside (0, MAX_BOOST].
    """
    out = list(dec.hotwords)
    for i, item in enumerate(dec.boosted_phrases):
        field = f"config.decoding.boosted_phrases[{i}]"
        phrase = item.phrase.strip()
        if not phrase or "^" in phrase:
            raise CallError.invalid(f"{field}.phrase must be words without '^'; got {echo(phrase)}")
        if not (0.0 < item.boost <= MAX_BOOST):  # NaN fails too
            raise CallError.invalid(
                f"{field}.boost must be in (0, {MAX_BOOST:g}] nats; got {item.boost:g}"
            )
        out.append(f"{phrase}^{item.boost:g}")
    return tuple(out)


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
        status = status_pb2.Status(code=_RPC_CODE[exc.kind], message=exc.message, details=details)
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
