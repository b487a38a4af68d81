"""The servicer's requests and responses: protobuf in, the session's dataclasses out, and back.

Half of the servicer (with :mod:`.service`, which keeps the RPCs, the call's life and the
gRPC statuses): every ``SessionConfig``, ``ConverseRequest`` and ``Speak`` is validated here
against what this server runs (its configuration, models and voices), each refusal an
``INVALID_ARGUMENT`` that names the field, and every outbound event becomes its
``ConverseResponse``. It reads the server through :class:`Served` on each request, not a copy
taken at start, because the servicer's recogniser and configuration are its own to swap.
"""

from __future__ import annotations

import uuid
from typing import Literal, Protocol

from google.rpc import code_pb2

from voxgate.common.messages import fill
from voxgate.common.pcm import SUPPORTED_RATES_HZ, WireEncoding
from voxgate.engines.asr import MAX_BOOST
from voxgate.engines.asr.base import AsrOptions
from voxgate.gateway.barge_in import BargeInMode, BargeInModel, BargeInPolicy
from voxgate.gateway.base import EngineInfo, Synthesizer, Transcriber
from voxgate.gateway.call.options import (
    BargeInOptions,
    CallConfig,
    IngressOptions,
    InterimOptions,
    PlaybackOptions,
    RecognitionOptions,
)
from voxgate.gateway.config import (
    EchoCancellerName,
    GatewayConfig,
    TurnsConfig,
    VadConfig,
)
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
from voxgate.gateway.models import ModelLease, ModelRegistry
from voxgate.gateway.turns import TurnMode, TurnOptions
from voxgate.v1 import voxgate_pb2 as pb

_ENCODINGS: dict[int, WireEncoding] = {
    int(pb.LINEAR16): WireEncoding.LINEAR16,
    int(pb.MULAW): WireEncoding.MULAW,
    int(pb.ALAW): WireEncoding.ALAW,
}

__all__ = [
    "PB_TURN_MODE",
    "RPC_CODE",
    "Served",
    "call_config",
    "effective_config",
    "encoding",
    "inbound",
    "model_name",
    "outbound",
    "rate",
    "speak_in",
]


#: google.rpc codes of the error kinds: an ErrorEvent's ``code`` and a rich status's.
RPC_CODE: dict[ErrorKind, int] = {
    ErrorKind.INVALID_ARGUMENT: code_pb2.INVALID_ARGUMENT,
    ErrorKind.RESOURCE_EXHAUSTED: code_pb2.RESOURCE_EXHAUSTED,
    ErrorKind.FAILED_PRECONDITION: code_pb2.FAILED_PRECONDITION,
    ErrorKind.UNIMPLEMENTED: code_pb2.UNIMPLEMENTED,
    ErrorKind.UNAVAILABLE: code_pb2.UNAVAILABLE,
    ErrorKind.INTERNAL: code_pb2.INTERNAL,
    ErrorKind.NOT_FOUND: code_pb2.NOT_FOUND,
    ErrorKind.DEADLINE_EXCEEDED: code_pb2.DEADLINE_EXCEEDED,
}


class Served(Protocol):
    """What a request is checked against: the servicer's configuration, models and voices."""

    config: GatewayConfig
    info: EngineInfo
    models: ModelRegistry | None
    transcriber: Transcriber | None
    synthesizer: Synthesizer | None


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


PB_TURN_MODE = {mode: value for value, mode in _TURN_MODES.items()}


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
        words=defaults.words,
        whole_text=defaults.whole_text,
    )


def _no_turns(req: pb.TurnDetectionOptions) -> TurnOptions:
    """Turn detection on a server without a recogniser: refused when asked for, else off.

    A turn ends after its finals and is decided on its words, so a server that transcribes
    nothing has no turns to end (its ``ListModels`` lists no modes). A call that asked for
    them was accepted and then never got an EndOfTurn; it is refused now, naming the field,
    as Speak is on a server without a voice. The server's own default (``session.turns``)
    does not apply there: such a call runs with turns off and its effective config says so.
    """
    if req.mode == pb.TURN_DETECTION_UNSPECIFIED:
        return TurnOptions()
    raise CallError(
        ErrorKind.FAILED_PRECONDITION,
        f"config.turn_detection.mode={pb.TurnDetection.Name(req.mode)} needs a recogniser; "
        "this server runs without one (engines setting excludes 'asr'), so it has no turns "
        "to end (ListModels' turn_detection.modes is empty); use TURN_DETECTION_OFF or "
        "leave it unset",
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


def call_config(
    served: Served,
    cfg: pb.SessionConfig,
    mode: Literal["converse", "recognize"],
    lease: ModelLease | None = None,
) -> CallConfig:
    """A call's settings from its ``SessionConfig``, checked against what this server runs.

    Raises:
        CallError: INVALID_ARGUMENT naming the first field out of bounds or not served.
    """
    in_enc = encoding(cfg.input_audio.encoding, "config.input_audio.encoding")
    in_rate = rate(cfg.input_audio.sample_rate_hertz, "config.input_audio.sample_rate_hertz")
    if cfg.output_audio.encoding == pb.ENCODING_UNSPECIFIED:
        out_enc = in_enc
    else:
        out_enc = encoding(cfg.output_audio.encoding, "config.output_audio.encoding")
    out_rate = (
        rate(cfg.output_audio.sample_rate_hertz, "config.output_audio.sample_rate_hertz")
        if cfg.output_audio.sample_rate_hertz
        else in_rate
    )
    vad = _vad_config(served.config.vad, cfg.vad)
    turns = _turn_options(cfg.turn_detection, served.config.session.turns, vad)
    if turns.on and served.transcriber is None:
        turns = _no_turns(cfg.turn_detection)
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
    limits = served.config.limits
    if len(cfg.call_id) > limits.max_id_chars:
        raise CallError.invalid(
            f"config.call_id has {len(cfg.call_id)} characters, over "
            f"max_id_chars={limits.max_id_chars}"
        )
    language = _language(served, cfg.language, lease)
    if lease is None:
        _model(served, cfg.model)
    hotwords, context_tokens = _context_tokens(served, dec, lease)
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
    if cfg.voice and served.info.voices and cfg.voice not in {v.name for v in served.info.voices}:
        raise CallError.invalid(
            f"config.voice={echo(cfg.voice)} is not loaded; ListVoices has "
            f"{', '.join(v.name for v in served.info.voices)}"
        )
    session = served.config.session
    return CallConfig(
        ingress=IngressOptions(
            encoding=in_enc,
            rate_hz=in_rate,
            dtmf=served.config.dtmf if served.config.dtmf.inband else None,
            echo_guard=session.barge_in.echo_guard and not cfg.barge_in.echo_guard_disabled,
            echo_canceller=_echo_handling(
                cfg.barge_in.echo_handling, session.barge_in.echo_canceller
            ),
        ),
        playback=PlaybackOptions(
            encoding=out_enc,
            rate_hz=out_rate,
            lead_ms=session.playout_lead_ms,
            prebuffer_ms=session.playout_prebuffer_ms,
        ),
        vad=vad,
        mode=mode,
        recognition=RecognitionOptions(
            asr_options=asr_options,
            speculative_finals=session.speculative_finals,
            language=session.language,
            turns=turns,
        ),
        interims=InterimOptions(
            results=cfg.interim_results,
            interval_ms=cfg.interim_interval_ms or session.interim_interval_ms,
            barge_in_interval_ms=session.barge_in.interim_interval_ms,
            barge_in_overlap_ms=session.barge_in.overlap_interim_ms,
            barge_in_urgent=session.barge_in.urgent_interims,
        ),
        barge_in=BargeInOptions(
            enabled=not cfg.barge_in.disabled,
            min_speech_ms=cfg.barge_in.min_speech_ms,
            policy=_barge_in_policy(served, cfg.barge_in),
            first_interim_speech_ms=session.barge_in.first_interim_speech_ms,
            model=_barge_in_model(served),
            reply_language=_reply_language(served, cfg.voice),
        ),
    )


def _reply_language(served: Served, voice: str) -> str | None:
    """The call's voice's language as Whisper names it (``en_US`` -> ``en``), if known."""
    voices = served.info.voices
    chosen = next((v for v in voices if v.name == voice), voices[0] if voices else None)
    if chosen is None or not chosen.language:
        return None
    return chosen.language.replace("-", "_").split("_")[0].lower() or None


def _barge_in_model(served: Served) -> BargeInModel | None:
    """The model for interims only ``after_words`` reads (``asr.barge_in_model``), if on."""
    model = served.models.barge_in if served.models is not None else None
    if model is None or not served.config.session.barge_in.barge_in_model:
        return None
    return BargeInModel(model.key, tuple(model.description.languages))


def _barge_in_policy(served: Served, req: pb.BargeInConfig) -> BargeInPolicy:
    """The call's barge-in policy: the server's defaults, as ``config.barge_in`` sets it."""
    defaults = served.config.session.barge_in
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


def _language(served: Served, requested: str, lease: ModelLease | None = None) -> str | None:
    """``config.language`` as a Whisper code ("en-US" -> "en"); None detects per utterance."""
    language = requested.split("-", maxsplit=1)[0].lower() or None
    model = lease.description if lease is not None else None
    if model is None and served.info.models:
        model = served.info.models[0]
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


def model_name(served: Served, lease: ModelLease | None) -> str:
    """What SessionStarted.model says: the call's model, else the default."""
    if lease is not None:
        return lease.description.name
    return served.info.models[0].name if served.info.models else ""


def _model(served: Served, requested: str) -> None:
    """Refuse a ``config.model`` that is not loaded (it used to be ignored silently)."""
    if not requested:
        return
    names = [m.name for m in served.info.models]
    if requested not in names:
        have = f"ListModels has {', '.join(names)}" if names else "none is loaded"
        raise CallError.invalid(f"config.model={echo(requested)} is not loaded; {have}")


def _context_tokens(
    served: Served, dec: pb.DecodingOptions, lease: ModelLease | None = None
) -> tuple[tuple[str, ...], tuple[int, ...] | None]:
    """Bound the call's prompt and hotwords, then tokenise them once for the whole call.

    Returns the hotwords (its ``boosted_phrases`` among them, see :func:`_hotwords`) and
    their tokens with the prompt's (None without a recogniser).
    """
    limits = served.config.limits
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
    if served.transcriber is None:
        return hotwords, None
    if lease is not None and lease.key:  # a named model: its own tokenizer
        tokens = lease.encode_context(dec.initial_prompt, hotwords)
    else:
        tokens = served.transcriber.encode_context(dec.initial_prompt, hotwords)
    if len(tokens) > limits.max_prompt_tokens:
        raise CallError.invalid(
            f"config.decoding.initial_prompt and hotwords make {len(tokens)} Whisper tokens, "
            f"over max_prompt_tokens={limits.max_prompt_tokens}; shorten them"
        )
    return hotwords, tokens


def _id(served: Served, value: str, name: str) -> str:
    if len(value) > served.config.limits.max_id_chars:
        raise CallError.invalid(
            f"{name} has {len(value)} characters, over "
            f"max_id_chars={served.config.limits.max_id_chars}"
        )
    return value


def inbound(served: Served, msg: pb.ConverseRequest) -> InboundEvent:
    """One ``ConverseRequest`` after the first as the session's inbound event.

    A bad ``Speak`` becomes a :class:`RejectedSpeakIn` (an ErrorEvent on a call that goes on);
    any other bad request raises :class:`CallError` and ends the call.
    """
    kind = msg.WhichOneof("event")
    if kind == "audio":
        return AudioIn(msg.audio.data)
    if kind == "speak":
        # A bad Speak must not hang up on the caller: it becomes an ErrorEvent on the call.
        try:
            return speak_in(served, msg.speak)
        except CallError as exc:
            speak_id = msg.speak.speak_id
            if len(speak_id) > served.config.limits.max_id_chars:
                speak_id = ""  # never echo an unbounded id back on every event
            return RejectedSpeakIn(speak_id, exc)
    if kind == "clear":
        return ClearIn()
    if kind == "mark":
        if not msg.mark.name:
            raise CallError.invalid("mark.name is empty; name the mark to be told about it")
        return MarkIn(_id(served, msg.mark.name, "mark.name"))
    if kind == "hangup":
        return HangupIn()
    if kind == "flush":
        return FlushIn()
    if kind == "dtmf":
        if len(msg.dtmf.digit) != 1 or msg.dtmf.digit not in _DTMF_DIGITS:
            raise CallError.invalid(f"dtmf.digit={echo(msg.dtmf.digit)} is not one of 0-9 * # A-D")
        if not 0 <= msg.dtmf.duration_ms <= _MAX_DTMF_MS:
            raise CallError.invalid(
                f"dtmf.duration_ms={msg.dtmf.duration_ms} is outside 0..{_MAX_DTMF_MS}"
            )
        return DtmfIn(msg.dtmf.digit, msg.dtmf.duration_ms)
    if kind == "config":
        raise CallError.invalid("a second `config` arrived; config is only valid first")
    raise CallError.invalid("a ConverseRequest with no event set arrived")


def speak_in(served: Served, sp: pb.Speak) -> SpeakIn:
    """A ``Speak`` checked against the voice's limits, as the session's :class:`SpeakIn`."""
    # The one text limit is the voice's own (tts.max_chars), checked here on arrival so
    # that a queued Speak is never refused only when its turn comes.
    max_chars = served.synthesizer.max_text_chars if served.synthesizer is not None else 0
    if not sp.text.strip():
        raise CallError.invalid("speak.text is empty")
    if max_chars and len(sp.text) > max_chars:
        raise CallError.invalid(
            f"speak.text has {len(sp.text)} characters, over tts.max_chars={max_chars}; "
            "split it into several Speak requests"
        )
    _id(served, sp.speak_id, "speak.speak_id")
    rate = sp.rate or 1.0
    if not 0.5 <= rate <= 2.0:
        raise CallError.invalid(f"speak.rate={sp.rate:g} is outside 0.5..2.0")
    if sp.voice and served.info.voices and sp.voice not in {v.name for v in served.info.voices}:
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


def encoding(value: int, field: str) -> WireEncoding:
    """A wire encoding the gateway speaks, or INVALID_ARGUMENT naming ``field``."""
    enc = _ENCODINGS.get(value)
    if enc is None:
        name: str = pb.Encoding.Name(value) if value in pb.Encoding.values() else str(value)
        raise CallError.invalid(f"{field}={name} is not supported; use LINEAR16, MULAW or ALAW")
    return enc


def rate(value: int, field: str) -> int:
    """A sample rate the gateway speaks, or INVALID_ARGUMENT naming ``field``."""
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


def effective_config(
    req: pb.SessionConfig, cfg: CallConfig, audio_model: str = ""
) -> pb.SessionConfig:
    """What ``SessionStarted.effective_config`` says: the request with every default filled in."""
    eff = pb.SessionConfig()
    eff.CopyFrom(req)
    eff.input_audio.encoding = _PB_ENCODING[cfg.ingress.encoding]
    eff.input_audio.sample_rate_hertz = cfg.ingress.rate_hz
    eff.output_audio.encoding = _PB_ENCODING[cfg.playback.encoding]
    eff.output_audio.sample_rate_hertz = cfg.playback.rate_hz
    fill(eff.vad, cfg.vad)  # VadConfig names the contract's fields (and has more)
    eff.interim_interval_ms = cfg.interims.interval_ms
    policy = cfg.barge_in.policy
    eff.barge_in.policy = _PB_BARGE_IN[policy.mode if cfg.barge_in.enabled else "never"]
    eff.barge_in.min_words = policy.min_words
    eff.barge_in.backchannels[:] = list(policy.backchannels)
    eff.barge_in.echo_guard_disabled = not cfg.ingress.echo_guard
    eff.barge_in.echo_handling = _PB_ECHO_HANDLING[cfg.ingress.echo_canceller]
    t = cfg.recognition.turns
    if t.on or req.HasField("turn_detection"):
        eff.turn_detection.mode = PB_TURN_MODE[t.mode]
        eff.turn_detection.eagerness = t.eagerness
        eff.turn_detection.end_silence_ms = (
            t.min_silence_ms if t.mode == "smart" else t.end_silence_ms
        )
        eff.turn_detection.max_pause_ms = t.max_pause_ms
        eff.turn_detection.audio_model = audio_model
    return eff


#: The outbound events whose message is their own attributes under the contract's field
#: names, and the ``ConverseResponse`` case each one fills (:func:`voxgate.common.messages.fill`).
_PLAIN_CASES: dict[type[OutboundEvent], str] = {
    AudioOutEvent: "audio",
    MarkReachedOut: "mark",
    InterruptedOut: "interrupted",
    PlaybackFinishedOut: "playback_finished",
    QualityOut: "quality_changed",
    EndOfTurnOut: "end_of_turn",
    DtmfOut: "dtmf",
}


def outbound(event: OutboundEvent) -> pb.ConverseResponse:
    """One outbound session event as the ``ConverseResponse`` the client reads.

    Events named in ``_PLAIN_CASES`` are copied by field name; a speech event's begin/end
    becomes its type, an error's kind its google.rpc code, and a transcript's recogniser
    result (word times relative to the utterance) the message's words in call time.
    """
    response = pb.ConverseResponse()
    case = _PLAIN_CASES.get(type(event))
    if case is not None:
        fill(getattr(response, case), event)
    elif isinstance(event, SpeechOut):
        t = pb.SpeechEvent.SPEECH_BEGIN if event.begin else pb.SpeechEvent.SPEECH_END
        fill(response.speech, event, type=t)
    elif isinstance(event, ErrorOut):
        fill(response.error, event, code=RPC_CODE[event.kind])
    elif isinstance(event, TranscriptOut):
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
    else:
        raise TypeError(f"unknown outbound event {event!r}")
    return response


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
