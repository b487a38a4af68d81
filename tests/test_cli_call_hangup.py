"""`voxgate call` hangs up once the call is over, whatever the bot says (or does not say).

The gateway is a real in-process server on its default configuration with a FAKE recogniser
behind the real batcher (``FakeBatchedAsrHub``: finals without a model) and the FAKE tone voice
(100 ms of tone per character), never evidence that recognition or synthesis works; the caller
is the real command, run as a user runs it.

It used to wait for a reply that never came: with a bot that stays silent after the last
final (``--bot none``, or rules that match nothing), nothing more arrived to re-check whether
the call was over, so the gateway's idle timeout ended it 61 s later with DEADLINE_EXCEEDED
and exit 1 (without ``--bot`` the same call ended in 2.4 s).
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from voxgate.gateway.base import VoiceDescription
from voxgate.gateway.server import GatewayServer
from voxgate.gateway.testing.batched import FakeBatchedAsrHub, fake_result
from voxgate.gateway.testing.fake_engines import FakeBatchEngine, FakeToneSynthesizer
from voxgate.gateway.testing.server import running_server
from voxgate_client import sample_call_path

pytestmark = pytest.mark.e2e

#: A guard against a hung command (the bug: the gateway's 60 s idle timeout ended the call),
#: never a speed check.
HANG_GUARD_S = 150.0


@pytest.fixture
async def server() -> AsyncIterator[GatewayServer]:
    hub = FakeBatchedAsrHub([FakeBatchEngine(fake_result)], synthesizer=FakeToneSynthesizer())
    hub.info.voices = [VoiceDescription(name="tone", language="", sample_rate_hz=16000)]
    async with running_server(hub=hub) as srv:  # type: ignore[arg-type]
        yield srv


async def voxgate_call(target: str, *args: str) -> tuple[int, str, str]:
    """``voxgate call`` on the bundled two-utterance sample; (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "voxgate.cli",
        "call",
        str(sample_call_path()),
        "--target",
        target,
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), HANG_GUARD_S)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def silent_rules(tmp_path: Path) -> str:
    """Rules that answer one phrase the caller never says, and have no fallback."""
    path = tmp_path / "rules.yaml"
    path.write_text('rules:\n  - if_says: "refund please"\n    say: "Refunds take five days."\n')
    return str(path)


@pytest.mark.parametrize("bot", ["none", "silent rules"])
async def test_a_bot_silent_after_the_last_final_gets_a_hangup_and_exit_0(
    server: GatewayServer, tmp_path: Path, bot: str
) -> None:
    spec = silent_rules(tmp_path) if bot == "silent rules" else bot
    code, out, err = await voxgate_call(server.target, "--bot", spec)
    assert code == 0, out + err
    assert "DEADLINE_EXCEEDED" not in out + err and "error" not in out, out
    assert out.count('caller: "fake transcript') >= 2, out  # every utterance got its final
    assert 'bot: "' not in out  # and the bot really said nothing
    assert "latency" in out  # the call ran to its end, table and all


async def test_a_bot_that_answers_still_hangs_up_after_its_last_reply(
    server: GatewayServer,
) -> None:
    """Unchanged: the call ends once every reply has played out."""
    code, out, err = await voxgate_call(server.target, "--bot", "echo")
    assert code == 0, out + err
    assert out.count('bot: "fake transcript') >= 2, out
    last = re.findall(r"bot audio starts \(speak (\w+)\)", out)[-1]
    assert re.search(rf"bot finished speaking \([\d.]+ s, speak {last}\)", out), out
