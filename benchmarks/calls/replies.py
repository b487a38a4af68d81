"""Concurrent paced replies through ``Converse``: late chunks, gaps and first audio per N.

A real gateway with the default configuration (``voxgate.gateway.config`` defaults: admission and
the degradation ladder on, the bundled Piper voice and Whisper base, the default echo canceller)
serves on a loopback port, in this process. N callers run in a child process (so that they
share neither the gateway's event loop nor its GIL, as remote callers would not), each a
``Converse`` call through the client library (``voxgate_client``, 16 kHz LINEAR16 both ways,
20 ms chunks paced on an absolute clock, audio flowing all the time), and each gets one
distinct reply of about 11 s (four sentences, none a phrase-cache hit). What the callers send
(``--caller``):

* ``turn`` (the default): a question, one clip of the shared speech set (2.5-6 s), then
  silence while it listens; every caller's clip ends at the same moment (plus ``--stagger-ms``
  per caller) and the bot answers each turn: the Speak goes out when that turn's final
  arrives (or ``FINAL_WAIT_S`` after its end if none does, counted);
* ``talk``: clips of the speech set with short pauses all the time, the Speak after
  ``--lead-in-s`` (the caller talks through the reply);
* ``silence``: digital silence; ``none``: no audio at all; the Speak after ``--lead-in-s``
  (plus ``--stagger-ms`` per caller).

Barge-in is off on these calls, so that a caller's speech is load (VAD, echo canceller,
recognition), never an interruption.

Per reply, a client-side player starts at its first ``AudioOut`` frame and plays in real time
(``benchmarks.tts_concurrency.play``, the player every TTS benchmark counts with): a frame is
*late* when it arrives after the audio before it has played out; the player then waits
(starvation) and resumes from its arrival. ``late@60`` counts the same for a player that
starts 60 ms after the first frame arrives (the jitter buffer the gateway's playout model
assumes, ``session.playout_lead_ms``). Also the largest gap between two frames of a reply,
first audio (``Speak`` written -> first frame read) p50/p95 over the calls (nearest rank,
``benchmarks._stats``), how far apart the turns' Speaks went out, and how many cores other
processes used meanwhile (the machine is shared: read a row beside that column).

``--baseline DIR`` serves an older checkout too (its own code, in its own process, and this
checkout's in another, the same way), and runs every N on both, alternating which goes first.

    .venv/bin/python -m benchmarks.calls.replies                 # N = 1, 2, 4, 8
    .venv/bin/python -m benchmarks.calls.replies --ns 8 --caller none
    .venv/bin/python -m benchmarks.calls.replies --ns 8,8 --baseline /tmp/voxgate-before
    .venv/bin/python -m benchmarks.calls.replies --tiny          # seconds: the test's run

Run it alone on the machine (under the shared lock): other work on the cores is what it
measures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any

from benchmarks._stats import median, percentile
from benchmarks.tts_concurrency import play, player_waits

REPO = Path(__file__).resolve().parents[2]
#: Default caller audio: ../shared/data/speech beside the checkout (``--speech-dir``).
SPEECH = REPO.parent / "shared" / "data" / "speech"

#: Caller audio and reply audio: the client library's default call format.
RATE_HZ = 16_000
CHUNK_MS = 20

#: Reply texts of about 11 s each with the bundled voice: four sentences, every one carrying the
#: call's own order number, so that no sentence of any call or run is a phrase-cache hit.
_PLACES = ("Leeds", "Denver", "Porto", "Osaka", "Lyon", "Austin", "Turin", "Dublin", "Perth")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")


def reply_text(run: int, call: int, *, short: bool = False) -> str:
    """A distinct reply (about 11 s; about 2 s when ``short``) for ``call`` of ``run``."""
    k = run * 97 + call
    order = 100 + k
    first = f"Order {order} has shipped from {_PLACES[k % len(_PLACES)]}."
    if short:
        return first
    return (
        f"{first} Parcel {order} should arrive on {_DAYS[k % len(_DAYS)]} afternoon. "
        f"The driver for order {order} will call you first. "
        f"Is there anything else I can do for order {order}?"
    )


@dataclass
class CallResult:
    """What one caller's player experienced (times in ms; ``error`` empty when it worked)."""

    first_audio_ms: float = math.inf
    late: int = 0
    late_buffered: int = 0
    #: Where in the reply each late frame fell (ms of its audio): at its start, the first
    #: steps' race; later, the steady state.
    late_at_ms: list[int] = field(default_factory=list)
    starved_ms: float = 0.0
    max_gap_ms: float = 0.0
    audio_s: float = 0.0
    frames: int = 0
    no_final: bool = False
    turn_to_speak_ms: float = 0.0
    error: str = ""


@dataclass
class Row:
    """One N: every call's result and the summary the table prints."""

    n: int
    calls: list[CallResult] = field(default_factory=list)
    others_cores: float = 0.0

    def summary(self) -> dict[str, float]:
        ok = [c for c in self.calls if not c.error]
        firsts = [c.first_audio_ms for c in self.calls]  # a failed call counts as inf
        return {
            "n": self.n,
            "failed": len(self.calls) - len(ok),
            "no_final": sum(c.no_final for c in self.calls),
            "late": sum(c.late for c in ok),
            "late_max": max((c.late for c in ok), default=0),
            "late_buffered": sum(c.late_buffered for c in ok),
            "late_at_ms": sorted(ms for c in ok for ms in c.late_at_ms),
            "starved_ms": sum(c.starved_ms for c in ok),
            "max_gap_ms": max((c.max_gap_ms for c in ok), default=0.0),
            "first_p50_ms": median(firsts),
            "first_p95_ms": percentile(firsts, 95),
            "audio_s": median([c.audio_s for c in ok]) if ok else 0.0,
            "speak_spread_ms": max(c.turn_to_speak_ms for c in self.calls)
            - min(c.turn_to_speak_ms for c in self.calls),
            "others_cores": self.others_cores,
        }


# --- the callers (child process) ----------------------------------------------------------------


#: Turn clips: the shared set's clips of 2.5-6 s (a caller's question), in file order.
TURN_CLIP_S = (2.5, 6.0)


def _clips(
    speech_dir: Path, lo_s: float = 0.0, hi_s: float = math.inf
) -> list[tuple[bytes, float]]:
    """The speech set's 16 kHz clips of ``lo_s``-``hi_s`` seconds: LINEAR16 bytes, and where
    the speech ends in it (s; its last 20 ms frame above -40 dBFS, not the file's trailing
    silence)."""
    import numpy as np  # noqa: PLC0415

    from voxgate_client import read_wav  # noqa: PLC0415

    out = []
    frame = RATE_HZ * CHUNK_MS // 1000
    for path in sorted(speech_dir.glob("*.wav")):
        pcm, rate = read_wav(path)
        if rate != RATE_HZ or not lo_s <= len(pcm) / RATE_HZ <= hi_s:
            continue
        frames = pcm[: len(pcm) // frame * frame].astype(np.float64).reshape(-1, frame) / 32768
        loud = np.flatnonzero(np.sqrt((frames**2).mean(axis=1)) > 10 ** (-40 / 20))
        end_s = (int(loud[-1]) + 1) * CHUNK_MS / 1000 if len(loud) else len(pcm) / RATE_HZ
        out.append((pcm.astype("<i2").tobytes(), end_s))
    if not out:
        sys.exit(f"no caller audio found (looked for {speech_dir}/*.wav; or pass --caller none)")
    return out


@dataclass(frozen=True)
class Plan:
    """One caller's audio and when it speaks its reply (seconds from the callers' start).

    ``speak_at_s`` is when the Speak goes out, except in ``turn`` mode: there the bot answers
    the caller's turn, so the Speak goes out when the final of the clip ending at
    ``turn_end_s`` arrives (or ``FINAL_WAIT_S`` after it if none does).
    """

    track: bytes
    speak_at_s: float
    turn_end_s: float = -1.0


#: The second player's jitter buffer: ``session.playout_lead_ms``'s default.
JITTER_BUFFER_S = 0.06

#: A turn's reply goes out without its final after this long (counted in ``no_final``).
FINAL_WAIT_S = 4.0


def plan_callers(
    caller: str, speech_dir: Path, n: int, lead_in_s: float, stagger_s: float, reply_s: float
) -> list[Plan]:
    """Each caller's track and reply time for ``caller`` mode (see the module docstring)."""
    zeros = bytes(2 * int(RATE_HZ * (lead_in_s + n * stagger_s + reply_s)))
    if caller == "none":
        return [Plan(b"", lead_in_s + i * stagger_s) for i in range(n)]
    if caller == "silence":
        return [Plan(zeros, lead_in_s + i * stagger_s) for i in range(n)]
    if caller == "talk":
        clips = _clips(speech_dir)
        plans = []
        for i in range(n):
            parts, have, k = [], 0, 7 * i
            while have < len(zeros):
                pause = bytes(2 * int(RATE_HZ * (0.6 + 0.1 * (k % 5))))
                parts += [clips[k % len(clips)][0], pause]
                have += len(parts[-2]) + len(pause)
                k += 1
            plans.append(Plan(b"".join(parts)[: len(zeros)], lead_in_s + i * stagger_s))
        return plans
    # turn: every caller's clip ends together (plus the stagger): N questions at once.
    clips = _clips(speech_dir, *TURN_CLIP_S)
    mine = [clips[(5 * i) % len(clips)] for i in range(n)]
    longest_s = max(speech_s for _, speech_s in mine)
    plans = []
    for i, (clip, speech_s) in enumerate(mine):
        end_s = lead_in_s + longest_s + i * stagger_s
        pre = bytes(2 * round(RATE_HZ * (end_s - speech_s)))
        track = pre + clip + zeros
        plans.append(Plan(track, end_s + FINAL_WAIT_S, turn_end_s=end_s))
    return plans


async def _one_call(
    target: str, call: int, text: str, plan: Plan, go: asyncio.Barrier
) -> CallResult:
    from voxgate_client import (  # noqa: PLC0415
        AudioOut,
        CallConfig,
        CallEndedError,
        ErrorEvent,
        PlaybackFinished,
        Transcript,
        VoxgateClient,
        VoxgateError,
        WireAudio,
        stream_audio,
    )

    result = CallResult()
    async with VoxgateClient(target) as client:
        try:
            # Barge-in off: the caller's speech is load here, not an interruption.
            conv = await client.converse(CallConfig(barge_in=False, call_id=f"replies-{call}"))
        except VoxgateError as exc:
            result.error = f"refused: {exc.code.name}"
            await go.wait()
            return result
        await go.wait()  # every call is open: the callers' clocks start together
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        caller = asyncio.create_task(
            stream_audio(conv, WireAudio(plan.track, "linear16", RATE_HZ), chunk_ms=CHUNK_MS)
        )
        speak_id = f"r{call}"
        sent = math.inf
        arrivals: list[tuple[float, int]] = []

        async def speak() -> None:
            nonlocal sent
            sent = loop.time()
            await conv.speak(text, speak_id=speak_id)

        timer = loop.call_at(t0 + plan.speak_at_s, lambda: asyncio.ensure_future(speak()))
        finished = False
        try:
            async for event in conv:
                if isinstance(event, Transcript) and event.is_final and math.isinf(sent):
                    if plan.turn_end_s >= 0 and event.received_s >= t0 + plan.turn_end_s:
                        timer.cancel()  # the bot answers the caller's turn
                        await speak()
                elif isinstance(event, AudioOut) and event.speak_id == speak_id:
                    arrivals.append((event.received_s, len(event.data) // 2))
                elif isinstance(event, PlaybackFinished) and event.speak_id == speak_id:
                    finished = True
                    break
                elif isinstance(event, ErrorEvent) and event.scope == "speak":
                    result.error = f"speak failed: {event.message}"
                    break
            if not finished and not result.error:
                why = await conv.error() or "the call ended"
                result.error = f"ended after {len(arrivals)} frames ({why})"
        except (VoxgateError, CallEndedError) as exc:
            result.error = f"call failed: {exc}"
        finally:
            timer.cancel()
            caller.cancel()
            await asyncio.wait({caller})
            with contextlib.suppress(VoxgateError, CallEndedError):
                await conv.hangup()
            await conv.aclose()
    if plan.turn_end_s >= 0:
        result.no_final = sent >= t0 + plan.speak_at_s
        result.turn_to_speak_ms = 1000 * (sent - t0 - plan.turn_end_s)
    if arrivals:
        late, starved, played = play(arrivals, RATE_HZ)
        times = [t for t, _ in arrivals]
        # The gateway's own playout model: the far end starts playout_lead_ms after the first
        # frame arrives (a jitter buffer), docs/barge-in.md.
        held = [(times[0] + JITTER_BUFFER_S, arrivals[0][1]), *arrivals[1:]]
        result.late_buffered = play(held, RATE_HZ)[0]
        result.first_audio_ms = 1000 * (times[0] - sent)
        result.late = late
        starts = accumulate((n for _, n in arrivals[:-1]), initial=0)
        waits = player_waits(arrivals, RATE_HZ)
        result.late_at_ms = [
            at * 1000 // RATE_HZ for at, w in zip(starts, waits, strict=True) if w > 0.0
        ]
        result.starved_ms = 1000 * starved
        gaps = (b - a for a, b in zip(times, times[1:], strict=False))
        result.max_gap_ms = 1000 * max(gaps, default=0.0)
        result.audio_s = played / RATE_HZ
        result.frames = len(arrivals)
    return result


async def _callers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    n = int(spec["n"])
    plans = plan_callers(
        spec["caller"],
        Path(spec["speech_dir"]),
        n,
        float(spec["lead_in_s"]),
        float(spec["stagger_s"]),
        reply_s=4.0 if spec["short"] else 16.0,
    )
    go = asyncio.Barrier(n)
    texts = [reply_text(int(spec["run"]), i, short=bool(spec["short"])) for i in range(n)]
    results = await asyncio.gather(
        *(_one_call(spec["target"], i, texts[i], plans[i], go) for i in range(n))
    )
    return [asdict(r) for r in results]


def _client_main(spec_json: str) -> None:
    """The child process: run the callers of one N and print their results as JSON."""
    out = asyncio.run(_callers(json.loads(spec_json)))
    print(json.dumps(out), flush=True)


# --- the server (this process) ------------------------------------------------------------------


async def run_client_process(module: str, spec: dict[str, Any]) -> bytes:
    """Run ``python -m module --client-spec JSON`` (the callers, apart from the gateway's
    process, so that they do not share its event loop) and return what it printed."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        module,
        "--client-spec",
        json.dumps(spec),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
    )
    stdout, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the client process failed (exit status {proc.returncode})")
    return stdout


async def _run_callers(spec: dict[str, Any], server_pid: int) -> tuple[list[CallResult], float]:
    """One N's callers in a child process; their results, and the cores that processes other
    than the gateway (``server_pid``) and the callers used meanwhile (the machine is shared)."""
    busy0, wall0 = _machine_busy_s(), time.monotonic()
    server0, child0 = _process_cpu_s(server_pid), _children_cpu_s()
    mine0 = _process_cpu_s(os.getpid()) if server_pid != os.getpid() else 0.0
    stdout = await run_client_process("benchmarks.calls.replies", spec)
    ours = _process_cpu_s(server_pid) - server0 + _children_cpu_s() - child0
    if server_pid != os.getpid():
        ours += _process_cpu_s(os.getpid()) - mine0
    others = max(0.0, (_machine_busy_s() - busy0 - ours) / (time.monotonic() - wall0))
    results = [CallResult(**r) for r in json.loads(stdout.decode().strip().splitlines()[-1])]
    return results, others


def _machine_busy_s() -> float:
    """CPU seconds the machine's cores have been busy (the gateway's own reading), 0 elsewhere."""
    from voxgate.gateway.neighbours import proc_busy_s  # noqa: PLC0415

    return proc_busy_s() or 0.0


def _process_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid`` so far (user + system, all threads)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu_s() -> float:
    t = os.times()
    return t.children_user + t.children_system


def server_config(overrides: dict[str, Any] | None = None) -> Any:
    """The default configuration on a free loopback port (plus ``overrides``)."""
    from voxgate.gateway.config import load_config  # noqa: PLC0415

    return load_config(None, _on_loopback(overrides))


def _on_loopback(overrides: dict[str, Any] | None) -> dict[str, Any]:
    server = {"host": "127.0.0.1", "port": 0, "grace_s": 1.0}
    over = dict(overrides or {})
    return {**over, "server": {**over.get("server", {}), **server}}


@contextlib.asynccontextmanager
async def in_process(overrides: dict[str, Any] | None = None) -> AsyncIterator[tuple[str, int]]:
    """A gateway of this checkout in this process; yields its target and process id."""
    from voxgate.gateway.runtime import build_hub  # noqa: PLC0415
    from voxgate.gateway.testing.server import running_server  # noqa: PLC0415

    cfg = server_config(overrides)
    async with running_server(hub=build_hub(cfg), config=cfg) as srv:
        yield srv.target, os.getpid()


#: Serves a checkout's gateway (its own code) on a free loopback port: prints the target,
#: stops when its stdin closes. Only APIs every version has: load_config, build_hub,
#: GatewayServer, under the names of that checkout (``voxgate.gateway`` once the namespace
#: links sit in protos/voxgate/, ``gateway`` before); it refuses to serve a gateway imported
#: from anywhere but the checkout (the installed one would pass for the older version).
_SERVE = """
import asyncio, importlib, json, os, sys
prefix = "voxgate.gateway." if os.path.isdir("protos/voxgate/gateway") else "gateway."
config, runtime, server_mod = (
    importlib.import_module(prefix + name) for name in ("config", "runtime", "server")
)
if not os.path.realpath(config.__file__).startswith(os.path.realpath(os.getcwd()) + os.sep):
    sys.exit(f"the gateway came from {config.__file__}, not from the checkout {os.getcwd()}")
load_config, build_hub = config.load_config, runtime.build_hub
GatewayServer = server_mod.GatewayServer

async def main():
    cfg = load_config(None, json.loads(sys.argv[1]))
    server = GatewayServer(cfg, build_hub(cfg))
    await server.start()
    print("target", server.target, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.stop(grace_s=0.0)

asyncio.run(main())
"""


@contextlib.asynccontextmanager
async def checkout_server(
    checkout: Path, overrides: dict[str, Any] | None = None
) -> AsyncIterator[tuple[str, int]]:
    """A gateway of ``checkout``'s code (an older version) in its own process; yields its
    target and process id."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXGATE_")}
    env["PYTHONPATH"] = os.pathsep.join([str(checkout), str(checkout / "protos")])
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _SERVE,
        json.dumps(_on_loopback(overrides)),
        cwd=checkout,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        line = b""
        while not line.startswith(b"target "):
            line = await proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the gateway of {checkout} did not start")
        yield line.decode().split()[1], proc.pid
    finally:
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def measure(
    ns: Sequence[int],
    *,
    caller: str = "turn",
    speech_dir: Path = SPEECH,
    short: bool = False,
    lead_in_s: float = 1.0,
    stagger_s: float = 0.0,
    pause_s: float = 2.0,
    overrides: dict[str, Any] | None = None,
    baseline: Path | None = None,
) -> dict[str, list[Row]]:
    """Run each N against a default gateway of this checkout (in this process), and, with
    ``baseline``, against one of that checkout too, alternating which goes first per N; each
    gateway is warmed with one short reply first. Returns the rows per gateway label."""
    servers: dict[str, contextlib.AbstractAsyncContextManager[tuple[str, int]]] = {}
    if baseline is not None:
        # Both in their own process, so that neither shares the benchmark's.
        servers["this"] = checkout_server(REPO, overrides)
        servers["baseline"] = checkout_server(baseline, overrides)
    else:
        servers[""] = in_process(overrides)
    rows: dict[str, list[Row]] = {label: [] for label in servers}
    async with contextlib.AsyncExitStack() as stack:
        specs, pids = {}, {}
        for label, server in servers.items():
            target, pids[label] = await stack.enter_async_context(server)
            specs[label] = {
                "target": target,
                "caller": caller,
                "speech_dir": str(speech_dir),
                "lead_in_s": lead_in_s,
                "stagger_s": stagger_s,
            }
            warm = {**specs[label], "n": 1, "run": 999, "short": True}
            await _run_callers(warm, pids[label])  # dropped
        for run, n in enumerate(ns):
            labels = list(specs)
            for label in labels[run % len(labels) :] + labels[: run % len(labels)]:
                await asyncio.sleep(pause_s)
                spec = {**specs[label], "n": n, "run": run, "short": short}
                calls, others = await _run_callers(spec, pids[label])
                row = Row(n, calls, others)
                rows[label].append(row)
                _print_row(label, row)
                _print_notes(row)
    return rows


def _print_notes(row: Row) -> None:
    if any(c.no_final for c in row.calls):
        print(f"  {sum(c.no_final for c in row.calls)} turn(s) had no final", flush=True)
    for err in sorted({c.error for c in row.calls if c.error}):
        print(f"  {sum(c.error == err for c in row.calls)} x {err}", flush=True)


def parse_sets(items: Sequence[str]) -> dict[str, Any]:
    """``["session.tts_threads=3"]`` → ``{"session": {"tts_threads": 3}}``."""
    import yaml  # noqa: PLC0415

    out: dict[str, Any] = {}
    for item in items:
        path, _, value = item.partition("=")
        *sections, key = path.split(".")
        node = out
        for section in sections:
            node = node.setdefault(section, {})
        node[key] = yaml.safe_load(value)
    return out


#: The table: (heading, summary key, format).
COLUMNS = (
    ("N", "n", "{:>3}"),
    ("failed", "failed", "{:>7}"),
    ("late", "late", "{:>6}"),
    ("late@60", "late_buffered", "{:>8}"),
    ("late/call", "late_max", "{:>10}"),
    ("starved ms", "starved_ms", "{:>11.0f}"),
    ("max gap ms", "max_gap_ms", "{:>11.0f}"),
    ("first p50", "first_p50_ms", "{:>10.0f}"),
    ("first p95", "first_p95_ms", "{:>10.0f}"),
    ("reply s", "audio_s", "{:>8.1f}"),
    ("speaks spread ms", "speak_spread_ms", "{:>17.0f}"),
    ("others", "others_cores", "{:>7.2f}"),
)


def _print_header() -> None:
    heads = [fmt.replace(".0f", "").replace(".1f", "").replace(".2f", "") for _, _, fmt in COLUMNS]
    print(f"{'':<9}" + "".join(f.format(h) for f, (h, _, _) in zip(heads, COLUMNS, strict=True)))


def _print_row(label: str, row: Row) -> None:
    s = row.summary()
    print(f"{label:<9}" + "".join(fmt.format(s[key]) for _, key, fmt in COLUMNS), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", default="1,2,4,8", help="concurrent calls per row")
    parser.add_argument(
        "--caller",
        choices=("turn", "talk", "silence", "none"),
        default="turn",
        help="turn: one clip, the reply answers its final; talk: speech throughout; "
        "silence; none: no audio at all",
    )
    parser.add_argument("--no-caller", action="store_true", help="the same as --caller none")
    parser.add_argument(
        "--stagger-ms", type=float, default=0.0, help="between the calls' Speaks (0: together)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="a server setting off its default (YAML value), e.g. session.tts_threads=3",
    )
    parser.add_argument("--speech-dir", type=Path, default=SPEECH)
    parser.add_argument("--lead-in-s", type=float, default=1.0, help="caller audio before Speak")
    parser.add_argument(
        "--tiny", action="store_true", help="N = 1, 2 with short replies (seconds; the test)"
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="also serve this checkout (an older version) and run every N on both, alternating",
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--client-spec", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client_spec:
        _client_main(args.client_spec)
        return
    ns = [1, 2] if args.tiny else [int(x) for x in args.ns.split(",")]
    caller = "none" if args.no_caller else args.caller
    overrides = parse_sets(args.set)
    print(
        f"callers send {caller}; Speaks {args.stagger_ms:g} ms apart; "
        f"settings off default: {overrides or 'none'}; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    _print_header()
    t0 = time.perf_counter()
    rows = asyncio.run(
        measure(
            ns,
            caller=caller,
            speech_dir=args.speech_dir,
            short=args.tiny,
            lead_in_s=0.5 if args.tiny else 1.0,
            stagger_s=args.stagger_ms / 1000.0,
            overrides=overrides,
            baseline=args.baseline,
        )
    )
    print(f"({time.perf_counter() - t0:.0f} s)")
    if args.json:
        out = {label: [r.summary() for r in got] for label, got in rows.items()}
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
