"""The bots as docs/bots.md and examples/llm_bot.py tell a user to run them, with the README's
installation only.

Each bot runs as its own process with this environment's python and nothing on ``PYTHONPATH``,
from a directory outside the repository, so ``import voxgate_client`` is served by the
installation alone (``pip install -e '.[piper,viz,turn]'``): it used to fail there, where only
``clients.voxgate_client`` imported. The caller is ``voxgate call --bot grpc://...``, a door on
the bot contract as the SIP bridge and the media-stream adapter are, and the example's own
``converse`` mode.

The gateway is a real in-process server on its default configuration with a FAKE recogniser
behind the real batcher (finals read "fake transcript of N s") and a FAKE tone voice cut to
200 ms per reply: never evidence that recognition or synthesis works (tests/test_bot_doors.py
runs the example with the real models); here the import, the wiring and the doors are checked.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shutil
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from voxgate.gateway.base import TtsPiece, VoiceDescription
from voxgate.gateway.events import SpeakIn
from voxgate.gateway.server import GatewayServer
from voxgate.gateway.testing.batched import FakeBatchedAsrHub, fake_result
from voxgate.gateway.testing.fake_engines import FakeBatchEngine, FakeToneSynthesizer
from voxgate.gateway.testing.server import running_server

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
BOTS_MD = REPO / "docs" / "bots.md"
EXAMPLE = REPO / "examples" / "llm_bot.py"
VOXGATE = Path(sys.executable).parent / "voxgate"
CLIP = "cmu_goforward.wav"  # 2.8 s, one utterance
#: A guard against a hung process, never a speed check.
HANG_GUARD_S = 120.0
#: What docs/bots.md says to run, after its two Python blocks (saved as bot.py).
DOC_COMMANDS = ["python bot.py &", "voxgate call caller.wav --bot grpc://127.0.0.1:7000"]


class BriefToneVoice(FakeToneSynthesizer):
    """The fake tone voice, at most 200 ms per reply (two characters' worth)."""

    async def stream(self, speak: SpeakIn) -> AsyncIterator[TtsPiece]:
        async for piece in super().stream(dataclasses.replace(speak, text=speak.text[:2])):
            yield piece


@pytest.fixture
async def server() -> AsyncIterator[GatewayServer]:
    hub = FakeBatchedAsrHub([FakeBatchEngine(fake_result)], synthesizer=BriefToneVoice())
    hub.info.voices = [VoiceDescription(name="tone", language="", sample_rate_hz=16000)]
    async with running_server(hub=hub) as srv:  # type: ignore[arg-type]
        yield srv


def doc_blocks(lang: str) -> list[str]:
    text = BOTS_MD.read_text(encoding="utf-8")
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, re.M | re.S)


def installed_env() -> dict[str, str]:
    """This environment as a user's shell has it: the installation, no PYTHONPATH."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


async def start(*argv: str, cwd: Path, ready: str) -> tuple[asyncio.subprocess.Process, str]:
    """Start a long-running process; returns it and the address its ``ready`` line names."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=installed_env(),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), HANG_GUARD_S)).decode()
    if not line.startswith(ready):
        await stop(proc)
        err = (await proc.stderr.read()).decode()
        raise AssertionError(f"{argv[1:3]}: expected {ready!r}, got {line!r}; stderr:\n{err}")
    return proc, line.split()[-1]


async def stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        proc.terminate()
        await proc.wait()


async def run(*argv: str, cwd: Path) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=installed_env(),
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


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


async def test_the_bot_of_docs_bots_md_runs_as_written_and_answers_a_call(
    server: GatewayServer, speech_dir: Path, tmp_path: Path
) -> None:
    handler, serve = doc_blocks("python")[:2]
    (tmp_path / "bot.py").write_text(handler + "\n\n" + serve)
    [commands] = [b for b in doc_blocks("bash") if "bot.py" in b]
    assert commands.splitlines() == DOC_COMMANDS  # what this test runs, below
    shutil.copy(speech_dir / CLIP, tmp_path / "caller.wav")
    if not port_is_free(7000):
        pytest.fail("port 7000, which docs/bots.md's bot listens on, is taken on this machine")

    bot, _ = await start(sys.executable, "bot.py", cwd=tmp_path, ready="bot listening on ")
    try:
        # The gateway is this test's server, not `voxgate serve` on the default port.
        code, out, err = await run(
            str(VOXGATE),
            *DOC_COMMANDS[1].split()[1:],
            "--target",
            server.target,
            cwd=tmp_path,
        )
    finally:
        await stop(bot)
    assert code == 0, out + err
    assert 'bot: "Hello, how can I help?"' in out, out
    assert re.search(r'bot: "You said fake transcript of [\d.]+ s"', out), out


async def test_examples_llm_bot_runs_as_its_docstring_says(
    server: GatewayServer, speech_dir: Path, tmp_path: Path
) -> None:
    doc = EXAMPLE.read_text(encoding="utf-8")
    for mode in ("llm --listen", "serve --listen", "converse --gateway"):
        assert f"python examples/llm_bot.py {mode}" in doc  # the commands run below
    caller = tmp_path / "caller.wav"
    shutil.copy(speech_dir / CLIP, caller)
    py, example = sys.executable, str(EXAMPLE)

    llm, llm_addr = await start(
        py, example, "llm", "--listen", "127.0.0.1:0", cwd=tmp_path, ready="llm listening on "
    )
    try:
        bot, bot_addr = await start(
            py,
            example,
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--llm",
            llm_addr,
            cwd=tmp_path,
            ready="bot listening on ",
        )
        try:
            # A door dials the served bot per call (the docstring's is `voxgate sip`).
            code, out, err = await run(
                str(VOXGATE),
                "call",
                str(caller),
                "--bot",
                f"grpc://{bot_addr}",
                "--target",
                server.target,
                cwd=tmp_path,
            )
        finally:
            await stop(bot)
        assert code == 0, out + err
        assert 'bot: "Hello, how can I help you?"' in out, out
        assert re.search(r'bot: "You asked about fake transcript of [\d.]+ s\."', out), out

        # The direct Converse door: the example is caller and bot in one process.
        code, out, err = await run(
            py,
            example,
            "converse",
            "--gateway",
            server.target,
            "--llm",
            llm_addr,
            "--play",
            str(caller),
            "--linger",
            "3",
            cwd=tmp_path,
        )
    finally:
        await stop(llm)
    assert code == 0, out + err
    history = json.loads(out.strip().splitlines()[-1])["history"]
    users = [m["content"] for m in history if m["role"] == "user"]
    assert users and users[0].startswith("fake transcript of"), history
    assert history[-1]["role"] == "assistant", history
    assert history[-1]["content"].startswith("You asked about fake transcript of"), history
