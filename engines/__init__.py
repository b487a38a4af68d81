"""Inference engines: small synchronous classes that run on their own worker threads.

Nothing in this package imports ``grpc`` or ``asyncio``: the gateway owns concurrency and
transport, an engine owns a model. Import the concrete engines from their subpackages
(``voxgate.engines.asr``, ``voxgate.engines.tts``) so that importing the shared types stays cheap.
"""

from __future__ import annotations

from voxgate.engines.base import UtteranceStats

__all__ = ["UtteranceStats"]
