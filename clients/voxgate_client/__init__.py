"""voxgate_client: a typed asyncio (and a small blocking) Python client for the voxgate gateway.

Packaging: this package is the top-level ``voxgate_client`` of both the voxgate server
distribution and the separate ``voxgate-client`` distribution (``clients/voxgate-client/``),
which installs beside Pipecat (protobuf < 7) or LiveKit Agents without the server. So it imports its
siblings relatively, carries its own protobuf 5.29 stubs (``_proto``, loadable on protobuf 5.29
through 7.x) and binds the RPCs itself (``_stub``); the only other first-party code it uses is the
neutral :mod:`voxgate_client._common`, which the server shares: the bit-exact G.711 tables
(``pcm``) and the event-to-message mapping by field name (``messages``). Names not listed in
``__all__`` (the ``_private`` modules) may change without notice.

Example: the README's "From Python" block, which a test runs as written against a real server
(``tests/test_readme.py``): stream a WAV, ``flush()`` after the last audio so that an utterance
cut by the end of the clip still gets its final, answer each final with ``speak()``, and
``hangup()`` once every utterance is answered and every reply has finished.
"""

from __future__ import annotations

from ._audio import (
    AS_FAST_AS_ALLOWED,
    REALTIME,
    UNPACED,
    AudioSink,
    Pacing,
    ReplyRecorder,
    WireAudio,
    decode_pcm16,
    encode_pcm16,
    load_audio,
    read_wav,
    stream_audio,
    write_wav,
)
from ._bot import (
    BOT_SERVICE,
    BotFault,
    BotLink,
    BotPolicy,
    BotServer,
    LinkOutcome,
    ServedCall,
    TransferHook,
    serve_bot,
)
from ._client import (
    PACING_METADATA,
    TOKEN_ENV,
    Call,
    VoxgateClient,
    auth_metadata,
    open_channel,
    read_token,
    tls_credentials,
)
from ._config import (
    BargeInName,
    CallConfig,
    EchoHandlingName,
    EncodingName,
    TurnDetectionName,
    TurnOptions,
    VadOptions,
)
from ._contract import BotHandler, CallInfo, TransferError, TransferResult, VoiceCall
from ._errors import CallEndedError, VoxgateError
from ._events import (
    Alternative,
    AudioOut,
    Dtmf,
    EndOfTurn,
    ErrorEvent,
    MarkReached,
    PlaybackFinished,
    PlaybackInterrupted,
    QualityChanged,
    ServerEvent,
    SessionStarted,
    SpeechBegin,
    SpeechEnd,
    SynthesisChunk,
    Transcript,
    Word,
    event_from_proto,
    event_to_proto,
)
from ._proto.voxgate_pb2 import ModelInfo, VoiceInfo
from ._stub import VoiceGatewayStub
from ._sync import VoxgateSyncClient

__all__ = [
    "AS_FAST_AS_ALLOWED",
    "BOT_SERVICE",
    "PACING_METADATA",
    "REALTIME",
    "TOKEN_ENV",
    "UNPACED",
    "Alternative",
    "AudioOut",
    "AudioSink",
    "BargeInName",
    "BotFault",
    "BotHandler",
    "BotLink",
    "BotPolicy",
    "BotServer",
    "Call",
    "CallConfig",
    "CallEndedError",
    "CallInfo",
    "Dtmf",
    "EchoHandlingName",
    "EncodingName",
    "EndOfTurn",
    "ErrorEvent",
    "LinkOutcome",
    "MarkReached",
    "ModelInfo",
    "Pacing",
    "PlaybackFinished",
    "QualityChanged",
    "PlaybackInterrupted",
    "ServedCall",
    "ReplyRecorder",
    "ServerEvent",
    "SessionStarted",
    "SpeechBegin",
    "SpeechEnd",
    "SynthesisChunk",
    "Transcript",
    "TransferError",
    "TransferHook",
    "TransferResult",
    "TurnDetectionName",
    "TurnOptions",
    "VadOptions",
    "VoiceInfo",
    "VoiceCall",
    "VoiceGatewayStub",
    "VoxgateClient",
    "VoxgateError",
    "VoxgateSyncClient",
    "WireAudio",
    "Word",
    "auth_metadata",
    "decode_pcm16",
    "encode_pcm16",
    "event_from_proto",
    "event_to_proto",
    "load_audio",
    "open_channel",
    "read_token",
    "read_wav",
    "sample_call_path",
    "serve_bot",
    "stream_audio",
    "tls_credentials",
    "write_wav",
]


def sample_call_path() -> str:
    """Path of the bundled sample caller recording (see ``data/ATTRIBUTION.md``)."""
    from importlib.resources import files  # noqa: PLC0415  (only needed here)

    return str(files(__name__) / "data" / "sample_call.wav")
