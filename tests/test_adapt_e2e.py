"""``voxgate adapt`` end to end: a tiny real adaptation whose model a real gateway then serves.

The real command (a subprocess, so its progress is the JSON lines a job runner sees), the real
bundled base, torch and peft, six real clips whose transcripts spell one word as a made-up
term ("Zyntriva"), and one untranscribed recording as replay. Eight decoder-only steps of two
clips (with two replayed) at a high learning rate are enough for the merged
model to write the term where the base writes the real word, so a call that names the new model
through ``config.model`` on a real grpc.aio gateway over a models directory gets the term, and a
call on the default model does not: the call reached the adapted model, and its output differs
from the base's. Bad input is refused before training, in one line that names what to fix, and
leaves nothing in the models directory.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from calls import encode_wav, models_server, recognize

from voxgate.adapt.data import load_pairs, split
from voxgate.cli._adapt import EXTRA_MISSING
from voxgate.cli._main import main
from voxgate.engines.asr import resolve_model_dir
from voxgate.gateway.server import GatewayServer
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.model]

TERM = "Zyntriva"
#: (clip, the word its transcript spells as the term)
CLIPS = (
    ("vctk_p238_165.wav", "arrangement"),
    ("ljspeech_LJ001-0004.wav", "books"),
    ("ljspeech_LJ001-0006.wav", "worth"),
    ("vctk_p376_193.wav", "approach"),
    ("vctk_p314_272.wav", "bonus"),
    ("fleurs_en_us_test_003.wav", "cabbage"),
)
NAME = "zyn"
HELD_OUT = 0.34  # 2 of the 6 clips
RECORDING = "vctk_p301_102.wav"  # an untranscribed "call" for --replay-audio (not in CLIPS)


def write_manifest(
    path: Path, speech_dir: Path, manifest: list[dict[str, Any]], clips: Any = CLIPS
) -> Path:
    text = {row["file"]: row["text"] for row in manifest}
    with path.open("w") as f:
        for clip, word in clips:
            assert word in text[clip]
            row = {"audio": str(speech_dir / clip), "text": text[clip].replace(word, TERM)}
            f.write(json.dumps(row) + "\n")
    return path


@pytest.fixture(scope="module")
def adapted(
    tmp_path_factory: pytest.TempPathFactory, speech_dir: Path, manifest: list[dict[str, Any]]
) -> tuple[Path, dict[str, Any], list[dict[str, Any]]]:
    """Run the real command once: (models dir, its summary, its progress lines)."""
    root = tmp_path_factory.mktemp("adapt")
    data = write_manifest(root / "calls.jsonl", speech_dir, manifest)
    terms = root / "terms.txt"
    terms.write_text(f"# the domain's terms\n{TERM}\n")
    models = root / "models"
    calls = root / "calls.csv"
    calls.write_text(f"audio\n{speech_dir / RECORDING}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "voxgate.cli", "adapt", "--data", str(data), "--terms", str(terms)]
        + ["--name", NAME, "--models-dir", str(models), "--steps", "8", "--decoder-only"]
        + ["--learning-rate", "5e-3", "--held-out", str(HELD_OUT), "--threads", "2"]
        + ["--replay", "2", "--replay-audio", str(calls), "--batch-size", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    progress = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    summary = json.loads(proc.stdout)
    # The same split the command made (seeded), to know which clips it trained on.
    trained, _ = split(load_pairs(data), held_out=HELD_OUT, seed=0)
    summary["trained_on"] = [CLIPS[int(p.origin.rsplit(":", 1)[1]) - 1][0] for p in trained]
    return models, summary, progress


def test_the_command_writes_a_verified_model_with_its_report_and_nothing_else(
    adapted: tuple[Path, dict[str, Any], list[dict[str, Any]]],
) -> None:
    from voxgate.adapt.publish import sha256_file

    models, summary, progress = adapted
    assert [p.name for p in models.iterdir()] == [NAME]  # no partial or work dir left behind
    model = models / NAME
    assert summary["model"] == str(model) and summary["name"] == NAME
    for f in ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt", "report.md"):
        assert (model / f).is_file(), f
    meta = json.loads((model / "voxgate-model.json").read_text())
    assert meta["model_bin_sha256"] == sha256_file(model / "model.bin")
    assert meta["training"]["steps"] == 8 and meta["lora"]["rank"] == 8
    assert meta["data"]["train"]["pairs"] == 4 and meta["data"]["held_out"]["pairs"] == 2
    # The original config rides along: language ids and alignment heads (language detection
    # and word times depend on them).
    base_cfg = json.loads((resolve_model_dir("base") / "config.json").read_text())
    assert json.loads((model / "config.json").read_text()) == base_cfg
    assert len(base_cfg["lang_ids"]) == 99
    # Progress without a terminal: JSON stage and step lines, the last step with ETA 0.
    stages = [p["stage"] for p in progress if p["event"] == "stage"]
    assert stages[0] == "load" and stages[-1] == "done"
    assert {"train", "write", "evaluate-base", "evaluate-adapted"} <= set(stages)
    # Two general sentences and one recording (transcribed by the base) replayed beside the
    # four training clips, held to the base.
    assert "synthesize-replay" in stages and meta["data"]["replay"]["pairs"] == 2
    assert "transcribe-replay" in stages
    heard = meta["data"]["replay_audio"]
    assert (heard["recordings"], heard["pairs"], heard["recorded"]) == (1, 1, 1)
    assert heard["words"] == 8  # the base's "I am sure all schools would accept that."
    train_stage = next(p for p in progress if p.get("stage") == "train")
    assert train_stage["examples"] == 4 and train_stage["replay"] == 3
    assert meta["training"]["replay_kl_last"] > 0 and meta["lora"]["replay_weight"] == 6.0
    assert meta["lora"]["focus"] == "terms"  # --terms given: only the term's tokens are fitted
    steps = [p for p in progress if p["event"] == "step"]
    assert steps[-1]["step"] == 8 and steps[-1]["eta_s"] == 0.0
    assert set(summary["scores"]) == {"held_out"}
    report = (model / "report.md").read_text()
    assert NAME in report and "| steps |" in report and "| replay recordings | 1 of 1" in report


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(
    adapted: tuple[Path, dict[str, Any], list[dict[str, Any]]],
) -> AsyncIterator[GatewayServer]:
    async with models_server(adapted[0]) as srv:
        yield srv


@pytest.mark.asyncio(loop_scope="module")
async def test_the_gateway_serves_the_adapted_model_by_name(
    server: GatewayServer,
    adapted: tuple[Path, dict[str, Any], list[dict[str, Any]]],
    speech_dir: Path,
) -> None:
    async with grpc.aio.insecure_channel(server.target) as ch:
        stub = pb_grpc.VoiceGatewayStub(ch)
        listed = await stub.ListModels(pb.ListModelsRequest())
        assert [m.name for m in listed.models] == ["whisper-base", NAME]
        clip = adapted[1]["trained_on"][0]
        word = dict(CLIPS)[clip]
        audio = encode_wav(speech_dir / clip, pb.LINEAR16, 16000)
        started, adapted_text = await recognize(stub, audio, NAME)
        assert started == NAME
        _, base_text = await recognize(stub, audio, "")
    assert word in base_text.lower() and TERM.lower() not in base_text.lower()
    assert TERM.lower() in adapted_text.lower(), adapted_text
    assert adapted_text != base_text


def test_qlora_trains_on_a_4bit_base_and_its_merged_model_writes_the_term(
    tmp_path: Path,
    speech_dir: Path,
    manifest: list[dict[str, Any]],
    adapted: tuple[Path, dict[str, Any], list[dict[str, Any]]],
) -> None:
    """``--qlora`` for real: the frozen base in bitsandbytes' 4-bit NF4 (its CPU kernels here,
    CUDA on a GPU), the adapters merged into the full-precision base, and the written model,
    loaded by the serving engine, writes the term where the base writes the real word.

    The serving path is the same for every model directory (the LoRA model above goes through
    a real gateway); what only this run proves is training and merging through a 4-bit base.
    """
    from voxgate.adapt.evaluate import load_engine, transcribe

    data = write_manifest(tmp_path / "calls.jsonl", speech_dir, manifest)
    terms = tmp_path / "terms.txt"
    terms.write_text(f"{TERM}\n")
    models = tmp_path / "models"
    proc = subprocess.run(
        [sys.executable, "-m", "voxgate.cli", "adapt", "--data", str(data), "--terms", str(terms)]
        + ["--qlora", "--no-evaluate"]
        + ["--name", "q4", "--models-dir", str(models), "--steps", "8", "--decoder-only"]
        + ["--learning-rate", "5e-3", "--held-out", str(HELD_OUT), "--threads", "2"]
        + ["--replay", "2", "--batch-size", "2", "--progress", "json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Only voxgate's own JSON progress on stderr: no hub-kernel warning, no transformers bars.
    assert all(line.startswith("{") for line in proc.stderr.splitlines()), proc.stderr[-2000:]
    meta = json.loads((models / "q4" / "voxgate-model.json").read_text())
    assert meta["lora"]["qlora"] is True and meta["training"]["steps"] == 8
    assert not (models / ".q4.work").exists()  # the 4-bit base's copy went with the work dir
    clip = adapted[1]["trained_on"][0]  # the same seeded split as the LoRA run
    audio = load_pairs(data)[[c for c, _ in CLIPS].index(clip)].audio
    engines = {"base": load_engine("base"), "q4": load_engine(models / "q4")}
    try:
        base_text, q4_text = (transcribe(engines[k], audio)[0] for k in ("base", "q4"))
    finally:
        for e in engines.values():
            e.close()
    assert TERM.lower() not in base_text.lower()
    assert TERM.lower() in q4_text.lower(), q4_text


# -- bad input: one line, before any training, nothing written ----------------------------------


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["adapt", *args])
    err = capsys.readouterr().err.strip()
    return code, err


@pytest.fixture
def good(tmp_path: Path, speech_dir: Path, manifest: list[dict[str, Any]]) -> list[str]:
    data = write_manifest(tmp_path / "m.jsonl", speech_dir, manifest, CLIPS[:3])
    return ["--data", str(data), "--models-dir", str(tmp_path / "models"), "--steps", "1"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--name", "../up"], "is not a model name"),
        (["--name", "whisper-base"], "reserved"),
        (["--name", "m", "--replay", "-1"], "--replay -1: choose 1..157"),
        (["--name", "m", "--replay-weight", "-1"], "--replay-weight must be within 0..100"),
        (["--name", "m", "--focus", "terms"], "--focus terms needs --terms"),
        (
            ["--name", "m", "--replay-audio", "calls", "--replay-weight", "0"],
            "--replay-audio needs a --replay-weight above 0",
        ),
    ],
)
def test_bad_flags_are_refused_in_one_line_before_training(
    args: list[str],
    message: str,
    good: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import re

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # as on a CPU-only host
    code, err = run_cli([*good, *args], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and re.search(message, err), err
    assert err.startswith("voxgate adapt: ")
    models = Path(good[good.index("--models-dir") + 1])
    assert not models.exists() or not any(models.iterdir())


def test_a_taken_name_is_refused_before_training(
    good: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    models = Path(good[good.index("--models-dir") + 1])
    (models / "taken").mkdir(parents=True)
    code, err = run_cli([*good, "--name", "taken"], capsys)
    assert code == 2 and "already exists" in err and len(err.splitlines()) == 1
    assert [p.name for p in models.iterdir()] == ["taken"]


def test_bad_data_names_the_line_and_nothing_is_written(
    tmp_path: Path, speech_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "calls.jsonl"
    clip = str(speech_dir / CLIPS[0][0])
    manifest.write_text(
        json.dumps({"audio": clip, "text": "fine"}) + "\n" + json.dumps({"audio": clip}) + "\n"
    )
    models = tmp_path / "models"
    code, err = run_cli(
        ["--data", str(manifest), "--name", "m", "--models-dir", str(models)], capsys
    )
    assert code == 2 and "calls.jsonl:2" in err and "'text'" in err, err
    assert not models.exists()
    code, err = run_cli(["--name", "m", "--models-dir", str(models)], capsys)
    assert code == 2 and "--data" in err and "--phrases" in err
    calls = tmp_path / "calls.csv"
    calls.write_text(f"audio\n{clip}\nnot-there.wav\n")
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"audio": clip, "text": "fine"}) + "\n")
    args = ["--data", str(good), "--held-out", "0", "--name", "m", "--models-dir", str(models)]
    code, err = run_cli([*args, "--replay-audio", str(calls)], capsys)
    assert code == 2 and "calls.csv:3: not-there.wav: audio file not found" in err, err
    assert not models.exists()


def test_qlora_without_bitsandbytes_says_how_to_install_it(
    good: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import bitsandbytes now fails
    code, err = run_cli([*good, "--name", "m", "--qlora"], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "--qlora" in err and "pip install 'voxgate[qlora]'" in err
    models = Path(good[good.index("--models-dir") + 1])
    assert not models.exists() or not any(models.iterdir())


def test_without_the_extra_the_command_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft now raises ImportError
    code, err = run_cli(["--name", "m", "--models-dir", str(tmp_path)], capsys)
    assert code == 2 and err == EXTRA_MISSING
