"""Echo canceller or echo gate? WebRTC's AEC3 against the gateway's echo guard, offline.

Run:  .venv/bin/python -m benchmarks.echo_canceller [--tiny]
      .venv/bin/python -m benchmarks.echo_canceller --replies 3   (pooled over fresh replies)
      .venv/bin/python -m benchmarks.echo_canceller --correlations   (the quiet-caller limit)
      .venv/bin/python -m benchmarks.echo_canceller --dispersion     (echo paths that spread)
      .venv/bin/python -m benchmarks.echo_canceller --stalls         (a loaded far end and server)
      .venv/bin/python -m benchmarks.echo_canceller --stalls --replies 20 --callers

The measurement behind gateway/echo.py's design. No server: the bundled Piper voice speaks a
reply, which is sent as μ-law 8 kHz, comes back from the line at each level × delay of the
issue's grid (μ-law again), is decoded as the gateway decodes it and runs through the default
segmenter (the VAD the gateway uses). Each row feeds the segmenter one way:

* none: the inbound audio as it is (today);
* AEC3: WebRTC's echo canceller (``pywebrtc-audio``, the audio processing module's Python
  bindings) on the inbound audio, with the played reply as its far-end reference;
* echo guard: ``voxgate.gateway.echo.EchoGuard`` with the same reference;
* gate_aec3: ``voxgate.gateway.echo.GatedEchoCanceller``, the guard choosing the blocks and AEC3's
  output (once AEC3 has converged) in the blocks it calls echo, instead of silence.

Columns: SPEECH_BEGIN events on echo alone (each one a false barge-in); at each echo level, how
much later than without any echo the segmenter sees a real caller who starts talking over the
echo 1.5 s into the reply (ms, the worst over delays and callers; the onset delay is what delays a
true barge-in); and the CPU the echo handling costs per second of call audio, on the echoing
line and on one that returns no echo (a caller alone).

``--stalls``: echo alone on a loaded line. Both event loops (the far end's and the gateway's)
stall at random (``--stall-rate`` per second, each up to ``--stall-ms``): the gateway sends
reply frames late and stamps them so; the far end hears frames late, its jitter buffer runs
dry and the rest of the reply plays shifted (the echo's delay jumps mid-reply); audio captured
during a stall is sent in a burst. What a loaded 2-core machine did to the live benchmark,
reproduced deterministically (seeded): calls interrupted per echo handling, pooled over
``--replies`` replies whose voice is seeded too (the same replies in every run).

The bundled voice samples each reply afresh (VITS noise) once per process, and one reply's
worst cell says little: ``--replies N`` runs the grid in N fresh processes and pools every
cell, printing the median, p95 and worst lateness per level and how many callers were heard
more than 500 ms late.
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.barge_in import CALLERS, REPLY, load_caller  # noqa: E402
from voxgate.common.pcm import (  # noqa: E402
    MULAW_DECODE,
    MULAW_ENCODE,
    WireEncoding,
    float_to_pcm16,
    pcm16_to_float,
)
from voxgate.engines.tts import TtsConfig, VitsStreamer  # noqa: E402
from voxgate.gateway.audio import InputDecoder, OutputEncoder  # noqa: E402
from voxgate.gateway.config import VadConfig  # noqa: E402
from voxgate.gateway.echo import EchoGuard, GatedEchoCanceller, LineEchoCanceller  # noqa: E402
from voxgate.gateway.segmenter import Segmenter, SpeechBegin  # noqa: E402
from voxgate.gateway.testing.echo_line import EchoLine, dispersive_path  # noqa: E402

LEVELS_DB = (-10, -20, -30)
DELAYS_MS = (40, 120, 250)
CALLER_AT_MS = 1500
LEAD_S = 0.06  # the gateway stamps reply frames with their due time, sent this far ahead
GATED = "gate_aec3"  # the guard, its echo blocks filled with AEC3's output


def mulaw(x: np.ndarray) -> bytes:
    pcm = float_to_pcm16(np.asarray(x, np.float32))
    return bytes(MULAW_ENCODE[pcm.astype(np.int64) + 32768].tobytes())


class Line:
    """The reply as the caller heard it (8 kHz) and as the gateway's reference (16 kHz)."""

    def __init__(self, text: str, *, seed: int | None = None) -> None:
        if seed is not None:
            # The voice's random draws come from ONNX Runtime's generator, seeded per process
            # from the clock unless set: a seed makes this reply the same in every run.
            import onnxruntime  # noqa: PLC0415

            onnxruntime.set_seed(seed)
        tts = VitsStreamer.load(TtsConfig())
        audio = np.concatenate([c.samples for c in tts.stream(text)]).astype(np.float32)
        wire = OutputEncoder(WireEncoding.MULAW, 8000, tts.sample_rate_hz).encode(audio, last=True)
        tts.close()
        self.heard8 = pcm16_to_float(MULAW_DECODE[np.frombuffer(wire, np.uint8)])
        self.ref16 = InputDecoder(WireEncoding.MULAW, 8000).decode(wire)

    def inbound(
        self,
        level_db: float | None,
        delay_ms: int,
        caller: np.ndarray | None,
        path: np.ndarray | None = None,
    ) -> bytes:
        """What the gateway receives: the echo (through ``path``, an 8 kHz impulse response
        scaled to unit energy, if given), the caller from ``CALLER_AT_MS``, through μ-law."""
        n = len(self.heard8) + 8000
        x = np.zeros(n, np.float32)
        if level_db is not None:
            d = delay_ms * 8
            echo = self.heard8
            if path is not None:
                echo = np.convolve(echo, path / np.sqrt(np.sum(path**2)))[: len(echo)]
            x[d : d + len(echo)] += echo * 10 ** (level_db / 20)
        if caller is not None:
            at = CALLER_AT_MS * 8
            c = caller[: n - at]
            x[at : at + len(c)] += c
        return mulaw(x)


def segment(line: Line, wire: bytes, mode: str) -> tuple[list[int], float]:
    """SPEECH_BEGIN offsets and the seconds of CPU the echo handling took."""
    dec = InputDecoder(WireEncoding.MULAW, 8000)
    seg = Segmenter(VadConfig())
    aec: Any = None
    guard: EchoGuard | GatedEchoCanceller | None = None
    if mode in ("echo guard", "AEC3 + guard"):
        guard = EchoGuard()
    elif mode == GATED:
        guard = GatedEchoCanceller()
    if mode in ("AEC3", "AEC3 + guard"):
        from pywebrtc_audio import EchoCanceller  # noqa: PLC0415

        aec = EchoCanceller(16000, 1, 0)
    begins: list[int] = []
    cpu = 0.0
    played = 0
    for i in range(0, len(wire), 160):  # 20 ms chunks, arriving at real time
        s = dec.decode(wire[i : i + 160])
        now = (i + 160) / 8000
        t0 = time.process_time()
        if aec is not None:
            far = line.ref16[2 * i : 2 * i + len(s)]
            far = np.pad(far, (0, len(s) - len(far)))
            s = np.asarray(aec.process(s.astype(np.float32), far.astype(np.float32)), np.float32)
        if guard is not None:
            # The guard is stamped as the gateway stamps (due time, sent ahead); AEC3 inside
            # the gated mode, like the AEC3 row, is given the reply as the caller heard it.
            lead = 0.0 if mode == GATED else LEAD_S
            while played < len(line.ref16) and played / 16000 <= now:
                guard.played(line.ref16[played : played + 320], played / 16000 + lead)
                played += 320
            s = guard.process(s, now)
        cpu += time.process_time() - t0
        begins += [ev.offset_ms for ev in seg.push(s) if isinstance(ev, SpeechBegin)]
    return begins, cpu


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="one level and delay, one caller")
    ap.add_argument(
        "--replies",
        type=int,
        default=0,
        metavar="N",
        help="run the grid in N fresh processes (a fresh reply each) and pool the cells",
    )
    ap.add_argument("--emit-cells", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.replies > 0:
        return pooled_main(args.replies, tiny=args.tiny)
    levels = LEVELS_DB[:1] if args.tiny else LEVELS_DB
    delays = DELAYS_MS[1:2] if args.tiny else DELAYS_MS
    callers = [load_caller(c) for c in (CALLERS[:1] if args.tiny else CALLERS)]
    line = Line(REPLY)
    audio_s = len(line.heard8) / 8000 + 1.0
    modes = ["none", "echo guard"]
    try:
        import pywebrtc_audio  # noqa: F401, PLC0415

        modes[1:1] = ["AEC3", "AEC3 + guard"]
        modes.append(GATED)
    except ImportError:
        print("pywebrtc-audio is not installed: the AEC3 rows are left out (pip install it)")
    out: dict[str, dict[str, float]] = {}
    cells_out: dict[str, dict[str, Any]] = {}
    later = "  ".join(f"{f'later @{lv} dB':>13}" for lv in levels)
    print(f"{'':<12} {'false begins':>12}  {later}  {'CPU per audio s':>16}  {'no echo':>8}")
    for mode in modes:
        false_begins, cpu, calls = 0, 0.0, 0
        worst_at: dict[int, float] = {}
        lates: dict[str, list[float | None]] = {}
        for level in levels:
            worst = 0.0
            for delay in delays:
                begins, c = segment(line, line.inbound(level, delay, None), mode)
                false_begins += len(begins)
                cpu, calls = cpu + c, calls + 1
                for caller in callers:
                    alone = segment(line, line.inbound(None, delay, caller), "none")[0]
                    over = [b for b in segment(line, line.inbound(level, delay, caller), mode)[0]]
                    # The caller's first begin at or after they started (echo begins are false).
                    first_alone = next(b for b in alone if b >= CALLER_AT_MS - 100)
                    first_over = next((b for b in over if b >= CALLER_AT_MS - 100), None)
                    late = float("inf") if first_over is None else first_over - first_alone
                    worst = max(worst, late)
                    lates.setdefault(str(level), []).append(None if late == float("inf") else late)
            worst_at[level] = worst
        # A line that returns no echo (a digital one), a caller on it: what the handling costs.
        quiet = sum(segment(line, line.inbound(None, 120, c), mode)[1] for c in callers)
        out[mode] = {
            "false_begins": false_begins,
            "onset_delay_ms": max(worst_at.values()),
            "cpu_ms_per_audio_s": 1000 * cpu / (calls * audio_s),
            "cpu_ms_per_audio_s_no_echo": 1000 * quiet / (len(callers) * audio_s),
            **{f"onset_delay_ms_at_{-lv}_db": v for lv, v in worst_at.items()},
        }
        cells_out[mode] = {"false_begins": false_begins, "echo_cells": calls, "late": lates}
        r = out[mode]
        cells = "  ".join(f"{worst_at[lv]:>10.0f} ms" for lv in levels)
        print(
            f"{mode:<12} {r['false_begins']:>12.0f}  {cells}  {r['cpu_ms_per_audio_s']:>13.2f} ms"
            f"  {r['cpu_ms_per_audio_s_no_echo']:>5.2f} ms"
        )
    if args.emit_cells:
        print("CELLS " + json.dumps(cells_out))
    return out


def pooled_main(replies: int, *, tiny: bool = False) -> dict[str, dict[str, float]]:
    """The grid in ``replies`` fresh processes, every cell pooled (see the module docstring)."""
    pooled: dict[str, dict[str, Any]] = {}
    for i in range(replies):
        cmd = [sys.executable, "-m", "benchmarks.echo_canceller", "--emit-cells"]
        run = subprocess.run(
            cmd + (["--tiny"] if tiny else []),
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[1],
        )
        line = next(ln for ln in run.stdout.splitlines() if ln.startswith("CELLS "))
        for mode, cell in json.loads(line[len("CELLS ") :]).items():
            p = pooled.setdefault(mode, {"false_begins": 0, "echo_cells": 0, "late": {}})
            p["false_begins"] += cell["false_begins"]
            p["echo_cells"] += cell["echo_cells"]
            for level, values in cell["late"].items():
                p["late"].setdefault(level, []).extend(
                    float("inf") if v is None else v for v in values
                )
        print(f"reply {i + 1} of {replies} done", flush=True)
    levels = next(iter(pooled.values()))["late"].keys() if pooled else ()
    head = "  ".join(f"{f'later @{lv} dB: med / p95 / worst, >500':>38}" for lv in levels)
    print(f"pooled over {replies} replies")
    print(f"{'':<12} {'false begins':>14}  {head}")
    out: dict[str, dict[str, float]] = {}
    for mode, p in pooled.items():
        row: dict[str, float] = {"false_begins": p["false_begins"]}
        cells = []
        for level, values in p["late"].items():
            v = np.asarray(values, np.float64)
            # Interpolating between a finite cell and a never-heard one (inf) is meaningless.
            method = "linear" if np.isfinite(v).all() else "higher"
            med, p95 = float(np.median(v)), float(np.percentile(v, 95, method=method))
            worst, late = float(v.max()), int(np.sum(v > 500))
            row |= {f"median_ms_at_{-int(level)}_db": med, f"p95_ms_at_{-int(level)}_db": p95}
            row |= {f"worst_ms_at_{-int(level)}_db": worst, f"over_500_at_{-int(level)}_db": late}
            cells.append(f"{med:>6.0f} / {p95:>4.0f} / {worst:>4.0f}, {late:>2} of {len(v):<3}")
        out[mode] = row
        fb = f"{p['false_begins']} in {p['echo_cells']}"
        print(f"{mode:<12} {fb:>14}  " + "  ".join(f"{c:>38}" for c in cells))
    return out


def dispersion_main(tiny: bool = False) -> dict[str, dict[str, int]]:
    """False SPEECH_BEGINs on echo alone through dispersive paths (120 ms, each level).

    ``tiny``: one level (-10 dB) and one spreading path (tau 1.33 ms), for the test.
    """
    line = Line(REPLY)
    levels = LEVELS_DB[:1] if tiny else LEVELS_DB
    modes = ["none", "echo guard"]
    try:
        import pywebrtc_audio  # noqa: F401, PLC0415

        modes[1:1] = ["AEC3", "AEC3 + guard"]
        modes.append(GATED)
    except ImportError:
        print("pywebrtc-audio is not installed: the AEC3 rows are left out (pip install it)")
    taus = (1.33,) if tiny else (0.0, 0.67, 1.33, 2.67)
    shown = " / ".join(str(lv) for lv in levels)
    print(f"false SPEECH_BEGIN on echo alone (120 ms), by the path's decay; {shown} dB")
    print(f"{'':<12} " + "  ".join(f"{'flat' if t == 0 else f'tau {t} ms':>14}" for t in taus))
    out: dict[str, dict[str, int]] = {}
    for mode in modes:
        cells = []
        for tau in taus:
            path = None if tau == 0 else dispersive_path(tau)
            counts = [
                len(segment(line, line.inbound(level, 120, None, path), mode)[0])
                for level in levels
            ]
            out.setdefault(mode, {})[f"tau_{tau}"] = sum(counts)
            cells.append(" / ".join(str(c) for c in counts))
        print(f"{mode:<12} " + "  ".join(f"{c:>14}" for c in cells))
    return out


class Stalls:
    """When an event loop is stalled: ``rate_hz`` random stalls a second, ``lo_s``-``hi_s`` each."""

    def __init__(
        self, rng: np.random.Generator, rate_hz: float, lo_s: float, hi_s: float, span_s: float
    ) -> None:
        self.spans: list[tuple[float, float]] = []
        t = 0.0
        while rate_hz > 0 and t < span_s:
            t += float(rng.exponential(1.0 / rate_hz))
            d = float(rng.uniform(lo_s, hi_s))
            self.spans.append((t, t + d))
            t += d

    def release(self, t: float) -> float:
        """When something due at ``t`` runs: the end of the stall it falls into, if any."""
        for a, b in self.spans:
            if a > t:
                break
            if t < b:
                return b
        return t


def segment_loaded(
    line: Line,
    level_db: float,
    delay_ms: int,
    mode: str,
    rng: np.random.Generator,
    *,
    rate_hz: float,
    max_stall_s: float,
    caller: np.ndarray | None = None,
) -> list[int]:
    """SPEECH_BEGIN offsets of echo alone on a loaded line (see the module docstring).

    ``caller`` (8 kHz): a caller who starts talking ``CALLER_AT_MS`` into the reply, over it.

    Timing as in the gateway and in ``benchmarks.barge_in``: reply frame j is due at
    ``S + 20 ms * j`` and leaves ``LEAD_S`` earlier, or when the gateway's loop runs again;
    it is stamped ``max(sent + LEAD_S, end of the frame before)``. The far end
    (``voxgate.gateway.testing.echo_line.EchoLine``, 60 ms jitter buffer) hears it when its own loop
    runs; it sends 20 ms of line audio per frame on its ideal clock, each computed when its
    loop runs (the echo of what it had played by then). The gateway takes each chunk when its
    loop runs, with that arrival time.
    """
    wire = mulaw(line.heard8)
    frames = len(wire) // 160
    span = frames * 0.02 + 10.0
    far, gw = (Stalls(rng, rate_hz, 0.03, max_stall_s, span) for _ in range(2))
    start = 1.0
    sent, stamps, arrived = [], [], []
    last_sent = last_arrived = next_play = 0.0
    for j in range(frames):
        last_sent = max(gw.release(start + 0.02 * j - LEAD_S), last_sent)
        play_at = max(last_sent + LEAD_S, next_play)
        next_play = play_at + 0.02
        last_arrived = max(far.release(last_sent + 0.001), last_arrived)
        sent.append(last_sent)
        stamps.append(play_at)
        arrived.append(last_arrived)
    echo_line = EchoLine(8000, level_db, delay_ms)
    t0 = arrived[0]  # the far end starts sending when the reply starts (as the benchmark)
    chunks = frames + 50
    made, last = [], 0.0
    for k in range(chunks):
        last = max(far.release(t0 + 0.02 * k), last)
        made.append(last)
    # The far end's loop: reply frames heard and line audio made, in the order they run.
    order = sorted(
        [(arrived[j], 0, j) for j in range(frames)] + [(made[k], 1, k) for k in range(chunks)]
    )
    inbound: list[bytes] = [b""] * chunks
    for _, kind, i in order:
        if kind == 0:
            echo_line.heard(line.heard8[160 * i : 160 * (i + 1)], arrived[i])
        else:
            x = echo_line.echo(t0 + 0.02 * i, 160)
            lo = 160 * i - CALLER_AT_MS * 8
            if caller is not None and 0 <= lo < len(caller):
                seg = caller[lo : lo + 160]
                x[: len(seg)] += seg
            inbound[i] = mulaw(x)
    taken, last = [], 0.0
    for k in range(chunks):
        last = max(gw.release(made[k] + 0.001), last)
        taken.append(last)
    handler: EchoGuard | GatedEchoCanceller | LineEchoCanceller | None = None
    if mode == "echo guard":
        handler = EchoGuard()
    elif mode == GATED:
        handler = GatedEchoCanceller()
    elif mode == "AEC3":
        handler = LineEchoCanceller()
    dec, ref = InputDecoder(WireEncoding.MULAW, 8000), InputDecoder(WireEncoding.MULAW, 8000)
    seg = Segmenter(VadConfig())
    begins: list[int] = []
    # The gateway's loop: reply frames sent (and given to the echo handling), chunks taken.
    order = sorted(
        [(sent[j], 0, j) for j in range(frames)] + [(taken[k], 1, k) for k in range(chunks)]
    )
    for _, kind, i in order:
        if kind == 0:
            heard = ref.decode(wire[160 * i : 160 * (i + 1)])
            if handler is not None:
                handler.played(heard, stamps[i])
        else:
            x = dec.decode(inbound[i])
            if handler is not None:
                x = handler.process(x, taken[i])
            begins += [ev.offset_ms for ev in seg.push(x) if isinstance(ev, SpeechBegin)]
    return begins


def stalls_main(argv: list[str]) -> dict[str, dict[str, float]]:
    """Echo-only calls interrupted on a loaded line, per echo handling (``--stalls``)."""
    ap = argparse.ArgumentParser(description="echo alone on a loaded line")
    ap.add_argument("--stalls", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="one level and delay, two seeds")
    ap.add_argument("--stall-rate", type=float, default=2.0, help="stalls per second, each loop")
    ap.add_argument("--stall-ms", type=float, default=250.0, help="longest stall (ms)")
    ap.add_argument("--seeds", type=int, default=3, help="stall patterns per cell")
    ap.add_argument(
        "--callers",
        action="store_true",
        help="also: how much later a real caller over a -10 dB echo is seen than on the same "
        "loaded line without echo (median / p95 / callers > 500 ms)",
    )
    ap.add_argument(
        "--replies",
        type=int,
        default=3,
        help="replies (the voice seeded 0..N-1, so each is the same in every run), pooled",
    )
    args = ap.parse_args(argv)
    lines = [Line(REPLY, seed=r) for r in range(args.replies)]
    levels = LEVELS_DB[:1] if args.tiny else LEVELS_DB
    delays = DELAYS_MS[2:] if args.tiny else DELAYS_MS
    seeds = range(2 if args.tiny else args.seeds)
    modes = ["none", "echo guard"]
    try:
        import pywebrtc_audio  # noqa: F401, PLC0415

        modes[1:1] = ["AEC3"]
        modes.append(GATED)
    except ImportError:
        print("pywebrtc-audio is not installed: the AEC3 rows are left out (pip install it)")
    print(
        f"echo alone, both loops stalling {args.stall_rate:g}/s for 30-{args.stall_ms:g} ms, "
        f"{len(lines)} replies: calls with a SPEECH_BEGIN (each a false barge-in) / calls, "
        "and the begins"
    )
    print(f"{'':<12} {'interrupted':>12} {'begins':>7}")
    out: dict[str, dict[str, float]] = {}
    for mode in modes:
        calls = interrupted = begins = 0
        for line in lines:
            for level, delay, seed in itertools.product(levels, delays, seeds):
                b = segment_loaded(
                    line,
                    level,
                    delay,
                    mode,
                    np.random.default_rng(seed),
                    rate_hz=args.stall_rate,
                    max_stall_s=args.stall_ms / 1000.0,
                )
                calls, interrupted, begins = calls + 1, interrupted + bool(b), begins + len(b)
        out[mode] = {"calls": calls, "interrupted": interrupted, "begins": begins}
        print(f"{mode:<12} {f'{interrupted} / {calls}':>12} {begins:>7}")
    if args.callers:
        print("a caller over the echo (-10 dB), later than without echo: median / p95 ms, > 500")
        loaded = {"rate_hz": args.stall_rate, "max_stall_s": args.stall_ms / 1000.0}
        first: dict[tuple[int, int, str, int], int] = {}
        for r, line in enumerate(lines):
            for delay, name, seed in itertools.product(delays, CALLERS, seeds):
                alone = segment_loaded(
                    line,
                    -200,
                    delay,
                    "none",
                    np.random.default_rng(seed),
                    **loaded,
                    caller=load_caller(name),
                )
                first[r, delay, name, seed] = next(b for b in alone if b >= CALLER_AT_MS - 100)
        for mode in modes[1:]:
            late = []
            for (r, delay, name, seed), at in first.items():
                over = segment_loaded(
                    lines[r],
                    -10,
                    delay,
                    mode,
                    np.random.default_rng(seed),
                    **loaded,
                    caller=load_caller(name),
                )
                heard = next((b for b in over if b >= CALLER_AT_MS - 100), None)
                late.append(float("inf") if heard is None else heard - at)
            v = np.asarray(late)
            method = "linear" if np.isfinite(v).all() else "higher"
            med, p95 = float(np.median(v)), float(np.percentile(v, 95, method=method))
            over_500 = int(np.sum(v > 500))
            out[mode] |= {"caller_median_ms": med, "caller_p95_ms": p95}
            out[mode] |= {"callers_over_500": over_500, "callers": len(v)}
            print(f"{mode:<12} {med:>6.0f} / {p95:>4.0f} ms, {over_500} of {len(v)}")
    return out


def block_correlations(line: Line, level_db: float, caller: np.ndarray | None) -> list[float]:
    """|rho| of each block the guard's window matched (echo alone, or a caller over it).

    Why a residual test cannot tell a quiet caller from the echo (docs/barge-in.md): the echo's
    own block correlation, through G.711 both ways, spreads as low as a caller's over it.
    With a caller, only the blocks of the first second after they start are kept.
    """
    wire = line.inbound(level_db, 120, caller)
    seen: list[tuple[float, float]] = []
    guard = EchoGuard()
    explained = guard._explained

    def spy(x: Any, ref: Any, k: int, rho: float, gain: float) -> bool:
        n = guard._block // 2
        blk, r = x[-n:], ref[k + len(x) - n : k + len(x)]
        e = float(np.dot(blk, blk)) * float(np.dot(r, r))
        if rho >= guard._threshold and e > 0:
            seen.append((guard._t_end, abs(float(np.dot(blk, r))) / float(np.sqrt(e))))
        return explained(x, ref, k, rho, gain)

    guard._explained = spy  # type: ignore[method-assign]
    dec, played = InputDecoder(WireEncoding.MULAW, 8000), 0
    for i in range(0, len(wire), 160):
        now = (i + 160) / 8000
        while played < len(line.ref16) and played / 16000 <= now:
            guard.played(line.ref16[played : played + 320], played / 16000 + LEAD_S)
            played += 320
        guard.process(dec.decode(wire[i : i + 160]), now)
    t0 = CALLER_AT_MS / 1000
    return [r for t, r in seen if caller is None or t0 <= t <= t0 + 1.0]


def correlations_main() -> None:
    """Print the block-correlation percentiles behind the quiet-caller limit."""
    line = Line(REPLY)
    for level in LEVELS_DB:
        echo = np.asarray(block_correlations(line, level, None))
        print(
            f"echo alone {level} dB: |rho| p1 {np.percentile(echo, 1):.2f} "
            f"p5 {np.percentile(echo, 5):.2f} median {np.median(echo):.2f} (n={len(echo)})"
        )
        for name in CALLERS:
            over = block_correlations(line, level, load_caller(name))
            med = f"{np.median(over):.2f}" if over else "-"
            print(f"  caller {name} over it: median |rho| {med} (n={len(over)})")


if __name__ == "__main__":
    if "--correlations" in sys.argv:
        correlations_main()
    elif "--dispersion" in sys.argv:
        dispersion_main(tiny="--tiny" in sys.argv)
    elif "--stalls" in sys.argv:
        stalls_main(sys.argv[1:])
    else:
        main()
