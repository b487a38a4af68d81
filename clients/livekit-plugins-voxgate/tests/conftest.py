"""A real voxgate server for the session, and recorded speech as LiveKit audio frames."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from livekit import rtc

from voxgate_client import read_wav, sample_call_path
from voxgate_client.testing import FlakyNetwork, LocalServer


@pytest.fixture(scope="session")
def server() -> Iterator[LocalServer]:
    with LocalServer() as srv:
        yield srv


#: The idle timeout of ``short_idle_server``, s: an input silent for longer loses its stream.
IDLE_TIMEOUT_S = 2.0


@pytest.fixture(scope="session")
def short_idle_server() -> Iterator[LocalServer]:
    """A second real server, the default configuration but for a short ``idle_timeout_s``, so
    that a test can have the server end a stream mid-call (DEADLINE_EXCEEDED) in seconds."""
    with LocalServer(config_yaml=f"limits:\n  idle_timeout_s: {IDLE_TIMEOUT_S}\n") as srv:
        yield srv


# What the test modules take from here; FlakyNetwork (a relay whose connections fail) is the
# client library's, shared with the Pipecat service's tests.
__all__ = ["IDLE_TIMEOUT_S", "FlakyNetwork", "frames"]


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
