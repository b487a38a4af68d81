"""``voxgate media-streams``: serve provider media streams until SIGTERM/SIGINT."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from voxgate.bridges.bots import add_bot_policy_arguments, bot_policy_from_args
from voxgate.bridges.door_args import (
    add_call_arguments,
    add_door_arguments,
    connection_from_args,
    serve_door,
    turn_options_from_args,
)

from ._dialect import DIALECTS

__all__ = ["add_media_streams_arguments", "run_media_streams"]


def _read_stream_token(path: Path | None) -> str | None:
    """The one token in ``path`` (URL-safe: it travels as a path segment), or None."""
    if path is None:
        return None
    try:
        words = path.read_text(encoding="utf-8").split()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--stream-token-file {path}: cannot read it ({exc})") from None
    if len(words) != 1:
        raise ValueError(f"--stream-token-file {path}: must hold exactly one token")
    token = words[0]
    if len(token) < 16 or not all(c.isascii() and (c.isalnum() or c in "-_.~") for c in token):
        raise ValueError(
            f"--stream-token-file {path}: the token must be 16 or more URL-safe characters "
            "(letters, digits, - _ . ~)"
        )
    return token


def add_media_streams_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``voxgate media-streams`` flags to ``parser``."""
    add_door_arguments(
        parser,
        listen=("127.0.0.1", 8080),
        listen_help="WebSocket address (default 127.0.0.1:8080; put TLS in front: providers "
        "dial wss)",
        bot_default="echo",
        bot_help="who answers each call: a built-in bot, a rules file or a bot service "
        "(default echo)",
    )
    add_bot_policy_arguments(parser, can_transfer=False)  # a WebSocket stream has no REFER
    parser.add_argument(
        "--dialect",
        choices=DIALECTS,
        default="twilio",
        help="message format when the URL path does not end in /twilio or /telnyx (default twilio)",
    )
    add_call_arguments(
        parser,
        echo_default=None,
        echo_help="how the gateway keeps the line's echo of the bot from barging in: gate, "
        "gate_aec3 (soft callers over a loud echo heard sooner) or aec3 (a carrier leg that "
        "echoes through an analogue hybrid); default: the gateway's",
    )
    parser.add_argument(
        "--lead-ms",
        type=int,
        default=100,
        help="how far reply audio may run ahead of the provider's playout (default 100)",
    )
    parser.add_argument(
        "--max-streams", type=int, default=200, help="concurrent streams (default 200)"
    )
    parser.add_argument(
        "--max-message-bytes",
        type=int,
        default=64 * 1024,
        help="largest WebSocket message; bigger closes the stream with 1009 (default 65536)",
    )
    parser.add_argument(
        "--gateway-chunk-ms",
        type=int,
        default=40,
        help="caller audio goes to the gateway in pieces of this many ms, a multiple of 20 "
        "(default 40: half the CPU of 20, 20 ms later)",
    )
    parser.add_argument(
        "--stream-token-file",
        type=Path,
        metavar="FILE",
        help="require this file's token in the WebSocket URL path (wss://host/TOKEN/twilio) "
        "or Telnyx's x-telnyx-streaming-auth-token header; others get HTTP 401",
    )
    parser.add_argument(
        "--log-content",
        action="store_true",
        help="debugging: log DTMF digits (personal data; off by default)",
    )


async def run_media_streams(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT, then close every stream (1001); returns an exit code."""
    from voxgate.bridges.bots import load_bot  # noqa: PLC0415  (loads YAML and bot code only when run)

    from ._server import MediaStreamsConfig, MediaStreamServer  # noqa: PLC0415

    try:
        bot = load_bot(args.bot or "none")
        if bot is None:  # only for an empty value, which the default rules out
            raise ValueError("--bot must name a bot")
        tls, token = connection_from_args(args, prefix="gateway-")
        bot_policy = bot_policy_from_args(args)
        turns = turn_options_from_args(args)
        if not 0 <= args.lead_ms <= 2000:
            raise ValueError(f"--lead-ms must be 0..2000, got {args.lead_ms}")
        if not (20 <= args.gateway_chunk_ms <= 200 and args.gateway_chunk_ms % 20 == 0):
            raise ValueError(
                f"--gateway-chunk-ms must be 20..200 in steps of 20, got {args.gateway_chunk_ms}"
            )
        stream_token = _read_stream_token(args.stream_token_file)
        if args.max_streams < 1 or args.max_message_bytes < 1024:
            raise ValueError("--max-streams must be >= 1 and --max-message-bytes >= 1024")
    except (ValueError, OSError) as exc:
        print(f"voxgate media-streams: {exc}", file=sys.stderr)
        return 2
    config = MediaStreamsConfig(
        host=args.listen[0],
        port=args.listen[1],
        gateway=args.gateway,
        gateway_tls=tls,
        gateway_token=token,
        dialect=args.dialect,
        language=args.language,
        voice=args.voice,
        echo_handling=args.echo_handling,
        lead_ms=args.lead_ms,
        max_streams=args.max_streams,
        max_message_bytes=args.max_message_bytes,
        log_content=args.log_content,
        gateway_chunk_ms=args.gateway_chunk_ms,
        stream_token=stream_token,
        bot_policy=bot_policy,
        turns=turns,
    )
    server = MediaStreamServer(config, bot)
    return await serve_door(
        server,
        name="media-streams",
        listen=args.listen,
        banner=lambda: f"media streams listening on ws://{server.address[0]}:{server.address[1]}",
    )
