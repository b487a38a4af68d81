"""Typed, validated server configuration.

Static settings are frozen pydantic models, one per component, composed into
:class:`GatewayConfig`, loaded once at start-up from (lowest to highest precedence) defaults, a
YAML file, ``VOXGATE_*`` environment variables and command-line flags. Per-request options come
from the proto and are validated by the servicer against the limits here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from voxgate.engines.asr.config import WhisperConfig
from voxgate.engines.tts.config import TtsConfig
from voxgate.gateway.barge_in import DEFAULT_BACKCHANNELS

__all__ = [
    "AdmissionConfig",
    "BargeInConfig",
    "BatcherConfig",
    "DegradeConfig",
    "ConfigError",
    "DtmfConfig",
    "EchoCancellerName",
    "EngineName",
    "GatewayConfig",
    "LanguageConfig",
    "LimitsConfig",
    "SecurityConfig",
    "ServerConfig",
    "SessionConfig",
    "TurnsConfig",
    "VadConfig",
    "load_config",
]

#: An engine a server can load.
EngineName = Literal["asr", "tts"]

#: How a call keeps the echo of its replies out (gateway/echo.py, docs/barge-in.md).
EchoCancellerName = Literal["gate", "gate_aec3", "aec3"]


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class VadConfig(_Frozen):
    """Voice activity detection and endpointing (server defaults; a call may override)."""

    model: Literal["silero", "webrtc"] = Field(
        "silero",
        description="The voice model: 'silero' (a small neural network, the ONNX file "
        "faster-whisper ships; ignores line hum, clicks and hiss) or 'webrtc' (webrtcvad's GMM, "
        "~5x cheaper, but it calls hum, clicks and keypad tones speech).",
    )
    speech_threshold: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="Voice confidence at which an unvoiced frame becomes voiced (silero's "
        "probability; webrtc answers 0 or 1).",
    )
    silence_threshold: float = Field(
        0.35,
        gt=0.0,
        le=1.0,
        description="Voice confidence below which a voiced frame becomes unvoiced (hysteresis; "
        "at most speech_threshold).",
    )
    plosive_tail: bool = Field(
        True,
        description="Count loud unvoiced frames within 300 ms after speech as its end (final "
        "plosives: 'interes-t'). Added for webrtcvad on μ-law; it pays with silero too (a "
        "call's μ-law 'interest' ends 11 ms from the truth with it, 251 ms early without).",
    )
    onset_backtrack: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Move the start of speech back over the loud frames just before the "
        "model's first voiced frame (at most 100 ms); 'auto' = on for silero, whose 32 ms "
        "windows confirm speech 40-120 ms after it begins, off for webrtc.",
    )
    end_refine: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Report the end of speech at the last voiced frame that stands above the "
        "noise floor (at most 160 ms before the model's last voiced frame); the audio and the "
        "hangover do not change. 'auto' = on for silero, whose probability stays up for a "
        "window or more after the last word, off for webrtc.",
    )
    aggressiveness: int = Field(
        3, ge=0, le=3, description="webrtcvad aggressiveness; 3 resists line noise best."
    )
    frame_ms: int = Field(20, description="Analysis frame in ms: 10, 20 or 30 (webrtcvad).")
    start_speech_ms: int = Field(
        100, ge=10, le=2000, description="Voiced time that confirms the start of speech, ms."
    )
    end_silence_ms: int = Field(
        600,
        ge=100,
        le=10_000,
        description="Silence that ends an utterance (hangover), ms. Natural pauses inside a "
        "sentence reach ~0.5 s, so lower values split sentences.",
    )
    min_speech_ms: int = Field(
        100,
        ge=0,
        le=10_000,
        description="Utterances with less voiced time are not transcribed, ms.",
    )
    max_utterance_ms: int = Field(
        28_000,
        ge=1_000,
        le=30_000,
        description="Forced cut, ms; at most Whisper's 30 s window.",
    )
    pre_roll_ms: int = Field(
        300, ge=0, le=2_000, description="Audio kept before the detected start of speech, ms."
    )
    call_start_lead_in_ms: int = Field(
        1_000,
        ge=0,
        le=5_000,
        description="A call's first utterance whose speech begins within this many ms of the "
        "call's first sample keeps all the audio from that sample on (0 = only pre_roll_ms): "
        "Silero, with no context yet, can read a first word spoken from the call's start as "
        "under its threshold, and the pre-roll then cut it off. SPEECH_BEGIN does not move.",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.frame_ms not in (10, 20, 30):
            raise ValueError(f"frame_ms={self.frame_ms} is not supported; use 10, 20 or 30")
        if self.silence_threshold > self.speech_threshold:
            raise ValueError(
                f"silence_threshold={self.silence_threshold} must not exceed "
                f"speech_threshold={self.speech_threshold}"
            )
        if self.max_utterance_ms <= self.start_speech_ms:
            raise ValueError(
                f"max_utterance_ms={self.max_utterance_ms} must exceed "
                f"start_speech_ms={self.start_speech_ms}"
            )
        return self


class DtmfConfig(_Frozen):
    """In-band keypad tones: detected in the caller's audio and kept away from the VAD."""

    inband: bool = Field(
        True,
        description="Detect DTMF tones in the inbound audio (Goertzel, ITU-T Q.24 rules), emit "
        "them as dtmf events and silence them for the VAD and the recogniser; costs 30 ms of "
        "delay on speech events. Off when the line sends RFC 4733 events and strips the tones.",
    )
    min_level_dbm0: float = Field(
        -36.0, ge=-60.0, le=0.0, description="Weakest tone accepted, per frequency, dBm0."
    )
    max_twist_db: float = Field(
        8.0, ge=0.0, le=20.0, description="High group this much weaker than low, at most, dB."
    )
    max_reverse_twist_db: float = Field(
        4.0, ge=0.0, le=20.0, description="High group this much stronger than low, at most, dB."
    )


class LimitsConfig(_Frozen):
    """Per-call limits that protect the server from one misbehaving client."""

    max_chunk_bytes: int = Field(
        64_000, ge=320, description="Largest accepted AudioChunk.data, bytes (2 s of 16 kHz PCM16)."
    )
    max_realtime_factor: float = Field(
        4.0,
        ge=1.0,
        description="Audio may arrive at most this many times faster than real time (measured "
        "after a burst allowance).",
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
        "gap in speech). Idle cores are theirs at any level (Linux; 0 = the loop's priority).",
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


class BargeInConfig(_Frozen):
    """Barge-in defaults for calls (a call's config and each Speak may override them)."""

    policy: Literal["immediate", "after_words", "never"] = Field(
        "immediate",
        description="What interrupts a reply: 'immediate' (caller speech begins), "
        "'after_words' (a transcript with min_words words that are not backchannels) or "
        "'never' (announcements).",
    )
    min_words: int = Field(
        1,
        ge=1,
        le=20,
        description="after_words: words a caller transcript needs to interrupt, backchannels "
        "not counted. One word is reached by the first interim (at first_interim_speech_ms of "
        "voiced speech) when it holds one; each more word costs about another interim.",
    )
    backchannels: tuple[str, ...] = Field(
        DEFAULT_BACKCHANNELS,
        max_length=200,
        description="after_words: listener responses that never interrupt ('mm-hmm', 'yeah', "
        "'okay', ...), matched case- and punctuation-insensitively as whole words, held "
        "letters as one ('Mmm' is 'mm'); hums ('Hmmm', 'M-M-M') and laughs ('haha') are no words.",
    )
    interim_interval_ms: int = Field(
        250,
        ge=100,
        le=5_000,
        description="after_words: interval of the interim decodes that run while the caller "
        "talks over such a reply (whether or not the call asked for interims), ms.",
    )
    first_interim_speech_ms: int = Field(
        200,
        ge=0,
        le=2_000,
        description="after_words: the first of those interims runs once the caller's utterance "
        "holds this much voiced audio, ms (asr.policy.min_speech_ms skips less as too short); "
        "the rest follow at interim_interval_ms.",
    )
    urgent_interims: bool = Field(
        True,
        description="after_words: schedule those interims as finals (no interim slot to wait "
        "for, ahead of other calls' interims): until one comes back, the caller and the bot "
        "talk at once.",
    )
    overlap_interim_ms: int = Field(
        0,
        ge=0,
        le=5_000,
        description="after_words: while one of those interims decodes, the next may start this "
        "long after it on an idle recognition worker (nothing waiting), at most two at once, so "
        "that a word the first prefix missed is heard up to a decode sooner; 0 (the default) = "
        "one at a time, each interim_interval_ms after the one before. On 2 CPU cores it does "
        "not pay: the two decodes and the reply's synthesis share the cores, and each decode "
        "slows (docs/barge-in.md); it is for machines with cores to spare.",
    )
    barge_in_model: bool = Field(
        True,
        description="after_words: decode the interims only this policy reads (the call did "
        "not ask for interims) with asr.barge_in_model when the server loads one and the call's "
        "language is one it speaks; False = with the call's own model.",
    )
    echo_guard: bool = Field(
        True,
        description="Suppress inbound audio that is the echo of the reply just played (line "
        "echo, speakerphones), so that it neither barges in nor opens utterances.",
    )
    echo_canceller: EchoCancellerName = Field(
        "gate_aec3",
        description="How echo_guard does it: 'gate_aec3' (the default) lets a gate choose the "
        "inbound blocks the reply explains and puts WebRTC's AEC3 output in their place, so "
        "that a caller quieter than the echo is heard through it (AEC3 starts only once the "
        "line has echoed); 'gate' silences those blocks (the cheapest: half the CPU on a line "
        "that echoes; a caller quieter than the echo is heard once louder than it); 'aec3', "
        "WebRTC's adaptive echo canceller alone, which also takes out echo a hybrid spreads "
        "over milliseconds but holds callers back on lines without echo (docs/barge-in.md "
        "compares them).",
    )


class LanguageConfig(_Frozen):
    """How interims of a call that sets no language choose one (finals always detect).

    Whisper's language detection on a short interim prefix (a barge-in's first 200-300 ms of
    voiced audio) is unreliable: English callers' prefixes came out Russian or Indonesian. A
    call therefore learns its language from its own finals, and until it has, interims use
    ``interim_default`` when the server sets one (docs/language.md has the measurements).
    """

    learn: bool = Field(
        True,
        description="Interims of a call without a configured language decode in the language "
        "of its last final detected with at least learn_min_probability (finals keep "
        "detecting: a caller may switch language).",
    )
    learn_min_probability: float = Field(
        0.8,
        ge=0.0,
        le=1.0,
        description="Detection probability a final needs to teach the call its language.",
    )
    interim_default: str = Field(
        "",
        pattern=r"^([a-z]{2,3})?$",
        description="Language (ISO 639-1) of the interims of a call that sets none, until a "
        "final taught it one; '' = detect, under the interim_detect_min_ms rule.",
    )
    interim_detect_min_ms: int = Field(
        0,
        ge=0,
        le=30_000,
        description="Before the call has a language, an interim on a prefix shorter than this "
        "(ms of audio) is detected but used only if its detection probability is at least "
        "interim_min_probability; 0 = always used (the default: on 200-450 ms prefixes the "
        "probability does not tell right from wrong detections, and the rule cost after_words "
        "barge-ins one or two interims; 1500 is the value measured in docs/language.md).",
    )
    interim_min_probability: float = Field(
        0.7,
        ge=0.0,
        le=1.0,
        description="Detection probability a short-prefix interim needs (see "
        "interim_detect_min_ms).",
    )


class TurnsConfig(_Frozen):
    """End-of-turn detection defaults (gateway/turns.py); a call may choose its own."""

    mode: Literal["off", "silence", "smart"] = Field(
        "off",
        description="Default turn detection of calls that do not choose: 'off' (no EndOfTurn "
        "events), 'silence' (every utterance is a turn, ended by the VAD hangover) or 'smart' "
        "(silence, the words so far and, when smart_turn_model is set, the audio model).",
    )
    eagerness: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="'smart': how readily a turn ends; scales every hold (1 = at "
        "min_silence_ms whatever the words, 0 = twice the hold).",
    )
    min_silence_ms: int = Field(
        200,
        ge=100,
        le=2_000,
        description="'smart': the shortest silence that ends a turn, and the VAD hangover that "
        "ends each utterance of a turn (its final comes then; the turn may go on).",
    )
    max_pause_ms: int = Field(
        1_600,
        ge=200,
        le=10_000,
        description="'smart': the longest pause held over an unfinished sentence, ms.",
    )
    decode_after_ms: int = Field(
        120,
        ge=20,
        le=2_000,
        description="'smart': trailing silence after which an utterance's final decode starts "
        "(its words are then known when the utterance ends), ms.",
    )
    words: bool = Field(
        True,
        description="'smart': read the words so far (Whisper's punctuation, an unfinished "
        "clause); false leaves silence and the audio model alone (benchmarks.turn_taking's "
        "'audio' variant measures the model so).",
    )
    smart_turn_model: str = Field(
        "",
        description="The audio end-of-turn model (Smart Turn v3 ONNX, BSD-2-Clause): a path to "
        "the .onnx file or to the pipecat-ai wheel that ships it, 'pipecat' for the installed "
        "pipecat-ai distribution's copy (read, never imported), or '' for none (silence and "
        "words only).",
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if self.max_pause_ms < self.min_silence_ms:
            raise ValueError(
                f"max_pause_ms={self.max_pause_ms} must be at least "
                f"min_silence_ms={self.min_silence_ms}"
            )
        return self


class SessionConfig(_Frozen):
    """How each call runs (server defaults; a call's config may override the interim interval)."""

    @model_validator(mode="before")
    @classmethod
    def _removed_tts_scheduling(cls, data: Any) -> Any:
        # session.tts_scheduling chose between the deadline scheduler and the earlier FIFO pool
        # until v0.3; only the scheduler is left. Its old value is still read, the other named.
        if isinstance(data, dict) and "tts_scheduling" in data:
            data = dict(data)
            if data.pop("tts_scheduling") != "deadline":
                raise ValueError(
                    "session.tts_scheduling was removed: replies always run on the deadline "
                    "scheduler (the FIFO pool is gone; leave the setting out)"
                )
        return data

    interim_interval_ms: int = Field(
        1_000, ge=200, le=10_000, description="Default interval between interim transcripts, ms."
    )
    speculative_finals: bool = Field(
        True,
        description="Start an utterance's final decode once its trailing silence has settled "
        "(~320 ms) instead of after the whole hangover, when the recogniser is idle.",
    )
    playout_lead_ms: int = Field(
        60,
        ge=0,
        le=1_000,
        description="Synthesized audio leaves this far ahead of its playout time, ms; it absorbs "
        "network and scheduling jitter at the client.",
    )
    playout_prebuffer_ms: int = Field(
        60,
        ge=0,
        le=1_000,
        description="The first this many ms of a reply leave at once, and every later frame "
        "that much sooner, ms: a client that plays frames as they arrive then holds this much "
        "audio against jitter too (playout_lead_ms alone helps only a client that waits that "
        "long before it starts to play). Barge-in accounting still assumes playout "
        "playout_lead_ms after the first frame left.",
    )
    barge_in: BargeInConfig = Field(
        default_factory=BargeInConfig,  # type: ignore[arg-type]
        description=(
            "Barge-in policy and echo guard defaults (voxgate.gateway.config.BargeInConfig)."
        ),
    )
    language: LanguageConfig = Field(
        default_factory=LanguageConfig,  # type: ignore[arg-type]
        description="How interims of calls that set no language choose one "
        "(voxgate.gateway.config.LanguageConfig).",
    )
    turns: TurnsConfig = Field(
        default_factory=TurnsConfig,  # type: ignore[arg-type]
        description="End-of-turn detection defaults (voxgate.gateway.config.TurnsConfig).",
    )
    tts_threads: int = Field(
        0,
        ge=0,
        le=64,
        description="Synthesis worker threads shared by all calls; 0 = by device (one per CPU "
        "core, one on a GPU).",
    )
    tts_max_batch_size: int = Field(
        0,
        ge=0,
        le=64,
        description="Decoder windows of several replies per ONNX Runtime call; 0 = by device "
        "(1 on CPU, where batching does not pay; 8 on GPU).",
    )
    tts_max_lead_ms: int = Field(
        2_000,
        ge=0,
        le=600_000,
        description="A Converse reply is synthesized at most this far ahead of its playout, ms "
        "(0 = no limit; Synthesize streams are never held): the workers run above the "
        "recogniser's threads (batcher.engine_nice), and without a bound they would take the "
        "cores from finals due now for audio due many seconds later. A barge-in also throws "
        "away at most this much synthesis.",
    )
    tts_nice: int = Field(
        4,
        ge=0,
        le=19,
        description="Synthesis workers run this many nice levels below the event loop (which "
        "paces every reply's frames and runs every call's VAD and echo canceller) and below "
        "the first-audio thread, under 'deadline' scheduling (Linux; 0 = the same priority).",
    )


class ServerConfig(_Frozen):
    """Process-level settings: ports, lifecycle."""

    host: str = Field("127.0.0.1", description="Address to bind the gRPC port to.")
    port: int = Field(50051, ge=0, le=65535, description="gRPC port; 0 picks a free one.")
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="Prometheus /metrics port on ``metrics_host``; 0 picks a free one (as "
        "``port`` does); unset (null) serves no metrics. The address is logged at start-up.",
    )
    metrics_host: str = Field(
        "127.0.0.1",
        description="Address to bind /metrics to, apart from ``host``: plain HTTP without "
        "authentication, so it stays on loopback unless a scraper on another host needs it "
        "(containers: 0.0.0.0 behind a network policy; see docs/security.md).",
    )
    grace_s: float = Field(
        10.0, ge=0.0, le=600.0, description="SIGTERM drain period for active calls, s."
    )
    flush_s: float = Field(
        5.0,
        ge=0.0,
        le=120.0,
        description="After the grace period, time that calls still open get to deliver the "
        "final of their in-progress utterance (then UNAVAILABLE) before they are cancelled, s.",
    )
    log_format: str = Field("text", pattern="^(text|json)$", description="Log line format.")
    log_level: str = Field("INFO", description="Python logging level name.")
    # HTTP/2 connection lifetime. A call is one stream that may last hours; these settings find
    # dead peers and let balancers spread new calls without ever cutting a call in progress.
    keepalive_time_s: float = Field(
        30.0,
        ge=1.0,
        le=7_200.0,
        description="Ping a connection after this long without traffic, s: finds peers that "
        "vanished (a dropped NAT mapping, a crashed client) without waiting for TCP.",
    )
    keepalive_timeout_s: float = Field(
        20.0,
        ge=1.0,
        le=600.0,
        description="A ping not answered within this closes the connection and cancels its "
        "calls, s.",
    )
    keepalive_permit_without_calls: bool = Field(
        True,
        description="Accept client keepalive pings (and ping) while a connection has no call; "
        "clients that keep a warm channel between calls need this, or they get GOAWAY.",
    )
    min_client_ping_interval_s: float = Field(
        10.0,
        ge=0.0,
        le=3_600.0,
        description="Clients that ping more often than this without data are sent GOAWAY "
        "(too_many_pings), s; gRPC's default of 5 min would refuse common client settings.",
    )
    max_connection_idle_s: float = Field(
        900.0,
        ge=0.0,
        le=7 * 86_400.0,
        description="A connection with no call for this long is closed with GOAWAY, s (0 = "
        "never); clients reconnect on their next call, perhaps to another replica.",
    )
    max_connection_age_s: float = Field(
        1_800.0,
        ge=0.0,
        le=7 * 86_400.0,
        description="After this long (gRPC adds +-10% jitter) a connection gets GOAWAY, so new "
        "calls open a new connection and spread over replicas added since, s (0 = never). "
        "Calls in progress go on, see max_connection_age_grace_s.",
    )
    max_connection_age_grace_s: float | None = Field(
        None,
        ge=0.0,
        le=24 * 86_400.0,
        description="How long calls may go on over a connection past its max age before it is "
        "closed, s. Unset (the default): longer than any call can last "
        "(limits.max_call_duration_s plus a minute; forever when calls have no limit), so "
        "connection age never cuts a call.",
    )


def _readable_file(path: Path | None) -> Path | None:
    """Fail at start-up, naming the file, rather than at the first TLS handshake."""
    if path is None:
        return None
    try:
        with path.open("rb") as f:
            f.read(1)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    return path


class SecurityConfig(_Frozen):
    """TLS, mutual TLS and bearer tokens on the gRPC port (see docs/security.md).

    Token values never appear in a config file, a log line or an error message: the file or
    environment variable named here holds them, and errors name the entry by its position.
    """

    tls_cert: Path | None = Field(
        None, description="PEM server certificate chain; with tls_key, the port speaks TLS."
    )
    tls_key: Path | None = Field(None, description="PEM private key of tls_cert (unencrypted).")
    client_ca: Path | None = Field(
        None,
        description="PEM CA bundle for mutual TLS: when set, every client must present a "
        "certificate signed by it (the TLS handshake fails otherwise).",
    )
    tokens_file: Path | None = Field(
        None,
        description="YAML list of bearer tokens (each a string, or {token, tenant, max_calls}); "
        "re-read on SIGHUP. Setting it turns authentication on.",
    )
    tokens_env: str = Field(
        "VOXGATE_TOKENS",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable that may hold tokens in the same format (a plain "
        "comma-separated list works); when it is set, authentication is on.",
    )
    max_calls_per_token: int = Field(
        0,
        ge=0,
        description="Calls (Converse, StreamingRecognize, Synthesize) one token may have open "
        "at once on this replica, unless its entry sets max_calls; 0 = no per-token limit.",
    )
    open_health: bool = Field(
        True,
        description="grpc.health.v1 answers without a token (load balancers and kubelet "
        "probes carry none); false puts it behind the tokens too.",
    )
    reflection: bool = Field(
        True, description="Serve gRPC reflection (behind the tokens when they are on)."
    )

    _check_files = field_validator("tls_cert", "tls_key", "client_ca", "tokens_file")(
        _readable_file
    )

    @model_validator(mode="after")
    def _check(self) -> Self:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: set both for TLS, or neither")
        if self.client_ca is not None and self.tls_cert is None:
            raise ValueError("client_ca (mutual TLS) needs tls_cert and tls_key")
        return self


class GatewayConfig(BaseSettings):
    """Everything ``voxgate serve`` needs, composed from the component configs.

    Environment variables use the ``VOXGATE_`` prefix and ``__`` for nesting, e.g.
    ``VOXGATE_SERVER__PORT=50052`` or ``VOXGATE_VAD__END_SILENCE_MS=800``.
    """

    model_config = SettingsConfigDict(
        env_prefix="VOXGATE_", env_nested_delimiter="__", frozen=True, extra="forbid"
    )

    server: ServerConfig = Field(default_factory=ServerConfig)  # type: ignore[arg-type]
    vad: VadConfig = Field(default_factory=VadConfig)  # type: ignore[arg-type]
    dtmf: DtmfConfig = Field(default_factory=DtmfConfig)  # type: ignore[arg-type]
    limits: LimitsConfig = Field(default_factory=LimitsConfig)  # type: ignore[arg-type]
    batcher: BatcherConfig = Field(default_factory=BatcherConfig)  # type: ignore[arg-type]
    admission: AdmissionConfig = Field(default_factory=AdmissionConfig)  # type: ignore[arg-type]
    degrade: DegradeConfig = Field(default_factory=DegradeConfig)  # type: ignore[arg-type]
    session: SessionConfig = Field(default_factory=SessionConfig)  # type: ignore[arg-type]
    security: SecurityConfig = Field(default_factory=SecurityConfig)  # type: ignore[arg-type]
    asr: WhisperConfig = Field(
        default_factory=WhisperConfig,
        description="Whisper engine settings (voxgate.engines.asr.config.WhisperConfig).",
    )
    tts: TtsConfig = Field(
        default_factory=TtsConfig,
        description="Voice settings (voxgate.engines.tts.config.TtsConfig).",
    )
    engines: Annotated[frozenset[EngineName], NoDecode] = Field(
        frozenset({"asr", "tts"}),
        description="Engines to load: 'asr', 'tts', both ('asr,tts'), or 'none' (VAD only).",
    )

    @model_validator(mode="after")
    def _check_join_running(self) -> GatewayConfig:
        # Only a decode loop can take an utterance into a batch that has started (ours in
        # NumPy with decode_loop.always, or the torch engine's, always); with CTranslate2's
        # generate the setting would silently do nothing.
        loop = self.asr.decode_loop.always or self.asr.engine == "torch"
        if self.batcher.join_running and not loop:
            raise ValueError(
                "batcher.join_running needs asr.decode_loop.always: true or asr.engine: torch "
                "(only a decode loop can add an utterance to a running batch)"
            )
        return self

    @model_validator(mode="after")
    def _one_batch_size(self) -> GatewayConfig:
        # The engine's batch size used to be a second setting (asr.max_batch_size) that the
        # batcher did not read: the scheduler could form batches the engine then split, or
        # join fewer than it allowed. The runtime now builds the engine with the batcher's.
        if "max_batch_size" in self.asr.model_fields_set:
            raise ValueError(
                "asr.max_batch_size is not read: the batch size is batcher.max_batch_size, "
                "which the scheduler and the engine share"
            )
        return self

    @field_validator("engines", mode="before")
    @classmethod
    def _parse_engines(cls, value: Any) -> Any:
        """Accept the flag and environment form, "asr,tts" / "none", besides a list."""
        if isinstance(value, str):
            names = [n.strip() for n in value.split(",") if n.strip()]
            return frozenset() if names == ["none"] else frozenset(names)
        return value


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


class ConfigError(ValueError):
    """An invalid configuration; the message names every bad field by its path and the fix."""


def _describe(exc: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for err in exc.errors():
        path = ".".join(str(p) for p in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            fix = "unknown field; remove it or check its spelling (see gateway/config.py)"
        else:
            fix = err["msg"]
            if "input" in err and not isinstance(err["input"], dict | list):
                fix += f" (got {str(err['input'])[:64]!r})"
        lines.append(f"  {path}: {fix}")
    return "\n".join(lines)


def load_config(path: Path | None = None, overrides: dict[str, Any] | None = None) -> GatewayConfig:
    """Build the config: defaults < YAML file < environment < ``overrides`` (from flags).

    Raises:
        ConfigError: the file cannot be read or parsed, or any field at any depth is invalid;
            the message lists each field by its dotted path with the fix.
    """
    file_data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text())
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from None
        if loaded is not None and not isinstance(loaded, dict):
            kind = type(loaded).__name__
            raise ConfigError(f"config file {path} must hold a mapping, not {kind}")
        file_data = loaded or {}
    # Environment beats the file: read the env-only view, then layer flags on top.
    try:
        env_only = GatewayConfig.model_validate({}).model_dump(exclude_defaults=True)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, "VOXGATE_* environment variables")) from None
    data = _merge(_merge(file_data, env_only), overrides or {})
    try:
        return GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, str(path) if path else "flags and environment")) from None
