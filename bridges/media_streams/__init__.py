"""The media-streams adapter: Twilio Media Streams (and Telnyx) WebSockets bridged to voxgate.

A cloud telephony provider dials the adapter's WebSocket URL per call and streams the caller's
audio as base64 G.711 at 8 kHz; the adapter opens one gateway ``Converse`` call per stream
(μ-law or A-law straight through, no resampling) and hands it to the bot contract
(:class:`voxgate_client.BotLink`), exactly as the SIP bridge does. Reply audio goes back as
20 ms ``media`` messages paced to the provider's playout, a ``mark`` after each reply, and
``clear`` on barge-in. See ``docs/media-streams.md``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._dialect import DIALECTS, DialectName, ProtocolError

if TYPE_CHECKING:
    from ._server import MediaStreamsConfig, MediaStreamServer, StreamRecord

__all__ = [
    "DIALECTS",
    "DialectName",
    "MediaStreamServer",
    "MediaStreamsConfig",
    "ProtocolError",
    "StreamRecord",
]


def __getattr__(name: str) -> Any:
    # The server (websockets, grpc, the bot link) loads on first use, not when the CLI builds
    # its parser: ``voxgate --help`` must not pay for, or depend on, every command's imports.
    if name in ("MediaStreamServer", "MediaStreamsConfig", "StreamRecord"):
        from . import _server  # noqa: PLC0415

        return getattr(_server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
