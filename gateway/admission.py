"""Admission from capacity: count real-time call equivalents, guard with latency.

A static ``max_concurrent_calls`` cannot know what a call costs (on 2 cores the recogniser holds
a dozen or two real-time callers, on a GPU hundreds), and a latency trigger refuses far too early:
on a small CPU one real-time caller's final already takes most of a second, so a trigger on
"recent p95 over 0.7 s" refused the second caller of the day, and a client sending a file faster
than real time (whose finals queue behind its own backlog by design) locked everyone out. So:

* **Capacity.** Every call reserves one real-time call equivalent (RTE). The replica holds
  ``capacity`` RTEs: calibrated at start from the engine's measured cost of a reference
  utterance (:attr:`LoadSnapshot.calibrated_capacity`, see ``gateway/runtime/``), and
  re-measured from live traffic (engine busy seconds per worker per second divided by the
  real-time calls that caused it) once there is enough of it. ``admission.capacity_calls``
  overrides both. A new call is refused only when the calls in progress already fill it.
* **Faster than real time is legitimate, and takes only what is spare.** A call whose audio
  runs more than ``realtime_slack_ms`` ahead of its own clock is *bulk* (a file being
  transcribed): it reserves no RTE (a new call counts as real-time until its pace shows), its
  finals carry a later deadline and bulk finals use at most ``workers - 1`` workers at once
  (see ``AsrTranscriber``), so real-time callers keep their latency beside it; and its finals
  are not judged against the real-time latency target.
* **Latency is a guard, not the trigger.** The exact recent p95 of end of speech -> final of the
  *real-time* calls (no histogram buckets) refuses new calls only while the engine is really
  busy (utilisation at or over ``target_utilisation``): a slow final on an idle engine is the
  engine's speed, not overload, and refusing would not make it faster.
* An idle replica always admits, and a refusal clears as soon as calls end or the window
  (``window_s``) forgets the slow finals.
* **Synthesis has its own capacity**: replies of calls and ``Synthesize`` streams together up to
  ``max_synthesize_streams`` (0: what the synthesizer holds, per TTS thread). Recognition load
  never refuses a bot's reply.

``limits.max_concurrent_calls`` stays the hard ceiling. Everything here is pure (no clock, no
loop): :class:`LoadSampler` turns readings into a :class:`LoadSnapshot`, and
:class:`AdmissionPolicy` turns a snapshot and the live counts into a :class:`Refusal` or None.
The server's monitor task samples every ``sample_interval_s`` (see ``gateway/server.py``).

Known limit: calls are long, and admission cannot take back a call it admitted. When the
replica loses capacity after admitting (another process takes the CPU, callers all talk at
once), only the degradation ladder (``gateway/degrade.py``) and scaling out help.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client import Counter

from voxgate.gateway.config import AdmissionConfig, LimitsConfig
from voxgate.gateway.metrics import GatewayMetrics

__all__ = [
    "AdmissionPolicy",
    "LoadSampler",
    "LoadSnapshot",
    "Refusal",
    "StreamKind",
    "WindowedTotal",
]

#: What a stream asks for: a recognition call (Converse, StreamingRecognize) or synthesis.
StreamKind = Literal["call", "synthesize"]


# --------------------------------------------------------------------------------------------
# Windowed views of cumulative metrics (pure)
# --------------------------------------------------------------------------------------------


class WindowedTotal:
    """The increase of a cumulative total (a counter) per second over the last ``window_s``."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._readings: deque[tuple[float, float]] = deque()

    def add(self, now: float, total: float) -> None:
        """Record the total at time ``now``."""
        self._readings.append((now, total))
        while len(self._readings) >= 2 and self._readings[1][0] <= now - self.window_s:
            self._readings.popleft()

    def rate(self) -> float:
        """Increase per second across the window; 0 before two readings."""
        if len(self._readings) < 2:
            return 0.0
        (t0, v0), (t1, v1) = self._readings[0], self._readings[-1]
        return max(0.0, v1 - v0) / (t1 - t0) if t1 > t0 else 0.0

    def mean(self) -> float:
        """The average of the recorded values across the window (for gauges such as calls)."""
        if not self._readings:
            return 0.0
        return sum(v for _, v in self._readings) / len(self._readings)

    def maximum(self) -> float:
        """The largest recorded value across the window (0 before any)."""
        return max((v for _, v in self._readings), default=0.0)


def _counter_total(counter: Counter) -> float:
    for metric in counter.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                return float(sample.value)
    return 0.0


# --------------------------------------------------------------------------------------------
# Snapshot and sampler
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """What the engines were measured doing over the recent window.

    Attributes:
        at: when it was taken (the monitor's clock).
        calls: recognition calls active now (real-time and bulk).
        bulk_calls: of those, calls sending audio faster than real time now.
        calls_mean: real-time calls active on average over the pricing window
            (``capacity_window_s``; their cost is what the measured capacity divides by).
        bulk_in_window: a bulk call was active at some point in the pricing window (then the
            engine's busy time is not the real-time calls' alone, and the window prices no call).
        asr_workers: recogniser worker threads (0 = no recogniser).
        asr_utilisation: engine busy seconds per worker per second over ``window_s`` (0..1):
            whether the engine is busy now.
        priced_utilisation: the same over the pricing window: what the calls cost.
        final_p95_s: exact recent p95 of end of speech -> final of real-time calls (NaN: none).
        finals: real-time finals in the window.
        calibrated_capacity: RTEs the recogniser holds by the start-up calibration (0: none).
        tts_threads: synthesis threads (0 = no voice).
        tts_streams: replies and Synthesize streams being synthesized now.
    """

    at: float = 0.0
    calls: int = 0
    bulk_calls: int = 0
    calls_mean: float = 0.0
    bulk_in_window: bool = False
    asr_workers: int = 0
    asr_utilisation: float = 0.0
    priced_utilisation: float = 0.0
    final_p95_s: float = math.nan
    finals: int = 0
    calibrated_capacity: int = 0
    tts_threads: int = 0
    tts_streams: int = 0


class LoadSampler:
    """Reads a server's metrics into :class:`LoadSnapshot` s; call :meth:`sample` periodically.

    Engine busy time and the real-time finals' latencies are written by the layers that see
    them (the batcher's observer, the session), so admission needs no hooks of its own, and
    what it acts on is what operators see.
    """

    def __init__(
        self, metrics: GatewayMetrics, window_s: float, capacity_window_s: float = 60.0
    ) -> None:
        self._m = metrics
        self.window_s = window_s
        self._busy = WindowedTotal(window_s)
        # A call's cost shows over several of its turns, not in one utterance's decode.
        self._priced_busy = WindowedTotal(capacity_window_s)
        self._calls = WindowedTotal(capacity_window_s)
        self._bulk = WindowedTotal(capacity_window_s)

    def sample(
        self, now: float, *, calls: int, bulk_calls: int, calibrated_capacity: int = 0
    ) -> LoadSnapshot:
        """Read the metrics at time ``now`` (the clock the sessions record finals on).

        Args:
            now: the time of the reading, seconds on the event loop's clock.
            calls: recognition calls active now.
            bulk_calls: of those, calls sending faster than real time now.
            calibrated_capacity: the start-up calibration's RTE count (0: none).
        """
        m = self._m
        busy = _counter_total(m.asr_busy)
        self._busy.add(now, busy)
        self._priced_busy.add(now, busy)
        self._calls.add(now, float(calls - bulk_calls))
        self._bulk.add(now, float(bulk_calls))
        workers = int(m.value("voxgate_engine_workers", engine="asr"))
        finals = m.realtime_finals.window(now, self.window_s)
        return LoadSnapshot(
            at=now,
            calls=calls,
            bulk_calls=bulk_calls,
            calls_mean=self._calls.mean(),
            bulk_in_window=self._bulk.maximum() > 0,
            asr_workers=workers,
            asr_utilisation=self._busy.rate() / workers if workers else 0.0,
            priced_utilisation=self._priced_busy.rate() / workers if workers else 0.0,
            final_p95_s=quantile(finals, 0.95),
            finals=len(finals),
            calibrated_capacity=calibrated_capacity,
            tts_threads=int(m.value("voxgate_engine_workers", engine="tts")),
            tts_streams=int(m.value("voxgate_tts_streams_active")),
        )


def quantile(values: Sequence[float], q: float) -> float:
    """The exact ``q`` quantile (nearest rank, 0..1) of ``values``; NaN when there are none.

    Nearest rank, not interpolation: the p95 of twenty finals is the 19th slowest, a value that
    was really measured.
    """
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


# --------------------------------------------------------------------------------------------
# Policy (pure)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a new stream is refused, and when to try again.

    Attributes:
        reason: a metric label: ``max_concurrent_calls``, ``latency``, ``engine_capacity``,
            ``ramp``, ``synthesis``.
        message: the status text: what is full, by how much, and what to do.
        retry_after_ms: the retry hint (``grpc-retry-pushback-ms`` and ``RetryInfo``).
    """

    reason: str
    message: str
    retry_after_ms: int


#: Least engine utilisation from which a per-call cost is measured from live traffic; below
#: it the estimate would be noise (a call that has not spoken yet costs nothing measurable).
_MIN_UTILISATION = 0.1

#: Synthesis streams one TTS thread holds at once when ``max_synthesize_streams`` is 0: the
#: deadline scheduler kept 16 paced replies on 2 threads without a late chunk
#: (benchmarks/tts_concurrency.py); six per thread leaves headroom for longer texts.
SYNTHESIS_STREAMS_PER_THREAD = 6


class AdmissionPolicy:
    """Decides whether one more stream fits, from a snapshot and the live counts.

    Args:
        config: the admission settings.
        limits: for the hard ceiling ``max_concurrent_calls``.
    """

    def __init__(self, config: AdmissionConfig, limits: LimitsConfig) -> None:
        self.config = config
        self.max_calls = limits.max_concurrent_calls

    def measured_capacity(self, snap: LoadSnapshot) -> int | None:
        """RTEs the recogniser holds by the live traffic of the window; None = unmeasured.

        Only windows of real-time calls alone price a call: a bulk call's backlog keeps the
        engine busy by design, and would make every real-time call look expensive.
        """
        if snap.asr_workers <= 0 or snap.priced_utilisation < _MIN_UTILISATION:
            return None
        if snap.calls_mean < 1.0 or snap.bulk_in_window:
            return None
        per_call = snap.priced_utilisation / snap.calls_mean
        return max(1, math.floor(self.config.target_utilisation / per_call))

    def capacity(self, snap: LoadSnapshot) -> int | None:
        """RTEs this replica holds: configured, else measured, else calibrated; None = unknown."""
        if self.config.capacity_calls:
            return self.config.capacity_calls
        if snap.asr_workers <= 0:
            return None
        measured = self.measured_capacity(snap)
        if measured is not None:
            return measured
        return snap.calibrated_capacity or None

    def ramp_limit(self, snap: LoadSnapshot) -> int | None:
        """Calls allowed while their cost is being measured: twice the window's mean.

        Like TCP's slow start, the load may at most double per ``window_s`` (from at least
        one call per worker). None: off, or no recogniser.
        """
        if snap.asr_workers <= 0 or not self.config.ramp_doubling:
            return None
        return max(snap.asr_workers, math.floor(2.0 * (snap.calls_mean + snap.bulk_calls)))

    def max_synthesize(self, snap: LoadSnapshot) -> int:
        """Synthesis streams (calls' replies and Synthesize streams together) held at once."""
        if self.config.max_synthesize_streams:
            return self.config.max_synthesize_streams
        return max(1, SYNTHESIS_STREAMS_PER_THREAD * snap.tts_threads)

    def busy(self, snap: LoadSnapshot) -> bool:
        """Whether the recogniser is working at or past its target utilisation."""
        return snap.asr_workers > 0 and snap.asr_utilisation >= self.config.target_utilisation

    def _latency_guard(self, snap: LoadSnapshot) -> Refusal | None:
        """Real-time finals over the refusal point *while the engine is busy*."""
        cfg = self.config
        limit_s = cfg.refuse_at * cfg.latency_budget_s
        enough = snap.finals >= cfg.min_samples
        # NaN (no finals) compares False.
        if enough and snap.final_p95_s > limit_s and self.busy(snap):
            return Refusal(
                "latency",
                f"server is at capacity: the recogniser is {snap.asr_utilisation:.0%} busy and "
                f"the recent p95 end of speech -> final of real-time calls is "
                f"{snap.final_p95_s:.2f} s, over the admission limit {limit_s:.2f} s "
                f"(refuse_at {cfg.refuse_at:g} of the {cfg.latency_budget_s:g} s budget); "
                f"retry in {cfg.retry_after_ms / 1000:g} s or on another replica",
                cfg.retry_after_ms,
            )
        return None

    def decide(
        self,
        kind: StreamKind,
        snap: LoadSnapshot,
        *,
        active_calls: int,
        active_synthesize: int,
        bulk_calls: int = 0,
        declared_bulk: bool = False,
    ) -> Refusal | None:
        """None to admit one more stream of ``kind``, else why not.

        Args:
            kind: ``call`` (Converse, StreamingRecognize) or ``synthesize``.
            snap: the latest measurements.
            active_calls: recognition calls in progress now (live, not sampled).
            active_synthesize: Synthesize streams in progress now (live).
            bulk_calls: of ``active_calls``, those sending faster than real time now (live).
                They are served from spare capacity only, so they reserve none of it; a new
                call is counted as real-time (its pace is not known yet)...
            declared_bulk: ...unless it says it sends faster than real time (``voxgate-pacing:
                bulk``): then it takes only spare capacity, so neither the real-time count,
                nor the latency guard, nor the ramp refuses it (only ``max_concurrent_calls``).
                Its finals wait behind real-time finals and use at most ``workers - 1``
                workers, so real-time callers keep their latency beside it; a claim its pace
                does not bear out is counted as real-time from then on.
        """
        cfg = self.config
        hint = cfg.retry_after_ms
        if kind == "synthesize":
            if not cfg.enabled:
                return None
            most = self.max_synthesize(snap)
            # Calls' replies in progress count too (the sampled gauge holds both kinds; the
            # live Synthesize count covers streams admitted since the sample).
            busy = max(snap.tts_streams, active_synthesize)
            if busy >= most:
                return Refusal(
                    "synthesis",
                    f"server is at capacity for synthesis: {busy} replies and Synthesize "
                    f"streams in progress, max_synthesize_streams={most}; retry in "
                    f"{hint / 1000:g} s or on another replica",
                    hint,
                )
            return None
        if active_calls >= self.max_calls:
            return Refusal(
                "max_concurrent_calls",
                f"server is at max_concurrent_calls={self.max_calls}; retry in "
                f"{hint / 1000:g} s or on another replica",
                hint,
            )
        if not cfg.enabled or active_calls == 0 or declared_bulk:  # idle: always admits
            return None
        realtime = active_calls - bulk_calls
        cap = self.capacity(snap)
        if cap is not None and realtime + 1 > cap:
            return Refusal(
                "engine_capacity",
                f"server is at capacity: {realtime} real-time calls in progress and it holds about "
                f"{cap} real-time calls (at target_utilisation={cfg.target_utilisation:g}); "
                f"retry in {hint / 1000:g} s or on another replica",
                hint,
            )
        guard = self._latency_guard(snap)
        if guard is not None:
            return guard
        ramp = self.ramp_limit(snap)
        if ramp is not None and active_calls + 1 > ramp:
            return Refusal(
                "ramp",
                f"server is ramping up: {active_calls} calls, and the load may at most double "
                f"per {cfg.window_s:g} s while new calls' cost is measured; retry in "
                f"{hint / 1000:g} s or on another replica",
                hint,
            )
        return None

    def load(self, snap: LoadSnapshot, *, active_calls: int, bulk_calls: int = 0) -> float:
        """Load for a balancer, 0..1; 1 exactly when a new call would be refused."""
        parts = [active_calls / self.max_calls]
        if self.config.enabled:
            cap = self.capacity(snap)
            if cap is not None:
                parts.append((active_calls - bulk_calls) / cap)
            ramp = self.ramp_limit(snap)
            if ramp is not None:
                parts.append(active_calls / ramp)
        value = max(parts)
        full = self.decide(
            "call", snap, active_calls=active_calls, active_synthesize=0, bulk_calls=bulk_calls
        )
        if value >= 1.0 or full is not None:
            return 1.0
        # Below 1 while there is still room for one more call.
        return min(0.99, max(0.0, value))

    def over_capacity(self, snap: LoadSnapshot, *, active_calls: int) -> bool:
        """Whether the replica works past what it holds: the degradation ladder may shed.

        Past measured capacity means the engine is busy beyond its target, or more calls are
        in progress than the capacity counts (callers admitted before a slowdown). Below that,
        a slow final is the engine's speed, and shedding quality would not buy anything back.
        """
        if self.busy(snap):
            return True
        cap = self.capacity(snap)
        return cap is not None and active_calls > cap
