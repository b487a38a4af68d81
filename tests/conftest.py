"""Shared fixtures: where the recorded speech lives and how to read it."""

from __future__ import annotations

import json
import shutil
import wave
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Real recorded speech with references; laid beside the checkout (and in CI) as ../shared/data.
SPEECH_DIR = REPO_ROOT.parent / "shared" / "data" / "speech"


@pytest.fixture(scope="session")
def speech_dir() -> Path:
    """The shared speech set; its absence is an error, never a silent skip."""
    if not (SPEECH_DIR / "manifest.jsonl").is_file():
        pytest.fail(
            f"shared speech data not found at ../shared/data/speech (looked in {SPEECH_DIR})"
        )
    return SPEECH_DIR


@pytest.fixture(scope="session")
def manifest(speech_dir: Path) -> list[dict[str, Any]]:
    """The 40 clips' manifest rows."""
    with (speech_dir / "manifest.jsonl").open() as f:
        return [json.loads(line) for line in f if line.strip()]


def read_wav_int16(path: Path) -> tuple[np.ndarray, int]:
    """Read a mono 16-bit WAV as int16 samples and its rate."""
    with wave.open(str(path), "rb") as w:
        assert w.getnchannels() == 1 and w.getsampwidth() == 2, path
        data = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").copy()
        return data, w.getframerate()


@pytest.fixture(scope="session")
def sipp() -> str:
    """The SIPp binary: the real SIP caller. Its absence fails the test (CI installs it)."""
    from voxgate.bridges.sip.testing import sipp_binary

    path = sipp_binary()
    if path is None:
        pytest.fail("SIPp not found: apt-get install -y sip-tester (.ci/run does this)")
    return str(path)


@pytest.fixture(scope="session")
def flite() -> str:
    """The flite binary: the benchmarks' held-out voices. Its absence fails the test (CI
    installs it), so that the voices the training never hears are never silently missing."""
    path = shutil.which("flite")
    if path is None:
        pytest.fail("flite not found: apt-get install -y flite (.ci/run does this)")
    return path


#: Every test says which tier it is (pyproject's markers); ``-m`` selects tiers by them.
TIERS = frozenset({"unit", "component", "e2e", "model", "gpu"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Refuse to run a suite with a test that names no tier: ``-m unit`` would skip it silently."""
    untiered = [item.nodeid for item in items if not TIERS & {m.name for m in item.iter_markers()}]
    if untiered:
        shown = ", ".join(untiered[:5]) + (" ..." if len(untiered) > 5 else "")
        raise pytest.UsageError(
            f"{len(untiered)} test(s) without a tier marker ({', '.join(sorted(TIERS))}): {shown}"
        )
