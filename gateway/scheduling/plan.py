"""How to run an engine on one device: batch size and worker count, chosen by measurement.

:func:`default_plan` is the starting point before anything has been measured;
:func:`choose_plan` picks the best of measured candidates (:func:`default_candidates`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["DEFAULT_PLANS", "BatchPlan", "choose_plan", "default_candidates", "default_plan"]


@dataclass(frozen=True, slots=True)
class BatchPlan:
    """How to run an engine on one device.

    Attributes:
        max_batch_size: the policy's ``max_batch_size``.
        workers: how many worker threads (engine instances or threads on a thread-safe one).
    """

    max_batch_size: int
    workers: int

    def __post_init__(self) -> None:
        if self.max_batch_size < 1 or self.workers < 1:
            raise ValueError(
                f"BatchPlan needs max_batch_size >= 1 and workers >= 1, got "
                f"max_batch_size={self.max_batch_size}, workers={self.workers}"
            )


#: Starting points before anything is measured, from measurements in DESIGN.md:
#: - ``cpu`` (2 cores): concurrent single calls on two workers (CT2 ``inter_threads=2``,
#:   ``intra_threads=1``) beat every batch-of-8 setup by 1.25-1.3x; batching the encoder gains
#:   nothing on CPU and the decoder only 1.15-1.45x at 8, so a batch of 2 is enough to soak up
#:   bursts without making a lone caller pay for others' decoding.
#: - ``cuda``: one worker owns the GPU and batching pays (faster-whisper: 3.7x at batch 8 for
#:   large-v2); 8 is the measured point, 16 is worth measuring with :func:`choose_plan`.
DEFAULT_PLANS: dict[str, BatchPlan] = {
    "cpu": BatchPlan(max_batch_size=2, workers=2),
    "cuda": BatchPlan(max_batch_size=8, workers=1),
}


def _check(device: str, cpu_cores: int) -> None:
    """Refuse an unknown device or fewer than one core (both plan functions take them)."""
    if device not in DEFAULT_PLANS:
        raise ValueError(f"unknown device {device!r}; expected one of {sorted(DEFAULT_PLANS)}")
    if cpu_cores < 1:
        raise ValueError(f"cpu_cores must be >= 1, got {cpu_cores}")


def default_plan(device: Literal["cpu", "cuda"], cpu_cores: int = 2) -> BatchPlan:
    """The unmeasured starting plan for ``device``.

    On CPU the worker count follows the core count (one intra-op thread per worker, as measured
    on 2 cores); more than 2 cores is an extrapolation that :func:`choose_plan` should confirm.

    Args:
        device: ``cpu`` or ``cuda``.
        cpu_cores: cores available to the engine process (CPU only).

    Raises:
        ValueError: for an unknown device or fewer than one core.
    """
    _check(device, cpu_cores)
    plan = DEFAULT_PLANS[device]
    if device == "cpu":
        return BatchPlan(max_batch_size=plan.max_batch_size, workers=cpu_cores)
    return plan


def default_candidates(device: Literal["cpu", "cuda"], cpu_cores: int = 2) -> list[BatchPlan]:
    """Plans worth measuring on ``device``: the default plus its neighbours.

    Raises:
        ValueError: for an unknown device or fewer than one core.
    """
    _check(device, cpu_cores)
    if device == "cpu":
        worker_counts = sorted({1, max(1, cpu_cores // 2), cpu_cores})
        sizes = (1, 2, 4, 8)
    else:
        worker_counts = [1, 2]
        sizes = (1, 4, 8, 16)
    return [BatchPlan(max_batch_size=b, workers=w) for w in worker_counts for b in sizes]


def choose_plan(
    measure: Callable[[int, int], float],
    candidates: Iterable[BatchPlan],
    *,
    tolerance: float = 0.05,
) -> BatchPlan:
    """Measure each candidate and pick the best, preferring small plans when close.

    Plans whose throughput is within ``tolerance`` of the best count as equal; among those the
    smallest ``max_batch_size`` wins (a smaller batch means less waiting for a lone caller),
    then the fewest workers (less memory, fewer threads competing for cores).

    Args:
        measure: ``measure(max_batch_size, workers)`` returns throughput (items per second,
            higher is better) for that plan under a saturating load; called once per plan.
        candidates: plans to try; duplicates are measured once.
        tolerance: relative margin, in [0, 1), within which plans count as tied.

    Returns:
        The chosen plan.

    Raises:
        ValueError: when there are no candidates, ``tolerance`` is out of range, or a
            measurement is not a finite positive number (a broken benchmark must not silently
            pick a plan).
    """
    if not 0.0 <= tolerance < 1.0:
        raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
    plans = list(dict.fromkeys(candidates))
    if not plans:
        raise ValueError("choose_plan needs at least one candidate plan")
    measured: list[tuple[BatchPlan, float]] = []
    for plan in plans:
        throughput = measure(plan.max_batch_size, plan.workers)
        if not (math.isfinite(throughput) and throughput > 0.0):
            raise ValueError(
                f"measure returned {throughput!r} for {plan}; expected a positive rate"
            )
        measured.append((plan, throughput))
    best = max(t for _, t in measured)
    near = [plan for plan, t in measured if t >= best * (1.0 - tolerance)]
    return min(near, key=lambda p: (p.max_batch_size, p.workers))
