"""SDP offer/answer (RFC 3264 subset): pick PCMU or PCMA at 8 kHz and telephone-event."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "HANDLED_EVENTS",
    "MediaChoice",
    "SdpError",
    "SdpOffer",
    "build_answer",
    "event_list",
    "negotiate",
    "parse_events",
    "parse_sdp",
]

Direction = Literal["sendrecv", "sendonly", "recvonly", "inactive"]
_DIRECTIONS: tuple[Direction, ...] = ("sendrecv", "sendonly", "recvonly", "inactive")
_MIRROR: dict[Direction, Direction] = {
    "sendrecv": "sendrecv",
    "sendonly": "recvonly",
    "recvonly": "sendonly",
    "inactive": "inactive",
}
#: Static payload types (RFC 3551) the bridge accepts, by encoding name.
_STATIC = {0: ("PCMU", 8000), 8: ("PCMA", 8000), 18: ("G729", 8000), 3: ("GSM", 8000)}
#: The telephone-events the bridge decodes (RFC 4733 3.2: 0-9 * # A-D, see ``DtmfDecoder``).
HANDLED_EVENTS: frozenset[int] = frozenset(range(16))
#: RFC 4733 7.1.1: an offer without an ``events`` list (no fmtp line) supports 0-15.
_DEFAULT_EVENTS: frozenset[int] = frozenset(range(16))
#: The largest event code (RFC 4733: one octet).
_MAX_EVENT = 255


class SdpError(ValueError):
    """The body is not an SDP offer with an audio stream we can read."""


@dataclass(frozen=True, slots=True)
class SdpOffer:
    """The audio stream of a remote offer.

    Attributes:
        address: connection address (``c=``), media level beating session level.
        port: RTP port of the first ``m=audio`` line (0 = stream rejected).
        formats: payload types in the offerer's order of preference.
        rtpmap: payload type → (encoding name upper-cased, clock rate Hz).
        direction: the media direction attribute (default sendrecv).
        origin: the ``o=`` line's username, session id and version: an offer that repeats
            the previous one's origin describes unchanged media (RFC 3264 8), as a session
            refresh does.
        fmtp: payload type → its ``a=fmtp`` parameters, as written.
    """

    address: str
    port: int
    formats: tuple[int, ...]
    rtpmap: dict[int, tuple[str, int]] = field(default_factory=dict)
    direction: Direction = "sendrecv"
    origin: str = ""
    fmtp: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MediaChoice:
    """What the answer settles on.

    Attributes:
        payload_type: the audio payload type (0 PCMU, 8 PCMA, or the offer's dynamic number).
        encoding: ``"PCMU"`` or ``"PCMA"``.
        dtmf_payload_type: telephone-event/8000 payload type when offered with at least one
            event the bridge handles, else None.
        remote: where to send RTP (the offer's c=/m= address).
        direction: our answer's direction (the offer's mirrored).
        dtmf_events: the events the answer accepts: those offered that the bridge handles
            (empty without telephone-event).
    """

    payload_type: int
    encoding: Literal["PCMU", "PCMA"]
    dtmf_payload_type: int | None
    remote: tuple[str, int]
    direction: Direction = "sendrecv"
    dtmf_events: frozenset[int] = frozenset()

    @property
    def we_send(self) -> bool:
        """False while the caller holds the call (our answer is recvonly/inactive)."""
        return self.direction in ("sendrecv", "sendonly") and self.remote[0] != "0.0.0.0"


def parse_sdp(body: bytes) -> SdpOffer:
    """Read the first audio stream of an SDP body; raises :class:`SdpError`."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise SdpError("SDP is not UTF-8") from None
    session_addr: str | None = None
    media_addr: str | None = None
    port: int | None = None
    formats: tuple[int, ...] = ()
    rtpmap: dict[int, tuple[str, int]] = {}
    fmtp: dict[int, str] = {}
    session_dir: Direction = "sendrecv"
    media_dir: Direction | None = None
    in_audio = False
    seen_audio = False
    origin = ""
    for raw in text.splitlines():
        line = raw.strip()
        if len(line) < 2 or line[1] != "=":
            continue
        kind, value = line[0], line[2:].strip()
        if kind == "o" and not origin:
            origin = " ".join(value.split()[:3])[:200]
        elif kind == "m":
            parts = value.split()
            in_audio = not seen_audio and len(parts) >= 4 and parts[0] == "audio"
            if in_audio:
                seen_audio = True
                port_s = parts[1].split("/")[0]
                if not port_s.isdigit() or int(port_s) > 65535:
                    raise SdpError(f"bad m= port in {line[:60]!r}")
                port = int(port_s)
                if "RTP/AVP" not in parts[2].upper():
                    raise SdpError(f"unsupported transport {parts[2][:20]!r}")
                formats = tuple(int(f) for f in parts[3:] if f.isdigit() and int(f) < 128)
        elif kind == "c":
            parts = value.split()
            if len(parts) < 3 or parts[0] != "IN" or parts[1] not in ("IP4", "IP6"):
                raise SdpError(f"bad c= line {line[:60]!r}")
            addr = parts[2].split("/")[0]
            if in_audio:
                media_addr = addr
            elif not seen_audio:
                session_addr = addr
        elif kind == "a":
            name, _, arg = value.partition(":")
            if name in _DIRECTIONS:
                if in_audio:
                    media_dir = name
                elif not seen_audio:
                    session_dir = name
            elif name == "rtpmap" and in_audio:
                pt_s, _, enc = arg.partition(" ")
                enc_name, _, rest = enc.partition("/")
                rate_s = rest.split("/")[0]
                if pt_s.isdigit() and rate_s.isdigit():
                    rtpmap[int(pt_s)] = (enc_name.strip().upper(), int(rate_s))
            elif name == "fmtp" and in_audio:
                pt_s, _, params = arg.partition(" ")
                if pt_s.isdigit():
                    fmtp[int(pt_s)] = params.strip()[:200]
    if port is None:
        raise SdpError("no m=audio line")
    address = media_addr or session_addr
    if address is None:
        raise SdpError("no c= connection address")
    return SdpOffer(address, port, formats, rtpmap, media_dir or session_dir, origin, fmtp)


def parse_events(params: str | None) -> frozenset[int]:
    """The event codes of a telephone-event ``a=fmtp`` value (``0-15``, ``0-11,16``).

    None (no fmtp line) means the RFC 4733 default, 0-15. Parts that are not a code or a range
    of codes (0-255) are skipped, as a receiver ignores what it does not understand.
    """
    if params is None:
        return _DEFAULT_EVENTS
    events: set[int] = set()
    for part in params.replace(" ", "").split(","):
        lo_s, dash, hi_s = part.partition("-")
        if not lo_s.isdigit() or (dash and not hi_s.isdigit()):
            continue
        lo, hi = int(lo_s), int(hi_s) if dash else int(lo_s)
        if lo <= hi <= _MAX_EVENT:
            events.update(range(lo, hi + 1))
    return frozenset(events)


def event_list(events: frozenset[int]) -> str:
    """Event codes as an ``a=fmtp`` value: ascending, runs as ranges (``0-11,14``)."""
    parts: list[str] = []
    for code in sorted(events):
        if parts and code - 1 in events:
            lo = parts[-1].split("-")[0]
            parts[-1] = f"{lo}-{code}"
        else:
            parts.append(str(code))
    return ",".join(parts)


def negotiate(offer: SdpOffer, *, prefer: str | None = None) -> MediaChoice | None:
    """PCMU or PCMA at 8 kHz, in the offerer's order; None when neither is offered (→ 488).

    Args:
        offer: the remote offer.
        prefer: an encoding to keep when offered (a re-INVITE must not switch codecs: the
            gateway stream's format is fixed for the call).
    """
    if offer.port == 0:
        return None
    audio: tuple[int, Literal["PCMU", "PCMA"]] | None = None
    dtmf: int | None = None
    events: frozenset[int] = frozenset()
    for pt in offer.formats:
        name, rate = offer.rtpmap.get(pt) or _STATIC.get(pt, ("", 0))
        if rate == 8000 and name in ("PCMU", "PCMA"):
            if audio is None or (name == prefer and audio[1] != prefer):
                audio = (pt, "PCMU" if name == "PCMU" else "PCMA")
        elif dtmf is None and name == "TELEPHONE-EVENT" and rate == 8000:
            # Only events both sides know: a telephone-event with none of ours is left out.
            events = parse_events(offer.fmtp.get(pt)) & HANDLED_EVENTS
            dtmf = pt if events else None
    if prefer is not None and (audio is None or audio[1] != prefer):
        return None
    if audio is None:
        return None
    remote = (offer.address, offer.port)
    return MediaChoice(audio[0], audio[1], dtmf, remote, _MIRROR[offer.direction], events)


def build_answer(
    choice: MediaChoice, local_ip: str, local_port: int, *, session_id: int, version: int
) -> bytes:
    """The SDP answer: one audio stream, ptime 20, the chosen codec and telephone-event.

    telephone-event is answered with the events the offer and the bridge share
    (``choice.dtmf_events``), never more than was offered.
    """
    pts = [str(choice.payload_type)]
    if choice.dtmf_payload_type is not None:
        pts.append(str(choice.dtmf_payload_type))
    lines = [
        "v=0",
        f"o=voxgate {session_id} {version} IN IP4 {local_ip}",
        "s=voxgate",
        f"c=IN IP4 {local_ip}",
        "t=0 0",
        f"m=audio {local_port} RTP/AVP {' '.join(pts)}",
        f"a=rtpmap:{choice.payload_type} {choice.encoding}/8000",
    ]
    if choice.dtmf_payload_type is not None:
        lines += [
            f"a=rtpmap:{choice.dtmf_payload_type} telephone-event/8000",
            f"a=fmtp:{choice.dtmf_payload_type} {event_list(choice.dtmf_events)}",
        ]
    lines += ["a=ptime:20", f"a={choice.direction}"]
    return ("\r\n".join(lines) + "\r\n").encode()
