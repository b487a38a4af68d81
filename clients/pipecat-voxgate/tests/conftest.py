"""A real voxgate server for the session, and recorded speech as Pipecat audio frames."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from pipecat.frames.frames import Frame, InputAudioRawFrame
from pipecat.tests.utils import SleepFrame

from voxgate_client import read_wav, sample_call_path
from voxgate_client.testing import LocalServer


@pytest.fixture(scope="session")
def server() -> Iterator[LocalServer]:
    with LocalServer() as srv:
        yield srv


#: The idle timeout of ``short_idle_server``, s: a pipeline silent for longer loses its stream.
IDLE_TIMEOUT_S = 2.0


@pytest.fixture(scope="session")
def short_idle_server() -> Iterator[LocalServer]:
    """A second real server, the default configuration but for a short ``idle_timeout_s``, so
    that a test can have the server end a stream mid-call (DEADLINE_EXCEEDED) in seconds."""
    with LocalServer(config_yaml=f"limits:\n  idle_timeout_s: {IDLE_TIMEOUT_S}\n") as srv:
        yield srv


@pytest.fixture(scope="session")
def sample_call() -> tuple[np.ndarray, int]:
    """The bundled 19 s two-utterance recording (16 kHz PCM16): JFK, then LJ Speech."""
    return read_wav(sample_call_path())


def audio_frames(
    pcm: np.ndarray, rate: int, *, chunk_ms: int = 100, speed: float = 2.0
) -> list[Frame]:
    """The recording as 100 ms input frames, paced at ``speed`` x real time with SleepFrames.

    Pacing matters: the gateway refuses audio that arrives faster than its real-time limit
    (4x by default), exactly as it would from a real transport.
    """
    step = rate * chunk_ms // 1000
    frames: list[Frame] = []
    for i in range(0, len(pcm), step):
        frames.append(InputAudioRawFrame(pcm[i : i + step].tobytes(), rate, 1))
        frames.append(SleepFrame(sleep=chunk_ms / 1000 / speed))
    return frames
