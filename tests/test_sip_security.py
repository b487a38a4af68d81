"""SIP media security and call lifetime: hostile and vanished peers over real UDP on loopback.

The callers are SIPp (the real third-party SIP peer) and raw asyncio UDP sockets for what SIPp
cannot be made to do (spoofed offers, blind ACKs, hostile Contacts, RTP from a stranger). The
gateway is the real grpc.aio server, VAD only, or with the fake tone voice where a test needs
reply audio to flow (the fake proves the bridge's RTP path, never a model feature).

The timer rules themselves (ACK give-up, RTP inactivity, RFC 4028, maximum duration) are
checked to the millisecond on a virtual clock, with a stand-in Converse stream (named as such
below), since an exact time cannot be asserted on a shared machine's wall clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import grpc
import pytest
from calls import encode_wav
from test_sip_e2e import SIPP_DIR, RecordingBot, bridge_and_gateway, ok, wait_for
from test_sip_unit import offer, request

from voxgate.bridges.sip import BridgeConfig, SilentBot, SipBridge
from voxgate.bridges.sip._message import (
    MAX_URI_CHARS,
    SipMessage,
    SipParseError,
    UriError,
    contact_uri,
    make_response,
    parse_sip_uri,
)
from voxgate.bridges.sip._rtp import RtpLatch, RtpPacketizer
from voxgate.bridges.sip._session_timer import (
    SessionIntervalTooSmall,
    SessionTimerError,
    negotiate_session_timer,
)
from voxgate.bridges.sip.testing import RtpPeer, run_sipp
from voxgate.gateway.testing.fake_engines import FakeToneHub
from voxgate.gateway.testing.virtual_time import run_virtual
from voxgate.v1 import voxgate_pb2 as pb
from voxgate_client import VoxgateClient

CLIP = "cmu_goforward.wav"
SILENCE = b"\xff" * 160  # one 20 ms PCMU frame of digital silence
LOCAL = "127.0.0.1"


# --- raw UDP peers -------------------------------------------------------------------------------


class RawSip(asyncio.DatagramProtocol):
    """A SIP endpoint that sends whatever it is told and records every message it receives."""

    def __init__(self) -> None:
        self.messages: list[tuple[SipMessage, bytes]] = []
        self.port = 0
        self._transport: asyncio.DatagramTransport | None = None

    async def __aenter__(self) -> RawSip:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: self, local_addr=(LOCAL, 0))
        self._transport = transport
        self.port = int(transport.get_extra_info("sockname")[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._transport is not None:
            self._transport.close()

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        with contextlib.suppress(SipParseError):
            self.messages.append((SipMessage.parse(data), data))

    def send(self, data: bytes, dest: tuple[str, int]) -> None:
        assert self._transport is not None
        self._transport.sendto(data, dest)

    def of_call(self, call_id: str) -> list[SipMessage]:
        return [m for m, _ in self.messages if m.call_id == call_id]

    def final(self, call_id: str) -> tuple[SipMessage, bytes] | None:
        """The first final response for the call's INVITE."""
        for m, raw in self.messages:
            if m.call_id == call_id and m.status is not None and m.status >= 200:
                return m, raw
        return None


def invite(
    call_id: str,
    sip_port: int,
    rtp: tuple[str, int],
    *,
    contact: str | None = "default",
    ruri: str = f"sip:bot@{LOCAL}",
) -> bytes:
    """An INVITE from 127.0.0.1:sip_port whose SDP says: send my audio to ``rtp``."""
    sdp = (
        f"v=0\r\no=caller 1 1 IN IP4 {rtp[0]}\r\ns=-\r\nc=IN IP4 {rtp[0]}\r\nt=0 0\r\n"
        f"m=audio {rtp[1]} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
    )
    if contact == "default":
        contact = f"<sip:caller@{LOCAL}:{sip_port}>"
    contact_line = "" if contact is None else f"Contact: {contact}\r\n"
    return (
        f"INVITE {ruri} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {LOCAL}:{sip_port};branch=z9hG4bK{call_id};rport\r\n"
        f"From: <sip:caller@{LOCAL}>;tag=c-{call_id}\r\nTo: <sip:bot@{LOCAL}>\r\n"
        f"Call-ID: {call_id}\r\nCSeq: 1 INVITE\r\n{contact_line}Max-Forwards: 70\r\n"
        f"Content-Type: application/sdp\r\nContent-Length: {len(sdp)}\r\n\r\n{sdp}"
    ).encode()


def ack(call_id: str, sip_port: int, to: str) -> bytes:
    return (
        f"ACK sip:bot@{LOCAL} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {LOCAL}:{sip_port};branch=z9hG4bKack{call_id};rport\r\n"
        f"From: <sip:caller@{LOCAL}>;tag=c-{call_id}\r\nTo: {to}\r\n"
        f"Call-ID: {call_id}\r\nCSeq: 1 ACK\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    ).encode()


def answer(req: SipMessage, status: int = 200) -> bytes:
    """Our peer's response to a request the bridge sent (BYE, UPDATE, re-INVITE)."""
    return make_response(req, status, "OK" if status == 200 else "Nope", source=(LOCAL, 9)).encode()


async def stream(
    send: Callable[[bytes], None], packetizer: RtpPacketizer, payload: bytes, start: int = 0
) -> int:
    """Send G.711 as 20 ms packets on an absolute clock; returns the packets sent."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    n = 0
    for i in range(0, len(payload), 160):
        await asyncio.sleep(max(0.0, t0 + n * 0.02 - loop.time()))
        send(packetizer.packet(payload[i : i + 160], start + n, marker=n == 0).encode())
        n += 1
    return n


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.bind((LOCAL, port))
        except OSError:
            return False
    return True


# --- vanished callers, maximum duration, session timers (SIPp) ----------------------------------


@pytest.mark.e2e
@pytest.mark.usefixtures("sipp")
async def test_vanished_callers_are_ended_after_the_rtp_timeout() -> None:
    """Eight answered calls whose callers send no RTP and no BYE: all ended, nothing held."""
    async with bridge_and_gateway(rtp_timeout_s=1.0) as (bridge, events):
        sipp = asyncio.create_task(
            run_sipp(SIPP_DIR / "uac_wait_bye.xml", bridge.address, cwd=SIPP_DIR, calls=8, rate=50)
        )
        await wait_for(
            lambda: (
                len(bridge.calls) == 8
                and all(c.state == "confirmed" for c in bridge.calls.values())
            ),
            "eight calls ACKed",
        )
        ports = [c.media.local_port for c in bridge.calls.values() if c.media is not None]
        # Each SIPp caller answers the bridge's BYE: rc 0 proves eight BYEs went out on the wire.
        ok(await sipp)
        await wait_for(lambda: not bridge.calls, "calls torn down")
        await asyncio.wait_for(events.server.servicer.wait_idle(), 10)  # gateway streams closed
    assert [r for _, r in bridge.ended] == ["no RTP for 1 s"] * 8
    assert bridge.stats["rtp_timeout"] == 8 and bridge.stats["bye_sent"] == 8
    assert len(ports) == 8 and all(port_is_free(p) for p in ports)  # RTP ports released


@pytest.mark.e2e
@pytest.mark.usefixtures("sipp")
async def test_caller_whose_rtp_stops_is_ended_and_a_live_one_is_not() -> None:
    """The clock counts from the last accepted packet: a caller streaming for longer than the
    timeout stays up; once its RTP stops, the call ends."""
    async with RtpPeer() as peer, bridge_and_gateway(rtp_timeout_s=2.0) as (bridge, _):
        sipp = asyncio.create_task(
            run_sipp(
                SIPP_DIR / "uac_peer_wait_bye.xml",
                bridge.address,
                cwd=SIPP_DIR,
                variables={"rtpport": str(peer.port)},
            )
        )
        await wait_for(lambda: any(c.state == "confirmed" for c in bridge.calls.values()), "ACK")
        [call] = bridge.calls.values()
        assert call.media is not None
        dest = (LOCAL, call.media.local_port)
        # 4.5 s of silence: more than twice the timeout, and the call must survive it.
        await stream(lambda d: peer.send_raw(d, dest), RtpPacketizer(0), SILENCE * 225)
        assert bridge.calls, bridge.ended
        last_rx = call.media.last_rx
        ok(await sipp)
        await wait_for(lambda: not bridge.calls, "call torn down")
    assert [r for _, r in bridge.ended] == ["no RTP for 2 s"]
    assert last_rx is not None and call.media.stats.received == 225


@pytest.mark.e2e
@pytest.mark.usefixtures("sipp")
async def test_maximum_call_duration_ends_a_live_call_with_bye() -> None:
    async with RtpPeer() as peer, bridge_and_gateway(max_call_s=1.5) as (bridge, events):
        sipp = asyncio.create_task(
            run_sipp(
                SIPP_DIR / "uac_peer_wait_bye.xml",
                bridge.address,
                cwd=SIPP_DIR,
                variables={"rtpport": str(peer.port)},
            )
        )
        await wait_for(lambda: any(c.state == "confirmed" for c in bridge.calls.values()), "ACK")
        [call] = bridge.calls.values()
        assert call.media is not None
        dest = (LOCAL, call.media.local_port)
        talker = asyncio.create_task(  # the caller is alive and talking throughout
            stream(lambda d: peer.send_raw(d, dest), RtpPacketizer(0), SILENCE * 500)
        )
        ok(await sipp)  # SIPp received the BYE and answered it
        talker.cancel()
        await wait_for(lambda: not bridge.calls, "call torn down")
        await asyncio.wait_for(events.server.servicer.wait_idle(), 10)
    assert [r for _, r in bridge.ended] == ["maximum call duration (1.5 s)"]
    assert bridge.stats["bye_sent"] == 1 and bridge.stats["rtp_timeout"] == 0


@pytest.mark.e2e
@pytest.mark.usefixtures("sipp")
async def test_session_timer_refreshed_by_the_caller_then_expired() -> None:
    """SIPp asks Session-Expires 3 s, checks our 200 honours it (refresher=uac, Require:
    timer), refreshes once with UPDATE, then stops refreshing: the bridge sends BYE."""
    async with bridge_and_gateway(min_se_s=2) as (bridge, _):
        res = await run_sipp(SIPP_DIR / "uac_timer_refresh.xml", bridge.address, cwd=SIPP_DIR)
        ok(res)
        await wait_for(lambda: not bridge.calls, "call torn down")
    assert [r for _, r in bridge.ended] == ["session timer expired (no refresh)"]
    assert bridge.stats["session_refreshed"] == 1 and bridge.stats["session_expired"] == 1


@pytest.mark.e2e
@pytest.mark.usefixtures("sipp")
async def test_session_timer_refreshed_by_the_bridge_with_reinvite() -> None:
    """The caller asks refresher=uas and allows no UPDATE: the bridge's re-INVITE must reach
    SIPp, and SIPp must see our ACK to its 200, or the scenario fails."""
    async with bridge_and_gateway(min_se_s=2) as (bridge, _):
        res = await run_sipp(SIPP_DIR / "uac_timer_uas.xml", bridge.address, cwd=SIPP_DIR)
        ok(res)
        await wait_for(lambda: not bridge.calls, "call torn down")
    assert [r for _, r in bridge.ended] == ["caller hung up (BYE)"]
    assert bridge.stats["session_refresh_sent"] >= 1
    assert bridge.stats["session_refresh_failed"] == 0


# --- symmetric RTP latch: a hijack attempt mid-call ---------------------------------------------


@pytest.mark.e2e
@pytest.mark.usefixtures("sipp")
async def test_rtp_from_another_source_mid_call_is_dropped(speech_dir: Path) -> None:
    """The latch holds: a stranger's RTP (another port) and the caller's own port with a
    forged SSRC get nothing and reach nothing; the real caller keeps hearing the bot."""
    speech = encode_wav(speech_dir / CLIP, pb.MULAW, 8000)
    greeting = "x" * 100  # 10 s of tone: the bot is talking throughout the attack
    bot = lambda: RecordingBot([], greeting)  # noqa: E731
    async with (
        RtpPeer() as caller,
        RtpPeer() as stranger,
        bridge_and_gateway(bot, hub=FakeToneHub()) as (bridge, events),
    ):
        sipp = asyncio.create_task(
            run_sipp(
                SIPP_DIR / "uac_peer_wait_bye.xml",
                bridge.address,
                cwd=SIPP_DIR,
                variables={"rtpport": str(caller.port)},
            )
        )
        await wait_for(lambda: any(c.state == "confirmed" for c in bridge.calls.values()), "ACK")
        [call] = bridge.calls.values()
        media = call.media
        assert media is not None
        dest = (LOCAL, media.local_port)
        own = RtpPacketizer(0)
        # The caller talks (silence) all along: it latches, and keeps the call alive.
        talker = asyncio.create_task(
            stream(lambda d: caller.send_raw(d, dest), own, SILENCE * 1000)
        )
        await wait_for(lambda: media.latch.source is not None, "latched")
        assert media.latch.source == (LOCAL, caller.port)
        await wait_for(lambda: len(caller.received) >= 10, "the greeting reaches the caller")
        before = len(caller.received)
        attack = speech[: 8000 * 2]  # 2 s of real speech: the VAD would fire if it got through

        async def forged() -> int:  # half a frame later: the two attacks interleave
            await asyncio.sleep(0.01)
            return await stream(lambda d: caller.send_raw(d, dest), RtpPacketizer(0), attack)

        n_stranger, n_forged = await asyncio.gather(
            stream(lambda d: stranger.send_raw(d, dest), RtpPacketizer(0), attack), forged()
        )
        await asyncio.sleep(0.3)  # let anything that got through reach the gateway's VAD
        during = len(caller.received) - before
        assert stranger.received == []  # not one packet of the bot's speech went to the stranger
        assert during >= 25, during  # the real caller kept hearing the bot
        assert media.latch.counts["foreign_source"] == n_stranger == 100
        assert media.latch.counts["foreign_ssrc"] == n_forged == 100
        assert events.speech(call.call_id) == []  # the injected speech never reached the gateway
        assert media.remote == (LOCAL, caller.port)
        # Control: the same speech from the real caller's stream is heard (the check can fail).
        talker.cancel()
        await stream(lambda d: caller.send_raw(d, dest), own, attack, start=1000)
        await wait_for(lambda: bool(events.speech(call.call_id)), "the caller's speech heard")
        call.end("test over", bye=True)
        ok(await sipp)
    assert events.speech(call.call_id)[0] == pb.SpeechEvent.SPEECH_BEGIN


# --- no media before the ACK: a spoofed INVITE must not turn the bridge into an amplifier --------


@pytest.mark.e2e
async def test_unconfirmed_invite_sends_no_rtp_to_its_c_address() -> None:
    """An INVITE whose SDP names a victim, never ACKed (one blind ACK with a guessed tag):
    the 200 is retransmitted on RFC 3261 timers, then the call is ended with BYE, and the
    victim gets zero packets. Control: the same INVITE properly ACKed does stream there."""
    bot = lambda: RecordingBot([], "x" * 50)  # noqa: E731
    async with (
        RtpPeer() as victim,
        RawSip() as spoofer,
        bridge_and_gateway(bot, hub=FakeToneHub(), t1_ms=50) as (bridge, events),
    ):
        spoofer.send(invite("spoof1", spoofer.port, (LOCAL, victim.port)), bridge.address)
        await wait_for(lambda: spoofer.final("spoof1") is not None, "the 200")
        final = spoofer.final("spoof1")
        assert final is not None and final[0].status == 200
        media = bridge.calls["spoof1"].media
        assert media is not None
        spoofer.send(ack("spoof1", spoofer.port, "<sip:bot@127.0.0.1>;tag=guess"), bridge.address)
        await wait_for(lambda: "spoof1" not in bridge.calls, "the unconfirmed call given up")
        assert list(bridge.ended) == [("spoof1", "no ACK within 64*T1")]
        msgs = spoofer.of_call("spoof1")
        assert sum(m.status == 200 for m in msgs) >= 5  # 64*T1 of retransmissions (T1 = 50 ms)
        assert {m.method for m in msgs if m.is_request} == {"BYE"}
        assert bridge.stats["ack_bad_tag"] == 1
        assert media.stats.sent == 0 and not media.armed
        assert victim.received == []
        await asyncio.wait_for(events.server.servicer.wait_idle(), 10)

        # Control: ACKed with the real To-tag, the same offer gets the greeting's RTP.
        spoofer.send(invite("legit1", spoofer.port, (LOCAL, victim.port)), bridge.address)
        await wait_for(lambda: spoofer.final("legit1") is not None, "the 200")
        final = spoofer.final("legit1")
        assert final is not None
        spoofer.send(ack("legit1", spoofer.port, final[0].get("To") or ""), bridge.address)
        await wait_for(lambda: len(victim.received) >= 5, "RTP after the ACK")
        bridge.calls["legit1"].end("test over", bye=False)
        await wait_for(lambda: not bridge.calls, "call torn down")


# --- Contact and request-URI validation ----------------------------------------------------------

BAD_CONTACTS = {
    "missing": None,
    "scheme": "<http://EVIL.example/x>",
    "long": "<sip:" + "EVIL" * 200 + "@h>",
    "space": "<sip:EVIL user@h>",
    "star": "*",
    "two": "<sip:EVIL@h>, <sip:EVIL2@h>",
    "port": "<sip:EVIL@h:99999>",
    "bracket": "<sip:EVIL@h>>",
    "quote": '<sip:EVIL"@h>',
}


@pytest.mark.e2e
async def test_bad_contacts_and_uris_get_a_short_refusal_and_bye_uses_the_contact() -> None:
    async with (
        RawSip() as caller,
        RtpPeer() as media_peer,
        bridge_and_gateway(max_call_s=0.5) as (bridge, _),
    ):
        rtp = (LOCAL, media_peer.port)
        for name, contact in BAD_CONTACTS.items():
            caller.send(invite(f"bad-{name}", caller.port, rtp, contact=contact), bridge.address)
        caller.send(invite("tel", caller.port, rtp, ruri="tel:+15551234"), bridge.address)
        caller.send(
            invite("ruri", caller.port, rtp, ruri="sip:" + "EVIL" * 200 + "@h"), bridge.address
        )
        ids = [f"bad-{n}" for n in BAD_CONTACTS] + ["tel", "ruri"]
        await wait_for(lambda: all(caller.final(i) for i in ids), "every refusal")
        for call_id in ids:
            final = caller.final(call_id)
            assert final is not None
            msg, raw = final
            want = 416 if call_id == "tel" else 400
            assert msg.status == want, (call_id, msg.status, msg.reason)
            assert len(msg.reason) <= 60, msg.reason
            assert b"EVIL" not in raw, (call_id, raw[:300])  # the input is never echoed
        assert bridge.stats["calls"] == 0 and not bridge.calls
        assert bridge.stats["bad_contact"] == len(BAD_CONTACTS)

        # A valid Contact with parameters: the BYE (here: maximum duration) goes to that URI.
        target = f"sip:caller@{LOCAL}:{caller.port};transport=udp"
        caller.send(invite("good", caller.port, rtp, contact=f'"Caller" <{target}>;expires=60'),
                    bridge.address)  # fmt: skip
        await wait_for(lambda: caller.final("good") is not None, "the 200")
        final = caller.final("good")
        assert final is not None and final[0].status == 200
        caller.send(ack("good", caller.port, final[0].get("To") or ""), bridge.address)
        await wait_for(lambda: any(m.method == "BYE" for m in caller.of_call("good")), "BYE")
        [bye] = [m for m in caller.of_call("good") if m.method == "BYE"]
        assert bye.uri == target
        caller.send(answer(bye), bridge.address)
        await wait_for(lambda: not bridge.calls, "call torn down")
    assert list(bridge.ended)[-1] == ("good", "maximum call duration (0.5 s)")


# --- unit: the latch -----------------------------------------------------------------------------

A = ("203.0.113.5", 4000)  # the caller's public address (trusted: INVITE came from there)


@pytest.mark.unit
def test_latch_trusted_source_latches_at_once_then_never_moves() -> None:
    latch = RtpLatch(frozenset({"203.0.113.5", "10.0.0.1"}))
    assert latch.check(A, 7, 100) == "latched"
    assert latch.check(A, 7, 101) == "accept"
    assert latch.check(("203.0.113.5", 4002), 7, 102) == "foreign_source"  # same host, other port
    assert latch.check(("198.51.100.9", 4000), 7, 103) == "foreign_source"
    assert latch.check(A, 8, 104) == "foreign_ssrc"
    for seq in range(200, 260):  # no amount of foreign traffic moves it
        latch.check(("198.51.100.9", 5000), 9, seq)
    assert latch.source == A and latch.ssrc == 7
    assert latch.check(A, 7, 105) == "accept"
    assert latch.counts["foreign_source"] == 62 and latch.counts["foreign_ssrc"] == 1


@pytest.mark.unit
def test_latch_untrusted_source_needs_consecutive_packets() -> None:
    """NAT that maps media to another public host still works; a stray packet does not latch."""
    other = ("198.51.100.9", 6000)
    latch = RtpLatch(frozenset({"10.0.0.1"}), probation=4)
    assert latch.check(other, 5, 10) == "probation"
    assert latch.check(other, 5, 12) == "probation"  # a gap restarts the count
    assert latch.check(other, 5, 13) == "probation"
    assert latch.check(("198.51.100.10", 6000), 5, 14) == "probation"  # another source: restart
    assert latch.source is None
    verdicts = [latch.check(other, 5, s) for s in (20, 21, 22, 23)]
    assert verdicts == ["probation", "probation", "probation", "latched"]
    assert latch.source == other
    # Sequence wrap-around counts as consecutive.
    wrap = RtpLatch(frozenset(), probation=3)
    assert [wrap.check(other, 1, s) for s in (65534, 65535, 0)][-1] == "latched"


@pytest.mark.unit
def test_latch_relearns_only_when_told() -> None:
    latch = RtpLatch(frozenset({"203.0.113.5"}))
    latch.check(A, 7, 1)
    latch.relearn(frozenset({"203.0.113.5"}), same_address=True)  # hold/resume, same media
    assert latch.check(("198.51.100.9", 4000), 9, 2) == "foreign_source"  # source kept
    assert latch.check(A, 9, 3) == "latched"  # a new SSRC from the same source is taken
    assert latch.check(A, 7, 4) == "foreign_ssrc"
    latch.relearn(frozenset({"198.51.100.20"}), same_address=False)  # moved to a new address
    assert latch.check(A, 9, 5) == "probation"  # the old host is no longer trusted
    assert latch.check(("198.51.100.20", 7000), 11, 6) == "latched"


# --- unit: session timer negotiation and URI validation -----------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize(
    ("se", "min_se", "supports", "want"),
    [
        (None, None, False, None),  # nobody asked, caller cannot refresh: no timer
        (None, None, True, (1800, "uac")),  # the caller can: we ask it to refresh
        ("600", None, True, (600, "uac")),
        ("600;refresher=uas", None, True, (600, "uas")),
        ("600;refresher=uac", None, False, (600, "uas")),  # a proxy asked; we must refresh
        ("7200", None, True, (1800, "uac")),  # lowered to ours, never raised
        ("7200", "3600", True, (3600, "uac")),  # but never below the caller's Min-SE
        (None, "2000", True, (2000, "uac")),
    ],
)
def test_session_timer_negotiation(
    se: str | None, min_se: str | None, supports: bool, want: tuple[int, str] | None
) -> None:
    got = negotiate_session_timer(se, min_se, uac_supports=supports, default_s=1800, min_se_s=90)
    assert (None if got is None else (got.interval_s, got.refresher)) == want


@pytest.mark.unit
def test_session_timer_refusals_and_deadlines() -> None:
    with pytest.raises(SessionIntervalTooSmall) as small:
        negotiate_session_timer("30", None, uac_supports=True, default_s=1800, min_se_s=90)
    assert small.value.min_se_s == 90
    with pytest.raises(SessionTimerError):
        negotiate_session_timer("soon", None, uac_supports=True, default_s=1800, min_se_s=90)
    st = negotiate_session_timer("90", None, uac_supports=True, default_s=1800, min_se_s=90)
    assert st is not None
    assert st.expire_after_s == 60 and st.refresh_after_s == 45  # RFC 4028 10: 90 - min(32, 30)
    assert st.response_headers() == [
        ("Session-Expires", "90;refresher=uac"),
        ("Require", "timer"),
    ]
    long = negotiate_session_timer("1800", None, uac_supports=True, default_s=1800, min_se_s=90)
    assert long is not None and long.expire_after_s == 1800 - 32


@pytest.mark.unit
@pytest.mark.parametrize(
    "uri",
    [
        "sip:alice@10.0.0.1:5062",
        "sips:bob@[2001:db8::1]:5061;transport=tls",
        "sip:gw.example.com",
        "SIP:a;day=tue@h.example.com?Subject=x",
        "sip:%61lice:secret@h:1",
    ],
)
def test_good_sip_uris(uri: str) -> None:
    assert parse_sip_uri(uri).text == uri


@pytest.mark.unit
@pytest.mark.parametrize(
    ("uri", "scheme_only"),
    [
        ("tel:+15551234", True),
        ("http://h/x", True),
        ("sip:a b@h", False),
        ("sip:a\r\nX-Injected: 1@h", False),
        ("sip:a@h:0", False),
        ("sip:a@h:65536", False),
        ("sip:a@-h-", False),
        ("sip:@h", False),
        ("sip:a@b@h", False),
        ("sip:a@[::1", False),
        ("sip:<a>@h", False),
        ("sip:a@h\x00", False),
        ("sip:é@h", False),
        ("sip:" + "a" * MAX_URI_CHARS + "@h", False),
        ("nocolon", False),
    ],
)
def test_bad_sip_uris(uri: str, scheme_only: bool) -> None:
    with pytest.raises(UriError) as info:
        parse_sip_uri(uri)
    assert info.value.unsupported_scheme == scheme_only
    assert len(str(info.value)) <= 40 and "a b" not in str(info.value)


@pytest.mark.unit
def test_contact_forms() -> None:
    assert contact_uri('"Alice, A." <sip:a@h:5062;ob>;expires=60').text == "sip:a@h:5062;ob"
    assert contact_uri("sip:a@h;expires=60").text == "sip:a@h"  # addr-spec: params are the header's
    for bad in (None, "", "*", "<sip:a@h>, <sip:b@h>", "<sip:a@h", "sip:a@h>", "<<sip:a@h>>"):
        with pytest.raises(UriError):
            contact_uri(bad)


# --- unit: the lifetime timers on a virtual clock ------------------------------------------------


class FakeConverse:
    """A stand-in for one gateway Converse stream (virtual-clock tests only: a real gRPC
    channel needs real time). Says ``started``, records requests, ends on hang-up. It has the
    grpc.aio call surface ``voxgate_client.Call`` uses, so the bridge's real client runs on it."""

    def __init__(self) -> None:
        self.requests: list[pb.ConverseRequest] = []
        self.cancelled = False
        self._inbox: asyncio.Queue[Any] = asyncio.Queue()
        self._inbox.put_nowait(pb.ConverseResponse(started=pb.SessionStarted()))

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        pass  # never ends with a status: it ends by EOF

    def done(self) -> bool:
        return self.cancelled

    async def write(self, req: pb.ConverseRequest) -> None:
        self.requests.append(req)

    async def read(self) -> Any:
        return await self._inbox.get()

    async def done_writing(self) -> None:
        self._inbox.put_nowait(grpc.aio.EOF)

    def cancel(self) -> None:
        self.cancelled = True
        self._inbox.put_nowait(grpc.aio.EOF)


class FakeStub:
    def __init__(self) -> None:
        self.streams: list[FakeConverse] = []

    def Converse(self, *args: Any, **kwargs: Any) -> FakeConverse:  # noqa: N802  # the gRPC name
        stream = FakeConverse()
        self.streams.append(stream)
        return stream


class TimedTransport:
    """Records every SIP datagram the bridge sends, with the (virtual) time it left."""

    def __init__(self) -> None:
        self.sent: list[tuple[float, SipMessage]] = []

    def sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        self.sent.append((asyncio.get_running_loop().time(), SipMessage.parse(data)))

    def close(self) -> None:
        pass

    def times(self, pred: Callable[[SipMessage], bool]) -> list[float]:
        return [round(t, 3) for t, m in self.sent if pred(m)]


SRC = ("127.0.0.1", 40000)


def virtual_bridge(**cfg: Any) -> tuple[SipBridge, TimedTransport, FakeStub]:
    config = BridgeConfig(listen_host=LOCAL, rtp_port_min=41000, rtp_port_max=41999, **cfg)
    transport, stub = TimedTransport(), FakeStub()
    client = VoxgateClient("127.0.0.1:9", stub=stub)  # never dialled: the fake stub answers
    bridge = SipBridge(config, SilentBot(), transport=transport, client=client)
    return bridge, transport, stub


async def until(pred: Callable[[], bool], what: str) -> None:
    for _ in range(100_000):  # virtual time (up to 1000 s): this costs no real waiting
        if pred():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def is_status(code: int) -> Callable[[SipMessage], bool]:
    return lambda m: m.status == code and m.cseq()[1] == "INVITE"


def is_method(name: str) -> Callable[[SipMessage], bool]:
    return lambda m: m.method == name


async def answered(
    bridge: SipBridge, transport: TimedTransport, extra: str = "", *, ack_it: bool = True
) -> tuple[float, str]:
    """INVITE (from SRC, SDP c=10.0.0.1:4000), wait for the 200, ACK it: (200's time, To)."""
    bridge.datagram_received(request("INVITE", body=offer(), extra=extra), SRC)
    await until(lambda: bool(transport.times(is_status(200))), "200 OK")
    t200, resp = next((t, m) for t, m in transport.sent if is_status(200)(m))
    to = resp.get("To") or ""
    if ack_it:
        ack_msg = request("ACK").replace(b"To: <sip:bot@127.0.0.1>", f"To: {to}".encode())
        bridge.datagram_received(ack_msg, SRC)
    return t200, to


def virtual(coro_fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
    run_virtual(coro_fn())


@pytest.mark.unit
def test_virtual_unacked_200_is_retransmitted_then_bye_and_no_rtp() -> None:
    async def body() -> None:
        bridge, transport, stub = virtual_bridge()
        t0, _ = await answered(bridge, transport, ack_it=False)
        call = bridge.calls["c1"]
        assert call.media is not None
        call.media.queue_audio(SILENCE * 50, last=True)  # reply audio is ready to go
        await until(lambda: bool(transport.times(is_method("BYE"))), "BYE")
        resent = [t - t0 for t in transport.times(is_status(200))]
        # RFC 3261 17.2.1: T1 = 0.5 s doubling to T2 = 4 s, for 64*T1 = 32 s.
        assert resent == pytest.approx([0, 0.5, 1.5, 3.5, 7.5, 11.5, 15.5, 19.5, 23.5, 27.5, 31.5])
        assert transport.times(is_method("BYE"))[0] - t0 == pytest.approx(32.0)
        assert call.media.stats.sent == 0  # not one RTP packet to the unverified c= address
        await until(lambda: not bridge.calls, "torn down")
        assert stub.streams[0].cancelled
        assert bridge.ended[-1] == ("c1", "no ACK within 64*T1")
        await bridge.aclose()

    virtual(body)


@pytest.mark.unit
def test_virtual_rtp_timeout_counts_from_the_ack_then_from_each_accepted_packet() -> None:
    async def body() -> None:
        bridge, transport, _ = virtual_bridge(rtp_timeout_s=30)
        await answered(bridge, transport)
        t_ack = asyncio.get_running_loop().time()
        call = bridge.calls["c1"]
        media = call.media
        assert media is not None and media.armed
        await asyncio.sleep(10)
        pk = RtpPacketizer(0)
        media.datagram_received(pk.packet(SILENCE, 0, marker=True).encode(), ("10.0.0.1", 4000))
        t_last = asyncio.get_running_loop().time()
        await asyncio.sleep(5)  # a stranger's packets do not count
        for i in range(20):
            pkt = RtpPacketizer(0).packet(SILENCE, i, marker=False)
            media.datagram_received(pkt.encode(), ("198.51.100.9", 4000))
        await until(lambda: bool(transport.times(is_method("BYE"))), "BYE")
        t_bye = transport.times(is_method("BYE"))[0]
        assert t_last - t_ack == pytest.approx(10, abs=0.01)
        assert t_bye - t_last == pytest.approx(30, abs=0.01)
        assert bridge.ended[-1] == ("c1", "no RTP for 30 s")
        assert media.stats.dropped_foreign == 20
        await bridge.aclose()

    virtual(body)


@pytest.mark.unit
def test_virtual_rtp_timeout_is_suspended_while_the_media_is_inactive() -> None:
    async def body() -> None:
        bridge, transport, stub = virtual_bridge(rtp_timeout_s=30, max_call_s=200)
        bridge.datagram_received(request("INVITE", body=offer(direction="inactive")), SRC)
        await until(lambda: bool(transport.times(is_status(200))), "200 OK")
        to = next(m for _, m in transport.sent if is_status(200)(m)).get("To") or ""
        bridge.datagram_received(
            request("ACK").replace(b"To: <sip:bot@127.0.0.1>", f"To: {to}".encode()), SRC
        )
        await until(lambda: bool(transport.times(is_method("BYE"))), "BYE")
        t200 = transport.times(is_status(200))[0]
        assert transport.times(is_method("BYE"))[0] - t200 == pytest.approx(200, abs=0.01)
        assert bridge.ended[-1] == ("c1", "maximum call duration (200 s)")
        # Meanwhile a silent frame every 10 s from the ACK (10 ... 190 s) kept the gateway's
        # idle timeout from ending it.
        audio = [r for r in stub.streams[0].requests if r.WhichOneof("event") == "audio"]
        assert len(audio) == 19 and {r.audio.data for r in audio} == {b"\xff" * 160}
        await bridge.aclose()

    virtual(body)


@pytest.mark.unit
def test_virtual_session_timer_expires_unless_the_caller_refreshes() -> None:
    async def body() -> None:
        bridge, transport, _ = virtual_bridge(rtp_timeout_s=3600)
        t200, to = await answered(bridge, transport, "Supported: timer\r\nSession-Expires: 90\r\n")
        ok_200 = next(m for _, m in transport.sent if is_status(200)(m))
        assert ok_200.get("Session-Expires") == "90;refresher=uac"
        assert ok_200.get("Require") == "timer"
        await asyncio.sleep(50 - (asyncio.get_running_loop().time() - t200))
        tag = to.rsplit("tag=", 1)[1]
        update = request(
            "UPDATE",
            branch="z9hG4bKupd",
            to_tag=tag,
            cseq=2,
            extra="Supported: timer\r\nSession-Expires: 90\r\n",
        )
        bridge.datagram_received(update, SRC)
        t_refresh = asyncio.get_running_loop().time()
        [upd_ok] = [m for _, m in transport.sent if m.status == 200 and m.cseq()[1] == "UPDATE"]
        assert upd_ok.get("Session-Expires") == "90;refresher=uac"
        await until(lambda: bool(transport.times(is_method("BYE"))), "BYE")
        # 90 - min(32, 90/3) = 60 s after the last refresh, not after the INVITE.
        assert transport.times(is_method("BYE"))[0] - t_refresh == pytest.approx(60, abs=0.01)
        assert bridge.ended[-1] == ("c1", "session timer expired (no refresh)")
        await bridge.aclose()

    virtual(body)


@pytest.mark.unit
def test_virtual_bridge_refreshes_with_update_and_a_481_ends_the_call() -> None:
    async def body() -> None:
        bridge, transport, _ = virtual_bridge(rtp_timeout_s=3600)
        extra = "Supported: timer\r\nSession-Expires: 90;refresher=uas\r\nAllow: INVITE, UPDATE\r\n"
        t200, _ = await answered(bridge, transport, extra)
        await until(lambda: len(transport.times(is_method("UPDATE"))) == 1, "first refresh")
        first = next(m for _, m in transport.sent if m.method == "UPDATE")
        assert first.get("Session-Expires") == "90;refresher=uas"
        assert first.uri == "sip:alice@10.0.0.1:5062"  # the caller's Contact
        bridge.datagram_received(answer(first), SRC)
        t_answered = asyncio.get_running_loop().time()
        await until(lambda: len(transport.times(is_method("UPDATE"))) == 2, "second refresh")
        second = [m for _, m in transport.sent if m.method == "UPDATE"][1]
        bridge.datagram_received(answer(second, 481), SRC)
        await until(lambda: bool(transport.times(is_method("BYE"))), "BYE")
        first_t, second_t = transport.times(is_method("UPDATE"))
        # Half the interval after the 200, then half the interval after the refresh's 2xx.
        assert first_t - t200 == pytest.approx(45, abs=0.01)
        assert second_t - t_answered == pytest.approx(45, abs=0.01)
        assert bridge.ended[-1] == ("c1", "session refresh (UPDATE) answered 481")
        await bridge.aclose()

    virtual(body)


@pytest.mark.unit
def test_virtual_session_interval_too_small_and_bad_headers() -> None:
    async def body() -> None:
        bridge, transport, _ = virtual_bridge()
        bridge.datagram_received(
            request("INVITE", body=offer(), extra="Supported: timer\r\nSession-Expires: 30\r\n"),
            SRC,
        )
        bridge.datagram_received(
            request(
                "INVITE", call_id="c2", branch="z9hG4bK2", body=offer(),
                extra="Session-Expires: soon\r\n",
            ),
            SRC,
        )  # fmt: skip
        bridge.datagram_received(
            request(
                "INVITE", call_id="c3", branch="z9hG4bK3", body=offer(),
                extra="Require: timer, 100rel, " + "x" * 5000 + "\r\n",
            ),
            SRC,
        )  # fmt: skip
        finals = [m for _, m in transport.sent if m.status is not None and m.status >= 200]
        assert [(m.call_id, m.status) for m in finals] == [("c1", 422), ("c2", 400), ("c3", 420)]
        assert finals[0].get("Min-SE") == "90"
        assert finals[2].get("Unsupported") == "100rel"  # bounded: the junk tag is not echoed
        assert not bridge.calls
        await bridge.aclose()

    virtual(body)


@pytest.mark.unit
def test_virtual_reinvite_with_new_media_is_the_only_thing_that_moves_the_latch() -> None:
    async def body() -> None:
        bridge, transport, _ = virtual_bridge(rtp_timeout_s=3600)
        _, to = await answered(bridge, transport)
        media = bridge.calls["c1"].media
        assert media is not None
        pk = RtpPacketizer(0)
        media.datagram_received(pk.packet(SILENCE, 0, marker=True).encode(), ("10.0.0.1", 4000))
        assert media.latch.source == ("10.0.0.1", 4000)
        tag = to.rsplit("tag=", 1)[1]
        # A refresh re-INVITE repeating the same SDP (same o= version): the latch stays.
        bridge.datagram_received(
            request("INVITE", branch="z9hG4bKr1", to_tag=tag, cseq=2, body=offer()), SRC
        )
        assert media.latch.source == ("10.0.0.1", 4000) and media.latch.ssrc == pk.ssrc
        # New media: a new o= version and address.
        moved = (
            offer().replace("o=- 1 1", "o=- 1 2").replace("c=IN IP4 10.0.0.1", "c=IN IP4 10.0.0.7")
        )
        bridge.datagram_received(
            request("INVITE", branch="z9hG4bKr2", to_tag=tag, cseq=3, body=moved), SRC
        )
        assert media.remote == ("10.0.0.7", 4000) and media.latch.source is None
        pk2 = RtpPacketizer(0)
        media.datagram_received(pk2.packet(SILENCE, 0, marker=True).encode(), ("10.0.0.7", 4000))
        assert media.latch.source == ("10.0.0.7", 4000)
        media.datagram_received(pk.packet(SILENCE, 1, marker=False).encode(), ("10.0.0.1", 4000))
        assert media.latch.counts["foreign_source"] == 1
        await bridge.aclose()

    virtual(body)
