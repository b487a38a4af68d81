"""RTP (RFC 3550) packets, a receive jitter buffer and RFC 4733 DTMF, all pure and synchronous.

Nothing here touches sockets or clocks: the media session (``_media.py``) owns those, so every
rule below is tested step by step.
"""

from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "DTMF_EVENTS",
    "DtmfDecoder",
    "DtmfEvent",
    "JitterBuffer",
    "LatchVerdict",
    "RtpError",
    "RtpLatch",
    "RtpPacket",
    "RtpPacketizer",
    "dtmf_payload",
]

_HEADER = struct.Struct("!BBHII")
#: RFC 4733 event codes 0-15 → keypad characters.
DTMF_EVENTS = "0123456789*#ABCD"
#: Samples per 20 ms frame at 8 kHz (and bytes, for G.711).
FRAME_SAMPLES = 160


class RtpError(ValueError):
    """A datagram is not an RTP version 2 packet."""


@dataclass(frozen=True, slots=True)
class RtpPacket:
    """One RTP packet (CSRCs and header extensions are read past, not kept)."""

    payload_type: int
    sequence: int
    timestamp: int
    ssrc: int
    payload: bytes
    marker: bool = False

    @classmethod
    def parse(cls, data: bytes) -> RtpPacket:
        """Parse a datagram; raises :class:`RtpError` for anything that is not RTP v2."""
        if len(data) < _HEADER.size:
            raise RtpError(f"{len(data)} bytes is shorter than an RTP header")
        b0, b1, seq, ts, ssrc = _HEADER.unpack_from(data)
        if b0 >> 6 != 2:
            raise RtpError(f"RTP version {b0 >> 6}")
        offset = _HEADER.size + 4 * (b0 & 0x0F)
        if b0 & 0x10:  # header extension: 16-bit profile, 16-bit length in words
            if len(data) < offset + 4:
                raise RtpError("truncated header extension")
            (words,) = struct.unpack_from("!H", data, offset + 2)
            offset += 4 + 4 * words
        end = len(data)
        if b0 & 0x20:  # padding: the last byte counts the padding bytes
            if end == 0 or data[-1] == 0 or data[-1] > end - offset:
                raise RtpError("bad padding")
            end -= data[-1]
        if offset > end:
            raise RtpError("truncated packet")
        return cls(b1 & 0x7F, seq, ts, ssrc, bytes(data[offset:end]), bool(b1 & 0x80))

    def encode(self) -> bytes:
        """Serialise with no CSRCs, extension or padding."""
        b1 = (0x80 if self.marker else 0) | (self.payload_type & 0x7F)
        return (
            _HEADER.pack(0x80, b1, self.sequence & 0xFFFF, self.timestamp & 0xFFFFFFFF, self.ssrc)
            + self.payload
        )


class RtpPacketizer:
    """Numbers outgoing packets: random SSRC, sequence and timestamp starts (RFC 3550 5.1).

    The timestamp is derived from the sender's tick (20 ms slot) counter, so silences between
    talk spurts advance it by the wall-clock time that passed, as RFC 3551 4.1 expects.
    """

    def __init__(self, payload_type: int, *, ssrc: int | None = None) -> None:
        self.payload_type = payload_type
        self.ssrc = secrets.randbits(32) if ssrc is None else ssrc
        self._seq = secrets.randbits(16)
        self._ts0 = secrets.randbits(32)

    def packet(self, payload: bytes, tick: int, *, marker: bool) -> RtpPacket:
        """The next packet for the 20 ms slot ``tick`` (counted from the start of the call)."""
        pkt = RtpPacket(
            self.payload_type,
            self._seq,
            (self._ts0 + tick * FRAME_SAMPLES) & 0xFFFFFFFF,
            self.ssrc,
            payload,
            marker,
        )
        self._seq = (self._seq + 1) & 0xFFFF
        return pkt


class JitterBuffer:
    """Reorders received packets by sequence number for a steady 20 ms playout.

    The playout clock (the caller of :meth:`pop`) holds the first packet of a burst for the
    target delay, then pops one packet per packet duration. Rules:

    * duplicates and packets older than the playout point are dropped;
    * a missing packet is declared lost only when a later one is waiting (it had the whole
      target delay to arrive), and :meth:`pop` returns None for it (the caller plays silence);
    * a new SSRC restarts the stream (the old one's stragglers are dropped);
    * a sequence jump beyond ``max_gap`` restarts the stream too (the sender restarted);
    * more than ``max_depth`` packets waiting drops the oldest, so clock drift cannot grow the
      delay without bound.

    Args:
        max_depth: packets held at most (target delay plus headroom).
        max_gap: a jump of more packets than this is a restart, not a loss.
    """

    def __init__(self, *, max_depth: int = 8, max_gap: int = 100) -> None:
        self.max_depth = max_depth
        self.max_gap = max_gap
        self._packets: dict[int, bytes] = {}
        self._next: int | None = None  # extended sequence number to play next
        self._played = False  # anything popped since the last restart
        self._ssrc: int | None = None
        self._old_ssrcs: list[int] = []
        self.stats = dict.fromkeys(
            ("received", "duplicate", "late", "lost", "restart", "overflow"), 0
        )

    def __len__(self) -> int:
        return len(self._packets)

    @property
    def empty(self) -> bool:
        """True when nothing is waiting to be played."""
        return not self._packets

    def _restart(self, ssrc: int, seq: int) -> None:
        if self._ssrc is not None:
            self.stats["restart"] += 1
            if self._ssrc != ssrc:
                self._old_ssrcs = [*self._old_ssrcs[-3:], self._ssrc]
        self._packets.clear()
        self._ssrc = ssrc
        self._next = seq
        self._played = False

    def push(self, pkt: RtpPacket) -> None:
        """Accept one received audio packet (any order, duplicates allowed)."""
        self.stats["received"] += 1
        if pkt.ssrc != self._ssrc:
            if pkt.ssrc in self._old_ssrcs:
                self.stats["late"] += 1
                return
            self._restart(pkt.ssrc, pkt.sequence)
        assert self._next is not None
        delta = (pkt.sequence - self._next) & 0xFFFF
        if delta >= 0x8000:
            delta -= 0x10000
        if delta < 0:
            if not self._played and -delta <= self.max_depth:
                self._next += delta  # reordered start of a burst: play from the earliest
                ext = self._next
            elif -delta > self.max_gap:
                self._restart(pkt.ssrc, pkt.sequence)
                ext = self._next
            else:
                self.stats["late"] += 1
                return
        elif delta > self.max_gap:
            self._restart(pkt.ssrc, pkt.sequence)
            ext = self._next
        else:
            ext = self._next + delta
        if ext in self._packets:
            self.stats["duplicate"] += 1
            return
        self._packets[ext] = pkt.payload
        while len(self._packets) > self.max_depth:
            oldest = min(self._packets)
            del self._packets[oldest]
            self.stats["overflow"] += 1
            self._next = min(self._packets)

    def pop(self) -> bytes | None:
        """The next packet's payload; None for a lost one. Only call when not :attr:`empty`."""
        if self._next is None or not self._packets:
            raise IndexError("pop from an empty jitter buffer")
        self._played = True
        payload = self._packets.pop(self._next, None)
        if payload is None:
            self.stats["lost"] += 1
        self._next += 1
        return payload


LatchVerdict = Literal["accept", "latched", "probation", "foreign_source", "foreign_ssrc"]


@dataclass(slots=True)
class RtpLatch:
    """Which source a call's RTP is taken from: learned once, early, then fixed.

    Symmetric RTP (answer where the caller's RTP comes from) is what makes calls work behind
    NAT: softphones advertise a private ``c=`` address their packets never come from. But a
    latch that follows *every* new source lets anyone who can reach the RTP port take the call's
    audio with one packet. So the latch is learned once and then never moves on its own:

    * a packet from a *trusted* host (the SDP ``c=`` address or the host the INVITE came from)
      latches at once, on its source address and SSRC;
    * a packet from any other host is held on probation: only ``probation`` packets in a row
      from one source, one SSRC, with consecutive sequence numbers latch (a NAT that maps media
      to another public address than signalling still works, a stray or sprayed packet does
      not); they are dropped until then;
    * once latched, packets from another source address or with another SSRC are dropped;
    * only :meth:`relearn` (a re-INVITE or UPDATE with new media) opens the latch again.

    Pure and synchronous: the media session feeds it ``(source, ssrc, sequence)`` and acts on
    the verdict.

    Attributes:
        trusted_hosts: hosts whose first packet latches at once.
        probation: consecutive packets an untrusted source needs to latch.
        source: the latched address, or None while learning.
        ssrc: the latched SSRC, or None while learning.
        counts: verdicts so far, by name.
    """

    trusted_hosts: frozenset[str]
    probation: int = 4
    source: tuple[str, int] | None = None
    ssrc: int | None = None
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("accept", "latched", "probation", "foreign_source", "foreign_ssrc"), 0
        )
    )
    _candidate: tuple[tuple[str, int], int, int, int] | None = None  # src, ssrc, next seq, n

    def check(self, src: tuple[str, int], ssrc: int, sequence: int) -> LatchVerdict:
        """The verdict on one received packet: ``accept``/``latched`` keep it, others drop it."""
        verdict = self._verdict(src, ssrc, sequence)
        self.counts[verdict] += 1
        return verdict

    def _verdict(self, src: tuple[str, int], ssrc: int, sequence: int) -> LatchVerdict:
        if self.source is not None:
            if src != self.source:
                return "foreign_source"
            if self.ssrc is None:  # relearn() kept the address: take its next SSRC
                self.ssrc = ssrc
                return "latched"
            return "accept" if ssrc == self.ssrc else "foreign_ssrc"
        if src[0] in self.trusted_hosts or self.probation <= 1:
            return self._latch(src, ssrc)
        cand = self._candidate
        if cand is not None and cand[0] == src and cand[1] == ssrc and cand[2] == sequence:
            n = cand[3] + 1
        else:
            n = 1
        if n >= self.probation:
            return self._latch(src, ssrc)
        self._candidate = (src, ssrc, (sequence + 1) & 0xFFFF, n)
        return "probation"

    def _latch(self, src: tuple[str, int], ssrc: int) -> LatchVerdict:
        self.source, self.ssrc, self._candidate = src, ssrc, None
        return "latched"

    def relearn(self, trusted_hosts: frozenset[str], *, same_address: bool) -> None:
        """Open the latch again after a re-INVITE/UPDATE with new media.

        Args:
            trusted_hosts: the new offer's hosts.
            same_address: the new offer keeps the media address: keep the latched source and
                take only a new SSRC from it (hold/resume may restart the stream); otherwise
                learn the source again too.
        """
        self.trusted_hosts = trusted_hosts
        self.ssrc = None
        self._candidate = None
        if not same_address:
            self.source = None


@dataclass(frozen=True, slots=True)
class DtmfEvent:
    """One keypad press decoded from RFC 4733 packets."""

    digit: str
    duration_ms: int


def dtmf_payload(event: int, *, end: bool, duration: int, volume: int = 10) -> bytes:
    """An RFC 4733 telephone-event payload (duration in timestamp units)."""
    return struct.pack("!BBH", event, (0x80 if end else 0) | (volume & 0x3F), duration & 0xFFFF)


class DtmfDecoder:
    """Turns RFC 4733 telephone-event packets into one :class:`DtmfEvent` per key press.

    An event is identified by its RTP timestamp; its end packet is sent three times and its
    start may be lost, so a press is reported once: at its first end packet, or, if every end
    packet was lost, when the next press starts.
    """

    def __init__(self, clock_hz: int = 8000) -> None:
        self.clock_hz = clock_hz
        self._current: tuple[int, int] | None = None  # (ssrc, timestamp) of the open event
        self._current_event = 0
        self._current_duration = 0
        self._done: list[tuple[int, int]] = []

    def push(self, pkt: RtpPacket) -> list[DtmfEvent]:
        """Feed one telephone-event packet; returns the presses it completes."""
        if len(pkt.payload) < 4:
            return []
        event, flags, duration = struct.unpack_from("!BBH", pkt.payload)
        key = (pkt.ssrc, pkt.timestamp)
        if key in self._done:
            return []  # the repeated end packets of a press already reported
        out: list[DtmfEvent] = []
        if self._current is not None and self._current != key:
            out += self._finish()
        self._current = key
        self._current_event = event
        self._current_duration = max(self._current_duration, duration)
        if flags & 0x80:
            out += self._finish()
        return out

    def _finish(self) -> list[DtmfEvent]:
        assert self._current is not None
        self._done = [*self._done[-7:], self._current]
        self._current = None
        duration, self._current_duration = self._current_duration, 0
        if self._current_event >= len(DTMF_EVENTS):
            return []
        return [DtmfEvent(DTMF_EVENTS[self._current_event], duration * 1000 // self.clock_hz)]
