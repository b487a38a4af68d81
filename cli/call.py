"""``voxgate call``: play a WAV as the caller against a gateway, with a bot answering.

The bot is any ``--bot`` value (:func:`voxgate.bridges.bots.load_bot`: the built-in rules or echo,
run in-process, or ``grpc://host:port`` of a bot in its own process); this command is then one more
door on the bot contract: it holds the call, plays the caller, and hands the call to the bot
through :class:`voxgate_client.BotLink`, exactly as the SIP bridge and the media-stream adapter
do.

Prints events as they happen (interim text updates in place on a terminal), optionally writes
the bot's reply audio and a timeline PNG, and ends with a latency table. :func:`play_call` is
the reusable core (``voxgate demo`` and the tests call it directly).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TextIO

import grpc

from voxgate.bridges.bots import Bot, load_bot
from voxgate.bridges.door_args import connection_from_args, turn_options_from_args
from voxgate.cli.timeline import CallLog, draw_timeline
from voxgate_client import (
    AS_FAST_AS_ALLOWED,
    REALTIME,
    AudioOut,
    BotLink,
    Call,
    CallConfig,
    CallEndedError,
    CallInfo,
    Dtmf,
    EndOfTurn,
    ErrorEvent,
    MarkReached,
    PlaybackFinished,
    PlaybackInterrupted,
    ReplyRecorder,
    ServerEvent,
    SessionStarted,
    SpeechBegin,
    SpeechEnd,
    Transcript,
    TurnOptions,
    VoxgateClient,
    VoxgateError,
    WireAudio,
    decode_pcm16,
    load_audio,
    stream_audio,
)
from voxgate_client._proto import voxgate_pb2 as pb

__all__ = [
    "CallOptions",
    "CallResult",
    "WaitForBot",
    "play_call",
    "run_call",
]

#: Mark sent after the last audio chunk and the flush: once it is reached, the server has seen
#: everything the caller said.
EOF_MARK = "voxgate-cli-end-of-audio"

#: How long the caller waits, after a final transcript, for the bot to act on it: the bot runs
#: behind a link (perhaps in another process), and may decide to say nothing.
REPLY_WAIT_S = 5.0

#: How the caller takes turns with the bot (``--wait-for-bot``). ``never``: the file plays
#: straight through, over anything the bot says. ``start``: the caller hears the opening lines
#: (``--say`` and the greeting) out, and after each utterance waits only until the bot starts
#: answering (or decides not to), so an utterance that follows before the answer ends talks
#: over it (barge-in). ``end``: as ``start``, but it waits until each answer has ended, so
#: nothing is interrupted.
WaitForBot = Literal["never", "start", "end"]
WAIT_FOR_BOT_CHOICES: tuple[WaitForBot, ...] = ("never", "start", "end")


@dataclass(frozen=True, slots=True)
class CallOptions:
    """What ``voxgate call`` does (the parsed flags).

    Attributes:
        wait_for_bot: when the caller's audio pauses for the bot (see :data:`WaitForBot`).
        hangup_wait_s: after the audio ends, hang up at the latest this long after it even if
            transcripts or replies are still due (a safety net, never reached normally).
        turns: the call's turn detection (``--turns``, ``--turn-eagerness``); the default
            keeps the server's. With it on, the bot answers each EndOfTurn, not each final.
    """

    file: Path
    target: str = "127.0.0.1:50051"
    realtime: bool = False
    say: tuple[str, ...] = ()
    bot: str = ""
    out: Path | None = None
    timeline: Path | None = None
    mulaw: bool = False
    interim_results: bool = True
    wait_for_bot: WaitForBot = "never"
    tls: bool | grpc.ChannelCredentials = False
    token: str | None = None
    hangup_wait_s: float = 120.0
    turns: TurnOptions = field(default_factory=TurnOptions)


@dataclass
class CallResult:
    """What happened on the call (for the demo and tests)."""

    exit_code: int
    events: list[ServerEvent] = field(default_factory=list)
    replies: list[tuple[str, str]] = field(default_factory=list)  # (speak_id, text)
    error: VoxgateError | None = None
    log: CallLog | None = None

    @property
    def finals(self) -> list[Transcript]:
        """Final transcripts in utterance order."""
        out = [e for e in self.events if isinstance(e, Transcript) and e.is_final]
        return sorted(out, key=lambda t: t.utterance_index)


async def run_call(args: argparse.Namespace) -> int:
    """Entry point of ``voxgate call`` (see cli/_main.py for the flags)."""
    raw = getattr(args, "wait_for_bot", None)
    wait = _wait_mode(raw)
    if wait is None:
        choices = ", ".join(WAIT_FOR_BOT_CHOICES)
        print(f"voxgate call: --wait-for-bot {raw!r}: use one of {choices}", file=sys.stderr)
        return 2
    try:
        tls, token = connection_from_args(args)
        turns = turn_options_from_args(args)
    except ValueError as exc:
        print(f"voxgate call: {exc}", file=sys.stderr)
        return 2
    opts = CallOptions(
        file=Path(args.file),
        target=args.target,
        realtime=bool(args.realtime),
        say=tuple(args.say or ()),
        bot=args.bot or "",
        out=args.out,
        timeline=args.timeline,
        mulaw=bool(args.mulaw),
        wait_for_bot=wait,
        tls=tls,
        token=token,
        turns=turns,
    )
    return (await play_call(opts)).exit_code


def _wait_mode(value: object) -> WaitForBot | None:
    """``--wait-for-bot``'s value as a mode; None when it is not one.

    A bool is the flag's old form (it took no value), kept for scripts that build the
    namespace themselves: True is ``end``, False ``never``.
    """
    if value is None or value is False:
        return "never"
    if value is True:
        return "end"
    for mode in WAIT_FOR_BOT_CHOICES:
        if value == mode:
            return mode
    return None


class _Printer:
    """Timestamped lines; on a TTY, interim text rewrites one line in place."""

    def __init__(self, stream: TextIO, t0_s: float) -> None:
        self.stream = stream
        self.t0_s = t0_s
        self.tty = stream.isatty()
        self._interim_open = False

    def _stamp(self, t_s: float) -> str:
        return f"[{t_s - self.t0_s:6.2f}s]"

    def line(self, t_s: float, text: str) -> None:
        if self._interim_open:
            self.stream.write("\r\x1b[K")
            self._interim_open = False
        self.stream.write(f"{self._stamp(t_s)} {text}\n")
        self.stream.flush()

    def interim(self, t_s: float, text: str) -> None:
        if not self.tty:
            self.line(t_s, f"  ... {text}")
            return
        self.stream.write(f"\r\x1b[K{self._stamp(t_s)}   ... {text}")
        self.stream.flush()
        self._interim_open = True


@dataclass
class _CallState:
    """Bookkeeping that decides when the call is over and feeds the latency table."""

    has_asr: bool = False
    #: The call has turn detection on: the bot answers EndOfTurn, not each final.
    turns_on: bool = False
    eof_reached: bool = False
    hung_up: bool = False
    open_utterances: set[int] = field(default_factory=set)  # ended, final not yet seen
    open_turns: set[int] = field(default_factory=set)  # a final seen, its EndOfTurn not yet
    open_speaks: set[str] = field(default_factory=set)  # sent, not finished/interrupted
    # Finals the bot has not acted on yet (each for at most REPLY_WAIT_S).
    awaiting_reply: set[int] = field(default_factory=set)
    opening: set[str] = field(default_factory=set)  # --say and greeting speak ids
    speech_end_s: dict[int, float] = field(default_factory=dict)
    # SPEECH_END offsets: the end of each utterance's last word, ms of the call's audio.
    speech_end_ms: dict[int, int] = field(default_factory=dict)
    final_s_of_speak: dict[str, float] = field(default_factory=dict)
    first_audio_s: dict[str, float] = field(default_factory=dict)
    eos_to_final_ms: list[float] = field(default_factory=list)
    server_latency_ms: list[float] = field(default_factory=list)
    final_to_audio_ms: list[float] = field(default_factory=list)
    # Per reply: where the speech it answers ended, ms of the call's audio (the final's end,
    # or the turn's for an EndOfTurn), and then the caller's last word -> first reply audio.
    answered_end_ms: dict[str, int] = field(default_factory=dict)
    voice_to_voice_ms: list[float] = field(default_factory=list)

    @property
    def idle(self) -> bool:
        return self.eof_reached and not self.busy

    @property
    def busy(self) -> bool:
        """The bot has something to answer or to finish saying."""
        return bool(
            self.open_utterances or self.open_turns or self.open_speaks or self.awaiting_reply
        )

    def caller_waits(self, mode: WaitForBot) -> bool:
        """Whether a caller taking turns by ``mode`` holds its audio now.

        With turn detection on, never for speech the bot has not been asked to answer yet
        (an utterance without its final, a turn without its EndOfTurn): the server ends a
        turn on the silence it hears, on the call's audio clock, so a caller that held its
        audio until then waited for good (``voxgate demo --turns smart`` did, once the final
        came before the turn's hold had passed), or at least delayed the turn by its wait.
        Its file plays on: the silence after the sentence ends the turn, or its next words
        continue it, as a caller's would; it waits for the bot's answer to the turn.
        """
        heard = not self.turns_on and bool(self.open_utterances)
        if mode == "end":
            return bool(heard or self.open_speaks or self.awaiting_reply)
        if mode == "start":
            unstarted = self.open_speaks - self.first_audio_s.keys()
            return bool(
                self.opening & self.open_speaks or heard or self.awaiting_reply or unstarted
            )
        return False


class _Gate(asyncio.Event):
    """The sender's gate (see :func:`stream_audio`) that reports each wait it causes.

    The timeline needs the waits: while the caller's audio is held, its clock stands still
    but the bot goes on speaking, and the picture shows that as a gap in the caller's audio.
    """

    def __init__(self, on_wait: Callable[[float, float], None]) -> None:
        super().__init__()
        self._on_wait = on_wait

    async def wait(self) -> Literal[True]:
        """Wait until set, then report ``(start, end)`` loop times of the wait."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        await super().wait()
        self._on_wait(start, loop.time())
        return True


def _input_error(exc: OSError | ValueError) -> str:
    """One line naming the file and what is wrong with it (no traceback, no errno)."""
    if isinstance(exc, OSError):
        name = exc.filename if exc.filename is not None else "input"
        if isinstance(exc, FileNotFoundError):
            why = "no such file"
        elif isinstance(exc, IsADirectoryError):
            why = "is a directory, not a file"
        elif isinstance(exc, PermissionError):
            why = "permission denied"
        else:
            why = (exc.strerror or str(exc)).lower()
        return f"{name}: {why}"
    return " ".join(str(exc).split())


async def play_call(opts: CallOptions, *, stream: TextIO | None = None) -> CallResult:
    """Play ``opts.file`` as the caller; see the module docstring.

    Returns:
        The call's events and an exit code: 0 done, 1 the server ended the call with an error
        (printed), 2 bad input (file, bot rules).
    """
    out = stream or sys.stdout
    try:
        audio = load_audio(opts.file, mulaw=opts.mulaw)
        bot = load_bot(opts.bot)
    except (OSError, ValueError) as exc:
        print(f"voxgate call: {_input_error(exc)}", file=sys.stderr)
        return CallResult(2)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    printer = _Printer(out, t0)
    log = CallLog(t0, decode_pcm16(audio.data, audio.encoding), audio.sample_rate_hz)
    result = CallResult(0, log=log)
    config = CallConfig(
        encoding=audio.encoding,
        sample_rate_hz=audio.sample_rate_hz,
        interim_results=opts.interim_results,
        call_id=f"voxgate-call:{opts.file.name}",
        turns=opts.turns,
    )
    mode = "real time" if opts.realtime else "as fast as the server allows"
    printer.line(
        t0,
        f"calling {opts.target} with {opts.file.name} ({audio.encoding} "
        f"{audio.sample_rate_hz} Hz, {audio.duration_ms / 1000:.1f} s, {mode})",
    )
    try:
        async with VoxgateClient(opts.target, opts.tls, opts.token) as client:
            # A file sent faster than real time says so: a busy server admits it from spare
            # capacity (deploy/README.md, "Admission and overload").
            call = await client.converse(config, bulk=not opts.realtime)
            async with call:
                await _converse(
                    call, audio, opts=opts, bot=bot, printer=printer, log=log, result=result
                )
    except VoxgateError as exc:
        printer.line(loop.time(), f"call ended with an error: {exc}")
        result.exit_code, result.error = 1, exc
    result.events = list(log.events)
    _finish(opts, result, printer, loop.time())
    return result


async def _converse(
    call: Call,
    audio: WireAudio,
    *,
    opts: CallOptions,
    bot: Bot | str | None,
    printer: _Printer,
    log: CallLog,
    result: CallResult,
) -> None:
    loop = asyncio.get_running_loop()
    session = call.session
    assert session is not None
    state = _CallState(has_asr=session.has_asr, turns_on=session.turn_detection != "off")
    recorder = ReplyRecorder.for_session(session)
    log.reply_encoding, log.reply_rate_hz = recorder.encoding, recorder.sample_rate_hz
    gate = _Gate(lambda start, end: log.pauses.append((start, end)))
    gate.set()
    # Set once the call has nothing left to do; the hanger task then hangs up. The state also
    # changes without an event (a silent bot's reply wait ending), so every change checks it.
    idle = asyncio.Event()

    def update_gate() -> None:
        if state.caller_waits(opts.wait_for_bot):
            gate.clear()
        else:
            gate.set()
        if state.idle:
            idle.set()

    async def say(text: str, *, opening: bool = False) -> None:
        if not session.has_tts:
            printer.line(loop.time(), f'bot (no voice on this server): "{text}"')
            return
        sid = await call.speak(text)
        state.open_speaks.add(sid)
        if opening:
            state.opening.add(sid)
        update_gate()
        log.speaks.append((loop.time(), sid, text))
        result.replies.append((sid, text))
        printer.line(loop.time(), f'bot: "{text}"')

    opening_done = asyncio.Event()
    # (received_s, end of its speech in ms of audio) of the latest final the bot has not
    # answered.
    last_final: list[tuple[float, int]] = []

    def bot_acted(req: pb.ConverseRequest) -> None:
        """The link's action tee: what the bot does, as this command shows and times it."""
        state.awaiting_reply.clear()
        if req.WhichOneof("event") == "speak" and not session.has_tts:
            printer.line(loop.time(), f'bot (no voice on this server): "{req.speak.text}"')
        elif req.WhichOneof("event") == "speak":
            sid, text = req.speak.speak_id, req.speak.text
            state.open_speaks.add(sid)
            if not opening_done.is_set():
                state.opening.add(sid)
            log.speaks.append((loop.time(), sid, text))
            result.replies.append((sid, text))
            printer.line(loop.time(), f'bot: "{text}"')
            if last_final:
                received_s, end_ms = last_final.pop()
                state.final_s_of_speak[sid] = received_s
                state.answered_end_ms[sid] = end_ms
        update_gate()

    def waited_long_enough(index: int) -> None:
        state.awaiting_reply.discard(index)
        update_gate()

    events: asyncio.Queue[ServerEvent | None] = asyncio.Queue()
    link = (
        BotLink(
            call,
            bot,
            CallInfo(call_id=session.effective_config.call_id, channel="converse"),
            on_event=events.put_nowait,
            on_action=bot_acted,
        )
        if bot is not None
        else None
    )

    async def send() -> None:
        for text in opts.say:
            await say(text, opening=True)
        if link is not None:
            runner.append(asyncio.create_task(run_link(link), name="voxgate-call-bot"))
            # The bot's opening lines (its first actions) come before the caller's audio.
            await link.wait_answered()
        opening_done.set()
        pacing = REALTIME if opts.realtime else AS_FAST_AS_ALLOWED
        await stream_audio(
            call, audio, pacing, on_chunk=lambda t, o: log.sent.append((t, o)), gate=gate
        )
        await call.flush()
        await call.mark(EOF_MARK)

    async def hang_up_when_idle() -> None:
        await idle.wait()
        if not state.hung_up:
            state.hung_up = True
            await call.hangup()

    async def watchdog() -> None:
        await asyncio.wait([sender])
        await asyncio.sleep(opts.hangup_wait_s)
        if not state.hung_up:
            printer.line(
                loop.time(),
                f"still busy {opts.hangup_wait_s:g} s after the audio ended; hanging up",
            )
            state.hung_up = True
            await call.hangup()

    async def run_link(link: BotLink) -> None:
        try:
            outcome = await link.run()
            if outcome.bot_fault is not None:
                printer.line(loop.time(), f"the bot failed the call: {outcome.reason}")
        finally:
            events.put_nowait(None)

    async def call_events() -> AsyncIterator[ServerEvent]:
        if link is None:
            async for ev in call:
                yield ev
            return
        while (teed := await events.get()) is not None:
            yield teed
        if (error := await call.error()) is not None:
            raise error

    _describe_session(session, printer)
    log.events.append(session)
    runner: list[asyncio.Task[None]] = []
    sender = asyncio.create_task(send(), name="voxgate-call-sender")
    guard = asyncio.create_task(watchdog(), name="voxgate-call-watchdog")
    hanger = asyncio.create_task(hang_up_when_idle(), name="voxgate-call-hangup")
    try:
        async for ev in call_events():
            if isinstance(ev, SessionStarted):
                continue  # already shown
            log.events.append(ev)
            if isinstance(ev, AudioOut):
                recorder.add(ev)
            reply = _show(ev, state, printer)
            if reply is not None and link is not None:
                index = (
                    reply.last_utterance_index
                    if isinstance(reply, EndOfTurn)
                    else reply.utterance_index
                )
                state.awaiting_reply.add(index)
                # The end of the caller's last word: the turn's, or the utterance's
                # SPEECH_END (the final's end_ms also holds the trailing silence kept).
                end_ms = (
                    reply.offset_ms
                    if isinstance(reply, EndOfTurn)
                    else state.speech_end_ms.get(index, reply.end_ms)
                )
                last_final[:] = [(reply.received_s, end_ms)]
                loop.call_later(REPLY_WAIT_S, waited_long_enough, index)
            update_gate()
    finally:
        for task in (guard, sender, hanger):
            task.cancel()
        await asyncio.wait([guard, sender, hanger])
        if link is not None:
            await link.aclose()
        if runner:
            await asyncio.wait(runner)
        # A sender that failed because the call ended reports the same status as the
        # iteration; retrieve it so it is not logged as unretrieved, and keep the iteration's.
        for task in (guard, sender, hanger):
            if not task.cancelled() and task.exception() is not None:
                exc = task.exception()
                if not isinstance(exc, VoxgateError | CallEndedError):
                    raise exc  # type: ignore[misc]
    if opts.out is not None:
        if recorder.frames:
            recorder.write_wav(opts.out)
            printer.line(
                loop.time(), f"reply audio: {opts.out} ({recorder.duration_ms / 1000:.1f} s)"
            )
        else:
            printer.line(loop.time(), f"no reply audio to write to {opts.out}")
    result.events = list(log.events)
    _record_latencies(state, log, realtime=opts.realtime)
    _latency_table(state, printer.stream)


def _describe_session(s: SessionStarted, printer: _Printer) -> None:
    parts = [f"connected: session {s.session_id}"]
    parts.append(f"model {s.model}" if s.has_asr else "no ASR (speech events only)")
    parts.append(f"voice {s.voice}" if s.has_tts else "no voice (replies are printed)")
    if s.turn_detection != "off":
        parts.append(f"turn detection {s.turn_detection}")
    printer.line(s.received_s, ", ".join(parts))


def _show(ev: ServerEvent, state: _CallState, printer: _Printer) -> Transcript | EndOfTurn | None:
    """Print one event and update the state; returns what the bot is to answer.

    That is each final, or with turn detection on each EndOfTurn (the built-in bots answer
    a turn, not the utterances of it: docs/turns.md), so the caller waits for it.
    """
    t = ev.received_s
    if isinstance(ev, SpeechBegin):
        printer.line(
            t,
            f"caller starts speaking (utterance {ev.utterance_index}, "
            f"{ev.offset_ms / 1000:.2f} s into the audio)",
        )
    elif isinstance(ev, SpeechEnd):
        printer.line(
            t,
            f"caller stops speaking  (utterance {ev.utterance_index}, "
            f"{ev.offset_ms / 1000:.2f} s into the audio)",
        )
        state.speech_end_s[ev.utterance_index] = t
        state.speech_end_ms[ev.utterance_index] = ev.offset_ms
        if state.has_asr:
            state.open_utterances.add(ev.utterance_index)
    elif isinstance(ev, Transcript):
        if not ev.is_final:
            printer.interim(t, ev.text)
            return None
        state.open_utterances.discard(ev.utterance_index)
        end = state.speech_end_s.get(ev.utterance_index)
        if end is not None:
            state.eos_to_final_ms.append(1000.0 * (t - end))
            # 0 is a real value: a speculative final can be ready as the hangover ends.
            state.server_latency_ms.append(float(ev.latency_ms))
        printer.line(
            t,
            f'caller: "{ev.text}"  (utterance {ev.utterance_index}, '
            f"confidence {ev.confidence:.2f}, server latency {ev.latency_ms} ms)",
        )
        if not state.turns_on:
            return ev
        if ev.turn_index is not None:
            state.open_turns.add(ev.turn_index)
    elif isinstance(ev, EndOfTurn):
        state.open_turns.discard(ev.turn_index)
        printer.line(
            t,
            f"end of turn {ev.turn_index} ({ev.reason or 'unknown'}, after "
            f"{ev.silence_ms} ms of silence, server latency {ev.latency_ms} ms)",
        )
        return ev
    elif isinstance(ev, AudioOut):
        if ev.speak_id not in state.first_audio_s:
            state.first_audio_s[ev.speak_id] = t
            printer.line(t, f"bot audio starts (speak {ev.speak_id})")
    elif isinstance(ev, PlaybackFinished):
        state.open_speaks.discard(ev.speak_id)
        printer.line(
            t, f"bot finished speaking ({ev.duration_ms / 1000:.2f} s, speak {ev.speak_id})"
        )
    elif isinstance(ev, PlaybackInterrupted):
        state.open_speaks.discard(ev.speak_id)
        heard = " ".join(ev.words_played)
        what = "BARGE-IN: caller interrupted the bot" if ev.barge_in else "playback cleared"
        printer.line(t, f"{what} after {ev.played_ms} ms (heard: {heard!r})")
    elif isinstance(ev, MarkReached):
        if ev.name == EOF_MARK:
            state.eof_reached = True
        else:
            printer.line(t, f"mark {ev.name!r} reached")
    elif isinstance(ev, ErrorEvent):
        if ev.scope == "utterance":
            state.open_utterances.discard(ev.utterance_index)
        if ev.speak_id:
            state.open_speaks.discard(ev.speak_id)
        printer.line(t, f"error ({ev.scope}): {ev.code.name}: {ev.message}")
    elif isinstance(ev, Dtmf):
        printer.line(t, f"dtmf {ev.digit}")
    return None


def _record_latencies(state: _CallState, log: CallLog, *, realtime: bool) -> None:
    for sid, final_s in state.final_s_of_speak.items():
        first = state.first_audio_s.get(sid)
        if first is not None:
            state.final_to_audio_ms.append(1000.0 * (first - final_s))
    if not realtime:
        return  # audio sent ahead of its time has no moment when the caller stopped talking
    for sid, end_ms in state.answered_end_ms.items():
        first = state.first_audio_s.get(sid)
        spoken = _sent_at(log.sent, end_ms)
        if first is not None and spoken is not None:
            state.voice_to_voice_ms.append(1000.0 * (first - spoken))


def _sent_at(sent: Sequence[tuple[float, float]], offset_ms: float) -> float | None:
    """When the caller said the audio at ``offset_ms`` (None if it was never sent).

    The clock time its chunk left, plus its place in the chunk: sent at real time, audio
    leaves as it is spoken.
    """
    for (t, start_ms), (_, next_ms) in itertools.pairwise(sent):
        if start_ms <= offset_ms < next_ms:
            return t + (offset_ms - start_ms) / 1000.0
    return None


def _latency_table(state: _CallState, stream: TextIO) -> None:
    rows = [
        ("end of speech -> final (client)", state.eos_to_final_ms),
        ("end of speech -> final (server)", state.server_latency_ms),
        ("final -> first reply audio", state.final_to_audio_ms),
        ("last word -> first reply audio", state.voice_to_voice_ms),
    ]
    stream.write(f"\n{'latency':34} {'n':>3} {'p50 ms':>8} {'max ms':>8}\n")
    for name, values in rows:
        if values:
            p50, top = statistics.median(values), max(values)
            stream.write(f"{name:34} {len(values):>3} {p50:>8.0f} {top:>8.0f}\n")
        else:
            stream.write(f"{name:34} {0:>3} {'-':>8} {'-':>8}\n")
    stream.flush()


def _finish(opts: CallOptions, result: CallResult, printer: _Printer, now_s: float) -> None:
    if opts.timeline is None or result.log is None:
        return
    try:
        draw_timeline(result.log, opts.timeline, title=f"voxgate call: {opts.file.name}")
    except RuntimeError as exc:  # matplotlib missing: the call itself still succeeded
        printer.line(now_s, f"timeline skipped: {exc}")
        return
    printer.line(now_s, f"timeline: {opts.timeline}")
