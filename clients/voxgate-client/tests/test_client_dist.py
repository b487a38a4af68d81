"""The installed voxgate-client distribution, on whatever protobuf this environment has.

clients/setup-venvs.sh runs this file in three environments (protobuf 5.29, 6.x, 7.x), each
against a real server with the bundled models; tests/test_client_distribution.py in the main
suite drives those runs and sets VOXGATE_EXPECT_PROTOBUF to the major each one must be on.
"""

from __future__ import annotations

import importlib.util
import os
import re

import grpc
import pytest
import voxgate_client
from google.protobuf import __version__ as protobuf_version
from voxgate_client import (
    AS_FAST_AS_ALLOWED,
    CallConfig,
    SpeechBegin,
    SpeechEnd,
    Transcript,
    VoxgateClient,
    VoxgateError,
    load_audio,
    sample_call_path,
    stream_audio,
)


def test_runs_on_the_protobuf_this_environment_was_built_for() -> None:
    expected = os.environ.get("VOXGATE_EXPECT_PROTOBUF")
    if expected is not None:  # set by the main suite; a bare local run checks the rest only
        assert protobuf_version.split(".")[0] == expected, protobuf_version
    from voxgate_client._proto import voxgate_pb2 as pb

    assert pb.DESCRIPTOR.name == "voxgate/v1/voxgate.proto"
    assert pb.DESCRIPTOR.package == "voxgate.v1"


def test_no_server_code_is_installed() -> None:
    for name in ("gateway", "engines", "cli", "clients", "voxgate"):
        assert importlib.util.find_spec(name) is None, name
    assert voxgate_client.__name__ == "voxgate_client"


async def test_recognizes_the_sample_call(target: str) -> None:
    async with VoxgateClient(target) as client:
        call = await client.recognize(CallConfig(word_timestamps=True))
        audio = load_audio(sample_call_path())
        await stream_audio(call, audio, AS_FAST_AS_ALLOWED)
        await call.flush()
        await call.done_sending()
        events = [e async for e in call]
    kinds = [type(e) for e in events if isinstance(e, SpeechBegin | SpeechEnd | Transcript)]
    finals = [e for e in events if isinstance(e, Transcript) and e.is_final]
    assert kinds[0] is SpeechBegin
    text = re.sub(r"[^a-z ]", "", " ".join(f.text for f in finals).lower())
    assert "ask not what your country can do for you" in text, text
    assert "block books" in text, text
    assert all(f.words for f in finals)
    assert finals[0].words[0].start_ms < finals[0].words[-1].end_ms


async def test_synthesizes_a_reply_with_word_times(target: str) -> None:
    async with VoxgateClient(target) as client:
        chunks = [c async for c in client.synthesize("Hello there, how can I help?")]
    assert chunks[-1].is_last
    assert sum(len(c.data) for c in chunks) > 16000  # more than half a second at 16 kHz
    words = [w for c in chunks for w, _ in c.words]
    assert words[:2] == ["Hello", "there,"] or [w.strip(",").lower() for w in words[:2]] == [
        "hello",
        "there",
    ]


async def test_a_bad_config_is_invalid_argument(target: str) -> None:
    async with VoxgateClient(target) as client:
        with pytest.raises(VoxgateError) as err:
            await client.recognize(CallConfig(sample_rate_hz=12345))
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT
