"""What the gateway's two schedulers (the batcher, the synthesis scheduler) share.

Both are pure policies asked "what runs now?" that answer either a dispatch of their own kind or
"nothing yet, ask again later": that second answer is one type, here, so that the drivers and
the tests read one shape.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["WaitUntil"]


@dataclass(frozen=True, slots=True)
class WaitUntil:
    """Nothing to dispatch now; ask again at ``at`` unless something changes first.

    Attributes:
        at: when to ask again (strictly later than the ``now`` that produced it), or ``None``:
            only when something changes (a new item, a finished step, a cancellation).
    """

    at: float | None
