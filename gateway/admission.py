"""Admission from measured cost: refuse new streams *before* the admitted ones degrade.

A static ``max_concurrent_calls`` cannot know what a call costs: on 2 cores the recogniser holds
a couple of dozen real-time callers, on a GPU hundreds, and the same count of callers that talk
all the time costs several times more than callers who mostly listen. So admission looks at what
the engines are measured to be doing, over the last ``admission.window_s``:

* the recent p95 of end of speech -> final (``voxgate_asr_final_latency_seconds``): refuse new
  calls once it passes ``refuse_at x latency_budget_s``, while there is still headroom for the
  calls already admitted;
* the recent p95 of batch-queue wait (``voxgate_asr_queue_wait_seconds``): a queue that forms
  is the first sign of saturation, before the latency shows it;
* a capacity estimate: the engines' utilisation (busy seconds per worker per second, from
  ``voxgate_asr_engine_busy_seconds_total``) divided by the calls that caused it gives the cost
  of an average call; the replica holds ``calls x target_utilisation / utilisation`` calls.
  The live call count is checked against it at every admission, so a burst of callers between
  two samples cannot overshoot it;
* optionally (``ramp_doubling``), a slow start: the call count may at most double per window,
  so a burst cannot get in before its cost is measured;
* synthesis: ``Synthesize`` streams run as fast as the CPU allows (they are not paced), so they
  get at most ``max_synthesize_streams`` at once (default: TTS threads - 1, one thread stays free
  for calls' replies), and none while recognition is past its refusal point.

``limits.max_concurrent_calls`` stays the hard ceiling. Everything here is pure (no clock, no
loop): :class:`LoadSampler` turns metric readings into a :class:`LoadSnapshot`, and
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

from prometheus_client import Counter, Histogram

from gateway.config import AdmissionConfig, LimitsConfig
from gateway.metrics import GatewayMetrics

__all__ = [
    "AdmissionPolicy",
    "LoadSampler",
    "LoadSnapshot",
    "Refusal",
    "StreamKind",
    "WindowedHistogram",
    "WindowedTotal",
    "histogram_buckets",
]

#: What a stream asks for: a recognition call (Converse, StreamingRecognize) or synthesis.
StreamKind = Literal["call", "synthesize"]


# --------------------------------------------------------------------------------------------
# Windowed views of cumulative metrics (pure)
# --------------------------------------------------------------------------------------------


def histogram_buckets(hist: Histogram) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """A prometheus histogram's (upper bounds, cumulative counts), ``+Inf`` last."""
    bounds: list[float] = []
    counts: list[float] = []
    for metric in hist.collect():
        for sample in metric.samples:
            if sample.name.endswith("_bucket"):
                bounds.append(float(sample.labels["le"]))
                counts.append(float(sample.value))
    return tuple(bounds), tuple(counts)


class WindowedHistogram:
    """Quantiles of the observations of the last ``window_s``, from cumulative bucket counts.

    Each :meth:`add` records the histogram's cumulative counts at a time; the window's
    observations are the difference between the newest reading and the newest one at least
    ``window_s`` older. A quantile is the upper bound of the bucket it falls in (pessimistic by
    at most one bucket), ``inf`` when it falls in ``+Inf``, NaN when the window is empty.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._readings: deque[tuple[float, tuple[float, ...]]] = deque()
        self._bounds: tuple[float, ...] = ()

    def add(self, now: float, bounds: Sequence[float], counts: Sequence[float]) -> None:
        """Record the cumulative ``counts`` per bucket upper bound at time ``now``."""
        self._bounds = tuple(bounds)
        self._readings.append((now, tuple(counts)))
        # Keep exactly one reading at or before the window's start: the baseline.
        while len(self._readings) >= 2 and self._readings[1][0] <= now - self.window_s:
            self._readings.popleft()

    def _delta(self) -> tuple[float, ...]:
        if len(self._readings) < 2:
            return tuple(0.0 for _ in self._bounds)
        old, new = self._readings[0][1], self._readings[-1][1]
        return tuple(max(0.0, n - o) for n, o in zip(new, old, strict=True))

    @property
    def count(self) -> int:
        """Observations in the window."""
        delta = self._delta()
        return int(delta[-1]) if delta else 0

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1) of the window's observations; NaN when there are none."""
        delta = self._delta()
        total = delta[-1] if delta else 0.0
        if total <= 0.0:
            return math.nan
        need = q * total
        for bound, cum in zip(self._bounds, delta, strict=True):
            if cum >= need:
                return bound
        return math.inf


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
        calls: recognition calls active now.
        calls_mean: recognition calls active on average over the window.
        asr_workers: recogniser worker threads (0 = no recogniser).
        asr_utilisation: engine busy seconds per worker per second over the window (0..1).
        queue_depth: utterances waiting for a worker now.
        queue_wait_p95_s: recent p95 of batch-queue wait (NaN: no batch in the window).
        final_p95_s: recent p95 of end of speech -> final (NaN: no final in the window).
        finals: finals in the window.
        queue_waits: batches' items that waited in the window.
        tts_threads: synthesis threads (0 = no voice).
        tts_streams: replies and Synthesize streams being synthesized now.
    """

    at: float = 0.0
    calls: int = 0
    calls_mean: float = 0.0
    asr_workers: int = 0
    asr_utilisation: float = 0.0
    queue_depth: int = 0
    queue_wait_p95_s: float = math.nan
    final_p95_s: float = math.nan
    finals: int = 0
    queue_waits: int = 0
    tts_threads: int = 0
    tts_streams: int = 0


class LoadSampler:
    """Reads a server's metrics into :class:`LoadSnapshot` s; call :meth:`sample` periodically.

    The metrics are the one channel every layer already writes to (the session observes final
    latency, the batcher observer queue waits and busy time), so admission needs no hooks of
    its own in them, and what it acts on is exactly what operators see.
    """

    def __init__(self, metrics: GatewayMetrics, window_s: float) -> None:
        self._m = metrics
        self._final = WindowedHistogram(window_s)
        self._wait = WindowedHistogram(window_s)
        self._busy = WindowedTotal(window_s)
        self._calls = WindowedTotal(window_s)

    def sample(self, now: float) -> LoadSnapshot:
        """Read the metrics at time ``now`` (seconds on any monotonic clock)."""
        m = self._m
        self._final.add(now, *histogram_buckets(m.asr_final_latency))
        self._wait.add(now, *histogram_buckets(m.asr_queue_wait))
        self._busy.add(now, _counter_total(m.asr_busy))
        calls = int(m.value("voxgate_calls_active"))
        self._calls.add(now, float(calls))
        workers = int(m.value("voxgate_engine_workers", engine="asr"))
        return LoadSnapshot(
            at=now,
            calls=calls,
            calls_mean=self._calls.mean(),
            asr_workers=workers,
            asr_utilisation=self._busy.rate() / workers if workers else 0.0,
            queue_depth=int(m.value("voxgate_asr_queue_depth")),
            queue_wait_p95_s=self._wait.quantile(0.95),
            final_p95_s=self._final.quantile(0.95),
            finals=self._final.count,
            queue_waits=self._wait.count,
            tts_threads=int(m.value("voxgate_engine_workers", engine="tts")),
            tts_streams=int(m.value("voxgate_tts_streams_active")),
        )


# --------------------------------------------------------------------------------------------
# Policy (pure)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a new stream is refused, and when to try again.

    Attributes:
        reason: a metric label: ``max_concurrent_calls``, ``latency``, ``queue_wait``,
            ``engine_capacity``, ``ramp``, ``synthesis``.
        message: the status text: what is full, by how much, and what to do.
        retry_after_ms: the retry hint (``grpc-retry-pushback-ms`` and ``RetryInfo``).
    """

    reason: str
    message: str
    retry_after_ms: int


#: Least engine utilisation from which a per-call cost is estimated; below it the estimate
#: would be noise (a call that has not spoken yet costs nothing measurable).
_MIN_UTILISATION = 0.1


class AdmissionPolicy:
    """Decides whether one more stream fits, from a snapshot and the live counts.

    Args:
        config: the admission settings.
        limits: for the hard ceiling ``max_concurrent_calls``.
    """

    def __init__(self, config: AdmissionConfig, limits: LimitsConfig) -> None:
        self.config = config
        self.max_calls = limits.max_concurrent_calls

    def capacity(self, snap: LoadSnapshot) -> int | None:
        """Recognition calls the replica holds at ``target_utilisation``; None = unmeasured."""
        if snap.asr_workers <= 0 or snap.asr_utilisation < _MIN_UTILISATION:
            return None
        if snap.calls_mean < 1.0:
            return None
        per_call = snap.asr_utilisation / snap.calls_mean
        return max(1, math.floor(self.config.target_utilisation / per_call))

    def ramp_limit(self, snap: LoadSnapshot) -> int | None:
        """Calls allowed while their cost is being measured: twice the window's mean.

        A call's cost shows only once its caller has spoken for a while, so a capacity estimate
        lags a ramp by about a window; without this, a burst of callers at start-up all get in
        before the first of them is measured. Like TCP's slow start, the load may at most
        double per ``window_s`` (from at least one call per worker). None: no recogniser.
        """
        if snap.asr_workers <= 0 or not self.config.ramp_doubling:
            return None
        return max(snap.asr_workers, math.floor(2.0 * snap.calls_mean))

    def max_synthesize(self, snap: LoadSnapshot) -> int:
        """Synthesize streams allowed at once."""
        if self.config.max_synthesize_streams:
            return self.config.max_synthesize_streams
        return max(1, snap.tts_threads - 1)

    def _pressure(self, snap: LoadSnapshot) -> Refusal | None:
        """The recognition guards shared by both kinds of stream (latency, queue wait)."""
        cfg = self.config
        limit_s = cfg.refuse_at * cfg.latency_budget_s
        enough = snap.finals >= cfg.min_samples
        if enough and snap.final_p95_s > limit_s:  # NaN (no finals) compares False
            return Refusal(
                "latency",
                f"server is at capacity: recent p95 end of speech -> final is "
                f"{_fmt_s(snap.final_p95_s)}, over the admission limit {limit_s:.2f} s "
                f"(refuse_at {cfg.refuse_at:g} of the {cfg.latency_budget_s:g} s budget); "
                f"retry in {cfg.retry_after_ms / 1000:g} s or on another replica",
                cfg.retry_after_ms,
            )
        if snap.queue_waits >= cfg.min_samples and snap.queue_wait_p95_s > cfg.max_queue_wait_s:
            return Refusal(
                "queue_wait",
                f"server is at capacity: recent p95 recognition queue wait is "
                f"{_fmt_s(snap.queue_wait_p95_s)}, over max_queue_wait_s="
                f"{cfg.max_queue_wait_s:g}; retry in {cfg.retry_after_ms / 1000:g} s or on "
                "another replica",
                cfg.retry_after_ms,
            )
        return None

    def decide(
        self, kind: StreamKind, snap: LoadSnapshot, *, active_calls: int, active_synthesize: int
    ) -> Refusal | None:
        """None to admit one more stream of ``kind``, else why not.

        Args:
            kind: ``call`` (Converse, StreamingRecognize) or ``synthesize``.
            snap: the latest measurements.
            active_calls: recognition calls in progress now (live, not sampled).
            active_synthesize: Synthesize streams in progress now.
        """
        cfg = self.config
        hint = cfg.retry_after_ms
        if kind == "call" and active_calls >= self.max_calls:
            return Refusal(
                "max_concurrent_calls",
                f"server is at max_concurrent_calls={self.max_calls}; retry in "
                f"{hint / 1000:g} s or on another replica",
                hint,
            )
        if not cfg.enabled:
            return None
        pressure = self._pressure(snap)
        if pressure is not None:
            return pressure
        if kind == "call":
            cap = self.capacity(snap)
            if cap is not None and active_calls + 1 > cap:
                return Refusal(
                    "engine_capacity",
                    f"server is at capacity: {active_calls} calls use "
                    f"{snap.asr_utilisation:.0%} of the recogniser, and it holds about {cap} "
                    f"at target_utilisation={cfg.target_utilisation:g}; retry in "
                    f"{hint / 1000:g} s or on another replica",
                    hint,
                )
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
        most = self.max_synthesize(snap)
        if active_synthesize >= most:
            return Refusal(
                "synthesis",
                f"server is at capacity for Synthesize: {active_synthesize} streams at once, "
                f"max_synthesize_streams={most} (one TTS thread stays free for calls' "
                f"replies); retry in {hint / 1000:g} s or on another replica",
                hint,
            )
        return None

    def load(self, snap: LoadSnapshot, *, active_calls: int) -> float:
        """Load for a balancer, 0..1; 1 exactly when a new call would be refused."""
        cfg = self.config
        parts = [active_calls / self.max_calls]
        if cfg.enabled:
            limit_s = cfg.refuse_at * cfg.latency_budget_s
            if snap.finals >= cfg.min_samples:
                parts.append(snap.final_p95_s / limit_s)
            if snap.queue_waits >= cfg.min_samples:
                parts.append(snap.queue_wait_p95_s / cfg.max_queue_wait_s)
            cap = self.capacity(snap)
            if cap is not None:
                parts.append(active_calls / cap)
            ramp = self.ramp_limit(snap)
            if ramp is not None:
                parts.append(active_calls / ramp)
        value = max(parts)
        full = self.decide("call", snap, active_calls=active_calls, active_synthesize=0)
        if value >= 1.0 or full is not None:
            return 1.0
        # Below 1 while there is still room for one more call.
        return min(0.99, max(0.0, value))


def _fmt_s(value: float) -> str:
    return "over the largest histogram bucket" if math.isinf(value) else f"{value:.2f} s"
