"""``voxgate demo``: one command that shows a whole call.

Starts an in-process gateway with the bundled engines on a free loopback port, plays the
bundled sample caller recording through it, lets the sample bot (``sample_bot.yaml``) answer
with synthesized speech, then writes the reply audio and a timeline PNG and prints the latency
table. ``--engines none`` runs the same call VAD-only (speech events, no transcripts or
speech), which needs no model at all.

The caller behaves like a person on the phone, so that the demo shows every part of a call:
it speaks at real time (``--fast`` sends as fast as the server allows, for a quick check) and
takes turns as ``voxgate call --wait-for-bot start`` does: it hears the greeting out, and after
its first sentence waits until the bot starts to answer. The recording's second sentence
begins 1.4 s after the first ends, while the bot is still saying its 4 s answer: the caller
talks over it and the reply is cut, one barge-in. Waiting for the answer to start (instead of
playing on regardless) makes that barge-in independent of how fast recognition is on the
machine at hand. The answer to the second sentence comes after the recording has ended and
plays in full.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from voxgate.bridges.bots import sample_bot_path
from voxgate.bridges.door_args import turn_options_from_args
from voxgate.cli.call import CallOptions, CallResult, play_call
from voxgate_client import sample_call_path

__all__ = ["demo_call", "run_demo"]


async def run_demo(args: argparse.Namespace) -> int:
    """Entry point of ``voxgate demo`` (flags in cli/_main.py)."""
    return (await demo_call(args)).exit_code


async def demo_call(args: argparse.Namespace) -> CallResult:
    """Run the demo call and return what happened (tests look at its events and log)."""
    # Server imports stay inside: a client-only install must import this module cheaply.
    from voxgate.gateway.config import ConfigError, load_config  # noqa: PLC0415
    from voxgate.gateway.runtime import EngineLoadError, build_hub  # noqa: PLC0415
    from voxgate.gateway.server import GatewayServer  # noqa: PLC0415

    engines = args.engines or "asr,tts"
    try:
        turns = turn_options_from_args(args)
    except ValueError as exc:  # checked before any model loads, as voxgate call does
        print(f"voxgate demo: {exc}", file=sys.stderr)
        return CallResult(2)
    try:
        config = load_config(None, {"engines": engines, "server": {"host": "127.0.0.1", "port": 0}})
    except ConfigError as exc:  # e.g. --engines with a typo; as `voxgate serve` reports it
        print(f"voxgate demo: {exc}", file=sys.stderr)
        return CallResult(2)
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
        return CallResult(2)
    server = GatewayServer(config, hub)
    try:
        await server.start()
    except (EngineLoadError, ConfigError) as exc:  # a missing model or voice: as serve says it
        print(f"voxgate demo: {exc}", file=sys.stderr)
        return CallResult(2)
    try:
        opts = CallOptions(
            file=Path(args.audio) if args.audio else Path(sample_call_path()),
            target=server.target,
            realtime=not getattr(args, "fast", False),
            bot=str(sample_bot_path()),
            out=args.out,
            timeline=args.timeline,
            # Hears the greeting out, then talks over the first answer (see the docstring).
            wait_for_bot="start",
            turns=turns,
        )
        return await play_call(opts)
    finally:
        await server.stop(grace_s=0.0)
