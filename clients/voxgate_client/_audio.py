"""Audio helpers for clients: read/write WAV, G.711 conversion, paced streaming, reply capture.

G.711 goes through :mod:`voxgate_client._common.pcm`'s bit-exact ITU-T tables and resampling through
soxr, so a client encodes exactly as the server decodes.
"""

from __future__ import annotations

import asyncio
import wave
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt
import soxr

from voxgate_client._common.pcm import (
    ALAW_DECODE,
    ALAW_ENCODE,
    MULAW_DECODE,
    MULAW_ENCODE,
    SUPPORTED_RATES_HZ,
    float_to_pcm16,
    pcm16_to_float,
)

from ._config import EncodingName
from ._events import AudioOut, SessionStarted
from ._proto import voxgate_pb2 as pb

__all__ = [
    "AS_FAST_AS_ALLOWED",
    "REALTIME",
    "UNPACED",
    "AudioSink",
    "Pacing",
    "ReplyRecorder",
    "WireAudio",
    "decode_pcm16",
    "encode_pcm16",
    "load_audio",
    "read_wav",
    "stream_audio",
    "write_wav",
]

Int16Array = npt.NDArray[np.int16]

#: Raw G.711 mu-law files (headerless, 8 kHz) are recognised by these suffixes.
MULAW_SUFFIXES = (".ulaw", ".mulaw", ".mu", ".pcmu", ".raw")


@dataclass(frozen=True, slots=True)
class WireAudio:
    """Audio already encoded for the wire, with its format."""

    data: bytes
    encoding: EncodingName
    sample_rate_hz: int

    @property
    def bytes_per_ms(self) -> float:
        """Wire bytes per millisecond."""
        width = 2 if self.encoding == "linear16" else 1
        return width * self.sample_rate_hz / 1000.0

    @property
    def duration_ms(self) -> float:
        """Length in milliseconds."""
        return len(self.data) / self.bytes_per_ms

    def chunks(self, chunk_ms: int = 20) -> list[bytes]:
        """Split into chunks of ``chunk_ms`` (the last may be shorter)."""
        size = int(self.bytes_per_ms * chunk_ms)
        if self.encoding == "linear16":
            size -= size % 2  # LINEAR16 chunks must hold whole samples
        return [self.data[i : i + size] for i in range(0, len(self.data), size)]


def read_wav(path: Path | str) -> tuple[Int16Array, int]:
    """Read a mono PCM16 WAV at a wire rate (8, 16, 24 or 48 kHz).

    Raises:
        ValueError: the file is not a WAV at all, or not mono 16-bit PCM at a supported rate
            (the message names the file, says which, and how to convert it).
        OSError: the file cannot be read (missing, a directory, no permission).
    """
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate = w.getnchannels(), w.getsampwidth(), w.getframerate()
            frames = w.readframes(w.getnframes()) if channels == 1 and width == 2 else b""
    except (wave.Error, EOFError) as exc:
        # The wave module's own errors say nothing of the file ("file does not start with
        # RIFF id", a bare EOFError for an empty or cut-off header): name it and what we need.
        why = str(exc) or "the header is empty or cut off"
        raise ValueError(
            f"{path}: not a readable WAV file ({why}); voxgate needs a mono 16-bit PCM WAV "
            "(e.g. `sox in.mp3 -c 1 -b 16 -r 16000 out.wav`) or raw 8 kHz mu-law (.ulaw)"
        ) from None
    if channels != 1 or width != 2:
        raise ValueError(
            f"{path}: {channels} channel(s) of {8 * width}-bit audio; voxgate needs mono "
            "16-bit PCM (e.g. `sox in.wav -c 1 -b 16 out.wav`)"
        )
    if rate not in SUPPORTED_RATES_HZ:
        raise ValueError(
            f"{path}: {rate} Hz is not a wire rate; use one of "
            f"{', '.join(str(r) for r in SUPPORTED_RATES_HZ)} (e.g. `sox in.wav -r 16000 "
            "out.wav`)"
        )
    pcm = np.frombuffer(frames, dtype="<i2").astype(np.int16)
    return pcm, rate


def write_wav(path: Path | str, pcm: Int16Array, sample_rate_hz: int) -> Path:
    """Write mono PCM16 samples as a WAV; returns the path."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with wave.open(str(out), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate_hz)
        w.writeframes(np.asarray(pcm, dtype="<i2").tobytes())
    return out


def encode_pcm16(
    pcm: Int16Array, rate_hz: int, encoding: EncodingName, target_rate_hz: int | None = None
) -> WireAudio:
    """Resample (soxr) and encode PCM16 for the wire; G.711 defaults to 8 kHz."""
    target = target_rate_hz or (rate_hz if encoding == "linear16" else 8000)
    if target != rate_hz:
        x = soxr.resample(pcm16_to_float(pcm), rate_hz, target).astype(np.float32)
        pcm = float_to_pcm16(x)
    if encoding == "linear16":
        return WireAudio(pcm.astype("<i2").tobytes(), encoding, target)
    table = MULAW_ENCODE if encoding == "mulaw" else ALAW_ENCODE
    return WireAudio(table[pcm.astype(np.int64) + 32768].tobytes(), encoding, target)


def decode_pcm16(data: bytes, encoding: EncodingName) -> Int16Array:
    """Decode wire bytes to PCM16 samples (no resampling)."""
    if encoding == "linear16":
        return np.frombuffer(data, dtype="<i2").astype(np.int16)
    table = MULAW_DECODE if encoding == "mulaw" else ALAW_DECODE
    return table[np.frombuffer(data, dtype=np.uint8)]


def load_audio(path: Path | str, *, mulaw: bool = False) -> WireAudio:
    """Load a caller file for sending.

    A WAV (mono PCM16, 8/16/24/48 kHz) is sent as LINEAR16 at its own rate, or converted to
    8 kHz mu-law with ``mulaw=True`` (what a telephone line carries). A headerless file with a
    mu-law suffix (``.ulaw``, ``.mulaw``, ``.pcmu``, ``.raw``...) is taken as 8 kHz mu-law.
    """
    p = Path(path)
    if p.suffix.lower() in MULAW_SUFFIXES:
        return WireAudio(p.read_bytes(), "mulaw", 8000)
    pcm, rate = read_wav(p)
    return encode_pcm16(pcm, rate, "mulaw" if mulaw else "linear16")


# --- pacing -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pacing:
    """When each chunk may leave, as a pure function of the audio already sent.

    The server accepts ``burst_allowance_ms`` of audio ahead of real time and then at most
    ``max_realtime_factor`` times real time (defaults 5 s and 4x). A client pacing on an
    absolute clock (chunk due at ``start + due_s(sent_ms)``) never drifts, however late one
    sleep wakes.

    Attributes:
        factor: speed relative to real time after the burst; None sends unpaced.
        burst_ms: audio sent at once before pacing starts.
    """

    factor: float | None
    burst_ms: float = 0.0

    def due_s(self, sent_ms: float) -> float:
        """Seconds after the first chunk at which audio starting at ``sent_ms`` may be sent."""
        if self.factor is None:
            return 0.0
        return max(0.0, sent_ms - self.burst_ms) / 1000.0 / self.factor


#: Real time: what a telephone line does.
REALTIME = Pacing(1.0)
#: As fast as the default server limits allow, with margin: 4 s burst (of 5 s), then 3.5x (of 4x).
AS_FAST_AS_ALLOWED = Pacing(3.5, 4000.0)
#: No pacing at all (only for servers configured with a high ``max_realtime_factor``).
UNPACED = Pacing(None)


class AudioSink(Protocol):
    """Anything with ``send_audio`` (a :class:`~voxgate_client.Call`)."""

    async def send_audio(self, data: bytes) -> None:
        """Send one chunk of wire audio."""
        ...


async def stream_audio(
    call: AudioSink,
    audio: WireAudio,
    pacing: Pacing = REALTIME,
    *,
    chunk_ms: int = 20,
    on_chunk: Callable[[float, float], None] | None = None,
    gate: asyncio.Event | None = None,
) -> None:
    """Send ``audio`` in ``chunk_ms`` chunks, paced by ``pacing`` on the loop's clock.

    Args:
        call: where to send.
        audio: the wire audio.
        pacing: :data:`REALTIME`, :data:`AS_FAST_AS_ALLOWED`, :data:`UNPACED` or custom.
        chunk_ms: chunk length.
        on_chunk: called with ``(loop_time_s, offset_ms)`` as each chunk is sent, so a caller
            can map audio offsets to wall-clock time (the timeline does).
        gate: when given, sending pauses while it is clear (a turn-taking caller that waits
            for the bot); the pacing clock moves on by the pause, so no burst follows it.
    """
    loop = asyncio.get_running_loop()
    start = loop.time()
    sent_ms = 0.0
    for chunk in audio.chunks(chunk_ms):
        if gate is not None and not gate.is_set():
            paused_at = loop.time()
            await gate.wait()
            start += loop.time() - paused_at
        delay = start + pacing.due_s(sent_ms) - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if on_chunk is not None:
            on_chunk(loop.time(), sent_ms)
        await call.send_audio(chunk)
        sent_ms += len(chunk) / audio.bytes_per_ms
    if on_chunk is not None:
        on_chunk(loop.time(), sent_ms)


# --- reply capture ------------------------------------------------------------------------------

_NAMES: dict[int, EncodingName] = {pb.LINEAR16: "linear16", pb.MULAW: "mulaw", pb.ALAW: "alaw"}


@dataclass
class ReplyRecorder:
    """Collects a call's AudioOut frames and writes them as one PCM16 WAV.

    Frames are concatenated in sequence order; the gaps between replies are not reproduced
    (the file is "what the bot said", not a recording of the line).
    """

    encoding: EncodingName
    sample_rate_hz: int
    frames: list[AudioOut] = field(default_factory=list)

    @classmethod
    def for_session(cls, started: SessionStarted) -> ReplyRecorder:
        """A recorder in the call's effective output format."""
        out = started.effective_config.output_audio
        enc = _NAMES.get(out.encoding) or _NAMES.get(
            started.effective_config.input_audio.encoding, "linear16"
        )
        rate = out.sample_rate_hertz or started.effective_config.input_audio.sample_rate_hertz
        return cls(enc, rate or 16000)

    def add(self, event: AudioOut) -> None:
        """Keep one frame."""
        self.frames.append(event)

    def pcm16(self, speak_id: str | None = None) -> Int16Array:
        """All frames (or one reply's) decoded to PCM16."""
        frames = sorted(self.frames, key=lambda f: f.sequence_number)
        data = b"".join(f.data for f in frames if speak_id is None or f.speak_id == speak_id)
        return decode_pcm16(data, self.encoding)

    @property
    def duration_ms(self) -> float:
        """Recorded audio length."""
        return 1000.0 * len(self.pcm16()) / self.sample_rate_hz

    def write_wav(self, path: Path | str) -> Path:
        """Write everything recorded as a PCM16 WAV at the call's output rate."""
        return write_wav(path, self.pcm16(), self.sample_rate_hz)
