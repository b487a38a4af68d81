"""The built-in bots answer turns when the call has turn detection on, else each final."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from voxgate.bridges.bots import EchoBot
from voxgate_client import EndOfTurn, ServerEvent, SessionStarted, Transcript
from voxgate_client._proto import voxgate_pb2 as pb

pytestmark = pytest.mark.unit


class ScriptedCall:
    """A FAKE call: plays scripted events, records what the bot says."""

    def __init__(self, mode: int, events: list[ServerEvent]) -> None:
        cfg = pb.SessionConfig()
        if mode:
            cfg.turn_detection.mode = mode  # type: ignore[assignment]
        self.session = SessionStarted("s", "base", "voice", "v", cfg)
        self._events = [self.session, *events]
        self.said: list[str] = []

    def __aiter__(self) -> AsyncIterator[ServerEvent]:
        async def gen() -> AsyncIterator[ServerEvent]:
            for e in self._events:
                yield e

        return gen()

    async def speak(self, text: str, **_: Any) -> str:
        self.said.append(text)
        return str(len(self.said))


FIRST, SECOND = "And so my fellow Americans,", "ask not what your country can do for you."
WHOLE = f"{FIRST} {SECOND}"


def finals_and_turns() -> list[ServerEvent]:
    return [
        Transcript(FIRST, True, 0, 2900, 0, turn_index=0),
        Transcript(SECOND, True, 3500, 8000, 1, turn_index=0),
        EndOfTurn(0, 0.9, 8000, WHOLE),
    ]


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        (
            pb.TURN_DETECTION_SMART,
            [WHOLE],
        ),
        (
            pb.TURN_DETECTION_SILENCE,
            [WHOLE],
        ),
        (0, [FIRST, SECOND]),
    ],
)
def test_a_turn_taker_answers_the_turn_not_each_final(mode: int, said: list[str]) -> None:
    call = ScriptedCall(mode, finals_and_turns())
    asyncio.run(EchoBot()(call))  # type: ignore[arg-type]
    assert call.said == said
    assert call.session.turn_detection == {0: "off", 2: "silence", 3: "smart"}[mode]
