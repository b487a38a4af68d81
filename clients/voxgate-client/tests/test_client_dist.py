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
from google.protobuf import __version__ as protobuf_version

import voxgate_client
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


async def test_serves_a_bot_and_links_a_call_to_it(target: str) -> None:
    """The bot contract on this protobuf: a served bot greets a linked call, then hangs up."""
    seen: list[voxgate_client.CallInfo] = []

    async def bot(call: voxgate_client.VoiceCall) -> None:
        seen.append(call.info)
        sid = await call.speak("Hello there.")
        async for event in call:
            if isinstance(event, voxgate_client.PlaybackFinished) and event.speak_id == sid:
                await call.hangup()

    audio: list[voxgate_client.AudioOut] = []
    async with (
        await voxgate_client.serve_bot(bot) as server,
        VoxgateClient(target) as client,
    ):
        call = await client.converse(CallConfig(encoding="mulaw", sample_rate_hz=8000))
        info = voxgate_client.CallInfo(
            call_id="dist-1", channel="sip", headers={"X-Test": "1"}, transfer_supported=True
        )
        link = voxgate_client.BotLink(
            call,
            server.address,
            info,
            on_event=lambda e: audio.append(e) if isinstance(e, voxgate_client.AudioOut) else None,
        )
        outcome = await link.run()
        await call.aclose()
    assert outcome.reason == "bot hung up" and outcome.bot_fault is None
    assert seen[0].call_id == "dist-1" and dict(seen[0].headers) == {"X-Test": "1"}
    assert sum(len(a.data) for a in audio) > 4000  # over half a second of μ-law speech
