"""The calls in progress on one servicer: how many, their sessions, how they ended, and drain.

The servicer decides whether a stream is admitted and runs it; this registry is what it counts
with. Admission reads the counts (real-time calls, bulk calls, Synthesize streams), the
server's load monitor reads them each second, graceful shutdown stops new calls
(:attr:`CallRegistry.accepting`), asks every call in progress to end without losing speech
(:meth:`CallRegistry.end_calls`) and waits for the last one (:meth:`CallRegistry.wait_idle`).
A call's finals ask it whether the call has the server to itself (:meth:`CallRegistry.alone`).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

from voxgate.gateway.base import Synthesizer, TtsPiece
from voxgate.gateway.events import SpeakIn
from voxgate.gateway.session import CallSession

__all__ = ["CallRegistry", "CountingSynthesizer"]


class CallRegistry:
    """Active calls and Synthesize streams of one servicer, and the drain that ends them."""

    def __init__(self) -> None:
        #: Calls (Converse and StreamingRecognize) admitted and not yet ended.
        self.active_calls = 0
        #: Synthesize streams in progress (they count against admission too).
        self.active_synthesize = 0
        #: Replies being synthesized now, Converse replies and Synthesize streams alike
        #: (counted by :class:`CountingSynthesizer`).
        self.synthesizing = 0
        #: False once shutdown began: new streams are refused as UNAVAILABLE.
        self.accepting = True
        #: How calls ended, by outcome (the calls-ended metric's labels), for observers.
        self.outcomes: Counter[str] = Counter()
        self._sessions: dict[str, CallSession] = {}
        self._ending = False
        self._idle = asyncio.Event()
        self._idle.set()

    def opened(self) -> None:
        """A call was admitted (before its first message is read)."""
        self.active_calls += 1
        self._idle.clear()

    def started(self, session_id: str, session: CallSession) -> None:
        """A call's session exists; one that starts while the server drains ends at once."""
        self._sessions[session_id] = session
        if self._ending:
            session.shutdown()

    def closed(self, session_id: str, outcome: str) -> None:
        """A call ended (``outcome``: ok, cancelled, or an error kind's value)."""
        self.outcomes[outcome] += 1
        self.active_calls -= 1
        self._sessions.pop(session_id, None)
        if self.active_calls == 0:
            self._idle.set()

    def alone(self) -> bool:
        """Whether a call has the server to itself: no other call, no reply being synthesized.

        Asked by a call when it requests a final (``AsrRequest.alone``): on the CPU such a
        final may encode on every core, which only pays while nothing else wants one. Another
        call's decode, or a voice's window, started meanwhile would share the cores with it
        (docs/turns.md, "A lone call's final encoded on both cores").
        """
        return self.active_calls <= 1 and self.synthesizing == 0

    def bulk_calls(self) -> int:
        """Calls in progress whose audio runs ahead of real time now (see CallSession.bulk)."""
        return sum(1 for session in self._sessions.values() if session.bulk)

    async def wait_idle(self) -> None:
        """Return once no call is active (graceful shutdown waits here)."""
        await self._idle.wait()

    def end_calls(self) -> int:
        """Ask every active call to end without losing speech (see ``CallSession.shutdown``).

        Calls that have not sent their config yet are ended as soon as they do. Returns how
        many calls were asked.
        """
        self._ending = True
        for session in self._sessions.values():
            session.shutdown()
        return len(self._sessions)


class CountingSynthesizer:
    """The server's voice, counting the replies it is synthesizing into a registry.

    Wraps whatever :class:`~voxgate.gateway.base.Synthesizer` the server runs, so that every
    reply is counted the same way (a call's replies and Synthesize streams) without each voice
    keeping a count of its own. A stream counts from its first piece asked for until it ends,
    fails or its consumer closes it (a barge-in).
    """

    def __init__(self, inner: Synthesizer, registry: CallRegistry) -> None:
        self.inner = inner
        self.sample_rate_hz = inner.sample_rate_hz
        self.max_text_chars = inner.max_text_chars
        self._registry = registry

    async def stream(self, speak: SpeakIn) -> AsyncIterator[TtsPiece]:
        """The inner voice's pieces for ``speak``, counted while they flow."""
        self._registry.synthesizing += 1
        pieces = self.inner.stream(speak)
        try:
            async for piece in pieces:
                yield piece
        finally:
            self._registry.synthesizing -= 1
            # Closed with this stream (a barge-in), so the voice stops at once as before.
            aclose = getattr(pieces, "aclose", None)
            if aclose is not None:
                await aclose()
