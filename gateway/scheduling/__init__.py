"""Scheduling in one place: the gateway's policies and the drivers that carry them out.

Recognition (cross-call micro-batching, iteration-level joins):

* :mod:`~voxgate.gateway.scheduling.batch_policy`: :class:`BatchPolicy`, pure and synchronous:
  what runs next (``next_batch``), what joins a running batch (``join``);
* :mod:`~voxgate.gateway.scheduling.batcher`: :class:`Batcher`, the driver: the queue, the
  futures, the engine workers; it runs ``infer_batch`` or drives a :class:`StepEngine`
  (``add`` / ``step`` / ``abort``) between whose steps it adds what the policy lets join;
* :mod:`~voxgate.gateway.scheduling.batch_engine`: the engine protocols, observer hooks and
  counters; :mod:`~voxgate.gateway.scheduling.errors`; :mod:`~voxgate.gateway.scheduling.plan`
  (batch size and worker count per device).

Synthesis (deadline scheduling of decoder windows across replies):
:mod:`~voxgate.gateway.scheduling.synthesis_policy`, the pure policy its driver asks.

Both policies answer "nothing yet, ask again later" with one type, :class:`WaitUntil`
(:mod:`~voxgate.gateway.scheduling.base`). Engines never call into this package: the
scheduler decides who runs and who joins; an engine only adds, steps and aborts.
"""

from __future__ import annotations

from voxgate.gateway.scheduling.base import WaitUntil
from voxgate.gateway.scheduling.batch_engine import (
    BatchEngine,
    BatcherStats,
    BatchObserver,
    StepEngine,
)
from voxgate.gateway.scheduling.batch_policy import Batch, BatchPolicy, Schedulable
from voxgate.gateway.scheduling.batcher import Batcher
from voxgate.gateway.scheduling.errors import (
    BatcherClosedError,
    BatchResultLengthError,
    BatchTimeoutError,
    QueueFullError,
    WithdrawnError,
)
from voxgate.gateway.scheduling.plan import (
    DEFAULT_PLANS,
    BatchPlan,
    choose_plan,
    default_candidates,
    default_plan,
)

__all__ = [
    "DEFAULT_PLANS",
    "Batch",
    "BatchEngine",
    "BatchObserver",
    "BatchPlan",
    "BatchPolicy",
    "BatchResultLengthError",
    "BatchTimeoutError",
    "Batcher",
    "BatcherClosedError",
    "BatcherStats",
    "QueueFullError",
    "Schedulable",
    "StepEngine",
    "WaitUntil",
    "WithdrawnError",
    "choose_plan",
    "default_candidates",
    "default_plan",
]
