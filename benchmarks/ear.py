"""The ear on a phone line: webrtcvad against Silero, side by side, through a real gateway.

One in-process server (real grpc.aio on loopback, the real Whisper model) serves every call;
between calls only ``vad`` changes, so both models see the same engines, the same machine load
(calls alternate between variants) and the same audio, all sent as G.711 μ-law 8 kHz. Measured
per variant:

* **false SPEECH_BEGIN per minute** on each non-speech file of ``tests/telephony.py`` (digital
  silence, 50/60 Hz hum, hiss, pink noise, clicks, babble of other talkers, DTMF, and the
  composite line-noise file); goal: zero on every file (babble is reported, but a room of
  talkers is speech, so it is not part of the goal);
* **missed utterances**: clips (clean and with each noise at each SNR) that produced no
  SPEECH_BEGIN, and ``calls/`` ground-truth utterances that no segment overlaps; goal: zero;
* **worst begin/end boundary error** on the ``calls/`` ground truth (μ-law 8 kHz and linear
  16 kHz); goal: ≤ 70 ms begin, ≤ 170 ms end (webrtcvad's figures);
* **WER through the gateway** per noise and SNR (corpus WER over the clips, the gateway's
  default decoding).

Three more silero rows measure the boundary heuristics: without the plosive tail (kept only if
it pays), without the onset backtrack and without the end refinement. They run the VAD-only
parts (no WER). Below the boundary table, every utterance outside the goal is listed (file,
encoding, which utterance, signed errors: negative = early), so a regression says where.

Usage: python -m benchmarks.ear [--clips 8] [--seconds 30] [--snrs 20,10,5] [--tiny]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
import telephony as tel  # noqa: E402
from conftest import SPEECH_DIR, read_wav_int16  # noqa: E402

from benchmarks._wer import corpus_wer, wer  # noqa: E402
from voxgate.common.pcm import pcm16_to_float  # noqa: E402
from voxgate.gateway.config import GatewayConfig, VadConfig, load_config  # noqa: E402
from voxgate.gateway.runtime import build_hub  # noqa: E402
from voxgate.gateway.server import GatewayServer  # noqa: E402
from voxgate.gateway.testing.server import running_server  # noqa: E402
from voxgate.v1 import voxgate_pb2 as pb  # noqa: E402
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc  # noqa: E402

#: The variants compared; the first is the baseline (today's default).
VARIANTS: dict[str, VadConfig] = {
    "webrtc": VadConfig(model="webrtc"),
    "silero": VadConfig(model="silero"),
    "silero, no plosive tail": VadConfig(model="silero", plosive_tail=False),
    "silero, no onset backtrack": VadConfig(model="silero", onset_backtrack="off"),
    "silero, no end refinement": VadConfig(model="silero", end_refine="off"),
    "silero, no call-start lead-in": VadConfig(model="silero", call_start_lead_in_ms=0),
}
#: Variants that also run the WER grid (the others only the VAD measurements).
WER_VARIANTS = ("webrtc", "silero", "silero, no call-start lead-in")
GOAL_BEGIN_MS, GOAL_END_MS = 70, 170
CHUNK_MS = 20


@dataclass
class CallResult:
    """What one call heard."""

    begins_ms: list[int] = field(default_factory=list)
    ends_ms: list[int] = field(default_factory=list)
    finals: list[str] = field(default_factory=list)
    digits: str = ""


async def _requests(cfg: pb.ConverseRequest, data: bytes, size: int) -> AsyncIterator[Any]:
    yield cfg
    for i in range(0, len(data), size):
        yield pb.ConverseRequest(audio=pb.AudioChunk(data=data[i : i + size]))


async def one_call(
    stub: pb_grpc.VoiceGatewayStub, data: bytes, encoding: int = pb.MULAW, rate: int = 8000
) -> CallResult:
    """Send a whole file as fast as the server allows; collect speech events and finals."""
    width = 2 if encoding == pb.LINEAR16 else 1
    cfg = pb.ConverseRequest(
        config=pb.SessionConfig(
            input_audio=pb.AudioFormat(encoding=encoding, sample_rate_hertz=rate)
        )
    )
    out = CallResult()
    async for r in stub.Converse(_requests(cfg, data, rate * width * CHUNK_MS // 1000)):
        kind = r.WhichOneof("event")
        if kind == "speech":
            (out.begins_ms if r.speech.type == pb.SpeechEvent.SPEECH_BEGIN else out.ends_ms).append(
                int(r.speech.offset_ms)
            )
        elif kind == "transcript" and r.transcript.is_final:
            out.finals.append(r.transcript.text)
        elif kind == "dtmf":
            out.digits += r.dtmf.digit
    return out


class Bench:
    """The server and the switch between variants."""

    def __init__(self, server: GatewayServer) -> None:
        self.server = server
        self.base: GatewayConfig = server.servicer.config  # type: ignore[union-attr]

    def use(self, variant: str) -> None:
        """Only ``vad`` changes between variants; engines, limits and decoding stay."""
        assert self.server.servicer is not None
        self.server.servicer.config = self.base.model_copy(update={"vad": VARIANTS[variant]})


def _pcm16(x: np.ndarray) -> bytes:
    return bytes(np.clip(np.rint(x * 32768), -32768, 32767).astype("<i2").tobytes())


async def run(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {
        "engines": "asr" if not args.no_asr else "none",
        "limits": {"max_realtime_factor": 1000.0, "burst_allowance_ms": 600_000},
    }
    # Admission and the ladder stay on (the default): these calls send faster than real time,
    # so they are bulk calls, which are never judged on latency and never shed quality.
    server = {"host": "127.0.0.1", "port": 0}
    cfg = load_config(None, {**overrides, "server": server})
    # The VAD measurements need no recogniser: a VAD-only server runs them in seconds.
    vad_cfg = load_config(None, {**overrides, "engines": "none", "server": server})
    variants = [v for v in VARIANTS if not args.variants or v in args.variants]
    wer_variants = [v for v in WER_VARIANTS if v in variants and not args.no_asr]
    clips = tel.load_clips(limit=args.clips)
    others = [c.audio for c in tel.load_clips()]
    snrs = [float(s) for s in args.snrs.split(",")]
    kinds = [k for k in args.noises.split(",") if k]
    res: dict[str, Any] = {"false_begins": {}, "calls": {}, "clips": {}, "minutes": {}}
    t0 = time.monotonic()
    async with (
        running_server(config=vad_cfg) as srv,
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        stub = pb_grpc.VoiceGatewayStub(ch)
        bench = Bench(srv)

        # 1. non-speech files: false SPEECH_BEGIN per minute.
        files = tel.non_speech_files(args.seconds, others=others)
        for name, x in files.items():
            data = tel.to_mulaw_8k(x)
            res["minutes"][name] = len(x) / tel.SR / 60
            for v in variants:
                bench.use(v)
                r = await one_call(stub, data)
                res["false_begins"].setdefault(v, {})[name] = len(r.begins_ms)
            print(f"  non-speech {name}: done ({time.monotonic() - t0:.0f} s)", flush=True)

        # 2. calls/ ground truth: boundaries and misses, μ-law 8 kHz and linear 16 kHz.
        for wav in sorted((SPEECH_DIR / "calls").glob("call_*.wav"))[: args.calls]:
            truth = json.loads(wav.with_suffix(".json").read_text())["segments"]
            pcm, _ = read_wav_int16(wav)
            x = pcm16_to_float(pcm).astype(np.float32)
            for enc, rate, data in (
                ("mulaw8k", 8000, tel.to_mulaw_8k(x)),
                ("linear16k", 16000, _pcm16(x)),
            ):
                for v in variants:
                    bench.use(v)
                    r = await one_call(stub, data, pb.MULAW if rate == 8000 else pb.LINEAR16, rate)
                    res["calls"].setdefault(v, []).append((wav.name, enc, truth, r))
            print(f"  {wav.name}: done ({time.monotonic() - t0:.0f} s)", flush=True)

    hub = build_hub(cfg)
    async with (
        running_server(hub=hub, config=cfg) as srv,
        grpc.aio.insecure_channel(srv.target) as ch,
    ):
        stub = pb_grpc.VoiceGatewayStub(ch)
        bench = Bench(srv)

        # 3. clips: clean and noisy, misses and WER.
        grid: list[tuple[str, float]] = [("clean", float("inf"))] + [
            (k, s) for k in kinds for s in snrs
        ]
        for i, clip in enumerate(clips):
            rest = [o for j, o in enumerate(others) if j != i]
            for kind, snr in grid:
                if kind == "clean":
                    x = clip.audio
                else:
                    x = tel.mix_at_snr(clip.audio, tel.noise(kind, len(clip.audio), i, rest), snr)
                data = tel.to_mulaw_8k(x)
                for v in variants:
                    if v not in wer_variants and kind != "clean":
                        continue
                    bench.use(v)
                    r = await one_call(stub, data)
                    res["clips"].setdefault((v, kind, snr), []).append((clip, r))
            print(f"  clip {i + 1}/{len(clips)} done ({time.monotonic() - t0:.0f} s)", flush=True)
    res["variants"], res["wer_variants"], res["grid"] = variants, wer_variants, grid
    res["wall_s"] = time.monotonic() - t0
    return res


def _overlaps(t: dict[str, float], b: int, e: int) -> bool:
    return b / 1000 <= t["speech_end_s"] + 0.2 and e / 1000 >= t["speech_start_s"] - 0.2


def boundary_table(
    calls: Sequence[tuple[str, str, list[dict[str, float]], CallResult]],
) -> dict[str, float]:
    """Worst begin/end errors (ms) where segments pair one to one; misses; extra segments."""
    worst_b = worst_e = 0.0
    missed = extra = unpaired_files = 0
    errs_b: list[float] = []
    errs_e: list[float] = []
    for _name, _enc, truth, r in calls:
        segs = list(zip(r.begins_ms, r.ends_ms, strict=False))
        missed += sum(not any(_overlaps(t, b, e) for b, e in segs) for t in truth)
        extra += sum(not any(_overlaps(t, b, e) for t in truth) for b, e in segs)
        if len(segs) != len(truth):
            unpaired_files += 1
            continue
        for t, (b, e) in zip(truth, segs, strict=True):
            errs_b.append(abs(b - 1000 * t["speech_start_s"]))
            errs_e.append(abs(e - 1000 * t["speech_end_s"]))
            worst_b, worst_e = max(worst_b, errs_b[-1]), max(worst_e, errs_e[-1])
    return {
        "worst_begin_ms": worst_b,
        "worst_end_ms": worst_e,
        "median_begin_ms": float(np.median(errs_b)) if errs_b else 0.0,
        "median_end_ms": float(np.median(errs_e)) if errs_e else 0.0,
        "begins_over": sum(x > GOAL_BEGIN_MS for x in errs_b),
        "ends_over": sum(x > GOAL_END_MS for x in errs_e),
        "missed": missed,
        "extra": extra,
        "unpaired": unpaired_files,
    }


def outliers(
    calls: Sequence[tuple[str, str, list[dict[str, float]], CallResult]],
) -> list[str]:
    """Utterances whose begin or end lies outside the goal, with signed errors (ms)."""
    out: list[str] = []
    for name, enc, truth, r in calls:
        segs = list(zip(r.begins_ms, r.ends_ms, strict=False))
        if len(segs) != len(truth):
            out.append(f"{name} {enc}: {len(segs)} segments for {len(truth)} utterances")
            continue
        for i, (t, (b, e)) in enumerate(zip(truth, segs, strict=True)):
            db, de = b - 1000 * t["speech_start_s"], e - 1000 * t["speech_end_s"]
            if abs(db) > GOAL_BEGIN_MS or abs(de) > GOAL_END_MS:
                out.append(f"{name} {enc} utterance {i}: begin {db:+.0f} ms, end {de:+.0f} ms")
    return out


def report(res: dict[str, Any]) -> str:
    lines: list[str] = []
    variants: list[str] = res["variants"]
    names = list(res["minutes"])
    lines.append("### False SPEECH_BEGIN per minute of non-speech (μ-law 8 kHz)\n")
    lines.append("| file | minutes | " + " | ".join(variants) + " |")
    lines.append("|---|---:|" + "---:|" * len(variants))
    for n in names:
        m = res["minutes"][n]
        cells = [
            f"{res['false_begins'][v][n] / m:.1f} ({res['false_begins'][v][n]})" for v in variants
        ]
        lines.append(f"| {n} | {m:.2f} | " + " | ".join(cells) + " |")
    goal = [n for n in names if n != "babble"]
    lines.append(
        "| **files with any event (goal 0; babble excluded)** | | "
        + " | ".join(str(sum(res["false_begins"][v][n] > 0 for n in goal)) for v in variants)
        + " |"
    )
    lines.append("\n### calls/ ground truth (worst boundary error where segments pair 1:1)\n")
    lines.append(
        "| variant | encoding | worst begin ms (goal ≤ 70) | worst end ms (goal ≤ 170) "
        "| median begin / end ms | begins > 70 / ends > 170 "
        "| missed utterances | extra segments | files not 1:1 |"
    )
    lines.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for v in variants:
        for enc in ("mulaw8k", "linear16k"):
            these = [c for c in res["calls"].get(v, []) if c[1] == enc]
            n_utts = sum(len(c[2]) for c in these)
            t = boundary_table(these)
            lines.append(
                f"| {v} | {enc} | {t['worst_begin_ms']:.0f} | {t['worst_end_ms']:.0f} | "
                f"{t['median_begin_ms']:.0f} / {t['median_end_ms']:.0f} | "
                f"{t['begins_over']:.0f} / {t['ends_over']:.0f} of {n_utts} | "
                f"{t['missed']:.0f} | {t['extra']:.0f} | {t['unpaired']:.0f} |"
            )
    lines.append("\nUtterances outside the goal (signed error, negative = early):\n")
    for v in variants:
        for o in outliers(res["calls"].get(v, [])) or ["none"]:
            lines.append(f"* {v}: {o}")
    lines.append("\n### Clips through the gateway (μ-law 8 kHz): missed clips and corpus WER\n")
    wv: list[str] = res["wer_variants"]
    lines.append(
        "| noise | SNR dB | "
        + " | ".join(f"{v} missed | {v} WER" for v in wv)
        + (" | WER ratio silero/webrtc |" if {"webrtc", "silero"} <= set(wv) else " |")
    )
    both = {"webrtc", "silero"} <= set(wv)
    lines.append("|---|---:|" + "---:|---:|" * len(wv) + ("---:|" if both else ""))
    for kind, snr in res["grid"]:
        cells, wers = [], {}
        for v in wv:
            items = res["clips"].get((v, kind, snr), [])
            missed = sum(not r.begins_ms for _c, r in items)
            w = corpus_wer([c.text for c, _r in items], [" ".join(r.finals) for _c, r in items])
            wers[v] = w
            cells.append(f"{missed}/{len(items)} | {w:.3f}")
        ratio = (
            f" | {wers['silero'] / wers['webrtc']:.2f}"
            if both and wers["webrtc"] > 0
            else (" | -" if both else "")
        )
        snr_s = "-" if kind == "clean" else f"{snr:g}"
        lines.append(f"| {kind} | {snr_s} | " + " | ".join(cells) + ratio + " |")
    lines.append("\nClips whose WER differs between variants (per-clip WER, transcript):\n")
    differ = 0
    for kind, snr in res["grid"]:
        per = {v: {c.name: r for c, r in res["clips"].get((v, kind, snr), [])} for v in wv}
        for clip, _r in res["clips"].get((wv[0], kind, snr), []) if wv else []:
            row = {v: per[v][clip.name] for v in wv if clip.name in per[v]}
            w = {v: wer(clip.text, " ".join(r.finals)) for v, r in row.items()}
            if len(set(w.values())) > 1:
                differ += 1
                snr_s = "clean" if kind == "clean" else f"{kind} {snr:g} dB"
                cells = "; ".join(f"{v} {w[v]:.3f} {' '.join(r.finals)!r}" for v, r in row.items())
                lines.append(f"* {snr_s}, {clip.name}: {cells}")
    if not differ:
        lines.append("* none")
    missed_clean = {
        v: sum(not r.begins_ms for _c, r in res["clips"].get((v, "clean", float("inf")), []))
        for v in variants
    }
    lines.append(
        "\nclean clips missed (every variant): "
        + ", ".join(f"{v}: {n}" for v, n in missed_clean.items())
    )
    lines.append(f"\nwall time {res['wall_s']:.0f} s")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> str:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clips", type=int, default=8, help="speech clips in the WER grid")
    ap.add_argument("--calls", type=int, default=3, help="calls/ files for the boundaries")
    ap.add_argument("--seconds", type=float, default=30.0, help="length of each noise file")
    ap.add_argument("--snrs", default="20,10,5")
    ap.add_argument("--noises", default=",".join(tel.NOISES))
    ap.add_argument(
        "--variants",
        default="",
        help="comma list (default: all); semicolons instead when a name holds a comma "
        "('webrtc;silero;silero, no plosive tail')",
    )
    ap.add_argument("--no-asr", action="store_true", help="VAD only: no WER")
    ap.add_argument("--tiny", action="store_true", help="a seconds-long run that checks the code")
    args = ap.parse_args(argv)
    if args.tiny:
        args.clips, args.calls, args.seconds, args.snrs, args.noises = 1, 1, 1.0, "10", "hum"
    sep = ";" if ";" in args.variants else ","
    args.variants = [v.strip() for v in args.variants.split(sep) if v.strip()]
    unknown = sorted(set(args.variants) - set(VARIANTS))
    if unknown:
        ap.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    res = asyncio.run(run(args))
    text = report(res)
    print(text)
    return text


if __name__ == "__main__":
    main()
