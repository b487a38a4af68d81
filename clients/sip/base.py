"""The bot a SIP call talks to: the smallest interface that turns what the caller did into speech.

Threading: every method is called on the bridge's event loop, one call at a time per call, and
must return quickly (no I/O, no model work). Each call gets its own bot instance.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Bot", "BotFactory"]


class Bot(Protocol):
    """Decides what to say; the bridge sends each returned string to the gateway as ``speak``."""

    def greeting(self) -> str | None:
        """Text to say once the call is answered, or None for silence."""
        ...

    def on_transcript(self, text: str) -> list[str]:
        """Replies to one final transcript of the caller (empty: say nothing)."""
        ...

    def on_dtmf(self, digit: str) -> list[str]:
        """Replies to one keypad press (``0``-``9``, ``*``, ``#``, ``A``-``D``)."""
        ...


class BotFactory(Protocol):
    """Makes a fresh bot for each call, so calls never share conversation state."""

    def __call__(self) -> Bot:
        """A new bot for one call."""
        ...
