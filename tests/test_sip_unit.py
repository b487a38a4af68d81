"""SIP bridge pieces without a network: messages, transactions, SDP, RTP, jitter, DTMF, bots."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import struct
from pathlib import Path

import pytest

from voxgate.bridges.bots import BotFileError
from voxgate.bridges.sip import BridgeConfig, EchoBot, RuleBot, SilentBot, SipBridge, load_bot
from voxgate.bridges.sip._message import (
    SipMessage,
    SipParseError,
    Via,
    make_response,
    reply_address,
)
from voxgate.bridges.sip._rtp import (
    DtmfDecoder,
    JitterBuffer,
    RtpError,
    RtpPacket,
    RtpPacketizer,
    dtmf_payload,
)
from voxgate.bridges.sip._sdp import build_answer, event_list, negotiate, parse_events, parse_sdp
from voxgate.bridges.sip.cli import add_sip_arguments, run_sip
from voxgate.bridges.sip.testing import sipp_ports
from voxgate.gateway.testing.virtual_time import run_virtual

pytestmark = pytest.mark.unit

SRC = ("127.0.0.1", 40000)


def request(
    method: str = "OPTIONS",
    *,
    branch: str = "z9hG4bK1",
    call_id: str = "c1",
    to_tag: str | None = None,
    cseq: int = 1,
    body: str = "",
    extra: str = "",
) -> bytes:
    to = "<sip:bot@127.0.0.1>" + (f";tag={to_tag}" if to_tag else "")
    head = (
        f"{method} sip:bot@127.0.0.1 SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 10.0.0.1:5062;branch={branch};rport\r\n"
        f'From: "Alice" <sip:alice@10.0.0.1>;tag=a1\r\nTo: {to}\r\n'
        f"Call-ID: {call_id}\r\nCSeq: {cseq} {method}\r\n"
        "Contact: <sip:alice@10.0.0.1:5062>\r\nMax-Forwards: 70\r\n"
        f"{extra}Content-Length: {len(body.encode())}\r\n\r\n"
    )
    return (head + body).encode()


def offer(formats: str = "0 8 101", rtpmap: str = "", direction: str = "") -> str:
    lines = [
        "v=0",
        "o=- 1 1 IN IP4 10.0.0.1",
        "s=-",
        "c=IN IP4 10.0.0.1",
        "t=0 0",
        f"m=audio 4000 RTP/AVP {formats}",
        "a=rtpmap:101 telephone-event/8000",
        *([rtpmap] if rtpmap else []),
        *([f"a={direction}"] if direction else []),
    ]
    return "\r\n".join(lines) + "\r\n"


# --- messages ------------------------------------------------------------------------------------


def test_parse_request_with_compact_headers_folding_and_multi_via() -> None:
    raw = (
        b"\r\nINVITE sip:bot@h SIP/2.0\r\n"
        b"v: SIP/2.0/UDP a:1;branch=z9hG4bKx, SIP/2.0/UDP b;branch=z9hG4bKy\r\n"
        b"f: <sip:a@h>;tag=9\r\nt: <sip:b@h>\r\ni: abc\r\nCSeq: 7 INVITE\r\n"
        b"Subject: hello\r\n  world\r\nl: 4\r\n\r\nbodyEXTRA"
    )
    msg = SipMessage.parse(raw)
    assert msg.method == "INVITE" and msg.uri == "sip:bot@h"
    assert [v.host for v in msg.vias()] == ["a", "b"]
    assert msg.vias()[0].port == 1 and msg.vias()[1].port is None
    assert msg.call_id == "abc" and msg.cseq() == (7, "INVITE")
    assert msg.get("subject") == "hello world"
    assert msg.body == b"body"  # Content-Length wins over trailing bytes


def test_serialise_round_trip_recomputes_content_length() -> None:
    msg = SipMessage.parse(request("INVITE", body=offer()))
    msg.body = b"x"
    again = SipMessage.parse(msg.encode())
    assert again.body == b"x" and again.get("Content-Length") == "1"
    assert again.headers[:5] == msg.headers[:5]


@pytest.mark.parametrize(
    ("raw", "answerable"),
    [
        (b"", False),
        (b"\xff\xfe garbage", False),
        (b"INVITE sip:x SIP/3.0\r\n\r\n", False),
        (b"SIP/2.0 99 Weird\r\n\r\n", False),
        (request().replace(b"Call-ID: c1\r\n", b""), False),
        (request().replace(b"CSeq: 1 OPTIONS", b"CSeq: x OPTIONS"), True),
        (request().replace(b"CSeq: 1 OPTIONS", b"CSeq: 1 BYE"), True),
        (request().replace(b"Content-Length: 0", b"Content-Length: 99"), True),
        (request().replace(b"Via: SIP/2.0/UDP", b"Via: SIP/2.0"), False),
    ],
)
def test_malformed_messages_raise_parse_errors(raw: bytes, answerable: bool) -> None:
    with pytest.raises(SipParseError) as info:
        SipMessage.parse(raw)
    assert (info.value.message is not None) == answerable


def test_response_copies_headers_adds_tag_and_rport() -> None:
    req = SipMessage.parse(request())
    resp = make_response(req, 200, "OK", source=("192.0.2.9", 33333), to_tag="t1")
    via = Via.parse(resp.get_all("Via")[0])
    assert via.params["rport"] == "33333" and via.params["received"] == "192.0.2.9"
    assert resp.get("To") == "<sip:bot@127.0.0.1>;tag=t1"
    assert resp.get("From") == req.get("From") and resp.get("CSeq") == "1 OPTIONS"
    assert reply_address(req, ("192.0.2.9", 33333)) == ("192.0.2.9", 33333)
    no_rport = SipMessage.parse(request().replace(b";rport", b""))
    assert reply_address(no_rport, ("192.0.2.9", 33333)) == ("192.0.2.9", 5062)


# --- transactions on a bridge with a fake transport ----------------------------------------------


class FakeTransport:
    def __init__(self) -> None:
        self.sent: list[tuple[SipMessage, tuple[str, int]]] = []

    def sendto(self, data: bytes, addr: tuple[str, int]) -> None:
        self.sent.append((SipMessage.parse(data), addr))

    def close(self) -> None:
        pass

    def statuses(self) -> list[int | None]:
        return [m.status for m, _ in self.sent]


def offline_bridge(**cfg: object) -> tuple[SipBridge, FakeTransport]:
    """A bridge that was never started: no gateway, so INVITEs end in 503."""
    config = BridgeConfig(listen_host="127.0.0.1", rtp_port_min=40000, rtp_port_max=40999, **cfg)
    fake = FakeTransport()
    return SipBridge(config, SilentBot(), transport=fake), fake


async def calls_ended(bridge: SipBridge, timeout_s: float) -> None:
    """Wait until every call of the bridge has been torn down (its supervisor is done with it)."""
    for _ in range(int(timeout_s / 0.01)):
        if not bridge.calls:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"calls still up after {timeout_s:g} s: {sorted(bridge.calls)}")


async def test_retransmitted_request_is_answered_from_the_cache() -> None:
    bridge, fake = offline_bridge()
    bridge.datagram_received(request(), SRC)
    bridge.datagram_received(request(), SRC)
    bridge.datagram_received(request(branch="z9hG4bK2"), SRC)
    assert fake.statuses() == [200, 200, 200]
    first, again, other = (m for m, _ in fake.sent)
    assert first.encode() == again.encode()  # byte-identical, same To-tag
    assert first.get("To") != other.get("To")
    assert bridge.stats["retransmission_in"] == 1
    await bridge.aclose()


async def test_unknown_dialog_requests_get_481() -> None:
    bridge, fake = offline_bridge()
    bridge.datagram_received(request("BYE", to_tag="nope"), SRC)
    bridge.datagram_received(request("CANCEL", branch="z9hG4bKnone"), SRC)
    bridge.datagram_received(request("INVITE", to_tag="nope", body=offer()), SRC)
    assert fake.statuses() == [481, 481, 481]
    await bridge.aclose()


def test_invite_gets_100_at_once_and_488_without_a_common_codec() -> None:
    async def body() -> None:
        bridge, fake = offline_bridge()
        g729 = offer("18", "a=rtpmap:18 G729/8000")
        bridge.datagram_received(request("INVITE", body=g729), SRC)
        assert fake.statuses() == [100, 488]
        resp = fake.sent[1][0]
        assert resp.get("To") is not None and ";tag=" in (resp.get("To") or "")
        # The INVITE retransmitted: the cached 488 again. The ACK (same branch) stops resending:
        # nothing more leaves in the 64*T1 the 488 would otherwise be resent for (virtual time).
        bridge.datagram_received(request("INVITE", body=g729), SRC)
        assert fake.statuses()[-1] == 488
        bridge.datagram_received(request("ACK"), SRC)
        await asyncio.sleep(64 * 0.5 + 1)
        assert fake.statuses() == [100, 488, 488]
        assert bridge.stats["retransmitted"] == 0
        assert bridge.stats["calls"] == 0
        await bridge.aclose()

    run_virtual(body())


async def test_over_capacity_and_gateway_down_are_refused_with_retry_after() -> None:
    bridge, fake = offline_bridge()
    bridge.datagram_received(request("INVITE", body=offer()), SRC)
    await calls_ended(bridge, 5)
    assert fake.statuses() == [100, 503]  # no gateway channel
    assert fake.sent[-1][0].get("Retry-After") == "5"
    bridge.stop_accepting()
    bridge.datagram_received(request("INVITE", call_id="c2", body=offer()), SRC)
    assert fake.statuses()[-1] == 503
    await bridge.aclose()


async def test_options_require_and_unknown_methods() -> None:
    bridge, fake = offline_bridge()
    bridge.datagram_received(request(extra="Require: 100rel\r\n"), SRC)
    bridge.datagram_received(request("REGISTER", branch="z9hG4bK9"), SRC)
    bridge.datagram_received(b"\r\n\r\n", SRC)  # keep-alive: ignored
    assert fake.statuses() == [420, 405]
    assert fake.sent[0][0].get("Unsupported") == "100rel"
    await bridge.aclose()


# --- SDP ----------------------------------------------------------------------------------------


def test_sdp_prefers_the_offer_order_and_keeps_telephone_event() -> None:
    choice = negotiate(parse_sdp(offer("8 0 101").encode()))
    assert choice is not None
    assert (choice.payload_type, choice.encoding, choice.dtmf_payload_type) == (8, "PCMA", 101)
    assert choice.remote == ("10.0.0.1", 4000) and choice.direction == "sendrecv"
    answer = build_answer(choice, "127.0.0.1", 30000, session_id=5, version=1).decode()
    assert "m=audio 30000 RTP/AVP 8 101" in answer
    assert "a=rtpmap:8 PCMA/8000" in answer and "a=ptime:20" in answer
    assert "a=rtpmap:101 telephone-event/8000" in answer


def _dtmf_lines(answer: str) -> list[str]:
    return [ln for ln in answer.splitlines() if "101" in ln]


@pytest.mark.parametrize(
    ("fmtp", "answered"),
    [
        ("0-15", "0-15"),  # baresip's offer
        ("0-16", "0-15"),  # 16 (flash) is not handled: the answer must not claim it
        ("0-11", "0-11"),  # a keypad without A-D: never more than was offered
        ("0-9,11, 14-255", "0-9,11,14-15"),
        (None, "0-15"),  # no fmtp line: RFC 4733's default, 0-15
    ],
)
def test_sdp_answers_the_telephone_events_both_sides_handle(
    fmtp: str | None, answered: str
) -> None:
    sdp = offer("0 101", f"a=fmtp:101 {fmtp}" if fmtp is not None else "")
    choice = negotiate(parse_sdp(sdp.encode()))
    assert choice is not None and choice.dtmf_payload_type == 101
    answer = build_answer(choice, "127.0.0.1", 30000, session_id=5, version=1).decode()
    assert "m=audio 30000 RTP/AVP 0 101" in answer
    assert _dtmf_lines(answer) == [
        "m=audio 30000 RTP/AVP 0 101",
        "a=rtpmap:101 telephone-event/8000",
        f"a=fmtp:101 {answered}",
    ]


@pytest.mark.parametrize("fmtp", ["16", "32-40", "junk"])
def test_sdp_leaves_out_telephone_event_when_no_offered_event_is_handled(fmtp: str) -> None:
    choice = negotiate(parse_sdp(offer("8 101", f"a=fmtp:101 {fmtp}").encode()))
    assert choice is not None and choice.encoding == "PCMA"
    assert choice.dtmf_payload_type is None and not choice.dtmf_events
    answer = build_answer(choice, "127.0.0.1", 30000, session_id=5, version=1).decode()
    assert "m=audio 30000 RTP/AVP 8\r\n" in answer
    assert "telephone-event" not in answer and "fmtp" not in answer


def test_event_lists_round_trip() -> None:
    assert parse_events("0-15") == frozenset(range(16))
    assert parse_events(" 0-3 ,7,9-8,300, x-1") == {0, 1, 2, 3, 7}  # bad parts skipped
    assert event_list(frozenset({0, 1, 2, 3, 7, 9, 10})) == "0-3,7,9-10"
    assert event_list(frozenset({5})) == "5"


def test_sdp_dynamic_pcmu_hold_and_rejections() -> None:
    dyn = negotiate(parse_sdp(offer("96", "a=rtpmap:96 PCMU/8000").encode()))
    assert dyn is not None and (dyn.payload_type, dyn.encoding) == (96, "PCMU")
    hold = negotiate(parse_sdp(offer(direction="sendonly").encode()))
    assert hold is not None and hold.direction == "recvonly" and not hold.we_send
    assert negotiate(parse_sdp(offer("18 101").encode())) is None  # G.729 only → 488
    assert negotiate(parse_sdp(offer("8 101").encode()), prefer="PCMU") is None
    kept = negotiate(parse_sdp(offer("8 0").encode()), prefer="PCMU")
    assert kept is not None and kept.encoding == "PCMU"
    assert negotiate(parse_sdp(offer().replace("m=audio 4000", "m=audio 0").encode())) is None


# --- RTP ----------------------------------------------------------------------------------------


def test_rtp_round_trip_and_header_extras() -> None:
    pkt = RtpPacket(0, 65535, 2**32 - 1, 0xDEADBEEF, b"\x01" * 160, marker=True)
    assert RtpPacket.parse(pkt.encode()) == pkt
    # One CSRC, a one-word extension and 2 bytes of padding around a 3-byte payload.
    raw = struct.pack("!BBHII", 0xB1, 8, 1, 2, 3) + b"CSRC" + b"\xbe\xde\x00\x01XXXX"
    parsed = RtpPacket.parse(raw + b"abc" + b"\x00\x02")
    assert (parsed.payload_type, parsed.payload, parsed.marker) == (8, b"abc", False)
    for bad in (b"", b"\x00" * 12, struct.pack("!BBHII", 0x8F, 0, 0, 0, 0)):
        with pytest.raises(RtpError):
            RtpPacket.parse(bad)


def test_packetizer_numbers_packets_on_the_20ms_grid() -> None:
    p = RtpPacketizer(0)
    a = p.packet(b"x" * 160, 0, marker=True)
    b = p.packet(b"x" * 160, 1, marker=False)
    c = p.packet(b"x" * 160, 10, marker=True)  # after 160 ms of silence: new talk spurt
    assert (b.sequence - a.sequence) % 65536 == 1 and (c.sequence - b.sequence) % 65536 == 1
    assert (b.timestamp - a.timestamp) % 2**32 == 160
    assert (c.timestamp - a.timestamp) % 2**32 == 1600
    assert a.ssrc == b.ssrc and a.marker and c.marker and not b.marker


def pkt(seq: int, ssrc: int = 1, payload: bytes | None = None) -> RtpPacket:
    return RtpPacket(0, seq & 0xFFFF, seq * 160, ssrc, payload or bytes([seq & 0xFF]) * 160)


def drain(jb: JitterBuffer) -> list[int | None]:
    out: list[int | None] = []
    while not jb.empty:
        p = jb.pop()
        out.append(None if p is None else p[0])
    return out


def test_jitter_buffer_reorders_and_drops_duplicates() -> None:
    jb = JitterBuffer()
    for s in (11, 10, 12, 12, 14, 13):
        jb.push(pkt(s))
    assert drain(jb) == [10, 11, 12, 13, 14]
    assert jb.stats["duplicate"] == 1


def test_jitter_buffer_reports_loss_as_none_and_drops_late_packets() -> None:
    jb = JitterBuffer()
    for s in (1, 2, 4, 5):
        jb.push(pkt(s))
    assert drain(jb) == [1, 2, None, 4, 5]
    jb.push(pkt(3))  # arrives after its slot was played as silence
    assert jb.empty and jb.stats["late"] == 1 and jb.stats["lost"] == 1


def test_jitter_buffer_handles_wrap_ssrc_change_and_restart() -> None:
    jb = JitterBuffer()
    for s in (65534, 65535, 65536, 65537):
        jb.push(pkt(s))
    assert drain(jb) == [254, 255, 0, 1]
    jb.push(pkt(500, ssrc=2))  # a new source (e.g. after a transfer)
    jb.push(pkt(501, ssrc=2))
    jb.push(pkt(2, ssrc=1))  # a straggler of the old source
    assert drain(jb) == [500 & 0xFF, 501 & 0xFF]
    jb.push(pkt(5000, ssrc=2))  # a jump far beyond max_gap: the sender restarted
    assert drain(jb) == [5000 & 0xFF]
    assert jb.stats["restart"] == 2


def test_jitter_buffer_bounds_its_depth() -> None:
    jb = JitterBuffer(max_depth=4)
    for s in range(10):
        jb.push(pkt(s))
    assert drain(jb) == [6, 7, 8, 9]
    assert jb.stats["overflow"] == 6


# --- DTMF ---------------------------------------------------------------------------------------


def dtmf_pkt(event: int, ts: int, duration: int, *, end: bool, seq: int = 0) -> RtpPacket:
    return RtpPacket(101, seq, ts, 7, dtmf_payload(event, end=end, duration=duration))


def test_dtmf_reports_each_press_once() -> None:
    dec = DtmfDecoder()
    out = []
    for step in (1, 2, 3, 4, 5):
        out += dec.push(dtmf_pkt(1, 1000, step * 160, end=False))
    for _ in range(3):
        out += dec.push(dtmf_pkt(1, 1000, 960, end=True))
    out += dec.push(dtmf_pkt(11, 5000, 160, end=False))  # '#', its end packets all lost
    out += dec.push(dtmf_pkt(10, 9000, 800, end=True))  # '*'
    assert [(e.digit, e.duration_ms) for e in out] == [("1", 120), ("#", 20), ("*", 100)]


# --- bots and CLI -------------------------------------------------------------------------------


def test_rule_bot_file(tmp_path: Path) -> None:
    f = tmp_path / "bot.yaml"
    f.write_text(
        "greeting: Hello there\n"
        "rules:\n"
        "  - if: [opening hours, when are you open]\n"
        "    say: Nine to five.\n"
        "  - if: bye\n"
        "    say: Goodbye!\n"
        "dtmf:\n  '1': You pressed one.\n"
    )
    bot = load_bot(str(f))
    assert isinstance(bot, RuleBot)
    assert bot.greeting == "Hello there"
    assert bot.reply("What are your Opening Hours?") == "Nine to five."
    assert bot.reply("maybe") is None  # "bye" only matches as a whole word
    assert bot.reply("OK, bye.") == "Goodbye!"
    assert bot.on_dtmf("1") == "You pressed one." and bot.on_dtmf("2") is None
    assert isinstance(load_bot("echo"), EchoBot)
    assert EchoBot().reply(" hi ") == "hi"
    none = load_bot("none")
    assert isinstance(none, SilentBot) and none.reply("hi") is None
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - say: no condition\n")
    with pytest.raises(BotFileError, match=r"rule 1: give exactly one of `if`, `if_says`"):
        load_bot(str(bad))
    with pytest.raises(BotFileError, match="expected none, echo, sample, a YAML rules file"):
        load_bot(str(tmp_path / "missing.yaml"))
    assert load_bot("grpc://127.0.0.1:5070") == "127.0.0.1:5070"
    with pytest.raises(BotFileError, match="expected grpc://host:port"):
        load_bot("grpc://nowhere")
    assert isinstance(RuleBot.from_dict({}), RuleBot)


def test_the_call_bot_file_answers_phone_calls_too() -> None:
    """v0.1: the README's `voxgate sip --bot bridges/sample_bot.yaml` exited with
    "rules[0] needs `if` and `say`": the two bot YAML schemas differed."""
    bot = load_bot("bridges/sample_bot.yaml")
    assert isinstance(bot, RuleBot)
    assert bot.greeting == "Hello! You are through to the voxgate demo line. Go ahead."
    assert bot.reply("Ask what you can do for your country.") == (
        "Thank you, Mister President. I will ask what I can do for my country."
    )
    assert (bot.reply("the printed books of the time") or "").startswith("Block books")
    assert bot.reply("Pardon?") == "Sorry, I did not catch that. You said: Pardon?"


def test_the_readme_sip_command_starts_with_the_sample_bot() -> None:
    """The README's documented command, with a free port instead of 5060."""
    import os
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "voxgate.cli",
            "sip",
            "--listen",
            "127.0.0.1:0",
            "--gateway",
            "127.0.0.1:50051",
            "--bot",
            "bridges/sample_bot.yaml",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("sip listening on 127.0.0.1:"), (
            line,
            proc.stderr.read() if proc.poll() is not None and proc.stderr else "",
        )
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0


async def test_cli_flags_and_bad_bot_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_sip_arguments(parser)
    args = parser.parse_args(
        ["--listen", "127.0.0.1:0", "--gateway", "h:1", "--ring-ms", "200", "--bot", "nope"]
    )
    assert args.listen == ("127.0.0.1", 0) and args.ring_ms == 200
    assert await run_sip(args) == 2
    assert "expected none, echo, sample, a YAML rules file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser.parse_args(["--listen", "nohost"])


# --- fuzz ---------------------------------------------------------------------------------------


def mutate(rng: random.Random, seed: bytes) -> bytes:
    data = bytearray(seed)
    op = rng.randrange(6)
    if op == 0:
        for _ in range(rng.randint(1, 10)):
            data[rng.randrange(len(data))] = rng.randrange(256)
    elif op == 1:
        data = data[: rng.randrange(len(data))]
    elif op == 2:
        data = bytearray(rng.randbytes(rng.randint(0, 400)))
    elif op == 3:
        lines = bytes(data).split(b"\r\n")
        rng.shuffle(lines)
        data = bytearray(b"\r\n".join(lines))
    elif op == 4:
        i = rng.randrange(len(data))
        data[i:i] = rng.choice([b";", b":", b"\r\n", b"<", b">", b"\x00", b"=" * 50, b"\xc3"])
    else:
        data = data.replace(b"Content-Length: ", b"Content-Length: 9" * rng.randint(1, 3))
    return bytes(data)


async def test_fuzzed_datagrams_never_escape_and_the_bridge_still_answers() -> None:
    rng = random.Random(1234)
    seeds = [
        request(),
        request("INVITE", body=offer()),
        request("BYE", to_tag="x"),
        request("CANCEL"),
        request("ACK", to_tag="x"),
        b"SIP/2.0 200 OK\r\n" + request().split(b"\r\n", 1)[1],
    ]
    bridge, fake = offline_bridge(max_calls=5)
    for i in range(3000):
        data = mutate(rng, rng.choice(seeds))
        # Only the parsers' own errors may come out of them.
        with contextlib.suppress(SipParseError):
            SipMessage.parse(data)
        with contextlib.suppress(RtpError):
            RtpPacket.parse(data)
        bridge.datagram_received(data, SRC)
        if i % 200 == 0:
            await asyncio.sleep(0)  # let any call supervisors (all end in 503) run
    await calls_ended(bridge, 10)
    assert bridge.stats["internal_error"] == 0
    assert bridge.stats["malformed"] > 100
    fake.sent.clear()
    bridge.datagram_received(request(branch="z9hG4bKafter"), SRC)
    assert fake.statuses() == [200]
    await bridge.aclose()


def test_sipp_ports_never_overlap_the_media_block() -> None:
    """SIPp binds the media base and the three ports above it; the SIP port must be none of them.

    A SIP port equal to the media base + 2 once made SIPp fail to bind its video socket.
    """
    for _ in range(200):
        sip, base = sipp_ports()
        assert base % 2 == 0
        assert sip not in range(base, base + 4)
