"""Finals against their latency budget through ``Converse``: long utterances and a lone word.

A final's decode has a latency budget (``asr.policy.decode_budget_s``, 2 s by default): the
retry ladder (full-window re-encode, hotter samples, the runner-up language) stops where its
next round would end past it, and the utterance keeps the best text it has. The engine's tests
check that on the engine; this benchmark checks it on the product path: a real gateway with
the default configuration (``voxgate.gateway.config`` defaults; ``--set`` changes one
setting) serves on a loopback port in this process, and one caller in a child process (so
that it shares neither the gateway's event loop nor its GIL) streams, at real time through
the client library (16 kHz LINEAR16, 20 ms chunks on an absolute clock):

* one very short one first: "not", 0.38 s cut out of the JFK clip (the 0.3 s "Not!" that took
  4.6 s);
* then ``--long`` long utterances (default 3), each the shared speech set's clips, their
  pauses shortened to 0.3 s where the VAD hears them, spliced with 0.2 s pauses (under the
  VAD's 600 ms hangover, so one utterance) to 13-15 s: the case that ran a whole ladder for
  28-29 s and then lost the utterance to ``batch_timeout_s`` before the budget;

with ``--gap-s`` of silence after each. Per utterance: its speech length, the final's latency
from the end of its speech audio (when the caller sent it: the 600 ms hangover is in it) and
the server's own end of speech -> final (``Transcript.latency_ms``, after the hangover) against
the budget, the final's text and its WER against the set's reference (``benchmarks._wer``), and
whether it was lost (no final, or a final with no text). Also the retry steps the server took
for finals in the run, by step (``voxgate_asr_fallbacks_total``; ``budget``: a ladder stopped
at the budget).

``--set asr.policy.logprob_threshold=-0.01`` makes every decode "fail" its log-prob gate, so
that each final runs its ladder until the budget stops it: the worst case, on purpose.

    .venv/bin/python -m benchmarks.calls.budget
    .venv/bin/python -m benchmarks.calls.budget --set asr.policy.logprob_threshold=-0.01
    .venv/bin/python -m benchmarks.calls.budget --long 1 --gap-s 3   # the test's run

Run it alone on the machine (under the shared lock): finals' latency is what it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.calls.replies import SPEECH, parse_sets, run_client_process

RATE_HZ = 16_000
CHUNK_MS = 20

#: Long utterances: between these lengths, s (the issue's 13-15 s).
LONG_S = (13.0, 15.0)
#: Silence between the spliced clips of a long utterance, and the longest pause kept inside a
#: clip, s (well under the VAD's 600 ms hangover, so the splice is one utterance).
SPLICE_GAP_S = 0.2
MAX_PAUSE_S = 0.3
#: The short utterance: "not" in the JFK clip (its energy span: 3.98-4.30 s), with 20 ms
#: either side; Whisper's reference for it is the one word.
SHORT_CLIP = ("jfk_inaugural_1961.wav", 3.96, 4.34, "not")
#: Lead-in silence before the first utterance, s.
LEAD_IN_S = 1.0
#: After the caller's hangup, how long it waits for the server to end the stream (which it
#: does once the pending finals are out), s: far past any budget, a bound for a hung server.
CLOSE_S = 120.0


@dataclass(frozen=True)
class Utterance:
    """One utterance of the caller's track: where its speech lies (s) and its reference."""

    name: str
    start_s: float
    end_s: float
    reference: str


@dataclass
class Outcome:
    """What became of one utterance (times in ms; ``text`` empty and ``lost`` when none)."""

    name: str
    speech_s: float
    reference: str
    text: str = ""
    wer: float = 1.0
    after_audio_ms: float = math.inf
    server_latency_ms: float = math.inf
    finals: int = 0
    lost: bool = True


def _tight(pcm: Any, vad: Any) -> Any:
    """A clip's speech with no pause over :data:`MAX_PAUSE_S`, as the gateway's VAD hears it.

    The 20 ms frames whose Silero voice probability (a fresh stream per clip) is at least the
    default end threshold (0.35) are speech; quiet runs longer than the limit are shortened
    to it, and the quiet at either end cut to one frame. The recordings' own pauses (up to
    1.4 s between a clip's sentences) would otherwise end the spliced utterance inside it:
    the VAD's hangover is 600 ms.
    """
    import numpy as np  # noqa: PLC0415

    from voxgate.engines.vad import SileroStream  # noqa: PLC0415

    frame = RATE_HZ * CHUNK_MS // 1000
    n = len(pcm) // frame
    frames = pcm[: n * frame].reshape(n, frame)
    stream = SileroStream(vad, prime_windows=0)
    probs = [stream.push(f.astype(np.float32) / 32768) for f in frames]
    voiced = np.asarray(probs) >= 0.35
    idx = np.flatnonzero(voiced)
    if not len(idx):
        return pcm
    keep, quiet = [], 0
    most = round(MAX_PAUSE_S * 1000 / CHUNK_MS)
    for k in range(max(0, int(idx[0]) - 2), min(n, int(idx[-1]) + 2)):
        quiet = 0 if voiced[k] else quiet + 1
        if quiet <= most:
            keep.append(frames[k])
    return np.concatenate(keep)


def build_track(speech_dir: Path, n_long: int, gap_s: float) -> tuple[bytes, list[Utterance]]:
    """The caller's track (LINEAR16 bytes) and its utterances: the short one, then ``n_long``
    long ones, each followed by ``gap_s`` of silence.

    Long utterances take the set's clips in file order (the JFK clip aside), each cut to its
    speech, and splice the next clip that keeps the total within :data:`LONG_S` until it
    reaches the lower bound; every clip is used at most once.
    """
    import numpy as np  # noqa: PLC0415

    from voxgate.engines.vad import SileroVad  # noqa: PLC0415
    from voxgate_client import read_wav  # noqa: PLC0415

    vad = SileroVad.load()
    rows = [json.loads(line) for line in (speech_dir / "manifest.jsonl").read_text().splitlines()]
    text = {r["file"]: r["text"] for r in rows}
    clips: list[tuple[str, Any]] = []
    for name in sorted(text):
        if name == SHORT_CLIP[0]:
            continue
        pcm, rate = read_wav(speech_dir / name)
        if rate == RATE_HZ:
            clips.append((name, _tight(pcm, vad)))
    gap = np.zeros(int(SPLICE_GAP_S * RATE_HZ), np.int16)
    silence = np.zeros(int(gap_s * RATE_HZ), np.int16)
    parts = [np.zeros(int(LEAD_IN_S * RATE_HZ), np.int16)]
    at = len(parts[0])
    # The lone word first: after a long utterance Silero's state no longer hears this one
    # 0.38 s word at all (its voice probability stays under the 0.5 start threshold), so
    # placed last it would measure the VAD, not the final's budget.
    name, lo_s, hi_s, reference = SHORT_CLIP
    pcm, _ = read_wav(speech_dir / name)
    body = pcm[int(lo_s * RATE_HZ) : int(hi_s * RATE_HZ)]
    utterances = [Utterance("short", at / RATE_HZ, (at + len(body)) / RATE_HZ, reference)]
    parts += [body, silence]
    at += len(body) + len(silence)
    for k in range(n_long):
        chosen: list[tuple[str, Any]] = []
        length = 0
        for name, pcm in list(clips):
            extra = len(pcm) + (len(gap) if chosen else 0)
            if (length + extra) / RATE_HZ <= LONG_S[1]:
                chosen.append((name, pcm))
                clips.remove((name, pcm))
                length += extra
            if length / RATE_HZ >= LONG_S[0]:
                break
        if length / RATE_HZ < LONG_S[0]:
            sys.exit(f"not enough clips in {speech_dir} for {n_long} long utterances")
        body = np.concatenate([x for _, pcm in chosen for x in (gap, pcm)][1:])
        reference = " ".join(text[name] for name, _ in chosen)
        utterances.append(
            Utterance(f"long{k + 1}", at / RATE_HZ, (at + len(body)) / RATE_HZ, reference)
        )
        parts += [body, silence]
        at += len(body) + len(silence)
    return np.concatenate(parts).astype("<i2").tobytes(), utterances


# --- the caller (child process) -----------------------------------------------------------------


async def _caller(spec: dict[str, Any]) -> dict[str, Any]:
    from voxgate_client import (  # noqa: PLC0415
        CallConfig,
        Transcript,
        VoxgateClient,
        WireAudio,
        stream_audio,
    )

    track, _ = build_track(Path(spec["speech_dir"]), int(spec["long"]), float(spec["gap_s"]))
    finals: list[dict[str, Any]] = []
    async with VoxgateClient(spec["target"]) as client:
        conv = await client.converse(CallConfig(call_id="budget"))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        sender = asyncio.create_task(
            stream_audio(conv, WireAudio(track, "linear16", RATE_HZ), chunk_ms=CHUNK_MS)
        )

        async def read() -> None:
            async for event in conv:
                if isinstance(event, Transcript) and event.is_final:
                    finals.append(
                        {
                            "text": event.text,
                            "start_ms": event.start_ms,
                            "end_ms": event.end_ms,
                            "latency_ms": event.latency_ms,
                            "at_s": event.received_s - t0,
                        }
                    )

        reader = asyncio.create_task(read())
        await sender
        # The last final may still be decoding: give it the budget with the call open, then
        # hang up. A hangup has the server transcribe what is pending and then end the stream,
        # so read until it does: on a machine whose cores other processes hold, the first
        # attempt alone can outlast the budget (which bounds only the retries after it), and
        # a final that comes late is a latency in the table, not a lost utterance.
        await asyncio.sleep(float(spec["tail_s"]))
        await conv.hangup()
        done, _ = await asyncio.wait({reader}, timeout=float(spec["close_s"]))
        reader.cancel()
        await conv.aclose()
    return {"finals": finals, "stream_ended": bool(done)}


# --- the server (this process) ------------------------------------------------------------------


def _fallbacks(registry: Any) -> dict[str, float]:
    """Retry steps of finals so far, by step (``voxgate_asr_fallbacks_total``)."""
    out: dict[str, float] = {}
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name == "voxgate_asr_fallbacks_total" and sample.labels["kind"] == "final":
                step = sample.labels["step"]
                out[step] = out.get(step, 0.0) + sample.value
    return out


def match(utterances: Sequence[Utterance], finals: Sequence[dict[str, Any]]) -> list[Outcome]:
    """Each utterance's finals (those whose span overlaps its speech) and what they say."""
    from benchmarks._wer import wer  # noqa: PLC0415

    out = []
    for u in utterances:
        mine = [
            f
            for f in finals
            if f["start_ms"] / 1000 < u.end_s + 0.3 and f["end_ms"] / 1000 > u.start_s - 0.3
        ]
        o = Outcome(u.name, u.end_s - u.start_s, u.reference, finals=len(mine))
        if mine:
            o.text = " ".join(f["text"].strip() for f in mine).strip()
            o.wer = wer(u.reference, o.text)
            last = max(mine, key=lambda f: f["at_s"])
            o.after_audio_ms = 1000 * (last["at_s"] - u.end_s)
            o.server_latency_ms = max(f["latency_ms"] for f in mine)
            o.lost = not o.text
        out.append(o)
    return out


async def measure(
    n_long: int,
    gap_s: float,
    speech_dir: Path = SPEECH,
    overrides: dict[str, Any] | None = None,
) -> tuple[list[Outcome], dict[str, float], float]:
    """One caller's track through a default gateway (plus ``overrides``); the outcomes, the
    finals' retry steps by step, and the decode budget the gateway ran with (s)."""
    from benchmarks.calls.replies import server_config  # noqa: PLC0415
    from voxgate.gateway.runtime import build_hub  # noqa: PLC0415
    from voxgate.gateway.testing.server import running_server  # noqa: PLC0415

    _, utterances = build_track(speech_dir, n_long, gap_s)
    cfg = server_config(overrides)
    budget_s = cfg.asr.policy.decode_budget_s
    async with running_server(hub=build_hub(cfg), config=cfg) as srv:
        before = _fallbacks(srv.metrics.registry)
        spec = {
            "target": srv.target,
            "speech_dir": str(speech_dir),
            "long": n_long,
            "gap_s": gap_s,
            "tail_s": max(0.0, budget_s + 2.0 - gap_s),
            "close_s": CLOSE_S,
        }
        stdout = await run_client_process("benchmarks.calls.budget", spec)
        after = _fallbacks(srv.metrics.registry)
    got = json.loads(stdout.decode().strip().splitlines()[-1])
    if not got["stream_ended"]:
        raise RuntimeError(f"the server did not end the call within {CLOSE_S:g} s of its hangup")
    steps = {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}
    return match(utterances, got["finals"]), steps, budget_s


def _print(outcomes: Sequence[Outcome], steps: dict[str, float], budget_s: float) -> None:
    print(
        f"{'utterance':<10}{'speech s':>9}{'end of audio -> final ms':>26}"
        f"{'end of speech -> final ms':>27}{'within budget':>15}{'WER':>6}{'lost':>6}  text"
    )
    for o in outcomes:
        within = "yes" if o.server_latency_ms <= 1000 * budget_s else "NO"
        print(
            f"{o.name:<10}{o.speech_s:>9.1f}{o.after_audio_ms:>26.0f}{o.server_latency_ms:>27.0f}"
            f"{within:>15}{o.wer:>6.2f}{'LOST' if o.lost else 'no':>6}  {o.text[:70]!r}"
        )
    shown = ", ".join(f"{k} {v:g}" for k, v in sorted(steps.items())) or "none"
    print(f"decode budget {budget_s:g} s; finals' retry steps: {shown}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", type=int, default=3, help="long (13-15 s) utterances")
    parser.add_argument("--gap-s", type=float, default=4.0, help="silence after each utterance")
    parser.add_argument("--speech-dir", type=Path, default=SPEECH)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a server setting off its default (YAML value), e.g. "
        "asr.policy.logprob_threshold=-0.01 (every decode fails its gate: the whole ladder)",
    )
    parser.add_argument("--json", type=Path, help="also write the outcomes here")
    parser.add_argument("--client-spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client_spec:
        print(json.dumps(asyncio.run(_caller(json.loads(args.client_spec)))), flush=True)
        return
    overrides = parse_sets(args.set)
    print(
        f"settings off default: {overrides or 'none'}; {os.cpu_count()} cores, "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    t0 = time.perf_counter()
    outcomes, steps, budget_s = asyncio.run(
        measure(args.long, args.gap_s, args.speech_dir, overrides)
    )
    _print(outcomes, steps, budget_s)
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.json:
        out = {"budget_s": budget_s, "steps": steps, "utterances": [asdict(o) for o in outcomes]}
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
