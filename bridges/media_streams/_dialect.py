"""The media-streams wire format: parse what a provider sends, build what it accepts.

Pure functions over JSON text; no sockets. Two dialects share one shape and differ in names:

========================  ===========================  ==================================
what                      Twilio (``twilio``)           Telnyx (``telnyx``)
========================  ===========================  ==================================
message counter           ``sequenceNumber`` (string)  ``sequence_number`` (string)
stream id                 ``streamSid``                ``stream_id``
call id                   ``start.callSid``            ``start.call_control_id``
custom parameters         ``start.customParameters``   ``start.custom_parameters``
from / to                 (not sent: TwiML parameters) ``start.from``, ``start.to``
media format              ``start.mediaFormat``         ``start.media_format``
                          ``{encoding: audio/x-mulaw,  ``{encoding: PCMU | PCMA,
                          sampleRate, channels}``      sample_rate, channels}``
``connected``             ``protocol``, ``version``    ``version`` only
provider errors           (none on the socket)         ``error`` frame ``{payload: {code,
                                                       title, detail}}``
outbound messages         carry ``streamSid``          carry no stream id
========================  ===========================  ==================================

Both send ``media`` as ``{track, chunk, timestamp, payload}`` (chunk and timestamp are decimal
strings; timestamp in ms since the stream started; payload base64 of headerless 8 kHz G.711),
``dtmf`` as ``{digit}`` (Twilio adds ``track``), ``mark`` as ``{name}`` and ``stop``. A message
that breaks the schema raises :class:`ProtocolError`, which carries the WebSocket close code the
adapter ends that one stream with.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "CLOSE_INVALID",
    "CLOSE_POLICY",
    "CLOSE_UNSUPPORTED",
    "DIALECTS",
    "Connected",
    "DialectName",
    "Dtmf",
    "Mark",
    "Media",
    "ProtocolError",
    "ProviderError",
    "Start",
    "Stop",
    "Unknown",
    "build_clear",
    "build_mark",
    "build_media",
    "echo",
    "parse",
]

DialectName = Literal["twilio", "telnyx"]
DIALECTS: tuple[DialectName, ...] = ("twilio", "telnyx")

#: RFC 6455 close codes the adapter uses for a stream's own faults.
CLOSE_UNSUPPORTED = 1003  # binary frame, or a media format the gateway cannot take
CLOSE_INVALID = 1007  # not JSON, or a field of the wrong type
CLOSE_POLICY = 1008  # valid JSON in the wrong place: media before start, wrong stream id

#: Provider-supplied values quoted in log lines and close reasons are cut to this length.
ECHO_MAX_CHARS = 48

_DIGITS = frozenset("0123456789*#ABCD")


def echo(value: object, limit: int = ECHO_MAX_CHARS) -> str:
    """Quote a provider-supplied value in a log line or close reason, bounded and repr'd.

    A close reason must fit a control frame (123 bytes), and a log line must stay one line.
    """
    text = str(value)
    if len(text) <= limit:
        return repr(text)
    return repr(text[:limit]) + f"… ({len(text)} chars)"


class ProtocolError(Exception):
    """A provider message that breaks the schema; ends this stream with ``close_code``."""

    def __init__(self, close_code: int, reason: str) -> None:
        super().__init__(reason)
        self.close_code = close_code
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Connected:
    """The first message: the provider says which protocol follows."""

    protocol: str
    version: str


@dataclass(frozen=True, slots=True)
class Start:
    """Stream metadata, sent once before any media.

    Attributes:
        encoding: ``"mulaw"`` or ``"alaw"`` (the gateway's names), from the media format.
        parameters: the custom parameters the call's provider config set (strings only).
        provider: other start fields worth passing to the bot (account id, tags, ...).
    """

    sequence: int | None
    stream_id: str
    call_id: str
    encoding: Literal["mulaw", "alaw"]
    sample_rate_hz: int
    channels: int
    tracks: tuple[str, ...]
    from_: str = ""
    to: str = ""
    parameters: dict[str, str] = field(default_factory=dict)
    provider: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Media:
    """One chunk of call audio (headerless G.711 at 8 kHz)."""

    sequence: int | None
    stream_id: str | None
    track: str
    chunk: int
    timestamp_ms: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class Dtmf:
    """A keypad digit the provider detected."""

    sequence: int | None
    stream_id: str | None
    digit: str


@dataclass(frozen=True, slots=True)
class Mark:
    """The provider played (or cleared) everything queued before a mark we sent."""

    sequence: int | None
    stream_id: str | None
    name: str


@dataclass(frozen=True, slots=True)
class Stop:
    """The provider ends the stream (the call hung up, or the stream was stopped)."""

    sequence: int | None
    stream_id: str | None


@dataclass(frozen=True, slots=True)
class ProviderError:
    """Telnyx's ``error`` frame: something went wrong on the provider's side of the stream."""

    sequence: int | None
    stream_id: str | None
    code: str
    title: str


@dataclass(frozen=True, slots=True)
class Unknown:
    """An event this adapter does not know (ignored: providers add events over time)."""

    sequence: int | None
    stream_id: str | None
    event: str


Inbound = Connected | Start | Media | Dtmf | Mark | Stop | ProviderError | Unknown


@dataclass(frozen=True, slots=True)
class _Names:
    seq: str
    stream: str
    call: str
    params: str
    fmt: str
    rate: str


_NAMES: dict[str, _Names] = {
    "twilio": _Names(
        "sequenceNumber", "streamSid", "callSid", "customParameters", "mediaFormat", "sampleRate"
    ),
    "telnyx": _Names(
        "sequence_number",
        "stream_id",
        "call_control_id",
        "custom_parameters",
        "media_format",
        "sample_rate",
    ),
}

_ENCODINGS: dict[str, dict[str, Literal["mulaw", "alaw"]]] = {
    "twilio": {"audio/x-mulaw": "mulaw"},
    "telnyx": {"PCMU": "mulaw", "PCMA": "alaw"},
}


def _obj(msg: dict[str, Any], key: str, event: str) -> dict[str, Any]:
    value = msg.get(key)
    if not isinstance(value, dict):
        raise ProtocolError(CLOSE_INVALID, f"{event}: `{key}` must be an object")
    return value


def _text(obj: dict[str, Any], key: str, where: str, *, required: bool = True) -> str:
    value = obj.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        raise ProtocolError(CLOSE_INVALID, f"{where}: `{key}` must be a string")
    return value


def _count(obj: dict[str, Any], key: str, where: str, *, required: bool = True) -> int | None:
    """A decimal counter; the providers send strings ("12"), a few clones numbers."""
    value = obj.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ProtocolError(CLOSE_INVALID, f"{where}: `{key}` must be a decimal string")
    if isinstance(value, str) and not (value.isascii() and value.isdigit() and len(value) <= 18):
        raise ProtocolError(
            CLOSE_INVALID, f"{where}: `{key}` must be a decimal string, got {echo(value, 20)}"
        )
    number = int(value)
    if number < 0:
        raise ProtocolError(CLOSE_INVALID, f"{where}: `{key}` must not be negative")
    return number


def parse(text: str | bytes, dialect: DialectName) -> Inbound:
    """Parse one provider message.

    Raises:
        ProtocolError: a binary frame, text that is not a JSON object, or a known event whose
            fields do not follow the schema (the reason names the event and the field).
    """
    if isinstance(text, bytes):
        raise ProtocolError(CLOSE_UNSUPPORTED, "binary frames are not part of the protocol")
    try:
        msg = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise ProtocolError(CLOSE_INVALID, "message is not JSON") from None
    if not isinstance(msg, dict):
        raise ProtocolError(CLOSE_INVALID, "message is not a JSON object")
    names = _NAMES[dialect]
    event = msg.get("event")
    if not isinstance(event, str):
        raise ProtocolError(CLOSE_INVALID, "message has no `event` string")
    if event == "connected":
        return Connected(
            _text(msg, "protocol", "connected", required=False),
            _text(msg, "version", "connected", required=False),
        )
    seq = _count(msg, names.seq, event, required=False)
    stream = msg.get(names.stream)
    if stream is not None and not isinstance(stream, str):
        raise ProtocolError(CLOSE_INVALID, f"{event}: `{names.stream}` must be a string")
    if event == "start":
        return _parse_start(msg, dialect, seq, stream)
    if event == "media":
        media = _obj(msg, "media", event)
        payload_text = _text(media, "payload", "media")
        try:
            payload = base64.b64decode(payload_text, validate=True)
        except (binascii.Error, ValueError):
            raise ProtocolError(CLOSE_INVALID, "media: `payload` is not base64") from None
        chunk = _count(media, "chunk", "media", required=False)
        stamp = _count(media, "timestamp", "media", required=False)
        return Media(
            seq,
            stream,
            _text(media, "track", "media", required=False) or "inbound",
            chunk if chunk is not None else -1,
            stamp if stamp is not None else -1,
            payload,
        )
    if event == "dtmf":
        digit = _text(_obj(msg, "dtmf", event), "digit", "dtmf")
        if len(digit) != 1 or digit.upper() not in _DIGITS:
            raise ProtocolError(
                CLOSE_INVALID, f"dtmf: `digit` must be one of 0-9 * # A-D, got {echo(digit, 8)}"
            )
        return Dtmf(seq, stream, digit.upper())
    if event == "mark":
        return Mark(seq, stream, _text(_obj(msg, "mark", event), "name", "mark"))
    if event == "stop":
        return Stop(seq, stream)
    if event == "error" and dialect == "telnyx":
        details = msg.get("payload")
        info: dict[str, Any] = details if isinstance(details, dict) else {}
        return ProviderError(seq, stream, str(info.get("code", "")), str(info.get("title", "")))
    return Unknown(seq, stream, event)


def _parse_start(
    msg: dict[str, Any], dialect: DialectName, seq: int | None, stream: str | None
) -> Start:
    names = _NAMES[dialect]
    start = _obj(msg, "start", "start")
    # Twilio repeats the stream id inside `start`; Telnyx has it only at the top level.
    inner = start.get(names.stream)
    if inner is not None and not isinstance(inner, str):
        raise ProtocolError(CLOSE_INVALID, f"start: `start.{names.stream}` must be a string")
    if stream and inner and stream != inner:
        raise ProtocolError(CLOSE_POLICY, "start: the stream ids at the top and in `start` differ")
    stream_id = stream or inner
    if not stream_id:
        raise ProtocolError(CLOSE_INVALID, f"start: no `{names.stream}`")
    fmt = _obj(start, names.fmt, "start")
    encoding_name = _text(fmt, "encoding", f"start.{names.fmt}")
    encoding = _ENCODINGS[dialect].get(encoding_name)
    rate = _count(fmt, names.rate, f"start.{names.fmt}")
    channels = _count(fmt, "channels", f"start.{names.fmt}", required=False)
    if encoding is None or rate != 8000 or (channels or 1) != 1:
        supported = " or ".join(_ENCODINGS[dialect])
        raise ProtocolError(
            CLOSE_UNSUPPORTED,
            f"start: media format {echo(encoding_name, 16)}/{rate}/{channels} not supported; "
            f"send {supported} at 8000 Hz, 1 channel",
        )
    raw_params = start.get(names.params) or {}
    if not isinstance(raw_params, dict):
        raise ProtocolError(CLOSE_INVALID, f"start: `{names.params}` must be an object")
    params = {str(k): str(v) for k, v in raw_params.items() if isinstance(v, str | int | float)}
    tracks_raw = start.get("tracks")
    tracks = (
        tuple(t for t in tracks_raw if isinstance(t, str))
        if isinstance(tracks_raw, list)
        else ("inbound",)
    )
    skip = {names.stream, names.call, names.params, names.fmt, "tracks", "from", "to"}
    provider = {
        k: v for k, v in start.items() if k not in skip and isinstance(v, str) and len(v) <= 256
    }
    return Start(
        seq,
        stream_id,
        _text(start, names.call, "start", required=False),
        encoding,
        8000,
        channels or 1,
        tracks,
        _text(start, "from", "start", required=False),
        _text(start, "to", "start", required=False),
        params,
        provider,
    )


def _envelope(dialect: DialectName, event: str, stream_id: str) -> dict[str, Any]:
    # Twilio routes what we send by streamSid; Telnyx's client frames carry no stream id.
    if dialect == "twilio":
        return {"event": event, "streamSid": stream_id}
    return {"event": event}


def build_media(dialect: DialectName, stream_id: str, payload: bytes) -> str:
    """An outbound ``media`` message: audio for the provider to play to the caller."""
    out = _envelope(dialect, "media", stream_id)
    out["media"] = {"payload": base64.b64encode(payload).decode("ascii")}
    return json.dumps(out, separators=(",", ":"))


def build_mark(dialect: DialectName, stream_id: str, name: str) -> str:
    """An outbound ``mark``: the provider sends it back once the audio before it was played."""
    out = _envelope(dialect, "mark", stream_id)
    out["mark"] = {"name": name}
    return json.dumps(out, separators=(",", ":"))


def build_clear(dialect: DialectName, stream_id: str) -> str:
    """An outbound ``clear``: drop the audio the provider still holds (barge-in)."""
    return json.dumps(_envelope(dialect, "clear", stream_id), separators=(",", ":"))
