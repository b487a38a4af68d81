"""The calls in progress on one servicer: how many, their sessions, how they ended, and drain.

The servicer decides whether a stream is admitted and runs it; this registry is what it counts
with. Admission reads the counts (real-time calls, bulk calls, Synthesize streams), the
server's load monitor reads them each second, graceful shutdown stops new calls
(:attr:`CallRegistry.accepting`), asks every call in progress to end without losing speech
(:meth:`CallRegistry.end_calls`) and waits for the last one (:meth:`CallRegistry.wait_idle`).
"""

from __future__ import annotations

import asyncio
from collections import Counter

from voxgate.gateway.session import CallSession

__all__ = ["CallRegistry"]


class CallRegistry:
    """Active calls and Synthesize streams of one servicer, and the drain that ends them."""

    def __init__(self) -> None:
        #: Calls (Converse and StreamingRecognize) admitted and not yet ended.
        self.active_calls = 0
        #: Synthesize streams in progress (they count against admission too).
        self.active_synthesize = 0
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
