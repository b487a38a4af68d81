"""``voxgate call --turns``: the caller's call gets turn detection, and its bot answers turns.

A real in-process gateway on its default configuration with the bundled models (Whisper base,
the Piper voice); the caller is the real command, run as a user runs it, on the bundled
two-utterance sample. Without the flag the call keeps the gateway's default (off): no
EndOfTurn, and the bot answers each final as before.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest
from test_cli_call_hangup import voxgate_call as call_on_sample

from voxgate.gateway.config import load_config
from voxgate.gateway.runtime import build_hub
from voxgate.gateway.server import GatewayServer
from voxgate.gateway.testing.server import running_server

pytestmark = [pytest.mark.e2e, pytest.mark.model]


@pytest.fixture
async def server() -> AsyncIterator[GatewayServer]:
    cfg = load_config(None, {"server": {"host": "127.0.0.1", "port": 0, "grace_s": 1.0}})
    async with running_server(hub=build_hub(cfg), config=cfg) as srv:
        yield srv


async def voxgate_call(target: str, *args: str) -> tuple[int, str]:
    """``voxgate call --bot echo`` on the bundled sample; (exit code, stdout and stderr)."""
    code, out, err = await call_on_sample(target, "--bot", "echo", *args)
    return code, out + err


async def test_a_call_with_turns_gets_end_of_turn_and_its_bot_answers_each_turn(
    server: GatewayServer,
) -> None:
    code, out = await voxgate_call(server.target, "--turns", "smart", "--turn-eagerness", "0.9")
    assert code == 0, out
    assert "turn detection smart" in out, out
    turns = re.findall(r"end of turn (\d+) ", out)
    assert turns and turns == [str(i) for i in range(len(turns))], out
    finals = re.findall(r'caller: "', out)
    replies = re.findall(r'bot: "', out)
    # The echo bot says each turn back once: on its EndOfTurn, never on a final of it.
    assert len(replies) == len(turns) <= len(finals), out
    first_turn_end = out.index("end of turn 0 ")
    assert out.index('bot: "') > first_turn_end, out


async def test_a_call_without_the_flag_keeps_the_gateways_default_off(
    server: GatewayServer,
) -> None:
    code, out = await voxgate_call(server.target)
    assert code == 0, out
    assert "turn detection" not in out and "end of turn" not in out, out
    finals = re.findall(r'caller: "', out)
    assert finals and len(re.findall(r'bot: "', out)) == len(finals), out


def test_a_bad_eagerness_is_refused_before_calling() -> None:
    from voxgate.bridges.door_args import turn_options_from_args
    from voxgate.cli._main import build_parser

    parse = build_parser().parse_args
    for door in (["call", "x.wav"], ["sip"], ["media-streams"]):
        args = parse([*door, "--turns", "smart", "--turn-eagerness", "0.7"])
        assert turn_options_from_args(args).mode == "smart"
        assert turn_options_from_args(args).eagerness == pytest.approx(0.7)
        with pytest.raises(ValueError, match="--turn-eagerness 1.5: must be 0..1"):
            turn_options_from_args(parse([*door, "--turn-eagerness", "1.5"]))
        with pytest.raises(ValueError, match="applies to --turns smart"):
            turn_options_from_args(parse([*door, "--turns", "silence", "--turn-eagerness", ".5"]))
