"""Named models served side by side: a real grpc.aio server, the real bundled Whisper base.

The models directory holds the bundled base under other names: ``same`` (hard links: decodes
exactly as the default), ``swapped`` (a copy whose decoder embedding rows of two words are
exchanged, a test-only rewrite of ``model.bin``; the output projection is an alias of the
embeddings, so the model is the base with those two words' identities exchanged and every call
it serves says the other word: proof that a call reached that model and no other), ``corrupt``
(complete files but a model.bin CTranslate2 cannot read: offered, fails at its first call),
and three that are never offered: a ``.partial`` directory being written, one without
tokenizer.json and one whose ``voxgate-model.json`` sha256 does not match.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import pytest_asyncio
import tokenizers
from calls import chunks, config, encode_wav, models_server, recognize, requests
from conftest import REPO_ROOT
from grpc_health.v1 import health_pb2, health_pb2_grpc

from voxgate.engines.asr import resolve_model_dir
from voxgate.gateway.config import load_config
from voxgate.gateway.metrics import GatewayMetrics
from voxgate.gateway.runtime import EngineLoadError, build_hub
from voxgate.gateway.server import MODEL_HEALTH_PREFIX, GatewayServer
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.asyncio(loop_scope="module")]

CLIP = "jfk_inaugural_1961.wav"  # "... ask not what your country can do for you ..."
WORD, OTHER = " country", " garden"
FILES = ("model.bin", "config.json", "tokenizer.json", "vocabulary.txt")


def link_model(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> Path:
    """The base model under another name, by hard links (no copy of the 145 MB weights)."""
    dst.mkdir(parents=True)
    for name in FILES:
        if name not in skip:
            os.link(src / name, dst / name)
    return dst


def embedding_offset(model_bin: bytes) -> tuple[int, tuple[int, ...], int]:
    """Where ``decoder/embeddings/weight`` lies in a CTranslate2 v6 ``model.bin``.

    The layout (engines/asr/_ct2_weights.py reads it the same way): version, spec name,
    revision, then per variable its name, rank, dims, dtype code and byte count.
    """
    off = 0

    def u32() -> int:
        nonlocal off
        (v,) = struct.unpack_from("<I", model_bin, off)
        off += 4
        return int(v)

    def string() -> str:
        nonlocal off
        (n,) = struct.unpack_from("<H", model_bin, off)
        off += 2
        s = model_bin[off : off + n].rstrip(b"\0").decode()
        off += n
        return s

    assert u32() == 6 and string() == "WhisperSpec"
    u32()
    for _ in range(u32()):
        name = string()
        rank = model_bin[off]
        off += 1
        dims = struct.unpack_from("<" + "I" * rank, model_bin, off)
        off += 4 * rank
        code = model_bin[off]
        off += 1
        nbytes = u32()
        if name == "decoder/embeddings/weight":
            return off, tuple(dims), code
        off += nbytes
    raise AssertionError("no decoder/embeddings/weight")


def swapped_model(src: Path, dst: Path, a: int, b: int) -> Path:
    """The base with embedding rows ``a`` and ``b`` exchanged (tokens a and b trade places)."""
    dst.mkdir(parents=True)
    for name in FILES[1:]:
        os.link(src / name, dst / name)
    data = bytearray((src / "model.bin").read_bytes())
    off, (rows, dim), code = embedding_offset(bytes(data))
    assert code == 4 and rows > max(a, b)  # float16
    emb = np.frombuffer(data, np.float16, rows * dim, off).reshape(rows, dim).copy()
    emb[[a, b]] = emb[[b, a]]
    data[off : off + emb.nbytes] = emb.tobytes()
    (dst / "model.bin").write_bytes(bytes(data))
    return dst


@pytest.fixture(scope="module")
def base_dir() -> Path:
    return resolve_model_dir("base")


def token_ids(base_dir: Path) -> tuple[int, int]:
    tok = tokenizers.Tokenizer.from_file(str(base_dir / "tokenizer.json"))
    (a,) = tok.encode(WORD, add_special_tokens=False).ids
    (b,) = tok.encode(OTHER, add_special_tokens=False).ids
    return a, b


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory, base_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("models")
    link_model(base_dir, root / "same")
    swapped_model(base_dir, root / "swapped", *token_ids(base_dir))
    link_model(base_dir, root / ".swapped-v2.partial-8c1d")
    link_model(base_dir, root / "no-tokenizer", skip=("tokenizer.json",))
    tampered = link_model(base_dir, root / "tampered")
    (tampered / "voxgate-model.json").write_text('{"model_bin_sha256": "' + "0" * 64 + '"}')
    corrupt = link_model(base_dir, root / "corrupt", skip=("model.bin",))
    (corrupt / "model.bin").write_bytes(b"\x06\x00\x00\x00 not a model")
    return root


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(models_dir: Path) -> AsyncIterator[GatewayServer]:
    async with models_server(models_dir) as srv:
        yield srv


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def channel(server: GatewayServer) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(server.target) as ch:
        yield ch


async def health(channel: grpc.aio.Channel, name: str) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    resp = await stub.Check(health_pb2.HealthCheckRequest(service=MODEL_HEALTH_PREFIX + name))
    return int(resp.status)


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def test_list_models_offers_the_default_then_the_valid_named_models(
    channel: grpc.aio.Channel,
) -> None:
    resp = await pb_grpc.VoiceGatewayStub(channel).ListModels(pb.ListModelsRequest())
    got = [(m.name, m.is_default, m.loaded) for m in resp.models]
    assert got == [
        ("whisper-base", True, True),
        ("corrupt", False, False),
        ("same", False, False),
        ("swapped", False, False),
    ]
    assert all(m.family == "whisper" and "en" in m.languages for m in resp.models)
    for name in ("whisper-base", "same", "swapped", "corrupt"):
        assert await health(channel, name) == SERVING


async def test_a_call_naming_a_model_is_decoded_by_that_model(
    server: GatewayServer, channel: grpc.aio.Channel, speech_dir: Path
) -> None:
    stub = pb_grpc.VoiceGatewayStub(channel)
    audio = encode_wav(speech_dir / CLIP, pb.LINEAR16, 16000)
    metrics = server.metrics

    def served(model: str) -> float:
        return metrics.value(
            "voxgate_asr_model_requests_total", model=model, kind="final", outcome="ok"
        )

    started, base_text = await recognize(stub, audio)
    assert started == "whisper-base"
    assert "country" in base_text.lower() and "garden" not in base_text.lower()
    assert metrics.value("voxgate_asr_model_loaded", model="swapped") == 0
    # The first call of "swapped" loads it and waits; the transcript is the swapped model's.
    started, swapped_text = await recognize(stub, audio, "swapped")
    assert started == "swapped"
    assert "garden" in swapped_text.lower() and "country" not in swapped_text.lower()
    assert swapped_text.lower().replace("garden", "country") == base_text.lower()
    assert served("swapped") >= 1
    assert metrics.value("voxgate_asr_model_loaded", model="swapped") == 1
    assert metrics.value("voxgate_asr_model_loads_total", model="swapped", outcome="ok") == 1
    # A second call reuses the loaded model; "same" (the base's own files) decodes as the base.
    assert (await recognize(stub, audio, "swapped"))[1] == swapped_text
    assert metrics.value("voxgate_asr_model_loads_total", model="swapped", outcome="ok") == 1
    default_before = served("whisper-base")
    assert (await recognize(stub, audio, "same")) == ("same", base_text)
    assert served("whisper-base") == default_before  # "same" counted as itself, not the default
    resp = await stub.ListModels(pb.ListModelsRequest())
    assert {m.name: m.loaded for m in resp.models}["swapped"]


async def test_concurrent_calls_of_two_models_each_get_their_own_model(
    channel: grpc.aio.Channel, speech_dir: Path
) -> None:
    stub = pb_grpc.VoiceGatewayStub(channel)
    audio = encode_wav(speech_dir / CLIP, pb.LINEAR16, 16000)
    results = await asyncio.gather(*(recognize(stub, audio, m) for m in ["swapped", "", "swapped"]))
    assert ["garden" in t.lower() for _, t in results] == [True, False, True]


async def test_a_model_that_fails_to_load_fails_its_call_while_a_default_call_goes_on(
    server: GatewayServer, channel: grpc.aio.Channel, speech_dir: Path
) -> None:
    stub = pb_grpc.VoiceGatewayStub(channel)
    audio = encode_wav(speech_dir / CLIP, pb.LINEAR16, 16000)
    default_call = asyncio.create_task(recognize(stub, audio))
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await recognize(stub, b"", "corrupt")  # config only: the status, not a write race
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    details = err.value.details() or ""
    assert "'corrupt' is offered but failed to load" in details and "SIGHUP" in details
    assert "country" in (await default_call)[1].lower()
    assert await health(channel, "corrupt") == NOT_SERVING
    assert await health(channel, "whisper-base") == SERVING
    assert (
        server.metrics.value("voxgate_asr_model_loads_total", model="corrupt", outcome="failed")
        == 1
    )
    # Refused at once from now on (no second load), with the same clear status.
    with pytest.raises(grpc.aio.AioRpcError) as again:
        await recognize(stub, b"", "corrupt")
    assert again.value.code() == grpc.StatusCode.FAILED_PRECONDITION


@pytest.mark.parametrize(
    "name", ["no-tokenizer", "tampered", ".swapped-v2.partial-8c1d", "x" * 999]
)
async def test_models_that_are_not_offered_are_invalid_argument(
    channel: grpc.aio.Channel, name: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await recognize(pb_grpc.VoiceGatewayStub(channel), b"", name)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = err.value.details() or ""
    assert "is not loaded; ListModels has whisper-base, corrupt, same, swapped" in details
    assert len(details) < 400


async def test_load_on_start_loads_before_serving_and_refuses_a_model_it_cannot_serve(
    models_dir: Path,
) -> None:
    def hub(names: list[str]) -> Any:
        asr = {"models_dir": str(models_dir), "load_on_start": names}
        return build_hub(load_config(None, {"engines": "asr", "asr": asr}))

    bad = hub(["same", "no-tokenizer"])
    with pytest.raises(EngineLoadError) as err:
        await bad.start(GatewayMetrics())
    assert "asr.load_on_start names a model that cannot be served" in str(err.value)
    assert "'no-tokenizer' is not loaded" in str(err.value)
    good = hub(["same"])
    await good.start(GatewayMetrics())
    try:
        assert {d.name: d.loaded for d in good.info.models} == {
            "whisper-base": True,
            "corrupt": False,
            "same": True,
            "swapped": False,
        }
    finally:
        await good.aclose()


def _serve(models_dir: Path, log: Path) -> tuple[subprocess.Popen[str], str]:
    with log.open("w") as err:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "voxgate.cli",
                "serve",
                "--engines",
                "asr",
                "--port",
                "0",
                "--models-dir",
                str(models_dir),
            ],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            # Admission off, as running_server has it: calls streamed faster than real time
            # read as overload to the load model (tests, not traffic).
            env={
                **os.environ,
                "PYTHONUNBUFFERED": "1",
                "VOXGATE_ADMISSION__ENABLED": "false",
                "VOXGATE_DEGRADE__ENABLED": "false",
                "VOXGATE_LIMITS__MAX_REALTIME_FACTOR": "1000",
            },
            cwd=REPO_ROOT,
        )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.fullmatch(r"listening on (127\.0\.0\.1:\d+)\n", line)
    if not m:
        proc.kill()
        proc.wait()
        raise AssertionError(f"unexpected first line {line!r}; stderr: {log.read_text()}")
    return proc, m.group(1)


async def _names_after_sighup(
    proc: subprocess.Popen[str], stub: pb_grpc.VoiceGatewayStub, log: Path
) -> list[str]:
    """SIGHUP, wait until the server logs that this rescan finished, then ListModels."""

    def rescans() -> int:
        return log.read_text().count("models rescanned:")

    done = rescans()
    proc.send_signal(signal.SIGHUP)
    for _ in range(1200):  # the rescan runs in the background: wait for it, not for a time
        if rescans() > done:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("no 'models rescanned' log line after SIGHUP")
    return [m.name for m in (await stub.ListModels(pb.ListModelsRequest())).models]


async def test_sighup_rescans_the_models_directory_of_voxgate_serve(
    tmp_path: Path, base_dir: Path, speech_dir: Path
) -> None:
    """Adding a model (written aside, then renamed in) needs no restart; removing one stops it
    being offered to new calls while a call already on it finishes on it."""
    models = tmp_path / "models"
    models.mkdir()
    log_file = tmp_path / "serve.log"
    proc, target = _serve(models, log_file)
    audio = encode_wav(speech_dir / CLIP, pb.LINEAR16, 16000)
    try:
        async with grpc.aio.insecure_channel(target) as ch:
            stub = pb_grpc.VoiceGatewayStub(ch)
            names = [m.name for m in (await stub.ListModels(pb.ListModelsRequest())).models]
            assert names == ["whisper-base"]
            partial = swapped_model(base_dir, models / ".swapped.partial-1", *token_ids(base_dir))
            assert await _names_after_sighup(proc, stub, log_file) == ["whisper-base"]
            partial.rename(models / "swapped")
            assert await _names_after_sighup(proc, stub, log_file) == ["whisper-base", "swapped"]
            assert "garden" in (await recognize(stub, audio, "swapped"))[1].lower()
            assert await health(ch, "swapped") == SERVING
            # A call on "swapped" in progress while the directory goes away keeps its model.
            held = stub.StreamingRecognize(
                requests([config(model="swapped"), *chunks(audio, 640)], pace_s=0.02)
            )
            first = await held.read()
            assert first.started.model == "swapped"
            shutil.rmtree(models / "swapped")
            assert await _names_after_sighup(proc, stub, log_file) == ["whisper-base"]
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await recognize(stub, b"", "swapped")
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert await health(ch, "swapped") == NOT_SERVING
            texts = []
            while (r := await held.read()) is not grpc.aio.EOF:
                if r.WhichOneof("event") == "transcript" and r.transcript.is_final:
                    texts.append(r.transcript.text)
            assert "garden" in " ".join(texts).lower()
            assert proc.poll() is None, "SIGHUP must not stop the server"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    log = log_file.read_text()
    assert proc.returncode == 0, log
    assert "models: swapped offered" in log and "models: swapped removed" in log
    assert "models: swapped unloaded" in log
