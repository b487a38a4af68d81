"""`voxgate serve` as tools outside this repo start it: `--port 0`, one `listening on` line.

And `voxgate demo` reports a missing model or voice as serve does: one line, exit 2.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

pytestmark = pytest.mark.e2e


def start(*args: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "voxgate.cli", "serve", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.fullmatch(r"listening on (127\.0\.0\.1:\d+)\n", line)
    if not m:
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"unexpected first line {line!r}; stderr: {err}")
    return proc, m.group(1)


def stop(proc: subprocess.Popen[str]) -> int:
    """SIGTERM, then wait; communicate() also closes the pipes."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode


async def health(target: str) -> int:
    async with grpc.aio.insecure_channel(target) as ch:
        resp = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="voxgate.v1.VoiceGateway")
        )
        return int(resp.status)


def test_serve_prints_listening_once_serving_and_exits_cleanly_on_sigterm() -> None:
    proc, target = start(
        "--host", "127.0.0.1", "--port", "0", "--engines", "none", "--grace-s", "1"
    )
    try:
        assert asyncio.run(health(target)) == health_pb2.HealthCheckResponse.SERVING
    finally:
        code = stop(proc)
    assert code == 0


def test_environment_configures_the_server() -> None:
    env_port = "0"
    os.environ["VOXGATE_SERVER__PORT"] = env_port
    try:
        proc, _target = start("--host", "127.0.0.1", "--engines", "none")
    finally:
        del os.environ["VOXGATE_SERVER__PORT"]
    assert stop(proc) == 0


def test_invalid_configuration_is_refused_with_the_field_name() -> None:
    out = subprocess.run(  # noqa: PLW1510 - the return code is the assertion
        [sys.executable, "-m", "voxgate.cli", "serve", "--port", "70000", "--engines", "none"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "port" in out.stderr and "65535" in out.stderr


def run_serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - the return code is the assertion
        [sys.executable, "-m", "voxgate.cli", "serve", "--host", "127.0.0.1", "--port", "0", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def one_clear_line(out: subprocess.CompletedProcess[str], code: int, *needles: str) -> None:
    assert out.returncode == code, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    for needle in needles:
        assert needle in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("yaml_text", "needles"),
    [
        ("asr:\n  modle: large\n", ["asr.modle: unknown field"]),
        ("asr:\n  policy:\n    temperatures: hot\n", ["asr.policy.temperatures:", "'hot'"]),
        ("tts:\n  window_frames: -3\n", ["tts.window_frames:"]),
        ("session:\n  interim_interval_ms: 5\n", ["session.interim_interval_ms:"]),
        ("engines: [asr, stt]\n", ["engines."]),
        ("vad: [1, 2\n", ["is not valid YAML"]),
    ],
    ids=["typo-in-asr", "deep-type", "tts", "session", "engine-name", "yaml-syntax"],
)
def test_a_config_error_at_any_depth_exits_2_with_its_path(
    tmp_path: Path, yaml_text: str, needles: list[str]
) -> None:
    """v0.1: `asr:` and `tts:` were untyped dicts; a typo crashed start-up with a traceback."""
    cfg = tmp_path / "voxgate.yaml"
    cfg.write_text(yaml_text)
    flags = [] if yaml_text.startswith("engines") else ["--engines", "none"]
    one_clear_line(run_serve("--config", str(cfg), *flags), 2, *needles)


def test_a_bad_environment_variable_exits_2_with_its_path() -> None:
    out = run_serve("--engines", "none", env={"VOXGATE_VAD__FRAME_MS": "25"})
    one_clear_line(out, 2, "VOXGATE_* environment", "vad:", "frame_ms=25")


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--model", "/nonexistent", "--engines", "asr,tts"], "asr.model: model '/nonexistent'"),
        (["--voice", "/nonexistent.onnx", "--engines", "tts"], "tts.voice: voice file not found"),
    ],
    ids=["model", "voice"],
)
def test_a_missing_model_or_voice_is_one_line_and_exit_2(flags: list[str], needle: str) -> None:
    """v0.1: loaded the voice first, then died with a 30-line traceback."""
    out = run_serve(*flags)
    one_clear_line(out, 2, needle)
    assert len(out.stderr.strip().splitlines()) <= 3, out.stderr


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"VOXGATE_ASR__MODEL": "/nonexistent"}, "asr.model: model '/nonexistent'"),
        ({"VOXGATE_TTS__VOICE": "/nonexistent.onnx"}, "tts.voice: voice file not found"),
    ],
    ids=["model", "voice"],
)
def test_demo_with_a_missing_model_or_voice_is_one_line_and_exit_2_as_serve(
    env: dict[str, str], needle: str, tmp_path: Path
) -> None:
    """It printed EngineLoadError's traceback (server.start() was not guarded); serve's line."""
    out = subprocess.run(  # noqa: PLW1510 - the return code is the assertion
        [sys.executable, "-m", "voxgate.cli", "demo", "--fast"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        cwd=tmp_path,  # the demo writes reply.wav and call.png here (it must not get that far)
    )
    one_clear_line(out, 2, needle)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"voxgate demo: {needle}"), out.stderr
    assert not list(tmp_path.iterdir())


def test_a_taken_port_fails_with_a_clear_message() -> None:
    """v0.1: gRPC's SO_REUSEPORT let a second server 'listen' on the same port."""
    proc, target = start("--host", "127.0.0.1", "--port", "0", "--engines", "none")
    try:
        port = target.rsplit(":", 1)[1]
        out = run_serve("--port", port, "--engines", "none")
        one_clear_line(out, 1, f"cannot listen on 127.0.0.1:{port}")
        assert "listening on" not in out.stdout
    finally:
        assert stop(proc) == 0


def test_metrics_port_0_picks_a_free_port_and_logs_it() -> None:
    """v0.1: --metrics-port 0 disabled metrics while --port 0 picked a port, and nothing said
    where metrics were served."""
    proc, _ = start(
        "--host", "127.0.0.1", "--port", "0", "--engines", "none", "--metrics-port", "0"
    )
    try:
        assert proc.stderr is not None
        line = ""
        for _ in range(50):
            line = proc.stderr.readline()
            if "metrics on" in line:
                break
        m = re.search(r"metrics on (http://127\.0\.0\.1:(\d+)/metrics)", line)
        assert m, line
        body = urllib.request.urlopen(m.group(1), timeout=10).read().decode()
        assert "voxgate_calls_active" in body
    finally:
        assert stop(proc) == 0
