"""Structured fuzzing of the public API through a real grpc.aio server on loopback.

Hypothesis draws whole calls, not bytes: a first message (mostly a valid ``SessionConfig`` with
random encodings, rates, languages, VAD and decoding options, hotwords; sometimes any message of
``voxgate.v1`` filled field by field from its descriptor, so fields added to the contract later
are fuzzed too), then audio of random lengths and content, Speak/Mark/Clear/Flush/Hangup/DTMF, a
second config, empty requests and raw undecodable bytes in random order with random pauses, and
a random ending (done writing, hang up, cancel, or just stop). Synthesize, ListModels and
ListVoices get the same treatment. Many cases run at once while one well-behaved caller streams
a real clip at real time to the same server and checks its transcript against a solo run.

Properties, per case: the status is never INTERNAL or UNKNOWN; the stream ends with its status
within ``END_BOUND_S`` of the client's last action; no server ERROR log line; at the end no call
is left open. The well-behaved caller's transcript is unchanged.

    python -m benchmarks.fuzz_grpc --cases 20000

prints cases, the status histogram, the longest stream end time and whether the transcript was
unchanged (``--minutes`` stops early and reports what ran). ``tests/test_fuzz_grpc.py`` runs a
bounded, derandomized version in CI.

Measured on 2 shared cores (20 000 cases, derandomized, batches of 40, 1145 s): clients saw
INVALID_ARGUMENT 9890, OK 6779, CANCELLED 2857, DEADLINE_EXCEEDED 254 and 220 of grpc's own
client-side write races; 806 ErrorEvents; no INTERNAL or UNKNOWN, no stream past the bound
(longest end 3.6 s, the idle timeout), no server ERROR line, no call left open, and the
well-behaved caller's transcript was the same in all 157 runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import re
import sys
import threading
import time
import wave
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from voxgate.gateway.base import VoiceDescription
from voxgate.gateway.config import GatewayConfig, load_config
from voxgate.gateway.runtime import build_hub
from voxgate.gateway.server import GatewayServer
from voxgate.gateway.testing.fake_engines import FakeToneSynthesizer
from voxgate.v1 import voxgate_pb2 as pb

__all__ = [
    "END_BOUND_S",
    "Case",
    "FuzzRig",
    "Stats",
    "batches",
    "cases",
    "main",
]

REPO_ROOT = Path(__file__).resolve().parents[1]
SPEECH_DIR = REPO_ROOT.parent / "shared" / "data" / "speech"
CLIP = "ljspeech_LJ001-0004.wav"
SERVICE = "/voxgate.v1.VoiceGateway/"

#: A stream must end with its status within this many seconds of the client's last action
#: (the server's limits below make every call end well before: idle 3 s, longest call 20 s).
END_BOUND_S = 25.0
#: The status grpc's Python client makes up when one of its writes races the server's status
#: on a bidirectional call (``set_internal_error``); the server sent something else.
CLIENT_RACE = "Internal error from Core"
#: A status message longer than this echoes client input unbounded (errors.echo cuts at 64).
MAX_DETAILS = 1500
#: Limits for the fuzz server: short, so that every kind of stream ends in a few seconds.
FUZZ_LIMITS: dict[str, Any] = {
    "first_message_timeout_s": 2.0,
    "idle_timeout_s": 3.0,
    "max_call_duration_s": 20.0,
    "max_synthesis_s": 1.0,
    "write_stall_timeout_s": 2.0,
    "max_concurrent_calls": 400,
}

# --- strategies -----------------------------------------------------------------------------------

_T = FieldDescriptor
_TEXT = st.one_of(
    st.sampled_from(
        [
            "",
            "en",
            "en-US",
            "de",
            "fr-CA",
            "xx",
            "tone",
            "joe",
            "Hello there.",
            "9" * 80,
            "<b>hi</b>",
            "y" * 5000,  # an unbounded echo of this one shows past MAX_DETAILS
        ]
    ),
    st.text(max_size=24),
    st.text(min_size=120, max_size=300),
)
_I32 = st.one_of(
    st.integers(-3, 3),
    st.integers(0, 70_000),
    st.sampled_from([-(2**31), 2**31 - 1, 10, 20, 30, 8000, 16000, 24000, 48000]),
)


def _scalar(fd: FieldDescriptor) -> st.SearchStrategy[Any]:
    t = fd.type
    if t in (_T.TYPE_INT32, _T.TYPE_SINT32, _T.TYPE_SFIXED32):
        return _I32
    if t in (_T.TYPE_INT64, _T.TYPE_SINT64, _T.TYPE_SFIXED64):
        return st.one_of(_I32, st.sampled_from([-(2**63), 2**63 - 1]))
    if t in (_T.TYPE_UINT32, _T.TYPE_FIXED32):
        return st.integers(0, 2**32 - 1)
    if t in (_T.TYPE_UINT64, _T.TYPE_FIXED64):
        return st.integers(0, 2**64 - 1)
    if t == _T.TYPE_BOOL:
        return st.booleans()
    if t == _T.TYPE_FLOAT:
        return st.floats(width=32)
    if t == _T.TYPE_DOUBLE:
        return st.floats()
    if t == _T.TYPE_STRING:
        return _TEXT
    if t == _T.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == _T.TYPE_ENUM:
        numbers = [v.number for v in fd.enum_type.values]
        return st.one_of(st.sampled_from(numbers), st.integers(-2, 40))  # open enums
    raise TypeError(f"no strategy for {fd.full_name} (type {t})")


def from_descriptor(desc: Any, depth: int = 0) -> st.SearchStrategy[Message]:
    """Any message of this type, each field set or not, oneofs holding at most one member.

    Built from the descriptor, so a field added to the contract is fuzzed without a change here.
    """
    cls: Any = GetMessageClass(desc)

    def value(fd: FieldDescriptor) -> st.SearchStrategy[Any]:
        if fd.type == _T.TYPE_MESSAGE:
            if depth >= 3:
                return st.just(GetMessageClass(fd.message_type)())
            inner = from_descriptor(fd.message_type, depth + 1)
        else:
            inner = _scalar(fd)
        return st.lists(inner, max_size=4) if fd.is_repeated else inner

    oneofs = [o for o in desc.oneofs if not o.name.startswith("_")]
    in_oneof = {f.name for o in oneofs for f in o.fields}
    optional = {f.name: value(f) for f in desc.fields if f.name not in in_oneof}
    choices = [
        st.one_of(st.none(), *(st.tuples(st.just(f.name), value(f)) for f in o.fields))
        for o in oneofs
    ]

    def build(parts: tuple[dict[str, Any], list[tuple[str, Any] | None]]) -> Message:
        kwargs, picked = parts
        for choice in picked:
            if choice is not None:
                kwargs[choice[0]] = choice[1]
        return cls(**kwargs)  # type: ignore[no-any-return]

    return st.tuples(st.fixed_dictionaries({}, optional=optional), st.tuples(*choices)).map(
        lambda t: build((t[0], list(t[1])))
    )


_ENC = st.sampled_from([pb.LINEAR16, pb.MULAW, pb.ALAW])
_RATE = st.sampled_from([8000, 16000, 24000, 48000])


@st.composite
def valid_config(draw: st.DrawFn) -> pb.SessionConfig:
    """A config a real client would send: every value in range, but the combination random."""
    enc, rate = draw(_ENC), draw(_RATE)
    cfg = pb.SessionConfig(input_audio=pb.AudioFormat(encoding=enc, sample_rate_hertz=rate))
    if draw(st.booleans()):
        cfg.output_audio.encoding = draw(st.sampled_from([0, pb.LINEAR16, pb.MULAW, pb.ALAW]))
        cfg.output_audio.sample_rate_hertz = draw(st.sampled_from([0, 8000, 16000, 24000, 48000]))
    cfg.language = draw(st.sampled_from(["", "en", "en-US", "de", "fr"]))
    cfg.interim_results = draw(st.booleans())
    cfg.interim_interval_ms = draw(st.sampled_from([0, 200, 500, 1000]))
    if draw(st.booleans()):
        cfg.vad.frame_ms = draw(st.sampled_from([0, 10, 20, 30]))
        cfg.vad.end_silence_ms = draw(st.sampled_from([0, 100, 300, 600, 2000]))
        cfg.vad.min_speech_ms = draw(st.sampled_from([0, 50, 250]))
        cfg.vad.max_utterance_ms = draw(st.sampled_from([0, 1000, 5000, 30000]))
        if draw(st.booleans()):
            cfg.vad.aggressiveness = draw(st.integers(0, 3))
    dec = cfg.decoding
    dec.beam_size = draw(st.integers(0, 3))
    dec.mbr_candidates = draw(st.sampled_from([0, 0, 2, 3]))
    dec.max_alternatives = draw(st.integers(0, 2))
    dec.word_timestamps = draw(st.booleans())
    dec.initial_prompt = draw(st.sampled_from(["", "Acme support call.", "Printing, books."]))
    dec.hotwords.extend(
        draw(st.lists(st.sampled_from(["Acme", "voxgate", "Zoë", "block"]), max_size=3))
    )
    dec.translate = draw(st.booleans()) and draw(st.booleans())
    cfg.barge_in.disabled = draw(st.booleans())
    cfg.barge_in.min_speech_ms = draw(st.sampled_from([0, 0, 200]))
    cfg.call_id = draw(st.sampled_from(["", "case", "case-2", "c" * 128]))
    return cfg


def config() -> st.SearchStrategy[pb.SessionConfig]:
    """Mostly valid configs; some with random fields laid over them; a quarter all random."""
    random_cfg = from_descriptor(pb.SessionConfig.DESCRIPTOR)

    def overlay(parts: tuple[pb.SessionConfig, int, pb.SessionConfig]) -> pb.SessionConfig:
        base, roll, extra = parts
        if roll == 0:
            base.MergeFrom(extra)
        return base

    return st.one_of(
        valid_config(),
        valid_config(),
        st.tuples(valid_config(), st.integers(0, 3), random_cfg).map(overlay),
        random_cfg,
    )


@dataclass(frozen=True)
class Audio:
    """An audio chunk made at run time (hypothesis draws only its size, kind and seed)."""

    size: int
    kind: str  # silence | noise | tone | speech
    seed: int

    def data(self, clip: bytes) -> bytes:
        if self.kind == "silence":
            return bytes(self.size)
        if self.kind == "speech" and clip:
            start = (self.seed * 640) % max(1, len(clip) - self.size)
            return clip[start : start + self.size]
        rng = np.random.default_rng(self.seed)
        if self.kind == "tone":
            t = np.arange(self.size // 2 + 1) / 16000
            wave_ = (8000 * np.sin(2 * np.pi * (200 + self.seed % 800) * t)).astype("<i2")
            return wave_.tobytes()[: self.size]
        return rng.integers(0, 256, self.size, dtype=np.uint8).tobytes()


_SIZE = st.one_of(
    st.integers(0, 1920),
    st.sampled_from([1, 159, 160, 320, 321, 640, 3200, 63_999, 64_000, 64_001, 200_000]),
)
_AUDIO = st.builds(
    Audio,
    _SIZE,
    st.sampled_from(["silence", "noise", "tone", "speech", "speech"]),
    st.integers(0, 10_000),
)


@st.composite
def valid_speak(draw: st.DrawFn) -> pb.Speak:
    return pb.Speak(
        text=draw(st.sampled_from(["Hi.", "One moment please.", "x", "  ", "", "1234567890" * 8])),
        speak_id=draw(st.sampled_from(["", "a", "b", "s" * 200])),
        voice=draw(st.sampled_from(["", "", "tone", "nobody"])),
        rate=draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0, -1.0, float("nan")])),
        speaker_id=draw(st.sampled_from([0, 0, 1, -1])),
        uninterruptible=draw(st.booleans()),
    )


def _request(kind: str, value: Message) -> pb.ConverseRequest:
    req = pb.ConverseRequest()
    getattr(req, kind).CopyFrom(value)
    return req


#: One client action: a request to write (a message, raw bytes, or an Audio), or a pause (ms).
Action = tuple[str, Any]


def _msg(strategy: st.SearchStrategy[pb.ConverseRequest]) -> st.SearchStrategy[Action]:
    return st.tuples(st.just("msg"), strategy)


_AUDIO_ACTION = st.tuples(st.just("audio"), _AUDIO)
_PAUSE = st.tuples(st.just("pause"), st.integers(0, 40))
_GOOD_SPEAK = _msg(valid_speak().map(lambda s: _request("speak", s)))
_GOOD_CONTROL = _msg(
    st.one_of(
        st.just(pb.ConverseRequest(mark=pb.Mark(name="m1"))),
        st.just(pb.ConverseRequest(clear=pb.Clear())),
        st.just(pb.ConverseRequest(flush=pb.Flush())),
        st.builds(
            lambda d, ms: pb.ConverseRequest(dtmf=pb.Dtmf(digit=d, duration_ms=ms)),
            st.sampled_from(list("0123456789*#ABCD")),
            st.integers(0, 2000),
        ),
    )
)
#: Requests that are mostly wrong: each ends its call (INVALID_ARGUMENT and the like), so they
#: are drawn less often than the rest, or few calls would get past their first seconds.
_ANYTHING = st.one_of(
    _msg(from_descriptor(pb.ConverseRequest.DESCRIPTOR)),
    _msg(from_descriptor(pb.Speak.DESCRIPTOR).map(lambda s: _request("speak", s))),
    _msg(st.sampled_from(["", "m" * 300]).map(lambda n: pb.ConverseRequest(mark=pb.Mark(name=n)))),
    _msg(
        st.builds(
            lambda d, ms: pb.ConverseRequest(dtmf=pb.Dtmf(digit=d, duration_ms=ms)),
            _TEXT,
            _I32,
        )
    ),
    _msg(st.sampled_from([pb.ConverseRequest(), pb.ConverseRequest(hangup=pb.Hangup())])),
    st.tuples(st.just("raw"), st.binary(min_size=1, max_size=40)),
)
_ACTION: st.SearchStrategy[Action] = st.one_of(
    _AUDIO_ACTION,
    _AUDIO_ACTION,
    _AUDIO_ACTION,
    _AUDIO_ACTION,
    _AUDIO_ACTION,
    _PAUSE,
    _PAUSE,
    _GOOD_SPEAK,
    _GOOD_SPEAK,
    _GOOD_CONTROL,
    _GOOD_CONTROL,
    _ANYTHING,
)


@dataclass(frozen=True)
class Case:
    """One fuzzed RPC."""

    rpc: str  # Converse | StreamingRecognize | Synthesize | ListModels | ListVoices
    first: Any  # a message, raw bytes, or None (send nothing)
    actions: tuple[Action, ...] = ()
    ending: str = "done"  # done | hangup | cancel | stop (never half-close) | cancel_early

    def short(self) -> str:
        kinds = Counter(
            a[0] if a[0] != "msg" else a[1].WhichOneof("event") or "empty" for a in self.actions
        )
        return f"{self.rpc} first={type(self.first).__name__} {dict(kinds)} end={self.ending}"


_STREAM = st.builds(
    Case,
    st.sampled_from(["Converse", "Converse", "Converse", "StreamingRecognize"]),
    st.one_of(
        config().map(lambda c: _request("config", c)),
        config().map(lambda c: _request("config", c)),
        config().map(lambda c: _request("config", c)),
        config().map(lambda c: _request("config", c)),
        config().map(lambda c: _request("config", c)),
        from_descriptor(pb.ConverseRequest.DESCRIPTOR),
        st.binary(min_size=1, max_size=30),
        st.none(),
    ),
    st.lists(_ACTION, max_size=24).map(tuple),
    st.sampled_from(["done", "hangup", "hangup", "cancel", "stop", "cancel_early"]),
)


@st.composite
def valid_synthesize(draw: st.DrawFn) -> pb.SynthesizeRequest:
    req = pb.SynthesizeRequest(
        text=draw(st.sampled_from(["Hello.", "A longer reply, with a clause.", "", "x" * 150])),
        voice=draw(st.sampled_from(["", "tone", "nobody"])),
        rate=draw(st.sampled_from([0.0, 1.0, 1.5, 5.0])),
    )
    if draw(st.booleans()):
        req.output_audio.encoding = draw(st.sampled_from([0, 1, 2, 3, 9]))
        req.output_audio.sample_rate_hertz = draw(st.sampled_from([0, 8000, 16000, 11025]))
    return req


_UNARY = st.builds(
    Case,
    st.sampled_from(["Synthesize", "Synthesize", "ListModels", "ListVoices"]),
    st.one_of(
        valid_synthesize(),
        from_descriptor(pb.SynthesizeRequest.DESCRIPTOR),
        st.binary(min_size=1, max_size=30),
    ),
    st.just(()),
    st.sampled_from(["done", "done", "cancel"]),
)


def cases() -> st.SearchStrategy[Case]:
    """Any fuzzed RPC: mostly call streams, a quarter unary-request RPCs."""
    return st.one_of(_STREAM, _STREAM, _STREAM, _UNARY)


def batches(size: int) -> st.SearchStrategy[list[Case]]:
    """``size`` cases to run at once (concurrency is part of what is fuzzed)."""
    return st.lists(cases(), min_size=size, max_size=size)


# --- running cases --------------------------------------------------------------------------------


@dataclass
class Stats:
    """What the cases did, for the table and the properties."""

    cases: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    max_end_s: float = 0.0
    hung: list[str] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)  # INTERNAL / UNKNOWN, with the case
    error_logs: list[str] = field(default_factory=list)
    error_events: Counter[str] = field(default_factory=Counter)  # by scope
    well_behaved_runs: int = 0
    well_behaved_changed: list[str] = field(default_factory=list)


def _bytes(item: Any) -> bytes:
    return item if isinstance(item, bytes) else item.SerializeToString()


async def run_case(channel: grpc.aio.Channel, case: Case, clip: bytes, stats: Stats) -> None:
    """Run one case and record its status and how long the stream took to end."""
    path = SERVICE + case.rpc
    code: grpc.StatusCode | None = None
    stream = case.rpc in ("Converse", "StreamingRecognize")
    rpc: Any = None
    unary: Any = None
    if stream:
        rpc = channel.stream_stream(path)()  # bytes in, bytes out

        async def drain() -> None:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
                async for raw in rpc:
                    msg = pb.ConverseResponse.FromString(raw)
                    if msg.WhichOneof("event") != "error":
                        continue
                    stats.error_events[msg.error.scope] += 1
                    # An ErrorEvent for one utterance or Speak must not call the client's
                    # input an internal fault either.
                    if msg.error.code in (13, 2):  # google.rpc INTERNAL, UNKNOWN
                        stats.bad.append(f"error event {msg.error}: {case!r}"[:3000])

        reader = asyncio.create_task(drain())
        try:
            if case.ending == "cancel_early":
                await asyncio.sleep(0)
                rpc.cancel()
            if case.first is not None:
                await rpc.write(_bytes(case.first))
            for kind, value in case.actions:
                if kind == "pause":
                    await asyncio.sleep(value / 1000)
                elif kind == "audio":
                    await rpc.write(
                        pb.ConverseRequest(
                            audio=pb.AudioChunk(data=value.data(clip))
                        ).SerializeToString()
                    )
                else:
                    await rpc.write(_bytes(value))
            if case.ending == "hangup":
                await rpc.write(pb.ConverseRequest(hangup=pb.Hangup()).SerializeToString())
            if case.ending in ("done", "hangup"):
                await rpc.done_writing()
            elif case.ending == "cancel":
                rpc.cancel()
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
            pass  # the server ended the call early: its status says why
        last = time.monotonic()
        try:
            code = await asyncio.wait_for(rpc.code(), END_BOUND_S)
        except TimeoutError:
            stats.hung.append(case.short())
            rpc.cancel()
        await asyncio.wait({reader}, timeout=5)
        reader.cancel()
    else:
        if case.rpc == "Synthesize":
            unary = channel.unary_stream(path)(_bytes(case.first))
        else:
            unary = channel.unary_unary(path)(_bytes(case.first))
        try:
            if case.rpc == "Synthesize":
                async for _ in unary:
                    if case.ending == "cancel":
                        unary.cancel()
                        break
            else:
                await unary
        except (grpc.aio.AioRpcError, asyncio.CancelledError):
            pass
        last = time.monotonic()
        try:
            code = await asyncio.wait_for(unary.code(), END_BOUND_S)
        except TimeoutError:
            stats.hung.append(case.short())
            unary.cancel()
    ended = time.monotonic() - last
    stats.cases += 1
    stats.max_end_s = max(stats.max_end_s, ended)
    name = code.name if code is not None else "HUNG"
    details = "" if code is None else (await (rpc if stream else unary).details()) or ""
    if len(details) > MAX_DETAILS:  # client input echoed whole (gateway/errors.py echo())
        stats.bad.append(f"{name} with {len(details)} characters of details: {details[:200]!r}")
    if code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        if details == CLIENT_RACE:
            # grpc's client, not the server: a write that raced the server's status. What the
            # server sent is checked on the server side (outcomes, ERROR log lines).
            name = "CLIENT_WRITE_RACE"
        else:
            stats.bad.append(f"{name} {details!r}: {case!r}"[:3000])
    stats.statuses[name] += 1


class _ErrorLogs(logging.Handler):
    """Counts the server's ERROR lines (a fault the status may hide, e.g. a failed write)."""

    def __init__(self, stats: Stats) -> None:
        super().__init__(logging.ERROR)
        self.stats = stats

    def emit(self, record: logging.LogRecord) -> None:
        self.stats.error_logs.append(f"{record.name}: {record.getMessage()[:300]}")


def read_clip(path: Path) -> bytes:
    with wave.open(str(path), "rb") as w:
        assert w.getframerate() == 16000 and w.getnchannels() == 1 and w.getsampwidth() == 2
        return w.readframes(w.getnframes())


def _norm(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split())


async def well_behaved_call(channel: grpc.aio.Channel, clip: bytes) -> str:
    """A real caller: the clip at real time in 20 ms chunks, 1.5 s of silence, then hang up."""
    rpc = channel.stream_stream(
        SERVICE + "Converse", pb.ConverseRequest.SerializeToString, pb.ConverseResponse.FromString
    )()
    fmt = pb.AudioFormat(encoding=pb.LINEAR16, sample_rate_hertz=16000)
    await rpc.write(pb.ConverseRequest(config=pb.SessionConfig(input_audio=fmt, language="en")))
    finals: list[str] = []

    async def read() -> None:
        async for msg in rpc:
            if msg.WhichOneof("event") == "transcript" and msg.transcript.is_final:
                finals.append(msg.transcript.text)

    reader = asyncio.create_task(read())
    loop = asyncio.get_running_loop()
    start = loop.time()
    audio = clip + bytes(16000 * 2 * 3 // 2)
    for k, i in enumerate(range(0, len(audio), 640)):
        await rpc.write(pb.ConverseRequest(audio=pb.AudioChunk(data=audio[i : i + 640])))
        delay = start + (k + 1) * 0.02 - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
    await rpc.write(pb.ConverseRequest(hangup=pb.Hangup()))
    await rpc.done_writing()
    await reader
    code = await rpc.code()
    if code is not grpc.StatusCode.OK:
        return f"<{code.name}>"
    return _norm(" ".join(finals))


class FuzzRig:
    """A real server on loopback, run on its own event loop thread, plus the well-behaved caller.

    Hypothesis drives cases from the calling thread (its ``@given`` is synchronous); each batch
    runs on the server's loop, concurrently with the well-behaved caller, which repeats its clip
    for as long as the rig is open and compares each transcript with the first, solo, run.

    Args:
        real_tts: the bundled Piper voice for Speak/Synthesize; otherwise the fake tone voice
            (voxgate.gateway.testing). Recognition is always the real bundled Whisper model.
        speech_dir: where the clip is.
    """

    def __init__(self, real_tts: bool = False, speech_dir: Path = SPEECH_DIR) -> None:
        self.stats = Stats()
        self.clip = read_clip(speech_dir / CLIP)
        self.real_tts = real_tts
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="fuzz-server", daemon=True
        )
        self._handler = _ErrorLogs(self.stats)
        self.baseline = ""
        self._stop = asyncio.Event()
        self._closed = False
        self.left_open = 0
        self.server_outcomes: dict[str, int] = {}

    def __enter__(self) -> FuzzRig:
        self._thread.start()
        self.call(self._start(), timeout_s=600)
        for name in ("voxgate", "grpc"):
            logging.getLogger(name).addHandler(self._handler)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._closed:
            return
        self._closed = True
        for name in ("voxgate", "grpc"):
            logging.getLogger(name).removeHandler(self._handler)
        self.call(self._finish(), timeout_s=120)
        self.call(self.loop.shutdown_asyncgens(), timeout_s=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        # A loop left unclosed is garbage with two open sockets (its self-pipe): whenever the
        # collector finds it, the ResourceWarnings land on whatever test runs then (an e2e test
        # of another module failed on them under -W error). A thread still running after 10 s
        # keeps its loop, which cannot be closed while it runs.
        if not self._thread.is_alive():
            self.loop.close()

    @property
    def unchanged(self) -> bool:
        """The well-behaved caller ran during the fuzz and always heard what it heard alone."""
        return self.stats.well_behaved_runs > 0 and not self.stats.well_behaved_changed

    @property
    def clean(self) -> bool:
        """Every property held."""
        s = self.stats
        server_faults = self.server_outcomes.get("internal", 0)
        return self.unchanged and not (
            s.bad or s.hung or s.error_logs or self.left_open or server_faults
        )

    def call(self, coro: Any, timeout_s: float) -> Any:
        fut: Future[Any] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout_s)

    def run_batch(self, batch: list[Case], timeout_s: float = 120.0) -> None:
        """Run ``batch`` at once on the server's loop."""

        async def go() -> None:
            await asyncio.gather(*(run_case(self.channel, c, self.clip, self.stats) for c in batch))

        self.call(go(), timeout_s)

    async def _start(self) -> None:
        engines = "asr,tts" if self.real_tts else "asr"
        overrides: dict[str, Any] = {
            "engines": engines,
            "server": {"host": "127.0.0.1", "port": 0, "grace_s": 1.0},
            "limits": FUZZ_LIMITS,
        }
        # Admission and the degradation ladder react to the fuzz load by design (refusing the
        # caller, greedy decoding); off here, so that what is compared is isolation alone.
        for section in ("admission", "degrade"):
            if section in GatewayConfig.model_fields:
                overrides[section] = {"enabled": False}
        cfg = load_config(None, overrides)
        hub = build_hub(cfg)
        assert hub is not None
        if not self.real_tts:
            hub.synthesizer = FakeToneSynthesizer()
            hub.info.voices = [VoiceDescription(name="tone", language="", sample_rate_hz=16000)]
        self.server = GatewayServer(cfg, hub)
        await self.server.start()
        self.channel = grpc.aio.insecure_channel(self.server.target)
        self.baseline = await well_behaved_call(self.channel, self.clip)
        if not self.baseline or self.baseline.startswith("<"):
            raise RuntimeError(f"the solo well-behaved call failed: {self.baseline!r}")
        self._caller = asyncio.create_task(self._well_behaved_loop())

    async def _well_behaved_loop(self) -> None:
        while not self._stop.is_set():
            got = await well_behaved_call(self.channel, self.clip)
            self.stats.well_behaved_runs += 1
            if got != self.baseline:
                self.stats.well_behaved_changed.append(got)

    async def _finish(self) -> None:
        self._stop.set()
        await self._caller  # the run in progress finishes (it overlapped the last batches)
        servicer = self.server.servicer
        assert servicer is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(servicer.wait_idle(), 30)
        self.left_open = servicer.calls.active_calls
        self.server_outcomes = dict(servicer.calls.outcomes)
        await self.channel.close()
        await self.server.stop(grace_s=0.0)


class _OutOfTime(Exception):
    """The time budget is spent: stop drawing, report what ran."""


def fuzz(
    rig: FuzzRig,
    cases_total: int,
    batch: int,
    seed: int | None,
    budget_s: float | None = None,
    progress: bool = False,
) -> None:
    """Draw ``cases_total`` cases in batches of ``batch`` with Hypothesis and run them.

    Stops early, without error, once ``budget_s`` has passed (the table says how many ran).
    """
    deadline = None if budget_s is None else time.monotonic() + budget_s

    @settings(
        max_examples=max(1, cases_total // batch),
        deadline=None,
        database=None,
        derandomize=seed is None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        verbosity=Verbosity.quiet,  # no dump of the batch that ran out of time
        print_blob=False,
    )
    @given(batches(batch))
    def one(cases_: list[Case]) -> None:
        if deadline is not None and time.monotonic() > deadline:
            raise _OutOfTime
        rig.run_batch(cases_)
        if progress and rig.stats.cases % (batch * 25) == 0:
            print(f"... {rig.stats.cases} cases, {dict(rig.stats.statuses)}", file=sys.stderr)

    if seed is not None:
        one = hypothesis_seed(seed)(one)
    with contextlib.suppress(_OutOfTime):
        one()


def table(rig: FuzzRig, seconds: float) -> Iterator[str]:
    stats = rig.stats
    yield f"{'cases':<32}{stats.cases}"
    yield f"{'wall time, s':<32}{seconds:.0f}"
    yield "statuses seen by the clients:"
    for name, n in sorted(stats.statuses.items(), key=lambda kv: -kv[1]):
        yield f"{'  ' + name:<32}{n}"
    yield "call outcomes on the server (Converse, StreamingRecognize):"
    for name, n in sorted(rig.server_outcomes.items(), key=lambda kv: -kv[1]):
        yield f"{'  ' + name:<32}{n}"
    yield f"{'error events (call went on)':<32}{sum(stats.error_events.values())}"
    yield f"{'INTERNAL or UNKNOWN':<32}{len(stats.bad)}"
    yield f"{'streams not ended in bound':<32}{len(stats.hung)}"
    yield f"{'max stream end time, s':<32}{stats.max_end_s:.2f}"
    yield f"{'server ERROR log lines':<32}{len(stats.error_logs)}"
    yield f"{'calls left open':<32}{rig.left_open}"
    yield f"{'well-behaved runs':<32}{stats.well_behaved_runs}"
    yield f"{'well-behaved unchanged':<32}{'yes' if rig.unchanged else 'no'}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=40, help="cases run at once")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: derandomized)")
    ap.add_argument("--real-tts", action="store_true", help="the Piper voice instead of the tone")
    ap.add_argument("--speech-dir", type=Path, default=SPEECH_DIR)
    ap.add_argument(
        "--minutes", type=float, default=None, help="stop drawing after this long (report so far)"
    )
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    began = time.monotonic()
    with FuzzRig(real_tts=args.real_tts, speech_dir=args.speech_dir) as rig:
        budget = None if args.minutes is None else 60.0 * args.minutes
        fuzz(rig, args.cases, args.batch, args.seed, budget, progress=True)
    stats = rig.stats
    print(f"baseline transcript: {rig.baseline!r}")
    for line in table(rig, time.monotonic() - began):
        print(line)
    for what, items in (
        ("INTERNAL/UNKNOWN", stats.bad),
        ("not ended", stats.hung),
        ("ERROR log", stats.error_logs),
        ("changed transcript", stats.well_behaved_changed),
    ):
        for item in items[:5]:
            print(f"{what}: {item}", file=sys.stderr)
    return 0 if rig.clean else 1


if __name__ == "__main__":
    raise SystemExit(main())
