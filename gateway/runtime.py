"""Builds the engines a server runs from its configuration (the production EngineHub)."""

from __future__ import annotations

from gateway.config import GatewayConfig
from gateway.server import EngineHub

__all__ = ["build_hub"]


def build_hub(config: GatewayConfig) -> EngineHub | None:
    """The engines named by ``config.engines``; None for a VAD-only server."""
    if config.engines == "none":
        return None
    raise NotImplementedError("engine loading lands with the Whisper and VITS engines")
