"""Test harness for the SIP bridge: a Python RTP peer and a SIPp runner (tests and benchmarks)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clients.sip._rtp import DTMF_EVENTS, RtpError, RtpPacket, RtpPacketizer, dtmf_payload

__all__ = ["RtpPeer", "SippResult", "free_udp_port", "run_sipp", "sipp_binary"]


def free_udp_port(host: str = "127.0.0.1") -> int:
    """A UDP port that was free a moment ago (even, so RTP/RTCP pairs line up)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port % 2 == 0 and port < 65534:
            return port
    raise OSError("no free even UDP port")


@dataclass(slots=True)
class _Received:
    at_s: float
    packet: RtpPacket


class RtpPeer(asyncio.DatagramProtocol):
    """The caller's media endpoint: sends audio/DTMF like a phone and records what arrives.

    Use as ``async with RtpPeer() as peer:``; ``peer.port`` goes into the caller's SDP.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.port = port
        self.received: list[_Received] = []
        self._transport: asyncio.DatagramTransport | None = None
        self._audio = RtpPacketizer(0)
        self._dtmf_ts = 0
        self.arrived = asyncio.Event()

    async def __aenter__(self) -> RtpPeer:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: self, local_addr=(self.host, self.port)
        )
        self._transport = transport
        self.port = int(transport.get_extra_info("sockname")[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        """Record every RTP packet with its arrival time (loop clock)."""
        with contextlib.suppress(RtpError):
            pkt = RtpPacket.parse(data)
            self.received.append(_Received(asyncio.get_running_loop().time(), pkt))
            self.arrived.set()

    def send_raw(self, data: bytes, dest: tuple[str, int]) -> None:
        """Send one datagram as is."""
        assert self._transport is not None
        self._transport.sendto(data, dest)

    async def send_audio(
        self, payload: bytes, dest: tuple[str, int], *, payload_type: int = 0, frame: int = 160
    ) -> None:
        """Stream G.711 bytes as 20 ms packets on an absolute clock."""
        loop = asyncio.get_running_loop()
        self._audio.payload_type = payload_type
        t0 = loop.time()
        for i in range(0, len(payload), frame):
            await asyncio.sleep(max(0.0, t0 + (i // frame) * 0.02 - loop.time()))
            pkt = self._audio.packet(payload[i : i + frame], i // frame, marker=i == 0)
            self.send_raw(pkt.encode(), dest)

    async def send_dtmf(
        self, digits: str, dest: tuple[str, int], *, payload_type: int = 101, press_ms: int = 100
    ) -> None:
        """Send RFC 4733 events: updates every 20 ms, then the end packet three times."""
        pk = RtpPacketizer(payload_type, ssrc=self._audio.ssrc)
        tick = 0
        for digit in digits:
            event = DTMF_EVENTS.index(digit)
            steps = max(1, press_ms // 20)
            ts_tick = tick
            for step in range(1, steps + 1):
                end = step == steps
                payload = dtmf_payload(event, end=end, duration=step * 160)
                for _ in range(3 if end else 1):
                    pkt = pk.packet(payload, ts_tick, marker=step == 1)
                    self.send_raw(pkt.encode(), dest)
                await asyncio.sleep(0.02)
                tick += 1
            tick += 5
            await asyncio.sleep(0.1)


@dataclass(slots=True)
class SippResult:
    """How a SIPp run ended."""

    returncode: int
    stdout: str
    stderr: str
    args: list[str] = field(default_factory=list)

    def explain(self) -> str:
        """Everything needed to see why a run failed."""
        return (
            f"sipp {' '.join(self.args)}\nrc={self.returncode}\n--- stdout\n{self.stdout[-3000:]}"
            f"\n--- stderr\n{self.stderr[-3000:]}"
        )


def sipp_binary() -> str | None:
    """Path of the ``sipp`` executable (Debian/Ubuntu package ``sip-tester``), or None."""
    return shutil.which("sipp")


async def run_sipp(
    scenario: Path,
    target: tuple[str, int],
    *,
    cwd: Path,
    calls: int = 1,
    rate: int = 10,
    duration_ms: int = 1000,
    media_port: int | None = None,
    variables: dict[str, str] | None = None,
    extra: Sequence[str] = (),
    timeout_s: float = 30.0,
) -> SippResult:
    """Run SIPp as the caller on 127.0.0.1 and wait for it (never longer than ``timeout_s``)."""
    exe = sipp_binary()
    if exe is None:
        raise FileNotFoundError("sipp not found: apt-get install -y sip-tester")
    args = [
        f"{target[0]}:{target[1]}",
        "-sf", str(scenario),
        "-i", "127.0.0.1",
        "-p", str(free_udp_port()),
        "-mi", "127.0.0.1",
        "-mp", str(media_port or free_udp_port()),
        "-m", str(calls),
        "-l", str(calls),
        "-r", str(rate),
        "-d", str(duration_ms),
        "-nostdin",
        "-timeout", f"{int(timeout_s)}s",
        "-timeout_error",
        "-trace_err",
        *extra,
    ]  # fmt: skip
    for k, v in (variables or {}).items():
        args += ["-set", k, v]
    proc = await asyncio.create_subprocess_exec(
        exe,
        *args,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s + 10)
    except TimeoutError:
        proc.kill()
        out, err = await proc.communicate()
    rc = proc.returncode if proc.returncode is not None else -1
    return SippResult(rc, out.decode(errors="replace"), err.decode(errors="replace"), args)
