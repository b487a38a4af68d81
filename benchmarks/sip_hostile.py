"""Hostile and vanished SIP peers against the bridge: what leaks, what is amplified, what is held.

Three measurements over real UDP on loopback, against a real in-process gateway with the tone
voice (a stand-in for VITS, so the bridge has reply audio to send) and a bot that greets:

* ``spoofed c=``: an INVITE whose SDP names a victim's RTP port, never ACKed; the packets and
  bytes the victim receives in ``--window`` seconds (amplification of one INVITE);
* ``hijack``: a caller latched and talking, then one RTP packet (and then a stream) from
  another port; the bot's packets that reach the stranger and the caller afterwards;
* ``vanished``: ``--calls`` answered calls whose callers then send nothing (no RTP, no BYE);
  how many are still up, holding gateway streams, ``--hold`` seconds later.

    python -m benchmarks.sip_hostile [--window 6] [--calls 8] [--hold 5] [--rtp-timeout 2]

The bridge options this needs (``rtp_timeout_s``) are passed only when the bridge has them, so
the same script measures an older bridge for comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from typing import Any

from voxgate.bridges.bots import TurnBot
from voxgate.bridges.sip import BridgeConfig, SipBridge
from voxgate.bridges.sip._message import SipMessage, SipParseError
from voxgate.bridges.sip._rtp import RtpPacketizer
from voxgate.bridges.sip.testing import RtpPeer
from voxgate.gateway.testing.fake_engines import FakeToneHub
from voxgate.gateway.testing.server import running_server

LOCAL = "127.0.0.1"
SILENCE = b"\xff" * 160


class Greeter(TurnBot):
    """Greets with 10 s of tone; says nothing else."""

    greeting = "x" * 100


class RawSip(asyncio.DatagramProtocol):
    """A bare SIP endpoint: sends what it is told, keeps what it receives, answers nothing."""

    def __init__(self) -> None:
        self.messages: list[SipMessage] = []
        self.port = 0
        self.transport: Any = None

    async def open(self) -> RawSip:
        loop = asyncio.get_running_loop()
        self.transport, _ = await loop.create_datagram_endpoint(lambda: self, local_addr=(LOCAL, 0))
        self.port = int(self.transport.get_extra_info("sockname")[1])
        return self

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        with contextlib.suppress(SipParseError):
            self.messages.append(SipMessage.parse(data))

    def final(self, call_id: str) -> SipMessage | None:
        return next(
            (m for m in self.messages if m.call_id == call_id and (m.status or 0) >= 200), None
        )


def invite(call_id: str, sip_port: int, rtp_port: int) -> bytes:
    sdp = (
        f"v=0\r\no=c 1 1 IN IP4 {LOCAL}\r\ns=-\r\nc=IN IP4 {LOCAL}\r\nt=0 0\r\n"
        f"m=audio {rtp_port} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
    )
    return (
        f"INVITE sip:bot@{LOCAL} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {LOCAL}:{sip_port};branch=z9hG4bK{call_id};rport\r\n"
        f"From: <sip:c@{LOCAL}>;tag=t{call_id}\r\nTo: <sip:bot@{LOCAL}>\r\nCall-ID: {call_id}\r\n"
        f"CSeq: 1 INVITE\r\nContact: <sip:c@{LOCAL}:{sip_port}>\r\nMax-Forwards: 70\r\n"
        f"Content-Type: application/sdp\r\nContent-Length: {len(sdp)}\r\n\r\n{sdp}"
    ).encode()


def ack(call_id: str, sip_port: int, to: str) -> bytes:
    return (
        f"ACK sip:bot@{LOCAL} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {LOCAL}:{sip_port};branch=z9hG4bKa{call_id};rport\r\n"
        f"From: <sip:c@{LOCAL}>;tag=t{call_id}\r\nTo: {to}\r\nCall-ID: {call_id}\r\n"
        "CSeq: 1 ACK\r\nMax-Forwards: 70\r\nContent-Length: 0\r\n\r\n"
    ).encode()


async def until(pred: Any, limit_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + limit_s
    while not pred():
        if loop.time() > end:
            raise TimeoutError("the bridge never got there")
        await asyncio.sleep(0.02)


async def answered_call(bridge: SipBridge, sip: RawSip, call_id: str, rtp_port: int) -> str:
    """INVITE, wait for the 200, ACK it with its To-tag; returns the To header."""
    sip.transport.sendto(invite(call_id, sip.port, rtp_port), bridge.address)
    await until(lambda: sip.final(call_id) is not None)
    final = sip.final(call_id)
    assert final is not None and final.status == 200, final
    to = final.get("To") or ""
    sip.transport.sendto(ack(call_id, sip.port, to), bridge.address)
    return to


def bridge_config(target: str, rtp_timeout_s: float) -> BridgeConfig:
    extra: dict[str, Any] = {}
    if "rtp_timeout_s" in BridgeConfig.model_fields:
        extra["rtp_timeout_s"] = rtp_timeout_s
    return BridgeConfig(
        listen_host=LOCAL,
        listen_port=0,
        gateway=target,
        rtp_port_min=45000,
        rtp_port_max=49999,
        **extra,
    )


async def spoofed(bridge: SipBridge, window_s: float) -> dict[str, float]:
    sip = await RawSip().open()
    async with RtpPeer() as victim:
        sip.transport.sendto(invite("spoof", sip.port, victim.port), bridge.address)
        await asyncio.sleep(window_s)
        got = list(victim.received)
    sip.transport.close()
    return {
        "packets": len(got),
        "bytes": sum(12 + len(r.packet.payload) for r in got),
        "byes": sum(m.method == "BYE" for m in sip.messages),
    }


async def hijack(bridge: SipBridge) -> dict[str, float]:
    sip = await RawSip().open()
    async with RtpPeer() as caller, RtpPeer() as stranger:
        await answered_call(bridge, sip, "hijack", caller.port)
        call = bridge.calls["hijack"]
        await until(lambda: call.media is not None)
        assert call.media is not None
        dest = (LOCAL, call.media.local_port)
        own = RtpPacketizer(0)
        loop = asyncio.get_running_loop()

        async def talk(peer: RtpPeer, pk: RtpPacketizer, seconds: float, start: int) -> None:
            t0 = loop.time()
            for n in range(int(seconds / 0.02)):
                await asyncio.sleep(max(0.0, t0 + n * 0.02 - loop.time()))
                peer.send_raw(pk.packet(SILENCE, start + n, marker=n == 0).encode(), dest)

        await talk(caller, own, 1.0, 0)  # latched, hearing the greeting
        at_attack = len(caller.received)
        # One packet from another port, then both keep sending for 1.5 s.
        stranger.send_raw(RtpPacketizer(0).packet(SILENCE, 0, marker=True).encode(), dest)
        await asyncio.sleep(0.5)
        after_one = len(stranger.received)
        await asyncio.gather(
            talk(caller, own, 1.5, 100), talk(stranger, RtpPacketizer(0), 1.5, 100)
        )
        result = {
            "to_stranger_after_1_pkt": after_one,
            "to_stranger": len(stranger.received),
            "to_caller_after_attack": len(caller.received) - at_attack,
        }
        call.end("benchmark over", bye=False)
    sip.transport.close()
    return result


async def vanished(bridge: SipBridge, calls: int, hold_s: float) -> dict[str, float]:
    sip = await RawSip().open()
    async with RtpPeer() as media:
        for i in range(calls):
            await answered_call(bridge, sip, f"gone{i}", media.port)
        await until(
            lambda: sum(c.call_id.startswith("gone") for c in bridge.calls.values()) == calls
        )
        await asyncio.sleep(hold_s)
        alive = sum(c.call_id.startswith("gone") for c in bridge.calls.values())
        for c in list(bridge.calls.values()):
            c.end("benchmark over", bye=False)
    sip.transport.close()
    return {"answered": calls, f"still_up_after_{hold_s:g}s": alive}


async def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--window", type=float, default=6.0, help="spoofed c=: seconds observed")
    ap.add_argument("--calls", type=int, default=8, help="vanished: calls answered")
    ap.add_argument("--hold", type=float, default=5.0, help="vanished: seconds later")
    ap.add_argument("--rtp-timeout", type=float, default=2.0, help="the bridge's rtp_timeout_s")
    args = ap.parse_args(argv)
    results: dict[str, dict[str, float]] = {}
    async with running_server(hub=FakeToneHub()) as srv:
        bridge = SipBridge(bridge_config(srv.target, args.rtp_timeout), Greeter())
        await bridge.start()
        try:
            results["spoofed c="] = await spoofed(bridge, args.window)
            results["hijack"] = await hijack(bridge)
            results["vanished"] = await vanished(bridge, args.calls, args.hold)
        finally:
            await bridge.aclose()
    has_timeout = "rtp_timeout_s" in BridgeConfig.model_fields
    print(
        f"bridge rtp_timeout_s: {args.rtp_timeout:g} s" if has_timeout else "bridge: no RTP timeout"
    )
    print(f"{'case':<12} {'measure':<26} {'value':>8}")
    for case, row in results.items():
        for k, v in row.items():
            print(f"{case:<12} {k:<26} {v:>8g}")
    return results


if __name__ == "__main__":
    asyncio.run(main())
