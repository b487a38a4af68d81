"""One call's RTP endpoint: a UDP socket, jitter-buffered playout and a 20 ms paced sender."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import socket
from collections.abc import Callable
from dataclasses import dataclass, field

from voxgate.bridges.sip._rtp import (
    FRAME_SAMPLES,
    DtmfDecoder,
    DtmfEvent,
    JitterBuffer,
    RtpError,
    RtpLatch,
    RtpPacket,
    RtpPacketizer,
)
from voxgate_client._common.aio import cancel_and_wait

__all__ = ["MediaStats", "RtpSession", "bind_rtp_socket"]

log = logging.getLogger("voxgate.sip.rtp")

FRAME_S = 0.020
FRAME_BYTES = FRAME_SAMPLES
#: G.711 silence (the code for sample value 0).
SILENCE = {"PCMU": 0xFF, "PCMA": 0xD5}
#: A sender further behind its schedule than this re-anchors instead of bursting to catch up.
_MAX_LAG_S = 0.1


def bind_rtp_socket(host: str, port_min: int, port_max: int, *, tries: int = 50) -> socket.socket:
    """A UDP socket on a random even port in [port_min, port_max] (RTP takes even ports)."""
    last: OSError | None = None
    for _ in range(tries):
        port = random.randrange(port_min, port_max + 1) & ~1 if port_max > port_min else port_min
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            last = exc
            continue
        sock.setblocking(False)
        return sock
    raise OSError(f"no free RTP port in {port_min}-{port_max} after {tries} tries: {last}")


@dataclass(slots=True)
class MediaStats:
    """Counters of one RTP session (the benchmark reads the send-timing ones).

    Attributes:
        sent: packets sent.
        talk_spurts: packets sent with the marker bit.
        max_lateness_ms: worst delay of a send after its scheduled 20 ms slot.
        max_interval_dev_ms: worst deviation from 20 ms between consecutive packets of a spurt.
        intervals_ms: those intervals (the first 10 000).
        received: audio packets received.
        dtmf: key presses decoded.
        latched: times the send address was learned from received packets (once per call,
            again only after a re-INVITE with new media).
        dropped_foreign: packets dropped by the latch (another source or SSRC, or an
            untrusted source still on probation).
    """

    sent: int = 0
    talk_spurts: int = 0
    max_lateness_ms: float = 0.0
    max_interval_dev_ms: float = 0.0
    intervals_ms: list[float] = field(default_factory=list)
    received: int = 0
    dtmf: int = 0
    latched: int = 0
    dropped_foreign: int = 0

    def p99_interval_dev_ms(self) -> float:
        """99th percentile of |interval - 20 ms| between packets of a spurt (0 if none)."""
        if not self.intervals_ms:
            return 0.0
        devs = sorted(abs(i - FRAME_S * 1000) for i in self.intervals_ms)
        return devs[min(len(devs) - 1, int(0.99 * len(devs)))]


class RtpSession(asyncio.DatagramProtocol):
    """RTP for one call.

    Received audio is reordered by a :class:`JitterBuffer` and delivered to ``on_audio`` every
    packet duration, after ``jitter_ms`` of buffering at the start of each burst; lost packets
    become silence. Outgoing audio is queued with :meth:`queue_audio` and sent as 160-byte
    frames on an absolute 20 ms grid (``loop.time()`` based, so sleeps never accumulate drift),
    with the marker bit on the first packet of each talk spurt.

    Nothing is sent before :meth:`arm` (the bridge arms on the caller's ACK: an INVITE nobody
    confirmed must not make us stream to the address in its SDP); audio queued before that
    waits. Received packets pass an :class:`~voxgate.bridges.sip._rtp.RtpLatch` first: the call's
    RTP source and SSRC are learned once, then packets from anywhere else are dropped, and with
    ``symmetric`` the send address is the latched source. :attr:`last_rx` (loop time of the
    last accepted packet) is what the bridge's RTP inactivity timeout reads.

    Callbacks run on the event loop and must not block.

    Args:
        sock: bound UDP socket (see :func:`bind_rtp_socket`); the session owns it.
        encoding: ``"PCMU"`` or ``"PCMA"``.
        payload_type: the negotiated audio payload type.
        dtmf_payload_type: telephone-event payload type, or None.
        remote: the SDP's c=/m= address.
        on_audio: called with each played-out frame's bytes.
        on_dtmf: called with each decoded key press.
        jitter_ms: receive buffering at the start of a burst (40-80 ms is typical).
        symmetric: send to where the caller's (latched) RTP comes from (NAT traversal).
        out_prebuffer_ms: outgoing audio held before a spurt starts, to absorb gateway jitter.
        trusted_hosts: hosts besides the SDP address whose first packet latches at once (the
            host the INVITE came from: behind NAT, RTP comes from there, not from ``c=``).
        latch_probation: consecutive packets any other host needs to latch.
    """

    def __init__(
        self,
        sock: socket.socket,
        *,
        encoding: str,
        payload_type: int,
        dtmf_payload_type: int | None,
        remote: tuple[str, int],
        on_audio: Callable[[bytes], None],
        on_dtmf: Callable[[DtmfEvent], None],
        jitter_ms: int = 60,
        symmetric: bool = True,
        out_prebuffer_ms: int = 40,
        trusted_hosts: frozenset[str] = frozenset(),
        latch_probation: int = 4,
    ) -> None:
        self._sock = sock
        self.local_port: int = sock.getsockname()[1]
        self.encoding = encoding
        self.payload_type = payload_type
        self.dtmf_payload_type = dtmf_payload_type
        self.remote = remote
        self.sdp_remote = remote
        self.sending_enabled = True
        self._trusted = trusted_hosts
        self.latch = RtpLatch(trusted_hosts | {remote[0]}, latch_probation)
        #: Loop time of the last packet the latch accepted (None: none yet).
        self.last_rx: float | None = None
        self._armed = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_audio = on_audio
        self._on_dtmf = on_dtmf
        self._jitter_s = jitter_ms / 1000
        self._symmetric = symmetric
        self._prebuffer_s = out_prebuffer_ms / 1000
        self._silence = bytes([SILENCE.get(encoding, 0xFF)])
        self._jb = JitterBuffer(max_depth=max(4, math.ceil(jitter_ms / 20) + 4))
        self._dtmf = DtmfDecoder()
        self._packetizer = RtpPacketizer(payload_type)
        self._transport: asyncio.DatagramTransport | None = None
        self._rx = asyncio.Event()
        self._tx = asyncio.Event()
        self._out = bytearray()
        self._out_last = False  # the queued audio ends a Speak: pad its tail
        self._last_frame_bytes = FRAME_BYTES
        self._tasks: list[asyncio.Task[None]] = []
        self.stats = MediaStats()

    async def start(self) -> None:
        """Attach the socket to the loop and start the playout and send clocks."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        transport, _ = await loop.create_datagram_endpoint(lambda: self, sock=self._sock)
        self._transport = transport
        self._tasks = [
            asyncio.create_task(self._playout(), name="rtp-playout"),
            asyncio.create_task(self._sender(), name="rtp-send"),
        ]

    def arm(self) -> None:
        """Allow sending (the dialog is confirmed); audio queued so far goes out now."""
        self._armed.set()

    @property
    def armed(self) -> bool:
        """True once :meth:`arm` was called."""
        return self._armed.is_set()

    def relearn(self, remote: tuple[str, int]) -> None:
        """New media from a re-INVITE/UPDATE: send to ``remote`` and open the latch again.

        The same SDP address keeps the latched source (a hold/resume may restart the SSRC, so
        the next SSRC from that source is taken); a new one learns the source again.
        """
        same = remote == self.sdp_remote
        self.sdp_remote = remote
        if not same:
            self.remote = remote
        self.latch.relearn(self._trusted | {remote[0]}, same_address=same)

    async def aclose(self) -> None:
        """Stop the clocks and close the socket."""
        await cancel_and_wait(*self._tasks)
        for t in self._tasks:  # a clock that failed (a bug) still fails the close
            if not t.cancelled() and (exc := t.exception()) is not None:
                raise exc
        self._tasks = []
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        else:
            self._sock.close()

    # -- receive ----------------------------------------------------------------------------------

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        """Parse, latch, and route a packet to the DTMF decoder or the jitter buffer."""
        try:
            pkt = RtpPacket.parse(data)
        except RtpError:
            return  # stray or malformed datagram (RTCP arrives on the next port, not here)
        if 72 <= pkt.payload_type <= 76:
            return  # RTCP sent to the RTP port (RFC 5761 range): not media, and no SSRC to learn
        src = (str(addr[0]), int(addr[1]))
        negotiated = pkt.payload_type in (self.payload_type, self.dtmf_payload_type)
        if not negotiated and self.latch.source is None:
            return  # an unnegotiated format (comfort noise, ...) never teaches the latch
        verdict = self.latch.check(src, pkt.ssrc, pkt.sequence)
        if verdict not in ("accept", "latched"):
            self.stats.dropped_foreign += 1
            n = self.stats.dropped_foreign
            if n == 1 or n % 500 == 0:  # the header only: never the payload
                log.debug(
                    "RTP from %s:%d ssrc %08x dropped (%s; %d so far)", *src, pkt.ssrc, verdict, n
                )
            return
        if verdict == "latched":
            log.info("RTP latched to %s:%d ssrc %08x", *src, pkt.ssrc)
            if self._symmetric and src != self.remote:
                log.info(
                    "RTP sent to %s:%d, not the SDP's %s:%d (symmetric RTP)", *src, *self.remote
                )
                self.remote = src
                self.stats.latched += 1
        if self._loop is not None:
            self.last_rx = self._loop.time()
        if self.dtmf_payload_type is not None and pkt.payload_type == self.dtmf_payload_type:
            for ev in self._dtmf.push(pkt):
                self.stats.dtmf += 1
                self._on_dtmf(ev)
            return
        if pkt.payload_type != self.payload_type or not pkt.payload:
            return  # comfort noise or an unnegotiated format
        self.stats.received += 1
        self._jb.push(pkt)
        self._rx.set()

    def error_received(self, exc: Exception) -> None:
        """ICMP port unreachable and the like: the peer may come back; keep going."""
        log.debug("RTP socket error: %s", exc)

    async def _playout(self) -> None:
        loop = asyncio.get_running_loop()
        next_t = loop.time()
        while True:
            if self._jb.empty:
                self._rx.clear()
                await self._rx.wait()
                next_t = loop.time() + self._jitter_s  # hold the burst's start for the delay
            await asyncio.sleep(max(0.0, next_t - loop.time()))
            if self._jb.empty:
                continue  # burst ended while we waited
            payload = self._jb.pop()
            if payload is None:
                payload = self._silence * self._last_frame_bytes
            else:
                self._last_frame_bytes = len(payload)
            self._on_audio(payload)
            next_t += len(payload) / 8000
            if loop.time() - next_t > _MAX_LAG_S:
                next_t = loop.time()

    # -- send -------------------------------------------------------------------------------------

    def queue_audio(self, data: bytes, *, last: bool = False) -> None:
        """Queue audio for the caller; ``last`` marks the end of a Speak (its tail is padded)."""
        if not self.sending_enabled:
            return
        self._out += data
        self._out_last = last
        self._tx.set()

    def clear(self) -> None:
        """Drop all queued outgoing audio now (barge-in)."""
        self._out.clear()
        self._out_last = False

    @property
    def queued_ms(self) -> int:
        """Outgoing audio waiting to be sent."""
        return len(self._out) // 8

    async def _sender(self) -> None:
        loop = asyncio.get_running_loop()
        await self._armed.wait()
        t0 = loop.time()
        tick = 0
        spurt = False
        prev_sent = 0.0
        while True:
            if len(self._out) < FRAME_BYTES and not (self._out and self._out_last):
                spurt = False
                self._tx.clear()
                await self._tx.wait()
                # Start on the first grid slot after the pre-buffer: the timestamp stays on the
                # call's 20 ms grid across silences.
                tick = max(tick, math.ceil((loop.time() + self._prebuffer_s - t0) / FRAME_S))
            due = t0 + tick * FRAME_S
            await asyncio.sleep(max(0.0, due - loop.time()))
            if not self._out:
                continue  # cleared (barge-in) while waiting
            if len(self._out) < FRAME_BYTES:
                if not self._out_last:
                    continue  # underrun mid-Speak: wait for more (new spurt)
                self._out += self._silence * (FRAME_BYTES - len(self._out))
                self._out_last = False
            frame = bytes(self._out[:FRAME_BYTES])
            del self._out[:FRAME_BYTES]
            pkt = self._packetizer.packet(frame, tick, marker=not spurt)
            if self._transport is not None and self.sending_enabled:
                self._transport.sendto(pkt.encode(), self.remote)
            now = loop.time()
            st = self.stats
            st.sent += 1
            st.max_lateness_ms = max(st.max_lateness_ms, (now - due) * 1000)
            if spurt:
                dev = abs((now - prev_sent) * 1000 - FRAME_S * 1000)
                st.max_interval_dev_ms = max(st.max_interval_dev_ms, dev)
                if len(st.intervals_ms) < 10_000:
                    st.intervals_ms.append((now - prev_sent) * 1000)
            else:
                st.talk_spurts += 1
            spurt = True
            prev_sent = now
            tick += 1
            if now - (t0 + tick * FRAME_S) > _MAX_LAG_S:  # the loop stalled: skip missed slots
                tick = math.ceil((now - t0) / FRAME_S)
                spurt = False
