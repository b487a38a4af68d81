"""Helpers for tests that drive a real server over a real channel."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import soxr
from conftest import read_wav_int16

from voxgate.common.pcm import ALAW_ENCODE, MULAW_ENCODE, float_to_pcm16, pcm16_to_float
from voxgate.gateway.config import load_config
from voxgate.gateway.runtime import build_hub
from voxgate.gateway.server import GatewayServer
from voxgate.gateway.testing.server import running_server
from voxgate.v1 import voxgate_pb2 as pb
from voxgate.v1 import voxgate_pb2_grpc as pb_grpc


def encode_wav(path: Path, encoding: int, rate: int) -> bytes:
    """A 16 kHz WAV converted to the wire format a client would send."""
    pcm, sr = read_wav_int16(path)
    x = pcm16_to_float(pcm)
    if rate != sr:
        x = soxr.resample(x, sr, rate).astype(np.float32)
    p = float_to_pcm16(x)
    if encoding == pb.LINEAR16:
        return p.astype("<i2").tobytes()
    table = MULAW_ENCODE if encoding == pb.MULAW else ALAW_ENCODE
    return table[p.astype(np.int64) + 32768].tobytes()


def config(encoding: int = pb.LINEAR16, rate: int = 16000, **kw: Any) -> pb.ConverseRequest:
    return pb.ConverseRequest(
        config=pb.SessionConfig(
            input_audio=pb.AudioFormat(encoding=encoding, sample_rate_hertz=rate), **kw
        )
    )


def chunks(data: bytes, size: int) -> list[pb.ConverseRequest]:
    return [
        pb.ConverseRequest(audio=pb.AudioChunk(data=data[i : i + size]))
        for i in range(0, len(data), size)
    ]


async def requests(
    msgs: Sequence[pb.ConverseRequest], pace_s: float = 0.0
) -> AsyncIterator[pb.ConverseRequest]:
    for m in msgs:
        yield m
        await asyncio.sleep(pace_s)


async def recognize(
    stub: pb_grpc.VoiceGatewayStub, audio: bytes, model: str = ""
) -> tuple[str, str]:
    """One StreamingRecognize call: (SessionStarted.model, the finals' text joined)."""
    msgs = [config(model=model), *chunks(audio, 640)]
    started, texts = "", []
    async for r in stub.StreamingRecognize(requests(msgs)):
        kind = r.WhichOneof("event")
        if kind == "started":
            started = r.started.model
        elif kind == "transcript" and r.transcript.is_final:
            texts.append(r.transcript.text)
    return started, " ".join(texts).strip()


@contextlib.asynccontextmanager
async def models_server(models_dir: Path) -> AsyncIterator[GatewayServer]:
    """A real ASR gateway serving ``models_dir`` beside the default model, paced for tests."""
    hub = build_hub(load_config(None, {"engines": "asr", "asr": {"models_dir": str(models_dir)}}))
    fast = {"limits": {"max_realtime_factor": 1000.0}}
    async with running_server(hub=hub, **fast) as srv:  # type: ignore[arg-type]
        yield srv


def truth(wav: Path) -> list[dict[str, Any]]:
    segments: list[dict[str, Any]] = json.loads(wav.with_suffix(".json").read_text())["segments"]
    return segments
