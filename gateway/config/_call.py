"""How each call runs, as the server's defaults a call's config may override.

VAD and endpointing, keypad tones, barge-in, interim language, turns and the session's own
settings.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import Field, model_validator

from voxgate.gateway.barge_in import DEFAULT_BACKCHANNELS
from voxgate.gateway.config._frozen import EchoCancellerName, _Frozen

__all__ = [
    "BargeInConfig",
    "DtmfConfig",
    "LanguageConfig",
    "SessionConfig",
    "TurnsConfig",
    "VadConfig",
]


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
        1_800,
        ge=200,
        le=10_000,
        description="'smart': the longest pause held over an unfinished sentence, ms. 1,800 "
        "holds a sentence Whisper left open (p 0.35) over 1.24 s and a clause the words "
        "call unfinished over up to 1.8 s; on a line whose floor is right, 1,600 ended more "
        "turns too soon on the pause set than the 600 ms hangover did (docs/turns.md).",
    )
    decode_after_ms: int = Field(
        80,
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
    whole_text: bool = Field(
        True,
        description="'smart': decode a turn of two or more utterances again as one while it may "
        "end (from spare capacity); its EndOfTurn text is that decode when it is back by the "
        "time the turn ends, else the finals joined. A pause splits a sentence into utterances "
        "decoded apart ('The codon is chest.' for 'The cut on his chest'); with it the turn "
        "benchmark's pause set had a turn WER of 0.070 against 0.100, the end of turn unmoved "
        "(docs/turns.md).",
    )
    smart_turn_model: str = Field(
        "auto",
        description="The audio end-of-turn model (Smart Turn v3 ONNX, BSD-2-Clause): 'auto' "
        "for the installed pipecat-ai's copy where the turn extra brought it (pip install "
        "'voxgate[turn]'), else none; 'pipecat' for that copy or a start-up error; a path to "
        "the .onnx file or to the pipecat-ai wheel that ships it (read, never imported); or '' "
        "for none (silence and words only).",
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
