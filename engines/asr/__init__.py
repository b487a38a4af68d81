"""Whisper speech recognition (CTranslate2 called directly on batches)."""

from __future__ import annotations

from engines.asr.base import (
    AsrAlternative,
    AsrEngine,
    AsrOptions,
    AsrRequest,
    AsrResult,
    AsrWord,
)

__all__ = ["AsrAlternative", "AsrEngine", "AsrOptions", "AsrRequest", "AsrResult", "AsrWord"]
