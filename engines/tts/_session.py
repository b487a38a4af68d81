"""ONNX Runtime sessions: execution-provider choice with a clean fallback to CPU."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import onnxruntime as ort

__all__ = ["ProviderSpec", "make_session", "select_providers"]

_LOGGER = logging.getLogger(__name__)

ProviderSpec = str | tuple[str, dict[str, str]]

TRT = "TensorrtExecutionProvider"
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def _with_options(name: str, trt_cache_dir: str, device_id: int) -> ProviderSpec:
    if name == TRT:
        # FP16 halves HiFi-GAN's cost on tensor cores; the engine cache avoids a multi-minute
        # rebuild on every start (TensorRT builds one engine per input-shape profile).
        return (
            TRT,
            {
                "trt_fp16_enable": "True",
                "trt_engine_cache_enable": "True",
                "trt_engine_cache_path": trt_cache_dir,
                "device_id": str(device_id),
            },
        )
    if name == CUDA:
        # Exhaustive cuDNN search re-runs for every new window length; heuristics do not.
        return (CUDA, {"cudnn_conv_algo_search": "HEURISTIC", "device_id": str(device_id)})
    return name


def select_providers(
    available: Sequence[str],
    requested: Sequence[str] | None = None,
    trt_cache_dir: str | None = None,
    device_id: int = 0,
) -> list[ProviderSpec]:
    """Decide the provider list for a session.

    Args:
        available: what the installed runtime offers (``ort.get_available_providers()``).
        requested: explicit preference order from ``TtsConfig.providers``; ``None`` = automatic
            (TensorRT, then CUDA, when the runtime has them).
        trt_cache_dir: TensorRT engine cache; ``None`` = ``~/.cache/voxgate/trt``.
        device_id: the GPU (as CUDA numbers them in this process) for TensorRT/CUDA; lets the
            voice run on a different GPU than Whisper (``WhisperConfig.device_index``).

    Returns:
        Providers in preference order, with their options, always ending with CPU so that any
        node the accelerator cannot run (and any machine without one) still works. Requested
        providers the runtime lacks are dropped with a warning instead of failing start-up.
    """
    cache = trt_cache_dir or str(Path("~/.cache/voxgate/trt").expanduser())
    wanted = list(requested) if requested is not None else [TRT, CUDA]
    chosen: list[ProviderSpec] = []
    for name in wanted:
        if name == CPU:
            continue
        if name not in available:
            if requested is not None:
                _LOGGER.warning("execution provider %s is not available; skipping it", name)
            continue
        chosen.append(_with_options(name, cache, device_id))
    chosen.append(CPU)
    return chosen


def make_session(model: bytes, providers: list[ProviderSpec], threads: int) -> ort.InferenceSession:
    """Create a session, falling back to CPU alone if an accelerator fails to initialise.

    An accelerator that is *listed* can still fail at session creation (missing CUDA/TensorRT
    libraries, no device visible): a voice gateway should then serve from CPU and say so in the
    log, not refuse to start.
    """
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Spinning worker threads burn the cores that concurrent calls need.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        session = ort.InferenceSession(model, sess_options=options, providers=providers)
    except Exception as error:  # noqa: BLE001 - any provider failure means "retry on CPU"
        if providers == [CPU]:
            raise
        _LOGGER.warning("ONNX Runtime providers %s failed (%s); using CPU", providers, error)
        session = ort.InferenceSession(model, sess_options=options, providers=[CPU])
    _LOGGER.info("ONNX Runtime session on %s", session.get_providers())
    return session
