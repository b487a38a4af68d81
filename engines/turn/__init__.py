"""Audio end-of-turn models: whether the last seconds of a caller's speech end their turn."""

from voxgate.engines.turn._smart_turn import (
    SMART_TURN_FILE,
    SMART_TURN_SECONDS,
    SmartTurn,
    smart_turn_source,
    smart_turn_spec,
)

__all__ = [
    "SMART_TURN_FILE",
    "SMART_TURN_SECONDS",
    "SmartTurn",
    "smart_turn_source",
    "smart_turn_spec",
]
