"""SIP dialogs behind proxies, DTMF as SIP INFO and REFER: messages, then a real bridge.

The message tests are pure. The bridge tests run a real bridge on loopback against a real
in-process gateway (VAD only) and script the other side with :class:`SipPeer` sockets: one is the
caller, others stand where a proxy's Record-Route and the caller's Contact point, so each test
sees exactly where the bridge sends what. Kamailio and softphones are in test_sip_proxy.py.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest

from voxgate.bridges.bots import SilentBot
from voxgate.bridges.sip import BridgeConfig, SipBridge
from voxgate.bridges.sip._message import (
    DEFAULT_INFO_DTMF_MS,
    DtmfInfoError,
    SipMessage,
    UriError,
    header_uri,
    next_hop,
    parse_dtmf_info,
    parse_sipfrag,
    record_route,
    uri_param,
)
from voxgate.bridges.sip.testing import SipPeer
from voxgate.gateway.testing.server import running_server
from voxgate_client import Dtmf, ServerEvent, VoiceCall

SDP = (
    "v=0\r\no=peer 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
    "m=audio {port} RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
    "a=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-15\r\n"
)


def invite_with(extra: str) -> SipMessage:
    return SipMessage.parse(
        (
            "INVITE sip:bot@127.0.0.1 SIP/2.0\r\n"
            "Via: SIP/2.0/UDP 127.0.0.1:5070;branch=z9hG4bKp1\r\n"
            "Via: SIP/2.0/UDP 127.0.0.1:5062;branch=z9hG4bKa1;rport\r\n"
            "From: <sip:a@127.0.0.1>;tag=a\r\nTo: <sip:bot@127.0.0.1>\r\nCall-ID: r1\r\n"
            f"CSeq: 1 INVITE\r\nContact: <sip:a@127.0.0.1:5062>\r\n{extra}"
            "Content-Length: 0\r\n\r\n"
        ).encode()
    )


# --- messages ------------------------------------------------------------------------------------


@pytest.mark.unit
def test_record_route_keeps_order_across_headers_and_commas() -> None:
    req = invite_with(
        "Record-Route: <sip:p1.example.com;lr>, <sip:10.0.0.2:5070;lr;ftag=x>\r\n"
        "Record-Route: <sip:[2001:db8::1]:5080;lr>\r\n"
    )
    assert record_route(req) == [
        "<sip:p1.example.com;lr>",
        "<sip:10.0.0.2:5070;lr;ftag=x>",
        "<sip:[2001:db8::1]:5080;lr>",
    ]
    assert record_route(invite_with("")) == []


@pytest.mark.unit
@pytest.mark.parametrize(
    "value",
    [
        "sip:p1;lr",  # not a name-addr: the brackets are required
        "<sip:p1;lr",
        "<http://p1>",
        "<sip:bad host;lr>",
        ", ".join(f"<sip:p{i};lr>" for i in range(17)),
        "<sip:" + "a" * 600 + ";lr>",
    ],
)
def test_bad_record_route_is_refused(value: str) -> None:
    with pytest.raises(UriError):
        record_route(invite_with(f"Record-Route: {value}\r\n"))


@pytest.mark.unit
def test_next_hop_loose_strict_and_direct() -> None:
    target = "sip:a@192.0.2.7:5062"
    loose = next_hop(["<sip:10.0.0.2:5070;lr>", "<sip:p2.example.com;lr>"], target)
    assert (loose.request_uri, loose.host, loose.port, loose.via_route) == (
        target,
        "10.0.0.2",
        5070,
        True,
    )
    assert loose.routes == ["<sip:10.0.0.2:5070;lr>", "<sip:p2.example.com;lr>"]
    # RFC 3261 12.2.1.1: a strict router (no ;lr) gets the Request-URI; the target goes last.
    strict = next_hop(["<sip:10.0.0.3;maddr=x>", "<sip:p2;lr>"], target)
    assert strict.request_uri == "sip:10.0.0.3;maddr=x"
    assert strict.routes == ["<sip:p2;lr>", f"<{target}>"]
    assert (strict.host, strict.port) == ("10.0.0.3", 5060)
    direct = next_hop([], target)
    assert (direct.request_uri, direct.routes, direct.via_route) == (target, [], False)
    assert (direct.host, direct.port) == ("192.0.2.7", 5062)
    assert uri_param("sip:h;transport=udp;lr?x=y", "lr") == ""
    assert uri_param("sip:h;transport=udp?lr", "lr") is None
    assert header_uri(loose.routes[1]) == "sip:p2.example.com;lr"


@pytest.mark.unit
@pytest.mark.parametrize(
    ("ctype", "body", "expected"),
    [
        ("application/dtmf-relay", b"Signal=5\r\nDuration=160\r\n", ("5", 160)),
        ("Application/DTMF-Relay; charset=x", b"signal= #\nduration=90", ("#", 90)),
        ("application/dtmf-relay", b"Signal=a\r\n", ("A", DEFAULT_INFO_DTMF_MS)),
        ("application/dtmf", b"*\r\n", ("*", DEFAULT_INFO_DTMF_MS)),
    ],
)
def test_dtmf_info_bodies(ctype: str, body: bytes, expected: tuple[str, int]) -> None:
    assert parse_dtmf_info(ctype, body) == expected


@pytest.mark.unit
@pytest.mark.parametrize(
    ("ctype", "body", "status"),
    [
        ("application/dtmf-relay", b"Duration=160\r\n", 400),
        ("application/dtmf-relay", b"Signal=55\r\n", 400),
        ("application/dtmf-relay", b"Signal=E\r\n", 400),
        ("application/dtmf-relay", b"Signal=1\r\nSignal=2\r\n", 400),
        ("application/dtmf-relay", b"Signal=1\r\nDuration=-5\r\n", 400),
        ("application/dtmf-relay", b"Signal=1\r\nDuration=999999\r\n", 400),
        ("application/dtmf-relay", b"Signal\r\n", 400),
        ("application/dtmf-relay", b"Signal=\xff\r\n", 400),
        ("application/dtmf-relay", b"Signal=1\r\n" + b"x=y\r\n" * 100, 400),
        ("application/dtmf", b"12", 400),
        ("application/media_control+xml", b"<media_control/>", 415),
        (None, b"Signal=1", 415),
    ],
)
def test_malformed_dtmf_info_is_refused(ctype: str | None, body: bytes, status: int) -> None:
    with pytest.raises(DtmfInfoError) as err:
        parse_dtmf_info(ctype, body)
    assert err.value.status == status


@pytest.mark.unit
def test_sipfrag_status_line() -> None:
    assert parse_sipfrag(b"SIP/2.0 200 OK\r\n") == (200, "OK")
    assert parse_sipfrag(b"SIP/2.0 100 Trying") == (100, "Trying")
    assert parse_sipfrag(b"SIP/2.0 486 Busy Here\r\nContent-Length: 0\r\n") == (486, "Busy Here")
    assert parse_sipfrag(b"SIP/2.0 603") == (603, "")
    for bad in (b"", b"INVITE sip:x SIP/2.0", b"SIP/2.0 99 x", b"SIP/2.0 abc", b"\xff\xfe"):
        assert parse_sipfrag(bad) is None
    assert parse_sipfrag(b"SIP/2.0 500 " + b"\x1b[2J" + b"x" * 100) == (500, "[2J" + "x" * 56)


# --- a real bridge, scripted peers ---------------------------------------------------------------


class Dialog:
    """The caller's side of one call set up by :func:`call_up`."""

    def __init__(self, caller: SipPeer, bridge: SipBridge, ok: SipMessage, call_id: str) -> None:
        self.caller = caller
        self.bridge = bridge
        self.ok = ok
        self.call_id = call_id
        self.cseq = 1
        self.to = ok.get("To") or ""

    def send(
        self, method: str, body: bytes = b"", content_type: str | None = None, **kw: Any
    ) -> SipMessage:
        self.cseq += 1
        req = self.caller.request(
            method,
            f"sip:voxgate@{self.bridge.address[0]}:{self.bridge.address[1]}",
            call_id=self.call_id,
            from_tag="caller",
            to=self.to,
            cseq=self.cseq,
            body=body,
            content_type=content_type,
            **kw,
        )
        self.caller.send(req, self.bridge.address)
        return req

    async def answer_to(self, req: SipMessage) -> SipMessage:
        want = req.get("CSeq")

        def match(m: SipMessage) -> bool:
            return m.status is not None and m.status >= 200 and m.get("CSeq") == want

        msg, _ = await self.caller.expect(match, f"final response to {req.method}")
        return msg


@asynccontextmanager
async def bridge_with_gateway(
    bot: Any = None,
    **cfg: Any,
) -> AsyncIterator[tuple[SipBridge, dict[str, list[ServerEvent]]]]:
    events: dict[str, list[ServerEvent]] = defaultdict(list)
    async with running_server() as srv:
        config = BridgeConfig(
            listen_host="127.0.0.1",
            listen_port=0,
            gateway=srv.target,
            rtp_port_min=30000,
            rtp_port_max=39999,
            **cfg,
        )
        bridge = SipBridge(
            config, bot or SilentBot(), on_event=lambda cid, m: events[cid].append(m)
        )
        await bridge.start()
        try:
            yield bridge, events
        finally:
            await bridge.aclose()


async def call_up(
    caller: SipPeer,
    bridge: SipBridge,
    call_id: str,
    record_routes: list[str],
    contact: str | None = None,
    *,
    ack: bool = True,
) -> Dialog:
    """INVITE (with the given Record-Route, as if proxies were on the path) → 200 → ACK.

    With ``ack=False`` the call is left answered and the test sends :func:`send_ack` itself.
    """
    invite = caller.request(
        "INVITE",
        f"sip:bot@{bridge.address[0]}:{bridge.address[1]}",
        call_id=call_id,
        from_tag="caller",
        to=f"<sip:bot@{bridge.address[0]}>",
        cseq=1,
        headers=[("Record-Route", rr) for rr in record_routes],
        body=SDP.format(port=caller.port + 1).encode(),
        content_type="application/sdp",
        contact=contact,
    )
    caller.send(invite, bridge.address)
    ok, _ = await caller.expect(lambda m: m.status == 200, "200 to the INVITE")
    dialog = Dialog(caller, bridge, ok, call_id)
    if ack:
        await send_ack(dialog)
    return dialog


async def send_ack(dialog: Dialog, *, wait: bool = True) -> None:
    """ACK the INVITE's 200 and (``wait``) wait until the bridge has confirmed the call."""
    bridge = dialog.bridge
    ack = dialog.caller.request(
        "ACK",
        f"sip:voxgate@{bridge.address[0]}:{bridge.address[1]}",
        call_id=dialog.call_id,
        from_tag="caller",
        to=dialog.to,
        cseq=1,
    )
    dialog.caller.send(ack, bridge.address)
    if not wait:
        return
    for _ in range(200):  # event-based: the bridge marks the call confirmed on the ACK
        call = bridge.calls.get(dialog.call_id)
        if call is not None and call.state == "confirmed":
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the bridge never confirmed the call")


@pytest.mark.e2e
async def test_2xx_copies_record_route_and_bye_follows_the_route_set() -> None:
    """The BYE goes to the first Record-Route hop, with Route in order and the Contact as R-URI.

    Three sockets: the INVITE comes from ``caller``, the route set names ``proxy1`` then
    ``proxy2``, and the Contact names ``phone``. Before route sets the BYE went back to the
    INVITE's source with no Route, which a proxy answers 404.
    """
    async with (
        SipPeer() as caller,
        SipPeer() as proxy1,
        SipPeer() as proxy2,
        SipPeer() as phone,
        bridge_with_gateway() as (bridge, _),
    ):
        routes = [
            f"<sip:127.0.0.1:{proxy1.port};lr;ftag=caller>",
            f"<sip:127.0.0.1:{proxy2.port};lr>",
        ]
        invite_routes = [", ".join(routes)]  # one header, two entries: order must survive
        contact = f"<sip:phone@127.0.0.1:{phone.port}>"
        dialog = await call_up(caller, bridge, "rr-1", invite_routes, contact)
        assert dialog.ok.get_all("Record-Route") == routes
        closing = asyncio.create_task(bridge.aclose())  # the bridge hangs up
        bye, src = await proxy1.expect(lambda m: m.method == "BYE", "BYE at the first hop")
        assert bye.uri == f"sip:phone@127.0.0.1:{phone.port}"
        assert bye.get_all("Route") == routes
        assert src == bridge.address
        proxy1.reply(bye, src, 200, "OK", to_tag="caller")
        await closing
    assert not [m for m, _ in caller.received if m.method == "BYE"]
    assert not phone.received and not proxy2.received


@pytest.mark.e2e
async def test_180_ringing_copies_record_route_too() -> None:
    """The 180 with our To-tag starts an early dialog (RFC 3261 12.1.1): same Record-Route."""
    async with SipPeer() as caller, bridge_with_gateway(ring_ms=300) as (bridge, _):
        rr = f"<sip:127.0.0.1:{caller.port};lr>"
        dialog = await call_up(caller, bridge, "ring-1", [rr])
        ringing = [m for m, _ in caller.received if m.status == 180]
        assert ringing and ringing[0].get_all("Record-Route") == [rr]
        assert dialog.ok.get_all("Record-Route") == [rr]


@pytest.mark.e2e
async def test_reinvite_through_the_proxy_gets_its_record_route_back_and_the_dialog_stays() -> None:
    async with SipPeer() as caller, bridge_with_gateway() as (bridge, _):
        rr = f"<sip:127.0.0.1:{caller.port};lr>"
        dialog = await call_up(caller, bridge, "rr-2", [rr])
        hold = (
            SDP.format(port=caller.port + 1).replace("o=peer 1 1", "o=peer 1 2") + "a=sendonly\r\n"
        )
        reinvite = dialog.send(
            "INVITE",
            hold.encode(),
            "application/sdp",
            headers=[("Record-Route", rr)],
        )
        ok = await dialog.answer_to(reinvite)
        assert ok.status == 200 and ok.get_all("Record-Route") == [rr]
        assert bridge.calls["rr-2"].route_set == [rr]  # a target refresh keeps the route set
        assert b"a=recvonly" in ok.body


@pytest.mark.e2e
async def test_dtmf_info_reaches_the_gateway_and_bad_bodies_get_400_or_415() -> None:
    async with SipPeer() as caller, bridge_with_gateway() as (bridge, events):
        dialog = await call_up(caller, bridge, "info-1", [])
        statuses = []
        for ctype, body in [
            ("application/dtmf-relay", b"Signal=7\r\nDuration=120\r\n"),
            ("application/dtmf-relay", b"Signal=nine\r\n"),  # malformed: 400, call goes on
            ("application/xml", b"<x/>"),  # another type: 415 with Accept
            ("application/dtmf", b"#"),
            (None, b""),  # empty INFO (a keep-alive): 200
        ]:
            resp = await dialog.answer_to(dialog.send("INFO", body, ctype))
            statuses.append(resp.status)
            if resp.status == 415:
                assert "application/dtmf-relay" in (resp.get("Accept") or "")

        def digits() -> list[tuple[str, int]]:
            return [(m.digit, m.duration_ms) for m in events["info-1"] if isinstance(m, Dtmf)]

        for _ in range(200):
            if len(digits()) >= 2:
                break
            await asyncio.sleep(0.02)
        assert statuses == [200, 400, 415, 200, 200]
        assert digits() == [("7", 120), ("#", DEFAULT_INFO_DTMF_MS)]
        assert bridge.calls["info-1"].state == "confirmed"
        assert bridge.stats["dtmf_info"] == 2 and bridge.stats["info_refused"] == 2


def answers(req: SipMessage, status: int) -> Callable[[SipMessage], bool]:
    """A predicate: the response ``status`` to ``req`` (same CSeq)."""
    cseq = req.get("CSeq")
    return lambda m: m.status == status and m.get("CSeq") == cseq


async def _refer_exchange(
    caller: SipPeer, notify_frags: list[bytes], refer_status: int = 202
) -> SipMessage:
    """Answer the bridge's REFER, then send one NOTIFY per sipfrag; the REFER."""
    refer, src = await caller.expect(lambda m: m.method == "REFER", "REFER")
    caller.reply(
        refer, src, refer_status, "Accepted" if refer_status == 202 else "No", to_tag="caller"
    )
    for n, frag in enumerate(notify_frags, 1):
        final = not frag.startswith(b"SIP/2.0 1")
        notify = caller.request(
            "NOTIFY",
            header_uri(refer.get("Contact") or ""),
            call_id=refer.call_id,
            from_tag="caller",
            to=refer.get("From") or "",
            cseq=100 + n,
            headers=[
                ("Event", f"refer;id={refer.cseq()[0]}"),
                ("Subscription-State", "terminated;reason=noresource" if final else "active"),
            ],
            body=frag,
            content_type="message/sipfrag;version=2.0",
        )
        caller.send(notify, src)
        await caller.expect(answers(notify, 200), "200 to NOTIFY")
    return refer


@pytest.mark.e2e
async def test_refer_success_sends_refer_to_and_referred_by_then_bye() -> None:
    async with SipPeer() as caller, bridge_with_gateway() as (bridge, _):
        rr = f"<sip:127.0.0.1:{caller.port};lr>"
        await call_up(caller, bridge, "refer-1", [rr])
        target = "sip:agent@192.0.2.10:5060"
        result, refer = await asyncio.gather(
            bridge.transfer("refer-1", target),
            _refer_exchange(caller, [b"SIP/2.0 100 Trying\r\n", b"SIP/2.0 200 OK\r\n"]),
        )
        assert result.ok and result.status == 200
        assert refer.get("Refer-To") == f"<{target}>"
        assert (refer.get("Referred-By") or "").startswith("<sip:voxgate@127.0.0.1:")
        assert refer.get_all("Route") == [rr]
        bye, src = await caller.expect(lambda m: m.method == "BYE", "BYE after the transfer")
        caller.reply(bye, src, 200, "OK", to_tag="caller")
        assert bye.get_all("Route") == [rr]
        for _ in range(200):
            if "refer-1" not in bridge.calls:
                break
            await asyncio.sleep(0.02)
        assert [r for c, r in bridge.ended if c == "refer-1"] == ["transferred (200 OK)"]


@pytest.mark.e2e
async def test_a_transfer_asked_before_the_ack_waits_for_it() -> None:
    """A bot starts on the 200 OK: a transfer it asks for at once must not fail as 481."""
    async with SipPeer() as caller, bridge_with_gateway() as (bridge, _):
        dialog = await call_up(caller, bridge, "refer-early", [], ack=False)
        assert bridge.calls["refer-early"].state == "answered"
        transfer = asyncio.ensure_future(bridge.transfer("refer-early", "sip:agent@192.0.2.10"))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not transfer.done()
        assert not [m for m, _ in caller.received if m.method == "REFER"]  # not before the ACK
        await send_ack(dialog)
        await _refer_exchange(caller, [b"SIP/2.0 200 OK\r\n"])
        result = await transfer
        assert (result.ok, result.status) == (True, 200)


@pytest.mark.e2e
async def test_a_transfer_waiting_for_an_ack_that_never_comes_fails_with_the_call() -> None:
    async with SipPeer() as caller, bridge_with_gateway(t1_ms=20) as (bridge, _):
        await call_up(caller, bridge, "refer-noack", [], ack=False)
        result = await bridge.transfer("refer-noack", "sip:agent@192.0.2.10")
        assert (result.ok, result.status) == (False, 481)
        assert "refer-noack" not in bridge.calls or bridge.calls["refer-noack"].ended.is_set()
        assert not [m for m, _ in caller.received if m.method == "REFER"]


@pytest.mark.e2e
async def test_a_bot_hanging_up_before_the_ack_says_bye_only_after_it() -> None:
    """RFC 3261 15: the callee's BYE waits for the ACK of its 2xx."""
    hung_up = asyncio.Event()

    async def impatient_bot(call: VoiceCall) -> None:
        await call.hangup()
        hung_up.set()
        async for _ in call:
            pass

    async with SipPeer() as caller, bridge_with_gateway(impatient_bot) as (bridge, _):
        dialog = await call_up(caller, bridge, "bye-early", [], ack=False)
        await asyncio.wait_for(hung_up.wait(), 10)
        for _ in range(20):
            await asyncio.sleep(0.01)
        assert not [m for m, _ in caller.received if m.method == "BYE"]
        await send_ack(dialog, wait=False)  # the call ends as soon as it is confirmed
        bye, src = await caller.expect(lambda m: m.method == "BYE", "BYE after the ACK")
        caller.reply(bye, src, 200, "OK", to_tag="caller")


@pytest.mark.e2e
async def test_failed_or_refused_transfer_leaves_the_call_up() -> None:
    async with SipPeer() as caller, bridge_with_gateway() as (bridge, _):
        await call_up(caller, bridge, "refer-2", [])
        target = "sip:agent@192.0.2.10"
        busy, _ = await asyncio.gather(
            bridge.transfer("refer-2", target),
            _refer_exchange(caller, [b"SIP/2.0 486 Busy Here\r\n"]),
        )
        assert (busy.ok, busy.status, busy.reason) == (False, 486, "Busy Here")
        refused, _ = await asyncio.gather(
            bridge.transfer("refer-2", target),
            _refer_exchange(caller, [], refer_status=603),
        )
        assert (refused.ok, refused.status) == (False, 603)
        silent, _ = await asyncio.gather(
            bridge.transfer("refer-2", target, timeout_s=0.5),
            _refer_exchange(caller, []),  # 202, then no NOTIFY at all
        )
        assert (silent.ok, silent.status) == (False, 408)
        bad = await bridge.transfer("refer-2", "tel:+15550100")
        assert (bad.ok, bad.status) == (False, 400)
        gone = await bridge.transfer("no-such-call", target)
        assert (gone.ok, gone.status) == (False, 481)
        assert bridge.calls["refer-2"].state == "confirmed"
        assert not [m for m, _ in caller.received if m.method == "BYE"]
        assert bridge.stats["transfer_failed"] == 5


@pytest.mark.e2e
async def test_notify_without_a_refer_or_for_another_event_is_refused() -> None:
    async with SipPeer() as caller, bridge_with_gateway() as (bridge, _):
        dialog = await call_up(caller, bridge, "notify-1", [])
        stray = dialog.send(
            "NOTIFY", b"SIP/2.0 200 OK", "message/sipfrag", headers=[("Event", "refer")]
        )
        assert (await dialog.answer_to(stray)).status == 481
        other = dialog.send("NOTIFY", b"", None, headers=[("Event", "presence")])
        assert (await dialog.answer_to(other)).status == 489
        assert bridge.calls["notify-1"].state == "confirmed"


@pytest.mark.e2e
async def test_invite_with_a_bad_record_route_gets_400_and_no_call() -> None:
    async with SipPeer() as caller, bridge_with_gateway() as (bridge, _):
        invite = caller.request(
            "INVITE",
            f"sip:bot@{bridge.address[0]}:{bridge.address[1]}",
            call_id="bad-rr",
            from_tag="caller",
            to=f"<sip:bot@{bridge.address[0]}>",
            cseq=1,
            headers=[("Record-Route", "<sip:p1;lr>, sip:no-brackets;lr")],
            body=SDP.format(port=caller.port + 1).encode(),
            content_type="application/sdp",
        )
        caller.send(invite, bridge.address)
        resp, _ = await caller.expect(lambda m: (m.status or 0) >= 200, "final response")
        assert resp.status == 400
        assert resp.reason == "Bad Record-Route (Record-Route entry is not <uri>)"
        assert "no-brackets" not in resp.encode().decode().split("\r\n", 1)[0]
        assert not bridge.calls and bridge.stats["bad_record_route"] == 1
        # The next call, with a good route set, is answered.
        await call_up(caller, bridge, "good-rr", [f"<sip:127.0.0.1:{caller.port};lr>"])
