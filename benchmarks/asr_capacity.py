"""ASR capacity: how many real-time callers one gateway serves within a latency budget.

K simulated callers on loopback each stream real clips from the shared speech set
(../shared/data/speech, 40 clips of 2.7-16 s) in real time, as 16 kHz LINEAR16 in 20 ms chunks
on an absolute clock, with a seeded random pause of 1-3 s (digital silence) between clips. The
gateway runs in its own process (``python -m cli serve --engines asr``); the callers run
here, one Converse stream each over one loopback channel.

Latency, per clip: the wall time at which the final transcript (the last final overlapping the
clip, when the VAD split it) was received, minus the wall time at which the chunk holding the
clip's last sample was sent. It therefore includes the VAD hangover (``end_silence_ms``, 600 ms
by default): an endpointer is part of what a caller waits for. The server's own ``latency_ms``
(server end-of-speech detection -> final) is reported beside it.

Side by side, the baseline a user would write: a thread per call over one shared faster-whisper
``WhisperModel`` (bundled base, CPU, int8), one ``model.transcribe(audio, language="en")`` per
utterance with its default options (beam 5, no VAD filter), given the same clips on the same
schedule. A baseline caller "receives" an utterance in real time (it waits until the clip would
have ended) and transcribes it as soon as its thread is free; latency = transcription end - clip
end. The baseline gets a perfect endpointer for free (no hangover).

For K = 1, 2, 4, 8, ... (each side stops once it saturates) the table shows
p50/p95 latency, utterances done, corpus WER (benchmarks/_wer.py normalisation) and throughput;
then the largest K with p95 <= budget for each, and the capacity ratio. A missing final counts as
an infinite latency.

``--tune`` first measures the CPU plan in-process on a fixed workload (8 utterances queued at
once into a :class:`~gateway.batcher.Batcher`, real Whisper engine): workers x max_batch_size x
CTranslate2 (inter_threads, intra_threads), through :func:`gateway.batcher.choose_plan`.

    .venv/bin/python -m benchmarks.asr_capacity --quick --tune --out capacity.json
    .venv/bin/python -m benchmarks.asr_capacity --duration 60
    .venv/bin/python -m benchmarks.asr_capacity --tune-only

Other work on the machine skews every number here; the load average is recorded per step.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import wave
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import yaml

from benchmarks._stats import median, percentile
from benchmarks._wer import corpus_wer

REPO = Path(__file__).resolve().parents[1]
SPEECH = REPO.parent / "shared" / "data" / "speech"

RATE_HZ = 16_000
CHUNK_MS = 20
CHUNK_SAMPLES = RATE_HZ * CHUNK_MS // 1000
#: Silence sent after a caller's last clip before hanging up (longer than the VAD hangover).
TAIL_S = 1.5

FloatArray = npt.NDArray[np.float32]


# ------------------------------------------------------------------------------------------------
# Data and workload
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Clip:
    name: str
    text: str
    pcm: npt.NDArray[np.int16]

    @property
    def duration_s(self) -> float:
        return len(self.pcm) / RATE_HZ

    @property
    def audio(self) -> FloatArray:
        return (self.pcm.astype(np.float32) / 32768.0).astype(np.float32)


def load_clips() -> list[Clip]:
    manifest = SPEECH / "manifest.jsonl"
    if not manifest.is_file():
        sys.exit(f"shared speech data not found at ../shared/data/speech (looked in {SPEECH})")
    rows = [json.loads(x) for x in manifest.read_text().splitlines() if x.strip()]
    clips = []
    for r in rows:
        with wave.open(str(SPEECH / r["file"]), "rb") as w:
            if w.getframerate() != RATE_HZ or w.getnchannels() != 1 or w.getsampwidth() != 2:
                raise ValueError(f"{r['file']}: expected mono 16-bit 16 kHz")
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.int16)
        clips.append(Clip(r["file"], r["text"], pcm))
    return clips


@dataclass(frozen=True)
class Slot:
    """One clip on one caller's timeline (seconds from the caller's start)."""

    clip: int
    start_s: float
    end_s: float

    @property
    def start_sample(self) -> int:
        return round(self.start_s * RATE_HZ)


def schedule(clips: Sequence[Clip], caller: int, duration_s: float, seed: int) -> list[Slot]:
    """Caller ``caller``'s clips: a seeded order, 0-3 s initial offset, 1-3 s pauses.

    Depends only on (seed, caller), so the gateway and the baseline get the same workload and a
    caller's schedule does not change with K.
    """
    rng = np.random.default_rng([seed, caller])
    order = rng.permutation(len(clips))
    t = float(rng.uniform(0.0, 3.0))
    out: list[Slot] = []
    i = 0
    while True:
        c = int(order[i % len(order)])
        start = round(t * RATE_HZ) / RATE_HZ
        end = start + clips[c].duration_s
        if end > duration_s:
            return out
        out.append(Slot(c, start, end))
        t = end + float(rng.uniform(1.0, 3.0))
        i += 1


def caller_audio(clips: Sequence[Clip], slots: Sequence[Slot]) -> npt.NDArray[np.int16]:
    last = slots[-1].end_s if slots else 0.0
    n = math.ceil((last + TAIL_S) * RATE_HZ / CHUNK_SAMPLES) * CHUNK_SAMPLES
    x = np.zeros(n, dtype=np.int16)
    for s in slots:
        pcm = clips[s.clip].pcm
        x[s.start_sample : s.start_sample + len(pcm)] = pcm
    return x


# ------------------------------------------------------------------------------------------------
# Results
# ------------------------------------------------------------------------------------------------


@dataclass
class UttResult:
    caller: int
    clip: str
    reference: str
    hypothesis: str = ""
    latency_s: float = math.inf  # inf = no final before the drain deadline
    server_latency_ms: int | None = None
    end_at: float = 0.0  # monotonic seconds when the clip's last sample was sent / "arrived"
    done_at: float = math.inf


@dataclass
class StepResult:
    side: str  # "gateway" | "baseline"
    k: int
    duration_s: float
    offered: int
    done: int
    p50_s: float
    p95_s: float
    max_s: float
    server_p50_ms: float | None
    server_p95_ms: float | None
    wer: float
    throughput_ups: float
    audio_rtfx: float
    saturated: bool
    spurious_finals: int
    errors: int
    loadavg_before: tuple[float, float, float]
    loadavg_after: tuple[float, float, float]
    server_cpu_cores: float | None = None
    #: Worst lateness of a chunk behind its real-time slot (client overload shows up here).
    client_late_ms: float | None = None
    utterances: list[UttResult] = field(default_factory=list)


def summarise(
    side: str,
    k: int,
    duration_s: float,
    utts: list[UttResult],
    clips: Sequence[Clip],
    t0: float,
    load0: tuple[float, float, float],
    *,
    spurious: int = 0,
    errors: int = 0,
    server_cpu: float | None = None,
    client_late_ms: float | None = None,
) -> StepResult:
    lat = [u.latency_s for u in utts]
    done = [u for u in utts if math.isfinite(u.latency_s)]
    srv = [float(u.server_latency_ms) for u in done if u.server_latency_ms is not None]
    last_done = max((u.done_at for u in done), default=t0)
    busy = max(1e-9, last_done - t0)
    audio_s = sum(clips[[c.name for c in clips].index(u.clip)].duration_s for u in done)
    # Saturated: the backlog outlived the offered load by more than a few utterances' worth.
    last_end = max((u.end_at for u in utts), default=t0)
    saturated = (len(done) < len(utts)) or (last_done - last_end > 10.0)
    return StepResult(
        side=side,
        k=k,
        duration_s=duration_s,
        offered=len(utts),
        done=len(done),
        p50_s=percentile(lat, 50),
        p95_s=percentile(lat, 95),
        max_s=max(lat) if lat else math.nan,
        server_p50_ms=percentile(srv, 50) if srv else None,
        server_p95_ms=percentile(srv, 95) if srv else None,
        wer=corpus_wer([u.reference for u in utts], [u.hypothesis for u in utts]),
        throughput_ups=len(done) / busy,
        audio_rtfx=audio_s / busy,
        saturated=saturated,
        spurious_finals=spurious,
        errors=errors,
        loadavg_before=load0,
        loadavg_after=os.getloadavg(),
        server_cpu_cores=server_cpu,
        client_late_ms=client_late_ms,
        utterances=utts,
    )


# ------------------------------------------------------------------------------------------------
# Gateway side: a server process, K real-time callers here
# ------------------------------------------------------------------------------------------------


class ServerProcess:
    """``python -m cli serve --engines asr`` with a YAML config, on a free port."""

    def __init__(self, overrides: dict[str, Any], log_path: Path) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="voxgate-capacity-")
        cfg = {"server": {"host": "127.0.0.1", "port": 0, "grace_s": 1.0}, **overrides}
        cfg_path = Path(self._dir.name) / "config.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        self.log_path = log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cli", "serve", "--config", str(cfg_path)]
            + ["--engines", "asr", "--log-level", "INFO"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.fullmatch(r"listening on (\S+)\n", line)
        if not m:
            self.stop()
            sys.exit(f"server did not start ({line!r}); see {log_path}")
        self.target = m.group(1)

    def plan_line(self) -> str:
        self._log.flush()
        text = self.log_path.read_text()
        found = re.findall(r"(asr (?:engine|batcher): .*)", text)
        return "; ".join(found) if found else "?"

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()
        self._log.close()
        self._dir.cleanup()


@dataclass
class _Final:
    received_s: float
    start_ms: int
    end_ms: int
    text: str
    latency_ms: int


async def _gateway_caller(
    client: Any,
    clips: Sequence[Clip],
    slots: list[Slot],
    caller: int,
    t0: float,
    end_silence_ms: int,
    drain_deadline: float,
) -> tuple[list[UttResult], int, int, float]:
    from clients.voxgate_client import CallConfig, ErrorEvent, Transcript, VadOptions

    loop = asyncio.get_running_loop()
    audio = caller_audio(clips, slots).astype("<i2").tobytes()
    n_chunks = len(audio) // (2 * CHUNK_SAMPLES)
    # chunk index holding each clip's last sample -> slot
    last_chunk = {(s.start_sample + len(clips[s.clip].pcm) - 1) // CHUNK_SAMPLES: s for s in slots}
    sent_end: dict[int, float] = {}
    finals: list[_Final] = []
    errors = 0
    late_s = 0.0
    cfg = CallConfig(
        encoding="linear16",
        sample_rate_hz=RATE_HZ,
        language="en",
        barge_in=False,
        call_id=f"capacity-{caller}",
        vad=VadOptions(end_silence_ms=end_silence_ms),
    )
    call = await client.converse(cfg)

    async def read() -> None:
        nonlocal errors
        async for ev in call:
            if isinstance(ev, Transcript) and ev.is_final:
                finals.append(_Final(ev.received_s, ev.start_ms, ev.end_ms, ev.text, ev.latency_ms))
            elif isinstance(ev, ErrorEvent):
                errors += 1

    reader = asyncio.create_task(read())
    try:
        for n in range(n_chunks):
            # Chunk n holds audio [n, n+1) * 20 ms; a line delivers it once it is complete.
            due = t0 + (n + 1) * CHUNK_MS / 1000
            if (delay := due - loop.time()) > 0:
                await asyncio.sleep(delay)
            late_s = max(late_s, loop.time() - due)
            await call.send_audio(audio[n * 2 * CHUNK_SAMPLES : (n + 1) * 2 * CHUNK_SAMPLES])
            if n in last_chunk:
                sent_end[last_chunk[n].start_sample] = loop.time()
        await call.hangup()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reader), max(0.1, drain_deadline - loop.time()))
    finally:
        await call.aclose()
        reader.cancel()
        with contextlib.suppress(BaseException):
            await reader

    # Assign each final to the clip it overlaps most (the VAD may split a clip).
    assigned: dict[int, list[_Final]] = {i: [] for i in range(len(slots))}
    spurious = 0
    for f in finals:
        best, overlap = -1, 0.0
        for i, s in enumerate(slots):
            ov = min(f.end_ms, 1000 * s.end_s) - max(f.start_ms, 1000 * s.start_s)
            if ov > overlap:
                best, overlap = i, ov
        if best < 0:
            spurious += 1 if f.text.strip() else 0
        else:
            assigned[best].append(f)
    out = []
    for i, s in enumerate(slots):
        fs = sorted(assigned[i], key=lambda f: f.start_ms)
        u = UttResult(caller, clips[s.clip].name, clips[s.clip].text)
        u.end_at = sent_end.get(s.start_sample, math.nan)
        if fs:
            last = max(fs, key=lambda f: f.received_s)
            u.hypothesis = " ".join(f.text.strip() for f in fs if f.text.strip())
            u.done_at = last.received_s
            u.latency_s = last.received_s - u.end_at
            u.server_latency_ms = last.latency_ms
        out.append(u)
    return out, spurious, errors, 1000 * late_s


async def _warm_gateway(target: str, clip: Clip) -> None:
    """One fast call, so that the first measured utterance pays no first-call costs."""
    from clients.voxgate_client import (
        AS_FAST_AS_ALLOWED,
        CallConfig,
        VoxgateClient,
        WireAudio,
        stream_audio,
    )

    async with VoxgateClient(target) as client:
        call = await client.converse(CallConfig(language="en", barge_in=False))
        pad = np.zeros(RATE_HZ, dtype=np.int16)
        data = np.concatenate([clip.pcm, pad]).astype("<i2").tobytes()
        await stream_audio(call, WireAudio(data, "linear16", RATE_HZ), AS_FAST_AS_ALLOWED)
        await call.hangup()
        async for _ in call:
            pass


async def _gateway_step(
    server: ServerProcess,
    clips: Sequence[Clip],
    k: int,
    duration_s: float,
    seed: int,
    end_silence_ms: int,
    drain_s: float,
) -> StepResult:
    from clients.voxgate_client import VoxgateClient

    load0 = os.getloadavg()
    loop = asyncio.get_running_loop()
    slots = [schedule(clips, c, duration_s, seed) for c in range(k)]
    async with VoxgateClient(server.target) as client:
        t0 = loop.time() + 0.5
        drain_deadline = t0 + duration_s + TAIL_S + drain_s
        cpu0 = server.cpu_seconds()
        results = await asyncio.gather(
            *(
                _gateway_caller(client, clips, slots[c], c, t0, end_silence_ms, drain_deadline)
                for c in range(k)
            )
        )
        cpu = server.cpu_seconds() - cpu0
        wall = loop.time() - t0
    utts = [u for r in results for u in r[0]]
    return summarise(
        "gateway",
        k,
        duration_s,
        utts,
        clips,
        t0,
        load0,
        spurious=sum(r[1] for r in results),
        errors=sum(r[2] for r in results),
        server_cpu=cpu / max(1e-9, wall),
        client_late_ms=max(r[3] for r in results),
    )


# ------------------------------------------------------------------------------------------------
# Baseline side: faster-whisper transcribe per utterance, a thread per call
# ------------------------------------------------------------------------------------------------


def _baseline_model(cpu_threads: int) -> Any:
    from faster_whisper import WhisperModel

    from engines.asr.model_files import resolve_model_dir

    return WhisperModel(
        str(resolve_model_dir("base")), device="cpu", compute_type="int8", cpu_threads=cpu_threads
    )


def _baseline_step(
    model: Any,
    clips: Sequence[Clip],
    k: int,
    duration_s: float,
    seed: int,
    drain_s: float,
    beam_size: int,
) -> StepResult:
    load0 = os.getloadavg()
    slots = [schedule(clips, c, duration_s, seed) for c in range(k)]
    audios = {i: c.audio for i, c in enumerate(clips)}
    t0 = time.monotonic() + 0.5
    drain_deadline = t0 + duration_s + drain_s
    results: list[list[UttResult]] = [[] for _ in range(k)]

    def caller(c: int) -> None:
        for s in slots[c]:
            clip = clips[s.clip]
            u = UttResult(c, clip.name, clip.text)
            u.end_at = t0 + s.end_s
            results[c].append(u)
            # The utterance "arrives" in real time; a busy thread gets to it late.
            time.sleep(max(0.0, u.end_at - time.monotonic()))
            if time.monotonic() > drain_deadline:
                continue
            segments, _info = model.transcribe(audios[s.clip], language="en", beam_size=beam_size)
            u.hypothesis = " ".join(seg.text.strip() for seg in segments)
            u.done_at = time.monotonic()
            u.latency_s = u.done_at - u.end_at

    threads = [threading.Thread(target=caller, args=(c,), daemon=True) for c in range(k)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    utts = [u for r in results for u in r]
    return summarise("baseline", k, duration_s, utts, clips, t0, load0)


# ------------------------------------------------------------------------------------------------
# Tuning: workers x max_batch_size x CT2 threads on a fixed queued workload, in-process
# ------------------------------------------------------------------------------------------------


@dataclass
class TuneRow:
    inter_threads: int
    intra_threads: int
    workers: int
    max_batch_size: int
    wall_s: float  # best of the rounds
    median_wall_s: float
    throughput_ups: float  # from the best round
    lone_p50_s: float  # one utterance alone (same for every plan of a thread setting)
    loadavg: float  # mean 1-min load average while this row was measured


def _worker_engines(engine: Any, workers: int) -> list[Any]:
    """One engine object per batcher worker over the shared CTranslate2 model (as the hub).

    ``sibling()`` carries the warmup's measurements (how CTranslate2 reads ``max_length``) over
    to the new objects; building them from the constructor would reset that.
    """
    return [engine, *(engine.sibling() for _ in range(workers - 1))]


def tune(
    clips: Sequence[Clip],
    threads: Sequence[tuple[int, int]],
    workers: Sequence[int],
    sizes: Sequence[int],
    n_items: int,
    rounds: int,
) -> tuple[list[TuneRow], dict[str, Any]]:
    """Measure every (threads, workers, batch) on ``n_items`` queued utterances.

    Rounds are interleaved (every configuration once per round) so that load from other users
    of the machine spreads over all configurations; each keeps its best round. The plan per
    thread setting is then :func:`choose_plan` over those measurements.
    """
    from engines.asr.base import AsrOptions, AsrRequest
    from engines.asr.config import WhisperConfig
    from engines.asr.whisper import WhisperEngine
    from gateway.batcher import Batcher, BatchPlan, BatchPolicy, choose_plan
    from gateway.testing.signals import stats_for

    step = max(1, len(clips) // n_items)
    picked = [clips[i] for i in range(0, len(clips), step)][:n_items]
    # What a gateway call with language "en" and default decoding sends (greedy, no words).
    opts = AsrOptions(language="en", beam_size=1, word_timestamps=False)
    reqs = [AsrRequest(c.audio, stats_for(c.audio), opts) for c in picked]
    print(
        f"tuning workload: {len(reqs)} utterances queued at once "
        f"({sum(c.duration_s for c in picked):.1f} s of audio), {rounds} interleaved round(s)",
        flush=True,
    )

    async def run_once(engines: list[Any], batch: int, items: Sequence[Any]) -> float:
        policy = BatchPolicy(max_batch_size=batch, max_wait_ms=0.0, max_queue_size=256)
        async with Batcher(engines, policy, name="tune") as batcher:
            t = time.perf_counter()
            futs = [batcher.submit(r, key=r.batch_key) for r in items]
            await asyncio.gather(*futs)
            return time.perf_counter() - t

    models: dict[tuple[int, int], Any] = {}
    for inter, intra in threads:
        engine = WhisperEngine.load(
            WhisperConfig(inter_threads=inter, intra_threads=intra, max_batch_size=8)
        )
        engine.warmup()
        asyncio.run(run_once([engine], 1, reqs))  # first real-length encode of each bucket
        models[(inter, intra)] = engine
    plans = [BatchPlan(b, w) for w in workers for b in sizes]
    walls: dict[tuple[int, int, int, int], list[float]] = {}
    loads: dict[tuple[int, int, int, int], list[float]] = {}
    lone: dict[tuple[int, int], list[float]] = {t: [] for t in threads}
    for rnd in range(rounds):
        for (inter, intra), engine in models.items():
            for r in reqs:
                lone[(inter, intra)].append(asyncio.run(run_once([engine], 1, [r])))
            for plan in plans:
                key = (inter, intra, plan.workers, plan.max_batch_size)
                engines = _worker_engines(engine, plan.workers)
                load0 = os.getloadavg()[0]
                walls.setdefault(key, []).append(
                    asyncio.run(run_once(engines, plan.max_batch_size, reqs))
                )
                loads.setdefault(key, []).append((load0 + os.getloadavg()[0]) / 2)
        print(f"  round {rnd + 1}/{rounds} done (load {os.getloadavg()[0]:.2f})", flush=True)
    for engine in models.values():
        engine.close()

    rows: list[TuneRow] = []
    for (inter, intra, w, b), ws in walls.items():
        rows.append(
            TuneRow(
                inter,
                intra,
                w,
                b,
                min(ws),
                median(ws),
                len(reqs) / min(ws),
                median(lone[(inter, intra)]),
                float(np.mean(loads[(inter, intra, w, b)])),
            )
        )
    chosen: dict[str, Any] = {}
    for inter, intra in threads:
        table = {
            (r.max_batch_size, r.workers): r.throughput_ups
            for r in rows
            if (r.inter_threads, r.intra_threads) == (inter, intra)
        }
        plan = choose_plan(lambda b, w, t=table: t[(b, w)], plans)  # type: ignore[misc]
        chosen[f"{inter},{intra}"] = {
            "max_batch_size": plan.max_batch_size,
            "workers": plan.workers,
        }
    best = max(rows, key=lambda r: r.throughput_ups)
    near = [r for r in rows if r.throughput_ups >= best.throughput_ups * 0.95]
    # Ties (within 5%) go to the lower lone-utterance latency, then smaller batch, fewer workers.
    pick = min(near, key=lambda r: (round(r.lone_p50_s, 2), r.max_batch_size, r.workers))
    chosen["overall"] = asdict(pick)
    return rows, chosen


def print_tune(rows: Sequence[TuneRow], chosen: dict[str, Any]) -> None:
    print()
    print(
        "| inter | intra | workers | max_batch | best wall s (8 utt) | median wall s | utt/s "
        "| lone utt p50 s | load1 |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r.inter_threads} | {r.intra_threads} | {r.workers} | {r.max_batch_size} | "
            f"{r.wall_s:.2f} | {r.median_wall_s:.2f} | {r.throughput_ups:.2f} | "
            f"{r.lone_p50_s:.3f} | {r.loadavg:.2f} |"
        )
    for k, v in chosen.items():
        if k != "overall":
            print(f"choose_plan for inter,intra={k}: {v}")
    o = chosen["overall"]
    print(
        f"best overall (within 5% of the top utt/s: lowest lone latency, smallest batch, fewest "
        f"workers): inter={o['inter_threads']} intra={o['intra_threads']} "
        f"workers={o['workers']} max_batch={o['max_batch_size']}"
    )


# ------------------------------------------------------------------------------------------------
# Driver
# ------------------------------------------------------------------------------------------------


def _fmt_s(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return "inf" if math.isinf(x) else f"{x:.2f}"


def ladder(run_k: Any, ks: Sequence[int], label: str) -> list[StepResult]:
    """Run K up the ladder until the side saturates (its throughput is then its capacity)."""
    out: list[StepResult] = []
    for k in ks:
        r: StepResult = run_k(k)
        out.append(r)
        print(
            f"  {label} K={k:3d}: p50 {_fmt_s(r.p50_s)} s  p95 {_fmt_s(r.p95_s)} s  "
            f"done {r.done}/{r.offered}  WER {100 * r.wer:5.2f}%  {r.throughput_ups:.3f} utt/s  "
            f"{'saturated ' if r.saturated else ''}load {r.loadavg_before[0]:.2f}->"
            f"{r.loadavg_after[0]:.2f}"
            + (f"  server {r.server_cpu_cores:.2f} cores" if r.server_cpu_cores is not None else "")
            + (f"  send late <= {r.client_late_ms:.0f} ms" if r.client_late_ms is not None else ""),
            flush=True,
        )
        if r.saturated:
            break
    return out


def capacity(rows: Sequence[StepResult], budget_s: float) -> int:
    """Largest K of the unbroken run of passes from the bottom of the ladder (0: K=1 fails)."""
    best = 0
    for r in sorted(rows, key=lambda r: r.k):
        if r.p95_s > budget_s:
            break
        best = r.k
    return best


def print_table(gw: Sequence[StepResult], bl: Sequence[StepResult], budget_s: float) -> None:
    print()
    print(
        "| K | gateway p50 s | gateway p95 s | server p50/p95 ms | gw done | gw WER % | gw utt/s "
        "| baseline p50 s | baseline p95 s | bl done | bl WER % | bl utt/s | load1 gw/bl |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    by_k_g = {r.k: r for r in gw}
    by_k_b = {r.k: r for r in bl}
    for k in sorted(set(by_k_g) | set(by_k_b)):
        g, b = by_k_g.get(k), by_k_b.get(k)
        cells = [str(k)]
        if g:
            srv = (
                f"{g.server_p50_ms:.0f}/{g.server_p95_ms:.0f}"
                if g.server_p50_ms is not None and g.server_p95_ms is not None
                else "-"
            )
            cells += [
                _fmt_s(g.p50_s),
                _fmt_s(g.p95_s),
                srv,
                f"{g.done}/{g.offered}",
                f"{100 * g.wer:.2f}",
                f"{g.throughput_ups:.3f}" + ("*" if g.saturated else ""),
            ]
        else:
            cells += ["-"] * 6
        if b:
            cells += [
                _fmt_s(b.p50_s),
                _fmt_s(b.p95_s),
                f"{b.done}/{b.offered}",
                f"{100 * b.wer:.2f}",
                f"{b.throughput_ups:.3f}" + ("*" if b.saturated else ""),
            ]
        else:
            cells += ["-"] * 5
        cells.append(f"{g.loadavg_before[0]:.1f}" if g else "-")
        cells[-1] += "/" + (f"{b.loadavg_before[0]:.1f}" if b else "-")
        print("| " + " | ".join(cells) + " |")
    print("(* = saturated: backlog outlived the offered load or finals were missing)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="30 s per K, tuning without repeats")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of offered load per K")
    ap.add_argument("--ks", default="1,2,4,8,16,32", help="caller counts to try, ascending")
    ap.add_argument("--budget", type=float, default=1.0, help="p95 latency budget, s")
    ap.add_argument("--drain", type=float, default=30.0, help="extra time for a backlog, s")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument(
        "--end-silence-ms", type=int, default=600, help="VAD hangover the callers ask for"
    )
    ap.add_argument("--tune", action="store_true", help="measure the CPU plan first")
    ap.add_argument("--tune-only", action="store_true", help="only measure the CPU plan")
    ap.add_argument("--tune-rounds", type=int, default=3, help="interleaved tuning rounds")
    ap.add_argument("--skip-gateway", action="store_true")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--baseline-beam", type=int, default=5, help="faster-whisper default is 5")
    ap.add_argument(
        "--baseline-cpu-threads", type=int, default=0, help="WhisperModel cpu_threads (0=default)"
    )
    ap.add_argument("--workers", type=int, help="server batcher.workers (default: server's)")
    ap.add_argument("--max-batch", type=int, help="server batcher.max_batch_size")
    ap.add_argument("--inter-threads", type=int, help="server asr.inter_threads")
    ap.add_argument("--intra-threads", type=int, help="server asr.intra_threads")
    ap.add_argument("--out", type=Path, help="write every number as JSON here")
    args = ap.parse_args()
    if args.quick and args.duration == 60.0:
        args.duration = 30.0
    rounds = 2 if args.quick else args.tune_rounds
    ks = [int(x) for x in args.ks.split(",")]

    clips = load_clips()
    print(
        f"{len(clips)} clips, {sum(c.duration_s for c in clips):.0f} s; 16 kHz LINEAR16, "
        f"{CHUNK_MS} ms chunks, real time; {args.duration:.0f} s per K; "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()}",
        flush=True,
    )
    report: dict[str, Any] = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "cpu_count": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
    }

    if args.tune or args.tune_only:
        rows, chosen = tune(
            clips,
            [(1, 0), (1, 2), (2, 1)],
            workers=(1, 2),
            sizes=(1, 2, 4),
            n_items=8,
            rounds=rounds,
        )
        print_tune(rows, chosen)
        report["tune"] = {"rows": [asdict(r) for r in rows], "chosen": chosen}
        if args.tune_only:
            _write(args.out, report)
            return

    gw: list[StepResult] = []
    if not args.skip_gateway:
        overrides: dict[str, Any] = {}
        batcher = {
            k: v
            for k, v in (("workers", args.workers), ("max_batch_size", args.max_batch))
            if v is not None
        }
        asr = {
            k: v
            for k, v in (
                ("inter_threads", args.inter_threads),
                ("intra_threads", args.intra_threads),
            )
            if v is not None
        }
        if batcher:
            overrides["batcher"] = batcher
        if asr:
            overrides["asr"] = asr
        log_path = Path(tempfile.gettempdir()) / f"voxgate-capacity-server-{os.getpid()}.log"
        server = ServerProcess(overrides, log_path)
        try:
            asyncio.run(_warm_gateway(server.target, clips[0]))
            plan = server.plan_line()
            print(f"gateway: {server.target}, {plan}, overrides {overrides}", flush=True)
            report["gateway_plan"] = plan
            gw = ladder(
                lambda k: asyncio.run(
                    _gateway_step(
                        server, clips, k, args.duration, args.seed, args.end_silence_ms, args.drain
                    )
                ),
                ks,
                "gateway ",
            )
        finally:
            server.stop()

    bl: list[StepResult] = []
    if not args.skip_baseline:
        model = _baseline_model(args.baseline_cpu_threads)
        list(model.transcribe(clips[0].audio, language="en")[0])  # warm-up; segments are lazy
        print("baseline: faster-whisper WhisperModel(base, cpu, int8), thread per call", flush=True)
        bl = ladder(
            lambda k: _baseline_step(
                model, clips, k, args.duration, args.seed, args.drain, args.baseline_beam
            ),
            ks,
            "baseline",
        )

    print_table(gw, bl, args.budget)
    k_g = capacity(gw, args.budget) if gw else None
    k_b = capacity(bl, args.budget) if bl else None
    summary: dict[str, Any] = {"budget_s": args.budget, "k_gateway": k_g, "k_baseline": k_b}
    print(f"\nlargest K with p95 <= {args.budget:.1f} s: gateway {k_g}, baseline {k_b}")
    if k_g is not None and k_b is not None:
        peak_g = max(r.throughput_ups for r in gw)
        peak_b = max(r.throughput_ups for r in bl)
        thr_ratio = peak_g / peak_b if peak_b > 0 else math.inf
        summary["peak_throughput_ups"] = {"gateway": peak_g, "baseline": peak_b}
        summary["throughput_ratio"] = thr_ratio
        if k_b == 0 and k_g > 0:
            ratio = "inf (baseline fails at K=1)"
        elif k_b == 0:
            ratio = "undefined (both fail at K=1)"
        else:
            ratio = f"{k_g / k_b:.2f}x"
        summary["capacity_ratio"] = ratio
        print(f"capacity ratio: {ratio}")
        lower = "" if gw[-1].saturated else ">= "
        summary["gateway_saturated"] = gw[-1].saturated
        print(
            f"throughput at saturation (peak utt/s): gateway {lower}{peak_g:.3f}, baseline "
            f"{peak_b:.3f} -> {lower}{thr_ratio:.2f}x"
            + ("" if gw[-1].saturated else " (gateway never saturated: a lower bound)")
        )
    # The same capacity on the server's own latency (VAD detection -> final), for reference.
    if gw:
        srv_ok = [
            r.k
            for r in gw
            if r.server_p95_ms is not None
            and r.done == r.offered
            and r.server_p95_ms <= 1000 * args.budget
        ]
        summary["k_gateway_server_latency"] = max(srv_ok, default=0)
        print(
            f"gateway K with server-reported p95 <= {args.budget:.1f} s (excludes the "
            f"{args.end_silence_ms} ms hangover): {summary['k_gateway_server_latency']}"
        )
    report["gateway"] = [asdict(r) for r in gw]
    report["baseline"] = [asdict(r) for r in bl]
    report["summary"] = summary
    report["loadavg_end"] = os.getloadavg()
    _write(args.out, report)


def _write(path: Path | None, report: dict[str, Any]) -> None:
    if path is None:
        return

    def clean(x: Any) -> Any:
        if isinstance(x, float) and not math.isfinite(x):
            return None if math.isnan(x) else "inf"
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [clean(v) for v in x]
        return x

    path.write_text(json.dumps(clean(report), indent=1))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
