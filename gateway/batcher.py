"""The old path of the batcher, which now lives in :mod:`voxgate.gateway.scheduling` (issue 37).

Only a re-export, kept while modules edited elsewhere at the same time (the runtime, the
session) still import this path; import from ``voxgate.gateway.scheduling`` instead. Remove
it once nothing imports it.
"""

from __future__ import annotations

from voxgate.gateway.scheduling import (
    BatchEngine,
    Batcher,
    BatchObserver,
    BatchPlan,
    BatchPolicy,
    BatchTimeoutError,
    QueueFullError,
    WithdrawnError,
    default_plan,
)

__all__ = [
    "BatchEngine",
    "BatchObserver",
    "BatchPlan",
    "BatchPolicy",
    "BatchTimeoutError",
    "Batcher",
    "QueueFullError",
    "WithdrawnError",
    "default_plan",
]
