"""``voxgate demo``: one command that shows a whole call.

Starts an in-process gateway with the bundled engines on a free loopback port, plays the
bundled sample caller recording through it, lets the sample bot (``sample_bot.yaml``) answer
with synthesized speech, then writes the reply audio and a timeline PNG and prints the latency
table. ``--engines none`` runs the same call VAD-only (speech events, no transcripts or
speech), which needs no model at all.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clients.bot import sample_bot_path
from clients.cli import CallOptions, play_call
from clients.voxgate_client import sample_call_path

__all__ = ["run_demo"]


async def run_demo(args: argparse.Namespace) -> int:
    """Entry point of ``voxgate demo`` (flags in cli/_main.py)."""
    # Server imports stay inside: a client-only install must import this module cheaply.
    from gateway.config import load_config  # noqa: PLC0415
    from gateway.runtime import build_hub  # noqa: PLC0415
    from gateway.server import GatewayServer  # noqa: PLC0415

    engines = args.engines or "asr,tts"
    config = load_config(None, {"engines": engines, "server": {"host": "127.0.0.1", "port": 0}})
    print(
        f"voxgate demo: starting a gateway with engines={engines} (loading models may take a "
        "while)...",
        flush=True,
    )
    try:
        hub = build_hub(config)
    except NotImplementedError as exc:
        print(
            f"voxgate demo: engines={engines!r} are not available in this build ({exc}); "
            "`voxgate demo --engines none` runs the call with speech events only",
            file=sys.stderr,
        )
        return 2
    server = GatewayServer(config, hub)
    await server.start()
    try:
        opts = CallOptions(
            file=Path(args.audio) if args.audio else Path(sample_call_path()),
            target=server.target,
            realtime=bool(args.realtime),
            bot=str(sample_bot_path()),
            out=args.out,
            timeline=args.timeline,
            # The sample caller is polite: it waits for the bot's answers (no barge-in).
            wait_for_bot=True,
        )
        result = await play_call(opts)
    finally:
        await server.stop(grace_s=0.0)
    return result.exit_code
