"""Turn taking through ``Converse``: when does the gateway say the caller has finished?

Real-time callers (interims on) on an in-process server with the default engines, each clip one
call: 0.5 s of silence, the clip, 2.5 s of silence, hang up. Side by side in one run, per turn
detection variant:

* ``hangover600``: today's endpointing as turns (``silence``: every utterance a turn, 600 ms);
* ``words``: ``smart`` with silence and the words so far;
* ``audio``: ``smart`` with silence and the audio end-of-turn model, not the words
  (``session.turns.words`` false; only with a model);
* ``combined``: ``smart`` with silence, the words and the audio model: the default server's
  smart turns where the ``turn`` extra is installed (``--smart-turn-model auto``, the default;
  a .onnx, a pipecat-ai wheel or ``pipecat`` names another copy).

Two sets: the shared real clips (each one sentence or a few, one turn), and a pause set built
from them: each clip with one pause of 0.3-1.5 s spliced into its quietest mid-sentence gap
(silence inserted where the speaker already paused briefly, so the words around it are the
clip's own). Reported per variant, set and number of concurrent callers (1 and 4):

* end of last word (the clip's last 20 ms frame above -40 dBFS) -> EndOfTurn and -> the last
  final, p50/p95 ms (received by the client);
* premature ends of turn: EndOfTurn events whose turn ended before the clip's last word, per
  clip (real set) or per spliced pause (pause set);
* turns not ended within 2 s of the last word;
* WER of the call's turns' text (EndOfTurn texts joined) against the reference.

    python -m benchmarks.turn_taking [--tiny] [--clips N] [--callers 1,4] [--json OUT]
        [--variants combined,words] [--sets real] [--encoder-buckets 5,10,15,20,30 ...]
        [--lead zeros --lead noise]

``--encoder-buckets`` (repeatable) runs each variant once per encoder window setting
(``asr.encoder.buckets_s``; ``default`` for the server's own), side by side in the same run; the
cells' ``variant`` then names the buckets too (``combined b5/10/15/20/30``). ``--setting``
(repeatable) does the same for any server setting, ``KEY=VALUE`` in the config's dotted names
(``--setting default --setting session.turns.decode_after_ms=40``: the server as it comes,
and with the final decode started 40 ms after the loud end).

``--server`` (repeatable) says where the server runs: ``inprocess`` (the default: in this
interpreter, beside the callers) or ``process`` (``voxgate serve`` in its own process, as users
run it; ``$VOXGATE_TEST_SERVER``, else the ``voxgate`` beside this Python, else on ``PATH``).
Both share the machine's cores with the callers; only ``process`` keeps the server's Python
work (VAD, grpc, the session) off the callers' interpreter lock.

``--lead`` (repeatable) says what the 0.5 s before each clip is: ``zeros`` (the default: digital
silence, as a bridge sends before the caller is connected) or ``noise`` (the recording's own
quietest 60 ms that is not digital silence, repeated: a phone line, which carries its noise
from the first frame). The segmenter's floor learns the zeros and then reads a noisy
recording's hum as speech (docs/turns.md, "The floor out of digital silence"); ``--lead zeros
--lead noise`` shows what a call's opening does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import wave
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._stats import percentile
from benchmarks._wer import wer

REPO = Path(__file__).resolve().parents[1]
SPEECH = REPO.parent / "shared" / "data" / "speech"
RATE_HZ = 16_000
CHUNK_MS = 20
CHUNK_SAMPLES = RATE_HZ * CHUNK_MS // 1000
LEAD_MS = 500
TAIL_MS = 2_500
#: A 20 ms frame under this is digital silence, not a line's noise (the ``noise`` lead-in skips it).
DIGITAL_SILENCE_DBFS = -80.0
#: A turn not ended this long after the last word counts as not ended.
NOT_ENDED_MS = 2_000
PAUSES_MS = (300, 600, 1_000, 1_500)
JFK = "jfk_inaugural_1961.wav"


@dataclass(frozen=True)
class Item:
    """One caller turn to play: audio, reference, where its last word ends, its pauses."""

    name: str
    pcm: np.ndarray
    text: str
    last_word_ms: int
    pauses: int = 0


@dataclass
class Outcome:
    """What one call saw."""

    variant: str
    set: str
    callers: int
    name: str
    eot_ms: float | None = None
    final_ms: float | None = None
    #: Where the final's time went: last word -> the SPEECH_END of its utterance (the VAD's
    #: hangover, at the client), and the server's own ``latency_ms`` on that final (SPEECH_END
    #: -> final sent; a decode started before SPEECH_END shows only its remainder).
    speech_end_ms: float | None = None
    final_server_ms: int | None = None
    premature: int = 0
    pauses: int = 0
    not_ended: bool = False
    turns: int = 0
    text: str = ""
    wer: float = 0.0
    error: str = ""
    #: Each EndOfTurn as the client saw it: why a turn ended where it did (the JSON report).
    ends: list[dict[str, Any]] = field(default_factory=list)


# --- audio --------------------------------------------------------------------------------------


def frame_rms(pcm: np.ndarray) -> np.ndarray:
    """RMS of each whole 20 ms frame, full scale 1.0."""
    n = len(pcm) // CHUNK_SAMPLES
    frames = pcm[: n * CHUNK_SAMPLES].astype(np.float32).reshape(n, -1) / 32768.0
    return np.asarray(np.sqrt((frames**2).mean(axis=1)))


#: A frame is speech when it stands this far over the clip's noise floor (and above -40 dBFS).
SPEECH_OVER_FLOOR_DB = 12.0


def last_word_ms(pcm: np.ndarray) -> int:
    """End of the clip's last 20 ms frame of speech (its last word, not its tail).

    Speech: above -40 dBFS and ``SPEECH_OVER_FLOOR_DB`` over the clip's noise floor (its
    10th-percentile frame). -40 dBFS alone read the FLEURS recordings' noise (their floor
    -43 to -46 dBFS, swinging to -38) as speech up to the end of the file, so every turn
    there ended "before the last word" and no final covered it.
    """
    rms = frame_rms(pcm)
    floor = float(np.percentile(rms, 10)) if len(rms) else 0.0
    loud = np.flatnonzero(rms > max(0.01, floor * 10 ** (SPEECH_OVER_FLOOR_DB / 20)))
    return int((loud[-1] + 1) * CHUNK_MS) if len(loud) else len(pcm) * 1000 // RATE_HZ


def lead_in(pcm: np.ndarray, kind: str) -> np.ndarray:
    """The ``LEAD_MS`` a call of ``pcm`` opens with: ``zeros``, or ``noise``.

    ``noise`` is the recording's own quietest 60 ms whose frames all stand over
    ``DIGITAL_SILENCE_DBFS``, repeated: the line before the caller speaks. A recording with no
    such 60 ms (digital silence between its words, or none at all) gets zeros.
    """
    n = LEAD_MS * RATE_HZ // 1000
    if kind == "zeros":
        return np.zeros(n, np.int16)
    if kind != "noise":
        raise ValueError(f"lead-in {kind!r}: zeros or noise")
    rms = frame_rms(pcm)
    real = rms > 10 ** (DIGITAL_SILENCE_DBFS / 20)
    window = np.convolve(rms, np.ones(3) / 3, mode="valid")
    starts = [i for i in range(len(window)) if real[i : i + 3].all()]
    if not starts:
        return np.zeros(n, np.int16)
    at = min(starts, key=lambda i: float(window[i]))
    return np.resize(pcm[at * CHUNK_SAMPLES : (at + 3) * CHUNK_SAMPLES], n).astype(np.int16)


def splice_pause(pcm: np.ndarray, pause_ms: int) -> tuple[np.ndarray, int] | None:
    """``pcm`` with ``pause_ms`` of silence inserted in its quietest mid-sentence gap.

    The gap is the quietest 60 ms within the middle half of the speech (between words); the
    inserted audio is that gap's own background repeated, so the line noise does not drop out.
    Returns the new audio and where the pause ends (ms), or None for a clip with no gap.
    """
    rms = frame_rms(pcm)
    loud = np.flatnonzero(rms > 0.01)
    if len(loud) < 10:
        return None
    first, last = int(loud[0]), int(loud[-1])
    lo, hi = first + (last - first) // 4, first + 3 * (last - first) // 4
    if hi - lo < 4:
        return None
    window = np.convolve(rms[lo:hi], np.ones(3) / 3, mode="valid")
    at = lo + int(np.argmin(window)) + 1  # the middle frame of the quietest 60 ms
    cut = at * CHUNK_SAMPLES
    floor = pcm[cut : cut + CHUNK_SAMPLES]
    reps = pause_ms // CHUNK_MS
    filler = np.tile(floor, reps)
    out = np.concatenate([pcm[:cut], filler, pcm[cut:]])
    return out, at * CHUNK_MS + pause_ms


def load_items(speech_dir: Path, n: int) -> tuple[list[Item], list[Item]]:
    """The real set (JFK first, then the shortest clips) and its pause set."""
    with (speech_dir / "manifest.jsonl").open() as manifest:
        rows = [json.loads(line) for line in manifest]
    rows.sort(key=lambda r: (r["file"] != JFK, r["duration_s"]))
    real: list[Item] = []
    paused: list[Item] = []
    for row in rows[:n]:
        with wave.open(str(speech_dir / row["file"])) as w:
            pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2").copy()
        name = row["file"].removesuffix(".wav")
        real.append(Item(name, pcm, row["text"], last_word_ms(pcm)))
        if row["file"] == JFK:
            continue  # it already pauses four times, for up to 1.2 s
        pause = PAUSES_MS[len(paused) % len(PAUSES_MS)]
        spliced = splice_pause(pcm, pause)
        if spliced is not None:
            audio, _ = spliced
            paused.append(Item(f"{name}+{pause}ms", audio, row["text"], last_word_ms(audio), 1))
    return real, paused


# --- calls --------------------------------------------------------------------------------------


async def play_call(
    target: str, item: Item, variant: str, callers: int, set_name: str, lead: str = "zeros"
) -> Outcome:
    """One real-time call of ``item`` after ``lead`` (:func:`lead_in`); seen from the client."""
    from voxgate_client import (  # noqa: PLC0415
        CallConfig,
        EndOfTurn,
        SpeechEnd,
        Transcript,
        TurnOptions,
        VoxgateClient,
        VoxgateError,
    )

    turns = (
        TurnOptions(mode="silence", end_silence_ms=600)
        if variant == "hangover600"
        else TurnOptions(mode="smart")
    )
    out = Outcome(variant, set_name, callers, item.name, pauses=item.pauses)
    loop = asyncio.get_running_loop()
    pcm = np.concatenate(
        [
            lead_in(item.pcm, lead),
            item.pcm,
            np.zeros(TAIL_MS * RATE_HZ // 1000, np.int16),
        ]
    )
    data = pcm.tobytes()
    data += bytes(-len(data) % (CHUNK_SAMPLES * 2))
    word_end_call_ms = LEAD_MS + item.last_word_ms
    ends: list[tuple[float, EndOfTurn]] = []
    finals: list[tuple[float, Transcript]] = []
    speech_ends: list[tuple[float, SpeechEnd]] = []
    start = 0.0
    try:
        async with VoxgateClient(target) as client:
            call = await client.converse(CallConfig(interim_results=True, turns=turns))
            async with call:

                async def send() -> None:
                    nonlocal start
                    start = loop.time()
                    step = CHUNK_SAMPLES * 2
                    for k, i in enumerate(range(0, len(data), step)):
                        delay = start + k * CHUNK_MS / 1000.0 - loop.time()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        await call.send_audio(data[i : i + step])
                    await call.hangup()

                sender = asyncio.create_task(send())
                async for event in call:
                    if isinstance(event, EndOfTurn):
                        ends.append((loop.time(), event))
                    elif isinstance(event, Transcript) and event.is_final and event.text.strip():
                        finals.append((loop.time(), event))
                    elif isinstance(event, SpeechEnd):
                        speech_ends.append((loop.time(), event))
                await sender
    except VoxgateError as exc:
        out.error = f"{exc.code.name}: {exc.message[:160]}"
        return out
    spoken_at = start + word_end_call_ms / 1000.0
    # A turn that ended before the last word (its speech ended 300 ms or more before it) was
    # ended too soon: the caller was still talking.
    out.premature = sum(1 for _, e in ends if e.offset_ms < word_end_call_ms - 300)
    last = [t for t, e in ends if e.offset_ms >= word_end_call_ms - 300]
    if last:
        out.eot_ms = 1000.0 * (last[0] - spoken_at)
    out.not_ended = out.eot_ms is None or out.eot_ms > NOT_ENDED_MS
    # The final of the utterance that holds the last word (none when its words were lost).
    covering = [(t, f) for t, f in finals if f.start_ms < word_end_call_ms <= f.end_ms + 300]
    if covering:
        t_final, final = max(covering, key=lambda c: c[0])
        out.final_ms = 1000.0 * (t_final - spoken_at)
        out.final_server_ms = final.latency_ms
        ended = [t for t, e in speech_ends if e.utterance_index == final.utterance_index]
        if ended:
            out.speech_end_ms = 1000.0 * (ended[0] - spoken_at)
    out.turns = len(ends)
    out.ends = [
        {
            "offset_ms": e.offset_ms,
            "after_word_ms": round(1000.0 * (t - spoken_at)),
            "probability": round(e.probability, 3),
            "reason": e.reason,
            "silence_ms": e.silence_ms,
            "text": e.text[:120],
        }
        for t, e in ends
    ]
    out.text = " ".join(e.text for _, e in ends).strip()
    out.wer = wer(item.text, out.text)
    return out


async def run_variant(
    target: str, items: list[Item], variant: str, callers: int, set_name: str, lead: str = "zeros"
) -> list[Outcome]:
    """``callers`` concurrent real-time callers share ``items`` (each plays its slice)."""

    async def one(k: int) -> list[Outcome]:
        await asyncio.sleep(0.37 * k)  # callers do not all start on one frame
        return [
            await play_call(target, item, variant, callers, set_name, lead)
            for item in items[k::callers]
        ]

    results = await asyncio.gather(*(one(k) for k in range(callers)))
    return [o for r in results for o in r]


def summarise(outcomes: list[Outcome]) -> dict[str, Any]:
    """Percentiles and counts of one (variant, set, callers) cell."""
    eot = [o.eot_ms for o in outcomes if o.eot_ms is not None]
    fin = [o.final_ms for o in outcomes if o.final_ms is not None]
    ended = [o.speech_end_ms for o in outcomes if o.speech_end_ms is not None]
    server = [float(o.final_server_ms) for o in outcomes if o.final_server_ms is not None]
    units = sum(o.pauses for o in outcomes) or len(outcomes)

    def p(values: list[float], q: float) -> float | None:
        return round(percentile(values, q)) if values else None

    return {
        "calls": len(outcomes),
        "errors": sum(1 for o in outcomes if o.error),
        "eot_p50_ms": p(eot, 50),
        "eot_p95_ms": p(eot, 95),
        "final_p50_ms": p(fin, 50),
        "final_p95_ms": p(fin, 95),
        "speech_end_p50_ms": p(ended, 50),
        "final_after_speech_end_p50_ms": p(server, 50),
        "premature": sum(o.premature for o in outcomes),
        "premature_per_unit": round(sum(o.premature for o in outcomes) / units, 3),
        "not_ended_2s": sum(1 for o in outcomes if o.not_ended),
        "wer": round(float(np.mean([o.wer for o in outcomes])), 4) if outcomes else None,
    }


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    """Every variant x set x callers, one server per variant (the audio model is a server's)."""
    from voxgate.engines.turn import smart_turn_spec  # noqa: PLC0415

    real, paused = load_items(args.speech_dir, args.clips)
    if args.tiny:
        real, paused = real[:2], paused[:1]
    sets = {"real": real, "pauses": paused}
    if args.sets:
        sets = {k: v for k, v in sets.items() if k in args.sets}
    variants = ["hangover600", "words"]
    if smart_turn_spec(args.smart_turn_model):
        variants += ["audio", "combined"]
    if args.variants:
        variants = [v for v in variants if v in args.variants]
    report: dict[str, Any] = {"cells": [], "calls": []}
    windows: list[tuple[float, ...] | None] = args.encoder_buckets or [None]
    settings: list[str] = args.setting or ["default"]
    placements: list[str] = args.server or ["inprocess"]
    leads: list[str] = args.lead or ["zeros"]
    runs = [
        (v, b, st, pl) for v in variants for b in windows for st in settings for pl in placements
    ]
    for variant, buckets, setting, placement in runs:
        # Only the audio variants load a model: the others are measured without one, so the
        # words are what decides ``words``'s turns whatever the install.
        turns: dict[str, Any] = {"smart_turn_model": ""}
        if variant in ("audio", "combined"):
            turns["smart_turn_model"] = args.smart_turn_model
        if variant == "audio":
            turns["words"] = False
        server = {"host": "127.0.0.1", "port": 0, "grace_s": 1.0}
        overrides: dict[str, Any] = {"server": server, "session": {"turns": turns}}
        label = variant
        if buckets is not None:
            overrides["asr"] = {"encoder": {"buckets_s": list(buckets)}}
        if len(windows) > 1:
            label += " " + (
                "default" if buckets is None else "b" + "/".join(f"{b:g}" for b in buckets)
            )
        if setting != "default":
            merge_setting(overrides, setting)
        if len(settings) > 1:
            label += " " + setting
        if len(placements) > 1:
            label += " " + placement
        async with _server(placement, overrides) as target:
            for callers in args.callers:
                for set_name, items in sets.items():
                    for lead in leads:
                        cell_label = label + (f" lead {lead}" if len(leads) > 1 else "")
                        outcomes = await run_variant(
                            target, items, variant, callers, set_name, lead
                        )
                        for o in outcomes:
                            o.variant = cell_label
                        cell = {"variant": cell_label, "set": set_name, "callers": callers}
                        cell.update(summarise(outcomes))
                        report["cells"].append(cell)
                        report["calls"].extend(asdict(o) for o in outcomes)
                        print(json.dumps(cell), flush=True)
    return report


@asynccontextmanager
async def _server(placement: str, overrides: dict[str, Any]) -> AsyncIterator[str]:
    """A server with ``overrides`` on a loopback port, in this process or its own; its target."""
    if placement == "inprocess":
        from voxgate.gateway.config import load_config  # noqa: PLC0415
        from voxgate.gateway.runtime import build_hub  # noqa: PLC0415
        from voxgate.gateway.testing.server import running_server  # noqa: PLC0415

        cfg = load_config(None, overrides)
        async with running_server(hub=build_hub(cfg), config=cfg) as srv:
            yield srv.target
        return
    from voxgate_client.testing import SERVER_ENV, LocalServer  # noqa: PLC0415

    # The port and host are LocalServer's flags; the rest of the overrides is its config file
    # (JSON is YAML).
    config = {k: v for k, v in overrides.items() if k != "server"}
    config["server"] = {"grace_s": overrides.get("server", {}).get("grace_s", 1.0)}
    sibling = Path(sys.executable).with_name("voxgate")
    chosen = os.environ.get(SERVER_ENV)
    if not chosen and sibling.exists():
        os.environ[SERVER_ENV] = str(sibling)
    try:
        with LocalServer(config_yaml=json.dumps(config)) as srv:
            yield srv.target
    finally:
        if not chosen:
            os.environ.pop(SERVER_ENV, None)


def merge_setting(overrides: dict[str, Any], setting: str) -> None:
    """Put ``KEY=VALUE`` (dotted config names; VALUE as JSON, else a string) in ``overrides``."""
    key, sep, raw = setting.partition("=")
    if not sep or not key:
        raise SystemExit(f"--setting wants KEY=VALUE, got {setting!r}")
    try:
        value: Any = json.loads(raw)
    except json.JSONDecodeError:
        value = raw
    *path, last = key.split(".")
    node = overrides
    for part in path:
        node = node.setdefault(part, {})
    node[last] = value


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print one line per cell (and the whole report with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--speech-dir", type=Path, default=SPEECH)
    parser.add_argument("--clips", type=int, default=12, help="real clips (JFK first)")
    parser.add_argument(
        "--callers",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1, 4],
        help="concurrent real-time callers, comma-separated (default 1,4)",
    )
    parser.add_argument(
        "--smart-turn-model",
        default="auto",
        help="the Smart Turn v3 model of the audio variants (alone, and combined with the "
        "words): session.turns.smart_turn_model, 'auto' (the default: the turn extra's copy, "
        "if installed), a .onnx, a pipecat-ai wheel, 'pipecat', or '' (no audio variants)",
    )
    parser.add_argument(
        "--variants",
        type=lambda s: s.split(","),
        default=[],
        help="only these variants, comma-separated (hangover600, words, audio, combined)",
    )
    parser.add_argument(
        "--sets",
        type=lambda s: s.split(","),
        default=[],
        help="only these sets, comma-separated (real, pauses)",
    )
    parser.add_argument(
        "--encoder-buckets",
        action="append",
        default=[],
        type=lambda v: None if v == "default" else tuple(float(x) for x in v.split(",")),
        metavar="S,S,...|default",
        help="run each variant on these encoder windows (asr.encoder.buckets_s), or 'default' "
        "for the server's own; repeatable, side by side in one run",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="KEY=VALUE|default",
        help="run each variant with this server setting (dotted config name), or 'default'; "
        "repeatable, side by side in one run",
    )
    parser.add_argument(
        "--server",
        action="append",
        default=[],
        choices=["inprocess", "process"],
        help="where the server runs: in this interpreter beside the callers (inprocess, the "
        "default) or as 'voxgate serve' in its own process (process); repeatable, side by "
        "side in one run",
    )
    parser.add_argument(
        "--lead",
        action="append",
        default=[],
        choices=["zeros", "noise"],
        help="what the 0.5 s before each clip is: digital silence (zeros, the default) or the "
        "recording's own line noise (noise); repeatable, side by side in one run",
    )
    parser.add_argument("--tiny", action="store_true", help="2 clips, 1 pause set item")
    parser.add_argument("--json", type=Path, help="write the whole report here")
    args = parser.parse_args(argv)
    if args.tiny and argv is None:
        args.callers = args.callers[:1]
    report = asyncio.run(bench(args))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
