"""Whisper speech recognition (CTranslate2 called directly on batches).

Public surface: the contract (:mod:`voxgate.engines.asr.base`), the configuration
(:mod:`voxgate.engines.asr.config`), the engine and the model-file helpers re-exported here. The
``_private`` modules (engine, decoding policy, word alignment, model files) may change.
"""

from __future__ import annotations

from voxgate.engines.asr._model_files import (
    BUNDLED_MODELS,
    ModelFilesError,
    default_cache_dir,
    join_base_model,
    resolve_model_dir,
)
from voxgate.engines.asr._phrases import MAX_BOOST
from voxgate.engines.asr._select import load_asr_engine
from voxgate.engines.asr._whisper import EngineCounters, WhisperEngine
from voxgate.engines.asr.base import (
    AsrAlternative,
    AsrEngine,
    AsrOptions,
    AsrRequest,
    AsrResult,
    AsrWord,
)
from voxgate.engines.asr.config import WhisperConfig

__all__ = [
    "BUNDLED_MODELS",
    "MAX_BOOST",
    "AsrAlternative",
    "AsrEngine",
    "AsrOptions",
    "AsrRequest",
    "AsrResult",
    "AsrWord",
    "EngineCounters",
    "ModelFilesError",
    "WhisperConfig",
    "WhisperEngine",
    "default_cache_dir",
    "join_base_model",
    "load_asr_engine",
    "resolve_model_dir",
]
