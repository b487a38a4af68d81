"""The benchmarks lay out Whisper workers as the gateway does: one model, siblings, one max_length.

On a tiny random-weight model (built in a second by benchmarks/gpu_check), so no timing and no
real speech: what is checked is the layout and that every worker decodes with the engine's own
calibrated ``max_length``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import benchmarks.gpu_check as gc
from benchmarks.asr_capacity import _worker_engines
from voxgate.engines.asr._whisper import WhisperEngine
from voxgate.engines.asr.base import AsrOptions, AsrRequest

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return gc.build_random_spec(gc.TINY, tmp_path_factory.mktemp("tiny") / "m", "int8")


def _request() -> AsrRequest:
    audio = np.zeros(16_000, dtype=np.float32)
    options = AsrOptions(language="en", silence_aware=False, word_timestamps=False)
    return AsrRequest(audio, gc.utterance_stats(audio), options)


def test_gpu_check_sim_workers_are_one_model_and_its_siblings(tiny_dir: Path) -> None:
    setup = gc.make_sim_engines(tiny_dir, "cpu", "int8", 3, 2, True, max_length=32)
    try:
        assert setup.engine == "WhisperEngine", setup.engine_error
        first, *rest = setup.workers
        assert len(rest) == 2 and len(setup.close) == 1  # one model to close
        assert setup.engine_config["inter_threads"] == 3  # one CTranslate2 replica per worker
        assert setup.engine_config["intra_threads"] == max(1, gc.cpu_count() // 3)
        for twin in rest:
            assert type(twin) is WhisperEngine and twin is not first
            assert twin._model is first._model
            assert twin.max_length(4, 16) == first.max_length(4, 16)
            assert len(twin.infer_batch([_request()])) == 1
    finally:
        for close in setup.close:
            close()


@pytest.mark.parametrize("new_tokens", [16, 40])
def test_gpu_check_decodes_exactly_the_tokens_it_asks_the_engine_for(
    tiny_dir: Path, new_tokens: int
) -> None:
    model = gc.load_ct2(tiny_dir, "cpu", "int8", 1)
    prompt = gc.Prompt.from_model_dir(tiny_dir)
    features = gc.log_mel(np.zeros(16_000, dtype=np.float32), int(model.n_mels))
    cal = gc.engine_max_length(model, tiny_dir, "cpu", "int8", features, prompt, new_tokens, True)
    assert cal["calibrated_by"] == "WhisperEngine.warmup"
    assert cal["tokens_at_used"] == new_tokens
    assert cal["nominal_max_length"] == len(prompt.ids) + new_tokens


def test_asr_capacity_tune_workers_keep_the_calibrated_max_length(tiny_dir: Path) -> None:
    engine = WhisperEngine.load(gc.engine_config(tiny_dir, "cpu", "int8", True, inter_threads=2))
    try:
        engine.warmup()
        workers = _worker_engines(engine, 3)
        assert workers[0] is engine and len(workers) == 3
        for twin in workers[1:]:
            assert twin._model is engine._model
            # A freshly constructed engine would decode with the uncalibrated reading.
            assert twin._halved_max_length == engine._halved_max_length
            assert twin.max_length(24, 100) == engine.max_length(24, 100)
    finally:
        engine.close()
