"""Which recognition engine a configuration gets: CTranslate2, or PyTorch only when chosen.

``WhisperConfig.engine`` names it. The PyTorch engine is imported here and nowhere else on the
server's path, inside the function, so a CPU install without the ``torch`` extra never imports
torch (the import-linter contract "the server never imports adapt" allows exactly this module
and ``voxgate.engines.asr._torch`` to reach it).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from voxgate.engines.asr._whisper import WhisperEngine
from voxgate.engines.asr.config import WhisperConfig

__all__ = ["load_asr_engine"]


def load_asr_engine(
    config: WhisperConfig, *, clock: Callable[[], float] = time.monotonic
) -> WhisperEngine:
    """Load (not warm) the engine ``config.engine`` names.

    Raises:
        voxgate.engines.asr._model_files.ModelFilesError: model files missing or corrupt.
        ModuleNotFoundError: ``engine='torch'`` without torch installed (the ``torch`` extra).
    """
    if config.engine == "torch":
        try:
            # Lazy on purpose: torch is an optional extra and a multi-second import.
            from voxgate.engines.asr._torch.engine import TorchWhisperEngine  # noqa: PLC0415
        except ModuleNotFoundError as error:
            raise ModuleNotFoundError(
                f"asr.engine='torch' needs PyTorch ({error}); install the extra: "
                "pip install 'voxgate[torch]'"
            ) from error
        return TorchWhisperEngine.load(config, clock=clock)
    return WhisperEngine.load(config, clock=clock)
