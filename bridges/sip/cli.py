"""``voxgate sip``: run the SIP bridge until SIGTERM/SIGINT.

Wiring into the main CLI::

    from voxgate.bridges.sip.cli import add_sip_arguments, run_sip
    p = sub.add_parser("sip", help="answer phone calls (SIP/RTP) and bridge them to a gateway")
    add_sip_arguments(p)
    ...
    return asyncio.run(run_sip(args))
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys

from pydantic import SecretStr, ValidationError

from voxgate.bridges.bots import (
    BOT_HELP,
    BotFileError,
    SilentBot,
    add_bot_policy_arguments,
    bot_policy_from_args,
    load_bot,
)
from voxgate.bridges.door_args import (
    add_call_arguments,
    add_door_arguments,
    connection_from_args,
    serve_door,
    turn_options_from_args,
)
from voxgate.bridges.sip._bridge import BridgeConfig, SipBridge

__all__ = ["add_sip_arguments", "main", "run_sip"]


def _port_range(value: str) -> tuple[int, int]:
    lo, sep, hi = value.partition("-")
    if not sep or not lo.isdigit() or not hi.isdigit() or int(lo) > int(hi):
        raise argparse.ArgumentTypeError(f"expected LOW-HIGH (e.g. 10000-20000), got {value!r}")
    return int(lo), int(hi)


def add_sip_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``voxgate sip`` flags to ``parser``."""
    add_door_arguments(
        parser,
        listen=("0.0.0.0", 5060),
        listen_help="SIP UDP address (default 0.0.0.0:5060)",
        bot_default="none",
        bot_help=BOT_HELP,
    )
    add_bot_policy_arguments(parser, can_transfer=True)
    parser.add_argument(
        "--advertise",
        metavar="HOST",
        default=None,
        help="address put in Contact/SDP (default: derived from --listen)",
    )
    parser.add_argument(
        "--rtp-ports",
        type=_port_range,
        default=(10000, 20000),
        metavar="LOW-HIGH",
        help="RTP port range (default 10000-20000)",
    )
    parser.add_argument(
        "--max-calls",
        type=int,
        default=100,
        help="concurrent calls before 486 Busy Here (default 100)",
    )
    parser.add_argument(
        "--ring-ms",
        type=int,
        default=0,
        help="send 180 Ringing and wait this long before answering (default 0)",
    )
    parser.add_argument(
        "--jitter-ms", type=int, default=60, help="receive jitter buffer delay (default 60)"
    )
    add_call_arguments(
        parser,
        echo_default="",
        echo_help="how the gateway keeps this trunk's echo of the bot from barging in: gate (flat "
        "echo: digital and four-wire lines), gate_aec3 (flat echo, soft-spoken callers heard "
        "sooner, twice the CPU on a trunk that echoes) or aec3 (echo through an analogue hybrid); "
        "default: the gateway's",
    )
    parser.add_argument(
        "--log-content",
        action="store_true",
        help="debugging: log transcripts, bot replies and DTMF digits (personal data; off "
        "by default)",
    )
    parser.add_argument(
        "--rtp-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="end a call when no RTP has come from the caller for S seconds (default 30)",
    )
    parser.add_argument(
        "--max-call",
        type=float,
        default=3600.0,
        metavar="S",
        help="end any call S seconds after it was answered (default 3600)",
    )
    parser.add_argument(
        "--session-expires",
        type=int,
        default=1800,
        metavar="S",
        help="RFC 4028 session interval: the most accepted, and asked of callers that "
        "support timers (default 1800; 0: only honour the caller's)",
    )
    parser.add_argument(
        "--min-se",
        type=int,
        default=90,
        metavar="S",
        help="shortest session interval accepted; shorter gets 422 (default 90)",
    )
    parser.add_argument(
        "--sip-log-level",
        default=None,
        help="log level when run standalone (python -m voxgate.bridges.sip)",
    )


async def run_sip(args: argparse.Namespace) -> int:
    """Run the bridge until SIGTERM/SIGINT, then end every call with BYE; returns an exit code."""
    try:
        bot = load_bot(args.bot) or SilentBot()
        bot_policy = bot_policy_from_args(args)
        # Checks the files and resolves the token (flag, file or $VOXGATE_TOKEN) up front.
        tls, token = connection_from_args(args, prefix="gateway-")
        turns = turn_options_from_args(args)
        config = BridgeConfig(
            listen_host=args.listen[0],
            listen_port=args.listen[1],
            gateway=args.gateway,
            gateway_tls=tls is not False,
            gateway_tls_ca=args.gateway_tls_ca,
            gateway_tls_cert=args.gateway_tls_cert,
            gateway_tls_key=args.gateway_tls_key,
            gateway_token=SecretStr(token) if token else None,
            advertise_host=args.advertise,
            rtp_port_min=args.rtp_ports[0],
            rtp_port_max=args.rtp_ports[1],
            max_calls=args.max_calls,
            ring_ms=args.ring_ms,
            jitter_ms=args.jitter_ms,
            language=args.language,
            voice=args.voice,
            echo_handling=args.echo_handling,
            turns=turns.mode or "",
            turn_eagerness=turns.eagerness,
            log_content=args.log_content,
            rtp_timeout_s=args.rtp_timeout,
            max_call_s=args.max_call,
            session_expires_s=args.session_expires,
            min_se_s=args.min_se,
        )
    except (BotFileError, ValidationError, ValueError, OSError) as exc:
        print(f"voxgate sip: {exc}", file=sys.stderr)
        return 2
    bridge = SipBridge(config, bot, bot_policy=bot_policy)
    return await serve_door(
        bridge,
        name="sip",
        listen=args.listen,
        banner=lambda: f"sip listening on {bridge.address[0]}:{bridge.address[1]}",
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m voxgate.bridges.sip``: the same as ``voxgate sip``."""
    parser = argparse.ArgumentParser(prog="voxgate sip", description=__doc__.splitlines()[0])
    add_sip_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=(args.sip_log_level or "INFO").upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return asyncio.run(run_sip(args))
