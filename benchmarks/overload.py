"""Overload: ramp real-time callers to 2x capacity, with admission by measured load and without.

One gateway process at a time (``python -m voxgate.cli serve --engines asr``, its default config, as
in ``benchmarks/asr_capacity.py``); N = ``--overload`` x ``--capacity`` simulated callers on
loopback each stream real clips from the shared speech set in real time (16 kHz LINEAR16, 20 ms
chunks on an absolute clock, seeded 1-3 s pauses between clips, the same workload helpers as
asr_capacity). Caller i starts at ``i x ramp / N``, so the offered load climbs from 1 caller to
N over ``--ramp`` seconds, then holds at N for ``--hold`` seconds; every admitted caller talks
until the end. A refused caller is counted and gone (behind a balancer it would have gone to
another replica).

Side by side in one run, the same workload (same seed) against:

* ``admission``: the default server: admission from measured load (``gateway/admission.py``)
  and the degradation ladder (``gateway/degrade.py``);
* ``static``: what the gateway did before: admission off (only the static
  ``max_concurrent_calls``, 200) and no degradation.

``--rounds 2`` runs them as A B B A, so that drift in the machine's load hits both.

Per mode and phase of the ramp (offered <= capacity, between, and the hold at N), it prints
calls admitted and refused, utterances, and of the *admitted* calls' utterances: p50/p95 of the
server's end of speech -> final (``latency_ms``, what admission and the budget measure: no VAD
hangover) and p95 of the client's clip end -> final received (which includes most of the
600 ms hangover), and finals missing at the end; then per mode the degradation steps taken and
restored (from the server log). A missing final counts as an infinite latency. Percentiles are
nearest rank (``benchmarks/_stats.py``).

    .venv/bin/python -m benchmarks.overload
    .venv/bin/python -m benchmarks.overload --capacity 8 --rounds 2 --out overload.json
    .venv/bin/python -m benchmarks.overload --tiny      # seconds: the test's smoke run

Capacity: by default (``--capacity 0``) it is measured first, in the same run, on a server
without admission: the most callers, all starting at once, whose server p95 end of speech ->
final stays within ``--budget`` (1 s), found by doubling K from 2 and one bisection (30 s per
probe). It is measured each run because it moves with the CPU that other work leaves free. The
goal is that the admitted calls' p95 stays within the 1 s budget at 2x that load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import shlex
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._stats import percentile
from benchmarks.asr_capacity import (
    CHUNK_MS,
    CHUNK_SAMPLES,
    RATE_HZ,
    SPEECH,
    Clip,
    ServerProcess,
    Slot,
    _Final,
    _git_head,
    _warm_gateway,
    caller_audio,
    load_clips,
    schedule,
)

#: admission.window_s of the server's default config.
WINDOW_S = 10.0

#: Server overrides per mode.
MODES: dict[str, dict[str, Any]] = {
    "admission": {},
    "static": {"admission": {"enabled": False}, "degrade": {"enabled": False}},
}


@dataclass
class Utt:
    """One clip of an admitted caller: when it ended, what came back."""

    caller: int
    end_at: float  # loop seconds when the chunk holding the clip's last sample was sent
    offered: int  # callers started by then
    latency_s: float = math.inf  # final received - end_at
    server_ms: float = math.inf  # the final's latency_ms (inf: no final)


@dataclass
class CallerResult:
    caller: int
    start_s: float
    admitted: bool
    refusal: str = ""
    errors: int = 0
    utts: list[Utt] = field(default_factory=list)


def offered_at(starts: Sequence[float], t: float) -> int:
    """Callers whose start time is at or before ``t``."""
    return sum(1 for s in starts if s <= t)


def phase_of(offered: int, capacity: int, n: int) -> str:
    """``<=1x`` up to capacity, ``2x`` once all N have started, ``1-2x`` between."""
    if offered <= capacity:
        return "<=1x"
    return "2x" if offered >= n else "1-2x"


def refusal_reason(message: str) -> str:
    """The admission reason named in a refusal's text."""
    for key, reason in (
        ("end of speech -> final", "latency"),
        ("queue wait", "queue_wait"),
        ("holds about", "engine_capacity"),
        ("max_concurrent_calls", "max_concurrent_calls"),
    ):
        if key in message:
            return reason
    return "other"


@dataclass
class PhaseRow:
    mode: str
    phase: str
    offered: str
    admitted: int
    refused: int
    utterances: int
    server_p50_ms: float
    server_p95_ms: float
    client_p95_s: float
    missing: int


def summarise(
    mode: str, results: Sequence[CallerResult], starts: Sequence[float], capacity: int
) -> list[PhaseRow]:
    """One row per phase of the ramp (callers by their start, utterances by their end)."""
    n = len(starts)
    rows = []
    for phase in ("<=1x", "1-2x", "2x"):
        callers = [
            r for r in results if phase_of(offered_at(starts, r.start_s), capacity, n) == phase
        ]
        utts = [u for r in results for u in r.utts if phase_of(u.offered, capacity, n) == phase]
        counts = [offered_at(starts, r.start_s) for r in callers]
        offered = f"{min(counts)}-{max(counts)}" if counts else "-"
        if phase == "2x":
            offered = str(n)
        srv = [u.server_ms for u in utts]
        rows.append(
            PhaseRow(
                mode=mode,
                phase=phase,
                offered=offered,
                admitted=sum(r.admitted for r in callers),
                refused=sum(not r.admitted for r in callers),
                utterances=len(utts),
                server_p50_ms=percentile(srv, 50) if srv else math.nan,
                server_p95_ms=percentile(srv, 95) if srv else math.nan,
                client_p95_s=percentile([u.latency_s for u in utts], 95) if utts else math.nan,
                missing=sum(1 for u in utts if not math.isfinite(u.latency_s)),
            )
        )
    return rows


_DEGRADE = re.compile(r"degrade: (shed|restore) (\w+)")


def degrade_steps(log_text: str) -> Counter[str]:
    """``shed`` / ``restore`` moves and their steps, from the server's log lines."""
    moves: Counter[str] = Counter()
    for direction, step in _DEGRADE.findall(log_text):
        moves[direction] += 1
        moves[f"{direction}:{step}"] += 1
    return moves


# ------------------------------------------------------------------------------------------------
# Callers
# ------------------------------------------------------------------------------------------------


async def _caller(
    client: Any,
    clips: Sequence[Clip],
    slots: list[Slot],
    caller: int,
    start_at: float,
    starts_abs: Sequence[float],
    drain_deadline: float,
) -> CallerResult:
    from voxgate_client import CallConfig, ErrorEvent, Transcript, VoxgateError

    loop = asyncio.get_running_loop()
    if (delay := start_at - loop.time()) > 0:
        await asyncio.sleep(delay)
    result = CallerResult(caller, start_at, admitted=True)
    cfg = CallConfig(
        encoding="linear16",
        sample_rate_hz=RATE_HZ,
        language="en",
        barge_in=False,
        call_id=f"overload-{caller}",
    )
    try:
        call = await client.converse(cfg)
    except VoxgateError as exc:
        result.admitted = False
        result.refusal = refusal_reason(str(exc))
        return result
    audio = caller_audio(clips, slots).astype("<i2").tobytes()
    n_chunks = len(audio) // (2 * CHUNK_SAMPLES)
    last_chunk = {(s.start_sample + len(clips[s.clip].pcm) - 1) // CHUNK_SAMPLES: s for s in slots}
    sent_end: dict[int, float] = {}
    finals: list[_Final] = []

    async def read() -> None:
        async for ev in call:
            if isinstance(ev, Transcript) and ev.is_final:
                finals.append(_Final(ev.received_s, ev.start_ms, ev.end_ms, ev.text, ev.latency_ms))
            elif isinstance(ev, ErrorEvent):
                result.errors += 1

    reader = asyncio.create_task(read())
    t0 = loop.time()
    try:
        for n in range(n_chunks):
            due = t0 + (n + 1) * CHUNK_MS / 1000
            if (delay := due - loop.time()) > 0:
                await asyncio.sleep(delay)
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
    for s in slots:
        end_at = sent_end.get(s.start_sample, math.nan)
        if math.isnan(end_at):
            continue
        u = Utt(caller, end_at, offered_at(starts_abs, end_at))
        # The last final overlapping the clip (the VAD may split a clip).
        lo, hi = 1000 * s.start_s, 1000 * s.end_s
        mine = [f for f in finals if min(f.end_ms, hi) - max(f.start_ms, lo) > 0]
        if mine:
            last = max(mine, key=lambda f: f.received_s)
            u.latency_s = last.received_s - end_at
            u.server_ms = float(last.latency_ms)
        result.utts.append(u)
    return result


async def run_mode(
    server: ServerProcess,
    clips: Sequence[Clip],
    n: int,
    ramp_s: float,
    hold_s: float,
    seed: int,
    drain_s: float,
) -> tuple[list[CallerResult], list[float]]:
    from voxgate_client import VoxgateClient

    loop = asyncio.get_running_loop()
    total_s = ramp_s + hold_s
    offsets = [i * ramp_s / n for i in range(n)]
    async with VoxgateClient(server.target) as client:
        t0 = loop.time() + 0.5
        starts = [t0 + o for o in offsets]
        drain_deadline = t0 + total_s + drain_s
        slots = [schedule(clips, i, total_s - offsets[i], seed) for i in range(n)]
        results = await asyncio.gather(
            *(
                _caller(client, clips, slots[i], i, starts[i], starts, drain_deadline)
                for i in range(n)
            )
        )
    # Start times relative to t0 for the report.
    for r in results:
        r.start_s = r.start_s - t0
        for u in r.utts:
            u.end_at -= t0
    return list(results), offsets


def measure_capacity(
    clips: Sequence[Clip], budget_s: float, probe_s: float, seed: int
) -> tuple[int, list[dict[str, Any]]]:
    """The most callers (all starting at once) whose server p95 end of speech -> final is within
    ``budget_s``, on a server without admission: K doubles from 2 while probes pass, then one
    bisection between the last pass and the first failure (to within 1 when that gap is 2).

    Measured in the same run because the machine's spare CPU, and so the capacity, changes.
    """
    log_path = Path(tempfile.gettempdir()) / "voxgate-overload-capacity.log"
    server = ServerProcess(MODES["static"], log_path)
    probes: list[dict[str, Any]] = []

    def probe(k: int) -> bool:
        results, _ = asyncio.run(run_mode(server, clips, k, 0.0, probe_s, seed, 10.0))
        srv = [u.server_ms for r in results for u in r.utts]
        p95 = percentile(srv, 95) if srv else math.inf
        ok = p95 <= 1000.0 * budget_s
        probes.append({"k": k, "server_p95_ms": p95, "utterances": len(srv), "ok": ok})
        print(
            f"capacity probe: {k} callers, server p95 {_ms(p95)} ms, {len(srv)} utterances, "
            f"{'within' if ok else 'over'} {budget_s:g} s",
            flush=True,
        )
        server.wait_idle()
        return ok

    try:
        asyncio.run(_warm_gateway(server.target, clips[0]))
        server.wait_idle()
        good, k = 0, 2
        while probe(k):
            good, k = k, 2 * k
        bad = k
        if good == 0:  # not even 2: is one caller within the budget?
            good = 1 if probe(1) else 0
        elif bad - good > 2:
            mid = (good + bad) // 2
            if probe(mid):
                good = mid
    finally:
        server.stop()
    if good == 0:
        print("capacity probe: not even one caller within the budget; ramping to 2", flush=True)
    return max(1, good), probes


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------


def _ms(x: float) -> str:
    return "inf" if math.isinf(x) else "-" if math.isnan(x) else f"{x:.0f}"


def _s(x: float) -> str:
    return "inf" if math.isinf(x) else "-" if math.isnan(x) else f"{x:.2f}"


def print_table(rows: Sequence[PhaseRow], steps: dict[str, Counter[str]]) -> None:
    print()
    print(
        f"{'mode':<10} {'phase':<5} {'offered':>8} {'admitted':>8} {'refused':>7} {'utts':>5} "
        f"{'srv p50 ms':>10} {'srv p95 ms':>10} {'client p95 s':>12} {'missing':>7}"
    )
    for r in rows:
        print(
            f"{r.mode:<10} {r.phase:<5} {r.offered:>8} {r.admitted:>8} {r.refused:>7} "
            f"{r.utterances:>5} {_ms(r.server_p50_ms):>10} {_ms(r.server_p95_ms):>10} "
            f"{_s(r.client_p95_s):>12} {r.missing:>7}"
        )
    print()
    for mode, moves in steps.items():
        taken = ", ".join(
            f"{k.split(':')[1]} x{v}" for k, v in moves.items() if k.startswith("shed:")
        )
        back = ", ".join(
            f"{k.split(':')[1]} x{v}" for k, v in moves.items() if k.startswith("restore:")
        )
        print(
            f"{mode}: degradation steps taken {moves['shed']} ({taken or 'none'}), "
            f"restored {moves['restore']} ({back or 'none'})"
        )


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--capacity",
        type=int,
        default=0,
        help="the replica's capacity in callers; 0 = measure it first (see measure_capacity)",
    )
    ap.add_argument("--budget", type=float, default=1.0, help="p95 budget for --capacity 0, s")
    ap.add_argument("--probe", type=float, default=30.0, help="seconds per capacity probe")
    ap.add_argument("--overload", type=float, default=2.0, help="peak offered load x capacity")
    ap.add_argument("--ramp", type=float, default=60.0, help="seconds to reach the peak")
    ap.add_argument("--hold", type=float, default=30.0, help="seconds held at the peak")
    ap.add_argument("--drain", type=float, default=10.0, help="extra time for finals, s")
    ap.add_argument("--rounds", type=int, default=1, help="1: A B; 2: A B B A")
    ap.add_argument("--modes", default="admission,static", help="which modes, in order")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--speech-dir", type=Path, default=SPEECH, help="clips + manifest.jsonl")
    ap.add_argument("--tiny", action="store_true", help="a seconds-long smoke run (tests)")
    ap.add_argument("--out", type=Path, help="write every number as JSON here")
    args = ap.parse_args(argv)
    if args.tiny:
        args.capacity, args.ramp, args.hold, args.drain = 1, 2.0, 4.0, 5.0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            sys.exit(f"unknown mode {m!r}; use {', '.join(MODES)}")
    order = modes if args.rounds == 1 else modes + modes[::-1]
    command = shlex.join([sys.executable, "-m", "benchmarks.overload", *(argv or sys.argv[1:])])
    print(f"command: {command}", flush=True)
    print(f"commit: {_git_head()}", flush=True)
    clips = load_clips(args.speech_dir)
    if args.tiny:
        clips = sorted(clips, key=lambda c: c.duration_s)[:3]
    report: dict[str, Any] = {"command": command, "commit": _git_head(), "runs": []}
    if args.capacity <= 0:
        args.capacity, probes = measure_capacity(clips, args.budget, args.probe, args.seed)
        report["capacity_probes"] = probes
    n = max(args.capacity + 1, round(args.overload * args.capacity))
    print(
        f"{len(clips)} clips; capacity {args.capacity}, ramp to {n} callers over "
        f"{args.ramp:g} s, hold {args.hold:g} s; modes {' '.join(order)}; "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()}",
        flush=True,
    )
    rows: list[PhaseRow] = []
    steps: dict[str, Counter[str]] = {}
    for i, mode in enumerate(order):
        label = mode if order.count(mode) == 1 else f"{mode}{order[: i + 1].count(mode)}"
        log_path = Path(tempfile.gettempdir()) / f"voxgate-overload-{label}.log"
        server = ServerProcess(MODES[mode], log_path)
        try:
            asyncio.run(_warm_gateway(server.target, clips[0]))
            server.wait_idle()
            if not args.tiny:
                # The warm-up's final must leave admission's window (admission.window_s).
                time.sleep(WINDOW_S + 1.0)
            t = time.monotonic()
            results, starts = asyncio.run(
                run_mode(server, clips, n, args.ramp, args.hold, args.seed, args.drain)
            )
            wall = time.monotonic() - t
        finally:
            server.stop()
        moves = degrade_steps(log_path.read_text())
        mode_rows = summarise(label, results, starts, args.capacity)
        refused = Counter(r.refusal for r in results if not r.admitted)
        print(
            f"{label}: {sum(r.admitted for r in results)} admitted, "
            f"{sum(not r.admitted for r in results)} refused {dict(refused)}, "
            f"{sum(r.errors for r in results)} error events, {wall:.0f} s",
            flush=True,
        )
        rows += mode_rows
        steps[label] = moves
        report["runs"].append(
            {
                "mode": label,
                "rows": [asdict(r) for r in mode_rows],
                "refusals": dict(refused),
                "degrade": dict(moves),
                "callers": [
                    {
                        "caller": r.caller,
                        "start_s": r.start_s,
                        "admitted": r.admitted,
                        "refusal": r.refusal,
                        "errors": r.errors,
                        "utts": [asdict(u) for u in r.utts],
                    }
                    for r in results
                ],
            }
        )
    print_table(rows, steps)
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
