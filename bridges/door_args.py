"""What every door's command shares: its flags and its run until a signal.

``voxgate call``, ``voxgate sip`` and ``voxgate media-streams`` are three doors on one bot
contract. The flags say where a door listens, the gateway it calls (TLS, token) and who
answers, and how it takes turns: spelled and checked here, once, so that the three agree and
a misconfigured door refuses to start instead of having each call refused. The run serves
until SIGTERM or SIGINT, then closes without dropping calls.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, get_args

import grpc

from voxgate_client import (
    TOKEN_ENV,
    EchoHandlingName,
    TurnDetectionName,
    TurnOptions,
    read_token,
    tls_credentials,
)

__all__ = [
    "TURN_CHOICES",
    "add_call_arguments",
    "add_connection_arguments",
    "add_door_arguments",
    "add_turn_arguments",
    "connection_from_args",
    "host_port",
    "serve_door",
    "turn_options_from_args",
]


def host_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` as argparse reads an address flag (an IPv6 host keeps its colons)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host, int(port)


def add_door_arguments(
    parser: argparse.ArgumentParser,
    *,
    listen: tuple[str, int],
    listen_help: str,
    bot_default: str,
    bot_help: str,
) -> None:
    """The flags both doors (``voxgate sip``, ``voxgate media-streams``) open with.

    Where they listen, the gateway they call (with its TLS and token flags, ``--gateway-*``)
    and who answers: one definition, so that the two daemons spell and check them alike.
    """
    parser.add_argument(
        "--listen",
        type=host_port,
        default=listen,
        metavar="HOST:PORT",
        help=listen_help,
    )
    parser.add_argument(
        "--gateway",
        default="127.0.0.1:50051",
        metavar="HOST:PORT",
        help="voxgate gateway gRPC target (default 127.0.0.1:50051)",
    )
    add_connection_arguments(parser, prefix="gateway-")
    parser.add_argument(
        "--bot",
        default=bot_default,
        metavar="none|echo|FILE.yaml|grpc://HOST:PORT",
        help=bot_help,
    )


def add_connection_arguments(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """Add the flags that reach a secured gateway: TLS roots, a client certificate, a token.

    ``voxgate call`` uses them as they are; ``voxgate sip`` with ``prefix="gateway-"`` (its
    other side speaks SIP, so the flags say which leg they are for).
    """
    p = f"--{prefix}"
    parser.add_argument(f"{p}tls", action="store_true", help="TLS with the system's CA roots")
    parser.add_argument(
        f"{p}tls-ca", type=Path, metavar="PEM", help="TLS, trusting this CA (implies --tls)"
    )
    parser.add_argument(
        f"{p}tls-cert", type=Path, metavar="PEM", help="client certificate for mutual TLS"
    )
    parser.add_argument(f"{p}tls-key", type=Path, metavar="PEM", help="its private key")
    parser.add_argument(
        f"{p}token",
        help=f"bearer token (visible in the process list: prefer {p}token-file or {TOKEN_ENV})",
    )
    parser.add_argument(
        f"{p}token-file", type=Path, metavar="FILE", help="read the token from FILE"
    )


def connection_from_args(
    args: argparse.Namespace, prefix: str = ""
) -> tuple[bool | grpc.ChannelCredentials, str | None]:
    """The channel credentials and token the flags of :func:`add_connection_arguments` ask for.

    The token comes from the token flag, else the token file, else ``$VOXGATE_TOKEN``.

    Raises:
        ValueError: a flag's file is unreadable or unusable; the message names the flag.
    """
    dest = prefix.replace("-", "_")
    flag = f"--{prefix}"

    def get(name: str) -> object:
        return getattr(args, dest + name, None)

    ca, cert, key = get("tls_ca"), get("tls_cert"), get("tls_key")
    if (cert is None) != (key is None):
        raise ValueError(f"{flag}tls-cert and {flag}tls-key go together")
    tls: bool | grpc.ChannelCredentials = bool(get("tls"))
    if ca is not None or cert is not None:
        try:
            tls = tls_credentials(ca, cert, key)  # type: ignore[arg-type]
        except (OSError, ValueError) as exc:
            raise ValueError(_plain(exc)) from None
    try:
        token = read_token(get("token"), get("token_file"))  # type: ignore[arg-type]
    except (OSError, ValueError) as exc:
        raise ValueError(_plain(exc)) from None
    return tls, token


#: ``--turns`` values: the call's end-of-turn detection (docs/turns.md).
TURN_CHOICES: tuple[TurnDetectionName, ...] = ("off", "silence", "smart")


def add_call_arguments(
    parser: argparse.ArgumentParser, *, echo_default: str | None, echo_help: str
) -> None:
    """What the daemon doors (``voxgate sip``, ``voxgate media-streams``) ask of each call.

    The caller's language, the reply voice, the echo handling (its help names the door's line:
    a trunk or a provider's stream) and the turn-detection flags, in that order.
    """
    parser.add_argument("--language", default="", help="caller language hint, e.g. en")
    parser.add_argument("--voice", default="", help="gateway voice name (default: its default)")
    parser.add_argument(
        "--echo-handling",
        choices=get_args(EchoHandlingName),
        default=echo_default,
        help=echo_help,
    )
    add_turn_arguments(parser)


def add_turn_arguments(parser: argparse.ArgumentParser) -> None:
    """The turn-detection flags every door shares (``voxgate call``, ``sip``, ``media-streams``).

    One definition, so that the three doors take the same values and say the same thing.
    """
    parser.add_argument(
        "--turns",
        choices=TURN_CHOICES,
        default=None,
        help="end-of-turn detection on each call: off, silence (every utterance is a turn) or "
        "smart (silence, the words so far and the gateway's audio model, if it has one); "
        "with it on the built-in bots answer each EndOfTurn instead of each final "
        "(default: the gateway's session.turns.mode)",
    )
    parser.add_argument(
        "--turn-eagerness",
        type=float,
        default=None,
        metavar="0..1",
        help="smart turns: how readily a turn ends, higher sooner (default: the gateway's)",
    )


def turn_options_from_args(args: argparse.Namespace) -> TurnOptions:
    """The :class:`TurnOptions` the flags of :func:`add_turn_arguments` describe.

    Checked here rather than left to the gateway, which would refuse every call of a
    misconfigured door one by one (INVALID_ARGUMENT) instead of the door refusing to start.

    Raises:
        ValueError: an eagerness outside 0..1, or one given with a mode that has none.
    """
    mode = getattr(args, "turns", None)
    eagerness = getattr(args, "turn_eagerness", None)
    if mode is not None and mode not in TURN_CHOICES:
        raise ValueError(f"--turns {mode!r}: use one of {', '.join(TURN_CHOICES)}")
    if eagerness is None:
        return TurnOptions(mode=mode)
    if not 0.0 <= eagerness <= 1.0:
        raise ValueError(f"--turn-eagerness {eagerness:g}: must be 0..1")
    if mode in ("off", "silence"):
        raise ValueError(f"--turn-eagerness applies to --turns smart, not --turns {mode}")
    return TurnOptions(mode=mode, eagerness=float(eagerness))


def _plain(exc: OSError | ValueError) -> str:
    """The message without Python's ``[Errno N]`` prefix."""
    return str(exc.strerror) if isinstance(exc, OSError) and exc.strerror else str(exc)


class Door(Protocol):
    """A door daemon: the SIP bridge or the media-stream server."""

    async def start(self) -> None:
        """Listen (raises OSError when it cannot)."""

    async def aclose(self) -> None:
        """Stop taking calls and end the ones in progress cleanly."""


async def serve_door(
    door: Door, *, name: str, listen: tuple[str, int], banner: Callable[[], str]
) -> int:
    """Start ``door``, print its banner, serve until SIGTERM/SIGINT, then close it.

    The signal handlers go in before the banner: a supervisor that reads the banner and stops
    the door at once must get its calls ended (BYE, a closed WebSocket), not Python's default
    SIGTERM death. Returns the exit status: 0, or 1 when the door cannot listen.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await door.start()
    except OSError as exc:
        print(f"voxgate {name}: cannot listen on {listen[0]}:{listen[1]}: {exc}", file=sys.stderr)
        await door.aclose()
        return 1
    print(banner(), flush=True)
    try:
        await stop.wait()
    finally:
        await door.aclose()
    print("stopped", file=sys.stderr, flush=True)
    return 0
