"""The old path of the synthesis policy, now :mod:`voxgate.gateway.scheduling.synthesis_policy`.

Only a re-export (issue 37), kept while modules edited elsewhere at the same time (the TTS
driver, the runtime) still import this path; import the new one instead. Remove it once
nothing imports it.
"""

from __future__ import annotations

from voxgate.gateway.scheduling.synthesis_policy import (
    CostModel,
    Dispatch,
    SynthItem,
    SynthPolicy,
    default_synth_plan,
    next_work,
)

__all__ = ["CostModel", "Dispatch", "SynthItem", "SynthPolicy", "default_synth_plan", "next_work"]
