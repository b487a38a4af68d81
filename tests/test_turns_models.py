"""ListModels and a call's effective config say which turn detection the server runs.

Real in-process servers: the default configuration with the bundled models (a recogniser, and
Smart Turn v3.2 from the ``turn`` extra's pipecat-ai, which CI installs), the same where that
extra is missing (no audio model; it still starts), a VAD-only one (no recogniser: no turn
detection, refused when asked for, no model loaded), and one with a FAKE recogniser whose
``session.turns.smart_turn_model`` is a tiny ONNX classifier this test builds with Smart Turn's
input and output shape: what is reported is its file name, never a claim about its output.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import onnx
import pytest
from onnx import TensorProto, helper

from voxgate.engines.turn import SMART_TURN_FILE, _smart_turn, smart_turn_source, smart_turn_spec
from voxgate.gateway.config import load_config
from voxgate.gateway.runtime import build_hub
from voxgate.gateway.testing.batched import FakeBatchedAsrHub, fake_result
from voxgate.gateway.testing.fake_engines import FakeBatchEngine
from voxgate.gateway.testing.server import running_server
from voxgate_client import CallConfig, TurnOptions, VoxgateClient, VoxgateError
from voxgate_client._proto import voxgate_pb2 as pb

pytestmark = pytest.mark.e2e


def tiny_turn_model(path: Path) -> Path:
    """An ONNX graph with Smart Turn v3's signature: (1, 80, 800) features -> a probability."""
    x = helper.make_tensor_value_info("input_features", TensorProto.FLOAT, [1, 80, 800])
    y = helper.make_tensor_value_info("probability", TensorProto.FLOAT, [1, 1, 1])
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["input_features"], ["m"], axes=[1, 2], keepdims=1),
            helper.make_node("Sigmoid", ["m"], ["probability"]),
        ],
        "tiny-turn",
        [x],
        [y],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


async def _default_server_turns() -> tuple[Any, Any]:
    """ListModels' turn detection and a smart call's SessionStarted on the default server."""
    cfg = load_config(None, {"server": {"host": "127.0.0.1", "port": 0, "grace_s": 1.0}})
    async with (
        running_server(hub=build_hub(cfg), config=cfg) as srv,
        VoxgateClient(srv.target) as client,
    ):
        info = await client.turn_detection()
        call = await client.converse(CallConfig(turns=TurnOptions(mode="smart")))
        async with call:
            session = call.session
            await call.hangup()
            async for _ in call:
                pass
    return info, session


async def test_the_default_server_offers_smart_turns_with_the_turn_extras_audio_model() -> None:
    assert smart_turn_spec("auto") == "pipecat", (
        "pipecat-ai is not installed: pip install -e '.[turn]' (CI's .ci/run does)"
    )
    info, session = await _default_server_turns()
    assert list(info.modes) == [pb.TURN_DETECTION_SILENCE, pb.TURN_DETECTION_SMART]
    assert info.default_mode == pb.TURN_DETECTION_OFF
    assert info.audio_model == SMART_TURN_FILE
    assert session is not None and session.turn_detection == "smart"
    assert session.turn_model == SMART_TURN_FILE


async def test_without_the_turn_extra_the_default_server_starts_without_an_audio_model(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_smart_turn, "_installed_member", lambda: None)
    with caplog.at_level("INFO", logger="voxgate.service"):
        info, session = await _default_server_turns()
    assert list(info.modes) == [pb.TURN_DETECTION_SILENCE, pb.TURN_DETECTION_SMART]
    assert info.audio_model == ""
    assert session is not None and session.turn_detection == "smart"
    assert session.turn_model == ""
    assert "voxgate[turn]" in caplog.text


def test_a_named_pipecat_copy_that_is_missing_says_how_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def missing(name: str) -> None:
        raise _smart_turn.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(_smart_turn.metadata, "distribution", missing)
    assert smart_turn_spec("auto") == ""
    assert smart_turn_spec("pipecat") == "pipecat"
    with pytest.raises(FileNotFoundError, match=r"voxgate\[turn\]"):
        smart_turn_source("pipecat")


async def test_a_server_without_a_recogniser_offers_no_turn_detection() -> None:
    async with running_server() as srv, VoxgateClient(srv.target) as client:
        info = await client.turn_detection()
        assert srv.servicer is not None
        assert srv.servicer.turn_model is None  # "auto" loads nothing no call could use
    assert list(info.modes) == []
    assert info.audio_model == ""


async def test_the_loaded_audio_model_is_named_in_list_models_and_in_smart_calls(
    tmp_path: Path,
) -> None:
    model = tiny_turn_model(tmp_path / "tiny-turn.onnx")
    turns = {"mode": "smart", "smart_turn_model": str(model)}
    # Turns need a recogniser (a server without one has none): a FAKE one.
    hub = FakeBatchedAsrHub([FakeBatchEngine(fake_result)])
    async with (
        running_server(hub=hub, session={"turns": turns}) as srv,
        VoxgateClient(srv.target) as client,
    ):
        info = await client.turn_detection()
        started: dict[str, Any] = {}
        for name, options in {
            "default": TurnOptions(),
            "silence": TurnOptions(mode="silence"),
        }.items():
            call = await client.converse(CallConfig(turns=options))
            async with call:
                started[name] = call.session
                await call.hangup()
                async for _ in call:
                    pass
    assert info.audio_model == "tiny-turn.onnx"
    assert info.default_mode == pb.TURN_DETECTION_SMART
    assert started["default"].turn_detection == "smart"
    assert started["default"].turn_model == "tiny-turn.onnx"
    # Silence turns never consult the model: the call says so.
    assert started["silence"].turn_detection == "silence"
    assert started["silence"].turn_model == ""


@pytest.mark.parametrize("mode", ["smart", "silence"])
async def test_a_server_without_a_recogniser_refuses_a_call_that_asks_for_turns(mode: str) -> None:
    """Asked for, turn detection is refused there (FAILED_PRECONDITION naming the field);
    the server's own default does not apply (the call runs, its turns off)."""
    async with running_server() as srv, VoxgateClient(srv.target) as client:
        with pytest.raises(VoxgateError) as refused:
            call = await client.converse(CallConfig(turns=TurnOptions(mode=mode)))
            async with call:
                await call.hangup()
                async for _ in call:
                    pass
    assert refused.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "config.turn_detection.mode" in refused.value.message
    assert "without one" in refused.value.message
    async with (
        running_server(session={"turns": {"mode": "smart"}}) as srv,
        VoxgateClient(srv.target) as client,
    ):
        call = await client.converse(CallConfig())
        async with call:
            session = call.session
            await call.hangup()
            async for _ in call:
                pass
    assert session is not None and session.turn_detection == "off"
