"""The synthesis scheduling policy on a virtual clock: many replies, no model, in seconds.

Run::

    .venv/bin/python -m benchmarks.tts_schedule_sim                 # the policy table
    .venv/bin/python -m benchmarks.tts_schedule_sim --others 0.5,1  # with other load
    .venv/bin/python -m benchmarks.tts_schedule_sim --tiny          # what the test runs

Why: a real probe of 8 four-sentence replies takes a quarter of a minute and, on a shared
machine, its figures move with whatever else runs. The scheduler's outcome is decided by the
policy (:func:`voxgate.gateway.scheduling.synthesis_policy.next_work`, the real one, called
here exactly as ``voxgate.gateway.scheduling.synthesis`` calls it) and by what each step
costs, so this replays the driver's
bookkeeping (workers, the first-audio lane, two steps in flight per reply, a reply's first front
end fused with its first window, playout clocks, lateness) against a cost model measured on
the bundled voice (``--calibrate`` measures it here), on cores shared by processor sharing
with ``--others`` cores of other load. It finds which policy can meet the goals at all on
this many cores, before the real voice proves it (``benchmarks/tts_concurrency.py``).

It is a model: ONNX Runtime's real cost varies per call, threads on a loaded machine are not
shared fairly, and Python's own work between steps is ignored. Read its figures as which
policy wins and by how much, never as the gateway's measured latency.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._stats import median, percentile  # noqa: E402
from benchmarks.tts_concurrency import Stream, previous_policy  # noqa: E402
from voxgate.engines.tts import window_bounds  # noqa: E402
from voxgate.gateway.scheduling import WaitUntil  # noqa: E402
from voxgate.gateway.scheduling.synthesis_policy import (  # noqa: E402
    CostModel,
    Dispatch,
    SynthItem,
    SynthPolicy,
    next_work,
)

HOP = 256
RATE = 22050


@dataclass(frozen=True)
class TrueCost:
    """What steps really cost on one free core (seconds).

    Defaults: the bundled voice on this 2-core machine (``--calibrate``, fastest of 7 runs per
    size, measured while other processes used about one core, rounded): a decoder call costs
    4.4 ms plus 1.1 ms per input frame, a front end 7 ms plus 0.15 ms per frame of its unit.
    """

    fixed_s: float = 0.0044
    per_frame_s: float = 0.0011
    front_fixed_s: float = 0.007
    front_per_frame_s: float = 0.00015

    def window(self, input_frames: int) -> float:
        return self.fixed_s + self.per_frame_s * input_frames

    def front(self, unit_frames: int) -> float:
        return self.front_fixed_s + self.front_per_frame_s * unit_frames


#: Unit lengths (latent frames, noise off) of ``benchmarks/tts_concurrency.py``'s replies
#: 0-15 of probe 0: the first clause or sentence, the next sentences, "Reference N."
ONE_SENTENCE = (
    (46, 149, 81), (79, 91, 78), (128, 67, 87), (251, 108, 91), (177, 90), (240, 84),
    (167, 83), (229, 83), (216, 84), (218, 82), (235, 85), (165, 90), (225, 92), (190, 97),
    (213, 103), (156, 104),
)  # fmt: skip
FOUR_SENTENCES = (
    (46, 149, 176, 193, 369, 81), (177, 240, 167, 229, 78), (216, 218, 235, 165, 87),
    (225, 190, 213, 156, 91), (228, 203, 176, 193, 90), (251, 108, 177, 240, 167, 84),
    (229, 216, 218, 235, 83), (165, 225, 190, 213, 83), (156, 228, 203, 176, 84),
    (128, 67, 369, 177, 240, 82), (167, 229, 216, 218, 85), (235, 165, 225, 190, 90),
    (213, 156, 228, 203, 92), (79, 91, 193, 369, 177, 97), (240, 167, 229, 216, 103),
    (218, 235, 165, 225, 104),
)  # fmt: skip


@dataclass(eq=False)
class _Reply:
    key: int
    arrival: float
    units: tuple[int, ...]
    next_unit: int = 0
    total: int = 0  # frames of the unit being planned, 0 when none
    unit_start: int = 0
    position: int = 0
    planned: int = 0  # samples
    origin: float | None = None
    first_eta: float = 0.0
    first_frames: int = 0
    inflight: int = 0
    front_running: bool = False
    pending: dict[int, int] = field(default_factory=dict)
    next_offset: int = 0
    stream: Stream = field(default_factory=Stream)
    late: int = 0

    @property
    def planned_all(self) -> bool:
        return self.total == 0 and self.next_unit >= len(self.units)

    @property
    def needs_front(self) -> bool:
        return self.total == 0 and self.next_unit < len(self.units)

    @property
    def finished(self) -> bool:
        return self.planned_all and not self.inflight and not self.front_running

    def eligible(self, max_inflight: int, alone_first: bool = False) -> bool:
        return not (
            self.planned_all
            or self.front_running
            or self.inflight >= max_inflight
            or (alone_first and self.origin is None and self.inflight > 0)
        )

    def upcoming(self, guard_s: float) -> float | None:
        if self.planned_all:
            return None
        if self.front_running and self.origin is None and self.planned == 0:
            return self.first_eta + self.first_frames * HOP / RATE - guard_s
        return self.item(guard_s).deadline

    def item(self, guard_s: float) -> SynthItem:
        if self.origin is not None:
            deadline: float | None = self.origin + self.planned / RATE - guard_s
        elif self.planned == 0:
            deadline = None
        else:
            deadline = self.first_eta + self.planned / RATE - guard_s
        return SynthItem(
            self.key,
            self.arrival,
            deadline,
            "front" if self.needs_front else "window",
            self.position,
            self.total,
            self.inflight,
        )

    def run_front(self) -> int:
        frames = self.units[self.next_unit]
        self.next_unit += 1
        self.total, self.position, self.unit_start = frames, 0, self.planned
        return frames

    def plan(self, frames: int, policy: SynthPolicy, pad_to: int = 0) -> tuple[int, int, int]:
        """(offset, samples, input frames) of the next window."""
        start, stop, lo, hi = window_bounds(
            self.position,
            frames,
            self.total,
            policy.context_frames,
            min_tail=policy.first_window_frames // 2,
            pad_to=pad_to,
        )
        offset = self.unit_start + start * HOP
        self.position = stop
        self.planned += (stop - start) * HOP
        if stop >= self.total:
            self.total = 0
        return offset, (stop - start) * HOP, hi - lo


@dataclass(eq=False)
class _Task:
    replies: list[_Reply]
    urgent: bool
    phases: list[tuple[str, float, object]]  # (kind, work left in core-seconds, payload)
    started: float
    windows: list[tuple[_Reply, int, int]] = field(default_factory=list)  # offset, samples
    frames: int = 0
    front: bool = False


@dataclass
class Result:
    """One simulated probe."""

    streams: list[dict[str, float]]
    dispatches: int

    @property
    def late(self) -> int:
        return int(sum(s["late"] for s in self.streams))


def simulate(
    policy: SynthPolicy,
    *,
    n: int,
    units: Sequence[int] | Sequence[Sequence[int]],
    stagger_s: float = 0.1,
    cores: int = 2,
    workers: int = 2,
    others: float = 0.0,
    true: TrueCost | None = None,
    max_inflight: int = 2,
    urgent_lane: bool = True,
    guard_s: float = 0.025,
    trace: list[str] | None = None,
) -> Result:
    """Replay the gateway's driver for ``n`` replies of ``units`` starting ``stagger_s`` apart."""
    true = true or TrueCost()
    cost = CostModel()
    arrivals = [i * stagger_s for i in range(n)]
    replies = [_Reply(i, t, _units_of(units, i)) for i, t in enumerate(arrivals)]
    waiting = list(replies)
    active: dict[int, _Reply] = {}
    running: list[_Task] = []
    idle, urgent_idle = workers, urgent_lane
    now, wake_at, dispatches = 0.0, math.inf, 0
    ctx = policy.context_frames

    def start(decision: Dispatch, urgent: bool) -> None:
        nonlocal idle, urgent_idle, dispatches
        dispatches += 1
        rs = [active[w.key] for w in decision.work]
        task = _Task(rs, urgent, [], now)
        for w, r in zip(decision.work, rs, strict=True):
            r.inflight += 1
            if w.kind == "front":
                r.front_running = True
                task.front = True
                task.phases.append(("front", true.front(r.units[r.next_unit]), w.frames))
                if r.origin is None and r.planned == 0:
                    r.first_frames = w.frames or policy.first_window_frames
                    r.first_eta = now + cost.front_s + cost.window_s(r.first_frames + ctx)
                continue
            if r.origin is None and r.planned == 0:
                r.first_eta = now + cost.window_s(w.frames + ctx)
            offset, samples, frames = r.plan(w.frames, policy, w.pad_to)
            task.windows.append((r, offset, samples))
            task.frames += frames
        if task.frames:
            task.phases.append(("decode", true.window(task.frames), None))
        if urgent:
            urgent_idle = False
        else:
            idle -= 1
        running.append(task)
        if trace is not None:
            deadline = rs[0].item(guard_s).deadline
            slack = "-" if deadline is None else f"{1000 * (deadline - now):.0f} ms"
            trace.append(
                f"{now * 1000:8.1f} start {'U' if urgent else 'W'} "
                + " ".join(f"r{w.key}:{w.kind}:{w.frames}" for w in decision.work)
                + f" slack {slack}"
            )

    def phase_done(task: _Task) -> None:
        kind, _, payload = task.phases.pop(0)
        if kind == "front":
            (r,) = task.replies
            fresh = r.origin is None and r.planned == 0
            r.run_front()
            cost.observe_front(now - task.started)
            if fresh and r.total:
                first = int(payload) if payload else policy.first_window_frames  # type: ignore[call-overload]
                offset, samples, frames = r.plan(first, policy)
                task.windows.append((r, offset, samples))
                task.frames = frames
                task.phases.append(("decode", true.window(frames), None))
                r.front_running = False
                r.first_eta = now + cost.window_s(first + ctx)
                task.started = now
                return
        elif task.frames:
            cost.observe_window(task.frames, now - task.started)

    def finish(task: _Task) -> None:
        nonlocal idle, urgent_idle
        running.remove(task)
        if task.urgent:
            urgent_idle = True
        else:
            idle += 1
        for r in task.replies:
            r.inflight -= 1
            if task.front:
                r.front_running = False
        for r, offset, samples in task.windows:
            r.pending[offset] = samples
            while r.next_offset in r.pending:
                size = r.pending.pop(r.next_offset)
                deliver(r, r.next_offset, size)
                r.next_offset += size
        for r in task.replies:
            if r.finished and not r.pending:
                active.pop(r.key, None)

    def deliver(r: _Reply, offset: int, samples: int) -> None:
        r.stream.arrivals.append((now - r.arrival, samples))
        if r.origin is None:
            r.origin = now
            return
        slack = r.origin + offset / RATE - now
        if trace is not None:
            trace.append(
                f"{now * 1000:8.1f} deliver r{r.key} @{offset / RATE:.3f}s "
                f"slack {slack * 1000:.1f} ms"
            )
        if slack < 0:
            r.origin -= slack

    while waiting or active:
        while waiting and waiting[0].arrival <= now + 1e-12:
            r = waiting.pop(0)
            active[r.key] = r
        # The dispatch loop, as in the driver's SynthesisScheduler._dispatch_loop
        # (voxgate.gateway.scheduling.synthesis).
        wake_at = math.inf
        while idle > 0 or urgent_idle:
            alone = policy.alone_first_window_frames > 0 and len(active) == 1
            ready = [r for r in active.values() if r.eligible(max_inflight, alone)]
            if not ready:
                break
            upcoming = [
                d
                for r in active.values()
                if not r.eligible(max_inflight, alone) and (d := r.upcoming(guard_s)) is not None
            ]
            urgent = idle == 0
            decision = next_work(
                [r.item(guard_s) for r in ready],
                now,
                policy,
                cost,
                idle_workers=idle,
                urgent_only=urgent,
                active=len(active),
                workers=workers,
                upcoming=upcoming,
            )
            if isinstance(decision, WaitUntil):
                if not urgent and decision.at is not None:
                    wake_at = decision.at
                break
            start(decision, urgent)
        speed = min(1.0, cores / max(1e-9, len(running) + others)) if running else 1.0
        step = min(
            [t.phases[0][1] / speed for t in running]
            + [waiting[0].arrival - now if waiting else math.inf, wake_at - now]
        )
        if not math.isfinite(step):
            raise RuntimeError("simulation stalled")
        step = max(step, 0.0)
        now += step
        done: list[_Task] = []
        for t in running:
            kind, left, payload = t.phases[0]
            left -= step * speed
            t.phases[0] = (kind, left, payload)
            if left <= 1e-12:
                done.append(t)
        for t in done:
            phase_done(t)
            if not t.phases:
                finish(t)
    return Result([r.stream.summary(RATE) for r in replies], dispatches)


def _units_of(units: Sequence[int] | Sequence[Sequence[int]], i: int) -> tuple[int, ...]:
    """Reply ``i``'s unit lengths: its own list, or the one list rotated per reply."""
    first = units[0]
    if isinstance(first, int):
        flat = [int(u) for u in units]  # type: ignore[arg-type]
        return tuple(flat[(i + k) % len(flat)] for k in range(len(flat)))
    lists = [tuple(u) for u in units]  # type: ignore[arg-type]
    return lists[i % len(lists)]


def row(results: Sequence[Result]) -> dict[str, float]:
    streams = [s for r in results for s in r.streams]
    first = [s["first_ms"] for s in streams]
    return {
        "first_p50_ms": median(first),
        "first_p95_ms": percentile(first, 95),
        "late": float(sum(r.late for r in results)),
        "starve_ms": sum(s["starve_ms"] for s in streams) / max(1, len(streams)),
        "rtf": median(s["rtf"] for s in streams),
    }


def largest_zero_late(
    policy: SynthPolicy,
    units: Sequence[int] | Sequence[Sequence[int]],
    max_n: int,
    **kw: Any,
) -> int:
    """The largest N such that every N' <= N replays with no late chunk."""
    best = 0
    for n in range(1, max_n + 1):
        if simulate(policy, n=n, units=units, **kw).late:
            break
        best = n
    return best


def calibrate(repeats: int = 7) -> tuple[TrueCost, dict[str, list[tuple[int, ...]]]]:
    """Measure step costs on one core with the bundled voice, and the benchmark's units.

    Decoder calls at several input lengths give ``fixed + per_frame * frames`` (least
    squares over the fastest of ``repeats`` runs each); front-end runs over the benchmark's
    texts give the front end's cost per unit frame. Also returns every reply's unit lengths
    (``benchmarks/tts_concurrency.py``'s texts, probe 0).
    """
    import time

    import numpy as np

    from benchmarks.tts_concurrency import KINDS, reply_text
    from voxgate.engines.tts import SpeakOptions, TtsConfig, VitsStreamer, WindowPlan

    streamer = VitsStreamer.load(TtsConfig(cache_bytes=0))
    streamer.warmup()
    units: dict[str, list[tuple[int, ...]]] = {}
    fronts: list[tuple[int, float]] = []
    job = None
    for kind in KINDS:
        units[kind] = []
        for i in range(16):
            job = streamer.open(reply_text(kind, i, 0), SpeakOptions())
            lengths = []
            while not job.planned_all:
                t0 = time.perf_counter()
                job.run_front_end()
                took = time.perf_counter() - t0
                lengths.append(job.unit_frames)
                job.plan(job.unit_frames)
                if i < 4:  # the same unit again: the fastest run is the cost, not the load
                    for _ in range(repeats - 1):
                        again = streamer.open(reply_text(kind, i, 0), SpeakOptions())
                        for _ in lengths[:-1]:
                            again.run_front_end()
                            again.plan(again.unit_frames)
                        t0 = time.perf_counter()
                        again.run_front_end()
                        took = min(took, time.perf_counter() - t0)
                    fronts.append((lengths[-1], took))
            units[kind].append(tuple(lengths))
    # One long clause (no punctuation to split it): a unit longer than every window tried.
    job = streamer.open(
        "Let me read that back to you so that we can make sure that I have every part of "
        "it right before we go on with the rest of the order that you placed with us",
        SpeakOptions(),
    )
    job.run_front_end()
    assert job.unit_frames >= 240, job.unit_frames
    xs, ys = [], []
    for length in (32, 40, 56, 64, 96, 144, 240):
        plan = WindowPlan(0, length, 0, length)
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            streamer.decode_windows([(job, plan)])
            best = min(best, time.perf_counter() - t0)
        xs.append(length)
        ys.append(best)
    per, fixed = np.polyfit(xs, ys, 1)
    fx = [f for f, _ in fronts]
    fper, ffixed = np.polyfit(fx, [t for _, t in fronts], 1)
    streamer.close()
    true = TrueCost(float(fixed), float(per), float(max(0.0, ffixed)), float(fper))
    print(f"decoder: {1000 * fixed:.2f} ms + {1000 * per:.4f} ms/frame (fastest of {repeats})")
    for x, y in zip(xs, ys, strict=True):
        print(f"  {x:>4} frames: {1000 * y:7.2f} ms")
    print(f"front end: {1000 * ffixed:.2f} ms + {1000 * fper:.4f} ms/frame over {len(fx)} units")
    for kind in KINDS:
        print(f"  {kind}: units {units[kind][:3]} ...")
    return true, units


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ns", default="1,2,4,8,12,16")
    parser.add_argument("--others", default="0", help="cores other processes keep busy")
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--stagger-ms", type=float, default=100.0)
    parser.add_argument("--max-n", type=int, default=32)
    parser.add_argument("--policies", default="", help="comma-separated names; default all")
    parser.add_argument("--calibrate", action="store_true", help="measure costs here first")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    ns = [int(x) for x in args.ns.split(",")]
    others = [float(x) for x in args.others.split(",")]
    if args.tiny:
        ns, others, args.max_n = [1, 4], others[:1], 4
    true = TrueCost()
    kinds: dict[str, Sequence[int] | Sequence[Sequence[int]]] = {
        "1 sentence": ONE_SENTENCE,
        "4 sentences": FOUR_SENTENCES,
    }
    if args.calibrate:
        true, measured = calibrate()
        kinds = dict(measured)
    policies = policy_table()
    if args.policies:
        policies = {k: policies[k] for k in args.policies.split(",")}
    print(
        f"\n{'policy':<14}{'others':>7}{'reply':>13}{'N':>4}{'first p50':>10}{'first p95':>10}"
        f"{'late':>6}{'starve':>8}{'RTF':>7}"
    )
    for name, policy in policies.items():
        for other in others:
            kw: dict[str, Any] = {
                "cores": args.cores,
                "others": other,
                "true": true,
                "stagger_s": args.stagger_ms / 1000,
            }
            for kind, units in kinds.items():
                for n in ns:
                    r = row([simulate(policy, n=n, units=units, **kw)])
                    print(
                        f"{name:<14}{other:>7.2f}{kind:>13}{n:>4}{r['first_p50_ms']:>10.1f}"
                        f"{r['first_p95_ms']:>10.1f}{int(r['late']):>6}{r['starve_ms']:>8.1f}"
                        f"{r['rtf']:>7.3f}"
                    )
            best = largest_zero_late(policy, kinds["4 sentences"], args.max_n, **kw)
            print(f"{name:<14}{other:>7.2f}  largest N with zero late chunks (4 sentences): {best}")
    return 0


def policy_table() -> dict[str, SynthPolicy]:
    """The policies compared: the gateway's, the one before it, and one rule off at a time."""
    now = SynthPolicy()
    return {
        "current": now,
        "previous": previous_policy(now),
        "no share": replace(now, share_ratio=math.inf),
        "no parallel": replace(now, parallel_slack_s=math.inf),
        "no urgent": replace(now, urgent_slack_s=0.0),
        "no busy first": replace(now, busy_first_window_frames=now.first_window_frames),
        "alone first 12": replace(now, alone_first_window_frames=12),
    }


if __name__ == "__main__":
    raise SystemExit(main())
