"""Section 1: the environment (versions, CUDA devices, ONNX Runtime providers, nvidia-smi)."""

from __future__ import annotations

import platform
import shutil
import subprocess
import sys
from typing import Any

import ctranslate2
import numpy as np

from benchmarks.gpu_check.common import cpu_count, version

__all__ = ["environment", "nvidia_smi"]


def nvidia_smi() -> dict[str, Any]:
    """GPUs, driver and MIG state from ``nvidia-smi``; ``{"present": False}`` without it."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"present": False}
    fields = "index,name,memory.total,driver_version,mig.mode.current,compute_cap"
    out: dict[str, Any] = {"present": True, "gpus": []}
    try:
        query = subprocess.run(
            [exe, f"--query-gpu={fields}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        for line in query.stdout.strip().splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) >= 5:
                out["gpus"].append(
                    {
                        "index": parts[0],
                        "name": parts[1],
                        "memory_total_mib": parts[2],
                        "driver": parts[3],
                        "mig_mode": parts[4],
                        "compute_cap": parts[5] if len(parts) > 5 else "",
                    }
                )
        listing = subprocess.run(
            [exe, "-L"], capture_output=True, text=True, timeout=30, check=False
        )
        out["devices"] = listing.stdout.strip().splitlines()
        out["mig_devices"] = [d.strip() for d in out["devices"] if d.strip().startswith("MIG")]
        full = subprocess.run([exe], capture_output=True, text=True, timeout=30, check=False)
        out["raw"] = full.stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        out["error"] = repr(error)
    return out


def environment() -> dict[str, Any]:
    """Versions, devices and providers of this machine.

    ONNX Runtime may be absent (the offline bundle runs without the TTS section): its fields
    are then None and it offers no providers.
    """
    try:
        import onnxruntime as ort
    except ModuleNotFoundError:
        ort = None

    cuda_count = int(ctranslate2.get_cuda_device_count())
    compute_types: dict[str, list[str]] = {
        "cpu": sorted(ctranslate2.get_supported_compute_types("cpu"))
    }
    if cuda_count:
        compute_types["cuda"] = sorted(ctranslate2.get_supported_compute_types("cuda"))
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_cores": cpu_count(),
        "ctranslate2": ctranslate2.__version__,
        "onnxruntime": None if ort is None else ort.__version__,
        "onnxruntime_device": None if ort is None else ort.get_device(),
        "ort_providers": [] if ort is None else list(ort.get_available_providers()),
        "onnx": version("onnx"),
        "numpy": np.__version__,
        "torch": version("torch"),
        "transformers": version("transformers"),
        "faster_whisper": version("faster-whisper"),
        "ct2_cuda_devices": cuda_count,
        "ct2_compute_types": compute_types,
        "nvidia_smi": nvidia_smi(),
    }
