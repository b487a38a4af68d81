"""Prometheus metrics of the gateway, in a registry each server owns.

Names follow Prometheus conventions: ``voxgate_`` prefix, base units (seconds), ``_total`` for
counters. ``voxgate_calls_active`` is the signal for autoscaling (HPA) and admission. Every
metric is documented in ``deploy/README.md``; a test keeps the two lists equal.

The registry is injected (one :class:`GatewayMetrics` per server) rather than process-global,
so that two servers in one process (tests, benchmarks) never count each other's calls.
"""

from __future__ import annotations

from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["GatewayMetrics", "RecentValues"]


class RecentValues:
    """The last observations with their times, for exact quantiles over a recent window.

    A histogram's buckets make a p95 pessimistic by up to a whole bucket (a 0.51 s final read
    as 0.75 s), which is no basis for refusing a caller; this keeps the values themselves.

    Args:
        most: observations kept (the oldest are dropped first).
    """

    def __init__(self, most: int = 4096) -> None:
        self._items: deque[tuple[float, float]] = deque(maxlen=most)

    def add(self, now: float, value: float) -> None:
        """Record ``value`` observed at ``now`` (seconds on the event loop's clock)."""
        self._items.append((now, value))

    def window(self, now: float, window_s: float) -> list[float]:
        """The values observed in the last ``window_s`` before ``now``."""
        since = now - window_s
        return [v for t, v in self._items if t > since]


class GatewayMetrics:
    """Every metric the gateway exports, registered in ``registry``.

    Args:
        registry: where to register; a fresh :class:`CollectorRegistry` when omitted.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        #: End of speech -> final of real-time calls, exact (admission and the ladder read it).
        self.realtime_finals = RecentValues()
        self.calls_active = Gauge(
            "voxgate_calls_active", "Calls (Converse/StreamingRecognize) in progress.", registry=r
        )
        self.calls_bulk = Gauge(
            "voxgate_calls_bulk",
            "Calls in progress whose audio runs ahead of real time (files being transcribed).",
            registry=r,
        )
        self.calls_total = Counter(
            "voxgate_calls_total", "Calls started, by RPC.", ["rpc"], registry=r
        )
        self.calls_ended = Counter(
            "voxgate_calls_ended_total", "Calls ended, by outcome.", ["outcome"], registry=r
        )
        self.calls_refused = Counter(
            "voxgate_calls_refused_total",
            "Calls refused at admission (capacity or shutdown), by reason.",
            ["reason"],
            registry=r,
        )
        self.auth_refused = Counter(
            "voxgate_auth_refused_total",
            "RPCs refused by the security layer, by reason: unauthenticated (no or malformed "
            "token), permission_denied (unknown token), token_quota (the token's max_calls).",
            ["reason"],
            registry=r,
        )
        self.tenant_calls_active = Gauge(
            "voxgate_tenant_calls_active",
            "Metered calls (Converse, StreamingRecognize, Synthesize) open, by token tenant.",
            ["tenant"],
            registry=r,
        )
        self.utterances = Counter(
            "voxgate_utterances_total",
            "Utterances whose final decode finished, one per utterance (the decode its final came "
            "from), by outcome (text or why there is none).",
            ["outcome"],
            registry=r,
        )
        self.asr_final_latency = Histogram(
            "voxgate_asr_final_latency_seconds",
            "End of speech to final transcript.",
            buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0),
            registry=r,
        )
        self.asr_model_requests = Counter(
            "voxgate_asr_model_requests_total",
            "Recognition requests by model (the default's name, a named model's, or _barge-in "
            "for asr.barge_in_model), kind (final, interim; turn: a smart turn decoded again as "
            "one, session.turns.whole_text) and outcome (ok, failed, refused; "
            "withdrawn: an interim taken off the queue when its utterance's final came).",
            ["model", "kind", "outcome"],
            registry=r,
        )
        self.asr_model_latency = Histogram(
            "voxgate_asr_model_latency_seconds",
            "Queue wait plus decode of one recognition request, by model and kind.",
            ["model", "kind"],
            buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0),
            registry=r,
        )
        self.asr_model_fallbacks = Counter(
            "voxgate_asr_fallbacks_total",
            "Decoding retries by model, kind (final, interim, turn) and step: window "
            "(re-encoded on the full 30 s window), temperature (sampled hotter), language "
            "(the runner-up detected language); each costs about one more decode. Step "
            "budget: the ladder stopped because its next retry would have ended after "
            "asr.policy.decode_budget_s (the best text so far was kept).",
            ["model", "kind", "step"],
            registry=r,
        )
        self.asr_finals_from_interim = Counter(
            "voxgate_asr_finals_from_interim_total",
            "Finals whose text is the utterance's last interim, by why the final decode gave "
            "none: its error kind (deadline_exceeded, resource_exhausted, internal) or its "
            "gate (repetition, low_logprob).",
            ["reason"],
            registry=r,
        )
        self.asr_model_loaded = Gauge(
            "voxgate_asr_model_loaded",
            "1 for each model in memory, 0 for a named model offered but not loaded yet (or "
            "no longer offered); the sum is the number of loaded models.",
            ["model"],
            registry=r,
        )
        self.asr_model_loads = Counter(
            "voxgate_asr_model_loads_total",
            "Loads of named models (first use, asr.load_on_start), by model and outcome.",
            ["model", "outcome"],
            registry=r,
        )
        self.asr_speculative = Counter(
            "voxgate_asr_speculative_finals_total",
            "Final decodes started before the hangover ended, by outcome (used, discarded, "
            "cancelled).",
            ["outcome"],
            registry=r,
        )
        self.asr_batch_size = Histogram(
            "voxgate_asr_batch_size",
            "Items per engine call.",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64),
            registry=r,
        )
        self.asr_queue_depth = Gauge(
            "voxgate_asr_queue_depth", "Utterances waiting for the engine.", registry=r
        )
        # -- load, admission and degradation (gateway/admission.py, gateway/degrade.py) --
        self.load = Gauge(
            "voxgate_load",
            "Load of this replica, 0..1, from the admission model: 1 = new calls are refused.",
            registry=r,
        )
        self.admission_capacity = Gauge(
            "voxgate_admission_capacity_calls",
            "Recognition calls this replica can hold, estimated from measured engine cost "
            "(0 = no estimate yet).",
            registry=r,
        )
        self.engine_workers = Gauge(
            "voxgate_engine_workers",
            "Engine worker threads, by engine (asr batcher workers, tts threads).",
            ["engine"],
            registry=r,
        )
        self.asr_queue_wait = Histogram(
            "voxgate_asr_queue_wait_seconds",
            "Time an utterance waited in the batch queue before an engine worker took it.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0),
            registry=r,
        )
        self.asr_busy = Counter(
            "voxgate_asr_engine_busy_seconds_total",
            "Engine time spent in batches, summed over workers (utilisation = rate / workers).",
            registry=r,
        )
        self.asr_batch_timeouts = Counter(
            "voxgate_asr_batch_timeouts_total",
            "Batches that ran past batcher.batch_timeout_s (a hung engine); their items failed "
            "with DEADLINE_EXCEEDED and the worker got a fresh thread.",
            registry=r,
        )
        self.asr_abandoned_threads = Gauge(
            "voxgate_asr_abandoned_threads",
            "Stuck engine threads left behind by worker replacement (they cannot be killed).",
            registry=r,
        )
        self.tts_streams_active = Gauge(
            "voxgate_tts_streams_active",
            "Replies and Synthesize streams being synthesized right now.",
            registry=r,
        )
        self.synthesize_active = Gauge(
            "voxgate_synthesize_active", "Synthesize streams in progress.", registry=r
        )
        self.synthesize_refused = Counter(
            "voxgate_synthesize_refused_total",
            "Synthesize streams refused at admission, by reason.",
            ["reason"],
            registry=r,
        )
        self.degrade_level = Gauge(
            "voxgate_degrade_level",
            "Steps of the degradation ladder in force (0 = full quality).",
            registry=r,
        )
        self.degrade_steps = Counter(
            "voxgate_degrade_steps_total",
            "Degradation ladder moves, by direction (shed, restore) and step.",
            ["direction", "step"],
            registry=r,
        )
        self.tts_first_audio = Histogram(
            "voxgate_tts_first_audio_seconds",
            "Speak received to first audio frame ready.",
            buckets=(0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0),
            registry=r,
        )
        # -- the synthesis scheduler (gateway/scheduling/synthesis.py) --
        self.tts_playout_slack = Histogram(
            "voxgate_tts_playout_slack_seconds",
            "Per reply chunk after the first: its play time minus the time it was ready "
            "(negative = late, the caller heard a gap).",
            buckets=(-0.1, -0.02, 0.0, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
            registry=r,
        )
        self.tts_late_chunks = Counter(
            "voxgate_tts_late_chunks_total",
            "Reply chunks ready after their play time (an underrun at the caller's player).",
            registry=r,
        )
        self.tts_starvation = Counter(
            "voxgate_tts_starvation_seconds_total",
            "Silence inside replies: time players waited for late chunks, summed.",
            registry=r,
        )
        self.tts_batch_size = Histogram(
            "voxgate_tts_batch_size",
            "Decoder windows per ONNX Runtime call (several replies' windows batched).",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16),
            registry=r,
        )
        self.tts_queue_depth = Gauge(
            "voxgate_tts_queue_depth",
            "Replies whose next synthesis step waits for a worker.",
            registry=r,
        )

    def value(self, name: str, **labels: str) -> float:
        """The current value of one sample, 0 if it was never set.

        E.g. ``value("voxgate_calls_ended_total", outcome="ok")``: what tests and health checks
        read instead of prometheus_client internals.
        """
        got = self.registry.get_sample_value(name, labels or None)
        return 0.0 if got is None else float(got)
