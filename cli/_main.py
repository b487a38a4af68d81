"""The ``voxgate`` command line: serve, call, demo, sip, media-streams and adapt.

Flags beat ``VOXGATE_*`` environment variables, which beat a ``--config`` YAML file, which beats
the defaults (see :mod:`voxgate.gateway.config`).

``voxgate --help`` does not print this docstring: it is reST for the reader of the code, and a
terminal would show its markup. The help text is :data:`DESCRIPTION` and :data:`EPILOG`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["build_parser", "main"]

#: What ``voxgate --help`` says above the command list: plain text, no markup.
DESCRIPTION = (
    "voxgate: a real-time voice gateway. A caller's audio goes in over gRPC; speech events, "
    "transcripts and the bot's synthesized replies come back."
)
#: ... and below it.
EPILOG = (
    "Run 'voxgate COMMAND --help' for a command's flags. For serve, flags beat VOXGATE_* "
    "environment variables, which beat a --config YAML file, which beats the defaults."
)


class _JsonFormatter(logging.Formatter):
    """One JSON object per line, for log collectors."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def setup_logging(level: str, fmt: str) -> None:
    """Configure root logging on stderr (stdout is kept for the `listening on` line)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        )
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    logging.Formatter.converter = time.gmtime


def _serve_overrides(args: argparse.Namespace) -> dict[str, Any]:
    server: dict[str, Any] = {}
    for flag, key in (
        ("host", "host"),
        ("port", "port"),
        ("metrics_port", "metrics_port"),
        ("metrics_host", "metrics_host"),
        ("grace_s", "grace_s"),
        ("log_format", "log_format"),
        ("log_level", "log_level"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            server[key] = value
    out: dict[str, Any] = {"server": server} if server else {}
    if getattr(args, "engines", None):
        out["engines"] = args.engines
    asr: dict[str, Any] = {}
    if getattr(args, "model", None):
        asr["model"] = args.model
    if getattr(args, "models_dir", None):
        asr["models_dir"] = str(args.models_dir)
    if getattr(args, "device", None):
        asr["device"] = args.device
    if asr:
        out["asr"] = asr
    if getattr(args, "voice", None):
        out["tts"] = {"voice": args.voice}
    security = {
        key: getattr(args, key)
        for key in ("tls_cert", "tls_key", "client_ca", "tokens_file")
        if getattr(args, key, None) is not None
    }
    if security:
        out["security"] = security
    return out


def _add_server_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="YAML config file (see README)")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="gRPC port; 0 picks a free one (default 50051)")
    p.add_argument(
        "--metrics-port",
        type=int,
        help="Prometheus /metrics port; 0 picks a free one (logged); default: no metrics",
    )
    p.add_argument(
        "--metrics-host", help="/metrics bind address, apart from --host (default 127.0.0.1)"
    )
    p.add_argument("--grace-s", type=float, help="SIGTERM drain period in seconds")
    p.add_argument("--tls-cert", type=Path, help="PEM server certificate (TLS; with --tls-key)")
    p.add_argument("--tls-key", type=Path, help="PEM private key of --tls-cert")
    p.add_argument(
        "--client-ca", type=Path, help="PEM CA that client certificates must chain to (mTLS)"
    )
    p.add_argument(
        "--tokens-file",
        type=Path,
        help="YAML list of bearer tokens (turns authentication on; re-read on SIGHUP)",
    )
    p.add_argument(
        "--engines",
        help="engines to load: asr,tts (default), asr, tts or none (VAD only)",
    )
    p.add_argument("--model", help="Whisper model: 'base' (bundled) or a model directory")
    p.add_argument(
        "--models-dir",
        type=Path,
        help="directory of named models (one subdirectory each, e.g. from voxgate adapt) that "
        "calls pick with config.model; loaded on first use, rescanned on SIGHUP",
    )
    p.add_argument("--device", help="cpu or cuda")
    p.add_argument("--voice", help="Piper voice: 'joe' (bundled) or a .onnx path")
    p.add_argument("--log-format", choices=["text", "json"])
    p.add_argument("--log-level")


def _cmd_serve(args: argparse.Namespace) -> int:
    from voxgate.gateway.config import ConfigError, load_config  # noqa: PLC0415
    from voxgate.gateway.runtime import EngineLoadError, build_hub  # noqa: PLC0415
    from voxgate.gateway.server import serve  # noqa: PLC0415

    try:
        config = load_config(args.config, _serve_overrides(args))
    except ConfigError as exc:
        print(f"voxgate serve: {exc}", file=sys.stderr)
        return 2
    setup_logging(config.server.log_level, config.server.log_format)
    try:
        asyncio.run(serve(config, build_hub(config)))
    except (EngineLoadError, ConfigError) as exc:  # ConfigError: a certificate or token file
        print(f"voxgate serve: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # the port (or the metrics port) is taken
        print(f"voxgate serve: {exc}", file=sys.stderr)
        return 1
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from voxgate.cli.demo import run_demo  # noqa: PLC0415

    setup_logging("WARNING", "text")
    code: int = asyncio.run(run_demo(args))
    return code


def _cmd_call(args: argparse.Namespace) -> int:
    from voxgate.cli.call import run_call  # noqa: PLC0415

    setup_logging("WARNING", "text")
    code: int = asyncio.run(run_call(args))
    return code


def _cmd_sip(args: argparse.Namespace) -> int:
    from voxgate.bridges.sip.cli import run_sip  # noqa: PLC0415

    setup_logging("INFO", "text")
    code: int = asyncio.run(run_sip(args))
    return code


def _cmd_media_streams(args: argparse.Namespace) -> int:
    from voxgate.bridges.media_streams.cli import run_media_streams  # noqa: PLC0415

    setup_logging("INFO", "text")
    code: int = asyncio.run(run_media_streams(args))
    return code


def _cmd_adapt(args: argparse.Namespace) -> int:
    from voxgate.cli._adapt import run_adapt  # noqa: PLC0415

    setup_logging("WARNING", "text")
    return run_adapt(args)


class _HelpFormatter(argparse.HelpFormatter):
    """The help formatter of ``voxgate --help``: every command on one line.

    argparse measures subcommand names at the subparsers' indent, two columns short of where
    it prints them, so the longest name ("media-streams") would wrap its help onto a second
    line; this counts those two columns.
    """

    def add_argument(self, action: argparse.Action) -> None:
        super().add_argument(action)
        if action.help is not argparse.SUPPRESS and isinstance(action.choices, dict):
            self._action_max_length += 2


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed for tests and docs)."""
    parser = argparse.ArgumentParser(
        prog="voxgate",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=_HelpFormatter,
    )
    sub = parser.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("serve", help="run the gateway server (gRPC, optional metrics)")
    _add_server_flags(p)
    p.set_defaults(func=_cmd_serve)

    c = sub.add_parser("call", help="play a WAV as the caller against a running server")
    c.add_argument("file", type=Path, help="caller audio (WAV, mono 8/16/24/48 kHz)")
    c.add_argument("--target", default="127.0.0.1:50051", help="server host:port")
    c.add_argument("--realtime", action="store_true", help="stream at real-time pace")
    c.add_argument("--say", action="append", default=[], help="text the bot says at the start")
    c.add_argument(
        "--bot",
        default="",
        help="who answers: echo, sample, a YAML rules file, or grpc://HOST:PORT of a bot "
        "served with voxgate_client.serve_bot (default: nobody)",
    )
    c.add_argument("--out", type=Path, help="write the reply audio to this WAV")
    c.add_argument("--timeline", type=Path, help="draw the call to this PNG")
    c.add_argument("--mulaw", action="store_true", help="send as 8 kHz mu-law (telephone)")
    c.add_argument(
        "--wait-for-bot",
        nargs="?",
        const="end",
        default="never",
        choices=("never", "start", "end"),  # voxgate.cli.call.WAIT_FOR_BOT_CHOICES
        help="when the caller's audio pauses for the bot: never (the default: straight "
        "through, over the bot), start (hear the greeting out; after each utterance, wait until "
        "the answer starts, so the next one may interrupt it) or end (wait until each answer "
        "ends; the bare flag)",
    )
    from voxgate.bridges.door_args import add_connection_arguments, add_turn_arguments  # noqa: PLC0415

    add_turn_arguments(c)
    add_connection_arguments(c)
    c.set_defaults(func=_cmd_call)

    d = sub.add_parser("demo", help="run a whole sample call on an in-process server")
    d.add_argument("--audio", type=Path, help="caller WAV (default: the bundled sample)")
    d.add_argument("--out", type=Path, default=Path("reply.wav"), help="reply audio WAV")
    d.add_argument("--timeline", type=Path, default=Path("call.png"), help="timeline PNG")
    d.add_argument("--engines", default="asr,tts", help="engines to load (asr,tts / none)")
    d.add_argument(
        "--fast",
        action="store_true",
        help="send the caller audio as fast as the server allows (default: real time)",
    )
    # Real time is the default now; the old flag stays accepted so scripts keep working.
    d.add_argument("--realtime", action="store_true", help=argparse.SUPPRESS)
    # The bot answers each EndOfTurn instead of each final (voice to voice with turns).
    add_turn_arguments(d)
    d.set_defaults(func=_cmd_demo)

    from voxgate.bridges.sip.cli import add_sip_arguments  # noqa: PLC0415

    s = sub.add_parser("sip", help="answer phone calls (SIP/RTP) and bridge them to a gateway")
    add_sip_arguments(s)
    s.set_defaults(func=_cmd_sip)

    from voxgate.bridges.media_streams.cli import add_media_streams_arguments  # noqa: PLC0415

    m = sub.add_parser("media-streams", help="answer Twilio/Telnyx media-stream WebSockets")
    add_media_streams_arguments(m)
    m.set_defaults(func=_cmd_media_streams)

    from voxgate.cli._adapt import add_adapt_arguments  # noqa: PLC0415

    a = sub.add_parser("adapt", help="fine-tune the recogniser on a domain into a named model")
    add_adapt_arguments(a)
    a.set_defaults(func=_cmd_adapt)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``voxgate`` console script."""
    args = build_parser().parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
