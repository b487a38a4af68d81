"""Draw a call as a PNG timeline on one wall-clock axis (seconds since the call started).

Rows: the caller waveform with VAD segments; transcripts and bot replies; reply audio; with
barge-ins marked across all rows.

Needs matplotlib, the optional ``viz`` extra (``pip install 'voxgate[viz]'``). It draws on a
private ``Figure`` with the Agg canvas (no pyplot global state), so it is safe in threads and
needs no display.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from clients.voxgate_client import (
    AudioOut,
    EncodingName,
    PlaybackInterrupted,
    ServerEvent,
    SpeechBegin,
    SpeechEnd,
    Transcript,
    decode_pcm16,
)

__all__ = ["CallLog", "draw_timeline"]

#: Plot at most this many points per waveform; more only slows drawing down.
MAX_POINTS = 20_000


@dataclass
class CallLog:
    """Everything a timeline needs, recorded by the CLI during a call.

    All times are client loop times in seconds; ``t0_s`` is the call's start.

    Attributes:
        caller_pcm: the caller audio as PCM16 at ``caller_rate_hz``.
        sent: ``(time_s, audio_offset_ms)`` as chunks left, mapping audio time to wall time
            (the two differ when audio is sent faster than real time).
        events: every server event, with ``received_s``.
        speaks: ``(time_s, speak_id, text)`` for each reply the bot sent.
    """

    t0_s: float
    caller_pcm: npt.NDArray[np.int16]
    caller_rate_hz: int
    reply_encoding: EncodingName = "linear16"
    reply_rate_hz: int = 16000
    sent: list[tuple[float, float]] = field(default_factory=list)
    events: list[ServerEvent] = field(default_factory=list)
    speaks: list[tuple[float, str, str]] = field(default_factory=list)

    def wall_of_offset(self, offset_ms: float | npt.NDArray[np.float64]) -> Any:
        """Seconds since start at which caller audio ``offset_ms`` was sent."""
        if len(self.sent) < 2:
            return np.asarray(offset_ms, dtype=np.float64) / 1000.0
        times = np.array([t - self.t0_s for t, _ in self.sent])
        offsets = np.array([o for _, o in self.sent])
        return np.interp(offset_ms, offsets, times)


def _require_matplotlib() -> Any:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
        from matplotlib.figure import Figure  # noqa: PLC0415
    except ImportError as exc:  # optional extra: say how to get it
        raise RuntimeError("the timeline needs matplotlib: pip install 'voxgate[viz]'") from exc
    return Figure, FigureCanvasAgg


def _decimate(x: npt.NDArray[np.float64], y: npt.NDArray[np.float64]) -> tuple[Any, Any]:
    step = max(1, len(x) // MAX_POINTS)
    return x[::step], y[::step]


def draw_timeline(log: CallLog, path: Path | str, *, title: str = "voxgate call") -> Path:
    """Render ``log`` to a PNG at ``path``; returns the path."""
    figure_cls, canvas_cls = _require_matplotlib()
    fig = figure_cls(figsize=(14, 7.5), dpi=100)
    canvas_cls(fig)
    ax_in, ax_text, ax_out = fig.subplots(
        3, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1.6, 1.4]}
    )

    # Caller audio and VAD segments.
    pcm = log.caller_pcm.astype(np.float64) / 32768.0
    t_in = log.wall_of_offset(np.arange(len(pcm)) * 1000.0 / log.caller_rate_hz)
    ax_in.plot(*_decimate(np.asarray(t_in), pcm), lw=0.4, color="#3465a4")
    begins: dict[int, SpeechBegin] = {}
    for ev in log.events:
        if isinstance(ev, SpeechBegin):
            begins[ev.utterance_index] = ev
        elif isinstance(ev, SpeechEnd) and ev.utterance_index in begins:
            b = begins.pop(ev.utterance_index)
            x0, x1 = log.wall_of_offset(b.offset_ms), log.wall_of_offset(ev.offset_ms)
            ax_in.axvspan(x0, x1, color="#8ae234", alpha=0.35, lw=0)
            ax_in.text(x0, 0.92, f"utt {ev.utterance_index}", fontsize=7, va="top")
    for b in begins.values():  # still open when the call ended
        ax_in.axvline(log.wall_of_offset(b.offset_ms), color="#8ae234", lw=1.5)
    ax_in.set_ylim(-1.0, 1.0)
    ax_in.set_ylabel("caller")

    # Transcripts (finals bold, interims grey) and bot replies.
    ax_text.set_ylim(0, 1)
    ax_text.set_yticks([])
    finals = [e for e in log.events if isinstance(e, Transcript)]
    for i, tr in enumerate(finals):
        x = tr.received_s - log.t0_s
        y = 0.85 - 0.12 * (i % 4) if tr.is_final else 0.35 - 0.08 * (i % 3)
        ax_text.plot([x], [y], marker="v" if tr.is_final else ".", color="#204a87")
        ax_text.text(
            x,
            y,
            f" {_short(tr.text)}",
            fontsize=8 if tr.is_final else 6,
            color="black" if tr.is_final else "grey",
            fontweight="bold" if tr.is_final else "normal",
            va="center",
        )
    for i, (t, _sid, text) in enumerate(log.speaks):
        x = t - log.t0_s
        ax_text.plot([x], [0.08 + 0.06 * (i % 2)], marker="^", color="#ce5c00")
        ax_text.text(x, 0.08 + 0.06 * (i % 2), f" bot: {_short(text)}", fontsize=7, color="#ce5c00")
    ax_text.set_ylabel("text")

    # Reply audio, each frame at the time it arrived (the server paces it at real time).
    frames = sorted(
        (e for e in log.events if isinstance(e, AudioOut)), key=lambda f: f.sequence_number
    )
    if frames:
        xs: list[npt.NDArray[np.float64]] = []
        ys: list[npt.NDArray[np.float64]] = []
        for f in frames:
            s = decode_pcm16(f.data, log.reply_encoding).astype(np.float64) / 32768.0
            xs.append(f.received_s - log.t0_s + np.arange(len(s)) / log.reply_rate_hz)
            ys.append(s)
        ax_out.plot(*_decimate(np.concatenate(xs), np.concatenate(ys)), lw=0.4, color="#ce5c00")
    else:
        ax_out.text(0.5, 0.5, "no reply audio", transform=ax_out.transAxes, ha="center")
    ax_out.set_ylim(-1.0, 1.0)
    ax_out.set_ylabel("bot audio")
    ax_out.set_xlabel("seconds since the call started (client clock)")

    # Barge-ins across all rows.
    for ev in log.events:
        if isinstance(ev, PlaybackInterrupted):
            x = ev.received_s - log.t0_s
            for ax in (ax_in, ax_text, ax_out):
                ax.axvline(x, color="#cc0000", lw=1.2, ls="--")
            label = "barge-in" if ev.barge_in else "cleared"
            ax_out.text(x, 0.9, f" {label} ({ev.played_ms} ms played)", color="#cc0000", fontsize=7)

    fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def _short(text: str, n: int = 60) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"
