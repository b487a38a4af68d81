"""One bot, its own process, every door: the example LLM bot with the real Whisper and Piper.

The bot is ``examples/llm_bot.py``, written only against the public client library
(``voxgate_client``, imported by that name, as a bot author installs it), run as its own
process: ``serve`` on a loopback port for the doors that dial it (the SIP bridge, the
media-stream adapter, and this test acting as a bridge through ``BotLink``), and ``converse``
for a direct Converse call. Its language model is the stand-in ``StandInLlm`` on loopback
(tokens with delays), run here so the test can read what the bot asked it: the caller's words
as the bot heard them, and the history the bot kept after a barge-in.

Callers: a real softphone (baresip, from Debian) calling through Kamailio into the SIP bridge,
playing real speech and recording what it hears (Whisper then checks the recording holds the
bot's answer); the media-stream replayer playing a Twilio stream; and the example's own
``converse`` mode streaming a WAV.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import os
import re
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from calls import encode_wav

from benchmarks import _wer
from voxgate.bridges.media_streams import MediaStreamsConfig, MediaStreamServer
from voxgate.bridges.media_streams.testing import ReplayClient
from voxgate.bridges.sip import BridgeConfig, SipBridge
from voxgate.bridges.sip.testing import Baresip, running_kamailio, write_wav_8k
from voxgate.common.pcm import MULAW_DECODE
from voxgate.gateway.config import load_config
from voxgate.gateway.runtime import build_hub
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate_client import (
    AudioOut,
    BotLink,
    CallConfig,
    CallInfo,
    PlaybackFinished,
    PlaybackInterrupted,
    ServerEvent,
    Transcript,
    VoxgateClient,
    VoxgateSyncClient,
    load_audio,
)

pytestmark = [pytest.mark.e2e, pytest.mark.model, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "llm_bot.py"
QUESTION = "cmu_goforward.wav"  # 2.8 s, one utterance
INTERRUPTION = "vctk_p317_166.wav"
llm_bot = importlib.import_module("examples.llm_bot")


def reference(speech_dir: Path, clip: str) -> str:
    rows = [json.loads(line) for line in (speech_dir / "manifest.jsonl").read_text().splitlines()]
    return str(next(r["text"] for r in rows if r["file"] == clip))


def last_user(messages: list[dict[str, str]]) -> str:
    return next(m["content"] for m in reversed(messages) if m["role"] == "user")


def words(text: str) -> list[str]:
    return re.findall(r"[a-z']+", text.lower())


def caller_wav(speech_dir: Path, path: Path) -> None:
    """The softphone's microphone: 0.5 s of silence, the question at 8 kHz, then 60 s of quiet.

    baresip's file source ends the call when the file ends; the quiet keeps the line open.
    """
    pcm = MULAW_DECODE[np.frombuffer(encode_wav(speech_dir / QUESTION, pb.MULAW, 8000), np.uint8)]
    silence = np.zeros(8000, np.int16)
    audio = np.concatenate([silence[:4000], pcm.astype(np.int16), np.tile(silence, 60)])
    write_wav_8k(path, audio.astype("<i2").tobytes())


def transcribe(target: str, wav: Path) -> list[Transcript]:
    """Final transcripts of a WAV through the gateway (the real Whisper)."""
    client = VoxgateSyncClient(target)
    try:
        return client.transcribe_file(wav, config=CallConfig(sample_rate_hz=8000, language="en"))
    finally:
        client.close()


@asynccontextmanager
async def gateway_and_llm() -> AsyncIterator[tuple[str, Any]]:
    overrides = {"engines": "asr,tts"}
    hub = build_hub(load_config(None, overrides))
    llm = llm_bot.StandInLlm(token_delay_s=0.08)
    await llm.start()
    try:
        async with running_server(hub=hub, **overrides) as srv:
            yield srv.target, llm
    finally:
        await llm.aclose()


def bot_env() -> dict[str, str]:
    # Only the client library on the path, under its distribution name.
    return {**os.environ, "PYTHONPATH": str(REPO / "clients")}


@asynccontextmanager
async def bot_process(llm_port: int) -> AsyncIterator[str]:
    """``llm_bot.py serve`` in its own process; yields its ``host:port``."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(EXAMPLE),
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--llm",
        f"127.0.0.1:{llm_port}",
        stdout=asyncio.subprocess.PIPE,
        env=bot_env(),
    )
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        assert line.startswith("bot listening on "), line
        yield line.split()[-1]
    finally:
        proc.terminate()
        await proc.wait()


async def until(pred: Any, what: str, timeout_s: float = 60.0) -> None:
    """Poll a condition the test cannot be told about (another process's progress)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not pred():
        if loop.time() > deadline:
            raise AssertionError(f"never happened: {what}")
        await asyncio.sleep(0.05)


async def test_the_llm_bot_speaks_as_tokens_arrive_and_keeps_only_what_was_heard(
    speech_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    question = load_audio(speech_dir / QUESTION, mulaw=True)
    interruption = load_audio(speech_dir / INTERRUPTION, mulaw=True)
    events: list[ServerEvent] = []
    actions: list[tuple[float, str, str]] = []  # (loop time, speak_id, text)
    async with (
        gateway_and_llm() as (target, llm),
        bot_process(llm.port) as bot,
        VoxgateClient(target) as client,
    ):
        loop = asyncio.get_running_loop()
        call = await client.converse(
            CallConfig(encoding="mulaw", sample_rate_hz=8000, language="en")
        )
        link = BotLink(
            call,
            bot,
            CallInfo(call_id="llm-1", channel="sip"),
            on_event=events.append,
            on_action=lambda r: (
                actions.append((loop.time(), r.speak.speak_id, r.speak.text))
                if r.WhichOneof("event") == "speak"
                else None
            ),
        )
        run = asyncio.create_task(link.run())
        speech = bytearray()

        async def caller() -> None:
            """Real-time μ-law: silence, except when the test queues speech."""
            start, sent = loop.time(), 0
            while True:
                chunk = bytes(speech[:160]) if speech else b"\xff" * 160
                del speech[:160]
                await call.send_audio(chunk)
                sent += 1
                await asyncio.sleep(max(0.0, start + sent * 0.02 - loop.time()))

        sender = asyncio.create_task(caller())
        await until(lambda: actions, "the greeting")
        greeting_id = actions[0][1]

        def greeted() -> bool:
            return any(
                isinstance(e, PlaybackFinished) and e.speak_id == greeting_id for e in events
            )

        await until(greeted, "the greeting played")
        speech.extend(question.data)
        await until(lambda: len(actions) >= 2, "the first sentence of the answer")
        first_speak = actions[1]
        await until(lambda: len(actions) >= 4, "the whole answer queued")
        answer = actions[1:4]
        # Barge in one second into the answer's second sentence.
        await until(
            lambda: any(isinstance(e, AudioOut) and e.speak_id == answer[1][1] for e in events),
            "the second sentence playing",
        )
        await asyncio.sleep(1.0)
        speech.extend(interruption.data)
        await until(lambda: len(llm.requests) >= 2, "the bot asking the model again")
        await call.hangup()
        outcome = await asyncio.wait_for(run, 60)
        sender.cancel()
        await asyncio.wait([sender])
    assert outcome.reason == "gateway ended" and outcome.bot_fault is None

    # The bot heard the caller's words.
    first = llm.requests[0]
    assert _wer.wer(reference(speech_dir, QUESTION), last_user(first)) <= 0.3, first
    # Sentence by sentence as tokens arrived: the first sentence went out while the model was
    # still writing (its last token left well after), and each sentence was its own speak.
    assert first_speak[0] < llm.done_at[0] - 1.0
    full = llm_bot.stand_in_answer(first)
    assert " ".join(text for _, _, text in answer) == full
    # After the barge-in the history holds what the caller heard, not what the bot queued.
    heard: list[str] = []
    for _, sid, text in answer:
        cut = next(
            (e for e in events if isinstance(e, PlaybackInterrupted) and e.speak_id == sid), None
        )
        if cut is None:
            heard.append(text)
            continue
        heard.extend(cut.words_played)
        break
    second = llm.requests[1]
    kept = next(m["content"] for m in reversed(second) if m["role"] == "assistant")
    assert kept == " ".join(heard)
    assert words(answer[0][2]) == words(kept)[: len(words(answer[0][2]))]  # the whole first
    assert 0 < len(words(kept)) < len(words(full))  # ...but not the part nobody heard
    assert _wer.wer(reference(speech_dir, INTERRUPTION), last_user(second)) <= 0.35, second
    # Nothing the caller said is in any log line, at any level.
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert last_user(first) not in logged and last_user(second) not in logged


async def test_one_bot_process_answers_a_sip_call_a_media_stream_and_a_converse_call(
    speech_dir: Path, tmp_path: Path
) -> None:
    question = speech_dir / QUESTION
    ref = reference(speech_dir, QUESTION)
    async with gateway_and_llm() as (target, llm), bot_process(llm.port) as bot:
        # (1) A phone call: baresip (a real softphone) through Kamailio and the SIP bridge.
        caller_wav(speech_dir, tmp_path / "caller.wav")  # the question after 0.5 s, then quiet
        events: list[ServerEvent] = []
        bridge = SipBridge(
            BridgeConfig(
                listen_host="127.0.0.1",
                listen_port=0,
                gateway=target,
                rtp_port_min=30000,
                rtp_port_max=39999,
                language="en",
            ),
            bot,
            on_event=lambda _, ev: events.append(ev),
        )
        await bridge.start()
        try:
            async with (
                running_kamailio([bridge.address], tmp_path / "kamailio") as kam,
                Baresip(tmp_path / "phone", tmp_path / "caller.wav") as phone,
            ):
                uri = f"sip:bot@{kam.address[0]}:{kam.address[1]}"
                assert (await phone.command("dial", uri))["ok"], phone.log()[-2000:]
                await phone.wait_event("CALL_ESTABLISHED")
                await until(lambda: len(llm.requests) >= 1, "the phone's question")
                # The answer's first two sentences played out to the phone.
                await until(
                    lambda: sum(isinstance(e, PlaybackFinished) for e in events) >= 2,
                    "the spoken answer",
                )
                assert (await phone.command("hangup"))["ok"]
                await phone.wait_event("CALL_CLOSED")
                await until(lambda: not bridge.calls, "the call torn down")
                recordings = phone.recordings()
        finally:
            await bridge.aclose()
        assert _wer.wer(ref, last_user(llm.requests[0])) <= 0.3, llm.requests[0]
        assert recordings
        heard_by_phone = " ".join(
            t.text for t in await asyncio.to_thread(transcribe, target, recordings[0])
        )
        # The answer's second sentence, as Whisper hears it in the phone's recording.
        said = " ".join(words(heard_by_phone))
        assert "good question and i am glad you called about it today" in said, heard_by_phone

        # (2) A replayed Twilio media stream through the adapter.
        config = MediaStreamsConfig(host="127.0.0.1", port=0, gateway=target, language="en")
        async with (
            MediaStreamServer(config, bot) as adapter,
            ReplayClient(f"ws://127.0.0.1:{adapter.address[1]}/twilio") as replay,
        ):
            asked = len(llm.requests)
            await replay.begin()
            await replay.send_silence(2500)  # the greeting
            await replay.send_wav(question)
            await replay.send_silence(1000)
            await until(lambda: len(llm.requests) > asked, "the media stream's question")
            await replay.send_silence(4000)  # the answer plays
            await replay.send_stop()
            await replay.wait_closed()
        assert not replay.violations, replay.violations
        assert len(replay.played) > 3 * 8000  # over 3 s of the bot's speech came back
        assert _wer.wer(ref, last_user(llm.requests[asked])) <= 0.3, llm.requests[asked]

        # (3) A direct Converse call: the same bot code, dialling the gateway itself.
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(EXAMPLE),
            "converse",
            "--gateway",
            target,
            "--llm",
            f"127.0.0.1:{llm.port}",
            "--play",
            str(question),
            "--linger",
            "8",
            stdout=asyncio.subprocess.PIPE,
            env=bot_env(),
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0
        history = json.loads(out.decode().strip().splitlines()[-1])["history"]
        assert _wer.wer(ref, last_user(history)) <= 0.3, history
        assert history[-1]["role"] == "assistant" and history[-1]["content"].startswith("You asked")
