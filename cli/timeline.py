"""Draw a call as a PNG timeline on the call's audio clock.

Why the audio clock: ``voxgate call`` sends the caller's audio faster than real time unless
told otherwise, and may pause it while the bot answers (``--wait-for-bot``). Drawn at the
wall-clock time each chunk left, an 11 s sentence sent at 3.5x looks 3 s long and no longer
lines up with what the server reports, which is counted in milliseconds of caller audio
(``SPEECH_BEGIN``/``SPEECH_END`` ``offset_ms``, transcript ``start_ms``/``end_ms``, barge-in
``at_offset_ms``). So the x axis is *call time* (:class:`CallClock`): while the caller's audio
flows it advances exactly with that audio, one second per second of caller audio however fast
it was sent; while none flows (before it starts, while the caller waits for the bot, after it
ends) it advances with the wall clock. At real-time pace without pauses call time is simply
the wall clock.

Rows: the caller waveform with VAD segments (and grey where the caller waited); transcripts
and bot replies; reply audio; with barge-ins marked across all rows, and a legend.

The drawing is split in two: :func:`build_timeline` computes everything that is drawn, in
call-time seconds (pure, testable without pixels), and :func:`draw_timeline` renders it. It
needs matplotlib, the optional ``viz`` extra (``pip install 'voxgate[viz]'``), and draws on a
private ``Figure`` with the Agg canvas (no pyplot global state), so it is safe in threads and
needs no display.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from voxgate_client import (
    AudioOut,
    EncodingName,
    PlaybackInterrupted,
    ServerEvent,
    SpeechBegin,
    SpeechEnd,
    Transcript,
    decode_pcm16,
)

__all__ = [
    "CallClock",
    "CallLog",
    "Mark",
    "ReplyTrack",
    "Span",
    "Timeline",
    "build_timeline",
    "draw_timeline",
    "render_timeline",
]

#: Plot at most this many points per waveform; more only slows drawing down.
MAX_POINTS = 20_000

Floats = npt.NDArray[np.float64]

CALLER_COLOUR = "#3465a4"
SPEECH_COLOUR = "#8ae234"
WAIT_COLOUR = "#babdb6"
TEXT_COLOUR = "#204a87"
BOT_COLOUR = "#ce5c00"
BARGE_COLOUR = "#cc0000"


class CallClock:
    """Maps caller-audio offsets and client loop times onto call time (see the module doc).

    Built from the sender's log: ``sent`` holds ``(loop_time_s, offset_ms)`` as each chunk
    left (and once more at the end, with the total), ``pauses`` the ``(start_s, end_s)`` loop
    times the sender waited for the bot. Call time 0 is ``t0_s``, the start of the call.
    """

    def __init__(
        self,
        t0_s: float,
        sent: Sequence[tuple[float, float]],
        pauses: Sequence[tuple[float, float]] = (),
    ) -> None:
        """Lay the send log out on call time; see the class docstring for the inputs."""
        walls = np.array([t - t0_s for t, _ in sent], dtype=np.float64)
        offsets = np.array([o for _, o in sent], dtype=np.float64)
        n = len(walls)
        waited = np.zeros(n)
        wait_from = np.full(n, np.inf)
        wait_to = np.full(n, -np.inf)
        for start, end in pauses:
            # A pause delays the chunk sent right after it: the first one sent at or after
            # its end. One before the first chunk is already in that chunk's wall time.
            k = int(np.searchsorted(walls, end - t0_s - 1e-9, side="left"))
            if 0 < k < n:
                waited[k] += end - start
                wait_from[k] = min(wait_from[k], start - t0_s)
                wait_to[k] = max(wait_to[k], end - t0_s)
        xs = np.zeros(n)
        anchor_t: list[float] = [0.0]
        anchor_x: list[float] = [0.0]
        for k in range(n):
            if k == 0:
                xs[0] = walls[0]
            else:
                step = (offsets[k] - offsets[k - 1]) / 1000.0
                xs[k] = xs[k - 1] + step + waited[k]
                if waited[k] > 0:
                    # The wait shows as a gap right after chunk k-1's audio.
                    anchor_t += [wait_from[k], wait_to[k]]
                    anchor_x += [xs[k - 1] + step, xs[k]]
            anchor_t.append(float(walls[k]))
            anchor_x.append(float(xs[k]))
        self._offsets = offsets
        self._xs = xs
        self._anchor_t = np.maximum.accumulate(np.array(anchor_t))
        self._anchor_x = np.maximum.accumulate(np.array(anchor_x))
        self.t0_s = t0_s

    def offsets(self, offset_ms: npt.ArrayLike) -> Floats:
        """Call time (s) of caller-audio offsets (ms): each keeps its distance in audio."""
        o = np.asarray(offset_ms, dtype=np.float64)
        if len(self._offsets) == 0:
            return o / 1000.0
        k = np.clip(np.searchsorted(self._offsets, o, side="right") - 1, 0, None)
        out: Floats = self._xs[k] + (o - self._offsets[k]) / 1000.0
        return out

    def walls(self, loop_time_s: npt.ArrayLike) -> Floats:
        """Call time (s) of client loop times: with the audio while it flows, else 1:1."""
        t = np.asarray(loop_time_s, dtype=np.float64) - self.t0_s
        at, ax = self._anchor_t, self._anchor_x
        out: Floats = np.where(
            t >= at[-1], ax[-1] + (t - at[-1]), np.where(t <= at[0], t, np.interp(t, at, ax))
        )
        return out

    def offset(self, offset_ms: float) -> float:
        """:meth:`offsets` for one value."""
        return float(self.offsets(offset_ms))

    def wall(self, loop_time_s: float) -> float:
        """:meth:`walls` for one value."""
        return float(self.walls(loop_time_s))


@dataclass
class CallLog:
    """Everything a timeline needs, recorded by the CLI during a call.

    All times are client loop times in seconds; ``t0_s`` is the call's start.

    Attributes:
        caller_pcm: the caller audio as PCM16 at ``caller_rate_hz``.
        sent: ``(time_s, audio_offset_ms)`` as chunks left, and once at the end with the
            total: it maps audio time to wall time (they differ when audio is sent faster
            than real time or paused).
        pauses: ``(start_s, end_s)`` of each wait of the sender for the bot.
        events: every server event, with ``received_s``.
        speaks: ``(time_s, speak_id, text)`` for each reply the bot sent.
    """

    t0_s: float
    caller_pcm: npt.NDArray[np.int16]
    caller_rate_hz: int
    reply_encoding: EncodingName = "linear16"
    reply_rate_hz: int = 16000
    sent: list[tuple[float, float]] = field(default_factory=list)
    pauses: list[tuple[float, float]] = field(default_factory=list)
    events: list[ServerEvent] = field(default_factory=list)
    speaks: list[tuple[float, str, str]] = field(default_factory=list)

    def clock(self) -> CallClock:
        """The call-time axis of this log (recomputed: the log may still be growing)."""
        return CallClock(self.t0_s, self.sent, self.pauses)


@dataclass(frozen=True, slots=True)
class Span:
    """An interval of call time (seconds) with a label."""

    start_s: float
    end_s: float
    label: str = ""


@dataclass(frozen=True, slots=True)
class Mark:
    """A moment of call time (seconds) with a label."""

    at_s: float
    label: str = ""


@dataclass(frozen=True, slots=True)
class ReplyTrack:
    """One reply's audio as heard: from its first frame, cut where it was interrupted.

    Attributes:
        x: call time of each sample; the reply keeps its own (real-time) length.
        y: samples scaled to -1..1.
        interrupted: the PlaybackInterrupted event that cut it, if any.
    """

    speak_id: str
    x: Floats
    y: Floats
    interrupted: PlaybackInterrupted | None = None

    @property
    def start_s(self) -> float:
        """Call time of the reply's first sample."""
        return float(self.x[0]) if len(self.x) else 0.0

    @property
    def end_s(self) -> float:
        """Call time just after the reply's last heard sample."""
        return float(self.x[-1]) if len(self.x) else 0.0


@dataclass(frozen=True)
class Timeline:
    """Everything :func:`draw_timeline` draws, in call-time seconds.

    Attributes:
        caller_x: call time of each caller sample (audio keeps its true length).
        caller_y: caller samples scaled to -1..1.
        waits: where the caller waited for the bot (its audio paused, or not yet started).
        speech: VAD segments (SPEECH_BEGIN to SPEECH_END), labelled with the utterance and
            its offsets in the caller's audio.
        speech_open: SPEECH_BEGINs never ended (the call stopped mid-utterance).
        finals: each final transcript over the audio it transcribes (start_ms..end_ms).
        final_arrivals: when each final arrived (its latency is the gap after the span).
        interims: interim transcripts, when they arrived.
        speaks: bot replies, when the bot sent them.
        replies: reply audio, one track per speak.
        interruptions: where a reply was cut (barge-in or clear), labelled.
    """

    caller_x: Floats
    caller_y: Floats
    waits: tuple[Span, ...] = ()
    speech: tuple[Span, ...] = ()
    speech_open: tuple[Mark, ...] = ()
    finals: tuple[Span, ...] = ()
    final_arrivals: tuple[Mark, ...] = ()
    interims: tuple[Mark, ...] = ()
    speaks: tuple[Mark, ...] = ()
    replies: tuple[ReplyTrack, ...] = ()
    interruptions: tuple[Mark, ...] = ()

    @property
    def caller_span_s(self) -> float:
        """Drawn length of the caller audio, first sample to just after the last."""
        if len(self.caller_x) == 0:
            return 0.0
        step = float(self.caller_x[1] - self.caller_x[0]) if len(self.caller_x) > 1 else 0.0
        return float(self.caller_x[-1] - self.caller_x[0]) + step


def build_timeline(log: CallLog) -> Timeline:
    """Lay ``log`` out on call time (see the module docstring); pure, no matplotlib."""
    clock = log.clock()
    rate = log.caller_rate_hz
    caller_x = clock.offsets(np.arange(len(log.caller_pcm)) * 1000.0 / rate)
    caller_y = log.caller_pcm.astype(np.float64) / 32768.0

    waits = tuple(Span(clock.wall(a), clock.wall(b), "caller waits") for a, b in log.pauses)
    speech: list[Span] = []
    begins: dict[int, SpeechBegin] = {}
    finals: list[Span] = []
    arrivals: list[Mark] = []
    interims: list[Mark] = []
    for ev in log.events:
        if isinstance(ev, SpeechBegin):
            begins[ev.utterance_index] = ev
        elif isinstance(ev, SpeechEnd) and ev.utterance_index in begins:
            b = begins.pop(ev.utterance_index)
            # The label gives the offsets too: they are what the server and the CLI report.
            label = f"utt {b.utterance_index}: {b.offset_ms / 1000:.2f}-{ev.offset_ms / 1000:.2f} s"
            speech.append(Span(clock.offset(b.offset_ms), clock.offset(ev.offset_ms), label))
        elif isinstance(ev, Transcript) and ev.is_final:
            finals.append(Span(clock.offset(ev.start_ms), clock.offset(ev.end_ms), ev.text))
            arrivals.append(Mark(clock.wall(ev.received_s), ev.text))
        elif isinstance(ev, Transcript):
            interims.append(Mark(clock.wall(ev.received_s), ev.text))
    speech_open = tuple(Mark(clock.offset(b.offset_ms), f"utt {i}") for i, b in begins.items())
    speaks = tuple(Mark(clock.wall(t), text) for t, _sid, text in log.speaks)
    replies = _reply_tracks(log, clock)
    cut_at = {r.speak_id: r.end_s for r in replies if r.interrupted is not None}
    interruptions: list[Mark] = []
    for ev in log.events:
        if isinstance(ev, PlaybackInterrupted):
            what = "barge-in" if ev.barge_in else "cleared"
            at = cut_at.get(ev.speak_id, clock.wall(ev.received_s))
            interruptions.append(Mark(at, f"{what} ({ev.played_ms} ms played)"))
    return Timeline(
        caller_x=caller_x,
        caller_y=caller_y,
        waits=waits,
        speech=tuple(speech),
        speech_open=speech_open,
        finals=tuple(finals),
        final_arrivals=tuple(arrivals),
        interims=tuple(interims),
        speaks=speaks,
        replies=replies,
        interruptions=tuple(interruptions),
    )


def _reply_tracks(log: CallLog, clock: CallClock) -> tuple[ReplyTrack, ...]:
    """Each reply from its first frame's arrival, at its own length, cut at ``played_ms``.

    The server paces reply audio at real time (frames arrive up to its small playout lead
    early), so a reply is anchored once and then laid out by its frames' ``offset_ms``; mapping
    every frame through the clock would stretch it while caller audio is sent fast.
    """
    interrupted = {e.speak_id: e for e in log.events if isinstance(e, PlaybackInterrupted)}
    by_speak: dict[str, list[AudioOut]] = {}
    for ev in log.events:
        if isinstance(ev, AudioOut):
            by_speak.setdefault(ev.speak_id, []).append(ev)
    tracks: list[ReplyTrack] = []
    rate = log.reply_rate_hz
    for sid, frames in by_speak.items():
        frames.sort(key=lambda f: f.sequence_number)
        first = frames[0]
        start = clock.wall(first.received_s) - first.offset_ms / 1000.0
        cut = interrupted.get(sid)
        xs: list[Floats] = []
        ys: list[Floats] = []
        for f in frames:
            s = decode_pcm16(f.data, log.reply_encoding).astype(np.float64) / 32768.0
            ms = f.offset_ms + np.arange(len(s)) * 1000.0 / rate
            if cut is not None:
                keep = ms < cut.played_ms  # frames sent ahead of the cut were never heard
                s, ms = s[keep], ms[keep]
            xs.append(start + ms / 1000.0)
            ys.append(s)
        tracks.append(ReplyTrack(sid, np.concatenate(xs), np.concatenate(ys), cut))
    return tuple(tracks)


def _require_matplotlib() -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError as exc:  # optional extra: say how to get it
        raise RuntimeError("the timeline needs matplotlib: pip install 'voxgate[viz]'") from exc
    return Figure, FigureCanvasAgg


def _decimate(x: Floats, y: Floats) -> tuple[Any, Any]:
    step = max(1, len(x) // MAX_POINTS)
    return x[::step], y[::step]


def draw_timeline(log: CallLog, path: Path | str, *, title: str = "voxgate call") -> Path:
    """Render ``log`` to a PNG at ``path`` (what :func:`build_timeline` lays out)."""
    fig = render_timeline(log, title=title)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def render_timeline(log: CallLog, *, title: str = "voxgate call") -> Any:
    """The timeline as a matplotlib ``Figure`` (on an Agg canvas), not yet saved."""
    figure_cls, canvas_cls = _require_matplotlib()
    from matplotlib.lines import Line2D  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    tl = build_timeline(log)
    fig = figure_cls(figsize=(14, 8), dpi=100)
    canvas_cls(fig)
    ax_in, ax_text, ax_out = fig.subplots(
        3, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1.6, 1.4]}
    )

    # Caller audio (on its own clock), the caller's waits and VAD segments.
    for w in tl.waits:
        ax_in.axvspan(w.start_s, w.end_s, color=WAIT_COLOUR, alpha=0.35, lw=0)
    ax_in.plot(*_decimate(tl.caller_x, tl.caller_y), lw=0.4, color=CALLER_COLOUR)
    for s in tl.speech:
        ax_in.axvspan(s.start_s, s.end_s, color=SPEECH_COLOUR, alpha=0.35, lw=0)
        ax_in.text(s.start_s, 0.92, s.label, fontsize=7, va="top")
    for m in tl.speech_open:
        ax_in.axvline(m.at_s, color=SPEECH_COLOUR, lw=1.5)
    ax_in.set_ylim(-1.0, 1.0)
    ax_in.set_ylabel("caller")

    # Transcripts over the audio they cover, when they arrived; bot replies when sent.
    ax_text.set_ylim(0, 1)
    ax_text.set_yticks([])
    for i, (span, arrived) in enumerate(zip(tl.finals, tl.final_arrivals, strict=True)):
        y = 0.85 - 0.12 * (i % 4)
        ax_text.plot([span.start_s, span.end_s], [y, y], lw=3, color=TEXT_COLOUR, alpha=0.5)
        ax_text.plot([arrived.at_s], [y], marker="v", color=TEXT_COLOUR)
        ax_text.text(
            span.start_s, y + 0.05, _short(span.label), fontsize=8, fontweight="bold", va="bottom"
        )
    for i, m in enumerate(tl.interims):
        y = 0.35 - 0.08 * (i % 3)
        ax_text.plot([m.at_s], [y], marker=".", color=TEXT_COLOUR)
        ax_text.text(m.at_s, y, f" {_short(m.label)}", fontsize=6, color="grey", va="center")
    for i, m in enumerate(tl.speaks):
        y = 0.08 + 0.06 * (i % 2)
        ax_text.plot([m.at_s], [y], marker="^", color=BOT_COLOUR)
        ax_text.text(m.at_s, y, f" bot: {_short(m.label)}", fontsize=7, color=BOT_COLOUR)
    ax_text.set_ylabel("text")

    # Reply audio, each reply as heard.
    for r in tl.replies:
        ax_out.plot(*_decimate(r.x, r.y), lw=0.4, color=BOT_COLOUR)
    if not tl.replies:
        ax_out.text(0.5, 0.5, "no reply audio", transform=ax_out.transAxes, ha="center")
    ax_out.set_ylim(-1.0, 1.0)
    ax_out.set_ylabel("bot audio")
    ax_out.set_xlabel(
        "call time, s: caller audio at its true length however fast it was sent; "
        "wall clock while no caller audio flows"
    )

    # Barge-ins across all rows.
    for m in tl.interruptions:
        for ax in (ax_in, ax_text, ax_out):
            ax.axvline(m.at_s, color=BARGE_COLOUR, lw=1.2, ls="--")
        ax_out.text(m.at_s, 0.9, f" {m.label}", color=BARGE_COLOUR, fontsize=7)

    legend = [
        Line2D([], [], color=CALLER_COLOUR, lw=1, label="caller audio"),
        Patch(color=SPEECH_COLOUR, alpha=0.35, label="VAD speech (utterance)"),
        Patch(color=WAIT_COLOUR, alpha=0.35, label="caller waits for the bot"),
        Line2D([], [], color=TEXT_COLOUR, lw=3, alpha=0.5, marker="v", label="final transcript"),
        Line2D([], [], color=TEXT_COLOUR, ls="", marker=".", label="interim transcript"),
        Line2D([], [], color=BOT_COLOUR, ls="", marker="^", label="bot reply sent"),
        Line2D([], [], color=BOT_COLOUR, lw=1, label="bot audio"),
        Line2D([], [], color=BARGE_COLOUR, lw=1.2, ls="--", label="barge-in / cleared"),
    ]
    fig.legend(handles=legend, loc="lower center", ncol=8, fontsize=8, frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig


def _short(text: str, n: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"
