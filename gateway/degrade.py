"""Load-adaptive quality: a fixed ladder of cheaper settings, shed under load, restored slowly.

Admission (``gateway/admission.py``) keeps new calls out before the admitted ones degrade; this
is the safety net for when the admitted calls themselves get busier (everyone talks at once, a
noisy neighbour takes a core). Only past measured capacity (the recogniser busy past
``admission.target_utilisation``, or more calls in progress than the capacity counts) and while
the real-time calls' recent p95 of end of speech -> final is over ``degrade.latency_s``, one
more step of :data:`LADDER` is shed, at most one per ``step_interval_s``; once the p95 is below
``restore_ratio`` of it (or the replica is back within capacity) for ``restore_after_s``, the
last step shed is restored (one step per calm period: hysteresis, so the ladder does not flap).
On a replica within capacity a slow final is the engine's own speed: shedding would lose
quality and buy nothing, so one caller never loses its interims or word times.

The ladder, cheapest quality loss first:

1. ``interim_results``: interim re-decodes stop; finals are unchanged (interims cost a decode
   each and are superseded anyway).
2. ``mbr``: MBR selection off: one hypothesis instead of N candidates scored against each other.
3. ``beam``: beam search becomes greedy (beam 1, no N-best alternatives).
4. ``word_times``: finals carry no per-word times (the cross-attention alignment that finds
   them is about a tenth of a long utterance's decode, and on the gateway's default traffic —
   greedy, no interims — it is the first step that saves anything).
5. ``encoder_window``: the encoder margin after an utterance drops from the engine's
   ``encoder.margin_ms`` (2 s) to 0.5 s, so more utterances fit a smaller, cheaper bucket.
6. ``tts_window``: later TTS decoder windows double in size (less real context decoded and
   thrown away per second of speech; the first window, and so the first audio, is unchanged).

Steps 2-3 change only calls that asked for MBR or a beam (the gateway's default is greedy), so
on default traffic they cost nothing and save nothing. Every change is a metric
(``voxgate_degrade_level``, ``voxgate_degrade_steps_total{direction,step}``), one log line, and
a ``QualityChanged`` event on every call in progress (and on new calls while any step is in
force), naming the steps shed, so a client never gets less than it asked for silently.

:class:`DegradePolicy` is pure (time is passed in); :class:`QualityLevel` is the shared state
that sessions read when they build each request, so a step reaches calls already in progress.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from voxgate.engines.asr.base import AsrOptions
from voxgate.gateway.config import DegradeConfig
from voxgate.gateway.events import SpeakIn

__all__ = ["LADDER", "DegradePolicy", "LadderMove", "QualityLevel", "Step"]

#: Encoder margin at and past the ``encoder_window`` step, ms.
DEGRADED_ENCODER_MARGIN_MS = 500


@dataclass(frozen=True, slots=True)
class Step:
    """One rung of the ladder: its metric label and what it does."""

    name: str
    description: str


#: The fixed shedding order (restored in reverse).
LADDER: tuple[Step, ...] = (
    Step("interim_results", "interim re-decodes off (finals only)"),
    Step("mbr", "MBR selection off (one hypothesis)"),
    Step("beam", "beam search -> greedy, no alternatives"),
    Step("word_times", "no per-word times on finals"),
    Step("encoder_window", f"encoder margin -> {DEGRADED_ENCODER_MARGIN_MS} ms (smaller buckets)"),
    Step("tts_window", "later TTS decoder windows x2"),
)

_INTERIM, _MBR, _BEAM, _WORDS, _ENCODER, _TTS = range(1, len(LADDER) + 1)


class QualityLevel:
    """How many ladder steps are in force; sessions and the servicer apply it per request.

    Args:
        level: steps shed, 0 (full quality) to ``len(LADDER)``.
    """

    def __init__(self, level: int = 0) -> None:
        self._level = level
        #: Called with the new level after every change (sessions tell their clients).
        self.listeners: list[Callable[[int], None]] = []

    def __repr__(self) -> str:
        return f"QualityLevel({self._level})"

    @property
    def level(self) -> int:
        """Steps shed, 0 (full quality) to ``len(LADDER)``."""
        return self._level

    @level.setter
    def level(self, value: int) -> None:
        if value == self._level:
            return
        self._level = value
        for listener in list(self.listeners):
            listener(value)

    @property
    def shed(self) -> tuple[Step, ...]:
        """The steps in force, in the order they were shed."""
        return LADDER[: self._level]

    @property
    def interim_results(self) -> bool:
        """Whether interim re-decodes may run."""
        return self.level < _INTERIM

    def asr_options(self, options: AsrOptions) -> AsrOptions:
        """A call's decoding options with the steps in force applied (unchanged at level 0)."""
        if self.level < _MBR:
            return options
        changes: dict[str, object] = {}
        if options.mbr_candidates:
            changes["mbr_candidates"] = 0
        if self.level >= _BEAM and (options.beam_size > 1 or options.num_alternatives):
            changes["beam_size"] = 1
            changes["num_alternatives"] = 0
        if self.level >= _WORDS and options.word_timestamps:
            changes["word_timestamps"] = False
        if self.level >= _ENCODER:
            changes["encoder_margin_ms"] = DEGRADED_ENCODER_MARGIN_MS
        return dataclasses.replace(options, **changes) if changes else options  # type: ignore[arg-type]

    def speak(self, speak: SpeakIn) -> SpeakIn:
        """A Speak with the synthesis step applied (unchanged below ``tts_window``)."""
        if self.level < _TTS or speak.degraded:
            return speak
        return dataclasses.replace(speak, degraded=True)


@dataclass(frozen=True, slots=True)
class LadderMove:
    """A change of level: shed (``level`` went up) or restore (down), and the step moved."""

    direction: Literal["shed", "restore"]
    step: Step
    level: int
    pressure: float


class DegradePolicy:
    """When to shed or restore a step, from the recent p95 and the capacity; pure.

    ``pressure`` is the real-time calls' final p95 over ``latency_s``, and 0 while the replica
    is within its capacity or no final was measured (NaN): nothing to shed for.

    * pressure > 1: shed one step, unless one was shed less than ``step_interval_s`` ago;
    * pressure < ``restore_ratio``: once that has held for ``restore_after_s`` (and as long
      since the last move), restore one step; the calm period then starts again;
    * in between: hold, and the calm period starts again.

    Args:
        config: thresholds and timings.
        steps: the ladder's length.
    """

    def __init__(self, config: DegradeConfig, steps: int = len(LADDER)) -> None:
        self.config = config
        self.steps = steps
        self.level = 0
        self._last_move: float | None = None
        self._calm_since: float | None = None

    def pressure(self, final_p95_s: float, *, over_capacity: bool) -> float:
        """The real-time final p95 over its threshold; 0 within capacity or unmeasured."""
        if not over_capacity or math.isnan(final_p95_s):
            return 0.0
        return final_p95_s / self.config.latency_s

    def update(self, now: float, final_p95_s: float, *, over_capacity: bool) -> LadderMove | None:
        """Feed one sample; returns the move made, if any (``level`` is already updated)."""
        cfg = self.config
        if not cfg.enabled:
            return None
        p = self.pressure(final_p95_s, over_capacity=over_capacity)
        if p > 1.0:
            self._calm_since = None
            recent = self._last_move is not None and now - self._last_move < cfg.step_interval_s
            if self.level < self.steps and not recent:
                self.level += 1
                self._last_move = now
                return LadderMove("shed", LADDER[self.level - 1], self.level, p)
            return None
        if p >= cfg.restore_ratio:
            self._calm_since = None
            return None
        if self._calm_since is None:
            self._calm_since = now
        if self.level == 0 or now - self._calm_since < cfg.restore_after_s:
            return None
        if self._last_move is not None and now - self._last_move < cfg.restore_after_s:
            return None
        step = LADDER[self.level - 1]
        self.level -= 1
        self._last_move = now
        self._calm_since = now
        return LadderMove("restore", step, self.level, p)
