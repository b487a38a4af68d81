"""Test harness for the SIP bridge: RTP and SIP peers, and runners for real third-party peers.

Real peers (tests and benchmarks start them on loopback, on free ports): SIPp (``sip-tester``),
Kamailio as a dispatcher proxy (``kamailio``, config in ``deploy/kamailio/``) and baresip as a
softphone (``baresip``). A missing binary raises :class:`FileNotFoundError` naming the Debian
package, so a test fails with the fix in its message instead of skipping.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import wave
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from voxgate.bridges.sip._message import (
    SipMessage,
    SipParseError,
    make_response,
    new_branch,
    new_tag,
    reply_address,
)
from voxgate.bridges.sip._rtp import DTMF_EVENTS, RtpError, RtpPacket, RtpPacketizer, dtmf_payload
from voxgate_client._common.aio import cancel_and_wait

__all__ = [
    "KAMAILIO_CFG",
    "Baresip",
    "Kamailio",
    "RtpPeer",
    "SipPeer",
    "SippResult",
    "free_udp_port",
    "need_binary",
    "run_sipp",
    "running_kamailio",
    "sipp_binary",
    "sipp_ports",
]

#: The proxy configuration shipped for deployments (and run as is by the tests).
KAMAILIO_CFG = Path(__file__).resolve().parents[2] / "deploy" / "kamailio" / "kamailio.cfg"


def need_binary(name: str, package: str) -> str:
    """The path of ``name``, or :class:`FileNotFoundError` saying which package provides it."""
    path = shutil.which(name) or next(
        (p for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}") if os.access(p, os.X_OK)), None
    )
    if path is None:
        raise FileNotFoundError(f"{name} not found: apt-get install -y {package}")
    return path


def free_tcp_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def free_udp_port(host: str = "127.0.0.1") -> int:
    """A UDP port that was free a moment ago (even, so RTP/RTCP pairs line up)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
        if port % 2 == 0 and port < 65534:
            return port
    raise OSError("no free even UDP port")


def sipp_ports(host: str = "127.0.0.1") -> tuple[int, int]:
    """A SIP port and a media base port for SIPp that were free a moment ago and do not overlap.

    SIPp binds the media base and the three ports above it (audio and video RTP and RTCP), so
    two independent picks can collide: a SIP port equal to the base + 2 makes SIPp fail to bind
    its video socket. All five are held at once while picking, so they are distinct and free.
    """
    for _ in range(50):
        with contextlib.ExitStack() as held:
            sip = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
            sip.bind((host, 0))
            base_sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
            base_sock.bind((host, 0))
            base = int(base_sock.getsockname()[1])
            if base % 2 or base + 3 > 65535:
                continue
            try:
                for p in range(base + 1, base + 4):
                    s = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_DGRAM))
                    s.bind((host, p))
            except OSError:
                continue
            return int(sip.getsockname()[1]), base
    raise OSError("no free UDP ports for SIPp")


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
    scenario: Path | str,
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
    """Run SIPp as the caller on 127.0.0.1 and wait for it (never longer than ``timeout_s``).

    ``scenario`` is a scenario file, or the name of one of SIPp's built-in scenarios
    (``"uac"``: INVITE, ACK, pause, BYE; it ignores Record-Route).
    """
    exe = sipp_binary()
    if exe is None:
        raise FileNotFoundError("sipp not found: apt-get install -y sip-tester")
    sip_port, media_base = sipp_ports()
    args = [
        f"{target[0]}:{target[1]}",
        *(["-sf", str(scenario)] if isinstance(scenario, Path) else ["-sn", scenario]),
        "-i", "127.0.0.1",
        "-p", str(sip_port),
        "-mi", "127.0.0.1",
        "-mp", str(media_port or media_base),
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


class SipPeer(asyncio.DatagramProtocol):
    """A scripted SIP endpoint on a loopback UDP port: a caller, a proxy hop or a target.

    It sends what a test builds and keeps everything that arrives, so a test can wait for a
    message by what it is (never by how long it takes). Use as ``async with SipPeer() as p:``.
    """

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = 0
        #: Every SIP message received, with its source, in arrival order.
        self.received: list[tuple[SipMessage, tuple[str, int]]] = []
        self._taken: set[int] = set()
        self._arrived = asyncio.Event()
        self._transport: asyncio.DatagramTransport | None = None

    async def __aenter__(self) -> SipPeer:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: self, local_addr=(self.host, 0))
        self._transport = transport
        self.port = int(transport.get_extra_info("sockname")[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    @property
    def address(self) -> tuple[str, int]:
        """(host, port) of this peer."""
        return self.host, self.port

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        """Keep every parseable SIP message."""
        with contextlib.suppress(SipParseError):
            self.received.append((SipMessage.parse(data), (str(addr[0]), int(addr[1]))))
            self._arrived.set()

    def send(self, msg: SipMessage | bytes, dest: tuple[str, int]) -> None:
        """Send one message (or raw bytes) to ``dest``."""
        assert self._transport is not None
        self._transport.sendto(msg if isinstance(msg, bytes) else msg.encode(), dest)

    def reply(
        self,
        req: SipMessage,
        source: tuple[str, int],
        status: int,
        reason: str,
        *,
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
        to_tag: str | None = None,
    ) -> SipMessage:
        """Answer a request the way a UA does (Via, From, To, Call-ID, CSeq copied)."""
        tag = to_tag if to_tag is not None else new_tag()
        resp = make_response(req, status, reason, source=source, to_tag=tag, headers=headers)
        resp.body = body
        self.send(resp, reply_address(req, source))
        return resp

    async def expect(
        self,
        pred: Callable[[SipMessage], bool],
        what: str,
        *,
        timeout_s: float = 15.0,
    ) -> tuple[SipMessage, tuple[str, int]]:
        """The first message not yet taken that matches ``pred`` (waits for it, bounded)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            for i, (msg, src) in enumerate(self.received):
                if i not in self._taken and pred(msg):
                    self._taken.add(i)
                    return msg, src
            self._arrived.clear()
            left = deadline - loop.time()
            if left <= 0:
                seen = [m.method or m.status for m, _ in self.received]
                raise AssertionError(f"never arrived: {what} (received {seen})")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._arrived.wait(), left)

    def request(
        self,
        method: str,
        uri: str,
        *,
        call_id: str,
        from_tag: str,
        to: str,
        cseq: int,
        headers: list[tuple[str, str]] | None = None,
        body: bytes = b"",
        content_type: str | None = None,
        contact: str | None = None,
    ) -> SipMessage:
        """A request from this peer (Via with ``rport``; Contact at this peer by default)."""
        req = SipMessage(method=method, uri=uri, body=body)
        req.add("Via", f"SIP/2.0/UDP {self.host}:{self.port};branch={new_branch()};rport")
        req.add("Max-Forwards", "70")
        req.add("From", f"<sip:peer@{self.host}:{self.port}>;tag={from_tag}")
        req.add("To", to)
        req.add("Call-ID", call_id)
        req.add("CSeq", f"{cseq} {method}")
        req.add("Contact", contact or f"<sip:peer@{self.host}:{self.port}>")
        for k, v in headers or []:
            req.add(k, v)
        if content_type is not None:
            req.add("Content-Type", content_type)
        return req


@dataclass(slots=True)
class Kamailio:
    """A running Kamailio proxy (see :func:`running_kamailio`)."""

    address: tuple[str, int]
    log_path: Path
    process: asyncio.subprocess.Process

    def log(self) -> str:
        """Everything Kamailio logged so far (for a failing test's message)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.asynccontextmanager
async def running_kamailio(
    bridges: Sequence[tuple[str, int]],
    workdir: Path,
    *,
    config: Path = KAMAILIO_CFG,
    ready_timeout_s: float = 30.0,
) -> AsyncIterator[Kamailio]:
    """Kamailio with ``deploy/kamailio/kamailio.cfg`` on a free loopback port, before ``bridges``.

    It is ready when it answers an OPTIONS ping (event-based, bounded by ``ready_timeout_s``).
    """
    exe = need_binary("kamailio", "kamailio")
    port = free_udp_port()
    ds, run, log_path = _kamailio_files(bridges, workdir)
    with log_path.open("wb") as log_file:
        proc = await asyncio.create_subprocess_exec(
            exe, "-f", str(config), "-DD", "-E",
            "-l", f"udp:127.0.0.1:{port}",
            "-A", f'DISPATCHER_LIST="{ds}"',
            "-Y", str(run), "-P", str(run / "kamailio.pid"),
            "-m", "64", "-M", "8",
            stdout=log_file, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    kam = Kamailio(("127.0.0.1", port), log_path, proc)
    try:
        await _wait_options(kam, ready_timeout_s)
        yield kam
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()


def _kamailio_files(bridges: Sequence[tuple[str, int]], workdir: Path) -> tuple[Path, Path, Path]:
    """The dispatcher list (set 1: the bridges), a runtime folder and the log file's path."""
    workdir.mkdir(parents=True, exist_ok=True)
    ds = workdir / "dispatcher.list"
    ds.write_text("".join(f"1 sip:{h}:{p} 0 0\n" for h, p in bridges))
    run = workdir / "kamailio-run"
    run.mkdir(exist_ok=True)
    return ds, run, workdir / "kamailio.log"


async def _wait_options(kam: Kamailio, timeout_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    async with SipPeer() as peer:
        n = 0
        while loop.time() < deadline:
            if kam.process.returncode is not None:
                raise RuntimeError(
                    f"kamailio exited {kam.process.returncode}:\n{kam.log()[-3000:]}"
                )
            n += 1
            ping = peer.request(
                "OPTIONS",
                f"sip:{kam.address[0]}:{kam.address[1]}",
                call_id=f"ready-{n}",
                from_tag=new_tag(),
                to=f"<sip:{kam.address[0]}:{kam.address[1]}>",
                cseq=n,
            )
            peer.send(ping, kam.address)
            cid = ping.call_id

            def answered(m: SipMessage, cid: str = cid) -> bool:
                return m.status == 200 and m.call_id == cid

            with contextlib.suppress(AssertionError):
                await peer.expect(answered, "OPTIONS 200", timeout_s=0.5)
                return
    raise RuntimeError(f"kamailio did not answer OPTIONS in {timeout_s:g} s:\n{kam.log()[-3000:]}")


def write_wav_8k(path: Path, pcm16: bytes) -> None:
    """Mono 16-bit 8 kHz WAV (what baresip's aufile source plays on a G.711 call)."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(pcm16)


class Baresip:
    """baresip 1.x as a softphone caller, driven over its ``ctrl_tcp`` JSON interface.

    It plays ``source_wav`` as its microphone (``aufile``) and writes what it hears, decoded,
    to a WAV (``sndfile``: ``dump-*-dec.wav`` in ``workdir``). Commands are baresip's own
    (``dial``, ``hangup``, ``hold``, ``resume``, ``sndcode``); its call events are kept so a
    test waits for ``CALL_ESTABLISHED``/``CALL_CLOSED`` instead of sleeping.
    """

    def __init__(self, workdir: Path, source_wav: Path, *, user: str = "caller") -> None:
        self.workdir = workdir
        self.source_wav = source_wav
        self.user = user
        self.sip_port = free_udp_port()
        self.ctrl_port = free_tcp_port()
        self.events: list[dict[str, Any]] = []
        self._responses: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._event = asyncio.Event()
        self._token = 0
        self.process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._pump: asyncio.Task[None] | None = None
        self.log_path = workdir / "baresip.log"

    def _write_config(self) -> Path:
        conf = self.workdir / "baresip"
        conf.mkdir(parents=True, exist_ok=True)
        modules = ["g711.so", "aufile.so", "sndfile.so", "ctrl_tcp.so", "aubridge.so"]
        lines = [
            "poll_method epoll",
            f"sip_listen 127.0.0.1:{self.sip_port}",
            f"audio_source aufile,{self.source_wav}",
            "audio_player aubridge,nowhere",
            "audio_alert aubridge,nowhere",
            "audio_level no",
            "ausrc_format s16",
            "auplay_format s16",
            "rtp_tos 0",
            "rtcp_mux no",
            "jitter_buffer_delay 5-10",
            f"module_path {self.module_path()}",
            *(f"module {m}" for m in modules),
            "module_app account.so",
            "module_app menu.so",
            f"ctrl_tcp_listen 127.0.0.1:{self.ctrl_port}",
            f"snd_path {self.workdir}",
        ]
        (conf / "config").write_text("\n".join(lines) + "\n")
        (conf / "accounts").write_text(
            f"<sip:{self.user}@127.0.0.1:{self.sip_port}>;regint=0;audio_codecs=PCMU/8000/1\n"
        )
        (conf / "contacts").write_text("")
        return conf

    @staticmethod
    def module_path() -> str:
        """Where the Debian package puts baresip's modules."""
        for p in ("/usr/lib/baresip/modules", "/usr/local/lib/baresip/modules"):
            if Path(p, "ctrl_tcp.so").exists():
                return p
        raise FileNotFoundError("baresip modules not found: apt-get install -y baresip")

    async def __aenter__(self) -> Baresip:
        exe = need_binary("baresip", "baresip")
        conf = self._write_config()
        with self.log_path.open("wb") as log_file:
            self.process = await asyncio.create_subprocess_exec(
                exe, "-f", str(conf), "-v",
                stdin=asyncio.subprocess.DEVNULL, stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
            )  # fmt: skip
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while True:
            try:
                self._reader, self._writer = await asyncio.open_connection(
                    "127.0.0.1", self.ctrl_port
                )
                break
            except OSError:
                if self.process.returncode is not None or loop.time() > deadline:
                    raise RuntimeError(f"baresip did not start:\n{self.log()[-3000:]}") from None
                await asyncio.sleep(0.1)
        self._pump = asyncio.create_task(self._read_loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._pump is not None:
            await cancel_and_wait(self._pump)
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()

    def log(self) -> str:
        """The console output of baresip so far (for a failing test's message)."""
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def _read_loop(self) -> None:
        assert self._reader is not None
        while True:
            head = await self._reader.readuntil(b":")
            size = int(head[:-1])
            data = await self._reader.readexactly(size + 1)  # the payload and its ','
            msg = json.loads(data[:-1])
            if msg.get("event"):
                self.events.append(msg)
                self._event.set()
            elif msg.get("response"):
                fut = self._responses.pop(str(msg.get("token", "")), None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)

    async def command(self, command: str, params: str = "") -> dict[str, Any]:
        """Run one baresip command; its JSON response (``ok``, ``data``)."""
        assert self._writer is not None
        self._token += 1
        token = str(self._token)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._responses[token] = fut
        body = json.dumps({"command": command, "params": params, "token": token}).encode()
        self._writer.write(str(len(body)).encode() + b":" + body + b",")
        await self._writer.drain()
        return await asyncio.wait_for(fut, 15)

    async def wait_event(self, kind: str, *, timeout_s: float = 30.0) -> dict[str, Any]:
        """The first call event of type ``kind`` (e.g. ``CALL_ESTABLISHED``), waiting for it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            for ev in self.events:
                if ev.get("type") == kind:
                    return ev
            self._event.clear()
            left = deadline - loop.time()
            if left <= 0:
                kinds = [e.get("type") for e in self.events]
                raise AssertionError(f"baresip never reported {kind} (events {kinds})")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), left)

    def recordings(self) -> list[Path]:
        """The WAVs of what this phone heard (one per call)."""
        return sorted(self.workdir.glob("dump-*-dec.wav"))
