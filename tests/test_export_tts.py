"""benchmarks/export_tts.py: the exported halves reproduce the voice bit for bit (noise off)."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import pytest

from voxgate.engines.tts import SpeakOptions, TtsConfig, VitsStreamer, soft_limit

pytestmark = pytest.mark.model

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "benchmarks" / "export_tts.py"
QUIET = SpeakOptions(noise_scale=0.0, noise_w=0.0)
TEXT = "Sure, I can help you with that right away."


def load_export_tts() -> ModuleType:
    spec = importlib.util.spec_from_file_location("export_tts_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def export_tts() -> ModuleType:
    return load_export_tts()


@pytest.fixture(scope="module")
def exported(export_tts: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> object:
    return export_tts.export_halves("joe", tmp_path_factory.mktemp("tts_export"))


@pytest.fixture(scope="module")
def streamer() -> Iterator[VitsStreamer]:
    # One front-end unit for TEXT, like the exported halves run it (no first-clause split).
    engine = VitsStreamer.load(TtsConfig(cache_bytes=0, first_unit_max_chars=0))
    yield engine
    engine.close()


def test_files_and_manifest(exported: object) -> None:
    front = exported.front_end  # type: ignore[attr-defined]
    decoder = exported.decoder  # type: ignore[attr-defined]
    manifest = json.loads(exported.manifest.read_text())  # type: ignore[attr-defined]
    onnx.checker.check_model(onnx.load(str(front)))
    onnx.checker.check_model(onnx.load(str(decoder)))
    assert manifest["front_end"]["file"] == front.name
    assert manifest["decoder"]["file"] == decoder.name
    assert manifest["crossing"][0]["name"] == manifest["latent"]
    assert manifest["crossing"][0]["shape"][1] == 192  # Piper's latent channels
    assert all(c["frame_indexed"] for c in manifest["crossing"])  # single-speaker voice
    assert manifest["decoder_inputs"] == [c["name"] for c in manifest["crossing"]]
    assert manifest["front_end_outputs"][-1] == manifest["durations"]
    assert (manifest["hop_length"], manifest["sample_rate"]) == (256, 22050)
    assert manifest["windows"] == {
        "first_window_frames": TtsConfig().first_window_frames,
        "window_frames": 96,
        "context_frames": TtsConfig().context_frames,
    }


def test_halves_reproduce_the_whole_graph(export_tts: ModuleType, exported: object) -> None:
    rows = export_tts.verify_bit_exact("joe", exported)
    assert len(rows) == len(export_tts.VERIFY_TEXTS)
    for row in rows:
        assert row["bit_exact"], row
        assert row["samples"] > 0


def test_halves_reproduce_synthesize_oneshot(
    export_tts: ModuleType, exported: object, streamer: VitsStreamer
) -> None:
    """Halves from the files, then the streamer's gain and limiter == its one-shot path."""
    front = export_tts._session(exported.front_end.read_bytes(), ["CPUExecutionProvider"])  # type: ignore[attr-defined]
    decoder = export_tts._session(exported.decoder.read_bytes(), ["CPUExecutionProvider"])  # type: ignore[attr-defined]
    ids = export_tts.phoneme_ids("joe", TEXT)
    audio = export_tts.run_halves(
        front,
        decoder,
        exported.split,
        export_tts.front_feeds(front, ids),  # type: ignore[attr-defined]
    )
    config = streamer.config
    ours = soft_limit(audio, float(10.0 ** (config.gain_db / 20.0)), config.limiter_threshold)
    reference = streamer.synthesize_oneshot(TEXT, QUIET)
    assert reference.sentence_index == 0  # one unit, so one front-end run on both sides
    assert np.array_equal(ours, reference.samples)


@pytest.mark.parametrize("total", [1, 7, 16, 23, 24, 60, 130, 400])
def test_window_lengths_follow_the_streamer(
    export_tts: ModuleType, streamer: VitsStreamer, total: int
) -> None:
    ctx = streamer.config.context_frames
    expected = [
        min(total, stop + ctx) - max(0, start - ctx) for start, stop in streamer._windows(total)
    ]
    lengths = export_tts.decoder_window_lengths(total, streamer.config)
    assert lengths == expected
    assert max(lengths) <= streamer.config.window_frames + 2 * ctx


def test_cli_exports_and_verifies(export_tts: ModuleType, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    status = export_tts.main(["--out-dir", str(tmp_path / "x"), "--no-trt", "--json", str(out)])
    assert status == 0
    result = json.loads(out.read_text())
    assert all(row["bit_exact"] for row in result["verify"])
    assert "trt" not in result


def test_prebuild_code_path_runs_without_tensorrt(
    export_tts: ModuleType, exported: object, tmp_path: Path
) -> None:
    """Without TensorRT the pre-build falls back to CPU: it still walks every shape."""
    rows = export_tts.prebuild_trt("joe", exported, tmp_path / "trt")
    assert rows[0]["half"] == "sessions"
    assert "CPUExecutionProvider" in rows[0]["providers"]
    decoder_frames = [r["frames_or_ids"] for r in rows if r["half"] == "decoder"]
    ctx = TtsConfig().context_frames
    # Widest (the scheduler's largest window, at the largest GPU batch), then narrowest.
    assert decoder_frames[:2] == [2 * 96 + 2 * ctx, 1]
    assert [r["batch"] for r in rows if r["half"] == "decoder"][:2] == [8, 1]
    assert TtsConfig().first_window_frames + ctx in decoder_frames  # a sentence's first window
    assert all(r["seconds"] >= 0 for r in rows)
