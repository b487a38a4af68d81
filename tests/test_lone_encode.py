"""A lone final encoded on every core (issue 38).

On the CPU plan each of the two workers runs CTranslate2 on one thread. The final of a call
alone on the server (``AsrRequest.alone``, which the servicer sets: tests/test_alone_on_server.py)
whose worker is the only busy one encodes on a second replica with ``lone_encode_threads``
threads (the other core would sit idle while the caller waits); interims, finals of calls that
are not alone, and finals while another worker decodes stay on their one thread. The two
replicas' encoder outputs are identical, so the text is too. Real bundled model; which replica
ran is read from the engine's counters, never from timing.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import read_wav_int16
from voxgate.engines.asr._whisper import WhisperEngine
from voxgate.engines.asr.base import AsrOptions, AsrRequest, AsrResult
from voxgate.engines.asr.config import WhisperConfig
from voxgate.gateway.testing.signals import stats_for

CLIP = "librispeech_1988-24833-0000.wav"
#: The CPU plan's shape on two cores (gateway/runtime/_hub.py): two workers of one thread.
PLAN = {"inter_threads": 2, "intra_threads": 1}


@pytest.fixture(scope="module")
def engine() -> Iterator[WhisperEngine]:
    eng = WhisperEngine.load({**PLAN, "lone_encode_threads": 2})
    eng.warmup()
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def audio(speech_dir: Path) -> np.ndarray:
    pcm, _ = read_wav_int16(speech_dir / CLIP)
    return pcm.astype(np.float32) / 32768.0


def decode(
    engine: WhisperEngine, audio: np.ndarray, *, final: bool = True, alone: bool = True
) -> AsrResult:
    req = AsrRequest(
        audio, stats_for(audio), AsrOptions(language="en"), is_final=final, alone=alone
    )
    return engine.infer_batch([req])[0]


@pytest.mark.model
def test_a_final_alone_encodes_on_the_wide_replica_and_says_the_same(
    engine: WhisperEngine, audio: np.ndarray
) -> None:
    engine.counters.reset()
    wide = decode(engine, audio)
    assert engine.counters.lone_encodes == 1
    narrow = WhisperEngine.load({**PLAN, "lone_encode_threads": 1})
    try:
        assert narrow._lone is None
        narrow.warmup()
        same = decode(narrow, audio)
        assert narrow.counters.lone_encodes == 0
    finally:
        narrow.close()
    assert wide.text == same.text
    assert wide.text


@pytest.mark.model
def test_interims_finals_of_calls_not_alone_and_beside_another_worker_keep_one_thread(
    engine: WhisperEngine, audio: np.ndarray
) -> None:
    engine.counters.reset()
    decode(engine, audio[:16000], final=False)
    assert engine.counters.lone_encodes == 0
    decode(engine, audio, alone=False)  # another call is on the server
    assert engine.counters.lone_encodes == 0
    # Another worker (a sibling over the same model) is inside a decode round.
    other = engine.sibling()
    assert other._lone is engine._lone
    with other._occupancy.held():
        decode(engine, audio)
    assert engine.counters.lone_encodes == 0
    decode(engine, audio)  # and alone again once it is done
    assert engine.counters.lone_encodes == 1


@pytest.mark.unit
def test_the_wide_replica_is_for_the_cpu_with_cores_to_spare(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert WhisperConfig(**PLAN).resolved_lone_encode_threads == 2  # auto: the machine's cores
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert WhisperConfig(**PLAN).resolved_lone_encode_threads == 0  # one core: nothing to add
    assert WhisperConfig(**PLAN, lone_encode_threads=4).resolved_lone_encode_threads == 4
    assert WhisperConfig(**PLAN, lone_encode_threads=1).resolved_lone_encode_threads == 0
    # Workers that already have every thread, or a GPU: no second replica.
    assert WhisperConfig(intra_threads=8, lone_encode_threads=4).resolved_lone_encode_threads == 0
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert WhisperConfig().resolved_lone_encode_threads == 0  # CTranslate2's default: all cores
    gpu = WhisperConfig(device="cuda", lone_encode_threads=4)
    assert gpu.resolved_lone_encode_threads == 0
