"""Constants and small helpers shared by the gpu_check sections."""

from __future__ import annotations

import importlib.metadata
import os
import sys
import time

from benchmarks._stats import percentile

__all__ = [
    "ASR_RATE",
    "CPU",
    "CUDA",
    "FULL_WINDOW_FRAMES",
    "SCHEMA_VERSION",
    "TRT",
    "TTS_TEXTS",
    "UTTERANCE_TEXTS",
    "Budget",
    "cpu_count",
    "log",
    "percentile",
    "version",
]

#: Version of the JSON layout written by ``--out``; bump on incompatible changes.
SCHEMA_VERSION = 1
ASR_RATE = 16_000
FULL_WINDOW_FRAMES = 3000
TRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"

#: Utterances for the capacity simulation (1.5-4 s each when spoken by the bundled voice).
UTTERANCE_TEXTS = (
    "Hi, I'd like to check on my order please.",
    "Yes, that's right.",
    "Can you tell me when the package will arrive at my house?",
    "My account number is four five six seven.",
    "No, I don't think that's correct, could you check again?",
    "Thanks, that's all I needed today.",
)
#: First sentences of bot replies for the TTS first-audio measurement.
TTS_TEXTS = (
    "Sure, I can help you with that right away.",
    "Your order shipped yesterday and should arrive on Tuesday.",
    "Let me check that for you.",
    "I'm sorry, I didn't catch that, could you say it again?",
    "The total comes to forty two dollars and fifty cents.",
)


class Budget:
    """A wall-clock budget shared by the sections, so a slow one cannot starve the report."""

    def __init__(self, seconds: float) -> None:
        self.start = time.perf_counter()
        self.seconds = seconds

    @property
    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.start

    @property
    def left(self) -> float:
        """Seconds left (never negative)."""
        return max(0.0, self.seconds - self.elapsed)


def log(message: str) -> None:
    """Progress goes to stderr so that stdout carries only the table (and the worker's JSON)."""
    print(f"[gpu_check] {message}", file=sys.stderr, flush=True)


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
