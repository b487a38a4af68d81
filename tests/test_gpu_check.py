"""benchmarks/gpu_check: the tiny CPU run end to end, and the random-model builders.

The tiny run is a subprocess, as a person would run it; its JSON is checked for structure and
for finite, positive numbers only (no timing thresholds: this machine is shared). The spec
builder is checked against CTranslate2's own Transformers converter, byte for byte, when torch
and transformers are installed (the ``gpucheck`` extra).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

pytestmark = pytest.mark.model

REPO_ROOT = Path(__file__).resolve().parents[1]


def load_gpu_check() -> ModuleType:
    import benchmarks.gpu_check

    return benchmarks.gpu_check


def positive(value: Any) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    out = tmp_path_factory.mktemp("gpu_check") / "tmp.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.gpu_check",
            "--tiny",
            "--device",
            "cpu",
            "--builder",
            "spec",
            "--out",
            str(out),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


def test_tiny_run_prints_one_table(tiny_run: tuple[dict[str, Any], str]) -> None:
    _, stdout = tiny_run
    assert "voxgate gpu_check: mode=tiny device=cpu compute=int8" in stdout
    assert stdout.count("section  case") == 1
    for row in ("batch 1 x 30 s", "batch 2 x 30 s", "max K @ p95<=500ms", "tts      CPU"):
        assert row in stdout, row


def test_tiny_run_json_environment_and_model(tiny_run: tuple[dict[str, Any], str]) -> None:
    report, _ = tiny_run
    assert report["schema"] == 1
    assert (report["mode"], report["device"], report["compute_type"]) == ("tiny", "cpu", "int8")
    assert report["errors"] == []
    assert positive(report["elapsed_s"])
    env = report["environment"]
    for key in ("python", "ctranslate2", "onnxruntime", "ort_providers", "ct2_cuda_devices"):
        assert key in env, key
    assert "CPUExecutionProvider" in env["ort_providers"]
    assert isinstance(env["nvidia_smi"]["present"], bool)
    model = report["asr_model"]
    assert model["source"] == "random-spec"
    assert model["shape"]["d_model"] == 64 and model["n_mels"] == 80
    assert model["multilingual"] is True
    assert positive(model["build_s"])
    cal = model["ct2_max_length"]
    assert cal["tokens_at_used"] == cal["new_tokens_wanted"] == 16


def test_tiny_run_json_asr_numbers(tiny_run: tuple[dict[str, Any], str]) -> None:
    report, _ = tiny_run
    rows = report["asr_batches"]
    assert [r["batch"] for r in rows] == [1, 2]
    for r in rows:
        for key in ("utt_per_s", "p50_ms", "p95_ms", "encode_ms_p50", "generate_ms_p50"):
            assert positive(r[key]), (key, r)
        assert r["p95_ms"] >= r["p50_ms"]
        assert r["tokens_per_item"] == 16
        assert r["repeats"] >= 2

    cap = report["asr_capacity"]
    assert cap["engine"] == "WhisperEngine", cap["engine_error"]
    assert cap["target_p95_ms"] == 500.0
    assert 0 <= cap["max_calls"] <= cap["max_calls_tried"] == 4
    assert cap["trials"]
    for t in cap["trials"]:
        assert t["calls"] >= 1
        assert t["failed"] == 0, t["first_failure"]
        assert t["ok"] == (t["utterances"] > 0 and t["p95_ms"] <= 500.0 and not t["aborted"])
        if t["utterances"]:
            assert positive(t["p50_ms"]) and positive(t["p95_ms"]) and positive(t["mean_batch"])
    assert all(positive(s) for s in cap["utterance_s"])


def test_tiny_run_measures_the_torch_engine_beside_ctranslate2(
    tiny_run: tuple[dict[str, Any], str],
) -> None:
    """Issue 39: decode steps, processors on and off, the encoder, and the calls trial."""
    report, stdout = tiny_run
    assert report["engines"] == ["ctranslate2", "torch"]
    part = report["torch"]
    assert part["dtype"] == "float32" and part["errors"] == []
    assert [r["batch"] for r in part["steps"]] == [1, 2]
    for r in part["steps"]:
        for key in ("eager_ms", "loop_off_ms", "loop_on_ms", "tokens_per_s_graph_or_eager"):
            assert positive(r[key]), (key, r)
        assert r["graph_ms"] is None  # no CUDA graphs on CPU
        assert math.isfinite(r["processors_overhead_pct"])
    assert [e["batch"] for e in part["encoder"]] == [1, 2]
    assert all(positive(e["ms_per_window"]) for e in part["encoder"])
    cap = report["asr_capacity_torch"]
    assert cap["engine"] == "TorchWhisperEngine", cap["engine_error"]
    assert cap["engine_config"]["engine"] == "torch"
    assert cap["trials"] and all(t["failed"] == 0 for t in cap["trials"]), cap["trials"]
    assert "step batch 2" in stdout and "encoder batch 1" in stdout
    assert stdout.count("max K @ p95<=500ms") == 2


@pytest.mark.unit
def test_offline_bundle_lists_what_a_torch_host_lacks() -> None:
    """The bundle's wheels: what the check imports, less torch's world and our own code."""
    from benchmarks.gpu_check.bundle import RUN_SH, host_distributions

    wanted, modules = host_distributions()
    assert {"ctranslate2", "faster-whisper", "tokenizers", "pydantic"} <= set(wanted)
    assert not {"torch", "numpy", "av", "voxgate"} & set(wanted)
    assert not any(k.startswith("nvidia-") for k in wanted)
    for name in (
        "voxgate.engines.asr._torch.engine",
        "benchmarks.gpu_check.cli",
        "benchmarks.gpu_check.__main__",
    ):
        assert name in modules
    checked = subprocess.run(["bash", "-n"], input=RUN_SH, text=True, check=False)
    assert checked.returncode == 0


def test_tiny_run_json_tts(tiny_run: tuple[dict[str, Any], str]) -> None:
    report, _ = tiny_run
    (row,) = report["tts"]
    assert row["provider"] == "CPUExecutionProvider"
    assert row["active_providers"] == ["CPUExecutionProvider"]
    for key in ("first_audio_p50_ms", "first_audio_p95_ms", "first_audio_cold_max_ms", "rtf_p50"):
        assert positive(row[key]), key


def test_vocabulary_padding_and_large_v3_size() -> None:
    gc = load_gpu_check()
    files = gc.TokenizerFiles.bundled()
    assert len(files.vocabulary) == 51865
    tokens = files.tokens(51866)
    assert tokens[:51865] == files.vocabulary
    assert tokens[-2:] == ["<|30.00|>", "<|30.02|>"]
    assert len(files.lang_to_id()) == 99
    assert 1.5e9 < gc.LARGE_V3.parameters < 1.6e9  # large-v3 has 1.55 B parameters


def test_spec_builder_matches_the_transformers_converter(tmp_path: Path) -> None:
    """Same weights through both routes give the same model.bin, config and vocabulary."""
    # CI installs both (torch's CPU build); a missing one fails here instead of skipping.
    import torch
    import transformers

    gc = load_gpu_check()
    files = gc.TokenizerFiles.bundled()
    # Odd sizes on purpose: more decoder than encoder layers, vocabulary padded by one.
    shape = gc.WhisperShape(64, 2, 3, 4, 80, 51866, 128)
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(gc.hf_whisper_config(shape, files))
    gc.save_hf_model(model, shape, files, tmp_path / "hf")
    gc.convert_hf(tmp_path / "hf", tmp_path / "converted", "float32", False)
    spec = gc.build_whisper_spec(shape, gc.state_dict_weights(model), files)
    gc.save_spec(spec, tmp_path / "spec", "float32")

    for name in ("model.bin", "config.json", "vocabulary.json", "tokenizer.json"):
        a = (tmp_path / "converted" / name).read_bytes()
        b = (tmp_path / "spec" / name).read_bytes()
        if name.endswith(".json"):
            assert json.loads(a) == json.loads(b), name
        else:
            assert a == b, name
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert len(config["lang_ids"]) == 99
    assert len(config["alignment_heads"]) == 2 * 4  # last half of 3 layers x 4 heads


class _InstantEngine:
    """Answers at once: every trial meets any latency target."""

    def infer_batch(self, items: list[Any]) -> list[int]:
        return [0 for _ in items]


class _BrokenEngine:
    def infer_batch(self, items: list[Any]) -> list[int]:
        raise RuntimeError("engine down")


@pytest.mark.parametrize("start", [1, 3])
def test_capacity_search_reaches_the_cap_when_every_trial_passes(start: int) -> None:
    gc = load_gpu_check()
    setup = gc.SimSetup(
        workers=[_InstantEngine()], max_batch_size=4, engine="fake", engine_config={}
    )
    result = gc.find_capacity(
        setup,
        ["utterance"],
        target_ms=10_000.0,  # far above anything an instant engine can take
        period_s=0.05,
        duration_s=0.2,
        max_calls=8,
        budget=gc.Budget(600.0),
        reserve_s=0.0,
        start_calls=start,
    )
    assert result["max_calls"] == 8
    assert result["first_failing_calls"] is None
    assert all(t["ok"] and t["failed"] == 0 for t in result["trials"])
    assert [t["calls"] for t in result["trials"]][0] == start


def test_capacity_search_reports_zero_when_the_engine_fails() -> None:
    gc = load_gpu_check()
    setup = gc.SimSetup(
        workers=[_BrokenEngine()], max_batch_size=4, engine="fake", engine_config={}
    )
    result = gc.find_capacity(
        setup,
        ["utterance"],
        target_ms=10_000.0,
        period_s=0.05,
        duration_s=0.2,
        max_calls=4,
        budget=gc.Budget(600.0),
        reserve_s=0.0,
        start_calls=2,
    )
    assert result["max_calls"] == 0
    assert result["first_failing_calls"] == 1
    assert all(not t["ok"] for t in result["trials"])
    assert "engine down" in result["trials"][0]["first_failure"]


def test_ct2_adapter_fallback_decodes_a_batch(tmp_path: Path) -> None:
    gc = load_gpu_check()
    model_dir = gc.build_random_spec(gc.TINY, tmp_path / "tiny", "int8")
    model = gc.load_ct2(model_dir, "cpu", "int8", 1)
    prompt = gc.Prompt.from_model_dir(model_dir)
    adapter = gc.Ct2Adapter(model, int(model.n_mels), prompt, max_length=12)

    class Item:
        audio = np.zeros(16_000, dtype=np.float32)

    counts = adapter.infer_batch([Item(), Item()])
    assert len(counts) == 2 and all(0 < n <= 12 for n in counts)
