"""An in-process gateway on a loopback port, for tests and benchmarks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from voxgate.gateway.base import EngineHub
from voxgate.gateway.config import GatewayConfig, load_config
from voxgate.gateway.server import GatewayServer

__all__ = ["running_server"]


@asynccontextmanager
async def running_server(
    hub: EngineHub | None = None, config: GatewayConfig | None = None, **overrides: Any
) -> AsyncIterator[GatewayServer]:
    """Start a real grpc.aio server on 127.0.0.1 with a free port; stop it on exit.

    Args:
        hub: engines to serve (None: VAD only).
        config: full configuration; by default the defaults with ``port=0``.
        overrides: nested overrides merged into the config,
            e.g. ``limits={"max_chunk_bytes": 640}``.

    The server runs the default configuration, admission and the degradation ladder
    included: a harness that switched them off hid that they refused the second caller. Tests
    that stream audio faster than real time are bulk calls to admission (served from spare
    capacity, never judged against the real-time latency target), as any such client is.
    """
    base: dict[str, Any] = {"server": {"host": "127.0.0.1", "port": 0, "grace_s": 1.0}}
    for key, value in overrides.items():
        if isinstance(value, dict):
            base.setdefault(key, {}).update(value)
        else:
            base[key] = value
    cfg = config or load_config(None, base)
    server = GatewayServer(cfg, hub)
    await server.start()
    try:
        yield server
    finally:
        await server.stop(grace_s=0.0)
