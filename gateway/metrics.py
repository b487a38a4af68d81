"""Prometheus metrics of the gateway (process-wide, in the default registry).

Names follow Prometheus conventions: ``voxgate_`` prefix, base units (seconds), ``_total`` for
counters. ``voxgate_calls_active`` is the signal for autoscaling (HPA) and admission.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "ASR_BATCH_SIZE",
    "ASR_FINAL_LATENCY",
    "ASR_QUEUE_DEPTH",
    "ASR_SPECULATIVE",
    "CALLS_ACTIVE",
    "CALLS_ENDED",
    "CALLS_REFUSED",
    "CALLS_TOTAL",
    "TTS_FIRST_AUDIO",
    "UTTERANCES",
]

CALLS_ACTIVE = Gauge("voxgate_calls_active", "Calls (Converse/StreamingRecognize) in progress.")
CALLS_TOTAL = Counter("voxgate_calls_total", "Calls started, by RPC.", ["rpc"])
CALLS_ENDED = Counter("voxgate_calls_ended_total", "Calls ended, by outcome.", ["outcome"])
CALLS_REFUSED = Counter(
    "voxgate_calls_refused_total",
    "Calls refused at admission (capacity or shutdown), by reason.",
    ["reason"],
)
UTTERANCES = Counter("voxgate_utterances_total", "Utterances recognised, by outcome.", ["outcome"])
ASR_FINAL_LATENCY = Histogram(
    "voxgate_asr_final_latency_seconds",
    "End of speech to final transcript.",
    buckets=(0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0),
)
ASR_SPECULATIVE = Counter(
    "voxgate_asr_speculative_finals_total",
    "Final decodes started before the hangover ended, by outcome (used, discarded, cancelled).",
    ["outcome"],
)
ASR_BATCH_SIZE = Histogram(
    "voxgate_asr_batch_size", "Items per engine call.", buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
)
ASR_QUEUE_DEPTH = Gauge("voxgate_asr_queue_depth", "Utterances waiting for the engine.")
TTS_FIRST_AUDIO = Histogram(
    "voxgate_tts_first_audio_seconds",
    "Speak received to first audio frame ready.",
    buckets=(0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0),
)
