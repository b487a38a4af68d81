"""Echo canceller or echo gate? WebRTC's AEC3 against the gateway's echo guard, offline.

Run:  .venv/bin/python -m benchmarks.echo_canceller [--tiny]
      .venv/bin/python -m benchmarks.echo_canceller --correlations   (the quiet-caller limit)
      .venv/bin/python -m benchmarks.echo_canceller --dispersion     (echo paths that spread)

The measurement behind gateway/echo.py's design. No server: the bundled Piper voice speaks a
reply, which is sent as μ-law 8 kHz, comes back from the line at each level × delay of the
issue's grid (μ-law again), is decoded as the gateway decodes it and runs through the default
segmenter (the VAD the gateway uses). Each row feeds the segmenter one way:

* none: the inbound audio as it is (today);
* AEC3: WebRTC's echo canceller (``pywebrtc-audio``, the audio processing module's Python
  bindings) on the inbound audio, with the played reply as its far-end reference;
* echo guard: ``gateway.echo.EchoGuard`` with the same reference;
* gate_aec3: ``gateway.echo.GatedEchoCanceller``, the guard choosing the blocks and AEC3's
  output (once AEC3 has converged) in the blocks it calls echo, instead of silence.

Columns: SPEECH_BEGIN events on echo alone (each one a false barge-in); at each echo level, how
much later than without any echo the segmenter sees a real caller who starts talking over the
echo 1.5 s into the reply (ms, the worst over delays and callers; the onset delay is what delays a
true barge-in); and the CPU the echo handling costs per second of call audio.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.barge_in import CALLERS, REPLY, load_caller  # noqa: E402
from engines.tts import TtsConfig, VitsStreamer  # noqa: E402
from gateway.audio import InputDecoder, OutputEncoder  # noqa: E402
from gateway.config import VadConfig  # noqa: E402
from gateway.echo import EchoGuard, GatedEchoCanceller  # noqa: E402
from gateway.segmenter import Segmenter, SpeechBegin  # noqa: E402
from gateway.testing.echo_line import dispersive_path  # noqa: E402
from pcmcodec import (  # noqa: E402
    MULAW_DECODE,
    MULAW_ENCODE,
    WireEncoding,
    float_to_pcm16,
    pcm16_to_float,
)

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

    def __init__(self, text: str) -> None:
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
    args = ap.parse_args(argv)
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
    later = "  ".join(f"{f'later @{lv} dB':>13}" for lv in levels)
    print(f"{'':<12} {'false begins':>12}  {later}  {'CPU per audio s':>16}")
    for mode in modes:
        false_begins, cpu, calls = 0, 0.0, 0
        worst_at: dict[int, float] = {}
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
            worst_at[level] = worst
        out[mode] = {
            "false_begins": false_begins,
            "onset_delay_ms": max(worst_at.values()),
            "cpu_ms_per_audio_s": 1000 * cpu / (calls * audio_s),
            **{f"onset_delay_ms_at_{-lv}_db": v for lv, v in worst_at.items()},
        }
        r = out[mode]
        cells = "  ".join(f"{worst_at[lv]:>10.0f} ms" for lv in levels)
        print(
            f"{mode:<12} {r['false_begins']:>12.0f}  {cells}  {r['cpu_ms_per_audio_s']:>13.2f} ms"
        )
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
    else:
        main()
