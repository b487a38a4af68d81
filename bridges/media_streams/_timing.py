"""Pure timing policies of a media stream: inbound chunk order, outbound chunking and pacing.

No sockets and no clock of their own: callers pass ``now`` (seconds on any monotonic clock), so
tests step them exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CHUNK_BYTES", "CHUNK_MS", "ChunkOrderer", "OutboundPacer", "Rechunker"]

#: Providers play and send 20 ms chunks: 160 bytes of 8 kHz G.711.
CHUNK_MS = 20
CHUNK_BYTES = 160


@dataclass(slots=True)
class OrderStats:
    """What the orderer saw; logged once when the stream ends."""

    late: int = 0  # arrived after a later chunk had been released (dropped)
    duplicate: int = 0  # the same chunk number twice (dropped)
    lost: int = 0  # never arrived; replaced by silence so call time stays true
    reordered: int = 0  # arrived ahead of a gap and was held (then put in place)


class ChunkOrderer:
    """Puts inbound media chunks back in ``chunk`` order; replaces lost ones with silence.

    WHY: Telnyx documents that media frame order is not guaranteed; Twilio's arrive in order,
    but a replayer or proxy can still duplicate or skip. The gateway's timeline (speech offsets,
    barge-in timing) counts bytes, so a lost chunk must become silence of its length, not vanish.

    In-order chunks pass straight through (no added delay). A chunk ahead of the next expected
    one is held; once more than ``window`` chunks are held, the gap is given up on and filled
    with silence. A chunk behind what was released is late and dropped. Chunks without a
    number (``-1``) pass through.
    """

    def __init__(self, window: int = 3, silence: bytes = b"\xff", max_fill_chunks: int = 50):
        self._window = window
        self._silence = silence
        self._max_fill = max_fill_chunks
        self._next: int | None = None
        self._held: dict[int, bytes] = {}
        self._chunk_len = CHUNK_BYTES
        self.stats = OrderStats()

    def push(self, chunk: int, payload: bytes) -> list[bytes]:
        """One arrived chunk; returns the audio now ready, in order."""
        if chunk < 0:
            return [payload]
        if self._next is None:
            self._next = chunk
        if chunk < self._next:
            self.stats.late += 1
            return []
        if chunk in self._held:
            self.stats.duplicate += 1
            return []
        if chunk > self._next:
            self.stats.reordered += 1  # held until the gap before it closes or is given up
        self._held[chunk] = payload
        out = self._release()
        if len(self._held) > self._window:
            out += self._give_up_gap()
        return out

    def _release(self) -> list[bytes]:
        out: list[bytes] = []
        assert self._next is not None
        while self._next in self._held:
            payload = self._held.pop(self._next)
            self._chunk_len = len(payload) or self._chunk_len
            out.append(payload)
            self._next += 1
        return out

    def _give_up_gap(self) -> list[bytes]:
        assert self._next is not None
        first = min(self._held)
        missing = first - self._next
        self.stats.lost += missing
        fill = self._silence * (self._chunk_len * min(missing, self._max_fill))
        self._next = first
        return ([fill] if fill else []) + self._release()

    def flush(self) -> list[bytes]:
        """End of stream: whatever is held, in order (gaps not filled: nothing follows them)."""
        out = [self._held[k] for k in sorted(self._held)]
        self._held.clear()
        return out


class Rechunker:
    """Cuts one reply's gateway frames into exact 20 ms chunks; pads the last with silence.

    The gateway already sends 20 ms frames, except a reply's last, which may be short; some
    providers reject or click on a partial chunk, so it is padded with G.711 silence.
    """

    def __init__(self, silence: bytes = b"\xff") -> None:
        self._silence = silence
        self._pending = b""

    def push(self, data: bytes, *, last: bool) -> list[bytes]:
        """Frames in; whole chunks out (and the padded remainder when ``last``)."""
        buf = self._pending + data
        n = len(buf) // CHUNK_BYTES * CHUNK_BYTES
        out = [buf[i : i + CHUNK_BYTES] for i in range(0, n, CHUNK_BYTES)]
        self._pending = buf[n:]
        if last and self._pending:
            out.append(self._pending + self._silence * (CHUNK_BYTES - len(self._pending)))
            self._pending = b""
        return out

    def reset(self) -> None:
        """Barge-in: the partial chunk of the cut reply is dropped."""
        self._pending = b""


class OutboundPacer:
    """When the next outbound chunk may leave: never more than ``lead_ms`` ahead of playout.

    The provider plays what it is sent in order, 20 ms per chunk, starting when it arrives; we
    model its playout clock as ``play_end`` (when everything sent so far will have played).
    A chunk may go once it would start playing within ``lead_ms``; so a burst from the gateway
    (after a network stall) is smoothed to real time, and a ``clear`` drops at most ``lead_ms``
    of audio the caller has not heard yet. After the provider runs dry, playout restarts at
    the next chunk's arrival.
    """

    def __init__(self, lead_ms: int = 100) -> None:
        self._lead_s = lead_ms / 1000.0
        self._play_end = 0.0

    def delay_s(self, now: float) -> float:
        """Seconds to wait before the next chunk may be sent (0: send now)."""
        start = max(self._play_end, now)
        wait = start - self._lead_s - now
        return wait if wait > 1e-6 else 0.0  # a float's dust is not a reason to sleep

    def sent(self, now: float) -> None:
        """Account one 20 ms chunk sent at ``now``."""
        self._play_end = max(self._play_end, now) + CHUNK_MS / 1000.0

    def queued_s(self, now: float) -> float:
        """Audio sent but (by the model) not yet played."""
        return max(0.0, self._play_end - now)

    def reset(self, now: float) -> None:
        """``clear`` sent: the provider dropped its buffer."""
        self._play_end = now
