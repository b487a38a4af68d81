"""ASR capacity: how many real-time callers one gateway serves within a latency budget.

K simulated callers on loopback each stream real clips from the shared speech set
(../shared/data/speech, 40 clips of 2.7-16 s) in real time, as 16 kHz LINEAR16 in 20 ms chunks
on an absolute clock, with a seeded random pause of 1-3 s (digital silence) between clips. The
gateway runs in its own process (``python -m voxgate.cli serve --engines asr``, its default config:
on 2 cores 2 batcher workers over one CTranslate2 model, inter_threads 2 x intra_threads 1); the
callers run here, one Converse stream each over one loopback channel. Admission and load shedding
are off on the server (``UNGUARDED``): it must serve every offered call as asked, or the search
would measure where it starts refusing callers rather than where latency crosses the budget.

Latency, per clip: the wall time at which the final transcript (the last final overlapping the
clip, when the VAD split it) was received, minus the wall time at which the chunk holding the
clip's last sample was sent. It therefore includes the VAD hangover (``end_silence_ms``, 600 ms
by default): an endpointer is part of what a caller waits for. The server's own ``latency_ms``
(server end-of-speech detection -> final) is reported beside it.

Side by side, the baseline a user would write: a thread per call over one shared faster-whisper
``WhisperModel`` (bundled base, CPU, int8), one ``model.transcribe(audio, language="en",
beam_size=B)`` per utterance, its other options at their defaults (no VAD filter), given the
same clips on the same schedule. A baseline caller "receives" an utterance in real time (it
waits until the clip would have ended) and transcribes it as soon as its thread is free;
latency = transcription end - clip end. The baseline gets a perfect endpointer for free (no
hangover).

Fair by construction: both sides decode at the same beam (``--beam``, default 1: the gateway's
default greedy decoding) with the same model and compute type, and the baseline gets the same
cores in its best ``WhisperModel(num_workers, cpu_threads)`` split: each candidate of
``--baseline-threads`` (default ``2x1,1x2``, num_workers x cpu_threads = the 2 cores) is first
measured on a fixed burst (8 clips transcribed at once from 8 threads, and 4 of them alone, 2
interleaved rounds) and the one with the higher burst throughput is used (within 5 %: the lower
lone-clip latency).

Capacity: for each side, a search for the largest K whose p95 latency is within ``--budget``
(1 s): K doubles from ``--gateway-start`` / ``--baseline-start`` while probes pass, then bisects
between the largest passing and the smallest failing K down to a gap of one (it assumes p95
grows with K). Gateway and baseline probes alternate in one run, so that load from other users
of the machine hits both, and the gateway server is idle before every baseline probe; while one
side's search is over and the other's is not, the finished side repeats a probe at its boundary
K (``--no-fill`` turns this off) on a fresh clip schedule, pooled with its earlier probes of that
K (the first probe of a K has the same schedule on both sides). A missing final counts as an
infinite latency. When the baseline holds no call at the budget, the search
is repeated for both sides at each of ``--loose-budgets`` (2 s, then 3 s) in turn, reusing every
probe already made, until the baseline holds one. ``--max-minutes`` bounds the run; a cut search
is reported as a range. Percentiles are nearest rank (``benchmarks/_stats.py``).

It prints the exact command line, then one line per probe as it ends, then a table with one row
per probed K: per side p50/p95 latency, utterances done, corpus WER (benchmarks/_wer.py
normalisation), which budgets its p95 met, the probes pooled, and the CPU other users of the
machine took meanwhile; then the largest K held per side and budget and their ratio.

``--join`` adds a third side, ``join``: a second gateway server with our own decode loop for
every utterance and iteration-level batching (``asr.decode_loop.always`` and
``batcher.join_running``: an utterance that arrives while every worker decodes joins a running
batch at its next step), otherwise configured as the ``gateway`` side (same flags, same beam),
probed in turn with the others on the same clip schedules. The ``join`` server runs with
``OPENBLAS_NUM_THREADS=1`` (the loop is NumPy; one BLAS thread per worker is its measured
best). ``--skip-baseline --join`` compares the two gateways alone; the ratio of their
capacities is printed as ``join / gateway``.

``--model`` and ``--encoder-buckets`` set what the ``gateway`` side serves (``asr.model``: a
name or a model directory, e.g. one ``benchmarks.adapt_windows --keep`` wrote; ``utterance``
buckets: 1..30 s every second with a 0.5 s margin, as a model trained with audio-context
fine-tuning is served). ``--alt-model`` / ``--alt-encoder-buckets`` add a side ``alt``: a second
gateway server like ``gateway`` but with its own model and buckets, probed in turn with the
others on the same clip schedules, so two models compare under the same load; the ratio is
printed as ``alt / gateway``. The table and the JSON (``sides``) name each side's model and
buckets.

``--tune`` first measures the CPU plan in-process on a fixed workload (8 utterances queued at
once into a :class:`~voxgate.gateway.scheduling.Batcher`, real Whisper engine): workers x
max_batch_size x CTranslate2 (inter_threads, intra_threads), through
:func:`voxgate.gateway.scheduling.choose_plan`.

    .venv/bin/python -m benchmarks.asr_capacity --out capacity.json
    .venv/bin/python -m benchmarks.asr_capacity --duration 30 --gateway-start 4 --max-minutes 20
    .venv/bin/python -m benchmarks.asr_capacity --tune-only
    .venv/bin/python -m benchmarks.asr_capacity --skip-baseline --join --duration 30
    .venv/bin/python -m benchmarks.asr_capacity --skip-baseline --quick \
        --alt-model MODELS/utterance --alt-encoder-buckets utterance

Other work on the machine skews every number here; the load average is recorded per probe.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import resource
import shlex
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
from voxgate.engines.asr.config import UTTERANCE_ENCODER_WINDOWS, EncoderWindowConfig

REPO = Path(__file__).resolve().parents[1]
#: Default speech set: ../shared/data/speech beside the checkout (``--speech-dir`` overrides).
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


def load_clips(speech_dir: Path = SPEECH) -> list[Clip]:
    manifest = speech_dir / "manifest.jsonl"
    if not manifest.is_file():
        sys.exit(f"shared speech data not found (looked for {manifest})")
    rows = [json.loads(x) for x in manifest.read_text().splitlines() if x.strip()]
    clips = []
    for r in rows:
        with wave.open(str(speech_dir / r["file"]), "rb") as w:
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
    side: str  # "gateway" | "join" | "alt" | "baseline"
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
    #: CPU cores this process (the callers' side) used during a gateway probe.
    client_cpu_cores: float | None = None
    #: CPU cores the rest of the machine (other users) used during the probe: all busy CPU
    #: time in /proc/stat minus this process's and the server's.
    other_cpu_cores: float | None = None
    #: Position in the run (1 = first probe), its workload seed, and the wall seconds it took.
    probe: int = 0
    seed: int = 0
    wall_s: float = 0.0
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
    client_cpu_cores: float | None = None,
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
        client_cpu_cores=client_cpu_cores,
        utterances=utts,
    )


# ------------------------------------------------------------------------------------------------
# Gateway side: a server process, K real-time callers here
# ------------------------------------------------------------------------------------------------


#: Admission and load shedding off on every gateway side: capacity is where p95 crosses the
#: budget with every offered call served as asked, so the server must neither refuse a caller
#: (RESOURCE_EXHAUSTED once its recent p95 passes 0.7 of its own 1 s budget) nor cheapen decodes.
UNGUARDED: dict[str, Any] = {"admission": {"enabled": False}, "degrade": {"enabled": False}}


def server_config(overrides: dict[str, Any]) -> dict[str, Any]:
    """A gateway side's whole config: loopback on a free port, :data:`UNGUARDED`, ``overrides``."""
    return {"server": {"host": "127.0.0.1", "port": 0, "grace_s": 1.0}, **UNGUARDED, **overrides}


class ServerProcess:
    """``python -m voxgate.cli serve --engines asr`` with a YAML config, on a free port."""

    def __init__(
        self, overrides: dict[str, Any], log_path: Path, env: dict[str, str] | None = None
    ) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="voxgate-capacity-")
        cfg = server_config(overrides)
        cfg_path = Path(self._dir.name) / "config.yaml"
        cfg_path.write_text(yaml.safe_dump(cfg))
        self.log_path = log_path
        self._log = log_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "voxgate.cli", "serve", "--config", str(cfg_path)]
            + ["--engines", "asr", "--log-level", "INFO"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            env={**os.environ, **(env or {})},
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

    def wait_idle(self, quiet_cores: float = 0.05, timeout_s: float = 90.0) -> float:
        """Wait until the server is idle (a backlog of closed calls can outlive a probe)."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            c0 = self.cpu_seconds()
            time.sleep(0.5)
            if (self.cpu_seconds() - c0) / 0.5 < quiet_cores:
                break
        return time.monotonic() - t0

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
    beam_size: int,
) -> tuple[list[UttResult], int, int, float]:
    from voxgate_client import CallConfig, ErrorEvent, Transcript, VadOptions

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
        beam_size=beam_size,
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
    from voxgate_client import (
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


#: Sides served by a gateway server (the others run in this process).
GATEWAY_SIDES = ("gateway", "join", "alt")
#: ``--encoder-buckets`` choices: the server's default buckets, or windows sized to the
#: utterance (what a model trained with audio-context fine-tuning is served on).
ENCODER_BUCKETS: dict[str, dict[str, Any]] = {
    "served": {},
    "utterance": {
        "buckets_s": list(UTTERANCE_ENCODER_WINDOWS.buckets_s),
        "margin_ms": UTTERANCE_ENCODER_WINDOWS.margin_ms,
    },
}
#: What the ``join`` side adds to the gateway's config.
JOIN_OVERRIDES: dict[str, Any] = {
    "asr": {"decode_loop": {"always": True}},
    "batcher": {"join_running": True},
}


async def _gateway_step(
    side: str,
    server: ServerProcess,
    clips: Sequence[Clip],
    k: int,
    duration_s: float,
    seed: int,
    end_silence_ms: int,
    drain_s: float,
    beam_size: int,
) -> StepResult:
    from voxgate_client import VoxgateClient

    load0 = os.getloadavg()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    loop = asyncio.get_running_loop()
    slots = [schedule(clips, c, duration_s, seed) for c in range(k)]
    async with VoxgateClient(server.target) as client:
        t0 = loop.time() + 0.5
        drain_deadline = t0 + duration_s + TAIL_S + drain_s
        cpu0 = server.cpu_seconds()
        results = await asyncio.gather(
            *(
                _gateway_caller(
                    client, clips, slots[c], c, t0, end_silence_ms, drain_deadline, beam_size
                )
                for c in range(k)
            )
        )
        cpu = server.cpu_seconds() - cpu0
        wall = loop.time() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    client_cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    utts = [u for r in results for u in r[0]]
    return summarise(
        side,
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
        client_cpu_cores=client_cpu / max(1e-9, wall),
    )


# ------------------------------------------------------------------------------------------------
# Baseline side: faster-whisper transcribe per utterance, a thread per call
# ------------------------------------------------------------------------------------------------


def _baseline_model(num_workers: int, cpu_threads: int) -> Any:
    """faster-whisper on the bundled base model: ``num_workers`` CTranslate2 replicas (parallel
    ``transcribe`` calls from several threads), ``cpu_threads`` threads each."""
    from faster_whisper import WhisperModel

    from voxgate.engines.asr._model_files import resolve_model_dir

    return WhisperModel(
        str(resolve_model_dir("base")),
        device="cpu",
        compute_type="int8",
        num_workers=num_workers,
        cpu_threads=cpu_threads,
    )


@dataclass
class BaselineTrial:
    num_workers: int
    cpu_threads: int
    burst_wall_s: float  # best of the rounds: the clips transcribed at once, a thread each
    burst_ups: float
    lone_p50_s: float  # each clip transcribed alone
    lone_p95_s: float
    loadavg: float


def _transcribe(model: Any, audio: FloatArray, beam_size: int) -> str:
    segments, _info = model.transcribe(audio, language="en", beam_size=beam_size)
    return " ".join(seg.text.strip() for seg in segments)  # segments are lazy: this decodes


def pick_baseline(
    clips: Sequence[Clip],
    settings: Sequence[tuple[int, int]],
    beam_size: int,
    n_items: int = 8,
    n_lone: int = 4,
    rounds: int = 2,
) -> tuple[Any, tuple[int, int], list[BaselineTrial]]:
    """Measure each (num_workers, cpu_threads) on one burst and alone; keep the best model.

    A burst is ``n_items`` clips transcribed at once, a thread each; "alone" is the first
    ``n_lone`` of them one after the other. Best = the higher burst throughput (what a loaded
    baseline is limited by); within 5 %, the lower lone-clip p50 latency. Rounds are
    interleaved across the settings (one round when there is only one candidate).
    """
    if len(settings) == 1:
        rounds = 1
    step = max(1, len(clips) // n_items)
    picked = [clips[i] for i in range(0, len(clips), step)][:n_items]
    models = {s: _baseline_model(*s) for s in settings}
    for m in models.values():
        _transcribe(m, clips[0].audio, beam_size)  # warm-up
    bursts: dict[tuple[int, int], list[float]] = {s: [] for s in settings}
    lone: dict[tuple[int, int], list[float]] = {s: [] for s in settings}
    loads: dict[tuple[int, int], list[float]] = {s: [] for s in settings}
    for _ in range(rounds):
        for setting, model in models.items():
            loads[setting].append(os.getloadavg()[0])
            for c in picked[:n_lone]:
                t = time.perf_counter()
                _transcribe(model, c.audio, beam_size)
                lone[setting].append(time.perf_counter() - t)
            threads = [
                threading.Thread(target=_transcribe, args=(model, c.audio, beam_size))
                for c in picked
            ]
            t = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            bursts[setting].append(time.perf_counter() - t)
    trials = [
        BaselineTrial(
            s[0],
            s[1],
            min(bursts[s]),
            len(picked) / min(bursts[s]),
            median(lone[s]),
            percentile(lone[s], 95),
            float(np.mean(loads[s])),
        )
        for s in settings
    ]
    top = max(t.burst_ups for t in trials)
    best = min(
        (t for t in trials if t.burst_ups >= 0.95 * top), key=lambda t: round(t.lone_p50_s, 2)
    )
    chosen = (best.num_workers, best.cpu_threads)
    model = models[chosen]
    models.clear()  # the other candidates' weights are freed
    return model, chosen, trials


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
            u.hypothesis = _transcribe(model, audios[s.clip], beam_size)
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
    from voxgate.engines.asr._whisper import WhisperEngine
    from voxgate.engines.asr.base import AsrOptions, AsrRequest
    from voxgate.engines.asr.config import WhisperConfig
    from voxgate.gateway.scheduling import Batcher, BatchPlan, BatchPolicy, choose_plan
    from voxgate.gateway.testing.signals import stats_for

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
# Capacity search: doubling then bisection per side and budget, probes interleaved
# ------------------------------------------------------------------------------------------------

#: Every probe made, per (side, K); repeated probes of one K are pooled (see :func:`pool`).
Cache = dict[tuple[str, int], list[StepResult]]


def _fmt_s(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return "inf" if math.isinf(x) else f"{x:.2f}"


def _fmt_budget(b: float) -> str:
    return f"{b:g} s"


@dataclass
class Pooled:
    """Every utterance of every probe of one (side, K), as one sample."""

    side: str
    k: int
    probes: list[int]
    offered: int
    done: int
    p50_s: float
    p95_s: float
    wer: float
    server_p50_ms: float | None
    server_p95_ms: float | None
    loadavg: float  # mean 1-min load average at the probes' starts
    other_cpu_cores: float | None  # mean over the probes (see StepResult.other_cpu_cores)


def pool(results: Sequence[StepResult]) -> Pooled:
    utts = [u for r in results for u in r.utterances]
    lat = [u.latency_s for u in utts]
    srv = [
        float(u.server_latency_ms)
        for u in utts
        if u.server_latency_ms is not None and math.isfinite(u.latency_s)
    ]
    return Pooled(
        side=results[0].side,
        k=results[0].k,
        probes=[r.probe for r in results],
        offered=len(utts),
        done=sum(math.isfinite(x) for x in lat),
        p50_s=percentile(lat, 50),
        p95_s=percentile(lat, 95),
        wer=corpus_wer([u.reference for u in utts], [u.hypothesis for u in utts]),
        server_p50_ms=percentile(srv, 50) if srv else None,
        server_p95_ms=percentile(srv, 95) if srv else None,
        loadavg=float(np.mean([r.loadavg_before[0] for r in results])),
        other_cpu_cores=(
            float(np.mean(others))
            if (others := [r.other_cpu_cores for r in results if r.other_cpu_cores is not None])
            else None
        ),
    )


@dataclass
class Search:
    """Largest K with p95 <= ``budget_s`` for one side.

    K doubles from ``start`` while probes pass, then bisects between the largest passing K
    (``good``; 0 = none yet) and the smallest failing K (``bad``) until they are adjacent.
    The state is always rebuilt from the probes made so far (:func:`resolve`), so a search at
    a looser budget replays the probes a stricter one made, and a repeated probe that changes
    a pooled p95 steers the search from then on.
    """

    side: str
    budget_s: float
    start: int
    max_k: int
    good: int = 0
    bad: int | None = None

    def next_k(self) -> int | None:
        """The next K to probe, or None when the search is over."""
        if self.bad is None:
            if self.good >= self.max_k:
                return None
            return min(self.max_k, self.start if self.good == 0 else 2 * self.good)
        if self.bad - self.good <= 1:
            return None
        return (self.good + self.bad) // 2

    def record(self, k: int, p95_s: float) -> bool:
        ok = p95_s <= self.budget_s
        if ok:
            self.good = max(self.good, k)
        else:
            self.bad = k if self.bad is None else min(self.bad, k)
        return ok

    @property
    def done(self) -> bool:
        return self.next_k() is None

    def describe(self) -> str:
        if self.done:
            return str(self.good)
        upper = f"< {self.bad}" if self.bad is not None else "(not bounded yet)"
        return f"{self.good} (search cut: {self.good} <= K {upper})"


def resolve(spec: Search, cache: Cache) -> tuple[Search, int | None]:
    """``spec``'s search replayed over the pooled probes; and the K it needs next, if any."""
    s = Search(spec.side, spec.budget_s, spec.start, spec.max_k)
    k = s.next_k()
    while k is not None and (s.side, k) in cache:
        s.record(k, pool(cache[(s.side, k)]).p95_s)
        k = s.next_k()
    return s, k


def _filler_k(specs: Sequence[Search], cache: Cache) -> int | None:
    """A repeat for a side whose searches are over: its boundary K with the fewest probes."""
    s, _ = resolve(specs[-1], cache)
    candidates = [k for k in (s.good, s.bad) if k]
    if not candidates:
        return None
    return min(candidates, key=lambda k: (len(cache.get((s.side, k), [])), k))


def interleave(
    searches: dict[str, list[Search]],
    probe: Any,
    cache: Cache,
    *,
    deadline: float,
    on_round: Any = None,
    fill: bool = True,
) -> bool:
    """Alternate probes between the sides until every search is over; False if cut by time.

    On each side's turn its first unfinished search probes one K. A side whose searches are
    over, while the other's are not, repeats a probe at its own boundary instead (``fill``), so
    that the two sides keep alternating under the same machine load and its boundary K gets
    more samples. ``on_round(searches)`` runs before every round and may append searches (the
    looser budgets).
    """
    walls: dict[str, list[float]] = {side: [] for side in searches}
    while True:
        before = sum(len(v) for v in searches.values())
        if on_round is not None:
            on_round(searches)
        wants = {
            side: next((k for s in specs if (k := resolve(s, cache)[1]) is not None), None)
            for side, specs in searches.items()
        }
        if all(k is None for k in wants.values()):
            if sum(len(v) for v in searches.values()) == before:
                return True
            continue
        for side, wanted in wants.items():
            k = wanted
            if k is None:
                others = [v for other, v in wants.items() if other != side]
                if not (fill and any(v is not None for v in others)):
                    continue
                k = _filler_k(searches[side], cache)
                if k is None:
                    continue
            expected = median(walls[side]) if walls[side] else 0.0
            if time.monotonic() + expected > deadline:
                return False
            result: StepResult = probe(side, k)
            walls[side].append(result.wall_s)
            cache.setdefault((side, k), []).append(result)


def widen(
    searches: dict[str, list[Search]],
    cache: Cache,
    budgets: list[float],
    loose: Sequence[float],
    starts: dict[str, int],
    max_k: int,
) -> bool:
    """If the baseline's last search ended holding no call, add the next looser budget.

    Appends that budget to ``budgets`` and one search at it per side; True if it did.
    """
    if "baseline" not in searches or len(budgets) > len(loose):
        return False
    last, _ = resolve(searches["baseline"][-1], cache)
    if not (last.done and last.good == 0):
        return False
    b = loose[len(budgets) - 1]
    budgets.append(b)
    print(
        f"  baseline holds no call at {_fmt_budget(last.budget_s)}: searching {_fmt_budget(b)} too",
        flush=True,
    )
    for side, side_searches in searches.items():
        side_searches.append(Search(side, b, starts[side], max_k))
    return True


def _probe_line(r: StepResult) -> str:
    return (
        f"  #{r.probe:<2d} {r.side:8s} K={r.k:3d}: p50 {_fmt_s(r.p50_s)} s  "
        f"p95 {_fmt_s(r.p95_s)} s  done {r.done}/{r.offered}  WER {100 * r.wer:5.2f}%  "
        f"{r.throughput_ups:.3f} utt/s  load {r.loadavg_before[0]:.2f}->{r.loadavg_after[0]:.2f}"
        + (f"  server {r.server_cpu_cores:.2f} cores" if r.server_cpu_cores is not None else "")
        + (f"  callers {r.client_cpu_cores:.2f} cores" if r.client_cpu_cores is not None else "")
        + (f"  send late <= {r.client_late_ms:.0f} ms" if r.client_late_ms is not None else "")
        + (f"  others {r.other_cpu_cores:.2f} cores" if r.other_cpu_cores is not None else "")
        + f"  seed {r.seed}  ({r.wall_s:.0f} s)"
    )


def print_table(
    cache: Cache,
    budgets: Sequence[float],
    sides: Sequence[str],
    served: dict[str, dict[str, Any]] | None = None,
) -> None:
    """One row per probed K: both sides' pooled p50/p95/done/WER and the budgets p95 met.

    ``served`` (:func:`describe_side` per gateway side) heads the table with each side's model
    and encoder buckets, so a table is never read without knowing what each column served.
    """
    print()
    for side, d in (served or {}).items():
        print(f"{side}: model {d['model']}, encoder buckets {d['buckets']}")
    ok_head = "/".join(f"<={b:g}s" for b in budgets)
    head = ["K"]
    for side in sides:
        head += [f"{side} p50 s", f"{side} p95 s", "done", "WER %", f"p95 {ok_head}"]
        if side in GATEWAY_SIDES:
            head.append("server p50/p95 ms")
        head += ["probes", "others cores"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---:|" * len(head))
    for k in sorted({k for _, k in cache}):
        cells = [str(k)]
        for side in sides:
            if (side, k) not in cache:
                cells += ["-"] * (8 if side in GATEWAY_SIDES else 7)
                continue
            p = pool(cache[(side, k)])
            cells += [
                _fmt_s(p.p50_s),
                _fmt_s(p.p95_s),
                f"{p.done}/{p.offered}",
                f"{100 * p.wer:.2f}",
                "/".join("yes" if p.p95_s <= b else "no" for b in budgets),
            ]
            if side in GATEWAY_SIDES:
                cells.append(
                    f"{p.server_p50_ms:.0f}/{p.server_p95_ms:.0f}"
                    if p.server_p50_ms is not None and p.server_p95_ms is not None
                    else "-"
                )
            others = "-" if p.other_cpu_cores is None else f"{p.other_cpu_cores:.2f}"
            cells += ["+".join(f"#{n}" for n in p.probes), others]
        print("| " + " | ".join(cells) + " |")
    print(
        "(latency: final received - clip's last sample sent (gateway, VAD hangover included) or "
        "transcribe end - clip end (baseline); a missing final is inf; repeated probes of one K "
        "(fresh clip schedules) are pooled; nearest-rank percentiles; others cores: CPU that "
        "other users of the machine took during the probes)"
    )


def _busy_cpu_s() -> float:
    """Busy CPU seconds of the machine's cores since boot (the gateway's own reading)."""
    from voxgate.gateway.neighbours import proc_busy_s  # noqa: PLC0415

    return proc_busy_s() or 0.0


def _own_cpu_s(servers: Sequence[ServerProcess]) -> float:
    """CPU seconds of this process and of the gateway servers."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime + sum(s.cpu_seconds() for s in servers)


def _git_head() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return head + (" (working tree has uncommitted changes)" if dirty else "")


def _asr_side(model: str | None, buckets: str) -> dict[str, Any]:
    """The ``asr`` overrides of one gateway side's model and encoder windows."""
    asr: dict[str, Any] = {}
    if model is not None:
        asr["model"] = model
    if ENCODER_BUCKETS[buckets]:
        asr["encoder"] = dict(ENCODER_BUCKETS[buckets])
    return asr


def gateway_overrides(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each gateway side's server config overrides, from the command line.

    ``gateway`` takes ``--model``/``--encoder-buckets`` and the plan flags; ``join`` is
    ``gateway`` plus :data:`JOIN_OVERRIDES`; ``alt`` (only when ``--alt-model`` or
    ``--alt-encoder-buckets`` is given) is ``gateway``'s plan with its own model and windows, so
    two models or window policies are compared under the same load, probe by probe.
    """
    batcher = {
        k: v
        for k, v in (("workers", args.workers), ("max_batch_size", args.max_batch))
        if v is not None
    }
    plan = {
        k: v
        for k, v in (("inter_threads", args.inter_threads), ("intra_threads", args.intra_threads))
        if v is not None
    }

    def side(asr: dict[str, Any], extra: dict[str, Any] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if batcher:
            out["batcher"] = dict(batcher)
        if plan or asr:
            out["asr"] = {**plan, **asr}
        for key, more in (extra or {}).items():
            out[key] = {**out.get(key, {}), **more}
        return out

    main_asr = _asr_side(args.model, args.encoder_buckets)
    sides: dict[str, dict[str, Any]] = {}
    if not args.skip_gateway:
        sides["gateway"] = side(main_asr)
    if args.join:
        sides["join"] = side(main_asr, JOIN_OVERRIDES)
    if args.alt_model is not None or args.alt_encoder_buckets is not None:
        sides["alt"] = side(_asr_side(args.alt_model, args.alt_encoder_buckets or "served"))
    return sides


def describe_side(overrides: dict[str, Any]) -> dict[str, Any]:
    """What a gateway side serves, for the header and the JSON: model and encoder buckets."""
    asr = overrides.get("asr", {})
    enc = EncoderWindowConfig(**asr.get("encoder", {}))
    b = enc.buckets_s
    steps = {round(y - x, 6) for x, y in zip(b, b[1:], strict=False)}
    if len(b) > 4 and len(steps) == 1:
        buckets = f"{b[0]:g}..{b[-1]:g} s every {steps.pop():g} s"
    else:
        buckets = "/".join(f"{x:g}" for x in b) + " s"
    return {
        "model": asr.get("model", "base"),
        "buckets": f"{buckets}, margin {enc.margin_ms} ms",
        "buckets_s": list(b),
        "margin_ms": enc.margin_ms,
    }


def _parse_threads(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        workers, threads = part.lower().split("x")
        out.append((int(workers), int(threads)))
    return out


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--duration", type=float, default=40.0, help="seconds of offered load per K")
    ap.add_argument("--budget", type=float, default=1.0, help="p95 latency budget, s")
    ap.add_argument(
        "--loose-budgets",
        default="2,3",
        help="budgets (s) searched in turn while the baseline holds no call ('' = none)",
    )
    ap.add_argument("--beam", type=int, default=1, help="beam size of both sides (gateway: 1)")
    ap.add_argument("--gateway-start", type=int, default=1, help="first K probed (gateway)")
    ap.add_argument("--baseline-start", type=int, default=1, help="first K probed (baseline)")
    ap.add_argument("--max-k", type=int, default=64, help="largest K ever probed")
    ap.add_argument("--max-minutes", type=float, default=25.0, help="stop searching after this")
    ap.add_argument("--drain", type=float, default=10.0, help="extra time for a backlog, s")
    ap.add_argument(
        "--no-fill",
        dest="fill",
        action="store_false",
        help="no repeat probes for a side whose search is over while the other's runs",
    )
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument(
        "--end-silence-ms", type=int, default=600, help="VAD hangover the callers ask for"
    )
    ap.add_argument(
        "--baseline-threads",
        default="2x1,1x2",
        help="WhisperModel num_workers x cpu_threads candidates; the best is used",
    )
    ap.add_argument("--speech-dir", type=Path, default=SPEECH, help="clips + manifest.jsonl")
    ap.add_argument("--tune", action="store_true", help="measure the CPU plan first")
    ap.add_argument("--tune-only", action="store_true", help="only measure the CPU plan")
    ap.add_argument("--tune-rounds", type=int, default=3, help="interleaved tuning rounds")
    ap.add_argument("--quick", action="store_true", help="30 s per K, tuning in 2 rounds")
    ap.add_argument("--skip-gateway", action="store_true")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument(
        "--join",
        action="store_true",
        help="add the 'join' side: a gateway with the decode loop and batcher.join_running",
    )
    ap.add_argument("--workers", type=int, help="server batcher.workers (default: server's)")
    ap.add_argument("--max-batch", type=int, help="server batcher.max_batch_size")
    ap.add_argument("--inter-threads", type=int, help="server asr.inter_threads")
    ap.add_argument("--intra-threads", type=int, help="server asr.intra_threads")
    ap.add_argument(
        "--model", help="server asr.model of the gateway side: a name or a model directory"
    )
    ap.add_argument(
        "--encoder-buckets",
        choices=tuple(ENCODER_BUCKETS),
        default="served",
        help="gateway side's encoder windows: served (the server's default buckets) or "
        "utterance (1..30 s every second, 0.5 s margin: for a model trained on them)",
    )
    ap.add_argument(
        "--alt-model",
        help="add the 'alt' side: a second gateway server on this model (a name or directory)",
    )
    ap.add_argument(
        "--alt-encoder-buckets",
        choices=tuple(ENCODER_BUCKETS),
        help="the 'alt' side's encoder windows (adds the side; default: served)",
    )
    ap.add_argument("--out", type=Path, help="write every number as JSON here")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.quick and args.duration == 40.0:
        args.duration = 30.0
    rounds = 2 if args.quick else args.tune_rounds
    loose = [float(x) for x in args.loose_budgets.split(",") if x.strip()]
    started = time.monotonic()
    deadline = started + 60 * args.max_minutes

    command = shlex.join([sys.executable, "-m", "benchmarks.asr_capacity", *sys.argv[1:]])
    print(f"command: {command}", flush=True)
    print(f"commit: {_git_head()}", flush=True)
    clips = load_clips(args.speech_dir)
    print(
        f"{len(clips)} clips, {sum(c.duration_s for c in clips):.0f} s; 16 kHz LINEAR16, "
        f"{CHUNK_MS} ms chunks, real time; {args.duration:.0f} s per probe; beam {args.beam} on "
        f"both sides; budget {args.budget:g} s (loose: {loose}); "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()}",
        flush=True,
    )
    report: dict[str, Any] = {
        "command": command,
        "commit": _git_head(),
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

    sides = [
        side
        for side, skip in (
            ("gateway", args.skip_gateway),
            ("join", not args.join),
            ("alt", args.alt_model is None and args.alt_encoder_buckets is None),
            ("baseline", args.skip_baseline),
        )
        if not skip
    ]
    servers: dict[str, ServerProcess] = {}
    model: Any = None
    cache: Cache = {}
    searches: dict[str, list[Search]] = {}
    budgets = [args.budget]
    complete = False
    try:
        if "baseline" in sides:
            candidates = _parse_threads(args.baseline_threads)
            print(
                f"baseline settings (num_workers x cpu_threads): {candidates}; "
                "8 clips at once from 8 threads and 4 of them alone, 2 interleaved rounds",
                flush=True,
            )
            model, chosen_threads, trials = pick_baseline(clips, candidates, args.beam)
            print(
                "| num_workers | cpu_threads | burst wall s | burst utt/s | lone p50 s "
                "| lone p95 s | load1 |"
            )
            print("|---:|---:|---:|---:|---:|---:|---:|")
            for t in trials:
                print(
                    f"| {t.num_workers} | {t.cpu_threads} | {t.burst_wall_s:.2f} | "
                    f"{t.burst_ups:.3f} | {t.lone_p50_s:.2f} | {t.lone_p95_s:.2f} | "
                    f"{t.loadavg:.2f} |"
                )
            print(
                f"baseline: faster-whisper WhisperModel(base, cpu, int8, num_workers="
                f"{chosen_threads[0]}, cpu_threads={chosen_threads[1]}), thread per call, "
                f"transcribe(language='en', beam_size={args.beam})",
                flush=True,
            )
            report["baseline_settings"] = [asdict(t) for t in trials]
            report["baseline_chosen"] = {
                "num_workers": chosen_threads[0],
                "cpu_threads": chosen_threads[1],
            }
        if any(side in GATEWAY_SIDES for side in sides):
            all_overrides = gateway_overrides(args)
            report["sides"] = {}
            for side in (s for s in sides if s in GATEWAY_SIDES):
                side_overrides = all_overrides[side]
                served = describe_side(side_overrides)
                report["sides"][side] = served
                print(f"{side}: model {served['model']}, buckets {served['buckets']}", flush=True)
                log_path = (
                    Path(tempfile.gettempdir()) / f"voxgate-capacity-{side}-{os.getpid()}.log"
                )
                # The loop is NumPy: one BLAS thread per worker is its measured best (docs).
                env = {"OPENBLAS_NUM_THREADS": "1"} if side == "join" else {}
                server = ServerProcess(side_overrides, log_path, env)
                servers[side] = server
                asyncio.run(_warm_gateway(server.target, clips[0]))
                plan = server.plan_line()
                print(f"{side}: {server.target}, {plan}, overrides {side_overrides}", flush=True)
                report[f"{side}_plan"] = plan
                report[f"{side}_overrides"] = side_overrides

        count = 0

        def probe(side: str, k: int) -> StepResult:
            nonlocal count
            count += 1
            # The n-th probe of a K gets the n-th schedule: both sides' first probes of a K get
            # the same workload; repeats sample other clips.
            seed = args.seed + 1000 * len(cache.get((side, k), []))
            t = time.monotonic()
            own = list(servers.values())
            busy0, own0 = _busy_cpu_s(), _own_cpu_s(own)
            if side in GATEWAY_SIDES:
                server = servers[side]
                r = asyncio.run(
                    _gateway_step(
                        side,
                        server,
                        clips,
                        k,
                        args.duration,
                        seed,
                        args.end_silence_ms,
                        args.drain,
                        args.beam,
                    )
                )
                server.wait_idle()  # its backlog must not load the next (baseline) probe
            else:
                r = _baseline_step(model, clips, k, args.duration, seed, args.drain, args.beam)
            wall = time.monotonic() - t
            others = (_busy_cpu_s() - busy0) - (_own_cpu_s(own) - own0)
            r.other_cpu_cores = max(0.0, others) / max(1e-9, wall)
            if r.offered == 0:
                sys.exit(f"--duration {args.duration:g} s is too short for any clip to fit")
            r.probe, r.seed, r.wall_s = count, seed, wall
            print(_probe_line(r), flush=True)
            return r

        starts = {
            "gateway": args.gateway_start,
            "join": args.gateway_start,
            "alt": args.gateway_start,
            "baseline": args.baseline_start,
        }
        searches.update(
            {side: [Search(side, args.budget, starts[side], args.max_k)] for side in sides}
        )
        print(
            "probes (gateway and baseline alternate; each K: doubling, then bisection; a side "
            + ("whose search is over repeats its boundary K meanwhile):" if args.fill else "):"),
            flush=True,
        )
        complete = interleave(
            searches,
            probe,
            cache,
            deadline=deadline,
            on_round=lambda current: widen(current, cache, budgets, loose, starts, args.max_k),
            fill=args.fill,
        )
    finally:
        for server in servers.values():
            server.stop()

    print_table(cache, budgets, sides, report.get("sides"))
    elapsed_min = (time.monotonic() - started) / 60
    n_probes = sum(len(v) for v in cache.values())
    print(
        f"\n{n_probes} probes in {elapsed_min:.1f} min"
        + ("" if complete else f" (cut at --max-minutes {args.max_minutes:g})")
    )
    summary: dict[str, Any] = {"complete": complete, "budgets": {}}
    for i, b in enumerate(budgets):
        held = {side: resolve(searches[side][i], cache)[0] for side in sides}
        line = ", ".join(f"{side} {s.describe()}" for side, s in held.items())
        entry: dict[str, Any] = {
            side: {"k": s.good, "first_failing_k": s.bad, "done": s.done}
            for side, s in held.items()
        }
        print(f"largest K with p95 <= {_fmt_budget(b)}: {line}")
        if "gateway" in held and "join" in held:
            g, j = held["gateway"], held["join"]
            jtext = f"{j.good / g.good:.2f}x ({j.good} / {g.good})" if g.good else "undefined"
            entry["join_ratio_text"] = jtext
            print(f"  join / gateway capacity at {_fmt_budget(b)}: {jtext}")
        if "gateway" in held and "alt" in held:
            g, a = held["gateway"], held["alt"]
            atext = f"{a.good / g.good:.2f}x ({a.good} / {g.good})" if g.good else "undefined"
            entry["alt_ratio_text"] = atext
            print(f"  alt / gateway capacity at {_fmt_budget(b)}: {atext}")
        if "gateway" in held and "baseline" in held:
            g, bl = held["gateway"], held["baseline"]
            if bl.good == 0:
                bl_p95 = pool(cache[("baseline", bl.bad)]).p95_s if bl.bad is not None else math.nan
                ratio = (
                    f"undefined: the baseline holds 0 calls (its p95 at K={bl.bad} is "
                    f"{_fmt_s(bl_p95)} s)"
                )
            else:
                ratio = f"{g.good / bl.good:.2f}x ({g.good} / {bl.good})"
                entry["ratio"] = g.good / bl.good
            entry["ratio_text"] = ratio
            print(f"  capacity ratio at {_fmt_budget(b)}: {ratio}")
        summary["budgets"][str(b)] = entry
    probes = sorted((r for rs in cache.values() for r in rs), key=lambda r: r.probe)
    report["probes"] = [asdict(r) for r in probes]
    report["pooled"] = [asdict(pool(rs)) for _, rs in sorted(cache.items())]
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
