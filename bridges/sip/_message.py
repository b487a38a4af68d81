"""SIP messages (RFC 3261 subset): parse a datagram, build responses and in-dialog requests.

The parser is strict about what a UAS needs to answer (start line, Via, From, To, Call-ID, CSeq,
Content-Length) and lenient about everything else: unknown headers are kept verbatim, compact
header names are expanded, folded lines are joined.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field

__all__ = [
    "BRANCH_COOKIE",
    "DEFAULT_INFO_DTMF_MS",
    "DTMF_INFO_TYPES",
    "MAX_DATAGRAM_BYTES",
    "MAX_ROUTE_ENTRIES",
    "MAX_URI_CHARS",
    "NextHop",
    "SipMessage",
    "SipParseError",
    "DtmfInfoError",
    "SipUri",
    "UriError",
    "Via",
    "add_tag",
    "canonical_name",
    "contact_uri",
    "header_tag",
    "header_uri",
    "make_response",
    "new_branch",
    "new_tag",
    "next_hop",
    "option_tags",
    "parse_dtmf_info",
    "parse_sip_uri",
    "parse_sipfrag",
    "record_route",
    "reply_address",
    "uri_param",
]

#: Larger datagrams are refused unread (a UDP SIP message must fit one datagram; 64 KiB max).
MAX_DATAGRAM_BYTES = 65_507

_COMPACT = {
    "v": "Via",
    "f": "From",
    "t": "To",
    "i": "Call-ID",
    "m": "Contact",
    "l": "Content-Length",
    "c": "Content-Type",
    "k": "Supported",
    "s": "Subject",
    "e": "Content-Encoding",
    "x": "Session-Expires",
    "r": "Refer-To",
    "b": "Referred-By",
    "o": "Event",
    "u": "Allow-Events",
}
_CANONICAL = {
    name.lower(): name
    for name in (
        "Via",
        "From",
        "To",
        "Call-ID",
        "CSeq",
        "Contact",
        "Content-Length",
        "Content-Type",
        "Max-Forwards",
        "Require",
        "Supported",
        "Allow",
        "Record-Route",
        "Route",
        "User-Agent",
        "Server",
        "Retry-After",
        "Warning",
        "Unsupported",
        "Accept",
        "Subject",
        "Content-Encoding",
        "Session-Expires",
        "Min-SE",
        "Refer-To",
        "Referred-By",
        "Event",
        "Allow-Events",
        "Subscription-State",
    )
}
_TOKEN = re.compile(r"^[A-Za-z0-9.!%*_+`'~-]+$")
_REQUIRED = ("Via", "From", "To", "Call-ID", "CSeq")
#: The magic cookie of an RFC 3261 branch (RFC 3261 8.1.1.7).
BRANCH_COOKIE = "z9hG4bK"


class SipParseError(ValueError):
    """A datagram is not a SIP message we can act on.

    Attributes:
        message: the partly parsed message when it has enough headers to be answered with 400;
            None when it must be dropped silently.
    """

    def __init__(self, reason: str, message: SipMessage | None = None) -> None:
        super().__init__(reason)
        self.message = message


def canonical_name(name: str) -> str:
    """Expand compact forms and normalise the case of known header names."""
    low = name.strip().lower()
    if low in _COMPACT:
        return _COMPACT[low]
    return _CANONICAL.get(low, name.strip())


def new_tag() -> str:
    """A random From/To tag (RFC 3261 19.3: at least 32 bits of randomness)."""
    return secrets.token_hex(6)


def new_branch() -> str:
    """A random RFC 3261 branch for a new client transaction."""
    return BRANCH_COOKIE + secrets.token_hex(8)


def _split_params(text: str) -> list[str]:
    """Split ``a;b=c;d`` on semicolons outside double quotes."""
    out: list[str] = []
    cur: list[str] = []
    quoted = False
    for ch in text:
        if ch == '"':
            quoted = not quoted
        if ch == ";" and not quoted:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def _split_commas(text: str) -> list[str]:
    """Split a multi-valued header (``Via: a, b``) on commas outside quotes and brackets."""
    out: list[str] = []
    cur: list[str] = []
    quoted, depth = False, 0
    for ch in text:
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch == "<":
            depth += 1
        elif not quoted and ch == ">":
            depth = max(0, depth - 1)
        if ch == "," and not quoted and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return [v for v in out if v]


def _addr_params(value: str) -> tuple[str, str]:
    """Split a name-addr/addr-spec header into (address part, ``;params`` part)."""
    gt = value.rfind(">")
    if "<" in value and gt != -1:
        return value[: gt + 1], value[gt + 1 :]
    semi = value.find(";")
    return (value, "") if semi == -1 else (value[:semi], value[semi:])


def header_tag(value: str) -> str | None:
    """The ``tag`` parameter of a From/To header value, or None."""
    _, params = _addr_params(value)
    for p in _split_params(params)[1:]:
        k, _, v = p.partition("=")
        if k.strip().lower() == "tag":
            return v.strip() or None
    return None


def add_tag(value: str, tag: str) -> str:
    """The From/To value with ``;tag=`` set (unchanged when it already has a tag)."""
    if header_tag(value) is not None:
        return value
    return f"{value};tag={tag}"


def header_uri(value: str) -> str:
    """The URI inside a From/To/Contact value (``"Bob" <sip:b@h>;tag=1`` → ``sip:b@h``)."""
    lt, gt = value.find("<"), value.find(">")
    if lt != -1 and gt > lt:
        return value[lt + 1 : gt].strip()
    return _addr_params(value)[0].strip()


@dataclass(slots=True)
class Via:
    """One Via entry: ``SIP/2.0/UDP host:port;branch=...;rport``."""

    transport: str
    host: str
    port: int | None
    params: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def parse(cls, value: str) -> Via:
        """Parse one Via value; raises :class:`SipParseError` when it is malformed."""
        parts = _split_params(value.strip())
        proto, _, sent_by = parts[0].strip().partition(" ")
        bits = [b.strip() for b in proto.split("/")]
        if len(bits) != 3 or bits[0].upper() != "SIP" or not sent_by.strip():
            raise SipParseError(f"malformed Via {value[:60]!r}")
        sent_by = sent_by.strip()
        port: int | None = None
        if sent_by.startswith("["):  # IPv6 reference
            end = sent_by.find("]")
            host, rest = sent_by[: end + 1], sent_by[end + 1 :]
            port_s = rest[1:] if rest.startswith(":") else ""
        else:
            host, _, port_s = sent_by.partition(":")
        if port_s:
            if not port_s.isdigit() or not 0 < int(port_s) < 65536:
                raise SipParseError(f"bad Via port in {value[:60]!r}")
            port = int(port_s)
        if not host:
            raise SipParseError(f"malformed Via {value[:60]!r}")
        params: dict[str, str | None] = {}
        for p in parts[1:]:
            k, eq, v = p.partition("=")
            if k.strip():
                params[k.strip().lower()] = v.strip() if eq else None
        return cls(bits[2].upper(), host, port, params)

    @property
    def branch(self) -> str | None:
        """The ``branch`` parameter."""
        return self.params.get("branch")

    def __str__(self) -> str:
        out = f"SIP/2.0/{self.transport} {self.host}"
        if self.port is not None:
            out += f":{self.port}"
        for k, v in self.params.items():
            out += f";{k}" if v is None else f";{k}={v}"
        return out


@dataclass(slots=True)
class SipMessage:
    """A request (``method`` and ``uri`` set) or a response (``status`` set).

    Headers keep their order and multiplicity; names are canonical (see :func:`canonical_name`).
    """

    method: str | None = None
    uri: str | None = None
    status: int | None = None
    reason: str = ""
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    @property
    def is_request(self) -> bool:
        """True for requests, False for responses."""
        return self.method is not None

    def get(self, name: str) -> str | None:
        """The first value of a header, or None."""
        want = canonical_name(name).lower()
        for k, v in self.headers:
            if k.lower() == want:
                return v
        return None

    def get_all(self, name: str) -> list[str]:
        """Every value of a header, in order (multi-valued Via split on commas)."""
        want = canonical_name(name).lower()
        out: list[str] = []
        for k, v in self.headers:
            if k.lower() == want:
                out.extend(_split_commas(v) if want == "via" else [v])
        return out

    def vias(self) -> list[Via]:
        """The parsed Via headers, top first."""
        return [Via.parse(v) for v in self.get_all("Via")]

    @property
    def call_id(self) -> str:
        """The Call-ID (empty when absent)."""
        return (self.get("Call-ID") or "").strip()

    def cseq(self) -> tuple[int, str]:
        """(sequence number, method) of the CSeq header."""
        value = (self.get("CSeq") or "").split()
        if len(value) != 2 or not value[0].isdigit() or len(value[0]) > 10:
            raise SipParseError(f"malformed CSeq {(self.get('CSeq') or '')[:40]!r}")
        return int(value[0]), value[1].upper()

    def add(self, name: str, value: str) -> None:
        """Append a header."""
        self.headers.append((canonical_name(name), value))

    def encode(self) -> bytes:
        """Serialise with a correct Content-Length (any stale one is replaced)."""
        if self.method is not None:
            lines = [f"{self.method} {self.uri} SIP/2.0"]
        else:
            lines = [f"SIP/2.0 {self.status} {self.reason}"]
        lines += [f"{k}: {v}" for k, v in self.headers if k.lower() != "content-length"]
        lines.append(f"Content-Length: {len(self.body)}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + self.body

    @classmethod
    def parse(cls, data: bytes) -> SipMessage:
        """Parse one datagram; raises :class:`SipParseError` for anything malformed."""
        if len(data) > MAX_DATAGRAM_BYTES:
            raise SipParseError(f"datagram of {len(data)} bytes is too large")
        head, sep, body = data.partition(b"\r\n\r\n")
        if not sep:
            head, sep, body = data.partition(b"\n\n")
        try:
            text = head.decode("utf-8")
        except UnicodeDecodeError:
            raise SipParseError("header section is not UTF-8") from None
        raw_lines = text.replace("\r\n", "\n").split("\n")
        while raw_lines and not raw_lines[0].strip():  # RFC 3261 7.5: ignore leading CRLFs
            raw_lines.pop(0)
        if not raw_lines:
            raise SipParseError("empty datagram")
        msg = cls._start_line(raw_lines[0])
        for line in raw_lines[1:]:
            if not line.strip():
                continue
            if line[0] in " \t" and msg.headers:  # folded continuation (RFC 3261 7.3.1)
                k, v = msg.headers[-1]
                msg.headers[-1] = (k, f"{v} {line.strip()}")
                continue
            name, colon, value = line.partition(":")
            if not colon or not _TOKEN.match(name.strip()):
                raise SipParseError(f"malformed header line {line[:60]!r}")
            msg.headers.append((canonical_name(name), value.strip()))
        length_s = msg.get("Content-Length")
        if length_s is not None:
            if not length_s.strip().isdigit() or len(length_s.strip()) > 6:
                raise SipParseError(f"bad Content-Length {length_s[:20]!r}", msg._answerable())
            length = int(length_s)
            if length > len(body):
                raise SipParseError(
                    f"Content-Length {length} > {len(body)} body bytes", msg._answerable()
                )
            body = body[:length]
        msg.body = body
        missing = [h for h in _REQUIRED if msg.get(h) is None]
        if missing:
            raise SipParseError(f"missing {', '.join(missing)}")
        try:
            vias = msg.vias()
            _, cseq_method = msg.cseq()
        except SipParseError as exc:
            raise SipParseError(str(exc), msg._answerable()) from None
        if not vias:
            raise SipParseError("empty Via")
        if msg.is_request and cseq_method != msg.method:
            raise SipParseError(
                f"CSeq method {cseq_method} != request method {msg.method}", msg._answerable()
            )
        return msg

    @classmethod
    def _start_line(cls, line: str) -> SipMessage:
        parts = line.strip().split(" ", 2)
        if len(parts) < 2:
            raise SipParseError(f"malformed start line {line[:60]!r}")
        if parts[0].upper() == "SIP/2.0":
            if not parts[1].isdigit() or not 100 <= int(parts[1]) <= 699:
                raise SipParseError(f"bad status code in {line[:60]!r}")
            return cls(status=int(parts[1]), reason=parts[2] if len(parts) == 3 else "")
        if len(parts) != 3 or parts[2].strip().upper() != "SIP/2.0":
            raise SipParseError(f"malformed request line {line[:60]!r}")
        if not _TOKEN.match(parts[0]) or ":" not in parts[1]:
            raise SipParseError(f"malformed request line {line[:60]!r}")
        return cls(method=parts[0].upper(), uri=parts[1])

    def _answerable(self) -> SipMessage | None:
        """Self when a 400 can be addressed back (a request whose routing headers parse)."""
        if not self.is_request or self.method == "ACK":
            return None
        if any(self.get(h) is None for h in ("Via", "From", "To", "Call-ID")):
            return None
        try:
            if not self.vias():
                return None
        except SipParseError:
            return None
        return self


def make_response(
    request: SipMessage,
    status: int,
    reason: str,
    *,
    source: tuple[str, int],
    to_tag: str | None = None,
    headers: list[tuple[str, str]] | None = None,
    body: bytes = b"",
) -> SipMessage:
    """A response to ``request`` (RFC 3261 8.2.6.2), with RFC 3581 ``received``/``rport``.

    Via, From, To, Call-ID and CSeq are copied; the top Via gets ``received`` (when the source
    IP differs from sent-by, or ``rport`` was asked for) and ``rport=<source port>``.
    """
    resp = SipMessage(status=status, reason=reason, body=body)
    vias = request.get_all("Via")
    if vias:
        top = Via.parse(vias[0])
        if "rport" in top.params:
            top.params["rport"] = str(source[1])
            top.params["received"] = source[0]
        elif top.host != source[0]:
            top.params["received"] = source[0]
        vias[0] = str(top)
    for v in vias:
        resp.add("Via", v)
    resp.add("From", request.get("From") or "")
    to = request.get("To") or ""
    resp.add("To", add_tag(to, to_tag) if to_tag else to)
    resp.add("Call-ID", request.call_id)
    resp.add("CSeq", request.get("CSeq") or "")
    for k, v in headers or []:
        resp.add(k, v)
    return resp


def reply_address(request: SipMessage, source: tuple[str, int]) -> tuple[str, int]:
    """Where a response goes (RFC 3261 18.2.2 with RFC 3581).

    ``rport`` present: the packet's source address and port. Otherwise: the source IP and the
    Via sent-by port (5060 by default).
    """
    top = request.vias()[0]
    if "rport" in top.params:
        return source
    return source[0], top.port or 5060


#: Longest SIP URI accepted (Contact, request-URI): what we copy into our own requests is bounded.
MAX_URI_CHARS = 512
#: Longest Contact header value accepted (display name and parameters included).
MAX_CONTACT_CHARS = 1024
# RFC 3261 25.1: unreserved, escaped (%HH), user-unreserved, param-unreserved, hnv-unreserved,
# and the delimiters between them. No spaces, quotes, angle brackets or controls.
_URI_CHARS = re.compile(r"^[A-Za-z0-9\-_.!~*'()%&=+$,;?/:@\[\]]+$")
_HOSTNAME = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*"
    r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?$"
)
_IPV6 = re.compile(r"^\[[0-9A-Fa-f:.]{2,45}\]$")


class UriError(ValueError):
    """A URI the bridge will not use. The message is a short fixed phrase (never the input).

    Attributes:
        unsupported_scheme: the URI is well formed but not ``sip:``/``sips:`` (→ 416).
    """

    def __init__(self, reason: str, *, unsupported_scheme: bool = False) -> None:
        super().__init__(reason)
        self.unsupported_scheme = unsupported_scheme


@dataclass(frozen=True, slots=True)
class SipUri:
    """A validated SIP or SIPS URI (RFC 3261 19.1).

    Attributes:
        text: the URI as received (known to be safe to copy into a request line).
        scheme: ``sip`` or ``sips``.
        user: the user part ('' when absent).
        host: hostname, IPv4 address or bracketed IPv6 reference.
        port: the port, or None.
    """

    text: str
    scheme: str
    user: str
    host: str
    port: int | None


def parse_sip_uri(value: str) -> SipUri:
    """Validate a SIP/SIPS URI; raises :class:`UriError` with a short reason.

    Strict where the bridge copies the URI into its own requests (the BYE's request-URI comes
    from the caller's Contact): bounded length, printable ASCII from the RFC 3261 URI alphabet
    only (so no CR/LF, spaces or brackets that could break a request line), scheme sip or sips,
    a syntactically valid host and port.
    """
    if len(value) > MAX_URI_CHARS:
        raise UriError("URI too long")
    if not value:
        raise UriError("empty URI")
    scheme, colon, rest = value.partition(":")
    if not colon or not scheme or not re.match(r"^[A-Za-z][A-Za-z0-9+.-]*$", scheme):
        raise UriError("not a URI")
    if scheme.lower() not in ("sip", "sips"):
        raise UriError("URI scheme is not sip or sips", unsupported_scheme=True)
    if not _URI_CHARS.match(rest):
        raise UriError("forbidden character in URI")
    if rest.count("@") > 1:
        raise UriError("malformed URI user part")
    user, at, hostpart = rest.partition("@")
    if not at:
        user, hostpart = "", rest
    elif not user:
        raise UriError("malformed URI user part")
    cut = min((i for i in (hostpart.find(";"), hostpart.find("?")) if i != -1), default=-1)
    hostport = hostpart if cut == -1 else hostpart[:cut]
    if hostport.startswith("["):
        end = hostport.find("]")
        host, port_s = hostport[: end + 1], hostport[end + 1 :]
        if end == -1 or not _IPV6.match(host) or (port_s and not port_s.startswith(":")):
            raise UriError("malformed URI host")
        port_s = port_s[1:]
    else:
        host, _, port_s = hostport.partition(":")
        if not _HOSTNAME.match(host):
            raise UriError("malformed URI host")
    port: int | None = None
    if port_s or hostport.endswith(":"):
        if not port_s.isdigit() or len(port_s) > 5 or not 0 < int(port_s) < 65536:
            raise UriError("bad URI port")
        port = int(port_s)
    return SipUri(value, scheme.lower(), user, host, port)


def contact_uri(value: str | None) -> SipUri:
    """The one SIP URI of an INVITE's Contact header (RFC 3261 8.1.1.8), validated.

    Raises:
        UriError: missing, ``*``, several values, unbalanced brackets, too long, or a URI that
            :func:`parse_sip_uri` refuses.
    """
    if value is None or not value.strip():
        raise UriError("missing Contact")
    if len(value) > MAX_CONTACT_CHARS:
        raise UriError("Contact too long")
    if any(ch in value for ch in "\r\n\0"):
        raise UriError("forbidden character in Contact")
    if value.strip() == "*":
        raise UriError("Contact * is only for REGISTER")
    if len(_split_commas(value)) != 1:
        raise UriError("more than one Contact")
    lt, gt = value.find("<"), value.find(">")
    if (lt == -1) != (gt == -1) or gt < lt or value.count("<") > 1 or value.count(">") > 1:
        raise UriError("malformed Contact")
    return parse_sip_uri(header_uri(value))


def option_tags(value: str | None, *, limit: int = 16) -> list[str]:
    """The option tags of a Require/Supported header, lower-cased.

    At most ``limit``, each a short token: what we echo back in Unsupported stays bounded.
    """
    if not value:
        return []
    tags = [t.strip().lower() for t in value.split(",")]
    return [t for t in tags if t and len(t) <= 32 and _TOKEN.match(t)][:limit]


#: Most Record-Route entries accepted on a dialog-forming request (each one is copied into our
#: 2xx and into every request of the dialog, so the count is bounded like everything copied).
MAX_ROUTE_ENTRIES = 16


def uri_param(uri: str, name: str) -> str | None:
    """A URI parameter's value ('' for a flag like ``;lr``), or None when it is absent.

    Only the parameters of the URI itself count, not its ``?headers``: ``sip:p;lr`` has ``lr``.
    """
    _, _, rest = uri.partition(";")
    rest = rest.split("?", 1)[0]
    want = name.lower()
    for p in rest.split(";") if rest else []:
        k, _, v = p.partition("=")
        if k.strip().lower() == want:
            return v.strip()
    return None


def record_route(req: SipMessage) -> list[str]:
    """The request's Record-Route entries, one name-addr each, top first (RFC 3261 20.30).

    A UAS copies them, in order, into the response that creates the dialog and keeps them as
    the dialog's route set (12.1.1). Each must be ``<sip:...>`` with a URI that
    :func:`parse_sip_uri` accepts: the entries end up in our own requests' Route headers.

    Raises:
        UriError: more than :data:`MAX_ROUTE_ENTRIES`, an entry that is not a bracketed SIP
            URI, or one that is too long.
    """
    out: list[str] = []
    for value in req.get_all("Record-Route"):
        for entry in _split_commas(value):
            if len(out) >= MAX_ROUTE_ENTRIES:
                raise UriError("too many Record-Route entries")
            if len(entry) > MAX_CONTACT_CHARS or any(ch in entry for ch in "\r\n\0"):
                raise UriError("Record-Route entry too long")
            lt, gt = entry.find("<"), entry.find(">")
            if lt == -1 or gt < lt or entry.count("<") != 1 or entry.count(">") != 1:
                raise UriError("Record-Route entry is not <uri>")
            parse_sip_uri(header_uri(entry))
            out.append(entry)
    return out


@dataclass(frozen=True, slots=True)
class NextHop:
    """Where an in-dialog request goes and what it says (RFC 3261 12.2.1.1).

    Attributes:
        request_uri: the Request-URI.
        routes: the Route header values, in order.
        host: the host to send the datagram to (the first Route's, else the target's).
        port: its port (5060 when the URI has none).
        via_route: True when a route set decided the hop (False: no route set).
    """

    request_uri: str
    routes: list[str]
    host: str
    port: int
    via_route: bool


def next_hop(route_set: list[str], remote_target: str) -> NextHop:
    """The Request-URI, Route headers and first hop of a request in a dialog.

    Loose routing (the first route has ``;lr``, what every proxy written after RFC 2543
    inserts): the Request-URI is the remote target and the route set becomes Route headers.
    Strict routing (an RFC 2543 proxy): the first route becomes the Request-URI and the remote
    target is appended to the rest as the last Route. Either way the datagram goes to the first
    route's host and port; with no route set, to the remote target's.
    """
    if not route_set:
        uri = parse_sip_uri(remote_target)
        return NextHop(remote_target, [], uri.host.strip("[]"), uri.port or 5060, False)
    first_text = header_uri(route_set[0])
    first = parse_sip_uri(first_text)
    hop_host, hop_port = first.host.strip("[]"), first.port or 5060
    if uri_param(first_text, "lr") is not None:
        return NextHop(remote_target, list(route_set), hop_host, hop_port, True)
    strict_uri = first_text.split("?", 1)[0]  # 12.2.1.1: no headers in a Request-URI
    return NextHop(strict_uri, [*route_set[1:], f"<{remote_target}>"], hop_host, hop_port, True)


class DtmfInfoError(ValueError):
    """A SIP INFO body that is not a key press we can read (a short fixed reason).

    Attributes:
        status: the SIP status to answer: 400 for a malformed body, 415 for another type.
    """

    def __init__(self, reason: str, status: int = 400) -> None:
        super().__init__(reason)
        self.status = status


#: The INFO body types read as key presses (both are what SIP phones and PBXs send).
DTMF_INFO_TYPES = ("application/dtmf-relay", "application/dtmf")
#: Keys a DTMF INFO may carry (the RFC 4733 events 0-15).
_DTMF_KEYS = "0123456789*#ABCD"
#: Duration assumed when ``application/dtmf-relay`` gives none (the common default, in ms).
DEFAULT_INFO_DTMF_MS = 250
_MAX_INFO_BODY = 256


def parse_dtmf_info(content_type: str | None, body: bytes) -> tuple[str, int]:
    """The (key, duration ms) of a DTMF INFO body.

    ``application/dtmf-relay`` (the Cisco format every PBX speaks) is ``Signal=5`` and an
    optional ``Duration=160`` on separate lines, names case-insensitive; ``application/dtmf``
    is the key alone. Keys are 0-9 * # A-D (letters in either case).

    Raises:
        DtmfInfoError: status 415 for any other body type, 400 for a body we cannot read.
    """
    ctype = (content_type or "").split(";", 1)[0].strip().lower()
    if ctype not in DTMF_INFO_TYPES:
        raise DtmfInfoError("INFO body type is not application/dtmf-relay", 415)
    if len(body) > _MAX_INFO_BODY:
        raise DtmfInfoError("DTMF INFO body too long")
    try:
        text = body.decode("ascii")
    except UnicodeDecodeError:
        raise DtmfInfoError("DTMF INFO body is not ASCII") from None
    if ctype == "application/dtmf":
        return _dtmf_key(text.strip()), DEFAULT_INFO_DTMF_MS
    fields: dict[str, str] = {}
    for line in text.replace("\r\n", "\n").split("\n"):
        if not line.strip():
            continue
        name, eq, value = line.partition("=")
        if not eq:
            raise DtmfInfoError("DTMF INFO line without '='")
        key = name.strip().lower()
        if key in fields:
            raise DtmfInfoError("DTMF INFO field repeated")
        fields[key] = value.strip()
    if "signal" not in fields:
        raise DtmfInfoError("DTMF INFO without Signal=")
    duration = DEFAULT_INFO_DTMF_MS
    if "duration" in fields:
        d = fields["duration"]
        if not d.isdigit() or len(d) > 5 or not 0 < int(d) <= 60_000:
            raise DtmfInfoError("bad DTMF INFO Duration=")
        duration = int(d)
    return _dtmf_key(fields["signal"]), duration


def _dtmf_key(text: str) -> str:
    if len(text) != 1 or text.upper() not in _DTMF_KEYS:
        raise DtmfInfoError("DTMF INFO key is not 0-9, *, #, A-D")
    return text.upper()


def parse_sipfrag(body: bytes) -> tuple[int, str] | None:
    """The status line of a ``message/sipfrag`` body (RFC 3420), as (code, reason), or None.

    Only the status line matters to a REFER's NOTIFY (RFC 3515 2.4.5). The reason is bounded
    and printable, since it may reach a log line or a bot.
    """
    line = body.split(b"\n", 1)[0].strip()
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None
    parts = text.split(" ", 2)
    if len(parts) < 2 or parts[0].upper() != "SIP/2.0" or not parts[1].isdigit():
        return None
    code = int(parts[1])
    if not 100 <= code <= 699:
        return None
    reason = parts[2] if len(parts) == 3 else ""
    return code, "".join(ch for ch in reason[:60] if ch.isprintable())
