"""What one replica takes on.

Per-call limits, cross-call batching, admission from capacity and the load-adaptive quality
ladder.
"""

from __future__ import annotations

from pydantic import Field

from voxgate.gateway.config._frozen import _Frozen

__all__ = ["AdmissionConfig", "BatcherConfig", "DegradeConfig", "LimitsConfig"]


class LimitsConfig(_Frozen):
    """Per-call limits that protect the server from one misbehaving client."""

    max_chunk_bytes: int = Field(
        64_000, ge=320, description="Largest accepted AudioChunk.data, bytes (2 s of 16 kHz PCM16)."
    )
    max_realtime_factor: float = Field(
        4.0,
        ge=1.0,
        description="Audio may arrive at most this many times faster than real time (measured "
        "after a burst allowance, with real time counted from the call's stream opening).",
    )
    burst_allowance_ms: int = Field(
        5_000, ge=0, description="Audio a client may send ahead of real time before pacing, ms."
    )
    max_hotwords: int = Field(
        100,
        ge=0,
        le=10_000,
        description="Hotwords a call may give (decoding.hotwords); they share Whisper's "
        "previous-text window with the prompt.",
    )
    max_context_chars: int = Field(
        2_000,
        ge=0,
        le=100_000,
        description="Characters of decoding.initial_prompt plus all hotwords, per call.",
    )
    max_prompt_tokens: int = Field(
        223,
        ge=0,
        le=223,
        description="Whisper tokens the prompt and hotwords may take together; Whisper's "
        "previous-text window holds 223.",
    )
    max_id_chars: int = Field(
        128,
        ge=1,
        le=4_096,
        description="Longest client-chosen id or name (call_id, speak_id, mark name), characters.",
    )
    max_queued_speaks: int = Field(32, ge=1, description="Speak requests queued per call.")
    max_concurrent_calls: int = Field(
        200, ge=1, description="Calls served at once; more are refused with RESOURCE_EXHAUSTED."
    )
    first_message_timeout_s: float = Field(
        10.0,
        ge=0.0,
        le=600.0,
        description="A stream must send its `config` within this, s (0 = no limit); idle "
        "streams must not hold call slots (DEADLINE_EXCEEDED).",
    )
    idle_timeout_s: float = Field(
        60.0,
        ge=0.0,
        le=86_400.0,
        description="A call that sends no audio for this long is ended, s (0 = no limit); a "
        "phone line sends audio all the time, so silence from the client means it is gone.",
    )
    max_call_duration_s: float = Field(
        4 * 3600.0,
        ge=0.0,
        le=7 * 86_400.0,
        description="Longest call, s (0 = no limit); at the limit the call ends like a "
        "shutdown: the open utterance's final is delivered, then DEADLINE_EXCEEDED.",
    )
    write_stall_timeout_s: float = Field(
        10.0,
        ge=0.0,
        le=3_600.0,
        description="A write to the client that does not complete within this ends the call "
        "(or Synthesize stream) with DEADLINE_EXCEEDED, s (0 = no limit); a client that stops "
        "reading holds its call slot and buffers otherwise.",
    )
    max_synthesis_s: float = Field(
        600.0,
        ge=1.0,
        le=86_400.0,
        description="Longest audio one Speak or Synthesize may produce, s; a reply that would "
        "be longer is cut at exactly this length and the client is told (an ErrorEvent on "
        "Converse, INVALID_ARGUMENT after the audio on Synthesize).",
    )


class BatcherConfig(_Frozen):
    """Cross-call micro-batching of recognition work."""

    max_batch_size: int = Field(
        0,
        ge=0,
        le=64,
        description="Items per engine call; 0 = auto. The one batch size: the engine is built "
        "with it too (it chunks larger batches and joins running ones up to it).",
    )
    workers: int = Field(0, ge=0, le=16, description="Parallel engine workers; 0 = auto.")
    max_wait_ms: float = Field(
        0.0, ge=0.0, le=1_000.0, description="Extra wait to fill a batch, ms; 0 never delays."
    )
    max_queue_size: int = Field(
        256, ge=1, description="Queued utterances; more are refused with RESOURCE_EXHAUSTED."
    )
    batch_timeout_s: float = Field(
        30.0,
        ge=0.0,
        le=3_600.0,
        description="A batch still running after this long is a hung engine: its utterances "
        "fail with DEADLINE_EXCEEDED (error events; the calls go on) and the worker gets a "
        "fresh thread and engine, s (0 = never). A normal batch takes well under 5 s on CPU.",
    )
    join_running: bool = Field(
        False,
        description="Iteration-level batching: an utterance that arrives while every worker "
        "decodes joins a running batch of its kind at the next decode step, and each result "
        "returns the moment its utterance is done (batch_timeout_s then counts from the last "
        "step). Needs asr.decode_loop.always (our own decode loop, which is what can take new "
        "items mid-batch); off by default because on CPU that loop is slower than "
        "CTranslate2's generate (docs/decode_loop.md has the measurements).",
    )
    engine_nice: int = Field(
        12,
        ge=0,
        le=19,
        description="The recogniser's engine threads (CTranslate2's, started when a model "
        "loads) run this many nice levels below the event loop; with the defaults also below "
        "the synthesis workers (session.tts_nice): on cores that replies and finals share, a "
        "reply's next window comes before a final (a late final is latency, a late window a "
        "gap in speech). Idle cores are theirs at any level (Linux; 0 = the loop's priority). "
        "Other processes in the gateway's scheduling group (its container, or login session "
        "with autogroup) outrank them too: set 0 where the gateway shares one with busy work "
        "(docs/architecture.md).",
    )
    numpy_blas_threads: int = Field(
        1,
        ge=0,
        le=256,
        description="Threads of NumPy's BLAS in the server's process (set when the engines "
        "load; process-wide). Its calls here are small (a decode's features), and OpenBLAS's "
        "helper threads spin for about 0.1 s after each at the loop's priority, above the "
        "engine threads: on 2 cores that spin delayed finals (gateway/priority.py "
        "limit_blas_threads). 0 = NumPy's own default (one per core).",
    )


class AdmissionConfig(_Frozen):
    """Admission from capacity, with latency as a guard (gateway/admission.py).

    ``limits.max_concurrent_calls`` stays the hard ceiling. Each call reserves one real-time
    call equivalent; the replica holds ``capacity_calls`` of them (calibrated at start and
    measured from live traffic when 0). The latency guard refuses only while the recogniser is
    busy past ``target_utilisation``; an idle replica always admits.
    """

    enabled: bool = Field(
        True, description="Admit by capacity; off = only max_concurrent_calls applies."
    )
    capacity_calls: int = Field(
        0,
        ge=0,
        le=100_000,
        description="Real-time calls this replica holds; 0 = calibrated at start from the "
        "engine's measured cost of a reference utterance, then measured from live traffic.",
    )
    reference_turn_s: float = Field(
        12.0,
        gt=0.0,
        le=600.0,
        description="The calibration's model of a real-time call: its caller speaks the "
        "5 s reference utterance once per this many seconds (a turn-taking call, the caller "
        "talking about 40 % of the time), s.",
    )
    reference_overhead: float = Field(
        1.5,
        ge=1.0,
        le=10.0,
        description="The calibration's factor for what a call costs besides one final per "
        "utterance (speculative finals that are discarded, interims, barge-in checks).",
    )
    realtime_slack_ms: int = Field(
        2_000,
        ge=0,
        le=600_000,
        description="A call whose audio runs more than this far ahead of its own clock is "
        "bulk (a file sent faster than real time): served from spare capacity at a later "
        "deadline, and not judged against the real-time latency target, ms.",
    )
    bulk_deadline_s: float = Field(
        10.0,
        gt=0.0,
        le=3_600.0,
        description="Deadline of a bulk call's final: real-time finals due sooner go first, "
        "and a bulk final never waits longer than this behind them, s.",
    )
    latency_budget_s: float = Field(
        1.5,
        gt=0.0,
        le=60.0,
        description="The p95 of end of speech -> final that admitted real-time calls are "
        "promised, s.",
    )
    refuse_at: float = Field(
        0.8,
        gt=0.0,
        le=1.0,
        description="While the recogniser is busy, refuse new calls once the real-time calls' "
        "recent p95 passes this fraction of latency_budget_s (headroom for admitted calls).",
    )
    max_queue_wait_s: float = Field(
        0.3,
        gt=0.0,
        le=60.0,
        description="Deprecated in v0.3, no effect: queue waits include bulk calls' backlog, "
        "which is no sign of overload; accepted so that existing configs load.",
    )
    target_utilisation: float = Field(
        0.75,
        gt=0.0,
        le=1.0,
        description="Engine utilisation the capacity admits up to (queueing delay grows "
        "sharply near 1); at or past it the latency guard and the ladder may act.",
    )
    max_synthesize_streams: int = Field(
        0,
        ge=0,
        le=1_024,
        description="Replies of calls and Synthesize streams synthesized at once before new "
        "Synthesize streams are refused; 0 = 6 per TTS thread. Recognition load never refuses "
        "synthesis.",
    )
    window_s: float = Field(
        5.0,
        ge=1.0,
        le=600.0,
        description="How far back 'recent' p95 and utilisation look, s (a refusal clears "
        "within about this long after the load goes).",
    )
    capacity_window_s: float = Field(
        60.0,
        ge=1.0,
        le=3_600.0,
        description="How far back live traffic prices a real-time call (engine busy time per "
        "call over several of its turns; one utterance's decode is no price), s.",
    )
    ramp_doubling: bool = Field(
        False,
        description="Slow start: the call count may at most double per window_s (from one "
        "call per recogniser worker), so a burst cannot get in before its cost is measured. "
        "Off by default: with short calls the mean stays low and it would refuse bursts on an "
        "idle replica; turn it on behind a balancer that retries elsewhere.",
    )
    min_samples: int = Field(
        5,
        ge=1,
        le=1_000,
        description="Real-time finals a recent p95 needs before it can refuse a call: a few "
        "slow finals are no evidence of overload.",
    )
    sample_interval_s: float = Field(
        0.5, gt=0.0, le=60.0, description="How often the load is sampled, s."
    )
    retry_after_ms: int = Field(
        2_000,
        ge=0,
        le=600_000,
        description="Retry hint sent with a refusal (grpc-retry-pushback-ms and RetryInfo), ms.",
    )
    health_when_full: bool = Field(
        True,
        description="Report the VoiceGateway service NOT_SERVING in grpc.health.v1 while this "
        "replica refuses new calls, so a health-checking balancer sends them elsewhere "
        "(the whole-server status '' stays SERVING: the process is alive).",
    )


class DegradeConfig(_Frozen):
    """The load-adaptive quality ladder (gateway/degrade.py).

    Shed in a fixed order only past measured capacity (the recogniser busy past
    ``admission.target_utilisation``, or more calls than the capacity counts) *and* with the
    real-time calls' recent p95 over ``latency_s``; restore with hysteresis. Calls are told
    (``QualityChanged`` on their stream).
    """

    enabled: bool = Field(True, description="Shed quality under load; off = never.")
    latency_s: float = Field(
        1.5,
        gt=0.0,
        le=60.0,
        description="Shed one step while the recent p95 end of speech -> final is above this, s.",
    )
    queue_wait_s: float = Field(
        0.5,
        gt=0.0,
        le=60.0,
        description="Deprecated in v0.3, no effect (queue waits include bulk calls' "
        "backlog); accepted so that existing configs load.",
    )
    restore_ratio: float = Field(
        0.5,
        gt=0.0,
        lt=1.0,
        description="Restore one step only once both signals are below this fraction of "
        "their thresholds (hysteresis).",
    )
    step_interval_s: float = Field(
        3.0,
        gt=0.0,
        le=600.0,
        description="Least time between two sheds, s: a step needs time to show its effect.",
    )
    restore_after_s: float = Field(
        15.0,
        gt=0.0,
        le=3_600.0,
        description="Signals must stay below the restore level this long before each restore, s.",
    )
