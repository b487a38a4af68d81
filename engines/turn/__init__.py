"""Audio end-of-turn models: whether the last seconds of a caller's speech end their turn.

The API is ``_smart_turn``'s, re-exported whole (its ``__all__`` is this package's).
"""

from voxgate.engines.turn._smart_turn import *  # noqa: F403
from voxgate.engines.turn._smart_turn import __all__ as __all__
