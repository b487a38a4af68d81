"""The sentinel that closes the queues between a call's stages."""

from __future__ import annotations

__all__ = ["END", "End"]


class End:
    """Queue sentinel: no more items."""


END = End()
