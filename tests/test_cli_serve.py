"""`voxgate serve` as tools outside this repo start it: `--port 0`, one `listening on` line."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

pytestmark = pytest.mark.e2e


def start(*args: str) -> tuple[subprocess.Popen[str], str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "serve", *args],
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
        [sys.executable, "-m", "cli", "serve", "--port", "70000", "--engines", "none"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "port" in out.stderr and "65535" in out.stderr
