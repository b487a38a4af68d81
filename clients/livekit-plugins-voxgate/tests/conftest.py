"""A real voxgate server for the session, and recorded speech as LiveKit audio frames."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from livekit import rtc
from voxgate_client import read_wav, sample_call_path
from voxgate_client.testing import LocalServer


@pytest.fixture(scope="session")
def server() -> Iterator[LocalServer]:
    with LocalServer() as srv:
        yield srv


@pytest.fixture(scope="session")
def sample_call() -> tuple[np.ndarray, int]:
    """The bundled 19 s two-utterance recording (16 kHz PCM16): JFK, then LJ Speech."""
    return read_wav(sample_call_path())


def frames(pcm: np.ndarray, rate: int, chunk_ms: int = 100) -> list[rtc.AudioFrame]:
    step = rate * chunk_ms // 1000
    return [
        rtc.AudioFrame(pcm[i : i + step].tobytes(), rate, 1, len(pcm[i : i + step]))
        for i in range(0, len(pcm), step)
    ]
