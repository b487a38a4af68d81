"""Barge-in on a phone line: false barge-ins from the bot's own echo, and true barge-in latency.

Run:  .venv/bin/python -m benchmarks.barge_in [--repeats 3] [--tiny]

A real grpc.aio server on a loopback port with the bundled Whisper model and Piper voice and the
default VAD. Each call is μ-law 8 kHz, paced at real time by the client, which plays the reply as
a phone does and returns it as line echo (``voxgate.gateway.testing.echo_line``): each level × delay
of the issue's grid. "today" is the same server with the call's echo guard off
(``config.barge_in.echo_guard_disabled``), so both columns come from one run, interleaved.

Rows:

* echo only: the caller is silent, the line returns the reply. A barge-in is false.
* true barge-in: a real recorded caller (shared speech clips) starts talking 1.5 s into the
  reply. Latency is from the first loud frame of the caller's speech leaving the client to the
  ``interrupted`` event arriving. today: no echo (the only case in which today's gateway lets a
  reply run long enough to be interrupted by the caller); now: over the echo as well.
* after_words: the same callers under ``BARGE_IN_AFTER_WORDS`` (default one word), which waits
  for an interim transcript; and callers who only say backchannels ("Yeah. Okay.", "Mm-hmm.",
  "Uh-huh, right.", "Okay.", spoken by the bundled voice), which must not interrupt (on every
  variant server too).

Every interim decode of those calls is counted, with those that came out in a language other
than English (every caller is English; the calls set no language, so the gateway detects).
``--background K`` keeps K other callers talking on the same gateway (interims on) while the
barge-in calls run, and runs the after_words cases also on a server whose barge-in interims are
ranked as any other interim (``session.barge_in.urgent_interims: false``), interleaved.
``--language-variants`` also runs the after_words cases on a server that detects the language
on every interim (the gateway before ``session.language``), on one that uses a short prefix's
interim only when its detection is sure (``interim_detect_min_ms``), and on one whose interims
default to English (``session.language.interim_default``), interleaved call by call.
``--overlap-interim-ms 0`` also runs the after_words cases on a server whose barge-in interims
run one at a time (before ``session.barge_in.overlap_interim_ms``), interleaved.
``--barge-in-model tiny.en`` loads that model as ``asr.barge_in_model`` and runs the after_words
cases with the interims only barge-in reads decoded by it, interleaved with the same cases on
the call's own model (the default server turns it off: ``session.barge_in.barge_in_model``);
the interim counts then say which model decoded them.
``--talking-first`` runs only calls where the caller is already talking when the Speak
arrives (sent 0.5 s after their first word, under each policy, with and without echo) and
reports how much of the reply the caller heard while still talking (``overlap_ms``, on the
call's audio clock: the inbound audio sent when each reply frame arrived).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import soxr

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._stats import median, percentile  # noqa: E402
from voxgate.common.pcm import MULAW_DECODE, MULAW_ENCODE, float_to_pcm16, pcm16_to_float  # noqa: E402
from voxgate.engines.asr.base import AsrRequest, AsrResult  # noqa: E402
from voxgate.gateway.config import BargeInConfig, load_config  # noqa: E402
from voxgate.gateway.models import BARGE_IN_KEY  # noqa: E402
from voxgate.gateway.runtime import AsrTranscriber, build_hub  # noqa: E402
from voxgate.gateway.testing.echo_line import EchoLine, dispersive_path  # noqa: E402
from voxgate.gateway.testing.server import running_server  # noqa: E402
from voxgate.v1 import voxgate_pb2 as pb  # noqa: E402
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SPEECH = REPO.parent / "shared" / "data" / "speech"
REPLY = (
    "Thanks for calling. Let me read your full order back to you, item by item, before we "
    "confirm it today. You asked for two large pizzas and a salad."
)
#: The tiny mode's reply: one sentence, so that its test stays short.
SHORT_REPLY = "Let me read your full order back to you, item by item, before we confirm it."
LEVELS_DB = (-10, -20, -30)
DELAYS_MS = (40, 120, 250)
CALLERS = ("jfk_inaugural_1961.wav", "librispeech_1272-128104-0000.wav", "cmu_goforward.wav")
CALLER_AT_S = 1.5
FRAME = 160  # 20 ms at 8 kHz


def mulaw(x: np.ndarray) -> bytes:
    pcm = float_to_pcm16(np.asarray(x, np.float32))
    return bytes(MULAW_ENCODE[pcm.astype(np.int64) + 32768].tobytes())


def unmulaw(data: bytes) -> np.ndarray:
    return pcm16_to_float(MULAW_DECODE[np.frombuffer(data, np.uint8)])


def load_caller(name: str) -> np.ndarray:
    import wave  # noqa: PLC0415

    with wave.open(str(SPEECH / name), "rb") as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
        rate = w.getframerate()
    return np.asarray(soxr.resample(pcm16_to_float(pcm), rate, 8000), np.float32)


def onset_s(x: np.ndarray, threshold_dbfs: float = -40.0) -> float:
    """Start of the first 20 ms frame louder than ``threshold_dbfs``: the caller's first word."""
    n = len(x) // FRAME
    rms = np.sqrt(np.mean(x[: n * FRAME].reshape(n, FRAME).astype(np.float64) ** 2, axis=1))
    loud = np.nonzero(20 * np.log10(np.maximum(rms, 1e-9)) > threshold_dbfs)[0]
    return float(loud[0]) * FRAME / 8000 if len(loud) else 0.0


def last_loud_s(x: np.ndarray, threshold_dbfs: float = -40.0) -> float:
    """End of the last 20 ms frame louder than ``threshold_dbfs``: the caller's last word."""
    n = len(x) // FRAME
    rms = np.sqrt(np.mean(x[: n * FRAME].reshape(n, FRAME).astype(np.float64) ** 2, axis=1))
    loud = np.nonzero(20 * np.log10(np.maximum(rms, 1e-9)) > threshold_dbfs)[0]
    return float(loud[-1] + 1) * FRAME / 8000 if len(loud) else 0.0


@dataclass
class CallResult:
    interrupted_at: float | None = None
    finished: bool = False
    speech_begins: int = 0
    caller_text: str = ""
    onset_sent_at: float | None = None
    begin_at: float | None = None  # the caller's SPEECH_BEGIN arrived
    events: list[str] = field(default_factory=list)
    #: ``PlaybackInterrupted.played_ms``: how much of the reply the server says was heard.
    played_ms: int | None = None
    #: ``speak_after_s`` calls: reply audio that arrived while the caller was still talking
    #: (from the caller's first to their last loud frame) and before ``interrupted``, ms; each
    #: reply frame is placed on the call's audio clock by the inbound audio sent when it came.
    overlap_ms: float | None = None
    #: ``PlaybackInterrupted.at_offset_ms``: where the speech that cut the reply began, and
    #: (``speak_after_s`` calls) where on the call's audio clock the Speak went out, ms.
    at_offset_ms: int | None = None
    speak_sent_ms: float | None = None

    @property
    def latency_ms(self) -> float:
        if self.interrupted_at is None or self.onset_sent_at is None:
            return float("inf")
        return 1000.0 * (self.interrupted_at - self.onset_sent_at)

    @property
    def begin_latency_ms(self) -> float:
        """Caller's first word leaving the client to its SPEECH_BEGIN arriving."""
        if self.begin_at is None or self.onset_sent_at is None:
            return float("inf")
        return 1000.0 * (self.begin_at - self.onset_sent_at)


async def run_call(
    stub: pb_grpc.VoiceGatewayStub,
    *,
    guard: bool,
    policy: int = pb.BARGE_IN_IMMEDIATE,
    level_db: float | None = None,
    delay_ms: float = 120.0,
    caller: np.ndarray | None = None,
    max_s: float = 20.0,
    reply: str = REPLY,
    path: np.ndarray | None = None,
    echo_handling: int = 0,
    speak_after_s: float | None = None,
) -> CallResult:
    """One call: the reply plays, the line echoes it, and maybe a caller talks over it.

    ``path``: the echo path's impulse response at 8 kHz (None: flat); ``echo_handling``: the
    call's ``BargeInConfig.echo_handling`` (0: the server's). ``speak_after_s``: the caller
    talks first: the call's audio starts at once with the caller ``CALLER_AT_S`` into it, and
    the Speak goes out this long after the caller's first word (a bot that answers while the
    caller is still talking); ``overlap_ms`` then says how much of the reply they heard while
    still talking.
    """
    talking_first = speak_after_s is not None
    if talking_first and caller is None:
        raise ValueError("speak_after_s needs a caller")
    line = EchoLine(8000, level_db if level_db is not None else -200.0, delay_ms, path=path)
    res = CallResult()
    rpc = stub.Converse()
    first_audio = asyncio.Event()
    done = asyncio.Event()
    cfg = pb.SessionConfig(
        input_audio=pb.AudioFormat(encoding=pb.MULAW, sample_rate_hertz=8000),
        barge_in=pb.BargeInConfig(
            policy=policy,  # type: ignore[arg-type]
            echo_guard_disabled=not guard,
            echo_handling=echo_handling,  # type: ignore[arg-type]
        ),
    )
    speak = pb.ConverseRequest(speak=pb.Speak(text=reply, speak_id="reply"))
    await rpc.write(pb.ConverseRequest(config=cfg))
    if not talking_first:
        await rpc.write(speak)
    sent_ms = [0.0]  # inbound audio written so far: the call's audio clock
    reply_frames: list[tuple[float, float]] = []  # (audio clock at arrival, ms of reply audio)
    cut_ms: float | None = None

    async def read() -> None:
        nonlocal cut_ms
        while (msg := await rpc.read()) is not grpc.aio.EOF:
            now = time.monotonic()
            kind = msg.WhichOneof("event")
            res.events.append(kind)
            if kind == "audio":
                line.heard(unmulaw(msg.audio.data), now)
                reply_frames.append((sent_ms[0], len(msg.audio.data) / 8.0))  # μ-law 8 kHz
                first_audio.set()
            elif kind == "interrupted":
                res.interrupted_at = now
                res.caller_text = msg.interrupted.caller_text
                res.played_ms = msg.interrupted.played_ms
                res.at_offset_ms = msg.interrupted.at_offset_ms
                cut_ms = sent_ms[0]
                done.set()
            elif kind == "playback_finished":
                res.finished = True
                done.set()
            elif kind == "speech" and msg.speech.type == pb.SpeechEvent.SPEECH_BEGIN:
                res.speech_begins += 1
                if (
                    res.begin_at is None
                    and res.onset_sent_at is not None
                    and msg.speech.offset_ms >= 1000 * CALLER_AT_S - 100
                ):
                    res.begin_at = now

    reader = asyncio.create_task(read())
    if not talking_first:
        started = asyncio.create_task(first_audio.wait())
        await asyncio.wait({started, reader}, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        if not first_audio.is_set():
            started.cancel()
            if reader.done():
                reader.result()  # the call failed: say why
            raise TimeoutError("no reply audio within 60 s")
    t0 = time.monotonic()
    start = round(CALLER_AT_S * 8000)
    speak_at_k: int | None = None
    if caller is not None:
        res.onset_sent_at = t0 + CALLER_AT_S + onset_s(caller)
        if speak_after_s is not None:
            speak_at_k = round((CALLER_AT_S + onset_s(caller) + speak_after_s) * 8000 / FRAME)
    k = 0
    stop_at: float | None = None
    while True:
        t = t0 + k * FRAME / 8000
        await asyncio.sleep(max(0.0, t - time.monotonic()))
        if k == speak_at_k:
            await rpc.write(speak)
            res.speak_sent_ms = sent_ms[0]
        x = line.echo(t, FRAME)
        lo = k * FRAME - start  # the caller starts on a frame boundary
        if caller is not None and 0 <= lo < len(caller):
            seg = caller[lo : lo + FRAME]
            x[: len(seg)] += seg
        await rpc.write(pb.ConverseRequest(audio=pb.AudioChunk(data=mulaw(x))))
        k += 1
        sent_ms[0] = k * FRAME / 8.0
        if done.is_set() and stop_at is None:
            stop_at = t + 0.5  # a little more line audio: no late events are missed
        if (stop_at is not None and t >= stop_at) or t - t0 > max_s:
            break
    await rpc.write(pb.ConverseRequest(hangup=pb.Hangup()))
    await rpc.done_writing()
    await asyncio.wait_for(reader, 60)
    if talking_first and caller is not None:
        talk_from = 1000.0 * (CALLER_AT_S + onset_s(caller))
        talk_to = 1000.0 * (CALLER_AT_S + last_loud_s(caller))
        until = talk_to if cut_ms is None else min(cut_ms, talk_to)
        res.overlap_ms = sum(ms for at, ms in reply_frames if talk_from <= at < until)
    return res


#: What the backchannel callers say (the bundled voice): listening, not interrupting.
BACKCHANNELS = ("Yeah. Okay.", "Mm-hmm.", "Uh-huh, right.", "Okay.")


async def backchannel_audio(stub: pb_grpc.VoiceGatewayStub, text: str) -> np.ndarray:
    """A caller who only says ``text`` (the bundled voice), μ-law 8 kHz as float."""
    req = pb.SynthesizeRequest(
        text=text, output_audio=pb.AudioFormat(encoding=pb.MULAW, sample_rate_hertz=8000)
    )
    data = b"".join([r.data async for r in stub.Synthesize(req)])
    return unmulaw(data)


#: Shared clips the background callers of ``--background`` talk with (other speakers than
#: the barge-in callers).
BACKGROUND_CLIPS = (
    "librispeech_1988-24833-0000.wav",
    "vctk_p238_165.wav",
    "fleurs_en_us_test_003.wav",
    "ljspeech_LJ001-0001.wav",
    "librispeech_2412-153948-0000.wav",
    "vctk_p376_193.wav",
)


async def background_caller(stub: pb_grpc.VoiceGatewayStub, index: int) -> None:
    """Another call on the same gateway: talks without end (clips, 1 s pauses), asks interims.

    Its interims and finals compete for the same batcher as the measured call's barge-in
    interims, which is the case ``session.barge_in.urgent_interims`` is for. Runs until
    cancelled, then hangs up.
    """
    order = BACKGROUND_CLIPS[index % len(BACKGROUND_CLIPS) :] + BACKGROUND_CLIPS
    pause = np.zeros(8000, np.float32)
    audio = np.concatenate([part for name in order for part in (load_caller(name), pause)])
    audio = np.concatenate([np.zeros(index * 2000, np.float32), audio])  # staggered starts
    rpc = stub.Converse()
    cfg = pb.SessionConfig(
        input_audio=pb.AudioFormat(encoding=pb.MULAW, sample_rate_hertz=8000),
        interim_results=True,
    )
    await rpc.write(pb.ConverseRequest(config=cfg))

    async def drain() -> None:
        while await rpc.read() is not grpc.aio.EOF:
            pass

    reader = asyncio.create_task(drain())
    t0, k = time.monotonic(), 0
    try:
        while True:
            t = t0 + k * FRAME / 8000
            await asyncio.sleep(max(0.0, t - time.monotonic()))
            lo = (k * FRAME) % (len(audio) - FRAME)
            await rpc.write(
                pb.ConverseRequest(audio=pb.AudioChunk(data=mulaw(audio[lo : lo + FRAME])))
            )
            k += 1
    except asyncio.CancelledError:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await rpc.write(pb.ConverseRequest(hangup=pb.Hangup()))
            await rpc.done_writing()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(reader, 30)
        raise


#: (text, language, routing key) of every interim decode with text, in order: the tap below.
INTERIMS: list[tuple[str, str, str]] = []


def tap_interims() -> None:
    """Record what each interim decode returned (the client does not ask for interims).

    A wrapper on the in-process recogniser's ``transcribe``: the measured path stays the
    default one (no interims sent, no word alignment), and calls run one at a time, so the
    entries between two calls are that call's.
    """
    transcribe = AsrTranscriber.transcribe
    if getattr(transcribe, "tapped", False):
        return  # once per process (main may run more than once)

    async def tapped(self: AsrTranscriber, request: AsrRequest) -> AsrResult:
        result = await transcribe(self, request)
        if not request.is_final and result.text:
            INTERIMS.append((result.text, result.language, request.options.model))
        return result

    tapped.tapped = True  # type: ignore[attr-defined]
    AsrTranscriber.transcribe = tapped  # type: ignore[method-assign]


#: ``--talking-first``: the Speak goes out this long after the caller's first word.
TALKING_FIRST_SPEAK_AFTER_S = 0.5


async def talking_first(
    stub: pb_grpc.VoiceGatewayStub, callers: tuple[str, ...], repeats: int, reply: str
) -> dict[str, dict[str, list[float]]]:
    """The caller is talking when the Speak arrives: how much of the reply they hear over
    their own speech, per policy, with no echo and with the reply echoed at -20 dB, 120 ms.

    Returns ``{case: {"overlap_ms": [...], "played_ms": [...]}}`` (``played_ms``: what the
    server reported heard at the cut; the reply's length, as -1, for a reply never cut).
    """
    policies = (
        ("immediate", pb.BARGE_IN_IMMEDIATE),
        ("after_words", pb.BARGE_IN_AFTER_WORDS),
        ("never", pb.BARGE_IN_NEVER),
    )
    lines: tuple[tuple[str, float | None], ...] = (("no echo", None), ("echo -20 dB", -20.0))
    clips = {name: load_caller(name) for name in callers}
    out: dict[str, dict[str, list[float]]] = {}
    for _ in range(repeats):
        for clip in clips.values():
            for pname, policy in policies:
                for lname, level in lines:
                    r = await run_call(
                        stub,
                        guard=True,
                        policy=policy,
                        level_db=level,
                        caller=clip,
                        reply=reply,
                        speak_after_s=TALKING_FIRST_SPEAK_AFTER_S,
                    )
                    cell = out.setdefault(f"{pname}, {lname}", {"overlap_ms": [], "played_ms": []})
                    cell["overlap_ms"].append(r.overlap_ms if r.overlap_ms is not None else -1.0)
                    cell["played_ms"].append(-1.0 if r.played_ms is None else float(r.played_ms))
    print(
        f"\ncaller talking when the Speak arrives ({TALKING_FIRST_SPEAK_AFTER_S} s after their "
        "first word): reply ms heard while they still talked (median / p95), per call; "
        "played_ms at the cut (-1: never cut)"
    )
    for label, cell in out.items():
        print(f"  {label:<28} {fmt_ms(cell['overlap_ms'])}   n={len(cell['overlap_ms'])}")
        print("      per call: " + ", ".join(f"{v:.0f}" for v in cell["overlap_ms"]))
        print("      played_ms: " + ", ".join(f"{v:.0f}" for v in cell["played_ms"]))
    return out


def fmt_ms(values: list[float]) -> str:
    if not values:
        return "-"
    missed = sum(1 for v in values if v == float("inf"))
    text = f"{median(values):.0f} / {percentile(values, 95):.0f}"
    return text + (f" ({missed} missed)" if missed else "")


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    levels = LEVELS_DB[:1] if args.tiny else LEVELS_DB
    delays = DELAYS_MS[1:2] if args.tiny else DELAYS_MS
    callers = CALLERS[:1] if args.tiny else CALLERS
    repeats = 1 if args.tiny else args.repeats
    reply = SHORT_REPLY if args.tiny else REPLY
    asr: dict[str, Any] = {"barge_in_model": args.barge_in_model} if args.barge_in_model else {}
    cfg = load_config(None, {"engines": "asr,tts", "asr": asr})
    hub = build_hub(cfg)
    # The default configuration, admission and the ladder included: one caller at a time is
    # always admitted and never past capacity.
    overrides: dict[str, Any] = {"limits": {"idle_timeout_s": 0}}
    own_model = {"barge_in": {"barge_in_model": False}}  # the hub's barge-in model is a variant
    out: dict[str, Any] = {"echo": [], "latency": {}, "backchannel": {}}
    async with contextlib.AsyncExitStack() as stack:
        srv = await stack.enter_async_context(
            running_server(hub=hub, **overrides, session=own_model)
        )
        ch = await stack.enter_async_context(grpc.aio.insecure_channel(srv.target))
        stub = pb_grpc.VoiceGatewayStub(ch)
        # --first-interim-ms: one more server per value over the same engines, so that the
        # after_words variants are interleaved call by call (same load, same models).
        variants: dict[str, pb_grpc.VoiceGatewayStub] = {}
        if args.barge_in_model:
            vs = await stack.enter_async_context(running_server(hub=hub, **overrides))
            vch = await stack.enter_async_context(grpc.aio.insecure_channel(vs.target))
            variants[f"word count by {args.barge_in_model}"] = pb_grpc.VoiceGatewayStub(vch)
        barge_in_variants = [
            (f"first interim at {ms} ms voiced", {"first_interim_speech_ms": ms})
            for ms in args.first_interim_ms or []
        ]
        barge_in_variants += [
            (
                f"overlap {ms} ms" if ms else "one interim at a time",
                {"overlap_interim_ms": ms},
            )
            for ms in args.overlap_interim_ms or []
        ]
        for vname, barge_in in barge_in_variants:
            vs = await stack.enter_async_context(
                running_server(
                    hub=hub,
                    **overrides,
                    session={"barge_in": {**barge_in, "barge_in_model": False}},
                )
            )
            vch = await stack.enter_async_context(grpc.aio.insecure_channel(vs.target))
            variants[vname] = pb_grpc.VoiceGatewayStub(vch)
        language_variants: dict[str, dict[str, Any]] = {
            "detect on every interim (before)": {"learn": False},
            "short prefixes need a sure detection": {
                "interim_detect_min_ms": 1500,
                "interim_min_probability": 0.7,
            },
            "interims default to en": {"interim_default": "en"},
        }
        if args.background:
            # The same server but with barge-in interims ranked as any interim (before
            # session.barge_in.urgent_interims), so both are measured under the same load.
            vs = await stack.enter_async_context(
                running_server(
                    hub=hub,
                    **overrides,
                    session={"barge_in": {"urgent_interims": False, "barge_in_model": False}},
                )
            )
            vch = await stack.enter_async_context(grpc.aio.insecure_channel(vs.target))
            variants["interims not urgent (before)"] = pb_grpc.VoiceGatewayStub(vch)
        for vname, language in language_variants.items() if args.language_variants else ():
            vs = await stack.enter_async_context(
                running_server(hub=hub, **overrides, session={"language": language, **own_model})
            )
            vch = await stack.enter_async_context(grpc.aio.insecure_channel(vs.target))
            variants[vname] = pb_grpc.VoiceGatewayStub(vch)
        # --echo-canceller aec3 gate_aec3: the same engines behind a server per echo
        # canceller; their columns and cases run interleaved with the guard's.
        columns: list[tuple[str, pb_grpc.VoiceGatewayStub, bool]] = [
            ("today", stub, False),
            ("now", stub, True),
        ]
        aec_stubs: dict[str, pb_grpc.VoiceGatewayStub] = {}
        default = BargeInConfig().echo_canceller  # the "now" column's
        for canceller in dict.fromkeys(c for c in args.echo_canceller if c != default):
            aec_session = {"barge_in": {"barge_in_model": False, "echo_canceller": canceller}}
            asrv = await stack.enter_async_context(
                running_server(hub=hub, **overrides, session=aec_session)
            )
            ach = await stack.enter_async_context(grpc.aio.insecure_channel(asrv.target))
            aec_stubs[canceller] = pb_grpc.VoiceGatewayStub(ach)
            columns.append((canceller, aec_stubs[canceller], True))
        path = None if not args.echo_path_ms else dispersive_path(args.echo_path_ms)
        print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start")
        if args.talking_first:
            out["talking_first"] = await talking_first(stub, callers, repeats, reply)
            return out
        if path is not None:
            print(f"echo path: spread over 12 ms, decaying with tau {args.echo_path_ms} ms")
        if args.only == "after_words":
            levels = []  # no echo grid: the after_words latencies only
        print("echo only: false barge-ins (calls interrupted / calls), SPEECH_BEGIN events")
        print(f"{'level':>6} {'delay':>6} | " + " | ".join(f"{c[0]:>14}" for c in columns))
        for level in levels:
            for delay in delays:
                row: dict[str, Any] = {"level_db": level, "delay_ms": delay}
                for name, on, guard in columns:
                    runs = [
                        await run_call(
                            on, guard=guard, level_db=level, delay_ms=delay, reply=reply, path=path
                        )
                        for _ in range(repeats)
                    ]
                    row[name] = {
                        "false_barge_ins": sum(r.interrupted_at is not None for r in runs),
                        "calls": len(runs),
                        "speech_begins": sum(r.speech_begins for r in runs),
                    }
                out["echo"].append(row)
                cells = [
                    f"{row[c]['false_barge_ins']}/{row[c]['calls']}, "
                    f"{row[c]['speech_begins']:>2} begins"
                    for c, _, _ in columns
                ]
                print(f"{level:>4}dB {delay:>4}ms | " + " | ".join(f"{c:>14}" for c in cells))

        lat: dict[str, list[float]] = {}
        begin_lat: dict[str, list[float]] = {}
        texts: list[str] = []
        # label -> [interims with text, not in English, decoded by the barge-in model]
        interims: dict[str, list[int]] = {}
        tap_interims()
        cases: list[tuple[str, dict[str, Any]]] = [
            ("immediate, today (no echo, guard off)", {"guard": False}),
            ("immediate, now (no echo)", {"guard": True}),
        ]
        cases += [
            (f"immediate, now (echo {lv} dB, 120 ms)", {"guard": True, "level_db": lv})
            for lv in levels
        ]
        for canceller, aec_stub in aec_stubs.items():
            variants[canceller] = aec_stub
            cases += [(f"immediate, {canceller} (no echo)", {"guard": True, "variant": canceller})]
            cases += [
                (
                    f"immediate, {canceller} (echo {lv} dB, 120 ms)",
                    {"guard": True, "level_db": lv, "variant": canceller},
                )
                for lv in levels
            ]
        if args.only == "after_words":
            cases = [
                ("immediate, now (no echo)", {"guard": True}),
                ("after_words, now (no echo)", {"guard": True, "policy": pb.BARGE_IN_AFTER_WORDS}),
            ]
        cases += [
            (
                "after_words, now (echo -20 dB, 120 ms)",
                {"guard": True, "level_db": -20, "policy": pb.BARGE_IN_AFTER_WORDS},
            )
        ]
        words = [(label, kw) for label, kw in cases if "policy" in kw]
        for vname in variants:
            cases += [(f"{label}, {vname}", {**kw, "variant": vname}) for label, kw in words]
        if args.only == "echo":
            cases = [(label, kw) for label, kw in cases if "policy" not in kw]
        clips = {name: load_caller(name) for name in callers}
        background = [
            asyncio.create_task(background_caller(stub, i)) for i in range(args.background)
        ]
        if background:
            print(f"{len(background)} background callers talking (interims on) during these calls")
            await asyncio.sleep(3.0)  # let them reach speech
        for _ in range(repeats):
            for name, clip in clips.items():
                for label, kw in cases:  # interleaved: every case sees the same machine load
                    call_kw = dict(kw)
                    on = variants[call_kw.pop("variant")] if "variant" in call_kw else stub
                    first = len(INTERIMS)
                    r = await run_call(on, caller=clip, reply=reply, path=path, **call_kw)
                    seen = INTERIMS[first:]
                    count = interims.setdefault(label, [0, 0, 0])
                    count[0] += len(seen)
                    count[1] += sum(lang != "en" for _, lang, _ in seen)
                    count[2] += sum(key == BARGE_IN_KEY for _, _, key in seen)
                    lat.setdefault(label, []).append(r.latency_ms)
                    begin_lat.setdefault(label, []).append(r.begin_latency_ms)
                    if r.caller_text:
                        texts.append(f"{label} | {name}: {r.caller_text!r}")
        for task in background:
            task.cancel()
        for task in background:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        print("\ntrue barge-in: caller's first word -> interrupted, ms (median / p95)")
        for label, values in lat.items():
            print(
                f"  {label:<72} {fmt_ms(values)}   n={len(values)}   "
                f"(to SPEECH_BEGIN: {fmt_ms(begin_lat[label])})"
            )
            print("      per call: " + ", ".join(f"{v:.0f}" for v in values))
            out["latency"][label] = values
            out.setdefault("begin_latency", {})[label] = begin_lat[label]
        for t in texts:
            print(f"    after_words heard {t}")
        print("\ninterim decodes with text (all calls of the case): how many, how many not English")
        if background:
            print("  (counted in this process: the background callers' interims are included)")
        for label, (n, foreign, by_word_model) in interims.items():
            by = f", {by_word_model} by the barge-in model" if args.barge_in_model else ""
            print(f"  {label:<72} {n:>3} interims, {foreign} not English{by}")
        out["interims"] = {
            k: {"with_text": v[0], "not_english": v[1], "barge_in_model": v[2]}
            for k, v in interims.items()
        }

        if args.only == "echo":
            return out
        phrases = BACKCHANNELS[:1] if args.tiny else BACKCHANNELS
        backs = [await backchannel_audio(stub, text) for text in phrases]
        back_cases = [
            ("immediate", stub, pb.BARGE_IN_IMMEDIATE),
            ("after_words", stub, pb.BARGE_IN_AFTER_WORDS),
        ]
        back_cases += [
            (f"after_words, {vname}", vstub, pb.BARGE_IN_AFTER_WORDS)
            for vname, vstub in variants.items()
        ]
        heard: list[str] = []
        for _ in range(repeats):
            for text, back in zip(phrases, backs, strict=True):
                for label, on, policy in back_cases:
                    r = await run_call(
                        on, guard=True, caller=back, policy=policy, level_db=-20, reply=reply
                    )
                    cell = out["backchannel"].setdefault(label, {"interrupted": 0, "calls": 0})
                    cell["calls"] += 1
                    if r.interrupted_at is not None:
                        cell["interrupted"] += 1
                        if policy == pb.BARGE_IN_AFTER_WORDS:
                            heard.append(f"{label} | {text!r} heard as {r.caller_text!r}")
        said = ", ".join(repr(t) for t in phrases)
        print(f"\ncaller says only {said} over the reply (echo -20 dB): calls interrupted")
        for label, v in out["backchannel"].items():
            print(f"  {label:<60} {v['interrupted']}/{v['calls']}")
        for line in heard:
            print(f"    {line}")
        out["backchannel_heard"] = heard
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2, help="calls per cell")
    ap.add_argument("--tiny", action="store_true", help="one cell of each kind (for the test)")
    ap.add_argument(
        "--only",
        choices=("all", "after_words", "echo"),
        default="all",
        help="after_words: only the true barge-in latencies under after_words (and immediate); "
        "echo: only the echo grid and the immediate latencies",
    )
    ap.add_argument(
        "--echo-canceller",
        nargs="+",
        choices=("gate", "gate_aec3", "aec3"),
        default=[],
        help="gate, aec3 (one or both; the default gate_aec3 is the 'now' column): also run "
        "the echo grid and the immediate cases on a server per echo canceller "
        "(session.barge_in.echo_canceller), interleaved with the default's",
    )
    ap.add_argument(
        "--echo-path-ms",
        type=float,
        default=0.0,
        help="echo through a path that spreads (decay time constant, ms; "
        "benchmarks.echo_canceller.dispersive_path) instead of a flat one",
    )
    ap.add_argument(
        "--first-interim-ms",
        type=lambda v: [int(x) for x in v.split(",")],
        help="also run the after_words cases on servers whose first interim over the reply "
        "waits for this much voiced audio (comma-separated ms), interleaved with the default",
    )
    ap.add_argument(
        "--overlap-interim-ms",
        type=lambda v: [int(x) for x in v.split(",")],
        help="also run the after_words cases on servers whose next barge-in interim may start "
        "this long after one still decoding (session.barge_in.overlap_interim_ms; "
        "comma-separated ms, 0 = one at a time, as before), interleaved with the default",
    )
    ap.add_argument(
        "--language-variants",
        action="store_true",
        help="also run the after_words cases on servers that detect the language on every "
        "interim (as before session.language), that need a sure detection on short prefixes, "
        "and whose interims default to English",
    )
    ap.add_argument(
        "--background",
        type=int,
        default=0,
        help="other callers talking on the same gateway (interims on) during the barge-in "
        "calls; also runs the after_words cases with barge-in interims not urgent, interleaved",
    )
    ap.add_argument(
        "--barge-in-model",
        help="also run the after_words cases with their word-count interims decoded by this "
        "model (asr.barge_in_model, e.g. tiny.en), interleaved with the call's own model",
    )
    ap.add_argument(
        "--talking-first",
        action="store_true",
        help="only calls where the caller is already talking when the Speak arrives (every "
        "policy, with and without echo): the reply ms they hear over their own speech",
    )
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    out = asyncio.run(main_async(args))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
