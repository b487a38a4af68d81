"""The product path under load: N full-duplex calls through ``Converse`` on the default server.

Each probe starts ``voxgate serve`` with its **default configuration** (a subprocess, exactly
what a user runs), then, for ``--duration`` seconds:

* N real-time callers open ``Converse`` calls (16 kHz LINEAR16, 20 ms chunks paced on an
  absolute clock, audio flowing all the time as a phone line's does): each plays clips of the
  shared speech set with natural gaps (1.0-2.5 s of silence after each). A small bot answers
  every final with a one- or two-sentence reply (``Speak``); every third caller starts its next
  clip as soon as the reply starts (it talks over the bot, barge-in), the others wait until the
  reply has played out.
* one fast client transcribes a file at the client library's ``AS_FAST_AS_ALLOWED`` pacing
  (a 4 s burst, then 3.5x real time) through ``StreamingRecognize``, again and again.

Per probe: calls admitted and refused (``RESOURCE_EXHAUSTED``); end of speech -> final, from
the clip's last word sent (its last 20 ms frame above -40 dBFS) to the last final covering it
received (so the 600 ms hangover is in it) p50/p95; first reply audio (``Speak`` written ->
first ``AudioOut``) p50/p95; late reply chunks (a client-side player starts at a reply's first
chunk and plays in real time: ``benchmarks.tts_concurrency.play``); the ladder's steps seen
(``QualityChanged``); lost finals (a clip no final covers); and whether the fast client was
admitted and finished.

Then the largest N with 0 refused, 0 late chunks and p95 final <= ``--p95-goal-s``, by doubling
and bisection, for each server given (``--baseline DIR`` adds an older checkout of the
project, run the same way from its own sources, probed alternately in the same run).

    .venv/bin/python -m benchmarks.calls --ns 1,4,8           # fixed N, this checkout
    .venv/bin/python -m benchmarks.calls --bisect --baseline /tmp/voxgate-v0.2
    .venv/bin/python -m benchmarks.calls --ns 8 --fast both   # the callers with and without it
    .venv/bin/python -m benchmarks.calls --tiny               # seconds: what the test runs

Run it alone on the machine: other work on the cores is what it measures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._stats import median, percentile
from benchmarks.tts_concurrency import play, player_waits

REPO = Path(__file__).resolve().parents[2]
SPEECH = REPO.parent / "shared" / "data" / "speech"
RATE_HZ = 16_000
CHUNK_MS = 20
CHUNK_BYTES = RATE_HZ * CHUNK_MS // 1000 * 2

#: One- and two-sentence replies; {n} makes each distinct. Their short openings ("Sure,",
#: "Thanks.") are units of their own, which the phrase cache holds after their first use, as
#: a bot's usual openings are (``benchmarks.calls.replies`` has no cached sentence).
REPLIES = (
    "Sure, ticket {n} is open.",
    "Thanks. Let me check order {n} for you right now.",
    "Got it. Parcel {n} is on its way.",
    "Of course. Booking {n} is confirmed. Is there anything else I can do for you today?",
)


# --- the server ---------------------------------------------------------------------------------


@contextlib.contextmanager
def serve(source: Path, extra: list[str]) -> Iterator[str]:
    """``voxgate serve`` from ``source``'s code with the default configuration; yields target."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    # The checkout's own packages first (an older checkout runs its own code).
    env["PYTHONPATH"] = os.pathsep.join([str(source), str(source / "protos")])
    # One namespace since v0.3 (voxgate.cli); an older checkout has the top-level `cli`.
    cli = "voxgate.cli" if (source / "protos" / "voxgate" / "cli").exists() else "cli"
    cmd = [sys.executable, "-c", f"import sys; from {cli} import main; sys.exit(main())"]
    cmd += ["serve", "--host", "127.0.0.1", "--port", "0", *extra]
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen(  # noqa: S603 - our own server
        cmd, cwd=source, stdout=subprocess.PIPE, stderr=log, text=True, env=env
    )
    found: list[str] = []
    assert proc.stdout is not None
    stdout = proc.stdout

    def read() -> None:
        for line in stdout:
            if line.startswith("listening on "):
                found.append(line.split()[-1])
                break
        for _ in stdout:  # keep draining
            pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    began = time.monotonic()
    while not found and proc.poll() is None and time.monotonic() - began < 300:
        time.sleep(0.1)
    try:
        if not found:
            log.seek(0)
            raise SystemExit(f"server from {source} did not start: {log.read()[-2000:]}")
        yield found[0]
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
        stdout.close()
        log.close()


# --- caller audio -------------------------------------------------------------------------------


def speech_end_ms(pcm: np.ndarray) -> int:
    """Where the clip's speech ends: the end of its last 20 ms frame above -40 dBFS RMS.

    Recordings carry trailing silence; end of speech is the caller's last word, not the file.
    """
    n = len(pcm) // (CHUNK_BYTES // 2)
    frames = pcm[: n * (CHUNK_BYTES // 2)].astype(np.float32).reshape(n, -1) / 32768.0
    loud = np.flatnonzero(np.sqrt((frames**2).mean(axis=1)) > 0.01)
    return int((loud[-1] + 1) * CHUNK_MS) if len(loud) else len(pcm) * 1000 // RATE_HZ


def load_clips(speech_dir: Path) -> list[np.ndarray]:
    """The shared set's 16 kHz mono clips of 1-8 s, as int16 arrays."""
    clips = []
    for path in sorted(speech_dir.glob("*.wav")):
        with wave.open(str(path)) as w:
            if w.getframerate() != RATE_HZ or w.getnchannels() != 1 or w.getsampwidth() != 2:
                continue
            pcm = np.frombuffer(w.readframes(w.getnframes()), "<i2")
        if 1.0 <= len(pcm) / RATE_HZ <= 8.0:
            clips.append(pcm)
    if not clips:
        raise SystemExit(f"no 16 kHz clips of 1-8 s in {speech_dir}")
    return clips


# --- one probe ----------------------------------------------------------------------------------


@dataclass
class Caller:
    """What one real-time caller saw."""

    admitted: bool = False
    refused: str = ""
    error: str = ""
    finals_ms: list[float] = field(default_factory=list)
    lost: int = 0
    first_audio_ms: list[float] = field(default_factory=list)
    late: int = 0
    #: Per reply with a late chunk: its longest wait for one, ms (how big a jitter buffer
    #: would have hidden it).
    worst_waits_ms: list[float] = field(default_factory=list)
    shed: list[str] = field(default_factory=list)


async def caller(
    target: str, idx: int, clips: list[np.ndarray], duration_s: float, barge: bool
) -> Caller:
    """One real-time call: clips with gaps, a reply per final, until ``duration_s``."""
    import grpc

    from voxgate_client import (
        AudioOut,
        CallConfig,
        PlaybackFinished,
        PlaybackInterrupted,
        QualityChanged,
        SessionStarted,
        Transcript,
        VoxgateClient,
        VoxgateError,
    )

    out = Caller()
    rng = np.random.default_rng(idx)
    loop = asyncio.get_running_loop()
    # (clip end on the call's audio clock ms, when its last sample was sent), and finals.
    clip_ends: list[tuple[int, int, float]] = []
    finals: list[tuple[int, int, float, str]] = []
    replies: dict[str, dict[str, Any]] = {}
    reply_started = asyncio.Event()
    reply_over = asyncio.Event()
    reply_over.set()
    try:
        async with VoxgateClient(target) as client:
            call = await client.converse(CallConfig())
            async with call:

                async def send() -> None:
                    sent_ms = 0
                    start = loop.time()
                    pause = bytes(CHUNK_BYTES)
                    k = idx * 5

                    async def chunk(data: bytes) -> None:
                        nonlocal sent_ms
                        due = start + sent_ms / 1000.0
                        delay = due - loop.time()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        await call.send_audio(data)
                        sent_ms += CHUNK_MS

                    async def silence(seconds: float) -> None:
                        for _ in range(int(seconds * 1000 / CHUNK_MS)):
                            await chunk(pause)

                    await silence(0.5)
                    while loop.time() - start < duration_s:
                        pcm = clips[k % len(clips)]
                        k += 1
                        begin_ms = sent_ms
                        # The last word's end, on the call's clock and on the wall clock.
                        spoken_ms = begin_ms + speech_end_ms(pcm)
                        spoken_at = start + spoken_ms / 1000.0
                        data = pcm.tobytes()
                        data += bytes(-len(data) % CHUNK_BYTES)
                        for i in range(0, len(data), CHUNK_BYTES):
                            await chunk(data[i : i + CHUNK_BYTES])
                        clip_ends.append((begin_ms, spoken_ms, spoken_at))
                        reply_over.clear()
                        reply_started.clear()
                        gap = float(rng.uniform(1.0, 2.5))
                        await silence(gap)
                        # Wait for the bot as a person would: over it (barge) or after it.
                        waited = loop.time()
                        while loop.time() - waited < 8.0:
                            done = reply_started if barge else reply_over
                            if done.is_set():
                                break
                            await silence(0.1)
                    await silence(1.5)
                    await call.hangup()

                sender = asyncio.create_task(send())
                n_reply = 0
                async for event in call:
                    now = loop.time()
                    if isinstance(event, SessionStarted):
                        out.admitted = True
                    elif isinstance(event, Transcript) and event.is_final:
                        finals.append((event.start_ms, event.end_ms, now, event.text))
                        if event.text.strip():
                            text = REPLIES[n_reply % len(REPLIES)].format(
                                n=1000 * idx + n_reply + 17 * os.getpid() % 900
                            )
                            n_reply += 1
                            sid = await call.speak(text)
                            replies[sid] = {"sent": loop.time(), "frames": []}
                            reply_over.clear()
                    elif isinstance(event, AudioOut):
                        r = replies.get(event.speak_id)
                        if r is not None:
                            r["frames"].append((now, len(event.data) // 2))
                            reply_started.set()
                    elif isinstance(event, PlaybackFinished | PlaybackInterrupted):
                        reply_over.set()
                        reply_started.set()
                    elif isinstance(event, QualityChanged):
                        out.shed = list(event.shed) if len(event.shed) > len(out.shed) else out.shed
                await sender
    except VoxgateError as exc:
        if exc.code == grpc.StatusCode.RESOURCE_EXHAUSTED and not out.admitted:
            out.refused = exc.message[:200]
        else:
            out.error = f"{exc.code.name}: {exc.message[:200]}"
    for begin_ms, end_ms, sent_at in clip_ends:
        covering = [f for f in finals if f[0] < end_ms and f[1] > begin_ms and f[3].strip()]
        if covering:
            out.finals_ms.append(1000.0 * (max(f[2] for f in covering) - sent_at))
        else:
            out.lost += 1
    for r in replies.values():
        frames = r["frames"]
        if frames:
            out.first_audio_ms.append(1000.0 * (frames[0][0] - r["sent"]))
            late, _, _ = play(frames, RATE_HZ)
            out.late += late
            if late:
                out.worst_waits_ms.append(1000.0 * max(player_waits(frames, RATE_HZ)))
    return out


async def fast_client(target: str, path: Path, stop: asyncio.Event) -> dict[str, Any]:
    """Transcribe ``path`` at AS_FAST_AS_ALLOWED pacing, again and again until ``stop``."""
    from voxgate_client import (
        AS_FAST_AS_ALLOWED,
        CallConfig,
        Transcript,
        VoxgateClient,
        VoxgateError,
        load_audio,
        stream_audio,
    )

    result: dict[str, Any] = {"files": 0, "finals": 0, "refused": 0, "errors": [], "why": {}}
    audio = load_audio(path)
    async with VoxgateClient(target) as client:
        while not stop.is_set():
            try:
                call = await client.recognize(CallConfig(), bulk=True)
                async with call:

                    async def send(c: Any = call) -> None:
                        await stream_audio(c, audio, pacing=AS_FAST_AS_ALLOWED)
                        await c.flush()
                        await c.hangup()

                    sender = asyncio.create_task(send())
                    async for event in call:
                        if isinstance(event, Transcript) and event.is_final and event.text:
                            result["finals"] += 1
                    await sender
                result["files"] += 1
            except VoxgateError as exc:
                if "RESOURCE_EXHAUSTED" in exc.code.name:
                    result["refused"] += 1
                    # Which admission rule (the message up to its numbers), counted.
                    why = exc.message.split(":")[0] + ": " + exc.message.split(":")[1][:40]
                    result["why"][why] = result["why"].get(why, 0) + 1
                    await asyncio.sleep(1.0)
                else:
                    result["errors"].append(f"{exc.code.name}: {exc.message[:120]}")
                    await asyncio.sleep(1.0)
    return result


@dataclass
class Probe:
    """One N on one server."""

    server: str
    n: int
    callers: list[Caller]
    fast: dict[str, Any]

    def summary(self) -> dict[str, Any]:
        finals = [ms for c in self.callers for ms in c.finals_ms]
        firsts = [ms for c in self.callers for ms in c.first_audio_ms]
        shed = max((c.shed for c in self.callers), key=len, default=[])
        return {
            "server": self.server,
            "n": self.n,
            "admitted": sum(c.admitted for c in self.callers),
            "refused": sum(bool(c.refused) for c in self.callers),
            "errors": sum(bool(c.error) for c in self.callers),
            "finals": len(finals),
            "final_p50_ms": median(finals) if finals else math.nan,
            "final_p95_ms": percentile(finals, 95) if finals else math.nan,
            "first_audio_p50_ms": median(firsts) if firsts else math.nan,
            "first_audio_p95_ms": percentile(firsts, 95) if firsts else math.nan,
            "late": sum(c.late for c in self.callers),
            "late_worst_wait_ms": max(
                (w for c in self.callers for w in c.worst_waits_ms), default=0.0
            ),
            "lost": sum(c.lost for c in self.callers),
            "shed": ",".join(shed) or "-",
            "fast_client": not self.fast.get("off", False),
            "fast_files": self.fast.get("files", 0),
            "fast_refused": self.fast.get("refused", 0),
            "fast_refused_why": self.fast.get("why", {}),
        }

    def passes(self, p95_goal_s: float) -> bool:
        s = self.summary()
        return (
            s["refused"] == 0
            and s["errors"] == 0
            and s["late"] == 0
            and s["lost"] == 0
            and s["final_p95_ms"] <= 1000.0 * p95_goal_s
        )


async def run_probe(
    target: str,
    name: str,
    n: int,
    clips: list[np.ndarray],
    duration_s: float,
    fast_file: Path | None,
) -> Probe:
    """N callers, with the fast client beside them unless ``fast_file`` is None."""
    stop = asyncio.Event()
    fast = None
    if fast_file is not None:
        fast = asyncio.create_task(fast_client(target, fast_file, stop))
        await asyncio.sleep(1.0)  # the fast client is already on when the callers arrive
    calls = []
    for i in range(n):
        calls.append(asyncio.create_task(caller(target, i, clips, duration_s, barge=i % 3 == 2)))
        await asyncio.sleep(0.25)  # callers arrive over a few seconds, as calls do
    done = await asyncio.gather(*calls)
    stop.set()
    fast_result: dict[str, Any] = {"off": True}
    if fast is not None:
        try:
            fast_result = await asyncio.wait_for(fast, 60)
        except TimeoutError:
            fast_result = {"files": -1}
    return Probe(name, n, list(done), fast_result)


def fmt(s: dict[str, Any]) -> str:
    fast = f"{s['fast_files']:>4} {s['fast_refused']:>4}" if s["fast_client"] else "   -    -"
    return (
        f"{s['server']:<9} {s['n']:>3} {s['admitted']:>4} {s['refused']:>4} "
        f"{s['final_p50_ms']:>7.0f} {s['final_p95_ms']:>7.0f} {s['first_audio_p50_ms']:>6.0f} "
        f"{s['first_audio_p95_ms']:>6.0f} {s['late']:>5} {s['late_worst_wait_ms']:>5.0f} "
        f"{s['lost']:>4} {fast}  {s['shed']}"
    )


HEADER = (
    "server      N  adm  ref  fin p50 fin p95  1st50  1st95  late  wait lost fast frej  shed\n"
    "                         ms      ms       ms     ms          ms      files"
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ns", default="1,4,8", help="fixed N to probe (without --bisect)")
    ap.add_argument("--bisect", action="store_true", help="largest N passing, per server")
    ap.add_argument("--max-n", type=int, default=24)
    ap.add_argument("--duration", type=float, default=40.0, help="seconds each caller talks")
    ap.add_argument("--p95-goal-s", type=float, default=1.5)
    ap.add_argument("--baseline", type=Path, default=None, help="an older checkout to compare")
    ap.add_argument("--speech-dir", type=Path, default=SPEECH)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--fast",
        choices=("on", "off", "both"),
        default="on",
        help="the fast client beside the callers; both: each probe with it, then without "
        "(are the real-time callers' finals unchanged beside it?)",
    )
    ap.add_argument("--tiny", action="store_true", help="N=1 for 8 s: the test's run")
    args = ap.parse_args(argv)
    clips = load_clips(args.speech_dir)
    fast_file = REPO / "clients" / "voxgate_client" / "data" / "sample_call.wav"
    servers = [("this", REPO)]
    if args.baseline is not None:
        servers.append(("baseline", args.baseline.resolve()))
    if args.tiny:
        args.ns, args.duration, args.bisect = "1", 8.0, False
    results: list[dict[str, Any]] = []
    print(HEADER, flush=True)

    fast_files: list[Path | None] = [fast_file, None]
    if args.fast != "both":
        fast_files = [fast_file if args.fast == "on" else None]

    def probe(name: str, source: Path, n: int) -> Probe:
        # A fresh server per probe: no probe inherits another's measured load. With
        # ``--fast both`` the probe without the fast client follows on its own fresh server;
        # the bisection judges the first (with it, where the goal asks for it).
        first: Probe | None = None
        for f in fast_files:
            with serve(source, []) as target:
                p = asyncio.run(run_probe(target, name, n, clips, args.duration, f))
            s = p.summary()
            results.append(s)
            print(fmt(s), flush=True)
            first = first or p
        assert first is not None
        return first

    if not args.bisect:
        for n in (int(x) for x in args.ns.split(",")):
            for name, source in servers:
                probe(name, source, n)
    else:
        # Doubling, then bisection; the servers' searches interleave step by step.
        state = {name: {"good": 0, "bad": args.max_n + 1, "next": 1} for name, _ in servers}
        while any(st["bad"] - st["good"] > 1 for st in state.values()):
            for name, source in servers:
                st = state[name]
                if st["bad"] - st["good"] <= 1:
                    continue
                n = st["next"]
                ok = probe(name, source, n).passes(args.p95_goal_s)
                st["good" if ok else "bad"] = n
                if ok and st["bad"] > args.max_n:
                    st["next"] = min(args.max_n, n * 2) if n < args.max_n else n
                    if n == args.max_n:
                        st["bad"] = n + 1
                else:
                    st["next"] = (st["good"] + st["bad"]) // 2
        for name, _ in servers:
            print(f"largest N passing on {name}: {state[name]['good']}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    if args.tiny:
        s = results[0]
        ok = s["admitted"] == 1 and s["finals"] > 0 and (s["fast_files"] >= 1 or args.fast == "off")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
